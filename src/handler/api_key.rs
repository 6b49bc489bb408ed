//! `$rate_limit_api_key`: the caller's credential (`Authorization: Bearer`, `x-api-key`,
//! `x-goog-api-key`, `?key=`) as a fingerprint that names it without revealing it
//! (`ratelimit_core::api_key`); empty when the request carries none.

use ngx::ffi::{
    ngx_conf_t, ngx_http_add_variable, ngx_http_request_t, ngx_http_variable_value_t, ngx_int_t,
    ngx_str_t,
};
use ratelimit_core::api_key::{credential, fingerprint, Sources, FINGERPRINT_MAX};

use crate::conf::ConfError;
use crate::glue::value_bits;

/// Register `$rate_limit_api_key`. Cacheable: the headers and the query string it reads are
/// the request's own, and the hash is computed once.
pub fn add_variable(cf: &mut ngx_conf_t) -> Result<(), ConfError> {
    let mut name = ngx_str_t {
        len: "rate_limit_api_key".len(),
        data: c"rate_limit_api_key".as_ptr().cast_mut().cast(),
    };
    // SAFETY: `cf` is valid; the name is static.
    let var = unsafe { ngx_http_add_variable(cf, &mut name, 0) };
    // SAFETY: a non-null result is a live variable definition.
    let var = unsafe { var.as_mut() }.ok_or(ConfError::Logged)?;
    var.get_handler = Some(api_key_variable);
    Ok(())
}

unsafe extern "C" fn api_key_variable(
    r: *mut ngx_http_request_t,
    v: *mut ngx_http_variable_value_t,
    _data: usize,
) -> ngx_int_t {
    crate::glue::guard::entry(
        "handler::api_key::api_key_variable",
        || crate::glue::guard::not_found(v),
        || {
            // SAFETY: nginx calls variable handlers with the live request and its value to fill.
            let r = unsafe { &*r };
            let mut sources = Sources {
                args: r.args.as_bytes(),
                ..Sources::default()
            };
            // SAFETY: `headers_in.headers` is the live request's list of parsed headers.
            for (header, value) in unsafe { ngx::http::list_iterator(&r.headers_in.headers) } {
                let header = header.as_bytes();
                let slot = if header.eq_ignore_ascii_case(b"authorization") {
                    &mut sources.authorization
                } else if header.eq_ignore_ascii_case(b"x-api-key") {
                    &mut sources.x_api_key
                } else if header.eq_ignore_ascii_case(b"x-goog-api-key") {
                    &mut sources.x_goog_api_key
                } else {
                    continue;
                };
                slot.get_or_insert(value.as_bytes());
            }
            let mut shown = [0; FINGERPRINT_MAX];
            let len = credential(&sources).map_or(0, |secret| fingerprint(&secret, &mut shown));
            // SAFETY: `v` and the request's pool are live; the pool outlives the value.
            unsafe { crate::glue::set_value(v, r.pool, &shown[..len], value_bits::VALID) }
        },
    )
}
