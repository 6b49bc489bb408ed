//! What one sync round sends and what it accepts back (`rate_limit_sync` at scale).
//!
//! # Which keys a round sends
//!
//! Every key an instance admits is charged to its pending delta. A key whose pending delta
//! stays under half of what the instance may take alone ([`crate::fleet::fresh_grant_milli`]:
//! `1 / N̂` of a full bucket and one interval's drain) needs no round trip: its delta stays in
//! its slot, merged with what comes next, and is sent once it crosses that line. So the
//! fleet lags behind such a key by less than half a share per instance, a constant, and 100k
//! distinct keys a second that each stay well inside their limit cost Redis nothing per key.
//! A key is [`urgency`]-ranked for the round once it crosses the line, or at once when a
//! request was refused for want of a grant (it is near or over its share): refused keys
//! first, then by how much of its allowance the key has used.
//!
//! # How much a round sends
//!
//! A round sends at most [`RoundBudget::keys`] keys, the most urgent first; the rest stay in
//! their slots (merged: one delta per key, never a queue of retries) for the next round. The
//! budget follows what rounds take: it halves after a round that timed out, shrinks when a
//! round uses more than half of `timeout=`, and doubles when a full round took less than a
//! quarter of it. After a failed round the loop sends no key until a round trip succeeds
//! again, so a stalled Redis is never handed a growing backlog to chew through when it
//! resumes.
//!
//! # What a round accepts
//!
//! Redis is a peer, not a trusted source: every value is checked against bounds the
//! instance computes itself before it touches shared memory ([`check_key_reply`],
//! [`check_instances`]); a value out of bounds is a [`BadValue`], dropped and counted. What
//! one round may read is bounded too ([`reply_bytes_bound`]).

use thiserror::Error;

use crate::fleet::{fresh_grant_milli, FleetShape, ASKED, MILLI};

/// Instances a fleet may have, as far as the heartbeats and the per-key counts are believed.
pub const MAX_INSTANCES: u64 = 1024;

/// Rank of a key whose request was refused for want of a grant: above any other.
const REFUSED: u64 = 1 << 62;

/// How urgent it is to send a key's pending word this round: `None` when it needs no round
/// trip (nothing pending, or what is pending is under half of the instance's own allowance
/// and no request was refused), else a rank, higher first: a refused key above any other,
/// then the pending delta over the allowance.
///
/// ```
/// use ratelimit_core::fleet::{FleetShape, ASKED};
/// use ratelimit_core::fleet_round::urgency;
///
/// const MS: u64 = 1_000_000;
/// // 10r/s burst=20 (K = 21) alone, synced every 100 ms: 22 requests of allowance.
/// let shape = FleetShape { interval_ns: 100 * MS, capacity: 21 };
/// assert_eq!(urgency(1, &shape, 1, 100 * MS), None); // one request: no round trip
/// assert!(urgency(11, &shape, 1, 100 * MS).is_some()); // half of it
/// assert!(urgency(ASKED, &shape, 1, 100 * MS) > urgency(21, &shape, 1, 100 * MS));
/// // 10r/s burst=0 (K = 1): a single request is half of what it may take alone.
/// let small = FleetShape { interval_ns: 100 * MS, capacity: 1 };
/// assert!(urgency(1, &small, 1, 100 * MS).is_some());
/// ```
pub fn urgency(pending_word: u64, shape: &FleetShape, instances: u64, sync_ns: u64) -> Option<u64> {
    let refused = pending_word & ASKED != 0;
    let pending = pending_word & !ASKED;
    if pending == 0 && !refused {
        return None;
    }
    let allowance = fresh_grant_milli(shape, instances, sync_ns).max(1);
    let used = u128::from(pending) * u128::from(MILLI);
    if !refused && 2 * used < u128::from(allowance) {
        return None;
    }
    // Pending over allowance, in 1/1024: at most 2^61 (a refused key ranks above it).
    let rank = (used * 1024 / u128::from(allowance)).min(1 << 61) as u64;
    Some(if refused { REFUSED + rank } else { rank })
}

/// How many keys a round may send, adapted to what rounds take against `timeout=`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoundBudget {
    /// Keys the next round may send.
    pub keys: usize,
}

impl RoundBudget {
    /// The floor: a round always has room for this many keys.
    pub const MIN: usize = 256;
    /// The ceiling (it bounds what a round holds in memory).
    pub const MAX: usize = 32_768;
    /// Where a loop starts.
    pub const START: usize = 4096;

