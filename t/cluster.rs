//! Cluster-wide limits (`rate_limit_sync`): real `redis-server`s started here on free ports,
//! several real nginx instances (two workers each) sharing one limit through them, and real
//! traffic paced from this process. Every wait is bounded; measurements last a few seconds.

mod common;

use std::path::PathBuf;
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread;
use std::time::{Duration, Instant};

use common::fleet::{
    assert_one_limit, fleet, instance_config, instance_config_with, offer, passed_between, ports,
    sync_state, wait_mode, wait_rounds, Answer, AHEAD, BURST, LIMIT_PER_SEC, ZONE,
};
use common::nginx::free_port;
use common::redis::{assert_keys_spread, redis_cluster, Redis, SIGCONT, SIGSTOP};
use common::{check_config, Connection, Nginx, Request};

/// The tests that judge admissions within a few percent of one nginx run alone in this
/// binary: the fleet's rounds must reach Redis within `timeout=`, and a sibling test that
/// loads both cores (three instances, Redis, thousands of requests a second) can make them
/// miss it, which a fleet counts as an outage (a run in CI admitted 0.61 of one nginx that
/// way). Every other test shares the machine with the others.
static MACHINE: RwLock<()> = RwLock::new(());

fn share_machine() -> RwLockReadGuard<'static, ()> {
    MACHINE.read().unwrap_or_else(PoisonError::into_inner)
}

fn own_machine() -> RwLockWriteGuard<'static, ()> {
    MACHINE.write().unwrap_or_else(PoisonError::into_inner)
}

#[test]
fn config_errors_name_the_bad_token() {
    let _machine = share_machine();
    let base = |sync: &str, zone: &str| {
        format!(
            r#"
load_module %%MODULE%%;
events {{ }}
http {{
    {sync}
    rate_limit_zone $binary_remote_addr zone=api:1m {zone};
    server {{ listen 127.0.0.1:%%PORT%%; location / {{ rate_limit zone=api; }} }}
}}
"#
        )
    };
    let sync = "rate_limit_sync redis://127.0.0.1:1;";
    #[rustfmt::skip]
    let rows: &[(String, &str)] = &[
        (base("rate_limit_sync redis://127.0.0.1:1 interval=5ms;", "rate=1r/s sync"),
            "invalid interval \"interval=5ms\""),
        (base("rate_limit_sync redis://127.0.0.1:1 timeout=1s;", "rate=1r/s sync"),
            "invalid timeout \"timeout=1s\""),
        (base("rate_limit_sync redis://127.0.0.1:1 on_failure=maybe;", "rate=1r/s sync"),
            "invalid on_failure \"on_failure=maybe\""),
        (base("rate_limit_sync redis://127.0.0.1:notaport;", "rate=1r/s sync"),
            "invalid Redis URL \"redis://127.0.0.1:notaport\""),
        (base("rate_limit_sync interval=1s;", "rate=1r/s sync"),
            "\"rate_limit_sync\" must have a redis:// URL"),
        (base("rate_limit_sync redis://127.0.0.1:1 redis://127.0.0.1:2;", "rate=1r/s sync"),
            "invalid Redis URL \"redis://127.0.0.1:2\": several URLs need \"cluster\""),
        (base("rate_limit_sync redis://127.0.0.1:1 bogus;", "rate=1r/s sync"),
            "invalid parameter \"bogus\""),
        (base(&format!("{sync} {sync}"), "rate=1r/s sync"),
            "\"rate_limit_sync\" directive is duplicate"),
        (base(sync, "rate=10r/s algorithm=sliding_log sync"),
            "\"sync\" is not supported by sliding_log"),
        (base("", "rate=1r/s sync"),
            "zone \"api\" has \"sync\" but no \"rate_limit_sync\" is configured"),
    ];
    for (config, expected) in rows {
        let (ok, stderr) = check_config(config);
        assert!(!ok, "accepted: {config}");
        assert!(stderr.contains(expected), "{expected:?} not in {stderr}");
    }
    let (ok, stderr) = check_config(&base(
        "rate_limit_sync redis://u:p@127.0.0.1:1/2 interval=250ms timeout=100ms prefix=x: on_failure=open;",
        "rate=1r/s sync",
    ));
    assert!(ok, "{stderr}");
}

/// 10x the limit spread evenly over three instances for 4 s: the fleet admits at most
/// 1.05 L t + burst (each instance alone would admit L t + burst: 3x).
#[test]
fn three_instances_share_one_limit() {
    let _machine = own_machine();
    let redis = Redis::start();
    let fleet = fleet(&redis, 3, "interval=100ms");
    let span = Duration::from_secs(4);
    let answers = offer(&ports(&fleet), 10.0 * LIMIT_PER_SEC / 3.0, span, "k");
    assert_one_limit(&answers, span);
    let state = sync_state(&fleet[0]);
    assert_eq!(state["mode"], "synced", "{state}");
    assert_eq!(state["connected"], true, "{state}");
    assert_eq!(state["instances"], 3, "{state}");
    assert!(
        state["last_sync_age_ms"]
            .as_u64()
            .is_some_and(|age| age < 1000),
        "{state}"
    );
}

/// All the traffic on one instance of three: after the first second it admits >= 0.9 L.
#[test]
fn one_instance_with_all_traffic_reaches_the_limit() {
    let _machine = own_machine();
    let redis = Redis::start();
    let fleet = fleet(&redis, 3, "interval=100ms");
    let span = Duration::from_secs(3);
    let answers = offer(&[fleet[0].port()], 3.0 * LIMIT_PER_SEC, span, "solo");
    let passed = passed_between(&answers, Duration::from_secs(1), span);
    let floor = 0.9 * LIMIT_PER_SEC * 2.0;
    assert!(
        passed as f64 >= floor,
        "admitted {passed} < {floor} after the first second"
    );
    assert!(
        passed as f64 <= 1.05 * LIMIT_PER_SEC * 2.0 + BURST,
        "{passed}"
    );
}

/// Redis traffic does not grow with the request rate: per interval and instance, one
/// pipeline of a heartbeat, two calls per sync zone (its limits, its overrides) and at most
/// one key script call, whatever the keys it carries (read from INFO commandstats). A key well
/// inside its share (here 20 r/s over two instances of a 100r/s limit) is not sent every
/// round; one refused for want of a grant (1000 r/s) is, once per round.
#[test]
fn redis_calls_do_not_grow_with_traffic() {
    let _machine = share_machine();
    let redis = Redis::start();
    let fleet = fleet(&redis, 2, "interval=100ms");
    let calls = |per_sec: f64| {
        let before = redis.calls("evalsha");
        let started = Instant::now();
        offer(&ports(&fleet), per_sec, Duration::from_secs(2), "k");
        (redis.calls("evalsha") - before, started.elapsed())
    };
    let (slow_calls, slow_span) = calls(20.0);
    let (fast_calls, fast_span) = calls(1000.0);
    for (calls, span) in [(slow_calls, slow_span), (fast_calls, fast_span)] {
        // Rounds per instance (+1 for a partial round), two instances, at most four calls
        // in each round's one pipeline.
        let rounds = (span.as_secs_f64() / 0.1).ceil() as u64 + 1;
        assert!(calls <= 2 * 4 * rounds, "{calls} calls in {span:?}");
    }
    let rounds = (fast_span.as_secs_f64() / 0.1).ceil() as u64 + 1;
    assert!(
        fast_calls <= slow_calls + 2 * rounds + 8,
        "{slow_calls} -> {fast_calls}"
    );
}

