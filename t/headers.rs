//! Response headers: `Retry-After` on rejections, and with `rate_limit_headers on` (the
//! default) `RateLimit-Policy: "ZONE";q=Q;w=W` and `RateLimit: "ZONE";r=R;t=T`
//! (draft-ietf-httpapi-ratelimit-headers-10) on every limited response, one item per zone.
//!
//! Values are checked exactly: rates are slow (one request every 1 s, 2 s or 60 s) and
//! requests go back-to-back, so the few milliseconds between them never cross a whole second.
//! `t` and `Retry-After` are whole seconds rounded up: `t=60` right after a request at 1r/m
//! (exactly 60 s of excess), `Retry-After: 60` for a wait of 60 s minus a few milliseconds.

mod common;

use std::thread;
use std::time::Duration;

use common::{Connection, Nginx, Request, Response};

/// nginx with the module; `http` is the rest of the `http` block and `locations` the
/// locations of its one server on `%%PORT%%`, which serves `html/`.
fn start(http: &str, locations: &str) -> Nginx {
    common::config().http(http).locations(locations).start()
}

/// Each location `/NAME/` gets an `index.html`.
fn write_dirs(nginx: &Nginx, names: &[&str]) {
    for name in names {
        nginx.write_file(&format!("html/{name}/index.html"), "ok\n");
    }
}

/// `(status, RateLimit-Policy, RateLimit, Retry-After)` of a response; absent headers are "".
fn summary(response: &Response) -> (u16, String, String, String) {
    let joined = |name: &str| response.header_all(name).join(", ");
    (
        response.status,
        joined("RateLimit-Policy"),
        joined("RateLimit"),
        joined("Retry-After"),
    )
}

fn row(status: u16, policy: &str, state: &str, retry_after: &str) -> (u16, String, String, String) {
    (
        status,
        policy.to_string(),
        state.to_string(),
        retry_after.to_string(),
    )
}

/// Sends GET `path` with `X-Key: key` `count` times on one keep-alive connection.
fn in_a_row(nginx: &Nginx, path: &str, key: &str, count: usize) -> Vec<Response> {
    let mut connection = Connection::open(nginx.port());
    (0..count)
        .map(|_| connection.send(&Request::get(path).header("X-Key", key)))
        .collect()
}

/// The policy states the rate as whole requests per window of seconds.
#[test]
fn policy_states_the_rate_as_a_quota_per_window() {
    let rates = [
        ("ten_per_second", "10r/s", "q=10;w=1"),
        ("half_per_second", "0.5r/s", "q=1;w=2"),
        ("one_and_a_half", "1.5r/s", "q=3;w=2"),
        ("thirty_per_minute", "30r/m", "q=30;w=60"),
        ("hundred_per_hour", "100r/h", "q=100;w=3600"),
        ("two_per_day", "2r/d", "q=2;w=86400"),
    ];
    let mut http = String::new();
    let mut locations = String::new();
    for (name, rate, _) in rates {
        http.push_str(&format!(
            "rate_limit_zone $http_x_key zone={name}:1m rate={rate};\n"
        ));
        locations.push_str(&format!(
            "location /{name}/ {{ rate_limit zone={name}; }}\n"
        ));
    }
    let nginx = start(&http, &locations);
    let names: Vec<&str> = rates.iter().map(|(name, _, _)| *name).collect();
    write_dirs(&nginx, &names);
    for (name, rate, expected) in rates {
        let response = &in_a_row(&nginx, &format!("/{name}/index.html"), "k", 1)[0];
        assert_eq!(response.status, 200, "{rate}: {response:?}");
        assert_eq!(
            response.header("RateLimit-Policy"),
            Some(format!("\"{name}\";{expected}").as_str()),
            "{rate}: {response:?}"
        );
    }
}