    /// A loop's first budget.
    pub fn new() -> RoundBudget {
        RoundBudget {
            keys: RoundBudget::START,
        }
    }

    /// After a round that sent `sent` keys: `took_ns` for the exchange when it succeeded,
    /// `None` when it failed or timed out.
    ///
    /// ```
    /// use ratelimit_core::fleet_round::RoundBudget;
    ///
    /// let mut budget = RoundBudget::new();
    /// budget.after(4096, None, 50_000_000);
    /// assert_eq!(budget.keys, 2048);
    /// budget.after(2048, Some(40_000_000), 50_000_000); // 80% of the timeout: too close
    /// assert_eq!(budget.keys, 1280);
    /// budget.after(1280, Some(5_000_000), 50_000_000); // a full round in 10% of it
    /// assert_eq!(budget.keys, 2560);
    /// budget.after(100, Some(5_000_000), 50_000_000); // not full: nothing learnt
    /// assert_eq!(budget.keys, 2560);
    /// ```
    pub fn after(&mut self, sent: usize, took_ns: Option<u64>, timeout_ns: u64) {
        let timeout_ns = timeout_ns.max(1);
        let keys = match took_ns {
            None if sent > 0 => self.keys / 2,
            None => self.keys,
            Some(took) if took > timeout_ns / 2 => {
                // Aim at half of the timeout for the keys it took this long for.
                let scaled = sent as u128 * u128::from(timeout_ns / 2) / u128::from(took.max(1));
                (scaled as usize).min(self.keys)
            }
            Some(took) if sent >= self.keys && took < timeout_ns / 4 => self.keys * 2,
            Some(_) => self.keys,
        };
        self.keys = keys.clamp(RoundBudget::MIN, RoundBudget::MAX);
    }
}

impl Default for RoundBudget {
    fn default() -> RoundBudget {
        RoundBudget::new()
    }
}

/// The most bytes one round's replies may take: a key's reply is three integers (at most 69
/// bytes of RESP), a zone's limits and overrides at most its 512 overrides of 256-byte keys,
/// and a few kilobytes for the heartbeat and the framing. Beyond, the connection is dropped.
///
/// ```
/// use ratelimit_core::fleet_round::reply_bytes_bound;
///
/// assert_eq!(reply_bytes_bound(0, 1), 64 * 1024 + 320 * 1024);
/// assert_eq!(reply_bytes_bound(1000, 1) - reply_bytes_bound(0, 1), 96_000);
/// ```
pub fn reply_bytes_bound(keys: usize, zones: usize) -> usize {
    64 * 1024 + keys.saturating_mul(96) + zones.saturating_mul(320 * 1024)
}

/// A value from Redis that the instance does not believe; its message says what was wrong.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum BadValue {
    /// The key script said the fleet is further ahead than the script itself allows.
    #[error("key state ahead {ahead_us} us is out of range (at most {most_us} us, two buckets and one interval)")]
    Ahead {
        /// The lead Redis answered.
        ahead_us: i64,
        /// The most the key script keeps.
        most_us: u64,
    },
    /// Request counts that no fleet of [`MAX_INSTANCES`] could have sent.
    #[error("key counts {recent}/{before} are out of range (at most {most} requests)")]
    Counts {
        /// Requests in this and the previous window, as answered.
        recent: i64,
        /// Requests in the previous window, as answered.
        before: i64,
        /// The most a fleet could have sent.
        most: u64,
    },
    /// A heartbeat count that is no number of instances.
    #[error("instances {0} is out of range (1 to 1024)")]
    Instances(i64),
    /// Limits the zone's algorithm cannot take, or that no valid limits pack to.
    #[error("limits {0}")]
    Limits(String),
    /// A version that goes backwards or is negative.
    #[error("override version {0} is out of range")]
    Version(i64),
}

/// A key script's reply for one key, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyReply {
    /// How far the fleet's TAT is ahead of the store's clock.
    pub ahead_ns: u64,
    /// The fleet's requests in this and the previous sync window.
    pub recent: u64,
    /// The fleet's requests in the previous window.
    pub before: u64,
}

