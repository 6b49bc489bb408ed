//! Decide many requests in a loop, for counting instructions per decision under callgrind:
//!
//! ```text
//! cargo build --release -p ratelimit-core --example decide_loop
//! valgrind --tool=callgrind --toggle-collect='decide_loop::run_*' \
//!     target/release/examples/decide_loop leaky_bucket 100000
//! ```
//!
//! The workload is the criterion bench's (10,000 keys in a fixed pseudo-random order, one
//! microsecond between decisions, 50 r/s allowed, about half the decisions rejected), but the
//! states live in a plain `Vec` indexed by key so the count is the decision's, not a hash
//! map's. The clock starts at 10^15 ns (about 11 days of uptime), like a real
//! `CLOCK_MONOTONIC`. `none` runs the same loop without deciding: subtract it. A third
//! argument sets the number of keys (`decide_loop leaky_bucket 100000 1000000`: nearly every
//! decision is a key's first). A fourth chooses what is called and read:
//!
//! * `fields` (the default): the algorithm's own `decide`, every field of the decision read;
//! * `outcome`: the same, reading only the outcome and the new state, as the module's hot path
//!   does when it reports nothing (the other fields, and their divisions, are not computed);
//! * `word`: `decide_word`, every field read (one loop for the three algorithms, whose code
//!   then shares registers and moves with unrelated changes).

use std::hint::black_box;

use ratelimit_core::{
    decide_word, leaky_bucket, sliding_log, sliding_window, token_bucket, Algorithm, Decision,
    DelayMode, Outcome, Policy, ZoneSpec,
};

const STEP_NS: u64 = 1_000;
const START_NS: u64 = 1_000_000_000_000_000;

fn key_sequence(length: usize, keys: usize) -> Vec<u32> {
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    (0..length)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % keys as u64) as u32
        })
        .collect()
}

fn policy(words: &[&str]) -> Policy {
    let zone = ZoneSpec::parse_words(words).expect("zone words parse");
    Policy {
        algorithm: zone.algorithm,
        limits: zone.limits(),
        delay: DelayMode::NoDelay,
        cost: 1,
    }
}

/// Every field of a decision, so that none is left uncomputed, folded into a count of the
/// requests passed in the low 32 bits (a few instructions, the same for every algorithm).
#[inline(always)]
fn checksum(decision: &Decision) -> u64 {
    let fields = decision.delay_ns
        ^ decision.retry_after_ns
        ^ decision.remaining
        ^ decision.reset_ns
        ^ decision.excess_milli;
    u64::from(decision.outcome == Outcome::Passed) + (fields << 32)
}

#[inline(never)]
fn run_none(keys: &[u32], states: &mut [u64]) -> u64 {
    let mut now_ns = START_NS;
    let mut passed = 0;
    for &key in keys {
        now_ns += STEP_NS;
        let state = &mut states[key as usize];
        *state = black_box(*state ^ now_ns);
        passed += checksum(&Decision::rejected(*state, 0, 0));
    }
    passed
}

#[inline(never)]
fn run_word(keys: &[u32], states: &mut [u64], policy: &Policy) -> u64 {
    let mut now_ns = START_NS;
    let mut passed = 0;
    for &key in keys {
        now_ns += STEP_NS;
        let state = &mut states[key as usize];
        let (decision, next) = decide_word(*state, now_ns, black_box(policy));
        if let Some(next) = next {
            *state = next;
        }
        passed += checksum(&decision);
    }
    passed
}

/// One algorithm's `decide` in a loop of its own; with `FIELDS` false only the outcome and
/// the new state are read.
#[inline(never)]
fn run_algorithm<const FIELDS: bool, D>(
    keys: &[u32],
    states: &mut [u64],
    policy: &Policy,
    decide: D,
) -> u64
where
    D: Fn(u64, u64, &Policy) -> (Decision, Option<u64>),
{
    let mut now_ns = START_NS;
    let mut passed = 0;
    for &key in keys {
        now_ns += STEP_NS;
        let state = &mut states[key as usize];
        let (decision, next) = decide(*state, now_ns, black_box(policy));
        if let Some(next) = next {
            *state = next;
        }
        passed += if FIELDS {
            checksum(&decision)
        } else {
            u64::from(decision.outcome == Outcome::Passed)
        };
    }
    passed
}

