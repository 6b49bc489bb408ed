//! The instance's sync record: what the sync loop and the workers share, as data (the small
//! shared memory zone `rate_limit_sync` adds). The per-key words of a sync zone are in its
//! slots ([`super::slots::SyncWords`]); what they mean is `ratelimit_core::fleet`'s.
//!
//! Everything here is an atomic in shared memory: the loop thread and the workers of every
//! generation (old and new workers overlap across a reload) exchange data only through it.

use core::ffi::c_void;
use core::ptr;
use core::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::hash::BuildHasher;

use ngx::core::Status;
use ngx::ffi::{ngx_int_t, ngx_shm_zone_t, ngx_slab_pool_t};

use super::inbox::Inbox;

/// The sync state of the instance, read by the request path (`mode`, `round`, `instances`,
/// `interval_ns`), written by the loop thread (the owner), and by workers for the election.
#[repr(C)]
pub struct SyncShared {
    /// Set once when the memory is first laid out; a reload keeps it.
    pub magic: u64,
    /// This instance's id in the fleet's heartbeats: random, kept across reloads.
    pub instance_id: u64,
    /// The pid of the worker whose thread runs the loop; 0 when none.
    pub owner_pid: AtomicU64,
    /// Monotonic milliseconds of the owner's last loop turn.
    pub heartbeat_ms: AtomicU64,
    /// The sync rounds done (the loop turns, successful or not).
    pub round: AtomicU64,
    /// Sends of keys' deltas to Redis: each round's number for them, unique in the instance
    /// even when two loops overlap (see `KEY_SCRIPT` of the sync loop).
    pub sends: AtomicU64,
    /// A [`Mode`].
    pub mode: AtomicU64,
    /// The mode a worker last logged (so each transition is logged once).
    pub logged_mode: AtomicU64,
    /// Instances seen alive in the fleet's heartbeats at the last successful sync (N̂).
    pub instances: AtomicU64,
    /// `interval=` in nanoseconds (from the configuration of the current cycle).
    pub interval_ns: AtomicU64,
    /// Rounds missed in a row.
    pub missed: AtomicU64,
    /// Monotonic milliseconds of the last successful sync (0: never).
    pub last_ok_ms: AtomicU64,
    /// Round trip of the last successful sync, microseconds.
    pub lag_us: AtomicU64,
    /// Successful round trips and failed ones since start.
    pub round_trips: AtomicU64,
    pub errors: AtomicU64,
    /// Keys pushed in total.
    pub keys_pushed: AtomicU64,
    /// The code of the sync loop's error of the last failure (0 none), for the workers to log.
    pub last_error: AtomicU64,
    pub logged_error: AtomicU64,
    /// Set by a worker after a change (a zone's limits, an override): the loop sends the
    /// zones' limits and overrides at once instead of at its next round.
    pub kick: AtomicU64,
    /// The fleet's override changes, from the loop to a worker.
    pub inbox: Inbox,
    /// Per sync zone (its [`name_seed`], then a version): the fleet's version of the zone's
    /// overrides that this instance's overrides last matched, or 0. A loop that takes over
    /// (reload, worker crash) reads it to tell local changes from the fleet's.
    pub override_versions: [[AtomicU64; 2]; OVERRIDE_VERSIONS],
    /// Values from Redis dropped for being out of bounds, in total, and per kind of value
    /// the last one (for the workers to log each new one once; see [`Bad`]).
    pub bad_values: AtomicU64,
    pub bad_notes: [BadNote; BAD_KINDS],
    /// Pending deltas of keys evicted from their slots, on their way to the loop.
    pub orphans: OrphanRing,
    /// Orphaned deltas dropped: the ring was full, or the key was within its share.
    pub orphans_dropped: AtomicU64,
}

/// Sync zones whose override version a loop hands to the next (more fall back to taking the
/// fleet's overrides at a take-over).
pub const OVERRIDE_VERSIONS: usize = 32;

/// Name and size of the shared memory zone holding the record. The name cannot be written
/// in `zone=NAME:SIZE` (a colon ends the name there).
pub const SHM_NAME: &str = "rate_limit_sync:instance";
pub const SHM_SIZE: u64 = 512 * 1024;

