//! The shared-memory store behind one `rate_limit_zone`.
//!
//! Layout of the block the zone allocates from its slab pool (one allocation, page aligned):
//!
//! ```text
//! ZoneShared header | padding to 64 bytes | slot table
//! slot table = buckets of SLOTS_PER_BUCKET slots; slot = [hash: u64, state: u64 × slot_words]
//! ```
//!
//! A key is identified by a 64-bit foldhash (`foldhash::quality`) of its bytes under a random
//! per-zone seed; the key bytes themselves are not stored, so every key costs the same whatever
//! its length (16 bytes for the single-word algorithms). A key lives in one of the `PROBE_BUCKETS × SLOTS_PER_BUCKET`
//! slots starting at its home bucket.
//!
//! Concurrency: every worker maps the same memory. The single-word algorithms update a slot's
//! state by compare-and-swap and never lock. The zone's slab mutex (which the master releases
//! when a worker dies holding it) is taken only to claim a slot for a new key, to evict, for
//! the multi-word sliding log, and for admin writes. A slot is published by storing its hash
//! last (Release), after its state was reset, so a worker killed mid-claim leaves either an
//! empty slot or a complete one.
//!
//! One race is accepted: a worker that found a key's slot just before another worker evicted
//! that key (window full, under the lock) charges its request to the slot's new key. It needs
//! an eviction and a request for the evicted key within the same microseconds, and costs one
//! request of accounting; closing it would need a lock or a tag on every update.

use core::ffi::c_void;
use core::mem;
use core::ptr;
use core::sync::atomic::{AtomicU64, Ordering};
use std::hash::BuildHasher;

use nginx_sys::{
    ngx_shmtx_lock, ngx_shmtx_unlock, ngx_slab_alloc_locked, ngx_slab_free_locked, ngx_slab_page_t,
    ngx_slab_pool_t, ngx_slab_stat_t,
};
use ratelimit_core::{
    leaky_bucket, sliding_log, token_bucket, Algorithm, BucketCharge, Decision, Limits, Outcome,
    Policy,
};

/// Identifies the layout below; a zone inherited over a reload with another magic is reformatted.
const MAGIC: u64 = 0x726c_7a6f_6e65_0004;

pub const SLOTS_PER_BUCKET: usize = 4;
pub const PROBE_BUCKETS: usize = 2;
/// Per-key overrides a zone holds (open addressing, linear probing).
pub const OVERRIDE_CAPACITY: usize = 512;
/// Smallest table a zone may have: one probe window.
const MIN_SLOTS: usize = SLOTS_PER_BUCKET * PROBE_BUCKETS;

/// Per-zone decision counters, in the order of [`Counter`].
pub const COUNTERS: usize = 5;
/// Counters are kept per worker (modulo this many stripes), each stripe on its own cache
/// line, so that workers counting requests do not contend for one line.
const COUNTER_STRIPES: usize = 16;

/// This process's stripe: `ngx_worker % COUNTER_STRIPES`, set when a worker starts.
static COUNTER_STRIPE: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(0);

/// Pick this worker's counter stripe (called once per worker, at start).
pub fn set_counter_stripe(worker: usize) {
    COUNTER_STRIPE.store(worker % COUNTER_STRIPES, Ordering::Relaxed);
}

/// One worker's counters, padded to a cache line.
#[repr(C, align(64))]
pub struct CounterStripe {
    counts: [AtomicU64; COUNTERS],
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    Passed = 0,
    Delayed = 1,
    Rejected = 2,
    DelayedDryRun = 3,
    RejectedDryRun = 4,
}

impl Counter {
    pub const ALL: [Counter; COUNTERS] = [
        Counter::Passed,
        Counter::Delayed,
        Counter::Rejected,
        Counter::DelayedDryRun,
        Counter::RejectedDryRun,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Counter::Passed => "passed",
            Counter::Delayed => "delayed",
            Counter::Rejected => "rejected",
            Counter::DelayedDryRun => "delayed_dry_run",
            Counter::RejectedDryRun => "rejected_dry_run",
        }
    }
}

/// One per-key override: `hash == 0` never used; `limits == 0` removed (a tombstone that keeps
/// probe chains intact). The key bytes live in a slab chunk at `key_offset` from the header,
/// prefixed by their length as a `u64`, so the admin API can list overrides by key.
#[repr(C)]
pub struct OverrideSlot {
    pub hash: AtomicU64,
    pub limits: AtomicU64,
    pub key_offset: AtomicU64,
}

/// The header at the start of a zone's block. Every field is either written once while the
/// zone is created (before workers exist) or is an atomic.
#[repr(C)]
pub struct ZoneShared {
    magic: u64,
    seed: [u64; 2],
    /// Hash of the zone's KEY text and algorithm: a reload that changes either starts afresh.
    pub fingerprint: AtomicU64,
    algorithm: AtomicU64,
    slot_words: AtomicU64,
    bucket_count: AtomicU64,
    /// Bytes available for the table after the header.
    table_bytes: u64,
    /// The limits requests use now (packed [`Limits`]); the admin API swaps it atomically.
    pub limits: AtomicU64,
    /// The limits the configuration file said at the last (re)load, to notice when it changes.
    pub config_limits: AtomicU64,
    counters: [CounterStripe; COUNTER_STRIPES],
    pub evictions: AtomicU64,
    /// Seconds (monotonic) of the last "zone is full" log line, to log it once a second.
    pub full_logged_sec: AtomicU64,
    pub override_count: AtomicU64,
    pub overrides: [OverrideSlot; OVERRIDE_CAPACITY],
    /// 1 for a `sync` zone: each slot has two more words (see `crate::sync::shared`).
    sync: AtomicU64,
    /// Offset from the slab pool of the top-keys region (`src/top.rs`); 0 when the zone is
    /// too small to keep one.
    pub top_offset: AtomicU64,
}

