//! The store: a zone's shared memory (slot table, override table, counters, top-keys region)
//! and the instance's sync record. Imports only glue, `ratelimit-core` and `ratelimit-slots`
//! (the slot table's protocol); it keeps data and makes no decision of the request path's or
//! the sync loop's.
//!
//! Layout of the block a zone allocates from its slab pool (one allocation, page aligned):
//!
//! ```text
//! ZoneShared header | padding to 64 bytes | slot table | block table (zones with block=)
//! slot table = buckets of SLOTS_PER_BUCKET slots; slot = [id | pins: u64, state: u64 × slot_words]
//! block table = records of ratelimit_core::block_table (96 bytes a blocked key)
//! ```
//!
//! A key is identified by 51 bits (the top 52, the lowest set) of a 64-bit foldhash
//! (`foldhash::quality`) of its bytes under a random per-zone seed (the low 12 bits of the id
//! word count pins); the key bytes themselves are not stored, so every key costs the same
//! whatever its length (16 bytes for the single-word algorithms). A key lives in one of the
//! `PROBE_BUCKETS × SLOTS_PER_BUCKET` slots starting at its home bucket.
//!
//! Concurrency: every worker maps the same memory. The single-word algorithms update a slot's
//! state by compare-and-swap and never lock. The zone's slab mutex (which the master releases
//! when a worker dies holding it) is taken only to claim a slot for a new key when its window
//! is full, to evict, for the algorithms that keep several words per key, and for admin
//! writes. A key's requests never land on another key's state: every access to a slot's
//! words pins it (`ratelimit_slots`: the key's id and a count of pins share one word, and an
//! eviction exchanges "victim, no pins" for a tombstone before it resets anything), so a key
//! keeps its slot while a request uses it, and a key with requests in flight or queued is
//! never evicted. See docs/architecture.md, "The slot table's ownership rule".
//!
//! * [`slots`]: the slot table (find, claim, evict, decide, charge, forget);
//! * [`overrides`]: the per-key override table;
//! * [`counters`]: the decision counters and evictions;
//! * [`sizing`]: how large a zone must be;
//! * [`top`]: the top-keys region;
//! * [`blocks`]: the table of blocked keys (`block=`);
//! * [`history`]: the zone's requests per second over the last minutes;
//! * [`sync_record`] and [`inbox`]: the instance's sync record, shared by the sync loop and
//!   the workers.

pub mod blocks;
pub mod concurrency;
pub mod counters;
pub mod history;
pub mod inbox;
pub mod overrides;
mod quota;
pub mod sizing;
pub mod slots;
pub mod sync_record;
pub mod top;

use core::ffi::c_void;
use core::mem;
use core::ptr;
use core::sync::atomic::{AtomicU64, Ordering};
use std::hash::BuildHasher;

use nginx_sys::{ngx_slab_alloc_locked, ngx_slab_free_locked, ngx_slab_pool_t};
use ratelimit_core::concurrency::{self as in_flight, ConcurrencyLimit, ConcurrencyLimits};
use ratelimit_core::{Algorithm, Limits};

use crate::glue::pool::PoolLock;
pub use counters::Counter;
use counters::{CounterStripe, COUNTER_STRIPES};
use overrides::OverrideSlot;
pub use overrides::{OverrideError, OVERRIDE_CAPACITY};
pub use slots::SlotIndex;

/// Identifies the layout below; a zone inherited over a reload with another magic is reformatted.
const MAGIC: u64 = 0x726c_7a6f_6e65_000b;

/// The longest key a zone accepts, in bytes (limit_req's limit).
pub const MAX_KEY_BYTES: usize = 65535;

