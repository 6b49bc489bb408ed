//! The error bound of the top-keys summaries, under skewed loads of many keys.

use std::collections::HashMap;

use proptest::prelude::*;
use ratelimit_core::top::{Summary, TopKeys, TopKind, TopWindow, TOP_CAPACITY};
use ratelimit_core::NANOS_PER_SEC;

/// A Zipf-like key: small numbers are drawn far more often than large ones.
fn skewed_key(draw: u32, keys: u32) -> u64 {
    let x = f64::from(draw) / f64::from(u32::MAX);
    (x.powi(4) * f64::from(keys)) as u64
}

fn key_text(key: u64) -> Vec<u8> {
    format!("client-{key}").into_bytes()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// One summary: count - error <= true <= count, error <= total / K, and every key above
    /// total / K is shown.
    #[test]
    fn one_summary_bounds(draws in prop::collection::vec(any::<u32>(), 1..3000), keys in 17u32..5000) {
        let mut summary = Summary::EMPTY;
        let mut truth: HashMap<u64, u64> = HashMap::new();
        for draw in &draws {
            let key = skewed_key(*draw, keys);
            summary.record(key + 1, &key_text(key));
            *truth.entry(key + 1).or_default() += 1;
        }
        let total = draws.len() as u64;
        prop_assert_eq!(summary.total, total);
        for entry in summary.entries.iter().filter(|e| e.count > 0) {
            let real = truth[&entry.hash];
            prop_assert!(entry.count >= real);
            prop_assert!(entry.count - entry.error <= real);
            prop_assert!(entry.error <= total / TOP_CAPACITY as u64);
        }
        for (hash, real) in &truth {
            if *real > total / TOP_CAPACITY as u64 {
                prop_assert!(summary.entries.iter().any(|e| e.hash == *hash && e.count > 0));
            }
        }
    }

    /// A window merged from sub-windows, requests spread over more than a window of time:
    /// the true count over the window is within count ± error, error <= window total / K, and
    /// every key above window total / K is shown.
    #[test]
    fn merged_window_bounds(
        events in prop::collection::vec((any::<u32>(), 0u64..1500), 1..3000),
        keys in 17u32..3000,
        ten_minutes in any::<bool>(),
    ) {
        let window = if ten_minutes { TopWindow::TenMinutes } else { TopWindow::OneMinute };
        let mut events = events;
        events.sort_by_key(|(_, at_sec)| *at_sec);
        let mut top = Box::new(TopKeys::EMPTY);
        for (draw, at_sec) in &events {
            let key = skewed_key(*draw, keys);
            top.record(TopKind::Rejected, at_sec * NANOS_PER_SEC, key + 1, &key_text(key));
        }
        let now_sec = events.last().map_or(0, |(_, at)| *at);
        let sub_sec = window.sub_window_ns() / NANOS_PER_SEC;
        let spans = if ten_minutes { 10 } else { 6 };
        // The window: the sub-windows from (current period - spans + 1) on.
        let first_sec = (now_sec / sub_sec + 1).saturating_sub(spans) * sub_sec;
        let mut truth: HashMap<Vec<u8>, u64> = HashMap::new();
        for (draw, _) in events.iter().filter(|(_, at)| *at >= first_sec) {
            *truth.entry(key_text(skewed_key(*draw, keys))).or_default() += 1;
        }
        let total: u64 = truth.values().sum();
        let now_ns = now_sec * NANOS_PER_SEC;
        prop_assert_eq!(top.total(TopKind::Rejected, window, now_ns), total);
        let shown = top.top(TopKind::Rejected, window, now_ns, usize::MAX);
        for count in &shown {
            let real = truth.get(&count.key).copied().unwrap_or(0);
            prop_assert!(count.count.saturating_sub(count.error) <= real, "{count:?} real {real}");
            prop_assert!(real <= count.count + count.error, "{count:?} real {real}");
            prop_assert!(count.error <= total / TOP_CAPACITY as u64);
        }
        for (key, real) in &truth {
            if *real > total / TOP_CAPACITY as u64 {
                prop_assert!(shown.iter().any(|c| &c.key == key), "{real} of {total} not shown");
            }
        }
    }
}

/// A heavy hitter among 10 000 one-off keys: shown first, with a count within its bound.
#[test]
fn one_heavy_key_among_many() {
    let mut top = Box::new(TopKeys::EMPTY);
    let now_ns = 30 * NANOS_PER_SEC;
    for n in 0..10_000u64 {
        top.record(TopKind::Delayed, now_ns, n + 100, &key_text(n + 100));
        if n % 10 == 0 {
            top.record(TopKind::Delayed, now_ns, 1, b"attacker");
        }
    }
    let shown = top.top(TopKind::Delayed, TopWindow::OneMinute, now_ns, 3);
    assert_eq!(shown[0].key, b"attacker");
    assert!(shown[0].count >= 1000 && shown[0].count - shown[0].error <= 1000);
    assert!(shown[0].error <= 11_000 / TOP_CAPACITY as u64);
}
