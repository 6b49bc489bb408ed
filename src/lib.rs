//! `ngx_http_rate_limit_module`: rate limiting for NGINX with leaky and token buckets and
//! sliding windows kept in shared memory, an admin API, and limit_req-compatible directives.
//!
//! This file only registers the module; see `conf` (directives), `zone` (shared memory),
//! `handler` (the request path), `admin` (the JSON API) and `lua` (the C ABI of the Lua API).

use core::ffi::c_void;
use core::ptr;

use ngx::core::Status;
use ngx::ffi::{
    ngx_array_push, ngx_command_t, ngx_conf_t, ngx_http_handler_pt, ngx_http_module_t,
    ngx_http_phases_NGX_HTTP_PREACCESS_PHASE, ngx_int_t, ngx_module_t, ngx_shm_zone_t, ngx_uint_t,
    NGX_CONF_1MORE, NGX_CONF_ANY, NGX_CONF_TAKE1, NGX_HTTP_LOC_CONF, NGX_HTTP_LOC_CONF_OFFSET,
    NGX_HTTP_MAIN_CONF, NGX_HTTP_MAIN_CONF_OFFSET, NGX_HTTP_MODULE, NGX_HTTP_SRV_CONF,
    NGX_LOG_EMERG, NGX_LOG_NOTICE,
};
use ngx::http::{HttpModule, HttpModuleLocationConf, HttpModuleMainConf, NgxHttpCoreModule};
use ngx::{ngx_log_error, ngx_string};

mod admin;
mod conf;
mod handler;
mod key;
mod lua;
mod sync;
mod top;
mod zone;

use conf::{LocConf, MainConf, ZoneConf};

pub struct RateLimitModule;

impl HttpModule for RateLimitModule {
    fn module() -> &'static ngx_module_t {
        // SAFETY: the module static is only written by nginx while loading the module.
        unsafe { &*ptr::addr_of!(ngx_http_rate_limit_module) }
    }

    unsafe extern "C" fn preconfiguration(cf: *mut ngx_conf_t) -> ngx_int_t {
        // SAFETY: nginx passes a valid configuration context.
        let cf = unsafe { &mut *cf };
        if !handler::value_bits::layout_matches() {
            ngx::ngx_conf_log_error!(
                NGX_LOG_EMERG,
                cf,
                "rate_limit: unexpected ngx_variable_value_t layout on this platform"
            );
            return Status::NGX_ERROR.into();
        }
        match handler::add_variables(cf) {
            Ok(()) => Status::NGX_OK.into(),
            Err(()) => Status::NGX_ERROR.into(),
        }
    }

    unsafe extern "C" fn postconfiguration(cf: *mut ngx_conf_t) -> ngx_int_t {
        // SAFETY: nginx passes a valid configuration context.
        let cf = unsafe { &mut *cf };
        if conf::check_references(cf).is_err() || sync::check_zones(cf).is_err() {
            return Status::NGX_ERROR.into();
        }
        let index = conf::variable_index(cf, b"rate_limit_status");
        match conf::main_conf(cf) {
            Some(mcf) if index.is_some() => mcf.status_variable = index,
            _ => return Status::NGX_ERROR.into(),
        }
        admin::postconfiguration(cf);
        let Some(cmcf) = NgxHttpCoreModule::main_conf_mut(cf) else {
            return Status::NGX_ERROR.into();
        };
        let phase = &mut cmcf.phases[ngx_http_phases_NGX_HTTP_PREACCESS_PHASE as usize];
        // SAFETY: the phase's handler array is initialized by the core module before
        // postconfiguration; it holds `ngx_http_handler_pt` elements.
        let slot = unsafe { ngx_array_push(&mut phase.handlers) }.cast::<ngx_http_handler_pt>();
        if slot.is_null() {
            return Status::NGX_ERROR.into();
        }
        // SAFETY: `slot` is a fresh element of the array.
        unsafe { *slot = Some(handler::preaccess_handler) };
        Status::NGX_OK.into()
    }
}

