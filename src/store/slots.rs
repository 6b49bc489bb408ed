//! The slot table: where each key's state lives, how a key finds or claims its slot, and the
//! updates of a state (decide, charge, give back, forget, rescale).

use core::sync::atomic::{AtomicU64, Ordering};

use ratelimit_core::{
    leaky_bucket, token_bucket, Algorithm, BucketCharge, Decision, Limits, Outcome, Policy,
};

use super::Zone;

pub const SLOTS_PER_BUCKET: usize = 4;
pub const PROBE_BUCKETS: usize = 2;
/// State words of a `sync` zone's slot: the state, the pending delta, the grant (see
/// `ratelimit_core::fleet`).
pub const SYNC_STATE_WORDS: usize = 3;

/// Where a key's state is: the index of its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotIndex(pub(super) usize);

/// A sync zone's per-key words besides the state, as data: what the key charged since the
/// last sync (`pending`) and what the fleet lets it charge (`grant`).
pub struct SyncWords<'a> {
    pub pending: &'a AtomicU64,
    pub grant: &'a AtomicU64,
}

impl Zone {
    /// Slots in the table, overflow buckets included.
    pub fn slot_count(&self) -> usize {
        self.slots
    }

    /// The words of slot `index`: `[0]` is the key hash, the rest its state.
    pub(super) fn slot(&self, index: usize) -> &[AtomicU64] {
        let index = index.min(self.slots.saturating_sub(1));
        // SAFETY: `index` is clamped to the table, whose slots are `stride` u64 each, 8-byte
        // aligned inside the zone's mapping; AtomicU64 accepts any bit pattern.
        unsafe { core::slice::from_raw_parts(self.table.add(index * self.stride), self.stride) }
    }

    /// The hash word of slot `index` (< `slots`).
    #[inline]
    fn hash_word(&self, index: usize) -> &AtomicU64 {
        debug_assert!(index < self.slots);
        // SAFETY: callers pass indexes of a probe window, which lies inside the table (the
        // home bucket is below `home_buckets` and the table has PROBE_BUCKETS - 1 more).
        unsafe { &*self.table.add(index * self.stride) }
    }

    /// The first state word of the slot `index` (a `SlotIndex` is always inside the table).
    #[inline]
    fn state_word(&self, index: SlotIndex) -> &AtomicU64 {
        debug_assert!(index.0 < self.slots);
        // SAFETY: slot indexes are only made by `find`/`claim` from probe windows, which lie
        // inside the table; every slot has at least one state word after its hash.
        unsafe { &*self.table.add(index.0 * self.stride + 1) }
    }

    /// The first slot of the key's probe window; the window is the next
    /// `PROBE_BUCKETS * SLOTS_PER_BUCKET` slots.
    #[inline]
    fn window_start(&self, hash: u64) -> usize {
        // Multiply-shift maps the hash onto the home buckets without a division.
        let home = ((u128::from(hash) * u128::from(self.home_buckets)) >> 64) as usize;
        home * SLOTS_PER_BUCKET
    }

    fn probe_window(&self, hash: u64) -> core::ops::Range<usize> {
        let first = self.window_start(hash);
        first..first + PROBE_BUCKETS * SLOTS_PER_BUCKET
    }

    /// The slot holding `hash`, if the key has one. Lock-free.
    ///
    /// Slots never become empty again (a forgotten key keeps its slot with a fresh state, an
    /// evicted one hands it over), and a new key takes the first empty slot of its window, so
    /// a key is never behind an empty slot of its window: the scan stops at the first one.
    pub fn find(&self, hash: u64) -> Option<SlotIndex> {
        for index in self.probe_window(hash) {
            match self.hash_word(index).load(Ordering::Acquire) {
                h if h == hash => return Some(SlotIndex(index)),
                0 => return None,
                _ => {}
            }
        }
        None
    }

    /// The slot holding `hash` if its state differs from a fresh key's at `now_ns`.
    pub fn find_tracked(&self, hash: u64, now_ns: u64) -> Option<SlotIndex> {
        let index = self.find(hash)?;
        let limits = self.limits()?;
        let _lock = self.algorithm.needs_lock().then(|| self.lock());
        (self.idle_at_ns(self.slot(index.0), &limits, now_ns) > now_ns).then_some(index)
    }

