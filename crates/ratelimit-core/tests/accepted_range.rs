//! Every limit the parsers accept is enforced, over the whole accepted range of rate × burst
//! × cost and at any time: no request passes beyond the limit, none panics, waits are finite
//! (or "never" exactly when no wait helps) and consistent with what a later request gets.
//!
//! `tests/properties.rs` checks the same properties in detail at everyday rates and clocks;
//! this file draws from the extremes: `0.001r/d` to `1099511627.775r/s`, bursts up to the
//! largest each rate takes, costs up to `u64::MAX`, clocks from 0 to `u64::MAX`.

use proptest::prelude::*;
use ratelimit_core::{
    decide_word, sliding_log, sliding_window, Algorithm, Decision, DelayMode, Limits, Outcome,
    Policy, Rate, RateUnit, ZoneSpec,
};

const MS: u64 = 1_000_000;
const SPAN: u64 = Limits::MAX_BUCKET_SPAN_NS;
/// Until this clock every accepted bucket is exact: a state is at most `K * T + τ` ahead and
/// a charge that can pass at most `K * T`, so a new `TAT` fits a `u64` (about 384 years).
const EXACT_UNTIL_NS: u64 = u64::MAX - 2 * SPAN - MS;

fn unit() -> impl Strategy<Value = RateUnit> {
    prop_oneof![
        Just(RateUnit::Second),
        Just(RateUnit::Minute),
        Just(RateUnit::Hour),
        Just(RateUnit::Day),
    ]
}

/// Any rate the grammar accepts, with its ends drawn often.
fn bucket_rate() -> impl Strategy<Value = Rate> {
    let milli = prop_oneof![
        2 => 1..=1_000u64,
        2 => 1..=Rate::MAX_MILLI_REQUESTS,
        1 => 1_000..=100_000_000u64,
        1 => prop_oneof![Just(1u64), Just(Rate::MAX_MILLI_REQUESTS)],
    ];
    (milli, unit()).prop_map(|(milli_requests, unit)| Rate {
        milli_requests,
        unit,
    })
}

/// A whole number of requests per unit, up to the algorithm's maximum.
fn sliding_rate(algorithm: Algorithm) -> impl Strategy<Value = Rate> {
    let max = match algorithm {
        Algorithm::SlidingLog => ZoneSpec::MAX_SLIDING_LOG_REQUESTS,
        _ => ZoneSpec::MAX_SLIDING_WINDOW_REQUESTS,
    };
    let requests = prop_oneof![2 => 1..=8u64, 1 => 1..=max, 1 => Just(max)];
    (requests, unit()).prop_map(|(requests, unit)| Rate {
        milli_requests: requests * 1000,
        unit,
    })
}

/// A burst from 0 to the largest the rate takes, its ends drawn often.
fn burst(max: u64) -> impl Strategy<Value = u64> {
    prop_oneof![
        2 => 0..=max.min(8),
        2 => 0..=max,
        1 => Just(max),
        1 => Just(max.saturating_sub(1)),
    ]
}

fn cost() -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => Just(1u64),
        3 => 1..=8u64,
        1 => 1..=u64::from(u32::MAX),
        1 => prop_oneof![Just(u64::from(u32::MAX)), Just(u64::MAX)],
        1 => any::<u64>().prop_map(|cost| cost.max(1)),
    ]
}

fn delay() -> impl Strategy<Value = DelayMode> {
    prop_oneof![
        Just(DelayMode::Delay),
        Just(DelayMode::NoDelay),
        (0..=8u64).prop_map(DelayMode::Threshold),
        any::<u64>().prop_map(DelayMode::Threshold),
    ]
}

/// A limit as `rate_limit_zone` parses it: the words are written out and read back, so only
/// what the grammar accepts is tested.
fn accepted(algorithm: Algorithm) -> impl Strategy<Value = (Limits, DelayMode)> {
    let rate = match algorithm {
        Algorithm::LeakyBucket | Algorithm::TokenBucket => bucket_rate().boxed(),
        sliding => sliding_rate(sliding).boxed(),
    };
    (rate, delay())
        .prop_flat_map(move |(rate, delay)| {
            let max = Limits::max_burst(algorithm, &rate);
            (Just(rate), burst(max), Just(delay))
        })
        .prop_map(move |(rate, burst, delay)| {
            let rate_word = format!("rate={rate}");
            let algorithm_word = format!("algorithm={algorithm}");
            let burst_word = format!("burst={burst}");
            let mut words = vec![rate_word.as_str(), algorithm_word.as_str()];
            if matches!(algorithm, Algorithm::LeakyBucket | Algorithm::TokenBucket) {
                words.push(&burst_word);
            }
            let spec = ZoneSpec::parse_words(&words).expect("an accepted limit");
            let delay = match algorithm {
                Algorithm::LeakyBucket => delay,
                _ => DelayMode::NoDelay,
            };
            (spec.limits(), delay)
        })
}

