//! The arithmetic the two buckets share: a GCRA theoretical arrival time (`TAT`) moved by one
//! request of cost `c`, against a bucket of `K` requests with emission interval `T`.
//!
//! With `b = max(TAT - now, 0)` (how far ahead of the clock the key is) and `a = b + c * T`
//! (the same after charging), the request is rejected when `a > K * T`; otherwise it is
//! charged, delayed by `a - (d + 1) * T` when that is positive (leaky bucket with a delay
//! threshold `d`), and the new `TAT` is `now + a`. The reported fields are
//!
//! * `excess_milli = floor(1000 * a / T) - 1000` (limit_req's excess, saturating at 0),
//! * `remaining = K - ceil(a / T)` when charged, `max(K - ceil(b / T), 0)` when rejected,
//! * `reset_ns = a` when charged, `b` when rejected; `retry_after_ns = a - K * T`.
//!
//! All of them come from one division: `1000 * a = q * T + r` gives the excess (`q`) and
//! `ceil(a / T) = ceil((q + [r > 0]) / 1000)` (a division by a constant), and
//! `ceil(b / T) = ceil(a / T) - c` because `c * T` is a whole number of intervals. For a key
//! that is not ahead of the clock (`b = 0`) not even that one is needed.
//!
//! Everything is `u64`; when a quantity does not fit (rates slower than about one request in
//! 200 days, huge costs or bursts, clocks near `u64::MAX`), the same decision is taken with
//! `u128` arithmetic instead.

use crate::{Decision, DelayMode, Outcome, Rate};

/// Decide one request of `cost` against a bucket of `capacity` requests (`None`: more than
/// `u64::MAX`), delayed as `delay` says (the token bucket never delays: `NoDelay`).
/// Returns the decision and, when charged, the new `TAT` (never 0).
///
/// Always inlined: each bucket's `decide` is this with its constants, and a call would return
/// the decision through memory.
#[inline(always)]
pub(crate) fn decide(
    state: u64,
    now_ns: u64,
    rate: &Rate,
    cost: u64,
    capacity: Option<u64>,
    delay: DelayMode,
) -> (Decision, Option<u64>) {
    let interval_ns = rate.interval_ns();
    let Some(charge) = Charge::new(state, now_ns, interval_ns, cost, capacity) else {
        return decide_wide(state, now_ns, interval_ns, cost, capacity, delay);
    };
    let excess_milli = charge.after_milli.saturating_sub(1000);

    if charge.ahead_after_ns > charge.capacity_ns {
        let decision = Decision {
            remaining: charge
                .capacity
                .saturating_sub(charge.after_intervals - charge.cost),
            ..Decision::rejected(
                charge.ahead_after_ns - charge.capacity_ns,
                charge.ahead_before_ns,
                excess_milli,
            )
        };
        return (decision, None);
    }

    let delay_ns = match delay {
        DelayMode::NoDelay => 0,
        DelayMode::Delay => charge.ahead_after_ns.saturating_sub(interval_ns),
        DelayMode::Threshold(excess) => match excess
            .checked_add(1)
            .and_then(|excess| excess.checked_mul(interval_ns))
        {
            Some(threshold_ns) => charge.ahead_after_ns.saturating_sub(threshold_ns),
            // The threshold is beyond any `a` that fits in u64.
            None => 0,
        },
    };
    let decision = Decision {
        outcome: if delay_ns > 0 {
            Outcome::Delayed
        } else {
            Outcome::Passed
        },
        delay_ns,
        retry_after_ns: 0,
        remaining: charge.capacity - charge.after_intervals,
        reset_ns: charge.ahead_after_ns,
        excess_milli,
    };
    (decision, Some(charge.arrival_ns))
}

/// Largest `a` for which `1000 * a + 1000` fits in u64.
const MAX_AHEAD_NS: u64 = u64::MAX / 1000 - 1;

/// The quantities of one request, all in u64.
struct Charge {
    cost: u64,
    capacity: u64,
    /// `K * T`
    capacity_ns: u64,
    /// `b`
    ahead_before_ns: u64,
    /// `a`
    ahead_after_ns: u64,
    /// `now + a`
    arrival_ns: u64,
    /// `floor(1000 * a / T)`
    after_milli: u64,
    /// `ceil(a / T)`
    after_intervals: u64,
}

