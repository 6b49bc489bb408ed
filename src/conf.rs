//! Directives: the configuration structures and the `cmd_*` handlers that fill them.
//!
//! Every handler turns its raw pointers into references in its first lines and then works on
//! safe values; the words of `rate_limit_zone` and `rate_limit` are parsed by the algorithm
//! crate (`ZoneSpec`, `LimitSpec`) so that the replay tool reads them the same way.

use core::cell::Cell;
use core::ffi::{c_char, c_void};
use core::{mem, ptr};

use ngx::core::{Pool, NGX_CONF_ERROR, NGX_CONF_OK};
use ngx::ffi::{
    ngx_command_t, ngx_conf_t, ngx_http_compile_complex_value, ngx_http_compile_complex_value_t,
    ngx_http_complex_value_t, ngx_shared_memory_add, ngx_shm_zone_t, ngx_str_t, ngx_uint_t,
    NGX_LOG_EMERG, NGX_LOG_ERR, NGX_LOG_INFO, NGX_LOG_NOTICE, NGX_LOG_WARN,
};
use ngx::http::{
    HttpModuleMainConf, HttpModuleServerConf, Merge, MergeConfigError, NgxHttpCoreModule,
};
use ngx::{ngx_conf_log_error, ngx_log_error};
use ratelimit_core::{Algorithm, BucketCharge, DelayMode, LimitSpec, Limits, SpecError, ZoneSpec};

use crate::zone::{Zone, ZoneLayout};
use crate::{admin, module_ptr, RateLimitModule};

/// `http`-level state: the zones declared and the zone names `rate_limit` refers to, checked
/// once the whole `http` block is read.
#[derive(Default)]
pub struct MainConf {
    pub zones: Vec<*mut ZoneConf>,
    pub references: Vec<ZoneReference>,
    /// Index of `$rate_limit_status` in `r->variables`: where a request's outcome is kept
    /// (it survives internal redirects, unlike module contexts, and subrequests share it).
    pub status_variable: Option<ngx_uint_t>,
    /// `rate_limit_state_file`: where admin changes are persisted.
    pub state_file: Option<String>,
    /// `rate_limit_sync`: the fleet's shared store.
    pub sync: Option<crate::sync::SyncConf>,
}

/// A zone name used by `rate_limit zone=` or `global=`, with where it was written.
pub struct ZoneReference {
    pub name: String,
    pub global: bool,
    pub local_algorithm_needed: Option<String>,
    pub burst_given: bool,
    /// `burst=` of the `rate_limit` line, which applies to its zone and its `global=` zone.
    pub burst: Option<u64>,
    /// The configuration file and line of the `rate_limit` directive: the references are
    /// checked after the whole `http` block is read, when nginx's own position is its `}`.
    pub file: String,
    pub line: usize,
}

impl ZoneReference {
    /// ` in FILE:LINE`, as nginx ends the messages of errors found in a file.
    fn place(&self) -> String {
        format!(" in {}:{}", self.file, self.line)
    }
}

/// One `rate_limit_zone`: lives in the configuration pool of its cycle; `shm_zone.data`
/// points here.
pub struct ZoneConf {
    pub name: String,
    pub shm_zone: *mut ngx_shm_zone_t,
    pub key: ngx_http_complex_value_t,
    /// When KEY is a single variable (`$binary_remote_addr`), its index: read directly,
    /// without evaluating a complex value into a fresh buffer.
    pub key_variable: Option<ngx_uint_t>,
    /// When KEY is nginx's own `$arg_NAME`, NAME (lowercase): the value is read from the
    /// query string directly. Set by `key::resolve_query_arg_keys` once variables are bound.
    pub key_query_arg: Option<Vec<u8>>,
    /// This worker's `RateLimit-Policy` item for the zone (`"NAME";q=Q;w=W`) and the rate it
    /// was formatted for: formatting it cost more than all the rest of the two headers.
    pub policy_item: core::cell::RefCell<Option<(ratelimit_core::Rate, Vec<u8>)>>,
    pub key_text: String,
    pub algorithm: Algorithm,
    /// Limits as written in the configuration.
    pub limits: Limits,
    pub size: u64,
    /// The process-local view of the shared memory, set by the zone's init callback.
    pub zone: Option<Zone>,
    /// `sync`: the zone's limits hold across the fleet (`rate_limit_sync`).
    pub sync: bool,
    /// The bursts its `rate_limit` lines apply (set once the `http` block is read).
    pub bursts: LocationBursts,
}

