//! `algorithm=quota limit=N period=hour|day|week|month [tz=ZONE]`: at most `N` requests (or
//! tokens, or micro-dollars: whatever the line's cost counts) per calendar period, the count
//! starting again from zero when a period begins.
//!
//! A key's state is one word: the period it counts in (a tag, below) and its count since that
//! period began. A request of another period finds a tag that is not its own and counts from
//! zero: nothing has to run at the period's end.
//!
//! The period itself comes from the caller, in [`QuotaWindow`]: its tag and its end on the
//! caller's clock (the module computes it from the wall clock with [`crate::period`]), so that
//! the arithmetic here stays free of time zones and reads no clock.

use crate::decision::{Decision, Outcome};
use crate::period::{Calendar, CalendarError};
use crate::policy::parse_integer;
pub use crate::policy::QuotaWindow;
use crate::policy::{Algorithm, Limits, Policy, SpecError};
use crate::rate::{Rate, RateUnit};

/// The largest `limit=`: 2^53, what a JSON number (the admin API) holds exactly.
pub const MAX_LIMIT: u64 = 1 << 53;

/// Bits of a state word that count (the rest is the period's tag): room for a count of
/// [`MAX_LIMIT`] plus a settlement's debt beyond it.
const COUNT_BITS: u32 = 54;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;

/// Distinct tags (1 to 1023; 0 is a fresh key's): a state left untouched for a multiple of
/// 1023 periods exactly would be read as current. A key's entry that lives that long without a
/// request (1023 hours are 42 days) is rare; days, weeks and months are safe for years.
const TAGS: i64 = 1023;

impl QuotaWindow {
    /// The tag of period number `index` ([`crate::period::Bounds::index`]): 1 to 1023.
    pub fn tag_of(index: i64) -> u64 {
        index.rem_euclid(TAGS) as u64 + 1
    }
}

/// A quota zone's words: `limit=N period=... [tz=...]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaSpec {
    /// `limit=`, 1 to [`MAX_LIMIT`].
    pub limit: u64,
    /// `period=` and `tz=`.
    pub calendar: Calendar,
}

impl QuotaSpec {
    /// `limit=N`, `period=` and `tz=` gathered by [`crate::ZoneSpec::parse_words`].
    pub(crate) fn new(
        limit: Option<u64>,
        period: Option<&str>,
        tz: Option<&str>,
    ) -> Result<QuotaSpec, SpecError> {
        let limit = limit.ok_or(SpecError::MissingParameter("limit"))?;
        let period = period.ok_or(SpecError::MissingParameter("period"))?;
        let calendar = Calendar::parse(period, tz).map_err(|error| match error {
            CalendarError::Period(_) | CalendarError::TimeZone(_) => {
                SpecError::InvalidValue(error.to_string())
            }
        })?;
        Ok(QuotaSpec { limit, calendar })
    }
}

/// `limit=N`: an integer from 1 to [`MAX_LIMIT`].
pub(crate) fn parse_limit(word: &str, value: &str) -> Result<u64, SpecError> {
    parse_integer(value)
        .filter(|limit| (1..=MAX_LIMIT).contains(limit))
        .ok_or_else(|| {
            SpecError::InvalidValue(format!(
                "invalid limit value \"{word}\": it must be an integer from 1 to {MAX_LIMIT}"
            ))
        })
}

impl Limits {
    /// A quota's limit as zone limits, in the packed word's 62 bits of rate and burst (which a
    /// quota has no use for): the burst field holds the low 22 bits, the rate's thousandths
    /// one more than the rest (never zero, as a packed word's rate must be).
    ///
    /// ```
    /// use ratelimit_core::Limits;
    ///
    /// for limit in [1, 5, 4_194_304, 3_000_000_000, 1 << 53] {
    ///     let limits = Limits::quota(limit);
    ///     assert_eq!(Limits::unpack(limits.pack()).unwrap().quota_limit(), limit);
    /// }
    /// ```
    pub fn quota(limit: u64) -> Limits {
        let limit = limit.min(MAX_LIMIT);
        Limits {
            rate: Rate {
                milli_requests: (limit >> 22) + 1,
                unit: RateUnit::Day,
            },
            burst: limit & Limits::MAX_BURST,
        }
    }

