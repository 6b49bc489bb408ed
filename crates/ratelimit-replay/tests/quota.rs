//! Quota zones (`algorithm=quota`) replayed by the built binary: requests are placed in the
//! calendar periods of their times (a log's Unix times; a timeline's seconds from 1970), and
//! a priced usage limit (micro-dollars) is replayed from the cost the module logged.

mod common;

use common::{fails, replay, rows, stdout};

#[test]
fn a_timeline_counts_per_day() {
    // Days 0 and 1 of 1970 in UTC; in New York (UTC-5 then), 03:00 UTC is still day -1.
    let timeline = "0 a\n3600 a\n7200 a\n86400 a\n90000 b\n";
    let output = stdout(&replay(
        &["--zone", "algorithm=quota limit=2 period=day"],
        timeline,
    ));
    let table = rows(&output);
    let decisions: Vec<&str> = table[1..6].iter().map(|row| row[2]).collect();
    assert_eq!(
        decisions,
        ["PASSED", "PASSED", "REJECTED", "PASSED", "PASSED"],
        "{output}"
    );
    // Retry-After of the refusal: the rest of the day, 22 hours.
    assert_eq!(table[3][4], "79200000.000", "{output}");
    assert!(
        output.contains("summary: limit=2 period=day tz=UTC algorithm=quota cost=1"),
        "{output}"
    );
    let a = table
        .iter()
        .find(|row| row.first() == Some(&"a") && row.len() == 5);
    assert_eq!(
        a.unwrap()[4],
        "3",
        "min_limit: a counted 3 on its first day\n{output}"
    );
    let output = stdout(&replay(
        &[
            "--zone",
            "algorithm=quota limit=2 period=day tz=America/New_York",
        ],
        "0 a\n3600 a\n18000 a\n",
    ));
    let decisions: Vec<&str> = rows(&output)[1..4].iter().map(|row| row[2]).collect();
    assert_eq!(decisions, ["PASSED", "PASSED", "PASSED"], "{output}");
}

/// The target replayed: a $1-a-day quota over logged costs of $0.31 and $0.0155
/// admits 4 of 8 and 65 of 80.
#[test]
fn a_priced_quota_over_logged_costs() {
    let format = "$msec $http_authorization $rate_limit_usage_cost";
    for (cost, count, admitted) in [(310_000, 8, 4), (15_500, 80, 65)] {
        let log: String = (0..count)
            .map(|i| format!("{}.000 team {cost}\n", 1_764_900_000 + i))
            .collect();
        let output = stdout(&replay(
            &[
                "--zone",
                "algorithm=quota limit=1000000 period=day tz=Europe/Berlin",
                "--limit",
                "usage=openai prices=models",
                "--log-format",
                format,
                "--key",
                "$http_authorization",
                "--epoch-times",
            ],
            &log,
        ));
        let passed = output
            .lines()
            .filter(|line| line.contains("ADMITTED"))
            .count();
        assert_eq!(passed, admitted, "{output}");
        assert!(
            output.contains(
                "summary: limit=1000000 period=day tz=Europe/Berlin algorithm=quota \
                 usage=openai reserve=1"
            ),
            "{output}"
        );
    }
}

#[test]
fn calibrate_and_plot_are_not_for_quotas() {
    fails(
        &[
            "--zone",
            "algorithm=quota limit=5 period=month",
            "--plot",
            "/tmp/never.svg",
        ],
        "0 a\n",
        "--plot is not available for quota zones",
    );
    fails(
        &[
            "--zone",
            "algorithm=quota limit=5 period=month",
            "--limit",
            "usage=$cost",
            "--calibrate",
            "0",
            "--log-format",
            "$msec $remote_addr $cost",
        ],
        "0 a\n",
        "--calibrate is not available for quota zones",
    );
}