/// The bursts requests of a zone are decided with: a `rate_limit` line's own `burst=` takes
/// the place of the zone's. The fleet (`rate_limit_sync`) sizes a key's shared bucket with the
/// largest of them; each request is still decided locally with its own line's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LocationBursts {
    /// The largest `burst=` given on a line using the zone.
    pub largest_given: Option<u64>,
    /// Whether some line (or none at all) leaves the zone's own burst in force.
    pub zone_burst_used: bool,
}

impl LocationBursts {
    /// The burst of the largest bucket a request of the zone can see, `zone_burst` being the
    /// zone's own now (the admin API can change it).
    pub fn largest(&self, zone_burst: u64) -> u64 {
        match self.largest_given {
            Some(given) if self.zone_burst_used => given.max(zone_burst),
            Some(given) => given,
            None => zone_burst,
        }
    }

    fn add(&mut self, burst: Option<u64>) {
        match burst {
            Some(burst) => {
                self.largest_given = Some(self.largest_given.map_or(burst, |b| b.max(burst)));
            }
            None => self.zone_burst_used = true,
        }
    }
}

impl ZoneConf {
    pub fn layout(&self) -> ZoneLayout {
        ZoneLayout {
            algorithm: self.algorithm,
            limits: self.limits,
            fingerprint: fingerprint(&self.key_text, self.algorithm),
            sync_seed: self.sync.then(|| crate::sync::name_seed(&self.name)),
        }
    }
}

/// One `rate_limit` line.
#[derive(Clone)]
pub struct LimitConf {
    pub name: String,
    pub shm_zone: *mut ngx_shm_zone_t,
    pub burst: Option<u64>,
    pub delay: DelayMode,
    pub global: Option<*mut ngx_shm_zone_t>,
    pub cost: u64,
    /// This worker's [`BucketCharge`] for the zone limits word it was computed from (0 when
    /// none yet): the request path recomputes it only when the zone's limits change.
    pub charge_cache: Cell<(u64, Option<BucketCharge>)>,
}

/// `rate_limit_admin [write=on]`.
#[derive(Clone, Copy, Debug, Default)]
pub struct AdminConf {
    pub write: bool,
}

#[derive(Default)]
pub struct LocConf {
    pub limits: Option<Vec<LimitConf>>,
    pub status: Option<ngx_uint_t>,
    pub dry_run: Option<bool>,
    pub log_level: Option<ngx_uint_t>,
    pub headers: Option<bool>,
    pub admin: Option<AdminConf>,
    /// Set on a server's own configuration when one of its locations has `rate_limit_admin`:
    /// a request refused before a location is matched (414) is answered in JSON. Not merged.
    pub admin_server: bool,
}

impl LocConf {
    pub fn status(&self) -> ngx_uint_t {
        self.status.unwrap_or(429)
    }
    pub fn dry_run(&self) -> bool {
        self.dry_run.unwrap_or(false)
    }
    pub fn log_level(&self) -> ngx_uint_t {
        self.log_level.unwrap_or(NGX_LOG_ERR as ngx_uint_t)
    }
    /// Delays are logged one level below rejections, as limit_req does.
    pub fn delay_log_level(&self) -> ngx_uint_t {
        let level = self.log_level();
        if level == NGX_LOG_INFO as ngx_uint_t {
            level
        } else {
            level + 1
        }
    }
    pub fn headers(&self) -> bool {
        self.headers.unwrap_or(true)
    }
    pub fn limits(&self) -> &[LimitConf] {
        self.limits.as_deref().unwrap_or(&[])
    }
}

impl Merge for LocConf {
    fn merge(&mut self, prev: &LocConf) -> Result<(), MergeConfigError> {
        if self.limits.is_none() {
            self.limits = prev.limits.clone();
        }
        self.status = self.status.or(prev.status);
        self.dry_run = self.dry_run.or(prev.dry_run);
        self.log_level = self.log_level.or(prev.log_level);
        self.headers = self.headers.or(prev.headers);
        Ok(())
    }
}

/// Hash of a zone's key text and algorithm, to notice a reload that changes either.
fn fingerprint(key_text: &str, algorithm: Algorithm) -> u64 {
    use std::hash::BuildHasher;
    foldhash::quality::FixedState::with_seed(0).hash_one((key_text, algorithm.as_str()))
}

