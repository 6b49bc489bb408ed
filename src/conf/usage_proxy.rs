//! Usage that cannot always be read: a `usage=` reader (openai, anthropic, gemini, azure)
//! reads the upstream's response body as it passes. A compressed body, or one nginx buffered
//! to a temporary file (`proxy_buffering on`, nginx's default, with a large response), cannot
//! be read and is charged as cut. `nginx -t` says so for every `proxy_pass` whose location has
//! such a line and lacks `proxy_buffering off` or `proxy_set_header Accept-Encoding ""`,
//! naming what is missing.
//!
//! The proxy module keeps these settings in its private `ngx_http_proxy_loc_conf_t`, whose
//! layout no header declares (and which differs between nginx versions), so they are not
//! read from it. Instead, while an `http` block is read, the `set` handlers of the proxy
//! module's `proxy_pass`, `proxy_buffering` and `proxy_set_header` commands are wrapped: each
//! wrapper calls nginx's own handler, then, if it succeeded, notes what the line said in this
//! module's configuration of the same level ([`ProxySeen`]), which is merged as the proxy
//! module merges its own (`proxy_buffering` inherited, `proxy_set_header` inherited only by a
//! level that has none). The handlers are put back when the block is read, and in any case
//! when the configuration's temporary pool is destroyed (a configuration that fails), so
//! nginx's command table never points into this module once a cycle is configured.

use core::ffi::{c_char, c_void};
use std::sync::Mutex;

use ngx::ffi::{ngx_command_t, ngx_conf_t, ngx_pool_cleanup_add, NGX_LOG_WARN};
use ngx::http::HttpModuleLocationConf;
use ngx::ngx_log_error;

use super::ext::ConfExt;
use super::{LocConf, MainConf, RateLimitModule, UsageSourceConf};

/// What a level's proxy directives said, as far as the usage reader cares.
#[derive(Clone, Debug, Default)]
pub struct ProxySeen {
    /// `proxy_buffering`, when written at this level or inherited.
    pub buffering: Option<bool>,
    /// `None`: no `proxy_set_header` at this level (it inherits its parent's, as nginx does);
    /// else whether one of them clears `Accept-Encoding` (`""` or `identity`).
    pub accept_encoding_cleared: Option<bool>,
}

impl ProxySeen {
    pub fn merge(&mut self, prev: &ProxySeen) {
        self.buffering = self.buffering.or(prev.buffering);
        self.accept_encoding_cleared = self
            .accept_encoding_cleared
            .or(prev.accept_encoding_cleared);
    }
}

/// A `proxy_pass` line and this module's configuration of its level (merged by the time it
/// is read).
pub struct ProxiedPlace {
    file: String,
    line: usize,
    conf: *const LocConf,
}

type SetFn = unsafe extern "C" fn(*mut ngx_conf_t, *mut ngx_command_t, *mut c_void) -> *mut c_char;

/// The directives wrapped, their wrappers, and nginx's handlers they stand for.
struct Wrapped {
    name: &'static [u8],
    wrapper: SetFn,
}

const WRAPPED: [Wrapped; 3] = [
    Wrapped {
        name: b"proxy_pass",
        wrapper: proxy_pass_seen,
    },
    Wrapped {
        name: b"proxy_buffering",
        wrapper: proxy_buffering_seen,
    },
    Wrapped {
        name: b"proxy_set_header",
        wrapper: proxy_set_header_seen,
    },
];

/// nginx's own handlers of [`WRAPPED`], in that order, once found.
static ORIGINALS: Mutex<[Option<SetFn>; 3]> = Mutex::new([None; 3]);

fn original(index: usize) -> Option<SetFn> {
    ORIGINALS.lock().unwrap_or_else(|e| e.into_inner())[index]
}

/// The proxy module's command table, when this nginx has the proxy module.
fn proxy_commands(cf: &ngx_conf_t) -> Option<*mut ngx_command_t> {
    let module = super::ext::module_named(cf, c"ngx_http_proxy_module")?;
    (!module.commands.is_null()).then_some(module.commands)
}

