//! The algorithms as they were before they were rewritten for fewer instructions (u64
//! arithmetic with a u128 fallback, an O(1) sliding log), kept verbatim apart from paths, so
//! that the proptests in `equivalence` can check that every decision, state and log is still
//! exactly the same. Test-only: nothing here is compiled into the library.
//!
//! Changed since, on both sides: a request that can never pass reports
//! `Decision::NEVER_NS` as its `retry_after_ns` (it was `W`, or the wait for a bucket that
//! large), a bucket whose new `TAT` would not fit a `u64` rejects (it saturated and passed),
//! a rescaled backlog stops at `Limits::MAX_BUCKET_SPAN_NS`, and a log entry whose expiry is
//! past `u64::MAX` keeps counting (it expired at once).

#![allow(dead_code)]

use crate::decision::Decision;
use crate::policy::{Algorithm, Limits, Policy};
use crate::rate::Rate;

/// `Rate::interval_ns` as it was (one u128 division), rounded up as it is now.
pub fn interval_ns(rate: &Rate) -> u64 {
    let milli = u128::from(rate.milli_requests.max(1));
    let numerator = u128::from(rate.unit.nanos()) * 1000;
    let rounded = numerator.div_ceil(milli);
    u64::try_from(rounded).unwrap_or(u64::MAX).max(1)
}

pub fn decide_word(state: u64, now_ns: u64, policy: &Policy) -> (Decision, Option<u64>) {
    match policy.algorithm {
        Algorithm::LeakyBucket => leaky_bucket::decide(state, now_ns, policy),
        Algorithm::TokenBucket => token_bucket::decide(state, now_ns, policy),
        Algorithm::SlidingWindow => sliding_window::decide(state, now_ns, policy),
        Algorithm::SlidingLog | Algorithm::Concurrency | Algorithm::Quota(_) => {
            (Decision::rejected(0, 0, 0), None)
        }
    }
}

pub fn word_idle_at_ns(state: u64, limits: &Limits, algorithm: Algorithm) -> u64 {
    match algorithm {
        Algorithm::LeakyBucket => leaky_bucket::idle_at_ns(state, limits),
        Algorithm::TokenBucket => token_bucket::idle_at_ns(state, limits),
        Algorithm::SlidingWindow => sliding_window::idle_at_ns(state, limits),
        Algorithm::SlidingLog | Algorithm::Concurrency | Algorithm::Quota(_) => 0,
    }
}

pub fn word_idle_at_ns_near(state: u64, limits: &Limits, algorithm: Algorithm, now_ns: u64) -> u64 {
    match algorithm {
        Algorithm::SlidingWindow => sliding_window::idle_at_ns_near(state, limits, now_ns),
        other => word_idle_at_ns(state, limits, other),
    }
}

const STANDING_COST: u64 = u32::MAX as u64;

pub fn standing_policy(policy: &Policy) -> Policy {
    Policy {
        cost: STANDING_COST,
        ..*policy
    }
}

pub fn rescale_word(state: u64, now_ns: u64, algorithm: Algorithm, old: &Rate, new: &Rate) -> u64 {
    match algorithm {
        Algorithm::LeakyBucket | Algorithm::TokenBucket if state > now_ns => {
            let ahead = u128::from(state - now_ns);
            let scaled =
                ahead * u128::from(interval_ns(new).max(1)) / u128::from(interval_ns(old).max(1));
            let scaled = u64::try_from(scaled).unwrap_or(u64::MAX);
            now_ns.saturating_add(scaled.clamp(1, Limits::MAX_BUCKET_SPAN_NS))
        }
        _ => state,
    }
}

pub mod gcra {
    use crate::rate::Rate;

    /// One request of cost `c` seen against a theoretical arrival time `TAT`.
    /// Differences are `u128` so that `(burst + 1) * T` and the like never overflow.
    pub(crate) struct Gcra {
        /// The emission interval `T`, at least 1.
        pub interval_ns: u128,
        /// `max(TAT - now, 0)`: how far ahead of the clock the key is before this request.
        pub ahead_before_ns: u128,
        /// `max(TAT, now) + c * T - now`: the same after charging the request.
        pub ahead_after_ns: u128,
        /// The new `TAT` to store if the request is charged (never 0); `None` when it does not
        /// fit a `u64` (the request is then rejected).
        pub arrival_ns: Option<u64>,
    }

