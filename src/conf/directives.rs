//! The `cmd_*` handlers of the module's directives. Each turns its raw pointers into
//! references in its first lines and calls a function that returns a [`ConfError`].
//! `rate_limit_status`, `rate_limit_dry_run` and `rate_limit_headers` use nginx's own
//! setters (the table in `lib.rs`), `rate_limit_sync` is in [`super::sync`].

use core::cell::{Cell, RefCell};
use core::ffi::{c_char, c_void};
use core::mem;

use ngx::core::NGX_CONF_OK;
use ngx::ffi::{
    ngx_command_t, ngx_conf_post_t, ngx_conf_t, ngx_http_compile_complex_value,
    ngx_http_compile_complex_value_t, ngx_http_complex_value_t, ngx_int_t, ngx_shm_zone_t,
    ngx_uint_t, NGX_LOG_ERR, NGX_LOG_INFO, NGX_LOG_NOTICE, NGX_LOG_WARN,
};
use ngx::http::{HttpModuleLocationConf, HttpModuleServerConf, NgxHttpCoreModule};
use ratelimit_core::concurrency::{ConcurrencyLimit, ConcurrencySpec};
use ratelimit_core::key_form::{KeyForm, NetPrefixes};
use ratelimit_core::usage::{Amount, UsageSource, UsageSpec};
use ratelimit_core::{Algorithm, DelayMode, LimitSpec, Rate, RateUnit, SpecError, ZoneSpec};

use super::ext::ConfExt;
use super::registry;
use super::unreached::LimitedPlace;
use super::{
    add_shared_zone, main_conf, variable_index, AdminConf, AmountConf, ConfError, HttpVariable,
    LimitConf, LocConf, LocationBursts, QuotaPeriod, UsageConf, UsageSourceConf, ZoneConf, ZoneKey,
    ZoneReference,
};
use crate::store::sizing::{size_hint, zone_size_fits};
use crate::store::ZoneLayout;

/// The answer of a `cmd_*` handler.
fn answer(cf: &mut ngx_conf_t, result: Result<(), ConfError>) -> *mut c_char {
    match result {
        Ok(()) => NGX_CONF_OK,
        Err(error) => cf.fail(&error),
    }
}

/// `rate_limit_zone KEY zone=NAME:SIZE rate=RATE [burst=N] [algorithm=NAME] [sync]
/// [block=DURATION [block_max=DURATION]];`
pub extern "C" fn cmd_rate_limit_zone(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    _conf: *mut c_void,
) -> *mut c_char {
    crate::glue::guard::entry(
        "conf::directives::cmd_rate_limit_zone",
        || ngx::core::NGX_CONF_ERROR,
        || {
            // SAFETY: nginx calls directive handlers with a valid configuration context.
            let cf = unsafe { &mut *cf };
            let result = rate_limit_zone(cf);
            answer(cf, result)
        },
    )
}

fn rate_limit_zone(cf: &mut ngx_conf_t) -> Result<(), ConfError> {
    let args = cf.args();
    let parsed = parse_zone(cf)?;

    // SAFETY: all-zero is a valid (empty) complex value, filled by the compiler below.
    let mut key: ngx_http_complex_value_t = unsafe { mem::zeroed() };
    let mut key_arg = args[1];
    // SAFETY: zeroed is the documented initial state of ngx_http_compile_complex_value_t.
    let mut ccv: ngx_http_compile_complex_value_t = unsafe { mem::zeroed() };
    ccv.cf = cf;
    ccv.value = &mut key_arg;
    ccv.complex_value = &mut key;
    // SAFETY: `ccv` points at live values for the duration of the call.
    if unsafe { ngx_http_compile_complex_value(&mut ccv) } != 0 {
        return Err(ConfError::Logged);
    }
    let key_variable = match single_variable(args[1].as_bytes()) {
        Some(name) => Some(variable_index(cf, name)?),
        None => None,
    };

    let mcf = main_conf(cf).ok_or(ConfError::Logged)?;
    let name = parsed.name.clone();
    if super::zones(mcf).any(|zone| zone.name == name) {
        return Err(ConfError::DuplicateZone(name));
    }
    let zone_init = mcf.hooks.zone_init;
    let shm_zone = add_shared_zone(cf, &name, parsed.size)?;
    check_unclaimed(shm_zone, &name, false)?;
    let key = match key_variable {
        Some(index) => ZoneKey::HttpVariable(HttpVariable {
            index,
            query_arg: None,
        }),
        None => ZoneKey::HttpComplex(key),
    };
    let zone_conf = parsed.into_zone_conf(shm_zone, args[1].as_bytes(), key);
    let zone_conf = cf.alloc(zone_conf)?;
    shm_zone.data = zone_conf.cast();
    shm_zone.init = zone_init;
    mcf.zones.push(zone_conf);
    registry::configuring(cf)
        .ok_or(ConfError::Logged)?
        .add(zone_conf);
    Ok(())
}

