//! An in-process [`AdminZone`] for tests and examples: the same behaviour as the module's
//! shared-memory zone, with keys and their decisions set by hand.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use ratelimit_core::block_table::{BlockChange, BlockTable, BlockedKey};
use ratelimit_core::penalty::BlockPolicy;
use ratelimit_core::top::{TopKeys, TopKind, TopWindow};
use ratelimit_core::{Algorithm, Decision, Limits, Outcome};

use crate::history::History;
use crate::top::TopList;

use crate::concurrency::{ConcurrencyInfo, ConcurrencyKeyState};
use crate::store::{
    AdminZone, BlockCounts, BlockInfo, BlockRefused, Counters, KeyState, OverrideRefused, ZoneInfo,
};
use ratelimit_core::concurrency::{ConcurrencyLimit, ConcurrencyLimits};
use ratelimit_core::key_form::KeyForm;

/// A zone kept in a `Mutex`.
pub struct MemoryZone {
    name: String,
    state: Mutex<MemoryState>,
    /// `block=`: the policy and the block table's words (as the module keeps them in shared
    /// memory), with the clock set by hand ([`MemoryZone::set_now`], Unix nanoseconds).
    blocks: Option<MemoryBlocks>,
    /// How keys are shown and given: text unless set ([`MemoryZone::with_key_form`]), although
    /// the zone's KEY reads `$binary_remote_addr`.
    key_form: KeyForm,
}

struct MemoryBlocks {
    policy: BlockPolicy,
    words: Vec<AtomicU64>,
    lock: Mutex<()>,
    now_ns: AtomicU64,
    blocked_requests: AtomicU64,
}

impl MemoryBlocks {
    fn table(&self) -> BlockTable<'_> {
        BlockTable::new(&self.words)
    }

    fn now(&self) -> u64 {
        self.now_ns.load(Ordering::Relaxed)
    }

    fn info(&self, blocked: BlockedKey) -> BlockInfo {
        let now = self.now();
        BlockInfo {
            key: blocked.key,
            truncated: blocked.truncated,
            since_unix_ms: blocked.block.since_ns / 1_000_000,
            until_unix_ms: blocked.block.until_ns / 1_000_000,
            level: blocked.block.level,
            left_ms: blocked
                .block
                .until_ns
                .saturating_sub(now)
                .div_ceil(1_000_000),
        }
    }
}

