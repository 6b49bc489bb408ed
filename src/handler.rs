//! The request path: the preaccess handler, delays, response headers and `$rate_limit_status`.

use core::ptr;

use ngx::core::Status;
use ngx::ffi::{
    ngx_conf_t, ngx_handle_read_event, ngx_handle_write_event, ngx_http_add_variable,
    ngx_http_block_reading, ngx_http_complex_value, ngx_http_core_run_phases,
    ngx_http_finalize_request, ngx_http_request_t, ngx_http_test_reading,
    ngx_http_variable_value_t, ngx_int_t, ngx_list_push, ngx_pnalloc, ngx_posted_events, ngx_str_t,
    ngx_table_elt_t, ngx_uint_t, NGX_HTTP_VAR_NOCACHEABLE, NGX_LOG_ERR, NGX_LOG_WARN,
};
use ngx::http::{HttpModuleLocationConf, HttpModuleMainConf};
use ngx::ngx_log_error;
use ratelimit_core::top::TopKind;
use ratelimit_core::{
    Algorithm, BucketCharge, Decision, Limits, Outcome, Policy, Rate, NANOS_PER_SEC,
};
use smallvec::SmallVec;

use crate::conf::{LimitConf, LocConf, ZoneConf};
use crate::zone::{Counter, SlotIndex, Zone};
use crate::RateLimitModule;

/// `$rate_limit_status` values; 0 means no limit applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum LimitStatus {
    Passed = 1,
    Delayed = 2,
    Rejected = 3,
    DelayedDryRun = 4,
    RejectedDryRun = 5,
}

impl LimitStatus {
    fn as_str(self) -> &'static str {
        match self {
            LimitStatus::Passed => "PASSED",
            LimitStatus::Delayed => "DELAYED",
            LimitStatus::Rejected => "REJECTED",
            LimitStatus::DelayedDryRun => "DELAYED_DRY_RUN",
            LimitStatus::RejectedDryRun => "REJECTED_DRY_RUN",
        }
    }
}

/// Where a request's outcome is kept: `$rate_limit_status`'s own slot in `r->variables`.
/// Internal redirects keep variable values (they clear module contexts) and subrequests
/// share them, so a set value means "this main request was limited already".
#[derive(Clone, Copy)]
struct RequestState {
    value: *mut ngx_http_variable_value_t,
}

impl RequestState {
    fn of(r: &ngx_http_request_t, index: ngx_uint_t) -> RequestState {
        // SAFETY: `r->variables` has one entry per indexed variable of this configuration,
        // and `index` was obtained from ngx_http_get_variable_index for it.
        RequestState {
            value: unsafe { r.variables.add(index) },
        }
    }

    fn is_set(self) -> bool {
        let bits = value_bits::read(self.value);
        bits & value_bits::VALID != 0 && bits & value_bits::LEN != 0
    }

    fn set(self, status: LimitStatus) {
        let text = status.as_str();
        // SAFETY: `value` points into the live request's variables; the text is static.
        unsafe { (*self.value).data = text.as_ptr().cast_mut() };
        // The whole word: `escape` is never set on this variable.
        value_bits::write_all(self.value, text.len() as u32 | value_bits::VALID);
    }
}

/// The first 32 bits of `ngx_variable_value_t`: `len:28, valid:1, no_cacheable:1,
/// not_found:1, escape:1`, read and written whole. bindgen's accessors for the 28-bit `len`
/// loop over it bit by bit (hundreds of instructions a call, on every request);
/// [`value_bits::layout_matches`] checks at configuration time that the packing is the one
/// assumed here.
pub mod value_bits {
    use ngx::ffi::ngx_variable_value_t;

    pub const LEN: u32 = (1 << 28) - 1;
    pub const VALID: u32 = 1 << 28;
    pub const NO_CACHEABLE: u32 = 1 << 29;
    pub const NOT_FOUND: u32 = 1 << 30;

    pub fn read(value: *const ngx_variable_value_t) -> u32 {
        // SAFETY: callers pass a live value; the bitfield unit is its first 4 bytes, aligned
        // for u32 (the struct starts with a zero-length [u32; 0] alignment member).
        unsafe { value.cast::<u32>().read() }
    }

    /// Replace `len` and the three flags, keeping `escape`.
    pub fn write(value: *mut ngx_variable_value_t, bits: u32) {
        let escape = read(value) & !(LEN | VALID | NO_CACHEABLE | NOT_FOUND);
        // SAFETY: as for `read`.
        unsafe { value.cast::<u32>().write(escape | bits) };
    }