/// The directive's arguments, name included (`args[0]`).
pub(crate) fn args(cf: &ngx_conf_t) -> &'static [ngx_str_t] {
    // SAFETY: while a directive handler runs, `cf.args` is an array of `ngx_str_t` holding the
    // directive name and its arguments, allocated in the configuration pool, which outlives
    // configuration parsing (the only time this is called).
    unsafe {
        let args = &*cf.args;
        core::slice::from_raw_parts(args.elts.cast::<ngx_str_t>(), args.nelts)
    }
}

pub(crate) fn words(args: &[ngx_str_t]) -> Result<Vec<&str>, String> {
    args.iter()
        .map(|word| {
            core::str::from_utf8(word.as_bytes()).map_err(|_| {
                format!(
                    "invalid parameter \"{}\"",
                    String::from_utf8_lossy(word.as_bytes())
                )
            })
        })
        .collect()
}

/// Log `message` against the directive being parsed and fail it.
pub(crate) fn conf_error(cf: &mut ngx_conf_t, message: &str) -> *mut c_char {
    ngx_conf_log_error!(NGX_LOG_EMERG, cf, "{message}");
    NGX_CONF_ERROR
}

fn spec_error(cf: &mut ngx_conf_t, directive: &str, error: &SpecError) -> *mut c_char {
    match error {
        SpecError::MissingParameter(_) => conf_error(cf, &format!("\"{directive}\" {error}")),
        _ => conf_error(cf, &error.to_string()),
    }
}

/// Allocate a value in the configuration pool (dropped with it).
fn conf_alloc<T>(cf: &ngx_conf_t, value: T) -> *mut T {
    // SAFETY: `cf.pool` is the live configuration pool of the cycle being built.
    let pool = unsafe { Pool::from_ngx_pool(cf.pool) };
    pool.allocate(value)
}

pub(crate) fn add_shared_zone(cf: &mut ngx_conf_t, name: &str, size: u64) -> *mut ngx_shm_zone_t {
    let mut name_str = ngx_str_t {
        len: name.len(),
        data: name.as_ptr().cast_mut(),
    };
    // The name must outlive the call: copy it into the configuration pool.
    // SAFETY: `cf.pool` is the live configuration pool.
    let copy = unsafe { ngx::ffi::ngx_pnalloc(cf.pool, name.len().max(1)) }.cast::<u8>();
    if copy.is_null() {
        return ptr::null_mut();
    }
    // SAFETY: `copy` has room for `name.len()` bytes.
    unsafe { ptr::copy_nonoverlapping(name.as_ptr(), copy, name.len()) };
    name_str.data = copy;
    // SAFETY: `cf` is valid; the tag is our module, so zones of other modules never match.
    unsafe { ngx_shared_memory_add(cf, &mut name_str, size as usize, module_ptr().cast()) }
}

pub fn main_conf(cf: &ngx_conf_t) -> Option<&'static mut MainConf> {
    RateLimitModule::main_conf_mut(cf)
}

