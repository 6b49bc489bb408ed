//! What the state file keeps of a quota zone's keys (`rate_limit_state_file`): each key's
//! state word by its id, and the hash seed that gives keys those ids, so that a restart finds
//! every key's count where it left it.

use core::sync::atomic::Ordering;

use super::Zone;

impl Zone {
    /// The zone's hash seed (the state file keeps it with a quota zone's counts).
    pub fn seed(&self) -> [u64; 2] {
        self.seed
    }

    /// The same zone hashing keys with `seed`: for a fresh zone, in the master, before any
    /// key has a state and before workers exist (the caller keeps the returned view).
    pub fn reseeded(mut self, seed: [u64; 2]) -> Zone {
        // SAFETY: written only while the zone is created or restored in the master, before
        // workers map it; no key has been hashed with the old seed yet.
        unsafe { (*self.shared).seed = seed };
        self.seed = seed;
        self
    }

    /// Every key's id and single-word state that is not a fresh key's (a full scan, for the
    /// state file).
    pub fn state_words(&self) -> Vec<(u64, u64)> {
        let table = self.table();
        table
            .occupied()
            .filter_map(|slot| {
                let pin = table.pin(slot)?;
                let word = pin.state()[0].load(Ordering::Acquire);
                (word != 0).then_some((slot.id, word))
            })
            .collect()
    }

    /// Give the key `id` (a hash of this zone's seed) the state `word`: for a fresh zone, in
    /// the master. False when its window has no room.
    pub fn restore_word(&self, id: u64, word: u64, now_ns: u64) -> bool {
        let (slot, _) = self.find_or_claim(id, now_ns);
        if Zone::names_no_slot(slot) {
            return false;
        }
        let Some(pin) = self.table().pin(slot) else {
            return false;
        };
        pin.state()[0].store(word, Ordering::Release);
        true
    }
}
