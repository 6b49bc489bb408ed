//! Cluster-wide limits: `rate_limit_sync` and the one sync loop per nginx instance.
//!
//! * `shared`: the instance's sync record in its own shared memory, and the request path's
//!   grant (no Redis call, no lock on the request path);
//! * `task`: the loop thread and its Redis I/O; `cluster`: its routing for a Redis Cluster;
//!   `tls`: `rediss://` and its trust settings;
//! * `overrides`: the fleet's per-key overrides as the loop agrees on them with Redis, and
//!   `inbox`: how their changes reach a worker, which applies them from its watch timer (the
//!   thread may not take a zone's lock);
//! * here: the directive, the election of the worker that runs the loop (an owner pid and a
//!   heartbeat in shared memory, checked by every worker on a timer), its start after fork
//!   (`init_process`, never in the master), take-over when its worker dies, and its stop and
//!   last flush when the worker exits. Workers log the loop's transitions; the thread never
//!   calls nginx.
//!
//! The arithmetic is in `ratelimit_core::fleet`.

mod cluster;
mod inbox;
mod link;
mod overrides;
pub mod shared;
mod task;
mod tls;

use core::ffi::{c_char, c_void};
use core::ptr;
use core::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use ngx::core::{Status, NGX_CONF_ERROR, NGX_CONF_OK};
use ngx::ffi::{
    ngx_command_t, ngx_conf_t, ngx_cycle_t, ngx_event_t, ngx_int_t, ngx_shm_zone_t,
    ngx_slab_pool_t, NGX_LOG_EMERG, NGX_LOG_ERR, NGX_LOG_INFO, NGX_LOG_NOTICE, NGX_LOG_WARN,
};
use ngx::http::HttpModuleMainConf;
use ngx::{ngx_conf_log_error, ngx_log_error};
use ratelimit_core::sync_spec::SyncSpec;

use crate::conf::{args, conf_error, main_conf, words, MainConf, ZoneConf};
use crate::RateLimitModule;
use shared::{Bad, Mode, SyncError, SyncShared, SYNC_MAGIC};

/// The shared memory zone holding the instance's [`SyncShared`]. Its name cannot be written
/// in `zone=NAME:SIZE` (a colon ends the name there).
const SHM_NAME: &str = "rate_limit_sync:instance";
const SHM_SIZE: u64 = 512 * 1024;

/// `rate_limit_sync` as configured.
pub struct SyncConf {
    pub spec: SyncSpec,
    /// The files of `tls_ca=`, `tls_cert=`/`tls_key=`, read at config time.
    pub tls: Option<redis::TlsCertificates>,
}

/// The hash seed of a sync zone: derived from its name (not random), so that every instance
/// of the fleet gives a key the same id, and so the same Redis key.
pub fn name_seed(name: &str) -> u64 {
    use std::hash::BuildHasher;
    foldhash::quality::FixedState::with_seed(0x7379_6e63).hash_one(("rate_limit_sync", name))
}

/// `rate_limit_sync redis://… [cluster] [interval=] [timeout=] [prefix=] [on_failure=]
/// [tls_ca=] [tls_cert= tls_key=];`
pub extern "C" fn cmd_rate_limit_sync(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    _conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: nginx calls directive handlers with a valid configuration context.
    let cf = unsafe { &mut *cf };
    let words = match words(&args(cf)[1..]) {
        Ok(words) => words,
        Err(message) => return conf_error(cf, &message),
    };
    let spec = match SyncSpec::parse_words(&words) {
        Ok(spec) => spec,
        Err(error) => return conf_error(cf, &error.to_string()),
    };
    for url in &spec.urls {
        if let Err(error) = redis::Client::open(url.as_str()) {
            return conf_error(cf, &format!("invalid Redis URL \"{url}\": {error}"));
        }
    }
    let tls = match tls::load(&spec, &conf_prefix(cf)) {
        Ok(tls) => tls,
        Err(error) => return conf_error(cf, &error.to_string()),
    };
    if spec.urls.len() > 1 && !spec.cluster {
        return conf_error(
            cf,
            &format!(
                "invalid Redis URL \"{}\": several URLs need \"cluster\"",
                spec.urls[1]
            ),
        );
    }
    let Some(mcf) = main_conf(cf) else {
        return NGX_CONF_ERROR;
    };
    if mcf.sync.is_some() {
        return conf_error(cf, "\"rate_limit_sync\" directive is duplicate");
    }
    let shm_zone = crate::conf::add_shared_zone(cf, SHM_NAME, SHM_SIZE);
    if shm_zone.is_null() {
        return NGX_CONF_ERROR;
    }
    // SAFETY: `shm_zone` was just returned by ngx_shared_memory_add.
    let shm = unsafe { &mut *shm_zone };
    shm.init = Some(shm_init);
    shm.noreuse = 0;
    mcf.sync = Some(SyncConf { spec, tls });
    // The interval reaches the shared record through the zone's data: the configuration's
    // main conf lives as long as the cycle.
    shm.data = ptr::from_mut(mcf).cast();
    NGX_CONF_OK
}