    /// The slot for `hash`, claiming one for a new key. Returns the index and whether another
    /// key was evicted for it.
    ///
    /// The common cases take no lock: a tracked key is found, and a new key takes the first
    /// empty slot of its window with a compare-and-swap of the hash word (an empty slot's
    /// state is already a fresh key's). Only a full window takes the zone lock to evict.
    #[inline]
    pub fn find_or_claim(&self, hash: u64, now_ns: u64) -> (SlotIndex, bool) {
        // A key seen before is most often in the first slot of its window.
        let first = self.window_start(hash);
        if self.hash_word(first).load(Ordering::Acquire) == hash {
            return (SlotIndex(first), false);
        }
        self.find_or_claim_slow(hash, now_ns)
    }

    #[inline(never)]
    fn find_or_claim_slow(&self, hash: u64, now_ns: u64) -> (SlotIndex, bool) {
        let mut empty = None;
        for index in self.probe_window(hash) {
            match self.hash_word(index).load(Ordering::Acquire) {
                h if h == hash => return (SlotIndex(index), false),
                0 => {
                    // No key of this window lies beyond its first empty slot (see `find`).
                    empty = Some(index);
                    break;
                }
                _ => {}
            }
        }
        if let Some(index) = empty.filter(|&index| self.claim_empty(index, hash)) {
            return (SlotIndex(index), false);
        }
        let _lock = self.lock();
        self.claim_locked(hash, now_ns)
    }

