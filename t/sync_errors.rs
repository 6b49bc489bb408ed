//! What `rate_limit_sync` logs when it cannot reach Redis says why: a refused connection, a
//! host name that does not resolve, no answer at all; and a wrong password is logged as an
//! authentication failure without a time-out before it, even when the first connection takes
//! longer than a round.
//!
//! A first TLS handshake that merely outlasts a round is not reported as a port that does not
//! speak TLS.
//!
//! Needs `redis-server` (the password and TLS tests' own servers, on free ports).

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::nginx::free_port;
use common::redis::{Pki, Redis};
use common::Nginx;

fn config(url: &str) -> String {
    format!(
        r#"
load_module %%MODULE%%;
worker_processes 2;
error_log logs/error.log notice;
events {{ worker_connections 64; }}
http {{
    access_log off;
    rate_limit_sync {url} interval=100ms timeout=50ms;
    rate_limit_zone $http_x_key zone=api:1m rate=10r/s sync;
    server {{
        listen 127.0.0.1:%%PORT%%;
        location / {{ rate_limit zone=api; }}
    }}
}}
"#
    )
}

/// Waits (up to 10 s) until the error log has a `rate_limit_sync` line with `expected`;
/// returns every `rate_limit_sync "..."` error line logged by then.
fn sync_errors_until(nginx: &Nginx, expected: &str) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let lines: Vec<String> = nginx
            .error_log()
            .lines()
            .filter(|line| line.contains("[error]") && line.contains("rate_limit_sync \""))
            .map(str::to_string)
            .collect();
        if lines.iter().any(|line| line.contains(expected)) {
            return lines;
        }
        assert!(
            Instant::now() < deadline,
            "no {expected:?} within 10 s; error.log:\n{}",
            nginx.error_log()
        );
        thread::sleep(Duration::from_millis(50));
    }
}

/// A listener that accepts connections and never answers (a firewall that lets the handshake
/// through, a wrong service that waits); dropped with the test.
struct Silent {
    port: u16,
    stop: Arc<AtomicBool>,
}

impl Silent {
    fn start() -> Silent {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        thread::spawn(move || {
            let mut held = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                if let Ok((stream, _)) = listener.accept() {
                    held.push(stream);
                }
                thread::sleep(Duration::from_millis(10));
            }
        });
        Silent { port, stop }
    }
}

impl Drop for Silent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[test]
fn cannot_connect_says_why() {
    let silent = Silent::start();
    let cases = [
        (
            format!("redis://127.0.0.1:{}", free_port()),
            "cannot connect: connection refused (does Redis listen on that address and port?)",
        ),
        (
            "redis://no-such-host.invalid:6379".to_string(),
            "cannot connect: the host name does not resolve (DNS)",
        ),
        (
            format!("redis://127.0.0.1:{}", silent.port),
            "cannot connect: no answer within timeout= (packets dropped by a firewall, or a \
             wrong address?)",
        ),
    ];
    for (url, expected) in cases {
        let nginx = Nginx::start(&config(&url));
        let lines = sync_errors_until(&nginx, expected);
        assert_eq!(lines.len(), 1, "{url}: one error, said once: {lines:#?}");
        assert!(
            lines[0].contains(&format!("rate_limit_sync \"{url}\": {expected}")),
            "{lines:#?}"
        );
    }
}

/// Forwards connections to `target`, holding back the server's first answer on the first
/// connection for `delay` (a first connection slower than a round); the others go straight.
fn slow_first_connection(target: u16, delay: Duration) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().unwrap().port();
    let connections = Arc::new(AtomicUsize::new(0));
    thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let first = connections.fetch_add(1, Ordering::Relaxed) == 0;
            let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                continue;
            };
            let (mut client_in, mut server_out) =
                (client.try_clone().unwrap(), server.try_clone().unwrap());
            thread::spawn(move || pipe(&mut client_in, &mut server_out, Duration::ZERO));
            let (mut server_in, mut client_out) = (server, client);
            let wait = if first { delay } else { Duration::ZERO };
            thread::spawn(move || pipe(&mut server_in, &mut client_out, wait));
        }
    });
    port
}

fn pipe(from: &mut TcpStream, to: &mut TcpStream, first_delay: Duration) {
    let mut buffer = [0u8; 4096];
    let mut delay = first_delay;
    loop {
        match from.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                thread::sleep(delay);
                delay = Duration::ZERO;
                if to.write_all(&buffer[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

#[test]
fn a_wrong_password_is_an_authentication_failure_without_a_time_out_before_it() {
    let redis = Redis::start_with(&["--requirepass", "secret"]);
    // The first connection's AUTH answer comes 300 ms late: the round (timeout=50ms) ends
    // while it is still connecting. The next round's connection is answered at once.
    let port = slow_first_connection(redis.port, Duration::from_millis(300));
    let url = format!("redis://:wrong@127.0.0.1:{port}");
    let nginx = Nginx::start(&config(&url));
    let lines = sync_errors_until(&nginx, "authentication failed");
    assert_eq!(
        lines.len(),
        1,
        "only the authentication failure is logged: {lines:#?}"
    );
    assert!(
        lines[0].contains(&format!(
            "rate_limit_sync \"redis://:***@127.0.0.1:{port}\": authentication failed"
        )),
        "{lines:#?}"
    );
}

#[test]
fn a_slow_first_tls_handshake_is_not_a_wrong_port() {
    let pki = Pki::new();
    let redis = Redis::start_tls(&pki, &[]);
    // The first connection's ServerHello comes 1 s late: the round (timeout=200ms, wide
    // enough for a handshake and the scripts' loading on a loaded machine) ends during the
    // handshake. The next round's handshake is answered at once.
    let port = slow_first_connection(redis.port, Duration::from_secs(1));
    let url = format!("rediss://127.0.0.1:{port} tls_ca={}", pki.file("ca.pem"));
    let nginx = Nginx::start(&config(&url).replace(
        "interval=100ms timeout=50ms",
        "interval=200ms timeout=200ms",
    ));
    redis.wait_instances(1);
    // Five more rounds for a late line to show: each round's heartbeat is one ZADD.
    let heartbeats = redis.calls("zadd");
    let deadline = Instant::now() + Duration::from_secs(10);
    while redis.calls("zadd") < heartbeats + 5 {
        assert!(
            Instant::now() < deadline,
            "five more rounds did not come within 10 s"
        );
        thread::sleep(Duration::from_millis(20));
    }
    let log = nginx.error_log();
    assert!(
        !log.contains("rate_limit_sync \""),
        "a first handshake slower than a round is not an error: {log}"
    );
}
