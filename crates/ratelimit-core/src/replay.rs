//! The replay's engine: decide each request of a key as the module would, and summarise per
//! key. Pure (no I/O); the replay tool reads its input (`ratelimit-replay`'s `input` and
//! `log_format`) and the module's tests (t/replay_vs_nginx.rs) feed it too.

use std::collections::{HashMap, VecDeque};
use std::fmt;

use crate::decide::decide_word;
use crate::decision::{Decision, Outcome};
use crate::penalty::{Block, BlockPolicy, BlockWord, StatusMatcher};
use crate::period::{Bounds, Calendar};
use crate::policy::{Algorithm, Policy, SpecError};
use crate::quota::{QuotaSpec, QuotaWindow};
use crate::sliding_log;
use crate::spec::{LimitSpec, ZoneSpec};

/// The policy `--zone` and `--limit` describe, as a `rate_limit` in that zone would apply it:
/// the limit's `burst` overrides the zone's (not allowed for a sliding algorithm), its delay
/// mode and cost apply. `zone=` words are accepted and ignored; `global=` is refused, since a
/// replay runs a single zone.
///
/// ```
/// use ratelimit_core::replay::policy_from_specs;
/// use ratelimit_core::{DelayMode, LimitSpec, ZoneSpec};
///
/// let zone = ZoneSpec::parse_words(&["rate=2r/s", "burst=5"]).unwrap();
/// let limit = LimitSpec::parse_words(&["burst=3", "nodelay"]).unwrap();
/// let policy = policy_from_specs(&zone, Some(&limit)).unwrap();
/// assert_eq!((policy.limits.burst, policy.delay), (3, DelayMode::NoDelay));
/// ```
pub fn policy_from_specs(zone: &ZoneSpec, limit: Option<&LimitSpec>) -> Result<Policy, SpecError> {
    let mut policy = Policy {
        algorithm: zone.algorithm,
        limits: zone.limits(),
        delay: crate::policy::DelayMode::Delay,
        cost: 1,
    };
    let Some(limit) = limit else {
        return Ok(policy);
    };
    if limit.global.is_some() {
        return Err(SpecError::Conflict(
            "\"global\" is not supported by the replay tool".to_string(),
        ));
    }
    if let Some(burst) = limit.burst {
        if matches!(
            zone.algorithm,
            Algorithm::SlidingLog | Algorithm::SlidingWindow
        ) {
            return Err(SpecError::Conflict(format!(
                "\"burst\" is not used by {}",
                zone.algorithm
            )));
        }
        policy.limits.burst = burst;
        policy.limits.check_bucket(zone.algorithm)?;
    }
    policy.delay = limit.delay;
    policy.cost = limit.cost.max(1);
    Ok(policy)
}

/// What a key would have needed for none of its requests to be rejected, at the same rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needed {
    /// Buckets: the smallest `burst=` (exact).
    Burst(u64),
    /// Sliding algorithms: the smallest N (requests per window) of a rate in the same unit.
    RequestsPerWindow(u64),
    /// Quotas: the smallest `limit=` (the most a key counted in one period).
    Limit(u64),
}

/// One key's totals.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeySummary {
    /// The key.
    pub key: String,
    /// Requests passed at once.
    pub passed: u64,
    /// Requests delayed (leaky bucket).
    pub delayed: u64,
    /// Requests rejected by the limit.
    pub rejected: u64,
    /// Requests refused while the key was blocked (`block=`).
    pub blocked: u64,
    /// Blocks the key got.
    pub blocks: u64,
    /// Requests passed without being counted (`on_status=`, status not matched).
    pub uncharged: u64,
    /// The longest block it got.
    pub longest_block_ns: u64,
    /// What would have let all of them through.
    pub needed: Needed,
}

/// Per-key state of the algorithm.
#[derive(Clone, Debug)]
enum KeyState {
    Word(u64),
    Log(Vec<u64>),
}