/// Offset of the slot table from the header, rounded to a cache line.
const TABLE_OFFSET: usize = (mem::size_of::<ZoneShared>() + 63) & !63;

/// What the configuration says about a zone, as the store needs it.
#[derive(Clone, Copy, Debug)]
pub struct ZoneLayout {
    pub algorithm: Algorithm,
    pub limits: Limits,
    pub fingerprint: u64,
    /// For a `sync` zone, the hash seed derived from its name: every instance of the fleet
    /// gives a key the same id.
    pub sync_seed: Option<u64>,
}

impl ZoneLayout {
    /// State words per slot: one for the single-word algorithms, the log for `sliding_log`.
    pub fn slot_words(&self) -> usize {
        if self.sync_seed.is_some() {
            // state, pending delta, grant (sliding_log cannot sync).
            return 3;
        }
        match self.algorithm {
            Algorithm::SlidingLog => {
                sliding_log::words_for(self.limits.rate.whole_requests().unwrap_or(1))
            }
            _ => 1,
        }
    }
}

pub fn algorithm_code(algorithm: Algorithm) -> u64 {
    match algorithm {
        Algorithm::LeakyBucket => 1,
        Algorithm::TokenBucket => 2,
        Algorithm::SlidingLog => 3,
        Algorithm::SlidingWindow => 4,
    }
}

fn algorithm_from_code(code: u64) -> Algorithm {
    match code {
        2 => Algorithm::TokenBucket,
        3 => Algorithm::SlidingLog,
        4 => Algorithm::SlidingWindow,
        _ => Algorithm::LeakyBucket,
    }
}

/// For an error message: why a zone of this layout is too small, and the smallest size (in
/// KiB, as sizes are written in configs) that it works with. A `sliding_log` says what each
/// key takes, since N timestamps per key is what makes it large.
pub fn size_hint(layout: &ZoneLayout, pagesize: usize) -> String {
    let minimum = match min_zone_kib(layout.slot_words(), pagesize) {
        Some(kib) => format!("the minimum is {kib}k"),
        None => "no zone size fits it".to_string(),
    };
    if layout.algorithm != Algorithm::SlidingLog {
        return format!(": {minimum}");
    }
    format!(
        " for sliding_log with {} requests per window (each key takes {} bytes): {minimum}",
        layout.limits.rate.whole_requests().unwrap_or(0),
        8 * (1 + layout.slot_words())
    )
}

/// Whether a zone of `size` bytes holds the header and one probe window of slots of
/// `slot_words` state words: exactly the tests [`Zone::init`] and [`Zone::format`] make on
/// the pages nginx's slab pool leaves free in a zone of that size.
pub fn zone_size_fits(size: usize, slot_words: usize, pagesize: usize) -> bool {
    let block_bytes = block_pages(slab_free_pages(size, pagesize)) * pagesize;
    let bucket_bytes = 8 * (1 + slot_words) * SLOTS_PER_BUCKET;
    block_bytes >= TABLE_OFFSET + 64
        && (block_bytes - TABLE_OFFSET) / bucket_bytes >= PROBE_BUCKETS
        && (block_bytes - TABLE_OFFSET) / bucket_bytes * SLOTS_PER_BUCKET >= MIN_SLOTS
}

/// The smallest zone size in whole KiB that [`zone_size_fits`], if any up to 1 GiB does.
/// Every larger size fits too: the free pages and the block grow with the size.
pub fn min_zone_kib(slot_words: usize, pagesize: usize) -> Option<usize> {
    (1..=1 << 20).find(|kib| zone_size_fits(kib * 1024, slot_words, pagesize))
}

/// Pages of the zone's block out of the slab pool's free pages: all but a few, left for the
/// slab allocator's own use and the override keys. The reserve grows from 1 to 8 pages
/// between 64 and 71 free pages, so that a larger zone never has a smaller block.
fn block_pages(free_pages: usize) -> usize {
    free_pages.saturating_sub(free_pages.saturating_sub(63).clamp(1, 8))
}

/// The free pages nginx's slab pool has in a fresh zone of `size` bytes: `ngx_slab_init`'s
/// arithmetic. The pool header, its size-class lists and statistics, and one page
/// descriptor per page come first, from the page-aligned start of the mapping; the pages
/// start at the next page boundary.
fn slab_free_pages(size: usize, pagesize: usize) -> usize {
    // One list and one statistics entry per size class, from 8 bytes (min_shift 3) up to a
    // page (`ngx_pagesize_shift - pool->min_shift` of them).
    let classes = (pagesize.trailing_zeros() as usize).saturating_sub(3);
    let page_desc = mem::size_of::<ngx_slab_page_t>();
    let metadata = mem::size_of::<ngx_slab_pool_t>()
        + classes * (page_desc + mem::size_of::<ngx_slab_stat_t>());
    let Some(rest) = size.checked_sub(metadata) else {
        return 0;
    };
    let pages = rest / (pagesize + page_desc);
    let start = (metadata + pages * page_desc).next_multiple_of(pagesize);
    pages.min(size.saturating_sub(start) / pagesize)
}

/// Why a zone could not be set up.
#[derive(Debug)]
pub enum ZoneInitError {
    TooSmall,
    NoMemory,
}

/// Holds the zone's slab mutex; released on drop.
pub struct ZoneLock<'a> {
    pool: &'a Zone,
}

impl Drop for ZoneLock<'_> {
    fn drop(&mut self) {
        // SAFETY: the lock was taken by `Zone::lock` on this same, live, slab pool.
        unsafe { ngx_shmtx_unlock(ptr::addr_of_mut!((*self.pool.shpool).mutex)) };
    }
}

