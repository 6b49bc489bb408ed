//! The built binary, end to end: table and JSON output, summaries, access logs, errors.

mod common;

use common::{fails, json_lines, replay, rows, stdout};

const TIMELINE: &str = "\
# burst of three for alice, one for bob
0 alice
0 alice
0 alice

0.25 bob
0.5 alice   # leaked one
";

#[test]
fn table_with_summary() {
    let output = replay(&["--zone", "rate=2r/s burst=1"], TIMELINE);
    let text = stdout(&output);
    #[rustfmt::skip]
    let expected: Vec<Vec<&str>> = vec![
        vec!["t", "key", "decision", "delay_ms", "retry_after_ms", "remaining"],
        vec!["0", "alice", "PASSED", "0.000", "0.000", "1"],
        vec!["0", "alice", "DELAYED", "500.000", "0.000", "0"],
        vec!["0", "alice", "REJECTED", "0.000", "500.000", "0"],
        vec!["0.25", "bob", "PASSED", "0.000", "0.000", "1"],
        vec!["0.5", "alice", "DELAYED", "500.000", "0.000", "0"],
        vec![],
        vec!["summary:", "rate=2r/s", "burst=1", "algorithm=leaky_bucket", "cost=1"],
        vec!["key", "passed", "delayed", "rejected", "min_burst"],
        vec!["alice", "1", "2", "1", "2"],
        vec!["bob", "1", "0", "0", "0"],
    ];
    assert_eq!(rows(&text), expected);
}

#[test]
fn json_lines_and_summary_object() {
    let output = replay(
        &[
            "--zone",
            "rate=2r/s burst=5 algorithm=token_bucket",
            "--json",
        ],
        TIMELINE,
    );
    let lines = json_lines(&output);
    assert_eq!(lines.len(), 6);
    let first = &lines[0];
    assert_eq!(first["t"], 0.0);
    assert_eq!(first["key"], "alice");
    assert_eq!(first["decision"], "PASSED");
    assert_eq!(first["delay_ms"], 0.0);
    assert_eq!(first["retry_after_ms"], 0.0);
    assert_eq!(first["remaining"], 4);
    assert_eq!(lines[3]["t"], 0.25);
    let summary = &lines[5]["summary"];
    assert_eq!(summary["algorithm"], "token_bucket");
    assert_eq!(summary["rate"], "2r/s");
    let alice = &summary["keys"][0];
    assert_eq!(
        (&alice["key"], &alice["passed"], &alice["rejected"]),
        (&"alice".into(), &4.into(), &0.into())
    );
    // Three at once, a fourth 0.5 s later with one token back: a bucket of three.
    assert_eq!(alice["min_burst"], 3);
}

#[test]
fn limit_words_override_the_zone() {
    let output = replay(
        &[
            "--zone",
            "rate=2r/s burst=1",
            "--limit",
            "burst=3 nodelay",
            "--json",
        ],
        TIMELINE,
    );
    let lines = json_lines(&output);
    let decisions: Vec<&str> = lines[..5]
        .iter()
        .map(|l| l["decision"].as_str().unwrap())
        .collect();
    assert_eq!(decisions, ["PASSED"; 5]);
    assert_eq!(lines[5]["summary"]["burst"], 3);

    let output = replay(
        &[
            "--zone",
            "rate=1r/s",
            "--limit",
            "cost=2 nodelay burst=1",
            "--json",
        ],
        "0\n2\n",
    );
    let lines = json_lines(&output);
    assert_eq!(lines[0]["decision"], "PASSED");
    assert_eq!(lines[1]["decision"], "PASSED");
    assert_eq!(lines[2]["summary"]["cost"], 2);
}

#[test]
fn sliding_summary_names_requests_per_window() {
    let output = replay(
        &["--zone", "rate=2r/s algorithm=sliding_log"],
        "0\n0.1\n0.2\n0.9\n",
    );
    let text = stdout(&output);
    let rows = rows(&text);
    assert_eq!(rows[3], ["0.2", "-", "REJECTED", "0.000", "800.000", "0"]);
    assert_eq!(
        rows[rows.len() - 2],
        [
            "key",
            "passed",
            "delayed",
            "rejected",
            "min_requests_per_window"
        ]
    );
    assert_eq!(rows[rows.len() - 1], ["-", "2", "0", "2", "4"]);
}

