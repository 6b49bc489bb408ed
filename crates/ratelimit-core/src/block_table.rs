//! The table of blocked keys a zone keeps in its shared memory (`block=`): fixed-size records
//! over a slice of `AtomicU64` that every worker maps, so the module only hands it the words.
//!
//! A record is [`RECORD_WORDS`] words (96 bytes):
//!
//! ```text
//! [0] key hash (0: empty)   [1] block word (BlockWord)   [2] last change, ms   [3] key length
//! [4..12] the key's first KEY_BYTES bytes (for listing and the fleet; longer keys are listed
//!         cut and kept to this instance)
//! ```
//!
//! The last change is when the block started, or when it was released by hand: it orders a
//! record against the same key's record from another instance ([`crate::fleet_blocks`]).
//!
//! A key's record lives in one of the [`PROBE_RECORDS`] records from its home (hash modulo
//! the record count). Decisions read the hash and the block word only: "is this key blocked"
//! takes no lock, and a key with a record is blocked or released by compare-and-swap on its
//! block word. Claiming a record for a key without one is serialised by the caller's lock (the
//! zone's slab mutex in the module, which the master releases when a worker dies holding it),
//! passed in as a closure so this module needs no nginx. A claim writes the record's words
//! and publishes the hash last (Release), so a worker killed mid-claim leaves an empty record
//! or a complete one.
//!
//! A full probe window never gives way while its blocks matter: a new key takes an empty
//! record or one whose block is spent (ended more than `block_max` ago, so its escalation
//! level no longer counts either), else it gets no record (`None`: the caller counts it as
//! not recorded; the key stays rate-limited, just not blocked). No rule that evicts a block
//! in force is safe: whoever picks the keys (an attacker with fresh keys) picks which block
//! ends early, their own included. Like the zone's slots, one race is accepted: a worker that
//! read a hash just before a spent record was given to another key may apply the new key's
//! block word to one request of the old key.

use core::sync::atomic::{AtomicU64, Ordering};

use crate::penalty::{Block, BlockPolicy, BlockWord};

/// Words per record.
pub const RECORD_WORDS: usize = 12;
/// Key bytes a record keeps for listing and the fleet.
pub const KEY_BYTES: usize = 64;
/// Records a key may live in, from its home.
pub const PROBE_RECORDS: usize = 8;

const NANOS_PER_MS: u64 = 1_000_000;

/// What to do to a key's block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockChange {
    /// A request of the key was rejected: block it per the zone's policy (escalating).
    Rejected,
    /// Block it by hand (admin API, Lua) for this long, keeping its level.
    ByHand(u64),
    /// Take another instance's record: this block word, changed at this time (ms, the local
    /// clock); applied only when newer than the local record's last change.
    Fleet {
        /// The block word to store.
        word: BlockWord,
        /// When the other instance changed it.
        changed_ms: u64,
    },
}

/// One blocked key, as listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockedKey {
    /// The key (its first [`KEY_BYTES`] bytes when `truncated`).
    pub key: Vec<u8>,
    /// The key was longer than what a record keeps.
    pub truncated: bool,
    /// When the block started and ends, and its level.
    pub block: Block,
}

/// A zone's block table over `words` (a multiple of [`RECORD_WORDS`]; extra words unused).
#[derive(Clone, Copy, Debug)]
pub struct BlockTable<'a> {
    words: &'a [AtomicU64],
}

impl<'a> BlockTable<'a> {
    /// The table over `words`; all zeros is an empty table.
    pub fn new(words: &'a [AtomicU64]) -> BlockTable<'a> {
        let records = words.len() / RECORD_WORDS;
        BlockTable {
            words: &words[..records * RECORD_WORDS],
        }
    }

    /// Records the table holds.
    pub fn capacity(&self) -> usize {
        self.words.len() / RECORD_WORDS
    }

    /// Words needed for `records` records.
    pub fn words_for(records: usize) -> usize {
        records.saturating_mul(RECORD_WORDS)
    }

    fn record(&self, index: usize) -> &'a [AtomicU64] {
        &self.words[index * RECORD_WORDS..(index + 1) * RECORD_WORDS]
    }

