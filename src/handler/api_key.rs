//! `$rate_limit_api_key`: the caller's credential, read where the location's provider takes
//! it (its `usage=` line), as a fingerprint that names it without revealing it
//! (`ratelimit_core::api_key`); empty when the request carries none. `$rate_limit_api_key_openai`,
//! `_anthropic`, `_gemini` and `_azure` read one provider's places wherever they are used.

use ngx::ffi::{ngx_http_request_t, ngx_http_variable_value_t, ngx_int_t};
use ngx::http::HttpModuleLocationConf;
use ratelimit_core::api_key::{
    fingerprint, Api, Credential, Sources, CONFLICT_KEY, FINGERPRINT_MAX,
};

use crate::conf::RateLimitModule;
use crate::glue::value_bits;

/// The `data` of `$rate_limit_api_key`: the location's provider, read per evaluation.
pub(super) const LOCATION_API: usize = usize::MAX;

/// `data`: an [`Api`]'s index, or [`LOCATION_API`].
pub(super) unsafe extern "C" fn api_key_variable(
    r: *mut ngx_http_request_t,
    v: *mut ngx_http_variable_value_t,
    data: usize,
) -> ngx_int_t {
    crate::glue::guard::entry(
        "handler::api_key::api_key_variable",
        || crate::glue::guard::not_found(v),
        || {
            // SAFETY: nginx calls variable handlers with the live request and its value to fill.
            let r = unsafe { &*r };
            let api = match Api::ALL.get(data) {
                Some(&api) => Some(api),
                None => RateLimitModule::location_conf(r).and_then(|lcf| lcf.api()),
            };
            let mut sources = Sources::default();
            // SAFETY: `headers_in.headers` is the live request's list of parsed headers.
            for (header, value) in unsafe { ngx::http::list_iterator(&r.headers_in.headers) } {
                sources.header(header.as_bytes(), value.as_bytes());
            }
            sources.query(r.args.as_bytes());
            let mut shown = [0; FINGERPRINT_MAX];
            let value: &[u8] = match sources.credential(api) {
                Credential::Absent => b"",
                Credential::One(secret) => {
                    let len = fingerprint(secret, &mut shown);
                    &shown[..len]
                }
                Credential::Conflict => CONFLICT_KEY,
            };
            // SAFETY: `v` and the request's pool are live; the pool outlives the value.
            unsafe { crate::glue::set_value(v, r.pool, value, value_bits::VALID) }
        },
    )
}
