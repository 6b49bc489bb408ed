//! `ngx_http_rate_limit_module`: rate limiting for NGINX with leaky and token buckets and
//! sliding windows kept in shared memory, an admin API, and limit_req-compatible directives.
//!
//! This file only registers the module and calls each part's init hooks. The parts stand on
//! four floors, each importing only the floors below it (docs/architecture.md):
//!
//! 1. `glue`: nginx helpers every part uses;
//! 2. `store`: the zones' shared memory and the instance's sync record;
//! 3. `conf` (directives into structures) and `control` (every change, and the decision
//!    pipeline);
//! 4. the front doors: `handler` (the request path), `admin` (the JSON API), `lua` (the C ABI
//!    of the Lua API) and `sync` (the sync loop).

use core::mem::offset_of;
use core::ptr;

use ngx::core::Status;
use ngx::ffi::{
    ngx_array_push, ngx_command_t, ngx_conf_set_flag_slot, ngx_conf_set_num_slot, ngx_conf_t,
    ngx_core_module_t, ngx_cycle_t, ngx_http_handler_pt, ngx_http_module_t,
    ngx_http_phases_NGX_HTTP_LOG_PHASE, ngx_http_phases_NGX_HTTP_PREACCESS_PHASE,
    ngx_http_request_t, ngx_int_t, ngx_module_t, ngx_uint_t, NGX_CONF_1MORE, NGX_CONF_ANY,
    NGX_CONF_BLOCK, NGX_CONF_TAKE1, NGX_CORE_MODULE, NGX_HTTP_LOC_CONF, NGX_HTTP_LOC_CONF_OFFSET,
    NGX_HTTP_MAIN_CONF, NGX_HTTP_MAIN_CONF_OFFSET, NGX_HTTP_MODULE, NGX_HTTP_SRV_CONF,
    NGX_LOG_EMERG,
};
use ngx::http::{HttpModule, HttpModuleMainConf, NgxHttpCoreModule};
use ngx::ngx_string;

mod admin;
mod conf;
mod control;
mod glue;
mod handler;
mod lua;
mod store;
mod stream;
mod sync;

use conf::directives;
use conf::ext::ConfExt;
use conf::{LocConf, RateLimitModule};
#[cfg(feature = "export-modules")]
use stream::ngx_stream_rate_limit_module;

/// Before the `http` block is read: the variable, and what configuration installs on behalf
/// of the layers above it.
unsafe extern "C" fn preconfiguration(cf: *mut ngx_conf_t) -> ngx_int_t {
    crate::glue::guard::entry(
        "preconfiguration",
        || ngx_int_t::from(ngx::core::Status::NGX_ERROR),
        || {
            // SAFETY: nginx passes a valid configuration context.
            let cf = unsafe { &mut *cf };
            if !glue::value_bits::layout_matches() {
                ngx::ngx_conf_log_error!(
                    NGX_LOG_EMERG,
                    cf,
                    "rate_limit: unexpected ngx_variable_value_t layout on this platform"
                );
                return Status::NGX_ERROR.into();
            }
            let Some(mcf) = conf::main_conf(cf) else {
                return Status::NGX_ERROR.into();
            };
            mcf.hooks.admin_handler = Some(admin::admin_handler);
            mcf.hooks.zone_init = Some(control::zone_init);
            // Until the block is read: the proxy module's directives noted for the usage
            // warning (conf/usage_proxy.rs).
            conf::usage_proxy::wrap_proxy_directives(cf);
            match handler::add_variables(cf) {
                Ok(()) => Status::NGX_OK.into(),
                Err(error) => {
                    cf.log(&error);
                    Status::NGX_ERROR.into()
                }
            }
        },
    )
}

