//! A Redis that lies: a small RESP server (std threads, 127.0.0.1, a free port) that speaks
//! enough of the protocol for `rate_limit_sync` to be synced with it, and answers each kind of
//! call the way a test scripts it: out-of-range values, garbage, a huge array, silence, a
//! reset connection.
//!
//! It tells the module's calls apart by their first key, as the module names them: the
//! heartbeat (`PREFIX instances`), a zone's limits (`…:limits`) and overrides
//! (`…:overrides`), and anything else is a key script call (one reply triple per key). Its
//! "sane" answers are those of an idle fleet: nobody ahead, no history, one instance, the
//! zone's own limits, no overrides.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// How one kind of call is answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// What an idle fleet answers.
    Sane,
    /// This RESP text, as is (for key script calls: repeated once per key when it is
    /// `Answer::PerKey`).
    Raw(Vec<u8>),
    /// For key script calls: this RESP text once per key, inside one array (`*3n`).
    PerKey(Vec<Vec<u8>>),
    /// `*2147483647\r\n` followed by `bytes` bytes of `:1\r\n`, sent as fast as the client
    /// reads them.
    HugeArray { bytes: usize },
    /// Read the call, never answer (the connection stays open).
    Silence,
    /// Close the connection at once.
    Reset,
}

/// The script of the fake: one answer per kind of call, changed at any time by the test.
#[derive(Clone, Debug)]
pub struct Script {
    pub heartbeat: Answer,
    pub limits: Answer,
    pub overrides: Answer,
    pub keys: Answer,
}

impl Default for Script {
    fn default() -> Script {
        Script {
            heartbeat: Answer::Sane,
            limits: Answer::Sane,
            overrides: Answer::Sane,
            keys: Answer::Sane,
        }
    }
}

/// Calls the fake has seen, by kind.
#[derive(Default)]
pub struct Seen {
    pub heartbeats: AtomicU64,
    pub limits: AtomicU64,
    pub overrides: AtomicU64,
    pub key_calls: AtomicU64,
    pub keys: AtomicU64,
    pub connections: AtomicU64,
    /// Huge answers finished: written whole, or cut short by the client.
    pub huge_answers: AtomicU64,
}

pub struct FakeRedis {
    pub port: u16,
    script: Arc<Mutex<Script>>,
    pub seen: Arc<Seen>,
    stop: Arc<AtomicBool>,
}

impl FakeRedis {
    pub fn start() -> FakeRedis {
        let listener = TcpListener::bind("127.0.0.1:0").expect("cannot bind the fake Redis");
        let port = listener.local_addr().expect("local address").port();
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let fake = FakeRedis {
            port,
            script: Arc::new(Mutex::new(Script::default())),
            seen: Arc::new(Seen::default()),
            stop: Arc::new(AtomicBool::new(false)),
        };
        let (script, seen, stop) = (fake.script.clone(), fake.seen.clone(), fake.stop.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        seen.connections.fetch_add(1, Ordering::Relaxed);
                        let (script, seen, stop) = (script.clone(), seen.clone(), stop.clone());
                        thread::spawn(move || serve(stream, &script, &seen, &stop));
                    }
                    Err(_) => thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        fake
    }

    /// Change how the fake answers from the next call on.
    pub fn set(&self, change: impl FnOnce(&mut Script)) {
        change(&mut self.script.lock().unwrap());
    }

    pub fn key_calls(&self) -> u64 {
        self.seen.key_calls.load(Ordering::Relaxed)
    }

    pub fn limits_calls(&self) -> u64 {
        self.seen.limits.load(Ordering::Relaxed)
    }

    pub fn overrides_calls(&self) -> u64 {
        self.seen.overrides.load(Ordering::Relaxed)
    }

    pub fn heartbeats(&self) -> u64 {
        self.seen.heartbeats.load(Ordering::Relaxed)
    }
}

impl Drop for FakeRedis {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// An integer reply.
pub fn int(value: i64) -> Vec<u8> {
    format!(":{value}\r\n").into_bytes()
}

/// A bulk string reply.
pub fn bulk(text: &str) -> Vec<u8> {
    format!("${}\r\n{text}\r\n", text.len()).into_bytes()
}

/// An array reply of already encoded items.
pub fn array(items: &[Vec<u8>]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", items.len()).into_bytes();
    for item in items {
        out.extend_from_slice(item);
    }
    out
}

/// One command: its words.
fn read_command(reader: &mut BufReader<TcpStream>) -> Option<Vec<Vec<u8>>> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let count: usize = line.trim_end().strip_prefix('*')?.parse().ok()?;
    let mut words = Vec::with_capacity(count.min(1 << 16));
    for _ in 0..count {
        line.clear();
        reader.read_line(&mut line).ok()?;
        let len: usize = line.trim_end().strip_prefix('$')?.parse().ok()?;
        let mut word = vec![0; len + 2];
        reader.read_exact(&mut word).ok()?;
        word.truncate(len);
        words.push(word);
    }
    Some(words)
}