/// The same key's requests replayed with no limit, to find what limit would have passed them.
#[derive(Clone, Debug, Default)]
struct Unlimited {
    /// Buckets: the GCRA arrival time with no rejection.
    arrival_ns: u128,
    /// Sliding log: passed requests still in the window, `(time, cost)`.
    recent: VecDeque<(u64, u64)>,
    recent_cost: u128,
    /// Sliding window: `(window index, prev, cur)`.
    counts: (u64, u64, u64),
    /// The largest need seen (requests in the bucket or in the window, this one included).
    most: u64,
}

impl Unlimited {
    fn charge(&mut self, now_ns: u64, policy: &Policy) {
        let cost = policy.cost.max(1);
        let need = match policy.algorithm {
            Algorithm::LeakyBucket | Algorithm::TokenBucket => {
                let interval = u128::from(policy.limits.rate.interval_ns().max(1));
                let now = u128::from(now_ns);
                self.arrival_ns = self
                    .arrival_ns
                    .max(now)
                    .saturating_add(u128::from(cost) * interval);
                (self.arrival_ns - now).div_ceil(interval)
            }
            Algorithm::SlidingLog => {
                let window_ns = policy.limits.rate.window_ns();
                while let Some(&(time, cost)) = self.recent.front() {
                    if time.saturating_add(window_ns) > now_ns {
                        break;
                    }
                    self.recent.pop_front();
                    self.recent_cost -= u128::from(cost);
                }
                self.recent.push_back((now_ns, cost));
                self.recent_cost += u128::from(cost);
                self.recent_cost
            }
            Algorithm::SlidingWindow => {
                let window_ns = policy.limits.rate.window_ns().max(1);
                let index = now_ns / window_ns;
                let (stored, prev, cur) = self.counts;
                let (prev, cur) = match index.saturating_sub(stored) {
                    0 => (prev, cur),
                    1 => (cur, 0),
                    _ => (0, 0),
                };
                let cur = cur.saturating_add(cost);
                self.counts = (index, prev, cur);
                let w = u128::from(window_ns);
                let elapsed = u128::from(now_ns % window_ns);
                (u128::from(prev) * (w - elapsed) + u128::from(cur) * w).div_ceil(w)
            }
            // A period's count: `counts` holds the period's end and its count.
            Algorithm::Quota(window) => {
                let (end_ns, _, count) = self.counts;
                let count = if end_ns == window.end_ns { count } else { 0 };
                let count = count.saturating_add(cost);
                self.counts = (window.end_ns, 0, count);
                u128::from(count)
            }
            // Never replayed: `ZoneSpec` refuses concurrency zones (no request durations).
            Algorithm::Concurrency => 0,
        };
        self.most = self.most.max(u64::try_from(need).unwrap_or(u64::MAX));
    }

    fn needed(&self, algorithm: Algorithm) -> Needed {
        match algorithm {
            // burst = excess allowed beyond the request itself
            Algorithm::LeakyBucket => Needed::Burst(self.most.saturating_sub(1)),
            // burst=0 is a bucket of one token too
            Algorithm::TokenBucket => Needed::Burst(if self.most <= 1 { 0 } else { self.most }),
            Algorithm::SlidingLog | Algorithm::SlidingWindow => {
                Needed::RequestsPerWindow(self.most)
            }
            Algorithm::Quota(_) => Needed::Limit(self.most),
            Algorithm::Concurrency => Needed::Burst(0),
        }
    }
}

#[derive(Clone, Debug)]
struct Key {
    name: String,
    state: KeyState,
    unlimited: Unlimited,
    block: BlockWord,
    passed: u64,
    delayed: u64,
    rejected: u64,
    blocked: u64,
    blocks: u64,
    uncharged: u64,
    longest_block_ns: u64,
}

