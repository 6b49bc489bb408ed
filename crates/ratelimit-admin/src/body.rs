//! JSON request bodies (`{"rate": "20r/s", "burst": 10}`) and the checks a zone's algorithm
//! puts on the limits they set.

use std::fmt;

use ratelimit_core::{sliding_log, Algorithm, Limits, Rate, ZoneSpec};
use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

use crate::error::ApiError;

/// A parsed body: the fields given, each already valid on its own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LimitsBody {
    pub rate: Option<Rate>,
    pub burst: Option<u64>,
    /// A quota zone's `limit` (1 to 2^53).
    pub limit: Option<u64>,
}

impl LimitsBody {
    /// The limits after applying this body to `current`.
    pub fn apply_to(&self, current: Limits) -> Limits {
        if let Some(limit) = self.limit {
            return Limits::quota(limit);
        }
        Limits {
            rate: self.rate.unwrap_or(current.rate),
            burst: self.burst.unwrap_or(current.burst),
        }
    }

    /// For a zone of `algorithm`: a quota zone takes `limit` alone, another zone `rate` and
    /// `burst`.
    pub fn check_fields(&self, zone: &str, algorithm: Algorithm) -> Result<(), ApiError> {
        let rate_field = if self.rate.is_some() {
            Some("rate")
        } else {
            self.burst.map(|_| "burst")
        };
        match (algorithm.is_quota(), rate_field, self.limit) {
            (true, Some(field), _) => Err(ApiError::BadValue(format!(
                "zone \"{zone}\" is a quota zone: it takes \"limit\", not \"{field}\""
            ))),
            (false, _, Some(_)) => Err(ApiError::BadValue(format!(
                "zone \"{zone}\" is a {algorithm} zone: it takes \"rate\" and \"burst\", not \
                 \"limit\" (a quota zone's)"
            ))),
            _ => Ok(()),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBody {
    #[serde(default)]
    rate: Option<RateField>,
    #[serde(default)]
    burst: Option<BurstField>,
    #[serde(default)]
    limit: Option<QuotaLimitField>,
}

/// Parse the body of `PATCH zones/NAME`: an object with `rate` and/or `burst`; `{}` changes
/// nothing.
///
/// ```
/// use ratelimit_admin::body::parse_patch;
///
/// let body = parse_patch(br#"{"burst": 10}"#).unwrap();
/// assert_eq!((body.rate, body.burst), (None, Some(10)));
/// assert_eq!(parse_patch(br#"{"burst": -1}"#).unwrap_err().to_string(),
///            "invalid burst -1: must be an integer from 0 to 4194303");
/// ```
pub fn parse_patch(body: &[u8]) -> Result<LimitsBody, ApiError> {
    // serde reads a struct from an array too: only an object is a body.
    let first = body.iter().find(|byte| !byte.is_ascii_whitespace());
    if first.is_some_and(|&byte| byte != b'{') {
        serde_json::from_slice::<de::IgnoredAny>(body).map_err(body_error)?;
        return Err(ApiError::BadBody(
            "the body must be a JSON object such as {\"rate\": \"10r/s\", \"burst\": 5}"
                .to_string(),
        ));
    }
    let raw: RawBody = serde_json::from_slice(body).map_err(body_error)?;
    Ok(LimitsBody {
        rate: raw.rate.map(|field| field.0),
        burst: raw.burst.map(|field| field.0),
        limit: raw.limit.map(|field| field.0),
    })
}

/// Parse the body of `PUT zones/NAME/overrides/KEY`: as for a patch, but `rate` (a quota
/// zone's `limit`) is required.
pub fn parse_override(body: &[u8]) -> Result<LimitsBody, ApiError> {
    let parsed = parse_patch(body)?;
    if parsed.rate.is_none() && parsed.limit.is_none() {
        return Err(ApiError::BadBody(
            "missing field `rate` (`limit` for a quota zone)".to_string(),
        ));
    }
    Ok(parsed)
}

/// Parse the body of `PUT zones/NAME/blocked/KEY`: `{"duration": "15m"}` (nginx time, from
/// 1 ms to 365 days); the block's length in nanoseconds.
///
/// ```
/// use ratelimit_admin::body::parse_block;
///
/// assert_eq!(parse_block(br#"{"duration": "15m"}"#).unwrap(), 900_000_000_000);
/// assert!(parse_block(br#"{"duration": "soon"}"#).unwrap_err().to_string()
///     .contains("invalid duration \"soon\""));
/// ```
pub fn parse_block(body: &[u8]) -> Result<u64, ApiError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct BlockBody {
        duration: String,
    }
    let example = "the body must be a JSON object such as {\"duration\": \"15m\"}";
    let first = body.iter().find(|byte| !byte.is_ascii_whitespace());
    if first.is_some_and(|&byte| byte != b'{') {
        serde_json::from_slice::<de::IgnoredAny>(body).map_err(body_error)?;
        return Err(ApiError::BadBody(example.to_string()));
    }
    let raw: BlockBody = serde_json::from_slice(body).map_err(|error| match body_error(error) {
        ApiError::BadBody(message) => ApiError::BadBody(format!("{message}; {example}")),
        other => other,
    })?;
    let max = ratelimit_core::penalty::BlockPolicy::MAX_NS;
    ratelimit_core::penalty::parse_duration_ns(&raw.duration)
        .filter(|&ns| (1_000_000..=max).contains(&ns))
        .ok_or_else(|| {
            ApiError::BadBody(format!(
                "invalid duration \"{}\": give a duration such as 30s, 15m, 24h or 1h30m, \
                 from 1ms to 365d",
                raw.duration
            ))
        })
}

/// Malformed JSON keeps serde's position (where the text stops being JSON); a value that is
/// wrong says what is wrong with it, without the position, which the message already quotes.
fn body_error(error: serde_json::Error) -> ApiError {
    use serde_json::error::Category;
    match error.classify() {
        Category::Syntax | Category::Eof | Category::Io => {
            ApiError::BadBody(format!("malformed JSON: {error}"))
        }
        Category::Data => {
            let message = error.to_string();
            let position = format!(" at line {} column {}", error.line(), error.column());
            let message = message.strip_suffix(&position).unwrap_or(&message);
            ApiError::BadBody(message.to_string())
        }
    }
}

struct RateField(Rate);

impl<'de> Deserialize<'de> for RateField {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct RateVisitor;
        impl Visitor<'_> for RateVisitor {
            type Value = RateField;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a rate such as \"10r/s\"")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<RateField, E> {
                Rate::parse(text).map(RateField).map_err(|_| {
                    E::custom(format_args!(
                        "invalid rate \"{text}\": must be a positive number of requests \
                         (at most 3 decimals) per s, m, h or d, such as \"10r/s\""
                    ))
                })
            }
        }
        deserializer.deserialize_str(RateVisitor)
    }
}