// SAFETY: the configuration types match what create_*_conf allocates for this module.
unsafe impl HttpModuleMainConf for RateLimitModule {
    type MainConf = MainConf;
}

// SAFETY: as above.
unsafe impl HttpModuleLocationConf for RateLimitModule {
    type LocationConf = LocConf;
}

pub(crate) fn module_ptr() -> *mut ngx_module_t {
    ptr::addr_of_mut!(ngx_http_rate_limit_module)
}

const LOC_ANY: u32 = NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF;

static mut COMMANDS: [ngx_command_t; 11] = [
    ngx_command_t {
        name: ngx_string!("rate_limit_zone"),
        type_: (NGX_HTTP_MAIN_CONF | NGX_CONF_1MORE) as ngx_uint_t,
        set: Some(conf::cmd_rate_limit_zone),
        conf: NGX_HTTP_MAIN_CONF_OFFSET,
        offset: 0,
        post: ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("rate_limit"),
        type_: (LOC_ANY | NGX_CONF_1MORE) as ngx_uint_t,
        set: Some(conf::cmd_rate_limit),
        conf: NGX_HTTP_LOC_CONF_OFFSET,
        offset: 0,
        post: ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("rate_limit_status"),
        type_: (LOC_ANY | NGX_CONF_TAKE1) as ngx_uint_t,
        set: Some(conf::cmd_status),
        conf: NGX_HTTP_LOC_CONF_OFFSET,
        offset: 0,
        post: ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("rate_limit_dry_run"),
        type_: (LOC_ANY | NGX_CONF_TAKE1) as ngx_uint_t,
        set: Some(conf::cmd_dry_run),
        conf: NGX_HTTP_LOC_CONF_OFFSET,
        offset: 0,
        post: ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("rate_limit_log_level"),
        type_: (LOC_ANY | NGX_CONF_TAKE1) as ngx_uint_t,
        set: Some(conf::cmd_log_level),
        conf: NGX_HTTP_LOC_CONF_OFFSET,
        offset: 0,
        post: ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("rate_limit_headers"),
        type_: (LOC_ANY | NGX_CONF_TAKE1) as ngx_uint_t,
        set: Some(conf::cmd_headers),
        conf: NGX_HTTP_LOC_CONF_OFFSET,
        offset: 0,
        post: ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("rate_limit_admin"),
        type_: (NGX_HTTP_LOC_CONF | NGX_CONF_ANY) as ngx_uint_t,
        set: Some(conf::cmd_admin),
        conf: NGX_HTTP_LOC_CONF_OFFSET,
        offset: 0,
        post: ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("rate_limit_state_file"),
        type_: (NGX_HTTP_MAIN_CONF | NGX_CONF_TAKE1) as ngx_uint_t,
        set: Some(conf::cmd_state_file),
        conf: NGX_HTTP_MAIN_CONF_OFFSET,
        offset: 0,
        post: ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("rate_limit_sync"),
        type_: (NGX_HTTP_MAIN_CONF | NGX_CONF_1MORE) as ngx_uint_t,
        set: Some(sync::cmd_rate_limit_sync),
        conf: NGX_HTTP_MAIN_CONF_OFFSET,
        offset: 0,
        post: ptr::null_mut(),
    },
    ngx_command_t::empty(),
    ngx_command_t::empty(),
];

static MODULE_CTX: ngx_http_module_t = ngx_http_module_t {
    preconfiguration: Some(RateLimitModule::preconfiguration),
    postconfiguration: Some(RateLimitModule::postconfiguration),
    create_main_conf: Some(RateLimitModule::create_main_conf),
    init_main_conf: None,
    create_srv_conf: None,
    merge_srv_conf: None,
    create_loc_conf: Some(RateLimitModule::create_loc_conf),
    merge_loc_conf: Some(RateLimitModule::merge_loc_conf),
};

