//! The sync loop: one thread per nginx instance (in the worker that owns the election in
//! [`SyncShared`]), with a current-thread tokio runtime and the `redis` crate's multiplexed
//! connection over the loop's own bounded connections (`sync::link`). It never calls an
//! nginx API; it reads and writes shared memory only.
//!
//! Each round: scan the sync zones' entries for keys that need the fleet (`urgency`: a
//! refused request, or a pending delta over half of what the instance may take alone), take
//! the most urgent ones up to the round's budget (their pending deltas swapped out atomically,
//! so a delta is sent by exactly one loop even when two overlap across a reload; keys evicted
//! since the last round come from the orphan ring), and send one pipeline per node: the
//! heartbeat, each zone's limits and overrides, and the keys in batches of one script call per
//! hash-tag group. From the replies, each checked against bounds computed here, set each key's
//! grant and settle its local state (`ratelimit_core::fleet`). A round that fails or times out
//! puts the deltas back in their entries (merged with what came since), grants from shares,
//! and the rounds after it send no key until Redis answers again.
//!
//! The files follow a round: `take` (the keys chosen, their deltas taken), `commands` (the
//! pipeline), `exchange` (sent within `timeout=`), `replies` (read and checked), `agree`
//! (the fleet's limits and overrides), `apply` (grants and local state), `outcome` and
//! `missed` (the books after it; deltas back, grants from shares), `after_keys` (blocks,
//! leases and quota counters); `run` holds the loop, `state` what it keeps.

mod after_keys;
mod agree;
mod apply;
mod commands;
mod connection;
mod exchange;
mod missed;
mod outcome;
mod replies;
mod run;
mod scripts;
mod state;
mod take;

pub use state::Task;
