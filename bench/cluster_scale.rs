//! The scale bench of `rate_limit_sync` (`bench/cluster-scale.sh`, or `cargo test --bench
//! cluster_scale -- --nocapture`; not part of `cargo test`): many distinct keys, Redis stalls,
//! small bursts and a hot key far under its limit, against the release module, real
//! `redis-server`s and wrk. Writes `bench/results/cluster-scale.md` (or `CLUSTER_SCALE_OUT`).
//! The spans are scaled down for a 2-core machine shared with other work; the table states
//! them.

#[path = "../t/common/mod.rs"]
mod common;

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::fleet::{offer_paths, passed_between_quiet, Answer};
use common::redis::{Redis, SIGCONT, SIGSTOP};
use common::Nginx;

/// One instance: one worker, a sync zone `api` of `ZONE` on `$arg_k` (`/s`), the same zone
/// without `sync` (`/p`), a sync zone `hot` of 100r/s burst=20 on `X-Key` configured after it
/// (`/h`: does every zone get its turn?), and the admin API.
fn instance_config(redis_port: u16, sync_words: &str, zone_words: &str) -> String {
    format!(
        r#"
load_module %%MODULE%%;
worker_processes 1;
worker_rlimit_nofile 65536;
error_log logs/error.log notice;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    keepalive_requests 1000000;
    rate_limit_sync redis://127.0.0.1:{redis_port} {sync_words};
    rate_limit_zone $arg_k zone=api:32m {zone_words} sync;
    rate_limit_zone $arg_k zone=plain:32m {zone_words};
    rate_limit_zone $http_x_key zone=hot:1m rate=100r/s burst=20 sync;
    server {{
        listen 127.0.0.1:%%PORT%% reuseport;
        root html;
        location = /s {{ rate_limit zone=api nodelay; empty_gif; }}
        location = /p {{ rate_limit zone=plain nodelay; empty_gif; }}
        location = /h {{ rate_limit zone=hot nodelay; empty_gif; }}
        location /ratelimit/ {{ rate_limit_admin write=on; }}
    }}
}}
"#
    )
}

/// The zone of the distinct keys: a per-client API limit.
const ZONE: &str = "rate=10r/s burst=20";

struct Fleet {
    redis: Redis,
    instances: Vec<Nginx>,
}

fn fleet(count: usize, zone_words: &str) -> Fleet {
    let redis = Redis::start();
    let instances = (0..count)
        .map(|_| Nginx::start(&instance_config(redis.port, "interval=100ms", zone_words)))
        .collect();
    redis.wait_instances(count);
    Fleet { redis, instances }
}

/// wrk's JSON summary (bench/wrk/*.lua `done`).
#[derive(Clone, Copy, Debug, Default)]
struct Wrk {
    duration_us: f64,
    requests: f64,
    non_2xx: f64,
    p99_us: f64,
}

/// Starts wrk on `url` with `connections` connections, each waiting `delay_ms` between a
/// response and its next request, for `seconds`; every request for a new key.
fn wrk(url: &str, connections: usize, delay_ms: u64, seconds: u64, seed: &str) -> Child {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/wrk/distinct_keys.lua");
    Command::new("wrk")
        .args(["-t1", &format!("-c{connections}"), &format!("-d{seconds}s")])
        .args(["--timeout", "5s", "-s", script, url, "--"])
        .args([&delay_ms.to_string(), seed])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("cannot run wrk (install the wrk package)")
}

fn wrk_result(child: Child) -> Wrk {
    let output = child.wait_with_output().expect("wrk");
    let text = String::from_utf8_lossy(&output.stdout);
    let json = text
        .lines()
        .find(|line| line.starts_with('{'))
        .unwrap_or("{}");
    let value: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
    let number = |name: &str| value[name].as_f64().unwrap_or(0.0);
    Wrk {
        duration_us: number("duration_us"),
        requests: number("requests"),
        non_2xx: number("non_2xx_3xx"),
        p99_us: number("p99_us"),
    }
}

/// Connections and delay for about `per_sec` requests a second from one wrk.
fn pacing(per_sec: u64) -> (usize, u64) {
    match per_sec {
        0..=2_000 => (per_sec.div_ceil(100).max(1) as usize, 10),
        2_001..=20_000 => (per_sec.div_ceil(500) as usize, 2),
        _ => (per_sec.div_ceil(1000).min(200) as usize, 1),
    }
}