    /// Replace all 32 bits (`escape` cleared).
    #[inline]
    pub fn write_all(value: *mut ngx_variable_value_t, bits: u32) {
        // SAFETY: as for `read`.
        unsafe { value.cast::<u32>().write(bits) };
    }

    /// Whether bindgen's accessors and these masks agree on this target.
    pub fn layout_matches() -> bool {
        // SAFETY: an all-zero ngx_variable_value_t is valid (a null data pointer, no flags).
        let mut value: ngx_variable_value_t = unsafe { core::mem::zeroed() };
        value.set_len(0x0ab_cdef);
        value.set_no_cacheable(1);
        let first = read(&value) == 0x0ab_cdef | NO_CACHEABLE;
        value.set_len(0);
        value.set_no_cacheable(0);
        value.set_valid(1);
        value.set_not_found(1);
        first && read(&value) == VALID | NOT_FOUND
    }
}

/// Monotonic nanoseconds: the same clock in every worker, unaffected by wall-clock changes.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    // Seconds since boot times 1e9 fits a u64 for 584 years.
    (ts.tv_sec as u64)
        .wrapping_mul(NANOS_PER_SEC)
        .wrapping_add(ts.tv_nsec as u64)
}

/// The limits for one request in one zone: the zone's live limits, the location's `burst=`,
/// then a per-key override, which wins over both.
pub fn effective_policy(zone: &Zone, limit: &LimitConf, hash: u64) -> Option<Policy> {
    let mut limits = zone.limits()?;
    if let Some(burst) = limit.burst {
        limits.burst = burst;
    }
    if let Some(overridden) = zone.override_for(hash) {
        limits = overridden;
    }
    Some(Policy {
        algorithm: zone.algorithm(),
        limits,
        delay: limit.delay,
        cost: limit.cost,
    })
}

/// One zone applied to the request.
struct Applied<'a> {
    zone_conf: &'a ZoneConf,
    zone: &'a Zone,
    slot: SlotIndex,
    policy: Policy,
    decision: Decision,
}

impl Applied<'_> {
    fn decide(&mut self, now_ns: u64, commit: bool) {
        self.decision = self.zone.decide(self.slot, now_ns, &self.policy, commit);
    }
}

/// A `rate_limit` line resolved for a request: its zone and, with `global=`, the global one.
struct AppliedLimit<'a> {
    own: Applied<'a>,
    global: Option<Applied<'a>>,
}

impl AppliedLimit<'_> {
    /// Peek (commit = false) or charge. With a global bucket, a token is taken from each
    /// bucket that has one and the request passes if either had one.
    fn decide(&mut self, now_ns: u64, commit: bool) -> Decision {
        let Some(global) = &mut self.global else {
            self.own.decide(now_ns, commit);
            return self.own.decision;
        };
        self.own.decide(now_ns, false);
        global.decide(now_ns, false);
        if commit {
            if self.own.decision.outcome != Outcome::Rejected {
                self.own.decide(now_ns, true);
            }
            if global.decision.outcome != Outcome::Rejected {
                global.decide(now_ns, true);
            }
        }
        ratelimit_core::token_bucket::compose_global(&self.own.decision, &global.decision)
    }

    fn applied(&self) -> impl Iterator<Item = &Applied<'_>> + Clone {
        core::iter::once(&self.own).chain(self.global.iter())
    }
}

fn zone_conf_of(shm_zone: *mut ngx::ffi::ngx_shm_zone_t) -> Option<&'static ZoneConf> {
    // SAFETY: `shm_zone` was returned by ngx_shared_memory_add for this cycle; its `data` is a
    // `ZoneConf` in the cycle's pool (checked non-null), alive while requests run.
    unsafe { shm_zone.as_ref()?.data.cast::<ZoneConf>().as_ref() }
}

/// The zone's slot for the request's key and the limits that apply to it, not yet decided.
fn resolve<'a>(
    r: &mut ngx_http_request_t,
    shm_zone: *mut ngx::ffi::ngx_shm_zone_t,
    limit: &LimitConf,
    now_ns: u64,
) -> Option<Applied<'a>> {
    let found = find_key(r, shm_zone, now_ns)?;
    let policy = effective_policy(found.zone, limit, found.hash)?;
    Some(Applied {
        zone_conf: found.zone_conf,
        zone: found.zone,
        slot: found.slot,
        policy,
        decision: Decision::rejected(0, 0, 0),
    })
}