impl Charge {
    /// `None` when a quantity would not fit in u64.
    #[inline(always)]
    fn new(
        state: u64,
        now_ns: u64,
        interval_ns: u64,
        cost: u64,
        capacity: Option<u64>,
    ) -> Option<Charge> {
        let cost = cost.max(1);
        let capacity = capacity?;
        let capacity_ns = capacity.checked_mul(interval_ns)?;
        // `now_ns` earlier than `state` (another worker read a later clock) is "no time
        // passed", which `max(TAT, now)` gives for free.
        let start = state.max(now_ns);
        let arrival_ns = start.checked_add(cost.checked_mul(interval_ns)?)?;
        let ahead_before_ns = start - now_ns;
        let ahead_after_ns = arrival_ns - now_ns;
        if ahead_after_ns > MAX_AHEAD_NS {
            return None;
        }
        let (after_milli, after_intervals) = if ahead_before_ns == 0 {
            // `a = c * T`: whole intervals.
            (cost * 1000, cost)
        } else {
            let scaled = ahead_after_ns * 1000;
            let (milli, leftover) = (scaled / interval_ns, scaled % interval_ns);
            // ceil(a / T) = ceil(1000 * a / T / 1000), the inner division rounded up. Not
            // `div_ceil`, which spends a remainder and a comparison where this adds 999
            // (cannot overflow: `a <= MAX_AHEAD_NS`).
            let milli_up = milli + u64::from(leftover != 0);
            #[allow(clippy::manual_div_ceil)]
            let intervals = (milli_up + 999) / 1000;
            (milli, intervals)
        };
        Some(Charge {
            cost,
            capacity,
            capacity_ns,
            ahead_before_ns,
            ahead_after_ns,
            arrival_ns,
            after_milli,
            after_intervals,
        })
    }
}

/// [`decide`] in `u128`, where `(K + 1) * T` and the like never overflow.
#[cold]
#[inline(never)]
fn decide_wide(
    state: u64,
    now_ns: u64,
    interval_ns: u64,
    cost: u64,
    capacity: Option<u64>,
    delay: DelayMode,
) -> (Decision, Option<u64>) {
    // `None` is one more than `u64::MAX`: leaky bucket's `burst + 1`.
    let capacity = capacity.map_or(u128::from(u64::MAX) + 1, u128::from);
    let interval_ns = u128::from(interval_ns.max(1));
    // `now_ns` earlier than `state` (another worker read a later clock) is "no time passed",
    // which `max(TAT, now)` gives for free.
    let start = state.max(now_ns);
    let arrival = u128::from(start) + u128::from(cost.max(1)) * interval_ns;
    let ahead_before_ns = u128::from(start - now_ns);
    let ahead_after_ns = arrival - u128::from(now_ns);
    let excess_milli =
        saturate((ahead_after_ns.saturating_mul(1000) / interval_ns).saturating_sub(1000));
    let capacity_ns = capacity * interval_ns;

    if ahead_after_ns > capacity_ns {
        let decision = Decision {
            remaining: saturate(capacity_ns.saturating_sub(ahead_before_ns) / interval_ns),
            ..Decision::rejected(
                saturate(ahead_after_ns - capacity_ns),
                saturate(ahead_before_ns),
                excess_milli,
            )
        };
        return (decision, None);
    }

    let delay_threshold = match delay {
        DelayMode::Delay => Some(0),
        DelayMode::NoDelay => None,
        DelayMode::Threshold(delay) => Some(u128::from(delay)),
    };
    let delay_ns = match delay_threshold {
        Some(delay) => ahead_after_ns.saturating_sub((delay + 1) * interval_ns),
        None => 0,
    };
    let decision = Decision {
        outcome: if delay_ns > 0 {
            Outcome::Delayed
        } else {
            Outcome::Passed
        },
        delay_ns: saturate(delay_ns),
        retry_after_ns: 0,
        remaining: saturate((capacity_ns - ahead_after_ns) / interval_ns),
        reset_ns: saturate(ahead_after_ns),
        excess_milli,
    };
    (decision, Some(saturate(arrival)))
}

/// `u128` to `u64`, saturating.
#[inline]
pub(crate) fn saturate(value: u128) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}