/// Redis's calls of every command (those run inside scripts too), bytes received and bytes
/// sent, and its calls of `EVALSHA` alone.
fn redis_totals(redis: &Redis) -> (f64, f64, f64, f64) {
    let commands = redis.cli(&["INFO", "commandstats"]);
    let calls: f64 = commands
        .lines()
        .filter_map(|line| {
            line.split_once(":calls=")?
                .1
                .split(',')
                .next()?
                .parse()
                .ok()
        })
        .map(|calls: f64| calls)
        .sum();
    let scripts = redis.calls("evalsha") as f64;
    let stats = redis.cli(&["INFO", "stats"]);
    let field = |name: &str| -> f64 {
        stats
            .lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or(0.0)
    };
    (
        calls,
        field("total_net_input_bytes"),
        field("total_net_output_bytes"),
        scripts,
    )
}

fn admin(nginx: &Nginx, zone: &str) -> serde_json::Value {
    let response = common::get(nginx.port(), &format!("/ratelimit/zones/{zone}"));
    serde_json::from_str(&response.text()).unwrap_or_default()
}

/// The loop thread (`rate_limit_sync`) of an instance: (worker pid, thread id).
fn loop_thread(nginx: &Nginx) -> Option<(u32, u32)> {
    for pid in nginx.worker_pids() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            if comm.trim() == "rate_limit_sync" {
                let tid = task.file_name().to_string_lossy().parse().ok()?;
                return Some((pid, tid));
            }
        }
    }
    None
}

/// CPU ticks (user + system) of a thread.
fn cpu_ticks(pid: u32, tid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).unwrap_or_default();
    // Fields after the command (which is in parentheses): utime is the 12th, stime the 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let tick = |at: usize| {
        fields
            .get(at)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    tick(11) + tick(12)
}

