//! Conditions of the sync loop that can repeat at every watch tick (the fleet's overrides
//! that find no room, those applied, a thread that will not start), logged so that they
//! cannot flood: the first occurrence in full, the repeats of the next
//! [`SUMMARY_PERIOD`] counted and logged as one line with their count, until a period passes
//! without any (then the next one is a first occurrence again).
//!
//! Process-local: each worker logs what it applies itself, so a condition gives at most one
//! line per worker and period.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long repeats are counted before their count is logged.
pub const SUMMARY_PERIOD: Duration = Duration::from_secs(10);

/// What repeats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Condition {
    /// A zone's table of overrides is full for the fleet's override of a key.
    NoRoomInTable,
    /// A zone's memory is short for the key of the fleet's override.
    NoMemoryForKey,
    /// Changes of the fleet's overrides applied here.
    Applied,
    /// The loop's thread could not be started.
    ThreadStart,
}

struct Counted {
    /// When the last line about the condition was logged.
    logged_at: Instant,
    /// Occurrences since, not logged.
    unlogged: u64,
}

/// Per condition and zone name ("" for none).
static REPEATS: Mutex<BTreeMap<(Condition, String), Counted>> = Mutex::new(BTreeMap::new());

/// `count` occurrences of `condition` (for `zone`) now. Returns whether to log them in full
/// (the first in a period); otherwise they are counted for [`due`].
pub fn occurred(condition: Condition, zone: &str, count: u64, now: Instant) -> bool {
    let mut repeats = REPEATS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    match repeats.get_mut(&(condition, zone.to_string())) {
        Some(counted) => {
            counted.unlogged = counted.unlogged.saturating_add(count);
            false
        }
        None => {
            let counted = Counted {
                logged_at: now,
                unlogged: 0,
            };
            repeats.insert((condition, zone.to_string()), counted);
            true
        }
    }
}

/// The counts whose period has passed, to log now: `(condition, zone, count)`. Conditions
/// quiet for a whole period are forgotten.
pub fn due(now: Instant) -> Vec<(Condition, String, u64)> {
    let mut repeats = REPEATS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut lines = Vec::new();
    repeats.retain(|(condition, zone), counted| {
        if now.saturating_duration_since(counted.logged_at) < SUMMARY_PERIOD {
            return true;
        }
        if counted.unlogged == 0 {
            return false;
        }
        lines.push((*condition, zone.clone(), counted.unlogged));
        counted.logged_at = now;
        counted.unlogged = 0;
        true
    });
    lines
}