/// The header at the start of a zone's block. Every field is either written once while the
/// zone is created (before workers exist) or is an atomic.
#[repr(C)]
pub struct ZoneShared {
    magic: u64,
    seed: [u64; 2],
    /// Hash of the zone's KEY text and algorithm: a reload that changes either starts afresh.
    fingerprint: AtomicU64,
    algorithm: AtomicU64,
    slot_words: AtomicU64,
    bucket_count: AtomicU64,
    /// Bytes available for the table after the header.
    table_bytes: u64,
    /// The limits requests use now (packed [`Limits`]); the admin API swaps it atomically.
    limits: AtomicU64,
    /// The limits the configuration file said at the last (re)load, to notice when it changes.
    config_limits: AtomicU64,
    counters: [CounterStripe; COUNTER_STRIPES],
    evictions: AtomicU64,
    /// Seconds (monotonic) of the last "zone is full" log line, to log it once a second.
    full_logged_sec: AtomicU64,
    /// Seconds (monotonic) of the last log line about a malformed usage.
    bad_usage_logged_sec: AtomicU64,
    /// New keys refused a slot because every slot of their window was busy (requests in
    /// flight or queued), and the second of the last log line saying so.
    no_slot: AtomicU64,
    no_slot_logged_sec: AtomicU64,
    override_count: AtomicU64,
    overrides: [OverrideSlot; OVERRIDE_CAPACITY],
    /// 1 for a `sync` zone: each slot has two more words (see [`slots::SyncWords`]).
    sync: AtomicU64,
    /// Offset from the slab pool of the top-keys region ([`top`]); 0 when the zone is too
    /// small to keep one.
    top_offset: AtomicU64,
    /// A concurrency zone's limits in force now (packed `ConcurrencyLimits`; 0 for another
    /// zone), and those of the configuration file at the last (re)load.
    concurrency: AtomicU64,
    config_concurrency: AtomicU64,
    /// A `sync` concurrency zone: the permits a key without a live lease may hold, written
    /// by the sync loop each round (0 while Redis answers, the failure mode's otherwise).
    lease_fallback: AtomicU64,
    /// Records of the block table ([`blocks`]), which starts `block_offset` bytes after the
    /// slot table's start; 0 for a zone without `block=`.
    block_records: AtomicU64,
    block_offset: AtomicU64,
    /// Requests per second over the last minutes ([`history`]).
    history: history::HistoryRing,
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
    /// For a concurrency zone, its configured limits (`limits` is then unused).
    pub concurrency: Option<ConcurrencyLimits>,
    /// `block=`: the zone keeps a table of blocked keys after its slots.
    pub block: bool,
}

impl ZoneLayout {
    /// State words per slot: the algorithm's own, or those of a `sync` zone's slot (state,
    /// pending delta, grant).
    pub fn slot_words(&self) -> usize {
        if let Some(limits) = &self.concurrency {
            let adaptive = matches!(limits.limit, ConcurrencyLimit::Adaptive(_));
            return in_flight::state_words(adaptive, self.sync_seed.is_some());
        }
        if self.sync_seed.is_some() {
            return slots::SYNC_STATE_WORDS;
        }
        self.algorithm.state_words(&self.limits.rate)
    }
}

/// Why a zone could not be set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ZoneInitError {
    #[error("is too small")]
    TooSmall,
    #[error("could not be allocated")]
    NoMemory,
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
    /// The slot table over those words, as `ratelimit_slots` sees it (built once: the request
    /// path computes nothing to find it). `'static` stands for the cycle's lifetime.
    slot_table: ratelimit_slots::Table<'static, AtomicU64>,
    /// `u64` words per slot: the hash, then the state.
    stride: usize,
    slots: usize,
    algorithm: Algorithm,
    seed: [u64; 2],
    sync: bool,
    /// The block table's words (null and 0 without `block=`).
    blocks: *const AtomicU64,
    block_words: usize,
}

impl Zone {
    /// Set up the zone in a fresh slab pool, or adopt the block a previous cycle left in it.
    /// Returns the view and whether the keys' states were kept.
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
        // SAFETY: the caller passes an initialized pool; `data` is null or what an earlier
        // `init` stored there.
        let existing = unsafe { (*shpool).data }.cast::<ZoneShared>();
        // SAFETY: a non-null `data` points at a block at least as large as the header.
        if !existing.is_null() && unsafe { (*existing).magic } == MAGIC {
            // SAFETY: a header with our magic was written by an earlier `init`.
            let zone = unsafe { Zone::view(shpool, existing) };
            let kept = zone.adopt(layout, now_ns)?;
            // SAFETY: as above; `adopt` may have reformatted the table.
            return Ok((unsafe { Zone::view(shpool, existing) }, kept));
        }

