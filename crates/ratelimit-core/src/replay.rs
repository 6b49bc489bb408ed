//! The replay tool's logic: read requests from a timeline or an access log, decide each as
//! the module would, and summarise per key. Pure (no I/O): the binary feeds it lines.

use std::collections::{HashMap, VecDeque};
use std::fmt;

use crate::{
    decide_word, sliding_log, Algorithm, Decision, LimitSpec, Outcome, Policy, SpecError, ZoneSpec,
    NANOS_PER_SEC,
};

/// The key of timeline lines that name none: all such requests share it.
pub const DEFAULT_KEY: &str = "-";

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
        delay: crate::DelayMode::Delay,
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

/// What the input lines are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputFormat {
    /// `SECONDS [KEY]` a line; `#` starts a comment; blank lines are skipped.
    Timeline,
    /// nginx access log lines whose format starts with `$msec`; the key is the whitespace-
    /// separated field `key_field` (1-based; 2 is `$remote_addr` after `$msec`).
    AccessLog {
        /// 1-based index of the field holding the key.
        key_field: usize,
    },
}

/// One request read from the input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// 1-based line number in the input.
    pub line: usize,
    /// Its time, as written (`0.25`, `1700000000.123`).
    pub time_text: String,
    /// Its time in nanoseconds.
    pub time_ns: u64,
    /// Its key ([`DEFAULT_KEY`] when a timeline line names none).
    pub key: String,
}

/// A bad input line: `line 3: invalid time "abc"`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {problem}")]
pub struct InputError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong, quoting the bad token.
    pub problem: String,
}

/// Reads input lines one by one, checking that times never go backwards.
#[derive(Clone, Debug)]
pub struct LineReader {
    format: InputFormat,
    previous: Option<(u64, String)>,
}

impl LineReader {
    /// A reader for `format`.
    pub fn new(format: InputFormat) -> LineReader {
        LineReader {
            format,
            previous: None,
        }
    }

    /// The request on line `line` (1-based), `None` for a blank or comment line.
    pub fn read(&mut self, line: usize, text: &str) -> Result<Option<Request>, InputError> {
        let problem = |problem: String| InputError { line, problem };
        let (time_text, key) = match self.format {
            InputFormat::Timeline => {
                let text = text.split_once('#').map_or(text, |(before, _)| before);
                let mut fields = text.split_whitespace();
                let Some(time) = fields.next() else {
                    return Ok(None);
                };
                let key = fields.next().unwrap_or(DEFAULT_KEY);
                if let Some(extra) = fields.next() {
                    return Err(problem(format!("unexpected \"{extra}\" after the key")));
                }
                (time, key)
            }
            InputFormat::AccessLog { key_field } => {
                let mut fields = text.split_whitespace();
                let Some(time) = fields.next() else {
                    return Ok(None);
                };
                let key = match key_field {
                    0 => return Err(problem("key field 0: fields count from 1".to_string())),
                    1 => time,
                    n => text
                        .split_whitespace()
                        .nth(n - 1)
                        .ok_or_else(|| problem(format!("no field {n} for the key")))?,
                };
                (time, key)
            }
        };
        let time_ns = parse_seconds(time_text)
            .ok_or_else(|| problem(format!("invalid time \"{time_text}\"")))?;
        if let Some((previous_ns, previous_text)) = &self.previous {
            if time_ns < *previous_ns {
                return Err(problem(format!(
                    "time \"{time_text}\" is earlier than the previous request's \
                     \"{previous_text}\""
                )));
            }
        }
        self.previous = Some((time_ns, time_text.to_string()));
        Ok(Some(Request {
            line,
            time_text: time_text.to_string(),
            time_ns,
            key: key.to_string(),
        }))
    }
}

/// Decimal seconds (`12`, `0.25`, `1700000000.123`, at most 9 decimals) in nanoseconds;
/// `None` for anything else or a time beyond `u64` nanoseconds.
///
/// ```
/// use ratelimit_core::replay::parse_seconds;
///
/// assert_eq!(parse_seconds("0.25"), Some(250_000_000));
/// assert_eq!(parse_seconds("-1"), None);
/// ```
pub fn parse_seconds(text: &str) -> Option<u64> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, "0"));
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(whole) || !all_digits(fraction) || fraction.len() > 9 {
        return None;
    }
    let nanos: u64 = format!("{fraction:0<9}").parse().ok()?;
    whole
        .parse::<u64>()
        .ok()?
        .checked_mul(NANOS_PER_SEC)?
        .checked_add(nanos)
}

/// What a key would have needed for none of its requests to be rejected, at the same rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needed {
    /// Buckets: the smallest `burst=` (exact).
    Burst(u64),
    /// Sliding algorithms: the smallest N (requests per window) of a rate in the same unit.
    RequestsPerWindow(u64),
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
    /// Requests rejected.
    pub rejected: u64,
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
        }
    }
}

#[derive(Clone, Debug)]
struct Key {
    name: String,
    state: KeyState,
    unlimited: Unlimited,
    passed: u64,
    delayed: u64,
    rejected: u64,
}

