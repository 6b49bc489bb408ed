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
//! * `reset_ns = a` when charged, `b` when rejected; `retry_after_ns = a - K * T`, or
//!   [`Decision::NEVER_NS`] for a cost above `K`, which no wait lets through.
//!
//! A new `TAT` is at most `now + K * T + τ`, which fits a `u64` for every limit the parsers
//! accept (`K * T` is at most [`crate::Limits::MAX_BUCKET_SPAN_NS`]) until the clock is past
//! `u64::MAX - MAX_BUCKET_SPAN_NS` (about 484 years of uptime). A request whose `TAT` would
//! not fit (a later clock, or limits nothing validated) is rejected, `NEVER_NS`: the bucket
//! that cannot be represented rejects rather than passes.
//!
//! At rates whose interval `T` is under a millisecond, the key is judged `τ = T / 2` less
//! ahead than it is: `b` above is `max(TAT - now - τ, 0)` in every comparison and field but
//! `reset_ns` (which stays the real time until the bucket is empty), while the new `TAT` is
//! still `max(TAT, now) + c * T`. A request may so arrive up to half an interval early. With
//! no burst, a key saturated at such rates is otherwise admitted below its rate: each request
//! becomes allowed at some instant, the next arrival comes a few microseconds later, and
//! `max(TAT, now)` drops that gap (4-6% at 5000r/s on loopback). Forgiving it keeps the
//! schedule, so the admitted rate is the configured one; two requests still pass at least
//! `T / 2` apart, and over any span `L` at most `K + (L + τ) / T`. From 1 ms up `τ = 0` and
//! the arithmetic is limit_req's exactly (a millisecond clock cannot see the difference
//! below that, and limit_req itself admits at most about 1000/s without a burst there).
//!
//! The outcome and the new `TAT` need only products, taken in `u128` so that `K * T` and the
//! like never overflow (one multiplication each). The fields need one division, in `u64`
//! unless `a` is beyond 200 days: `1000 * a = q * T + r` gives the excess (`q`) and
//! `ceil(a / T) = ceil((q + [r > 0]) / 1000)` (a division by a constant), and
//! `ceil(b / T) = ceil(a / T) - c` because `c * T` is a whole number of intervals. For a key
//! that is not ahead of the clock (`b = 0`) not even that one is needed. A caller that reads
//! only the outcome (inlined) computes no field at all.

use std::num::{NonZeroU128, NonZeroU64};

use crate::decision::{Decision, Outcome};
use crate::policy::DelayMode;
use crate::rate::{jitter_tolerance_ns, Rate};

/// Decide one request of `cost` against a bucket of `extra + 1` requests, delayed as `delay`
/// says (the token bucket never delays: `NoDelay`). Returns the decision and, when charged,
/// the new `TAT` (never 0).
///
/// Always inlined: each bucket's `decide` is this with its constants, and a call would return
/// the decision through memory.
#[inline(always)]
pub(crate) fn decide(
    state: u64,
    now_ns: u64,
    rate: &Rate,
    cost: u64,
    extra: u64,
    delay: DelayMode,
) -> (Decision, Option<u64>) {
    // `interval_ns` is at least 1.
    let interval_ns = NonZeroU64::new(rate.interval_ns()).unwrap_or(NonZeroU64::MIN);
    let interval = u128::from(interval_ns.get());
    let cost = cost.max(1);
    // `now_ns` earlier than `state` is no time passed for `start`; but a `now_ns` earlier than
    // the times the state was charged at (another worker read a later clock and charged
    // first) shows the key further ahead than its requests made it: the store decides a
    // refusal again at a reading taken after the state (`ratelimit_slots::decide_at`).
    let start = state.max(now_ns);
    let real_ahead_before_ns = start - now_ns;
    let ahead_before_ns = real_ahead_before_ns.saturating_sub(jitter_tolerance_ns(interval_ns));
    let charge_ns = u128::from(cost) * interval;
    let ahead_after_ns = u128::from(ahead_before_ns) + charge_ns;
    // K * T = (extra + 1) * T, which fits in u128.
    let capacity_ns = u128::from(extra) * interval + interval;
    let bucket = Bucket {
        extra,
        cost,
        interval_ns,
        ahead_before_ns,
        ahead_after_ns,
    };

    // A charged request's `TAT` must fit a `u64`; one that would not is rejected, never
    // stored saturated (a saturated `TAT` would stop moving and let everything through).
    let next = u64::try_from(u128::from(start) + charge_ns).ok();
    if ahead_after_ns > capacity_ns || next.is_none() {
        // `a - K * T <= b` for a cost of at most `K`; beyond `K` no wait is enough, nor when
        // the `TAT` the request would then get does not fit.
        let wait_ns = ahead_after_ns.saturating_sub(capacity_ns);
        let never = cost - 1 > extra
            || next.is_none()
            || u128::from(now_ns) + wait_ns + charge_ns > u128::from(u64::MAX);
        let retry_after_ns = if never {
            Decision::NEVER_NS
        } else {
            saturate(wait_ns)
        };
        let (remaining, excess_milli) = bucket.rejected_fields();
        let decision = Decision {
            remaining,
            ..Decision::rejected(retry_after_ns, real_ahead_before_ns, excess_milli)
        };
        return (decision, None);
    }

    let delay_ns = match delay {
        DelayMode::NoDelay => 0,
        DelayMode::Delay => ahead_after_ns.saturating_sub(interval),
        DelayMode::Threshold(excess) => {
            ahead_after_ns.saturating_sub((u128::from(excess) + 1) * interval)
        }
    };
    let (remaining, excess_milli) = bucket.charged_fields();
    let decision = Decision {
        outcome: if delay_ns > 0 {
            Outcome::Delayed
        } else {
            Outcome::Passed
        },
        delay_ns: saturate(delay_ns),
        retry_after_ns: 0,
        remaining,
        reset_ns: saturate(u128::from(real_ahead_before_ns) + charge_ns),
        excess_milli,
    };
    (decision, next)
}

