//! Issue 26: a key never pays for another key's request. Two workers, zones far too small
//! for their keys (every new key evicts one), every key fresh and sent exactly three
//! requests that its limit lets through, for each algorithm and for a concurrency zone.
//! Before the slot pin, a worker that found a key's slot while the other evicted it charged
//! the new key, whose third request was then refused; in a concurrency zone the new key kept
//! a request in flight for ever.
//!
//! The requests are pipelined on keep-alive connections (a batch of keys at a time) so that
//! the workers spend their time in the store. `STORE_RACE_KEYS` sets the keys per zone
//! (three requests each; default 100,000, 300,000 requests a zone).
//!
//! The long mode (issue 37) sends each key's three requests on three different connections
//! at once, so that the two workers charge one key at the same instant, and every refusal
//! is a key decided on a state its own requests cannot have made:
//!
//! ```text
//! STORE_RACE_KEYS=3400000 STORE_RACE_CONNECTIONS=64 STORE_RACE_SPREAD=4 \
//!     STORE_RACE_ZONES=leaky,token,window,leaky_quick \
//!     cargo test --test store_race a_key_never_pays -- --nocapture
//! ```
//!
//! `STORE_RACE_CONNECTIONS` (default 4) connections in all, driven by client threads of
//! `STORE_RACE_SPREAD` connections each (default 1: a key's three requests pipelined on one
//! connection, one worker); with 4, key `n`'s requests go to the thread's connections
//! `n, n + 1, n + 2` (mod 4). `STORE_RACE_ZONES` picks the rate zones (default all).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use common::Nginx;

/// Client connections at once (spread over the two workers by `reuseport`), by default.
const CONNECTIONS: usize = 4;
/// Keys whose requests go out in one write.
const BATCH_KEYS: usize = 50;

/// Every zone 32 KiB (a few hundred slots): keys far outnumber slots. Each limit lets a fresh
/// key's three requests through, and no fourth at once (checked first).
fn start() -> Nginx {
    common::config()
        .workers(2)
        .reuseport()
        .error_log("warn")
        .http(
            "keepalive_requests 100000000;
             rate_limit_zone $arg_k zone=leaky:32k rate=1r/s burst=2;
             rate_limit_zone $arg_k zone=token:32k rate=1r/s burst=3 algorithm=token_bucket;
             rate_limit_zone $arg_k zone=log:32k rate=3r/m algorithm=sliding_log;
             rate_limit_zone $arg_k zone=window:32k rate=3r/m algorithm=sliding_window;
             rate_limit_zone $arg_k zone=leaky_quick:32k rate=1r/s burst=2;
             rate_limit_zone $arg_k zone=token_quick:32k rate=1r/s burst=3 algorithm=token_bucket;
             rate_limit_zone $arg_k zone=conc:32k algorithm=concurrency limit=1;",
        )
        .locations(
            "location = /leaky { rate_limit zone=leaky nodelay; empty_gif; }
             location = /token { rate_limit zone=token nodelay; empty_gif; }
             location = /log { rate_limit zone=log nodelay; empty_gif; }
             location = /window { rate_limit zone=window nodelay; empty_gif; }
             location = /leaky_quick {
                 rate_limit zone=leaky_quick nodelay; rate_limit_headers off; empty_gif; }
             location = /token_quick {
                 rate_limit zone=token_quick nodelay; rate_limit_headers off; empty_gif; }
             location = /conc { rate_limit zone=conc; empty_gif; }
             location /ratelimit/ { rate_limit_admin; }",
        )
        .start()
}

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

fn keys_per_zone() -> usize {
    env_number("STORE_RACE_KEYS", 100_000)
}

/// Connections each client thread drives (a key's three requests spread over them).
fn spread() -> usize {
    env_number("STORE_RACE_SPREAD", 1).max(1)
}

/// Reads pipelined responses off a connection: their status codes, in order.
struct Responses {
    stream: TcpStream,
    buffer: Vec<u8>,
    start: usize,
}

impl Responses {
    fn next_status(&mut self) -> u16 {
        loop {
            let unread = &self.buffer[self.start..];
            if let Some(end) = unread.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = std::str::from_utf8(&unread[..end]).expect("response head");
                let status: u16 = head
                    .get(9..12)
                    .and_then(|code| code.parse().ok())
                    .unwrap_or_else(|| panic!("bad status line: {head:?}"));
                let length: usize = head
                    .lines()
                    .find_map(|line| {
                        let (name, value) = line.split_once(':')?;
                        name.eq_ignore_ascii_case("content-length")
                            .then(|| value.trim().parse().ok())?
                    })
                    .unwrap_or_else(|| panic!("no Content-Length: {head:?}"));
                if unread.len() >= end + 4 + length {
                    self.start += end + 4 + length;
                    return status;
                }
            }
            if self.start > 0 {
                self.buffer.drain(..self.start);
                self.start = 0;
            }
            let mut chunk = [0u8; 65536];
            let read = self.stream.read(&mut chunk).expect("read responses");
            assert!(read > 0, "the server closed the connection");
            self.buffer.extend_from_slice(&chunk[..read]);
        }
    }
}

