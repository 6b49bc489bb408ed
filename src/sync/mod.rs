//! Cluster-wide limits: the one sync loop per nginx instance, a front door. The directive is
//! configuration's (`crate::conf::sync`), the instance's sync record and the per-key words
//! are the store's (`crate::store::sync_record`, `crate::store::inbox`), and the request
//! path's grant is the decision pipeline's (`crate::control`); the arithmetic is
//! `ratelimit_core::fleet`'s.
//!
//! * `shared`: the record as the loop names it, and the codes of its errors;
//! * `task`: the loop thread and its rounds; `link`: its connections (every byte read
//!   bounded), `cluster`: its routing for a Redis Cluster, `tls`: TLS failures told apart;
//! * `quota`: the period's counters of `sync` quota zones, exchanged after each round;
//! * `overrides`: the fleet's per-key overrides as the loop agrees on them with Redis; their
//!   changes reach a worker through the store's inbox, and the worker applies them from its
//!   watch timer through the control layer (the thread may not take a zone's lock);
//! * here: the election of the worker that runs the loop (an owner pid and a heartbeat in
//!   shared memory, checked by every worker on a timer), its start after fork
//!   (`init_process`, never in the master), take-over when its worker dies, and its stop and
//!   last flush when the worker exits. Workers log the loop's transitions; the thread never
//!   calls nginx.

mod blocks;
mod cluster;
mod leases;
mod link;
mod overrides;
mod quota;
mod quota_keep;
mod repeats;
mod round;
mod sentinel;
mod shared;
mod tls;
mod zone;

use core::ptr;
use core::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ngx::ffi::{ngx_cycle_t, ngx_event_t, NGX_LOG_ERR, NGX_LOG_INFO, NGX_LOG_NOTICE, NGX_LOG_WARN};
use ngx::http::HttpModuleMainConf;
use ngx::ngx_log_error;
use ratelimit_core::sync_spec::SyncSpec;

use crate::conf::RateLimitModule;
use crate::conf::{registry, ZoneConf};
use crate::control;
use crate::glue::{now_ms, process_alive};
use crate::store::inbox;
use crate::store::sync_record::{self, name_seed};
use ratelimit_admin::OverrideRefused;
use repeats::Condition;
use shared::{Bad, Mode, SyncError, SyncShared};

/// The loop thread of this process, when it owns the election.
struct Running {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<()>,
    /// `timeout=`: how long one round may wait on Redis, its last one too.
    round_timeout: Duration,
}

/// The longest an exiting worker waits for its loop's last round (a flush of what it has
/// not sent yet): with nothing left to serve, nginx would exit now.
const EXIT_WAIT: Duration = Duration::from_secs(1);

/// How often an exiting worker that still serves connections looks whether its loop ended.
const EXITING_POLL_MS: ngx::ffi::ngx_msec_t = 20;

/// Process-local (never in shared memory): only this worker's event loop touches it.
static RUNNING: Mutex<Option<Running>> = Mutex::new(None);

/// The worker's timer that watches the election and logs transitions.
// SAFETY: all-zero bytes are an unarmed event, as nginx's own `ngx_pcalloc`ed ones start.
static mut WATCH_EVENT: ngx_event_t = unsafe { core::mem::zeroed() };

/// This process's cycle, for the timer (set in `init_process`).
static mut CYCLE: *mut ngx_cycle_t = ptr::null_mut();

