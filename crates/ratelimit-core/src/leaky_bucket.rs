//! Leaky bucket: nginx's `limit_req`, decided with nanoseconds instead of milliseconds.
//!
//! The state is a GCRA theoretical arrival time (`TAT`, ns; 0 for a fresh key): the time at
//! which the bucket would be empty again. `limit_req` keeps `excess` instead, the requests
//! queued beyond the current one; the two are the same thing seen from `now`:
//! `excess = (TAT - now) / T - 1` after charging, with `T` the emission interval. A request of
//! cost `c` moves `TAT` to `max(TAT, now) + c * T` and is
//!
//! * rejected when `excess > burst` (nothing is charged),
//! * delayed by `(excess - d) * T` when `excess > d`, where `d` is 0 by default, `N` for
//!   `delay=N`, and infinite for `nodelay`,
//! * passed otherwise.
//!
//! `remaining` is `floor(burst - excess)`, the cost-1 requests still accepted (passed or
//! delayed) now; `reset_ns` is `TAT - now`, the time until the bucket is empty. A rejection
//! reports both for the unchanged state, and `excess_milli` the excess it would have had.
//!
//! A request costing more than `burst + 1` never passes: its `retry_after_ns` is
//! [`crate::Decision::NEVER_NS`].

use crate::decision::Decision;
use crate::gcra;
use crate::policy::{Limits, Policy};

/// Decide one request; `state` 0 is a fresh key. See [`crate::decide_word`].
// Always inlined, so that a caller reading only the outcome and the new state computes no
// other field (their divisions are dead code once inlined).
#[inline(always)]
pub fn decide(state: u64, now_ns: u64, policy: &Policy) -> (Decision, Option<u64>) {
    // A cost-1 request passes while `TAT - now <= burst * T` before charging: the bucket
    // holds `burst + 1` requests.
    gcra::decide(
        state,
        now_ns,
        &policy.limits.rate,
        policy.cost,
        policy.limits.burst,
        policy.delay,
    )
}