/// Each command of `commands` (up to the terminating one with an empty name) that is one of
/// [`WRAPPED`], with its index there.
fn each_wrapped(commands: *mut ngx_command_t, mut f: impl FnMut(usize, &mut ngx_command_t)) {
    let mut command = commands;
    loop {
        // SAFETY: a module's command table ends with an entry whose name is empty
        // (`ngx_null_command`); every entry before it is a live command of the module, in
        // nginx's writable data, only read or written while a configuration is read.
        let Some(cmd) = (unsafe { command.as_mut() }) else {
            return;
        };
        if cmd.name.len == 0 {
            return;
        }
        let name = cmd.name.as_bytes();
        if let Some(index) = WRAPPED.iter().position(|w| w.name == name) {
            f(index, cmd);
        }
        // SAFETY: the terminating entry has not been reached, so the next one exists.
        command = unsafe { command.add(1) };
    }
}

/// Before the `http` block is read: wrap the proxy module's handlers, and make sure they are
/// put back when this configuration is done with, whether it succeeds or not.
pub fn wrap_proxy_directives(cf: &mut ngx_conf_t) {
    let Some(commands) = proxy_commands(cf) else {
        return;
    };
    // SAFETY: the temporary pool lives until the end of this configuration's reading, in
    // success and in failure; the cleanup has no data.
    if let Some(cleanup) = unsafe { ngx_pool_cleanup_add(cf.temp_pool, 0).as_mut() } {
        cleanup.handler = Some(restore_cleanup);
    } else {
        // Without a way to put them back in every case, the handlers stay nginx's.
        return;
    }
    *COMMANDS.lock().unwrap_or_else(|e| e.into_inner()) = Some(CommandTable(commands));
    let mut originals = ORIGINALS.lock().unwrap_or_else(|e| e.into_inner());
    each_wrapped(commands, |index, cmd| {
        let wrapper = WRAPPED[index].wrapper;
        let Some(set) = cmd.set else {
            return;
        };
        if set as usize != wrapper as usize {
            originals[index] = Some(set);
        }
        if originals[index].is_some() {
            cmd.set = Some(wrapper);
        }
    });
}

/// Put nginx's handlers back (idempotent).
pub fn restore_proxy_directives(cf: &ngx_conf_t) {
    if let Some(commands) = proxy_commands(cf) {
        restore(commands);
    }
}

fn restore(commands: *mut ngx_command_t) {
    let originals = ORIGINALS.lock().unwrap_or_else(|e| e.into_inner());
    each_wrapped(commands, |index, cmd| {
        if let Some(set) = originals[index] {
            cmd.set = Some(set);
        }
    });
}

/// The temporary pool's cleanup, which has no `ngx_conf_t` to find the table with: the
/// table's address was kept when the handlers were wrapped.
unsafe extern "C" fn restore_cleanup(_data: *mut c_void) {
    crate::glue::guard::entry(
        "conf::usage_proxy::restore_cleanup",
        || (),
        || {
            let commands = COMMANDS.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(commands) = commands {
                restore(commands.0);
            }
        },
    );
}

/// The proxy module's command table, kept for [`restore_cleanup`].
struct CommandTable(*mut ngx_command_t);
// SAFETY: nginx reads its configuration on one thread; the pointer is only a table's address.
unsafe impl Send for CommandTable {}
static COMMANDS: Mutex<Option<CommandTable>> = Mutex::new(None);

/// Call nginx's handler `index` of [`WRAPPED`]; when it succeeded, note the line with `note`.
fn wrapped(
    index: usize,
    cf: *mut ngx_conf_t,
    cmd: *mut ngx_command_t,
    conf: *mut c_void,
    note: fn(&mut ngx_conf_t),
) -> *mut c_char {
    let Some(set) = original(index) else {
        return ngx::core::NGX_CONF_ERROR;
    };
    // SAFETY: nginx's own handler, called with the arguments nginx gave its wrapper.
    let answer = unsafe { set(cf, cmd, conf) };
    if answer.is_null() {
        // SAFETY: nginx passes a valid configuration context to a directive's handler.
        if let Some(cf) = unsafe { cf.as_mut() } {
            crate::glue::guard::entry("conf::usage_proxy::wrapped", || (), || note(cf));
        }
    }
    answer
}

