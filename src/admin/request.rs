//! The admin location's content handler: read the request (and its body, for PATCH and PUT),
//! let the `ratelimit-admin` crate answer over the control layer's zones, send the answer.

use core::ptr;

use ngx::core::Status;
use ngx::ffi::{
    ngx_chain_t, ngx_create_temp_buf, ngx_http_discard_request_body, ngx_http_finalize_request,
    ngx_http_output_filter, ngx_http_read_client_request_body, ngx_http_request_t,
    ngx_http_send_header, ngx_int_t, ngx_str_t,
};
use ngx::http::{HttpModuleLocationConf, NgxHttpCoreModule};
use ratelimit_admin::{ApiError, Response, Route, MAX_BODY_BYTES};

use crate::conf::{registry, RateLimitModule};
use crate::control::zones::shared_zones;
use crate::glue::response::add_header;
use crate::glue::{connection_log, now_ns};

/// The dashboard's Content-Security-Policy: its own inline script and style, and requests to
/// this server only.
const DASHBOARD_POLICY: &[u8] = b"default-src 'none'; script-src 'unsafe-inline'; \
    style-src 'unsafe-inline'; connect-src 'self'; img-src data:; base-uri 'none'; \
    form-action 'none'";

/// `clcf->handler` of a location with `rate_limit_admin`.
pub unsafe extern "C" fn admin_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    crate::glue::guard::entry(
        "admin::admin_handler",
        || nginx_sys::NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t,
        || {
            // SAFETY: nginx calls content handlers with the live request.
            let r = unsafe { &mut *r };
            let route = match plan(r) {
                Ok(route) => route,
                Err(error) => return answer_without_body(r, Response::error(&error)),
            };
            if !route.takes_body() {
                let response = execute(r, &route, &[]);
                return answer_without_body(r, response);
            }
            // A declared length over the limit is refused before anything is read; a chunked body is
            // counted once read (nginx's client_max_body_size bounds it meanwhile).
            if r.headers_in.content_length_n > MAX_BODY_BYTES as i64 {
                let too_large = ApiError::BodyTooLarge {
                    limit: MAX_BODY_BYTES,
                };
                return answer_without_body(r, Response::error(&too_large));
            }
            // SAFETY: `r` is the live main request; `body_read` finalizes it.
            let rc = unsafe { ngx_http_read_client_request_body(r, Some(body_read)) };
            if rc >= nginx_sys::NGX_HTTP_SPECIAL_RESPONSE as ngx_int_t {
                return rc;
            }
            Status::NGX_DONE.into()
        },
    )
}

/// The body is read (possibly later, from the event loop): answer and finalize.
unsafe extern "C" fn body_read(r: *mut ngx_http_request_t) {
    crate::glue::guard::entry(
        "admin::body_read",
        || crate::glue::guard::fail_request(r),
        || {
            // SAFETY: nginx calls the post handler with the live request whose body was read.
            let r = unsafe { &mut *r };
            let response = match plan(r) {
                Err(error) => Response::error(&error),
                Ok(route) => match request_body(r) {
                    Some(body) => execute(r, &route, &body),
                    None => Response::error(&ApiError::BodyTooLarge {
                        limit: MAX_BODY_BYTES,
                    }),
                },
            };
            let rc = send(r, &response);
            // SAFETY: the request is live; this ends the reference taken by reading the body.
            unsafe { ngx_http_finalize_request(r, rc) };
        },
    )
}

/// The route from the method, the path after the location's prefix and `write=on`.
fn plan(r: &ngx_http_request_t) -> Result<Route, ApiError> {
    let write_allowed = RateLimitModule::location_conf(r)
        .and_then(|lcf| lcf.admin)
        .is_some_and(|admin| admin.write);
    let location = NgxHttpCoreModule::location_conf(r)
        .map(|clcf| clcf.name.as_bytes())
        .unwrap_or_default();
    let target = r.unparsed_uri.as_bytes();
    let Some(path) = ratelimit_admin::route::strip_location(target, location) else {
        return Err(ApiError::UnknownPath(
            String::from_utf8_lossy(target).into_owned(),
        ));
    };
    let query = r.args.as_bytes();
    let route =
        ratelimit_admin::plan_with_query(r.method_name.as_bytes(), path, query, write_allowed)?;
    // A browser opening the location gets the dashboard; a script gets the JSON.
    if matches!(route, Route::Root { .. }) && wants_html(r) {
        return Ok(Route::Dashboard);
    }
    Ok(route)
}

