//! Price tables (`rate_limit_prices`, `prices=`) against real nginx in front of the fake LLM
//! API (t/common/llm.rs), whose answers name the model the test asks for (`model=`).
//!
//! The issue's target: a $1-a-day quota (`limit=1000000 period=day`, micro-dollars) admits 4
//! of 8 requests of 1,000 prompt + 10,000 completion tokens on a $10 / $30 model ($0.31
//! each) and 65 of 80 on a $0.5 / $1.5 model ($0.0155 each). Each admitted request is
//! waited for until it is settled (the key's `used` in the admin API moved), so the next
//! one sees its cost: a request is settled in its log phase, after its response.

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::llm::FakeLlm;
use common::{check_config, config, send, Nginx, Request, Response};
use serde_json::Value;

const PRICES: &str = "rate_limit_prices models {
        big          input=10  output=30;
        small        input=0.5 output=1.5 cached=0.05;
        gpt-4o       input=2.5 output=10  cached=1.25;
        gpt-4o-mini  input=0.15 output=0.6;
    }
    rate_limit_prices fallback {
        default input=1 output=2;
    }";

fn start(llm: &FakeLlm) -> Nginx {
    let port = llm.port();
    config()
        .error_log("warn")
        .http(&format!(
            "{PRICES}
             rate_limit_zone $http_authorization zone=daily:1m algorithm=quota limit=1000000 \
                 period=day;
             rate_limit_zone $http_authorization zone=tpd:1m rate=1r/s burst=4000000 \
                 algorithm=token_bucket;"
        ))
        .locations(&format!(
            "location /v1/ {{ rate_limit zone=daily usage=openai prices=models;
                 proxy_pass http://127.0.0.1:{port}/v1/; }}
             location /stream/ {{ rate_limit zone=daily usage=openai prices=models;
                 proxy_pass http://127.0.0.1:{port}/v1/; proxy_buffering off; }}
             location /anthropic/ {{ rate_limit zone=daily usage=anthropic prices=models;
                 proxy_pass http://127.0.0.1:{port}/v1/; proxy_buffering off; }}
             location /fallback/ {{ rate_limit zone=daily usage=openai prices=fallback;
                 proxy_pass http://127.0.0.1:{port}/v1/; }}
             location /bucket/ {{ rate_limit zone=tpd usage=openai reserve=1000 prices=models;
                 proxy_pass http://127.0.0.1:{port}/v1/; }}
             location /ratelimit/ {{ rate_limit_admin; }}"
        ))
        .start()
}

fn post(nginx: &Nginx, path: &str, key: &str) -> Response {
    let request = Request::new("POST", path)
        .header("Authorization", key)
        .json(r#"{"model":"ignored","messages":[{"role":"user","content":"hi"}]}"#);
    send(nginx.port(), &request)
}

fn admin(nginx: &Nginx, path: &str) -> Value {
    let response = send(nginx.port(), &Request::get(&format!("/ratelimit/{path}")));
    assert_eq!(response.status, 200, "{path}: {response:?}");
    serde_json::from_slice(&response.body).unwrap()
}

/// The key's micro-dollars spent this period in quota zone `daily` (0 for a key not seen).
fn used(nginx: &Nginx, key: &str) -> u64 {
    let response = send(
        nginx.port(),
        &Request::get(&format!("/ratelimit/zones/daily/keys/{key}")),
    );
    if response.status == 404 {
        return 0;
    }
    let value: Value = serde_json::from_slice(&response.body).unwrap();
    value["used"].as_u64().unwrap_or_else(|| panic!("{value}"))
}

/// Wait until `key`'s `used` is `expected` (its requests settled); panics after 10 s.
fn wait_used(nginx: &Nginx, key: &str, expected: u64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let seen = used(nginx, key);
        if seen == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: used {seen}, expected {expected}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// Send `count` requests of 1,000 prompt + 10,000 completion tokens on `model` as `key`,
/// each admitted one settled before the next; how many were admitted.
fn admitted(nginx: &Nginx, key: &str, model: &str, count: usize, cost: u64) -> usize {
    let path = format!("/v1/chat/completions?prompt=1000&completion=10000&model={model}");
    let mut passed = 0;
    for request in 0..count {
        let response = post(nginx, &path, key);
        match response.status {
            200 => {
                passed += 1;
                wait_used(
                    nginx,
                    key,
                    cost * passed as u64,
                    &format!("request {request}"),
                );
            }
            429 => {}
            other => panic!("request {request}: status {other}: {response:?}"),
        }
    }
    passed
}

#[test]
fn a_dollar_a_day_admits_4_of_8_big_and_65_of_80_small() {
    let llm = FakeLlm::start();
    let nginx = start(&llm);
    // $10/M × 1,000 + $30/M × 10,000 = $0.31; $0.5/M × 1,000 + $1.5/M × 10,000 = $0.0155.
    let big = admitted(&nginx, "team-big", "big", 8, 310_000);
    let small = admitted(&nginx, "team-small", "small", 80, 15_500);
    eprintln!("admitted: {big} of 8 on big, {small} of 80 on small");
    assert_eq!(big, 4);
    assert!((64..=66).contains(&small), "small admitted {small} of 80");
    assert_eq!(used(&nginx, "team-big"), 4 * 310_000);
    // The refused requests never reached the upstream.
    assert_eq!(llm.requests(), big + small);
    // The zone's spend: what every priced line was charged.
    let zone = admin(&nginx, "zones/daily");
    let spent = 4 * 310_000 + small as u64 * 15_500;
    assert_eq!(
        zone["usage"]["spent_micro_usd"].as_u64(),
        Some(spent),
        "{zone}"
    );
    let metrics = send(nginx.port(), &Request::get("/ratelimit/metrics")).text();
    let line = format!(
        "rate_limit_spent_usd_total{{zone=\"daily\"}} {}",
        spent as f64 / 1e6
    );
    assert!(
        metrics.lines().any(|l| l == line),
        "no {line:?} in:\n{metrics}"
    );
}

#[test]
fn models_match_exactly_then_by_prefix_then_default_streamed_too() {
    let llm = FakeLlm::start();
    let nginx = start(&llm);
    let cases = [
        // (location, key, model, tokens in the query, micro-dollars)
        (
            "/v1/chat/completions",
            "exact",
            "gpt-4o-mini",
            "prompt=1000&completion=1000",
            750,
        ),
        // The longest prefix: gpt-4o-mini, not gpt-4o.
        (
            "/v1/chat/completions",
            "prefix",
            "gpt-4o-mini-2024-07-18",
            "prompt=1000&completion=1000",
            750,
        ),
        (
            "/v1/chat/completions",
            "prefix2",
            "gpt-4o-2024-08-06",
            "prompt=1000&completion=1000",
            12_500,
        ),
        // Cached prompt tokens at their own price: 200 × 2.5 + 800 × 1.25 + 100 × 10.
        (
            "/v1/chat/completions",
            "cached",
            "gpt-4o",
            "prompt=1000&cached=800&completion=100",
            2_500,
        ),
        (
            "/stream/chat/completions",
            "streamed",
            "small",
            "stream=1&prompt=1000&completion=10000",
            15_500,
        ),
        (
            "/stream/responses",
            "responses",
            "big",
            "stream=1&prompt=100&completion=100",
            4_000,
        ),
        (
            "/anthropic/messages",
            "anthropic",
            "gpt-4o",
            "stream=1&prompt=1000&completion=1000",
            12_500,
        ),
        (
            "/fallback/chat/completions",
            "default",
            "anything",
            "prompt=1000&completion=1000",
            3_000,
        ),
    ];
    for (location, key, model, tokens, cost) in cases {
        let response = post(&nginx, &format!("{location}?{tokens}&model={model}"), key);
        assert_eq!(response.status, 200, "{key}: {response:?}");
        wait_used(&nginx, key, cost, key);
    }
    assert!(!nginx.error_log().contains("no price for model"));
}

/// A model the table does not price (and no `default`) is charged at the table's highest
/// prices ($10 input, $30 output: 1,000 + 1,000 tokens cost 40,000 micro-dollars), never its
/// reservation of 1 micro-dollar; a response that names an unpriced model is priced for the
/// request's model when the table prices that one.
#[test]
fn an_unknown_model_is_charged_the_highest_prices_and_is_logged() {
    let llm = FakeLlm::start();
    let nginx = start(&llm);
    let highest = 1_000 * 10 + 1_000 * 30;
    // The response names a model no line prices; the request's ("ignored") neither.
    let response = post(
        &nginx,
        "/v1/chat/completions?prompt=1000&completion=1000&model=claude-opus-4",
        "unknown",
    );
    assert_eq!(response.status, 200);
    wait_used(&nginx, "unknown", highest, "an unknown model");
    // A response that names no model (the Responses API without model=), and a request
    // whose model no line prices either.
    let response = post(
        &nginx,
        "/v1/responses?prompt=1000&completion=1000",
        "nameless",
    );
    assert_eq!(response.status, 200);
    wait_used(&nginx, "nameless", highest, "no model priced");
    // The response's model is unknown, the request's is "small": $0.5 / $1.5.
    let request = Request::new(
        "POST",
        "/v1/chat/completions?prompt=1000&completion=1000&model=mystery-1",
    )
    .header("Authorization", "by-request")
    .json(r#"{"model":"small","messages":[{"role":"user","content":"hi"}]}"#);
    assert_eq!(send(nginx.port(), &request).status, 200);
    wait_used(&nginx, "by-request", 500 + 1_500, "the request's model");
    let zone = admin(&nginx, "zones/daily");
    assert_eq!(zone["usage"]["unpriced"].as_u64(), Some(2), "{zone}");
    assert_eq!(
        zone["usage"]["spent_micro_usd"].as_u64(),
        Some(2 * highest + 2_000),
        "{zone}"
    );
    // Logged once a second at most: the first of them.
    let log = nginx.error_log();
    assert!(
        log.contains(&format!(
            "rate_limit: no price for model \"claude-opus-4\" in rate_limit_prices \"models\": \
             charged {highest} at the table's highest prices; add the model or a \"default\" \
             line"
        )),
        "{log}"
    );
}

#[test]
fn a_token_bucket_is_charged_in_micro_dollars() {
    let llm = FakeLlm::start();
    let nginx = start(&llm);
    let path = "/bucket/chat/completions?prompt=1000&completion=10000&model=big";
    assert_eq!(post(&nginx, path, "bucket").status, 200);
    // Settled: 310,000 charged (a reservation of 1,000 and 309,000 more).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let zone = admin(&nginx, "zones/tpd");
        if zone["usage"]["spent_micro_usd"].as_u64() == Some(310_000) {
            assert_eq!(
                zone["usage"]["tokens_overrun"].as_u64(),
                Some(309_000),
                "{zone}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "{zone}");
        thread::sleep(Duration::from_millis(20));
    }
    let key = admin(&nginx, "zones/tpd/keys/bucket");
    let remaining = key["remaining"].as_u64().unwrap_or_else(|| panic!("{key}"));
    // 4,000,000 less 310,000, and the few refilled since (one a second).
    assert!(
        (3_690_000..3_690_100).contains(&remaining),
        "remaining {remaining}: {key}"
    );
}

#[test]
fn nginx_t_names_the_bad_price() {
    let zone = "rate_limit_zone $http_authorization zone=daily:1m algorithm=quota \
                limit=1000000 period=day;";
    let with = |prices: &str, line: &str| {
        format!(
            "{zone}\n{prices}\nserver {{ listen 127.0.0.1:%%PORT%%; location / {{ {line} \
             proxy_pass http://127.0.0.1:9; }} }}"
        )
    };
    let used = "rate_limit zone=daily usage=openai prices=models;";
    let cases = [
        (
            with(
                "rate_limit_prices models { big input=ten output=30; }",
                used,
            ),
            "invalid price \"input=ten\": give dollars per million tokens, a number from 0 to \
             1000 with up to 6 decimals, as in input=2.5",
        ),
        (
            with(
                "rate_limit_prices models { big input=1 output=2; big input=3 output=4; }",
                used,
            ),
            "duplicate model \"big\" in rate_limit_prices",
        ),
        (
            with("rate_limit_prices models { big input=1; }", used),
            "model \"big\" in rate_limit_prices must have \"output=\"",
        ),
        (
            with("rate_limit_prices models { big input=1 outptu=2; }", used),
            "did you mean \"output=\"?",
        ),
        (
            with("rate_limit_prices models { }", used),
            "rate_limit_prices \"models\" has no price",
        ),
        (
            with(
                "rate_limit_prices models { a input=1 output=1; }\n\
                 rate_limit_prices models { b input=1 output=1; }",
                used,
            ),
            "duplicate rate_limit_prices \"models\"",
        ),
        (
            with("rate_limit_prices modles { a input=1 output=1; }", used),
            "unknown price table \"models\", did you mean \"modles\"? in ",
        ),
        (
            with("rate_limit_prices other { a input=1 output=1; }", used),
            "unknown price table \"models\": the only rate_limit_prices table is \"other\" in ",
        ),
        (
            with("", used),
            "unknown price table \"models\": no rate_limit_prices block is declared in ",
        ),
        (
            with(
                "rate_limit_prices models { a input=1 output=1; }",
                "rate_limit zone=daily prices=models;",
            ),
            "\"prices\" needs \"usage\"",
        ),
        (
            with(
                "rate_limit_prices models { a input=1 output=1; }",
                "rate_limit zone=daily usage=$upstream_http_x_cost prices=models;",
            ),
            "\"prices\" apply to a built-in reader",
        ),
        (
            with("rate_limit_prices models { a input=1 output=1 { } }", used),
            "unexpected \"{\"",
        ),
    ];
    let mut failures = Vec::new();
    for (http, expected) in &cases {
        let text = config().no_server().http(http).build();
        let (ok, output) = check_config(&text);
        if ok || !output.contains(expected) {
            failures.push(format!("expected {expected:?}, got (ok={ok}):\n{output}"));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
    // A table may come after the lines that name it; `rate_limit_prices` is http-level only.
    let later = format!(
        "{zone}\nserver {{ listen 127.0.0.1:%%PORT%%; location / {{ {used} \
         proxy_pass http://127.0.0.1:9; }} }}\n\
         rate_limit_prices models {{ default input=1 output=2; }}"
    );
    let (ok, output) = check_config(&config().no_server().http(&later).build());
    assert!(ok, "{output}");
    let in_server = format!(
        "{zone}\nserver {{ listen 127.0.0.1:%%PORT%%; \
         rate_limit_prices models {{ default input=1 output=2; }} }}"
    );
    let (ok, output) = check_config(&config().no_server().http(&in_server).build());
    assert!(
        !ok && output.contains("\"rate_limit_prices\" directive is not allowed here"),
        "{output}"
    );
}

/// A money budget replayed on a log recorded without it: nginx counts tokens only (no
/// `prices=`) and logs `$rate_limit_usage_model` and the tokens; `ratelimit-replay --prices`
/// prices that log with the same table and a $1-a-day quota, and admits 4 of 8 requests on
/// the $10 / $30 model and 65 of 80 on the $0.5 / $1.5 one, as nginx did above.
#[test]
fn a_priced_quota_replays_on_a_log_of_tokens() {
    let llm = FakeLlm::start();
    let port = llm.port();
    let nginx = config()
        .http(&format!(
            "{PRICES}
             rate_limit_zone $http_authorization zone=tokens:1m rate=1r/s burst=4000000 \
                 algorithm=token_bucket;"
        ))
        .access_log(
            "log_format priced '$msec $http_authorization $rate_limit_usage_model \
             $rate_limit_usage_prompt_tokens $rate_limit_usage_completion_tokens \
             $rate_limit_usage_cached_tokens';
             access_log logs/priced.log priced;",
        )
        .locations(&format!(
            "location /v1/ {{ rate_limit zone=tokens usage=openai;
                 proxy_pass http://127.0.0.1:{port}/v1/; }}"
        ))
        .start();
    for (model, count) in [("big", 8), ("small", 80)] {
        let path = format!("/v1/chat/completions?prompt=1000&completion=10000&model={model}");
        for _ in 0..count {
            assert_eq!(post(&nginx, &path, &format!("team-{model}")).status, 200);
        }
    }
    let log_path = nginx.prefix().join("logs/priced.log");
    let deadline = Instant::now() + Duration::from_secs(10);
    let log = loop {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        if log.lines().count() == 88 {
            break log;
        }
        assert!(Instant::now() < deadline, "{log}");
        thread::sleep(Duration::from_millis(20));
    };
    assert!(
        log.lines()
            .next()
            .is_some_and(|line| line.ends_with(" team-big big 1000 10000 0")),
        "{log}"
    );
    let conf = nginx.prefix().join("nginx.conf");
    let output = std::process::Command::new(common::nginx::replay_binary())
        .args([
            "--zone",
            "algorithm=quota limit=1000000 period=day",
            "--limit",
            "usage=openai prices=models",
            "--prices",
            conf.to_str().unwrap(),
            "--log-format",
            "$msec $http_authorization $rate_limit_usage_model $rate_limit_usage_prompt_tokens \
             $rate_limit_usage_completion_tokens $rate_limit_usage_cached_tokens",
            "--key",
            "$http_authorization",
            "--json",
            log_path.to_str().unwrap(),
        ])
        .output()
        .expect("ratelimit-replay runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let admitted = |key: &str| {
        stdout
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|line| line["key"] == key && line["decision"] == "ADMITTED")
            .count()
    };
    // Requests of one key a few ms apart: each is settled before the next (no
    // $request_time: a request ends as it starts).
    assert_eq!(admitted("team-big"), 4, "{stdout}");
    assert_eq!(admitted("team-small"), 65, "{stdout}");
}

#[test]
fn a_response_that_names_no_model_is_priced_as_the_request_names_it() {
    let llm = FakeLlm::start();
    let nginx = start(&llm);
    // The Responses API's stand-in names no model without model=; the request's body says
    // "small": 1,000 × $0.5 + 10,000 × $1.5 per million tokens = 15,500 micro-dollars.
    let request = Request::new("POST", "/v1/responses?prompt=1000&completion=10000")
        .header("Authorization", "by-request")
        .json(r#"{"model":"small","input":"hi"}"#);
    assert_eq!(send(nginx.port(), &request).status, 200);
    wait_used(
        &nginx,
        "by-request",
        15_500,
        "priced by the request's model",
    );
    let zone = admin(&nginx, "zones/daily");
    assert_eq!(zone["usage"]["unpriced"].as_u64(), Some(0), "{zone}");
}