/// What the replay decided for one request: the module's decision, and what the penalty box
/// (`block=`, `on_status=`) made of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// The decision as the module reports it (for a blocked request: a rejection whose
    /// `retry_after_ns` is the time left of the block).
    pub decision: Decision,
    /// Refused because the key was blocked (`BLOCKED`), without asking its limit.
    pub blocked: bool,
    /// Counted in the key's limit. `false` for rejected and blocked requests, and with
    /// `on_status=` for requests whose status does not match.
    pub charged: bool,
    /// The block this request started (a rejection in a zone with `block=`).
    pub block: Option<Block>,
}

impl Verdict {
    /// `PASSED`, `DELAYED`, `REJECTED` or `BLOCKED`, as `$rate_limit_status` names it.
    pub fn as_str(&self) -> &'static str {
        if self.blocked {
            "BLOCKED"
        } else {
            self.decision.outcome.as_str()
        }
    }
}

/// A quota zone's calendar in a replay, where times are Unix nanoseconds: the period a
/// request falls in, computed again only when a request leaves the last one.
#[derive(Clone, Debug)]
pub struct PeriodClock {
    calendar: Calendar,
    bounds: Option<Bounds>,
}

impl PeriodClock {
    /// The calendar of `quota`, no period known yet.
    pub fn new(quota: QuotaSpec) -> PeriodClock {
        PeriodClock {
            calendar: quota.calendar,
            bounds: None,
        }
    }

    /// `policy` deciding in the period that holds `now_ns`.
    pub fn policy_at(&mut self, policy: &Policy, now_ns: u64) -> Policy {
        let now_ms = i64::try_from(now_ns / 1_000_000).unwrap_or(i64::MAX);
        let bounds = match &mut self.bounds {
            Some(known) if (known.start_ms..known.end_ms).contains(&now_ms) => known,
            slot => slot.insert(self.calendar.bounds(now_ms)),
        };
        let ns = |ms: i64| u64::try_from(ms).unwrap_or(0).saturating_mul(1_000_000);
        Policy {
            algorithm: Algorithm::Quota(QuotaWindow {
                tag: QuotaWindow::tag_of(bounds.index),
                end_ns: ns(bounds.end_ms),
            }),
            ..*policy
        }
    }
}

/// Runs requests through one zone's policy, key by key, in input order.
#[derive(Clone, Debug)]
pub struct Replay {
    policy: Policy,
    /// A quota zone's calendar: each request is decided in the period its time falls in.
    periods: Option<PeriodClock>,
    block: Option<BlockPolicy>,
    on_status: Option<StatusMatcher>,
    keys: Vec<Key>,
    index: HashMap<String, usize>,
}

impl Replay {
    /// An empty replay of `policy`.
    pub fn new(policy: Policy) -> Replay {
        Replay {
            policy,
            periods: None,
            block: None,
            on_status: None,
            keys: Vec::new(),
            index: HashMap::new(),
        }
    }

    /// The same replay of a quota zone (`algorithm=quota`): its calendar places each request
    /// in its period, reading the request's time as Unix time (a log's times are; a
    /// timeline's seconds count from 1970-01-01 00:00 UTC).
    ///
    /// ```
    /// use ratelimit_core::replay::{policy_from_specs, Replay};
    /// use ratelimit_core::{Outcome, ZoneSpec};
    ///
    /// let zone = ZoneSpec::parse_words(&["algorithm=quota", "limit=2", "period=day"]).unwrap();
    /// let mut replay = Replay::new(policy_from_specs(&zone, None).unwrap()).with_quota(zone.quota);
    /// let hour = 3_600_000_000_000;
    /// let outcomes: Vec<Outcome> =
    ///     [1, 2, 3, 25].iter().map(|h| replay.decide("a", h * hour).outcome).collect();
    /// // Two on the first day, the third refused; the next day starts afresh.
    /// assert_eq!(outcomes, [Outcome::Passed, Outcome::Passed, Outcome::Rejected, Outcome::Passed]);
    /// ```
    pub fn with_quota(mut self, quota: Option<QuotaSpec>) -> Replay {
        self.periods = quota.map(PeriodClock::new);
        self
    }

