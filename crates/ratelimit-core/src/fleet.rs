//! Cluster-wide limits (`rate_limit_sync`): the arithmetic that turns the fleet's state, as a
//! shared store reports it, into what one instance may admit until its next sync.
//!
//! # Model
//!
//! The fleet's state of a key is a GCRA theoretical arrival time kept by the store on its own
//! clock, with the zone's emission interval `T` and capacity `K` ([`FleetShape`]). Each sync
//! interval `I`, every instance adds the requests it charged since its last sync (its delta)
//! and reads back `ahead = TAT - store_now`. Until the next sync the fleet may admit at most
//! the room [`fleet_room_milli`] `= K * T + I - ahead` (in requests: what the bucket holds
//! plus what drains during the interval), and this instance gets its share of it
//! ([`share`]): its part of the key's recent fleet traffic, never below `1 / N̂` for the `N̂`
//! instances seen alive, and exactly `1 / N̂` while the fleet has no history of the key.
//! The grant is spent by the request path with one compare-and-swap ([`take_grant`]); the
//! instance's own algorithm still decides each request too.
//!
//! # Bound
//!
//! Every admitted request ends up in the store's TAT, and no instance is granted anything
//! once `ahead >= K * T + I`. Over any span `t`, the fleet admits at most
//! `L * t + K + L * I` plus what the grants handed out in one round exceed the room by, plus
//! the fresh grants spent before a key's first sync. Shares computed from the store's recent
//! counts sum to about 1, but the counts lag by up to a round (instances sync at different
//! phases) and an instance at the floor may not use its share; the proptest of `fleet_simulation` checks that the
//! total stays below `L * t + 3 * (K + L * I)` for one to four instances, any load, spread
//! and phases: the overshoot does not grow with the attack rate. With the traffic spread evenly the
//! shares sum to 1 and the fleet stays near `L * t + K + L * I`.
//!
//! Time is passed in; nothing here reads a clock.

use crate::policy::{Algorithm, Limits};

/// A share of 1 in [`share`]'s fixed point.
pub const SHARE_ONE: u64 = 1 << 16;

/// Milli-requests per request: grants are kept in thousandths so that a third of a request
/// per interval adds up over three intervals instead of rounding to zero or one.
pub const MILLI: u64 = 1000;

/// Rounds after which a grant no longer describes the fleet (its key was not synced since).
pub const STALE_ROUNDS: u32 = 2;

/// The fleet-wide bucket of a zone's key: emission interval and capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FleetShape {
    /// `T`: nanoseconds per request.
    pub interval_ns: u64,
    /// `K`: requests the bucket holds.
    pub capacity: u64,
}

impl FleetShape {
    /// The shape for a zone's algorithm and limits; `None` for `sliding_log`, whose per-request
    /// log is not merged across instances.
    ///
    /// A leaky bucket holds `burst + 1`, a token bucket `max(burst, 1)`. A sliding window of
    /// `N` per `W` is bounded fleet-wide by a bucket of `N` at `N / W`: the same long-run
    /// rate, and at most `2N` in any window, as the sliding window itself allows.
    pub fn of(algorithm: Algorithm, limits: &Limits) -> Option<FleetShape> {
        let interval_ns = limits.rate.interval_ns().max(1);
        let capacity = match algorithm {
            Algorithm::LeakyBucket => limits.burst.saturating_add(1),
            Algorithm::TokenBucket => limits.burst.max(1),
            Algorithm::SlidingWindow => crate::sliding_window::window_limit(&limits.rate).max(1),
            Algorithm::SlidingLog | Algorithm::Concurrency | Algorithm::Quota(_) => return None,
        };
        Some(FleetShape {
            interval_ns,
            capacity,
        })
    }

    /// Requests (in thousandths) that drain from the bucket in `span_ns`.
    pub fn drained_milli(&self, span_ns: u64) -> u64 {
        mul_div(span_ns, MILLI, self.interval_ns)
    }

    /// `K` in thousandths.
    pub fn capacity_milli(&self) -> u64 {
        self.capacity.saturating_mul(MILLI)
    }

    /// `K * T`: how far ahead of the clock a full bucket is (saturating).
    pub fn capacity_ns(&self) -> u64 {
        self.capacity.saturating_mul(self.interval_ns)
    }

    /// The furthest the store keeps a key's TAT ahead of its clock: two buckets and one sync
    /// interval (`2 * K * T + I`). A reply beyond it is not the key script's.
    pub fn max_ahead_ns(&self, sync_ns: u64) -> u64 {
        self.capacity_ns().saturating_mul(2).saturating_add(sync_ns)
    }

