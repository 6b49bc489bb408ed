//! The pieces both versions of the file share: limits, a quota zone's seed and counts, an
//! override's key. Every value read is checked here, as input from outside, before it becomes
//! a [`ZoneState`](super::ZoneState) the module may put in shared memory.

use ratelimit_core::{Limits, Rate};
use serde::{Deserialize, Serialize};

use crate::percent::percent_decode;

/// The longest key an override may have (the store's bound on a key it keeps).
pub const MAX_KEY_BYTES: usize = 65535;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LimitsJson {
    pub rate: String,
    pub burst: u64,
}

impl LimitsJson {
    pub fn new(limits: &Limits) -> LimitsJson {
        LimitsJson {
            rate: limits.rate.to_string(),
            burst: limits.burst,
        }
    }

    /// The limits, or why not (`invalid rate "0r/s"`, `invalid burst 99999999`).
    pub fn limits(&self) -> Result<Limits, String> {
        let rate = Rate::parse(&self.rate).map_err(|error| error.to_string())?;
        if self.burst > Limits::MAX_BURST {
            return Err(format!(
                "invalid burst {} (at most {})",
                self.burst,
                Limits::MAX_BURST
            ));
        }
        Ok(Limits {
            rate,
            burst: self.burst,
        })
    }
}

/// Hex of at most 16 digits: numbers that JSON readers holding doubles would round.
fn hex(text: &str) -> Option<u64> {
    if text.is_empty() || text.len() > 16 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(text, 16).ok()
}

pub(super) fn seed_text(seed: [u64; 2]) -> String {
    format!("{:016x}{:016x}", seed[0], seed[1])
}

/// `"32 hex digits"`.
pub(super) fn parse_seed(text: &str) -> Result<[u64; 2], String> {
    let invalid = || {
        format!(
            "invalid quota seed \"{}\": it must be 32 hex digits",
            text.escape_debug()
        )
    };
    if text.len() != 32 || !text.is_ascii() {
        return Err(invalid());
    }
    Ok([
        hex(&text[..16]).ok_or_else(invalid)?,
        hex(&text[16..]).ok_or_else(invalid)?,
    ])
}

/// One key's count: its id (the shape of `ratelimit_slots::key_id`, so that it names no
/// empty slot, no tombstone and no pin) and its state word, both in hex.
pub(super) fn parse_count(id: &str, word: &str) -> Result<(u64, u64), String> {
    let id_value = hex(id).filter(|&id| ratelimit_slots::is_key_id(id));
    let Some(id_value) = id_value else {
        return Err(format!(
            "invalid key id \"{}\": it must be an odd number of at most 13 hex digits",
            id.escape_debug()
        ));
    };
    let word_value = hex(word).filter(|&word| word != 0);
    let Some(word_value) = word_value else {
        return Err(format!(
            "key id \"{id}\": invalid count \"{}\": it must be 1 to 16 hex digits, not 0",
            word.escape_debug()
        ));
    };
    Ok((id_value, word_value))
}

/// An override: its percent-encoded key and its limits.
pub(super) fn parse_override(key: &str, limits: &LimitsJson) -> Result<(Vec<u8>, Limits), String> {
    let shown = key.escape_debug();
    let decoded =
        percent_decode(key.as_bytes()).map_err(|error| format!("override \"{shown}\": {error}"))?;
    if decoded.len() > MAX_KEY_BYTES {
        return Err(format!(
            "override \"{:.40}...\": its key has {} bytes (at most {MAX_KEY_BYTES})",
            shown,
            decoded.len()
        ));
    }
    let limits = limits
        .limits()
        .map_err(|error| format!("override \"{shown}\": {error}"))?;
    Ok((decoded, limits))
}
