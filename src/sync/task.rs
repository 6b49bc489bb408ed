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

use ratelimit_core::Limits;

use super::cluster;
use super::overrides::{OverrideSync, OVERRIDES_SCRIPT};
use super::shared::{Mode, SyncError, SyncShared};
use super::tls;
use crate::conf::LocationBursts;
use crate::glue::{now_ms, now_ns};
use crate::store::inbox::INBOX_ENTRIES;
use crate::store::Zone;

/// Applies one instance's delta to a key's fleet state on Redis's clock and returns the
/// fleet TAT's lead over Redis's now (µs), the fleet's requests in this and the previous
/// sync window, and in the previous one alone. ARGV: delta, T (µs per request), K, interval
/// (ms), idle expiry (ms), this instance's id, this send's number (unique in the instance),
/// then pairs of (number, requests) for its earlier sends whose delta this one carries again
/// (they timed out or failed, so Redis may have applied them after all, or may yet).
///
/// The key remembers, per instance (`s`/`f` + id), the last send it applied and the earliest
/// send that one carried. A send arriving late that it carried adds nothing; a send after it
/// adds its delta less what the applied one already added. So a send that timed out but was
/// applied (Redis slow, or stopped and resumed with sends queued) is charged once. Numbers
/// are written with `%.0f`: Lua's `tostring` would round a µs time to 14 digits.
const KEY_SCRIPT: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local delta = tonumber(ARGV[1])
local T = tonumber(ARGV[2])
local K = tonumber(ARGV[3])
local I = tonumber(ARGV[4]) * 1000
local sent = tonumber(ARGV[7])
local h = redis.call('HMGET', KEYS[1], 't', 'w', 'c', 'p', 's' .. ARGV[6], 'f' .. ARGV[6])
local last = tonumber(h[5]) or -1
local from = tonumber(h[6]) or -1
if sent <= last then
  if sent >= from then delta = 0 end
else
  from = sent
  for i = 8, #ARGV, 2 do
    local earlier = tonumber(ARGV[i])
    if earlier == last then delta = math.max(0, delta - tonumber(ARGV[i + 1])) end
    if earlier < from then from = earlier end
  end
  last = sent
end
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
redis.call('HSET', KEYS[1], 't', string.format('%.0f', tat), 'w', string.format('%.0f', w), 'c', c, 'p', p,
  's' .. ARGV[6], string.format('%.0f', last), 'f' .. ARGV[6], string.format('%.0f', from))
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return {tat - now, p + c, p}
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
    /// `name_seed` of the name (`crate::store::sync_record`): how the inbox names the zone
    /// to the workers.
    pub id: u64,
    /// The zone's per-key overrides as agreed with the fleet (`super::overrides`).
    pub overrides: std::cell::RefCell<OverrideSync>,
    /// The bursts the zone's `rate_limit` lines decide with: a key's fleet bucket is the
    /// largest of them (each request is decided locally with its own line's).
    pub bursts: LocationBursts,
    /// `block=`: the zone's blocks are shared too (`super::blocks`).
    pub block: Option<ratelimit_core::penalty::BlockPolicy>,
}

/// Everything the thread needs; built by a worker, moved into the thread.
pub struct Task {
    pub zones: Vec<SyncZone>,
    pub spec: SyncSpec,
    /// `tls_ca=`, `tls_cert=`/`tls_key=` as read at config time.
    pub tls: Option<redis::TlsCertificates>,
    pub sync: &'static SyncShared,
    pub pid: u64,
    pub stop: Arc<AtomicBool>,
    /// Rounds in a row that ran out of time while connecting (see `round`).
    pub connect_timeouts: core::cell::Cell<u32>,
}

// SAFETY: `Zone` holds pointers into shared memory mapped for the whole life of the process;
// the thread only uses its atomic accessors, which are valid from any thread.
unsafe impl Send for Task {}