/// The request's key found in a zone (its slot claimed if it is new).
pub(crate) struct Found<'a> {
    pub zone_conf: &'a ZoneConf,
    pub zone: &'a Zone,
    pub hash: u64,
    pub slot: SlotIndex,
}

/// Find the zone's slot for the request's key (claiming one for a new key); `None` when the
/// key is empty or too long, or the zone is not set up.
#[inline(always)]
fn find_key<'a>(
    r: &mut ngx_http_request_t,
    shm_zone: *mut ngx::ffi::ngx_shm_zone_t,
    now_ns: u64,
) -> Option<Found<'a>> {
    let zone_conf = zone_conf_of(shm_zone)?;
    let zone = zone_conf.zone.as_ref()?;
    let key = evaluate_key(r, zone_conf)?;
    if key.is_empty() {
        return None;
    }
    if key.len() > MAX_KEY_BYTES {
        ngx_log_error!(
            NGX_LOG_ERR,
            connection_log(r),
            "the value of the \"{}\" key is more than 65535 bytes",
            zone_conf.key_text
        );
        return None;
    }
    let (found, evicted) = find_slot(zone_conf, zone, key, now_ns);
    if evicted {
        log_zone_full(&found, now_ns, connection_log(r));
    }
    Some(found)
}

/// The longest key a zone accepts, in bytes (limit_req's limit).
pub const MAX_KEY_BYTES: usize = 65535;

/// The zone's slot for `key` (1 to [`MAX_KEY_BYTES`] bytes), claiming one for a new key, and
/// whether another key was evicted for it: the step the directive and the Lua API
/// (`crate::lua`) share.
#[inline(always)]
pub(crate) fn find_slot<'a>(
    zone_conf: &'a ZoneConf,
    zone: &'a Zone,
    key: &[u8],
    now_ns: u64,
) -> (Found<'a>, bool) {
    let hash = zone.hash_key(key);
    let (slot, evicted) = zone.find_or_claim(hash, now_ns);
    let found = Found {
        zone_conf,
        zone,
        hash,
        slot,
    };
    (found, evicted)
}

/// After an eviction: say that the zone is full, once a second at most.
#[cold]
pub(crate) fn log_zone_full(found: &Found, now_ns: u64, log: *mut ngx::ffi::ngx_log_t) {
    if found.zone.should_log_full(now_ns) {
        ngx_log_error!(
            NGX_LOG_WARN,
            log,
            "rate_limit zone \"{}\" is full: evicted the key nearest to its fresh state",
            found.zone_conf.name
        );
    }
}

/// The location's precomputed bucket constants for this key, when they apply: a leaky or
/// token bucket and no per-key override. Recomputed only when the zone's limits change.
#[inline(always)]
fn bucket_charge(limit: &LimitConf, zone: &Zone, hash: u64) -> Option<BucketCharge> {
    if zone.override_for(hash).is_some() {
        return None;
    }
    // A sliding zone caches `None` (BucketCharge::new declines it); the initial (0, None)
    // matches no valid limits word, and would answer `None` anyway.
    let word = zone.limits_word();
    let (cached_word, cached) = limit.charge_cache.get();
    if cached_word == word {
        return cached;
    }
    let charge = Limits::unpack(word).and_then(|mut limits| {
        if let Some(burst) = limit.burst {
            limits.burst = burst;
        }
        BucketCharge::new(&Policy {
            algorithm: zone.algorithm(),
            limits,
            delay: limit.delay,
            cost: limit.cost,
        })
    });
    limit.charge_cache.set((word, charge));
    charge
}