    impl Gcra {
        /// `now_ns` earlier than `state` (another worker read a later clock) is "no time passed",
        /// which `max(TAT, now)` gives for free.
        pub fn new(state: u64, now_ns: u64, rate: &Rate, cost: u64) -> Gcra {
            let interval_ns = super::interval_ns(rate).max(1);
            let start = state.max(now_ns);
            let arrival = u128::from(start) + u128::from(cost.max(1)) * u128::from(interval_ns);
            Gcra {
                interval_ns: u128::from(interval_ns),
                ahead_before_ns: u128::from(start - now_ns),
                ahead_after_ns: arrival - u128::from(now_ns),
                arrival_ns: u64::try_from(arrival).ok(),
            }
        }

        /// `limit_req`'s excess after charging, in 1/1000 requests: `(TAT' - now) / T - 1`.
        pub fn excess_milli(&self) -> u64 {
            saturate(
                (self.ahead_after_ns.saturating_mul(1000) / self.interval_ns).saturating_sub(1000),
            )
        }
    }

    /// Whether the `TAT` a rejected request would get when it could pass does not fit a
    /// `u64`.
    pub(crate) fn passes_too_late(now_ns: u64, gcra: &Gcra, capacity_ns: u128) -> bool {
        let passes_at = u128::from(now_ns) + gcra.ahead_after_ns.saturating_sub(capacity_ns);
        let charge_ns = gcra.ahead_after_ns - gcra.ahead_before_ns;
        passes_at + charge_ns > u128::from(u64::MAX)
    }

    /// `u128` to `u64`, saturating.
    pub(crate) fn saturate(value: u128) -> u64 {
        u64::try_from(value).unwrap_or(u64::MAX)
    }
}

pub mod leaky_bucket {

    use super::gcra::{self, Gcra};
    use crate::decision::{Decision, Outcome};
    use crate::policy::{DelayMode, Limits, Policy};

    /// Decide one request; `state` 0 is a fresh key. See [`crate::decide_word`].
    pub fn decide(state: u64, now_ns: u64, policy: &Policy) -> (Decision, Option<u64>) {
        let burst = u128::from(policy.limits.burst);
        let gcra = Gcra::new(state, now_ns, &policy.limits.rate, policy.cost);
        // A cost-1 request passes while `TAT - now <= burst * T` before charging.
        let capacity_ns = (burst + 1) * gcra.interval_ns;

        if gcra.ahead_after_ns > capacity_ns || gcra.arrival_ns.is_none() {
            let never = u128::from(policy.cost.max(1)) > burst + 1
                || gcra.arrival_ns.is_none()
                || gcra::passes_too_late(now_ns, &gcra, capacity_ns);
            let decision = Decision {
                remaining: gcra::saturate(
                    capacity_ns.saturating_sub(gcra.ahead_before_ns) / gcra.interval_ns,
                ),
                ..Decision::rejected(
                    if never {
                        Decision::NEVER_NS
                    } else {
                        gcra::saturate(gcra.ahead_after_ns - capacity_ns)
                    },
                    gcra::saturate(gcra.ahead_before_ns),
                    gcra.excess_milli(),
                )
            };
            return (decision, None);
        }

        let delay_threshold = match policy.delay {
            DelayMode::Delay => Some(0),
            DelayMode::NoDelay => None,
            DelayMode::Threshold(delay) => Some(u128::from(delay)),
        };
        let delay_ns = match delay_threshold {
            Some(delay) => gcra
                .ahead_after_ns
                .saturating_sub((delay + 1) * gcra.interval_ns),
            None => 0,
        };
        let decision = Decision {
            outcome: if delay_ns > 0 {
                Outcome::Delayed
            } else {
                Outcome::Passed
            },
            delay_ns: gcra::saturate(delay_ns),
            retry_after_ns: 0,
            remaining: gcra::saturate((capacity_ns - gcra.ahead_after_ns) / gcra.interval_ns),
            reset_ns: gcra::saturate(gcra.ahead_after_ns),
            excess_milli: gcra.excess_milli(),
        };
        (decision, gcra.arrival_ns)
    }

    /// The earliest time at which `state` is equivalent to a fresh key: its `TAT`, when the
    /// bucket is empty.
    pub fn idle_at_ns(state: u64, limits: &Limits) -> u64 {
        let _ = limits;
        state
    }
}

pub mod token_bucket {

    use super::gcra::{self, Gcra};
    use crate::decision::{Decision, Outcome};
    use crate::policy::{Limits, Policy};

