//! TODO(helper): see the crate docs.

use crate::{Decision, Limits, Policy};

/// Decide one request; `state` 0 is a fresh key. See [`crate::decide_word`].
pub fn decide(state: u64, now_ns: u64, policy: &Policy) -> (Decision, Option<u64>) {
    let _ = (state, now_ns, policy);
    unimplemented!()
}

/// The earliest time at which `state` is equivalent to a fresh key.
pub fn idle_at_ns(state: u64, limits: &Limits) -> u64 {
    let _ = (state, limits);
    unimplemented!()
}
