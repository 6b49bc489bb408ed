//! The algorithms decide exactly as [`crate::reference`], their slower first versions: every
//! field of every decision, every new state and every changed log, on random inputs from the
//! extremes (`u64::MAX` clocks and states, 0.001r/d to 10^9 r/s, costs up to `u32::MAX` and
//! beyond) and from realistic timelines (clocks around 10^15 ns, 1 to 10,000 r/s).

use proptest::prelude::*;

use crate::decide::{
    decide_word, rescale_word, standing_policy, word_idle_at_ns, word_idle_at_ns_near,
};
use crate::policy::{Algorithm, DelayMode, Limits, Policy};
use crate::rate::{Rate, RateUnit};
use crate::reference;
use crate::sliding_log;

const SECOND: u64 = 1_000_000_000;
/// About 11.6 days of uptime on `CLOCK_MONOTONIC`.
const UPTIME_NS: u64 = 1_000_000_000_000_000;

fn unit() -> impl Strategy<Value = RateUnit> {
    prop_oneof![
        Just(RateUnit::Second),
        Just(RateUnit::Minute),
        Just(RateUnit::Hour),
        Just(RateUnit::Day),
    ]
}

/// Rates from realistic (1..10,000 r/s) to the extremes a `Rate` can hold, valid or not.
fn milli_requests() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 1_000..=10_000_000u64,
        2 => (1..=10_000u64).prop_map(|n| n * 1000),
        2 => 1..=Rate::MAX_MILLI_REQUESTS,
        1 => 1..=2_000u64,
        1 => prop_oneof![
            Just(0u64),
            Just(1),
            Just(999),
            Just(1_000_000_000_000),
            Just(Rate::MAX_MILLI_REQUESTS),
            Just(u64::MAX),
        ],
        1 => any::<u64>(),
    ]
}

fn rate() -> impl Strategy<Value = Rate> {
    (milli_requests(), unit()).prop_map(|(milli_requests, unit)| Rate {
        milli_requests,
        unit,
    })
}

/// Whole requests per unit, as the sliding algorithms are configured, and sometimes not.
fn sliding_rate() -> impl Strategy<Value = Rate> {
    let milli = prop_oneof![
        4 => (1..=100u64).prop_map(|n| n * 1000),
        2 => (1..=(1u64 << 20)).prop_map(|n| n * 1000),
        1 => milli_requests(),
    ];
    (milli, unit()).prop_map(|(milli_requests, unit)| Rate {
        milli_requests,
        unit,
    })
}

fn burst() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 0..=10u64,
        2 => 0..=Limits::MAX_BURST,
        1 => Just(Limits::MAX_BURST),
        1 => any::<u64>(),
    ]
}

fn cost() -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => Just(1u64),
        3 => 1..=5u64,
        2 => 1..=u64::from(u32::MAX),
        1 => prop_oneof![Just(0u64), Just(u64::from(u32::MAX)), Just(u64::MAX)],
        1 => any::<u64>(),
    ]
}

fn delay() -> impl Strategy<Value = DelayMode> {
    prop_oneof![
        Just(DelayMode::Delay),
        Just(DelayMode::NoDelay),
        (0..=10u64).prop_map(DelayMode::Threshold),
        any::<u64>().prop_map(DelayMode::Threshold),
    ]
}

fn algorithm() -> impl Strategy<Value = Algorithm> {
    prop_oneof![
        Just(Algorithm::LeakyBucket),
        Just(Algorithm::TokenBucket),
        Just(Algorithm::SlidingWindow),
        Just(Algorithm::SlidingLog),
    ]
}

fn now() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => UPTIME_NS - 1_000 * SECOND..UPTIME_NS + 1_000 * SECOND,
        1 => 0..=10 * SECOND,
        1 => u64::MAX - 1_000 * SECOND..=u64::MAX,
        1 => prop_oneof![Just(0u64), Just(u64::MAX)],
        2 => any::<u64>(),
    ]
}

/// A single-word state as seen at `now`: fresh, a little behind or ahead of the clock (by
/// whole and partial intervals or windows), or anything at all.
fn word_state(now: u64, rate: Rate) -> impl Strategy<Value = u64> {
    let interval = reference::interval_ns(&rate).max(1);
    let window_index = now / rate.unit.nanos();
    // A sliding window state: index near now's (behind or ahead), counts near and far.
    let count = prop_oneof![0..=4u64, 0..=200u64, 0..=(1u64 << 20) - 1];
    let relative_index = prop_oneof![0..=4u64, (1u64 << 24) - 4..(1u64 << 24), any::<u64>()];
    let sliding = (relative_index, count.clone(), count).prop_map(move |(back, prev, cur)| {
        (window_index.wrapping_sub(back) << 40) | (prev << 20) | cur
    });
    prop_oneof![
        2 => Just(0u64),
        3 => (0..=64u64, 0..interval).prop_map(move |(n, part)| {
            now.saturating_add(n.saturating_mul(interval)).saturating_add(part)
        }),
        2 => (0..=64u64).prop_map(move |n| now.saturating_add(n.saturating_mul(interval))),
        1 => (0..=64u64, 0..interval).prop_map(move |(n, part)| {
            now.saturating_sub(n.saturating_mul(interval)).saturating_sub(part)
        }),
        3 => sliding,
        1 => prop_oneof![Just(u64::MAX), Just(1u64), Just(now)],
        2 => any::<u64>(),
    ]
}