    /// Decide one request; `state` 0 is a fresh key. See [`crate::decide_word`].
    pub fn decide(state: u64, now_ns: u64, policy: &Policy) -> (Decision, Option<u64>) {
        let gcra = Gcra::new(state, now_ns, &policy.limits.rate, policy.cost);
        let capacity_ns = u128::from(capacity(&policy.limits)) * gcra.interval_ns;

        if gcra.ahead_after_ns > capacity_ns || gcra.arrival_ns.is_none() {
            let never = policy.cost.max(1) > capacity(&policy.limits)
                || gcra.arrival_ns.is_none()
                || gcra::passes_too_late(now_ns, &gcra, capacity_ns);
            let decision = Decision {
                remaining: tokens(capacity_ns, gcra.ahead_before_ns, gcra.interval_ns),
                ..Decision::rejected(
                    if never {
                        Decision::NEVER_NS
                    } else {
                        gcra::saturate(gcra.ahead_after_ns - capacity_ns)
                    },
                    gcra::saturate(gcra.ahead_before_ns),
                    gcra.excess_milli(),
                )
            };
            return (decision, None);
        }

        let decision = Decision {
            outcome: Outcome::Passed,
            delay_ns: 0,
            retry_after_ns: 0,
            remaining: tokens(capacity_ns, gcra.ahead_after_ns, gcra.interval_ns),
            reset_ns: gcra::saturate(gcra.ahead_after_ns),
            excess_milli: gcra.excess_milli(),
        };
        (decision, gcra.arrival_ns)
    }

    /// The earliest time at which `state` is equivalent to a fresh key: its `TAT`, when the
    /// bucket is full again.
    pub fn idle_at_ns(state: u64, limits: &Limits) -> u64 {
        let _ = limits;
        state
    }

    /// The bucket's size in tokens: `burst`, at least 1.
    pub fn capacity(limits: &Limits) -> u64 {
        limits.burst.max(1)
    }

    /// Whole tokens left when the key is `ahead_ns` ahead of the clock.
    fn tokens(capacity_ns: u128, ahead_ns: u128, interval_ns: u128) -> u64 {
        gcra::saturate(capacity_ns.saturating_sub(ahead_ns) / interval_ns)
    }

    /// One decision for `rate_limit ... global=NAME`: a request checked against its own key's
    /// bucket (`user`) and the shared bucket (`global`), each decided on its own state.
    ///
    /// The request takes a token from every bucket that has one (the caller stores the new state
    /// of each bucket whose own decision passed) and passes if either passed: the global bucket
    /// lends its spare capacity to users who ran out of theirs.
    ///
    /// * passed: `retry_after_ns` 0, `delay_ns` 0;
    /// * both rejected: `retry_after_ns` is the smaller of the two (the first bucket to have room);
    /// * `remaining` is the sum of both (each is what that bucket would still let through; a
    ///   request passes while either has a token, so together they admit that many more);
    /// * `reset_ns` is the larger (the key is fresh once both buckets are full);
    /// * `excess_milli` is the smaller of the two (the bucket the request went through).
    ///
    /// ```
    /// use ratelimit_core::token_bucket::compose_global;
    /// use ratelimit_core::{Decision, Outcome};
    ///
    /// let user = Decision::rejected(500_000_000, 500_000_000, 1000);
    /// let global = Decision { outcome: Outcome::Passed, remaining: 9, ..user };
    /// let both = compose_global(&user, &global);
    /// assert_eq!(both.outcome, Outcome::Passed);
    /// assert_eq!(both.retry_after_ns, 0);
    /// assert_eq!(both.remaining, 9);
    /// ```
    pub fn compose_global(user: &Decision, global: &Decision) -> Decision {
        let rank = |outcome: Outcome| match outcome {
            Outcome::Passed => 2,
            Outcome::Delayed => 1,
            Outcome::Rejected => 0,
        };
        let best = if rank(user.outcome) >= rank(global.outcome) {
            user
        } else {
            global
        };
        let (delay_ns, retry_after_ns) = match best.outcome {
            Outcome::Passed => (0, 0),
            Outcome::Delayed => {
                let delay = |d: &Decision| match d.outcome {
                    Outcome::Delayed => d.delay_ns,
                    _ => u64::MAX,
                };
                (delay(user).min(delay(global)), 0)
            }
            Outcome::Rejected => (0, user.retry_after_ns.min(global.retry_after_ns)),
        };
        Decision {
            outcome: best.outcome,
            delay_ns,
            retry_after_ns,
            remaining: user.remaining.saturating_add(global.remaining),
            reset_ns: user.reset_ns.max(global.reset_ns),
            excess_milli: user.excess_milli.min(global.excess_milli),
        }
    }
}

