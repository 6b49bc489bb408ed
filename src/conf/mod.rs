//! Configuration: the directives turned into structures. `directives` holds the `cmd_*`
//! handlers, `sync` the `rate_limit_sync` directive and its TLS files, `key` what is settled
//! about keys once nginx has bound its variables.
//!
//! Configuration calls neither the control layer nor a front door: what they must do at
//! configuration time, they hand over as [`Hooks`] before the `http` block is read.

pub mod directives;
mod empty_key;
mod error;
pub mod ext;
pub mod key;
pub mod prices;
pub mod registry;
pub mod sync;
mod tls;
pub mod unreached;
pub mod usage_proxy;

use core::cell::{Cell, RefCell};
use core::ptr;

use nginx_sys::ngx_stream_complex_value_t;
use ngx::ffi::ngx_module_t;
use ngx::ffi::{
    ngx_conf_t, ngx_flag_t, ngx_http_complex_value_t, ngx_http_core_srv_conf_t,
    ngx_http_handler_pt, ngx_int_t, ngx_shm_zone_init_pt, ngx_shm_zone_t, ngx_uint_t, NGX_LOG_ERR,
    NGX_LOG_INFO,
};
use ngx::http::{HttpModule, HttpModuleLocationConf, HttpModuleMainConf, Merge, MergeConfigError};
use ratelimit_core::api_key::Api;
use ratelimit_core::concurrency::ConcurrencySpec;
use ratelimit_core::key_form::{KeyForm, NetPrefixes};
use ratelimit_core::penalty::{BlockPolicy, StatusMatcher};
use ratelimit_core::quota::{QuotaSpec, QuotaWindow};
use ratelimit_core::usage::{OnMissing, Provider, Weights};
use ratelimit_core::{Algorithm, BucketCharge, DelayMode, Limits, Rate};

use crate::store::sync_record::name_seed;
use crate::store::{Zone, ZoneLayout};
pub use error::ConfError;
use ext::ConfExt;
pub use sync::SyncConf;

/// The module as the `ngx` crate sees it: where nginx keeps its configuration structures.
/// Every part reaches its configuration through it (`RateLimitModule::main_conf(r)`).
pub struct RateLimitModule;

