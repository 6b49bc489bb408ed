//! State lives in shared memory: every worker sees the same counters, a reload keeps them
//! (and applies a new rate to them), and workers killed with SIGKILL under load leave the
//! zone usable (its lock is nginx's slab mutex, which the master releases for a dead worker).
//!
//! The configs listen with `reuseport`: the kernel spreads new connections over the two
//! workers, so a few connections reach both of them.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use common::{key_statuses, send, Nginx, Request, Response};

/// Two workers and one server on `%%PORT%%` which says which worker answered in `X-Pid` and
/// which config it runs in `X-Version`; `http` is the rest of the `http` block.
fn config(http: &str, locations: &str, version: &str) -> String {
    common::config()
        .workers(2)
        .reuseport()
        .http(http)
        .server("add_header X-Pid $pid always;")
        .server(&format!("add_header X-Version {version} always;"))
        .locations(locations)
        .build()
}

/// An undelayed response takes a few milliseconds; a deadlocked zone never answers.
const PROMPT: Duration = Duration::from_secs(1);

fn keyed(path: &str, key: &str) -> Request {
    Request::get(path).header("X-Key", key)
}

/// Sends one request for `key` on a new connection (so either worker may get it).
fn request(nginx: &Nginx, key: &str) -> Response {
    send(nginx.port(), &keyed("/index.html", key))
}

/// Five requests a minute (1 + burst 4) for one key, sent on new connections until both
/// workers have rejected some: exactly five passed in all, so each worker rejected requests
/// while it had passed fewer than five itself.
#[test]
fn two_workers_share_one_budget() {
    let nginx = Nginx::start(&config(
        "rate_limit_zone $http_x_key zone=shared:1m rate=1r/m burst=4;",
        "location / { rate_limit zone=shared nodelay; }",
        "one",
    ));
    let workers = nginx.worker_pids();
    assert_eq!(workers.len(), 2);
    // (worker, passed, rejected)
    let mut counts: Vec<(u32, u32, u32)> = workers.iter().map(|&pid| (pid, 0, 0)).collect();
    for _ in 0..200 {
        let response = request(&nginx, "k");
        let worker = response.worker_pid();
        let entry = counts
            .iter_mut()
            .find(|(pid, _, _)| *pid == worker)
            .unwrap_or_else(|| panic!("answered by an unknown worker {worker}"));
        match response.status {
            200 => entry.1 += 1,
            429 => entry.2 += 1,
            _ => panic!("unexpected response {response:?}"),
        }
        if counts.iter().all(|&(_, _, rejected)| rejected >= 2) {
            break;
        }
    }
    let passed: u32 = counts.iter().map(|&(_, passed, _)| passed).sum();
    assert_eq!(
        passed, 5,
        "(worker, passed, rejected): {counts:?}: the workers do not share one budget"
    );
    assert!(
        counts.iter().all(|&(_, _, rejected)| rejected >= 2),
        "one worker answered almost everything, nothing proven: {counts:?}"
    );
}

/// A reload that keeps the zone (name, size, key) keeps each key's state: a key used up
/// before is still rejected after, under the new config.
#[test]
fn reload_keeps_each_keys_state() {
    let zone = "rate_limit_zone $http_x_key zone=kept:1m rate=1r/m burst=1;";
    let location = "location / { rate_limit zone=kept nodelay; }";
    let mut nginx = Nginx::start(&config(zone, location, "one"));
    assert_eq!(
        key_statuses(nginx.port(), "/index.html", "used", 3),
        [200, 200, 429]
    );
    assert_eq!(key_statuses(nginx.port(), "/index.html", "half", 1), [200]);

    let workers = nginx.reload_with(&config(zone, location, "two"));
    let after = request(&nginx, "used");
    assert_eq!(after.header("X-Version"), Some("two"), "{after:?}");
    assert!(workers.contains(&after.worker_pid()));
    assert_eq!(after.status, 429, "the reload forgot the key: {after:?}");
    assert_eq!(
        key_statuses(nginx.port(), "/index.html", "half", 2),
        [200, 429]
    );
    assert_eq!(
        key_statuses(nginx.port(), "/index.html", "new", 3),
        [200, 200, 429]
    );
    assert!(
        !nginx.error_log().contains("starts afresh"),
        "{}",
        nginx.error_log()
    );
}

/// A reload that changes the zone's key starts it afresh (and says so).
#[test]
fn reload_with_another_key_starts_afresh() {
    let location = "location / { rate_limit zone=z nodelay; }";
    let mut nginx = Nginx::start(&config(
        "rate_limit_zone $http_x_key zone=z:1m rate=1r/m;",
        location,
        "one",
    ));
    assert_eq!(
        key_statuses(nginx.port(), "/index.html", "k", 2),
        [200, 429]
    );
    nginx.reload_with(&config(
        "rate_limit_zone $http_x_key$http_x_other zone=z:1m rate=1r/m;",
        location,
        "two",
    ));
    assert_eq!(
        key_statuses(nginx.port(), "/index.html", "k", 2),
        [200, 429]
    );
    let log = nginx.error_log();
    assert!(
        log.contains("rate_limit zone \"z\" changed its key, algorithm or block="),
        "{log}"
    );
}

