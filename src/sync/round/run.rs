//! The thread, its loop, and one round from the keys' scan to the grants.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use ratelimit_core::fleet_round::{self, RoundBudget};

use super::connection::{Link, SingleLink};
use super::replies::integer;
use super::state::{LoopState, Task, KEEP_AFTER_TIMEOUTS, LATE_BYTES_MAX};
use crate::glue::now_ms;
use crate::sync::cluster;
use crate::sync::leases::Leases;
use crate::sync::link;
use crate::sync::shared::{Bad, Mode, SyncError};

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

    pub(super) fn interval(&self) -> Duration {
        Duration::from_millis(self.spec.interval_ms)
    }

    pub(super) fn sync_ns(&self) -> u64 {
        self.spec.interval_ms * 1_000_000
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

    pub(super) async fn round(&self, link: &mut Link, state: &mut LoopState) {
        let round = self.sync.round.load(Ordering::Acquire);
        let instances = self.sync.instances();
        let candidates = self.scan(state.budget.keys, instances);
        // After a failed round, no key goes out until a round trip succeeds: a stalled Redis
        // is not handed a backlog to chew through when it resumes.
        let sending = !state.failing;
        let mut entries = Vec::new();
        if sending {
            self.take(&candidates, &mut entries, state);
            self.take_orphans(&mut entries, state.budget.keys, state);
        }
        let busy = self.settle_inbox();
        let started = std::time::Instant::now();
        let timeout = Duration::from_millis(self.spec.timeout_ms);
        let send = self.sync.sends.fetch_add(1, Ordering::AcqRel) + 1;
        let (commands, with_overrides, batches) = self.commands(&entries, send, busy);
        let bound = fleet_round::reply_bytes_bound(entries.len(), self.zones.len());
        link.allow(bound.saturating_add(state.late_bytes));
        // Whether the round ran out of time while a connection was being opened.
        let mut connect_timed_out = false;
        let results = match tokio::time::timeout(timeout, self.exchange(link, &commands)).await {
            Ok(results) => results,
            Err(_) => {
                connect_timed_out = link.connecting();
                // Stuck in a TLS handshake: typically a server that does not speak TLS and
                // waits for a command line that a ClientHello never ends (told when it
                // happens again, below: a first handshake may merely be slow).
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
        let mut results = results.into_iter();
        let heartbeat = results.next().unwrap_or(Err(SyncError::Reply));
        self.agree_control(&mut results, &with_overrides);
        let mut first_error = heartbeat.as_ref().err().copied();
        let instances = match heartbeat {
            Ok(value) => match integer(&value).map(fleet_round::check_instances) {
                Some(Ok(instances)) => instances,
                Some(Err(bad)) => {
                    self.note(&bad, 0);
                    self.sync.instances()
                }
                None => {
                    first_error = first_error.or(Some(SyncError::Reply));
                    self.sync.instances()
                }
            },
            Err(_) => self.sync.instances(),
        };
        let mut synced = Vec::new();
        let mut failed = Vec::new();
        for (range, result) in batches.iter().zip(results) {
            let batch = &entries[range.clone()];
            let replies = result.and_then(|value| self.key_replies(&value, batch.len()));
            match replies {
                Ok(replies) => {
                    for (entry, reply) in batch.iter().zip(replies) {
                        match fleet_round::check_key_reply(&entry.shape, self.sync_ns(), reply) {
                            Ok(reply) => synced.push((entry, reply)),
                            Err(bad) => {
                                self.note(&bad, self.zones[entry.zone].id);
                                failed.push(entry);
                            }
                        }
                    }
                }
                Err(error) => {
                    first_error = first_error.or(Some(error));
                    failed.extend(batch);
                }
            }
        }
        self.apply(&synced, instances, round, state);
        let took = started.elapsed();
        self.sync_blocks(link).await;
        self.sync_leases(link, &mut state.leases, first_error.is_none())
            .await;
        match first_error {
            None => {
                let lag_us = took.as_micros() as u64;
                self.sync.instances.store(instances, Ordering::Relaxed);
                self.sync.lag_us.store(lag_us, Ordering::Relaxed);
                self.sync.last_ok_ms.store(now_ms(), Ordering::Relaxed);
                self.sync.round_trips.fetch_add(1, Ordering::Relaxed);
                self.sync
                    .keys_pushed
                    .fetch_add(entries.len() as u64, Ordering::Relaxed);
                self.sync.missed.store(0, Ordering::Relaxed);
                self.sync.last_error.store(0, Ordering::Relaxed);
                self.connect_timeouts.set(0);
                self.sync.mode.store(Mode::Synced as u64, Ordering::Release);
                state.failing = false;
                state.timeouts = 0;
                state.late_bytes = 0;
                if sending {
                    state.budget.after(
                        entries.len(),
                        Some(took.as_nanos() as u64),
                        timeout.as_nanos() as u64,
                    );
                }
                // Keys whose reply was dropped: back to their slots, granted from shares.
                if !failed.is_empty() {
                    self.missed(&failed, round, send, self.sync.mode(), state);
                }
            }
            Some(error) => {
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
                if sending {
                    state
                        .budget
                        .after(entries.len(), None, timeout.as_nanos() as u64);
                }
                state.failing = true;
                let mode = self.miss();
                self.missed(&failed, round, send, mode, state);
            }
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