/// A process-local view of a zone: pointers into the shared mapping, which has the same
/// address in every worker (it is mapped by the master before fork) and lives as long as the
/// cycle that created this view.
///
/// The view caches what never changes after the zone is laid out (in the master, before
/// workers exist), so the request path reads no shared header field to find a slot.
#[derive(Clone, Copy)]
pub struct Zone {
    shpool: *mut ngx_slab_pool_t,
    shared: *mut ZoneShared,
    table: *mut AtomicU64,
    /// `u64` words per slot: the hash, then the state.
    stride: usize,
    /// Buckets a key's probe window may start at; the table has `PROBE_BUCKETS - 1` more at
    /// its end so that no window wraps around.
    home_buckets: u64,
    slots: usize,
    algorithm: Algorithm,
    seed: [u64; 2],
    sync: bool,
}

/// Where a key's state is: the index of its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotIndex(usize);

impl Zone {
    /// Set up the zone in a fresh slab pool, or adopt the block a previous cycle left in it.
    ///
    /// On adoption the keys' states are kept when the algorithm, key and slot size are
    /// unchanged; the zone limits follow the configuration only if the configuration's value
    /// changed since the last load (a runtime change survives a plain reload).
    ///
    /// # Safety
    /// `shpool` is the initialized slab pool at the start of this zone's shared memory, and no
    /// worker is running yet (zone init runs in the master).
    pub unsafe fn init(
        shpool: *mut ngx_slab_pool_t,
        layout: &ZoneLayout,
        now_ns: u64,
    ) -> Result<(Zone, bool), ZoneInitError> {
        let existing = (*shpool).data.cast::<ZoneShared>();
        if !existing.is_null() && (*existing).magic == MAGIC {
            let zone = Zone::view(shpool, existing);
            let kept = zone.adopt(layout, now_ns)?;
            return Ok((Zone::view(shpool, existing), kept));
        }

        let pagesize = nginx_sys::ngx_pagesize;
        let _lock = PoolLock::take(shpool);
        // The top-keys region first, so that the table takes what is left; a zone that is
        // then too small for its table drops the region rather than fail (the minimum size
        // `nginx -t` states does not count it).
        // SAFETY: the pool is initialized and its mutex is held (`_lock`).
        let mut top_offset = unsafe { crate::top::allocate_locked(shpool) };
        loop {
            let block_bytes = block_pages((*shpool).pfree) * pagesize;
            match Self::create_locked(shpool, layout, block_bytes, top_offset) {
                Err(ZoneInitError::TooSmall) if top_offset != 0 => {
                    ngx_slab_free_locked(
                        shpool,
                        (shpool as *mut u8).add(top_offset as usize).cast(),
                    );
                    top_offset = 0;
                }
                result => return result,
            }
        }
    }

    /// Allocates and formats the zone's block of `block_bytes` from a locked pool.
    ///
    /// # Safety
    /// As [`Zone::init`], with the pool's mutex held.
    unsafe fn create_locked(
        shpool: *mut ngx_slab_pool_t,
        layout: &ZoneLayout,
        block_bytes: usize,
        top_offset: u64,
    ) -> Result<(Zone, bool), ZoneInitError> {
        if block_bytes < TABLE_OFFSET + 64 {
            return Err(ZoneInitError::TooSmall);
        }

        let block = ngx_slab_alloc_locked(shpool, block_bytes).cast::<u8>();
        if block.is_null() {
            return Err(ZoneInitError::NoMemory);
        }
        ptr::write_bytes(block, 0, TABLE_OFFSET);
        let shared = block.cast::<ZoneShared>();
        (*shared).magic = MAGIC;
        (*shared).seed = random_seed();
        (*shared).table_bytes = (block_bytes - TABLE_OFFSET) as u64;
        (*shared).top_offset = AtomicU64::new(top_offset);
        let zone = Zone::view(shpool, shared);
        if !zone.format(layout) {
            ngx_slab_free_locked(shpool, block.cast());
            return Err(ZoneInitError::TooSmall);
        }
        zone.header()
            .limits
            .store(layout.limits.pack(), Ordering::Relaxed);
        zone.header()
            .config_limits
            .store(layout.limits.pack(), Ordering::Relaxed);
        (*shpool).data = shared.cast::<c_void>();
        Ok((Zone::view(shpool, shared), false))
    }

    /// Build the process-local view from the header.
    ///
    /// # Safety
    /// `shared` is a zone header inside `shpool`'s mapping, written by `init`.
    unsafe fn view(shpool: *mut ngx_slab_pool_t, shared: *mut ZoneShared) -> Zone {
        let header = &*shared;
        let buckets = header.bucket_count.load(Ordering::Relaxed);
        let stride = 1 + header.slot_words.load(Ordering::Relaxed) as usize;
        Zone {
            shpool,
            shared,
            table: shared.cast::<u8>().add(TABLE_OFFSET).cast::<AtomicU64>(),
            stride,
            home_buckets: buckets.saturating_sub(PROBE_BUCKETS as u64 - 1).max(1),
            slots: buckets as usize * SLOTS_PER_BUCKET,
            algorithm: algorithm_from_code(header.algorithm.load(Ordering::Relaxed)),
            seed: header.seed,
            sync: header.sync.load(Ordering::Relaxed) != 0,
        }
    }

    /// Re-create a process-local view from the pointer a previous `init` stored in the pool.
    ///
    /// # Safety
    /// `shpool` is a slab pool on which `init` succeeded in this cycle.
    pub unsafe fn from_pool(shpool: *mut ngx_slab_pool_t) -> Option<Zone> {
        let shared = (*shpool).data.cast::<ZoneShared>();
        (!shared.is_null()).then(|| Zone::view(shpool, shared))
    }

