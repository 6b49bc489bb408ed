//! Blocks shared by a fleet (`block=` on a `sync` zone): one small Redis structure per zone,
//! apart from the keys' own sync state.
//!
//! ```text
//! HASH {prefix}{zone}:blocks   field = the key's bytes   value = "1 UNTIL CHANGED LEVEL"
//! ```
//!
//! `UNTIL` is when the block ends and `CHANGED` when it was last set or released, both in Unix
//! milliseconds (instances' monotonic clocks differ; the wall clock is what they share);
//! `LEVEL` its escalation level; `1` the format's version. A release is a record whose
//! `UNTIL` is the release time. The record changed last wins ([`FleetBlock::newer_than`]):
//! each sync round sends the local records changed since the last round
//! ([`crate::block_table::BlockTable::changed_since`]) and applies the fleet's newer ones
//! ([`crate::block_table::BlockChange::Fleet`]), so a block or a release made anywhere is
//! enforced everywhere within two rounds, and a restarted instance gets the blocks in force
//! on its first round.
//!
//! The hash is bounded: at most [`MAX_RECORDS`] records per zone, the same bound for every
//! instance (a record is not added to a full hash; the instance keeps its own block). A
//! record is deleted once its block has ended (a release is kept [`KEEP_RELEASED_MS`] after
//! it was written, so that every instance reads it). Readers take the hash incrementally: the
//! records written since their last cut, in pages of [`PAGE_RECORDS`] (the whole hash, paged,
//! for a new instance), so a reply is always small. Every record read is checked
//! ([`FleetBlock::check`]) before it touches shared memory.

use std::fmt;

use crate::penalty::{BlockPolicy, BlockWord};

/// Most records a zone's fleet hash holds: writers add none beyond it, and readers trim a
/// hash grown past it (by hand) to it, dropping the blocks that end first.
pub const MAX_RECORDS: usize = 10_000;
/// Most records one reply carries.
pub const PAGE_RECORDS: usize = 500;
/// How long a released (or ended) record stays after it was written, so that every instance
/// reads the release before it is deleted.
pub const KEEP_RELEASED_MS: u64 = 60_000;
/// Bytes a reply of one zone's page may take, framing included: each record a key of at most
/// 64 bytes and a value of at most 80.
pub const PAGE_REPLY_BYTES: usize = 4096 + PAGE_RECORDS * (64 + 80 + 32);

/// Why a well-formed record from the fleet is not believed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordRefusal {
    /// It blocks for longer than any instance could have: more than the admin API's longest
    /// block (365 days, [`BlockPolicy::MAX_NS`], which bounds `block_max=` too) from its
    /// change or from now. (A hand block may be longer than `block_max`, so `block_max`
    /// alone cannot bound a record; it bounds the level.)
    #[error("a block of {remaining_ms} ms, which is out of range (at most {bound_ms} ms)")]
    TooLong {
        /// From now to its end.
        remaining_ms: u64,
        /// The longest block.
        bound_ms: u64,
    },
    /// A level above the zone's top level (`block_max` reached).
    #[error("a block level {level}, which is out of range (0 to {top})")]
    Level {
        /// Its level.
        level: u8,
        /// The policy's top level.
        top: u8,
    },
}
/// One key's block as the fleet keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FleetBlock {
    /// When the block ends (or ended, for a release), Unix ms.
    pub until_unix_ms: u64,
    /// When it was last set or released, Unix ms.
    pub changed_unix_ms: u64,
    /// Its escalation level.
    pub level: u8,
}

/// A value in the fleet's block hash that is not a block record: the message quotes it and
/// says what is valid.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid block record \"{0}\" in Redis: expected \"1 UNTIL_MS CHANGED_MS LEVEL\" \
     (Unix milliseconds, level 0 to 63)"
)]
pub struct FleetBlockError(pub String);

impl FleetBlock {
    /// The Redis key of `zone`'s blocks under the sync `prefix` (`rl:login:blocks`).
    pub fn redis_key(prefix: &str, zone: &str) -> String {
        format!("{prefix}{zone}:blocks")
    }

