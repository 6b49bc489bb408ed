//! The sync loop: one thread per nginx instance (in the worker that owns the election in
//! [`SyncShared`]), with a current-thread tokio runtime and the `redis` crate's multiplexed
//! connection over the loop's own bounded connections (`super::link`). It never calls an
//! nginx API; it reads and writes shared memory only.
//!
//! Each round: scan the sync zones' slots for keys that need the fleet (`urgency`: a refused
//! request, or a pending delta over half of what the instance may take alone), take the most
//! urgent ones up to the round's budget (their pending deltas swapped out atomically, so a
//! delta is sent by exactly one loop even when two overlap across a reload; keys evicted since
//! the last round come from the orphan ring), and send one pipeline per node: the heartbeat,
//! each zone's limits and overrides, and the keys in batches of one script call per slot
//! group. From the replies, each checked against bounds computed here, set each key's grant
//! and settle its local state (`ratelimit_core::fleet`). A round that fails or times out puts
//! the deltas back in their slots (merged with what came since), grants from shares, and the
//! rounds after it send no key until Redis answers again.

use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ratelimit_core::fleet::{self, grant_word, FleetShape, ASKED};
use ratelimit_core::fleet_round::{self, BadValue, RoundBudget};
use ratelimit_core::sync_spec::{OnFailure, SyncSpec};
use ratelimit_core::Limits;

use super::cluster;
use super::leases::{LeaseZone, Leases};
use super::link::{self, ReadBudget};
use super::overrides::OVERRIDES_SCRIPT;
use super::shared::{Bad, Mode, SyncError, SyncShared};
use super::zone::SyncZone;
use crate::glue::{now_ms, now_ns};
use crate::store::inbox::INBOX_ENTRIES;

