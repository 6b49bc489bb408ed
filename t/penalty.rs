//! The penalty box (`block=`, `block_max=`) and `on_status=` against a real nginx: the
//! targets of issue 22 (credential stuffing stopped after six attempts, successful logins
//! never limited, a block's `Retry-After` counting down, escalation), every algorithm,
//! dry run, blocks kept across workers, reloads and a worker's crash, the concurrent bound of
//! `on_status=`, the log line once per block, and the admin API on the real zones.
//!
//! The upstream is a second server of the same nginx that logs every request it answers to
//! its own access log: what reaches it is counted there, not inferred from the front's
//! answers.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use common::{config, send, Config, Connection, Nginx, Request, Response};
use serde_json::Value;

/// A front with `zone` (the rest of a `rate_limit_zone` line keyed by `$http_x_key`) limiting
/// `/login` with `limit` (the words after `zone=login`), proxied to an upstream answering
/// `upstream_status` and logging each request it answers to `logs/upstream.log`.
fn login(zone: &str, limit: &str, upstream_status: u16) -> Config {
    config()
        .http(&format!(
            "rate_limit_zone $http_x_key zone=login:1m {zone};\n\
             server {{ listen 127.0.0.1:%%PORT2%%; access_log logs/upstream.log;\n\
               location / {{ return {upstream_status} \"upstream\\n\"; }} }}"
        ))
        .locations(&format!(
            "location = /login {{ rate_limit zone=login {limit};\n\
               add_header X-RL $rate_limit_status always;\n\
               add_header X-Pid $pid always;\n\
               proxy_pass http://127.0.0.1:%%PORT2%%; }}\n\
             location /ratelimit/ {{ rate_limit_admin write=on; }}"
        ))
}

/// Requests the upstream answered.
fn upstream_count(nginx: &Nginx) -> usize {
    std::fs::read_to_string(nginx.prefix().join("logs/upstream.log"))
        .map_or(0, |log| log.lines().count())
}

fn attempt(nginx: &Nginx, key: &str) -> Response {
    send(nginx.port(), &Request::get("/login").header("X-Key", key))
}

fn retry_after(response: &Response) -> Option<u64> {
    response.header("Retry-After").map(|value| {
        value
            .parse()
            .unwrap_or_else(|_| panic!("bad Retry-After {value:?}"))
    })
}

fn get_json(nginx: &Nginx, path: &str) -> (u16, Value) {
    let response = send(nginx.port(), &Request::get(path));
    let body = serde_json::from_slice(&response.body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", response.text()));
    (response.status, body)
}

/// `limit` requests of `key` on keep-alive connections, one every `every`, each sent at its
/// planned time (a late one goes at once): the statuses and `$rate_limit_status` values.
fn paced(nginx: &Nginx, key: &str, count: usize, every: Duration) -> Vec<(u16, String)> {
    let start = Instant::now();
    let mut connection = Connection::open(nginx.port());
    let request = Request::get("/login").header("X-Key", key);
    let mut answers = Vec::with_capacity(count);
    for index in 0..count {
        let due = start + every * index as u32;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            thread::sleep(wait);
        }
        let response = match connection.try_send(&request) {
            Ok(response) => response,
            Err(_) => {
                connection = Connection::open(nginx.port());
                connection.send(&request)
            }
        };
        let status = response.header("X-RL").unwrap_or("").to_string();
        answers.push((response.status, status));
    }
    answers
}