/// The key's bytes for this request (empty when its variables are not found).
fn evaluate_key<'r>(r: &'r mut ngx_http_request_t, zone_conf: &ZoneConf) -> Option<&'r [u8]> {
    if let Some(index) = zone_conf.key_variable {
        if let Some(name) = &zone_conf.key_query_arg {
            // SAFETY: `r.variables` has one value per variable of this configuration, and
            // `index` is one of them.
            let cached = unsafe { r.variables.add(index) };
            let bits = value_bits::read(cached);
            // nginx's own evaluation marks `$arg_` values no_cacheable; a value that is
            // cached and not so was assigned by `set` and is what nginx would return.
            let assigned = bits & (value_bits::VALID | value_bits::NOT_FOUND) != 0
                && bits & value_bits::NO_CACHEABLE == 0;
            if !assigned {
                return Some(crate::key::query_arg(r.args.as_bytes(), name).unwrap_or(&[]));
            }
        }
        // SAFETY: `r` is the live request and `index` a variable index of this configuration.
        let value = unsafe { ngx::ffi::ngx_http_get_flushed_variable(r, index) };
        if value.is_null() {
            return Some(&[]);
        }
        let bits = value_bits::read(value);
        let len = (bits & value_bits::LEN) as usize;
        // SAFETY: `value` is a live variable value of this request.
        let data = unsafe { (*value).data };
        if bits & value_bits::NOT_FOUND != 0 || len == 0 || data.is_null() {
            return Some(&[]);
        }
        // SAFETY: a found variable value holds `len` bytes at `data`, in the request pool.
        return Some(unsafe { core::slice::from_raw_parts(data, len) });
    }
    let mut key = ngx_str_t {
        len: 0,
        data: ptr::null_mut(),
    };
    let key_cv = ptr::addr_of!(zone_conf.key).cast_mut();
    // SAFETY: `r` is the live request; the complex value was compiled at configuration time.
    if unsafe { ngx_http_complex_value(r, key_cv, &mut key) } != 0 {
        return None;
    }
    // SAFETY: the value lives in the request pool (or the configuration, for a constant).
    Some(unsafe { core::slice::from_raw_parts(key.data.cast_const(), key.len) })
}

fn connection_log(r: &ngx_http_request_t) -> *mut ngx::ffi::ngx_log_t {
    // SAFETY: a live request always has a connection with a log.
    unsafe { (*r.connection).log }
}

/// The preaccess phase handler.
pub unsafe extern "C" fn preaccess_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: nginx calls phase handlers with the live request.
    let r = unsafe { &mut *r };
    if !ptr::eq(r.main, r) {
        return Status::NGX_DECLINED.into();
    }
    let Some(lcf) = RateLimitModule::location_conf(r) else {
        return Status::NGX_DECLINED.into();
    };
    if lcf.limits().is_empty() {
        return Status::NGX_DECLINED.into();
    }
    let Some(index) = RateLimitModule::main_conf(r).and_then(|mcf| mcf.status_variable) else {
        return Status::NGX_DECLINED.into();
    };
    let state = RequestState::of(r, index);
    if state.is_set() {
        return Status::NGX_DECLINED.into();
    }
    limit_request(r, lcf, state)
}

#[inline]
fn limit_request(r: &mut ngx_http_request_t, lcf: &LocConf, state: RequestState) -> ngx_int_t {
    let now = now_ns();
    // The common case, one limit without `global=`: no collection, one compare-and-swap,
    // and a request that passes without headers to add is done right here.
    if let [limit] = lcf.limits() {
        if limit.global.is_none() {
            return limit_one(r, lcf, state, limit, now);
        }
    }

    // Inline storage: the common configurations (one or two limits) never touch the heap.
    let mut applied: SmallVec<[AppliedLimit; 2]> = SmallVec::new();
    for limit in lcf.limits() {
        let Some(own) = resolve(r, limit.shm_zone, limit, now) else {
            continue;
        };
        let global = limit
            .global
            .and_then(|global| resolve(r, global, limit, now));
        applied.push(AppliedLimit { own, global });
    }
    if applied.is_empty() {
        return Status::NGX_DECLINED.into();
    }

    // All limits must pass and a request rejected by one is charged to none: with several,
    // look first, then charge.
    let mut rejected_by = None;
    if applied.len() > 1 {
        rejected_by = applied
            .iter_mut()
            .position(|limit| limit.decide(now, false).outcome == Outcome::Rejected);
    }
    let mut decisions: SmallVec<[Decision; 2]> = SmallVec::new();
    if rejected_by.is_none() {
        for (index, limit) in applied.iter_mut().enumerate() {
            let decision = limit.decide(now, true);
            decisions.push(decision);
            if decision.outcome == Outcome::Rejected {
                rejected_by = Some(index);
                break;
            }
        }
    }
    finish(r, lcf, state, &mut applied, &decisions, rejected_by, now)
}

