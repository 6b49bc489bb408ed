//! Usage-based limits that read the request body (issue 38): `reserve=auto`, usage always
//! reported (an OpenAI stream forwarded asking for it, the usage chunk taken out for a client
//! that had not asked), `$rate_limit_llm_model`, against real nginx with the body in memory
//! and in a temporary file, HTTP/1.1 and HTTP/2 clients, and a large upload passing intact.

mod common;

use std::process::Command;
use std::thread;

use common::llm::{body_hash, FakeLlm};
use common::{config, Nginx, Request, Response};

const CAPACITY: u64 = 100_000;

/// nginx in front of `llm` with a bucket of [`CAPACITY`] tokens per key refilling 100 a
/// day; `/mem/` keeps bodies in memory, `/file/` writes any over 1k to a temporary file;
/// `/h2/` is the same location on an HTTP/2 listener (`h2_port`).
fn start(llm: &FakeLlm) -> Nginx {
    let port = llm.port();
    let location = |prefix: &str, extra: &str| {
        format!(
            "location /{prefix}/ {{ rate_limit zone=tpm usage=openai reserve=auto:2000;
                 add_header X-Model \"$rate_limit_llm_model\" always;
                 {extra}
                 proxy_pass http://127.0.0.1:{port}/; proxy_buffering off; }}"
        )
    };
    config()
        .http(&format!(
            "rate_limit_zone $http_authorization zone=tpm:1m rate=100r/d burst={CAPACITY} \
             algorithm=token_bucket;
             rate_limit_zone $http_authorization:$rate_limit_llm_model zone=per_model:1m \
                 rate=100r/d burst=1000 algorithm=token_bucket;
             rate_limit_openai_headers on;
             client_max_body_size 20m;
             server {{ listen 127.0.0.1:%%PORT2%% http2; {} {} }}",
            location("mem", ""),
            location("file", "client_body_buffer_size 1k;"),
        ))
        .locations(&format!(
            "{} {}
             location /probe {{ rate_limit zone=tpm; try_files /index.html =404; }}
             location /estimate/ {{
                 rate_limit zone=tpm usage=openai reserve=100 on_missing=estimate;
                 proxy_pass http://127.0.0.1:{port}/; proxy_buffering off; }}
             location /model/ {{ rate_limit zone=per_model usage=openai reserve=auto;
                 proxy_pass http://127.0.0.1:{port}/; }}",
            location("mem", ""),
            location("file", "client_body_buffer_size 1k;"),
        ))
        .start()
}

/// A Chat Completions request asking for `max_tokens`, streamed or not, with
/// `stream_options.include_usage` as `include_usage` says (absent when `None`), its prompt
/// padded to `pad` bytes.
fn chat(max_tokens: u64, stream: bool, include_usage: Option<bool>, pad: usize) -> String {
    let options = match include_usage {
        Some(flag) => format!(r#","stream_options":{{"include_usage":{flag}}}"#),
        None => String::new(),
    };
    format!(
        r#"{{"model":"fake-1","max_tokens":{max_tokens},"stream":{stream}{options},"messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(pad)
    )
}

const TARGET: &str = "chat/completions?from_body=1&prompt=100&completion=400&chunks=4";

fn post(nginx: &Nginx, path: &str, key: &str, body: &str) -> Response {
    common::send(
        nginx.port(),
        &Request::new("POST", path)
            .header("Authorization", key)
            .json(body),
    )
}

/// `x-ratelimit-remaining-tokens` of a response: the key's tokens left after its reservation.
fn remaining(response: &Response) -> u64 {
    response
        .header("x-ratelimit-remaining-tokens")
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no x-ratelimit-remaining-tokens: {response:?}"))
}

/// The events of a streamed answer that carry a usage object.
fn usage_chunks(text: &str) -> usize {
    text.split("\n\n")
        .filter(|event| event.contains(r#""choices":[]"#) && event.contains(r#""usage":{"#))
        .count()
}

/// `curl` over HTTP/2 without TLS: status line and headers, then the body.
fn curl_h2(port: u16, path: &str, key: &str, body_file: &std::path::Path) -> (String, String) {
    curl(&["--http2-prior-knowledge"], port, path, key, body_file)
}

/// `curl` with `options`, posting `body_file`: status line and headers, then the body.
fn curl(
    options: &[&str],
    port: u16,
    path: &str,
    key: &str,
    body_file: &std::path::Path,
) -> (String, String) {
    let output = Command::new("curl")
        .args(["-sS", "-D", "-", "-o", "-"])
        .args(options)
        .args(["-H", &format!("Authorization: {key}")])
        .args(["-H", "Content-Type: application/json"])
        .arg("--data-binary")
        .arg(format!("@{}", body_file.display()))
        .arg(format!("http://127.0.0.1:{port}{path}"))
        .output()
        .expect("run curl");
    assert!(output.status.success(), "curl: {output:?}");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (head.to_string(), body.to_string())
}

fn header_of<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

/// nginx-conf/llm.conf's budget (10,000 tokens a minute): 40 concurrent streams that each
/// cost 1,000 tokens (800 of `max_tokens`, 200 of prompt) are at most 12 admitted, however the
/// client sets `include_usage`; the stream each client gets has the usage chunk only when it
/// asked for it.
#[test]
fn llm_conf_budget_holds_whatever_the_client_sends() {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("nginx-conf/llm.conf"),
    )
    .unwrap();
    let nginx = Nginx::start(&text);
    for (key, include_usage) in [
        ("Bearer asked-false", Some(false)),
        ("Bearer left-out", None),
        ("Bearer asked-true", Some(true)),
    ] {
        let body = chat(800, true, include_usage, 0);
        let port = nginx.port();
        let answers: Vec<Response> = (0..40)
            .map(|_| {
                let body = body.clone();
                thread::spawn(move || {
                    common::send(
                        port,
                        &Request::new("POST", "/v1/chat/completions")
                            .header("Authorization", key)
                            .json(&body),
                    )
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|handle| handle.join().unwrap())
            .collect();
        let admitted: Vec<&Response> = answers.iter().filter(|a| a.status == 200).collect();
        eprintln!("{key}: {} of 40 admitted", admitted.len());
        assert!(
            (8..=12).contains(&admitted.len()),
            "{key}: {} of 40 admitted",
            admitted.len()
        );
        assert!(answers.iter().all(|a| a.status == 200 || a.status == 429));
        for answer in admitted {
            let text = answer.text();
            assert!(
                text.contains("Hello") && text.ends_with("data: [DONE]\n\n"),
                "{text}"
            );
            let expected = usize::from(include_usage == Some(true));
            assert_eq!(usage_chunks(&text), expected, "{key}: {text}");
        }
    }
}

/// `reserve=auto`: `max_tokens` plus the body's bytes / 4 at the door, settled from the usage
/// the stream reports although the client did not ask for it, which it does not see; the
/// same with the body in a temporary file and over HTTP/2.
#[test]
fn reserve_auto_and_usage_asked_in_memory_in_a_file_and_over_http2() {
    let llm = FakeLlm::start();
    let nginx = start(&llm);
    let cases = [("mem", 100), ("file", 4000)];
    for (prefix, pad) in cases {
        let key = format!("Bearer {prefix}");
        let body = chat(700, true, None, pad);
        let reservation = 700 + (body.len() as u64).div_ceil(4);
        let answer = post(&nginx, &format!("/{prefix}/{TARGET}"), &key, &body);
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(remaining(&answer), CAPACITY - reservation, "{prefix}");
        assert_eq!(answer.header("X-Model"), Some("fake-1"));
        let text = answer.text();
        assert_eq!(usage_chunks(&text), 0, "{prefix}: {text}");
        assert!(
            text.contains("w3 ") && text.ends_with("data: [DONE]\n\n"),
            "{text}"
        );
        // Settled at the reported 500 (100 + 400).
        wait_used(&nginx, &key, 500);

        // Over HTTP/2: the same, the body written to a file for curl.
        let h2_key = format!("Bearer h2-{prefix}");
        let file = nginx.prefix().join(format!("body-{prefix}.json"));
        std::fs::write(&file, &body).unwrap();
        let (head, text) = curl_h2(
            nginx.port_n(2),
            &format!("/{prefix}/{TARGET}"),
            &h2_key,
            &file,
        );
        assert!(head.starts_with("HTTP/2 200"), "{head}");
        let left: u64 = header_of(&head, "x-ratelimit-remaining-tokens")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{head}"));
        assert_eq!(left, CAPACITY - reservation, "h2 {prefix}");
        assert_eq!(usage_chunks(&text), 0, "h2 {prefix}: {text}");
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        wait_used(&nginx, &h2_key, 500);

        // A client that asked gets the usage chunk, once.
        let asked = post(
            &nginx,
            &format!("/{prefix}/{TARGET}"),
            "Bearer asked",
            &chat(700, true, Some(true), pad),
        );
        assert_eq!(usage_chunks(&asked.text()), 1, "{:?}", asked.text());
    }
    // A request that sets no ceiling reserves the default (2000) plus its prompt.
    let body = r#"{"model":"m","messages":[]}"#;
    let answer = post(&nginx, "/mem/chat/completions", "Bearer default", body);
    assert_eq!(remaining(&answer), CAPACITY - 2000 - 7);
    let log = nginx.error_log();
    assert!(!log.contains("[alert]") && !log.contains("[crit]"), "{log}");
}

/// Wait until `key`'s requests so far were charged `expected` tokens, as probes of cost 1
/// (`/probe`, `RateLimit: ...;r=LEFT`) see it: a request is settled in its log phase, which
/// may run after the client has the whole answer. Panics with the last figure after 10 s.
fn wait_used(nginx: &Nginx, key: &str, expected: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut probes = 0;
    loop {
        let probe = common::send(
            nginx.port(),
            &Request::get("/probe").header("Authorization", key),
        );
        let field = probe.header("RateLimit").unwrap_or_default().to_string();
        let left: u64 = field
            .split(';')
            .find_map(|part| part.strip_prefix("r="))
            .and_then(|r| r.parse().ok())
            .unwrap_or_else(|| panic!("no r= in RateLimit {field:?}: {probe:?}"));
        probes += 1;
        let used = CAPACITY - left - probes;
        if used == expected {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{key}: charged {used}, expected {expected}"
        );
        thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A chunked HTTP/1.1 body is read whole, asks for usage, and goes upstream with a length.
#[test]
fn a_chunked_body_asks_for_usage_too() {
    let llm = FakeLlm::start();
    let nginx = start(&llm);
    let body = chat(300, true, Some(false), 3000);
    let file = nginx.prefix().join("chunked.json");
    std::fs::write(&file, &body).unwrap();
    for prefix in ["mem", "file"] {
        let key = format!("Bearer chunked-{prefix}");
        let (head, text) = curl(
            &["--http1.1", "-H", "Transfer-Encoding: chunked"],
            nginx.port(),
            &format!("/{prefix}/{TARGET}"),
            &key,
            &file,
        );
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert_eq!(usage_chunks(&text), 0, "{text}");
        assert!(
            text.contains("w3 ") && text.ends_with("data: [DONE]\n\n"),
            "{text}"
        );
        wait_used(&nginx, &key, 500);
    }
}

/// `on_missing=estimate`: a stream that reports no usage is charged its text's characters / 4
/// plus the prompt's estimate; one that streamed no text (an error) nothing.
#[test]
fn a_stream_without_usage_is_charged_an_estimate() {
    let llm = FakeLlm::start();
    let nginx = start(&llm);
    // The fake ignores the body here: 4 chunks of "wN " (12 characters: 3 tokens), no usage.
    let body = chat(500, true, Some(true), 10);
    let path = "/estimate/chat/completions?stream=1&include_usage=0&chunks=4";
    let answer = post(&nginx, path, "Bearer estimate", &body);
    assert_eq!(answer.status, 200);
    assert_eq!(usage_chunks(&answer.text()), 0);
    wait_used(
        &nginx,
        "Bearer estimate",
        3 + (body.len() as u64).div_ceil(4),
    );
    let error = post(
        &nginx,
        "/estimate/chat/completions?status=500",
        "Bearer error",
        &body,
    );
    assert_eq!(error.status, 500);
    wait_used(&nginx, "Bearer error", 0);
}

/// `$rate_limit_llm_model` in a key: each model of one caller has its own budget (1,000
/// tokens; each request reserves 900 + its prompt's estimate, and is settled at 30).
#[test]
fn a_budget_per_model() {
    let llm = FakeLlm::start();
    let nginx = start(&llm);
    let ask = |model: &str| {
        let body = format!(r#"{{"model":"{model}","max_tokens":900,"messages":[]}}"#);
        let reservation = 900 + (body.len() as u64).div_ceil(4);
        let answer = post(
            &nginx,
            "/model/chat/completions?from_body=1",
            "Bearer k",
            &body,
        );
        (answer, reservation)
    };
    let (alpha, reservation) = ask("alpha");
    assert_eq!(alpha.status, 200);
    assert_eq!(
        alpha.header("x-ratelimit-remaining-tokens"),
        Some(&*(1000 - reservation).to_string())
    );
    let (beta, reservation) = ask("beta");
    assert_eq!(beta.status, 200);
    assert_eq!(
        beta.header("x-ratelimit-remaining-tokens"),
        Some(&*(1000 - reservation).to_string())
    );
    // alpha's own budget has alpha's first request in it: refused while it is reserved, or
    // 30 tokens less once settled.
    let (again, reservation) = ask("alpha");
    let left = again
        .header("x-ratelimit-remaining-tokens")
        .unwrap_or_default();
    assert!(
        again.status == 429 || left == (1000 - 30 - reservation).to_string(),
        "{again:?}"
    );
}

/// A 10 MB body through a `usage=` location reaches the upstream byte for byte, over
/// HTTP/1.1 and HTTP/2; it is not read for what it says (over 1 MB): the default reserved.
#[test]
fn ten_megabytes_arrive_intact() {
    let llm = FakeLlm::start();
    let nginx = start(&llm);
    let mut body = Vec::with_capacity(10 << 20);
    let mut state = 0x2545_f491_4f6c_dd1du64;
    while body.len() < 10 << 20 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        body.extend_from_slice(&state.to_le_bytes());
    }
    let expected = format!(r#"{{"bytes":{},"hash":{}}}"#, body.len(), body_hash(&body));
    let answer = common::send(
        nginx.port(),
        &Request::new("POST", "/file/upload")
            .header("Authorization", "Bearer big")
            .body(body.clone()),
    );
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.text(), expected);
    assert_eq!(remaining(&answer), CAPACITY - 2000);
    let file = nginx.prefix().join("big.bin");
    std::fs::write(&file, &body).unwrap();
    let (head, text) = curl_h2(nginx.port_n(2), "/mem/upload", "Bearer big-h2", &file);
    assert!(head.starts_with("HTTP/2 200"), "{head}");
    assert_eq!(text, expected);
}
