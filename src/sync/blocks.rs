//! Blocks shared by the fleet (`block=` on a `sync` zone): each round, the loop sends the
//! zone's block records changed since its last round and reads back the fleet's, in one
//! script per zone on the zone's block hash (`ratelimit_core::fleet_blocks`: the record
//! changed last wins, records spent for `block_max` are deleted). The fleet's records that
//! changed since the loop last saw them wait in this process's queue until the worker's watch
//! timer applies them through the control layer (a claim needs the zone's lock, which the
//! thread may not take).
//!
//! So a block or a release made on any instance (by a rejection, the admin API or Lua) is in
//! Redis at the end of that instance's round, and in every other instance's zone within its
//! next round and a watch period: within two intervals. A restarted instance reads the blocks
//! in force on its first round.
//!
//! Kept apart from the loop's key sync (`task.rs` calls [`commands`] and [`received`] once per
//! round), and from nginx: only plain data crosses to the worker.

use std::collections::HashMap;
use std::sync::Mutex;

use ratelimit_core::block_table::KEY_BYTES;
use ratelimit_core::fleet_blocks::FleetBlock;
use ratelimit_core::penalty::BlockWord;

use super::cluster::Routed;
use super::shared::SyncError;
use super::zone::SyncZone;
use crate::glue::{now_ms, unix_minus_local_ms};

/// Pushes the records changed after ARGV[3] … (key, value, changed Unix ms) unless the fleet's
/// record of the key changed at the same time or later, deletes the records spent at ARGV[1]
/// (now, Unix ms) for ARGV[2] (block_max, ms), and returns what is left.
const BLOCKS_SCRIPT: &str = r#"
local now, block_max = tonumber(ARGV[1]), tonumber(ARGV[2])
for i = 3, #ARGV, 3 do
  local current = redis.call('HGET', KEYS[1], ARGV[i])
  local changed = current and tonumber(string.match(current, '^1 %d+ (%d+) %d+$'))
  if not changed or changed < tonumber(ARGV[i + 2]) then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
local all = redis.call('HGETALL', KEYS[1])
local kept = {}
for i = 1, #all, 2 do
  local untils = tonumber(string.match(all[i + 1], '^1 (%d+) %d+ %d+$'))
  if untils and untils + block_max < now then
    redis.call('HDEL', KEYS[1], all[i])
  else
    kept[#kept + 1] = all[i]
    kept[#kept + 1] = all[i + 1]
  end
end
return kept
"#;

/// How far before the last round's cut changes are sent again.
const RESEND_MS: u64 = 1000;

/// A fleet record for a worker to apply.
pub struct Incoming {
    /// `name_seed` of the zone's name.
    pub zone_id: u64,
    pub key: Vec<u8>,
    pub word: BlockWord,
    /// When it changed, on this instance's clock (ms).
    pub changed_ms: u64,
}

/// What the loop thread of this process remembers between rounds.
#[derive(Default)]
struct Memory {
    /// Per zone: the local clock (ms) up to which changes were sent.
    sent_up_to_ms: HashMap<u64, u64>,
    /// Per zone and key: the fleet record's last change (Unix ms) already queued.
    seen: HashMap<(u64, Vec<u8>), u64>,
}

/// Process-local: the loop thread and its worker's main thread.
static MEMORY: Mutex<Option<Memory>> = Mutex::new(None);
static QUEUE: Mutex<Vec<Incoming>> = Mutex::new(Vec::new());

/// One command per sync zone with `block=`: its changes since the last round, and the
/// fleet's records back. `prefix` is `rate_limit_sync`'s.
pub fn commands(zones: &[SyncZone], prefix: &str) -> (Vec<usize>, Vec<Routed>) {
    let mut memory = MEMORY
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let memory = memory.get_or_insert_with(Memory::default);
    let offset = unix_minus_local_ms();
    let now_local = now_ms();
    let (mut indexes, mut commands) = (Vec::new(), Vec::new());
    for (index, zone) in zones.iter().enumerate() {
        let (Some(policy), Some(table)) = (zone.block, zone.zone.block_table()) else {
            continue;
        };
        let after = memory.sent_up_to_ms.get(&zone.id).copied().unwrap_or(0);
        let key = FleetBlock::redis_key(prefix, &zone.name);
        let mut command = redis::cmd("EVAL");
        command
            .arg(BLOCKS_SCRIPT)
            .arg(1)
            .arg(&key)
            .arg((now_local as i64 + offset).max(0))
            .arg(policy.block_max_ns / 1_000_000);
        // A change is stamped with the time its request started, a moment before it is
        // written: the last second before the last cut is sent again, so that a change
        // written just after that cut is not missed (the script keeps the newer record).
        for (bytes, word, changed_ms) in table.changed_since(after.saturating_sub(RESEND_MS)) {
            let block = FleetBlock::from_local(word, changed_ms, offset);
            command
                .arg(bytes)
                .arg(block.encode())
                .arg(block.changed_unix_ms);
        }
        memory.sent_up_to_ms.insert(zone.id, now_local);
        indexes.push(index);
        commands.push(Routed { key, command });
    }
    (indexes, commands)
}

/// The replies to [`commands`]: queue the fleet's records that changed since last seen. A
/// zone whose command failed is sent again from the same point next round.
pub fn received(zones: &[SyncZone], sent: &[usize], replies: Vec<Result<redis::Value, SyncError>>) {
    let mut memory = MEMORY
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let memory = memory.get_or_insert_with(Memory::default);
    let offset = unix_minus_local_ms();
    let mut incoming = Vec::new();
    for (index, reply) in sent.iter().zip(replies) {
        let Some(zone) = zones.get(*index) else {
            continue;
        };
        let flat = reply
            .ok()
            .and_then(|value| redis::from_redis_value::<Vec<Vec<u8>>>(&value).ok());
        let Some(flat) = flat else {
            memory.sent_up_to_ms.remove(&zone.id);
            continue;
        };
        for pair in flat.chunks_exact(2) {
            let (key, value) = (pair[0].clone(), &pair[1]);
            // A record this instance cannot hold whole, or that is not a record: left alone.
            let Ok(block) = FleetBlock::decode(value) else {
                continue;
            };
            if key.is_empty() || key.len() > KEY_BYTES {
                continue;
            }
            let seen = memory.seen.entry((zone.id, key.clone())).or_insert(0);
            if *seen == block.changed_unix_ms {
                continue;
            }
            *seen = block.changed_unix_ms;
            let (word, changed_ms) = block.to_local(offset);
            incoming.push(Incoming {
                zone_id: zone.id,
                key,
                word,
                changed_ms,
            });
        }
    }
    // Forget keys the fleet dropped long ago: bounded by what Redis holds.
    if memory.seen.len() > 1 << 16 {
        memory.seen.clear();
    }
    if !incoming.is_empty() {
        QUEUE
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .extend(incoming);
    }
}

/// The records waiting for this worker to apply (empty but in the worker that runs the loop).
pub fn take_incoming() -> Vec<Incoming> {
    let mut queue = QUEUE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    core::mem::take(&mut *queue)
}
