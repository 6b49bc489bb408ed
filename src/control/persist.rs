//! `rate_limit_state_file`: restore changes into fresh zones (master, zone init), write them
//! after every change (the worker that made it), and once after each start (worker 0), so
//! that the file always follows what is in force.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ngx::ffi::{ngx_cycle_t, ngx_log_t, NGX_LOG_ERR, NGX_LOG_NOTICE, NGX_LOG_WARN};
use ngx::ngx_log_error;
use ratelimit_admin::state::{self, Loaded, Note, QuotaCounts, StateError, StateFile, ZoneState};
use ratelimit_admin::AdminZone;

use super::zones::shared_zones;
use crate::conf::registry::{self, Registry};
use crate::conf::ZoneConf;
use crate::glue::now_ns;
use crate::store::Zone;

/// The state file of the configuration being loaded, for the zone inits that follow its
/// parsing in the same `ngx_init_cycle` (zone init has no way to the registry).
/// Only the master touches it, one cycle at a time; the `Mutex` makes the static sound.
static PENDING: Mutex<Pending> = Mutex::new(Pending::Unset);

enum Pending {
    /// No `rate_limit_state_file` in the configuration being loaded.
    Unset,
    /// Not read yet: read at the first fresh zone (a reload that keeps every zone reads
    /// nothing); with the most it reads of the file ([`state::size_bound`]).
    Configured(PathBuf, u64),
    /// Read (or found missing or unusable, and logged): what to restore from.
    Loaded(PathBuf, Option<Box<Loaded>>),
}

/// Once the whole configuration is read (before its zones are initialized): make the path
/// absolute (relative to nginx's prefix) and remember it for this cycle's zone inits.
pub fn configure(cycle: &ngx_cycle_t, registry: &mut Registry) {
    let path = registry
        .state_file
        .as_ref()
        .map(|path| Path::new(&cycle.prefix.to_string()).join(path));
    registry.state_file = path.as_ref().map(|path| path.display().to_string());
    let bound = size_bound(registry);
    let mut pending = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    *pending = match path {
        Some(path) => Pending::Configured(path, bound),
        None => Pending::Unset,
    };
}

/// The most of the file read for the registry's zones: what their shared memory could fill.
fn size_bound(registry: &Registry) -> u64 {
    state::size_bound(registry.zones().map(|zone_conf| {
        // SAFETY: `shm_zone` is set by the zone's directive and lives with the cycle; its size
        // is the directive's.
        unsafe { zone_conf.shm_zone.as_ref() }.map_or(0, |shm_zone| shm_zone.shm.size as u64)
    }))
}

/// Restore what the state file holds for a zone whose shared memory is fresh (first start, or
/// a zone that is new or was resized on reload). Never fails: problems are logged.
pub fn restore(zone_conf: &mut ZoneConf) {
    // SAFETY: ngx_test_config is written once, at startup, before configuration.
    if unsafe { nginx_sys::ngx_test_config } != 0 {
        return;
    }
    let Some(zone) = zone_conf
        .zone
        .filter(|zone| !zone.algorithm().counts_in_flight())
    else {
        return;
    };
    // SAFETY: `shm_zone` was set by `rate_limit_zone`; its log is the cycle's log.
    let log = unsafe { (*zone_conf.shm_zone).shm.log };
    let mut pending = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    if let Pending::Configured(path, bound) = &*pending {
        let path = path.clone();
        let file = load(&path, *bound, log);
        *pending = Pending::Loaded(path, file.map(Box::new));
    }
    let Pending::Loaded(path, Some(file)) = &*pending else {
        return;
    };
    let path = path.display().to_string();
    let chosen = file.zone(&zone_conf.name);
    if let Some(note) = &chosen.note {
        log_note(log, &path, note);
    }
    let Some(saved) = chosen.state else {
        return;
    };
    let plan = state::plan_restore(saved, &zone_conf.name, zone.algorithm(), zone_conf.limits);
    for note in &plan.notes {
        log_note(log, &path, note);
    }
    let zone = match usable_counts(zone_conf, saved, log, &path) {
        Some(quota) => restore_counts(zone_conf, zone, quota, log, &path),
        None => zone,
    };
    if let Some(limits) = plan.limits {
        // No worker runs yet (zone init is in the master).
        zone.restore_limits(limits);
    }
    let restored = restore_overrides(zone_conf, &zone, &plan.overrides, log, &path);
    if plan.limits.is_some() || restored > 0 {
        let limits = zone.limits().unwrap_or(zone_conf.limits);
        ngx_log_error!(
            NGX_LOG_NOTICE,
            log,
            "rate_limit_state_file \"{path}\": zone \"{}\" restored: rate {} burst {}, \
             {restored} override(s)",
            zone_conf.name,
            limits.rate,
            limits.burst
        );
    }
}

