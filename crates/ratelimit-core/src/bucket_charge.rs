//! The buckets' hot path: a policy's constants computed once, then a request's outcome and
//! new state in a few integer operations.
//!
//! [`crate::decide_word`] computes every field of a [`Decision`](crate::Decision) (remaining,
//! reset, excess: divisions) and the constants of the policy on each call. A caller that only
//! needs to know whether a request passes, and to store the new state, can keep a
//! [`BucketCharge`] for as long as the policy does not change. Outcomes and states are
//! exactly `decide_word`'s (a proptest holds them equal); where a `u64` would overflow,
//! [`BucketCharge::charge`] answers `None` and the caller asks `decide_word`.

use std::num::NonZeroU64;

use crate::decision::Outcome;
use crate::policy::{Algorithm, DelayMode, Policy};

/// A leaky or token bucket policy, as the three products the decision compares with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketCharge {
    /// `c · T`: how far a request moves the theoretical arrival time.
    cost_ns: u64,
    /// `K · T + τ`: a request passes while the key is at most this far ahead after charging
    /// (`K = burst + 1` for the leaky bucket, `max(burst, 1)` for the token bucket; `τ` the
    /// jitter forgiven under a millisecond, see `gcra`).
    capacity_ns: u64,
    /// `(d + 1) · T + τ`: charged requests further ahead than this are delayed (leaky bucket with
    /// a delay threshold `d`); `u64::MAX` when nothing is ever delayed.
    delay_free_ns: u64,
}

impl BucketCharge {
    /// The constants of `policy`; `None` for the sliding algorithms, or when a product does
    /// not fit a `u64` (the caller then uses `decide_word`).
    pub fn new(policy: &Policy) -> Option<BucketCharge> {
        let interval = policy.limits.rate.interval_ns().max(1);
        // Judging the key `τ` less ahead (see `gcra`) is comparing the real distance with
        // thresholds `τ` larger: the same outcomes, since `τ < T` and costs are whole.
        let tolerance = crate::rate::jitter_tolerance_ns(NonZeroU64::new(interval)?);
        let (slots, delay) = match policy.algorithm {
            Algorithm::LeakyBucket => (policy.limits.burst.checked_add(1)?, policy.delay),
            Algorithm::TokenBucket => (policy.limits.burst.max(1), DelayMode::NoDelay),
            Algorithm::SlidingLog
            | Algorithm::SlidingWindow
            | Algorithm::Concurrency
            | Algorithm::Quota(_) => return None,
        };
        let delay_free_ns = match delay {
            DelayMode::NoDelay => u64::MAX,
            DelayMode::Delay => interval.checked_add(tolerance)?,
            DelayMode::Threshold(excess) => excess
                .checked_add(1)?
                .checked_mul(interval)?
                .checked_add(tolerance)?,
        };
        Some(BucketCharge {
            cost_ns: policy.cost.max(1).checked_mul(interval)?,
            capacity_ns: slots.checked_mul(interval)?.checked_add(tolerance)?,
            delay_free_ns,
        })
    }

    /// The outcome of a request against `state` and, when it is charged, the new state:
    /// exactly what [`crate::decide_word`] gives for the policy. `None` when a sum overflows.
    #[inline(always)]
    pub fn charge(&self, state: u64, now_ns: u64) -> Option<(Outcome, Option<u64>)> {
        let ahead_after_ns = state
            .max(now_ns)
            .checked_sub(now_ns)?
            .checked_add(self.cost_ns)?;
        if ahead_after_ns > self.capacity_ns {
            return Some((Outcome::Rejected, None));
        }
        let next = now_ns.checked_add(ahead_after_ns)?;
        let outcome = if ahead_after_ns > self.delay_free_ns {
            Outcome::Delayed
        } else {
            Outcome::Passed
        };
        Some((outcome, Some(next)))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::decide::decide_word;
    use crate::policy::Limits;
    use crate::rate::{Rate, RateUnit};

    fn policy(
        algorithm: Algorithm,
        milli: u64,
        unit: u8,
        burst: u64,
        delay: u8,
        cost: u64,
    ) -> Policy {
        Policy {
            algorithm,
            limits: Limits {
                rate: Rate {
                    milli_requests: milli.max(1),
                    unit: [
                        RateUnit::Second,
                        RateUnit::Minute,
                        RateUnit::Hour,
                        RateUnit::Day,
                    ][usize::from(unit % 4)],
                },
                burst,
            },
            delay: match delay % 3 {
                0 => DelayMode::Delay,
                1 => DelayMode::NoDelay,
                _ => DelayMode::Threshold(burst / 2),
            },
            cost,
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        /// Same outcome and same new state as `decide_word`, whenever it answers.
        #[test]
        fn agrees_with_decide_word(
            token in any::<bool>(),
            milli in prop_oneof![1u64..20_000_000, any::<u64>()],
            unit in any::<u8>(),
            burst in prop_oneof![0u64..100, 0u64..(1 << 22)],
            delay in any::<u8>(),
            cost in prop_oneof![1u64..5, any::<u64>()],
            state in prop_oneof![Just(0u64), 1_000_000_000_000_000u64..1_000_100_000_000_000, any::<u64>()],
            now in prop_oneof![1_000_000_000_000_000u64..1_000_100_000_000_000, any::<u64>()],
        ) {
            let algorithm = if token { Algorithm::TokenBucket } else { Algorithm::LeakyBucket };
            let policy = policy(algorithm, milli, unit, burst, delay, cost);
            let (decision, next) = decide_word(state, now, &policy);
            if let Some(charge) = BucketCharge::new(&policy) {
                if let Some((outcome, fast_next)) = charge.charge(state, now) {
                    prop_assert_eq!(outcome, decision.outcome);
                    prop_assert_eq!(fast_next, next);
                }
            }
        }
    }

    #[test]
    fn realistic_policies_never_fall_back() {
        let policy = policy(Algorithm::LeakyBucket, 10_000, 0, 20, 0, 1);
        let charge = BucketCharge::new(&policy).unwrap();
        let now = 1_000_000_000_000_000;
        assert_eq!(
            charge.charge(0, now),
            Some((Outcome::Passed, Some(now + 100_000_000)))
        );
        assert!(BucketCharge::new(&Policy {
            algorithm: Algorithm::SlidingLog,
            ..policy
        })
        .is_none());
    }
}
