//! The state file (`rate_limit_state_file`, version 2) against a real nginx.
//!
//! Cut short at every line boundary and in the middle of every line, a file restores each zone
//! whose lines are intact exactly, restores in part (`warn`) a zone whose own line is intact,
//! and names at `error` each zone it cannot restore; with `PATH.prev` present a damaged zone
//! comes back from the save before (`warn`). Each is checked as one exact line of the error
//! log, level included.
//!
//! SIGKILL of nginx's whole process group during admin writes leaves the file whole, holding
//! the last acknowledged write or the one after it.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::admin::admin_json as admin;
use common::Nginx;
use serde_json::Value;

/// The zones of t/admin.rs's config, one per algorithm.
const ZONES: [&str; 4] = ["one", "bucket", "log", "window"];

fn conf(path: &Path) -> String {
    common::admin::admin_api()
        .main("user root;")
        .http(&format!("rate_limit_state_file {};", path.display()))
        .build()
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "ngx-rate-limit-state-{name}-{}",
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// `PATH.suffix`
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    PathBuf::from(format!("{}{suffix}", path.display()))
}

/// One line of a whole file: the zone it belongs to (`None` for the header), whether it is
/// the zone's own line, and how many overrides it holds.
struct Line {
    zone: Option<String>,
    own: bool,
    overrides: usize,
}

fn lines_of(text: &str) -> Vec<Line> {
    text.lines()
        .map(|line| {
            let object = common::state_file::checked_line(line).expect("a damaged line");
            if let Some(zone) = object.get("zone") {
                let zone = zone["name"].as_str().map(str::to_string);
                return Line {
                    zone,
                    own: true,
                    overrides: 0,
                };
            }
            let (kind, records) = object.as_object().unwrap().iter().next().unwrap();
            let overrides = match kind.as_str() {
                "overrides" => records["keys"].as_object().unwrap().len(),
                _ => 0,
            };
            let zone = records["zone"].as_str().map(str::to_string);
            Line {
                zone,
                own: false,
                overrides,
            }
        })
        .collect()
}

/// `(rate, burst, overrides)` of a zone as the admin API shows it.
type Shown = (Value, Value, Value);

fn shown(nginx: &Nginx, name: &str) -> Shown {
    let (_, zone) = admin(nginx, "GET", &format!("zones/{name}"), None);
    let (_, overrides) = admin(nginx, "GET", &format!("zones/{name}/overrides"), None);
    (zone["rate"].clone(), zone["burst"].clone(), overrides)
}

fn shown_all(nginx: &Nginx) -> Vec<Shown> {
    ZONES.iter().map(|name| shown(nginx, name)).collect()
}

/// Start nginx and make the admin changes `changes`; what the zones show before and after.
fn save(conf: &str, changes: &[(&str, &str, &str)]) -> (Vec<Shown>, Vec<Shown>) {
    let nginx = Nginx::start(conf);
    let before = shown_all(&nginx);
    for (method, path, body) in changes {
        let (status, answer) = admin(&nginx, method, path, Some(body));
        assert!(status < 300, "{method} {path}: {status} {answer}");
    }
    let after = shown_all(&nginx);
    nginx.stop();
    (before, after)
}

