//! Usage figures checked like input: a response whose usage holds a figure that is not an
//! integer from 0 to 2^53 is settled as one without usage (`on_missing=` applies), counted
//! (`bad_usage`, `rate_limit_usage_bad_total`) and logged at most once a second with the
//! figure, cut; counters saturate instead of wrapping; a stream sent as `text/plain` is read
//! as the stream it is.
//!
//! The upstream is nginx itself: `/up/NAME` serves the file `html/up/NAME`, a body written
//! byte for byte by the test, proxied through the usage-based locations.

mod common;

use std::time::{Duration, Instant};

use common::{config, send, Nginx, Request};
use serde_json::Value;

/// A token bucket of 1,000 tokens per `X-Key` that refills 100 tokens a day (none comes back
/// during a test): `/keep/` reserves 100 and keeps them when the usage is missing;
/// `/first/` is the same on a zone of its own; `/weighted/` reserves 1 and weighs every token
/// 1,000 (`/weighted/` then charges up to 2^54 x 1,000 a response); `/header/` reads the usage
/// from the upstream's `X-Usage` header; `/sse/` reads a stream.
fn start() -> Nginx {
    config()
        .http(
            "rate_limit_zone $http_x_key zone=bucket:1m rate=100r/d burst=1000 \
             algorithm=token_bucket;\n\
             rate_limit_zone $http_x_key zone=first:1m rate=100r/d burst=1000 \
             algorithm=token_bucket;\n\
             rate_limit_zone $http_x_key zone=huge:1m rate=100r/d burst=1000 \
             algorithm=token_bucket;",
        )
        .locations(
            "location /up/ { default_type application/json; }
             location /up/stream { default_type text/plain; }
             location /up/header { add_header X-Usage $arg_usage; default_type application/json; }
             location /keep/ { rate_limit zone=bucket usage=openai reserve=100 on_missing=keep;
                 proxy_pass http://127.0.0.1:%%PORT%%/up/; }
             location /first/ { rate_limit zone=first usage=openai reserve=100 on_missing=keep;
                 proxy_pass http://127.0.0.1:%%PORT%%/up/; }
             location /weighted/ { rate_limit zone=huge usage=openai reserve=1
                     usage_weights=input:1000,output:1000;
                 proxy_pass http://127.0.0.1:%%PORT%%/up/; }
             location /header/ { rate_limit zone=bucket usage=$upstream_http_x_usage reserve=100
                     on_missing=keep;
                 proxy_pass http://127.0.0.1:%%PORT%%/up/; }
             location /sse/ { rate_limit zone=bucket usage=openai reserve=1;
                 proxy_pass http://127.0.0.1:%%PORT%%/up/; proxy_buffering off; }
             location /admin/ { rate_limit_admin; }
",
        )
        .start()
}

/// Chat Completions bodies whose usage holds one malformed figure (the others are valid 0s:
/// read leniently, each would be a usage of 0 tokens).
const MALFORMED: [&str; 12] = [
    "null",
    "-5",
    "1.5",
    "\"300\"",
    "18446744073709551617",
    "1e3",
    "9007199254740993",
    "true",
    "{\"n\":1}",
    "[1]",
    "-0.0",
    "\"\"",
];

fn body_with_prompt(figure: &str) -> String {
    format!(
        r#"{{"object":"chat.completion","choices":[],"usage":{{"prompt_tokens":{figure},"completion_tokens":0,"total_tokens":0}}}}"#
    )
}

fn get(nginx: &Nginx, path: &str, key: &str) -> u16 {
    send(nginx.port(), &Request::get(path).header("X-Key", key)).status
}

fn zone(nginx: &Nginx, name: &str) -> Value {
    let response = common::get(nginx.port(), &format!("/admin/zones/{name}"));
    serde_json::from_slice(&response.body).expect("zone JSON")
}

/// Waits until `name` settled `count` requests (settlements run in the log phase, just after
/// each response).
fn wait_settled(nginx: &Nginx, name: &str, count: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let zone = zone(nginx, name);
        let usage = &zone["usage"];
        let settled = usage["settled_with_usage"].as_u64().unwrap_or(0)
            + usage["settled_without_usage"].as_u64().unwrap_or(0);
        if settled >= count {
            return zone;
        }
        assert!(Instant::now() < deadline, "not settled: {zone}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn metric(nginx: &Nginx, line_start: &str) -> u64 {
    let metrics = common::get(nginx.port(), "/admin/metrics").text();
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(line_start))
        .unwrap_or_else(|| panic!("no {line_start} in:\n{metrics}"))
        .trim()
        .parse()
        .unwrap()
}

/// The issue's case: 12 responses with a malformed usage on a 1,000-token bucket with
/// `reserve=100 on_missing=keep`: each keeps its 100, so 10 pass and 2 are refused.
#[test]
fn malformed_usage_is_no_usage() {
    let nginx = start();
    for (index, figure) in MALFORMED.iter().enumerate() {
        nginx.write_file(&format!("html/up/bad{index}"), &body_with_prompt(figure));
    }
    let mut statuses = Vec::new();
    for index in 0..MALFORMED.len() {
        statuses.push(get(&nginx, &format!("/keep/bad{index}"), "k"));
        // Each settles before the next asks: the bucket is then what it holds.
        wait_settled(
            &nginx,
            "bucket",
            statuses.iter().filter(|&&s| s == 200).count() as u64,
        );
    }
    assert_eq!(
        statuses.iter().filter(|&&s| s == 200).count(),
        10,
        "{statuses:?}"
    );
    assert_eq!(&statuses[10..], [429, 429]);
    let usage = zone(&nginx, "bucket")["usage"].clone();
    assert_eq!(usage["bad_usage"], 10, "{usage}");
    assert_eq!(usage["settled_without_usage"], 10, "{usage}");
    assert_eq!(usage["settled_with_usage"], 0, "{usage}");
    assert_eq!(usage["tokens_used"], 1000, "{usage}");
    assert_eq!(
        metric(&nginx, "rate_limit_usage_bad_total{zone=\"bucket\"}"),
        10
    );
    // Logged, at most once a second (the requests took far less than 10 seconds).
    let log = nginx.error_log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("malformed usage"))
        .collect();
    assert!(!lines.is_empty() && lines.len() < 10, "{log}");
    assert!(
        lines[0].contains(
            "settled by zone \"bucket\" as no usage (on_missing=keep): a count must be an \
             integer from 0 to 9007199254740992, not null"
        ),
        "{}",
        lines[0]
    );
}

/// The figure logged is cut at 40 bytes; a valid usage next to it is counted as before.
#[test]
fn the_logged_figure_is_cut_and_valid_usage_still_counts() {
    let nginx = start();
    let long = format!("\"{}\"", "x".repeat(500));
    nginx.write_file("html/up/long", &body_with_prompt(&long));
    nginx.write_file(
        "html/up/good",
        r#"{"usage":{"prompt_tokens":100,"completion_tokens":200,"total_tokens":300,"prompt_tokens_details":{"cached_tokens":null}}}"#,
    );
    assert_eq!(get(&nginx, "/first/long", "a"), 200);
    assert_eq!(get(&nginx, "/first/good", "b"), 200);
    let usage = wait_settled(&nginx, "first", 2)["usage"].clone();
    assert_eq!(
        (
            &usage["bad_usage"],
            &usage["settled_with_usage"],
            &usage["tokens_used"]
        ),
        (&Value::from(1), &Value::from(1), &Value::from(100 + 300)),
        "{usage}"
    );
    let log = nginx.error_log();
    let line = log
        .lines()
        .find(|line| line.contains("malformed usage"))
        .unwrap_or_else(|| panic!("{log}"));
    let expected = format!("not \"{}...", "x".repeat(39));
    assert!(line.contains(&expected), "{line}");
    assert!(!line.contains(&"x".repeat(41)), "{line}");
}

/// `usage=$upstream_http_x_usage`: a value that is not a count is malformed too.
#[test]
fn a_malformed_usage_variable() {
    let nginx = start();
    nginx.write_file("html/up/header", "{}");
    for (value, bad) in [("250", 0), ("-5", 1), ("1e3", 2), ("9007199254740993", 3)] {
        assert_eq!(
            get(&nginx, &format!("/header/header?usage={value}"), "v"),
            200
        );
        let settled = if bad == 0 { 1 } else { bad + 1 };
        let usage = wait_settled(&nginx, "bucket", settled)["usage"].clone();
        assert_eq!(usage["bad_usage"], bad, "{value}: {usage}");
    }
    // 250 used, then three kept reservations of 100.
    assert_eq!(zone(&nginx, "bucket")["usage"]["tokens_used"], 550);
}

/// Responses of 2^54 x 1,000 tokens (the largest valid figures, weighed 1,000 each): the
/// zone's token counters stop at 2^64 - 1 instead of wrapping, and top keys count past 2^32.
#[test]
fn counters_saturate() {
    let nginx = start();
    let max = 1u64 << 53;
    nginx.write_file(
        "html/up/max",
        &format!(
            r#"{{"usage":{{"prompt_tokens":{max},"completion_tokens":{max},"total_tokens":{max}}}}}"#
        ),
    );
    let one = 2 * max * 1000;
    let mut used = Vec::new();
    for (n, key) in ["a", "b", "c"].iter().enumerate() {
        assert_eq!(get(&nginx, "/weighted/max", key), 200);
        let usage = wait_settled(&nginx, "huge", n as u64 + 1)["usage"].clone();
        let from_metrics = metric(
            &nginx,
            "rate_limit_usage_tokens_total{zone=\"huge\",kind=\"used\"}",
        );
        assert_eq!(usage["tokens_used"].as_u64(), Some(from_metrics));
        used.push(from_metrics);
    }
    assert_eq!(used, [one, u64::MAX, u64::MAX]);
    let overrun = zone(&nginx, "huge")["usage"]["tokens_overrun"]
        .as_u64()
        .unwrap();
    assert_eq!(overrun, u64::MAX);
    let top = common::get(nginx.port(), "/admin/zones/huge/top?by=tokens").text();
    let top: Value = serde_json::from_str(&top).unwrap();
    let counts: Vec<u64> = top["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|key| key["count"].as_u64().unwrap())
        .collect();
    assert_eq!(counts, [one, one, one], "{top}");
    assert!(one > u64::from(u32::MAX));
}

/// An event stream served as `text/plain` is read as a stream: its usage is charged.
#[test]
fn a_stream_sent_as_text_plain_is_read_as_one() {
    let nginx = start();
    nginx.write_file(
        "html/up/stream",
        "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n\
         data: {\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":200,\"total_tokens\":300}}\n\n\
         data: [DONE]\n\n",
    );
    let response = common::get(nginx.port(), "/up/stream");
    assert_eq!(response.header("Content-Type"), Some("text/plain"));
    assert_eq!(get(&nginx, "/sse/stream", "s"), 200);
    let usage = wait_settled(&nginx, "bucket", 1)["usage"].clone();
    assert_eq!(
        (&usage["settled_with_usage"], &usage["tokens_used"]),
        (&Value::from(1), &Value::from(300)),
        "{usage}"
    );
}
