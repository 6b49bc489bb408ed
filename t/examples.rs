//! The example configs in `nginx-conf/` start, serve, and limit as their comments say.
//! They load the rate limit module: `cargo build` must have built it.

mod common;

use std::fs;
use std::net::TcpListener;
use std::path::PathBuf;
use std::time::Duration;

use common::nginx::free_port;
use common::skip;
use common::{get, nginx_binary, send, statuses, Connection, Nginx, Request, Response};
use serde_json::json;

fn examples_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("nginx-conf")
}

fn example(name: &str) -> String {
    let path = examples_dir().join(name);
    let text =
        fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    with_dynamic_stream_module(text)
}

/// The stream examples' `#load_module modules/ngx_stream_module.so;` uncommented, with the
/// binary's `--modules-path`, when this nginx's stream module is dynamic (Debian's).
fn with_dynamic_stream_module(config: String) -> String {
    const LINE: &str = "#load_module modules/ngx_stream_module.so;";
    if !config.contains(LINE) {
        return config;
    }
    let Some(module) = common::stream_module_path() else {
        return config;
    };
    config.replace(LINE, &format!("load_module {module};"))
}

/// An example as this test starts it: `%%REDIS%%` (nginx-conf/cluster.conf) is a port where
/// no Redis answers (nginx starts anyway, and says "cannot connect"; t/readme.rs runs it
/// with a Redis).
fn example_without_redis(name: &str) -> String {
    example(name).replace("%%REDIS%%", &format!("redis://127.0.0.1:{}", free_port()))
}

/// Whether an example loads Debian's Lua module (nginx-conf/lua.conf), which only Debian's
/// nginx loads.
fn loads_lua(config: &str) -> bool {
    config
        .lines()
        .any(|line| line.trim_start().starts_with("load_module") && line.contains("ngx_http_lua"))
}

/// Whether the nginx under test is Debian's, for which Debian's Lua module is built.
fn is_debian_nginx() -> bool {
    let binary = nginx_binary();
    binary.canonicalize().unwrap_or(binary) == std::path::Path::new("/usr/sbin/nginx")
}

/// Sends `count` GETs on one keep-alive connection, as fast as it can.
fn burst(port: u16, path: &str, count: usize) -> Vec<Response> {
    let mut connection = Connection::open(port);
    (0..count).map(|_| connection.get(path)).collect()
}

fn total_elapsed(responses: &[Response]) -> Duration {
    responses.iter().map(|r| r.elapsed).sum()
}

/// The ports `listen` directives of a config name literally, not through a placeholder.
fn literal_listen_ports(config: &str) -> Vec<String> {
    config
        .lines()
        .map(|line| line.split('#').next().unwrap_or_default().trim())
        .filter_map(|line| line.strip_prefix("listen "))
        .map(|address| address.split_whitespace().next().unwrap_or_default())
        .map(|address| address.trim_end_matches(';'))
        .filter(|address| !address.contains("%%PORT"))
        .map(str::to_string)
        .collect()
}

/// Every example runs on free ports, so that `cargo test --workspace` passes while
/// `scripts/run-example.sh` runs an example on its own ports (8080, and 8081 for the admin
/// API): this test holds those two ports itself (or finds them taken by such an example)
/// while it starts every config in nginx-conf/.
#[test]
fn every_example_config_starts_and_serves() {
    let holders: Vec<_> = [8080, 8081]
        .into_iter()
        .map(|port| TcpListener::bind(("127.0.0.1", port)))
        .collect();
    for (port, holder) in [8080, 8081].iter().zip(&holders) {
        if let Err(error) = holder {
            // Taken by someone else (an example started by run-example.sh): as good.
            assert_eq!(
                error.kind(),
                std::io::ErrorKind::AddrInUse,
                "cannot bind 127.0.0.1:{port}: {error}"
            );
        }
    }

    let mut names: Vec<String> = fs::read_dir(examples_dir())
        .expect("cannot read nginx-conf/")
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".conf"))
        .collect();
    names.sort();
    assert!(
        names.len() >= 2,
        "examples missing from nginx-conf/: {names:?}"
    );
    for name in names {
        let literal = literal_listen_ports(&example(&name));
        assert!(
            literal.is_empty(),
            "nginx-conf/{name} listens on {literal:?}: use %%PORT%%, %%PORT2%%... \
             (scripts/run-example.sh fills them in)"
        );
        let config = example_without_redis(&name);
        let unmet = (loads_lua(&config) && !is_debian_nginx()).then(|| {
            format!(
                "nginx-conf/{name} needs Debian's nginx with Lua (TEST_NGINX_BINARY=/usr/sbin/nginx \
                 and RATE_LIMIT_MODULE built by scripts/build-for-nginx.sh)"
            )
        });
        if skip::unless_declared("lua", unmet).is_some() {
            continue;
        }
        let nginx = Nginx::try_start(&config)
            .unwrap_or_else(|report| panic!("nginx-conf/{name} does not start:\n{report}"));
        let response = get(nginx.port(), "/");
        assert_eq!(response.status, 200, "nginx-conf/{name}: {response:?}");
    }
}

