//! The request path's concurrency lines: a request takes each one's permits (in order), waits in
//! a line's queue when it must, and only then meets the location's rate limits. While it
//! waits it is parked like a delayed request (a client that goes away is noticed); the
//! worker's queue (`control::queue`) resumes it.
//!
//! Its context (`Ctx`, the module's request context) says which line it is at; internal
//! redirects clear it once the request went through, when `$rate_limit_status` is set and
//! tells the next location that the request was limited already.

use core::mem;
use core::ptr;

use ngx::core::Status;
use ngx::ffi::{
    ngx_handle_read_event, ngx_http_block_reading, ngx_http_core_run_phases,
    ngx_http_request_empty_handler, ngx_http_request_t, ngx_http_test_reading, ngx_int_t,
    ngx_pcalloc, ngx_posted_events,
};
use ngx::http::HttpModule;
use ngx::ngx_log_error;
use ratelimit_core::top::TopKind;

use super::find_key;
use super::status::{LimitStatus, RequestState};
use crate::conf::{LimitConf, LocConf, RateLimitModule, ZoneConf};
use crate::control::concurrency::{self as permits, Arrival, Line, Refusal};
use crate::control::outcome::{Refused, Wait};
use crate::control::queue::{Owner, Resolution};
use crate::glue::{connection_log, now_ns};
use crate::store::Counter;
use ratelimit_core::NANOS_PER_SEC;

/// A request's progress through its location's concurrency lines.
#[derive(Default)]
struct Ctx {
    /// The next line to take permits of (an index into the location's `rate_limit` lines).
    next: usize,
    /// It waited in a queue (`$rate_limit_status` says QUEUED).
    queued: bool,
    /// Set by the queue when the wait is over.
    resolution: Option<Resolution>,
    /// It is waiting now.
    waiting: bool,
    /// A dry-run line would have queued or rejected it.
    dry: Option<LimitStatus>,
}

fn ctx_index() -> usize {
    RateLimitModule::module().ctx_index
}

fn context(r: &ngx_http_request_t) -> Option<&'static mut Ctx> {
    // SAFETY: `r->ctx` has one pointer per HTTP module; ours holds null or a `Ctx` allocated in
    // the request's pool by `new_context`.
    unsafe { (*r.ctx.add(ctx_index())).cast::<Ctx>().as_mut() }
}

fn new_context(r: &mut ngx_http_request_t) -> Option<&'static mut Ctx> {
    // SAFETY: the request's pool is live; zeroed memory of the right size is then written.
    let ctx = unsafe { ngx_pcalloc(r.pool, mem::size_of::<Ctx>()) }.cast::<Ctx>();
    if ctx.is_null() {
        return None;
    }
    // SAFETY: `ctx` is fresh pool memory, aligned for Ctx (NGX_ALIGNMENT).
    unsafe {
        ctx.write(Ctx::default());
        *r.ctx.add(ctx_index()) = ctx.cast();
        ctx.as_mut()
    }
}

/// The concurrency zone of a line, if its zone is one.
pub fn line_zone(limit: &LimitConf) -> Option<&'static ZoneConf> {
    super::zone_conf_of(limit.shm_zone).filter(|zone| zone.algorithm.counts_in_flight())
}

/// A request that is back from a queue, if it is one: go on with its lines.
pub fn resumed(
    r: &mut ngx_http_request_t,
    lcf: &LocConf,
    state: RequestState,
) -> Option<ngx_int_t> {
    let ctx = context(r)?;
    if !ctx.waiting {
        return None;
    }
    let resolution = ctx.resolution.take()?;
    ctx.waiting = false;
    match resolution {
        Resolution::Admitted => {
            ctx.queued = true;
            ctx.next += 1;
            Some(run_lines(r, lcf, state, ctx))
        }
        Resolution::Refused => {
            let name = lcf
                .limits()
                .get(ctx.next)
                .and_then(line_zone)
                .map_or("", |zone| zone.name.as_str());
            ngx_log_error!(
                lcf.log_level(),
                connection_log(r),
                "limiting requests, queue timeout by zone \"{name}\""
            );
            if let Some(zone) = lcf.limits().get(ctx.next).and_then(line_zone) {
                if let Some(store) = zone.zone.as_ref() {
                    store.count(Counter::Rejected);
                }
            }
            let shown = lcf.limits().get(ctx.next).is_none_or(|limit| limit.headers);
            let refused = Refused {
                reason: "queue timeout",
                zone: name,
                wait: if shown {
                    Wait::After(NANOS_PER_SEC)
                } else {
                    Wait::Unsaid
                },
            };
            Some(reject(r, lcf, state, &refused))
        }
    }
}