#[test]
fn access_log_keys() {
    let log = "\
1700000000.000 10.0.0.1 - - [14/Nov/2023:22:13:20 +0000] \"GET /a HTTP/1.1\" 200 5 \"-\" \"curl/8\"
1700000000.100 10.0.0.2 - - [14/Nov/2023:22:13:20 +0000] \"GET /b HTTP/1.1\" 200 5 \"-\" \"curl/8\"
1700000000.200 10.0.0.1 - - [14/Nov/2023:22:13:20 +0000] \"GET /a HTTP/1.1\" 200 5 \"-\" \"curl/8\"
";
    let output = replay(
        &["--zone", "rate=1r/s", "--format", "access-log", "--json"],
        log,
    );
    let lines = json_lines(&output);
    let decided: Vec<(&str, &str)> = lines[..3]
        .iter()
        .map(|l| (l["key"].as_str().unwrap(), l["decision"].as_str().unwrap()))
        .collect();
    assert_eq!(
        decided,
        [
            ("10.0.0.1", "PASSED"),
            ("10.0.0.2", "PASSED"),
            ("10.0.0.1", "REJECTED")
        ]
    );
    assert_eq!(lines[0]["t"], 1_700_000_000.0);
    assert_eq!(lines[2]["time"], "2023-11-14T22:13:20.200Z");
    assert_eq!(lines[2]["retry_after_ms"], 800.0);

    // Keyed by the request path instead: field 8.
    let output = replay(
        &[
            "--zone",
            "rate=1r/s",
            "--format",
            "access-log",
            "--key-field",
            "8",
        ],
        log,
    );
    let text = stdout(&output);
    assert!(text.contains("/a"), "{text}");
    // A log's times in RFC 3339 UTC; with --epoch-times as $msec wrote them.
    assert!(
        rows(&text)
            .iter()
            .any(|row| row.get(..3) == Some(&["2023-11-14T22:13:20.200Z", "/a", "REJECTED"][..])),
        "{text}"
    );
    let output = replay(
        &[
            "--zone",
            "rate=1r/s",
            "--format",
            "access-log",
            "--key-field",
            "8",
            "--epoch-times",
        ],
        log,
    );
    let text = stdout(&output);
    assert!(
        rows(&text)
            .iter()
            .any(|row| row.get(..3) == Some(&["1700000000.200", "/a", "REJECTED"][..])),
        "{text}"
    );
}

#[test]
fn reads_a_file_or_dash() {
    let path = std::env::temp_dir().join(format!("ratelimit-replay-{}.txt", std::process::id()));
    std::fs::write(&path, TIMELINE).unwrap();
    let from_file = stdout(&replay(
        &["--zone", "rate=2r/s burst=1", path.to_str().unwrap()],
        "",
    ));
    let from_dash = stdout(&replay(&["--zone", "rate=2r/s burst=1", "-"], TIMELINE));
    std::fs::remove_file(&path).unwrap();
    assert_eq!(from_file, from_dash);
}

#[test]
fn bad_input_exits_with_two_naming_the_line() {
    let zone = ["--zone", "rate=1r/s"];
    fails(&zone, "0\n\nabc\n", "line 3: invalid time \"abc\"");
    fails(
        &zone,
        "2\n1\n",
        "line 2: time \"1\" is earlier than the previous request's \"2\"",
    );
    fails(&zone, "1 a b\n", "line 1: unexpected \"b\" after the key");
    let access_log = [
        "--zone",
        "rate=1r/s",
        "--format",
        "access-log",
        "--key-field",
        "5",
    ];
    fails(
        &access_log,
        "1.0 10.0.0.1 -\n",
        "line 1: no field 5 for the key",
    );
    fails(
        &["--zone", "rate=1r/s", "/nonexistent/timeline"],
        "",
        "cannot open",
    );
}

