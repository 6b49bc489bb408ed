//! The overshoot bound of docs/usage.md, on the arithmetic itself: a token bucket of `K`
//! tokens refilled at `r` a second, requests reserving `R` at the door (admitted only when it
//! fits), settled later to their usage `U` (refund, or a charge into debt), at most `C` in
//! flight. In every window of `W`, the usage of the requests admitted in it is at most
//! `K + r·W + C·O` (`O` the largest overrun) plus what requests admitted before the window
//! gave back in it.

use proptest::prelude::*;
use ratelimit_core::uncommit::uncommit_word;
use ratelimit_core::usage::settle::{charge_into_debt, Bucket};
use ratelimit_core::{decide_word, Algorithm, DelayMode, Limits, Outcome, Policy, Rate};

const K: u64 = 1000;
const INTERVAL_NS: u64 = 1_000_000; // r = 1000 tokens a second
const RESERVE: u64 = 50;
const C: usize = 8;

#[derive(Clone, Debug)]
enum Step {
    /// Time passes (ns), then a request arrives using this many tokens.
    Arrive(u64, u64),
    /// Time passes, then the in-flight request at this position settles.
    Settle(u64, prop::sample::Index),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0..20 * INTERVAL_NS, 0..=200u64).prop_map(|(dt, usage)| Step::Arrive(dt, usage)),
        (0..20 * INTERVAL_NS, any::<prop::sample::Index>()).prop_map(|(dt, i)| Step::Settle(dt, i)),
    ]
}

struct Admitted {
    at_ns: u64,
    usage: u64,
    /// When it settled, and the tokens it gave back then.
    settled: Option<(u64, u64)>,
}

proptest! {
    #[test]
    fn admitted_usage_stays_within_the_bound(steps in proptest::collection::vec(step(), 1..300)) {
        let policy = Policy {
            algorithm: Algorithm::TokenBucket,
            limits: Limits { rate: Rate::parse("1000r/s").unwrap(), burst: K },
            delay: DelayMode::NoDelay,
            cost: RESERVE,
        };
        let bucket = Bucket::of(&policy).unwrap();
        assert_eq!(bucket.interval_ns, INTERVAL_NS);
        let mut state = 0u64;
        let mut now = 1_000_000_000_000u64;
        let mut admitted: Vec<Admitted> = Vec::new();
        let mut in_flight: Vec<usize> = Vec::new();
        for step in steps {
            match step {
                Step::Arrive(dt, usage) => {
                    now += dt;
                    if in_flight.len() == C {
                        continue;
                    }
                    let (decision, next) = decide_word(state, now, &policy);
                    if decision.outcome == Outcome::Passed {
                        state = next.unwrap();
                        in_flight.push(admitted.len());
                        admitted.push(Admitted { at_ns: now, usage, settled: None });
                    }
                }
                Step::Settle(dt, index) => {
                    now += dt;
                    if in_flight.is_empty() {
                        continue;
                    }
                    let id = in_flight.swap_remove(index.index(in_flight.len()));
                    let usage = admitted[id].usage;
                    let refund = RESERVE.saturating_sub(usage);
                    if usage > RESERVE {
                        let (next, forgiven) =
                            charge_into_debt(state, now, &bucket, usage - RESERVE, 4_000_000);
                        prop_assert_eq!(forgiven, 0);
                        state = next;
                    } else if refund > 0 {
                        state = uncommit_word(state, now, &Policy { cost: refund, ..policy });
                    }
                    admitted[id].settled = Some((now, refund));
                }
            }
        }
        let overrun = admitted.iter().map(|a| a.usage.saturating_sub(RESERVE)).max().unwrap_or(0);
        for (first, start) in admitted.iter().enumerate() {
            for window_ns in [10 * INTERVAL_NS, 300 * INTERVAL_NS, 3000 * INTERVAL_NS] {
                let end = start.at_ns + window_ns;
                let used: u64 = admitted[first..]
                    .iter()
                    .filter(|a| a.at_ns <= end)
                    .map(|a| a.usage)
                    .sum();
                let given_back_from_before: u64 = admitted[..first]
                    .iter()
                    .filter(|a| a.at_ns < start.at_ns)
                    .filter_map(|a| a.settled)
                    .filter(|&(at, _)| at >= start.at_ns && at <= end)
                    .map(|(_, refund)| refund)
                    .sum();
                let refill = window_ns / INTERVAL_NS + 1;
                let bound = K + refill + C as u64 * overrun + given_back_from_before;
                prop_assert!(
                    used <= bound,
                    "window from request {} of {} ns: used {} > bound {}",
                    first, window_ns, used, bound
                );
            }
        }
    }
}