    /// Lay the slot table out for `layout` and clear it. False if not even one probe window fits.
    fn format(&self, layout: &ZoneLayout) -> bool {
        let header = self.header();
        let slot_words = layout.slot_words();
        let slot_bytes = 8 * (1 + slot_words);
        let bucket_bytes = slot_bytes * SLOTS_PER_BUCKET;
        let buckets = header.table_bytes as usize / bucket_bytes;
        if buckets < PROBE_BUCKETS || buckets * SLOTS_PER_BUCKET < MIN_SLOTS {
            return false;
        }
        // SAFETY: the table lies inside the block allocated for this zone (table_bytes was
        // computed from that allocation) and nobody reads it during (re)formatting: this runs
        // in the master before workers start.
        unsafe { ptr::write_bytes(self.table_base().cast::<u8>(), 0, buckets * bucket_bytes) };
        header
            .slot_words
            .store(slot_words as u64, Ordering::Relaxed);
        header.bucket_count.store(buckets as u64, Ordering::Relaxed);
        header
            .algorithm
            .store(algorithm_code(layout.algorithm), Ordering::Relaxed);
        header
            .fingerprint
            .store(layout.fingerprint, Ordering::Relaxed);
        header
            .sync
            .store(u64::from(layout.sync_seed.is_some()), Ordering::Relaxed);
        if let Some(seed) = layout.sync_seed {
            // SAFETY: written only here and in `init`, in the master before workers start.
            unsafe { (*self.shared).seed = [seed, seed.rotate_left(32)] };
        }
        true
    }

    /// Take over a zone from the previous cycle. Returns whether the keys' states were kept.
    fn adopt(&self, layout: &ZoneLayout, now_ns: u64) -> Result<bool, ZoneInitError> {
        let header = self.header();
        let same_shape = header.fingerprint.load(Ordering::Relaxed) == layout.fingerprint
            && header.slot_words.load(Ordering::Relaxed) == layout.slot_words() as u64;
        if !same_shape && !self.format(layout) {
            return Err(ZoneInitError::TooSmall);
        }
        let configured = layout.limits.pack();
        if !same_shape {
            header.limits.store(configured, Ordering::Relaxed);
        } else if header.config_limits.load(Ordering::Relaxed) != configured {
            self.set_limits(layout.limits, now_ns);
        }
        header.config_limits.store(configured, Ordering::Relaxed);
        Ok(same_shape)
    }

    /// Make `limits` the zone's limits for every worker from the next request on, keeping
    /// every key's state (see [`Zone::rescale_backlogs`]).
    pub fn set_limits(&self, limits: Limits, now_ns: u64) {
        let old = self.limits();
        self.header().limits.store(limits.pack(), Ordering::Release);
        if let Some(old) = old {
            self.rescale_backlogs(&old, &limits, now_ns);
        }
    }

    /// After the zone's rate changed from `old` to `new`: re-express each bucket's backlog at
    /// the new rate, as limit_req's excess (kept in requests) would drain at a reloaded rate.
    /// Keys with their own override keep theirs. A full scan; lock-free (compare-and-swap).
    pub fn rescale_backlogs(&self, old: &Limits, new: &Limits, now_ns: u64) {
        let algorithm = self.algorithm();
        if old.rate == new.rate
            || !matches!(algorithm, Algorithm::LeakyBucket | Algorithm::TokenBucket)
        {
            return;
        }
        for index in 0..self.slot_count() {
            let slot = self.slot(index);
            let hash = slot[0].load(Ordering::Acquire);
            if hash == 0 || self.override_for(hash).is_some() {
                continue;
            }
            self.rescale_slot(slot, algorithm, old, new, now_ns);
        }
    }

    /// Re-express one key's backlog after its own limits changed (an override set or removed).
    pub fn rescale_key(&self, hash: u64, old: &Limits, new: &Limits, now_ns: u64) {
        if let Some(index) = self.find(hash) {
            self.rescale_slot(self.slot(index.0), self.algorithm, old, new, now_ns);
        }
    }

