//! The request path: the preaccess handler, delays, response headers and `$rate_limit_status`.
//! A front door: it finds the request's keys and decides through `crate::control::decide`.

mod api_key;
mod body;
mod charge;
mod concurrency;
mod delay;
mod grpc;
mod headers;
mod key;
mod remote_net;
mod status;
pub mod usage;
mod variables;

use core::ptr;

use ngx::core::Status;
use ngx::ffi::{ngx_http_request_t, ngx_int_t, ngx_shm_zone_t};
use ngx::http::{HttpModuleLocationConf, HttpModuleMainConf};
use ratelimit_core::{Outcome, NANOS_PER_SEC};
use smallvec::SmallVec;

use crate::conf::RateLimitModule;
use crate::conf::{LimitConf, LocConf, Shape, ZoneConf};
use crate::control::decide::Verdict;
use crate::control::decide::{self, Applied, AppliedLimit, Charge, Found, One};
use crate::control::outcome::{self, Action, Door, Refused, Wait};
use crate::glue::response::add_header;
use crate::glue::{connection_log, now_ns};
pub use charge::log_handler as charge_log_handler;
pub use concurrency::log_handler as concurrency_log_handler;
use headers::add_rate_limit_headers;
use key::evaluate_key;
use status::{request_state, LimitStatus, RequestState};
pub use usage::log_handler as usage_log_handler;
pub use variables::add_variables;

fn zone_conf_of(shm_zone: *mut ngx_shm_zone_t) -> Option<&'static ZoneConf> {
    // SAFETY: `shm_zone` was returned by ngx_shared_memory_add for this cycle; its `data` is a
    // `ZoneConf` in the cycle's pool (checked non-null), alive while requests run.
    unsafe { shm_zone.as_ref()?.data.cast::<ZoneConf>().as_ref() }
}

/// Find the zone's entry for the request's key (claiming one for a new key); `None` when the
/// key is empty or too long, or the zone is not set up.
#[inline(always)]
fn find_key<'a>(
    r: &mut ngx_http_request_t,
    shm_zone: *mut ngx_shm_zone_t,
    now_ns: u64,
) -> Option<Found<'a>> {
    let zone_conf = zone_conf_of(shm_zone)?;
    let zone = zone_conf.zone.as_ref()?;
    let log = connection_log(r);
    let key = evaluate_key(r, zone_conf)?;
    crate::control::key::entry(zone_conf, zone, key, now_ns, log)
}

/// The zone's entry for the request's key and the limits that apply to it, not yet decided.
fn resolve<'a>(
    r: &mut ngx_http_request_t,
    shm_zone: *mut ngx_shm_zone_t,
    limit: &LimitConf,
    now_ns: u64,
) -> Option<Applied<'a>> {
    Applied::new(find_key(r, shm_zone, now_ns)?, limit, now_ns)
}

/// The preaccess phase handler.
pub unsafe extern "C" fn preaccess_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    crate::glue::guard::entry(
        "handler::preaccess_handler",
        || nginx_sys::NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t,
        || {
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
            let Some(index) = RateLimitModule::main_conf(r).and_then(|mcf| mcf.status_variable)
            else {
                return Status::NGX_DECLINED.into();
            };
            let state = request_state(r, index);
            let shape = shape(lcf);
            if shape == Shape::Quick {
                // No concurrency line: no queued request to resume.
                if state.is_set() {
                    return Status::NGX_DECLINED.into();
                }
                if let [limit] = lcf.limits() {
                    return limit_quick(r, lcf, state, limit);
                }
            }
            if lcf.reads_body() {
                if let Some(rc) = body::wait_for_body(r) {
                    return rc;
                }
                if !state.is_set() {
                    if let Some(rc) = body::refused(r, lcf) {
                        return rc;
                    }
                }
            }
            if let Some(rc) = concurrency::resumed(r, lcf, state) {
                return rc;
            }
            if state.is_set() {
                return Status::NGX_DECLINED.into();
            }
            if shape == Shape::Concurrency {
                return concurrency::limit(r, lcf, state);
            }
            limit_request(r, lcf, state)
        },
    )
}

/// The location's [`Shape`], worked out on its first request.
#[inline(always)]
fn shape(lcf: &LocConf) -> Shape {
    match lcf.shape.get() {
        Some(shape) => shape,
        None => learn_shape(lcf),
    }
}

