//! The admin API (`rate_limit_admin`) and the state file (`rate_limit_state_file`) against a
//! real nginx: every row of the API's table, every error class, two workers seeing a change at
//! once, overrides and key resets changing real decisions, the metrics read by a Prometheus
//! parser, reloads, restarts with the state file, a corrupt state file.
//!
//! Zones use `rate=1r/m` or so and the key `$http_x_key`: decisions stay the same for the
//! seconds a test takes, and each test picks its keys.

mod common;

use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{get, send, Connection, Nginx, Request, Response};
use serde_json::{json, Value};

/// The admin tests' config (`common::admin::admin_api`) with lines of the main context
/// (`global`) and of the `http` block.
fn config(global: &str, http: &str) -> String {
    common::admin::admin_api().main(global).http(http).build()
}

fn start() -> Nginx {
    common::admin::admin_api().start()
}

/// An admin request on a new connection; the body is JSON when there is one.
fn admin_request(method: &str, path: &str, body: Option<&str>) -> Request {
    let request = Request::new(method, &format!("/ratelimit/{path}"));
    match body {
        Some(body) => request.json(body),
        None => request,
    }
}

/// `(status, JSON body or Null)` of an admin request.
fn admin(nginx: &Nginx, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
    let response = send(nginx.port(), &admin_request(method, path, body));
    (response.status, json_body(&response))
}

