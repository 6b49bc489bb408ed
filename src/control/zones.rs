//! The zones of the running configuration as the admin API sees them ([`AdminZone`]), and
//! every change to them: a zone's limits, a key's override, forgetting a key. The admin API,
//! the Lua API and the sync loop all change zones through here.

use ngx::ffi::ngx_log_t;
use ratelimit_admin::body::LimitsBody;
use ratelimit_admin::history::History;
use ratelimit_admin::top::TopList;
use ratelimit_admin::{
    AdminZone, ApiError, BlockCounts, BlockInfo, BlockRefused, Counters, KeyState, OverrideRefused,
    Period, QuotaInfo, SpendInfo, SyncInfo, UsageInfo, ZoneInfo,
};
use ratelimit_core::block_table::BlockedKey;
use ratelimit_core::key_form::KeyForm;
use ratelimit_core::lease::LeaseWord;
use ratelimit_core::top::{TopKind, TopWindow};
use ratelimit_core::{Algorithm, DelayMode, Limits, Policy};

use crate::conf::registry::Registry;
use crate::conf::ZoneConf;
use crate::glue::{now_ms, now_ns, unix_ms_of};
use crate::store::concurrency::KeyWords;
use crate::store::sync_record::{self, Mode};
use crate::store::{Counter, OverrideError, Zone, OVERRIDE_CAPACITY};
use ratelimit_admin::concurrency::{AdaptiveKeyState, ConcurrencyInfo, ConcurrencyKeyState};
use ratelimit_core::concurrency::{ConcurrencyLimit, ConcurrencyLimits};

use super::concurrency;

/// One `rate_limit_zone` with its shared memory, and the time the request is answered at.
pub struct SharedZone<'a> {
    conf: &'a ZoneConf,
    zone: Zone,
    now_ns: u64,
}

/// Every zone of the registry whose shared memory is set up, in the configuration's order.
pub fn shared_zones(registry: &Registry, now_ns: u64) -> Vec<SharedZone<'_>> {
    registry
        .zones()
        .filter_map(|conf| SharedZone::new(conf, now_ns))
        .collect()
}

/// Change the rate and/or burst of zone `name` the way `PATCH zones/NAME` does: every worker
/// sees it at once, the state file keeps it, the fleet gets it. The Lua API's `set_rate` and
/// `set_burst`.
pub fn patch_zone(
    registry: &Registry,
    name: &str,
    patch: &LimitsBody,
    log: *mut ngx_log_t,
) -> Result<(), ApiError> {
    let zones = shared_zones(registry, now_ns());
    ratelimit_admin::patch_zone(&zones, name, patch)?;
    super::changed(registry, log);
    Ok(())
}

/// Change concurrency zone `name`'s limit and/or queue the way `PATCH zones/NAME` does: every
/// worker sees it at once, the state file keeps it. The Lua API's `set_conn` and `set_burst`.
pub fn patch_concurrency(
    registry: &Registry,
    name: &str,
    patch: &ratelimit_admin::concurrency::PatchBody,
    log: *mut ngx_log_t,
) -> Result<(), ApiError> {
    let zones = shared_zones(registry, now_ns());
    ratelimit_admin::patch_concurrency(&zones, name, patch)?;
    super::changed(registry, log);
    Ok(())
}

/// Set (`to`) or remove (`None`) a key's override the way `PUT`/`DELETE
/// zones/NAME/overrides/KEY` do (the key's backlog rescaled), provided the key's override is
/// still `expected` (packed limits, 0 for none): `Ok(false)` when it is not (changed here
/// meanwhile). The caller writes the state file ([`super::persist::save`]) after a batch.
pub fn replace_override(
    zone_conf: &ZoneConf,
    key: &[u8],
    expected: u64,
    to: Option<Limits>,
) -> Result<bool, OverrideRefused> {
    let Some(zone) = SharedZone::new(zone_conf, now_ns()) else {
        return Ok(false);
    };
    let current = zone.override_for(key).map_or(0, |limits| limits.pack());
    if current != expected {
        return Ok(false);
    }
    match to {
        Some(limits) => zone.set_override(key, limits).map(|_| true),
        None => Ok(zone.remove_override(key)),
    }
}