/// Once the `http` block is read: the references checked, the state file and the admin
/// filters set up, the preaccess handler installed.
unsafe extern "C" fn postconfiguration(cf: *mut ngx_conf_t) -> ngx_int_t {
    crate::glue::guard::entry(
        "postconfiguration",
        || ngx_int_t::from(ngx::core::Status::NGX_ERROR),
        || {
            // SAFETY: nginx passes a valid configuration context.
            let cf = unsafe { &mut *cf };
            // The block is read: nginx's own handlers back in its command table.
            conf::usage_proxy::restore_proxy_directives(cf);
            if let Err(error) = conf::postconfiguration(cf) {
                cf.log(&error);
                return Status::NGX_ERROR.into();
            }
            admin::postconfiguration();
            // The log phase measures the latency of requests holding concurrency slots (only with a
            // concurrency zone) and gives back what `on_status=` charged for other statuses (only
            // with an `on_status=` line).
            let concurrency = conf::main_conf(cf)
                .is_some_and(|mcf| conf::zones(mcf).any(|zone| zone.algorithm.counts_in_flight()));
            let on_status = conf::main_conf(cf).is_some_and(|mcf| mcf.on_status_used);
            // Usage-based lines: the body reader's filters, and the settlement at the log phase.
            let usage = conf::main_conf(cf).is_some_and(|mcf| mcf.usage_used);
            if usage {
                handler::usage::install_filters();
            }
            let Some(cmcf) = NgxHttpCoreModule::main_conf_mut(cf) else {
                return Status::NGX_ERROR.into();
            };
            let preaccess: Handler = glue::guard::phase_handler(
                "handler::preaccess_handler",
                handler::preaccess_handler,
            );
            let mut phases = vec![(ngx_http_phases_NGX_HTTP_PREACCESS_PHASE, preaccess)];
            if concurrency {
                phases.push((
                    ngx_http_phases_NGX_HTTP_LOG_PHASE,
                    handler::concurrency_log_handler,
                ));
            }
            if on_status {
                phases.push((
                    ngx_http_phases_NGX_HTTP_LOG_PHASE,
                    handler::charge_log_handler,
                ));
            }
            if usage {
                phases.push((
                    ngx_http_phases_NGX_HTTP_LOG_PHASE,
                    handler::usage_log_handler,
                ));
            }
            for (index, handler) in phases {
                let phase = &mut cmcf.phases[index as usize];
                // SAFETY: the phase's handler array is initialized by the core module before
                // postconfiguration; it holds `ngx_http_handler_pt` elements.
                let slot =
                    unsafe { ngx_array_push(&mut phase.handlers) }.cast::<ngx_http_handler_pt>();
                if slot.is_null() {
                    return Status::NGX_ERROR.into();
                }
                // SAFETY: `slot` is a fresh element of the array.
                unsafe { *slot = Some(handler) };
                if index == ngx_http_phases_NGX_HTTP_PREACCESS_PHASE {
                    // nginx runs a phase's handlers from the last pushed to the first, and a
                    // dynamic module pushes after every compiled-in one: at the end, this
                    // handler would run before realip's, and key a client behind a proxy by
                    // the proxy's address when `real_ip_header` is set in a location or
                    // server. First in the array, it runs last in the phase: after realip's,
                    // as compiled-in limit_req's and limit_conn's do.
                    // SAFETY: the array's `nelts` elements are `ngx_http_handler_pt`s, the
                    // last of them the one pushed above.
                    let handlers = unsafe {
                        std::slice::from_raw_parts_mut(
                            phase.handlers.elts.cast::<ngx_http_handler_pt>(),
                            phase.handlers.nelts,
                        )
                    };
                    handlers.rotate_right(1);
                }
            }
            Status::NGX_OK.into()
        },
    )
}

/// A phase handler.
type Handler = unsafe extern "C" fn(*mut ngx_http_request_t) -> ngx_int_t;

const LOC_ANY: u32 = NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF;

