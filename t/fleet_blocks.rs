//! The fleet's block hash under attack (issue 27, points 2 and 3), against a real
//! redis-server: a hash flooded with 35,000 records is trimmed to the bound every instance
//! shares and read a page at a time, so the instance stays synced (with `on_failure=closed`,
//! a degraded instance refuses every request); a record whose block has ended is deleted at
//! its end, not `block_max` later; forged records (139 years, level 63, a change 30 days in
//! the future) are checked: the first two are dropped and counted in `bad_values`, the third
//! is clamped to now, so a release beats it and a restarted instance is not blocked again.
//!
//! Before the fix: the hash kept its 35,000 records, the instance logged `reply too large` and
//! went degraded; the ended record stayed; the forged blocks were applied.

mod common;

use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::fleet::{instance_config_with, sync_state, wait_mode};
use common::redis::Redis;
use common::{get, send, Nginx, Request};

const HASH: &str = "rl:api:blocks";

fn config(redis: &Redis) -> String {
    instance_config_with(
        redis.port,
        "interval=500ms on_failure=closed",
        "rate=100r/s burst=20 block=1m block_max=1h",
        "nodelay",
    )
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn metric(nginx: &Nginx, name: &str) -> f64 {
    let prefix = format!("{name}{{zone=\"api\"}} ");
    get(nginx.port(), "/ratelimit/metrics")
        .text()
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0.0)
}

fn blocked(nginx: &Nginx, key: &str) -> bool {
    let status = get(nginx.port(), &format!("/ratelimit/zones/api/blocked/{key}")).status;
    assert!(matches!(status, 200 | 404), "GET blocked/{key}: {status}");
    status == 200
}

/// Wait until `condition` holds, for at most 10 s (rounds are 500 ms).
fn wait_until(what: &str, nginx: &Nginx, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "{what}: not within 10 s\n{}",
            nginx.error_log()
        );
        thread::sleep(Duration::from_millis(50));
    }
}

/// Rounds of the blocks script seen by Redis from now on.
fn evals(redis: &Redis) -> u64 {
    redis.calls("eval")
}

#[test]
fn a_flooded_hash_is_bounded_and_costs_no_sync() {
    let redis = Redis::start();
    let now = unix_ms();
    // 35,000 fresh keys, each blocked for the next 10 minutes, and one record that ended a
    // second ago.
    let script = "for i = 1, tonumber(ARGV[1]) do \
                  redis.call('HSET', KEYS[1], 'flood-' .. i, ARGV[2]) end return 0";
    let value = format!("1 {} {now} 0", now + 600_000);
    redis.cli(&["EVAL", script, "1", HASH, "35000", &value]);
    redis.cli(&[
        "HSET",
        HASH,
        "ended",
        &format!("1 {} {} 0", now - 1000, now - 61_000),
    ]);
    assert_eq!(redis.cli(&["HLEN", HASH]).trim(), "35001");

    let nginx = Nginx::start(&config(&redis));
    wait_mode(&nginx, "synced", Duration::from_secs(10));
    let before = evals(&redis);
    wait_until("three block rounds", &nginx, || evals(&redis) >= before + 3);
    let records: usize = redis.cli(&["HLEN", HASH]).trim().parse().unwrap();
    assert!(records <= 10_000, "the hash holds {records} records");
    assert_eq!(redis.cli(&["HEXISTS", HASH, "ended"]).trim(), "0");
    // The instance is synced and serves a key of the sync zone.
    assert_eq!(sync_state(&nginx)["mode"], "synced");
    let response = send(nginx.port(), &Request::get("/").header("X-Key", "fresh"));
    assert_eq!(response.status, 200, "{}", response.text());
    // It reads the flood a page a round (500 records; 20 pages for the 10,000 kept), into a
    // table that keeps what it can hold.
    wait_until("a page of kept records applied", &nginx, || {
        let list = get(nginx.port(), "/ratelimit/zones/api/blocked");
        let list: serde_json::Value = serde_json::from_slice(&list.body).unwrap();
        list["count"].as_u64().unwrap_or(0) >= 500
    });
    let log = nginx.error_log();
    assert!(!log.contains("too large"), "{log}");
    assert!(!log.contains("[alert]") && !log.contains("panic"), "{log}");
}

#[test]
fn forged_records_are_checked() {
    let redis = Redis::start();
    let nginx = Nginx::start(&config(&redis));
    wait_mode(&nginx, "synced", Duration::from_secs(10));
    let now = unix_ms();
    let day = 86_400_000;
    redis.cli(&["HSET", HASH, "victim", &format!("1 9999999999999 {now} 0")]);
    redis.cli(&[
        "HSET",
        HASH,
        "climber",
        &format!("1 {} {now} 63", now + 60_000),
    ]);
    redis.cli(&[
        "HSET",
        HASH,
        "future",
        &format!("1 {} {} 0", now + 600_000, now + 30 * day),
    ]);
    redis.cli(&[
        "HSET",
        HASH,
        "honest",
        &format!("1 {} {now} 1", now + 120_000),
    ]);

    wait_until("the honest block applied", &nginx, || {
        blocked(&nginx, "honest")
    });
    wait_until("the future block applied", &nginx, || {
        blocked(&nginx, "future")
    });
    wait_until("two bad records counted", &nginx, || {
        metric(&nginx, "rate_limit_sync_bad_values_total") >= 2.0
    });
    assert!(!blocked(&nginx, "victim"), "a 139-year block was taken");
    assert!(!blocked(&nginx, "climber"), "level 63 was taken");
    let response = send(nginx.port(), &Request::get("/").header("X-Key", "victim"));
    assert_eq!(response.status, 200);
    let log = nginx.error_log();
    // One note per kind is logged at a time: either of the two says what was wrong.
    assert!(
        log.contains("ms, which is out of range (at most 31536000000 ms); dropped")
            || log.contains("of level 63, which is out of range (0 to 6); dropped"),
        "{log}"
    );

    // The future change was clamped to now: a release beats it, in Redis too, and a
    // restarted instance is not blocked again.
    let deleted = send(
        nginx.port(),
        &Request::new("DELETE", "/ratelimit/zones/api/blocked/future"),
    );
    assert_eq!(deleted.status, 204, "{}", deleted.text());
    wait_until("the release in Redis", &nginx, || {
        let record = redis.cli(&["HGET", HASH, "future"]);
        let until: u64 = record
            .split(' ')
            .nth(1)
            .and_then(|u| u.parse().ok())
            .unwrap_or(0);
        until <= unix_ms()
    });
    let restarted = Nginx::start(&config(&redis));
    wait_mode(&restarted, "synced", Duration::from_secs(10));
    wait_until(
        "the restarted instance has the honest block",
        &restarted,
        || blocked(&restarted, "honest"),
    );
    assert!(
        !blocked(&restarted, "future"),
        "blocked again after its release"
    );
    assert!(!blocked(&nginx, "future"));
}
