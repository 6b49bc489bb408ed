//! "The same code": one timeline of requests sent to real nginx and fed to the
//! `ratelimit-replay` binary must get the same decision, request by request, for
//! `leaky_bucket` (nodelay), `token_bucket` and `sliding_log`.
//!
//! The planned offsets keep every decision at least [`PLAN_MARGIN`] away from a threshold
//! (checked with the algorithm crate before anything is sent); the replay gets the offsets at
//! which the requests really left, measured here. nginx decides a moment later than that
//! (the request's way in, well under a millisecond on loopback): a run in which a request was
//! sent within [`RUN_MARGIN`] of a threshold anyway (the machine stalled) proves nothing and is
//! run again with fresh keys.
//!
//! `sliding_window` is left out: its windows are aligned at multiples of W on the caller's
//! clock, CLOCK_MONOTONIC in nginx and the timeline's own zero in the tool, so the same
//! offsets fall at different phases of the window (t/sliding.rs tests its edges in nginx).

mod common;

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::nginx::replay_binary;
use common::{Connection, Nginx, Response};
use ratelimit_core::replay::{policy_from_specs, Replay};
use ratelimit_core::{LimitSpec, Outcome, Policy, ZoneSpec};

/// How far from a threshold every planned decision is.
const PLAN_MARGIN: Duration = Duration::from_millis(50);
/// How far from a threshold every decision must be at the times requests really left.
const RUN_MARGIN: Duration = Duration::from_millis(10);
const ATTEMPTS: usize = 3;

/// A limit as written in nginx.conf: `rate_limit_zone $arg_k zone=NAME:1m ZONE;` and
/// `rate_limit zone=NAME LIMIT;`, the words the replay tool takes as `--zone` and `--limit`.
struct Limit {
    name: &'static str,
    zone: &'static str,
    limit: &'static str,
}

const LIMITS: [Limit; 3] = [
    Limit {
        name: "leaky",
        zone: "rate=4r/s",
        limit: "burst=2 nodelay",
    },
    Limit {
        name: "token",
        zone: "rate=2r/s burst=4 algorithm=token_bucket",
        limit: "",
    },
    Limit {
        name: "log",
        zone: "rate=3r/s algorithm=sliding_log",
        limit: "",
    },
];

/// (offset ms, key): 30 requests over 3 s, each sent to every limit's location in turn.
const PLAN: [(u64, &str); 30] = [
    (0, "a"),
    (40, "a"),
    (80, "a"),
    (120, "a"),
    (160, "a"),
    (170, "a"),
    (300, "b"),
    (380, "b"),
    (460, "b"),
    (700, "a"),
    (820, "a"),
    (900, "c"),
    (960, "c"),
    (1020, "c"),
    (1050, "c"),
    (1090, "c"),
    (1360, "b"),
    (1500, "a"),
    (1580, "a"),
    (1660, "a"),
    (1820, "c"),
    (1960, "c"),
    (2000, "b"),
    (2040, "b"),
    (2080, "b"),
    (2120, "b"),
    (2400, "a"),
    (2560, "a"),
    (2700, "c"),
    (3000, "b"),
];

fn config() -> String {
    let mut config = common::config().server("add_header X-Limit $rate_limit_status always;");
    for Limit { name, zone, limit } in &LIMITS {
        config = config
            .http(&format!("rate_limit_zone $arg_k zone={name}:1m {zone};"))
            .locations(&format!(
                "location = /{name} {{ rate_limit zone={name} {limit}; empty_gif; }}"
            ));
    }
    config.build()
}

/// The policy the replay tool builds from the same words.
fn policy(limit: &Limit) -> Policy {
    let zone_words: Vec<&str> = limit.zone.split_whitespace().collect();
    let limit_words: Vec<&str> = limit.limit.split_whitespace().collect();
    let zone = ZoneSpec::parse_words(&zone_words).expect("zone words");
    let limit = LimitSpec::parse_words(&limit_words).expect("limit words");
    policy_from_specs(&zone, Some(&limit)).expect("policy")
}

/// The requests (as indexes into `times`) whose decision would change if that request alone
/// came `margin` earlier or later, the ones before it being where they are.
fn near_a_threshold(policy: &Policy, times: &[(Duration, String)], margin: Duration) -> Vec<usize> {
    let mut replay = Replay::new(*policy);
    let mut near = Vec::new();
    for (index, (time, key)) in times.iter().enumerate() {
        let at = |time: Duration| replay.clone().decide(key, time.as_nanos() as u64).outcome;
        let early = at(time.saturating_sub(margin));
        let late = at(*time + margin);
        let outcome = replay.decide(key, time.as_nanos() as u64).outcome;
        if early != outcome || late != outcome {
            near.push(index);
        }
    }
    near
}

/// One request as sent to nginx: which limit, its key, when it left (from the timeline's
/// start) and what nginx answered.
struct Sent {
    limit: usize,
    key: String,
    at: Duration,
    response: Response,
}