/// A `rate_limit_zone` line's parameters, checked (the zone's size too), before its key is
/// compiled in the context (`http` or `stream`) it is declared in.
pub struct ParsedZone {
    pub name: String,
    pub size: u64,
    spec: ZoneSpec,
    concurrency: Option<ConcurrencySpec>,
}

impl ParsedZone {
    /// `algorithm=concurrency limit=adaptive`.
    pub fn adaptive(&self) -> bool {
        self.concurrency
            .as_ref()
            .is_some_and(|spec| matches!(spec.limit, ConcurrencyLimit::Adaptive(_)))
    }

    /// The zone's configuration, with its KEY (`key_text`) as the caller compiled it in its
    /// context.
    pub fn into_zone_conf(
        self,
        shm_zone: *mut ngx_shm_zone_t,
        key_text: &[u8],
        key: ZoneKey,
    ) -> ZoneConf {
        ZoneConf {
            name: self.name,
            shm_zone,
            key,
            policy_item: RefCell::new(None),
            key_text: String::from_utf8_lossy(key_text).into_owned(),
            key_form: KeyForm::of_key(&String::from_utf8_lossy(key_text)),
            algorithm: self.spec.algorithm,
            limits: self.spec.limits(),
            size: self.size,
            zone: None,
            sync: self.spec.sync,
            bursts: LocationBursts::default(),
            concurrency: self.concurrency,
            quota: self.spec.quota,
            quota_period: Cell::new(QuotaPeriod::default()),
            block: self.spec.block,
        }
    }
}

/// Parse and check the words of a `rate_limit_zone` line (`http` or `stream`): the exact test
/// zone init will make, so that `nginx -t` refuses what could not start, at this line, with
/// the size that would do.
pub fn parse_zone(cf: &mut ngx_conf_t) -> Result<ParsedZone, ConfError> {
    let words = cf.words(2)?;
    let spec_error = |error| ConfError::Spec {
        directive: "rate_limit_zone",
        error,
    };
    let concurrency = if words.contains(&"algorithm=concurrency") {
        Some(ConcurrencySpec::parse_words(&words).map_err(spec_error)?)
    } else {
        None
    };
    let spec = match &concurrency {
        Some(concurrency) => ZoneSpec {
            zone: concurrency.zone.clone(),
            // Unused by a concurrency zone, whose limits are `concurrency`'s.
            rate: Rate {
                milli_requests: 1000,
                unit: RateUnit::Second,
            },
            burst: None,
            algorithm: Algorithm::Concurrency,
            sync: concurrency.sync,
            block: None,
            quota: None,
        },
        None => ZoneSpec::parse_words(&words).map_err(spec_error)?,
    };
    let (name, size) = spec
        .zone
        .clone()
        .ok_or(ConfError::NoZone("rate_limit_zone"))?;
    // SAFETY: ngx_pagesize is set at startup, before any configuration is read.
    let pagesize = unsafe { nginx_sys::ngx_pagesize };
    let layout = ZoneLayout {
        algorithm: spec.algorithm,
        limits: spec.limits(),
        fingerprint: 0,
        sync_seed: spec.sync.then_some(0),
        concurrency: concurrency.as_ref().map(ConcurrencySpec::limits),
        block: spec.block.is_some(),
    };
    let fits = usize::try_from(size)
        .is_ok_and(|size| zone_size_fits(size, layout.slot_words(), layout.block, pagesize));
    if !fits {
        let hint = size_hint(&layout, pagesize);
        return Err(ConfError::ZoneTooSmall { name, hint });
    }
    Ok(ParsedZone {
        name,
        size,
        spec,
        concurrency,
    })
}

