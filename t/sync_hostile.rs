//! `rate_limit_sync` against a Redis that lies (`common::fake_redis`): every value read from
//! Redis is checked against what the instance can compute itself before it touches shared
//! memory, and no reply may make a worker allocate without bound. Real nginx, real configs,
//! real HTTP; the only fake is the server on the other end of the sync loop.

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::fake_redis::{array, bulk, int, Answer, FakeRedis};
use common::fleet::{instance_config, wait_mode};
use common::{Connection, Nginx, Request};
use ratelimit_core::{Limits, Rate};

/// Polls (bounded) until `done` says yes; `what` names it in the failure.
fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < within, "{what}: not after {within:?}");
        thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until the fake has answered `rounds` more calls of a kind (`count` reads it).
fn wait_calls(fake: &FakeRedis, count: fn(&FakeRedis) -> u64, rounds: u64) {
    let before = count(fake);
    wait_for("rounds", Duration::from_secs(10), || {
        count(fake) >= before + rounds
    });
}

fn metrics(nginx: &Nginx) -> String {
    common::get(nginx.port(), "/ratelimit/metrics").text()
}

/// A metric's value for zone `api` (0 when absent).
fn metric(nginx: &Nginx, name: &str) -> f64 {
    let prefix = format!("{name}{{zone=\"api\"}} ");
    metrics(nginx)
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Issue 19, 1: a key script reply of `[2^63-1, 2^63-1, 2^63-1]` for every key, for a few
/// rounds, on a leaky bucket and on a token bucket zone (10r/s burst=5). Before the check, every key touched
/// then was rejected with `Retry-After: 18446743446` and still was long after Redis behaved
/// again. Now the reply is dropped (counted, logged once with what was wrong), the key is
/// never rejected for longer than its own limits could, and once Redis is sane again it is
/// admitted as a fresh key would be.
#[test]
fn an_absurd_key_state_from_redis_locks_no_key() {
    for algorithm in ["leaky_bucket", "token_bucket"] {
        let fake = FakeRedis::start();
        let nginx = Nginx::start(&instance_config(
            fake.port,
            "interval=100ms",
            &format!("rate=10r/s burst=5 algorithm={algorithm}"),
        ));
        wait_mode(&nginx, "synced", Duration::from_secs(5));
        let max = int(i64::MAX);
        fake.set(|script| script.keys = Answer::PerKey(vec![max.clone(), max.clone(), max]));
        let mut connection = Connection::open(nginx.port());
        let request = Request::get("/index.html").header("X-Key", "victim");
        // Five requests: more than half of what the instance may take alone (a bucket of 6
        // and an interval's drain), so the key is sent, and answered with the lie.
        for _ in 0..5 {
            let response = connection.send(&request);
            assert!(matches!(response.status, 200 | 429), "{}", response.status);
        }
        wait_calls(&fake, FakeRedis::key_calls, 1);
        fake.set(|script| script.keys = Answer::Sane);
        // A key of 10r/s burst=5 that took four requests is empty again within 0.4 s; give
        // the sane Redis a few rounds on top.
        thread::sleep(Duration::from_millis(700));
        wait_calls(&fake, FakeRedis::heartbeats, 3);
        let statuses: Vec<(u16, Option<String>)> = (0..3)
            .map(|_| {
                let response = connection.send(&request);
                (
                    response.status,
                    response.header("Retry-After").map(str::to_string),
                )
            })
            .collect();
        assert!(
            statuses.iter().all(|(status, _)| *status == 200),
            "{algorithm}: the key is still locked after Redis was sane again: {statuses:?}"
        );
        assert!(
            metric(&nginx, "rate_limit_sync_bad_values_total") >= 1.0,
            "{algorithm}: the dropped values are not counted:\n{}",
            metrics(&nginx)
        );
        let log = nginx.error_log();
        let lines = log
            .lines()
            .filter(|line| line.contains("out of range") && line.contains("ahead"))
            .count();
        assert_eq!(
            lines, 1,
            "{algorithm}: logged once with what was wrong:\n{log}"
        );
    }
}

/// While Redis lies, a key is never refused for longer than its own limits could refuse it:
/// every `Retry-After` stays within one bucket and one interval (10r/s burst=5: under 2 s).
#[test]
fn an_absurd_key_state_never_shows_an_absurd_retry_after() {
    let fake = FakeRedis::start();
    let nginx = Nginx::start(&instance_config(
        fake.port,
        "interval=100ms",
        "rate=10r/s burst=5",
    ));
    wait_mode(&nginx, "synced", Duration::from_secs(5));
    let max = int(i64::MAX);
    fake.set(|script| script.keys = Answer::PerKey(vec![max.clone(), max.clone(), max]));
    let mut connection = Connection::open(nginx.port());
    let request = Request::get("/index.html").header("X-Key", "k");
    let started = Instant::now();
    let mut longest = 0u64;
    while started.elapsed() < Duration::from_secs(1) {
        let response = connection.send(&request);
        if let Some(retry) = response.header("Retry-After") {
            longest = longest.max(retry.parse().unwrap_or(u64::MAX));
        }
        thread::sleep(Duration::from_millis(20));
    }
    assert!(longest <= 2, "Retry-After {longest} from a lying Redis");
}

fn packed(rate: &str, burst: u64) -> String {
    Limits {
        rate: Rate::parse(rate).expect("rate"),
        burst,
    }
    .pack()
    .to_string()
}

fn zone_json(nginx: &Nginx) -> serde_json::Value {
    let response = common::get(nginx.port(), "/ratelimit/zones/api");
    serde_json::from_str(&response.text()).expect("zone JSON")
}

/// Issue 19, 2: limits and overrides from Redis that the zone's algorithm cannot take (a
/// `sliding_window` needs a whole number of requests per window and no burst; the admin API
/// and the state file refuse `1.5r/s burst=5` and `0.001r/d burst=4194303`) are not applied:
/// the zone keeps its limits, no override appears, the values are counted and logged once.
#[test]
fn limits_from_redis_are_checked_for_the_zones_algorithm() {
    let fake = FakeRedis::start();
    let nginx = Nginx::start(&instance_config(
        fake.port,
        "interval=100ms",
        "rate=100r/s algorithm=sliding_window",
    ));
    wait_mode(&nginx, "synced", Duration::from_secs(5));
    for (rate, burst) in [("1.5r/s", 5), ("0.001r/d", 4194303)] {
        let value = bulk(&packed(rate, burst));
        fake.set(|script| script.limits = Answer::Raw(value));
        wait_calls(&fake, FakeRedis::limits_calls, 5);
        let zone = zone_json(&nginx);
        assert_eq!(zone["rate"], "100r/s", "took {rate} burst={burst}: {zone}");
        assert_eq!(zone["burst"], 0, "took {rate} burst={burst}: {zone}");
    }
    // An override the algorithm cannot take, in the fleet's map.
    let map = array(&[int(7), bulk("map"), bulk("vip"), bulk(&packed("1.5r/s", 5))]);
    fake.set(|script| {
        script.limits = Answer::Sane;
        script.overrides = Answer::Raw(map);
    });
    wait_calls(&fake, FakeRedis::overrides_calls, 5);
    // Three more rounds answered with that map, in which it would have been applied.
    wait_calls(&fake, FakeRedis::overrides_calls, 3);
    let overrides = common::get(nginx.port(), "/ratelimit/zones/api/overrides").text();
    assert_eq!(overrides.trim(), "{}", "an invalid override was applied");
    assert!(
        metric(&nginx, "rate_limit_sync_bad_values_total") >= 3.0,
        "{}",
        metrics(&nginx)
    );
    let log = nginx.error_log();
    for wrong in ["\"1.5r/s\"", "\"0.001r/d\""] {
        let lines = log
            .lines()
            .filter(|line| line.contains("rate_limit_sync") && line.contains(wrong))
            .count();
        assert!(
            (1..=2).contains(&lines),
            "{wrong} logged {lines} times (once for the limits, once for the override):\n{log}"
        );
    }
    // The zone still limits as configured: 100 per second, not 1.5.
    let mut connection = Connection::open(nginx.port());
    let request = Request::get("/index.html").header("X-Key", "vip");
    let passed = (0..20)
        .filter(|_| connection.send(&request).status == 200)
        .count();
    assert_eq!(passed, 20);
}

/// Peak resident memory (`VmHWM`) of a process, in KiB.
fn peak_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

/// Issue 19, 5: a reply of `*2147483647` followed by 40 MB of `:1\r\n` (before: the loop's
/// worker grew from 36 MB to 584 MB with `timeout=4s`, reading it until the timeout). Here
/// it answers the zone's limits in the exchange an admin write starts at once, with
/// `timeout=20s`. The reply is cut off at the bound the loop sets for each exchange (the
/// connection dropped, counted as a bad value), and the worker's peak memory grows by a few
/// MB at most in the seconds it would otherwise still be reading; it keeps serving.
#[test]
fn a_huge_reply_is_cut_off() {
    let fake = FakeRedis::start();
    let config = instance_config(fake.port, "interval=20s timeout=20s", "rate=10r/s burst=5")
        .replace("worker_processes 2;", "worker_processes 1;");
    let nginx = Nginx::start(&config);
    wait_mode(&nginx, "synced", Duration::from_secs(15));
    let worker = nginx.worker_pids()[0];
    let before = peak_kib(worker);
    fake.set(|script| script.limits = Answer::HugeArray { bytes: 40 << 20 });
    let patch = Request::new("PATCH", "/ratelimit/zones/api").json(r#"{"burst": 6}"#);
    assert_eq!(common::send(nginx.port(), &patch).status, 200);
    // What the worker holds while it would still be reading (20 s), sampled for 8 s.
    let mut grown = 0;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(8) && grown < 16 * 1024 {
        grown = peak_kib(worker).saturating_sub(before);
        thread::sleep(Duration::from_millis(50));
    }
    fake.set(|script| script.limits = Answer::Sane);
    eprintln!("worker peak memory grew by {grown} KiB");
    assert!(
        grown < 16 * 1024,
        "the worker grew by {grown} KiB reading one reply"
    );
    assert!(
        metric(&nginx, "rate_limit_sync_bad_values_total") >= 1.0,
        "{}",
        metrics(&nginx)
    );
    assert_eq!(nginx.worker_pids(), vec![worker], "the worker was replaced");
    let request = Request::get("/index.html").header("X-Key", "k");
    assert_eq!(common::send(nginx.port(), &request).status, 200);
}

/// Garbage, silence and resets from Redis: no crash, no 5xx, the failure mode applies and
/// the instance is synced again when Redis is sane.
#[test]
fn garbage_silence_and_resets_only_fail_rounds() {
    let fake = FakeRedis::start();
    let nginx = Nginx::start(&instance_config(
        fake.port,
        "interval=50ms",
        "rate=100r/s burst=20",
    ));
    wait_mode(&nginx, "synced", Duration::from_secs(5));
    let workers = nginx.worker_pids();
    let answers = [
        Answer::Raw(b"%garbage\r\n\x00\xff".to_vec()),
        Answer::Raw(b"$99999999999999999999\r\n".to_vec()),
        Answer::Raw(array(&[int(1), int(2)])),
        Answer::Raw(b"-ERR no\r\n".to_vec()),
        Answer::Silence,
        Answer::Reset,
    ];
    for answer in answers {
        fake.set(|script| script.keys = answer.clone());
        let mut connection = Connection::open(nginx.port());
        let request = Request::get("/index.html").header("X-Key", "g");
        for _ in 0..10 {
            let status = connection.send(&request).status;
            assert!(matches!(status, 200 | 429), "{answer:?}: {status}");
            thread::sleep(Duration::from_millis(30));
        }
        fake.set(|script| script.keys = Answer::Sane);
        wait_mode(&nginx, "synced", Duration::from_secs(5));
    }
    assert_eq!(nginx.worker_pids(), workers, "a worker died");
}
