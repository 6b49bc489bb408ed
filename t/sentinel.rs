//! `rate_limit_sync redis-sentinel://…`: a real master, its replica and a sentinel
//! (`redis-server --sentinel`) on free ports, two nginx instances asking the sentinel for the
//! master; the master killed, the instances follow the promoted replica.

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::fleet::{sync_config, sync_state, wait_mode};
use common::redis::SentinelSet;
use common::{check_config, send, Nginx, Request};

const MASTER: &str = "mymaster";
/// Five requests of a key pass at once (burst=4), then one every 10 s: what passes of a
/// dozen requests does not depend on the pace.
const ZONE: &str = "rate=6r/m burst=4";

fn instance(sentinel_url: &str, sync_words: &str) -> Nginx {
    Nginx::start(&sync_config(sentinel_url, sync_words, ZONE))
}

/// Requests of `key`, alternating between the instances, `gap` apart: the statuses.
fn alternate(instances: &[&Nginx], count: usize, key: &str, gap: Duration) -> Vec<u16> {
    (0..count)
        .map(|at| {
            let nginx = instances[at % instances.len()];
            let status = send(nginx.port(), &Request::get("/").header("X-Key", key)).status;
            thread::sleep(gap);
            status
        })
        .collect()
}

/// The master killed with SIGKILL: the sentinel promotes the replica, both instances are
/// synced again with it within 15 s, and then hold one limit through it: of a dozen requests
/// of a key alternating between them, the five of one bucket pass (each alone would pass
/// five, ten together), and the key lives on the promoted replica.
#[test]
fn instances_follow_a_failover() {
    let set = SentinelSet::start(MASTER, Some("m4ster"), Some("s3ntinel"));
    let url = format!(
        "redis-sentinel://:m4ster@127.0.0.1:{}/{MASTER}",
        set.sentinel.port
    );
    let words = "sentinel_password=s3ntinel interval=100ms timeout=100ms";
    let (a, b) = (instance(&url, words), instance(&url, words));
    wait_mode(&a, "synced", Duration::from_secs(10));
    wait_mode(&b, "synced", Duration::from_secs(10));
    let errors = |nginx: &Nginx| sync_state(nginx)["errors"].as_u64().expect("errors");
    let errors_before = (errors(&a), errors(&b));

    let SentinelSet {
        mut master,
        replica,
        sentinel,
    } = set;
    let killed = Instant::now();
    master.kill();
    // Synced again after a failed round: only the promoted replica can have answered it (the
    // old master is dead, and a replica's ROLE is refused).
    let resynced = |nginx: &Nginx, before: u64| {
        let state = sync_state(nginx);
        state["mode"] == "synced"
            && state["errors"].as_u64().expect("errors") > before
            && state["last_sync_age_ms"]
                .as_u64()
                .is_some_and(|age| age < 500)
    };
    loop {
        if resynced(&a, errors_before.0) && resynced(&b, errors_before.1) {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(15),
            "not synced again 15 s after the master was killed: {} / {}\nsentinel says master \
             {:?}\n{}",
            sync_state(&a),
            sync_state(&b),
            sentinel.master_port(MASTER),
            a.error_log()
        );
        thread::sleep(Duration::from_millis(20));
    }
    let took = killed.elapsed();
    eprintln!("synced with the promoted replica {took:?} after the master was killed");
    assert_eq!(sentinel.master_port(MASTER), Some(replica.port));
    let log = a.error_log();
    assert!(log.contains("synced with Redis"), "{log}");
    assert!(
        !log.contains("m4ster") && !log.contains("s3ntinel"),
        "{log}"
    );

    let statuses = alternate(&[&a, &b], 12, "after", Duration::from_millis(300));
    let passed = statuses.iter().filter(|&&status| status == 200).count();
    assert!(
        (5..=6).contains(&passed),
        "{passed} of 12 passed over two instances (one bucket: 5; each alone: 10): {statuses:?}"
    );
    let keys = replica.cli(&["--scan", "--pattern", "rl:api:*"]);
    assert!(
        keys.lines().any(|key| !key.trim().is_empty()),
        "no key of the zone on the promoted replica"
    );
    for nginx in [&a, &b] {
        let state = sync_state(nginx);
        assert_eq!(state["mode"], "synced", "{state}");
        assert_eq!(state["instances"], 2, "{state}");
    }
}

/// A master name the sentinel does not monitor: logged once with the reason, and the
/// failure mode applies; a sentinel password refused: logged as an authentication failure.
#[test]
fn unknown_master_and_wrong_sentinel_password() {
    let set = SentinelSet::start(MASTER, None, Some("s3ntinel"));
    let port = set.sentinel.port;
    let words = "sentinel_password=s3ntinel interval=100ms timeout=100ms";
    let unknown = instance(&format!("redis-sentinel://127.0.0.1:{port}/nosuch"), words);
    let wrong = instance(
        &format!("redis-sentinel://127.0.0.1:{port}/{MASTER}"),
        "sentinel_password=nope interval=100ms timeout=100ms",
    );
    let right = instance(
        &format!("redis-sentinel://127.0.0.1:{port}/{MASTER}"),
        words,
    );
    wait_mode(&right, "synced", Duration::from_secs(10));
    wait_mode(&unknown, "local_share", Duration::from_secs(10));
    wait_mode(&wrong, "local_share", Duration::from_secs(10));
    let log = unknown.error_log();
    let said = "no sentinel knows a master of that name (see \"sentinel monitor\")";
    assert_eq!(log.matches(said).count(), 1, "{log}");
    let log = wrong.error_log();
    assert_eq!(log.matches("authentication failed").count(), 1, "{log}");
    assert!(!log.contains("nope"), "{log}");
}

/// `nginx -t` takes a Sentinel URL with its parameters and names what is wrong in a bad one.
#[test]
fn config_check() {
    let config = |sync: &str| sync_config(sync, "", ZONE);
    let (ok, stderr) = check_config(&config(
        "redis-sentinel://u:p@127.0.0.1:1,127.0.0.1:2/m/1 sentinel_password=x",
    ));
    assert!(ok, "{stderr}");
    #[rustfmt::skip]
    let rows: &[(&str, &str)] = &[
        ("redis-sentinel://127.0.0.1:1", "invalid Redis Sentinel URL \"redis-sentinel://127.0.0.1:1\": no master name"),
        ("redis-sentinel://127.0.0.1:1/m cluster", "\"cluster\" cannot be used with a Sentinel URL"),
        ("redis://127.0.0.1:1 sentinel_password=x", "\"sentinel_password=x\" needs a redis-sentinel:// URL"),
    ];
    for (sync, expected) in rows {
        let (ok, stderr) = check_config(&config(sync));
        assert!(!ok, "accepted: {sync}");
        assert!(stderr.contains(expected), "{expected:?} not in {stderr}");
    }
}
