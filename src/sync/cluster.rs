//! Redis Cluster for the sync loop: one pipeline per master node per round.
//!
//! The `redis` crate's async cluster connection sends a pipeline to one hash slot only (its
//! commands must share a hash slot), while a sync round holds keys of many hash slots. So the
//! loop routes itself: the hash slot map from `CLUSTER SLOTS` (read from a seed URL, again
//! after any failure or `MOVED`), a key's hash slot by CRC16 of its hash tag or whole name
//! (the `crc16` crate), one multiplexed connection per master, and every node's pipeline sent
//! at once. A node that fails fails only its own commands. A command answered `MOVED` or
//! `ASK` (a hash slot moved or being migrated, e.g. while resharding) is sent to the node
//! named in the same round, so a reshard costs no sync.

use futures_util::future::join_all;
use redis::{ConnectionAddr, ConnectionInfo, Value};

use super::link::{self, ReadBudget};
use super::shared::SyncError;

/// Hash slots of a Redis Cluster.
const HASH_SLOTS: u16 = 16384;

struct Node {
    info: ConnectionInfo,
    connection: Option<(redis::aio::MultiplexedConnection, ReadBudget)>,
    scripts_loaded: bool,
    /// Set while its connection is being opened (left set when a timeout cancels it).
    connecting: bool,
    /// Cut off during the last exchange for reading more than it allowed.
    overflowed: bool,
}

/// The loop's view of the cluster.
pub struct ClusterLink {
    seeds: Vec<ConnectionInfo>,
    /// The TLS settings of `rediss://` seeds, which their nodes get too.
    tls: Option<link::Tls>,
    /// What each connection may read in the current exchange.
    allowed: usize,
    nodes: Vec<Node>,
    /// `(first hash slot, last hash slot, node)`.
    hash_slots: Vec<(u16, u16, usize)>,
    /// Set while the hash slot map is being read (left set when a timeout cancels it).
    refreshing: bool,
}

/// One command of a round, with the key that routes it.
pub struct Routed {
    pub key: String,
    pub command: redis::Cmd,
}

impl ClusterLink {
    /// `tls`: the TLS settings of `rediss://` seeds, which their nodes get too.
    pub fn new(urls: &[String], tls: Option<link::Tls>) -> ClusterLink {
        ClusterLink {
            seeds: urls
                .iter()
                .filter_map(|url| redis::Client::open(url.as_str()).ok())
                .map(|client| client.get_connection_info().clone())
                .collect(),
            tls,
            allowed: 0,
            nodes: Vec::new(),
            hash_slots: Vec::new(),
            refreshing: false,
        }
    }

    /// Whether a connection was being opened when the round was cut short.
    pub fn connecting(&self) -> bool {
        self.refreshing || self.nodes.iter().any(|node| node.connecting)
    }

    /// The next exchange's replies may take `bytes` on each node's connection.
    pub fn allow(&mut self, bytes: usize) {
        self.allowed = bytes;
        for node in &mut self.nodes {
            node.overflowed = false;
            if let Some((_, budget)) = &node.connection {
                budget.allow(bytes);
            }
        }
    }

    /// Whether a node's connection was cut off in the last exchange for reading too much.
    pub fn overflowed(&self) -> bool {
        self.nodes.iter().any(|node| node.overflowed)
    }

    /// Forget the hash slot map and connections (after a failure): the next round reads them again.
    pub fn reset(&mut self) {
        self.nodes.clear();
        self.hash_slots.clear();
        self.refreshing = false;
    }

