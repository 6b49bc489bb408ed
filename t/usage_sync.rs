//! Usage-based lines on a `sync` zone: two real nginx instances (two workers each) share one
//! token zone through a real `redis-server` started here, in front of the fake LLM API
//! (t/common/llm.rs). What a request is charged after its response (an overrun into debt, a
//! refund) reaches the fleet's count through the key's pending delta. Every wait is a
//! condition (sync round trips), bounded.

mod common;

use std::time::Duration;

use common::fleet::wait_rounds;
use common::llm::FakeLlm;
use common::redis::Redis;
use common::{Nginx, Request};

/// A bucket of 1,000 tokens refilled at one a second (the tests' few seconds drain a few
/// tokens), synced every 100 ms. With two instances a key new to an instance gets a grant of
/// 500 tokens, and is sent to Redis once its unsent charges reach 250.
fn instance(redis: &Redis, llm: &FakeLlm) -> Nginx {
    Nginx::start(&format!(
        r#"
load_module %%MODULE%%;
worker_processes 2;
error_log logs/error.log info;
events {{ worker_connections 256; }}
http {{
    access_log off;
    rate_limit_sync redis://127.0.0.1:{redis} interval=100ms;
    rate_limit_zone $http_x_key zone=api:1m rate=60r/m burst=1000 algorithm=token_bucket sync;
    server {{
        listen 127.0.0.1:%%PORT%% reuseport;
        location /v1/ {{
            rate_limit zone=api usage=openai reserve=$arg_reserve;
            proxy_pass http://127.0.0.1:{llm}; proxy_buffering off;
        }}
        location /ratelimit/ {{ rate_limit_admin write=on; }}
    }}
}}
"#,
        redis = redis.port,
        llm = llm.port()
    ))
}

fn pair() -> (Redis, FakeLlm, Nginx, Nginx) {
    let redis = Redis::start();
    let llm = FakeLlm::start();
    let a = instance(&redis, &llm);
    let b = instance(&redis, &llm);
    redis.wait_instances(2);
    (redis, llm, a, b)
}

