//! Sliding window counter: at most about N requests per sliding window of one rate unit, in a
//! single `u64` per key.
//!
//! Windows of `W = rate.window_ns()` are fixed and aligned at multiples of `W` on the caller's
//! clock; window `i` is `[i * W, (i + 1) * W)`. The key counts the requests charged in the
//! current window (`cur`) and in the one before (`prev`), and estimates the requests in the
//! last `W` nanoseconds by assuming the previous window's were spread evenly:
//! `n = prev * (W - (now mod W)) / W + cur`. A request of cost `c` passes iff `n + c <= N`,
//! decided exactly in integers (`prev * (W - r) + (cur + c) * W <= N * W`).
//!
//! Bound: in any half-open interval of length `W`, at most `2N` requests pass. The interval
//! overlaps at most two aligned windows and each window's `cur` never exceeds `N`
//! (`cur <= n` and `n + c <= N` before every charge). `N` per aligned window is also exact.
//!
//! # State layout
//!
//! Bits 40..64 hold the window index modulo 2^24, bits 20..40 `prev`, bits 0..20 `cur`.
//! 0 is a fresh key (and any state whose counts are both zero behaves like one).
//!
//! The index is compared with the current one modulo 2^24:
//! * same window: counts as stored;
//! * one behind: the stored `cur` becomes `prev`, `cur` is 0;
//! * ahead by at most [`AHEAD_TOLERANCE`] windows (another worker read a slightly later clock,
//!   or crossed a window boundary first): the stored window is kept and the request is
//!   counted in it, as if at its very start (so `prev` counts in full: conservative);
//! * anything else (two or more behind): both counts are 0.
//!
//! A key idle for a multiple of 2^24 windows (194 days at `r/s`) minus at most
//! `AHEAD_TOLERANCE` windows is read as recent: it is then over-restricted for at most
//! `AHEAD_TOLERANCE + 1` windows. Callers that evict idle keys never see this;
//! [`idle_at_ns_near`] tells them when.

use std::num::{NonZeroU128, NonZeroU64};

use crate::decision::{Decision, Outcome};
use crate::policy::{Limits, Policy};
use crate::rate::Rate;

const INDEX_BITS: u32 = 24;
const COUNT_BITS: u32 = 20;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;

/// How many windows a stored index may be ahead of the current one and still be read as the
/// same key's recent state rather than a stale one.
pub const AHEAD_TOLERANCE: u64 = 2;

/// The requests per window, `N`: the rate's whole number of requests per unit (rounded down),
/// at most [`crate::ZoneSpec::MAX_SLIDING_WINDOW_REQUESTS`].
#[inline]
pub fn window_limit(rate: &Rate) -> u64 {
    (rate.milli_requests / 1000).min(COUNT_MASK)
}

/// A state read at `now`: the window it counts in and how far into it `now` is.
struct View {
    /// Absolute index of the window the counts belong to (as seen from `now`).
    window: u64,
    prev: u64,
    cur: u64,
    /// Time from `now` until that window starts (non-zero only for a window ahead of `now`).
    lead_ns: u64,
    /// How far into that window the decision is taken (0 for a window ahead of `now`).
    offset_ns: u64,
}

#[inline]
fn view(state: u64, now_ns: u64, window_ns: u64) -> View {
    let now_window = now_ns / window_ns;
    let offset_ns = now_ns % window_ns;
    let stored_prev = (state >> COUNT_BITS) & COUNT_MASK;
    let stored_cur = state & COUNT_MASK;
    let behind = now_window.wrapping_sub(state >> (2 * COUNT_BITS)) & INDEX_MASK;
    let ahead = (INDEX_MASK + 1 - behind) & INDEX_MASK;
    let here = |prev, cur| View {
        window: now_window,
        prev,
        cur,
        lead_ns: 0,
        offset_ns,
    };

    if stored_prev == 0 && stored_cur == 0 {
        here(0, 0)
    } else if behind == 0 {
        here(stored_prev, stored_cur)
    } else if behind == 1 {
        here(stored_cur, 0)
    } else if ahead <= AHEAD_TOLERANCE {
        View {
            window: now_window.saturating_add(ahead),
            prev: stored_prev,
            cur: stored_cur,
            lead_ns: (ahead * window_ns).saturating_sub(offset_ns),
            offset_ns: 0,
        }
    } else {
        here(0, 0)
    }
}

