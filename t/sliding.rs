//! `algorithm=sliding_log` and `algorithm=sliding_window` against real nginx: exactly N
//! requests per window pass, the rest are rejected at once with an exact `Retry-After` and the
//! RateLimit fields; two workers share one budget; dry run, `cost=` and what `nginx -t`
//! refuses.
//!
//! Most tests use `rate=5r/m`: no request ages out of a one-minute window while a test runs.
//! The sliding window's estimate `n = prev · (W − elapsed) / W + cur` only moves at its window
//! edges, which nginx aligns to multiples of W on CLOCK_MONOTONIC. That is the clock
//! [`monotonic_ns`] reads in this process, so the tests know where the edges are: the
//! per-minute tests keep clear of them (or compute the phase-dependent values from the clock),
//! and [`sliding_window_weights_the_previous_window`] puts its probes 125 ms away from every
//! threshold, then checks from the clock that they really were.

mod common;

use std::thread;
use std::time::Duration;

use common::{check_config, get, Connection, Nginx, Response};

/// Requests per minute in the `log` and `window` zones.
const N: u64 = 5;
const MINUTE_NS: u64 = 60 * SECOND_NS;
const SECOND_NS: u64 = 1_000_000_000;
const MS_NS: u64 = 1_000_000;

/// A rejection is answered in a few milliseconds; nothing here is ever delayed.
const IMMEDIATE: Duration = Duration::from_millis(200);

/// Per algorithm, a one-minute zone (`/log`, `/window` and their `cost=`, dry-run variants)
/// and a one-second one for the window-edge test; two workers. Keys come from `?k=`.
fn start() -> Nginx {
    let mut config = common::config()
        .workers(2)
        .http("rate_limit_zone $arg_k zone=log:1m rate=5r/m algorithm=sliding_log;")
        .http("rate_limit_zone $arg_k zone=window:1m rate=5r/m algorithm=sliding_window;")
        .http("rate_limit_zone $arg_k zone=log_edge:1m rate=4r/s algorithm=sliding_log;")
        .http("rate_limit_zone $arg_k zone=window_edge:1m rate=4r/s algorithm=sliding_window;")
        .server("add_header X-Pid $pid always;")
        .server("add_header X-Limit $rate_limit_status always;")
        .locations("location = /pid { empty_gif; }")
        .locations("location = /log_edge { rate_limit zone=log_edge; empty_gif; }")
        .locations("location = /window_edge { rate_limit zone=window_edge; empty_gif; }");
    for zone in ["log", "window"] {
        config = config.locations(&format!(
            "location = /{zone} {{ rate_limit zone={zone}; empty_gif; }}\n\
             location = /{zone}/cost2 {{ rate_limit zone={zone} cost=2; empty_gif; }}\n\
             location = /{zone}/cost6 {{ rate_limit zone={zone} cost=6; empty_gif; }}\n\
             location = /{zone}/dry {{ rate_limit zone={zone}; rate_limit_dry_run on; empty_gif; }}"
        ));
    }
    config.start()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sliding {
    Log,
    Window,
}

impl Sliding {
    const BOTH: [Sliding; 2] = [Sliding::Log, Sliding::Window];

    /// The one-minute zone, and the location limited by it.
    fn zone(self) -> &'static str {
        match self {
            Sliding::Log => "log",
            Sliding::Window => "window",
        }
    }

    /// The sliding window's values depend on where its one-minute window is: keep a test of a
    /// few seconds within one. The log has no windows.
    fn keep_clear_of_window_edge(self) {
        if self == Sliding::Window {
            keep_clear_of_edge(MINUTE_NS, 3 * SECOND_NS);
        }
    }
}

/// CLOCK_MONOTONIC in nanoseconds: the clock the module decides with.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * SECOND_NS + ts.tv_nsec as u64
}

fn sleep_until(monotonic: u64) {
    let now = monotonic_ns();
    if monotonic > now {
        thread::sleep(Duration::from_nanos(monotonic - now));
    }
}

/// Returns at once if the next multiple of `window_ns` is at least `needed_ns` away, or else
/// just after it.
fn keep_clear_of_edge(window_ns: u64, needed_ns: u64) {
    let now = monotonic_ns();
    let next_edge = (now / window_ns + 1) * window_ns;
    if next_edge - now < needed_ns {
        sleep_until(next_edge + 10 * MS_NS);
    }
}

/// A response and the CLOCK_MONOTONIC interval in which nginx decided it.
struct Timed {
    response: Response,
    sent_ns: u64,
    received_ns: u64,
}

