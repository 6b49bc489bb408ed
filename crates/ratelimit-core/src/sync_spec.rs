//! The words of `rate_limit_sync`:
//!
//! ```text
//! rate_limit_sync redis://[user:password@]host:port[/db] [redis://…]… [cluster]
//!                 [interval=100ms] [timeout=50ms] [prefix=rl:] [on_failure=local_share|open|closed];
//! ```
//!
//! The URLs are only recognised here by their scheme; the module checks them with the Redis
//! client, which knows every form it accepts.

use thiserror::Error;

/// What happens once the store has been unreachable for [`SyncSpec::FAILED_AFTER_ROUNDS`]
/// intervals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnFailure {
    /// Each instance enforces `1 / N̂` of the limit, `N̂` the instances last seen alive.
    LocalShare,
    /// Each instance enforces the whole limit alone.
    Open,
    /// Every request of a sync zone is rejected.
    Closed,
}

impl OnFailure {
    /// The name used in the configuration and the admin API.
    pub fn as_str(self) -> &'static str {
        match self {
            OnFailure::LocalShare => "local_share",
            OnFailure::Open => "open",
            OnFailure::Closed => "closed",
        }
    }
}

/// An invalid `rate_limit_sync` word; each message quotes it.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SyncSpecError {
    /// `invalid parameter "foo"`
    #[error("invalid parameter \"{0}\"")]
    InvalidParameter(String),
    /// `invalid interval "interval=0"`
    #[error("invalid interval \"{0}\": it must be from 10ms to 60s")]
    InvalidInterval(String),
    /// `invalid timeout "timeout=5m"`
    #[error("invalid timeout \"{0}\": it must be from 1ms up to the interval")]
    InvalidTimeout(String),
    /// `invalid prefix "prefix="`
    #[error("invalid prefix \"{0}\"")]
    InvalidPrefix(String),
    /// `invalid on_failure "on_failure=maybe"`
    #[error("invalid on_failure \"{0}\": it must be local_share, open or closed")]
    InvalidOnFailure(String),
    /// No URL at all.
    #[error("\"rate_limit_sync\" must have a redis:// URL")]
    MissingUrl,
}

/// A parsed `rate_limit_sync`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncSpec {
    /// The `redis://` / `rediss://` URLs, as written.
    pub urls: Vec<String>,
    /// `cluster`: the URLs are seed nodes of a Redis Cluster.
    pub cluster: bool,
    /// `interval=`: how often the fleet state is exchanged.
    pub interval_ms: u64,
    /// `timeout=`: how long one exchange may take before it counts as missed.
    pub timeout_ms: u64,
    /// `prefix=`: the start of every Redis key.
    pub prefix: String,
    /// `on_failure=`.
    pub on_failure: OnFailure,
}

impl SyncSpec {
    /// Missed intervals after which the failure mode applies.
    pub const FAILED_AFTER_ROUNDS: u32 = 3;

    /// Parse the directive's arguments (without its name).
    ///
    /// ```
    /// use ratelimit_core::sync_spec::{OnFailure, SyncSpec};
    ///
    /// let spec = SyncSpec::parse_words(&["redis://127.0.0.1:6379", "interval=50ms"]).unwrap();
    /// assert_eq!((spec.interval_ms, spec.timeout_ms), (50, 25));
    /// assert_eq!(spec.on_failure, OnFailure::LocalShare);
    /// assert_eq!(spec.prefix, "rl:");
    /// ```
    pub fn parse_words(words: &[&str]) -> Result<SyncSpec, SyncSpecError> {
        let mut spec = SyncSpec {
            urls: Vec::new(),
            cluster: false,
            interval_ms: 100,
            timeout_ms: 0,
            prefix: "rl:".to_string(),
            on_failure: OnFailure::LocalShare,
        };
        let mut timeout = None;
        for &word in words {
            if word.starts_with("redis://") || word.starts_with("rediss://") {
                spec.urls.push(word.to_string());
            } else if word == "cluster" {
                spec.cluster = true;
            } else if let Some(value) = word.strip_prefix("interval=") {
                spec.interval_ms = parse_ms(value)
                    .filter(|ms| (10..=60_000).contains(ms))
                    .ok_or_else(|| SyncSpecError::InvalidInterval(word.into()))?;
            } else if let Some(value) = word.strip_prefix("timeout=") {
                timeout = Some((word, parse_ms(value)));
            } else if let Some(value) = word.strip_prefix("prefix=") {
                let printable = value.bytes().all(|byte| byte.is_ascii_graphic());
                if value.is_empty() || value.len() > 64 || !printable {
                    return Err(SyncSpecError::InvalidPrefix(word.into()));
                }
                spec.prefix = value.to_string();
            } else if let Some(value) = word.strip_prefix("on_failure=") {
                spec.on_failure = match value {
                    "local_share" => OnFailure::LocalShare,
                    "open" => OnFailure::Open,
                    "closed" => OnFailure::Closed,
                    _ => return Err(SyncSpecError::InvalidOnFailure(word.into())),
                };
            } else {
                return Err(SyncSpecError::InvalidParameter(word.into()));
            }
        }
        spec.timeout_ms = match timeout {
            None => (spec.interval_ms / 2).max(1),
            Some((word, ms)) => ms
                .filter(|&ms| ms >= 1 && ms <= spec.interval_ms)
                .ok_or_else(|| SyncSpecError::InvalidTimeout(word.into()))?,
        };
        if spec.urls.is_empty() {
            return Err(SyncSpecError::MissingUrl);
        }
        Ok(spec)
    }
}

/// `100ms`, `1s` or a bare number of milliseconds.
fn parse_ms(text: &str) -> Option<u64> {
    let (digits, scale) = if let Some(ms) = text.strip_suffix("ms") {
        (ms, 1)
    } else if let Some(s) = text.strip_suffix('s') {
        (s, 1000)
    } else {
        (text, 1)
    };
    if digits.is_empty() || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words() {
        let spec = SyncSpec::parse_words(&[
            "redis://a:1",
            "redis://b:2",
            "cluster",
            "interval=1s",
            "timeout=200",
            "prefix=x:",
            "on_failure=closed",
        ])
        .unwrap();
        assert_eq!(spec.urls, ["redis://a:1", "redis://b:2"]);
        assert!(spec.cluster);
        assert_eq!((spec.interval_ms, spec.timeout_ms), (1000, 200));
        assert_eq!(
            (spec.prefix.as_str(), spec.on_failure),
            ("x:", OnFailure::Closed)
        );
    }

    #[test]
    fn errors_quote_the_word() {
        #[rustfmt::skip]
        let rows: &[(&[&str], &str)] = &[
            (&["redis://a", "interval=5ms"], "invalid interval \"interval=5ms\": it must be from 10ms to 60s"),
            (&["redis://a", "interval=abc"], "invalid interval \"interval=abc\": it must be from 10ms to 60s"),
            (&["redis://a", "timeout=200ms"], "invalid timeout \"timeout=200ms\": it must be from 1ms up to the interval"),
            (&["redis://a", "on_failure=maybe"], "invalid on_failure \"on_failure=maybe\": it must be local_share, open or closed"),
            (&["redis://a", "prefix="], "invalid prefix \"prefix=\""),
            (&["redis://a", "http://b"], "invalid parameter \"http://b\""),
            (&["interval=1s"], "\"rate_limit_sync\" must have a redis:// URL"),
        ];
        for (words, message) in rows {
            let error = SyncSpec::parse_words(words).unwrap_err();
            assert_eq!(error.to_string(), *message, "{words:?}");
        }
    }
}
