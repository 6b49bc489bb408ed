//! The stream block's configuration: `rate_limit_zone` and `rate_limit` in `stream {}`, with
//! the words, checks and errors of their http twins (`crate::conf::directives`), and the key
//! compiled as a stream complex value.

use core::ffi::{c_char, c_void};
use core::mem;
use core::ptr;

use nginx_sys::{
    ngx_stream_compile_complex_value_t, ngx_stream_complex_value_t, ngx_stream_content_handler_pt,
};
use ngx::core::NGX_CONF_OK;
use ngx::ffi::{ngx_command_t, ngx_conf_t, ngx_flag_t, ngx_uint_t, NGX_LOG_EMERG, NGX_LOG_WARN};
use ngx::http::HttpModuleMainConf;
use ngx::ngx_conf_log_error;
use ratelimit_core::key_form::NetPrefixes;

use super::api::StreamApi;
use crate::conf::directives::{
    check_unclaimed, limit_line, log_level_value, parse_zone, remote_net_value, single_variable,
    LineContext,
};
use crate::conf::ext::ConfExt;
use crate::conf::{
    self, registry, ConfError, LimitConf, StreamKey, ZoneConf, ZoneKey, ZoneReference, UNSET,
};

/// The stream block's state: nginx's stream functions, the zones declared, the zone names
/// `rate_limit` refers to (checked once the block is read).
pub struct MainConf {
    pub api: StreamApi,
    pub zones: Vec<*mut ZoneConf>,
    pub references: Vec<ZoneReference>,
    /// Index of the stream `$rate_limit_status` in `s->variables`.
    pub status_variable: Option<ngx_uint_t>,
    /// Some zone is keyed by an `$ssl_preread_*` variable: the preread handler is installed.
    pub preread_used: bool,
}

impl MainConf {
    pub fn zones(&self) -> impl Iterator<Item = &ZoneConf> {
        self.zones
            .iter()
            // SAFETY: stream zones live in the configuration pool of this cycle, as long as
            // the main configuration does.
            .filter_map(|&zone| unsafe { zone.as_ref() })
    }
}

/// A stream `server`'s settings (and the `stream` block's, which servers inherit).
pub struct SrvConf {
    pub limits: Option<Vec<LimitConf>>,
    /// The server's own content handler, when [`super::session::content_handler`] took its
    /// place (some line's zone is keyed by an `$ssl_preread_*` variable). Not merged.
    pub content: ngx_stream_content_handler_pt,
    pub dry_run: ngx_flag_t,
    pub log_level: Option<ngx_uint_t>,
    /// `rate_limit_remote_net`: the prefix lengths of `$rate_limit_remote_net`.
    pub remote_net: Option<NetPrefixes>,
}

impl SrvConf {
    pub fn limits(&self) -> &[LimitConf] {
        self.limits.as_deref().unwrap_or(&[])
    }
    pub fn dry_run(&self) -> bool {
        self.dry_run == 1
    }
    pub fn log_level(&self) -> ngx_uint_t {
        self.log_level
            .unwrap_or(ngx::ffi::NGX_LOG_ERR as ngx_uint_t)
    }
    /// Delays are logged one level below rejections, as limit_req does.
    pub fn delay_log_level(&self) -> ngx_uint_t {
        let level = self.log_level();
        if level == ngx::ffi::NGX_LOG_INFO as ngx_uint_t {
            level
        } else {
            level + 1
        }
    }
}

fn answer(cf: &mut ngx_conf_t, result: Result<(), ConfError>) -> *mut c_char {
    match result {
        Ok(()) => NGX_CONF_OK,
        Err(error) => cf.fail(&error),
    }
}

