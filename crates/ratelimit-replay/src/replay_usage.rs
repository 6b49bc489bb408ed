//! Replaying a usage-based limit (`usage=... reserve=N debt=N`) over logged requests: each
//! request reserves `reserve` tokens at its start, exactly as the module's door does
//! ([`ratelimit_core::decide_word`] with the reservation as the cost), and is settled at its end with
//! its logged usage by the module's own settling arithmetic ([`ratelimit_core::usage::settle`]):
//! a refund of what it did not use, or a charge into debt bounded by `debt`.
//!
//! Settlements are applied in time order between the requests: a request starting at `t`
//! sees every settlement whose end is at or before `t`.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use ratelimit_core::quota::QuotaSpec;
use ratelimit_core::replay::PeriodClock;
use ratelimit_core::usage::settle::{self, Bucket, Settlement};
use ratelimit_core::{decide_word, Algorithm, Outcome, Policy};

/// One logged request of a usage-based replay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageRequest {
    /// Its key.
    pub key: String,
    /// When it came, in nanoseconds.
    pub start_ns: u64,
    /// When it ended (settled), in nanoseconds: `start_ns` when the log has no duration.
    pub end_ns: u64,
    /// The tokens it used, as logged (what the module charged it).
    pub used: u64,
}

/// Per-key totals of a usage-based replay.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UsageKeySummary {
    /// Requests admitted.
    pub admitted: u64,
    /// Requests refused.
    pub refused: u64,
    /// Tokens charged to the admitted requests (their usage).
    pub tokens_admitted: u64,
    /// Tokens the refused requests had used in the log.
    pub tokens_refused: u64,
    /// Tokens the debt bound forgave.
    pub tokens_forgiven: u64,
}

/// A usage-based limit being replayed.
#[derive(Debug)]
pub struct UsageReplay {
    /// The zone's policy with `cost` = the reservation.
    policy: Policy,
    /// A bucket's numbers; `None` for a quota, whose count carries the debt.
    bucket: Option<Bucket>,
    /// A quota's calendar (request times are Unix nanoseconds).
    periods: Option<PeriodClock>,
    debt: u64,
    states: BTreeMap<String, u64>,
    /// Settlements to come: `(end, seq)` -> `(key, owed, the door's policy)`.
    pending: BinaryHeap<Reverse<(u64, u64, String, u64)>>,
    /// The door's policy of each pending settlement, by `seq` (a quota's period).
    door_policies: BTreeMap<u64, Policy>,
    seq: u64,
    keys: BTreeMap<String, UsageKeySummary>,
}

/// Why a usage-based replay cannot be set up.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UsageReplayError(pub String);

impl UsageReplay {
    /// A replay of `policy` (a leaky or token bucket) reserving `reserve` tokens a request
    /// (a reservation larger than the bucket reserves the whole bucket, as in the module),
    /// with a debt bound of `debt` tokens (`None`: one capacity, the module's default).
    pub fn new(
        policy: &Policy,
        reserve: u64,
        debt: Option<u64>,
    ) -> Result<UsageReplay, UsageReplayError> {
        let bucket = Bucket::of(policy).ok_or_else(|| {
            UsageReplayError(
                "usage-based limits need algorithm=leaky_bucket, token_bucket or quota".to_string(),
            )
        })?;
        let mut policy = *policy;
        policy.cost = reserve.clamp(1, bucket.capacity);
        Ok(UsageReplay {
            policy,
            bucket: Some(bucket),
            periods: None,
            debt: debt.unwrap_or_else(|| settle::default_debt(&bucket)),
            states: BTreeMap::new(),
            pending: BinaryHeap::new(),
            door_policies: BTreeMap::new(),
            seq: 0,
            keys: BTreeMap::new(),
        })
    }

