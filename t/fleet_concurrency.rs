//! `algorithm=concurrency limit=N sync`: one concurrency limit for a fleet of nginx
//! instances, handed out as leases through a real Redis (docs/cluster.md). An upstream in
//! this process holds every request 0.5 s and records each arrival and departure, so the
//! test knows how many requests of the fleet were in flight at every instant.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::fleet::{wait_mode, wait_rounds};
use common::nginx::sys::{self, SIGKILL};
use common::redis::Redis;
use common::{Connection, Nginx, Request};

/// The tests measure time on a shared machine: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// The fleet's limit.
const LIMIT: usize = 12;
/// How long the upstream holds each request.
const HOLD: Duration = Duration::from_millis(500);
/// `interval=` of the fleet's sync loop.
const INTERVAL_MS: u64 = 100;

fn instance(redis_port: u16, upstream_port: u16) -> Nginx {
    instance_of(&format!("redis://127.0.0.1:{redis_port}"), upstream_port)
}

/// An instance of the fleet synced through `url` (`redis://…`, `redis-sentinel://…`).
fn instance_of(url: &str, upstream_port: u16) -> Nginx {
    Nginx::start(&format!(
        r#"
load_module %%MODULE%%;
worker_processes 2;
error_log logs/error.log info;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    rate_limit_sync {url} interval={INTERVAL_MS}ms;
    rate_limit_zone $http_x_key zone=api:1m algorithm=concurrency limit={LIMIT} queue=100
                    queue_timeout=60s sync;
    server {{
        listen 127.0.0.1:%%PORT%%;
        location / {{
            rate_limit zone=api;
            proxy_pass http://127.0.0.1:{upstream_port};
        }}
        location /ratelimit/ {{ rate_limit_admin; }}
    }}
}}
"#
    ))
}

/// Requests in flight at the upstream now, and `(when, in flight after)` at each change.
type InFlightLog = Mutex<(usize, Vec<(Duration, usize)>)>;

/// An upstream that holds each request [`HOLD`] (less when nginx closes it first) and logs `(when, in flight after)` at each
/// arrival and departure.
struct Counter {
    port: u16,
    started: Instant,
    log: Arc<InFlightLog>,
}

impl Counter {
    fn start() -> Counter {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the counting upstream");
        let port = listener.local_addr().unwrap().port();
        let started = Instant::now();
        let log = Arc::new(Mutex::new((0usize, Vec::new())));
        let shared = Arc::clone(&log);
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let log = Arc::clone(&shared);
                thread::spawn(move || serve(stream, started, &log));
            }
        });
        Counter { port, started, log }
    }

    fn events(&self) -> Vec<(Duration, usize)> {
        self.log.lock().unwrap().1.clone()
    }

    fn in_flight(&self) -> usize {
        self.log.lock().unwrap().0
    }
}

fn serve(stream: TcpStream, started: Instant, log: &InFlightLog) {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) if line == "\r\n" => break,
            Ok(_) => {}
        }
    }
    let change = |delta: isize| {
        let mut log = log.lock().unwrap();
        log.0 = log.0.checked_add_signed(delta).unwrap();
        let now = (started.elapsed(), log.0);
        log.1.push(now);
    };
    change(1);
    // Held HOLD, or until nginx's side closes: a request whose worker was killed is not in
    // flight any more (its client got a reset), though a slower upstream would not notice.
    let deadline = Instant::now() + HOLD;
    let mut byte = [0u8; 1];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let stream = reader.get_mut();
        stream.set_read_timeout(Some(left)).unwrap();
        match stream.read(&mut byte) {
            Ok(0) => {
                change(-1);
                return;
            }
            Ok(_) => {}
            Err(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                break
            }
            Err(_) => {
                change(-1);
                return;
            }
        }
    }
    change(-1);
    let _ = reader
        .get_mut()
        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
}

