//! One nginx under test: a master and its workers in a fresh prefix directory, on free
//! loopback ports, stopped (and its prefix removed) when the [`Nginx`] value is dropped.
//!
//! Configs are whole `nginx.conf` texts with placeholders:
//! - `%%PORT%%`, `%%PORT2%%`, `%%PORT3%%`...: free loopback ports, chosen by binding
//!   `127.0.0.1:0` (`%%PORT%%` and `%%PORT1%%` are the same port);
//! - `%%PREFIX%%`: the absolute prefix directory (it ends without a slash);
//! - `%%MODULE%%`: the absolute path of the rate limit module, for `load_module %%MODULE%%;`;
//! - `%%REPO%%`: the absolute path of this checkout (`lua_package_path "%%REPO%%/lib/?.lua;;"`).
//!
//! `scripts/run-example.sh` fills in the same placeholders (and `%%REDIS%%`, which a test
//! replaces itself with its own Redis's URL).
//!
//! Every config the harness writes has a `pid` directive inside the prefix ([`pin_pid`]):
//! without one, nginx uses the path compiled in, which for Debian's is the host's
//! `/run/nginx.pid` (a test would overwrite it, then delete it when its nginx stops).
//!
//! The harness passes `-g "daemon off;"`, so configs must not set `daemon`, and
//! `-e <prefix>/logs/error.log`, so startup is logged there even by a binary built with
//! `--error-log-path=stderr` (Debian's). Keep the config's error log at that path,
//! `logs/error.log` (any level): [`Nginx::error_log`] and the failure reports read it there.
//! The prefix gets `html/index.html` (`ok\n`), so `root html;` or the default root serves a
//! static file. Workers run as the default user (`nobody` when the tests
//! run as root): the prefix is world-readable, and a config that needs workers to write files
//! says `user root;`.
//!
//! Linux only: processes are found in `/proc`, signals are Linux numbers.

use std::collections::BTreeSet;
use std::env;
use std::fs::{self, File};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

/// How long nginx may take to start, reload or respawn workers before the test fails.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a graceful shutdown (SIGQUIT) may take before everything is SIGKILLed.
const QUIT_TIMEOUT: Duration = Duration::from_secs(5);
const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// Attempts at starting when another process took one of our ports in the meantime.
const START_ATTEMPTS: usize = 3;

const MODULE_FILE: &str = "libngx_http_rate_limit_module.so";
const WORKER_TITLE: &str = "nginx: worker process";

/// Signals and `prctl`, declared here rather than pulling in a crate for three calls.
pub mod sys {
    use std::io;
    use std::os::raw::c_int;

    // Linux signal numbers; these four are the same on every Linux architecture we build for.
    pub const SIGHUP: c_int = 1;
    pub const SIGQUIT: c_int = 3;
    pub const SIGKILL: c_int = 9;
    pub const SIGTERM: c_int = 15;
    const PR_SET_PDEATHSIG: c_int = 1;

    extern "C" {
        fn kill(pid: c_int, sig: c_int) -> c_int;
        fn prctl(option: c_int, ...) -> c_int;
    }

    /// Sends `sig` to a process, or to a process group when `pid` is negative.
    /// Returns false when there is no such process (or group).
    pub fn signal(pid: i32, sig: c_int) -> bool {
        // SAFETY: kill(2) takes plain integers and touches no memory of ours.
        unsafe { kill(pid, sig) == 0 }
    }

    /// Asks the kernel to send `sig` to this process when the thread that forked it exits.
    pub fn set_parent_death_signal(sig: c_int) -> io::Result<()> {
        // SAFETY: PR_SET_PDEATHSIG takes one integer argument; prctl is async-signal-safe, so
        // it may run between fork and exec.
        match unsafe { prctl(PR_SET_PDEATHSIG, sig as std::os::raw::c_ulong) } {
            0 => Ok(()),
            _ => Err(io::Error::last_os_error()),
        }
    }
}

