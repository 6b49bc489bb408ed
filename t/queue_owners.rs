//! Queue tickets are owned like slots (issue 27, point 1): a worker killed with requests
//! queued leaves no ticket behind (the sweep that gives back its slots empties the queues it
//! held tickets in, and the other workers' waiters queue again), a reload under load never
//! leaves a key locked (a worker with queued requests serves them before it exits), and an
//! admin `DELETE` of a busy key empties its queue.
//!
//! Before the fix: the killed worker's 4 tickets stayed (`queued=5` with the survivor's,
//! every newcomer refused at once until each dead head stood still for `queue_timeout` + 1 s
//! in turn), the reloads logged `open socket ... left in connection` and left tickets and
//! slots, and `DELETE` answered "not tracked".

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::upstream::Upstream;
use common::workers::{keyed, start_on_worker, wait_standing, PATIENCE};
use common::{send, start_request, Nginx, Request};

const TEMPLATE: &str = r#"
load_module %%MODULE%%;
worker_processes 2;
error_log logs/error.log info;
events { worker_connections 512; }
http {
    access_log off;
    rate_limit_zone $http_x_key zone=full:1m algorithm=concurrency limit=1 queue=5 queue_timeout=60s;
    rate_limit_zone $http_x_key zone=busy:1m algorithm=concurrency limit=4 queue=20 queue_timeout=2s;

    server {
        listen 127.0.0.1:%%PORT%% reuseport;
        add_header X-Pid $pid always;
        add_header X-Status $rate_limit_status always;

        location = /pid { return 200 "$pid"; }
        location /full/ {
            rate_limit zone=full;
            proxy_pass http://127.0.0.1:@UPSTREAM@/;
        }
        location /busy/ {
            rate_limit zone=busy;
            proxy_pass http://127.0.0.1:@UPSTREAM@/;
        }
        location /admin/ {
            rate_limit_admin write=on;
        }
    }
}
"#;

fn start(upstream: &Upstream) -> Nginx {
    Nginx::start(&TEMPLATE.replace("@UPSTREAM@", &upstream.port().to_string()))
}

fn kill(pid: u32) {
    // SAFETY: plain kill(2) on a pid of this test's nginx.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
}

/// Worker A holds 4 of the 5 tickets of a key, worker B the slot and one ticket (the third).
/// Killed, A's tickets go with it: its replacement empties the queue, B's waiter queues
/// again and is served when the slot comes back, and a newcomer queues rather than being
/// refused.
#[test]
fn a_killed_worker_takes_its_tickets_with_it() {
    let upstream = Upstream::start();
    let nginx = start(&upstream);
    let workers = nginx.worker_pids();
    assert_eq!(workers.len(), 2, "{workers:?}");
    let (a, b) = (workers[0], workers[1]);
    let holder = start_on_worker(nginx.port(), b, &keyed("/full/hold/holder", "k"));
    upstream.wait_arrivals(1, PATIENCE);

    let mut doomed = Vec::new();
    let mut survivor = None;
    for i in 0..5u64 {
        if i == 2 {
            survivor = Some(start_on_worker(
                nginx.port(),
                b,
                &keyed("/full/hold/survivor", "k"),
            ));
        } else {
            doomed.push(start_on_worker(
                nginx.port(),
                a,
                &keyed(&format!("/full/hold/d{i}"), "k"),
            ));
        }
        wait_standing(&nginx, "full", "k", (1, i + 1));
    }
    let refused = send(nginx.port(), &keyed("/full/plain", "k"));
    assert_eq!(refused.status, 429, "the queue is full: {}", refused.text());

    kill(a);
    let deadline = Instant::now() + PATIENCE;
    loop {
        let now = nginx.worker_pids();
        if now.len() == 2 && !now.contains(&a) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "worker {a} not replaced: {now:?}"
        );
        thread::sleep(Duration::from_millis(20));
    }
    // Only the survivor's ticket is left (queued again).
    wait_standing(&nginx, "full", "k", (1, 1));
    drop(doomed);
    let newcomer = start_request(nginx.port(), &keyed("/full/hold/newcomer", "k"));
    wait_standing(&nginx, "full", "k", (1, 2));

    upstream.release_all();
    assert_eq!(holder.finish().status, 200);
    let served = survivor.unwrap().finish();
    assert_eq!(served.status, 200, "{}", served.text());
    assert_eq!(served.header("X-Status"), Some("QUEUED"));
    let served = newcomer.finish();
    assert_eq!(served.status, 200, "{}", served.text());
    assert_eq!(
        upstream.arrivals(),
        ["/hold/holder", "/hold/survivor", "/hold/newcomer"]
    );
    wait_standing(&nginx, "full", "k", (0, 0));
    let log = nginx.error_log();
    assert!(
        log.contains("emptied queues of 5 tickets held by the process that ran in process slot"),
        "{log}"
    );
}