/// One `rate_limit` without `global=`: the common configuration, kept short.
fn limit_one(
    r: &mut ngx_http_request_t,
    lcf: &LocConf,
    state: RequestState,
    limit: &LimitConf,
    now: u64,
) -> ngx_int_t {
    let Some(found) = find_key(r, limit.shm_zone, now) else {
        return Status::NGX_DECLINED.into();
    };
    let (zone, hash) = (found.zone, found.hash);
    // A sync zone decides through `Zone::decide`, which takes the fleet's grant first.
    let charge = if lcf.headers() || zone.is_sync() {
        None
    } else {
        bucket_charge(limit, zone, hash)
    };
    if let Some(charge) = charge {
        // A bucket, and nothing to report for a request that passes: the outcome
        // alone, from the constants computed once.
        let (outcome, previous) = zone.charge_bucket(found.slot, now, &charge, |state| {
            match effective_policy(zone, limit, hash) {
                Some(policy) => ratelimit_core::decide_word(state, now, &policy),
                None => (Decision::rejected(0, 0, 0), None),
            }
        });
        if outcome == Outcome::Passed {
            return passed(zone, state);
        }
        let Some(policy) = effective_policy(zone, limit, hash) else {
            return Status::NGX_DECLINED.into();
        };
        let decision = ratelimit_core::decide_word(previous, now, &policy).0;
        return finish_one(r, lcf, state, found, policy, decision, now);
    }
    let Some(policy) = effective_policy(zone, limit, hash) else {
        return Status::NGX_DECLINED.into();
    };
    let decision = if policy.algorithm != Algorithm::SlidingLog && !lcf.headers() && !zone.is_sync()
    {
        let (outcome, previous) = zone.charge(found.slot, now, &policy);
        if outcome == Outcome::Passed {
            return passed(zone, state);
        }
        ratelimit_core::decide_word(previous, now, &policy).0
    } else {
        zone.decide(found.slot, now, &policy, true)
    };
    finish_one(r, lcf, state, found, policy, decision, now)
}

/// A request that the one limit of its location let through: counted, marked for
/// `$rate_limit_status`, and on to the next phase.
#[inline]
fn passed(zone: &Zone, state: RequestState) -> ngx_int_t {
    zone.count(Counter::Passed);
    state.set(LimitStatus::Passed);
    Status::NGX_DECLINED.into()
}

/// `finish` for the single-limit path.
fn finish_one(
    r: &mut ngx_http_request_t,
    lcf: &LocConf,
    state: RequestState,
    found: Found,
    policy: Policy,
    decision: Decision,
    now: u64,
) -> ngx_int_t {
    let own = Applied {
        zone_conf: found.zone_conf,
        zone: found.zone,
        slot: found.slot,
        policy,
        decision,
    };
    if decision.outcome == Outcome::Passed {
        // What `finish` does for one limit that passed, without its generality.
        if lcf.headers() {
            add_rate_limit_headers(r, &[AppliedLimit { own, global: None }]);
        }
        return passed(found.zone, state);
    }
    let rejected_by = (decision.outcome == Outcome::Rejected).then_some(0);
    let mut applied = [AppliedLimit { own, global: None }];
    finish(r, lcf, state, &mut applied, &[decision], rejected_by, now)
}

