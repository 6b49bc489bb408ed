//! `algorithm=token_bucket` against real nginx: a bucket of `burst` tokens (at least 1),
//! refilled at the rate, full for a new key; a request takes `cost` tokens or is rejected at
//! once, never delayed. `global=NAME` lends a shared pool to every user's own bucket.
//!
//! Counts use 1r/m (no token comes back during a test); the refill test uses 2r/s (a token
//! every 500 ms) and checks it 250 ms or more away from when a token arrives.

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::{Connection, Nginx, Request, Response};

/// nginx with the module; `http` is the rest of the `http` block and `locations` the
/// locations of its one server on `%%PORT%%`, which serves `html/` and says
/// `$rate_limit_status` in `X-Status`.
fn start(http: &str, locations: &str) -> Nginx {
    common::config()
        .http(http)
        .server("add_header X-Status $rate_limit_status always;")
        .locations(locations)
        .start()
}

/// An undelayed response takes a few milliseconds.
const IMMEDIATE: Duration = Duration::from_millis(200);

/// Requests on one keep-alive connection, with `X-Key` (or any other header) set.
struct Client {
    connection: Connection,
    header: &'static str,
    value: String,
}

impl Client {
    fn new(nginx: &Nginx, header: &'static str, value: &str) -> Client {
        Client {
            connection: Connection::open(nginx.port()),
            header,
            value: value.to_string(),
        }
    }

    fn get(&mut self, path: &str) -> Response {
        let response = self
            .connection
            .send(&Request::get(path).header(self.header, &self.value));
        assert!(
            response.elapsed < IMMEDIATE,
            "a token bucket never delays: {response:?}"
        );
        response
    }

    /// Statuses of `count` requests in a row.
    fn statuses(&mut self, path: &str, count: usize) -> Vec<u16> {
        (0..count).map(|_| self.get(path).status).collect()
    }
}

#[test]
fn capacity_is_burst_and_a_new_key_starts_full() {
    let nginx = start(
        "rate_limit_zone $http_x_key zone=tokens:1m rate=1r/m burst=3 algorithm=token_bucket;",
        "location / { rate_limit zone=tokens; }",
    );
    let mut a = Client::new(&nginx, "X-Key", "a");
    let responses: Vec<Response> = (0..4).map(|_| a.get("/index.html")).collect();
    let got: Vec<(u16, &str)> = responses
        .iter()
        .map(|r| (r.status, r.header("X-Status").unwrap_or("")))
        .collect();
    assert_eq!(
        got,
        [
            (200, "PASSED"),
            (200, "PASSED"),
            (200, "PASSED"),
            (429, "REJECTED")
        ]
    );
    // The next token comes a minute after the first was taken.
    let retry: u64 = responses[3].header("Retry-After").unwrap().parse().unwrap();
    assert!((59..=60).contains(&retry), "{:?}", responses[3]);

    let mut b = Client::new(&nginx, "X-Key", "b");
    assert_eq!(b.statuses("/index.html", 4), [200, 200, 200, 429]);
}

#[test]
fn without_burst_the_bucket_holds_one_token() {
    let nginx = start(
        "rate_limit_zone $http_x_key zone=tokens:1m rate=1r/m algorithm=token_bucket;",
        "location / { rate_limit zone=tokens; }",
    );
    let mut client = Client::new(&nginx, "X-Key", "a");
    assert_eq!(client.statuses("/index.html", 3), [200, 429, 429]);
}

/// 2 tokens at 2r/s: both go at once, the third request is rejected; at 750 ms one token
/// and a half are back (one passes, then half a token is not enough); by 2 s the bucket is
/// full again (it was at 1.5 s) and holds no more than 2.
#[test]
fn tokens_refill_at_the_rate_up_to_the_capacity() {
    let nginx = start(
        "rate_limit_zone $http_x_key zone=tokens:1m rate=2r/s burst=2 algorithm=token_bucket;",
        "location / { rate_limit zone=tokens; }",
    );
    let mut client = Client::new(&nginx, "X-Key", "k");
    let start = Instant::now();
    assert_eq!(client.statuses("/index.html", 2), [200, 200]);
    let rejected = client.get("/index.html");
    assert_eq!(rejected.status, 429);
    assert_eq!(rejected.header("Retry-After"), Some("1"), "{rejected:?}");

    sleep_until(start + Duration::from_millis(750));
    assert_eq!(client.statuses("/index.html", 2), [200, 429]);

    sleep_until(start + Duration::from_millis(2000));
    assert_eq!(client.statuses("/index.html", 3), [200, 200, 429]);
    assert!(
        start.elapsed() < Duration::from_millis(2400),
        "too slow for the margins: {:?}",
        start.elapsed()
    );
}

fn sleep_until(at: Instant) {
    thread::sleep(at.saturating_duration_since(Instant::now()));
}

