//! The fleet's count of `sync` quota zones (`ratelimit_core::fleet_quota`): after each round
//! that reached Redis, one short exchange of the period's counters.
//!
//! ```text
//! HASH {prefix}{zone}:q:{NN}:{period start, Unix s}:{key id}
//!      n = the period's count, i<instance> = the last send of that instance applied
//! ```
//!
//! A key with a pending delta is sent by [`QUOTA_SCRIPT`] (the reply is the fleet's new total;
//! the hash expires at the period's end plus [`EXPIRY_MARGIN_MS`]); a key this instance
//! refused for want of its total, and then every other key counted this period in turns (at
//! most [`READS_PER_ROUND`] a round), is read with `HGET`. Each total is checked and written
//! to the key's entry: its fleet word, and its state raised to the total plus what was
//! admitted here since. A failed send puts its delta back, merged with what comes next, and
//! the next send lists it (its number and delta): the script adds only what the hash has not
//! applied yet, so a send that timed out and was applied late is not counted twice.

use core::sync::atomic::Ordering;

use ratelimit_core::fleet_quota::{self, check_total};
use ratelimit_core::quota::{used, QuotaWindow};

use super::cluster::Routed;
use super::quota_keep::{QuotaSync, UNCONFIRMED, UNCONFIRMED_KEYS};
use super::shared::{Bad, SyncError, SyncShared};
use super::zone::SyncZone;

/// Keys sent with a delta in one round (all zones): the rest wait in their entries, merged
/// with what comes next.
pub const SENDS_PER_ROUND: usize = 8192;

/// Keys without a delta read in one round (all zones; keys refused for want of their total
/// come first): with more keys counted this period, each is read every
/// `keys / READS_PER_ROUND` rounds.
pub const READS_PER_ROUND: usize = 4096;

/// How long a period's counter outlives its period: an instance whose clock is behind still
/// counts into it, and a late delta still lands.
pub const EXPIRY_MARGIN_MS: i64 = 3_600_000;

/// Adds a send to a key's counter, once. KEYS[1]: the counter; ARGV: this instance's id,
/// this send's number (increasing in the instance), its delta (what earlier failed sends
/// carried, again, and what came since), the expiry (Unix ms), then pairs of (number, delta)
/// of the earlier sends of the key that failed (each delta including the earlier ones'). A
/// send numbered at most the instance's last applied one came late and adds nothing; else
/// it adds its delta less what the latest earlier send that was applied carried. Returns the
/// period's count.
pub const QUOTA_SCRIPT: &str = include_str!("quota.lua");

/// A key in this round's exchange.
pub struct Sent {
    zone: usize,
    /// Its entry in the zone's table.
    entry: usize,
    hash: u64,
    window: QuotaWindow,
    /// Sent by [`QUOTA_SCRIPT`]; 0: read by `HGET`.
    delta: u64,
    /// The key's earlier failed sends this one carries again.
    unconfirmed: Vec<(u64, u64)>,
}

/// The round's commands for every `sync` quota zone, and the keys they carry in order: sends
/// numbered `send` by instance `instance`.
pub fn commands(
    zones: &[SyncZone],
    prefix: &str,
    instance: u64,
    send: u64,
) -> (Vec<Sent>, Vec<Routed>) {
    let script = redis::Script::new(QUOTA_SCRIPT).get_hash().to_string();
    let (mut keys, mut commands) = (Vec::new(), Vec::new());
    let mut taken = Taken::default();
    for (index, zone) in zones.iter().enumerate() {
        let Some(quota) = &zone.quota else {
            continue;
        };
        let (window, start_ms, end_ms) = quota.period();
        let zone_keys = zone_keys(index, zone, quota, window, &mut taken);
        let expiry_ms = end_ms.saturating_add(EXPIRY_MARGIN_MS);
        for sent in zone_keys.in_order() {
            let name = key_name(prefix, zone, sent.hash, start_ms);
            let command = key_command(sent, &name, &script, instance, send, expiry_ms);
            commands.push(Routed { key: name, command });
        }
        keys.extend(zone_keys.sends);
        keys.extend(zone_keys.asked);
        keys.extend(zone_keys.reads);
    }
    (keys, commands)
}

