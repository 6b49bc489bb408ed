//! A door's key in a zone, the same for every door: checked (1 to `MAX_KEY_BYTES` bytes),
//! then its entry found. The http and stream doors evaluate the key and call [`entry`]; the
//! Lua door, which answers each refusal with its own code, calls [`check`] and [`lookup`].

use ngx::ffi::{ngx_log_t, NGX_LOG_ERR};
use ngx::ngx_log_error;

use super::decide::{self, Found};
use crate::conf::ZoneConf;
use crate::store::{Zone, MAX_KEY_BYTES};

/// Why a key names no entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Empty: not limited (nginx's limit_req does not count it either).
    Empty,
    /// Longer than `MAX_KEY_BYTES`.
    TooLong,
}

/// Whether `key` may name an entry.
#[inline(always)]
pub fn check(key: &[u8]) -> Result<(), Refused> {
    if key.is_empty() {
        return Err(Refused::Empty);
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(Refused::TooLong);
    }
    Ok(())
}

/// The zone's entry for a checked `key`: claimed for a new key when `claim` (an eviction or
/// a busy window then said in `log`), or only the entry the key already has.
#[inline(always)]
pub fn lookup<'a>(
    zone_conf: &'a ZoneConf,
    zone: &'a Zone,
    key: &[u8],
    now_ns: u64,
    claim: bool,
    log: *mut ngx_log_t,
) -> Found<'a> {
    if !claim {
        return decide::find_existing(zone_conf, zone, key);
    }
    let (found, evicted) = decide::find(zone_conf, zone, key, now_ns);
    if evicted {
        found.log_zone_full(now_ns, log);
    }
    found
}

/// The zone's entry for the key a request or a session evaluated, claimed for a new key;
/// `None` when the key is empty (not limited) or too long (said in `log`).
#[inline(always)]
pub fn entry<'a>(
    zone_conf: &'a ZoneConf,
    zone: &'a Zone,
    key: &[u8],
    now_ns: u64,
    log: *mut ngx_log_t,
) -> Option<Found<'a>> {
    match check(key) {
        Ok(()) => Some(lookup(zone_conf, zone, key, now_ns, true, log)),
        Err(Refused::Empty) => None,
        Err(Refused::TooLong) => {
            log_too_long(zone_conf, log);
            None
        }
    }
}

#[cold]
#[inline(never)]
fn log_too_long(zone_conf: &ZoneConf, log: *mut ngx_log_t) {
    ngx_log_error!(
        NGX_LOG_ERR,
        log,
        "the value of the \"{}\" key is more than 65535 bytes",
        zone_conf.key_text
    );
}
