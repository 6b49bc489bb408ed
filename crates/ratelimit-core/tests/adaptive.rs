//! The adaptive limit against simulated upstreams, time simulated (nothing sleeps):
//!
//! - **processor sharing**: `C` requests at once, shared out beyond (with `n > C` in flight
//!   each progresses at `C / n`): the collapsing backend of issue 23;
//! - **a FIFO worker pool**: `C` workers, a backlog served in order (latency = wait + service);
//! - **bimodal**: the worker pool with cache hits and misses (70% at `b / 4`, 30% at `3 b`);
//! - **a slow-path attacker**: a share of the requests takes 1-2 s on its own (it waits on
//!   something else: it holds a slot, not the upstream), the rest are the legit traffic.
//!
//! Each checks goodput against capacity (or against a fixed limit), latency, and what the
//! limit learnt, through capacity changes `C → C/4 → C`.

use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use ratelimit_core::adaptive::{
    bucket_of, histogram_add, AdaptiveBounds, AdaptiveLimit, Phase, Window, BUCKETS, MAX_LIMIT,
    PROBE_MAX_NS, PROBE_SAMPLES, RELEARN_INTERVAL_NS, WINDOWS_AT_MIN_BEFORE_RELEARN, WINDOW_NS,
};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

const MS: u64 = 1_000_000;
const SECOND: u64 = 1_000_000_000;

/// A time or work amount ordered for the heaps (never NaN here).
#[derive(Clone, Copy, PartialEq)]
struct At(f64);
impl Eq for At {}
impl PartialOrd for At {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for At {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Shape {
    ProcessorSharing,
    FifoPool,
    /// The FIFO pool with this share of hits at `b / 4`, the rest misses at `3 b`... scaled
    /// so that the mean stays `b`.
    Bimodal,
}

/// The upstream: requests by id, each with its work in seconds.
enum Upstream {
    ProcessorSharing {
        capacity: f64,
        /// Work done by any one request in flight since the start.
        virtual_s: f64,
        updated_s: f64,
        /// (virtual time done, id).
        heap: BinaryHeap<Reverse<(At, usize)>>,
    },
    Pool {
        capacity: f64,
        backlog: VecDeque<(usize, f64)>,
        /// (time done, id).
        running: BinaryHeap<Reverse<(At, usize)>>,
    },
}

impl Upstream {
    fn new(shape: Shape, capacity: f64) -> Upstream {
        match shape {
            Shape::ProcessorSharing => Upstream::ProcessorSharing {
                capacity,
                virtual_s: 0.0,
                updated_s: 0.0,
                heap: BinaryHeap::new(),
            },
            Shape::FifoPool | Shape::Bimodal => Upstream::Pool {
                capacity,
                backlog: VecDeque::new(),
                running: BinaryHeap::new(),
            },
        }
    }

    fn advance(&mut self, now_s: f64) {
        if let Upstream::ProcessorSharing {
            capacity,
            virtual_s,
            updated_s,
            heap,
        } = self
        {
            let n = heap.len() as f64;
            let speed = if n <= *capacity { 1.0 } else { *capacity / n };
            *virtual_s += (now_s - *updated_s) * speed;
            *updated_s = now_s;
        }
    }

    fn next_completion(&self) -> Option<f64> {
        match self {
            Upstream::ProcessorSharing {
                capacity,
                virtual_s,
                updated_s,
                heap,
            } => heap.peek().map(|Reverse((done, _))| {
                let n = heap.len() as f64;
                let speed = if n <= *capacity { 1.0 } else { *capacity / n };
                updated_s + (done.0 - virtual_s).max(0.0) / speed
            }),
            Upstream::Pool { running, .. } => running.peek().map(|Reverse((at, _))| at.0),
        }
    }

    fn admit(&mut self, now_s: f64, id: usize, work_s: f64) {
        self.advance(now_s);
        match self {
            Upstream::ProcessorSharing {
                virtual_s, heap, ..
            } => heap.push(Reverse((At(*virtual_s + work_s), id))),
            Upstream::Pool { backlog, .. } => {
                backlog.push_back((id, work_s));
                self.start_work(now_s);
            }
        }
    }

    fn start_work(&mut self, now_s: f64) {
        if let Upstream::Pool {
            capacity,
            backlog,
            running,
        } = self
        {
            while (running.len() as f64) < capacity.floor().max(1.0) {
                let Some((id, work)) = backlog.pop_front() else {
                    break;
                };
                running.push(Reverse((At(now_s + work), id)));
            }
        }
    }

    fn complete(&mut self, now_s: f64) -> usize {
        self.advance(now_s);
        let id = match self {
            Upstream::ProcessorSharing { heap, .. } => heap.pop().expect("in flight").0 .1,
            Upstream::Pool { running, .. } => running.pop().expect("running").0 .1,
        };
        self.start_work(now_s);
        id
    }