/// FNV-1a: any fixed hash will do here.
fn hash(key: &[u8]) -> u64 {
    key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

struct MemoryState {
    info: ZoneInfo,
    /// Tracked keys and the decision a request would get now.
    keys: BTreeMap<Vec<u8>, Decision>,
    overrides: BTreeMap<Vec<u8>, Limits>,
    /// Top keys, and the time of the last request recorded in them (queries are at that time).
    top: Box<TopKeys>,
    top_now_ns: u64,
    /// A concurrency zone's keys.
    in_flight: BTreeMap<Vec<u8>, ConcurrencyKeyState>,
    history: Option<History>,
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
            no_slot: 0,
            usage: None,
            quota: None,
            overrides: 0,
            override_capacity: 4,
            line_burst: None,
            sync: None,
            concurrency: None,
            stream: false,
        };
        MemoryZone {
            name: name.to_string(),
            state: Mutex::new(MemoryState {
                info,
                keys: BTreeMap::new(),
                overrides: BTreeMap::new(),
                top: Box::new(TopKeys::EMPTY),
                top_now_ns: 0,
                in_flight: BTreeMap::new(),
                history: None,
            }),
            blocks: None,
            key_form: KeyForm::Text,
        }
    }

    /// The same zone with its keys shown and given in `form`.
    pub fn with_key_form(mut self, form: KeyForm) -> MemoryZone {
        self.key_form = form;
        self
    }

    /// The same zone with `block=` (`policy`) and a block table of `records` records.
    pub fn with_blocks(mut self, policy: BlockPolicy, records: usize) -> MemoryZone {
        self.blocks = Some(MemoryBlocks {
            policy,
            words: (0..BlockTable::words_for(records))
                .map(|_| AtomicU64::new(0))
                .collect(),
            lock: Mutex::new(()),
            now_ns: AtomicU64::new(0),
            blocked_requests: AtomicU64::new(0),
        });
        self
    }

    /// Set the clock of the zone's blocks (Unix nanoseconds).
    pub fn set_now(&self, now_ns: u64) {
        if let Some(blocks) = &self.blocks {
            blocks.now_ns.store(now_ns, Ordering::Relaxed);
        }
    }

    /// A request of `key` is rejected now: block it as the module would, and count the
    /// requests it then refuses with [`MemoryZone::refuse_blocked`].
    pub fn reject(&self, key: &[u8]) {
        if let Some(blocks) = &self.blocks {
            let _ = blocks.table().block(
                hash(key),
                key,
                blocks.now(),
                BlockChange::Rejected,
                &blocks.policy,
                || blocks.lock.lock(),
            );
        }
    }

    /// Count `count` requests refused because their key was blocked.
    pub fn refuse_blocked(&self, count: u64) {
        if let Some(blocks) = &self.blocks {
            blocks.blocked_requests.fetch_add(count, Ordering::Relaxed);
        }
    }

    /// An empty concurrency zone with `limits` from its configuration.
    pub fn concurrency(name: &str, limits: ConcurrencyLimits) -> MemoryZone {
        let placeholder = Limits {
            rate: ratelimit_core::Rate::parse("1r/s").unwrap_or(ratelimit_core::Rate {
                milli_requests: 1000,
                unit: ratelimit_core::RateUnit::Second,
            }),
            burst: 0,
        };
        let zone = MemoryZone::new(name, Algorithm::Concurrency, placeholder);
        zone.with(|state| {
            state.info.concurrency = Some(ConcurrencyInfo {
                lease: None,
                limits,
                config: limits,
                queue_timeout_ns: 5_000_000_000,
                in_flight: 0,
                queued: 0,
                busiest: None,
            })
        });
        zone
    }

    /// Set a concurrency zone's key.
    pub fn set_in_flight(&self, key: &[u8], state: ConcurrencyKeyState) {
        self.with(|zone| zone.in_flight.insert(key.to_vec(), state));
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
        let hash = hash(key);
        self.with(|state| {
            state.top.record(kind, now_ns, hash, key);
            state.top_now_ns = now_ns;
        });
    }

    /// Make `GET zones/NAME/history` answer `history`.
    pub fn set_history(&self, history: History) {
        self.with(|state| state.history = Some(history));
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

    fn key_form(&self) -> KeyForm {
        self.key_form
    }

    fn info(&self) -> ZoneInfo {
        self.with(|state| {
            let mut info = state.info.clone();
            info.keys = state.keys.len() as u64;
            info.overrides = state.overrides.len() as u64;
            if let Some(concurrency) = &mut info.concurrency {
                info.keys = state.in_flight.len() as u64;
                concurrency.in_flight = state
                    .in_flight
                    .values()
                    .map(|k| u64::from(k.in_flight))
                    .sum();
                concurrency.queued = state.in_flight.values().map(|k| u64::from(k.queued)).sum();
                concurrency.busiest = state
                    .in_flight
                    .values()
                    .max_by_key(|k| k.in_flight)
                    .copied();
            }
            info
        })
    }

    fn concurrency_limits(&self) -> Option<ConcurrencyLimits> {
        self.with(|state| state.info.concurrency.as_ref().map(|c| c.limits))
    }

    fn concurrency_key(&self, key: &[u8]) -> Option<ConcurrencyKeyState> {
        self.with(|state| {
            let limits = state.info.concurrency.as_ref()?.limits;
            let mut found = *state.in_flight.get(key)?;
            if let ConcurrencyLimit::Fixed(limit) = limits.limit {
                found.limit = limit;
            }
            Some(found)
        })
    }

    fn replace_concurrency_limits(
        &self,
        current: ConcurrencyLimits,
        new: ConcurrencyLimits,
    ) -> Result<(), ConcurrencyLimits> {
        self.with(|state| {
            let Some(concurrency) = &mut state.info.concurrency else {
                return Err(current);
            };
            if concurrency.limits != current {
                return Err(concurrency.limits);
            }
            concurrency.limits = new;
            Ok(())
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
                period: None,
                override_limits,
                decision,
                debt: 0,
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

    fn history(&self) -> Option<History> {
        self.with(|state| state.history.clone())
    }

    fn top(&self, kind: TopKind, window: TopWindow, limit: usize) -> Option<TopList> {
        self.with(|state| {
            Some(TopList {
                keys: state.top.top(kind, window, state.top_now_ns, limit),
                total: state.top.total(kind, window, state.top_now_ns),
            })
        })
    }

    fn block_counts(&self) -> Option<BlockCounts> {
        let blocks = self.blocks.as_ref()?;
        let table = blocks.table();
        Some(BlockCounts {
            block_ns: blocks.policy.block_ns,
            block_max_ns: blocks.policy.block_max_ns,
            blocked_requests: blocks.blocked_requests.load(Ordering::Relaxed),
            blocked_dry_run_requests: 0,
            not_recorded: 0,
            blocked_keys: table.blocked_count(blocks.now()) as u64,
            capacity: table.capacity() as u64,
        })
    }

    fn blocked(&self) -> Vec<BlockInfo> {
        let Some(blocks) = &self.blocks else {
            return Vec::new();
        };
        let listed = blocks.table().blocked(blocks.now());
        listed.into_iter().map(|key| blocks.info(key)).collect()
    }

    fn block_of(&self, key: &[u8]) -> Option<BlockInfo> {
        let blocks = self.blocks.as_ref()?;
        let listed = blocks.table().blocked_key(hash(key), blocks.now())?;
        Some(blocks.info(listed))
    }

    fn block_key(&self, key: &[u8], duration_ns: u64) -> Result<BlockInfo, BlockRefused> {
        let blocks = self.blocks.as_ref().ok_or(BlockRefused::NoBlocks)?;
        let table = blocks.table();
        let now = blocks.now();
        let change = BlockChange::ByHand(duration_ns);
        table
            .block(hash(key), key, now, change, &blocks.policy, || {
                blocks.lock.lock()
            })
            .ok_or(BlockRefused::Full)?;
        let listed = table
            .blocked_key(hash(key), now)
            .ok_or(BlockRefused::Full)?;
        Ok(blocks.info(listed))
    }

    fn release_key(&self, key: &[u8]) -> bool {
        self.blocks
            .as_ref()
            .is_some_and(|blocks| blocks.table().release(hash(key), blocks.now()))
    }
}
