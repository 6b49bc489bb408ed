//! A zone's decision counters (striped per worker) and its evictions.

use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::Zone;

/// Per-zone decision counters, in the order of [`Counter`].
pub const COUNTERS: usize = 18;
/// Counters are kept per worker (modulo this many stripes), each stripe on its own cache
/// line, so that workers counting requests do not contend for one line.
pub(super) const COUNTER_STRIPES: usize = 16;

/// This process's stripe: `ngx_worker % COUNTER_STRIPES`, set when a worker starts.
static COUNTER_STRIPE: AtomicUsize = AtomicUsize::new(0);

/// Pick this worker's counter stripe (called once per worker, at start).
pub fn set_counter_stripe(worker: usize) {
    COUNTER_STRIPE.store(worker % COUNTER_STRIPES, Ordering::Relaxed);
}

/// One worker's counters, padded to a cache line.
#[repr(C, align(64))]
pub struct CounterStripe {
    counts: [AtomicU64; COUNTERS],
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    Passed = 0,
    Delayed = 1,
    Rejected = 2,
    DelayedDryRun = 3,
    RejectedDryRun = 4,
    /// Refused because the key was blocked (`block=`), charging nothing.
    Blocked = 5,
    BlockedDryRun = 6,
    /// A rejected key that would have been blocked, but its probe window of the full block
    /// table holds only blocks that still matter (they are kept).
    BlockNotRecorded = 7,
    /// Usage-based lines (`usage=`), in tokens: reserved at the door, owed when the request
    /// ended, given back, charged past the reservation, and forgiven by `debt=`.
    TokensReserved = 8,
    TokensUsed = 9,
    TokensRefunded = 10,
    TokensOverrun = 11,
    TokensForgiven = 12,
    /// Usage-based requests settled from a usage the response reported, and without one.
    UsageFound = 13,
    UsageMissing = 14,
    /// Priced lines (`prices=`): micro-dollars owed, and requests whose model the table has
    /// no price for (they kept their reservation).
    SpentMicroUsd = 15,
    Unpriced = 16,
    /// Of those without one: the response's usage was malformed (a figure that is not an
    /// integer from 0 to 2^53).
    UsageBad = 17,
}

impl Zone {
    /// Count one decision, in this worker's stripe.
    #[inline]
    pub fn count(&self, counter: Counter) {
        let stripe = COUNTER_STRIPE.load(Ordering::Relaxed);
        self.header().counters[stripe].counts[counter as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Add `amount` to a counter, in this worker's stripe, stopping at `u64::MAX`: a count of
    /// tokens may be as large as a provider says, and a counter never goes down.
    pub fn count_by(&self, counter: Counter, amount: u64) {
        let stripe = COUNTER_STRIPE.load(Ordering::Relaxed);
        let count = &self.header().counters[stripe].counts[counter as usize];
        let _ = count.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
            Some(old.saturating_add(amount))
        });
    }

    /// A counter summed over every worker's stripe (at most `u64::MAX`).
    pub fn counter(&self, counter: Counter) -> u64 {
        self.header()
            .counters
            .iter()
            .map(|stripe| stripe.counts[counter as usize].load(Ordering::Relaxed))
            .fold(0, u64::saturating_add)
    }

    /// Keys dropped to make room for new ones while their state still mattered.
    pub fn evictions(&self) -> u64 {
        self.header().evictions.load(Ordering::Relaxed)
    }

    /// New keys refused a slot because their whole window was busy.
    pub fn no_slot(&self) -> u64 {
        self.header().no_slot.load(Ordering::Relaxed)
    }

    /// True at most once a second (per zone, across workers): when to log that a new key
    /// found its window busy.
    pub fn should_log_no_slot(&self, now_ns: u64) -> bool {
        once_a_second(&self.header().no_slot_logged_sec, now_ns)
    }

    /// True at most once a second (per zone, across workers): when to log that it is full.
    pub fn should_log_full(&self, now_ns: u64) -> bool {
        once_a_second(&self.header().full_logged_sec, now_ns)
    }

    /// True at most once a second (per zone, across workers): when to log a response whose
    /// usage was malformed.
    pub fn should_log_bad_usage(&self, now_ns: u64) -> bool {
        once_a_second(&self.header().bad_usage_logged_sec, now_ns)
    }
}

/// True for the first caller of each second that `logged_sec` has not seen.
pub fn once_a_second(logged_sec: &AtomicU64, now_ns: u64) -> bool {
    let second = now_ns / 1_000_000_000;
    let last = logged_sec.load(Ordering::Relaxed);
    last != second
        && logged_sec
            .compare_exchange(last, second, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}
