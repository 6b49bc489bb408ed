//! Sliding window log: at most N requests in any window of one rate unit, exactly.
//!
//! Each key keeps the timestamps of the requests it let through (a request of cost `c`
//! records `c` entries). An entry at `t` counts while `now < t + W`; a request passes iff the
//! entries still counting plus its cost are at most `N`. So in any half-open interval
//! `[a, a + W)` at most `N` requests pass.
//!
//! # Log layout
//!
//! `log[0]` is a header: the ring's head (index of the oldest entry) in bits 32..64 and the
//! entry count in bits 0..32. `log[1..]` is a ring of timestamps, oldest first from the head;
//! its capacity is `log.len() - 1`, which must be at least `N`. All zeros is a fresh key (a
//! count of zero, so a timestamp of 0 is a valid entry). A header out of range (a worker died
//! mid-update) is clamped into range rather than trusted.
//!
//! A `now_ns` earlier than the newest entry counts as the newest entry's time, which also
//! keeps the ring sorted.

use crate::decision::{Decision, Outcome};
use crate::policy::{Limits, Policy};
use crate::rate::Rate;

const COUNT_MASK: u64 = u32::MAX as u64;

/// Number of `u64` words a key's log needs for a zone allowing `max_requests` per window:
/// one header word and one timestamp per request.
pub fn words_for(max_requests: u64) -> usize {
    usize::try_from(max_requests)
        .unwrap_or(usize::MAX)
        .saturating_add(1)
}

/// The requests per window, `N`: the rate's whole number of requests per unit (rounded down).
#[inline]
pub fn window_limit(rate: &Rate) -> u64 {
    rate.milli_requests / 1000
}

/// The ring as read from its header, clamped so that `head < capacity` and
/// `count <= capacity`: the `n`-th oldest entry (`n < capacity`) is then at `head + n`, less
/// the capacity past the end, with no division.
struct Ring<'a> {
    entries: &'a [u64],
    head: usize,
    count: usize,
}

