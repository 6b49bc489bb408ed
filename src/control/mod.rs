//! Control: the one place where changes happen (a zone's limits, a key's override,
//! forgetting a key, the state file, waking the sync loop) and the one decision pipeline
//! every front door calls ([`decide`]). Imports conf, the store and glue; no front door.
//!
//! * [`decide`]: a request's limits resolved, decided and accounted for;
//! * [`key`]: a door's key checked and its entry found, the same for every door;
//! * [`outcome`]: a verdict settled into one action (go on, delay, refuse), logged and
//!   counted once for every door;
//! * [`zones`]: the zones as the admin API sees them, and every change to them;
//! * [`persist`]: the state file (`rate_limit_state_file`);
//! * [`concurrency`] and [`queue`]: slots held by requests in flight, and this worker's
//!   requests waiting in a key's queue; both use `tickets` (a key's limit now and a ticket's
//!   moves on its words), and the queue tells a waiting request's record through
//!   [`queue::Record`], so the slots use the queue and never the other way.

pub mod blocks;
pub mod concurrency;
pub mod decide;
mod fleet;
pub mod key;
pub mod outcome;
pub mod persist;
pub mod queue;
pub mod quota;
mod tickets;
pub mod zones;

use core::ffi::c_void;

use ngx::core::Status;
use ngx::ffi::NGX_LOG_NOTICE;
use ngx::ffi::{ngx_cycle_t, ngx_int_t, ngx_log_t, ngx_shm_zone_t, NGX_LOG_EMERG};
use ngx::ngx_log_error;

use crate::conf::registry::{self, Registry};
use crate::conf::ZoneConf;
use crate::glue::now_ns;
use crate::store::sizing::size_hint;
use crate::store::{counters, sync_record, Zone};

/// After a change of a zone's limits or overrides: the state file keeps it, and the sync
/// loop pushes it to the fleet now rather than at its next round.
pub fn changed(registry: &Registry, log: *mut ngx_log_t) {
    persist::save(registry, log);
    wake_sync_loop();
}

/// Have the sync loop (when there is one) send the zones' limits and overrides at once.
pub fn wake_sync_loop() {
    if let Some(sync) = sync_record::shared() {
        sync.wake();
    }
}

/// Once the whole configuration (`http` and `stream` blocks) is read, before its zones are
/// initialized: the zone registry's `init_conf`.
pub fn configuration_read(cycle: &ngx_cycle_t) {
    if let Some(registry) = registry::of(cycle) {
        persist::configure(cycle, registry);
    }
}

/// In each worker at start.
pub fn init_process(cycle: &ngx_cycle_t) {
    persist::worker_started(cycle);
    concurrency::reclaim(cycle, false);
    // SAFETY: ngx_worker is set by nginx before init_process runs.
    counters::set_counter_stripe(unsafe { nginx_sys::ngx_worker });
}

/// In each worker as it exits: what it still holds of concurrency keys goes back, and the
/// quota zones' counts are written to the state file.
pub fn exit_process(cycle: &ngx_cycle_t) {
    concurrency::reclaim(cycle, true);
    persist::worker_exiting(cycle);
}

/// Init callback of a `rate_limit_zone`'s shared memory: lay out (or adopt across a reload)
/// the zone's store; a fresh one gets what the state file holds for it.
pub extern "C" fn zone_init(shm_zone: *mut ngx_shm_zone_t, data: *mut c_void) -> ngx_int_t {
    crate::glue::guard::entry(
        "control::zone_init",
        || ngx_int_t::from(ngx::core::Status::NGX_ERROR),
        || {
            // SAFETY: nginx passes the zone being initialized; `data` was set to our `ZoneConf` by
            // `rate_limit_zone`, in this cycle's configuration pool.
            let shm_zone = unsafe { &mut *shm_zone };
            // SAFETY: as above.
            let Some(zone_conf) = (unsafe { shm_zone.data.cast::<ZoneConf>().as_mut() }) else {
                return Status::NGX_ERROR.into();
            };
            let shpool = shm_zone.shm.addr.cast::<ngx::ffi::ngx_slab_pool_t>();
            // A zone without the previous cycle's data is new (or resized): its memory is fresh.
            let fresh = data.is_null();
            // SAFETY: the slab pool at the start of the mapping was initialized by nginx before this
            // callback, which runs in the master before workers exist.
            let result = unsafe { Zone::init(shpool, &zone_conf.layout(), now_ns()) };
            let log = shm_zone.shm.log;
            match result {
                Ok((zone, kept)) => {
                    zone_conf.zone = Some(zone);
                    if !kept && !fresh {
                        ngx_log_error!(
                    NGX_LOG_NOTICE,
                    log,
                    "rate_limit zone \"{}\" changed its key, algorithm or block=: its state starts afresh",
                    zone_conf.name
                );
                    }
                    if fresh {
                        persist::restore(zone_conf);
                    }
                    Status::NGX_OK.into()
                }
                Err(error) => {
                    // SAFETY: ngx_pagesize is set at startup, before any configuration is read.
                    let pagesize = unsafe { nginx_sys::ngx_pagesize };
                    let hint = size_hint(&zone_conf.layout(), pagesize);
                    ngx_log_error!(
                        NGX_LOG_EMERG,
                        log,
                        "zone \"{}\" {error}{hint}",
                        zone_conf.name
                    );
                    Status::NGX_ERROR.into()
                }
            }
        },
    )
}
