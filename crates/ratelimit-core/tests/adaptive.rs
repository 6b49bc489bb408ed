//! The adaptive limit against a simulated upstream: bounded, converging, following a change
//! of capacity. The upstream serves `C` requests at once in `b` each and shares itself out
//! beyond (processor sharing: with `n > C` in flight each progresses at `C / n`), so a request
//! takes `b · max(1, n / C)`: the collapsing backend of issue 23.

use proptest::prelude::*;
use ratelimit_core::adaptive::{
    window_add, window_unpack, AdaptiveBounds, AdaptiveLimit, Phase, Window, MAX_LIMIT,
    PROBE_SAMPLES, RELEARN_INTERVAL_NS, WINDOW_NS,
};
use std::collections::VecDeque;

const MS: u64 = 1_000_000;
const SECOND: u64 = 1_000_000_000;

/// A processor-sharing upstream behind the adaptive limit, clients offering a fixed rate.
/// Every request needs the same work `b`, so requests finish in the order they were admitted:
/// a deque of the virtual time at which each is done.
struct Simulation {
    bounds: AdaptiveBounds,
    limit: AdaptiveLimit,
    window: u64,
    peak: u32,
    capacity: f64,
    base_s: f64,
    /// Work done so far by any one request in flight since the start, in seconds of `b`.
    virtual_s: f64,
    now_s: f64,
    in_flight: VecDeque<Admitted>,
    /// Arrivals per second offered.
    offered: f64,
    next_arrival_s: f64,
    /// A small linear congruential generator for the arrivals' jitter.
    seed: u64,
    log: Vec<Completion>,
    limits: Vec<(f64, u32)>,
}

#[derive(Clone, Copy)]
struct Admitted {
    done_virtual_s: f64,
    start_s: f64,
    epoch: u16,
}

#[derive(Clone, Copy, Debug)]
struct Completion {
    at_s: f64,
    latency_s: f64,
}

impl Simulation {
    fn new(bounds: AdaptiveBounds, capacity: f64, base_s: f64, overload: f64, seed: u64) -> Self {
        Simulation {
            bounds,
            limit: AdaptiveLimit::new(&bounds, 0),
            window: 0,
            peak: 0,
            capacity,
            base_s,
            virtual_s: 0.0,
            now_s: 0.0,
            in_flight: VecDeque::new(),
            offered: overload * capacity / base_s,
            next_arrival_s: 0.0,
            seed: seed | 1,
            log: Vec::new(),
            limits: Vec::new(),
        }
    }

