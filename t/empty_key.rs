//! Limits that can never apply, which `nginx -t` reports at its warning level:
//! - a zone keyed by `$server_name` limits nothing in a server without `server_name` (the key
//!   is empty there, and an empty key is not limited): the warning names the server and the
//!   `rate_limit` line; the concurrency example keyed by a constant limits wherever it is pasted;
//! - a `rate_limit` line in a location (or server) that answers every request with `return`,
//!   which runs before the preaccess phase where limits apply (issue 42).
//!
//! They load the rate limit module: `cargo build` must have built it.

mod common;

use common::upstream::Upstream;
use common::{check_config, config, start_request, Request};
use std::time::Duration;

/// The concurrency example as the README gave it before: keyed by `$server_name`.
const SERVER_NAME_ZONE: &str =
    "rate_limit_zone $server_name zone=app:1m algorithm=concurrency limit=2;";

/// The 1-based line of the first line of `text` that contains `needle`.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|line| line.contains(needle))
        .unwrap_or_else(|| panic!("no \"{needle}\" in {text}"))
        + 1
}

/// The `[warn]` lines of an `nginx -t` that must succeed, about empty keys.
fn warnings(config: &str) -> Vec<String> {
    warnings_about(config, "keyed by")
}

/// The `[warn]` lines that contain `needle` of an `nginx -t` that must succeed.
fn warnings_about(config: &str, needle: &str) -> Vec<String> {
    let (ok, output) = check_config(config);
    assert!(ok, "{output}");
    output
        .lines()
        .filter(|line| line.contains("[warn]") && line.contains(needle))
        .map(str::to_string)
        .collect()
}

#[test]
fn nginx_t_warns_where_server_name_is_empty() {
    let text = config()
        .http(SERVER_NAME_ZONE)
        .locations("location /api/ { rate_limit zone=app; empty_gif; }")
        .build();
    let warned = warnings(&text);
    assert_eq!(warned.len(), 1, "{warned:?}");
    let server_line = line_of(&text, "server {");
    let limit_line = line_of(&text, "rate_limit zone=app");
    let warning = &warned[0];
    println!("{warning}");
    assert!(
        warning.contains("zone \"app\" is keyed by $server_name, which is empty in the server at ")
            && warning.contains(&format!("nginx.conf:{server_line} (it has no server_name)")),
        "{warning}"
    );
    assert!(
        warning.contains("a constant such as \"app\"")
            && warning.ends_with(&format!("nginx.conf:{limit_line}")),
        "{warning}"
    );

    // `server_name ""` is no name either; a line at http level reaches the server too.
    let text = config()
        .http(SERVER_NAME_ZONE)
        .http("rate_limit zone=app;")
        .server("server_name \"\";")
        .locations("location /api/ { empty_gif; }")
        .build();
    let warned = warnings(&text);
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(
        warned[0].ends_with(&format!(
            "nginx.conf:{}",
            line_of(&text, "rate_limit zone=app")
        )),
        "{warned:?}"
    );
}

#[test]
fn nginx_t_is_quiet_where_the_key_has_a_value() {
    // A server with a name, written after the location that uses the zone.
    let named = config()
        .http(SERVER_NAME_ZONE)
        .locations("location /api/ { rate_limit zone=app; empty_gif; }")
        .locations("server_name api.example.com;")
        .build();
    assert_eq!(warnings(&named), Vec::<String>::new());
    // A zone nobody uses in the nameless server, and keys that are never empty.
    let unused = config()
        .http(SERVER_NAME_ZONE)
        .http("rate_limit_zone app zone=constant:1m algorithm=concurrency limit=2;")
        .http("rate_limit_zone $host zone=host:1m rate=1r/s;")
        .locations("location /api/ { rate_limit zone=constant; rate_limit zone=host; empty_gif; }")
        .build();
    assert_eq!(warnings(&unused), Vec::<String>::new());
}

/// The concurrency example keyed by a constant, pasted into a server without `server_name`:
/// two requests hold the two slots, the third is rejected.
#[test]
fn constant_key_limits_in_a_server_without_a_name() {
    let upstream = Upstream::start();
    let nginx = config()
        .http("rate_limit_zone app zone=app:1m algorithm=concurrency limit=2;")
        .locations(&format!(
            "location /api/ {{ rate_limit zone=app; proxy_pass http://127.0.0.1:{}/; }}",
            upstream.port()
        ))
        .start();
    let held: Vec<_> = ["a", "b"]
        .iter()
        .map(|name| start_request(nginx.port(), &Request::get(&format!("/api/hold/{name}"))))
        .collect();
    upstream.wait_arrivals(2, Duration::from_secs(10));
    let third = common::send(nginx.port(), &Request::get("/api/hold/c"));
    assert_eq!(third.status, 429, "{}", third.text());
    upstream.release_all();
    for request in held {
        assert_eq!(request.finish().status, 200);
    }
}

/// The `[warn]` lines of an `nginx -t` that must succeed, about limits `return` keeps from
/// running.
fn unreached_warnings(config: &str) -> Vec<String> {
    warnings_about(config, "limits nothing")
}

#[test]
fn nginx_t_warns_about_a_limit_that_return_answers_before() {
    let zone = "rate_limit_zone $binary_remote_addr zone=ip:1m rate=1r/s;";
    // The README's mistake: a limited location answered by `return`.
    let text = config()
        .http(zone)
        .locations("location /api/ { rate_limit zone=ip; return 200 \"ok\\n\"; }")
        .build();
    let warned = unreached_warnings(&text);
    assert_eq!(warned.len(), 1, "{warned:?}");
    let limit_line = line_of(&text, "rate_limit zone=ip");
    assert!(
        warned[0].contains("rate_limit in ")
            && warned[0].contains(&format!("nginx.conf:{limit_line} limits nothing"))
            && warned[0].contains("its location answers every request with \"return\""),
        "{warned:?}"
    );
    // nginx still starts (a warning, not an error), and indeed limits nothing there.
    let nginx = config()
        .http(zone)
        .locations("location /api/ { rate_limit zone=ip; return 200 \"ok\\n\"; }")
        .start();
    for _ in 0..5 {
        assert_eq!(common::get(nginx.port(), "/api/").status, 200);
    }
    drop(nginx);

    // A `return` at server level answers before any location is even chosen.
    let text = config()
        .http(zone)
        .server("return 301 https://example.com$request_uri;")
        .locations("location /api/ { rate_limit zone=ip; empty_gif; }")
        .build();
    let warned = unreached_warnings(&text);
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(
        warned[0].contains("its server answers every request with \"return\""),
        "{warned:?}"
    );
}

#[test]
fn nginx_t_is_quiet_where_return_may_not_answer() {
    let zone = "rate_limit_zone $binary_remote_addr zone=ip:1m rate=1r/s;";
    // A conditional return, a content handler, and a limit-free location that returns.
    let text = config()
        .http(zone)
        .locations(
            "location /api/ { rate_limit zone=ip; if ($arg_deny) { return 403; } empty_gif; }
             location /plain/ { rate_limit zone=ip; empty_gif; }
             location /health { return 200 \"ok\\n\"; }",
        )
        .build();
    assert_eq!(unreached_warnings(&text), Vec::<String>::new());
}
