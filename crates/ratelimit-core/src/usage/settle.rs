//! Settling a request after its response, on the buckets (leaky and token) whose state is a
//! GCRA theoretical arrival time (`TAT`, see `gcra`): `K` tokens of capacity, one token every
//! `T` nanoseconds.
//!
//! At the door a request is charged its reservation `R` like a request of cost `R`. After the
//! response it owes `U` (the usage found, or what [`owed`] says when none was, or a malformed
//! one):
//! `U < R` gives back `R - U` (the same arithmetic as `uncommit`), `U > R` charges `U - R`
//! more without asking whether it fits ([`charge_into_debt`]): the key may then be past its
//! capacity, in debt, by at most `debt` tokens (what goes beyond is forgiven). While in debt
//! every request is refused by the bucket's own arithmetic, whose wait (`retry_after_ns`) is
//! then the time the debt takes to be repaid plus the time for the next reservation.

use crate::policy::{Algorithm, Policy};
use crate::usage::{OnMissing, Usage};

/// The two numbers of a bucket that settling needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bucket {
    /// `T`: nanoseconds per token.
    pub interval_ns: u64,
    /// `K`: tokens a fresh key has.
    pub capacity: u64,
}

impl Bucket {
    /// The bucket of `policy`; `None` for the algorithms that cannot carry a debt (sliding,
    /// concurrency).
    pub fn of(policy: &Policy) -> Option<Bucket> {
        let capacity = match policy.algorithm {
            Algorithm::LeakyBucket => policy.limits.burst.saturating_add(1),
            Algorithm::TokenBucket => crate::token_bucket::capacity(&policy.limits),
            _ => return None,
        };
        Some(Bucket {
            interval_ns: policy.limits.rate.interval_ns().max(1),
            capacity,
        })
    }

    /// `K * T`
    fn capacity_ns(&self) -> u128 {
        u128::from(self.capacity) * u128::from(self.interval_ns)
    }
}

/// `state` charged `tokens` more at `now_ns`, whether they fit or not, but never more than
/// `debt` tokens past the capacity: returns the new state and the tokens forgiven (those the
/// bound left out). A state past its capacity is in debt ([`debt_tokens`]).
///
/// ```
/// use ratelimit_core::usage::settle::{charge_into_debt, debt_tokens, Bucket};
///
/// let bucket = Bucket { interval_ns: 1_000, capacity: 100 };
/// // An empty bucket at t=0 (100 tokens used) charged 30 more, with room for a debt of 50.
/// let full = 100 * 1_000;
/// let (state, forgiven) = charge_into_debt(full, 0, &bucket, 30, 50);
/// assert_eq!((debt_tokens(state, 0, &bucket), forgiven), (30, 0));
/// let (state, forgiven) = charge_into_debt(state, 0, &bucket, 30, 50);
/// assert_eq!((debt_tokens(state, 0, &bucket), forgiven), (50, 10));
/// ```
pub fn charge_into_debt(
    state: u64,
    now_ns: u64,
    bucket: &Bucket,
    tokens: u64,
    debt: u64,
) -> (u64, u64) {
    let interval = u128::from(bucket.interval_ns);
    let start = u128::from(state.max(now_ns));
    let wanted = start + u128::from(tokens) * interval;
    let bound = u128::from(now_ns) + bucket.capacity_ns() + u128::from(debt) * interval;
    // A state already past the bound (a debt charged under an older, larger bound) stays.
    let next = wanted.min(bound.max(start));
    let forgiven = (wanted - next).div_ceil(interval);
    let next = u64::try_from(next).unwrap_or(u64::MAX);
    (next, u64::try_from(forgiven).unwrap_or(u64::MAX))
}

/// How long from `now_ns` until the key's debt is repaid (0 when it owes nothing).
pub fn debt_repaid_in_ns(state: u64, now_ns: u64, bucket: &Bucket) -> u64 {
    let ahead = u128::from(state.saturating_sub(now_ns));
    u64::try_from(ahead.saturating_sub(bucket.capacity_ns())).unwrap_or(u64::MAX)
}

/// The tokens the key owes at `now_ns`, rounded up.
pub fn debt_tokens(state: u64, now_ns: u64, bucket: &Bucket) -> u64 {
    debt_repaid_in_ns(state, now_ns, bucket).div_ceil(bucket.interval_ns)
}