#[cfg(feature = "export-modules")]
ngx::ngx_modules!(ngx_http_rate_limit_module);

#[used]
#[allow(non_upper_case_globals)]
#[cfg_attr(not(feature = "export-modules"), no_mangle)]
pub static mut ngx_http_rate_limit_module: ngx_module_t = ngx_module_t {
    ctx: ptr::addr_of!(MODULE_CTX) as _,
    // SAFETY: only the address of the static command table is taken; nginx reads it.
    commands: unsafe { ptr::addr_of_mut!(COMMANDS[0]) },
    type_: NGX_HTTP_MODULE as _,
    init_module: Some(init_module),
    init_process: Some(init_process),
    exit_process: Some(exit_process),
    ..ngx_module_t::default()
};

/// Runs in each worker (or the single process) after fork.
extern "C" fn init_process(cycle: *mut ngx::ffi::ngx_cycle_t) -> ngx_int_t {
    let status = admin::init_process(cycle);
    // SAFETY: nginx passes the running cycle.
    if let Some(cycle) = unsafe { cycle.as_mut() } {
        sync::init_process(cycle);
    }
    status
}

/// Runs in each worker when it exits.
extern "C" fn exit_process(_cycle: *mut ngx::ffi::ngx_cycle_t) {
    sync::exit_process();
}

/// Runs in the master (or the single process) once a configuration cycle is complete.
extern "C" fn init_module(cycle: *mut ngx::ffi::ngx_cycle_t) -> ngx_int_t {
    // SAFETY: nginx passes the cycle being initialized.
    if let Some(cycle) = unsafe { cycle.as_ref() } {
        key::resolve_query_arg_keys(cycle);
    }
    Status::NGX_OK.into()
}

/// Shared zone init: lay out (or adopt across a reload) the zone's store.
pub(crate) extern "C" fn zone_init(shm_zone: *mut ngx_shm_zone_t, _data: *mut c_void) -> ngx_int_t {
    // SAFETY: nginx passes the zone being initialized; `data` was set to our `ZoneConf` by
    // `rate_limit_zone`, in this cycle's configuration pool.
    let shm_zone = unsafe { &mut *shm_zone };
    let Some(zone_conf) = (unsafe { shm_zone.data.cast::<ZoneConf>().as_mut() }) else {
        return Status::NGX_ERROR.into();
    };
    let shpool = shm_zone.shm.addr.cast::<ngx::ffi::ngx_slab_pool_t>();
    // SAFETY: the slab pool at the start of the mapping was initialized by nginx before this
    // callback, which runs in the master before workers exist.
    let result = unsafe { zone::Zone::init(shpool, &zone_conf.layout(), handler::now_ns()) };
    let log = shm_zone.shm.log;
    match result {
        Ok((zone, kept)) => {
            zone_conf.zone = Some(zone);
            if !kept && !_data.is_null() {
                ngx_log_error!(
                    NGX_LOG_NOTICE,
                    log,
                    "rate_limit zone \"{}\" changed its key or algorithm: its state starts afresh",
                    zone_conf.name
                );
            }
            admin::zone_ready(zone_conf, _data.is_null());
            Status::NGX_OK.into()
        }
        Err(error) => {
            let reason = match error {
                zone::ZoneInitError::TooSmall => "is too small",
                zone::ZoneInitError::NoMemory => "could not be allocated",
            };
            // SAFETY: ngx_pagesize is set at startup, before any configuration is read.
            let pagesize = unsafe { nginx_sys::ngx_pagesize };
            let hint = zone::size_hint(&zone_conf.layout(), pagesize);
            ngx_log_error!(
                NGX_LOG_EMERG,
                log,
                "zone \"{}\" {reason}{hint}",
                zone_conf.name
            );
            Status::NGX_ERROR.into()
        }
    }
}
