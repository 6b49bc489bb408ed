//! The keys limited most: a bounded heavy-hitters summary per decision kind and window.
//!
//! Each summary is the *space-saving* algorithm (Metwally, Agrawal, El Abbadi 2005) over
//! [`TOP_CAPACITY`] counters: a key already counted gets its count raised; a new key takes a
//! free counter, or else replaces the counter with the smallest count and inherits that count
//! as its `error`. For a stream of `total` requests it guarantees, for every key it shows,
//!
//! ```text
//! count - error <= true count <= count,    error <= total / TOP_CAPACITY
//! ```
//!
//! and every key whose true count is above `total / TOP_CAPACITY` is shown.
//!
//! A window ("the last minute") is a ring of sub-windows, one summary each, keyed by the
//! period number `now_ns / sub_window_ns`; a summary whose period is past is cleared when its
//! ring position comes round again. A query merges the summaries of the last `N` periods (the
//! current one being partly elapsed, a window covers between `N - 1` and `N` sub-windows of
//! time: the last minute is the last 50 to 60 seconds). Merged, a key's `count` is the sum of
//! its counts where it is shown, and `error` bounds the difference both ways:
//!
//! ```text
//! count - error <= true count <= count + error,    error <= window total / TOP_CAPACITY
//! ```
//!
//! (below: the errors of the summaries that show it; above: the smallest count of each full
//! summary that does not). A key above `total / TOP_CAPACITY` in the window is above its share
//! in at least one sub-window, so it is still shown.
//!
//! Every type here is plain integers, `#[repr(C)]`, and all-zero bytes are the empty state, so
//! the nginx module keeps a [`TopKeys`] in shared memory as is. Any bit pattern is a valid
//! state: a writer killed halfway through an update leaves at worst one entry with a wrong
//! count or key text, never an out-of-bounds length.
//!
//! ```
//! use ratelimit_core::top::{TopKeys, TopKind, TopWindow};
//!
//! let mut top = Box::new(TopKeys::EMPTY);
//! let now_ns = 5_000_000_000;
//! for _ in 0..3 {
//!     top.record(TopKind::Rejected, now_ns, 1, b"10.0.0.1");
//! }
//! top.record(TopKind::Rejected, now_ns, 2, b"10.0.0.2");
//! let shown = top.top(TopKind::Rejected, TopWindow::OneMinute, now_ns, 10);
//! assert_eq!(shown[0].key, b"10.0.0.1");
//! assert_eq!((shown[0].count, shown[0].error), (3, 0));
//! assert_eq!(shown.len(), 2);
//! assert!(top.top(TopKind::Delayed, TopWindow::OneMinute, now_ns, 10).is_empty());
//! ```

use crate::rate::NANOS_PER_SEC;

/// Counters per summary: a summary's counts are within `total / TOP_CAPACITY` of the truth.
pub const TOP_CAPACITY: usize = 16;
/// Bytes of a key's text kept; longer keys are shown cut to this length (`truncated`).
pub const TOP_KEY_BYTES: usize = 60;

/// One counter of a summary. `count == 0` marks a free counter.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TopEntry {
    /// The key's hash (the caller's, e.g. the zone's seeded hash): what identifies the key.
    pub hash: u64,
    /// Requests (or tokens) counted for the key since it took this counter, plus `error`.
    /// 64 bits: a key's tokens in ten minutes may pass 2^32.
    pub count: u64,
    /// Count this entry inherited from the key it replaced (an upper bound of the overcount).
    pub error: u64,
    /// The key's full length; only the first [`TOP_KEY_BYTES`] are kept.
    pub key_len: u32,
    /// The key's first bytes.
    pub key: [u8; TOP_KEY_BYTES],
}

impl TopEntry {
    const EMPTY: TopEntry = TopEntry {
        hash: 0,
        count: 0,
        error: 0,
        key_len: 0,
        key: [0; TOP_KEY_BYTES],
    };

