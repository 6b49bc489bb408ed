//! The slot table: where each key's state lives, how a key finds or claims its slot, and the
//! updates of a state (decide, charge, give back, forget, rescale).
//!
//! Finding, claiming and evicting are `ratelimit_slots`'s (model-checked with loom); every
//! access to a key's words here goes through its [`Pin`]: a charge pins the key's slot (and
//! finds or claims it again if the key lost it), a give-back pins the slot it charged and
//! gives nothing back when the key lost it (its state went with it).

use core::sync::atomic::{AtomicU64, Ordering};

use ratelimit_core::{
    leaky_bucket, token_bucket, Algorithm, BucketCharge, Decision, Limits, Outcome, Policy,
};
use ratelimit_slots::{decide_at, update, Claim, Decided, Table};

use super::Zone;

pub use ratelimit_slots::{PROBE_BUCKETS, SLOTS_PER_BUCKET};
/// State words of a `sync` zone's slot: the state, the pending delta, the grant (see
/// `ratelimit_core::fleet`).
pub const SYNC_STATE_WORDS: usize = 3;

/// Where a key's state is: its slot and the key's id (its hash), so that a reference kept
/// across time (a give-back, a queued request, the sync loop) never reaches another key.
pub type SlotIndex = ratelimit_slots::SlotRef;

/// The index of [`Zone::no_slot_for`]'s references (the table clamps it to its last slot,
/// which a pin accepts only if the key is really there).
const NO_SLOT: usize = usize::MAX;

/// A pinned slot of the zone: the key keeps it while this lives (a few instructions).
pub type Pin<'a> = ratelimit_slots::Pin<'a, AtomicU64>;

/// A sync zone's per-key words besides the state, as data: what the key charged since the
/// last sync (`pending`) and what the fleet lets it charge (`grant`).
pub struct SyncWords<'a> {
    pub pending: &'a AtomicU64,
    pub grant: &'a AtomicU64,
}

/// A sync zone's key pinned for the sync loop: its state, pending and grant words.
pub struct SyncPin<'a> {
    pin: Pin<'a>,
}

impl<'a> SyncPin<'a> {
    /// The key's words: state, pending delta, grant.
    pub fn words(&self) -> [&'a AtomicU64; 3] {
        let state = self.pin.state();
        [&state[0], &state[1], &state[2]]
    }
}

/// Where [`Zone::find_or_claim`] put a key.
#[derive(Clone, Copy, Debug)]
pub enum Placed {
    /// In this slot; `evicted` when another key's state that still mattered was dropped.
    Slot { slot: SlotIndex, evicted: bool },
    /// Nowhere: every slot of its window is busy (requests in flight or queued).
    Busy,
}

impl Zone {
    /// Slots in the table, overflow buckets included.
    pub fn slot_count(&self) -> usize {
        self.slots
    }