    /// A quota zone's calendar, when the replay has one.
    pub fn calendar(&self) -> Option<&Calendar> {
        self.periods.as_ref().map(|periods| &periods.calendar)
    }

    /// The policy at `now_ns`: a quota's is the period holding it.
    fn policy_at(&mut self, now_ns: u64) -> Policy {
        match &mut self.periods {
            Some(periods) => periods.policy_at(&self.policy, now_ns),
            None => self.policy,
        }
    }

    /// The same replay with the zone's `block=` and the limit's `on_status=`.
    pub fn with_penalty(
        mut self,
        block: Option<BlockPolicy>,
        on_status: Option<StatusMatcher>,
    ) -> Replay {
        self.block = block;
        self.on_status = on_status;
        self
    }

    /// The zone's `block=`, if any.
    pub fn block_policy(&self) -> Option<&BlockPolicy> {
        self.block.as_ref()
    }

    /// The limit's `on_status=`, if any.
    pub fn on_status(&self) -> Option<&StatusMatcher> {
        self.on_status.as_ref()
    }

    /// Decide one request as the module would (delayed requests are charged at arrival, like
    /// limit_req) and count it. Without `block=` and `on_status=`: [`Replay::decide_request`]
    /// with no status.
    pub fn decide(&mut self, key: &str, now_ns: u64) -> Decision {
        self.decide_request(key, now_ns, None).decision
    }

    /// Decide one request that ended with `status` (needed with `on_status=`; a request
    /// without one is charged as if it matched).
    ///
    /// * A blocked key's request is `BLOCKED`, charged nothing, `retry_after_ns` the time left.
    /// * Without `on_status=`: the limit decides and charges at once.
    /// * With `on_status=`: the request is checked at the door (rejected when a request of
    ///   its cost would be, never delayed: the charge comes later), then charged only if its
    ///   status matches. The log time is the request's end, so door and charge are at the
    ///   same instant here.
    /// * A rejection in a zone with `block=` blocks the key ([`BlockWord::after_rejection`]);
    ///   its `retry_after_ns` is then the block's length.
    ///
    /// ```
    /// use ratelimit_core::replay::{policy_from_specs, Replay};
    /// use ratelimit_core::{LimitSpec, ZoneSpec};
    ///
    /// let zone = ZoneSpec::parse_words(&["rate=1r/m", "block=10s"]).unwrap();
    /// let limit = LimitSpec::parse_words(&["nodelay", "on_status=401"]).unwrap();
    /// let policy = policy_from_specs(&zone, Some(&limit)).unwrap();
    /// let mut replay = Replay::new(policy).with_penalty(zone.block, limit.on_status);
    /// let s = 1_000_000_000;
    /// // A success passes uncounted; a failure is counted; the next request finds the key
    /// // over its limit, is rejected and blocks it; after the block and a minute, it passes.
    /// let words: Vec<&str> = [(0, 200), (1, 401), (2, 200), (3, 401), (4, 200), (61, 200)]
    ///     .iter()
    ///     .map(|&(t, status)| replay.decide_request("a", t * s, Some(status)).as_str())
    ///     .collect();
    /// assert_eq!(words, ["PASSED", "PASSED", "REJECTED", "BLOCKED", "BLOCKED", "PASSED"]);
    /// ```
    pub fn decide_request(&mut self, key: &str, now_ns: u64, status: Option<u16>) -> Verdict {
        let policy = self.policy_at(now_ns);
        let position = self.position_of(key, &policy);
        let Some(entry) = self.keys.get_mut(position) else {
            return Verdict {
                decision: Decision::rejected(0, 0, 0),
                blocked: false,
                charged: false,
                block: None,
            };
        };
        let counted = match (&self.on_status, status) {
            (Some(matcher), Some(status)) => matcher.matches(status),
            _ => true,
        };
        if counted {
            entry.unlimited.charge(now_ns, &policy);
        }
        if let Some(left_ns) = entry.block.blocked_for_ns(now_ns) {
            entry.blocked += 1;
            return Verdict {
                decision: Decision::rejected(left_ns, left_ns, 0),
                blocked: true,
                charged: false,
                block: None,
            };
        }
        let (mut decision, charge_refused) = if self.on_status.is_some() {
            entry.state.decide_on_status(now_ns, &policy, counted)
        } else {
            (entry.state.charge(now_ns, &policy), false)
        };
        let charged = decision.outcome != Outcome::Rejected && counted && !charge_refused;
        entry.count(&decision, charged);
        let over = decision.outcome == Outcome::Rejected || charge_refused;
        let block = match (&self.block, over) {
            (Some(block_policy), true) => {
                Some(entry.start_block(now_ns, block_policy, &mut decision))
            }
            _ => None,
        };
        Verdict {
            decision,
            blocked: false,
            charged,
            block,
        }
    }

