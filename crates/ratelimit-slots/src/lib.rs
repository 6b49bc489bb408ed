//! The slot table of a rate-limit zone, as a unit with no nginx in it: where a key's state
//! lives, how a key finds or claims its slot, how a full window evicts, and the one rule every
//! access to a slot's words follows (a [`Pin`]). Generic over its atomic words ([`Word`]) so
//! that `loom` can explore the interleavings of a few threads on a tiny table
//! (`tests/loom.rs`); the module passes `core`'s atomics in nginx's shared memory and takes
//! the zone's slab mutex around [`Table::claim_locked`].
//!
//! # The protocol
//! A slot is `[id word, state words...]`. The id word holds the key's id in its high
//! `64 - PIN_BITS` bits and a count of pins in its low `PIN_BITS` bits; 0 is an empty slot.
//!
//! * **Pin**: every read-modify-write of a slot's state words happens inside a pin: one
//!   `fetch_add(1, Acquire)` on the id word that returns the id the slot holds. If it is not
//!   the caller's key, the pin is dropped at once (`fetch_sub(1, Release)`) and the caller
//!   knows its key lost the slot. Otherwise the key keeps the slot until the pin drops.
//! * **Evict** (zone lock held): one `compare_exchange` of the id word from
//!   `victim id | 0 pins` to the tombstone. It fails while any pin is held, so a pinned key is
//!   never evicted; once it succeeded, every pin taken later reads the tombstone (or the new
//!   key's id) and backs off. Then the state is reset and the new id is set with
//!   `fetch_xor` (which keeps the pins of callers that are just backing off).
//!
//! All pins and evictions of one slot are read-modify-writes of one word, so they are totally
//! ordered (its modification order) without any `SeqCst`: a pin that read the old key's id
//! comes before the eviction's exchange, and so does the pin's release (the exchange needs
//! the count at 0). The exchange (Acquire) reads from the release sequence of every earlier
//! unpin (Release), so whatever a pinned caller wrote happens before the eviction's reset, and
//! the reset happens before every pin that reads the new id (the `fetch_xor` is Release, the
//! pin Acquire). A key's request therefore lands on its own state or on none.
//!
//! # A request's time
//! A decision is taken at a time read before the state was: [`decide_at`] decides again, at a
//! reading taken after the state was loaded, any answer that does not pass, so a request is
//! never refused by a state charged at times later than its own reading (issue 37;
//! docs/architecture.md, "A request's time"). `tests/stress.rs` runs the module's whole path
//! with many threads, `tests/loom.rs` and `tests/shuttle.rs` model it.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod word;

use core::sync::atomic::Ordering;

pub use word::{decide_at, update, Decided, Word};

/// Slots in a bucket.
pub const SLOTS_PER_BUCKET: usize = 4;
/// Buckets in a key's probe window.
pub const PROBE_BUCKETS: usize = 2;
/// Slots in a key's probe window.
pub const WINDOW_SLOTS: usize = PROBE_BUCKETS * SLOTS_PER_BUCKET;
/// Low bits of the id word that count pins: more than any number of processes and threads
/// that can hold one at once (each holds at most one per slot, for a few instructions).
pub const PIN_BITS: u32 = 12;
const PIN: u64 = 1;
/// The id a slot holds while it changes owner: even, so never a key's.
const TOMBSTONE: u64 = (u64::MAX >> PIN_BITS) & !1;

/// A key's id from a 64-bit hash: its high `64 - PIN_BITS` bits with the lowest set, so never
/// 0 (an empty slot) nor the tombstone.
#[inline(always)]
pub fn key_id(hash: u64) -> u64 {
    (hash >> PIN_BITS) | 1
}

/// Whether `id` can be a key's id ([`key_id`]'s shape: odd, within `64 - PIN_BITS` bits): what
/// a reader checks before an id from outside (a state file) reaches a table.
///
/// ```
/// use ratelimit_slots::{is_key_id, key_id};
///
/// assert!(is_key_id(key_id(u64::MAX)) && is_key_id(key_id(0)));
/// assert!(!is_key_id(0) && !is_key_id(2) && !is_key_id(u64::MAX));
/// ```
#[inline]
pub fn is_key_id(id: u64) -> bool {
    id & 1 == 1 && id <= u64::MAX >> PIN_BITS
}

