//! A key's ticket words: its limit now, and a queued ticket's moves on the key's slots word
//! (its turn, leaving, queueing again, a dead worker's head skipped). Both the slots
//! ([`super::concurrency`]) and this worker's queue ([`super::queue`]) use them; this file
//! uses neither.

use core::sync::atomic::Ordering;

use ratelimit_core::adaptive::AdaptiveLimit;
use ratelimit_core::concurrency::{
    self as arithmetic, Arrival as Step, ConcurrencyLimit, ConcurrencyLimits, Leave, Turn,
};

use ratelimit_core::lease::LeaseWord;

use crate::store::concurrency::{KeyWords, LeaseWords};
use crate::store::{SlotIndex, Zone};

/// This process's slot in nginx's process table (its lane in each key).
pub(super) fn process_slot() -> usize {
    // SAFETY: set by the master before fork and never changed in a worker.
    let slot = unsafe { nginx_sys::ngx_process_slot };
    usize::try_from(slot).unwrap_or(usize::MAX)
}

/// The limits a key gets now: the zone's fixed limit, or the key's adaptive limit (set up at
/// `min` for a key seen for the first time), with the adaptive epoch.
pub(super) fn key_limit(
    zone: &Zone,
    words: &KeyWords,
    limits: &ConcurrencyLimits,
    now_ns: u64,
) -> (u32, u16) {
    let bounds = match limits.limit {
        ConcurrencyLimit::Fixed(limit) => match words.lease {
            None => return (limit, 0),
            Some(lease) => return (lease_permits(zone, &lease, now_ns).min(limit), 0),
        },
        ConcurrencyLimit::Adaptive(bounds) => bounds,
    };
    let Some(adaptive) = words.adaptive else {
        return (bounds.min, 0);
    };
    if let Some(state) = adaptive.load(&bounds) {
        return (state.limit, state.epoch);
    }
    let _lock = zone.lock();
    let state = adaptive.load(&bounds).unwrap_or_else(|| {
        let state = AdaptiveLimit::new(&bounds, now_ns);
        adaptive.store(&state);
        state
    });
    (state.limit, state.epoch)
}

/// The most slots a key can ever have: its limit now, or for a `sync` key (whose limit now
/// is its lease) the fleet's `limit=`, up to which a request queues for a larger lease.
#[inline]
pub(super) fn key_ceiling(words: &KeyWords, limits: &ConcurrencyLimits, limit: u32) -> u32 {
    match (limits.limit, words.lease) {
        (ConcurrencyLimit::Fixed(fleet), Some(_)) => fleet,
        _ => limit,
    }
}

/// A `sync` key's permits on this instance: its lease while it lives, else the zone's
/// fallback (none while Redis answers; `on_failure=`'s otherwise). No Redis call: one load.
#[inline]
fn lease_permits(zone: &Zone, lease: &LeaseWords, now_ns: u64) -> u32 {
    LeaseWord::unpack(lease.lease.load(Ordering::Acquire))
        .permits_at(now_ns / 1_000_000)
        .unwrap_or_else(|| zone.lease_fallback())
}

/// A waiter whose ticket was skipped (the queue was emptied: a dead worker's tickets were in
/// it, or the key was forgotten) queues again, keeping its deadline.
pub(super) enum Requeue {
    Admitted(u64),
    Queued(u16),
    Rejected,
}

/// Queue again (see [`Requeue`]); the worker's lane is marked already (the waiter's ticket).
pub(super) fn requeue(
    words: &KeyWords,
    zone: &Zone,
    cost: u64,
    queue_places: u32,
    now_ns: u64,
) -> Requeue {
    let Some(limits) = zone.concurrency_limits() else {
        return Requeue::Rejected;
    };
    let (limit, _) = key_limit(zone, words, &limits, now_ns);
    let ceiling = key_ceiling(words, &limits, limit);
    let mut current = words.slots.load(Ordering::Acquire);
    loop {
        let (step, next) = arithmetic::arrive_within(current, cost, limit, ceiling, queue_places);
        let Some(next) = next else {
            return Requeue::Rejected;
        };
        if let Step::Queued { first: true, .. } = step {
            words.head_since.store(now_ns, Ordering::Release);
        }
        match words
            .slots
            .compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {
                return match step {
                    Step::Admitted => Requeue::Admitted(next),
                    Step::Queued { ticket, .. } => Requeue::Queued(ticket),
                    Step::Rejected => Requeue::Rejected,
                }
            }
            Err(actual) => current = actual,
        }
    }
}

/// A queued ticket's chance at its slots; see `queue`.
pub(super) fn take_turn(
    words: &KeyWords,
    zone: &Zone,
    ticket: u16,
    cost: u64,
    now_ns: u64,
) -> TurnTaken {
    let Some(limits) = zone.concurrency_limits() else {
        return TurnTaken::Lost;
    };
    let (limit, _) = key_limit(zone, words, &limits, now_ns);
    let mut current = words.slots.load(Ordering::Acquire);
    loop {
        let next = match arithmetic::take_turn(current, ticket, cost, limit) {
            Turn::Admitted(next) => next,
            Turn::Wait => return TurnTaken::Wait,
            Turn::Skipped => return TurnTaken::Lost,
        };
        words.head_since.store(now_ns, Ordering::Release);
        match words
            .slots
            .compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => return TurnTaken::Admitted(next),
            Err(actual) => current = actual,
        }
    }
}

/// What [`take_turn`] says.
pub(super) enum TurnTaken {
    Admitted(u64),
    Wait,
    /// The ticket is no longer queued (skipped as stale): the request lost its place.
    Lost,
}

/// A ticket gives up its place; true once it is out of the queue (it was the head, or it was
/// skipped already), false while tickets ahead of it are still queued.
pub(super) fn leave(words: &KeyWords, ticket: u16, now_ns: u64) -> bool {
    let mut current = words.slots.load(Ordering::Acquire);
    loop {
        let next = match arithmetic::leave(current, ticket) {
            Leave::Left(next) => next,
            Leave::NotYet => return false,
            Leave::Gone => return true,
        };
        words.head_since.store(now_ns, Ordering::Release);
        match words
            .slots
            .compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => return true,
            Err(actual) => current = actual,
        }
    }
}

/// Skip the head of a key's queue if it has stood still for longer than any live holder of a
/// ticket waits (its worker died).
pub(super) fn skip_stale_head(words: &KeyWords, queue_timeout_ns: u64, now_ns: u64) {
    let current = words.slots.load(Ordering::Acquire);
    let head_since = words.head_since.load(Ordering::Acquire);
    if !arithmetic::head_is_stale(head_since, now_ns, queue_timeout_ns) {
        return;
    }
    let Some(next) = arithmetic::skip_head(current) else {
        return;
    };
    words.head_since.store(now_ns, Ordering::Release);
    let _ = words
        .slots
        .compare_exchange(current, next, Ordering::AcqRel, Ordering::Acquire);
}

/// A key's requests in flight and its limit now.
pub(super) fn standing(zone: &Zone, slot: SlotIndex, now_ns: u64) -> (u32, u32) {
    let (Some(words), Some(limits)) = (zone.key_words(slot), zone.concurrency_limits()) else {
        return (0, 0);
    };
    (
        words.load().in_flight,
        key_limit(zone, &words, &limits, now_ns).0,
    )
}
