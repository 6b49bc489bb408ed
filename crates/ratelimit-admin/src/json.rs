//! The JSON the API answers with. Field order is fixed by the structs (no map reordering).

use ratelimit_core::key_form::KeyForm;
use ratelimit_core::{Algorithm, Limits, Outcome};
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;

use crate::store::{BlockCounts, BlockInfo, KeyState, Period, SyncInfo, ZoneInfo};
pub use crate::units::{milliseconds, milliseconds_f};

/// `{"rate": "10r/s", "burst": 5}`, or a quota zone's `{"limit": 1000000}`.
#[derive(Serialize)]
#[serde(untagged)]
pub enum LimitsJson {
    Rate { rate: String, burst: u64 },
    Quota { limit: u64 },
}

impl LimitsJson {
    /// `limits` of a zone of `algorithm`.
    pub fn new(algorithm: Algorithm, limits: &Limits) -> LimitsJson {
        if algorithm.is_quota() {
            return LimitsJson::Quota {
                limit: limits.quota_limit(),
            };
        }
        LimitsJson::Rate {
            rate: limits.rate.to_string(),
            burst: limits.burst,
        }
    }
}

/// A quota zone's current period: `period_start` and `period_end` in Unix seconds
/// (millisecond precision).
#[derive(Serialize)]
pub struct PeriodJson {
    pub period_start: f64,
    pub period_end: f64,
}

impl From<&Period> for PeriodJson {
    fn from(period: &Period) -> PeriodJson {
        PeriodJson {
            period_start: period.start_unix_ms as f64 / 1000.0,
            period_end: period.end_unix_ms as f64 / 1000.0,
        }
    }
}

/// One zone (`GET zones/NAME`, and each value of `GET zones`).
#[derive(Serialize)]
pub struct ZoneJson<'a> {
    /// `"stream"` for a zone of nginx's `stream {}` block; absent for an http zone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context: Option<&'static str>,
    pub algorithm: &'static str,
    pub key: &'a str,
    /// A rate zone's rate and burst (a concurrency zone has its `concurrency` fields instead).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
    /// A quota zone's limit, `period=`, `tz=` and current period (Unix seconds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub period: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tz: Option<&'a str>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub current: Option<PeriodJson>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<crate::concurrency::ZoneFieldsJson>,
    pub size: u64,
    pub slots: u64,
    pub keys: u64,
    pub passed: u64,
    pub delayed: u64,
    pub rejected: u64,
    pub delayed_dry_run: u64,
    pub rejected_dry_run: u64,
    pub evictions: u64,
    pub no_slot: u64,
    pub overrides: u64,
    /// What the configuration file says, for comparison with `rate` and `burst` (or `limit`
    /// and `queue`).
    pub config: ConfigJson,
    /// Only for a `sync` zone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sync: Option<SyncJson>,
    /// Only once a usage-based line (`usage=`) has charged the zone: its tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<crate::store::UsageInfo>,
}

/// `"sync": {"connected": true, "mode": "synced", "last_sync_age_ms": 40, ...}`
#[derive(Serialize)]
pub struct SyncJson {
    pub connected: bool,
    pub mode: &'static str,
    pub last_sync_age_ms: Option<u64>,
    pub instances: u64,
    pub round_trips: u64,
    pub errors: u64,
    pub lag_ms: f64,
    pub fallback: bool,
    pub keys_sent: u64,
    pub bad_values: u64,
}

impl From<&SyncInfo> for SyncJson {
    fn from(info: &SyncInfo) -> SyncJson {
        SyncJson {
            connected: info.connected,
            mode: info.mode,
            last_sync_age_ms: info.last_sync_age_ms,
            instances: info.instances,
            round_trips: info.round_trips,
            errors: info.errors,
            lag_ms: info.lag_us as f64 / 1000.0,
            fallback: info.fallback,
            keys_sent: info.keys_sent,
            bad_values: info.bad_values,
        }
    }
}

/// A zone's configured limits: a rate and burst, or a concurrency zone's.
#[derive(Serialize)]
#[serde(untagged)]
pub enum ConfigJson {
    Rate(LimitsJson),
    Concurrency(crate::concurrency::LimitsJson),
}

