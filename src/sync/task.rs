//! The sync loop: one thread per nginx instance (in the worker that owns the election in
//! [`SyncShared`]), with a current-thread tokio runtime and the `redis` crate's multiplexed
//! connection. It never calls an nginx API; it reads and writes shared memory only.
//!
//! Each round: take every touched key's pending delta (atomic swap, so a delta is sent by
//! exactly one loop even when two overlap across a reload), send one pipeline (the heartbeat
//! and one `EVALSHA` per key, scripts loaded in the same pipeline when needed), and from the
//! replies set each key's grant and raise its local state (`ratelimit_core::fleet`). A round
//! that fails or times out puts the deltas back (bounded when sent) and grants from shares.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ratelimit_core::fleet::{self, grant_word, FleetShape, ASKED};
use ratelimit_core::sync_spec::{OnFailure, SyncSpec};

use super::shared::{Mode, SyncError, SyncShared};
use crate::zone::Zone;

/// Applies one instance's delta to a key's fleet state on Redis's clock and returns the
/// fleet TAT's lead over Redis's now (µs) and the fleet's requests in this and the previous
/// sync window. ARGV: delta, T (µs per request), K, interval (ms), idle expiry (ms).
/// Numbers are written with `%.0f`: Lua's `tostring` would round a µs time to 14 digits.
const KEY_SCRIPT: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local delta = tonumber(ARGV[1])
local T = tonumber(ARGV[2])
local K = tonumber(ARGV[3])
local I = tonumber(ARGV[4]) * 1000
local h = redis.call('HMGET', KEYS[1], 't', 'w', 'c', 'p')
local tat = tonumber(h[1]) or 0
if tat < now then tat = now end
tat = tat + delta * T
local cap = now + 2 * K * T + I
if tat > cap then tat = cap end
local w = math.floor(now / I)
local hw = tonumber(h[2]) or w
local c = tonumber(h[3]) or 0
local p = tonumber(h[4]) or 0
if hw == w - 1 then p = c; c = 0 elseif hw ~= w then p = 0; c = 0 end
c = c + delta
redis.call('HSET', KEYS[1], 't', string.format('%.0f', tat), 'w', string.format('%.0f', w), 'c', c, 'p', p)
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return {tat - now, p + c}
"#;

/// Records this instance alive (a sorted set scored by Redis's milliseconds) and returns how
/// many were alive within ARGV[2] ms.
const HEARTBEAT_SCRIPT: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return redis.call('ZCARD', KEYS[1])
"#;

/// A zone's limits (packed `Limits`) shared by the fleet, in a hash: `v` the limits in force,
/// `c` the configuration file's value they were last set from. ARGV[1], when not empty, is
/// this instance's value; ARGV[2], sent in a loop's first round only, its file's value.
/// An admin change (ARGV[1] alone) replaces `v`. A loop's first round replaces `v` only
/// when its file says something else than `c` (the file was edited and reloaded): a restart
/// with the same file takes the fleet's value, as one instance keeps an admin change across
/// reloads until its file changes. The reply is `v` (`false` when never set).
const LIMITS_SCRIPT: &str = r#"
if ARGV[2] ~= '' then
  if redis.call('HGET', KEYS[1], 'c') ~= ARGV[2] then
    redis.call('HSET', KEYS[1], 'c', ARGV[2], 'v', ARGV[1])
  end
elseif ARGV[1] ~= '' then
  redis.call('HSET', KEYS[1], 'v', ARGV[1])
end
return redis.call('HGET', KEYS[1], 'v')
"#;

/// One sync zone as the loop sees it.
pub struct SyncZone {
    pub name: String,
    pub zone: Zone,
    /// The zone's limits as last agreed with the fleet (packed): a different local value is
    /// an admin change to push, a different fleet value one to apply.
    pub agreed_limits: std::cell::Cell<u64>,
    /// Until the first successful round: the file's value is sent along (see
    /// `LIMITS_SCRIPT`).
    pub first_round: std::cell::Cell<bool>,
}

/// Everything the thread needs; built by a worker, moved into the thread.
pub struct Task {
    pub zones: Vec<SyncZone>,
    pub spec: SyncSpec,
    pub sync: &'static SyncShared,
    pub pid: u64,
    pub stop: Arc<AtomicBool>,
}

// SAFETY: `Zone` holds pointers into shared memory mapped for the whole life of the process;
// the thread only uses its atomic accessors, which are valid from any thread.
unsafe impl Send for Task {}

/// What the loop remembers of a key between rounds.
#[derive(Clone, Copy, Default)]
struct KeyMemory {
    last_delta: u64,
    share: u64,
    round: u64,
}

