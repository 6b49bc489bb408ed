//! The leaky bucket (the default algorithm) against real nginx: limit_req's semantics with
//! `rate_limit*` names. Burst, delays on a timer and their timing, `nodelay`, `delay=N`, a
//! client leaving while delayed, several limits on one request, once per main request, empty
//! keys, dry run, `cost=`, the jitter forgiven above 1000r/s.
//!
//! Rates are chosen so that every decision is far from its threshold: 1r/m where only counts
//! matter, 2r/s (one request per 500 ms) where delays are measured, with requests sent
//! back-to-back, a few milliseconds apart. The one test at 1250r/s asserts only what the
//! client's clock bounds: a gap at least as long as it waited, a pass count at most what the
//! time it took allows.

mod common;

use std::fs;
use std::thread;
use std::time::{Duration, Instant};

use common::{
    describe, run_timeline, send, start_request, statuses, Connection, Nginx, Outcome, Request,
    Response, Step,
};

/// nginx with the module; `http` is the rest of the `http` block and `locations` the
/// locations of its one server on `%%PORT%%`, which serves `html/`. Every response says
/// `$rate_limit_status` in `X-Status`; the access log has `uri status rate_limit_status`
/// lines.
fn start(http: &str, locations: &str) -> Nginx {
    common::config()
        .access_log(
            "log_format rl '$uri $status $rate_limit_status';\naccess_log logs/access.log rl;",
        )
        .http(http)
        .server("add_header X-Status $rate_limit_status always;")
        .locations(locations)
        .start()
}

/// Served "at once": an undelayed response takes a few milliseconds, the shortest delay here
/// is 500 ms.
const IMMEDIATE: Duration = Duration::from_millis(200);
/// How far a delay may be from the one computed from the rate.
const DELAY_TOLERANCE_MS: i64 = 200;

fn keyed(path: &str, key: &str) -> Request {
    Request::get(path).header("X-Key", key)
}

fn limit_status(response: &Response) -> &str {
    response.header("X-Status").unwrap_or("")
}

/// `count` requests for `key` on one keep-alive connection, each sent when the previous one
/// is answered.
fn in_a_row(port: u16, path: &str, key: &str, count: usize) -> Vec<Response> {
    let mut connection = Connection::open(port);
    (0..count)
        .map(|_| connection.send(&keyed(path, key)))
        .collect()
}

/// `count` requests for `key`, each on its own connection, all sent at one instant.
fn simultaneous(port: u16, path: &str, key: &str, count: usize) -> Vec<Step> {
    (0..count)
        .map(|_| Step::new(0, port, keyed(path, key)))
        .collect()
}

/// The outcomes with status 200, fastest first.
fn passed_by_latency(outcomes: &[Outcome]) -> Vec<&Outcome> {
    let mut passed: Vec<&Outcome> = outcomes.iter().filter(|o| o.status() == 200).collect();
    passed.sort_by_key(|o| o.elapsed());
    passed
}

/// Asserts that the latencies of the passed requests, fastest first, are `expected_ms` within
/// [`DELAY_TOLERANCE_MS`].
fn assert_latencies(passed: &[&Outcome], expected_ms: &[i64], table: &str) {
    let got: Vec<i64> = passed
        .iter()
        .map(|o| o.elapsed().as_millis() as i64)
        .collect();
    assert_eq!(got.len(), expected_ms.len(), "latencies {got:?}\n{table}");
    for (got, expected) in got.iter().zip(expected_ms) {
        assert!(
            (got - expected).abs() <= DELAY_TOLERANCE_MS,
            "latencies {got:?} ms, expected {expected_ms:?} ms ± {DELAY_TOLERANCE_MS}\n{table}"
        );
    }
}

fn read_log(nginx: &Nginx, name: &str) -> String {
    fs::read_to_string(nginx.prefix().join("logs").join(name)).unwrap_or_default()
}

/// Waits until the log `name` has a line satisfying `wanted`, for at most `timeout`; returns
/// the line, or panics with the log.
fn wait_for_line(
    nginx: &Nginx,
    name: &str,
    timeout: Duration,
    wanted: impl Fn(&str) -> bool,
) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        let log = read_log(nginx, name);
        if let Some(line) = log.lines().find(|line| wanted(line)) {
            return line.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "no such line in logs/{name} within {timeout:?}:\n{log}"
        );
        thread::sleep(Duration::from_millis(5));
    }
}