impl<'a> From<&'a ZoneInfo> for ZoneJson<'a> {
    fn from(info: &'a ZoneInfo) -> ZoneJson<'a> {
        let concurrency = info.concurrency.as_ref();
        let quota = info.quota.as_ref();
        let rate_zone = concurrency.is_none() && quota.is_none();
        let config = match concurrency {
            Some(concurrency) => {
                ConfigJson::Concurrency(crate::concurrency::LimitsJson::from(&concurrency.config))
            }
            None => ConfigJson::Rate(LimitsJson::new(info.algorithm, &info.config_limits)),
        };
        ZoneJson {
            context: info.stream.then_some("stream"),
            algorithm: info.algorithm.as_str(),
            key: &info.key,
            rate: rate_zone.then(|| info.limits.rate.to_string()),
            burst: rate_zone.then_some(info.limits.burst),
            limit: quota.map(|_| info.limits.quota_limit()),
            period: quota.map(|quota| quota.period),
            tz: quota.map(|quota| quota.tz.as_str()),
            current: quota.map(|quota| PeriodJson::from(&quota.current)),
            concurrency: concurrency.map(crate::concurrency::ZoneFieldsJson::from),
            size: info.size,
            slots: info.slots,
            keys: info.keys,
            passed: info.counters.passed,
            delayed: info.counters.delayed,
            rejected: info.counters.rejected,
            delayed_dry_run: info.counters.delayed_dry_run,
            rejected_dry_run: info.counters.rejected_dry_run,
            evictions: info.evictions,
            no_slot: info.no_slot,
            overrides: info.overrides,
            config,
            sync: info.sync.as_ref().map(SyncJson::from),
            usage: info.usage,
        }
    }
}

/// One key's state (`GET zones/NAME/keys/KEY`).
#[derive(Serialize)]
pub struct KeyJson<'a> {
    pub zone: &'a str,
    pub key: String,
    /// The limits this key gets (its override's, or the zone's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
    /// A quota zone's: the key's limit, what it used of the current period, and the period
    /// (Unix seconds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub used: Option<u64>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub period: Option<PeriodJson>,
    #[serde(rename = "override")]
    pub override_limits: Option<LimitsJson>,
    /// Whether a request now would be served (at once or after a delay).
    pub would_pass: bool,
    /// Requests of cost 1 that would pass now, one after another, without a rejection.
    pub remaining: u64,
    /// How long until a request would pass; 0 when one would pass now.
    pub retry_after_ms: u64,
    /// How long until the key is back to its fresh state.
    pub reset_ms: u64,
    /// Tokens the key owes past its capacity (usage-based lines charge a request's overrun
    /// into debt); shown only when it owes some. `remaining` is 0 while it does.
    #[serde(skip_serializing_if = "is_zero")]
    pub debt: u64,
    /// The key's block, when it is blocked (`block=`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block: Option<BlockJson>,
}

/// One blocked key: `since` and `until` in Unix seconds (millisecond precision).
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct BlockJson {
    pub key: String,
    /// The key is longer than the zone keeps for listing: `key` is its start.
    pub truncated: bool,
    pub since: f64,
    pub until: f64,
    /// 0 for `block`, `n` for `block × 2^n` (capped at `block_max`).
    pub level: u8,
    pub left_ms: u64,
}

impl BlockJson {
    /// `block`, its key shown in the zone's `form`.
    pub fn new(block: &BlockInfo, form: KeyForm) -> BlockJson {
        BlockJson {
            key: form.show(&block.key),
            truncated: block.truncated,
            since: block.since_unix_ms as f64 / 1000.0,
            until: block.until_unix_ms as f64 / 1000.0,
            level: block.level,
            left_ms: block.left_ms,
        }
    }
}

/// `GET zones/NAME/blocked`.
#[derive(Serialize)]
pub struct BlockedJson<'a> {
    pub zone: &'a str,
    /// `block=` and `block_max=`, as nginx time text.
    pub block: String,
    pub block_max: String,
    /// Keys blocked now, and how many the zone holds at most.
    pub count: usize,
    pub capacity: u64,
    /// Requests refused while their key was blocked, since the zone was created.
    pub blocked_requests: u64,
    /// Requests a dry run let through although their key was blocked.
    pub blocked_dry_run_requests: u64,
    /// Rejected keys the full table could not block (it keeps the blocks it holds).
    pub not_recorded: u64,
    pub keys: Vec<BlockJson>,
}