    fn random(&mut self) -> f64 {
        self.seed = self
            .seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.seed >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Seconds of work per second each request in flight gets.
    fn speed(&self) -> f64 {
        let n = self.in_flight.len() as f64;
        if n <= self.capacity {
            1.0
        } else {
            self.capacity / n
        }
    }

    fn now_ns(&self) -> u64 {
        (self.now_s * 1e9) as u64
    }

    fn run_until(&mut self, end_s: f64) {
        while self.now_s < end_s {
            let completion_s = self.in_flight.front().map(|first| {
                self.now_s + (first.done_virtual_s - self.virtual_s).max(0.0) / self.speed()
            });
            let next_s = match completion_s {
                Some(at) if at <= self.next_arrival_s => at,
                _ => self.next_arrival_s,
            }
            .min(end_s);
            self.virtual_s += (next_s - self.now_s) * self.speed();
            self.now_s = next_s;
            if completion_s == Some(next_s) {
                self.complete();
            } else if next_s == self.next_arrival_s {
                self.arrive();
                // Exponential gaps: arrivals as independent clients make them.
                let gap = -(1.0 - self.random()).ln() / self.offered;
                self.next_arrival_s += gap;
            }
        }
    }

    fn arrive(&mut self) {
        if (self.in_flight.len() as u64) < u64::from(self.limit.limit) {
            self.in_flight.push_back(Admitted {
                done_virtual_s: self.virtual_s + self.base_s,
                start_s: self.now_s,
                epoch: self.limit.epoch,
            });
            self.peak = self.peak.max(self.in_flight.len() as u32);
        }
    }

    fn complete(&mut self) {
        let done = self.in_flight.pop_front().expect("a request in flight");
        let latency_s = self.now_s - done.start_s;
        self.log.push(Completion {
            at_s: self.now_s,
            latency_s,
        });
        if !self.limit.accepts(done.epoch) {
            return;
        }
        let ceiling = self.limit.sample_ceiling_us();
        let latency_us = (latency_s * 1e6) as u64;
        if let Some(word) = window_add(self.window, latency_us, ceiling) {
            self.window = word;
        }
        let window = window_unpack(self.window, self.peak);
        let now_ns = self.now_ns();
        if self.limit.due(now_ns, &window) {
            self.limit.close_window(&self.bounds, now_ns, &window);
            self.window = 0;
            self.peak = self.in_flight.len() as u32;
            self.limits.push((self.now_s, self.limit.limit));
        }
    }

    /// Completions per second within `[from_s, to_s)` that took at most `timeout_s`.
    fn goodput(&self, from_s: f64, to_s: f64, timeout_s: f64) -> f64 {
        let good = self
            .log
            .iter()
            .filter(|c| c.at_s >= from_s && c.at_s < to_s && c.latency_s <= timeout_s)
            .count();
        good as f64 / (to_s - from_s)
    }

    /// The latency that `share` of the completions within `[from_s, to_s)` stay under.
    fn latency_quantile(&self, from_s: f64, to_s: f64, share: f64) -> f64 {
        let mut latencies: Vec<f64> = self
            .log
            .iter()
            .filter(|c| c.at_s >= from_s && c.at_s < to_s)
            .map(|c| c.latency_s)
            .collect();
        latencies.sort_by(f64::total_cmp);
        if latencies.is_empty() {
            return 0.0;
        }
        let index = ((latencies.len() as f64 * share).ceil() as usize).clamp(1, latencies.len());
        latencies[index - 1]
    }
}

/// Goodput within 10% of capacity and the 99th percentile within 2 b over `[from_s, to_s)`.
fn assert_near_capacity(sim: &Simulation, from_s: f64, to_s: f64, what: &str) {
    let capacity_per_s = sim.capacity / sim.base_s;
    let goodput = sim.goodput(from_s, to_s, 1.0);
    let p99 = sim.latency_quantile(from_s, to_s, 0.99);
    assert!(
        goodput >= 0.9 * capacity_per_s,
        "{what}: goodput {goodput:.1}/s under 90% of {capacity_per_s:.1}/s; limits {:?}",
        &sim.limits[sim.limits.len().saturating_sub(20)..]
    );
    assert!(
        p99 <= 2.0 * sim.base_s,
        "{what}: p99 {p99:.4}s over 2 b = {:.4}s; limits {:?}",
        2.0 * sim.base_s,
        &sim.limits[sim.limits.len().saturating_sub(20)..]
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// At twice its capacity, the upstream is kept busy (goodput within 10% of capacity) and
    /// its latency low (p99 within 2 b), once the first few seconds are past.
    #[test]
    fn converges_on_a_processor_sharing_upstream(
        capacity in 10u32..200,
        base_ms in 5u64..200,
        seed in any::<u64>(),
    ) {
        let base_s = base_ms as f64 / 1000.0;
        let mut sim = Simulation::new(AdaptiveBounds::new(4, 1000), capacity as f64, base_s, 2.0, seed);
        sim.run_until(10.0);
        assert_near_capacity(&sim, 4.0, 10.0, "steady");
        let limit = sim.limit.limit;
        prop_assert!(limit >= capacity && limit <= 2 * capacity + 10, "limit {limit} for C {capacity}");
    }

    /// When the capacity halves, the limit follows: within 3 s of simulated time the goodput
    /// is back within 10% of the new capacity and the p99 within 2 b.
    #[test]
    fn follows_the_capacity_halving(
        capacity in 20u32..200,
        base_ms in 5u64..100,
        seed in any::<u64>(),
    ) {
        let base_s = base_ms as f64 / 1000.0;
        let mut sim = Simulation::new(AdaptiveBounds::new(4, 1000), capacity as f64, base_s, 2.0, seed);
        sim.run_until(8.0);
        sim.capacity /= 2.0;
        sim.run_until(16.0);
        assert_near_capacity(&sim, 11.0, 16.0, "after halving");
    }

    /// Whatever the samples and their timing, the limit stays within its bounds and the words
    /// round-trip.
    #[test]
    fn always_within_bounds(
        min in 1u32..50,
        span in 0u32..2000,
        windows in prop::collection::vec(
            (0u64..3 * SECOND, 0u32..100, 0u64..10 * SECOND, 0u32..3000),
            1..200,
        ),
    ) {
        let bounds = AdaptiveBounds::new(min, min + span);
        let mut limit = AdaptiveLimit::new(&bounds, 0);
        let mut now = 0u64;
        for (gap, samples, latency, peak) in windows {
            now += gap;
            let mut word = 0;
            for i in 0..samples {
                word = window_add(word, latency / 1000 + u64::from(i), limit.sample_ceiling_us()).unwrap();
            }
            let window = window_unpack(word, peak);
            if limit.due(now, &window) {
                limit.close_window(&bounds, now, &window);
            }
            prop_assert!(limit.limit >= bounds.min && limit.limit <= bounds.max, "{limit:?}");
            prop_assert_eq!(AdaptiveLimit::unpack(&limit.pack(), &bounds), Some(limit));
        }
    }
}

/// One window of tracking from a given limit and no-load latency: rows of
/// `(limit, no_load_us, average_us, peak_inflight, next limit)` with min 4, max 500.
#[test]
fn gradient_rule_table() {
    #[rustfmt::skip]
    let rows = [
        // Latency at the no-load level, limit in use: ×5/4 plus the square root.
        (100, 20_000, 20_000, 100, 136),   // 125 + 11
        (4,   20_000, 20_000, 4,   7),     // 5 + 2
        // Exactly 5/4 of the no-load level: only the square root.
        (100, 20_000, 25_000, 100, 110),
        // Twice the no-load level: ×5/8.
        (100, 20_000, 40_000, 100, 69),    // 62 + 7 (62.5 rounded down)
        // Far above: at most halved (plus the square root).
        (100, 20_000, 400_000, 100, 57),   // 50 + 7
        (400, 20_000, 100_000, 400, 214),  // 200 + 14
        // Far below: at most doubled (then the maximum).
        (100, 20_000, 1_000,   100, 214),
        (400, 20_000, 1_000,   400, 500),
        // Less than half the limit in use: no growth, a fall still applies.
        (100, 20_000, 20_000,  49,  100),
        (100, 20_000, 40_000,  49,  69),
        // Bounded below by min.
        (4,   20_000, 400_000, 4,   4),
    ];
    let bounds = AdaptiveBounds::new(4, 500);
    for (from, no_load_us, average_us, peak, expected) in rows {
        let mut limit = tracking(&bounds, from, no_load_us);
        let window = Window {
            samples: 10,
            sum_us: 10 * average_us,
            peak_inflight: peak,
        };
        limit.close_window(&bounds, 200 * MS, &window);
        assert_eq!(
            limit.limit, expected,
            "from {from}, no-load {no_load_us} us, average {average_us} us, peak {peak}"
        );
    }
}

/// A limit tracking at `limit` with the given no-load latency, its window open since 100 ms.
fn tracking(bounds: &AdaptiveBounds, limit: u32, no_load_us: u32) -> AdaptiveLimit {
    let mut state = AdaptiveLimit::new(bounds, 0);
    let probe = Window {
        samples: PROBE_SAMPLES,
        sum_us: u64::from(PROBE_SAMPLES) * u64::from(no_load_us),
        peak_inflight: bounds.min,
    };
    state.close_window(bounds, 100 * MS, &probe);
    state.limit = limit;
    state
}

/// A new key probes at `min` first; the probe averages only its own requests, ends after
/// `PROBE_SAMPLES`, and resumes; then probes come back every `RELEARN_INTERVAL_NS`, and the
/// no-load latency follows a change of the upstream's own speed.
#[test]
fn probes_learn_the_no_load_latency_again() {
    let bounds = AdaptiveBounds::new(4, 500);
    let mut limit = AdaptiveLimit::new(&bounds, 0);
    assert_eq!((limit.phase, limit.limit), (Phase::Probe, 4));
    let probe_epoch = limit.epoch;
    assert!(limit.accepts(probe_epoch) && !limit.accepts(probe_epoch - 1));
    assert_eq!(limit.sample_ceiling_us(), u64::MAX);

    let window = |samples: u32, latency_us: u64, peak: u32| Window {
        samples,
        sum_us: u64::from(samples) * latency_us,
        peak_inflight: peak,
    };
    // 15 samples are not enough, 16 are.
    assert!(!limit.due(50 * MS, &window(PROBE_SAMPLES - 1, 10_000, 4)));
    assert!(limit.due(50 * MS, &window(PROBE_SAMPLES, 10_000, 4)));
    limit.close_window(&bounds, 50 * MS, &window(PROBE_SAMPLES, 10_000, 4));
    assert_eq!(
        (limit.phase, limit.no_load_us, limit.limit),
        (Phase::Track, 10_000, 4)
    );
    assert!(limit.accepts(probe_epoch) && limit.accepts(limit.epoch));
    assert_eq!(limit.sample_ceiling_us(), 40_000);

    // Grow to well above min, then let the relearn interval pass.
    let mut now = 50 * MS;
    for _ in 0..20 {
        now += WINDOW_NS;
        let peak = limit.limit;
        limit.close_window(&bounds, now, &window(50, 10_000, peak));
    }
    assert_eq!(limit.phase, Phase::Track);
    let grown = limit.limit;
    assert!(grown > 100, "{grown}");
    now = 50 * MS + RELEARN_INTERVAL_NS;
    limit.close_window(&bounds, now, &window(50, 12_400, grown));
    assert_eq!((limit.phase, limit.limit), (Phase::Probe, 4));
    let resume = limit.resume_limit;
    // The upstream is slower now: 30 ms at no load. The probe learns it and resumes.
    limit.close_window(&bounds, now + 200 * MS, &window(PROBE_SAMPLES, 30_000, 4));
    assert_eq!(
        (limit.phase, limit.no_load_us, limit.limit),
        (Phase::Track, 30_000, resume)
    );

    // A probe that sees few requests ends after PROBE_MAX_NS with what it has.
    let mut limit = AdaptiveLimit::new(&bounds, 0);
    assert!(!limit.due(4 * SECOND, &window(2, 7_000, 2)));
    assert!(!limit.due(6 * SECOND, &window(0, 0, 0)));
    assert!(limit.due(6 * SECOND, &window(2, 7_000, 2)));
    limit.close_window(&bounds, 6 * SECOND, &window(2, 7_000, 2));
    assert_eq!((limit.phase, limit.no_load_us), (Phase::Track, 7_000));
}

/// Latency high even at `min` for five windows in a row: the no-load level is measured again.
#[test]
fn stuck_at_min_relearns() {
    let bounds = AdaptiveBounds::new(4, 500);
    let mut limit = tracking(&bounds, 4, 10_000);
    let slow = Window {
        samples: 20,
        sum_us: 20 * 50_000,
        peak_inflight: 4,
    };
    let mut now = 100 * MS;
    for round in 1..5 {
        now += WINDOW_NS;
        limit.close_window(&bounds, now, &slow);
        assert_eq!((limit.phase, limit.windows_at_min), (Phase::Track, round));
    }
    now += WINDOW_NS;
    limit.close_window(&bounds, now, &slow);
    assert_eq!(limit.phase, Phase::Probe);
    limit.close_window(&bounds, now + 500 * MS, &slow);
    assert_eq!((limit.phase, limit.no_load_us), (Phase::Track, 50_000));
}

/// Samples are capped at four times the no-load latency; the window word saturates instead of
/// wrapping, and says when it is full.
#[test]
fn window_words() {
    let bounds = AdaptiveBounds::new(4, 500);
    let limit = tracking(&bounds, 50, 10_000);
    let word = window_add(0, 1_000_000, limit.sample_ceiling_us()).unwrap();
    assert_eq!(window_unpack(word, 0).sum_us, 40_000);
    let mut word = 0;
    let mut added = 0;
    while let Some(next) = window_add(word, u64::MAX, u64::MAX) {
        word = next;
        added += 1;
    }
    let window = window_unpack(word, 0);
    assert_eq!(window.samples, added);
    assert_eq!(window.samples, ratelimit_core::adaptive::WINDOW_MAX_SAMPLES);
    assert!(limit.due(0, &window), "a full window closes at once");
    assert!(window.sum_us > 0);
}

/// Bounds are made valid, and a state whose bounds changed comes back within them.
#[test]
fn bounds() {
    assert_eq!(AdaptiveBounds::new(0, 0), AdaptiveBounds { min: 1, max: 1 });
    assert_eq!(
        AdaptiveBounds::new(10, 5),
        AdaptiveBounds { min: 10, max: 10 }
    );
    assert_eq!(
        AdaptiveBounds::new(u32::MAX, u32::MAX),
        AdaptiveBounds {
            min: MAX_LIMIT,
            max: MAX_LIMIT
        }
    );
    let wide = AdaptiveBounds::new(4, 500);
    let mut state = tracking(&wide, 400, 10_000);
    state.resume_limit = 2;
    let narrow = AdaptiveBounds::new(8, 100);
    let back = AdaptiveLimit::unpack(&state.pack(), &narrow).unwrap();
    assert_eq!((back.limit, back.resume_limit), (100, 8));
    assert_eq!(AdaptiveLimit::unpack(&[0; 5], &narrow), None);
}
