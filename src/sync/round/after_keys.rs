//! The exchanges of a round after the keys' one: the zones' blocks, the leases of the
//! `sync` concurrency zones and the quota zones' counters.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::connection::Link;
use super::state::Task;
use crate::sync::leases::Leases;
use crate::sync::shared::SyncError;

/// The most bytes of one key's lease reply (five integers).
const LEASE_REPLY_BYTES: usize = 128;

impl Task {
    /// The keys' leases of the `sync` concurrency zones (`sync::leases`), in an exchange of
    /// their own: one script call per key.
    pub(super) async fn sync_leases(&self, link: &mut Link, leases: &mut Leases, reachable: bool) {
        if self.lease_zones.is_empty() {
            return;
        }
        let round = leases.prepare(&self.lease_zones, &self.spec, self.sync, reachable);
        let replies = if round.commands.is_empty() {
            Vec::new()
        } else {
            let timeout = Duration::from_millis(self.spec.timeout_ms);
            link.allow(4096 + round.commands.len() * LEASE_REPLY_BYTES);
            match tokio::time::timeout(timeout, self.exchange(link, &round.commands)).await {
                Ok(replies) => replies,
                Err(_) => round
                    .commands
                    .iter()
                    .map(|_| Err(SyncError::Timeout))
                    .collect(),
            }
        };
        leases.settle(&self.lease_zones, &self.spec, round, replies);
    }

    /// The zones' blocks: this instance's changes out, the fleet's in (`sync::blocks`).
    pub(super) async fn sync_blocks(&self, link: &mut Link) {
        let (sent, commands) = crate::sync::blocks::commands(&self.zones, &self.spec.prefix);
        if commands.is_empty() {
            return;
        }
        // Replies of its own size: a page per zone, whatever the key sync's exchange left.
        let bound = 4096 + commands.len() * ratelimit_core::fleet_blocks::PAGE_REPLY_BYTES;
        let replies = self.exchange_within(link, &commands, bound).await;
        crate::sync::blocks::received(&self.zones, &sent, replies, self.sync);
    }

    /// The quota zones' counters (`sync::quota`), after a round trip that succeeded: the
    /// deltas out, the fleet's totals back; a failure puts the deltas back for the next one.
    pub(super) async fn sync_quotas(&self, link: &mut Link) {
        let send = self.sync.sends.fetch_add(1, Ordering::AcqRel) + 1;
        let instance = self.sync.instance_id;
        let (sent, commands) =
            crate::sync::quota::commands(&self.zones, &self.spec.prefix, instance, send);
        if commands.is_empty() {
            return;
        }
        // An integer or a short string per command.
        let bound = 4096 + commands.len() * 32;
        let replies = self.exchange_within(link, &commands, bound).await;
        if crate::sync::quota::received(&self.zones, &sent, send, replies, self.sync).is_some() {
            self.sync.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}