#[cold]
#[inline(never)]
fn learn_shape(lcf: &LocConf) -> Shape {
    let limits = lcf.limits();
    let shape = if limits
        .iter()
        .any(|limit| concurrency::line_zone(limit).is_some())
    {
        Shape::Concurrency
    } else if is_quick(lcf) {
        Shape::Quick
    } else {
        Shape::Rates
    };
    lcf.shape.set(Some(shape));
    shape
}

/// Whether the location is [`Shape::Quick`] (its lines known to be on rate zones).
fn is_quick(lcf: &LocConf) -> bool {
    let [limit] = lcf.limits() else {
        return false;
    };
    let Some(zone_conf) = zone_conf_of(limit.shm_zone) else {
        return false;
    };
    let shows_headers = lcf.headers() && limit.headers;
    !shows_headers
        && !lcf.openai_headers()
        && limit.global.is_none()
        && !limit.cost_per_request()
        && limit.on_status.is_none()
        && !zone_conf.sync
        && zone_conf.block.is_none()
}

/// A [`Shape::Quick`] location's request: inlined into the phase handler, so that a request
/// that passes costs one key lookup, one compare-and-swap and a counter.
#[inline(always)]
fn limit_quick(
    r: &mut ngx_http_request_t,
    lcf: &LocConf,
    state: RequestState,
    limit: &LimitConf,
) -> ngx_int_t {
    let now = now_ns();
    let Some(found) = find_key(r, limit.shm_zone, now) else {
        return Status::NGX_DECLINED.into();
    };
    match decide::decide_quick(found, limit, now) {
        One::Passed => passed(state),
        one => act_on_one(r, lcf, state, limit, one, now),
    }
}

#[inline(never)]
fn limit_request(r: &mut ngx_http_request_t, lcf: &LocConf, state: RequestState) -> ngx_int_t {
    let now = now_ns();
    // The common case, one limit without `global=`: no collection, one compare-and-swap,
    // and a request that passes without headers to add is done right here.
    if let [limit] = lcf.limits() {
        if limit.global.is_none() && !limit.cost_per_request() && !lcf.openai_headers() {
            return limit_one(r, lcf, state, limit, now);
        }
    }

    limit_lines(r, lcf, state, lcf.limits().iter(), now)
}

/// The rate limits of a location that has concurrency lines too (taken before).
fn limit_rates(r: &mut ngx_http_request_t, lcf: &LocConf, state: RequestState) -> ngx_int_t {
    let rates = lcf
        .limits()
        .iter()
        .filter(|limit| concurrency::line_zone(limit).is_none());
    limit_lines(r, lcf, state, rates, now_ns())
}

/// Decide `lines` (several, or one with `global=`) and act on the verdict.
fn limit_lines<'l>(
    r: &mut ngx_http_request_t,
    lcf: &LocConf,
    state: RequestState,
    lines: impl Iterator<Item = &'l LimitConf>,
    now: u64,
) -> ngx_int_t {
    // Inline storage: the common configurations (one or two limits) never touch the heap.
    let mut applied: SmallVec<[AppliedLimit; 2]> = SmallVec::new();
    let mut confs: SmallVec<[&LimitConf; 2]> = SmallVec::new();
    for limit in lines {
        let Some(mut own) = resolve(r, limit.shm_zone, limit, now) else {
            continue;
        };
        if limit.cost_per_request() {
            usage::set_cost(r, limit, &mut own);
        }
        let global = limit
            .global
            .and_then(|global| resolve(r, global, limit, now));
        let mut applied_limit = AppliedLimit::new(own, global);
        applied_limit.on_status = limit.on_status;
        applied_limit.headers = limit.headers;
        applied.push(applied_limit);
        confs.push(limit);
    }
    if applied.is_empty() {
        return Status::NGX_DECLINED.into();
    }
    let verdict = decide::decide(&mut applied, now, Charge::Now);
    if verdict.outcome != Outcome::Rejected {
        charge::give_back_unless_status(r, &applied);
        usage::keep(r, &applied, &confs);
    }
    let rc = finish(r, lcf, state, &mut applied, &verdict, now);
    // NGX_DONE: answered in gRPC's terms, and ended.
    if !lcf.openai_headers() || rc == ngx::ffi::NGX_DONE as ngx_int_t {
        return rc;
    }
    usage::add_openai_headers(r, &applied, &confs);
    if verdict.outcome == Outcome::Rejected && rc == lcf.status() as ngx_int_t {
        return usage::reject_in_openai_json(r, &applied, &confs, &verdict, rc);
    }
    rc
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
    // With `on_status=` the request's charge is kept until the response: the decision is
    // needed whole.
    let report = (lcf.headers() && limit.headers) || limit.on_status.is_some();
    let one = decide::decide_one(found, limit, now, report);
    act_on_one(r, lcf, state, limit, one, now)
}

