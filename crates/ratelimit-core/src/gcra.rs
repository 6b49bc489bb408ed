//! The arithmetic the two buckets share: a GCRA theoretical arrival time moved by one request.

use crate::Rate;

/// One request of cost `c` seen against a theoretical arrival time `TAT`.
/// Differences are `u128` so that `(burst + 1) * T` and the like never overflow.
pub(crate) struct Gcra {
    /// The emission interval `T`, at least 1.
    pub interval_ns: u128,
    /// `max(TAT - now, 0)`: how far ahead of the clock the key is before this request.
    pub ahead_before_ns: u128,
    /// `max(TAT, now) + c * T - now`: the same after charging the request.
    pub ahead_after_ns: u128,
    /// The new `TAT` to store if the request is charged (never 0).
    pub arrival_ns: u64,
}

impl Gcra {
    /// `now_ns` earlier than `state` (another worker read a later clock) is "no time passed",
    /// which `max(TAT, now)` gives for free.
    pub fn new(state: u64, now_ns: u64, rate: &Rate, cost: u64) -> Gcra {
        let interval_ns = rate.interval_ns().max(1);
        let start = state.max(now_ns);
        let arrival = u128::from(start) + u128::from(cost.max(1)) * u128::from(interval_ns);
        Gcra {
            interval_ns: u128::from(interval_ns),
            ahead_before_ns: u128::from(start - now_ns),
            ahead_after_ns: arrival - u128::from(now_ns),
            arrival_ns: saturate(arrival),
        }
    }

    /// `limit_req`'s excess after charging, in 1/1000 requests: `(TAT' - now) / T - 1`.
    pub fn excess_milli(&self) -> u64 {
        saturate((self.ahead_after_ns.saturating_mul(1000) / self.interval_ns).saturating_sub(1000))
    }
}

/// `u128` to `u64`, saturating.
pub(crate) fn saturate(value: u128) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}
