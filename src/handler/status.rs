//! `$rate_limit_status`: a request's outcome, kept in the variable's own value in
//! `r->variables` (`control::outcome::StatusValue`).

use ngx::core::Status;
use ngx::ffi::{
    ngx_conf_t, ngx_http_add_variable, ngx_http_request_t, ngx_http_variable_value_t, ngx_int_t,
    ngx_str_t, ngx_uint_t, NGX_HTTP_VAR_NOCACHEABLE,
};

use crate::conf::ConfError;
use crate::glue::value_bits;

pub use crate::control::outcome::{LimitStatus, StatusValue as RequestState};

/// Where a request's outcome is kept: `$rate_limit_status`'s own value in `r->variables`.
pub fn request_state(r: &ngx_http_request_t, index: ngx_uint_t) -> RequestState {
    // SAFETY: `r->variables` has one entry per indexed variable of this configuration, and
    // `index` was obtained from ngx_http_get_variable_index for it; the request outlives its
    // handlers' use of the value.
    unsafe { RequestState::new(r.variables.add(index)) }
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
