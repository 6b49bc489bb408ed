//! What one decision is made with, below the parsers that read it: the zone's
//! [`Algorithm`], its [`Limits`], a line's [`DelayMode`], the [`Policy`] they make together,
//! and the [`SpecError`] every parser of the configuration's words answers with. `spec`,
//! `quota` and `usage` parse into these; nothing here parses more than an integer.

use std::fmt;

use crate::rate::{Rate, RateUnit, RATE_SYNTAX};

/// A configuration error; the text follows nginx's wording and quotes the bad token.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// `invalid rate "abc": it must be NUMBERr/s|m|h|d ...`
    #[error("invalid rate \"{0}\": {RATE_SYNTAX}")]
    InvalidRate(String),
    /// `invalid burst value "burst=x"`
    #[error("invalid burst value \"{0}\"")]
    InvalidBurst(String),
    /// `invalid delay value "delay=x"`
    #[error("invalid delay value \"{0}\"")]
    InvalidDelay(String),
    /// `invalid cost value "cost=0": ...` (what is valid follows)
    #[error("invalid cost value \"{0}\": it must be a number from 1 up, or a $variable")]
    InvalidCost(String),
    /// `invalid ipv4 value "ipv4=33": it must be a prefix length from 0 to 32`
    #[error("invalid {family} value \"{word}\": it must be a prefix length from 0 to {max}")]
    InvalidPrefix {
        /// The word as written.
        word: String,
        /// `ipv4` or `ipv6`.
        family: &'static str,
        /// The family's longest prefix.
        max: u64,
    },
    /// `invalid headers value "headers=no": it must be on or off`
    #[error("invalid headers value \"{0}\": it must be headers=on or headers=off")]
    InvalidHeaders(String),
    /// `invalid block value "block=x": ...` (what is valid follows)
    #[error(
        "invalid {0} value \"{1}\": give a duration such as 30s, 15m, 24h or 1h30m, \
             from 1ms to 365d"
    )]
    InvalidDuration(&'static str, String),
    /// `invalid on_status value "on_status=4x": ...` (what is valid follows)
    #[error(
        "invalid on_status value \"{0}\": give status codes (401) or classes (4xx) from \
             100 to 599, separated by commas, as in on_status=401,403 or on_status=4xx"
    )]
    InvalidOnStatus(String),
    /// `invalid zone size "zone=one:1mb", did you mean "zone=one:1m"?`, or
    /// `invalid zone size "zone=one": it must be ...`: the word, then [`zone_size_hint`].
    #[error("invalid zone size \"{0}\"{1}")]
    InvalidZoneSize(String, String),
    /// `invalid zone name "zone=:1m"`
    #[error("invalid zone name \"{0}\"")]
    InvalidZoneName(String),
    /// `unknown algorithm "fast": it must be leaky_bucket, token_bucket, ...`
    #[error("unknown algorithm \"{0}\": it must be {ALGORITHMS}")]
    UnknownAlgorithm(String),
    /// `invalid parameter "brust=5", did you mean "burst="?`, or `invalid parameter "foo": it
    /// must be zone=, rate=, ...`: the word, then [`crate::hint::parameter_hint`].
    #[error("invalid parameter \"{0}\"{1}")]
    InvalidParameter(String, String),
    /// `"rate_limit_zone" must have "rate" parameter` (the argument names what is missing)
    #[error("must have \"{0}\" parameter")]
    MissingParameter(&'static str),
    /// A sliding algorithm needs a whole number of requests per unit, at most its maximum:
    /// `rate "0.5r/s" is not a whole number of requests for sliding_log`,
    /// `rate "5000r/s" is more than 4096 requests per window, the largest sliding_log keeps`.
    #[error("{0}")]
    UnsupportedRate(String),
    /// `"burst" is not used by sliding_log` and the like.
    #[error("{0}")]
    Conflict(String),
    /// A value out of its range, with what is valid:
    /// `invalid limit value "limit=0": must be an integer from 1 to 16777215, or "adaptive"`.
    #[error("{0}")]
    InvalidValue(String),
    /// A bucket whose full span would exceed [`Limits::MAX_BUCKET_SPAN_NS`]:
    /// `burst 300 is too large for rate "0.001r/d" (at most 35: a leaky_bucket must drain
    /// within 100 years)`.
    #[error(
        "burst {burst} is too large for rate \"{rate}\" (at most {max}: a {algorithm} must \
         {verb} within 100 years)",
        verb = if *algorithm == Algorithm::TokenBucket { "refill" } else { "drain" }
    )]
    BurstTooLarge {
        /// The burst asked for.
        burst: u64,
        /// The rate it was asked with.
        rate: Rate,
        /// The largest burst the algorithm takes at that rate.
        max: u64,
        /// `leaky_bucket` or `token_bucket`.
        algorithm: Algorithm,
    },
}

