//! Replaying the logs nginx writes by default, and calibrating a login limit on one.
//!
//! `data/login-combined.log` was written by Debian's nginx 1.22 with its default `access_log`
//! (the `combined` format): a server answering `POST /login` with 401 for a wrong password and
//! 200 for the right one, and three clients on their own loopback addresses:
//! 127.0.0.9 tries 60 passwords at about 5 a second (all 401), 127.0.0.2 logs in successfully
//! 30 times (200), 127.0.0.3 mistypes three times and then logs in.

mod common;

use std::path::PathBuf;

use serde_json::Value;

use common::replay;

const LOGIN_LOG: &str = include_str!("data/login-combined.log");
const ATTACKER: &str = "127.0.0.9";
const USER: &str = "127.0.0.2";
const TYPO: &str = "127.0.0.3";

fn json(args: &[&str], stdin: &str) -> Vec<Value> {
    let mut all = args.to_vec();
    all.push("--json");
    let output = replay(&all, stdin);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

fn failure(args: &[&str], stdin: &str) -> String {
    let output = replay(args, stdin);
    assert_eq!(output.status.code(), Some(2), "{args:?}");
    String::from_utf8(output.stderr).unwrap()
}

fn of_key<'a>(lines: &'a [Value], key: &str) -> Vec<&'a Value> {
    lines.iter().filter(|line| line["key"] == key).collect()
}

fn decisions(lines: &[&Value]) -> Vec<String> {
    lines
        .iter()
        .map(|line| line["decision"].as_str().unwrap().to_string())
        .collect()
}

fn summary_of<'a>(lines: &'a [Value], key: &str) -> &'a Value {
    let summary = &lines.last().unwrap()["summary"]["keys"];
    summary
        .as_array()
        .unwrap()
        .iter()
        .find(|entry| entry["key"] == key)
        .unwrap()
}

/// The stock `combined` log is read without any flag: every line a request keyed by
/// `$remote_addr`, its whole-second time spread over the second in log order.
#[test]
fn a_combined_log_is_read_without_flags() {
    let lines = json(&["--zone", "rate=100r/s"], LOGIN_LOG);
    let requests = &lines[..lines.len() - 1];
    assert_eq!(requests.len(), LOGIN_LOG.lines().count());
    assert_eq!(of_key(requests, ATTACKER).len(), 60);
    assert_eq!(of_key(requests, USER).len(), 30);
    assert_eq!(of_key(requests, TYPO).len(), 4);
    // 01/Dec/2026:18:52:55 +0000 is 1796151175: the k lines of that second are placed 1/k s
    // apart, in log order.
    let first_second: Vec<f64> = requests
        .iter()
        .map(|line| line["t"].as_f64().unwrap())
        .take_while(|&t| t < 1_796_151_176.0)
        .collect();
    let count = LOGIN_LOG
        .lines()
        .filter(|line| line.contains("18:52:55 +0000"))
        .count();
    assert_eq!(first_second.len(), count);
    assert_eq!(first_second[0], 1_796_151_175.0);
    for (index, &t) in first_second.iter().enumerate() {
        let expected = 1_796_151_175.0 + index as f64 / count as f64;
        assert!((t - expected).abs() < 0.001, "{index}: {t} vs {expected}");
    }
    // Times never go backwards and the lines keep their order.
    let numbers: Vec<u64> = requests
        .iter()
        .map(|line| line["line"].as_u64().unwrap())
        .collect();
    assert!(numbers.windows(2).all(|pair| pair[0] < pair[1]));
    assert!(requests
        .windows(2)
        .all(|pair| pair[0]["t"].as_f64() <= pair[1]["t"].as_f64()));

    // The same with --format combined, and the table shows the placed times.
    let output = replay(
        &["--zone", "rate=100r/s", "--format", "combined"],
        LOGIN_LOG,
    );
    let table = String::from_utf8(output.stdout).unwrap();
    let second_of = |row: usize| {
        let line = table.lines().nth(row).unwrap();
        line.split_whitespace().next().unwrap().to_string()
    };
    assert_eq!(second_of(1), "2026-12-01T18:52:55.000Z", "{table}");
    let placed = format!("2026-12-01T18:52:55.{:03}Z", 1000 / count);
    assert_eq!(second_of(2), placed, "{table}");
    let output = replay(
        &[
            "--zone",
            "rate=100r/s",
            "--format",
            "combined",
            "--epoch-times",
        ],
        LOGIN_LOG,
    );
    let table = String::from_utf8(output.stdout).unwrap();
    assert!(
        table.lines().nth(1).unwrap().starts_with("1796151175.000 "),
        "{table}"
    );
}

