//! Model tests of the slot table: loom runs two or three threads on a one-bucket table (four
//! slots, all taken, so a new key must evict) through every interleaving within
//! `LOOM_MAX_PREEMPTIONS`. Each test runs twice: on a faithful copy of the table the module
//! had before the pin protocol ([`legacy`]), where the checker must find the race (the test
//! expects the panic), and on [`Table`], where no interleaving breaks the invariant.
//!
//! `RUSTFLAGS="--cfg loom" cargo test -p ratelimit-slots --test loom --release`
#![cfg(loom)]

mod path;

use loom::sync::atomic::AtomicU64;
use loom::sync::{Arc, Mutex};
use loom::thread;
use ratelimit_slots::{Claim, SlotRef, Table, Word, BUSY, PIN_BITS};
use std::sync::atomic::Ordering;

/// The table before the pin protocol, as `src/store/slots.rs` had it: the hash word is the
/// whole hash; a worker finds a slot by loading it and then updates the state by
/// compare-and-swap, with no check that the slot is still its key's; eviction (under the
/// lock) stores zeros into the state and then the new hash; the victim is the idlest slot,
/// starting from the window's first with an idle time of `u64::MAX` (so a window of busy
/// keys evicts its first).
mod legacy {
    use super::*;

    pub struct Table<'a> {
        pub words: &'a [AtomicU64],
        pub stride: usize,
    }

    impl Table<'_> {
        fn slots(&self) -> usize {
            self.words.len() / self.stride
        }
        pub fn slot(&self, index: usize) -> &[AtomicU64] {
            &self.words[index * self.stride..(index + 1) * self.stride]
        }
        pub fn find(&self, hash: u64) -> Option<usize> {
            for index in 0..self.slots() {
                match self.slot(index)[0].load(Ordering::Acquire) {
                    h if h == hash => return Some(index),
                    0 => return None,
                    _ => {}
                }
            }
            None
        }
        /// `claim_locked` of a full window.
        pub fn claim_locked(&self, hash: u64, idle_at: impl Fn(&[AtomicU64]) -> u64) -> usize {
            let mut victim = 0;
            let mut victim_idle_at = u64::MAX;
            for index in 0..self.slots() {
                let slot = self.slot(index);
                if slot[0].load(Ordering::Acquire) == hash {
                    return index;
                }
                let at = idle_at(&slot[1..]);
                if at < victim_idle_at {
                    victim = index;
                    victim_idle_at = at;
                }
            }
            let slot = self.slot(victim);
            for word in &slot[1..] {
                word.store(0, Ordering::Relaxed);
            }
            slot[0].store(hash, Ordering::Release);
            victim
        }
    }

    /// `update_word`: a compare-and-swap loop that re-reads the word on failure.
    pub fn update(word: &AtomicU64, step: impl Fn(u64) -> u64) {
        let mut current = word.load(Ordering::Acquire);
        loop {
            match word.compare_exchange_weak(
                current,
                step(current),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return,
                Err(actual) => current = actual,
            }
        }
    }
}

/// A one-bucket table of `stride`-word slots holding `slots[i] = (id, state...)`; `legacy`
/// stores the ids as the old table did (the whole word).
fn table_words(slots: &[&[u64]], legacy: bool) -> Arc<Vec<AtomicU64>> {
    let mut words = Vec::new();
    for slot in slots {
        let id = if legacy { slot[0] } else { slot[0] << PIN_BITS };
        words.push(AtomicU64::new(id));
        words.extend(slot[1..].iter().map(|&value| AtomicU64::new(value)));
    }
    Arc::new(words)
}

fn first_word(state: &[AtomicU64]) -> u64 {
    state[0].load(Ordering::Acquire)
}

/// The request path's find: the key's slot pinned (claimed for a new key, under the lock);
/// `None` when the window is busy.
fn acquire<'a>(
    table: &Table<'a, AtomicU64>,
    lock: &Mutex<()>,
    id: u64,
    idle_at: impl Fn(&[AtomicU64]) -> u64,
) -> Option<ratelimit_slots::Pin<'a, AtomicU64>> {
    table
        .acquire(id, || lock.lock().unwrap(), idle_at, |_, _| {})
        .map(|(pin, _)| pin)
}

