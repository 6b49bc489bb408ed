//! A quota zone shared by a fleet (`sync`): each period's count of a key lives in Redis, and
//! every instance decides from its own view of it, with no Redis call on the request path.
//!
//! A `sync` slot has three words after its id: the state, the pending delta and a third word
//! that for a quota holds the fleet's count. All three are tagged with their period as a
//! quota's state is ([`crate::quota::state_of`]):
//!
//! * **state**: the count the zone decides with, the fleet's total at the last round plus
//!   what this instance admitted since;
//! * **pending**: what this instance admitted since it last sent the key (the loop adds it
//!   to the Redis counter with `INCRBY` and reads the total back);
//! * **fleet word**: the total Redis answered at the last round, plus one (0 counted: a
//!   key the fleet has not answered for this period yet; the tag alone, with a count of 0:
//!   a key refused for want of that answer, which the loop reads first).
//!
//! Between rounds the fleet may pass a key's limit by what the other instances admit of it
//! before this instance reads the total again: at most one interval's traffic of the key on
//! the other instances. A key this instance has no total of yet (new here this period, or
//! after a restart), and every key while Redis does not answer with `on_failure=local_share`,
//! admits only its share: `1/N̂` of what the fleet had left when last known.

use crate::quota::{state_of, used, QuotaWindow};

/// The largest total taken from Redis: what a state word counts.
pub const MAX_TOTAL: u64 = (1 << 54) - 2;

/// The fleet word of a key whose period's total in Redis is `total`.
pub fn fleet_word(total: u64, window: &QuotaWindow) -> u64 {
    state_of(total.min(MAX_TOTAL) + 1, window)
}

/// The fleet word of a key refused for want of its total (the loop reads it first).
pub fn asked_word(window: &QuotaWindow) -> u64 {
    state_of(0, window)
}

/// The period's total the last round read, `None` when no round read it in this period.
pub fn fleet_total(word: u64, window: &QuotaWindow) -> Option<u64> {
    used(word, window).checked_sub(1)
}

/// Whether the key was refused for want of its period's total.
pub fn is_asked(word: u64, window: &QuotaWindow) -> bool {
    word == asked_word(window)
}

/// `pending` with `cost` more admitted in `window`. A delta of an earlier period is dropped:
/// its period is over, and what a count of it decides has no future.
pub fn add_pending(pending: u64, window: &QuotaWindow, cost: u64) -> u64 {
    state_of(used(pending, window).saturating_add(cost), window)
}

/// `pending` with `cost` given back (a request charged and then not counted), down to 0.
/// A delta of another period is left alone.
pub fn remove_pending(pending: u64, window: &QuotaWindow, cost: u64) -> u64 {
    if used(pending, window) == 0 {
        return pending;
    }
    state_of(used(pending, window).saturating_sub(cost), window)
}

/// Whether this instance may admit `cost` more of a key with limit `limit` beside what the
/// zone's own count says: always when the fleet's total is known and the instance is not
/// sharing (`sharing`: `on_failure=local_share` in force); otherwise while what it admitted
/// since the last known total stays within `1/instances` of what was left then (of the whole
/// limit when no total is known).
///
/// ```
/// use ratelimit_core::fleet_quota::{fleet_admits, fleet_word};
/// use ratelimit_core::quota::{state_of, QuotaWindow};
///
/// let window = QuotaWindow { tag: 3, end_ns: 1_000 };
/// // Unknown to the fleet, two instances, limit 20: 10 here before the first round answers.
/// assert!(fleet_admits(0, state_of(9, &window), &window, 20, 2, 1, false));
/// assert!(!fleet_admits(0, state_of(10, &window), &window, 20, 2, 1, false));
/// // Known: the zone's own count decides (the state holds the fleet's total).
/// let known = fleet_word(16, &window);
/// assert!(fleet_admits(known, state_of(10, &window), &window, 20, 2, 1, false));
/// // Redis silent with local_share: half of the 4 left.
/// assert!(fleet_admits(known, state_of(1, &window), &window, 20, 2, 1, true));
/// assert!(!fleet_admits(known, state_of(2, &window), &window, 20, 2, 1, true));
/// ```
pub fn fleet_admits(
    fleet: u64,
    pending: u64,
    window: &QuotaWindow,
    limit: u64,
    instances: u64,
    cost: u64,
    sharing: bool,
) -> bool {
    let left = match fleet_total(fleet, window) {
        Some(_) if !sharing => return true,
        Some(total) => limit.saturating_sub(total),
        None => limit,
    };
    let share = left / instances.max(1);
    used(pending, window).saturating_add(cost) <= share
}