static mut COMMANDS: [ngx_command_t; 14] = [
    ngx_command_t {
        name: ngx_string!("rate_limit_zone"),
        type_: (NGX_HTTP_MAIN_CONF | NGX_CONF_1MORE) as ngx_uint_t,
        set: Some(directives::cmd_rate_limit_zone),
        conf: NGX_HTTP_MAIN_CONF_OFFSET,
        offset: 0,
        post: ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("rate_limit"),
        type_: (LOC_ANY | NGX_CONF_1MORE) as ngx_uint_t,
        set: Some(directives::cmd_rate_limit),
        conf: NGX_HTTP_LOC_CONF_OFFSET,
        offset: 0,
        post: ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("rate_limit_status"),
        type_: (LOC_ANY | NGX_CONF_TAKE1) as ngx_uint_t,
        set: Some(ngx_conf_set_num_slot),
        conf: NGX_HTTP_LOC_CONF_OFFSET,
        offset: offset_of!(LocConf, status),
        post: ptr::addr_of!(directives::STATUS_BOUNDS).cast_mut().cast(),
    },
    ngx_command_t {
        name: ngx_string!("rate_limit_dry_run"),
        type_: (LOC_ANY | NGX_CONF_TAKE1) as ngx_uint_t,
        set: Some(ngx_conf_set_flag_slot),
        conf: NGX_HTTP_LOC_CONF_OFFSET,
        offset: offset_of!(LocConf, dry_run),
        post: ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("rate_limit_log_level"),
        type_: (LOC_ANY | NGX_CONF_TAKE1) as ngx_uint_t,
        set: Some(directives::cmd_log_level),
        conf: NGX_HTTP_LOC_CONF_OFFSET,
        offset: 0,
        post: ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("rate_limit_headers"),
        type_: (LOC_ANY | NGX_CONF_TAKE1) as ngx_uint_t,
        set: Some(ngx_conf_set_flag_slot),
        conf: NGX_HTTP_LOC_CONF_OFFSET,
        offset: offset_of!(LocConf, headers),
        post: ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("rate_limit_openai_headers"),
        type_: (LOC_ANY | NGX_CONF_TAKE1) as ngx_uint_t,
        set: Some(ngx_conf_set_flag_slot),
        conf: NGX_HTTP_LOC_CONF_OFFSET,
        offset: offset_of!(LocConf, openai_headers),
        post: ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("rate_limit_remote_net"),
        type_: (LOC_ANY | NGX_CONF_1MORE) as ngx_uint_t,
        set: Some(directives::cmd_remote_net),
        conf: NGX_HTTP_LOC_CONF_OFFSET,
        offset: 0,
        post: ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("rate_limit_grpc"),
        type_: (LOC_ANY | NGX_CONF_TAKE1) as ngx_uint_t,
        set: Some(ngx_conf_set_flag_slot),
        conf: NGX_HTTP_LOC_CONF_OFFSET,
        offset: offset_of!(LocConf, grpc),
        post: ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("rate_limit_admin"),
        type_: (NGX_HTTP_LOC_CONF | NGX_CONF_ANY) as ngx_uint_t,
        set: Some(directives::cmd_admin),
        conf: NGX_HTTP_LOC_CONF_OFFSET,
        offset: 0,
        post: ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("rate_limit_state_file"),
        type_: (NGX_HTTP_MAIN_CONF | NGX_CONF_TAKE1) as ngx_uint_t,
        set: Some(directives::cmd_state_file),
        conf: NGX_HTTP_MAIN_CONF_OFFSET,
        offset: 0,
        post: ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("rate_limit_sync"),
        type_: (NGX_HTTP_MAIN_CONF | NGX_CONF_1MORE) as ngx_uint_t,
        set: Some(conf::sync::cmd_rate_limit_sync),
        conf: NGX_HTTP_MAIN_CONF_OFFSET,
        offset: 0,
        post: ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("rate_limit_prices"),
        type_: (NGX_HTTP_MAIN_CONF | NGX_CONF_BLOCK | NGX_CONF_TAKE1) as ngx_uint_t,
        set: Some(conf::prices::cmd_rate_limit_prices),
        conf: NGX_HTTP_MAIN_CONF_OFFSET,
        offset: 0,
        post: ptr::null_mut(),
    },
    ngx_command_t::empty(),
];

static MODULE_CTX: ngx_http_module_t = ngx_http_module_t {
    preconfiguration: Some(preconfiguration),
    postconfiguration: Some(postconfiguration),
    create_main_conf: Some(RateLimitModule::create_main_conf),
    init_main_conf: None,
    create_srv_conf: None,
    merge_srv_conf: None,
    create_loc_conf: Some(RateLimitModule::create_loc_conf),
    merge_loc_conf: Some(RateLimitModule::merge_loc_conf),
};