fn single_word_loop(keys: &[u32], states: &mut [u64], policy: &Policy, mode: &str) -> u64 {
    match (mode, policy.algorithm) {
        ("word", _) => run_word(keys, states, policy),
        ("fields", Algorithm::LeakyBucket) => {
            run_algorithm::<true, _>(keys, states, policy, |s, n, p| {
                leaky_bucket::decide(s, n, p)
            })
        }
        ("fields", Algorithm::TokenBucket) => {
            run_algorithm::<true, _>(keys, states, policy, |s, n, p| {
                token_bucket::decide(s, n, p)
            })
        }
        ("fields", Algorithm::SlidingWindow) => {
            run_algorithm::<true, _>(keys, states, policy, |s, n, p| {
                sliding_window::decide(s, n, p)
            })
        }
        ("outcome", Algorithm::LeakyBucket) => {
            run_algorithm::<false, _>(keys, states, policy, |s, n, p| {
                leaky_bucket::decide(s, n, p)
            })
        }
        ("outcome", Algorithm::TokenBucket) => {
            run_algorithm::<false, _>(keys, states, policy, |s, n, p| {
                token_bucket::decide(s, n, p)
            })
        }
        ("outcome", Algorithm::SlidingWindow) => {
            run_algorithm::<false, _>(keys, states, policy, |s, n, p| {
                sliding_window::decide(s, n, p)
            })
        }
        (mode, algorithm) => panic!("no {mode:?} loop for {algorithm}"),
    }
}

#[inline(never)]
fn run_log(keys: &[u32], logs: &mut [u64], words: usize, policy: &Policy) -> u64 {
    let mut now_ns = START_NS;
    let mut passed = 0;
    for &key in keys {
        now_ns += STEP_NS;
        let start = key as usize * words;
        let log = &mut logs[start..start + words];
        let decision = sliding_log::decide(log, now_ns, black_box(policy));
        passed += checksum(&decision);
    }
    passed
}

fn main() {
    let mut args = std::env::args().skip(1);
    let algorithm = args.next().unwrap_or_else(|| "leaky_bucket".into());
    let count = args.next().map_or(100_000, |n| n.parse().expect("a count"));
    let key_count = args
        .next()
        .map_or(10_000, |n| n.parse().expect("a key count"));
    let keys = key_sequence(count, key_count);
    let mode = args.next().unwrap_or_else(|| "fields".into());
    let run_word = |keys: &[u32], states: &mut [u64], policy: &Policy| {
        single_word_loop(keys, states, policy, &mode)
    };
    let rate = "rate=50r/s";
    let passed = match algorithm.as_str() {
        "none" => run_none(&keys, &mut vec![0; key_count]),
        "leaky_bucket" => run_word(&keys, &mut vec![0; key_count], &policy(&[rate, "burst=4"])),
        "token_bucket" => run_word(
            &keys,
            &mut vec![0; key_count],
            &policy(&[rate, "burst=5", "algorithm=token_bucket"]),
        ),
        "sliding_window" => run_word(
            &keys,
            &mut vec![0; key_count],
            &policy(&[rate, "algorithm=sliding_window"]),
        ),
        "sliding_log" => {
            let policy = policy(&[rate, "algorithm=sliding_log"]);
            let words = sliding_log::words_for(sliding_log::window_limit(&policy.limits.rate));
            run_log(&keys, &mut vec![0; key_count * words], words, &policy)
        }
        other => panic!("unknown algorithm {other:?}"),
    };
    println!(
        "{algorithm}: {} of {count} passed",
        passed & u64::from(u32::MAX)
    );
}
