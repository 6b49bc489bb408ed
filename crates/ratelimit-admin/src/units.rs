//! Durations as the JSON answers show them.

/// Nanoseconds to milliseconds with one decimal (a latency: `131.4`).
pub fn milliseconds_f(ns: u64) -> f64 {
    (ns / 100_000) as f64 / 10.0
}

/// Nanoseconds to whole milliseconds, rounded up (a wait of 1 ns is 1 ms, not 0).
pub fn milliseconds(ns: u64) -> u64 {
    ns.div_ceil(1_000_000)
}
