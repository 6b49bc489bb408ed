//! The answers OpenAI's clients understand: `x-ratelimit-reset-*` durations as OpenAI writes
//! them (`1s`, `6m0s`, `120ms`) and the body of a 429
//! (`{"error": {"message", "type", "param", "code": "rate_limit_exceeded"}}`).

/// A duration as OpenAI's `x-ratelimit-reset-*` headers write it: milliseconds under a
/// second, else hours, minutes and seconds (with up to three decimals), e.g. `1h2m3s`,
/// `6m0s`, `1.5s`.
///
/// ```
/// use ratelimit_core::usage::openai::reset_text;
///
/// assert_eq!(reset_text(0), "0s");
/// assert_eq!(reset_text(120_000_000), "120ms");
/// assert_eq!(reset_text(1_500_000_000), "1.5s");
/// assert_eq!(reset_text(360_000_000_000), "6m0s");
/// assert_eq!(reset_text(3_723_000_000_000), "1h2m3s");
/// ```
pub fn reset_text(ns: u64) -> String {
    if ns == 0 {
        return "0s".into();
    }
    let ms = ns.div_ceil(1_000_000);
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (hours, rest_ms) = (ms / 3_600_000, ms % 3_600_000);
    let (minutes, rest_ms) = (rest_ms / 60_000, rest_ms % 60_000);
    let (seconds, millis) = (rest_ms / 1000, rest_ms % 1000);
    let mut text = String::new();
    if hours > 0 {
        text += &format!("{hours}h");
    }
    if hours > 0 || minutes > 0 {
        text += &format!("{minutes}m");
    }
    if millis == 0 {
        text += &format!("{seconds}s");
    } else {
        let fraction = format!("{millis:03}");
        text += &format!("{seconds}.{}s", fraction.trim_end_matches('0'));
    }
    text
}

/// What a refused request was refused for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A usage-based line (tokens).
    Tokens,
    /// A line counting requests.
    Requests,
}

impl Kind {
    /// `tokens`, `requests`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Tokens => "tokens",
            Kind::Requests => "requests",
        }
    }
}

/// The JSON body of a 429 in OpenAI's shape.
///
/// ```
/// use ratelimit_core::usage::openai::{error_body, Kind};
///
/// let body: serde_json::Value =
///     serde_json::from_str(&error_body(Kind::Tokens, "tpm", 1000, 990, 50, 3_000_000_000)).unwrap();
/// assert_eq!(body["error"]["code"], "rate_limit_exceeded");
/// assert_eq!(body["error"]["type"], "tokens");
/// assert_eq!(
///     body["error"]["message"],
///     "Rate limit reached for tokens in zone \"tpm\": limit 1000, used 990, requested 50. \
///      Please try again in 3s."
/// );
/// ```
pub fn error_body(
    kind: Kind,
    zone: &str,
    limit: u64,
    used: u64,
    requested: u64,
    retry_after_ns: u64,
) -> String {
    let what = kind.as_str();
    let wait = reset_text(retry_after_ns);
    let message = format!(
        "Rate limit reached for {what} in zone \"{zone}\": limit {limit}, used {used}, \
         requested {requested}. Please try again in {wait}."
    );
    let body = serde_json::json!({
        "error": {
            "message": message,
            "type": what,
            "param": null,
            "code": "rate_limit_exceeded",
        }
    });
    body.to_string()
}
