//! An in-process [`AdminZone`] for tests and examples: the same behaviour as the module's
//! shared-memory zone, with keys and their decisions set by hand.

use std::collections::BTreeMap;
use std::sync::Mutex;

use ratelimit_core::top::{TopKeys, TopKind, TopWindow};
use ratelimit_core::{Algorithm, Decision, Limits, Outcome};

use crate::top::TopList;

use crate::store::{AdminZone, Counters, KeyState, OverrideRefused, ZoneInfo};

/// A zone kept in a `Mutex`.
pub struct MemoryZone {
    name: String,
    state: Mutex<MemoryState>,
}

struct MemoryState {
    info: ZoneInfo,
    /// Tracked keys and the decision a request would get now.
    keys: BTreeMap<Vec<u8>, Decision>,
    overrides: BTreeMap<Vec<u8>, Limits>,
    /// Top keys, and the time of the last request recorded in them (queries are at that time).
    top: Box<TopKeys>,
    top_now_ns: u64,
}

impl MemoryZone {
    /// An empty zone with `limits` from its configuration.
    pub fn new(name: &str, algorithm: Algorithm, limits: Limits) -> MemoryZone {
        let info = ZoneInfo {
            algorithm,
            key: "$binary_remote_addr".to_string(),
            size: 1 << 20,
            slots: 1024,
            keys: 0,
            limits,
            config_limits: limits,
            counters: Counters::default(),
            evictions: 0,
            overrides: 0,
            override_capacity: 4,
            line_burst: None,
            sync: None,
        };
        MemoryZone {
            name: name.to_string(),
            state: Mutex::new(MemoryState {
                info,
                keys: BTreeMap::new(),
                overrides: BTreeMap::new(),
                top: Box::new(TopKeys::EMPTY),
                top_now_ns: 0,
            }),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut MemoryState) -> T) -> T {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut state)
    }

    /// Track `key` with `remaining` requests left (0: a request now is rejected).
    pub fn track(&self, key: &[u8], remaining: u64) {
        let decision = Decision {
            outcome: if remaining == 0 {
                Outcome::Rejected
            } else {
                Outcome::Passed
            },
            delay_ns: 0,
            retry_after_ns: if remaining == 0 { 1_500_000 } else { 0 },
            // A decision counts what remains after the request it decides.
            remaining: remaining.saturating_sub(1),
            reset_ns: 2_000_000_001,
            excess_milli: 0,
        };
        self.with(|state| state.keys.insert(key.to_vec(), decision));
    }

    /// Count a delayed or rejected request of `key` at `now_ns` in the zone's top keys.
    pub fn record_top(&self, kind: TopKind, now_ns: u64, key: &[u8]) {
        // Any fixed hash will do here: FNV-1a.
        let hash = key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        self.with(|state| {
            state.top.record(kind, now_ns, hash, key);
            state.top_now_ns = now_ns;
        });
    }

    /// Replace the counters and other numbers `info` reports.
    pub fn set_counters(&self, counters: Counters) {
        self.with(|state| state.info.counters = counters);
    }

    /// A `rate_limit` line using the zone gives `burst=` (the largest of them).
    pub fn set_line_burst(&self, burst: u64) {
        self.with(|state| state.info.line_burst = Some(burst));
    }
}

impl AdminZone for MemoryZone {
    fn name(&self) -> &str {
        &self.name
    }

    fn info(&self) -> ZoneInfo {
        self.with(|state| {
            let mut info = state.info.clone();
            info.keys = state.keys.len() as u64;
            info.overrides = state.overrides.len() as u64;
            info
        })
    }

    fn limits(&self) -> Limits {
        self.with(|state| state.info.limits)
    }

    fn replace_limits(&self, current: Limits, new: Limits) -> Result<(), Limits> {
        self.with(|state| {
            if state.info.limits != current {
                return Err(state.info.limits);
            }
            state.info.limits = new;
            Ok(())
        })
    }

    fn key_state(&self, key: &[u8]) -> Option<KeyState> {
        self.with(|state| {
            let decision = *state.keys.get(key)?;
            let override_limits = state.overrides.get(key).copied();
            Some(KeyState {
                limits: override_limits.unwrap_or(state.info.limits),
                override_limits,
                decision,
            })
        })
    }

    fn forget_key(&self, key: &[u8]) -> bool {
        self.with(|state| state.keys.remove(key).is_some())
    }

    fn override_for(&self, key: &[u8]) -> Option<Limits> {
        self.with(|state| state.overrides.get(key).copied())
    }

    fn overrides(&self) -> Vec<(Vec<u8>, Limits)> {
        self.with(|state| {
            let overrides = state.overrides.iter();
            overrides
                .map(|(key, limits)| (key.clone(), *limits))
                .collect()
        })
    }

    fn set_override(&self, key: &[u8], limits: Limits) -> Result<bool, OverrideRefused> {
        self.with(|state| {
            let capacity = state.info.override_capacity as usize;
            if !state.overrides.contains_key(key) && state.overrides.len() >= capacity {
                return Err(OverrideRefused::TableFull);
            }
            // A stand-in for the zone's memory: keys of all overrides within its size.
            let key_bytes: usize = state.overrides.keys().map(Vec::len).sum();
            if !state.overrides.contains_key(key)
                && (key_bytes + key.len()) as u64 > state.info.size
            {
                return Err(OverrideRefused::NoMemory);
            }
            Ok(state.overrides.insert(key.to_vec(), limits).is_none())
        })
    }

    fn remove_override(&self, key: &[u8]) -> bool {
        self.with(|state| state.overrides.remove(key).is_some())
    }

    fn top(&self, kind: TopKind, window: TopWindow, limit: usize) -> Option<TopList> {
        self.with(|state| {
            Some(TopList {
                keys: state.top.top(kind, window, state.top_now_ns, limit),
                total: state.top.total(kind, window, state.top_now_ns),
            })
        })
    }
}