/// The directory of nginx.conf, against which relative `tls_*=` paths are read.
fn conf_prefix(cf: &ngx_conf_t) -> std::path::PathBuf {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: `cf.cycle` is the cycle being configured; its `conf_prefix` is set before any
    // directive is read.
    let prefix = unsafe { (*cf.cycle).conf_prefix.as_bytes() };
    std::path::PathBuf::from(std::ffi::OsStr::from_bytes(prefix))
}

/// Once the `http` block is read: a `sync` zone needs `rate_limit_sync`.
pub fn check_zones(cf: &mut ngx_conf_t) -> Result<(), ()> {
    let Some(mcf) = main_conf(cf) else {
        return Ok(());
    };
    for &zone in &mcf.zones {
        // SAFETY: zone configurations live in the configuration pool of this cycle.
        let zone = unsafe { &*zone };
        if zone.sync && mcf.sync.is_none() {
            ngx_conf_log_error!(
                NGX_LOG_EMERG,
                cf,
                "zone \"{}\" has \"sync\" but no \"rate_limit_sync\" is configured",
                zone.name
            );
            return Err(());
        }
    }
    Ok(())
}

/// Lay out (or adopt across a reload) the instance's sync record.
extern "C" fn shm_init(shm_zone: *mut ngx_shm_zone_t, _data: *mut c_void) -> ngx_int_t {
    // SAFETY: nginx passes the zone being initialized; its data is this cycle's main conf.
    let shm_zone = unsafe { &mut *shm_zone };
    let shpool = shm_zone.shm.addr.cast::<ngx_slab_pool_t>();
    // SAFETY: the slab pool at the start of the mapping is initialized by nginx before this
    // callback, which runs in the master before workers exist.
    let record = unsafe {
        let existing = (*shpool).data.cast::<SyncShared>();
        if !existing.is_null() && (*existing).magic == SYNC_MAGIC {
            existing
        } else {
            let fresh = ngx::ffi::ngx_slab_alloc(shpool, core::mem::size_of::<SyncShared>())
                .cast::<SyncShared>();
            if fresh.is_null() {
                return Status::NGX_ERROR.into();
            }
            ptr::write_bytes(fresh.cast::<u8>(), 0, core::mem::size_of::<SyncShared>());
            (*fresh).magic = SYNC_MAGIC;
            (*fresh).instance_id = random_id();
            (*shpool).data = fresh.cast();
            fresh
        }
    };
    // SAFETY: `data` was set to the cycle's main conf by the directive.
    if let Some(mcf) = unsafe { shm_zone.data.cast::<MainConf>().as_ref() } {
        if let Some(sync) = &mcf.sync {
            // SAFETY: `record` points at the live record.
            let interval_ns = sync.spec.interval_ms * 1_000_000;
            unsafe { (*record).interval_ns.store(interval_ns, Ordering::Relaxed) };
        }
    }
    shared::set_shared(record);
    Status::NGX_OK.into()
}

fn random_id() -> u64 {
    use std::io::Read;
    let mut bytes = [0u8; 8];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    if read.is_err() {
        return u64::from(std::process::id()) << 32 | crate::handler::now_ns() & 0xffff_ffff;
    }
    u64::from_le_bytes(bytes).max(1)
}

/// The loop thread of this process, when it owns the election.
struct Running {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<()>,
}

/// Process-local (never in shared memory): only this worker's event loop touches it.
static RUNNING: Mutex<Option<Running>> = Mutex::new(None);

/// The worker's timer that watches the election and logs transitions.
static mut WATCH_EVENT: ngx_event_t = unsafe { core::mem::zeroed() };

/// This process's cycle, for the timer (set in `init_process`).
static mut CYCLE: *mut ngx_cycle_t = ptr::null_mut();