/// Sends the plan on one keep-alive connection, one request after another: each is answered
/// at once (nothing here delays), so the order nginx sees is the order sent.
fn send_plan(nginx: &Nginx, attempt: usize) -> Vec<Sent> {
    let mut connection = Connection::open(nginx.port());
    let start = Instant::now();
    let mut sent = Vec::new();
    for (offset_ms, key) in PLAN {
        let key = format!("{key}{attempt}");
        let due = start + Duration::from_millis(offset_ms);
        thread::sleep(due.saturating_duration_since(Instant::now()));
        for (limit, Limit { name, .. }) in LIMITS.iter().enumerate() {
            let at = start.elapsed();
            let response = connection.get(&format!("/{name}?k={key}"));
            sent.push(Sent {
                limit,
                key: key.clone(),
                at,
                response,
            });
        }
    }
    sent
}

/// The `ratelimit-replay --json` decisions for `times`, in order.
fn run_replay(limit: &Limit, times: &[(Duration, String)]) -> Vec<String> {
    let mut input = String::new();
    for (at, key) in times {
        let _ = writeln!(input, "{}.{:09} {key}", at.as_secs(), at.subsec_nanos());
    }
    let mut command = Command::new(replay_binary());
    command.args(["--json", "--zone", limit.zone]);
    if !limit.limit.is_empty() {
        command.args(["--limit", limit.limit]);
    }
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot run ratelimit-replay");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin
        .write_all(input.as_bytes())
        .expect("write the timeline");
    drop(stdin);
    let output = child.wait_with_output().expect("ratelimit-replay output");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "ratelimit-replay failed: {}\ninput:\n{input}",
        String::from_utf8_lossy(&output.stderr)
    );
    let decisions: Vec<String> = stdout
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).expect("a JSON line"))
        .filter_map(|object| object["decision"].as_str().map(str::to_string))
        .collect();
    assert_eq!(
        decisions.len(),
        times.len(),
        "ratelimit-replay printed:\n{stdout}"
    );
    decisions
}

/// nginx's decision: the status, and `$rate_limit_status` in `X-Limit`.
fn nginx_decision(response: &Response) -> String {
    let status = response.header("X-Limit").unwrap_or("-");
    match (response.status, status) {
        (200, "PASSED") => "PASSED".to_string(),
        (429, "REJECTED") => "REJECTED".to_string(),
        (code, status) => format!("{code} {status}"),
    }
}

/// The plan must be worth running: every decision at least [`PLAN_MARGIN`] from a threshold,
/// passes and rejections for every limit, and a different pattern for each (so a tool running
/// the wrong algorithm or parameters would not agree by chance).
fn check_plan() {
    let plan: Vec<(Duration, String)> = PLAN
        .iter()
        .map(|&(ms, key)| (Duration::from_millis(ms), key.to_string()))
        .collect();
    let mut patterns: Vec<Vec<Outcome>> = Vec::new();
    for limit in &LIMITS {
        let policy = policy(limit);
        let near = near_a_threshold(&policy, &plan, PLAN_MARGIN);
        let mut replay = Replay::new(policy);
        let outcomes: Vec<Outcome> = plan
            .iter()
            .map(|(at, key)| replay.decide(key, at.as_nanos() as u64).outcome)
            .collect();
        let table: String = plan
            .iter()
            .zip(&outcomes)
            .enumerate()
            .map(|(i, ((at, key), outcome))| format!("  {i:>2} {at:>8?} {key} {outcome:?}\n"))
            .collect();
        assert!(
            near.is_empty(),
            "{}: planned requests {near:?} are too close to a threshold:\n{table}",
            limit.name
        );
        assert!(
            outcomes.contains(&Outcome::Passed) && outcomes.contains(&Outcome::Rejected),
            "{}: the plan should see passes and rejections:\n{table}",
            limit.name
        );
        assert!(
            !patterns.contains(&outcomes),
            "{}: the plan decides as for another limit:\n{table}",
            limit.name
        );
        patterns.push(outcomes);
    }
}