/// Target: 1,000 login attempts at 10 r/s from one address, every one answered 401 by the
/// upstream, `rate=5r/m burst=5 block=15m`: at most 6 reach the upstream. Without the block,
/// the bucket would let one more through every 12 s (14 in the 100 s).
#[test]
fn credential_stuffing_reaches_the_upstream_six_times() {
    let nginx = login(
        "rate=5r/m burst=5 block=15m",
        "nodelay on_status=401,403",
        401,
    )
    .start();
    let answers = paced(&nginx, "203.0.113.7", 1000, Duration::from_millis(100));
    let reached = upstream_count(&nginx);
    assert_eq!(reached, 6, "requests that reached the upstream");
    let served: Vec<_> = answers
        .iter()
        .filter(|(status, _)| *status == 401)
        .collect();
    assert_eq!(served.len(), 6);
    // The 7th was rejected by the limit (and blocked the key); every later one was refused
    // as blocked, charging nothing.
    assert_eq!(answers[6], (429, "REJECTED".to_string()));
    assert!(answers[7..]
        .iter()
        .all(|answer| *answer == (429, "BLOCKED".to_string())));
    // The block was logged once, not per request.
    let log = nginx.error_log();
    assert_eq!(
        log.matches("blocking the key for 15m, level 0").count(),
        1,
        "{log}"
    );
    let (_, zone) = get_json(&nginx, "/ratelimit/zones/login/blocked");
    assert_eq!(zone["count"], 1, "{zone}");
    assert_eq!(zone["blocked_requests"], 993, "{zone}");
    assert_eq!(zone["keys"][0]["key"], "203.0.113.7");
}

/// Target: a user who logs in successfully 100 times in a minute (200s) is never limited by
/// a zone counting only failures. Without `on_status=` the 7th login would be refused.
#[test]
fn successful_logins_are_never_limited() {
    let nginx = login(
        "rate=5r/m burst=5 block=15m",
        "nodelay on_status=401,403",
        200,
    )
    .start();
    let answers = paced(&nginx, "alice", 100, Duration::from_millis(20));
    assert!(
        answers
            .iter()
            .all(|(status, rl)| *status == 200 && rl == "PASSED"),
        "{answers:?}"
    );
    assert_eq!(upstream_count(&nginx), 100);
    // Every charge was given back: the key is as fresh as a new one.
    let (status, _) = get_json(&nginx, "/ratelimit/zones/login/keys/alice");
    assert_eq!(status, 404, "alice is not tracked");

    // The same zone without on_status= charges every login: the 7th is refused.
    let nginx = login("rate=5r/m burst=5 block=15m", "nodelay", 200).start();
    let answers = paced(&nginx, "alice", 10, Duration::from_millis(20));
    assert_eq!(answers[6].0, 429, "{answers:?}");
}

/// Failures count and successes do not, on one key: 200s between the 401s change nothing.
#[test]
fn only_matching_statuses_are_charged() {
    let nginx = config()
        .http(
            "rate_limit_zone $http_x_key zone=login:1m rate=5r/m burst=2 block=1h;\n\
             server { listen 127.0.0.1:%%PORT2%%; access_log logs/upstream.log;\n\
               location / { if ($http_x_fail) { return 401; } return 200; } }",
        )
        .locations(
            "location = /login { rate_limit zone=login nodelay on_status=4xx;\n\
               proxy_pass http://127.0.0.1:%%PORT2%%; }",
        )
        .start();
    let send_one = |fail: bool| {
        let request = Request::get("/login").header("X-Key", "bob");
        let request = if fail {
            request.header("X-Fail", "1")
        } else {
            request
        };
        send(nginx.port(), &request).status
    };
    let mut statuses = Vec::new();
    for fail in [true, false, false, true, false, false, false, true] {
        statuses.push(send_one(fail));
    }
    // Three failures (1 + burst 2) and five successes between them: all served.
    assert_eq!(statuses, [401, 200, 200, 401, 200, 200, 200, 401]);
    // The failures used the key's whole allowance: the next request is refused at the door,
    // whatever its status would have been, and the key is blocked.
    assert_eq!(send_one(false), 429);
    assert_eq!(send_one(false), 429);
    assert_eq!(upstream_count(&nginx), 8);
}

/// A server that holds every request until released, then answers 200: to keep requests in
/// flight.
struct HoldingUpstream {
    port: u16,
    arrived: Arc<AtomicUsize>,
    release: Arc<Barrier>,
}