        // SAFETY: ngx_pagesize is set at startup, before any configuration is read.
        let pagesize = unsafe { nginx_sys::ngx_pagesize };
        // SAFETY: the pool is initialized and outlives this call.
        let _lock = unsafe { PoolLock::take(shpool) };
        // The top-keys region first, so that the table takes what is left; a zone that is
        // then too small for its table drops the region rather than fail (the minimum size
        // `nginx -t` states does not count it).
        // SAFETY: the pool is initialized and its mutex is held (`_lock`).
        let mut top_offset = unsafe { top::allocate_locked(shpool) };
        loop {
            // SAFETY: the pool is initialized; `pfree` changes only under the held mutex.
            let block_bytes = sizing::block_pages(unsafe { (*shpool).pfree }) * pagesize;
            // SAFETY: as this function's; the mutex is held.
            match unsafe { Self::create_locked(shpool, layout, block_bytes, top_offset) } {
                Err(ZoneInitError::TooSmall) if top_offset != 0 => {
                    // SAFETY: the region was allocated from this pool above, under the mutex.
                    unsafe {
                        ngx_slab_free_locked(
                            shpool,
                            shpool.cast::<u8>().add(top_offset as usize).cast(),
                        )
                    };
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
        // SAFETY: the caller holds the pool's mutex, as the `_locked` allocator requires.
        let block = unsafe { ngx_slab_alloc_locked(shpool, block_bytes) }.cast::<u8>();
        if block.is_null() {
            return Err(ZoneInitError::NoMemory);
        }
        let shared = block.cast::<ZoneShared>();
        // SAFETY: the block is ours (just allocated), at least TABLE_OFFSET bytes long, and
        // suitably aligned (slab pages); all-zero bytes are a valid header.
        let zone = unsafe {
            ptr::write_bytes(block, 0, TABLE_OFFSET);
            (*shared).magic = MAGIC;
            (*shared).seed = random_seed();
            (*shared).table_bytes = (block_bytes - TABLE_OFFSET) as u64;
            (*shared).top_offset = AtomicU64::new(top_offset);
            Zone::view(shpool, shared)
        };
        // A new block of a new mapping is zero already (the kernel's pages): the master does
        // not write it again, which would make the whole zone resident in the master on every
        // start and every reload that resizes a zone.
        if !zone.format(layout, true) {
            // SAFETY: allocated above from this pool, under the held mutex.
            unsafe { ngx_slab_free_locked(shpool, block.cast()) };
            return Err(ZoneInitError::TooSmall);
        }
        let header = zone.header();
        header.limits.store(layout.limits.pack(), Ordering::Relaxed);
        header
            .config_limits
            .store(layout.limits.pack(), Ordering::Relaxed);
        let concurrency = layout.concurrency.map_or(0, |limits| limits.pack());
        header.concurrency.store(concurrency, Ordering::Relaxed);
        header
            .config_concurrency
            .store(concurrency, Ordering::Relaxed);
        // SAFETY: the pool is initialized; no worker reads `data` yet.
        unsafe { (*shpool).data = shared.cast::<c_void>() };
        // SAFETY: the header was just written; a new view reads the table's formatted shape.
        Ok((unsafe { Zone::view(shpool, shared) }, false))
    }

    /// Build the process-local view from the header.
    ///
    /// # Safety
    /// `shared` is a zone header inside `shpool`'s mapping, written by `init`.
    unsafe fn view(shpool: *mut ngx_slab_pool_t, shared: *mut ZoneShared) -> Zone {
        // SAFETY: the caller's contract.
        let header = unsafe { &*shared };
        let buckets = header.bucket_count.load(Ordering::Relaxed);
        let stride = 1 + header.slot_words.load(Ordering::Relaxed) as usize;
        // SAFETY: the block is at least TABLE_OFFSET bytes long (checked in `init`).
        let table = unsafe { shared.cast::<u8>().add(TABLE_OFFSET) }.cast::<AtomicU64>();
        let block_records = header.block_records.load(Ordering::Relaxed) as usize;
        let blocks = if block_records == 0 {
            ptr::null()
        } else {
            // SAFETY: `format` placed the block table inside the table's bytes, 8-aligned.
            unsafe {
                table
                    .cast::<u8>()
                    .add(header.block_offset.load(Ordering::Relaxed) as usize)
                    .cast::<AtomicU64>()
            }
        };
        let slot_count = buckets as usize * slots::SLOTS_PER_BUCKET;
        // SAFETY: `format` laid out `slot_count * stride` words from `table`, 8-aligned, inside
        // the zone's mapping, which outlives every view of this cycle; AtomicU64 accepts any
        // bit pattern.
        let words = unsafe { core::slice::from_raw_parts(table, slot_count * stride) };
        Zone {
            shpool,
            shared,
            table,
            slot_table: ratelimit_slots::Table::new(words, stride),
            blocks,
            block_words: ratelimit_core::block_table::BlockTable::words_for(block_records),
            stride,
            slots: buckets as usize * slots::SLOTS_PER_BUCKET,
            algorithm: Algorithm::from_code(header.algorithm.load(Ordering::Relaxed)),
            seed: header.seed,
            sync: header.sync.load(Ordering::Relaxed) != 0,
        }
    }

    /// Lay the slot table out for `layout` and clear it (`fresh`: memory just allocated from
    /// a new mapping, cleared only if it is not zero, as with a junk-filling debug
    /// allocator). False if not even one probe window fits.
    fn format(&self, layout: &ZoneLayout, fresh: bool) -> bool {
        let header = self.header();
        let slot_words = layout.slot_words();
        let table_bytes = header.table_bytes as usize;
        let Some((buckets, block_records)) =
            sizing::table_shape(table_bytes, slot_words, layout.block)
        else {
            return false;
        };
        let block_bytes = sizing::block_table_bytes(block_records);
        let block_offset = table_bytes - block_bytes;
        // SAFETY: the block table is the last `block_bytes` of the table (8-aligned: both are
        // multiples of 8), inside the zone's block; nobody reads it during (re)formatting.
        // SAFETY: as above; reading the table's first and last word only.
        let zero = fresh
            && unsafe {
                let first = self.table.cast::<u64>().read();
                let last = self
                    .table
                    .cast::<u8>()
                    .add(table_bytes - 8)
                    .cast::<u64>()
                    .read();
                first == 0 && last == 0
            };
        if !zero {
            // SAFETY: as above.
            unsafe { ptr::write_bytes(self.table.cast::<u8>().add(block_offset), 0, block_bytes) };
        }
        header
            .block_records
            .store(block_records as u64, Ordering::Relaxed);
        header
            .block_offset
            .store(block_offset as u64, Ordering::Relaxed);
        if !zero {
            // SAFETY: the table lies inside the block allocated for this zone (table_bytes was
            // computed from that allocation) and nobody reads it during (re)formatting: this
            // runs in the master before workers start.
            unsafe {
                ptr::write_bytes(
                    self.table.cast::<u8>(),
                    0,
                    buckets * sizing::bucket_bytes(slot_words),
                )
            };
        }
        header
            .slot_words
            .store(slot_words as u64, Ordering::Relaxed);
        header.bucket_count.store(buckets as u64, Ordering::Relaxed);
        header
            .algorithm
            .store(layout.algorithm.code(), Ordering::Relaxed);
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
        if !same_shape && !self.format(layout, false) {
            return Err(ZoneInitError::TooSmall);
        }
        let configured = layout.limits.pack();
        if !same_shape {
            header.limits.store(configured, Ordering::Relaxed);
        } else if header.config_limits.load(Ordering::Relaxed) != configured {
            self.set_limits(layout.limits, now_ns);
        }
        header.config_limits.store(configured, Ordering::Relaxed);
        // A concurrency zone's limits likewise: a runtime change survives a reload that
        // leaves the configuration's limits as they were.
        let configured = layout.concurrency.map_or(0, |limits| limits.pack());
        if !same_shape || header.config_concurrency.load(Ordering::Relaxed) != configured {
            header.concurrency.store(configured, Ordering::Release);
        }
        header
            .config_concurrency
            .store(configured, Ordering::Relaxed);
        Ok(same_shape)
    }

    /// Whether two views are of the same zone's memory.
    pub fn is_same(&self, other: &Zone) -> bool {
        ptr::eq(self.shared, other.shared)
    }

    fn header(&self) -> &ZoneShared {
        // SAFETY: `shared` points at the header written by `init`, inside the zone's mapping,
        // which outlives every request and admin call that holds a `Zone`.
        unsafe { &*self.shared }
    }

    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Whether this is a `sync` zone (its slots hold the fleet's words too).
    #[inline]
    pub fn is_sync(&self) -> bool {
        self.sync
    }

    /// The zone-wide limits in force now.
    pub fn limits(&self) -> Option<Limits> {
        Limits::unpack(self.header().limits.load(Ordering::Acquire))
    }

    /// The packed zone limits word (see [`Limits::pack`]), to notice a change.
    #[inline]
    pub fn limits_word(&self) -> u64 {
        self.header().limits.load(Ordering::Acquire)
    }

    /// The limits the configuration file gave at the last (re)load (packed).
    pub fn config_limits_word(&self) -> u64 {
        self.header().config_limits.load(Ordering::Acquire)
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

    /// Set the limits of a zone whose memory is fresh, in the master before workers exist
    /// (no key has a state to rescale, nobody else reads the word yet).
    pub fn restore_limits(&self, limits: Limits) {
        self.header().limits.store(limits.pack(), Ordering::Relaxed);
    }

    /// Replace the zone's limits if they still are `current` (one compare-and-swap of the
    /// word holding rate and burst: requests read either the old pair or the new one, and two
    /// writers cannot lose one another's field); keys' backlogs are rescaled. On failure,
    /// the packed limits found instead.
    pub fn replace_limits(&self, current: Limits, new: Limits, now_ns: u64) -> Result<(), u64> {
        self.header()
            .limits
            .compare_exchange(
                current.pack(),
                new.pack(),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .map(|_| self.rescale_backlogs(&current, &new, now_ns))
    }

    /// A key's id: its hash with the zone's secret seed, reduced to the 52 bits a slot's id
    /// word keeps beside its pin count (`ratelimit_slots::key_id`); never 0 (an empty slot).
    /// foldhash's quality variant: a few multiplications for a short key, and without the
    /// seed a client cannot choose keys that collide.
    #[inline(always)]
    pub fn hash_key(&self, key: &[u8]) -> u64 {
        ratelimit_slots::key_id(
            foldhash::quality::FixedState::with_seed(self.seed[0]).hash_one(key),
        )
    }

    /// Take the zone's slab mutex (released when the guard drops).
    pub fn lock(&self) -> PoolLock {
        // SAFETY: the slab pool is initialized by nginx with the zone and lives as long as
        // this view.
        unsafe { PoolLock::take(self.shpool) }
    }
}

/// 128 random bits for the zone's hash key, so clients cannot pick colliding keys.
fn random_seed() -> [u64; 2] {
    let bytes = crate::glue::random_bytes::<16>().unwrap_or_else(|| {
        // Fall back to the clock and the pid: weaker, but the zone still works.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&nanos.to_le_bytes());
        bytes[8..].copy_from_slice(&u64::from(std::process::id()).to_le_bytes());
        bytes
    });
    let (low, high) = bytes.split_at(8);
    [
        u64::from_le_bytes(low.try_into().unwrap_or_default()),
        u64::from_le_bytes(high.try_into().unwrap_or_default()),
    ]
}
