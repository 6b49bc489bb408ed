//! The fleet's step of a sync zone's decision: the grant the sync loop left in the key's
//! slot is taken before the zone's own algorithm decides, and what the key charges is added
//! to its pending delta for the loop. No lock, no I/O; the arithmetic is
//! `ratelimit_core::fleet`'s.

use core::sync::atomic::{AtomicU64, Ordering};

use ratelimit_core::fleet::{self, FleetShape, ASKED};
use ratelimit_core::{Algorithm, Decision, Outcome, Policy};

use crate::store::sync_record::{self, Mode, SyncShared};
use crate::store::{SlotIndex, Zone};

/// Decide a request of a sync zone: the fleet's grant first (one compare-and-swap), then the
/// zone's own algorithm; a request the algorithm rejects gives its grant back, one it charges
/// is added to the key's pending delta for the loop.
pub(super) fn decide(zone: &Zone, index: SlotIndex, now_ns: u64, policy: &Policy) -> Decision {
    if policy.algorithm.is_quota() {
        return super::quota::decide_synced(zone, index, now_ns, policy);
    }
    // One pin covers the grant, the charge and the pending add: all land on this key.
    let Some(pin) = zone.pin_to_charge(index, now_ns) else {
        return zone.decide(index, now_ns, policy, true);
    };
    let decide_local = || zone.decide_pinned(&pin, now_ns, policy, true);
    let Some(sync) = sync_record::shared() else {
        return decide_local();
    };
    let Some(words) = zone.sync_words(&pin) else {
        return decide_local();
    };
    let mode = sync.mode();
    if mode == Mode::Closed {
        return zone.refuse_pinned(&pin, now_ns, policy, sync.interval_ns().max(1_000_000_000));
    }
    let cost = policy.cost.max(1);
    let granted = mode == Mode::Open || take_grant(words.grant, sync, policy, cost);
    if !granted {
        words.pending.fetch_or(ASKED, Ordering::Relaxed);
        return zone.refuse_pinned(&pin, now_ns, policy, sync.interval_ns());
    }
    let decision = decide_local();
    if decision.outcome == Outcome::Rejected {
        if mode != Mode::Open {
            let _ = words
                .grant
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                    Some(fleet::return_grant(word, cost))
                });
        }
    } else {
        words.pending.fetch_add(cost, Ordering::Relaxed);
    }
    decision
}

/// A request of a sync zone given back (Lua's `uncommit`): its charge leaves the key's pending
/// delta and its grant returns, and the zone's own state gives it back. A delta the loop
/// already sent stays charged to the fleet (it errs on the strict side, by at most the
/// requests given back within one interval). Nothing when the key lost its slot since.
pub(super) fn uncommit(zone: &Zone, index: SlotIndex, now_ns: u64, policy: &Policy) {
    if policy.algorithm.is_quota() {
        return super::quota::uncommit_synced(zone, index, now_ns, policy);
    }
    let Some(pin) = zone.pin_own(index) else {
        return;
    };
    if let (Some(sync), Some(words)) = (sync_record::shared(), zone.sync_words(&pin)) {
        let cost = policy.cost.max(1);
        let _ = words
            .pending
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                let charged = word & !ASKED;
                (charged > 0).then(|| (word & ASKED) | charged.saturating_sub(cost))
            });
        if sync.mode() != Mode::Open {
            let _ = words
                .grant
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                    Some(fleet::return_grant(word, cost))
                });
        }
    }
    zone.uncommit_pinned(&pin, now_ns, policy);
}

/// A usage-based line's overrun on a sync zone (a request that used more than it reserved):
/// the zone's own bucket is charged into debt, what it charged (not what the debt bound
/// forgave) is added to the key's pending delta, so the next round charges it to the fleet,
/// and taken from the key's grant, down to 0 (the instance's share of the fleet's room until
/// then is spent by it). Returns the tokens forgiven; all of them when the key lost its slot.
pub(super) fn charge_into_debt(
    zone: &Zone,
    index: SlotIndex,
    now_ns: u64,
    policy: &Policy,
    tokens: u64,
    debt: u64,
) -> u64 {
    // One pin covers the debt, the pending add and the grant: all land on this key.
    let Some(pin) = zone.pin_own(index) else {
        return tokens;
    };
    let forgiven = zone.charge_into_debt_pinned(&pin, now_ns, policy, tokens, debt);
    let charged = tokens.saturating_sub(forgiven);
    if charged == 0 {
        return forgiven;
    }
    if let (Some(sync), Some(words)) = (sync_record::shared(), zone.sync_words(&pin)) {
        if let Algorithm::Quota(window) = policy.algorithm {
            // A quota's count has no grant: the charge goes to the fleet's counter.
            let _ = words
                .pending
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                    Some(ratelimit_core::fleet_quota::add_pending(
                        word, &window, charged,
                    ))
                });
            return forgiven;
        }
        let _ = words
            .pending
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                Some((word & ASKED) | (word & !ASKED).saturating_add(charged).min(!ASKED))
            });
        if sync.mode() != Mode::Open {
            let _ = words
                .grant
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                    (word != 0).then(|| fleet::spend_grant(word, charged))
                });
        }
    }
    forgiven
}

fn take_grant(grant: &AtomicU64, sync: &SyncShared, policy: &Policy, cost: u64) -> bool {
    let round = sync.round.load(Ordering::Acquire) as u32;
    let (instances, sync_ns) = (sync.instances(), sync.interval_ns());
    let (fresh, refill) =
        FleetShape::of(policy.algorithm, &policy.limits).map_or((0, 0), |shape| {
            (
                fleet::fresh_grant_milli(&shape, instances, sync_ns),
                fleet::stale_refill_milli(&shape, instances, sync_ns),
            )
        });
    grant
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
            fleet::take_grant(word, round, cost, fresh, refill)
        })
        .is_ok()
}
