//! What callers need to know about each [`Algorithm`], asked of the algorithm rather than
//! matched on its name: adding an algorithm is adding its answers here (and its arithmetic).

use crate::policy::Algorithm;
use crate::quota::QuotaWindow;
use crate::rate::Rate;
use crate::sliding_log;

impl Algorithm {
    /// Every algorithm, in the order of their [`Algorithm::code`]s.
    pub const ALL: [Algorithm; 6] = [
        Algorithm::LeakyBucket,
        Algorithm::TokenBucket,
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::Concurrency,
        Algorithm::Quota(QuotaWindow { tag: 0, end_ns: 0 }),
    ];

    /// A number for the algorithm that never changes (shared memory keeps it across
    /// reloads and versions of the module).
    pub fn code(self) -> u64 {
        match self {
            Algorithm::LeakyBucket => 1,
            Algorithm::TokenBucket => 2,
            Algorithm::SlidingLog => 3,
            Algorithm::SlidingWindow => 4,
            Algorithm::Concurrency => 5,
            Algorithm::Quota(_) => 6,
        }
    }

    /// The algorithm of [`Algorithm::code`] `code`; the default (`LeakyBucket`) for a code
    /// no algorithm has.
    pub fn from_code(code: u64) -> Algorithm {
        Algorithm::ALL
            .into_iter()
            .find(|algorithm| algorithm.code() == code)
            .unwrap_or(Algorithm::LeakyBucket)
    }

    /// Whether a key's state is one `u64` ([`crate::decide_word`]), updated by
    /// compare-and-swap; else it is several words ([`crate::decide_words`], or the words of
    /// [`crate::concurrency`]).
    #[inline]
    pub fn is_single_word(self) -> bool {
        !matches!(self, Algorithm::SlidingLog | Algorithm::Concurrency)
    }

    /// Whether a key's state is read and written under a lock: a rate state of several words
    /// cannot be swapped at once. A concurrency key's words each change by compare-and-swap.
    #[inline]
    pub fn needs_lock(self) -> bool {
        matches!(self, Algorithm::SlidingLog)
    }

    /// Whether it limits requests in flight (held until they end) rather than a rate.
    #[inline]
    pub fn counts_in_flight(self) -> bool {
        matches!(self, Algorithm::Concurrency)
    }

    /// The `u64` words a key's state takes at `rate` (a concurrency key: with a fixed limit;
    /// see [`crate::concurrency::state_words`]).
    pub fn state_words(self, rate: &Rate) -> usize {
        match self {
            Algorithm::SlidingLog => sliding_log::words_for(rate.whole_requests().unwrap_or(1)),
            Algorithm::Concurrency => crate::concurrency::state_words(false, false),
            _ => 1,
        }
    }

    /// Whether `burst=` means something to it (the buckets); the sliding algorithms have
    /// none, and refuse one.
    #[inline]
    pub fn takes_burst(self) -> bool {
        matches!(self, Algorithm::LeakyBucket | Algorithm::TokenBucket)
    }

    /// Whether its state keeps a time computed at the rate (the buckets' theoretical arrival
    /// time), which a change of rate must re-express ([`crate::rescale_word`]).
    #[inline]
    pub fn keeps_time_at_rate(self) -> bool {
        matches!(self, Algorithm::LeakyBucket | Algorithm::TokenBucket)
    }

    /// Whether a fleet can share it (`rate_limit_sync`): a state one grant can be taken from,
    /// or a quota's count (its period's counter lives in Redis, `crate::fleet_quota`).
    #[inline]
    pub fn can_sync(self) -> bool {
        self.is_single_word()
    }

    /// Whether it counts per calendar period (`algorithm=quota`).
    #[inline]
    pub fn is_quota(self) -> bool {
        matches!(self, Algorithm::Quota(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_never_collide() {
        for algorithm in Algorithm::ALL {
            assert_eq!(Algorithm::from_code(algorithm.code()), algorithm);
        }
        assert_eq!(Algorithm::from_code(0), Algorithm::LeakyBucket);
        assert_eq!(Algorithm::from_code(99), Algorithm::LeakyBucket);
    }

    #[test]
    fn answers_per_algorithm() {
        let rate = Rate::parse("10r/s").unwrap();
        // (algorithm, single word, lock, takes burst, rescaled, can sync)
        let table = [
            (Algorithm::LeakyBucket, true, false, true, true, true),
            (Algorithm::TokenBucket, true, false, true, true, true),
            (Algorithm::SlidingLog, false, true, false, false, false),
            (Algorithm::SlidingWindow, true, false, false, false, true),
            (Algorithm::Concurrency, false, false, false, false, false),
            (Algorithm::ALL[5], true, false, false, false, true),
        ];
        for (algorithm, single, lock, burst, rescaled, sync) in table {
            assert_eq!(algorithm.is_single_word(), single, "{algorithm}");
            assert_eq!(algorithm.needs_lock(), lock, "{algorithm}");
            assert_eq!(
                algorithm.counts_in_flight(),
                algorithm == Algorithm::Concurrency
            );
            assert_eq!(algorithm.takes_burst(), burst, "{algorithm}");
            assert_eq!(algorithm.keeps_time_at_rate(), rescaled, "{algorithm}");
            assert_eq!(algorithm.can_sync(), sync, "{algorithm}");
            assert_eq!(algorithm.state_words(&rate) == 1, single, "{algorithm}");
        }
    }
}