fn timed_get(connection: &mut Connection, path: &str) -> Timed {
    let sent_ns = monotonic_ns();
    let response = connection.get(path);
    Timed {
        response,
        sent_ns,
        received_ns: monotonic_ns(),
    }
}

fn limit_status(response: &Response) -> &str {
    response.header("X-Limit").unwrap_or("")
}

/// `r` and `t` of the `RateLimit` field `"ZONE";r=R;t=T`.
fn rate_limit_field(response: &Response, zone: &str) -> (u64, u64) {
    let field = response
        .header("RateLimit")
        .unwrap_or_else(|| panic!("no RateLimit field: {response:?}"));
    let parse = || -> Option<(u64, u64)> {
        let rest = field.strip_prefix(&format!("\"{zone}\";r="))?;
        let (remaining, reset) = rest.split_once(";t=")?;
        Some((remaining.parse().ok()?, reset.parse().ok()?))
    };
    parse().unwrap_or_else(|| panic!("unexpected RateLimit field {field:?}"))
}

fn retry_after(response: &Response) -> u64 {
    response
        .header("Retry-After")
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no numeric Retry-After: {response:?}"))
}

/// `ceil(ns / 1 s)`, as the module rounds `Retry-After` and `t`.
fn ceil_seconds(ns: u64) -> u64 {
    ns.div_ceil(SECOND_NS)
}

/// The seconds the sliding window reports for a key whose `N` requests were all charged in the
/// current window, for a decision taken at any time in `[from_ns, to_ns]`: from the latest
/// (smallest value) to the earliest. `after_edge_ns(phase)` is how long until the value's
/// moment, `phase` being the time since the window started.
fn window_seconds(from_ns: u64, to_ns: u64, after_edge_ns: impl Fn(u64) -> u64) -> (u64, u64) {
    (
        ceil_seconds(after_edge_ns(to_ns % MINUTE_NS)),
        ceil_seconds(after_edge_ns(from_ns % MINUTE_NS)),
    )
}

fn assert_between(value: u64, (low, high): (u64, u64), what: &str, response: &Response) {
    assert!(
        (low..=high).contains(&value),
        "{what} {value}, expected {low}..={high}: {response:?}"
    );
}

/// `rate=5r/m`: five requests pass with `RateLimit: r` counting down 4..0, then each request is
/// rejected at once with 429 and a `Retry-After` of when the oldest request leaves the window
/// (log) or the window's count has decayed enough (window: `(60 − phase) + 60/5` s).
#[test]
fn n_pass_then_immediate_rejections_with_headers() {
    let nginx = start();
    for sliding in Sliding::BOTH {
        sliding.keep_clear_of_window_edge();
        let zone = sliding.zone();
        let path = format!("/{zone}?k=count");
        let mut connection = Connection::open(nginx.port());
        let mut first_sent_ns = None;
        for i in 0..N {
            let Timed {
                response,
                sent_ns,
                received_ns,
            } = timed_get(&mut connection, &path);
            first_sent_ns.get_or_insert(sent_ns);
            assert_eq!(response.status, 200, "{zone} request {i}: {response:?}");
            assert_eq!(limit_status(&response), "PASSED", "{response:?}");
            assert_eq!(
                response.header_all("RateLimit-Policy"),
                [format!("\"{zone}\";q=5;w=60")],
                "{response:?}"
            );
            let (remaining, reset) = rate_limit_field(&response, zone);
            assert_eq!(remaining, N - 1 - i, "{zone} request {i}: {response:?}");
            let expected_reset = match sliding {
                // The newest entry, this request, stops counting in 60 s.
                Sliding::Log => (60, 60),
                // Back to fresh at the end of the next window.
                Sliding::Window => {
                    window_seconds(sent_ns, received_ns, |phase| 2 * MINUTE_NS - phase)
                }
            };
            assert_between(reset, expected_reset, "t", &response);
        }

        for i in 0..3 {
            let Timed {
                response,
                sent_ns,
                received_ns,
            } = timed_get(&mut connection, &path);
            assert_eq!(
                response.status, 429,
                "{zone} extra request {i}: {response:?}"
            );
            assert!(response.elapsed < IMMEDIATE, "{response:?}");
            assert_eq!(limit_status(&response), "REJECTED", "{response:?}");
            assert_eq!(rate_limit_field(&response, zone).0, 0, "{response:?}");
            let expected_retry = match sliding {
                Sliding::Log => {
                    let since_first = received_ns - first_sent_ns.unwrap_or(sent_ns);
                    assert!(since_first < SECOND_NS, "too slow: {since_first} ns");
                    (58, 60)
                }
                Sliding::Window => window_seconds(sent_ns, received_ns, |phase| {
                    MINUTE_NS - phase + MINUTE_NS / N
                }),
            };
            assert_between(
                retry_after(&response),
                expected_retry,
                "Retry-After",
                &response,
            );
        }

        // Other keys have their own budget.
        let other = get(nginx.port(), &format!("/{zone}?k=other"));
        assert_eq!(other.status, 200, "{other:?}");
        assert_eq!(rate_limit_field(&other, zone).0, N - 1, "{other:?}");
    }
}

