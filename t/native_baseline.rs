//! nginx's own limit_req, as the baseline the rate_limit directives are compared with: what a
//! limit_req config does, measured through the harness. No rate limit module here.
//!
//! limit_req counts in thousandths of a request: each request adds 1000 to the key's excess,
//! which drains at the rate; excess above burst * 1000 is rejected, and a request that passes
//! with excess above delay * 1000 waits (excess - delay * 1000) / rate.

mod common;

use std::fs;
use std::thread;
use std::time::{Duration, Instant};

use common::{
    check_config, describe, get, run_timeline, statuses, Connection, Nginx, Request, Step,
};

/// nginx alone (no module), two workers: `/index.html` is limited by `limit_req {limit}` in
/// zone `one` (`zone` holds the zone's rate), keyed by client address; `extra` goes into the
/// `http` block.
fn config(zone: &str, limit: &str, extra: &str) -> String {
    common::config()
        .without_module()
        .workers(2)
        .access_log("log_format status '$uri $status';\naccess_log logs/access.log status;")
        .http(&format!(
            "limit_req_zone $binary_remote_addr zone=one:1m {zone};"
        ))
        .http(extra)
        .server("add_header X-Pid $pid always;")
        .locations(&format!(
            "location = /index.html {{ limit_req zone=one {limit}; }}"
        ))
        .build()
}

/// A request is "immediate" well under any delay used here (the shortest is about 450 ms).
const IMMEDIATE: Duration = Duration::from_millis(200);

#[test]
fn rejects_the_second_immediate_request_then_passes_after_the_interval() {
    let nginx = Nginx::start(&config("rate=2r/s", "", ""));
    let port = nginx.port();
    // 2r/s: one request per 500 ms; the steps sit 250 ms away from that threshold.
    let steps: Vec<Step> = [0, 50, 750, 800]
        .map(|at| Step::new(at, port, Request::get("/index.html")))
        .to_vec();
    let outcomes = run_timeline(&steps);
    assert_eq!(
        statuses(&outcomes),
        [200, 503, 200, 503],
        "\n{}",
        describe(&steps, &outcomes)
    );
    assert!(nginx.error_log().contains("limiting requests, excess: "));
}

#[test]
fn limit_req_status_sets_the_rejection_code() {
    let nginx = Nginx::start(&config("rate=2r/s", "", "limit_req_status 429;"));
    let mut connection = Connection::open(nginx.port());
    let first = connection.get("/index.html");
    let second = connection.get("/index.html");
    assert_eq!((first.status, second.status), (200, 429));
    // Both answered at once: the second came well inside the 500 ms interval.
    assert!(first.elapsed + second.elapsed < IMMEDIATE);
}

#[test]
fn burst_delays_the_excess_and_rejects_beyond_it() {
    let nginx = Nginx::start(&config("rate=2r/s", "burst=2", ""));
    let port = nginx.port();
    let steps: Vec<Step> = [0, 50, 100, 150]
        .map(|at| Step::new(at, port, Request::get("/index.html")))
        .to_vec();
    let outcomes = run_timeline(&steps);
    let table = describe(&steps, &outcomes);
    // Excess 0, 900 (waits 450 ms), 1800 (waits 900 ms), 2700 > 2000: rejected.
    assert_eq!(statuses(&outcomes), [200, 200, 200, 503], "\n{table}");
    let elapsed_ms: Vec<u128> = outcomes.iter().map(|o| o.elapsed().as_millis()).collect();
    assert!(elapsed_ms[0] < 200, "\n{table}");
    assert!((250..700).contains(&elapsed_ms[1]), "\n{table}");
    assert!((700..1200).contains(&elapsed_ms[2]), "\n{table}");
    assert!(elapsed_ms[3] < 200, "\n{table}");
}

#[test]
fn nodelay_passes_the_burst_at_once() {
    let nginx = Nginx::start(&config("rate=2r/s", "burst=2 nodelay", ""));
    let mut connection = Connection::open(nginx.port());
    let responses: Vec<_> = (0..4).map(|_| connection.get("/index.html")).collect();
    let got: Vec<u16> = responses.iter().map(|r| r.status).collect();
    assert_eq!(got, [200, 200, 200, 503]);
    let total: Duration = responses.iter().map(|r| r.elapsed).sum();
    assert!(total < IMMEDIATE, "took {total:?}");
}

#[test]
fn nginx_t_rejects_an_invalid_rate() {
    let (ok, output) = check_config(&config("rate=abc", "", ""));
    assert!(!ok, "nginx -t accepted rate=abc:\n{output}");
    assert!(output.contains("invalid rate \"rate=abc\""), "{output}");
}

#[test]
fn nginx_t_rejects_a_zone_that_was_never_declared() {
    let (ok, output) = check_config(&config("rate=2r/s", "", "").replace("zone=one ", "zone=two "));
    assert!(!ok, "{output}");
    assert!(
        output.contains("zero size shared memory zone \"two\""),
        "{output}"
    );
}

/// One request a minute: any second request inside the test is over the limit.
const ONE_PER_MINUTE: &str = "rate=1r/m";

#[test]
fn zone_state_survives_a_reload() {
    let mut nginx = Nginx::start(&config(ONE_PER_MINUTE, "", ""));
    assert_eq!(get(nginx.port(), "/index.html").status, 200);
    let new_workers = nginx.reload();
    let response = get(nginx.port(), "/index.html");
    assert_eq!(response.status, 503);
    assert!(new_workers.contains(&response.worker_pid()));
}

#[test]
fn zone_state_survives_killed_workers() {
    let nginx = Nginx::start(&config(ONE_PER_MINUTE, "", ""));
    assert_eq!(get(nginx.port(), "/index.html").status, 200);
    let killed = nginx.kill_workers();
    let respawned = nginx.wait_workers_replaced(&killed);
    let response = get(nginx.port(), "/index.html");
    assert_eq!(response.status, 503);
    assert!(respawned.contains(&response.worker_pid()));
}

#[test]
fn client_leaving_while_delayed_is_logged_499() {
    // burst=5 at 1r/m: the second request would wait a minute.
    let nginx = Nginx::start(&config(ONE_PER_MINUTE, "burst=5", ""));
    assert_eq!(get(nginx.port(), "/index.html").status, 200);
    let mut delayed = common::start_request(nginx.port(), &Request::get("/index.html"));
    assert!(!delayed.answered_within(Duration::from_millis(300)));
    delayed.abandon();

    let access_log = nginx.prefix().join("logs/access.log");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let log = fs::read_to_string(&access_log).unwrap_or_default();
        if log.lines().any(|line| line == "/index.html 499") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no 499 in the access log:\n{log}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}