/// A completion of `prompt + completion` tokens for `key`, reserving `reserve`: its status.
fn complete(nginx: &Nginx, key: &str, reserve: u64, prompt: u64, completion: u64) -> u16 {
    let path =
        format!("/v1/chat/completions?reserve={reserve}&prompt={prompt}&completion={completion}");
    let request = Request::new("POST", &path)
        .header("X-Key", key)
        .json(r#"{"model":"fake","messages":[{"role":"user","content":"hi"}]}"#);
    common::send(nginx.port(), &request).status
}

/// The tokens the fleet counts for each key Redis holds: how far the key's TAT leads Redis's
/// clock, in tokens (one a second), sorted.
fn fleet_tokens(redis: &Redis) -> Vec<f64> {
    let time: Vec<f64> = redis
        .cli(&["TIME"])
        .lines()
        .map(|line| line.trim().parse().expect("TIME"))
        .collect();
    let now_us = time[0] * 1e6 + time[1];
    let mut tokens: Vec<f64> = redis
        .cli(&["KEYS", "rl:api:{*"])
        .lines()
        .filter(|name| !name.trim().is_empty())
        .map(|name| {
            let tat: f64 = redis
                .cli(&["HGET", name.trim(), "t"])
                .trim()
                .parse()
                .expect("t");
            (tat - now_us) / 1e6
        })
        .collect();
    tokens.sort_by(f64::total_cmp);
    tokens
}

const ROUNDS: Duration = Duration::from_secs(5);

/// B's requests after B synced the key: how many of `count` (100 tokens each) pass.
fn passed(b: &Nginx, key: &str, count: usize) -> usize {
    (0..count)
        .filter(|_| complete(b, key, 100, 60, 40) == 200)
        .count()
}

/// The steps of both keys: B knows the key (100 tokens), A serves a request of `used_on_a`
/// tokens reserving 100, A's rounds send it, B uses 200 more (its unsent charges reach 300:
/// sent), B's rounds bring back the fleet's room. Returns what the fleet counted after A's
/// rounds and what B then passes of four more requests.
fn overrun_on_a_then_b(
    redis: &Redis,
    a: &Nginx,
    b: &Nginx,
    key: &str,
    used_on_a: u64,
) -> (Vec<f64>, usize) {
    assert_eq!(complete(b, key, 100, 60, 40), 200);
    assert_eq!(
        complete(a, key, 100, used_on_a / 2, used_on_a - used_on_a / 2),
        200
    );
    wait_rounds(a, 3, ROUNDS);
    let counted = fleet_tokens(redis);
    assert_eq!(complete(b, key, 100, 60, 40), 200, "within B's grant");
    assert_eq!(complete(b, key, 100, 60, 40), 200, "within B's grant");
    wait_rounds(b, 3, ROUNDS);
    (counted, passed(b, key, 4))
}

/// An overrun on A (900 tokens used of 100 reserved) is charged to the fleet: Redis counts
/// 900, and B, once its round has brought back the fleet's room (1,000 - 900 - B's 300 < 0),
/// refuses the key. The same steps with a request that used its reservation (the fleet counts
/// 100, room for B's share of 600) pass B's next requests.
#[test]
fn an_overrun_on_one_instance_is_counted_by_the_fleet() {
    let (redis, _llm, a, b) = pair();
    let (counted, after) = overrun_on_a_then_b(&redis, &a, &b, "heavy", 900);
    assert_eq!(counted.len(), 1, "only A sent the key: {counted:?}");
    assert!(
        (880.0..=910.0).contains(&counted[0]),
        "the fleet counts the 900 tokens used, not the 100 reserved: {counted:?}"
    );
    assert_eq!(
        after,
        0,
        "B refuses the key the fleet has spent\n{}",
        b.error_log()
    );

    let (_, after) = overrun_on_a_then_b(&redis, &a, &b, "light", 100);
    assert!(
        after >= 2,
        "without the overrun, B passes its share: {after} of 4\n{}",
        b.error_log()
    );
}

/// A refund (20 used of 200 reserved) of a reservation the loop has not sent yet leaves the
/// key's pending delta: the fleet counts what was used. Then 240 used of 240 reserved makes
/// the key's delta 260, sent: Redis counts 260, not the 440 the reservations were.
#[test]
fn a_refund_before_the_round_is_never_charged_to_the_fleet() {
    let (redis, _llm, a, _b) = pair();
    assert_eq!(complete(&a, "k", 200, 15, 5), 200);
    wait_rounds(&a, 3, ROUNDS);
    assert_eq!(
        fleet_tokens(&redis),
        Vec::<f64>::new(),
        "20 is within A's share: not sent"
    );
    assert_eq!(complete(&a, "k", 240, 140, 100), 200);
    wait_rounds(&a, 3, ROUNDS);
    let counted = fleet_tokens(&redis);
    assert_eq!(counted.len(), 1, "{counted:?}");
    assert!(
        (240.0..=262.0).contains(&counted[0]),
        "the fleet counts the 260 used, not the 440 reserved: {counted:?}"
    );
}

/// A reservation the loop sent while its stream ran (300 reserved, a stream of 1 s) stays
/// charged to the fleet when the request settles at 50: the deltas sent to Redis only add
/// (docs/usage.md, "Sync zones"). The instance's own bucket and grant get the 250 back.
#[test]
fn a_refund_after_the_round_stays_charged_to_the_fleet() {
    let (redis, _llm, a, _b) = pair();
    let path =
        "/v1/chat/completions?reserve=300&stream=1&chunks=10&delay_ms=100&prompt=30&completion=20";
    let request = Request::new("POST", path)
        .header("X-Key", "k")
        .json(r#"{"model":"fake","messages":[{"role":"user","content":"hi"}],"stream":true}"#);
    assert_eq!(common::send(a.port(), &request).status, 200);
    wait_rounds(&a, 3, ROUNDS);
    let counted = fleet_tokens(&redis);
    assert_eq!(counted.len(), 1, "{counted:?}");
    assert!(
        (290.0..=301.0).contains(&counted[0]),
        "the fleet keeps the 300 it was sent: {counted:?}"
    );
}
