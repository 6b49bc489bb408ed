//! The ends of the accepted ranges against real nginx: every limit `nginx -t`, the admin API
//! and the state file accept is enforced exactly, what a bucket cannot hold is refused with
//! the largest value allowed, and a limit no wait can satisfy answers without a `Retry-After`.
//!
//! Rates are `0.001r/d` (one request every 1000 days) or a bucket of five at `1r/s` with waits
//! of seconds: nothing refills while a test runs.

mod common;

use common::{config, send, Connection, Nginx, Request, Response};
use serde_json::Value;

/// One worker, `HTTP` in the `http` block, `LOCATIONS` and a writable admin API in its server.
fn start(http: &str, locations: &str) -> Nginx {
    config()
        .http(http)
        .locations(locations)
        .locations("location /ratelimit/ { rate_limit_admin write=on; }")
        .start()
}

/// One interval at `0.001r/d`, in seconds: 1000 days.
const THOUSAND_DAYS: u64 = 86_400_000;

/// `(status, JSON body)` of an admin request.
fn admin(nginx: &Nginx, method: &str, path: &str, body: &str) -> (u16, Value) {
    let request = Request::new(method, &format!("/ratelimit/{path}")).json(body);
    let response = send(nginx.port(), &request);
    let json = serde_json::from_slice(&response.body).unwrap_or(Value::Null);
    (response.status, json)
}

/// The `t=` of the `RateLimit` header: seconds until the key is fresh again.
fn reset_seconds(response: &Response) -> u64 {
    let header = response.header("RateLimit").unwrap_or_default();
    header
        .split(';')
        .find_map(|part| part.strip_prefix("t="))
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no t= in {response:?}"))
}

/// 400 requests for one key at one instant (on one connection): how many passed, and every
/// response.
fn four_hundred(nginx: &Nginx, path: &str) -> (usize, Vec<Response>) {
    let mut connection = Connection::open(nginx.port());
    let responses: Vec<Response> = (0..400).map(|_| connection.get(path)).collect();
    let passed = responses.iter().filter(|r| r.status == 200).count();
    (passed, responses)
}

/// The issue's case at the largest burst the slowest rate takes: exactly the bucket passes
/// (36 of 400), `t=` grows by 1000 days a request up to 36,000 days and stays there, and a
/// rejection waits one interval. Before, `burst=300` was accepted and from about request 214
/// everything passed with `t=18446744074`.
#[test]
fn the_slowest_rate_with_the_largest_burst_passes_exactly_the_bucket() {
    let nginx = start(
        "rate_limit_zone $arg_k zone=leaky:1m rate=0.001r/d burst=35;\n\
         rate_limit_zone $arg_k zone=token:1m rate=0.001r/d burst=36 algorithm=token_bucket;",
        "location /leaky { rate_limit zone=leaky nodelay; empty_gif; }\n\
         location /token { rate_limit zone=token; empty_gif; }",
    );
    for zone in ["leaky", "token"] {
        let (passed, responses) = four_hundred(&nginx, &format!("/{zone}?k=one"));
        assert_eq!(passed, 36, "{zone}");
        assert!(responses[..36].iter().all(|r| r.status == 200), "{zone}");
        for (i, response) in responses.iter().enumerate() {
            let requests_ahead = (i as u64 + 1).min(36);
            assert_eq!(
                reset_seconds(response),
                requests_ahead * THOUSAND_DAYS,
                "{zone} request {i}: {response:?}"
            );
        }
        let rejected = &responses[399];
        assert_eq!(rejected.status, 429, "{zone}");
        assert_eq!(
            rejected.header("Retry-After"),
            Some(THOUSAND_DAYS.to_string().as_str()),
            "{zone}"
        );
    }
}

/// The issue's count where `burst=300` is accepted (`1r/d`: a day per request): 301 of 400
/// pass a leaky bucket, 300 a token bucket, and `t=` stays the bucket's span.
#[test]
fn a_burst_of_300_passes_301_and_300_of_400() {
    let nginx = start(
        "rate_limit_zone $arg_k zone=leaky:1m rate=1r/d burst=300;\n\
         rate_limit_zone $arg_k zone=token:1m rate=1r/d burst=300 algorithm=token_bucket;",
        "location /leaky { rate_limit zone=leaky nodelay; empty_gif; }\n\
         location /token { rate_limit zone=token; empty_gif; }",
    );
    for (zone, bucket) in [("leaky", 301), ("token", 300)] {
        let (passed, responses) = four_hundred(&nginx, &format!("/{zone}?k=one"));
        assert_eq!(passed, bucket, "{zone}");
        let full = bucket as u64 * 86_400;
        assert!(
            responses.iter().all(|r| reset_seconds(r) <= full),
            "{zone}: t= beyond {full} s"
        );
        assert_eq!(reset_seconds(&responses[399]), full, "{zone}");
    }
}