// The record is one slab allocation in the 512 KiB zone, whose slab pool keeps a few pages
// for itself.
const _: () = assert!(core::mem::size_of::<SyncShared>() <= 448 * 1024);

/// Identifies [`SyncShared`]'s layout.
const SYNC_MAGIC: u64 = 0x726c_7379_6e63_0005;

/// The kinds of values from Redis that the loop checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum Bad {
    /// A key's fleet state further ahead than the key script allows.
    KeyAhead = 0,
    /// A key's request counts no fleet could have sent.
    KeyCounts = 1,
    /// A heartbeat count that is no number of instances.
    Instances = 2,
    /// A zone's limits its algorithm cannot take.
    Limits = 3,
    /// A per-key override the zone's algorithm cannot take.
    Override = 4,
    /// An override version out of range.
    Version = 5,
    /// A reply larger than the exchange allowed (the connection was dropped).
    ReplySize = 6,
    /// A block record of the fleet's hash that no instance could have written.
    BlockRecord = 7,
}

/// Kinds of [`Bad`] values.
pub const BAD_KINDS: usize = 8;

impl Bad {
    pub const ALL: [Bad; BAD_KINDS] = [
        Bad::KeyAhead,
        Bad::KeyCounts,
        Bad::Instances,
        Bad::Limits,
        Bad::Override,
        Bad::Version,
        Bad::ReplySize,
        Bad::BlockRecord,
    ];
}

/// The last bad value of one kind: how many were seen (`count`), which of them a worker
/// logged (`logged`), the zone (its [`name_seed`], 0 for none), the value and the bound it
/// broke.
#[repr(C)]
#[derive(Default)]
pub struct BadNote {
    pub count: AtomicU64,
    pub logged: AtomicU64,
    pub zone_id: AtomicU64,
    pub value: AtomicU64,
    pub bound: AtomicU64,
    /// The value last logged: a repeat of it is counted, not logged again.
    pub logged_value: AtomicU64,
}

/// Orphaned deltas the ring holds (a round drains it).
pub const ORPHANS: usize = 8192;

const ORPHAN_EMPTY: u64 = 0;
const ORPHAN_FULL: u64 = 1;
/// Held by the process in the high bits (writing, or reading).
const ORPHAN_HELD: u64 = 2;

/// Pending deltas of evicted keys: a worker that evicts a sync key hands its delta over
/// here (under its zone's lock, so several zones' workers write at once), the loop takes them
/// in its next round. Each entry is `[state, zone id, hash, delta]`; the state is empty, full
/// or held by a pid (a holder that died is taken over). A key already waiting gets the new
/// delta added; a ring with no room nearby drops it (counted).
#[repr(C)]
pub struct OrphanRing {
    entries: [[AtomicU64; 4]; ORPHANS],
}

impl OrphanRing {
    fn held() -> u64 {
        u64::from(std::process::id()) << 2 | ORPHAN_HELD
    }

