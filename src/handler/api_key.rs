//! `$rate_limit_api_key`: the caller's credential, read where the location's provider takes
//! it (its `usage=` line), as a fingerprint that names it without revealing it
//! (`ratelimit_core::api_key`); empty when the request carries none. `$rate_limit_api_key_openai`,
//! `_anthropic`, `_gemini` and `_azure` read one provider's places wherever they are used.

use ngx::ffi::{
    ngx_conf_t, ngx_http_add_variable, ngx_http_request_t, ngx_http_variable_value_t, ngx_int_t,
    ngx_str_t, ngx_uint_t, NGX_HTTP_VAR_NOCACHEABLE,
};
use ngx::http::HttpModuleLocationConf;
use ratelimit_core::api_key::{
    fingerprint, Api, Credential, Sources, CONFLICT_KEY, FINGERPRINT_MAX,
};

use crate::conf::{ConfError, RateLimitModule};
use crate::glue::value_bits;

/// The `data` of `$rate_limit_api_key`: the location's provider, read per evaluation.
const LOCATION_API: usize = usize::MAX;

/// Register `$rate_limit_api_key` and the four per-provider variables.
///
/// `$rate_limit_api_key` is not cacheable: its value depends on the location it is read in
/// (a server-level `if` reads it before the location is known, with every place read). The
/// per-provider variables are: the headers and the query string they read are the request's
/// own.
pub fn add_variable(cf: &mut ngx_conf_t) -> Result<(), ConfError> {
    add(
        cf,
        "rate_limit_api_key",
        LOCATION_API,
        NGX_HTTP_VAR_NOCACHEABLE as ngx_uint_t,
    )?;
    for api in Api::ALL {
        let name = match api {
            Api::OpenAi => "rate_limit_api_key_openai",
            Api::Anthropic => "rate_limit_api_key_anthropic",
            Api::Gemini => "rate_limit_api_key_gemini",
            Api::Azure => "rate_limit_api_key_azure",
        };
        add(cf, name, api.index(), 0)?;
    }
    Ok(())
}

fn add(
    cf: &mut ngx_conf_t,
    name: &'static str,
    data: usize,
    flags: ngx_uint_t,
) -> Result<(), ConfError> {
    let mut name = ngx_str_t {
        len: name.len(),
        data: name.as_ptr().cast_mut(),
    };
    // SAFETY: `cf` is valid; the name is static.
    let var = unsafe { ngx_http_add_variable(cf, &mut name, flags) };
    // SAFETY: a non-null result is a live variable definition.
    let var = unsafe { var.as_mut() }.ok_or(ConfError::Logged)?;
    var.get_handler = Some(api_key_variable);
    var.data = data;
    Ok(())
}

unsafe extern "C" fn api_key_variable(
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