    /// A replay of a quota zone's `policy` with its calendar (`quota`), reserving `reserve` a
    /// request; a settlement may take the count past the limit by `debt` (`None`: one limit,
    /// the module's default). A request is settled in the period it was admitted in: when
    /// that period ended first, what it owed beyond its reservation is forgiven, as in the
    /// module.
    pub fn quota(
        policy: &Policy,
        quota: QuotaSpec,
        reserve: u64,
        debt: Option<u64>,
    ) -> Result<UsageReplay, UsageReplayError> {
        if !matches!(policy.algorithm, Algorithm::Quota(_)) {
            return Err(UsageReplayError("not a quota zone".to_string()));
        }
        let limit = policy.limits.quota_limit();
        let mut policy = *policy;
        policy.cost = reserve.clamp(1, limit.max(1));
        Ok(UsageReplay {
            policy,
            bucket: None,
            periods: Some(PeriodClock::new(quota)),
            debt: debt.unwrap_or(limit),
            states: BTreeMap::new(),
            pending: BinaryHeap::new(),
            door_policies: BTreeMap::new(),
            seq: 0,
            keys: BTreeMap::new(),
        })
    }

    /// The tokens each request reserves.
    pub fn reserved(&self) -> u64 {
        self.policy.cost
    }

    fn settle_until(&mut self, now_ns: u64) {
        while let Some(Reverse((end, _, _, _))) = self.pending.peek() {
            if *end > now_ns {
                break;
            }
            let Some(Reverse((end, seq, key, owed))) = self.pending.pop() else {
                break;
            };
            let door = self.door_policies.remove(&seq).unwrap_or(self.policy);
            let state = self.states.get(&key).copied().unwrap_or(0);
            let next = match settle::settlement(self.policy.cost, owed) {
                Settlement::Refund(tokens) => {
                    let mut refund = door;
                    refund.cost = tokens;
                    ratelimit_core::uncommit::uncommit_word(state, end, &refund)
                }
                Settlement::Charge(tokens) => {
                    let (next, forgiven) = match &self.bucket {
                        Some(bucket) => {
                            settle::charge_into_debt(state, end, bucket, tokens, self.debt)
                        }
                        None => {
                            ratelimit_core::quota::charge_into_debt(state, &door, tokens, self.debt)
                        }
                    };
                    let summary = self.keys.entry(key.clone()).or_default();
                    summary.tokens_forgiven = summary.tokens_forgiven.saturating_add(forgiven);
                    next
                }
                Settlement::Even => state,
            };
            self.states.insert(key, next);
        }
    }

    /// Replay one request (requests must come in start order); `true` if admitted.
    pub fn request(&mut self, request: &UsageRequest) -> bool {
        self.settle_until(request.start_ns);
        let state = self.states.get(&request.key).copied().unwrap_or(0);
        let policy = match &mut self.periods {
            Some(periods) => periods.policy_at(&self.policy, request.start_ns),
            None => self.policy,
        };
        let (decision, next) = decide_word(state, request.start_ns, &policy);
        let summary = self.keys.entry(request.key.clone()).or_default();
        if decision.outcome == Outcome::Rejected {
            summary.refused += 1;
            summary.tokens_refused = summary.tokens_refused.saturating_add(request.used);
            return false;
        }
        summary.admitted += 1;
        summary.tokens_admitted = summary.tokens_admitted.saturating_add(request.used);
        if let Some(next) = next {
            self.states.insert(request.key.clone(), next);
        }
        self.seq += 1;
        if self.periods.is_some() {
            self.door_policies.insert(self.seq, policy);
        }
        self.pending.push(Reverse((
            request.end_ns.max(request.start_ns),
            self.seq,
            request.key.clone(),
            request.used,
        )));
        true
    }

    /// Per-key totals, by key.
    pub fn summary(&self) -> &BTreeMap<String, UsageKeySummary> {
        &self.keys
    }
}

/// The requests `policy` with `burst` refuses over `requests` (in start order).
pub fn refused_with_burst(
    requests: &[UsageRequest],
    policy: &Policy,
    burst: u64,
    reserve: u64,
    debt: Option<u64>,
) -> Result<u64, UsageReplayError> {
    let mut policy = *policy;
    policy.limits.burst = burst;
    let mut replay = UsageReplay::new(&policy, reserve, debt)?;
    let mut refused = 0;
    for request in requests {
        if !replay.request(request) {
            refused += 1;
        }
    }
    Ok(refused)
}

