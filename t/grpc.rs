//! gRPC refusals in gRPC's terms, with a real gRPC server and client (grpcio, Debian's
//! `python3-grpcio`; `t/grpc/grpc_peer.py`) through nginx's `grpc_pass` over HTTP/2: a
//! refused call gets a trailers-only RESOURCE_EXHAUSTED with a `grpc-message` naming the zone
//! and a `grpc-retry-pushback-ms` that the client's retry policy waits for; with
//! `rate_limit_grpc off` it gets the location's 429, which gRPC reads as UNAVAILABLE.

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{config, Nginx};
use serde_json::Value;

/// Debian's Python, which sees `python3-grpcio` (another `python3` on the PATH may not).
const PYTHON: &str = "/usr/bin/python3";

fn peer_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("t/grpc/grpc_peer.py")
}

/// Why grpcio cannot be used here, if it cannot.
fn grpcio_unavailable() -> Option<String> {
    match Command::new(PYTHON).args(["-c", "import grpc"]).output() {
        Err(e) => Some(format!(
            "cannot run {PYTHON} ({e}): apt-get install python3"
        )),
        Ok(output) if !output.status.success() => Some(format!(
            "t/grpc.rs needs grpcio for {PYTHON}: apt-get install python3-grpcio \
             (scripts/test.sh installs it; {})",
            String::from_utf8_lossy(&output.stderr).trim()
        )),
        Ok(_) => None,
    }
}

