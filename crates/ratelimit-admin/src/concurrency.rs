//! Concurrency zones in the API: their JSON (limit, queue, requests in flight and queued, the
//! adaptive limit's view of a key) and `PATCH zones/NAME` with `{"limit": N, "queue": N}`
//! (or `{"min": N, "max": N}` for `limit=adaptive`).

use serde::de::{self, IgnoredAny};
use serde::{Deserialize, Serialize};

use ratelimit_core::adaptive::{AdaptiveBounds, MAX_LIMIT};
use ratelimit_core::concurrency::{ConcurrencyLimit, ConcurrencyLimits, MAX_QUEUE};

use crate::error::ApiError;
use crate::units::milliseconds_f;

/// What `GET zones/NAME` adds for a concurrency zone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConcurrencyInfo {
    /// The limits in force now.
    pub limits: ConcurrencyLimits,
    /// The configuration file's.
    pub config: ConcurrencyLimits,
    pub queue_timeout_ns: u64,
    /// Requests in flight and queued, over all keys.
    pub in_flight: u64,
    pub queued: u64,
    /// For `limit=adaptive`: the key with the most requests in flight, if any key has a state.
    pub busiest: Option<ConcurrencyKeyState>,
    /// For a `sync` zone: the permits this instance's live leases hold, over all keys.
    pub lease: Option<u64>,
}

/// One key of a concurrency zone now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConcurrencyKeyState {
    pub in_flight: u32,
    pub queued: u32,
    /// The key's limit now (the zone's, or its adaptive limit).
    pub limit: u32,
    pub adaptive: Option<AdaptiveKeyState>,
    /// For a `sync` zone: the permits this instance's lease of the key holds now.
    pub lease: Option<u32>,
}

/// The adaptive limit's view of a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdaptiveKeyState {
    /// `probe` (measuring the no-load latency at `min`) or `track`.
    pub phase: &'static str,
    /// The no-load latency learnt, in µs (0 before the first probe ended).
    pub no_load_us: u32,
    /// The median latency of the last window, in µs.
    pub latency_us: u32,
}

/// `"limit": 100` or `"limit": "adaptive", "min": 4, "max": 500`, then `"queue": N`.
#[derive(Serialize)]
pub struct LimitsJson {
    pub limit: LimitValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max: Option<u32>,
    pub queue: u32,
}