    fn set_key(&mut self, hash: u64, key: &[u8]) {
        self.hash = hash;
        let kept = key.len().min(TOP_KEY_BYTES);
        self.key[..kept].copy_from_slice(&key[..kept]);
        self.key_len = u32::try_from(key.len()).unwrap_or(u32::MAX);
    }

    /// The kept bytes of the key (a torn length is clamped to the array).
    fn key_bytes(&self) -> &[u8] {
        let len = (self.key_len as usize).min(TOP_KEY_BYTES);
        &self.key[..len]
    }
}

/// One space-saving summary: the requests of one sub-window.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Summary {
    /// `now_ns / sub_window_ns + 1` of the sub-window counted here; 0 for never used.
    pub period: u64,
    /// Requests counted (the sum of the true counts).
    pub total: u64,
    /// The counters, in no order.
    pub entries: [TopEntry; TOP_CAPACITY],
}

impl Summary {
    /// A summary with no request counted.
    pub const EMPTY: Summary = Summary {
        period: 0,
        total: 0,
        entries: [TopEntry::EMPTY; TOP_CAPACITY],
    };

    /// Count one request of `key` (identified by `hash`).
    pub fn record(&mut self, hash: u64, key: &[u8]) {
        self.record_amount(hash, key, 1);
    }

    /// Count `amount` (a request's tokens) for `key`: the weighted space-saving algorithm,
    /// whose bounds are those of the module documentation with `total` the sum of the
    /// amounts. An amount of 0 counts nothing.
    pub fn record_amount(&mut self, hash: u64, key: &[u8], amount: u64) {
        if amount == 0 {
            return;
        }
        self.total = self.total.saturating_add(amount);
        if let Some(entry) = self
            .entries
            .iter_mut()
            .find(|entry| entry.count > 0 && entry.hash == hash)
        {
            entry.count = entry.count.saturating_add(amount);
            return;
        }
        // A free counter, else the smallest: the key inherits its count as error.
        let Some(entry) = self.entries.iter_mut().min_by_key(|entry| entry.count) else {
            return;
        };
        entry.error = entry.count;
        entry.count = entry.count.saturating_add(amount);
        entry.set_key(hash, key);
    }

    /// Whether every counter is taken: a key it does not show may then have been counted
    /// up to [`Summary::min_count`] times.
    pub fn is_full(&self) -> bool {
        self.entries.iter().all(|entry| entry.count > 0)
    }

    /// The smallest count shown (0 when a counter is free).
    pub fn min_count(&self) -> u64 {
        self.entries
            .iter()
            .map(|entry| entry.count)
            .min()
            .unwrap_or(0)
    }

    fn live(&self) -> impl Iterator<Item = &TopEntry> {
        self.entries.iter().filter(|entry| entry.count > 0)
    }
}

/// Which decisions a summary counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopKind {
    /// Requests refused (`429`), dry-run refusals included.
    Rejected,
    /// Requests delayed, dry-run delays included.
    Delayed,
    /// Requests refused because their key was blocked (`block=`), dry-run ones included.
    Blocked,
    /// Tokens a usage-based line settled (`usage=`): what each request used, not a count of
    /// requests.
    Tokens,
}

impl TopKind {
    /// `rejected`, `delayed`, `blocked` or `tokens`, as the admin API's `by=` names them.
    pub fn parse(text: &str) -> Option<TopKind> {
        match text {
            "rejected" => Some(TopKind::Rejected),
            "delayed" => Some(TopKind::Delayed),
            "blocked" => Some(TopKind::Blocked),
            "tokens" => Some(TopKind::Tokens),
            _ => None,
        }
    }

    /// The name `parse` reads.
    pub fn name(self) -> &'static str {
        match self {
            TopKind::Rejected => "rejected",
            TopKind::Delayed => "delayed",
            TopKind::Blocked => "blocked",
            TopKind::Tokens => "tokens",
        }
    }
}

/// The span a query covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopWindow {
    /// The last minute: 6 sub-windows of 10 seconds.
    OneMinute,
    /// The last ten minutes: 10 sub-windows of 60 seconds.
    TenMinutes,
}

