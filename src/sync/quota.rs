//! The fleet's count of `sync` quota zones (`ratelimit_core::fleet_quota`): each round, after
//! the keys' own exchange, one short exchange per round of the period's counters in Redis.
//!
//! ```text
//! STRING {prefix}{zone}:q:{NN}:{period start, Unix s}:{key id}   the period's count
//! ```
//!
//! A key with a pending delta is sent `INCRBY` by it (the reply is the fleet's new total) and
//! `PEXPIREAT` the period's end plus [`EXPIRY_MARGIN_MS`]; a key this instance refused for
//! want of its total, and then every other key counted this period in turns (at most
//! [`READS_PER_ROUND`] a round), is read with `GET`. Each total read is checked and written
//! to the key's slot: its fleet word, and its state raised to the total plus what was
//! admitted here since. A failed exchange puts the deltas back; a timed-out `INCRBY` that
//! Redis applies late is counted twice (the strict side).

use core::cell::Cell;
use core::sync::atomic::Ordering;

use ratelimit_core::fleet_quota::{self, check_total};
use ratelimit_core::period::Calendar;
use ratelimit_core::quota::{used, QuotaWindow};

use super::cluster::Routed;
use super::shared::{Bad, SyncError, SyncShared};
use super::zone::SyncZone;
use crate::glue::{now_ns, unix_ms_of};

/// Keys sent with a delta in one round (all zones): the rest wait in their slots, merged
/// with what comes next.
pub const SENDS_PER_ROUND: usize = 8192;

/// Keys without a delta read in one round (all zones; keys refused for want of their total
/// come first): with more keys counted this period, each is read every
/// `keys / READS_PER_ROUND` rounds.
pub const READS_PER_ROUND: usize = 4096;

/// How long a period's counter outlives its period: an instance whose clock is behind still
/// counts into it, and a late delta still lands.
pub const EXPIRY_MARGIN_MS: i64 = 3_600_000;

/// What the loop keeps of a quota zone between rounds.
pub struct QuotaSync {
    pub calendar: Calendar,
    /// The slot where the next round's reads begin.
    cursor: Cell<usize>,
}

impl QuotaSync {
    pub fn new(calendar: Calendar) -> QuotaSync {
        QuotaSync {
            calendar,
            cursor: Cell::new(0),
        }
    }

    /// The period of now, on the request path's clock (`control::quota::window`'s).
    fn period(&self) -> (QuotaWindow, i64, i64) {
        let bounds = self.calendar.bounds(unix_ms_of(now_ns()) as i64);
        let window = QuotaWindow {
            tag: QuotaWindow::tag_of(bounds.index),
            end_ns: 0,
        };
        (window, bounds.start_ms, bounds.end_ms)
    }
}

/// A key in this round's exchange.
pub struct Sent {
    zone: usize,
    slot: usize,
    hash: u64,
    window: QuotaWindow,
    /// Sent by `INCRBY` (two commands: the count and its expiry); 0: read by `GET`.
    delta: u64,
}

