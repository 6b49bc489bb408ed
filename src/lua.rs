//! The C ABI that `lib/resty/rate_limit.lua` calls through LuaJIT's FFI (OpenResty).
//!
//! nginx loads modules with `RTLD_GLOBAL`, so these `#[no_mangle]` functions are visible to
//! `ffi.C`. The ABI is versioned ([`ABI_VERSION`]) and documented in `docs/c-abi.md`; the Lua
//! side declares the same structs and checks the version before its first call.
//!
//! A front door: every function takes the request (`ngx_http_request_t *`, from
//! `resty.core.base.get_request()`) and reaches the zone through the module's http main
//! configuration, by name. Decisions then go through the pipeline the directive uses
//! (`crate::control::decide`), so a Lua location and a `rate_limit` location share state and
//! decide alike; changes of limits go through `crate::control::zones`.
//!
//! No panic may cross `extern "C"`: each body runs in the module's panic guard
//! (`glue::guard`, as every entry nginx calls), which logs a panic in one `alert` line; the
//! call then answers [`Status::Internal`]. Pointers are checked before use; errors are negative
//! codes the Lua side turns into messages.

use core::ffi::c_int;
use core::ptr;
use std::borrow::Cow;

use ngx::ffi::ngx_http_request_t;
use ratelimit_core::penalty::BlockPolicy;
use ratelimit_core::usage::settle::Settlement;
use ratelimit_core::{Decision, DelayMode, LimitSpec, Limits, Outcome, Rate};

use crate::conf::registry;
use crate::conf::{LimitConf, ZoneConf};
use crate::control::concurrency::{self as slots, Arrival, Line, Peek, Refusal};
use crate::control::decide::{self, Applied, AppliedLimit, Charge};
use crate::control::key::Refused;
use crate::control::queue::{self, LuaTurn, Owner};
use crate::glue::{connection_log, now_ns};
use crate::store::{Counter, Zone};

/// Bumped whenever a struct or a function signature below changes.
pub const ABI_VERSION: c_int = 4;

/// What a function returns: 0 or a negative error code (`docs/c-abi.md` lists them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
enum Status {
    Ok = 0,
    /// No request: called from a phase without one (`init_by_lua`, in the master, before
    /// the zones exist).
    NoRequest = -1,
    UnknownZone = -2,
    EmptyKey = -3,
    KeyTooLong = -4,
    /// A null pointer or an options struct no `rate_limit` line could produce.
    BadArgument = -5,
    /// Refused, with the reason written to the caller's error buffer.
    Refused = -6,
    /// `burst` given for a sliding zone, which has none (the directive refuses it too).
    BurstNotUsed = -7,
    /// The zone's shared memory is not set up, or a panic was caught.
    Internal = -8,
    /// `burst` larger than the zone's rate allows (a bucket must drain or refill within 100
    /// years, as `rate_limit` lines are checked); `incoming` and `state` put the largest in
    /// their decision's `remaining`.
    BurstTooLarge = -9,
    /// A rate call on a concurrency zone, or a concurrency call on a rate zone.
    WrongKind = -10,
    /// `leaving` or `uncommit` for a key the request holds no slot of.
    NotHeld = -11,
    /// `settle` on a zone that is not a leaky or token bucket (only a bucket carries a debt).
    NotABucket = -12,
}

/// How a `rate_limit` line's delay words read: `delay_mode` of [`LuaOptions`].
const DELAY_ALL: i32 = 0;
const NO_DELAY: i32 = 1;
const DELAY_THRESHOLD: i32 = 2;

/// `ngx_http_rate_limit_lua_opts_t`: a `rate_limit` line's `burst=`, `delay=`/`nodelay` and
/// `cost=`, as [`ngx_http_rate_limit_lua_parse_opts`] fills it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct LuaOptions {
    /// `burst=N`, or -1 for the zone's burst.
    pub burst: i64,
    /// `delay=N`'s N, read with `delay_mode` 2.
    pub delay: u64,
    pub cost: u64,
    /// 0: delay every excess request (limit_req's default), 1: `nodelay`, 2: `delay=N`.
    pub delay_mode: i32,
}

/// `ngx_http_rate_limit_lua_decision_t`: one decision, in the units of `ratelimit_core`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct LuaDecision {
    /// 1 passed, 2 delayed, 3 rejected.
    pub outcome: i32,
    pub delay_ns: u64,
    pub excess_milli: u64,
    pub remaining: u64,
    pub reset_ns: u64,
    pub retry_after_ns: u64,
}

