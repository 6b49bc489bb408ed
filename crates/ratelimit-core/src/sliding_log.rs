//! TODO(helper): sliding window log.

use crate::{Decision, Limits, Policy};

/// Number of `u64` words a key's log needs for a zone allowing `max_requests` per window.
pub fn words_for(max_requests: u64) -> usize {
    let _ = max_requests;
    unimplemented!()
}

/// Decide one request against `log` (length `words_for(N)`, all zeros for a fresh key);
/// the log is changed only when the request passes.
pub fn decide(log: &mut [u64], now_ns: u64, policy: &Policy) -> Decision {
    let _ = (log, now_ns, policy);
    unimplemented!()
}

/// Like `decide` but changes nothing.
pub fn inspect(log: &[u64], now_ns: u64, policy: &Policy) -> Decision {
    let _ = (log, now_ns, policy);
    unimplemented!()
}

/// The earliest time at which `log` is equivalent to a fresh key.
pub fn idle_at_ns(log: &[u64], limits: &Limits) -> u64 {
    let _ = (log, limits);
    unimplemented!()
}
