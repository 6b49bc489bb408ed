//! A zone's recent history: how many requests passed, were delayed and were rejected in each
//! of the last [`SECONDS`] seconds, kept where every worker writes it without a lock.
//!
//! The ring holds, per second and per series, the zone's running total as it stood at the
//! first decision of that second, packed with the second in one word ([`pack`]). Whoever
//! decides the first request of a second writes the three words of that second (one store
//! each); nothing is written in a second without requests. The count of second `s` is then
//! `T(s + 1) - T(s)`, where a second without a word had no decision and so `T(s) = T(s + 1)`,
//! and the current second ends at the live total ([`per_second`]). Totals are kept modulo
//! 2^44 and subtracted modulo 2^44, so they may wrap.
//!
//! A word also carries the low 19 bits of its second: a word left from 2^19 seconds (six
//! days) ago could be taken for a recent one, which only a zone idle for exactly that long
//! would show, for one poll.

/// Seconds the ring covers: five minutes.
pub const SECONDS: usize = 300;

/// The series, in the order of a ring entry: passed, delayed, rejected (dry-run decisions
/// counted with their kind).
pub const SERIES: [&str; 3] = ["passed", "delayed", "rejected"];

const TOTAL_BITS: u32 = 44;
const TOTAL_MASK: u64 = (1 << TOTAL_BITS) - 1;
const SECOND_BITS: u32 = 19;
const SECOND_MASK: u64 = (1 << SECOND_BITS) - 1;
/// Set in every written word, so that `0` (never written) is no second's word.
const WRITTEN: u64 = 1 << 63;

/// The word for `second` (any clock's whole seconds) and a running `total`.
///
/// ```
/// use ratelimit_core::history::{pack, unpack};
///
/// assert_eq!(unpack(pack(1_000_000, 42), 1_000_000), Some(42));
/// assert_eq!(unpack(pack(1_000_000, 42), 1_000_001), None);
/// assert_eq!(unpack(0, 0), None);
/// ```
pub fn pack(second: u64, total: u64) -> u64 {
    WRITTEN | ((second & SECOND_MASK) << TOTAL_BITS) | (total & TOTAL_MASK)
}

/// The total in `word` if it was written for `second`.
pub fn unpack(word: u64, second: u64) -> Option<u64> {
    let written = word & WRITTEN != 0;
    let same_second = (word >> TOTAL_BITS) & SECOND_MASK == second & SECOND_MASK;
    (written && same_second).then_some(word & TOTAL_MASK)
}

/// The ring index of `second`.
pub fn slot(second: u64) -> usize {
    (second % SECONDS as u64) as usize
}

/// One series' counts for the [`SECONDS`] seconds that end with `now_second` (oldest first;
/// the last one is the current second, still running), from the series' ring `words`
/// (indexed by [`slot`]) and its live running total.
///
/// ```
/// use ratelimit_core::history::{pack, per_second, slot, SECONDS};
///
/// let mut ring = vec![0u64; SECONDS];
/// // 5 requests before second 1000, 3 more during it, none in 1001, 2 in 1002 so far.
/// ring[slot(1000)] = pack(1000, 5);
/// ring[slot(1002)] = pack(1002, 8);
/// let counts = per_second(&ring, 1002, 10);
/// assert_eq!(counts[SECONDS - 3..], [3, 0, 2]);
/// assert_eq!(counts.iter().sum::<u64>(), 5); // what happened before second 1000 is older
/// ```
pub fn per_second(words: &[u64], now_second: u64, live_total: u64) -> Vec<u64> {
    let mut counts = vec![0; SECONDS];
    let mut after = live_total & TOTAL_MASK;
    for back in 0..SECONDS as u64 {
        let Some(second) = now_second.checked_sub(back) else {
            break;
        };
        let at_start = words
            .get(slot(second))
            .and_then(|&word| unpack(word, second))
            .unwrap_or(after);
        counts[SECONDS - 1 - back as usize] = after.wrapping_sub(at_start) & TOTAL_MASK;
        after = at_start;
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A simulated zone: requests at given seconds, each sampling the ring first when it is
    /// its second's first, as the request path does.
    fn simulate(seconds_of_requests: &[u64]) -> (Vec<u64>, u64) {
        let mut ring = vec![0u64; SECONDS];
        let mut total = 0u64;
        let mut last_sampled = None;
        for &second in seconds_of_requests {
            if last_sampled != Some(second) {
                ring[slot(second)] = pack(second, total);
                last_sampled = Some(second);
            }
            total += 1;
        }
        (ring, total)
    }

    #[test]
    fn empty_ring_counts_nothing() {
        assert_eq!(per_second(&[0; SECONDS], 5_000, 0), vec![0; SECONDS]);
        // Early in the clock's life: fewer seconds than the ring holds.
        assert_eq!(per_second(&[0; SECONDS], 3, 0), vec![0; SECONDS]);
    }

    #[test]
    fn totals_wrap() {
        let mut ring = vec![0u64; SECONDS];
        ring[slot(700)] = pack(700, TOTAL_MASK - 1);
        let counts = per_second(&ring, 700, TOTAL_MASK + 3);
        assert_eq!(counts[SECONDS - 1], 4);
    }

    proptest! {
        /// Every request of the last SECONDS seconds is counted in its own second, and older
        /// ones are not, whatever the pattern of busy and idle seconds.
        #[test]
        fn counts_each_second_exactly(
            start in 0u64..10_000_000,
            gaps in proptest::collection::vec(0u64..40, 0..400),
            extra_idle in 0u64..700,
        ) {
            let mut seconds = Vec::new();
            let mut second = start;
            for gap in gaps {
                second += gap / 8; // mostly several requests a second, sometimes idle seconds
                seconds.push(second);
            }
            let now = second + extra_idle;
            let (ring, total) = simulate(&seconds);
            let counts = per_second(&ring, now, total);
            let mut expected = vec![0u64; SECONDS];
            for &s in &seconds {
                if s + (SECONDS as u64) > now {
                    expected[SECONDS - 1 - (now - s) as usize] += 1;
                }
            }
            prop_assert_eq!(counts, expected);
        }
    }
}
