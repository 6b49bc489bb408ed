//! The state file (`rate_limit_state_file`) read as a test reads it, without the module's
//! reader: each line's CRC-32 checked here, then the lines gathered into one JSON value of
//! version 1's shape (`{"version": 2, "zones": {NAME: {"algorithm", "config", "limits",
//! "overrides": {KEY: limits}, "quota": {"calendar", "seed", "counts": {ID: WORD}}}}}`), so
//! that tests compare whole zones.

use std::path::Path;

use serde_json::{json, Map, Value};

/// One line's object without its `crc` member, when the checksum matches.
pub fn checked_line(line: &str) -> Option<Value> {
    let (body, tail) = line.rsplit_once(",\"crc\":\"")?;
    let crc = u32::from_str_radix(tail.strip_suffix("\"}")?, 16).ok()?;
    let object = format!("{body}}}");
    (crc32fast::hash(object.as_bytes()) == crc).then(|| serde_json::from_str(&object).ok())?
}

/// The file's text as one value; panics naming the first line that is damaged.
pub fn parse(text: &str) -> Value {
    let mut zones = Map::new();
    let mut version = Value::Null;
    for (number, line) in text.lines().enumerate() {
        let object = checked_line(line)
            .unwrap_or_else(|| panic!("line {} is damaged: {line}\n{text}", number + 1));
        if let Some(header) = object.get("rate_limit_state") {
            version = header["version"].clone();
        } else if let Some(zone) = object.get("zone") {
            let mut entry = json!({
                "algorithm": zone["algorithm"],
                "config": zone["config"],
                "limits": zone["limits"],
                "overrides": {},
            });
            if let Some(quota) = zone.get("quota") {
                entry["quota"] = json!({
                    "calendar": quota["calendar"], "seed": quota["seed"], "counts": {}
                });
            }
            zones.insert(zone["name"].as_str().unwrap().to_string(), entry);
        } else {
            let (kind, records) = object.as_object().unwrap().iter().next().unwrap();
            let zone = &mut zones[records["zone"].as_str().unwrap()];
            let into = match kind.as_str() {
                "overrides" => &mut zone["overrides"],
                "counts" => &mut zone["quota"]["counts"],
                other => panic!("unknown line {other}: {line}"),
            };
            for (key, value) in records["keys"].as_object().unwrap() {
                into[key] = value.clone();
            }
        }
    }
    json!({"version": version, "zones": zones})
}

/// [`parse`] of the file at `path`.
pub fn read(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no state file {}: {e}", path.display()));
    parse(&text)
}