/// One plain request on a new connection; its status, `None` when nginx closed the
/// connection without an answer (a reload).
fn hit(port: u16, path: &str, key: &str) -> Option<u16> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(PATIENCE)).ok()?;
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: t\r\nX-Key: {key}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).ok()?;
    let text = String::from_utf8_lossy(&answer);
    text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

/// `limit=4 queue=20` with 200 ms requests at 30 r/s (capacity 20 r/s: the queue is always in
/// use) and a reload every 2.5 s: when the load stops, the key has nothing in flight and
/// nothing queued, and it passes again. No worker exits with a queued request's socket open.
#[test]
fn reloads_under_load_leave_no_key_locked() {
    let upstream = Upstream::start();
    let mut nginx = start(&upstream);
    let port = nginx.port();
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicU64::new(0));
    let load = {
        let (stop, served) = (stop.clone(), served.clone());
        thread::spawn(move || {
            let mut clients = Vec::new();
            let started = Instant::now();
            let mut sent = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let due = started + Duration::from_millis(33) * sent;
                thread::sleep(due.saturating_duration_since(Instant::now()));
                let served = served.clone();
                clients.push(thread::spawn(move || {
                    if hit(port, "/busy/sleep/200", "k") == Some(200) {
                        served.fetch_add(1, Ordering::Relaxed);
                    }
                }));
                sent += 1;
            }
            for client in clients {
                let _ = client.join();
            }
            sent
        })
    };
    for _ in 0..4 {
        thread::sleep(Duration::from_millis(2500));
        nginx.reload();
    }
    thread::sleep(Duration::from_millis(1000));
    stop.store(true, Ordering::Relaxed);
    let sent = load.join().unwrap();
    let served = served.load(Ordering::Relaxed);
    eprintln!("sent {sent}, served {served}");
    assert!(served > 0, "nothing served of {sent}");

    wait_standing(&nginx, "busy", "k", (0, 0));
    assert_eq!(hit(port, "/busy/plain", "k"), Some(200));
    let log = nginx.error_log();
    assert!(!log.contains("open socket"), "{log}");
}

/// `DELETE` of a key with a request in flight and one queued: the queue is emptied (the
/// waiter queues again), the request in flight keeps its slot.
#[test]
fn delete_empties_a_busy_key_queue() {
    let upstream = Upstream::start();
    let nginx = start(&upstream);
    let holder = start_request(nginx.port(), &keyed("/full/hold/holder", "k"));
    upstream.wait_arrivals(1, PATIENCE);
    let waiter = start_request(nginx.port(), &keyed("/full/hold/waiter", "k"));
    wait_standing(&nginx, "full", "k", (1, 1));

    let deleted = send(
        nginx.port(),
        &Request::new("DELETE", "/admin/zones/full/keys/k"),
    );
    assert_eq!(deleted.status, 204, "{}", deleted.text());
    // The waiter is back in the (emptied) queue; the slot is still the holder's.
    wait_standing(&nginx, "full", "k", (1, 1));
    upstream.release_all();
    assert_eq!(holder.finish().status, 200);
    let served = waiter.finish();
    assert_eq!(served.status, 200, "{}", served.text());
    wait_standing(&nginx, "full", "k", (0, 0));
}