/// Act on the decisions: `decisions` holds the charged ones in order (the last one the
/// rejection, when `rejected_by` is set during charging); `rejected_by` names the limit that
/// refused the request, if any.
fn finish(
    r: &mut ngx_http_request_t,
    lcf: &LocConf,
    state: RequestState,
    applied: &mut [AppliedLimit],
    decisions: &[Decision],
    rejected_by: Option<usize>,
    now: u64,
) -> ngx_int_t {
    let dry_run = lcf.dry_run();
    let dry = if dry_run { ", dry run" } else { "" };

    if let Some(index) = rejected_by {
        let decision = if decisions.len() > index {
            decisions[index]
        } else {
            applied[index].decide_cached()
        };
        if lcf.headers() {
            // The other zones show where they stand: those charged before a late rejection
            // (committed in `decisions`) as charged, the rest unchanged.
            let charged = decisions.len().saturating_sub(1);
            for (position, limit) in applied.iter_mut().enumerate().skip(charged) {
                if position != index {
                    limit.stand(now);
                }
            }
        }
        let limit = &applied[index];
        let zone_name = &limit.own.zone_conf.name;
        ngx_log_error!(
            lcf.log_level(),
            connection_log(r),
            "limiting requests{dry}, excess: {} by zone \"{zone_name}\"",
            format_excess(decision.excess_milli)
        );
        for applied in limit.applied() {
            applied.zone.count(if dry_run {
                Counter::RejectedDryRun
            } else {
                Counter::Rejected
            });
            record_top(r, applied, TopKind::Rejected, now);
        }
        if lcf.headers() {
            add_rate_limit_headers(r, applied);
        }
        state.set(if dry_run {
            LimitStatus::RejectedDryRun
        } else {
            LimitStatus::Rejected
        });
        if dry_run {
            return Status::NGX_DECLINED.into();
        }
        let retry_after = decision.retry_after_ns.div_ceil(NANOS_PER_SEC).max(1);
        add_header(
            r,
            "Retry-After",
            itoa::Buffer::new().format(retry_after).as_bytes(),
        );
        return lcf.status() as ngx_int_t;
    }

    // Passed or delayed: the delay is the longest any zone asks for.
    let mut delay_ns = 0;
    let mut delayed_by = None;
    for (limit, decision) in applied.iter().zip(decisions) {
        let delayed = decision.outcome == Outcome::Delayed;
        let counter = match (delayed, dry_run) {
            (false, _) => Counter::Passed,
            (true, false) => Counter::Delayed,
            (true, true) => Counter::DelayedDryRun,
        };
        for applied in limit.applied() {
            applied.zone.count(counter);
            if delayed {
                record_top(r, applied, TopKind::Delayed, now);
            }
        }
        if delayed && decision.delay_ns > delay_ns {
            delay_ns = decision.delay_ns;
            delayed_by = Some((limit.own.zone_conf, *decision));
        }
    }
    if lcf.headers() {
        add_rate_limit_headers(r, applied);
    }

    let Some((zone_conf, decision)) = delayed_by else {
        state.set(LimitStatus::Passed);
        return Status::NGX_DECLINED.into();
    };
    ngx_log_error!(
        lcf.delay_log_level(),
        connection_log(r),
        "delaying request{dry}, excess: {}, by zone \"{}\"",
        format_excess(decision.excess_milli),
        zone_conf.name
    );
    if dry_run {
        state.set(LimitStatus::DelayedDryRun);
        return Status::NGX_DECLINED.into();
    }
    state.set(LimitStatus::Delayed);
    start_delay(r, delay_ns)
}

/// Count a delayed or rejected request in the zone's top keys. The key is evaluated again
/// here so that a passing request carries nothing for it; cold and out of line, so that the
/// request path around it compiles as it did without it.
#[cold]
#[inline(never)]
fn record_top(r: &mut ngx_http_request_t, applied: &Applied, kind: TopKind, now: u64) {
    if let Some(key) = evaluate_key(r, applied.zone_conf).filter(|key| !key.is_empty()) {
        crate::top::record(applied.zone, kind, now, key);
    }
}

impl AppliedLimit<'_> {
    /// Record where each zone of this limit stands, charging nothing.
    fn stand(&mut self, now_ns: u64) {
        for applied in core::iter::once(&mut self.own).chain(self.global.iter_mut()) {
            applied.decision = applied.zone.standing(applied.slot, now_ns, &applied.policy);
        }
    }

    /// The decision a peek recorded (used when the peek rejected).
    fn decide_cached(&self) -> Decision {
        match &self.global {
            None => self.own.decision,
            Some(global) => {
                ratelimit_core::token_bucket::compose_global(&self.own.decision, &global.decision)
            }
        }
    }
}

/// limit_req's "excess: 1.500": whole requests and thousandths.
fn format_excess(excess_milli: u64) -> String {
    format!("{}.{:03}", excess_milli / 1000, excess_milli % 1000)
}

/// Hold the request on a timer, as limit_req does: the worker keeps serving others, and a
/// client that goes away meanwhile is noticed by `ngx_http_test_reading`.
fn start_delay(r: &mut ngx_http_request_t, delay_ns: u64) -> ngx_int_t {
    // SAFETY: the request's connection and its events are live while the request is.
    unsafe {
        let connection = &mut *r.connection;
        let read = connection.read;
        if (*read).ready() != 0 {
            nginx_sys::ngx_post_event(read, ptr::addr_of_mut!(ngx_posted_events));
        } else if ngx_handle_read_event(read, 0) != 0 {
            return nginx_sys::NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t;
        }
        r.read_event_handler = Some(ngx_http_test_reading);
        r.write_event_handler = Some(delay_expired);
        let write = connection.write;
        (*write).set_delayed(1);
        let delay_ms = delay_ns.div_ceil(1_000_000).max(1);
        nginx_sys::ngx_add_timer(write, delay_ms as ngx::ffi::ngx_msec_t);
    }
    Status::NGX_AGAIN.into()
}

