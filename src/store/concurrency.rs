//! A concurrency zone's words, as data: the zone's live limits, and each key's slots word,
//! the time its queue's head last moved, its per-process lanes and, with `limit=adaptive`,
//! its adaptive state (`ratelimit_core::concurrency`, `ratelimit_core::adaptive`). What to do
//! with them is the control layer's.
//!
//! A key's slot: `[hash, slots, head_since_ns, lanes × LANE_WORDS, (adaptive state × 5,
//! window histogram × 4, window peak | a sync zone's lease, refused)]`.

use core::sync::atomic::{AtomicU64, Ordering};

use ratelimit_core::adaptive::{AdaptiveBounds, AdaptiveLimit, ADAPTIVE_WORDS, HISTOGRAM_WORDS};
use ratelimit_core::concurrency::{
    ConcurrencyLimits, Lanes, Slots, KEY_WORDS, LANE_WORDS, LEASE_KEY_WORDS,
};

use super::slots::Pin;
use super::{SlotIndex, Zone};

/// A key's words with its slot pinned: the key keeps its slot while this lives. Held for the
/// few instructions of one update, never across a request's lifetime.
pub struct PinnedKeyWords<'a> {
    words: KeyWords<'a>,
    pin: Pin<'a>,
}

impl PinnedKeyWords<'_> {
    /// The key's slot.
    pub fn slot(&self) -> SlotIndex {
        self.pin.slot()
    }
}

impl<'a> core::ops::Deref for PinnedKeyWords<'a> {
    type Target = KeyWords<'a>;
    fn deref(&self) -> &KeyWords<'a> {
        &self.words
    }
}

/// Offsets in a key's state words (after its hash).
const SLOTS: usize = 0;
const HEAD_SINCE: usize = 1;
const LANES: usize = 2;
const ADAPTIVE: usize = KEY_WORDS;
const WINDOW: usize = ADAPTIVE + ADAPTIVE_WORDS;
const PEAK: usize = WINDOW + HISTOGRAM_WORDS;
const LEASE: usize = KEY_WORDS;
const REFUSED: usize = LEASE + 1;

/// One key's words.
#[derive(Clone, Copy)]
pub struct KeyWords<'a> {
    /// The packed [`Slots`]: in flight, queue head and tail.
    pub slots: &'a AtomicU64,
    /// When the queue's head last moved (monotonic ns), written before each move.
    pub head_since: &'a AtomicU64,
    lanes: &'a [AtomicU64],
    /// With `limit=adaptive`.
    pub adaptive: Option<AdaptiveWords<'a>>,
    /// In a `sync` zone.
    pub lease: Option<LeaseWords<'a>>,
}

/// A `sync` key's lease words: written by the sync loop, read by requests.
#[derive(Clone, Copy)]
pub struct LeaseWords<'a> {
    /// The packed `ratelimit_core::lease::LeaseWord`: the permits the key's requests may hold
    /// on this instance, and until when.
    pub lease: &'a AtomicU64,
    /// Requests refused for want of a permit since the loop last took the count.
    pub refused: &'a AtomicU64,
}

/// An adaptive key's words.
#[derive(Clone, Copy)]
pub struct AdaptiveWords<'a> {
    state: &'a [AtomicU64],
    /// The window's histogram: `ratelimit_core::adaptive::histogram_add`'s words.
    pub histogram: &'a [AtomicU64],
    /// The most requests in flight since the window opened.
    pub peak: &'a AtomicU64,
}