/// A reload from 1r/m to 30r/m (one request per 2 s) with burst=1 nodelay, next to limit_req
/// with the same numbers in the same nginx, which shows what "a new rate applies to the kept
/// state" means: a key that used its 2 requests keeps a debt of one request beyond the
/// current, now repaid at the new rate. Right after the reload it is still rejected; 3 s
/// after its requests (1 s past the new interval) one more passes, and a second does not.
/// A state kept but still counted at the old rate would reject for two minutes.
#[test]
fn reload_with_a_new_rate_applies_it_to_the_kept_state() {
    let rated = |rate: &str| {
        config(
            &format!(
                "limit_req_zone $http_x_key zone=native:1m rate={rate};\n\
                 rate_limit_zone $http_x_key zone=module:1m rate={rate};"
            ),
            "limit_req_status 429;\n\
             location /native/ { limit_req zone=native burst=1 nodelay; }\n\
             location /module/ { rate_limit zone=module burst=1 nodelay; }",
            rate,
        )
    };
    let mut nginx = Nginx::start(&rated("1r/m"));
    nginx.write_file("html/native/index.html", "ok\n");
    nginx.write_file("html/module/index.html", "ok\n");
    let both = |nginx: &Nginx| -> [u16; 2] {
        ["/native/index.html", "/module/index.html"]
            .map(|path| send(nginx.port(), &keyed(path, "k")).status)
    };

    let start = Instant::now();
    let before: Vec<[u16; 2]> = (0..3).map(|_| both(&nginx)).collect();
    assert_eq!(before, [[200, 200], [200, 200], [429, 429]]);

    nginx.reload_with(&rated("30r/m"));
    let reloaded_after = start.elapsed();
    assert!(
        reloaded_after < Duration::from_millis(1500),
        "the reload took {reloaded_after:?}, too long for the margins"
    );
    assert_eq!(both(&nginx), [429, 429], "the state was not kept");

    thread::sleep((start + Duration::from_secs(3)).saturating_duration_since(Instant::now()));
    let later: Vec<[u16; 2]> = (0..2).map(|_| both(&nginx)).collect();
    assert_eq!(
        later,
        [[200, 200], [429, 429]],
        "[limit_req, rate_limit] 3 s after the key's requests, at the new rate"
    );
}

/// One request for `key` on a new connection, for a client that expects the server to fail
/// under it: any error is `None`.
fn try_status(address: SocketAddr, key: &str) -> Option<u16> {
    let mut stream = TcpStream::connect_timeout(&address, PROMPT).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let request = format!(
        "GET /index.html HTTP/1.1\r\nHost: localhost\r\nX-Key: {key}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).ok()?;
    let status_line = response.split(|&b| b == b'\r').next()?;
    std::str::from_utf8(status_line.get(9..12)?)
        .ok()?
        .parse()
        .ok()
}

/// Three clients send requests with new keys (each claims a slot under the zone's lock) for
/// 2 s while both workers are SIGKILLed twice. Afterwards nginx answers at once and the zone
/// still limits: 1 + burst 2 per key.
#[test]
fn killing_workers_under_load_leaves_the_zone_working() {
    let nginx = Nginx::start(&config(
        "rate_limit_zone $http_x_key zone=load:1m rate=1r/m burst=2;",
        "location / { rate_limit zone=load nodelay; }",
        "one",
    ));
    let address: SocketAddr = ([127, 0, 0, 1], nginx.port()).into();
    let load_time = Duration::from_secs(2);

    let (answered, respawned_at, load_start) = thread::scope(|scope| {
        let load_start = Instant::now();
        let clients: Vec<_> = (0..3)
            .map(|client| {
                scope.spawn(move || {
                    // (when answered, status)
                    let mut answered: Vec<(Instant, u16)> = Vec::new();
                    let mut n = 0u64;
                    while load_start.elapsed() < load_time {
                        n += 1;
                        if let Some(status) = try_status(address, &format!("load-{client}-{n}")) {
                            answered.push((Instant::now(), status));
                        }
                    }
                    answered
                })
            })
            .collect();

        let mut respawned_at = load_start;
        for kill_at in [Duration::from_millis(400), Duration::from_millis(1000)] {
            thread::sleep((load_start + kill_at).saturating_duration_since(Instant::now()));
            let killed = nginx.kill_workers();
            nginx.wait_workers_replaced(&killed);
            respawned_at = Instant::now();
        }
        let answered: Vec<(Instant, u16)> = clients
            .into_iter()
            .flat_map(|client| client.join().expect("a load client panicked"))
            .collect();
        (answered, respawned_at, load_start)
    });

    let unexpected: Vec<u16> = answered
        .iter()
        .map(|&(_, status)| status)
        .filter(|&status| status != 200)
        .collect();
    assert!(
        unexpected.is_empty(),
        "fresh keys were not served: {unexpected:?}"
    );
    let after_respawn = answered.iter().filter(|(at, _)| *at > respawned_at).count();
    assert!(
        after_respawn > 0 || respawned_at > load_start + load_time,
        "no request answered after the second respawn ({} in all)",
        answered.len()
    );

    let workers = nginx.worker_pids();
    let mut answered_by = Vec::new();
    for key in ["after-1", "after-2", "after-3", "after-4"] {
        let responses: Vec<Response> = (0..4).map(|_| request(&nginx, key)).collect();
        for response in &responses {
            assert!(response.elapsed < PROMPT, "slow answer: {response:?}");
            assert!(workers.contains(&response.worker_pid()), "{response:?}");
            answered_by.push(response.worker_pid());
        }
        let got: Vec<u16> = responses.iter().map(|r| r.status).collect();
        assert_eq!(got, [200, 200, 200, 429], "key {key}");
    }
    answered_by.sort_unstable();
    answered_by.dedup();
    assert_eq!(answered_by, workers, "not every new worker was checked");

    let log = nginx.error_log();
    assert!(log.matches("exited on signal 9").count() >= 4, "{log}");
    for line in log.lines() {
        assert!(
            !line.contains("exited on signal") || line.contains("exited on signal 9"),
            "a worker crashed: {line}\n{log}"
        );
    }
}