// The table `load_module` reads, as `ngx::ngx_modules!` writes it (whose counting macro takes
// one module only): the http module and the stream part's module.
#[cfg(feature = "export-modules")]
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static mut ngx_modules: [*const ngx_module_t; 4] = [
    ptr::addr_of!(ngx_rate_limit_module),
    ptr::addr_of!(ngx_http_rate_limit_module),
    ptr::addr_of!(ngx_stream_rate_limit_module),
    ptr::null(),
];

#[cfg(feature = "export-modules")]
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static mut ngx_module_names: [*const core::ffi::c_char; 4] = [
    c"ngx_rate_limit_module".as_ptr(),
    c"ngx_http_rate_limit_module".as_ptr(),
    c"ngx_stream_rate_limit_module".as_ptr(),
    ptr::null(),
];

#[cfg(feature = "export-modules")]
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static mut ngx_module_order: [*const core::ffi::c_char; 1] = [ptr::null()];

// nginx reads the context (its name too) and never writes it.
static mut REGISTRY_CTX: ngx_core_module_t = ngx_core_module_t {
    name: ngx_string!("rate_limit"),
    create_conf: Some(conf::registry::create_conf),
    init_conf: Some(registry_init_conf),
};

/// The zone registry's module (a core module: its configuration exists in every cycle, with
/// or without an `http` block). It has no directive of its own.
#[used]
#[allow(non_upper_case_globals)]
#[cfg_attr(not(feature = "export-modules"), no_mangle)]
pub static mut ngx_rate_limit_module: ngx_module_t = ngx_module_t {
    ctx: ptr::addr_of_mut!(REGISTRY_CTX).cast(),
    commands: ptr::null_mut(),
    type_: NGX_CORE_MODULE as _,
    ..ngx_module_t::default()
};

/// Once the whole configuration is read, before its shared memory is set up.
unsafe extern "C" fn registry_init_conf(
    cycle: *mut ngx_cycle_t,
    _conf: *mut core::ffi::c_void,
) -> *mut core::ffi::c_char {
    crate::glue::guard::entry(
        "registry_init_conf",
        || ngx::core::NGX_CONF_ERROR,
        || {
            // SAFETY: nginx passes the cycle being configured.
            if let Some(cycle) = unsafe { cycle.as_ref() } {
                control::configuration_read(cycle);
            }
            ngx::core::NGX_CONF_OK
        },
    )
}

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

/// Runs in the master (or the single process) once a configuration cycle is complete.
extern "C" fn init_module(cycle: *mut ngx_cycle_t) -> ngx_int_t {
    crate::glue::guard::entry(
        "init_module",
        || ngx_int_t::from(ngx::core::Status::NGX_ERROR),
        || {
            // SAFETY: nginx passes the cycle being initialized.
            if let Some(cycle) = unsafe { cycle.as_ref() } {
                conf::key::resolve_query_arg_keys(cycle);
            }
            Status::NGX_OK.into()
        },
    )
}

/// Runs in each worker (or the single process) after fork.
extern "C" fn init_process(cycle: *mut ngx_cycle_t) -> ngx_int_t {
    crate::glue::guard::entry(
        "init_process",
        || ngx_int_t::from(ngx::core::Status::NGX_ERROR),
        || {
            // SAFETY: nginx passes the running cycle.
            if let Some(cycle) = unsafe { cycle.as_mut() } {
                control::init_process(cycle);
                sync::init_process(cycle);
            }
            Status::NGX_OK.into()
        },
    )
}

/// Runs in each worker when it exits.
extern "C" fn exit_process(cycle: *mut ngx_cycle_t) {
    crate::glue::guard::entry(
        "exit_process",
        || (),
        || {
            // SAFETY: nginx passes the running cycle.
            if let Some(cycle) = unsafe { cycle.as_ref() } {
                control::exit_process(cycle);
            }
            sync::exit_process();
        },
    )
}
