//! nginx's own refusals in front of the admin API, answered as the API's JSON errors.
//!
//! Two refusals happen before the admin handler runs and would otherwise get nginx's HTML
//! page: a body over `client_max_body_size` (413, decided once the location is found, so the
//! request's configuration is the admin location's) and a request line over
//! `large_client_header_buffers` (414, decided before any location is matched: the request
//! has only its server's configuration, which `rate_limit_admin` marks as a server with an
//! admin location). nginx sends both pages through the filter chains; these filters, on top of
//! them, replace the page with `{"error": "..."}` for those requests and pass everything else
//! through untouched.

use core::ptr;

use ngx::ffi::{
    ngx_alloc_chain_link, ngx_chain_t, ngx_create_temp_buf, ngx_http_output_body_filter_pt,
    ngx_http_output_header_filter_pt, ngx_http_request_t, ngx_http_top_body_filter,
    ngx_http_top_header_filter, ngx_int_t, off_t,
};
use ngx::http::{HttpModuleLocationConf, NgxHttpCoreModule};

use crate::conf::RateLimitModule;

const NGX_ERROR: ngx_int_t = -1;
const NGX_OK: ngx_int_t = 0;
const JSON_TYPE: &[u8] = b"application/json";

// The next filters of each chain, set once in postconfiguration (in the master, before any
// request) and only read afterwards.
static mut NEXT_HEADER_FILTER: ngx_http_output_header_filter_pt = None;
static mut NEXT_BODY_FILTER: ngx_http_output_body_filter_pt = None;

/// Put the two filters on top of nginx's header and body filter chains.
pub fn install() {
    // SAFETY: postconfiguration runs single-threaded in the master, before any request;
    // the chain heads are nginx's globals, meant to be replaced this way by filter modules.
    unsafe {
        NEXT_HEADER_FILTER = ngx_http_top_header_filter;
        ngx_http_top_header_filter = Some(header_filter);
        NEXT_BODY_FILTER = ngx_http_top_body_filter;
        ngx_http_top_body_filter = Some(body_filter);
    }
}

/// The JSON body that replaces nginx's page for this response, if it is one of ours.
fn replacement(r: &ngx_http_request_t) -> Option<String> {
    // `err_status` is set by nginx's special response handler only: the API's own 413 (a
    // body over its 64 KiB) is already JSON and is left alone.
    if r.err_status != r.headers_out.status {
        return None;
    }
    let message = match r.err_status {
        413 => {
            RateLimitModule::location_conf(r)?.admin?;
            let limit = NgxHttpCoreModule::location_conf(r)
                .map(|clcf| clcf.client_max_body_size)
                .unwrap_or_default();
            format!("request body is larger than client_max_body_size ({limit} bytes)")
        }
        414 if RateLimitModule::location_conf(r)?.admin_server => {
            "request line is longer than large_client_header_buffers".to_string()
        }
        _ => return None,
    };
    let body = serde_json::json!({ "error": message });
    serde_json::to_string_pretty(&body).ok()
}

extern "C" fn header_filter(r: *mut ngx_http_request_t) -> ngx_int_t {
    crate::glue::guard::entry(
        "admin::errors::header_filter",
        || ngx_int_t::from(ngx::core::Status::NGX_ERROR),
        || {
            // SAFETY: nginx passes the live request whose header is being sent.
            let Some(request) = (unsafe { r.as_mut() }) else {
                return NGX_ERROR;
            };
            if let Some(body) = replacement(request) {
                let out = &mut request.headers_out;
                out.content_type.len = JSON_TYPE.len();
                out.content_type.data = JSON_TYPE.as_ptr().cast_mut();
                out.content_type_len = JSON_TYPE.len();
                out.content_type_lowcase = ptr::null_mut();
                out.charset.len = 0;
                out.content_length_n = body.len() as off_t;
                // SAFETY: a set Content-Length header is an element of headers_out.headers.
                if let Some(header) = unsafe { out.content_length.as_mut() } {
                    header.hash = 0;
                }
                out.content_length = ptr::null_mut();
            }
            // SAFETY: read once the filter was installed; the next filter is nginx's, called as
            // every header filter calls the next one.
            match unsafe { NEXT_HEADER_FILTER } {
                Some(next) => unsafe { next(r) },
                None => NGX_ERROR,
            }
        },
    )
}

extern "C" fn body_filter(r: *mut ngx_http_request_t, chain: *mut ngx_chain_t) -> ngx_int_t {
    crate::glue::guard::entry(
        "admin::errors::body_filter",
        || ngx_int_t::from(ngx::core::Status::NGX_ERROR),
        || {
            // SAFETY: read once the filter was installed.
            let Some(next) = (unsafe { NEXT_BODY_FILTER }) else {
                return NGX_ERROR;
            };
            // SAFETY: nginx passes the live request whose body is being sent.
            let Some(request) = (unsafe { r.as_ref() }) else {
                return NGX_ERROR;
            };
            let Some(body) = replacement(request) else {
                // SAFETY: passing the chain on unchanged, as every body filter does.
                return unsafe { next(r, chain) };
            };
            // nginx's page is dropped (its buffers marked as sent); ours goes out with its last one.
            let mut last = false;
            let mut link = chain;
            // SAFETY: `chain` is a well-formed list of links with valid buffers.
            while let Some(current) = unsafe { link.as_ref() } {
                if let Some(buf) = unsafe { current.buf.as_mut() } {
                    buf.pos = buf.last;
                    buf.file_pos = buf.file_last;
                    last |= buf.last_buf() != 0 || buf.last_in_chain() != 0;
                }
                link = current.next;
            }
            if !last {
                return NGX_OK;
            }
            // SAFETY: the request's pool lives as long as the request; the buffer is filled below
            // within its size.
            unsafe {
                let buf = ngx_create_temp_buf(request.pool, body.len());
                let out = ngx_alloc_chain_link(request.pool);
                if buf.is_null() || out.is_null() {
                    return NGX_ERROR;
                }
                ptr::copy_nonoverlapping(body.as_ptr(), (*buf).last, body.len());
                (*buf).last = (*buf).last.add(body.len());
                (*buf).set_last_buf(u32::from(ptr::eq(request.main, r)));
                (*buf).set_last_in_chain(1);
                (*out).buf = buf;
                (*out).next = ptr::null_mut();
                next(r, out)
            }
        },
    )
}