#[test]
fn bad_specs_exit_with_two_quoting_the_word() {
    fails(&["--zone", "rate=abc"], "", "invalid rate \"rate=abc\"");
    fails(&["--zone", "burst=5"], "", "must have \"rate\" parameter");
    fails(
        &["--zone", "rate=1r/s algorithm=fast"],
        "",
        "unknown algorithm \"fast\"",
    );
    fails(
        &["--zone", "rate=1r/s", "--limit", "nodelay delay=1"],
        "",
        "cannot be used together",
    );
    fails(
        &[
            "--zone",
            "rate=1r/s algorithm=sliding_window",
            "--limit",
            "burst=2",
        ],
        "",
        "\"burst\" is not used by sliding_window",
    );
    fails(
        &["--zone", "rate=0.001r/d", "--limit", "burst=300"],
        "",
        "burst 300 is too large for rate \"0.001r/d\" (at most 35",
    );
    fails(&[], "", "--zone");
}

/// A request costing more than the bucket holds can never pass: no wait is shown for it.
#[test]
fn a_cost_that_can_never_pass_shows_never() {
    let timeline = "0 alice\n";
    let limit = ["--zone", "rate=1r/s burst=2", "--limit", "cost=4 nodelay"];
    let text = stdout(&replay(&limit, timeline));
    assert_eq!(
        rows(&text)[1],
        ["0", "alice", "REJECTED", "0.000", "never", "3"]
    );
    let json = json_lines(&replay(&[&limit[..], &["--json"]].concat(), timeline));
    assert_eq!(json[0]["retry_after_ms"], serde_json::Value::Null);
    let possible = ["--zone", "rate=1r/s burst=2", "--limit", "cost=3 nodelay"];
    let text = stdout(&replay(&possible, timeline));
    assert_eq!(rows(&text)[1][2], "PASSED");
}

/// An input without a single request is an error that says so, not an empty table.
#[test]
fn empty_input_is_an_error_not_an_empty_table() {
    let zone = ["--zone", "rate=1r/s"];
    for input in ["", "\n\n", "# only a comment\n"] {
        let output = replay(&zone, input);
        assert_eq!(output.status.code(), Some(2), "{input:?}");
        assert!(output.stdout.is_empty(), "{input:?}: {:?}", output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("no requests in the standard input: nothing to replay"),
            "{stderr}"
        );
    }
    let empty = std::env::temp_dir().join(format!("replay-empty-{}.log", std::process::id()));
    std::fs::write(&empty, "").unwrap();
    let path = empty.to_str().unwrap();
    fails(
        &["--zone", "rate=1r/s", "--format", "access-log", path],
        "",
        &format!("no requests in \"{path}\""),
    );
    std::fs::remove_file(&empty).unwrap();
}

/// An access log starting with `$msec` is told from a timeline without --format; read as a
/// timeline on purpose it fails at its first line with a hint.
#[test]
fn access_log_without_format_is_recognised() {
    let log = "1700000000.000 10.0.0.1 - - [14/Nov/2023:22:13:20 +0000] \"GET / HTTP/1.1\" 200 5\n";
    let output = replay(&["--zone", "rate=1r/s"], log);
    assert!(output.status.success(), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stdout).contains("10.0.0.1"));
    fails(
        &["--zone", "rate=1r/s", "--format", "timeline"],
        log,
        "line 1: unexpected \"-\" after the key (an nginx access log? add --format access-log)",
    );
    // A timeline line with one field too many gets no such hint.
    let output = replay(&["--zone", "rate=1r/s"], "1 a b\n");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("--format access-log"), "{stderr}");
}

