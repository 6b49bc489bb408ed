//! The state file (`rate_limit_state_file`, version 2) against a real nginx.
//!
//! Cut short at every line boundary and in the middle of every line, a file restores each zone
//! whose lines are intact exactly, restores in part (`warn`) a zone whose own line is intact,
//! and names at `error` each zone it cannot restore; with `PATH.prev` present a damaged zone
//! comes back from the save before (`warn`). Each is checked as one exact line of the error
//! log, level included.
//!
//! SIGKILL of nginx's whole process group during admin writes and quota requests leaves the
//! file whole, holding the last acknowledged save or the one after it: a zone's limits, a
//! quota zone's override and its keys' counts, all of which come back after the restart.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::admin::admin_json as admin;
use common::Nginx;
use ratelimit_admin::state::sibling;
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

/// The offset from UTC (`+HH:00`) at which it is about noon now: a day in it ends 11 to 13
/// hours from now, so that a quota counted by the day never starts afresh during the test.
fn noon_offset() -> String {
    let hour = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 3600
        % 24;
    let offset = 12 - hour as i64;
    let sign = if offset < 0 { '-' } else { '+' };
    format!("{sign}{:02}:00", offset.abs())
}

/// [`conf`] and a quota zone `daily`: 5 requests a day per `X-Key` on `/quota/`.
fn quota_conf(path: &Path) -> String {
    common::admin::admin_api()
        .main("user root;")
        .http(&format!("rate_limit_state_file {};", path.display()))
        .http(&format!(
            "rate_limit_zone $http_x_key zone=daily:1m algorithm=quota limit=5 period=day \
             tz={};",
            noon_offset()
        ))
        .locations("location /quota/ { rate_limit zone=daily; alias html/; }")
        .build()
}

/// METHOD PATH with `X-Key: key` (and `body` as JSON) on a new connection; `Some(status)`
/// when nginx answered.
fn try_send(port: u16, method: &str, path: &str, key: &str, body: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nX-Key: {key}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    answer.split(' ').nth(1)?.parse().ok()
}

/// Zone `daily`'s override of key `vip` has limit `VIP_BASE + step` after the writer's step.
const VIP_BASE: u64 = 100;

/// The key whose quota step `step` of round `round` uses up.
fn quota_key(round: u32, step: u64) -> String {
    format!("r{round}-s{step}")
}

/// One step of the writer: key [`quota_key`] uses its day's quota (5 of 5), then zone
/// `daily`'s override of `vip` is set to limit `VIP_BASE + step` and zone `one`'s burst to
/// `step`. Every admin write saves the whole state, the counts before it included.
/// `Err(None)` when nginx stopped answering (it was killed), `Err(Some(..))` on a wrong answer.
fn write_step(port: u16, round: u32, step: u64) -> Result<(), Option<String>> {
    let key = quota_key(round, step);
    let wrong = |what: &str, status: u16| Err(Some(format!("{what}: {status}")));
    for n in 1..=5 {
        match try_send(port, "GET", "/quota/", &key, "").ok_or(None)? {
            200 => {}
            status => return wrong(&format!("request {n} of key {key}"), status),
        }
    }
    let limit = format!("{{\"limit\": {}}}", VIP_BASE + step);
    match try_send(
        port,
        "PUT",
        "/ratelimit/zones/daily/overrides/vip",
        "",
        &limit,
    )
    .ok_or(None)?
    {
        200 | 201 => {}
        status => return wrong("PUT vip", status),
    }
    let burst = format!("{{\"burst\": {step}}}");
    match try_send(port, "PATCH", "/ratelimit/zones/one", "", &burst).ok_or(None)? {
        200 => Ok(()),
        status => wrong("PATCH one", status),
    }
}

/// A small seeded generator (xorshift64), so that the kill moments repeat run to run.
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

/// What the last complete save holds, which a restart must show: zone `one`'s burst, the
/// `vip` override's limit, and keys whose quota is used up (5 of 5).
#[derive(Default)]
struct Saved {
    burst: u64,
    vip_limit: Option<u64>,
    used_up: Vec<String>,
}

/// Start nginx on the file and check that it shows `saved`, its quota counts in force.
fn restart_on(conf: &str, saved: &Saved) -> Nginx {
    let nginx = Nginx::start(conf);
    nginx.write_file("html/index.html", "ok\n");
    let log = nginx.error_log();
    let damaged = log.contains("is damaged") || log.contains("is ignored");
    assert!(!damaged, "{log}");
    assert_eq!(
        admin(&nginx, "GET", "zones/one", None).1["burst"],
        saved.burst
    );
    if let Some(limit) = saved.vip_limit {
        let (_, vip) = admin(&nginx, "GET", "zones/daily/overrides/vip", None);
        assert_eq!(vip["limit"], limit, "{log}");
    }
    for key in &saved.used_up {
        let (status, state) = admin(&nginx, "GET", &format!("zones/daily/keys/{key}"), None);
        let counted = (status, state["used"].as_u64(), state["limit"].as_u64());
        assert_eq!(counted, (200, Some(5), Some(5)), "{key}:\n{log}");
    }
    if let Some(key) = saved.used_up.last() {
        let status = try_send(nginx.port(), "GET", "/quota/", key, "");
        assert_eq!(status, Some(429), "{key}: its count is not in force");
    }
    nginx
}