impl From<Decision> for LuaDecision {
    fn from(decision: Decision) -> LuaDecision {
        LuaDecision {
            outcome: match decision.outcome {
                Outcome::Passed => 1,
                Outcome::Delayed => 2,
                Outcome::Rejected => 3,
            },
            delay_ns: decision.delay_ns,
            excess_milli: decision.excess_milli,
            remaining: decision.remaining,
            reset_ns: decision.reset_ns,
            retry_after_ns: decision.retry_after_ns,
        }
    }
}

impl LuaOptions {
    /// The `rate_limit` line these options stand for.
    fn limit_conf(&self, zone_conf: &ZoneConf, zone: &Zone) -> Result<LimitConf, Status> {
        let delay = match self.delay_mode {
            DELAY_ALL => DelayMode::Delay,
            NO_DELAY => DelayMode::NoDelay,
            DELAY_THRESHOLD => DelayMode::Threshold(self.delay),
            _ => return Err(Status::BadArgument),
        };
        let burst = match self.burst {
            -1 => None,
            burst => Some(
                u64::try_from(burst)
                    .ok()
                    .filter(|&burst| burst <= Limits::MAX_BURST)
                    .ok_or(Status::BadArgument)?,
            ),
        };
        if burst.is_some() && !zone_conf.algorithm.takes_burst() {
            return Err(Status::BurstNotUsed);
        }
        if let (Some(burst), Some(live)) = (burst, zone.limits()) {
            if (Limits { burst, ..live })
                .check_bucket(zone_conf.algorithm)
                .is_err()
            {
                return Err(Status::BurstTooLarge);
            }
        }
        if self.cost == 0 {
            return Err(Status::BadArgument);
        }
        Ok(LimitConf {
            name: String::new(),
            shm_zone: zone_conf.shm_zone,
            burst,
            delay,
            global: None,
            cost: self.cost,
            charge_cache: Default::default(),
            on_status: None,
            cost_variable: None,
            usage: None,
            headers: true,
        })
    }
}

impl From<Refused> for Status {
    fn from(refused: Refused) -> Status {
        match refused {
            Refused::Empty => Status::EmptyKey,
            Refused::TooLong => Status::KeyTooLong,
        }
    }
}

/// Run `body` in the module's panic guard (`glue::guard::entry`): a panic is logged, and the
/// call answers [`Status::Internal`].
fn guarded(body: impl FnOnce() -> Result<(), Status>) -> c_int {
    crate::glue::guard::entry(
        "lua",
        || Status::Internal as c_int,
        || match body() {
            Ok(()) => Status::Ok as c_int,
            Err(status) => status as c_int,
        },
    )
}

/// `len` bytes at `data`, or `None` for a null pointer with a length.
///
/// # Safety
/// A non-null `data` points to `len` readable bytes that outlive the call.
unsafe fn bytes<'a>(data: *const u8, len: usize) -> Option<&'a [u8]> {
    if len == 0 {
        return Some(&[]);
    }
    if data.is_null() {
        return None;
    }
    // SAFETY: the caller's contract; LuaJIT passes a Lua string's bytes, alive for the call.
    Some(unsafe { core::slice::from_raw_parts(data, len) })
}

/// Copy `message` into the caller's buffer (`*len`: its capacity, then the length written).
///
/// # Safety
/// `err` and `len` are null or point to a buffer of `*len` bytes and its length.
unsafe fn write_error(err: *mut u8, len: *mut usize, message: &str) {
    if err.is_null() || len.is_null() {
        return;
    }
    // SAFETY: checked non-null; the caller's contract gives the capacity.
    let capacity = unsafe { *len };
    let written = message.len().min(capacity);
    // SAFETY: `written` bytes fit the buffer; the message does not overlap it.
    unsafe {
        ptr::copy_nonoverlapping(message.as_ptr(), err, written);
        *len = written;
    }
}

/// The request's zone called `name`, with its shared memory.
fn zone_by_name<'r>(
    _r: &'r ngx_http_request_t,
    name: &[u8],
) -> Result<(&'r ZoneConf, &'r Zone), Status> {
    let zone_conf = registry::running()
        .and_then(|registry| registry.zone(name))
        .ok_or(Status::UnknownZone)?;
    let zone = zone_conf.zone.as_ref().ok_or(Status::Internal)?;
    Ok((zone_conf, zone))
}

fn request<'r>(r: *mut ngx_http_request_t) -> Result<&'r ngx_http_request_t, Status> {
    // SAFETY: a non-null `r` is the current request, as `get_request()` gives it; it is live
    // while the Lua code handling it runs.
    let r = unsafe { r.as_ref() }.ok_or(Status::NoRequest)?;
    if r.main_conf.is_null() || r.connection.is_null() {
        return Err(Status::NoRequest);
    }
    Ok(r)
}

/// A key, its zone and the options, resolved as the directive resolves a request's.
struct Target<'r> {
    applied: Applied<'r>,
    /// The key bytes (a `$binary_remote_addr` zone takes `127.0.0.1` for its 4 bytes).
    key: Cow<'r, [u8]>,
    now_ns: u64,
}

