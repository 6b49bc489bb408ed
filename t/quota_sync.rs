//! `sync` on quota zones against a real redis-server and real nginx instances: the period's
//! counter of a key lives in Redis, each instance decides from its own view of it (no Redis
//! call on a request), and once the fleet is synced two instances admit the quota exactly,
//! an override set on one instance raises it on both, and the count survives a restart.
//!
//! "Synced" is read, not slept for: after each admitted request the test waits until both
//! instances' admin APIs show the key's `used` at the fleet's count.

mod common;

use std::time::{Duration, Instant};

use common::redis::Redis;
use common::{send, Nginx, Request};
use serde_json::Value;

const LIMIT: u64 = 20;

fn config(redis: &Redis, state: Option<&std::path::Path>) -> String {
    config_with(redis, state, "")
}

fn config_with(redis: &Redis, state: Option<&std::path::Path>, sync_words: &str) -> String {
    let state = state.map_or(String::new(), |path| {
        format!("rate_limit_state_file {};", path.display())
    });
    common::config()
        .workers(2)
        .reuseport()
        .main("user root;")
        .http(&format!(
            "rate_limit_sync redis://127.0.0.1:{} interval=100ms {sync_words};\n\
             rate_limit_zone $http_x_key zone=q:1m algorithm=quota limit={LIMIT} period=day \
             tz=Europe/Berlin sync;\n{state}",
            redis.port
        ))
        .locations("location / { rate_limit zone=q; }")
        .locations("location /ratelimit/ { rate_limit_admin write=on; }")
        .build()
}

