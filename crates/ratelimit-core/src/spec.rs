//! The words of `rate_limit_zone` and `rate_limit`, parsed once for the nginx module and the
//! replay tool so that both read the same configuration the same way.

use crate::penalty::{parse_duration_ns, BlockPolicy, StatusMatcher};
pub(crate) use crate::policy::parse_integer;
pub use crate::policy::{Algorithm, DelayMode, Limits, Policy, SpecError};
use crate::rate::Rate;

pub use crate::rate::RATE_SYNTAX;

/// The parameters of `rate_limit_zone` after its key, for the error that quotes an unknown one.
pub const ZONE_PARAMETERS: &[&str] = &[
    "zone=",
    "rate=",
    "burst=",
    "algorithm=",
    "sync",
    "block=",
    "block_max=",
    "limit=",
    "period=",
    "tz=",
];

/// The parameters of `rate_limit`, for the error that quotes an unknown one.
pub const LIMIT_PARAMETERS: &[&str] = &[
    "zone=",
    "burst=",
    "nodelay",
    "delay=",
    "global=",
    "cost=",
    "on_status=",
    "usage=",
    "reserve=",
    "debt=",
    "on_missing=",
    "usage_weights=",
    "prices=",
    "headers=",
];

/// The words of `rate_limit_zone` after KEY:
/// `zone=NAME:SIZE rate=RATE [burst=N] [algorithm=NAME]`.
/// The replay tool passes the same words without `zone=`, so `zone` is optional here and the
/// module reports its absence itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZoneSpec {
    /// `NAME` and `SIZE` in bytes (nginx size syntax: `10m`, `512k`, `65536`).
    pub zone: Option<(String, u64)>,
    /// `rate=`, required.
    pub rate: Rate,
    /// `burst=`, if given (never for a sliding algorithm).
    pub burst: Option<u64>,
    /// `algorithm=`, `leaky_bucket` when not given.
    pub algorithm: Algorithm,
    /// `sync`: the zone's limits hold across the fleet (`rate_limit_sync`).
    pub sync: bool,
    /// `block=DURATION [block_max=DURATION]`: block a key after a rejection.
    pub block: Option<BlockPolicy>,
    /// `algorithm=quota limit=N period=... [tz=...]` (its `rate` is then unused).
    pub quota: Option<crate::quota::QuotaSpec>,
}

impl ZoneSpec {
    /// Largest N (requests per window) a `sliding_log` zone accepts: each key keeps N
    /// timestamps of 8 bytes.
    pub const MAX_SLIDING_LOG_REQUESTS: u64 = 4096;
    /// Largest N a `sliding_window` zone accepts (its counters are 20 bits wide).
    pub const MAX_SLIDING_WINDOW_REQUESTS: u64 = (1 << 20) - 1;

    /// Parse the words; checks a sliding algorithm's rate (whole, within its maximum) and
    /// that `burst` is not given for one.
    ///
    /// ```
    /// use ratelimit_core::{Algorithm, ZoneSpec};
    ///
    /// let spec = ZoneSpec::parse_words(&["zone=api:10m", "rate=2r/s", "burst=5"]).unwrap();
    /// assert_eq!(spec.zone, Some(("api".to_string(), 10 * 1024 * 1024)));
    /// assert_eq!(spec.algorithm, Algorithm::LeakyBucket);
    /// assert_eq!(spec.limits().burst, 5);
    /// ```
    ///
    /// `block=DURATION` and `block_max=DURATION` (nginx time syntax: `30s`, `15m`, `24h`)
    /// set the zone's penalty box:
    ///
    /// ```
    /// use ratelimit_core::ZoneSpec;
    ///
    /// let spec = ZoneSpec::parse_words(&["rate=5r/m", "block=15m", "block_max=24h"]).unwrap();
    /// let block = spec.block.unwrap();
    /// assert_eq!(block.block_ns, 900 * 1_000_000_000);
    /// assert_eq!(block.block_max_ns, 86_400 * 1_000_000_000);
    /// ```
    pub fn parse_words(words: &[&str]) -> Result<ZoneSpec, SpecError> {
        let mut read = ZoneWords::default();
        for &word in words {
            read.take(word)?;
        }
        let quota = read.quota()?;
        let rate = match &quota {
            Some(quota) => Limits::quota(quota.limit).rate,
            None => read.rate.ok_or(SpecError::MissingParameter("rate"))?,
        };
        let spec = ZoneSpec {
            zone: read.zone,
            rate,
            burst: read.burst,
            algorithm: read.algorithm,
            sync: read.sync,
            block: block_policy(read.block, read.block_max)?,
            quota,
        };
        spec.check_sliding()?;
        spec.limits().check_bucket(spec.algorithm)?;
        if spec.sync && !spec.algorithm.can_sync() {
            return Err(SpecError::Conflict(
                "\"sync\" is not supported by sliding_log: its log of request times cannot be \
                 merged across instances; use sliding_window"
                    .into(),
            ));
        }
        Ok(spec)
    }

