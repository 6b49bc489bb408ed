//! `GET zones/NAME/history`: the zone's requests per second over the last minutes, kept by
//! the zone itself (`ratelimit_core::history`), so that a page opened now draws the same chart
//! as one left open for an hour, in every browser.

use ratelimit_core::history::SECONDS;
use serde::Serialize;

/// A zone's per-second counts, oldest first; the last second is the current one, still
/// running.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    /// The wall-clock time of the last (current) second, in seconds since the Unix epoch.
    pub end_unix_s: u64,
    pub passed: Vec<u64>,
    /// Delayed requests, dry-run ones included (as the dashboard's totals count them).
    pub delayed: Vec<u64>,
    /// Rejected requests, dry-run ones included.
    pub rejected: Vec<u64>,
}

/// The answer's JSON.
#[derive(Serialize)]
pub struct HistoryJson<'a> {
    zone: &'a str,
    /// Seconds each series covers, one count per second.
    seconds: usize,
    /// Unix time of the last count's second (the current one, still running).
    end: u64,
    passed: &'a [u64],
    delayed: &'a [u64],
    rejected: &'a [u64],
}

impl<'a> HistoryJson<'a> {
    pub fn new(zone: &'a str, history: &'a History) -> HistoryJson<'a> {
        HistoryJson {
            zone,
            seconds: SECONDS,
            end: history.end_unix_s,
            passed: &history.passed,
            delayed: &history.delayed,
            rejected: &history.rejected,
        }
    }
}
