//! Version 2 of the file: one JSON object a line, each ending with a checksum of its own text,
//! so that a file cut short or with a damaged byte loses only the lines it damaged:
//!
//! ```text
//! {"rate_limit_state":{"version":2,"zones":["api","monthly"]},"crc":"6f2a9c1e"}
//! {"zone":{"name":"api","algorithm":"leaky_bucket","config":{"rate":"10r/s","burst":5},"limits":{"rate":"20r/s","burst":10},"overrides":1},"crc":"..."}
//! {"overrides":{"zone":"api","keys":{"user%2F7":{"rate":"100r/s","burst":20}}},"crc":"..."}
//! {"zone":{"name":"monthly","algorithm":"quota",...,"quota":{"calendar":"month in UTC","seed":"...","keys":2}},"crc":"..."}
//! {"counts":{"zone":"monthly","keys":{"1f2e3d4c5b6a7":"400000000000005","abc":"3"}},"crc":"..."}
//! ```
//!
//! The first line names the zones the file holds; each zone's line says how many overrides
//! and key counts follow it (in lines of at most [`RECORDS_PER_LINE`]), so a reader knows
//! which zones it has whole. `crc` is the CRC-32 (IEEE, as zlib's) of the line without its
//! `,"crc":"..."` member, in 8 lowercase hex digits. A damaged newline runs two lines together;
//! the reader takes them apart where the next line begins (see `objects`).

use std::collections::BTreeMap;

use ratelimit_core::{Algorithm, Limits};
use serde::{Deserialize, Serialize};

use super::records::{parse_count, parse_override, parse_seed, seed_text, LimitsJson};
use super::{QuotaCounts, Reading, StateFile, ZoneRead, ZoneState};
use crate::percent::percent_encode;

/// The version this module writes.
pub const VERSION: u32 = 2;