fn serve(stream: TcpStream, script: &Mutex<Script>, seen: &Seen, stop: &AtomicBool) {
    // Replies go out at once (no Nagle wait for the client's delayed acknowledgement).
    let _ = stream.set_nodelay(true);
    let mut writer = match stream.try_clone() {
        Ok(writer) => writer,
        Err(_) => return,
    };
    let mut reader = BufReader::new(stream);
    // Each limits key's value, as the fleet's would be.
    let mut limits: std::collections::HashMap<Vec<u8>, Vec<u8>> = Default::default();
    // Blocking reads: the connection ends when the module closes it.
    while let Some(words) = read_command(&mut reader) {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let name = words
            .first()
            .map(|word| word.to_ascii_uppercase())
            .unwrap_or_default();
        let answer = match name.as_slice() {
            b"PING" => Answer::Raw(b"+PONG\r\n".to_vec()),
            b"SCRIPT" => Answer::Raw(bulk(&"0".repeat(40))),
            b"EVALSHA" | b"EVAL" => {
                let script = script.lock().unwrap().clone();
                let numkeys: usize = words
                    .get(2)
                    .and_then(|word| std::str::from_utf8(word).ok()?.parse().ok())
                    .unwrap_or(0);
                let first = words.get(3).cloned().unwrap_or_default();
                if first.ends_with(b"instances") {
                    seen.heartbeats.fetch_add(1, Ordering::Relaxed);
                    match script.heartbeat {
                        Answer::Sane => Answer::Raw(int(1)),
                        other => other,
                    }
                } else if first.ends_with(b":limits") {
                    seen.limits.fetch_add(1, Ordering::Relaxed);
                    match script.limits {
                        Answer::Sane => {
                            // ARGV[1] (an instance's value), when given, becomes the fleet's.
                            let argv1 = words.get(3 + numkeys).cloned().unwrap_or_default();
                            if !argv1.is_empty() {
                                limits.insert(first.clone(), argv1);
                            }
                            Answer::Raw(match limits.get(&first) {
                                Some(value) => bulk(&String::from_utf8_lossy(value)),
                                None => b"$-1\r\n".to_vec(),
                            })
                        }
                        other => other,
                    }
                } else if first.ends_with(b":overrides") {
                    seen.overrides.fetch_add(1, Ordering::Relaxed);
                    match script.overrides {
                        Answer::Sane => {
                            let known = words.get(3 + numkeys).is_some_and(|v| v == b"1");
                            Answer::Raw(if known {
                                array(&[int(1)])
                            } else {
                                array(&[int(1), bulk("map")])
                            })
                        }
                        other => other,
                    }
                } else {
                    seen.key_calls.fetch_add(1, Ordering::Relaxed);
                    seen.keys.fetch_add(numkeys as u64, Ordering::Relaxed);
                    match script.keys {
                        Answer::Sane => Answer::Raw(array(&vec![int(0); 3 * numkeys])),
                        Answer::PerKey(items) => {
                            let mut all = Vec::new();
                            for _ in 0..numkeys {
                                all.extend(items.iter().cloned());
                            }
                            Answer::Raw(array(&all))
                        }
                        other => other,
                    }
                }
            }
            _ => Answer::Raw(b"+OK\r\n".to_vec()),
        };
        let sent = match answer {
            Answer::Raw(bytes) => writer.write_all(&bytes),
            Answer::HugeArray { bytes } => {
                let chunk = b":1\r\n".repeat(16 * 1024);
                let mut result = writer.write_all(b"*2147483647\r\n");
                let mut left = bytes;
                while left > 0 && result.is_ok() {
                    let take = left.min(chunk.len());
                    result = writer.write_all(&chunk[..take]);
                    left -= take;
                }
                seen.huge_answers.fetch_add(1, Ordering::Release);
                result
            }
            Answer::Silence => Ok(()),
            Answer::Reset => {
                let _ = writer.shutdown(Shutdown::Both);
                return;
            }
            Answer::Sane | Answer::PerKey(_) => Ok(()),
        };
        if sent.is_err() {
            return;
        }
    }
}
