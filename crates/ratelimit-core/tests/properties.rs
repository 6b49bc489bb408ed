//! Properties of every algorithm over random timelines: the limit is never exceeded, waits
//! and counts are exact, states stay well-formed, and no input panics.

use proptest::prelude::*;
use ratelimit_core::{
    decide_word, leaky_bucket, sliding_log, sliding_window, word_idle_at_ns, Algorithm, Decision,
    DelayMode, Limits, Outcome, Policy, Rate, RateUnit,
};

const SECOND: u64 = 1_000_000_000;

/// One request of a timeline: absolute time and cost.
#[derive(Clone, Copy, Debug)]
struct Request {
    now_ns: u64,
    cost: u64,
}

/// Gaps mixing bursts (0), sub-interval gaps and long pauses; costs mostly 1.
fn timeline(max_len: usize) -> impl Strategy<Value = Vec<Request>> {
    let gap = prop_oneof![
        3 => Just(0u64),
        4 => 0..300_000_000u64,
        2 => 0..3 * SECOND,
        1 => Just(1u64),
    ];
    timeline_of(gap, max_len)
}

/// The same at microsecond scale, for rates over 1000 r/s (intervals under a millisecond).
fn fast_timeline(max_len: usize) -> impl Strategy<Value = Vec<Request>> {
    let gap =
        prop_oneof![3 => Just(0u64), 4 => 0..400_000u64, 2 => 0..3_000_000u64, 1 => Just(1u64)];
    timeline_of(gap, max_len)
}

/// Requests at the running sum of `gap`s, costs mostly 1.
fn timeline_of(
    gap: impl Strategy<Value = u64>,
    max_len: usize,
) -> impl Strategy<Value = Vec<Request>> {
    let cost = prop_oneof![4 => Just(1u64), 1 => 1..4u64];
    prop::collection::vec((gap, cost), 1..max_len).prop_map(|steps| {
        let mut now_ns = 0u64;
        steps
            .into_iter()
            .map(|(gap, cost)| {
                now_ns += gap;
                Request { now_ns, cost }
            })
            .collect()
    })
}

/// A rate in milli-requests per second and a timeline for it: 0.5 to 20 r/s on a
/// millisecond-and-up timeline, or 2000 to 20000 r/s (where the buckets forgive jitter) on a
/// microsecond one.
fn rate_and_timeline() -> impl Strategy<Value = (u64, Vec<Request>)> {
    prop_oneof![
        (500..20_000u64, timeline(60)),
        (2_000_000..20_000_000u64, fast_timeline(60)),
    ]
}

fn policy(algorithm: Algorithm, milli_requests: u64, burst: u64, delay: DelayMode) -> Policy {
    Policy {
        algorithm,
        limits: Limits {
            rate: Rate {
                milli_requests,
                unit: RateUnit::Second,
            },
            burst,
        },
        delay,
        cost: 1,
    }
}

fn delay_mode() -> impl Strategy<Value = DelayMode> {
    prop_oneof![
        Just(DelayMode::Delay),
        Just(DelayMode::NoDelay),
        (0..6u64).prop_map(DelayMode::Threshold),
    ]
}

/// A key's state for any algorithm, so one driver runs them all.
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

    /// Decide and store, as a caller would.
    fn decide(&mut self, now_ns: u64, policy: &Policy) -> Decision {
        match self {
            State::Word(word) => {
                let (decision, new_state) = decide_word(*word, now_ns, policy);
                if let Some(new_state) = new_state {
                    *word = new_state;
                }
                decision
            }
            State::Log(log) => sliding_log::decide(log, now_ns, policy),
        }
    }

    /// The decision without keeping the change.
    fn probe(&self, now_ns: u64, policy: &Policy) -> Decision {
        self.clone().decide(now_ns, policy)
    }

    fn idle_at_ns(&self, now_ns: u64, policy: &Policy) -> u64 {
        match (self, policy.algorithm) {
            (State::Word(word), Algorithm::SlidingWindow) => {
                sliding_window::idle_at_ns_near(*word, &policy.limits, now_ns)
            }
            (State::Word(word), algorithm) => word_idle_at_ns(*word, &policy.limits, algorithm),
            (State::Log(log), _) => sliding_log::idle_at_ns(log, &policy.limits),
        }
    }
}