/// A concurrency key as the admin API shows it.
fn key_state(zone: &Zone, words: &KeyWords, limits: &ConcurrencyLimits) -> ConcurrencyKeyState {
    let slots = words.load();
    let adaptive = concurrency::adaptive_view(zone, words);
    let limit = match (limits.limit, adaptive) {
        (ConcurrencyLimit::Fixed(limit), _) => limit,
        (ConcurrencyLimit::Adaptive(_), Some(state)) => state.limit,
        (ConcurrencyLimit::Adaptive(bounds), None) => bounds.min,
    };
    let lease = words.lease.map(|lease| {
        LeaseWord::unpack(lease.lease.load(core::sync::atomic::Ordering::Acquire))
            .permits_at(now_ms())
            .unwrap_or(0)
    });
    ConcurrencyKeyState {
        lease,
        in_flight: slots.in_flight,
        queued: slots.queued(),
        limit,
        adaptive: adaptive.map(|state| AdaptiveKeyState {
            phase: concurrency::phase_name(state.phase),
            no_load_us: state.no_load_us,
            latency_us: state.last_median_us,
        }),
    }
}

/// The instance's sync state; `None` without `rate_limit_sync`.
fn sync_info() -> Option<SyncInfo> {
    use core::sync::atomic::Ordering;
    let sync = sync_record::shared()?;
    let mode = sync.mode();
    let last_ok_ms = sync.last_ok_ms.load(Ordering::Relaxed);
    Some(SyncInfo {
        connected: mode == Mode::Synced,
        mode: mode.as_str(),
        last_sync_age_ms: (last_ok_ms != 0).then(|| now_ms().saturating_sub(last_ok_ms)),
        instances: sync.instances(),
        round_trips: sync.round_trips.load(Ordering::Relaxed),
        errors: sync.errors.load(Ordering::Relaxed),
        lag_us: sync.lag_us.load(Ordering::Relaxed),
        fallback: mode.is_fallback(),
        keys_sent: sync.keys_pushed.load(Ordering::Relaxed),
        bad_values: sync.bad_values.load(Ordering::Relaxed),
    })
}

impl<'a> SharedZone<'a> {
    /// One zone of the running configuration; `None` before its shared memory is set up.
    pub fn new(conf: &'a ZoneConf, now_ns: u64) -> Option<SharedZone<'a>> {
        Some(SharedZone {
            conf,
            zone: conf.zone?,
            now_ns,
        })
    }

    pub fn zone(&self) -> Zone {
        self.zone
    }

    /// A concurrency zone's limits and totals (a full scan); `None` for a rate zone.
    fn concurrency_info(&self) -> Option<ConcurrencyInfo> {
        let limits = self.zone.concurrency_limits()?;
        let spec = self.conf.concurrency.as_ref()?;
        let (mut in_flight, mut queued) = (0, 0);
        let mut busiest: Option<ConcurrencyKeyState> = None;
        let mut lease = None;
        for (_, words) in self.zone.concurrency_keys() {
            let state = key_state(&self.zone, &words, &limits);
            if let Some(held) = state.lease {
                *lease.get_or_insert(0) += u64::from(held);
            }
            in_flight += u64::from(state.in_flight);
            queued += u64::from(state.queued);
            let busier = busiest.is_none_or(|b| state.in_flight > b.in_flight);
            if state.adaptive.is_some() && busier {
                busiest = Some(state);
            }
        }
        Some(ConcurrencyInfo {
            limits,
            config: self
                .zone
                .config_concurrency_limits()
                .unwrap_or(spec.limits()),
            queue_timeout_ns: spec.queue_timeout_ns,
            in_flight,
            queued,
            busiest,
            lease: lease.or(self.zone.is_sync().then_some(0)),
        })
    }

    /// A quota zone's period and time zone (`month in UTC`); `None` for another zone.
    pub fn calendar(&self) -> Option<String> {
        Some(self.conf.quota.as_ref()?.calendar.to_string())
    }

    /// A quota zone's calendar and current period; `None` for another zone.
    fn quota_info(&self) -> Option<QuotaInfo> {
        let quota = self.conf.quota.as_ref()?;
        Some(QuotaInfo {
            period: quota.calendar.unit.as_str(),
            tz: quota.calendar.tz_name.clone(),
            current: self.period()?,
        })
    }

    /// A quota zone's current period; `None` for another zone.
    fn period(&self) -> Option<Period> {
        let bounds = super::quota::bounds(self.conf, self.now_ns)?;
        Some(Period {
            start_unix_ms: bounds.start_ms,
            end_unix_ms: bounds.end_ms,
        })
    }

    /// What the configuration file says, as recorded in the zone at the last (re)load.
    pub fn config_limits(&self) -> Limits {
        Limits::unpack(self.zone.config_limits_word()).unwrap_or(self.conf.limits)
    }
}

impl AdminZone for SharedZone<'_> {
    fn name(&self) -> &str {
        &self.conf.name
    }

    fn key_form(&self) -> KeyForm {
        self.conf.key_form
    }