/// A key's state after a round read its period's total: the total plus what was admitted
/// here since the round took the delta (`pending`), never below what the state already
/// counts (a request counted here and not yet in `pending` is not lost; the count only
/// grows within a period, as Redis's does).
pub fn synced_state(state: u64, window: &QuotaWindow, total: u64, pending: u64) -> u64 {
    let fleet = total.min(MAX_TOTAL).saturating_add(used(pending, window));
    state_of(used(state, window).max(fleet), window)
}

/// A total Redis answered for a key this round sent `sent` of, checked like user input: an
/// integer from `sent` to [`MAX_TOTAL`].
pub fn check_total(reply: i64, sent: u64) -> Option<u64> {
    u64::try_from(reply)
        .ok()
        .filter(|&total| total >= sent && total <= MAX_TOTAL)
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: QuotaWindow = QuotaWindow {
        tag: 5,
        end_ns: 1_000,
    };
    const NEXT: QuotaWindow = QuotaWindow {
        tag: 6,
        end_ns: 2_000,
    };

    #[test]
    fn fleet_words() {
        assert_eq!(fleet_total(0, &W), None);
        assert_eq!(fleet_total(asked_word(&W), &W), None);
        assert!(is_asked(asked_word(&W), &W));
        assert!(!is_asked(asked_word(&W), &NEXT));
        for total in [0, 1, 20, MAX_TOTAL] {
            assert_eq!(fleet_total(fleet_word(total, &W), &W), Some(total));
            assert!(!is_asked(fleet_word(total, &W), &W));
            // Another period's total is not this one's.
            assert_eq!(fleet_total(fleet_word(total, &W), &NEXT), None);
        }
        assert_eq!(fleet_total(fleet_word(u64::MAX, &W), &W), Some(MAX_TOTAL));
    }

    #[test]
    fn pending_deltas() {
        let pending = add_pending(add_pending(0, &W, 3), &W, 2);
        assert_eq!(used(pending, &W), 5);
        assert_eq!(used(remove_pending(pending, &W, 4), &W), 1);
        assert_eq!(used(remove_pending(pending, &W, 9), &W), 0);
        // An earlier period's delta is dropped by the next period's first request.
        assert_eq!(used(add_pending(pending, &NEXT, 1), &NEXT), 1);
        assert_eq!(remove_pending(pending, &NEXT, 1), pending);
    }

    #[test]
    fn admits_table() {
        // (fleet total, pending, limit, instances, cost, sharing, admits)
        #[rustfmt::skip]
        let rows = [
            (None, 0, 20, 2, 1, false, true),
            (None, 9, 20, 2, 1, false, true),
            (None, 10, 20, 2, 1, false, false),
            (None, 0, 1, 2, 1, false, false),
            (None, 0, 20, 1, 20, false, true),
            (Some(19), 100, 20, 3, 1, false, true),
            (Some(14), 0, 20, 3, 2, true, true),
            (Some(14), 1, 20, 3, 2, true, false),
            (Some(20), 0, 20, 1, 1, true, false),
            (Some(30), 0, 20, 1, 1, true, false),
            (None, 0, 20, 0, 20, true, true),
        ];
        for (total, pending, limit, instances, cost, sharing, admits) in rows {
            let fleet = total.map_or(0, |total| fleet_word(total, &W));
            let pending = state_of(pending, &W);
            assert_eq!(
                fleet_admits(fleet, pending, &W, limit, instances, cost, sharing),
                admits,
                "{total:?} {pending} {limit} {instances} {cost} {sharing}"
            );
        }
    }

    #[test]
    fn synced_states() {
        // Counted 16 here (10 of them not sent yet when the round took 6): Redis says 20
        // with the 6, 2 more came since: 22.
        assert_eq!(
            used(synced_state(state_of(16, &W), &W, 20, state_of(2, &W)), &W),
            22
        );
        // A request counted and not yet added to pending is kept.
        assert_eq!(
            used(synced_state(state_of(30, &W), &W, 20, state_of(2, &W)), &W),
            30
        );
        // A state of an earlier period starts from the fleet's.
        assert_eq!(used(synced_state(state_of(9, &NEXT), &W, 4, 0), &W), 4);
    }

    #[test]
    fn totals_checked() {
        assert_eq!(check_total(20, 6), Some(20));
        assert_eq!(check_total(5, 6), None);
        assert_eq!(check_total(-1, 0), None);
        assert_eq!(check_total(MAX_TOTAL as i64 + 1, 0), None);
    }
}
