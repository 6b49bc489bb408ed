//! A fleet-wide concurrency limit (`algorithm=concurrency limit=N sync`) as leases: each
//! round, for every key of a `sync` concurrency zone that has requests in flight, queued or
//! refused, or a lease, the loop tells Redis what this instance keeps of its lease and what
//! it wants, and Redis (one script call per key, atomic) grants permits from what no other
//! instance holds: `ratelimit_core::lease`'s protocol, whose `serve` the script
//! `SERVE_SCRIPT` is. The key's lease word in the zone (`ratelimit_core::lease::LeaseWord`:
//! permits and until when) is what its requests read; they never wait on Redis.
//!
//! A lease not renewed expires `EXPIRY_ROUNDS` intervals after the last request Redis applied
//! (Redis's clock), and on the instance `EXPIRY_ROUNDS` intervals after it sent that request
//! (its own clock, so earlier): a killed instance's permits are back in the fleet within
//! three intervals of its last round, and the next round of the others takes them.
//!
//! Kept apart from the rate keys' sync (`round/after_keys.rs` calls [`Leases::prepare`] and
//! [`Leases::settle`] once per round, around an exchange of their own). The loop-side state
//! ([`LeaseHolder`] per key) lives in the thread; a worker that takes the loop over adopts
//! each key's lease word as it finds it.

use std::collections::HashMap;
use std::sync::atomic::{fence, Ordering};

use ratelimit_core::concurrency::ConcurrencyLimit;
use ratelimit_core::lease::{
    hold_end, LeaseHolder, LeaseReply, LeaseRequest, LeaseWord, EXPIRY_ROUNDS, SERVE_SCRIPT,
};
use ratelimit_core::sync_spec::SyncSpec;

use super::cluster::Routed;
use super::shared::{Mode, SyncError, SyncShared};
use crate::glue::now_ms;
use crate::store::{SlotIndex, Zone};

/// The most keys whose leases one round renews: a bound on the round's work and replies.
pub const MAX_LEASE_KEYS: usize = 1024;

/// Most instances a reply may name (a larger count is not believed).
const MAX_INSTANCES: i64 = 1 << 16;

/// One `sync` concurrency zone as the loop sees it.
pub struct LeaseZone {
    pub name: String,
    pub zone: Zone,
}

/// A key's lease as the loop keeps it between rounds.
struct Held {
    holder: LeaseHolder,
    /// Its entry in the zone's table (found again by its id).
    entry: SlotIndex,
    /// The round it was last found in its zone.
    seen: u64,
}

/// What the loop keeps of the leases between rounds: one holder per key with a lease or
/// demand, at most [`MAX_LEASE_KEYS`].
#[derive(Default)]
pub struct Leases {
    held: HashMap<(usize, u64), Held>,
    round: u64,
    /// Until when no lease grows (ms, the instance's clock): Redis answered again after
    /// `on_failure=` applied, or forgot a lease ([`LeaseHolder::hold`]).
    hold_until_ms: u64,
}

/// The request sent for one key this round.
struct Sent {
    key: (usize, u64),
    limit: u32,
}

/// One round's requests, for [`Leases::settle`].
pub struct Round {
    pub commands: Vec<Routed>,
    sent: Vec<Sent>,
}