/// Each key of `keys` (named `{prefix}{n}`) sent three requests to `path` over `spread`
/// connections (key `n`'s `i`-th on connection `(n + i) % spread`), a batch of keys at a
/// time; returns the keys whose three requests did not all pass.
fn three_each(
    port: u16,
    path: &str,
    prefix: &str,
    keys: std::ops::Range<usize>,
    spread: usize,
) -> Vec<String> {
    let mut connections: Vec<(TcpStream, Responses)> = (0..spread)
        .map(|_| {
            let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
            stream.set_nodelay(true).expect("nodelay");
            stream
                .set_read_timeout(Some(Duration::from_secs(30)))
                .expect("timeout");
            let writer = stream.try_clone().expect("clone");
            let responses = Responses {
                stream,
                buffer: Vec::new(),
                start: 0,
            };
            (writer, responses)
        })
        .collect();
    let mut refused = Vec::new();
    let mut next = keys.start;
    while next < keys.end {
        let batch = next..(next + BATCH_KEYS).min(keys.end);
        let mut out = vec![Vec::new(); spread];
        // The keys each connection was sent a request of, in order.
        let mut sent = vec![Vec::new(); spread];
        for n in batch.clone() {
            let request = format!("GET {path}?k={prefix}{n} HTTP/1.1\r\nHost: localhost\r\n\r\n");
            for i in 0..3 {
                let connection = (n + i) % spread;
                out[connection].extend_from_slice(request.as_bytes());
                sent[connection].push(n);
            }
        }
        for ((writer, _), out) in connections.iter_mut().zip(&out) {
            writer.write_all(out).expect("send requests");
        }
        let mut passed = vec![0; batch.len()];
        for ((_, responses), sent) in connections.iter_mut().zip(&sent) {
            for &n in sent {
                if responses.next_status() == 200 {
                    passed[n - batch.start] += 1;
                }
            }
        }
        for (n, passed) in batch.clone().zip(passed) {
            if passed != 3 {
                refused.push(format!("{prefix}{n}"));
            }
        }
        next = batch.end;
    }
    refused
}

fn statuses(port: u16, path: &str, key: &str, count: usize) -> Vec<u16> {
    let mut connection = common::Connection::open(port);
    let request = common::Request::get(&format!("{path}?k={key}"));
    (0..count)
        .map(|_| connection.send(&request).status)
        .collect()
}

fn zone_json(nginx: &Nginx, zone: &str) -> serde_json::Value {
    serde_json::from_str(&common::get(nginx.port(), &format!("/ratelimit/zones/{zone}")).text())
        .expect("zone JSON")
}

/// The load on one zone: every key three requests, over `STORE_RACE_CONNECTIONS`
/// connections at once, `spread()` to a client thread. Returns the keys refused and the
/// requests sent.
fn load(nginx: &Nginx, path: &str, keys: usize) -> (Vec<String>, usize) {
    let spread = spread();
    let clients = (env_number("STORE_RACE_CONNECTIONS", CONNECTIONS) / spread).max(1);
    let per = keys.div_ceil(clients);
    let threads: Vec<_> = (0..clients)
        .map(|c| {
            let port = nginx.port();
            let path = path.to_string();
            let range = (c * per).min(keys)..((c + 1) * per).min(keys);
            thread::spawn(move || three_each(port, &path, "k", range, spread))
        })
        .collect();
    let refused = threads
        .into_iter()
        .flat_map(|t| t.join().expect("client"))
        .collect();
    (refused, 3 * keys)
}

/// The load on one rate zone; returns what went wrong (every zone is loaded before the test
/// fails, so that its message gives each zone's count).
fn check_rate_zone(nginx: &Nginx, zone: &str) -> Option<String> {
    let path = format!("/{zone}");
    // The limit is tight: a fresh key gets exactly three.
    assert_eq!(
        statuses(nginx.port(), &path, "probe", 4),
        [200, 200, 200, 429],
        "{zone}: a fresh key's three requests pass and no fourth"
    );
    let keys = keys_per_zone();
    let started = Instant::now();
    let (refused, requests) = load(nginx, &path, keys);
    let evictions = zone_json(nginx, zone)["evictions"].as_u64().unwrap_or(0);
    eprintln!(
        "{zone}: {requests} requests in {:.1} s, {} keys refused, {evictions} evictions",
        started.elapsed().as_secs_f64(),
        refused.len()
    );
    assert!(
        evictions as usize > keys / 2,
        "{zone}: the zone must evict (only {evictions} evictions for {keys} keys)"
    );
    (!refused.is_empty()).then(|| {
        format!(
            "{zone}: {} of {keys} keys were refused a request another key paid for: {:?}",
            refused.len(),
            &refused[..refused.len().min(10)]
        )
    })
}