/// `PATCH` refuses a bucket that would take more than 100 years, naming the largest burst,
/// and changes nothing; the largest it allows is then enforced exactly.
#[test]
fn patch_refuses_a_bucket_too_large_for_its_rate() {
    let nginx = start(
        "rate_limit_zone $arg_k zone=leaky:1m rate=1r/s burst=5;",
        "location /leaky { rate_limit zone=leaky nodelay; empty_gif; }",
    );
    let (status, error) = admin(
        &nginx,
        "PATCH",
        "zones/leaky",
        r#"{"rate": "0.001r/d", "burst": 4194303}"#,
    );
    assert_eq!(status, 400, "{error}");
    assert_eq!(
        error["error"],
        "burst 4194303 is too large for rate \"0.001r/d\" (at most 35: a leaky_bucket must \
         drain within 100 years)"
    );
    let (_, zone) = admin(&nginx, "GET", "zones/leaky", "");
    assert_eq!((&zone["rate"], &zone["burst"]), (&"1r/s".into(), &5.into()));

    // The rate alone is fine with burst 5; a burst past 35 then is not.
    let (status, _) = admin(&nginx, "PATCH", "zones/leaky", r#"{"rate": "0.001r/d"}"#);
    assert_eq!(status, 200);
    let (status, error) = admin(&nginx, "PATCH", "zones/leaky", r#"{"burst": 300}"#);
    assert_eq!(status, 400, "{error}");
    assert!(
        error["error"]
            .as_str()
            .unwrap()
            .starts_with("burst 300 is too large for rate \"0.001r/d\" (at most 35"),
        "{error}"
    );
    let (status, _) = admin(&nginx, "PATCH", "zones/leaky", r#"{"burst": 35}"#);
    assert_eq!(status, 200);
    let (passed, _) = four_hundred(&nginx, "/leaky?k=patched");
    assert_eq!(passed, 36);
}

/// A `rate_limit` line's own `burst=` must fit a new rate too: the `PATCH` that would make
/// it a bucket of more than 100 years is refused and names that line's burst.
#[test]
fn patch_refuses_a_rate_too_slow_for_a_line_burst() {
    let nginx = start(
        "rate_limit_zone $arg_k zone=leaky:1m rate=1r/s;",
        "location /leaky { rate_limit zone=leaky burst=300 nodelay; empty_gif; }",
    );
    let (status, error) = admin(&nginx, "PATCH", "zones/leaky", r#"{"rate": "0.001r/d"}"#);
    assert_eq!(status, 400, "{error}");
    assert_eq!(
        error["error"],
        "burst 300 is too large for rate \"0.001r/d\" (at most 35: a leaky_bucket must drain \
         within 100 years): the burst= of a rate_limit line using zone \"leaky\""
    );
    let (status, _) = admin(&nginx, "PATCH", "zones/leaky", r#"{"rate": "1r/d"}"#);
    assert_eq!(status, 200);
    let (passed, _) = four_hundred(&nginx, "/leaky?k=line");
    assert_eq!(passed, 301);
}

/// A state file edited by hand beyond the largest bucket is not restored: the runtime limits
/// and the override are dropped, and the log says why with the largest burst.
#[test]
fn a_state_file_with_a_bucket_too_large_is_not_restored() {
    let dir = std::env::temp_dir().join(format!("limits-range-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("state.json");
    let saved = serde_json::json!({
        "version": 1,
        "zones": {"leaky": {
            "algorithm": "leaky_bucket",
            "config": {"rate": "1r/s", "burst": 5},
            "limits": {"rate": "0.001r/d", "burst": 300},
            "overrides": {"vip": {"rate": "0.001r/d", "burst": 4194303}}
        }}
    });
    std::fs::write(&path, saved.to_string()).unwrap();
    let nginx = start(
        &format!(
            "rate_limit_state_file {};
\
             rate_limit_zone $arg_k zone=leaky:1m rate=1r/s burst=5;",
            path.display()
        ),
        "location /leaky { rate_limit zone=leaky nodelay; empty_gif; }",
    );
    let (_, zone) = admin(&nginx, "GET", "zones/leaky", "");
    assert_eq!((&zone["rate"], &zone["burst"]), (&"1r/s".into(), &5.into()));
    let (status, _) = admin(&nginx, "GET", "zones/leaky/overrides/vip", "");
    assert_eq!(status, 404);
    let log = nginx.error_log();
    for dropped in [
        "runtime limits (rate 0.001r/d burst 300) dropped: burst 300 is too large for rate \
         \"0.001r/d\" (at most 35: a leaky_bucket must drain within 100 years)",
        "override for key \"vip\" dropped: burst 4194303 is too large for rate \"0.001r/d\" \
         (at most 35: a leaky_bucket must drain within 100 years)",
    ] {
        assert!(log.contains(dropped), "{dropped}\n{log}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A cost no bucket of the zone can hold is rejected with the status alone: no wait would let
/// it through, so no `Retry-After` (it said 18446744074 for this one), and the log says why.
#[test]
fn a_cost_that_can_never_pass_gets_no_retry_after() {
    let nginx = start(
        "rate_limit_zone $arg_k zone=leaky:1m rate=1r/s burst=4;",
        "location /huge { rate_limit zone=leaky cost=18446744073709551615 nodelay; empty_gif; }\n\
         location /five { rate_limit zone=leaky cost=5 nodelay; empty_gif; }\n\
         location /six { rate_limit zone=leaky cost=6 nodelay; empty_gif; }",
    );
    let mut connection = Connection::open(nginx.port());
    for path in ["/huge?k=a", "/six?k=a"] {
        let response = connection.get(path);
        assert_eq!(
            (response.status, response.header("Retry-After")),
            (429, None),
            "{path}: {response:?}"
        );
        // RateLimit still tells where the key stands: untouched, fresh.
        assert_eq!(reset_seconds(&response), 0, "{path}: {response:?}");
    }
    // Five is the whole bucket: it passes, and the next one waits five seconds.
    assert_eq!(connection.get("/five?k=a").status, 200);
    let again = connection.get("/five?k=a");
    assert_eq!(
        (again.status, again.header("Retry-After")),
        (429, Some("5")),
        "{again:?}"
    );
    let log = nginx.error_log();
    for line in [
        "by zone \"leaky\"; cost 18446744073709551615 can never pass (at most 5 at once)",
        "by zone \"leaky\"; cost 6 can never pass (at most 5 at once)",
    ] {
        assert!(log.contains(line), "{line}\n{log}");
    }
}