/// The nginx binary the tests run: `TEST_NGINX_BINARY` from the environment when set (as in
/// nginx-tests; e.g. Debian's `/usr/sbin/nginx`, with `RATE_LIMIT_MODULE` naming a module built
/// for it), else the one built by `cargo build` from the vendored source, or the
/// `NGINX_BINARY` given to `cargo build` (build.rs compiles that path in; cargo also sets it
/// when it runs the tests, so it cannot name another binary at run time).
pub fn nginx_binary() -> PathBuf {
    if let Some(path) = env::var_os("TEST_NGINX_BINARY") {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "TEST_NGINX_BINARY={} does not exist",
            path.display()
        );
        return path;
    }
    let path = PathBuf::from(env!("NGINX_BINARY"));
    assert!(
        path.is_file(),
        "nginx binary {} does not exist: run `cargo build` first",
        path.display()
    );
    path
}

/// The rate limit module (`libngx_http_rate_limit_module.so`) that `%%MODULE%%` stands for.
///
/// `RATE_LIMIT_MODULE` overrides it. Otherwise it is the cdylib next to this test binary's
/// `deps/` directory, which `cargo test` does not build: `cargo build` must run first. Panics
/// with that advice when the file is missing, or older than one of the sources it was built
/// from (so a test never runs an outdated module without saying so).
pub fn module_path() -> PathBuf {
    static MODULE: OnceLock<PathBuf> = OnceLock::new();
    MODULE.get_or_init(find_module).clone()
}

fn find_module() -> PathBuf {
    if let Some(path) = env::var_os("RATE_LIMIT_MODULE") {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "RATE_LIMIT_MODULE={} does not exist",
            path.display()
        );
        return fs::canonicalize(&path).unwrap_or(path);
    }

    let exe = env::current_exe().expect("cannot find the test binary's path");
    // target/<profile>/deps/<test binary> -> target/<profile>/
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test binary is not in target/<profile>/deps");
    let path = profile_dir.join(MODULE_FILE);
    assert!(
        path.is_file(),
        "the rate limit module is not built: {} does not exist.\n\
         `cargo test` does not build cdylib targets: run `cargo build` first \
         (`cargo build && cargo test --workspace`), or set RATE_LIMIT_MODULE to a built module.",
        path.display()
    );
    if let Some(source) = newer_source(&path) {
        panic!(
            "the rate limit module {} is older than {}: run `cargo build` first \
             (`cargo build && cargo test --workspace`).",
            path.display(),
            source.display()
        );
    }
    path
}

/// A source file listed in the module's dep-info (`<module>.d`, written by cargo) that is newer
/// than the module itself, if any.
pub fn newer_source(module: &Path) -> Option<PathBuf> {
    let built = fs::metadata(module).and_then(|m| m.modified()).ok()?;
    let dep_info = fs::read_to_string(module.with_extension("d")).ok()?;
    let first_line = dep_info.lines().next()?;
    let (_, sources) = first_line.split_once(": ")?;
    dep_info_paths(sources).into_iter().find(|source| {
        fs::metadata(source)
            .and_then(|m| m.modified())
            .is_ok_and(|modified| modified > built)
    })
}

/// Splits a make-style dependency list on the spaces that are not escaped as `\ `.
pub fn dep_info_paths(list: &str) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    let mut current = String::new();
    let mut chars = list.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => current.extend(chars.next()),
            ' ' => {
                if !current.is_empty() {
                    paths.push(PathBuf::from(std::mem::take(&mut current)));
                }
            }
            _ => current.push(c),
        }
    }
    if !current.is_empty() {
        paths.push(PathBuf::from(current));
    }
    paths
}

/// A free loopback port, never the same one twice in this test process.
///
/// The listener is closed before nginx binds the port, so another process may take it in
/// between: [`Nginx::try_start`] retries with new ports when nginx reports the address in use.
pub fn free_port() -> u16 {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    loop {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("cannot bind 127.0.0.1:0");
        let port = listener
            .local_addr()
            .expect("bound socket has no address")
            .port();
        if HANDED_OUT
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(port)
        {
            return port;
        }
    }
}