/// Redis stopped (SIGSTOP) under load for 2 s: no request waits on it (none takes anything
/// near the sync timeout), no 5xx, and with
/// `local_share` the fleet admits at most 1.10 L over the stop; the stop is logged once.
#[test]
fn redis_stopped_under_load_local_share() {
    let _machine = share_machine();
    let redis = Redis::start();
    let fleet = fleet(&redis, 3, "interval=100ms timeout=100ms");
    let ports = ports(&fleet);
    let load = {
        let ports = ports.clone();
        thread::spawn(move || {
            offer(
                &ports,
                10.0 * LIMIT_PER_SEC / 3.0,
                Duration::from_secs(5),
                "k",
            )
        })
    };
    thread::sleep(Duration::from_millis(1050));
    redis.signal(SIGSTOP);
    let stopped_at = Instant::now();
    // local_share after three missed rounds (about 300 ms here): waited for, not assumed.
    wait_mode(&fleet[0], "local_share", Duration::from_millis(1500));
    let stopped = sync_state(&fleet[0]);
    let metrics = common::get(fleet[0].port(), "/ratelimit/metrics").text();
    // Redis stays stopped 2 s in all, the figures below count on it.
    thread::sleep(Duration::from_secs(2).saturating_sub(stopped_at.elapsed()));
    redis.signal(SIGCONT);
    let answers = load.join().expect("load thread");
    assert_eq!(stopped["mode"], "local_share", "{stopped}");
    assert_eq!(stopped["fallback"], true, "{stopped}");
    assert!(
        metrics.contains("rate_limit_sync_fallback{zone=\"api\"} 1"),
        "{metrics}"
    );
    // Recovery within three intervals of Redis answering again.
    wait_mode(&fleet[0], "synced", Duration::from_millis(300));
    assert!(
        answers.iter().all(|a| a.status == 200 || a.status == 429),
        "a request failed"
    );
    // A request path that waited on the stopped Redis would hold every request of the stop
    // for the sync timeout (100 ms) at least, or until Redis came back (up to 2 s). A loaded
    // machine delays a few answers by itself (one took 86 ms at a load average of 13), so
    // the test asks of the many answered during the stop that almost all are quick, and of
    // all that none waited anywhere near the stop.
    let during: Vec<Duration> = answers
        .iter()
        .filter(|a| a.sent >= Duration::from_millis(1100) && a.sent < Duration::from_millis(2900))
        .map(|a| a.latency)
        .collect();
    let slow = during
        .iter()
        .filter(|&&latency| latency >= Duration::from_millis(100))
        .count();
    eprintln!(
        "{slow} of {} answers during the stop took 100 ms or more",
        during.len()
    );
    assert!(
        during.len() >= 200 && slow * 20 <= during.len(),
        "{slow} of {} answers during the stop took 100 ms or more",
        during.len()
    );
    let slowest = answers.iter().map(|a| a.latency).max().unwrap_or_default();
    assert!(
        slowest < Duration::from_millis(1000),
        "slowest answer {slowest:?}"
    );
    // From 0.5 s into the stop (three missed intervals and more) to its end.
    let (from, to) = (Duration::from_millis(1600), Duration::from_millis(3000));
    let passed = passed_between(&answers, from, to);
    let bound = 1.10 * LIMIT_PER_SEC * (to - from).as_secs_f64() + BURST / 3.0 * 3.0;
    assert!(
        passed as f64 <= bound,
        "admitted {passed} > {bound} while Redis was stopped"
    );
    assert!(
        passed as f64 >= 0.5 * LIMIT_PER_SEC * (to - from).as_secs_f64(),
        "{passed}"
    );
    let logs: String = fleet.iter().map(Nginx::error_log).collect();
    let fallbacks = logs.matches("on_failure=local_share in force").count();
    assert_eq!(fallbacks, 3, "one transition logged per instance:\n{logs}");
}

/// Redis killed and restarted empty: the instances reconnect, reload their scripts and the
/// fleet limit holds again within three intervals.
#[test]
fn redis_restarted_empty_reconverges() {
    let _machine = share_machine();
    let mut redis = Redis::start();
    let fleet = fleet(&redis, 3, "interval=100ms");
    offer(&ports(&fleet), 300.0, Duration::from_millis(500), "k");
    redis.kill();
    thread::sleep(Duration::from_millis(500));
    redis.spawn();
    redis.wait_instances(3);
    // Three rounds to converge, then the limit holds.
    for instance in &fleet {
        wait_rounds(instance, 3, Duration::from_secs(5));
    }
    let span = Duration::from_secs(3);
    let answers = offer(&ports(&fleet), 10.0 * LIMIT_PER_SEC / 3.0, span, "k");
    let passed = passed_between(&answers, Duration::ZERO, span);
    let bound = 1.05 * LIMIT_PER_SEC * span.as_secs_f64() + BURST + AHEAD;
    assert!(
        passed as f64 <= bound,
        "fleet admitted {passed} > {bound} after the restart"
    );
    // The zone's overrides (a hash, seeded again after the restart) aside.
    let keys = redis.cli(&["KEYS", "rl:api:*"]);
    assert_eq!(
        keys.lines()
            .filter(|&key| key != "rl:api:overrides")
            .count(),
        1,
        "one Redis key for one nginx key: {keys}"
    );
}

/// With Redis unreachable from the start nginx still starts, logs it once, and applies the
/// failure mode after three intervals: `closed` rejects with Retry-After, `open` admits the
/// whole limit locally.
#[test]
fn unreachable_redis_applies_the_failure_mode() {
    let _machine = share_machine();
    let port = free_port();
    let closed = Nginx::start(&instance_config(
        port,
        "interval=50ms on_failure=closed",
        ZONE,
    ));
    let open = Nginx::start(&instance_config(
        port,
        "interval=50ms on_failure=open",
        ZONE,
    ));
    // Three missed intervals, then the failure mode.
    wait_mode(&closed, "closed", Duration::from_secs(5));
    wait_mode(&open, "open", Duration::from_secs(5));
    let mut connection = Connection::open(closed.port());
    let response = connection.send(&Request::get("/index.html").header("X-Key", "k"));
    assert_eq!(response.status, 429);
    assert!(response.header("Retry-After").is_some());
    let mut connection = Connection::open(open.port());
    let started = Instant::now();
    let statuses: Vec<u16> = (0..30)
        .map(|_| {
            connection
                .send(&Request::get("/index.html").header("X-Key", "k"))
                .status
        })
        .collect();
    // burst=20: 21 pass at once, as without sync, and one more for each 10 ms the 30
    // requests took (100r/s drains meanwhile: on a loaded machine they can take 10-30 ms).
    let drained = (started.elapsed().as_secs_f64() * LIMIT_PER_SEC).floor() as usize;
    let passed = statuses.iter().filter(|&&s| s == 200).count();
    assert!(
        (21..=21 + drained).contains(&passed),
        "{passed} passed, 21 to {} expected: {statuses:?}",
        21 + drained
    );
    let log = closed.error_log();
    assert_eq!(log.matches("cannot connect").count(), 1, "{log}");
    assert_eq!(
        log.matches("on_failure=closed in force").count(),
        1,
        "{log}"
    );
}

/// The instance's heartbeat score (Redis milliseconds) in the fleet's sorted set.
fn heartbeat_ms(redis: &Redis) -> u64 {
    let reply = redis.cli(&["ZRANGE", "rl:instances", "0", "-1", "WITHSCORES"]);
    reply
        .lines()
        .nth(1)
        .and_then(|score| score.trim().parse().ok())
        .unwrap_or(0)
}

/// The loop lives in one worker: when every worker is SIGKILLed a new one takes it over (the
/// instance's heartbeat in Redis moves on), and a reload under load (old and new workers
/// overlapping) keeps one loop that counts nothing twice: the instance alone still admits
/// at least 0.9 L across the reload (a delta counted twice would push the fleet's state
/// ahead and cut it), and at most L t + burst.
#[test]
fn loop_survives_worker_kill_and_reload() {
    let _machine = share_machine();
    let redis = Redis::start();
    let mut fleet = fleet(&redis, 1, "interval=100ms");
    let old = fleet[0].kill_workers();
    fleet[0].wait_workers_replaced(&old);
    let killed_at = heartbeat_ms(&redis);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let after = heartbeat_ms(&redis);
        if after > killed_at + 1000 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "heartbeat stopped: {killed_at} -> {after}"
        );
        thread::sleep(Duration::from_millis(20));
    }

    let port = fleet[0].port();
    let load =
        thread::spawn(move || offer(&[port], 3.0 * LIMIT_PER_SEC, Duration::from_secs(3), "k"));
    thread::sleep(Duration::from_millis(1200));
    fleet[0].reload();
    let answers = load.join().expect("load thread");
    let passed = passed_between(&answers, Duration::from_secs(1), Duration::from_secs(3));
    let floor = 0.9 * LIMIT_PER_SEC * 2.0;
    assert!(
        passed as f64 >= floor,
        "admitted {passed} < {floor} across the reload"
    );
    let all = passed_between(&answers, Duration::ZERO, Duration::from_secs(3));
    let bound = 1.05 * LIMIT_PER_SEC * 3.0 + BURST + AHEAD;
    assert!(all as f64 <= bound, "admitted {all} > {bound}");
}

/// Polls (bounded by `within`) until `nginx`'s zone `api` has `rate`; returns how long it took.
fn wait_rate(nginx: &Nginx, rate: &str, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let response = common::get(nginx.port(), "/ratelimit/zones/api");
        let zone: serde_json::Value = serde_json::from_str(&response.text()).expect("zone JSON");
        if zone["rate"] == rate {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "rate still {} after {within:?}, not {rate}",
            zone["rate"]
        );
        thread::sleep(Duration::from_millis(5));
    }
}

