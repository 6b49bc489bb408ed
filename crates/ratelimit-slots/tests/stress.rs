//! Issue 37: a key's requests are decided as its own requests say, never refused by a state
//! they cannot have made. Many threads (on two cores, so that they are preempted anywhere)
//! run the module's request path (`path.rs`: the real table, its memory orderings and the
//! bucket's real charge) on a table of 16 slots under constant eviction, at a few million
//! requests a second. Every key is fresh and sent exactly three requests, from whichever
//! threads take them, under a limit that holds three: each must pass.
//!
//! `STRESS_SECONDS` lengthens the run (default 2 s; `cargo test --release` for speed).

mod path;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use path::Time;
use ratelimit_core::Outcome;
use ratelimit_slots::{key_id, Table, SLOTS_PER_BUCKET};

/// More threads than cores: a thread is preempted between any two of its steps.
const THREADS: usize = 8;
/// Requests each key is sent, and the bucket's size.
const REQUESTS_PER_KEY: usize = 3;

/// A key's hash from its number (splitmix64's finalizer): keys spread over the windows.
fn hash(n: u64) -> u64 {
    let mut x = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

struct Run {
    requests: u64,
    refused: u64,
    seconds: f64,
}

/// Requests until `until` says stop (asked every 1024 requests of a thread, with the
/// refusals so far): request `n` (a shared counter) is one of key `n / 3`'s, so a key's three
/// requests go to three threads at about the same time.
fn run(time: Time, until: impl Fn(Duration, u64) -> bool + Sync) -> Run {
    let words: Vec<AtomicU64> = (0..4 * SLOTS_PER_BUCKET * 2)
        .map(|_| AtomicU64::new(0))
        .collect();
    let table = Table::new(&words, 2);
    let lock = Mutex::new(());
    let bucket = path::bucket(REQUESTS_PER_KEY as u64);
    let started = Instant::now();
    // CLOCK_MONOTONIC, as the module's clock: a time of day far from 0.
    let clock = || 1_000_000_000_000 + started.elapsed().as_nanos() as u64;
    let next = AtomicUsize::new(0);
    let requests = AtomicU64::new(0);
    let refused = AtomicU64::new(0);
    std::thread::scope(|scope| {
        for _ in 0..THREADS {
            scope.spawn(|| loop {
                for _ in 0..1024 {
                    let n = next.fetch_add(1, Ordering::Relaxed) / REQUESTS_PER_KEY;
                    let id = key_id(hash(n as u64));
                    let outcome =
                        path::request(&table, &|| lock.lock().unwrap(), id, &clock, &bucket, time);
                    if outcome != Outcome::Passed {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                }
                requests.fetch_add(1024, Ordering::Relaxed);
                if until(started.elapsed(), refused.load(Ordering::Relaxed)) {
                    break;
                }
            });
        }
    });
    Run {
        requests: requests.into_inner(),
        refused: refused.into_inner(),
        seconds: started.elapsed().as_secs_f64(),
    }
}

fn seconds() -> u64 {
    std::env::var("STRESS_SECONDS")
        .ok()
        .and_then(|seconds| seconds.parse().ok())
        .unwrap_or(2)
}

#[test]
fn a_fresh_keys_three_requests_all_pass() {
    let budget = Duration::from_secs(seconds());
    let run = run(Time::Module, |elapsed, _| elapsed >= budget);
    eprintln!(
        "{} requests in {:.1} s ({:.1} M/s), {} refused",
        run.requests,
        run.seconds,
        run.requests as f64 / run.seconds / 1e6,
        run.refused
    );
    assert_eq!(run.refused, 0, "of {} requests", run.requests);
}

/// The same stress with the time read before the lookup only (the module before issue 37):
/// a thread preempted between its reading and its charge while another charges the key
/// twice at later times finds the key further ahead of its reading than the three requests
/// allow, and refuses the third. Proves the stress sees the race it guards against.
#[test]
fn the_time_read_before_the_lookup_alone_refuses() {
    let budget = Duration::from_secs(20 * seconds());
    let run = run(Time::BeforeLookupOnly, |elapsed, refused| {
        refused > 0 || elapsed >= budget
    });
    eprintln!(
        "time read before the lookup only: {} refused of {} requests in {:.1} s",
        run.refused, run.requests, run.seconds
    );
    assert!(run.refused > 0, "no refusal in {} requests", run.requests);
}
