//! The stream part: `rate_limit_zone` and `rate_limit` in nginx's `stream {}` (TCP and UDP),
//! a front door of its own. A new TCP connection, or a new UDP session, is charged to its
//! zones in the stream preaccess phase; over the limit it is closed, with `burst` and no
//! `nodelay` it waits for its turn, and a concurrency zone holds a slot for the whole
//! session. The zones are the http part's: the same store, algorithms and decision pipeline
//! (`crate::control::decide`), and the same zone registry (`crate::conf::registry`), through
//! which the admin API, the state file, the fleet and the owner sweep see them, with or
//! without an `http` block.
//!
//! The module is a second `ngx_module_t` of type `NGX_STREAM_MODULE` in the same shared
//! object (`lib.rs` exports both). It names no stream symbol at link time ([`api`]): the
//! shared object loads in an nginx without the stream module, where this part stays inert.

mod api;
mod conf;
mod session;

use core::ptr;

use nginx_sys::{
    ngx_stream_conf_ctx_t, ngx_stream_core_main_conf_t, ngx_stream_core_srv_conf_t,
    ngx_stream_handler_pt, ngx_stream_module_t, ngx_stream_phases_NGX_STREAM_PREACCESS_PHASE,
    NGX_STREAM_MAIN_CONF, NGX_STREAM_MODULE, NGX_STREAM_SRV_CONF,
};
use ngx::core::Status;
use ngx::ffi::{
    ngx_array_push, ngx_command_t, ngx_conf_set_flag_slot, ngx_conf_t, ngx_int_t, ngx_module_t,
    ngx_str_t, ngx_uint_t, NGX_CONF_1MORE, NGX_CONF_FLAG, NGX_CONF_TAKE1,
};
use ngx::ngx_string;

use crate::conf::ext::ConfExt;
use crate::conf::ConfError;

/// This part's module (the tag of nothing: stream zones use the http module's tag, so that
/// a zone name is one shared memory whichever block declares it).
pub fn module_ptr() -> *mut ngx_module_t {
    ptr::addr_of_mut!(ngx_stream_rate_limit_module)
}

/// Once the stream block is read: the references checked, `$rate_limit_status` added and
/// indexed, the preaccess handler installed.
unsafe extern "C" fn postconfiguration(cf: *mut ngx_conf_t) -> ngx_int_t {
    crate::glue::guard::entry(
        "stream::postconfiguration",
        || ngx_int_t::from(ngx::core::Status::NGX_ERROR),
        || {
            // SAFETY: nginx passes a valid configuration context.
            let cf = unsafe { &mut *cf };
            match install(cf) {
                Ok(()) => Status::NGX_OK.into(),
                Err(error) => {
                    cf.log(&error);
                    Status::NGX_ERROR.into()
                }
            }
        },
    )
}

fn install(cf: &mut ngx_conf_t) -> Result<(), ConfError> {
    conf::postconfiguration(cf)?;
    let main = conf::main_conf(cf).ok_or(ConfError::Logged)?;
    // Here rather than in a preconfiguration: where this module is loaded before a dynamic
    // stream module, its preconfiguration runs before the stream core's, which sets up the
    // variables (ngx_stream_add_variable would crash). Variables added now still resolve the
    // references the block made (`log_format ... $rate_limit_status`): nginx binds them after
    // every postconfiguration.
    session::add_variables(cf, main)?;
    let mut name: ngx_str_t = cf.copy_str(b"rate_limit_status")?;
    // SAFETY: `cf` is valid during configuration; the name is in its pool.
    let index = unsafe { (main.api.get_variable_index)(cf, &mut name) };
    main.status_variable = Some(ngx_uint_t::try_from(index).map_err(|_| ConfError::Logged)?);
    // SAFETY: inside the stream block `cf.ctx` is its ngx_stream_conf_ctx_t, whose main_conf
    // array holds the core module's main configuration at the core module's ctx_index.
    let cmcf = unsafe {
        let ctx = &*cf.ctx.cast::<ngx_stream_conf_ctx_t>();
        let index = (*main.api.core_module).ctx_index;
        &mut *(*ctx.main_conf.add(index)).cast::<ngx_stream_core_main_conf_t>()
    };
    let phase = &mut cmcf.phases[ngx_stream_phases_NGX_STREAM_PREACCESS_PHASE as usize];
    let preaccess =
        crate::glue::guard::phase_handler("stream::preaccess_handler", session::preaccess_handler);
    push_handler(&mut phase.handlers, preaccess)?;
    if main.preread_used {
        wrap_content_handlers(cmcf)?;
    }
    Ok(())
}