/// A zone keyed by `$binary_remote_addr` replays by the client address, shown as the
/// module's admin API shows such keys: `127.0.0.1`, `::1`.
#[test]
fn binary_address_keys_are_shown_as_addresses() {
    let log = "\
127.0.0.1 - - [14/Nov/2023:22:13:20 +0000] \"GET /a HTTP/1.1\" 200 5 \"-\" \"curl/8\"
::1 - - [14/Nov/2023:22:13:20 +0000] \"GET /a HTTP/1.1\" 200 5 \"-\" \"curl/8\"
";
    let output = replay(
        &[
            "--zone",
            "rate=1r/s",
            "--key",
            "$binary_remote_addr",
            "--json",
        ],
        log,
    );
    let lines = json_lines(&output);
    let keys: Vec<&str> = lines[..2]
        .iter()
        .map(|line| line["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["127.0.0.1", "::1"]);
}

/// A log whose format changed midway (a `$msec` log, then lines of nginx's default format):
/// the line that does not parse is named with the format in use, the format it reads as,
/// and what to do, not only `invalid time "203.0.113.10"`.
#[test]
fn a_log_mixing_formats_names_both() {
    let msec = "1764615175.000 203.0.113.10 0.001 \"GET / HTTP/1.1\" 200\n";
    let combined =
        "203.0.113.10 - - [01/Dec/2025:18:52:56 +0000] \"GET / HTTP/1.1\" 200 179 \"-\" \"curl/8\"\n";
    let zone = ["--zone", "rate=5r/s"];
    fails(
        &zone,
        &format!("{msec}{combined}"),
        "line 2: invalid time \"203.0.113.10\" (format in use: an access log starting with \
         $msec, the key in field 2; this line reads as nginx's combined format: a log mixing \
         formats is replayed one format at a time, the lines of each in a file of their own; \
         for another log_format give it with --log-format '...')",
    );
    fails(
        &zone,
        &format!("{combined}{msec}"),
        "(format in use: nginx's combined '$remote_addr - $remote_user [$time_local] \
         \"$request\" $status $body_bytes_sent \"$http_referer\" \"$http_user_agent\"'; this \
         line reads as an access log starting with $msec: a log mixing formats",
    );
    fails(
        &zone,
        &format!("0 alice\n{combined}"),
        "line 2: unexpected \"-\" after the key (format in use: a timeline, \"SECONDS [KEY]\" \
         a line; this line reads as nginx's combined format: a log mixing formats",
    );
    // A bad line of the format in use is not called another format.
    let output = replay(&zone, &format!("{msec}abc 203.0.113.10 x\n"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("line 2: invalid time \"abc\""), "{stderr}");
    assert!(!stderr.contains("mixing"), "{stderr}");
}

/// Keys longer than the key column (API keys, IPv6 addresses) do not push the columns after
/// them: the request table shows their start and end around `…`, the summary's column
/// widens to the longest key, `--json` has them whole.
#[test]
fn long_keys_keep_the_columns() {
    let long = "sk-proj-4f9a0c2e7b1d44e8a6b3c5d7e9f01234";
    let ipv6 = "2001:db8:85a3::8a2e:370:7334";
    let timeline = format!("0 {long}\n0 {long}\n0.5 {ipv6}\n1 bob\n");
    let text = stdout(&replay(&["--zone", "rate=1r/s"], &timeline));
    let lines: Vec<&str> = text.lines().collect();
    let words = |line: &str| {
        line.split_whitespace()
            .map(String::from)
            .collect::<Vec<_>>()
    };
    // Every row of the request table has its decision where the header has it (counted in
    // characters: `…` is one).
    let column = lines[0].find("decision").unwrap();
    for line in &lines[1..5] {
        let decision: String = line.chars().skip(column).collect();
        assert!(
            decision.starts_with("PASSED") || decision.starts_with("REJECTED"),
            "{text}"
        );
    }
    assert_eq!(words(lines[1])[1], "sk-proj…e9f01234", "{text}");
    assert_eq!(words(lines[3])[1], "2001:db…370:7334", "{text}");
    assert_eq!(words(lines[4])[1], "bob", "{text}");
    // The summary: whole keys, and its numbers in columns.
    let summary = &lines[lines.len() - 4..];
    assert_eq!(words(summary[0])[0], "key", "{text}");
    let rejected = summary[0].find("rejected").unwrap() + "rejected".len();
    for line in &summary[1..] {
        let last_digit = line.chars().nth(rejected - 1);
        assert!(last_digit.is_some_and(|c| c.is_ascii_digit()), "{text}");
    }
    assert!(summary.iter().any(|line| words(line)[0] == long), "{text}");
    assert!(summary.iter().any(|line| words(line)[0] == ipv6), "{text}");
    // JSON has the key whole.
    let lines = json_lines(&replay(&["--zone", "rate=1r/s", "--json"], &timeline));
    assert_eq!(lines[0]["key"], long);
}