/// 30r/m (one request every 2 s) with burst=5 nodelay: each pass leaves one fewer request
/// (`r`) and 2 s more until the key is fresh (`t`); the 7th request is rejected with the
/// state unchanged and `Retry-After: 2`.
#[test]
fn every_response_says_what_is_left_and_when_it_is_full_again() {
    let nginx = start(
        "rate_limit_zone $http_x_key zone=h:1m rate=30r/m burst=5;",
        "location / { rate_limit zone=h nodelay; }",
    );
    let responses = in_a_row(&nginx, "/index.html", "k", 7);
    let got: Vec<_> = responses.iter().map(summary).collect();
    let policy = "\"h\";q=30;w=60";
    let expected = vec![
        row(200, policy, "\"h\";r=5;t=2", ""),
        row(200, policy, "\"h\";r=4;t=4", ""),
        row(200, policy, "\"h\";r=3;t=6", ""),
        row(200, policy, "\"h\";r=2;t=8", ""),
        row(200, policy, "\"h\";r=1;t=10", ""),
        row(200, policy, "\"h\";r=0;t=12", ""),
        row(429, policy, "\"h\";r=0;t=12", "2"),
    ];
    assert_eq!(got, expected);
}

/// A delayed response carries the headers too (2r/s burst=2: the second request waits 0.5 s).
#[test]
fn delayed_responses_carry_the_headers() {
    let nginx = start(
        "rate_limit_zone $http_x_key zone=d:1m rate=2r/s burst=2;",
        "location / { rate_limit zone=d; add_header X-Status $rate_limit_status always; }",
    );
    let responses = in_a_row(&nginx, "/index.html", "k", 2);
    assert_eq!(responses[1].header("X-Status"), Some("DELAYED"));
    assert!(responses[1].elapsed > Duration::from_millis(300));
    let got: Vec<_> = responses.iter().map(summary).collect();
    assert_eq!(
        got,
        [
            row(200, "\"d\";q=2;w=1", "\"d\";r=2;t=1", ""),
            row(200, "\"d\";q=2;w=1", "\"d\";r=1;t=1", ""),
        ]
    );
}

/// Retry-After is the wait until a retry would pass, in whole seconds rounded up.
#[test]
fn retry_after_is_the_wait_until_a_retry_passes() {
    // (zone and location, zone parameters, rate_limit parameters, requests that pass,
    // Retry-After range of the next one)
    let cases = [
        ("minute", "rate=1r/m", "", 1, 59..=60),
        ("minute_burst", "rate=1r/m burst=3", "nodelay", 4, 59..=60),
        ("half_second", "rate=2r/s", "", 1, 1..=1),
        (
            "hour_tokens",
            "rate=1r/h burst=2 algorithm=token_bucket",
            "",
            2,
            3599..=3600,
        ),
        ("second", "rate=1r/s", "", 1, 1..=1),
    ];
    let mut http = String::new();
    let mut locations = String::new();
    for (name, zone, limit, _, _) in &cases {
        http.push_str(&format!(
            "rate_limit_zone $http_x_key zone={name}:1m {zone};\n"
        ));
        locations.push_str(&format!(
            "location /{name}/ {{ rate_limit zone={name} {limit}; }}\n"
        ));
    }
    let nginx = start(&http, &locations);
    let names: Vec<&str> = cases.iter().map(|case| case.0).collect();
    write_dirs(&nginx, &names);

    let mut last_retry_after = 0;
    for (name, zone, _, passes, range) in cases {
        let path = format!("/{name}/index.html");
        let responses = in_a_row(&nginx, &path, "k", passes + 1);
        let rejected = &responses[passes];
        assert!(
            responses[..passes]
                .iter()
                .all(|r| r.status == 200 && r.header("Retry-After").is_none()),
            "{zone}: {responses:?}"
        );
        assert_eq!(rejected.status, 429, "{zone}: {rejected:?}");
        let retry_after: u64 = rejected
            .header("Retry-After")
            .and_then(|value| value.parse().ok())
            .unwrap_or_else(|| panic!("{zone}: no numeric Retry-After: {rejected:?}"));
        assert!(
            range.contains(&retry_after),
            "{zone}: Retry-After {retry_after}, expected {range:?}"
        );
        last_retry_after = retry_after;
    }

    // A retry that waits Retry-After passes (the last case, 1r/s: the key's next slot is 1 s
    // after its first request, which was answered before the rejection).
    thread::sleep(Duration::from_secs(last_retry_after));
    let retry = &in_a_row(&nginx, "/second/index.html", "k", 1)[0];
    assert_eq!(retry.status, 200, "{retry:?}");
}