/// A request's first pass: its concurrency lines, then its rate limits.
pub fn limit(r: &mut ngx_http_request_t, lcf: &LocConf, state: RequestState) -> ngx_int_t {
    let Some(ctx) = new_context(r) else {
        return nginx_sys::NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t;
    };
    run_lines(r, lcf, state, ctx)
}

/// Take the permits of each concurrency line from `ctx.next` on; then the rate limits.
fn run_lines(
    r: &mut ngx_http_request_t,
    lcf: &LocConf,
    state: RequestState,
    ctx: &mut Ctx,
) -> ngx_int_t {
    let now = now_ns();
    let dry_run = lcf.dry_run();
    let lines = lcf.limits();
    while ctx.next < lines.len() {
        let limit = &lines[ctx.next];
        let Some(zone_conf) = line_zone(limit) else {
            ctx.next += 1;
            continue;
        };
        let Some(found) = find_key(r, limit.shm_zone, now) else {
            ctx.next += 1;
            continue;
        };
        let line = Line {
            zone_conf,
            zone: *found.zone,
            slot: found.slot,
            hash: found.hash(),
            cost: limit.cost,
            queue: limit.burst,
        };
        if holds_permits(r, &line) {
            // Permits of this key are held for the request already (Lua's `conn`, before an
            // `ngx.exec` here): one request, counted once.
            ctx.next += 1;
            continue;
        }
        let owner = Owner::Request {
            r: ptr::from_mut(r),
            resume,
        };
        match permits::arrive(r.pool, &line, now, dry_run, owner) {
            Arrival::Admitted { .. } => {
                found.zone.count(if ctx.queued {
                    Counter::Delayed
                } else {
                    Counter::Passed
                });
            }
            Arrival::Unlimited => {}
            Arrival::Queued { .. } => {
                ngx_log_error!(
                    lcf.delay_log_level(),
                    connection_log(r),
                    "queueing request by zone \"{}\"",
                    zone_conf.name
                );
                record_top(r, zone_conf, TopKind::Delayed, now);
                ctx.waiting = true;
                return park(r);
            }
            Arrival::Rejected(refusal) => {
                log_refusal(r, lcf, zone_conf, &refusal, "");
                found.zone.count(Counter::Rejected);
                record_top(r, zone_conf, TopKind::Rejected, now);
                let retry_after_s = permits::retry_after_seconds(&refusal);
                let refused = Refused {
                    reason: "too many in flight",
                    zone: &zone_conf.name,
                    wait: if limit.headers {
                        Wait::After(retry_after_s.saturating_mul(NANOS_PER_SEC))
                    } else {
                        Wait::Unsaid
                    },
                };
                return reject(r, lcf, state, &refused);
            }
            Arrival::DryRun { queued, refusal } => {
                if queued {
                    found.zone.count(Counter::DelayedDryRun);
                    ctx.dry.get_or_insert(LimitStatus::DelayedDryRun);
                } else {
                    log_refusal(r, lcf, zone_conf, &refusal, ", dry run");
                    found.zone.count(Counter::RejectedDryRun);
                    ctx.dry = Some(LimitStatus::RejectedDryRun);
                }
            }
        }
        ctx.next += 1;
    }
    let status = ctx.dry.unwrap_or(if ctx.queued {
        LimitStatus::Queued
    } else {
        LimitStatus::Passed
    });
    // The location's rate limits, which skip its concurrency lines.
    let rc = super::limit_rates(r, lcf, state);
    if rc == ngx::ffi::NGX_DONE as ngx_int_t {
        // Answered from the preaccess phase (gRPC's terms, OpenAI's body) and ended: the
        // request may be freed, its pool's cleanup gave its permits back.
        return rc;
    }
    if rc == lcf.status() as ngx_int_t && !lcf.dry_run() {
        // Rejected by a rate limit: charged to none, its permits included.
        release_all(r);
        return rc;
    }
    // No rate limit, or one that let it pass at once: the status says what the concurrency
    // lines did (a rate limit's delay or dry-run verdict is left as it said).
    if !state.is_set() || state.is(LimitStatus::Passed) {
        state.set(status);
    }
    rc
}

