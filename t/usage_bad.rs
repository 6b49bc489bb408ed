//! Usage figures checked like input: a response whose usage holds a figure that is not an
//! integer from 0 to 2^53, or whose JSON cannot be read one way only (a key twice, `1e400`),
//! is malformed: charged what the request could use at most (at least its reservation),
//! whatever `on_missing=` says, never 0; counted (`bad_usage`, `rate_limit_usage_bad_total`)
//! and logged at most once a second with the figure, cut. docs/usage.md's table of what each
//! end of a request is charged is served row by row. Counters saturate instead of wrapping;
//! a stream sent as `text/plain` is read as the stream it is.
//!
//! The upstream is nginx itself: `/up/NAME` serves the file `html/up/NAME`, a body written
//! byte for byte by the test, proxied through the usage-based locations; the table's test
//! has an upstream of its own that can cut a stream.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use common::{config, send, Nginx, Request};
use serde_json::Value;

/// A token bucket of 1,000 tokens per `X-Key` that refills 100 tokens a day (none comes back
/// during a test): `/refund/` reserves 100 with the default `on_missing=refund`, `/keep/`
/// keeps them when the usage is missing; `/first/` is the same on a zone of its own; `/weighted/` reserves 1 and weighs every token
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
             location /refund/ { rate_limit zone=bucket usage=openai reserve=100;
                 proxy_pass http://127.0.0.1:%%PORT%%/up/; }
             location /header-refund/ { rate_limit zone=bucket usage=$upstream_http_x_usage
                     reserve=100;
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

/// Whole bodies whose usage is malformed as a document: not an object, no count, a key twice
/// (a JSON reader that keeps the last key would read another usage), numbers no JSON reader
/// holds, `NaN`, numbers JSON does not allow.
const HOSTILE: [&str; 12] = [
    r#"{"usage":7}"#,
    r#"{"usage":"1000"}"#,
    r#"{"usage":[1000]}"#,
    r#"{"usage":{}}"#,
    r#"{"usage":{"prompt_tokens":5,"completion_tokens":0,"completion_tokens":900,"total_tokens":5}}"#,
    r#"{"usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0},"usage":{"prompt_tokens":900,"completion_tokens":0,"total_tokens":900}}"#,
    r#"{"usage":{"prompt_tokens":1,"prompt_tokens":1,"completion_tokens":0,"total_tokens":1}}"#,
    r#"{"usage":{"prompt_tokens":1e400,"completion_tokens":0,"total_tokens":0}}"#,
    r#"{"usage":{"prompt_tokens":NaN,"completion_tokens":0,"total_tokens":0}}"#,
    r#"{"usage":{"prompt_tokens":-9223372036854775809,"completion_tokens":0,"total_tokens":0}}"#,
    r#"{"usage":{"prompt_tokens":00,"completion_tokens":0,"total_tokens":0}}"#,
    r#"{"usage":{"prompt_tokens":0x10,"completion_tokens":0,"total_tokens":0}}"#,
];

/// A request of `max_tokens` 300 in 44 bytes: what it could use at most is 300 + 11.
const REQUEST: &str = r#"{"model":"m","max_tokens":300,"messages":[]}"#;
const REQUEST_BOUND: u64 = 300 + 11;

fn post(nginx: &Nginx, path: &str, key: &str) -> u16 {
    // GET: the upstream is nginx's static module, which takes no POST; the body is read.
    let request = Request::new("GET", path).header("X-Key", key).json(REQUEST);
    send(nginx.port(), &request).status
}

/// The issue's case: 24 responses with a malformed usage, each to a key of its own, on a line
/// with `reserve=100` and the default `on_missing=refund`: each is charged what the request
/// could use at most (311), never 0 nor its reservation only; a valid usage is charged as
/// reported.
#[test]
fn malformed_usage_is_charged_the_requests_bound_by_default() {
    let nginx = start();
    let bodies: Vec<String> = MALFORMED
        .iter()
        .map(|figure| body_with_prompt(figure))
        .chain(HOSTILE.iter().map(|body| body.to_string()))
        .collect();
    assert_eq!(bodies.len(), 24);
    for (index, body) in bodies.iter().enumerate() {
        nginx.write_file(&format!("html/up/bad{index}"), body);
    }
    let mut used = 0;
    for (index, body) in bodies.iter().enumerate() {
        assert_eq!(
            post(&nginx, &format!("/refund/bad{index}"), &format!("k{index}")),
            200
        );
        let usage = wait_settled(&nginx, "bucket", index as u64 + 1)["usage"].clone();
        let charged = usage["tokens_used"].as_u64().unwrap() - used;
        used += charged;
        assert_eq!(charged, REQUEST_BOUND, "{body}: {usage}");
    }
    let usage = zone(&nginx, "bucket")["usage"].clone();
    assert_eq!(usage["bad_usage"], 24, "{usage}");
    assert_eq!(usage["settled_without_usage"], 24, "{usage}");
    assert_eq!(usage["settled_with_usage"], 0, "{usage}");
    assert_eq!(
        metric(&nginx, "rate_limit_usage_bad_total{zone=\"bucket\"}"),
        24
    );
    // A valid usage of the same shape is charged what it reports.
    nginx.write_file("html/up/good", &body_with_prompt("7"));
    assert_eq!(post(&nginx, "/refund/good", "good"), 200);
    let usage = wait_settled(&nginx, "bucket", 25)["usage"].clone();
    assert_eq!(usage["tokens_used"].as_u64(), Some(used + 7), "{usage}");
    // Logged, at most once a second (the requests took far less than 24 seconds).
    let log = nginx.error_log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("malformed usage"))
        .collect();
    assert!(!lines.is_empty() && lines.len() < 24, "{log}");
    assert!(
        lines[0].contains(
            "rate_limit: malformed usage in the response, zone \"bucket\" charged 311 (the \
             most the request may use, at least its reservation of 100): a count must be an \
             integer from 0 to 9007199254740992, not null"
        ),
        "{}",
        lines[0]
    );
}

/// A JSON error is logged with what the parser said, and `on_missing=keep` changes nothing for
/// a malformed usage: a request without a body (no ceiling: 4,096) is charged 4,096.
#[test]
fn an_unreadable_usage_is_logged_and_a_request_without_a_body_is_charged_4096() {
    let nginx = start();
    nginx.write_file("html/up/twice", HOSTILE[5]);
    assert_eq!(get(&nginx, "/keep/twice", "a"), 200);
    let usage = wait_settled(&nginx, "bucket", 1)["usage"].clone();
    assert_eq!(usage["tokens_used"], 4096, "{usage}");
    let log = nginx.error_log();
    assert!(
        log.contains(
            "zone \"bucket\" charged 4096 (the most the request may use, at least its \
             reservation of 100): the JSON that names it cannot be read (duplicate field \
             `usage`): each key once, numbers that fit"
        ),
        "{log}"
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
    // The malformed one without a body: 4,096, what a request that sets no ceiling may use.
    assert_eq!(
        (
            &usage["bad_usage"],
            &usage["settled_with_usage"],
            &usage["tokens_used"]
        ),
        (&Value::from(1), &Value::from(1), &Value::from(4096 + 300)),
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
    // With the default on_missing=refund, a malformed value keeps its reservation too (the
    // value is in the operator's unit: the request's body says nothing of it); an empty one
    // is a usage missing, refunded.
    for (n, (value, used)) in [("-5", 650), ("abc", 750), ("", 750)]
        .into_iter()
        .enumerate()
    {
        assert_eq!(
            get(&nginx, &format!("/header-refund/header?usage={value}"), "w"),
            200
        );
        let usage = wait_settled(&nginx, "bucket", 5 + n as u64)["usage"].clone();
        assert_eq!(usage["tokens_used"], used, "{value:?}: {usage}");
    }
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

/// The events a table row's upstream streams: 400 characters of text, then the usage (valid,
/// none, or malformed), then `[DONE]` and the stream's end, or (cut) the connection closed
/// after the usage, without either.
fn stream_of(usage: &str, complete: bool) -> (Vec<u8>, bool) {
    let text = "x".repeat(400);
    let mut events = format!(
        "data: {{\"choices\":[{{\"delta\":{{\"content\":\"{text}\"}}}}],\"usage\":null}}\n\n"
    );
    match usage {
        "U" => events.push_str(
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":30,\
             \"total_tokens\":40}}\n\n",
        ),
        "malformed" => events.push_str(
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":-5,\"completion_tokens\":30,\
             \"total_tokens\":25}}\n\n",
        ),
        "none" => {}
        other => panic!("docs/usage.md's table has a row for {other:?}: no such usage"),
    }
    if complete {
        events.push_str("data: [DONE]\n\n");
    }
    (events.into_bytes(), complete)
}

/// An upstream that answers `/USAGE/END` (`U|none|malformed`, `complete|cut`) with
/// [`stream_of`], chunked, and for a cut stream closes the connection before its last chunk.
fn start_cutting_upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the upstream");
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            std::thread::spawn(move || serve_stream(stream));
        }
    });
    port
}