/// The most in flight at once, and the time-weighted mean in flight over `[from, to)`.
fn in_flight_over(events: &[(Duration, usize)], from: Duration, to: Duration) -> (usize, f64) {
    // In flight at `from`: after the last change at or before it.
    let mut level = events
        .iter()
        .take_while(|&&(when, _)| when <= from)
        .last()
        .map_or(0, |&(_, after)| after);
    let mut most = level;
    let mut at = from;
    let mut area = 0.0;
    for &(when, after) in events.iter().filter(|&&(when, _)| when > from && when < to) {
        area += level as f64 * (when - at).as_secs_f64();
        at = when;
        level = after;
        most = most.max(after);
    }
    area += level as f64 * (to - at).as_secs_f64();
    (most, area / (to - from).as_secs_f64())
}

/// One client: requests of key `tenant` one after another on one keep-alive connection to
/// each port of `plan` (a new one when its worker dies) until that step's end (from
/// `start`). The statuses it got.
fn client(plan: Vec<(u16, Duration)>, start: Instant) -> Vec<u16> {
    let mut statuses = Vec::new();
    for (port, until) in plan {
        let mut connection = Connection::open(port);
        while start.elapsed() < until {
            match connection.try_send(&Request::get("/").header("X-Key", "tenant")) {
                Ok(response) => statuses.push(response.status),
                Err(_) => {
                    // Its worker was killed: connect again (another worker answers). The
                    // instance was killed: this client is done.
                    if TcpStream::connect(("127.0.0.1", port)).is_err() {
                        return statuses;
                    }
                    connection = Connection::open(port);
                }
            }
        }
    }
    statuses
}

/// The zone's `lease` in the admin API: the permits the instance holds now.
fn lease(nginx: &Nginx) -> u64 {
    let response = common::get(nginx.port(), "/ratelimit/zones/api");
    assert_eq!(response.status, 200, "{}", response.text());
    let zone: serde_json::Value = serde_json::from_str(&response.text()).expect("zone JSON");
    zone["lease"]
        .as_u64()
        .unwrap_or_else(|| panic!("no lease in {zone}"))
}

/// Polls (every 5 ms, failing after `within`) until each instance holds its lease of
/// `leases`.
fn wait_leases(leases: &[(&Nginx, u64)], within: Duration) {
    let started = Instant::now();
    loop {
        let held: Vec<u64> = leases.iter().map(|(nginx, _)| lease(nginx)).collect();
        if held
            .iter()
            .zip(leases)
            .all(|(held, (_, wanted))| held == wanted)
        {
            return;
        }
        let logs: String = leases.iter().map(|(nginx, _)| nginx.error_log()).collect();
        let wanted: Vec<u64> = leases.iter().map(|(_, wanted)| *wanted).collect();
        assert!(
            started.elapsed() < within,
            "leases {held:?}, not {wanted:?}, after {within:?}\n{logs}"
        );
        thread::sleep(Duration::from_millis(5));
    }
}

/// A real Redis, the counting upstream and `count` instances, every one synced.
fn start_fleet(count: usize) -> (Redis, Counter, Vec<Nginx>) {
    let redis = Redis::start();
    let upstream = Counter::start();
    let fleet: Vec<Nginx> = (0..count)
        .map(|_| instance(redis.port, upstream.port))
        .collect();
    redis.wait_instances(count);
    synced(&fleet.iter().collect::<Vec<_>>());
    (redis, upstream, fleet)
}

/// `clients` clients spread over `ports` in turn, each sending for a minute (or until its
/// instance goes away).
fn load(ports: &[u16], clients: usize) -> Vec<thread::JoinHandle<Vec<u16>>> {
    let start = Instant::now();
    (0..clients)
        .map(|at| {
            let plan = vec![(ports[at % ports.len()], Duration::from_secs(60))];
            thread::spawn(move || client(plan, start))
        })
        .collect()
}

fn synced(fleet: &[&Nginx]) {
    for nginx in fleet {
        wait_mode(nginx, "synced", Duration::from_secs(10));
        wait_rounds(nginx, 3, Duration::from_secs(10));
    }
}