/// Runs the timeline, checking after every request what can be checked locally, and returns
/// the passed (or delayed) requests.
fn run(policy: &Policy, requests: &[Request], exact_retry: bool) -> Vec<Request> {
    let mut state = State::fresh(policy);
    let mut charged = Vec::new();
    for &Request { now_ns, cost } in requests {
        let policy = Policy { cost, ..*policy };
        let before = state.clone();
        let decision = state.decide(now_ns, &policy);
        check_decision(&policy, &decision);
        if decision.outcome == Outcome::Rejected {
            assert_eq!(state, before, "a rejection changed the state");
            if exact_retry && decision.retry_after_ns > 0 && can_ever_pass(&policy) {
                let at = now_ns + decision.retry_after_ns;
                assert_ne!(
                    before.probe(at, &policy).outcome,
                    Outcome::Rejected,
                    "at retry"
                );
                assert_eq!(
                    before.probe(at - 1, &policy).outcome,
                    Outcome::Rejected,
                    "before"
                );
            }
        } else {
            charged.push(Request { now_ns, cost });
        }
        check_remaining(&state, now_ns, &policy, decision.remaining);
        check_reset(&state, now_ns, &policy, decision.reset_ns);
        check_well_formed(&state, now_ns, &policy);
    }
    charged
}

fn check_decision(policy: &Policy, decision: &Decision) {
    match decision.outcome {
        Outcome::Passed => assert_eq!((decision.delay_ns, decision.retry_after_ns), (0, 0)),
        Outcome::Delayed => {
            assert_eq!(policy.algorithm, Algorithm::LeakyBucket);
            assert!(decision.delay_ns > 0);
            assert_eq!(decision.retry_after_ns, 0);
        }
        Outcome::Rejected => {
            assert_eq!(decision.delay_ns, 0);
            assert!(decision.retry_after_ns > 0, "{decision:?}");
        }
    }
}

/// Whether a request of this cost passes on a fresh key.
fn can_ever_pass(policy: &Policy) -> bool {
    State::fresh(policy).probe(0, policy).outcome != Outcome::Rejected
}

/// Exactly `remaining` requests of cost 1 at the same instant are not rejected.
fn check_remaining(state: &State, now_ns: u64, policy: &Policy, remaining: u64) {
    let one = Policy { cost: 1, ..*policy };
    let mut state = state.clone();
    for i in 0..remaining {
        assert_ne!(
            state.decide(now_ns, &one).outcome,
            Outcome::Rejected,
            "remaining {i}"
        );
    }
    assert_eq!(
        state.decide(now_ns, &one).outcome,
        Outcome::Rejected,
        "past remaining"
    );
}

/// At `now + reset` (and at `idle_at`) the key decides like a fresh one; a nanosecond before
/// a non-zero reset it does not (the sliding window excepted: rounding down the decaying
/// count may hide the last nanoseconds).
fn check_reset(state: &State, now_ns: u64, policy: &Policy, reset_ns: u64) {
    let fresh = State::fresh(policy);
    let at = now_ns + reset_ns;
    assert_eq!(state.probe(at, policy), fresh.probe(at, policy), "at reset");
    let idle_at = state.idle_at_ns(now_ns, policy);
    assert_eq!(idle_at.max(now_ns), at, "idle_at");
    if reset_ns > 0 && policy.algorithm != Algorithm::SlidingWindow {
        assert_ne!(
            state.probe(at - 1, policy),
            fresh.probe(at - 1, policy),
            "before reset"
        );
    }
}

fn check_well_formed(state: &State, now_ns: u64, policy: &Policy) {
    let interval_ns = policy.limits.rate.interval_ns();
    let tolerance = policy.limits.rate.jitter_tolerance_ns();
    match (state, policy.algorithm) {
        (State::Word(tat), Algorithm::LeakyBucket) => {
            let capacity = (policy.limits.burst + 1) * interval_ns;
            assert!(*tat <= now_ns + capacity.max(policy.cost * interval_ns) + tolerance);
        }
        (State::Word(tat), Algorithm::TokenBucket) => {
            let capacity = policy.limits.burst.max(1) * interval_ns;
            assert!(*tat <= now_ns + capacity.max(policy.cost * interval_ns) + tolerance);
        }
        (State::Word(word), Algorithm::SlidingWindow) => {
            let limit = sliding_window::window_limit(&policy.limits.rate);
            let (prev, cur) = ((word >> 20) & 0xF_FFFF, word & 0xF_FFFF);
            assert!(prev <= limit && cur <= limit, "{prev} {cur}");
        }
        (State::Log(log), _) => {
            let count = (log[0] & 0xFFFF_FFFF) as usize;
            let head = (log[0] >> 32) as usize;
            let ring = &log[1..];
            assert!(count <= sliding_log::window_limit(&policy.limits.rate) as usize);
            assert!(head < ring.len());
            let entries: Vec<u64> = (0..count).map(|i| ring[(head + i) % ring.len()]).collect();
            assert!(
                entries.windows(2).all(|pair| pair[0] <= pair[1]),
                "{entries:?}"
            );
            assert!(entries.iter().all(|&t| t <= now_ns));
        }
        (state, algorithm) => panic!("{state:?} for {algorithm}"),
    }
}