    /// Read the hash slot map: from a node already connected when there is one (no new
    /// connection: the round after a `MOVED` stays one round trip longer, not a handshake
    /// longer), else from the seeds in turn.
    async fn refresh(&mut self) -> Result<(), SyncError> {
        let allowed = self.allowed;
        let mut from_node = None;
        for node in &mut self.nodes {
            let Some((connection, budget)) = node.connection.as_mut() else {
                continue;
            };
            budget.allow(SLOTS_REPLY_BYTES);
            let map = slots_over(connection, &node.info.addr).await;
            budget.allow(allowed);
            match map {
                Ok(map) => {
                    from_node = Some(map);
                    break;
                }
                Err(_) => {
                    node.connection = None;
                    node.scripts_loaded = false;
                }
            }
        }
        if let (Some(map), Some(seed)) = (from_node, self.seeds.first().cloned()) {
            return self.use_map(&seed, map);
        }
        let mut last = SyncError::Connect;
        for seed in self.seeds.clone() {
            match read_slots(&seed, self.tls.as_ref()).await {
                Ok(map) => return self.use_map(&seed, map),
                Err(error) => last = error,
            }
        }
        Err(last)
    }

    /// Route by `map` (`(first, last, host, port)`); nodes already connected keep their
    /// connection (a hash slot that moved between known nodes costs no handshake).
    fn use_map(
        &mut self,
        seed: &ConnectionInfo,
        map: Vec<(u16, u16, String, u16)>,
    ) -> Result<(), SyncError> {
        let mut known = std::mem::take(&mut self.nodes);
        self.hash_slots.clear();
        for (first, last, host, port) in map {
            let node = self.node_index(seed, &host, port)?;
            self.hash_slots.push((first, last, node));
        }
        for node in &mut self.nodes {
            if let Some(old) = known.iter_mut().find(|old| old.info.addr == node.info.addr) {
                node.connection = old.connection.take();
                node.scripts_loaded = old.scripts_loaded;
            }
        }
        Ok(())
    }

    fn node_index(
        &mut self,
        seed: &ConnectionInfo,
        host: &str,
        port: u16,
    ) -> Result<usize, SyncError> {
        // A TLS seed's nodes are reached with TLS and its trust settings (the equality below
        // compares host, port and `insecure` only).
        let wanted = match &seed.addr {
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host: host.to_string(),
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => ConnectionAddr::Tcp(host.to_string(), port),
        };
        if let Some(index) = self.nodes.iter().position(|node| node.info.addr == wanted) {
            return Ok(index);
        }
        // The seed's credentials, database and TLS settings, at the node's address.
        let mut info = seed.clone();
        info.addr = wanted;
        self.nodes.push(Node {
            info,
            connection: None,
            scripts_loaded: false,
            connecting: false,
            overflowed: false,
        });
        Ok(self.nodes.len() - 1)
    }

    fn node_for(&self, key: &str) -> Option<usize> {
        let hash_slot = key_hash_slot(key.as_bytes());
        self.hash_slots
            .iter()
            .find(|&&(first, last, _)| first <= hash_slot && hash_slot <= last)
            .map(|&(_, _, node)| node)
    }

    /// Send every command, one pipeline per node (scripts loaded first where needed), all
    /// nodes at once. A command answered `MOVED` or `ASK` (a hash slot moved, or being migrated) is
    /// sent again at once to the node named, `ASK`ed ones after `ASKING`: one more round trip
    /// for those commands only. Returns each command's reply, or the error of its node.
    pub async fn send(
        &mut self,
        commands: &[Routed],
        scripts: &[&str],
    ) -> Vec<Result<Value, SyncError>> {
        if self.hash_slots.is_empty() {
            self.refreshing = true;
            let refreshed = self.refresh().await;
            self.refreshing = false;
            if let Err(error) = refreshed {
                return commands.iter().map(|_| Err(error)).collect();
            }
        }
        let routes: Vec<Option<usize>> = commands.iter().map(|c| self.node_for(&c.key)).collect();
        let mut replies: Vec<Result<Value, SyncError>> =
            routes.iter().map(|_| Err(SyncError::Cluster)).collect();
        let first: Vec<(usize, usize, bool)> = routes
            .iter()
            .enumerate()
            .filter_map(|(at, route)| Some((at, (*route)?, false)))
            .collect();
        let mut failed = self
            .send_round(commands, &first, scripts, &mut replies)
            .await;
        let mut moved = false;
        let mut again = Vec::new();
        for (at, reply) in replies.iter().enumerate() {
            let Ok(reply) = reply else {
                continue;
            };
            let Some((asking, host, port)) = redirection(reply) else {
                continue;
            };
            let Some(seed) = self.seeds.first().cloned() else {
                continue;
            };
            if let Ok(node) = self.node_index(&seed, &host, port) {
                // MOVED: the hash slot map is out of date (read again next round).
                moved |= !asking;
                again.push((at, node, asking));
            }
        }
        if !again.is_empty() {
            failed |= self
                .send_round(commands, &again, scripts, &mut replies)
                .await;
        }
        let replies = replies
            .into_iter()
            .map(|reply| match reply {
                Ok(Value::ServerError(_)) => Err(SyncError::Reply),
                other => other,
            })
            .collect();
        if failed {
            // A node down: connections and hash slot map anew next round.
            self.reset();
        } else if moved {
            // A hash slot moved: the map is read again next round, the connections are kept (a
            // round that opened them all again, and loaded the scripts on each, could run
            // out of `timeout=` on a loaded machine).
            self.hash_slots.clear();
        }
        replies
    }

