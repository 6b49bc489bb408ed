//! The state file (`rate_limit_state_file`, version 2) cut short: a file truncated at every
//! line boundary and in the middle of every line restores each zone whose lines are intact,
//! exactly, and names in the error log the zones it cannot restore; with `PATH.prev` present
//! the damaged zones come back from the save before.

mod common;

use std::fs;
use std::path::PathBuf;

use common::admin::admin_json as admin;
use common::Nginx;
use serde_json::Value;

fn conf(path: &std::path::Path) -> String {
    common::admin::admin_api()
        .main("user root;")
        .http(&format!("rate_limit_state_file {};", path.display()))
        .build()
}

fn temp_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ngx-rate-limit-state-cut-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// The zone each line of the file belongs to (`None` for the header).
fn line_zones(text: &str) -> Vec<Option<String>> {
    text.lines()
        .map(|line| {
            let object = common::state_file::checked_line(line).expect("a damaged line");
            if let Some(zone) = object.get("zone") {
                return zone["name"].as_str().map(str::to_string);
            }
            let (_, records) = object.as_object()?.iter().next()?;
            records["zone"].as_str().map(str::to_string)
        })
        .collect()
}

/// `(rate, burst, overrides)` of zone `name` as the admin API shows it.
fn shown(nginx: &Nginx, name: &str) -> (Value, Value, Value) {
    let (_, zone) = admin(nginx, "GET", &format!("zones/{name}"), None);
    let (_, overrides) = admin(nginx, "GET", &format!("zones/{name}/overrides"), None);
    (zone["rate"].clone(), zone["burst"].clone(), overrides)
}

/// Start nginx with the admin changes of `changes`; returns what each zone shows after them.
fn save(conf: &str, changes: &[(&str, &str, &str)]) -> Vec<(String, (Value, Value, Value))> {
    let nginx = Nginx::start(conf);
    for (method, path, body) in changes {
        let (status, answer) = admin(&nginx, method, path, Some(body));
        assert!(status < 300, "{method} {path}: {status} {answer}");
    }
    let zones = ["one", "bucket", "log", "window"]
        .iter()
        .map(|name| (name.to_string(), shown(&nginx, name)))
        .collect();
    nginx.stop();
    zones
}

/// Every line's end, and the middle of every line.
fn cuts(text: &str) -> Vec<usize> {
    let mut cuts = Vec::new();
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        cuts.push(at + line.len() / 2);
        at += line.len();
        cuts.push(at);
    }
    cuts
}

