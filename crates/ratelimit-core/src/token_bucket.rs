//! Token bucket: `K = max(1, burst)` tokens, refilled at the rate, full for a fresh key.
//!
//! A request of cost `c` takes `c` tokens or is rejected; it is never delayed. The state is a
//! GCRA theoretical arrival time `TAT` (ns, 0 for a fresh key), from which the tokens at `now`
//! are `K - max(TAT - now, 0) / T`. A request passes iff `max(TAT, now) + c * T - now <= K * T`
//! and moves `TAT` to `max(TAT, now) + c * T`.
//!
//! `remaining` is the whole tokens left; `reset_ns` the time until the bucket is full again
//! (`TAT - now`); `excess_milli` is `(TAT - now) / T - 1` in 1/1000, as for the leaky bucket.
//! A rejection reports them for the unchanged state (`excess_milli`: as if charged).
//!
//! A request costing more than `K` never passes: its `retry_after_ns` is
//! [`Decision::NEVER_NS`].

use crate::decision::{Decision, Outcome};
use crate::gcra;
use crate::policy::{DelayMode, Limits, Policy};

/// Decide one request; `state` 0 is a fresh key. See [`crate::decide_word`].
// Always inlined, so that a caller reading only the outcome and the new state computes no
// other field (their divisions are dead code once inlined).
#[inline(always)]
pub fn decide(state: u64, now_ns: u64, policy: &Policy) -> (Decision, Option<u64>) {
    // A bucket of `K` tokens is a leaky bucket of `K` requests that never delays.
    gcra::decide(
        state,
        now_ns,
        &policy.limits.rate,
        policy.cost,
        capacity(&policy.limits) - 1,
        DelayMode::NoDelay,
    )
}

/// The earliest time at which `state` is equivalent to a fresh key: its `TAT`, when the
/// bucket is full again.
#[inline]
pub fn idle_at_ns(state: u64, limits: &Limits) -> u64 {
    let _ = limits;
    state
}

/// The bucket's size in tokens: `burst`, at least 1.
#[inline]
pub fn capacity(limits: &Limits) -> u64 {
    limits.burst.max(1)
}