#[inline]
fn pack(window: u64, prev: u64, cur: u64) -> u64 {
    ((window & INDEX_MASK) << (2 * COUNT_BITS))
        | ((prev & COUNT_MASK) << COUNT_BITS)
        | (cur & COUNT_MASK)
}

/// `state` with `policy.cost` requests given back at `now_ns`: taken from the current
/// window's count first (where a request charged just now went), then from the previous one.
pub fn uncommit(state: u64, now_ns: u64, policy: &Policy) -> u64 {
    let window_ns = policy.limits.rate.window_ns().max(1);
    let view = view(state, now_ns, window_ns);
    let from_cur = policy.cost.min(view.cur);
    let from_prev = (policy.cost - from_cur).min(view.prev);
    if view.prev - from_prev == 0 && view.cur - from_cur == 0 {
        return 0;
    }
    pack(view.window, view.prev - from_prev, view.cur - from_cur)
}

/// Decide one request; `state` 0 is a fresh key. See [`crate::decide_word`].
///
/// `remaining` is `floor(N - n)` after the charge; `reset_ns` the time until the state is
/// equivalent to a fresh key (the end of the window after the one holding the last charge);
/// `excess_milli` is how far `n + c` exceeds `N`, in 1/1000 requests (0 when passed).
/// A request costing more than `N` never passes: its `retry_after_ns` is
/// [`Decision::NEVER_NS`].
// Always inlined, so that a caller reading only the outcome and the new state computes no
// other field (their divisions are dead code once inlined).
#[inline(always)]
pub fn decide(state: u64, now_ns: u64, policy: &Policy) -> (Decision, Option<u64>) {
    let window_ns = policy.limits.rate.window_ns().max(1);
    let limit = window_limit(&policy.limits.rate);
    let cost = policy.cost.max(1);
    let view = view(state, now_ns, window_ns);

    // Everything is scaled by W so that `n` is an exact integer: in u128, where products
    // cost one multiplication and never overflow. The outcome needs nothing else; the fields
    // divide, in u64 unless a huge cost makes the numbers too large.
    let w = u128::from(window_ns);
    let limit_scaled = u128::from(limit) * w;
    let estimate_scaled =
        u128::from(view.prev) * u128::from(window_ns - view.offset_ns) + u128::from(view.cur) * w;
    let after_scaled = estimate_scaled + u128::from(cost) * w;

    if after_scaled > limit_scaled {
        // floor(1000 * x / W) = floor(x / (W / 1000)): every window is a whole number of
        // microseconds.
        let excess_milli = quotient(after_scaled - limit_scaled, window_ns / 1000);
        let retry_after_ns = if cost > limit {
            Decision::NEVER_NS
        } else {
            retry_after_ns(&view, window_ns, limit - cost)
        };
        let decision = Decision {
            remaining: whole_windows(limit_scaled.saturating_sub(estimate_scaled), window_ns),
            ..Decision::rejected(
                retry_after_ns,
                reset_ns(&view, window_ns, view.cur),
                excess_milli,
            )
        };
        return (decision, None);
    }

    // `cur + cost <= limit`: no overflow.
    let cur = view.cur + cost;
    let decision = Decision {
        outcome: Outcome::Passed,
        delay_ns: 0,
        retry_after_ns: 0,
        remaining: quotient(limit_scaled - after_scaled, window_ns),
        reset_ns: reset_ns(&view, window_ns, cur),
        excess_milli: 0,
    };
    (decision, Some(pack(view.window, view.prev, cur)))
}

/// `floor(numerator / denominator)` saturated to u64, dividing in u64 when the numerator fits
/// (a `u128` division is a call to a helper that takes tens of instructions).
#[inline(always)]
fn quotient(numerator: u128, denominator: u64) -> u64 {
    let denominator = NonZeroU64::new(denominator).unwrap_or(NonZeroU64::MIN);
    match u64::try_from(numerator) {
        Ok(numerator) => numerator / denominator,
        Err(_) => quotient_wide(numerator, denominator),
    }
}

#[cold]
#[inline(never)]
fn quotient_wide(numerator: u128, denominator: NonZeroU64) -> u64 {
    saturate(numerator / NonZeroU128::from(denominator))
}

/// `floor(scaled / W)`, without dividing when it is 0: the room a rejected request of cost 1
/// leaves is always less than a request.
#[inline(always)]
fn whole_windows(scaled: u128, window_ns: u64) -> u64 {
    if scaled < u128::from(window_ns) {
        0
    } else {
        quotient(scaled, window_ns)
    }
}