    fn set_capacity(&mut self, now_s: f64, new: f64) {
        self.advance(now_s);
        match self {
            Upstream::ProcessorSharing { capacity, .. } | Upstream::Pool { capacity, .. } => {
                *capacity = new
            }
        }
        self.start_work(now_s);
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Limiter {
    Adaptive,
    Fixed(u32),
}

#[derive(Clone, Copy)]
struct Request {
    start_s: f64,
    epoch: u16,
    slow: bool,
}

#[derive(Clone, Copy, Debug)]
struct Completion {
    at_s: f64,
    latency_s: f64,
    slow: bool,
}

/// The limiter in front of an upstream, open-loop Poisson clients, a share of them slow.
struct Simulation {
    shape: Shape,
    limiter: Limiter,
    bounds: AdaptiveBounds,
    state: AdaptiveLimit,
    histogram: [u64; 4],
    peak: u32,
    upstream: Upstream,
    /// The slow path's requests: (time done, id).
    slow_path: BinaryHeap<Reverse<(At, usize)>>,
    capacity: f64,
    base_s: f64,
    now_s: f64,
    requests: Vec<Request>,
    in_flight: u32,
    /// Arrivals per second offered, and the share of them that are slow.
    offered: f64,
    slow_share: f64,
    next_arrival_s: f64,
    seed: u64,
    log: Vec<Completion>,
    rejected_legit: u64,
    limits: Vec<(f64, u32, Phase, u32, u32)>,
}

impl Simulation {
    fn new(shape: Shape, capacity: f64, base_s: f64, offered: f64, seed: u64) -> Self {
        let bounds = AdaptiveBounds::new(4, 1000);
        Simulation {
            shape,
            limiter: Limiter::Adaptive,
            bounds,
            state: AdaptiveLimit::new(&bounds, 0),
            histogram: [0; 4],
            peak: 0,
            upstream: Upstream::new(shape, capacity),
            slow_path: BinaryHeap::new(),
            capacity,
            base_s,
            now_s: 0.0,
            requests: Vec::new(),
            in_flight: 0,
            offered,
            slow_share: 0.0,
            next_arrival_s: 0.0,
            seed: seed | 1,
            log: Vec::new(),
            rejected_legit: 0,
            limits: Vec::new(),
        }
    }

    /// Clients offering `overload` times the upstream's capacity.
    fn overloaded(shape: Shape, capacity: u32, base_ms: u64, overload: f64, seed: u64) -> Self {
        let base_s = base_ms as f64 / 1000.0;
        let capacity = f64::from(capacity);
        Simulation::new(shape, capacity, base_s, overload * capacity / base_s, seed)
    }

    fn random(&mut self) -> f64 {
        self.seed = self
            .seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.seed >> 11) as f64 / (1u64 << 53) as f64
    }

    fn now_ns(&self) -> u64 {
        (self.now_s * 1e9) as u64
    }

    fn limit(&self) -> u32 {
        match self.limiter {
            Limiter::Adaptive => self.state.limit,
            Limiter::Fixed(limit) => limit,
        }
    }

    fn set_capacity(&mut self, capacity: f64) {
        self.capacity = capacity;
        self.upstream.set_capacity(self.now_s, capacity);
    }

    fn run_until(&mut self, end_s: f64) {
        while self.now_s < end_s {
            let upstream = self.upstream.next_completion().unwrap_or(f64::INFINITY);
            let slow = self
                .slow_path
                .peek()
                .map_or(f64::INFINITY, |Reverse((at, _))| at.0);
            let next = upstream.min(slow).min(self.next_arrival_s);
            if next >= end_s {
                self.upstream.advance(end_s);
                self.now_s = end_s;
                break;
            }
            self.now_s = next;
            if next == upstream {
                let id = self.upstream.complete(next);
                self.complete(id);
            } else if next == slow {
                let id = self.slow_path.pop().expect("slow request").0 .1;
                self.complete(id);
            } else {
                self.arrive();
                let gap = -(1.0 - self.random()).ln() / self.offered;
                self.next_arrival_s += gap;
            }
        }
    }

    /// A request's work: `b`, or for the bimodal upstream a hit (`b / 4`, 70%) or a miss
    /// (`2.75 b`, 30%): the mean is `b`.
    fn work_s(&mut self) -> f64 {
        if self.shape != Shape::Bimodal {
            return self.base_s;
        }
        if self.random() < 0.7 {
            self.base_s / 4.0
        } else {
            self.base_s * 2.75
        }
    }

    fn arrive(&mut self) {
        let slow = self.random() < self.slow_share;
        if self.in_flight >= self.limit() {
            if !slow {
                self.rejected_legit += 1;
            }
            return;
        }
        let id = self.requests.len();
        self.requests.push(Request {
            start_s: self.now_s,
            epoch: self.state.epoch,
            slow,
        });
        self.in_flight += 1;
        self.peak = self.peak.max(self.in_flight);
        if slow {
            let hold = 1.0 + self.random();
            self.slow_path.push(Reverse((At(self.now_s + hold), id)));
        } else {
            let work = self.work_s();
            self.upstream.admit(self.now_s, id, work);
        }
    }

    /// What the module does when a request gives its slot back (`control::concurrency`).
    fn complete(&mut self, id: usize) {
        self.in_flight -= 1;
        let request = self.requests[id];
        let latency_s = self.now_s - request.start_s;
        self.log.push(Completion {
            at_s: self.now_s,
            latency_s,
            slow: request.slow,
        });
        if self.limiter != Limiter::Adaptive {
            return;
        }
        let latency_us = (latency_s * 1e6).ceil() as u64;
        self.state.seed(latency_us);
        if self.state.accepts(request.epoch) {
            let bucket = self.state.bucket(latency_us);
            let word = &mut self.histogram[bucket / 4];
            if let Some(next) = histogram_add(*word, bucket) {
                *word = next;
            }
        }
        let window = Window::unpack(&self.histogram, self.peak);
        let now_ns = self.now_ns();
        if self.state.due(now_ns, &window) {
            self.state.close_window(&self.bounds, now_ns, &window);
            self.histogram = [0; 4];
            self.peak = self.in_flight;
            self.limits.push((
                self.now_s,
                self.state.limit,
                self.state.phase,
                self.state.no_load_us,
                self.state.service_us,
            ));
        }
    }

    /// Legit completions per second within `[from_s, to_s)` that took at most `timeout_s`.
    fn goodput(&self, from_s: f64, to_s: f64, timeout_s: f64) -> f64 {
        let good = self
            .log
            .iter()
            .filter(|c| !c.slow && c.at_s >= from_s && c.at_s < to_s && c.latency_s <= timeout_s)
            .count();
        good as f64 / (to_s - from_s)
    }

    /// The latency that `share` of the legit completions within `[from_s, to_s)` stay under.
    fn latency_quantile(&self, from_s: f64, to_s: f64, share: f64) -> f64 {
        let mut latencies: Vec<f64> = self
            .log
            .iter()
            .filter(|c| !c.slow && c.at_s >= from_s && c.at_s < to_s)
            .map(|c| c.latency_s)
            .collect();
        latencies.sort_by(f64::total_cmp);
        if latencies.is_empty() {
            return 0.0;
        }
        let index = ((latencies.len() as f64 * share).ceil() as usize).clamp(1, latencies.len());
        latencies[index - 1]
    }

    fn capacity_per_s(&self) -> f64 {
        match self.shape {
            Shape::ProcessorSharing => self.capacity / self.base_s,
            // Whole workers.
            Shape::FifoPool | Shape::Bimodal => self.capacity.floor().max(1.0) / self.base_s,
        }
    }

    fn recent_limits(&self) -> &[(f64, u32, Phase, u32, u32)] {
        &self.limits[self.limits.len().saturating_sub(24)..]
    }
}

/// Goodput within 10% of capacity over `[from_s, to_s)`, and the p99 within `p99_bases` b.
fn assert_near_capacity(sim: &Simulation, from_s: f64, to_s: f64, p99_bases: f64, what: &str) {
    assert_share_of_capacity(sim, from_s, to_s, p99_bases, 0.9, what);
}

/// Goodput at least `share` of capacity over `[from_s, to_s)`, the p99 within `p99_bases` b.
fn assert_share_of_capacity(
    sim: &Simulation,
    from_s: f64,
    to_s: f64,
    p99_bases: f64,
    share: f64,
    what: &str,
) {
    let capacity_per_s = sim.capacity_per_s();
    let goodput = sim.goodput(from_s, to_s, 1e9);
    let p99 = sim.latency_quantile(from_s, to_s, 0.99);
    assert!(
        goodput >= share * capacity_per_s,
        "{what} ({:?}): goodput {goodput:.1}/s under {share} of {capacity_per_s:.1}/s; limits {:?}",
        sim.shape,
        sim.recent_limits()
    );
    assert!(
        p99 <= p99_bases * sim.base_s,
        "{what} ({:?}): p99 {p99:.4}s over {p99_bases} b = {:.4}s; limits {:?}",
        sim.shape,
        p99_bases * sim.base_s,
        sim.recent_limits()
    );
}

/// `C → C/4 → C` on one shape: at least `share` of capacity once settled in each phase.
fn quarter_and_back(shape: Shape, capacity: u32, base_ms: u64, share: f64, seed: u64) {
    let mut sim = Simulation::overloaded(shape, capacity, base_ms, 2.0, seed);
    // The bimodal upstream's latency is 2.75 b for a miss: its p99 is a miss and its wait.
    let p99_bases = if shape == Shape::Bimodal { 6.0 } else { 3.0 };
    // Each phase: time to settle (windows of about two service times), then 8 s measured.
    let settle_s = 4.0 + 25.0 * sim.base_s;
    let phase_s = settle_s + 8.0;
    for (phase, (fraction, what)) in [(1.0, "at C"), (0.25, "at C/4"), (1.0, "back at C")]
        .into_iter()
        .enumerate()
    {
        let start_s = phase as f64 * phase_s;
        sim.set_capacity(f64::from(capacity) * fraction);
        sim.run_until(start_s + phase_s);
        let (from_s, to_s) = (start_s + settle_s, start_s + phase_s);
        assert_share_of_capacity(&sim, from_s, to_s, p99_bases, share, what);
    }
    let no_load = f64::from(sim.state.no_load_us) / 1e6;
    let floor = if shape == Shape::Bimodal { 0.2 } else { 0.9 };
    assert!(
        no_load >= floor * sim.base_s && no_load <= 2.0 * sim.base_s,
        "{shape:?}: no-load {no_load:.4}s for b = {:.4}s",
        sim.base_s
    );
}

/// One shared key, legit requests at `legit_per_s` (an upstream of ample capacity: 40 at once
/// in 20 ms), and `slow_share` of all requests to a slow path that takes 1-2 s: legit
/// goodput, its p99, and the simulation.
fn slow_path_attack(limiter: Limiter, slow_share: f64, seed: u64) -> Simulation {
    // 150 requests/s in all: with 20% slow, about 45 slow ones in flight, under a fixed 100.
    let total_per_s = 150.0;
    let mut sim = Simulation::new(Shape::ProcessorSharing, 40.0, 0.020, total_per_s, seed);
    sim.limiter = limiter;
    sim.slow_share = slow_share;
    sim.run_until(70.0);
    sim
}

/// The lowest legit goodput of any `span_s` seconds within `[from_s, to_s)`.
fn worst_span(sim: &Simulation, from_s: f64, to_s: f64, span_s: f64) -> f64 {
    let mut worst = f64::INFINITY;
    let mut start = from_s;
    while start + span_s <= to_s {
        worst = worst.min(sim.goodput(start, start + span_s, 1.0));
        start += 0.25;
    }
    worst
}

/// The slow-path attacker: legit goodput at least 0.9 of a fixed `limit=100`'s (overall and
/// in every 5 s, probes included), the no-load latency the real 20 ms, legit p99 unharmed.
#[test]
fn a_slow_path_minority_does_not_drag_the_limit() {
    for (slow_share, seed) in [(0.2, 1), (0.2, 2), (0.3, 3), (0.1, 4)] {
        let fixed = slow_path_attack(Limiter::Fixed(100), slow_share, seed);
        let adaptive = slow_path_attack(Limiter::Adaptive, slow_share, seed);
        let reference = fixed.goodput(5.0, 70.0, 1.0);
        let goodput = adaptive.goodput(5.0, 70.0, 1.0);
        let what = format!(
            "slow share {slow_share}: adaptive {goodput:.0}/s, fixed {reference:.0}/s; \
             limits {:?}",
            adaptive.recent_limits()
        );
        assert!(goodput >= 0.9 * reference, "{what}");
        let worst = worst_span(&adaptive, 5.0, 70.0, 5.0);
        assert!(worst >= 0.85 * reference, "worst 5 s {worst:.0}/s; {what}");
        let no_load_ms = f64::from(adaptive.state.no_load_us) / 1000.0;
        assert!(
            (18.0..40.0).contains(&no_load_ms),
            "no-load {no_load_ms} ms; {what}"
        );
        // Every no-load latency learnt after the first seconds, not only the last.
        for &(at, _, _, no_load_us, _) in &adaptive.limits {
            if at > 5.0 {
                assert!(
                    no_load_us < 40_000,
                    "no-load {no_load_us} us at {at:.1}s; {what}"
                );
            }
        }
        let p99 = adaptive.latency_quantile(5.0, 70.0, 0.99);
        assert!(p99 < 0.1, "legit p99 {p99:.3}s; {what}");
    }
}

/// The same attacker when the upstream is overloaded as well: the limit still cuts (the legit
/// latency is what it judges), so the upstream is not run into the ground.
#[test]
fn a_slow_path_minority_does_not_blind_the_limit() {
    // Legit traffic at twice a small upstream's capacity (4 at once in 20 ms: 200/s), 5% of
    // the requests slow (about 30 of them in flight).
    let mut sim = Simulation::new(Shape::ProcessorSharing, 4.0, 0.020, 400.0 / 0.95, 7);
    sim.slow_share = 0.05;
    sim.run_until(30.0);
    let p99 = sim.latency_quantile(5.0, 30.0, 0.99);
    let goodput = sim.goodput(5.0, 30.0, 1.0);
    assert!(
        p99 <= 0.060,
        "legit p99 {p99:.3}s; limits {:?}",
        sim.recent_limits()
    );
    assert!(
        goodput >= 0.8 * 200.0,
        "goodput {goodput:.0}/s; limits {:?}",
        sim.recent_limits()
    );
}

/// A periodic probe costs little: at 2× overload over 70 s (two periodic probes), goodput of
/// every 5 s stays within 85% of capacity.
#[test]
fn probes_cost_a_small_share() {
    for shape in [Shape::ProcessorSharing, Shape::FifoPool, Shape::Bimodal] {
        let mut sim = Simulation::overloaded(shape, 40, 50, 2.0, 11);
        sim.run_until(70.0);
        let probes = sim
            .limits
            .windows(2)
            .filter(|pair| pair[0].2 == Phase::Track && pair[1].2 == Phase::Probe)
            .count();
        assert!(probes >= 2, "{shape:?}: {probes} probes");
        let worst = worst_span(&sim, 5.0, 70.0, 5.0);
        let capacity = sim.capacity_per_s();
        assert!(
            worst >= 0.85 * capacity,
            "{shape:?}: worst 5 s {worst:.0}/s of {capacity:.0}/s; limits {:?}",
            sim.recent_limits()
        );
    }
}

#[test]
fn quarter_and_back_table() {
    #[rustfmt::skip]
    let rows = [
        (Shape::ProcessorSharing, 40, 50),
        (Shape::FifoPool,         40, 50),
        (Shape::Bimodal,          40, 50),
        (Shape::FifoPool,         100, 20),
        (Shape::Bimodal,          100, 20),
        (Shape::FifoPool,         20, 200),
        (Shape::Bimodal,          40, 200),
    ];
    for (seed, (shape, capacity, base_ms)) in rows.into_iter().enumerate() {
        quarter_and_back(shape, capacity, base_ms, 0.9, seed as u64 + 1);
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 16,
        rng_seed: RngSeed::Fixed(27),
        ..ProptestConfig::default()
    })]