fn log_has(log: &str, start: &str, end: &str) -> bool {
    find_line(log, start, end).is_some()
}

/// The first line of `log` that contains both `start` and `end` (the text between them being
/// an exact excess, which varies with timing).
fn find_line<'a>(log: &'a str, start: &str, end: &str) -> Option<&'a str> {
    log.lines()
        .find(|line| line.contains(start) && line.contains(end))
}

/// Asserts that the error log has a line with `start` ... `end`, logged at `level`.
fn assert_logged_at(log: &str, level: &str, start: &str, end: &str) {
    let line = find_line(log, start, end)
        .unwrap_or_else(|| panic!("no line with {start:?} ... {end:?}:\n{log}"));
    assert!(
        line.contains(&format!(" [{level}] ")),
        "not at {level}: {line}"
    );
}

#[test]
fn burst_zero_rejects_the_second_immediate_request() {
    let nginx = start(
        "rate_limit_zone $http_x_key zone=one:1m rate=1r/m;",
        "location / { rate_limit zone=one; }",
    );
    let responses = in_a_row(nginx.port(), "/index.html", "a", 3);
    assert_eq!(statuses(&responses), [200, 429, 429], "{responses:?}");
    assert_eq!(limit_status(&responses[0]), "PASSED");
    assert_eq!(limit_status(&responses[1]), "REJECTED");
    assert!(
        responses.iter().all(|r| r.elapsed < IMMEDIATE),
        "{responses:?}"
    );
    assert_eq!(responses[0].text(), "ok\n");

    // Another key has its own bucket.
    let other = send(nginx.port(), &keyed("/index.html", "b"));
    assert_eq!(other.status, 200, "{other:?}");

    assert_logged_at(
        &nginx.error_log(),
        "error",
        "limiting requests, excess: ",
        " by zone \"one\"",
    );
}

/// Above 1000r/s a bucket forgives half an interval of arrival jitter (docs/algorithms.md):
/// at 1250r/s (one request per 800 µs) and no burst, a request 450 µs or more after the
/// previous one passes, where limit_req's arithmetic would want the whole 800 µs. 450 µs is a
/// lower bound of the gap nginx sees, not an estimate: the client sends the second request
/// 450 µs after the first one's response arrived, and nginx read its clock for the first
/// before answering it (both read `CLOCK_MONOTONIC`).
///
/// The pace still holds: of requests sent back to back, no more pass than the rate allows
/// over the time they took, plus one and a half.
#[test]
fn above_1000_per_second_half_an_interval_of_jitter_is_forgiven() {
    const INTERVAL_NS: u128 = 800_000;
    let nginx = start(
        "rate_limit_zone $http_x_key zone=fast:1m rate=1250r/s;",
        "location / { rate_limit zone=fast; }",
    );
    let mut connection = Connection::open(nginx.port());
    for pair in 0..50 {
        let key = format!("pair{pair}");
        let first = connection.send(&keyed("/index.html", &key));
        let answered = Instant::now();
        assert_eq!(first.status, 200, "pair {pair}: the first was refused");
        while answered.elapsed() < Duration::from_micros(450) {
            std::hint::spin_loop();
        }
        let second = connection.send(&keyed("/index.html", &key));
        assert_eq!(
            second.status,
            200,
            "pair {pair}: a request 450 µs or more after the first was refused ({})",
            limit_status(&second)
        );
    }

    let started = Instant::now();
    let responses = in_a_row(nginx.port(), "/index.html", "paced", 200);
    let elapsed_ns = started.elapsed().as_nanos();
    let passed = responses.iter().filter(|r| r.status == 200).count() as u128;
    assert!(
        passed * INTERVAL_NS <= elapsed_ns + INTERVAL_NS * 3 / 2,
        "{passed} of 200 passed in {elapsed_ns} ns at one per {INTERVAL_NS} ns"
    );
}

