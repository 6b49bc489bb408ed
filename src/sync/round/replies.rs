//! Reading Redis's replies: integers, limits, a key script call's triples, and values out
//! of bounds counted for the workers to log.

use ratelimit_core::fleet_round::BadValue;

use super::state::Task;
use crate::sync::shared::{Bad, SyncError};

/// A limits script's reply: `Some(None)` when the fleet has no value yet, `None` when the
/// reply cannot be read.
pub(super) fn limits_reply(value: &redis::Value) -> Option<Option<u64>> {
    let text = redis::from_redis_value::<Option<String>>(value).ok()?;
    Some(text.and_then(|text| text.parse().ok()))
}

/// An integer of a reply.
pub(super) fn integer(value: &redis::Value) -> Option<i64> {
    match value {
        redis::Value::Int(n) => Some(*n),
        _ => None,
    }
}

impl Task {
    /// A key script call's reply: three integers per key.
    pub(super) fn key_replies(
        &self,
        value: &redis::Value,
        keys: usize,
    ) -> Result<Vec<(i64, i64, i64)>, SyncError> {
        let redis::Value::Array(items) = value else {
            return Err(SyncError::Reply);
        };
        if items.len() != 3 * keys {
            return Err(SyncError::Reply);
        }
        items
            .chunks(3)
            .map(|triple| {
                let get = |at: usize| integer(&triple[at]).ok_or(SyncError::Reply);
                Ok((get(0)?, get(1)?, get(2)?))
            })
            .collect()
    }

    /// Count a value Redis answered that is out of bounds, for the workers to log once.
    pub(super) fn note(&self, bad: &BadValue, zone_id: u64) {
        let (kind, value, bound) = match *bad {
            BadValue::Ahead { ahead_us, most_us } => (Bad::KeyAhead, ahead_us as u64, most_us),
            BadValue::Counts { recent, most, .. } => (Bad::KeyCounts, recent as u64, most),
            BadValue::Instances(count) => (Bad::Instances, count as u64, 0),
            BadValue::Limits(_) => (Bad::Limits, 0, 0),
            BadValue::Version(version) => (Bad::Version, version as u64, 0),
        };
        self.sync.note_bad(kind, zone_id, value, bound);
    }
}