/// Where a key's state is: its slot, and the id of the key that owned it when it was found.
/// Kept across time (a request's give-back, a queued request, the sync loop's entries), it
/// refers to the key, not to whichever key holds the slot later.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotRef {
    /// The slot's index in the table.
    pub index: usize,
    /// The key's id.
    pub id: u64,
}

/// What [`Table::claim_locked`] did for a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// The key already had a slot (another worker claimed it meanwhile).
    Found(SlotRef),
    /// The key took an empty slot.
    Claimed(SlotRef),
    /// The key took the slot of another key, whose state would have been fresh at `idle_at`
    /// (at or before `now`: nothing was lost).
    Evicted {
        /// The slot, now the key's.
        slot: SlotRef,
        /// When the evicted key's state would have been a fresh key's.
        idle_at: u64,
    },
    /// Every slot of the window is held by a key that must not be evicted (requests in
    /// flight or queued, or pinned at this instant): the key gets no slot.
    Busy,
}

/// An idle time that means "never evict": requests in flight or queued hold the slot.
pub const BUSY: u64 = u64::MAX;

/// A pinned slot: while it lives, the slot stays its key's. Dropping it releases the pin.
pub struct Pin<'a, W: Word> {
    id_word: &'a W,
    first: &'a W,
    state: &'a [W],
    slot: SlotRef,
}

impl<'a, W: Word> Pin<'a, W> {
    /// The slot's state words (after the id word).
    #[inline(always)]
    pub fn state(&self) -> &'a [W] {
        self.state
    }

    /// The slot's first state word (every slot has one).
    #[inline(always)]
    pub fn first_state(&self) -> &'a W {
        self.first
    }

    /// Which slot and key.
    #[inline(always)]
    pub fn slot(&self) -> SlotRef {
        self.slot
    }
}

impl<W: Word> Drop for Pin<'_, W> {
    #[inline(always)]
    fn drop(&mut self) {
        self.id_word.fetch_sub(PIN, Ordering::Release);
    }
}

/// A view of a slot table: `buckets × SLOTS_PER_BUCKET` slots of `stride` words each.
pub struct Table<'a, W> {
    words: &'a [W],
    stride: usize,
    slots: usize,
    /// Buckets a window may start at; the table has `PROBE_BUCKETS - 1` more so that no
    /// window wraps around.
    home_buckets: u64,
}

impl<W> Clone for Table<'_, W> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<W> Copy for Table<'_, W> {}

impl<'a, W: Word> Table<'a, W> {
    /// A table over `words`: whole slots of `stride` words (the id word and at least one state
    /// word) in whole buckets.
    #[inline]
    pub fn new(words: &'a [W], stride: usize) -> Table<'a, W> {
        let stride = stride.max(2);
        let buckets = words.len() / stride / SLOTS_PER_BUCKET;
        Table {
            words,
            stride,
            slots: buckets * SLOTS_PER_BUCKET,
            home_buckets: (buckets as u64)
                .saturating_sub(PROBE_BUCKETS as u64 - 1)
                .max(1),
        }
    }

    /// Slots in the table.
    #[inline]
    pub fn slot_count(&self) -> usize {
        self.slots
    }

    /// The words of slot `index` (the id word first), clamped to the table.
    #[inline(always)]
    pub fn slot(&self, index: usize) -> &'a [W] {
        let start = index.min(self.slots.saturating_sub(1)) * self.stride;
        &self.words[start..start + self.stride]
    }

