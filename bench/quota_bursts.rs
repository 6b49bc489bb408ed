//! The measurement behind docs/quotas.md's "while a round is in flight" (`cargo test --bench
//! quota_bursts -- --nocapture`, not part of `cargo test`): two instances with
//! `limit=20 period=day`, `interval=100ms`, a real `redis-server`, 60 requests of a fresh key
//! alternating between them, sent back to back and then 2, 5 and 10 ms apart (three keys
//! each). Prints what each burst admitted; checks nothing (the fleet's bound depends on where
//! the rounds fall).

#[path = "../t/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::redis::Redis;
use common::{Nginx, Request};

const LIMIT: u64 = 20;

/// One instance of the fleet (the config of t/quota_sync.rs), serving `html/index.html`.
fn instance(redis: &Redis) -> Nginx {
    let config = common::config()
        .workers(2)
        .reuseport()
        .main("user root;")
        .http(&format!(
            "rate_limit_sync redis://127.0.0.1:{} interval=100ms;\n\
             rate_limit_zone $http_x_key zone=q:1m algorithm=quota limit={LIMIT} period=day \
             tz=Europe/Berlin sync;",
            redis.port
        ))
        .locations("location / { rate_limit zone=q; }")
        .locations("location /ratelimit/ { rate_limit_admin write=on; }")
        .build();
    let nginx = Nginx::start(&config);
    nginx.write_file("html/index.html", "ok\n");
    nginx
}

#[test]
fn unsynced_bursts() {
    let redis = Redis::start();
    let a = instance(&redis);
    let b = instance(&redis);
    redis.wait_instances(2);
    for (round, gap_ms) in [0u64, 0, 0, 2, 2, 2, 5, 5, 5, 10, 10, 10]
        .iter()
        .enumerate()
    {
        let key = format!("burst{round}");
        let mut connections = [
            common::Connection::open(a.port()),
            common::Connection::open(b.port()),
        ];
        let started = Instant::now();
        let mut admitted = 0;
        for at in 0..60 {
            let request = Request::get("/").header("X-Key", &key);
            if connections[at % 2].send(&request).status == 200 {
                admitted += 1;
            }
            std::thread::sleep(Duration::from_millis(*gap_ms));
        }
        println!(
            "gap {gap_ms} ms: {admitted} of 60 admitted in {:?} (limit {LIMIT})",
            started.elapsed()
        );
    }
}