pub mod sliding_window {

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

    fn pack(window: u64, prev: u64, cur: u64) -> u64 {
        ((window & INDEX_MASK) << (2 * COUNT_BITS))
            | ((prev & COUNT_MASK) << COUNT_BITS)
            | (cur & COUNT_MASK)
    }

    /// Decide one request; `state` 0 is a fresh key. See [`crate::decide_word`].
    ///
    /// `remaining` is `floor(N - n)` after the charge; `reset_ns` the time until the state is
    /// equivalent to a fresh key (the end of the window after the one holding the last charge);
    /// `excess_milli` is how far `n + c` exceeds `N`, in 1/1000 requests (0 when passed).
    /// A request costing more than `N` never passes: `retry_after_ns` is `NEVER_NS`.
    pub fn decide(state: u64, now_ns: u64, policy: &Policy) -> (Decision, Option<u64>) {
        let window_ns = policy.limits.rate.window_ns().max(1);
        let limit = window_limit(&policy.limits.rate);
        let cost = policy.cost.max(1);
        let view = view(state, now_ns, window_ns);

        let w = u128::from(window_ns);
        // Everything below is scaled by W so that `n` is an exact integer.
        let limit_scaled = u128::from(limit) * w;
        let estimate_scaled = u128::from(view.prev) * u128::from(window_ns - view.offset_ns)
            + u128::from(view.cur) * w;
        let after_scaled = estimate_scaled + u128::from(cost) * w;
        let excess_milli = saturate(after_scaled.saturating_sub(limit_scaled) * 1000 / w);

        if after_scaled > limit_scaled {
            let retry_after_ns = if cost > limit {
                Decision::NEVER_NS
            } else {
                retry_after_ns(&view, window_ns, limit - cost)
            };
            let decision = Decision {
                remaining: saturate(limit_scaled.saturating_sub(estimate_scaled) / w),
                ..Decision::rejected(
                    retry_after_ns,
                    reset_ns(&view, window_ns, view.cur),
                    excess_milli,
                )
            };
            return (decision, None);
        }

        let cur = view.cur + cost;
        let decision = Decision {
            outcome: Outcome::Passed,
            delay_ns: 0,
            retry_after_ns: 0,
            remaining: saturate((limit_scaled - after_scaled) / w),
            reset_ns: reset_ns(&view, window_ns, cur),
            excess_milli,
        };
        (decision, Some(pack(view.window, view.prev, cur)))
    }

    /// The earliest wait after which `n + c <= N` holds, given `allowed = N - c` and no other
    /// request in between: later in this window (`prev` decays), or in the next one (the
    /// current count becomes `prev` and decays), or at the latest two windows on (all zero).
    fn retry_after_ns(view: &View, window_ns: u64, allowed: u64) -> u64 {
        let w = u128::from(window_ns);
        let offset = u128::from(view.offset_ns);
        // Earliest offset `x` in a window with counts (prev, cur) such that
        // `prev * (W - x) + cur * W <= allowed * W`, or None if no offset in the window does.
        let earliest_offset = |prev: u64, cur: u64| -> Option<u128> {
            let budget = u128::from(allowed.checked_sub(cur)?) * w;
            let span = if prev == 0 {
                w
            } else {
                (budget / u128::from(prev)).min(w)
            };
            Some(w - span)
        };
        let wait = match earliest_offset(view.prev, view.cur) {
            Some(x) if x.max(offset) < w => x.max(offset) - offset,
            _ => {
                let next = earliest_offset(view.cur, 0).unwrap_or(w);
                (w - offset) + next
            }
        };
        saturate(u128::from(view.lead_ns) + wait)
    }

    /// Time until a view holding `cur` in its window is equivalent to a fresh key.
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
}

pub mod sliding_log {

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
    pub fn window_limit(rate: &Rate) -> u64 {
        rate.milli_requests / 1000
    }

