//! A request's key in a zone: one variable read directly, a `$arg_NAME` found in the query
//! string (see `crate::conf::key`), or the zone's complex value evaluated.

use core::ptr;

use ngx::ffi::{ngx_http_complex_value, ngx_http_request_t, ngx_str_t};

use crate::conf::{HttpVariable, ZoneConf, ZoneKey};
use crate::glue::value_bits;

/// The key's bytes for this request (empty when its variables are not found).
pub fn evaluate_key<'r>(r: &'r mut ngx_http_request_t, zone_conf: &ZoneConf) -> Option<&'r [u8]> {
    let key_cv = match &zone_conf.key {
        ZoneKey::HttpVariable(key) => return Some(read_variable(r, key)),
        ZoneKey::HttpComplex(value) => ptr::addr_of!(*value).cast_mut(),
        ZoneKey::Stream(_) => return None,
    };
    let mut key = ngx_str_t {
        len: 0,
        data: ptr::null_mut(),
    };
    // SAFETY: `r` is the live request; the complex value was compiled at configuration time.
    if unsafe { ngx_http_complex_value(r, key_cv, &mut key) } != 0 {
        return None;
    }
    // SAFETY: the value lives in the request pool (or the configuration, for a constant).
    Some(unsafe { core::slice::from_raw_parts(key.data.cast_const(), key.len) })
}

/// A key that is one variable: nginx's value, or a `$arg_NAME` read from the query string.
#[inline(always)]
fn read_variable<'r>(r: &'r mut ngx_http_request_t, key: &HttpVariable) -> &'r [u8] {
    let index = key.index;
    if let Some(name) = &key.query_arg {
        // SAFETY: `r.variables` has one value per variable of this configuration, and
        // `index` is one of them.
        let cached = unsafe { r.variables.add(index) };
        let bits = value_bits::read(cached);
        // nginx's own evaluation marks `$arg_` values no_cacheable; a value that is
        // cached and not so was assigned by `set` and is what nginx would return.
        let assigned = bits & (value_bits::VALID | value_bits::NOT_FOUND) != 0
            && bits & value_bits::NO_CACHEABLE == 0;
        if !assigned {
            let value = ratelimit_core::key::query_arg(r.args.as_bytes(), name);
            return value.unwrap_or(&[]);
        }
    }
    // SAFETY: `r` is the live request and `index` a variable index of this configuration.
    let value = unsafe { ngx::ffi::ngx_http_get_flushed_variable(r, index) };
    // SAFETY: a non-null result is a live variable value of the request, in its pool.
    unsafe { value_bits::found(value) }.unwrap_or(&[])
}