/// Three instances, `limit=12 sync`, requests of 0.5 s: 36 clients (12 per instance) for
/// 6 s, then all 36 on one instance for 6 s. Never more than 12 in flight at the upstream,
/// and at least 10.2 on average from the 2nd second of each phase on: the leases follow the
/// demand (4 each, then 12 on the one instance as the others give theirs back).
#[test]
fn one_limit_for_the_fleet_follows_the_demand() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let (redis, upstream, fleet) = start_fleet(3);

    let phase = Duration::from_secs(6);
    let start = Instant::now();
    let offset = start - upstream.started;
    let clients: Vec<_> = (0..36)
        .map(|at| {
            let plan = vec![(fleet[at % 3].port(), phase), (fleet[0].port(), 2 * phase)];
            thread::spawn(move || client(plan, start))
        })
        .collect();
    let statuses: Vec<u16> = clients
        .into_iter()
        .flat_map(|client| client.join().unwrap())
        .collect();
    let events = upstream.events();
    let (most, _) = in_flight_over(&events, Duration::ZERO, offset + 3 * phase);
    let second = Duration::from_secs(1);
    let (_, spread) = in_flight_over(&events, offset + second, offset + phase);
    let (_, one) = in_flight_over(&events, offset + phase + second, offset + 2 * phase);
    let logs: String = fleet.iter().map(Nginx::error_log).collect();
    println!(
        "fleet concurrency: {} requests, most in flight {most}, mean {spread:.2} (12 per \
         instance), {one:.2} (36 on one)",
        statuses.len()
    );
    assert!(
        statuses.iter().all(|&status| status == 200),
        "a request was refused: {:?}\n{logs}",
        statuses.iter().filter(|&&s| s != 200).collect::<Vec<_>>()
    );
    assert!(
        most <= LIMIT,
        "{most} in flight at once, over the fleet's {LIMIT}\n{logs}"
    );
    assert!(
        spread >= 10.2,
        "{spread:.2} in flight on average with 12 clients per instance\n{logs}"
    );
    assert!(
        one >= 10.2,
        "{one:.2} in flight on average with all clients on one instance\n{logs}"
    );
    // Idle again: after a round that gives the last leases back, no instance asks Redis
    // about the key any more.
    for nginx in &fleet {
        wait_rounds(nginx, 3, Duration::from_secs(10));
    }
    let asked = redis.calls("eval");
    assert!(asked > 100, "{asked} lease calls in 12 s of traffic");
    for nginx in &fleet {
        wait_rounds(nginx, 5, Duration::from_secs(10));
    }
    assert_eq!(redis.calls("eval"), asked, "lease calls for an idle key");
}

/// An instance killed with SIGKILL while it holds half the limit: its lease expires in Redis
/// 3 intervals after its last round, and the survivor holds the whole limit by its next
/// round: within 4 intervals (400 ms) of the kill, measured here with 1 s of slack for a
/// loaded machine.
#[test]
fn a_killed_instance_gives_its_leases_back() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let (_redis, upstream, mut fleet) = start_fleet(2);
    let victim = fleet.pop().unwrap();
    let survivor = fleet.pop().unwrap();
    let clients = load(&[survivor.port(), victim.port()], 24);
    // Both hold half the limit; the key's view says so.
    wait_leases(&[(&survivor, 6), (&victim, 6)], Duration::from_secs(10));
    let key = common::get(victim.port(), "/ratelimit/zones/api/keys/tenant");
    let key: serde_json::Value = serde_json::from_str(&key.text()).expect("key JSON");
    assert_eq!(
        (&key["lease"], &key["limit"]),
        (&6.into(), &12.into()),
        "{key}"
    );
    // The master first: killed after its workers, it could fork a new one in between, and
    // the instance would live on.
    let mut pids = vec![victim.master_pid()];
    pids.extend(victim.worker_pids());
    let killed = Instant::now();
    for pid in pids {
        sys::signal(pid as i32, SIGKILL);
    }
    wait_leases(&[(&survivor, LIMIT as u64)], Duration::from_secs(5));
    let back = killed.elapsed();
    let bound = Duration::from_millis(4 * INTERVAL_MS);
    println!(
        "fleet concurrency: the killed instance's leases back after {back:?} (bound {bound:?})"
    );
    assert!(
        back <= bound + Duration::from_secs(1),
        "leases back after {back:?}, bound {bound:?}\n{}",
        survivor.error_log()
    );
    // And the survivor uses them: 12 in flight at the upstream (the killed instance's
    // requests there ended within 0.5 s).
    let using = Instant::now();
    while upstream.in_flight() < LIMIT {
        assert!(
            using.elapsed() < Duration::from_secs(3),
            "{} in flight after the survivor took the whole limit",
            upstream.in_flight()
        );
        thread::sleep(Duration::from_millis(10));
    }
    drop(clients);
    drop(victim);
}