/// The keys sent and read so far this round, all zones (within [`SENDS_PER_ROUND`] and
/// [`READS_PER_ROUND`]).
#[derive(Default)]
struct Taken {
    sends: usize,
    reads: usize,
}

/// One zone's keys in this round's exchange, in the order they go.
struct ZoneKeys {
    /// With a delta.
    sends: Vec<Sent>,
    /// Refused for want of their total: read first.
    asked: Vec<Sent>,
    /// Counted this period: read in turn, from the zone's cursor on.
    reads: Vec<Sent>,
}

impl ZoneKeys {
    fn in_order(&self) -> impl Iterator<Item = &Sent> {
        self.sends.iter().chain(&self.asked).chain(&self.reads)
    }
}

/// A quota zone's keys for this round: their deltas swapped out, the keys refused for want of
/// their total, and the counted keys whose turn it is to be read (the zone's cursor moved to
/// the first one left for a later round).
fn zone_keys(
    index: usize,
    zone: &SyncZone,
    quota: &QuotaSync,
    window: QuotaWindow,
    taken: &mut Taken,
) -> ZoneKeys {
    let mut keys = ZoneKeys {
        sends: Vec::new(),
        asked: Vec::new(),
        reads: Vec::new(),
    };
    let entries = zone.zone.slot_count();
    let from = quota.cursor.get().min(entries);
    let mut next_cursor = 0;
    for entry in (from..entries).chain(0..from) {
        let Some((hash, _)) = zone.zone.sync_slot(entry) else {
            break;
        };
        if hash == 0 {
            continue;
        }
        let Some(pinned) = zone.zone.sync_pin(entry, hash) else {
            continue;
        };
        let [state, pending, fleet] = pinned.words();
        let key = |delta| Sent {
            zone: index,
            entry,
            hash,
            window,
            delta,
            unconfirmed: Vec::new(),
        };
        if used(pending.load(Ordering::Acquire), &window) > 0 && taken.sends < SENDS_PER_ROUND {
            // Swapped out: what is admitted from now on goes to the next round. A delta of
            // an earlier period is dropped with its period.
            let delta = used(pending.swap(0, Ordering::AcqRel), &window);
            if delta > 0 {
                taken.sends += 1;
                let unconfirmed = quota.unconfirmed.borrow();
                let earlier = unconfirmed
                    .get(&hash)
                    .filter(|(tag, _)| *tag == window.tag)
                    .map(|(_, sends)| sends.clone())
                    .unwrap_or_default();
                keys.sends.push(Sent {
                    unconfirmed: earlier,
                    ..key(delta)
                });
                continue;
            }
        }
        let fleet = fleet.load(Ordering::Acquire);
        if fleet_quota::is_asked(fleet, &window) {
            if keys.asked.len() < READS_PER_ROUND {
                keys.asked.push(key(0));
            }
            continue;
        }
        let counted = used(state.load(Ordering::Acquire), &window) > 0
            || fleet_quota::fleet_total(fleet, &window).is_some();
        if counted && next_cursor == 0 {
            if taken.reads < READS_PER_ROUND {
                taken.reads += 1;
                keys.reads.push(key(0));
            } else {
                next_cursor = entry;
            }
        }
    }
    quota.cursor.set(next_cursor);
    keys
}

/// One key's command: [`QUOTA_SCRIPT`] with its delta (the counter expiring at `expiry_ms`,
/// Unix ms), or a read of its counter.
fn key_command(
    sent: &Sent,
    name: &str,
    script: &str,
    instance: u64,
    send: u64,
    expiry_ms: i64,
) -> redis::Cmd {
    let mut command;
    if sent.delta == 0 {
        command = redis::cmd("HGET");
        command.arg(name).arg("n");
    } else {
        command = redis::cmd("EVALSHA");
        command
            .arg(script)
            .arg(1)
            .arg(name)
            .arg(format!("{instance:016x}"))
            .arg(send)
            .arg(sent.delta)
            .arg(expiry_ms);
        for &(earlier, delta) in &sent.unconfirmed {
            command.arg(earlier).arg(delta);
        }
    }
    command
}