pub unsafe extern "C" fn create_main_conf(cf: *mut ngx_conf_t) -> *mut c_void {
    crate::glue::guard::entry("stream::create_main_conf", core::ptr::null_mut, || {
        // SAFETY: nginx passes a valid configuration context.
        let cf = unsafe { &mut *cf };
        let api = match StreamApi::resolve() {
            Ok(api) => api,
            Err(missing) => {
                ngx_conf_log_error!(
                    NGX_LOG_EMERG,
                    cf,
                    "rate_limit: the stream function \"{}\" is not found in this nginx",
                    missing.to_string_lossy()
                );
                return ptr::null_mut();
            }
        };
        let main = MainConf {
            api,
            zones: Vec::new(),
            references: Vec::new(),
            status_variable: None,
            preread_used: false,
        };
        cf.alloc(main).map_or(ptr::null_mut(), |main| main.cast())
    })
}

pub unsafe extern "C" fn create_srv_conf(cf: *mut ngx_conf_t) -> *mut c_void {
    crate::glue::guard::entry("stream::create_srv_conf", core::ptr::null_mut, || {
        // SAFETY: nginx passes a valid configuration context.
        let cf = unsafe { &mut *cf };
        let srv = SrvConf {
            limits: None,
            content: None,
            dry_run: UNSET,
            log_level: None,
            remote_net: None,
        };
        cf.alloc(srv).map_or(ptr::null_mut(), |srv| srv.cast())
    })
}

pub unsafe extern "C" fn merge_srv_conf(
    _cf: *mut ngx_conf_t,
    parent: *mut c_void,
    child: *mut c_void,
) -> *mut c_char {
    crate::glue::guard::entry(
        "stream::merge_srv_conf",
        || ngx::core::NGX_CONF_ERROR,
        || {
            // SAFETY: nginx passes two server configurations this module created.
            let (prev, conf) =
                unsafe { (&*parent.cast::<SrvConf>(), &mut *child.cast::<SrvConf>()) };
            if conf.limits.is_none() {
                conf.limits = prev.limits.clone();
            }
            if conf.dry_run == UNSET {
                conf.dry_run = prev.dry_run;
            }
            conf.log_level = conf.log_level.or(prev.log_level);
            conf.remote_net = conf.remote_net.or(prev.remote_net);
            NGX_CONF_OK
        },
    )
}

/// `rate_limit_zone KEY zone=NAME:SIZE ...;` in `stream {}`.
pub unsafe extern "C" fn cmd_rate_limit_zone(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    crate::glue::guard::entry(
        "stream::cmd_rate_limit_zone",
        || ngx::core::NGX_CONF_ERROR,
        || {
            // SAFETY: nginx calls directive handlers with a valid configuration context, and `conf`
            // is this module's stream main configuration (NGX_STREAM_MAIN_CONF_OFFSET).
            let (cf, main) = unsafe { (&mut *cf, &mut *conf.cast::<MainConf>()) };
            let result = rate_limit_zone(cf, main);
            answer(cf, result)
        },
    )
}