/// The file after a kill: whole (every line's checksum matches, `PATH.prev` too), then zone
/// `one`'s burst and the `vip` override's limit.
fn read_after_kill(path: &Path) -> (u64, u64) {
    let file = common::state_file::read(path);
    if sibling(path, ".prev").exists() {
        common::state_file::read(&sibling(path, ".prev"));
    }
    let burst = file["zones"]["one"]["limits"]["burst"].as_u64().unwrap();
    // A quota zone's limit is saved as its burst.
    let vip = &file["zones"]["daily"]["overrides"]["vip"]["burst"];
    (burst, vip.as_u64().unwrap())
}

/// 20 rounds: a writer repeats [`write_step`] (a key's quota used up, an override's limit
/// changed, a zone's burst changed, each answer after its save), and nginx's whole process
/// group is SIGKILLed after a seeded random number of steps plus a random part of one. The
/// file left is whole and holds the last acknowledged step or the one after it, the counts
/// of every step it holds included; nginx restarts on it showing all of them.
///
/// A SIGKILL takes effect between system calls, and a save writes its text in one: this
/// checks which save is left and the restart on it (a kill inside a save leaves `PATH.tmp`
/// and the lock behind), not a power loss in the middle of a write, which the synced
/// temporary file and renames are for.
#[test]
fn kill_9_during_writes_leaves_the_last_complete_save() {
    let dir = temp_dir("kill");
    let path = dir.join("state.json");
    let conf = quota_conf(&path);
    let mut seed = 0x5eed_1234_abcd_u64;
    let mut saved = Saved::default();
    // Kills with PATH.tmp left (inside a save), files of the last acknowledged step, of the
    // one after, and of the one after by its override only.
    let mut outcomes = [0; 4];
    for round in 0..20 {
        let nginx = restart_on(&conf, &saved);
        let acked = Arc::new(AtomicU64::new(saved.burst));
        let writer = {
            let (acked, port) = (acked.clone(), nginx.port());
            std::thread::spawn(move || loop {
                let step = acked.load(Ordering::SeqCst) + 1;
                match write_step(port, round, step) {
                    Ok(()) => acked.store(step, Ordering::SeqCst),
                    Err(wrong) => return wrong,
                }
            })
        };
        let began = Instant::now();
        let wanted = 1 + next(&mut seed) % 30;
        while acked.load(Ordering::SeqCst) < saved.burst + wanted {
            let stalled = began.elapsed() > Duration::from_secs(30);
            assert!(!stalled, "round {round}: writes stalled");
            std::thread::yield_now();
        }
        let step_us = began.elapsed().as_micros() as u64 / wanted;
        std::thread::sleep(Duration::from_micros(next(&mut seed) % step_us.max(1)));
        common::nginx::sys::signal(-(nginx.master_pid() as i32), common::nginx::sys::SIGKILL);
        let wrong = writer.join().unwrap();
        assert!(wrong.is_none(), "round {round}: {wrong:?}");
        drop(nginx);
        outcomes[0] += usize::from(sibling(&path, ".tmp").exists());
        let last = acked.load(Ordering::SeqCst);
        let (burst, vip) = read_after_kill(&path);
        assert!(
            burst == last || burst == last + 1,
            "round {round}: the file has burst {burst}, the last acknowledged step {last}"
        );
        let vip_step = vip - VIP_BASE;
        assert!(
            vip_step == burst || (vip_step == last + 1 && burst == last),
            "round {round}: override of step {vip_step}, burst of step {burst}, acked {last}"
        );
        outcomes[1] += usize::from(burst == last);
        outcomes[2] += usize::from(burst == last + 1);
        outcomes[3] += usize::from(vip_step > burst);
        // The keys of every step the file holds (its override's step's too) are used up.
        let steps = saved.burst + 1..=vip_step;
        saved
            .used_up
            .extend(steps.map(|step| quota_key(round, step)));
        saved.burst = burst;
        saved.vip_limit = Some(vip);
    }
    drop(restart_on(&conf, &saved));
    eprintln!(
        "20 kills, 21 restarts: {} kills inside a save (PATH.tmp left); the file held the \
         last acknowledged step {} times, the one after it {} times ({} more by its override \
         only); {} keys' quotas (5 of 5) and the override restored after the last; final \
         burst {}",
        outcomes[0],
        outcomes[1],
        outcomes[2],
        outcomes[3],
        saved.used_up.len(),
        saved.burst
    );
    let _ = fs::remove_dir_all(&dir);
}
