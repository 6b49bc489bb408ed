//! `$rate_limit_remote_net`: the client's network, its address (after `real_ip`) masked to the
//! location's `rate_limit_remote_net` prefix lengths.

use ngx::ffi::{
    ngx_conf_t, ngx_http_add_variable, ngx_http_request_t, ngx_http_variable_value_t, ngx_int_t,
    ngx_str_t, ngx_uint_t, NGX_HTTP_VAR_NOCACHEABLE,
};
use ngx::http::HttpModuleLocationConf;

use crate::conf::{ConfError, RateLimitModule};
use crate::glue::fill_remote_net;

/// Register `$rate_limit_remote_net`. Not cacheable: its prefix lengths are the location's,
/// and an internal redirect may land in a location with others.
pub fn add_variable(cf: &mut ngx_conf_t) -> Result<(), ConfError> {
    let mut name = ngx_str_t {
        len: "rate_limit_remote_net".len(),
        data: c"rate_limit_remote_net".as_ptr().cast_mut().cast(),
    };
    // SAFETY: `cf` is valid; the name is static.
    let var =
        unsafe { ngx_http_add_variable(cf, &mut name, NGX_HTTP_VAR_NOCACHEABLE as ngx_uint_t) };
    // SAFETY: a non-null result is a live variable definition.
    let var = unsafe { var.as_mut() }.ok_or(ConfError::Logged)?;
    var.get_handler = Some(remote_net_variable);
    Ok(())
}

unsafe extern "C" fn remote_net_variable(
    r: *mut ngx_http_request_t,
    v: *mut ngx_http_variable_value_t,
    _data: usize,
) -> ngx_int_t {
    crate::glue::guard::entry(
        "handler::remote_net::remote_net_variable",
        || crate::glue::guard::not_found(v),
        || {
            // SAFETY: nginx calls variable handlers with the live request and its value to fill.
            let r = unsafe { &*r };
            let prefixes = RateLimitModule::location_conf(r)
                .and_then(|lcf| lcf.remote_net)
                .unwrap_or_default();
            // SAFETY: `v` is the value to fill; the request's connection, its address and its
            // pool are live, and the pool outlives the value.
            unsafe { fill_remote_net(v, r.pool, (*r.connection).sockaddr, prefixes) }
        },
    )
}
