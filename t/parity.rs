//! Differential test: `rate_limit_zone` / `rate_limit` against nginx's `limit_req_zone` /
//! `limit_req` with the same parameters, in one nginx, fed the same timelines interleaved (both
//! sides see the same clock).
//!
//! Each scenario lists its requests as (offset ms, key) and the decisions limit_req makes for
//! them. The timelines keep every request at least 50 ms away from a decision threshold and
//! every delay far from [`DELAY_THRESHOLD`], so millisecond rounding and scheduling jitter
//! cannot change a decision. [`native_limit_req_makes_the_expected_decisions`] checks the
//! tables against limit_req alone; [`rate_limit_decides_like_limit_req`] compares the module.
//!
//! Excess arithmetic (limit_req, thousandths of a request): each request adds 1000 after the
//! excess drained at the rate since the last accepted request, clamped at 0; above
//! burst * 1000 it is rejected; it waits (excess - delay * 1000) / rate when above delay * 1000.

mod common;

use std::time::Duration;

use common::{describe, run_timeline, Nginx, Outcome, Request, Step};

/// Responses slower than this were delayed; the shortest delay in the scenarios is 400 ms and
/// an undelayed response takes a few milliseconds.
const DELAY_THRESHOLD: Duration = Duration::from_millis(200);
/// How far the module's delay may be from limit_req's.
const DELAY_TOLERANCE: Duration = Duration::from_millis(250);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expected {
    Pass,
    Delay,
    Reject,
}
use Expected::{Delay, Pass, Reject};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Decision {
    Passed,
    Delayed(Duration),
    Rejected,
}

impl Decision {
    fn of(outcome: &Outcome) -> Decision {
        match outcome.status() {
            429 => Decision::Rejected,
            200 if outcome.elapsed() >= DELAY_THRESHOLD => Decision::Delayed(outcome.elapsed()),
            200 => Decision::Passed,
            status => panic!("unexpected status {status}: {:?}", outcome.response),
        }
    }

    fn matches(self, expected: Expected) -> bool {
        matches!(
            (self, expected),
            (Decision::Passed, Pass) | (Decision::Delayed(_), Delay) | (Decision::Rejected, Reject)
        )
    }
}

struct Scenario {
    name: &'static str,
    /// Zone parameters after the key and zone name.
    zone: &'static str,
    /// Parameters after `zone=NAME` of limit_req / rate_limit.
    limit: &'static str,
    /// (offset ms, value of the X-Key header), and limit_req's decision for it.
    requests: &'static [(u64, &'static str, Expected)],
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        // One request per 500 ms: excess 0, 900 (rejected, not stored), then 0 again.
        name: "reject_2rps",
        zone: "rate=2r/s",
        limit: "",
        requests: &[
            (0, "a", Pass),
            (50, "a", Reject),
            (750, "a", Pass),
            (800, "a", Reject),
            (1500, "a", Pass),
        ],
    },
    Scenario {
        // One request per 100 ms: a second one 30 ms later is 70 ms early.
        name: "reject_10rps",
        zone: "rate=10r/s",
        limit: "",
        requests: &[
            (0, "b", Pass),
            (30, "b", Reject),
            (200, "b", Pass),
            (230, "b", Reject),
            (400, "b", Pass),
        ],
    },
    Scenario {
        // Excess 0, 900 (450 ms), 1800 (900 ms), 2700 > 2000 rejected; drained by 1900 ms.
        name: "burst_delay",
        zone: "rate=2r/s",
        limit: "burst=2",
        requests: &[
            (0, "c", Pass),
            (50, "c", Delay),
            (100, "c", Delay),
            (150, "c", Reject),
            (1900, "c", Pass),
        ],
    },
    Scenario {
        // Excess 0, 900, 1800, 2700, 3600 > 3000 rejected; at 800 ms 2700 - 1300 + 1000 = 2400.
        name: "burst_nodelay",
        zone: "rate=2r/s",
        limit: "burst=3 nodelay",
        requests: &[
            (0, "d", Pass),
            (50, "d", Pass),
            (100, "d", Pass),
            (150, "d", Pass),
            (200, "d", Reject),
            (800, "d", Pass),
        ],
    },
    Scenario {
        // Excess 0, 900 (<= 1000: no wait), 1800 (400 ms), 2700 (850 ms), 3600 > 3000 rejected.
        name: "burst_delay_after_one",
        zone: "rate=2r/s",
        limit: "burst=3 delay=1",
        requests: &[
            (0, "e", Pass),
            (50, "e", Pass),
            (100, "e", Delay),
            (150, "e", Delay),
            (200, "e", Reject),
        ],
    },
    Scenario {
        // Keys do not share state.
        name: "keys_apart",
        zone: "rate=2r/s",
        limit: "",
        requests: &[
            (0, "x", Pass),
            (10, "y", Pass),
            (60, "x", Reject),
            (70, "y", Reject),
        ],
    },
];