/// Issue 22's calibration: `rate=5r/m burst=5 block=15m` with `on_status=401` on last
/// week's log stops the password guesser after 6 attempts and never touches the users.
#[test]
fn a_login_limit_is_calibrated_on_an_access_log() {
    let zone = ["--zone", "rate=5r/m burst=5 block=15m block_max=24h"];
    let lines = json(
        &[zone[0], zone[1], "--limit", "nodelay on_status=401,403"],
        LOGIN_LOG,
    );
    let attacker = of_key(&lines, ATTACKER);
    let mut expected = vec!["PASSED"; 6];
    expected.push("REJECTED");
    expected.extend(["BLOCKED"; 53]);
    assert_eq!(decisions(&attacker), expected);
    assert!(attacker[..6].iter().all(|line| line["charged"] == true));
    let block = &attacker[6]["block"];
    // The rejection that starts the block says to come back when it ends.
    assert_eq!(attacker[6]["retry_after_ms"], 900_000.0);
    assert_eq!(
        (block["level"].as_u64(), block["duration_ms"].as_f64()),
        (Some(0), Some(900_000.0))
    );
    // Retry-After of a blocked request is the time left of the block.
    let blocked_at = attacker[7]["t"].as_f64().unwrap();
    let until = block["until"].as_f64().unwrap();
    let left_ms = attacker[7]["retry_after_ms"].as_f64().unwrap();
    assert!((left_ms - (until - blocked_at) * 1000.0).abs() < 1.0);
    assert!(left_ms > 890_000.0 && left_ms <= 900_000.0, "{left_ms}");

    // The user's 30 successful logins pass and are never counted; the typos are counted and
    // pass.
    let user = of_key(&lines, USER);
    assert_eq!(decisions(&user), vec!["PASSED"; 30]);
    assert!(user.iter().all(|line| line["charged"] == false));
    let typo = of_key(&lines, TYPO);
    assert_eq!(decisions(&typo), vec!["PASSED"; 4]);
    let charged: Vec<bool> = typo.iter().map(|l| l["charged"] == true).collect();
    assert_eq!(charged, [true, true, true, false]);

    let summary = summary_of(&lines, ATTACKER);
    assert_eq!(
        (
            &summary["passed"],
            &summary["rejected"],
            &summary["blocked"],
            &summary["blocks"]
        ),
        (&6.into(), &1.into(), &53.into(), &1.into())
    );
    assert_eq!(summary_of(&lines, USER)["uncharged"], 30);

    // The same limit without on_status would lock the user out: that is what the replay is
    // for.
    let lines = json(&[zone[0], zone[1], "--limit", "nodelay"], LOGIN_LOG);
    let user = of_key(&lines, USER);
    assert_eq!(decisions(&user)[..6], ["PASSED"; 6]);
    assert_eq!(decisions(&user)[6], "REJECTED");
    assert!(decisions(&user)[7..].iter().all(|d| d == "BLOCKED"));

    // The table shows the block once, on the rejection that started it, and BLOCKED after.
    let output = replay(
        &[zone[0], zone[1], "--limit", "nodelay on_status=401"],
        LOGIN_LOG,
    );
    let table = String::from_utf8(output.stdout).unwrap();
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "t",
            "key",
            "decision",
            "delay_ms",
            "retry_after_ms",
            "remaining",
            "status",
            "charged",
            "block"
        ]
    );
    let blocks: Vec<&str> = table.lines().filter(|l| l.contains("level=")).collect();
    assert_eq!(blocks.len(), 1, "{table}");
    assert!(blocks[0].contains(ATTACKER) && blocks[0].contains("REJECTED"));
    assert!(
        blocks[0].trim_end().ends_with("15m,level=0"),
        "{}",
        blocks[0]
    );
    assert!(table.contains(
        "summary: rate=5r/m burst=5 nodelay algorithm=leaky_bucket cost=1 \
                            block=15m block_max=1d on_status=401"
    ));
}