#[test]
fn basic_conf_passes_the_burst_then_answers_429() {
    let nginx = Nginx::start(&example("basic.conf"));
    // 5r/s burst=10 nodelay: 11 requests pass at once, the 12th is rejected, as long as the
    // twelve take less than the 200 ms in which one request drains.
    let responses = burst(nginx.port(), "/", 12);
    let took = total_elapsed(&responses);
    assert!(took < Duration::from_millis(150), "the burst took {took:?}");
    let mut expected = vec![200; 11];
    expected.push(429);
    assert_eq!(statuses(&responses), expected);

    assert_eq!(responses[0].header("X-Rate-Limit-Status"), Some("PASSED"));
    assert_eq!(responses[0].text(), "ok\n");
    let rejected = &responses[11];
    assert_eq!(rejected.header("X-Rate-Limit-Status"), Some("REJECTED"));
    let retry_after: u64 = rejected
        .header("Retry-After")
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no whole-second Retry-After: {rejected:?}"));
    assert_eq!(
        retry_after, 1,
        "one request drains in 200 ms, rounded up to 1 s"
    );
}

#[test]
fn limit_req_twin_conf_sides_answer_alike() {
    let nginx = Nginx::start(&example("limit_req_twin.conf"));
    // 10r/s burst=5 nodelay: 6 pass at once, the 7th is rejected (one drains in 100 ms).
    let mut expected = vec![200; 6];
    expected.push(429);
    for path in ["/limit_req", "/rate_limit"] {
        let responses = burst(nginx.port(), path, 7);
        let took = total_elapsed(&responses);
        assert!(
            took < Duration::from_millis(70),
            "{path}: the burst took {took:?}"
        );
        assert_eq!(statuses(&responses), expected, "{path}");
    }
    assert_eq!(get(nginx.port(), "/").status, 200);
}