    /// `C → C/4 → C` on a FIFO worker pool (down to 4 workers): 90% of capacity in every phase;
    /// on the bimodal one (down to 10 workers), 80%: a few misses at once stall a good part of
    /// a small pool for 2.75 b, and some cases' 8 s at C/4 fall to 78-89% (the lowest of 640
    /// random cases: 78%); the table above holds its rows to 90%. The cases are drawn from a
    /// fixed seed, so that a run cannot fail on one of those edge cases and pass on the next.
    #[test]
    fn regrows_after_capacity_returns(
        bimodal in any::<bool>(),
        capacity in 16u32..160,
        base_ms in 10u64..200,
        seed in any::<u64>(),
    ) {
        let (shape, capacity, share) = if bimodal {
            (Shape::Bimodal, capacity.max(40), 0.8)
        } else {
            (Shape::FifoPool, capacity, 0.9)
        };
        quarter_and_back(shape, capacity, base_ms, share, seed);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// At twice its capacity, the upstream is kept busy (goodput within 10% of capacity) and
    /// its latency low (p99 within 2.5 b), once the first few seconds are past.
    #[test]
    fn converges_on_a_processor_sharing_upstream(
        capacity in 10u32..200,
        base_ms in 5u64..200,
        seed in any::<u64>(),
    ) {
        let mut sim = Simulation::overloaded(Shape::ProcessorSharing, capacity, base_ms, 2.0, seed);
        // From min to C takes some windows of 2 b each.
        let settled_s = 4.0 + 25.0 * base_ms as f64 / 1000.0;
        sim.run_until(settled_s + 6.0);
        assert_near_capacity(&sim, settled_s, settled_s + 6.0, 2.5, "steady");
        let limit = sim.limit();
        prop_assert!(limit >= capacity / 2 && limit <= 2 * capacity + 10, "limit {limit} for C {capacity}");
    }

    /// When the capacity halves, the limit follows: within 3 s of simulated time the goodput
    /// is back within 10% of the new capacity and the p99 within 2.5 b.
    #[test]
    fn follows_the_capacity_halving(
        capacity in 20u32..200,
        base_ms in 5u64..100,
        seed in any::<u64>(),
    ) {
        let mut sim = Simulation::overloaded(Shape::ProcessorSharing, capacity, base_ms, 2.0, seed);
        sim.run_until(8.0);
        sim.set_capacity(f64::from(capacity) / 2.0);
        sim.run_until(16.0);
        assert_near_capacity(&sim, 11.0, 16.0, 2.5, "after halving");
    }

    /// Whatever the samples and their timing, the limit stays within its bounds and the words
    /// round-trip.
    #[test]
    fn always_within_bounds(
        min in 1u32..50,
        span in 0u32..2000,
        windows in prop::collection::vec(
            (0u64..3 * SECOND, 0u16..100, 0u64..10 * SECOND, 0u32..3000),
            1..200,
        ),
    ) {
        let bounds = AdaptiveBounds::new(min, min + span);
        let mut limit = AdaptiveLimit::new(&bounds, 0);
        let mut now = 0u64;
        for (gap, samples, latency_ns, peak) in windows {
            now += gap;
            let latency_us = latency_ns / 1000;
            if samples > 0 {
                limit.seed(latency_us);
            }
            let window = Window::of(samples, latency_us, limit.no_load_us, peak);
            if limit.due(now, &window) {
                limit.close_window(&bounds, now, &window);
            }
            prop_assert!(limit.limit >= bounds.min && limit.limit <= bounds.max, "{limit:?}");
            prop_assert_eq!(AdaptiveLimit::unpack(&limit.pack(), &bounds), Some(limit));
        }
    }

    /// The median of a window is within its bucket's bounds of the true median.
    #[test]
    fn median_within_its_bucket(
        latencies in prop::collection::vec(1u64..100_000, 1..300),
        reference in 1u32..50_000,
    ) {
        let mut words = [0u64; 4];
        for &latency in &latencies {
            let bucket = bucket_of(latency, reference);
            words[bucket / 4] = histogram_add(words[bucket / 4], bucket).unwrap();
        }
        let window = Window::unpack(&words, 0);
        prop_assert_eq!(window.samples() as usize, latencies.len());
        let mut sorted = latencies.clone();
        sorted.sort_unstable();
        let lower = sorted[(sorted.len() - 1) / 2];
        let upper = sorted[sorted.len() / 2];
        let ratio = window.median_ratio().unwrap();
        let estimate = u64::from(reference) * ratio / 1024;
        let (low_bucket, high_bucket) = (bucket_of(lower, reference), bucket_of(upper, reference));
        let estimate_bucket = bucket_of(estimate, reference);
        prop_assert!(
            estimate_bucket + 1 >= low_bucket && estimate_bucket <= high_bucket + 1,
            "estimate {estimate} (bucket {estimate_bucket}) for median {lower}..{upper} \
             (buckets {low_bucket}..{high_bucket}), reference {reference}"
        );
    }
}

/// Rows of `(latency_us, reference_us, bucket)`: the bucket edges.
#[test]
fn bucket_table() {
    #[rustfmt::skip]
    let rows = [
        (0, 1000, 0), (499, 1000, 0), (500, 1000, 1),
        (750, 1000, 2), (875, 1000, 3), (999, 1000, 3), (1000, 1000, 4), (1124, 1000, 4),
        (1125, 1000, 5), (1250, 1000, 6), (1375, 1000, 7), (1500, 1000, 8), (1750, 1000, 9),
        (2000, 1000, 10), (2500, 1000, 11), (3000, 1000, 12), (4000, 1000, 13),
        (7999, 1000, 13), (8000, 1000, 14), (15999, 1000, 14), (16000, 1000, 15),
        (u64::MAX, 1000, 15),
        // A reference of 0 counts as 1 us.
        (1, 0, 4), (u64::MAX, 0, 15),
    ];
    for (latency, reference, bucket) in rows {
        assert_eq!(
            bucket_of(latency, reference),
            bucket,
            "{latency} us against {reference}"
        );
    }
    assert_eq!(BUCKETS, 16);
}

/// One window of tracking from a given limit: rows of `(limit, median as a ratio of the
/// no-load latency in 1/100, peak in flight, next limit)` with min 4, max 500. The median is
/// read at the middle of its bucket.
#[test]
fn gradient_rule_table() {
    #[rustfmt::skip]
    let rows = [
        // The median at the no-load level ([1, 9/8): 1.06), the limit in use: ×1.18, plus sqrt.
        (100, 100, 100, 128),  // 117 + 10
        (4,   100, 4,   6),    // 4 + 2
        // [5/4, 11/8): 1.31, ×0.97, and half of that step: some wait, the limit steadies.
        (100, 130, 100, 103),  // (100 + 97 + 9) / 2
        // Twice the no-load level ([2, 5/2): 2.25): ×0.57, half of that step.
        (100, 200, 100, 82),   // (100 + 57 + 7) / 2
        // Three times and more: the whole step.
        (100, 300, 100, 57),   // 50 + 7
        // Far above: at most halved (plus the square root).
        (100, 2000, 100, 57),  // 50 + 7
        (400, 1000, 400, 214), // 200 + 14
        // Far below: at most doubled (then the maximum).
        (100, 5, 100, 214),
        (400, 5, 400, 500),
        // Less than half the limit in use: no growth, a fall still applies.
        (100, 100, 49, 100),
        (100, 200, 49, 82),
        // Bounded below by min.
        (4, 2000, 4, 4),
    ];
    let bounds = AdaptiveBounds::new(4, 500);
    for (from, ratio_percent, peak, expected) in rows {
        let no_load_us = 20_000;
        let mut limit = tracking(&bounds, from, no_load_us);
        let window = Window::of(
            10,
            no_load_us as u64 * ratio_percent / 100,
            no_load_us,
            peak,
        );
        limit.close_window(&bounds, 200 * MS, &window);
        assert_eq!(
            limit.limit, expected,
            "from {from}, median {ratio_percent}% of the no-load latency, peak {peak}"
        );
    }
}

/// A limit tracking at `limit` with the given no-load latency, its window open since 100 ms.
fn tracking(bounds: &AdaptiveBounds, limit: u32, no_load_us: u32) -> AdaptiveLimit {
    let mut state = AdaptiveLimit::new(bounds, 0);
    state.seed(u64::from(no_load_us));
    let probe = Window::of(
        PROBE_SAMPLES as u16,
        u64::from(no_load_us),
        no_load_us,
        bounds.min,
    );
    state.close_window(bounds, 100 * MS, &probe);
    state.no_load_us = no_load_us;
    state.provisional = false;
    state.limit = limit;
    state
}

/// A minority of slow samples in a window moves neither the median nor the limit's fall; a
/// majority does.
#[test]
fn the_median_ignores_a_slow_minority() {
    let bounds = AdaptiveBounds::new(4, 500);
    let no_load = 20_000u32;
    let mut window = Window::of(70, 20_000, no_load, 100);
    window.buckets[bucket_of(1_500_000, no_load)] = 30;
    let ratio = window.median_ratio().unwrap();
    assert!((1024..1152).contains(&ratio), "{ratio}");
    let mut limit = tracking(&bounds, 100, no_load);
    limit.close_window(&bounds, 200 * MS, &window);
    assert!(limit.limit > 100, "{limit:?}");
    let mut window = Window::of(40, 20_000, no_load, 100);
    window.buckets[bucket_of(1_500_000, no_load)] = 60;
    let mut limit = tracking(&bounds, 100, no_load);
    limit.close_window(&bounds, 200 * MS, &window);
    assert!(limit.limit < 100, "{limit:?}");
}

/// A new key seeds its reference with its first sample and probes at `min`; the probe takes
/// only its own requests, ends after `PROBE_SAMPLES`, and resumes; a probe whose median fell
/// far from its reference runs again; periodic probes run at half the limit and learn a
/// change of the upstream's own speed.
#[test]
fn probes_learn_the_no_load_latency_again() {
    let bounds = AdaptiveBounds::new(4, 500);
    let mut limit = AdaptiveLimit::new(&bounds, 0);
    assert_eq!(
        (limit.phase, limit.limit, limit.no_load_us),
        (Phase::Probe, 4, 0)
    );
    let probe_epoch = limit.epoch;
    assert!(limit.accepts(probe_epoch) && !limit.accepts(probe_epoch - 1));
    // The first sample is a slow one: 1 s. It is the reference; the probe's median (10 ms)
    // is far under it, so it is learnt roughly and measured again.
    assert!(limit.seed(1_000_000));
    assert!(!limit.seed(5), "seeded once");
    let window = |samples: u16, latency_us: u64, reference: u32, peak: u32| {
        Window::of(samples, latency_us, reference, peak)
    };
    let reference = limit.no_load_us;
    // At least four times the latency known (here the seed's, 1 s; at most 2 s).
    assert_eq!(limit.probe_min_ns(), PROBE_MAX_NS);
    let end = PROBE_MAX_NS;
    assert!(!limit.due(
        end - 1,
        &window(PROBE_SAMPLES as u16 - 1, 10_000, reference, 4)
    ));
    assert!(!limit.due(end - 1, &window(PROBE_SAMPLES as u16, 10_000, reference, 4)));
    assert!(limit.due(end, &window(PROBE_SAMPLES as u16, 10_000, reference, 4)));
    limit.close_window(&bounds, end, &window(16, 10_000, reference, 4));
    assert_eq!(limit.phase, Phase::Track);
    assert!(
        limit.provisional && limit.no_load_us <= 250_000,
        "{limit:?}"
    );
    // The next window starts the probe again, around the rough estimate, until a probe's
    // median falls near its reference.
    let mut now = end;
    for _ in 0..5 {
        now += 200 * MS;
        // One request at a time: the limit does not grow.
        limit.close_window(&bounds, now, &window(20, 10_000, limit.no_load_us, 1));
        assert_eq!((limit.phase, limit.limit), (Phase::Probe, 4));
        let reference = limit.no_load_us;
        now += PROBE_MAX_NS;
        limit.close_window(&bounds, now, &window(16, 10_000, reference, 4));
        assert_eq!(limit.phase, Phase::Track);
        if !limit.provisional {
            break;
        }
    }
    assert!(!limit.provisional, "{limit:?}");
    assert!((9_000..11_300).contains(&limit.no_load_us), "{limit:?}");

    // Grow to well above min, then let the relearn interval pass.
    let no_load = limit.no_load_us;
    let start = now;
    for _ in 0..20 {
        now += WINDOW_NS;
        let peak = limit.limit;
        limit.close_window(&bounds, now, &window(50, u64::from(no_load), no_load, peak));
    }
    assert_eq!(limit.phase, Phase::Track);
    let grown = limit.limit;
    assert!(grown > 100, "{grown}");
    now = start + RELEARN_INTERVAL_NS;
    limit.close_window(
        &bounds,
        now,
        &window(50, u64::from(no_load), no_load, grown),
    );
    let resume = limit.resume_limit;
    assert_eq!((limit.phase, limit.limit), (Phase::Probe, resume / 2));
    // The upstream is slower now: 15 ms at no load. The probe learns it and resumes.
    limit.close_window(
        &bounds,
        now + 200 * MS,
        &window(16, 15_000, no_load, resume / 2),
    );
    assert_eq!((limit.phase, limit.limit), (Phase::Track, resume));
    assert!((14_000..16_500).contains(&limit.no_load_us), "{limit:?}");

    // A periodic probe that sees too few requests ends after PROBE_MAX_NS, learning nothing.
    let before = limit.no_load_us;
    now += RELEARN_INTERVAL_NS + 300 * MS;
    limit.close_window(
        &bounds,
        now,
        &window(50, u64::from(before), before, limit.limit),
    );
    assert_eq!(limit.phase, Phase::Probe);
    assert!(!limit.due(now + PROBE_MAX_NS - 1, &window(2, 90_000, before, 2)));
    assert!(limit.due(now + PROBE_MAX_NS, &window(0, 0, before, 0)));
    limit.close_window(&bounds, now + PROBE_MAX_NS, &window(2, 90_000, before, 2));
    assert_eq!((limit.phase, limit.no_load_us), (Phase::Track, before));

    // A new key's probe with few requests ends after PROBE_MAX_NS with what it has.
    let mut limit = AdaptiveLimit::new(&bounds, 0);
    assert!(
        !limit.due(6 * SECOND, &window(0, 0, 0, 0)),
        "nothing to end with"
    );
    limit.seed(7_000);
    assert!(!limit.due(PROBE_MAX_NS - 1, &window(2, 7_000, 7_000, 2)));
    assert!(limit.due(PROBE_MAX_NS, &window(2, 7_000, 7_000, 2)));
    limit.close_window(&bounds, PROBE_MAX_NS, &window(2, 7_000, 7_000, 2));
    assert_eq!(limit.phase, Phase::Track);
    assert!((7_000..7_900).contains(&limit.no_load_us), "{limit:?}");
}

/// The median high even at `min` for five windows in a row: the no-load level is measured
/// again, at twice `min` (the slots at `min` may all be held by requests slow on their own).
#[test]
fn stuck_at_min_relearns() {
    let bounds = AdaptiveBounds::new(4, 500);
    let mut limit = tracking(&bounds, 4, 10_000);
    let slow = Window::of(20, 50_000, 10_000, 4);
    let mut now = 100 * MS;
    for round in 1..5 {
        now += WINDOW_NS;
        limit.close_window(&bounds, now, &slow);
        assert_eq!((limit.phase, limit.windows_at_min), (Phase::Track, round));
    }
    now += WINDOW_NS;
    limit.close_window(&bounds, now, &slow);
    assert_eq!((limit.phase, limit.limit), (Phase::Probe, 8));
    // 5 times the old level: learnt roughly (the histogram is coarse there), then again.
    limit.close_window(&bounds, now + 500 * MS, &slow);
    assert_eq!(limit.phase, Phase::Track);
    assert!(limit.provisional, "{limit:?}");
    now += 600 * MS;
    limit.close_window(&bounds, now, &Window::of(20, 50_000, limit.no_load_us, 4));
    assert_eq!(limit.phase, Phase::Probe);
    let reference = limit.no_load_us;
    limit.close_window(
        &bounds,
        now + PROBE_MAX_NS,
        &Window::of(20, 50_000, reference, 4),
    );
    assert_eq!(limit.phase, Phase::Track);
    assert!(!limit.provisional, "{limit:?}");
    assert!((45_000..56_000).contains(&limit.no_load_us), "{limit:?}");
}

/// At `min` for five windows, every completion slow, while the probe's own requests are as
/// fast as ever: the slots were held by requests slow on their own. The no-load level stays,
/// and the key resumes at the probe's limit, with room beside them.
#[test]
fn slots_held_by_slow_requests_are_not_a_slow_upstream() {
    let bounds = AdaptiveBounds::new(4, 500);
    // A key of 10 ms at `min`, whose windows see only 1.5 s requests until it relearns.
    let relearning = || {
        let mut limit = tracking(&bounds, 4, 10_000);
        let slow = Window::of(20, 1_500_000, 10_000, 4);
        let mut now = 100 * MS;
        for _ in 0..WINDOWS_AT_MIN_BEFORE_RELEARN {
            now += WINDOW_NS;
            limit.close_window(&bounds, now, &slow);
        }
        (limit, now)
    };
    let (mut limit, now) = relearning();
    assert_eq!((limit.phase, limit.limit), (Phase::Probe, 8));
    // The probe's requests: 5 slow (the slow URL's clients took slots back), 11 fast.
    let mut probe = Window::of(11, 10_000, 10_000, 8);
    probe.buckets[bucket_of(1_500_000, 10_000)] = 5;
    limit.close_window(&bounds, now + 500 * MS, &probe);
    assert_eq!(limit.phase, Phase::Track);
    assert!((10_000..11_300).contains(&limit.no_load_us), "{limit:?}");
    assert_eq!(limit.limit, 8);
    // Had most of them been slow, the first quartile would still be the fast ones.
    let (mut limit, now) = relearning();
    let mut probe = Window::of(5, 10_000, 10_000, 8);
    probe.buckets[bucket_of(1_500_000, 10_000)] = 11;
    limit.close_window(&bounds, now + 500 * MS, &probe);
    assert!((10_000..11_300).contains(&limit.no_load_us), "{limit:?}");
}

/// A count saturates instead of wrapping into its neighbour, and a full count closes the
/// window.
#[test]
fn histogram_words() {
    let bounds = AdaptiveBounds::new(4, 500);
    let limit = tracking(&bounds, 50, 10_000);
    let mut word = 0;
    let mut added = 0u32;
    while let Some(next) = histogram_add(word, 5) {
        word = next;
        added += 1;
    }
    assert_eq!(added, u32::from(u16::MAX));
    let words = [0, word, 0, 0];
    let window = Window::unpack(&words, 0);
    assert_eq!(window.buckets[5], u16::MAX);
    assert_eq!(window.buckets[4] + window.buckets[6], 0);
    assert!(limit.due(0, &window), "a full window closes at once");
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

/// Clients in a closed loop, as `t/adaptive_attack.rs` runs them against nginx: each starts a
/// request every `cycle` at most, the next one as soon as the last is answered when that took
/// longer. 8 legit clients (20 ms, every 80 ms) and 30 attackers (1.5 s, every 1.5 s) on one
/// key, an upstream of ample capacity. An attacker whose request completes asks again at once,
/// so it takes back the slot it gave up before any other client: a probe whose limit is under
/// the attackers' slots is handed to them, and its samples are 1.5 s.
struct ClosedLoop {
    bounds: AdaptiveBounds,
    state: AdaptiveLimit,
    histogram: [u64; 4],
    peak: u32,
    in_flight: u32,
    seed: u64,
    events: BinaryHeap<Reverse<Event>>,
    legit_refused: u64,
    legit_passed: u64,
    /// (time, limit, no-load latency) at every window closed.
    history: Vec<(f64, u32, u32)>,
}

/// (time, client, completes: the request's admission time and epoch).
type Event = (At, usize, Option<(At, u16)>);

const LEGIT_CLIENTS: usize = 8;
const ATTACKERS: usize = 30;

impl ClosedLoop {
    fn new(seed: u64) -> ClosedLoop {
        let bounds = AdaptiveBounds::new(4, 200);
        let mut sim = ClosedLoop {
            bounds,
            state: AdaptiveLimit::new(&bounds, 0),
            histogram: [0; 4],
            peak: 0,
            in_flight: 0,
            seed: seed.wrapping_mul(2) | 1,
            events: BinaryHeap::new(),
            legit_refused: 0,
            legit_passed: 0,
            history: Vec::new(),
        };
        for client in 0..LEGIT_CLIENTS + ATTACKERS {
            let (cycle, _) = Self::shape(client);
            let start = cycle * sim.random();
            sim.events.push(Reverse((At(start), client, None)));
        }
        sim
    }

    /// A client's cycle and its request's latency, in seconds.
    fn shape(client: usize) -> (f64, f64) {
        if client < LEGIT_CLIENTS {
            (0.080, 0.020)
        } else {
            (1.5, 1.5)
        }
    }

    fn random(&mut self) -> f64 {
        self.seed = self
            .seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.seed >> 11) as f64 / (1u64 << 53) as f64
    }

    fn run_until(&mut self, end_s: f64, counting: bool) {
        while let Some(Reverse((At(now_s), client, completes))) = self.events.peek().copied() {
            if now_s >= end_s {
                break;
            }
            self.events.pop();
            let (cycle, latency) = Self::shape(client);
            let legit = client < LEGIT_CLIENTS;
            match completes {
                None if self.in_flight >= self.state.limit => {
                    if legit && counting {
                        self.legit_refused += 1;
                    }
                    // A refusal is answered in a fraction of a millisecond.
                    let next = now_s + cycle;
                    self.events.push(Reverse((At(next), client, None)));
                }
                None => {
                    if legit && counting {
                        self.legit_passed += 1;
                    }
                    self.in_flight += 1;
                    self.peak = self.peak.max(self.in_flight);
                    // nginx, the upstream and a loaded machine add a few milliseconds.
                    let done = now_s + latency + 0.001 - 0.004 * (1.0 - self.random()).ln();
                    let admitted = Some((At(now_s), self.state.epoch));
                    self.events.push(Reverse((At(done), client, admitted)));
                }
                Some((At(started_s), epoch)) => {
                    self.in_flight -= 1;
                    self.sample(now_s, started_s, epoch);
                    // The client asks again when its cycle is up, or at once (the answer's
                    // round trip) when the request took longer.
                    let next = (started_s + cycle).max(now_s + 0.0002 + 0.0008 * self.random());
                    self.events.push(Reverse((At(next), client, None)));
                }
            }
        }
    }

    /// What `control::concurrency::sample` does.
    fn sample(&mut self, now_s: f64, started_s: f64, epoch: u16) {
        let latency_us = ((now_s - started_s) * 1e6).ceil() as u64;
        self.state.seed(latency_us);
        if self.state.accepts(epoch) {
            let bucket = self.state.bucket(latency_us);
            if let Some(next) = histogram_add(self.histogram[bucket / 4], bucket) {
                self.histogram[bucket / 4] = next;
            }
        }
        let window = Window::unpack(&self.histogram, self.peak);
        let now_ns = (now_s * 1e9) as u64;
        if self.state.due(now_ns, &window) {
            self.state.close_window(&self.bounds, now_ns, &window);
            self.histogram = [0; 4];
            self.peak = self.in_flight;
            self.history
                .push((now_s, self.state.limit, self.state.no_load_us));
        }
    }
}

/// `t/adaptive_attack.rs` in simulated time, over 400 seeds: the key, born under the attack,
/// grows to 34 (room for the attackers' 30 and the legit few) within 60 s (in 2.2 s for half
/// the seeds, 13 s for 95%, 28 s at most); the 65 s after (two periodic probes) never learn a
/// no-load latency of 200 ms or more, refuse under 5% of the legit requests and never put the
/// limit under 34. With the relearning probe at `min` and the median as the no-load level,
/// 43 of the 400 failed, 39 of them by learning 200 ms or more (most the slow path's 1.5 s):
/// stuck at `min`, every slot held by a slow request, the probe at `min` was handed to them.
#[test]
fn a_closed_loop_attacker_does_not_teach_its_latency() {
    let mut failures = Vec::new();
    for seed in 1..=400u64 {
        let mut sim = ClosedLoop::new(seed);
        let mut grown_s = None;
        let mut at_s = 0.0;
        while at_s < 60.0 {
            at_s += 0.1;
            sim.run_until(at_s, false);
            if sim.state.limit >= 34 {
                grown_s = Some(at_s);
                break;
            }
        }
        let Some(grown_s) = grown_s else {
            failures.push(format!("seed {seed}: never grew to 34: {:?}", sim.state));
            continue;
        };
        let from = sim.history.len();
        sim.run_until(grown_s + 65.0, true);
        let judged = &sim.history[from..];
        let highest = judged
            .iter()
            .map(|&(_, _, no_load)| no_load)
            .max()
            .unwrap_or(0);
        let lowest = judged.iter().map(|&(_, limit, _)| limit).min().unwrap_or(0);
        let refused = sim.legit_refused as f64 / (sim.legit_passed + sim.legit_refused) as f64;
        if highest >= 200_000 || lowest < 34 || refused >= 0.05 {
            failures.push(format!(
                "seed {seed} (grown at {grown_s:.1} s): highest no-load {highest} us, lowest \
                 limit {lowest}, legit refused {refused:.3}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