/// A PATCH on one instance's admin API reaches the others within two intervals (plus the
/// scheduling of a loaded machine), an instance started later takes it too, and a reload
/// with an edited file makes the file's value the fleet's, as on one instance.
#[test]
fn admin_change_reaches_the_fleet_and_survives_restarts() {
    let _machine = share_machine();
    let redis = Redis::start();
    let mut fleet = fleet(&redis, 2, "interval=100ms");
    let patch =
        Request::new("PATCH", "/ratelimit/zones/api").json(r#"{"rate": "50r/s", "burst": 5}"#);
    assert_eq!(common::send(fleet[0].port(), &patch).status, 200);
    let took = wait_rate(&fleet[1], "50r/s", Duration::from_millis(500));
    eprintln!("PATCH reached the other instance in {took:?}");
    // A new instance with the same file takes the fleet's value.
    let late = Nginx::start(&instance_config(redis.port, "interval=100ms", ZONE));
    wait_rate(&late, "50r/s", Duration::from_millis(1000));
    // The file edited and reloaded on one instance: its value becomes the fleet's.
    fleet[1].reload_with(&instance_config(
        redis.port,
        "interval=100ms",
        "rate=30r/s burst=20",
    ));
    wait_rate(&fleet[0], "30r/s", Duration::from_millis(1000));
    wait_rate(&late, "30r/s", Duration::from_millis(1000));
}

/// AUTH with a password (`requirepass`) and with an ACL user, each in its URL; a wrong
/// password is logged once as such and the failure mode applies.
#[test]
fn auth_with_password_and_acl_user() {
    let _machine = share_machine();
    let redis = Redis::start_with(&["--requirepass", "s3cret"]);
    redis.cli(&["ACL", "SETUSER", "syncer", "on", ">pw", "~rl:*", "+@all"]);
    let with_url = |url: &str| {
        instance_config(redis.port, "interval=50ms", ZONE).replace(
            &format!("redis://127.0.0.1:{}", redis.port),
            &url.replace("PORT", &redis.port.to_string()),
        )
    };
    let password = Nginx::start(&with_url("redis://:s3cret@127.0.0.1:PORT"));
    let user = Nginx::start(&with_url("redis://syncer:pw@127.0.0.1:PORT"));
    let wrong = Nginx::start(&with_url("redis://syncer:nope@127.0.0.1:PORT"));
    redis.wait_instances(2);
    wait_mode(&password, "synced", Duration::from_secs(5));
    wait_mode(&user, "synced", Duration::from_secs(5));
    wait_mode(&wrong, "local_share", Duration::from_secs(5));
    let log = wrong.error_log();
    assert_eq!(log.matches("authentication failed").count(), 1, "{log}");
    assert!(!log.contains("nope"), "the password is not logged: {log}");
}

/// Every algorithm that can sync holds one limit across the fleet: a token bucket (K = burst)
/// `burst=20 delay=5` on the line: over two instances offered 1.5 L for 3 s, the fleet admits
/// about L t (the excess beyond delay=5 is delayed, the rest rejected), requests are delayed
/// by the fleet's backlog (some wait tens of milliseconds), and none waits much longer than
/// the longest delay the line allows, (20 - 5) x 10 ms, plus one interval.
#[test]
fn delay_follows_the_fleet_backlog() {
    let _machine = share_machine();
    let redis = Redis::start();
    let fleet: Vec<Nginx> = (0..2)
        .map(|_| {
            Nginx::start(&instance_config_with(
                redis.port,
                "interval=100ms",
                "rate=100r/s",
                "burst=20 delay=5",
            ))
        })
        .collect();
    redis.wait_instances(2);
    let span = Duration::from_secs(3);
    let answers = offer(&ports(&fleet), 0.75 * LIMIT_PER_SEC, span, "d");
    let passed = passed_between(&answers, Duration::ZERO, span);
    assert!(answers.iter().all(|a| a.status == 200 || a.status == 429));
    let secs = span.as_secs_f64();
    assert!(
        passed as f64 <= 1.05 * LIMIT_PER_SEC * secs + 21.0 + AHEAD,
        "{passed}"
    );
    assert!(passed as f64 >= 0.8 * LIMIT_PER_SEC * secs, "{passed}");
    let mut delays: Vec<Duration> = answers
        .iter()
        .filter(|a| a.status == 200)
        .map(|a| a.latency)
        .collect();
    delays.sort();
    let longest = delays.last().copied().unwrap_or_default();
    let delayed = delays
        .iter()
        .filter(|&&d| d >= Duration::from_millis(30))
        .count();
    eprintln!("{delayed} of {passed} waited 30 ms or more, the longest {longest:?}");
    assert!(
        delayed >= 20,
        "requests beyond delay=5 are delayed: {delayed}"
    );
    // The longest delay the line allows, (20 - 5) x 10 ms, plus one interval and a margin:
    // asked of the 99th percentile, since a loaded machine adds its own wait to a few answers
    // (one took 1.96 s at a load average of 13); a delay that followed the fleet's backlog
    // beyond the line's bound would hold far more than 1% of them.
    let bound = Duration::from_millis(150 + 100 + 400);
    let beyond = delays.iter().filter(|&&d| d >= bound).count();
    assert!(
        beyond * 100 <= delays.len(),
        "{beyond} of {} passed requests waited {bound:?} or more, the longest {longest:?}",
        delays.len()
    );
}

/// A slot migrated under load, as `redis-cli --cluster reshard` does it: the hot key's slot
/// is set MIGRATING/IMPORTING, the key MIGRATEd, and for a second every round meets `ASK`;
/// then the slot is given to its new node and the old one answers `MOVED`. The loop follows
/// both within the round (`ASKING` on the new node, the slot map read again after `MOVED`):
/// no round fails, the instances stay synced, the key lives on the new node, and the limit
/// holds through the move.
#[test]
fn a_slot_migrated_under_load_costs_no_sync() {
    let _machine = share_machine();
    let nodes = redis_cluster();
    // The whole interval for a round (the default is half): a migration under load on a
    // shared machine can hold a node for tens of milliseconds, a timeout, not a routing failure.
    let fleet = fleet(&nodes[0], 2, "cluster interval=100ms timeout=100ms");
    let ports = ports(&fleet);
    let span = Duration::from_secs(4);
    let load = thread::spawn(move || offer(&ports, LIMIT_PER_SEC, span, "moving"));
    thread::sleep(Duration::from_millis(500));
    let (from, name) = nodes
        .iter()
        .enumerate()
        .find_map(|(at, node)| {
            let keys = node.cli(&["KEYS", "rl:api:*"]);
            let key = keys
                .lines()
                .find(|key| !key.ends_with(":limits") && !key.ends_with(":overrides"))?;
            Some((at, key.to_string()))
        })
        .expect("the loaded key is in the cluster");
    let to = (from + 1) % nodes.len();
    let slot = nodes[from].cli(&["CLUSTER", "KEYSLOT", &name]);
    let slot = slot.trim();
    let id = |at: usize| nodes[at].cli(&["CLUSTER", "MYID"]).trim().to_string();
    let (from_id, to_id) = (id(from), id(to));
    let errors = |fleet: &[Nginx]| -> Vec<u64> {
        fleet
            .iter()
            .map(|n| sync_state(n)["errors"].as_u64().expect("errors"))
            .collect()
    };
    let errors_before = errors(&fleet);
    let asking_before = nodes[to].calls("asking");
    let ok = |reply: String| assert_eq!(reply.trim(), "OK", "{reply}");
    ok(nodes[to].cli(&["CLUSTER", "SETSLOT", slot, "IMPORTING", &from_id]));
    ok(nodes[from].cli(&["CLUSTER", "SETSLOT", slot, "MIGRATING", &to_id]));
    let to_port = nodes[to].port.to_string();
    ok(nodes[from].cli(&["MIGRATE", "127.0.0.1", &to_port, &name, "0", "5000"]));
    thread::sleep(Duration::from_secs(1));
    for at in [to, from, (from + 2) % nodes.len()] {
        ok(nodes[at].cli(&["CLUSTER", "SETSLOT", slot, "NODE", &to_id]));
    }
    let answers = load.join().expect("load thread");
    let asked = nodes[to].calls("asking") - asking_before;
    eprintln!("{asked} commands asked {to_port} during the migration");
    assert!(asked >= 10, "the rounds did not meet ASK: {asked}");
    let states: Vec<String> = fleet
        .iter()
        .map(|n| {
            let errors: String = n
                .error_log()
                .lines()
                .filter(|line| line.contains("rate_limit_sync"))
                .map(|line| format!("{line}\n"))
                .collect();
            format!("{}\n{errors}", sync_state(n))
        })
        .collect();
    // Following ASK and MOVED costs no round. A round may still run out of its 100 ms on a
    // loaded 2-core machine while the nodes move the key (MIGRATE blocks them) and the
    // suite's other tests run: one time-out per instance is allowed, no other error.
    for (instance, (after, before)) in errors(&fleet).iter().zip(&errors_before).enumerate() {
        assert!(
            after - before <= 1,
            "instance {instance}: {} rounds failed during the move: {states:#?}",
            after - before
        );
    }
    let routing_errors: Vec<&str> = states
        .iter()
        .flat_map(|state| state.lines())
        .filter(|line| line.contains("[error]") && !line.ends_with("\": timed out"))
        .collect();
    assert!(
        routing_errors.is_empty(),
        "a round failed during the move: {states:#?}"
    );
    for instance in &fleet {
        assert_eq!(sync_state(instance)["mode"], "synced");
    }
    assert_eq!(nodes[to].cli(&["KEYS", &name]).trim(), name);
    assert_eq!(nodes[from].cli(&["KEYS", &name]).trim(), "");
    assert_one_limit(&answers, span);
}

/// Scripts flushed from Redis (`SCRIPT FLUSH`, as after a failover to a fresh replica) under
/// load: the next round meets `NOSCRIPT`, the one after loads the scripts again in its
/// pipeline; the instances stay synced (one round missed at most) and the limit holds.
#[test]
fn scripts_flushed_under_load_are_loaded_again() {
    let _machine = share_machine();
    let redis = Redis::start();
    let fleet = fleet(&redis, 2, "interval=100ms");
    let ports = ports(&fleet);
    let span = Duration::from_secs(3);
    let load = thread::spawn(move || offer(&ports, LIMIT_PER_SEC, span, "flushed"));
    thread::sleep(Duration::from_millis(1000));
    let loads_before = redis.calls("script|load");
    assert_eq!(redis.cli(&["SCRIPT", "FLUSH"]).trim(), "OK");
    let answers = load.join().expect("load thread");
    let loads = redis.calls("script|load") - loads_before;
    assert!(loads >= 3, "the scripts were not loaded again: {loads}");
    for instance in &fleet {
        let state = sync_state(instance);
        assert_eq!(state["mode"], "synced", "{state}");
        assert!(
            state["last_sync_age_ms"]
                .as_u64()
                .is_some_and(|age| age < 1000),
            "{state}"
        );
    }
    assert_one_limit(&answers, span);
}

/// How far the one loaded key's fleet state (its TAT in Redis) stands ahead of Redis's clock,
/// in ms (bounded wait for the key to be there).
fn fleet_lead_ms(redis: &Redis) -> f64 {
    let started = Instant::now();
    loop {
        let keys = redis.cli(&["KEYS", "rl:api:*"]);
        let key = keys.lines().map(str::trim).find(|key| {
            !key.is_empty() && !key.ends_with(":limits") && !key.ends_with(":overrides")
        });
        let tat = key.and_then(|key| redis.cli(&["HGET", key, "t"]).trim().parse::<f64>().ok());
        if let Some(tat_us) = tat {
            let time = redis.cli(&["TIME"]);
            let mut time = time
                .lines()
                .map(|line| line.trim().parse::<f64>().unwrap_or(0.0));
            let now_us = time.next().unwrap_or(0.0) * 1e6 + time.next().unwrap_or(0.0);
            return (tat_us - now_us) / 1000.0;
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "no fleet state: {keys}"
        );
        thread::sleep(Duration::from_millis(5));
    }
}

/// Redis stalled (SIGSTOP) for 0.6 s right after a burst of 60 (more than half of what the
/// instance may take alone, so the key is sent in the next round): that round times out with
/// the key's delta, the stopped server queues what reached it, and runs it when it resumes;
/// the rounds after it send no key until Redis answers, then the next one sends the delta
/// again, listing the send it carries. Each request is still charged once: from the resume
/// on (Redis's clock), the key's fleet state stands about 60 x 100 ms ahead (less the interval
/// it is charged from), not a multiple of it (measured before the once-only charge: twice).
#[test]
fn a_stalled_redis_charges_each_request_once() {
    let _machine = share_machine();
    let redis = Redis::start();
    let nginx = Nginx::start(&instance_config(
        redis.port,
        "interval=100ms timeout=50ms",
        "rate=10r/s burst=100",
    ));
    redis.wait_instances(1);
    wait_mode(&nginx, "synced", Duration::from_secs(3));
    redis.signal(SIGSTOP);
    assert_eq!(burst(&[nginx.port()], 60, "once"), 60);
    thread::sleep(Duration::from_millis(600));
    redis.signal(SIGCONT);
    let resumed = Instant::now();
    wait_mode(&nginx, "synced", Duration::from_secs(3));
    // Let the rounds after the resume run (a resent delta would land in one of them).
    wait_rounds(&nginx, 3, Duration::from_secs(5));
    let ahead_ms = fleet_lead_ms(&redis);
    let once_ms = 6000.0 - 100.0 - resumed.elapsed().as_secs_f64() * 1000.0;
    eprintln!(
        "60 requests: the fleet state is {ahead_ms:.0} ms ahead, {once_ms:.0} ms if charged once"
    );
    assert!(
        (ahead_ms - once_ms).abs() < 1000.0,
        "{ahead_ms:.0} ms ahead, not {once_ms:.0} ms: charged more than once, or not at all"
    );
}

/// Sends `per_port` requests for `key` back to back on one keep-alive connection per port,
/// all ports at once. Returns how many passed (every answer must be 200 or 429).
fn burst(ports: &[u16], per_port: usize, key: &str) -> usize {
    let threads: Vec<_> = ports
        .iter()
        .map(|&port| {
            let key = key.to_string();
            thread::spawn(move || {
                let mut connection = Connection::open(port);
                let request = Request::get("/index.html").header("X-Key", &key);
                (0..per_port)
                    .map(|_| connection.send(&request).status)
                    .collect::<Vec<u16>>()
            })
        })
        .collect();
    let statuses: Vec<u16> = threads
        .into_iter()
        .flat_map(|thread| thread.join().expect("burst thread panicked"))
        .collect();
    assert!(
        statuses.iter().all(|&s| s == 200 || s == 429),
        "{statuses:?}"
    );
    statuses.iter().filter(|&&s| s == 200).count()
}

/// limit_req's way: the zone gives the rate, the `rate_limit` line the burst. The fleet's
/// bucket for a key is the line's (burst=20 here, the zone's is 0): after a steady 0.4 L on
/// two instances keeps the key synced, a burst of 40 spread over both gets about K = 21 plus
/// the interval's drain granted ahead (L x 100 ms), far more than the zone's own K = 1 would
/// give (about 11), and no more than K plus that drain (+ a margin for the burst's length).
#[test]
fn location_burst_is_the_fleet_bucket() {
    let _machine = share_machine();
    let redis = Redis::start();
    let fleet: Vec<Nginx> = (0..2)
        .map(|_| {
            Nginx::start(&instance_config_with(
                redis.port,
                "interval=100ms",
                "rate=100r/s",
                "burst=20 nodelay",
            ))
        })
        .collect();
    redis.wait_instances(2);
    let ports = ports(&fleet);
    let warm = offer(&ports, 0.2 * LIMIT_PER_SEC, Duration::from_secs(1), "b");
    assert!(
        warm.iter().all(|a| a.status == 200),
        "the warm-up is below the limit"
    );
    let passed = burst(&ports, 20, "b");
    eprintln!("burst: {passed} of 40 passed");
    assert!(
        passed >= 21,
        "the line's burst=20 was not the fleet's: {passed} passed"
    );
    assert!(passed as f64 <= 21.0 + AHEAD + 6.0, "{passed} passed");
}

/// and a sliding window (bounded fleet-wide by a bucket of N at N per window), 10x spread
/// over three instances for 3 s: at most 1.05 L t + K + L interval (the room is granted one
/// interval ahead), and most of L t passes.
#[test]
fn token_bucket_and_sliding_window_share_one_limit() {
    let _machine = share_machine();
    #[rustfmt::skip]
    let rows = [
        ("rate=100r/s burst=20 algorithm=token_bucket", 20.0),
        ("rate=100r/s algorithm=sliding_window", 100.0),
    ];
    for (zone_words, capacity) in rows {
        let redis = Redis::start();
        let fleet: Vec<Nginx> = (0..3)
            .map(|_| Nginx::start(&instance_config(redis.port, "interval=100ms", zone_words)))
            .collect();
        redis.wait_instances(3);
        let span = Duration::from_secs(3);
        let answers = offer(&ports(&fleet), 10.0 * LIMIT_PER_SEC / 3.0, span, "k");
        let passed = passed_between(&answers, Duration::ZERO, span) as f64;
        let limit_t = LIMIT_PER_SEC * span.as_secs_f64();
        // One interval's drain (L I = 10) is granted ahead of time on top of the bucket.
        let bound = 1.05 * limit_t + capacity + AHEAD;
        assert!(
            passed <= bound,
            "{zone_words}: fleet admitted {passed} > {bound}"
        );
        assert!(passed >= 0.8 * limit_t, "{zone_words}: only {passed}");
    }
}

/// Redis Cluster: three instances share one limit through three masters, one pipeline per
/// node per round (each node's `evalsha` calls stay within its rounds), and the keys of one
/// zone spread over the nodes.
#[test]
fn redis_cluster_shares_one_limit() {
    let _machine = share_machine();
    let nodes = redis_cluster();
    let fleet = fleet(&nodes[0], 3, "cluster interval=100ms");
    // Every instance syncs. Not necessarily at this very instant: on a machine loaded far
    // beyond its cores a round can miss its 50 ms timeout, which says "degraded" until the
    // next round answers (a load average of 13 showed it).
    for instance in &fleet {
        wait_mode(instance, "synced", Duration::from_secs(10));
    }
    // A few keys, one request each: their Redis keys land on several nodes.
    for key in 0..24 {
        let response = common::send(
            fleet[0].port(),
            &Request::get("/index.html").header("X-Key", &format!("spread-{key}")),
        );
        assert_eq!(response.status, 200);
    }
    let before: Vec<u64> = nodes.iter().map(|n| n.calls("evalsha")).collect();
    let started = Instant::now();
    let span = Duration::from_secs(3);
    let answers = offer(&ports(&fleet), 10.0 * LIMIT_PER_SEC / 3.0, span, "k");
    let elapsed = started.elapsed().as_secs_f64();
    assert_one_limit(&answers, span);
    // Per node: three instances, each round at most the heartbeat, the zone's limits and
    // overrides and the one loaded key (when they live there).
    let rounds = (elapsed / 0.1).ceil() as u64 + 1;
    for (node, before) in nodes.iter().zip(before) {
        let calls = node.calls("evalsha") - before;
        assert!(
            calls <= 3 * 4 * rounds,
            "{calls} calls on one node in {elapsed:.1} s"
        );
    }
    assert_keys_spread(&nodes);
}

/// Requests admitted while Redis was stopped are charged to the fleet once it answers: the
/// key's fleet state in Redis is then ahead by what the instance admitted during the outage,
/// up to the bound Redis keeps (two buckets and one interval ahead of its clock).
#[test]
fn consumption_during_an_outage_is_carried_over() {
    let _machine = share_machine();
    let redis = Redis::start();
    let fleet = fleet(&redis, 1, "interval=100ms timeout=50ms on_failure=open");
    // One request of the key, then an instance synced with Redis before the outage. (The
    // key stays within its share, so it is not sent to Redis yet: the outage's requests are
    // what the first round after it carries.)
    let one = Request::get("/index.html").header("X-Key", "k");
    assert_eq!(common::send(fleet[0].port(), &one).status, 200);
    wait_mode(&fleet[0], "synced", Duration::from_secs(5));
    wait_rounds(&fleet[0], 2, Duration::from_secs(5));
    redis.signal(SIGSTOP);
    let answers = offer(
        &[fleet[0].port()],
        3.0 * LIMIT_PER_SEC,
        Duration::from_secs(1),
        "k",
    );
    let admitted = answers.iter().filter(|a| a.status == 200).count();
    redis.signal(SIGCONT);
    assert!(
        admitted >= 100,
        "only {admitted} admitted during the outage"
    );
    // The instance is synced again with the first round Redis answers. That round may be
    // one composed while Redis was stopped, which sends no key (a loaded machine showed it:
    // the state read right then was -14 ms ahead); the round after it pushes the carried
    // delta. Over 100 requests at 10 ms each were charged; Redis keeps a key at most
    // 2 K T + I = 520 ms ahead (the bound on what an outage carries over). Polled from the
    // resume on, the state rises to well ahead within a few rounds of it; dropped deltas
    // would leave it at 0 for good (the one request before the outage drained long ago).
    wait_mode(&fleet[0], "synced", Duration::from_secs(2));
    let resumed = Instant::now();
    let mut ahead_ms = fleet_lead_ms(&redis);
    while ahead_ms < 250.0 && resumed.elapsed() < Duration::from_secs(1) {
        thread::sleep(Duration::from_millis(10));
        ahead_ms = fleet_lead_ms(&redis);
    }
    eprintln!(
        "after the outage: {admitted} admitted, fleet state {ahead_ms:.0} ms ahead {:?} \
         after the instance synced again",
        resumed.elapsed()
    );
    assert!(
        ahead_ms >= 250.0,
        "fleet state only {ahead_ms:.0} ms ahead 1 s after the instance synced again, after \
         {admitted} requests"
    );
}

// --- per-key overrides shared by the fleet ----------------------------------------------------

/// [`instance_config`] with a state file at `path` (workers as root, to write it).
fn instance_with_state(redis_port: u16, path: &std::path::Path) -> String {
    instance_config(redis_port, "interval=100ms", ZONE)
        .replace("worker_processes 2;", "worker_processes 2;\nuser root;")
        .replace(
            "rate_limit_sync",
            &format!(
                "rate_limit_state_file {};\n    rate_limit_sync",
                path.display()
            ),
        )
}

/// Two instances with state files, both seen in a fresh Redis: (Redis, the files' directory,
/// A, B).
fn pair_with_state() -> (Redis, StateDir, Nginx, Nginx) {
    let redis = Redis::start();
    let dir = StateDir::new();
    let a = Nginx::start(&instance_with_state(redis.port, &dir.file("a.json")));
    let b = Nginx::start(&instance_with_state(redis.port, &dir.file("b.json")));
    redis.wait_instances(2);
    (redis, dir, a, b)
}

/// `GET zones/api/overrides` of one instance.
fn overrides_of(nginx: &Nginx) -> serde_json::Value {
    let response = common::get(nginx.port(), "/ratelimit/zones/api/overrides");
    assert_eq!(response.status, 200, "{}", response.text());
    serde_json::from_str(&response.text()).expect("overrides JSON")
}

/// Polls (bounded by `within`) until `nginx`'s override of `key` is `wanted` (`Null`: none);
/// returns how long it took.
fn wait_override(
    nginx: &Nginx,
    key: &str,
    wanted: serde_json::Value,
    within: Duration,
) -> Duration {
    let started = Instant::now();
    loop {
        let seen = overrides_of(nginx)[key].clone();
        if seen == wanted {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "override of {key:?} still {seen} after {within:?}, not {wanted}"
        );
        thread::sleep(Duration::from_millis(5));
    }
}

fn put_override(nginx: &Nginx, key: &str, body: &str) -> u16 {
    let path = format!("/ratelimit/zones/api/overrides/{key}");
    common::send(nginx.port(), &Request::new("PUT", &path).json(body)).status
}

fn delete_override(nginx: &Nginx, key: &str) -> u16 {
    let path = format!("/ratelimit/zones/api/overrides/{key}");
    common::send(nginx.port(), &Request::new("DELETE", &path)).status
}

/// Statuses of `count` back-to-back requests for `key`.
fn statuses_for(nginx: &Nginx, key: &str, count: usize) -> Vec<u16> {
    let mut connection = Connection::open(nginx.port());
    let request = Request::get("/index.html").header("X-Key", key);
    (0..count)
        .map(|_| connection.send(&request).status)
        .collect()
}

/// Two intervals (100 ms each) for a change to reach another instance, plus a wide margin
/// for a loaded 2-core machine.
const OVERRIDE_WITHIN: Duration = Duration::from_millis(1500);

/// A temporary directory for the instances' state files, removed on drop.
struct StateDir(PathBuf);

impl StateDir {
    fn new() -> StateDir {
        let dir = std::env::temp_dir().join(format!(
            "ngx-rate-limit-ovr-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("cannot create the state directory");
        StateDir(dir)
    }

    fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for StateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An override set on one instance is listed and enforced by another within two intervals;
/// one deleted there is gone on the first; bad input is refused as on one instance and
/// reaches nobody; a key too long for the fleet stays on its instance.
#[test]
fn override_reaches_the_fleet_and_its_removal_too() {
    let _machine = share_machine();
    let (redis, _dir, a, b) = pair_with_state();
    // Before: the zone's 100r/s burst=20 lets ten requests of the key through on B.
    assert_eq!(statuses_for(&b, "vip", 10), vec![200; 10]);

    assert_eq!(
        put_override(&a, "vip", r#"{"rate": "1r/s", "burst": 0}"#),
        201
    );
    let took = wait_override(
        &b,
        "vip",
        serde_json::json!({"rate": "1r/s", "burst": 0}),
        OVERRIDE_WITHIN,
    );
    eprintln!("override PUT reached the other instance in {took:?}");
    // B enforces it: under 1r/s burst=0, what follows a request back to back is a 429.
    let statuses = statuses_for(&b, "vip", 5);
    assert_eq!(
        statuses[1..],
        [429; 4],
        "B does not enforce 1r/s: {statuses:?}"
    );

    assert_eq!(delete_override(&b, "vip"), 204);
    let took = wait_override(&a, "vip", serde_json::Value::Null, OVERRIDE_WITHIN);
    eprintln!("override DELETE reached the other instance in {took:?}");
    assert_eq!(overrides_of(&b), serde_json::json!({}));

    // More of them, at various phases of the rounds, each way.
    let mut took = Vec::new();
    for n in 0..8 {
        let (from, to) = if n % 2 == 0 { (&a, &b) } else { (&b, &a) };
        let key = format!("m{n}");
        assert_eq!(
            put_override(from, &key, r#"{"rate": "7r/s", "burst": 1}"#),
            201
        );
        let wanted = serde_json::json!({"rate": "7r/s", "burst": 1});
        took.push(wait_override(to, &key, wanted, OVERRIDE_WITHIN));
        assert_eq!(delete_override(to, &key), 204);
        took.push(wait_override(
            from,
            &key,
            serde_json::Value::Null,
            OVERRIDE_WITHIN,
        ));
        thread::sleep(Duration::from_millis(23 * n));
    }
    took.sort_unstable();
    eprintln!(
        "16 changes reached the other instance in {:?} (median {:?}, max {:?})",
        took.first().unwrap(),
        took[took.len() / 2],
        took.last().unwrap()
    );

    // Bad input is refused as before, and nothing reaches Redis or the other instance.
    assert_eq!(put_override(&a, "bad", r#"{"rate": "fast"}"#), 400);
    assert_eq!(put_override(&a, "bad", r#"{"burst": 3}"#), 400);
    assert_eq!(delete_override(&a, "never-set"), 404);
    // A key longer than 256 bytes is kept by its instance only.
    let long = "L".repeat(300);
    assert_eq!(
        put_override(&a, &long, r#"{"rate": "2r/s", "burst": 0}"#),
        201
    );
    // And a short one set after it shows that rounds went by.
    assert_eq!(
        put_override(&a, "marker", r#"{"rate": "3r/s", "burst": 0}"#),
        201
    );
    wait_override(
        &b,
        "marker",
        serde_json::json!({"rate": "3r/s", "burst": 0}),
        OVERRIDE_WITHIN,
    );
    wait_rounds(&b, 3, Duration::from_secs(5));
    let on_b = overrides_of(&b);
    assert!(
        on_b.get("bad").is_none() && on_b.get(&long).is_none(),
        "{on_b}"
    );
    let on_a = overrides_of(&a);
    assert_eq!(
        on_a[&long],
        serde_json::json!({"rate": "2r/s", "burst": 0}),
        "the fleet took A's long key away: {on_a}"
    );
    let fields = redis.cli(&["HKEYS", "rl:api:overrides"]);
    let mut fields: Vec<&str> = fields.lines().collect();
    fields.sort_unstable();
    assert_eq!(fields, ["kmarker", "v"], "Redis holds: {fields:?}");
}

/// An instance restarted with its state file takes the fleet's overrides: one set while it
/// was down arrives, one deleted while it was down does not come back (from its file), and
/// Redis restarted empty is seeded again with the fleet's overrides.
#[test]
fn overrides_survive_restarts_of_instances_and_redis() {
    let _machine = share_machine();
    let mut redis = Redis::start();
    let dir = StateDir::new();
    let a = Nginx::start(&instance_with_state(redis.port, &dir.file("a.json")));
    let b_config = instance_with_state(redis.port, &dir.file("b.json"));
    let b = Nginx::start(&b_config);
    redis.wait_instances(2);
    let one = serde_json::json!({"rate": "1r/s", "burst": 0});
    let five = serde_json::json!({"rate": "5r/s", "burst": 2});
    assert_eq!(
        put_override(&a, "gone", r#"{"rate": "1r/s", "burst": 0}"#),
        201
    );
    assert_eq!(
        put_override(&a, "kept", r#"{"rate": "5r/s", "burst": 2}"#),
        201
    );
    wait_override(&b, "gone", one.clone(), OVERRIDE_WITHIN);
    wait_override(&b, "kept", five.clone(), OVERRIDE_WITHIN);
    b.stop();
    // B's state file has what the fleet gave it.
    let saved = std::fs::read_to_string(dir.file("b.json")).expect("B's state file");
    assert!(
        saved.contains("\"gone\"") && saved.contains("\"kept\""),
        "{saved}"
    );

    // While B is down: one removed, one added.
    assert_eq!(delete_override(&a, "gone"), 204);
    assert_eq!(
        put_override(&a, "late", r#"{"rate": "1r/s", "burst": 0}"#),
        201
    );
    let pushed = Instant::now();
    while redis.cli(&["HEXISTS", "rl:api:overrides", "klate"]).trim() != "1" {
        assert!(
            pushed.elapsed() < OVERRIDE_WITHIN,
            "A never pushed its change"
        );
        thread::sleep(Duration::from_millis(10));
    }
    let b = Nginx::start(&b_config);
    let took = wait_override(&b, "late", one.clone(), OVERRIDE_WITHIN);
    eprintln!("restarted instance had the fleet's overrides {took:?} after its start");
    // Rounds later, still the fleet's map on both (the file's "gone" did not come back).
    wait_rounds(&a, 3, Duration::from_secs(5));
    wait_rounds(&b, 3, Duration::from_secs(5));
    let expected = serde_json::json!({"kept": five, "late": one});
    assert_eq!(overrides_of(&b), expected);
    assert_eq!(overrides_of(&a), expected);

    // Redis restarted empty: the instances seed it again with the fleet's overrides.
    redis.kill();
    thread::sleep(Duration::from_millis(300));
    redis.spawn();
    let restarted = Instant::now();
    loop {
        let mut fields: Vec<String> = redis
            .cli(&["HKEYS", "rl:api:overrides"])
            .lines()
            .map(str::to_string)
            .collect();
        fields.sort_unstable();
        if fields == ["kkept", "klate", "v"] {
            break;
        }
        assert!(
            restarted.elapsed() < Duration::from_secs(3),
            "Redis not seeded again: {fields:?}"
        );
        thread::sleep(Duration::from_millis(10));
    }
    eprintln!(
        "Redis seeded again {:?} after its restart",
        restarted.elapsed()
    );
    // And changes flow again.
    assert_eq!(delete_override(&b, "kept"), 204);
    wait_override(&a, "kept", serde_json::Value::Null, OVERRIDE_WITHIN);
    assert_eq!(overrides_of(&a), serde_json::json!({"late": one}));
}

/// Instances started while Redis does not answer: an override set on one of them then is
/// not lost when Redis answers, even though the fleet already has a map (which a restarted
/// instance otherwise takes), and it reaches the others.
#[test]
fn override_set_before_redis_answers_reaches_the_fleet() {
    let _machine = share_machine();
    let redis = Redis::start();
    // The fleet's map exists (empty), as when other instances seeded it earlier.
    redis.cli(&["HSET", "rl:api:overrides", "v", "1"]);
    redis.signal(SIGSTOP);
    let dir = StateDir::new();
    let a = Nginx::start(&instance_with_state(redis.port, &dir.file("a.json")));
    let b = Nginx::start(&instance_with_state(redis.port, &dir.file("b.json")));
    assert_eq!(
        put_override(&a, "early", r#"{"rate": "2r/s", "burst": 0}"#),
        201
    );
    thread::sleep(Duration::from_millis(300));
    redis.signal(SIGCONT);
    let two = serde_json::json!({"rate": "2r/s", "burst": 0});
    let took = wait_override(&b, "early", two.clone(), Duration::from_secs(3));
    eprintln!("override set while Redis was stopped reached the other instance {took:?} after");
    wait_rounds(&a, 3, Duration::from_secs(5));
    assert_eq!(overrides_of(&a), serde_json::json!({"early": two}));
    assert_eq!(
        redis.cli(&["HGET", "rl:api:overrides", "kearly"]).trim(),
        ratelimit_core::Limits {
            rate: ratelimit_core::Rate::parse("2r/s").unwrap(),
            burst: 0
        }
        .pack()
        .to_string(),
        "Redis holds the packed limits"
    );
}

/// An instance whose override table is full cannot apply the fleet's new override: it logs
/// it, and does not push the key's absence back as a removal (the others keep it).
#[test]
fn a_full_override_table_does_not_remove_the_fleets_override() {
    let _machine = share_machine();
    let (redis, _dir, a, b) = pair_with_state();
    // Fill B with overrides of keys too long for the fleet (they stay on B).
    let mut full = false;
    let mut connection = Connection::open(b.port());
    for n in 0..600 {
        let key = format!("{n:0>300}");
        let path = format!("/ratelimit/zones/api/overrides/{key}");
        let request = Request::new("PUT", &path).json(r#"{"rate": "2r/s"}"#);
        match connection.send(&request).status {
            201 => {}
            507 => {
                full = true;
                break;
            }
            status => panic!("PUT of a long key: {status}"),
        }
    }
    assert!(full, "B's override table never filled");
    assert_eq!(
        put_override(&a, "x", r#"{"rate": "1r/s", "burst": 0}"#),
        201
    );
    let started = Instant::now();
    while !b
        .error_log()
        .contains("has no room for the fleet's override of key \"x\"")
    {
        assert!(
            started.elapsed() < OVERRIDE_WITHIN,
            "B did not log the override it could not apply:\n{}",
            b.error_log()
        );
        thread::sleep(Duration::from_millis(10));
    }
    // Rounds later: A and Redis still have it.
    wait_rounds(&a, 5, Duration::from_secs(5));
    assert_eq!(
        overrides_of(&a)["x"],
        serde_json::json!({"rate": "1r/s", "burst": 0})
    );
    assert_eq!(
        redis.cli(&["HEXISTS", "rl:api:overrides", "kx"]).trim(),
        "1"
    );
}

/// A loop that takes over (here: the instance's workers killed) from one that could not push
/// an override set on its instance (Redis stopped) pushes it once Redis answers, rather than
/// undoing it as a restarted instance would: the earlier loop left in shared memory the
/// fleet's version it last matched, and the fleet is still at it.
#[test]
fn an_override_waiting_for_redis_survives_a_loop_take_over() {
    let _machine = share_machine();
    let (redis, _dir, a, b) = pair_with_state();
    let one = serde_json::json!({"rate": "1r/s", "burst": 0});
    assert_eq!(
        put_override(&a, "x", r#"{"rate": "1r/s", "burst": 0}"#),
        201
    );
    wait_override(&b, "x", one.clone(), OVERRIDE_WITHIN);

    redis.signal(SIGSTOP);
    assert_eq!(
        put_override(&b, "z", r#"{"rate": "1r/s", "burst": 0}"#),
        201
    );
    let old = b.kill_workers();
    b.wait_workers_replaced(&old);
    // The new loop runs (its rounds fail while Redis is stopped) before Redis answers again.
    let errors = |nginx: &Nginx| sync_state(nginx)["errors"].as_u64().expect("errors");
    let before = errors(&b);
    let waited = Instant::now();
    while errors(&b) < before + 2 {
        assert!(
            waited.elapsed() < Duration::from_secs(5),
            "no loop after the kill"
        );
        thread::sleep(Duration::from_millis(20));
    }
    redis.signal(SIGCONT);
    let took = wait_override(&a, "z", one.clone(), Duration::from_secs(3));
    eprintln!(
        "the override set before the take-over reached the fleet {took:?} after Redis answered"
    );
    let expected = serde_json::json!({"x": one, "z": one});
    assert_eq!(overrides_of(&b), expected);
    assert_eq!(overrides_of(&a), expected);
}

/// Overrides keep flowing across a reload (old and new workers overlap; the new owner's
/// loop takes the fleet's map) and when an instance's workers are killed (another worker
/// takes the loop over, and the inbox with it).
#[test]
fn overrides_flow_across_reload_and_worker_kill() {
    let _machine = share_machine();
    let redis = Redis::start();
    let dir = StateDir::new();
    let a = Nginx::start(&instance_with_state(redis.port, &dir.file("a.json")));
    let b_config = instance_with_state(redis.port, &dir.file("b.json"));
    let mut b = Nginx::start(&b_config);
    redis.wait_instances(2);
    let one = serde_json::json!({"rate": "1r/s", "burst": 0});
    assert_eq!(
        put_override(&a, "x", r#"{"rate": "1r/s", "burst": 0}"#),
        201
    );
    wait_override(&b, "x", one.clone(), OVERRIDE_WITHIN);

    b.reload_with(&b_config);
    assert_eq!(
        put_override(&a, "y", r#"{"rate": "1r/s", "burst": 0}"#),
        201
    );
    let took = wait_override(&b, "y", one.clone(), Duration::from_secs(3));
    eprintln!("after a reload, an override reached the instance in {took:?}");
    assert_eq!(
        put_override(&b, "z", r#"{"rate": "1r/s", "burst": 0}"#),
        201
    );
    wait_override(&a, "z", one.clone(), Duration::from_secs(3));

    let old = b.kill_workers();
    b.wait_workers_replaced(&old);
    assert_eq!(delete_override(&a, "x"), 204);
    // The election hands the loop over within three intervals and a second.
    let took = wait_override(&b, "x", serde_json::Value::Null, Duration::from_secs(4));
    eprintln!("after the workers were killed, a removal reached the instance in {took:?}");
    wait_rounds(&a, 3, Duration::from_secs(5));
    wait_rounds(&b, 3, Duration::from_secs(5));
    let expected = serde_json::json!({"y": one, "z": one});
    assert_eq!(overrides_of(&a), expected);
    assert_eq!(overrides_of(&b), expected);
}

// --- issue 18: sync at scale ------------------------------------------------------------------

/// Sends requests for distinct keys (`PREFIX-N`) back to back from `connections` keep-alive
/// connections to `port` until `until` says stop. Returns how many were sent and every
/// status that was neither 200 nor 429.
fn distinct_keys_load(
    port: u16,
    connections: usize,
    prefix: &str,
    until: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> thread::JoinHandle<(u64, Vec<u16>)> {
    let prefix = prefix.to_string();
    thread::spawn(move || {
        let threads: Vec<_> = (0..connections)
            .map(|c| {
                let (prefix, until) = (prefix.clone(), until.clone());
                thread::spawn(move || {
                    let mut connection = Connection::open(port);
                    let (mut sent, mut odd) = (0u64, Vec::new());
                    while !until.load(std::sync::atomic::Ordering::Acquire) {
                        let key = format!("{prefix}-{c}-{sent}");
                        let request = Request::get("/index.html").header("X-Key", &key);
                        match connection.try_send(&request) {
                            Ok(response) if matches!(response.status, 200 | 429) => {}
                            Ok(response) => odd.push(response.status),
                            Err(_) => connection = Connection::open(port),
                        }
                        sent += 1;
                    }
                    (sent, odd)
                })
            })
            .collect();
        let mut total = (0, Vec::new());
        for thread in threads {
            let (sent, odd) = thread.join().expect("load thread");
            total.0 += sent;
            total.1.extend(odd);
        }
        total
    })
}

/// Polls until the instance's mode is `synced`; returns how long it took (bounded).
fn time_to_synced(nginx: &Nginx, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        if sync_state(nginx)["mode"] == "synced" {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "not synced {within:?} after Redis answered again: {}",
            sync_state(nginx)
        );
        thread::sleep(Duration::from_millis(5));
    }
}

/// Issue 18, 1: many distinct keys and a stalled Redis. Before, every round resent every
/// failed delta, timed out again and grew: after a 0.5 s stall under 10k keys/s the loop
/// stayed in `local_share` for good, even with no traffic (47-49k EVALSHA/s to an idle Redis).
/// Here: distinct keys as fast as the instance takes them, Redis stopped for a second in the
/// middle. The instance is synced again within two intervals of Redis answering (margin for
/// a loaded machine: a second), under load, and again with no traffic, when an idle second
/// costs Redis a handful of calls a round, not thousands.
#[test]
fn many_distinct_keys_survive_a_stalled_redis() {
    let _machine = share_machine();
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let redis = Redis::start();
    let fleet = fleet(&redis, 1, "interval=100ms");
    let nginx = &fleet[0];
    let stop = Arc::new(AtomicBool::new(false));
    let load = distinct_keys_load(nginx.port(), 4, "d", stop.clone());
    thread::sleep(Duration::from_millis(1500));
    redis.signal(SIGSTOP);
    thread::sleep(Duration::from_millis(1000));
    redis.signal(SIGCONT);
    let under_load = time_to_synced(nginx, Duration::from_secs(10));
    // Stays synced under load.
    thread::sleep(Duration::from_millis(1500));
    let state = sync_state(nginx);
    stop.store(true, Ordering::Release);
    let (sent, odd) = load.join().expect("load");
    eprintln!("{sent} distinct keys; synced {under_load:?} after Redis answered; then {state}");
    assert!(odd.is_empty(), "answers other than 200/429: {odd:?}");
    assert_eq!(state["mode"], "synced", "{state}");
    assert!(
        under_load <= Duration::from_millis(1000),
        "synced only {under_load:?} after Redis answered"
    );
    // Idle: Redis hears a few calls a round.
    thread::sleep(Duration::from_millis(500));
    let before = redis.calls("evalsha");
    thread::sleep(Duration::from_secs(1));
    let idle = redis.calls("evalsha") - before;
    assert_eq!(sync_state(nginx)["mode"], "synced");
    assert!(idle <= 100, "{idle} EVALSHA in an idle second");
}

/// The admitted requests of `answers` in `[from, to)`, without printing.
fn admitted(answers: &[Answer], from: Duration, to: Duration) -> f64 {
    common::fleet::passed_between_quiet(answers, from, to) as f64
}

/// Issue 18, 2: small bursts are exact. Three instances, L = 100r/s, `nodelay`. "Admits L"
/// is what ONE nginx without `sync` admits of the same traffic: limit_req's `burst=0` admits
/// less than L even alone when arrivals do not fall on its schedule (each admission waits for
/// the first arrival after the bucket empties). Spread: 30x L from two paced keep-alive
/// connections per instance, all six evenly interleaved (a request every 0.33 ms), against
/// the same six connections to one nginx. One instance: 10x L from two connections (a
/// request every millisecond) to one instance of the three, against the same two connections
/// to one nginx. Each for 5 s, counted from the first second on: what the fleet admits once
/// the key is known (its one-time room granted ahead, a bucket and an interval's drain, is
/// bounded by `three_instances_share_one_limit`). Before: `burst=0` admitted 0.75 of one
/// nginx spread over three instances and 43/s on one instance; `burst=1` 0.86 / 55/s. Now
/// 0.95-1.05 spread, and at least 0.9 of one nginx on one instance (or of what the rounds
/// that ran can grant, a bucket and an interval's drain each, when a starved machine stretches
/// them).
#[test]
fn small_bursts_share_one_limit_exactly() {
    let _machine = own_machine();
    for burst in [0, 1] {
        let zone = format!("rate=100r/s burst={burst}");
        let redis = Redis::start();
        let fleet: Vec<Nginx> = (0..3)
            .map(|_| Nginx::start(&instance_config(redis.port, "interval=100ms", &zone)))
            .collect();
        // One nginx without `sync` (and without `rate_limit_sync`: not one of the fleet).
        let alone_config: String = instance_config(redis.port, "interval=100ms", &zone)
            .replace(" sync;", ";")
            .lines()
            .filter(|line| !line.contains("rate_limit_sync "))
            .map(|line| format!("{line}\n"))
            .collect();
        let single = Nginx::start(&alone_config);
        redis.wait_instances(3);
        // The fleet and one nginx offered the same traffic at the same time, so that both
        // see the same machine (a loaded one delays arrivals, which costs limit_req more).
        let (span, from) = (Duration::from_secs(5), Duration::from_secs(1));
        let side_by_side = |fleet_ports: Vec<u16>, single_ports: Vec<u16>, per_sec: f64, key| {
            let other = thread::spawn(move || offer(&single_ports, per_sec, span, key));
            let mine = offer(&fleet_ports, per_sec, span, key);
            let theirs = other.join().expect("load thread");
            (admitted(&mine, from, span), admitted(&theirs, from, span))
        };
        let port = single.port();
        let (spread, one) = side_by_side(
            ports(&fleet),
            vec![port; 3],
            30.0 * LIMIT_PER_SEC / 3.0,
            "k",
        );
        let rounds_before = sync_state(&fleet[0])["round_trips"]
            .as_u64()
            .expect("round_trips");
        let (alone, one_alone) = side_by_side(
            vec![fleet[0].port()],
            vec![port],
            10.0 * LIMIT_PER_SEC,
            "solo",
        );
        let rounds = sync_state(&fleet[0])["round_trips"]
            .as_u64()
            .expect("round_trips")
            - rounds_before;
        // Each round grants the instance at most a full bucket (burst + 1) and one interval's
        // drain (10 at 100r/s, interval=100ms): when a starved machine stretches the rounds
        // (once, in CI, 246 admitted of 400: about 5 rounds a second instead of 10, as 246 in
        // 4 s at 12 a round says), that is what the design admits, and what it must still
        // reach. Rounds over the counted 4 of the 5 s; fewer than 3 a second is a failure.
        let counted_rounds = rounds as f64 * (span - from).as_secs_f64() / span.as_secs_f64();
        let reachable = one_alone.min(counted_rounds * f64::from(burst + 1 + 10));
        let (ratio, alone_ratio) = (spread / one, alone / one_alone);
        eprintln!(
            "burst={burst}: spread {spread} vs one nginx {one} ({ratio:.3}); one instance \
             {alone} vs one nginx {one_alone} ({alone_ratio:.3}), {rounds} rounds in {span:?}"
        );
        // Not less than 0.95 of one nginx; not more than 1.05 of one nginx, or of the limit
        // itself where a loaded machine delayed one nginx's arrivals so that it admitted less
        // than L (it did, 364 of 400, in one run where the fleet admitted 402).
        let limit = LIMIT_PER_SEC * (span - from).as_secs_f64();
        assert!(
            spread >= 0.95 * one && spread <= 1.05 * one.max(limit),
            "burst={burst}: three instances admitted {spread}, one nginx alone {one}, the \
             limit {limit}"
        );
        assert!(
            alone >= 0.9 * reachable,
            "burst={burst}: one instance with all the traffic admitted {alone}, one nginx \
             {one_alone}, {rounds} rounds of sync in {span:?} (reachable {reachable:.0})"
        );
        assert!(
            rounds >= 15,
            "burst={burst}: {rounds} rounds of sync in {span:?} at interval=100ms"
        );
    }
}

/// Issue 18, 3: a hot key far under its limit is never rejected because of sync. One
/// instance, limit 100,000r/s burst=2000 (20 ms of slack: a worker descheduled for a few
/// milliseconds on a loaded machine does not exhaust it, as the same key on the same limit
/// without `sync`, from as many connections, shows), `interval=1s`, one key as fast as three
/// connections send it: thousands a second, a few percent of the limit, more than burst + 1
/// in an interval. Before, some of them got 429 (1-3% in the issue's runs): the loop charged
/// the interval's requests to the fleet at once and raised the key's local state by all of
/// them, past its burst.
#[test]
fn a_hot_key_far_under_its_limit_is_never_rejected() {
    let _machine = share_machine();
    let redis = Redis::start();
    let nginx = Nginx::start(&instance_config(
        redis.port,
        "interval=1s",
        "rate=100000r/s burst=2000",
    ));
    redis.wait_instances(1);
    let started = Instant::now();
    let threads: Vec<_> = ["/index.html", "/plain/index.html"]
        .iter()
        .flat_map(|&path| std::iter::repeat_n(path, 3))
        .map(|path| {
            let port = nginx.port();
            thread::spawn(move || {
                let mut connection = Connection::open(port);
                let request = Request::get(path).header("X-Key", "hot");
                let mut statuses = Vec::new();
                while started.elapsed() < Duration::from_secs(3) {
                    statuses.push(connection.send(&request).status);
                }
                (path, statuses)
            })
        })
        .collect();
    let (mut synced, mut plain) = (Vec::new(), Vec::new());
    for thread in threads {
        let (path, statuses) = thread.join().expect("load thread");
        if path == "/index.html" {
            synced.extend(statuses);
        } else {
            plain.extend(statuses);
        }
    }
    let rejected = |statuses: &[u16]| statuses.iter().filter(|&&status| status == 429).count();
    eprintln!(
        "sync: {} requests, {} rejected; without sync: {} requests, {} rejected",
        synced.len(),
        rejected(&synced),
        plain.len(),
        rejected(&plain)
    );
    // More than burst + 1 per interval.
    assert!(
        synced.len() >= 3 * 2002,
        "too few requests to tell: {}",
        synced.len()
    );
    assert!(synced
        .iter()
        .chain(&plain)
        .all(|&status| matches!(status, 200 | 429)));
    // Before, 1-9% of these requests were rejected. A worker descheduled for longer than the
    // 20 ms of slack on a loaded 2-core machine can still see one rejected, with or without
    // sync (bench/cluster-scale.sh: 4 of 141,809 with sync, 3 of 141,894 without): at most
    // one in a thousand on each side, far below what the old loop did.
    assert!(
        rejected(&plain) * 1000 <= plain.len(),
        "the limit alone rejects at this rate: {} of {}",
        rejected(&plain),
        plain.len()
    );
    assert!(
        rejected(&synced) * 1000 <= synced.len(),
        "a key far under its limit was rejected: {} of {}",
        rejected(&synced),
        synced.len()
    );
}

/// Issue 18, 4: a live PATCH of rate and burst never leaves a key rejected anywhere longer
/// than the new limit would. Two instances, zone `rate=1r/m burst=1000`, one key at 20r/s on
/// each; `PATCH {"rate": "100r/s", "burst": 5}` on the first. Before, the second rejected
/// every request of the key from a second after the PATCH on (`Retry-After: 117`): a reply
/// computed at the old rate was applied after the new one. The key's 40r/s is under the new
/// 100r/s: its backlog from before (tens of requests) drains within half a second, so from a
/// second after the PATCH on, both instances admit it.
#[test]
fn a_patch_never_locks_a_key_out_elsewhere() {
    let _machine = share_machine();
    let redis = Redis::start();
    let zone = "rate=1r/m burst=1000";
    let fleet: Vec<Nginx> = (0..2)
        .map(|_| Nginx::start(&instance_config(redis.port, "interval=100ms", zone)))
        .collect();
    redis.wait_instances(2);
    let ports = ports(&fleet);
    let load = thread::spawn(move || offer(&ports, 20.0, Duration::from_secs(4), "p"));
    thread::sleep(Duration::from_millis(1050));
    let patch =
        Request::new("PATCH", "/ratelimit/zones/api").json(r#"{"rate": "100r/s", "burst": 5}"#);
    assert_eq!(common::send(fleet[0].port(), &patch).status, 200);
    let answers = load.join().expect("load thread");
    // offer() sends to its ports in order, two connections each: which instance answered is
    // not recorded, so judge both together and each through the other's share.
    let after = |a: &Answer| a.sent >= Duration::from_millis(2050);
    let late: Vec<&Answer> = answers.iter().filter(|a| after(a)).collect();
    let passed = late.iter().filter(|a| a.status == 200).count();
    eprintln!(
        "from 1 s after the PATCH: {passed} of {} passed",
        late.len()
    );
    assert!(
        passed as f64 >= 0.95 * late.len() as f64,
        "{passed} of {} passed from 1 s after the PATCH",
        late.len()
    );
    // Each instance on its own too.
    for nginx in &fleet {
        let statuses = statuses_for(nginx, "p", 3);
        assert_eq!(statuses, vec![200; 3], "{}", nginx.port());
    }
}

/// Issue 18, 5: an evicted slot's pending delta is still sent. A sync zone far too small for
/// its keys (a few hundred slots) and 1500 keys taking three requests each within one
/// interval (1 s): most keys are evicted before the round that would send them. Before, their
/// deltas were lost with the slot (3.3% of the admitted requests' deltas in a zone of 344
/// slots and 22k keys); now eviction hands them to the loop, and every key reaches Redis.
///
/// Two workers: a request that finds its key's slot in one worker while the other evicts
/// that slot for a new key charges its own key (the slot pin, issue 26), so every key's
/// three requests pass. Before, now and then a key's third request was refused (0 to 19 of
/// the 4500 requests, in about half the runs), and the test ran on one worker.
#[test]
fn an_evicted_keys_delta_is_still_sent() {
    let _machine = share_machine();
    let redis = Redis::start();
    let config = instance_config(redis.port, "interval=1s", "rate=1r/s burst=2")
        .replace("zone=api:1m", "zone=api:32k");
    assert!(config.contains("worker_processes 2;"), "{config}");
    let nginx = Nginx::start(&config);
    redis.wait_instances(1);
    let keys = 1500;
    let threads: Vec<_> = (0..3)
        .map(|t| {
            let port = nginx.port();
            thread::spawn(move || {
                let mut connection = Connection::open(port);
                let mut passed = 0;
                for n in (t..keys).step_by(3) {
                    let request = Request::get("/index.html").header("X-Key", &format!("e{n}"));
                    for _ in 0..3 {
                        passed += usize::from(connection.send(&request).status == 200);
                    }
                }
                passed
            })
        })
        .collect();
    let passed: usize = threads.into_iter().map(|t| t.join().expect("load")).sum();
    assert_eq!(
        passed,
        3 * keys,
        "every key's three requests pass (burst=2)"
    );
    let evictions = || -> u64 {
        let zone: serde_json::Value =
            serde_json::from_str(&common::get(nginx.port(), "/ratelimit/zones/api").text())
                .expect("zone JSON");
        zone["evictions"].as_u64().expect("evictions")
    };
    assert!(
        evictions() >= 500,
        "the zone did not evict: {}",
        evictions()
    );
    // Two rounds later, every key is in Redis.
    let started = Instant::now();
    loop {
        let listed = redis.cli(&["KEYS", "rl:api:*"]);
        let count = listed
            .lines()
            .filter(|key| !key.ends_with(":limits") && !key.ends_with(":overrides"))
            .count();
        if count == keys {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{count} of {keys} keys reached Redis ({} evictions)",
            evictions()
        );
        thread::sleep(Duration::from_millis(100));
    }
}