    fn rescale_slot(
        &self,
        slot: &[AtomicU64],
        algorithm: Algorithm,
        old: &Limits,
        new: &Limits,
        now_ns: u64,
    ) {
        if old.rate == new.rate || algorithm == Algorithm::SlidingLog {
            return;
        }
        let state = &slot[1];
        let mut current = state.load(Ordering::Acquire);
        loop {
            let next =
                ratelimit_core::rescale_word(current, now_ns, algorithm, &old.rate, &new.rate);
            match state.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(actual) => current = actual,
            }
        }
    }

    /// The slab pool the zone lives in (its regions are located from it).
    pub fn pool(&self) -> *mut ngx_slab_pool_t {
        self.shpool
    }

    pub fn header(&self) -> &ZoneShared {
        // SAFETY: `shared` points at the header written by `init`, inside the zone's mapping,
        // which outlives every request and admin call that holds a `Zone`.
        unsafe { &*self.shared }
    }

    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Whether this is a `sync` zone (its requests also take the fleet's grant).
    #[inline]
    pub fn is_sync(&self) -> bool {
        self.sync
    }

    /// A sync zone's `pending` and `grant` words of the key in `index` (`None` if the slots
    /// have no room for them, which a sync zone's layout never allows).
    pub fn sync_words(&self, index: SlotIndex) -> Option<(&AtomicU64, &AtomicU64)> {
        let slot = self.slot(index.0);
        Some((slot.get(2)?, slot.get(3)?))
    }

    /// A sync zone's slot `index` for the loop: its hash (0: empty), state, pending and
    /// grant words. `None` for a zone that is not (or no longer) a sync zone.
    pub fn sync_slot(&self, index: usize) -> Option<(u64, [&AtomicU64; 3])> {
        if !self.sync || self.header().sync.load(Ordering::Relaxed) == 0 || self.stride != 4 {
            return None;
        }
        let slot = self.slot(index);
        Some((
            slot[0].load(Ordering::Acquire),
            [&slot[1], &slot[2], &slot[3]],
        ))
    }

    /// The zone-wide limits in force now.
    pub fn limits(&self) -> Option<Limits> {
        Limits::unpack(self.header().limits.load(Ordering::Acquire))
    }

    /// Slots in the table, overflow buckets included.
    pub fn slot_count(&self) -> usize {
        self.slots
    }

    fn table_base(&self) -> *mut AtomicU64 {
        // SAFETY: the block is at least TABLE_OFFSET bytes long (checked in `init`).
        unsafe {
            self.shared
                .cast::<u8>()
                .add(TABLE_OFFSET)
                .cast::<AtomicU64>()
        }
    }

    /// The words of slot `index`: `[0]` is the key hash, the rest its state.
    fn slot(&self, index: usize) -> &[AtomicU64] {
        let index = index.min(self.slots.saturating_sub(1));
        // SAFETY: `index` is clamped to the table, whose slots are `stride` u64 each, 8-byte
        // aligned inside the zone's mapping; AtomicU64 accepts any bit pattern.
        unsafe { core::slice::from_raw_parts(self.table.add(index * self.stride), self.stride) }
    }

    /// The hash word of slot `index` (< `slots`).
    #[inline]
    fn hash_word(&self, index: usize) -> &AtomicU64 {
        debug_assert!(index < self.slots);
        // SAFETY: callers pass indexes of a probe window, which lies inside the table (the
        // home bucket is below `home_buckets` and the table has PROBE_BUCKETS - 1 more).
        unsafe { &*self.table.add(index * self.stride) }
    }

    /// The first state word of the slot `index` (a `SlotIndex` is always inside the table).
    #[inline]
    fn state_word(&self, index: SlotIndex) -> &AtomicU64 {
        debug_assert!(index.0 < self.slots);
        // SAFETY: slot indexes are only made by `find`/`claim` from probe windows, which lie
        // inside the table; every slot has at least one state word after its hash.
        unsafe { &*self.table.add(index.0 * self.stride + 1) }
    }

    /// Hash a key with the zone's secret seed; never 0 (0 marks an empty slot). foldhash's
    /// quality variant: a few multiplications for a short key, and without the seed a client
    /// cannot choose keys that collide.
    #[inline]
    pub fn hash_key(&self, key: &[u8]) -> u64 {
        foldhash::quality::FixedState::with_seed(self.seed[0])
            .hash_one(key)
            .max(1)
    }

    /// The first slot of the key's probe window; the window is the next
    /// `PROBE_BUCKETS * SLOTS_PER_BUCKET` slots.
    #[inline]
    fn window_start(&self, hash: u64) -> usize {
        // Multiply-shift maps the hash onto the home buckets without a division.
        let home = ((u128::from(hash) * u128::from(self.home_buckets)) >> 64) as usize;
        home * SLOTS_PER_BUCKET
    }

    fn probe_window(&self, hash: u64) -> core::ops::Range<usize> {
        let first = self.window_start(hash);
        first..first + PROBE_BUCKETS * SLOTS_PER_BUCKET
    }

    /// The slot holding `hash`, if the key has one. Lock-free.
    ///
    /// Slots never become empty again (a forgotten key keeps its slot with a fresh state, an
    /// evicted one hands it over), and a new key takes the first empty slot of its window, so
    /// a key is never behind an empty slot of its window: the scan stops at the first one.
    pub fn find(&self, hash: u64) -> Option<SlotIndex> {
        for index in self.probe_window(hash) {
            match self.hash_word(index).load(Ordering::Acquire) {
                h if h == hash => return Some(SlotIndex(index)),
                0 => return None,
                _ => {}
            }
        }
        None
    }

    /// The slot holding `hash` if its state differs from a fresh key's at `now_ns`.
    pub fn find_tracked(&self, hash: u64, now_ns: u64) -> Option<SlotIndex> {
        let index = self.find(hash)?;
        let limits = self.limits()?;
        let _lock = (self.algorithm == Algorithm::SlidingLog).then(|| self.lock());
        (self.idle_at_ns(self.slot(index.0), &limits, now_ns) > now_ns).then_some(index)
    }

    pub fn lock(&self) -> ZoneLock<'_> {
        // SAFETY: the slab pool's mutex is initialized by nginx with the pool; the master
        // force-unlocks it if a worker dies holding it.
        unsafe { ngx_shmtx_lock(ptr::addr_of_mut!((*self.shpool).mutex)) };
        ZoneLock { pool: self }
    }

    /// The slot for `hash`, claiming one for a new key. Returns the index and whether another
    /// key was evicted for it.
    ///
    /// The common cases take no lock: a tracked key is found, and a new key takes the first
    /// empty slot of its window with a compare-and-swap of the hash word (an empty slot's
    /// state is already a fresh key's). Only a full window takes the zone lock to evict.
    #[inline]
    pub fn find_or_claim(&self, hash: u64, now_ns: u64) -> (SlotIndex, bool) {
        // A key seen before is most often in the first slot of its window.
        let first = self.window_start(hash);
        if self.hash_word(first).load(Ordering::Acquire) == hash {
            return (SlotIndex(first), false);
        }
        self.find_or_claim_slow(hash, now_ns)
    }

    #[inline(never)]
    fn find_or_claim_slow(&self, hash: u64, now_ns: u64) -> (SlotIndex, bool) {
        let mut empty = None;
        for index in self.probe_window(hash) {
            match self.hash_word(index).load(Ordering::Acquire) {
                h if h == hash => return (SlotIndex(index), false),
                0 => {
                    // No key of this window lies beyond its first empty slot (see `find`).
                    empty = Some(index);
                    break;
                }
                _ => {}
            }
        }
        if let Some(index) = empty.filter(|&index| self.claim_empty(index, hash)) {
            return (SlotIndex(index), false);
        }
        let _lock = self.lock();
        self.claim_locked(hash, now_ns)
    }

    /// Take an empty slot for `hash`; false if another worker took it first.
    #[inline]
    fn claim_empty(&self, index: usize, hash: u64) -> bool {
        self.hash_word(index)
            .compare_exchange(0, hash, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// As `find_or_claim`, with the zone lock held: rescans (another worker may have claimed
    /// the key meanwhile), takes an empty slot, else evicts the slot nearest to its fresh
    /// state (an idle one first: evicting it changes no decision).
    pub fn claim_locked(&self, hash: u64, now_ns: u64) -> (SlotIndex, bool) {
        let limits = self.limits();
        loop {
            let mut empty = None;
            let mut victim = self.window_start(hash);
            let mut victim_idle_at = u64::MAX;
            for index in self.probe_window(hash) {
                match self.hash_word(index).load(Ordering::Acquire) {
                    h if h == hash => return (SlotIndex(index), false),
                    0 => {
                        empty = empty.or(Some(index));
                    }
                    _ => {
                        let idle_at = limits.map_or(0, |limits| {
                            self.idle_at_ns(self.slot(index), &limits, now_ns)
                        });
                        if idle_at < victim_idle_at {
                            victim = index;
                            victim_idle_at = idle_at;
                        }
                    }
                }
            }
            // Lock-free claimers only ever take empty slots, so an empty slot is still raced
            // for with compare-and-swap; an occupied one changes only under this lock.
            if let Some(index) = empty {
                if self.claim_empty(index, hash) {
                    return (SlotIndex(index), false);
                }
                continue;
            }
            let slot = self.slot(victim);
            for word in &slot[1..] {
                word.store(0, Ordering::Relaxed);
            }
            slot[0].store(hash, Ordering::Release);
            let evicted = victim_idle_at > now_ns;
            if evicted {
                self.header().evictions.fetch_add(1, Ordering::Relaxed);
            }
            return (SlotIndex(victim), evicted);
        }
    }

    /// When a slot's state becomes equivalent to a fresh key's (0 for an empty slot).
    fn idle_at_ns(&self, slot: &[AtomicU64], limits: &Limits, now_ns: u64) -> u64 {
        match self.algorithm() {
            // Sliding log states are only touched under the zone lock, which callers hold.
            Algorithm::SlidingLog => sliding_log::idle_at_ns(log_words_mut(&slot[1..]), limits),
            algorithm => ratelimit_core::word_idle_at_ns_near(
                slot[1].load(Ordering::Relaxed),
                limits,
                algorithm,
                now_ns,
            ),
        }
    }

    /// Decide a request for the key in `index`. With `commit`, a passing decision is stored
    /// (compare-and-swap for single-word states, under the lock for the log); without it
    /// nothing changes. A rejected request never changes the state.
    pub fn decide(&self, index: SlotIndex, now_ns: u64, policy: &Policy, commit: bool) -> Decision {
        let slot = self.slot(index.0);
        if policy.algorithm == Algorithm::SlidingLog {
            let _lock = self.lock();
            let log = log_words_mut(&slot[1..]);
            if !commit {
                return sliding_log::inspect(log, now_ns, policy);
            }
            return sliding_log::decide(log, now_ns, policy);
        }

        if self.sync && commit {
            return crate::sync::shared::decide(self, index, now_ns, policy, || {
                self.decide_word(index, now_ns, policy, true)
            });
        }
        self.decide_word(index, now_ns, policy, commit)
    }

    /// [`Zone::decide`] for a single-word state, without the fleet's grant.
    fn decide_word(
        &self,
        index: SlotIndex,
        now_ns: u64,
        policy: &Policy,
        commit: bool,
    ) -> Decision {
        let state = self.state_word(index);
        // One loop per algorithm, so each compiles to that algorithm's arithmetic alone.
        match policy.algorithm {
            Algorithm::LeakyBucket => {
                compare_and_swap(state, commit, |s| leaky_bucket::decide(s, now_ns, policy))
            }
            Algorithm::TokenBucket => {
                compare_and_swap(state, commit, |s| token_bucket::decide(s, now_ns, policy))
            }
            _ => compare_and_swap(state, commit, |s| {
                ratelimit_core::decide_word(s, now_ns, policy)
            }),
        }
    }

    /// Give back `policy.cost` requests charged to the key in `index` (lua-resty-limit-traffic's
    /// `uncommit`): compare-and-swap for single-word states, under the lock for the log.
    pub fn uncommit(&self, index: SlotIndex, now_ns: u64, policy: &Policy) {
        let slot = self.slot(index.0);
        if policy.algorithm == Algorithm::SlidingLog {
            let _lock = self.lock();
            ratelimit_core::uncommit::uncommit_log(log_words_mut(&slot[1..]), policy);
            return;
        }
        if self.sync {
            crate::sync::shared::uncommit(self, index, policy);
        }
        let state = &slot[1];
        let mut current = state.load(Ordering::Acquire);
        loop {
            let next = ratelimit_core::uncommit::uncommit_word(current, now_ns, policy);
            if next == current {
                return;
            }
            match state.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return,
                Err(actual) => current = actual,
            }
        }
    }

    /// Charge a request to a single-word state (not `SlidingLog`) and return only its
    /// outcome, with the state it was decided on. The decision's other fields (divisions)
    /// are not computed: a caller that needs them gets the identical decision from
    /// `ratelimit_core::decide_word(previous, now_ns, policy)`.
    #[inline]
    pub fn charge(&self, index: SlotIndex, now_ns: u64, policy: &Policy) -> (Outcome, u64) {
        let state = self.state_word(index);
        match policy.algorithm {
            Algorithm::LeakyBucket => charge_word(state, |s| {
                outcome_of(leaky_bucket::decide(s, now_ns, policy))
            }),
            Algorithm::TokenBucket => charge_word(state, |s| {
                outcome_of(token_bucket::decide(s, now_ns, policy))
            }),
            _ => charge_word(state, |s| {
                outcome_of(ratelimit_core::decide_word(s, now_ns, policy))
            }),
        }
    }

    /// The packed zone limits word (see [`Limits::pack`]), to notice a change.
    #[inline]
    pub fn limits_word(&self) -> u64 {
        self.header().limits.load(Ordering::Acquire)
    }

    /// Charge a request to a bucket with precomputed constants; `fallback` decides the rare
    /// state the constants cannot (an overflow). Returns the outcome and the state it was
    /// decided on, as [`Zone::charge`].
    #[inline]
    pub fn charge_bucket(
        &self,
        index: SlotIndex,
        now_ns: u64,
        charge: &BucketCharge,
        fallback: impl Fn(u64) -> (Decision, Option<u64>),
    ) -> (Outcome, u64) {
        charge_word(self.state_word(index), |state| {
            charge
                .charge(state, now_ns)
                .unwrap_or_else(|| outcome_of(fallback(state)))
        })
    }

    /// Where the key in `index` stands now, charging nothing: `remaining` and `reset_ns` of its
    /// unchanged state.
    pub fn standing(&self, index: SlotIndex, now_ns: u64, policy: &Policy) -> Decision {
        self.decide(
            index,
            now_ns,
            &ratelimit_core::standing_policy(policy),
            false,
        )
    }

    /// Forget a key's state. Returns whether it was tracked (not already fresh).
    ///
    /// The key keeps its slot with a fresh key's state (all zeros), which decides exactly like
    /// no state at all and keeps the table free of holes (see `find`); the slot goes first
    /// when its window needs room.
    pub fn forget(&self, hash: u64, now_ns: u64) -> bool {
        let _lock = self.lock();
        let Some(index) = self.find(hash) else {
            return false;
        };
        let slot = self.slot(index.0);
        let tracked = self
            .limits()
            .is_some_and(|limits| self.idle_at_ns(slot, &limits, now_ns) > now_ns);
        for word in &slot[1..] {
            word.store(0, Ordering::Relaxed);
        }
        tracked
    }

    /// Keys whose state differs from a fresh key's at `now_ns` (a full scan: admin use only).
    pub fn tracked_keys(&self, now_ns: u64) -> u64 {
        let Some(limits) = self.limits() else {
            return 0;
        };
        // Only sliding-log states need the lock to be read; the others are single atomics.
        let _lock = (self.algorithm == Algorithm::SlidingLog).then(|| self.lock());
        (0..self.slot_count())
            .map(|index| self.slot(index))
            .filter(|slot| slot[0].load(Ordering::Relaxed) != 0)
            .filter(|slot| self.idle_at_ns(slot, &limits, now_ns) > now_ns)
            .count() as u64
    }

    /// Count one decision, in this worker's stripe.
    #[inline]
    pub fn count(&self, counter: Counter) {
        let stripe = COUNTER_STRIPE.load(Ordering::Relaxed);
        self.header().counters[stripe].counts[counter as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A counter summed over every worker's stripe.
    pub fn counter(&self, counter: Counter) -> u64 {
        self.header()
            .counters
            .iter()
            .map(|stripe| stripe.counts[counter as usize].load(Ordering::Relaxed))
            .sum()
    }

    /// True at most once a second (per zone, across workers): when to log that it is full.
    pub fn should_log_full(&self, now_ns: u64) -> bool {
        let second = now_ns / 1_000_000_000;
        let last = self.header().full_logged_sec.load(Ordering::Relaxed);
        last != second
            && self
                .header()
                .full_logged_sec
                .compare_exchange(last, second, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    // --- per-key overrides ---------------------------------------------------------------

    fn override_probe(&self, hash: u64) -> impl Iterator<Item = &OverrideSlot> {
        let start = (hash as usize) % OVERRIDE_CAPACITY;
        let overrides = &self.header().overrides;
        (0..OVERRIDE_CAPACITY).map(move |i| &overrides[(start + i) % OVERRIDE_CAPACITY])
    }

    /// The override for a key hash, if any. Lock-free; costs nothing when there are none.
    pub fn override_for(&self, hash: u64) -> Option<Limits> {
        if self.header().override_count.load(Ordering::Relaxed) == 0 {
            return None;
        }
        for slot in self.override_probe(hash) {
            match slot.hash.load(Ordering::Acquire) {
                0 => return None,
                h if h == hash => return Limits::unpack(slot.limits.load(Ordering::Acquire)),
                _ => {}
            }
        }
        None
    }

    /// Set a key's override. Returns Ok(true) when it is new, Ok(false) when replaced, Err when
    /// the override table or the zone's memory is full.
    pub fn set_override(&self, key: &[u8], limits: Limits) -> Result<bool, ()> {
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
        let slot = free.ok_or(())?;
        let key_offset = self.store_key_locked(key).ok_or(())?;
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
        if chunk < start || chunk.checked_add(8)? > end {
            return None;
        }
        // SAFETY: `chunk..chunk + 8` lies inside the mapping (checked above). The bytes may be
        // rewritten by a worker at any time: they are read volatile, and the caller only
        // trusts them when they hash to the slot's hash.
        let len = unsafe { ptr::read_volatile(chunk as *const [u8; 8]) };
        let len = u64::from_ne_bytes(len) as usize;
        if len > crate::handler::MAX_KEY_BYTES || len > end - chunk - 8 {
            return None;
        }
        let bytes = (chunk + 8) as *const u8;
        // SAFETY: `bytes..bytes + len` lies inside the mapping (checked above).
        Some(
            (0..len)
                .map(|i| unsafe { ptr::read_volatile(bytes.add(i)) })
                .collect(),
        )
    }

    fn store_key_locked(&self, key: &[u8]) -> Option<u64> {
        // SAFETY: the zone lock is held (callers are `_locked`); the chunk is ours until freed.
        let chunk = unsafe { ngx_slab_alloc_locked(self.shpool, 8 + key.len()) }.cast::<u8>();
        if chunk.is_null() {
            return None;
        }
        // SAFETY: `chunk` has room for the length word and the key bytes.
        unsafe {
            chunk.cast::<u64>().write_unaligned(key.len() as u64);
            ptr::copy_nonoverlapping(key.as_ptr(), chunk.add(8), key.len());
        }
        Some(chunk as u64 - self.shared as u64)
    }

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

/// The slab mutex held during `init`, before a `Zone` view exists.
struct PoolLock(*mut ngx_slab_pool_t);

impl PoolLock {
    /// # Safety
    /// `shpool` is an initialized slab pool.
    unsafe fn take(shpool: *mut ngx_slab_pool_t) -> PoolLock {
        ngx_shmtx_lock(ptr::addr_of_mut!((*shpool).mutex));
        PoolLock(shpool)
    }
}

impl Drop for PoolLock {
    fn drop(&mut self) {
        // SAFETY: locked by `ZoneLock::take` on this pool.
        unsafe { ngx_shmtx_unlock(ptr::addr_of_mut!((*self.0).mutex)) };
    }
}

/// Decide on a single-word state and, with `commit`, store the new state by compare-and-swap,
/// deciding again on the value another worker stored meanwhile. Never locks: a worker killed
/// here leaves either the old state or the new one.
#[inline(always)]
fn compare_and_swap(
    state: &AtomicU64,
    commit: bool,
    decide: impl Fn(u64) -> (Decision, Option<u64>),
) -> Decision {
    let mut current = state.load(Ordering::Acquire);
    loop {
        let (decision, next) = decide(current);
        let Some(next) = next.filter(|_| commit) else {
            return decision;
        };
        match state.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return decision,
            Err(actual) => current = actual,
        }
    }
}

/// As [`compare_and_swap`] with `commit`, for a `decide` that gives only the outcome and the
/// new state; returns the outcome and the state it was decided on. Inlined, so that fields of
/// a full decision nobody reads are never computed.
#[inline(always)]
fn charge_word(
    state: &AtomicU64,
    decide: impl Fn(u64) -> (Outcome, Option<u64>),
) -> (Outcome, u64) {
    let mut current = state.load(Ordering::Acquire);
    loop {
        let (outcome, next) = decide(current);
        let Some(next) = next else {
            return (outcome, current);
        };
        match state.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return (outcome, current),
            Err(actual) => current = actual,
        }
    }
}

/// A decision reduced to what [`charge_word`] needs.
#[inline(always)]
fn outcome_of((decision, next): (Decision, Option<u64>)) -> (Outcome, Option<u64>) {
    (decision.outcome, next)
}

/// A sliding log's words as plain integers.
///
/// Callers hold the zone lock: sliding-log state words are read and written only under it, so
/// no other access to these words overlaps the returned borrow.
#[allow(clippy::mut_from_ref)]
fn log_words_mut(words: &[AtomicU64]) -> &mut [u64] {
    let Some(first) = words.first() else {
        return &mut [];
    };
    // SAFETY: AtomicU64 has the size and alignment of u64; exclusivity comes from the zone lock
    // (see above), and the words stay inside the zone's mapping.
    unsafe { core::slice::from_raw_parts_mut(AtomicU64::as_ptr(first), words.len()) }
}

/// 128 random bits for the zone's hash key, so clients cannot pick colliding keys.
fn random_seed() -> [u64; 2] {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    if read.is_err() {
        // Fall back to the clock and the pid: weaker, but the zone still works.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        bytes[..8].copy_from_slice(&nanos.to_le_bytes());
        bytes[8..].copy_from_slice(&u64::from(std::process::id()).to_le_bytes());
    }
    let (low, high) = bytes.split_at(8);
    [
        u64::from_le_bytes(low.try_into().unwrap_or_default()),
        u64::from_le_bytes(high.try_into().unwrap_or_default()),
    ]
}

// --- admin API (src/admin/) ------------------------------------------------------------

impl Zone {
    /// Nanoseconds from `now_ns` until the key in `index` is back to a fresh key's state under
    /// `limits` (0 when it already is): `GET zones/NAME/keys/KEY` shows it as `reset_ms`.
    pub fn time_to_fresh_ns(&self, index: SlotIndex, limits: &Limits, now_ns: u64) -> u64 {
        let slot = self.slot(index.0);
        let idle_at = if self.algorithm() == Algorithm::SlidingLog {
            // Sliding log words are read under the zone lock only.
            let _lock = self.lock();
            self.idle_at_ns(slot, limits, now_ns)
        } else {
            self.idle_at_ns(slot, limits, now_ns)
        };
        idle_at.saturating_sub(now_ns)
    }
}
