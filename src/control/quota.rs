//! Quota zones' periods on the request path's clock: the calendar (`ratelimit_core::period`)
//! reads Unix time, decisions the monotonic clock of `glue::now_ns`; and a `sync` quota
//! zone's decision, from the fleet's count the sync loop left in the key's slot.

use core::sync::atomic::Ordering;

use ratelimit_core::fleet_quota;
use ratelimit_core::period::Bounds;
use ratelimit_core::quota::QuotaWindow;
use ratelimit_core::{Algorithm, Decision, Outcome, Policy};

use crate::conf::{QuotaPeriod, ZoneConf};
use crate::glue::{unix_minus_local_ms, unix_ms_of};
use crate::store::sync_record::{self, Mode};
use crate::store::{SlotIndex, Zone};

/// The period a quota zone decides in at `now_ns` (monotonic); the default window for a zone
/// that is not a quota. Each worker keeps the period it computed last and computes the next
/// only once it ended: a request pays one comparison, and the time zone's rules are read once a
/// period.
///
/// Unix time is the monotonic clock plus the offset this process read at its first use
/// (`glue::unix_minus_local_ms`): periods end when the wall clock said they would at that
/// moment; a step of the wall clock later (an NTP correction) is not followed until a restart.
pub fn window(zone_conf: &ZoneConf, now_ns: u64) -> QuotaWindow {
    let cached = zone_conf.quota_period.get();
    if (cached.start_ns..cached.window.end_ns).contains(&now_ns) {
        return cached.window;
    }
    let Some(bounds) = bounds(zone_conf, now_ns) else {
        return QuotaWindow::default();
    };
    let local_ns = |unix_ms: i64| {
        let local_ms = unix_ms.saturating_sub(unix_minus_local_ms()).max(0) as u64;
        local_ms.saturating_mul(1_000_000)
    };
    let period = QuotaPeriod {
        start_ns: local_ns(bounds.start_ms),
        window: QuotaWindow {
            tag: QuotaWindow::tag_of(bounds.index),
            end_ns: local_ns(bounds.end_ms),
        },
        length_ms: bounds.end_ms.saturating_sub(bounds.start_ms).max(0) as u64,
    };
    zone_conf.quota_period.set(period);
    period.window
}

/// The quota zone's period holding `now_ns` (monotonic), in Unix milliseconds; `None` for a
/// zone that is not a quota.
pub fn bounds(zone_conf: &ZoneConf, now_ns: u64) -> Option<Bounds> {
    let quota = zone_conf.quota.as_ref()?;
    Some(quota.calendar.bounds(unix_ms_of(now_ns) as i64))
}

/// Decide a request of a `sync` quota zone (`ratelimit_core::fleet_quota`): the zone's own
/// count (the fleet's total at the last round plus what this instance admitted since) and,
/// for a key whose total no round read yet this period or while `on_failure=local_share` is
/// in force, this instance's share of what the fleet had left. What passes is added to the
/// key's pending delta, which the loop adds to the period's counter in Redis.
pub(super) fn decide_synced(
    zone: &Zone,
    index: SlotIndex,
    now_ns: u64,
    policy: &Policy,
) -> Decision {
    let Algorithm::Quota(window) = policy.algorithm else {
        return zone.decide(index, now_ns, policy, true);
    };
    // One pin covers the check, the charge and the pending add: all land on this key.
    let Some(pin) = zone.pin_to_charge(index, now_ns) else {
        return zone.decide(index, now_ns, policy, true);
    };
    let (Some(sync), Some(words)) = (sync_record::shared(), zone.sync_words(&pin)) else {
        return zone.decide_pinned(&pin, now_ns, policy, true);
    };
    let mode = sync.mode();
    if mode == Mode::Closed {
        let retry_ns = sync.interval_ns().max(1_000_000_000);
        return zone.refuse_pinned(&pin, now_ns, policy, retry_ns);
    }
    let cost = policy.cost;
    let fleet = words.grant.load(Ordering::Acquire);
    let admits = mode == Mode::Open
        || fleet_quota::fleet_admits(
            fleet,
            words.pending.load(Ordering::Acquire),
            &window,
            policy.limits.quota_limit(),
            sync.instances(),
            cost,
            mode == Mode::LocalShare,
        );
    if !admits {
        if fleet_quota::fleet_total(fleet, &window).is_none() {
            // The loop reads this key's total first in its next round.
            words
                .grant
                .store(fleet_quota::asked_word(&window), Ordering::Release);
        }
        return zone.refuse_pinned(&pin, now_ns, policy, sync.interval_ns());
    }
    let decision = zone.decide_pinned(&pin, now_ns, policy, true);
    if decision.outcome != Outcome::Rejected {
        let _ = words
            .pending
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                Some(fleet_quota::add_pending(word, &window, cost))
            });
    }
    decision
}

/// A request of a `sync` quota zone given back: out of the pending delta the loop has not
/// sent yet (a delta already sent stays counted by the fleet: the strict side), and out of
/// the zone's own count.
pub(super) fn uncommit_synced(zone: &Zone, index: SlotIndex, now_ns: u64, policy: &Policy) {
    let Some(pin) = zone.pin_own(index) else {
        return;
    };
    if let (Algorithm::Quota(window), Some(words)) = (policy.algorithm, zone.sync_words(&pin)) {
        let _ = words
            .pending
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                Some(fleet_quota::remove_pending(word, &window, policy.cost))
            });
    }
    zone.uncommit_pinned(&pin, now_ns, policy);
}