    /// The indexes of `hash`'s probe window.
    fn window(&self, hash: u64) -> impl Iterator<Item = usize> {
        let capacity = self.capacity();
        let home = if capacity == 0 {
            0
        } else {
            (hash % capacity as u64) as usize
        };
        (0..PROBE_RECORDS.min(capacity)).map(move |step| (home + step) % capacity)
    }

    fn find(&self, hash: u64) -> Option<usize> {
        let hash = nonzero(hash);
        self.window(hash)
            .find(|&index| self.record(index)[0].load(Ordering::Acquire) == hash)
    }

    /// The key's block word (`BlockWord(0)` when it has no record). No lock.
    pub fn word(&self, hash: u64) -> BlockWord {
        match self.find(hash) {
            Some(index) => BlockWord(self.record(index)[1].load(Ordering::Acquire)),
            None => BlockWord::default(),
        }
    }

    /// How long the key stays blocked from `now_ns`; `None` when it is not blocked. No lock.
    pub fn blocked_for_ns(&self, hash: u64, now_ns: u64) -> Option<u64> {
        self.word(hash).blocked_for_ns(now_ns)
    }

    /// Block the key `key` (whose hash is `hash`) at `now_ns`; `lock` is called, and its guard
    /// held, only when the key needs a record. Returns the block now in force, or `None` when
    /// the key has no record and its probe window no free or spent one (a full table keeps
    /// its blocks).
    ///
    /// ```
    /// use std::sync::atomic::AtomicU64;
    /// use std::sync::Mutex;
    /// use ratelimit_core::block_table::{BlockChange, BlockTable};
    /// use ratelimit_core::penalty::BlockPolicy;
    ///
    /// let words: Vec<AtomicU64> = (0..BlockTable::words_for(16)).map(|_| AtomicU64::new(0)).collect();
    /// let table = BlockTable::new(&words);
    /// let lock = Mutex::new(());
    /// let s = 1_000_000_000;
    /// let policy = BlockPolicy { block_ns: 2 * s, block_max_ns: 8 * s };
    /// let block = table
    ///     .block(42, b"10.0.0.1", 10 * s, BlockChange::Rejected, &policy, || lock.lock())
    ///     .unwrap();
    /// assert_eq!(block.until_ns, 12 * s);
    /// assert_eq!(table.blocked_for_ns(42, 11 * s), Some(s));
    /// assert_eq!(table.blocked_for_ns(42, 12 * s), None);
    /// ```
    pub fn block<G>(
        &self,
        hash: u64,
        key: &[u8],
        now_ns: u64,
        change: BlockChange,
        policy: &BlockPolicy,
        lock: impl FnOnce() -> G,
    ) -> Option<Block> {
        if let Some(index) = self.find(hash) {
            return Some(self.change(index, now_ns, change, policy));
        }
        let _guard = lock();
        // Another worker may have claimed it while we waited for the lock.
        if let Some(index) = self.find(hash) {
            return Some(self.change(index, now_ns, change, policy));
        }
        let index = self.victim(hash, now_ns, policy)?;
        let record = self.record(index);
        // Unpublish first: readers of the evicted key stop finding it.
        record[0].store(0, Ordering::Release);
        record[1].store(0, Ordering::Relaxed);
        record[2].store(0, Ordering::Relaxed);
        record[3].store(key.len() as u64, Ordering::Relaxed);
        let mut padded = [0_u8; KEY_BYTES];
        let kept = key.len().min(KEY_BYTES);
        padded[..kept].copy_from_slice(&key[..kept]);
        for (word, chunk) in record[4..].iter().zip(padded.chunks_exact(8)) {
            let mut bytes = [0_u8; 8];
            bytes.copy_from_slice(chunk);
            word.store(u64::from_le_bytes(bytes), Ordering::Relaxed);
        }
        let (word, block) = apply(BlockWord::default(), now_ns, change, policy);
        record[1].store(word.0, Ordering::Relaxed);
        record[2].store(changed_ms(change, &block), Ordering::Relaxed);
        record[0].store(nonzero(hash), Ordering::Release);
        Some(block)
    }

