//! Rate limiting algorithms with no nginx and no clock inside.
//!
//! Every function takes the current time as `now_ns` (nanoseconds on any monotonic clock the
//! caller chooses; the nginx module uses `CLOCK_MONOTONIC`, the replay tool the timeline's own
//! seconds). States are plain integers or slices owned by the caller, so the module can keep
//! them in shared memory and update them with compare-and-swap, and the replay tool can keep
//! them in a `HashMap`.
//!
//! Nothing here panics on any input: arithmetic saturates, and a `now_ns` earlier than the
//! time stored in a state (two workers reading the clock in a different order) is treated as
//! "no time has passed".

#![warn(missing_docs)]

mod gcra;

pub mod decision;
pub mod leaky_bucket;
pub mod rate;
pub mod replay;
pub mod sliding_log;
pub mod sliding_window;
pub mod spec;
pub mod token_bucket;

pub use decision::{Decision, Outcome};
pub use rate::{Rate, RateUnit};
pub use spec::{Algorithm, DelayMode, LimitSpec, Limits, Policy, SpecError, ZoneSpec};

/// Nanoseconds in one second.
pub const NANOS_PER_SEC: u64 = 1_000_000_000;

/// Decide one request for the algorithms whose per-key state is a single `u64`
/// (`LeakyBucket`, `TokenBucket`, `SlidingWindow`).
///
/// `state == 0` is a key never seen. Returns the decision and, when the request is charged
/// (passed or delayed), the new state to store; `None` means "store nothing" (rejected).
/// For `SlidingLog` this returns a rejection with `retry_after_ns == 0`: use [`sliding_log`].
///
/// ```
/// use ratelimit_core::{decide_word, Algorithm, DelayMode, Outcome, Policy, ZoneSpec};
///
/// let zone = ZoneSpec::parse_words(&["rate=2r/s", "burst=1"]).unwrap();
/// let policy = Policy {
///     algorithm: zone.algorithm,
///     limits: zone.limits(),
///     delay: DelayMode::Delay,
///     cost: 1,
/// };
/// let (first, state) = decide_word(0, 0, &policy);
/// assert_eq!(first.outcome, Outcome::Passed);
/// // limit_req with burst=1: the second request at the same instant waits one interval.
/// let (second, state) = decide_word(state.unwrap(), 0, &policy);
/// assert_eq!((second.outcome, second.delay_ns), (Outcome::Delayed, 500_000_000));
/// let (third, none) = decide_word(state.unwrap(), 0, &policy);
/// assert_eq!((third.outcome, third.retry_after_ns, none), (Outcome::Rejected, 500_000_000, None));
/// ```
pub fn decide_word(state: u64, now_ns: u64, policy: &Policy) -> (Decision, Option<u64>) {
    match policy.algorithm {
        Algorithm::LeakyBucket => leaky_bucket::decide(state, now_ns, policy),
        Algorithm::TokenBucket => token_bucket::decide(state, now_ns, policy),
        Algorithm::SlidingWindow => sliding_window::decide(state, now_ns, policy),
        Algorithm::SlidingLog => (Decision::rejected(0, 0, 0), None),
    }
}

/// What a key looks like now, without charging anything: the same fields a decision for a
/// request of `policy.cost` would report, with `outcome` telling whether it would pass.
pub fn inspect_word(state: u64, now_ns: u64, policy: &Policy) -> Decision {
    decide_word(state, now_ns, policy).0
}

/// The earliest time at which a single-word state is indistinguishable from a fresh key
/// (`0`), so its slot can be reused without changing any future decision.
///
/// A `SlidingWindow` state keeps its window index modulo 2^24 only: without the current time
/// this is `u64::MAX` (never) for any state with counts; see [`word_idle_at_ns_near`].
/// `SlidingLog` has no single-word state: 0.
pub fn word_idle_at_ns(state: u64, limits: &Limits, algorithm: Algorithm) -> u64 {
    match algorithm {
        Algorithm::LeakyBucket => leaky_bucket::idle_at_ns(state, limits),
        Algorithm::TokenBucket => token_bucket::idle_at_ns(state, limits),
        Algorithm::SlidingWindow => sliding_window::idle_at_ns(state, limits),
        Algorithm::SlidingLog => 0,
    }
}

/// Like [`word_idle_at_ns`], but reading a `SlidingWindow` state's window index relative to
/// `now_ns` (as [`decide_word`] would), so that it too gets an exact time. A result at or
/// before `now_ns` means the state is equivalent to a fresh key already.
pub fn word_idle_at_ns_near(state: u64, limits: &Limits, algorithm: Algorithm, now_ns: u64) -> u64 {
    match algorithm {
        Algorithm::SlidingWindow => sliding_window::idle_at_ns_near(state, limits, now_ns),
        other => word_idle_at_ns(state, limits, other),
    }
}