struct QuotaLimitField(u64);

impl<'de> Deserialize<'de> for QuotaLimitField {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use ratelimit_core::quota::MAX_LIMIT;
        struct LimitVisitor;
        fn invalid<E: de::Error>(shown: impl fmt::Display) -> E {
            E::custom(format_args!(
                "invalid limit {shown}: must be an integer from 1 to {MAX_LIMIT}"
            ))
        }
        impl Visitor<'_> for LimitVisitor {
            type Value = QuotaLimitField;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "an integer from 1 to {MAX_LIMIT}")
            }
            fn visit_u64<E: de::Error>(self, value: u64) -> Result<QuotaLimitField, E> {
                if !(1..=MAX_LIMIT).contains(&value) {
                    return Err(invalid(value));
                }
                Ok(QuotaLimitField(value))
            }
            fn visit_i64<E: de::Error>(self, value: i64) -> Result<QuotaLimitField, E> {
                match u64::try_from(value) {
                    Ok(value) => self.visit_u64(value),
                    Err(_) => Err(invalid(value)),
                }
            }
            fn visit_f64<E: de::Error>(self, value: f64) -> Result<QuotaLimitField, E> {
                Err(invalid(value))
            }
        }
        deserializer.deserialize_any(LimitVisitor)
    }
}

struct BurstField(u64);

impl<'de> Deserialize<'de> for BurstField {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct BurstVisitor;
        fn invalid<E: de::Error>(shown: impl fmt::Display) -> E {
            E::custom(format_args!(
                "invalid burst {shown}: must be an integer from 0 to {}",
                Limits::MAX_BURST
            ))
        }
        impl Visitor<'_> for BurstVisitor {
            type Value = BurstField;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "an integer from 0 to {}", Limits::MAX_BURST)
            }
            fn visit_u64<E: de::Error>(self, value: u64) -> Result<BurstField, E> {
                if value > Limits::MAX_BURST {
                    return Err(invalid(value));
                }
                Ok(BurstField(value))
            }
            fn visit_i64<E: de::Error>(self, value: i64) -> Result<BurstField, E> {
                match u64::try_from(value) {
                    Ok(value) => self.visit_u64(value),
                    Err(_) => Err(invalid(value)),
                }
            }
            fn visit_f64<E: de::Error>(self, value: f64) -> Result<BurstField, E> {
                Err(invalid(value))
            }
        }
        deserializer.deserialize_any(BurstVisitor)
    }
}

