//! Blocks shared by the fleet (`block=` on a `sync` zone): each round, the loop sends the
//! zone's block records changed since its last round and reads back the fleet's records
//! written since its last cut, one page at a time, in one script per zone on the zone's block
//! hash (`ratelimit_core::fleet_blocks`: the record changed last wins; the hash holds at most
//! `MAX_RECORDS`; a record is deleted once its block has ended). Each record is stamped with
//! the Redis server's time when written, which is what a reader's cut is in: a change that
//! reaches Redis late (its instance was cut off) is still read. The fleet's records, checked
//! (`FleetBlock::check`: bad ones are dropped and counted in `bad_values`), wait in this
//! process's queue until the worker's watch timer applies them through the control layer (a
//! claim needs the zone's lock, which the thread may not take).
//!
//! So a block or a release made on any instance (by a rejection, the admin API or Lua) is in
//! Redis at the end of that instance's round, and in every other instance's zone within its
//! next round and a watch period: within two intervals. A restarted instance reads the blocks
//! in force from its first round on, a page a round.
//!
//! Kept apart from the loop's key sync (`task.rs` calls [`commands`] and [`received`] once per
//! round, in an exchange of its own whose replies are bounded by the page), and from nginx:
//! only plain data crosses to the worker.

use std::collections::HashMap;
use std::sync::Mutex;

use ratelimit_core::block_table::KEY_BYTES;
use ratelimit_core::fleet_blocks::{
    FleetBlock, RecordRefusal, KEEP_RELEASED_MS, MAX_RECORDS, PAGE_RECORDS,
};
use ratelimit_core::penalty::BlockWord;

use super::cluster::Routed;
use super::shared::{Bad, SyncError, SyncShared};
use super::zone::SyncZone;
use crate::glue::{now_ms, unix_minus_local_ms};

/// The value noted for a record that is not one (`bad_values`).
pub(super) const BLOCK_RECORD_MALFORMED: u64 = u64::MAX;

/// KEYS[1] the zone's hash. ARGV: [1] now (Unix ms, the instance's), [2] the most records,
/// [3] how long a released record stays after it was written (ms), [4] [5] the reader's cut
/// (server ms, field: records written after it are read), [6] the page's most records, then
/// the changes (key, value, changed Unix ms). A change is kept unless the fleet's record of
/// the key changed at the same time or later, and a new key only while the hash has room.
/// Each stored value gets the server's time as a fifth field. Returns `[more, cut ms, cut
/// field, malformed, refused, key, value, ...]`: the page of records written after the cut
/// (oldest first, values without their stamp), where the next page starts (or, with `more` 0,
/// where the next round's starts), how many malformed records were deleted and how many new
/// keys found the hash full.
const BLOCKS_SCRIPT: &str = r#"
if redis.replicate_commands then redis.replicate_commands() end
local hash = KEYS[1]
local now, most, keep = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local after_ms, after_field, page = tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
local time = redis.call('TIME')
local stamp = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local pattern = '^(1 (%d+) (%d+) (%d+)) ?(%d*)$'
local count = redis.call('HLEN', hash)
local refused = 0
for i = 7, #ARGV, 3 do
  local current = redis.call('HGET', hash, ARGV[i])
  local changed = nil
  if current then
    local _, _, c = string.match(current, pattern)
    changed = c and math.min(tonumber(c), now)
  end
  if not current and count >= most then
    refused = refused + 1
  elseif not changed or changed < tonumber(ARGV[i + 2]) then
    redis.call('HSET', hash, ARGV[i], ARGV[i + 1] .. ' ' .. stamp)
    if not current then count = count + 1 end
  end
