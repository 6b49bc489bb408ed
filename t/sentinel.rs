//! `rate_limit_sync redis-sentinel://…`: a real master, its replica and a sentinel
//! (`redis-server --sentinel`) on free ports, two nginx instances asking the sentinel for the
//! master; the master killed, the instances follow the promoted replica.

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::fleet::{sync_config, sync_state, wait_mode, wait_rounds};
use common::redis::{Pki, SentinelSet};
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
    follow_failover(set, &url, "sentinel_password=s3ntinel");
}

/// The same over TLS (`rediss-sentinel://`): the sentinel, the master and the replica speak
/// TLS only, the instances trust the test CA (`tls_ca=`).
#[test]
fn instances_follow_a_failover_over_tls() {
    let pki = Pki::new();
    let set = SentinelSet::start_on(MASTER, Some("m4ster"), None, Some(&pki));
    let url = format!(
        "rediss-sentinel://:m4ster@127.0.0.1:{}/{MASTER}",
        set.sentinel.port
    );
    follow_failover(set, &url, &format!("tls_ca={}", pki.file("ca.pem")));
}

fn follow_failover(set: SentinelSet, url: &str, words: &str) {
    // A new connection asks the sentinel, then opens the master's and checks ROLE: five round
    // trips, which a machine under a load of 20 and more can take longer than 100 ms over.
    let words = format!("{words} interval=200ms timeout=200ms");
    let (a, b) = (instance(url, &words), instance(url, &words));
    wait_mode(&a, "synced", Duration::from_secs(10));
    wait_mode(&b, "synced", Duration::from_secs(10));

    let SentinelSet {
        mut master,
        replica,
        sentinel,
    } = set;
    let killed = Instant::now();
    let killed_unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis()
        .to_string();
    master.kill();
    // Synced again with the promoted replica: both instances' heartbeats there carry a time
    // (Redis's clock, the machine's) after the kill. Nothing else can have written them: the
    // old master is dead, and a replica takes no writes until it is promoted.
    let heartbeats_after_kill = || {
        let reply = replica.cli(&[
            "ZCOUNT",
            "rl:instances",
            &format!("({killed_unix_ms}"),
            "+inf",
        ]);
        reply.trim().parse::<usize>().unwrap_or(0)
    };
    // When the sentinel named the replica (looked at every 200 ms): the rest is the instances'.
    let mut promoted = None;
    for step in 0.. {
        if heartbeats_after_kill() == 2 {
            break;
        }
        if promoted.is_none() && step % 2 == 0 && sentinel.master_port(MASTER) == Some(replica.port)
        {
            promoted = Some(killed.elapsed());
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
        thread::sleep(Duration::from_millis(100));
    }
    let took = killed.elapsed();
    eprintln!(
        "synced with the promoted replica {took:?} after the master was killed (the sentinel \
         named it after {promoted:?})"
    );
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
        wait_mode(nginx, "synced", Duration::from_secs(5));
        let state = sync_state(nginx);
        assert_eq!(state["instances"], 2, "{state}");
    }
}

/// A master name the sentinel does not monitor: logged with the reason, and the failure mode
/// applies; a sentinel password refused: logged as an authentication failure, the password
/// not shown; a sentinel that does not answer: the next one in the URL is asked.
#[test]
fn unknown_master_and_wrong_sentinel_password() {
    let set = SentinelSet::start(MASTER, None, Some("s3ntinel"));
    let port = set.sentinel.port;
    let words = "sentinel_password=s3ntinel interval=200ms timeout=200ms";
    let unknown = instance(&format!("redis-sentinel://127.0.0.1:{port}/nosuch"), words);
    let wrong = instance(
        &format!("redis-sentinel://127.0.0.1:{port}/{MASTER}"),
        "sentinel_password=nope interval=200ms timeout=200ms",
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
    // Logged when it changes: once, unless a connection timed out in between (a loaded
    // machine), after which it is said again.
    assert!(log.contains(said), "{log}");
    let log = wrong.error_log();
    assert!(log.contains("authentication failed"), "{log}");
    assert!(!log.contains("nope"), "{log}");
}

/// A failover the sentinel is asked for (`SENTINEL FAILOVER`): the old master stays up and
/// the instance's connection to it keeps working (the sentinel demotes it only seconds
/// later), but the loop's watcher asks the sentinel every second: the instance heartbeats on
/// the new master within 5 s of its promotion (0.9-1.9 s measured; without the watcher 11.3 s,
/// until the old master was demoted and answered `READONLY`).
#[test]
fn a_demoted_master_is_left_for_the_new_one() {
    let set = SentinelSet::start(MASTER, None, None);
    let url = format!("redis-sentinel://127.0.0.1:{}/{MASTER}", set.sentinel.port);
    let nginx = instance(&url, "interval=200ms timeout=200ms");
    wait_mode(&nginx, "synced", Duration::from_secs(10));
    // The sentinel takes the replica as a candidate once it has read the replica's own INFO
    // (until then: NOGOODSLAVE).
    let asked = Instant::now();
    loop {
        let reply = set.sentinel.cli(&["SENTINEL", "FAILOVER", MASTER]);
        if reply.trim() == "OK" {
            break;
        }
        assert!(reply.starts_with("NOGOODSLAVE"), "{reply}");
        assert!(asked.elapsed() < Duration::from_secs(15), "{reply}");
        thread::sleep(Duration::from_millis(100));
    }
    let asked = Instant::now();
    let unix_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis()
    };
    while !set.replica.cli(&["ROLE"]).starts_with("master") {
        assert!(
            asked.elapsed() < Duration::from_secs(15),
            "the replica was not promoted"
        );
        thread::sleep(Duration::from_millis(50));
    }
    // From now on the new master replicates nothing: a heartbeat it holds from later than
    // this was written to it.
    let promoted_ms = (unix_ms() + 100).to_string();
    let promoted = asked.elapsed();
    let mut demoted = None;
    loop {
        let on_new =
            set.replica
                .cli(&["ZCOUNT", "rl:instances", &format!("({promoted_ms}"), "+inf"]);
        if on_new.trim() == "1" {
            break;
        }
        if demoted.is_none() && set.master.cli(&["ROLE"]).starts_with("slave") {
            demoted = Some(asked.elapsed());
        }
        assert!(
            asked.elapsed() < promoted + Duration::from_secs(5),
            "no heartbeat on the new master 5 s after its promotion: {}\n{}",
            sync_state(&nginx),
            nginx.error_log()
        );
        thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "SENTINEL FAILOVER: replica promoted after {promoted:?}, old master demoted after \
         {demoted:?}, heartbeat on the new master after {:?}",
        asked.elapsed()
    );
    wait_rounds(&nginx, 3, Duration::from_secs(5));
    assert_eq!(sync_state(&nginx)["mode"], "synced");
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
