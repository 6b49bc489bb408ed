//! Give back a request that was charged: lua-resty-limit-traffic's `uncommit`, for every
//! algorithm. Used when a caller charged several limits one after the other and a later one
//! refused (`combine`), or when the request was not served after all.
//!
//! Each function returns the state as if `policy.cost` fewer requests had been charged, never
//! going below a fresh key's state: giving back more than was charged is harmless.

use crate::policy::{Algorithm, Policy};
use crate::{sliding_log, sliding_window};

/// The single-word state `state` with `policy.cost` requests given back at `now_ns`.
/// `SlidingLog` has no single-word state: see [`uncommit_log`].
///
/// ```
/// use ratelimit_core::{decide_word, uncommit::uncommit_word};
/// use ratelimit_core::{Algorithm, DelayMode, Limits, Outcome, Policy, Rate};
///
/// let policy = Policy {
///     algorithm: Algorithm::TokenBucket,
///     limits: Limits { rate: Rate::parse("1r/m").unwrap(), burst: 1 },
///     delay: DelayMode::NoDelay,
///     cost: 1,
/// };
/// let (_, charged) = decide_word(0, 5, &policy);
/// let charged = charged.unwrap();
/// assert_eq!(decide_word(charged, 5, &policy).0.outcome, Outcome::Rejected);
/// let given_back = uncommit_word(charged, 5, &policy);
/// assert_eq!(decide_word(given_back, 5, &policy).0.outcome, Outcome::Passed);
/// ```
pub fn uncommit_word(state: u64, now_ns: u64, policy: &Policy) -> u64 {
    match policy.algorithm {
        // Both buckets keep a theoretical arrival time: a request moved it `cost * T` later.
        // At or before `now` the bucket is as fresh as it gets already.
        Algorithm::LeakyBucket | Algorithm::TokenBucket => {
            if state <= now_ns {
                return state;
            }
            let charged = policy.cost.saturating_mul(policy.limits.rate.interval_ns());
            state.saturating_sub(charged).max(now_ns)
        }
        Algorithm::SlidingWindow => sliding_window::uncommit(state, now_ns, policy),
        Algorithm::Quota(_) => crate::quota::uncommit(state, policy),
        Algorithm::SlidingLog | Algorithm::Concurrency => state,
    }
}

/// A state of several words ([`Algorithm::is_single_word`] is false) with `policy.cost`
/// requests given back; a single-word algorithm's words are left as they are.
pub fn uncommit_words(state: &mut [u64], policy: &Policy) {
    if policy.algorithm == Algorithm::SlidingLog {
        uncommit_log(state, policy);
    }
}

/// A sliding log with its `policy.cost` newest entries removed.
pub fn uncommit_log(log: &mut [u64], policy: &Policy) {
    sliding_log::drop_newest(log, policy.cost);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::decide_word;
    use crate::decide::tests::policy;
    use crate::decision::Outcome;

    const SEC: u64 = 1_000_000_000;

    /// Charge until rejected, give one back, and the next request passes again; giving back
    /// on a fresh key leaves it fresh.
    #[test]
    fn every_single_word_algorithm_gives_back_one_request() {
        for algorithm in [
            Algorithm::LeakyBucket,
            Algorithm::TokenBucket,
            Algorithm::SlidingWindow,
        ] {
            let policy = policy(algorithm, "3r/m", 3);
            let now = 100 * SEC;
            let mut state = 0;
            let mut passed = 0;
            loop {
                let (decision, next) = decide_word(state, now, &policy);
                if decision.outcome == Outcome::Rejected {
                    break;
                }
                state = next.unwrap();
                passed += 1;
            }
            assert!(passed >= 3, "{algorithm}: {passed}");
            let given_back = uncommit_word(state, now, &policy);
            let (again, next) = decide_word(given_back, now, &policy);
            assert_eq!(again.outcome, Outcome::Passed, "{algorithm}");
            assert_eq!(
                decide_word(next.unwrap(), now, &policy).0.outcome,
                Outcome::Rejected,
                "{algorithm}: only one request was given back"
            );
            let fresh = uncommit_word(0, now, &policy);
            assert_eq!(
                decide_word(fresh, now, &policy).0.remaining,
                decide_word(0, now, &policy).0.remaining,
                "{algorithm}"
            );
        }
    }

    #[test]
    fn sliding_log_drops_its_newest_entries() {
        let policy = policy(Algorithm::SlidingLog, "2r/s", 0);
        let mut log = vec![0; sliding_log::words_for(2)];
        assert_eq!(
            sliding_log::decide(&mut log, 10, &policy).outcome,
            Outcome::Passed
        );
        assert_eq!(
            sliding_log::decide(&mut log, 20, &policy).outcome,
            Outcome::Passed
        );
        assert_eq!(
            sliding_log::decide(&mut log, 30, &policy).outcome,
            Outcome::Rejected
        );
        uncommit_log(&mut log, &policy);
        let again = sliding_log::decide(&mut log, 30, &policy);
        assert_eq!(again.outcome, Outcome::Passed);
        // The entry at 10 still counts: the next one fits 1 s after it, not after 20.
        let refused = sliding_log::decide(&mut log, 40, &policy);
        assert_eq!(refused.retry_after_ns, SEC + 10 - 40);
        for _ in 0..5 {
            uncommit_log(&mut log, &policy);
        }
        assert_eq!(sliding_log::inspect(&log, 40, &policy).remaining, 1);
    }
}
