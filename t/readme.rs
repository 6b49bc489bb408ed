//! What README.md and docs/ show is what a newcomer gets: the walkthroughs' commands (the
//! README's Try it and Change a limit live; docs/admin.md, docs/cluster.md, docs/lua.md,
//! docs/abusers.md), run as written against the example configs in `nginx-conf/` (the Try it,
//! Cluster and Lua ones started by the pages' own `scripts/run-example.sh` lines), print the
//! outputs the pages show; the README's test command is the one CI runs. And the source's own
//! description of the zone store names the hash the code uses.
//!
//! Needs `curl` (the walkthrough's commands are curl command lines), `redis-server` and the
//! module built by `cargo build`; the Lua walkthrough runs when the suite runs against
//! Debian's nginx (`TEST_NGINX_BINARY=/usr/sbin/nginx`), and fails elsewhere unless the runner
//! declared it skipped (`RATE_LIMIT_TEST_SKIP=lua`, t/common/skip.rs).

mod common;

use std::fs;
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::nginx::{free_port, sys};
use common::redis::Redis;
use common::skip;
use common::{check_config, module_path, nginx_binary, Nginx};
use serde_json::Value;

fn repo_file(relative: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(relative);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// The section of a Markdown page (README.md, CONTRIBUTING.md or docs/*.md) that starts with
/// the heading `NAME` at any level (`## NAME`, `### NAME`), up to the next heading of the
/// same or a higher level. Headings inside fenced code blocks do not count.
fn section(page: &str, name: &str) -> String {
    let text = repo_file(page);
    let mut fenced = false;
    let mut level = None;
    let mut lines = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        let hashes = line.chars().take_while(|&c| c == '#').count();
        let heading = !fenced && hashes > 0 && line[hashes..].starts_with(' ');
        match level {
            None if heading && line[hashes..].trim() == name => level = Some(hashes),
            Some(open) if heading && hashes <= open => break,
            Some(_) => lines.push(line),
            None => {}
        }
    }
    assert!(level.is_some(), "{page} has no \"{name}\" heading");
    lines.join("\n") + "\n"
}

/// The fenced code blocks of `text` in `language`, each as its lines.
fn code_blocks(text: &str, language: &str) -> Vec<Vec<String>> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<String>> = None;
    for line in text.lines() {
        match (&mut current, line.trim_end()) {
            (None, fence) if fence == format!("```{language}") => current = Some(Vec::new()),
            (Some(_), "```") => blocks.extend(current.take()),
            (Some(block), line) => block.push(line.to_string()),
            (None, _) => {}
        }
    }
    blocks
}

/// One command of a console block and the output shown under it.
struct Step {
    command: String,
    shown: String,
}

fn steps(block: &[String]) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    for line in block {
        if let Some(command) = line.strip_prefix("$ ") {
            steps.push(Step {
                command: command.to_string(),
                shown: String::new(),
            });
        } else {
            let step = steps
                .last_mut()
                .unwrap_or_else(|| panic!("output before the first command: {line:?}"));
            step.shown.push_str(line);
            step.shown.push('\n');
        }
    }
    steps
}

/// Runs a README command line with bash, the example's default ports replaced by the test's.
fn run(command: &str, port: u16, admin_port: u16) -> String {
    run_with(
        command,
        &[
            ("127.0.0.1:8080", format!("127.0.0.1:{port}")),
            ("127.0.0.1:8081", format!("127.0.0.1:{admin_port}")),
        ],
    )
}