/// The earliest time at which `state` is equivalent to a fresh key: its `TAT`, when the
/// bucket is empty.
#[inline]
pub fn idle_at_ns(state: u64, limits: &Limits) -> u64 {
    let _ = limits;
    state
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::Outcome;
    use crate::policy::{Algorithm, DelayMode};
    use crate::rate::{Rate, RateUnit};
    use Outcome::{Delayed as D, Passed as P, Rejected as R};

    const MS: u64 = 1_000_000;

    fn policy(per_second: u64, burst: u64, delay: DelayMode) -> Policy {
        Policy {
            algorithm: Algorithm::LeakyBucket,
            limits: Limits {
                rate: Rate {
                    milli_requests: per_second * 1000,
                    unit: RateUnit::Second,
                },
                burst,
            },
            delay,
            cost: 1,
        }
    }

    /// Rows `(now_ms, outcome, delay_ms, retry_after_ms, remaining, excess_milli)`, computed by
    /// hand with limit_req's rule: `excess = max(excess - rate * elapsed + 1, 0)` (in requests),
    /// rejected if `excess > burst`, delayed by `(excess - d) / rate` if `excess > d`.
    fn check(policy: &Policy, rows: &[(u64, Outcome, u64, u64, u64, u64)]) -> u64 {
        let mut state = 0;
        for (i, &(now_ms, outcome, delay_ms, retry_ms, remaining, excess)) in
            rows.iter().enumerate()
        {
            let (decision, new_state) = decide(state, now_ms * MS, policy);
            assert_eq!(
                (decision.outcome, decision.delay_ns, decision.retry_after_ns),
                (outcome, delay_ms * MS, retry_ms * MS),
                "row {i}"
            );
            assert_eq!(
                (decision.remaining, decision.excess_milli),
                (remaining, excess),
                "row {i}"
            );
            assert_eq!(new_state.is_some(), outcome != R, "row {i}");
            state = new_state.unwrap_or(state);
        }
        state
    }

    #[test]
    fn burst_zero_rejects_a_second_request_at_the_same_instant() {
        #[rustfmt::skip]
        let state = check(&policy(1, 0, DelayMode::Delay), &[
            (0,    P, 0, 0,    0, 0),
            (0,    R, 0, 1000, 0, 1000), // excess 1 > burst 0
            (999,  R, 0, 1,    0, 1),    // limit_req in ms: excess 0.001 > 0
            (1000, P, 0, 0,    0, 0),
            (1500, R, 0, 500,  0, 500),
            (3000, P, 0, 0,    0, 0),
        ]);
        assert_eq!(
            idle_at_ns(state, &policy(1, 0, DelayMode::Delay).limits),
            4000 * MS
        );
    }

    /// 5000 r/s: T = 200 us, and under a millisecond a request may arrive up to T / 2 early
    /// (`gcra`): the schedule keeps its pace instead of restarting from each late arrival.
    /// 1000 r/s (T = 1 ms) is limit_req's arithmetic exactly.
    #[test]
    fn sub_millisecond_intervals_forgive_half_an_interval() {
        const US: u64 = 1_000;
        let fast = policy(5000, 0, DelayMode::Delay);
        // (now_us, outcome, retry_after_us, new TAT in us when charged)
        let rows: &[(u64, Outcome, u64, Option<u64>)] = &[
            (0, P, 0, Some(200)),
            (99, R, 1, None),       // 101 us early: more than half an interval
            (150, P, 0, Some(400)), // 50 us early: on time, the schedule keeps its pace
            (250, R, 50, None),
            (300, P, 0, Some(600)),
            (900, P, 0, Some(1100)), // late: the lost time is not made up
        ];
        let mut state = 0;
        for (i, &(now_us, outcome, retry_us, tat_us)) in rows.iter().enumerate() {
            let (decision, next) = decide(state, now_us * US, &fast);
            assert_eq!(
                (decision.outcome, decision.retry_after_ns, next),
                (outcome, retry_us * US, tat_us.map(|t| t * US)),
                "row {i}"
            );
            state = next.unwrap_or(state);
        }
        let exact = policy(1000, 0, DelayMode::Delay);
        let (first, state) = decide(0, 0, &exact);
        assert_eq!(first.outcome, P);
        let (early, _) = decide(state.unwrap(), 999 * US, &exact);
        assert_eq!((early.outcome, early.retry_after_ns), (R, US));
    }

    /// 2 r/s (T = 500 ms), burst=5: each excess request waits one more T.
    #[test]
    fn burst_five_delays_grow_by_one_interval() {
        #[rustfmt::skip]
        check(&policy(2, 5, DelayMode::Delay), &[
            (0,    P, 0,    0,   5, 0),
            (0,    D, 500,  0,   4, 1000),
            (0,    D, 1000, 0,   3, 2000),
            (0,    D, 1500, 0,   2, 3000),
            (0,    D, 2000, 0,   1, 4000),
            (0,    D, 2500, 0,   0, 5000),
            (0,    R, 0,    500, 0, 6000), // excess 6 > 5; one request leaks out in 500 ms
            (500,  D, 2500, 0,   0, 5000),
            (600,  R, 0,    400, 0, 5800),
            (3500, P, 0,    0,   5, 0),    // bucket empty again at 3500
            (3600, D, 400,  0,   4, 800),  // excess 0.8: delayed 0.8 * 500 ms
        ]);
    }

    #[test]
    fn nodelay_serves_the_burst_at_once() {
        #[rustfmt::skip]
        check(&policy(2, 5, DelayMode::NoDelay), &[
            (0,   P, 0, 0,   5, 0),
            (0,   P, 0, 0,   4, 1000),
            (0,   P, 0, 0,   3, 2000),
            (0,   P, 0, 0,   2, 3000),
            (0,   P, 0, 0,   1, 4000),
            (0,   P, 0, 0,   0, 5000),
            (0,   R, 0, 500, 0, 6000),
            (250, R, 0, 250, 0, 5500),
            (500, P, 0, 0,   0, 5000),
        ]);
    }

    /// `burst=5 delay=2`: two excess requests go at once, the next ones are delayed.
    #[test]
    fn delay_two_is_two_stage() {
        #[rustfmt::skip]
        check(&policy(2, 5, DelayMode::Threshold(2)), &[
            (0,    P, 0,    0,   5, 0),
            (0,    P, 0,    0,   4, 1000),
            (0,    P, 0,    0,   3, 2000),
            (0,    D, 500,  0,   2, 3000),
            (0,    D, 1000, 0,   1, 4000),
            (0,    D, 1500, 0,   0, 5000),
            (0,    R, 0,    500, 0, 6000),
            (1000, D, 1000, 0,   1, 4000), // excess 6 - 2 leaked = 4
            (2750, P, 0,    0,   3, 1500),
        ]);
    }

    #[test]
    fn cost_counts_as_several_requests() {
        let policy = Policy {
            cost: 3,
            ..policy(2, 5, DelayMode::NoDelay)
        };
        let (first, state) = decide(0, 0, &policy);
        assert_eq!(
            (first.outcome, first.remaining, first.excess_milli),
            (P, 3, 2000)
        );
        let (second, state) = decide(state.unwrap(), 0, &policy);
        assert_eq!(
            (second.outcome, second.remaining, second.excess_milli),
            (P, 0, 5000)
        );
        let (third, _) = decide(state.unwrap(), 0, &policy);
        assert_eq!(
            (third.outcome, third.retry_after_ns, third.reset_ns),
            (R, 1500 * MS, 3000 * MS)
        );
    }

    #[test]
    fn an_earlier_clock_is_no_time_passed() {
        let policy = policy(2, 5, DelayMode::NoDelay);
        let (_, state) = decide(0, 10_000 * MS, &policy);
        let (decision, _) = decide(state.unwrap(), 9_000 * MS, &policy);
        assert_eq!((decision.outcome, decision.excess_milli), (P, 1000 + 2000));
    }
}