/// A zone's shared memory that no `rate_limit_zone` claimed yet: a zone of the same name
/// declared in the other context (`http` or `stream`) is refused with the reason, since
/// the two would share one memory.
pub fn check_unclaimed(
    shm_zone: &ngx_shm_zone_t,
    name: &str,
    stream: bool,
) -> Result<(), ConfError> {
    // SAFETY: a claimed zone's data is the `ZoneConf` of this cycle's configuration pool.
    let Some(other) = (unsafe { shm_zone.data.cast::<ZoneConf>().as_ref() }) else {
        return Ok(());
    };
    if other.key.is_stream() == stream {
        return Err(ConfError::DuplicateZone(name.to_string()));
    }
    Err(ConfError::ZoneInOtherContext {
        name: name.to_string(),
        other: if other.key.is_stream() {
            "stream"
        } else {
            "http"
        },
    })
}

/// `$name` or `${name}` alone: the variable's name.
pub fn single_variable(text: &[u8]) -> Option<&[u8]> {
    let name = text.strip_prefix(b"$")?;
    let name = match name.strip_prefix(b"{") {
        Some(braced) => braced.strip_suffix(b"}")?,
        None => name,
    };
    let valid = !name.is_empty()
        && name
            .iter()
            .all(|&byte| byte.is_ascii_alphanumeric() || byte == b'_');
    valid.then_some(name)
}

/// `rate_limit zone=NAME [burst=N] [nodelay | delay=N] [global=NAME] [cost=N]
/// [on_status=CODES];`
pub extern "C" fn cmd_rate_limit(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    crate::glue::guard::entry(
        "conf::directives::cmd_rate_limit",
        || ngx::core::NGX_CONF_ERROR,
        || {
            // SAFETY: nginx calls directive handlers with a valid configuration context, and `conf`
            // is this module's location configuration (NGX_HTTP_LOC_CONF_OFFSET).
            let (cf, lcf) = unsafe { (&mut *cf, &mut *conf.cast::<LocConf>()) };
            let result = rate_limit(cf, lcf);
            answer(cf, result)
        },
    )
}

fn rate_limit(cf: &mut ngx_conf_t, lcf: &mut LocConf) -> Result<(), ConfError> {
    let limits = lcf.limits.get_or_insert_with(Vec::new);
    let (limit, mut references) = limit_line(cf, limits, LineContext::Http)?;
    // The http server the line is written in, for the empty-key warning (`empty_key.rs`).
    let server: *const _ = NgxHttpCoreModule::server_conf(&*cf).map_or(core::ptr::null(), |s| s);
    for reference in &mut references {
        reference.server = server;
    }
    let mcf = main_conf(cf).ok_or(ConfError::Logged)?;
    mcf.on_status_used |= limit.on_status.is_some();
    mcf.usage_used |= limit.usage.is_some();
    mcf.references.extend(references);
    mcf.limited_places.push(LimitedPlace::here(cf));
    limits.push(limit);
    Ok(())
}

/// The words of a `rate_limit` line (`http` or `stream`): the line, and the zone names it
/// refers to, checked once the whole block is read ([`super::check_reference`]).
pub fn limit_line(
    cf: &mut ngx_conf_t,
    existing: &[LimitConf],
    context: LineContext,
) -> Result<(LimitConf, Vec<ZoneReference>), ConfError> {
    let words = cf.words(1)?;
    let spec = LimitSpec::parse_words(&words).map_err(|error| ConfError::Spec {
        directive: "rate_limit",
        error,
    })?;
    let name = spec.zone.clone().ok_or(ConfError::NoZone("rate_limit"))?;
    if existing.iter().any(|limit| limit.name == name) {
        return Err(ConfError::DuplicateLimit(name));
    }
    let shm_zone: *mut _ = add_shared_zone(cf, &name, 0)?;
    let global = match &spec.global {
        Some(global) => Some(add_shared_zone(cf, global, 0)? as *mut _),
        None => None,
    };
    if context == LineContext::Stream {
        stream_words(&spec)?;
    }
    let cost_variable = match &spec.cost_variable {
        Some(name) => {
            not_a_usage_result("cost", name)?;
            Some(variable_index(cf, name.as_bytes())?)
        }
        None => None,
    };
    let usage = match &spec.usage {
        Some(usage) => Some(usage_conf(cf, usage, spec.global.is_some())?),
        None => None,
    };
    one_usage_api(existing, usage)?;
    let references = line_references(&spec, &name, usage.is_some(), cf.position());
    let limit = LimitConf {
        name,
        shm_zone,
        burst: spec.burst,
        delay: spec.delay,
        global,
        cost: spec.cost.max(1),
        charge_cache: Cell::new((0, None)),
        on_status: spec.on_status,
        cost_variable,
        usage,
        headers: spec.headers,
    };
    Ok((limit, references))
}