/// What the loop remembers of a key between rounds.
#[derive(Clone, Default)]
struct KeyMemory {
    last_delta: u64,
    share: u64,
    round: u64,
    /// The sends (numbers from `SyncShared::sends`) that timed out or failed since the key's
    /// last successful one, with the delta each carried (each one's includes the earlier
    /// ones'): listed in the next send so that Redis charges once what it applied late (see
    /// `KEY_SCRIPT`).
    unconfirmed: Vec<(u64, u64)>,
}

/// Failed sends a key remembers. Beyond, the second oldest is forgotten: the oldest went out
/// on a connection that worked until then, the likeliest to be applied late (later ones
/// mostly fail to connect at all). A forgotten send applied late is charged twice (the
/// strict side).
const UNCONFIRMED: usize = 8;

/// A touched key taken in this round.
struct Entry {
    zone: usize,
    slot: usize,
    hash: u64,
    delta: u64,
    shape: FleetShape,
    /// [`KeyMemory::unconfirmed`] when the round was built.
    unconfirmed: Vec<(u64, u64)>,
}

/// The connection(s), opened lazily and dropped after any failure.
enum Link {
    Single(SingleLink),
    Cluster(cluster::ClusterLink),
}

impl Link {
    fn reset(&mut self) {
        match self {
            Link::Single(single) => {
                single.connection = None;
                single.scripts_loaded = false;
                single.connecting = false;
            }
            Link::Cluster(cluster) => cluster.reset(),
        }
    }

    /// Whether a connection was being opened (TCP, TLS, AUTH) when the round was cut short.
    fn connecting(&self) -> bool {
        match self {
            Link::Single(single) => single.connecting,
            Link::Cluster(cluster) => cluster.connecting(),
        }
    }
}

/// One Redis server.
struct SingleLink {
    client: Option<redis::Client>,
    connection: Option<redis::aio::MultiplexedConnection>,
    scripts_loaded: bool,
    /// Set while a connection is being opened (left set when a timeout cancels it).
    connecting: bool,
}