/// In every server with a line decided after ssl_preread, the session's content handler takes
/// the place of the server's own (which it calls).
fn wrap_content_handlers(cmcf: &ngx_stream_core_main_conf_t) -> Result<(), ConfError> {
    // SAFETY: the core's servers array holds a pointer to each server's core configuration.
    let servers =
        unsafe { crate::glue::array_slice::<*mut ngx_stream_core_srv_conf_t>(&cmcf.servers) };
    for &server in servers {
        // SAFETY: each server's core configuration and its context live in the configuration
        // pool; our server configuration is at our ctx_index.
        let (cscf, srv) = unsafe {
            let cscf = &mut *server;
            let index = (*module_ptr()).ctx_index;
            let srv = (*(*cscf.ctx).srv_conf.add(index)).cast::<conf::SrvConf>();
            (cscf, &mut *srv)
        };
        if cscf.handler.is_none() || !srv.limits().iter().any(session::decided_after_preread) {
            continue;
        }
        srv.content = cscf.handler;
        cscf.handler = Some(session::content_handler);
    }
    Ok(())
}

/// Add `handler` to a phase's handler array.
fn push_handler(
    handlers: &mut nginx_sys::ngx_array_t,
    handler: unsafe extern "C" fn(*mut nginx_sys::ngx_stream_session_t) -> ngx_int_t,
) -> Result<(), ConfError> {
    // SAFETY: the phase's handler array is initialized by the core module before
    // postconfiguration; it holds `ngx_stream_handler_pt` elements.
    let slot = unsafe { ngx_array_push(handlers) }.cast::<ngx_stream_handler_pt>();
    if slot.is_null() {
        return Err(ConfError::Logged);
    }
    // SAFETY: `slot` is a fresh element of the array.
    unsafe { *slot = Some(handler) };
    Ok(())
}

// nginx-sys defines these only where the stream module is built in; the same offsets here.
const MAIN_CONF_OFFSET: usize = core::mem::offset_of!(ngx_stream_conf_ctx_t, main_conf);
const SRV_CONF_OFFSET: usize = core::mem::offset_of!(ngx_stream_conf_ctx_t, srv_conf);

const SRV_ANY: u32 = NGX_STREAM_MAIN_CONF | NGX_STREAM_SRV_CONF;

static mut COMMANDS: [ngx_command_t; 7] = [
    ngx_command_t {
        name: ngx_string!("rate_limit_zone"),
        type_: (NGX_STREAM_MAIN_CONF | NGX_CONF_1MORE) as ngx_uint_t,
        set: Some(conf::cmd_rate_limit_zone),
        conf: MAIN_CONF_OFFSET,
        offset: 0,
        post: ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("rate_limit"),
        type_: (SRV_ANY | NGX_CONF_1MORE) as ngx_uint_t,
        set: Some(conf::cmd_rate_limit),
        conf: SRV_CONF_OFFSET,
        offset: 0,
        post: ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("rate_limit_dry_run"),
        type_: (SRV_ANY | NGX_CONF_FLAG) as ngx_uint_t,
        set: Some(ngx_conf_set_flag_slot),
        conf: SRV_CONF_OFFSET,
        offset: core::mem::offset_of!(conf::SrvConf, dry_run),
        post: ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("rate_limit_log_level"),
        type_: (SRV_ANY | NGX_CONF_TAKE1) as ngx_uint_t,
        set: Some(conf::cmd_log_level),
        conf: SRV_CONF_OFFSET,
        offset: 0,
        post: ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("rate_limit_remote_net"),
        type_: (SRV_ANY | NGX_CONF_1MORE) as ngx_uint_t,
        set: Some(conf::cmd_remote_net),
        conf: SRV_CONF_OFFSET,
        offset: 0,
        post: ptr::null_mut(),
    },
    ngx_command_t {
        name: ngx_string!("rate_limit_state_file"),
        type_: (NGX_STREAM_MAIN_CONF | NGX_CONF_TAKE1) as ngx_uint_t,
        set: Some(crate::conf::directives::cmd_state_file),
        conf: MAIN_CONF_OFFSET,
        offset: 0,
        post: ptr::null_mut(),
    },
    ngx_command_t::empty(),
];

static MODULE_CTX: ngx_stream_module_t = ngx_stream_module_t {
    preconfiguration: None,
    postconfiguration: Some(postconfiguration),
    create_main_conf: Some(conf::create_main_conf),
    init_main_conf: None,
    create_srv_conf: Some(conf::create_srv_conf),
    merge_srv_conf: Some(conf::merge_srv_conf),
};

#[used]
#[allow(non_upper_case_globals)]
#[cfg_attr(not(feature = "export-modules"), no_mangle)]
pub static mut ngx_stream_rate_limit_module: ngx_module_t = ngx_module_t {
    ctx: ptr::addr_of!(MODULE_CTX) as _,
    // SAFETY: only the address of the static command table is taken; nginx reads it.
    commands: unsafe { ptr::addr_of_mut!(COMMANDS[0]) },
    type_: NGX_STREAM_MODULE as _,
    ..ngx_module_t::default()
};
