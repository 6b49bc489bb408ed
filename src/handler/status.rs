//! `$rate_limit_status`: a request's outcome, kept in the variable's own value in
//! `r->variables` (`control::outcome::StatusValue`).

use ngx::core::Status;
use ngx::ffi::{ngx_http_request_t, ngx_http_variable_value_t, ngx_int_t, ngx_uint_t};

use crate::glue::value_bits;

pub use crate::control::outcome::{LimitStatus, StatusValue as RequestState};

/// Where a request's outcome is kept: `$rate_limit_status`'s own value in `r->variables`.
pub fn request_state(r: &ngx_http_request_t, index: ngx_uint_t) -> RequestState {
    // SAFETY: `r->variables` has one entry per indexed variable of this configuration, and
    // `index` was obtained from ngx_http_get_variable_index for it; the request outlives its
    // handlers' use of the value.
    unsafe { RequestState::new(r.variables.add(index)) }
}

/// Called only while no outcome is stored in the request's variables (`RequestState::set`
/// stores it there directly): no limit applied.
pub(super) unsafe extern "C" fn status_variable(
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