    /// Hand over `delta` (an evicted key's pending requests; the refused flag is dropped).
    /// Returns false when there was no room.
    pub fn push(&self, zone_id: u64, hash: u64, delta: u64) -> bool {
        let delta = delta & !ratelimit_core::fleet::ASKED;
        if delta == 0 {
            return true;
        }
        let start = (hash as usize) % ORPHANS;
        for probe in 0..16 {
            let entry = &self.entries[(start + probe) % ORPHANS];
            let state = entry[0].load(Ordering::Acquire);
            let mergeable = state == ORPHAN_FULL
                && entry[1].load(Ordering::Relaxed) == zone_id
                && entry[2].load(Ordering::Relaxed) == hash;
            if state != ORPHAN_EMPTY && !mergeable {
                continue;
            }
            if entry[0]
                .compare_exchange(state, Self::held(), Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            if state == ORPHAN_FULL {
                entry[3].fetch_add(delta, Ordering::Relaxed);
            } else {
                entry[1].store(zone_id, Ordering::Relaxed);
                entry[2].store(hash, Ordering::Relaxed);
                entry[3].store(delta, Ordering::Relaxed);
            }
            entry[0].store(ORPHAN_FULL, Ordering::Release);
            return true;
        }
        false
    }

    /// Loop side: take every waiting delta, `take(zone_id, hash, delta)` each. An entry held
    /// by a process that died is emptied (a half-written entry is lost).
    pub fn drain(&self, mut take: impl FnMut(u64, u64, u64)) {
        for entry in &self.entries {
            let state = entry[0].load(Ordering::Acquire);
            if state == ORPHAN_EMPTY {
                continue;
            }
            if state != ORPHAN_FULL {
                if !crate::glue::process_alive(state >> 2) {
                    let _ = entry[0].compare_exchange(
                        state,
                        ORPHAN_EMPTY,
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    );
                }
                continue;
            }
            if entry[0]
                .compare_exchange(
                    ORPHAN_FULL,
                    Self::held(),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_err()
            {
                continue;
            }
            let (zone_id, hash, delta) = (
                entry[1].load(Ordering::Relaxed),
                entry[2].load(Ordering::Relaxed),
                entry[3].load(Ordering::Relaxed),
            );
            entry[0].store(ORPHAN_EMPTY, Ordering::Release);
            take(zone_id, hash, delta);
        }
    }
}

/// What the request path does with a sync zone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum Mode {
    /// Not connected yet (the first rounds): grants as in `Synced`, fresh ones from defaults.
    Starting = 0,
    /// Grants from the fleet's state.
    Synced = 1,
    /// One or two rounds missed: grants from the last known shares.
    Degraded = 2,
    /// `on_failure=local_share` in force.
    LocalShare = 3,
    /// `on_failure=open` in force: the whole limit locally.
    Open = 4,
    /// `on_failure=closed` in force: every request rejected.
    Closed = 5,
}

impl Mode {
    const ALL: [Mode; 6] = [
        Mode::Starting,
        Mode::Synced,
        Mode::Degraded,
        Mode::LocalShare,
        Mode::Open,
        Mode::Closed,
    ];

    /// The mode stored as `code` (`Starting` for anything else).
    pub fn from_code(code: u64) -> Mode {
        Mode::ALL
            .into_iter()
            .find(|&mode| mode as u64 == code)
            .unwrap_or(Mode::Starting)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Starting => "starting",
            Mode::Synced => "synced",
            Mode::Degraded => "degraded",
            Mode::LocalShare => "local_share",
            Mode::Open => "open",
            Mode::Closed => "closed",
        }
    }

    /// Whether the failure mode is in force.
    pub fn is_fallback(self) -> bool {
        matches!(self, Mode::LocalShare | Mode::Open | Mode::Closed)
    }
}

/// This process's view of the instance's [`SyncShared`], set when its shared memory is
/// initialized (in the master, before workers fork; the address is the same in all of them).
static SYNC: AtomicPtr<SyncShared> = AtomicPtr::new(ptr::null_mut());

/// The instance's sync record, when `rate_limit_sync` is configured.
pub fn shared() -> Option<&'static SyncShared> {
    // SAFETY: the pointer is null or points at the record inside the `rate_limit_sync` shared
    // memory, mapped for the life of this process.
    unsafe { SYNC.load(Ordering::Acquire).as_ref() }
}

/// The hash seed of a sync zone: derived from its name (not random), so that every instance
/// of the fleet gives a key the same id, and so the same Redis key.
pub fn name_seed(name: &str) -> u64 {
    foldhash::quality::FixedState::with_seed(0x7379_6e63).hash_one(("rate_limit_sync", name))
}