/// Two keep-alive connections served by different workers of `worker_processes 2`.
fn connections_on_two_workers(nginx: &Nginx) -> [(Connection, u32); 2] {
    let mut first = Connection::open(nginx.port());
    let first_pid = first.get("/pid").worker_pid();
    // Either worker may accept a new connection: open more (held open until we are done)
    // until the other one takes one.
    let mut held = Vec::new();
    for _ in 0..200 {
        let mut connection = Connection::open(nginx.port());
        let pid = connection.get("/pid").worker_pid();
        if pid != first_pid {
            return [(first, first_pid), (connection, pid)];
        }
        held.push(connection);
    }
    panic!(
        "200 connections all went to worker {first_pid} of {:?}",
        nginx.worker_pids()
    );
}

/// Requests alternating between two workers draw from one budget of 5 per minute.
#[test]
fn two_workers_share_one_budget() {
    let nginx = start();
    assert_eq!(nginx.worker_pids().len(), 2);
    for sliding in Sliding::BOTH {
        sliding.keep_clear_of_window_edge();
        let zone = sliding.zone();
        let path = format!("/{zone}?k=shared");
        let mut connections = connections_on_two_workers(&nginx);
        let mut answers = Vec::new();
        for i in 0..8 {
            let (connection, pid) = &mut connections[i % 2];
            let response = connection.get(&path);
            assert_eq!(response.worker_pid(), *pid, "{response:?}");
            answers.push((response.worker_pid(), response.status));
        }
        let statuses: Vec<u16> = answers.iter().map(|&(_, status)| status).collect();
        assert_eq!(
            statuses,
            [200, 200, 200, 200, 200, 429, 429, 429],
            "{zone}: (worker, status) {answers:?}"
        );
    }
}

/// `rate_limit_dry_run on`: requests over the limit are served, with `$rate_limit_status`
/// `REJECTED_DRY_RUN`, no `Retry-After`, and a "dry run" line in the error log. Nothing is
/// charged for them.
#[test]
fn dry_run_lets_rejected_requests_through() {
    let nginx = start();
    for sliding in Sliding::BOTH {
        sliding.keep_clear_of_window_edge();
        let zone = sliding.zone();
        let path = format!("/{zone}/dry?k=dry");
        let mut connection = Connection::open(nginx.port());
        let statuses: Vec<(u16, String, u64)> = (0..N + 3)
            .map(|_| {
                let response = connection.get(&path);
                assert_eq!(response.header("Retry-After"), None, "{response:?}");
                let remaining = rate_limit_field(&response, zone).0;
                (
                    response.status,
                    limit_status(&response).to_string(),
                    remaining,
                )
            })
            .collect();
        let mut expected: Vec<(u16, String, u64)> = (0..N)
            .map(|i| (200, "PASSED".to_string(), N - 1 - i))
            .collect();
        expected.extend((0..3).map(|_| (200, "REJECTED_DRY_RUN".to_string(), 0)));
        assert_eq!(statuses, expected, "{zone}");

        // The same key is still exactly full where the limit is enforced.
        let enforced = connection.get(&format!("/{zone}?k=dry"));
        assert_eq!(enforced.status, 429, "{enforced:?}");
        let line = format!("limiting requests, dry run, excess: 1.000 by zone \"{zone}\"");
        let log = nginx.error_log();
        assert_eq!(log.matches(&line).count(), 3, "{zone}: error.log:\n{log}");
    }
}

