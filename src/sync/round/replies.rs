//! Reading Redis's replies: integers, limits, a key script call's triples, and values out
//! of bounds counted for the workers to log.

use std::ops::Range;

use ratelimit_core::fleet_round::{self, BadValue, KeyReply};

use super::state::{TakenKey, Task};
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

/// The heartbeat's and the keys' replies of a round, read.
pub(super) struct KeyReplies<'a> {
    /// The instances alive, from the heartbeat (the last known when it was not answered).
    pub(super) instances: u64,
    /// The keys answered within bounds, with their replies.
    pub(super) synced: Vec<(&'a TakenKey, KeyReply)>,
    /// The keys unanswered or answered out of bounds.
    pub(super) failed: Vec<&'a TakenKey>,
    /// The first command unanswered or answered wrong.
    pub(super) first_error: Option<SyncError>,
}

impl Task {
    /// Read the heartbeat's reply, then the key script calls' (the rest of `results`), one
    /// per range of `taken_keys` in `batches`.
    pub(super) fn read_replies<'a>(
        &self,
        heartbeat: Result<redis::Value, SyncError>,
        results: impl Iterator<Item = Result<redis::Value, SyncError>>,
        batches: &[Range<usize>],
        taken_keys: &'a [TakenKey],
    ) -> KeyReplies<'a> {
        let (instances, mut first_error) = self.heartbeat_reply(heartbeat);
        let mut synced = Vec::new();
        let mut failed = Vec::new();
        for (range, result) in batches.iter().zip(results) {
            let batch = &taken_keys[range.clone()];
            let replies = result.and_then(|value| self.key_replies(&value, batch.len()));
            match replies {
                Ok(replies) => {
                    for (taken, reply) in batch.iter().zip(replies) {
                        match fleet_round::check_key_reply(&taken.shape, self.sync_ns(), reply) {
                            Ok(reply) => synced.push((taken, reply)),
                            Err(bad) => {
                                self.note(&bad, self.zones[taken.zone].id);
                                failed.push(taken);
                            }
                        }
                    }
                }
                Err(error) => {
                    first_error = first_error.or(Some(error));
                    failed.extend(batch);
                }
            }
        }
        KeyReplies {
            instances,
            synced,
            failed,
            first_error,
        }
    }

    /// The instances alive as the heartbeat's reply counts them (the last known when it
    /// cannot be taken), and the error when it was not answered or cannot be read.
    fn heartbeat_reply(
        &self,
        heartbeat: Result<redis::Value, SyncError>,
    ) -> (u64, Option<SyncError>) {
        let mut error = heartbeat.as_ref().err().copied();
        let instances = match heartbeat {
            Ok(value) => match integer(&value).map(fleet_round::check_instances) {
                Some(Ok(instances)) => instances,
                Some(Err(bad)) => {
                    self.note(&bad, 0);
                    self.sync.instances()
                }
                None => {
                    error = error.or(Some(SyncError::Reply));
                    self.sync.instances()
                }
            },
            Err(_) => self.sync.instances(),
        };
        (instances, error)
    }

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