/// `out`, when the call has one, receives the largest burst the zone's rate allows with
/// [`Status::BurstTooLarge`].
///
/// # Safety
/// Pointers as for the exported functions: each null or valid for its length.
unsafe fn target<'r>(
    r: *mut ngx_http_request_t,
    zone: (*const u8, usize),
    key: (*const u8, usize),
    opts: *const LuaOptions,
    out: Option<&mut LuaDecision>,
    claim: bool,
) -> Result<Target<'r>, Status> {
    let r = request(r)?;
    // SAFETY: the caller's contract.
    let name = unsafe { bytes(zone.0, zone.1) }.ok_or(Status::BadArgument)?;
    // SAFETY: the caller's contract.
    let key = unsafe { bytes(key.0, key.1) }.ok_or(Status::BadArgument)?;
    // SAFETY: a non-null `opts` points to a struct the Lua side allocated.
    let opts = unsafe { opts.as_ref() }.ok_or(Status::BadArgument)?;
    let (zone_conf, zone) = zone_by_name(r, name)?;
    crate::control::key::check(key)?;
    if zone_conf.algorithm.counts_in_flight() {
        return Err(Status::WrongKind);
    }
    let key = zone_conf.key_form.parse(key);
    let limit = opts.limit_conf(zone_conf, zone).inspect_err(|&status| {
        if let (Status::BurstTooLarge, Some(out), Some(live)) = (status, out, zone.limits()) {
            out.remaining = Limits::max_burst(zone_conf.algorithm, &live.rate);
        }
    })?;
    let now_ns = now_ns();
    let found =
        crate::control::key::lookup(zone_conf, zone, &key, now_ns, claim, connection_log(r));
    let applied = Applied::new(found, &limit, now_ns).ok_or(Status::Internal)?;
    Ok(Target {
        applied,
        key,
        now_ns,
    })
}

/// The ABI version this module exports; `resty.rate_limit` refuses to run on another.
#[no_mangle]
pub extern "C" fn ngx_http_rate_limit_lua_abi_version() -> c_int {
    ABI_VERSION
}

/// Parse a `rate_limit` line's option words (`"burst=5 nodelay cost=2"`) exactly as the
/// directive does. No request needed: limiters may be built in `init_by_lua`. On error the
/// directive's message is written to `err` (capacity `*err_len`, then its length).
///
/// # Safety
/// `words` points to `len` bytes; `out` to a writable options struct; `err`/`err_len` as for
/// every error buffer of this ABI (or null).
#[no_mangle]
pub unsafe extern "C" fn ngx_http_rate_limit_lua_parse_opts(
    words: *const u8,
    len: usize,
    out: *mut LuaOptions,
    err: *mut u8,
    err_len: *mut usize,
) -> c_int {
    guarded(|| {
        // SAFETY: the caller's contract.
        let words = unsafe { bytes(words, len) }.ok_or(Status::BadArgument)?;
        let text = core::str::from_utf8(words).map_err(|_| Status::BadArgument)?;
        let words: Vec<&str> = text.split_ascii_whitespace().collect();
        if let Some(word) = words
            .iter()
            .find(|word| word.starts_with("zone=") || word.starts_with("global="))
        {
            let message = format!("invalid parameter \"{word}\"");
            // SAFETY: the caller's contract.
            unsafe { write_error(err, err_len, &message) };
            return Err(Status::Refused);
        }
        let spec = LimitSpec::parse_words(&words).map_err(|error| {
            // SAFETY: the caller's contract.
            unsafe { write_error(err, err_len, &error.to_string()) };
            Status::Refused
        })?;
        if spec.on_status.is_some() {
            let message = "invalid parameter \"on_status\": in Lua, call incoming(key, false) \
                           at access and charge(key) at log when the status matches";
            // SAFETY: the caller's contract.
            unsafe { write_error(err, err_len, message) };
            return Err(Status::Refused);
        }
        if spec.usage.is_some() || spec.cost_variable.is_some() {
            let message = "invalid parameter: usage=, reserve= and cost=$variable are for \
                           rate_limit lines; in Lua, pass the cost as a number (reserve and settle \
                           for usage: docs/lua.md)";
            // SAFETY: the caller's contract.
            unsafe { write_error(err, err_len, message) };
            return Err(Status::Refused);
        }
        let (delay_mode, delay) = match spec.delay {
            DelayMode::Delay => (DELAY_ALL, 0),
            DelayMode::NoDelay => (NO_DELAY, 0),
            DelayMode::Threshold(threshold) => (DELAY_THRESHOLD, threshold),
        };
        let options = LuaOptions {
            burst: spec.burst.map_or(-1, |burst| burst as i64),
            delay,
            cost: spec.cost,
            delay_mode,
        };
        // SAFETY: a non-null `out` is writable (the caller's contract).
        unsafe { out.as_mut() }
            .ok_or(Status::BadArgument)?
            .clone_from(&options);
        Ok(())
    })
}

