//! Issue 37: the whole request path (`path.rs`) under shuttle's randomized schedulers, which
//! run longer schedules than loom can explore exhaustively. Three threads each send one
//! request for each of six fresh keys, in their own orders, to a window of four slots full of
//! idle keys: every request claims, evicts, pins and charges while the others do, under a
//! bucket that holds three requests. Every request must pass, and no key may end up with
//! more requests charged than it was sent.
//!
//! Runs in the normal `cargo test` pass (a few seconds).

mod path;

use std::sync::atomic::Ordering;

use ratelimit_core::Outcome;
use ratelimit_slots::{Table, Word};
use shuttle::sync::{Arc, Mutex};
use shuttle::thread;

/// Shuttle's atomic word, for the table (generic over [`Word`]).
struct ShuttleWord(shuttle::sync::atomic::AtomicU64);

impl Word for ShuttleWord {
    fn new(value: u64) -> Self {
        ShuttleWord(shuttle::sync::atomic::AtomicU64::new(value))
    }
    fn load(&self, order: Ordering) -> u64 {
        self.0.load(order)
    }
    fn store(&self, value: u64, order: Ordering) {
        self.0.store(value, order)
    }
    fn swap(&self, value: u64, order: Ordering) -> u64 {
        self.0.swap(value, order)
    }
    fn compare_exchange(
        &self,
        current: u64,
        new: u64,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u64, u64> {
        self.0.compare_exchange(current, new, success, failure)
    }
    fn compare_exchange_weak(
        &self,
        current: u64,
        new: u64,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u64, u64> {
        self.0.compare_exchange_weak(current, new, success, failure)
    }
    fn fetch_add(&self, value: u64, order: Ordering) -> u64 {
        self.0.fetch_add(value, order)
    }
    fn fetch_sub(&self, value: u64, order: Ordering) -> u64 {
        self.0.fetch_sub(value, order)
    }
    fn fetch_xor(&self, value: u64, order: Ordering) -> u64 {
        self.0.fetch_xor(value, order)
    }
}

/// Each thread's order of the keys 9 to 14.
const ORDERS: [[u64; 6]; 3] = [
    [9, 10, 11, 12, 13, 14],
    [14, 13, 12, 11, 10, 9],
    [11, 9, 14, 10, 13, 12],
];

fn six_keys_three_threads(time: path::Time) {
    let words = Arc::new(path::full_window::<ShuttleWord>());
    let lock = Arc::new(Mutex::new(()));
    let clock = Arc::new(shuttle::sync::atomic::AtomicU64::new(1_000_000_000_000));
    let threads: Vec<_> = ORDERS
        .iter()
        .map(|order| {
            let (words, lock, clock) = (words.clone(), lock.clone(), clock.clone());
            thread::spawn(move || {
                let table = Table::new(&words, 2);
                for &id in order {
                    let outcome = path::request(
                        &table,
                        &|| lock.lock().unwrap(),
                        id,
                        &|| clock.fetch_add(1, Ordering::Relaxed),
                        &path::bucket(3),
                        time,
                    );
                    assert_eq!(outcome, Outcome::Passed, "key {id}");
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    // A key still in the table holds at most its three requests: its bucket is at most three
    // intervals (minutes) ahead of the last reading.
    let table = Table::new(&words, 2);
    let last = clock.load(Ordering::Relaxed);
    for slot in table.occupied() {
        let state = table.slot(slot.index)[1].load(Ordering::Relaxed);
        assert!(
            state <= last + 3 * 60_000_000_000,
            "key {} charged more than it was sent: {state}",
            slot.id
        );
    }
}

#[test]
fn whole_path_random_schedules() {
    shuttle::check_random(|| six_keys_three_threads(path::Time::Module), 2000);
}

#[test]
fn whole_path_pct_schedules() {
    shuttle::check_pct(|| six_keys_three_threads(path::Time::Module), 2000, 3);
}

/// The time read before the lookup only (the module before issue 37): shuttle finds a
/// schedule where a request is refused.
#[test]
#[should_panic]
fn legacy_time_read_before_the_lookup() {
    shuttle::check_random(
        || six_keys_three_threads(path::Time::BeforeLookupOnly),
        2000,
    );
}