    /// A local record (block word, last change in local ms) in the fleet's terms;
    /// `unix_minus_local_ms` is the wall clock minus the local clock, now.
    pub fn from_local(word: BlockWord, changed_ms: u64, unix_minus_local_ms: i64) -> FleetBlock {
        FleetBlock {
            until_unix_ms: shift(word.until_ms(), unix_minus_local_ms),
            changed_unix_ms: shift(changed_ms, unix_minus_local_ms),
            level: word.level(),
        }
    }

    /// This record in local terms: the block word and the last change, local ms.
    pub fn to_local(&self, unix_minus_local_ms: i64) -> (BlockWord, u64) {
        let until_ms = shift(self.until_unix_ms, unix_minus_local_ms.saturating_neg());
        let changed_ms = shift(self.changed_unix_ms, unix_minus_local_ms.saturating_neg());
        (BlockWord::new(until_ms, self.level), changed_ms)
    }

    /// The value stored in Redis.
    ///
    /// ```
    /// use ratelimit_core::fleet_blocks::FleetBlock;
    ///
    /// let block = FleetBlock { until_unix_ms: 1_796_151_076_750, changed_unix_ms: 1_796_150_176_750, level: 1 };
    /// assert_eq!(block.encode(), "1 1796151076750 1796150176750 1");
    /// assert_eq!(FleetBlock::decode(block.encode().as_bytes()), Ok(block));
    /// ```
    pub fn encode(&self) -> String {
        format!(
            "1 {} {} {}",
            self.until_unix_ms, self.changed_unix_ms, self.level
        )
    }

    /// Read a value of the fleet's block hash; anything else is an error that quotes it.
    pub fn decode(value: &[u8]) -> Result<FleetBlock, FleetBlockError> {
        let bad = || {
            let mut text: String = String::from_utf8_lossy(value).chars().take(64).collect();
            if value.len() > 64 {
                text.push_str("...");
            }
            FleetBlockError(text)
        };
        let text = std::str::from_utf8(value).map_err(|_| bad())?;
        let mut fields = text.split(' ');
        let number = |field: Option<&str>| -> Option<u64> {
            let field = field?;
            if field.is_empty() || !field.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            field.parse().ok()
        };
        if fields.next() != Some("1") {
            return Err(bad());
        }
        let until_unix_ms = number(fields.next()).ok_or_else(bad)?;
        let changed_unix_ms = number(fields.next()).ok_or_else(bad)?;
        let level = number(fields.next())
            .filter(|&level| level <= u64::from(BlockWord::MAX_LEVEL))
            .ok_or_else(bad)? as u8;
        if fields.next().is_some() {
            return Err(bad());
        }
        Ok(FleetBlock {
            until_unix_ms,
            changed_unix_ms,
            level,
        })
    }

    /// This record as an instance may take it at `now_unix_ms` under `policy`: a change in the
    /// future is clamped to now; a block longer than the admin API allows, or a level above
    /// the policy's top level, is refused.
    ///
    /// ```
    /// use ratelimit_core::fleet_blocks::{FleetBlock, RecordRefusal};
    /// use ratelimit_core::penalty::BlockPolicy;
    ///
    /// let policy = BlockPolicy { block_ns: 60_000_000_000, block_max_ns: 3_600_000_000_000 };
    /// let now = 1_800_000_000_000;
    /// let forged = FleetBlock { until_unix_ms: 9_999_999_999_999, changed_unix_ms: now, level: 0 };
    /// assert!(matches!(forged.check(now, &policy), Err(RecordRefusal::TooLong { .. })));
    /// let ahead = FleetBlock { until_unix_ms: now + 60_000, changed_unix_ms: now + 5_000, level: 0 };
    /// assert_eq!(ahead.check(now, &policy).unwrap().changed_unix_ms, now);
    /// ```
    pub fn check(
        &self,
        now_unix_ms: u64,
        policy: &BlockPolicy,
    ) -> Result<FleetBlock, RecordRefusal> {
        let top = policy.top_level();
        if self.level > top {
            return Err(RecordRefusal::Level {
                level: self.level,
                top,
            });
        }
        let changed_unix_ms = self.changed_unix_ms.min(now_unix_ms);
        let bound_ms = (BlockPolicy::MAX_NS / 1_000_000).max(policy.block_max_ns / 1_000_000);
        let length_ms = self.until_unix_ms.saturating_sub(changed_unix_ms);
        let remaining_ms = self.until_unix_ms.saturating_sub(now_unix_ms);
        if length_ms.max(remaining_ms) > bound_ms {
            return Err(RecordRefusal::TooLong {
                remaining_ms,
                bound_ms,
            });
        }
        Ok(FleetBlock {
            changed_unix_ms,
            ..*self
        })
    }