fn rate_limit_zone(cf: &mut ngx_conf_t, main: &mut MainConf) -> Result<(), ConfError> {
    let args = cf.args();
    let parsed = parse_zone(cf)?;
    if parsed.adaptive() {
        return Err(ConfError::NotInStream {
            word: "limit=adaptive",
            why: "it follows the upstream's response times, and a stream session has no \
                  response to time (use limit=N)",
        });
    }

    // SAFETY: all-zero is a valid (empty) complex value, filled by the compiler below.
    let mut key: ngx_stream_complex_value_t = unsafe { mem::zeroed() };
    let mut key_arg = args[1];
    // SAFETY: zeroed is the documented initial state of ngx_stream_compile_complex_value_t.
    let mut ccv: ngx_stream_compile_complex_value_t = unsafe { mem::zeroed() };
    ccv.cf = cf;
    ccv.value = &mut key_arg;
    ccv.complex_value = &mut key;
    // SAFETY: `ccv` points at live values for the duration of the call.
    if unsafe { (main.api.compile_complex_value)(&mut ccv) } != 0 {
        return Err(ConfError::Logged);
    }
    let key_variable = match single_variable(args[1].as_bytes()) {
        Some(name) => {
            let mut name = cf.copy_str(name)?;
            // SAFETY: `cf` is valid during configuration; the name is in its pool.
            let index = unsafe { (main.api.get_variable_index)(cf, &mut name) };
            Some(ngx_uint_t::try_from(index).map_err(|_| ConfError::Logged)?)
        }
        None => None,
    };

    let name = parsed.name.clone();
    if main.zones().any(|zone| zone.name == name) {
        return Err(ConfError::DuplicateZone(name));
    }
    let shm_zone = conf::add_shared_zone(cf, &name, parsed.size)?;
    check_unclaimed(shm_zone, &name, true)?;
    let after_preread = uses_ssl_preread(args[1].as_bytes());
    main.preread_used |= after_preread;
    if is_server_name_alone(args[1].as_bytes()) {
        warn_empty_server_name(cf, &name, &String::from_utf8_lossy(args[1].as_bytes()));
    }
    let key = ZoneKey::Stream(StreamKey {
        value: key,
        variable: key_variable,
        after_preread,
    });
    let zone = cf.alloc(parsed.into_zone_conf(shm_zone, args[1].as_bytes(), key))?;
    shm_zone.data = zone.cast();
    shm_zone.init = Some(crate::control::zone_init);
    main.zones.push(zone);
    registry::configuring(cf)
        .ok_or(ConfError::Logged)?
        .add(zone);
    Ok(())
}

/// Whether a zone's KEY is `$ssl_preread_server_name` alone.
fn is_server_name_alone(key: &[u8]) -> bool {
    matches!(
        key,
        b"$ssl_preread_server_name" | b"${ssl_preread_server_name}"
    )
}

/// A zone keyed by `$ssl_preread_server_name` alone: a client that sends no server name (a
/// ClientHello without SNI, or no TLS at all) has an empty key, and a session with an empty
/// key is not limited. `nginx -t` says so, at nginx's warning level, with a key that limits
/// such clients by address.
fn warn_empty_server_name(cf: &mut ngx_conf_t, zone: &str, key: &str) {
    ngx_conf_log_error!(
        NGX_LOG_WARN,
        cf,
        "zone \"{zone}\" is keyed by {key}, which is empty for a client \
         that sends no server name (a TLS ClientHello without SNI, or a client that does not \
         speak TLS): its sessions are not limited; to limit them by address, key the zone by \
         \"$ssl_preread_server_name$no_sni_addr\" with \"map $ssl_preread_server_name \
         $no_sni_addr {{ \"\" $remote_addr; default \"\"; }}\""
    );
}

/// Whether a key names a variable of ssl_preread (`$ssl_preread_server_name`,
/// `${ssl_preread_alpn_protocols}`, ...), which is empty before the preread phase.
fn uses_ssl_preread(key: &[u8]) -> bool {
    [&b"$ssl_preread_"[..], &b"${ssl_preread_"[..]]
        .iter()
        .any(|prefix| key.windows(prefix.len()).any(|window| window == *prefix))
}

/// `rate_limit zone=NAME [burst=N] [nodelay | delay=N] [cost=N];` in `stream {}` or a stream
/// `server {}`.
pub unsafe extern "C" fn cmd_rate_limit(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    crate::glue::guard::entry(
        "stream::cmd_rate_limit",
        || ngx::core::NGX_CONF_ERROR,
        || {
            // SAFETY: as for every directive handler; `conf` is our stream server configuration.
            let (cf, srv) = unsafe { (&mut *cf, &mut *conf.cast::<SrvConf>()) };
            let result = rate_limit(cf, srv);
            answer(cf, result)
        },
    )
}

fn rate_limit(cf: &mut ngx_conf_t, srv: &mut SrvConf) -> Result<(), ConfError> {
    let limits = srv.limits.get_or_insert_with(Vec::new);
    let (limit, references) = limit_line(cf, limits, LineContext::Stream)?;
    if limit.global.is_some() {
        return Err(ConfError::NotInStream {
            word: "global=",
            why: "a stream zone limits each key on its own",
        });
    }
    if limit.on_status.is_some() {
        return Err(ConfError::NotInStream {
            word: "on_status=",
            why: "a session is charged when it starts",
        });
    }
    main_conf(cf)
        .ok_or(ConfError::Logged)?
        .references
        .extend(references);
    limits.push(limit);
    Ok(())
}