impl HttpModule for RateLimitModule {
    fn module() -> &'static ngx_module_t {
        // SAFETY: the module static is only written by nginx while loading the module.
        unsafe { &*module_ptr() }
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

/// The module registered by `lib.rs` (the tag of its shared memory zones, its index).
pub fn module_ptr() -> *mut ngx_module_t {
    ptr::addr_of_mut!(crate::ngx_http_rate_limit_module)
}

/// nginx's "not set" value of a setting (`NGX_CONF_UNSET`).
pub const UNSET: isize = -1;

/// `http`-level state: the zones declared and the zone names `rate_limit` refers to, checked
/// once the whole `http` block is read.
#[derive(Default)]
pub struct MainConf {
    pub zones: Vec<*mut ZoneConf>,
    pub references: Vec<ZoneReference>,
    /// Index of `$rate_limit_status` in `r->variables`: where a request's outcome is kept
    /// (it survives internal redirects, unlike module contexts, and subrequests share it).
    pub status_variable: Option<ngx_uint_t>,
    /// `rate_limit_sync`: the fleet's shared store.
    pub sync: Option<SyncConf>,
    /// Some `rate_limit` line has `on_status=`: the log-phase handler is installed.
    pub on_status_used: bool,
    /// Some `rate_limit` line has `usage=`: the body reader's filters and the settling
    /// log-phase handler are installed.
    pub usage_used: bool,
    /// Where each `rate_limit` line is, to warn about the ones `return` keeps from running.
    pub limited_places: Vec<unreached::LimitedPlace>,
    /// Every `proxy_pass` line, to warn about usage its responses may not let be read.
    pub proxied_places: Vec<usage_proxy::ProxiedPlace>,
    /// `rate_limit_prices` tables, by the index a `prices=` word holds (`UsageConf::prices`).
    pub prices: Vec<prices::NamedPrices>,
    /// `$rate_limit_usage_model` is used (a log format names it): the body reader looks for
    /// the model of every usage-based request, priced or not.
    pub usage_model_used: bool,
    pub hooks: Hooks,
}

/// The handlers configuration installs on behalf of the layers above it, set by `lib.rs`
/// before the `http` block is read.
#[derive(Default)]
pub struct Hooks {
    /// Content handler of a location with `rate_limit_admin`.
    pub admin_handler: ngx_http_handler_pt,
    /// Init callback of every `rate_limit_zone`'s shared memory.
    pub zone_init: ngx_shm_zone_init_pt,
}

/// A zone name used by `rate_limit zone=` or `global=`, with where it was written.
pub struct ZoneReference {
    pub name: String,
    pub global: bool,
    pub local_algorithm_needed: Option<Algorithm>,
    pub burst_given: bool,
    /// `nodelay` or `delay=` was given (a concurrency zone queues instead).
    pub delay_given: Option<&'static str>,
    /// `burst=` of the `rate_limit` line, which applies to its zone and its `global=` zone.
    pub burst: Option<u64>,
    /// The line has `usage=`: its zone must be a bucket, not synced.
    pub usage_given: bool,
    /// The configuration file and line of the `rate_limit` directive: the references are
    /// checked after the whole `http` block is read, when nginx's own position is its `}`.
    pub file: String,
    pub line: usize,
    /// The core module's configuration of the server the line is in (for a line at `http`
    /// level, the `http` block's own, which is no server's).
    pub server: *const ngx_http_core_srv_conf_t,
}

impl ZoneReference {
    /// `error`, placed at the `rate_limit` line it is about.
    pub fn error(&self, error: ConfError) -> ConfError {
        ConfError::At {
            error: Box::new(error),
            file: self.file.clone(),
            line: self.line,
        }
    }
}

/// One `rate_limit_zone`: lives in the configuration pool of its cycle; `shm_zone.data`
/// points here.
pub struct ZoneConf {
    pub name: String,
    pub shm_zone: *mut ngx_shm_zone_t,
    /// KEY compiled in the block that declared the zone, whose door alone reads it.
    pub key: ZoneKey,
    /// This worker's `RateLimit-Policy` item for the zone (`"NAME";q=Q;w=W`) and the rate it
    /// was formatted for, formatted again only when the zone's rate changes.
    pub policy_item: RefCell<Option<(Rate, Vec<u8>)>>,
    pub key_text: String,
    /// How the admin API, Lua and logs show and take the zone's keys (`$binary_remote_addr`:
    /// as addresses).
    pub key_form: KeyForm,
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
    /// `algorithm=concurrency`: its `limit=`, `queue=` and `queue_timeout=` (its `limits`
    /// are then unused).
    pub concurrency: Option<ConcurrencySpec>,
    /// `algorithm=quota`: its `limit=`, `period=` and `tz=` (its `limits` hold the limit).
    pub quota: Option<QuotaSpec>,
    /// This worker's current period of a quota zone, computed again only once it ended.
    pub quota_period: Cell<QuotaPeriod>,
    /// `block=` and `block_max=`: a key rejected by the zone is blocked for a while.
    pub block: Option<BlockPolicy>,
}

/// A zone's KEY, compiled in the context (`http` or `stream`) the zone was declared in. The
/// http forms are two variants, not a variant with an optional index, so that the request
/// path decides how to read its key with the one test it made before keys were typed.
pub enum ZoneKey {
    /// An http KEY that is a single variable (`$binary_remote_addr`): read by its index,
    /// without evaluating a complex value into a fresh buffer.
    HttpVariable(HttpVariable),
    /// Any other http KEY, evaluated as a complex value.
    HttpComplex(ngx_http_complex_value_t),
    Stream(StreamKey),
}

impl ZoneKey {
    /// Whether the zone was declared in `stream {}`.
    pub fn is_stream(&self) -> bool {
        matches!(self, ZoneKey::Stream(_))
    }

