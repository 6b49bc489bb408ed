//! A test that cannot run against the nginx under test (the Lua tests against the vendored
//! nginx, which Debian's Lua module is not built for) returns early, and says so where
//! `cargo test` shows it.

use std::io::Write;

/// Prints `skipped TEST: REASON` to the process's stderr.
///
/// libtest captures what a test prints with `eprintln!` and shows it only when the test
/// fails, so a skip reported that way is invisible: the test reads `ok` in 0.00 s. A write to
/// the stderr handle itself is not captured, so this line appears in `cargo test`'s output
/// (just before the test's `ok`, or among other lines when tests run in parallel).
pub fn skipped(reason: &str) {
    let test = std::thread::current()
        .name()
        .filter(|name| *name != "main")
        .map(|name| format!(" {name}"))
        .unwrap_or_default();
    let _ = writeln!(std::io::stderr().lock(), "skipped{test}: {reason}");
}
