//! `$rate_limit_remote_net`: the client's network, its address (after `real_ip`) masked to the
//! location's `rate_limit_remote_net` prefix lengths.

use ngx::ffi::{ngx_http_request_t, ngx_http_variable_value_t, ngx_int_t};
use ngx::http::HttpModuleLocationConf;

use crate::conf::RateLimitModule;
use crate::glue::fill_remote_net;

pub(super) unsafe extern "C" fn remote_net_variable(
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