impl TopWindow {
    /// `1m` or `10m`, as the admin API's `window=` names them.
    pub fn parse(text: &str) -> Option<TopWindow> {
        match text {
            "1m" => Some(TopWindow::OneMinute),
            "10m" => Some(TopWindow::TenMinutes),
            _ => None,
        }
    }

    /// The name `parse` reads.
    pub fn name(self) -> &'static str {
        match self {
            TopWindow::OneMinute => "1m",
            TopWindow::TenMinutes => "10m",
        }
    }

    /// Length of one sub-window.
    pub fn sub_window_ns(self) -> u64 {
        match self {
            TopWindow::OneMinute => 10 * NANOS_PER_SEC,
            TopWindow::TenMinutes => 60 * NANOS_PER_SEC,
        }
    }
}

/// The summaries of one decision kind: a ring per window.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KindSummaries {
    /// Ring of 10-second sub-windows.
    pub one_minute: [Summary; 6],
    /// Ring of 60-second sub-windows.
    pub ten_minutes: [Summary; 10],
}

impl KindSummaries {
    const EMPTY: KindSummaries = KindSummaries {
        one_minute: [Summary::EMPTY; 6],
        ten_minutes: [Summary::EMPTY; 10],
    };

    fn ring(&self, window: TopWindow) -> &[Summary] {
        match window {
            TopWindow::OneMinute => &self.one_minute,
            TopWindow::TenMinutes => &self.ten_minutes,
        }
    }

    fn ring_mut(&mut self, window: TopWindow) -> &mut [Summary] {
        match window {
            TopWindow::OneMinute => &mut self.one_minute,
            TopWindow::TenMinutes => &mut self.ten_minutes,
        }
    }
}

/// Everything a zone keeps about its most limited keys and its heaviest token users (89
/// KiB).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TopKeys {
    /// Requests rejected.
    pub rejected: KindSummaries,
    /// Requests delayed.
    pub delayed: KindSummaries,
    /// Requests refused because their key was blocked.
    pub blocked: KindSummaries,
    /// Tokens settled by usage-based lines.
    pub tokens: KindSummaries,
}

/// One key of a query's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopCount {
    /// The key's text, cut at [`TOP_KEY_BYTES`].
    pub key: Vec<u8>,
    /// Whether `key` was cut.
    pub truncated: bool,
    /// Requests counted (see `error`).
    pub count: u64,
    /// The true count is within `count ± error` (see the module documentation).
    pub error: u64,
}

impl TopKeys {
    /// Nothing counted; the same as all-zero memory.
    pub const EMPTY: TopKeys = TopKeys {
        rejected: KindSummaries::EMPTY,
        delayed: KindSummaries::EMPTY,
        blocked: KindSummaries::EMPTY,
        tokens: KindSummaries::EMPTY,
    };

    fn kind(&self, kind: TopKind) -> &KindSummaries {
        match kind {
            TopKind::Rejected => &self.rejected,
            TopKind::Delayed => &self.delayed,
            TopKind::Blocked => &self.blocked,
            TopKind::Tokens => &self.tokens,
        }
    }

    fn kind_mut(&mut self, kind: TopKind) -> &mut KindSummaries {
        match kind {
            TopKind::Rejected => &mut self.rejected,
            TopKind::Delayed => &mut self.delayed,
            TopKind::Blocked => &mut self.blocked,
            TopKind::Tokens => &mut self.tokens,
        }
    }

    /// Count one request of `key` (identified by `hash`) decided as `kind` at `now_ns`, in
    /// both windows.
    pub fn record(&mut self, kind: TopKind, now_ns: u64, hash: u64, key: &[u8]) {
        self.record_amount(kind, now_ns, hash, key, 1);
    }

