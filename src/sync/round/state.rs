//! What the loop is given (`Task`) and what it keeps between rounds.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use ratelimit_core::fleet::FleetShape;
use ratelimit_core::fleet_round::RoundBudget;
use ratelimit_core::sync_spec::SyncSpec;

use crate::sync::leases::{LeaseZone, Leases};
use crate::sync::shared::SyncShared;
use crate::sync::zone::SyncZone;

/// Keys whose fleet share a loop remembers (bounded: the least recently synced go first).
pub(super) const REMEMBERED_KEYS: usize = 65_536;

/// Failed sends a key remembers. Beyond, the second oldest is forgotten: the oldest went out
/// on a connection that worked until then, the likeliest to be applied late (later ones
/// mostly fail to connect at all). A forgotten send applied late is charged twice (the
/// strict side).
pub(super) const UNCONFIRMED: usize = 8;

/// Everything the thread needs; built by a worker, moved into the thread.
pub struct Task {
    pub zones: Vec<SyncZone>,
    /// The `sync` concurrency zones (`sync::leases`).
    pub lease_zones: Vec<LeaseZone>,
    pub spec: SyncSpec,
    /// `tls_ca=`, `tls_cert=`/`tls_key=` as read at config time.
    pub tls: Option<redis::TlsCertificates>,
    pub sync: &'static SyncShared,
    pub pid: u64,
    pub stop: Arc<AtomicBool>,
    /// Rounds in a row that ran out of time while connecting (see `round`).
    pub connect_timeouts: core::cell::Cell<u32>,
}

// SAFETY: `Zone` holds pointers into shared memory mapped for the whole life of the process;
// the thread only uses its atomic accessors, which are valid from any thread.
unsafe impl Send for Task {}

impl Task {
    /// The sync interval.
    pub(super) fn interval(&self) -> Duration {
        Duration::from_millis(self.spec.interval_ms)
    }

    /// The sync interval in nanoseconds.
    pub(super) fn sync_ns(&self) -> u64 {
        self.spec.interval_ms * 1_000_000
    }

    /// The most an exchange may take (`timeout=`).
    pub(super) fn timeout(&self) -> Duration {
        Duration::from_millis(self.spec.timeout_ms)
    }
}

/// What the loop remembers of a key between rounds.
#[derive(Clone, Copy, Default)]
pub(super) struct KeyMemory {
    pub(super) last_delta: u64,
    pub(super) share: u64,
    pub(super) round: u64,
}

/// What the loop keeps between rounds, bounded.
pub(super) struct LoopState {
    pub(super) keys: HashMap<(usize, u64), KeyMemory>,
    /// The sends (numbers from `SyncShared::sends`) of a key that timed out or failed since
    /// its last successful one, with the delta each carried (each one's includes the earlier
    /// ones'): listed in the key's next send so that Redis charges once what it applied late
    /// (see `KEY_SCRIPT`). Bounded like `keys`.
    pub(super) unconfirmed: HashMap<(usize, u64), Vec<(u64, u64)>>,
    pub(super) budget: RoundBudget,
    /// The last round failed: send no key until a round trip succeeds.
    pub(super) failing: bool,
    /// Rounds timed out in a row on the connections kept open.
    pub(super) timeouts: u32,
    /// The leases of the `sync` concurrency zones' keys.
    pub(super) leases: Leases,
    /// What the timed-out exchanges still pending on those connections may read when Redis
    /// answers them late (added to the next exchange's bound, at most [`LATE_BYTES_MAX`]).
    pub(super) late_bytes: usize,
}

/// Timed-out rounds after which the connections are opened again (a peer gone without a
/// reset would otherwise keep them for good). Until then a round that times out keeps its
/// connections: a stalled Redis gets no new connection, handshake and script loads per round
/// to work through when it resumes, and answers the next round within an interval.
pub(super) const KEEP_AFTER_TIMEOUTS: u32 = 10;

/// The most a connection kept open after timeouts may read on top of an exchange's bound.
pub(super) const LATE_BYTES_MAX: usize = 8 << 20;

/// A key that needs the fleet this round, as the scan found it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Candidate {
    pub(super) rank: u64,
    pub(super) zone: usize,
    /// Its entry in the zone's table.
    pub(super) entry: usize,
    pub(super) hash: u64,
}

/// A key taken in this round.
pub(super) struct TakenKey {
    pub(super) zone: usize,
    /// Its entry in the zone's table, or `None` for a key evicted since the last round (from
    /// the orphan ring).
    pub(super) entry: Option<usize>,
    pub(super) hash: u64,
    pub(super) delta: u64,
    pub(super) shape: FleetShape,
    /// [`LoopState::unconfirmed`] when the round was built.
    pub(super) unconfirmed: Vec<(u64, u64)>,
}