/// A number, or `"adaptive"`.
#[derive(Serialize)]
#[serde(untagged)]
pub enum LimitValue {
    Fixed(u32),
    Adaptive(&'static str),
}

impl From<&ConcurrencyLimits> for LimitsJson {
    fn from(limits: &ConcurrencyLimits) -> LimitsJson {
        match limits.limit {
            ConcurrencyLimit::Fixed(limit) => LimitsJson {
                limit: LimitValue::Fixed(limit),
                min: None,
                max: None,
                queue: limits.queue,
            },
            ConcurrencyLimit::Adaptive(bounds) => LimitsJson {
                limit: LimitValue::Adaptive("adaptive"),
                min: Some(bounds.min),
                max: Some(bounds.max),
                queue: limits.queue,
            },
        }
    }
}

/// The fields a concurrency zone adds to `GET zones/NAME` (flattened into the zone's object).
#[derive(Serialize)]
pub struct ZoneFieldsJson {
    #[serde(flatten)]
    pub limits: LimitsJson,
    pub queue_timeout_ms: u64,
    pub in_flight: u64,
    pub queued: u64,
    /// For a `sync` zone: the permits this instance holds of the fleet's limits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<u64>,
    /// For `limit=adaptive`: the busiest key's limit and latencies.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adaptive: Option<BusiestJson>,
}

/// `"adaptive": {"limit": 37, "phase": "track", ...}`: the key with the most in flight.
#[derive(Serialize)]
pub struct BusiestJson {
    pub limit: u32,
    pub in_flight: u32,
    #[serde(flatten)]
    pub view: AdaptiveJson,
}

/// `"phase": "track", "no_load_latency_ms": 100.2, "latency_ms": 131.0`.
#[derive(Serialize)]
pub struct AdaptiveJson {
    pub phase: &'static str,
    pub no_load_latency_ms: f64,
    pub latency_ms: f64,
}

impl From<&AdaptiveKeyState> for AdaptiveJson {
    fn from(state: &AdaptiveKeyState) -> AdaptiveJson {
        AdaptiveJson {
            phase: state.phase,
            no_load_latency_ms: milliseconds_f(u64::from(state.no_load_us) * 1000),
            latency_ms: milliseconds_f(u64::from(state.latency_us) * 1000),
        }
    }
}

impl From<&ConcurrencyInfo> for ZoneFieldsJson {
    fn from(info: &ConcurrencyInfo) -> ZoneFieldsJson {
        ZoneFieldsJson {
            limits: LimitsJson::from(&info.limits),
            queue_timeout_ms: info.queue_timeout_ns.div_ceil(1_000_000),
            in_flight: info.in_flight,
            queued: info.queued,
            lease: info.lease,
            adaptive: info.busiest.and_then(|key| {
                key.adaptive.as_ref().map(|adaptive| BusiestJson {
                    limit: key.limit,
                    in_flight: key.in_flight,
                    view: AdaptiveJson::from(adaptive),
                })
            }),
        }
    }
}

/// One key (`GET zones/NAME/keys/KEY`).
#[derive(Serialize)]
pub struct KeyJson<'a> {
    pub zone: &'a str,
    pub key: String,
    pub in_flight: u32,
    pub queued: u32,
    pub limit: u32,
    /// For a `sync` zone: the permits this instance holds of the fleet's `limit`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<u32>,
    /// Whether a request now would get a slot at once.
    pub would_pass: bool,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub adaptive: Option<AdaptiveJson>,
}

impl<'a> KeyJson<'a> {
    /// `key` is the key as shown (`KeyForm::show`).
    pub fn new(zone: &'a str, key: String, state: &ConcurrencyKeyState) -> KeyJson<'a> {
        KeyJson {
            zone,
            key,
            in_flight: state.in_flight,
            queued: state.queued,
            limit: state.limit,
            lease: state.lease,
            would_pass: state.queued == 0
                && state.in_flight
                    < state
                        .lease
                        .map_or(state.limit, |lease| lease.min(state.limit)),
            adaptive: state.adaptive.as_ref().map(AdaptiveJson::from),
        }
    }
}

/// A parsed `PATCH` body for a concurrency zone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PatchBody {
    pub limit: Option<u32>,
    pub min: Option<u32>,
    pub max: Option<u32>,
    pub queue: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPatch {
    #[serde(default)]
    limit: Option<Count<1, MAX_LIMIT>>,
    #[serde(default)]
    min: Option<Count<1, MAX_LIMIT>>,
    #[serde(default)]
    max: Option<Count<1, MAX_LIMIT>>,
    #[serde(default)]
    queue: Option<Count<0, MAX_QUEUE>>,
    // Read only to say they are not a concurrency zone's.
    #[serde(default)]
    rate: Option<IgnoredAny>,
    #[serde(default)]
    burst: Option<IgnoredAny>,
}

/// An integer from `LOW` to `HIGH`, or an error naming the field's value and its range.
struct Count<const LOW: u32, const HIGH: u32>(u32);

impl<'de, const LOW: u32, const HIGH: u32> Deserialize<'de> for Count<LOW, HIGH> {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(deserializer)?;
        value
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| (LOW..=HIGH).contains(n))
            .map(Count)
            .ok_or_else(|| {
                de::Error::custom(format_args!(
                    "{value}: must be an integer from {LOW} to {HIGH}"
                ))
            })
    }
}