/// A request charged to key `id`: its slot pinned, its state's first word + 1.
fn charge(table: &Table<'_, AtomicU64>, lock: &Mutex<()>, id: u64) -> SlotRef {
    let pin = acquire(table, lock, id, first_word).expect("a rate zone's window is never busy");
    ratelimit_slots::update(&pin.state()[0], |state| ((), Some(state + 1)));
    pin.slot()
}

fn state_of(words: &[AtomicU64], stride: usize, id: u64, word: usize) -> Option<u64> {
    let table = Table::new(words, stride);
    let slot = table.find(id)?;
    Some(table.slot(slot.index)[1 + word].load(Ordering::Acquire))
}

/// Four keys, key 1 the idlest (the one a new key evicts).
const RATE_SLOTS: [&[u64]; 4] = [&[1, 0], &[2, 100], &[3, 100], &[4, 100]];

/// Find vs evict vs commit: key 1's request races key 9's claim, which evicts key 1. Key 9
/// must start fresh, and key 1's request must be charged to key 1.
#[test]
#[should_panic]
fn legacy_find_evict_commit() {
    loom::model(|| {
        let words = table_words(&RATE_SLOTS, true);
        let lock = Arc::new(Mutex::new(()));
        let (w, l) = (words.clone(), lock.clone());
        let request = thread::spawn(move || {
            let table = legacy::Table {
                words: &w,
                stride: 2,
            };
            let _ = &l;
            if let Some(index) = table.find(1) {
                legacy::update(&table.slot(index)[1], |state| state + 1);
            }
        });
        {
            let table = legacy::Table {
                words: &words,
                stride: 2,
            };
            let _held = lock.lock().unwrap();
            table.claim_locked(9, first_word);
        }
        request.join().unwrap();
        let table = legacy::Table {
            words: &words,
            stride: 2,
        };
        let nine = table
            .find(9)
            .map(|index| table.slot(index)[1].load(Ordering::Acquire));
        assert_eq!(nine, Some(0), "key 9 was charged key 1's request");
    });
}

#[test]
fn find_evict_commit() {
    loom::model(|| {
        let words = table_words(&RATE_SLOTS, false);
        let lock = Arc::new(Mutex::new(()));
        let (w, l) = (words.clone(), lock.clone());
        let request = thread::spawn(move || {
            charge(&Table::new(&w, 2), &l, 1);
        });
        let (w, l) = (words.clone(), lock.clone());
        let claimer = thread::spawn(move || {
            drop(acquire(&Table::new(&w, 2), &l, 9, first_word));
        });
        request.join().unwrap();
        claimer.join().unwrap();
        // Key 1 keeps its request unless it was evicted after it (its state is then gone
        // with it); key 9 may have lost its slot to key 1 again, never its freshness.
        let one = state_of(&words, 2, 1, 0);
        assert!(one.is_none() || one == Some(1), "key 1 has {one:?}");
        if let Some(nine) = state_of(&words, 2, 9, 0) {
            assert_eq!(nine, 0, "key 9 was charged key 1's request");
        }
    });
}

/// Give-back after eviction: key 1 gives back a request (the log phase) while key 9 evicts
/// it and charges one of its own. Key 9's request must stay charged.
#[test]
#[should_panic]
fn legacy_give_back_after_eviction() {
    loom::model(|| {
        let words = table_words(&[&[1, 1], &[2, 100], &[3, 100], &[4, 100]], true);
        let lock = Arc::new(Mutex::new(()));
        let w = words.clone();
        // The slot index is all the old `Charged` kept.
        let give_back = thread::spawn(move || {
            let table = legacy::Table {
                words: &w,
                stride: 2,
            };
            legacy::update(&table.slot(0)[1], |state| state.saturating_sub(1));
        });
        {
            let table = legacy::Table {
                words: &words,
                stride: 2,
            };
            let index = {
                let _held = lock.lock().unwrap();
                table.claim_locked(9, first_word)
            };
            legacy::update(&table.slot(index)[1], |state| state + 1);
        }
        give_back.join().unwrap();
        let table = legacy::Table {
            words: &words,
            stride: 2,
        };
        let nine = table
            .find(9)
            .map(|index| table.slot(index)[1].load(Ordering::Acquire));
        assert_eq!(nine, Some(1), "key 1's give-back took key 9's request");
    });
}