/// `rate_limit_headers off` drops RateLimit and RateLimit-Policy, not Retry-After; it is
/// inherited, and `on` in a location turns them back on. Unlimited locations have none.
#[test]
fn headers_off_leaves_only_retry_after() {
    let nginx = start(
        "rate_limit_zone $http_x_key zone=one:1m rate=1r/m;\n\
         rate_limit_headers off;",
        "location /off/ { rate_limit zone=one; }\n\
         location /on/ { rate_limit zone=one; rate_limit_headers on; }\n\
         location /unlimited/ { }",
    );
    write_dirs(&nginx, &["off", "on", "unlimited"]);
    let off: Vec<_> = in_a_row(&nginx, "/off/index.html", "a", 2)
        .iter()
        .map(summary)
        .collect();
    assert_eq!(off, [row(200, "", "", ""), row(429, "", "", "60")]);

    let on: Vec<_> = in_a_row(&nginx, "/on/index.html", "b", 2)
        .iter()
        .map(summary)
        .collect();
    assert_eq!(
        on,
        [
            row(200, "\"one\";q=1;w=60", "\"one\";r=0;t=60", ""),
            row(429, "\"one\";q=1;w=60", "\"one\";r=0;t=60", "60"),
        ]
    );

    let unlimited = &in_a_row(&nginx, "/unlimited/index.html", "c", 1)[0];
    assert_eq!(summary(unlimited), row(200, "", "", ""));
}

/// Two `rate_limit` lines give two items, in their order.
#[test]
fn two_zones_give_two_items_in_their_order() {
    let nginx = start(
        "rate_limit_zone $http_x_key zone=a:1m rate=1r/s burst=4;\n\
         rate_limit_zone $http_x_key zone=b:1m rate=1r/m burst=1;",
        "location /ab/ { rate_limit zone=a nodelay; rate_limit zone=b nodelay; }\n\
         location /ba/ { rate_limit zone=b nodelay; rate_limit zone=a nodelay; }",
    );
    write_dirs(&nginx, &["ab", "ba"]);
    let ab: Vec<_> = in_a_row(&nginx, "/ab/index.html", "k", 3)
        .iter()
        .map(summary)
        .collect();
    let policy = "\"a\";q=1;w=1, \"b\";q=1;w=60";
    assert_eq!(
        ab[..2],
        [
            row(200, policy, "\"a\";r=4;t=1, \"b\";r=1;t=60", ""),
            row(200, policy, "\"a\";r=3;t=2, \"b\";r=0;t=120", ""),
        ]
    );
    // Rejected by `b`: its item says so, Retry-After is b's.
    let (status, rejected_policy, state, retry_after) = &ab[2];
    assert_eq!(
        (*status, rejected_policy.as_str(), retry_after.as_str()),
        (429, policy, "60")
    );
    assert!(state.ends_with(", \"b\";r=0;t=120"), "{state}");

    let ba: Vec<_> = in_a_row(&nginx, "/ba/index.html", "other", 1)
        .iter()
        .map(summary)
        .collect();
    assert_eq!(
        ba,
        [row(
            200,
            "\"b\";q=1;w=60, \"a\";q=1;w=1",
            "\"b\";r=1;t=60, \"a\";r=4;t=1",
            ""
        )]
    );
}

/// A request rejected by one zone is charged to none, so the other zones' items show their
/// state unchanged, whichever line comes first.
#[test]
fn a_rejection_by_one_zone_shows_the_others_unchanged() {
    let nginx = start(
        "rate_limit_zone $http_x_key zone=a:1m rate=1r/s burst=4;\n\
         rate_limit_zone $http_x_key zone=b:1m rate=1r/m burst=1;",
        "location /ab/ { rate_limit zone=a nodelay; rate_limit zone=b nodelay; }\n\
         location /ba/ { rate_limit zone=b nodelay; rate_limit zone=a nodelay; }",
    );
    write_dirs(&nginx, &["ab", "ba"]);
    let ab: Vec<_> = in_a_row(&nginx, "/ab/index.html", "k", 3)
        .iter()
        .map(summary)
        .collect();
    let ba: Vec<_> = in_a_row(&nginx, "/ba/index.html", "other", 3)
        .iter()
        .map(summary)
        .collect();
    // After two passes `a` has 3 requests left and is fresh in 2 s; the rejection keeps it so.
    assert_eq!(
        (&ab[2], &ba[2]),
        (
            &row(
                429,
                "\"a\";q=1;w=1, \"b\";q=1;w=60",
                "\"a\";r=3;t=2, \"b\";r=0;t=120",
                "60"
            ),
            &row(
                429,
                "\"b\";q=1;w=60, \"a\";q=1;w=1",
                "\"b\";r=0;t=120, \"a\";r=3;t=2",
                "60"
            ),
        )
    );
}