/// What the zones show after a start on a file of `text`.
fn restored(conf: &str, path: &Path, text: &str) -> Vec<Shown> {
    fs::write(path, text).unwrap();
    let nginx = Nginx::start(conf);
    let zones = shown_all(&nginx);
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

/// What becomes of a zone of a file cut after `whole` lines.
#[derive(Clone, Copy)]
enum Outcome {
    Intact,
    FromPrevious,
    /// Its own line intact: its limits, and the overrides of its intact lines (this many).
    InPart(usize),
    /// Its own line lost, the file's header kept: named as not restored.
    NotRestored,
    /// The header lost too: the file no longer says it had the zone.
    Afresh,
}

/// The zone's outcome, and the one line the error log has about it: its level and its text
/// after `rate_limit_state_file "PATH": `.
fn expected(lines: &[Line], whole: usize, name: &str, prev: Option<&Path>) -> (Outcome, String) {
    let mine: Vec<(usize, &Line)> = lines
        .iter()
        .enumerate()
        .filter(|(_, line)| line.zone.as_deref() == Some(name))
        .collect();
    if mine.iter().all(|&(n, _)| n < whole) {
        return (Outcome::Intact, String::new());
    }
    let own_intact = mine.iter().any(|&(n, line)| line.own && n < whole);
    let total: usize = mine.iter().map(|(_, line)| line.overrides).sum();
    let read: usize = mine
        .iter()
        .filter(|&&(n, _)| n < whole)
        .map(|(_, line)| line.overrides)
        .sum();
    let damage = if own_intact {
        format!("{read} of {total} override(s) read")
    } else {
        "none of its lines is left".to_string()
    };
    let zone = format!("zone \"{name}\"");
    match prev {
        Some(prev) => (
            Outcome::FromPrevious,
            format!(
                "[warn] {zone} is damaged ({damage}): restored from its previous copy \"{}\", \
                 the save before",
                prev.display()
            ),
        ),
        None if own_intact => (
            Outcome::InPart(read),
            format!("[warn] {zone} is restored in part: {damage}"),
        ),
        None if whole == 0 => (
            Outcome::Afresh,
            format!("[notice] {zone} is not in what is left of the file: it starts afresh"),
        ),
        None => (
            Outcome::NotRestored,
            format!("[error] {zone} is not restored: {damage}"),
        ),
    }
}

/// The error log's lines about zone `name` from the state file at `path`, as
/// `[level] text-after-the-file's-name`.
fn zone_lines(log: &str, path: &Path, name: &str) -> Vec<String> {
    let file = format!("rate_limit_state_file \"{}\": ", path.display());
    let zone = format!("zone \"{name}\" ");
    log.lines()
        .filter_map(|line| {
            // `2026/12/07 10:44:25 [warn] 32699#32699: TEXT`
            let (_, rest) = line.split_once(" [")?;
            let (level, rest) = rest.split_once("] ")?;
            let text = rest.split_once(": ")?.1.strip_prefix(&file)?;
            text.starts_with(&zone).then(|| format!("[{level}] {text}"))
        })
        .collect()
}

/// The zone's lines above `notice` are exactly `line` (when above `notice`), and `line` is
/// among them all.
fn assert_logged(log: &str, path: &Path, name: &str, line: &str, cut: usize) {
    let lines = zone_lines(log, path, name);
    let loud: Vec<&String> = lines
        .iter()
        .filter(|l| !l.starts_with("[notice]"))
        .collect();
    match line {
        "" => assert!(loud.is_empty(), "cut at {cut}: {loud:?}\n{log}"),
        notice if notice.starts_with("[notice]") => {
            assert!(loud.is_empty(), "cut at {cut}: {loud:?}\n{log}");
            assert!(
                lines.iter().any(|l| l == notice),
                "cut at {cut}: {line}\n{log}"
            );
        }
        _ => assert_eq!(loud, [line], "cut at {cut}:\n{log}"),
    }
}

#[test]
fn a_file_cut_anywhere_restores_its_intact_zones_and_names_the_others() {
    let dir = temp_dir("cut");
    let path = dir.join("state.json");
    let prev_path = sibling(&path, ".prev");
    let conf = conf(&path);
    let older_changes = [
        ("PATCH", "zones/one", r#"{"rate": "3r/s", "burst": 4}"#),
        ("PATCH", "zones/log", r#"{"rate": "7r/m"}"#),
        (
            "PUT",
            "zones/one/overrides/old",
            r#"{"rate": "1r/s", "burst": 1}"#,
        ),
    ];
    let (fresh, _) = save(&conf, &older_changes);
    let newer_changes = [
        ("PATCH", "zones/one", r#"{"rate": "5r/s", "burst": 6}"#),
        ("PATCH", "zones/bucket", r#"{"burst": 9}"#),
        (
            "PUT",
            "zones/one/overrides/vip",
            r#"{"rate": "9r/s", "burst": 2}"#,
        ),
    ];
    let (_, newer) = save(&conf, &newer_changes);
    let text = fs::read_to_string(&path).unwrap();
    let previous = fs::read_to_string(&prev_path).unwrap();
    let older = restored(&conf, &path, &previous);
    assert!(fresh != older && older != newer && fresh != newer);
    let lines = lines_of(&text);
    let cuts = cuts(&text);
    // Zones by outcome: intact, from .prev, in part, not restored, afresh.
    let mut outcomes = [0; 5];
    for with_prev in [false, true] {
        for &cut in &cuts {
            fs::write(&path, &text[..cut]).unwrap();
            if with_prev {
                fs::write(&prev_path, &previous).unwrap();
            } else {
                let _ = fs::remove_file(&prev_path);
            }
            // Whole lines before the cut.
            let whole = text[..cut].matches('\n').count();
            let nginx = Nginx::start(&conf);
            let log = nginx.error_log();
            for (i, name) in ZONES.iter().enumerate() {
                let prev = with_prev.then_some(prev_path.as_path());
                let (outcome, line) = expected(&lines, whole, name, prev);
                assert_logged(&log, &path, name, &line, cut);
                let now = shown(&nginx, name);
                let context = format!("zone {name}, cut at {cut}, .prev {with_prev}:\n{log}");
                match outcome {
                    Outcome::Intact => assert_eq!(now, newer[i], "{context}"),
                    Outcome::FromPrevious => assert_eq!(now, older[i], "{context}"),
                    Outcome::InPart(read) => {
                        assert_eq!((&now.0, &now.1), (&newer[i].0, &newer[i].1), "{context}");
                        let kept = now.2.as_object().unwrap();
                        assert_eq!(kept.len(), read, "{context}");
                        assert!(kept.iter().all(|(key, limits)| newer[i].2[key] == *limits));
                    }
                    Outcome::NotRestored | Outcome::Afresh => {
                        assert_eq!(now, fresh[i], "{context}")
                    }
                }
                outcomes[outcome_index(outcome)] += 1;
            }
            nginx.stop();
        }
    }
    eprintln!(
        "{} cuts of a {}-byte file ({} lines), without and with .prev: of {} zones, {} \
         restored intact, {} from .prev, {} in part ([warn]), {} named as not restored \
         ([error]), {} named as starting afresh (header lost, [notice])",
        cuts.len(),
        text.len(),
        lines.len(),
        outcomes.iter().sum::<usize>(),
        outcomes[0],
        outcomes[1],
        outcomes[2],
        outcomes[3],
        outcomes[4]
    );
    let _ = fs::remove_dir_all(&dir);
}

fn outcome_index(outcome: Outcome) -> usize {
    match outcome {
        Outcome::Intact => 0,
        Outcome::FromPrevious => 1,
        Outcome::InPart(_) => 2,
        Outcome::NotRestored => 3,
        Outcome::Afresh => 4,
    }
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
    let dir = temp_dir("kill");
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