    /// The sliding algorithms count whole requests per window, up to their maximum, and have
    /// no burst.
    fn check_sliding(&self) -> Result<(), SpecError> {
        let maximum = match self.algorithm {
            Algorithm::SlidingLog => ZoneSpec::MAX_SLIDING_LOG_REQUESTS,
            Algorithm::SlidingWindow => ZoneSpec::MAX_SLIDING_WINDOW_REQUESTS,
            Algorithm::LeakyBucket
            | Algorithm::TokenBucket
            | Algorithm::Concurrency
            | Algorithm::Quota(_) => return Ok(()),
        };
        let algorithm = self.algorithm;
        let rate = self.rate;
        let requests = rate.whole_requests().ok_or_else(|| {
            SpecError::UnsupportedRate(format!(
                "rate \"{rate}\" is not a whole number of requests for {algorithm}"
            ))
        })?;
        if requests > maximum {
            return Err(SpecError::UnsupportedRate(format!(
                "rate \"{rate}\" is more than {maximum} requests per window, \
                 the largest {algorithm} keeps"
            )));
        }
        if self.burst.is_some() {
            return Err(SpecError::Conflict(format!(
                "\"burst\" is not used by {algorithm}"
            )));
        }
        Ok(())
    }

    /// The limits this spec configures (burst defaults to 0).
    pub fn limits(&self) -> Limits {
        if let Some(quota) = &self.quota {
            return Limits::quota(quota.limit);
        }
        Limits {
            rate: self.rate,
            burst: self.burst.unwrap_or(0),
        }
    }
}

/// The words of a `rate_limit_zone` as they are read one by one, before they are checked
/// together.
struct ZoneWords<'a> {
    zone: Option<(String, u64)>,
    block: Option<u64>,
    /// `block_max=` and the word it was written in.
    block_max: Option<(&'a str, u64)>,
    rate: Option<Rate>,
    burst: Option<u64>,
    algorithm: Algorithm,
    sync: bool,
    quota_limit: Option<u64>,
    period: Option<&'a str>,
    tz: Option<&'a str>,
}

impl Default for ZoneWords<'_> {
    fn default() -> Self {
        ZoneWords {
            zone: None,
            block: None,
            block_max: None,
            rate: None,
            burst: None,
            algorithm: Algorithm::LeakyBucket,
            sync: false,
            quota_limit: None,
            period: None,
            tz: None,
        }
    }
}

impl<'a> ZoneWords<'a> {
    /// Read one word; an unknown one, or a bad value, is the error.
    fn take(&mut self, word: &'a str) -> Result<(), SpecError> {
        if word == "sync" {
            self.sync = true;
        } else if let Some(value) = word.strip_prefix("zone=") {
            self.zone = Some(parse_zone(word, value)?);
        } else if let Some(value) = word.strip_prefix("rate=") {
            // nginx quotes the whole word: invalid rate "rate=abc"
            self.rate = Some(Rate::parse(value).map_err(|_| SpecError::InvalidRate(word.into()))?);
        } else if let Some(value) = word.strip_prefix("burst=") {
            self.burst = Some(parse_burst(word, value)?);
        } else if let Some(value) = word.strip_prefix("algorithm=") {
            self.algorithm = Algorithm::parse(value)?;
            if self.algorithm == Algorithm::Concurrency {
                return Err(SpecError::Conflict(
                    "algorithm \"concurrency\" limits requests in flight, not a rate: a \
                     replay of arrival times cannot show it (its zone words are read by \
                     ConcurrencySpec)"
                        .into(),
                ));
            }
        } else if let Some(value) = word.strip_prefix("block=") {
            self.block = Some(parse_block_duration("block", word, value)?);
        } else if let Some(value) = word.strip_prefix("block_max=") {
            self.block_max = Some((word, parse_block_duration("block_max", word, value)?));
        } else if let Some(value) = word.strip_prefix("limit=") {
            self.quota_limit = Some(crate::quota::parse_limit(word, value)?);
        } else if let Some(value) = word.strip_prefix("period=") {
            self.period = Some(value);
        } else if let Some(value) = word.strip_prefix("tz=") {
            self.tz = Some(value);
        } else {
            return Err(SpecError::invalid_parameter(word, ZONE_PARAMETERS));
        }
        Ok(())
    }

