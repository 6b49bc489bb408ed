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