/// The largest debt a key of `bucket` may have when the line says none (`debt=` not
/// given): one capacity.
pub fn default_debt(bucket: &Bucket) -> u64 {
    bucket.capacity
}

/// The difference between what a request reserved and what it owes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settlement {
    /// Give back this many tokens.
    Refund(u64),
    /// Charge this many more, into debt if need be.
    Charge(u64),
    /// The reservation was exact.
    Even,
}

/// What settles `reserved` against `owed`.
pub fn settlement(reserved: u64, owed: u64) -> Settlement {
    match owed.cmp(&reserved) {
        core::cmp::Ordering::Less => Settlement::Refund(reserved - owed),
        core::cmp::Ordering::Greater => Settlement::Charge(owed - reserved),
        core::cmp::Ordering::Equal => Settlement::Even,
    }
}

/// How a request's response ended, as far as the cost is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// The whole response was sent (its last buffer passed): a body without usage is a
    /// response that reports none (`/v1/models`, an error page, a 504 of nginx's own).
    Complete,
    /// The response stopped before its end: the client went away, the upstream timed out or
    /// closed mid-body, or the reader could not read it (compressed, too large, in a file).
    Cut,
}

/// What a line found of its request's usage when the request ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Report {
    /// A usage, and its cost (weighted or priced).
    Usage(u64),
    /// No usage: none in the body (`/v1/models`, an error), a body that could not be read,
    /// an empty variable.
    Missing {
        /// `on_missing=estimate`'s figure, when there is one.
        estimate: Option<u64>,
    },
    /// A usage that is malformed (a figure that is not a count, a document that cannot be
    /// read): the upstream reported something, nothing says how much.
    Malformed {
        /// The most the request could have cost, when its body said ([`request_bound`], at
        /// the line's weights or prices).
        bound: Option<u64>,
    },
}

/// The tokens a request owes, from what its line found and how the response ended:
///
/// | found | end | `refund` (default) | `keep` | `estimate` |
/// |---|---|---|---|---|
/// | usage `U` | complete | `U` | `U` | `U` |
/// | usage `U` | cut | `max(U, R)` | `max(U, R)` | `max(U, R)` |
/// | none | complete | 0 | `R` | the estimate `E`, 0 without one |
/// | none | cut | `R` | `R` | `max(E, R)` |
/// | malformed | any | `max(B, R)` | `max(B, R)` | `max(B, R)` |
///
/// `B` is the request's bound (`R` alone when it is not known): a malformed usage is never
/// settled below what the request was reserved, whatever `on_missing` says, since a broken or
/// hostile upstream must not make a request free.
///
/// ```
/// use ratelimit_core::usage::settle::{owed, End, Report};
/// use ratelimit_core::usage::OnMissing;
///
/// let malformed = Report::Malformed { bound: Some(1200) };
/// assert_eq!(owed(100, malformed, End::Complete, OnMissing::Refund), 1200);
/// let missing = Report::Missing { estimate: None };
/// assert_eq!(owed(100, missing, End::Complete, OnMissing::Refund), 0);
/// ```
pub fn owed(reserved: u64, report: Report, end: End, on_missing: OnMissing) -> u64 {
    match report {
        Report::Usage(cost) => charged_tokens(reserved, Some(cost), end, on_missing),
        Report::Missing { estimate } => {
            let estimate = estimate.filter(|_| on_missing == OnMissing::Estimate);
            charged_tokens(reserved, estimate, end, on_missing)
        }
        Report::Malformed { bound } => bound.unwrap_or(0).max(reserved),
    }
}

/// The most a request may use as its body says, as `reserve=auto` reads it: `reservation`
/// tokens ([`crate::usage::request::RequestFacts::reservation`]), of which `prompt_estimate`
/// are its prompt's (input) and the rest its output ceiling.
///
/// ```
/// use ratelimit_core::usage::settle::request_bound;
///
/// let bound = request_bound(1_021, 21);
/// assert_eq!((bound.prompt_tokens, bound.completion_tokens, bound.total_tokens), (21, 1_000, 1_021));
/// ```
pub fn request_bound(reservation: u64, prompt_estimate: u64) -> Usage {
    let prompt = prompt_estimate.min(reservation);
    Usage {
        prompt_tokens: prompt,
        completion_tokens: reservation - prompt,
        cached_tokens: 0,
        total_tokens: reservation,
    }
}