unsafe extern "C" fn proxy_pass_seen(
    cf: *mut ngx_conf_t,
    cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    wrapped(0, cf, cmd, conf, |cf| {
        let (file, line) = cf.position();
        let Some(lcf) = RateLimitModule::location_conf(&*cf) else {
            return;
        };
        let conf: *const LocConf = lcf;
        if let Some(mcf) = super::main_conf(cf) {
            mcf.proxied_places.push(ProxiedPlace { file, line, conf });
        }
    })
}

unsafe extern "C" fn proxy_buffering_seen(
    cf: *mut ngx_conf_t,
    cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    wrapped(1, cf, cmd, conf, |cf| {
        let on = cf
            .args()
            .get(1)
            .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"on"));
        if let Some(lcf) = RateLimitModule::location_conf_mut(&*cf) {
            lcf.proxy.buffering = Some(on);
        }
    })
}

unsafe extern "C" fn proxy_set_header_seen(
    cf: *mut ngx_conf_t,
    cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    wrapped(2, cf, cmd, conf, |cf| {
        let args = cf.args();
        let clears = match (args.get(1), args.get(2)) {
            (Some(field), Some(value)) => {
                field.as_bytes().eq_ignore_ascii_case(b"accept-encoding")
                    && matches!(value.as_bytes(), b"" | b"identity")
            }
            _ => false,
        };
        if let Some(lcf) = RateLimitModule::location_conf_mut(&*cf) {
            let cleared = lcf.proxy.accept_encoding_cleared.unwrap_or(false);
            lcf.proxy.accept_encoding_cleared = Some(cleared || clears);
        }
    })
}

/// Warn about every `proxy_pass` whose level has a line reading usage from the response
/// without `proxy_buffering off` or `proxy_set_header Accept-Encoding ""`. Runs once the
/// `http` block is read and merged.
pub fn warn_unreadable_usage(cf: &ngx_conf_t, mcf: &MainConf) {
    for place in &mcf.proxied_places {
        // SAFETY: this module's configurations of every level live in the configuration
        // pool as long as the cycle's configuration.
        let Some(lcf) = (unsafe { place.conf.as_ref() }) else {
            continue;
        };
        let reader = lcf.limits().iter().find_map(|limit| {
            let usage = limit.usage?;
            matches!(usage.source, UsageSourceConf::Reader(_)).then_some(usage)
        });
        let Some(usage) = reader else {
            continue;
        };
        let word = usage
            .api
            .map(|api| api.as_str())
            .or(match usage.source {
                UsageSourceConf::Reader(provider) => Some(provider.as_str()),
                UsageSourceConf::Variable(_) => None,
            })
            .unwrap_or("openai");
        let mut missing = Vec::new();
        if lcf.proxy.buffering != Some(false) {
            missing.push("\"proxy_buffering off;\"");
        }
        if lcf.proxy.accept_encoding_cleared != Some(true) {
            missing.push("'proxy_set_header Accept-Encoding \"\";'");
        }
        if missing.is_empty() {
            continue;
        }
        let why = match (lcf.proxy.buffering != Some(false), missing.len()) {
            (true, 1) => "a response nginx buffers to a temporary file",
            (false, _) => "a compressed response",
            (true, _) => "a compressed response, or one nginx buffers to a temporary file,",
        };
        ngx_log_error!(
            NGX_LOG_WARN,
            cf.log,
            "rate_limit usage={word} may not read the usage of the responses of proxy_pass \
             in {}:{}: {why} cannot be read and is charged as cut; add {} to that location",
            place.file,
            place.line,
            missing.join(" and ")
        );
    }
}
