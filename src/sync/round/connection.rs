//! The loop's connection(s) to Redis: one server (or the master the sentinels name), or a
//! cluster's nodes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::sync::cluster;
use crate::sync::link::{self, ReadBudget};
use crate::sync::shared::SyncError;

/// The connection(s), opened lazily and dropped after any failure.
pub(super) enum Link {
    Single(SingleLink),
    Cluster(cluster::ClusterLink),
}

impl Link {
    pub(super) fn reset(&mut self) {
        match self {
            Link::Single(single) => {
                single.connection = None;
                single.scripts_loaded = false;
                single.connecting = false;
                if let Some((watcher, _)) = single.watcher.take() {
                    watcher.abort();
                }
            }
            Link::Cluster(cluster) => cluster.reset(),
        }
    }

    /// Whether a connection was being opened (TCP, TLS, AUTH) when the round was cut short.
    pub(super) fn connecting(&self) -> bool {
        match self {
            Link::Single(single) => single.connecting,
            Link::Cluster(cluster) => cluster.connecting(),
        }
    }

    /// The next exchange's replies may take `bytes` (on each connection).
    pub(super) fn allow(&mut self, bytes: usize) {
        match self {
            Link::Single(single) => {
                if let Some((_, budget)) = &single.connection {
                    budget.allow(bytes);
                }
                single.allowed.set(bytes);
            }
            Link::Cluster(cluster) => cluster.allow(bytes),
        }
    }

    /// Whether a connection was cut off during the last exchange for reading too much.
    pub(super) fn overflowed(&self) -> bool {
        match self {
            Link::Single(single) => single.overflowed.get(),
            Link::Cluster(cluster) => cluster.overflowed(),
        }
    }
}

/// One Redis server, or the master the sentinels name.
pub(super) struct SingleLink {
    pub(super) info: Option<redis::ConnectionInfo>,
    /// For a `redis-sentinel://` URL: every new connection asks them for the master, and a
    /// watcher asks them again while it is open (`moved`: they named another master).
    pub(super) sentinels: Option<Arc<crate::sync::sentinel::Sentinels>>,
    pub(super) watcher: Option<(tokio::task::JoinHandle<()>, Arc<AtomicBool>)>,
    pub(super) tls: Option<link::Tls>,
    pub(super) connection: Option<(redis::aio::MultiplexedConnection, ReadBudget)>,
    pub(super) scripts_loaded: bool,
    /// Set while a connection is being opened (left set when a timeout cancels it).
    pub(super) connecting: bool,
    /// What the current exchange may read, for a connection opened during it.
    pub(super) allowed: std::cell::Cell<usize>,
    pub(super) overflowed: std::cell::Cell<bool>,
}

impl SingleLink {
    /// One pipeline with every command; the replies in order.
    pub(super) async fn send(
        &mut self,
        commands: &[cluster::Routed],
        scripts: &[&str],
    ) -> Result<Vec<redis::Value>, SyncError> {
        self.overflowed.set(false);
        if let Some((watcher, moved)) = &self.watcher {
            if moved.load(Ordering::Acquire) {
                // The sentinels name another master: this round goes to it.
                watcher.abort();
                self.watcher = None;
                self.connection = None;
                self.scripts_loaded = false;
            }
        }
        if self.connection.is_none() {
            self.connecting = true;
            let connection = match (&self.sentinels, &self.info) {
                (Some(sentinels), _) => match sentinels.connect_master(self.tls.as_ref()).await {
                    Ok((connection, budget, address)) => {
                        let moved = Arc::new(AtomicBool::new(false));
                        let watcher = sentinels.watch(self.tls.clone(), address, moved.clone());
                        self.watcher = Some((watcher, moved));
                        Ok((connection, budget))
                    }
                    Err(error) => Err(error),
                },
                (None, Some(info)) => link::connect(info, self.tls.as_ref()).await,
                (None, None) => Err(SyncError::BadUrl),
            };
            self.connecting = false;
            let (connection, budget) = connection?;
            budget.allow(self.allowed.get());
            self.connection = Some((connection, budget));
        }
        let Some((connection, budget)) = self.connection.as_mut() else {
            return Err(SyncError::Connect);
        };
        let mut pipe = redis::pipe();
        if !self.scripts_loaded {
            for script in scripts {
                pipe.cmd("SCRIPT").arg("LOAD").arg(*script).ignore();
            }
        }
        for routed in commands {
            pipe.add_command(routed.command.clone());
        }
        let values: Result<Vec<redis::Value>, _> = pipe.query_async(connection).await;
        if budget.exceeded() {
            self.overflowed.set(true);
            return Err(SyncError::ReplyTooLarge);
        }
        let values = values.map_err(link::classify)?;
        self.scripts_loaded = true;
        Ok(values)
    }
}