/// `cost=2` takes two tokens of five: twice, then the one left is not enough for it but is
/// for a cost-1 request. A cost above the capacity never passes: no `Retry-After`, and the log
/// says why.
#[test]
fn cost_takes_n_tokens() {
    let nginx = start(
        "rate_limit_zone $http_x_key zone=tokens:1m rate=1r/m burst=5 algorithm=token_bucket;",
        "location /two/ { rate_limit zone=tokens cost=2; }\n\
         location /one/ { rate_limit zone=tokens; }\n\
         location /six/ { rate_limit zone=tokens cost=6; }",
    );
    for dir in ["two", "one", "six"] {
        nginx.write_file(&format!("html/{dir}/index.html"), "ok\n");
    }
    let mut client = Client::new(&nginx, "X-Key", "k");
    let remaining: Vec<(u16, String)> = ["/two/", "/two/", "/two/", "/one/", "/one/"]
        .iter()
        .map(|dir| {
            let response = client.get(&format!("{dir}index.html"));
            let state = response.header("RateLimit").unwrap_or("").to_string();
            (response.status, state)
        })
        .collect();
    let statuses: Vec<u16> = remaining.iter().map(|(status, _)| *status).collect();
    assert_eq!(statuses, [200, 200, 429, 200, 429], "{remaining:?}");
    // Tokens left after each: 3, 1, 1, 0, 0.
    let left: Vec<&str> = remaining
        .iter()
        .map(|(_, state)| {
            state
                .split(';')
                .find_map(|part| part.strip_prefix("r="))
                .unwrap_or("?")
        })
        .collect();
    assert_eq!(left, ["3", "1", "1", "0", "0"], "{remaining:?}");

    let mut fresh = Client::new(&nginx, "X-Key", "fresh");
    let six = fresh.get("/six/index.html");
    assert_eq!(
        (six.status, six.header("Retry-After")),
        (429, None),
        "no wait lets it through: {six:?}"
    );
    assert!(
        nginx
            .error_log()
            .contains("by zone \"tokens\"; cost 6 can never pass (at most 5 at once)"),
        "{}",
        nginx.error_log()
    );
    assert_eq!(fresh.statuses("/one/index.html", 5), [200; 5]);
}

/// Users with 2 tokens each and a global pool of 5 (1r/m: nothing refills). A request takes a
/// token from its user's bucket and one from the pool, wherever each has one, and passes if
/// either had one: user A, first, passes 5 times (its 2 are taken alongside the pool's first
/// 2) and drains the pool; B and C still get their own 2 each; A gets nothing more.
#[test]
fn global_pool_lends_to_every_user_who_keeps_their_own_share() {
    let nginx = start(
        "rate_limit_zone $http_x_user zone=user:1m rate=1r/m burst=2 algorithm=token_bucket;\n\
         rate_limit_zone global zone=pool:64k rate=1r/m burst=5 algorithm=token_bucket;",
        "location / { rate_limit zone=user global=pool; }",
    );
    let mut a = Client::new(&nginx, "X-User", "a");
    let mut b = Client::new(&nginx, "X-User", "b");
    let mut c = Client::new(&nginx, "X-User", "c");
    assert_eq!(
        a.statuses("/index.html", 6),
        [200, 200, 200, 200, 200, 429],
        "A should use the whole pool (its own tokens go alongside)"
    );
    assert_eq!(
        b.statuses("/index.html", 3),
        [200, 200, 429],
        "B should keep its own share"
    );
    assert_eq!(a.statuses("/index.html", 1), [429]);
    assert_eq!(c.statuses("/index.html", 3), [200, 200, 429]);
}

/// With the pool still full, a user who spent their own tokens keeps passing on the pool's;
/// the pool, once spent, leaves them at their own share.
#[test]
fn global_pool_serves_users_after_their_own_tokens_run_out() {
    let nginx = start(
        "rate_limit_zone $http_x_user zone=user:1m rate=1r/m burst=1 algorithm=token_bucket;\n\
         rate_limit_zone global zone=pool:64k rate=1r/m burst=3 algorithm=token_bucket;",
        "location /pooled/ { rate_limit zone=user global=pool; }\n\
         location /own/ { rate_limit zone=user; }",
    );
    nginx.write_file("html/pooled/index.html", "ok\n");
    nginx.write_file("html/own/index.html", "ok\n");
    // B spends its one token where there is no pool.
    let mut b = Client::new(&nginx, "X-User", "b");
    assert_eq!(b.statuses("/own/index.html", 2), [200, 429]);
    // With the pool, B passes on the pool's 3 tokens, then stops.
    assert_eq!(b.statuses("/pooled/index.html", 4), [200, 200, 200, 429]);
    // A still has its own token, and nothing more.
    let mut a = Client::new(&nginx, "X-User", "a");
    assert_eq!(a.statuses("/pooled/index.html", 2), [200, 429]);
}