/// The largest total cost charged within `span_ns` of some charged request, the interval
/// closed (`[t, t + span]`) or half-open (`[t, t + span)`).
fn max_in_any_interval(charged: &[Request], span_ns: u64, closed: bool) -> u64 {
    charged
        .iter()
        .enumerate()
        .map(|(i, first)| {
            charged[i..]
                .iter()
                .take_while(|r| {
                    let end = first.now_ns + span_ns;
                    r.now_ns < end || (closed && r.now_ns == end)
                })
                .map(|r| r.cost)
                .sum()
        })
        .max()
        .unwrap_or(0)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Token bucket: in any closed interval of length `L`, the tokens taken are at most
    /// `K + L / T`, i.e. `taken * T <= K * T + L` exactly (`+ τ` where the bucket forgives
    /// jitter, under a millisecond).
    #[test]
    fn token_bucket_never_exceeds_capacity_plus_refill(
        (milli, requests) in rate_and_timeline(),
        burst in 0..8u64,
    ) {
        let policy = policy(Algorithm::TokenBucket, milli, burst, DelayMode::NoDelay);
        let charged = run(&policy, &requests, true);
        let interval_ns = policy.limits.rate.interval_ns();
        let tolerance = policy.limits.rate.jitter_tolerance_ns();
        let capacity = burst.max(1);
        for (i, first) in charged.iter().enumerate() {
            let mut taken = 0;
            for last in &charged[i..] {
                taken += last.cost;
                let span_ns = last.now_ns - first.now_ns;
                prop_assert!(taken * interval_ns <= capacity * interval_ns + span_ns + tolerance);
            }
        }
    }

    /// Leaky bucket: the same bound with `burst + 1` in place of `K`, whatever the delay mode;
    /// and the delay mode never changes which requests are rejected.
    #[test]
    fn leaky_bucket_never_exceeds_burst_plus_rate(
        (milli, requests) in rate_and_timeline(),
        burst in 0..8u64,
        delay in delay_mode(),
    ) {
        let policy = policy(Algorithm::LeakyBucket, milli, burst, delay);
        let charged = run(&policy, &requests, true);
        let interval_ns = policy.limits.rate.interval_ns();
        let tolerance = policy.limits.rate.jitter_tolerance_ns();
        for (i, first) in charged.iter().enumerate() {
            let mut taken = 0;
            for last in &charged[i..] {
                taken += last.cost;
                let span_ns = last.now_ns - first.now_ns;
                prop_assert!(
                    taken * interval_ns <= (burst + 1) * interval_ns + span_ns + tolerance
                );
            }
        }
        let nodelay = Policy { delay: DelayMode::NoDelay, ..policy };
        let times = |list: Vec<Request>| list.iter().map(|r| r.now_ns).collect::<Vec<_>>();
        prop_assert_eq!(times(charged), times(run(&nodelay, &requests, false)));
    }

    /// Sliding log: at most N in any half-open window of length W.
    #[test]
    fn sliding_log_never_exceeds_n_per_window(limit in 1..8u64, requests in timeline(60)) {
        let policy = policy(Algorithm::SlidingLog, limit * 1000, 0, DelayMode::NoDelay);
        let charged = run(&policy, &requests, true);
        prop_assert!(max_in_any_interval(&charged, SECOND, false) <= limit);
    }

    /// Sliding window counter: at most N per aligned window, hence at most 2N in any half-open
    /// window of length W (it overlaps two aligned windows). Its retry-after is exact too.
    #[test]
    fn sliding_window_never_exceeds_two_n_per_window(limit in 1..8u64, requests in timeline(60)) {
        let policy = policy(Algorithm::SlidingWindow, limit * 1000, 0, DelayMode::NoDelay);
        let charged = run(&policy, &requests, true);
        prop_assert!(max_in_any_interval(&charged, SECOND, false) <= 2 * limit);
        let mut per_window = std::collections::BTreeMap::new();
        for request in &charged {
            *per_window.entry(request.now_ns / SECOND).or_insert(0) += request.cost;
        }
        prop_assert!(per_window.values().all(|&count| count <= limit));
    }

    /// Ten times the rate for 20 s: the buckets and the log pass the rate (within one
    /// window's worth); the sliding window counter, whose previous window weighs on the whole
    /// next one, passes between half the rate and the rate (N = 1 passes every other window).
    #[test]
    fn steady_overload_passes_the_rate(
        algorithm in prop_oneof![
            Just(Algorithm::LeakyBucket),
            Just(Algorithm::TokenBucket),
            Just(Algorithm::SlidingLog),
            Just(Algorithm::SlidingWindow),
        ],
        per_second in 1..6u64,
    ) {
        let policy = policy(algorithm, per_second * 1000, 0, DelayMode::NoDelay);
        // Ten times the rate for 20 s.
        let requests: Vec<Request> = (0..200 * per_second)
            .map(|i| Request { now_ns: i * SECOND / (10 * per_second), cost: 1 })
            .collect();
        let passed = run(&policy, &requests, false).len() as u64;
        let least = if algorithm == Algorithm::SlidingWindow { 10 } else { 19 };
        prop_assert!(passed >= least * per_second && passed <= 21 * per_second, "{passed}");
    }

    /// Saturated above 1000 r/s with no burst, arrivals a few microseconds apart (less than
    /// half an interval, at random): the buckets pass the rate exactly, not the rate less the
    /// gaps between a request becoming allowed and the next arrival.
    #[test]
    fn saturated_sub_millisecond_rates_pass_the_rate(
        token in any::<bool>(),
        per_second in 2000..20_000u64,
        seed in any::<u64>(),
    ) {
        let algorithm = if token { Algorithm::TokenBucket } else { Algorithm::LeakyBucket };
        let policy = policy(algorithm, per_second * 1000, 0, DelayMode::NoDelay);
        let half_interval = policy.limits.rate.interval_ns() / 2;
        let mut random = seed | 1;
        let mut requests = Vec::new();
        let mut now_ns = 0;
        while now_ns < SECOND {
            requests.push(Request { now_ns, cost: 1 });
            random ^= random << 13;
            random ^= random >> 7;
            random ^= random << 17;
            now_ns += 1 + random % half_interval;
        }
        let mut state = 0;
        let mut passed = 0u64;
        for request in &requests {
            if let (decision, Some(next)) = decide_word(state, request.now_ns, &policy) {
                prop_assert_eq!(decision.outcome, Outcome::Passed);
                state = next;
                passed += 1;
            }
        }
        prop_assert!(passed.abs_diff(per_second) <= 1, "{passed} of {per_second}");
    }

    /// Nothing panics on arbitrary states, times and policies (including ones the parsers
    /// would refuse: rate 0, huge bursts and costs).
    #[test]
    fn no_panics_on_arbitrary_words(
        state in any::<u64>(),
        now_ns in any::<u64>(),
        milli in any::<u64>(),
        unit in 0..4u8,
        burst in any::<u64>(),
        cost in any::<u64>(),
        delay in prop_oneof![Just(DelayMode::Delay), Just(DelayMode::NoDelay),
                             any::<u64>().prop_map(DelayMode::Threshold)],
    ) {
        let units = [RateUnit::Second, RateUnit::Minute, RateUnit::Hour, RateUnit::Day];
        let unit = units[usize::from(unit)];
        for algorithm in [Algorithm::LeakyBucket, Algorithm::TokenBucket,
                          Algorithm::SlidingWindow, Algorithm::SlidingLog] {
            let limits = Limits { rate: Rate { milli_requests: milli, unit }, burst };
            let policy = Policy { algorithm, limits, delay, cost };
            let (decision, new_state) = decide_word(state, now_ns, &policy);
            prop_assert_eq!(decision.outcome == Outcome::Rejected, new_state.is_none());
            let _ = word_idle_at_ns(state, &limits, algorithm);
            let _ = sliding_window::idle_at_ns_near(state, &limits, now_ns);
            let _ = Limits::unpack(state);
            let _ = limits.pack();
        }
    }

    #[test]
    fn no_panics_on_arbitrary_logs(
        log in prop::collection::vec(any::<u64>(), 0..12),
        now_ns in any::<u64>(),
        limit in 0..12u64,
        cost in any::<u64>(),
    ) {
        let policy = policy(Algorithm::SlidingLog, limit * 1000, 0, DelayMode::NoDelay);
        let policy = Policy { cost, ..policy };
        let mut log = log;
        let inspected = sliding_log::inspect(&log, now_ns, &policy);
        let decided = sliding_log::decide(&mut log, now_ns, &policy);
        prop_assert_eq!(inspected, decided);
        let _ = sliding_log::idle_at_ns(&log, &policy.limits);
        let _ = sliding_log::decide(&mut log, now_ns.wrapping_add(1), &policy);
    }

    #[test]
    fn no_panics_on_arbitrary_text(words in prop::collection::vec("[a-z=:0-9./ ]{0,12}", 0..5)) {
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        let _ = ratelimit_core::ZoneSpec::parse_words(&words);
        let _ = ratelimit_core::LimitSpec::parse_words(&words);
        for word in &words {
            if let Ok(rate) = Rate::parse(word) {
                prop_assert_eq!(Rate::parse(&rate.to_string()), Ok(rate));
            }
            let _ = ratelimit_core::spec::parse_size(word);
        }
    }

    /// Decides exactly like nginx's limit_req (ported below, integer milliseconds) whenever
    /// both can be exact: whole r/s dividing 10^9 and millisecond times.
    #[test]
    fn leaky_bucket_matches_limit_req(
        per_second in prop::sample::select(vec![1u64, 2, 4, 5, 8, 10, 20, 25, 40, 50]),
        burst in 0..8u64,
        delay in delay_mode(),
        gaps_ms in prop::collection::vec(
            prop_oneof![3 => Just(0u64), 4 => 0..300u64, 1 => 0..3000u64],
            1..80,
        ),
    ) {
        let policy = policy(Algorithm::LeakyBucket, per_second * 1000, burst, delay);
        let mut limit_req = LimitReq::new(per_second * 1000, burst, delay);
        let mut state = 0;
        let mut now_ms = 0;
        for gap in gaps_ms {
            now_ms += gap;
            let (decision, new_state) = leaky_bucket::decide(state, now_ms * 1_000_000, &policy);
            state = new_state.unwrap_or(state);
            let (outcome, delay_ms, excess) = limit_req.decide(now_ms);
            prop_assert_eq!(decision.outcome, outcome, "at {} ms", now_ms);
            prop_assert_eq!(decision.delay_ns / 1_000_000, delay_ms, "at {} ms", now_ms);
            prop_assert_eq!(decision.excess_milli, excess, "at {} ms", now_ms);
        }
    }
}

