//! The thread, its loop, and one round from the keys' scan to the grants.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use ratelimit_core::fleet_round::{self, RoundBudget};

use super::connection::{Link, SingleLink};
use super::outcome::Sent;
use super::state::{LoopState, Task};
use crate::glue::now_ms;
use crate::sync::cluster;
use crate::sync::leases::Leases;
use crate::sync::link;
use crate::sync::shared::{Bad, SyncError};

impl Task {
    /// The thread's body.
    pub fn run(self) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        match runtime {
            Ok(runtime) => runtime.block_on(self.main_loop()),
            Err(_) => self
                .sync
                .last_error
                .store(SyncError::Connect as u64, Ordering::Relaxed),
        }
    }

    pub(super) async fn main_loop(self) {
        for zone in &self.zones {
            let version = self.sync.override_version(zone.id);
            zone.overrides.borrow_mut().inherit(version);
        }
        let tls = if self.spec.is_tls() {
            link::Tls::new(self.tls.as_ref())
        } else {
            None
        };
        let mut link = if self.spec.cluster {
            Link::Cluster(cluster::ClusterLink::new(&self.spec.urls, tls))
        } else {
            Link::Single(SingleLink {
                info: redis::Client::open(self.spec.urls[0].as_str())
                    .ok()
                    .map(|client| client.get_connection_info().clone()),
                sentinels: self
                    .spec
                    .sentinel
                    .clone()
                    .map(|spec| Arc::new(crate::sync::sentinel::Sentinels::new(spec))),
                watcher: None,
                tls,
                connection: None,
                scripts_loaded: false,
                connecting: false,
                allowed: Default::default(),
                overflowed: Default::default(),
            })
        };
        let mut state = LoopState {
            keys: HashMap::new(),
            unconfirmed: HashMap::new(),
            budget: RoundBudget::new(),
            failing: false,
            timeouts: 0,
            late_bytes: 0,
            leases: Leases::default(),
        };
        let mut next = tokio::time::Instant::now();
        loop {
            if self.sync.owner_pid.load(Ordering::Acquire) != self.pid {
                // Another worker took over (this one looked dead): its loop goes on.
                return;
            }
            let stopping = self.stop.load(Ordering::Acquire);
            self.sync.heartbeat_ms.store(now_ms(), Ordering::Release);
            // This round sends whatever an admin write changed.
            self.sync.kick.store(0, Ordering::Release);
            self.round(&mut link, &mut state).await;
            if stopping {
                return;
            }
            next += self.interval();
            let now = tokio::time::Instant::now();
            if next < now {
                next = now;
            }
            // Sleep in short steps so that a stop (or an admin write) is noticed quickly.
            while tokio::time::Instant::now() < next && !self.stop.load(Ordering::Acquire) {
                if self.sync.kick.swap(0, Ordering::AcqRel) != 0 {
                    self.admin_round(&mut link).await;
                    continue;
                }
                let step = next.saturating_duration_since(tokio::time::Instant::now());
                tokio::time::sleep(step.min(Duration::from_millis(20))).await;
            }
        }
    }

    /// One round: the keys that need the fleet taken, one exchange with the heartbeat, the
    /// zones' limits and overrides and the keys, the replies applied, then the zones' blocks,
    /// leases and quota counters, and the books kept on how the round went.
    pub(super) async fn round(&self, link: &mut Link, state: &mut LoopState) {
        let round = self.sync.round.load(Ordering::Acquire);
        let instances = self.sync.instances();
        let candidates = self.scan(state.budget.keys, instances);
        // After a failed round, no key goes out until a round trip succeeds: a stalled Redis
        // is not handed a backlog to chew through when it resumes.
        let sending = !state.failing;
        let mut taken_keys = Vec::new();
        if sending {
            self.take(&candidates, &mut taken_keys, state);
            self.take_orphans(&mut taken_keys, state.budget.keys, state);
        }
        let busy = self.settle_inbox();
        let started = std::time::Instant::now();
        let send = self.sync.sends.fetch_add(1, Ordering::AcqRel) + 1;
        let (commands, with_overrides, batches) = self.commands(&taken_keys, send, busy);
        let (results, connect_timed_out) = self
            .exchange_keys(link, state, &commands, taken_keys.len())
            .await;
        let mut results = results.into_iter();
        let heartbeat = results.next().unwrap_or(Err(SyncError::Reply));
        self.agree_control(&mut results, &with_overrides);
        let replies = self.read_replies(heartbeat, results, &batches, &taken_keys);
        self.apply(&replies.synced, replies.instances, round, state);
        let sent = Sent {
            round,
            send,
            sending,
            keys: taken_keys.len(),
            took: started.elapsed(),
        };
        self.sync_blocks(link).await;
        self.sync_leases(link, &mut state.leases, replies.first_error.is_none())
            .await;
        match replies.first_error {
            None => self.round_succeeded(state, &sent, replies.instances, &replies.failed),
            Some(error) => self.round_failed(
                link,
                state,
                &sent,
                error,
                connect_timed_out,
                &replies.failed,
            ),
        }
        if !state.failing {
            self.sync_quotas(link).await;
        }
        if !sending {
            // Keys that need the fleet while it does not answer: granted from shares.
            self.grant_locally(&candidates, round, self.sync.mode(), state);
        }
        // Grants were written for `round`; from now on they age.
        self.sync.round.fetch_add(1, Ordering::AcqRel);
    }

    /// Between rounds, after an admin write or a new block: the heartbeat, the zones' limits,
    /// overrides and blocks only (no key is synced, no grant changes), so that the change
    /// reaches Redis now. A failure is left to the next round.
    pub(super) async fn admin_round(&self, link: &mut Link) {
        let busy = self.settle_inbox();
        let timeout = Duration::from_millis(self.spec.timeout_ms);
        let (commands, with_overrides, _) = self.commands(&[], 0, busy);
        link.allow(fleet_round::reply_bytes_bound(0, self.zones.len()));
        let exchanged = tokio::time::timeout(timeout, self.exchange(link, &commands)).await;
        if link.overflowed() {
            self.sync.note_bad(
                Bad::ReplySize,
                0,
                0,
                fleet_round::reply_bytes_bound(0, self.zones.len()) as u64,
            );
        }
        let Ok(results) = exchanged else {
            link.reset();
            return;
        };
        if results.iter().any(Result::is_err) {
            link.reset();
        }
        let mut results = results.into_iter().skip(1);
        self.agree_control(&mut results, &with_overrides);
        self.sync_blocks(link).await;
    }
}