/// `global=pool` adds the pool's item after the user's. User buckets of 2 tokens, a pool of
/// 5, 1r/m: `t` grows by 60 s per token taken from a bucket.
#[test]
fn global_gives_the_user_item_and_the_pool_item() {
    let nginx = start(
        "rate_limit_zone $http_x_key zone=user:1m rate=1r/m burst=2 algorithm=token_bucket;\n\
         rate_limit_zone global zone=pool:64k rate=1r/m burst=5 algorithm=token_bucket;",
        "location / { rate_limit zone=user global=pool; }",
    );
    let got: Vec<_> = in_a_row(&nginx, "/index.html", "k", 6)
        .iter()
        .map(summary)
        .collect();
    let policy = "\"user\";q=1;w=60, \"pool\";q=1;w=60";
    assert_eq!(
        got,
        [
            row(200, policy, "\"user\";r=1;t=60, \"pool\";r=4;t=60", ""),
            row(200, policy, "\"user\";r=0;t=120, \"pool\";r=3;t=120", ""),
            // The user's bucket is empty: the pool alone lets these through.
            row(200, policy, "\"user\";r=0;t=120, \"pool\";r=2;t=180", ""),
            row(200, policy, "\"user\";r=0;t=120, \"pool\";r=1;t=240", ""),
            row(200, policy, "\"user\";r=0;t=120, \"pool\";r=0;t=300", ""),
            // Both empty: the user's next token comes first, in 60 s.
            row(429, policy, "\"user\";r=0;t=120, \"pool\";r=0;t=300", "60"),
        ]
    );
}

/// `headers=off` keeps a line out of `RateLimit-Policy`, `RateLimit` and `Retry-After`: with
/// an abuse limit hidden beside a quota, clients see the quota's fields alone, and a
/// rejection by the hidden line carries no `Retry-After`, while one by the quota does. A
/// location whose only line is hidden (the quick path's shape) sends none of the three.
#[test]
fn a_line_with_headers_off_stays_out_of_the_fields() {
    let nginx = start(
        "rate_limit_zone $http_x_key zone=abuse:1m rate=1r/m burst=1;\n\
         rate_limit_zone $http_x_key zone=quota:1m rate=1r/m burst=5;",
        "location /both/ { rate_limit zone=abuse nodelay headers=off;\n\
                           rate_limit zone=quota nodelay; }\n\
         location /quota/ { rate_limit zone=quota nodelay headers=on;\n\
                            rate_limit zone=abuse burst=9 nodelay headers=off; }\n\
         location /hidden/ { rate_limit zone=abuse nodelay headers=off; }",
    );
    write_dirs(&nginx, &["both", "quota", "hidden"]);
    let policy = "\"quota\";q=1;w=60";
    let both: Vec<_> = in_a_row(&nginx, "/both/index.html", "a", 3)
        .iter()
        .map(summary)
        .collect();
    assert_eq!(
        both,
        [
            row(200, policy, "\"quota\";r=5;t=60", ""),
            row(200, policy, "\"quota\";r=4;t=120", ""),
            // Rejected by the hidden line: the quota's item, unchanged, and no Retry-After.
            row(429, policy, "\"quota\";r=4;t=120", ""),
        ]
    );

    // The quota rejects (the hidden line has room): its Retry-After is sent.
    let quota: Vec<_> = in_a_row(&nginx, "/quota/index.html", "b", 7)
        .iter()
        .map(summary)
        .collect();
    assert_eq!(quota[5], row(200, policy, "\"quota\";r=0;t=360", ""));
    assert_eq!(quota[6], row(429, policy, "\"quota\";r=0;t=360", "60"));

    let hidden: Vec<_> = in_a_row(&nginx, "/hidden/index.html", "c", 3)
        .iter()
        .map(summary)
        .collect();
    assert_eq!(
        hidden,
        [
            row(200, "", "", ""),
            row(200, "", "", ""),
            row(429, "", "", "")
        ]
    );
}