impl Leases {
    /// The round's requests: every busy key's lease renewed, grown or given back (shrunk in
    /// its word first). `reachable`: the round's main exchange succeeded (else nothing is
    /// sent, and the leases run out on their own).
    pub fn prepare(
        &mut self,
        zones: &[LeaseZone],
        spec: &SyncSpec,
        sync: &SyncShared,
        reachable: bool,
    ) -> Round {
        self.round += 1;
        let ttl_ms = EXPIRY_ROUNDS * spec.interval_ms;
        let instance = sync.instance_id;
        let now = now_ms();
        let send = sync.sends.fetch_add(1, Ordering::AcqRel) + 1;
        // Back from a failure mode: the fleet's requests admitted under it are claimed this
        // round and the next, before any lease grows.
        let failed = matches!(sync.mode(), Mode::LocalShare | Mode::Open | Mode::Closed);
        if reachable && failed {
            self.hold_until_ms = self.hold_until_ms.max(hold_end(now, ttl_ms));
        }
        let mut commands = Vec::new();
        let mut sent = Vec::new();
        for (index, lease_zone) in zones.iter().enumerate() {
            let zone = &lease_zone.zone;
            let Some(ConcurrencyLimit::Fixed(limit)) =
                zone.concurrency_limits().map(|limits| limits.limit)
            else {
                continue;
            };
            zone.set_lease_fallback(fallback(sync, limit));
            for (hash, words) in zone.concurrency_keys() {
                let Some(lease) = words.lease else {
                    continue;
                };
                let permits = words.load();
                let refused = lease.refused.swap(0, Ordering::AcqRel) as u32;
                let word = LeaseWord::unpack(lease.lease.load(Ordering::Acquire));
                let key = (index, hash);
                let busy = permits.in_flight > 0 || permits.queued() > 0 || refused > 0;
                if !busy && word.permits == 0 && !self.held.contains_key(&key) {
                    continue;
                }
                if !self.held.contains_key(&key) && self.held.len() >= MAX_LEASE_KEYS {
                    continue;
                }
                let held = self.held.entry(key).or_insert_with(|| Held {
                    holder: adopt(instance, &word),
                    entry: words.slot(),
                    seen: 0,
                });
                held.entry = words.slot();
                held.seen = self.round;
                let holder = &mut held.holder;
                holder.hold_until_ms = holder.hold_until_ms.max(self.hold_until_ms);
                holder.in_use = permits.in_flight;
                holder.peak = holder
                    .peak
                    .max(permits.in_flight.saturating_add(permits.queued()));
                holder.refused = holder.refused.saturating_add(refused);
                if !reachable {
                    continue;
                }
                let mut request = holder.request(now, limit);
                // Request numbers come from the instance's send counter, which outlives this
                // thread: a worker that takes the loop over keeps counting up.
                request.seq = send;
                holder.seq = send;
                // Shrink first, then look at what is in use: a request that read the old
                // word and took a permit meanwhile is in what this one claims, and so are
                // requests admitted under `on_failure=` or a lease that ran out.
                lease
                    .lease
                    .store(LeaseWord::of(holder).pack(), Ordering::SeqCst);
                fence(Ordering::SeqCst);
                request.in_use = words.load().in_flight;
                commands.push(serve_command(
                    spec,
                    &lease_zone.name,
                    hash,
                    instance,
                    &request,
                    limit,
                ));
                sent.push(Sent { key, limit });
            }
        }
        Round { commands, sent }
    }

    /// The replies to [`Leases::prepare`]'s requests (an error for each when the exchange
    /// failed): each lease applied, then every key's word written, whether its reply came or
    /// not (an unanswered lease runs out at its time).
    pub fn settle(
        &mut self,
        zones: &[LeaseZone],
        spec: &SyncSpec,
        round: Round,
        replies: Vec<Result<redis::Value, SyncError>>,
    ) {
        let ttl_ms = EXPIRY_ROUNDS * spec.interval_ms;
        let now = now_ms();
        for (sent, reply) in round.sent.iter().zip(replies) {
            let Some(held) = self.held.get_mut(&sent.key) else {
                continue;
            };
            if let Some(reply) = reply.ok().and_then(|value| check_reply(&value, sent.limit)) {
                held.holder.apply(&reply, now, ttl_ms);
                // Redis forgot this lease, and so every lease of its keys: none grows.
                self.hold_until_ms = self.hold_until_ms.max(held.holder.hold_until_ms);
            }
        }
        for (&(index, hash), held) in &self.held {
            if held.entry.id != hash {
                continue;
            }
            let Some(words) = zones
                .get(index)
                .and_then(|zone| zone.zone.key_words(held.entry))
            else {
                continue;
            };
            if let Some(lease) = words.lease {
                lease
                    .lease
                    .store(LeaseWord::of(&held.holder).pack(), Ordering::SeqCst);
            }
        }
        // A key is kept while it holds a live lease or has requests; an idle key that holds
        // nothing is dropped (its record in Redis, lease 0, expires), and so is one no longer
        // in its zone (forgotten, or evicted once idle) once what it held ran out.
        let current = self.round;
        self.held.retain(|_, held| {
            let holder = &held.holder;
            (holder.lease > 0 && holder.expires_ms > now)
                || (held.seen == current && holder.peak > 0)
        });
    }
}

