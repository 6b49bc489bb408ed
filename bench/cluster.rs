//! The cluster bench (`bench/cluster.sh`; `cargo test --bench cluster -- --nocapture`, not
//! part of `cargo test`): real `redis-server`s and three nginx instances of the module named by
//! `RATE_LIMIT_MODULE` (the debug build when unset), with the harness of `t/common`.

#[path = "../t/common/mod.rs"]
mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::fleet::{
    fleet, instance_config, offer, offer_paths, passed_between, ports, sync_state, Answer, BURST,
    LIMIT_PER_SEC, ZONE,
};
use common::redis::{redis_cluster, Redis, SIGCONT, SIGSTOP};
use common::Nginx;

/// The bench (`bench/cluster.sh`, not part of `cargo test`): three instances of two workers,
/// one key, L = 100r/s burst=20, each sync interval offered 2x and 10x L spread evenly for
/// 10 s, plus the same fleet without `sync` and one instance taking all the traffic.
/// Writes the table to `bench/results/cluster.md` (or `CLUSTER_BENCH_OUT`).
#[test]
fn cluster_table() {
    let span = Duration::from_secs(10);
    let limit_t = LIMIT_PER_SEC * span.as_secs_f64();
    let bound = 1.05 + BURST / limit_t;
    let mut rows = Vec::new();
    let p99 = |answers: &[Answer]| {
        let mut latencies: Vec<Duration> = answers.iter().map(|a| a.latency).collect();
        latencies.sort();
        latencies[latencies.len() * 99 / 100].as_secs_f64() * 1000.0
    };
    let failed = |answers: &[Answer]| {
        answers
            .iter()
            .filter(|a| a.status != 200 && a.status != 429)
            .count()
    };
    for interval_ms in [20, 50, 100, 250] {
        for offered in [2.0, 10.0] {
            let redis = Redis::start();
            let fleet = fleet(&redis, 3, &format!("interval={interval_ms}ms"));
            let answers = offer(&ports(&fleet), offered * LIMIT_PER_SEC / 3.0, span, "k");
            let passed = passed_between(&answers, Duration::ZERO, span);
            let ratio = passed as f64 / limit_t;
            rows.push(format!(
                "| {interval_ms} ms | {offered}x | 3 (even) | {passed} | {ratio:.3} | {} | {:.1} | {} |",
                if ratio <= bound { format!("<= {bound:.2} yes") } else { format!("<= {bound:.2} NO") },
                p99(&answers),
                failed(&answers),
            ));
        }
    }
    // All the traffic on one instance of three: admitted/L after the first second.
    {
        let redis = Redis::start();
        let fleet = fleet(&redis, 3, "interval=100ms");
        let answers = offer(&[fleet[0].port()], 3.0 * LIMIT_PER_SEC, span, "k");
        let passed = passed_between(&answers, Duration::from_secs(1), span);
        let ratio = passed as f64 / (LIMIT_PER_SEC * (span.as_secs_f64() - 1.0));
        rows.push(format!(
            "| 100 ms | 3x | 1 of 3 (after 1 s) | {passed} | {ratio:.3} | {} | {:.1} | {} |",
            if ratio >= 0.9 {
                ">= 0.90 yes"
            } else {
                ">= 0.90 NO"
            },
            p99(&answers),
            failed(&answers),
        ));
    }
    // Redis SIGSTOPped from 2 s to 7 s under 10x: local_share after three intervals. Each
    // connection alternates a request to the sync zone and one to the same limit without
    // `sync` on the same instances, so both see the same client and machine: the latency of
    // both during the stop, and the noise floor (the larger p99 difference between the two
    // halves, alternate answers, of either kind).
    let latency_row;
    {
        let redis = Redis::start();
        let fleet = fleet(&redis, 3, "interval=100ms timeout=100ms");
        let ports = ports(&fleet);
        let load = thread::spawn(move || {
            offer_paths(
                &ports,
                10.0 * LIMIT_PER_SEC / 3.0,
                Duration::from_secs(10),
                "k",
                &["/index.html", "/plain/index.html"],
            )
        });
        thread::sleep(Duration::from_millis(2050));
        redis.signal(SIGSTOP);
        thread::sleep(Duration::from_secs(5));
        redis.signal(SIGCONT);
        let all = load.join().expect("load thread");
        let (from, to) = (Duration::from_millis(2500), Duration::from_millis(7000));
        let of_path = |path: usize| -> Vec<Answer> {
            let mut these: Vec<Answer> = all.iter().copied().filter(|a| a.path == path).collect();
            these.sort_by_key(|a| a.sent);
            these
        };
        let (answers, plain) = (of_path(0), of_path(1));
        let passed = passed_between(&answers, from, to);
        let window = (to - from).as_secs_f64();
        let ratio = passed as f64 / (LIMIT_PER_SEC * window);
        let stop_bound = 1.10 + BURST / (LIMIT_PER_SEC * window);
        let during = |answers: &[Answer]| -> Vec<Answer> {
            answers
                .iter()
                .copied()
                .filter(|a| a.sent >= from && a.sent < to)
                .collect()
        };
        let (synced, plain_during) = (during(&answers), during(&plain));
        let noise = |answers: &[Answer]| {
            let half = |first: usize| -> Vec<Answer> {
                answers.iter().copied().skip(first).step_by(2).collect()
            };
            (p99(&half(0)) - p99(&half(1))).abs()
        };
        let (p99_sync, p99_plain) = (p99(&synced), p99(&plain_during));
        let noise = noise(&synced).max(noise(&plain_during));
        let within = (p99_sync - p99_plain).abs() <= noise.max(0.1);
        let slowest = |answers: &[Answer]| {
            answers
                .iter()
                .map(|a| a.latency)
                .max()
                .unwrap_or_default()
                .as_secs_f64()
                * 1000.0
        };
        rows.push(format!(
            "| 100 ms, Redis SIGSTOPped 2-7 s | 10x | 3 (even), 2.5-7 s | {passed} | {ratio:.3} | <= {stop_bound:.2} {} | {p99_sync:.2} | {} |",
            if ratio <= stop_bound { "yes" } else { "NO" },
            failed(&answers) + failed(&plain),
        ));
        latency_row = format!(
            "| during the stop, same connections, alternate requests | {p99_sync:.2} ms ({} requests) | {p99_plain:.2} ms ({} requests) | {noise:.2} ms | {} | {:.1} / {:.1} ms |",
            synced.len(),
            plain_during.len(),
            if within { "yes" } else { "NO" },
            slowest(&synced),
            slowest(&plain_during),
        );
    }
    // Round trips per instance per interval at 2x and 10x (the admin API's counter), and
    // the time for every instance to be synced again after Redis restarts empty.
    {
        let mut redis = Redis::start();
        let fleet = fleet(&redis, 3, "interval=100ms");
        for offered in [2.0, 10.0] {
            let before: Vec<u64> = fleet
                .iter()
                .map(|n| sync_state(n)["round_trips"].as_u64().expect("round_trips"))
                .collect();
            let started = Instant::now();
            let answers = offer(
                &ports(&fleet),
                offered * LIMIT_PER_SEC / 3.0,
                Duration::from_secs(5),
                "k",
            );
            let elapsed = started.elapsed().as_secs_f64();
            let trips: u64 = fleet
                .iter()
                .zip(&before)
                .map(|(n, b)| sync_state(n)["round_trips"].as_u64().expect("round_trips") - b)
                .sum();
            // A loop turning every 100 ms makes at most floor(t / 100 ms) + 1 turns in t.
            let allowed = 3 * ((elapsed / 0.1).floor() as u64 + 1);
            rows.push(format!(
                "| 100 ms, round trips | {offered}x | 3 (even) | {trips} round trips in {elapsed:.2} s | {:.3} per instance per interval | <= {allowed} (1 per interval) {} | {:.1} | {} |",
                trips as f64 / 3.0 / (elapsed / 0.1),
                if trips <= allowed { "yes" } else { "NO" },
                p99(&answers),
                failed(&answers),
            ));
        }
        redis.kill();
        thread::sleep(Duration::from_millis(500));
        redis.spawn();
        let restarted = Instant::now();
        let mut synced_after = None;
        while restarted.elapsed() < Duration::from_secs(5) {
            if fleet.iter().all(|n| sync_state(n)["mode"] == "synced") {
                synced_after = Some(restarted.elapsed());
                break;
            }
            thread::sleep(Duration::from_millis(5));
        }
        let ms = synced_after.map_or(f64::INFINITY, |d| d.as_secs_f64() * 1000.0);
        rows.push(format!(
            "| 100 ms, Redis restarted empty | - | 3 | all synced {ms:.0} ms after Redis answered | - | <= 300 ms {} | - | - |",
            if ms <= 300.0 { "yes" } else { "NO" },
        ));
    }
    // Redis Cluster of three masters, 10x spread evenly.
    {
        let nodes = redis_cluster();
        let fleet = fleet(&nodes[0], 3, "cluster interval=100ms");
        let answers = offer(&ports(&fleet), 10.0 * LIMIT_PER_SEC / 3.0, span, "k");
        let passed = passed_between(&answers, Duration::ZERO, span);
        let ratio = passed as f64 / limit_t;
        rows.push(format!(
            "| 100 ms, Redis Cluster (3 masters) | 10x | 3 (even) | {passed} | {ratio:.3} | <= {bound:.2} {} | {:.1} | {} |",
            if ratio <= bound { "yes" } else { "NO" },
            p99(&answers),
            failed(&answers),
        ));
    }
    // The same fleet without `sync`: each instance enforces L alone.
    {
        let config = instance_config(1, "", ZONE)
            .replace("rate_limit_sync redis://127.0.0.1:1 ;", "")
            .replace(" sync;", ";");
        let fleet: Vec<Nginx> = (0..3).map(|_| Nginx::start(&config)).collect();
        let answers = offer(&ports(&fleet), 10.0 * LIMIT_PER_SEC / 3.0, span, "k");
        let passed = passed_between(&answers, Duration::ZERO, span);
        rows.push(format!(
            "| no sync | 10x | 3 (even) | {passed} | {:.3} | (3x expected) | {:.1} | {} |",
            passed as f64 / limit_t,
            p99(&answers),
            failed(&answers),
        ));
    }
    let table = format!(
        "# Cluster bench (bench/cluster.sh)\n\n\
         Three nginx instances (2 workers each) on loopback, one Redis, one key, L = 100r/s \
         burst=20 nodelay (leaky bucket), offered load paced from two keep-alive connections \
         per instance for {} s. `admitted/L·t` is the fleet's 200s over L times the span; the \
         target is <= 1.05 + burst/(L·t) = {bound:.2}. p99 is the client's latency in ms \
         (on a shared 2-core machine, the module named at the end). `errors`: answers other \
         than 200/429.\n\n\
         | interval | offered | instances loaded | admitted | admitted/L·t | target | p99 ms | errors |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- |\n{}\n\n\
         Latency with Redis stopped (SIGSTOP), side by side: each client connection \
         alternates a request to the zone with `sync` and one to the same limit without it, \
         on the same instances, each offered 10x. Target: the two p99s differ by no more than \
         the noise floor, the larger p99 difference between the two halves (alternate \
         answers) of either kind, or 0.1 ms when that is smaller.\n\n\
         | window | p99 `sync` | p99 without `sync` | noise floor | within | slowest `sync` / without |\n\
         | --- | --- | --- | --- | --- | --- |\n{latency_row}\n\n\
         Module: {}.\n",
        span.as_secs(),
        rows.join("\n"),
        std::env::var("RATE_LIMIT_MODULE").map_or_else(
            |_| "the debug build".to_string(),
            |module| module.replace(concat!(env!("CARGO_MANIFEST_DIR"), "/"), ""),
        ),
    );
    let out = std::env::var("CLUSTER_BENCH_OUT").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/bench/results/cluster.md").to_string()
    });
    std::fs::write(&out, &table).expect("cannot write the bench table");
    eprintln!("{table}");
    common::fleet::assert_goals_met(&table, &out);
}
