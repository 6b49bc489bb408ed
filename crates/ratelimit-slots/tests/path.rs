//! A request's way through the slot table, as the module takes it (`src/store/slots.rs`):
//! `Zone::find_or_claim` (the window's first slot, else an empty one claimed by
//! compare-and-swap, else `claim_locked` under the zone's lock, evicting the idlest key),
//! then `Zone::pin_to_charge` (the pin, or the key found or claimed again when it lost its
//! slot since), then `charge_word` (`ratelimit_slots::decide_at` with the bucket's
//! precomputed arithmetic, `ratelimit_core::BucketCharge`), then the unpin. Generic over the
//! atomic word, so that the stress test runs it on `core`'s atomics and the models on loom's
//! and shuttle's.

// Each test binary that includes this module uses part of it.
#![allow(dead_code)]

use std::sync::atomic::Ordering;

use ratelimit_core::spec::Limits;
use ratelimit_core::{Algorithm, BucketCharge, DelayMode, Outcome, Policy, Rate, RateUnit};
use ratelimit_slots::{decide_at, update, Claim, Table, Word};

/// The limit every fresh key is sent: `rate=1r/m burst=<requests - 1> nodelay`, a leaky
/// bucket that holds exactly `requests` requests (one interval is a minute: no request of a
/// test leaks out before the next).
pub fn bucket(requests: u64) -> BucketCharge {
    BucketCharge::new(&Policy {
        algorithm: Algorithm::LeakyBucket,
        limits: Limits {
            rate: Rate {
                milli_requests: 1000,
                unit: RateUnit::Minute,
            },
            burst: requests - 1,
        },
        delay: DelayMode::NoDelay,
        cost: 1,
    })
    .expect("a bucket's constants")
}

/// How a request reads its time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Time {
    /// As the module does: once before the lookup, and again after the state was loaded when
    /// the first reading does not pass (`decide_at`).
    Module,
    /// As the module did before `decide_at`: once before the lookup, and the charge decided
    /// at that reading whatever it finds.
    BeforeLookupOnly,
}

/// A leaky bucket's state is its theoretical arrival time: the time it is idle again.
fn idle_at<W: Word>(state: &[W]) -> u64 {
    state[0].load(Ordering::Relaxed)
}

/// One request of key `id` at the time `clock` gives, decided by `bucket`: its outcome. A key
/// whose window is busy (every slot pinned this instant) is decided as a fresh key, as the
/// module does.
pub fn request<'a, W: Word, G>(
    table: &Table<'a, W>,
    lock: &impl Fn() -> G,
    id: u64,
    clock: &impl Fn() -> u64,
    bucket: &BucketCharge,
    time: Time,
) -> Outcome {
    let now_ns = clock();
    let fresh = || bucket.charge(0, now_ns).expect("no overflow").0;
    // Zone::find_or_claim.
    let found = match table
        .find_first(id)
        .or_else(|| table.find_or_claim_empty(id))
    {
        Some(slot) => slot,
        None => {
            let _held = lock();
            match table.claim_locked(id, idle_at, |_, _| {}) {
                Claim::Found(slot) | Claim::Claimed(slot) => slot,
                Claim::Evicted { slot, .. } => slot,
                Claim::Busy => return fresh(),
            }
        }
    };
    // Zone::pin_to_charge.
    let pin = match table.pin(found) {
        Some(pin) => pin,
        None => match table.claim_and_pin(id, lock, idle_at, |_, _| {}) {
            Some((pin, _)) => pin,
            None => return fresh(),
        },
    };
    let decide = |state, now| bucket.charge(state, now).expect("no overflow");
    // charge_word.
    match time {
        Time::Module => {
            let passes = |outcome: &Outcome| *outcome == Outcome::Passed;
            decide_at(pin.first_state(), now_ns, clock, passes, decide).answer
        }
        Time::BeforeLookupOnly => update(pin.first_state(), |state| decide(state, now_ns)),
    }
}

/// A table of one bucket (one window: every key shares it) whose four slots hold keys
/// `1..=4`, idle since time 1: a new key must evict one.
pub fn full_window<W: Word>() -> Vec<W> {
    (1..=4u64)
        .flat_map(|id| [W::new(id << ratelimit_slots::PIN_BITS), W::new(1)])
        .collect()
}

/// A one-bucket table whose first slot is empty and the other three hold keys `1..=3`, idle
/// since time 1: the first new key takes the empty slot without the lock, the next must
/// evict.
pub fn window_with_one_empty<W: Word>() -> Vec<W> {
    let mut words = vec![W::new(0), W::new(0)];
    words.extend((1..=3u64).flat_map(|id| [W::new(id << ratelimit_slots::PIN_BITS), W::new(1)]));
    words
}
