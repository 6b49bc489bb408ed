//! What the API needs from a zone: the nginx module implements [`AdminZone`] over shared
//! memory, [`crate::memory::MemoryZone`] implements it for tests.

use ratelimit_core::key_form::KeyForm;
use ratelimit_core::top::{TopKind, TopWindow};
use ratelimit_core::{Algorithm, Decision, Limits};

use crate::concurrency::{ConcurrencyInfo, ConcurrencyKeyState};
use crate::history::History;
use crate::top::TopList;
use ratelimit_core::concurrency::ConcurrencyLimits;

/// A zone's decision counters, as `rate_limit_requests_total` and `GET zones/NAME` show them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub passed: u64,
    pub delayed: u64,
    pub rejected: u64,
    pub delayed_dry_run: u64,
    pub rejected_dry_run: u64,
}

impl Counters {
    /// `(outcome label, value)` in a fixed order.
    pub fn by_outcome(&self) -> [(&'static str, u64); 5] {
        [
            ("passed", self.passed),
            ("delayed", self.delayed),
            ("rejected", self.rejected),
            ("delayed_dry_run", self.delayed_dry_run),
            ("rejected_dry_run", self.rejected_dry_run),
        ]
    }
}

/// Everything `GET zones/NAME` and the metrics show about a zone, read at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZoneInfo {
    pub algorithm: Algorithm,
    /// The KEY of `rate_limit_zone`, as written (`$binary_remote_addr`).
    pub key: String,
    /// Bytes of shared memory (`zone=NAME:SIZE`).
    pub size: u64,
    /// Key slots the zone's table has.
    pub slots: u64,
    /// Keys whose state differs from a fresh key's now.
    pub keys: u64,
    /// The limits requests get now.
    pub limits: Limits,
    /// The limits the configuration file gives.
    pub config_limits: Limits,
    pub counters: Counters,
    /// Keys dropped to make room for new ones while their state still mattered.
    pub evictions: u64,
    /// New keys refused a slot because every slot of their window held requests in flight
    /// or queued (a concurrency zone: busy keys are never evicted).
    pub no_slot: u64,
    pub overrides: u64,
    pub override_capacity: u64,
    /// The largest `burst=` a `rate_limit` line using the zone gives (in place of the zone's
    /// for that line's requests): a new rate must allow it too.
    pub line_burst: Option<u64>,
    /// For a `sync` zone (`rate_limit_sync`): the instance's sync state.
    pub sync: Option<SyncInfo>,
    /// For a concurrency zone: its limits and what is in flight (`limits` is then unused).
    pub concurrency: Option<ConcurrencyInfo>,
    /// Declared in nginx's `stream {}` block (TCP and UDP sessions), not in `http {}`.
    pub stream: bool,
    /// Tokens of the usage-based lines (`usage=`) that charged the zone; `None` until one
    /// has.
    pub usage: Option<UsageInfo>,
    /// For a quota zone: `period=`, `tz=` and the current period.
    pub quota: Option<QuotaInfo>,
}

/// A quota zone's calendar (`period=`, `tz=`) and its current period.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaInfo {
    /// `hour`, `day`, `week` or `month`.
    pub period: &'static str,
    /// `tz=` as configured, `UTC` by default.
    pub tz: String,
    pub current: Period,
}

/// What usage-based lines (`usage=`) charged a zone, in tokens, since it was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct UsageInfo {
    /// Reserved at the door.
    pub tokens_reserved: u64,
    /// Owed by the requests that ended (their usage, or what a missing usage costs).
    pub tokens_used: u64,
    /// Given back: reserved and not used.
    pub tokens_refunded: u64,
    /// Charged after the response, past the reservation (into debt when it did not fit).
    pub tokens_overrun: u64,
    /// Of the overrun, what `debt=` forgave.
    pub tokens_forgiven: u64,
    /// Requests settled from a usage the response reported, and without one.
    pub settled_with_usage: u64,
    pub settled_without_usage: u64,
    /// Of those without: the response's usage was malformed.
    pub bad_usage: u64,
    /// Only once a priced line (`prices=`) has charged the zone: what it spent.
    #[serde(flatten)]
    pub spend: Option<SpendInfo>,
}