    /// Count `amount` for `key` as `kind` at `now_ns` (a request's tokens, for
    /// [`TopKind::Tokens`]), in both windows.
    pub fn record_amount(
        &mut self,
        kind: TopKind,
        now_ns: u64,
        hash: u64,
        key: &[u8],
        amount: u64,
    ) {
        let summaries = self.kind_mut(kind);
        for window in [TopWindow::OneMinute, TopWindow::TenMinutes] {
            record_in_ring(
                summaries.ring_mut(window),
                window.sub_window_ns(),
                now_ns,
                hash,
                key,
                amount,
            );
        }
    }

    /// The `limit` keys with the highest counts of `kind` over `window` at `now_ns`, highest
    /// first (ties by key text).
    pub fn top(
        &self,
        kind: TopKind,
        window: TopWindow,
        now_ns: u64,
        limit: usize,
    ) -> Vec<TopCount> {
        top_of_ring(
            self.kind(kind).ring(window),
            window.sub_window_ns(),
            now_ns,
            limit,
        )
    }

    /// Requests of `kind` counted over `window` at `now_ns`.
    pub fn total(&self, kind: TopKind, window: TopWindow, now_ns: u64) -> u64 {
        let sub_window_ns = window.sub_window_ns();
        let ring = self.kind(kind).ring(window);
        current_summaries(ring, sub_window_ns, now_ns)
            .map(|summary| summary.total)
            .sum()
    }
}

fn period_of(now_ns: u64, sub_window_ns: u64) -> u64 {
    now_ns / sub_window_ns.max(1) + 1
}

/// Count a request in the ring's summary for `now_ns`, clearing it first if it holds an
/// older period.
pub fn record_in_ring(
    ring: &mut [Summary],
    sub_window_ns: u64,
    now_ns: u64,
    hash: u64,
    key: &[u8],
    amount: u64,
) {
    if ring.is_empty() || amount == 0 {
        return;
    }
    let period = period_of(now_ns, sub_window_ns);
    let summary = &mut ring[(period % ring.len() as u64) as usize];
    if summary.period != period {
        // A summary from the future (a torn period) is cleared too: periods only grow.
        *summary = Summary::EMPTY;
        summary.period = period;
    }
    summary.record_amount(hash, key, amount);
}

/// The ring's summaries that belong to the window ending at `now_ns`.
fn current_summaries(
    ring: &[Summary],
    sub_window_ns: u64,
    now_ns: u64,
) -> impl Iterator<Item = &Summary> {
    let period = period_of(now_ns, sub_window_ns);
    let span = ring.len() as u64;
    ring.iter()
        .filter(move |summary| summary.period != 0 && summary.period <= period)
        .filter(move |summary| period - summary.period < span)
}

/// Merge the ring's current summaries and keep the `limit` highest counts.
pub fn top_of_ring(
    ring: &[Summary],
    sub_window_ns: u64,
    now_ns: u64,
    limit: usize,
) -> Vec<TopCount> {
    let summaries: Vec<&Summary> = current_summaries(ring, sub_window_ns, now_ns).collect();
    // Each key once, with the text of its first sighting.
    let mut keys: Vec<&TopEntry> = Vec::new();
    for summary in &summaries {
        for entry in summary.live() {
            if !keys.iter().any(|seen| seen.hash == entry.hash) {
                keys.push(entry);
            }
        }
    }
    let mut counts: Vec<TopCount> = keys
        .iter()
        .map(|key| merged_count(&summaries, key))
        .collect();
    counts.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
    counts.truncate(limit);
    counts
}

