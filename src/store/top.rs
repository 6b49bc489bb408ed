//! The keys limited most in each zone (`GET zones/NAME/top`), kept in the zone's shared memory.
//!
//! A zone of at least [`MIN_ZONE_BYTES`] gets one [`TopKeys`] region (89 KiB) from
//! its slab pool when it is created; its summaries are explained in `ratelimit_core::top`.
//! Only a delay, a rejection or a usage-based line's settlement writes to it, under the
//! zone's slab mutex: any other passing request never touches it. The master releases that mutex when a worker dies holding it, and any
//! bit pattern is a valid `TopKeys` (lengths are clamped when read), so a worker killed
//! mid-update leaves at worst one miscounted entry.

use core::ptr;
use core::sync::atomic::Ordering;

use nginx_sys::{ngx_slab_alloc_locked, ngx_slab_pool_t};
use ratelimit_core::top::{TopCount, TopKeys, TopKind, TopWindow};

use super::Zone;

/// Size of the smallest zone that keeps top keys (`zone=NAME:256k`): in a smaller one the
/// region (23 pages of 4 KiB) would crowd out the keys' slots.
pub const MIN_ZONE_BYTES: usize = 256 * 1024;

/// Allocate and clear the region in a new zone's pool; its offset from the pool, or 0 when
/// the zone is too small or the pool has no room.
///
/// # Safety
/// `shpool` is an initialized slab pool whose mutex the caller holds.
pub(super) unsafe fn allocate_locked(shpool: *mut ngx_slab_pool_t) -> u64 {
    // SAFETY: the caller passes an initialized pool, which spans the zone up to `end`.
    let zone_bytes = unsafe { (*shpool).end } as usize - shpool as usize;
    if zone_bytes < MIN_ZONE_BYTES {
        return 0;
    }
    let bytes = core::mem::size_of::<TopKeys>();
    // SAFETY: the caller holds the pool's mutex, as the `_locked` allocator requires.
    let region = unsafe { ngx_slab_alloc_locked(shpool, bytes) }.cast::<u8>();
    if region.is_null() {
        return 0;
    }
    // All-zero bytes are the empty `TopKeys`; a new mapping's are zero already (cleared only
    // if not, as with a junk-filling debug allocator: the master need not touch every page).
    // SAFETY: the chunk just allocated is `bytes` long (a multiple of 8, 8-aligned: slab
    // pages) and nobody else knows it yet.
    unsafe {
        let first = region.cast::<u64>().read();
        let last = region.add(bytes - 8).cast::<u64>().read();
        if first != 0 || last != 0 {
            ptr::write_bytes(region, 0, bytes);
        }
    }
    region as u64 - shpool as u64
}

impl Zone {
    /// The zone's region, if it has one. Callers hold the zone lock while they use it.
    fn top_region(&self) -> Option<*mut TopKeys> {
        let offset = self.header().top_offset.load(Ordering::Relaxed);
        if offset == 0 {
            return None;
        }
        // SAFETY: a non-zero offset was returned by `allocate_locked` for this pool, and the
        // region lives as long as the pool.
        Some(unsafe {
            self.shpool
                .cast::<u8>()
                .add(offset as usize)
                .cast::<TopKeys>()
        })
    }

    /// Count one delayed or rejected request of `key` in the zone.
    pub fn record_top(&self, kind: TopKind, now_ns: u64, key: &[u8]) {
        self.record_top_amount(kind, now_ns, key, 1);
    }

    /// Count `amount` for `key` (the tokens a usage-based line settled, for
    /// [`TopKind::Tokens`]).
    pub fn record_top_amount(&self, kind: TopKind, now_ns: u64, key: &[u8], amount: u64) {
        let Some(region) = self.top_region().filter(|_| amount > 0) else {
            return;
        };
        let hash = self.hash_key(key);
        let _lock = self.lock();
        // SAFETY: the region is inside the zone's mapping; the zone lock makes this the only
        // access to it until the lock is released (every access takes it).
        let top = unsafe { &mut *region };
        top.record_amount(kind, now_ns, hash, key, amount);
    }

    /// Whether the zone keeps top keys (it is large enough).
    pub fn keeps_top(&self) -> bool {
        self.top_region().is_some()
    }

    /// The `limit` keys with the highest counts, and the total; `None` when the zone keeps
    /// no top keys.
    pub fn top(
        &self,
        kind: TopKind,
        window: TopWindow,
        now_ns: u64,
        limit: usize,
    ) -> Option<(Vec<TopCount>, u64)> {
        let region = self.top_region()?;
        let _lock = self.lock();
        // SAFETY: as in `record_top`; the lock is held while the summaries are read.
        let top = unsafe { &*region };
        Some((
            top.top(kind, window, now_ns, limit),
            top.total(kind, window, now_ns),
        ))
    }
}