/// In each worker at start: arm the watcher and stand for election.
pub fn init_process(cycle: &mut ngx_cycle_t) {
    let Some(mcf) = RateLimitModule::main_conf(cycle) else {
        return;
    };
    if mcf.sync.is_none() || shared::shared().is_none() {
        return;
    }
    // SAFETY: set by nginx before init_process callbacks run.
    let process = unsafe { nginx_sys::ngx_process };
    let worker = process == nginx_sys::NGX_PROCESS_WORKER as ngx::ffi::ngx_uint_t
        || process == nginx_sys::NGX_PROCESS_SINGLE as ngx::ffi::ngx_uint_t;
    if !worker {
        return;
    }
    // SAFETY: the event and cycle statics are only used by this process's event loop (one
    // thread); the event is zeroed, then given its handler and log before it is armed.
    unsafe {
        CYCLE = cycle;
        let event = &mut *ptr::addr_of_mut!(WATCH_EVENT);
        event.handler = Some(watch);
        event.log = cycle.log;
        event.data = ptr::from_mut(cycle).cast();
        event.set_cancelable(1);
    }
    watch_now(cycle);
}

/// In each worker at exit: stop this process's loop after one last flush, and give up
/// ownership so another instance's worker takes over at once.
pub fn exit_process() {
    stop_loop();
}

unsafe extern "C" fn watch(event: *mut ngx_event_t) {
    // SAFETY: `CYCLE` was set in init_process of this process; the cycle outlives its timers.
    let Some(cycle) = (unsafe { CYCLE.as_mut() }) else {
        return;
    };
    let _ = event;
    watch_now(cycle);
}

fn watch_now(cycle: &mut ngx_cycle_t) {
    let Some(sync) = shared::shared() else {
        return;
    };
    // SAFETY: process flags set by nginx's signal handling in this (single) thread.
    let exiting = unsafe { nginx_sys::ngx_exiting != 0 || nginx_sys::ngx_terminate != 0 };
    if exiting {
        stop_loop();
        return;
    }
    elect(cycle, sync);
    log_transitions(cycle, sync);
    apply_fleet_overrides(cycle, sync);
    // An eighth of the interval (10 to 100 ms): the fleet's override changes wait in the
    // inbox at most that long, so they land within two intervals end to end.
    let interval_ms = (sync.interval_ns() / 1_000_000).max(10);
    let period_ms = (interval_ms / 8).clamp(10, 100).min(interval_ms);
    // SAFETY: the event was set up in init_process; re-armed only from this thread.
    unsafe { nginx_sys::ngx_add_timer(ptr::addr_of_mut!(WATCH_EVENT), period_ms as _) };
}

/// Become the owner when there is none, or when its worker is gone or its loop stopped
/// beating for three intervals and a second; start the loop then.
fn elect(cycle: &mut ngx_cycle_t, sync: &'static SyncShared) {
    let me = u64::from(std::process::id());
    let owner = sync.owner_pid.load(Ordering::Acquire);
    let mut running = RUNNING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if owner == me {
        if running.as_ref().is_some_and(|r| !r.handle.is_finished()) {
            return;
        }
        // Our loop ended (it cannot start, or it ended by a panic): start it again.
        *running = None;
    } else {
        let heartbeat_ms = sync.heartbeat_ms.load(Ordering::Acquire);
        let stale_after_ms = 3 * sync.interval_ns() / 1_000_000 + 1000;
        let stale = owner == 0
            || !process_alive(owner)
            || task::now_ms().saturating_sub(heartbeat_ms) > stale_after_ms;
        if !stale
            || sync
                .owner_pid
                .compare_exchange(owner, me, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            return;
        }
        sync.heartbeat_ms.store(task::now_ms(), Ordering::Release);
    }
    match start_loop(cycle, sync, me) {
        Some(started) => *running = Some(started),
        None => {
            ngx_log_error!(
                NGX_LOG_ERR,
                cycle.log,
                "rate_limit_sync: could not start the sync thread"
            );
            let _ = sync
                .owner_pid
                .compare_exchange(me, 0, Ordering::AcqRel, Ordering::Acquire);
        }
    }
}