fn merged_count(summaries: &[&Summary], key: &TopEntry) -> TopCount {
    let mut count = 0u64;
    let mut below = 0u64;
    let mut above = 0u64;
    for summary in summaries {
        match summary.live().find(|entry| entry.hash == key.hash) {
            Some(entry) => {
                count = count.saturating_add(entry.count);
                below = below.saturating_add(entry.error.min(entry.count));
            }
            None if summary.is_full() => above = above.saturating_add(summary.min_count()),
            None => {}
        }
    }
    TopCount {
        key: key.key_bytes().to_vec(),
        truncated: key.key_len as usize > TOP_KEY_BYTES,
        count,
        error: below.max(above),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = NANOS_PER_SEC;

    fn record(top: &mut TopKeys, kind: TopKind, at_sec: u64, key: &str) {
        top.record(kind, at_sec * SEC, hash(key), key.as_bytes());
    }

    fn hash(key: &str) -> u64 {
        // FNV-1a: any fixed hash does for the tests.
        key.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        })
    }

    fn shown(top: &TopKeys, kind: TopKind, window: TopWindow, at_sec: u64) -> Vec<(String, u64)> {
        top.top(kind, window, at_sec * SEC, 100)
            .into_iter()
            .map(|c| (String::from_utf8(c.key).unwrap(), c.count))
            .collect()
    }

    #[test]
    fn zeroed_memory_is_empty() {
        let top = TopKeys::EMPTY;
        assert!(top
            .rejected
            .one_minute
            .iter()
            .all(|s| s.period == 0 && s.total == 0));
        assert!(top
            .top(TopKind::Rejected, TopWindow::OneMinute, 0, 10)
            .is_empty());
        assert_eq!(core::mem::size_of::<TopEntry>(), 88);
        assert_eq!(core::mem::size_of::<TopKeys>(), 4 * 16 * (16 + 16 * 88));
    }

    #[test]
    fn exact_while_keys_fit() {
        // (second, key) rows; then the expected list per window at second 59.
        let rows = [
            (0, "a"),
            (1, "b"),
            (1, "a"),
            (15, "a"),
            (30, "c"),
            (59, "b"),
            (59, "a"),
        ];
        let mut top = Box::new(TopKeys::EMPTY);
        for (at, key) in rows {
            record(&mut top, TopKind::Rejected, at, key);
        }
        let expected: Vec<(String, u64)> = vec![("a".into(), 4), ("b".into(), 2), ("c".into(), 1)];
        assert_eq!(
            shown(&top, TopKind::Rejected, TopWindow::OneMinute, 59),
            expected
        );
        assert_eq!(
            shown(&top, TopKind::Rejected, TopWindow::TenMinutes, 59),
            expected
        );
        assert!(shown(&top, TopKind::Delayed, TopWindow::OneMinute, 59).is_empty());
        assert_eq!(
            top.total(TopKind::Rejected, TopWindow::OneMinute, 59 * SEC),
            7
        );
        let errors: Vec<u64> = top
            .top(TopKind::Rejected, TopWindow::OneMinute, 59 * SEC, 10)
            .iter()
            .map(|c| c.error)
            .collect();
        assert_eq!(errors, [0, 0, 0]);
    }

    #[test]
    fn windows_forget_old_periods() {
        let mut top = Box::new(TopKeys::EMPTY);
        record(&mut top, TopKind::Delayed, 0, "old");
        let keys_at = |top: &TopKeys, window, at| -> Vec<String> {
            shown(top, TopKind::Delayed, window, at)
                .into_iter()
                .map(|(key, _)| key)
                .collect()
        };
        assert_eq!(keys_at(&top, TopWindow::OneMinute, 9), ["old"]);
        assert_eq!(keys_at(&top, TopWindow::OneMinute, 59), ["old"]);
        // Second 60 starts the seventh sub-window: "old"'s (0..10 s) is out.
        assert!(keys_at(&top, TopWindow::OneMinute, 60).is_empty());
        record(&mut top, TopKind::Delayed, 65, "new");
        assert_eq!(keys_at(&top, TopWindow::OneMinute, 66), ["new"]);
        assert_eq!(keys_at(&top, TopWindow::TenMinutes, 599), ["new", "old"]);
        assert_eq!(keys_at(&top, TopWindow::TenMinutes, 600), ["new"]);
        // Second 65's ring position (period 7) was second 0's: "old" went when "new" came.
        record(&mut top, TopKind::Delayed, 66, "again");
        assert_eq!(
            shown(&top, TopKind::Delayed, TopWindow::OneMinute, 66),
            [("again".to_string(), 1), ("new".to_string(), 1)]
        );
    }

    #[test]
    fn long_keys_are_cut() {
        let mut top = Box::new(TopKeys::EMPTY);
        let long = "k".repeat(100);
        record(&mut top, TopKind::Rejected, 1, &long);
        let got = top.top(TopKind::Rejected, TopWindow::OneMinute, SEC, 1);
        assert_eq!(got[0].key.len(), TOP_KEY_BYTES);
        assert!(got[0].truncated);
    }

    #[test]
    fn replacing_the_smallest_inherits_its_count() {
        let mut summary = Summary::EMPTY;
        for n in 0..TOP_CAPACITY as u64 {
            summary.record(n + 1, b"x");
            summary.record(n + 1, b"x");
        }
        summary.record(1, b"x");
        summary.record(999, b"new");
        let new = summary.entries.iter().find(|e| e.hash == 999).unwrap();
        assert_eq!((new.count, new.error), (3, 2));
        assert_eq!(summary.total, 2 * TOP_CAPACITY as u64 + 2);
    }

    /// Tokens: each request counts what it used; the heaviest user first, whatever the
    /// number of its requests; a summary full of them replaces its smallest and inherits its
    /// amount as error; 0 tokens count nothing.
    #[test]
    fn tokens_count_amounts() {
        let mut top = Box::new(TopKeys::EMPTY);
        let now = 5 * SEC;
        for _ in 0..10 {
            top.record_amount(TopKind::Tokens, now, hash("many"), b"many", 30);
        }
        top.record_amount(TopKind::Tokens, now, hash("one"), b"one", 4_000);
        top.record_amount(TopKind::Tokens, now, hash("none"), b"none", 0);
        assert_eq!(
            shown(&top, TopKind::Tokens, TopWindow::OneMinute, 5),
            [("one".to_string(), 4_000), ("many".to_string(), 300)]
        );
        assert_eq!(
            top.total(TopKind::Tokens, TopWindow::TenMinutes, now),
            4_300
        );
        assert!(shown(&top, TopKind::Rejected, TopWindow::OneMinute, 5).is_empty());
        let mut summary = Summary::EMPTY;
        for n in 0..TOP_CAPACITY as u64 {
            summary.record_amount(n + 1, b"x", 100 + n);
        }
        summary.record_amount(999, b"new", 7);
        let new = summary.entries.iter().find(|e| e.hash == 999).unwrap();
        assert_eq!((new.count, new.error), (107, 100));
        // Past 2^32, and saturating instead of wrapping.
        summary.record_amount(999, b"new", u64::from(u32::MAX));
        let new = summary.entries.iter().find(|e| e.hash == 999).unwrap();
        assert_eq!(new.count, 107 + u64::from(u32::MAX));
        summary.record_amount(999, b"new", u64::MAX);
        summary.record_amount(999, b"new", u64::MAX);
        let new = summary.entries.iter().find(|e| e.hash == 999).unwrap();
        assert_eq!((new.count, summary.total), (u64::MAX, u64::MAX));
    }

    #[test]
    fn torn_state_is_read_safely() {
        let mut top = Box::new(TopKeys::EMPTY);
        record(&mut top, TopKind::Rejected, 1, "a");
        // A writer killed mid-update: an impossible length and a period from the future.
        // Second 1 is period 1, at ring position 1.
        top.rejected.one_minute[1].entries[0].key_len = u32::MAX;
        top.rejected.one_minute[2].period = u64::MAX;
        top.rejected.one_minute[2].entries[0].count = 5;
        let got = top.top(TopKind::Rejected, TopWindow::OneMinute, SEC, 10);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].key.len(), TOP_KEY_BYTES);
        record(&mut top, TopKind::Rejected, 11, "b");
        assert_eq!(top.rejected.one_minute[2].period, 2);
        assert_eq!(top.rejected.one_minute[2].total, 1);
    }
}