/// Parse a `PATCH zones/NAME` body for concurrency zone `zone`.
///
/// ```
/// use ratelimit_admin::concurrency::parse_patch;
///
/// let body = parse_patch("app", br#"{"limit": 10, "queue": 5}"#).unwrap();
/// assert_eq!((body.limit, body.queue), (Some(10), Some(5)));
/// assert_eq!(parse_patch("app", br#"{"limit": 0}"#).unwrap_err().to_string(),
///            "invalid limit 0: must be an integer from 1 to 16777215");
/// ```
pub fn parse_patch(zone: &str, body: &[u8]) -> Result<PatchBody, ApiError> {
    let first = body.iter().find(|byte| !byte.is_ascii_whitespace());
    if first.is_some_and(|&byte| byte != b'{') {
        return Err(ApiError::BadBody(
            "the body must be a JSON object such as {\"limit\": 100, \"queue\": 20}".into(),
        ));
    }
    let raw: RawPatch = serde_json::from_slice(body).map_err(|error| {
        let text = error.to_string();
        // "invalid limit 0: ...": the field's name, from serde's path, then the message.
        match field_of(body, &error) {
            Some(field) => ApiError::BadBody(format!(
                "invalid {field} {}",
                text.split(" at line").next().unwrap_or(&text)
            )),
            None => ApiError::BadBody(text),
        }
    })?;
    for (given, name) in [(raw.rate.is_some(), "rate"), (raw.burst.is_some(), "burst")] {
        if given {
            return Err(ApiError::BadValue(format!(
                "zone \"{zone}\" is a concurrency zone: it takes \"limit\" and \"queue\", not \
                 \"{name}\""
            )));
        }
    }
    Ok(PatchBody {
        limit: raw.limit.map(|count| count.0),
        min: raw.min.map(|count| count.0),
        max: raw.max.map(|count| count.0),
        queue: raw.queue.map(|count| count.0),
    })
}

/// The field a value error is about: the last field name before the error's column.
fn field_of(body: &[u8], error: &serde_json::Error) -> Option<&'static str> {
    if error.classify() != serde_json::error::Category::Data || error.line() != 1 {
        return None;
    }
    let before = body.get(..error.column().min(body.len()))?;
    let text = String::from_utf8_lossy(before);
    ["limit", "min", "max", "queue"]
        .into_iter()
        .filter_map(|name| Some((text.rfind(&format!("\"{name}\""))?, name)))
        .max()
        .map(|(_, name)| name)
}

impl PatchBody {
    /// The limits after applying this body to `current`, or why the zone cannot take it.
    pub fn apply_to(
        &self,
        zone: &str,
        current: ConcurrencyLimits,
    ) -> Result<ConcurrencyLimits, ApiError> {
        let limit = match current.limit {
            ConcurrencyLimit::Fixed(limit) => {
                if self.min.is_some() || self.max.is_some() {
                    return Err(ApiError::BadValue(format!(
                        "zone \"{zone}\" has a fixed limit: \"min\" and \"max\" are for \
                         limit=adaptive"
                    )));
                }
                ConcurrencyLimit::Fixed(self.limit.unwrap_or(limit))
            }
            ConcurrencyLimit::Adaptive(bounds) => {
                if self.limit.is_some() {
                    return Err(ApiError::BadValue(format!(
                        "zone \"{zone}\" has limit=adaptive: change its \"min\" and \"max\""
                    )));
                }
                let (min, max) = (
                    self.min.unwrap_or(bounds.min),
                    self.max.unwrap_or(bounds.max),
                );
                if min > max {
                    return Err(ApiError::BadValue(format!(
                        "\"min\" {min} is more than \"max\" {max}"
                    )));
                }
                ConcurrencyLimit::Adaptive(AdaptiveBounds::new(min, max))
            }
        };
        Ok(ConcurrencyLimits {
            limit,
            queue: self.queue.unwrap_or(current.queue),
        })
    }
}