#[test]
fn give_back_after_eviction() {
    loom::model(|| {
        let words = table_words(&[&[1, 1], &[2, 100], &[3, 100], &[4, 100]], false);
        let lock = Arc::new(Mutex::new(()));
        let w = words.clone();
        let give_back = thread::spawn(move || {
            let table = Table::new(&w, 2);
            if let Some(pin) = table.pin(SlotRef { index: 0, id: 1 }) {
                ratelimit_slots::update(&pin.state()[0], |state| {
                    ((), Some(state.saturating_sub(1)))
                });
            }
        });
        let (w, l) = (words.clone(), lock.clone());
        let new_key = thread::spawn(move || {
            charge(&Table::new(&w, 2), &l, 9);
        });
        give_back.join().unwrap();
        new_key.join().unwrap();
        assert_eq!(
            state_of(&words, 2, 9, 0),
            Some(1),
            "key 1's give-back took key 9's"
        );
    });
}

/// A sync zone's slot: `[id, state, pending]`. Key 1's request adds to its pending delta,
/// key 9's claim evicts key 1 (handing the pending delta to the orphan ring), the sync loop
/// takes key 1's pending delta. Key 1's request must reach the fleet once (orphaned, taken,
/// or still pending in key 1's slot) and key 9 must have nothing pending.
const SYNC_SLOTS: [&[u64]; 4] = [&[1, 0, 0], &[2, 100, 0], &[3, 100, 0], &[4, 100, 0]];

#[test]
#[should_panic]
fn legacy_sync_swap_vs_request_add() {
    loom::model(|| {
        let words = table_words(&SYNC_SLOTS, true);
        let lock = Arc::new(Mutex::new(()));
        let orphaned = Arc::new(AtomicU64::new(0));
        let w = words.clone();
        let request = thread::spawn(move || {
            let table = legacy::Table {
                words: &w,
                stride: 3,
            };
            if let Some(index) = table.find(1) {
                legacy::update(&table.slot(index)[1], |state| state + 1);
                table.slot(index)[2].fetch_add(1, Ordering::Relaxed);
            }
        });
        let (w, o) = (words.clone(), orphaned.clone());
        let sync_loop = thread::spawn(move || {
            let table = legacy::Table {
                words: &w,
                stride: 3,
            };
            // The loop's candidate: slot 0, key 1; it checks the hash, then swaps.
            if table.slot(0)[0].load(Ordering::Acquire) == 1 {
                o.fetch_add(
                    table.slot(0)[2].swap(0, Ordering::AcqRel),
                    Ordering::Relaxed,
                );
            }
        });
        {
            let table = legacy::Table {
                words: &words,
                stride: 3,
            };
            let _held = lock.lock().unwrap();
            let victim = 0;
            // `orphan` then `claim_locked`'s reset, as the old module did.
            orphaned.fetch_add(
                table.slot(victim)[2].swap(0, Ordering::AcqRel),
                Ordering::Relaxed,
            );
            table.claim_locked(9, first_word);
        }
        request.join().unwrap();
        sync_loop.join().unwrap();
        let table = legacy::Table {
            words: &words,
            stride: 3,
        };
        let nine = table
            .find(9)
            .map(|index| table.slot(index)[2].load(Ordering::Acquire));
        assert_eq!(nine, Some(0), "key 9 carries key 1's pending delta");
    });
}