/// The largest cost a request may have and still pass on a fresh key: `K` for the buckets,
/// `N` for the sliding algorithms.
fn capacity(algorithm: Algorithm, limits: &Limits) -> u64 {
    let expected = match algorithm {
        Algorithm::LeakyBucket => limits.burst + 1,
        Algorithm::TokenBucket => limits.burst.max(1),
        Algorithm::SlidingLog => sliding_log::window_limit(&limits.rate),
        Algorithm::SlidingWindow => sliding_window::window_limit(&limits.rate),
        Algorithm::Concurrency | Algorithm::Quota(_) => unreachable!("not a rate algorithm"),
    };
    let policy = Policy {
        algorithm,
        limits: *limits,
        delay: DelayMode::NoDelay,
        cost: 1,
    };
    assert_eq!(policy.max_cost(), expected);
    expected
}

/// A clock anywhere in `u64`, the ends and the edge of the exact range drawn often.
fn start() -> impl Strategy<Value = u64> {
    prop_oneof![
        2 => 0..=1_000_000_000_000_000_000u64,
        2 => any::<u64>(),
        1 => EXACT_UNTIL_NS - 2 * SPAN..=EXACT_UNTIL_NS,
        1 => u64::MAX - 3 * SPAN..=u64::MAX,
        1 => prop_oneof![Just(0u64), Just(EXACT_UNTIL_NS), Just(u64::MAX)],
    ]
}

/// Gaps between requests in units of the policy's interval or window, from none to far more
/// than a bucket or window holds, and arbitrary ones.
fn gaps(step_ns: u64) -> impl Strategy<Value = Vec<u64>> {
    let gap = prop_oneof![
        4 => Just(0u64),
        3 => 0..=step_ns.saturating_mul(2),
        2 => (0..=64u64).prop_map(move |n| n.saturating_mul(step_ns)),
        1 => (0..=64u64, 0..=2u64).prop_map(move |(n, off)| {
            n.saturating_mul(step_ns).saturating_add(off).saturating_sub(1)
        }),
        1 => 0..=SPAN,
        1 => any::<u64>(),
    ];
    prop::collection::vec(gap, 1..48)
}

#[derive(Clone, Debug)]
struct Case {
    policy: Policy,
    start: u64,
    gaps: Vec<u64>,
    costs: Vec<u64>,
}

fn case(algorithm: Algorithm) -> impl Strategy<Value = Case> {
    (accepted(algorithm), start()).prop_flat_map(move |((limits, delay), start)| {
        let step_ns = match algorithm {
            Algorithm::LeakyBucket | Algorithm::TokenBucket => limits.rate.interval_ns(),
            _ => limits.rate.window_ns() / 4,
        };
        let policy = Policy {
            algorithm,
            limits,
            delay,
            cost: 1,
        };
        (
            Just(policy),
            Just(start),
            gaps(step_ns),
            prop::collection::vec(cost(), 48),
        )
            .prop_map(|(policy, start, gaps, costs)| Case {
                policy,
                start,
                gaps,
                costs,
            })
    })
}

/// A key's state for any algorithm.
#[derive(Clone, Debug, PartialEq)]
enum State {
    Word(u64),
    Log(Vec<u64>),
}

impl State {
    fn fresh(policy: &Policy) -> State {
        match policy.algorithm {
            Algorithm::SlidingLog => {
                let limit = sliding_log::window_limit(&policy.limits.rate);
                State::Log(vec![0; sliding_log::words_for(limit)])
            }
            _ => State::Word(0),
        }
    }

    fn decide(&mut self, now_ns: u64, policy: &Policy) -> Decision {
        match self {
            State::Word(word) => {
                let (decision, next) = decide_word(*word, now_ns, policy);
                if let Some(next) = next {
                    *word = next;
                }
                decision
            }
            State::Log(log) => sliding_log::decide(log, now_ns, policy),
        }
    }