/// A `rate_limit` line in `stream` has none of the words that read http variables (their
/// indexes are the http module's) or a response.
fn stream_words(spec: &LimitSpec) -> Result<(), ConfError> {
    if spec.cost_variable.is_some() {
        return Err(ConfError::NotInStream {
            word: "cost=$variable",
            why: "a session's cost is fixed (cost=N)",
        });
    }
    if spec.usage.is_some() {
        return Err(ConfError::NotInStream {
            word: "usage=",
            why: "a session has no response whose usage could settle it",
        });
    }
    if !spec.headers {
        return Err(ConfError::NotInStream {
            word: "headers=off",
            why: "a session has no response headers to leave the line out of",
        });
    }
    Ok(())
}

/// The lines of one location read the usage of one provider's responses: a line's `usage=`
/// may not name another API than the lines before it.
fn one_usage_api(existing: &[LimitConf], usage: Option<UsageConf>) -> Result<(), ConfError> {
    let Some(api) = usage.and_then(|usage| usage.api) else {
        return Ok(());
    };
    let other = existing
        .iter()
        .find_map(|limit| limit.usage?.api.filter(|&other| other != api));
    match other {
        Some(other) => Err(ConfError::Spec {
            directive: "rate_limit",
            error: SpecError::Conflict(format!(
                "\"usage={}\" and \"usage={}\" in one location: the response is read, \
                 and the caller's credential taken, for one provider",
                api.as_str(),
                other.as_str()
            )),
        }),
        None => Ok(()),
    }
}

/// The zones a `rate_limit` line at `position` refers to: its zone, and its `global=` zone.
fn line_references(
    spec: &LimitSpec,
    name: &str,
    usage_given: bool,
    (file, line): (String, usize),
) -> Vec<ZoneReference> {
    let mut references = vec![ZoneReference {
        name: name.to_string(),
        global: false,
        local_algorithm_needed: spec.global.is_some().then_some(Algorithm::TokenBucket),
        burst_given: spec.burst.is_some(),
        delay_given: match spec.delay {
            DelayMode::Delay => None,
            DelayMode::NoDelay => Some("nodelay"),
            DelayMode::Threshold(_) => Some("delay"),
        },
        burst: spec.burst,
        usage_given,
        file: file.clone(),
        line,
        server: core::ptr::null(),
    }];
    if let Some(global) = &spec.global {
        references.push(ZoneReference {
            name: global.clone(),
            global: true,
            local_algorithm_needed: Some(Algorithm::TokenBucket),
            burst_given: false,
            delay_given: None,
            burst: spec.burst,
            usage_given: false,
            file,
            line,
            server: core::ptr::null(),
        });
    }
    references
}

/// Where a `rate_limit` line is read: the words that read variables at the end of a request
/// are the http module's.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum LineContext {
    Http,
    Stream,
}

/// A line's cost cannot come from `$rate_limit_usage_*`: those are the settlement's result,
/// set in the log phase after the line was charged (the line would read its own outcome).
fn not_a_usage_result(word: &'static str, name: &str) -> Result<(), ConfError> {
    let prefix = "rate_limit_usage_";
    let own = name
        .get(..prefix.len())
        .is_some_and(|start| start.eq_ignore_ascii_case(prefix));
    if own {
        return Err(ConfError::OwnUsageVariable {
            word,
            name: name.to_string(),
        });
    }
    Ok(())
}