/// An empty directory for a state file, outside any nginx prefix (it outlives one nginx).
fn state_dir(test: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "ngx-rate-limit-qsync-{test}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// One instance of the fleet, serving `html/index.html`.
fn instance(redis: &Redis, state: Option<&std::path::Path>, sync_words: &str) -> Nginx {
    let nginx = Nginx::start(&config_with(redis, state, sync_words));
    nginx.write_file("html/index.html", "ok\n");
    nginx
}

fn hit(nginx: &Nginx, key: &str) -> u16 {
    send(nginx.port(), &Request::get("/").header("X-Key", key)).status
}

fn admin(nginx: &Nginx, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
    common::admin::admin_json(nginx, method, path, body)
}

/// The key's `used` and `limit` as the instance sees them; `None` while it has no state.
fn key_view(nginx: &Nginx, key: &str) -> Option<(u64, u64)> {
    let (status, value) = admin(nginx, "GET", &format!("zones/q/keys/{key}"), None);
    if status == 404 {
        return None;
    }
    assert_eq!(status, 200, "{value}");
    Some((value["used"].as_u64()?, value["limit"].as_u64()?))
}

/// Wait (at most 10 s: rounds are 100 ms) until every instance that knows the key sees
/// `used` and `limit`.
fn wait_synced(fleet: &[&Nginx], key: &str, used: u64, limit: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let views: Vec<_> = fleet.iter().map(|nginx| key_view(nginx, key)).collect();
        if views
            .iter()
            .all(|view| view.is_none_or(|view| view == (used, limit)))
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "never synced at used={used} limit={limit}: {views:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `count` requests of `key` alternating between the instances, each after the fleet synced
/// what the one before it admitted; returns how many each instance admitted.
fn alternate(fleet: &[&Nginx], key: &str, count: usize, limit: u64, used: &mut u64) -> Vec<u64> {
    let mut admitted = vec![0; fleet.len()];
    for at in 0..count {
        let instance = at % fleet.len();
        match hit(fleet[instance], key) {
            200 => {
                admitted[instance] += 1;
                *used += 1;
            }
            429 => {}
            status => panic!("request {at}: status {status}"),
        }
        wait_synced(fleet, key, *used, limit);
    }
    admitted
}

/// The one period counter in Redis (`rl:` `q` `:q:{NN}:START:ID`, a hash): its count and
/// PTTL.
/// Wait (at most 10 s) until the instance's sync mode is `mode`.
fn wait_mode(nginx: &Nginx, mode: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, zone) = admin(nginx, "GET", "zones/q", None);
        if zone["sync"]["mode"] == mode {
            return;
        }
        assert!(Instant::now() < deadline, "mode never {mode}: {zone}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn redis_count(redis: &Redis) -> (u64, i64) {
    let names = redis.cli(&["KEYS", "rl:q:q:*"]);
    let name = names.trim();
    assert!(!name.is_empty() && !name.contains('\n'), "{names:?}");
    let count = redis.cli(&["HGET", name, "n"]).trim().parse().unwrap();
    let ttl = redis.cli(&["PTTL", name]).trim().parse().unwrap();
    (count, ttl)
}

#[test]
fn two_instances_admit_the_quota_exactly_once_synced_and_an_override_raises_it_on_both() {
    let redis = Redis::start();
    let a = instance(&redis, None, "");
    let b = instance(&redis, None, "");
    redis.wait_instances(2);
    let fleet = [&a, &b];

    // 30 requests spread over both: exactly the quota, from both instances.
    let mut used = 0;
    let admitted = alternate(&fleet, "acme", 30, LIMIT, &mut used);
    assert_eq!(admitted.iter().sum::<u64>(), LIMIT, "{admitted:?}");
    assert!(admitted.iter().all(|&n| n >= 5), "{admitted:?}");
    // Refused on both, with Retry-After up to Berlin's next midnight.
    for nginx in fleet {
        let response = send(nginx.port(), &Request::get("/").header("X-Key", "acme"));
        assert_eq!(response.status, 429);
        let retry_after: u64 = response.header("Retry-After").unwrap().parse().unwrap();
        assert!((1..=25 * 3600).contains(&retry_after), "{retry_after}");
    }
    let (count, ttl) = redis_count(&redis);
    assert_eq!(count, LIMIT);
    // Expiring at the period's end plus an hour's margin: more than an hour, at most 26.
    assert!((3_600_000..=26 * 3_600_000).contains(&ttl), "PTTL {ttl}");

    // Raised on one instance, the other takes the override: 5 more in total, exactly.
    let (status, value) = admin(
        &a,
        "PUT",
        "zones/q/overrides/acme",
        Some(r#"{"limit": 25}"#),
    );
    assert!((200..300).contains(&status), "{status} {value}");
    wait_synced(&fleet, "acme", LIMIT, 25);
    let admitted = alternate(&fleet, "acme", 12, 25, &mut used);
    assert_eq!(admitted.iter().sum::<u64>(), 5, "{admitted:?}");
    assert_eq!(redis_count(&redis).0, 25);

    // Another key is counted apart.
    assert_eq!(hit(&a, "other"), 200);
    assert_eq!(hit(&b, "other"), 200);
    wait_synced(&fleet, "other", 2, LIMIT);

    // The zone's limit changed on one instance reaches the other.
    let (status, value) = admin(&b, "PATCH", "zones/q", Some(r#"{"limit": 30}"#));
    assert!((200..300).contains(&status), "{status} {value}");
    wait_synced(&fleet, "other", 2, 30);
    assert!(fleet
        .iter()
        .all(|nginx| key_view(nginx, "other") == Some((2, 30))));
}

#[test]
fn the_count_survives_a_restart_in_redis() {
    let redis = Redis::start();
    let dir = state_dir("restart");
    let state = dir.join("state.json");
    let a = instance(&redis, Some(&state), "");
    let b = instance(&redis, None, "");
    redis.wait_instances(2);
    let mut used = 0;
    let admitted = alternate(&[&a, &b], "acme", 24, LIMIT, &mut used);
    assert_eq!(admitted.iter().sum::<u64>(), LIMIT, "{admitted:?}");

    // B stopped and started afresh (no state file): its first request of the key comes
    // before any round read the counter, and is admitted within its share; the round that
    // sends it reads the fleet's count, and every request after it is refused.
    b.stop();
    let b = instance(&redis, None, "");
    let first = hit(&b, "acme");
    let expected = LIMIT + u64::from(first == 200);
    wait_synced(&[&a, &b], "acme", expected, LIMIT);
    assert!((0..5).all(|_| hit(&b, "acme") == 429));
    assert_eq!(redis_count(&redis).0, expected);

    // A stopped and started with its state file: refused from its first request.
    a.stop();
    let a = instance(&redis, Some(&state), "");
    assert!((0..5).all(|_| hit(&a, "acme") == 429));
    assert_eq!(redis_count(&redis).0, expected);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn with_redis_stopped_local_share_admits_each_instance_its_share_of_what_is_left() {
    let redis = Redis::start();
    let a = instance(&redis, None, "timeout=50ms on_failure=local_share");
    let b = instance(&redis, None, "timeout=50ms on_failure=local_share");
    redis.wait_instances(2);
    let mut used = 0;
    let admitted = alternate(&[&a, &b], "acme", 8, LIMIT, &mut used);
    assert_eq!(admitted, [4, 4]);

    // Redis stops answering: once local_share is in force, each instance admits half of
    // the 12 the fleet had left, whatever it is offered.
    redis.signal(common::redis::SIGSTOP);
    for nginx in [&a, &b] {
        wait_mode(nginx, "local_share");
    }
    let passed: Vec<usize> = [&a, &b]
        .iter()
        .map(|nginx| (0..20).filter(|_| hit(nginx, "acme") == 200).count())
        .collect();
    assert_eq!(passed, [6, 6]);

    // Redis back: what each admitted meanwhile reaches the counter, and the fleet refuses.
    redis.signal(common::redis::SIGCONT);
    wait_synced(&[&a, &b], "acme", LIMIT, LIMIT);
    assert_eq!(redis_count(&redis).0, LIMIT);
    assert_eq!(hit(&a, "acme"), 429);
    assert_eq!(hit(&b, "acme"), 429);
}

#[test]
fn with_on_failure_closed_a_silent_redis_refuses_every_request() {
    let redis = Redis::start();
    let a = instance(&redis, None, "timeout=50ms on_failure=closed");
    redis.wait_instances(1);
    assert_eq!(hit(&a, "acme"), 200);
    redis.signal(common::redis::SIGSTOP);
    wait_mode(&a, "closed");
    assert!((0..5).all(|_| hit(&a, "acme") == 429));
    redis.signal(common::redis::SIGCONT);
    wait_mode(&a, "synced");
    assert_eq!(hit(&a, "acme"), 200);
}

#[test]
fn counts_saved_without_sync_are_not_restored_into_a_sync_zone() {
    let redis = Redis::start();
    let dir =
        std::env::temp_dir().join(format!("ngx-rate-limit-qsync-seed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let state = dir.join("state.json");
    // The same zone without `sync`: a random seed, saved with its counts.
    let alone = config(&redis, Some(&state))
        .replace(" sync;", ";")
        .replace("rate_limit_sync", "# rate_limit_sync");
    let nginx = Nginx::start(&alone);
    nginx.write_file("html/index.html", "ok\n");
    assert!((0..3).all(|_| hit(&nginx, "acme") == 200));
    nginx.stop();
    let nginx = Nginx::start(&config(&redis, Some(&state)));
    let log = nginx.error_log();
    assert!(
        log.contains("zone \"q\" counted 1 key(s) without \"sync\": the fleet's counts in Redis are used instead"),
        "{log}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_redis_cluster_holds_the_counters() {
    let nodes = common::redis::redis_cluster();
    let a = instance(&nodes[0], None, "cluster");
    let b = instance(&nodes[0], None, "cluster");
    nodes[0].wait_instances(2);
    let mut used = 0;
    let admitted = alternate(&[&a, &b], "acme", 30, LIMIT, &mut used);
    assert_eq!(admitted.iter().sum::<u64>(), LIMIT, "{admitted:?}");
    // The counter is on the node that owns its slot, whichever it is.
    let counted: u64 = nodes
        .iter()
        .flat_map(|node| {
            let names = node.cli(&["KEYS", "rl:q:q:*"]);
            names
                .split_whitespace()
                .map(|name| {
                    node.cli(&["HGET", name, "n"])
                        .trim()
                        .parse::<u64>()
                        .unwrap()
                })
                .collect::<Vec<_>>()
        })
        .sum();
    assert_eq!(counted, LIMIT);
}

#[test]
fn requests_refused_beside_the_quota_or_given_back_are_not_counted_by_the_fleet() {
    let redis = Redis::start();
    let config = common::config()
        .workers(2)
        .reuseport()
        .http(&format!(
            "rate_limit_sync redis://127.0.0.1:{} interval=100ms;\n\
             rate_limit_zone $http_x_key zone=q:1m algorithm=quota limit={LIMIT} period=day \
             sync;\n\
             rate_limit_zone $http_x_key zone=slow:1m rate=1r/m;",
            redis.port
        ))
        .locations("location / { rate_limit zone=q; rate_limit zone=slow nodelay; }")
        .locations("location /kept/ { rate_limit zone=q on_status=200; }")
        .locations("location /ratelimit/ { rate_limit_admin; }")
        .build();
    let a = Nginx::start(&config);
    a.write_file("html/index.html", "ok\n");
    redis.wait_instances(1);
    // The quota passes each, the rate only the first: the others are given back.
    let codes: Vec<u16> = (0..5).map(|_| hit(&a, "acme")).collect();
    assert_eq!(codes, [200, 429, 429, 429, 429]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while redis.cli(&["KEYS", "rl:q:q:*"]).trim().is_empty() {
        assert!(Instant::now() < deadline, "the counter never reached Redis");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Charged at the door and given back after a 404 (`on_status=200`): out of the delta
    // before a round sends it (one sent meanwhile would stay counted: the strict side).
    for _ in 0..5 {
        let response = send(
            a.port(),
            &Request::get("/kept/missing").header("X-Key", "acme"),
        );
        assert_eq!(response.status, 404);
    }
    // Three more rounds: nothing more reaches the counter.
    let round_trips = || admin(&a, "GET", "zones/q", None).1["sync"]["round_trips"].as_u64();
    let seen = round_trips().unwrap();
    while round_trips().unwrap() < seen + 3 {
        assert!(Instant::now() < deadline, "no more rounds");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(redis_count(&redis).0, 1);
    assert_eq!(key_view(&a, "acme"), Some((1, LIMIT)));
}

#[test]
fn usage_lines_count_tokens_across_the_fleet() {
    let redis = Redis::start();
    let llm = common::llm::FakeLlm::start();
    let tokens = |redis: &Redis| {
        common::config()
            .workers(2)
            .reuseport()
            .http(&format!(
                "rate_limit_sync redis://127.0.0.1:{} interval=100ms;\n\
                 rate_limit_zone $http_x_key zone=q:1m algorithm=quota limit=10000 \
                 period=month sync;\n\
                 upstream llm {{ server 127.0.0.1:{}; }}",
                redis.port,
                llm.port()
            ))
            .locations(
                "location /v1/ { rate_limit zone=q usage=openai reserve=1; \
                 proxy_pass http://llm; }",
            )
            .locations("location /ratelimit/ { rate_limit_admin; }")
            .build()
    };
    let a = Nginx::start(&tokens(&redis));
    let b = Nginx::start(&tokens(&redis));
    redis.wait_instances(2);
    let fleet = [&a, &b];
    // 3,000 tokens a request, alternating, each once the fleet synced the one before: the
    // fourth passes at 9,000 and its overrun goes into debt (12,000), then both refuse.
    let path = "/v1/chat/completions?prompt=1000&completion=2000";
    let mut codes = Vec::new();
    for at in 0..6 {
        let response = send(
            fleet[at % 2].port(),
            &Request::get(path).header("X-Key", "team"),
        );
        codes.push(response.status);
        let used = 3000 * codes.iter().filter(|&&code| code == 200).count() as u64;
        wait_synced(&fleet, "team", used, 10_000);
    }
    assert_eq!(codes, [200, 200, 200, 200, 429, 429]);
    assert_eq!(llm.requests(), 4);
    assert_eq!(redis_count(&redis).0, 12_000);
}

#[test]
fn a_counter_redis_should_not_hold_is_counted_and_never_lowers_a_count() {
    let redis = Redis::start();
    let a = instance(&redis, None, "");
    redis.wait_instances(1);
    let mut used = 0;
    alternate(&[&a], "acme", 3, LIMIT, &mut used);
    let deadline = Instant::now() + Duration::from_secs(10);
    while redis.cli(&["KEYS", "rl:q:q:*"]).trim().is_empty() {
        assert!(Instant::now() < deadline, "the counter never reached Redis");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(redis_count(&redis).0, 3);
    let names = redis.cli(&["KEYS", "rl:q:q:*"]);
    redis.cli(&["HSET", names.trim(), "n", "-100"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while admin(&a, "GET", "zones/q", None).1["sync"]["bad_values"] == 0 {
        assert!(
            Instant::now() < deadline,
            "the counter's -100 was never noticed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The instance keeps its own count, and counts on from it.
    assert_eq!(key_view(&a, "acme"), Some((3, LIMIT)));
    let bad_values = || admin(&a, "GET", "zones/q", None).1["sync"]["bad_values"].as_u64();
    let noticed = bad_values().unwrap();
    assert_eq!(hit(&a, "acme"), 200);
    // Two more rounds (each sends or reads the key and finds it out of range, -99 or -100):
    // the count stays the instance's own.
    while bad_values().unwrap() < noticed + 2 {
        assert!(
            Instant::now() < deadline,
            "no later round noticed the counter"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(key_view(&a, "acme"), Some((4, LIMIT)));
}

#[test]
fn the_counter_script_adds_each_send_once() {
    let redis = Redis::start();
    let script = include_str!("../src/sync/quota.lua");
    let expiry = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 60_000)
        .to_string();
    // (instance, send, delta, earlier failed sends as number delta..., the count after it)
    #[rustfmt::skip]
    let rows: [(&str, &str, &str, &[&str], i64); 7] = [
        ("aa", "1", "3", &[], 3),
        // The same send again (applied, and then retried): nothing more.
        ("aa", "1", "3", &[], 3),
        // Send 2 (5) never reached Redis; send 3 carries it again: all of it counts.
        ("aa", "3", "5", &["2", "5"], 8),
        // Send 3 was applied but its reply lost; send 4 carries its 5 and 4 more: 4.
        ("aa", "4", "9", &["3", "5"], 12),
        // Another instance counts apart.
        ("bb", "1", "2", &[], 14),
        // Send 2 of aa reaches Redis at last, after send 4 carried it: nothing.
        ("aa", "2", "5", &[], 14),
        // Two failed sends (4, then 7 carrying those 4 and 3 more), the first applied late:
        // send 4 carries the 7 and 3 more, and adds the 6 not applied yet.
        ("bb", "4", "10", &["2", "4", "3", "7"], 24),
    ];
    // bb's send 2 (4) was applied late before its send 4; its send 3 (7) never was.
    for (at, (instance, send, delta, earlier, count)) in rows.iter().enumerate() {
        if at == 6 {
            let late = redis.cli(&["EVAL", script, "1", "c", "bb", "2", "4", &expiry]);
            assert_eq!(late.trim(), "18", "bb's late send 2");
        }
        let mut args = vec!["EVAL", script, "1", "c", instance, send, delta, &expiry];
        args.extend_from_slice(earlier);
        let reply = redis.cli(&args);
        assert_eq!(reply.trim(), count.to_string(), "row {at}: {args:?}");
    }
    let ttl: i64 = redis.cli(&["PTTL", "c"]).trim().parse().unwrap();
    assert!((1..=60_000).contains(&ttl), "PTTL {ttl}");
}
