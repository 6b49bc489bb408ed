//! A zone's requests per second over the last minutes (`ratelimit_core::history` has the
//! arithmetic): a ring in the zone's header, written without a lock by the first decision of
//! each second, read by the admin API, so that the dashboard's chart is the zone's own.

use core::sync::atomic::{AtomicU64, Ordering};

use ratelimit_core::history::{self, SECONDS, SERIES};
use ratelimit_core::NANOS_PER_SEC;

use super::{Counter, Zone};

/// The ring: per series (passed, delayed, rejected) and second, the running total at the
/// second's first decision, packed with the second. All zero in a new zone (no second).
#[repr(C)]
pub struct HistoryRing {
    /// The last second (monotonic) recorded, so that only a second's first decision writes.
    second: AtomicU64,
    words: [[AtomicU64; SECONDS]; SERIES.len()],
}

impl Zone {
    /// Record the zone's running totals if `now_ns` starts a new second: one load and
    /// compare per call, three stores once a second (by whichever worker's request comes
    /// first in that second).
    #[inline(always)]
    pub fn record_second(&self, now_ns: u64) {
        let second = now_ns / NANOS_PER_SEC;
        let last = self.header().history.second.load(Ordering::Relaxed);
        if last != second {
            self.record_second_first(second, last);
        }
    }

    #[cold]
    #[inline(never)]
    fn record_second_first(&self, second: u64, last: u64) {
        let ring = &self.header().history;
        if ring
            .second
            .compare_exchange(last, second, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return; // another worker records this second
        }
        let slot = history::slot(second);
        for (words, total) in ring.words.iter().zip(self.history_totals()) {
            words[slot].store(history::pack(second, total), Ordering::Relaxed);
        }
    }

    /// Passed, delayed and rejected requests since the zone was made (dry-run decisions
    /// counted with their kind, requests of a blocked key as rejected), in the order of
    /// [`SERIES`].
    fn history_totals(&self) -> [u64; 3] {
        [
            self.counter(Counter::Passed),
            self.counter(Counter::Delayed) + self.counter(Counter::DelayedDryRun),
            self.counter(Counter::Rejected)
                + self.counter(Counter::RejectedDryRun)
                + self.counter(Counter::Blocked)
                + self.counter(Counter::BlockedDryRun),
        ]
    }

    /// Each series' counts for the [`SECONDS`] seconds ending with the one of `now_ns` (the
    /// current one, still running, last).
    pub fn history(&self, now_ns: u64) -> [Vec<u64>; 3] {
        let second = now_ns / NANOS_PER_SEC;
        let ring = &self.header().history;
        let totals = self.history_totals();
        core::array::from_fn(|series| {
            let words: Vec<u64> = ring.words[series]
                .iter()
                .map(|word| word.load(Ordering::Relaxed))
                .collect();
            history::per_second(&words, second, totals[series])
        })
    }
}