impl<'a> BlockedJson<'a> {
    pub fn new(zone: &'a str, counts: &BlockCounts, keys: Vec<BlockJson>) -> BlockedJson<'a> {
        BlockedJson {
            zone,
            block: ratelimit_core::penalty::duration_text(counts.block_ns),
            block_max: ratelimit_core::penalty::duration_text(counts.block_max_ns),
            count: keys.len(),
            capacity: counts.capacity,
            blocked_requests: counts.blocked_requests,
            blocked_dry_run_requests: counts.blocked_dry_run_requests,
            not_recorded: counts.not_recorded,
            keys,
        }
    }
}

impl<'a> KeyJson<'a> {
    /// `key` is the key as shown (`KeyForm::show`).
    pub fn new(zone: &'a str, key: String, state: &KeyState) -> KeyJson<'a> {
        let decision = &state.decision;
        let would_pass = decision.outcome != Outcome::Rejected;
        let quota = state.period;
        let algorithm = if quota.is_some() {
            Algorithm::ALL[5]
        } else {
            Algorithm::LeakyBucket
        };
        // A quota's decision imagines a request of cost 1: passed, it left `remaining` after
        // it; refused, it went `excess` past the limit (a count in debt is above the limit).
        let limit = state.limits.quota_limit();
        let used = if would_pass {
            limit.saturating_sub(decision.remaining.saturating_add(1))
        } else {
            (limit + decision.excess_milli / 1000).saturating_sub(1)
        };
        KeyJson {
            zone,
            key,
            rate: quota.is_none().then(|| state.limits.rate.to_string()),
            burst: quota.is_none().then_some(state.limits.burst),
            limit: quota.map(|_| limit),
            used: quota.map(|_| used),
            period: quota.as_ref().map(PeriodJson::from),
            override_limits: state
                .override_limits
                .as_ref()
                .map(|limits| LimitsJson::new(algorithm, limits)),
            would_pass,
            // The decision counts what remains after the request it imagines.
            remaining: if would_pass {
                decision.remaining.saturating_add(1)
            } else {
                0
            },
            retry_after_ms: if would_pass {
                0
            } else {
                milliseconds(decision.retry_after_ns)
            },
            reset_ms: milliseconds(decision.reset_ns),
            debt: state.debt,
            block: None,
        }
    }
}

/// One override (`GET`/`PUT zones/NAME/overrides/KEY`).
#[derive(Serialize)]
pub struct OverrideJson<'a> {
    pub zone: &'a str,
    pub key: String,
    #[serde(flatten)]
    pub limits: LimitsJson,
}

impl<'a> OverrideJson<'a> {
    /// `key` is the key as shown (`KeyForm::show`), of a zone of `algorithm`.
    pub fn new(
        zone: &'a str,
        key: String,
        algorithm: Algorithm,
        limits: &Limits,
    ) -> OverrideJson<'a> {
        OverrideJson {
            zone,
            key,
            limits: LimitsJson::new(algorithm, limits),
        }
    }
}

/// `{"error": "..."}`
#[derive(Serialize)]
pub struct ErrorJson<'a> {
    pub error: &'a str,
}

/// A JSON object from `(name, value)` pairs, in their order.
pub struct Entries<T>(pub Vec<(String, T)>);

impl<T: Serialize> Serialize for Entries<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (name, value) in &self.0 {
            map.serialize_entry(name, value)?;
        }
        map.end()
    }
}

/// Serialize `value` as pretty JSON with a final newline (for curl users).
pub fn to_body<T: Serialize>(value: &T) -> Vec<u8> {
    // Serializing these structs cannot fail: every map key is a string.
    let mut body = serde_json::to_vec_pretty(value)
        .unwrap_or_else(|_| br#"{"error": "cannot serialize the response"}"#.to_vec());
    body.push(b'\n');
    body
}

/// Serialize `value` as [`to_body`] does, but each array on one line (`[0, 0, 3, 11]`): for
/// answers holding long series of numbers (`GET zones/NAME/history`: 900 of them), which
/// would otherwise take a line each. Objects inside an array would lose their indentation:
/// for arrays of numbers and strings only.
pub fn to_body_arrays_on_one_line<T: Serialize>(value: &T) -> Vec<u8> {
    let mut body = Vec::new();
    let mut serializer =
        serde_json::Serializer::with_formatter(&mut body, ArraysOnOneLine::default());
    if value.serialize(&mut serializer).is_err() {
        body = br#"{"error": "cannot serialize the response"}"#.to_vec();
    }
    body.push(b'\n');
    body
}

/// serde_json's pretty printing, arrays excepted: those are written `[1, 2, 3]`.
#[derive(Default)]
struct ArraysOnOneLine<'a>(serde_json::ser::PrettyFormatter<'a>);

impl serde_json::ser::Formatter for ArraysOnOneLine<'_> {
    fn begin_array<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        writer.write_all(b"[")
    }

    fn end_array<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        writer.write_all(b"]")
    }

    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn end_array_value<W: ?Sized + std::io::Write>(&mut self, _: &mut W) -> std::io::Result<()> {
        Ok(())
    }

    fn begin_object<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.0.begin_object(writer)
    }

    fn end_object<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.0.end_object(writer)
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.0.begin_object_key(writer, first)
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        self.0.begin_object_value(writer)
    }

    fn end_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        self.0.end_object_value(writer)
    }
}

/// For `skip_serializing_if`: a count that is zero is left out.
fn is_zero(count: &u64) -> bool {
    *count == 0
}