/// The calibration aid: the smallest `burst` (budget) at the policy's rate that refuses at
/// most `max_refused` of `requests`, searched by bisection up to `limit` (`None` if even
/// `limit` refuses more). A larger budget refuses fewer requests in all but contrived logs;
/// the answer is checked, not assumed: the returned burst does refuse at most `max_refused`.
pub fn smallest_burst(
    requests: &[UsageRequest],
    policy: &Policy,
    reserve: u64,
    debt: Option<u64>,
    max_refused: u64,
    limit: u64,
) -> Result<Option<u64>, UsageReplayError> {
    if refused_with_burst(requests, policy, limit, reserve, debt)? > max_refused {
        return Ok(None);
    }
    let (mut low, mut high) = (0u64, limit);
    while low < high {
        let mid = low + (high - low) / 2;
        if refused_with_burst(requests, policy, mid, reserve, debt)? <= max_refused {
            high = mid;
        } else {
            low = mid + 1;
        }
    }
    Ok(Some(high))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimit_core::{Algorithm, DelayMode, Limits, Rate};

    const SEC: u64 = 1_000_000_000;

    /// A $1-a-day quota (micro-dollars) replayed on logged costs: 4 of 8 requests costing
    /// $0.31, 65 of 80 costing $0.0155; the next day starts afresh, and a request admitted
    /// before midnight and settled after it charges its overrun to the day it was admitted
    /// in, not to the next.
    #[test]
    fn a_priced_quota_replays_by_the_calendar() {
        let zone = ratelimit_core::ZoneSpec::parse_words(&[
            "algorithm=quota",
            "limit=1000000",
            "period=day",
        ])
        .unwrap();
        let policy = ratelimit_core::replay::policy_from_specs(&zone, None).unwrap();
        let day = 86_400 * SEC;
        let noon = 20_000 * day + day / 2;
        for (cost, count, admitted) in [(310_000, 8, 4), (15_500, 80, 65)] {
            let mut replay =
                UsageReplay::quota(&policy, zone.quota.clone().unwrap(), 1, None).unwrap();
            let request = |start_ns: u64| UsageRequest {
                key: "team".into(),
                start_ns,
                end_ns: start_ns + SEC / 2,
                used: cost,
            };
            let passed = (0..count)
                .filter(|&i| replay.request(&request(noon + i * SEC)))
                .count();
            assert_eq!(passed, admitted, "cost {cost}");
            assert!(replay.request(&request(noon + day)), "the next day");
        }
        // Admitted at 23:59:59.9 and settled after midnight: the next day is not charged.
        let mut replay = UsageReplay::quota(&policy, zone.quota.clone().unwrap(), 1, None).unwrap();
        let late = 20_001 * day - SEC / 10;
        let request = UsageRequest {
            key: "late".into(),
            start_ns: late,
            end_ns: late + SEC,
            used: 900_000,
        };
        assert!(replay.request(&request));
        let next = UsageRequest {
            start_ns: late + 2 * SEC,
            end_ns: late + 2 * SEC,
            used: 1_000_000,
            ..request.clone()
        };
        assert!(
            replay.request(&next),
            "the late overrun went to the day before"
        );
        assert!(
            !replay.request(&next),
            "the first of the day used the day's million"
        );
    }

    fn policy(rate: &str, burst: u64) -> Policy {
        Policy {
            algorithm: Algorithm::TokenBucket,
            limits: Limits {
                rate: Rate::parse(rate).unwrap(),
                burst,
            },
            delay: DelayMode::NoDelay,
            cost: 1,
        }
    }

    fn req(key: &str, start_s: u64, end_s: u64, used: u64) -> UsageRequest {
        UsageRequest {
            key: key.to_string(),
            start_ns: 1_000 * SEC + start_s * SEC,
            end_ns: 1_000 * SEC + end_s * SEC,
            used,
        }
    }

    /// 60 tokens a minute (one a second), a budget of 60, reservations of 10.
    #[test]
    #[allow(clippy::type_complexity)]
    fn reserve_settle_table() {
        #[rustfmt::skip]
        let rows: &[(&str, &[(u64, u64, u64)], Option<u64>, &[bool], (u64, u64, u64))] = &[
            // name, (start, end, used), debt, admitted each, (tokens admitted, refused, forgiven)
            ("six reservations fill the bucket, the seventh is refused",
             &[(0, 0, 10), (0, 0, 10), (0, 0, 10), (0, 0, 10), (0, 0, 10), (0, 0, 10), (0, 0, 10)],
             None, &[true, true, true, true, true, true, false], (60, 10, 0)),
            ("refunds at the end make room again",
             &[(0, 1, 0), (0, 1, 0), (0, 1, 0), (0, 1, 0), (0, 1, 0), (0, 1, 0), (0, 1, 0), (1, 1, 0)],
             None, &[true, true, true, true, true, true, false, true], (0, 0, 0)),
            ("a refund not yet settled does not count",
             &[(0, 5, 0), (0, 5, 0), (0, 5, 0), (0, 5, 0), (0, 5, 0), (0, 5, 0), (1, 1, 0)],
             None, &[true, true, true, true, true, true, false], (0, 0, 0)),
            ("an overrun goes into debt and refuses until repaid",
             &[(0, 0, 100), (30, 30, 10), (50, 50, 10)],
             None, &[true, false, true], (110, 10, 0)),
            ("debt=10 forgives what passes it",
             &[(0, 0, 100), (19, 19, 10), (20, 20, 10)],
             Some(10), &[true, false, true], (110, 10, 30)),
            ("keys are apart",
             &[(0, 0, 200), (0, 0, 5)],
             None, &[true, true], (205, 0, 80)),
        ];
        for (name, requests, debt, admitted, totals) in rows {
            let mut replay = UsageReplay::new(&policy("60r/m", 60), 10, *debt).unwrap();
            let got: Vec<bool> = requests
                .iter()
                .enumerate()
                .map(|(i, &(start, end, used))| {
                    // The last row gives its second request a key of its own.
                    let key = if *name == "keys are apart" && i == 1 {
                        "b"
                    } else {
                        "a"
                    };
                    replay.request(&req(key, start, end, used))
                })
                .collect();
            assert_eq!(&got[..], *admitted, "{name}");
            let sum =
                |f: fn(&UsageKeySummary) -> u64| replay.summary().values().map(f).sum::<u64>();
            assert_eq!(
                (
                    sum(|s| s.tokens_admitted),
                    sum(|s| s.tokens_refused),
                    sum(|s| s.tokens_forgiven)
                ),
                *totals,
                "{name}"
            );
        }
    }

    #[test]
    fn reservation_is_clamped_to_the_bucket() {
        let replay = UsageReplay::new(&policy("60r/m", 60), 1_000, None).unwrap();
        assert_eq!(replay.reserved(), 60);
        let mut sliding = policy("60r/m", 60);
        sliding.algorithm = Algorithm::SlidingWindow;
        assert!(UsageReplay::new(&sliding, 10, None).is_err());
    }

    #[test]
    fn smallest_burst_refuses_at_most_what_is_asked() {
        // Ten requests of 50 tokens at t=0, then nothing: at 1 token/s they all pass with a
        // budget of 500 (burst 500 for a token bucket), one is refused with 450.
        let requests: Vec<UsageRequest> = (0..10).map(|_| req("a", 0, 0, 50)).collect();
        let p = policy("1r/s", 0);
        let none = smallest_burst(&requests, &p, 50, None, 0, 100_000)
            .unwrap()
            .unwrap();
        assert_eq!(
            refused_with_burst(&requests, &p, none, 50, None).unwrap(),
            0
        );
        assert!(refused_with_burst(&requests, &p, none - 1, 50, None).unwrap() > 0);
        let one = smallest_burst(&requests, &p, 50, None, 1, 100_000)
            .unwrap()
            .unwrap();
        assert!(one < none);
        assert_eq!(refused_with_burst(&requests, &p, one, 50, None).unwrap(), 1);
        assert_eq!(
            smallest_burst(&requests, &p, 50, None, 0, 10).unwrap(),
            None
        );
    }
}