    /// Compare-and-swap the block word of record `index`.
    fn change(
        &self,
        index: usize,
        now_ns: u64,
        change: BlockChange,
        policy: &BlockPolicy,
    ) -> Block {
        let record = self.record(index);
        let mut current = record[1].load(Ordering::Acquire);
        if let BlockChange::Fleet { changed_ms, .. } = change {
            let ours = record[2].load(Ordering::Relaxed);
            // Ours is as new or newer: keep it.
            if ours >= changed_ms {
                return block_of(BlockWord(current), ours);
            }
        }
        loop {
            let (next, block) = apply(BlockWord(current), now_ns, change, policy);
            if next.0 == current {
                return block;
            }
            match record[1].compare_exchange_weak(
                current,
                next.0,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    // The winner of the swap says when it changed the block.
                    record[2].store(changed_ms(change, &block), Ordering::Relaxed);
                    return block;
                }
                Err(actual) => current = actual,
            }
        }
    }

    /// The record a new key takes: empty, else spent; none while every block of the window
    /// (or its level) still matters.
    fn victim(&self, hash: u64, now_ns: u64, policy: &BlockPolicy) -> Option<usize> {
        let mut spent = None;
        for index in self.window(hash) {
            let record = self.record(index);
            if record[0].load(Ordering::Acquire) == 0 {
                return Some(index);
            }
            let word = BlockWord(record[1].load(Ordering::Acquire));
            if spent.is_none() && word.is_spent(now_ns, policy) {
                spent = Some(index);
            }
        }
        spent
    }

    /// End the key's block now (admin API, Lua); `false` when it was not blocked. No lock.
    pub fn release(&self, hash: u64, now_ns: u64) -> bool {
        let Some(index) = self.find(hash) else {
            return false;
        };
        let record = self.record(index);
        let mut current = record[1].load(Ordering::Acquire);
        loop {
            let word = BlockWord(current);
            if word.blocked_for_ns(now_ns).is_none() {
                return false;
            }
            let released = word.released(now_ns);
            match record[1].compare_exchange_weak(
                current,
                released.0,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    record[2].store(now_ns / NANOS_PER_MS, Ordering::Relaxed);
                    return true;
                }
                Err(actual) => current = actual,
            }
        }
    }

    /// The records changed after `after_ms` (local clock) whose whole key is kept, as
    /// `(key, block word, changed_ms)`: what the sync loop sends to the fleet.
    pub fn changed_since(&self, after_ms: u64) -> Vec<(Vec<u8>, BlockWord, u64)> {
        (0..self.capacity())
            .filter_map(|index| {
                let record = self.record(index);
                if record[0].load(Ordering::Acquire) == 0 {
                    return None;
                }
                let changed = record[2].load(Ordering::Relaxed);
                let length = usize::try_from(record[3].load(Ordering::Relaxed)).ok()?;
                if changed <= after_ms || length > KEY_BYTES {
                    return None;
                }
                let word = BlockWord(record[1].load(Ordering::Acquire));
                Some((key_bytes(record, length), word, changed))
            })
            .collect()
    }

    /// The keys blocked at `now_ns`, the block ending first first.
    pub fn blocked(&self, now_ns: u64) -> Vec<BlockedKey> {
        let mut keys: Vec<BlockedKey> = (0..self.capacity())
            .filter_map(|index| self.listed(index, now_ns))
            .collect();
        keys.sort_by_key(|key| key.block.until_ns);
        keys
    }

    /// The key `hash`'s block at `now_ns`, if blocked.
    pub fn blocked_key(&self, hash: u64, now_ns: u64) -> Option<BlockedKey> {
        self.listed(self.find(hash)?, now_ns)
    }

    /// How many keys are blocked at `now_ns`.
    pub fn blocked_count(&self, now_ns: u64) -> usize {
        (0..self.capacity())
            .filter(|&index| {
                let record = self.record(index);
                record[0].load(Ordering::Acquire) != 0
                    && BlockWord(record[1].load(Ordering::Acquire))
                        .blocked_for_ns(now_ns)
                        .is_some()
            })
            .count()
    }

    fn listed(&self, index: usize, now_ns: u64) -> Option<BlockedKey> {
        let record = self.record(index);
        if record[0].load(Ordering::Acquire) == 0 {
            return None;
        }
        let word = BlockWord(record[1].load(Ordering::Acquire));
        word.blocked_for_ns(now_ns)?;
        let until_ns = word.until_ms().saturating_mul(NANOS_PER_MS);
        let since_ns = record[2]
            .load(Ordering::Relaxed)
            .saturating_mul(NANOS_PER_MS)
            .min(until_ns);
        let length = usize::try_from(record[3].load(Ordering::Relaxed)).unwrap_or(usize::MAX);
        Some(BlockedKey {
            key: key_bytes(record, length),
            truncated: length > KEY_BYTES,
            block: Block {
                since_ns,
                until_ns,
                level: word.level(),
            },
        })
    }
}