/// `usage=` and its words, with their variables indexed.
fn usage_conf(
    cf: &mut ngx_conf_t,
    usage: &UsageSpec,
    global: bool,
) -> Result<UsageConf, ConfError> {
    if global {
        return Err(ConfError::Spec {
            directive: "rate_limit",
            error: SpecError::Conflict(
                "\"usage\" and \"global\" cannot be used together: a settlement is charged \
                 to the key's own bucket"
                    .into(),
            ),
        });
    }
    let source = match &usage.source {
        UsageSource::Reader(provider) => UsageSourceConf::Reader(*provider),
        UsageSource::Variable(name) => {
            not_a_usage_result("usage", name)?;
            UsageSourceConf::Variable(variable_index(cf, name.as_bytes())?)
        }
    };
    let reserve = match &usage.reserve {
        Amount::Fixed(tokens) => AmountConf::Fixed(*tokens),
        Amount::Auto(default) => AmountConf::Auto(*default),
        Amount::Variable(name) => {
            not_a_usage_result("reserve", name)?;
            AmountConf::Variable(variable_index(cf, name.as_bytes())?)
        }
    };
    let prices = match &usage.prices {
        Some(name) => {
            let at = cf.position();
            let mcf = main_conf(cf).ok_or(ConfError::Logged)?;
            let index = super::prices::index_of(mcf, name);
            mcf.prices[index].used_at.get_or_insert(at);
            Some(index)
        }
        None => None,
    };
    Ok(UsageConf {
        source,
        api: usage.api,
        reserve,
        debt: usage.debt,
        on_missing: usage.on_missing,
        on_unreadable: usage.on_unreadable,
        weights: usage.weights,
        prices,
    })
}

/// `rate_limit_status CODE;` is read by `ngx_conf_set_num_slot`; this post handler keeps the
/// code to the statuses a rejection may have, as limit_req's bounds do.
pub static STATUS_BOUNDS: ngx_conf_post_t = ngx_conf_post_t {
    post_handler: Some(check_status),
};

extern "C" fn check_status(
    cf: *mut ngx_conf_t,
    _post: *mut c_void,
    data: *mut c_void,
) -> *mut c_char {
    crate::glue::guard::entry(
        "conf::directives::check_status",
        || ngx::core::NGX_CONF_ERROR,
        || {
            // SAFETY: nginx calls the post handler with the configuration context and the number
            // `ngx_conf_set_num_slot` just stored.
            let (cf, code) = unsafe { (&mut *cf, *data.cast::<ngx_int_t>()) };
            if (400..=599).contains(&code) {
                return NGX_CONF_OK;
            }
            cf.fail(&ConfError::InvalidStatus(code))
        },
    )
}

/// `rate_limit_log_level info|notice|warn|error;` (its own handler: the error names the value).
pub extern "C" fn cmd_log_level(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    crate::glue::guard::entry(
        "conf::directives::cmd_log_level",
        || ngx::core::NGX_CONF_ERROR,
        || {
            // SAFETY: as for every directive handler; `conf` is our location configuration.
            let (cf, lcf) = unsafe { (&mut *cf, &mut *conf.cast::<LocConf>()) };
            let result = log_level(cf, lcf);
            answer(cf, result)
        },
    )
}

fn log_level(cf: &mut ngx_conf_t, lcf: &mut LocConf) -> Result<(), ConfError> {
    if lcf.log_level.is_some() {
        return Err(ConfError::Duplicate("rate_limit_log_level"));
    }
    lcf.log_level = Some(log_level_value(cf)?);
    Ok(())
}

/// The level a `rate_limit_log_level` line names (`http` or `stream`).
pub fn log_level_value(cf: &ngx_conf_t) -> Result<ngx_uint_t, ConfError> {
    let level = match cf.args()[1].as_bytes() {
        b"info" => NGX_LOG_INFO,
        b"notice" => NGX_LOG_NOTICE,
        b"warn" => NGX_LOG_WARN,
        b"error" => NGX_LOG_ERR,
        other => {
            return Err(ConfError::InvalidLogLevel(
                String::from_utf8_lossy(other).into_owned(),
            ))
        }
    };
    Ok(level as ngx_uint_t)
}

/// `rate_limit_remote_net [ipv4=N] [ipv6=M];`
pub extern "C" fn cmd_remote_net(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    crate::glue::guard::entry(
        "conf::directives::cmd_remote_net",
        || ngx::core::NGX_CONF_ERROR,
        || {
            // SAFETY: as for every directive handler; `conf` is our location configuration.
            let (cf, lcf) = unsafe { (&mut *cf, &mut *conf.cast::<LocConf>()) };
            let result = remote_net_value(cf, lcf.remote_net.is_some()).map(|prefixes| {
                lcf.remote_net = Some(prefixes);
            });
            answer(cf, result)
        },
    )
}

