//! The books kept after a round: the shared counters and the mode, the round budget, the
//! connections' fate, and the keys whose reply was dropped or whose send failed.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::connection::Link;
use super::state::{LoopState, TakenKey, Task};
use crate::glue::now_ms;
use crate::sync::shared::{Mode, SyncError};

/// What a round sent, for the books kept after it.
pub(super) struct Sent {
    /// The round's number (grants are written for it).
    pub(super) round: u64,
    /// The send's number (from `SyncShared::sends`).
    pub(super) send: u64,
    /// Whether keys went out (not after a failed round).
    pub(super) sending: bool,
    /// The keys sent.
    pub(super) keys: usize,
    /// From the commands built to the replies applied.
    pub(super) took: Duration,
}

impl Task {
    /// Every command answered: the fleet is reached. `failed` are the keys whose reply was
    /// dropped (out of bounds).
    pub(super) fn round_succeeded(
        &self,
        state: &mut LoopState,
        sent: &Sent,
        instances: u64,
        failed: &[&TakenKey],
    ) {
        let lag_us = sent.took.as_micros() as u64;
        self.sync.instances.store(instances, Ordering::Relaxed);
        self.sync.lag_us.store(lag_us, Ordering::Relaxed);
        self.sync.last_ok_ms.store(now_ms(), Ordering::Relaxed);
        self.sync.round_trips.fetch_add(1, Ordering::Relaxed);
        self.sync
            .keys_pushed
            .fetch_add(sent.keys as u64, Ordering::Relaxed);
        self.sync.missed.store(0, Ordering::Relaxed);
        self.sync.last_error.store(0, Ordering::Relaxed);
        self.connect_timeouts.set(0);
        self.sync.mode.store(Mode::Synced as u64, Ordering::Release);
        state.failing = false;
        state.timeouts = 0;
        state.late_bytes = 0;
        if sent.sending {
            state.budget.after(
                sent.keys,
                Some(sent.took.as_nanos() as u64),
                self.timeout().as_nanos() as u64,
            );
        }
        // Keys whose reply was dropped: back to their entries, granted from shares.
        if !failed.is_empty() {
            self.missed(failed, sent.round, sent.send, self.sync.mode(), state);
        }
    }

    /// A command unanswered or answered wrong (`error`, the first): the connections go
    /// unless it was a time-out, the mode follows the misses, and the keys not applied
    /// (`failed`) take their deltas back and get grants from shares.
    pub(super) fn round_failed(
        &self,
        link: &mut Link,
        state: &mut LoopState,
        sent: &Sent,
        error: SyncError,
        connect_timed_out: bool,
        failed: &[&TakenKey],
    ) {
        if error != SyncError::Timeout {
            link.reset();
            state.timeouts = 0;
            state.late_bytes = 0;
        }
        self.sync.errors.fetch_add(1, Ordering::Relaxed);
        // A connection still opening when the round's time ran out (TCP, a TLS
        // handshake, AUTH) is told only when the next attempt ends so too: a first
        // connection may outlast a round (a cold resolver, a handshake on a loaded
        // machine, a slow AUTH), and what the next attempt finds (an authentication
        // failure, a refusal, a port that does not speak TLS) is the news, not a
        // time-out before it.
        let connect_timeouts = if connect_timed_out {
            self.connect_timeouts.get() + 1
        } else {
            0
        };
        self.connect_timeouts.set(connect_timeouts);
        if connect_timeouts != 1 {
            self.sync.last_error.store(error as u64, Ordering::Relaxed);
        }
        if sent.sending {
            state
                .budget
                .after(sent.keys, None, self.timeout().as_nanos() as u64);
        }
        state.failing = true;
        let mode = self.miss();
        self.missed(failed, sent.round, sent.send, mode, state);
    }
}