fn serve_stream(mut stream: TcpStream) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
    let mut length = 0;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).unwrap_or(0) == 0 || header.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0; length];
    let _ = reader.read_exact(&mut body);
    let mut parts = path.trim_start_matches('/').split('/').skip(1);
    let (usage, end) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (events, complete) = stream_of(usage, end == "complete");
    let mut answer = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\
         Connection: close\r\n\r\n{:x}\r\n",
        events.len()
    )
    .into_bytes();
    answer.extend_from_slice(&events);
    answer.extend_from_slice(b"\r\n");
    if complete {
        answer.extend_from_slice(b"0\r\n\r\n");
    }
    let _ = stream.write_all(&answer);
    let _ = stream.flush();
    // Read what nginx still sends (nothing) so that the close is seen after the answer.
    std::thread::sleep(Duration::from_millis(50));
}

/// A request of [`REQUEST`] through nginx, read to its end or to the connection's close (a cut
/// stream is cut for the client too).
fn post_raw(port: u16, path: &str, key: &str) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nX-Key: {key}\r\nContent-Type: \
         application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{REQUEST}",
        REQUEST.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{path}: {}",
        String::from_utf8_lossy(&answer)
    );
}

/// docs/usage.md's table of what each end of a request is charged, served row by row: for each
/// of its rows (the usage the response reported, how it ended) and each `on_missing=`, a
/// request through nginx is charged what the cell says, with `R` = 100 (`reserve=100`), `U` =
/// 40 (reported), `B` = 311 (`max_tokens` 300, a 44-byte body), `E` = 111 (400 characters
/// streamed / 4, plus 11 for the body). A row or a cell the test does not know fails it.
#[test]
fn the_charge_table_of_usage_md() {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/usage.md"))
        .expect("docs/usage.md");
    let header = "| usage in the response | how it ended | `on_missing=refund` (the default) | \
                  `on_missing=keep` | `on_missing=estimate` |";
    let start = page
        .lines()
        .position(|line| line == header)
        .unwrap_or_else(|| panic!("docs/usage.md has no table whose header is {header}"));
    let rows: Vec<Vec<String>> = page
        .lines()
        .skip(start + 2)
        .take_while(|line| line.starts_with('|'))
        .map(|line| {
            line.trim_matches('|')
                .split('|')
                .map(|cell| cell.trim().trim_matches('`').to_string())
                .collect()
        })
        .collect();
    let mut covered: Vec<(String, String)> = rows
        .iter()
        .map(|row| (row[0].clone(), row[1].clone()))
        .collect();
    covered.sort();
    let mut every: Vec<(String, String)> = ["U", "malformed", "none"]
        .iter()
        .flat_map(|usage| ["complete", "cut"].map(|end| (usage.to_string(), end.to_string())))
        .collect();
    every.sort();
    assert_eq!(covered, every, "the table's rows");

    let upstream = start_cutting_upstream();
    let zones = "rate_limit_zone $http_x_key zone=refund:1m rate=1r/h burst=100000 \
                 algorithm=token_bucket;\n\
                 rate_limit_zone $http_x_key zone=keep:1m rate=1r/h burst=100000 \
                 algorithm=token_bucket;\n\
                 rate_limit_zone $http_x_key zone=estimate:1m rate=1r/h burst=100000 \
                 algorithm=token_bucket;";
    let mut locations = String::from("location /admin/ { rate_limit_admin; }\n");
    for on_missing in ["refund", "keep", "estimate"] {
        locations.push_str(&format!(
            "location /{on_missing}/ {{ rate_limit zone={on_missing} usage=openai reserve=100 \
                 on_missing={on_missing};
                 proxy_pass http://127.0.0.1:{upstream}; proxy_buffering off; }}\n"
        ));
    }
    let nginx = config().http(zones).locations(&locations).start();
    let value = |cell: &str| -> u64 {
        match cell {
            "U" => 40,
            "max(U, R)" | "R" => 100,
            "0" => 0,
            "E" | "max(E, R)" => 111,
            "max(B, R)" => REQUEST_BOUND,
            other => panic!("docs/usage.md's table says {other:?}: the test knows no such charge"),
        }
    };
    let mut requests = 0;
    for row in &rows {
        let (usage, end) = (&row[0], &row[1]);
        for (column, on_missing) in ["refund", "keep", "estimate"].iter().enumerate() {
            let expected = value(&row[2 + column]);
            let before = zone(&nginx, on_missing)["usage"]["tokens_used"]
                .as_u64()
                .unwrap_or(0);
            requests += 1;
            post_raw(
                nginx.port(),
                &format!("/{on_missing}/{usage}/{end}"),
                &format!("k{requests}"),
            );
            let settled = rows.iter().position(|r| r == row).unwrap() as u64 + 1;
            let after = wait_settled(&nginx, on_missing, settled)["usage"]["tokens_used"]
                .as_u64()
                .unwrap();
            assert_eq!(
                after - before,
                expected,
                "usage {usage}, {end}, on_missing={on_missing}: the table says {}",
                row[2 + column]
            );
        }
    }
}