    /// The largest delta one instance sends for a key in one sync: what it may carry over
    /// from an outage. A bucket's capacity and one second of its rate: enough to charge the
    /// fleet for what was admitted, without locking the key out for longer than that.
    pub fn carry_limit(&self) -> u64 {
        self.capacity
            .saturating_add(crate::rate::NANOS_PER_SEC / self.interval_ns)
            .max(1)
    }
}

/// `a * b / c` without overflow (saturating), `c` at least 1.
fn mul_div(a: u64, b: u64, c: u64) -> u64 {
    let value = u128::from(a) * u128::from(b) / u128::from(c.max(1));
    u64::try_from(value).unwrap_or(u64::MAX)
}

/// What the fleet may still admit (thousandths of a request) until the next sync, `sync_ns`
/// from now, when its TAT is `ahead_ns` ahead of the store's clock.
///
/// ```
/// use ratelimit_core::fleet::{fleet_room_milli, FleetShape};
///
/// // 100r/s, burst 20 (K = 21), synced every 100 ms: an idle key has 21 + 10 requests.
/// let shape = FleetShape { interval_ns: 10_000_000, capacity: 21 };
/// assert_eq!(fleet_room_milli(&shape, 0, 100_000_000), 31_000);
/// // 30 requests ahead: one request left plus the ten that drain.
/// assert_eq!(fleet_room_milli(&shape, 300_000_000, 100_000_000), 1_000);
/// ```
pub fn fleet_room_milli(shape: &FleetShape, ahead_ns: u64, sync_ns: u64) -> u64 {
    let full_ns = u128::from(shape.capacity) * u128::from(shape.interval_ns);
    let room_ns = (full_ns + u128::from(sync_ns)).saturating_sub(u128::from(ahead_ns));
    let milli = room_ns * u128::from(MILLI) / u128::from(shape.interval_ns);
    u64::try_from(milli).unwrap_or(u64::MAX)
}

/// This instance's share of a key (fixed point, [`SHARE_ONE`] is all of it): its recent
/// requests over the fleet's, at least `1 / instances` and at most 1.
///
/// `fleet_before` is the fleet's requests in the previous sync window: without any (a key
/// new to the fleet, or a store restarted empty) the store cannot tell whether the other
/// instances have traffic they did not report yet, and each instance takes `1 / instances`.
/// Otherwise every instance, seeing itself alone in its first round, would take the whole
/// room at once.
///
/// ```
/// use ratelimit_core::fleet::{share, SHARE_ONE};
///
/// assert_eq!(share(30, 30, 20, 3), SHARE_ONE); // all the traffic came here
/// assert_eq!(share(10, 30, 20, 3), SHARE_ONE / 3);
/// assert_eq!(share(0, 30, 20, 3), SHARE_ONE / 3); // never below 1/N
/// assert_eq!(share(30, 30, 0, 3), SHARE_ONE / 3); // no history yet
/// assert_eq!(share(0, 0, 0, 0), SHARE_ONE); // alone (nobody else seen)
/// ```
pub fn share(mine: u64, fleet: u64, fleet_before: u64, instances: u64) -> u64 {
    let floor = SHARE_ONE / instances.max(1);
    if fleet_before == 0 {
        return floor;
    }
    // The store may not have counted all of our own delta yet (or lost it): never less.
    let fleet = fleet.max(mine);
    if fleet == 0 {
        return floor;
    }
    mul_div(mine, SHARE_ONE, fleet).clamp(floor, SHARE_ONE)
}

/// The grant (thousandths) for this instance after a sync: its share of the fleet's room,
/// less what it charged between taking its delta and applying the answer (`spent_since`,
/// requests), which the store has not seen yet.
pub fn grant_milli(room_milli: u64, share: u64, spent_since: u64) -> u64 {
    mul_div(room_milli, share, SHARE_ONE).saturating_sub(spent_since.saturating_mul(MILLI))
}

/// A grant for a key this instance has no recent fleet view of (new, or not synced for
/// [`STALE_ROUNDS`]): `1 / instances` of a full bucket and of one interval's drain.
pub fn fresh_grant_milli(shape: &FleetShape, instances: u64, sync_ns: u64) -> u64 {
    let whole = shape
        .capacity_milli()
        .saturating_add(shape.drained_milli(sync_ns));
    whole / instances.max(1)
}

