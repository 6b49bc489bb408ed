//! The fleet's override changes on their way from the sync thread to a worker.
//!
//! Setting an override allocates the key from the zone's slab pool under its mutex, which the
//! thread may not take. So the thread writes the changes into this fixed-size inbox in the
//! instance's sync shared memory, and a worker applies them from its watch timer through the
//! control layer (the key's backlog rescaled, the state file written).
//!
//! One state word orders everything: `EMPTY` → `WRITING` (the loop) → `READY` → `APPLYING`
//! (one worker) → `DONE` (each entry's result written) → `EMPTY` (the loop, after reading the
//! results). The entries are atomics written and read only by whoever holds the state, so no
//! lock is needed. While writing or applying, the word also holds the pid of the process doing
//! it: when that process dies, the loop takes the inbox back.

use core::sync::atomic::{AtomicU64, Ordering};

use ratelimit_core::fleet_overrides::{Change, KEY_MAX};

use crate::glue::process_alive;

/// Changes one inbox holds; more wait for the next round.
pub const INBOX_ENTRIES: usize = 128;

const KEY_WORDS: usize = KEY_MAX / 8;

const EMPTY: u64 = 0;
const WRITING: u64 = 1;
const READY: u64 = 2;
const APPLYING: u64 = 3;
const DONE: u64 = 4;

/// The state word: a state in the low 3 bits, the pid holding it above.
fn held(state: u64) -> u64 {
    u64::from(std::process::id()) << 3 | state
}

fn state_of(word: u64) -> u64 {
    word & 0b111
}

fn pid_of(word: u64) -> u64 {
    word >> 3
}

/// What a worker did with one change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum Applied {
    Pending = 0,
    /// The override was set or removed.
    Done = 1,
    /// The key's override had changed locally meanwhile: left as is (the loop pushes it).
    Skipped = 2,
    /// No room for another override, or the zone is not in this configuration.
    Failed = 3,
}

impl Applied {
    fn from_code(code: u64) -> Applied {
        match code {
            1 => Applied::Done,
            2 => Applied::Skipped,
            3 => Applied::Failed,
            _ => Applied::Pending,
        }
    }
}

/// One change: `from` and `to` are packed limits, 0 for none.
#[repr(C)]
pub struct InboxEntry {
    /// [`super::sync_record::name_seed`] of the zone's name: the same in every generation of
    /// workers.
    zone_id: AtomicU64,
    from: AtomicU64,
    to: AtomicU64,
    key_len: AtomicU64,
    result: AtomicU64,
    key: [AtomicU64; KEY_WORDS],
}

/// The inbox itself (inside `SyncShared`; all zero is an empty inbox).
#[repr(C)]
pub struct Inbox {
    state: AtomicU64,
    count: AtomicU64,
    entries: [InboxEntry; INBOX_ENTRIES],
}

/// A change as the worker reads it.
pub struct Incoming {
    pub zone_id: u64,
    pub key: Vec<u8>,
    pub from: u64,
    pub to: u64,
}

impl InboxEntry {
    fn write(&self, zone_id: u64, change: &Change) {
        self.zone_id.store(zone_id, Ordering::Relaxed);
        self.from.store(change.from, Ordering::Relaxed);
        self.to.store(change.to, Ordering::Relaxed);
        self.key_len
            .store(change.key.len() as u64, Ordering::Relaxed);
        self.result
            .store(Applied::Pending as u64, Ordering::Relaxed);
        for (word, chunk) in self.key.iter().zip(change.key.chunks(8)) {
            let mut bytes = [0u8; 8];
            bytes[..chunk.len()].copy_from_slice(chunk);
            word.store(u64::from_le_bytes(bytes), Ordering::Relaxed);
        }
    }

    fn read(&self) -> Incoming {
        let len = (self.key_len.load(Ordering::Relaxed) as usize).min(KEY_MAX);
        let mut key: Vec<u8> = self
            .key
            .iter()
            .flat_map(|word| word.load(Ordering::Relaxed).to_le_bytes())
            .collect();
        key.truncate(len);
        Incoming {
            zone_id: self.zone_id.load(Ordering::Relaxed),
            key,
            from: self.from.load(Ordering::Relaxed),
            to: self.to.load(Ordering::Relaxed),
        }
    }
}

impl Inbox {
    /// Loop side: whether new changes may be written. Reads the results of a batch a worker
    /// finished (`(zone_id, change)` of each that failed) and empties the inbox; takes back a
    /// batch whose writer or applier died.
    pub fn settle(&self, failed: &mut Vec<(u64, Change)>) -> bool {
        let word = self.state.load(Ordering::Acquire);
        match state_of(word) {
            EMPTY => true,
            DONE => {
                let count = (self.count.load(Ordering::Relaxed) as usize).min(INBOX_ENTRIES);
                for entry in &self.entries[..count] {
                    if Applied::from_code(entry.result.load(Ordering::Relaxed)) == Applied::Failed {
                        let incoming = entry.read();
                        failed.push((
                            incoming.zone_id,
                            Change {
                                key: incoming.key,
                                from: incoming.from,
                                to: incoming.to,
                            },
                        ));
                    }
                }
                self.state.store(EMPTY, Ordering::Release);
                true
            }
            state @ (WRITING | APPLYING) if !process_alive(pid_of(word)) => {
                // A loop that died writing left half a batch: dropped (its changes are
                // computed again). A worker that died applying: another applies the batch.
                let back = if state == WRITING { EMPTY } else { READY };
                let _ =
                    self.state
                        .compare_exchange(word, back, Ordering::AcqRel, Ordering::Relaxed);
                false
            }
            _ => false,
        }
    }

    /// Loop side: no batch is waiting or being applied.
    pub fn is_empty(&self) -> bool {
        self.state.load(Ordering::Acquire) == EMPTY
    }

    /// Loop side, after [`Inbox::settle`] said yes: hand over up to [`INBOX_ENTRIES`]
    /// changes (taken from the front of `changes`).
    pub fn post(&self, changes: &mut Vec<(u64, Change)>) {
        if changes.is_empty()
            || self
                .state
                .compare_exchange(EMPTY, held(WRITING), Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let count = changes.len().min(INBOX_ENTRIES);
        for (entry, (zone_id, change)) in self.entries.iter().zip(changes.drain(..count)) {
            entry.write(zone_id, &change);
        }
        self.count.store(count as u64, Ordering::Relaxed);
        self.state.store(READY, Ordering::Release);
    }

    /// Worker side: take a ready batch, apply each change with `apply`, and mark it done.
    /// Returns how many changes were applied.
    pub fn apply(&self, mut apply: impl FnMut(&Incoming) -> Applied) -> usize {
        if self.state.load(Ordering::Acquire) != READY
            || self
                .state
                .compare_exchange(READY, held(APPLYING), Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return 0;
        }
        let count = (self.count.load(Ordering::Relaxed) as usize).min(INBOX_ENTRIES);
        let mut applied = 0;
        for entry in &self.entries[..count] {
            let result = apply(&entry.read());
            applied += usize::from(result == Applied::Done);
            entry.result.store(result as u64, Ordering::Relaxed);
        }
        self.state.store(DONE, Ordering::Release);
        applied
    }
}