    /// Take an empty slot for `hash`; false if another worker took it first.
    #[inline]
    fn claim_empty(&self, index: usize, hash: u64) -> bool {
        self.hash_word(index)
            .compare_exchange(0, hash, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// As `find_or_claim`, with the zone lock held: rescans (another worker may have claimed
    /// the key meanwhile), takes an empty slot, else evicts the slot nearest to its fresh
    /// state (an idle one first: evicting it changes no decision).
    fn claim_locked(&self, hash: u64, now_ns: u64) -> (SlotIndex, bool) {
        let limits = self.limits();
        loop {
            let mut empty = None;
            let mut victim = self.window_start(hash);
            let mut victim_idle_at = u64::MAX;
            for index in self.probe_window(hash) {
                match self.hash_word(index).load(Ordering::Acquire) {
                    h if h == hash => return (SlotIndex(index), false),
                    0 => {
                        empty = empty.or(Some(index));
                    }
                    _ => {
                        let idle_at = limits.map_or(0, |limits| {
                            self.idle_at_ns(self.slot(index), &limits, now_ns)
                        });
                        if idle_at < victim_idle_at {
                            victim = index;
                            victim_idle_at = idle_at;
                        }
                    }
                }
            }
            // Lock-free claimers only ever take empty slots, so an empty slot is still raced
            // for with compare-and-swap; an occupied one changes only under this lock.
            if let Some(index) = empty {
                if self.claim_empty(index, hash) {
                    return (SlotIndex(index), false);
                }
                continue;
            }
            let slot = self.slot(victim);
            self.orphan(slot);
            for word in &slot[1..] {
                word.store(0, Ordering::Relaxed);
            }
            slot[0].store(hash, Ordering::Release);
            let evicted = victim_idle_at > now_ns;
            if evicted {
                self.header().evictions.fetch_add(1, Ordering::Relaxed);
            }
            return (SlotIndex(victim), evicted);
        }
    }

    /// Before a sync zone's slot is given to another key: hand its pending delta (requests
    /// admitted but not yet sent to the fleet) to the sync loop through the orphan ring of
    /// the instance's sync record, so that eviction loses no charge the fleet needs. Under
    /// the zone's lock; the swap takes the delta from a loop that would take it meanwhile.
    fn orphan(&self, slot: &[AtomicU64]) {
        if !self.sync || slot.len() != 1 + SYNC_STATE_WORDS {
            return;
        }
        let pending = slot[2].swap(0, Ordering::AcqRel);
        if pending & !ratelimit_core::fleet::ASKED == 0 {
            return;
        }
        if let Some(sync) = super::sync_record::shared() {
            let hash = slot[0].load(Ordering::Relaxed);
            if !sync.orphans.push(self.seed[0], hash, pending) {
                sync.orphans_dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// When a slot's state becomes equivalent to a fresh key's (0 for an empty slot). An
    /// algorithm that needs the lock is read under it, which callers hold.
    fn idle_at_ns(&self, slot: &[AtomicU64], limits: &Limits, now_ns: u64) -> u64 {
        let algorithm = self.algorithm;
        if algorithm.counts_in_flight() {
            return self.concurrency_idle_at(slot);
        }
        if algorithm.needs_lock() {
            return ratelimit_core::words_idle_at_ns(
                state_words_mut(&slot[1..]),
                limits,
                algorithm,
            );
        }
        ratelimit_core::word_idle_at_ns_near(
            slot[1].load(Ordering::Relaxed),
            limits,
            algorithm,
            now_ns,
        )
    }

    /// Decide a request for the key in `index` from its local state. With `commit`, a
    /// passing decision is stored (compare-and-swap for single-word states, under the lock
    /// for the others); without it nothing changes. A rejected request never changes the
    /// state. A sync zone's fleet grant is not taken here: the caller composes it.
    pub fn decide(&self, index: SlotIndex, now_ns: u64, policy: &Policy, commit: bool) -> Decision {
        if policy.algorithm.needs_lock() {
            let _lock = self.lock();
            let words = state_words_mut(&self.slot(index.0)[1..]);
            return ratelimit_core::decide_words(words, now_ns, policy, commit);
        }
        let state = self.state_word(index);
        // One loop per algorithm, so each compiles to that algorithm's arithmetic alone.
        match policy.algorithm {
            Algorithm::LeakyBucket => {
                decide_and_store(state, commit, |s| leaky_bucket::decide(s, now_ns, policy))
            }
            Algorithm::TokenBucket => {
                decide_and_store(state, commit, |s| token_bucket::decide(s, now_ns, policy))
            }
            _ => decide_and_store(state, commit, |s| {
                ratelimit_core::decide_word(s, now_ns, policy)
            }),
        }
    }

    /// Give back `policy.cost` requests charged to the key in `index` from its local state
    /// (lua-resty-limit-traffic's `uncommit`).
    pub fn uncommit(&self, index: SlotIndex, now_ns: u64, policy: &Policy) {
        if policy.algorithm.needs_lock() {
            let _lock = self.lock();
            let words = state_words_mut(&self.slot(index.0)[1..]);
            ratelimit_core::uncommit::uncommit_words(words, policy);
            return;
        }
        update_word(self.state_word(index), |state| {
            let next = ratelimit_core::uncommit::uncommit_word(state, now_ns, policy);
            ((), (next != state).then_some(next))
        });
    }

    /// Charge `tokens` more to the bucket of the key in `index`, whether they fit or not, up
    /// to `debt` tokens past its capacity (a usage-based line's settlement): returns the
    /// tokens the bound forgave. Buckets only (configuration refuses `usage=` elsewhere).
    pub fn charge_into_debt(
        &self,
        index: SlotIndex,
        now_ns: u64,
        policy: &Policy,
        tokens: u64,
        debt: u64,
    ) -> u64 {
        let Some(bucket) = ratelimit_core::usage::settle::Bucket::of(policy) else {
            return 0;
        };
        update_word(self.state_word(index), |state| {
            let (next, forgiven) = ratelimit_core::usage::settle::charge_into_debt(
                state, now_ns, &bucket, tokens, debt,
            );
            (forgiven, (next != state).then_some(next))
        })
    }

    /// Charge a request to a single-word state and return only its outcome, with the state
    /// it was decided on. The decision's other fields (divisions) are not computed: a caller
    /// that needs them gets the identical decision from
    /// `ratelimit_core::decide_word(previous, now_ns, policy)`.
    #[inline]
    pub fn charge(&self, index: SlotIndex, now_ns: u64, policy: &Policy) -> (Outcome, u64) {
        let state = self.state_word(index);
        match policy.algorithm {
            Algorithm::LeakyBucket => charge_word(state, |s| {
                outcome_of(leaky_bucket::decide(s, now_ns, policy))
            }),
            Algorithm::TokenBucket => charge_word(state, |s| {
                outcome_of(token_bucket::decide(s, now_ns, policy))
            }),
            _ => charge_word(state, |s| {
                outcome_of(ratelimit_core::decide_word(s, now_ns, policy))
            }),
        }
    }

    /// Charge a request to a bucket with precomputed constants; `fallback` decides the rare
    /// state the constants cannot (an overflow). Returns the outcome and the state it was
    /// decided on, as [`Zone::charge`].
    #[inline]
    pub fn charge_bucket(
        &self,
        index: SlotIndex,
        now_ns: u64,
        charge: &BucketCharge,
        fallback: impl Fn(u64) -> (Decision, Option<u64>),
    ) -> (Outcome, u64) {
        charge_word(self.state_word(index), |state| {
            charge
                .charge(state, now_ns)
                .unwrap_or_else(|| outcome_of(fallback(state)))
        })
    }

    /// Where the key in `index` stands now, charging nothing: `remaining` and `reset_ns` of its
    /// unchanged state.
    pub fn standing(&self, index: SlotIndex, now_ns: u64, policy: &Policy) -> Decision {
        self.decide(
            index,
            now_ns,
            &ratelimit_core::standing_policy(policy),
            false,
        )
    }

    /// Forget a key's state. Returns whether it was tracked (not already fresh).
    ///
    /// The key keeps its slot with a fresh key's state (all zeros), which decides exactly like
    /// no state at all and keeps the table free of holes (see `find`); the slot goes first
    /// when its window needs room.
    pub fn forget(&self, hash: u64, now_ns: u64) -> bool {
        let _lock = self.lock();
        let Some(index) = self.find(hash) else {
            return false;
        };
        let slot = self.slot(index.0);
        if self.algorithm.counts_in_flight() {
            // Its slot counts stay while requests hold them; its queue is emptied.
            return self.concurrency_idle_at(slot) > now_ns
                && self.forget_concurrency(slot, now_ns);
        }
        let tracked = self
            .limits()
            .is_some_and(|limits| self.idle_at_ns(slot, &limits, now_ns) > now_ns);
        for word in &slot[1..] {
            word.store(0, Ordering::Relaxed);
        }
        tracked
    }

    /// Keys whose state differs from a fresh key's at `now_ns` (a full scan: admin use only).
    pub fn tracked_keys(&self, now_ns: u64) -> u64 {
        let Some(limits) = self.limits() else {
            return 0;
        };
        // Only the states of an algorithm that needs the lock are read under it; the others
        // are single atomics.
        let _lock = self.algorithm.needs_lock().then(|| self.lock());
        (0..self.slot_count())
            .map(|index| self.slot(index))
            .filter(|slot| slot[0].load(Ordering::Relaxed) != 0)
            .filter(|slot| self.idle_at_ns(slot, &limits, now_ns) > now_ns)
            .count() as u64
    }

    /// Nanoseconds from `now_ns` until the key in `index` is back to a fresh key's state under
    /// `limits` (0 when it already is): `GET zones/NAME/keys/KEY` shows it as `reset_ms`.
    pub fn time_to_fresh_ns(&self, index: SlotIndex, limits: &Limits, now_ns: u64) -> u64 {
        let slot = self.slot(index.0);
        let _lock = self.algorithm.needs_lock().then(|| self.lock());
        self.idle_at_ns(slot, limits, now_ns).saturating_sub(now_ns)
    }

    /// After the zone's rate changed from `old` to `new`: re-express each bucket's backlog at
    /// the new rate, as limit_req's excess (kept in requests) would drain at a reloaded rate.
    /// Keys with their own override keep theirs. A full scan; lock-free (compare-and-swap).
    pub fn rescale_backlogs(&self, old: &Limits, new: &Limits, now_ns: u64) {
        let algorithm = self.algorithm;
        if old.rate == new.rate || !algorithm.keeps_time_at_rate() {
            return;
        }
        for index in 0..self.slot_count() {
            let slot = self.slot(index);
            let hash = slot[0].load(Ordering::Acquire);
            if hash == 0 || self.override_for(hash).is_some() {
                continue;
            }
            self.rescale_slot(slot, old, new, now_ns);
        }
    }

    /// Re-express one key's backlog after its own limits changed (an override set or removed).
    pub fn rescale_key(&self, hash: u64, old: &Limits, new: &Limits, now_ns: u64) {
        if let Some(index) = self.find(hash) {
            self.rescale_slot(self.slot(index.0), old, new, now_ns);
        }
    }

    fn rescale_slot(&self, slot: &[AtomicU64], old: &Limits, new: &Limits, now_ns: u64) {
        let algorithm = self.algorithm;
        if old.rate == new.rate || algorithm.needs_lock() {
            return;
        }
        update_word(&slot[1], |state| {
            let next = ratelimit_core::rescale_word(state, now_ns, algorithm, &old.rate, &new.rate);
            ((), Some(next))
        });
    }

    /// A sync zone's words of the key in `index` (`None` if the slots have no room for them,
    /// which a sync zone's layout never allows).
    pub fn sync_words(&self, index: SlotIndex) -> Option<SyncWords<'_>> {
        let slot = self.slot(index.0);
        Some(SyncWords {
            pending: slot.get(2)?,
            grant: slot.get(3)?,
        })
    }

    /// A sync zone's slot `index` for the loop: its hash (0: empty), state, pending and
    /// grant words. `None` for a zone that is not (or no longer) a sync zone.
    pub fn sync_slot(&self, index: usize) -> Option<(u64, [&AtomicU64; 3])> {
        if !self.sync
            || self.header().sync.load(Ordering::Relaxed) == 0
            || self.stride != 1 + SYNC_STATE_WORDS
        {
            return None;
        }
        let slot = self.slot(index);
        Some((
            slot[0].load(Ordering::Acquire),
            [&slot[1], &slot[2], &slot[3]],
        ))
    }
}

/// Update a single-word state by compare-and-swap: `step` gives, for the state it is shown,
/// what to answer and the state to store (`None`: store nothing). Tried again on the state
/// another worker stored meanwhile; never locks, so a worker killed here leaves either the
/// old state or the new one. Inlined, so that each caller compiles to its own arithmetic.
#[inline(always)]
fn update_word<T>(state: &AtomicU64, mut step: impl FnMut(u64) -> (T, Option<u64>)) -> T {
    let mut current = state.load(Ordering::Acquire);
    loop {
        let (answer, next) = step(current);
        let Some(next) = next else {
            return answer;
        };
        match state.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return answer,
            Err(actual) => current = actual,
        }
    }
}

/// A decision on a single-word state, stored with `commit`.
#[inline(always)]
fn decide_and_store(
    state: &AtomicU64,
    commit: bool,
    decide: impl Fn(u64) -> (Decision, Option<u64>),
) -> Decision {
    update_word(state, |current| {
        let (decision, next) = decide(current);
        (decision, next.filter(|_| commit))
    })
}

/// A charge that needs only the outcome and the new state; answers the outcome and the state
/// it was decided on, so that fields of a full decision nobody reads are never computed.
#[inline(always)]
fn charge_word(
    state: &AtomicU64,
    decide: impl Fn(u64) -> (Outcome, Option<u64>),
) -> (Outcome, u64) {
    update_word(state, |current| {
        let (outcome, next) = decide(current);
        ((outcome, current), next)
    })
}

/// A decision reduced to what [`charge_word`] needs.
#[inline(always)]
fn outcome_of((decision, next): (Decision, Option<u64>)) -> (Outcome, Option<u64>) {
    (decision.outcome, next)
}

/// A multi-word state's words as plain integers.
///
/// Callers hold the zone lock: such states are read and written only under it, so no other
/// access to these words overlaps the returned borrow.
#[allow(clippy::mut_from_ref)]
fn state_words_mut(words: &[AtomicU64]) -> &mut [u64] {
    let Some(first) = words.first() else {
        return &mut [];
    };
    // SAFETY: AtomicU64 has the size and alignment of u64; exclusivity comes from the zone lock
    // (see above), and the words stay inside the zone's mapping.
    unsafe { core::slice::from_raw_parts_mut(AtomicU64::as_ptr(first), words.len()) }
}
