//! The zone's per-key overrides: a fixed table in the header (open addressing, linear
//! probing) whose keys' bytes live in slab chunks, so that the admin API can list them.

use core::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use nginx_sys::{ngx_slab_alloc_locked, ngx_slab_free_locked};
use ratelimit_core::Limits;

use super::{Zone, MAX_KEY_BYTES};

/// Per-key overrides a zone holds.
pub const OVERRIDE_CAPACITY: usize = 512;

/// Why an override could not be set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OverrideError {
    #[error("the override table is full")]
    TableFull,
    #[error("the zone has no memory left for the key")]
    NoMemory,
}

/// One per-key override: `hash == 0` never used; `limits == 0` removed (a tombstone that keeps
/// probe chains intact). The key bytes live in a slab chunk at `key_offset` from the header,
/// prefixed by their length as a `u64`.
#[repr(C)]
pub(super) struct OverrideSlot {
    hash: AtomicU64,
    limits: AtomicU64,
    key_offset: AtomicU64,
}

impl Zone {
    fn override_probe(&self, hash: u64) -> impl Iterator<Item = &OverrideSlot> {
        let start = (hash as usize) % OVERRIDE_CAPACITY;
        let overrides = &self.header().overrides;
        (0..OVERRIDE_CAPACITY).map(move |i| &overrides[(start + i) % OVERRIDE_CAPACITY])
    }

    /// Live overrides now.
    pub fn override_count(&self) -> u64 {
        self.header().override_count.load(Ordering::Relaxed)
    }

    /// The override for a key hash, if any. Lock-free; costs nothing when there are none.
    #[inline(always)]
    pub fn override_for(&self, hash: u64) -> Option<Limits> {
        if self.header().override_count.load(Ordering::Relaxed) == 0 {
            return None;
        }
        self.find_override(hash)
    }

    /// [`Zone::override_for`] in a zone that has overrides.
    #[inline(never)]
    fn find_override(&self, hash: u64) -> Option<Limits> {
        for slot in self.override_probe(hash) {
            match slot.hash.load(Ordering::Acquire) {
                0 => return None,
                h if h == hash => return Limits::unpack(slot.limits.load(Ordering::Acquire)),
                _ => {}
            }
        }
        None
    }