    /// The key of a zone declared in `stream {}`.
    pub fn stream(&self) -> Option<&StreamKey> {
        match self {
            ZoneKey::Stream(key) => Some(key),
            ZoneKey::HttpVariable(_) | ZoneKey::HttpComplex(_) => None,
        }
    }
}

/// An http KEY that is a single variable.
pub struct HttpVariable {
    /// Its index in the http variables.
    pub index: ngx_uint_t,
    /// When KEY is nginx's own `$arg_NAME`, NAME (lowercase): the value is read from the
    /// query string directly. Set by [`key::resolve_query_arg_keys`] once variables are
    /// bound.
    pub query_arg: Option<Vec<u8>>,
}

/// The KEY of a zone of the `stream` block.
pub struct StreamKey {
    pub value: ngx_stream_complex_value_t,
    /// When KEY is a single variable, its stream index.
    pub variable: Option<ngx_uint_t>,
    /// KEY uses a variable ssl_preread sets (`$ssl_preread_server_name`): the zone's lines are
    /// decided after the preread phase, once ssl_preread has read the ClientHello.
    pub after_preread: bool,
}

impl ZoneConf {
    pub fn layout(&self) -> ZoneLayout {
        ZoneLayout {
            algorithm: self.algorithm,
            limits: self.limits,
            fingerprint: fingerprint(&self.key_text, self.algorithm, self.block.is_some())
                ^ self.quota.as_ref().map_or(0, calendar_fingerprint),
            sync_seed: self.sync.then(|| name_seed(&self.name)),
            concurrency: self.concurrency.as_ref().map(ConcurrencySpec::limits),
            block: self.block.is_some(),
        }
    }
}

/// A quota zone's period as a worker last computed it: its window (tag and end) and its start,
/// on the monotonic clock of the request path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuotaPeriod {
    /// The period's start (0 for one that began before the monotonic clock did: at boot).
    pub start_ns: u64,
    pub window: QuotaWindow,
    /// Its length in milliseconds (a day may have 23 or 25 hours, a month 28 to 31 days).
    pub length_ms: u64,
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

/// One `rate_limit` line (or the options a Lua call gives in its place).
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
    /// `on_status=CODES`: a request is charged at the door and given back after the response
    /// unless its final status matches.
    pub on_status: Option<StatusMatcher>,
    /// `cost=$name`: the variable's index (a value that is not a number costs `cost`).
    pub cost_variable: Option<ngx_uint_t>,
    /// `usage=` and its words: reserved at the door, settled after the response.
    pub usage: Option<UsageConf>,
    /// `headers=off` is not given: the line shows in `RateLimit`, `RateLimit-Policy` and
    /// `Retry-After` (when the location's `rate_limit_headers` is on, for the first two).
    pub headers: bool,
}

impl LimitConf {
    /// Whether the request's cost is known only per request (`cost=$var`, `usage=`).
    #[inline]
    pub fn cost_per_request(&self) -> bool {
        self.cost_variable.is_some() || self.usage.is_some()
    }
}

/// `usage=` and its words on a `rate_limit` line, with variables indexed.
#[derive(Clone, Copy, Debug)]
pub struct UsageConf {
    pub source: UsageSourceConf,
    /// The API `usage=` names: where `$rate_limit_api_key` reads the credential.
    pub api: Option<Api>,
    pub reserve: AmountConf,
    /// `debt=`; `None`: one capacity of the zone's bucket.
    pub debt: Option<u64>,
    pub on_missing: OnMissing,
    pub weights: Weights,
    /// `prices=NAME`: the table's index in `MainConf::prices`; the cost is then in
    /// micro-dollars, for the model the response names.
    pub prices: Option<usize>,
}

/// Where the cost after the response comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UsageSourceConf {
    Reader(Provider),
    /// A variable (its index) read in the log phase.
    Variable(ngx_uint_t),
}