fn apply(
    word: BlockWord,
    now_ns: u64,
    change: BlockChange,
    policy: &BlockPolicy,
) -> (BlockWord, Block) {
    match change {
        BlockChange::Rejected => word.after_rejection(now_ns, policy),
        BlockChange::ByHand(duration_ns) => word.by_hand(now_ns, duration_ns),
        BlockChange::Fleet {
            word: theirs,
            changed_ms,
        } => (theirs, block_of(theirs, changed_ms)),
    }
}

/// The block a word holds, started (or last changed) at `since_ms`.
fn block_of(word: BlockWord, since_ms: u64) -> Block {
    let until_ns = word.until_ms().saturating_mul(NANOS_PER_MS);
    Block {
        since_ns: since_ms.saturating_mul(NANOS_PER_MS).min(until_ns),
        until_ns,
        level: word.level(),
    }
}

/// The time a change is recorded at: another instance's for a fleet record, else the block's
/// start.
fn changed_ms(change: BlockChange, block: &Block) -> u64 {
    match change {
        BlockChange::Fleet { changed_ms, .. } => changed_ms,
        _ => block.since_ns / NANOS_PER_MS,
    }
}

/// The key text a record keeps (its first `length` bytes, at most [`KEY_BYTES`]).
fn key_bytes(record: &[AtomicU64], length: usize) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(KEY_BYTES);
    for word in &record[4..] {
        bytes.extend_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
    }
    bytes.truncate(length.min(KEY_BYTES));
    bytes
}