/// The earliest wait after which `n + c <= N` holds, given `allowed = N - c` and no other
/// request in between: later in this window (`prev` decays), or in the next one (the
/// current count becomes `prev` and decays), or at the latest two windows on (all zero).
/// At most `4 W`: no overflow.
#[inline]
fn retry_after_ns(view: &View, window_ns: u64, allowed: u64) -> u64 {
    let offset = view.offset_ns;
    let wait = match earliest_offset(view.prev, view.cur, allowed, window_ns) {
        Some(x) if x.max(offset) < window_ns => x.max(offset) - offset,
        _ => {
            let next = earliest_offset(view.cur, 0, allowed, window_ns).unwrap_or(window_ns);
            (window_ns - offset) + next
        }
    };
    view.lead_ns + wait
}

/// Earliest offset `x` in a window with counts `(prev, cur)` such that
/// `prev * (W - x) + cur * W <= allowed * W`, or `None` if no offset in the window does.
#[inline]
fn earliest_offset(prev: u64, cur: u64, allowed: u64, window_ns: u64) -> Option<u64> {
    let budget = allowed.checked_sub(cur)?;
    let span = match NonZeroU64::new(prev) {
        None => window_ns,
        Some(prev) => {
            quotient(u128::from(budget) * u128::from(window_ns), prev.get()).min(window_ns)
        }
    };
    Some(window_ns - span)
}

/// Time until a view holding `cur` in its window is equivalent to a fresh key.
#[inline]
fn reset_ns(view: &View, window_ns: u64, cur: u64) -> u64 {
    let windows = if cur > 0 {
        2
    } else if view.prev > 0 {
        1
    } else {
        return 0;
    };
    (windows * window_ns)
        .saturating_sub(view.offset_ns)
        .saturating_add(view.lead_ns)
}

fn saturate(value: u128) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}

/// The earliest time at which `state` is equivalent to a fresh key.
///
/// The state keeps its window index modulo 2^24 only, so without the current time the
/// absolute window is unknown: this returns 0 for a state with no counts (already
/// equivalent to fresh) and `u64::MAX` ("not known to become idle") otherwise, which never
/// lets a caller reuse a slot too early. Use [`idle_at_ns_near`] when the time is at hand.
pub fn idle_at_ns(state: u64, limits: &Limits) -> u64 {
    let _ = limits;
    if state & ((COUNT_MASK << COUNT_BITS) | COUNT_MASK) == 0 {
        0
    } else {
        u64::MAX
    }
}

