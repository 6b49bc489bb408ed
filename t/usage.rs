//! Usage-based limits (`usage=`, `reserve=`, `debt=`, `on_missing=`, `usage_weights=`,
//! `cost=$var`) against real nginx in front of a fake LLM API (t/common/llm.rs) that answers
//! in each provider's JSON and SSE shapes.
//!
//! What a request was charged is read from the bucket itself: a probe request of cost 1 on
//! the same key answers `RateLimit: "tpm";r=REMAINING`. The zones refill so slowly (100
//! tokens a day: one every 864 s) that no test lasts long enough to see a token come back.

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::llm::FakeLlm;
use common::{check_config, config, start_request, Nginx, Request, Response};

const CAPACITY: u64 = 100_000;

/// nginx with a token bucket of [`CAPACITY`] tokens per key (`Authorization`), usage-based
/// locations for each provider in front of `llm`, and `/probe` (cost 1) on the same zone.
fn start(llm: &FakeLlm, extra_locations: &str) -> Nginx {
    let port = llm.port();
    nginx_with(
        &format!(
            "rate_limit_zone $http_authorization zone=tpm:1m rate=100r/d burst={CAPACITY} \
             algorithm=token_bucket;"
        ),
        &format!(
            "location /openai/ {{ rate_limit zone=tpm usage=openai reserve=100;
                 proxy_pass http://127.0.0.1:{port}/; proxy_buffering off; }}
             location /weighted/ {{ rate_limit zone=tpm usage=openai reserve=100
                     usage_weights=input:1,output:4,cached:0;
                 proxy_pass http://127.0.0.1:{port}/; }}
             location /anthropic/ {{ rate_limit zone=tpm usage=anthropic reserve=100;
                 proxy_pass http://127.0.0.1:{port}/; proxy_buffering off; }}
             location /gemini/ {{ rate_limit zone=tpm usage=gemini reserve=100;
                 proxy_pass http://127.0.0.1:{port}/; }}
             location /keep/ {{ rate_limit zone=tpm usage=openai reserve=100 on_missing=keep;
                 proxy_pass http://127.0.0.1:{port}/; }}
             location /header/ {{
                 rate_limit zone=tpm usage=$upstream_http_x_usage_tokens reserve=100;
                 proxy_pass http://127.0.0.1:{port}/; }}
             location /probe {{ rate_limit zone=tpm; try_files /index.html =404; }}
             {extra_locations}"
        ),
    )
}

fn nginx_with(http: &str, locations: &str) -> Nginx {
    config()
        .http(http)
        .access_log(
            "log_format usage '$http_authorization $uri $status $rate_limit_usage_prompt_tokens \
             $rate_limit_usage_completion_tokens $rate_limit_usage_cached_tokens \
             $rate_limit_usage_total_tokens $rate_limit_usage_cost';
             access_log logs/access.log usage;",
        )
        .locations(locations)
        .start()
}

fn post(path: &str, key: &str) -> Request {
    Request::new("POST", path)
        .header("Authorization", key)
        .json(r#"{"model":"fake","messages":[{"role":"user","content":"hi"}]}"#)
}

fn send(nginx: &Nginx, path: &str, key: &str) -> Response {
    common::send(nginx.port(), &post(path, key))
}

/// `r=` of the zone's `RateLimit` field after a probe of cost 1: the key's tokens left.
fn remaining(nginx: &Nginx, key: &str) -> u64 {
    let response = common::send(
        nginx.port(),
        &Request::get("/probe").header("Authorization", key),
    );
    remaining_of(&response)
}

fn remaining_of(response: &Response) -> u64 {
    let field = response.header("RateLimit").unwrap_or_default().to_string();
    field
        .split(';')
        .find_map(|part| part.strip_prefix("r="))
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("no r= in RateLimit {field:?}: {response:?}"))
}

/// What the key's requests so far were charged, as a probe sees it (the probe's own 1 and
/// the probes before it are not counted).
fn used(nginx: &Nginx, key: &str, probes_before: u64) -> u64 {
    CAPACITY - remaining(nginx, key) - 1 - probes_before
}

/// Wait until what `key`'s requests were charged, as probes see it, is `expected`: a request
/// is settled in its log phase, after its response (and after its access log line), so the
/// first probe may still see the reservation. Panics with the last figure after 10 s.
fn wait_used(nginx: &Nginx, key: &str, expected: u64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut probes = 0;
    loop {
        let seen = used(nginx, key, probes);
        probes += 1;
        if seen == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: charged {seen}, expected {expected}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// The access log's line for `key`'s request (not a probe), once it is written: the request
/// has reached its log phase, where it is settled.
fn logged(nginx: &Nginx, key: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log =
            std::fs::read_to_string(nginx.prefix().join("logs/access.log")).unwrap_or_default();
        let found = log
            .lines()
            .find(|line| line.starts_with(&format!("{key} ")) && !line.contains("/probe"));
        if let Some(line) = found {
            return line.to_string();
        }
        assert!(Instant::now() < deadline, "no log line for {key}:\n{log}");
        thread::sleep(Duration::from_millis(50));
    }
}

/// The last field of a log line: `$rate_limit_usage_cost`.
fn logged_cost(line: &str) -> String {
    line.rsplit(' ').next().unwrap_or_default().to_string()
}

#[test]
fn every_provider_settles_plain_and_streamed() {
    let llm = FakeLlm::start();
    let nginx = start(&llm, "");
    // (path, tokens charged): prompt + completion, below and above the reservation of 100.
    let cases = [
        ("/openai/v1/chat/completions?prompt=30&completion=12", 42),
        (
            "/openai/v1/chat/completions?stream=1&prompt=300&completion=45",
            345,
        ),
        ("/openai/v1/responses?prompt=20&completion=5", 25),
        (
            "/openai/v1/responses?stream=1&prompt=250&completion=70&chunks=8",
            320,
        ),
        (
            "/anthropic/v1/messages?prompt=61&completion=7&cached=20",
            68,
        ),
        (
            "/anthropic/v1/messages?stream=1&prompt=400&completion=133&cached=100",
            533,
        ),
        (
            "/gemini/v1beta/models/m:generateContent?prompt=9&completion=3",
            12,
        ),
        (
            "/gemini/v1beta/models/m:streamGenerateContent?alt=sse&prompt=500&completion=250",
            750,
        ),
        // Weighted: input 1, output 4, cached 0.
        (
            "/weighted/v1/chat/completions?prompt=100&completion=10&cached=60",
            40 + 40,
        ),
        (
            "/header/v1/chat/completions?prompt=700&completion=7&usage_header=1",
            707,
        ),
    ];
    for (index, (path, tokens)) in cases.iter().enumerate() {
        let key = format!("Bearer case-{index}");
        let response = send(&nginx, path, &key);
        assert_eq!(response.status, 200, "{path}: {response:?}");
        wait_used(&nginx, &key, *tokens, path);
    }
    let log = std::fs::read_to_string(nginx.prefix().join("logs/access.log")).unwrap();
    let line = |key: &str| {
        log.lines()
            .find(|line| line.starts_with(key) && !line.contains("/probe"))
            .unwrap_or_else(|| panic!("no {key} in {log}"))
            .to_string()
    };
    // prompt, completion, cached, total, cost.
    assert!(
        line("Bearer case-1 ").ends_with(" 200 300 45 0 345 345"),
        "{}",
        line("Bearer case-1 ")
    );
    assert!(
        line("Bearer case-5 ").ends_with(" 200 400 133 100 533 533"),
        "{}",
        line("Bearer case-5 ")
    );
    assert!(
        line("Bearer case-8 ").ends_with(" 200 100 10 60 110 80"),
        "{}",
        line("Bearer case-8 ")
    );
    // usage=$variable: no tokens read from the body, the variable's value is the cost.
    assert!(
        line("Bearer case-9 ").ends_with(" 200 - - - - 707"),
        "{}",
        line("Bearer case-9 ")
    );
}

#[test]
fn every_end_has_its_charge() {
    let llm = FakeLlm::start();
    let nginx = start(
        &llm,
        &format!(
            "location /slow/ {{ rate_limit zone=tpm usage=openai reserve=100;
                 proxy_pass http://127.0.0.1:{}/; proxy_buffering off;
                 proxy_read_timeout 300ms; }}
             location /down/ {{ rate_limit zone=tpm usage=openai reserve=100;
                 proxy_pass http://127.0.0.1:{}/; error_page 502 = @down; }}
             location @down {{ default_type application/json;
                 return 503 '{{\"error\":{{\"message\":\"upstream down\"}}}}'; }}",
            llm.port(),
            common::nginx::free_port()
        ),
    );
    // (what, path, charged)
    let cases = [
        ("no usage in the body: refunded", "/openai/v1/models", 0),
        ("no usage, on_missing=keep", "/keep/v1/models", 100),
        (
            "an upstream error: refunded",
            "/openai/v1/chat/completions?status=500",
            0,
        ),
        ("a 404 of the upstream: refunded", "/openai/v1/unknown", 0),
        (
            "a stream without include_usage: refunded",
            "/openai/v1/chat/completions?stream=1&include_usage=0",
            0,
        ),
        (
            "no usage header: refunded",
            "/header/v1/chat/completions",
            0,
        ),
        (
            "upstream closed mid-stream before the usage: the reservation",
            "/openai/v1/chat/completions?stream=1&cut=1&prompt=900&completion=900",
            100,
        ),
        (
            "Anthropic closed after message_start (input 400): what was seen",
            "/anthropic/v1/messages?stream=1&cut=1&prompt=400&completion=900",
            401,
        ),
        (
            "upstream timed out mid-stream: the reservation",
            "/slow/v1/chat/completions?stream=1&delay_ms=1000&prompt=900",
            100,
        ),
    ];
    for (index, (what, path, charged)) in cases.iter().enumerate() {
        let key = format!("Bearer end-{index}");
        // A cut stream is no complete response: whatever the client makes of it.
        let _ = common::Connection::open(nginx.port()).try_send(&post(path, &key));
        let line = logged(&nginx, &key);
        assert_eq!(logged_cost(&line), charged.to_string(), "{what}: {line}");
        wait_used(&nginx, &key, *charged, &format!("{what}: {path}"));
    }
}

#[test]
fn a_client_gone_mid_stream_keeps_the_reservation() {
    let llm = FakeLlm::start();
    let nginx = start(
        &llm,
        &format!(
            "location /ignoring/ {{ rate_limit zone=tpm usage=openai reserve=100;
                 proxy_pass http://127.0.0.1:{}/; proxy_buffering off;
                 proxy_ignore_client_abort on; }}",
            llm.port()
        ),
    );
    for (key, path, charged) in [
        // With proxy_ignore_client_abort the upstream is read to its end, but what comes
        // after the client left is not passed to the filters: the same charge.
        ("Bearer gone-ignoring", "/ignoring/v1/chat/completions?stream=1&chunks=10&delay_ms=100&prompt=900&completion=900", 100),
        // OpenAI reports usage only at the end: nothing seen, the reservation stays.
        (
            "Bearer gone-openai",
            "/openai/v1/chat/completions?stream=1&chunks=40&delay_ms=100&prompt=900&completion=900",
            100,
        ),
        // Anthropic's message_start said 300 input tokens (and 1 output) before the client left.
        (
            "Bearer gone-anthropic",
            "/anthropic/v1/messages?stream=1&chunks=40&delay_ms=100&prompt=300&completion=900",
            301,
        ),
    ] {
        let mut pending = start_request(nginx.port(), &post(path, key));
        // The head and the first events arrive; then the client goes away.
        assert!(
            pending.answered_within(Duration::from_secs(5)),
            "{path}: no answer"
        );
        thread::sleep(Duration::from_millis(300));
        pending.abandon();
        let line = logged(&nginx, key);
        assert_eq!(logged_cost(&line), charged.to_string(), "{line}");
        wait_used(&nginx, key, charged, path);
    }
}

#[test]
fn a_key_in_debt_is_refused_until_the_debt_is_repaid() {
    let llm = FakeLlm::start();
    let port = llm.port();
    // 60 tokens a minute (one a second), 100 at most; reservations of 10; a debt of 50.
    let nginx = nginx_with(
        "rate_limit_zone $http_authorization zone=tpm:1m rate=60r/m burst=100 \
         algorithm=token_bucket;",
        &format!(
            "location /v1/ {{ rate_limit zone=tpm usage=openai reserve=10 debt=50;
                 proxy_pass http://127.0.0.1:{port}; }}"
        ),
    );
    let key = "Bearer debtor";
    // 10 reserved, 300 used: the bucket's 100, then 50 of debt (the other 150 forgiven).
    let first = send(
        &nginx,
        "/v1/chat/completions?prompt=200&completion=100",
        key,
    );
    assert_eq!(first.status, 200);
    let refused = send(&nginx, "/v1/chat/completions", key);
    assert_eq!(refused.status, 429, "{refused:?}");
    // 50 s to repay the debt, then 10 s for the next reservation.
    let retry_after: u64 = refused.header("Retry-After").unwrap().parse().unwrap();
    assert!(
        (58..=60).contains(&retry_after),
        "Retry-After {retry_after}"
    );
    assert_eq!(
        llm.requests(),
        1,
        "the refused request never reached the upstream"
    );
}

/// C concurrent requests on one key, each reserving R and using U > R: admitted tokens are
/// at most the budget plus C times the largest overrun (docs/usage.md). With a bucket of
/// K = 100 and R = 10, at most K / R = 10 are admitted at once, whatever C; the rest are
/// refused at the door, and once the overruns land the key is in debt and refused.
#[test]
fn concurrent_requests_overshoot_by_at_most_c_overruns() {
    let llm = FakeLlm::start();
    let port = llm.port();
    let nginx = nginx_with(
        "rate_limit_zone $http_authorization zone=tpm:1m rate=100r/d burst=100 \
         algorithm=token_bucket;",
        &format!(
            "location /v1/ {{ rate_limit zone=tpm usage=openai reserve=10 debt=1000;
                 proxy_pass http://127.0.0.1:{port}; proxy_buffering off; }}
             location /probe {{ rate_limit zone=tpm; try_files /index.html =404; }}"
        ),
    );
    let key = "Bearer crowd";
    let path = "/v1/chat/completions?stream=1&chunks=5&delay_ms=200&prompt=20&completion=30";
    let pending: Vec<_> = (0..20)
        .map(|_| start_request(nginx.port(), &post(path, key)))
        .collect();
    let statuses: Vec<u16> = pending.into_iter().map(|p| p.finish().status).collect();
    let admitted = statuses.iter().filter(|&&s| s == 200).count() as u64;
    let refused = statuses.iter().filter(|&&s| s == 429).count();
    assert_eq!((admitted, refused), (10, 10), "{statuses:?}");
    let (budget, overrun) = (100, 50 - 10);
    let admitted_tokens = admitted * 50;
    assert!(admitted_tokens <= budget + admitted * overrun);
    // Every overrun was charged: the key owes 500 - 100 tokens and is refused.
    let probe = common::send(
        nginx.port(),
        &Request::get("/probe").header("Authorization", key),
    );
    assert_eq!(probe.status, 429);
    let retry_after: u64 = probe.header("Retry-After").unwrap().parse().unwrap();
    // 400 tokens of debt at 864 s each, then one more for the probe.
    assert_eq!(retry_after.div_ceil(864), 401, "Retry-After {retry_after}");
}

#[test]
fn cost_from_a_variable_at_the_door() {
    let nginx = nginx_with(
        "rate_limit_zone $http_authorization zone=tpm:1m rate=100r/d burst=1000 \
         algorithm=token_bucket;",
        "location / { rate_limit zone=tpm cost=$http_x_cost; try_files /index.html =404; }",
    );
    let get = |cost: &str| {
        let mut request = Request::get("/").header("Authorization", "Bearer v");
        if !cost.is_empty() {
            request = request.header("X-Cost", cost);
        }
        common::send(nginx.port(), &request)
    };
    assert_eq!(remaining_of(&get("400")), 600);
    // Not a number: the line's cost, 1.
    assert_eq!(remaining_of(&get("lots")), 599);
    assert_eq!(remaining_of(&get("")), 598);
    // More than is left: refused, charged nothing.
    assert_eq!(get("599").status, 429);
    assert_eq!(remaining_of(&get("598")), 0);
}

#[test]
fn nginx_t_names_the_bad_word() {
    let zone = "rate_limit_zone $http_authorization zone=tpm:1m rate=100r/m burst=1000 \
                algorithm=token_bucket;";
    let server = |line: &str| {
        format!(
            "{zone}\nserver {{ listen 127.0.0.1:%%PORT%%; location / {{ {line} \
             proxy_pass http://127.0.0.1:9; }} }}"
        )
    };
    let cases = [
        (server("rate_limit zone=tpm usage=claude;"), "invalid usage value \"usage=claude\": it must be openai, anthropic, gemini, azure or a $variable"),
        (server("rate_limit zone=tpm usage=openai reserve=0;"), "invalid reserve value \"reserve=0\""),
        (server("rate_limit zone=tpm usage=openai on_missing=bill;"), "invalid on_missing value \"on_missing=bill\": it must be refund, keep or estimate"),
        (server("rate_limit zone=tpm usage=openai usage_weights=output=4;"), "invalid usage_weights value \"usage_weights=output=4\""),
        (server("rate_limit zone=tpm debt=10;"), "\"debt\" needs \"usage\""),
        (server("rate_limit zone=tpm usage=openai cost=3;"), "\"cost=3\" and \"usage\" cannot be used together"),
        (server("rate_limit zone=tpm usage=openai global=tpm;"), "\"usage\" and \"global\" cannot be used together"),
        (
            "rate_limit_zone $http_authorization zone=w:1m rate=100r/m algorithm=sliding_window;\n\
             server { listen 127.0.0.1:%%PORT%%; location / { rate_limit zone=w usage=openai; } }"
                .to_string(),
            "\"usage\" needs a leaky_bucket, token_bucket or quota zone: zone \"w\" is sliding_window",
        ),
        (
            format!(
                "{zone}\nrate_limit_zone $http_authorization zone=tpd:1m rate=100r/d burst=1000 \
                 algorithm=token_bucket;\nserver {{ listen 127.0.0.1:%%PORT%%; location / {{ \
                 rate_limit zone=tpm usage=openai; rate_limit zone=tpd usage=gemini; }} }}"
            ),
            "\"usage=gemini\" and \"usage=openai\" in one location",
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
    let (ok, output) = check_config(
        &config()
            .no_server()
            .http(&server(
                "rate_limit zone=tpm usage=openai reserve=$http_x_reserve debt=0 \
                 on_missing=keep usage_weights=input:1,output:4,cached:0.1;",
            ))
            .build(),
    );
    assert!(ok, "{output}");
}

/// The `[warn]` lines of an `nginx -t` that must succeed, about usage a response may not let
/// be read.
fn unreadable_usage_warnings(http: &str) -> Vec<String> {
    let text = config().no_server().http(http).build();
    let (ok, output) = check_config(&text);
    assert!(ok, "{output}");
    output
        .lines()
        .filter(|line| line.contains("[warn]") && line.contains("may not read the usage"))
        .map(str::to_string)
        .collect()
}

const BUFFERING: &str = "\"proxy_buffering off;\"";
const ENCODING: &str = "'proxy_set_header Accept-Encoding \"\";'";

/// A proxying location with a usage reader, without `proxy_buffering off` or without
/// `proxy_set_header Accept-Encoding ""`, is warned about, naming what is missing (and only
/// that); nginx still starts.
#[test]
fn nginx_t_warns_when_the_response_may_not_be_readable() {
    let zone = "rate_limit_zone $http_authorization zone=tpm:1m rate=100r/m burst=1000 \
                algorithm=token_bucket;";
    let location = |directives: &str| {
        format!(
            "{zone}\nserver {{ listen 127.0.0.1:%%PORT%%;\nlocation /v1/ {{\n\
             rate_limit zone=tpm usage=openai;\n{directives}\nproxy_pass http://127.0.0.1:9;\n}} }}"
        )
    };
    // Neither: both named, at the proxy_pass line.
    let warned = unreadable_usage_warnings(&location(""));
    assert_eq!(warned.len(), 1, "{warned:?}");
    println!("{}", warned[0]);
    assert!(
        warned[0].contains(
            "rate_limit usage=openai may not read the usage of the responses of proxy_pass in "
        ) && warned[0].contains("nginx.conf:")
            && warned[0].contains(
                "a compressed response, or one nginx buffers to a temporary file, cannot be \
                 read and is charged as cut; add \"proxy_buffering off;\" and \
                 'proxy_set_header Accept-Encoding \"\";' to that location"
            ),
        "{warned:?}"
    );
    let text = config().no_server().http(&location("")).build();
    let proxy_line = text
        .lines()
        .position(|line| line.starts_with("proxy_pass"))
        .expect("the proxy_pass line")
        + 1;
    assert!(
        warned[0].contains(&format!("nginx.conf:{proxy_line}: ")),
        "line {proxy_line}: {warned:?}"
    );

    // Buffering off only: the Accept-Encoding line alone is named.
    let warned = unreadable_usage_warnings(&location("proxy_buffering off;"));
    assert_eq!(warned.len(), 1, "{warned:?}");
    println!("{}", warned[0]);
    assert!(
        warned[0].contains(&format!(
            "a compressed response cannot be read and is charged as cut; add {ENCODING} to \
             that location"
        )) && !warned[0].contains("proxy_buffering"),
        "{warned:?}"
    );
    // Accept-Encoding cleared only (another header beside it): proxy_buffering alone.
    let warned = unreadable_usage_warnings(&location(
        "proxy_set_header X-Tenant a; proxy_set_header accept-encoding \"\";",
    ));
    assert_eq!(warned.len(), 1, "{warned:?}");
    println!("{}", warned[0]);
    assert!(
        warned[0].contains(&format!(
            "a response nginx buffers to a temporary file cannot be read and is charged as \
             cut; add {BUFFERING} to that location"
        )) && !warned[0].contains("Accept-Encoding"),
        "{warned:?}"
    );
    // Every reader (anthropic, gemini, azure), and a line inherited from the server level.
    for api in ["anthropic", "gemini", "azure"] {
        let http = format!(
            "{zone}\nserver {{ listen 127.0.0.1:%%PORT%%; rate_limit zone=tpm usage={api};\n\
             location /v1/ {{ proxy_buffering off; proxy_pass http://127.0.0.1:9; }} }}"
        );
        let warned = unreadable_usage_warnings(&http);
        assert_eq!(warned.len(), 1, "{warned:?}");
        assert!(
            warned[0].contains(&format!("rate_limit usage={api} may not read"))
                && warned[0].contains(&format!("add {ENCODING} to that location")),
            "{warned:?}"
        );
    }
    // nginx's inheritance: a location with a proxy_set_header of its own does not inherit the
    // server's, so its Accept-Encoding is no longer cleared.
    let http = format!(
        "{zone}\nserver {{ listen 127.0.0.1:%%PORT%%; proxy_buffering off;\n\
         proxy_set_header Accept-Encoding \"\";\n\
         location /v1/ {{ rate_limit zone=tpm usage=openai; proxy_set_header X-Tenant a;\n\
         proxy_pass http://127.0.0.1:9; }} }}"
    );
    let warned = unreadable_usage_warnings(&http);
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(
        warned[0].contains(&format!("add {ENCODING} to that location")),
        "{warned:?}"
    );

    // A warning, not an error: nginx starts with it.
    let llm = FakeLlm::start();
    let nginx = nginx_with(
        zone,
        &format!(
            "location /v1/ {{ rate_limit zone=tpm usage=openai reserve=100;\n\
             proxy_pass http://127.0.0.1:{}; }}",
            llm.port()
        ),
    );
    let response = send(
        &nginx,
        "/v1/chat/completions?prompt=10&completion=5",
        "Bearer a",
    );
    assert_eq!(response.status, 200, "{}", response.text());
}

/// Both directives (in the location, or inherited from the server), a usage read from a
/// variable, or a reader in a location that does not proxy: no warning.
#[test]
fn nginx_t_is_quiet_when_the_response_is_readable() {
    let zone = "rate_limit_zone $http_authorization zone=tpm:1m rate=100r/m burst=1000 \
                algorithm=token_bucket;";
    let cases = [
        format!(
            "{zone}\nserver {{ listen 127.0.0.1:%%PORT%%; location /v1/ {{\n\
             rate_limit zone=tpm usage=openai reserve=auto:1000;\n\
             proxy_pass http://127.0.0.1:9; proxy_http_version 1.1;\n\
             proxy_set_header Accept-Encoding \"\"; proxy_buffering off; }} }}"
        ),
        format!(
            "{zone}\nproxy_buffering off;\nserver {{ listen 127.0.0.1:%%PORT%%;\n\
             proxy_set_header Accept-Encoding \"\";\n\
             location /v1/ {{ rate_limit zone=tpm usage=anthropic;\n\
             proxy_pass http://127.0.0.1:9; }} }}"
        ),
        format!(
            "{zone}\nserver {{ listen 127.0.0.1:%%PORT%%; location /v1/ {{\n\
             rate_limit zone=tpm usage=$upstream_http_x_usage;\n\
             proxy_pass http://127.0.0.1:9; }} }}"
        ),
        format!(
            "{zone}\nserver {{ listen 127.0.0.1:%%PORT%%; location /v1/ {{\n\
             rate_limit zone=tpm usage=openai; empty_gif; }}\n\
             location /other/ {{ proxy_pass http://127.0.0.1:9; }} }}"
        ),
    ];
    for http in &cases {
        assert_eq!(
            unreadable_usage_warnings(http),
            Vec::<String>::new(),
            "{http}"
        );
    }
    // The shipped example (docs/usage.md's configuration) has both lines: no warning at all.
    let example =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/nginx-conf/llm.conf"))
            .expect("nginx-conf/llm.conf");
    let (ok, output) = check_config(&example);
    assert!(ok && !output.contains("[warn]"), "{output}");
}

#[test]
fn openai_headers_and_429_body() {
    let llm = FakeLlm::start();
    let port = llm.port();
    let nginx = nginx_with(
        "rate_limit_zone $http_authorization zone=tpm:1m rate=100r/d burst=1000 \
         algorithm=token_bucket;
         rate_limit_zone $http_authorization zone=rpm:1m rate=1r/d burst=3 \
         algorithm=token_bucket;",
        &format!(
            "location /v1/ {{ rate_limit_openai_headers on;
                 rate_limit zone=rpm;
                 rate_limit zone=tpm usage=openai reserve=100;
                 proxy_pass http://127.0.0.1:{port}; }}"
        ),
    );
    let first = send(
        &nginx,
        "/v1/chat/completions?prompt=1500&completion=500",
        "Bearer a",
    );
    assert_eq!(first.status, 200);
    let header = |response: &Response, name: &str| response.header(name).unwrap_or("-").to_string();
    assert_eq!(header(&first, "x-ratelimit-limit-tokens"), "1000");
    assert_eq!(header(&first, "x-ratelimit-remaining-tokens"), "900");
    assert_eq!(header(&first, "x-ratelimit-limit-requests"), "3");
    assert_eq!(header(&first, "x-ratelimit-remaining-requests"), "2");
    // 100 tokens a day: 100 used take 86400 s to come back.
    assert_eq!(header(&first, "x-ratelimit-reset-tokens"), "24h0m0s");
    // 2000 used: the key is in debt; the next is refused in OpenAI's words.
    let refused = send(&nginx, "/v1/chat/completions", "Bearer a");
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("Content-Type"), Some("application/json"));
    let body: serde_json::Value = serde_json::from_str(&refused.text()).unwrap();
    assert_eq!(body["error"]["code"], "rate_limit_exceeded", "{body}");
    assert_eq!(body["error"]["type"], "tokens", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "Rate limit reached for tokens in zone \"tpm\": limit 1000, used 1000, requested 100."
        ),
        "{message}"
    );
    assert_eq!(header(&refused, "x-ratelimit-remaining-tokens"), "0");
    assert!(refused.header("Retry-After").is_some());
    // Requests: three a day.
    for _ in 0..2 {
        assert_eq!(send(&nginx, "/v1/models", "Bearer b").status, 200);
    }
    let third = send(&nginx, "/v1/models", "Bearer b");
    assert_eq!(header(&third, "x-ratelimit-remaining-requests"), "0");
    let refused = send(&nginx, "/v1/models", "Bearer b");
    assert_eq!(refused.status, 429);
    let body: serde_json::Value = serde_json::from_str(&refused.text()).unwrap();
    assert_eq!(body["error"]["type"], "requests", "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("in zone \"rpm\": limit 3, used 3, requested 1."));
}

#[test]
fn a_reservation_from_a_variable() {
    let llm = FakeLlm::start();
    let nginx = start(
        &llm,
        &format!(
            "location /reserve/ {{ rate_limit zone=tpm usage=openai reserve=$http_x_reserve;
                 proxy_pass http://127.0.0.1:{}/; }}",
            llm.port()
        ),
    );
    let path = "/reserve/v1/chat/completions?prompt=2&completion=3";
    let with = |key: &str, reserve: &str| {
        common::send(nginx.port(), &post(path, key).header("X-Reserve", reserve))
    };
    // The door's RateLimit field shows the reservation; the settlement leaves the usage.
    let response = with("Bearer r1", "700");
    assert_eq!(remaining_of(&response), CAPACITY - 700);
    wait_used(&nginx, "Bearer r1", 5, "Bearer r1");
    // More than the bucket holds: the whole bucket is reserved, and the request passes.
    let response = with("Bearer r2", "99999999");
    assert_eq!((response.status, remaining_of(&response)), (200, 0));
    wait_used(&nginx, "Bearer r2", 5, "Bearer r2");
    // Not a number: 1.
    let response = with("Bearer r3", "many");
    assert_eq!(remaining_of(&response), CAPACITY - 1);
}

/// The admin API and the metrics count a usage zone's tokens: what was reserved at the door,
/// what the requests used, gave back, charged past their reservation and had forgiven, and
/// how many were settled with and without a usage.
#[test]
fn the_admin_api_and_metrics_count_tokens() {
    let llm = FakeLlm::start();
    let port = llm.port();
    // A bucket of 100 tokens, reservations of 10, a debt of 50.
    let nginx = nginx_with(
        "rate_limit_zone $http_authorization zone=tpm:1m rate=60r/m burst=100 \
         algorithm=token_bucket;",
        &format!(
            "location /v1/ {{ rate_limit zone=tpm usage=openai reserve=10 debt=50;
                 proxy_pass http://127.0.0.1:{port}; }}
             location /admin/ {{ rate_limit_admin; }}"
        ),
    );
    // Used 300: 290 past the reservation, of which the bucket's 90 and the debt's 50 are
    // charged and 150 forgiven.
    let over = send(
        &nginx,
        "/v1/chat/completions?prompt=200&completion=100",
        "Bearer a",
    );
    assert_eq!(over.status, 200);
    // Used 5: 5 given back.
    let under = send(
        &nginx,
        "/v1/chat/completions?prompt=2&completion=3",
        "Bearer b",
    );
    assert_eq!(under.status, 200);
    // No usage (a model list): the whole 10 given back.
    let models = send(&nginx, "/v1/models", "Bearer c");
    assert_eq!(models.status, 200);
    // Refused at the door: reserves nothing.
    let refused = send(&nginx, "/v1/chat/completions", "Bearer a");
    assert_eq!(refused.status, 429);

    let zone = |nginx: &Nginx| -> serde_json::Value {
        let response = common::get(nginx.port(), "/admin/zones/tpm");
        serde_json::from_slice(&response.body).expect("zone JSON")
    };
    // Settled in each request's log phase, just after its response: wait for the third.
    let deadline = Instant::now() + Duration::from_secs(10);
    while zone(&nginx)["usage"]["settled_without_usage"] != 1 {
        assert!(Instant::now() < deadline, "not settled: {}", zone(&nginx));
        thread::sleep(Duration::from_millis(20));
    }
    let usage = zone(&nginx)["usage"].clone();
    assert_eq!(
        usage,
        serde_json::json!({
            "tokens_reserved": 30, "tokens_used": 305, "tokens_refunded": 15,
            "tokens_overrun": 290, "tokens_forgiven": 150,
            "settled_with_usage": 2, "settled_without_usage": 1, "bad_usage": 0,
        })
    );
    let metrics = common::get(nginx.port(), "/admin/metrics").text();
    for line in [
        "rate_limit_usage_tokens_total{zone=\"tpm\",kind=\"reserved\"} 30",
        "rate_limit_usage_tokens_total{zone=\"tpm\",kind=\"used\"} 305",
        "rate_limit_usage_tokens_total{zone=\"tpm\",kind=\"refunded\"} 15",
        "rate_limit_usage_tokens_total{zone=\"tpm\",kind=\"overrun\"} 290",
        "rate_limit_usage_tokens_total{zone=\"tpm\",kind=\"forgiven\"} 150",
        "rate_limit_usage_settled_total{zone=\"tpm\",usage=\"found\"} 2",
        "rate_limit_usage_settled_total{zone=\"tpm\",usage=\"missing\"} 1",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no {line:?} in:\n{metrics}"
        );
    }
    // The requests themselves are counted as before: three passed, one rejected.
    assert_eq!(
        (
            zone(&nginx)["passed"].clone(),
            zone(&nginx)["rejected"].clone()
        ),
        (3.into(), 1.into())
    );
    // The key in debt shows it apart from `remaining` (50 owed at settlement, repaid at one
    // token a second); the key that gave back owes nothing, and shows no `debt`.
    let key = |name: &str| -> serde_json::Value {
        let response = common::get(nginx.port(), &format!("/admin/zones/tpm/keys/{name}"));
        serde_json::from_slice(&response.body).expect("key JSON")
    };
    let debtor = key("Bearer%20a");
    let debt = debtor["debt"]
        .as_u64()
        .unwrap_or_else(|| panic!("no debt: {debtor}"));
    assert!((40..=50).contains(&debt), "debt {debt}: {debtor}");
    assert_eq!(
        (&debtor["remaining"], &debtor["would_pass"]),
        (&0.into(), &false.into())
    );
    let even = key("Bearer%20b");
    assert!(even.get("debt").is_none(), "{even}");
    // 5 charged of 100, and a token back each second since.
    let remaining = even["remaining"].as_u64().unwrap_or_default();
    assert!((95..=99).contains(&remaining), "{even}");
    // The top keys rank them by the tokens they used (the heaviest first; the model list
    // used none and is not shown), over both windows; the total is `tokens_used`.
    let top = |query: &str| -> serde_json::Value {
        let response = common::get(nginx.port(), &format!("/admin/zones/tpm/top?{query}"));
        assert_eq!(response.status, 200, "{}", response.text());
        serde_json::from_slice(&response.body).expect("top JSON")
    };
    for window in ["1m", "10m"] {
        let tokens = top(&format!("by=tokens&window={window}"));
        assert_eq!(
            (&tokens["by"], &tokens["total"]),
            (&"tokens".into(), &305.into()),
            "{tokens}"
        );
        let keys: Vec<(String, u64)> = tokens["keys"]
            .as_array()
            .expect("keys")
            .iter()
            .map(|k| {
                (
                    k["key"].as_str().unwrap_or("").to_string(),
                    k["count"].as_u64().unwrap_or(0),
                )
            })
            .collect();
        assert_eq!(
            keys,
            [("Bearer a".to_string(), 300), ("Bearer b".to_string(), 5)],
            "{tokens}"
        );
    }
    // The refusal is ranked apart, by requests.
    assert_eq!(top("by=rejected")["keys"][0]["count"], 1);
}
