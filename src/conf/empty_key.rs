//! Keys that can only be empty where they are used: a zone keyed by `$server_name` used in a
//! server without `server_name` (or with `server_name ""`, every default server of a pasted
//! config) limits nothing there, because an empty key is not limited. `nginx -t` says so, at
//! nginx's warning level, naming the server and the `rate_limit` line.
//!
//! `$host` is not warned about: it is the request's Host header first, and a server without a
//! name still sees the names clients send.

use core::ptr;

use ngx::ffi::{ngx_conf_t, ngx_http_core_srv_conf_t, NGX_LOG_WARN};
use ngx::http::{HttpModuleMainConf, NgxHttpCoreModule};
use ngx::ngx_log_error;

use super::{zones, LocConf, MainConf, ZoneReference};
use crate::glue::array_slice;

/// Whether a zone's KEY is `$server_name` alone.
fn is_server_name(key_text: &str) -> bool {
    matches!(key_text, "$server_name" | "${server_name}")
}

/// The server's name as nginx left it after merging (`$server_name`'s value): the first of
/// its `server_name`s, or "" when it has none.
fn server_name_is_empty(server: &ngx_http_core_srv_conf_t) -> bool {
    server.server_name.len == 0
}

/// The merged `rate_limit` lines of a server's own level (which its locations inherit unless
/// they have lines of their own).
fn server_lines(server: &ngx_http_core_srv_conf_t) -> Option<&LocConf> {
    // SAFETY: a server's ctx is its configuration context, live while configuring; its
    // loc_conf array has an element for every HTTP module.
    unsafe {
        let ctx = server.ctx.as_ref()?;
        let index = (*super::module_ptr()).ctx_index;
        (*ctx.loc_conf.add(index)).cast::<LocConf>().as_ref()
    }
}

/// The `rate_limit` line that makes `server` use zone `zone`: one written in the server
/// (at its level or in a location), or one at `http` level that the server's own level
/// inherits.
fn reference_in<'a>(
    mcf: &'a MainConf,
    zone: &str,
    server: *const ngx_http_core_srv_conf_t,
    servers: &[*mut ngx_http_core_srv_conf_t],
) -> Option<&'a ZoneReference> {
    let mut references = mcf.references.iter().filter(|r| r.name == zone);
    let written_here = references.clone().find(|r| ptr::eq(r.server, server));
    written_here.or_else(|| {
        // SAFETY: `server` is an element of the core module's servers, live while configuring.
        let inherits = server_lines(unsafe { &*server })
            .is_some_and(|lines| lines.limits().iter().any(|line| line.name == zone));
        let at_http_level = |r: &&ZoneReference| !servers.iter().any(|&s| ptr::eq(r.server, s));
        references.find(at_http_level).filter(|_| inherits)
    })
}

/// Warn about every server where a zone keyed by `$server_name` is used and the server has no
/// name. Runs once the `http` block is read and merged (when `server_name` is settled).
pub fn warn_empty_keys(cf: &ngx_conf_t, mcf: &MainConf) {
    let Some(cmcf) = NgxHttpCoreModule::main_conf(cf) else {
        return;
    };
    // SAFETY: the core module's `servers` holds `ngx_http_core_srv_conf_t *` elements, live
    // as long as the cycle's configuration.
    let servers = unsafe { array_slice::<*mut ngx_http_core_srv_conf_t>(&cmcf.servers) };
    for zone in zones(mcf).filter(|zone| is_server_name(&zone.key_text)) {
        for &server in servers {
            // SAFETY: as above.
            let Some(cscf) = (unsafe { server.as_ref() }) else {
                continue;
            };
            if !server_name_is_empty(cscf) {
                continue;
            }
            let Some(reference) = reference_in(mcf, &zone.name, server, servers) else {
                continue;
            };
            let file = if cscf.file_name.is_null() {
                String::from("(unknown file)")
            } else {
                // SAFETY: nginx set `file_name` to the NUL-terminated name of the file the
                // server block is in.
                let name = unsafe { core::ffi::CStr::from_ptr(cscf.file_name.cast()) };
                name.to_string_lossy().into_owned()
            };
            ngx_log_error!(
                NGX_LOG_WARN,
                cf.log,
                "zone \"{}\" is keyed by {}, which is empty in the server at {file}:{} (it has \
                 no server_name): its requests are not limited; give the server a \
                 server_name, or key the zone by a value that is never empty (a constant \
                 such as \"{}\") in {}:{}",
                zone.name,
                zone.key_text,
                cscf.line,
                zone.name,
                reference.file,
                reference.line
            );
        }
    }
}