    #[inline(always)]
    fn id_word(&self, index: usize) -> &'a W {
        &self.words[index * self.stride]
    }

    /// The id of the key in slot `index` now (0: empty; the tombstone while it changes
    /// owner).
    #[inline]
    pub fn id_at(&self, index: usize) -> u64 {
        self.id_word(index).load(Ordering::Acquire) >> PIN_BITS
    }

    /// The first slot of the key's window.
    #[inline(always)]
    pub fn window_start(&self, id: u64) -> usize {
        // Multiply-shift of the id's bits (the hash's high bits) onto the home buckets.
        let home = ((u128::from(id << PIN_BITS) * u128::from(self.home_buckets)) >> 64) as usize;
        home * SLOTS_PER_BUCKET
    }

    fn probe_window(&self, id: u64) -> core::ops::Range<usize> {
        let first = self.window_start(id);
        first..(first + WINDOW_SLOTS).min(self.slots)
    }

    /// The key's slot if it has one. Lock-free.
    ///
    /// Slots never become empty again (an evicted key hands its slot over, a tombstone is not
    /// empty), and a new key takes the first empty slot of its window, so the scan stops at
    /// the first empty one.
    pub fn find(&self, id: u64) -> Option<SlotRef> {
        for index in self.probe_window(id) {
            match self.id_at(index) {
                0 => return None,
                found if found == id => return Some(SlotRef { index, id }),
                _ => {}
            }
        }
        None
    }

    /// The key's slot when it is the first of its window (the common case of a key seen
    /// before): one load.
    #[inline(always)]
    pub fn find_first(&self, id: u64) -> Option<SlotRef> {
        let index = self.window_start(id);
        (self.id_at(index) == id).then_some(SlotRef { index, id })
    }

    /// The key's slot, or an empty one claimed for it, without the lock; `None` when the
    /// window is full or a slot before the key's changes owner this instant (then
    /// [`Table::claim_locked`] under the zone's lock, which waits for that change).
    pub fn find_or_claim_empty(&self, id: u64) -> Option<SlotRef> {
        for index in self.probe_window(id) {
            match self.id_at(index) {
                0 => {
                    return self.claim_empty(index, id).then_some(SlotRef { index, id });
                }
                found if found == id => return Some(SlotRef { index, id }),
                TOMBSTONE => return None,
                _ => {}
            }
        }
        None
    }

    /// The key's slot pinned, claimed for a new key: lock-free when the key is found or an
    /// empty slot is free, else under `lock` (the zone's) with [`Table::claim_locked`]. With
    /// the lock held no other claimer changes an occupied slot, so the pin taken there holds.
    /// Returns the pin and, after an eviction, when the evicted key would have been fresh;
    /// `None` when the whole window is busy.
    #[inline]
    pub fn acquire<G>(
        &self,
        id: u64,
        lock: impl FnOnce() -> G,
        idle_at: impl Fn(&'a [W]) -> u64,
        on_evict: impl FnMut(SlotRef, &'a [W]),
    ) -> Option<(Pin<'a, W>, Option<u64>)> {
        if let Some(pin) = self.find_first(id).and_then(|slot| self.pin(slot)) {
            return Some((pin, None));
        }
        self.claim_and_pin(id, lock, idle_at, on_evict)
    }

    /// [`Table::acquire`] past its first look (a key that lost the slot it was found in
    /// starts here).
    #[inline(never)]
    pub fn claim_and_pin<G>(
        &self,
        id: u64,
        lock: impl FnOnce() -> G,
        idle_at: impl Fn(&'a [W]) -> u64,
        on_evict: impl FnMut(SlotRef, &'a [W]),
    ) -> Option<(Pin<'a, W>, Option<u64>)> {
        if let Some(pin) = self.find_or_claim_empty(id).and_then(|slot| self.pin(slot)) {
            return Some((pin, None));
        }
        let _held = lock();
        let (slot, evicted) = match self.claim_locked(id, idle_at, on_evict) {
            Claim::Found(slot) | Claim::Claimed(slot) => (slot, None),
            Claim::Evicted { slot, idle_at } => (slot, Some(idle_at)),
            Claim::Busy => return None,
        };
        Some((self.pin(slot)?, evicted))
    }

    /// Pin a slot a key holds requests in (never evicted while it does): its pin fails only
    /// while a claimer looks at it under the lock, which `lock` waits out. `None`: the key
    /// lost the slot.
    pub fn pin_or_wait<G>(&self, slot: SlotRef, lock: impl FnOnce() -> G) -> Option<Pin<'a, W>> {
        match self.try_pin(slot) {
            Ok(pin) => Some(pin),
            Err(TOMBSTONE) => {
                let _held = lock();
                self.pin(slot)
            }
            Err(_) => None,
        }
    }

    /// Take an empty slot; false if another claimer took it first. An empty slot's state is
    /// all zeros already (a fresh key's).
    #[inline]
    fn claim_empty(&self, index: usize, id: u64) -> bool {
        self.id_word(index)
            .compare_exchange(0, id << PIN_BITS, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// A slot for the key, with the zone's lock held: rescans (another claimer may have taken
    /// the key's slot meanwhile), takes an empty slot, else evicts the key that is nearest to
    /// its fresh state by `idle_at` (of a slot's words; [`BUSY`]: never). `on_evict` sees the
    /// victim's words after no pin of it can exist any more and before they are reset (a sync
    /// zone hands the pending delta on there).
    ///
    /// Only this function changes an occupied slot's id, and only under the lock; lock-free
    /// claimers take empty slots only, by compare-and-swap.
    pub fn claim_locked(
        &self,
        id: u64,
        idle_at: impl Fn(&'a [W]) -> u64,
        mut on_evict: impl FnMut(SlotRef, &'a [W]),
    ) -> Claim {
        'scan: loop {
            let mut candidates = [(BUSY, 0usize, 0u64); WINDOW_SLOTS];
            let mut count = 0;
            for index in self.probe_window(id) {
                match self.id_at(index) {
                    0 => {
                        if self.claim_empty(index, id) {
                            return Claim::Claimed(SlotRef { index, id });
                        }
                        continue 'scan;
                    }
                    found if found == id => return Claim::Found(SlotRef { index, id }),
                    TOMBSTONE => {}
                    found => {
                        let at = idle_at(&self.slot(index)[1..]);
                        if at != BUSY {
                            candidates[count] = (at, index, found);
                            count += 1;
                        }
                    }
                }
            }
            let candidates = &mut candidates[..count];
            candidates.sort_unstable_by_key(|&(at, index, _)| (at, index));
            for &(_, index, victim) in candidates.iter() {
                let word = self.id_word(index);
                // Fails while the victim is pinned: it is in use this instant.
                if word
                    .compare_exchange(
                        victim << PIN_BITS,
                        TOMBSTONE << PIN_BITS,
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    )
                    .is_err()
                {
                    continue;
                }
                // No pin of the victim exists now or later: its words are final. A request
                // that arrived between the scan and the exchange may have made it busy.
                let state = &self.slot(index)[1..];
                let at = idle_at(state);
                if at == BUSY {
                    word.fetch_xor((TOMBSTONE ^ victim) << PIN_BITS, Ordering::Release);
                    continue;
                }
                on_evict(SlotRef { index, id: victim }, state);
                for word in state {
                    word.store(0, Ordering::Relaxed);
                }
                word.fetch_xor((TOMBSTONE ^ id) << PIN_BITS, Ordering::Release);
                return Claim::Evicted {
                    slot: SlotRef { index, id },
                    idle_at: at,
                };
            }
            return Claim::Busy;
        }
    }

    /// Pin the key's slot: `None` when the slot is no longer the key's (evicted, or changing
    /// owner this instant).
    #[inline(always)]
    pub fn pin(&self, slot: SlotRef) -> Option<Pin<'a, W>> {
        self.try_pin(slot).ok()
    }

    /// Pin a slot whose words the caller found itself (`words`: the id word, then the state,
    /// at least one word): the request path's own view of the table, without bounds checks
    /// of its index. `None` when the slot is not `slot.id`'s.
    #[inline(always)]
    pub fn pin_words(words: (&'a W, &'a W, &'a [W]), slot: SlotRef) -> Option<Pin<'a, W>> {
        let (id_word, first, state) = words;
        let before = id_word.fetch_add(PIN, Ordering::Acquire);
        let pin = Pin {
            id_word,
            first,
            state,
            slot,
        };
        (before >> PIN_BITS == slot.id).then_some(pin)
    }

    /// Pin the key's slot, or say which id it held instead.
    #[inline(always)]
    fn try_pin(&self, slot: SlotRef) -> Result<Pin<'a, W>, u64> {
        // An index outside the table (a reference that names no slot) pins nothing.
        let start = slot.index.wrapping_mul(self.stride);
        let Some(id_word) = self.words.get(start) else {
            return Err(0);
        };
        let Some(state) = self.words.get(start + 1..start + self.stride) else {
            return Err(0);
        };
        let Some(first) = state.first() else {
            return Err(0);
        };
        let before = id_word.fetch_add(PIN, Ordering::Acquire);
        let pin = Pin {
            id_word,
            first,
            state,
            slot,
        };
        if before >> PIN_BITS == slot.id {
            Ok(pin)
        } else {
            drop(pin);
            Err(before >> PIN_BITS)
        }
    }

    /// Pin the key's slot wherever it is now: its slot first, else a fresh look.
    #[inline]
    pub fn pin_key(&self, slot: SlotRef) -> Option<Pin<'a, W>> {
        self.pin(slot)
            .or_else(|| self.find(slot.id).and_then(|found| self.pin(found)))
    }

    /// Every occupied slot (index and id), a full scan.
    pub fn occupied(self) -> impl Iterator<Item = SlotRef> + 'a {
        (0..self.slots).filter_map(move |index| match self.id_at(index) {
            0 | TOMBSTONE => None,
            id => Some(SlotRef { index, id }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::sync::atomic::AtomicU64;

    fn table_words(buckets: usize, stride: usize) -> Vec<AtomicU64> {
        (0..buckets * SLOTS_PER_BUCKET * stride)
            .map(|_| AtomicU64::new(0))
            .collect()
    }

    #[test]
    fn claims_finds_and_evicts_the_idlest() {
        let words = table_words(2, 2);
        let table = Table::new(&words, 2);
        let ids: Vec<u64> = (1..=8).collect();
        for &id in &ids {
            let slot = table.find_or_claim_empty(id).unwrap();
            assert_eq!(table.find(id), Some(slot));
            table.pin(slot).unwrap().state()[0].store(id * 10, Ordering::Relaxed);
        }
        assert_eq!(table.find_or_claim_empty(9), None);
        let claim = table.claim_locked(9, |state| state[0].load(Ordering::Relaxed), |_, _| {});
        let Claim::Evicted { slot, idle_at } = claim else {
            panic!("{claim:?}")
        };
        assert_eq!(idle_at, 10);
        assert_eq!(table.find(1), None);
        assert_eq!(table.find(9), Some(slot));
        assert_eq!(
            table.pin(slot).unwrap().state()[0].load(Ordering::Relaxed),
            0
        );
        assert!(table
            .pin(SlotRef {
                index: slot.index,
                id: 1
            })
            .is_none());
    }

    #[test]
    fn busy_and_pinned_slots_are_never_evicted() {
        let words = table_words(2, 2);
        let table = Table::new(&words, 2);
        let slots: Vec<SlotRef> = (1..=8)
            .map(|id| table.find_or_claim_empty(id).unwrap())
            .collect();
        for slot in &slots[1..] {
            table.pin(*slot).unwrap().state()[0].store(1, Ordering::Relaxed);
        }
        let busy_unless_zero = |state: &[AtomicU64]| match state[0].load(Ordering::Relaxed) {
            0 => 0,
            _ => BUSY,
        };
        let pinned = table.pin(slots[0]).unwrap();
        assert_eq!(
            table.claim_locked(9, busy_unless_zero, |_, _| {}),
            Claim::Busy
        );
        drop(pinned);
        let claim = table.claim_locked(9, busy_unless_zero, |_, _| {});
        assert!(
            matches!(claim, Claim::Evicted { slot, .. } if slot.index == slots[0].index),
            "{claim:?}"
        );
    }

    #[test]
    fn ids_are_never_empty_or_tombstone() {
        assert_eq!(key_id(0), 1);
        assert_ne!(key_id(u64::MAX), TOMBSTONE);
        assert_eq!(key_id(5 << PIN_BITS), 5);
        assert_eq!(key_id(4 << PIN_BITS), 5);
    }
}