/// Check a key script's reply `(ahead_us, recent, before)` for a key of `shape`: the lead at
/// most what the script keeps (`2 K T + I`, plus an interval of rounding), counts at most
/// what [`MAX_INSTANCES`] instances each sending their largest delta in both windows could
/// report, and none negative.
///
/// ```
/// use ratelimit_core::fleet::FleetShape;
/// use ratelimit_core::fleet_round::{check_key_reply, BadValue};
///
/// const MS: u64 = 1_000_000;
/// let shape = FleetShape { interval_ns: 100 * MS, capacity: 6 }; // 10r/s burst=5
/// assert_eq!(check_key_reply(&shape, 100 * MS, (250_000, 3, 1)).unwrap().ahead_ns, 250 * MS);
/// let lie = check_key_reply(&shape, 100 * MS, (i64::MAX, i64::MAX, i64::MAX));
/// assert!(matches!(lie, Err(BadValue::Ahead { .. })));
/// ```
pub fn check_key_reply(
    shape: &FleetShape,
    sync_ns: u64,
    (ahead_us, recent, before): (i64, i64, i64),
) -> Result<KeyReply, BadValue> {
    let most_us = shape.max_ahead_ns(sync_ns).saturating_add(sync_ns) / 1000;
    let ahead = u64::try_from(ahead_us)
        .ok()
        .filter(|&ahead| ahead <= most_us)
        .ok_or(BadValue::Ahead { ahead_us, most_us })?;
    let most = MAX_INSTANCES.saturating_mul(2 * shape.carry_limit());
    let counts = u64::try_from(recent)
        .ok()
        .zip(u64::try_from(before).ok())
        .filter(|&(recent, before)| recent <= most && before <= most);
    let Some((recent, before)) = counts else {
        return Err(BadValue::Counts {
            recent,
            before,
            most,
        });
    };
    Ok(KeyReply {
        ahead_ns: ahead.saturating_mul(1000),
        recent,
        before,
    })
}

/// Check a heartbeat's count of live instances: 1 to [`MAX_INSTANCES`].
pub fn check_instances(count: i64) -> Result<u64, BadValue> {
    u64::try_from(count)
        .ok()
        .filter(|count| (1..=MAX_INSTANCES).contains(count))
        .ok_or(BadValue::Instances(count))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn urgency_ranks_refused_then_used() {
        let shape = FleetShape {
            interval_ns: 10 * MS,
            capacity: 21,
        };
        // 100r/s burst=20 over three instances, 100 ms: 31 / 3 = 10.33 requests each.
        #[rustfmt::skip]
        let rows: &[(u64, Option<u64>)] = &[
            (0, None),
            (5, None),                              // under half of 10.33
            (6, Some(6 * 1000 * 1024 / 10_333)),    // over half
            (31, Some(31 * 1000 * 1024 / 10_333)),
            (ASKED, Some(REFUSED)),                 // refused, nothing charged
            (ASKED | 2, Some(REFUSED + 2 * 1000 * 1024 / 10_333)),
        ];
        for &(pending, rank) in rows {
            assert_eq!(urgency(pending, &shape, 3, 100 * MS), rank, "{pending}");
        }
    }

    #[test]
    fn budget_stays_within_its_bounds() {
        let mut budget = RoundBudget::new();
        for _ in 0..20 {
            budget.after(budget.keys, None, 50 * MS);
        }
        assert_eq!(budget.keys, RoundBudget::MIN);
        for _ in 0..20 {
            budget.after(budget.keys, Some(MS), 50 * MS);
        }
        assert_eq!(budget.keys, RoundBudget::MAX);
    }

    #[test]
    fn key_replies_are_checked() {
        let shape = FleetShape {
            interval_ns: 10 * MS,
            capacity: 21,
        };
        // 2 K T + I = 420 + 100 ms, plus an interval: 620 ms.
        #[rustfmt::skip]
        let rows: &[((i64, i64, i64), bool)] = &[
            ((0, 0, 0), true),
            ((620_000, 10, 5), true),
            ((620_001, 10, 5), false),
            ((-1, 0, 0), false),
            ((0, -1, 0), false),
            ((0, 0, -5), false),
            ((0, 1024 * 2 * 121, 0), true),
            ((0, 1024 * 2 * 121 + 1, 0), false),
        ];
        for &(reply, ok) in rows {
            assert_eq!(
                check_key_reply(&shape, 100 * MS, reply).is_ok(),
                ok,
                "{reply:?}"
            );
        }
        assert_eq!(check_instances(3), Ok(3));
        assert!(check_instances(0).is_err());
        assert!(check_instances(1025).is_err());
    }
}