/// Every `algorithm=`, for the error that quotes an unknown one.
const ALGORITHMS: &str =
    "leaky_bucket, token_bucket, sliding_log, sliding_window, concurrency or quota";

impl SpecError {
    /// `invalid parameter "WORD"` with the nearest of `valid`, or all of them.
    pub(crate) fn invalid_parameter(word: &str, valid: &[&str]) -> SpecError {
        SpecError::InvalidParameter(word.into(), crate::hint::parameter_hint(word, valid))
    }
}

/// Which algorithm a zone runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// `leaky_bucket` (the default): nginx's `limit_req`, with delays. See [`crate::leaky_bucket`].
    LeakyBucket,
    /// `token_bucket`: bursts of up to `burst` tokens, never delays. See [`crate::token_bucket`].
    TokenBucket,
    /// `sliding_log`: exactly N per sliding window, N timestamps per key.
    /// See [`crate::sliding_log`].
    SlidingLog,
    /// `sliding_window`: about N per sliding window in one word. See [`crate::sliding_window`].
    SlidingWindow,
    /// `concurrency`: requests in flight, not a rate; its zone words are a
    /// [`crate::concurrency::ConcurrencySpec`]. See [`crate::concurrency`].
    Concurrency,
    /// `quota`: at most N per calendar period, decided in the period of its
    /// [`QuotaWindow`] (a zone's algorithm has the default window; each
    /// decision gets its period's). See [`crate::quota`].
    Quota(QuotaWindow),
}

impl Algorithm {
    /// `leaky_bucket`, `token_bucket`, `sliding_log`, `sliding_window`, `concurrency`.
    pub fn parse(text: &str) -> Result<Algorithm, SpecError> {
        match text {
            "leaky_bucket" => Ok(Algorithm::LeakyBucket),
            "token_bucket" => Ok(Algorithm::TokenBucket),
            "sliding_log" => Ok(Algorithm::SlidingLog),
            "sliding_window" => Ok(Algorithm::SlidingWindow),
            "concurrency" => Ok(Algorithm::Concurrency),
            "quota" => Ok(Algorithm::Quota(Default::default())),
            other => Err(SpecError::UnknownAlgorithm(other.to_string())),
        }
    }

    /// The name [`Algorithm::parse`] reads.
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::LeakyBucket => "leaky_bucket",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::Concurrency => "concurrency",
            Algorithm::Quota(_) => "quota",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A zone's adjustable limit: what the admin API changes and what per-key overrides set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Limits {
    /// The rate: emission interval of the buckets, N per window of the sliding algorithms.
    pub rate: Rate,
    /// leaky_bucket: excess requests allowed (limit_req's burst, default 0);
    /// token_bucket: bucket capacity (used as at least 1);
    /// sliding algorithms: unused (0).
    pub burst: u64,
}

impl Limits {
    /// Largest burst the packed form holds.
    pub const MAX_BURST: u64 = (1 << 22) - 1;

    /// The longest a full bucket may take to drain (leaky) or refill (token): 100 years of
    /// 365 days, `K * T` at most. Every theoretical arrival time then fits a `u64` until the
    /// monotonic clock passes `u64::MAX - MAX_BUCKET_SPAN_NS` (about 484 years of uptime);
    /// larger buckets would need more than 64 bits of nanoseconds (see `gcra`).
    pub const MAX_BUCKET_SPAN_NS: u64 = 36_500 * 86_400 * crate::rate::NANOS_PER_SEC;

    /// The largest burst `algorithm` takes at `rate`: [`Limits::MAX_BURST`], or less when a
    /// full bucket would span more than [`Limits::MAX_BUCKET_SPAN_NS`] (at rates under about
    /// 115 requests per day, 4.79r/h); 0 for the sliding algorithms, which have no burst.
    ///
    /// ```
    /// use ratelimit_core::{Algorithm, Limits, Rate};
    ///
    /// let slowest = Rate::parse("0.001r/d").unwrap(); // one request every 1000 days
    /// assert_eq!(Limits::max_burst(Algorithm::LeakyBucket, &slowest), 35); // 36 requests
    /// assert_eq!(Limits::max_burst(Algorithm::TokenBucket, &slowest), 36); // 36 tokens
    /// let daily = Rate::parse("2r/d").unwrap();
    /// assert_eq!(Limits::max_burst(Algorithm::LeakyBucket, &daily), 73_000 - 1);
    /// let common = Rate::parse("1r/m").unwrap();
    /// assert_eq!(Limits::max_burst(Algorithm::LeakyBucket, &common), Limits::MAX_BURST);
    /// ```
    pub fn max_burst(algorithm: Algorithm, rate: &Rate) -> u64 {
        let requests = Limits::MAX_BUCKET_SPAN_NS / rate.interval_ns().max(1);
        let max = match algorithm {
            Algorithm::LeakyBucket => requests.saturating_sub(1),
            Algorithm::TokenBucket => requests,
            Algorithm::SlidingLog
            | Algorithm::SlidingWindow
            | Algorithm::Concurrency
            | Algorithm::Quota(_) => return 0,
        };
        max.min(Limits::MAX_BURST)
    }

