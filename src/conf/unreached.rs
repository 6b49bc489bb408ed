//! Limits that never run: nginx's `return` answers a request in the rewrite phases, before the
//! preaccess phase where `rate_limit` decides. A location (or server) whose first rewrite
//! instruction is `return` answers every request that way, so its `rate_limit` lines limit
//! nothing: `nginx -t` says so, at nginx's warning level, naming the line.
//!
//! Only an unconditional `return` that comes first is certain: one after `set`, inside `if`,
//! or a `rewrite ... redirect` may or may not answer a given request, and is not warned about.

use core::ffi::c_void;

use ngx::ffi::{
    ngx_array_t, ngx_conf_t, ngx_http_conf_ctx_t, ngx_http_core_srv_conf_t,
    ngx_http_script_return_code, NGX_LOG_WARN,
};
use ngx::http::{HttpModuleServerConf, NgxHttpCoreModule};
use ngx::ngx_log_error;

use super::ext::ConfExt;

/// Where a `rate_limit` line was written: its file and line, the module configurations of its
/// level (a location's, a server's or `http`'s), and its server's.
pub struct LimitedPlace {
    file: String,
    line: usize,
    loc_conf: *mut *mut c_void,
    server: *const ngx_http_core_srv_conf_t,
}

impl LimitedPlace {
    /// The place of the `rate_limit` line nginx is reading now.
    pub fn here(cf: &ngx_conf_t) -> LimitedPlace {
        let (file, line) = cf.position();
        // SAFETY: while an http block is read, `cf->ctx` is its level's ngx_http_conf_ctx_t.
        let loc_conf = unsafe { cf.ctx.cast::<ngx_http_conf_ctx_t>().as_ref() }
            .map_or(core::ptr::null_mut(), |ctx| ctx.loc_conf);
        let server = NgxHttpCoreModule::server_conf(cf).map_or(core::ptr::null(), |s| s);
        LimitedPlace {
            file,
            line,
            loc_conf,
            server,
        }
    }
}

/// The rewrite module's index among http modules, found by name: a build may leave it out.
fn rewrite_index(cf: &ngx_conf_t) -> Option<usize> {
    super::ext::module_named(cf, c"ngx_http_rewrite_module").map(|module| module.ctx_index)
}

/// Whether the rewrite instructions of a level (its `loc_conf` array) start with `return`.
fn starts_with_return(loc_conf: *mut *mut c_void, rewrite: usize) -> bool {
    if loc_conf.is_null() {
        return false;
    }
    // SAFETY: a level's loc_conf array has an element for every http module; the rewrite
    // module's begins with `ngx_array_t *codes` (bytes of compiled instructions, each
    // starting with its function pointer), unchanged since nginx 0.x.
    unsafe {
        let conf = *loc_conf.add(rewrite);
        let Some(codes) = conf.cast::<*const ngx_array_t>().as_ref() else {
            return false;
        };
        let Some(codes) = codes.as_ref() else {
            return false;
        };
        if codes.elts.is_null() || codes.nelts < core::mem::size_of::<usize>() {
            return false;
        }
        let first = codes.elts.cast::<usize>().read_unaligned();
        first == ngx_http_script_return_code as *const () as usize
    }
}

/// Warn about every `rate_limit` line whose level, or whose server, answers every request
/// with `return` before the preaccess phase.
pub fn warn_unreached(cf: &ngx_conf_t, places: &[LimitedPlace]) {
    let Some(rewrite) = rewrite_index(cf) else {
        return;
    };
    for place in places {
        let in_server = || {
            // SAFETY: a server's core configuration and its ctx live as long as the cycle's
            // configuration.
            unsafe { place.server.as_ref().and_then(|server| server.ctx.as_ref()) }
                .is_some_and(|ctx| starts_with_return(ctx.loc_conf, rewrite))
        };
        let level = if starts_with_return(place.loc_conf, rewrite) {
            "its location"
        } else if in_server() {
            "its server"
        } else {
            continue;
        };
        ngx_log_error!(
            NGX_LOG_WARN,
            cf.log,
            "rate_limit in {}:{} limits nothing: {level} answers every request with \"return\", \
             which runs before the preaccess phase where limits apply; serve the limited \
             requests with a content handler (proxy_pass, fastcgi_pass, root...) or move \
             \"return\" to a location without the limit",
            place.file,
            place.line
        );
    }
}