/// Applies the instances' deltas to many keys at once, each on Redis's clock (`TIME`: nodes'
/// clocks need not agree). ARGV: this instance's id, this send's number (unique in the
/// instance), the sync interval (ms); then per key (KEYS[k]): its delta, `T` (ns per
/// request), `K`, the idle expiry (ms), `n`, and `n` pairs of (number, requests) for the
/// earlier sends whose delta this one carries again (they timed out or failed, so Redis may
/// have applied them after all, or may yet). Returns three integers per key: how far the
/// fleet's TAT leads Redis's clock (us), the fleet's requests in this and the previous sync
/// window, and in the previous one alone.
///
/// Per key and instance (`s`/`f`/`a` + id) it keeps the last send it applied, the earliest
/// send that one carried, and when it applied it: a late send already carried adds nothing,
/// a send after it adds its delta less what the applied one already added (so a send that
/// timed out but was applied is charged once), and a delta is charged from no earlier than
/// the instance's previous applied send (its requests were all admitted after it; one
/// interval back for a first send): charging them all at `now` would count the interval's
/// drain against the fleet twice. `r` is the `T` the TAT was written at: after an admin
/// change, the lead is re-expressed at the new `T` first (the backlog kept in requests). The
/// TAT stays at most two buckets and one interval ahead. Numbers are written with `%.0f`:
/// Lua's `tostring` would round a us time to 14 digits.
const KEY_SCRIPT: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local id = ARGV[1]
local sent = tonumber(ARGV[2])
local I = tonumber(ARGV[3]) * 1000
local w = math.floor(now / I)
local out = {}
local at = 4
for k = 1, #KEYS do
  local delta = tonumber(ARGV[at])
  local tns = tonumber(ARGV[at + 1])
  local T = tns / 1000
  local K = tonumber(ARGV[at + 2])
  local n = tonumber(ARGV[at + 4])
  local h = redis.call('HMGET', KEYS[k], 't', 'w', 'c', 'p', 'r', 's' .. id, 'f' .. id, 'a' .. id)
  local last = tonumber(h[6]) or -1
  local from = tonumber(h[7]) or -1
  local since = tonumber(h[8]) or (now - I)
  local applied = since
  if sent <= last then
    if sent >= from then delta = 0 end
  else
    from = sent
    for i = at + 5, at + 3 + 2 * n, 2 do
      local earlier = tonumber(ARGV[i])
      if earlier == last then delta = math.max(0, delta - tonumber(ARGV[i + 1])) end
      if earlier < from then from = earlier end
    end
    last = sent
    applied = now
  end
  local cap = 2 * K * T + I
  local tat = tonumber(h[1]) or 0
  local r = tonumber(h[5])
  if r and r > 0 and r ~= tns and tat > now then tat = now + (tat - now) * tns / r end
  if since > now then since = now end
  if tat < since then tat = since end
  tat = tat + delta * T
  if tat > now + cap then tat = now + cap end
  local ahead = tat - now
  if ahead < 0 then ahead = 0 end
  local hw = tonumber(h[2]) or w
  local c = tonumber(h[3]) or 0
  local p = tonumber(h[4]) or 0
  if hw == w - 1 then p = c; c = 0 elseif hw ~= w then p = 0; c = 0 end
  c = c + delta
  redis.call('HSET', KEYS[k], 't', string.format('%.0f', tat), 'r', ARGV[at + 1],
    'w', string.format('%.0f', w), 'c', c, 'p', p,
    's' .. id, string.format('%.0f', last), 'f' .. id, string.format('%.0f', from),
    'a' .. id, string.format('%.0f', applied))
  redis.call('PEXPIRE', KEYS[k], ARGV[at + 3])
  out[#out + 1] = ahead
  out[#out + 1] = p + c
  out[#out + 1] = p
  at = at + 5 + 2 * n
end
return out
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

/// Keys in one key script call: a call runs alone in Redis, so a few milliseconds at most.
const KEYS_PER_CALL: usize = 256;

/// Slot groups of a zone's keys: a key's Redis name carries `{NN}`, one of this many hash
/// tags, so that a Redis Cluster puts the keys of one group in one slot (a script call's keys
/// must share a slot) while the groups spread over the cluster's nodes.
const SLOT_GROUPS: u64 = 64;

/// Keys whose fleet share a loop remembers (bounded: the least recently synced go first).
const REMEMBERED_KEYS: usize = 65_536;

/// Failed sends a key remembers. Beyond, the second oldest is forgotten: the oldest went out
/// on a connection that worked until then, the likeliest to be applied late (later ones
/// mostly fail to connect at all). A forgotten send applied late is charged twice (the
/// strict side).
const UNCONFIRMED: usize = 8;

/// Everything the thread needs; built by a worker, moved into the thread.
pub struct Task {
    pub zones: Vec<SyncZone>,
    /// The `sync` concurrency zones (`super::leases`).
    pub lease_zones: Vec<LeaseZone>,
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
/// Why limits from Redis (the fleet's, or an override's) are not taken.
#[derive(Debug, thiserror::Error)]
enum BadLimits {
    #[error("{0} is not packed limits")]
    NotPacked(u64),
    #[error(transparent)]
    Refused(#[from] ratelimit_admin::ApiError),
}

#[derive(Clone, Copy, Default)]
struct KeyMemory {
    last_delta: u64,
    share: u64,
    round: u64,
}

/// What the loop keeps between rounds, bounded.
struct LoopState {
    keys: HashMap<(usize, u64), KeyMemory>,
    /// The sends (numbers from `SyncShared::sends`) of a key that timed out or failed since
    /// its last successful one, with the delta each carried (each one's includes the earlier
    /// ones'): listed in the key's next send so that Redis charges once what it applied late
    /// (see `KEY_SCRIPT`). Bounded like `keys`.
    unconfirmed: HashMap<(usize, u64), Vec<(u64, u64)>>,
    budget: RoundBudget,
    /// The last round failed: send no key until a round trip succeeds.
    failing: bool,
    /// Rounds timed out in a row on the connections kept open.
    timeouts: u32,
    /// The leases of the `sync` concurrency zones' keys.
    leases: Leases,
    /// What the timed-out exchanges still pending on those connections may read when Redis
    /// answers them late (added to the next exchange's bound, at most [`LATE_BYTES_MAX`]).
    late_bytes: usize,
}

/// The most bytes of one key's lease reply (five integers).
const LEASE_REPLY_BYTES: usize = 128;

/// Timed-out rounds after which the connections are opened again (a peer gone without a
/// reset would otherwise keep them for good). Until then a round that times out keeps its
/// connections: a stalled Redis gets no new connection, handshake and script loads per round
/// to work through when it resumes, and answers the next round within an interval.
const KEEP_AFTER_TIMEOUTS: u32 = 10;

/// The most a connection kept open after timeouts may read on top of an exchange's bound.
const LATE_BYTES_MAX: usize = 8 << 20;

/// A key that needs the fleet this round, as the scan found it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Candidate {
    rank: u64,
    zone: usize,
    slot: usize,
    hash: u64,
}

/// A key taken in this round.
struct Entry {
    zone: usize,
    /// Its slot, or `None` for a key evicted since the last round (from the orphan ring).
    slot: Option<usize>,
    hash: u64,
    delta: u64,
    shape: FleetShape,
    /// [`LoopState::unconfirmed`] when the round was built.
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
                if let Some((watcher, _)) = single.watcher.take() {
                    watcher.abort();
                }
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

    /// The next exchange's replies may take `bytes` (on each connection).
    fn allow(&mut self, bytes: usize) {
        match self {
            Link::Single(single) => {
                if let Some((_, budget)) = &single.connection {
                    budget.allow(bytes);
                }
                single.allowed.set(bytes);
            }
            Link::Cluster(cluster) => cluster.allow(bytes),
        }
    }

    /// Whether a connection was cut off during the last exchange for reading too much.
    fn overflowed(&self) -> bool {
        match self {
            Link::Single(single) => single.overflowed.get(),
            Link::Cluster(cluster) => cluster.overflowed(),
        }
    }
}

/// One Redis server, or the master the sentinels name.
struct SingleLink {
    info: Option<redis::ConnectionInfo>,
    /// For a `redis-sentinel://` URL: every new connection asks them for the master, and a
    /// watcher asks them again while it is open (`moved`: they named another master).
    sentinels: Option<Arc<super::sentinel::Sentinels>>,
    watcher: Option<(tokio::task::JoinHandle<()>, Arc<AtomicBool>)>,
    tls: Option<link::Tls>,
    connection: Option<(redis::aio::MultiplexedConnection, ReadBudget)>,
    scripts_loaded: bool,
    /// Set while a connection is being opened (left set when a timeout cancels it).
    connecting: bool,
    /// What the current exchange may read, for a connection opened during it.
    allowed: std::cell::Cell<usize>,
    overflowed: std::cell::Cell<bool>,
}

impl SingleLink {
    /// One pipeline with every command; the replies in order.
    async fn send(
        &mut self,
        commands: &[cluster::Routed],
        scripts: &[&str],
    ) -> Result<Vec<redis::Value>, SyncError> {
        self.overflowed.set(false);
        if let Some((watcher, moved)) = &self.watcher {
            if moved.load(Ordering::Acquire) {
                // The sentinels name another master: this round goes to it.
                watcher.abort();
                self.watcher = None;
                self.connection = None;
                self.scripts_loaded = false;
            }
        }
        if self.connection.is_none() {
            self.connecting = true;
            let connection = match (&self.sentinels, &self.info) {
                (Some(sentinels), _) => match sentinels.connect_master(self.tls.as_ref()).await {
                    Ok((connection, budget, address)) => {
                        let moved = Arc::new(AtomicBool::new(false));
                        let watcher = sentinels.watch(self.tls.clone(), address, moved.clone());
                        self.watcher = Some((watcher, moved));
                        Ok((connection, budget))
                    }
                    Err(error) => Err(error),
                },
                (None, Some(info)) => link::connect(info, self.tls.as_ref()).await,
                (None, None) => Err(SyncError::BadUrl),
            };
            self.connecting = false;
            let (connection, budget) = connection?;
            budget.allow(self.allowed.get());
            self.connection = Some((connection, budget));
        }
        let Some((connection, budget)) = self.connection.as_mut() else {
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
        let values: Result<Vec<redis::Value>, _> = pipe.query_async(connection).await;
        if budget.exceeded() {
            self.overflowed.set(true);
            return Err(SyncError::ReplyTooLarge);
        }
        let values = values.map_err(link::classify)?;
        self.scripts_loaded = true;
        Ok(values)
    }
}

/// A limits script's reply: `Some(None)` when the fleet has no value yet, `None` when the
/// reply cannot be read.
fn limits_reply(value: &redis::Value) -> Option<Option<u64>> {
    let text = redis::from_redis_value::<Option<String>>(value).ok()?;
    Some(text.and_then(|text| text.parse().ok()))
}

/// An integer of a reply.
fn integer(value: &redis::Value) -> Option<i64> {
    match value {
        redis::Value::Int(n) => Some(*n),
        _ => None,
    }
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

    fn sync_ns(&self) -> u64 {
        self.spec.interval_ms * 1_000_000
    }

    async fn main_loop(self) {
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
                    .map(|spec| Arc::new(super::sentinel::Sentinels::new(spec))),
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

    async fn round(&self, link: &mut Link, state: &mut LoopState) {
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

    /// The keys' leases of the `sync` concurrency zones (`super::leases`), in an exchange of
    /// their own: one script call per key.
    async fn sync_leases(&self, link: &mut Link, leases: &mut Leases, reachable: bool) {
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

    /// The zones' blocks: this instance's changes out, the fleet's in (`super::blocks`).
    async fn sync_blocks(&self, link: &mut Link) {
        let (sent, commands) = super::blocks::commands(&self.zones, &self.spec.prefix);
        if commands.is_empty() {
            return;
        }
        // Replies of its own size: a page per zone, whatever the key sync's exchange left.
        let bound = 4096 + commands.len() * ratelimit_core::fleet_blocks::PAGE_REPLY_BYTES;
        let replies = self.exchange_within(link, &commands, bound).await;
        super::blocks::received(&self.zones, &sent, replies, self.sync);
    }

    /// One exchange after the round's (blocks, quota counters), its replies bounded by
    /// `bound` bytes and its time by `timeout=`: each command's reply or error.
    async fn exchange_within(
        &self,
        link: &mut Link,
        commands: &[cluster::Routed],
        bound: usize,
    ) -> Vec<Result<redis::Value, SyncError>> {
        let timeout = Duration::from_millis(self.spec.timeout_ms);
        link.allow(bound);
        let replies = match tokio::time::timeout(timeout, self.exchange(link, commands)).await {
            Ok(replies) => replies,
            Err(_) => commands.iter().map(|_| Err(SyncError::Timeout)).collect(),
        };
        if link.overflowed() {
            self.sync.note_bad(Bad::ReplySize, 0, 0, bound as u64);
        }
        replies
    }

    /// The quota zones' counters (`super::quota`), after a round trip that succeeded: the
    /// deltas out, the fleet's totals back; a failure puts the deltas back for the next one.
    async fn sync_quotas(&self, link: &mut Link) {
        let send = self.sync.sends.fetch_add(1, Ordering::AcqRel) + 1;
        let instance = self.sync.instance_id;
        let (sent, commands) =
            super::quota::commands(&self.zones, &self.spec.prefix, instance, send);
        if commands.is_empty() {
            return;
        }
        // An integer or a short string per command.
        let bound = 4096 + commands.len() * 32;
        let replies = self.exchange_within(link, &commands, bound).await;
        if super::quota::received(&self.zones, &sent, send, replies, self.sync).is_some() {
            self.sync.errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Between rounds, after an admin write or a new block: the heartbeat, the zones' limits,
    /// overrides and blocks only (no key is synced, no grant changes), so that the change
    /// reaches Redis now. A failure is left to the next round.
    async fn admin_round(&self, link: &mut Link) {
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

    /// The keys that need the fleet this round, most urgent first: at most `budget` of them,
    /// every zone with keys given at least its fair part (so a zone later in the
    /// configuration is never starved by an earlier one's many keys). Nothing is taken yet.
    fn scan(&self, budget: usize, instances: u64) -> Vec<Candidate> {
        let sync_ns = self.sync_ns();
        let mut per_zone: Vec<Vec<Candidate>> = Vec::with_capacity(self.zones.len());
        for (zone_index, synced) in self.zones.iter().enumerate() {
            let zone = &synced.zone;
            if synced.quota.is_some() {
                // Its keys have no grants: their counters go in `sync_quotas`.
                per_zone.push(Vec::new());
                continue;
            }
            // The `budget` most urgent keys of the zone: a min-heap of the best so far.
            let mut best: BinaryHeap<std::cmp::Reverse<Candidate>> = BinaryHeap::new();
            for slot in 0..zone.slot_count() {
                let Some((hash, word)) = zone.sync_slot(slot) else {
                    break;
                };
                if hash == 0 || word == 0 {
                    continue;
                }
                let Some(shape) = synced.shape(hash) else {
                    continue;
                };
                let Some(rank) = fleet_round::urgency(word, &shape, instances, sync_ns) else {
                    continue;
                };
                let candidate = Candidate {
                    rank,
                    zone: zone_index,
                    slot,
                    hash,
                };
                if best.len() < budget {
                    best.push(std::cmp::Reverse(candidate));
                } else if best.peek().is_some_and(|least| least.0.rank < rank) {
                    best.pop();
                    best.push(std::cmp::Reverse(candidate));
                }
            }
            let mut zone_best: Vec<Candidate> = best.into_iter().map(|c| c.0).collect();
            zone_best.sort_unstable_by(|a, b| b.cmp(a));
            per_zone.push(zone_best);
        }
        let fair = budget / (2 * self.zones.len().max(1));
        let mut chosen = Vec::new();
        let mut rest = Vec::new();
        for zone in per_zone {
            let (first, others) = zone.split_at(zone.len().min(fair));
            chosen.extend_from_slice(first);
            rest.extend_from_slice(others);
        }
        rest.sort_unstable_by(|a, b| b.cmp(a));
        let room = budget.saturating_sub(chosen.len());
        chosen.extend(rest.into_iter().take(room));
        chosen
    }

    /// Take the chosen keys' pending deltas (swapped to 0: whatever is charged from now on
    /// goes to the next round).
    fn take(&self, candidates: &[Candidate], entries: &mut Vec<Entry>, state: &LoopState) {
        for candidate in candidates {
            let synced = &self.zones[candidate.zone];
            // Evicted meanwhile: its delta went to the orphan ring.
            let Some(pinned) = synced.zone.sync_pin(candidate.slot, candidate.hash) else {
                continue;
            };
            let hash = candidate.hash;
            let [_, pending, _] = pinned.words();
            let Some(shape) = synced.shape(hash) else {
                continue;
            };
            let word = pending.swap(0, Ordering::AcqRel);
            drop(pinned);
            entries.push(Entry {
                zone: candidate.zone,
                slot: Some(candidate.slot),
                hash,
                delta: (word & !ASKED).min(shape.carry_limit()),
                shape,
                unconfirmed: state
                    .unconfirmed
                    .get(&(candidate.zone, hash))
                    .cloned()
                    .unwrap_or_default(),
            });
        }
    }

    /// The deltas of keys evicted since the last round (the orphan ring), those that need
    /// the fleet, within the round's budget; the others are within their share and dropped.
    fn take_orphans(&self, entries: &mut Vec<Entry>, budget: usize, state: &LoopState) {
        let instances = self.sync.instances();
        let sync_ns = self.sync_ns();
        self.sync.orphans.drain(|zone_id, hash, delta| {
            let Some(zone) = self.zones.iter().position(|zone| zone.id == zone_id) else {
                return;
            };
            let Some(shape) = self.zones[zone].shape(hash) else {
                return;
            };
            if entries.len() >= budget
                || fleet_round::urgency(delta, &shape, instances, sync_ns).is_none()
            {
                self.sync.orphans_dropped.fetch_add(1, Ordering::Relaxed);
                return;
            }
            entries.push(Entry {
                zone,
                slot: None,
                hash,
                delta: (delta & !ASKED).min(shape.carry_limit()),
                shape,
                unconfirmed: state
                    .unconfirmed
                    .get(&(zone, hash))
                    .cloned()
                    .unwrap_or_default(),
            });
        });
    }

    /// A key's Redis name: `prefix zone:{group}:id`.
    fn key_name(&self, zone: &SyncZone, hash: u64) -> String {
        format!(
            "{}{}:{{{:02x}}}:{:016x}",
            self.spec.prefix,
            zone.name,
            hash % SLOT_GROUPS,
            hash
        )
    }

    /// The round's commands, each with the key that routes it: the heartbeat, each zone's
    /// limits, the overrides of the zones listed in the second value (those whose overrides
    /// could be read), then the key script calls, each for the entries in its range of the
    /// third value (at most [`KEYS_PER_CALL`] keys of one slot group).
    #[allow(clippy::type_complexity)]
    fn commands(
        &self,
        entries: &[Entry],
        send: u64,
        busy: bool,
    ) -> (
        Vec<cluster::Routed>,
        Vec<usize>,
        Vec<std::ops::Range<usize>>,
    ) {
        let mut commands = Vec::with_capacity(1 + 2 * self.zones.len());
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
        // Entries in order of their slot group (a Cluster needs one slot per call; one server
        // takes any mix, and the order changes nothing there).
        let mut batches = Vec::new();
        let key_hash = redis::Script::new(KEY_SCRIPT).get_hash().to_string();
        let instance = format!("{:016x}", self.sync.instance_id);
        let mut at = 0;
        while at < entries.len() {
            let group = entries[at].hash % SLOT_GROUPS;
            let mut end = at + 1;
            while end < entries.len()
                && end - at < KEYS_PER_CALL
                && (!self.spec.cluster || entries[end].hash % SLOT_GROUPS == group)
            {
                end += 1;
            }
            let batch = &entries[at..end];
            let names: Vec<String> = batch
                .iter()
                .map(|entry| self.key_name(&self.zones[entry.zone], entry.hash))
                .collect();
            let mut command = redis::cmd("EVALSHA");
            command.arg(&key_hash).arg(batch.len());
            for name in &names {
                command.arg(name);
            }
            command.arg(&instance).arg(send).arg(self.spec.interval_ms);
            for entry in batch {
                let idle_ms = (entry.shape.capacity_ns() / 1_000_000)
                    .saturating_add(2 * alive_ms)
                    .saturating_add(self.spec.interval_ms);
                command
                    .arg(entry.delta)
                    .arg(entry.shape.interval_ns)
                    .arg(entry.shape.capacity)
                    .arg(idle_ms)
                    .arg(entry.unconfirmed.len());
                for &(earlier, sent) in &entry.unconfirmed {
                    command.arg(earlier).arg(sent);
                }
            }
            commands.push(cluster::Routed {
                key: names[0].clone(),
                command,
            });
            batches.push(at..end);
            at = end;
        }
        (commands, with_overrides, batches)
    }

    /// A key script call's reply: three integers per key.
    fn key_replies(
        &self,
        value: &redis::Value,
        keys: usize,
    ) -> Result<Vec<(i64, i64, i64)>, SyncError> {
        let redis::Value::Array(items) = value else {
            return Err(SyncError::Reply);
        };
        if items.len() != 3 * keys {
            return Err(SyncError::Reply);
        }
        items
            .chunks(3)
            .map(|triple| {
                let get = |at: usize| integer(&triple[at]).ok_or(SyncError::Reply);
                Ok((get(0)?, get(1)?, get(2)?))
            })
            .collect()
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
            super::quota::QUOTA_SCRIPT,
        ];
        match link {
            Link::Cluster(cluster) => cluster.send(commands, &scripts).await,
            Link::Single(single) => match single.send(commands, &scripts).await {
                Ok(values) if values.len() == commands.len() => values
                    .into_iter()
                    .map(|value| match value {
                        redis::Value::ServerError(_) => Err(SyncError::Reply),
                        value => Ok(value),
                    })
                    .collect(),
                Ok(_) => commands.iter().map(|_| Err(SyncError::Reply)).collect(),
                Err(error) => commands.iter().map(|_| Err(error)).collect(),
            },
        }
    }

    /// Count a value Redis answered that is out of bounds, for the workers to log once.
    fn note(&self, bad: &BadValue, zone_id: u64) {
        let (kind, value, bound) = match *bad {
            BadValue::Ahead { ahead_us, most_us } => (Bad::KeyAhead, ahead_us as u64, most_us),
            BadValue::Counts { recent, most, .. } => (Bad::KeyCounts, recent as u64, most),
            BadValue::Instances(count) => (Bad::Instances, count as u64, 0),
            BadValue::Limits(_) => (Bad::Limits, 0, 0),
            BadValue::Version(version) => (Bad::Version, version as u64, 0),
        };
        self.sync.note_bad(kind, zone_id, value, bound);
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
            let synced = &self.zones[zone];
            let check = |packed: u64| self.check_limits(synced, packed);
            let (bad, version) = synced.overrides.borrow_mut().agree(reply.as_ref(), &check);
            for packed in bad {
                self.sync.note_bad(Bad::Override, synced.id, packed, 0);
            }
            if let Some(version) = version {
                self.note(&BadValue::Version(version), synced.id);
            }
        }
        self.post_inbox();
        // What a loop taking over from this one starts from.
        for &zone in with_overrides {
            let zone = &self.zones[zone];
            let version = zone.overrides.borrow().settled();
            self.sync.set_override_version(zone.id, version);
        }
    }

    /// Whether packed limits from Redis are limits the zone's algorithm can take: what the
    /// admin API and the state file accept.
    fn check_limits(&self, zone: &SyncZone, packed: u64) -> Result<Limits, BadLimits> {
        let limits = Limits::unpack(packed).ok_or(BadLimits::NotPacked(packed))?;
        ratelimit_admin::body::check_limits(
            &zone.name,
            zone.zone.algorithm(),
            &limits,
            limits.burst != 0,
            0,
        )?;
        Ok(limits)
    }

    /// After a round trip: the fleet's value of each zone's limits is agreed on; when it is
    /// not the zone's own (another instance's admin API changed it), the zone takes it, if
    /// the zone's algorithm can (else it is counted and the zone keeps its own).
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
            match self.check_limits(zone, fleet) {
                Ok(limits) => {
                    zone.zone.set_limits(limits, now);
                    zone.agreed_limits.set(fleet);
                }
                Err(_) => self.sync.note_bad(Bad::Limits, zone.id, fleet, 0),
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

    /// Remember a key's fleet view, within [`REMEMBERED_KEYS`]: when full, the keys not
    /// synced for the longest are forgotten first.
    fn remember(state: &mut LoopState, key: (usize, u64), round: u64) -> &mut KeyMemory {
        if state.keys.len() >= REMEMBERED_KEYS && !state.keys.contains_key(&key) {
            let mut age = 64;
            while state.keys.len() >= REMEMBERED_KEYS * 3 / 4 && age > 0 {
                state
                    .keys
                    .retain(|_, memory| round.wrapping_sub(memory.round) < age);
                age /= 2;
            }
            if state.keys.len() >= REMEMBERED_KEYS {
                state.keys.clear();
            }
        }
        state.keys.entry(key).or_default()
    }

    /// Set each key's grant and local state from the fleet's, unless the key's limits changed
    /// since the round was built (an admin change): a reply computed at the old limits is not
    /// applied after the new ones; the key gets a fresh grant instead.
    fn apply(
        &self,
        synced: &[(&Entry, fleet_round::KeyReply)],
        instances: u64,
        round: u64,
        state: &mut LoopState,
    ) {
        let sync_ns = self.sync_ns();
        let now = now_ns();
        for &(entry, reply) in synced {
            state.unconfirmed.remove(&(entry.zone, entry.hash));
            let zone = &self.zones[entry.zone];
            let key = Self::remember(state, (entry.zone, entry.hash), round);
            let mine = entry.delta + key.last_delta;
            key.last_delta = entry.delta;
            key.share = fleet::share(mine, reply.recent, reply.before, instances);
            key.round = round;
            let Some(slot) = entry.slot else {
                continue; // evicted: nothing left here to grant.
            };
            // Evicted meanwhile: the new key starts from a fresh grant.
            let Some(pinned) = zone.zone.sync_pin(slot, entry.hash) else {
                continue;
            };
            let hash = entry.hash;
            let [local, pending, grant] = pinned.words();
            if zone.shape(hash) != Some(entry.shape) {
                grant.store(0, Ordering::Release);
                continue;
            }
            let room = fleet::fleet_room_milli(&entry.shape, reply.ahead_ns, sync_ns);
            let spent_since = pending.load(Ordering::Acquire) & !ASKED;
            let granted = fleet::grant_milli(room, key.share, spent_since);
            grant.store(grant_word::pack(round as u32, granted), Ordering::Release);
            let algorithm = zone.zone.algorithm();
            let _ = local.fetch_update(Ordering::AcqRel, Ordering::Acquire, |current| {
                let settled = fleet::settle_local_state(
                    current,
                    algorithm,
                    &entry.shape,
                    reply.ahead_ns,
                    now,
                );
                (settled != current).then_some(settled)
            });
        }
    }

    /// A round that failed: the mode follows the misses. Returns the mode now.
    fn miss(&self) -> Mode {
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
        mode
    }

    /// Keys whose send failed (or whose reply was dropped): the deltas go back to their slots
    /// (the fleet is charged for them later; an evicted key's to the orphan ring), the send
    /// is remembered as possibly applied late, and the keys get grants from shares.
    fn missed(&self, entries: &[&Entry], round: u64, send: u64, mode: Mode, state: &mut LoopState) {
        for entry in entries {
            let zone = &self.zones[entry.zone];
            let key = (entry.zone, entry.hash);
            if state.unconfirmed.len() < REMEMBERED_KEYS || state.unconfirmed.contains_key(&key) {
                let sends = state.unconfirmed.entry(key).or_default();
                if sends.len() == UNCONFIRMED {
                    sends.remove(1);
                }
                sends.push((send, entry.delta));
            }
            let pinned = entry
                .slot
                .and_then(|slot| zone.zone.sync_pin(slot, entry.hash));
            let Some(pinned) = pinned else {
                self.sync.orphans.push(zone.id, entry.hash, entry.delta);
                continue;
            };
            let [_, pending, grant] = pinned.words();
            pending.fetch_add(entry.delta, Ordering::AcqRel);
            self.grant_from_share(
                grant,
                entry.zone,
                entry.hash,
                &entry.shape,
                round,
                mode,
                state,
            );
        }
    }

    /// While Redis does not answer: the keys that need the fleet get grants from shares.
    fn grant_locally(&self, candidates: &[Candidate], round: u64, mode: Mode, state: &LoopState) {
        for candidate in candidates {
            let zone = &self.zones[candidate.zone];
            let Some(pinned) = zone.zone.sync_pin(candidate.slot, candidate.hash) else {
                continue;
            };
            let (hash, [_, _, grant]) = (candidate.hash, pinned.words());
            let Some(shape) = zone.shape(hash) else {
                continue;
            };
            self.grant_from_share(grant, candidate.zone, hash, &shape, round, mode, state);
        }
    }

    /// A grant from the key's last share (one or two missed rounds), or `1 / N̂` of the limit
    /// (`local_share`), refilled from what is left.
    #[allow(clippy::too_many_arguments)]
    fn grant_from_share(
        &self,
        grant: &core::sync::atomic::AtomicU64,
        zone: usize,
        hash: u64,
        shape: &FleetShape,
        round: u64,
        mode: Mode,
        state: &LoopState,
    ) {
        let sync_ns = self.sync_ns();
        let instances = self.sync.instances();
        let share = state.keys.get(&(zone, hash)).map_or(0, |key| key.share);
        let (_, left) = grant_word::unpack(grant.load(Ordering::Acquire));
        let granted = match mode {
            Mode::Degraded if share > 0 => {
                fleet::share_refill_grant_milli(shape, share, sync_ns, left)
            }
            _ => fleet::local_share_grant_milli(shape, instances, sync_ns, left),
        };
        grant.store(grant_word::pack(round as u32, granted), Ordering::Release);
    }
}
