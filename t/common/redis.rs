//! Real `redis-server`s for the `rate_limit_sync` tests: one server or a Redis Cluster of
//! three masters, plain or TLS (`--tls-port`, with certificates made here by the `openssl`
//! CLI), or a master, its replica and a sentinel watching them; each on a free loopback port
//! and killed on drop.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::Duration;

use super::nginx::free_port;

pub const SIGCONT: i32 = 18;
pub const SIGSTOP: i32 = 19;

/// A throwaway PKI in a temp dir: a CA, a server certificate it signed for `127.0.0.1` (and
/// `localhost`), a client certificate it signed, and a second CA that signed nothing here.
pub struct Pki {
    pub dir: PathBuf,
}

impl Pki {
    pub fn new() -> Pki {
        let dir = std::env::temp_dir().join(format!(
            "ngx-rate-limit-pki-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("cannot create the PKI directory");
        let pki = Pki { dir };
        pki.ca("ca");
        pki.ca("other-ca");
        pki.signed(
            "server",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth",
        );
        pki.signed("client", "extendedKeyUsage=clientAuth");
        pki
    }

    /// `NAME.pem`, `NAME.key`, ... in the PKI's directory.
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// `NAME.pem` as it is written in a config.
    pub fn file(&self, file: &str) -> String {
        self.path(file).display().to_string()
    }

    fn openssl(&self, args: &[&str]) {
        let output = Command::new("openssl")
            .current_dir(&self.dir)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("cannot run openssl (install the openssl package)");
        assert!(
            output.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// A self-signed CA (P-256, one day): `NAME.pem`, `NAME.key`.
    fn ca(&self, name: &str) {
        let (pem, key, subject) = (
            format!("{name}.pem"),
            format!("{name}.key"),
            format!("/CN=ngx-rate-limit test {name}"),
        );
        self.openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &pem,
            "-days",
            "1",
            "-subj",
            &subject,
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
    }

    /// A certificate signed by `ca` with the extensions `extensions`: `NAME.pem`, `NAME.key`.
    fn signed(&self, name: &str, extensions: &str) {
        let (pem, key, csr, ext) = (
            format!("{name}.pem"),
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.ext"),
        );
        std::fs::write(
            self.path(&ext),
            format!("basicConstraints=CA:FALSE\n{extensions}\n"),
        )
        .expect("cannot write the extensions file");
        self.openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            "/CN=127.0.0.1",
        ]);
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-out",
            &pem,
            "-extfile",
            &ext,
        ]);
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A `redis-server` of its own, killed on drop.
pub struct Redis {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
    extra: Vec<String>,
    /// For redis-cli, when the server requires one.
    password: Option<String>,
    /// The PKI's directory for redis-cli (its CA, its client certificate), when the server
    /// speaks TLS only.
    tls_dir: Option<PathBuf>,
}

impl Redis {
    pub fn start() -> Redis {
        Redis::start_with(&[])
    }

    /// A server with more `redis-server` arguments (`--requirepass`, ...).
    pub fn start_with(extra: &[&str]) -> Redis {
        Redis::launch(extra, None)
    }

    /// A server that speaks TLS only (`--port 0 --tls-port P`) with `pki`'s server
    /// certificate, and more arguments (`--tls-auth-clients yes`, ...). Clients are not asked
    /// for a certificate unless `extra` says so.
    pub fn start_tls(pki: &Pki, extra: &[&str]) -> Redis {
        let (cert, key, ca) = (
            pki.file("server.pem"),
            pki.file("server.key"),
            pki.file("ca.pem"),
        );
        let mut args = vec![
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            &ca,
        ];
        if !extra.contains(&"--tls-auth-clients") {
            args.extend(["--tls-auth-clients", "no"]);
        }
        args.extend(extra);
        Redis::launch(&args, Some(pki.dir.clone()))
    }

    fn launch(extra: &[&str], tls_dir: Option<PathBuf>) -> Redis {
        let dir = std::env::temp_dir().join(format!(
            "ngx-rate-limit-redis-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("cannot create the redis directory");
        let mut redis = Redis {
            port: free_port(),
            dir,
            child: None,
            extra: extra.iter().map(|arg| arg.to_string()).collect(),
            password: extra
                .iter()
                .position(|&arg| arg == "--requirepass")
                .and_then(|at| extra.get(at + 1))
                .map(|password| password.to_string()),
            tls_dir,
        };
        redis.spawn();
        redis
    }

    /// Starts the server (again, after [`Redis::kill`]) and waits (bounded) for its PING.
    pub fn spawn(&mut self) {
        let port = self.port.to_string();
        let ports: Vec<&str> = match self.tls_dir {
            Some(_) => vec!["--port", "0", "--tls-port", &port],
            None => vec!["--port", &port],
        };
        let child = Command::new("redis-server")
            .args(ports)
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot start redis-server (install redis-server)");
        self.child = Some(child);
        for _ in 0..100 {
            if self.cli(&["PING"]).trim() == "PONG" {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server on port {} did not answer PING", self.port);
    }

    /// `redis-cli` against this server (with TLS and the password when it needs them).
    pub fn cli(&self, args: &[&str]) -> String {
        redis_cli(
            self.port,
            self.password.as_deref(),
            self.tls_dir.as_deref(),
            args,
        )
    }

    pub fn signal(&self, signal: i32) {
        if let Some(child) = &self.child {
            super::nginx::sys::signal(child.id() as i32, signal);
        }
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `INFO commandstats` calls of one command (`evalsha`).
    pub fn calls(&self, command: &str) -> u64 {
        let info = self.cli(&["INFO", "commandstats"]);
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .and_then(|calls| calls.parse().ok())
            .unwrap_or(0)
    }

    /// Waits (bounded) until `count` instances heartbeat.
    pub fn wait_instances(&self, count: usize) {
        for _ in 0..150 {
            let reply = self.cli(&["ZCARD", "rl:instances"]);
            let seen: usize = reply
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("ZCARD rl:instances answered {reply:?}"));
            if seen == count {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        panic!("{count} instances never heartbeat in Redis");
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.signal(SIGCONT);
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `redis-cli` against the server on `port`, with its password and, for a TLS-only one, the
/// PKI's CA and client certificate (for servers with `--tls-auth-clients yes`).
fn redis_cli(
    port: u16,
    password: Option<&str>,
    tls_dir: Option<&std::path::Path>,
    args: &[&str],
) -> String {
    let mut command = Command::new("redis-cli");
    command.stdin(Stdio::null());
    if let Some(password) = password {
        command.args(["--no-auth-warning", "-a", password]);
    }
    if let Some(dir) = tls_dir {
        command.arg("--tls").arg("--cacert").arg(dir.join("ca.pem"));
        command.arg("--cert").arg(dir.join("client.pem"));
        command.arg("--key").arg(dir.join("client.key"));
    }
    // -c follows a cluster's redirections (and changes nothing on a single server).
    let output = command
        .args(["-c", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("cannot run redis-cli");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Three masters made into a Redis Cluster with `redis-cli --cluster create`, ready when
/// every node reports `cluster_state:ok` (bounded wait).
pub fn redis_cluster() -> Vec<Redis> {
    let nodes: Vec<Redis> = (0..3)
        .map(|_| Redis::start_with(&["--cluster-enabled", "yes"]))
        .collect();
    create_cluster(nodes, &[])
}

/// The same over TLS: clients and the cluster bus (`--tls-cluster yes`) speak TLS only.
pub fn redis_cluster_tls(pki: &Pki) -> Vec<Redis> {
    let nodes: Vec<Redis> = (0..3)
        .map(|_| Redis::start_tls(pki, &["--cluster-enabled", "yes", "--tls-cluster", "yes"]))
        .collect();
    let ca = pki.file("ca.pem");
    create_cluster(nodes, &["--tls", "--cacert", &ca])
}

fn create_cluster(nodes: Vec<Redis>, cli_args: &[&str]) -> Vec<Redis> {
    let addresses: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let output = Command::new("redis-cli")
        .args(cli_args)
        .arg("--cluster")
        .arg("create")
        .args(&addresses)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .stdin(Stdio::null())
        .output()
        .expect("cannot run redis-cli --cluster create");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
    for _ in 0..250 {
        if nodes
            .iter()
            .all(|node| node.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"))
        {
            return nodes;
        }
        thread::sleep(Duration::from_millis(20));
    }
    panic!("the cluster never reached cluster_state:ok");
}

/// Asserts that the cluster's keys are spread: at least two of `nodes` hold some.
pub fn assert_keys_spread(nodes: &[Redis]) {
    let holding = nodes
        .iter()
        .filter(|node| node.cli(&["DBSIZE"]).trim().parse::<u64>().unwrap_or(0) > 0)
        .count();
    assert!(
        holding >= 2,
        "the zone's keys did not spread over the nodes"
    );
}

/// A master, a replica of it and a sentinel monitoring them as `master_name` (quorum 1,
/// down after 1 s, failover timeout 3 s). With `password`, the master and the replica
/// require it (`--requirepass`, `--masterauth`, and `sentinel auth-pass` for the sentinel);
/// with `sentinel_password`, the sentinel requires its own (`requirepass` in sentinel.conf).
/// With a PKI, all three speak TLS only, to their clients and to each other.
pub struct SentinelSet {
    pub master: Redis,
    pub replica: Redis,
    pub sentinel: Sentinel,
}

impl SentinelSet {
    pub fn start(
        master_name: &str,
        password: Option<&str>,
        sentinel_password: Option<&str>,
    ) -> SentinelSet {
        SentinelSet::start_on(master_name, password, sentinel_password, None)
    }

    pub fn start_on(
        master_name: &str,
        password: Option<&str>,
        sentinel_password: Option<&str>,
        pki: Option<&Pki>,
    ) -> SentinelSet {
        let mut auth: Vec<&str> = match password {
            Some(password) => vec!["--requirepass", password, "--masterauth", password],
            None => Vec::new(),
        };
        if pki.is_some() {
            auth.extend(["--tls-replication", "yes"]);
        }
        let start = |args: &[&str]| match pki {
            Some(pki) => Redis::start_tls(pki, args),
            None => Redis::start_with(args),
        };
        let master = start(&auth);
        let master_port = master.port.to_string();
        let mut replica_args = auth.clone();
        replica_args.extend(["--replicaof", "127.0.0.1", &master_port]);
        let replica = start(&replica_args);
        wait_for(
            || {
                replica
                    .cli(&["INFO", "replication"])
                    .contains("master_link_status:up")
            },
            "the replica never linked to its master",
        );
        let sentinel = Sentinel::start(master_name, master.port, password, sentinel_password, pki);
        // The sentinel learns of the replica from the master's INFO: a failover needs it.
        wait_for(
            || {
                sentinel
                    .cli(&["SENTINEL", "replicas", master_name])
                    .contains(&replica.port.to_string())
            },
            "the sentinel never saw the replica",
        );
        SentinelSet {
            master,
            replica,
            sentinel,
        }
    }
}

/// `redis-server sentinel.conf --sentinel`, killed on drop.
pub struct Sentinel {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
    password: Option<String>,
    tls_dir: Option<PathBuf>,
}

impl Sentinel {
    fn start(
        master_name: &str,
        master_port: u16,
        password: Option<&str>,
        sentinel_password: Option<&str>,
        pki: Option<&Pki>,
    ) -> Sentinel {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!(
            "ngx-rate-limit-sentinel-{}-{port}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("cannot create the sentinel directory");
        let listen = match pki {
            Some(pki) => format!(
                "port 0\ntls-port {port}\ntls-replication yes\ntls-auth-clients no\n\
                 tls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\n",
                pki.file("server.pem"),
                pki.file("server.key"),
                pki.file("ca.pem")
            ),
            None => format!("port {port}\n"),
        };
        let mut conf = format!(
            "{listen}bind 127.0.0.1\ndir {}\n\
             sentinel monitor {master_name} 127.0.0.1 {master_port} 1\n\
             sentinel down-after-milliseconds {master_name} 1000\n\
             sentinel failover-timeout {master_name} 3000\n",
            dir.display()
        );
        if let Some(password) = password {
            conf += &format!("sentinel auth-pass {master_name} {password}\n");
        }
        if let Some(password) = sentinel_password {
            conf += &format!("requirepass {password}\n");
        }
        let file = dir.join("sentinel.conf");
        std::fs::write(&file, conf).expect("cannot write sentinel.conf");
        let child = Command::new("redis-server")
            .arg(&file)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot start redis-server --sentinel (install redis-server)");
        let sentinel = Sentinel {
            port,
            dir,
            child: Some(child),
            password: sentinel_password.map(str::to_string),
            tls_dir: pki.map(|pki| pki.dir.clone()),
        };
        wait_for(
            || sentinel.cli(&["PING"]).trim() == "PONG",
            "the sentinel did not answer PING",
        );
        sentinel
    }

    /// `redis-cli` against the sentinel.
    pub fn cli(&self, args: &[&str]) -> String {
        redis_cli(
            self.port,
            self.password.as_deref(),
            self.tls_dir.as_deref(),
            args,
        )
    }

    /// The master's port as the sentinel names it now.
    pub fn master_port(&self, master_name: &str) -> Option<u16> {
        let reply = self.cli(&["SENTINEL", "get-master-addr-by-name", master_name]);
        reply.lines().nth(1)?.trim().parse().ok()
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Polls `done` every 20 ms for at most 10 s.
fn wait_for(done: impl Fn() -> bool, failure: &str) {
    for _ in 0..500 {
        if done() {
            return;
        }
        thread::sleep(Duration::from_millis(20));
    }
    panic!("{failure} within 10 s");
}