#[test]
fn a_file_cut_anywhere_restores_its_intact_zones_and_names_the_others() {
    let dir = temp_dir();
    let path = dir.join("state.json");
    let conf = conf(&path);
    let older = save(
        &conf,
        &[
            ("PATCH", "zones/one", r#"{"rate": "3r/s", "burst": 4}"#),
            ("PATCH", "zones/log", r#"{"rate": "7r/m"}"#),
            (
                "PUT",
                "zones/one/overrides/old",
                r#"{"rate": "1r/s", "burst": 1}"#,
            ),
        ],
    );
    let newer = save(
        &conf,
        &[
            ("PATCH", "zones/one", r#"{"rate": "5r/s", "burst": 6}"#),
            ("PATCH", "zones/bucket", r#"{"burst": 9}"#),
            (
                "PUT",
                "zones/one/overrides/vip",
                r#"{"rate": "9r/s", "burst": 2}"#,
            ),
        ],
    );
    assert_ne!(older, newer);
    let text = fs::read_to_string(&path).unwrap();
    let previous = fs::read_to_string(format!("{}.prev", path.display())).unwrap();
    let owners = line_zones(&text);
    // What `PATH.prev` (the save before the last change) restores when it is read whole.
    fs::write(&path, &previous).unwrap();
    let nginx = Nginx::start(&conf);
    let older: Vec<_> = older
        .iter()
        .map(|(name, _)| (name.clone(), shown(&nginx, name)))
        .collect();
    nginx.stop();
    assert_ne!(older, newer);
    let cuts = cuts(&text);
    let mut outcomes = (0, 0, 0);
    for with_prev in [false, true] {
        for &cut in &cuts {
            fs::write(&path, &text[..cut]).unwrap();
            let prev_path = format!("{}.prev", path.display());
            if with_prev {
                fs::write(&prev_path, &previous).unwrap();
            } else {
                let _ = fs::remove_file(&prev_path);
            }
            // Whole lines before the cut.
            let whole = text[..cut].matches('\n').count();
            let nginx = Nginx::start(&conf);
            let log = nginx.error_log();
            for (i, (name, saved)) in newer.iter().enumerate() {
                let intact = owners
                    .iter()
                    .enumerate()
                    .filter(|(_, owner)| owner.as_deref() == Some(name))
                    .all(|(n, _)| n < whole);
                let now = shown(&nginx, name);
                if intact {
                    assert_eq!(&now, saved, "zone {name}, cut at {cut}:\n{log}");
                    outcomes.0 += 1;
                    continue;
                }
                let named = format!("zone \"{name}\" ");
                assert!(log.contains(&named), "cut at {cut}: {named} not in\n{log}");
                if with_prev {
                    assert_eq!(
                        now, older[i].1,
                        "zone {name}, cut at {cut}, from .prev:\n{log}"
                    );
                    assert!(log.contains("restored from its previous copy"), "{log}");
                    outcomes.1 += 1;
                } else {
                    outcomes.2 += 1;
                }
            }
            nginx.stop();
        }
    }
    eprintln!(
        "{} cuts of a {}-byte file ({} lines), twice: {} zones restored intact, {} from .prev, \
         {} named as not restored",
        cuts.len(),
        text.len(),
        owners.len(),
        outcomes.0,
        outcomes.1,
        outcomes.2
    );
    let _ = fs::remove_dir_all(&dir);
}

/// PATCH zone `one`'s burst on a new connection; `Some(status)` when nginx answered.
fn try_patch_burst(port: u16, burst: u64) -> Option<u16> {
    use std::io::{Read, Write};
    let body = format!("{{\"burst\": {burst}}}");
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    let request = format!(
        "PATCH /ratelimit/zones/one HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    answer.split(' ').nth(1)?.parse().ok()
}

/// A small seeded generator (xorshift64), so that the kill moments repeat run to run.
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

/// 20 times: a writer PATCHes zone `one`'s burst up by one a request (each answer comes after
/// its save), and the whole process group is SIGKILLed after a seeded random number of
/// acknowledged writes plus a random few hundred microseconds. The file left is whole (every
/// line's checksum matches) and holds the last acknowledged burst or the one after it; nginx
/// restarts on it with that burst.
#[test]
fn kill_9_during_writes_leaves_the_last_complete_save() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    let dir = temp_dir().with_extension("kill");
    fs::create_dir_all(&dir).unwrap();
    let path = dir.join("state.json");
    let conf = conf(&path);
    let mut seed = 0x5eed_1234_abcd_u64;
    let mut burst = 0;
    let mut outcomes = (0, 0);
    for round in 0..20 {
        let nginx = Nginx::start(&conf);
        assert_eq!(admin(&nginx, "GET", "zones/one", None).1["burst"], burst);
        let log = nginx.error_log();
        assert!(
            !log.contains("is damaged") && !log.contains("is ignored"),
            "{log}"
        );
        let acked = Arc::new(AtomicU64::new(burst));
        let writer = {
            let (acked, port) = (acked.clone(), nginx.port());
            std::thread::spawn(move || {
                let mut value = acked.load(Ordering::SeqCst);
                loop {
                    value += 1;
                    match try_patch_burst(port, value) {
                        Some(200) => acked.store(value, Ordering::SeqCst),
                        _ => return,
                    }
                }
            })
        };
        let wanted = burst + 1 + next(&mut seed) % 30;
        let deadline = Instant::now() + Duration::from_secs(10);
        while acked.load(Ordering::SeqCst) < wanted {
            assert!(Instant::now() < deadline, "round {round}: writes stalled");
            std::thread::yield_now();
        }
        std::thread::sleep(Duration::from_micros(next(&mut seed) % 800));
        let last = acked.load(Ordering::SeqCst);
        common::nginx::sys::signal(-(nginx.master_pid() as i32), common::nginx::sys::SIGKILL);
        writer.join().unwrap();
        let last = last.max(acked.load(Ordering::SeqCst));
        drop(nginx);
        let saved = common::state_file::read(&path);
        let found = saved["zones"]["one"]["limits"]["burst"].as_u64().unwrap();
        assert!(
            found == last || found == last + 1,
            "round {round}: the file has burst {found}, the last acknowledged write {last}"
        );
        outcomes.0 += u64::from(found == last);
        outcomes.1 += u64::from(found == last + 1);
        burst = found;
    }
    let nginx = Nginx::start(&conf);
    assert_eq!(admin(&nginx, "GET", "zones/one", None).1["burst"], burst);
    nginx.stop();
    eprintln!(
        "20 kills: the file held the last acknowledged write {} times, the one after it {} \
         times; final burst {burst}",
        outcomes.0, outcomes.1
    );
    let _ = fs::remove_dir_all(&dir);
}
