//! Sending a round's commands and collecting each one's reply or error.

use std::time::Duration;

use super::connection::Link;
use super::scripts::SCRIPTS;
use super::state::Task;
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
}