    /// Where `key`'s entry is among the replay's keys: a key not seen yet is added, with
    /// the fresh state of `policy`'s algorithm.
    fn position_of(&mut self, key: &str, policy: &Policy) -> usize {
        if let Some(&position) = self.index.get(key) {
            return position;
        }
        let state = match policy.algorithm {
            Algorithm::SlidingLog => {
                let limit = sliding_log::window_limit(&policy.limits.rate);
                KeyState::Log(vec![0; sliding_log::words_for(limit)])
            }
            _ => KeyState::Word(0),
        };
        self.keys.push(Key {
            name: key.to_string(),
            state,
            unlimited: Unlimited::default(),
            block: BlockWord::default(),
            passed: 0,
            delayed: 0,
            rejected: 0,
            blocked: 0,
            blocks: 0,
            uncharged: 0,
            longest_block_ns: 0,
        });
        self.index.insert(key.to_string(), self.keys.len() - 1);
        self.keys.len() - 1
    }

    /// Totals per key, in the order keys first appeared.
    pub fn summary(&self) -> Vec<KeySummary> {
        self.keys
            .iter()
            .map(|key| KeySummary {
                key: key.name.clone(),
                passed: key.passed,
                delayed: key.delayed,
                rejected: key.rejected,
                blocked: key.blocked,
                blocks: key.blocks,
                uncharged: key.uncharged,
                longest_block_ns: key.longest_block_ns,
                needed: key.unlimited.needed(self.policy.algorithm),
            })
            .collect()
    }

    /// The policy being replayed.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }
}

impl Key {
    /// Count `decision` (`charged` or not) in the key's totals.
    fn count(&mut self, decision: &Decision, charged: bool) {
        match decision.outcome {
            Outcome::Passed => self.passed += 1,
            Outcome::Delayed => self.delayed += 1,
            Outcome::Rejected => self.rejected += 1,
        }
        if !charged && decision.outcome != Outcome::Rejected {
            self.uncharged += 1;
        }
    }

    /// Block the key after a rejection (or a charge refused) at `now_ns`, and count it. The
    /// key cannot pass before the block ends: a rejected `decision`'s Retry-After is at
    /// least that.
    fn start_block(&mut self, now_ns: u64, policy: &BlockPolicy, decision: &mut Decision) -> Block {
        let (word, started) = self.block.after_rejection(now_ns, policy);
        self.block = word;
        self.blocks += 1;
        self.longest_block_ns = self.longest_block_ns.max(started.duration_ns());
        if decision.outcome == Outcome::Rejected {
            let left_ns = started.until_ns.saturating_sub(now_ns);
            decision.retry_after_ns = decision.retry_after_ns.max(left_ns);
        }
        started
    }
}