/// `cost=2` takes two of the five, `cost=6` can never pass (the status alone: no wait helps),
/// and a rejected request is not charged.
#[test]
fn cost_counts_several_requests() {
    let nginx = start();
    for sliding in Sliding::BOTH {
        sliding.keep_clear_of_window_edge();
        let zone = sliding.zone();
        let mut connection = Connection::open(nginx.port());
        // (location suffix, status, RateLimit r)
        let expected: &[(&str, u16, u64)] = &[
            ("/cost2", 200, 3),
            ("/cost2", 200, 1),
            ("/cost2", 429, 1),
            ("", 200, 0),
            ("", 429, 0),
        ];
        for &(suffix, status, remaining) in expected {
            let response = connection.get(&format!("/{zone}{suffix}?k=cost"));
            assert_eq!(
                (response.status, rate_limit_field(&response, zone).0),
                (status, remaining),
                "{zone}{suffix}: {response:?}"
            );
        }

        let response = connection.get(&format!("/{zone}/cost6?k=big"));
        assert_eq!(response.status, 429, "{response:?}");
        assert_eq!(response.header("Retry-After"), None, "{response:?}");
        let response = connection.get(&format!("/{zone}?k=big"));
        assert_eq!(
            (response.status, rate_limit_field(&response, zone).0),
            (200, N - 1),
            "the cost=6 request was charged: {response:?}"
        );
    }
}