/// `VmRSS` and `VmHWM` of a process, in MiB.
fn memory_mib(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| -> f64 {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Samples every instance's sync state every 100 ms while running: round durations
/// (`lag_ms`) and samples not `synced`.
struct Sampler {
    stop: Arc<AtomicBool>,
    handle: thread::JoinHandle<(Vec<f64>, usize, usize)>,
}

impl Sampler {
    fn start(ports: Vec<u16>) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = thread::spawn(move || {
            let (mut lags, mut samples, mut unsynced) = (Vec::new(), 0, 0);
            while !flag.load(Ordering::Acquire) {
                for &port in &ports {
                    let response = common::get(port, "/ratelimit/zones/api");
                    let zone: serde_json::Value =
                        serde_json::from_str(&response.text()).unwrap_or_default();
                    samples += 1;
                    if zone["sync"]["mode"] != "synced" {
                        unsynced += 1;
                    }
                    if let Some(lag) = zone["sync"]["lag_ms"].as_f64() {
                        lags.push(lag);
                    }
                }
                thread::sleep(Duration::from_millis(100));
            }
            (lags, samples, unsynced)
        });
        Sampler { stop, handle }
    }

    fn finish(self) -> (Vec<f64>, usize, usize) {
        self.stop.store(true, Ordering::Release);
        self.handle.join().expect("sampler")
    }
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(|a, b| a.total_cmp(b));
    values[((values.len() - 1) as f64 * p).round() as usize]
}

const SPAN_SECS: u64 = 6;

/// One row of the distinct-keys table: `per_sec` distinct keys a second offered to the fleet
/// of `count` instances (split evenly), plus two probes of four connections at 800 r/s on
/// the first instance, one to the sync zone and one to the same zone without sync.
fn distinct_keys_row(per_sec: u64, count: usize) -> String {
    let fleet = fleet(count, ZONE);
    let ports: Vec<u16> = fleet.instances.iter().map(Nginx::port).collect();
    let before = redis_totals(&fleet.redis);
    let threads: Vec<Option<(u32, u32)>> = fleet.instances.iter().map(loop_thread).collect();
    let cpu_before: Vec<f64> = threads
        .iter()
        .map(|t| t.map_or(0.0, |(pid, tid)| cpu_ticks(pid, tid)))
        .collect();
    let sampler = Sampler::start(ports.clone());
    let (connections, delay) = pacing(per_sec / count as u64);
    let started = Instant::now();
    let bulk: Vec<Child> = ports
        .iter()
        .enumerate()
        .map(|(i, port)| {
            wrk(
                &format!("http://127.0.0.1:{port}/s"),
                connections,
                delay,
                SPAN_SECS,
                &format!("b{i}"),
            )
        })
        .collect();
    let probe_sync = wrk(
        &format!("http://127.0.0.1:{}/s", ports[0]),
        4,
        5,
        SPAN_SECS,
        "ps",
    );
    let probe_plain = wrk(
        &format!("http://127.0.0.1:{}/p", ports[0]),
        4,
        5,
        SPAN_SECS,
        "pp",
    );
    let bulk: Vec<Wrk> = bulk.into_iter().map(wrk_result).collect();
    let (probe_sync, probe_plain) = (wrk_result(probe_sync), wrk_result(probe_plain));
    let elapsed = started.elapsed().as_secs_f64();
    let (mut lags, samples, unsynced) = sampler.finish();
    let after = redis_totals(&fleet.redis);
    let ticks_per_sec = 100.0;
    let cpu: f64 = threads
        .iter()
        .zip(&cpu_before)
        .map(|(t, b)| t.map_or(0.0, |(pid, tid)| cpu_ticks(pid, tid) - b))
        .sum::<f64>()
        / ticks_per_sec
        / elapsed
        / count as f64;
    let memory: Vec<(f64, f64)> = threads
        .iter()
        .map(|t| t.map_or((0.0, 0.0), |(pid, _)| memory_mib(pid)))
        .collect();
    let peak = memory.iter().map(|m| m.1).fold(0.0, f64::max);
    let rss = memory.iter().map(|m| m.0).fold(0.0, f64::max);
    let load: f64 = bulk.iter().map(|w| w.requests).sum();
    // Every request to the sync zone: the load and the sync probe.
    let requests = load + probe_sync.requests;
    let seconds = bulk
        .iter()
        .map(|w| w.duration_us)
        .fold(0.0, f64::max)
        .max(1.0)
        / 1e6;
    let calls = (after.0 - before.0) / requests.max(1.0);
    let scripts = (after.3 - before.3) / requests.max(1.0);
    let bytes_in = (after.1 - before.1) / requests.max(1.0);
    let bytes_out = (after.2 - before.2) / requests.max(1.0);
    let rejected: f64 = bulk.iter().map(|w| w.non_2xx).sum();
    format!(
        "| {per_sec} | {count} | {:.0} | {scripts:.4} / {calls:.4} | {bytes_in:.1} / {bytes_out:.1} | {:.1} / {:.1} | {unsynced} of {samples} | {:.1}% | {rss:.0} / {peak:.0} | {:.2} / {:.2} | {rejected:.0} |",
        load / seconds,
        percentile(&mut lags, 0.5),
        percentile(&mut lags, 1.0),
        cpu * 100.0,
        probe_sync.p99_us / 1000.0,
        probe_plain.p99_us / 1000.0,
    )
}

/// One row of the stall table: `per_sec` distinct keys a second over three instances, a hot
/// key offered 10x its 100r/s spread over them, Redis stopped for `stall` two seconds in.
fn stall_row(per_sec: u64, stall: Duration) -> String {
    let count = 3;
    let fleet = fleet(count, ZONE);
    let ports: Vec<u16> = fleet.instances.iter().map(Nginx::port).collect();
    let (connections, delay) = pacing(per_sec / count as u64);
    let load_secs = 2 + stall.as_secs_f64().ceil() as u64 + 4;
    let bulk: Vec<Child> = ports
        .iter()
        .enumerate()
        .map(|(i, port)| {
            wrk(
                &format!("http://127.0.0.1:{port}/s"),
                connections,
                delay,
                load_secs,
                &format!("s{i}"),
            )
        })
        .collect();
    let hot_ports = ports.clone();
    let hot = thread::spawn(move || {
        offer_paths(
            &hot_ports,
            1000.0 / 3.0,
            Duration::from_secs(load_secs),
            "hot",
            &["/h"],
        )
    });
    thread::sleep(Duration::from_millis(2000));
    fleet.redis.signal(SIGSTOP);
    thread::sleep(stall);
    fleet.redis.signal(SIGCONT);
    let resumed = Instant::now();
    let mut synced_after = None;
    while resumed.elapsed() < Duration::from_secs(4) {
        if fleet
            .instances
            .iter()
            .all(|n| admin(n, "api")["sync"]["mode"] == "synced")
        {
            synced_after = Some(resumed.elapsed());
            break;
        }
        thread::sleep(Duration::from_millis(5));
    }
    let bulk: Vec<Wrk> = bulk.into_iter().map(wrk_result).collect();
    let answers: Vec<Answer> = hot.join().expect("hot key load");
    // The hot key during the stall (from 0.5 s into it: three missed intervals) and in the
    // two seconds after it.
    let stall_from = Duration::from_millis(2050)
        + if stall > Duration::from_secs(1) {
            Duration::from_millis(500)
        } else {
            Duration::ZERO
        };
    let stall_to = Duration::from_millis(2050) + stall;
    let during = passed_between_quiet(&answers, stall_from, stall_to) as f64
        / (100.0 * (stall_to - stall_from).as_secs_f64().max(0.001));
    let after_to = stall_to + Duration::from_secs(2);
    let after = passed_between_quiet(&answers, stall_to, after_to) as f64 / 200.0;
    // Idle: no traffic for a second, then a second of what Redis hears.
    thread::sleep(Duration::from_secs(1));
    let idle_mode: Vec<String> = fleet
        .instances
        .iter()
        .map(|n| {
            admin(n, "api")["sync"]["mode"]
                .as_str()
                .unwrap_or("?")
                .to_string()
        })
        .collect();
    let before = redis_totals(&fleet.redis);
    thread::sleep(Duration::from_secs(1));
    let idle_calls = redis_totals(&fleet.redis).0 - before.0;
    let achieved: f64 = bulk.iter().map(|w| w.requests).sum::<f64>() / load_secs as f64;
    let synced = synced_after.map_or("not within 4 s (NO)".to_string(), |d| {
        let ms = d.as_secs_f64() * 1000.0;
        format!("{ms:.0} ms ({})", if ms <= 200.0 { "yes" } else { "NO" })
    });
    // The bucket (burst=20) may pass at once on top of the rate, as in bench/cluster.sh.
    let during_bound = 1.10 + 21.0 / (100.0 * (stall_to - stall_from).as_secs_f64());
    let after_bound = 1.10 + 21.0 / 200.0;
    let within = during <= during_bound && after <= after_bound;
    format!(
        "| {per_sec} ({achieved:.0}) | {:.1} s | {synced} | {during:.2} / {after:.2} | <= {during_bound:.2} / {after_bound:.2} {} | {} | {idle_calls:.0} |",
        stall.as_secs_f64(),
        if within { "yes" } else { "NO" },
        idle_mode.join(", "),
    )
}

/// A zone of one algorithm and burst: three instances offered 10x L spread evenly (two paced
/// connections each), the same traffic to one nginx without sync, and 3x L to one instance.
fn exactness_row(algorithm: &str, burst: Option<u64>, mode: &str) -> String {
    let zone = match burst {
        Some(burst) => format!("rate=100r/s burst={burst} algorithm={algorithm}"),
        None => format!("rate=100r/s algorithm={algorithm}"),
    };
    let line = if algorithm == "leaky_bucket" {
        mode
    } else {
        ""
    };
    let config =
        |port: u16| common::fleet::instance_config_with(port, "interval=100ms", &zone, line);
    let redis = Redis::start();
    let instances: Vec<Nginx> = (0..3).map(|_| Nginx::start(&config(redis.port))).collect();
    // One nginx without `sync` (and without `rate_limit_sync`: not one of the fleet).
    let alone_config: String = config(redis.port)
        .replace(" sync;", ";")
        .lines()
        .filter(|line| !line.contains("rate_limit_sync "))
        .map(|line| format!("{line}\n"))
        .collect();
    let single = Nginx::start(&alone_config);
    redis.wait_instances(3);
    let ports: Vec<u16> = instances.iter().map(Nginx::port).collect();
    // The fleet and one nginx offered the same traffic at the same time; counted from the
    // first second on.
    let (span, from) = (Duration::from_secs(5), Duration::from_secs(1));
    let side_by_side = |fleet_ports: Vec<u16>, single_ports: Vec<u16>, per_sec: f64| {
        let other = thread::spawn(move || common::fleet::offer(&single_ports, per_sec, span, "k"));
        let mine = common::fleet::offer(&fleet_ports, per_sec, span, "k");
        let theirs = other.join().expect("load thread");
        (
            passed_between_quiet(&mine, from, span) as f64,
            passed_between_quiet(&theirs, from, span) as f64,
        )
    };
    let port = single.port();
    let (spread, alone) = side_by_side(ports.clone(), vec![port; 3], 1000.0);
    let (solo, solo_alone) = side_by_side(vec![ports[0]], vec![port], 1000.0);
    let ratio = spread / alone.max(1.0);
    let solo_ratio = solo / solo_alone.max(1.0);
    format!(
        "| {algorithm} | {} | {} | {alone:.0} | {spread:.0} | {ratio:.3} | {} | {solo_alone:.0} | {solo:.0} | {solo_ratio:.3} | {} |",
        burst.map_or("-".to_string(), |b| b.to_string()),
        if line.is_empty() { "-" } else { line },
        if (0.95..=1.05).contains(&ratio) { "0.95-1.05 yes" } else { "0.95-1.05 NO" },
        if solo_ratio >= 0.9 { ">= 0.9 yes" } else { ">= 0.9 NO" },
    )
}

/// One key as fast as wrk sends it to one instance, limit 1,000,000r/s burst=1000, to the
/// zone with `sync` and, at the same time, to the same limit without it.
fn far_under_row() -> String {
    let redis = Redis::start();
    let config = instance_config(redis.port, "interval=100ms", "rate=1000000r/s burst=1000")
        .replace("worker_processes 1;", "worker_processes 2;");
    let nginx = Nginx::start(&config);
    redis.wait_instances(1);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/wrk/report.lua");
    let run = |path: &str| {
        let url = format!("http://127.0.0.1:{}{path}?k=one", nginx.port());
        Command::new("wrk")
            .args(["-t1", "-c16", "-d5s", "--timeout", "5s", "-s", script, &url])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("wrk")
    };
    let (synced, plain) = (run("/s"), run("/p"));
    let (synced, plain) = (wrk_result(synced), wrk_result(plain));
    let rate = synced.requests / (synced.duration_us / 1e6).max(0.001);
    format!(
        "| 1000000r/s burst=1000 | one key, 1 of 1 instance | {rate:.0} | {:.0} of {:.0} | {:.0} of {:.0} | {} |",
        synced.non_2xx,
        synced.requests,
        plain.non_2xx,
        plain.requests,
        if synced.non_2xx <= plain.non_2xx { "none more than without sync: yes" } else { "none more than without sync: NO" },
    )
}

#[test]
fn cluster_scale() {
    let only = std::env::var("CLUSTER_SCALE_ONLY").unwrap_or_default();
    let wanted = |part: &str| only.is_empty() || only.split(',').any(|p| p == part);
    let mut out = String::from(
        "# Cluster sync at scale (bench/cluster-scale.sh)\n\n\
         Release module in the vendored nginx, one real `redis-server`, wrk on loopback, \
         `interval=100ms` (`timeout=50ms`), on the shared 2-core machine (other work running: \
         the figures are what this machine gave, not its best).\n",
    );
    if wanted("keys") {
        let mut rows = Vec::new();
        for per_sec in [1_000, 10_000, 100_000] {
            for count in [1, 2, 3] {
                rows.push(distinct_keys_row(per_sec, count));
                eprintln!("{}", rows.last().unwrap());
            }
        }
        out += &format!(
            "\n## Distinct keys\n\n\
             Every request is for a key never seen before (`$arg_k`), zone `{ZONE}` with `sync` \
             (one worker per instance), the offered rate split evenly over the instances by \
             paced wrk connections (`bench/wrk/distinct_keys.lua`), for {SPAN_SECS} s. \
             Two probes of four connections (about 800 r/s each) on the first instance, one to \
             the zone and one to the same zone without `sync`, give the p99 side by side. \
             `Redis calls/req`: Redis's `EVALSHA` calls / its calls of every command (those the \
             scripts run inside included) over the requests to the sync zone; `bytes/req`: bytes Redis received / sent per such request; `round ms`: the \
             instances' last round trip (median / max of samples every 100 ms); `not synced`: \
             samples of the instances' mode; `loop CPU`: the sync thread's CPU (per instance, \
             % of one core); `RSS MB`: the loop's worker now / at its peak. `429`: rejected \
             requests of the load (each key is new: none expected).\n\n\
             | keys/s offered | instances | achieved req/s | Redis calls/req EVALSHA / all | bytes/req in / out | round ms median / max | not synced | loop CPU | RSS MB now / peak | p99 ms sync / without | 429 |\n\
             | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n{}\n",
            rows.join("\n")
        );
    }
    if wanted("stalls") {
        let mut rows = Vec::new();
        for per_sec in [10_000, 100_000] {
            for stall in [Duration::from_millis(500), Duration::from_secs(5)] {
                rows.push(stall_row(per_sec, stall));
                eprintln!("{}", rows.last().unwrap());
            }
        }
        out += &format!(
            "\n## Redis stalls\n\n\
             Three instances, distinct keys as above (offered, achieved in parentheses) and a \
             hot key of its own zone (100r/s burst=20, configured after the distinct keys' \
             zone) offered 10x over the instances; Redis SIGSTOPped two seconds in, then \
             SIGCONTed. `synced again`: from SIGCONT until every instance's mode is `synced` \
             (target: two intervals, 200 ms). `hot key`: its admitted requests over L·t during \
             the stall (from 0.5 s into it for the 5 s one, once on_failure applies) / in the \
             two seconds after it; target 1.10 plus the bucket (21 requests) over L·t, as in \
             bench/results/cluster.md. `idle`: the \
             modes a second after the load ended, and Redis's calls in the next second.\n\n\
             | keys/s (achieved) | stall | synced again | hot key /L·t during / after | target | idle mode | idle Redis calls/s |\n\
             | --- | --- | --- | --- | --- | --- | --- |\n{}\n",
            rows.join("\n")
        );
    }
    if wanted("bursts") {
        let mut rows = Vec::new();
        for burst in [0, 1, 5, 20] {
            for mode in ["nodelay", "delay=1"] {
                rows.push(exactness_row("leaky_bucket", Some(burst), mode));
                eprintln!("{}", rows.last().unwrap());
            }
        }
        for burst in [1, 5, 20] {
            rows.push(exactness_row("token_bucket", Some(burst), ""));
            eprintln!("{}", rows.last().unwrap());
        }
        rows.push(exactness_row("sliding_window", None, ""));
        eprintln!("{}", rows.last().unwrap());
        out += &format!(
            "\n## One key, small bursts\n\n\
             L = 100r/s. \"Admits L\" is what ONE nginx without `sync` admits of the same \
             traffic, offered at the same time (limit_req with a small burst admits less than \
             L even alone when arrivals do not fall on its schedule). `spread`: 30x L from six \
             paced keep-alive connections, their requests evenly interleaved (one every \
             0.33 ms), two to each of three instances with `sync`, against the same six to one \
             nginx. `one instance`: 10x L from two connections (one request every ms) to one \
             instance of the three, against the same two to one nginx. Admitted requests from \
             1 s to 5 s (the key's first second, with its one-time room granted ahead, is \
             bounded in bench/results/cluster.md). Targets: spread 0.95-1.05 of one nginx, one \
             instance at least 0.9 of it.\n\n\
             | algorithm | burst | line | one nginx | 3 instances | spread ratio | target | one nginx | 1 of 3 instances | ratio | target |\n\
             | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n{}\n",
            rows.join("\n")
        );
    }
    if wanted("far") {
        let row = far_under_row();
        eprintln!("{row}");
        out += &format!(
            "\n## A hot key far under its limit\n\n\
             One instance (two workers), one key from two wrk at once (16 connections each, as \
             fast as they go, 5 s): one to the zone with `sync`, one to the same limit without \
             it (what the limit alone rejects: a worker descheduled for a millisecond on a \
             loaded machine can see a stale clock).\n\n\
             | limit | traffic | achieved req/s (sync) | rejected with sync | rejected without | target |\n\
             | --- | --- | --- | --- | --- | --- |\n{row}\n"
        );
    }
    let module = std::env::var("RATE_LIMIT_MODULE").map_or_else(
        |_| "the debug build".to_string(),
        |path| {
            let name = std::path::Path::new(&path)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned());
            format!("release build ({})", name.unwrap_or(path))
        },
    );
    let label = std::env::var("CLUSTER_SCALE_LABEL").unwrap_or_default();
    out += &format!(
        "\nModule: {module}{}{label}.\n",
        if label.is_empty() { "" } else { ", " }
    );
    let path = std::env::var("CLUSTER_SCALE_OUT").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/bench/results/cluster-scale.md"
        )
        .to_string()
    });
    std::fs::write(&path, &out).expect("cannot write the bench table");
    eprintln!("{out}");
    common::fleet::assert_goals_met(&out, &path);
}