/// Between syncs that failed: the grant a key gets each round from its `share` alone, as a
/// bucket of `share` of the limit: `left` refilled by `share` of the interval's drain, up to
/// `share` of a full bucket plus that drain. One or two missed rounds use the key's last
/// share; `on_failure=local_share` uses `1 / N̂` ([`local_share_grant_milli`]).
pub fn share_refill_grant_milli(
    shape: &FleetShape,
    share: u64,
    sync_ns: u64,
    left_milli: u64,
) -> u64 {
    let drained = shape.drained_milli(sync_ns);
    let refill = mul_div(drained, share, SHARE_ONE);
    let cap = mul_div(
        shape.capacity_milli().saturating_add(drained),
        share,
        SHARE_ONE,
    );
    left_milli.saturating_add(refill).min(cap)
}

/// During an outage in `local_share` mode: the instance enforces `1 / instances` of the
/// limit alone (see [`share_refill_grant_milli`]).
pub fn local_share_grant_milli(
    shape: &FleetShape,
    instances: u64,
    sync_ns: u64,
    left_milli: u64,
) -> u64 {
    let instances = instances.max(1);
    let drained = shape.drained_milli(sync_ns);
    let refill = drained / instances;
    let cap = fresh_grant_milli(shape, instances, sync_ns);
    left_milli.saturating_add(refill).min(cap)
}

/// The per-key grant word: bit 63 set once granted, the sync round it was granted in
/// (modulo 2^23) in bits 40..63, the thousandths left in the low 40 bits (a billion requests:
/// one interval of the largest rate). 0 is a key never granted.
pub mod grant_word {
    const GRANTED: u64 = 1 << 63;
    const LEFT_BITS: u32 = 40;
    const LEFT_MASK: u64 = (1 << LEFT_BITS) - 1;
    const ROUND_MASK: u32 = (1 << 23) - 1;

    /// Pack a round and the thousandths left (saturated to 40 bits).
    pub fn pack(round: u32, left_milli: u64) -> u64 {
        GRANTED | (u64::from(round & ROUND_MASK) << LEFT_BITS) | left_milli.min(LEFT_MASK)
    }

    /// The round (modulo 2^23) and the thousandths left.
    pub fn unpack(word: u64) -> (u32, u64) {
        (((word >> LEFT_BITS) as u32) & ROUND_MASK, word & LEFT_MASK)
    }

    /// Rounds from `granted` to `now`, both modulo 2^23.
    pub fn rounds_since(granted: u32, now: u32) -> u32 {
        now.wrapping_sub(granted) & ROUND_MASK
    }
}

/// What a grant not renewed by a sync gains each round: `1 / instances` of one interval's
/// drain (what [`local_share_grant_milli`] refills), so that the fleet's grants, renewed or
/// not, never hand out more than the fleet's room and its drain.
pub fn stale_refill_milli(shape: &FleetShape, instances: u64, sync_ns: u64) -> u64 {
    shape.drained_milli(sync_ns) / instances.max(1)
}

/// The request path's step: take `cost` requests from a grant word at sync round `round`.
/// Returns the new word, or `None` when the grant cannot pay (reject). A word that was never
/// granted counts as `fresh_milli`. A grant [`STALE_ROUNDS`] or more rounds old (its key was
/// not synced since: it sent nothing, or too little to need a round trip) no longer describes
/// the fleet: it is renewed at `round` with what is left plus `refill_milli` for each round
/// since, up to `fresh_milli`. Not simply `fresh_milli`: a key whose bucket drains slowly
/// (`rate=6r/m`) would otherwise get a new share of a full bucket on every instance every
/// two rounds, whatever the fleet admitted.
///
/// ```
/// use ratelimit_core::fleet::{grant_word, take_grant};
///
/// let word = grant_word::pack(7, 2_500);
/// let word = take_grant(word, 7, 1, 0, 0).unwrap();
/// let word = take_grant(word, 8, 1, 0, 0).unwrap();
/// assert_eq!(grant_word::unpack(word), (7, 500));
/// assert_eq!(take_grant(word, 8, 1, 0, 0), None);
/// // Not synced since round 7: 500 left and 300 for each round since, up to the fresh 4 000.
/// assert_eq!(take_grant(word, 9, 1, 4_000, 300), Some(grant_word::pack(9, 100)));
/// assert_eq!(take_grant(word, 9, 2, 4_000, 300), None);
/// assert_eq!(take_grant(word, 100, 1, 4_000, 300), Some(grant_word::pack(100, 3_000)));
/// // Never granted: a fresh grant.
/// assert_eq!(take_grant(0, 9, 1, 4_000, 300), Some(grant_word::pack(9, 3_000)));
/// ```
pub fn take_grant(
    word: u64,
    round: u32,
    cost: u64,
    fresh_milli: u64,
    refill_milli: u64,
) -> Option<u64> {
    let (granted_round, left) = grant_word::unpack(word);
    let rounds = grant_word::rounds_since(granted_round, round);
    let (granted_round, left) = if word == 0 {
        (round, fresh_milli)
    } else if rounds >= STALE_ROUNDS {
        let refilled = left.saturating_add(u64::from(rounds).saturating_mul(refill_milli));
        (round, refilled.min(fresh_milli))
    } else {
        (granted_round, left)
    };
    let left = left.checked_sub(cost.saturating_mul(MILLI))?;
    Some(grant_word::pack(granted_round, left))
}

