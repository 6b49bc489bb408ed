//! gRPC's terms for a refusal: which requests are gRPC calls, and the text of the
//! `grpc-message` and `grpc-retry-pushback-ms` fields of a trailers-only answer (gRPC's
//! HTTP/2 protocol; the retry design A6 for the pushback).

/// Whether a request's `Content-Type` is gRPC's: `application/grpc`, alone or followed by
/// `+` (`+proto`, `+json`, ...) or parameters (`;`); case-insensitive. gRPC-Web
/// (`application/grpc-web`) is not: its clients read HTTP statuses.
///
/// ```
/// use ratelimit_core::grpc::is_grpc_content_type;
///
/// assert!(is_grpc_content_type(b"application/grpc"));
/// assert!(is_grpc_content_type(b"application/grpc+proto"));
/// assert!(!is_grpc_content_type(b"application/grpc-web"));
/// assert!(!is_grpc_content_type(b"application/json"));
/// ```
pub fn is_grpc_content_type(value: &[u8]) -> bool {
    const GRPC: &[u8] = b"application/grpc";
    let Some(prefix) = value.get(..GRPC.len()) else {
        return false;
    };
    prefix.eq_ignore_ascii_case(GRPC) && matches!(value.get(GRPC.len()), None | Some(b'+' | b';'))
}

/// `text` as a `grpc-message` value: UTF-8 with every byte outside printable ASCII
/// (0x20-0x7E), and `%` itself, written `%XX`.
///
/// ```
/// use ratelimit_core::grpc::grpc_message;
///
/// assert_eq!(grpc_message("rate limited by zone \"api\""), "rate limited by zone \"api\"");
/// assert_eq!(grpc_message("zone \"é%\""), "zone \"%C3%A9%25\"");
/// ```
pub fn grpc_message(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for &byte in text.as_bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The `grpc-retry-pushback-ms` of a wait of `wait_ns` (rounded up to whole milliseconds):
/// a client retries no sooner. `None` (a request no wait lets through) is `-1`, which A6
/// reads as "do not retry".
///
/// ```
/// use ratelimit_core::grpc::pushback_ms;
///
/// assert_eq!(pushback_ms(Some(1_500_000)), "2");
/// assert_eq!(pushback_ms(Some(0)), "0");
/// assert_eq!(pushback_ms(None), "-1");
/// ```
pub fn pushback_ms(wait_ns: Option<u64>) -> String {
    match wait_ns {
        Some(wait_ns) => wait_ns.div_ceil(1_000_000).to_string(),
        None => "-1".to_string(),
    }
}