/// The prefix lengths a `rate_limit_remote_net` line gives (`http` or `stream`); `given`: the
/// context has one already.
pub fn remote_net_value(cf: &ngx_conf_t, given: bool) -> Result<NetPrefixes, ConfError> {
    if given {
        return Err(ConfError::Duplicate("rate_limit_remote_net"));
    }
    let words = cf.words(1)?;
    NetPrefixes::parse_words(&words).map_err(|error| ConfError::Spec {
        directive: "rate_limit_remote_net",
        error,
    })
}

/// `rate_limit_admin [write=on|off];`
pub extern "C" fn cmd_admin(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    crate::glue::guard::entry(
        "conf::directives::cmd_admin",
        || ngx::core::NGX_CONF_ERROR,
        || {
            // SAFETY: as for every directive handler; `conf` is our location configuration.
            let (cf, lcf) = unsafe { (&mut *cf, &mut *conf.cast::<LocConf>()) };
            let result = admin(cf, lcf);
            answer(cf, result)
        },
    )
}

fn admin(cf: &mut ngx_conf_t, lcf: &mut LocConf) -> Result<(), ConfError> {
    if lcf.admin.is_some() {
        return Err(ConfError::Duplicate("rate_limit_admin"));
    }
    {
        let clcf = NgxHttpCoreModule::location_conf_mut(cf).ok_or(ConfError::Logged)?;
        let name = String::from_utf8_lossy(clcf.name.as_bytes()).into_owned();
        if !clcf.regex.is_null() {
            return Err(ConfError::AdminLocation {
                kind: "regex",
                name,
            });
        }
        if clcf.named() != 0 {
            return Err(ConfError::AdminLocation {
                kind: "named",
                name,
            });
        }
        // As proxy_pass does: a request for the prefix without its slash (`/ratelimit`) is
        // redirected to it (301) by nginx's location search, instead of missing the location.
        if name.ends_with('/') {
            clcf.set_auto_redirect(1);
        }
    }
    let mut admin_conf = AdminConf::default();
    for word in &cf.args()[1..] {
        match word.as_bytes() {
            b"write=on" => admin_conf.write = true,
            b"write=off" => admin_conf.write = false,
            other => {
                let word = String::from_utf8_lossy(other).into_owned();
                let hint = ratelimit_core::hint::parameter_hint(&word, &["write=on", "write=off"]);
                return Err(ConfError::UnknownParameter { word, hint });
            }
        }
    }
    lcf.admin = Some(admin_conf);
    // The server's own configuration (the one a request has before a location is found).
    let server = NgxHttpCoreModule::server_conf(&*cf).and_then(|cscf| {
        // SAFETY: a server's ctx is its configuration context, live while configuring;
        // its loc_conf array has an element for every HTTP module.
        unsafe {
            let ctx = cscf.ctx.as_ref()?;
            let index = (*super::module_ptr()).ctx_index;
            (*ctx.loc_conf.add(index)).cast::<LocConf>().as_mut()
        }
    });
    server.ok_or(ConfError::Logged)?.admin_server = true;
    let handler = main_conf(cf).ok_or(ConfError::Logged)?.hooks.admin_handler;
    let clcf = NgxHttpCoreModule::location_conf_mut(cf).ok_or(ConfError::Logged)?;
    clcf.handler = handler;
    Ok(())
}

/// `rate_limit_state_file PATH;` (the http and the stream directive)
pub extern "C" fn cmd_state_file(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    _conf: *mut c_void,
) -> *mut c_char {
    crate::glue::guard::entry(
        "conf::directives::cmd_state_file",
        || ngx::core::NGX_CONF_ERROR,
        || {
            // SAFETY: as for every directive handler.
            let cf = unsafe { &mut *cf };
            let result = state_file(cf);
            answer(cf, result)
        },
    )
}

/// `rate_limit_state_file PATH;` in `http {}` or `stream {}`: one per configuration, for
/// every zone whichever block declared it.
pub fn state_file(cf: &mut ngx_conf_t) -> Result<(), ConfError> {
    let path = String::from_utf8_lossy(cf.args()[1].as_bytes()).into_owned();
    let registry = registry::configuring(cf).ok_or(ConfError::Logged)?;
    if registry.state_file.is_some() {
        return Err(ConfError::Duplicate("rate_limit_state_file"));
    }
    if path.is_empty() {
        return Err(ConfError::EmptyStateFile);
    }
    registry.state_file = Some(path);
    Ok(())
}