/// burst=3 at 2r/s, four requests at once: the first passes, the next three wait 0.5, 1 and
/// 1.5 s; a fifth 100 ms later is beyond the burst and rejected at once.
#[test]
fn burst_delays_the_excess_at_the_rate() {
    let nginx = start(
        "rate_limit_zone $http_x_key zone=one:1m rate=2r/s;",
        "location / { rate_limit zone=one burst=3; }",
    );
    let mut steps = simultaneous(nginx.port(), "/index.html", "k", 4);
    steps.push(Step::new(100, nginx.port(), keyed("/index.html", "k")));
    let outcomes = run_timeline(&steps);
    let table = describe(&steps, &outcomes);

    let rejected = &outcomes[4];
    assert_eq!(rejected.status(), 429, "\n{table}");
    assert!(rejected.elapsed() < IMMEDIATE, "\n{table}");
    assert_eq!(limit_status(&rejected.response), "REJECTED");

    let passed = passed_by_latency(&outcomes);
    assert_latencies(&passed, &[0, 500, 1000, 1500], &table);
    let limit_statuses: Vec<&str> = passed.iter().map(|o| limit_status(&o.response)).collect();
    assert_eq!(
        limit_statuses,
        ["PASSED", "DELAYED", "DELAYED", "DELAYED"],
        "\n{table}"
    );
    assert_logged_at(
        &nginx.error_log(),
        "warn",
        "delaying request, excess: ",
        ", by zone \"one\"",
    );
}

#[test]
fn nodelay_passes_the_burst_at_once() {
    let nginx = start(
        "rate_limit_zone $http_x_key zone=one:1m rate=2r/s;",
        "location / { rate_limit zone=one burst=3 nodelay; }",
    );
    let responses = in_a_row(nginx.port(), "/index.html", "k", 5);
    assert_eq!(statuses(&responses), [200, 200, 200, 200, 429]);
    assert!(
        responses.iter().all(|r| r.elapsed < IMMEDIATE),
        "{responses:?}"
    );
    let limit_statuses: Vec<&str> = responses.iter().map(limit_status).collect();
    assert_eq!(
        limit_statuses,
        ["PASSED", "PASSED", "PASSED", "PASSED", "REJECTED"]
    );
    assert!(!nginx.error_log().contains("delaying request"));
}

/// delay=2 burst=4 at 2r/s: of five requests at once, three pass at once (excess 0, 1, 2),
/// the fourth and fifth wait 0.5 and 1 s; a sixth 100 ms later is rejected.
#[test]
fn delay_n_passes_the_first_excess_then_delays() {
    let nginx = start(
        "rate_limit_zone $http_x_key zone=one:1m rate=2r/s;",
        "location / { rate_limit zone=one burst=4 delay=2; }",
    );
    let mut steps = simultaneous(nginx.port(), "/index.html", "k", 5);
    steps.push(Step::new(100, nginx.port(), keyed("/index.html", "k")));
    let outcomes = run_timeline(&steps);
    let table = describe(&steps, &outcomes);
    assert_eq!(outcomes[5].status(), 429, "\n{table}");
    assert!(outcomes[5].elapsed() < IMMEDIATE, "\n{table}");
    let passed = passed_by_latency(&outcomes);
    assert_latencies(&passed, &[0, 0, 0, 500, 1000], &table);
    let limit_statuses: Vec<&str> = passed.iter().map(|o| limit_status(&o.response)).collect();
    assert_eq!(
        limit_statuses,
        ["PASSED", "PASSED", "PASSED", "DELAYED", "DELAYED"],
        "\n{table}"
    );
}

