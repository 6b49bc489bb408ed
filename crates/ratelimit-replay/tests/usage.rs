//! `--limit 'usage=... reserve=N'`: a usage-based (token) limit replayed by the built binary
//! over hand-made access logs whose admissions are worked out below by hand.

mod common;

use common::{fails, json_lines, replay, rows, stdout};

const FORMAT: &str = "$msec $remote_addr $request_time $rate_limit_usage_cost";
const ZONE: &str = "rate=600r/m burst=1000 algorithm=token_bucket";

/// 600 tokens a minute (10 a second), a budget of 1000, reservations of 400. `L` is the
/// key's level (tokens used and not yet refilled); a request is admitted while
/// `L + 400 <= 1000`. In start order (start = end - $request_time):
///
/// | line | start | end  | used | L before | decision | L after settling |
/// |---|---|---|---|---|---|---|
/// | 1 | 1000 | 1000 | 300  | 0          | admitted | 300 (100 refunded) |
/// | 2 | 1000 | 1000 | -    | 300        | admitted | 300 (`-`: refund to 0) |
/// | 4 | 1001 | 1004 | 900  | 290        | admitted | 690 until 1004 |
/// | 3 | 1002 | 1002 | 200  | 680        | refused: 1080 > 1000 (line 4's reservation is held) |
/// | 5 | 1004 | 1004 | 100  | 660 + 500 = 1160 (line 4's overrun) | refused: in debt |
/// | 6 | 1060 | 1060 | 400  | 1160 - 600 = 560 | admitted | 960 |
/// | 7 (other key) | 1060 | 1060 | 50 | 0 | admitted | 50 |
const LOG: &str = "\
1000.000 10.0.0.1 0.000 300
1000.000 10.0.0.1 0.000 -
1002.000 10.0.0.1 0.000 200
1004.000 10.0.0.1 3.000 900
1004.000 10.0.0.1 0.000 100
1060.000 10.0.0.1 0.000 400
1060.000 10.0.0.2 0.000 50
";

fn usage_args<'a>(limit: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["--zone", ZONE, "--limit", limit, "--log-format", FORMAT];
    args.extend_from_slice(extra);
    args
}

#[test]
fn table_by_hand() {
    let output = replay(
        &usage_args("usage=openai reserve=400", &["--epoch-times"]),
        LOG,
    );
    #[rustfmt::skip]
    let expected: Vec<Vec<&str>> = vec![
        vec!["t", "key", "decision", "reserved", "used"],
        vec!["1000.000", "10.0.0.1", "ADMITTED", "400", "300"],
        vec!["1000.000", "10.0.0.1", "ADMITTED", "400", "-(0)"],
        vec!["1001.000", "10.0.0.1", "ADMITTED", "400", "900"],
        vec!["1002.000", "10.0.0.1", "REFUSED", "400", "200"],
        vec!["1004.000", "10.0.0.1", "REFUSED", "400", "100"],
        vec!["1060.000", "10.0.0.1", "ADMITTED", "400", "400"],
        vec!["1060.000", "10.0.0.2", "ADMITTED", "400", "50"],
        vec![],
        vec!["summary:", "rate=600r/m", "burst=1000", "algorithm=token_bucket", "usage=openai",
             "reserve=400"],
        vec!["key", "admitted", "refused", "tokens_admitted", "tokens_refused",
             "tokens_forgiven"],
        vec!["10.0.0.1", "4", "2", "1600", "300", "0"],
        vec!["10.0.0.2", "1", "0", "50", "0", "0"],
    ];
    let text = stdout(&output);
    let got = rows(&text);
    assert_eq!(got[..expected.len()], expected[..]);
    // 1650 tokens over the minute from 1000 to 1060.
    assert!(
        text.contains(
            "tokens admitted: 1650 over 60.000 s (1650 per minute, all keys); the budget \
             refills 600 per minute a key, on top of burst=1000"
        ),
        "{text}"
    );
}