    fn info(&self) -> ZoneInfo {
        let count = |counter: Counter| self.zone.counter(counter);
        ZoneInfo {
            algorithm: self.zone.algorithm(),
            key: self.conf.key_text.clone(),
            stream: self.conf.key.is_stream(),
            size: self.conf.size,
            slots: self.zone.slot_count() as u64,
            keys: self.zone.tracked_keys(self.now_ns),
            limits: self.limits(),
            config_limits: self.config_limits(),
            counters: Counters {
                passed: count(Counter::Passed),
                delayed: count(Counter::Delayed),
                rejected: count(Counter::Rejected),
                delayed_dry_run: count(Counter::DelayedDryRun),
                rejected_dry_run: count(Counter::RejectedDryRun),
            },
            evictions: self.zone.evictions(),
            no_slot: self.zone.no_slot(),
            overrides: self.zone.override_count(),
            override_capacity: OVERRIDE_CAPACITY as u64,
            line_burst: self.conf.bursts.largest_given,
            sync: self.zone.is_sync().then(sync_info).flatten(),
            concurrency: self.concurrency_info(),
            usage: usage_info(&self.zone),
            quota: self.quota_info(),
        }
    }

    fn algorithm(&self) -> Algorithm {
        self.zone.algorithm()
    }

    fn concurrency_limits(&self) -> Option<ConcurrencyLimits> {
        self.zone.concurrency_limits()
    }

    fn concurrency_key(&self, key: &[u8]) -> Option<ConcurrencyKeyState> {
        let hash = self.zone.hash_key(key);
        let slot = self.zone.find_tracked(hash, self.now_ns)?;
        let words = self.zone.key_words(slot)?;
        let limits = self.zone.concurrency_limits()?;
        Some(key_state(&self.zone, &words, &limits))
    }

    fn replace_concurrency_limits(
        &self,
        current: ConcurrencyLimits,
        new: ConcurrencyLimits,
    ) -> Result<(), ConcurrencyLimits> {
        self.zone
            .replace_concurrency_limits(current, new)
            .map_err(|found| found.unwrap_or(current))
    }

    fn limits(&self) -> Limits {
        self.zone.limits().unwrap_or(self.conf.limits)
    }

    fn replace_limits(&self, current: Limits, new: Limits) -> Result<(), Limits> {
        self.zone
            .replace_limits(current, new, self.now_ns)
            .map_err(|found| Limits::unpack(found).unwrap_or(self.conf.limits))
    }

    fn key_state(&self, key: &[u8]) -> Option<KeyState> {
        let hash = self.zone.hash_key(key);
        let slot = self.zone.find_tracked(hash, self.now_ns)?;
        let override_limits = self.zone.override_for(hash);
        let limits = override_limits.unwrap_or_else(|| self.limits());
        // A location's own `burst=` or `delay=` may differ; the zone's view is what the key
        // gets where the location adds nothing, with the burst served at once.
        let mut algorithm = self.zone.algorithm();
        if algorithm.is_quota() {
            algorithm = Algorithm::Quota(super::quota::window(self.conf, self.now_ns));
        }
        let policy = Policy {
            algorithm,
            limits,
            delay: DelayMode::NoDelay,
            cost: 1,
        };
        let mut decision = self.zone.decide(slot, self.now_ns, &policy, false);
        // The decision's reset counts the request it imagines; the key's own is without it.
        // A quota's count goes at the period's end, as the decision says.
        if !algorithm.is_quota() {
            decision.reset_ns = self.zone.time_to_fresh_ns(slot, &limits, self.now_ns);
        }
        Some(KeyState {
            limits,
            period: self.period(),
            override_limits,
            decision,
            debt: self.zone.debt_tokens(slot, &policy, self.now_ns),
        })
    }

    fn forget_key(&self, key: &[u8]) -> bool {
        self.zone.forget(self.zone.hash_key(key), self.now_ns)
    }

    fn override_for(&self, key: &[u8]) -> Option<Limits> {
        self.zone.override_for(self.zone.hash_key(key))
    }

    fn overrides(&self) -> Vec<(Vec<u8>, Limits)> {
        self.zone.overrides()
    }

    fn set_override(&self, key: &[u8], limits: Limits) -> Result<bool, OverrideRefused> {
        let hash = self.zone.hash_key(key);
        let before = self
            .zone
            .override_for(hash)
            .unwrap_or_else(|| self.limits());
        let created = self
            .zone
            .set_override(key, limits)
            .map_err(|error| match error {
                OverrideError::TableFull => OverrideRefused::TableFull,
                OverrideError::NoMemory => OverrideRefused::NoMemory,
            })?;
        // The key's backlog drains at its new rate from now on.
        self.zone.rescale_key(hash, &before, &limits, self.now_ns);
        Ok(created)
    }