/// Redis stopped (SIGSTOP) while one of two instances holds the whole limit: once
/// `on_failure=local_share` is in force and its lease has run out, the instance admits
/// `12 / 2` (two instances seen at the last round), and the whole limit again once Redis
/// answers.
#[test]
fn local_share_when_redis_stops() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let (redis, upstream, fleet) = start_fleet(2);
    let busy = &fleet[0];
    let clients = load(&[busy.port()], 12);
    wait_leases(&[(busy, LIMIT as u64)], Duration::from_secs(10));
    redis.signal(common::redis::SIGSTOP);
    wait_mode(busy, "local_share", Duration::from_secs(10));
    // Its lease ran out (3 intervals) and its requests over 6 ended (0.5 s) well before.
    let from = upstream.started.elapsed() + Duration::from_secs(1);
    let to = from + Duration::from_secs(2);
    while upstream.started.elapsed() < to {
        thread::sleep(Duration::from_millis(50));
    }
    let (most, mean) = in_flight_over(&upstream.events(), from, to);
    println!("fleet concurrency: local_share with Redis stopped: most {most}, mean {mean:.2}");
    assert!(
        most <= LIMIT / 2,
        "{most} in flight under local_share (12 / 2 instances)\n{}",
        busy.error_log()
    );
    assert!(mean >= 5.0, "{mean:.2} in flight under local_share");
    redis.signal(common::redis::SIGCONT);
    wait_mode(busy, "synced", Duration::from_secs(10));
    wait_leases(&[(busy, LIMIT as u64)], Duration::from_secs(5));
    drop(fleet);
    drop(clients);
}

/// The lease script Redis runs is `ratelimit_core::lease::serve`: the same requests (three
/// instances, leases kept and wanted at random, some requests stale) get the same replies
/// from a real Redis as from the Rust function. Leases live 10 minutes here, so none expires
/// during the test and Redis's clock does not matter.
#[test]
fn the_lease_script_is_serve() {
    let redis = Redis::start();
    script_is_serve(&redis, false);
    // With the key of when the server's records began (not on Cluster): new, so no lease
    // grows for 800 s here, in the script as in `serve_since`.
    script_is_serve(&redis, true);
}

fn script_is_serve(redis: &Redis, with_since: bool) {
    use ratelimit_core::lease::{serve, serve_since, LeaseReply, LeaseRequest, SERVE_SCRIPT};
    use std::collections::BTreeMap;

    let mut since = None;
    let hash = format!("rl:z:lease:{}", u8::from(with_since));
    let keys: Vec<&str> = if with_since {
        vec!["2", &hash, "rl:lease:since"]
    } else {
        vec!["1", &hash]
    };
    let ttl_ms = 600_000u64;
    let mut holders = BTreeMap::new();
    let mut seqs = [0u64; 3];
    let mut random = 0x2545_f491_4f6c_dd1du64;
    let mut next = |below: u64| {
        random ^= random << 13;
        random ^= random >> 7;
        random ^= random << 17;
        random % below
    };
    for round in 0..150 {
        let limit = 12;
        let at = next(3) as usize;
        // One request in ten repeats an old number: stale.
        if next(10) != 0 || seqs[at] == 0 {
            seqs[at] += 1 + next(3);
        }
        let request = LeaseRequest {
            instance: at as u64 + 1,
            seq: seqs[at] - if next(10) == 0 { 1 } else { 0 },
            keep: next(14) as u32,
            want: next(16) as u32,
            in_use: next(15) as u32,
            grow: next(4) != 0,
        };
        let expected = if with_since {
            serve_since(&mut since, &mut holders, limit, &request, 0, ttl_ms)
        } else {
            serve(&mut holders, limit, &request, 0, ttl_ms)
        };
        let numbers = [
            request.seq,
            u64::from(request.keep),
            u64::from(request.want),
            u64::from(limit),
            ttl_ms,
            u64::from(request.in_use),
            u64::from(request.grow),
        ]
        .map(|number| number.to_string());
        let instance = format!("{:016x}", request.instance);
        let mut args = vec!["EVAL", SERVE_SCRIPT];
        args.extend(&keys);
        args.push(&instance);
        args.extend(numbers.iter().map(String::as_str));
        let reply = redis.cli(&args);
        let numbers: Vec<u64> = reply
            .split_whitespace()
            .map(|word| word.parse().unwrap_or_else(|_| panic!("reply {reply:?}")))
            .collect();
        let got = match numbers.as_slice() {
            [0, seq, ..] => LeaseReply::Stale { seq: *seq },
            [1, seq, lease, target, instances, known] => LeaseReply::Granted {
                seq: *seq,
                lease: *lease as u32,
                target: *target as u32,
                instances: *instances as u32,
                known: *known == 1,
            },
            _ => panic!("reply {reply:?}"),
        };
        assert_eq!(got, expected, "round {round}: {request:?}");
    }
}