    fn probe(&self, now_ns: u64, policy: &Policy) -> Decision {
        self.clone().decide(now_ns, policy)
    }
}

fn is_bucket(algorithm: Algorithm) -> bool {
    matches!(algorithm, Algorithm::LeakyBucket | Algorithm::TokenBucket)
}

/// Runs a case, checking every decision, and returns the charged requests `(now, cost)`.
fn run(case: &Case) -> Result<Vec<(u64, u64)>, TestCaseError> {
    let algorithm = case.policy.algorithm;
    let limits = case.policy.limits;
    let cap = capacity(algorithm, &limits);
    let interval_ns = u128::from(limits.rate.interval_ns());
    let tolerance = u128::from(limits.rate.jitter_tolerance_ns());
    let window_ns = limits.rate.window_ns();
    let mut state = State::fresh(&case.policy);
    let mut charged = Vec::new();
    let mut now = case.start;
    for (&gap, &cost) in case.gaps.iter().zip(&case.costs) {
        now = now.saturating_add(gap);
        let policy = Policy {
            cost,
            ..case.policy
        };
        let before = state.clone();
        let decision = state.decide(now, &policy);
        let context = format!("{policy:?} at {now}: {decision:?}");

        // Limits accepted by the grammar never need more than 64 bits before this clock (for
        // the sliding algorithms: while an entry's or a window's end fits).
        let exact = if is_bucket(algorithm) {
            now <= EXACT_UNTIL_NS
        } else {
            now <= u64::MAX - 4 * window_ns
        };
        match decision.outcome {
            Outcome::Passed | Outcome::Delayed => {
                prop_assert!(cost <= cap, "{context}");
                prop_assert_eq!(decision.retry_after_ns, 0, "{}", context);
                prop_assert_eq!(decision.outcome == Outcome::Delayed, decision.delay_ns > 0);
                charged.push((now, cost));
            }
            Outcome::Rejected => {
                prop_assert_eq!(&state, &before, "a rejection changed the state");
                prop_assert!(decision.retry_after_ns > 0, "{context}");
                let never = decision.never_passes();
                if cost > cap {
                    prop_assert!(never, "a cost above {cap} can never pass: {context}");
                } else if exact {
                    prop_assert!(!never, "{context}");
                }
                if !never {
                    let bound = if is_bucket(algorithm) {
                        u128::from(cost) * interval_ns + tolerance
                    } else {
                        4 * u128::from(window_ns)
                    };
                    prop_assert!(u128::from(decision.retry_after_ns) <= bound, "{context}");
                    // The same request passes after the wait, and not a nanosecond sooner.
                    if let Some(at) = now.checked_add(decision.retry_after_ns) {
                        let later = before.probe(at, &policy);
                        prop_assert_ne!(later.outcome, Outcome::Rejected, "at retry: {}", context);
                        let sooner = before.probe(at - 1, &policy);
                        prop_assert_eq!(sooner.outcome, Outcome::Rejected, "before: {}", context);
                    }
                }
            }
        }

        // `reset_ns` is finite and at most a full bucket or two windows away.
        let reset_bound = if is_bucket(algorithm) {
            u128::from(cap) * interval_ns + tolerance
        } else {
            2 * u128::from(window_ns)
        };
        prop_assert!(
            u128::from(decision.reset_ns) <= reset_bound,
            "reset: {context}"
        );

        // `remaining` requests of cost 1 pass now, one more does not (as one request of
        // that cost: the same for every algorithm).
        prop_assert!(decision.remaining <= cap, "{context}");
        if exact {
            let one = Policy {
                cost: decision.remaining + 1,
                ..policy
            };
            prop_assert_eq!(
                state.probe(now, &one).outcome,
                Outcome::Rejected,
                "{}",
                context
            );
            if decision.remaining > 0 {
                let all = Policy {
                    cost: decision.remaining,
                    ..policy
                };
                let passes = state.probe(now, &all).outcome != Outcome::Rejected;
                prop_assert!(passes, "remaining: {}", context);
            }
        }
    }
    Ok(charged)
}