    /// The limit [`Limits::quota`] made these limits from.
    pub fn quota_limit(&self) -> u64 {
        (self.rate.milli_requests.saturating_sub(1) << 22 | self.burst & Limits::MAX_BURST)
            .min(MAX_LIMIT)
    }
}

/// What a key in state `state` has used of the period `window` names.
#[inline]
pub fn used(state: u64, window: &QuotaWindow) -> u64 {
    if state >> COUNT_BITS == window.tag {
        state & COUNT_MASK
    } else {
        0
    }
}

/// The period tag a state word counts in (0 for a fresh key's word): what a reader of saved
/// words compares with the current period's before it restores one.
///
/// ```
/// use ratelimit_core::quota::{state_of, tag_of_state, QuotaWindow};
///
/// let window = QuotaWindow { tag: 1023, end_ns: 0 };
/// assert_eq!(tag_of_state(state_of(7, &window)), 1023);
/// assert_eq!(tag_of_state(0), 0);
/// ```
#[inline]
pub fn tag_of_state(state: u64) -> u64 {
    state >> COUNT_BITS
}

/// The state of a key that used `count` in `window`.
#[inline]
pub fn state_of(count: u64, window: &QuotaWindow) -> u64 {
    window.tag << COUNT_BITS | count.min(COUNT_MASK)
}

/// Decide a request of `policy.cost` for a key in state `state` at `now_ns`, in the period of
/// `policy.algorithm` (a [`Algorithm::Quota`]). Passes while the period's count plus the
/// cost stays within the limit; a refusal's `retry_after_ns` is the time to the period's end
/// ([`Decision::NEVER_NS`] for a cost above the limit), and `reset_ns` always is.
///
/// ```
/// use ratelimit_core::quota::{decide, QuotaWindow};
/// use ratelimit_core::{Algorithm, DelayMode, Limits, Outcome, Policy};
///
/// let window = QuotaWindow { tag: 7, end_ns: 1_000 };
/// let policy = Policy {
///     algorithm: Algorithm::Quota(window),
///     limits: Limits::quota(2),
///     delay: DelayMode::NoDelay,
///     cost: 1,
/// };
/// let (_, state) = decide(0, 100, &policy);
/// let (second, state) = decide(state.unwrap(), 200, &policy);
/// assert_eq!((second.remaining, second.reset_ns), (0, 800));
/// let (third, none) = decide(state.unwrap(), 300, &policy);
/// assert_eq!((third.outcome, third.retry_after_ns, none), (Outcome::Rejected, 700, None));
/// // The next period counts from zero.
/// let next = Policy { algorithm: Algorithm::Quota(QuotaWindow { tag: 8, end_ns: 2_000 }), ..policy };
/// assert_eq!(decide(state.unwrap(), 1_000, &next).0.outcome, Outcome::Passed);
/// ```
#[inline]
pub fn decide(state: u64, now_ns: u64, policy: &Policy) -> (Decision, Option<u64>) {
    let Algorithm::Quota(window) = policy.algorithm else {
        return (Decision::rejected(0, 0, 0), None);
    };
    let limit = policy.limits.quota_limit();
    let used = used(state, &window);
    let left = limit.saturating_sub(used);
    let to_end_ns = window.end_ns.saturating_sub(now_ns);
    let cost = policy.cost;
    if cost <= left {
        let decision = Decision {
            outcome: Outcome::Passed,
            delay_ns: 0,
            retry_after_ns: 0,
            remaining: left - cost,
            reset_ns: if used + cost == 0 { 0 } else { to_end_ns },
            excess_milli: 0,
        };
        return (decision, Some(state_of(used + cost, &window)));
    }
    let retry_after_ns = if cost > limit {
        Decision::NEVER_NS
    } else {
        to_end_ns
    };
    let excess_milli = (used.saturating_add(cost) - limit).saturating_mul(1000);
    let mut decision = Decision::rejected(retry_after_ns, to_end_ns, excess_milli);
    decision.remaining = left;
    (decision, None)
}