#[test]
fn replay_decides_like_nginx() {
    check_plan();
    let nginx = Nginx::start(&config());
    let mut stalls = Vec::new();
    for attempt in 0..ATTEMPTS {
        let sent = send_plan(&nginx, attempt);
        let per_limit: Vec<Vec<&Sent>> = (0..LIMITS.len())
            .map(|limit| sent.iter().filter(|s| s.limit == limit).collect())
            .collect();
        let stalled: Vec<String> = LIMITS
            .iter()
            .zip(&per_limit)
            .filter_map(|(limit, sent)| {
                let times: Vec<(Duration, String)> =
                    sent.iter().map(|s| (s.at, s.key.clone())).collect();
                let near = near_a_threshold(&policy(limit), &times, RUN_MARGIN);
                (!near.is_empty()).then(|| format!("{}: requests {near:?}", limit.name))
            })
            .collect();
        if !stalled.is_empty() {
            stalls.push(format!("attempt {attempt}: {stalled:?}"));
            continue;
        }

        let mut table = String::new();
        let mut mismatches = 0;
        for (limit, sent) in LIMITS.iter().zip(&per_limit) {
            let times: Vec<(Duration, String)> =
                sent.iter().map(|s| (s.at, s.key.clone())).collect();
            let replayed = run_replay(limit, &times);
            for (s, replayed) in sent.iter().zip(&replayed) {
                let decided = nginx_decision(&s.response);
                let mark = if decided == *replayed {
                    ""
                } else {
                    mismatches += 1;
                    "  <-- differs"
                };
                let _ = writeln!(
                    table,
                    "  {:<6} {:>9.3} ms {:<3} nginx {decided:<9} replay {replayed}{mark}",
                    limit.name,
                    s.at.as_secs_f64() * 1000.0,
                    s.key
                );
            }
        }
        assert_eq!(
            mismatches, 0,
            "nginx and ratelimit-replay disagree:\n{table}"
        );
        return;
    }
    panic!("every attempt sent requests too close to a threshold:\n{stalls:#?}");
}

/// Issue 22's calibration: a log recorded before a login limit is turned on (the upstream's
/// 401s and 200s, `$msec` times), replayed with `block=` and `on_status=`, decides every
/// request as nginx with that limit decides the same traffic: the guesser's six attempts,
/// its rejection and block, the successful logins never counted, a person's few mistakes.
/// Over the second and a half the traffic takes, the bucket drains a tenth of a request: no
/// decision is near a threshold.
#[test]
fn replay_reproduces_a_login_limit_from_an_access_log() {
    const ZONE: &str = "rate=5r/m burst=5 block=15m";
    const LIMIT: &str = "nodelay on_status=401,403";
    const FORMAT: &str = "$msec $http_x_key \"$request\" $status";
    let upstream = "server { listen 127.0.0.1:%%PORT2%%;\n\
                    location / { if ($http_x_fail) { return 401; } return 200; } }";
    let recorder = common::config()
        .http(&format!("log_format replay '{FORMAT}';"))
        .http(upstream)
        .locations(
            "location / { access_log logs/replay.log replay;\n\
             proxy_pass http://127.0.0.1:%%PORT2%%; }",
        )
        .start();
    let limited = common::config()
        .http(&format!(
            "rate_limit_zone $http_x_key zone=login:1m {ZONE};"
        ))
        .http(upstream)
        .locations(&format!(
            "location / {{ rate_limit zone=login {LIMIT};\n\
             add_header X-Limit $rate_limit_status always;\n\
             proxy_pass http://127.0.0.1:%%PORT2%%; }}"
        ))
        .start();
    // A script logging in 20 times, a guesser failing 12 times, a person failing 3 times.
    let mut plan = Vec::new();
    for i in 0..20 {
        plan.push(("script", false));
        if i < 12 {
            plan.push(("guesser", true));
        }
        if i % 6 == 3 {
            plan.push(("person", true));
        }
    }
    let mut to_recorder = Connection::open(recorder.port());
    let mut to_limited = Connection::open(limited.port());
    let mut nginx_decisions = Vec::new();
    for (key, fail) in &plan {
        let mut request = common::Request::get("/login").header("X-Key", key);
        if *fail {
            request = request.header("X-Fail", "1");
        }
        let recorded = to_recorder.send(&request);
        assert_eq!(recorded.status, if *fail { 401 } else { 200 });
        let response = to_limited.send(&request);
        nginx_decisions.push(response.header("X-Limit").unwrap_or("-").to_string());
        thread::sleep(Duration::from_millis(15));
    }
    let log = recorder.prefix().join("logs/replay.log");
    let output = Command::new(replay_binary())
        .args(["--json", "--zone", ZONE, "--limit", LIMIT])
        .args(["--log-format", FORMAT, "--key", "$http_x_key"])
        .arg(&log)
        .output()
        .expect("cannot run ratelimit-replay");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "ratelimit-replay failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let replay_decisions: Vec<String> = stdout
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).expect("a JSON line"))
        .filter_map(|object| object["decision"].as_str().map(str::to_string))
        .collect();
    assert_eq!(replay_decisions, nginx_decisions, "{stdout}");
    let of = |key: &str, decision: &str| {
        plan.iter()
            .zip(&nginx_decisions)
            .filter(|((k, _), d)| *k == key && *d == decision)
            .count()
    };
    assert_eq!(
        (
            of("guesser", "PASSED"),
            of("guesser", "REJECTED"),
            of("guesser", "BLOCKED")
        ),
        (6, 1, 5)
    );
    assert_eq!((of("script", "PASSED"), of("person", "PASSED")), (20, 3));
}