/// A client that closes its connection while its request is delayed: nginx notices at once
/// (499 in the access log, long before the delay ends), logs nothing alarming, keeps the slot
/// charged, and nothing happens when the delay would have ended.
#[test]
fn disconnect_while_delayed_is_noticed_and_stays_charged() {
    let nginx = start(
        "rate_limit_zone $http_x_key zone=one:1m rate=1r/s;",
        "location / { rate_limit zone=one burst=1; }",
    );
    let workers = nginx.worker_pids();
    let port = nginx.port();
    assert_eq!(send(port, &keyed("/index.html", "k")).status, 200);

    // Excess 1 at 1r/s: this one waits 1 s.
    let delayed_sent = Instant::now();
    let mut delayed = start_request(port, &keyed("/delayed.html", "k"));
    wait_for_line(&nginx, "error.log", Duration::from_millis(500), |line| {
        line.contains("delaying request, excess: ") && line.contains("/delayed.html")
    });
    assert!(!delayed.answered_within(Duration::from_millis(1)));
    let abandoned_at = Instant::now();
    delayed.abandon();

    let line = wait_for_line(&nginx, "access.log", Duration::from_millis(500), |line| {
        line.starts_with("/delayed.html ")
    });
    let noticed_after = abandoned_at.elapsed();
    assert_eq!(line, "/delayed.html 499 DELAYED");
    assert!(
        delayed_sent.elapsed() < Duration::from_millis(800),
        "the disconnect was noticed only {noticed_after:?} after it, when the delay ended"
    );

    // The abandoned request keeps its slot: the bucket is full (excess 1 = burst), so the
    // next request is rejected rather than delayed.
    let next = send(port, &keyed("/index.html", "k"));
    assert_eq!(next.status, 429, "{next:?}");
    assert!(next.elapsed < IMMEDIATE, "{next:?}");

    // Past the moment the abandoned request's delay would have ended.
    let end_of_delay = delayed_sent + Duration::from_millis(1300);
    thread::sleep(end_of_delay.saturating_duration_since(Instant::now()));
    assert_eq!(send(port, &keyed("/index.html", "other")).status, 200);
    assert_eq!(nginx.worker_pids(), workers, "a worker died");
    let log = nginx.error_log();
    for line in log.lines() {
        let alarming = ["[emerg]", "[alert]", "[crit]"]
            .iter()
            .any(|level| line.contains(level))
            || (line.contains("[error]") && !line.contains("limiting requests, excess: "))
            || line.contains("exited on signal");
        assert!(!alarming, "alarming line in the error log: {line}\n{log}");
    }
}

/// Two limits keyed by two headers: a request must pass both, and one rejected by either is
/// charged to neither (the keys it was rejected with are still fresh afterwards).
#[test]
fn several_limits_must_all_pass_and_a_rejection_charges_none() {
    let nginx = start(
        "rate_limit_zone $http_x_a zone=a:1m rate=1r/m;\n\
         rate_limit_zone $http_x_b zone=b:1m rate=1r/m;",
        "location / { rate_limit zone=a; rate_limit zone=b; }",
    );
    let request = |a: &str, b: &str| {
        send(
            nginx.port(),
            &Request::get("/index.html")
                .header("X-A", a)
                .header("X-B", b),
        )
    };
    assert_eq!(request("a1", "b1").status, 200);
    // Rejected by `a` (a1 is used up): b2 must stay fresh.
    assert_eq!(request("a1", "b2").status, 429);
    // Rejected by `b` (b1 is used up): a2 must stay fresh, though `a` is checked first.
    assert_eq!(request("a2", "b1").status, 429);
    let fresh = request("a2", "b2");
    assert_eq!(
        fresh.status, 200,
        "a rejected request was charged: {fresh:?}"
    );
    assert_eq!(request("a2", "b3").status, 429);

    let log = nginx.error_log();
    assert!(
        log_has(&log, "limiting requests, excess: ", " by zone \"a\"")
            && log_has(&log, "limiting requests, excess: ", " by zone \"b\""),
        "{log}"
    );
}

/// A tight limit after a loose one: requests the tight one rejects take nothing from the
/// loose one, which still has its whole burst afterwards.
#[test]
fn rejected_by_a_tight_limit_costs_nothing_in_a_loose_one() {
    let nginx = start(
        "rate_limit_zone $http_x_key zone=loose:1m rate=1r/m burst=3;\n\
         rate_limit_zone $http_x_key zone=tight:1m rate=1r/m;",
        "location /both/ { rate_limit zone=loose nodelay; rate_limit zone=tight; }\n\
         location /loose/ { rate_limit zone=loose nodelay; }",
    );
    nginx.write_file("html/both/index.html", "ok\n");
    nginx.write_file("html/loose/index.html", "ok\n");
    let both = in_a_row(nginx.port(), "/both/index.html", "k", 4);
    assert_eq!(statuses(&both), [200, 429, 429, 429], "{both:?}");
    // `loose` was charged once (the request that passed both): 3 of its 4 remain.
    let loose = in_a_row(nginx.port(), "/loose/index.html", "k", 4);
    assert_eq!(statuses(&loose), [200, 200, 200, 429], "{loose:?}");
}