/// `rate_limit_zone KEY zone=NAME:SIZE rate=RATE [burst=N] [algorithm=NAME];`
pub extern "C" fn cmd_rate_limit_zone(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    _conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: nginx calls directive handlers with a valid configuration context.
    let cf = unsafe { &mut *cf };
    let args = args(cf);
    let words = match words(&args[2..]) {
        Ok(words) => words,
        Err(message) => return conf_error(cf, &message),
    };
    let spec = match ZoneSpec::parse_words(&words) {
        Ok(spec) => spec,
        Err(error) => return spec_error(cf, "rate_limit_zone", &error),
    };
    let Some((name, size)) = spec.zone.clone() else {
        return conf_error(cf, "\"rate_limit_zone\" must have \"zone\" parameter");
    };
    // The exact test zone init will make, so that `nginx -t` refuses what could not start,
    // at this line, with the size that would do.
    // SAFETY: ngx_pagesize is set at startup, before any configuration is read.
    let pagesize = unsafe { nginx_sys::ngx_pagesize };
    let layout = ZoneLayout {
        algorithm: spec.algorithm,
        limits: spec.limits(),
        fingerprint: 0,
        sync_seed: spec.sync.then_some(0),
    };
    let fits = usize::try_from(size)
        .is_ok_and(|size| crate::zone::zone_size_fits(size, layout.slot_words(), pagesize));
    if !fits {
        let hint = crate::zone::size_hint(&layout, pagesize);
        return conf_error(cf, &format!("zone \"{name}\" is too small{hint}"));
    }

    let mut key: ngx_http_complex_value_t = unsafe { mem::zeroed() };
    let mut key_arg = args[1];
    // SAFETY: zeroed is the documented initial state of ngx_http_compile_complex_value_t.
    let mut ccv: ngx_http_compile_complex_value_t = unsafe { mem::zeroed() };
    ccv.cf = cf;
    ccv.value = &mut key_arg;
    ccv.complex_value = &mut key;
    // SAFETY: `ccv` points at live values for the duration of the call.
    if unsafe { ngx_http_compile_complex_value(&mut ccv) } != 0 {
        return NGX_CONF_ERROR;
    }

    let key_variable = match single_variable(args[1].as_bytes()) {
        Some(name) => match variable_index(cf, name) {
            Some(index) => Some(index),
            None => return NGX_CONF_ERROR,
        },
        None => None,
    };

    let Some(mcf) = main_conf(cf) else {
        return NGX_CONF_ERROR;
    };
    let duplicate = mcf.zones.iter().any(|&zone| {
        // SAFETY: zone configurations live in the configuration pool of this cycle.
        unsafe { (*zone).name == name }
    });
    if duplicate {
        return conf_error(cf, &format!("duplicate zone \"{name}\""));
    }

    let shm_zone = add_shared_zone(cf, &name, size);
    if shm_zone.is_null() {
        return NGX_CONF_ERROR;
    }
    let zone_conf = conf_alloc(
        cf,
        ZoneConf {
            name: name.clone(),
            shm_zone,
            key,
            key_variable,
            key_query_arg: None,
            policy_item: core::cell::RefCell::new(None),
            key_text: String::from_utf8_lossy(args[1].as_bytes()).into_owned(),
            algorithm: spec.algorithm,
            limits: spec.limits(),
            size,
            zone: None,
            sync: spec.sync,
            bursts: LocationBursts::default(),
        },
    );
    if zone_conf.is_null() {
        return NGX_CONF_ERROR;
    }
    // SAFETY: `shm_zone` was just returned by ngx_shared_memory_add.
    let shm = unsafe { &mut *shm_zone };
    if !shm.data.is_null() {
        return conf_error(cf, &format!("duplicate zone \"{name}\""));
    }
    shm.data = zone_conf.cast();
    shm.init = Some(crate::zone_init);
    mcf.zones.push(zone_conf);
    NGX_CONF_OK
}