    /// The table, as `ratelimit_slots` sees it.
    #[inline(always)]
    pub(super) fn table(&self) -> Table<'_, AtomicU64> {
        self.slot_table
    }

    /// The slot holding `hash`, if the key has one. Lock-free.
    pub fn find(&self, hash: u64) -> Option<SlotIndex> {
        self.table().find(hash)
    }

    /// The slot holding `hash` if its state differs from a fresh key's at `now_ns`.
    pub fn find_tracked(&self, hash: u64, now_ns: u64) -> Option<SlotIndex> {
        let slot = self.find(hash)?;
        let limits = self.limits()?;
        let _lock = self.algorithm.needs_lock().then(|| self.lock());
        let pin = self.table().pin(slot)?;
        (self.idle_at_ns(pin.state(), &limits, now_ns) > now_ns).then_some(slot)
    }

    /// The slot for `hash`, claiming one for a new key, and whether the zone has something to
    /// log: another key evicted for it, or its window busy (then the slot is
    /// [`Zone::no_slot_for`] the key).
    ///
    /// The common cases take no lock: a tracked key is found, and a new key takes the first
    /// empty slot of its window with a compare-and-swap. Only a full window takes the zone
    /// lock to evict, and never a key with requests in flight or queued.
    #[inline(always)]
    pub fn find_or_claim(&self, hash: u64, now_ns: u64) -> (SlotIndex, bool) {
        // A key seen before is most often in the first slot of its window.
        let index = self.table().window_start(hash);
        // SAFETY: a window's first slot is inside the table (its home bucket is below the
        // table's home buckets); slots are `stride` words from `table`.
        let id_word = unsafe { &*self.table.add(index * self.stride) };
        if id_word.load(Ordering::Acquire) >> ratelimit_slots::PIN_BITS == hash {
            return (SlotIndex { index, id: hash }, false);
        }
        match self.find_or_claim_slow(hash, now_ns) {
            Placed::Slot { slot, evicted } => (slot, evicted),
            Placed::Busy => (self.no_slot_for(hash), true),
        }
    }

    #[inline(never)]
    fn find_or_claim_slow(&self, hash: u64, now_ns: u64) -> Placed {
        if let Some(slot) = self.table().find_or_claim_empty(hash) {
            return Placed::Slot {
                slot,
                evicted: false,
            };
        }
        let _lock = self.lock();
        self.claim_locked(hash, now_ns)
    }

    /// As `find_or_claim`, with the zone lock held: the table rescans, takes an empty slot,
    /// else evicts the idle key nearest to its fresh state.
    fn claim_locked(&self, hash: u64, now_ns: u64) -> Placed {
        let limits = self.limits();
        let claim = self.table().claim_locked(
            hash,
            |state| limits.map_or(0, |limits| self.idle_at_ns(state, &limits, now_ns)),
            |victim, state| self.orphan(victim.id, state),
        );
        match claim {
            Claim::Found(slot) | Claim::Claimed(slot) => Placed::Slot {
                slot,
                evicted: false,
            },
            Claim::Evicted { slot, idle_at } => {
                let evicted = idle_at > now_ns;
                if evicted {
                    self.header().evictions.fetch_add(1, Ordering::Relaxed);
                }
                Placed::Slot { slot, evicted }
            }
            Claim::Busy => {
                self.header().no_slot.fetch_add(1, Ordering::Relaxed);
                Placed::Busy
            }
        }
    }

    /// Whether `slot` is a [`Zone::no_slot_for`] reference.
    pub fn names_no_slot(slot: SlotIndex) -> bool {
        slot.index == NO_SLOT
    }

    /// The reference a key gets when its window is busy: no slot is its own (a pin of it
    /// fails, and a charge looks for a slot again).
    pub fn no_slot_for(&self, hash: u64) -> SlotIndex {
        SlotIndex {
            index: NO_SLOT,
            id: hash,
        }
    }

    /// Pin the key's slot to charge it: its own, or (when the key lost it since it was found)
    /// the one it finds or claims now. `None` only when the key's window is busy.
    #[inline(always)]
    pub fn pin_to_charge(&self, slot: SlotIndex, now_ns: u64) -> Option<Pin<'_>> {
        if slot.index < self.slots {
            let start = slot.index * self.stride;
            // SAFETY: the slot is inside the table (checked), `stride` (at least 2) words from
            // `table`, in the zone's mapping that outlives this view.
            let words = unsafe {
                (
                    &*self.table.add(start),
                    &*self.table.add(start + 1),
                    core::slice::from_raw_parts(self.table.add(start + 1), self.stride - 1),
                )
            };
            if let Some(pin) = Table::pin_words(words, slot) {
                return Some(pin);
            }
        }
        if slot.index == NO_SLOT {
            // The window was busy when the key was found: counted and logged then.
            return None;
        }
        self.pin_again(slot.id, now_ns)
    }

    #[cold]
    #[inline(never)]
    fn pin_again(&self, hash: u64, now_ns: u64) -> Option<Pin<'_>> {
        let limits = self.limits();
        let acquired = self.table().claim_and_pin(
            hash,
            || self.lock(),
            |state| limits.map_or(0, |limits| self.idle_at_ns(state, &limits, now_ns)),
            |victim, state| self.orphan(victim.id, state),
        );
        match acquired {
            Some((pin, evicted)) => {
                if evicted.is_some_and(|idle_at| idle_at > now_ns) {
                    self.header().evictions.fetch_add(1, Ordering::Relaxed);
                }
                Some(pin)
            }
            None => {
                self.header().no_slot.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Pin the slot a key was charged in (to give back, or to release what it holds): `None`
    /// when the key lost it (its state went with it).
    #[inline]
    pub fn pin_own(&self, slot: SlotIndex) -> Option<Pin<'_>> {
        self.table().pin_or_wait(slot, || self.lock())
    }

    /// Before a sync zone's slot is given to another key, or forgotten: hand its pending
    /// delta (requests admitted but not yet sent to the fleet) to the sync loop through the
    /// orphan ring of the instance's sync record, so that no charge the fleet needs is lost.
    /// The swap takes the delta from a loop that would take it meanwhile.
    fn orphan(&self, hash: u64, state: &[AtomicU64]) {
        if !self.sync || state.len() != SYNC_STATE_WORDS {
            return;
        }
        let pending = state[1].swap(0, Ordering::AcqRel);
        if pending & !ratelimit_core::fleet::ASKED == 0 {
            return;
        }
        if let Some(sync) = super::sync_record::shared() {
            if !sync.orphans.push(self.seed[0], hash, pending) {
                sync.orphans_dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// When a key's state (its words after the id) becomes equivalent to a fresh key's (0
    /// for an empty slot); `ratelimit_slots::BUSY` (never) while requests hold or wait for
    /// a concurrency key's slots. An algorithm that needs the lock is read under it, which
    /// callers hold.
    fn idle_at_ns(&self, state: &[AtomicU64], limits: &Limits, now_ns: u64) -> u64 {
        let algorithm = self.algorithm;
        if algorithm.counts_in_flight() {
            return self.concurrency_idle_at(state);
        }
        let at = if algorithm.needs_lock() {
            ratelimit_core::words_idle_at_ns(state_words_mut(state), limits, algorithm)
        } else {
            ratelimit_core::word_idle_at_ns_near(
                state[0].load(Ordering::Relaxed),
                limits,
                algorithm,
                now_ns,
            )
        };
        // A rate key is always evictable.
        at.min(ratelimit_slots::BUSY - 1)
    }

    /// Decide a request for the key in `index` from its local state. With `commit`, a
    /// passing decision is stored (compare-and-swap for single-word states, under the lock
    /// for the others); without it nothing changes. A rejected request never changes the
    /// state. A sync zone's fleet grant is not taken here: the caller composes it.
    pub fn decide(&self, index: SlotIndex, now_ns: u64, policy: &Policy, commit: bool) -> Decision {
        let pin = if commit {
            self.pin_to_charge(index, now_ns)
        } else {
            self.table().pin(index)
        };
        match pin {
            Some(pin) => self.decide_pinned(&pin, now_ns, policy, commit),
            // A key without a slot (lost since it was found, or a busy window) stands as
            // a fresh key, and nothing is stored for it.
            None => self.decide_fresh(now_ns, policy),
        }
    }

    /// [`Zone::decide`] on a slot pinned by the caller.
    pub fn decide_pinned(
        &self,
        pin: &Pin<'_>,
        now_ns: u64,
        policy: &Policy,
        commit: bool,
    ) -> Decision {
        if policy.algorithm.needs_lock() {
            let _lock = self.lock();
            let words = state_words_mut(pin.state());
            let decision = ratelimit_core::decide_words(words, now_ns, policy, commit);
            if decision.outcome != Outcome::Rejected {
                return decision;
            }
            // Refused, nothing stored: decided again at a clock read under the lock, after
            // every charge the lock ordered before this one (see `decide_at`).
            let now_ns = now_ns.max(crate::glue::now_ns());
            return ratelimit_core::decide_words(words, now_ns, policy, commit);
        }
        let state = pin.first_state();
        // One loop per algorithm, so each compiles to that algorithm's arithmetic alone.
        match policy.algorithm {
            Algorithm::LeakyBucket => decide_and_store(state, now_ns, commit, |s, now| {
                leaky_bucket::decide(s, now, policy)
            }),
            Algorithm::TokenBucket => decide_and_store(state, now_ns, commit, |s, now| {
                token_bucket::decide(s, now, policy)
            }),
            _ => decide_and_store(state, now_ns, commit, |s, now| {
                ratelimit_core::decide_word(s, now, policy)
            }),
        }
    }

    /// A sync zone's rejection for want of a fleet grant (or in `closed` mode): where the key
    /// stands, retried after `retry_ns` (the next sync, or a second when closed).
    pub fn refuse_pinned(
        &self,
        pin: &Pin<'_>,
        now_ns: u64,
        policy: &Policy,
        retry_ns: u64,
    ) -> Decision {
        // What the zone alone would say, charging nothing (a peek never takes a grant).
        let alone = self.decide_pinned(pin, now_ns, policy, false);
        Decision {
            remaining: 0,
            ..Decision::rejected(
                retry_ns.max(alone.retry_after_ns),
                alone.reset_ns,
                alone.excess_milli,
            )
        }
    }

    #[cold]
    fn decide_fresh(&self, now_ns: u64, policy: &Policy) -> Decision {
        if policy.algorithm.needs_lock() {
            let mut words = vec![0u64; self.stride - 1];
            return ratelimit_core::decide_words(&mut words, now_ns, policy, false);
        }
        ratelimit_core::decide_word(0, now_ns, policy).0
    }

    /// Give back `policy.cost` requests charged to the key in `index` from its local state
    /// (lua-resty-limit-traffic's `uncommit`). Nothing when the key lost its slot since.
    pub fn uncommit(&self, index: SlotIndex, now_ns: u64, policy: &Policy) {
        if let Some(pin) = self.pin_own(index) {
            self.uncommit_pinned(&pin, now_ns, policy);
        }
    }

    /// [`Zone::uncommit`] on a slot pinned by the caller.
    pub fn uncommit_pinned(&self, pin: &Pin<'_>, now_ns: u64, policy: &Policy) {
        if policy.algorithm.needs_lock() {
            let _lock = self.lock();
            let words = state_words_mut(pin.state());
            ratelimit_core::uncommit::uncommit_words(words, policy);
            return;
        }
        update(&pin.state()[0], |state| {
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
        if ratelimit_core::usage::settle::Bucket::of(policy).is_none()
            && !policy.algorithm.is_quota()
        {
            return 0;
        }
        // A key that lost its slot since its reservation lost its state with it: there is no
        // bucket left to charge, the whole amount is forgiven (as a give-back gives nothing).
        let Some(pin) = self.pin_own(index) else {
            return tokens;
        };
        self.charge_into_debt_pinned(&pin, now_ns, policy, tokens, debt)
    }

    /// [`Zone::charge_into_debt`] on a slot pinned by the caller.
    pub fn charge_into_debt_pinned(
        &self,
        pin: &Pin<'_>,
        now_ns: u64,
        policy: &Policy,
        tokens: u64,
        debt: u64,
    ) -> u64 {
        if policy.algorithm.is_quota() {
            return update(&pin.state()[0], |state| {
                let (next, forgiven) =
                    ratelimit_core::quota::charge_into_debt(state, policy, tokens, debt);
                (forgiven, (next != state).then_some(next))
            });
        }
        let Some(bucket) = ratelimit_core::usage::settle::Bucket::of(policy) else {
            return 0;
        };
        update(&pin.state()[0], |state| {
            let (next, forgiven) = ratelimit_core::usage::settle::charge_into_debt(
                state, now_ns, &bucket, tokens, debt,
            );
            (forgiven, (next != state).then_some(next))
        })
    }

    /// Charge a request to a single-word state and return only its outcome, with the state
    /// and the time it was decided at. The decision's other fields (divisions) are not
    /// computed: a caller that needs them gets the identical decision from
    /// `ratelimit_core::decide_word(charged.state, charged.now_ns, policy)`.
    #[inline]
    pub fn charge(&self, index: SlotIndex, now_ns: u64, policy: &Policy) -> Decided<Outcome> {
        let Some(pin) = self.pin_to_charge(index, now_ns) else {
            // A key whose window is busy is charged nowhere (decided as a fresh key).
            return charge_fresh(now_ns, |s, now| {
                outcome_of(ratelimit_core::decide_word(s, now, policy))
            });
        };
        let state = pin.first_state();
        match policy.algorithm {
            Algorithm::LeakyBucket => charge_word(state, now_ns, |s, now| {
                outcome_of(leaky_bucket::decide(s, now, policy))
            }),
            Algorithm::TokenBucket => charge_word(state, now_ns, |s, now| {
                outcome_of(token_bucket::decide(s, now, policy))
            }),
            _ => charge_word(state, now_ns, |s, now| {
                outcome_of(ratelimit_core::decide_word(s, now, policy))
            }),
        }
    }

    /// Charge a request to a bucket with precomputed constants; `fallback` decides the rare
    /// state the constants cannot (an overflow), at a time. Returns the outcome with the state
    /// and the time it was decided at, as [`Zone::charge`].
    #[inline(always)]
    pub fn charge_bucket(
        &self,
        index: SlotIndex,
        now_ns: u64,
        charge: &BucketCharge,
        fallback: impl Fn(u64, u64) -> (Decision, Option<u64>),
    ) -> Decided<Outcome> {
        let decide = |state, now| {
            charge
                .charge(state, now)
                .unwrap_or_else(|| outcome_of(fallback(state, now)))
        };
        let Some(pin) = self.pin_to_charge(index, now_ns) else {
            // A key whose window is busy is charged nowhere (decided as a fresh key).
            return charge_fresh(now_ns, decide);
        };
        charge_word(pin.first_state(), now_ns, decide)
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
    /// when its window needs room. A sync zone's pending delta goes to the orphan ring first:
    /// the fleet still gets the requests admitted.
    pub fn forget(&self, hash: u64, now_ns: u64) -> bool {
        let _lock = self.lock();
        let Some(pin) = self.find(hash).and_then(|slot| self.table().pin(slot)) else {
            return false;
        };
        let state = pin.state();
        if self.algorithm.counts_in_flight() {
            // Its slot counts stay while requests hold them; its queue is emptied.
            return self.concurrency_idle_at(state) > now_ns
                && self.forget_concurrency(state, now_ns);
        }
        let tracked = self
            .limits()
            .is_some_and(|limits| self.idle_at_ns(state, &limits, now_ns) > now_ns);
        self.orphan(hash, state);
        for word in state {
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
        let table = self.table();
        table
            .occupied()
            .filter_map(|slot| table.pin(slot))
            .filter(|pin| self.idle_at_ns(pin.state(), &limits, now_ns) > now_ns)
            .count() as u64
    }

    /// Nanoseconds from `now_ns` until the key in `index` is back to a fresh key's state under
    /// `limits` (0 when it already is): `GET zones/NAME/keys/KEY` shows it as `reset_ms`.
    pub fn time_to_fresh_ns(&self, index: SlotIndex, limits: &Limits, now_ns: u64) -> u64 {
        let _lock = self.algorithm.needs_lock().then(|| self.lock());
        let Some(pin) = self.table().pin(index) else {
            return 0;
        };
        self.idle_at_ns(pin.state(), limits, now_ns)
            .saturating_sub(now_ns)
    }

    /// Tokens the key in `index` owes past its bucket's capacity under `policy` (what
    /// usage-based lines charged into debt, rounded up); 0 when it owes none or `policy` is
    /// not a bucket. `GET zones/NAME/keys/KEY` shows it as `debt`.
    pub fn debt_tokens(&self, index: SlotIndex, policy: &Policy, now_ns: u64) -> u64 {
        let Some(bucket) = ratelimit_core::usage::settle::Bucket::of(policy) else {
            return 0;
        };
        let Some(pin) = self.table().pin(index) else {
            return 0;
        };
        let state = pin.first_state().load(Ordering::Acquire);
        ratelimit_core::usage::settle::debt_tokens(state, now_ns, &bucket)
    }

    /// After the zone's rate changed from `old` to `new`: re-express each bucket's backlog at
    /// the new rate, as limit_req's excess (kept in requests) would drain at a reloaded rate.
    /// Keys with their own override keep theirs. A full scan; lock-free (each key pinned).
    pub fn rescale_backlogs(&self, old: &Limits, new: &Limits, now_ns: u64) {
        let algorithm = self.algorithm;
        if old.rate == new.rate || !algorithm.keeps_time_at_rate() {
            return;
        }
        let table = self.table();
        for slot in table.occupied() {
            if self.override_for(slot.id).is_some() {
                continue;
            }
            if let Some(pin) = table.pin(slot) {
                self.rescale_pinned(&pin, old, new, now_ns);
            }
        }
    }

    /// Re-express one key's backlog after its own limits changed (an override set or removed).
    pub fn rescale_key(&self, hash: u64, old: &Limits, new: &Limits, now_ns: u64) {
        if let Some(pin) = self.find(hash).and_then(|slot| self.pin_own(slot)) {
            self.rescale_pinned(&pin, old, new, now_ns);
        }
    }

    fn rescale_pinned(&self, pin: &Pin<'_>, old: &Limits, new: &Limits, now_ns: u64) {
        let algorithm = self.algorithm;
        if old.rate == new.rate || algorithm.needs_lock() {
            return;
        }
        update(&pin.state()[0], |state| {
            let next = ratelimit_core::rescale_word(state, now_ns, algorithm, &old.rate, &new.rate);
            ((), Some(next))
        });
    }

    /// A sync zone's words of a pinned key (`None` if the slots have no room for them, which
    /// a sync zone's layout never allows).
    pub fn sync_words<'a>(&self, pin: &Pin<'a>) -> Option<SyncWords<'a>> {
        let state = pin.state();
        Some(SyncWords {
            pending: state.get(1)?,
            grant: state.get(2)?,
        })
    }

    /// Whether the sync loop may read this zone's slots as a sync zone's.
    fn is_sync_layout(&self) -> bool {
        self.sync
            && self.header().sync.load(Ordering::Relaxed) != 0
            && self.stride == 1 + SYNC_STATE_WORDS
    }

    /// A sync zone's slot `index` for the loop's scan: its key (0: empty) and pending delta,
    /// read without a pin (the loop pins the keys it then takes, [`Zone::sync_pin`]). `None`
    /// for a zone that is not (or no longer) a sync zone.
    pub fn sync_slot(&self, index: usize) -> Option<(u64, u64)> {
        if !self.is_sync_layout() {
            return None;
        }
        let table = self.table();
        let slot = table.slot(index);
        Some((table.id_at(index), slot[2].load(Ordering::Relaxed)))
    }

    /// The sync loop's key in slot `index`, pinned: `None` when the slot is no longer the
    /// key's (its pending delta then went to the orphan ring) or the zone not a sync zone.
    pub fn sync_pin(&self, index: usize, hash: u64) -> Option<SyncPin<'_>> {
        if !self.is_sync_layout() || index >= self.slots {
            return None;
        }
        let pin = self.table().pin(SlotIndex { index, id: hash })?;
        Some(SyncPin { pin })
    }
}

/// A decision on a single-word state at `now_ns` (or, when it does not pass, at a clock
/// read after the state: `ratelimit_slots::decide_at`), stored with `commit`.
#[inline(always)]
fn decide_and_store(
    state: &AtomicU64,
    now_ns: u64,
    commit: bool,
    decide: impl Fn(u64, u64) -> (Decision, Option<u64>),
) -> Decision {
    let passes = |decision: &Decision| decision.outcome == Outcome::Passed;
    decide_at(
        state,
        now_ns,
        crate::glue::now_ns,
        passes,
        |current, now| {
            let (decision, next) = decide(current, now);
            (decision, next.filter(|_| commit))
        },
    )
    .answer
}

/// A charge that needs only the outcome and the new state; answers the outcome with the
/// state and the time it was decided at, so that fields of a full decision nobody reads are
/// never computed.
#[inline(always)]
fn charge_word(
    state: &AtomicU64,
    now_ns: u64,
    decide: impl Fn(u64, u64) -> (Outcome, Option<u64>),
) -> Decided<Outcome> {
    let passes = |outcome: &Outcome| *outcome == Outcome::Passed;
    decide_at(state, now_ns, crate::glue::now_ns, passes, decide)
}

/// A charge of a key that has no slot: decided on a fresh state, stored nowhere.
#[cold]
#[inline(never)]
fn charge_fresh(
    now_ns: u64,
    decide: impl Fn(u64, u64) -> (Outcome, Option<u64>),
) -> Decided<Outcome> {
    Decided {
        answer: decide(0, now_ns).0,
        state: 0,
        now_ns,
    }
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
