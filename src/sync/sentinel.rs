//! Redis Sentinel (`redis-sentinel://`): the master's address is asked of the sentinels
//! (`SENTINEL get-master-addr-by-name`), one after the other until one answers, and the
//! server found there must say it is the master (`ROLE`) before the loop uses it.
//!
//! The loop opens its connection again after any failed round (a refused or dropped
//! connection, a `READONLY` reply from a master demoted to a replica, a timeout while
//! connecting), and each new connection asks the sentinels again: a failover is followed
//! within the round after the sentinels promote a replica. While a connection works, a
//! watcher beside the loop asks the sentinels again every second ([`Sentinels::watch`]): a
//! failover that leaves the old master up (`SENTINEL FAILOVER`, a partition) is followed
//! within a second too, instead of when the sentinels get round to demoting the old master
//! (11 s in a test). The sentinels are asked on connections of their own, opened for the
//! question and closed after it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ratelimit_core::sync_spec::SentinelSpec;
use redis::aio::MultiplexedConnection;
use redis::{ConnectionAddr, ConnectionInfo, RedisConnectionInfo};

use super::link::{self, ReadBudget, Tls};
use super::shared::SyncError;

/// The sentinels of a `redis-sentinel://` URL, and which of them to ask first.
pub struct Sentinels {
    spec: SentinelSpec,
    /// The sentinel to ask first: the one that answered last, or the one after a sentinel
    /// whose question was cut short by the round's timeout (a host that drops packets is
    /// not asked first again).
    first: AtomicUsize,
}

/// How often the watcher asks the sentinels where the master is.
const WATCH_EVERY: Duration = Duration::from_secs(1);

impl Sentinels {
    pub fn new(spec: SentinelSpec) -> Sentinels {
        Sentinels {
            spec,
            first: AtomicUsize::new(0),
        }
    }

    /// A connection to the master the sentinels name, checked with `ROLE`, and its address.
    pub async fn connect_master(
        &self,
        tls: Option<&Tls>,
    ) -> Result<(MultiplexedConnection, ReadBudget, (String, u16)), SyncError> {
        let (host, port) = self.master_address(tls).await?;
        let address = (host.clone(), port);
        let master = RedisConnectionInfo {
            db: self.spec.db,
            username: self.spec.username.clone(),
            password: self.spec.password.clone(),
            ..Default::default()
        };
        let info = self.info(host, port, master);
        let (mut connection, budget) = link::connect(&info, tls).await?;
        let role: redis::Value = redis::cmd("ROLE")
            .query_async(&mut connection)
            .await
            .map_err(link::classify)?;
        if !is_master(&role) {
            return Err(SyncError::NotMaster);
        }
        Ok((connection, budget, address))
    }

    /// A task beside the loop (on its runtime) that asks the sentinels every second where
    /// the master is, and sets `moved` once they name another address than `connected`
    /// (then ends). Aborted when the loop drops its connection. A sentinel that does not
    /// answer within a second is passed over for the next.
    pub fn watch(
        self: &Arc<Self>,
        tls: Option<Tls>,
        connected: (String, u16),
        moved: Arc<AtomicBool>,
    ) -> tokio::task::JoinHandle<()> {
        let sentinels = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(WATCH_EVERY).await;
                let asked =
                    tokio::time::timeout(WATCH_EVERY, sentinels.master_address(tls.as_ref()));
                if let Ok(Ok(address)) = asked.await {
                    if address != connected {
                        moved.store(true, Ordering::Release);
                        return;
                    }
                }
            }
        })
    }

    /// The master's address from the first sentinel that knows it.
    async fn master_address(&self, tls: Option<&Tls>) -> Result<(String, u16), SyncError> {
        let count = self.spec.sentinels.len();
        let start = self.first.load(Ordering::Relaxed);
        let mut last = SyncError::Connect;
        for step in 0..count {
            let at = (start + step) % count;
            // Cut short here (the round's timeout), the next round starts after this one.
            self.first.store((at + 1) % count, Ordering::Relaxed);
            let (host, port) = &self.spec.sentinels[at];
            let auth = RedisConnectionInfo {
                password: self.spec.sentinel_password.clone(),
                ..Default::default()
            };
            let info = self.info(host.clone(), *port, auth);
            match self.ask(&info, tls).await {
                Ok(address) => {
                    self.first.store(at, Ordering::Relaxed);
                    return Ok(address);
                }
                Err(error) => last = error,
            }
        }
        Err(last)
    }

    /// One sentinel's answer: the master's host and port, or [`SyncError::SentinelNoMaster`]
    /// when it monitors no master of that name.
    async fn ask(
        &self,
        info: &ConnectionInfo,
        tls: Option<&Tls>,
    ) -> Result<(String, u16), SyncError> {
        let (mut connection, _budget) = link::connect(info, tls).await?;
        let reply: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.spec.master_name)
            .query_async(&mut connection)
            .await
            .map_err(link::classify)?;
        reply.ok_or(SyncError::SentinelNoMaster)
    }

    /// Where to connect: TLS for `rediss-sentinel://`, to the sentinels and the master alike.
    fn info(&self, host: String, port: u16, redis: RedisConnectionInfo) -> ConnectionInfo {
        let addr = if self.spec.tls {
            ConnectionAddr::TcpTls {
                host,
                port,
                insecure: self.spec.insecure,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(host, port)
        };
        ConnectionInfo { addr, redis }
    }
}

/// `ROLE`'s reply starts with `master` on a master (`slave` or `sentinel` otherwise).
fn is_master(role: &redis::Value) -> bool {
    let redis::Value::Array(items) = role else {
        return false;
    };
    matches!(items.first(), Some(redis::Value::BulkString(role)) if role == b"master")
        || matches!(items.first(), Some(redis::Value::SimpleString(role)) if role == "master")
}
