//! `GET zones/NAME/top?by=rejected|delayed&window=1m|10m&limit=N`: the query's parameters and
//! the answer's JSON. The counts come from the zone's summaries (`ratelimit_core::top`).

use ratelimit_core::key_form::KeyForm;
use ratelimit_core::top::{TopCount, TopKind, TopWindow, TOP_CAPACITY, TOP_KEY_BYTES};
use serde::Serialize;

use crate::error::ApiError;
use crate::percent::percent_decode;

/// Keys shown when `limit=` is not given.
pub const DEFAULT_LIMIT: usize = 10;
/// Most keys a query may ask for.
pub const MAX_LIMIT: usize = 100;

/// What a top query asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TopQuery {
    pub kind: TopKind,
    pub window: TopWindow,
    pub limit: usize,
}

impl Default for TopQuery {
    fn default() -> TopQuery {
        TopQuery {
            kind: TopKind::Rejected,
            window: TopWindow::OneMinute,
            limit: DEFAULT_LIMIT,
        }
    }
}

/// Parse a query string (`by=delayed&limit=5`); every parameter is optional, an unknown one
/// or a bad value is an error that names it.
///
/// ```
/// use ratelimit_admin::top::parse_query;
/// use ratelimit_core::top::{TopKind, TopWindow};
///
/// let query = parse_query(b"by=delayed&window=10m&limit=3").unwrap();
/// assert_eq!((query.kind, query.window, query.limit), (TopKind::Delayed, TopWindow::TenMinutes, 3));
/// assert_eq!(parse_query(b"").unwrap().limit, 10);
/// assert_eq!(
///     parse_query(b"window=5m").unwrap_err().to_string(),
///     "invalid window \"5m\": use 1m or 10m"
/// );
/// ```
pub fn parse_query(query: &[u8]) -> Result<TopQuery, ApiError> {
    let mut parsed = TopQuery::default();
    for pair in query.split(|&b| b == b'&').filter(|pair| !pair.is_empty()) {
        let (name, value) = match pair.iter().position(|&b| b == b'=') {
            Some(at) => (&pair[..at], &pair[at + 1..]),
            None => (pair, &b""[..]),
        };
        let value = String::from_utf8_lossy(&percent_decode(value)?).into_owned();
        match name {
            b"by" => {
                parsed.kind = TopKind::parse(&value).ok_or_else(|| {
                    ApiError::BadQuery(format!(
                        "invalid by \"{value}\": use rejected, delayed, blocked or tokens"
                    ))
                })?
            }
            b"window" => {
                parsed.window = TopWindow::parse(&value).ok_or_else(|| {
                    ApiError::BadQuery(format!("invalid window \"{value}\": use 1m or 10m"))
                })?
            }
            b"limit" => {
                parsed.limit = value
                    .parse()
                    .ok()
                    .filter(|limit| (1..=MAX_LIMIT).contains(limit))
                    .ok_or_else(|| {
                        ApiError::BadQuery(format!(
                            "invalid limit \"{value}\": use a number from 1 to {MAX_LIMIT}"
                        ))
                    })?
            }
            _ => {
                return Err(ApiError::BadQuery(format!(
                    "unknown parameter \"{}\": use by, window and limit",
                    String::from_utf8_lossy(name)
                )))
            }
        }
    }
    Ok(parsed)
}

/// A zone's answer to a top query.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopList {
    /// Highest count first.
    pub keys: Vec<TopCount>,
    /// Requests of the kind counted over the window, all keys together.
    pub total: u64,
}

/// The answer's body.
#[derive(Serialize)]
pub struct TopJson<'a> {
    pub zone: &'a str,
    pub by: &'static str,
    pub window: &'static str,
    pub total: u64,
    /// Counters per summary: each count is within `total / capacity` of the truth.
    pub capacity: usize,
    /// Bytes of key text kept.
    pub key_bytes: usize,
    pub keys: Vec<TopKeyJson>,
}

/// One key of [`TopJson`].
#[derive(Serialize)]
pub struct TopKeyJson {
    pub key: String,
    pub count: u64,
    /// The true count is within `count ± error`.
    pub error: u64,
    pub truncated: bool,
}

impl<'a> TopJson<'a> {
    /// `list`'s keys shown in the zone's `form`.
    pub fn new(zone: &'a str, query: &TopQuery, list: &TopList, form: KeyForm) -> TopJson<'a> {
        TopJson {
            zone,
            by: query.kind.name(),
            window: query.window.name(),
            total: list.total,
            capacity: TOP_CAPACITY,
            key_bytes: TOP_KEY_BYTES,
            keys: list
                .keys
                .iter()
                .map(|count| TopKeyJson {
                    key: form.show(&count.key),
                    count: count.count,
                    error: count.error,
                    truncated: count.truncated,
                })
                .collect(),
        }
    }
}