fn json_body(response: &Response) -> Value {
    if response.body.is_empty() {
        return Value::Null;
    }
    assert_eq!(
        response.header("Content-Type"),
        Some("application/json"),
        "{response:?}"
    );
    serde_json::from_slice(&response.body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", response.text()))
}

/// A request limited by zone `one` (or another location's zone) for `key`.
fn hit(nginx: &Nginx, path: &str, key: &str) -> u16 {
    send(nginx.port(), &Request::get(path).header("X-Key", key)).status
}

/// The error log has no alert, no crash, and the workers that started are still the ones
/// serving (none died and was replaced).
fn assert_healthy(nginx: &Nginx, workers: &[u32]) {
    let log = nginx.error_log();
    for bad in [
        "[alert]",
        "[crit]",
        "[emerg]",
        "panicked",
        "exited on signal",
    ] {
        assert!(!log.contains(bad), "{bad} in error.log:\n{log}");
    }
    assert_eq!(
        nginx.worker_pids(),
        workers,
        "a worker was replaced:\n{log}"
    );
    assert_eq!(get(nginx.port(), "/ratelimit/zones").status, 200);
}

/// Polls `condition` for up to 5 s (worker 0 writes the state file and logs just after start).
fn wait_for(condition: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !condition() {
        assert!(
            std::time::Instant::now() < deadline,
            "condition not met within 5 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn error_text(value: &Value) -> &str {
    value["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no \"error\" string in {value}"))
}

#[test]
fn get_zones_and_one_zone_show_configuration_and_counters() {
    let nginx = start();
    assert_eq!(hit(&nginx, "/", "a"), 200);
    assert_eq!(hit(&nginx, "/", "a"), 429);
    assert_eq!(hit(&nginx, "/bucket/", "a"), 200);

    let (status, zones) = admin(&nginx, "GET", "zones", None);
    assert_eq!(status, 200);
    let names: Vec<&str> = zones
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(names.len(), 4, "{zones}");
    for name in ["one", "bucket", "log", "window"] {
        assert!(zones[name].is_object(), "{name} missing: {zones}");
    }

    let (status, one) = admin(&nginx, "GET", "zones/one", None);
    assert_eq!(status, 200);
    assert_eq!(one, zones["one"]);
    for (field, value) in [
        ("algorithm", json!("leaky_bucket")),
        ("key", json!("$http_x_key")),
        ("rate", json!("1r/m")),
        ("burst", json!(0)),
        ("size", json!(1048576)),
        ("keys", json!(1)),
        ("passed", json!(1)),
        ("delayed", json!(0)),
        ("rejected", json!(1)),
        ("delayed_dry_run", json!(0)),
        ("rejected_dry_run", json!(0)),
        ("evictions", json!(0)),
        ("no_slot", json!(0)),
        ("overrides", json!(0)),
        ("config", json!({"rate": "1r/m", "burst": 0})),
    ] {
        assert_eq!(one[field], value, "{field} in {one}");
    }
    assert!(one["slots"].as_u64().unwrap() > 1000, "{one}");
    assert_eq!(zones["bucket"]["algorithm"], "token_bucket");
    assert_eq!(zones["bucket"]["burst"], 2);
    assert_eq!(zones["bucket"]["passed"], 1);
    assert_eq!(zones["log"]["algorithm"], "sliding_log");
    assert_eq!(zones["window"]["rate"], "10r/m");

    // HEAD: the same headers, no body.
    let head = send(nginx.port(), &Request::new("HEAD", "/ratelimit/zones/one"));
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty());
    assert_eq!(head.header("Content-Type"), Some("application/json"));
    // Zone names are percent-decoded too.
    assert_eq!(admin(&nginx, "GET", "zones/%6Fne", None).1, one);
}

/// A limited request for `key` passes with zone `one` at `rate` (`q=..;w=..`) in its
/// RateLimit-Policy; the worker that answered.
fn limited_with_policy(nginx: &Nginx, key: &str, rate: &str) -> u32 {
    let response = send(nginx.port(), &Request::get("/").header("X-Key", key));
    assert_eq!(response.status, 200, "{response:?}");
    let expected = format!("\"one\";{rate}");
    assert_eq!(response.header("RateLimit-Policy"), Some(expected.as_str()));
    response.worker_pid()
}

#[test]
fn patch_reaches_every_worker_at_once() {
    let nginx = start();
    let workers = nginx.worker_pids();
    assert_eq!(workers.len(), 2);
    // Both workers first answer limited requests at the configured rate (each keeps the
    // formatted RateLimit-Policy; it must not outlive the change).
    let mut before_seen = Vec::new();
    for attempt in 0..200 {
        if before_seen.len() == 2 {
            break;
        }
        let worker = limited_with_policy(&nginx, &format!("before-{attempt}"), "q=1;w=60");
        if !before_seen.contains(&worker) {
            before_seen.push(worker);
        }
    }
    assert_eq!(
        before_seen.len(),
        2,
        "both workers answered before the change"
    );
    let (status, zone) = admin(
        &nginx,
        "PATCH",
        "zones/one",
        Some(r#"{"rate": "30r/m", "burst": 4}"#),
    );
    assert_eq!(status, 200, "{zone}");
    assert_eq!(
        (&zone["rate"], &zone["burst"]),
        (&json!("30r/m"), &json!(4))
    );
    assert_eq!(zone["config"], json!({"rate": "1r/m", "burst": 0}));

    // New connections until both workers answered, for the API and for limited requests:
    // every answer already has the new limit.
    let mut api_seen = Vec::new();
    let mut limited_seen = Vec::new();
    for attempt in 0..200 {
        if api_seen.len() == 2 && limited_seen.len() == 2 {
            break;
        }
        let response = send(nginx.port(), &admin_request("GET", "zones/one", None));
        let zone = json_body(&response);
        assert_eq!(
            (&zone["rate"], &zone["burst"]),
            (&json!("30r/m"), &json!(4))
        );
        if !api_seen.contains(&response.worker_pid()) {
            api_seen.push(response.worker_pid());
        }
        let worker = limited_with_policy(&nginx, &format!("worker-{attempt}"), "q=30;w=60");
        if !limited_seen.contains(&worker) {
            limited_seen.push(worker);
        }
    }
    api_seen.sort_unstable();
    limited_seen.sort_unstable();
    assert_eq!(
        api_seen, workers,
        "the API was not answered by both workers"
    );
    assert_eq!(limited_seen, workers, "requests did not reach both workers");

    // The burst of 4 holds in either worker: 5 pass, the 6th is rejected, connection by
    // connection.
    let statuses: Vec<u16> = (0..6).map(|_| hit(&nginx, "/", "burst")).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
    assert_healthy(&nginx, &workers);
}

#[test]
fn readers_never_see_a_rate_with_another_patch_s_burst() {
    let nginx = start();
    let workers = nginx.worker_pids();
    let pairs = [("10r/s", 1), ("20r/s", 2)];
    let seen: Vec<(String, u64)> = std::thread::scope(|scope| {
        for (rate, burst) in pairs {
            let nginx = &nginx;
            scope.spawn(move || {
                let body = format!("{{\"rate\": \"{rate}\", \"burst\": {burst}}}");
                let mut connection = Connection::open(nginx.port());
                for _ in 0..100 {
                    let patch = admin_request("PATCH", "zones/one", Some(&body));
                    assert_eq!(connection.send(&patch).status, 200);
                }
            });
        }
        let reader = scope.spawn(|| {
            (0..150)
                .map(|_| {
                    let zone = admin(&nginx, "GET", "zones/one", None).1;
                    let rate = zone["rate"].as_str().unwrap().to_string();
                    (rate, zone["burst"].as_u64().unwrap())
                })
                .collect()
        });
        reader.join().unwrap()
    });
    for (rate, burst) in &seen {
        let expected = [("1r/m", 0), pairs[0], pairs[1]];
        assert!(
            expected.contains(&(rate.as_str(), *burst)),
            "rate {rate} with burst {burst}"
        );
    }
    assert_healthy(&nginx, &workers);
}

#[test]
fn patch_keeps_key_state_and_deleting_a_key_lets_it_pass() {
    let nginx = start();
    assert_eq!(hit(&nginx, "/", "k"), 200);
    assert_eq!(hit(&nginx, "/", "k"), 429);

    // A faster rate does not reset the key: it is still limited (a fresh key would pass).
    let (status, _) = admin(&nginx, "PATCH", "zones/one", Some(r#"{"rate": "2r/m"}"#));
    assert_eq!(status, 200);
    assert_eq!(hit(&nginx, "/", "k"), 429);
    let (_, after) = admin(&nginx, "GET", "zones/one/keys/k", None);
    assert_eq!(after["rate"], "2r/m");
    assert_eq!(after["would_pass"], false);
    assert!(after["retry_after_ms"].as_u64().unwrap() > 0, "{after}");

    // Either field alone; the other stays.
    let (_, zone) = admin(&nginx, "PATCH", "zones/one", Some(r#"{"burst": 3}"#));
    assert_eq!((&zone["rate"], &zone["burst"]), (&json!("2r/m"), &json!(3)));
    let (_, zone) = admin(&nginx, "PATCH", "zones/one", Some("{}"));
    assert_eq!((&zone["rate"], &zone["burst"]), (&json!("2r/m"), &json!(3)));
    // The new burst applies to a fresh key: 1 + 3 pass.
    let statuses: Vec<u16> = (0..5).map(|_| hit(&nginx, "/", "fresh")).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 429]);

    // DELETE forgets the key: it passes again.
    let (status, body) = admin(&nginx, "DELETE", "zones/one/keys/fresh", None);
    assert_eq!((status, body), (204, Value::Null));
    assert_eq!(admin(&nginx, "GET", "zones/one/keys/fresh", None).0, 404);
    assert_eq!(hit(&nginx, "/", "fresh"), 200);
}

/// A new rate applies to the backlog a key already has, as limit_req's excess drains at a
/// reloaded rate: one request at 1r/m leaves a key limited for a minute; after a PATCH (or an
/// override) to 30r/m the same backlog is 2 s long. Checked at 3 s, 1 s past the threshold.
#[test]
fn a_new_rate_drains_an_existing_backlog_at_that_rate() {
    let nginx = start();
    assert_eq!(hit(&nginx, "/", "patched"), 200);
    assert_eq!(hit(&nginx, "/", "overridden"), 200);
    // The override first (its key's backlog moves from the zone's 1r/m to 30r/m), then the
    // zone (every other key's backlog moves; the overridden key keeps its own).
    let (status, _) = admin(
        &nginx,
        "PUT",
        "zones/one/overrides/overridden",
        Some(r#"{"rate": "30r/m"}"#),
    );
    assert_eq!(status, 201);
    let (status, _) = admin(&nginx, "PATCH", "zones/one", Some(r#"{"rate": "30r/m"}"#));
    assert_eq!(status, 200);
    let started = std::time::Instant::now();
    assert_eq!(hit(&nginx, "/", "patched"), 429);
    assert_eq!(hit(&nginx, "/", "overridden"), 429);
    assert!(started.elapsed() < Duration::from_secs(1));
    std::thread::sleep(Duration::from_secs(3).saturating_sub(started.elapsed()));
    assert_eq!(hit(&nginx, "/", "patched"), 200);
    assert_eq!(hit(&nginx, "/", "patched"), 429);
    assert_eq!(hit(&nginx, "/", "overridden"), 200);
    assert_eq!(hit(&nginx, "/", "overridden"), 429);
}

#[test]
fn bad_patches_are_400_and_change_nothing() {
    let nginx = start();
    let workers = nginx.worker_pids();
    #[rustfmt::skip]
    let rows = [
        ("one", "{\"rate\": ", "malformed JSON"),
        ("one", "rate=2r/s", "malformed JSON"),
        ("one", "", "malformed JSON: EOF while parsing"),
        ("one", "[1, 2]", "the body must be a JSON object"),
        ("one", r#"{"rate": 20}"#, "invalid type: integer `20`, expected a rate"),
        ("one", r#"{"burst": "5"}"#, "invalid type: string \"5\""),
        ("one", r#"{"rate": "1r/s", "colour": "red"}"#, "unknown field `colour`"),
        ("one", r#"{"rate": "0r/s"}"#, "invalid rate \"0r/s\""),
        ("one", r#"{"rate": "-5r/s"}"#, "invalid rate \"-5r/s\""),
        ("one", r#"{"rate": "fast"}"#, "invalid rate \"fast\""),
        ("one", r#"{"burst": -1}"#, "invalid burst -1"),
        ("one", r#"{"burst": 2.5}"#, "invalid burst 2.5"),
        ("one", r#"{"burst": 4194304}"#, "invalid burst 4194304"),
        ("log", r#"{"burst": 1}"#, "\"burst\" is not used by sliding_log"),
        ("window", r#"{"burst": 0}"#, "\"burst\" is not used by sliding_window"),
        ("window", r#"{"rate": "2.5r/s"}"#, "is not a whole number of requests for sliding_window"),
        ("log", r#"{"rate": "11r/m"}"#,
         "rate \"11r/m\" is more than zone \"log\" can count: each key's sliding_log has room for 10"),
    ];
    for (zone, body, message) in rows {
        let (status, error) = admin(&nginx, "PATCH", &format!("zones/{zone}"), Some(body));
        assert_eq!(status, 400, "{zone} {body}: {error}");
        assert!(
            error_text(&error).contains(message),
            "{zone} {body}: {error}"
        );
    }
    let (_, zones) = admin(&nginx, "GET", "zones", None);
    assert_eq!(zones["one"]["rate"], "1r/m");
    assert_eq!(zones["one"]["burst"], 0);
    assert_eq!(zones["log"]["rate"], "10r/m");
    assert_eq!(zones["window"]["rate"], "10r/m");

    // What the sliding algorithms do take: a lower N, and back up to the configured N.
    assert_eq!(
        admin(&nginx, "PATCH", "zones/log", Some(r#"{"rate": "5r/m"}"#)).0,
        200
    );
    assert_eq!(
        admin(&nginx, "PATCH", "zones/log", Some(r#"{"rate": "10r/m"}"#)).0,
        200
    );
    assert_eq!(
        admin(
            &nginx,
            "PATCH",
            "zones/window",
            Some(r#"{"rate": "100r/s"}"#)
        )
        .0,
        200
    );
    assert_healthy(&nginx, &workers);
}

#[test]
fn keys_show_their_state_and_can_be_forgotten() {
    let nginx = start();
    let (status, error) = admin(&nginx, "GET", "zones/one/keys/nobody", None);
    assert_eq!(status, 404);
    assert_eq!(
        error_text(&error),
        "key \"nobody\" is not tracked in zone \"one\""
    );
    assert_eq!(
        admin(&nginx, "DELETE", "zones/one/keys/nobody", None).0,
        404
    );

    // A key with a slash and a space: percent-encoded in the path.
    let key = "user/7 x";
    assert_eq!(hit(&nginx, "/bucket/", key), 200);
    let (status, state) = admin(&nginx, "GET", "zones/bucket/keys/user%2F7%20x", None);
    assert_eq!(status, 200, "{state}");
    assert_eq!(state["zone"], "bucket");
    assert_eq!(state["key"], key);
    assert_eq!(
        (&state["rate"], &state["burst"]),
        (&json!("1r/m"), &json!(2))
    );
    assert_eq!(state["override"], Value::Null);
    assert_eq!(state["would_pass"], true);
    assert_eq!(state["remaining"], 1);
    assert_eq!(state["retry_after_ms"], 0);
    let reset_ms = state["reset_ms"].as_u64().unwrap();
    assert!((50_000..=60_000).contains(&reset_ms), "{state}");

    assert_eq!(hit(&nginx, "/bucket/", key), 200);
    assert_eq!(hit(&nginx, "/bucket/", key), 429);
    // The slash needs no encoding: everything after keys/ is the key.
    let (_, state) = admin(&nginx, "GET", "zones/bucket/keys/user/7%20x", None);
    assert_eq!(state["would_pass"], false);
    assert_eq!(state["remaining"], 0);
    let retry_after_ms = state["retry_after_ms"].as_u64().unwrap();
    assert!((1..=60_000).contains(&retry_after_ms), "{state}");

    assert_eq!(
        admin(&nginx, "DELETE", "zones/bucket/keys/user%2F7%20x", None).0,
        204
    );
    assert_eq!(
        admin(&nginx, "GET", "zones/bucket/keys/user%2F7%20x", None).0,
        404
    );
    assert_eq!(
        admin(&nginx, "DELETE", "zones/bucket/keys/user%2F7%20x", None).0,
        404
    );
    assert_eq!(hit(&nginx, "/bucket/", key), 200);
}

#[test]
fn overrides_change_real_decisions() {
    let nginx = start();
    // Zone "one": 1r/m, burst 0, nodelay: a second request is rejected...
    assert_eq!(hit(&nginx, "/", "plain"), 200);
    assert_eq!(hit(&nginx, "/", "plain"), 429);

    // ...unless the key has its own limit.
    let (status, created) = admin(
        &nginx,
        "PUT",
        "zones/one/overrides/vip%2F1",
        Some(r#"{"rate": "2r/m"}"#),
    );
    assert_eq!(status, 201, "{created}");
    assert_eq!(
        created,
        json!({"zone": "one", "key": "vip/1", "rate": "2r/m", "burst": 0})
    );
    let (status, replaced) = admin(
        &nginx,
        "PUT",
        "zones/one/overrides/vip%2F1",
        Some(r#"{"rate": "2r/m", "burst": 5}"#),
    );
    assert_eq!(status, 200, "{replaced}");
    assert_eq!(replaced["burst"], 5);

    let (status, list) = admin(&nginx, "GET", "zones/one/overrides", None);
    assert_eq!(status, 200);
    assert_eq!(list, json!({"vip/1": {"rate": "2r/m", "burst": 5}}));
    let (status, one) = admin(&nginx, "GET", "zones/one/overrides/vip%2F1", None);
    assert_eq!((status, &one["rate"]), (200, &json!("2r/m")));
    assert_eq!(admin(&nginx, "GET", "zones/one", None).1["overrides"], 1);

    // 1 + burst 5 pass at once with the override; the zone's other keys are unchanged.
    let statuses: Vec<u16> = (0..7).map(|_| hit(&nginx, "/", "vip/1")).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 200, 429]);
    assert_eq!(hit(&nginx, "/", "plain"), 429);
    let (_, state) = admin(&nginx, "GET", "zones/one/keys/vip%2F1", None);
    assert_eq!(state["override"], json!({"rate": "2r/m", "burst": 5}));
    assert_eq!(
        (&state["rate"], &state["burst"]),
        (&json!("2r/m"), &json!(5))
    );

    // Back to the zone's limit.
    let (status, body) = admin(&nginx, "DELETE", "zones/one/overrides/vip%2F1", None);
    assert_eq!((status, body), (204, Value::Null));
    assert_eq!(
        admin(&nginx, "DELETE", "zones/one/overrides/vip%2F1", None).0,
        404
    );
    let (status, error) = admin(&nginx, "GET", "zones/one/overrides/vip%2F1", None);
    assert_eq!(status, 404);
    assert_eq!(
        error_text(&error),
        "key \"vip/1\" has no override in zone \"one\""
    );
    assert_eq!(
        admin(&nginx, "GET", "zones/one/overrides", None).1,
        json!({})
    );
    let statuses: Vec<u16> = (0..2).map(|_| hit(&nginx, "/", "vip/1")).collect();
    assert_eq!(statuses[1], 429, "{statuses:?}");

    // Overrides of sliding zones follow the zone's rules; bodies are checked as for PATCH.
    #[rustfmt::skip]
    let rows = [
        ("log", r#"{"rate": "5r/m", "burst": 2}"#, 400),
        ("log", r#"{"rate": "50r/m"}"#, 400),
        ("window", r#"{"rate": "0.5r/s"}"#, 400),
        ("one", r#"{"burst": 2}"#, 400),
        ("one", r#"{"rate": "1r/s", "extra": true}"#, 400),
        ("one", r#"{"rate": "1r/s", "burst": -2}"#, 400),
        ("nozone", r#"{"rate": "1r/s"}"#, 404),
        ("log", r#"{"rate": "5r/m"}"#, 201),
        ("window", r#"{"rate": "1000r/m"}"#, 201),
    ];
    for (zone, body, expected) in rows {
        let (status, answer) = admin(
            &nginx,
            "PUT",
            &format!("zones/{zone}/overrides/k"),
            Some(body),
        );
        assert_eq!(status, expected, "{zone} {body}: {answer}");
    }
    // A sliding_log override below the zone's N (10r/m) limits the key to it.
    let statuses: Vec<u16> = (0..6).map(|_| hit(&nginx, "/log/", "k")).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
    let statuses: Vec<u16> = (0..11).map(|_| hit(&nginx, "/log/", "other")).collect();
    assert_eq!(
        statuses.iter().filter(|&&s| s == 200).count(),
        10,
        "{statuses:?}"
    );
}

/// Long keys fill the zone's memory before its table: the 507 then says it is the memory
/// (it said "no room for another override (512 at most)" with a fraction of 512 set).
#[test]
fn overrides_out_of_zone_memory_answer_507_naming_the_memory() {
    let nginx = start();
    let mut connection = Connection::open(nginx.port());
    let mut created = 0;
    let refused = loop {
        // 7000 bytes: within nginx's default 8k request line.
        let key = format!("{created:05}{}", "k".repeat(6995));
        let response = connection.send(&admin_request(
            "PUT",
            &format!("zones/one/overrides/{key}"),
            Some(r#"{"rate": "2r/s"}"#),
        ));
        if response.status != 201 || created == 512 {
            break response;
        }
        created += 1;
    };
    assert!(created > 0 && created < 512, "{created} overrides");
    assert_eq!(refused.status, 507, "{}", refused.text());
    assert_eq!(
        error_text(&json_body(&refused)),
        "zone \"one\" has no memory left for the key of another override (7000 bytes): its \
         1048576 bytes are in use; a larger zone size holds more"
    );
    // Removing one makes room again; the zone still limits.
    let first = format!("zones/one/overrides/00000{}", "k".repeat(6995));
    let removed = connection.send(&admin_request("DELETE", &first, None));
    assert_eq!(removed.status, 204, "{}", removed.text());
    let again = connection.send(&admin_request("PUT", &first, Some(r#"{"rate": "2r/s"}"#)));
    assert_eq!(again.status, 201, "{}", again.text());
    assert_eq!(hit(&nginx, "/", "someone"), 200);
    assert_eq!(hit(&nginx, "/", "someone"), 429);
}

#[test]
fn a_full_override_table_answers_507() {
    let nginx = start();
    let mut connection = Connection::open(nginx.port());
    let put = |connection: &mut Connection, key: &str, rate: &str| {
        let body = format!("{{\"rate\": \"{rate}\"}}");
        connection.send(&admin_request(
            "PUT",
            &format!("zones/bucket/overrides/{key}"),
            Some(&body),
        ))
    };
    for n in 0..512 {
        let response = put(&mut connection, &format!("key{n}"), "2r/s");
        assert_eq!(response.status, 201, "override {n}: {}", response.text());
    }
    let full = put(&mut connection, "one-too-many", "2r/s");
    assert_eq!(full.status, 507, "{}", full.text());
    assert_eq!(
        error_text(&json_body(&full)),
        "zone \"bucket\" has no room for another override (512 at most)"
    );
    // Replacing one still works; removing one makes room.
    assert_eq!(put(&mut connection, "key7", "3r/s").status, 200);
    let removed = connection.send(&admin_request(
        "DELETE",
        "zones/bucket/overrides/key7",
        None,
    ));
    assert_eq!(removed.status, 204);
    assert_eq!(put(&mut connection, "one-too-many", "2r/s").status, 201);
    let (_, zone) = admin(&nginx, "GET", "zones/bucket", None);
    assert_eq!(zone["overrides"], 512);
}

/// Sends raw bytes and reads until the server closes; returns the status and the body.
fn raw_exchange(port: u16, request: &[u8]) -> (u16, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(request).expect("write");
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    (status, body)
}

#[test]
fn every_error_class_is_json_and_nginx_keeps_serving() {
    let nginx = start();
    let workers = nginx.worker_pids();

    // 404: unknown zone, unknown paths.
    #[rustfmt::skip]
    let not_found = [
        ("GET", "zones/nozone", "unknown zone \"nozone\": the zones are \"one\", \"bucket\", \
          \"log\" and \"window\""),
        ("PATCH", "zones/nozone", "unknown zone \"nozone\": the zones are"),
        ("GET", "zones/nozone/overrides", "unknown zone \"nozone\": the zones are"),
        ("DELETE", "zones/nozone/keys/k", "unknown zone \"nozone\": the zones are"),
        ("GET", "zones/windw/top", "unknown zone \"windw\", did you mean \"window\"? the \
          zones are \"one\", \"bucket\", \"log\" and \"window\""),
        ("GET", "zone", "unknown path \"zone\""),
        ("GET", "zones/one/keys", "unknown path"),
        ("GET", "zones/one/other", "unknown path"),
        ("GET", "metrics/more", "unknown path"),
    ];
    for (method, path, message) in not_found {
        let body = (method == "PATCH").then_some("{}");
        let (status, error) = admin(&nginx, method, path, body);
        assert_eq!(status, 404, "{method} {path}: {error}");
        assert!(
            error_text(&error).starts_with(message),
            "{method} {path}: {error}"
        );
    }
    // 400: a broken percent-encoding
    // (nginx refuses most broken percent-encodings itself, with its own page.)
    let response = send(
        nginx.port(),
        &admin_request("GET", "zones/one/keys/%zz", None),
    );
    assert_eq!(response.status, 400);

    // 405 with Allow.
    #[rustfmt::skip]
    let wrong_method = [
        ("POST", "zones", "GET, HEAD"),
        ("DELETE", "zones/one", "GET, HEAD, PATCH"),
        ("PUT", "zones/one/keys/k", "GET, HEAD, DELETE"),
        ("POST", "zones/one/overrides", "GET, HEAD"),
        ("PATCH", "zones/one/overrides/k", "GET, HEAD, PUT, DELETE"),
        ("PUT", "metrics", "GET, HEAD"),
        ("OPTIONS", "zones", "GET, HEAD"),
    ];
    for (method, path, allow) in wrong_method {
        let response = send(nginx.port(), &admin_request(method, path, None));
        assert_eq!(response.status, 405, "{method} {path}");
        assert_eq!(response.header("Allow"), Some(allow), "{method} {path}");
        let error = json_body(&response);
        assert!(error_text(&error).contains(method), "{error}");
    }

    // 403: writes on the read-only location; reads work there.
    for (method, path) in [
        ("PATCH", "zones/one"),
        ("DELETE", "zones/one/keys/k"),
        ("PUT", "zones/one/overrides/k"),
        ("DELETE", "zones/one/overrides/k"),
    ] {
        let request =
            Request::new(method, &format!("/readonly/{path}")).json(r#"{"rate": "5r/s"}"#);
        let response = send(nginx.port(), &request);
        assert_eq!(response.status, 403, "{method} {path}");
        assert!(error_text(&json_body(&response)).contains("read-only"));
    }
    assert_eq!(get(nginx.port(), "/readonly/zones/one").status, 200);
    assert_eq!(get(nginx.port(), "/readonly/metrics").status, 200);
    assert_eq!(
        admin(&nginx, "GET", "zones/one/overrides", None).1,
        json!({})
    );

    // 413: a declared length over 64 KiB, and a chunked body that turns out longer.
    let big = format!("{{\"rate\": \"5r/s\"{}}}", " ".repeat(70_000));
    let response = send(
        nginx.port(),
        &admin_request("PATCH", "zones/one", Some(&big)),
    );
    assert_eq!(response.status, 413);
    assert_eq!(
        error_text(&json_body(&response)),
        "request body is larger than 65536 bytes"
    );
    let mut chunked = format!(
        "PATCH /ratelimit/zones/one HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Transfer-Encoding: chunked\r\n\r\n{:x}\r\n",
        big.len()
    )
    .into_bytes();
    chunked.extend_from_slice(big.as_bytes());
    chunked.extend_from_slice(b"\r\n0\r\n\r\n");
    let (status, body) = raw_exchange(nginx.port(), &chunked);
    assert_eq!(status, 413, "{body}");
    assert!(
        body.contains("request body is larger than 65536 bytes"),
        "{body}"
    );
    // A body over nginx's in-memory buffer (read back from its temporary file) but under the
    // limit is fine.
    let padded = format!("{{\"rate\": \"5r/s\"{}}}", " ".repeat(40_000));
    let (status, zone) = admin(&nginx, "PATCH", "zones/one", Some(&padded));
    assert_eq!((status, &zone["rate"]), (200, &json!("5r/s")));

    // Garbage in the path never hurts (nginx itself refuses %00 with its own 400).
    for path in [
        "zones/%FF%FE",
        "zones/one/keys/%00",
        "zones/one/overrides/%C3%28",
    ] {
        let status = send(nginx.port(), &admin_request("GET", path, None)).status;
        assert!([404, 400].contains(&status), "{path}: {status}");
    }
    assert_healthy(&nginx, &workers);
}

#[test]
fn metrics_read_by_a_prometheus_parser() {
    let nginx = start();
    assert_eq!(hit(&nginx, "/", "m"), 200);
    assert_eq!(hit(&nginx, "/", "m"), 429);
    assert_eq!(hit(&nginx, "/", "n"), 200);
    admin(
        &nginx,
        "PUT",
        "zones/one/overrides/v",
        Some(r#"{"rate": "3r/s", "burst": 7}"#),
    );

    let response = get(nginx.port(), "/ratelimit/metrics");
    assert_eq!(response.status, 200);
    assert_eq!(
        response.header("Content-Type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let text = response.text();
    let lines = text.lines().map(|line| Ok(line.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("the exposition parses");
    // The parser skips lines it cannot read: every sample line must have become a sample.
    let sample_lines = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty());
    assert_eq!(scrape.samples.len(), sample_lines.count(), "{text}");

    let value = |metric: &str, zone: &str, outcome: Option<&str>| -> prometheus_parse::Value {
        scrape
            .samples
            .iter()
            .find(|s| {
                s.metric == metric
                    && s.labels.get("zone") == Some(zone)
                    && s.labels.get("outcome") == outcome
            })
            .unwrap_or_else(|| panic!("no {metric} for {zone} {outcome:?}:\n{text}"))
            .value
            .clone()
    };
    use prometheus_parse::Value::{Counter, Gauge};
    let total = "rate_limit_requests_total";
    assert_eq!(value(total, "one", Some("passed")), Counter(2.0));
    assert_eq!(value(total, "one", Some("rejected")), Counter(1.0));
    assert_eq!(value(total, "one", Some("delayed")), Counter(0.0));
    assert_eq!(value(total, "one", Some("delayed_dry_run")), Counter(0.0));
    assert_eq!(value(total, "one", Some("rejected_dry_run")), Counter(0.0));
    assert_eq!(value(total, "bucket", Some("passed")), Counter(0.0));
    assert_eq!(value("rate_limit_keys", "one", None), Gauge(2.0));
    assert_eq!(value("rate_limit_keys", "log", None), Gauge(0.0));
    assert_eq!(
        value("rate_limit_zone_size_bytes", "one", None),
        Gauge(1048576.0)
    );
    assert_eq!(
        value("rate_limit_evictions_total", "one", None),
        Counter(0.0)
    );
    assert_eq!(value("rate_limit_overrides", "one", None), Gauge(1.0));
    assert_eq!(value("rate_limit_burst", "bucket", None), Gauge(2.0));
    let per_minute = 1.0 / 60.0;
    assert_eq!(
        value("rate_limit_rate_per_second", "one", None),
        Gauge(per_minute)
    );
    let Gauge(slots) = value("rate_limit_zone_slots", "one", None) else {
        panic!("slots is not a gauge");
    };
    let Gauge(fullness) = value("rate_limit_zone_fullness", "one", None) else {
        panic!("fullness is not a gauge");
    };
    assert!((fullness - 2.0 / slots).abs() < 1e-12, "{fullness} {slots}");
    for metric in [
        "rate_limit_requests_total",
        "rate_limit_keys",
        "rate_limit_zone_slots",
        "rate_limit_zone_size_bytes",
        "rate_limit_zone_fullness",
        "rate_limit_evictions_total",
        "rate_limit_no_slot_total",
        "rate_limit_overrides",
        "rate_limit_rate_per_second",
        "rate_limit_burst",
    ] {
        assert!(scrape.docs.contains_key(metric), "no HELP for {metric}");
        assert!(
            text.contains(&format!("# TYPE {metric} ")),
            "no TYPE for {metric}"
        );
    }
}

#[test]
fn a_reload_keeps_runtime_changes_until_the_configuration_changes() {
    let mut nginx = start();
    admin(
        &nginx,
        "PATCH",
        "zones/one",
        Some(r#"{"rate": "30r/m", "burst": 3}"#),
    );
    admin(&nginx, "PATCH", "zones/bucket", Some(r#"{"burst": 9}"#));
    admin(
        &nginx,
        "PUT",
        "zones/one/overrides/vip",
        Some(r#"{"rate": "5r/s"}"#),
    );

    // The same configuration: every change stays.
    let workers = nginx.reload();
    let (_, zones) = admin(&nginx, "GET", "zones", None);
    assert_eq!(
        (&zones["one"]["rate"], &zones["one"]["burst"]),
        (&json!("30r/m"), &json!(3))
    );
    assert_eq!(zones["bucket"]["burst"], 9);
    assert_eq!(zones["one"]["overrides"], 1);

    // Zone "one" gets a new rate in the configuration: the configuration wins for that zone;
    // the other zone's runtime change and the override stay.
    let changed =
        config("", "").replace("zone=one:1m rate=1r/m;", "zone=one:1m rate=6r/m burst=1;");
    nginx.reload_with(&changed);
    let (_, zones) = admin(&nginx, "GET", "zones", None);
    assert_eq!(
        (&zones["one"]["rate"], &zones["one"]["burst"]),
        (&json!("6r/m"), &json!(1))
    );
    assert_eq!(zones["one"]["config"], json!({"rate": "6r/m", "burst": 1}));
    assert_eq!(zones["bucket"]["burst"], 9);
    let (_, overrides) = admin(&nginx, "GET", "zones/one/overrides", None);
    // The override took the zone's burst of the moment (3) as its own.
    assert_eq!(overrides, json!({"vip": {"rate": "5r/s", "burst": 3}}));
    let workers_now = nginx.worker_pids();
    assert_ne!(workers, workers_now);
    assert_healthy(&nginx, &workers_now);
}

/// A directory outside any nginx prefix, for a state file that outlives one nginx.
struct StateDir(PathBuf);

impl StateDir {
    fn new() -> StateDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "ngx-rate-limit-admin-state-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        StateDir(dir)
    }

    fn file(&self) -> PathBuf {
        self.0.join("rate_limit.json")
    }

    fn read(&self) -> Value {
        common::state_file::read(&self.file())
    }
}

impl Drop for StateDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// The template with a state file at `path`; workers run as root to write it.
fn with_state_file(path: &Path) -> String {
    config(
        "user root;",
        &format!("rate_limit_state_file {};", path.display()),
    )
}

#[test]
fn a_restart_restores_the_state_file() {
    let dir = StateDir::new();
    let conf = with_state_file(&dir.file());

    let nginx = Nginx::start(&conf);
    assert!(nginx
        .error_log()
        .contains("does not exist yet: nothing to restore"));
    admin(
        &nginx,
        "PATCH",
        "zones/one",
        Some(r#"{"rate": "0.5r/s", "burst": 2}"#),
    );
    admin(&nginx, "PATCH", "zones/log", Some(r#"{"rate": "4r/m"}"#));
    admin(
        &nginx,
        "PUT",
        "zones/one/overrides/user%2F7%20%FF",
        Some(r#"{"rate": "9r/s", "burst": 1}"#),
    );
    admin(
        &nginx,
        "PUT",
        "zones/log/overrides/gone",
        Some(r#"{"rate": "2r/m"}"#),
    );
    assert_eq!(
        admin(&nginx, "DELETE", "zones/log/overrides/gone", None).0,
        204
    );
    nginx.stop();

    let saved = dir.read();
    assert_eq!(saved["version"], 2);
    assert_eq!(
        saved["zones"]["one"],
        json!({
            "algorithm": "leaky_bucket",
            "config": {"rate": "1r/m", "burst": 0},
            "limits": {"rate": "0.5r/s", "burst": 2},
            "overrides": {"user%2F7%20%FF": {"rate": "9r/s", "burst": 1}}
        })
    );
    assert_eq!(
        saved["zones"]["log"]["limits"],
        json!({"rate": "4r/m", "burst": 0})
    );
    assert_eq!(saved["zones"]["log"]["overrides"], json!({}));
    assert_eq!(
        saved["zones"]["window"]["limits"],
        json!({"rate": "10r/m", "burst": 0})
    );
    let leftovers: Vec<_> = fs::read_dir(&dir.0)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // Same configuration: everything comes back.
    let nginx = Nginx::start(&conf);
    let (_, zones) = admin(&nginx, "GET", "zones", None);
    assert_eq!(
        (&zones["one"]["rate"], &zones["one"]["burst"]),
        (&json!("0.5r/s"), &json!(2))
    );
    assert_eq!(zones["log"]["rate"], "4r/m");
    let (_, overrides) = admin(&nginx, "GET", "zones/one/overrides", None);
    assert_eq!(
        overrides,
        json!({"user/7 \u{fffd}": {"rate": "9r/s", "burst": 1}})
    );
    assert_eq!(
        admin(&nginx, "GET", "zones/one/overrides/user%2F7%20%ff", None).1["rate"],
        "9r/s"
    );
    let log = nginx.error_log();
    assert!(
        log.contains("zone \"one\" restored: rate 0.5r/s burst 2, 1 override(s)"),
        "{log}"
    );
    nginx.stop();

    // The configuration of zone "one" changed meanwhile: it wins; the override stays. Zone
    // "window" is gone from the configuration: named in the log, dropped from the file.
    let changed = conf
        .replace("zone=one:1m rate=1r/m;", "zone=one:1m rate=2r/m;")
        .replace(
            "rate_limit_zone $http_x_key zone=window:1m rate=10r/m algorithm=sliding_window;",
            "",
        );
    let nginx = Nginx::start(&changed);
    let (_, one) = admin(&nginx, "GET", "zones/one", None);
    assert_eq!((&one["rate"], &one["burst"]), (&json!("2r/m"), &json!(0)));
    assert_eq!(one["overrides"], 1);
    assert_eq!(admin(&nginx, "GET", "zones/log", None).1["rate"], "4r/m");
    wait_for(|| nginx.error_log().contains("is no longer configured"));
    let log = nginx.error_log();
    assert!(
        log.contains(
            "zone \"one\": the configuration changed from rate 1r/m burst 0 to rate 2r/m \
             burst 0, it wins over the runtime limits (rate 0.5r/s burst 2)"
        ),
        "{log}"
    );
    assert!(
        log.contains("zone \"window\" is no longer configured: its runtime limits and 0 override(s) are dropped"),
        "{log}"
    );
    nginx.stop();
    let saved = dir.read();
    assert!(saved["zones"].get("window").is_none(), "{saved}");
    assert_eq!(
        saved["zones"]["one"]["limits"],
        json!({"rate": "2r/m", "burst": 0})
    );
}

#[test]
fn a_corrupt_state_file_is_logged_and_ignored() {
    let dir = StateDir::new();
    fs::write(dir.file(), "{\"version\": 1, \"zones\": {\"one\": ").unwrap();
    let nginx = Nginx::start(&with_state_file(&dir.file()));
    let workers = nginx.worker_pids();
    let reason = format!(
        "rate_limit_state_file \"{}\" is ignored: invalid JSON: EOF while parsing a value",
        dir.file().display()
    );
    let log = nginx.error_log();
    assert!(
        log.lines()
            .any(|line| line.contains("[error]") && line.contains(&reason)),
        "{log}"
    );
    let (_, one) = admin(&nginx, "GET", "zones/one", None);
    assert_eq!(one["rate"], "1r/m");
    assert_eq!(hit(&nginx, "/", "c"), 200);
    // Worker 0 replaced the corrupt file with the state in force.
    wait_for(|| fs::read_to_string(dir.file()).is_ok_and(|text| text.contains("\"window\"")));
    assert_eq!(
        dir.read()["zones"]["one"]["limits"],
        json!({"rate": "1r/m", "burst": 0})
    );
    assert_healthy(&nginx, &workers);
}

#[test]
fn a_relative_state_file_is_under_the_prefix() {
    let nginx = Nginx::start(&config(
        "user root;",
        "rate_limit_state_file state/admin.json;",
    ));
    // The directory does not exist: the file cannot be written, which is logged.
    let lock = format!(
        "{}: No such file",
        nginx.prefix().join("state/admin.json.lock").display()
    );
    wait_for(|| nginx.error_log().contains(&lock));
    nginx.write_file("state/.keep", "");
    let (status, _) = admin(&nginx, "PATCH", "zones/one", Some(r#"{"burst": 1}"#));
    assert_eq!(status, 200);
    let path = nginx.prefix().join("state/admin.json");
    let saved = common::state_file::read(&path);
    assert_eq!(saved["zones"]["one"]["limits"]["burst"], 1);
}

#[test]
fn a_state_file_workers_cannot_write_is_logged_and_the_change_still_applies() {
    // Workers run as nobody (no `user root;`): a directory only root may write is refused.
    let dir = StateDir::new();
    let nginx = Nginx::start(&config(
        "",
        &format!("rate_limit_state_file {};", dir.file().display()),
    ));
    let (status, zone) = admin(&nginx, "PATCH", "zones/one", Some(r#"{"burst": 2}"#));
    assert_eq!((status, &zone["burst"]), (200, &json!(2)));
    // nginx switches workers to nobody only when it runs as root.
    let running_as_root = fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false);
    if running_as_root {
        wait_for(|| nginx.error_log().contains("was not written: "));
        assert!(
            nginx.error_log().contains("Permission denied"),
            "{}",
            nginx.error_log()
        );
        assert!(!dir.file().exists());
    }
    assert_eq!(admin(&nginx, "GET", "zones/one", None).1["burst"], 2);
}

#[test]
fn the_admin_example_config_serves_the_api_on_its_loopback_listener() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("nginx-conf/admin.conf");
    let example = fs::read_to_string(&path).expect("nginx-conf/admin.conf");
    // The admin listener is %%PORT2%% (scripts/run-example.sh fills in 8081), which the
    // harness fills with a free port; workers run as root to write the state file.
    assert!(example.contains("listen 127.0.0.1:%%PORT2%%;"));
    let conf = format!("user root;\n{example}");
    let nginx = Nginx::start(&conf);
    assert_eq!(get(nginx.port(), "/").status, 200);
    // The admin API is not on the public listener.
    assert_eq!(get(nginx.port(), "/ratelimit/zones").status, 404);

    let admin_port = nginx.port_n(2);
    let response = get(admin_port, "/ratelimit/zones");
    assert_eq!(response.status, 200);
    let zones = json_body(&response);
    assert!(
        zones.as_object().is_some_and(|zones| !zones.is_empty()),
        "{zones}"
    );
    let name = zones.as_object().unwrap().keys().next().unwrap().clone();
    let patch = Request::new("PATCH", &format!("/ratelimit/zones/{name}")).json(r#"{"burst": 7}"#);
    let response = send(admin_port, &patch);
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(get(admin_port, "/ratelimit/metrics").status, 200);
    assert!(nginx.prefix().join("rate_limit_state.json").exists());
}

/// nginx's own refusals in front of the API are answered as the API's JSON errors: a body
/// over `client_max_body_size` (413, found once the admin location is chosen) and a request
/// line over `large_client_header_buffers` (414, found before any location, in a server that
/// has an admin location). Elsewhere nginx's HTML pages stay as they are.
#[test]
fn nginx_own_413_and_414_before_the_api_are_json() {
    let nginx = Nginx::start(
        r#"
load_module %%MODULE%%;
error_log logs/error.log notice;
events { worker_connections 64; }
http {
    access_log off;
    client_max_body_size 1k;
    large_client_header_buffers 2 1k;
    rate_limit_zone $http_x_key zone=one:1m rate=1r/m;
    server {
        listen 127.0.0.1:%%PORT%%;
        location /ratelimit/ {
            rate_limit_admin write=on;
        }
        location / {
            root html;
        }
    }
    server {
        listen 127.0.0.1:%%PORT2%%;
        location / {
            root html;
        }
    }
}
"#,
    );
    let big_body = format!(r#"{{"burst": 1, "pad": "{}"}}"#, "x".repeat(2048));
    let patch = Request::new("PATCH", "/ratelimit/zones/one").json(&big_body);
    let response = send(nginx.port(), &patch);
    assert_eq!(response.status, 413, "{}", response.text());
    assert_eq!(
        json_body(&response),
        json!({"error": "request body is larger than client_max_body_size (1024 bytes)"})
    );
    // The zone did not change.
    assert_eq!(admin(&nginx, "GET", "zones/one", None).1["burst"], 0);

    let long_key = "k".repeat(10_000);
    let response = send(
        nginx.port(),
        &Request::get(&format!("/ratelimit/zones/one/keys/{long_key}")),
    );
    assert_eq!(response.status, 414, "{}", response.text());
    assert_eq!(
        json_body(&response),
        json!({"error": "request line is longer than large_client_header_buffers"})
    );

    // A location without the API, and a server without one, keep nginx's pages.
    let upload = Request::new("POST", "/index.html").body(big_body.clone());
    for (port, request) in [
        (nginx.port(), upload.clone()),
        (nginx.port_n(2), upload),
        (nginx.port_n(2), Request::get(&format!("/{long_key}"))),
    ] {
        let response = send(port, &request);
        assert!(
            [413, 414].contains(&response.status),
            "{request:?}: {response:?}"
        );
        assert_eq!(
            response.header("Content-Type"),
            Some("text/html"),
            "{response:?}"
        );
        assert!(response.text().contains("<html>"), "{}", response.text());
    }
}

/// `nginx -t` refuses `rate_limit_admin` where the API cannot find its paths (a regex or a
/// named location) and says why; the prefix without its slash (`/ratelimit`) is redirected to
/// it (301), as nginx does for `proxy_pass` locations, and the redirect leads to the JSON.
#[test]
fn the_admin_location_is_a_prefix_and_its_name_without_slash_redirects() {
    for (location, kind, name) in [
        ("location ~ ^/rl/ { rate_limit_admin; }", "regex", "^/rl/"),
        ("location @admin { rate_limit_admin; }", "named", "@admin"),
    ] {
        let (ok, output) = common::check_config(
            &common::config::config()
                .http("rate_limit_zone $http_x_key zone=z:1m rate=1r/s;")
                .locations(location)
                .build(),
        );
        assert!(!ok, "{location}: accepted");
        let expected = format!(
            "[emerg] \"rate_limit_admin\" cannot be used in the {kind} location \"{name}\": \
             the API's paths follow the location's prefix, so it needs a prefix location, such \
             as \"location /ratelimit/ {{ rate_limit_admin; }}\" in "
        );
        assert!(output.contains(&expected), "{location}: {output}");
    }

    let nginx = start();
    let response = get(nginx.port(), "/ratelimit?x=1");
    assert_eq!(response.status, 301, "{response:?}");
    let location = response.header("Location").unwrap_or_default().to_string();
    assert!(
        location.ends_with(&format!(":{}/ratelimit/?x=1", nginx.port())),
        "{location}"
    );
    let root = send(
        nginx.port(),
        &Request::get("/ratelimit/").header("Accept", "application/json"),
    );
    assert_eq!(root.status, 200);
    assert_eq!(json_body(&root)["write"], true);
    // A location without the trailing slash is not redirected: it is the API's root itself.
    let (ok, output) = common::check_config(
        &common::config::config()
            .http("rate_limit_zone $http_x_key zone=z:1m rate=1r/s;")
            .locations("location /api { rate_limit_admin; }")
            .build(),
    );
    assert!(ok, "{output}");
}

/// `GET zones/NAME/history`: each request counted in its second, the last second being now
/// (Unix time), and the counts kept over a reload (they are in the zone's memory).
#[test]
fn history_counts_requests_per_second_and_survives_a_reload() {
    let mut nginx = start();
    let statuses: Vec<u16> = (0..3).map(|_| hit(&nginx, "/", "history")).collect();
    assert_eq!(statuses, [200, 429, 429]);
    let sums = |nginx: &Nginx| {
        let (status, history) = admin(nginx, "GET", "zones/one/history", None);
        assert_eq!(status, 200, "{history}");
        assert_eq!(history["zone"], "one");
        assert_eq!(history["seconds"], 300);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let end = history["end"].as_u64().expect("end");
        assert!(end.abs_diff(now) <= 2, "end {end}, now {now}");
        ["passed", "delayed", "rejected"].map(|series| {
            let counts = history[series].as_array().expect(series);
            assert_eq!(counts.len(), 300, "{series}");
            counts.iter().filter_map(Value::as_u64).sum::<u64>()
        })
    };
    assert_eq!(sums(&nginx), [1, 0, 2]);
    nginx.reload();
    assert_eq!(sums(&nginx), [1, 0, 2]);
    let (status, error) = admin(&nginx, "GET", "zones/none/history", None);
    assert_eq!(
        (status, error_text(&error)),
        (
            404,
            "unknown zone \"none\": the zones are \"one\", \"bucket\", \"log\" and \"window\""
        )
    );
}

/// `GET zones/NAME/history` prints each series of 300 counts on one line (not a line per
/// count), in an object as pretty as the other answers'.
#[test]
fn history_prints_a_series_a_line() {
    let nginx = start();
    assert_eq!(hit(&nginx, "/", "history"), 200);
    let response = send(
        nginx.port(),
        &admin_request("GET", "zones/one/history", None),
    );
    assert_eq!(response.status, 200);
    let text = response.text();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 8, "{text}");
    assert_eq!(
        lines[..3],
        ["{", "  \"zone\": \"one\",", "  \"seconds\": 300,"]
    );
    for (line, series) in lines[4..7].iter().zip(["passed", "delayed", "rejected"]) {
        let prefix = format!("  \"{series}\": [");
        let counts = line
            .strip_prefix(&prefix)
            .and_then(|rest| rest.trim_end_matches(',').strip_suffix(']'))
            .unwrap_or_else(|| panic!("{series}: {line}"));
        assert_eq!(counts.split(", ").count(), 300, "{line}");
    }
    let passed = json_body(&response)["passed"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        passed.iter().filter_map(Value::as_u64).sum::<u64>(),
        1,
        "{text}"
    );
    // The other answers keep a value a line.
    let root = send(
        nginx.port(),
        &Request::get("/ratelimit/").header("Accept", "application/json"),
    )
    .text();
    assert!(root.contains("\"zones\": [\n    \"one\",\n"), "{root}");
}