/// One server with a location per scenario and side: `/limit_req/NAME` and, with the module,
/// `/rate_limit/NAME`. Both sides answer rejections with 429.
fn config(with_module: bool) -> String {
    let mut config = common::config()
        .workers(2)
        .http("limit_req_status 429;")
        .server("add_header X-Pid $pid always;");
    if !with_module {
        config = config.without_module();
    }
    for s in SCENARIOS {
        let (name, zone, limit) = (s.name, s.zone, s.limit);
        config = config
            .http(&format!("limit_req_zone $http_x_key zone=limit_req_{name}:1m {zone};"))
            .locations(&format!(
                "location = /limit_req/{name} {{ limit_req zone=limit_req_{name} {limit}; empty_gif; }}"
            ));
        if with_module {
            config = config
                .http(&format!("rate_limit_zone $http_x_key zone=rate_limit_{name}:1m {zone};"))
                .locations(&format!(
                    "location = /rate_limit/{name} {{ rate_limit zone=rate_limit_{name} {limit}; empty_gif; }}"
                ));
        }
    }
    config.build()
}

/// Every scenario's requests to `/SIDE/NAME`, for each side, interleaved at the same offsets.
fn steps(port: u16, sides: &[&str]) -> Vec<Step> {
    let mut steps = Vec::new();
    for scenario in SCENARIOS {
        for &(at_ms, key, _) in scenario.requests {
            for side in sides {
                let request =
                    Request::get(&format!("/{side}/{}", scenario.name)).header("X-Key", key);
                steps.push(Step::new(at_ms, port, request));
            }
        }
    }
    steps
}

/// Splits outcomes (in the order of [`steps`]) per scenario and side: `[scenario][side][i]`.
fn decisions(outcomes: &[Outcome], sides: usize) -> Vec<Vec<Vec<Decision>>> {
    let mut outcomes = outcomes.iter();
    SCENARIOS
        .iter()
        .map(|scenario| {
            let mut per_side = vec![Vec::new(); sides];
            for _ in scenario.requests {
                for side in per_side.iter_mut() {
                    side.push(Decision::of(outcomes.next().expect("an outcome per step")));
                }
            }
            per_side
        })
        .collect()
}

fn check_expected(scenario: &Scenario, got: &[Decision], table: &str) {
    let expected: Vec<Expected> = scenario.requests.iter().map(|r| r.2).collect();
    assert!(
        got.iter().zip(&expected).all(|(d, e)| d.matches(*e)),
        "limit_req in scenario {}: expected {expected:?}, got {got:?}\n{table}",
        scenario.name
    );
}

#[test]
fn native_limit_req_makes_the_expected_decisions() {
    let nginx = Nginx::start(&config(false));
    let steps = steps(nginx.port(), &["limit_req"]);
    let outcomes = run_timeline(&steps);
    let table = describe(&steps, &outcomes);
    for (scenario, sides) in SCENARIOS.iter().zip(decisions(&outcomes, 1)) {
        check_expected(scenario, &sides[0], &table);
    }
}