/// One line about the file, at the note's level.
fn log_note(log: *mut ngx_log_t, path: &str, note: &Note) {
    let (level, text) = match note {
        Note::Notice(text) => (NGX_LOG_NOTICE, text),
        Note::Warn(text) => (NGX_LOG_WARN, text),
        Note::Error(text) => (NGX_LOG_ERR, text),
    };
    ngx_log_error!(level, log, "rate_limit_state_file \"{path}\": {text}");
}

/// A quota zone's saved counts, when they still count here: the same calendar, and the same
/// seed for a `sync` zone (which hashes keys with the seed of its name, as every instance of
/// the fleet does: counts saved under another seed name no key here).
fn usable_counts<'a>(
    zone_conf: &ZoneConf,
    saved: &'a ZoneState,
    log: *mut ngx_log_t,
    path: &str,
) -> Option<&'a QuotaCounts> {
    let zone = zone_conf.zone?;
    let quota = saved
        .quota
        .as_ref()
        .filter(|_| zone.algorithm().is_quota())?;
    let name = &zone_conf.name;
    let calendar = zone_conf
        .quota
        .as_ref()
        .map(|quota| quota.calendar.to_string());
    if Some(&quota.calendar) != calendar.as_ref() {
        ngx_log_error!(
            NGX_LOG_NOTICE,
            log,
            "rate_limit_state_file \"{path}\": zone \"{name}\" counted per {} and now per {}: \
             its counts start afresh",
            quota.calendar,
            calendar.as_deref().unwrap_or("-")
        );
        return None;
    }
    if zone.is_sync() && quota.seed != zone.seed() {
        ngx_log_error!(
            NGX_LOG_NOTICE,
            log,
            "rate_limit_state_file \"{path}\": zone \"{name}\" counted {} key(s) without \
             \"sync\": the fleet's counts in Redis are used instead",
            quota.words.len()
        );
        return None;
    }
    Some(quota)
}

/// Put a quota zone's counts of the current period into its fresh memory (reseeded with the
/// seed they were hashed with); returns the zone.
fn restore_counts(
    zone_conf: &mut ZoneConf,
    zone: Zone,
    quota: &QuotaCounts,
    log: *mut ngx_log_t,
    path: &str,
) -> Zone {
    let now = now_ns();
    let (words, other_periods) = quota.of_period(super::quota::window(zone_conf, now).tag);
    let zone = zone.reseeded(quota.seed);
    zone_conf.zone = Some(zone);
    let lost = words
        .iter()
        .filter(|(id, word)| !zone.restore_word(*id, *word, now))
        .count();
    let name = &zone_conf.name;
    ngx_log_error!(
        NGX_LOG_NOTICE,
        log,
        "rate_limit_state_file \"{path}\": zone \"{name}\" restored the counts of {} key(s)",
        words.len() - lost
    );
    if other_periods > 0 {
        ngx_log_error!(
            NGX_LOG_NOTICE,
            log,
            "rate_limit_state_file \"{path}\": zone \"{name}\" dropped the counts of \
             {other_periods} key(s) of another period than the current one"
        );
    }
    if lost > 0 {
        ngx_log_error!(
            NGX_LOG_WARN,
            log,
            "rate_limit_state_file \"{path}\": zone \"{name}\" has no room for the \
             counts of {lost} key(s): make the zone larger"
        );
    }
    zone
}

/// Put the overrides into the zone; returns how many it took. A full table is named once,
/// with the count of what it could not take.
fn restore_overrides(
    zone_conf: &ZoneConf,
    zone: &Zone,
    overrides: &[(Vec<u8>, ratelimit_core::Limits)],
    log: *mut ngx_log_t,
    path: &str,
) -> usize {
    let mut restored = 0;
    let mut refused = 0;
    for (key, limits) in overrides {
        match zone.set_override(key, *limits) {
            Ok(_) => restored += 1,
            Err(_) if refused > 0 => refused += 1,
            Err(_) => {
                refused += 1;
                ngx_log_error!(
                    NGX_LOG_WARN,
                    log,
                    "rate_limit_state_file \"{path}\": zone \"{}\" has no room for the \
                     override of key \"{}\"",
                    zone_conf.name,
                    zone_conf.key_form.show(key)
                );
            }
        }
    }
    if refused > 1 {
        ngx_log_error!(
            NGX_LOG_WARN,
            log,
            "rate_limit_state_file \"{path}\": zone \"{}\" has no room for {refused} \
             override(s) in all: make the zone larger",
            zone_conf.name
        );
    }
    restored
}

/// Read the file (and its previous copy when it is damaged), logging what is wrong with it.
fn load(path: &Path, bound: u64, log: *mut ngx_log_t) -> Option<Loaded> {
    let shown = path.display();
    match state::load(path, bound) {
        Ok(file) => {
            if let Some(note) = file.file_note() {
                ngx_log_error!(NGX_LOG_ERR, log, "rate_limit_state_file \"{shown}\" {note}");
            }
            Some(file)
        }
        Err(StateError::Missing) => {
            ngx_log_error!(
                NGX_LOG_NOTICE,
                log,
                "rate_limit_state_file \"{shown}\" does not exist yet: nothing to restore"
            );
            None
        }
        Err(error) => {
            ngx_log_error!(
                NGX_LOG_ERR,
                log,
                "rate_limit_state_file \"{shown}\" is ignored: {error}"
            );
            None
        }
    }
}