    /// A quota zone's `limit=`, `period=` and `tz=`, which no other zone takes; a quota zone
    /// takes no `rate=` or `burst=`.
    fn quota(&self) -> Result<Option<crate::quota::QuotaSpec>, SpecError> {
        if let Algorithm::Quota(_) = self.algorithm {
            if self.rate.is_some() || self.burst.is_some() {
                return Err(SpecError::Conflict(
                    "\"rate\" and \"burst\" are not used by quota zones, which count up to \
                     \"limit\" per \"period\""
                        .into(),
                ));
            }
            return crate::quota::QuotaSpec::new(self.quota_limit, self.period, self.tz).map(Some);
        }
        if let Some(word) = [
            self.quota_limit.map(|_| "limit"),
            self.period.map(|_| "period"),
            self.tz.map(|_| "tz"),
        ]
        .into_iter()
        .flatten()
        .next()
        {
            return Err(SpecError::Conflict(format!(
                "\"{word}\" is used by quota zones only (algorithm=quota)"
            )));
        }
        Ok(None)
    }
}

/// The penalty box of `block=` and `block_max=` (the word it was written in): none without
/// them; `block_max=` needs `block=`, and at least its length.
fn block_policy(
    block: Option<u64>,
    block_max: Option<(&str, u64)>,
) -> Result<Option<BlockPolicy>, SpecError> {
    match (block, block_max) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err(SpecError::Conflict(
            "\"block_max\" needs \"block\": block=DURATION is the first block's length".into(),
        )),
        (Some(block_ns), None) => Ok(Some(BlockPolicy {
            block_ns,
            block_max_ns: block_ns,
        })),
        (Some(block_ns), Some((word, block_max_ns))) => {
            if block_max_ns < block_ns {
                return Err(SpecError::Conflict(format!(
                    "\"{word}\" is shorter than \"block\": block_max is the longest block"
                )));
            }
            Ok(Some(BlockPolicy {
                block_ns,
                block_max_ns,
            }))
        }
    }
}

/// The words of `rate_limit`: `zone=NAME [burst=N] [nodelay | delay=N] [global=NAME] [cost=N]`.
/// `zone` is optional for the replay tool's `--limit`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitSpec {
    /// `zone=NAME`: the zone whose keys this limit counts in.
    pub zone: Option<String>,
    /// `burst=N`: overrides the zone's burst.
    pub burst: Option<u64>,
    /// `nodelay`, `delay=N`, or neither (`Delay`).
    pub delay: DelayMode,
    /// `global=NAME`: a zone shared by all keys, used when the key's own bucket is empty.
    pub global: Option<String>,
    /// `cost=N`: how many requests each request counts as (default 1).
    pub cost: u64,
    /// `cost=$name`: the cost read from a variable at the door (the name, without `$`);
    /// `cost` is then the cost of a request whose value is not a number (1).
    pub cost_variable: Option<String>,
    /// `usage=` and its words: a cost reserved at the door and settled after the response.
    pub usage: Option<crate::usage::UsageSpec>,
    /// `on_status=CODES`: charge only requests whose final status matches, after the response.
    pub on_status: Option<StatusMatcher>,
    /// `headers=off`: the line stays out of the response's rate limit fields (`RateLimit`,
    /// `RateLimit-Policy`, `Retry-After`); `true` unless so.
    pub headers: bool,
}

impl LimitSpec {
    /// Parse the words; `cost` defaults to 1 and `nodelay` excludes `delay=`.
    ///
    /// ```
    /// use ratelimit_core::{DelayMode, LimitSpec};
    ///
    /// let spec = LimitSpec::parse_words(&["zone=api", "burst=10", "delay=4"]).unwrap();
    /// assert_eq!(spec.delay, DelayMode::Threshold(4));
    /// assert_eq!(spec.cost, 1);
    /// ```
    ///
    /// `on_status=CODES` (`401,403`, `4xx`) charges only the requests whose final status
    /// matches:
    ///
    /// ```
    /// use ratelimit_core::LimitSpec;
    ///
    /// let spec = LimitSpec::parse_words(&["nodelay", "on_status=401,403"]).unwrap();
    /// assert!(spec.on_status.unwrap().matches(403));
    /// ```
    pub fn parse_words(words: &[&str]) -> Result<LimitSpec, SpecError> {
        let mut spec = LimitSpec {
            zone: None,
            burst: None,
            delay: DelayMode::Delay,
            global: None,
            cost: 1,
            cost_variable: None,
            on_status: None,
            usage: None,
            headers: true,
        };
        let mut nodelay = false;
        let mut delay = None;
        let mut usage = crate::usage::UsageWords::default();
        let mut cost_given = None;

        for &word in words {
            if let Some(name) = word.strip_prefix("zone=") {
                if name.is_empty() {
                    return Err(SpecError::InvalidZoneName(word.into()));
                }
                spec.zone = Some(name.to_string());
            } else if let Some(value) = word.strip_prefix("burst=") {
                spec.burst = Some(parse_burst(word, value)?);
            } else if word == "nodelay" {
                nodelay = true;
            } else if let Some(value) = word.strip_prefix("delay=") {
                delay =
                    Some(parse_integer(value).ok_or_else(|| SpecError::InvalidDelay(word.into()))?);
            } else if let Some(name) = word.strip_prefix("global=") {
                if name.is_empty() {
                    return Err(SpecError::InvalidZoneName(word.into()));
                }
                spec.global = Some(name.to_string());
            } else if let Some(value) = word.strip_prefix("cost=") {
                cost_given = Some(word);
                if let Some(name) = crate::usage::variable_name(value) {
                    spec.cost_variable = Some(name);
                } else {
                    spec.cost = parse_integer(value)
                        .filter(|&cost| cost >= 1)
                        .ok_or_else(|| SpecError::InvalidCost(word.into()))?;
                }
            } else if usage.take(word)? {
            } else if let Some(value) = word.strip_prefix("on_status=") {
                spec.on_status = Some(StatusMatcher::parse(word, value)?);
            } else if let Some(value) = word.strip_prefix("headers=") {
                spec.headers = match value {
                    "on" => true,
                    "off" => false,
                    _ => return Err(SpecError::InvalidHeaders(word.into())),
                };
            } else {
                return Err(SpecError::invalid_parameter(word, LIMIT_PARAMETERS));
            }
        }

        spec.delay = match (nodelay, delay) {
            (true, Some(_)) => {
                return Err(SpecError::Conflict(
                    "\"nodelay\" and \"delay\" cannot be used together".to_string(),
                ))
            }
            (true, None) => DelayMode::NoDelay,
            (false, Some(threshold)) => DelayMode::Threshold(threshold),
            (false, None) => DelayMode::Delay,
        };
        spec.usage = usage.finish(cost_given)?;
        Ok(spec)
    }
}