#[test]
fn sync_swap_vs_request_add() {
    loom::model(|| {
        let words = table_words(&SYNC_SLOTS, false);
        let lock = Arc::new(Mutex::new(()));
        let reached = Arc::new(AtomicU64::new(0));
        let w = words.clone();
        let request = thread::spawn(move || {
            let table = Table::new(&w, 3);
            // One pin covers the charge and the pending add (control/fleet.rs).
            if let Some(pin) = table.find(1).and_then(|slot| table.pin(slot)) {
                ratelimit_slots::update(&pin.state()[0], |state| ((), Some(state + 1)));
                pin.state()[1].fetch_add(1, Ordering::Relaxed);
                true
            } else {
                false
            }
        });
        let (w, r) = (words.clone(), reached.clone());
        let sync_loop = thread::spawn(move || {
            let table = Table::new(&w, 3);
            if let Some(pin) = table.pin(SlotRef { index: 0, id: 1 }) {
                r.fetch_add(pin.state()[1].swap(0, Ordering::AcqRel), Ordering::Relaxed);
            }
        });
        {
            let table = Table::new(&words, 3);
            let _held = lock.lock().unwrap();
            table.claim_locked(9, first_word, |_, state| {
                reached.fetch_add(state[1].swap(0, Ordering::AcqRel), Ordering::Relaxed);
            });
        }
        let charged = request.join().unwrap();
        sync_loop.join().unwrap();
        let left = state_of(&words, 3, 1, 1).unwrap_or(0);
        assert_eq!(
            state_of(&words, 3, 9, 1),
            Some(0),
            "key 9 carries key 1's delta"
        );
        assert_eq!(
            reached.load(Ordering::Relaxed) + left,
            u64::from(charged),
            "key 1's delta lost or counted twice"
        );
    });
}

/// A concurrency zone's slot: `[id, in flight]`; a key with requests in flight is busy.
fn concurrency_idle_at(state: &[AtomicU64]) -> u64 {
    if state[0].load(Ordering::Acquire) == 0 {
        0
    } else {
        BUSY
    }
}

/// Keys 2-4 hold requests; key 1 is idle and arrives, then leaves, while key 9 claims.
const CONCURRENCY_SLOTS: [&[u64]; 4] = [&[1, 0], &[2, 1], &[3, 1], &[4, 1]];

#[test]
#[should_panic]
fn legacy_arrive_leave_vs_evict() {
    loom::model(|| {
        let words = table_words(&CONCURRENCY_SLOTS, true);
        let lock = Arc::new(Mutex::new(()));
        let w = words.clone();
        let request = thread::spawn(move || {
            let table = legacy::Table {
                words: &w,
                stride: 2,
            };
            let Some(index) = table.find(1) else { return };
            table.slot(index)[1].fetch_add(1, Ordering::AcqRel);
            // `give_back`'s guard: not our key any more, nothing given back.
            if table.slot(index)[0].load(Ordering::Acquire) == 1 {
                table.slot(index)[1].fetch_sub(1, Ordering::AcqRel);
            }
        });
        {
            let table = legacy::Table {
                words: &words,
                stride: 2,
            };
            let _held = lock.lock().unwrap();
            table.claim_locked(9, concurrency_idle_at);
        }
        request.join().unwrap();
        for index in 0..4 {
            let table = legacy::Table {
                words: &words,
                stride: 2,
            };
            let slot = table.slot(index);
            let expected = u64::from(
                slot[0].load(Ordering::Relaxed) != 1 && slot[0].load(Ordering::Relaxed) != 9,
            );
            assert_eq!(
                slot[1].load(Ordering::Relaxed),
                expected,
                "slot {index} leaked"
            );
        }
    });
}