/// The worker of `nginx` whose sync loop thread (`rate_limit_sync`) runs.
fn loop_worker(nginx: &Nginx) -> Option<u32> {
    nginx.worker_pids().into_iter().find(|pid| {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|task| {
                std::fs::read_to_string(task.path().join("comm"))
                    .is_ok_and(|name| name.trim() == "rate_limit_sync")
            })
    })
}

/// The worker that runs an instance's sync loop killed with SIGKILL while both instances hold
/// half the limit: another worker takes the loop over and renews the leases it finds in the
/// zone (its requests never wait for Redis); the fleet never has more than 12 in flight, and
/// the instance holds its 6 again.
#[test]
fn a_new_loop_adopts_the_leases_of_a_killed_one() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let (_redis, upstream, fleet) = start_fleet(2);
    let (first, second) = (&fleet[0], &fleet[1]);
    let clients = load(&[first.port(), second.port()], 24);
    wait_leases(&[(first, 6), (second, 6)], Duration::from_secs(10));
    let owner = loop_worker(first).expect("a worker runs the sync loop");
    let killed = upstream.started.elapsed();
    sys::signal(owner as i32, SIGKILL);
    let taken_over = Instant::now();
    while loop_worker(first).is_none_or(|pid| pid == owner) {
        assert!(
            taken_over.elapsed() < Duration::from_secs(10),
            "no worker took the loop over\n{}",
            first.error_log()
        );
        thread::sleep(Duration::from_millis(10));
    }
    wait_rounds(first, 5, Duration::from_secs(10));
    wait_leases(&[(first, 6), (second, 6)], Duration::from_secs(10));
    let (most, mean) = in_flight_over(&upstream.events(), killed, upstream.started.elapsed());
    println!("fleet concurrency: loop worker killed: most {most}, mean {mean:.2}");
    assert!(
        most <= LIMIT,
        "{most} in flight after the loop's worker was killed"
    );
    drop(fleet);
    drop(clients);
}

/// The faults of Redis the fleet's leases live through.
enum Fault {
    /// Redis stopped (SIGSTOP) for 4 s, then let go on (SIGCONT).
    Stopped(Redis),
    /// Redis killed and started again at once, empty.
    RestartedEmpty(Redis),
    /// The master killed: the sentinel promotes the replica.
    FailedOver(Box<common::redis::SentinelSet>),
}