/// Decide a request of `opts.cost` for `key` in zone `zone` now, as a `rate_limit` line with
/// these options would. With `commit`, a passing or delayed request is charged and counted in
/// the zone's metrics, and a refusal of a blocked key is counted as blocked; without it a
/// request that would pass changes nothing. A rejection is counted and blocks the key in a
/// zone with `block=` in both cases, and a blocked key is rejected (`retry_after_ns`: the
/// time left of its block) in both.
///
/// # Safety
/// `r` is null or the current request; `zone`/`key` point to their lengths in bytes; `opts`
/// and `out` to the ABI's structs.
#[no_mangle]
pub unsafe extern "C" fn ngx_http_rate_limit_lua_incoming(
    r: *mut ngx_http_request_t,
    zone: *const u8,
    zone_len: usize,
    key: *const u8,
    key_len: usize,
    opts: *const LuaOptions,
    commit: c_int,
    out: *mut LuaDecision,
) -> c_int {
    guarded(|| {
        // SAFETY: a non-null `out` is writable (the caller's contract).
        let out = unsafe { out.as_mut() }.ok_or(Status::BadArgument)?;
        // SAFETY: the caller's contract.
        let target = unsafe { target(r, (zone, zone_len), (key, key_len), opts, Some(out), true) }?;
        let charge = if commit != 0 {
            Charge::Now
        } else {
            Charge::Peek
        };
        let (key, now_ns) = (target.key, target.now_ns);
        let limits = &mut [AppliedLimit::new(target.applied, None)];
        let verdict = decide::decide(limits, now_ns, charge);
        let mut decision = verdict.decision;
        // A rejection is accounted for even when only looked at (`incoming(key, false)`, the
        // door of on_status semantics): the key went over its limit, and a zone with
        // `block=` blocks it.
        let rejected = verdict.outcome == Outcome::Rejected && !verdict.blocked;
        if charge == Charge::Now || rejected {
            let started = decide::account(limits, &verdict, false, now_ns, |_| Some(key.to_vec()));
            if let Some(started) = started {
                decision.retry_after_ns = decision
                    .retry_after_ns
                    .max(started.block.until_ns.saturating_sub(now_ns));
            }
        }
        *out = decision.into();
        Ok(())
    })
}

/// Give back a request of `opts.cost` charged to `key` (resty.limit.req's `uncommit`).
///
/// # Safety
/// As for [`ngx_http_rate_limit_lua_incoming`].
#[no_mangle]
pub unsafe extern "C" fn ngx_http_rate_limit_lua_uncommit(
    r: *mut ngx_http_request_t,
    zone: *const u8,
    zone_len: usize,
    key: *const u8,
    key_len: usize,
    opts: *const LuaOptions,
) -> c_int {
    guarded(|| {
        // SAFETY: the caller's contract.
        let target = unsafe { target(r, (zone, zone_len), (key, key_len), opts, None, false) }?;
        target.applied.uncommit(target.now_ns);
        Ok(())
    })
}

/// Settle a usage-based request of `key`: `reserved` tokens were charged at the door (an
/// `incoming` of that cost), `used` is what the request turned out to use. Less is given
/// back; more is charged whether it fits or not, into debt up to `debt` tokens past the
/// bucket's capacity (-1: one capacity), and `forgiven` receives what that bound forgave.
/// A key that lost its slot since its reservation forgives everything, as the directive's
/// settlement does. Counted in the zone's usage counters.
///
/// # Safety
/// As for [`ngx_http_rate_limit_lua_incoming`]; `forgiven` points to a writable `uint64_t`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ngx_http_rate_limit_lua_settle(
    r: *mut ngx_http_request_t,
    zone: *const u8,
    zone_len: usize,
    key: *const u8,
    key_len: usize,
    opts: *const LuaOptions,
    reserved: u64,
    used: u64,
    debt: i64,
    forgiven: *mut u64,
) -> c_int {
    guarded(|| {
        // SAFETY: a non-null `forgiven` is writable (the caller's contract).
        let forgiven = unsafe { forgiven.as_mut() }.ok_or(Status::BadArgument)?;
        // SAFETY: the caller's contract.
        let target = unsafe { target(r, (zone, zone_len), (key, key_len), opts, None, false) }?;
        let charged = target.applied.charged();
        if !matches!(
            charged.zone().algorithm(),
            ratelimit_core::Algorithm::LeakyBucket | ratelimit_core::Algorithm::TokenBucket
        ) {
            return Err(Status::NotABucket);
        }
        let debt = u64::try_from(debt).ok();
        let now_ns = target.now_ns;
        let zone = charged.zone();
        zone.count_by(Counter::TokensReserved, reserved);
        zone.count_by(Counter::TokensUsed, used);
        zone.count(Counter::UsageFound);
        *forgiven = 0;
        match ratelimit_core::usage::settle::settlement(reserved, used) {
            Settlement::Refund(tokens) => {
                charged.give_back_tokens(tokens, now_ns);
                zone.count_by(Counter::TokensRefunded, tokens);
            }
            Settlement::Charge(tokens) => {
                *forgiven = charged.charge_into_debt(tokens, debt, now_ns);
                zone.count_by(Counter::TokensOverrun, tokens);
                zone.count_by(Counter::TokensForgiven, *forgiven);
            }
            Settlement::Even => {}
        }
        Ok(())
    })
}