/// The round's commands for every `sync` quota zone, and the keys they carry in order.
pub fn commands(zones: &[SyncZone], prefix: &str) -> (Vec<Sent>, Vec<Routed>) {
    let (mut keys, mut commands) = (Vec::new(), Vec::new());
    let (mut sends, mut reads) = (0, 0);
    for (index, zone) in zones.iter().enumerate() {
        let Some(quota) = &zone.quota else {
            continue;
        };
        let (window, start_ms, end_ms) = quota.period();
        let (mut zone_sends, mut asked, mut zone_reads) = (Vec::new(), Vec::new(), Vec::new());
        let slots = zone.zone.slot_count();
        let from = quota.cursor.get().min(slots);
        let mut next_cursor = 0;
        for slot in (from..slots).chain(0..from) {
            let Some((hash, _)) = zone.zone.sync_slot(slot) else {
                break;
            };
            if hash == 0 {
                continue;
            }
            let Some(pinned) = zone.zone.sync_pin(slot, hash) else {
                continue;
            };
            let [state, pending, fleet] = pinned.words();
            let key = |delta| Sent {
                zone: index,
                slot,
                hash,
                window,
                delta,
            };
            if used(pending.load(Ordering::Acquire), &window) > 0 && sends < SENDS_PER_ROUND {
                // Swapped out: what is admitted from now on goes to the next round. A delta of
                // an earlier period is dropped with its period.
                let delta = used(pending.swap(0, Ordering::AcqRel), &window);
                if delta > 0 {
                    sends += 1;
                    zone_sends.push(key(delta));
                    continue;
                }
            }
            let fleet = fleet.load(Ordering::Acquire);
            if fleet_quota::is_asked(fleet, &window) {
                if asked.len() < READS_PER_ROUND {
                    asked.push(key(0));
                }
                continue;
            }
            let counted = used(state.load(Ordering::Acquire), &window) > 0
                || fleet_quota::fleet_total(fleet, &window).is_some();
            if counted && next_cursor == 0 {
                if reads < READS_PER_ROUND {
                    reads += 1;
                    zone_reads.push(key(0));
                } else {
                    next_cursor = slot;
                }
            }
        }
        quota.cursor.set(next_cursor);
        for entry in zone_sends.iter().chain(&asked).chain(&zone_reads) {
            let key = key_name(prefix, zone, entry.hash, start_ms);
            if entry.delta == 0 {
                let mut get = redis::cmd("GET");
                get.arg(&key);
                commands.push(Routed { key, command: get });
                continue;
            }
            let mut incr = redis::cmd("INCRBY");
            incr.arg(&key).arg(entry.delta);
            let mut expire = redis::cmd("PEXPIREAT");
            expire
                .arg(&key)
                .arg(end_ms.saturating_add(EXPIRY_MARGIN_MS));
            commands.push(Routed {
                key: key.clone(),
                command: incr,
            });
            commands.push(Routed {
                key,
                command: expire,
            });
        }
        keys.extend(zone_sends);
        keys.extend(asked);
        keys.extend(zone_reads);
    }
    (keys, commands)
}

/// A period's counter of the key `hash`: `prefix zone:q:{group}:start:id` (the group is the
/// keys' slot group, so a Redis Cluster spreads a zone's counters over its nodes).
fn key_name(prefix: &str, zone: &SyncZone, hash: u64, start_ms: i64) -> String {
    format!(
        "{prefix}{}:q:{{{:02x}}}:{}:{hash:016x}",
        zone.name,
        hash % 64,
        start_ms.div_euclid(1000)
    )
}

/// The replies to [`commands`]: each key's total into its slot, a failed key's delta back to
/// its pending word. Returns the first error.
pub fn received(
    zones: &[SyncZone],
    sent: &[Sent],
    replies: Vec<Result<redis::Value, SyncError>>,
    sync: &SyncShared,
) -> Option<SyncError> {
    let mut replies = replies.into_iter();
    let mut first_error = None;
    for entry in sent {
        let zone = &zones[entry.zone];
        let reply = replies.next().unwrap_or(Err(SyncError::Reply));
        if entry.delta > 0 {
            // PEXPIREAT's: a failed expiry is set again by the next delta.
            let _ = replies.next();
        }
        let total = reply.and_then(|value| match total_of(&value, entry.delta) {
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
        // The period moved on since the commands were built: what they carried is over.
        if zone.quota.as_ref().map(|quota| quota.period().0) != Some(entry.window) {
            continue;
        }
        let Some(pinned) = zone.zone.sync_pin(entry.slot, entry.hash) else {
            continue;
        };
        let [state, pending, fleet] = pinned.words();
        let window = &entry.window;
        match total {
            Ok(total) => {
                fleet.store(fleet_quota::fleet_word(total, window), Ordering::Release);
                let _ = state.fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                    let pending = pending.load(Ordering::Acquire);
                    Some(fleet_quota::synced_state(word, window, total, pending))
                });
            }
            Err(_) if entry.delta > 0 => {
                let _ = pending.fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                    Some(fleet_quota::add_pending(word, window, entry.delta))
                });
            }
            Err(_) => {}
        }
    }
    first_error
}

/// A counter's reply, checked like user input.
enum Total {
    Valid(u64),
    OutOfRange(i64),
    Malformed,
}

/// `INCRBY`'s reply (the period's total with this round's `delta` in it) or `GET`'s (nothing
/// counted yet, or a total).
fn total_of(value: &redis::Value, delta: u64) -> Total {
    let total = match value {
        redis::Value::Int(total) if delta > 0 => *total,
        redis::Value::Nil if delta == 0 => 0,
        redis::Value::BulkString(bytes) if delta == 0 => {
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
    match check_total(total, delta) {
        Some(total) => Total::Valid(total),
        None => Total::OutOfRange(total),
    }
}