fn start_loop(cycle: &mut ngx_cycle_t, sync: &'static SyncShared, me: u64) -> Option<Running> {
    let mcf = RateLimitModule::main_conf(cycle)?;
    let spec = mcf.sync.as_ref()?.spec.clone();
    let tls = mcf.sync.as_ref()?.tls.clone();
    let zones = mcf
        .zones
        .iter()
        .filter_map(|&zone| {
            // SAFETY: zone configurations live in the configuration pool of this cycle.
            let zone: &ZoneConf = unsafe { &*zone };
            let view = zone.zone.filter(|view| zone.sync && view.is_sync())?;
            Some(task::SyncZone {
                name: zone.name.clone(),
                zone: view,
                agreed_limits: std::cell::Cell::new(view.header().limits.load(Ordering::Acquire)),
                first_round: std::cell::Cell::new(true),
                id: name_seed(&zone.name),
                overrides: Default::default(),
                bursts: zone.bursts,
            })
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let job = task::Task {
        zones,
        spec,
        tls,
        sync,
        pid: me,
        stop: stop.clone(),
    };
    let handle = std::thread::Builder::new()
        .name("rate_limit_sync".into())
        .spawn(move || job.run())
        .ok()?;
    Some(Running { stop, handle })
}

fn stop_loop() {
    let running = RUNNING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .take();
    let Some(running) = running else {
        return;
    };
    running.stop.store(true, Ordering::Release);
    // Bounded: the loop notices within 20 ms and its last round is bounded by `timeout=`.
    let _ = running.handle.join();
    if let Some(sync) = shared::shared() {
        let me = u64::from(std::process::id());
        let _ = sync
            .owner_pid
            .compare_exchange(me, 0, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// After an admin write (a zone's limits, an override): have the loop push it now rather
/// than at its next round, so the fleet has it within one interval.
pub fn kick() {
    if let Some(sync) = shared::shared() {
        sync.kick.store(1, Ordering::Release);
    }
}

/// Apply the fleet's override changes the loop left in the inbox, as the admin API would
/// (backlog rescaled, state file written), in whichever worker's timer comes first.
fn apply_fleet_overrides(cycle: &mut ngx_cycle_t, sync: &SyncShared) {
    let Some(mcf) = RateLimitModule::main_conf(cycle) else {
        return;
    };
    let log = cycle.log;
    let applied = sync.inbox.apply(|incoming| {
        let zone = mcf.zones.iter().find_map(|&zone| {
            // SAFETY: zone configurations live in the configuration pool of this cycle.
            let zone: &ZoneConf = unsafe { &*zone };
            (zone.sync && name_seed(&zone.name) == incoming.zone_id).then_some(zone)
        });
        let Some(zone) = zone else {
            return inbox::Applied::Failed;
        };
        let to = ratelimit_core::Limits::unpack(incoming.to);
        match crate::admin::replace_override(zone, &incoming.key, incoming.from, to) {
            Ok(true) => inbox::Applied::Done,
            Ok(false) => inbox::Applied::Skipped,
            Err(_) => {
                ngx_log_error!(
                    NGX_LOG_WARN,
                    log,
                    "rate_limit_sync: zone \"{}\" has no room for the fleet's override of key \"{}\"",
                    zone.name,
                    String::from_utf8_lossy(&incoming.key)
                );
                inbox::Applied::Failed
            }
        }
    });
    if applied > 0 {
        ngx_log_error!(
            NGX_LOG_INFO,
            log,
            "rate_limit_sync: {applied} override change(s) from the fleet applied"
        );
        crate::admin::save_state(mcf, log);
    }
}

pub(crate) fn process_alive(pid: u64) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists.
    let result = unsafe { libc::kill(pid, 0) };
    result == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Log each mode change and each new kind of error once, by whichever worker sees it first.
fn log_transitions(cycle: &mut ngx_cycle_t, sync: &SyncShared) {
    let error = sync.last_error.load(Ordering::Relaxed);
    let logged_error = sync.logged_error.load(Ordering::Relaxed);
    if error != logged_error
        && sync
            .logged_error
            .compare_exchange(logged_error, error, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        && error != 0
    {
        let url = RateLimitModule::main_conf(cycle)
            .and_then(|mcf| mcf.sync.as_ref())
            .map(|sync| sync.spec.urls[0].clone())
            .unwrap_or_default();
        ngx_log_error!(
            NGX_LOG_ERR,
            cycle.log,
            "rate_limit_sync \"{}\": {}",
            redact(&url),
            SyncError::from_code(error).as_str()
        );
    }
    log_bad_values(cycle, sync);
    let mode = sync.mode.load(Ordering::Relaxed);
    let logged = sync.logged_mode.load(Ordering::Relaxed);
    if mode == logged
        || sync
            .logged_mode
            .compare_exchange(logged, mode, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    let (was, now) = (Mode::from_code(logged), Mode::from_code(mode));
    if now.is_fallback() {
        ngx_log_error!(
            NGX_LOG_WARN,
            cycle.log,
            "rate_limit_sync: Redis missed {} intervals, on_failure={} in force",
            SyncSpec::FAILED_AFTER_ROUNDS,
            now.as_str()
        );
    } else if now == Mode::Synced && (was.is_fallback() || was == Mode::Starting) {
        ngx_log_error!(
            NGX_LOG_NOTICE,
            cycle.log,
            "rate_limit_sync: synced with Redis ({} instances seen)",
            sync.instances()
        );
    }
}

/// Log each new value from Redis that the loop dropped (once per kind and value; repeats
/// are only counted, in `bad_values`), by whichever worker sees it first.
fn log_bad_values(cycle: &mut ngx_cycle_t, sync: &SyncShared) {
    for kind in Bad::ALL {
        let note = &sync.bad_notes[kind as usize];
        let count = note.count.load(Ordering::Acquire);
        let logged = note.logged.load(Ordering::Relaxed);
        if count == logged
            || note
                .logged
                .compare_exchange(logged, count, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            continue;
        }
        let (value, bound) = (
            note.value.load(Ordering::Relaxed),
            note.bound.load(Ordering::Relaxed),
        );
        if logged != 0 && note.logged_value.swap(value, Ordering::Relaxed) == value {
            continue;
        }
        note.logged_value.store(value, Ordering::Relaxed);
        let zone_id = note.zone_id.load(Ordering::Relaxed);
        let zone = RateLimitModule::main_conf(cycle).and_then(|mcf| {
            mcf.zones.iter().find_map(|&zone| {
                // SAFETY: zone configurations live in the configuration pool of this cycle.
                let zone: &ZoneConf = unsafe { &*zone };
                (zone.sync && name_seed(&zone.name) == zone_id).then_some(zone)
            })
        });
        let what = bad_value_text(kind, zone, value, bound);
        let zone_name = zone.map_or(String::new(), |zone| format!(" zone \"{}\":", zone.name));
        ngx_log_error!(
            NGX_LOG_WARN,
            cycle.log,
            "rate_limit_sync:{} Redis answered {}; dropped",
            zone_name,
            what
        );
    }
}

/// What was wrong with a dropped value, in words.
fn bad_value_text(kind: Bad, zone: Option<&ZoneConf>, value: u64, bound: u64) -> String {
    match kind {
        Bad::KeyAhead => format!(
            "a key state ahead {} us, which is out of range (at most {bound} us: two buckets \
             and one interval)",
            value as i64
        ),
        Bad::KeyCounts => format!(
            "key counts of {} requests, which is out of range (at most {bound})",
            value as i64
        ),
        Bad::Instances => format!(
            "{} instances alive, which is out of range (1 to {})",
            value as i64,
            ratelimit_core::fleet_round::MAX_INSTANCES
        ),
        Bad::Limits | Bad::Override => {
            let what = if kind == Bad::Limits {
                "limits"
            } else {
                "an override with limits"
            };
            let Some(limits) = ratelimit_core::Limits::unpack(value) else {
                return format!("{what} {value}, which packs no valid limits");
            };
            let reason = zone
                .and_then(|zone| {
                    let algorithm = zone.zone?.algorithm();
                    ratelimit_admin::body::check_limits(
                        &zone.name,
                        algorithm,
                        &limits,
                        limits.burst != 0,
                        0,
                    )
                    .err()
                })
                .map_or_else(String::new, |error| format!(": {error}"));
            format!(
                "{what} rate \"{}\" burst {} that the zone cannot take{reason}",
                limits.rate, limits.burst
            )
        }
        Bad::Version => format!(
            "an override version {}, which is out of range",
            value as i64
        ),
        Bad::ReplySize => format!(
            "a reply larger than the exchange allows ({bound} bytes): the connection was \
             dropped"
        ),
    }
}

/// A URL without its password, for the log.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{user}:***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_string(),
    }
}

/// The instance's sync state for the admin API; `None` without `rate_limit_sync`.
pub fn info() -> Option<ratelimit_admin::SyncInfo> {
    let sync = shared::shared()?;
    let mode = sync.mode();
    let last_ok_ms = sync.last_ok_ms.load(Ordering::Relaxed);
    Some(ratelimit_admin::SyncInfo {
        connected: mode == Mode::Synced,
        mode: mode.as_str(),
        last_sync_age_ms: (last_ok_ms != 0).then(|| task::now_ms().saturating_sub(last_ok_ms)),
        instances: sync.instances(),
        round_trips: sync.round_trips.load(Ordering::Relaxed),
        errors: sync.errors.load(Ordering::Relaxed),
        lag_us: sync.lag_us.load(Ordering::Relaxed),
        fallback: mode.is_fallback(),
        keys_sent: sync.keys_pushed.load(Ordering::Relaxed),
        bad_values: sync.bad_values.load(Ordering::Relaxed),
    })
}