/// Whether the request holds permits of `line`'s key already.
fn holds_permits(r: &ngx_http_request_t, line: &Line) -> bool {
    let mut held = false;
    // SAFETY: the pool of the live request being handled.
    unsafe {
        permits::each_holding(r.pool, |holding| {
            held |= holding.is_held_for(&line.zone, line.slot);
        });
    }
    held
}

fn log_refusal(
    r: &ngx_http_request_t,
    lcf: &LocConf,
    zone_conf: &ZoneConf,
    refusal: &Refusal,
    dry: &str,
) {
    ngx_log_error!(
        lcf.log_level(),
        connection_log(r),
        "limiting requests{dry}, in flight: {} of {}, queued: {} by zone \"{}\"",
        refusal.in_flight,
        refusal.limit,
        refusal.queued,
        zone_conf.name
    );
}

/// Refuse the request (`super::reject`), after giving back the permits it took at earlier
/// lines.
fn reject(
    r: &mut ngx_http_request_t,
    lcf: &LocConf,
    state: RequestState,
    refused: &Refused,
) -> ngx_int_t {
    release_all(r);
    state.set(LimitStatus::Rejected);
    super::reject(r, lcf, refused)
}

fn release_all(r: &mut ngx_http_request_t) {
    let now = now_ns();
    // SAFETY: the live request's pool.
    unsafe {
        permits::each_holding(r.pool, |holding| {
            holding.release(now, false);
        })
    };
}

#[cold]
#[inline(never)]
fn record_top(r: &mut ngx_http_request_t, zone_conf: &ZoneConf, kind: TopKind, now: u64) {
    let Some(zone) = zone_conf.zone.as_ref() else {
        return;
    };
    if let Some(key) = super::key::evaluate_key(r, zone_conf).filter(|key| !key.is_empty()) {
        zone.record_top(kind, now, key);
    }
}

/// Park the request until the queue resumes it: a client that goes away meanwhile is
/// noticed, and its request ends (its ticket then leaves the queue at the head).
fn park(r: &mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: the request's connection and its events are live while the request is.
    unsafe {
        let read = (*r.connection).read;
        if (*read).ready() != 0 {
            nginx_sys::ngx_post_event(read, ptr::addr_of_mut!(ngx_posted_events));
        } else if ngx_handle_read_event(read, 0) != 0 {
            return nginx_sys::NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t;
        }
    }
    r.read_event_handler = Some(ngx_http_test_reading);
    r.write_event_handler = Some(ngx_http_request_empty_handler);
    Status::NGX_AGAIN.into()
}

/// The queue's word for a parked request: run its phases again (the preaccess handler finds
/// the resolution in its context).
unsafe fn resume(r: *mut ngx_http_request_t, resolution: Resolution) {
    // SAFETY: the queue resumes only live, parked requests (see `control::queue::tick`).
    let r = unsafe { &mut *r };
    let Some(ctx) = context(r) else {
        return;
    };
    ctx.resolution = Some(resolution);
    r.read_event_handler = Some(ngx_http_block_reading);
    r.write_event_handler = Some(ngx_http_core_run_phases);
    // SAFETY: the connection's write event is live; posted events run on this thread.
    unsafe {
        nginx_sys::ngx_post_event((*r.connection).write, ptr::addr_of_mut!(ngx_posted_events))
    };
}

/// The log phase: each holding of permits learns the request's latency (for an adaptive
/// limit), before its pool's cleanup gives the permits back.
pub unsafe extern "C" fn log_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    crate::glue::guard::entry(
        "handler::concurrency::log_handler",
        || ngx_int_t::from(ngx::core::Status::NGX_ERROR),
        || {
            // SAFETY: nginx calls phase handlers with the live request.
            let r = unsafe { &mut *r };
            if ptr::eq(r.main, r) {
                let mut measured = None;
                // SAFETY: the live request's pool.
                unsafe {
                    permits::each_holding(r.pool, |holding| {
                        let (upstream_ms, now) =
                            *measured.get_or_insert_with(|| (permits::upstream_ms(r), now_ns()));
                        holding.measure(upstream_ms, now);
                    })
                };
            }
            Status::NGX_OK.into()
        },
    )
}
