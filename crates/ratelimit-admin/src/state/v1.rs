//! Version 1 of the file: one JSON document (`{"version": 1, "zones": {...}}`), written until
//! version 2 replaced it and still read, zone by zone: a zone whose entry is invalid is named
//! and the others are restored. A document that is not JSON (cut short, say) has nothing to
//! read: version 2's lines exist for that.

use std::collections::BTreeMap;

use ratelimit_core::Algorithm;
use serde::Deserialize;

use super::records::{parse_count, parse_override, parse_seed, LimitsJson};
use super::{QuotaCounts, Reading, ZoneRead, ZoneState};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileJson {
    version: u32,
    zones: BTreeMap<String, serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ZoneJson {
    algorithm: String,
    config: LimitsJson,
    limits: LimitsJson,
    #[serde(default)]
    overrides: BTreeMap<String, LimitsJson>,
    #[serde(default)]
    quota: Option<QuotaJson>,
}

/// `{"calendar": "month in UTC", "seed": "32 hex digits", "counts": {"ID": "WORD"}}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaJson {
    calendar: String,
    seed: String,
    counts: BTreeMap<String, String>,
}

/// Read a version 1 document. `Err` when the file as a whole cannot be used.
pub(super) fn read(text: &[u8]) -> Result<Reading, String> {
    let file: FileJson =
        serde_json::from_slice(text).map_err(|error| format!("invalid JSON: {error}"))?;
    if file.version != 1 {
        return Err(super::unsupported(u64::from(file.version)));
    }
    let mut reading = Reading {
        announced: Some(file.zones.keys().cloned().collect()),
        ..Reading::default()
    };
    for (name, value) in file.zones {
        let zone = match zone(value) {
            Ok(state) => ZoneRead {
                state: Some(state),
                damage: Vec::new(),
            },
            Err(error) => ZoneRead {
                state: None,
                damage: vec![error],
            },
        };
        reading.zones.insert(name, zone);
    }
    Ok(reading)
}

/// One zone's entry: any invalid value makes the zone unusable (version 1 has no record of
/// its own to drop).
fn zone(value: serde_json::Value) -> Result<ZoneState, String> {
    let zone: ZoneJson = serde_json::from_value(value).map_err(|error| error.to_string())?;
    let algorithm = Algorithm::parse(&zone.algorithm).map_err(|error| error.to_string())?;
    let mut overrides = Vec::with_capacity(zone.overrides.len());
    for (key, limits) in &zone.overrides {
        overrides.push(parse_override(key, limits)?);
    }
    let quota = match zone.quota {
        Some(quota) => {
            let mut words = Vec::with_capacity(quota.counts.len());
            for (id, word) in &quota.counts {
                words.push(parse_count(id, word)?);
            }
            Some(QuotaCounts {
                calendar: quota.calendar,
                seed: parse_seed(&quota.seed)?,
                words,
            })
        }
        None => None,
    };
    Ok(ZoneState {
        algorithm,
        config: zone
            .config
            .limits()
            .map_err(|error| format!("config: {error}"))?,
        limits: zone
            .limits
            .limits()
            .map_err(|error| format!("limits: {error}"))?,
        overrides,
        quota,
    })
}