/// `state` with `policy.cost` given back, if it is still the period's.
pub fn uncommit(state: u64, policy: &Policy) -> u64 {
    let Algorithm::Quota(window) = policy.algorithm else {
        return state;
    };
    if state >> COUNT_BITS != window.tag {
        return state;
    }
    state_of(used(state, &window).saturating_sub(policy.cost), &window)
}

/// `tokens` more charged to `state` in its period whether they fit or not, up to `debt`
/// beyond the limit (a usage line's settlement); returns the new state and what the bound
/// forgave. A state of another period (the period ended between the reservation and the
/// response) is left alone: the request's tokens are forgiven, never charged to the new
/// period's count nor written over it.
pub fn charge_into_debt(state: u64, policy: &Policy, tokens: u64, debt: u64) -> (u64, u64) {
    let Algorithm::Quota(window) = policy.algorithm else {
        return (state, tokens);
    };
    if state != 0 && state >> COUNT_BITS != window.tag {
        return (state, tokens);
    }
    let used = used(state, &window);
    let ceiling = policy
        .limits
        .quota_limit()
        .saturating_add(debt)
        .min(COUNT_MASK);
    let charged = used.saturating_add(tokens).min(ceiling.max(used));
    (state_of(charged, &window), tokens - (charged - used))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::DelayMode;

    fn policy(limit: u64, tag: u64, end_ns: u64, cost: u64) -> Policy {
        Policy {
            algorithm: Algorithm::Quota(QuotaWindow { tag, end_ns }),
            limits: Limits::quota(limit),
            delay: DelayMode::NoDelay,
            cost,
        }
    }

    #[test]
    fn table() {
        // (now, cost, outcome, remaining, retry_after, reset) for limit=5, period ending at
        // 10_000, the key's state carried from row to row.
        #[rustfmt::skip]
        let rows = [
            (0, 1, Outcome::Passed, 4, 0, 10_000),
            (1_000, 3, Outcome::Passed, 1, 0, 9_000),
            (2_000, 2, Outcome::Rejected, 1, 8_000, 8_000),
            (3_000, 1, Outcome::Passed, 0, 0, 7_000),
            (4_000, 1, Outcome::Rejected, 0, 6_000, 6_000),
            (5_000, 6, Outcome::Rejected, 0, Decision::NEVER_NS, 5_000),
            // Past the end, on a clock that has not seen the next period yet: still refused,
            // with nothing left to wait.
            (12_000, 1, Outcome::Rejected, 0, 0, 0),
        ];
        let mut state = 0;
        for (now, cost, outcome, remaining, retry_after, reset) in rows {
            let (decision, next) = decide(state, now, &policy(5, 3, 10_000, cost));
            let row = format!("now {now} cost {cost}");
            assert_eq!(decision.outcome, outcome, "{row}");
            assert_eq!(decision.remaining, remaining, "{row}");
            assert_eq!(decision.retry_after_ns, retry_after, "{row}");
            assert_eq!(decision.reset_ns, reset, "{row}");
            assert_eq!(next.is_some(), outcome == Outcome::Passed, "{row}");
            state = next.unwrap_or(state);
        }
        // A new period (another tag) starts from zero.
        let (decision, next) = decide(state, 10_000, &policy(5, 4, 20_000, 5));
        assert_eq!((decision.outcome, decision.remaining), (Outcome::Passed, 0));
        assert_eq!(used(next.unwrap(), &QuotaWindow { tag: 4, end_ns: 0 }), 5);
    }

    #[test]
    fn a_raised_limit_keeps_the_count() {
        let mut state = 0;
        for _ in 0..5 {
            state = decide(state, 0, &policy(5, 1, 100, 1)).1.unwrap();
        }
        assert_eq!(
            decide(state, 0, &policy(5, 1, 100, 1)).0.outcome,
            Outcome::Rejected
        );
        for _ in 0..2 {
            state = decide(state, 0, &policy(7, 1, 100, 1)).1.unwrap();
        }
        assert_eq!(
            decide(state, 0, &policy(7, 1, 100, 1)).0.outcome,
            Outcome::Rejected
        );
        // Lowered below what was used: refused until the period ends.
        let lowered = decide(state, 0, &policy(3, 1, 100, 1)).0;
        assert_eq!((lowered.outcome, lowered.remaining), (Outcome::Rejected, 0));
    }

    #[test]
    fn the_largest_limit_counts_exactly() {
        let (first, state) = decide(0, 0, &policy(MAX_LIMIT, 1, 100, MAX_LIMIT - 1));
        assert_eq!((first.outcome, first.remaining), (Outcome::Passed, 1));
        let (last, state) = decide(state.unwrap(), 0, &policy(MAX_LIMIT, 1, 100, 1));
        assert_eq!(last.outcome, Outcome::Passed);
        let over = decide(state.unwrap(), 0, &policy(MAX_LIMIT, 1, 100, 1)).0;
        assert_eq!(
            (over.outcome, over.retry_after_ns),
            (Outcome::Rejected, 100)
        );
    }

    #[test]
    fn give_back_and_debt() {
        let p = policy(10, 2, 100, 4);
        let state = decide(0, 0, &p).1.unwrap();
        let window = QuotaWindow {
            tag: 2,
            end_ns: 100,
        };
        assert_eq!(used(uncommit(state, &p), &window), 0);
        assert_eq!(used(uncommit(uncommit(state, &p), &p), &window), 0);
        // Another period's state is left alone.
        assert_eq!(uncommit(state, &policy(10, 3, 100, 4)), state);
        // 4 used, 20 more with a debt of 5: 15 counted, 9 forgiven.
        let (debted, forgiven) = charge_into_debt(state, &p, 20, 5);
        assert_eq!((used(debted, &window), forgiven), (15, 9));
        assert_eq!(decide(debted, 0, &p).0.outcome, Outcome::Rejected);
        // The period rolled over since the reservation: the new period's count is kept.
        let next_period = decide(0, 0, &policy(10, 3, 200, 2)).1.unwrap();
        assert_eq!(charge_into_debt(next_period, &p, 20, 5), (next_period, 20));
    }

    #[test]
    fn tags_cycle_and_never_name_a_fresh_key() {
        let tags: Vec<u64> = (-2..=TAGS + 1).map(QuotaWindow::tag_of).collect();
        assert!(tags.iter().all(|&tag| (1..=1023).contains(&tag)));
        assert_ne!(QuotaWindow::tag_of(0), QuotaWindow::tag_of(1));
        assert_eq!(QuotaWindow::tag_of(0), QuotaWindow::tag_of(TAGS));
        assert!(tags.iter().all(|&tag| tag < 1 << (64 - COUNT_BITS)));
    }

    #[test]
    fn limits_words() {
        assert_eq!(
            parse_limit("limit=3000000000", "3000000000"),
            Ok(3_000_000_000)
        );
        assert_eq!(
            parse_limit("limit=9007199254740992", "9007199254740992"),
            Ok(MAX_LIMIT)
        );
        for value in ["0", "9007199254740993", "x", "-1", ""] {
            let word = format!("limit={value}");
            assert_eq!(
                parse_limit(&word, value).unwrap_err().to_string(),
                format!("invalid limit value \"{word}\": it must be an integer from 1 to 9007199254740992")
            );
        }
    }
}
