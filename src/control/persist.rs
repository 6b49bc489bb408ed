//! `rate_limit_state_file`: restore changes into fresh zones (master, zone init), write them
//! after every change (the worker that made it), and once after each start (worker 0), so
//! that the file always follows what is in force.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ngx::ffi::{ngx_cycle_t, ngx_log_t, NGX_LOG_ERR, NGX_LOG_NOTICE, NGX_LOG_WARN};
use ngx::ngx_log_error;
use ratelimit_admin::state::{self, Note, QuotaCounts, StateError, StateFile, ZoneState};
use ratelimit_admin::AdminZone;

use super::zones::shared_zones;
use crate::conf::registry::{self, Registry};
use crate::conf::ZoneConf;
use crate::glue::now_ns;

/// The state file of the configuration being loaded, for the zone inits that follow its
/// parsing in the same `ngx_init_cycle` (zone init has no way to the registry).
/// Only the master touches it, one cycle at a time; the `Mutex` makes the static sound.
static PENDING: Mutex<Pending> = Mutex::new(Pending::Unset);

enum Pending {
    /// No `rate_limit_state_file` in the configuration being loaded.
    Unset,
    /// Not read yet: read at the first fresh zone (a reload that keeps every zone reads
    /// nothing).
    Configured(PathBuf),
    /// Read (or found missing or corrupt, and logged): what to restore from.
    Loaded(PathBuf, Option<StateFile>),
}

/// Once the whole configuration is read (before its zones are initialized): make the path
/// absolute (relative to nginx's prefix) and remember it for this cycle's zone inits.
pub fn configure(cycle: &ngx_cycle_t, registry: &mut Registry) {
    let path = registry
        .state_file
        .as_ref()
        .map(|path| Path::new(&cycle.prefix.to_string()).join(path));
    registry.state_file = path.as_ref().map(|path| path.display().to_string());
    let mut pending = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    *pending = match path {
        Some(path) => Pending::Configured(path),
        None => Pending::Unset,
    };
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
    if let Pending::Configured(path) = &*pending {
        let path = path.clone();
        let file = load(&path, log);
        *pending = Pending::Loaded(path, file);
    }
    let Pending::Loaded(path, Some(file)) = &*pending else {
        return;
    };
    let Some(saved) = file.zones.get(&zone_conf.name) else {
        return;
    };
    let name = &zone_conf.name;
    let path = path.display();
    let plan = state::plan_restore(saved, name, zone.algorithm(), zone_conf.limits);
    for note in &plan.notes {
        match note {
            Note::Notice(text) => {
                ngx_log_error!(
                    NGX_LOG_NOTICE,
                    log,
                    "rate_limit_state_file \"{path}\": {text}"
                );
            }
            Note::Warn(text) => {
                ngx_log_error!(
                    NGX_LOG_WARN,
                    log,
                    "rate_limit_state_file \"{path}\": {text}"
                );
            }
        }
    }
    // A quota zone's keys: their ids need the seed they were hashed with, overrides too.
    let calendar = zone_conf
        .quota
        .as_ref()
        .map(|quota| quota.calendar.to_string());
    let quota = saved.quota.as_ref().filter(|_| zone.algorithm().is_quota());
    if let Some(quota) = quota.filter(|quota| Some(&quota.calendar) != calendar.as_ref()) {
        ngx_log_error!(
            NGX_LOG_NOTICE,
            log,
            "rate_limit_state_file \"{path}\": zone \"{name}\" counted per {} and now per {}: \
             its counts start afresh",
            quota.calendar,
            calendar.as_deref().unwrap_or("-")
        );
    }
    let quota = quota.filter(|quota| Some(&quota.calendar) == calendar.as_ref());
    // A `sync` zone hashes keys with the seed of its name, as every instance of the fleet
    // does: counts saved under another seed (the zone had no `sync`) name no key here.
    if let Some(quota) = quota.filter(|quota| zone.is_sync() && quota.seed != zone.seed()) {
        ngx_log_error!(
            NGX_LOG_NOTICE,
            log,
            "rate_limit_state_file \"{path}\": zone \"{name}\" counted {} key(s) without \
             \"sync\": the fleet's counts in Redis are used instead",
            quota.words.len()
        );
    }
    let quota = quota.filter(|quota| !zone.is_sync() || quota.seed == zone.seed());
    let zone = match quota {
        Some(quota) => {
            let zone = zone.reseeded(quota.seed);
            zone_conf.zone = Some(zone);
            let now = now_ns();
            let lost = quota
                .words
                .iter()
                .filter(|(id, word)| !zone.restore_word(*id, *word, now))
                .count();
            ngx_log_error!(
                NGX_LOG_NOTICE,
                log,
                "rate_limit_state_file \"{path}\": zone \"{name}\" restored the counts of {} \
                 key(s)",
                quota.words.len() - lost
            );
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
        None => zone,
    };
    if let Some(limits) = plan.limits {
        // No worker runs yet (zone init is in the master).
        zone.restore_limits(limits);
    }
    let mut restored = 0;
    for (key, limits) in &plan.overrides {
        match zone.set_override(key, *limits) {
            Ok(_) => restored += 1,
            Err(_) => {
                ngx_log_error!(
                    NGX_LOG_WARN,
                    log,
                    "rate_limit_state_file \"{path}\": zone \"{name}\" has no room for the \
                     override of key \"{}\"",
                    zone_conf.key_form.show(key)
                );
            }
        }
    }
    if plan.limits.is_some() || restored > 0 {
        let limits = zone.limits().unwrap_or(zone_conf.limits);
        ngx_log_error!(
            NGX_LOG_NOTICE,
            log,
            "rate_limit_state_file \"{path}\": zone \"{name}\" restored: rate {} burst {}, \
             {restored} override(s)",
            limits.rate,
            limits.burst
        );
    }
}

/// Read the file, logging why it is not used when it is not.
fn load(path: &Path, log: *mut ngx_log_t) -> Option<StateFile> {
    let shown = path.display();
    match state::load(path) {
        Ok(file) => Some(file),
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
    if let Ok(old) = state::load(Path::new(path)) {
        let zones = shared_zones(registry, 0);
        let configured = |name: &str| zones.iter().any(|zone| zone.name() == name);
        for text in state::gone_zones(&old, configured) {
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
