//! The JSON admin API (`rate_limit_admin`) and the state file (`rate_limit_state_file`).
//!
//! What the API does is decided in the `ratelimit-admin` crate, which has no nginx in it; this
//! module is its nginx side: `request` reads requests and sends answers, `zones` shows the
//! shared-memory zones to the API, `persist` reads and writes the state file.

mod errors;
mod persist;
mod request;
mod zones;

use ngx::core::Status;
use ngx::ffi::{ngx_conf_t, ngx_cycle_t, ngx_int_t};
use ngx::http::{HttpModuleLocationConf, NgxHttpCoreModule};

use crate::conf::ZoneConf;

/// Make the current location answer with the admin API.
pub fn install_content_handler(cf: &mut ngx_conf_t) -> Result<(), ()> {
    let clcf = NgxHttpCoreModule::location_conf_mut(cf).ok_or(())?;
    clcf.handler = Some(request::admin_handler);
    Ok(())
}

/// Once the `http` block is read: resolve `rate_limit_state_file` against the prefix, and
/// put the filters that answer nginx's own 413/414 of admin requests in JSON.
pub fn postconfiguration(cf: &mut ngx_conf_t) {
    persist::configure(cf);
    errors::install();
}

/// Called in each worker at start: worker 0 rewrites the state file.
pub extern "C" fn init_process(cycle: *mut ngx_cycle_t) -> ngx_int_t {
    // SAFETY: nginx passes the running cycle.
    if let Some(cycle) = unsafe { cycle.as_ref() } {
        persist::worker_started(cycle);
    }
    // SAFETY: ngx_worker is set by nginx before init_process runs.
    crate::zone::set_counter_stripe(unsafe { nginx_sys::ngx_worker });
    Status::NGX_OK.into()
}

/// Called in the master when a zone's shared memory is ready. `fresh`: the memory is new (a
/// first start, or a zone new or resized on reload), so the state file is all there is to
/// restore from; a zone adopted across a reload keeps what its memory holds.
pub fn zone_ready(zone_conf: &mut ZoneConf, fresh: bool) {
    if fresh {
        persist::restore(zone_conf);
    }
}

/// Change the rate and/or burst of zone `name` the way `PATCH zones/NAME` does (every worker
/// sees it at once, the state file keeps it); the Lua API's `set_rate` and `set_burst`.
pub fn patch_zone(
    mcf: &crate::conf::MainConf,
    name: &str,
    patch: &ratelimit_admin::body::LimitsBody,
    log: *mut ngx::ffi::ngx_log_t,
) -> Result<(), ratelimit_admin::error::ApiError> {
    let zones = zones::shared_zones(mcf, crate::handler::now_ns());
    ratelimit_admin::patch_zone(&zones, name, patch)?;
    persist::save(mcf, log);
    crate::sync::kick();
    Ok(())
}

/// Set (`to`) or remove (`None`) a key's override the way `PUT`/`DELETE
/// zones/NAME/overrides/KEY` do (the key's backlog rescaled), provided the key's override is
/// still `expected` (packed limits, 0 for none): `Ok(false)` when it is not (changed here
/// meanwhile). The caller writes the state file ([`save_state`]) after a batch.
pub fn replace_override(
    zone_conf: &ZoneConf,
    key: &[u8],
    expected: u64,
    to: Option<ratelimit_core::Limits>,
) -> Result<bool, ratelimit_admin::OverridesFull> {
    use ratelimit_admin::AdminZone;
    let Some(zone) = zones::SharedZone::new(zone_conf, crate::handler::now_ns()) else {
        return Ok(false);
    };
    let current = zone.override_for(key).map_or(0, |limits| limits.pack());
    if current != expected {
        return Ok(false);
    }
    match to {
        Some(limits) => zone.set_override(key, limits).map(|_| true),
        None => Ok(zone.remove_override(key)),
    }
}

/// Rewrite the state file (when configured) from the zones' shared memory.
pub fn save_state(mcf: &crate::conf::MainConf, log: *mut ngx::ffi::ngx_log_t) {
    persist::save(mcf, log);
}