    /// Send `sends` (command index, node, after `ASKING`), one pipeline per node at once, and
    /// put each reply (server errors included, as values) or its node's error in `replies`.
    /// True when a node failed.
    async fn send_round(
        &mut self,
        commands: &[Routed],
        sends: &[(usize, usize, bool)],
        scripts: &[&str],
        replies: &mut [Result<Value, SyncError>],
    ) -> bool {
        let (tls, allowed) = (self.tls.as_ref(), self.allowed);
        let pipelines = self.nodes.iter_mut().enumerate().map(|(index, node)| {
            let mine: Vec<(&Routed, bool)> = sends
                .iter()
                .filter(|&&(_, to, _)| to == index)
                .map(|&(at, _, asking)| (&commands[at], asking))
                .collect();
            send_to_node(node, mine, scripts, tls, allowed)
        });
        let results = join_all(pipelines).await;
        let mut failed = false;
        for (index, result) in results.into_iter().enumerate() {
            let mine = sends.iter().filter(|&&(_, to, _)| to == index);
            match result {
                Ok(values) => {
                    for (&(at, _, _), value) in mine.zip(values) {
                        replies[at] = Ok(value);
                    }
                }
                Err(error) => {
                    failed = true;
                    for &(at, _, _) in mine {
                        replies[at] = Err(error);
                    }
                }
            }
        }
        failed
    }
}

/// Where a `MOVED`/`ASK` reply sends a command: `(asking, host, port)`.
fn redirection(reply: &Value) -> Option<(bool, String, u16)> {
    let Value::ServerError(error) = reply else {
        return None;
    };
    let asking = match error.code() {
        "ASK" => true,
        "MOVED" => false,
        _ => return None,
    };
    // "HASH-SLOT HOST:PORT"
    let address = error.details()?.split_ascii_whitespace().nth(1)?;
    let (host, port) = address.rsplit_once(':')?;
    Some((asking, host.to_string(), port.parse().ok()?))
}