/// Where `key` stands, charging nothing: `remaining` and `reset_ns` of the key as it is, and
/// the `outcome` and `retry_after_ns` a request of `opts.cost` would get now.
///
/// # Safety
/// As for [`ngx_http_rate_limit_lua_incoming`].
#[no_mangle]
pub unsafe extern "C" fn ngx_http_rate_limit_lua_state(
    r: *mut ngx_http_request_t,
    zone: *const u8,
    zone_len: usize,
    key: *const u8,
    key_len: usize,
    opts: *const LuaOptions,
    out: *mut LuaDecision,
) -> c_int {
    guarded(|| {
        // SAFETY: a non-null `out` is writable (the caller's contract).
        let out = unsafe { out.as_mut() }.ok_or(Status::BadArgument)?;
        // SAFETY: the caller's contract.
        let target = unsafe { target(r, (zone, zone_len), (key, key_len), opts, Some(out), true) }?;
        let Target {
            mut applied,
            now_ns,
            ..
        } = target;
        let next = applied.decide(now_ns, false);
        applied.stand(now_ns);
        let (zone, slot, limits) = (applied.zone, applied.slot, &applied.policy.limits);
        *out = LuaDecision {
            remaining: applied.decision.remaining,
            reset_ns: zone.time_to_fresh_ns(slot, limits, now_ns),
            ..next.into()
        };
        Ok(())
    })
}

/// Change zone `zone`'s rate (`rate_len` 0: unchanged) and/or burst (`burst` -1: unchanged)
/// exactly as the admin API's `PATCH zones/NAME` does: every worker sees it at once and the
/// state file keeps it. On error the API's message is written to `err`.
///
/// # Safety
/// `r` is null or the current request; `zone`/`rate` point to their lengths in bytes;
/// `err`/`err_len` as for [`ngx_http_rate_limit_lua_parse_opts`].
#[no_mangle]
pub unsafe extern "C" fn ngx_http_rate_limit_lua_set_limits(
    r: *mut ngx_http_request_t,
    zone: *const u8,
    zone_len: usize,
    rate: *const u8,
    rate_len: usize,
    burst: i64,
    err: *mut u8,
    err_len: *mut usize,
) -> c_int {
    guarded(|| {
        let r = request(r)?;
        // SAFETY: the caller's contract.
        let name = unsafe { bytes(zone, zone_len) }.ok_or(Status::BadArgument)?;
        // SAFETY: the caller's contract.
        let rate = unsafe { bytes(rate, rate_len) }.ok_or(Status::BadArgument)?;
        let (zone_conf, _) = zone_by_name(r, name)?;
        let registry = registry::running().ok_or(Status::UnknownZone)?;
        let refused = |message: String| {
            // SAFETY: the caller's contract.
            unsafe { write_error(err, err_len, &message) };
            Status::Refused
        };
        // What a PATCH body with these fields parses to; the API's checks follow.
        let mut patch = ratelimit_admin::body::LimitsBody::default();
        if !rate.is_empty() {
            let text = String::from_utf8_lossy(rate);
            let parsed = Rate::parse(&text).map_err(|_| {
                refused(format!(
                    "invalid rate \"{text}\": must be a positive number of requests (at most \
                     3 decimals) per s, m, h or d, such as \"10r/s\""
                ))
            })?;
            patch.rate = Some(parsed);
        }
        if burst != -1 {
            let valid = u64::try_from(burst)
                .ok()
                .filter(|&burst| burst <= Limits::MAX_BURST);
            patch.burst = Some(valid.ok_or_else(|| {
                refused(format!(
                    "invalid burst {burst}: must be an integer from 0 to {}",
                    Limits::MAX_BURST
                ))
            })?);
        }
        // `set_rate("")` reached here as "no rate": a call that changes nothing is a mistake.
        if patch.rate.is_none() && patch.burst.is_none() {
            return Err(refused(
                "nothing to change: give a rate (such as \"10r/s\") or a burst".to_string(),
            ));
        }
        crate::control::zones::patch_zone(registry, &zone_conf.name, &patch, connection_log(r))
            .map_err(|error| refused(error.to_string()))
    })
}