/// A number of tokens, fixed or read from a variable (its index) per request.
#[derive(Clone, Copy, Debug)]
pub enum AmountConf {
    Fixed(u64),
    Variable(ngx_uint_t),
    /// `auto[:DEFAULT]`: read from the request body (DEFAULT when it sets no ceiling).
    Auto(u64),
}

/// `rate_limit_admin [write=on]`.
#[derive(Clone, Copy, Debug, Default)]
pub struct AdminConf {
    pub write: bool,
}

/// The location's settings. `status`, `dry_run` and `headers` are set by nginx's own
/// setters (`ngx_conf_set_num_slot`, `ngx_conf_set_flag_slot`) and are [`UNSET`] until then.
pub struct LocConf {
    pub limits: Option<Vec<LimitConf>>,
    pub status: ngx_int_t,
    pub dry_run: ngx_flag_t,
    pub log_level: Option<ngx_uint_t>,
    pub headers: ngx_flag_t,
    /// `rate_limit_openai_headers on`: `x-ratelimit-*-tokens` / `-requests` headers and an
    /// OpenAI-shaped 429 body.
    pub openai_headers: ngx_flag_t,
    /// `rate_limit_grpc off`: refused gRPC calls get the location's status, not gRPC's
    /// RESOURCE_EXHAUSTED.
    pub grpc: ngx_flag_t,
    pub admin: Option<AdminConf>,
    /// `rate_limit_remote_net`: the prefix lengths of `$rate_limit_remote_net`.
    pub remote_net: Option<NetPrefixes>,
    /// Set on a server's own configuration when one of its locations has `rate_limit_admin`:
    /// a request refused before a location is matched (414) is answered in JSON. Not merged.
    pub admin_server: bool,
    /// How the location's lines are decided: worked out (in each worker) on the location's
    /// first request, once zones are known. Not merged.
    pub shape: Cell<Option<Shape>>,
    /// What the proxy module's directives of this level say (`usage_proxy.rs`).
    pub proxy: usage_proxy::ProxySeen,
}

/// How a location's `rate_limit` lines are decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// One line on a rate zone, with nothing to report or keep for the response: no
    /// headers, `global=`, `on_status=`, per-request cost, `sync` or `block=`. A request
    /// that passes is charged and counted, and that is all.
    Quick,
    /// Rate lines only, in any other configuration.
    Rates,
    /// At least one line on a concurrency zone.
    Concurrency,
}

impl Default for LocConf {
    fn default() -> LocConf {
        LocConf {
            limits: None,
            status: UNSET,
            dry_run: UNSET,
            log_level: None,
            headers: UNSET,
            openai_headers: UNSET,
            grpc: UNSET,
            admin: None,
            remote_net: None,
            admin_server: false,
            shape: Cell::new(None),
            proxy: usage_proxy::ProxySeen::default(),
        }
    }
}

