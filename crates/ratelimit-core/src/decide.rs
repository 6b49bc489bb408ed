//! One decision routed to its algorithm's arithmetic: what the crate root offers as
//! [`decide_word`], [`decide_words`], the idle times, the standing policy and the rescaling
//! of a state, and [`Policy::max_cost`]. Each match on the [`Algorithm`] lives here, above
//! the algorithms' modules, so that nothing below them (the [`Policy`] they read) calls up.

use crate::decision::Decision;
use crate::policy::{Algorithm, Limits, Policy};
use crate::rate::Rate;
use crate::{gcra, leaky_bucket, quota, sliding_log, sliding_window, token_bucket};

/// Decide one request for the algorithms whose per-key state is a single `u64`
/// (`LeakyBucket`, `TokenBucket`, `SlidingWindow`).
///
/// `state == 0` is a key never seen. Returns the decision and, when the request is charged
/// (passed or delayed), the new state to store; `None` means "store nothing" (rejected).
/// For `SlidingLog` this returns a rejection with `retry_after_ns == 0`: use [`sliding_log`].
///
/// ```
/// use ratelimit_core::{decide_word, Algorithm, DelayMode, Outcome, Policy, ZoneSpec};
///
/// let zone = ZoneSpec::parse_words(&["rate=2r/s", "burst=1"]).unwrap();
/// let policy = Policy {
///     algorithm: zone.algorithm,
///     limits: zone.limits(),
///     delay: DelayMode::Delay,
///     cost: 1,
/// };
/// let (first, state) = decide_word(0, 0, &policy);
/// assert_eq!(first.outcome, Outcome::Passed);
/// // limit_req with burst=1: the second request at the same instant waits one interval.
/// let (second, state) = decide_word(state.unwrap(), 0, &policy);
/// assert_eq!((second.outcome, second.delay_ns), (Outcome::Delayed, 500_000_000));
/// let (third, none) = decide_word(state.unwrap(), 0, &policy);
/// assert_eq!((third.outcome, third.retry_after_ns, none), (Outcome::Rejected, 500_000_000, None));
/// ```
#[inline]
pub fn decide_word(state: u64, now_ns: u64, policy: &Policy) -> (Decision, Option<u64>) {
    match policy.algorithm {
        Algorithm::LeakyBucket => leaky_bucket::decide(state, now_ns, policy),
        Algorithm::TokenBucket => token_bucket::decide(state, now_ns, policy),
        Algorithm::SlidingWindow => sliding_window::decide(state, now_ns, policy),
        Algorithm::Quota(_) => quota::decide(state, now_ns, policy),
        Algorithm::SlidingLog | Algorithm::Concurrency => (Decision::rejected(0, 0, 0), None),
    }
}

/// Decide one request for the algorithms whose per-key state is several words
/// ([`Algorithm::is_single_word`] is false: `SlidingLog`). With `commit`, a charged request
/// (passed or delayed) is written into `state`; without it nothing changes. For a
/// single-word algorithm this returns a rejection with `retry_after_ns == 0`: use
/// [`decide_word`].
#[inline]
pub fn decide_words(state: &mut [u64], now_ns: u64, policy: &Policy, commit: bool) -> Decision {
    match policy.algorithm {
        Algorithm::SlidingLog if commit => sliding_log::decide(state, now_ns, policy),
        Algorithm::SlidingLog => sliding_log::inspect(state, now_ns, policy),
        _ => Decision::rejected(0, 0, 0),
    }
}

/// The earliest time at which a single-word state is indistinguishable from a fresh key
/// (`0`), so its slot can be reused without changing any future decision.
///
/// A `SlidingWindow` state keeps its window index modulo 2^24 only: without the current time
/// this is `u64::MAX` (never) for any state with counts; see [`word_idle_at_ns_near`].
/// `SlidingLog` has no single-word state: 0.
#[inline]
pub fn word_idle_at_ns(state: u64, limits: &Limits, algorithm: Algorithm) -> u64 {
    match algorithm {
        Algorithm::LeakyBucket => leaky_bucket::idle_at_ns(state, limits),
        Algorithm::TokenBucket => token_bucket::idle_at_ns(state, limits),
        Algorithm::SlidingWindow => sliding_window::idle_at_ns(state, limits),
        // A count is fresh again at its period's end, which a state alone does not tell: a
        // key with a count is kept as long as the zone has room.
        Algorithm::Quota(_) if state != 0 => u64::MAX,
        Algorithm::SlidingLog | Algorithm::Concurrency | Algorithm::Quota(_) => 0,
    }
}

/// [`word_idle_at_ns`] for a state of several words; 0 for a single-word algorithm.
#[inline]
pub fn words_idle_at_ns(state: &[u64], limits: &Limits, algorithm: Algorithm) -> u64 {
    match algorithm {
        Algorithm::SlidingLog => sliding_log::idle_at_ns(state, limits),
        _ => 0,
    }
}

/// Like [`word_idle_at_ns`], but reading a `SlidingWindow` state's window index relative to
/// `now_ns` (as [`decide_word`] would), so that it too gets an exact time. A result at or
/// before `now_ns` means the state is equivalent to a fresh key already.
#[inline]
pub fn word_idle_at_ns_near(state: u64, limits: &Limits, algorithm: Algorithm, now_ns: u64) -> u64 {
    match algorithm {
        Algorithm::SlidingWindow => sliding_window::idle_at_ns_near(state, limits, now_ns),
        other => word_idle_at_ns(state, limits, other),
    }
}