/// Two delaying limits: the request waits for the longer of the two delays (2r/s gives 0,
/// 0.5, 1 s to three requests at once; 4r/s would give 0, 0.25, 0.5 s).
#[test]
fn several_limits_delay_by_the_longest() {
    let nginx = start(
        "rate_limit_zone $http_x_key zone=slow:1m rate=2r/s;\n\
         rate_limit_zone $http_x_key zone=fast:1m rate=4r/s;",
        "location / { rate_limit zone=fast burst=5; rate_limit zone=slow burst=5; }",
    );
    let steps = simultaneous(nginx.port(), "/index.html", "k", 3);
    let outcomes = run_timeline(&steps);
    let table = describe(&steps, &outcomes);
    let passed = passed_by_latency(&outcomes);
    assert_latencies(&passed, &[0, 500, 1000], &table);
    let log = nginx.error_log();
    assert!(
        log_has(&log, "delaying request, excess: ", ", by zone \"slow\""),
        "{log}"
    );
}

/// Limits apply once per main request: not again after an internal redirect (`try_files`,
/// `error_page`) to a location limited by the same or another zone, and not to subrequests
/// (SSI includes). Each zone allows one request a minute per key, so a second application
/// would reject.
#[test]
fn limits_apply_once_per_main_request() {
    let nginx = start(
        "rate_limit_zone $http_x_key zone=once:1m rate=1r/m;\n\
         rate_limit_zone $http_x_key zone=other:1m rate=1r/m;",
        "location /limited/ { rate_limit zone=once; }\n\
         location /try/ { rate_limit zone=once; try_files /nothing /limited/index.html; }\n\
         location /error/ { rate_limit zone=once; error_page 404 = /limited/index.html; }\n\
         location /cross/ { rate_limit zone=other; try_files /nothing /limited/index.html; }\n\
         location /ssi/ { ssi on; }\n\
         location /ssi-limited/ { ssi on; rate_limit zone=once; }",
    );
    nginx.write_file("html/limited/index.html", "ok\n");
    let page = "<!--# include virtual=\"/limited/index.html\" -->\
                <!--# include virtual=\"/limited/index.html\" -->";
    nginx.write_file("html/ssi/page.html", page);
    nginx.write_file("html/ssi-limited/page.html", page);
    let port = nginx.port();
    let limited = |key: &str| send(port, &keyed("/limited/index.html", key)).status;

    for (path, key) in [
        ("/try/x", "try"),
        ("/error/missing.html", "error"),
        ("/ssi-limited/page.html", "ssi-limited"),
    ] {
        let response = send(port, &keyed(path, key));
        assert_eq!(response.status, 200, "{path}: {response:?}");
        assert_eq!(limit_status(&response), "PASSED", "{path}");
        if path.starts_with("/ssi") {
            assert_eq!(response.text(), "ok\nok\n", "{path}");
        }
        // Charged exactly once: the key's one request is used up.
        assert_eq!(limited(key), 429, "{path}");
    }

    // Redirected from a location limited by `other` to one limited by `once`: `once` is not
    // applied, so the key is still fresh there.
    let response = send(port, &keyed("/cross/x", "cross"));
    assert_eq!(response.status, 200, "{response:?}");
    assert_eq!(limited("cross"), 200);
    assert_eq!(limited("cross"), 429);

    // Subrequests of an unlimited page, six of them, are not limited and charge nothing.
    for _ in 0..3 {
        let response = send(port, &keyed("/ssi/page.html", "ssi"));
        assert_eq!(
            (response.status, response.text().as_str()),
            (200, "ok\nok\n")
        );
    }
    assert_eq!(limited("ssi"), 200);
    assert_eq!(limited("ssi"), 429);
}

/// A request whose key is empty is not limited, and `$rate_limit_status` is not set for it.
#[test]
fn empty_key_is_not_limited() {
    let nginx = start(
        "rate_limit_zone $http_x_key zone=one:1m rate=1r/m;",
        "location / { rate_limit zone=one; }",
    );
    let mut connection = Connection::open(nginx.port());
    for _ in 0..5 {
        let response = connection.get("/index.html");
        assert_eq!(response.status, 200, "{response:?}");
        for header in ["X-Status", "RateLimit", "RateLimit-Policy"] {
            assert_eq!(response.header(header), None, "{response:?}");
        }
    }
    let keyed = in_a_row(nginx.port(), "/index.html", "k", 2);
    assert_eq!(statuses(&keyed), [200, 429]);
    let log = wait_for_line(&nginx, "access.log", Duration::from_secs(2), |line| {
        line.ends_with(" 429 REJECTED")
    });
    assert_eq!(log, "/index.html 429 REJECTED");
    assert_eq!(
        read_log(&nginx, "access.log")
            .lines()
            .filter(|line| *line == "/index.html 200 -")
            .count(),
        5
    );
}

