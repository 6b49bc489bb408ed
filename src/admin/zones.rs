//! The zones of the running configuration, shown to the admin API (`AdminZone`) over their
//! shared memory.

use core::sync::atomic::Ordering;

use ratelimit_admin::top::TopList;
use ratelimit_admin::{AdminZone, Counters, KeyState, OverridesFull, ZoneInfo};
use ratelimit_core::top::{TopKind, TopWindow};
use ratelimit_core::{DelayMode, Limits, Policy};

use crate::conf::{MainConf, ZoneConf};
use crate::zone::{Counter, Zone, OVERRIDE_CAPACITY};

/// One `rate_limit_zone` with its shared memory, and the time the request is answered at.
pub struct SharedZone<'a> {
    conf: &'a ZoneConf,
    zone: Zone,
    now_ns: u64,
}

/// Every zone of `mcf` whose shared memory is set up, in the configuration's order.
pub fn shared_zones(mcf: &MainConf, now_ns: u64) -> Vec<SharedZone<'_>> {
    mcf.zones
        .iter()
        .filter_map(|&zone_conf| {
            // SAFETY: zone configurations live in the pool of the cycle that `mcf` belongs
            // to, as long as `mcf` does.
            let conf = unsafe { zone_conf.as_ref() }?;
            Some(SharedZone {
                conf,
                zone: conf.zone?,
                now_ns,
            })
        })
        .collect()
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

    /// What the configuration file says, as recorded in the zone at the last (re)load.
    pub fn config_limits(&self) -> Limits {
        let packed = self.zone.header().config_limits.load(Ordering::Relaxed);
        Limits::unpack(packed).unwrap_or(self.conf.limits)
    }
}

impl AdminZone for SharedZone<'_> {
    fn name(&self) -> &str {
        &self.conf.name
    }

    fn info(&self) -> ZoneInfo {
        let header = self.zone.header();
        let count = |counter: Counter| self.zone.counter(counter);
        ZoneInfo {
            algorithm: self.zone.algorithm(),
            key: self.conf.key_text.clone(),
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
            evictions: header.evictions.load(Ordering::Relaxed),
            overrides: header.override_count.load(Ordering::Relaxed),
            override_capacity: OVERRIDE_CAPACITY as u64,
            sync: self.zone.is_sync().then(crate::sync::info).flatten(),
        }
    }

    fn limits(&self) -> Limits {
        self.zone.limits().unwrap_or(self.conf.limits)
    }

    fn replace_limits(&self, current: Limits, new: Limits) -> Result<(), Limits> {
        // One word holds rate and burst: requests read either the old pair or the new one,
        // and two admin writes in two workers cannot lose one another's field.
        self.zone
            .header()
            .limits
            .compare_exchange(
                current.pack(),
                new.pack(),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .map(|_| self.zone.rescale_backlogs(&current, &new, self.now_ns))
            .map_err(|found| Limits::unpack(found).unwrap_or(self.conf.limits))
    }

    fn key_state(&self, key: &[u8]) -> Option<KeyState> {
        let hash = self.zone.hash_key(key);
        let slot = self.zone.find_tracked(hash, self.now_ns)?;
        let override_limits = self.zone.override_for(hash);
        let limits = override_limits.unwrap_or_else(|| self.limits());
        // A location's own `burst=` or `delay=` may differ; the zone's view is what the key
        // gets where the location adds nothing, with the burst served at once.
        let policy = Policy {
            algorithm: self.zone.algorithm(),
            limits,
            delay: DelayMode::NoDelay,
            cost: 1,
        };
        let mut decision = self.zone.decide(slot, self.now_ns, &policy, false);
        // The decision's reset counts the request it imagines; the key's own is without it.
        decision.reset_ns = self.zone.time_to_fresh_ns(slot, &limits, self.now_ns);
        Some(KeyState {
            limits,
            override_limits,
            decision,
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

    fn set_override(&self, key: &[u8], limits: Limits) -> Result<bool, OverridesFull> {
        let hash = self.zone.hash_key(key);
        let before = self
            .zone
            .override_for(hash)
            .unwrap_or_else(|| self.limits());
        let created = self
            .zone
            .set_override(key, limits)
            .map_err(|()| OverridesFull)?;
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
        let (keys, total) = crate::top::top(&self.zone, kind, window, self.now_ns, limit)?;
        Some(TopList { keys, total })
    }
}