#[test]
fn a_key_never_pays_for_another_keys_request() {
    let nginx = start();
    // `*_quick`: the same buckets with nothing to report, decided on the quick path (one
    // line, no headers: the pinned charge with the bucket's precomputed constants).
    let zones = std::env::var("STORE_RACE_ZONES")
        .unwrap_or_else(|_| "leaky,token,log,window,leaky_quick,token_quick".to_string());
    let failures: Vec<String> = zones
        .split(',')
        .filter_map(|zone| check_rate_zone(&nginx, zone))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A concurrency zone: every request holds a slot of its key while it runs, so each key's
/// three requests (one after another) pass under `limit=1`, and once the load is over
/// nothing is in flight. Before, a request that arrived at a slot being evicted counted in
/// the new key, whose release then skipped it: the new key held a slot for ever.
#[test]
fn a_concurrency_zone_leaks_no_slot() {
    let nginx = start();
    let keys = keys_per_zone();
    let started = Instant::now();
    let (refused, requests) = load(&nginx, "/conc", keys);
    let zone = zone_json(&nginx, "conc");
    eprintln!(
        "conc: {requests} requests in {:.1} s, {} keys refused, {} slots, {} refused a slot",
        started.elapsed().as_secs_f64(),
        refused.len(),
        zone["slots"],
        zone["no_slot"],
    );
    // Idle keys give their slots up without counting as evictions: the churn is the keys
    // passing through far fewer slots.
    let slots = zone["slots"].as_u64().unwrap_or(u64::MAX) as usize;
    assert!(keys > 20 * slots, "{keys} keys for {slots} slots");
    // The responses are all in, but a worker may still be finishing a request's cleanup.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let zone = zone_json(&nginx, "conc");
        if zone["in_flight"] == 0 && zone["queued"] == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "requests left in flight after the load: {zone}"
        );
        thread::sleep(Duration::from_millis(50));
    }
    assert!(
        refused.is_empty(),
        "{} of {keys} keys were refused: {:?}",
        refused.len(),
        &refused[..refused.len().min(10)]
    );
}

/// Issue 26 (and 27, 5): a key with requests in flight is never evicted. A concurrency zone of
/// 40 slots, and 100 keys each with a request the upstream holds: the keys whose window is
/// full of busy keys are refused at once (the zone's status), counted as `no_slot` and
/// logged; the zone's in-flight count is exactly what the upstream holds. Before, the 41st
/// key evicted a busy one: the zone said 40 in flight while the upstream held 100, and the
/// evicted keys were admitted again.
#[test]
fn a_busy_key_is_never_evicted() {
    let upstream = common::upstream::Upstream::start();
    let nginx = common::config()
        .workers(2)
        .reuseport()
        .error_log("warn")
        .http("rate_limit_zone $arg_k zone=conc:32k algorithm=concurrency limit=1;")
        .locations(&format!(
            "location /hold/ {{ rate_limit zone=conc; proxy_pass http://127.0.0.1:{}; }}
             location /ratelimit/ {{ rate_limit_admin; }}",
            upstream.port()
        ))
        .start();
    let keys = 100;
    let slots = zone_json(&nginx, "conc")["slots"].as_u64().unwrap_or(0);
    assert!(slots < keys, "the zone holds {slots} keys");
    let pending: Vec<_> = (0..keys)
        .map(|n| {
            common::start_request(
                nginx.port(),
                &common::Request::get(&format!("/hold/b{n}?k=b{n}")),
            )
        })
        .collect();
    // Every request decided: admitted (held upstream) or refused.
    let deadline = Instant::now() + Duration::from_secs(15);
    let zone = loop {
        let zone = zone_json(&nginx, "conc");
        let decided = zone["passed"].as_u64().unwrap_or(0) + zone["rejected"].as_u64().unwrap_or(0);
        if decided == keys && zone["in_flight"].as_u64() == Some(upstream.in_flight() as u64) {
            break zone;
        }
        assert!(
            Instant::now() < deadline,
            "{decided} of {keys} decided, upstream holds {}: {zone}",
            upstream.in_flight()
        );
        thread::sleep(Duration::from_millis(50));
    };
    let admitted = zone["in_flight"].as_u64().unwrap_or(0);
    assert!(
        admitted <= slots,
        "{admitted} in flight in {slots} slots: {zone}"
    );
    assert_eq!(
        zone["no_slot"].as_u64(),
        Some(keys - admitted),
        "every key refused found its window busy: {zone}"
    );
    assert!(
        nginx.error_log().contains(
            "every slot a new key may take holds requests in flight or queued, key refused"
        ),
        "{}",
        nginx.error_log()
    );
    upstream.release_all();
    let statuses: Vec<u16> = pending.into_iter().map(|p| p.finish().status).collect();
    assert_eq!(
        statuses.iter().filter(|&&s| s == 200).count() as u64,
        admitted,
        "{statuses:?}"
    );
    assert!(
        statuses.iter().all(|&s| s == 200 || s == 429),
        "{statuses:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while zone_json(&nginx, "conc")["in_flight"] != 0 {
        assert!(Instant::now() < deadline, "requests left in flight");
        thread::sleep(Duration::from_millis(50));
    }
    // The busy keys gave their slots back: a new key gets one.
    assert_eq!(common::get(nginx.port(), "/hold/free?k=after").status, 200);
}