/// Overrides or key counts in one line: a damaged line loses at most this many.
pub const RECORDS_PER_LINE: usize = 64;

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum Line {
    RateLimitState(Header),
    Zone(ZoneLine),
    Overrides(Records<LimitsJson>),
    Counts(Records<String>),
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    version: u32,
    zones: Vec<String>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ZoneLine {
    name: String,
    algorithm: String,
    config: LimitsJson,
    limits: LimitsJson,
    /// How many overrides the zone's override lines hold.
    overrides: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    quota: Option<QuotaHead>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaHead {
    calendar: String,
    seed: String,
    /// How many key counts the zone's count lines hold.
    keys: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Records<T> {
    zone: String,
    keys: BTreeMap<String, T>,
}

const CRC_OPEN: &[u8] = b",\"crc\":\"";
/// `,"crc":"` + 8 hex digits + `"}`.
const CRC_TAIL: usize = CRC_OPEN.len() + 8 + 2;

/// `object` (a JSON object's text) with its checksum member, and a newline.
fn seal(out: &mut String, object: &str) {
    let crc = crc32fast::hash(object.as_bytes());
    out.push_str(&object[..object.len() - 1]);
    out.push_str(&format!(",\"crc\":\"{crc:08x}\"}}\n"));
}

/// [`seal`] for tests that write lines by hand.
#[cfg(test)]
pub(super) fn tests_seal(out: &mut String, object: &str) {
    seal(out, object)
}

/// A line's object without its checksum member, once the checksum matches.
fn unseal(line: &[u8]) -> Result<Vec<u8>, &'static str> {
    let split = line
        .len()
        .checked_sub(CRC_TAIL)
        .ok_or("no checksum (cut short?)")?;
    let (body, tail) = line.split_at(split);
    let digits = tail
        .strip_prefix(CRC_OPEN)
        .and_then(|rest| rest.strip_suffix(b"\"}"))
        .filter(|digits| {
            digits
                .iter()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        })
        .ok_or("no checksum (cut short?)")?;
    let written = std::str::from_utf8(digits)
        .ok()
        .and_then(|digits| u32::from_str_radix(digits, 16).ok())
        .ok_or("no checksum (cut short?)")?;
    let mut object = body.to_vec();
    object.push(b'}');
    if crc32fast::hash(&object) != written {
        return Err("checksum mismatch");
    }
    Ok(object)
}

/// Whether `text` has the shape of this version: its first line starts as a header does, or
/// some line ends with a checksum (a file whose header is damaged).
pub(super) fn looks_like(text: &[u8]) -> bool {
    text.starts_with(b"{\"rate_limit_state\"")
        || text
            .split(|&b| b == b'\n')
            .any(|line| line.len() >= CRC_TAIL && unseal(line) != Err("no checksum (cut short?)"))
}

fn to_json<T: Serialize>(value: &T) -> String {
    // Serializing these structs (strings, integers, maps with string keys) cannot fail.
    serde_json::to_string(value).unwrap_or_default()
}

impl StateFile {
    /// The file's text, version 2: zones by name, overrides by encoded key, counts by id.
    pub fn to_lines(&self) -> String {
        let mut out = String::new();
        let header = Line::RateLimitState(Header {
            version: VERSION,
            zones: self.zones.keys().cloned().collect(),
        });
        seal(&mut out, &to_json(&header));
        for (name, zone) in &self.zones {
            write_zone(&mut out, name, zone);
        }
        out
    }
}

fn write_zone(out: &mut String, name: &str, zone: &ZoneState) {
    let mut overrides: Vec<(String, LimitsJson)> = zone
        .overrides
        .iter()
        .map(|(key, limits)| (percent_encode(key), LimitsJson::new(limits)))
        .collect();
    overrides.sort_by(|a, b| a.0.cmp(&b.0));
    overrides.dedup_by(|a, b| a.0 == b.0);
    let mut counts: Vec<(u64, u64)> = zone.quota.as_ref().map_or(Vec::new(), |q| q.words.clone());
    counts.sort_unstable();
    counts.dedup_by_key(|(id, _)| *id);
    let line = Line::Zone(ZoneLine {
        name: name.to_string(),
        algorithm: zone.algorithm.as_str().to_string(),
        config: LimitsJson::new(&zone.config),
        limits: LimitsJson::new(&zone.limits),
        overrides: overrides.len() as u64,
        quota: zone.quota.as_ref().map(|quota| QuotaHead {
            calendar: quota.calendar.clone(),
            seed: seed_text(quota.seed),
            keys: counts.len() as u64,
        }),
    });
    seal(out, &to_json(&line));
    let mut overrides = overrides.into_iter().peekable();
    while overrides.peek().is_some() {
        let keys = overrides.by_ref().take(RECORDS_PER_LINE).collect();
        let line = Line::Overrides(Records {
            zone: name.to_string(),
            keys,
        });
        seal(out, &to_json(&line));
    }
    for chunk in counts.chunks(RECORDS_PER_LINE) {
        let keys = chunk
            .iter()
            .map(|(id, word)| (format!("{id:x}"), format!("{word:x}")))
            .collect();
        let line = Line::Counts(Records {
            zone: name.to_string(),
            keys,
        });
        seal(out, &to_json(&line));
    }
}

/// What one zone's lines gave.
#[derive(Default)]
struct Parts {
    /// The zone's line, with the records it announced: (state, overrides, key counts).
    head: Option<(ZoneState, u64, Option<u64>)>,
    overrides: BTreeMap<Vec<u8>, Limits>,
    counts: BTreeMap<u64, u64>,
    damage: Vec<String>,
}

/// Read a version 2 file. `Err` when the file as a whole cannot be used (another version).
pub(super) fn read(text: &[u8]) -> Result<Reading, String> {
    let mut reading = Reading::default();
    let mut parts: BTreeMap<String, Parts> = BTreeMap::new();
    let mut lines = text.split(|&b| b == b'\n').peekable();
    let mut number = 0;
    while let Some(raw) = lines.next() {
        number += 1;
        if raw.is_empty() && lines.peek().is_none() {
            break;
        }
        for (first, object) in objects(raw, number, &mut reading.problems) {
            match parse(&object) {
                Ok(line) => take(line, number, number == 1 && first, &mut reading, &mut parts),
                Err(Refusal::Version(version)) => return Err(super::unsupported(version)),
                Err(Refusal::Line(reason)) => {
                    reading.problems.push(format!("line {number}: {reason}"))
                }
            }
        }
    }
    if raw_ends_cut(text) {
        reading
            .problems
            .push(format!("line {number}: cut short (no newline at its end)"));
    }
    finish(&mut reading, parts);
    Ok(reading)
}

/// How every line begins (serde's tag of [`Line`]'s variants). Inside a line these bytes
/// never occur: JSON escapes every `"` within a string.
const LINE_STARTS: [&[u8]; 4] = [
    b"{\"rate_limit_state\":{",
    b"{\"zone\":{",
    b"{\"overrides\":{",
    b"{\"counts\":{",
];

/// The checked objects of one line of the file, each with whether it opens the line; what
/// fails its checksum goes to `problems`. A line whose checksum fails may be lines run
/// together by a damaged newline: each part that starts as a line does is checked on its
/// own (without the byte that replaced its newline), so that the damaged byte does not take
/// the next line's zone with it.
fn objects(raw: &[u8], number: usize, problems: &mut Vec<String>) -> Vec<(bool, Vec<u8>)> {
    let reason = match unseal(raw) {
        Ok(object) => return vec![(true, object)],
        Err(reason) => reason,
    };
    let mut starts: Vec<usize> = (1..raw.len())
        .filter(|&at| LINE_STARTS.iter().any(|start| raw[at..].starts_with(start)))
        .collect();
    if starts.is_empty() {
        problems.push(format!("line {number}: {reason}"));
        return Vec::new();
    }
    problems.push(format!(
        "line {number}: {reason}: {} lines run together (a damaged newline), read one by one",
        starts.len() + 1
    ));
    starts.insert(0, 0);
    starts.push(raw.len());
    let mut objects = Vec::new();
    for (part, pair) in starts.windows(2).enumerate() {
        let piece = &raw[pair[0]..pair[1]];
        let last = pair[1] == raw.len();
        let object = unseal(piece).or_else(|reason| match piece.split_last() {
            Some((_, rest)) if !last => unseal(rest),
            _ => Err(reason),
        });
        match object {
            Ok(object) => objects.push((part == 0, object)),
            Err(reason) => problems.push(format!("line {number}, part {}: {reason}", part + 1)),
        }
    }
    objects
}

fn raw_ends_cut(text: &[u8]) -> bool {
    !text.is_empty() && !text.ends_with(b"\n")
}

enum Refusal {
    Version(u64),
    Line(String),
}

impl From<String> for Refusal {
    fn from(reason: String) -> Refusal {
        Refusal::Line(reason)
    }
}

/// A checked line's object: another version's header refuses the whole file.
fn parse(object: &[u8]) -> Result<Line, Refusal> {
    if object.starts_with(b"{\"rate_limit_state\"") {
        let value: serde_json::Value =
            serde_json::from_slice(object).map_err(|error| format!("invalid JSON: {error}"))?;
        let version = &value["rate_limit_state"]["version"];
        if let Some(version) = version.as_u64().filter(|&v| v != u64::from(VERSION)) {
            return Err(Refusal::Version(version));
        }
    }
    Ok(serde_json::from_slice(object).map_err(|error| format!("invalid JSON: {error}"))?)
}

/// One checked line's records into its zone's parts; `opens_file` when it is the file's
/// first object, the only place for the header.
fn take(
    line: Line,
    number: usize,
    opens_file: bool,
    reading: &mut Reading,
    parts: &mut BTreeMap<String, Parts>,
) {
    match line {
        Line::RateLimitState(header) if opens_file => reading.announced = Some(header.zones),
        Line::RateLimitState(_) => reading
            .problems
            .push(format!("line {number}: a header after the first line")),
        Line::Zone(zone) => {
            let name = zone.name.clone();
            let entry = parts.entry(name).or_default();
            if entry.head.is_some() {
                entry
                    .damage
                    .push(format!("line {number}: its zone line again"));
                return;
            }
            match zone_head(zone) {
                Ok(head) => entry.head = Some(head),
                Err(error) => entry.damage.push(format!("line {number}: {error}")),
            }
        }
        Line::Overrides(records) => {
            let entry = parts.entry(records.zone).or_default();
            for (key, limits) in &records.keys {
                match parse_override(key, limits) {
                    Ok((key, limits)) => {
                        entry.overrides.insert(key, limits);
                    }
                    Err(error) => entry.damage.push(format!("line {number}: {error}")),
                }
            }
        }
        Line::Counts(records) => {
            let entry = parts.entry(records.zone).or_default();
            for (id, word) in &records.keys {
                match parse_count(id, word) {
                    Ok((id, word)) => {
                        entry.counts.insert(id, word);
                    }
                    Err(error) => entry.damage.push(format!("line {number}: {error}")),
                }
            }
        }
    }
}

/// A zone's line checked: its state (records still empty) and the records it announces.
fn zone_head(zone: ZoneLine) -> Result<(ZoneState, u64, Option<u64>), String> {
    let algorithm = Algorithm::parse(&zone.algorithm).map_err(|error| error.to_string())?;
    let config = zone
        .config
        .limits()
        .map_err(|error| format!("config: {error}"))?;
    let limits = zone
        .limits
        .limits()
        .map_err(|error| format!("limits: {error}"))?;
    let (quota, keys) = match zone.quota {
        Some(quota) => {
            let counts = QuotaCounts {
                calendar: quota.calendar,
                seed: parse_seed(&quota.seed)?,
                words: Vec::new(),
            };
            (Some(counts), Some(quota.keys))
        }
        None => (None, None),
    };
    let state = ZoneState {
        algorithm,
        config,
        limits,
        overrides: Vec::new(),
        quota,
    };
    Ok((state, zone.overrides, keys))
}

/// Each zone whole or with what it lacks; zones the header announced and no line holds.
fn finish(reading: &mut Reading, parts: BTreeMap<String, Parts>) {
    for (name, part) in parts {
        if let Some(announced) = &reading.announced {
            if !announced.contains(&name) {
                reading.problems.push(format!(
                    "zone \"{}\" is not in the header",
                    name.escape_debug()
                ));
            }
        }
        reading.zones.insert(name, assemble(part));
    }
    for name in reading.announced.iter().flatten() {
        if !reading.zones.contains_key(name) {
            reading.zones.insert(
                name.clone(),
                ZoneRead {
                    state: None,
                    damage: vec!["none of its lines is left".to_string()],
                },
            );
        }
    }
}

fn assemble(part: Parts) -> ZoneRead {
    let mut damage = part.damage;
    let Some((mut state, overrides, keys)) = part.head else {
        damage.push("its zone line is missing or damaged".to_string());
        return ZoneRead {
            state: None,
            damage,
        };
    };
    let found = part.overrides.len() as u64;
    if found != overrides {
        damage.push(format!("{found} of {overrides} override(s) read"));
    }
    state.overrides = part.overrides.into_iter().collect();
    match (&mut state.quota, keys) {
        (Some(quota), Some(keys)) => {
            let found = part.counts.len() as u64;
            if found != keys {
                damage.push(format!("{found} of {keys} key count(s) read"));
            }
            quota.words = part.counts.into_iter().collect();
        }
        _ if !part.counts.is_empty() => {
            damage.push("key counts for a zone that counts none".to_string());
        }
        _ => {}
    }
    ZoneRead {
        state: Some(state),
        damage,
    }
}