/// Hash 0 marks an empty record: a key hashing to 0 is stored as 1.
fn nonzero(hash: u64) -> u64 {
    hash.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    const S: u64 = 1_000_000_000;

    fn words(records: usize) -> Vec<AtomicU64> {
        (0..BlockTable::words_for(records))
            .map(|_| AtomicU64::new(0))
            .collect()
    }

    fn policy() -> BlockPolicy {
        BlockPolicy {
            block_ns: 10 * S,
            block_max_ns: 60 * S,
        }
    }

    #[test]
    fn block_escalate_release_list() {
        let words = words(32);
        let table = BlockTable::new(&words);
        let lock = Mutex::new(());
        let block = |hash, key: &[u8], now| {
            table
                .block(hash, key, now, BlockChange::Rejected, &policy(), || {
                    lock.lock()
                })
                .unwrap()
        };
        assert_eq!(block(7, b"10.0.0.7", 100 * S).duration_ns(), 10 * S);
        // Rejected again while blocked: the same block.
        assert_eq!(block(7, b"10.0.0.7", 105 * S).until_ns, 110 * S);
        // Back soon after: twice.
        let second = block(7, b"10.0.0.7", 111 * S);
        assert_eq!((second.level, second.duration_ns()), (1, 20 * S));
        let long_key = vec![b'k'; 100];
        block(9, &long_key, 112 * S);
        let listed = table.blocked(115 * S);
        // The block ending first (the long key's, at 122 s) is listed first.
        assert_eq!(listed.len(), 2);
        assert_eq!(listed[0].key, vec![b'k'; KEY_BYTES]);
        assert!(listed[0].truncated);
        assert_eq!(listed[1].key, b"10.0.0.7");
        assert_eq!(
            (listed[1].block.since_ns, listed[1].block.until_ns),
            (111 * S, 131 * S)
        );
        assert!(!listed[1].truncated);
        assert_eq!(table.blocked_count(115 * S), 2);
        assert!(table.release(7, 116 * S));
        assert!(!table.release(7, 116 * S));
        assert_eq!(table.blocked_for_ns(7, 116 * S), None);
        assert_eq!(table.blocked_count(116 * S), 1);
        // Released by hand and rejected again: escalates from its level.
        assert_eq!(block(7, b"10.0.0.7", 117 * S).level, 2);
        // A hand block sets its own length.
        let by_hand = table
            .block(
                7,
                b"10.0.0.7",
                118 * S,
                BlockChange::ByHand(3 * S),
                &policy(),
                || lock.lock(),
            )
            .unwrap();
        assert_eq!(by_hand.until_ns, 121 * S);
        assert_eq!(
            table.blocked_key(7, 120 * S).unwrap().block.until_ns,
            121 * S
        );
        assert_eq!(table.blocked_key(8, 120 * S), None);
    }

    /// A full window keeps its blocks: a newcomer gets no record until one is spent.
    #[test]
    fn a_full_window_keeps_its_blocks() {
        let words = words(PROBE_RECORDS);
        let table = BlockTable::new(&words);
        let lock = Mutex::new(());
        let capacity = PROBE_RECORDS as u64;
        // Fill every record (hashes with the same home), blocks ending at 10 + i s.
        for i in 0..capacity {
            table
                .block(
                    i * capacity,
                    b"k",
                    i * S,
                    BlockChange::Rejected,
                    &policy(),
                    || lock.lock(),
                )
                .unwrap();
        }
        assert_eq!(table.blocked_count(9 * S), PROBE_RECORDS);
        let newcomer = 1000 * capacity;
        let refused = table.block(
            newcomer,
            b"new",
            9 * S,
            BlockChange::Rejected,
            &policy(),
            || lock.lock(),
        );
        assert_eq!(refused, None);
        // Every block stays, the oldest (ending first) too; the newcomer is not blocked.
        assert!(table.blocked_for_ns(0, 9 * S).is_some());
        assert!(table.blocked_for_ns(capacity, 9 * S).is_some());
        assert_eq!(table.blocked_for_ns(newcomer, 9 * S), None);
        // Ended but not spent: the level still counts, the record stays.
        assert_eq!(
            table.block(
                newcomer,
                b"new",
                20 * S,
                BlockChange::Rejected,
                &policy(),
                || { lock.lock() }
            ),
            None
        );
        // Much later every record is spent: any of them is taken, the count stays bounded.
        table
            .block(
                7777 * capacity,
                b"late",
                10_000 * S,
                BlockChange::Rejected,
                &policy(),
                || lock.lock(),
            )
            .unwrap();
        assert_eq!(table.blocked_count(10_000 * S), 1);
        // A table without records blocks nothing and never panics.
        let empty = BlockTable::new(&[]);
        assert_eq!(
            empty.block(1, b"x", 0, BlockChange::Rejected, &policy(), || ()),
            None
        );
        assert_eq!(empty.blocked_for_ns(1, 0), None);
    }

    /// Threads rejecting the same keys at once: one record per key, one block each, every
    /// thread sees the same block.
    #[test]
    fn concurrent_rejections_agree() {
        let words = words(64);
        let table = BlockTable::new(&words);
        let lock = Mutex::new(());
        let now = 50 * S;
        let results: Vec<Vec<Block>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    scope.spawn(|| {
                        (0..16u64)
                            .map(|key| {
                                table
                                    .block(
                                        key + 1,
                                        &key.to_le_bytes(),
                                        now,
                                        BlockChange::Rejected,
                                        &policy(),
                                        || lock.lock(),
                                    )
                                    .unwrap()
                            })
                            .collect()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for thread in &results[1..] {
            assert_eq!(thread, &results[0]);
        }
        assert_eq!(table.blocked_count(now), 16);
        for key in 0..16u64 {
            let records = (0..table.capacity())
                .filter(|&i| table.record(i)[0].load(Ordering::Relaxed) == key + 1)
                .count();
            assert_eq!(records, 1, "key {key}");
        }
    }
}