impl KeyWords<'_> {
    /// The slots word, unpacked.
    pub fn load(&self) -> Slots {
        Slots::unpack(self.slots.load(Ordering::Acquire))
    }

    /// Add `cost` to the lane of process `process_slot` (no lane: nothing to do).
    pub fn lane_add(&self, process_slot: usize, cost: u64) {
        if let Some((word, shift)) = Lanes::position(process_slot) {
            self.lanes[word].fetch_add(Lanes::delta(cost, shift), Ordering::AcqRel);
        }
    }

    /// Subtract `cost` from the lane of process `process_slot`.
    pub fn lane_sub(&self, process_slot: usize, cost: u64) {
        if let Some((word, shift)) = Lanes::position(process_slot) {
            self.lanes[word].fetch_sub(Lanes::delta(cost, shift), Ordering::AcqRel);
        }
    }

    /// Empty the lane of process `process_slot`: the slots it held, and whether it held
    /// tickets.
    pub fn lane_take(&self, process_slot: usize) -> (u64, bool) {
        let Some((word, shift)) = Lanes::position(process_slot) else {
            return (0, false);
        };
        let before = self.lanes[word].fetch_and(!Lanes::mask(shift), Ordering::AcqRel);
        (
            Lanes::count(before, shift),
            before & Lanes::tickets_flag(shift) != 0,
        )
    }

    /// Note that process `process_slot` holds tickets of this key (before it takes one).
    pub fn mark_tickets(&self, process_slot: usize) {
        if let Some((word, shift)) = Lanes::position(process_slot) {
            self.lanes[word].fetch_or(Lanes::tickets_flag(shift), Ordering::AcqRel);
        }
    }

    /// Note that process `process_slot` holds no ticket of this key any more.
    pub fn unmark_tickets(&self, process_slot: usize) {
        if let Some((word, shift)) = Lanes::position(process_slot) {
            self.lanes[word].fetch_and(!Lanes::tickets_flag(shift), Ordering::AcqRel);
        }
    }

    /// Empty the key's queue (its tickets' holders are gone, or the key is forgotten): live
    /// holders of tickets find theirs skipped and queue again. Returns the tickets dropped.
    pub fn reset_queue(&self, now_ns: u64) -> u32 {
        let mut current = self.slots.load(Ordering::Acquire);
        loop {
            let Some(next) = ratelimit_core::concurrency::reset_queue(current) else {
                return 0;
            };
            self.head_since.store(now_ns, Ordering::Release);
            match self.slots.compare_exchange_weak(
                current,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Slots::unpack(current).queued(),
                Err(actual) => current = actual,
            }
        }
    }

    /// Whether nothing is in flight or queued.
    pub fn is_idle(&self) -> bool {
        let slots = self.load();
        slots.in_flight == 0 && slots.queued() == 0
    }
}

impl AdaptiveWords<'_> {
    /// The key's adaptive state within `bounds`; `None` for a key that has none yet.
    pub fn load(&self, bounds: &AdaptiveBounds) -> Option<AdaptiveLimit> {
        let mut words = [0u64; ADAPTIVE_WORDS];
        for (word, atomic) in words.iter_mut().zip(self.state) {
            *word = atomic.load(Ordering::Acquire);
        }
        AdaptiveLimit::unpack(&words, bounds)
    }

    /// Store a state. Written word by word, by the one worker that holds the zone's lock to
    /// close a window; readers may see a mix of two consecutive states for a moment, each
    /// word of which is valid on its own.
    pub fn store(&self, state: &AdaptiveLimit) {
        for (atomic, word) in self.state.iter().zip(state.pack()) {
            atomic.store(word, Ordering::Release);
        }
    }

    /// The window's histogram words now.
    pub fn histogram_words(&self) -> [u64; HISTOGRAM_WORDS] {
        let mut words = [0u64; HISTOGRAM_WORDS];
        for (word, atomic) in words.iter_mut().zip(self.histogram) {
            *word = atomic.load(Ordering::Acquire);
        }
        words
    }

    /// Empty the window's histogram, returning what it held (each word swapped on its own: a
    /// sample added meanwhile lands in one window or the next).
    pub fn take_histogram(&self) -> [u64; HISTOGRAM_WORDS] {
        let mut words = [0u64; HISTOGRAM_WORDS];
        for (word, atomic) in words.iter_mut().zip(self.histogram) {
            *word = atomic.swap(0, Ordering::AcqRel);
        }
        words
    }

    /// Clear the state (a key forgotten).
    pub fn clear(&self) {
        for atomic in self.state {
            atomic.store(0, Ordering::Release);
        }
        for atomic in self.histogram {
            atomic.store(0, Ordering::Release);
        }
        self.peak.store(0, Ordering::Release);
    }
}

impl Zone {
    /// The zone's limits in force now; `None` for a zone that is not a concurrency zone.
    pub fn concurrency_limits(&self) -> Option<ConcurrencyLimits> {
        ConcurrencyLimits::unpack(self.header().concurrency.load(Ordering::Acquire))
    }

    /// The permits a key of a `sync` zone may hold while it has no live lease.
    #[inline]
    pub fn lease_fallback(&self) -> u32 {
        self.header().lease_fallback.load(Ordering::Acquire) as u32
    }

    /// Set by the sync loop each round: see [`Zone::lease_fallback`].
    pub fn set_lease_fallback(&self, permits: u32) {
        self.header()
            .lease_fallback
            .store(u64::from(permits), Ordering::Release);
    }

    /// The limits the configuration file gave at the last (re)load.
    pub fn config_concurrency_limits(&self) -> Option<ConcurrencyLimits> {
        ConcurrencyLimits::unpack(self.header().config_concurrency.load(Ordering::Acquire))
    }