#[test]
fn login_conf_blocks_a_guesser_and_not_a_user() {
    let nginx = Nginx::start(&example("login.conf"));
    let mut connection = Connection::open(nginx.port());
    // Logging in successfully, again and again: never counted.
    for _ in 0..20 {
        let response = connection.get("/login?password=secret");
        assert_eq!(response.status, 200);
        assert_eq!(response.header("X-Rate-Limit-Status"), Some("PASSED"));
    }
    // Guessing: 6 wrong passwords reach the application, the 7th is rejected and blocks the
    // address for 15 minutes; from then on even the right password is refused.
    let guesses: Vec<u16> = (0..7)
        .map(|_| connection.get("/login?password=guess").status)
        .collect();
    assert_eq!(guesses, [401, 401, 401, 401, 401, 401, 429]);
    let refused = connection.get("/login?password=secret");
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("X-Rate-Limit-Status"), Some("BLOCKED"));
    assert_eq!(refused.header("Retry-After"), Some("900"));
    let blocked = get(nginx.port_n(2), "/ratelimit/zones/login/blocked");
    let blocked: serde_json::Value = serde_json::from_slice(&blocked.body).expect("JSON");
    assert_eq!(blocked["count"], 1, "{blocked}");
    // $binary_remote_addr: the four bytes of 127.0.0.1 are shown, and taken, as the address.
    assert_eq!(blocked["keys"][0]["key"], "127.0.0.1", "{blocked}");
    let admin = |method: &str, path: &str| {
        let response = send(nginx.port_n(2), &Request::new(method, path));
        let json = serde_json::from_slice(&response.body).unwrap_or(serde_json::Value::Null);
        (response.status, json)
    };
    let (status, block) = admin("GET", "/ratelimit/zones/login/blocked/127.0.0.1");
    assert_eq!(
        (status, block["left_ms"].as_u64().map(|ms| ms > 890_000)),
        (200, Some(true))
    );
    let (status, key) = admin("GET", "/ratelimit/zones/login/keys/127.0.0.1");
    assert_eq!((status, &key["key"]), (200, &json!("127.0.0.1")), "{key}");
    assert_eq!(key["block"]["level"], 0, "{key}");
    let (_, top) = admin("GET", "/ratelimit/zones/login/top?by=rejected");
    assert_eq!(top["keys"][0]["key"], "127.0.0.1", "{top}");
    // Released by address: the release ends the block and forgets the bucket (a released key
    // whose bucket is still full would be rejected, and blocked, again), so the user logs in
    // at once, and there is no count left to forget.
    let (status, _) = admin("DELETE", "/ratelimit/zones/login/blocked/127.0.0.1");
    assert_eq!(status, 204);
    let (status, _) = admin("DELETE", "/ratelimit/zones/login/keys/127.0.0.1");
    assert_eq!(status, 404);
    let welcome = connection.get("/login?password=secret");
    assert_eq!(
        (welcome.status, welcome.text()),
        (200, "welcome\n".to_string())
    );
    let (status, error) = admin("DELETE", "/ratelimit/zones/login/blocked/127.0.0.1");
    assert_eq!(status, 404);
    assert_eq!(
        error["error"],
        "key \"127.0.0.1\" is not blocked in zone \"login\""
    );
    assert_eq!(connection.get("/login?password=guess").status, 401);
    // An override by address applies to the client's requests.
    let put = Request::new("PUT", "/ratelimit/zones/login/overrides/127.0.0.1")
        .json(r#"{"rate": "1r/m", "burst": 0}"#);
    let response = send(nginx.port_n(2), &put);
    assert_eq!(response.status, 201, "{}", response.text());
    let (_, overrides) = admin("GET", "/ratelimit/zones/login/overrides");
    assert_eq!(overrides["127.0.0.1"]["burst"], 0, "{overrides}");
    assert_eq!(connection.get("/login?password=guess").status, 429);
}

#[test]
fn stream_smtp_conf_admits_ten_new_connections_a_second_per_address() {
    use std::io::Read;
    // The config's own stand-in for the mail server greets every connection it gets.
    let nginx = Nginx::start(&example("stream-smtp.conf"));
    let banner = || {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", nginx.port_n(2)))
            .expect("connect to the relay");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("read timeout");
        let mut line = [0u8; 4];
        stream.read_exact(&mut line).is_ok() && &line == b"220 "
    };
    // As fast as one client can: 1 + burst 20 at once, then 10 a second.
    let start = std::time::Instant::now();
    let first: Vec<bool> = (0..40).map(|_| banner()).collect();
    let took = start.elapsed().as_secs_f64();
    let admitted = first.iter().filter(|&&ok| ok).count();
    assert!(first[..21].iter().all(|&ok| ok), "{first:?}");
    let most = 21 + (10.0 * took).ceil() as usize;
    assert!(
        admitted <= most,
        "{admitted} admitted in {took:.2}s (at most {most}): {first:?}"
    );
    assert!(!first[39], "the 40th at once is closed: {first:?}");
    // A second later, ten more (the rate), and no more than the rate allows for the time
    // that really passed (a loaded machine oversleeps).
    let rested = std::time::Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let later = (0..15).filter(|_| banner()).count();
    let most = (10.0 * rested.elapsed().as_secs_f64()).ceil() as usize + 1;
    assert!(
        (10..=most).contains(&later),
        "{later} admitted a second later (at most {most})"
    );
    let zone = get(nginx.port(), "/ratelimit/zones/smtp");
    let zone: serde_json::Value = serde_json::from_slice(&zone.body).expect("JSON");
    assert_eq!(zone["context"], "stream", "{zone}");
    assert_eq!(
        zone["passed"].as_u64(),
        Some((admitted + later) as u64),
        "{zone}"
    );
}