/// The gRPC server, killed when dropped.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    /// `None` when grpcio is missing and the runner declared `grpc` skipped (it fails
    /// otherwise, naming the package).
    fn start() -> Option<Server> {
        if common::skip::unless_declared("grpc", grpcio_unavailable()).is_some() {
            return None;
        }
        let mut child = Command::new(PYTHON)
            .arg(peer_script())
            .arg("server")
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the gRPC server");
        let stdout = child.stdout.take().expect("the server's stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("the server's port line");
        let port = line
            .trim()
            .strip_prefix("PORT ")
            .and_then(|port| port.parse().ok())
            .unwrap_or_else(|| panic!("the gRPC server did not start: {line:?}"));
        Some(Server { child, port })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Run scenario `mode` of the client against nginx's `port`; its JSON outcome.
fn client(mode: &str, port: u16, key: &str) -> Value {
    let output = Command::new(PYTHON)
        .arg(peer_script())
        .args([mode, &port.to_string(), key])
        .output()
        .expect("run the gRPC client");
    assert!(
        output.status.success(),
        "the gRPC client ({mode}) failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "the gRPC client's output is not JSON ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

/// nginx in front of the gRPC server: HTTP/2 servers on `%%PORT2%%` (zone `grpc`, 1r/m burst
/// 2), `%%PORT3%%` (zone `minute`, 1r/m), `%%PORT4%%` (zone `paced`, 30r/m) and `%%PORT5%%`
/// (zone `grpc` with `rate_limit_grpc off`), `%%PORT6%%` (zone `guarded`, 1r/m burst 2,
/// `block=1h`) and `%%PORT7%%` (zone `crowd`, concurrency `limit=1`), keyed by the calls' `x-key` metadata and
/// logging `KEY STATUS $rate_limit_status` to logs/grpc.log.
fn start(server: &Server) -> Nginx {
    let upstream = server.port;
    let servers: String = [
        (2, "grpc", ""),
        (3, "minute", ""),
        (4, "paced", ""),
        (5, "grpc", "rate_limit_grpc off;"),
        (6, "guarded", ""),
        (7, "crowd", ""),
    ]
    .iter()
    .map(|(port, zone, extra)| {
        let nodelay = if *zone == "crowd" { "" } else { "nodelay" };
        format!(
            "server {{ listen 127.0.0.1:%%PORT{port}%% http2; access_log logs/grpc.log grpc;\n\
             {extra} location / {{ rate_limit zone={zone} {nodelay};\n\
             grpc_pass grpc://127.0.0.1:{upstream}; }} }}\n"
        )
    })
    .collect();
    config()
        .http(
            "log_format grpc '$http_x_key $status $rate_limit_status';\n\
             rate_limit_zone $http_x_key zone=grpc:1m rate=1r/m burst=2;\n\
             rate_limit_zone $http_x_key zone=minute:1m rate=1r/m;\n\
             rate_limit_zone $http_x_key zone=paced:1m rate=30r/m;\n\
             rate_limit_zone $http_x_key zone=guarded:1m rate=1r/m burst=2 block=1h;\n\
             rate_limit_zone $http_x_key zone=crowd:1m algorithm=concurrency limit=1;",
        )
        .http(&servers)
        .start()
}

fn codes(calls: &Value) -> Vec<&str> {
    calls
        .as_array()
        .unwrap_or_else(|| panic!("not a list of calls: {calls}"))
        .iter()
        .map(|call| call["code"].as_str().unwrap_or("?"))
        .collect()
}

/// The lines of logs/grpc.log for `key`, once nginx has written `count` of them.
fn logged(nginx: &Nginx, key: &str, count: usize) -> Vec<String> {
    let path = nginx.prefix().join("logs/grpc.log");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let lines: Vec<String> = text
            .lines()
            .filter(|line| line.split(' ').next() == Some(key))
            .map(str::to_string)
            .collect();
        if lines.len() >= count || Instant::now() > deadline {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// rate=1r/m burst=2 nodelay: five unary calls are OK three times, then RESOURCE_EXHAUSTED
/// twice, trailers-only (HTTP 200) with the zone in the message and a pushback of about a
/// minute; server-streaming calls are refused the same way.
#[test]
fn refused_calls_get_resource_exhausted_with_a_pushback() {
    let Some(server) = Server::start() else {
        return;
    };
    let nginx = start(&server);
    let outcome = client("calls", nginx.port_n(2), "a");
    let unary = &outcome["unary"];
    assert_eq!(
        codes(unary),
        ["OK", "OK", "OK", "RESOURCE_EXHAUSTED", "RESOURCE_EXHAUSTED"],
        "{unary}"
    );
    for refused in &unary.as_array().expect("calls")[3..] {
        assert_eq!(
            refused["details"], "rate limited by zone \"grpc\"",
            "{refused}"
        );
        let pushback: u64 = refused["trailers"]["grpc-retry-pushback-ms"]
            .as_str()
            .and_then(|ms| ms.parse().ok())
            .unwrap_or_else(|| panic!("no numeric pushback: {refused}"));
        // The key's next request is 60 s after its first, a few milliseconds ago.
        assert!((50_000..=60_000).contains(&pushback), "{refused}");
    }
    // nginx answered the refusals itself, HTTP 200 (trailers-only), REJECTED.
    let lines = logged(&nginx, "a-unary", 5);
    let refused: Vec<&String> = lines.iter().filter(|l| l.ends_with("REJECTED")).collect();
    assert_eq!(refused.len(), 2, "{lines:?}");
    assert!(refused.iter().all(|l| l.contains(" 200 ")), "{lines:?}");

    let stream = &outcome["stream"];
    assert_eq!(
        codes(stream),
        ["OK", "OK", "OK", "RESOURCE_EXHAUSTED"],
        "{stream}"
    );
    let messages: Vec<u64> = stream
        .as_array()
        .expect("calls")
        .iter()
        .map(|call| call["messages"].as_u64().unwrap_or(99))
        .collect();
    assert_eq!(messages, [3, 3, 3, 0], "{stream}");
    assert_eq!(
        stream[3]["details"], "rate limited by zone \"grpc\"",
        "{stream}"
    );
    assert!(
        stream[3]["trailers"]["grpc-retry-pushback-ms"].is_string(),
        "{stream}"
    );
    let errors = nginx.error_log();
    assert!(
        !errors.contains("[alert]") && !errors.contains("[crit]"),
        "{errors}"
    );
    assert!(
        errors.contains("limiting requests, excess: ") && errors.contains("by zone \"grpc\""),
        "{errors}"
    );
}

/// A client whose retry policy retries RESOURCE_EXHAUSTED within 50 ms by its own backoff
/// waits for the pushback instead: refused with a pushback of about 2 s (30r/m), its retry
/// comes 2 s later and passes; refused with a minute's pushback and a 3 s deadline, it is
/// never retried.
#[test]
fn the_retry_policy_waits_for_the_pushback() {
    let Some(server) = Server::start() else {
        return;
    };
    let nginx = start(&server);

    let paced = client("paced", nginx.port_n(4), "b");
    assert_eq!(codes(&paced), ["OK", "OK"], "{paced}");
    let waited = paced[1]["elapsed_ms"].as_u64().expect("elapsed_ms");
    // The pushback is the 2 s to the key's next request less the first call's time.
    assert!(
        (1_500..=5_000).contains(&waited),
        "retried after {waited} ms: {paced}"
    );
    // nginx saw the second call refused, then its retry ~2 s later, which passed. A retry
    // that lands within a millisecond of the key's next slot may find it not open yet: it is
    // refused with a pushback of that millisecond, and the next retry passes. Had the client
    // used its own backoff (at most 50 ms), all five attempts would have been refused within
    // 150 ms and the call would have failed.
    let lines = logged(&nginx, "b-paced", 3);
    let rejected = lines
        .iter()
        .filter(|l| *l == "b-paced 200 REJECTED")
        .count();
    assert!(
        lines.first().map(String::as_str) == Some("b-paced 200 PASSED")
            && lines.last().map(String::as_str) == Some("b-paced 200 PASSED")
            && (1..=2).contains(&rejected)
            && lines.len() == rejected + 2,
        "{lines:?}"
    );

    let long = client("long", nginx.port_n(3), "c");
    assert_eq!(codes(&long), ["OK", "DEADLINE_EXCEEDED"], "{long}");
    // Only the refusal reached nginx: no retry within the deadline.
    std::thread::sleep(Duration::from_millis(200));
    let lines = logged(&nginx, "c-long", 2);
    assert_eq!(
        lines,
        ["c-long 200 PASSED", "c-long 200 REJECTED"],
        "{lines:?}"
    );
}

/// `rate_limit_grpc off`: a refused call gets the location's 429, which gRPC maps to
/// UNAVAILABLE.
#[test]
fn rate_limit_grpc_off_keeps_the_http_status() {
    let Some(server) = Server::start() else {
        return;
    };
    let nginx = start(&server);
    let plain = client("plain", nginx.port_n(5), "d");
    assert_eq!(
        codes(&plain),
        ["OK", "OK", "OK", "UNAVAILABLE", "UNAVAILABLE"],
        "{plain}"
    );
    let lines = logged(&nginx, "d-plain", 5);
    assert_eq!(
        lines.last().map(String::as_str),
        Some("d-plain 429 REJECTED")
    );
}

/// A blocked key and a concurrency refusal are answered alike: RESOURCE_EXHAUSTED, the reason
/// and zone in the message, the block's time left (about an hour) or a second as the
/// pushback.
#[test]
fn blocked_keys_and_concurrency_refusals_get_resource_exhausted() {
    let Some(server) = Server::start() else {
        return;
    };
    let nginx = start(&server);
    let plain = client("plain", nginx.port_n(6), "e");
    assert_eq!(
        codes(&plain),
        ["OK", "OK", "OK", "RESOURCE_EXHAUSTED", "RESOURCE_EXHAUSTED"],
        "{plain}"
    );
    // The rejection started a block of an hour: the next call is refused by it.
    assert_eq!(
        plain[3]["details"], "rate limited by zone \"guarded\"",
        "{plain}"
    );
    assert_eq!(
        plain[4]["details"], "key blocked by zone \"guarded\"",
        "{plain}"
    );
    let pushback: u64 = plain[4]["trailers"]["grpc-retry-pushback-ms"]
        .as_str()
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_else(|| panic!("no numeric pushback: {plain}"));
    assert!((3_500_000..=3_600_000).contains(&pushback), "{plain}");
    let lines = logged(&nginx, "e-plain", 5);
    assert_eq!(
        lines.last().map(String::as_str),
        Some("e-plain 200 BLOCKED")
    );

    let crowd = client("crowd", nginx.port_n(7), "f");
    let mut got = codes(&crowd);
    got.sort();
    assert_eq!(got, ["OK", "RESOURCE_EXHAUSTED"], "{crowd}");
    let refused = crowd
        .as_array()
        .and_then(|calls| {
            calls
                .iter()
                .find(|call| call["code"] == "RESOURCE_EXHAUSTED")
        })
        .expect("a refused call");
    assert_eq!(
        refused["details"], "too many in flight by zone \"crowd\"",
        "{crowd}"
    );
    assert!(
        refused["elapsed_ms"].as_u64().is_some_and(|ms| ms < 1_500),
        "refused at once: {crowd}"
    );
    assert_eq!(
        refused["trailers"]["grpc-retry-pushback-ms"], "1000",
        "{crowd}"
    );
}
