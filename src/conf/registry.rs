//! The zone registry: every `rate_limit_zone` of a configuration cycle, whichever block (`http`
//! or `stream`) declared it, and the cycle's `rate_limit_state_file`. It is the configuration
//! of a core module (`ngx_rate_limit_module`, registered by `lib.rs`), so it exists in every
//! cycle, with or without an `http` block: the owner sweep, the state file, the sync loop and
//! the admin API go through it and never ask which door declared a zone.

use core::ffi::c_void;
use core::ptr;

use ngx::core::Pool;
use ngx::ffi::{ngx_conf_t, ngx_cycle_t, ngx_module_t};

use super::ZoneConf;

/// The cycle's zones and its state file.
#[derive(Default)]
pub struct Registry {
    /// Every zone's configuration, in the configuration's order; each lives in the cycle's configuration pool.
    zones: Vec<*mut ZoneConf>,
    /// `rate_limit_state_file` (in `http {}` or `stream {}`): made absolute once the
    /// configuration is read.
    pub state_file: Option<String>,
}

impl Registry {
    /// Every zone of the cycle.
    pub fn zones(&self) -> impl Iterator<Item = &ZoneConf> {
        self.zones
            .iter()
            // SAFETY: zone configurations live in the configuration pool of the cycle this
            // registry belongs to, as long as the registry does.
            .filter_map(|&zone| unsafe { zone.as_ref() })
    }

    /// The zone called `name`.
    pub fn zone(&self, name: &[u8]) -> Option<&ZoneConf> {
        self.zones().find(|zone| zone.name.as_bytes() == name)
    }

    /// Add a zone declared in either block.
    pub fn add(&mut self, zone: *mut ZoneConf) {
        self.zones.push(zone);
    }
}

/// The core module whose configuration is the registry (`lib.rs` defines the static).
fn module_ptr() -> *mut ngx_module_t {
    ptr::addr_of_mut!(crate::ngx_rate_limit_module)
}

/// The registry of `cycle` (`None` before the module's configuration is created, which
/// happens when `load_module` loads it).
pub fn of(cycle: &ngx_cycle_t) -> Option<&'static mut Registry> {
    // SAFETY: `conf_ctx` has an element per module of the cycle; a core module's is its
    // configuration, ours a Registry allocated in the cycle's pool by `create_conf`. The
    // module's index is set by nginx when the module is added to the cycle.
    unsafe {
        let index = (*module_ptr()).index;
        if cycle.conf_ctx.is_null() || index >= cycle.modules_n {
            return None;
        }
        (*cycle.conf_ctx.add(index)).cast::<Registry>().as_mut()
    }
}

/// The registry of the cycle being configured.
pub fn configuring(cf: &ngx_conf_t) -> Option<&'static mut Registry> {
    // SAFETY: `cf.cycle` is the cycle being configured, live for the whole configuration.
    of(unsafe { cf.cycle.as_ref()? })
}

/// The registry of the cycle this process runs (in a worker: its configuration).
pub fn running() -> Option<&'static Registry> {
    // SAFETY: `ngx_cycle` is nginx's current cycle, set before any request or timer runs.
    let cycle = unsafe { nginx_sys::ngx_cycle.as_ref()? };
    of(cycle).map(|registry| &*registry)
}

/// The core module's `create_conf`: an empty registry in the cycle's pool. The first callback
/// of each configuration, with or without an `http` block: the panic policy is set up here.
pub unsafe extern "C" fn create_conf(cycle: *mut ngx_cycle_t) -> *mut c_void {
    crate::glue::guard::configure();
    crate::glue::guard::entry("conf::registry::create_conf", core::ptr::null_mut, || {
        // SAFETY: nginx passes the cycle being created, whose pool lives as long as it.
        let Some(cycle) = (unsafe { cycle.as_ref() }) else {
            return ptr::null_mut();
        };
        // SAFETY: the cycle's pool is live; the registry is dropped with it (a pool cleanup).
        let pool = unsafe { Pool::from_ngx_pool(cycle.pool) };
        pool.allocate(Registry::default()).cast()
    })
}