/// A touched key taken in this round.
struct Entry {
    zone: usize,
    slot: usize,
    hash: u64,
    delta: u64,
    shape: FleetShape,
}

/// The connection, opened lazily and dropped after any failure.
struct Link {
    client: Option<redis::Client>,
    connection: Option<redis::aio::MultiplexedConnection>,
    scripts_loaded: bool,
}

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

    fn interval(&self) -> Duration {
        Duration::from_millis(self.spec.interval_ms)
    }

    async fn main_loop(self) {
        let mut link = Link {
            client: redis::Client::open(self.spec.urls[0].as_str()).ok(),
            connection: None,
            scripts_loaded: false,
        };
        let mut memory = HashMap::new();
        let mut next = tokio::time::Instant::now();
        loop {
            if self.sync.owner_pid.load(Ordering::Acquire) != self.pid {
                // Another worker took over (this one looked dead): its loop goes on.
                return;
            }
            let stopping = self.stop.load(Ordering::Acquire);
            self.sync.heartbeat_ms.store(now_ms(), Ordering::Release);
            self.round(&mut link, &mut memory).await;
            if stopping {
                return;
            }
            next += self.interval();
            let now = tokio::time::Instant::now();
            if next < now {
                next = now;
            }
            // Sleep in short steps so that a stop is noticed quickly.
            while tokio::time::Instant::now() < next && !self.stop.load(Ordering::Acquire) {
                let step = next.saturating_duration_since(tokio::time::Instant::now());
                tokio::time::sleep(step.min(Duration::from_millis(20))).await;
            }
        }
    }

    async fn round(&self, link: &mut Link, memory: &mut HashMap<(usize, u64), KeyMemory>) {
        let round = self.sync.round.load(Ordering::Acquire);
        let entries = self.collect();
        let started = std::time::Instant::now();
        let timeout = Duration::from_millis(self.spec.timeout_ms);
        let result = tokio::time::timeout(timeout, self.exchange(link, &entries)).await;
        let outcome = match result {
            Ok(Ok(replies)) => Ok(replies),
            Ok(Err(error)) => Err(error),
            Err(_) => Err(SyncError::Timeout),
        };
        match outcome {
            Ok((instances, replies)) => {
                let lag_us = started.elapsed().as_micros() as u64;
                self.apply(&entries, &replies, instances, round, memory);
                self.sync
                    .instances
                    .store(instances.max(1), Ordering::Relaxed);
                self.sync.lag_us.store(lag_us, Ordering::Relaxed);
                self.sync.last_ok_ms.store(now_ms(), Ordering::Relaxed);
                self.sync.round_trips.fetch_add(1, Ordering::Relaxed);
                self.sync
                    .keys_pushed
                    .fetch_add(entries.len() as u64, Ordering::Relaxed);
                self.sync.missed.store(0, Ordering::Relaxed);
                self.sync.last_error.store(0, Ordering::Relaxed);
                self.sync.mode.store(Mode::Synced as u64, Ordering::Release);
            }
            Err(error) => {
                link.connection = None;
                link.scripts_loaded = false;
                self.sync.errors.fetch_add(1, Ordering::Relaxed);
                self.sync.last_error.store(error as u64, Ordering::Relaxed);
                self.missed(&entries, round, memory);
            }
        }
        memory.retain(|_, key| round.wrapping_sub(key.round) < 100);
        // Grants were written for `round`; from now on they age.
        self.sync.round.fetch_add(1, Ordering::AcqRel);
    }

    /// Take the pending delta of every touched key (swapped to 0: whatever is charged from now
    /// on goes to the next round).
    fn collect(&self) -> Vec<Entry> {
        let mut entries = Vec::new();
        for (zone_index, synced) in self.zones.iter().enumerate() {
            let zone = &synced.zone;
            let Some(limits) = zone.limits() else {
                continue;
            };
            for slot in 0..zone.slot_count() {
                let Some((hash, [_, pending, _])) = zone.sync_slot(slot) else {
                    break;
                };
                if hash == 0 || pending.load(Ordering::Relaxed) == 0 {
                    continue;
                }
                let word = pending.swap(0, Ordering::AcqRel);
                let limits = zone.override_for(hash).unwrap_or(limits);
                let Some(shape) = FleetShape::of(zone.algorithm(), &limits) else {
                    continue;
                };
                entries.push(Entry {
                    zone: zone_index,
                    slot,
                    hash,
                    delta: (word & !ASKED).min(shape.carry_limit()),
                    shape,
                });
            }
        }
        entries
    }

    /// One pipeline: scripts (when not known to be loaded), the heartbeat, one call per key.
    async fn exchange(
        &self,
        link: &mut Link,
        entries: &[Entry],
    ) -> Result<(u64, Vec<(u64, u64)>), SyncError> {
        let Some(client) = &link.client else {
            return Err(SyncError::BadUrl);
        };
        if link.connection.is_none() {
            let connection = client
                .get_multiplexed_async_connection()
                .await
                .map_err(classify)?;
            link.connection = Some(connection);
        }
        let Some(connection) = link.connection.as_mut() else {
            return Err(SyncError::Connect);
        };
        let key_script = redis::Script::new(KEY_SCRIPT);
        let heartbeat_script = redis::Script::new(HEARTBEAT_SCRIPT);
        let mut pipe = redis::pipe();
        if !link.scripts_loaded {
            pipe.cmd("SCRIPT").arg("LOAD").arg(KEY_SCRIPT).ignore();
            pipe.cmd("SCRIPT")
                .arg("LOAD")
                .arg(HEARTBEAT_SCRIPT)
                .ignore();
            pipe.cmd("SCRIPT").arg("LOAD").arg(LIMITS_SCRIPT).ignore();
        }
        let alive_ms = (3 * self.spec.interval_ms).max(1000);
        pipe.cmd("EVALSHA")
            .arg(heartbeat_script.get_hash())
            .arg(1)
            .arg(format!("{}instances", self.spec.prefix))
            .arg(format!("{:016x}", self.sync.instance_id))
            .arg(alive_ms);
        let limits_script = redis::Script::new(LIMITS_SCRIPT);
        for zone in &self.zones {
            let header = zone.zone.header();
            let local = header.limits.load(Ordering::Acquire);
            let first = zone.first_round.get();
            let changed = first || local != zone.agreed_limits.get();
            let config = header.config_limits.load(Ordering::Acquire);
            pipe.cmd("EVALSHA")
                .arg(limits_script.get_hash())
                .arg(1)
                .arg(format!("{}{}:limits", self.spec.prefix, zone.name))
                .arg(if changed {
                    local.to_string()
                } else {
                    String::new()
                })
                .arg(if first {
                    config.to_string()
                } else {
                    String::new()
                });
        }
        for entry in entries {
            let zone = &self.zones[entry.zone];
            let interval_us = (entry.shape.interval_ns / 1000).max(1);
            let idle_ms =
                (entry.shape.capacity * entry.shape.interval_ns) / 1_000_000 + 2 * alive_ms;
            pipe.cmd("EVALSHA")
                .arg(key_script.get_hash())
                .arg(1)
                .arg(format!(
                    "{}{}:{:016x}",
                    self.spec.prefix, zone.name, entry.hash
                ))
                .arg(entry.delta)
                .arg(interval_us)
                .arg(entry.shape.capacity)
                .arg(self.spec.interval_ms)
                .arg(idle_ms);
        }
        let (instances, fleet_limits, replies): (u64, Vec<Option<u64>>, Vec<(i64, i64)>) = {
            let values: Vec<redis::Value> = pipe.query_async(connection).await.map_err(classify)?;
            let mut values = values.into_iter();
            let instances = values
                .next()
                .and_then(|value| redis::from_redis_value::<u64>(&value).ok())
                .ok_or(SyncError::Reply)?;
            let fleet_limits = values
                .by_ref()
                .take(self.zones.len())
                .map(|value| {
                    redis::from_redis_value::<Option<String>>(&value)
                        .map(|text| text.and_then(|text| text.parse().ok()))
                })
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| SyncError::Reply)?;
            let replies = values
                .map(|value| redis::from_redis_value::<(i64, i64)>(&value))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| SyncError::Reply)?;
            (instances, fleet_limits, replies)
        };
        self.agree_limits(&fleet_limits);
        link.scripts_loaded = true;
        if replies.len() != entries.len() {
            return Err(SyncError::Reply);
        }
        let replies = replies
            .into_iter()
            .map(|(ahead_us, recent)| (ahead_us.max(0) as u64, recent.max(0) as u64))
            .collect();
        Ok((instances, replies))
    }

    /// After a round trip: the fleet's value of each zone's limits is agreed on; when it is
    /// not the zone's own (another instance's admin API changed it), the zone takes it.
    fn agree_limits(&self, fleet_limits: &[Option<u64>]) {
        let now = crate::handler::now_ns();
        for (zone, fleet) in self.zones.iter().zip(fleet_limits) {
            zone.first_round.set(false);
            let local = zone.zone.header().limits.load(Ordering::Acquire);
            let Some(fleet) = fleet.filter(|&fleet| fleet != local) else {
                zone.agreed_limits.set(local);
                continue;
            };
            if local != zone.agreed_limits.get() {
                // Changed here after this round's push was built: pushed next round.
                continue;
            }
            if let Some(limits) = ratelimit_core::Limits::unpack(fleet) {
                zone.zone.set_limits(limits, now);
                zone.agreed_limits.set(fleet);
            }
        }
    }

    /// Set each key's grant and local state from the fleet's.
    fn apply(
        &self,
        entries: &[Entry],
        replies: &[(u64, u64)],
        instances: u64,
        round: u64,
        memory: &mut HashMap<(usize, u64), KeyMemory>,
    ) {
        let sync_ns = self.spec.interval_ms * 1_000_000;
        let now = crate::handler::now_ns();
        for (entry, &(ahead_us, fleet_recent)) in entries.iter().zip(replies) {
            let Some((hash, [state, pending, grant])) =
                self.zones[entry.zone].zone.sync_slot(entry.slot)
            else {
                continue;
            };
            if hash != entry.hash {
                continue; // evicted meanwhile: the new key starts from a fresh grant.
            }
            let key = memory.entry((entry.zone, entry.hash)).or_default();
            let mine = entry.delta + key.last_delta;
            key.last_delta = entry.delta;
            key.share = fleet::share(mine, fleet_recent, instances);
            key.round = round;
            let ahead_ns = ahead_us.saturating_mul(1000);
            let room = fleet::fleet_room_milli(&entry.shape, ahead_ns, sync_ns);
            let spent_since = pending.load(Ordering::Acquire) & !ASKED;
            let granted = fleet::grant_milli(room, key.share, spent_since);
            grant.store(grant_word::pack(round as u32, granted), Ordering::Release);
            let algorithm = self.zones[entry.zone].zone.algorithm();
            let _ = state.fetch_update(Ordering::AcqRel, Ordering::Acquire, |current| {
                let raised = fleet::raise_local_state(current, algorithm, ahead_ns, now);
                (raised != current).then_some(raised)
            });
        }
    }

    /// A failed round: the deltas go back (the fleet is charged for them later), the mode
    /// follows the misses, and the touched keys get grants from shares.
    fn missed(&self, entries: &[Entry], round: u64, memory: &mut HashMap<(usize, u64), KeyMemory>) {
        let missed = self.sync.missed.fetch_add(1, Ordering::AcqRel) + 1;
        let was = self.sync.mode();
        let mode = if missed >= u64::from(SyncSpec::FAILED_AFTER_ROUNDS) {
            match self.spec.on_failure {
                OnFailure::LocalShare => Mode::LocalShare,
                OnFailure::Open => Mode::Open,
                OnFailure::Closed => Mode::Closed,
            }
        } else if was == Mode::Starting {
            Mode::Starting
        } else {
            Mode::Degraded
        };
        self.sync.mode.store(mode as u64, Ordering::Release);
        let sync_ns = self.spec.interval_ms * 1_000_000;
        let instances = self.sync.instances();
        for entry in entries {
            let Some((hash, [_, pending, grant])) =
                self.zones[entry.zone].zone.sync_slot(entry.slot)
            else {
                continue;
            };
            if hash != entry.hash {
                continue;
            }
            pending.fetch_add(entry.delta, Ordering::AcqRel);
            let key = memory.entry((entry.zone, entry.hash)).or_default();
            key.round = round;
            let (_, left) = grant_word::unpack(grant.load(Ordering::Acquire));
            let granted = match mode {
                Mode::Degraded if key.share > 0 => {
                    fleet::share_refill_grant_milli(&entry.shape, key.share, sync_ns, left)
                }
                _ => fleet::local_share_grant_milli(&entry.shape, instances, sync_ns, left),
            };
            grant.store(grant_word::pack(round as u32, granted), Ordering::Release);
        }
    }
}

/// Monotonic milliseconds (the clock every worker reads too).
pub fn now_ms() -> u64 {
    crate::handler::now_ns() / 1_000_000
}

fn classify(error: redis::RedisError) -> SyncError {
    use redis::ErrorKind;
    match error.kind() {
        ErrorKind::AuthenticationFailed => SyncError::Auth,
        ErrorKind::IoError => {
            if error.is_timeout() {
                SyncError::Timeout
            } else {
                SyncError::Connect
            }
        }
        _ if error.is_connection_refusal() || error.is_connection_dropped() => SyncError::Connect,
        _ => {
            if error.to_string().contains("NOAUTH") || error.to_string().contains("WRONGPASS") {
                SyncError::Auth
            } else {
                SyncError::Reply
            }
        }
    }
}