#[test]
fn nginx_t_refuses_what_a_sliding_zone_cannot_do() {
    let config = |http: &str| {
        format!(
            "load_module %%MODULE%%;\nevents {{ worker_connections 64; }}\n\
             http {{\n{http}\nserver {{ listen 127.0.0.1:%%PORT%%; LOCATION }}\n}}\n"
        )
    };
    let zone = |words: &str| format!("rate_limit_zone $arg_k zone=z:1m {words};");

    // (http block, server location, the message nginx -t must print; "" for accepted)
    let log_max = "rate \"5000r/s\" is more than 4096 requests per window, the largest \
                   sliding_log keeps";
    let window_max = "rate \"1048576r/m\" is more than 1048575 requests per window, the \
                      largest sliding_window keeps";
    let cases: Vec<(String, &str, &str)> = vec![
        (zone("rate=5000r/s algorithm=sliding_log"), "", log_max),
        (zone("rate=4096r/s algorithm=sliding_log"), "", ""),
        (
            zone("rate=1048576r/m algorithm=sliding_window"),
            "",
            window_max,
        ),
        (zone("rate=1048575r/m algorithm=sliding_window"), "", ""),
        (
            zone("rate=0.5r/s algorithm=sliding_log"),
            "",
            "rate \"0.5r/s\" is not a whole number of requests for sliding_log",
        ),
        (
            zone("rate=2.5r/m algorithm=sliding_window"),
            "",
            "rate \"2.5r/m\" is not a whole number of requests for sliding_window",
        ),
        (
            zone("rate=5r/m burst=2 algorithm=sliding_log"),
            "",
            "\"burst\" is not used by sliding_log",
        ),
        (
            zone("rate=5r/m burst=2 algorithm=sliding_window"),
            "",
            "\"burst\" is not used by sliding_window",
        ),
        (
            zone("rate=5r/m algorithm=sliding_window"),
            "location / { rate_limit zone=z burst=2; }",
            "\"burst\" is not used by sliding_window",
        ),
    ];

    let mut failures = Vec::new();
    for (http, location, expected) in &cases {
        let (ok, output) = check_config(&config(http).replace("LOCATION", location));
        let what = format!("{http} {location}");
        match (ok, expected.is_empty()) {
            (true, true) => {}
            (true, false) => failures.push(format!("{what}: accepted:\n{output}")),
            (false, true) => failures.push(format!("{what}: refused:\n{output}")),
            (false, false) if !output.contains("[emerg]") || !output.contains(expected) => failures
                .push(format!(
                    "{what}: expected an [emerg] with {expected:?}, got:\n{output}"
                )),
            (false, false) => {}
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// One run of the window-edge test failed its timing preconditions (the machine stalled):
/// try again in a later window.
struct Missed(String);

/// `rate=4r/s`, windows of 1 s. Keys filled with 4 requests early in window k weigh
/// `prev = 4` into window k+1: at phase x of window k+1 the estimate is `4 · (1 − x)`, so
/// `floor(4x)` more pass; the thresholds are at x = 0.25, 0.5, 0.75, and the probes at
/// x = 0.125, 0.375, 0.625, 0.875 see 0, 1, 2, 3 pass (a fixed window would pass 4).
/// The sliding log, filled at the same time, rejects until a full second after its requests,
/// then passes 4 again.
#[test]
fn sliding_window_weights_the_previous_window() {
    let nginx = start();
    let mut misses = Vec::new();
    for attempt in 0..3 {
        match window_edge_attempt(&nginx, attempt) {
            Ok(()) => return,
            Err(Missed(why)) => misses.push(why),
        }
    }
    panic!("the machine was too slow for every attempt:\n{misses:#?}");
}

fn window_edge_attempt(nginx: &Nginx, attempt: usize) -> Result<(), Missed> {
    const WINDOW_NS: u64 = SECOND_NS;
    const PROBE_PHASES_MS: [u64; 4] = [125, 375, 625, 875];
    let window_path = |probe: usize| format!("/window_edge?k={attempt}-{probe}");
    let log_path = format!("/log_edge?k={attempt}");
    let mut connection = Connection::open(nginx.port());
    connection.get("/pid");

    // Fill window k, 30 ms after it starts.
    let k = monotonic_ns() / WINDOW_NS + 1;
    sleep_until(k * WINDOW_NS + 30 * MS_NS);
    let fill_start = monotonic_ns();
    let mut fill = Vec::new();
    for probe in 0..PROBE_PHASES_MS.len() {
        for _ in 0..4 {
            fill.push(connection.get(&window_path(probe)));
        }
    }
    let over = connection.get(&window_path(0));
    let log_fill: Vec<Response> = (0..4).map(|_| connection.get(&log_path)).collect();
    let fill_end = monotonic_ns();
    if fill_end / WINDOW_NS != k || fill_end % WINDOW_NS > 200 * MS_NS {
        return Err(Missed(format!(
            "attempt {attempt}: filling took until {} ms into window k",
            (fill_end - k * WINDOW_NS) / MS_NS
        )));
    }
    for response in fill.iter().chain(&log_fill) {
        assert_eq!(response.status, 200, "{response:?}");
    }
    // A fifth in window k: cur = 4, so not before the count decays in window k+1 to 3, at
    // x = 0.25: (1 − fill phase) + 0.25 s, between 1.05 and 1.25 s.
    assert_eq!(over.status, 429, "{over:?}");
    assert_eq!(retry_after(&over), 2, "{over:?}");

    // The log, half a second later: its four entries count until fill_start + 1 s at least.
    sleep_until(fill_end + 500 * MS_NS);
    let early = timed_get(&mut connection, &log_path);
    if early.received_ns + 50 * MS_NS > fill_start + WINDOW_NS {
        return Err(Missed(format!(
            "attempt {attempt}: the early log probe was late"
        )));
    }
    assert_eq!(early.response.status, 429, "{:?}", early.response);
    assert_eq!(retry_after(&early.response), 1, "{:?}", early.response);

    let mut log_probed = false;
    for (probe, phase_ms) in PROBE_PHASES_MS.into_iter().enumerate() {
        // The log again, once all four entries are 50 ms or more out of their window.
        if !log_probed && phase_ms > 300 {
            log_probed = true;
            sleep_until(fill_end + WINDOW_NS + 50 * MS_NS);
            let responses: Vec<u16> = (0..5).map(|_| connection.get(&log_path).status).collect();
            assert_eq!(
                responses,
                [200, 200, 200, 200, 429],
                "sliding log a window later"
            );
        }

        sleep_until((k + 1) * WINDOW_NS + phase_ms * MS_NS);
        let sent = monotonic_ns();
        let statuses: Vec<u16> = (0..4)
            .map(|_| connection.get(&window_path(probe)).status)
            .collect();
        let received = monotonic_ns();
        // The four requests must all be decided between the same two thresholds.
        // sleep_until never returns early: `sent` is in window k+1 or later.
        let next_start = (k + 1) * WINDOW_NS;
        let quarter = |ns: u64| (ns - next_start) / (WINDOW_NS / 4);
        if quarter(sent) != quarter(received) || received / WINDOW_NS != k + 1 {
            return Err(Missed(format!(
                "attempt {attempt}: probe at {phase_ms} ms ran from {} to {} ms into window k+1",
                (sent - next_start) / MS_NS,
                (received - next_start) / MS_NS,
            )));
        }
        let passes = quarter(sent) as usize;
        let mut expected = vec![200; passes];
        expected.resize(4, 429);
        assert_eq!(
            statuses, expected,
            "sliding window, {phase_ms} ms into the window after 4 requests: estimate \
             4 · (1 − {phase_ms}/1000), so {passes} more pass"
        );
    }
    Ok(())
}