impl HoldingUpstream {
    /// Holds until `held` requests arrived and the test meets the barrier.
    fn start(held: usize) -> HoldingUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let arrived = Arc::new(AtomicUsize::new(0));
        let release = Arc::new(Barrier::new(held + 1));
        let (counter, barrier) = (arrived.clone(), release.clone());
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let (counter, barrier) = (counter.clone(), barrier.clone());
                thread::spawn(move || {
                    let mut buffer = [0u8; 4096];
                    let mut request = Vec::new();
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut buffer) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buffer[..n]),
                        }
                    }
                    if counter.fetch_add(1, Ordering::SeqCst) < held {
                        barrier.wait();
                    }
                    let _ = stream.write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n",
                    );
                });
            }
        });
        HoldingUpstream {
            port,
            arrived,
            release,
        }
    }
}

const HELD: usize = 6;

/// `on_status=` charges at the door: requests in flight at once are bounded by the limit
/// itself (1 + burst), whatever their statuses turn out to be; once they answered 200, their
/// charges are given back and the key passes again.
#[test]
fn concurrent_requests_are_bounded_by_the_limit() {
    let upstream = HoldingUpstream::start(HELD);
    let nginx = config()
        .http("rate_limit_zone $http_x_key zone=login:1m rate=5r/m burst=5;")
        .locations(&format!(
            "location = /login {{ rate_limit zone=login nodelay on_status=401;\n\
               proxy_read_timeout 30s;\n\
               proxy_pass http://127.0.0.1:{}; }}",
            upstream.port
        ))
        .start();
    let port = nginx.port();
    let pending: Vec<_> = (0..HELD)
        .map(|_| common::start_request(port, &Request::get("/login").header("X-Key", "eve")))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while upstream.arrived.load(Ordering::SeqCst) < HELD {
        assert!(
            Instant::now() < deadline,
            "the held requests did not arrive"
        );
        thread::sleep(Duration::from_millis(10));
    }
    // Six in flight: a seventh and more are refused at the door, and reach nobody.
    let extra: Vec<u16> = (0..20)
        .map(|_| send(port, &Request::get("/login").header("X-Key", "eve")).status)
        .collect();
    assert!(extra.iter().all(|&status| status == 429), "{extra:?}");
    assert_eq!(upstream.arrived.load(Ordering::SeqCst), HELD);
    upstream.release.wait();
    let held: Vec<u16> = pending.into_iter().map(|p| p.finish().status).collect();
    assert!(held.iter().all(|&status| status == 200), "{held:?}");
    // Given back after their 200s: the key passes again at once.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let status = send(port, &Request::get("/login").header("X-Key", "eve")).status;
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "still refused after the 200s");
        thread::sleep(Duration::from_millis(50));
    }
}

/// Target: a blocked key's `Retry-After` counts down to its release, and the key passes right
/// after.
#[test]
fn retry_after_counts_down_and_the_key_passes_right_after() {
    let nginx = login("rate=1r/s block=4s", "nodelay", 200).start();
    assert_eq!(attempt(&nginx, "k").status, 200);
    let rejecting = Instant::now();
    let rejected = attempt(&nginx, "k");
    let blocked_at = Instant::now();
    assert_eq!(rejected.status, 429);
    assert_eq!(retry_after(&rejected), Some(4));
    let release = blocked_at + Duration::from_secs(4);
    // Each second: the time left, rounded up, asked half a second from either edge. The
    // block began while the rejected request was under way and the answer was decided while
    // this one was: what Retry-After may say follows from those instants (20 ms more either
    // way for the clocks' granularity), so an answer delayed on a busy machine is judged
    // by when it happened; on time, that is exactly 4, 3, 2, 1.
    let slack = Duration::from_millis(20);
    let whole_seconds = |left: Duration| left.as_millis().div_ceil(1000) as u64;
    let mut seen = Vec::new();
    for second in 0..4u64 {
        let at = blocked_at + Duration::from_millis(1000 * second + 500);
        thread::sleep(at.saturating_duration_since(Instant::now()));
        let asked = Instant::now();
        let response = attempt(&nginx, "k");
        let answered = Instant::now();
        assert_eq!(response.status, 429, "at {second}.5 s");
        assert_eq!(response.header("X-RL"), Some("BLOCKED"));
        let left = retry_after(&response).unwrap();
        let least = whole_seconds(
            (rejecting + Duration::from_secs(4)).saturating_duration_since(answered + slack),
        );
        let most = whole_seconds((release + slack).saturating_duration_since(asked));
        assert!(
            (least..=most).contains(&left),
            "Retry-After {left} at {:?}-{:?} into the block, not {least}-{most}",
            asked - blocked_at,
            answered - blocked_at
        );
        seen.push(left);
    }
    eprintln!("Retry-After at 0.5, 1.5, 2.5 and 3.5 s: {seen:?}");
    thread::sleep((release + Duration::from_millis(300)).saturating_duration_since(Instant::now()));
    let passed = attempt(&nginx, "k");
    assert_eq!(
        (passed.status, passed.header("X-RL")),
        (200, Some("PASSED"))
    );
}