    /// For the buckets: that the burst is at most [`Limits::max_burst`] for the rate, so that
    /// every accepted limit is enforced exactly. The sliding algorithms' rules (a whole rate
    /// within their maximum, no burst) are [`ZoneSpec::parse_words`]'s.
    ///
    /// ```
    /// use ratelimit_core::{Algorithm, Limits, Rate};
    ///
    /// let limits = Limits { rate: Rate::parse("0.001r/d").unwrap(), burst: 300 };
    /// assert_eq!(
    ///     limits.check_bucket(Algorithm::LeakyBucket).unwrap_err().to_string(),
    ///     "burst 300 is too large for rate \"0.001r/d\" \
    ///      (at most 35: a leaky_bucket must drain within 100 years)"
    /// );
    /// ```
    pub fn check_bucket(&self, algorithm: Algorithm) -> Result<(), SpecError> {
        if !algorithm.takes_burst() {
            return Ok(());
        }
        let max = Limits::max_burst(algorithm, &self.rate);
        if self.burst <= max {
            return Ok(());
        }
        Err(SpecError::BurstTooLarge {
            burst: self.burst,
            rate: self.rate,
            max,
            algorithm,
        })
    }

    /// One `u64` (40 bits of `milli_requests`, 2 of unit, 22 of burst) so that shared memory
    /// can swap a zone's whole limit atomically. `0` never results from a valid `Limits`.
    ///
    /// Out-of-range fields (not produced by the parsers) are clamped: `milli_requests` to
    /// `1..=Rate::MAX_MILLI_REQUESTS`, `burst` to `MAX_BURST`.
    pub fn pack(&self) -> u64 {
        let milli = self.rate.milli_requests.clamp(1, Rate::MAX_MILLI_REQUESTS);
        let unit = match self.rate.unit {
            RateUnit::Second => 0,
            RateUnit::Minute => 1,
            RateUnit::Hour => 2,
            RateUnit::Day => 3,
        };
        let burst = self.burst.min(Limits::MAX_BURST);
        (milli << 24) | (unit << 22) | burst
    }

    /// Inverse of [`Limits::pack`]; `None` for a word that no valid `Limits` packs to.
    pub fn unpack(word: u64) -> Option<Limits> {
        let milli_requests = word >> 24;
        if milli_requests == 0 {
            return None;
        }
        let unit = match (word >> 22) & 0b11 {
            0 => RateUnit::Second,
            1 => RateUnit::Minute,
            2 => RateUnit::Hour,
            _ => RateUnit::Day,
        };
        Some(Limits {
            rate: Rate {
                milli_requests,
                unit,
            },
            burst: word & Limits::MAX_BURST,
        })
    }
}

/// How a `rate_limit` treats excess within the burst (leaky bucket only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DelayMode {
    /// Delay every excess request (limit_req's default).
    Delay,
    /// `nodelay`: serve every request within the burst at once.
    NoDelay,
    /// `delay=N`: the first N excess requests go at once, the rest are delayed.
    Threshold(u64),
}

/// Everything one decision needs: the zone's algorithm, the effective limits (zone, location
/// or per-key override), the delay mode and the request's cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// The zone's algorithm.
    pub algorithm: Algorithm,
    /// The limits in force for this key.
    pub limits: Limits,
    /// How excess within the burst is treated (leaky bucket only).
    pub delay: DelayMode,
    /// How many requests this request counts as (`cost=N`, default 1, at least 1).
    pub cost: u64,
}

/// The period a decision is made in: its tag and its end, on the clock of the `now_ns` the
/// decision gets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct QuotaWindow {
    /// [`QuotaWindow::tag_of`] the period's index; 0 before one is known (a policy made
    /// without a clock, such as the eviction's: every state then counts as fresh).
    pub tag: u64,
    /// The first instant of the next period, in nanoseconds on the caller's clock.
    pub end_ns: u64,
}

/// A non-negative decimal integer, digits only (no sign, no spaces), like nginx's `ngx_atoi`.
pub(crate) fn parse_integer(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}