/// Number of ports a config template needs: the highest N of `%%PORT%%` (1) and `%%PORTN%%`.
pub fn port_count(template: &str) -> usize {
    let mut count = 0;
    let mut rest = template;
    while let Some(at) = rest.find("%%PORT") {
        rest = &rest[at + "%%PORT".len()..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        if rest[digits.len()..].starts_with("%%") {
            count = count.max(digits.parse().unwrap_or(1));
        }
    }
    count
}

/// Replaces the placeholders; panics on one it does not know (a typo would otherwise reach
/// nginx as a confusing syntax error).
pub fn substitute(template: &str, prefix: &Path, ports: &[u16]) -> String {
    let mut config = template.to_string();
    for (index, port) in ports.iter().enumerate().rev() {
        config = config.replace(&format!("%%PORT{}%%", index + 1), &port.to_string());
    }
    if let Some(port) = ports.first() {
        config = config.replace("%%PORT%%", &port.to_string());
    }
    config = config.replace("%%PREFIX%%", &prefix.display().to_string());
    config = config.replace("%%REPO%%", env!("CARGO_MANIFEST_DIR"));
    if config.contains("%%MODULE%%") {
        config = config.replace("%%MODULE%%", &module_path().display().to_string());
    }
    if let Some(at) = config.find("%%") {
        let end = config[at..].find('\n').map_or(config.len(), |n| at + n);
        panic!("unknown placeholder in nginx config: {}", &config[at..end]);
    }
    config
}

/// `config` with a main-context `pid` directive naming `<prefix>/logs/nginx.pid` in front,
/// unless it has one already; panics when the one it has points outside `prefix`. Tests are
/// hermetic: the pid file of the nginx under test must never be the host's.
pub fn pin_pid(config: &str, prefix: &Path) -> String {
    let existing = config.lines().find_map(|line| {
        let line = line.split('#').next().unwrap_or_default().trim();
        line.strip_prefix("pid")
            .filter(|rest| rest.starts_with(char::is_whitespace))
            .map(|rest| rest.trim().trim_end_matches(';').trim().to_string())
    });
    match existing {
        // Appended, not prepended: the lines nginx names in its errors stay the test's own.
        None => format!("{config}\npid {}/logs/nginx.pid;\n", prefix.display()),
        Some(path) => {
            let inside = !path.starts_with('/') || Path::new(&path).starts_with(prefix);
            assert!(
                inside && !path.contains(".."),
                "the config's pid file {path} is outside the test prefix {}: tests must \
                 not touch the host's files",
                prefix.display()
            );
            config.to_string()
        }
    }
}

/// The number of workers a config asks for: `None` for `worker_processes auto`.
pub fn expected_workers(template: &str) -> Option<usize> {
    for line in template.lines() {
        let line = line.split('#').next().unwrap_or_default();
        let mut words = line.split_whitespace();
        if words.next() == Some("worker_processes") {
            let value = words.next().unwrap_or_default().trim_end_matches(';');
            return value.parse().ok();
        }
    }
    Some(1)
}

/// A fresh, world-readable prefix directory with `logs/` and `html/index.html`.
fn new_prefix() -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    // libtest names each test's thread after the test.
    let test_name: String = thread::current()
        .name()
        .unwrap_or("test")
        .replace("::", "-")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(60)
        .collect();
    let root = env::temp_dir().join("ngx-rate-limit-t");
    let prefix = root.join(format!(
        "{test_name}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = fs::remove_dir_all(&prefix);
    for dir in [&root, &prefix, &prefix.join("logs"), &prefix.join("html")] {
        fs::create_dir_all(dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        fs::set_permissions(dir, fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|e| panic!("cannot chmod {}: {e}", dir.display()));
    }
    write_world_readable(&prefix.join("html/index.html"), "ok\n");
    prefix
}

fn write_world_readable(path: &Path, contents: &str) {
    fs::write(path, contents).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    fs::set_permissions(path, fs::Permissions::from_mode(0o644))
        .unwrap_or_else(|e| panic!("cannot chmod {}: {e}", path.display()));
}

/// Parent pid and process title of a live process, `None` once it is gone or a zombie.
fn process_info(pid: u32) -> Option<(u32, String)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = fields.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    let ppid = fields.next()?.parse().ok()?;
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let title = String::from_utf8_lossy(&cmdline)
        .trim_end_matches(['\0', ' '])
        .replace('\0', " ");
    Some((ppid, title))
}

/// Whether `pid` is a live process (not gone, not a zombie).
pub fn is_running(pid: u32) -> bool {
    process_info(pid).is_some()
}

/// Pids of the live children of `parent` whose title satisfies `wanted`, sorted.
fn children(parent: u32, wanted: impl Fn(&str) -> bool) -> Vec<u32> {
    let mut pids: Vec<u32> = fs::read_dir("/proc")
        .expect("cannot read /proc")
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&pid| matches!(process_info(pid), Some((ppid, title)) if ppid == parent && wanted(&title)))
        .collect();
    pids.sort_unstable();
    pids
}

/// One running nginx. Dropping it stops nginx (SIGQUIT, then SIGKILL of the whole process
/// group after [`QUIT_TIMEOUT`]) and removes the prefix, which is kept when the test panicked.
///
/// Create it on the test's own thread: nginx gets SIGTERM when the thread that started it
/// exits, so an interrupted `cargo test` leaves no nginx behind.
pub struct Nginx {
    prefix: PathBuf,
    ports: Vec<u16>,
    master: Child,
    stopped: bool,
}

impl Nginx {
    /// Starts nginx with `config` (a whole nginx.conf with placeholders) and waits until its
    /// workers run. Panics with the config, stderr and error.log when nginx does not start.
    pub fn start(config: &str) -> Nginx {
        Self::try_start(config).unwrap_or_else(|report| panic!("{report}"))
    }

    /// Like [`Nginx::start`], but returns the failure report (config, stderr, error.log) for
    /// tests that expect nginx to refuse a config at startup.
    pub fn try_start(config: &str) -> Result<Nginx, String> {
        let mut last_report = String::new();
        for _ in 0..START_ATTEMPTS {
            let ports: Vec<u16> = (0..port_count(config)).map(|_| free_port()).collect();
            let prefix = new_prefix();
            write_world_readable(
                &prefix.join("nginx.conf"),
                &pin_pid(&substitute(config, &prefix, &ports), &prefix),
            );
            let master = spawn_master(&prefix);
            let mut nginx = Nginx {
                prefix,
                ports,
                master,
                stopped: false,
            };
            match nginx.wait_ready(expected_workers(config)) {
                Ok(()) => return Ok(nginx),
                Err(report) => {
                    nginx.shutdown();
                    let _ = fs::remove_dir_all(&nginx.prefix);
                    if !report.contains("Address already in use") {
                        return Err(report);
                    }
                    last_report = report;
                }
            }
        }
        Err(last_report)
    }

    /// `%%PORT%%`.
    pub fn port(&self) -> u16 {
        self.port_n(1)
    }

    /// `%%PORTn%%`, counting from 1.
    pub fn port_n(&self, n: usize) -> u16 {
        assert!(
            (1..=self.ports.len()).contains(&n),
            "the config has no %%PORT{n}%%"
        );
        self.ports[n - 1]
    }

    pub fn prefix(&self) -> &Path {
        &self.prefix
    }

    pub fn master_pid(&self) -> u32 {
        self.master.id()
    }

    /// Pids of the workers that serve requests (not those shutting down after a reload), sorted.
    pub fn worker_pids(&self) -> Vec<u32> {
        children(self.master_pid(), |title| title == WORKER_TITLE)
    }

    /// The whole error log (`logs/error.log`).
    pub fn error_log(&self) -> String {
        fs::read_to_string(self.prefix.join("logs/error.log")).unwrap_or_default()
    }

    /// Writes a world-readable file under the prefix, e.g. `html/big.txt`.
    pub fn write_file(&self, relative: &str, contents: &str) {
        let path = self.prefix.join(relative);
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir)
                .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        }
        write_world_readable(&path, contents);
    }

    /// Reloads the same config (SIGHUP) and waits until new workers replaced the old ones.
    /// Returns the new workers' pids.
    pub fn reload(&mut self) -> Vec<u32> {
        let config =
            fs::read_to_string(self.prefix.join("nginx.conf")).expect("nginx.conf is gone");
        self.try_reload_substituted(&config)
            .unwrap_or_else(|report| panic!("reload failed:\n{report}"))
    }

    /// Replaces nginx.conf with `config` (placeholders substituted, keeping this instance's
    /// ports) and reloads; returns the new workers' pids.
    pub fn reload_with(&mut self, config: &str) -> Vec<u32> {
        self.try_reload_with(config)
            .unwrap_or_else(|report| panic!("reload failed:\n{report}"))
    }

    /// Like [`Nginx::reload_with`], but returns what nginx logged when it refused the new
    /// config (it then keeps running the old one).
    pub fn try_reload_with(&mut self, config: &str) -> Result<Vec<u32>, String> {
        while self.ports.len() < port_count(config) {
            self.ports.push(free_port());
        }
        let config = substitute(config, &self.prefix, &self.ports);
        self.try_reload_substituted(&config)
    }

    fn try_reload_substituted(&mut self, config: &str) -> Result<Vec<u32>, String> {
        let config = &pin_pid(config, &self.prefix);
        write_world_readable(&self.prefix.join("nginx.conf"), config);
        let log_start = self.error_log().len();
        let old = self.worker_pids();
        assert!(
            sys::signal(self.master_pid() as i32, sys::SIGHUP),
            "nginx master is gone"
        );
        let expected = expected_workers(config);
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let new_log = self
                .error_log()
                .get(log_start..)
                .unwrap_or_default()
                .to_string();
            if new_log.contains("[emerg]") {
                return Err(new_log);
            }
            let workers = self.worker_pids();
            if workers_ready(&workers, expected) && workers.iter().all(|pid| !old.contains(pid)) {
                return Ok(workers);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "workers {old:?} were not replaced within {READY_TIMEOUT:?} (now {workers:?})\n\
                     error.log since the reload:\n{new_log}"
                ));
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// SIGKILLs every current worker and returns their pids; the master respawns them
    /// ([`Nginx::wait_workers_replaced`] waits for that).
    pub fn kill_workers(&self) -> Vec<u32> {
        let workers = self.worker_pids();
        assert!(!workers.is_empty(), "nginx has no workers to kill");
        for &pid in &workers {
            sys::signal(pid as i32, sys::SIGKILL);
        }
        workers
    }

    /// Waits until as many workers as in `old` run and none of them is in `old`; returns
    /// their pids. Panics with the error log after [`READY_TIMEOUT`].
    pub fn wait_workers_replaced(&self, old: &[u32]) -> Vec<u32> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let workers = self.worker_pids();
            if workers.len() == old.len() && workers.iter().all(|pid| !old.contains(pid)) {
                return workers;
            }
            assert!(
                Instant::now() < deadline,
                "workers {old:?} were not replaced within {READY_TIMEOUT:?} (now {workers:?})\n\
                 error.log:\n{}",
                self.error_log()
            );
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// Stops nginx gracefully (SIGQUIT) and returns the error log. Panics when nginx does not
    /// exit within [`QUIT_TIMEOUT`] (it is then SIGKILLed).
    pub fn stop(mut self) -> String {
        let graceful = self.shutdown();
        let log = self.error_log();
        assert!(
            graceful,
            "nginx did not quit within {QUIT_TIMEOUT:?}; error.log:\n{log}"
        );
        log
    }

    fn wait_ready(&mut self, expected: Option<usize>) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let problem = match self.master.try_wait() {
                Ok(Some(status)) => format!("nginx exited ({status}) instead of starting"),
                Ok(None) if workers_ready(&self.worker_pids(), expected) => return Ok(()),
                Ok(None) if Instant::now() > deadline => {
                    format!("nginx did not start its workers within {READY_TIMEOUT:?}")
                }
                Ok(None) => {
                    thread::sleep(POLL_INTERVAL);
                    continue;
                }
                Err(e) => format!("cannot wait for nginx: {e}"),
            };
            return Err(self.failure_report(&problem));
        }
    }

    fn failure_report(&self, problem: &str) -> String {
        let read = |name: &str| fs::read_to_string(self.prefix.join(name)).unwrap_or_default();
        format!(
            "{problem}\n--- nginx.conf ---\n{}--- stderr ---\n{}--- logs/error.log ---\n{}",
            read("nginx.conf"),
            read("logs/stderr.log"),
            read("logs/error.log")
        )
    }

    /// SIGQUIT, wait, then SIGKILL whatever is left of the process group. Returns whether the
    /// master exited by itself in time.
    fn shutdown(&mut self) -> bool {
        if self.stopped {
            return true;
        }
        self.stopped = true;
        let pid = self.master_pid();
        sys::signal(pid as i32, sys::SIGQUIT);
        let deadline = Instant::now() + QUIT_TIMEOUT;
        // The master stays a zombie until we reap it below, so its pid (the process group id)
        // cannot be reused while we signal the group.
        let graceful = loop {
            if process_info(pid).is_none() {
                break true;
            }
            if Instant::now() > deadline {
                break false;
            }
            thread::sleep(POLL_INTERVAL);
        };
        // Workers left behind by a crashed master, or still busy after the timeout.
        sys::signal(-(pid as i32), sys::SIGKILL);
        let _ = self.master.kill();
        let _ = self.master.wait();
        graceful
    }
}