    /// The ring as read from its header.
    struct Ring<'a> {
        entries: &'a [u64],
        head: usize,
        count: usize,
    }

    impl<'a> Ring<'a> {
        /// `None` when the log has no room for a single entry.
        fn read(log: &'a [u64]) -> Option<Ring<'a>> {
            let (&header, entries) = log.split_first()?;
            let (head, count) = Ring::read_header(header, entries.len())?;
            Some(Ring {
                entries,
                head,
                count,
            })
        }

        /// `(head, count)` clamped into a ring of `capacity` entries; `None` for no capacity.
        fn read_header(header: u64, capacity: usize) -> Option<(usize, usize)> {
            if capacity == 0 {
                return None;
            }
            let head = usize::try_from(header >> 32).unwrap_or(0) % capacity;
            let count = usize::try_from(header & COUNT_MASK)
                .unwrap_or(capacity)
                .min(capacity);
            Some((head, count))
        }

        /// The `n`-th oldest entry (0-based); 0 if out of range, which callers never ask for.
        fn entry(&self, n: usize) -> u64 {
            let position = self.head.saturating_add(n) % self.entries.len();
            self.entries.get(position).copied().unwrap_or(0)
        }

        fn newest(&self) -> Option<u64> {
            self.count.checked_sub(1).map(|last| self.entry(last))
        }
    }

    /// What a request would do to a log: entries to drop, and whether to record it.
    struct Plan {
        decision: Decision,
        /// Oldest entries that no longer count.
        expired: usize,
        /// The time to record the request's entries at, if it passes.
        record_at: Option<u64>,
    }

    fn plan(log: &[u64], now_ns: u64, policy: &Policy) -> Plan {
        let window_ns = policy.limits.rate.window_ns().max(1);
        let limit = window_limit(&policy.limits.rate);
        let cost = policy.cost.max(1);
        let bad_log = Plan {
            decision: Decision::rejected(window_ns, 0, 0),
            expired: 0,
            record_at: None,
        };
        let Some(ring) = Ring::read(log) else {
            return bad_log;
        };
        // The header keeps a 32-bit count.
        if limit > COUNT_MASK
            || usize::try_from(limit).map_or(true, |limit| limit > ring.entries.len())
        {
            return bad_log;
        }

        // Entries expire as seen from the newest one; waits are reported on the caller's clock.
        let effective_ns = ring.newest().map_or(now_ns, |newest| newest.max(now_ns));
        let mut expired = 0;
        while expired < ring.count && effective_ns.saturating_sub(ring.entry(expired)) >= window_ns
        {
            expired += 1;
        }
        // Within u64: count <= capacity <= usize::MAX.
        let count = (ring.count - expired) as u64;
        let newest = if count > 0 { ring.newest() } else { None };
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
                // The (after - limit)-th oldest counting entry must stop counting.
                let must_expire = expired.saturating_add((after - limit - 1) as usize);
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
                expired,
                record_at: None,
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
            expired,
            record_at: Some(effective_ns),
        }
    }

    /// Decide one request against `log` (length `words_for(N)`, all zeros for a fresh key);
    /// the log is changed only when the request passes.
    ///
    /// `remaining` is `N` minus the entries counting after the request; `reset_ns` the time until
    /// the newest entry stops counting. A request costing more than `N` never passes (its
    /// `retry_after_ns` is `NEVER_NS`). A log too short for `N` (a caller bug) rejects every request.
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
    pub fn decide(log: &mut [u64], now_ns: u64, policy: &Policy) -> Decision {
        let Plan {
            decision,
            expired,
            record_at,
        } = plan(log, now_ns, policy);
        let Some(time) = record_at else {
            return decision;
        };
        let Some((header, entries)) = log.split_first_mut() else {
            return decision;
        };
        let Some((head, count)) = Ring::read_header(*header, entries.len()) else {
            return decision;
        };
        let capacity = entries.len();
        let head = (head + expired) % capacity;
        let mut count = count - expired;
        for _ in 0..policy.cost.max(1) {
            if let Some(slot) = entries.get_mut((head + count) % capacity) {
                *slot = time;
            }
            count += 1;
        }
        *header = ((head as u64) << 32) | count as u64;
        decision
    }

    /// Like `decide` but changes nothing.
    pub fn inspect(log: &[u64], now_ns: u64, policy: &Policy) -> Decision {
        plan(log, now_ns, policy).decision
    }

    /// The earliest time at which `log` is equivalent to a fresh key: when its newest entry stops
    /// counting (0 for an empty log).
    pub fn idle_at_ns(log: &[u64], limits: &Limits) -> u64 {
        Ring::read(log)
            .and_then(|ring| ring.newest())
            .map_or(0, |newest| newest.saturating_add(limits.rate.window_ns()))
    }
}
