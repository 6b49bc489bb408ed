//! Sending a round's commands and collecting each one's reply or error.

use std::time::Duration;

use super::connection::Link;
use super::scripts::SCRIPTS;
use ratelimit_core::fleet_round;

use super::state::{LoopState, Task, KEEP_AFTER_TIMEOUTS, LATE_BYTES_MAX};
use crate::sync::cluster;
use crate::sync::shared::{Bad, SyncError};

impl Task {
    /// Send the commands: one pipeline to the server, or one per node of a cluster (scripts
    /// loaded in the same pipeline when not known to be). Each command's reply or error.
    pub(super) async fn exchange(
        &self,
        link: &mut Link,
        commands: &[cluster::Routed],
    ) -> Vec<Result<redis::Value, SyncError>> {
        match link {
            Link::Cluster(cluster) => cluster.send(commands, &SCRIPTS).await,
            Link::Single(single) => match single.send(commands, &SCRIPTS).await {
                Ok(values) if values.len() == commands.len() => values
                    .into_iter()
                    .map(|value| match value {
                        redis::Value::ServerError(_) => Err(SyncError::Reply),
                        value => Ok(value),
                    })
                    .collect(),
                Ok(_) => commands.iter().map(|_| Err(SyncError::Reply)).collect(),
                Err(error) => commands.iter().map(|_| Err(error)).collect(),
            },
        }
    }

    /// One exchange after the round's (blocks, quota counters), its replies bounded by
    /// `bound` bytes and its time by `timeout=`: each command's reply or error.
    pub(super) async fn exchange_within(
        &self,
        link: &mut Link,
        commands: &[cluster::Routed],
        bound: usize,
    ) -> Vec<Result<redis::Value, SyncError>> {
        let timeout = Duration::from_millis(self.spec.timeout_ms);
        link.allow(bound);
        let replies = match tokio::time::timeout(timeout, self.exchange(link, commands)).await {
            Ok(replies) => replies,
            Err(_) => commands.iter().map(|_| Err(SyncError::Timeout)).collect(),
        };
        if link.overflowed() {
            self.sync.note_bad(Bad::ReplySize, 0, 0, bound as u64);
        }
        replies
    }

    /// The round's exchange of `commands` (for `keys` keys), within `timeout=`: each
    /// command's reply or error, and whether the time ran out while a connection was being
    /// opened.
    pub(super) async fn exchange_keys(
        &self,
        link: &mut Link,
        state: &mut LoopState,
        commands: &[cluster::Routed],
        keys: usize,
    ) -> (Vec<Result<redis::Value, SyncError>>, bool) {
        let bound = fleet_round::reply_bytes_bound(keys, self.zones.len());
        link.allow(bound.saturating_add(state.late_bytes));
        let mut connect_timed_out = false;
        let results =
            match tokio::time::timeout(self.timeout(), self.exchange(link, commands)).await {
                Ok(results) => results,
                Err(_) => {
                    connect_timed_out = link.connecting();
                    let error = self.timed_out(link, state, bound);
                    commands.iter().map(|_| Err(error)).collect()
                }
            };
        if link.overflowed() {
            self.sync.note_bad(
                Bad::ReplySize,
                0,
                0,
                bound.saturating_add(state.late_bytes) as u64,
            );
        }
        (results, connect_timed_out)
    }

    /// The round's exchange ran out of time (its replies could take `bound` bytes): which
    /// error that is, and whether the connections are kept (see [`KEEP_AFTER_TIMEOUTS`]).
    fn timed_out(&self, link: &mut Link, state: &mut LoopState, bound: usize) -> SyncError {
        // Stuck in a TLS handshake: typically a server that does not speak TLS and waits for
        // a command line that a ClientHello never ends (told when it happens again, in
        // `round_failed`: a first handshake may merely be slow).
        let error = match (link.connecting(), self.spec.is_tls()) {
            (true, true) => SyncError::TlsNoAnswer,
            (true, false) => SyncError::ConnectTimeout,
            (false, _) => SyncError::Timeout,
        };
        state.timeouts += 1;
        if link.connecting() || state.timeouts.is_multiple_of(KEEP_AFTER_TIMEOUTS) {
            link.reset();
            state.late_bytes = 0;
        } else {
            state.late_bytes = (state.late_bytes + bound).min(LATE_BYTES_MAX);
        }
        error
    }
}
