//! A fleet of nginx instances sharing one limit through Redis (`rate_limit_sync`): their
//! config, paced traffic offered to them from this process, and what their admin API says.

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use super::redis::Redis;
use super::{Connection, Nginx, Request};

/// One instance: two workers, a `sync` zone `api` of 100r/s burst=20 on `X-Key`.
pub fn instance_config(redis_port: u16, sync_words: &str, zone_words: &str) -> String {
    instance_config_with(redis_port, sync_words, zone_words, "nodelay")
}

/// [`instance_config`] with the `rate_limit` line's own words.
pub fn instance_config_with(
    redis_port: u16,
    sync_words: &str,
    zone_words: &str,
    limit_words: &str,
) -> String {
    sync_config_with(
        &format!("redis://127.0.0.1:{redis_port}"),
        sync_words,
        zone_words,
        limit_words,
    )
}

/// [`instance_config`] with any URL(s) (`rediss://…`) before `sync_words`.
pub fn sync_config(urls: &str, sync_words: &str, zone_words: &str) -> String {
    sync_config_with(urls, sync_words, zone_words, "nodelay")
}

/// [`sync_config`] with the `rate_limit` line's own words.
pub fn sync_config_with(
    urls: &str,
    sync_words: &str,
    zone_words: &str,
    limit_words: &str,
) -> String {
    format!(
        r#"
load_module %%MODULE%%;
worker_processes 2;
error_log logs/error.log info;
events {{ worker_connections 256; }}
http {{
    access_log off;
    keepalive_requests 1000000;
    rate_limit_sync {urls} {sync_words};
    rate_limit_zone $http_x_key zone=api:1m {zone_words} sync;
    # The same limit without `sync`, side by side (bench: latency with Redis stopped).
    rate_limit_zone $http_x_key zone=plain:1m {zone_words};
    server {{
        listen 127.0.0.1:%%PORT%% reuseport;
        root html;
        location / {{ rate_limit zone=api {limit_words}; }}
        location /plain/ {{ rate_limit zone=plain {limit_words}; alias html/; }}
        location /ratelimit/ {{ rate_limit_admin write=on; }}
    }}
}}
"#
    )
}

pub const LIMIT_PER_SEC: f64 = 100.0;
pub const BURST: f64 = 20.0;
pub const ZONE: &str = "rate=100r/s burst=20";
/// What a fleet admits beyond `L t + burst` by design: each grant includes the interval's
/// drain ahead of time (L x 100 ms). The issue's target, `1.05 L t + burst` over 10 s, has it
/// inside its 5% (bench/cluster.sh); these shorter runs add it explicitly.
pub const AHEAD: f64 = LIMIT_PER_SEC * 0.1;

pub fn fleet(redis: &Redis, count: usize, sync_words: &str) -> Vec<Nginx> {
    let fleet: Vec<Nginx> = (0..count)
        .map(|_| Nginx::start(&instance_config(redis.port, sync_words, ZONE)))
        .collect();
    redis.wait_instances(count);
    fleet
}

/// One answer: when it was sent (from the start), its status and how long it took.
#[derive(Clone, Copy, Debug)]
pub struct Answer {
    pub sent: Duration,
    pub status: u16,
    pub latency: Duration,
    /// Which of [`offer_paths`]'s paths it was sent to.
    pub path: usize,
}

/// Offers `per_sec` requests a second for key `key` to each port in `ports`, for `span`,
/// from two paced keep-alive connections per port, their requests interleaved evenly (all
/// connections together send at a steady pace). Returns every answer.
pub fn offer(ports: &[u16], per_sec: f64, span: Duration, key: &str) -> Vec<Answer> {
    offer_paths(ports, per_sec, span, key, &["/index.html"])
}

/// [`offer`] to several paths in turn on each connection (`/plain/index.html`: the zone
/// without `sync`): `per_sec` a second for each path.
pub fn offer_paths(
    ports: &[u16],
    per_sec: f64,
    span: Duration,
    key: &str,
    paths: &[&str],
) -> Vec<Answer> {
    let per_sec = per_sec * paths.len() as f64;
    let answers = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now() + Duration::from_millis(50);
    let mut threads = Vec::new();
    // Each connection sends every `gap`; the connections start `gap / connections` apart, so
    // that their requests interleave evenly instead of arriving in clumps.
    let gap = Duration::from_secs_f64(2.0 / per_sec);
    let connections = 2 * ports.len() as u32;
    for (index, &port) in ports.iter().enumerate() {
        for lane in 0..2 {
            let first = start + gap * (2 * index as u32 + lane) / connections;
            let answers = answers.clone();
            let key = key.to_string();
            let requests: Vec<Request> = paths
                .iter()
                .map(|path| Request::get(path).header("X-Key", &key))
                .collect();
            threads.push(thread::spawn(move || {
                let mut connection = Connection::open(port);
                let mut mine = Vec::new();
                let mut next = first;
                while next < start + span {
                    let now = Instant::now();
                    if next > now {
                        thread::sleep(next - now);
                    }
                    let path = mine.len() % requests.len();
                    let sent = Instant::now();
                    let status = match connection.try_send(&requests[path]) {
                        Ok(response) => response.status,
                        Err(_) => {
                            connection = Connection::open(port);
                            0
                        }
                    };
                    mine.push(Answer {
                        sent: sent - start,
                        status,
                        latency: sent.elapsed(),
                        path,
                    });
                    next += gap;
                }
                answers.lock().unwrap().extend(mine);
            }));
        }
    }
    for thread in threads {
        thread.join().expect("load thread panicked");
    }
    let answers = answers.lock().unwrap().clone();
    answers
}