#[test]
fn json_by_hand_with_a_debt_bound() {
    // debt=100: line 4's overrun of 500 at 1004 takes the level from 660 to 1100 (at most
    // 100 past the budget of 1000): 60 are forgiven. Line 6 at 1060 then sees 1100 - 600 =
    // 500 and is admitted as before.
    let output = replay(
        &usage_args(
            "usage=$rate_limit_usage_cost reserve=400 debt=100",
            &["--json"],
        ),
        LOG,
    );
    let lines = json_lines(&output);
    assert_eq!(lines.len(), 8);
    let decisions: Vec<(u64, &str, u64, bool)> = lines[..7]
        .iter()
        .map(|l| {
            (
                l["line"].as_u64().unwrap(),
                l["decision"].as_str().unwrap(),
                l["used"].as_u64().unwrap(),
                l["usage_missing"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        decisions,
        [
            (1, "ADMITTED", 300, false),
            (2, "ADMITTED", 0, true),
            (4, "ADMITTED", 900, false),
            (3, "REFUSED", 200, false),
            (5, "REFUSED", 100, false),
            (6, "ADMITTED", 400, false),
            (7, "ADMITTED", 50, false),
        ]
    );
    assert_eq!(lines[2]["t"], 1001.0);
    assert_eq!(lines[2]["end"], 1004.0);
    assert_eq!(lines[2]["time"], "1970-01-01T00:16:41.000Z");
    let summary = &lines[7]["summary"];
    assert_eq!(
        summary["policy"],
        "rate=600r/m burst=1000 algorithm=token_bucket usage=$rate_limit_usage_cost \
         reserve=400 debt=100"
    );
    let first = &summary["keys"][0];
    assert_eq!(first["key"], "10.0.0.1");
    assert_eq!(
        [
            "admitted",
            "refused",
            "tokens_admitted",
            "tokens_refused",
            "tokens_forgiven"
        ]
        .map(|name| first[name].as_u64().unwrap()),
        [4, 2, 1600, 300, 60]
    );
    assert_eq!(summary["tokens_admitted"], 1650);
    assert_eq!(summary["tokens_admitted_per_minute"], 1650.0);
    assert_eq!(summary["rate_per_minute"], 600.0);
    assert_eq!(summary["span_s"], 60.0);
}

#[test]
fn a_missing_usage_keeps_the_reservation_with_on_missing_keep() {
    // Line 2 now costs its 400: line 1 leaves 300, line 2 leaves 700; line 4 at 1001 sees
    // 690 and 690 + 400 > 1000: refused. Line 3 at 1002: 680 + 400 > 1000, refused. Line 5 at
    // 1004: 660 + 400 > 1000, refused. Line 6 at 1060: 100, admitted.
    let output = replay(
        &usage_args("usage=openai reserve=400 on_missing=keep", &["--json"]),
        LOG,
    );
    let lines = json_lines(&output);
    let got: Vec<(u64, &str, u64)> = lines[..7]
        .iter()
        .map(|l| {
            (
                l["line"].as_u64().unwrap(),
                l["decision"].as_str().unwrap(),
                l["used"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (1, "ADMITTED", 300),
            (2, "ADMITTED", 400),
            (4, "REFUSED", 900),
            (3, "REFUSED", 200),
            (5, "REFUSED", 100),
            (6, "ADMITTED", 400),
            (7, "ADMITTED", 50),
        ]
    );
    let first = &lines[7]["summary"]["keys"][0];
    assert_eq!(first["tokens_admitted"], 1100);
    assert_eq!(first["tokens_refused"], 1200);
}

#[test]
fn without_request_time_a_request_starts_when_it_ended() {
    // The same log without $request_time: line 4 now starts at 1004, after line 3 (1002),
    // which sees 300 - 20 = 280 and is admitted; it leaves 280 + 200 = 480. Line 4 at 1004
    // sees 460 and is admitted (settled at once with its overrun: 460 + 900 = 1360); line 5
    // at the same instant is refused; line 6 at 1060: 1360 - 560 = 800, 1200 > 1000, refused.
    let log: String = LOG
        .lines()
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            format!("{} {} {}\n", fields[0], fields[1], fields[3])
        })
        .collect();
    let output = replay(
        &[
            "--zone",
            ZONE,
            "--limit",
            "usage=openai reserve=400",
            "--log-format",
            "$msec $remote_addr $rate_limit_usage_cost",
            "--json",
        ],
        &log,
    );
    let lines = json_lines(&output);
    let got: Vec<(u64, &str)> = lines[..7]
        .iter()
        .map(|l| (l["line"].as_u64().unwrap(), l["decision"].as_str().unwrap()))
        .collect();
    assert_eq!(
        got,
        [
            (1, "ADMITTED"),
            (2, "ADMITTED"),
            (3, "ADMITTED"),
            (4, "ADMITTED"),
            (5, "REFUSED"),
            (6, "REFUSED"),
            (7, "ADMITTED"),
        ]
    );
}

/// The calibrated burst, as the binary prints it.
fn calibrated(max_refused: &str) -> u64 {
    let output = replay(
        &usage_args(
            "usage=openai reserve=400",
            &["--calibrate", max_refused, "--json"],
        ),
        LOG,
    );
    let lines = json_lines(&output);
    lines[0]["calibration"]["burst"].as_u64().unwrap()
}

/// Requests refused by a replay of LOG with `burst`.
fn refused_with(burst: u64) -> u64 {
    let zone = format!("rate=600r/m burst={burst} algorithm=token_bucket");
    let output = replay(
        &[
            "--zone",
            &zone,
            "--limit",
            "usage=openai reserve=400",
            "--log-format",
            FORMAT,
            "--json",
        ],
        LOG,
    );
    let lines = json_lines(&output);
    let keys = lines.last().unwrap()["summary"]["keys"].as_array().unwrap();
    keys.iter().map(|k| k["refused"].as_u64().unwrap()).sum()
}

#[test]
fn calibration_is_the_smallest_burst() {
    // Refusing nothing: line 3 at 1002 needs 680 + 400 = 1080; it then leaves 880 (a refund
    // of 200), line 4's overrun makes 860 + 500 = 1360 at 1004 and line 5 needs 1760.
    let none = calibrated("0");
    assert_eq!(none, 1760);
    assert_eq!(refused_with(none), 0);
    assert!(refused_with(none - 1) > 0);
    // One refusal (line 5): line 6 at 1060 then sees 1360 - 560 = 800 and needs 1200.
    let one = calibrated("1");
    assert_eq!(one, 1200);
    assert_eq!(refused_with(one), 1);
    assert!(refused_with(one - 1) > 1);
    let output = replay(
        &usage_args("usage=openai reserve=400", &["--calibrate", "0"]),
        LOG,
    );
    assert_eq!(
        stdout(&output),
        "burst=1760: the smallest budget at rate=600r/m that refuses at most 0 of the 7 \
         requests (it refuses 0)\npolicy: rate=600r/m burst=1760 algorithm=token_bucket \
         usage=openai reserve=400\n"
    );
}

#[test]
fn calibration_that_no_budget_reaches_is_an_error() {
    // The first request's overrun puts the key a whole budget in debt (the default bound),
    // whatever the budget: the second, a millisecond later, is refused by every burst.
    fails(
        &usage_args("usage=openai reserve=400", &["--calibrate", "0"]),
        "1000.000 a 0.000 100000000\n1000.001 a 0.000 1\n",
        "--calibrate 0: even burst=",
    );
    fails(
        &usage_args("usage=openai reserve=400", &["--calibrate", "0"]),
        "1000.000 a 0.000 100000000\n1000.001 a 0.000 1\n",
        "refuses 1 of the 2 requests",
    );
}

#[test]
fn errors_name_the_problem() {
    // Usage words on a sliding zone.
    fails(
        &[
            "--zone",
            "rate=600r/m algorithm=sliding_window",
            "--limit",
            "usage=openai reserve=400",
            "--log-format",
            FORMAT,
        ],
        LOG,
        "usage= needs a zone with algorithm=leaky_bucket, token_bucket or quota (a key's \
         overrun is carried as a debt in its bucket or its count); this zone is sliding_window",
    );
    // A usage field that is not a non-negative integer: the line and the value.
    for bad in ["12.5", "-3", "ten"] {
        fails(
            &usage_args("usage=openai reserve=400", &[]),
            &format!("1000.000 a 0.000 300\n1001.000 a 0.000 {bad}\n"),
            &format!(
                "line 2: $rate_limit_usage_cost \"{bad}\" is not a number of tokens: it must \
                 be a non-negative integer, or - (or empty) when the request reported no usage"
            ),
        );
    }
    // A format without the variable.
    fails(
        &usage_args("usage=$upstream_http_x_usage_tokens reserve=400", &[]),
        LOG,
        "each request's tokens are read from the access log's \
         $upstream_http_x_usage_tokens, and --log-format '$msec $remote_addr $request_time \
         $rate_limit_usage_cost' has none",
    );
    fails(
        &["--zone", ZONE, "--limit", "usage=openai reserve=400"],
        LOG,
        "an access log read without --log-format has none: give the log_format that wrote \
         the log with --log-format '... $rate_limit_usage_cost'",
    );
    fails(
        &[
            "--zone",
            ZONE,
            "--limit",
            "usage=openai reserve=400",
            "--format",
            "combined",
        ],
        LOG,
        "and nginx's combined log format",
    );
    // reserve=$variable is refused.
    fails(
        &usage_args("usage=openai reserve=$reserve", &[]),
        LOG,
        "reserve=$reserve is not replayable",
    );
    // --calibrate without usage=.
    fails(
        &["--zone", ZONE, "--calibrate", "0"],
        "0 a\n",
        "--calibrate is for usage-based limits",
    );
    // A bad $request_time.
    fails(
        &usage_args("usage=openai reserve=400", &[]),
        "1000.000 a x 300\n",
        "line 1: $request_time \"x\" is not a duration",
    );
}
