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

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod algorithm;
mod decide;
mod gcra;

#[cfg(test)]
mod equivalence;
#[cfg(test)]
mod fleet_simulation;
#[cfg(test)]
mod reference;

pub mod adaptive;
pub mod api_key;
pub mod block_table;
pub mod bucket_charge;
pub mod concurrency;
pub mod decision;
pub mod fleet;
pub mod fleet_blocks;
pub mod fleet_overrides;
pub mod fleet_quota;
pub mod fleet_round;
pub mod grpc;
pub mod hint;
pub mod history;
pub mod key;
pub mod key_form;
pub mod leaky_bucket;
pub mod lease;
pub mod penalty;
pub mod period;
pub mod policy;
pub mod quota;
pub mod rate;
pub mod replay;
pub mod sliding_log;
pub mod sliding_window;
pub mod spec;
pub mod sync_spec;
pub mod token_bucket;
pub mod top;
pub mod uncommit;
pub mod usage;

pub use bucket_charge::BucketCharge;
pub use decide::{
    decide_word, decide_words, rescale_word, standing_policy, word_idle_at_ns,
    word_idle_at_ns_near, words_idle_at_ns,
};
pub use decision::{Decision, Outcome};
pub use policy::{Algorithm, DelayMode, Limits, Policy, SpecError};
pub use rate::{Rate, RateUnit, NANOS_PER_SEC};
pub use spec::{LimitSpec, ZoneSpec};