/// Runs requests through one zone's policy, key by key, in input order.
#[derive(Clone, Debug)]
pub struct Replay {
    policy: Policy,
    keys: Vec<Key>,
    index: HashMap<String, usize>,
}

impl Replay {
    /// An empty replay of `policy`.
    pub fn new(policy: Policy) -> Replay {
        Replay {
            policy,
            keys: Vec::new(),
            index: HashMap::new(),
        }
    }

    /// Decide one request as the module would (delayed requests are charged at arrival, like
    /// limit_req) and count it.
    pub fn decide(&mut self, key: &str, now_ns: u64) -> Decision {
        let policy = &self.policy;
        let position = match self.index.get(key) {
            Some(&position) => position,
            None => {
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
                    passed: 0,
                    delayed: 0,
                    rejected: 0,
                });
                self.index.insert(key.to_string(), self.keys.len() - 1);
                self.keys.len() - 1
            }
        };
        let Some(entry) = self.keys.get_mut(position) else {
            return Decision::rejected(0, 0, 0);
        };
        let decision = match &mut entry.state {
            KeyState::Word(word) => {
                let (decision, new_state) = decide_word(*word, now_ns, policy);
                if let Some(new_state) = new_state {
                    *word = new_state;
                }
                decision
            }
            KeyState::Log(log) => sliding_log::decide(log, now_ns, policy),
        };
        match decision.outcome {
            Outcome::Passed => entry.passed += 1,
            Outcome::Delayed => entry.delayed += 1,
            Outcome::Rejected => entry.rejected += 1,
        }
        entry.unlimited.charge(now_ns, policy);
        decision
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
                needed: key.unlimited.needed(self.policy.algorithm),
            })
            .collect()
    }

    /// The policy being replayed.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }
}

impl fmt::Display for Needed {
    /// `burst=3` or `4 requests per window`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Needed::Burst(burst) => write!(f, "burst={burst}"),
            Needed::RequestsPerWindow(n) => write!(f, "{n} requests per window"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replay_of(zone: &str, limit: Option<&str>) -> Replay {
        let zone = ZoneSpec::parse_words(&zone.split_whitespace().collect::<Vec<_>>()).unwrap();
        let limit = limit
            .map(|l| LimitSpec::parse_words(&l.split_whitespace().collect::<Vec<_>>()).unwrap());
        Replay::new(policy_from_specs(&zone, limit.as_ref()).unwrap())
    }

    fn run(replay: &mut Replay, timeline: &str) -> Vec<Outcome> {
        let mut reader = LineReader::new(InputFormat::Timeline);
        timeline
            .lines()
            .enumerate()
            .filter_map(|(i, line)| reader.read(i + 1, line).unwrap())
            .map(|request| replay.decide(&request.key, request.time_ns).outcome)
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
    fn timeline_lines() {
        let mut reader = LineReader::new(InputFormat::Timeline);
        assert_eq!(reader.read(1, "# a comment"), Ok(None));
        assert_eq!(reader.read(2, "   "), Ok(None));
        let request = reader.read(3, "0.25 alice # first").unwrap().unwrap();
        assert_eq!(
            (request.time_ns, request.key.as_str()),
            (250_000_000, "alice")
        );
        let request = reader.read(4, "1").unwrap().unwrap();
        assert_eq!(
            (request.time_ns, request.key.as_str(), request.line),
            (NANOS_PER_SEC, "-", 4)
        );
        #[rustfmt::skip]
        let errors = [
            ("abc", "line 9: invalid time \"abc\""),
            ("1.0000000001", "line 9: invalid time \"1.0000000001\""),
            ("-1", "line 9: invalid time \"-1\""),
            ("2 bob extra", "line 9: unexpected \"extra\" after the key"),
            ("0.5", "line 9: time \"0.5\" is earlier than the previous request's \"1\""),
        ];
        for (line, message) in errors {
            assert_eq!(reader.read(9, line).unwrap_err().to_string(), message);
        }
    }

    #[test]
    fn access_log_lines() {
        let line =
            "1700000000.123 10.0.0.1 - - [14/Nov/2023:22:13:20 +0000] \"GET / HTTP/1.1\" 200";
        let mut reader = LineReader::new(InputFormat::AccessLog { key_field: 2 });
        let request = reader.read(1, line).unwrap().unwrap();
        assert_eq!(request.time_ns, 1_700_000_000_123_000_000);
        assert_eq!(
            (request.key.as_str(), request.time_text.as_str()),
            ("10.0.0.1", "1700000000.123")
        );
        let mut by_status = LineReader::new(InputFormat::AccessLog { key_field: 10 });
        assert_eq!(by_status.read(1, line).unwrap().unwrap().key, "200");
        let mut too_far = LineReader::new(InputFormat::AccessLog { key_field: 11 });
        assert_eq!(
            too_far.read(7, line).unwrap_err().to_string(),
            "line 7: no field 11 for the key"
        );
        assert_eq!(reader.read(2, "").unwrap(), None);
        let bad = reader.read(3, "[14/Nov/2023] 10.0.0.1").unwrap_err();
        assert_eq!(bad.to_string(), "line 3: invalid time \"[14/Nov/2023]\"");
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