/// Three instances of `limit=12 sync`, 36 clients of 0.5 s requests (12 per instance),
/// synced at 4 permits each; then `fault`. At most 12 in flight at the upstream at every
/// change from the fault on (`on_failure=local_share`: 12 / 3 on each instance while Redis
/// fails, and the requests admitted so claimed before any lease grows once it answers), and
/// at least 10.2 on average over the 3 s from 1 s after the last instance synced again.
fn through(fault: Fault) {
    let upstream = Counter::start();
    let (url, name) = match &fault {
        Fault::Stopped(redis) => (format!("redis://127.0.0.1:{}", redis.port), "stopped 4 s"),
        Fault::RestartedEmpty(redis) => (
            format!("redis://127.0.0.1:{}", redis.port),
            "restarted empty",
        ),
        Fault::FailedOver(set) => (
            format!("redis-sentinel://127.0.0.1:{}/fleet", set.sentinel.port),
            "failed over",
        ),
    };
    let fleet: Vec<Nginx> = (0..3).map(|_| instance_of(&url, upstream.port)).collect();
    synced(&fleet.iter().collect::<Vec<_>>());
    let ports: Vec<u16> = fleet.iter().map(Nginx::port).collect();
    let clients = load(&ports, 36);
    let four: Vec<(&Nginx, u64)> = fleet.iter().map(|nginx| (nginx, 4)).collect();
    wait_leases(&four, Duration::from_secs(10));
    let from = upstream.started.elapsed();
    let _kept = match fault {
        Fault::Stopped(redis) => {
            redis.signal(common::redis::SIGSTOP);
            let stopped = Instant::now();
            for nginx in &fleet {
                wait_mode(nginx, "local_share", Duration::from_secs(4));
            }
            thread::sleep(Duration::from_secs(4).saturating_sub(stopped.elapsed()));
            redis.signal(common::redis::SIGCONT);
            (Some(redis), None)
        }
        Fault::RestartedEmpty(mut redis) => {
            redis.kill();
            redis.spawn();
            assert_eq!(
                redis.cli(&["DBSIZE"]).trim(),
                "0",
                "Redis restarted with keys"
            );
            // Synced again: each instance's heartbeat is in the new server.
            redis.wait_instances(3);
            (Some(redis), None)
        }
        Fault::FailedOver(mut set) => {
            let killed_unix_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock")
                .as_millis();
            set.master.kill();
            // Synced again: each instance's heartbeat on the promoted replica is later than
            // the kill (the old master is dead; a replica takes no writes until promoted).
            let killed = Instant::now();
            loop {
                let reply = set.replica.cli(&[
                    "ZCOUNT",
                    "rl:instances",
                    &format!("({killed_unix_ms}"),
                    "+inf",
                ]);
                if reply.trim() == "3" {
                    break;
                }
                assert!(
                    killed.elapsed() < Duration::from_secs(20),
                    "not synced with the promoted replica 20 s after the kill: {reply}"
                );
                thread::sleep(Duration::from_millis(20));
            }
            (None, Some(set))
        }
    };
    for nginx in &fleet {
        wait_mode(nginx, "synced", Duration::from_secs(20));
    }
    let back = upstream.started.elapsed();
    let to = back + Duration::from_secs(4);
    while upstream.started.elapsed() < to {
        thread::sleep(Duration::from_millis(50));
    }
    let events = upstream.events();
    let (most, _) = in_flight_over(&events, from, to);
    let (_, mean) = in_flight_over(&events, back + Duration::from_secs(1), to);
    let logs: String = fleet.iter().map(Nginx::error_log).collect();
    println!(
        "fleet concurrency, Redis {name}: most in flight {most} from the fault on, mean \
         {mean:.2} once synced again (synced {:?} after the fault)",
        back - from
    );
    assert!(
        most <= LIMIT,
        "Redis {name}: {most} in flight at once, over the fleet's {LIMIT}\n{logs}"
    );
    assert!(
        mean >= 10.2,
        "Redis {name}: {mean:.2} in flight on average once synced again\n{logs}"
    );
    drop(fleet);
    drop(clients);
}

#[test]
fn leases_stay_within_the_limit_when_redis_stops() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    through(Fault::Stopped(Redis::start()));
}

#[test]
fn leases_stay_within_the_limit_when_redis_restarts_empty() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    through(Fault::RestartedEmpty(Redis::start()));
}

#[test]
fn leases_stay_within_the_limit_through_a_sentinel_failover() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    through(Fault::FailedOver(Box::new(
        common::redis::SentinelSet::start("fleet", None, None),
    )));
}