/// In worker 0 at start: name the zones the file has and the configuration no longer has,
/// then rewrite the file from shared memory.
pub fn worker_started(cycle: &ngx_cycle_t) {
    // SAFETY: set by nginx before init_process callbacks run.
    let worker = unsafe { nginx_sys::ngx_worker };
    if !crate::glue::is_worker_process() || worker != 0 {
        return;
    }
    let Some(registry) = registry::of(cycle) else {
        return;
    };
    let Some(path) = &registry.state_file else {
        return;
    };
    if let Ok(old) = state::load(Path::new(path), size_bound(registry)) {
        let zones = shared_zones(registry, 0);
        let configured = |name: &str| zones.iter().any(|zone| zone.name() == name);
        for text in state::gone_zones(&old.current, configured) {
            ngx_log_error!(
                NGX_LOG_NOTICE,
                cycle.log,
                "rate_limit_state_file \"{path}\": {text}"
            );
        }
    }
    save(registry, cycle.log);
    if has_quota_zone(registry) {
        arm_quota_saves(cycle);
    }
}

/// How often worker 0 writes a quota zone's counts while nginx runs: a crash (the whole host,
/// or SIGKILL of every process) loses at most the counts of this last interval. A stop, a
/// restart or a reload loses nothing: each worker writes them as it exits.
pub const QUOTA_SAVE_INTERVAL_MS: ngx::ffi::ngx_msec_t = 10_000;

fn has_quota_zone(registry: &Registry) -> bool {
    registry.state_file.is_some() && registry.zones().any(|zone| zone.quota.is_some())
}

/// This worker's timer for the periodic writes (only worker 0 arms it).
static mut QUOTA_SAVE_EVENT: ngx::ffi::ngx_event_t = unsafe { core::mem::zeroed() };

fn arm_quota_saves(cycle: &ngx_cycle_t) {
    // SAFETY: the event static is used by this process's event loop only (one thread); it is
    // given its handler and log before it is armed, and is cancelable so that it never holds
    // a worker that is shutting down.
    unsafe {
        let event = &mut *core::ptr::addr_of_mut!(QUOTA_SAVE_EVENT);
        event.handler = Some(save_quotas);
        event.log = cycle.log;
        event.set_cancelable(1);
        nginx_sys::ngx_add_timer(event, QUOTA_SAVE_INTERVAL_MS);
    }
}

/// The periodic write, armed again for the next interval.
unsafe extern "C" fn save_quotas(event: *mut ngx::ffi::ngx_event_t) {
    crate::glue::guard::entry(
        "control::persist::save_quotas",
        || (),
        || {
            // SAFETY: nginx calls the handler with the armed event; the running cycle outlives it.
            let (event, cycle) = unsafe { (&mut *event, &*nginx_sys::ngx_cycle) };
            if let Some(registry) = registry::of(cycle) {
                save(registry, cycle.log);
            }
            // SAFETY: as above: this process's own event, on its event loop.
            unsafe { nginx_sys::ngx_add_timer(event, QUOTA_SAVE_INTERVAL_MS) };
        },
    )
}

/// In each worker as it exits (a stop, a restart, a reload's old workers): write the quota
/// zones' counts as they are now. The file is replaced under a lock, so the worker exiting
/// last writes the newest counts.
pub fn worker_exiting(cycle: &ngx_cycle_t) {
    if !crate::glue::is_worker_process() {
        return;
    }
    if let Some(registry) = registry::of(cycle).filter(|registry| has_quota_zone(registry)) {
        save(registry, cycle.log);
    }
}

/// Rewrite the state file (when there is one) from the zones' shared memory.
pub fn save(registry: &Registry, log: *mut ngx_log_t) {
    let Some(path) = &registry.state_file else {
        return;
    };
    if let Err(error) = state::save(Path::new(path), || snapshot(registry)) {
        ngx_log_error!(
            NGX_LOG_ERR,
            log,
            "rate_limit_state_file \"{path}\" was not written: {error}"
        );
    }
}

fn snapshot(registry: &Registry) -> StateFile {
    let zones = shared_zones(registry, now_ns());
    let mut file = StateFile::default();
    // A concurrency zone's limits are not kept (the file has a rate zone's shape): a restart
    // gives it the configuration's.
    for zone in zones
        .iter()
        .filter(|zone| !zone.zone().algorithm().counts_in_flight())
    {
        let algorithm = zone.zone().algorithm();
        let entry = ZoneState {
            algorithm,
            config: zone.config_limits(),
            limits: zone.limits(),
            overrides: zone.overrides(),
            quota: zone.calendar().map(|calendar| QuotaCounts {
                calendar,
                seed: zone.zone().seed(),
                words: zone.zone().state_words(),
            }),
        };
        file.zones.insert(zone.name().to_string(), entry);
    }
    file
}
