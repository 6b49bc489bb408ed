//! What the concurrency tests ask of a running nginx: a request on a chosen worker, a key's
//! standing in a concurrency zone through the admin API, and waiting for it to settle.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::http::{get, Connection, PendingRequest, Request};
use super::nginx::Nginx;

/// Far longer than anything the tests wait for needs, even on a loaded machine.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// A request carrying the key header the tests' zones are keyed on.
pub fn keyed(path: &str, key: &str) -> Request {
    Request::get(path).header("X-Key", key)
}

/// A request sent on a connection that worker `pid` holds (found by asking `/pid` on new
/// connections until that worker answers), so that the test knows who serves it.
pub fn start_on_worker(port: u16, pid: u32, request: &Request) -> PendingRequest {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let mut connection = Connection::open(port);
        if connection.get("/pid").text().trim() == pid.to_string() {
            return connection.start(request);
        }
        assert!(
            Instant::now() < deadline,
            "worker {pid} accepted no connection"
        );
    }
}

/// The key's state through the admin API; `None` when the zone does not track it.
pub fn key_state(nginx: &Nginx, zone: &str, key: &str) -> Option<Value> {
    let response = get(nginx.port(), &format!("/admin/zones/{zone}/keys/{key}"));
    match response.status {
        200 => Some(serde_json::from_slice(&response.body).expect("key JSON")),
        404 if response.text().contains("is not tracked in zone") => None,
        status => panic!("GET key: {status} {}", response.text()),
    }
}

/// `(in_flight, queued)` of a key in a concurrency zone; `(0, 0)` when it is not tracked.
pub fn standing(nginx: &Nginx, zone: &str, key: &str) -> (u64, u64) {
    key_state(nginx, zone, key).map_or((0, 0), |state| {
        (
            state["in_flight"].as_u64().expect("in_flight"),
            state["queued"].as_u64().expect("queued"),
        )
    })
}

/// Wait until `read` returns `expected`; panics with the last value (and nginx's error
/// log) after [`PATIENCE`].
pub fn wait_until<T: PartialEq + std::fmt::Debug>(
    nginx: &Nginx,
    what: &str,
    expected: T,
    mut read: impl FnMut() -> T,
) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let value = read();
        if value == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: still {value:?} after {PATIENCE:?}, expected {expected:?}\nerror.log:\n{}",
            nginx.error_log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Wait until the key's `(in_flight, queued)` is `expected`.
pub fn wait_standing(nginx: &Nginx, zone: &str, key: &str, expected: (u64, u64)) {
    wait_until(
        nginx,
        &format!("(in_flight, queued) of {zone}/{key}"),
        expected,
        || standing(nginx, zone, key),
    );
}