/// Dry run: every request is served at once, but the state is charged, `$rate_limit_status`
/// says what would have happened, and the log lines say ", dry run".
#[test]
fn dry_run_serves_everything_but_charges_and_logs() {
    let nginx = start(
        "rate_limit_zone $http_x_key zone=dry:1m rate=1r/m burst=2;",
        "location /dry/ { rate_limit zone=dry; rate_limit_dry_run on; }\n\
         location /real/ { rate_limit zone=dry; }",
    );
    nginx.write_file("html/dry/index.html", "ok\n");
    nginx.write_file("html/real/index.html", "ok\n");
    let responses = in_a_row(nginx.port(), "/dry/index.html", "k", 4);
    assert_eq!(statuses(&responses), [200, 200, 200, 200]);
    assert!(
        responses.iter().all(|r| r.elapsed < IMMEDIATE),
        "{responses:?}"
    );
    let limit_statuses: Vec<&str> = responses.iter().map(limit_status).collect();
    assert_eq!(
        limit_statuses,
        [
            "PASSED",
            "DELAYED_DRY_RUN",
            "DELAYED_DRY_RUN",
            "REJECTED_DRY_RUN"
        ]
    );

    // The three requests that would have passed filled the bucket (1 + burst 2).
    let real = send(nginx.port(), &keyed("/real/index.html", "k"));
    assert_eq!(real.status, 429, "{real:?}");

    wait_for_line(&nginx, "access.log", Duration::from_secs(2), |line| {
        line.starts_with("/real/")
    });
    let access = read_log(&nginx, "access.log");
    let lines: Vec<&str> = access.lines().collect();
    assert_eq!(
        lines,
        [
            "/dry/index.html 200 PASSED",
            "/dry/index.html 200 DELAYED_DRY_RUN",
            "/dry/index.html 200 DELAYED_DRY_RUN",
            "/dry/index.html 200 REJECTED_DRY_RUN",
            "/real/index.html 429 REJECTED",
        ]
    );
    let log = nginx.error_log();
    assert_logged_at(
        &log,
        "warn",
        "delaying request, dry run, excess: ",
        ", by zone \"dry\"",
    );
    assert_logged_at(
        &log,
        "error",
        "limiting requests, dry run, excess: ",
        " by zone \"dry\"",
    );
}

/// `cost=N` weighs a request as N: with 1 + burst 4 = 5 slots, cost 2 passes twice, then a
/// third is rejected while one cost-1 request still fits.
#[test]
fn cost_weighs_a_request_as_n() {
    let nginx = start(
        "rate_limit_zone $http_x_key zone=one:1m rate=1r/m burst=4;",
        "location /two/ { rate_limit zone=one nodelay cost=2; }\n\
         location /one/ { rate_limit zone=one nodelay; }",
    );
    nginx.write_file("html/two/index.html", "ok\n");
    nginx.write_file("html/one/index.html", "ok\n");
    let two = in_a_row(nginx.port(), "/two/index.html", "k", 3);
    assert_eq!(statuses(&two), [200, 200, 429], "{two:?}");
    let one = in_a_row(nginx.port(), "/one/index.html", "k", 2);
    assert_eq!(statuses(&one), [200, 429], "{one:?}");
}

#[test]
fn unlimited_location_is_not_touched() {
    let nginx = start(
        "rate_limit_zone $http_x_key zone=one:1m rate=1r/m;",
        "location /limited/ { rate_limit zone=one; }\n\
         location / { }",
    );
    let responses = in_a_row(nginx.port(), "/index.html", "k", 3);
    assert_eq!(statuses(&responses), [200, 200, 200]);
    assert!(responses.iter().all(|r| r.header("X-Status").is_none()));
}