end
local all = redis.call('HGETALL', hash)
local live, fresh = {}, {}
local malformed = 0
for i = 1, #all, 2 do
  local field, value = all[i], all[i + 1]
  local record, untils, changed, level, written = string.match(value, pattern)
  if not record or #field == 0 or #field > 64 or #value > 80 then
    redis.call('HDEL', hash, field)
    malformed = malformed + 1
  else
    untils, written = tonumber(untils), tonumber(written)
    if tonumber(changed) > now then
      -- A change from the future would win over every real one: it is now.
      record = '1 ' .. untils .. ' ' .. now .. ' ' .. level
      written = nil
    end
    if not written then
      -- Not written by the script (by hand): new now, unless it has ended.
      written = untils < now and 0 or stamp
      redis.call('HSET', hash, field, record .. ' ' .. stamp)
    end
    if untils < now and written + keep < stamp then
      redis.call('HDEL', hash, field)
    else
      live[#live + 1] = {untils, field, written, record}
    end
  end
end
if #live > most then
  table.sort(live, function(a, b) return a[1] > b[1] end)
  for i = most + 1, #live do redis.call('HDEL', hash, live[i][2]) end
  for i = #live, most + 1, -1 do live[i] = nil end
end
for _, r in ipairs(live) do
  if r[3] > after_ms or (r[3] == after_ms and r[2] > after_field) then
    fresh[#fresh + 1] = r
  end
end
table.sort(fresh, function(a, b)
  if a[3] ~= b[3] then return a[3] < b[3] end
  return a[2] < b[2]
end)
local reply = {'0', tostring(math.max(stamp - 2000, 0)), '', tostring(malformed), tostring(refused)}
local last = math.min(#fresh, page)
if #fresh > page then
  reply[1], reply[2], reply[3] = '1', tostring(fresh[last][3]), fresh[last][2]
end
for i = 1, last do
  reply[#reply + 1] = fresh[i][2]
  reply[#reply + 1] = fresh[i][4]
end
return reply
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
    /// Per zone: the cut of its last read (server ms, field); none yet: the whole hash.
    cut: HashMap<u64, (u64, Vec<u8>)>,
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
        let (cut_ms, cut_field) = memory.cut.get(&zone.id).cloned().unwrap_or_default();
        let _ = policy;
        let key = FleetBlock::redis_key(prefix, &zone.name);
        let mut command = redis::cmd("EVAL");
        command
            .arg(BLOCKS_SCRIPT)
            .arg(1)
            .arg(&key)
            .arg((now_local as i64 + offset).max(0))
            .arg(MAX_RECORDS)
            .arg(KEEP_RELEASED_MS)
            .arg(cut_ms)
            .arg(cut_field)
            .arg(PAGE_RECORDS);
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

/// The replies to [`commands`]: queue the fleet's records that changed since last seen,
/// checked first (a bad one is dropped and counted in `sync`'s `bad_values`). A zone whose
/// command failed is sent again, and read again, from the same points next round.
pub fn received(
    zones: &[SyncZone],
    sent: &[usize],
    replies: Vec<Result<redis::Value, SyncError>>,
    sync: &SyncShared,
) {
    let mut memory = MEMORY
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let memory = memory.get_or_insert_with(Memory::default);
    let offset = unix_minus_local_ms();
    let now_unix_ms = (now_ms() as i64 + offset).max(0) as u64;
    let mut incoming = Vec::new();
    for (index, reply) in sent.iter().zip(replies) {
        let Some(zone) = zones.get(*index) else {
            continue;
        };
        let Some(policy) = zone.block else {
            continue;
        };
        let flat = reply
            .ok()
            .and_then(|value| redis::from_redis_value::<Vec<Vec<u8>>>(&value).ok());
        let Some(page) = flat.as_deref().and_then(Page::read) else {
            memory.sent_up_to_ms.remove(&zone.id);
            continue;
        };
        for _ in 0..page.malformed.min(64) {
            sync.note_bad(Bad::BlockRecord, zone.id, BLOCK_RECORD_MALFORMED, 0);
        }
        memory.cut.insert(zone.id, page.cut);
        for pair in page.records.chunks_exact(2) {
            let (key, value) = (&pair[0], &pair[1]);
            let Ok(block) = FleetBlock::decode(value) else {
                sync.note_bad(Bad::BlockRecord, zone.id, BLOCK_RECORD_MALFORMED, 0);
                continue;
            };
            if key.is_empty() || key.len() > KEY_BYTES {
                sync.note_bad(Bad::BlockRecord, zone.id, BLOCK_RECORD_MALFORMED, 0);
                continue;
            }
            let block = match block.check(now_unix_ms, &policy) {
                Ok(block) => block,
                Err(RecordRefusal::TooLong {
                    remaining_ms,
                    bound_ms,
                }) => {
                    sync.note_bad(Bad::BlockRecord, zone.id, remaining_ms, bound_ms);
                    continue;
                }
                Err(RecordRefusal::Level { level, top }) => {
                    sync.note_bad(Bad::BlockRecord, zone.id, u64::from(level), u64::from(top));
                    continue;
                }
            };
            let seen = memory.seen.entry((zone.id, key.clone())).or_insert(0);
            if *seen == block.changed_unix_ms {
                continue;
            }
            *seen = block.changed_unix_ms;
            let (word, changed_ms) = block.to_local(offset);
            incoming.push(Incoming {
                zone_id: zone.id,
                key: key.clone(),
                word,
                changed_ms,
            });
        }
    }
    // Forget keys the fleet dropped long ago: bounded by what Redis holds.
    if memory.seen.len() > 2 * MAX_RECORDS * zones.len().max(1) {
        memory.seen.clear();
    }
    if !incoming.is_empty() {
        QUEUE
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .extend(incoming);
    }
}

/// One zone's reply: where the next read starts, and the page's records (key, value, ...).
struct Page<'a> {
    cut: (u64, Vec<u8>),
    malformed: u64,
    records: &'a [Vec<u8>],
}

impl Page<'_> {
    fn read(flat: &[Vec<u8>]) -> Option<Page<'_>> {
        let number = |bytes: &[u8]| std::str::from_utf8(bytes).ok()?.parse::<u64>().ok();
        let [_more, cut_ms, cut_field, malformed, _refused, records @ ..] = flat else {
            return None;
        };
        if records.len() % 2 != 0 || records.len() > 2 * PAGE_RECORDS {
            return None;
        }
        Some(Page {
            cut: (number(cut_ms)?, cut_field.clone()),
            malformed: number(malformed)?,
            records,
        })
    }
}

/// The records waiting for this worker to apply (empty but in the worker that runs the loop).
pub fn take_incoming() -> Vec<Incoming> {
    let mut queue = QUEUE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    core::mem::take(&mut *queue)
}