/// `rate_limit_log_level info|notice|warn|error;` in `stream {}` or a stream `server {}`.
pub unsafe extern "C" fn cmd_log_level(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    crate::glue::guard::entry(
        "stream::cmd_log_level",
        || ngx::core::NGX_CONF_ERROR,
        || {
            // SAFETY: as for every directive handler; `conf` is our stream server configuration.
            let (cf, srv) = unsafe { (&mut *cf, &mut *conf.cast::<SrvConf>()) };
            let result = if srv.log_level.is_some() {
                Err(ConfError::Duplicate("rate_limit_log_level"))
            } else {
                log_level_value(cf).map(|level| srv.log_level = Some(level))
            };
            answer(cf, result)
        },
    )
}

/// `rate_limit_remote_net [ipv4=N] [ipv6=M];` in `stream {}` or a stream `server {}`.
pub unsafe extern "C" fn cmd_remote_net(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    crate::glue::guard::entry(
        "stream::cmd_remote_net",
        || ngx::core::NGX_CONF_ERROR,
        || {
            // SAFETY: as for every directive handler; `conf` is our stream server configuration.
            let (cf, srv) = unsafe { (&mut *cf, &mut *conf.cast::<SrvConf>()) };
            let result = remote_net_value(cf, srv.remote_net.is_some()).map(|prefixes| {
                srv.remote_net = Some(prefixes);
            });
            answer(cf, result)
        },
    )
}

/// This module's stream main configuration in the stream block being read.
pub fn main_conf(cf: &ngx_conf_t) -> Option<&'static mut MainConf> {
    // SAFETY: inside the stream block, `cf.ctx` is its ngx_stream_conf_ctx_t, whose main_conf
    // array has an element per stream module (ours at its ctx_index).
    unsafe {
        let ctx = cf.ctx.cast::<nginx_sys::ngx_stream_conf_ctx_t>().as_ref()?;
        let index = (*super::module_ptr()).ctx_index;
        (*ctx.main_conf.add(index)).cast::<MainConf>().as_mut()
    }
}

/// Once the stream block is read: every zone name `rate_limit` used exists in the stream
/// block and fits its line; a `sync` zone finds `rate_limit_sync` in an `http` block read
/// before.
pub fn postconfiguration(cf: &mut ngx_conf_t) -> Result<(), ConfError> {
    let Some(main) = main_conf(cf) else {
        return Ok(());
    };
    for reference in &main.references {
        let zone = main.zones.iter().find(|&&zone| {
            // SAFETY: stream zones live in the configuration pool of this cycle.
            unsafe { (*zone).name == reference.name }
        });
        let Some(&zone) = zone else {
            let declared = main.zones().map(|zone| zone.name.as_str());
            return Err(reference.error(ConfError::unknown_zone(&reference.name, declared)));
        };
        // SAFETY: as above; nothing else refers to the zone while configuration is read.
        let zone = unsafe { &mut *zone };
        if reference.burst_given && zone.algorithm.counts_in_flight() {
            return Err(reference.error(ConfError::NotInStream {
                word: "burst=",
                why: "a session over a concurrency zone's limit is closed, it does not queue",
            }));
        }
        conf::check_reference(reference, zone)?;
    }
    if let Some(zone) = main.zones().find(|zone| zone.sync) {
        // SAFETY: `cf.cycle` is the cycle being configured.
        let cycle = unsafe { &*cf.cycle };
        let http_sync =
            conf::RateLimitModule::main_conf(cycle).is_some_and(|mcf| mcf.sync.is_some());
        if !http_sync {
            return Err(ConfError::StreamSyncNotConfigured(zone.name.clone()));
        }
    }
    Ok(())
}