/// Runs a README command line with bash after the replacements `(from, to)`.
fn run_with(command: &str, replacements: &[(&str, String)]) -> String {
    let mut command = command.to_string();
    for (from, to) in replacements {
        command = command.replace(from, to);
    }
    let output = Command::new("bash")
        .args(["-c", &command])
        .output()
        .unwrap_or_else(|e| panic!("cannot run bash: {e}"));
    assert!(
        output.status.success(),
        "{command}: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("curl printed UTF-8")
}

/// Whether `real` is what the README shows. JSON is compared value by value, except that
/// `*_ms` fields count down while commands run: those need only be zero where the README's are
/// and otherwise within half a second of the README's (the example's rate is 1r/s, so a
/// different decision would differ by a whole second).
fn same_output(shown: &str, real: &str) -> bool {
    match (
        serde_json::from_str::<Value>(shown),
        serde_json::from_str::<Value>(real),
    ) {
        (Ok(shown), Ok(real)) => same_json("", &shown, &real),
        _ => shown.trim_end() == real.trim_end(),
    }
}

fn same_json(name: &str, shown: &Value, real: &Value) -> bool {
    match (shown, real) {
        (Value::Object(shown), Value::Object(real)) => {
            shown.len() == real.len()
                && shown
                    .iter()
                    .all(|(key, value)| real.get(key).is_some_and(|r| same_json(key, value, r)))
        }
        (Value::Number(shown), Value::Number(real)) if name.ends_with("_ms") => {
            let (shown, real) = (shown.as_i64().unwrap_or(-1), real.as_i64().unwrap_or(-1));
            (shown == 0) == (real == 0) && shown.abs_diff(real) < 500
        }
        _ => shown == real,
    }
}

/// "Change a limit live" in the README and the admin API's longer walk through it in
/// docs/admin.md: each started as the page says, against `nginx-conf/admin.conf`.
#[test]
fn readme_admin_walkthrough_prints_what_it_shows() {
    for (page, heading) in [
        ("README.md", "Change a limit live"),
        ("docs/admin.md", "A walk through it"),
    ] {
        admin_walkthrough(page, &section(page, heading), heading);
    }
}

/// Runs one admin walkthrough against `nginx-conf/admin.conf`, as the page starts it.
fn admin_walkthrough(page: &str, section: &str, heading: &str) {
    let section = section.to_string();
    let start = code_blocks(&section, "sh");
    assert!(
        start.iter().any(|block| block
            .iter()
            .any(|line| line.trim() == "scripts/run-example.sh nginx-conf/admin.conf")),
        "{page}, {heading}: does not say how to start nginx-conf/admin.conf"
    );
    let blocks = code_blocks(&section, "console");
    assert!(!blocks.is_empty(), "{page}, {heading}: no console block");

    // As scripts/run-example.sh runs it as root: workers as root write the state file.
    let config = format!("user root;\n{}", repo_file("nginx-conf/admin.conf"));
    let nginx = Nginx::start(&config);
    // No request of our own first: the walkthrough's first request is the key's first.
    let (port, admin_port) = (nginx.port(), nginx.port_n(2));

    let mut commands = 0;
    for block in &blocks {
        for step in steps(block) {
            let real = run(&step.command, port, admin_port);
            assert!(
                same_output(&step.shown, &real),
                "{page} shows for `{}`:\n{}\nbut it printed:\n{real}\nerror.log:\n{}",
                step.command,
                step.shown,
                nginx.error_log()
            );
            commands += 1;
        }
    }
    assert!(
        commands >= 4,
        "{page}: only {commands} commands in the walkthrough"
    );
    // The changes were persisted where the README says.
    let state = fs::read_to_string(nginx.prefix().join("rate_limit_state.json"))
        .expect("the walkthrough's changes were not written to rate_limit_state.json");
    assert!(state.contains("per_client"), "{state}");
}

/// The penalty box's walkthrough (docs/abusers.md): `nginx-conf/login.conf` started as the
/// page says; eight wrong passwords, then the right one, print what the page shows.
#[test]
fn abusers_login_walkthrough_prints_what_it_shows() {
    let page = "docs/abusers.md";
    let text = repo_file(page);
    assert!(
        code_blocks(&text, "sh").iter().any(|block| block
            .iter()
            .any(|line| line.trim() == "scripts/run-example.sh nginx-conf/login.conf")),
        "{page} does not say how to start nginx-conf/login.conf"
    );
    let blocks = code_blocks(&text, "console");
    assert!(!blocks.is_empty(), "{page}: no console block");
    let nginx = Nginx::start(&repo_file("nginx-conf/login.conf"));
    let mut commands = 0;
    for block in &blocks {
        for step in steps(block) {
            let real = run(&step.command, nginx.port(), nginx.port_n(2));
            assert!(
                same_output(&step.shown, &real),
                "{page} shows for `{}`:\n{}\nbut it printed:\n{real}\nerror.log:\n{}",
                step.command,
                step.shown,
                nginx.error_log()
            );
            commands += 1;
        }
    }
    assert!(
        commands >= 2,
        "{page}: only {commands} commands in the walkthrough"
    );
}

/// The comparison is strict where it must be: a different status list, a different field
/// value or a `_ms` field a whole second away is a difference.
#[test]
fn walkthrough_comparison_notices_differences() {
    assert!(same_output("200 429\n", "200 429 \n"));
    assert!(!same_output("200 429\n", "200 200\n"));
    let shown = r#"{"remaining": 0, "retry_after_ms": 980, "reset_ms": 10980}"#;
    assert!(same_output(
        shown,
        r#"{"remaining": 0, "retry_after_ms": 975, "reset_ms": 10975}"#
    ));
    assert!(!same_output(
        shown,
        r#"{"remaining": 1, "retry_after_ms": 975, "reset_ms": 10975}"#
    ));
    assert!(!same_output(
        shown,
        r#"{"remaining": 0, "retry_after_ms": 0, "reset_ms": 9975}"#
    ));
    assert!(!same_output(
        shown,
        r#"{"remaining": 0, "retry_after_ms": 980}"#
    ));
}

/// The store (`src/store/mod.rs`) opens with how keys are identified: by the hash
/// `Zone::hash_key` computes.
#[test]
fn the_store_describes_the_hash_it_uses() {
    let source = repo_file("src/store/mod.rs");
    let module_doc: String = source
        .lines()
        .take_while(|line| line.starts_with("//!"))
        .collect::<Vec<_>>()
        .join("\n");
    let hash_key = &source[source
        .find("pub fn hash_key")
        .expect("src/store/mod.rs has no hash_key")..];
    let body = &hash_key[..hash_key.find("\n    }").unwrap_or(hash_key.len())];
    assert!(
        body.contains("foldhash::"),
        "hash_key no longer uses foldhash: update this test and the module doc:\n{body}"
    );
    assert!(
        module_doc.contains("foldhash"),
        "src/store/mod.rs's opening comment does not say keys are hashed with foldhash:\n{module_doc}"
    );
    for other in ["SipHash", "siphash", "FxHash", "ahash", "xxhash"] {
        assert!(
            !module_doc.contains(other),
            "src/store/mod.rs's opening comment names {other}"
        );
    }
}

/// nginx started by a README command line (`scripts/run-example.sh ...`) through bash, from the
/// checkout as a newcomer runs it, with the nginx and module this test uses (`NGINX=`,
/// `MODULE=`: the script would otherwise run `cargo build`), a prefix of its own (`PREFIX=`)
/// and `env`. Stopped (SIGTERM to its process group, then SIGKILL) and its prefix removed on
/// drop.
struct ScriptedExample {
    child: Child,
    prefix: PathBuf,
    command: String,
}

impl ScriptedExample {
    fn start(command: &str, port: u16, env: &[(&str, String)]) -> ScriptedExample {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let prefix = std::env::temp_dir().join("ngx-rate-limit-t").join(format!(
            "readme-example-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&prefix);
        fs::create_dir_all(&prefix).expect("cannot create the example's prefix");
        let log = fs::File::create(prefix.join("script.log")).expect("cannot create script.log");
        let mut child = Command::new("bash");
        child
            .args(["-c", command])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("NGINX", nginx_binary())
            .env("MODULE", module_path())
            .env("PREFIX", &prefix)
            .env("PORT", port.to_string())
            .envs(env.iter().map(|(name, value)| (name, value)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("cannot duplicate a file handle"))
            .stderr(log)
            .process_group(0);
        // SAFETY: the closure only calls prctl, which is async-signal-safe.
        unsafe {
            child.pre_exec(|| sys::set_parent_death_signal(sys::SIGTERM));
        }
        let child = child
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run bash: {e}"));
        let mut example = ScriptedExample {
            child,
            prefix,
            command: command.to_string(),
        };
        example.wait_listening(port);
        example
    }

    fn log(&self) -> String {
        example_log(&self.prefix)
    }

    fn wait_listening(&mut self, port: u16) {
        let prefix = self.prefix.clone();
        let what = format!("`{}`", self.command);
        wait_listening(&mut self.child, port, &what, || example_log(&prefix));
    }
}

/// What a scripted example said, and its nginx's error log, under its prefix.
fn example_log(prefix: &Path) -> String {
    let read = |name: &str| fs::read_to_string(prefix.join(name)).unwrap_or_default();
    format!(
        "--- script output ---\n{}--- logs/error.log ---\n{}",
        read("script.log"),
        read("logs/error.log")
    )
}

/// Waits until something listens on 127.0.0.1:`port`; fails, naming `what` and its `log`,
/// when `child` exits first or nothing listens after 20 s.
fn wait_listening(child: &mut Child, port: u16, what: &str, log: impl Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited ({status}):\n{}", log());
        }
        assert!(
            Instant::now() < deadline,
            "{what} does not listen on {port} after 20 s:\n{}",
            log()
        );
        thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for ScriptedExample {
    fn drop(&mut self) {
        let group = -(self.child.id() as i32);
        sys::signal(group, sys::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
        sys::signal(group, sys::SIGKILL);
        let _ = self.child.kill();
        let _ = self.child.wait();
        if thread::panicking() {
            eprintln!("`{}`:\n{}", self.command, self.log());
        }
        let _ = fs::remove_dir_all(&self.prefix);
    }
}

/// The Cluster walkthrough: the README's two commands start two instances of
/// `nginx-conf/cluster.conf` (the second with its own prefix and port) against one Redis, and
/// its curl loop over both prints what the README shows: one limit for the two.
#[test]
fn readme_cluster_walkthrough_prints_what_it_shows() {
    let section = section("docs/cluster.md", "Try it on one machine");
    let starts: Vec<String> = code_blocks(&section, "sh")
        .concat()
        .into_iter()
        .map(|line| {
            line.split('#')
                .next()
                .unwrap_or_default()
                .trim()
                .to_string()
        })
        .filter(|line| line.contains("scripts/run-example.sh nginx-conf/cluster.conf"))
        .collect();
    assert_eq!(
        starts,
        [
            "scripts/run-example.sh nginx-conf/cluster.conf",
            "INSTANCE=2 PORT=8082 scripts/run-example.sh nginx-conf/cluster.conf"
        ],
        "the Cluster section does not start the two instances as this test expects"
    );
    let blocks = code_blocks(&section, "console");
    assert!(
        !blocks.is_empty(),
        "the Cluster section has no console block"
    );

    let redis = Redis::start();
    let redis_url = ("REDIS_URL", format!("redis://127.0.0.1:{}", redis.port));
    let ports = [free_port(), free_port()];
    let _instances: Vec<ScriptedExample> = starts
        .iter()
        .zip(ports)
        .map(|(command, port)| {
            let command = command.replace("PORT=8082", &format!("PORT={port}"));
            ScriptedExample::start(&command, port, std::slice::from_ref(&redis_url))
        })
        .collect();
    // Both instances' sync loops heartbeat, as they have by the time a reader pastes.
    redis.wait_instances(2);

    let replacements = [
        ("8080", ports[0].to_string()),
        ("8082", ports[1].to_string()),
    ];
    let mut commands = 0;
    for block in &blocks {
        for step in steps(block) {
            let real = run_with(&step.command, &replacements);
            assert!(
                same_output(&step.shown, &real),
                "the page shows for `{}`:\n{}\nbut it printed:\n{real}",
                step.command,
                step.shown,
            );
            commands += 1;
        }
    }
    assert!(commands >= 2, "only {commands} commands in the walkthrough");
    // The loop went through Redis: the key's state is there (beside the zone's limits and
    // overrides).
    let keys = redis.cli(&["KEYS", "rl:per_api_key:*"]);
    let key_states: Vec<&str> = keys
        .lines()
        .filter(|key| !key.ends_with(":limits") && !key.ends_with(":overrides"))
        .collect();
    assert_eq!(key_states.len(), 1, "keys of the zone in Redis: {keys}");
}

/// Why the README's Lua walkthrough (which runs Debian's nginx) cannot run here: `None` when
/// the nginx under test is Debian's with its Lua module installed (`RATE_LIMIT_MODULE` then
/// built for it).
fn debian_lua_unavailable() -> Option<String> {
    let binary = nginx_binary();
    let debian = binary.canonicalize().unwrap_or(binary.clone()) == Path::new("/usr/sbin/nginx");
    let lua = Path::new("/usr/lib/nginx/modules/ngx_http_lua_module.so").is_file();
    (!debian || !lua).then(|| {
        format!(
            "needs Debian's nginx with Lua: {} is not /usr/sbin/nginx with \
             libnginx-mod-http-lua (run with TEST_NGINX_BINARY=/usr/sbin/nginx and \
             RATE_LIMIT_MODULE built by scripts/build-for-nginx.sh, as .ci/run does)",
            binary.display()
        )
    })
}

/// The README's Lua examples are the locations of `nginx-conf/lua.conf`, which the
/// walkthrough starts and t/lua_api.rs tests: each ```nginx block with a `location` is in
/// the file line for line (indentation aside), its zone lines too.
#[test]
fn readme_lua_examples_are_in_lua_conf() {
    let section = repo_file("docs/lua.md");
    let file: Vec<String> = repo_file("nginx-conf/lua.conf")
        .lines()
        .map(|line| line.trim().to_string())
        .collect();
    let examples: Vec<Vec<String>> = code_blocks(&section, "nginx")
        .into_iter()
        .filter(|block| block.iter().any(|line| line.starts_with("location ")))
        .collect();
    assert_eq!(
        examples.len(),
        6,
        "the README's Lua examples: {examples:#?}"
    );
    for block in &examples {
        let (zones, location): (Vec<&String>, Vec<&String>) = block
            .iter()
            .filter(|line| !line.trim().is_empty())
            .partition(|line| line.starts_with("rate_limit_zone "));
        for zone in zones {
            assert!(
                file.contains(&zone.trim().to_string()),
                "nginx-conf/lua.conf has no {zone:?}"
            );
        }
        // The location's lines, in order, as consecutive lines of the file.
        let location: Vec<String> = location
            .iter()
            .map(|line| line.trim().to_string())
            .collect();
        assert!(
            file.windows(location.len())
                .any(|window| window == location.as_slice()),
            "nginx-conf/lua.conf does not hold the README's\n{}",
            location.join("\n")
        );
    }
}

/// The Lua walkthrough: the README's command starts `nginx-conf/lua.conf` with Debian's nginx,
/// and its curl commands print what the README shows.
#[test]
fn readme_lua_walkthrough_prints_what_it_shows() {
    let section = section("docs/lua.md", "A walk through it");
    let start = "NGINX=/usr/sbin/nginx scripts/run-example.sh nginx-conf/lua.conf";
    assert!(
        code_blocks(&section, "sh")
            .iter()
            .any(|block| block.iter().any(|line| line.trim() == start)),
        "the From Lua section does not start nginx-conf/lua.conf with {start:?}"
    );
    let blocks = code_blocks(&section, "console");
    assert!(
        !blocks.is_empty(),
        "the From Lua section has no console block"
    );
    if skip::unless_declared("lua", debian_lua_unavailable()).is_some() {
        return;
    }

    let port = free_port();
    let _example = ScriptedExample::start(start, port, &[]);
    let replacements = [("127.0.0.1:8080", format!("127.0.0.1:{port}"))];
    let mut commands = 0;
    for block in &blocks {
        for step in steps(block) {
            let real = run_with(&step.command, &replacements);
            assert!(
                same_output(&step.shown, &real),
                "the page shows for `{}`:\n{}\nbut it printed:\n{real}",
                step.command,
                step.shown,
            );
            commands += 1;
        }
    }
    assert!(commands >= 4, "only {commands} commands in the walkthrough");
}

/// The Prometheus scrape config of "Seeing who is limited" reaches the metrics: its
/// `metrics_path` on its target (`nginx-conf/admin.conf`'s admin listener) answers the
/// Prometheus text format, and its rule file exists.
#[test]
fn readme_prometheus_scrape_config_reaches_the_metrics() {
    let section = section("docs/observability.md", "Grafana and alerts");
    let blocks = code_blocks(&section, "yaml");
    assert_eq!(blocks.len(), 1, "one yaml block expected: {blocks:?}");
    let config: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&blocks[0].join("\n")).expect("the scrape config is YAML");
    let job = &config["scrape_configs"][0];
    let path = job["metrics_path"].as_str().expect("metrics_path");
    let target = job["static_configs"][0]["targets"][0]
        .as_str()
        .expect("a target");
    assert_eq!(target, "127.0.0.1:8081", "admin.conf's admin listener");
    let rules = config["rule_files"][0].as_str().expect("rule_files");
    let rules = rules
        .strip_prefix("/path/to/ngx-rate-limit/")
        .expect("rule_files in the checkout");
    assert!(
        Path::new(env!("CARGO_MANIFEST_DIR")).join(rules).is_file(),
        "{rules}"
    );

    let nginx = Nginx::start(&repo_file("nginx-conf/admin.conf"));
    let response = common::get(nginx.port_n(2), path);
    assert_eq!(response.status, 200, "{path}: {}", response.text());
    assert!(
        response
            .header("Content-Type")
            .is_some_and(|value| value.starts_with("text/plain")),
        "{response:?}"
    );
    assert!(
        response.text().contains("rate_limit_requests_total{"),
        "{}",
        response.text()
    );
}

/// The first two messages of the Troubleshooting section are nginx's own: a config without
/// `load_module`, and a module built for another nginx (the vendored 1.28 and Debian's
/// 1.22.1, whichever way round this run has them).
#[test]
fn readme_troubleshooting_quotes_nginx() {
    let section = repo_file("docs/troubleshooting.md");

    let (ok, output) = check_config(
        "events {}\nhttp { rate_limit_zone $binary_remote_addr zone=per_client:10m rate=10r/s; }\n",
    );
    assert!(!ok, "{output}");
    let quoted = "[emerg] unknown directive \"rate_limit_zone\" in ";
    assert!(output.contains(quoted), "{output}");
    assert!(section.contains(&quoted["[emerg] ".len()..]), "{section}");

    // The module under test into the other nginx: Debian's when the suite runs the vendored
    // one, the vendored one when it runs Debian's.
    let debian = Path::new("/usr/sbin/nginx");
    let under_test = nginx_binary();
    let other = if under_test.canonicalize().unwrap_or(under_test.clone()) == debian {
        PathBuf::from(env!("NGINX_BINARY"))
    } else {
        debian.to_path_buf()
    };
    let unmet = (!other.is_file()).then(|| {
        format!(
            "the version message needs a second nginx: {} is missing",
            other.display()
        )
    });
    if skip::unless_declared("debian-nginx", unmet).is_some() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("ngx-rate-limit-t-version-{}", free_port()));
    fs::create_dir_all(dir.join("logs")).expect("cannot create a prefix");
    let conf = dir.join("nginx.conf");
    fs::write(
        &conf,
        format!(
            "pid {}/logs/nginx.pid;\nload_module {};\nevents {{}}\n",
            dir.display(),
            module_path().display()
        ),
    )
    .expect("cannot write nginx.conf");
    let output = Command::new(&other)
        .arg("-t")
        .arg("-p")
        .arg(&dir)
        .arg("-c")
        .arg(&conf)
        .arg("-e")
        .arg(dir.join("logs/error.log"))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", other.display()));
    let _ = fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&output.stderr);
    // "version 1028003 instead of 1022001": the module's nginx, then the binary's.
    let versions = |text: &str| -> Option<(String, String)> {
        let rest = &text[text.find("\" version ")? + "\" version ".len()..];
        let (module, rest) = rest.split_once(" instead of ")?;
        let binary: String = rest.chars().take_while(char::is_ascii_digit).collect();
        Some((module.to_string(), binary))
    };
    let real = versions(&stderr).unwrap_or_else(|| panic!("no version message: {stderr}"));
    let shown = versions(&section.split_whitespace().collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| panic!("the Troubleshooting section quotes no version message"));
    let mut real_pair = [real.0.clone(), real.1.clone()];
    let mut shown_pair = [shown.0, shown.1];
    real_pair.sort();
    shown_pair.sort();
    assert_eq!(real_pair, shown_pair, "nginx said: {stderr}");
    assert!(
        stderr.contains("[emerg] module \"") && stderr.contains(" instead of "),
        "{stderr}"
    );
}

/// "Try it": the README's first command starts `nginx-conf/basic.conf` through the script,
/// and its curl loop prints the statuses in the comment under it.
#[test]
fn readme_try_it_prints_what_it_shows() {
    let section = section("README.md", "Try it");
    let blocks = code_blocks(&section, "sh");
    let start = blocks
        .iter()
        .flatten()
        .map(|line| line.split('#').next().unwrap_or_default().trim())
        .find(|line| line.starts_with("scripts/run-example.sh"))
        .expect("Try it does not start scripts/run-example.sh")
        .to_string();
    assert_eq!(start, "scripts/run-example.sh");
    // The second command is the test command, and it is the one CI runs.
    let test_command = blocks[0]
        .iter()
        .map(|line| line.split(" # ").next().unwrap_or_default().trim())
        .nth(1)
        .expect("Try it's first block has no second command");
    assert_eq!(
        test_command, "scripts/test.sh",
        "Try it's second command is not the test command"
    );
    // It builds first, runs every crate's tests, and one failing binary must not hide the
    // others' results (issue 42).
    let script = repo_file("scripts/test.sh");
    let runs = |command: &str| {
        script
            .lines()
            .any(|line| line.trim_start().starts_with(command))
    };
    assert!(
        runs("cargo build") && runs("exec cargo test --workspace --no-fail-fast"),
        "scripts/test.sh does not build and then run `cargo test --workspace --no-fail-fast`"
    );
    // .ci/run runs it, and installs none of the packages only the tests need: the script's
    // own install is what CI proves on its fresh machine.
    let ci = repo_file(".ci/run");
    assert!(
        ci.lines().any(|line| line.trim() == "time scripts/test.sh"),
        "README.md's test command `{test_command}` is not what .ci/run runs"
    );
    for package in [
        "redis-server",
        "chromium-driver",
        "python3-grpcio",
        "tzdata",
    ] {
        assert!(
            script.contains(package),
            "scripts/test.sh does not install {package}"
        );
        assert!(
            !ci.lines()
                .filter(|line| !line.trim_start().starts_with('#'))
                .any(|line| line.split_whitespace().any(|word| word == package)),
            ".ci/run installs {package} itself, so CI does not prove that scripts/test.sh does"
        );
    }
    let (command, shown) = blocks
        .iter()
        .find_map(|block| {
            let at = block.iter().position(|line| line.starts_with("curl "))?;
            let shown = block.get(at + 1)?.strip_prefix("# ")?;
            Some((block[at].clone(), shown.to_string()))
        })
        .expect("Try it has no curl loop with its output under it");

    let port = free_port();
    let _example = ScriptedExample::start(&start, port, &[]);
    let real = run_with(&command, &[("127.0.0.1:8080", format!("127.0.0.1:{port}"))]);
    assert_eq!(real.trim_end(), shown, "`{command}`");
}

/// docs/observability.md's screenshot command, as printed (run as root here, as in CI: hence
/// its `--no-sandbox`), captures the dashboard of `nginx-conf/admin.conf` once its first
/// fetches are answered: the picture holds the page's text and chart, not a blank page (a
/// blank 1400x1000 PNG takes a few KB; the dashboard, tens).
#[test]
fn observability_screenshot_command_captures_the_dashboard() {
    let text = repo_file("docs/observability.md");
    let command = code_blocks(&text, "sh")
        .into_iter()
        .map(|block| block.join("\n"))
        .find(|block| block.contains("--screenshot="))
        .expect("docs/observability.md has no screenshot command");
    assert!(command.contains("--no-sandbox"), "{command}");
    let nginx = Nginx::start(&repo_file("nginx-conf/admin.conf"));
    let dir = std::env::temp_dir().join(format!("ngx-rate-limit-t-shot-{}", free_port()));
    fs::create_dir_all(&dir).expect("cannot create a directory");
    let command = command.replace("127.0.0.1:8081", &format!("127.0.0.1:{}", nginx.port_n(2)));
    let output = Command::new("bash")
        .args(["-c", &command])
        .current_dir(&dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run bash: {e}"));
    let shot = fs::read(dir.join("dashboard.png")).unwrap_or_default();
    let _ = fs::remove_dir_all(&dir);
    assert!(
        output.status.success() && shot.starts_with(b"\x89PNG"),
        "{command}: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        shot.len() > 20_000,
        "a {} byte screenshot: a blank page?",
        shot.len()
    );
}

/// The walkthroughs of a page section that starts example files with `scripts/run-example.sh`:
/// each start line of its `sh` blocks (the command without its comment), with the steps of
/// the `console` blocks that follow it, up to the next start.
fn example_walkthroughs(page: &str, heading: &str) -> Vec<(String, Vec<Step>)> {
    let mut walkthroughs: Vec<(String, Vec<Step>)> = Vec::new();
    let mut fence: Option<(String, Vec<String>)> = None;
    for line in section(page, heading).lines() {
        match &mut fence {
            None => {
                if let Some(language) = line.trim_end().strip_prefix("```") {
                    fence = Some((language.to_string(), Vec::new()));
                }
            }
            Some((language, lines)) if line.trim_end() == "```" => {
                if language == "sh" {
                    for line in lines.iter() {
                        let command = line.split('#').next().unwrap_or_default().trim();
                        if command.starts_with("scripts/run-example.sh ") {
                            walkthroughs.push((command.to_string(), Vec::new()));
                        }
                    }
                } else if language == "console" {
                    let (_, steps_so_far) = walkthroughs
                        .last_mut()
                        .unwrap_or_else(|| panic!("{page}, {heading}: a console block first"));
                    steps_so_far.extend(steps(lines));
                }
                fence = None;
            }
            Some((_, lines)) => lines.push(line.to_string()),
        }
    }
    walkthroughs
}

/// Runs a page's walkthroughs of example files: each example started by its own
/// `scripts/run-example.sh` line on free ports (`PORT`, `ADMIN_PORT`, `UPSTREAM_PORT` for the
/// pages' 8080, 8081 and 8082), its commands run with those ports, their outputs compared
/// with the page's. Returns how many commands ran for each example.
fn run_example_walkthroughs(page: &str, heading: &str) -> Vec<(String, usize)> {
    let mut ran = Vec::new();
    for (start, steps) in example_walkthroughs(page, heading) {
        let ports = [free_port(), free_port(), free_port()];
        let example = ScriptedExample::start(
            &start,
            ports[0],
            &[
                ("ADMIN_PORT", ports[1].to_string()),
                ("UPSTREAM_PORT", ports[2].to_string()),
            ],
        );
        let replacements = [
            ("127.0.0.1:8080", format!("127.0.0.1:{}", ports[0])),
            ("127.0.0.1:8081", format!("127.0.0.1:{}", ports[1])),
            ("127.0.0.1/8081", format!("127.0.0.1/{}", ports[1])),
        ];
        for step in &steps {
            let real = run_with(&step.command, &replacements);
            assert!(
                same_output(&step.shown, &real),
                "{page} ({start}) shows for `{}`:\n{}\nbut it printed:\n{real}\n{}",
                step.command,
                step.shown,
                example.log()
            );
        }
        ran.push((start, steps.len()));
    }
    ran
}

/// docs/usage.md's Try it: `nginx-conf/llm.conf` and its stand-in model, a completion plain
/// and streamed, and the key's tokens in the admin API (issue 42).
#[test]
fn usage_walkthrough_prints_what_it_shows() {
    let ran = run_example_walkthroughs("docs/usage.md", "Try it");
    assert_eq!(
        ran,
        [("scripts/run-example.sh nginx-conf/llm.conf".to_string(), 4)],
        "docs/usage.md's Try it does not run as this test expects"
    );
}

/// docs/stream.md's Try it: the SMTP relay's connections and the DNS forwarder's queries,
/// each example with the stand-in upstream its file serves (issue 42).
#[test]
fn stream_walkthrough_prints_what_it_shows() {
    let ran = run_example_walkthroughs("docs/stream.md", "Try it");
    assert_eq!(
        ran,
        [
            (
                "scripts/run-example.sh nginx-conf/stream-smtp.conf".to_string(),
                2
            ),
            (
                "scripts/run-example.sh nginx-conf/stream-dns.conf".to_string(),
                1
            ),
        ],
        "docs/stream.md's Try it does not run as this test expects"
    );
}

/// `scripts/run-example.sh` with its port taken says so, and which variable picks another,
/// instead of leaving the reader with nginx's bind() error (issue 42).
#[test]
fn run_example_names_a_busy_port_and_how_to_pick_another() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port");
    let port = taken.local_addr().expect("its address").port();
    let prefix = std::env::temp_dir()
        .join("ngx-rate-limit-t")
        .join(format!("readme-busy-{}", std::process::id()));
    let output = Command::new("bash")
        .arg("scripts/run-example.sh")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("NGINX", nginx_binary())
        .env("MODULE", module_path())
        .env("PREFIX", &prefix)
        .env("PORT", port.to_string())
        .stdin(Stdio::null())
        .output()
        .expect("cannot run bash");
    let _ = fs::remove_dir_all(&prefix);
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "it started on a taken port:\n{said}"
    );
    let another = if port < 64535 {
        port + 1000
    } else {
        port - 1000
    };
    assert!(
        said.contains(&format!("port {port} is in use"))
            && said.contains(&format!(
                "PORT={another} scripts/run-example.sh nginx-conf/basic.conf"
            )),
        "{said}"
    );
}

/// Issue 49: every shell block of docs/admin.md's reference (from "Paths" on) runs as written,
/// in the page's order, against the configuration the page gives for it, in one shell whose
/// assignments (`A=...`) carry over: each command exits 0 with the HTTP status its `# NNN`
/// comment names (a 4xx where the page shows an `"error"`, else a 2xx: curl's status is
/// appended through a `.curlrc` of the test's, so the commands stay the page's), and every
/// field name the page shows is in the answer; the metrics lines it shows are there with
/// their names and labels. Every curl of the page is silent (`-s`), so no progress meter
/// mixes into what it prints.
#[test]
fn admin_reference_examples_run_as_written() {
    let page = "docs/admin.md";
    let text = repo_file(page);
    for block in code_blocks(&text, "console")
        .iter()
        .chain(&code_blocks(&text, "sh"))
    {
        for line in block.iter().filter(|line| line.contains("curl ")) {
            assert!(
                line.split_whitespace().any(|word| word.starts_with("-s")),
                "{page}: a curl without -s: {line}"
            );
        }
    }
    let reference = &text[text.find("\n## Paths").expect("a Paths section")..];
    let configs = code_blocks(reference, "nginx");
    let config = configs
        .first()
        .expect("the reference's setup: an nginx block");
    let config = format!(
        "load_module %%MODULE%%;\nevents {{}}\n{}",
        config
            .join("\n")
            .replace("127.0.0.1:8080", "127.0.0.1:%%PORT%%")
            .replace("127.0.0.1:8081", "127.0.0.1:%%PORT2%%")
    );
    let nginx = Nginx::start(&config);
    let curl_home = nginx.prefix().join("curl-home");
    fs::create_dir_all(&curl_home).unwrap();
    fs::write(
        curl_home.join(".curlrc"),
        "write-out = \"\\n%{http_code}\\n\"\n",
    )
    .unwrap();
    let replacements = [
        ("127.0.0.1:8080", format!("127.0.0.1:{}", nginx.port())),
        ("127.0.0.1:8081", format!("127.0.0.1:{}", nginx.port_n(2))),
    ];
    let mut assignments = String::new();
    let mut commands = 0;
    for block in code_blocks(reference, "console") {
        for step in steps(&block) {
            let mut command = step.command.clone();
            for (from, to) in &replacements {
                command = command.replace(from, to);
            }
            let is_assignment = command.split_once('=').is_some_and(|(name, value)| {
                !name.is_empty()
                    && name.chars().all(|c| c.is_ascii_uppercase() || c == '_')
                    && !value.contains(' ')
            });
            if is_assignment {
                assignments += &format!("{command}; ");
                continue;
            }
            let output = Command::new("bash")
                .args(["-c", &format!("{assignments}{command}")])
                .env("CURL_HOME", &curl_home)
                .output()
                .unwrap_or_else(|e| panic!("cannot run bash: {e}"));
            assert!(
                output.status.success(),
                "{page}: `{}` failed: {}\n{}",
                step.command,
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
            let real = String::from_utf8_lossy(&output.stdout).into_owned();
            let trimmed = real.trim_end();
            let (body, status) = trimmed.rsplit_once('\n').unwrap_or(("", trimmed));
            let status: u16 = status
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("{page}: `{}`: no status in {real:?}", step.command));
            let comment_status = step
                .command
                .split_once("# ")
                .and_then(|(_, comment)| comment.get(..3))
                .and_then(|code| code.parse::<u16>().ok());
            match comment_status {
                Some(expected) => assert_eq!(
                    status, expected,
                    "{page}: `{}` answered {status}: {body}",
                    step.command
                ),
                None if step.shown.contains("\"error\"") => assert!(
                    (400..500).contains(&status),
                    "{page}: `{}` answered {status}: {body}",
                    step.command
                ),
                None => assert!(
                    (200..300).contains(&status),
                    "{page}: `{}` answered {status}: {body}",
                    step.command
                ),
            }
            for field in shown_fields(&step.shown) {
                assert!(
                    body.contains(&field),
                    "{page}: `{}` shows {field} but the answer has none:\n{body}",
                    step.command
                );
            }
            commands += 1;
        }
    }
    assert!(commands >= 18, "{page}: only {commands} reference commands");
    // What the page says of a concurrency key nobody is using.
    let idle = common::get(nginx.port_n(2), "/ratelimit/zones/app_auto/keys/app");
    assert_eq!(idle.status, 404, "{}", idle.text());
}

/// What an answer shown on a page must contain, whatever its numbers: the JSON field names
/// (`"zone":`), and of a Prometheus text each comment line and each sample's name and labels.
fn shown_fields(shown: &str) -> Vec<String> {
    let mut fields = Vec::new();
    for line in shown.lines().filter(|line| line.trim() != "...") {
        if line.starts_with('#') {
            fields.push(line.to_string());
        } else if line.starts_with("rate_limit_") {
            let name = line.rsplit_once(' ').map_or(line, |(name, _)| name);
            fields.push(name.to_string());
        } else {
            let mut rest = line;
            while let Some(start) = rest.find('"') {
                let after = &rest[start + 1..];
                let Some(end) = after.find('"') else { break };
                let (name, tail) = after.split_at(end);
                if tail[1..].trim_start().starts_with(':') {
                    fields.push(format!("\"{name}\""));
                }
                rest = &tail[1..];
            }
        }
    }
    fields
}

/// Issue 49: docs/install.md's shell blocks for the vendored nginx run as written, in a
/// scratch copy of the checkout's layout (its `scripts/`, `nginx-conf/` and `target/debug/`
/// linked in, so that `my.conf`, `target/run/` and `target/mine/` are the test's own): the
/// first copies basic.conf and starts it with `scripts/run-example.sh` (the script's own
/// `NGINX`/`MODULE`/`PORT` variables pick the vendored build and free ports), which answers
/// and limits; the second runs the config that script wrote under a prefix of its own, and
/// the page's `kill -QUIT` stops it. (The page's other blocks install packages into the
/// machine's nginx: scripts/check-install.sh runs them verbatim, as root, in CI.)
#[test]
fn install_vendored_blocks_run_as_written() {
    let page = "docs/install.md";
    let blocks = code_blocks(
        &section(page, "The vendored nginx: your own config with the module"),
        "sh",
    );
    assert_eq!(blocks.len(), 2, "{page}: the vendored nginx's shell blocks");
    // No shell block of the page escapes: those not run here stand in the two sections whose
    // blocks scripts/check-install.sh runs (it refuses to run when their number changes).
    let elsewhere = [
        "Debian and Ubuntu: a package for the installed nginx",
        "Any installed nginx: `scripts/build-for-nginx.sh`",
    ]
    .map(|name| code_blocks(&section(page, name), "sh").len());
    assert_eq!(
        elsewhere,
        [3, 2],
        "{page}: update scripts/check-install.sh too"
    );
    let all = code_blocks(&repo_file(page), "sh").len();
    assert_eq!(
        all,
        2 + 3 + 2,
        "{page}: a shell block outside the sections that are run"
    );
    let checked = repo_file("scripts/check-install.sh");
    assert!(checked.contains("sh debian)\" = 3 ]") && checked.contains("sh any)\" = 2 ]"));
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let scratch = std::env::temp_dir()
        .join("ngx-rate-limit-t")
        .join(format!("install-vendored-{}", std::process::id()));
    let _ = fs::remove_dir_all(&scratch);
    fs::create_dir_all(scratch.join("target")).unwrap();
    for linked in ["scripts", "nginx-conf", "lib", "target/debug"] {
        std::os::unix::fs::symlink(repo.join(linked), scratch.join(linked)).unwrap();
    }
    let vendored = run_with(
        "ls -t target/debug/build/nginx-sys-*/out/objs/nginx | head -n1",
        &[],
    );
    let vendored = repo.join(vendored.trim());
    assert!(vendored.is_file(), "no vendored nginx: run `cargo build`");
    let (port, admin_port, upstream_port) = (free_port(), free_port(), free_port());
    let script = |block: &[String]| {
        let mut command = Command::new("bash");
        command
            .args(["-e", "-c", &block.join("\n")])
            .current_dir(&scratch)
            .stdin(Stdio::null())
            .process_group(0);
        command
    };

    // The first block: run-example.sh in the foreground, stopped as a user stops it.
    let log = fs::File::create(scratch.join("example.log")).unwrap();
    // NGINX only for the script: an nginx started with NGINX set takes it for the sockets of
    // a binary upgrade, and stays in the foreground.
    let mut example = script(&blocks[0])
        .env("NGINX", &vendored)
        .env(
            "MODULE",
            repo.join("target/debug/libngx_http_rate_limit_module.so"),
        )
        .env("PORT", port.to_string())
        .env("ADMIN_PORT", admin_port.to_string())
        .env("UPSTREAM_PORT", upstream_port.to_string())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run bash: {e}"));
    let example_log = || fs::read_to_string(scratch.join("example.log")).unwrap_or_default();
    wait_listening(
        &mut example,
        port,
        &format!("{page}: the first block"),
        example_log,
    );
    assert!(scratch.join("my.conf").is_file(), "{page}: no my.conf");
    // basic.conf: 5r/s with burst=10 nodelay, so 30 requests at once meet the limit.
    let statuses: Vec<u16> = (0..30).map(|_| common::get(port, "/").status).collect();
    assert_eq!(statuses[0], 200, "{page}: {statuses:?}\n{}", example_log());
    assert!(
        statuses.contains(&429),
        "{page}: never limited: {statuses:?}"
    );
    sys::signal(-(example.id() as i32), sys::SIGTERM);
    let status = example.wait().unwrap();
    let written = scratch.join("target/run/nginx.conf");
    assert!(
        written.is_file(),
        "{page}: run-example.sh wrote no {}",
        written.display()
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_ok() {
        assert!(
            Instant::now() < deadline,
            "{page}: still listening after {status}"
        );
        thread::sleep(Duration::from_millis(20));
    }

    // The second block: the written config under the prefix target/mine, in the background
    // (SIGKILLed by its pid file should an assertion fail before the page's command stops it).
    struct KillOnDrop(PathBuf);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            if let Some(pid) = fs::read_to_string(&self.0)
                .ok()
                .and_then(|p| p.trim().parse().ok())
            {
                sys::signal(pid, sys::SIGKILL);
            }
        }
    }
    let _daemon = KillOnDrop(scratch.join("target/mine/logs/nginx.pid"));
    // Its output to a file: the daemon keeps the descriptors it was started with.
    let log = fs::File::create(scratch.join("mine.log")).unwrap();
    let status = script(&blocks[1])
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .status()
        .unwrap();
    let said = fs::read_to_string(scratch.join("mine.log")).unwrap_or_default();
    assert!(
        status.success(),
        "{page}: the second block: {status}\n{said}"
    );
    assert!(said.contains("test is successful"), "{page}: {said}");
    let answer = common::get(port, "/");
    assert_eq!(
        answer.header("x-rate-limit-status"),
        Some("PASSED"),
        "{page}: {answer:?}"
    );
    let stop = "kill -QUIT $(cat target/mine/logs/nginx.pid)";
    assert!(
        repo_file(page).contains(&format!("`{stop}`")),
        "{page} says how to stop it"
    );
    let output = script(&[stop.to_string()]).output().unwrap();
    assert!(
        output.status.success(),
        "{stop}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while scratch.join("target/mine/logs/nginx.pid").exists() {
        assert!(
            Instant::now() < deadline,
            "{page}: `{stop}` did not stop nginx"
        );
        thread::sleep(Duration::from_millis(20));
    }
    let _ = fs::remove_dir_all(&scratch);
}