/// `ngx_http_limit_req_lookup` and `ngx_http_limit_req_account` for one limit, one key.
struct LimitReq {
    /// milli-requests per second
    rate: i64,
    /// milli-requests
    burst: i64,
    delay: i64,
    node: Option<(i64, u64)>,
}

impl LimitReq {
    fn new(rate: u64, burst: u64, delay: DelayMode) -> LimitReq {
        let delay = match delay {
            DelayMode::Delay => 0,
            DelayMode::NoDelay => i64::MAX / 1000,
            DelayMode::Threshold(n) => n as i64 * 1000,
        };
        LimitReq {
            rate: rate as i64,
            burst: burst as i64 * 1000,
            delay,
            node: None,
        }
    }

    fn decide(&mut self, now: u64) -> (Outcome, u64, u64) {
        let excess = match self.node {
            Some((last_excess, last)) => {
                let ms = now.saturating_sub(last) as i64;
                let excess = (last_excess - self.rate * ms / 1000 + 1000).max(0);
                if excess > self.burst {
                    return (Outcome::Rejected, 0, excess as u64);
                }
                self.node = Some((excess, if ms != 0 { now } else { last }));
                excess
            }
            None => {
                self.node = Some((0, now));
                0
            }
        };
        if excess <= self.delay {
            (Outcome::Passed, 0, excess as u64)
        } else {
            let delay_ms = (excess - self.delay) * 1000 / self.rate;
            (Outcome::Delayed, delay_ms as u64, excess as u64)
        }
    }
}