/// Target: the second block is twice the first, capped at `block_max`; each block is logged
/// once with its level and length.
#[test]
fn blocks_escalate_and_are_capped_at_block_max() {
    let nginx = login("rate=1r/s block=2s block_max=5s", "nodelay", 200).start();
    let mut lengths = Vec::new();
    for level in 0..3 {
        // The bucket is drained (the block outlasted it): one passes, the next is rejected.
        let first = attempt(&nginx, "k");
        assert_eq!(first.status, 200, "level {level}");
        let rejected = attempt(&nginx, "k");
        assert_eq!(rejected.status, 429);
        let length = retry_after(&rejected).unwrap();
        lengths.push(length);
        let (_, block) = get_json(&nginx, "/ratelimit/zones/login/blocked/k");
        assert_eq!(block["level"], level, "{block}");
        // Wait for the release (polling), then come back at once: within block_max.
        let deadline = Instant::now() + Duration::from_secs(length + 3);
        while attempt(&nginx, "k").status == 429 {
            assert!(Instant::now() < deadline, "not released after {length} s");
            thread::sleep(Duration::from_millis(100));
        }
        // That request passed and charged the bucket: the next round's first request waits
        // until the admin API says the key would pass (its bucket drained, 1 s at 1r/s).
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let (status, key) = get_json(&nginx, "/ratelimit/zones/login/keys/k");
            if status == 404 || (key["would_pass"] == true && key["retry_after_ms"] == 0) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the key's bucket did not drain: {key}"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }
    assert_eq!(lengths, [2, 4, 5]);
    let log = nginx.error_log();
    for line in [
        "blocking the key for 2s, level 0 (block_max 5s)",
        "blocking the key for 4s, level 1 (block_max 5s)",
        "blocking the key for 5s, level 2 (block_max 5s)",
    ] {
        assert_eq!(log.matches(line).count(), 1, "{line}\n{log}");
    }
}

/// Every algorithm blocks after a rejection, refuses a blocked key at once and charges it
/// nothing: once the block ends, the key's own limit has drained as if no request had come.
#[test]
fn every_algorithm_blocks_and_charges_nothing_while_blocked() {
    for algorithm in [
        "leaky_bucket",
        "token_bucket",
        "sliding_window",
        "sliding_log",
    ] {
        // Two requests pass, the third is rejected.
        let burst = match algorithm {
            "leaky_bucket" => "burst=1",
            "token_bucket" => "burst=2",
            _ => "",
        };
        let nginx = login(
            &format!("rate=2r/s {burst} algorithm={algorithm} block=3s"),
            "nodelay",
            200,
        )
        .start();
        let mut statuses = Vec::new();
        for _ in 0..3 {
            statuses.push(attempt(&nginx, "k").status);
        }
        assert_eq!(statuses[..2], [200, 200], "{algorithm}");
        assert_eq!(statuses[2], 429, "{algorithm}");
        // Blocked: 30 more requests over 1.5 s (half the block: far from its end on a busy
        // machine too), all refused as blocked.
        let blocked = paced(&nginx, "k", 30, Duration::from_millis(50));
        assert!(
            blocked.iter().all(|(s, rl)| *s == 429 && rl == "BLOCKED"),
            "{algorithm}: {blocked:?}"
        );
        let (_, zone) = get_json(&nginx, "/ratelimit/zones/login/blocked");
        assert_eq!(zone["blocked_requests"], 30, "{algorithm}: {zone}");
        // After the block: the limit has drained as if those 30 never came.
        let deadline = Instant::now() + Duration::from_secs(3);
        while attempt(&nginx, "k").status == 429 {
            assert!(Instant::now() < deadline, "{algorithm}: not released");
            thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(attempt(&nginx, "k").status, 200, "{algorithm}");
    }
}

/// A dry run blocks keys as it would (`BLOCKED_DRY_RUN`) and refuses nothing.
#[test]
fn dry_run_marks_blocked_keys_and_refuses_nothing() {
    let nginx = config()
        .http(
            "rate_limit_zone $http_x_key zone=login:1m rate=1r/m block=1h;\n\
             server { listen 127.0.0.1:%%PORT2%%; access_log logs/upstream.log;\n\
               location / { return 401; } }",
        )
        .locations(
            "location = /login { rate_limit zone=login nodelay on_status=401;\n\
               rate_limit_dry_run on; add_header X-RL $rate_limit_status always;\n\
               proxy_pass http://127.0.0.1:%%PORT2%%; }\n\
             location /ratelimit/ { rate_limit_admin; }",
        )
        .start();
    let answers = paced(&nginx, "k", 5, Duration::from_millis(10));
    let statuses: Vec<&str> = answers.iter().map(|(_, rl)| rl.as_str()).collect();
    assert_eq!(
        statuses,
        [
            "PASSED",
            "REJECTED_DRY_RUN",
            "BLOCKED_DRY_RUN",
            "BLOCKED_DRY_RUN",
            "BLOCKED_DRY_RUN"
        ]
    );
    assert!(answers.iter().all(|(status, _)| *status == 401));
    assert_eq!(upstream_count(&nginx), 5);
    assert!(nginx
        .error_log()
        .contains("blocking the key, dry run for 1h, level 0"));
    let metrics = send(nginx.port(), &Request::get("/ratelimit/metrics")).text();
    assert!(
        metrics.contains("rate_limit_requests_total{zone=\"login\",outcome=\"blocked_dry_run\"} 3"),
        "{metrics}"
    );
}

/// Blocks live in the zone's shared memory: both workers enforce them, and a reload and a
/// worker's crash keep them.
#[test]
fn blocks_survive_reloads_and_worker_crashes_across_workers() {
    let mut nginx = login("rate=1r/m block=1h", "nodelay", 200)
        .workers(2)
        .reuseport()
        .start();
    assert_eq!(attempt(&nginx, "k").status, 200);
    assert_eq!(attempt(&nginx, "k").status, 429);
    let blocked_on = |nginx: &Nginx| {
        let mut pids = std::collections::BTreeSet::new();
        for _ in 0..40 {
            let response = send(nginx.port(), &Request::get("/login").header("X-Key", "k"));
            assert_eq!(response.header("X-RL"), Some("BLOCKED"));
            pids.insert(response.worker_pid());
        }
        pids
    };
    let _ = blocked_on(&nginx);
    nginx.reload();
    let _ = blocked_on(&nginx);
    let old = nginx.kill_workers();
    nginx.wait_workers_replaced(&old);
    let _ = blocked_on(&nginx);
    let (_, zone) = get_json(&nginx, "/ratelimit/zones/login/blocked");
    assert_eq!(zone["count"], 1, "{zone}");
    assert_eq!(zone["keys"][0]["level"], 0);
}

/// The admin API on the module's zones: block by hand, list, release, metrics, top keys by
/// `blocked`.
#[test]
fn admin_api_blocks_lists_and_releases_real_keys() {
    // 10r/m: the bucket the first request charges stays 6 s, so the key's state read below
    // still has it next to the block (at 10r/s it drained within 100 ms, and a loaded machine
    // read the block alone, as for a key whose bucket is gone).
    let nginx = login("rate=10r/m burst=5 block=15m block_max=24h", "nodelay", 200).start();
    let port = nginx.port();
    assert_eq!(attempt(&nginx, "203.0.113.9").status, 200);
    let put = send(
        port,
        &Request::new("PUT", "/ratelimit/zones/login/blocked/203.0.113.9")
            .json(r#"{"duration": "10m"}"#),
    );
    assert_eq!(put.status, 201, "{}", put.text());
    for _ in 0..4 {
        let refused = attempt(&nginx, "203.0.113.9");
        assert_eq!(refused.status, 429);
        let left = retry_after(&refused).unwrap();
        assert!((599..=600).contains(&left), "{left}");
    }
    let (status, list) = get_json(&nginx, "/ratelimit/zones/login/blocked");
    assert_eq!(status, 200);
    assert_eq!((&list["count"], &list["block"]), (&1.into(), &"15m".into()));
    // Unix times: the block started now and ends in ten minutes.
    let key = &list["keys"][0];
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let (since, until) = (
        key["since"].as_f64().unwrap(),
        key["until"].as_f64().unwrap(),
    );
    assert!((since - now).abs() < 5.0, "{list}");
    assert!((until - since - 600.0).abs() < 0.01, "{list}");
    let (_, key_state) = get_json(&nginx, "/ratelimit/zones/login/keys/203.0.113.9");
    assert!(key_state.get("block").is_some(), "{key_state}");
    let (_, top) = get_json(&nginx, "/ratelimit/zones/login/top?by=blocked");
    assert_eq!(top["keys"][0]["key"], "203.0.113.9", "{top}");
    assert_eq!(top["keys"][0]["count"], 4, "{top}");
    let metrics = send(port, &Request::get("/ratelimit/metrics")).text();
    assert!(metrics.contains("rate_limit_requests_total{zone=\"login\",outcome=\"blocked\"} 4"));
    assert!(metrics.contains("rate_limit_blocked_keys{zone=\"login\"} 1"));
    let delete = send(
        port,
        &Request::new("DELETE", "/ratelimit/zones/login/blocked/203.0.113.9"),
    );
    assert_eq!(delete.status, 204);
    let released = attempt(&nginx, "203.0.113.9");
    assert_eq!(
        (released.status, released.header("X-RL")),
        (200, Some("PASSED"))
    );
    let (_, list) = get_json(&nginx, "/ratelimit/zones/login/blocked");
    assert_eq!(list["count"], 0);
    // A zone without block= says so.
    let (status, error) = get_json(&nginx, "/ratelimit/zones/nope/blocked");
    assert_eq!(status, 404, "{error}");
}

/// Many distinct keys blocked at once: the table holds them up to its capacity, and a full
/// table keeps working and keeps its blocks. An attacker blocked first (the block nearest its
/// end, which the table used to give way) who floods it with fresh keys stays blocked at its
/// level; the fresh keys beyond the table stay rate-limited and are counted as not recorded.
#[test]
fn many_keys_fill_the_table_without_failing() {
    let nginx = config()
        .http("rate_limit_zone $http_x_key zone=login:64k rate=1r/m block=1h block_max=4h;")
        .locations(
            "location = /login { rate_limit zone=login nodelay; try_files /index.html =404; }\n\
             location /ratelimit/ { rate_limit_admin write=on; }",
        )
        .start();
    let (_, list) = get_json(&nginx, "/ratelimit/zones/login/blocked");
    let capacity = list["capacity"].as_u64().unwrap() as usize;
    assert!(capacity >= 64, "{list}");
    let mut connection = Connection::open(nginx.port());
    let mallory = Request::get("/login").header("X-Key", "mallory");
    connection.send(&mallory);
    assert_eq!(connection.send(&mallory).status, 429);
    let (_, blocked) = get_json(&nginx, "/ratelimit/zones/login/blocked/mallory");
    assert_eq!(blocked["level"], 0, "{blocked}");
    for key in 0..capacity * 2 {
        for _ in 0..2 {
            let request = Request::get("/login").header("X-Key", &format!("key-{key}"));
            connection.send(&request);
        }
    }
    let (_, list) = get_json(&nginx, "/ratelimit/zones/login/blocked");
    let count = list["count"].as_u64().unwrap() as usize;
    assert!(
        count <= capacity && count >= capacity / 2,
        "{count} of {capacity}"
    );
    // The attacker is still blocked, for the whole hour, at its level.
    let (status, blocked) = get_json(&nginx, "/ratelimit/zones/login/blocked/mallory");
    assert_eq!(status, 200, "the flood freed the attacker: {blocked}");
    assert_eq!(blocked["level"], 0, "{blocked}");
    assert!(
        blocked["left_ms"].as_u64().unwrap() > 3_500_000,
        "{blocked}"
    );
    // Keys beyond the table are counted, and stay rate-limited.
    let not_recorded = list["not_recorded"].as_u64().unwrap() as usize;
    assert!(
        not_recorded >= capacity * 2 - count,
        "{not_recorded} not recorded, {count} blocked of {}",
        capacity * 2
    );
    let metrics = send(nginx.port(), &Request::get("/ratelimit/metrics")).text();
    assert!(
        metrics.contains(&format!(
            "rate_limit_blocks_not_recorded_total{{zone=\"login\"}} {not_recorded}"
        )),
        "{metrics}"
    );
    let last = format!("key-{}", capacity * 2 - 1);
    let response = send(nginx.port(), &Request::get("/login").header("X-Key", &last));
    assert_eq!(response.status, 429);
    assert!(!nginx.error_log().contains("[alert]"));
}

/// When `path` first answers `status` on `nginx`, polled every 20 ms for at most `within`.
fn first_answer(nginx: &Nginx, path: &str, status: u16, within: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < within {
        let response = send(nginx.port(), &Request::get(path));
        if response.status == status {
            if std::env::var_os("PENALTY_DEBUG").is_some() {
                eprintln!("{path}: {} after {:?}", response.text(), start.elapsed());
            }
            return Some(start.elapsed());
        }
        thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Target: three instances with `sync`: a key blocked on one (by a rejection, or by hand) is
/// rejected on the others within two intervals; a release likewise; a restarted instance
/// gets the blocks in force.
#[test]
fn fleet_blocks_reach_every_instance_within_two_intervals() {
    use common::fleet::instance_config_with;
    use common::redis::Redis;

    const INTERVAL: Duration = Duration::from_secs(1);
    let redis = Redis::start();
    let config = instance_config_with(
        redis.port,
        "interval=1s",
        "rate=1r/m burst=5 block=1h",
        "nodelay",
    );
    let mut fleet: Vec<Nginx> = (0..3).map(|_| Nginx::start(&config)).collect();
    redis.wait_instances(3);
    let key_status = |nginx: &Nginx, key: &str| {
        send(nginx.port(), &Request::get("/").header("X-Key", key)).status
    };
    let mut delays = Vec::new();

    // Requests of "k" on the first instance until one is rejected there and blocks it (the
    // fleet's bucket of 6 is shared: a new key gets its share of it, the rest comes through
    // the rounds; a refusal for want of the fleet's grant alone blocks nothing).
    let start = Instant::now();
    loop {
        key_status(&fleet[0], "k");
        let (status, _) = get_json(&fleet[0], "/ratelimit/zones/api/blocked/k");
        if status == 200 {
            break;
        }
        assert!(start.elapsed() < 5 * INTERVAL, "k was never blocked");
        thread::sleep(Duration::from_millis(20));
    }
    let (_, blocked) = get_json(&fleet[0], "/ratelimit/zones/api/blocked/k");
    assert_eq!(blocked["level"], 0, "{blocked}");
    for other in &fleet[1..] {
        let delay = first_answer(other, "/ratelimit/zones/api/blocked/k", 200, 4 * INTERVAL)
            .expect("the block never reached another instance");
        delays.push(delay);
        let refused = send(other.port(), &Request::get("/").header("X-Key", "k"));
        assert_eq!(refused.status, 429);
        let left: u64 = refused.header("Retry-After").unwrap().parse().unwrap();
        assert!((3590..=3600).contains(&left), "Retry-After {left}");
    }

    // By hand on the second instance: enforced by the first and the third.
    let put = send(
        fleet[1].port(),
        &Request::new("PUT", "/ratelimit/zones/api/blocked/mallory").json(r#"{"duration": "10m"}"#),
    );
    assert_eq!(put.status, 201, "{}", put.text());
    for index in [0, 2] {
        let delay = first_answer(
            &fleet[index],
            "/ratelimit/zones/api/blocked/mallory",
            200,
            4 * INTERVAL,
        )
        .expect("the hand block never reached another instance");
        delays.push(delay);
        assert_eq!(key_status(&fleet[index], "mallory"), 429);
    }

    // Released on the third instance: the others let it through again.
    let delete = send(
        fleet[2].port(),
        &Request::new("DELETE", "/ratelimit/zones/api/blocked/mallory"),
    );
    assert_eq!(delete.status, 204);
    for index in [0, 1] {
        let delay = first_answer(
            &fleet[index],
            "/ratelimit/zones/api/blocked/mallory",
            404,
            4 * INTERVAL,
        )
        .expect("the release never reached another instance");
        delays.push(delay);
    }

    // Whatever else is in the fleet's hash (a value that is not a record, a key longer than
    // an instance keeps) is left alone, and the rest still flows.
    redis.cli(&["HSET", "rl:api:blocks", "junk", "not a record"]);
    let long_key = "x".repeat(100);
    redis.cli(&["HSET", "rl:api:blocks", &long_key, "1 99999999999999 1 0"]);

    // An instance restarted gets the blocks in force.
    drop(fleet.pop());
    let restarted = Nginx::start(&config);
    let delay = first_answer(
        &restarted,
        "/ratelimit/zones/api/blocked/k",
        200,
        4 * INTERVAL,
    )
    .expect("a restarted instance never got the fleet's blocks");
    delays.push(delay);
    assert_eq!(key_status(&restarted, "k"), 429);
    // The release is in force there too (whether the key then passes is the fleet's grant's
    // business: a new key waits for its share).
    let (status, _) = get_json(&restarted, "/ratelimit/zones/api/blocked/mallory");
    assert_eq!(
        status, 404,
        "mallory is blocked again on the restarted instance"
    );

    eprintln!("fleet block delays: {delays:?}");
    for delay in &delays {
        assert!(
            *delay <= 2 * INTERVAL,
            "a change took {delay:?}: {delays:?}"
        );
    }
    let record = redis.cli(&["HGET", "rl:api:blocks", "k"]);
    assert!(record.starts_with("1 "), "{record}");
    let (_, list) = get_json(&restarted, "/ratelimit/zones/api/blocked");
    assert_eq!(list["count"], 1, "only k: {list}");
    for nginx in fleet.iter().chain([&restarted]) {
        let log = nginx.error_log();
        assert!(!log.contains("[alert]") && !log.contains("panic"), "{log}");
    }
}

/// A reload that adds `block=` to a zone lays its memory out again with a block table (and
/// says so); one that keeps it keeps the blocks.
#[test]
fn a_reload_adding_block_gives_the_zone_its_table() {
    let mut nginx = login("rate=1r/m", "nodelay", 200).start();
    assert_eq!(attempt(&nginx, "k").status, 200);
    assert_eq!(attempt(&nginx, "k").status, 429);
    assert_eq!(attempt(&nginx, "k").header("X-RL"), Some("REJECTED"));
    let with_block = login("rate=1r/m block=1h", "nodelay", 200).build();
    nginx.reload_with(&with_block);
    assert!(nginx.error_log().contains(
        "rate_limit zone \"login\" changed its key, algorithm or block=: its state starts afresh"
    ));
    // Afresh: the key passes once, then its rejection blocks it.
    assert_eq!(attempt(&nginx, "k").status, 200);
    assert_eq!(attempt(&nginx, "k").header("X-RL"), Some("REJECTED"));
    assert_eq!(attempt(&nginx, "k").header("X-RL"), Some("BLOCKED"));
    // The same configuration again: the block stays.
    nginx.reload_with(&with_block);
    assert_eq!(attempt(&nginx, "k").header("X-RL"), Some("BLOCKED"));
}