impl LocConf {
    pub fn status(&self) -> ngx_uint_t {
        if self.status == UNSET {
            429
        } else {
            self.status as ngx_uint_t
        }
    }
    pub fn dry_run(&self) -> bool {
        self.dry_run == 1
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
    #[inline]
    pub fn headers(&self) -> bool {
        self.headers != 0
    }
    /// Refused gRPC calls are answered in gRPC's terms (on unless `rate_limit_grpc off`).
    pub fn grpc(&self) -> bool {
        self.grpc != 0
    }
    #[inline]
    pub fn openai_headers(&self) -> bool {
        self.openai_headers == 1
    }
    #[inline]
    pub fn limits(&self) -> &[LimitConf] {
        self.limits.as_deref().unwrap_or(&[])
    }

    /// The API the location's `usage=` lines name (one at most: `rate_limit` refuses two).
    pub fn api(&self) -> Option<Api> {
        self.limits().iter().find_map(|limit| limit.usage?.api)
    }

    /// Whether the location's lines need the request body before they are decided: a
    /// `reserve=auto` line, or one that reads a provider's response (whose request may have
    /// to ask for usage).
    pub fn reads_body(&self) -> bool {
        self.limits().iter().any(|limit| {
            limit.usage.is_some_and(|usage| {
                matches!(usage.reserve, AmountConf::Auto(_))
                    || matches!(usage.source, UsageSourceConf::Reader(_))
            })
        })
    }
}

impl Merge for LocConf {
    fn merge(&mut self, prev: &LocConf) -> Result<(), MergeConfigError> {
        if self.limits.is_none() {
            self.limits = prev.limits.clone();
        }
        let merge = |value: &mut isize, prev: isize| {
            if *value == UNSET {
                *value = prev;
            }
        };
        merge(&mut self.status, prev.status);
        merge(&mut self.dry_run, prev.dry_run);
        merge(&mut self.headers, prev.headers);
        merge(&mut self.openai_headers, prev.openai_headers);
        merge(&mut self.grpc, prev.grpc);
        self.log_level = self.log_level.or(prev.log_level);
        self.remote_net = self.remote_net.or(prev.remote_net);
        self.proxy.merge(&prev.proxy);
        Ok(())
    }
}

/// Hash of a zone's key text, algorithm and whether it has `block=`, to notice a reload that
/// changes one of them (the zone's memory is then laid out again).
fn fingerprint(key_text: &str, algorithm: Algorithm, block: bool) -> u64 {
    use std::hash::BuildHasher;
    let seed = foldhash::quality::FixedState::with_seed(0);
    if block {
        // A zone without block= keeps the fingerprint it had before blocks existed.
        return seed.hash_one((key_text, algorithm.as_str(), "block"));
    }
    seed.hash_one((key_text, algorithm.as_str()))
}

/// A quota zone's period and time zone: a reload that changes either starts the counts
/// afresh (a count's period tag means nothing in another calendar).
fn calendar_fingerprint(quota: &QuotaSpec) -> u64 {
    use std::hash::BuildHasher;
    let calendar = &quota.calendar;
    foldhash::quality::FixedState::with_seed(0)
        .hash_one((calendar.unit.as_str(), calendar.tz_name.as_str()))
}

pub fn main_conf(cf: &ngx_conf_t) -> Option<&'static mut MainConf> {
    RateLimitModule::main_conf_mut(cf)
}

/// Every zone of the configuration.
pub fn zones(mcf: &MainConf) -> impl Iterator<Item = &ZoneConf> {
    mcf.zones
        .iter()
        // SAFETY: zone configurations live in the configuration pool of the cycle `mcf`
        // belongs to, as long as `mcf` does.
        .filter_map(|&zone| unsafe { zone.as_ref() })
}

/// Once the whole `http` block is read: check every zone name `rate_limit` used (errors name
/// the `rate_limit` line they are about, not the `}` that ends `http`), and that a `sync`
/// zone has `rate_limit_sync`.
pub fn postconfiguration(cf: &mut ngx_conf_t) -> Result<(), ConfError> {
    let Some(mcf) = main_conf(cf) else {
        return Ok(());
    };
    for reference in &mcf.references {
        let zone = mcf.zones.iter().find(|&&zone| {
            // SAFETY: zone configurations live in the configuration pool of this cycle.
            unsafe { (*zone).name == reference.name }
        });
        let Some(&zone) = zone else {
            let declared = zones(mcf).map(|zone| zone.name.as_str());
            return Err(reference.error(ConfError::unknown_zone(&reference.name, declared)));
        };
        // SAFETY: as above; nothing else holds a reference to the zone's configuration while
        // the configuration is being read.
        check_reference(reference, unsafe { &mut *zone })?;
    }
    prices::check_declared(mcf)?;
    mcf.usage_model_used = prices::variable_used(cf, b"rate_limit_usage_model");
    if mcf.sync.is_none() {
        if let Some(zone) = zones(mcf).find(|zone| zone.sync) {
            return Err(ConfError::SyncNotConfigured(zone.name.clone()));
        }
    }
    empty_key::warn_empty_keys(cf, mcf);
    unreached::warn_unreached(cf, &mcf.limited_places);
    usage_proxy::warn_unreadable_usage(cf, mcf);
    let index = variable_index(cf, b"rate_limit_status")?;
    if let Some(mcf) = main_conf(cf) {
        mcf.status_variable = Some(index);
    }
    Ok(())
}

