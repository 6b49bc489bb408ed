//! The replay tool's reading of its input: access logs in an nginx `log_format`
//! ([`log_format`]) and timelines ([`input`]), and the replay of a usage-based limit
//! ([`replay_usage`]). The decisions are `ratelimit_core`'s (its `replay` engine and
//! `usage::settle`), the arithmetic the module runs; only the tool reads logs, so the reading
//! lives here.

#![forbid(unsafe_code)]

pub mod input;
pub mod log_format;
pub mod replay_usage;

/// The replay as the tool sees it: its input read here, its engine `ratelimit_core`'s.
pub mod replay {
    pub use crate::input::*;
    pub use ratelimit_core::replay::*;
}