/// Check that a zone running `algorithm` can take `limits` (for the zone or for one key): the
/// same rules as `rate_limit_zone`'s.
///
/// `burst_given`: whether the request named a burst (the sliding algorithms have none).
/// `log_capacity`: for `sliding_log`, the requests per window each key's log has room for,
/// fixed when the zone's memory was laid out (the rate in the configuration).
///
/// ```
/// use ratelimit_admin::body::check_limits;
/// use ratelimit_core::{Algorithm, Limits, Rate};
///
/// let limits = Limits { rate: Rate::parse("200r/s").unwrap(), burst: 0 };
/// let error = check_limits("log", Algorithm::SlidingLog, &limits, false, 100).unwrap_err();
/// assert!(error.to_string().contains("room for 100 requests per window"));
/// assert!(check_limits("bucket", Algorithm::TokenBucket, &limits, true, 0).is_ok());
/// ```
pub fn check_limits(
    zone: &str,
    algorithm: Algorithm,
    limits: &Limits,
    burst_given: bool,
    log_capacity: u64,
) -> Result<(), ApiError> {
    if algorithm.is_quota() {
        // Any limit the body's field accepted.
        return Ok(());
    }
    if algorithm.takes_burst() {
        // The largest bucket the rate allows, as `rate_limit_zone` checks it.
        return limits
            .check_bucket(algorithm)
            .map_err(|error| ApiError::BadValue(error.to_string()));
    }
    // The zone directive's own rules for sliding algorithms: a whole number of requests per
    // window, within the algorithm's maximum, and no burst.
    let rate = format!("rate={}", limits.rate);
    let algorithm_word = format!("algorithm={algorithm}");
    let mut words = vec![rate.as_str(), algorithm_word.as_str()];
    let burst = format!("burst={}", limits.burst);
    if burst_given {
        words.push(&burst);
    }
    ZoneSpec::parse_words(&words).map_err(|error| ApiError::BadValue(error.to_string()))?;
    let requests = sliding_log::window_limit(&limits.rate);
    if algorithm == Algorithm::SlidingLog && requests > log_capacity {
        return Err(ApiError::BadValue(format!(
            "rate \"{}\" is more than zone \"{zone}\" can count: each key's sliding_log has room \
             for {log_capacity} requests per window, as configured; raise the rate in the \
             configuration and reload instead",
            limits.rate
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn patch(body: &str) -> Result<LimitsBody, String> {
        parse_patch(body.as_bytes()).map_err(|e| {
            assert_eq!(e.status(), 400, "{e}");
            e.to_string()
        })
    }

    #[test]
    fn good_bodies() {
        let rate = |text| Some(Rate::parse(text).unwrap());
        #[rustfmt::skip]
        let rows = [
            (r#"{"rate": "20r/s", "burst": 10}"#, LimitsBody { rate: rate("20r/s"), burst: Some(10), limit: None }),
            (r#"{"rate": "0.5r/m"}"#, LimitsBody { rate: rate("0.5r/m"), burst: None, limit: None }),
            (r#" {"burst": 0} "#, LimitsBody { rate: None, burst: Some(0), limit: None }),
            (r#"{"burst": 4194303}"#, LimitsBody { rate: None, burst: Some(4194303), limit: None }),
            (r#"{"limit": 9007199254740992}"#, LimitsBody { limit: Some(1 << 53), ..LimitsBody::default() }),
            (r#"{"rate": null, "burst": null}"#, LimitsBody::default()),
            ("{}", LimitsBody::default()),
        ];
        for (body, expected) in rows {
            assert_eq!(patch(body), Ok(expected), "{body}");
        }
    }

    #[test]
    fn bad_bodies_name_the_problem() {
        #[rustfmt::skip]
        let rows = [
            ("", "malformed JSON: EOF while parsing"),
            ("{", "malformed JSON: EOF while parsing"),
            ("{\"rate\": \"10r/s\",}", "malformed JSON: trailing comma"),
            ("nonsense", "malformed JSON: expected ident"),
            ("?", "malformed JSON: expected value"),
            ("{} {}", "malformed JSON: trailing characters"),
            ("[]", "the body must be a JSON object such as {\"rate\": \"10r/s\", \"burst\": 5}"),
            ("\"10r/s\"", "the body must be a JSON object"),
            ("[1,", "malformed JSON: EOF while parsing a value"),
            (r#"{"rate": 10}"#, "invalid type: integer `10`, expected a rate such as \"10r/s\""),
            (r#"{"rate": "abc"}"#, "invalid rate \"abc\": must be a positive number"),
            (r#"{"rate": "0r/s"}"#, "invalid rate \"0r/s\""),
            (r#"{"rate": "-1r/s"}"#, "invalid rate \"-1r/s\""),
            (r#"{"burst": "5"}"#, "invalid type: string \"5\", expected an integer from 0 to 4194303"),
            (r#"{"burst": -1}"#, "invalid burst -1: must be an integer from 0 to 4194303"),
            (r#"{"burst": 1.5}"#, "invalid burst 1.5"),
            (r#"{"burst": 4194304}"#, "invalid burst 4194304"),
            (r#"{"burst": 1e30}"#, "invalid burst 1000000000000000000000000000000"),
            (r#"{"burst": true}"#, "invalid type: boolean `true`"),
            (r#"{"rates": "1r/s"}"#, "unknown field `rates`, expected one of `rate`, `burst`, `limit`"),
            (r#"{"limit": 0}"#, "invalid limit 0: must be an integer from 1 to 9007199254740992"),
            (r#"{"limit": 9007199254740993}"#, "invalid limit 9007199254740993"),
            (r#"{"rate": "1r/s", "rate": "2r/s"}"#, "duplicate field `rate`"),
            ("{\"rate\": \"\u{e9}\"}", "invalid rate \"\u{e9}\""),
        ];
        for (body, start) in rows {
            let message = patch(body).unwrap_err();
            assert!(message.starts_with(start), "{body}: {message}");
        }
        // A wrong value is named without serde's position in the body.
        assert_eq!(
            patch(r#"{"rate": ""}"#).unwrap_err(),
            "invalid rate \"\": must be a positive number of requests (at most 3 decimals) per \
             s, m, h or d, such as \"10r/s\""
        );
        let message = parse_patch(b"{\"rate\": \"\xff\"}")
            .unwrap_err()
            .to_string();
        assert!(
            message.starts_with("malformed JSON: invalid unicode"),
            "{message}"
        );
    }

    #[test]
    fn override_needs_a_rate() {
        let error = parse_override(br#"{"burst": 3}"#).unwrap_err();
        assert_eq!(
            error.to_string(),
            "missing field `rate` (`limit` for a quota zone)"
        );
        assert!(parse_override(br#"{"rate": "3r/s"}"#).is_ok());
        assert!(parse_override(br#"{"limit": 7}"#).is_ok());
    }

    #[test]
    fn algorithms_limit_what_a_zone_takes() {
        let limits = |rate: &str, burst| Limits {
            rate: Rate::parse(rate).unwrap(),
            burst,
        };
        type Row = (Algorithm, Limits, bool, u64, Result<(), &'static str>);
        #[rustfmt::skip]
        let rows: [Row; 15] = [
            (Algorithm::LeakyBucket, limits("0.5r/s", 100), true, 0, Ok(())),
            (Algorithm::TokenBucket, limits("1000000r/s", 0), true, 0, Ok(())),
            (Algorithm::LeakyBucket, limits("0.001r/d", 35), true, 0, Ok(())),
            (Algorithm::LeakyBucket, limits("0.001r/d", 4194303), true, 0,
             Err("burst 4194303 is too large for rate \"0.001r/d\" (at most 35: a leaky_bucket \
                  must drain within 100 years)")),
            (Algorithm::TokenBucket, limits("0.001r/d", 36), false, 0, Ok(())),
            (Algorithm::TokenBucket, limits("0.001r/d", 300), false, 0,
             Err("burst 300 is too large for rate \"0.001r/d\" (at most 36: a token_bucket \
                  must refill within 100 years)")),
            (Algorithm::SlidingWindow, limits("100r/s", 0), false, 0, Ok(())),
            (Algorithm::SlidingWindow, limits("100r/s", 0), true, 0,
             Err("\"burst\" is not used by sliding_window")),
            (Algorithm::SlidingWindow, limits("1.5r/s", 0), false, 0,
             Err("rate \"1.5r/s\" is not a whole number of requests for sliding_window")),
            (Algorithm::SlidingWindow, limits("1048576r/s", 0), false, 0,
             Err("rate \"1048576r/s\" is more than 1048575 requests per window")),
            (Algorithm::SlidingLog, limits("100r/m", 0), false, 100, Ok(())),
            (Algorithm::SlidingLog, limits("10r/s", 0), false, 100, Ok(())),
            (Algorithm::SlidingLog, limits("101r/m", 0), false, 100,
             Err("rate \"101r/m\" is more than zone \"z\" can count")),
            (Algorithm::SlidingLog, limits("5000r/s", 0), false, 5000,
             Err("rate \"5000r/s\" is more than 4096 requests per window")),
            (Algorithm::SlidingLog, limits("10r/s", 3), true, 100,
             Err("\"burst\" is not used by sliding_log")),
        ];
        for (algorithm, limits, burst_given, capacity, expected) in rows {
            let got = check_limits("z", algorithm, &limits, burst_given, capacity);
            match expected {
                Ok(()) => assert_eq!(got, Ok(()), "{algorithm} {limits:?}"),
                Err(start) => {
                    let message = got.unwrap_err().to_string();
                    assert!(message.starts_with(start), "{algorithm}: {message}");
                }
            }
        }
    }
}