/// `ngx_http_rate_limit_lua_conn_t`: what a concurrency call says.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct LuaConn {
    /// 1 admitted (holds its slots), 3 rejected, 4 queued (wait: ask again with the ticket).
    pub outcome: i32,
    /// The key's requests in flight (after this call).
    pub in_flight: u32,
    /// The key's limit now.
    pub limit: u32,
    /// Requests of the key waiting in its queue.
    pub queued: u32,
    /// Outcome 4: the ticket to pass to [`ngx_http_rate_limit_lua_conn_turn`].
    pub ticket: u64,
    /// Outcome 3: when a slot is likely to be free.
    pub retry_after_ns: u64,
}

const CONN_ADMITTED: i32 = 1;
const CONN_REJECTED: i32 = 3;
const CONN_QUEUED: i32 = 4;

impl LuaConn {
    fn standing(outcome: i32, refusal: &Refusal) -> LuaConn {
        LuaConn {
            outcome,
            in_flight: refusal.in_flight,
            limit: refusal.limit,
            queued: refusal.queued,
            ticket: 0,
            retry_after_ns: refusal.retry_after_ns,
        }
    }
}

/// A concurrency zone's key for a Lua call: its line (cost `cost`, the zone's queue).
///
/// # Safety
/// Pointers as for the exported functions: each null or valid for its length.
unsafe fn conn_line<'r>(
    r: &'r ngx_http_request_t,
    zone: (*const u8, usize),
    key: (*const u8, usize),
    cost: u64,
    claim: bool,
) -> Result<Line<'r>, Status> {
    // SAFETY: the caller's contract.
    let name = unsafe { bytes(zone.0, zone.1) }.ok_or(Status::BadArgument)?;
    // SAFETY: the caller's contract.
    let key = unsafe { bytes(key.0, key.1) }.ok_or(Status::BadArgument)?;
    let (zone_conf, zone) = zone_by_name(r, name)?;
    if !zone_conf.algorithm.counts_in_flight() {
        return Err(Status::WrongKind);
    }
    crate::control::key::check(key)?;
    if cost == 0 {
        return Err(Status::BadArgument);
    }
    let key = zone_conf.key_form.parse(key);
    let now_ns = now_ns();
    let found =
        crate::control::key::lookup(zone_conf, zone, &key, now_ns, claim, connection_log(r));
    Ok(Line {
        zone_conf,
        zone: *zone,
        slot: found.slot,
        hash: found.hash(),
        cost,
        queue: None,
    })
}

/// resty.limit.conn's `incoming`: a request of `cost` slots arrives at `key` of concurrency
/// zone `zone`. With `commit` it takes its slots (given back by `leaving`, `uncommit`, or when
/// the request ends) or a ticket in the queue (outcome 4: the Lua side waits and asks
/// [`ngx_http_rate_limit_lua_conn_turn`]); without it nothing changes and the outcome says
/// what a request would get now.
///
/// # Safety
/// `r` is null or the current request; `zone`/`key` point to their lengths in bytes; `out`
/// to the ABI's struct.
#[no_mangle]
pub unsafe extern "C" fn ngx_http_rate_limit_lua_conn_incoming(
    r: *mut ngx_http_request_t,
    zone: *const u8,
    zone_len: usize,
    key: *const u8,
    key_len: usize,
    cost: u64,
    commit: c_int,
    out: *mut LuaConn,
) -> c_int {
    guarded(|| {
        let r = request(r)?;
        // SAFETY: the caller's contract.
        let line = unsafe { conn_line(r, (zone, zone_len), (key, key_len), cost, true) }?;
        // SAFETY: a non-null `out` is writable (the caller's contract).
        let out = unsafe { out.as_mut() }.ok_or(Status::BadArgument)?;
        let now = now_ns();
        let (peeked, standing) = slots::peek(&line, now).ok_or(Status::Internal)?;
        if commit == 0 {
            let outcome = match peeked {
                Peek::Admitted => CONN_ADMITTED,
                Peek::Queued => CONN_QUEUED,
                Peek::Rejected => CONN_REJECTED,
            };
            *out = LuaConn::standing(outcome, &standing);
            return Ok(());
        }
        *out = match slots::arrive(r.pool, &line, now, false, Owner::Lua) {
            Arrival::Admitted { in_flight, limit } => {
                line.zone.count(Counter::Passed);
                LuaConn {
                    outcome: CONN_ADMITTED,
                    in_flight,
                    limit,
                    ..LuaConn::default()
                }
            }
            Arrival::Queued { waiter } => LuaConn {
                ticket: waiter,
                ..LuaConn::standing(CONN_QUEUED, &standing)
            },
            Arrival::Rejected(refusal) | Arrival::DryRun { refusal, .. } => {
                line.zone.count(Counter::Rejected);
                LuaConn::standing(CONN_REJECTED, &refusal)
            }
            Arrival::Unlimited => return Err(Status::Internal),
        };
        Ok(())
    })
}