/// `block=` / `block_max=`: an nginx time from 1 ms to [`BlockPolicy::MAX_NS`].
fn parse_block_duration(name: &'static str, word: &str, value: &str) -> Result<u64, SpecError> {
    parse_duration_ns(value)
        .filter(|&ns| (1_000_000..=BlockPolicy::MAX_NS).contains(&ns))
        .ok_or_else(|| SpecError::InvalidDuration(name, word.into()))
}

/// `burst=N`: a non-negative integer no larger than [`Limits::MAX_BURST`].
fn parse_burst(word: &str, value: &str) -> Result<u64, SpecError> {
    parse_integer(value)
        .filter(|&burst| burst <= Limits::MAX_BURST)
        .ok_or_else(|| SpecError::InvalidBurst(word.into()))
}

/// `zone=NAME:SIZE` (`word`, and `value` after `zone=`): the name and the size in bytes.
pub(crate) fn parse_zone(word: &str, value: &str) -> Result<(String, u64), SpecError> {
    let invalid_size = || SpecError::InvalidZoneSize(word.into(), zone_size_hint(value));
    let (name, size) = value.split_once(':').ok_or_else(invalid_size)?;
    if name.is_empty() {
        return Err(SpecError::InvalidZoneName(word.into()));
    }
    let size = parse_size(size)
        .filter(|&size| size > 0)
        .ok_or_else(invalid_size)?;
    Ok((name.to_string(), size))
}

/// What follows `invalid zone size "zone=VALUE"`: the word meant when the size has a unit
/// nginx does not write (`1mb`, `512KiB`: `, did you mean "zone=one:1m"?`), else how a zone
/// and its size are written.
///
/// ```
/// use ratelimit_core::spec::zone_size_hint;
///
/// assert_eq!(zone_size_hint("one:1mb"), ", did you mean \"zone=one:1m\"?");
/// assert!(zone_size_hint("one").starts_with(": it must be zone=NAME:SIZE"));
/// ```
pub fn zone_size_hint(value: &str) -> String {
    const SYNTAX: &str = "it must be zone=NAME:SIZE, the SIZE in bytes or with k, m or g \
                          (65536, 512k, 10m), as in limit_req_zone";
    let Some((name, size)) = value.split_once(':') else {
        return format!(": {SYNTAX}");
    };
    let lower = size.to_ascii_lowercase();
    let unit = lower
        .strip_suffix("ib")
        .or_else(|| lower.strip_suffix('b'))
        .filter(|number| number.ends_with(['k', 'm', 'g']));
    match unit.filter(|&meant| parse_size(meant).is_some_and(|size| size > 0)) {
        Some(meant) => format!(", did you mean \"zone={name}:{meant}\"?"),
        None => format!(": {SYNTAX}"),
    }
}