/// The write handler while delayed: when the timer fires, resume the phases (our handler
/// then declines, the request state being set).
unsafe extern "C" fn delay_expired(r: *mut ngx_http_request_t) {
    // SAFETY: nginx calls request event handlers with the live request.
    let r = unsafe { &mut *r };
    // SAFETY: the connection and its events are live while the request is.
    unsafe {
        let write = (*r.connection).write;
        if (*write).delayed() != 0 {
            if ngx_handle_write_event(write, 0) != 0 {
                ngx_http_finalize_request(
                    r,
                    nginx_sys::NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t,
                );
            }
            return;
        }
        if ngx_handle_read_event((*r.connection).read, 0) != 0 {
            ngx_http_finalize_request(r, nginx_sys::NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t);
            return;
        }
        r.read_event_handler = Some(ngx_http_block_reading);
        r.write_event_handler = Some(ngx_http_core_run_phases);
        ngx_http_core_run_phases(r);
    }
}

/// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers-10), one item per
/// zone applied to the request. Built in stack buffers without `format!`: this runs on every
/// limited request.
fn add_rate_limit_headers(r: &mut ngx_http_request_t, applied: &[AppliedLimit]) {
    match applied {
        // The common case: one item, for which the writer's loops compile away.
        [AppliedLimit { own, global: None }] => write_rate_limit_headers(r, core::iter::once(own)),
        _ => write_rate_limit_headers(r, applied.iter().flat_map(AppliedLimit::applied)),
    }
}

/// Both headers with one item per zone in `items`.
fn write_rate_limit_headers<'a, 'z: 'a>(
    r: &mut ngx_http_request_t,
    items: impl Iterator<Item = &'a Applied<'z>> + Clone,
) {
    // Each item is `"NAME";x=N;y=N`: at most the name, 10 bytes of punctuation and two
    // 20-digit numbers, plus ", " between items. Both values are written once, straight into
    // one piece of request-pool memory of that size.
    let item_capacity: usize = items
        .clone()
        .map(|applied| applied.zone_conf.name.len() + 52)
        .sum();
    let Some(mut out) = PoolWriter::new(r, 2 * item_capacity) else {
        return;
    };
    for (position, applied) in items.clone().enumerate() {
        if position > 0 {
            out.put(b", ");
        }
        put_policy_item(&mut out, applied.zone_conf, &applied.policy.limits.rate);
    }
    let policy = out.take();
    for (position, applied) in items.enumerate() {
        if position > 0 {
            out.put(b", ");
        }
        put_state_item(&mut out, applied);
    }
    push_header(r, "RateLimit-Policy", policy);
    push_header(r, "RateLimit", out.take());
}

/// `"NAME";r=R;t=T`: where the zone stands after the request.
#[inline]
fn put_state_item(out: &mut PoolWriter, applied: &Applied) {
    let mut numbers = itoa::Buffer::new();
    out.put(b"\"");
    out.put(applied.zone_conf.name.as_bytes());
    out.put(b"\";r=");
    out.put(numbers.format(applied.decision.remaining).as_bytes());
    out.put(b";t=");
    out.put(
        numbers
            .format(applied.decision.reset_ns.div_ceil(NANOS_PER_SEC))
            .as_bytes(),
    );
}

/// `"NAME";q=Q;w=W` for the zone at `rate`, formatted once per rate in each worker.
fn put_policy_item(out: &mut PoolWriter, zone_conf: &ZoneConf, rate: &Rate) {
    let format = || {
        let (quota, window) = quota_and_window(rate);
        let mut numbers = itoa::Buffer::new();
        let mut item = Vec::with_capacity(zone_conf.name.len() + 46);
        item.push(b'"');
        item.extend_from_slice(zone_conf.name.as_bytes());
        item.extend_from_slice(b"\";q=");
        item.extend_from_slice(numbers.format(quota).as_bytes());
        item.extend_from_slice(b";w=");
        item.extend_from_slice(numbers.format(window).as_bytes());
        item
    };
    let Ok(mut cached) = zone_conf.policy_item.try_borrow_mut() else {
        out.put(&format());
        return;
    };
    match &*cached {
        Some((cached_rate, item)) if cached_rate == rate => out.put(item),
        _ => {
            let item = format();
            out.put(&item);
            *cached = Some((*rate, item));
        }
    }
}