/// Buckets: over the charged requests `i..=j`, `sum(cost) * T <= t_j - t_i + K * T + τ`.
fn check_bucket_bound(case: &Case, charged: &[(u64, u64)]) -> Result<(), TestCaseError> {
    let limits = case.policy.limits;
    let cap = u128::from(capacity(case.policy.algorithm, &limits));
    let interval_ns = u128::from(limits.rate.interval_ns());
    let tolerance = u128::from(limits.rate.jitter_tolerance_ns());
    for (i, &(first, _)) in charged.iter().enumerate() {
        let mut taken = 0u128;
        for &(last, cost) in &charged[i..] {
            taken += u128::from(cost);
            let allowed = u128::from(last - first) + cap * interval_ns + tolerance;
            prop_assert!(
                taken * interval_ns <= allowed,
                "{taken} charged between {first} and {last}: {case:?}"
            );
        }
    }
    Ok(())
}

/// Sliding algorithms: at most `N` in any half-open window of `W` (the log) or in any
/// aligned window (the counter, hence `2N` in any window of `W`).
fn check_window_bound(case: &Case, charged: &[(u64, u64)]) -> Result<(), TestCaseError> {
    let limits = case.policy.limits;
    let limit = capacity(case.policy.algorithm, &limits);
    let window_ns = limits.rate.window_ns();
    for (i, &(first, _)) in charged.iter().enumerate() {
        let in_window: u64 = charged[i..]
            .iter()
            .take_while(|(t, _)| u128::from(*t) < u128::from(first) + u128::from(window_ns))
            .map(|(_, cost)| cost)
            .sum();
        let bound = match case.policy.algorithm {
            Algorithm::SlidingLog => limit,
            _ => 2 * limit,
        };
        prop_assert!(in_window <= bound, "{in_window} from {first}: {case:?}");
        if case.policy.algorithm == Algorithm::SlidingWindow {
            let aligned: u64 = charged[i..]
                .iter()
                .take_while(|(t, _)| t / window_ns == first / window_ns)
                .map(|(_, cost)| cost)
                .sum();
            prop_assert!(aligned <= limit, "{aligned} in window of {first}: {case:?}");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn leaky_bucket_enforces_every_accepted_limit(case in case(Algorithm::LeakyBucket)) {
        let charged = run(&case)?;
        check_bucket_bound(&case, &charged)?;
    }

    #[test]
    fn token_bucket_enforces_every_accepted_limit(case in case(Algorithm::TokenBucket)) {
        let charged = run(&case)?;
        check_bucket_bound(&case, &charged)?;
    }

    #[test]
    fn sliding_window_enforces_every_accepted_limit(case in case(Algorithm::SlidingWindow)) {
        let charged = run(&case)?;
        check_window_bound(&case, &charged)?;
    }

    #[test]
    fn sliding_log_enforces_every_accepted_limit(case in case(Algorithm::SlidingLog)) {
        let charged = run(&case)?;
        check_window_bound(&case, &charged)?;
    }

    /// A fresh key takes exactly `floor(K / c)` requests of cost `c` at one instant, at any
    /// clock in the exact range: the whole bucket, not less and not more.
    #[test]
    fn a_fresh_bucket_holds_exactly_its_capacity(
        token in any::<bool>(),
        (limits, delay) in prop_oneof![
            accepted(Algorithm::LeakyBucket),
            accepted(Algorithm::TokenBucket),
        ],
        cost in prop_oneof![3 => Just(1u64), 1 => 1..=64u64],
        now in prop_oneof![0..=EXACT_UNTIL_NS, Just(EXACT_UNTIL_NS)],
    ) {
        let algorithm = if token { Algorithm::TokenBucket } else { Algorithm::LeakyBucket };
        let burst = limits.burst.min(Limits::max_burst(algorithm, &limits.rate));
        let limits = Limits { burst, ..limits };
        let policy = Policy { algorithm, limits, delay, cost };
        let cap = capacity(algorithm, &limits);
        let fits = cap / cost;
        let mut state = 0;
        // Up to 2000 requests one by one, then the rest as one request of their total cost.
        let one_by_one = fits.min(2000);
        for i in 0..one_by_one {
            let (decision, next) = decide_word(state, now, &policy);
            prop_assert_ne!(decision.outcome, Outcome::Rejected, "request {} of {}", i, fits);
            state = next.unwrap();
        }
        let rest = Policy { cost: (fits - one_by_one) * cost, ..policy };
        if rest.cost > 0 {
            let (decision, next) = decide_word(state, now, &rest);
            prop_assert_ne!(decision.outcome, Outcome::Rejected);
            state = next.unwrap();
        }
        let (decision, next) = decide_word(state, now, &policy);
        prop_assert_eq!(decision.outcome, Outcome::Rejected);
        prop_assert_eq!(next, None);
        if cost <= cap {
            prop_assert!(decision.retry_after_ns <= cost * limits.rate.interval_ns());
        }
    }

    /// The parsers accept a bucket's burst exactly up to `Limits::max_burst`, and the error
    /// beyond it names that largest value.
    #[test]
    fn the_parsers_refuse_exactly_beyond_the_largest_burst(
        token in any::<bool>(),
        rate in bucket_rate(),
        beyond in 1..=1_000u64,
    ) {
        let algorithm = if token { Algorithm::TokenBucket } else { Algorithm::LeakyBucket };
        let max = Limits::max_burst(algorithm, &rate);
        let words = |burst: u64| {
            let words = [format!("rate={rate}"), format!("burst={burst}"),
                         format!("algorithm={algorithm}")];
            ZoneSpec::parse_words(&words.iter().map(String::as_str).collect::<Vec<_>>())
        };
        prop_assert!(words(max).is_ok());
        let burst = max + beyond;
        if burst <= Limits::MAX_BURST {
            let error = words(burst).unwrap_err().to_string();
            prop_assert!(error.contains(&format!("(at most {max}:")), "{}", error);
        }
        let largest = u128::from(capacity(algorithm, &Limits { rate, burst: max }));
        prop_assert!(largest * u128::from(rate.interval_ns()) <= u128::from(SPAN));
    }

    /// A backlog re-expressed at a new rate stays within the span of the largest bucket.
    #[test]
    fn rescaling_never_leaves_a_state_beyond_the_largest_bucket(
        old in bucket_rate(),
        new in bucket_rate(),
        now in 0..=EXACT_UNTIL_NS,
        ahead in prop_oneof![0..=SPAN, any::<u64>()],
    ) {
        let state = now.saturating_add(ahead);
        let rescaled = ratelimit_core::rescale_word(state, now, Algorithm::LeakyBucket, &old, &new);
        prop_assert!(rescaled <= now + SPAN);
    }
}

/// The case: `rate=0.001r/d` with the largest burst each bucket takes, 400 requests at
/// one instant. Before the bound the burst could be 300 and everything passed once the
/// bucket's time saturated; now exactly the bucket passes, at any clock in the exact range.
#[test]
fn the_slowest_rate_with_the_largest_burst_passes_exactly_the_bucket() {
    for (algorithm, burst, passes) in [
        (Algorithm::LeakyBucket, 35, 36),
        (Algorithm::TokenBucket, 36, 36),
    ] {
        let words = [
            "rate=0.001r/d".to_string(),
            format!("burst={burst}"),
            format!("algorithm={algorithm}"),
        ];
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        let limits = ZoneSpec::parse_words(&words).unwrap().limits();
        for now in [0, 1_000_000_000_000_000, EXACT_UNTIL_NS] {
            let policy = Policy {
                algorithm,
                limits,
                delay: DelayMode::NoDelay,
                cost: 1,
            };
            let mut state = 0;
            let mut passed = 0;
            for _ in 0..400 {
                if let (_, Some(next)) = decide_word(state, now, &policy) {
                    state = next;
                    passed += 1;
                }
            }
            assert_eq!(passed, passes, "{algorithm} at {now}");
            let (rejected, _) = decide_word(state, now, &policy);
            // One interval: 1000 days.
            assert_eq!(rejected.retry_after_ns, 86_400_000 * MS * 1000);
        }
    }
}

/// Limits nothing validated (the old bound of 300 at `0.001r/d`): the bucket cannot be
/// represented past about 213 requests, and from there it rejects rather than passes.
#[test]
fn a_bucket_beyond_the_span_rejects_rather_than_passes() {
    let limits = Limits {
        rate: Rate::parse("0.001r/d").unwrap(),
        burst: 300,
    };
    for algorithm in [Algorithm::LeakyBucket, Algorithm::TokenBucket] {
        let policy = Policy {
            algorithm,
            limits,
            delay: DelayMode::NoDelay,
            cost: 1,
        };
        let now = 1_000_000_000_000_000;
        let mut state = 0;
        let mut passed = 0;
        for _ in 0..400 {
            let (decision, next) = decide_word(state, now, &policy);
            match next {
                Some(next) => {
                    state = next;
                    passed += 1;
                }
                None => assert!(decision.never_passes(), "{decision:?}"),
            }
        }
        assert!((200..=300).contains(&passed), "{algorithm}: {passed}");
    }
}