/// Whether a queued Lua request's turn came: outcome 1 (it holds its slots), 4 (wait and ask
/// again) or 3 (its `queue_timeout` passed: refused). With `give_up`, it leaves the queue
/// (outcome 3).
///
/// # Safety
/// `r` is null or the current request; `out` points to the ABI's struct.
#[no_mangle]
pub unsafe extern "C" fn ngx_http_rate_limit_lua_conn_turn(
    r: *mut ngx_http_request_t,
    ticket: u64,
    give_up: c_int,
    out: *mut LuaConn,
) -> c_int {
    guarded(|| {
        let r = request(r)?;
        // SAFETY: a non-null `out` is writable (the caller's contract).
        let out = unsafe { out.as_mut() }.ok_or(Status::BadArgument)?;
        if give_up != 0 {
            slots::abandon_lua(r.pool, ticket);
            *out = LuaConn {
                outcome: CONN_REJECTED,
                ..LuaConn::default()
            };
            return Ok(());
        }
        let (turn, standing) = queue::lua_turn(ticket);
        *out = LuaConn {
            outcome: match turn {
                LuaTurn::Admitted => CONN_ADMITTED,
                LuaTurn::Wait => CONN_QUEUED,
                LuaTurn::Refused => CONN_REJECTED,
            },
            in_flight: standing.0,
            limit: standing.1,
            ticket,
            ..LuaConn::default()
        };
        Ok(())
    })
}

/// resty.limit.conn's `leaving` and `uncommit`: give back the slots of `key` the request took
/// last. `latency_ns`: the request's latency, a sample for an adaptive limit (the smaller of
/// it and the time since the slots were taken counts); -2: no latency given, the time since
/// the slots were taken counts; -1 (`uncommit`): no sample. `out.in_flight` is the key's
/// requests in flight after.
///
/// # Safety
/// As for [`ngx_http_rate_limit_lua_conn_incoming`].
#[no_mangle]
pub unsafe extern "C" fn ngx_http_rate_limit_lua_conn_leaving(
    r: *mut ngx_http_request_t,
    zone: *const u8,
    zone_len: usize,
    key: *const u8,
    key_len: usize,
    latency_ns: i64,
    out: *mut LuaConn,
) -> c_int {
    guarded(|| {
        let r = request(r)?;
        // SAFETY: the caller's contract.
        let line = unsafe { conn_line(r, (zone, zone_len), (key, key_len), 1, false) }?;
        // SAFETY: a non-null `out` is writable (the caller's contract).
        let out = unsafe { out.as_mut() }.ok_or(Status::BadArgument)?;
        let now = now_ns();
        let mut in_flight = None;
        // SAFETY: the live request's pool (a subrequest shares its main request's).
        unsafe {
            slots::each_holding(r.pool, |holding| {
                if in_flight.is_some() || !holding.is_held_for(&line.zone, line.slot) {
                    return;
                }
                if let Ok(latency) = u64::try_from(latency_ns) {
                    holding.set_latency(latency);
                }
                in_flight = Some(holding.release(now, latency_ns != -1));
            })
        };
        let in_flight = in_flight.ok_or(Status::NotHeld)?;
        *out = LuaConn {
            outcome: CONN_ADMITTED,
            in_flight,
            ..LuaConn::default()
        };
        Ok(())
    })
}

