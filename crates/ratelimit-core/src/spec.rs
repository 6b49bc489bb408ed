//! The words of `rate_limit_zone` and `rate_limit`, parsed once for the nginx module and the
//! replay tool so that both read the same configuration the same way.

use std::fmt;

use crate::rate::Rate;

/// A configuration error; the text follows nginx's wording and quotes the bad token.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// `invalid rate "abc"`
    #[error("invalid rate \"{0}\"")]
    InvalidRate(String),
    /// `invalid burst value "burst=x"`
    #[error("invalid burst value \"{0}\"")]
    InvalidBurst(String),
    /// `invalid delay value "delay=x"`
    #[error("invalid delay value \"{0}\"")]
    InvalidDelay(String),
    /// `invalid cost value "cost=0"`
    #[error("invalid cost value \"{0}\"")]
    InvalidCost(String),
    /// `invalid zone size "zone=one:abc"`
    #[error("invalid zone size \"{0}\"")]
    InvalidZoneSize(String),
    /// `invalid zone name "zone=:1m"`
    #[error("invalid zone name \"{0}\"")]
    InvalidZoneName(String),
    /// `unknown algorithm "fast"`
    #[error("unknown algorithm \"{0}\"")]
    UnknownAlgorithm(String),
    /// `invalid parameter "foo"`
    #[error("invalid parameter \"{0}\"")]
    InvalidParameter(String),
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
}

/// Which algorithm a zone runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    LeakyBucket,
    TokenBucket,
    SlidingLog,
    SlidingWindow,
}

impl Algorithm {
    /// `leaky_bucket`, `token_bucket`, `sliding_log`, `sliding_window`.
    pub fn parse(text: &str) -> Result<Algorithm, SpecError> {
        match text {
            "leaky_bucket" => Ok(Algorithm::LeakyBucket),
            "token_bucket" => Ok(Algorithm::TokenBucket),
            "sliding_log" => Ok(Algorithm::SlidingLog),
            "sliding_window" => Ok(Algorithm::SlidingWindow),
            other => Err(SpecError::UnknownAlgorithm(other.to_string())),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::LeakyBucket => "leaky_bucket",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::SlidingWindow => "sliding_window",
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
    pub rate: Rate,
    /// leaky_bucket: excess requests allowed (limit_req's burst, default 0);
    /// token_bucket: bucket capacity (used as at least 1);
    /// sliding algorithms: unused (0).
    pub burst: u64,
}

impl Limits {
    /// Largest burst the packed form holds.
    pub const MAX_BURST: u64 = (1 << 22) - 1;

    /// One `u64` (40 bits of `milli_requests`, 2 of unit, 22 of burst) so that shared memory
    /// can swap a zone's whole limit atomically. `0` never results from a valid `Limits`.
    pub fn pack(&self) -> u64 {
        unimplemented!()
    }

    /// Inverse of [`Limits::pack`]; `None` for a word that no valid `Limits` packs to.
    pub fn unpack(word: u64) -> Option<Limits> {
        let _ = word;
        unimplemented!()
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
    pub algorithm: Algorithm,
    pub limits: Limits,
    pub delay: DelayMode,
    /// How many requests this request counts as (`cost=N`, default 1, at least 1).
    pub cost: u64,
}

/// The words of `rate_limit_zone` after KEY:
/// `zone=NAME:SIZE rate=RATE [burst=N] [algorithm=NAME]`.
/// The replay tool passes the same words without `zone=`, so `zone` is optional here and the
/// module reports its absence itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZoneSpec {
    /// `NAME` and `SIZE` in bytes (nginx size syntax: `10m`, `512k`, `65536`).
    pub zone: Option<(String, u64)>,
    pub rate: Rate,
    pub burst: Option<u64>,
    pub algorithm: Algorithm,
}

impl ZoneSpec {
    /// Largest N (requests per window) a `sliding_log` zone accepts: each key keeps N
    /// timestamps of 8 bytes.
    pub const MAX_SLIDING_LOG_REQUESTS: u64 = 4096;
    /// Largest N a `sliding_window` zone accepts (its counters are 20 bits wide).
    pub const MAX_SLIDING_WINDOW_REQUESTS: u64 = (1 << 20) - 1;

    /// Parse the words; checks a sliding algorithm's rate (whole, within its maximum) and
    /// that `burst` is not given for one.
    pub fn parse_words(words: &[&str]) -> Result<ZoneSpec, SpecError> {
        let _ = words;
        unimplemented!()
    }

    /// The limits this spec configures (burst defaults to 0).
    pub fn limits(&self) -> Limits {
        Limits { rate: self.rate, burst: self.burst.unwrap_or(0) }
    }
}

/// The words of `rate_limit`: `zone=NAME [burst=N] [nodelay | delay=N] [global=NAME] [cost=N]`.
/// `zone` is optional for the replay tool's `--limit`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitSpec {
    pub zone: Option<String>,
    pub burst: Option<u64>,
    pub delay: DelayMode,
    pub global: Option<String>,
    pub cost: u64,
}

impl LimitSpec {
    pub fn parse_words(words: &[&str]) -> Result<LimitSpec, SpecError> {
        let _ = words;
        unimplemented!()
    }
}

/// Parse an nginx size: `1024`, `64k`/`64K`, `10m`/`10M`, `1g`/`1G`.
pub fn parse_size(text: &str) -> Option<u64> {
    let _ = text;
    unimplemented!()
}