/// One key's request to [`SERVE_SCRIPT`] (a lease of at most `limit` permits, kept for the
/// rounds of [`EXPIRY_ROUNDS`]), routed by the key's lease record.
fn serve_command(
    spec: &SyncSpec,
    zone_name: &str,
    hash: u64,
    instance: u64,
    request: &LeaseRequest,
    limit: u32,
) -> Routed {
    let ttl_ms = EXPIRY_ROUNDS * spec.interval_ms;
    let name = format!("{}{}:lease:{:016x}", spec.prefix, zone_name, hash);
    let mut command = redis::cmd("EVAL");
    command.arg(SERVE_SCRIPT);
    // When the server's lease records began (a restart, a promoted replica without them):
    // not on Redis Cluster, where it would be in another hash slot.
    if spec.cluster {
        command.arg(1).arg(&name);
    } else {
        command
            .arg(2)
            .arg(&name)
            .arg(format!("{}lease:since", spec.prefix));
    }
    command
        .arg(format!("{instance:016x}"))
        .arg(request.seq)
        .arg(request.keep)
        .arg(request.want)
        .arg(limit)
        .arg(ttl_ms)
        .arg(request.in_use)
        .arg(if request.grow { "1" } else { "0" });
    Routed { key: name, command }
}

/// A key whose lease this thread did not make (the loop moved to this worker): its word as
/// found, renewed at the next round.
fn adopt(instance: u64, word: &LeaseWord) -> LeaseHolder {
    let mut holder = LeaseHolder::new(instance);
    if word.permits > 0 {
        holder.lease = word.permits;
        holder.target = word.permits;
        holder.expires_ms = word.until_ms;
    }
    holder
}

/// The permits a key without a live lease may hold: none while the fleet answers (or has
/// just missed a round: leases live three intervals), else `on_failure=`'s.
fn fallback(sync: &SyncShared, limit: u32) -> u32 {
    match sync.mode() {
        Mode::Starting | Mode::Synced | Mode::Degraded | Mode::Closed => 0,
        Mode::LocalShare => {
            let instances = u32::try_from(sync.instances().max(1)).unwrap_or(u32::MAX);
            limit / instances
        }
        Mode::Open => limit,
    }
}

/// The script's reply, checked: `None` for anything out of bounds.
fn check_reply(value: &redis::Value, limit: u32) -> Option<LeaseReply> {
    let redis::Value::Array(items) = value else {
        return None;
    };
    let numbers: Vec<i64> = items
        .iter()
        .map(|item| match item {
            redis::Value::Int(n) => Some(*n),
            _ => None,
        })
        .collect::<Option<_>>()?;
    let &[applied, seq, lease, target, instances, known] = numbers.as_slice() else {
        return None;
    };
    let seq = u64::try_from(seq).ok()?;
    if applied == 0 {
        return Some(LeaseReply::Stale { seq });
    }
    let permits = |n: i64| u32::try_from(n).ok().filter(|&n| n <= limit);
    if !(1..=MAX_INSTANCES).contains(&instances) || !(0..=1).contains(&known) {
        return None;
    }
    Some(LeaseReply::Granted {
        seq,
        lease: permits(lease)?,
        target: permits(target)?,
        instances: instances as u32,
        known: known == 1,
    })
}