#[test]
fn stream_dns_conf_answers_a_budget_of_queries_per_address() {
    // The config's own stand-in for the resolver answers every query with one datagram.
    let nginx = Nginx::start(&example("stream-dns.conf"));
    let client = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind a client");
    client
        .set_read_timeout(Some(Duration::from_millis(1500)))
        .expect("read timeout");
    // 80 queries from one address and port at once: 1 + burst 40 answered, and 20 a second
    // for the time the sending took.
    let start = std::time::Instant::now();
    for n in 0..80u16 {
        client
            .send_to(&n.to_be_bytes(), ("127.0.0.1", nginx.port_n(2)))
            .expect("send a query");
    }
    let took = start.elapsed().as_secs_f64();
    let mut answered = 0;
    let mut buffer = [0u8; 16];
    while client.recv_from(&mut buffer).is_ok() {
        answered += 1;
    }
    let most = 41 + (20.0 * took).ceil() as usize;
    assert!(
        (41..=most).contains(&answered),
        "{answered} of 80 answered (sent in {took:.3}s, at most {most})"
    );
}

/// nginx-conf/llm.conf: each completion reports 1,000 tokens; a request that sets no
/// `max_tokens` reserves `reserve=auto:1000`'s 1,000 plus its prompt's estimate (27 bytes: 7),
/// so of the 10,000 tokens a minute 9 completions fit (give or take one: see below); the next
/// is refused in OpenAI's words, for tokens. /v1/models reports no usage and costs no token
/// (one request of the 60 a minute).
#[test]
fn llm_conf_counts_tokens_per_key() {
    use common::Request;
    let nginx = Nginx::start(&example("llm.conf"));
    let post = |path: &str, key: &str| {
        common::send(
            nginx.port(),
            &Request::new("POST", path)
                .header("Authorization", key)
                .json(r#"{"model":"m","messages":[]}"#),
        )
    };
    assert_eq!(post("/v1/chat/completions", "").status, 401);
    let models = post("/v1/models", "Bearer team-a");
    assert_eq!(models.status, 200);
    assert_eq!(models.header("x-ratelimit-remaining-tokens"), Some("8993"));
    assert_eq!(models.header("x-ratelimit-remaining-requests"), Some("59"));
    let mut passed = 0;
    let refused = loop {
        let response = post("/v1/chat/completions", "Bearer team-a");
        if response.status != 200 {
            break response;
        }
        passed += 1;
        assert!(passed <= 45, "never refused");
    };
    // 9; one less when the last one's settlement (its log phase, in one of the two workers)
    // had not run yet when the next request came (the client has the whole answer before
    // nginx logs it); one more if 7 tokens came back meanwhile (166 a second).
    assert!((8..=10).contains(&passed), "{passed} passed");
    assert_eq!(refused.status, 429);
    let body: serde_json::Value = serde_json::from_str(&refused.text()).expect("JSON");
    assert_eq!(body["error"]["code"], "rate_limit_exceeded", "{body}");
    assert_eq!(body["error"]["type"], "tokens", "{body}");
    assert!(refused.header("Retry-After").is_some());
    // Another key is untouched.
    let other = post("/v1/chat/completions", "Bearer team-b");
    assert_eq!(other.status, 200);
    assert_eq!(other.header("x-ratelimit-remaining-tokens"), Some("8993"));
    let log = fs::read_to_string(nginx.prefix().join("logs/llm.log")).unwrap();
    assert!(
        log.lines()
            .any(|line| line
                .ends_with("200 prompt=200 completion=800 cached=0 total=1000 cost=1000")),
        "{log}"
    );
}