/// What priced lines (`usage=... prices=NAME`) charged a zone since it was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SpendInfo {
    /// Micro-dollars owed by the requests that ended (1 USD = 1,000,000).
    pub spent_micro_usd: u64,
    /// Requests whose model the price table has no price for (or whose response named no
    /// model): they kept their reservation.
    pub unpriced: u64,
}

/// The sync state of the instance a `sync` zone belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncInfo {
    /// Whether the last sync round reached Redis.
    pub connected: bool,
    /// `starting`, `synced`, `degraded`, or the failure mode in force (`local_share`,
    /// `open`, `closed`).
    pub mode: &'static str,
    /// Milliseconds since the last successful sync; `None` before the first one.
    pub last_sync_age_ms: Option<u64>,
    /// Instances seen alive in the fleet's heartbeats (N̂).
    pub instances: u64,
    /// Successful round trips and failed rounds since the instance started.
    pub round_trips: u64,
    pub errors: u64,
    /// Duration of the last successful round trip, in microseconds.
    pub lag_us: u64,
    /// Whether the failure mode is in force.
    pub fallback: bool,
    /// Keys sent to Redis since the instance started (a key whose pending delta stays well
    /// inside its share needs no round trip, so this grows with what matters, not traffic).
    pub keys_sent: u64,
    /// Values from Redis dropped for being out of the bounds the instance computes itself
    /// (key states, counts, limits, overrides, instances, replies too large).
    pub bad_values: u64,
}

impl ZoneInfo {
    /// For `sliding_log`: the requests per window each key's log has room for (the configured
    /// rate's N, fixed when the zone's memory was laid out). Unused by other algorithms.
    pub fn log_capacity(&self) -> u64 {
        ratelimit_core::sliding_log::window_limit(&self.config_limits.rate)
    }
}

/// One key's state now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyState {
    /// The limits this key gets: the zone's, or its override.
    pub limits: Limits,
    /// For a quota zone: the current period, in Unix milliseconds.
    pub period: Option<Period>,
    pub override_limits: Option<Limits>,
    /// What a request of cost 1 would get now (nothing is charged), except `reset_ns`: the
    /// time until the key is back to a fresh key's state as it is, without that request.
    pub decision: Decision,
    /// Tokens the key owes past its bucket's capacity (usage-based lines charge into debt);
    /// 0 when it owes none.
    pub debt: u64,
}

/// A quota zone's current period: from `start_unix_ms` up to `end_unix_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Period {
    pub start_unix_ms: i64,
    pub end_unix_ms: i64,
}

/// One blocked key (`block=`), as the admin API lists it. Times are wall-clock milliseconds
/// since the Unix epoch (the module converts from its monotonic clock).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockInfo {
    /// The key (cut to what the zone keeps when `truncated`).
    pub key: Vec<u8>,
    /// The key was longer than the block table keeps for listing.
    pub truncated: bool,
    /// When the block started.
    pub since_unix_ms: u64,
    /// When it ends.
    pub until_unix_ms: u64,
    /// Its escalation level: 0 for `block`, `n` for `block × 2^n` (capped at `block_max`).
    pub level: u8,
    /// Time left, in milliseconds.
    pub left_ms: u64,
}

/// A zone's penalty box, for metrics and the dashboard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockCounts {
    /// `block=` in nanoseconds.
    pub block_ns: u64,
    /// `block_max=` in nanoseconds.
    pub block_max_ns: u64,
    /// Requests refused because their key was blocked, since the zone was created.
    pub blocked_requests: u64,
    /// Requests a dry run let through although their key was blocked.
    pub blocked_dry_run_requests: u64,
    /// Rejected keys a full table could not block (it keeps the blocks it holds).
    pub not_recorded: u64,
    /// Keys blocked now.
    pub blocked_keys: u64,
    /// Blocked keys the zone's table holds at most.
    pub capacity: u64,
}