/// on_status needs statuses: a timeline has none, and a log format without $status neither.
#[test]
fn on_status_needs_a_status() {
    let message = failure(
        &["--zone", "rate=1r/s", "--limit", "on_status=401"],
        "0 a\n",
    );
    assert!(
        message.contains("on_status needs each request's status"),
        "{message}"
    );
    let message = failure(
        &[
            "--zone",
            "rate=1r/s",
            "--limit",
            "on_status=401",
            "--log-format",
            "$msec $remote_addr",
        ],
        "1.0 a\n",
    );
    assert!(
        message.contains("the --log-format log format has no $status"),
        "{message}"
    );
    let message = failure(&["--zone", "rate=1r/s", "--limit", "on_status=4x"], "0\n");
    assert!(
        message.contains("invalid on_status value \"on_status=4x\""),
        "{message}"
    );
    let message = failure(&["--zone", "rate=1r/s block=15x"], "0\n");
    assert!(
        message.contains("invalid block value \"block=15x\""),
        "{message}"
    );
}

/// Any log_format: `$time_iso8601` times, the key from another variable, a composite key.
#[test]
fn a_custom_log_format_and_key() {
    let log = "\
2026-12-01T19:00:00+01:00 10.0.0.1 \"GET /api/a HTTP/1.1\" 200 key-one
2026-12-01T19:00:00+01:00 10.0.0.2 \"GET /api/b HTTP/1.1\" 200 key-one
2026-12-01T19:00:00+01:00 10.0.0.1 \"GET /api/c HTTP/1.1\" 200 key-two
2026-12-01T19:00:01+01:00 10.0.0.1 \"GET /api/d HTTP/1.1\" 200 key-one
";
    let format = "$time_iso8601 $remote_addr \"$request\" $status $http_x_api_key";
    let lines = json(
        &[
            "--zone",
            "rate=1r/s",
            "--log-format",
            format,
            "--key",
            "$http_x_api_key",
        ],
        log,
    );
    let keys: Vec<(&str, &str)> = lines[..4]
        .iter()
        .map(|l| (l["key"].as_str().unwrap(), l["decision"].as_str().unwrap()))
        .collect();
    // key-one at 0 and 1/3 s: the second is over 1r/s; a second later it passes again.
    assert_eq!(
        keys,
        [
            ("key-one", "PASSED"),
            ("key-one", "REJECTED"),
            ("key-two", "PASSED"),
            ("key-one", "PASSED")
        ]
    );
    // 19:00:00+01:00 is 18:00:00 UTC.
    assert_eq!(lines[0]["t"], 1_796_148_000.0);
    let lines = json(
        &[
            "--zone",
            "rate=1r/s",
            "--log-format",
            format,
            "--key",
            "$binary_remote_addr:$http_x_api_key",
        ],
        log,
    );
    assert_eq!(lines[2]["key"], "10.0.0.1:key-two");

    let message = failure(
        &[
            "--zone",
            "rate=1r/s",
            "--log-format",
            format,
            "--key",
            "$cookie_user",
        ],
        log,
    );
    assert!(
        message.contains("needs \"$cookie_user\", which the log format does not log"),
        "{message}"
    );
    let message = failure(
        &[
            "--zone",
            "rate=1r/s",
            "--log-format",
            "$remote_addr $status",
        ],
        log,
    );
    assert!(
        message.contains("it needs $msec, $time_iso8601 or $time_local"),
        "{message}"
    );
}

/// A line that does not parse: its number, what was expected where, the format in use, and
/// what to do.
#[test]
fn a_line_that_does_not_parse_names_the_format() {
    let mut log = LOGIN_LOG.lines().take(2).collect::<Vec<_>>().join("\n");
    log.push_str("\n127.0.0.9 - - 01/Dec/2026:18:53:00 \"GET / HTTP/1.1\" 200 3 \"-\" \"-\"\n");
    let message = failure(&["--zone", "rate=1r/s"], &log);
    assert!(
        message.contains(
            "line 3: does not match the combined log format: column 13: expected $remote_user \
             and then \" [\", found \"- 01/Dec/2026:18:53:00 \"...\""
        ),
        "{message}"
    );
    assert!(message.contains("format in use: nginx's combined '$remote_addr - $remote_user"));
    assert!(message.contains("give it with --log-format"), "{message}");

    // A first line in no known format: what was tried, and the way out.
    let message = failure(&["--zone", "rate=1r/s"], "GET / 200 from 10.0.0.1\n");
    assert!(
        message.contains("line 1: not a format read without --log-format"),
        "{message}"
    );
    assert!(
        message.contains("not nginx's combined: column"),
        "{message}"
    );
    assert!(message.contains("--log-format '...'"), "{message}");

    // A custom format that is not the log's.
    let message = failure(
        &[
            "--zone",
            "rate=1r/s",
            "--log-format",
            "$msec $remote_addr $status",
        ],
        LOGIN_LOG,
    );
    assert!(
        message.contains("line 1: invalid $msec \"127.0.0.9\""),
        "{message}"
    );
    assert!(message.contains("format in use: --log-format '$msec $remote_addr $status'"));
}