/// A request no limit can admit: every algorithm rejects it and a rejection charges nothing
/// and reports the unchanged state's `remaining` and `reset_ns`.
const STANDING_COST: u64 = u32::MAX as u64;

/// The policy whose decision tells where a key stands now, without any request: its
/// `remaining` and `reset_ns` are those of the unchanged state (used for the `RateLimit`
/// header of a zone that did not itself decide a rejected request).
#[inline]
pub fn standing_policy(policy: &Policy) -> Policy {
    // A quota's limit goes up to 2^53: only a cost above every limit is refused by all.
    let cost = if policy.algorithm.is_quota() {
        u64::MAX
    } else {
        STANDING_COST
    };
    Policy { cost, ..*policy }
}

/// Re-express a single-word state after its rate changed from `old` to `new`, so that the
/// backlog it holds (in requests) drains at the new rate from `now_ns` on, as limit_req's
/// `excess` does. Only the two buckets keep a time computed with the rate; the sliding
/// window keeps counts, which are the same under any rate.
///
/// A backlog that would reach further than [`Limits::MAX_BUCKET_SPAN_NS`] at the new rate
/// stops there: no valid bucket holds more, so it is still full under any limits.
pub fn rescale_word(state: u64, now_ns: u64, algorithm: Algorithm, old: &Rate, new: &Rate) -> u64 {
    match algorithm {
        Algorithm::LeakyBucket | Algorithm::TokenBucket if state > now_ns => {
            let ahead = state - now_ns;
            let (new_interval, old_interval) = (new.interval_ns(), old.interval_ns());
            let scaled = match ahead.checked_mul(new_interval) {
                Some(product) => product / old_interval,
                None => gcra::saturate(
                    u128::from(ahead) * u128::from(new_interval) / u128::from(old_interval),
                ),
            };
            now_ns.saturating_add(scaled.clamp(1, Limits::MAX_BUCKET_SPAN_NS))
        }
        _ => state,
    }
}

impl Policy {
    /// The largest cost a request can have and still pass (on a fresh key): the bucket's
    /// `K` (`burst + 1` leaky, `burst` but at least 1 token), the sliding algorithms' `N`. A
    /// request costing more is rejected with [`Decision::NEVER_NS`].
    ///
    /// ```
    /// use ratelimit_core::{Algorithm, DelayMode, Limits, Policy, Rate};
    ///
    /// let limits = Limits { rate: Rate::parse("5r/s").unwrap(), burst: 2 };
    /// let policy = |algorithm| Policy { algorithm, limits, delay: DelayMode::NoDelay, cost: 1 };
    /// assert_eq!(policy(Algorithm::LeakyBucket).max_cost(), 3);
    /// assert_eq!(policy(Algorithm::TokenBucket).max_cost(), 2);
    /// assert_eq!(policy(Algorithm::SlidingWindow).max_cost(), 5);
    /// ```
    pub fn max_cost(&self) -> u64 {
        match self.algorithm {
            Algorithm::LeakyBucket => self.limits.burst.saturating_add(1),
            Algorithm::TokenBucket => token_bucket::capacity(&self.limits),
            Algorithm::SlidingLog => sliding_log::window_limit(&self.limits.rate),
            Algorithm::SlidingWindow => sliding_window::window_limit(&self.limits.rate),
            // Slots are counted by crate::concurrency, never by a policy's decision.
            Algorithm::Concurrency => u64::MAX,
            Algorithm::Quota(_) => self.limits.quota_limit(),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::policy::DelayMode;

    /// A nodelay policy of cost 1 (shared by the crate's unit tests).
    pub(crate) fn policy(algorithm: Algorithm, rate: &str, burst: u64) -> Policy {
        Policy {
            algorithm,
            limits: Limits {
                rate: Rate::parse(rate).unwrap(),
                burst,
            },
            delay: DelayMode::NoDelay,
            cost: 1,
        }
    }

    /// The standing policy reports as `remaining` exactly the cost-1 requests that still pass
    /// at that instant, and changes nothing.
    #[test]
    fn standing_counts_what_still_passes() {
        for policy in [
            policy(Algorithm::LeakyBucket, "2r/s", 4),
            policy(Algorithm::TokenBucket, "2r/s", 5),
            policy(Algorithm::SlidingWindow, "5r/s", 0),
        ] {
            let mut state = 0;
            let now = 7_000_000_000;
            for _ in 0..2 {
                state = decide_word(state, now, &policy).1.unwrap();
            }
            let (standing, next) = decide_word(state, now, &standing_policy(&policy));
            assert_eq!(next, None, "{policy:?}");
            let mut passes = 0;
            while let (_, Some(next)) = decide_word(state, now, &policy) {
                state = next;
                passes += 1;
            }
            assert_eq!(standing.remaining, passes, "{policy:?}");
        }
    }

    #[test]
    fn rescaling_keeps_the_backlog_in_requests() {
        let old = Rate::parse("1r/m").unwrap();
        let new = Rate::parse("30r/m").unwrap();
        let now = 100_000_000_000;
        // Two requests queued at 1r/m: 120 s ahead; at 30r/m the same two take 4 s.
        let state = now + 120_000_000_000;
        assert_eq!(
            rescale_word(state, now, Algorithm::LeakyBucket, &old, &new),
            now + 4_000_000_000
        );
        // An idle state stays as it is; counts of the sliding window are rate-free.
        assert_eq!(rescale_word(5, now, Algorithm::TokenBucket, &old, &new), 5);
        assert_eq!(
            rescale_word(state, now, Algorithm::SlidingWindow, &old, &new),
            state
        );
    }
}