/// One decision for `rate_limit ... global=NAME`: a request checked against its own key's
/// bucket (`user`) and the shared bucket (`global`), each decided on its own state.
///
/// The request takes a token from every bucket that has one (the caller stores the new state
/// of each bucket whose own decision passed) and passes if either passed: the global bucket
/// lends its spare capacity to users who ran out of theirs.
///
/// * passed: `retry_after_ns` 0, `delay_ns` 0;
/// * both rejected: `retry_after_ns` is the smaller of the two (the first bucket to have room);
/// * `remaining` is the sum of both (each is what that bucket would still let through; a
///   request passes while either has a token, so together they admit that many more);
/// * `reset_ns` is the larger (the key is fresh once both buckets are full);
/// * `excess_milli` is the smaller of the two (the bucket the request went through).
///
/// ```
/// use ratelimit_core::token_bucket::compose_global;
/// use ratelimit_core::{Decision, Outcome};
///
/// let user = Decision::rejected(500_000_000, 500_000_000, 1000);
/// let global = Decision { outcome: Outcome::Passed, remaining: 9, ..user };
/// let both = compose_global(&user, &global);
/// assert_eq!(both.outcome, Outcome::Passed);
/// assert_eq!(both.retry_after_ns, 0);
/// assert_eq!(both.remaining, 9);
/// ```
pub fn compose_global(user: &Decision, global: &Decision) -> Decision {
    let rank = |outcome: Outcome| match outcome {
        Outcome::Passed => 2,
        Outcome::Delayed => 1,
        Outcome::Rejected => 0,
    };
    let best = if rank(user.outcome) >= rank(global.outcome) {
        user
    } else {
        global
    };
    let (delay_ns, retry_after_ns) = match best.outcome {
        Outcome::Passed => (0, 0),
        Outcome::Delayed => {
            let delay = |d: &Decision| match d.outcome {
                Outcome::Delayed => d.delay_ns,
                _ => u64::MAX,
            };
            (delay(user).min(delay(global)), 0)
        }
        Outcome::Rejected => (0, user.retry_after_ns.min(global.retry_after_ns)),
    };
    Decision {
        outcome: best.outcome,
        delay_ns,
        retry_after_ns,
        remaining: user.remaining.saturating_add(global.remaining),
        reset_ns: user.reset_ns.max(global.reset_ns),
        excess_milli: user.excess_milli.min(global.excess_milli),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Algorithm, DelayMode};
    use crate::rate::{Rate, RateUnit};

    const MS: u64 = 1_000_000;
    /// A `retry_after_ms` column's "never".
    const NEVER: u64 = u64::MAX;

    fn ns(ms: u64) -> u64 {
        if ms == NEVER {
            Decision::NEVER_NS
        } else {
            ms * MS
        }
    }

    fn policy(per_second: u64, burst: u64, cost: u64) -> Policy {
        Policy {
            algorithm: Algorithm::TokenBucket,
            limits: Limits {
                rate: Rate {
                    milli_requests: per_second * 1000,
                    unit: RateUnit::Second,
                },
                burst,
            },
            delay: DelayMode::NoDelay,
            cost,
        }
    }

    /// `K = 5`, `ρ = 2/s` (one token every 500 ms). Each row: `(now_ms, cost, outcome,
    /// remaining, retry_after_ms, reset_ms)`, computed by hand with tokens
    /// `x ← min(5, x + 2·Δt)`, a request taking `cost` tokens if there are that many.
    #[test]
    fn five_tokens_two_per_second() {
        use Outcome::{Passed as P, Rejected as R};
        #[rustfmt::skip]
        let rows: &[(u64, u64, Outcome, u64, u64, u64)] = &[
            (0,    1, P, 4, 0,    500),
            (0,    1, P, 3, 0,    1000),
            (0,    1, P, 2, 0,    1500),
            (0,    1, P, 1, 0,    2000),
            (0,    1, P, 0, 0,    2500),
            (0,    1, R, 0, 500,  2500), // empty: the next token comes at 500 ms
            (250,  1, R, 0, 250,  2250), // half a token
            (500,  1, P, 0, 0,    2500),
            (1000, 2, R, 1, 500,  2000), // one token, needs two
            (1500, 2, P, 0, 0,    2500),
            (1600, 1, R, 0, 400,  2400),
            (2000, 1, P, 0, 0,    2500),
            (2250, 1, R, 0, 250,  2250),
            (4000, 1, P, 3, 0,    1000), // 4 tokens refilled in 2 s
            (4000, 6, R, 3, NEVER, 1000), // more than K: never passes
            (4000, 4, R, 3, 500,  1000),
            (4100, 1, P, 2, 0,    1400),
            (6000, 3, P, 2, 0,    1500), // refilled to the cap of 5, not 5.8
            (6000, 3, R, 2, 500,  1500),
            (6400, 1, P, 1, 0,    1600),
            (6500, 1, P, 1, 0,    2000),
        ];
        let mut state = 0;
        for (i, &(now_ms, cost, outcome, remaining, retry_ms, reset_ms)) in rows.iter().enumerate()
        {
            let (decision, new_state) = decide(state, now_ms * MS, &policy(2, 5, cost));
            let row = (
                decision.outcome,
                decision.remaining,
                decision.retry_after_ns,
                decision.reset_ns,
            );
            assert_eq!(
                row,
                (outcome, remaining, ns(retry_ms), reset_ms * MS),
                "row {i}"
            );
            assert_eq!(decision.delay_ns, 0, "row {i}");
            assert_eq!(new_state.is_some(), outcome == P, "row {i}");
            state = new_state.unwrap_or(state);
        }
        assert_eq!(idle_at_ns(state, &policy(2, 5, 1).limits), 8500 * MS);
    }

    #[test]
    fn burst_zero_is_one_token() {
        let policy = policy(1, 0, 1);
        let (first, state) = decide(0, 0, &policy);
        assert_eq!(first.outcome, Outcome::Passed);
        let (second, _) = decide(state.unwrap(), 0, &policy);
        assert_eq!(second.outcome, Outcome::Rejected);
        assert_eq!(second.retry_after_ns, 1000 * MS);
    }

    #[test]
    fn compose_global_passes_if_either_passes() {
        let passed = Decision {
            outcome: Outcome::Passed,
            delay_ns: 0,
            retry_after_ns: 0,
            remaining: 2,
            reset_ns: 700,
            excess_milli: 0,
        };
        let rejected = Decision::rejected(300, 900, 1000);
        let both = compose_global(&rejected, &passed);
        assert_eq!(both.outcome, Outcome::Passed);
        assert_eq!(
            (both.retry_after_ns, both.remaining, both.reset_ns),
            (0, 2, 900)
        );
        let neither = compose_global(&rejected, &Decision::rejected(200, 100, 3000));
        assert_eq!(neither.outcome, Outcome::Rejected);
        assert_eq!((neither.retry_after_ns, neither.reset_ns), (200, 900));
    }
}