/// Workers finishing at a second's edge can write a line a second older than the one before
/// it: it counts in the newer second. Older than that is refused.
#[test]
fn whole_second_logs_tolerate_a_second_of_disorder() {
    let line = |second: u32| {
        format!("10.0.0.1 - - [01/Dec/2026:18:00:{second:02} +0000] \"GET / HTTP/1.1\" 200 3\n")
    };
    let log = [line(1), line(2), line(1), line(3)].concat();
    let lines = json(&["--zone", "rate=100r/s"], &log);
    let times: Vec<f64> = lines[..4]
        .iter()
        .map(|l| l["t"].as_f64().unwrap())
        .collect();
    let base = 1_796_148_000.0;
    assert_eq!(times, [base + 1.0, base + 2.0, base + 2.5, base + 3.0]);
    let log = [line(3), line(1)].concat();
    let message = failure(&["--zone", "rate=100r/s"], &log);
    assert!(
        message
            .contains("line 2: time \"01/Dec/2026:18:00:01 +0000\" is earlier than the previous"),
        "{message}"
    );
}

/// `--plot` says where it wrote, and labels the axis with wall-clock times.
#[test]
fn plot_says_where_and_shows_wall_clock_times() {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("login.svg");
    let _ = std::fs::remove_file(&path);
    let output = replay(
        &[
            "--zone",
            "rate=5r/m burst=5 block=15m",
            "--limit",
            "nodelay on_status=401",
            "--plot",
            path.to_str().unwrap(),
        ],
        LOGIN_LOG,
    );
    assert!(output.status.success());
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(
        stderr,
        format!(
            "ratelimit-replay: plot written to {} (3 of 3 keys drawn)\n",
            path.display()
        )
    );
    let svg = std::fs::read_to_string(&path).unwrap();
    let document = roxmltree::Document::parse(&svg).expect("valid XML");
    let ticks: Vec<&str> = document
        .descendants()
        .filter(|node| node.attribute("class") == Some("tick"))
        .filter_map(|node| node.text())
        .collect();
    assert!(!ticks.is_empty());
    assert!(ticks.contains(&"18:53:00"), "{ticks:?}");
    assert!(
        ticks.iter().all(|tick| !tick.contains("17961")),
        "{ticks:?}"
    );
    assert!(svg.contains("time (UTC), from 2026-12-01 18:52:55"));
    // The attacker's block is drawn, at level 0.
    let blocks: Vec<&str> = document
        .descendants()
        .filter(|node| node.attribute("class") == Some("block"))
        .filter_map(|node| node.attribute("data-level"))
        .collect();
    assert_eq!(blocks, ["0"]);
}

/// An option the input's format does not read is an error that says which one it reads.
#[test]
fn key_options_of_another_format_are_refused() {
    let message = failure(&["--zone", "rate=1r/s", "--key-field", "3"], LOGIN_LOG);
    assert!(
        message.contains("--key-field is for access logs starting with $msec"),
        "{message}"
    );
    let msec_log = "1700000000.000 10.0.0.1 \"GET / HTTP/1.1\" 200\n";
    let message = failure(&["--zone", "rate=1r/s", "--key", "$remote_addr"], msec_log);
    assert!(
        message.contains("name the key's field with --key-field N"),
        "{message}"
    );
    let message = failure(&["--zone", "rate=1r/s", "--key", "$remote_addr"], "0 a\n");
    assert!(
        message.contains("a timeline line is \"SECONDS [KEY]\""),
        "{message}"
    );
    let message = failure(
        &[
            "--zone",
            "rate=1r/s",
            "--format",
            "combined",
            "--key-field",
            "2",
        ],
        LOGIN_LOG,
    );
    assert!(
        message.contains("--key-field is for access logs"),
        "{message}"
    );
}