/// Init callback of the record's zone: lay the record out (or adopt it across a reload).
/// The zone's `data` is the configured interval in nanoseconds (a `u64` in the
/// configuration's pool).
pub extern "C" fn init_zone(shm_zone: *mut ngx_shm_zone_t, _data: *mut c_void) -> ngx_int_t {
    crate::glue::guard::entry(
        "store::sync_record::init_zone",
        || ngx_int_t::from(ngx::core::Status::NGX_ERROR),
        || {
            // SAFETY: nginx passes the zone being initialized.
            let shm_zone = unsafe { &mut *shm_zone };
            let shpool = shm_zone.shm.addr.cast::<ngx_slab_pool_t>();
            // SAFETY: the slab pool at the start of the mapping is initialized by nginx before this
            // callback, which runs in the master before workers exist.
            let existing = unsafe { (*shpool).data }.cast::<SyncShared>();
            // SAFETY: a non-null `data` is a record an earlier cycle laid out.
            let record = if !existing.is_null() && unsafe { (*existing).magic } == SYNC_MAGIC {
                existing
            } else {
                let size = core::mem::size_of::<SyncShared>();
                // SAFETY: as above; the allocator takes the pool's mutex itself.
                let fresh = unsafe { ngx::ffi::ngx_slab_alloc(shpool, size) }.cast::<SyncShared>();
                if fresh.is_null() {
                    return Status::NGX_ERROR.into();
                }
                // SAFETY: the chunk is ours and `size` long; all-zero bytes are a valid record.
                unsafe {
                    ptr::write_bytes(fresh.cast::<u8>(), 0, size);
                    (*fresh).magic = SYNC_MAGIC;
                    (*fresh).instance_id = random_id();
                    (*shpool).data = fresh.cast();
                }
                fresh
            };
            // SAFETY: `data` was set by the directive to a u64 in the configuration's pool.
            if let Some(&interval_ns) = unsafe { shm_zone.data.cast::<u64>().as_ref() } {
                // SAFETY: `record` points at the live record.
                unsafe { (*record).interval_ns.store(interval_ns, Ordering::Relaxed) };
            }
            SYNC.store(record, Ordering::Release);
            Status::NGX_OK.into()
        },
    )
}

fn random_id() -> u64 {
    match crate::glue::random_bytes::<8>() {
        Some(bytes) => u64::from_le_bytes(bytes).max(1),
        None => u64::from(std::process::id()) << 32 | crate::glue::now_ns() & 0xffff_ffff,
    }
}

impl SyncShared {
    /// The override version recorded for zone `zone_id` by an earlier loop (0: none).
    pub fn override_version(&self, zone_id: u64) -> u64 {
        self.override_versions
            .iter()
            .find(|entry| entry[0].load(Ordering::Acquire) == zone_id)
            .map_or(0, |entry| entry[1].load(Ordering::Acquire))
    }

    /// Record zone `zone_id`'s override version (0: unknown). Only the loop writes these.
    pub fn set_override_version(&self, zone_id: u64, version: u64) {
        let entry = self
            .override_versions
            .iter()
            .find(|entry| entry[0].load(Ordering::Relaxed) == zone_id)
            .or_else(|| {
                self.override_versions
                    .iter()
                    .find(|entry| entry[0].load(Ordering::Relaxed) == 0)
            });
        if let Some(entry) = entry {
            entry[1].store(version, Ordering::Release);
            entry[0].store(zone_id, Ordering::Release);
        }
    }

    /// Count a value from Redis dropped for breaking `bound` (see [`Bad`]).
    pub fn note_bad(&self, kind: Bad, zone_id: u64, value: u64, bound: u64) {
        self.bad_values.fetch_add(1, Ordering::Relaxed);
        let note = &self.bad_notes[kind as usize];
        note.zone_id.store(zone_id, Ordering::Relaxed);
        note.value.store(value, Ordering::Relaxed);
        note.bound.store(bound, Ordering::Relaxed);
        note.count.fetch_add(1, Ordering::Release);
    }

    pub fn mode(&self) -> Mode {
        Mode::from_code(self.mode.load(Ordering::Relaxed))
    }

    /// N̂, at least 1.
    pub fn instances(&self) -> u64 {
        self.instances.load(Ordering::Relaxed).max(1)
    }

    pub fn interval_ns(&self) -> u64 {
        self.interval_ns.load(Ordering::Relaxed).max(1_000_000)
    }

    /// Have the loop push the zones' limits and overrides now rather than at its next round.
    pub fn wake(&self) {
        self.kick.store(1, Ordering::Release);
    }
}