/// The zone has no penalty box (no `block=`), or its table has no room at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockRefused {
    /// The zone has no `block=`.
    NoBlocks,
    /// The block table has no record to give.
    Full,
}

/// Why a zone has no room for another override.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OverrideRefused {
    /// Its table of overrides is full ([`ZoneInfo::override_capacity`]).
    TableFull,
    /// Its shared memory has no room left for the key's bytes.
    NoMemory,
}

/// One zone, as the admin API sees it. Every method is safe to call from several processes
/// at once: implementations work on shared state with atomics or the zone's own lock.
pub trait AdminZone {
    /// The zone's name (`zone=NAME:SIZE`).
    fn name(&self) -> &str;

    /// The zone as it is now.
    fn info(&self) -> ZoneInfo;

    /// The zone's algorithm (what [`AdminZone::info`] says, without counting its keys).
    fn algorithm(&self) -> Algorithm {
        self.info().algorithm
    }

    /// How the zone's keys are shown and given (`$binary_remote_addr` keys as addresses).
    fn key_form(&self) -> KeyForm {
        KeyForm::Text
    }

    /// The limits requests get now.
    fn limits(&self) -> Limits;

    /// Replace the zone's limits if they still are `current` (one compare-and-swap of the
    /// whole limit, so that no reader sees a new rate with an old burst). On failure, returns
    /// the limits found instead.
    fn replace_limits(&self, current: Limits, new: Limits) -> Result<(), Limits>;

    /// `None` when the zone does not track `key`.
    fn key_state(&self, key: &[u8]) -> Option<KeyState>;

    /// Forget a key's state; false when it was not tracked.
    fn forget_key(&self, key: &[u8]) -> bool;

    fn override_for(&self, key: &[u8]) -> Option<Limits>;

    /// Every override, as (key, limits).
    fn overrides(&self) -> Vec<(Vec<u8>, Limits)>;

    /// Set a key's override: `Ok(true)` when it is new, `Ok(false)` when it replaced one.
    fn set_override(&self, key: &[u8], limits: Limits) -> Result<bool, OverrideRefused>;

    /// Remove a key's override; false when there was none.
    fn remove_override(&self, key: &[u8]) -> bool;

    /// The `limit` keys with the most requests of `kind` over `window`; `None` when the
    /// zone keeps no top keys.
    fn top(&self, _kind: TopKind, _window: TopWindow, _limit: usize) -> Option<TopList> {
        None
    }

    /// Requests per second over the last minutes; `None` when the zone keeps no history.
    fn history(&self) -> Option<History> {
        None
    }

    /// The zone's penalty box; `None` when the zone has no `block=`.
    fn block_counts(&self) -> Option<BlockCounts> {
        None
    }

    /// The keys blocked now, the block ending first first.
    fn blocked(&self) -> Vec<BlockInfo> {
        Vec::new()
    }

    /// `key`'s block, if it is blocked now.
    fn block_of(&self, _key: &[u8]) -> Option<BlockInfo> {
        None
    }

    /// Block `key` by hand for `duration_ns` (it keeps its escalation level).
    fn block_key(&self, _key: &[u8], _duration_ns: u64) -> Result<BlockInfo, BlockRefused> {
        Err(BlockRefused::NoBlocks)
    }

    /// End `key`'s block now; false when it was not blocked.
    fn release_key(&self, _key: &[u8]) -> bool {
        false
    }

    /// For a concurrency zone, its limits in force now; `None` for a rate zone.
    fn concurrency_limits(&self) -> Option<ConcurrencyLimits> {
        None
    }

    /// A concurrency zone's key now; `None` when the zone does not track it.
    fn concurrency_key(&self, _key: &[u8]) -> Option<ConcurrencyKeyState> {
        None
    }

    /// Replace a concurrency zone's limits if they still are `current` (one
    /// compare-and-swap); on failure, the limits found instead.
    fn replace_concurrency_limits(
        &self,
        current: ConcurrencyLimits,
        _new: ConcurrencyLimits,
    ) -> Result<(), ConcurrencyLimits> {
        Err(current)
    }
}