    /// Replace the zone's limits if they still are `current` (one compare-and-swap); on
    /// failure, the limits found instead.
    pub fn replace_concurrency_limits(
        &self,
        current: ConcurrencyLimits,
        new: ConcurrencyLimits,
    ) -> Result<(), Option<ConcurrencyLimits>> {
        self.header()
            .concurrency
            .compare_exchange(
                current.pack(),
                new.pack(),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .map(|_| ())
            .map_err(ConcurrencyLimits::unpack)
    }

    /// The words of the key in `index`, pinned while they live (see [`PinnedKeyWords`]);
    /// `None` for a zone whose slots are not a concurrency key's, or when the key lost its
    /// slot (a key holding or waiting for slots never does).
    #[inline]
    pub fn key_words(&self, index: SlotIndex) -> Option<PinnedKeyWords<'_>> {
        let pin = self.pin_own(index)?;
        let words = self.words_of(pin.state())?;
        Some(PinnedKeyWords { words, pin })
    }

    /// The words of the key in `index` for a request arriving at it: its slot pinned, found
    /// or claimed again if the key lost it since it was found. `None` when its window is
    /// busy (or the zone is not a concurrency zone).
    pub fn key_words_to_charge(&self, index: SlotIndex, now_ns: u64) -> Option<PinnedKeyWords<'_>> {
        let pin = self.pin_to_charge(index, now_ns)?;
        let words = self.words_of(pin.state())?;
        Some(PinnedKeyWords { words, pin })
    }

    /// The hash of the key in `index` now (another key's, once it was evicted: callers that
    /// kept an index across time check it).
    #[inline]
    pub fn hash_at(&self, index: SlotIndex) -> u64 {
        self.table().id_at(index.index)
    }

    /// The key words of a slot's state (the words after its id).
    fn words_of<'a>(&self, words: &'a [AtomicU64]) -> Option<KeyWords<'a>> {
        if !self.algorithm.counts_in_flight() || words.len() < KEY_WORDS {
            return None;
        }
        let adaptive = words.get(ADAPTIVE..=PEAK).map(|_| AdaptiveWords {
            state: &words[ADAPTIVE..WINDOW],
            histogram: &words[WINDOW..PEAK],
            peak: &words[PEAK],
        });
        let lease = (self.sync && words.len() == KEY_WORDS + LEASE_KEY_WORDS).then(|| LeaseWords {
            lease: &words[LEASE],
            refused: &words[REFUSED],
        });
        Some(KeyWords {
            slots: &words[SLOTS],
            head_since: &words[HEAD_SINCE],
            lanes: &words[LANES..LANES + LANE_WORDS],
            adaptive,
            lease,
        })
    }

    /// Every key in use (hash, words, each pinned while its item lives), for the admin API's
    /// totals and a new worker's reclaiming of a dead one's lane. A full scan, lock-free.
    pub fn concurrency_keys(&self) -> impl Iterator<Item = (u64, PinnedKeyWords<'_>)> {
        let table = self.table();
        table.occupied().filter_map(move |slot| {
            let pin = table.pin(slot)?;
            let words = self.words_of(pin.state())?;
            Some((slot.id, PinnedKeyWords { words, pin }))
        })
    }

    /// When a concurrency key's state becomes a fresh key's: never while requests hold or wait
    /// for its slots (its counts must stay where its requests will give them back); an idle
    /// key's adaptive state when it would be measured again anyway; else at once.
    pub(super) fn concurrency_idle_at(&self, state: &[AtomicU64]) -> u64 {
        let Some(words) = self.words_of(state) else {
            return 0;
        };
        if !words.is_idle() {
            return ratelimit_slots::BUSY;
        }
        let Some(adaptive) = words.adaptive else {
            return 0;
        };
        let bounds = match self.concurrency_limits().map(|limits| limits.limit) {
            Some(ratelimit_core::concurrency::ConcurrencyLimit::Adaptive(bounds)) => bounds,
            _ => return 0,
        };
        // Past its next probe, the state is measured afresh like a new key's.
        adaptive
            .load(&bounds)
            .map_or(0, |state| state.next_probe_ns)
    }

    /// Forget a concurrency key: its queue is emptied (live waiters queue again) and its
    /// adaptive state cleared; the slots held stay, given back by their requests. False when
    /// there was nothing to forget.
    pub(super) fn forget_concurrency(&self, state: &[AtomicU64], now_ns: u64) -> bool {
        let Some(words) = self.words_of(state) else {
            return false;
        };
        words.reset_queue(now_ns);
        if let Some(adaptive) = words.adaptive {
            adaptive.clear();
        }
        true
    }
}