/// The earliest time at which `state` is equivalent to a fresh key, reading its window index
/// relative to `now_ns` the way [`decide`] does (a result `<= now_ns` means "idle already").
#[inline]
pub fn idle_at_ns_near(state: u64, limits: &Limits, now_ns: u64) -> u64 {
    let window_ns = limits.rate.window_ns().max(1);
    let now_window = now_ns / window_ns;
    let stored_prev = (state >> COUNT_BITS) & COUNT_MASK;
    let stored_cur = state & COUNT_MASK;
    let behind = now_window.wrapping_sub(state >> (2 * COUNT_BITS)) & INDEX_MASK;
    let ahead = (INDEX_MASK + 1 - behind) & INDEX_MASK;
    let window = if ahead != 0 && ahead <= AHEAD_TOLERANCE {
        now_window.saturating_add(ahead)
    } else {
        now_window.saturating_sub(behind)
    };
    let windows_after = if stored_cur > 0 {
        2
    } else if stored_prev > 0 {
        1
    } else {
        return 0;
    };
    window
        .saturating_add(windows_after)
        .saturating_mul(window_ns)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Algorithm, DelayMode};
    use crate::rate::RateUnit;
    use Outcome::{Passed as P, Rejected as R};

    const MS: u64 = 1_000_000;

    fn policy(per_second: u64, cost: u64) -> Policy {
        Policy {
            algorithm: Algorithm::SlidingWindow,
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

    /// 4 requests per 1 s. Rows `(now_ms, cost, outcome, remaining, retry_after_ns, reset_ms)`,
    /// computed by hand with `n = prev * (1000 - now mod 1000) / 1000 + cur`.
    #[test]
    fn four_per_second() {
        #[rustfmt::skip]
        let rows: &[(u64, u64, Outcome, u64, u64, u64)] = &[
            (0,    1, P, 3, 0,           2000),
            (100,  2, P, 1, 0,           1900),
            (200,  1, P, 0, 0,           1800),
            (300,  1, R, 0, 950 * MS,    1700), // prev 4 must decay to 3: at 1250
            (900,  1, R, 0, 350 * MS,    1100),
            (1000, 1, R, 0, 250 * MS,    1000), // n = 4 * 1000/1000
            (1250, 1, P, 0, 0,           1750), // n = 4 * 750/1000 = 3
            (1500, 1, P, 0, 0,           1500), // n = 2 + 1
            (1500, 1, R, 0, 250 * MS,    1500),
            (1750, 1, P, 0, 0,           1250), // n = 1 + 2
            (1800, 2, R, 0, 533_333_334, 1200), // next window: 3 * (1 - x) + 2 <= 4, x >= 1/3
            (2000, 1, P, 0, 0,           2000), // n = 3 + 0
            (2100, 1, R, 0, 233_333_334, 1900), // 3 * 0.9 + 1 = 3.7
            (2500, 3, R, 1, 500 * MS,    1500), // 1.5 + 1: needs prev gone, at 3000
            (2600, 1, P, 0, 0,           1400), // 1.2 + 1 + 1
            (3100, 1, P, 1, 0,           1900), // 1.8 + 0 + 1
            (3500, 5, R, 2, Decision::NEVER_NS, 1500), // more than 4: never
            (5000, 4, P, 0, 0,           2000), // two windows later: fresh
            (5000, 1, R, 0, 1250 * MS,   2000),
            (5999, 1, R, 0, 251 * MS,    1001),
        ];
        let mut state = 0;
        for (i, &(now_ms, cost, outcome, remaining, retry_ns, reset_ms)) in rows.iter().enumerate()
        {
            let (decision, new_state) = decide(state, now_ms * MS, &policy(4, cost));
            let row = (
                decision.outcome,
                decision.remaining,
                decision.retry_after_ns,
                decision.reset_ns,
            );
            assert_eq!(
                row,
                (outcome, remaining, retry_ns, reset_ms * MS),
                "row {i}"
            );
            assert_eq!(new_state.is_some(), outcome == P, "row {i}");
            state = new_state.unwrap_or(state);
        }
        let limits = policy(4, 1).limits;
        assert_eq!(idle_at_ns(state, &limits), u64::MAX);
        assert_eq!(idle_at_ns_near(state, &limits, 5999 * MS), 7000 * MS);
        assert_eq!(idle_at_ns_near(state, &limits, 9000 * MS), 7000 * MS);
        assert_eq!(idle_at_ns(0, &limits), 0);
    }

    /// `decide` divides by `W / 1000` for `floor(1000 * P / W)`.
    #[test]
    fn windows_are_whole_microseconds() {
        for unit in [
            RateUnit::Second,
            RateUnit::Minute,
            RateUnit::Hour,
            RateUnit::Day,
        ] {
            assert_eq!(unit.nanos() % 1000, 0);
        }
    }

    #[test]
    fn a_window_ahead_counts_in_full() {
        let policy = policy(2, 1);
        // Another worker charged two requests at 2.0 s; this one reads 1.9 s.
        let (_, state) = decide(0, 2000 * MS, &policy);
        let (_, state) = decide(state.unwrap(), 2000 * MS, &policy);
        let (early, _) = decide(state.unwrap(), 1900 * MS, &policy);
        // Counted in window 2 from its start (100 ms away): prev = 2 at 3.0 s decays to 1 by 3.5 s.
        assert_eq!((early.outcome, early.retry_after_ns), (R, 1600 * MS));
        assert_eq!(early.reset_ns, 2100 * MS);
        assert_eq!(
            idle_at_ns_near(state.unwrap(), &policy.limits, 1900 * MS),
            4000 * MS
        );
    }

    #[test]
    fn the_window_index_wraps() {
        let policy = policy(1, 1);
        let window = 1000 * MS;
        let last = (INDEX_MASK) * window;
        let (_, state) = decide(0, last, &policy);
        let state = state.unwrap();
        assert_eq!(decide(state, last + 1, &policy).0.outcome, R);
        // The next window (index 2^24, stored as 0) sees it one behind: prev = 1 decays to 0 only
        // at the end of that window.
        let (next, _) = decide(state, last + window, &policy);
        assert_eq!((next.outcome, next.retry_after_ns), (R, window));
        assert_eq!(decide(state, last + 2 * window, &policy).0.outcome, P);
        // Two windows behind across the wrap: fresh.
        assert_eq!(
            idle_at_ns_near(state, &policy.limits, last + 2 * window),
            last + 2 * window
        );
    }
}