/// In each worker at start: arm the watcher and stand for election.
pub fn init_process(cycle: &mut ngx_cycle_t) {
    let Some(mcf) = RateLimitModule::main_conf(cycle) else {
        return;
    };
    if mcf.sync.is_none() || sync_record::shared().is_none() || !crate::glue::is_worker_process() {
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

/// In each worker at exit: stop this process's loop, wait for its last flush at most
/// [`EXIT_WAIT`] (or `timeout=` when shorter), and give up ownership so that another worker
/// takes over at once. A loop still waiting on Redis then is left to end with the process:
/// what it had not sent yet is lost to the fleet (at most one round of this instance's
/// traffic), and the worker exits when nginx would.
pub fn exit_process() {
    let wait = RUNNING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .as_ref()
        .map_or(Duration::ZERO, |running| {
            running.round_timeout.min(EXIT_WAIT)
        });
    if !stop_loop(wait) {
        // Detached: the handle is dropped, the thread dies with the process.
        let running = RUNNING
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        drop(running);
        release_ownership();
    }
}

unsafe extern "C" fn watch(event: *mut ngx_event_t) {
    crate::glue::guard::entry(
        "sync::watch",
        || (),
        || {
            // SAFETY: `CYCLE` was set in init_process of this process; the cycle outlives its timers.
            let Some(cycle) = (unsafe { CYCLE.as_mut() }) else {
                return;
            };
            let _ = event;
            watch_now(cycle);
        },
    )
}

fn watch_now(cycle: &mut ngx_cycle_t) {
    let Some(sync) = sync_record::shared() else {
        return;
    };
    // SAFETY: process flags set by nginx's signal handling in this (single) thread.
    let exiting = unsafe { nginx_sys::ngx_exiting != 0 || nginx_sys::ngx_terminate != 0 };
    if exiting {
        // The worker still serves its connections: the loop is told to stop and looked at
        // again later, never waited for here (its round may wait `timeout=` on Redis).
        if !stop_loop(Duration::ZERO) {
            // SAFETY: the event was set up in init_process; re-armed only from this thread.
            // It is cancelable: it keeps no exiting worker alive.
            unsafe { nginx_sys::ngx_add_timer(ptr::addr_of_mut!(WATCH_EVENT), EXITING_POLL_MS) };
        }
        return;
    }
    elect(cycle, sync);
    log_transitions(cycle, sync);
    apply_fleet_overrides(cycle, sync);
    log_repeats(cycle);
    apply_fleet_blocks(cycle);
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
            || now_ms().saturating_sub(heartbeat_ms) > stale_after_ms;
        if !stale
            || sync
                .owner_pid
                .compare_exchange(owner, me, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            return;
        }
        sync.heartbeat_ms.store(now_ms(), Ordering::Release);
    }
    match start_loop(cycle, sync, me) {
        Some(started) => *running = Some(started),
        None => {
            if repeats::occurred(Condition::ThreadStart, "", 1, Instant::now()) {
                ngx_log_error!(
                    NGX_LOG_ERR,
                    cycle.log,
                    "rate_limit_sync: could not start the sync thread"
                );
            }
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
    let lease_zones = registry::of(cycle)?
        .zones()
        .filter(|zone| zone.concurrency.is_some())
        .filter_map(|zone| {
            let view = zone.zone.filter(|view| zone.sync && view.is_sync())?;
            Some(leases::LeaseZone {
                name: zone.name.clone(),
                zone: view,
            })
        })
        .collect();
    let zones = registry::of(cycle)?
        .zones()
        .filter(|zone| zone.concurrency.is_none())
        .filter_map(|zone| {
            let view = zone.zone.filter(|view| zone.sync && view.is_sync())?;
            Some(zone::SyncZone {
                name: zone.name.clone(),
                zone: view,
                agreed_limits: std::cell::Cell::new(view.limits_word()),
                first_round: std::cell::Cell::new(true),
                id: name_seed(&zone.name),
                overrides: Default::default(),
                bursts: zone.bursts,
                block: zone.block,
                quota: zone
                    .quota
                    .as_ref()
                    .map(|quota| quota_keep::QuotaSync::new(quota.calendar.clone())),
            })
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let round_timeout = Duration::from_millis(spec.timeout_ms);
    let job = round::Task {
        zones,
        lease_zones,
        spec,
        tls,
        sync,
        pid: me,
        stop: stop.clone(),
        connect_timeouts: Default::default(),
    };
    let handle = std::thread::Builder::new()
        .name("rate_limit_sync".into())
        .spawn(move || job.run())
        .ok()?;
    Some(Running {
        stop,
        handle,
        round_timeout,
    })
}

/// Tell this process's loop to stop, and wait at most `wait` for it to end (it notices within
/// 20 ms; its last round flushes what it has not sent, bounded by `timeout=`). Returns
/// whether there is no loop left: it ended (joined at once, ownership given up) or there was
/// none.
fn stop_loop(wait: Duration) -> bool {
    let mut running = RUNNING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let Some(current) = running.as_ref() else {
        return true;
    };
    current.stop.store(true, Ordering::Release);
    let deadline = Instant::now() + wait;
    while !current.handle.is_finished() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    if let Some(ended) = running.take() {
        // Finished: joining takes no time.
        let _ = ended.handle.join();
    }
    release_ownership();
    true
}

/// This process no longer owns the loop: another worker may start one at its next watch.
fn release_ownership() {
    if let Some(sync) = sync_record::shared() {
        let me = u64::from(std::process::id());
        let _ = sync
            .owner_pid
            .compare_exchange(me, 0, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// Apply the fleet's override changes the loop left in the inbox through the control layer
/// (backlog rescaled, state file written), in whichever worker's timer comes first.
/// The fleet's block records the loop thread of this process queued: applied through the
/// control layer (each only when newer than the local record).
fn apply_fleet_blocks(cycle: &mut ngx_cycle_t) {
    let incoming = blocks::take_incoming();
    if incoming.is_empty() {
        return;
    }
    let Some(registry) = registry::of(cycle) else {
        return;
    };
    for record in incoming {
        let zone = registry
            .zones()
            .find(|zone: &&ZoneConf| zone.sync && name_seed(&zone.name) == record.zone_id);
        if let Some(zone) = zone {
            control::blocks::apply_fleet(zone, &record.key, record.word, record.changed_ms);
        }
    }
}

fn apply_fleet_overrides(cycle: &mut ngx_cycle_t, sync: &SyncShared) {
    let Some(registry) = registry::of(cycle) else {
        return;
    };
    let log = cycle.log;
    let now = Instant::now();
    let applied = sync.inbox.apply(|incoming| {
        let zone = registry
            .zones()
            .find(|zone: &&ZoneConf| zone.sync && name_seed(&zone.name) == incoming.zone_id);
        let Some(zone) = zone else {
            return inbox::Applied::Failed;
        };
        let to = ratelimit_core::Limits::unpack(incoming.to);
        match control::zones::replace_override(zone, &incoming.key, incoming.from, to) {
            Ok(true) => inbox::Applied::Done,
            Ok(false) => inbox::Applied::Skipped,
            Err(refused) => {
                // Once, then counted: a fleet of thousands of overrides that do not fit
                // would otherwise log a line per key and round.
                let (condition, why) = match refused {
                    OverrideRefused::TableFull => {
                        (Condition::NoRoomInTable, "its table of overrides is full")
                    }
                    OverrideRefused::NoMemory => (
                        Condition::NoMemoryForKey,
                        "its memory is short for the key (a larger zone size holds more)",
                    ),
                };
                if repeats::occurred(condition, &zone.name, 1, now) {
                    ngx_log_error!(
                        NGX_LOG_WARN,
                        log,
                        "rate_limit_sync: zone \"{}\" has no room for the fleet's override of key \
                         \"{}\": {why}; more are counted, not logged one by one",
                        zone.name,
                        zone.key_form.show(&incoming.key)
                    );
                }
                inbox::Applied::Failed
            }
        }
    });
    if applied > 0 {
        if repeats::occurred(Condition::Applied, "", applied as u64, now) {
            ngx_log_error!(
                NGX_LOG_INFO,
                log,
                "rate_limit_sync: {applied} override change(s) from the fleet applied"
            );
        }
        control::persist::save(registry, log);
    }
}

/// The counts of repeated conditions whose period has passed, one line each.
fn log_repeats(cycle: &mut ngx_cycle_t) {
    let period = repeats::SUMMARY_PERIOD.as_secs();
    for (condition, zone, count) in repeats::due(Instant::now()) {
        match condition {
            Condition::NoRoomInTable | Condition::NoMemoryForKey => {
                let why = if condition == Condition::NoRoomInTable {
                    "its table of overrides is full"
                } else {
                    "its memory is short for their keys"
                };
                ngx_log_error!(
                    NGX_LOG_WARN,
                    cycle.log,
                    "rate_limit_sync: zone \"{zone}\" had no room for {count} more of the \
                     fleet's overrides in the last {period} s: {why}"
                );
            }
            Condition::Applied => {
                ngx_log_error!(
                    NGX_LOG_INFO,
                    cycle.log,
                    "rate_limit_sync: {count} more override change(s) from the fleet applied in \
                     the last {period} s"
                );
            }
            Condition::ThreadStart => {
                ngx_log_error!(
                    NGX_LOG_ERR,
                    cycle.log,
                    "rate_limit_sync: could not start the sync thread, {count} more times in the \
                     last {period} s"
                );
            }
        }
    }
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
        let zone = registry::of(cycle).and_then(|registry| {
            registry
                .zones()
                .find(|zone: &&ZoneConf| zone.sync && name_seed(&zone.name) == zone_id)
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
        Bad::BlockRecord => match value {
            blocks::BLOCK_RECORD_MALFORMED => {
                "a block record that is not \"1 UNTIL_MS CHANGED_MS LEVEL\" \
                 (or a key longer than 64 bytes)"
                    .to_string()
            }
            level if level < 64 => {
                format!("a block record of level {level}, which is out of range (0 to {bound})")
            }
            remaining_ms => format!(
                "a block record of {remaining_ms} ms, which is out of range (at most {bound} ms)"
            ),
        },
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