/// `$name` or `${name}` alone: the variable's name.
fn single_variable(text: &[u8]) -> Option<&[u8]> {
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

/// Index a variable by name, as `ngx_http_compile_complex_value` would.
pub fn variable_index(cf: &mut ngx_conf_t, name: &[u8]) -> Option<ngx_uint_t> {
    // The name must outlive configuration parsing: copy it into the configuration pool.
    // SAFETY: `cf.pool` is the live configuration pool.
    let copy = unsafe { ngx::ffi::ngx_pnalloc(cf.pool, name.len().max(1)) }.cast::<u8>();
    if copy.is_null() {
        return None;
    }
    // SAFETY: `copy` has room for `name.len()` bytes.
    unsafe { ptr::copy_nonoverlapping(name.as_ptr(), copy, name.len()) };
    let mut name = ngx_str_t {
        len: name.len(),
        data: copy,
    };
    // SAFETY: `cf` is valid during configuration.
    let index = unsafe { ngx::ffi::ngx_http_get_variable_index(cf, &mut name) };
    ngx_uint_t::try_from(index).ok()
}

/// `rate_limit zone=NAME [burst=N] [nodelay | delay=N] [global=NAME] [cost=N];`
pub extern "C" fn cmd_rate_limit(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: nginx calls directive handlers with a valid configuration context, and `conf`
    // is this module's location configuration (NGX_HTTP_LOC_CONF_OFFSET).
    let cf = unsafe { &mut *cf };
    let lcf = unsafe { &mut *conf.cast::<LocConf>() };
    let args = args(cf);
    let words = match words(&args[1..]) {
        Ok(words) => words,
        Err(message) => return conf_error(cf, &message),
    };
    let spec = match LimitSpec::parse_words(&words) {
        Ok(spec) => spec,
        Err(error) => return spec_error(cf, "rate_limit", &error),
    };
    let Some(name) = spec.zone.clone() else {
        return conf_error(cf, "\"rate_limit\" must have \"zone\" parameter");
    };
    let limits = lcf.limits.get_or_insert_with(Vec::new);
    if limits.iter().any(|limit| limit.name == name) {
        return conf_error(cf, &format!("duplicate limit \"{name}\""));
    }
    let shm_zone = add_shared_zone(cf, &name, 0);
    if shm_zone.is_null() {
        return NGX_CONF_ERROR;
    }
    let global = match &spec.global {
        Some(global) => {
            let zone = add_shared_zone(cf, global, 0);
            if zone.is_null() {
                return NGX_CONF_ERROR;
            }
            Some(zone)
        }
        None => None,
    };
    let (file, line) = conf_position(cf);
    let Some(mcf) = main_conf(cf) else {
        return NGX_CONF_ERROR;
    };
    mcf.references.push(ZoneReference {
        name: name.clone(),
        global: false,
        local_algorithm_needed: spec.global.is_some().then(|| "token_bucket".to_string()),
        burst_given: spec.burst.is_some(),
        burst: spec.burst,
        file: file.clone(),
        line,
    });
    if let Some(global) = &spec.global {
        mcf.references.push(ZoneReference {
            name: global.clone(),
            global: true,
            local_algorithm_needed: Some("token_bucket".to_string()),
            burst_given: false,
            burst: spec.burst,
            file,
            line,
        });
    }
    limits.push(LimitConf {
        name,
        shm_zone,
        burst: spec.burst,
        delay: spec.delay,
        global,
        cost: spec.cost.max(1),
        charge_cache: Cell::new((0, None)),
    });
    NGX_CONF_OK
}

/// The file and line of the directive being parsed.
fn conf_position(cf: &ngx_conf_t) -> (String, usize) {
    // SAFETY: while a directive is parsed, `conf_file` is the file being read.
    match unsafe { cf.conf_file.as_ref() } {
        Some(file) => (
            String::from_utf8_lossy(file.file.name.as_bytes()).into_owned(),
            file.line,
        ),
        None => (String::from("(unknown file)"), 0),
    }
}

/// Log an error found after parsing at the place of the directive it is about.
fn reference_error(cf: &ngx_conf_t, reference: &ZoneReference, message: &str) {
    ngx_log_error!(NGX_LOG_EMERG, cf.log, "{message}{}", reference.place());
}

/// Check every zone name `rate_limit` used, now that the whole `http` block is read. Errors
/// name the `rate_limit` line they are about, not the `}` that ends `http`.
pub fn check_references(cf: &mut ngx_conf_t) -> Result<(), ()> {
    let Some(mcf) = main_conf(cf) else {
        return Ok(());
    };
    for reference in &mcf.references {
        let zone = mcf.zones.iter().find(|&&zone| {
            // SAFETY: zone configurations live in the configuration pool of this cycle.
            unsafe { (*zone).name == reference.name }
        });
        let Some(&zone) = zone else {
            let message = format!("unknown zone \"{}\"", reference.name);
            reference_error(cf, reference, &message);
            return Err(());
        };
        // SAFETY: as above; nothing else holds a reference to the zone's configuration while
        // the configuration is being read.
        let zone = unsafe { &mut *zone };
        zone.bursts.add(reference.burst);
        if let Some(needed) = &reference.local_algorithm_needed {
            if zone.algorithm.as_str() != needed {
                let role = if reference.global {
                    "global zone"
                } else {
                    "zone"
                };
                let message = format!(
                    "{role} \"{}\" used with \"global=\" must use algorithm=token_bucket, not {}",
                    zone.name, zone.algorithm
                );
                reference_error(cf, reference, &message);
                return Err(());
            }
        }
        if reference.burst_given
            && matches!(
                zone.algorithm,
                Algorithm::SlidingLog | Algorithm::SlidingWindow
            )
        {
            let message = format!(
                "\"burst\" is not used by {} (zone \"{}\")",
                zone.algorithm, zone.name
            );
            reference_error(cf, reference, &message);
            return Err(());
        }
    }
    Ok(())
}

/// `rate_limit_status CODE;`
pub extern "C" fn cmd_status(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: as for every directive handler; `conf` is our location configuration.
    let cf = unsafe { &mut *cf };
    let lcf = unsafe { &mut *conf.cast::<LocConf>() };
    if lcf.status.is_some() {
        return conf_error(cf, "\"rate_limit_status\" directive is duplicate");
    }
    let value = String::from_utf8_lossy(args(cf)[1].as_bytes()).into_owned();
    match value.parse::<ngx_uint_t>() {
        Ok(code) if (400..=599).contains(&code) => {
            lcf.status = Some(code);
            NGX_CONF_OK
        }
        _ => conf_error(
            cf,
            &format!("invalid status \"{value}\": value must be between 400 and 599"),
        ),
    }
}

fn parse_flag(cf: &mut ngx_conf_t, directive: &str) -> Result<bool, *mut c_char> {
    match args(cf)[1].as_bytes() {
        b"on" => Ok(true),
        b"off" => Ok(false),
        other => {
            let other = String::from_utf8_lossy(other).into_owned();
            Err(conf_error(
                cf,
                &format!("invalid value \"{other}\" in \"{directive}\" directive, it must be \"on\" or \"off\""),
            ))
        }
    }
}

/// An `on|off` directive of the location configuration, set once.
fn cmd_flag(
    cf: *mut ngx_conf_t,
    conf: *mut c_void,
    directive: &str,
    field: fn(&mut LocConf) -> &mut Option<bool>,
) -> *mut c_char {
    // SAFETY: as for every directive handler; `conf` is our location configuration.
    let cf = unsafe { &mut *cf };
    let lcf = unsafe { &mut *conf.cast::<LocConf>() };
    if field(lcf).is_some() {
        return conf_error(cf, &format!("\"{directive}\" directive is duplicate"));
    }
    match parse_flag(cf, directive) {
        Ok(flag) => {
            *field(lcf) = Some(flag);
            NGX_CONF_OK
        }
        Err(error) => error,
    }
}

/// `rate_limit_dry_run on|off;`
pub extern "C" fn cmd_dry_run(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    cmd_flag(cf, conf, "rate_limit_dry_run", |lcf| &mut lcf.dry_run)
}

/// `rate_limit_headers on|off;`
pub extern "C" fn cmd_headers(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    cmd_flag(cf, conf, "rate_limit_headers", |lcf| &mut lcf.headers)
}

/// `rate_limit_log_level info|notice|warn|error;`
pub extern "C" fn cmd_log_level(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: as for every directive handler; `conf` is our location configuration.
    let cf = unsafe { &mut *cf };
    let lcf = unsafe { &mut *conf.cast::<LocConf>() };
    if lcf.log_level.is_some() {
        return conf_error(cf, "\"rate_limit_log_level\" directive is duplicate");
    }
    let level = match args(cf)[1].as_bytes() {
        b"info" => NGX_LOG_INFO,
        b"notice" => NGX_LOG_NOTICE,
        b"warn" => NGX_LOG_WARN,
        b"error" => NGX_LOG_ERR,
        other => {
            let other = String::from_utf8_lossy(other).into_owned();
            return conf_error(cf, &format!("invalid value \"{other}\""));
        }
    };
    lcf.log_level = Some(level as ngx_uint_t);
    NGX_CONF_OK
}

/// `rate_limit_admin [write=on|off];`
pub extern "C" fn cmd_admin(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: as for every directive handler; `conf` is our location configuration.
    let cf = unsafe { &mut *cf };
    let lcf = unsafe { &mut *conf.cast::<LocConf>() };
    if lcf.admin.is_some() {
        return conf_error(cf, "\"rate_limit_admin\" directive is duplicate");
    }
    let mut admin_conf = AdminConf::default();
    for word in &args(cf)[1..] {
        match word.as_bytes() {
            b"write=on" => admin_conf.write = true,
            b"write=off" => admin_conf.write = false,
            other => {
                let other = String::from_utf8_lossy(other).into_owned();
                return conf_error(cf, &format!("invalid parameter \"{other}\""));
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
            let index = (*module_ptr()).ctx_index;
            (*ctx.loc_conf.add(index)).cast::<LocConf>().as_mut()
        }
    });
    match server {
        Some(server) => server.admin_server = true,
        None => return NGX_CONF_ERROR,
    }
    if admin::install_content_handler(cf).is_err() {
        return NGX_CONF_ERROR;
    }
    NGX_CONF_OK
}

/// `rate_limit_state_file PATH;`
pub extern "C" fn cmd_state_file(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    _conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: as for every directive handler.
    let cf = unsafe { &mut *cf };
    let path = String::from_utf8_lossy(args(cf)[1].as_bytes()).into_owned();
    let Some(mcf) = main_conf(cf) else {
        return NGX_CONF_ERROR;
    };
    if mcf.state_file.is_some() {
        return conf_error(cf, "\"rate_limit_state_file\" directive is duplicate");
    }
    if path.is_empty() {
        return conf_error(cf, "invalid state file path \"\"");
    }
    mcf.state_file = Some(path);
    NGX_CONF_OK
}
