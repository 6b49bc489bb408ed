//! An upstream for `proxy_pass` whose answers the test controls: requests that wait until the
//! test releases them, sleep, fail or close, and a record of the order in which they arrived.
//! One thread per connection, on a free loopback port; dropped, it releases everything and
//! stops accepting.
//!
//! Paths may have any prefix before these (`/app/hold/a` holds `a`):
//!
//! | path | answer |
//! |---|---|
//! | `/hold/NAME` | waits until [`Upstream::release`]`(NAME)` (or [`Upstream::release_all`]), then `200 NAME` |
//! | `/sleep/MS` | `200` after MS milliseconds |
//! | `/status/CODE` | `CODE` at once |
//! | `/close` | closes the connection without an answer (nginx answers 502) |
//! | anything else | `200` at once |

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

#[derive(Default)]
struct State {
    /// Paths in the order their requests arrived.
    arrived: Vec<String>,
    released: HashSet<String>,
    release_all: bool,
    /// Requests read and not yet answered.
    in_flight: usize,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    stopping: AtomicBool,
}

pub struct Upstream {
    port: u16,
    shared: Arc<Shared>,
}

impl Upstream {
    pub fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the test upstream");
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            stopping: AtomicBool::new(false),
        });
        let accepting = Arc::clone(&shared);
        thread::spawn(move || {
            for stream in listener.incoming() {
                if accepting.stopping.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let shared = Arc::clone(&accepting);
                thread::spawn(move || serve(stream, &shared));
            }
        });
        Upstream { port, shared }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Let the requests for `/hold/NAME` answer (now and later ones).
    pub fn release(&self, name: &str) {
        let mut state = self.shared.state.lock().unwrap();
        state.released.insert(name.to_string());
        self.shared.changed.notify_all();
    }

    /// Let every held request answer, and every later one at once.
    pub fn release_all(&self) {
        let mut state = self.shared.state.lock().unwrap();
        state.release_all = true;
        self.shared.changed.notify_all();
    }

    /// The paths of the requests that arrived, in order.
    pub fn arrivals(&self) -> Vec<String> {
        self.shared.state.lock().unwrap().arrived.clone()
    }

    /// Requests being handled now.
    pub fn in_flight(&self) -> usize {
        self.shared.state.lock().unwrap().in_flight
    }

    /// Wait until `count` requests have arrived in all; panics after `within`.
    pub fn wait_arrivals(&self, count: usize, within: Duration) -> Vec<String> {
        let deadline = Instant::now() + within;
        let mut state = self.shared.state.lock().unwrap();
        while state.arrived.len() < count {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "{} requests reached the upstream within {within:?}, not {count}: {:?}",
                state.arrived.len(),
                state.arrived
            );
            state = self.shared.changed.wait_timeout(state, left).unwrap().0;
        }
        state.arrived.clone()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.release_all();
        self.shared.stopping.store(true, Ordering::SeqCst);
        // Wake the accepting thread so that it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn serve(stream: TcpStream, shared: &Shared) {
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let mut writer = stream;
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
        return;
    }
    // The rest of the head; nginx sends no body for these requests.
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        if line == "\r\n" || line == "\n" {
            break;
        }
    }
    let path = request_line
        .split_whitespace()
        .nth(1)
        .unwrap_or("/")
        .to_string();
    {
        let mut state = shared.state.lock().unwrap();
        state.arrived.push(path.clone());
        state.in_flight += 1;
        shared.changed.notify_all();
    }
    let answer = answer(&path, shared);
    shared.state.lock().unwrap().in_flight -= 1;
    // One request per connection, as nginx's proxy_pass sends them by default.
    if let Some((status, body)) = answer {
        let response = format!(
            "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = writer.write_all(response.as_bytes());
    }
}

/// The status and body for `path` (its last `/hold/`, `/sleep/`, `/status/` or `/close`
/// part, so that a location may keep its own prefix in front).
fn answer(path: &str, shared: &Shared) -> Option<(u16, String)> {
    let after = |marker: &str| path.rfind(marker).map(|at| &path[at + marker.len()..]);
    if let Some(name) = after("/hold/") {
        let mut state = shared.state.lock().unwrap();
        while !state.release_all && !state.released.contains(name) {
            state = shared.changed.wait(state).unwrap();
        }
        return Some((200, name.to_string()));
    }
    if let Some(ms) = after("/sleep/") {
        thread::sleep(Duration::from_millis(ms.parse().unwrap_or(0)));
        return Some((200, "slept".into()));
    }
    if let Some(code) = after("/status/") {
        return Some((code.parse().unwrap_or(500), "status".into()));
    }
    if path.ends_with("/close") {
        return None;
    }
    Some((200, "ok".into()))
}