impl KeyState {
    /// The decision a request would get now, charging nothing.
    fn inspect(&self, now_ns: u64, policy: &Policy) -> Decision {
        match self {
            KeyState::Word(word) => decide_word(*word, now_ns, policy).0,
            KeyState::Log(log) => sliding_log::decide(&mut log.clone(), now_ns, policy),
        }
    }

    /// Decide and charge.
    fn charge(&mut self, now_ns: u64, policy: &Policy) -> Decision {
        match self {
            KeyState::Word(word) => {
                let (decision, new_state) = decide_word(*word, now_ns, policy);
                if let Some(new_state) = new_state {
                    *word = new_state;
                }
                decision
            }
            KeyState::Log(log) => sliding_log::decide(log, now_ns, policy),
        }
    }

    /// Decide with `on_status=`: checked at the door (rejected when a request of its cost
    /// would be), then charged when `counted`, never delayed (the charge comes after the
    /// response). Returns the decision and whether the charge found the key full: with
    /// on_status, a charge that finds the key full (concurrent requests in the module; a
    /// sliding log's exact count here) refuses nothing, the request was served, but it
    /// blocks the key like a rejection.
    fn decide_on_status(
        &mut self,
        now_ns: u64,
        policy: &Policy,
        counted: bool,
    ) -> (Decision, bool) {
        let door = self.inspect(now_ns, policy);
        let (mut decision, charge_refused) = if door.outcome != Outcome::Rejected && counted {
            let charged = self.charge(now_ns, policy);
            if charged.outcome == Outcome::Rejected {
                let passed = Decision {
                    outcome: Outcome::Passed,
                    retry_after_ns: 0,
                    ..charged
                };
                (passed, true)
            } else {
                (charged, false)
            }
        } else {
            (door, false)
        };
        if decision.outcome == Outcome::Delayed {
            decision.outcome = Outcome::Passed;
            decision.delay_ns = 0;
        }
        (decision, charge_refused)
    }
}