#[test]
fn rate_limit_decides_like_limit_req() {
    let nginx = Nginx::start(&config(true));
    let steps = steps(nginx.port(), &["limit_req", "rate_limit"]);
    let outcomes = run_timeline(&steps);
    let table = describe(&steps, &outcomes);
    for (scenario, sides) in SCENARIOS.iter().zip(decisions(&outcomes, 2)) {
        let (native, module) = (&sides[0], &sides[1]);
        check_expected(scenario, native, &table);
        let same = native.iter().zip(module).all(|pair| match pair {
            (Decision::Delayed(a), Decision::Delayed(b)) => a.abs_diff(*b) < DELAY_TOLERANCE,
            (a, b) => a == b,
        });
        assert!(
            same,
            "scenario {}: limit_req decided {native:?}, rate_limit {module:?}\n{table}",
            scenario.name
        );
    }
}

/// Where `set_real_ip_from` / `real_ip_header` are written.
#[derive(Clone, Copy, Debug)]
enum RealIpAt {
    Http,
    Server,
    Location,
}

/// Issue 47: behind a proxy whose address realip replaces by the client's, `rate_limit` keys
/// by `$binary_remote_addr` as `limit_req` does, wherever realip is configured: nginx runs
/// realip's preaccess handler, and compiled-in limit_req after it; the module's handler must
/// run after it too (before, a location-level realip left every client keyed by the proxy's
/// 127.0.0.1: 200 200 200 429 for four clients). Same zone words on both sides,
/// `rate=1r/m burst=2 nodelay`, one nginx per placement, both sides asked in turn.
#[test]
fn rate_limit_keys_by_the_real_ip_like_limit_req() {
    const REALIP: &str = "set_real_ip_from 127.0.0.1; real_ip_header X-Forwarded-For;";
    for at in [RealIpAt::Http, RealIpAt::Server, RealIpAt::Location] {
        let in_location = if matches!(at, RealIpAt::Location) {
            REALIP
        } else {
            ""
        };
        let mut config = common::config()
            .http("limit_req_status 429;")
            .http("limit_req_zone $binary_remote_addr zone=native:1m rate=1r/m;")
            .http("rate_limit_zone $binary_remote_addr zone=module:1m rate=1r/m;")
            .locations(&format!(
                "location = /limit_req {{ {in_location} limit_req zone=native burst=2 nodelay; \
                 empty_gif; }}"
            ))
            .locations(&format!(
                "location = /rate_limit {{ {in_location} rate_limit zone=module burst=2 nodelay; \
                 empty_gif; }}"
            ))
            .locations("location /ratelimit/ { rate_limit_admin; }");
        match at {
            RealIpAt::Http => config = config.http(REALIP),
            RealIpAt::Server => config = config.server(REALIP),
            RealIpAt::Location => {}
        }
        let nginx = config.start();
        // Four clients behind the proxy, one request each; then the first sends three more:
        // its fourth in the minute is over burst=2.
        let clients = ["192.0.2.1", "192.0.2.2", "192.0.2.3", "192.0.2.4"];
        let sequence: Vec<&str> = clients
            .iter()
            .copied()
            .chain(std::iter::repeat_n(clients[0], 3))
            .collect();
        let mut answers = [Vec::new(), Vec::new()];
        for client in &sequence {
            for (side, path) in ["/limit_req", "/rate_limit"].iter().enumerate() {
                let request = common::Request::get(path).header("X-Forwarded-For", client);
                answers[side].push(common::send(nginx.port(), &request).status);
            }
        }
        let expected = vec![200, 200, 200, 200, 200, 200, 429];
        assert_eq!(
            answers[0], expected,
            "{at:?}: limit_req, clients {sequence:?}"
        );
        assert_eq!(
            answers[1], answers[0],
            "{at:?}: rate_limit vs limit_req, clients {sequence:?}"
        );
        let top = common::get(nginx.port(), "/ratelimit/zones/module/top");
        assert_eq!(top.status, 200, "{}", top.text());
        assert!(
            top.text().contains("192.0.2.1") && !top.text().contains("127.0.0.1"),
            "{at:?}: the limited key should be the client's, not the proxy's: {}",
            top.text()
        );
    }
}