fn word_case() -> impl Strategy<Value = (Policy, u64, u64)> {
    (
        algorithm(),
        rate(),
        sliding_rate(),
        burst(),
        delay(),
        cost(),
        now(),
    )
        .prop_flat_map(|(algorithm, rate, sliding_rate, burst, delay, cost, now)| {
            let rate = match algorithm {
                Algorithm::SlidingWindow | Algorithm::SlidingLog => sliding_rate,
                _ => rate,
            };
            let policy = Policy {
                algorithm,
                limits: Limits { rate, burst },
                delay,
                cost,
            };
            (Just(policy), word_state(now, rate), Just(now))
        })
}

/// Whether the reference (written before buckets forgave sub-millisecond jitter) still
/// decides like the algorithms: not for buckets whose interval is under a millisecond.
fn reference_applies(policy: &Policy) -> bool {
    matches!(
        policy.algorithm,
        Algorithm::SlidingLog | Algorithm::SlidingWindow
    ) || policy.limits.rate.interval_ns() >= crate::rate::JITTER_FORGIVEN_BELOW_NS
}

/// Every word function on one `(policy, state, now)`.
fn check_word(policy: &Policy, state: u64, now: u64) -> Result<(), TestCaseError> {
    if !reference_applies(policy) {
        return Ok(());
    }
    prop_assert_eq!(
        decide_word(state, now, policy),
        reference::decide_word(state, now, policy)
    );
    let standing = standing_policy(policy);
    prop_assert_eq!(standing, reference::standing_policy(policy));
    prop_assert_eq!(
        decide_word(state, now, &standing),
        reference::decide_word(state, now, &standing)
    );
    let (limits, algorithm) = (&policy.limits, policy.algorithm);
    prop_assert_eq!(
        word_idle_at_ns(state, limits, algorithm),
        reference::word_idle_at_ns(state, limits, algorithm)
    );
    prop_assert_eq!(
        word_idle_at_ns_near(state, limits, algorithm, now),
        reference::word_idle_at_ns_near(state, limits, algorithm, now)
    );
    Ok(())
}

/// One request of a realistic timeline: the gap since the previous one and its cost.
fn steps(max_len: usize) -> impl Strategy<Value = Vec<(u64, u64)>> {
    let gap = prop_oneof![
        3 => Just(0u64),
        4 => 0..30_000_000u64,
        2 => 0..3 * SECOND,
        1 => 0..200 * SECOND,
    ];
    let cost = prop_oneof![8 => Just(1u64), 2 => 1..=4u64, 1 => 1..=100u64];
    prop::collection::vec((gap, cost), 1..max_len)
}

fn realistic_policy(algorithm: Algorithm) -> impl Strategy<Value = Policy> {
    let milli = match algorithm {
        Algorithm::SlidingWindow | Algorithm::SlidingLog => {
            (1..=10_000u64).prop_map(|n| n * 1000).boxed()
        }
        _ => (1_000..=10_000_000u64).boxed(),
    };
    let burst = prop_oneof![0..=10u64, 0..=1_000u64];
    let unit = prop_oneof![4 => Just(RateUnit::Second), 1 => unit()];
    (milli, unit, burst, delay()).prop_map(move |(milli_requests, unit, burst, delay)| Policy {
        algorithm,
        limits: Limits {
            rate: Rate {
                milli_requests,
                unit,
            },
            burst,
        },
        delay,
        cost: 1,
    })
}