/// Whether the request's `Accept` header names `text/html`.
fn wants_html(r: &ngx_http_request_t) -> bool {
    // SAFETY: `headers_in.headers` is the live request's list of parsed headers.
    let mut headers = unsafe { ngx::http::list_iterator(&r.headers_in.headers) };
    headers.any(|(name, value)| {
        name.as_bytes().eq_ignore_ascii_case(b"accept")
            && value
                .as_bytes()
                .windows(9)
                .any(|word| word.eq_ignore_ascii_case(b"text/html"))
    })
}

fn execute(r: &ngx_http_request_t, route: &Route, body: &[u8]) -> Response {
    let Some(registry) = registry::running() else {
        return Response::error(&ApiError::UnknownPath(String::new()));
    };
    let response = ratelimit_admin::execute(route, body, &shared_zones(registry, now_ns()));
    if response.changed {
        crate::control::changed(registry, connection_log(r));
    }
    response
}

fn answer_without_body(r: &mut ngx_http_request_t, response: Response) -> ngx_int_t {
    // SAFETY: `r` is the live request; its body is not needed.
    let rc = unsafe { ngx_http_discard_request_body(r) };
    if rc != ngx_int_t::from(Status::NGX_OK) {
        return rc;
    }
    send(r, &response)
}

/// The request body, or `None` when it is larger than the limit (or its temporary file
/// cannot be read: answered 413 like an oversized body, nothing was changed).
fn request_body(r: &ngx_http_request_t) -> Option<Vec<u8>> {
    crate::glue::body::request_body(r, MAX_BODY_BYTES)
}

/// Send the answer: status, headers, body.
fn send(r: &mut ngx_http_request_t, response: &Response) -> ngx_int_t {
    r.headers_out.status = usize::from(response.status);
    if response.status != 204 {
        let content_type = response.content_type;
        r.headers_out.content_type_len = content_type.len();
        r.headers_out.content_type = ngx_str_t {
            len: content_type.len(),
            data: content_type.as_ptr().cast_mut(),
        };
        r.headers_out.content_length_n = response.body.len() as i64;
    }
    if let Some(allow) = response.allow {
        add_header(r, "Allow", allow.as_bytes());
    }
    add_header(r, "Cache-Control", b"no-store");
    if response.content_type == ratelimit_admin::HTML_CONTENT_TYPE {
        // The page loads nothing from elsewhere; the browser is told to refuse it if it tried.
        add_header(r, "Content-Security-Policy", DASHBOARD_POLICY);
    }

    // SAFETY: `r` is the live request; its headers are set.
    let rc = unsafe { ngx_http_send_header(r) };
    if rc == ngx_int_t::from(Status::NGX_ERROR)
        || rc > ngx_int_t::from(Status::NGX_OK)
        || r.header_only() != 0
        || response.body.is_empty()
    {
        return rc;
    }
    // SAFETY: the request pool is live; the buffer gets exactly the body's bytes.
    unsafe {
        let buf = ngx_create_temp_buf(r.pool, response.body.len());
        if buf.is_null() {
            return Status::NGX_ERROR.into();
        }
        ptr::copy_nonoverlapping(response.body.as_ptr(), (*buf).pos, response.body.len());
        (*buf).last = (*buf).pos.add(response.body.len());
        (*buf).set_last_buf(if ptr::eq(r.main, r) { 1 } else { 0 });
        (*buf).set_last_in_chain(1);
        let mut out = ngx_chain_t {
            buf,
            next: ptr::null_mut(),
        };
        ngx_http_output_filter(r, &mut out)
    }
}