/// Parse an nginx size: `1024`, `64k`/`64K`, `10m`/`10M`, `1g`/`1G`.
/// `None` for anything else, including a value that overflows `u64`.
///
/// ```
/// use ratelimit_core::spec::parse_size;
///
/// assert_eq!(parse_size("10m"), Some(10 * 1024 * 1024));
/// assert_eq!(parse_size("10x"), None);
/// ```
pub fn parse_size(text: &str) -> Option<u64> {
    let (digits, scale) = if let Some(digits) = text.strip_suffix(['k', 'K']) {
        (digits, 1 << 10)
    } else if let Some(digits) = text.strip_suffix(['m', 'M']) {
        (digits, 1 << 20)
    } else if let Some(digits) = text.strip_suffix(['g', 'G']) {
        (digits, 1 << 30)
    } else {
        (text, 1)
    };
    parse_integer(digits)?.checked_mul(scale)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rate::RateUnit;

    fn zone(words: &str) -> Result<ZoneSpec, String> {
        let words: Vec<&str> = words.split_whitespace().collect();
        ZoneSpec::parse_words(&words).map_err(|e| e.to_string())
    }

    fn limit(words: &str) -> Result<LimitSpec, String> {
        let words: Vec<&str> = words.split_whitespace().collect();
        LimitSpec::parse_words(&words).map_err(|e| e.to_string())
    }

    #[test]
    fn zone_words() {
        let spec = zone("zone=one:10m rate=0.5r/s burst=20 algorithm=token_bucket").unwrap();
        assert_eq!(spec.zone, Some(("one".to_string(), 10 << 20)));
        assert_eq!(
            spec.rate,
            Rate {
                milli_requests: 500,
                unit: RateUnit::Second
            }
        );
        assert_eq!(spec.burst, Some(20));
        assert_eq!(spec.algorithm, Algorithm::TokenBucket);

        let spec = zone("rate=100r/m algorithm=sliding_log").unwrap();
        assert_eq!((&spec.zone, spec.burst), (&None, None));
        assert_eq!(spec.limits().burst, 0);
        assert!(zone("rate=4096r/s algorithm=sliding_log").is_ok());
        assert!(zone("rate=1048575r/s algorithm=sliding_window").is_ok());
        // The largest bucket at the slowest rate, and limit_req's extremes, are accepted.
        assert!(zone("rate=0.001r/d burst=35").is_ok());
        assert!(zone("rate=0.001r/d burst=36 algorithm=token_bucket").is_ok());
        assert!(zone("rate=1r/d burst=36499").is_ok());
        assert!(zone("rate=0.001r/s burst=3153599").is_ok());
        assert!(zone("rate=5r/h burst=4194303").is_ok());
        assert!(zone("rate=0.001r/m burst=52559").is_ok());
    }

    #[test]
    fn zone_errors_quote_the_word() {
        #[rustfmt::skip]
        let rows = [
            ("zone=one:10m", "must have \"rate\" parameter"),
            ("rate=abc", "invalid rate \"rate=abc\": it must be NUMBERr/s|m|h|d with NUMBER \
              above 0, e.g. 10r/s or 0.5r/m"),
            ("rate=10/s", "invalid rate \"rate=10/s\": it must be NUMBERr/s|m|h|d with NUMBER \
              above 0, e.g. 10r/s or 0.5r/m"),
            ("rate=0r/s", "invalid rate \"rate=0r/s\": it must be NUMBERr/s|m|h|d with NUMBER \
              above 0, e.g. 10r/s or 0.5r/m"),
            ("rate=1r/s zone=one", "invalid zone size \"zone=one\": it must be zone=NAME:SIZE, \
              the SIZE in bytes or with k, m or g (65536, 512k, 10m), as in limit_req_zone"),
            ("rate=1r/s zone=one:abc", "invalid zone size \"zone=one:abc\": it must be \
              zone=NAME:SIZE, the SIZE in bytes or with k, m or g (65536, 512k, 10m), as in \
              limit_req_zone"),
            ("rate=1r/s zone=one:0", "invalid zone size \"zone=one:0\": it must be \
              zone=NAME:SIZE, the SIZE in bytes or with k, m or g (65536, 512k, 10m), as in \
              limit_req_zone"),
            ("rate=1r/s zone=per_client:1mb",
             "invalid zone size \"zone=per_client:1mb\", did you mean \"zone=per_client:1m\"?"),
            ("rate=1r/s zone=one:512KB", "invalid zone size \"zone=one:512KB\", did you mean \
              \"zone=one:512k\"?"),
            ("rate=1r/s zone=one:1GiB", "invalid zone size \"zone=one:1GiB\", did you mean \
              \"zone=one:1g\"?"),
            ("rate=1r/s zone=:1m", "invalid zone name \"zone=:1m\""),
            ("rate=1r/s burst=x", "invalid burst value \"burst=x\""),
            ("rate=1r/s burst=-1", "invalid burst value \"burst=-1\""),
            ("rate=1r/s burst=4194304", "invalid burst value \"burst=4194304\""),
            ("algorithm=concurrency limit=5",
             "algorithm \"concurrency\" limits requests in flight, not a rate: a replay of \
              arrival times cannot show it (its zone words are read by ConcurrencySpec)"),
            ("rate=1r/s algorithm=token-bucket", "unknown algorithm \"token-bucket\": it must \
              be leaky_bucket, token_bucket, sliding_log, sliding_window, concurrency or quota"),
            ("rate=1r/s foo", "invalid parameter \"foo\": it must be zone=, rate=, burst=, \
              algorithm=, sync, block=, block_max=, limit=, period= or tz="),
            ("rate=1r/s brust=5", "invalid parameter \"brust=5\", did you mean \"burst=\"?"),
            ("rate=1r/s nodelay", "invalid parameter \"nodelay\": it must be zone=, rate=, \
              burst=, algorithm=, sync, block=, block_max=, limit=, period= or tz="),
            ("rate=0.5r/s algorithm=sliding_log",
             "rate \"0.5r/s\" is not a whole number of requests for sliding_log"),
            ("rate=5000r/s algorithm=sliding_log",
             "rate \"5000r/s\" is more than 4096 requests per window, \
              the largest sliding_log keeps"),
            ("rate=1048576r/s algorithm=sliding_window",
             "rate \"1048576r/s\" is more than 1048575 requests per window, \
              the largest sliding_window keeps"),
            ("rate=10r/s burst=5 algorithm=sliding_window",
             "\"burst\" is not used by sliding_window"),
            ("rate=0.001r/d burst=300",
             "burst 300 is too large for rate \"0.001r/d\" \
              (at most 35: a leaky_bucket must drain within 100 years)"),
            ("rate=0.001r/d burst=37 algorithm=token_bucket",
             "burst 37 is too large for rate \"0.001r/d\" \
              (at most 36: a token_bucket must refill within 100 years)"),
            ("rate=1r/d burst=36500",
             "burst 36500 is too large for rate \"1r/d\" \
              (at most 36499: a leaky_bucket must drain within 100 years)"),
        ];
        for (words, message) in rows {
            assert_eq!(zone(words), Err(message.to_string()), "{words}");
        }
    }

    #[test]
    fn usage_words() {
        use crate::usage::{Amount, OnMissing, Provider, UsageSource, Weights};
        let spec = limit(
            "zone=tpm usage=openai reserve=500 debt=2000 on_missing=keep \
                          usage_weights=output:4,cached:0",
        )
        .unwrap();
        let usage = spec.usage.unwrap();
        assert_eq!(usage.source, UsageSource::Reader(Provider::OpenAi));
        assert_eq!(usage.reserve, Amount::Fixed(500));
        assert_eq!(
            (usage.debt, usage.on_missing),
            (Some(2000), OnMissing::Keep)
        );
        assert_eq!(
            usage.weights,
            Weights {
                input_milli: 1000,
                output_milli: 4000,
                cached_milli: 0
            }
        );
        let usage = limit("usage=$upstream_http_x_tokens reserve=$reserve")
            .unwrap()
            .usage;
        let usage = usage.unwrap();
        assert_eq!(
            usage.source,
            UsageSource::Variable("upstream_http_x_tokens".into())
        );
        assert_eq!(usage.reserve, Amount::Variable("reserve".into()));
        assert_eq!((usage.debt, usage.on_missing), (None, OnMissing::Refund));
        assert_eq!(usage.api, None);
        let usage = limit("usage=anthropic").unwrap().usage.unwrap();
        assert_eq!((usage.reserve, usage.prices), (Amount::Fixed(1), None));
        assert_eq!(usage.api, Some(crate::api_key::Api::Anthropic));
        // Azure OpenAI answers in OpenAI's shapes; its credential is its own.
        let usage = limit("usage=azure").unwrap().usage.unwrap();
        assert_eq!(
            (usage.source, usage.api),
            (
                UsageSource::Reader(Provider::OpenAi),
                Some(crate::api_key::Api::Azure)
            )
        );
        let usage = limit("usage=openai prices=models").unwrap().usage.unwrap();
        assert_eq!(usage.prices.as_deref(), Some("models"));
        let usage = limit("usage=openai reserve=auto").unwrap().usage.unwrap();
        assert_eq!(usage.reserve, Amount::Auto(4096));
        let usage = limit("usage=openai reserve=auto:800")
            .unwrap()
            .usage
            .unwrap();
        assert_eq!(usage.reserve, Amount::Auto(800));
        let spec = limit("cost=$cost").unwrap();
        assert_eq!((spec.cost, spec.cost_variable), (1, Some("cost".into())));
        assert!(spec.usage.is_none());

        #[rustfmt::skip]
        let errors = [
            ("usage=claude", "invalid usage value \"usage=claude\": it must be openai, \
              anthropic, gemini, azure or a $variable"),
            ("usage=$", "invalid usage value \"usage=$\": it must be openai, anthropic, \
              gemini, azure or a $variable"),
            ("usage=openai reserve=0", "invalid reserve value \"reserve=0\": it must be a \
              number of tokens from 1 to 4194303, a $variable, or auto[:N] (the request's own \
              ceiling, N when it sets none)"),
            ("usage=openai reserve=auto:0", "invalid reserve value \"reserve=auto:0\": it must \
              be a number of tokens from 1 to 4194303, a $variable, or auto[:N] (the request's \
              own ceiling, N when it sets none)"),
            ("usage=openai reserve=ten", "invalid reserve value \"reserve=ten\": it must be \
              a number of tokens from 1 to 4194303, a $variable, or auto[:N] (the request's own \
              ceiling, N when it sets none)"),
            ("usage=openai debt=-1", "invalid debt value \"debt=-1\": it must be a number of \
              tokens from 0 to 4194303"),
            ("usage=openai on_missing=charge", "invalid on_missing value \
              \"on_missing=charge\": it must be refund, keep or estimate"),
            ("usage=openai usage_weights=output:x", "invalid usage_weights value \
              \"usage_weights=output:x\": give input:W, output:W and/or cached:W separated \
              by commas, each W a number from 0 to 1000 with up to three decimals, as in \
              usage_weights=input:1,output:4,cached:0"),
            ("reserve=100", "\"reserve\" needs \"usage\": usage=openai|anthropic|gemini|\
              azure|$variable says where the cost known after the response comes from"),
            ("usage=openai cost=5", "\"cost=5\" and \"usage\" cannot be used together: with \
              usage=, reserve= is what is charged at the door"),
            ("usage=$x usage_weights=output:2", "\"usage_weights\" apply to a built-in reader \
              (openai, anthropic, gemini, azure): the value of \"$x\" is the cost itself"),
            ("cost=$", "invalid cost value \"cost=$\": it must be a number from 1 up, or a \
              $variable"),
            ("usage_weight=output:4", "invalid parameter \"usage_weight=output:4\", did you \
              mean \"usage_weights=\"?"),
            ("reserv=4", "invalid parameter \"reserv=4\", did you mean \"reserve=\"?"),
            ("headers=no", "invalid headers value \"headers=no\": it must be headers=on or \
              headers=off"),
            ("usage=openai prices=", "invalid prices value \"prices=\": it must name a \
              rate_limit_prices table, as in prices=models"),
            ("prices=models", "\"prices\" needs \"usage\": usage=openai|anthropic|gemini|\
              azure|$variable says where the cost known after the response comes from"),
            ("usage=$x prices=models", "\"prices\" apply to a built-in reader (openai, \
              anthropic, gemini, azure): the value of \"$x\" is the cost itself"),
            ("usage=openai prices=models usage_weights=output:2", "\"prices=models\" and \
              \"usage_weights\" cannot be used together: the price table gives each kind of \
              token its price"),
        ];
        for (words, message) in errors {
            assert_eq!(limit(words).unwrap_err(), message, "{words}");
        }
    }

    #[test]
    fn limit_words() {
        let spec = limit("zone=one burst=5 nodelay global=all cost=3").unwrap();
        assert_eq!(
            spec,
            LimitSpec {
                zone: Some("one".into()),
                burst: Some(5),
                delay: DelayMode::NoDelay,
                global: Some("all".into()),
                cost: 3,
                cost_variable: None,
                on_status: None,
                usage: None,
                headers: true,
            }
        );
        assert!(!limit("zone=one headers=off").unwrap().headers);
        assert!(limit("zone=one headers=on").unwrap().headers);
        let spec = limit("").unwrap();
        assert_eq!(
            (spec.delay, spec.cost, spec.burst),
            (DelayMode::Delay, 1, None)
        );
        assert_eq!(limit("delay=0").unwrap().delay, DelayMode::Threshold(0));

        #[rustfmt::skip]
        let rows = [
            ("nodelay delay=2", "\"nodelay\" and \"delay\" cannot be used together"),
            ("delay=x", "invalid delay value \"delay=x\""),
            ("cost=0", "invalid cost value \"cost=0\": it must be a number from 1 up, or a $variable"),
            ("burst=1.5", "invalid burst value \"burst=1.5\""),
            ("zone=", "invalid zone name \"zone=\""),
            ("rate=1r/s", "invalid parameter \"rate=1r/s\": it must be zone=, burst=, \
              nodelay, delay=, global=, cost=, on_status=, usage=, reserve=, debt=, on_missing=, \
              usage_weights=, prices= or headers="),
            ("nodealy", "invalid parameter \"nodealy\", did you mean \"nodelay\"?"),
            ("burst", "invalid parameter \"burst\", did you mean \"burst=\"?"),
            ("zones=a", "invalid parameter \"zones=a\", did you mean \"zone=\"?"),
        ];
        for (words, message) in rows {
            assert_eq!(limit(words), Err(message.to_string()), "{words}");
        }
    }

    /// The lists the errors name are the parameters the parsers read: none of them is
    /// refused as an unknown parameter.
    #[test]
    fn parameter_lists_name_what_the_parsers_read() {
        for name in ZONE_PARAMETERS {
            let word = format!("{name}x");
            let word = if name.ends_with('=') { &word } else { *name };
            let error = ZoneSpec::parse_words(&["rate=1r/s", word]).err();
            assert!(
                !matches!(error, Some(SpecError::InvalidParameter(..))),
                "{word}: {error:?}"
            );
        }
        for name in LIMIT_PARAMETERS {
            let word = format!("{name}x");
            let word = if name.ends_with('=') { &word } else { *name };
            let error = LimitSpec::parse_words(&[word]).err();
            assert!(
                !matches!(error, Some(SpecError::InvalidParameter(..))),
                "{word}: {error:?}"
            );
        }
    }

    #[test]
    fn penalty_words() {
        let penalty = |words: &str| {
            let words: Vec<&str> = words.split_whitespace().collect();
            ZoneSpec::parse_words(&words).map_err(|e| e.to_string())
        };
        const S: u64 = 1_000_000_000;
        let block = penalty("rate=5r/m burst=5 block=15m block_max=24h")
            .unwrap()
            .block
            .unwrap();
        assert_eq!((block.block_ns, block.block_max_ns), (900 * S, 86_400 * S));
        let block = penalty("rate=1r/s block=2s").unwrap().block.unwrap();
        assert_eq!((block.block_ns, block.block_max_ns), (2 * S, 2 * S));
        assert_eq!(penalty("rate=1r/s").unwrap().block, None);
        let valid = "give a duration such as 30s, 15m, 24h or 1h30m, from 1ms to 365d";
        #[rustfmt::skip]
        let rows = [
            ("rate=1r/s block=15x", format!("invalid block value \"block=15x\": {valid}")),
            ("rate=1r/s block=0", format!("invalid block value \"block=0\": {valid}")),
            ("rate=1r/s block=366d", format!("invalid block value \"block=366d\": {valid}")),
            ("rate=1r/s block=1m block_max=x",
             format!("invalid block_max value \"block_max=x\": {valid}")),
            ("rate=1r/s block_max=1h",
             "\"block_max\" needs \"block\": block=DURATION is the first block's length".into()),
            ("rate=1r/s block=1h block_max=30m",
             "\"block_max=30m\" is shorter than \"block\": block_max is the longest block".into()),
        ];
        for (words, message) in rows {
            assert_eq!(penalty(words), Err(message), "{words}");
        }

        let on_status = |words: &str| {
            let words: Vec<&str> = words.split_whitespace().collect();
            LimitSpec::parse_words(&words).map_err(|e| e.to_string())
        };
        let spec = on_status("zone=login nodelay on_status=401,403").unwrap();
        assert_eq!(spec.on_status.unwrap().to_string(), "401,403");
        assert_eq!(
            on_status("on_status=4x"),
            Err(
                "invalid on_status value \"on_status=4x\": give status codes (401) or classes \
                 (4xx) from 100 to 599, separated by commas, as in on_status=401,403 or \
                 on_status=4xx"
                    .into()
            )
        );
    }

    #[test]
    fn sizes() {
        #[rustfmt::skip]
        let rows = [
            ("1024", Some(1024)), ("64k", Some(64 << 10)), ("64K", Some(64 << 10)),
            ("10m", Some(10 << 20)), ("10M", Some(10 << 20)), ("1g", Some(1 << 30)),
            ("1G", Some(1 << 30)), ("0", Some(0)), ("", None), ("k", None), ("1x", None),
            ("-1", None), ("1 k", None), ("1kk", None), ("18446744073709551615", Some(u64::MAX)),
            ("18446744073709551616", None), ("17179869184g", None),
        ];
        for (text, size) in rows {
            assert_eq!(parse_size(text), size, "{text:?}");
        }
    }

    #[test]
    fn limits_pack_round_trips() {
        for unit in [
            RateUnit::Second,
            RateUnit::Minute,
            RateUnit::Hour,
            RateUnit::Day,
        ] {
            for milli_requests in [1, 500, 10_000, Rate::MAX_MILLI_REQUESTS] {
                for burst in [0, 1, 20, Limits::MAX_BURST] {
                    let limits = Limits {
                        rate: Rate {
                            milli_requests,
                            unit,
                        },
                        burst,
                    };
                    assert_ne!(limits.pack(), 0);
                    assert_eq!(Limits::unpack(limits.pack()), Some(limits));
                }
            }
        }
        assert_eq!(Limits::unpack(0), None);
        assert_eq!(Limits::unpack(Limits::MAX_BURST), None);
    }
}