    /// Set a key's override: `Ok(true)` when it is new, `Ok(false)` when it replaced one.
    pub fn set_override(&self, key: &[u8], limits: Limits) -> Result<bool, OverrideError> {
        let hash = self.hash_key(key);
        let _lock = self.lock();
        let mut free = None;
        for slot in self.override_probe(hash) {
            let h = slot.hash.load(Ordering::Relaxed);
            if h == hash {
                let was_live = slot.limits.load(Ordering::Relaxed) != 0;
                slot.limits.store(limits.pack(), Ordering::Release);
                if !was_live {
                    self.header().override_count.fetch_add(1, Ordering::Relaxed);
                }
                return Ok(!was_live);
            }
            if h == 0 {
                free = free.or(Some(slot));
                break;
            }
            if free.is_none() && slot.limits.load(Ordering::Relaxed) == 0 {
                free = Some(slot);
            }
        }
        let slot = free.ok_or(OverrideError::TableFull)?;
        let key_offset = self.store_key_locked(key).ok_or(OverrideError::NoMemory)?;
        let old_offset = slot.key_offset.swap(key_offset, Ordering::Relaxed);
        self.free_key_locked(old_offset);
        slot.limits.store(limits.pack(), Ordering::Relaxed);
        slot.hash.store(hash, Ordering::Release);
        self.header().override_count.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    /// Remove a key's override. Returns whether there was one.
    pub fn remove_override(&self, key: &[u8]) -> bool {
        let hash = self.hash_key(key);
        let _lock = self.lock();
        for slot in self.override_probe(hash) {
            match slot.hash.load(Ordering::Relaxed) {
                0 => return false,
                h if h == hash => {
                    if slot.limits.swap(0, Ordering::Release) == 0 {
                        return false;
                    }
                    self.header().override_count.fetch_sub(1, Ordering::Relaxed);
                    return true;
                }
                _ => {}
            }
        }
        false
    }

    /// Every live override as (key bytes, limits).
    pub fn overrides(&self) -> Vec<(Vec<u8>, Limits)> {
        let _lock = self.lock();
        self.header()
            .overrides
            .iter()
            .filter(|slot| slot.hash.load(Ordering::Relaxed) != 0)
            .filter_map(|slot| {
                let limits = Limits::unpack(slot.limits.load(Ordering::Relaxed))?;
                Some((
                    self.key_at(slot.key_offset.load(Ordering::Relaxed))?,
                    limits,
                ))
            })
            .collect()
    }

    /// Every live override as (key bytes, packed limits), read without the lock, for the sync
    /// thread (which may not take it). A worker may free and reuse a key's chunk meanwhile,
    /// so each read is checked: the chunk lies inside the zone's mapping and the bytes hash
    /// to the slot's hash, which is the same before and after. `None` when a slot kept
    /// changing under the read (try again later).
    pub fn overrides_unlocked(&self) -> Option<Vec<(Vec<u8>, u64)>> {
        let mut found = Vec::new();
        for slot in self.header().overrides.iter() {
            let mut tries = 0;
            loop {
                let hash = slot.hash.load(Ordering::Acquire);
                let limits = slot.limits.load(Ordering::Acquire);
                if hash == 0 || limits == 0 {
                    break;
                }
                let offset = slot.key_offset.load(Ordering::Acquire);
                let key = self.key_at_unlocked(offset);
                let same = slot.hash.load(Ordering::Acquire) == hash
                    && slot.limits.load(Ordering::Acquire) == limits
                    && slot.key_offset.load(Ordering::Acquire) == offset;
                if !same {
                    if tries == 3 {
                        return None;
                    }
                    tries += 1;
                    continue;
                }
                // A slot that did not change holds its chunk (a chunk is freed only when its
                // slot's offset is swapped): bytes that do not hash right are not a key.
                if let Some(key) = key.filter(|key| self.hash_key(key) == hash) {
                    found.push((key, limits));
                }
                break;
            }
        }
        Some(found)
    }

    /// The bytes of a key chunk, read without the lock: `None` when the offset or the length
    /// word would lead outside the zone's mapping (the chunk was reused meanwhile).
    fn key_at_unlocked(&self, offset: u64) -> Option<Vec<u8>> {
        if offset == 0 {
            return None;
        }
        let start = self.shpool as usize;
        // SAFETY: the slab pool header is written by nginx when the zone is created and its
        // `end` never changes afterwards.
        let end = unsafe { (*self.shpool).end } as usize;
        let chunk = (self.shared as usize).wrapping_add(offset as usize);
        if chunk < start || chunk.checked_add(8)? > end || !chunk.is_multiple_of(8) {
            return None;
        }
        // SAFETY: `chunk..chunk + 8` lies inside the mapping and is 8-aligned (checked above).
        // The words may be rewritten by a worker at any time: they are read as atomics (as
        // `store_key_locked` writes them), and the caller only trusts bytes that hash to the
        // slot's hash.
        let len = unsafe { AtomicU64::from_ptr(chunk as *mut u64) }.load(Ordering::Relaxed);
        let len = len as usize;
        if len > MAX_KEY_BYTES || len > end - chunk - 8 {
            return None;
        }
        let bytes = (chunk + 8) as *mut u8;
        Some(
            (0..len)
                // SAFETY: `bytes..bytes + len` lies inside the mapping (checked above).
                .map(|i| unsafe { AtomicU8::from_ptr(bytes.add(i)) }.load(Ordering::Relaxed))
                .collect(),
        )
    }

    /// Copy `key` into a fresh chunk; its offset from the header. The zone lock is held.
    fn store_key_locked(&self, key: &[u8]) -> Option<u64> {
        // SAFETY: the zone lock is held (callers are `_locked`); the chunk is ours until freed.
        let chunk = unsafe { ngx_slab_alloc_locked(self.shpool, 8 + key.len()) }.cast::<u8>();
        if chunk.is_null() {
            return None;
        }
        // Written as atomics: the sync thread reads chunks without the lock
        // (`key_at_unlocked`), and may read one that is being reused.
        // SAFETY: `chunk` has room for the length word and the key bytes; slab chunks of 8
        // bytes or more are aligned to their size class, so the length word is 8-aligned.
        unsafe { AtomicU64::from_ptr(chunk.cast::<u64>()) }
            .store(key.len() as u64, Ordering::Relaxed);
        for (i, &byte) in key.iter().enumerate() {
            // SAFETY: inside the chunk (8 + key.len() bytes).
            unsafe { AtomicU8::from_ptr(chunk.add(8 + i)) }.store(byte, Ordering::Relaxed);
        }
        Some(chunk as u64 - self.shared as u64)
    }

    /// Free a chunk of [`Zone::store_key_locked`] (0: none). The zone lock is held.
    fn free_key_locked(&self, offset: u64) {
        if offset != 0 {
            // SAFETY: a non-zero offset was returned by `store_key_locked` for this zone and is
            // freed once, here, under the lock.
            unsafe {
                ngx_slab_free_locked(
                    self.shpool,
                    self.shared.cast::<u8>().add(offset as usize).cast(),
                )
            };
        }
    }

    /// A key chunk's bytes, read under the zone lock.
    fn key_at(&self, offset: u64) -> Option<Vec<u8>> {
        if offset == 0 {
            return None;
        }
        // SAFETY: offsets come from `store_key_locked` (a chunk with a length prefix inside
        // the zone's mapping) and are read under the zone lock.
        unsafe {
            let chunk = self.shared.cast::<u8>().add(offset as usize);
            let len = chunk.cast::<u64>().read_unaligned() as usize;
            Some(core::slice::from_raw_parts(chunk.add(8), len).to_vec())
        }
    }
}