fn workers_ready(workers: &[u32], expected: Option<usize>) -> bool {
    match expected {
        Some(count) => workers.len() == count,
        None => !workers.is_empty(),
    }
}

fn spawn_master(prefix: &Path) -> Child {
    let output_path = prefix.join("logs/stderr.log");
    let output = File::create(&output_path)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", output_path.display()));
    let mut command = Command::new(nginx_binary());
    command
        .arg("-p")
        .arg(prefix)
        .args(["-c", "nginx.conf", "-g", "daemon off;", "-e"])
        .arg(prefix.join("logs/error.log"))
        .stdin(Stdio::null())
        .stdout(output.try_clone().expect("cannot duplicate a file handle"))
        .stderr(output)
        // Master and workers in a group of their own, so Drop can kill them all at once.
        .process_group(0);
    // SAFETY: the closure only calls prctl, which is async-signal-safe.
    unsafe {
        command.pre_exec(|| sys::set_parent_death_signal(sys::SIGTERM));
    }
    command
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", nginx_binary().display()))
}

impl Drop for Nginx {
    fn drop(&mut self) {
        self.shutdown();
        if thread::panicking() {
            let log = self.error_log();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!(
                "nginx prefix kept for inspection: {}\nlast lines of its error.log:\n{}",
                self.prefix.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        } else {
            let _ = fs::remove_dir_all(&self.prefix);
        }
    }
}

/// Runs `nginx -t` on `config` (placeholders substituted) in a fresh prefix. Returns whether
/// nginx accepted it, and what it printed (its messages go to stderr).
pub fn check_config(config: &str) -> (bool, String) {
    let ports: Vec<u16> = (0..port_count(config)).map(|_| free_port()).collect();
    let prefix = new_prefix();
    write_world_readable(
        &prefix.join("nginx.conf"),
        &pin_pid(&substitute(config, &prefix, &ports), &prefix),
    );
    let output = Command::new(nginx_binary())
        .arg("-t")
        .arg("-p")
        .arg(&prefix)
        .args(["-c", "nginx.conf", "-e"])
        .arg(prefix.join("logs/error.log"))
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", nginx_binary().display()));
    let _ = fs::remove_dir_all(&prefix);
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The `load_module` line the stream module needs first when this nginx has it as a dynamic
/// module (`--with-stream=dynamic`, Debian's `libnginx-mod-stream`), else `None`.
pub fn stream_module_path() -> Option<String> {
    let output = Command::new(nginx_binary())
        .arg("-V")
        .output()
        .expect("run nginx -V");
    let info = String::from_utf8_lossy(&output.stderr).into_owned();
    if !info.contains("--with-stream=dynamic") {
        return None;
    }
    let modules = info
        .split_whitespace()
        .find_map(|word| word.strip_prefix("--modules-path="))
        .unwrap_or("modules");
    Some(format!("{modules}/ngx_stream_module.so"))
}

/// `target/<profile>/ratelimit-replay`, next to this test binary's `deps/` (built by
/// `cargo build`), or `RATELIMIT_REPLAY`.
pub fn replay_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("RATELIMIT_REPLAY") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("cannot find the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test binary is not in target/<profile>/deps");
    let path = profile_dir.join("ratelimit-replay");
    assert!(
        path.is_file(),
        "{} does not exist: run `cargo build` first",
        path.display()
    );
    // Like the module: never compare with an outdated binary without saying so.
    let built = fs::metadata(&path).and_then(|m| m.modified()).ok();
    let dep_info = fs::read_to_string(path.with_extension("d")).unwrap_or_default();
    let sources = dep_info
        .lines()
        .next()
        .and_then(|line| line.split_once(": "))
        .map(|(_, sources)| dep_info_paths(sources))
        .unwrap_or_default();
    for source in sources {
        let modified = fs::metadata(&source).and_then(|m| m.modified()).ok();
        assert!(
            modified <= built,
            "{} is older than {}: run `cargo build` first",
            path.display(),
            source.display()
        );
    }
    path
}
