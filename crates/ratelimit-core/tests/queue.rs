//! The slots-and-queue word under random interleavings of arrivals, turns, give-ups and
//! releases (as many workers would make them): the limit holds, queued requests are served in
//! ticket order, the count matches what is held, and everything drains back to a fresh key.

use proptest::prelude::*;
use ratelimit_core::concurrency::{
    arrive, leave, release, skip_head, take_turn, Arrival, Leave, Slots, Turn,
};

#[derive(Clone, Copy, Debug)]
enum Step {
    Arrive(u64),
    /// Release the held request at this index (modulo how many are held).
    Release(usize),
    /// The waiter at this index tries its turn.
    Poll(usize),
    /// The waiter at this index gives up (timeout, client gone).
    GiveUp(usize),
    /// A waiter's owner dies: its ticket is never polled again and is skipped as stale.
    Die(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (1u64..4).prop_map(Step::Arrive),
        3 => any::<usize>().prop_map(Step::Release),
        5 => any::<usize>().prop_map(Step::Poll),
        1 => any::<usize>().prop_map(Step::GiveUp),
        1 => any::<usize>().prop_map(Step::Die),
    ]
}

#[derive(Clone, Copy, Debug)]
struct Waiter {
    ticket: u16,
    cost: u64,
    gave_up: bool,
    dead: bool,
}

struct Key {
    word: u64,
    limit: u32,
    queue: u32,
    held: Vec<u64>,
    waiting: Vec<Waiter>,
    served: Vec<u16>,
}

impl Key {
    fn slots(&self) -> Slots {
        Slots::unpack(self.word)
    }

    fn check(&self) {
        let slots = self.slots();
        assert_eq!(u64::from(slots.in_flight), self.held.iter().sum::<u64>());
        assert!(
            slots.in_flight <= self.limit,
            "{slots:?} over {}",
            self.limit
        );
        assert!(slots.queued() <= self.queue);
        assert_eq!(slots.queued() as usize, self.waiting.len(), "{slots:?}");
    }

    /// A live waiter polls: takes its turn, or leaves at the head if it gave up.
    fn poll(&mut self, index: usize) {
        let waiter = self.waiting[index];
        if waiter.dead {
            return;
        }
        if waiter.gave_up {
            match leave(self.word, waiter.ticket) {
                Leave::Left(word) => {
                    self.word = word;
                    self.waiting.remove(index);
                }
                Leave::NotYet => {}
                Leave::Gone => panic!("a live ticket was skipped"),
            }
            return;
        }
        match take_turn(self.word, waiter.ticket, waiter.cost, self.limit) {
            Turn::Admitted(word) => {
                self.word = word;
                self.waiting.remove(index);
                self.held.push(waiter.cost);
                self.served.push(waiter.ticket);
            }
            Turn::Wait => {}
            Turn::Skipped => panic!("a live ticket was skipped"),
        }
    }

    /// A dead waiter at the head is skipped by another worker (stale).
    fn skip_dead_head(&mut self) {
        if let Some(first) = self.waiting.first() {
            if first.dead && first.ticket == self.slots().head {
                self.word = skip_head(self.word).expect("a queued head");
                self.waiting.remove(0);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn queue_is_fifo_and_drains(
        limit in 1u32..6,
        queue in 0u32..6,
        first_ticket in any::<u16>(),
        steps in prop::collection::vec(step(), 1..200),
    ) {
        // Start anywhere in the ticket space, to cross the wrap.
        let word = Slots { in_flight: 0, head: first_ticket, tail: first_ticket }.pack();
        let mut key = Key { word, limit, queue, held: vec![], waiting: vec![], served: vec![] };
        for step in steps {
            match step {
                Step::Arrive(cost) => {
                    let (arrival, word) = arrive(key.word, cost, limit, queue);
                    match arrival {
                        Arrival::Admitted => key.held.push(cost),
                        Arrival::Queued { ticket, first } => {
                            prop_assert_eq!(first, key.waiting.is_empty());
                            prop_assert_eq!(ticket, key.slots().tail);
                            key.waiting.push(Waiter { ticket, cost, gave_up: false, dead: false });
                        }
                        Arrival::Rejected => {
                            let slots = key.slots();
                            prop_assert!(
                                slots.queued() >= queue
                                    || cost > u64::from(limit)
                            );
                            prop_assert!(word.is_none());
                        }
                    }
                    if let Some(word) = word {
                        key.word = word;
                    }
                }
                Step::Release(i) if !key.held.is_empty() => {
                    let cost = key.held.remove(i % key.held.len());
                    key.word = release(key.word, cost);
                }
                Step::Poll(i) if !key.waiting.is_empty() => key.poll(i % key.waiting.len()),
                Step::GiveUp(i) if !key.waiting.is_empty() => {
                    let len = key.waiting.len();
                    key.waiting[i % len].gave_up = true;
                }
                Step::Die(i) if !key.waiting.is_empty() => {
                    let len = key.waiting.len();
                    key.waiting[i % len].dead = true;
                }
                _ => {}
            }
            key.skip_dead_head();
            key.check();
        }
        // Drain: everyone served is done, every waiter gives up; polling empties the queue.
        while let Some(cost) = key.held.pop() {
            key.word = release(key.word, cost);
        }
        for waiter in &mut key.waiting {
            waiter.gave_up = true;
        }
        for _ in 0..=queue {
            key.skip_dead_head();
            for index in (0..key.waiting.len()).rev() {
                key.poll(index);
            }
            key.check();
        }
        prop_assert!(key.waiting.is_empty(), "{:?}", key.waiting);
        let slots = key.slots();
        prop_assert_eq!((slots.in_flight, slots.queued()), (0, 0));
        // Served in ticket order (relative to the first ticket, across the wrap).
        let order: Vec<u16> = key.served.iter().map(|t| t.wrapping_sub(first_ticket)).collect();
        let mut sorted = order.clone();
        sorted.sort_unstable();
        prop_assert_eq!(order, sorted);
    }
}
