//! Nanoseconds per decision, single thread: each algorithm of this crate keyed by a
//! `HashMap<u64, state>` of 10,000 keys, next to governor's keyed limiters on the same keys.
//!
//! Every iteration advances the clock by one microsecond and decides one request for the next
//! key of a fixed pseudo-random sequence, so each key is offered about 100 requests per
//! second against a limit of 50 r/s: about half the decisions pass, half are rejected. All
//! keys are in the map before measuring (the warm-up visits them all), so this is the cost of
//! a lookup plus a decision, not of inserting. Both sides read the clock from a plain integer
//! (governor through a `Clock` that returns it), so neither pays for a system clock.
//!
//! `cargo bench -p ratelimit-core --bench algorithms`; bench/run.sh runs it and reads
//! criterion's estimates from target/criterion/decision/.

use std::cell::Cell;
use std::collections::HashMap;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::rc::Rc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::keyed::{DashMapStateStore, HashMapStateStore, KeyedStateStore};
use governor::{Quota, RateLimiter};
use ratelimit_core::{decide_word, sliding_log, DelayMode, Policy, ZoneSpec};

const KEYS: u64 = 10_000;
/// Length of the key sequence (a power of two, so the index wraps with a mask).
const SEQUENCE: usize = 1 << 16;
const STEP_NS: u64 = 1_000;
const RATE_PER_SEC: u32 = 50;
/// Requests a key may send at once: governor's `allow_burst`, leaky `burst + 1`, token `burst`.
const BURST: u32 = 5;

/// The keys in the order they are decided: every key of 0..KEYS, spread over 64-bit values,
/// visited in a fixed pseudo-random order (xorshift), the same for every bench.
fn key_sequence() -> Vec<u64> {
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    (0..SEQUENCE)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % KEYS).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        })
        .collect()
}

fn policy(words: &[&str]) -> Policy {
    let zone = ZoneSpec::parse_words(words).expect("bench zone words parse");
    Policy {
        algorithm: zone.algorithm,
        limits: zone.limits(),
        delay: DelayMode::NoDelay,
        cost: 1,
    }
}

/// One of this crate's single-word algorithms over a `HashMap<u64, u64>`.
fn bench_word(c: &mut Criterion, name: &str, policy: Policy) {
    let keys = key_sequence();
    let mut group = c.benchmark_group("decision");
    group.throughput(Throughput::Elements(1));
    group.bench_function(BenchmarkId::new("ours", name), |b| {
        let mut states: HashMap<u64, u64> = HashMap::with_capacity(KEYS as usize);
        let mut now_ns = 0u64;
        let mut index = 0usize;
        b.iter(|| {
            now_ns += STEP_NS;
            let key = keys[index & (SEQUENCE - 1)];
            index += 1;
            let state = states.entry(key).or_insert(0);
            let (decision, next) = decide_word(*state, now_ns, &policy);
            if let Some(next) = next {
                *state = next;
            }
            black_box(decision.outcome)
        });
    });
    group.finish();
}

/// The sliding log: a `HashMap<u64, Box<[u64]>>` of one header word plus N timestamps.
fn bench_sliding_log(c: &mut Criterion) {
    let policy = policy(&[&format!("rate={RATE_PER_SEC}r/s"), "algorithm=sliding_log"]);
    let words = sliding_log::words_for(sliding_log::window_limit(&policy.limits.rate));
    let keys = key_sequence();
    let mut group = c.benchmark_group("decision");
    group.throughput(Throughput::Elements(1));
    group.bench_function(BenchmarkId::new("ours", "sliding_log"), |b| {
        let mut logs: HashMap<u64, Box<[u64]>> = HashMap::with_capacity(KEYS as usize);
        let mut now_ns = 0u64;
        let mut index = 0usize;
        b.iter(|| {
            now_ns += STEP_NS;
            let key = keys[index & (SEQUENCE - 1)];
            index += 1;
            let log = logs
                .entry(key)
                .or_insert_with(|| vec![0; words].into_boxed_slice());
            black_box(sliding_log::decide(log, now_ns, &policy).outcome)
        });
    });
    group.finish();
}

/// A clock governor reads from the bench's integer, like the `now_ns` ours is given.
#[derive(Clone, Default)]
struct StepClock(Rc<Cell<u64>>);

impl Clock for StepClock {
    type Instant = Nanos;

    fn now(&self) -> Nanos {
        Nanos::from(self.0.get())
    }
}

fn bench_governor<S>(c: &mut Criterion, name: &str)
where
    S: KeyedStateStore<u64> + Default,
{
    let keys = key_sequence();
    let quota = Quota::per_second(NonZeroU32::new(RATE_PER_SEC).expect("non-zero rate"))
        .allow_burst(NonZeroU32::new(BURST).expect("non-zero burst"));
    let mut group = c.benchmark_group("decision");
    group.throughput(Throughput::Elements(1));
    group.bench_function(BenchmarkId::new("governor", name), |b| {
        let clock = StepClock::default();
        let limiter: RateLimiter<u64, S, StepClock, NoOpMiddleware<Nanos>> =
            RateLimiter::new(quota, S::default(), clock.clone());
        let mut now_ns = 0u64;
        let mut index = 0usize;
        b.iter(|| {
            now_ns += STEP_NS;
            clock.0.set(now_ns);
            let key = keys[index & (SEQUENCE - 1)];
            index += 1;
            black_box(limiter.check_key(&key).is_ok())
        });
    });
    group.finish();
}

fn algorithms(c: &mut Criterion) {
    let rate = format!("rate={RATE_PER_SEC}r/s");
    // leaky_bucket: `burst` excess requests beyond the first, so BURST at once in all.
    let burst = format!("burst={}", BURST - 1);
    bench_word(c, "leaky_bucket", policy(&[&rate, &burst]));
    // token_bucket: a bucket of `burst` tokens.
    let tokens = format!("burst={BURST}");
    bench_word(
        c,
        "token_bucket",
        policy(&[&rate, &tokens, "algorithm=token_bucket"]),
    );
    bench_word(
        c,
        "sliding_window",
        policy(&[&rate, "algorithm=sliding_window"]),
    );
    bench_sliding_log(c);
    bench_governor::<DashMapStateStore<u64>>(c, "keyed_dashmap");
    bench_governor::<HashMapStateStore<u64>>(c, "keyed_hashmap");
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50);
    targets = algorithms
}
criterion_main!(benches);