/// Bytes written in order into request-pool memory of a fixed size (never past it).
struct PoolWriter {
    buffer: &'static mut [u8],
    len: usize,
}

impl PoolWriter {
    fn new(r: &mut ngx_http_request_t, capacity: usize) -> Option<PoolWriter> {
        // SAFETY: the request pool is live; the memory stays valid as long as the request.
        let data = unsafe { ngx_pnalloc(r.pool, capacity.max(1)) }.cast::<u8>();
        if data.is_null() {
            return None;
        }
        // SAFETY: `data` has `capacity` writable bytes, used by this writer alone.
        let buffer = unsafe { core::slice::from_raw_parts_mut(data, capacity) };
        Some(PoolWriter { buffer, len: 0 })
    }

    #[inline]
    fn put(&mut self, bytes: &[u8]) {
        if let Some(target) = self.buffer.get_mut(self.len..self.len + bytes.len()) {
            target.copy_from_slice(bytes);
            self.len += bytes.len();
        }
    }

    fn finish(mut self) -> ngx_str_t {
        self.take()
    }

    /// The bytes written since the last `take` (or since the start); later writes go after
    /// them, into the rest of the memory.
    fn take(&mut self) -> ngx_str_t {
        let (written, rest) = core::mem::take(&mut self.buffer).split_at_mut(self.len);
        self.buffer = rest;
        self.len = 0;
        ngx_str_t {
            len: written.len(),
            data: written.as_mut_ptr(),
        }
    }
}

/// The rate as whole requests `q` per `w` seconds: `10r/s` is q=10 w=1, `0.5r/s` is q=1 w=2.
pub fn quota_and_window(rate: &Rate) -> (u64, u64) {
    let milli = rate.milli_requests.max(1);
    let unit_secs = rate.unit.nanos() / NANOS_PER_SEC;
    let divisor = gcd(milli, 1000);
    (milli / divisor, unit_secs * 1000 / divisor)
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Append a response header; values are copied into the request pool.
pub fn add_header(r: &mut ngx_http_request_t, name: &'static str, value: &[u8]) {
    let Some(mut copy) = PoolWriter::new(r, value.len()) else {
        return;
    };
    copy.put(value);
    push_header(r, name, copy.finish());
}

/// Append a response header whose value already lives in the request pool.
fn push_header(r: &mut ngx_http_request_t, name: &'static str, value: ngx_str_t) {
    // The element starts zeroed and only the fields every supported nginx has are set: from
    // 1.23.0 on it also has `next` (null for a single header), which 1.22's headers lack.
    // SAFETY: ngx_table_elt_t is plain data for which all-zero bytes are a valid value.
    let mut element: ngx_table_elt_t = unsafe { core::mem::zeroed() };
    element.hash = 1;
    element.key = ngx_str_t {
        len: name.len(),
        data: name.as_ptr().cast_mut(),
    };
    element.value = value;
    // SAFETY: the request's output header list is live; the element is fully initialized
    // before nginx sees it.
    unsafe {
        let header = ngx_list_push(&mut r.headers_out.headers).cast::<ngx_table_elt_t>();
        if header.is_null() {
            return;
        }
        header.write(element);
    }
}

/// Register `$rate_limit_status`.
pub fn add_variables(cf: &mut ngx_conf_t) -> Result<(), ()> {
    let mut name = ngx_str_t {
        len: "rate_limit_status".len(),
        data: c"rate_limit_status".as_ptr().cast_mut().cast(),
    };
    // SAFETY: `cf` is valid; the name is static.
    let var =
        unsafe { ngx_http_add_variable(cf, &mut name, NGX_HTTP_VAR_NOCACHEABLE as ngx_uint_t) };
    if var.is_null() {
        return Err(());
    }
    // SAFETY: ngx_http_add_variable returned a live variable definition.
    unsafe { (*var).get_handler = Some(status_variable) };
    Ok(())
}

/// Called only while no outcome is stored in the request's variables (`RequestState::set`
/// stores it there directly): no limit applied.
unsafe extern "C" fn status_variable(
    _r: *mut ngx_http_request_t,
    v: *mut ngx_http_variable_value_t,
    _data: usize,
) -> ngx_int_t {
    // SAFETY: nginx calls variable handlers with a value to fill.
    value_bits::write(v, value_bits::NOT_FOUND);
    Status::NGX_OK.into()
}