    fn remove_override(&self, key: &[u8]) -> bool {
        let hash = self.zone.hash_key(key);
        let before = self.zone.override_for(hash);
        let removed = self.zone.remove_override(key);
        if let Some(before) = before.filter(|_| removed) {
            self.zone
                .rescale_key(hash, &before, &self.limits(), self.now_ns);
        }
        removed
    }

    fn top(&self, kind: TopKind, window: TopWindow, limit: usize) -> Option<TopList> {
        let (keys, total) = self.zone.top(kind, window, self.now_ns, limit)?;
        Some(TopList { keys, total })
    }

    fn history(&self) -> Option<History> {
        let [passed, delayed, rejected] = self.zone.history(self.now_ns);
        // The ring counts monotonic seconds; the page labels them with the clock's time.
        let end_unix_s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_secs());
        Some(History {
            end_unix_s,
            passed,
            delayed,
            rejected,
        })
    }

    fn block_counts(&self) -> Option<BlockCounts> {
        let policy = self.conf.block?;
        Some(BlockCounts {
            block_ns: policy.block_ns,
            block_max_ns: policy.block_max_ns,
            blocked_requests: self.zone.counter(Counter::Blocked),
            blocked_dry_run_requests: self.zone.counter(Counter::BlockedDryRun),
            not_recorded: self.zone.counter(Counter::BlockNotRecorded),
            blocked_keys: self.zone.blocked_count(self.now_ns) as u64,
            capacity: self.zone.block_capacity() as u64,
        })
    }

    fn blocked(&self) -> Vec<BlockInfo> {
        if self.conf.block.is_none() {
            return Vec::new();
        }
        let keys = self.zone.blocked_keys(self.now_ns);
        keys.into_iter().map(|key| self.block_info(key)).collect()
    }

    fn block_of(&self, key: &[u8]) -> Option<BlockInfo> {
        self.conf.block?;
        let blocked = self
            .zone
            .blocked_key(self.zone.hash_key(key), self.now_ns)?;
        Some(self.block_info(blocked))
    }

    fn block_key(&self, key: &[u8], duration_ns: u64) -> Result<BlockInfo, BlockRefused> {
        let block = super::blocks::block_by_hand(self.conf, key, duration_ns, self.now_ns)
            .map_err(|error| match error {
                super::blocks::BlockError::NoBlocks(_) => BlockRefused::NoBlocks,
                super::blocks::BlockError::Full(_) => BlockRefused::Full,
            })?;
        Ok(self.block_info(BlockedKey {
            key: key.to_vec(),
            truncated: false,
            block,
        }))
    }

    fn release_key(&self, key: &[u8]) -> bool {
        super::blocks::release(self.conf, key, self.now_ns)
    }
}

impl SharedZone<'_> {
    /// A blocked key as the API shows it: Unix times.
    fn block_info(&self, blocked: BlockedKey) -> BlockInfo {
        BlockInfo {
            key: blocked.key,
            truncated: blocked.truncated,
            since_unix_ms: unix_ms_of(blocked.block.since_ns),
            until_unix_ms: unix_ms_of(blocked.block.until_ns),
            level: blocked.block.level,
            left_ms: blocked.block.until_ns.saturating_sub(self.now_ns) / 1_000_000,
        }
    }
}

/// What priced lines charged `zone`, once one has.
fn spend_info(zone: &Zone) -> Option<SpendInfo> {
    let spent = zone.counter(Counter::SpentMicroUsd);
    let unpriced = zone.counter(Counter::Unpriced);
    (spent > 0 || unpriced > 0).then_some(SpendInfo {
        spent_micro_usd: spent,
        unpriced,
    })
}

/// The tokens usage-based lines charged `zone`, once one has.
fn usage_info(zone: &Zone) -> Option<UsageInfo> {
    let count = |counter: Counter| zone.counter(counter);
    let reserved = count(Counter::TokensReserved);
    (reserved > 0).then(|| UsageInfo {
        tokens_reserved: reserved,
        tokens_used: count(Counter::TokensUsed),
        tokens_refunded: count(Counter::TokensRefunded),
        tokens_overrun: count(Counter::TokensOverrun),
        tokens_forgiven: count(Counter::TokensForgiven),
        settled_with_usage: count(Counter::UsageFound),
        settled_without_usage: count(Counter::UsageMissing),
        spend: spend_info(zone),
        bad_usage: count(Counter::UsageBad),
    })
}