impl SingleLink {
    /// One pipeline with every command; the replies in order.
    async fn send(
        &mut self,
        commands: &[cluster::Routed],
        scripts: &[&str],
    ) -> Result<Vec<redis::Value>, SyncError> {
        let Some(client) = &self.client else {
            return Err(SyncError::BadUrl);
        };
        if self.connection.is_none() {
            self.connecting = true;
            let connection = client.get_multiplexed_async_connection().await;
            self.connecting = false;
            self.connection = Some(connection.map_err(classify)?);
        }
        let Some(connection) = self.connection.as_mut() else {
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
        let values: Vec<redis::Value> = pipe.query_async(connection).await.map_err(classify)?;
        self.scripts_loaded = true;
        Ok(values)
    }
}

/// A key script's reply: the fleet's lead (µs), recent requests, and those of the previous
/// window.
fn key_reply(value: &redis::Value) -> Result<(u64, u64, u64), SyncError> {
    let (ahead_us, recent, before) =
        redis::from_redis_value::<(i64, i64, i64)>(value).map_err(|_| SyncError::Reply)?;
    Ok((
        ahead_us.max(0) as u64,
        recent.max(0) as u64,
        before.max(0) as u64,
    ))
}

/// A limits script's reply: `Some(None)` when the fleet has no value yet, `None` when the
/// reply cannot be read.
fn limits_reply(value: &redis::Value) -> Option<Option<u64>> {
    let text = redis::from_redis_value::<Option<String>>(value).ok()?;
    Some(text.and_then(|text| text.parse().ok()))
}

impl Task {
    /// The thread's body.
    pub fn run(self) {
        if self.spec.is_tls() {
            tls::install_provider();
        }
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
        for zone in &self.zones {
            let version = self.sync.override_version(zone.id);
            zone.overrides.borrow_mut().inherit(version);
        }
        let mut link = if self.spec.cluster {
            Link::Cluster(cluster::ClusterLink::new(
                &self.spec.urls,
                self.tls.as_ref(),
            ))
        } else {
            Link::Single(SingleLink {
                client: tls::client(&self.spec.urls[0], self.tls.as_ref()).ok(),
                connection: None,
                scripts_loaded: false,
                connecting: false,
            })
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
            // This round sends whatever an admin write changed.
            self.sync.kick.store(0, Ordering::Release);
            self.round(&mut link, &mut memory).await;
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

    async fn round(&self, link: &mut Link, memory: &mut HashMap<(usize, u64), KeyMemory>) {
        let round = self.sync.round.load(Ordering::Acquire);
        let mut entries = self.collect();
        for entry in &mut entries {
            if let Some(key) = memory.get(&(entry.zone, entry.hash)) {
                entry.unconfirmed.clone_from(&key.unconfirmed);
            }
        }
        let busy = self.settle_inbox();
        let started = std::time::Instant::now();
        let timeout = Duration::from_millis(self.spec.timeout_ms);
        let send = self.sync.sends.fetch_add(1, Ordering::AcqRel) + 1;
        let (commands, with_overrides) = self.commands(&entries, send, busy);
        let results = match tokio::time::timeout(timeout, self.exchange(link, &commands)).await {
            Ok(results) => results,
            Err(_) => {
                // Stuck in a TLS handshake: typically a server that does not speak TLS and
                // waits for a command line that a ClientHello never ends.
                let error = match (link.connecting(), self.spec.is_tls()) {
                    (true, true) => SyncError::TlsNoAnswer,
                    (true, false) => SyncError::ConnectTimeout,
                    (false, _) => SyncError::Timeout,
                };
                link.reset();
                commands.iter().map(|_| Err(error)).collect()
            }
        };
        let mut results = results.into_iter();
        let heartbeat = results.next().unwrap_or(Err(SyncError::Reply));
        self.agree_control(&mut results, &with_overrides);
        let mut first_error = heartbeat.as_ref().err().copied();
        let instances = match heartbeat
            .and_then(|value| redis::from_redis_value::<u64>(&value).map_err(|_| SyncError::Reply))
        {
            Ok(instances) => instances.max(1),
            Err(error) => {
                first_error = first_error.or(Some(error));
                self.sync.instances()
            }
        };
        let mut synced = Vec::new();
        let mut failed = Vec::new();
        for (entry, result) in entries.iter().zip(results) {
            match result.and_then(|value| key_reply(&value)) {
                Ok(reply) => synced.push((entry, reply)),
                Err(error) => {
                    first_error = first_error.or(Some(error));
                    failed.push(entry);
                }
            }
        }
        self.apply(&synced, instances, round, memory);
        self.sync_blocks(link).await;
        match first_error {
            None => {
                let lag_us = started.elapsed().as_micros() as u64;
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
            }
            Some(error) => {
                link.reset();
                self.sync.errors.fetch_add(1, Ordering::Relaxed);
                // A connection still opening when the round's time ran out is told only when
                // the next attempt ends so too: a first connection may outlast a round (a cold
                // resolver, a slow AUTH), and what the next attempt finds (an authentication
                // failure, a refusal) is the news, not a time-out before it.
                let connect_timeouts = match error {
                    SyncError::ConnectTimeout => self.connect_timeouts.get() + 1,
                    _ => 0,
                };
                self.connect_timeouts.set(connect_timeouts);
                if connect_timeouts != 1 {
                    self.sync.last_error.store(error as u64, Ordering::Relaxed);
                }
                self.missed(&failed, round, send, memory);
            }
        }
        memory.retain(|_, key| round.wrapping_sub(key.round) < 100);
        // Grants were written for `round`; from now on they age.
        self.sync.round.fetch_add(1, Ordering::AcqRel);
    }

    /// The zones' blocks: this instance's changes out, the fleet's in (`super::blocks`).
    async fn sync_blocks(&self, link: &mut Link) {
        let (sent, commands) = super::blocks::commands(&self.zones, &self.spec.prefix);
        if commands.is_empty() {
            return;
        }
        let timeout = Duration::from_millis(self.spec.timeout_ms);
        let replies = match tokio::time::timeout(timeout, self.exchange(link, &commands)).await {
            Ok(replies) => replies,
            Err(_) => commands.iter().map(|_| Err(SyncError::Timeout)).collect(),
        };
        super::blocks::received(&self.zones, &sent, replies);
    }

    /// Between rounds, after an admin write or a new block: the heartbeat, the zones' limits,
    /// overrides and blocks only (no key is synced, no grant changes), so that the change
    /// reaches Redis now. A failure is left to the next round.
    async fn admin_round(&self, link: &mut Link) {
        let busy = self.settle_inbox();
        let timeout = Duration::from_millis(self.spec.timeout_ms);
        let (commands, with_overrides) = self.commands(&[], 0, busy);
        let Ok(results) = tokio::time::timeout(timeout, self.exchange(link, &commands)).await
        else {
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
                let limits = zone.override_for(hash).unwrap_or(Limits {
                    burst: synced.bursts.largest(limits.burst),
                    ..limits
                });
                let Some(shape) = FleetShape::of(zone.algorithm(), &limits) else {
                    continue;
                };
                entries.push(Entry {
                    zone: zone_index,
                    slot,
                    hash,
                    delta: (word & !ASKED).min(shape.carry_limit()),
                    shape,
                    unconfirmed: Vec::new(),
                });
            }
        }
        entries
    }

    /// The round's commands, each with the key that routes it: the heartbeat, each zone's
    /// limits, the overrides of the zones listed in the second value (those whose overrides
    /// could be read), each touched key.
    fn commands(
        &self,
        entries: &[Entry],
        send: u64,
        busy: bool,
    ) -> (Vec<cluster::Routed>, Vec<usize>) {
        let mut commands = Vec::with_capacity(1 + self.zones.len() + entries.len());
        let alive_ms = (3 * self.spec.interval_ms).max(1000);
        let key = format!("{}instances", self.spec.prefix);
        let mut command = redis::cmd("EVALSHA");
        command
            .arg(redis::Script::new(HEARTBEAT_SCRIPT).get_hash())
            .arg(1)
            .arg(&key)
            .arg(format!("{:016x}", self.sync.instance_id))
            .arg(alive_ms);
        commands.push(cluster::Routed { key, command });
        let limits_hash = redis::Script::new(LIMITS_SCRIPT).get_hash().to_string();
        for zone in &self.zones {
            let local = zone.zone.limits_word();
            let first = zone.first_round.get();
            let changed = first || local != zone.agreed_limits.get();
            let config = zone.zone.config_limits_word();
            let key = format!("{}{}:limits", self.spec.prefix, zone.name);
            let mut command = redis::cmd("EVALSHA");
            command
                .arg(&limits_hash)
                .arg(1)
                .arg(&key)
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
            commands.push(cluster::Routed { key, command });
        }
        let mut with_overrides = Vec::new();
        for (index, zone) in self.zones.iter().enumerate() {
            let key = format!("{}{}:overrides", self.spec.prefix, zone.name);
            let command = zone.overrides.borrow_mut().command(&zone.zone, key, busy);
            if let Some(command) = command {
                commands.push(command);
                with_overrides.push(index);
            }
        }
        let key_hash = redis::Script::new(KEY_SCRIPT).get_hash().to_string();
        let instance = format!("{:016x}", self.sync.instance_id);
        for entry in entries {
            let zone = &self.zones[entry.zone];
            let interval_us = (entry.shape.interval_ns / 1000).max(1);
            let idle_ms =
                (entry.shape.capacity * entry.shape.interval_ns) / 1_000_000 + 2 * alive_ms;
            let key = format!("{}{}:{:016x}", self.spec.prefix, zone.name, entry.hash);
            let mut command = redis::cmd("EVALSHA");
            command
                .arg(&key_hash)
                .arg(1)
                .arg(&key)
                .arg(entry.delta)
                .arg(interval_us)
                .arg(entry.shape.capacity)
                .arg(self.spec.interval_ms)
                .arg(idle_ms)
                .arg(&instance)
                .arg(send);
            for &(earlier, sent) in &entry.unconfirmed {
                command.arg(earlier).arg(sent);
            }
            commands.push(cluster::Routed { key, command });
        }
        (commands, with_overrides)
    }

    /// Send the commands: one pipeline to the server, or one per node of a cluster (scripts
    /// loaded in the same pipeline when not known to be). Each command's reply or error.
    async fn exchange(
        &self,
        link: &mut Link,
        commands: &[cluster::Routed],
    ) -> Vec<Result<redis::Value, SyncError>> {
        let scripts = [
            KEY_SCRIPT,
            HEARTBEAT_SCRIPT,
            LIMITS_SCRIPT,
            OVERRIDES_SCRIPT,
        ];
        match link {
            Link::Cluster(cluster) => cluster.send(commands, &scripts).await,
            Link::Single(single) => match single.send(commands, &scripts).await {
                Ok(values) if values.len() == commands.len() => {
                    values.into_iter().map(Ok).collect()
                }
                Ok(_) => commands.iter().map(|_| Err(SyncError::Reply)).collect(),
                Err(error) => commands.iter().map(|_| Err(error)).collect(),
            },
        }
    }

    /// The replies to the zones' limits and overrides (next in `results`, in the order
    /// `commands` sent them): agree with the fleet on both, and hand the fleet's override
    /// changes to the workers.
    fn agree_control(
        &self,
        results: &mut impl Iterator<Item = Result<redis::Value, SyncError>>,
        with_overrides: &[usize],
    ) {
        let fleet_limits: Vec<Option<Option<u64>>> = results
            .by_ref()
            .take(self.zones.len())
            .map(|result| result.ok().and_then(|value| limits_reply(&value)))
            .collect();
        self.agree_limits(&fleet_limits);
        for &zone in with_overrides {
            let reply = results.next().and_then(Result::ok);
            self.zones[zone]
                .overrides
                .borrow_mut()
                .agree(reply.as_ref());
        }
        self.post_inbox();
        // What a loop taking over from this one starts from.
        for &zone in with_overrides {
            let zone = &self.zones[zone];
            let version = zone.overrides.borrow().settled();
            self.sync.set_override_version(zone.id, version);
        }
    }

    /// After a round trip: the fleet's value of each zone's limits is agreed on; when it is
    /// not the zone's own (another instance's admin API changed it), the zone takes it.
    fn agree_limits(&self, fleet_limits: &[Option<Option<u64>>]) {
        let now = now_ns();
        for (zone, fleet) in self.zones.iter().zip(fleet_limits) {
            // A zone whose call failed this round tries again next round.
            let Some(fleet) = fleet else {
                continue;
            };
            zone.first_round.set(false);
            let local = zone.zone.limits_word();
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

    /// Before a round: read what a worker did with the last inbox (a change it could not
    /// apply is held back from the pushes). Returns whether fleet changes are still on their
    /// way to the zones, when a local difference is not a local change.
    fn settle_inbox(&self) -> bool {
        let mut failed = Vec::new();
        let free = self.sync.inbox.settle(&mut failed);
        for (id, change) in failed {
            if let Some(zone) = self.zones.iter().find(|zone| zone.id == id) {
                let mut overrides = zone.overrides.borrow_mut();
                overrides.stuck.insert(change.key, change.to);
            }
        }
        !free
            || self
                .zones
                .iter()
                .any(|zone| !zone.overrides.borrow().to_apply.is_empty())
    }

    /// After a round: hand the fleet's override changes to the workers when the inbox is free.
    fn post_inbox(&self) {
        if !self.sync.inbox.is_empty() {
            return;
        }
        let mut batch = Vec::new();
        for zone in &self.zones {
            let mut overrides = zone.overrides.borrow_mut();
            let room = INBOX_ENTRIES - batch.len();
            let take = overrides.to_apply.len().min(room);
            batch.extend(
                overrides
                    .to_apply
                    .drain(..take)
                    .map(|change| (zone.id, change)),
            );
        }
        self.sync.inbox.post(&mut batch);
        // Not taken (another loop got there first across a reload): kept for a later round.
        for (id, change) in batch {
            if let Some(zone) = self.zones.iter().find(|zone| zone.id == id) {
                zone.overrides.borrow_mut().to_apply.push(change);
            }
        }
    }

    /// Set each key's grant and local state from the fleet's.
    fn apply(
        &self,
        synced: &[(&Entry, (u64, u64, u64))],
        instances: u64,
        round: u64,
        memory: &mut HashMap<(usize, u64), KeyMemory>,
    ) {
        let sync_ns = self.spec.interval_ms * 1_000_000;
        let now = now_ns();
        for &(entry, (ahead_us, fleet_recent, fleet_before)) in synced {
            let Some((hash, [state, pending, grant])) =
                self.zones[entry.zone].zone.sync_slot(entry.slot)
            else {
                continue;
            };
            if hash != entry.hash {
                continue; // evicted meanwhile: the new key starts from a fresh grant.
            }
            let key = memory.entry((entry.zone, entry.hash)).or_default();
            key.unconfirmed.clear();
            let mine = entry.delta + key.last_delta;
            key.last_delta = entry.delta;
            key.share = fleet::share(mine, fleet_recent, fleet_before, instances);
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
    fn missed(
        &self,
        entries: &[&Entry],
        round: u64,
        send: u64,
        memory: &mut HashMap<(usize, u64), KeyMemory>,
    ) {
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
            // Sent (perhaps applied late): the next round says so.
            if key.unconfirmed.len() == UNCONFIRMED {
                key.unconfirmed.remove(1);
            }
            key.unconfirmed.push((send, entry.delta));
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

/// Why a connection could not be made, from the client's I/O error: refused, a name that
/// does not resolve (the resolver's error has no kind of its own, only its text), no route.
fn connect_cause(error: &redis::RedisError) -> SyncError {
    use std::io::ErrorKind;
    if error.is_connection_refusal() {
        return SyncError::ConnectRefused;
    }
    let io =
        std::error::Error::source(error).and_then(|source| source.downcast_ref::<std::io::Error>());
    match io.map(std::io::Error::kind) {
        Some(ErrorKind::ConnectionRefused) => SyncError::ConnectRefused,
        Some(ErrorKind::NetworkUnreachable | ErrorKind::HostUnreachable) => {
            SyncError::ConnectUnreachable
        }
        _ if error.to_string().contains("failed to lookup address") => SyncError::ConnectDns,
        _ => SyncError::Connect,
    }
}

/// What a client error means for the log.
pub(super) fn classify(error: redis::RedisError) -> SyncError {
    use redis::ErrorKind;
    if let Some(tls_error) = tls::classify(&error) {
        return tls_error;
    }
    match error.kind() {
        ErrorKind::AuthenticationFailed => SyncError::Auth,
        ErrorKind::IoError if error.is_timeout() => SyncError::Timeout,
        ErrorKind::IoError => connect_cause(&error),
        _ if error.is_connection_refusal() => SyncError::ConnectRefused,
        _ if error.is_connection_dropped() => SyncError::Connect,
        _ => {
            if error.to_string().contains("NOAUTH") || error.to_string().contains("WRONGPASS") {
                SyncError::Auth
            } else {
                SyncError::Reply
            }
        }
    }
}
