//! gRPC refusals in gRPC's terms: a refused gRPC call gets a trailers-only answer (HTTP 200,
//! `content-type: application/grpc`, `grpc-status: 8` RESOURCE_EXHAUSTED, a `grpc-message`
//! naming the zone, `grpc-retry-pushback-ms`) instead of the location's status, which gRPC
//! clients would read as UNAVAILABLE and retry at once. Over HTTP/2 nginx sends a header-only
//! answer as one HEADERS frame that ends the stream: what gRPC calls trailers-only.

use ngx::ffi::{ngx_http_request_t, ngx_int_t, NGX_HTTP_VERSION_20};
use ratelimit_core::grpc::{grpc_message, is_grpc_content_type, pushback_ms};

use crate::conf::LocConf;
use crate::control::outcome::{Refused, Wait};
use crate::glue::response::{add_header, answer_now};

/// RESOURCE_EXHAUSTED, gRPC's status for a client over its quota.
const RESOURCE_EXHAUSTED: &[u8] = b"8";

/// Whether the refusal of `r` is answered in gRPC's terms: `rate_limit_grpc` is on and the
/// request is a gRPC call (HTTP/2 or later, a gRPC content type).
pub fn applies(r: &ngx_http_request_t, lcf: &LocConf) -> bool {
    if !lcf.grpc() || r.http_version < NGX_HTTP_VERSION_20 as usize {
        return false;
    }
    // SAFETY: a non-null `content_type` is the request's live header element.
    let Some(content_type) = (unsafe { r.headers_in.content_type.as_ref() }) else {
        return false;
    };
    is_grpc_content_type(content_type.value.as_bytes())
}

/// Answer `r` with a trailers-only RESOURCE_EXHAUSTED and end it: `NGX_DONE` (the request
/// may be freed already).
#[cold]
pub fn refuse(r: &mut ngx_http_request_t, refused: &Refused) -> ngx_int_t {
    add_header(r, "grpc-status", RESOURCE_EXHAUSTED);
    let message = format!("{} by zone \"{}\"", refused.reason, refused.zone);
    add_header(r, "grpc-message", grpc_message(&message).as_bytes());
    let pushback = match refused.wait {
        Wait::After(wait_ns) => Some(pushback_ms(Some(wait_ns))),
        Wait::Never => Some(pushback_ms(None)),
        Wait::Unsaid => None,
    };
    if let Some(pushback) = pushback {
        add_header(r, "grpc-retry-pushback-ms", pushback.as_bytes());
    }
    answer_now(r, 200, b"application/grpc", &[])
}