    /// Whether this record replaces `other` (the same key's): the later change wins; on equal
    /// times the longer block, then the higher level, so that every instance picks the same.
    pub fn newer_than(&self, other: &FleetBlock) -> bool {
        (self.changed_unix_ms, self.until_unix_ms, self.level)
            > (other.changed_unix_ms, other.until_unix_ms, other.level)
    }

    /// Whether the record no longer matters at `now_unix_ms`: ended more than `block_max_ms`
    /// ago (a new block would start over at level 0), so it can be deleted.
    pub fn is_spent(&self, now_unix_ms: u64, block_max_ms: u64) -> bool {
        self.until_unix_ms.saturating_add(block_max_ms) < now_unix_ms
    }
}

impl fmt::Display for FleetBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.encode())
    }
}

fn shift(ms: u64, by: i64) -> u64 {
    if by >= 0 {
        ms.saturating_add(by.unsigned_abs())
    } else {
        ms.saturating_sub(by.unsigned_abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block_table::{BlockChange, BlockTable, RECORD_WORDS};
    use std::sync::atomic::AtomicU64;
    use std::sync::Mutex;

    const S: u64 = 1_000_000_000;

    #[test]
    fn values_read_back_and_bad_ones_are_named() {
        let block = FleetBlock {
            until_unix_ms: 10,
            changed_unix_ms: 5,
            level: 63,
        };
        assert_eq!(FleetBlock::decode(block.encode().as_bytes()), Ok(block));
        for bad in [
            "",
            "1",
            "2 10 5 0",
            "1 10 5",
            "1 10 5 64",
            "1 -10 5 0",
            "1 10 5 0 extra",
            "1  10 5 0",
            "1 1e3 5 0",
            "\u{0}",
        ] {
            let error = FleetBlock::decode(bad.as_bytes()).unwrap_err().to_string();
            assert!(
                error.contains("expected \"1 UNTIL_MS CHANGED_MS LEVEL\""),
                "{bad:?}: {error}"
            );
        }
        let long = vec![b'9'; 300];
        let error = FleetBlock::decode(&long).unwrap_err();
        assert_eq!(error.0.len(), 67);
        assert_eq!(FleetBlock::redis_key("rl:", "login"), "rl:login:blocks");
    }

    #[test]
    fn records_are_checked() {
        let policy = BlockPolicy {
            block_ns: 60 * S,
            block_max_ns: 3600 * S,
        };
        let now = 1_800_000_000_000;
        let block = |until, changed, level| FleetBlock {
            until_unix_ms: until,
            changed_unix_ms: changed,
            level,
        };
        let day = 86_400_000;
        // A block, a hand block of 365 days, a release: taken as they are.
        for fine in [
            block(now + 60_000, now, 0),
            block(now + 365 * day, now, 0),
            block(now, now, 6),
        ] {
            assert_eq!(fine.check(now, &policy), Ok(fine));
        }
        // The issue's forged record: 139 years.
        assert_eq!(
            block(9_999_999_999_999, now, 0).check(now, &policy),
            Err(RecordRefusal::TooLong {
                remaining_ms: 9_999_999_999_999 - now,
                bound_ms: 365 * day
            })
        );
        assert!(block(now + 365 * day + 1, now, 0)
            .check(now, &policy)
            .is_err());
        // A change in the future is now; a block from the future is measured from now.
        assert_eq!(
            block(now + 60_000, now + 10_000, 0).check(now, &policy),
            Ok(block(now + 60_000, now, 0))
        );
        assert!(block(now + 400 * day, now + 300 * day, 0)
            .check(now, &policy)
            .is_err());
        // Level 63, above this policy's top (60 s doubled reaches 1 h at level 6).
        assert_eq!(policy.top_level(), 6);
        assert_eq!(
            block(now + 60_000, now, 63).check(now, &policy),
            Err(RecordRefusal::Level { level: 63, top: 6 })
        );
        assert!(block(now + 60_000, now, 7).check(now, &policy).is_err());
    }

    #[test]
    fn the_last_change_wins() {
        let block = |until, changed, level| FleetBlock {
            until_unix_ms: until,
            changed_unix_ms: changed,
            level,
        };
        assert!(block(100, 50, 0).newer_than(&block(200, 40, 3)));
        assert!(block(200, 50, 0).newer_than(&block(100, 50, 0)));
        assert!(!block(100, 50, 0).newer_than(&block(100, 50, 0)));
        assert!(block(100, 0, 0).is_spent(201, 100));
        assert!(!block(100, 0, 0).is_spent(200, 100));
    }

    /// Two instances with their own clocks: a block made on one reaches the other through the
    /// fleet's records, and so does a release made on the other.
    #[test]
    fn a_block_and_a_release_cross_instances() {
        let policy = BlockPolicy {
            block_ns: 60 * S,
            block_max_ns: 600 * S,
        };
        let words_a: Vec<AtomicU64> = (0..RECORD_WORDS * 16).map(|_| AtomicU64::new(0)).collect();
        let words_b: Vec<AtomicU64> = (0..RECORD_WORDS * 16).map(|_| AtomicU64::new(0)).collect();
        let (a, b) = (BlockTable::new(&words_a), BlockTable::new(&words_b));
        let lock = Mutex::new(());
        // A's monotonic clock reads 1000 s when the wall clock reads 1_796_000_000 s; B's 50 s.
        let wall = 1_796_000_000_000_i64;
        let (offset_a, offset_b) = (wall - 1_000_000, wall - 50_000);
        let (now_a, now_b) = (1000 * S, 50 * S);

        // The module hashes keys with the zone's hash; any will do here, the same everywhere.
        let hash_of = |key: &[u8]| key.iter().map(|&b| u64::from(b)).sum::<u64>();
        let hash = hash_of(b"10.0.0.7");
        a.block(
            hash,
            b"10.0.0.7",
            now_a,
            BlockChange::Rejected,
            &policy,
            || lock.lock(),
        )
        .unwrap();
        // A's round sends what changed; B's round applies what is newer.
        let send = |from: &BlockTable, offset: i64| -> Vec<(Vec<u8>, String)> {
            from.changed_since(0)
                .into_iter()
                .map(|(key, word, changed)| {
                    (key, FleetBlock::from_local(word, changed, offset).encode())
                })
                .collect()
        };
        let apply = |to: &BlockTable, sent: &[(Vec<u8>, String)], offset: i64, now: u64| {
            for (key, value) in sent {
                let fleet = FleetBlock::decode(value.as_bytes()).unwrap();
                let (word, changed_ms) = fleet.to_local(offset);
                let change = BlockChange::Fleet { word, changed_ms };
                to.block(hash_of(key), key, now, change, &policy, || lock.lock());
            }
        };
        let sent = send(&a, offset_a);
        assert_eq!(sent[0].1, format!("1 {} {} 0", wall + 60_000, wall));
        apply(&b, &sent, offset_b, now_b);
        // B enforces it on its own clock: 60 s from the same wall-clock instant.
        assert_eq!(b.blocked_for_ns(hash, now_b + S), Some(59 * S));
        // Applying the same record again changes nothing (not newer).
        apply(&b, &sent, offset_b, now_b + S);
        assert_eq!(b.blocked_for_ns(hash, now_b + S), Some(59 * S));

        // B releases it 10 s later; A applies the release.
        assert!(b.release(hash, now_b + 10 * S));
        let released = send(&b, offset_b);
        apply(&a, &released, offset_a, now_a + 10 * S);
        assert_eq!(a.blocked_for_ns(hash, now_a + 10 * S), None);
        // An older record (A's original block) no longer wins on B.
        apply(&b, &sent, offset_b, now_b + 11 * S);
        assert_eq!(b.blocked_for_ns(hash, now_b + 11 * S), None);
    }
}