pub fn passed_between(answers: &[Answer], from: Duration, to: Duration) -> usize {
    let passed = passed_between_quiet(answers, from, to);
    eprintln!(
        "passed {passed} of {} between {from:?} and {to:?}",
        answers.len()
    );
    passed
}

/// The fleet's admitted requests in `answers` over `span` (from their start), checked against
/// one shared limit: every answer 200 or 429, at most 1.05 L t + burst + the interval's drain
/// granted ahead, and at least 0.8 L t (a limit, not a block). Returns them.
pub fn assert_one_limit(answers: &[Answer], span: Duration) -> usize {
    let passed = passed_between(answers, Duration::ZERO, span);
    let limit_t = LIMIT_PER_SEC * span.as_secs_f64();
    assert!(answers.iter().all(|a| a.status == 200 || a.status == 429));
    let bound = 1.05 * limit_t + BURST + AHEAD;
    assert!(passed as f64 <= bound, "fleet admitted {passed} > {bound}");
    assert!(passed as f64 >= 0.8 * limit_t, "only {passed} admitted");
    passed
}

pub fn passed_between_quiet(answers: &[Answer], from: Duration, to: Duration) -> usize {
    answers
        .iter()
        .filter(|a| a.status == 200 && a.sent >= from && a.sent < to)
        .count()
}

/// `GET zones/api` of the admin API: the zone's `sync` object.
pub fn sync_state(nginx: &Nginx) -> serde_json::Value {
    let response = super::get(nginx.port(), "/ratelimit/zones/api");
    assert_eq!(response.status, 200, "{}", response.text());
    let zone: serde_json::Value = serde_json::from_str(&response.text()).expect("zone JSON");
    zone["sync"].clone()
}

pub fn ports(fleet: &[Nginx]) -> Vec<u16> {
    fleet.iter().map(Nginx::port).collect()
}

/// Polls (bounded by `within`) until the zone's sync mode is `mode`.
pub fn wait_mode(nginx: &Nginx, mode: &str, within: Duration) {
    let started = Instant::now();
    loop {
        let state = sync_state(nginx);
        if state["mode"] == mode {
            return;
        }
        assert!(
            started.elapsed() < within,
            "mode not {mode} after {within:?}: {state}\n{}",
            nginx.error_log()
        );
        thread::sleep(Duration::from_millis(10));
    }
}

/// Fails a bench whose table marks a goal missed: a cell that ends in `NO` (`<= 1.07 NO`,
/// `200 ms (NO)`). The table is written first, so the figures of a failed run are kept.
pub fn assert_goals_met(table: &str, written_to: &str) {
    let missed: Vec<&str> = table
        .lines()
        .filter(|line| line.starts_with('|'))
        .filter(|line| {
            line.split('|')
                .map(str::trim)
                .any(|cell| cell == "NO" || cell.ends_with(" NO") || cell.ends_with("(NO)"))
        })
        .collect();
    assert!(
        missed.is_empty(),
        "goals missed (the whole table is in {written_to}):\n{}",
        missed.join("\n")
    );
}

/// Polls (bounded by `within`) until the instance's sync loop has completed `rounds` more
/// round trips with Redis: "a few rounds later" as a condition, not a sleep.
pub fn wait_rounds(nginx: &Nginx, rounds: u64, within: Duration) {
    let trips = |nginx: &Nginx| {
        sync_state(nginx)["round_trips"]
            .as_u64()
            .expect("round_trips")
    };
    let before = trips(nginx);
    let started = Instant::now();
    loop {
        let now = trips(nginx);
        if now >= before + rounds {
            return;
        }
        assert!(
            started.elapsed() < within,
            "{} of {rounds} round trips after {within:?}: {}\n{}",
            now - before,
            sync_state(nginx),
            nginx.error_log()
        );
        thread::sleep(Duration::from_millis(10));
    }
}