/// Give back `cost` requests taken by [`take_grant`] for a request the algorithm then
/// rejected.
pub fn return_grant(word: u64, cost: u64) -> u64 {
    let (round, left) = grant_word::unpack(word);
    grant_word::pack(round, left.saturating_add(cost.saturating_mul(MILLI)))
}

/// Take `cost` requests (a usage-based line's overrun, charged after the fact) from a grant
/// word, down to 0: unlike [`take_grant`] it cannot refuse, the request was already served.
///
/// ```
/// use ratelimit_core::fleet::{grant_word, spend_grant};
///
/// assert_eq!(spend_grant(grant_word::pack(7, 2_500), 2), grant_word::pack(7, 500));
/// assert_eq!(spend_grant(grant_word::pack(7, 2_500), 40), grant_word::pack(7, 0));
/// ```
pub fn spend_grant(word: u64, cost: u64) -> u64 {
    let (round, left) = grant_word::unpack(word);
    grant_word::pack(round, left.saturating_sub(cost.saturating_mul(MILLI)))
}

/// The pending word of a sync key: requests charged since the last sync in the low bits, and
/// [`ASKED`] when a request was refused for want of a grant (so the key is synced even if it
/// charged nothing).
pub const ASKED: u64 = 1 << 63;

/// A key's local single-word state after a sync: a bucket is moved to at least the fleet's
/// TAT (`ahead_ns` past `now_ns`), so delays and rejections reflect the fleet's backlog; a
/// sliding window keeps its own counts (the grant bounds it).
pub fn raise_local_state(state: u64, algorithm: Algorithm, ahead_ns: u64, now_ns: u64) -> u64 {
    match algorithm {
        Algorithm::LeakyBucket | Algorithm::TokenBucket if ahead_ns > 0 => {
            state.max(now_ns.saturating_add(ahead_ns))
        }
        _ => state,
    }
}

/// A key's local single-word state after a sync, when the fleet's TAT is `ahead_ns` past
/// `now_ns`: a bucket is raised to at least the fleet's TAT (so delays and `Retry-After`
/// reflect the fleet's backlog), and lowered to at most `now + max(ahead, K * T)`. Local
/// decisions never put a bucket further ahead than its capacity (`K` is the fleet's, the
/// largest of the zone's bursts); anything beyond was raised from an earlier reply, and a
/// sane reply repairs it. A sliding window keeps its own counts (the grant bounds it).
///
/// ```
/// use ratelimit_core::fleet::{settle_local_state, FleetShape};
/// use ratelimit_core::Algorithm;
///
/// let shape = FleetShape { interval_ns: 10, capacity: 3 };
/// // Raised to the fleet's TAT.
/// assert_eq!(settle_local_state(1_000, Algorithm::LeakyBucket, &shape, 50, 1_000), 1_050);
/// // A state left far ahead by an absurd reply comes back to the bucket's reach.
/// assert_eq!(settle_local_state(u64::MAX, Algorithm::TokenBucket, &shape, 0, 1_000), 1_040);
/// ```
pub fn settle_local_state(
    state: u64,
    algorithm: Algorithm,
    shape: &FleetShape,
    ahead_ns: u64,
    now_ns: u64,
) -> u64 {
    match algorithm {
        Algorithm::LeakyBucket | Algorithm::TokenBucket => {
            // One interval more than the bucket: the buckets admit up to half an interval
            // early at sub-millisecond rates.
            let reach = shape.capacity_ns().saturating_add(shape.interval_ns);
            let highest = now_ns.saturating_add(ahead_ns.max(reach));
            if state > highest {
                highest
            } else if ahead_ns > 0 {
                state.max(now_ns.saturating_add(ahead_ns))
            } else {
                state
            }
        }
        _ => state,
    }
}