/// Change concurrency zone `zone`'s limit (`limit` -1: unchanged) and/or queue places
/// (`queue` -1: unchanged) as the admin API's `PATCH zones/NAME` does. On error the API's
/// message is written to `err`.
///
/// # Safety
/// As for [`ngx_http_rate_limit_lua_set_limits`].
#[no_mangle]
pub unsafe extern "C" fn ngx_http_rate_limit_lua_conn_set(
    r: *mut ngx_http_request_t,
    zone: *const u8,
    zone_len: usize,
    limit: i64,
    queue: i64,
    err: *mut u8,
    err_len: *mut usize,
) -> c_int {
    guarded(|| {
        let r = request(r)?;
        // SAFETY: the caller's contract.
        let name = unsafe { bytes(zone, zone_len) }.ok_or(Status::BadArgument)?;
        let (zone_conf, _) = zone_by_name(r, name)?;
        if !zone_conf.algorithm.counts_in_flight() {
            return Err(Status::WrongKind);
        }
        let registry = registry::running().ok_or(Status::UnknownZone)?;
        let refused = |message: String| {
            // SAFETY: the caller's contract.
            unsafe { write_error(err, err_len, &message) };
            Status::Refused
        };
        let field = |value: i64, name: &str, low: u32, high: u32| {
            if value == -1 {
                return Ok(None);
            }
            u32::try_from(value)
                .ok()
                .filter(|n| (low..=high).contains(n))
                .map(Some)
                .ok_or_else(|| {
                    refused(format!(
                        "invalid {name} {value}: must be an integer from {low} to {high}"
                    ))
                })
        };
        let patch = ratelimit_admin::concurrency::PatchBody {
            limit: field(limit, "limit", 1, ratelimit_core::adaptive::MAX_LIMIT)?,
            queue: field(queue, "queue", 0, ratelimit_core::concurrency::MAX_QUEUE)?,
            ..Default::default()
        };
        crate::control::zones::patch_concurrency(
            registry,
            &zone_conf.name,
            &patch,
            connection_log(r),
        )
        .map_err(|error| refused(error.to_string()))
    })
}

/// Block `key` in zone `zone` by hand for `duration_ns` (as the admin API's `PUT
/// zones/NAME/blocked/KEY` does: the key keeps its escalation level). On error (no `block=` on
/// the zone, a table without room) the message is written to `err`.
///
/// # Safety
/// `r` is null or the current request; `zone`/`key` point to their lengths in bytes;
/// `err`/`err_len` as for [`ngx_http_rate_limit_lua_parse_opts`].
#[no_mangle]
pub unsafe extern "C" fn ngx_http_rate_limit_lua_block(
    r: *mut ngx_http_request_t,
    zone: *const u8,
    zone_len: usize,
    key: *const u8,
    key_len: usize,
    duration_ns: u64,
    err: *mut u8,
    err_len: *mut usize,
) -> c_int {
    guarded(|| {
        // SAFETY: the caller's contract.
        let (zone_conf, key) = unsafe { block_target(r, (zone, zone_len), (key, key_len)) }?;
        let refused = |message: String| {
            // SAFETY: the caller's contract.
            unsafe { write_error(err, err_len, &message) };
            Status::Refused
        };
        if duration_ns == 0 || duration_ns > BlockPolicy::MAX_NS {
            return Err(refused(format!(
                "invalid block duration: must be more than 0 and at most {} seconds",
                BlockPolicy::MAX_NS / 1_000_000_000
            )));
        }
        crate::control::blocks::block_by_hand(zone_conf, &key, duration_ns, now_ns())
            .map(|_| ())
            .map_err(|error| refused(error.to_string()))
    })
}

/// How long `key` stays blocked in zone `zone`: `*left_ns` 0 when it is not blocked (or the
/// zone has no `block=`).
///
/// # Safety
/// `r` is null or the current request; `zone`/`key` point to their lengths in bytes; `left_ns`
/// is writable.
#[no_mangle]
pub unsafe extern "C" fn ngx_http_rate_limit_lua_blocked(
    r: *mut ngx_http_request_t,
    zone: *const u8,
    zone_len: usize,
    key: *const u8,
    key_len: usize,
    left_ns: *mut u64,
) -> c_int {
    guarded(|| {
        // SAFETY: the caller's contract.
        let (zone_conf, key) = unsafe { block_target(r, (zone, zone_len), (key, key_len)) }?;
        // SAFETY: a non-null `left_ns` is writable (the caller's contract).
        let left_ns = unsafe { left_ns.as_mut() }.ok_or(Status::BadArgument)?;
        *left_ns = crate::control::blocks::blocked_for_ns(zone_conf, &key, now_ns()).unwrap_or(0);
        Ok(())
    })
}

/// The zone and key of a block call.
///
/// # Safety
/// `r` is null or the current request; each pointer null or valid for its length.
unsafe fn block_target<'r>(
    r: *mut ngx_http_request_t,
    zone: (*const u8, usize),
    key: (*const u8, usize),
) -> Result<(&'r ZoneConf, Cow<'r, [u8]>), Status> {
    let r = request(r)?;
    // SAFETY: the caller's contract (each pointer null or valid for its length).
    let name = unsafe { bytes(zone.0, zone.1) }.ok_or(Status::BadArgument)?;
    // SAFETY: as above.
    let key = unsafe { bytes(key.0, key.1) }.ok_or(Status::BadArgument)?;
    let (zone_conf, _) = zone_by_name(r, name)?;
    crate::control::key::check(key)?;
    Ok((zone_conf, zone_conf.key_form.parse(key)))
}