/// Largest `a` for which `1000 * a + 1000` fits in u64 (about 213 days).
const MAX_NARROW_AHEAD_NS: u128 = (u64::MAX / 1000 - 1) as u128;

/// What the fields are computed from.
struct Bucket {
    /// `K - 1`
    extra: u64,
    cost: u64,
    interval_ns: NonZeroU64,
    /// `b`
    ahead_before_ns: u64,
    /// `a`
    ahead_after_ns: u128,
}

impl Bucket {
    /// `remaining` and `excess_milli` of a charged request: `K - ceil(a / T)`, which is
    /// `extra - (ceil(a / T) - 1)` since `1 <= ceil(a / T) <= K`.
    #[inline(always)]
    fn charged_fields(&self) -> (u64, u64) {
        match self.narrow_quotients() {
            Some((after_milli, after_intervals)) => (
                self.extra - (after_intervals - 1),
                after_milli.saturating_sub(1000),
            ),
            None => self.wide_fields(false),
        }
    }

    /// `remaining` and `excess_milli` of a rejected request: `max(K - ceil(b / T), 0)`.
    #[inline(always)]
    fn rejected_fields(&self) -> (u64, u64) {
        match self.narrow_quotients() {
            Some((after_milli, after_intervals)) => {
                let before_intervals = after_intervals - self.cost;
                let remaining = match before_intervals.checked_sub(1) {
                    Some(beyond_first) => self.extra.saturating_sub(beyond_first),
                    None => self.extra.saturating_add(1),
                };
                (remaining, after_milli.saturating_sub(1000))
            }
            None => self.wide_fields(true),
        }
    }

    /// `(floor(1000 * a / T), ceil(a / T))` in u64, `None` for an `a` beyond
    /// `MAX_NARROW_AHEAD_NS`.
    #[inline(always)]
    fn narrow_quotients(&self) -> Option<(u64, u64)> {
        if self.ahead_before_ns == 0 {
            // `a = c * T`: whole intervals.
            return self.cost.checked_mul(1000).map(|milli| (milli, self.cost));
        }
        if self.ahead_after_ns > MAX_NARROW_AHEAD_NS {
            return None;
        }
        let scaled = self.ahead_after_ns as u64 * 1000;
        let (milli, leftover) = (scaled / self.interval_ns, scaled % self.interval_ns);
        // ceil(a / T) = ceil(1000 * a / T / 1000), the inner division rounded up. Not
        // `div_ceil`, which spends a remainder and a comparison where this adds 999 (no
        // overflow below MAX_NARROW_AHEAD_NS).
        let milli_up = milli + u64::from(leftover != 0);
        #[allow(clippy::manual_div_ceil)]
        let intervals = (milli_up + 999) / 1000;
        Some((milli, intervals))
    }

    /// `remaining` and `excess_milli` in u128, for an `a` beyond 200 days or a huge cost:
    /// `1000 * a` saturated to `u128::MAX`, as limit_req's excess always was.
    #[cold]
    #[inline(never)]
    fn wide_fields(&self, rejected: bool) -> (u64, u64) {
        let interval = NonZeroU128::from(self.interval_ns);
        let capacity = u128::from(self.extra) + 1;
        let after_intervals = self.ahead_after_ns.div_ceil(interval.get());
        let remaining = if rejected {
            capacity.saturating_sub(after_intervals - u128::from(self.cost))
        } else {
            capacity - after_intervals
        };
        let excess_milli =
            (self.ahead_after_ns.saturating_mul(1000) / interval).saturating_sub(1000);
        (saturate(remaining), saturate(excess_milli))
    }
}

/// `u128` to `u64`, saturating.
#[inline]
pub(crate) fn saturate(value: u128) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}