impl fmt::Display for Needed {
    /// `burst=3` or `4 requests per window`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Needed::Burst(burst) => write!(f, "burst={burst}"),
            Needed::RequestsPerWindow(n) => write!(f, "{n} requests per window"),
            Needed::Limit(n) => write!(f, "limit={n}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rate::NANOS_PER_SEC;

    fn replay_of(zone: &str, limit: Option<&str>) -> Replay {
        let zone = ZoneSpec::parse_words(&zone.split_whitespace().collect::<Vec<_>>()).unwrap();
        let limit = limit
            .map(|l| LimitSpec::parse_words(&l.split_whitespace().collect::<Vec<_>>()).unwrap());
        Replay::new(policy_from_specs(&zone, limit.as_ref()).unwrap())
    }

    /// Each line `SECONDS [KEY]` (the replay tool's timeline, read here without its reader).
    fn run(replay: &mut Replay, timeline: &str) -> Vec<Outcome> {
        timeline
            .lines()
            .filter_map(|line| {
                let mut fields = line.split_whitespace();
                let seconds: f64 = fields.next()?.parse().unwrap();
                let key = fields.next().unwrap_or("-").to_string();
                Some((key, (seconds * NANOS_PER_SEC as f64).round() as u64))
            })
            .map(|(key, time_ns)| replay.decide(&key, time_ns).outcome)
            .collect()
    }

    #[test]
    fn huge_costs_do_not_overflow() {
        for algorithm in [
            "leaky_bucket",
            "token_bucket",
            "sliding_log",
            "sliding_window",
        ] {
            let zone = format!("rate=1r/s algorithm={algorithm}");
            let mut replay = replay_of(&zone, Some("cost=18446744073709551615"));
            let outcomes = run(&mut replay, &"0\n".repeat(300));
            assert!(
                outcomes.iter().all(|&o| o == Outcome::Rejected),
                "{algorithm}"
            );
        }
    }

    #[test]
    fn specs_combine_like_rate_limit() {
        let zone = ZoneSpec::parse_words(&["rate=2r/s", "algorithm=sliding_log"]).unwrap();
        let burst = LimitSpec::parse_words(&["burst=3"]).unwrap();
        let message = policy_from_specs(&zone, Some(&burst))
            .unwrap_err()
            .to_string();
        assert_eq!(message, "\"burst\" is not used by sliding_log");
        let global = LimitSpec::parse_words(&["global=all"]).unwrap();
        assert!(policy_from_specs(&zone, Some(&global)).is_err());
        let cost = LimitSpec::parse_words(&["zone=x", "cost=2"]).unwrap();
        assert_eq!(policy_from_specs(&zone, Some(&cost)).unwrap().cost, 2);
    }

    #[test]
    fn leaky_bucket_summary_finds_the_smallest_burst() {
        use Outcome::{Delayed as D, Passed as P, Rejected as R};
        let mut replay = replay_of("rate=2r/s burst=1", None);
        let timeline = "0 a\n0 a\n0 a\n0 a\n0.1 b\n2 a\n";
        assert_eq!(run(&mut replay, timeline), [P, D, R, R, P, P]);
        let summary = replay.summary();
        assert_eq!(summary.len(), 2);
        let a = &summary[0];
        assert_eq!(
            (a.key.as_str(), a.passed, a.delayed, a.rejected),
            ("a", 2, 1, 2)
        );
        assert_eq!(a.needed, Needed::Burst(3)); // four at once: three in excess
        assert_eq!(summary[1].needed, Needed::Burst(0));

        // With that burst nothing is rejected; one less and something is.
        for (burst, rejected) in [(3, 0), (2, 1)] {
            let mut replay = replay_of(&format!("rate=2r/s burst={burst}"), None);
            let outcomes = run(&mut replay, timeline);
            assert_eq!(
                outcomes.iter().filter(|&&o| o == R).count(),
                rejected,
                "burst={burst}"
            );
        }
    }

    #[test]
    fn token_bucket_summary() {
        let mut replay = replay_of("rate=1r/s algorithm=token_bucket", Some("cost=2"));
        run(&mut replay, "0\n0\n1\n");
        let summary = &replay.summary()[0];
        // Six tokens taken by 1 s, one refilled: the bucket must hold five.
        assert_eq!(summary.needed, Needed::Burst(5));
        assert_eq!((summary.passed, summary.rejected), (0, 3));
        let mut replay = replay_of("rate=1r/s burst=5 algorithm=token_bucket", Some("cost=2"));
        assert!(!run(&mut replay, "0\n0\n1\n").contains(&Outcome::Rejected));
    }

    #[test]
    fn sliding_summaries_count_requests_per_window() {
        let timeline = "0\n0.5\n0.9\n1.2\n1.4\n3\n";
        let mut log = replay_of("rate=2r/s algorithm=sliding_log", None);
        run(&mut log, timeline);
        // (0.5, 0.9, 1.2, 1.4] in (0.4, 1.4]: four
        assert_eq!(log.summary()[0].needed, Needed::RequestsPerWindow(4));
        let mut window = replay_of("rate=2r/s algorithm=sliding_window", None);
        run(&mut window, timeline);
        // at 1.4: prev 3 * 0.6 + cur 2 = 3.8, rounded up
        assert_eq!(window.summary()[0].needed, Needed::RequestsPerWindow(4));
        for algorithm in ["sliding_log", "sliding_window"] {
            for (n, rejects) in [(4, false), (3, true)] {
                let mut replay = replay_of(&format!("rate={n}r/s algorithm={algorithm}"), None);
                let outcomes = run(&mut replay, timeline);
                assert_eq!(
                    outcomes.contains(&Outcome::Rejected),
                    rejects,
                    "{algorithm} {n}"
                );
            }
        }
    }
}