/// Act on [`decide::decide_one`]'s answer for one line.
#[inline(never)]
fn act_on_one(
    r: &mut ngx_http_request_t,
    lcf: &LocConf,
    state: RequestState,
    limit: &LimitConf,
    one: One,
    now: u64,
) -> ngx_int_t {
    match one {
        One::Passed => passed(state),
        One::Unlimited => Status::NGX_DECLINED.into(),
        One::Decided(own) if own.decision.outcome == Outcome::Passed => {
            // What `finish` does for one limit that passed, without its generality.
            if lcf.headers() && limit.headers {
                headers::add_one(r, &own);
            }
            decide::account_passed(own.zone);
            if let Some(on_status) = limit.on_status {
                charge::give_back_one_unless_status(r, on_status, &own);
            }
            passed(state)
        }
        One::Decided(own) => {
            let applied = &mut [AppliedLimit::new(own, None)];
            applied[0].headers = limit.headers;
            let verdict = decide::verdict(applied);
            if verdict.outcome != Outcome::Rejected {
                charge::give_back_unless_status(r, applied);
            }
            finish(r, lcf, state, applied, &verdict, now)
        }
        One::Blocked(own, left_ns) => {
            let applied = &mut [AppliedLimit::new(own, None)];
            applied[0].headers = limit.headers;
            let verdict = decide::blocked_verdict(applied, 0, left_ns, now);
            finish(r, lcf, state, applied, &verdict, now)
        }
    }
}

/// A request that its limits let through: marked for `$rate_limit_status`, and on to the next
/// phase.
#[inline]
fn passed(state: RequestState) -> ngx_int_t {
    state.set(LimitStatus::Passed);
    Status::NGX_DECLINED.into()
}

/// Act on the verdict: settled once for every door (`control::outcome`: log lines,
/// counters, top keys, a block), then headers, `$rate_limit_status`, and reject, delay or go
/// on.
fn finish(
    r: &mut ngx_http_request_t,
    lcf: &LocConf,
    state: RequestState,
    applied: &mut [AppliedLimit],
    verdict: &Verdict,
    now: u64,
) -> ngx_int_t {
    let door = Door {
        noun: "request",
        log: connection_log(r),
        level: lcf.log_level(),
        delay_level: lcf.delay_log_level(),
        dry_run: lcf.dry_run(),
        shows_standing: lcf.headers(),
    };
    let settled = outcome::settle(&door, applied, verdict, now, |zone_conf| {
        key_bytes(r, zone_conf)
    });
    if lcf.headers() {
        add_rate_limit_headers(r, applied);
    }
    state.set(settled.status);
    match settled.action {
        Action::Proceed => Status::NGX_DECLINED.into(),
        Action::Delay(delay_ns) => delay::start_delay(r, delay_ns),
        Action::Refuse(refused) => reject(r, lcf, &refused),
    }
}

/// Refuse the request: a gRPC call in gRPC's terms (`rate_limit_grpc`), anything else with
/// the location's status and `Retry-After` (whole seconds, at least one) when the wait is
/// said. A gRPC answer ends the request (`NGX_DONE`): the caller must not touch it again.
fn reject(r: &mut ngx_http_request_t, lcf: &LocConf, refused: &Refused) -> ngx_int_t {
    if grpc::applies(r, lcf) {
        return grpc::refuse(r, refused);
    }
    if let Wait::After(wait_ns) = refused.wait {
        let retry_after = wait_ns.div_ceil(NANOS_PER_SEC).max(1);
        add_header(
            r,
            "Retry-After",
            itoa::Buffer::new().format(retry_after).as_bytes(),
        );
    }
    lcf.status() as ngx_int_t
}

/// The request's key in a zone, copied (for the top keys and the penalty box: only delayed,
/// rejected and blocked requests ask). Cold and out of line, so that the request path around
/// it stays as short as without it.
#[cold]
#[inline(never)]
fn key_bytes(r: &mut ngx_http_request_t, zone_conf: &ZoneConf) -> Option<Vec<u8>> {
    outcome::owned_key(evaluate_key(r, zone_conf))
}