/// The store's side of a sync, as the key script computes it on the store's clock: the fleet
/// TAT after an instance adds `delta` requests at `now_ns`.
///
/// * The TAT was written at emission interval `written_interval_ns`; when the zone's limits
///   changed since (an admin `PATCH`), its lead over `now` is re-expressed at the new interval
///   first, the backlog kept in requests (as `limit_req` keeps its excess across a reload).
/// * The delta's requests were all admitted after this instance's previous applied send of
///   the key (`previous_send_ns`, on the store's clock), or within the last interval when it
///   has none: they are charged from no earlier than that instant. Charging them all at
///   `now`, as if they had arrived at once, would count the interval's drain against the
///   fleet twice, which a small bucket (`burst=0`: one request) cannot absorb.
/// * The result is capped at two buckets and one interval ahead, so that an outage's carried
///   deltas never lock a key out for longer than that.
///
/// ```
/// use ratelimit_core::fleet::{charge_store, FleetShape};
///
/// const MS: u64 = 1_000_000;
/// let shape = FleetShape { interval_ns: 10 * MS, capacity: 1 }; // 100r/s, burst=0
/// // Ten requests since the previous send 100 ms ago, on an idle key: the fleet is on time.
/// assert_eq!(charge_store(0, 10 * MS, 1_000 * MS, Some(900 * MS), 10, &shape, 100 * MS), 1_000 * MS);
/// // The same ten at once on a key already on time: 100 ms ahead.
/// assert_eq!(charge_store(1_000 * MS, 10 * MS, 1_000 * MS, Some(900 * MS), 10, &shape, 100 * MS), 1_100 * MS);
/// ```
pub fn charge_store(
    tat_ns: u64,
    written_interval_ns: u64,
    now_ns: u64,
    previous_send_ns: Option<u64>,
    delta: u64,
    shape: &FleetShape,
    sync_ns: u64,
) -> u64 {
    let lead = tat_ns.saturating_sub(now_ns);
    let lead = if written_interval_ns != shape.interval_ns && written_interval_ns > 0 {
        mul_div(lead, shape.interval_ns, written_interval_ns)
    } else {
        lead
    };
    let tat = if lead > 0 { now_ns + lead } else { tat_ns };
    let since = previous_send_ns
        .unwrap_or_else(|| now_ns.saturating_sub(sync_ns))
        .min(now_ns);
    let charged = tat
        .max(since)
        .saturating_add(delta.saturating_mul(shape.interval_ns));
    charged.min(now_ns.saturating_add(shape.max_ahead_ns(sync_ns)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rate::{Rate, RateUnit};

    const MS: u64 = 1_000_000;

    fn limits(per_second: u64, burst: u64) -> Limits {
        Limits {
            rate: Rate {
                milli_requests: per_second * 1000,
                unit: RateUnit::Second,
            },
            burst,
        }
    }

    #[test]
    fn shapes() {
        let l = limits(100, 20);
        #[rustfmt::skip]
        let rows = [
            (Algorithm::LeakyBucket,   Some((10 * MS, 21))),
            (Algorithm::TokenBucket,   Some((10 * MS, 20))),
            (Algorithm::SlidingWindow, Some((10 * MS, 100))),
            (Algorithm::SlidingLog,    None),
        ];
        for (algorithm, expected) in rows {
            let shape = FleetShape::of(algorithm, &l).map(|s| (s.interval_ns, s.capacity));
            assert_eq!(shape, expected, "{algorithm}");
        }
    }

    /// Rows `(ahead_ms, room in requests)` for 100r/s, K = 21, synced every 100 ms.
    #[test]
    fn room() {
        let shape = FleetShape {
            interval_ns: 10 * MS,
            capacity: 21,
        };
        #[rustfmt::skip]
        let rows = [(0, 31_000), (100, 21_000), (205, 10_500), (310, 0), (5_000, 0)];
        for (ahead_ms, room) in rows {
            assert_eq!(
                fleet_room_milli(&shape, ahead_ms * MS, 100 * MS),
                room,
                "{ahead_ms}"
            );
        }
    }

    #[test]
    fn grants() {
        // share 1/3 of 31 requests, less 2 requests charged since the delta was taken.
        assert_eq!(grant_milli(31_000, SHARE_ONE / 3, 2), 10_333 - 2_000);
        assert_eq!(grant_milli(1_000, SHARE_ONE, 5), 0);
        let shape = FleetShape {
            interval_ns: 10 * MS,
            capacity: 21,
        };
        assert_eq!(fresh_grant_milli(&shape, 3, 100 * MS), 31_000 / 3);
        // local_share: a third of the drain (3.333) each round, up to a third of 31.
        assert_eq!(local_share_grant_milli(&shape, 3, 100 * MS, 0), 3_333);
        assert_eq!(local_share_grant_milli(&shape, 3, 100 * MS, 9_000), 10_333);
        // The last share (here all of it) refills by the whole drain, up to K + drain.
        assert_eq!(
            share_refill_grant_milli(&shape, SHARE_ONE, 100 * MS, 0),
            10_000
        );
        assert_eq!(
            share_refill_grant_milli(&shape, SHARE_ONE, 100 * MS, 30_000),
            31_000
        );
    }

    #[test]
    fn returned_grant_pays_again() {
        let word = take_grant(0, 3, 2, 2_000, 0).unwrap();
        assert_eq!(take_grant(word, 3, 1, 2_000, 0), None);
        let word = return_grant(word, 2);
        assert!(take_grant(word, 3, 2, 0, 0).is_some());
    }

    #[test]
    fn local_state_follows_the_fleet_backlog() {
        let now = 1_000 * MS;
        assert_eq!(
            raise_local_state(0, Algorithm::LeakyBucket, 50 * MS, now),
            now + 50 * MS
        );
        assert_eq!(
            raise_local_state(now + 90 * MS, Algorithm::TokenBucket, 50 * MS, now),
            now + 90 * MS
        );
        assert_eq!(
            raise_local_state(7, Algorithm::SlidingWindow, 50 * MS, now),
            7
        );
    }

    #[test]
    fn local_state_is_settled_within_the_fleets_reach() {
        let shape = FleetShape {
            interval_ns: 10 * MS,
            capacity: 6,
        };
        let now = 1_000 * MS;
        #[rustfmt::skip]
        let rows = [
            // (state, ahead, settled): raised to the fleet, lowered to its reach (K T + T).
            (0,              0,        0),
            (0,              50 * MS,  now + 50 * MS),
            (now + 90 * MS,  50 * MS,  now + 70 * MS),
            (now + 30 * MS,  50 * MS,  now + 50 * MS),
            (now + 60 * MS,  0,        now + 60 * MS),
            (u64::MAX,       0,        now + 70 * MS),
            (u64::MAX,       200 * MS, now + 200 * MS),
        ];
        for (state, ahead, settled) in rows {
            assert_eq!(
                settle_local_state(state, Algorithm::LeakyBucket, &shape, ahead, now),
                settled,
                "{state} {ahead}"
            );
        }
        assert_eq!(
            settle_local_state(7, Algorithm::SlidingWindow, &shape, 50 * MS, now),
            7
        );
    }

    #[test]
    fn the_store_charges_from_the_previous_send() {
        let shape = FleetShape {
            interval_ns: 10 * MS,
            capacity: 1,
        };
        let now = 10_000 * MS;
        #[rustfmt::skip]
        let rows = [
            // (tat, previous send, delta, new tat)
            (0,                Some(now - 100 * MS), 10, now),
            (0,                None,                 10, now),
            (0,                Some(now - 500 * MS), 10, now - 400 * MS),
            (now - 50 * MS,    Some(now - 100 * MS), 10, now + 50 * MS),
            (now + 20 * MS,    Some(now - 100 * MS), 1,  now + 30 * MS),
            // capped at 2 K T + I = 120 ms ahead.
            (now,              Some(now - 100 * MS), 50, now + 120 * MS),
        ];
        for (tat, previous, delta, expected) in rows {
            assert_eq!(
                charge_store(tat, 10 * MS, now, previous, delta, &shape, 100 * MS),
                expected,
                "{tat} {previous:?} {delta}"
            );
        }
        // Written at 1r/s (T = 1 s), 3 requests ahead; now 100r/s: 3 requests at 10 ms.
        let slow = now + 3_000 * MS;
        assert_eq!(
            charge_store(slow, 1_000 * MS, now, Some(now), 0, &shape, 100 * MS),
            now + 30 * MS
        );
    }
}