/// Check a `rate_limit` line's use of its zone (`http` or `stream`), and note its burst in
/// the zone's.
pub fn check_reference(reference: &ZoneReference, zone: &mut ZoneConf) -> Result<(), ConfError> {
    zone.bursts.add(reference.burst);
    if reference.global && zone.block.is_some() {
        return Err(reference.error(ConfError::GlobalWithBlock(zone.name.clone())));
    }
    if reference.usage_given {
        check_usage_zone(zone).map_err(|error| reference.error(error))?;
    }
    if let Some(needed) = reference.local_algorithm_needed {
        if zone.algorithm != needed {
            let role = if reference.global {
                "global zone"
            } else {
                "zone"
            };
            return Err(reference.error(ConfError::GlobalNeedsTokenBucket {
                role,
                zone: zone.name.clone(),
                algorithm: zone.algorithm,
            }));
        }
    }
    if let (Some(word), true) = (reference.delay_given, zone.algorithm.counts_in_flight()) {
        return Err(reference.error(ConfError::DelayNotUsed {
            word,
            zone: zone.name.clone(),
        }));
    }
    // A concurrency line's `burst=` is its queue's places.
    let burst_taken = zone.algorithm.takes_burst() || zone.algorithm.counts_in_flight();
    if reference.burst_given && !burst_taken {
        return Err(reference.error(ConfError::BurstNotUsed {
            algorithm: zone.algorithm,
            zone: zone.name.clone(),
        }));
    }
    // The line's burst at the zone's rate: the largest bucket the rate allows, as the zone's
    // own burst is checked.
    if let Some(burst) = reference.burst {
        let limits = Limits {
            burst,
            ..zone.limits
        };
        if let Err(error) = limits.check_bucket(zone.algorithm) {
            let directive = "rate_limit";
            return Err(reference.error(ConfError::Spec { directive, error }));
        }
    }
    Ok(())
}

/// A zone a `usage=` line can settle in: a leaky or token bucket or a quota (whose state can
/// carry a debt), not synced (the fleet's grants count requests at the door only).
fn check_usage_zone(zone: &ZoneConf) -> Result<(), ConfError> {
    if !matches!(
        zone.algorithm,
        Algorithm::LeakyBucket | Algorithm::TokenBucket | Algorithm::Quota(_)
    ) {
        return Err(ConfError::Usage {
            reason: "needs a leaky_bucket, token_bucket or quota zone",
            zone: zone.name.clone(),
            what: format!("is {}", zone.algorithm),
        });
    }
    Ok(())
}

/// Index a variable by name, as `ngx_http_compile_complex_value` would.
pub fn variable_index(cf: &mut ngx_conf_t, name: &[u8]) -> Result<ngx_uint_t, ConfError> {
    // The name must outlive configuration parsing: copied into the configuration pool.
    let mut name = cf.copy_str(name)?;
    // SAFETY: `cf` is valid during configuration.
    let index = unsafe { ngx::ffi::ngx_http_get_variable_index(cf, &mut name) };
    ngx_uint_t::try_from(index).map_err(|_| ConfError::Logged)
}

/// The shared memory zone NAME of this module (created with `size`, or found when `size`
/// is 0 and it is declared elsewhere).
pub fn add_shared_zone(
    cf: &mut ngx_conf_t,
    name: &str,
    size: u64,
) -> Result<&'static mut ngx_shm_zone_t, ConfError> {
    // The name must outlive the call: copied into the configuration pool.
    let mut name = cf.copy_str(name.as_bytes())?;
    // SAFETY: `cf` is valid; the tag is our module, so zones of other modules never match.
    let zone = unsafe {
        ngx::ffi::ngx_shared_memory_add(cf, &mut name, size as usize, module_ptr().cast())
    };
    // SAFETY: a non-null zone lives in the cycle being configured.
    unsafe { zone.as_mut() }.ok_or(ConfError::Logged)
}