/// A period's counter of the key `hash`: `prefix zone:q:{group}:start:id` (the group is the
/// keys' hash-tag group, so a Redis Cluster spreads a zone's counters over its nodes).
fn key_name(prefix: &str, zone: &SyncZone, hash: u64, start_ms: i64) -> String {
    format!(
        "{prefix}{}:q:{{{:02x}}}:{}:{hash:016x}",
        zone.name,
        hash % 64,
        start_ms.div_euclid(1000)
    )
}

/// The replies to [`commands`]: each key's total into its entry, a failed key's delta back to
/// its pending word. Returns the first error.
pub fn received(
    zones: &[SyncZone],
    sent: &[Sent],
    send: u64,
    replies: Vec<Result<redis::Value, SyncError>>,
    sync: &SyncShared,
) -> Option<SyncError> {
    let mut replies = replies.into_iter();
    let mut first_error = None;
    for key in sent {
        let zone = &zones[key.zone];
        let reply = replies.next().unwrap_or(Err(SyncError::Reply));
        let total = reply.and_then(|value| match total_of(&value) {
            Total::Valid(total) => Ok(total),
            Total::OutOfRange(total) => {
                sync.note_bad(
                    Bad::KeyCounts,
                    zone.id,
                    total as u64,
                    fleet_quota::MAX_TOTAL,
                );
                Err(SyncError::Reply)
            }
            Total::Malformed => Err(SyncError::Reply),
        });
        first_error = first_error.or(total.err());
        let Some(quota) = zone.quota.as_ref() else {
            continue;
        };
        if key.delta > 0 {
            remember(quota, key, send, total.is_ok());
        }
        // The period moved on since the commands were built: what they carried is over.
        if quota.period().0 != key.window {
            continue;
        }
        let Some(pinned) = zone.zone.sync_pin(key.entry, key.hash) else {
            continue;
        };
        let [state, pending, fleet] = pinned.words();
        let window = &key.window;
        match total {
            Ok(total) => {
                fleet.store(fleet_quota::fleet_word(total, window), Ordering::Release);
                let _ = state.fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                    let pending = pending.load(Ordering::Acquire);
                    Some(fleet_quota::synced_state(word, window, total, pending))
                });
            }
            Err(_) if key.delta > 0 => {
                let _ = pending.fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                    Some(fleet_quota::add_pending(word, window, key.delta))
                });
            }
            Err(_) => {}
        }
    }
    first_error
}

/// After a send: an applied one clears the key's failed sends, a failed one joins them.
fn remember(quota: &QuotaSync, key: &Sent, send: u64, applied: bool) {
    let mut unconfirmed = quota.unconfirmed.borrow_mut();
    if applied {
        unconfirmed.remove(&key.hash);
        return;
    }
    if unconfirmed.len() >= UNCONFIRMED_KEYS && !unconfirmed.contains_key(&key.hash) {
        return;
    }
    let mut sends = key.unconfirmed.clone();
    if sends.len() >= UNCONFIRMED {
        sends.remove(0);
    }
    sends.push((send, key.delta));
    unconfirmed.insert(key.hash, (key.window.tag, sends));
}

/// A counter's reply, checked like user input.
enum Total {
    Valid(u64),
    OutOfRange(i64),
    Malformed,
}

/// The script's reply (an integer) or `HGET`'s (nothing counted yet, or a count).
fn total_of(value: &redis::Value) -> Total {
    let total = match value {
        redis::Value::Int(total) => *total,
        redis::Value::Nil => 0,
        redis::Value::BulkString(bytes) => {
            match std::str::from_utf8(bytes)
                .ok()
                .and_then(|text| text.parse().ok())
            {
                Some(total) => total,
                None => return Total::Malformed,
            }
        }
        _ => return Total::Malformed,
    };
    match check_total(total, 0) {
        Some(total) => Total::Valid(total),
        None => Total::OutOfRange(total),
    }
}
