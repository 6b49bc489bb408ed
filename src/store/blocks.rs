//! The zone's table of blocked keys (`block=`): the last part of its table, laid out by
//! `ratelimit_core::block_table` (96 bytes a key, an eighth of the zone, see
//! [`super::sizing`]). Lives in the zone's shared memory, so every worker sees a block at once,
//! and a reload with the same key, algorithm and `block=` keeps it.
//!
//! Times in block words are milliseconds of the module's monotonic clock (`glue::now_ns`),
//! the same in every worker; the admin API and the fleet convert them to Unix time.
//!
//! Checks and changes of a key that has a record take no lock (atomics); a key without one
//! claims a record under the zone's slab mutex, which the master releases when a worker dies
//! holding it.

use ratelimit_core::block_table::{BlockChange, BlockTable, BlockedKey};
use ratelimit_core::penalty::{Block, BlockPolicy, BlockWord};

use super::Zone;

impl Zone {
    /// The zone's block table; `None` without `block=`.
    pub fn block_table(&self) -> Option<BlockTable<'_>> {
        if self.blocks.is_null() {
            return None;
        }
        // SAFETY: `blocks` points at `block_words` words that `format` laid out inside the
        // zone's mapping, which outlives this view; `AtomicU64` accepts any bit pattern.
        let words = unsafe { core::slice::from_raw_parts(self.blocks, self.block_words) };
        Some(BlockTable::new(words))
    }

    /// How long the key `hash` stays blocked from `now_ns`; `None` when it is not. No lock.
    #[inline]
    pub fn blocked_for_ns(&self, hash: u64, now_ns: u64) -> Option<u64> {
        self.block_table()?.blocked_for_ns(hash, now_ns)
    }

    /// The key's block word (`BlockWord(0)` without a record).
    pub fn block_word(&self, hash: u64) -> BlockWord {
        self.block_table()
            .map_or(BlockWord::default(), |table| table.word(hash))
    }

    /// Apply `change` to the key `key` (hash `hash`); the block in force after it, or `None`
    /// when the zone has no block table.
    pub fn change_block(
        &self,
        hash: u64,
        key: &[u8],
        now_ns: u64,
        change: BlockChange,
        policy: &BlockPolicy,
    ) -> Option<Block> {
        self.block_table()?
            .block(hash, key, now_ns, change, policy, || self.lock())
    }

    /// End the key's block now; false when it was not blocked.
    pub fn release_block(&self, hash: u64, now_ns: u64) -> bool {
        self.block_table()
            .is_some_and(|table| table.release(hash, now_ns))
    }

    /// The keys blocked at `now_ns`, the block ending first first.
    pub fn blocked_keys(&self, now_ns: u64) -> Vec<BlockedKey> {
        self.block_table()
            .map_or_else(Vec::new, |table| table.blocked(now_ns))
    }

    /// The key `hash`'s block, if blocked at `now_ns`.
    pub fn blocked_key(&self, hash: u64, now_ns: u64) -> Option<BlockedKey> {
        self.block_table()?.blocked_key(hash, now_ns)
    }

    /// Keys blocked at `now_ns`.
    pub fn blocked_count(&self, now_ns: u64) -> usize {
        self.block_table()
            .map_or(0, |table| table.blocked_count(now_ns))
    }

    /// Blocked keys the table holds at most.
    pub fn block_capacity(&self) -> usize {
        self.block_table().map_or(0, |table| table.capacity())
    }
}