#[test]
fn arrive_leave_vs_evict() {
    loom::model(|| {
        let words = table_words(&CONCURRENCY_SLOTS, false);
        let lock = Arc::new(Mutex::new(()));
        let (w, l) = (words.clone(), lock.clone());
        let request = thread::spawn(move || {
            let table = Table::new(&w, 2);
            let Some(pin) = acquire(&table, &l, 1, concurrency_idle_at) else {
                return; // the window is busy: refused
            };
            let slot = pin.slot();
            pin.state()[0].fetch_add(1, Ordering::AcqRel);
            drop(pin);
            // Holding: never evicted, so the leave finds its own slot.
            let pin = table
                .pin_or_wait(slot, || l.lock().unwrap())
                .expect("a key holding a request was evicted");
            pin.state()[0].fetch_sub(1, Ordering::AcqRel);
        });
        let (w, l) = (words.clone(), lock.clone());
        let claimer = thread::spawn(move || {
            drop(acquire(&Table::new(&w, 2), &l, 9, concurrency_idle_at));
        });
        request.join().unwrap();
        claimer.join().unwrap();
        let table = Table::new(&words, 2);
        for index in 0..4 {
            let id = table.id_at(index);
            let expected = u64::from(id != 1 && id != 9);
            assert_eq!(
                table.slot(index)[1].load(Ordering::Relaxed),
                expected,
                "slot {index}"
            );
        }
    });
}

/// A window of keys all holding requests: a new key evicts none of them.
#[test]
#[should_panic]
fn legacy_busy_keys_evicted() {
    loom::model(|| {
        let words = table_words(&[&[1, 1], &[2, 1], &[3, 1], &[4, 1]], true);
        let table = legacy::Table {
            words: &words,
            stride: 2,
        };
        table.claim_locked(9, concurrency_idle_at);
        assert_eq!(table.find(9), None, "a busy key was evicted");
    });
}

#[test]
fn busy_keys_never_evicted() {
    loom::model(|| {
        let words = table_words(&[&[1, 1], &[2, 1], &[3, 1], &[4, 1]], false);
        let table = Table::new(&words, 2);
        assert_eq!(
            table.claim_locked(9, concurrency_idle_at, |_, _| {}),
            Claim::Busy
        );
    });
}

/// Keep `Word` in use for loom's atomics (the table is generic over it).
#[allow(dead_code)]
fn word_is_implemented(word: &AtomicU64) -> u64 {
    Word::load(word, Ordering::Relaxed)
}

/// Issue 37, the whole path (`path.rs`: lookup, a lock-free claim of an empty slot or a claim
/// under the lock that evicts an idle key and resets its state, pin, charge, unpin) with a
/// clock: three threads, two requests of key 9 and one of key 10, two fresh keys sharing a
/// window whose one empty slot goes to whichever claims first (the two requests of key 9 may
/// claim it at once), so the other evicts. The clock is a counter that ticks at every
/// reading, in the order the readings happen; the bucket holds two requests: every request
/// must pass. Within one preemption: the three requests are some forty steps, and two
/// preemptions already take loom minutes on a loaded two-core machine (the shuttle tests run
/// the same path on longer schedules); the old sequence's failure needs one.
fn two_keys_share_a_window(time: path::Time) {
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(1);
    model.check(move || {
        let words = Arc::new(path::window_with_one_empty::<AtomicU64>());
        let lock = Arc::new(Mutex::new(()));
        let clock = Arc::new(AtomicU64::new(1_000_000_000_000));
        let request = |id: u64| {
            let (words, lock, clock) = (words.clone(), lock.clone(), clock.clone());
            thread::spawn(move || {
                path::request(
                    &Table::new(&words, 2),
                    &|| lock.lock().unwrap(),
                    id,
                    &|| clock.fetch_add(1, Ordering::Relaxed),
                    &path::bucket(2),
                    time,
                )
            })
        };
        let requests = [request(9), request(9), request(10)];
        for (n, request) in requests.into_iter().enumerate() {
            let outcome = request.join().unwrap();
            assert_eq!(outcome, ratelimit_core::Outcome::Passed, "request {n}");
        }
    });
}

#[test]
fn whole_path_two_keys_share_a_window() {
    two_keys_share_a_window(path::Time::Module);
}

/// Before issue 37 the charge was decided at the time read before the lookup: loom finds the
/// schedule where key 9's second request charges first at a later time, and the first is
/// refused.
#[test]
#[should_panic]
fn legacy_whole_path_time_read_before_the_lookup() {
    two_keys_share_a_window(path::Time::BeforeLookupOnly);
}