/// One pipeline to one node: the scripts first when it may not have them, `ASKING` before
/// each command sent after an `ASK`. The commands' replies in order, server errors kept as
/// values (a `NOSCRIPT` among them makes the scripts load again next time).
async fn send_to_node(
    node: &mut Node,
    commands: Vec<(&Routed, bool)>,
    scripts: &[&str],
    tls: Option<&link::Tls>,
    allowed: usize,
) -> Result<Vec<Value>, SyncError> {
    if commands.is_empty() {
        return Ok(Vec::new());
    }
    if node.connection.is_none() {
        node.connecting = true;
        let connection = link::connect(&node.info, tls).await;
        node.connecting = false;
        let (connection, budget) = connection?;
        budget.allow(allowed);
        node.connection = Some((connection, budget));
    }
    let Some((connection, budget)) = node.connection.as_mut() else {
        return Err(SyncError::Connect);
    };
    let mut pipe = redis::pipe();
    // Which replies are the commands' (the others answer SCRIPT LOAD and ASKING).
    let mut theirs = Vec::new();
    if !node.scripts_loaded {
        for script in scripts {
            pipe.cmd("SCRIPT").arg("LOAD").arg(*script);
            theirs.push(false);
        }
    }
    for (routed, asking) in &commands {
        if *asking {
            pipe.cmd("ASKING");
            theirs.push(false);
        }
        pipe.add_command(routed.command.clone());
        theirs.push(true);
    }
    // The connection's own call, not `Pipeline::query_async`: that one turns the first
    // error reply into the whole pipeline's error.
    use redis::aio::ConnectionLike;
    let replies = connection.req_packed_commands(&pipe, 0, theirs.len()).await;
    if budget.exceeded() {
        node.overflowed = true;
        node.connection = None;
        node.scripts_loaded = false;
        return Err(SyncError::ReplyTooLarge);
    }
    match replies {
        Ok(values) if values.len() == theirs.len() => {
            node.scripts_loaded = true;
            let values: Vec<Value> = values
                .into_iter()
                .zip(theirs)
                .filter_map(|(value, theirs)| theirs.then_some(value))
                .collect();
            if values.iter().any(
                |value| matches!(value, Value::ServerError(error) if error.code() == "NOSCRIPT"),
            ) {
                node.scripts_loaded = false;
            }
            Ok(values)
        }
        Ok(_) => {
            node.connection = None;
            Err(SyncError::Reply)
        }
        Err(error) => {
            node.connection = None;
            node.scripts_loaded = false;
            Err(link::classify(error))
        }
    }
}

/// What a `CLUSTER SLOTS` reply may take: a few hundred bytes per hash slot range.
const SLOTS_REPLY_BYTES: usize = 1 << 20;

/// `CLUSTER SLOTS` of one node: `(first, last, master host, master port)`.
async fn read_slots(
    seed: &ConnectionInfo,
    tls: Option<&link::Tls>,
) -> Result<Vec<(u16, u16, String, u16)>, SyncError> {
    let (mut connection, budget) = link::connect(seed, tls).await?;
    budget.allow(SLOTS_REPLY_BYTES);
    slots_over(&mut connection, &seed.addr).await
}

/// `CLUSTER SLOTS` over a connection to `reached` (the address an empty host stands for).
async fn slots_over(
    connection: &mut redis::aio::MultiplexedConnection,
    reached: &ConnectionAddr,
) -> Result<Vec<(u16, u16, String, u16)>, SyncError> {
    let value: Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(connection)
        .await
        .map_err(link::classify)?;
    let Value::Array(ranges) = value else {
        return Err(SyncError::Cluster);
    };
    let mut map = Vec::new();
    for range in ranges {
        let Value::Array(fields) = range else {
            return Err(SyncError::Cluster);
        };
        let number = |value: Option<&Value>| match value {
            Some(Value::Int(n)) => u16::try_from(*n).ok(),
            _ => None,
        };
        let (Some(first), Some(last)) = (number(fields.first()), number(fields.get(1))) else {
            return Err(SyncError::Cluster);
        };
        let Some(Value::Array(master)) = fields.get(2) else {
            return Err(SyncError::Cluster);
        };
        let host = match master.first() {
            Some(Value::BulkString(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
            Some(Value::SimpleString(text)) => text.clone(),
            _ => return Err(SyncError::Cluster),
        };
        let Some(port) = number(master.get(1)) else {
            return Err(SyncError::Cluster);
        };
        // An empty host means "the address you reached me on".
        let host = if host.is_empty() {
            match reached {
                ConnectionAddr::Tcp(seed_host, _)
                | ConnectionAddr::TcpTls {
                    host: seed_host, ..
                } => seed_host.clone(),
                _ => return Err(SyncError::Cluster),
            }
        } else {
            host
        };
        map.push((first, last, host, port));
    }
    if map.is_empty() {
        return Err(SyncError::Cluster);
    }
    Ok(map)
}

/// A key's hash slot: CRC16 (XMODEM) of its hash tag (`{...}`, when not empty) or of the
/// whole key, modulo 16384.
pub fn key_hash_slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&byte| byte == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&byte| byte == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(tagged) % HASH_SLOTS
}