impl<'a> Ring<'a> {
    /// `None` when the log has no room for a single entry.
    #[inline]
    fn read(log: &'a [u64]) -> Option<Ring<'a>> {
        let (&header, entries) = log.split_first()?;
        let (head, count) = read_header(header, entries.len())?;
        Some(Ring {
            entries,
            head,
            count,
        })
    }

    /// The `n`-th oldest entry, `n < capacity`.
    #[inline]
    fn entry(&self, n: usize) -> u64 {
        self.entries[wrap(self.head + n, self.entries.len())]
    }

    #[inline]
    fn newest(&self) -> Option<u64> {
        self.count.checked_sub(1).map(|last| self.entry(last))
    }

    /// How many of the oldest entries no longer count at `effective_ns`: those before the
    /// first one that still does. Only these are read, so the cost is the entries a passing
    /// request then drops (a rejected request of cost `c` finds fewer than `c` of them in a
    /// log of `N` entries).
    #[inline]
    fn expired(&self, window_ns: u64, effective_ns: u64) -> usize {
        let mut expired = 0;
        let mut position = self.head;
        while expired < self.count {
            let time = self.entries.get(position).copied().unwrap_or(0);
            // Counts while `effective - time < W`; `time + W` could overflow near the end of
            // the clock, and saturated it would let every entry expire at `u64::MAX`.
            if effective_ns.saturating_sub(time) < window_ns {
                break;
            }
            expired += 1;
            position = wrap(position + 1, self.entries.len());
        }
        expired
    }
}

/// `(head, count)` clamped into a ring of `capacity` entries; `None` for no capacity.
#[inline]
fn read_header(header: u64, capacity: usize) -> Option<(usize, usize)> {
    if capacity == 0 {
        return None;
    }
    let head = usize::try_from(header >> 32).unwrap_or(0);
    // Out of range only if a worker died mid-update: divide only then.
    let head = if head < capacity {
        head
    } else {
        head % capacity
    };
    let count = usize::try_from(header & COUNT_MASK)
        .unwrap_or(capacity)
        .min(capacity);
    Some((head, count))
}

/// A ring position less than twice the capacity, wrapped into the ring.
#[inline]
fn wrap(position: usize, capacity: usize) -> usize {
    if position >= capacity {
        position - capacity
    } else {
        position
    }
}

/// What a request would do to a log.
struct Plan {
    decision: Decision,
    /// How to record the request, if it passes.
    record: Option<Record>,
}

/// A passing request's change to the log: drop the expired entries from the head, then
/// append `cost` entries at `time`.
struct Record {
    /// The new head (the oldest entry still counting).
    head: usize,
    /// Entries still counting, before the request's.
    count: usize,
    cost: usize,
    time: u64,
}

#[inline]
fn plan(log: &[u64], now_ns: u64, policy: &Policy) -> Plan {
    let window_ns = policy.limits.rate.window_ns().max(1);
    let limit = window_limit(&policy.limits.rate);
    let cost = policy.cost.max(1);
    let bad_log = Plan {
        decision: Decision::rejected(window_ns, 0, 0),
        record: None,
    };
    let Some(ring) = Ring::read(log) else {
        return bad_log;
    };
    // The header keeps a 32-bit count.
    if limit > COUNT_MASK || usize::try_from(limit).map_or(true, |limit| limit > ring.entries.len())
    {
        return bad_log;
    }

    // Entries expire as seen from the newest one; waits are reported on the caller's clock.
    let newest = ring.newest();
    let effective_ns = newest.map_or(now_ns, |newest| newest.max(now_ns));
    let expired = ring.expired(window_ns, effective_ns);
    // Within u64: count <= capacity <= usize::MAX.
    let count = (ring.count - expired) as u64;
    let newest = if count > 0 { newest } else { None };
    let reset_ns = |newest: Option<u64>| {
        newest.map_or(0, |newest| {
            newest.saturating_add(window_ns).saturating_sub(now_ns)
        })
    };

    let after = count.saturating_add(cost);
    if after > limit {
        let retry_after_ns = if cost > limit {
            Decision::NEVER_NS
        } else {
            // The (after - limit)-th oldest counting entry must stop counting; it is one of
            // the `count` entries since `cost <= limit`.
            // An entry whose expiry is past `u64::MAX` never stops counting.
            let must_expire = expired + (after - limit - 1) as usize;
            ring.entry(must_expire)
                .checked_add(window_ns)
                .map_or(Decision::NEVER_NS, |expiry| expiry.saturating_sub(now_ns))
        };
        let decision = Decision {
            remaining: limit.saturating_sub(count),
            ..Decision::rejected(
                retry_after_ns,
                reset_ns(newest),
                (after - limit).saturating_mul(1000),
            )
        };
        return Plan {
            decision,
            record: None,
        };
    }

    let decision = Decision {
        outcome: Outcome::Passed,
        delay_ns: 0,
        retry_after_ns: 0,
        remaining: limit - after,
        reset_ns: reset_ns(Some(effective_ns)),
        excess_milli: 0,
    };
    Plan {
        decision,
        // `cost <= limit <= capacity`: within usize.
        record: Some(Record {
            head: wrap(ring.head + expired, ring.entries.len()),
            count: ring.count - expired,
            cost: cost as usize,
            time: effective_ns,
        }),
    }
}

/// Decide one request against `log` (length `words_for(N)`, all zeros for a fresh key);
/// the log is changed only when the request passes.
///
/// `remaining` is `N` minus the entries counting after the request; `reset_ns` the time until
/// the newest entry stops counting. A request costing more than `N` never passes: its
/// `retry_after_ns` is [`Decision::NEVER_NS`]. A log too short for `N` (a caller bug)
/// rejects every request.
///
/// ```
/// use ratelimit_core::{sliding_log, Algorithm, DelayMode, Limits, Outcome, Policy, Rate};
///
/// let policy = Policy {
///     algorithm: Algorithm::SlidingLog,
///     limits: Limits { rate: Rate::parse("2r/s").unwrap(), burst: 0 },
///     delay: DelayMode::NoDelay,
///     cost: 1,
/// };
/// let mut log = vec![0; sliding_log::words_for(2)];
/// assert_eq!(sliding_log::decide(&mut log, 0, &policy).outcome, Outcome::Passed);
/// assert_eq!(sliding_log::decide(&mut log, 100, &policy).outcome, Outcome::Passed);
/// let third = sliding_log::decide(&mut log, 200, &policy);
/// assert_eq!(third.outcome, Outcome::Rejected);
/// assert_eq!(third.retry_after_ns, 1_000_000_000 - 200);
/// ```
#[inline]
pub fn decide(log: &mut [u64], now_ns: u64, policy: &Policy) -> Decision {
    let Plan { decision, record } = plan(log, now_ns, policy);
    let Some(Record {
        head,
        count,
        cost,
        time,
    }) = record
    else {
        return decision;
    };
    let Some((header, entries)) = log.split_first_mut() else {
        return decision;
    };
    // `count + cost <= limit <= capacity`: the new entries fit after the counting ones.
    let capacity = entries.len();
    let mut position = wrap(head + count, capacity);
    for _ in 0..cost {
        if let Some(slot) = entries.get_mut(position) {
            *slot = time;
        }
        position = wrap(position + 1, capacity);
    }
    *header = ((head as u64) << 32) | (count + cost) as u64;
    decision
}

/// Like `decide` but changes nothing (and copies nothing).
#[inline]
pub fn inspect(log: &[u64], now_ns: u64, policy: &Policy) -> Decision {
    plan(log, now_ns, policy).decision
}

/// Remove the `cost` newest entries (the requests last charged), for `uncommit`.
pub fn drop_newest(log: &mut [u64], cost: u64) {
    let Some((header, entries)) = log.split_first_mut() else {
        return;
    };
    let Some((head, count)) = read_header(*header, entries.len()) else {
        return;
    };
    let kept = (count as u64).saturating_sub(cost);
    *header = ((head as u64) << 32) | kept;
}

/// The earliest time at which `log` is equivalent to a fresh key: when its newest entry stops
/// counting (0 for an empty log).
pub fn idle_at_ns(log: &[u64], limits: &Limits) -> u64 {
    Ring::read(log)
        .and_then(|ring| ring.newest())
        .map_or(0, |newest| newest.saturating_add(limits.rate.window_ns()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Algorithm, DelayMode};
    use crate::rate::RateUnit;
    use Outcome::{Passed as P, Rejected as R};

    const MS: u64 = 1_000_000;
    /// A `retry_after_ms` column's "never".
    const NEVER: u64 = u64::MAX;

    fn ns(ms: u64) -> u64 {
        if ms == NEVER {
            Decision::NEVER_NS
        } else {
            ms * MS
        }
    }

    fn policy(per_second: u64, cost: u64) -> Policy {
        Policy {
            algorithm: Algorithm::SlidingLog,
            limits: Limits {
                rate: Rate {
                    milli_requests: per_second * 1000,
                    unit: RateUnit::Second,
                },
                burst: 0,
            },
            delay: DelayMode::NoDelay,
            cost,
        }
    }

    /// 5 requests per 1 s. Rows `(now_ms, cost, outcome, remaining, retry_after_ms, reset_ms)`,
    /// computed by hand from the list of passed timestamps `t` still counting (`t > now - 1000`).
    #[test]
    fn five_per_second() {
        #[rustfmt::skip]
        let rows: &[(u64, u64, Outcome, u64, u64, u64)] = &[
            (0,    1, P, 4, 0,    1000),
            (100,  1, P, 3, 0,    1000),
            (200,  2, P, 1, 0,    1000), // two entries at 200
            (300,  1, P, 0, 0,    1000),
            (300,  1, R, 0, 700,  1000), // the entry at 0 stops counting at 1000
            (400,  1, R, 0, 600,  900),
            (999,  1, R, 0, 1,    301),
            (1000, 1, P, 0, 0,    1000), // 0 dropped: the window is half-open
            (1000, 1, R, 0, 100,  1000),
            (1050, 1, R, 0, 50,   950),
            (1100, 1, P, 0, 0,    1000),
            (1150, 2, R, 0, 50,   950),  // needs both entries at 200 gone
            (1250, 6, R, 2, NEVER, 850), // more than 5: never passes
            (1300, 1, P, 2, 0,    1000),
            (2000, 1, P, 2, 0,    1000),
            (2300, 3, P, 1, 0,    1000),
            (2300, 1, P, 0, 0,    1000),
            (2400, 1, R, 0, 600,  900),
            (3300, 1, P, 4, 0,    1000),
            (3400, 5, R, 4, 900,  900),
        ];
        let mut log = vec![0; words_for(5)];
        for (i, &(now_ms, cost, outcome, remaining, retry_ms, reset_ms)) in rows.iter().enumerate()
        {
            let policy = policy(5, cost);
            let inspected = inspect(&log, now_ms * MS, &policy);
            let before = log.clone();
            let decision = decide(&mut log, now_ms * MS, &policy);
            assert_eq!(inspected, decision, "row {i}");
            let row = (
                decision.outcome,
                decision.remaining,
                decision.retry_after_ns,
                decision.reset_ns,
            );
            assert_eq!(
                row,
                (outcome, remaining, ns(retry_ms), reset_ms * MS),
                "row {i}"
            );
            assert_eq!(log != before, outcome == P, "row {i}");
        }
        assert_eq!(idle_at_ns(&log, &policy(5, 1).limits), 4300 * MS);
    }

    #[test]
    fn time_zero_is_a_timestamp() {
        let policy = policy(1, 1);
        let mut log = vec![0; words_for(1)];
        assert_eq!(decide(&mut log, 0, &policy).outcome, P);
        assert_eq!(decide(&mut log, 0, &policy).outcome, R);
        assert_eq!(idle_at_ns(&log, &policy.limits), 1000 * MS);
        assert_eq!(decide(&mut log, 1000 * MS, &policy).outcome, P);
    }

    #[test]
    fn a_log_too_short_rejects() {
        let policy = policy(3, 1);
        for length in 0..words_for(3) {
            let mut log = vec![0; length];
            assert_eq!(decide(&mut log, 5, &policy).outcome, R, "length {length}");
            assert!(log.iter().all(|&word| word == 0));
        }
        let mut longer = vec![0; words_for(3) + 2];
        assert_eq!(decide(&mut longer, 5, &policy).outcome, P);
    }

    #[test]
    fn an_earlier_clock_is_no_time_passed() {
        let policy = policy(2, 1);
        let mut log = vec![0; words_for(2)];
        assert_eq!(decide(&mut log, 5000 * MS, &policy).outcome, P);
        let early = decide(&mut log, 4000 * MS, &policy);
        assert_eq!((early.outcome, early.reset_ns), (P, 2000 * MS));
        let rejected = decide(&mut log, 4500 * MS, &policy);
        assert_eq!((rejected.outcome, rejected.retry_after_ns), (R, 1500 * MS));
    }
}