/// A log as a worker may find it: well-formed (sorted from the head, header in range) or not.
/// Entries come from a seeded xorshift rather than one strategy each, so that logs of 4096
/// entries are cheap to make.
fn log_case() -> impl Strategy<Value = (Policy, Vec<u64>, u64)> {
    let limit = prop_oneof![4 => 1..=8u64, 2 => 0..=64u64, 1 => 4090..=4100u64];
    let header = prop_oneof![
        4 => (0..=4_200u64, 0..=4_200u64).prop_map(|(head, count)| (head << 32) | count),
        1 => any::<u64>(),
    ];
    let extra = prop_oneof![6 => Just(0usize), 1 => 0..=3usize];
    let short = prop_oneof![8 => Just(0usize), 1 => 1..=8usize];
    let shape = (extra, short, any::<bool>(), any::<u64>());
    (limit, unit(), cost(), now(), header, shape).prop_map(
        |(limit, unit, cost, now, header, (extra, short, sorted, seed))| {
            let policy = Policy {
                algorithm: Algorithm::SlidingLog,
                limits: Limits {
                    rate: Rate {
                        milli_requests: limit * 1000,
                        unit,
                    },
                    burst: 0,
                },
                delay: DelayMode::NoDelay,
                cost,
            };
            let capacity = (limit as usize + extra).saturating_sub(short);
            let window = unit.nanos();
            let mut random = seed | 1;
            let mut next = move || {
                random ^= random << 13;
                random ^= random >> 7;
                random ^= random << 17;
                random
            };
            let mut entries: Vec<u64> = (0..capacity)
                .map(|_| match next() % 8 {
                    0..=4 => now.saturating_sub(next() % (2 * window + 1)),
                    5 | 6 => now.saturating_add(next() % (window + 1)),
                    _ => next(),
                })
                .collect();
            if sorted && !entries.is_empty() {
                entries.sort_unstable();
                let head = ((header >> 32) as usize) % entries.len();
                entries.rotate_right(head);
            }
            let mut log = vec![header];
            log.extend(entries);
            (policy, log, now)
        },
    )
}

fn check_log(log: &[u64], now: u64, policy: &Policy) -> Result<(), TestCaseError> {
    prop_assert_eq!(
        sliding_log::inspect(log, now, policy),
        reference::sliding_log::inspect(log, now, policy)
    );
    let standing = standing_policy(policy);
    prop_assert_eq!(
        sliding_log::inspect(log, now, &standing),
        reference::sliding_log::inspect(log, now, &standing)
    );
    prop_assert_eq!(
        sliding_log::idle_at_ns(log, &policy.limits),
        reference::sliding_log::idle_at_ns(log, &policy.limits)
    );
    let mut ours = log.to_vec();
    let mut theirs = log.to_vec();
    prop_assert_eq!(
        sliding_log::decide(&mut ours, now, policy),
        reference::sliding_log::decide(&mut theirs, now, policy)
    );
    prop_assert_eq!(ours, theirs);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

    #[test]
    fn interval_is_the_reference(rate in rate()) {
        prop_assert_eq!(rate.interval_ns(), reference::interval_ns(&rate));
    }

    #[test]
    fn word_decisions_are_the_reference((policy, state, now) in word_case()) {
        check_word(&policy, state, now)?;
    }

    #[test]
    fn rescaling_is_the_reference(
        algorithm in algorithm(),
        (old, new) in (rate(), rate()),
        now in now(),
        ahead in prop_oneof![0..=1_000 * SECOND, any::<u64>()],
    ) {
        for state in [0, now.saturating_add(ahead), now.saturating_sub(ahead), u64::MAX] {
            prop_assert_eq!(
                rescale_word(state, now, algorithm, &old, &new),
                reference::rescale_word(state, now, algorithm, &old, &new)
            );
        }
    }

    #[test]
    fn log_decisions_are_the_reference((policy, log, now) in log_case()) {
        check_log(&log, now, &policy)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// States reached by real traffic, decided step by step on both sides.
    #[test]
    fn word_timelines_are_the_reference(
        policy in prop_oneof![
            realistic_policy(Algorithm::LeakyBucket),
            realistic_policy(Algorithm::TokenBucket),
            realistic_policy(Algorithm::SlidingWindow),
        ],
        start in prop_oneof![Just(UPTIME_NS), 0..=u64::MAX / 2],
        steps in steps(80),
    ) {
        let mut state = 0;
        let mut now = start;
        for (gap, cost) in steps {
            now = now.saturating_add(gap);
            let policy = Policy { cost, ..policy };
            check_word(&policy, state, now)?;
            if let (_, Some(next)) = decide_word(state, now, &policy) {
                state = next;
            }
        }
    }

    #[test]
    fn log_timelines_are_the_reference(
        policy in realistic_policy(Algorithm::SlidingLog)
            .prop_filter("a log of at most 100 entries", |policy| {
                policy.limits.rate.milli_requests <= 100_000
            }),
        start in prop_oneof![Just(UPTIME_NS), 0..=u64::MAX / 2],
        steps in steps(120),
    ) {
        let limit = sliding_log::window_limit(&policy.limits.rate);
        let mut log = vec![0; sliding_log::words_for(limit)];
        let mut now = start;
        for (gap, cost) in steps {
            now = now.saturating_add(gap / 8);
            let policy = Policy { cost, ..policy };
            check_log(&log, now, &policy)?;
            sliding_log::decide(&mut log, now, &policy);
        }
    }
}
