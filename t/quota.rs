//! Quota zones (`algorithm=quota limit=N period=hour|day|week|month tz=ZONE`) against a real
//! nginx: a month's quota admits its limit and refuses with `Retry-After` up to the 1st of the
//! next month in the zone's time zone (computed here with GNU `date` and the system's tzdata,
//! not with the module's code), an override raises one key's limit mid-period keeping its
//! count, and the count survives a stop and a start through the state file.
//!
//! No test waits for a period to end: the period arithmetic is table-tested in
//! `crates/ratelimit-core/src/period.rs`.

mod common;

use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use common::{check_config, send, Connection, Nginx, Request, Response};
use serde_json::Value;

/// Unix seconds now.
fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Unix seconds of the 1st of next month 00:00 in `tz`, by GNU `date`.
fn next_month_in(tz: &str) -> i64 {
    let run = |args: &[&str]| {
        let output = Command::new("date")
            .env("TZ", tz)
            .args(args)
            .output()
            .expect("date");
        assert!(output.status.success(), "{output:?}");
        String::from_utf8(output.stdout).unwrap().trim().to_string()
    };
    let first = run(&["+%Y-%m-01"]);
    run(&["-d", &format!("{first} + 1 month"), "+%s"])
        .parse()
        .unwrap()
}

fn hit(connection: &mut Connection, key: &str) -> Response {
    connection.send(&Request::get("/").header("X-Key", key))
}

fn statuses(nginx: &Nginx, key: &str, count: usize) -> Vec<u16> {
    let mut connection = Connection::open(nginx.port());
    (0..count)
        .map(|_| hit(&mut connection, key).status)
        .collect()
}

fn admin(nginx: &Nginx, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
    let mut request = Request::new(method, &format!("/ratelimit/{path}"));
    if let Some(body) = body {
        request = request.json(body);
    }
    let response = send(nginx.port(), &request);
    let value = if response.body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&response.body).unwrap()
    };
    (response.status, value)
}

const TZ: &str = "America/New_York";

/// Two workers, a month's quota of 5 per `X-Key` in New York, the admin API, and the state
/// file at `state` (outside the prefix, so that it outlives one nginx).
fn config(state: &std::path::Path, period: &str) -> String {
    common::config()
        .workers(2)
        .reuseport()
        .error_log("notice")
        .main("user root;")
        .http(&format!(
            "rate_limit_zone $http_x_key zone=monthly:1m algorithm=quota limit=5 period={period} \
             tz={TZ};\n\
             rate_limit_state_file {};",
            state.display()
        ))
        .locations("location / { rate_limit zone=monthly; }")
        .locations("location /ratelimit/ { rate_limit_admin write=on; }")
        .build()
}

