//! The JSON the API answers with. Field order is fixed by the structs (no map reordering).

use ratelimit_core::key_form::KeyForm;
use ratelimit_core::{Limits, Outcome};
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;

use crate::store::{BlockCounts, BlockInfo, KeyState, SyncInfo, ZoneInfo};
pub use crate::units::{milliseconds, milliseconds_f};

/// `{"rate": "10r/s", "burst": 5}`
#[derive(Serialize)]
pub struct LimitsJson {
    pub rate: String,
    pub burst: u64,
}

impl From<&Limits> for LimitsJson {
    fn from(limits: &Limits) -> LimitsJson {
        LimitsJson {
            rate: limits.rate.to_string(),
            burst: limits.burst,
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
        let config = match concurrency {
            Some(concurrency) => {
                ConfigJson::Concurrency(crate::concurrency::LimitsJson::from(&concurrency.config))
            }
            None => ConfigJson::Rate(LimitsJson::from(&info.config_limits)),
        };
        ZoneJson {
            context: info.stream.then_some("stream"),
            algorithm: info.algorithm.as_str(),
            key: &info.key,
            rate: concurrency.is_none().then(|| info.limits.rate.to_string()),
            burst: concurrency.is_none().then_some(info.limits.burst),
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
    pub rate: String,
    pub burst: u64,
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
        KeyJson {
            zone,
            key,
            rate: state.limits.rate.to_string(),
            burst: state.limits.burst,
            override_limits: state.override_limits.as_ref().map(LimitsJson::from),
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
    pub rate: String,
    pub burst: u64,
}

impl<'a> OverrideJson<'a> {
    /// `key` is the key as shown (`KeyForm::show`).
    pub fn new(zone: &'a str, key: String, limits: &Limits) -> OverrideJson<'a> {
        OverrideJson {
            zone,
            key,
            rate: limits.rate.to_string(),
            burst: limits.burst,
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