/// The tokens a request owes, from the usage found (its weighted cost, the variable's value,
/// or `on_missing=estimate`'s estimate) and how the response ended, when the usage is not
/// malformed ([`owed`]):
///
/// | usage found | end | owed |
/// |---|---|---|
/// | `U` | complete | `U` |
/// | `U` | cut | `max(U, R)`: what was reported so far, at least the reservation |
/// | none | complete | 0 with `on_missing=refund` (the default) and `estimate` (whose estimate, when there is one, comes in as the usage found), `R` with `keep` |
/// | none | cut | `R`: the upstream may have worked for it, nothing says how much |
pub fn charged_tokens(reserved: u64, found: Option<u64>, end: End, on_missing: OnMissing) -> u64 {
    match (found, end) {
        (Some(cost), End::Complete) => cost,
        (Some(cost), End::Cut) => cost.max(reserved),
        (None, End::Complete) => match on_missing {
            OnMissing::Refund | OnMissing::Estimate => 0,
            OnMissing::Keep => reserved,
        },
        (None, End::Cut) => reserved,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::decide_word;
    use crate::decision::Outcome;
    use crate::policy::{DelayMode, Limits};
    use crate::rate::Rate;

    const SEC: u64 = 1_000_000_000;

    fn token_policy(rate: &str, burst: u64, cost: u64) -> Policy {
        Policy {
            algorithm: Algorithm::TokenBucket,
            limits: Limits {
                rate: Rate::parse(rate).unwrap(),
                burst,
            },
            delay: DelayMode::NoDelay,
            cost,
        }
    }

    /// `(state before as tokens used at now, tokens charged, debt bound) -> (debt, forgiven)`
    #[test]
    fn charge_into_debt_table() {
        let bucket = Bucket {
            interval_ns: 10,
            capacity: 100,
        };
        let now = 1_000_000;
        #[rustfmt::skip]
        let rows: &[(u64, u64, u64, u64, u64)] = &[
            // used, charged, debt bound, debt after, forgiven
            (0,     50,  0,   0,  0),   // fits: no debt
            (60,    50,  0,   0,  10),  // bound 0: what passes the capacity is forgiven
            (60,    50,  20,  10, 0),
            (100,   30,  20,  20, 10),
            (100,   0,   20,  0,  0),
            (120,   5,   20,  20, 5),   // already at the bound
            (130,   5,   20,  30, 5),   // past a newer, smaller bound: kept, not raised
        ];
        for &(used, charged, bound, debt, forgiven) in rows {
            let state = now + used * bucket.interval_ns;
            let (next, left_out) = charge_into_debt(state, now, &bucket, charged, bound);
            assert_eq!(
                (debt_tokens(next, now, &bucket), left_out),
                (debt, forgiven),
                "used {used} charged {charged} bound {bound}"
            );
        }
        // A state in the past is a full bucket.
        let (next, _) = charge_into_debt(5, now, &bucket, 3, 0);
        assert_eq!(next, now + 30);
    }

    #[test]
    fn settlement_and_owed_table() {
        assert_eq!(settlement(100, 40), Settlement::Refund(60));
        assert_eq!(settlement(100, 140), Settlement::Charge(40));
        assert_eq!(settlement(100, 100), Settlement::Even);
        #[rustfmt::skip]
        let rows = [
            (100, Some(40),  End::Complete, OnMissing::Refund, 40),
            (100, Some(400), End::Complete, OnMissing::Refund, 400),
            (100, Some(40),  End::Cut,      OnMissing::Refund, 100),
            (100, Some(400), End::Cut,      OnMissing::Refund, 400),
            (100, None,      End::Complete, OnMissing::Refund, 0),
            (100, None,      End::Complete, OnMissing::Keep,   100),
            (100, None,      End::Cut,      OnMissing::Refund, 100),
            (100, None,      End::Cut,      OnMissing::Keep,   100),
        ];
        for (reserved, found, end, on_missing, owed) in rows {
            assert_eq!(
                charged_tokens(reserved, found, end, on_missing),
                owed,
                "{reserved} {found:?} {end:?} {on_missing:?}"
            );
        }
    }

    /// [`owed`]'s table: every report, end and `on_missing`, with `R` = 100, `U` = 40,
    /// `E` = 70 and `B` = 1200 (a malformed usage is never settled below `R`, nor at 0).
    #[test]
    fn owed_table() {
        use OnMissing::{Estimate, Keep, Refund};
        let usage = Report::Usage(40);
        let missing = Report::Missing { estimate: Some(70) };
        let silent = Report::Missing { estimate: None };
        let malformed = Report::Malformed { bound: Some(1200) };
        let small = Report::Malformed { bound: Some(30) };
        let unknown = Report::Malformed { bound: None };
        #[rustfmt::skip]
        let rows: &[(Report, End, [u64; 3])] = &[
            // report, end, owed with refund, keep, estimate
            (usage,     End::Complete, [40, 40, 40]),
            (usage,     End::Cut,      [100, 100, 100]),
            (missing,   End::Complete, [0, 100, 70]),
            (silent,    End::Complete, [0, 100, 0]),
            (missing,   End::Cut,      [100, 100, 100]),
            (Report::Missing { estimate: Some(700) }, End::Cut, [100, 100, 700]),
            (malformed, End::Complete, [1200, 1200, 1200]),
            (malformed, End::Cut,      [1200, 1200, 1200]),
            (small,     End::Complete, [100, 100, 100]),
            (unknown,   End::Complete, [100, 100, 100]),
        ];
        for &(report, end, expected) in rows {
            for (on_missing, expected) in [Refund, Keep, Estimate].into_iter().zip(expected) {
                assert_eq!(
                    owed(100, report, end, on_missing),
                    expected,
                    "{report:?} {end:?} {on_missing:?}"
                );
            }
        }
        assert_eq!(
            owed(
                100,
                Report::Malformed {
                    bound: Some(u64::MAX)
                },
                End::Cut,
                Refund
            ),
            u64::MAX
        );
        assert_eq!(request_bound(10, 50).completion_tokens, 0);
    }

    /// `(now s, event, outcome, retry_after s, debt after)`: a token bucket of 60 tokens a
    /// minute (one a second), reservations of 10, settled into debt; the bucket's own
    /// decision refuses a key in debt with the wait until the debt is repaid and the next
    /// reservation fits.
    #[test]
    fn debt_is_refused_until_repaid() {
        let reserve = token_policy("60r/m", 60, 10);
        let bucket = Bucket::of(&reserve).unwrap();
        assert_eq!(
            bucket,
            Bucket {
                interval_ns: SEC,
                capacity: 60
            }
        );
        let mut state = 0;
        let at = |s: u64| 1_000 * SEC + s * SEC;
        // Six reservations of 10 empty the bucket at t=0.
        for _ in 0..6 {
            let (decision, next) = decide_word(state, at(0), &reserve);
            assert_eq!(decision.outcome, Outcome::Passed);
            state = next.unwrap();
        }
        // Each used 15: 6 * 5 = 30 more, into debt.
        for _ in 0..6 {
            state = charge_into_debt(state, at(0), &bucket, 5, 60).0;
        }
        assert_eq!(debt_tokens(state, at(0), &bucket), 30);
        #[rustfmt::skip]
        let rows: &[(u64, Outcome, u64, u64)] = &[
            // now, outcome, retry_after s, debt
            (0,  Outcome::Rejected, 40, 30),  // 30 s of debt, then 10 s for the reservation
            (29, Outcome::Rejected, 11, 1),
            (30, Outcome::Rejected, 10, 0),
            (40, Outcome::Passed,   0,  0),
        ];
        for &(now, outcome, retry_after_s, debt) in rows {
            assert_eq!(debt_tokens(state, at(now), &bucket), debt, "t={now}");
            let (decision, _) = decide_word(state, at(now), &reserve);
            assert_eq!(
                (decision.outcome, decision.retry_after_ns.div_ceil(SEC)),
                (outcome, retry_after_s),
                "t={now}"
            );
        }
        assert_eq!(debt_repaid_in_ns(state, at(10), &bucket), 20 * SEC);
    }

    #[test]
    fn leaky_bucket_capacity_is_burst_plus_one() {
        let mut policy = token_policy("10r/s", 4, 1);
        policy.algorithm = Algorithm::LeakyBucket;
        assert_eq!(Bucket::of(&policy).unwrap().capacity, 5);
        policy.algorithm = Algorithm::SlidingWindow;
        assert_eq!(Bucket::of(&policy), None);
    }
}