#[test]
fn a_month_admits_its_limit_an_override_raises_it_and_a_restart_keeps_the_count() {
    let dir = std::env::temp_dir().join(format!("ngx-rate-limit-quota-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let state = dir.join("state.json");
    let nginx = Nginx::start(&config(&state, "month"));
    nginx.write_file("html/index.html", "ok\n");

    // 7 requests admit 5.
    let mut connection = Connection::open(nginx.port());
    let responses: Vec<Response> = (0..7).map(|_| hit(&mut connection, "acme")).collect();
    let codes: Vec<u16> = responses.iter().map(|r| r.status).collect();
    assert_eq!(codes, [200, 200, 200, 200, 200, 429, 429]);

    // Retry-After: up to the 1st of next month 00:00 in New York (±5 s).
    let refused = &responses[6];
    let retry_after: i64 = refused.header("Retry-After").unwrap().parse().unwrap();
    let expected = next_month_in(TZ) - unix_now();
    assert!(
        (retry_after - expected).abs() <= 5,
        "Retry-After {retry_after}, expected {expected}"
    );
    // The RateLimit fields: the limit over the month's length, nothing left, the same reset.
    let policy = refused.header("RateLimit-Policy").unwrap();
    assert!(policy.starts_with("\"monthly\";q=5;w="), "{policy}");
    let window: i64 = policy.rsplit('=').next().unwrap().parse().unwrap();
    assert!(
        [28, 29, 30, 31]
            .iter()
            .any(|days| (window - days * 86_400).abs() <= 3600),
        "{policy}"
    );
    let rate_limit = refused.header("RateLimit").unwrap();
    assert_eq!(
        rate_limit,
        format!("\"monthly\";r=0;t={retry_after}"),
        "{rate_limit}"
    );
    // Another key has its own count.
    assert_eq!(statuses(&nginx, "globex", 1), [200]);

    // The admin API: used, limit and the period.
    let (status, key) = admin(&nginx, "GET", "zones/monthly/keys/acme", None);
    assert_eq!(status, 200, "{key}");
    assert_eq!(
        (key["limit"].as_u64(), key["used"].as_u64()),
        (Some(5), Some(5))
    );
    assert_eq!(key["would_pass"], false);
    let end = key["period_end"].as_f64().unwrap() as i64;
    assert_eq!(end, next_month_in(TZ));
    assert!(key["period_start"].as_f64().unwrap() as i64 <= unix_now());

    // Raised to 7 mid-period: its count is kept, 2 more pass, the next is refused.
    let (status, body) = admin(
        &nginx,
        "PUT",
        "zones/monthly/overrides/acme",
        Some(r#"{"limit": 7}"#),
    );
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["limit"], 7);
    assert_eq!(statuses(&nginx, "acme", 3), [200, 200, 429]);
    let (_, key) = admin(&nginx, "GET", "zones/monthly/keys/acme", None);
    assert_eq!(
        (key["limit"].as_u64(), key["used"].as_u64()),
        (Some(7), Some(7))
    );
    // The metrics: the zone's limit, no rate nor burst.
    let metrics = send(nginx.port(), &Request::get("/ratelimit/metrics")).text();
    assert!(
        metrics.contains("rate_limit_quota_limit{zone=\"monthly\"} 5\n"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("rate_limit_burst{zone=\"monthly\"}"),
        "{metrics}"
    );
    // A quota zone takes a limit, not a rate.
    let (status, body) = admin(
        &nginx,
        "PUT",
        "zones/monthly/overrides/acme",
        Some(r#"{"rate": "1r/s"}"#),
    );
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        body["error"],
        "zone \"monthly\" is a quota zone: it takes \"limit\", not \"rate\""
    );

    // Stopped and started again: still refused, the other key's count kept too.
    let log = nginx.stop();
    assert!(
        !log.contains("[alert]") && !log.contains("[emerg]"),
        "{log}"
    );
    let nginx = Nginx::start(&config(&state, "month"));
    nginx.write_file("html/index.html", "ok\n");
    assert_eq!(statuses(&nginx, "acme", 1), [429]);
    let (_, key) = admin(&nginx, "GET", "zones/monthly/keys/acme", None);
    assert_eq!(
        (key["limit"].as_u64(), key["used"].as_u64()),
        (Some(7), Some(7))
    );
    assert_eq!(statuses(&nginx, "globex", 5), [200, 200, 200, 200, 429]);
    // Another calendar: the counts start afresh (the override stays).
    nginx.stop();
    let nginx = Nginx::start(&config(&state, "week"));
    nginx.write_file("html/index.html", "ok\n");
    assert_eq!(statuses(&nginx, "acme", 1), [200]);
    assert!(
        nginx
            .error_log()
            .contains("counted per month in America/New_York and now per week"),
        "{}",
        nginx.error_log()
    );
    drop(nginx);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Worker 0 writes the counts every 10 seconds: after that, a crash of every nginx process
/// (SIGKILL, no exit hook runs) loses nothing that was counted before the write.
#[test]
fn a_crash_keeps_the_counts_of_the_last_periodic_write() {
    let dir =
        std::env::temp_dir().join(format!("ngx-rate-limit-quota-crash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let state = dir.join("state.json");
    let nginx = Nginx::start(&config(&state, "month"));
    nginx.write_file("html/index.html", "ok\n");
    assert_eq!(statuses(&nginx, "initech", 3), [200, 200, 200]);
    // The periodic write: the file names one key's count (polled for up to 15 s).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let counted = || {
        let text = std::fs::read_to_string(&state).unwrap_or_default();
        let value = common::state_file::parse(&text);
        value["zones"]["monthly"]["quota"]["counts"]
            .as_object()
            .is_some_and(|counts| counts.len() == 1)
    };
    while !counted() {
        assert!(
            std::time::Instant::now() < deadline,
            "no periodic write within 15 s:\n{}",
            std::fs::read_to_string(&state).unwrap_or_default()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // The master first, so that it cannot fork a new worker between the kills.
    let mut pids = vec![nginx.master_pid()];
    pids.extend(nginx.worker_pids());
    for pid in pids {
        common::nginx::sys::signal(pid as i32, common::nginx::sys::SIGKILL);
    }
    drop(nginx);
    let nginx = Nginx::start(&config(&state, "month"));
    nginx.write_file("html/index.html", "ok\n");
    assert_eq!(statuses(&nginx, "initech", 3), [200, 200, 429]);
    drop(nginx);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `usage=openai` on a quota zone: tokens a month. A request reserves 1 token at the door and
/// is settled from the usage the (stand-in) upstream reports, into debt past the limit: with
/// 10,000 tokens a month and 1,000 + 2,000 tokens a request, 4 requests are served (the fourth
/// fits at the door with 9,000 used), the fifth is refused until the 1st.
#[test]
fn usage_counts_tokens_a_month() {
    let llm = common::llm::FakeLlm::start();
    let nginx = common::config()
        .http(&format!(
            "rate_limit_zone $http_x_key zone=tokens:1m algorithm=quota limit=10000 \
             period=month tz={TZ};\n\
             upstream llm {{ server 127.0.0.1:{}; }}",
            llm.port()
        ))
        .locations(
            "location /v1/ { rate_limit zone=tokens usage=openai reserve=1; \
             proxy_pass http://llm; }",
        )
        .locations("location /ratelimit/ { rate_limit_admin; }")
        .start();
    let mut connection = Connection::open(nginx.port());
    let path = "/v1/chat/completions?prompt=1000&completion=2000";
    let codes: Vec<u16> = (0..6)
        .map(|_| {
            connection
                .send(&Request::get(path).header("X-Key", "team"))
                .status
        })
        .collect();
    assert_eq!(codes, [200, 200, 200, 200, 429, 429]);
    let refused = connection.send(&Request::get(path).header("X-Key", "team"));
    let retry_after: i64 = refused.header("Retry-After").unwrap().parse().unwrap();
    assert!((retry_after - (next_month_in(TZ) - unix_now())).abs() <= 5);
    assert_eq!(llm.requests(), 4);
    // The fourth request's overrun went into debt: 12,000 used of 10,000.
    let (_, key) = admin(&nginx, "GET", "zones/tokens/keys/team", None);
    assert_eq!(
        (key["limit"].as_u64(), key["used"].as_u64()),
        (Some(10_000), Some(12_000))
    );
}

#[test]
fn nginx_t_takes_quotas_up_to_2_53_and_names_what_is_wrong() {
    let zone = |words: &str| {
        common::config()
            .http(&format!("rate_limit_zone $http_x_key zone=q:1m {words};"))
            .locations("location / { rate_limit zone=q; }")
            .build()
    };
    for words in [
        "algorithm=quota limit=3000000000 period=day tz=Europe/Berlin",
        "algorithm=quota limit=9007199254740992 period=week",
        "algorithm=quota limit=1 period=hour tz=+05:30",
    ] {
        let (ok, output) = check_config(&zone(words));
        assert!(ok, "{words}: {output}");
    }
    let rows = [
        (
            "algorithm=quota limit=5 period=fortnight",
            "invalid period \"period=fortnight\": it must be hour, day, week or month",
        ),
        (
            "algorithm=quota limit=5 period=day tz=Europe/Berln",
            "unknown time zone \"tz=Europe/Berln\": give an IANA name",
        ),
        (
            "algorithm=quota limit=9007199254740993 period=day",
            "invalid limit value \"limit=9007199254740993\": it must be an integer from 1 to \
             9007199254740992",
        ),
        (
            "algorithm=quota period=day",
            "must have \"limit\" parameter",
        ),
        (
            "algorithm=quota limit=5 period=day rate=1r/s",
            "\"rate\" and \"burst\" are not used by quota zones",
        ),
        (
            "rate=1r/s period=day",
            "\"period\" is used by quota zones only (algorithm=quota)",
        ),
    ];
    for (words, message) in rows {
        let (ok, output) = check_config(&zone(words));
        assert!(!ok, "{words} was accepted");
        assert!(output.contains(message), "{words}: {output}");
    }
    // A line's burst= means nothing to a quota.
    let config = common::config()
        .http("rate_limit_zone $http_x_key zone=q:1m algorithm=quota limit=5 period=day;")
        .locations("location / { rate_limit zone=q burst=5; }")
        .build();
    let (ok, output) = check_config(&config);
    assert!(!ok && output.contains("burst"), "{output}");
}
