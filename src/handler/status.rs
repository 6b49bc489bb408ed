//! `$rate_limit_status`: a request's outcome, kept in the variable's own slot of
//! `r->variables`.

use core::ptr;

use ngx::core::Status;
use ngx::ffi::{
    ngx_conf_t, ngx_http_add_variable, ngx_http_request_t, ngx_http_variable_value_t, ngx_int_t,
    ngx_str_t, ngx_uint_t, NGX_HTTP_VAR_NOCACHEABLE,
};

use crate::conf::ConfError;
use crate::glue::value_bits;

/// `$rate_limit_status` values; 0 means no limit applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum LimitStatus {
    Passed = 1,
    Delayed = 2,
    Rejected = 3,
    DelayedDryRun = 4,
    RejectedDryRun = 5,
    /// Waited in a concurrency zone's queue, then went through.
    Queued = 6,
    /// Refused because the key is blocked (`block=`).
    Blocked = 7,
    BlockedDryRun = 8,
}

impl LimitStatus {
    fn as_str(self) -> &'static str {
        match self {
            LimitStatus::Passed => "PASSED",
            LimitStatus::Delayed => "DELAYED",
            LimitStatus::Rejected => "REJECTED",
            LimitStatus::DelayedDryRun => "DELAYED_DRY_RUN",
            LimitStatus::RejectedDryRun => "REJECTED_DRY_RUN",
            LimitStatus::Queued => "QUEUED",
            LimitStatus::Blocked => "BLOCKED",
            LimitStatus::BlockedDryRun => "BLOCKED_DRY_RUN",
        }
    }
}

/// Where a request's outcome is kept: `$rate_limit_status`'s own slot in `r->variables`.
/// Internal redirects keep variable values (they clear module contexts) and subrequests
/// share them, so a set value means "this main request was limited already".
#[derive(Clone, Copy)]
pub struct RequestState {
    value: *mut ngx_http_variable_value_t,
}

impl RequestState {
    pub fn of(r: &ngx_http_request_t, index: ngx_uint_t) -> RequestState {
        // SAFETY: `r->variables` has one entry per indexed variable of this configuration,
        // and `index` was obtained from ngx_http_get_variable_index for it.
        RequestState {
            value: unsafe { r.variables.add(index) },
        }
    }

    pub fn is_set(self) -> bool {
        let bits = value_bits::read(self.value);
        bits & value_bits::VALID != 0 && bits & value_bits::LEN != 0
    }

    /// Whether the outcome stored is `status` (the static text it was set to).
    pub fn is(self, status: LimitStatus) -> bool {
        let bits = value_bits::read(self.value);
        let text = status.as_str();
        // SAFETY: `value` points into the live request's variables.
        let data = unsafe { (*self.value).data };
        bits & value_bits::VALID != 0
            && (bits & value_bits::LEN) as usize == text.len()
            && ptr::eq(data.cast_const(), text.as_ptr())
    }

    pub fn set(self, status: LimitStatus) {
        let text = status.as_str();
        // SAFETY: `value` points into the live request's variables; the text is static.
        unsafe { (*self.value).data = text.as_ptr().cast_mut() };
        // The whole word: `escape` is never set on this variable.
        value_bits::write_all(self.value, text.len() as u32 | value_bits::VALID);
    }
}

/// Register `$rate_limit_status`.
pub fn add_variables(cf: &mut ngx_conf_t) -> Result<(), ConfError> {
    let mut name = ngx_str_t {
        len: "rate_limit_status".len(),
        data: c"rate_limit_status".as_ptr().cast_mut().cast(),
    };
    // SAFETY: `cf` is valid; the name is static.
    let var =
        unsafe { ngx_http_add_variable(cf, &mut name, NGX_HTTP_VAR_NOCACHEABLE as ngx_uint_t) };
    // SAFETY: a non-null result is a live variable definition.
    let var = unsafe { var.as_mut() }.ok_or(ConfError::Logged)?;
    var.get_handler = Some(status_variable);
    Ok(())
}

/// Called only while no outcome is stored in the request's variables (`RequestState::set`
/// stores it there directly): no limit applied.
unsafe extern "C" fn status_variable(
    _r: *mut ngx_http_request_t,
    v: *mut ngx_http_variable_value_t,
    _data: usize,
) -> ngx_int_t {
    crate::glue::guard::entry(
        "handler::status::status_variable",
        || crate::glue::guard::not_found(v),
        || {
            value_bits::write(v, value_bits::NOT_FOUND);
            Status::NGX_OK.into()
        },
    )
}
