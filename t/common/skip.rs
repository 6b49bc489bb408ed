//! A test that cannot run here fails with the reason, unless the runner declared that it skips
//! what the test needs: `RATE_LIMIT_TEST_SKIP` names the needs it skips, comma-separated.
//!
//! - `lua`: Debian's nginx with its Lua module (`libnginx-mod-http-lua`), which is built for
//!   Debian's nginx only. `.ci/run` declares it in the vendored pass, whose nginx cannot load
//!   it; the Debian pass declares nothing, so there every Lua test runs or fails.
//! - `debian-nginx`: Debian's `/usr/sbin/nginx` beside the nginx under test (the README's
//!   version message, the harness's check that the host's pid file is left alone).
//! - `grpc`: Debian's `python3-grpcio`, the gRPC server and client of t/grpc.rs.
//!
//! `scripts/test.sh` (the README's test command) installs every other package the tests need
//! and declares `debian-nginx` itself when Debian's nginx is not installed (installing it would
//! start a service on port 80), saying so.
//!
//! A skip is never decided by the test alone: a pass whose nginx lost its Lua module, or a
//! machine without Debian's nginx, would otherwise turn every such test into a silent "ok".

use std::io::Write;

/// The environment variable a runner sets to name what its pass skips.
pub const SKIP_VARIABLE: &str = "RATE_LIMIT_TEST_SKIP";

/// The needs the runner declared skipped (`RATE_LIMIT_TEST_SKIP=lua,debian-nginx`).
pub fn declared() -> Vec<String> {
    std::env::var(SKIP_VARIABLE)
        .unwrap_or_default()
        .split(',')
        .map(|need| need.trim().to_string())
        .filter(|need| !need.is_empty())
        .collect()
}

/// `None` when the test can run (`unmet` is `None`): the test goes on. When it cannot,
/// returns `Some(())` if the runner declared `need` skipped (after printing `skipped TEST:
/// REASON` where `cargo test` shows it; the caller returns), and panics with the reason and
/// how to declare the skip otherwise.
///
/// `if skip::unless_declared("lua", lua_unavailable()).is_some() { return; }`
pub fn unless_declared(need: &str, unmet: Option<String>) -> Option<()> {
    let reason = unmet?;
    if declared().iter().any(|declared| declared == need) {
        skipped(&format!(
            "{reason} ({SKIP_VARIABLE} declares \"{need}\" skipped)"
        ));
        return Some(());
    }
    panic!(
        "this test cannot run here: {reason}. A runner that means to skip it says so: \
         {SKIP_VARIABLE}={need} (.ci/run declares what each pass skips)"
    );
}

/// Prints `skipped TEST: REASON` to the process's stderr.
///
/// libtest captures what a test prints with `eprintln!` and shows it only when the test
/// fails, so a skip reported that way is invisible: the test reads `ok` in 0.00 s. A write to
/// the stderr handle itself is not captured, so this line appears in `cargo test`'s output
/// (just before the test's `ok`, or among other lines when tests run in parallel).
fn skipped(reason: &str) {
    let test = std::thread::current()
        .name()
        .filter(|name| *name != "main")
        .map(|name| format!(" {name}"))
        .unwrap_or_default();
    let _ = writeln!(std::io::stderr().lock(), "skipped{test}: {reason}");
}
