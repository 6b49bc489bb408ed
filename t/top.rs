//! Top limited keys (`GET zones/NAME/top`) against a real nginx with two workers: rejections
//! and delays counted per key across workers, exact for a few keys, long keys cut, a zone too
//! small to keep them, bad parameters; and what the admin location's root offers.
//!
//! Zones use `rate=1r/m`: over the seconds a test takes, a key's first request passes and
//! every later one is limited, whichever worker answers.

mod common;

use common::{send, Nginx, Request, Response};
use serde_json::{json, Value};

fn hit(nginx: &Nginx, path: &str, key: &str) -> u16 {
    send(nginx.port(), &Request::get(path).header("X-Key", key)).status
}

fn get_json(nginx: &Nginx, path: &str) -> (u16, Value) {
    let response = send(nginx.port(), &Request::get(path));
    let body = serde_json::from_slice(&response.body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", response.text()));
    (response.status, body)
}

/// `[(key, count)]` of a top answer.
fn counts(top: &Value) -> Vec<(String, u64)> {
    top["keys"]
        .as_array()
        .unwrap_or_else(|| panic!("no keys: {top}"))
        .iter()
        .map(|k| {
            (
                k["key"].as_str().unwrap().to_string(),
                k["count"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn rejections_are_counted_per_key_across_workers() {
    let nginx = common::admin::top_keys().start();
    // key -> requests: the first of each passes, the others are rejected.
    for (key, requests) in [("heavy", 7), ("light", 2), ("once", 1)] {
        for _ in 0..requests {
            hit(&nginx, "/", key);
        }
    }
    let (status, top) = get_json(&nginx, "/ratelimit/zones/one/top");
    assert_eq!(status, 200, "{top}");
    assert_eq!(
        counts(&top),
        [("heavy".to_string(), 6), ("light".to_string(), 1)]
    );
    assert_eq!(top["total"], 7);
    assert_eq!(
        (&top["by"], &top["window"]),
        (&json!("rejected"), &json!("1m"))
    );
    assert!(top["keys"]
        .as_array()
        .unwrap()
        .iter()
        .all(|k| k["error"] == 0));
    // The ten-minute window holds the same requests; the read-only location answers too.
    let (_, ten) = get_json(&nginx, "/readonly/zones/one/top?window=10m&limit=1");
    assert_eq!(counts(&ten), [("heavy".to_string(), 6)]);
    let (_, delayed) = get_json(&nginx, "/ratelimit/zones/one/top?by=delayed");
    assert_eq!(counts(&delayed), []);
    // The per-zone counter agrees with the summary's total.
    let (_, zone) = get_json(&nginx, "/ratelimit/zones/one");
    assert_eq!(zone["rejected"], 7);
    assert!(!nginx.error_log().contains("[alert]"));
}

#[test]
fn delays_are_counted_dry_run_included() {
    let nginx = common::admin::top_keys().start();
    nginx.write_file("html/index.html", "ok");
    // burst=5 at 1r/m: the 2nd to 6th requests are delays (dry run: answered at once), the
    // 7th is a rejection (dry run: answered too).
    let statuses: Vec<u16> = (0..7).map(|_| hit(&nginx, "/dry/", "queued")).collect();
    assert_eq!(statuses, [200; 7]);
    let (_, delayed) = get_json(&nginx, "/ratelimit/zones/slow/top?by=delayed");
    assert_eq!(counts(&delayed), [("queued".to_string(), 5)]);
    let (_, rejected) = get_json(&nginx, "/ratelimit/zones/slow/top?by=rejected");
    assert_eq!(counts(&rejected), [("queued".to_string(), 1)]);
}

#[test]
fn long_keys_are_cut_and_small_zones_keep_none() {
    let nginx = common::admin::top_keys().start();
    nginx.write_file("html/index.html", "ok");
    let long = "k".repeat(100);
    hit(&nginx, "/", &long);
    hit(&nginx, "/", &long);
    let (_, top) = get_json(&nginx, "/ratelimit/zones/one/top");
    let key = &top["keys"][0];
    assert_eq!(key["key"], "k".repeat(60));
    assert_eq!(
        (&key["truncated"], &key["count"]),
        (&json!(true), &json!(1))
    );
    assert_eq!(top["key_bytes"], 60);

    // A 64k zone limits as before but keeps no top keys.
    assert_eq!(
        (hit(&nginx, "/tiny/", "t"), hit(&nginx, "/tiny/", "t")),
        (200, 429)
    );
    let (status, error) = get_json(&nginx, "/ratelimit/zones/tiny/top");
    assert_eq!(status, 404);
    assert_eq!(
        error["error"],
        "zone \"tiny\" keeps no top keys: it needs 256k of shared memory at least"
    );
}

#[test]
fn bad_parameters_name_the_problem() {
    let nginx = common::admin::top_keys().start();
    #[rustfmt::skip]
    let rows = [
        ("by=passed", "invalid by \"passed\": use rejected, delayed, blocked or tokens"),
        ("window=2m", "invalid window \"2m\": use 1m or 10m"),
        ("limit=1000", "invalid limit \"1000\": use a number from 1 to 100"),
        ("top=5", "unknown parameter \"top\": use by, window and limit"),
    ];
    for (query, message) in rows {
        let (status, error) = get_json(&nginx, &format!("/ratelimit/zones/one/top?{query}"));
        assert_eq!(
            (status, error["error"].as_str()),
            (400, Some(message)),
            "{query}"
        );
    }
    let (status, _) = get_json(&nginx, "/ratelimit/zones/nozone/top");
    assert_eq!(status, 404);
}

#[test]
fn the_root_says_what_the_location_offers() {
    let nginx = common::admin::top_keys().start();
    let (status, root) = get_json(&nginx, "/ratelimit/");
    assert_eq!(status, 200);
    assert_eq!(
        root,
        json!({
            "write": true, "zones": ["one", "slow", "tiny", "quarter"],
            "top": ["one", "slow", "quarter"],
            "blocks": [], "dashboard": "dashboard"
        })
    );
    assert_eq!(get_json(&nginx, "/readonly/").1["write"], false);

    let page = |path: &str, accept: &str| -> Response {
        send(nginx.port(), &Request::get(path).header("Accept", accept))
    };
    for response in [
        page("/ratelimit/", "text/html,application/xhtml+xml,*/*;q=0.8"),
        page("/readonly/dashboard", "*/*"),
    ] {
        assert_eq!(response.status, 200);
        assert_eq!(
            response.header("Content-Type"),
            Some("text/html; charset=utf-8")
        );
        let policy = response
            .header("Content-Security-Policy")
            .unwrap_or_default();
        assert!(policy.starts_with("default-src 'none'"), "{policy}");
        assert!(response.text().starts_with("<!doctype html>"));
    }
    // A script asking for JSON gets JSON.
    let json_root = page("/ratelimit/", "application/json");
    assert_eq!(json_root.header("Content-Type"), Some("application/json"));
}

/// Workers SIGKILLed while they record rejections (some of them inside the zone lock, the
/// master then releases it): the new workers answer, the summary still reads, and later
/// rejections are counted one for one.
#[test]
fn workers_killed_while_recording_leave_a_working_summary() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::thread;

    let nginx = common::admin::top_keys().start();
    let stop = AtomicBool::new(false);
    thread::scope(|scope| {
        for client in 0..2 {
            let (nginx, stop) = (&nginx, &stop);
            scope.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    // A killed worker drops its connections: such a request gets no answer.
                    let request = Request::get("/").header("X-Key", &format!("flood{client}"));
                    let _ = std::panic::catch_unwind(|| send(nginx.port(), &request));
                }
            });
        }
        for _ in 0..3 {
            // Rejections are flowing before each kill.
            let before = get_json(&nginx, "/ratelimit/zones/one").1["rejected"].clone();
            let flowing = || get_json(&nginx, "/ratelimit/zones/one").1["rejected"] != before;
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while !flowing() {
                assert!(std::time::Instant::now() < deadline, "no rejection counted");
                thread::yield_now();
            }
            let killed = nginx.kill_workers();
            nginx.wait_workers_replaced(&killed);
        }
        stop.store(true, Ordering::Relaxed);
    });

    let count_of = |key: &str| -> u64 {
        let (status, top) = get_json(&nginx, "/ratelimit/zones/one/top?limit=100");
        assert_eq!(status, 200, "{top}");
        top["keys"]
            .as_array()
            .unwrap()
            .iter()
            .find(|k| k["key"] == key)
            .and_then(|k| k["count"].as_u64())
            .unwrap_or(0)
    };
    // A worker killed inside the lock may have torn the summary it was writing (read safely,
    // and cleared on the next record): one rejection after the kills is the first counted.
    assert_eq!(hit(&nginx, "/", "flood0"), 429);
    let before = count_of("flood0");
    assert!(
        before > 0,
        "the summary lost a rejection recorded after the kills"
    );
    for _ in 0..3 {
        assert_eq!(hit(&nginx, "/", "flood0"), 429);
    }
    assert_eq!(count_of("flood0"), before + 3);
    // The zone lock is free: an admin write that takes it answers.
    let put = Request::new("PUT", "/ratelimit/zones/one/overrides/x").json(r#"{"rate": "1r/s"}"#);
    assert_eq!(send(nginx.port(), &put).status, 201);
}
