//! What the binary's tests share: running it on an input, and reading what it printed.
// Each test binary uses its own subset of these.
#![allow(dead_code)]

use std::io::Write;
use std::process::{Command, Output, Stdio};

/// Run `ratelimit-replay ARGS` with `stdin` as its input.
pub fn replay(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ratelimit-replay"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    // The binary may stop reading early (a bad option or line): a write to the closed pipe
    // then fails, and that is not the test's failure.
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    child.wait_with_output().unwrap()
}

/// What a run that succeeded printed (panics with its stderr otherwise).
pub fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).unwrap()
}

/// A `--json` run's objects, one a line.
pub fn json_lines(output: &Output) -> Vec<serde_json::Value> {
    stdout(output)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// The words of each table row, for comparing without caring about column widths.
pub fn rows(text: &str) -> Vec<Vec<&str>> {
    text.lines()
        .map(|line| line.split_whitespace().collect())
        .collect()
}

/// The run fails with exit status 2 and says `message`.
pub fn fails(args: &[&str], stdin: &str, message: &str) {
    let output = replay(args, stdin);
    assert_eq!(output.status.code(), Some(2), "{args:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(message),
        "{stderr:?} should contain {message:?}"
    );
}
