//! A stream session's path: the preaccess handler that charges a new connection (TCP) or a
//! new session (UDP) to its zones, closes it over the limit, delays it to the rate, and holds
//! concurrency slots until the session's pool is freed; and `$rate_limit_status`.

use core::ptr;

use nginx_sys::{ngx_stream_session_t, NGX_STREAM_SERVICE_UNAVAILABLE, NGX_STREAM_VAR_NOCACHEABLE};
use ngx::core::Status;
use ngx::ffi::{ngx_event_t, ngx_int_t, ngx_log_t, ngx_str_t, ngx_uint_t, ngx_variable_value_t};
use ngx::ngx_log_error;
use ratelimit_core::penalty::duration_text;
use ratelimit_core::top::TopKind;
use ratelimit_core::Outcome;
use smallvec::SmallVec;

use super::conf::{MainConf, SrvConf, StreamZone};
use crate::conf::{ConfError, LimitConf, ZoneConf};
use crate::control::concurrency::{self as slots, Arrival, Line};
use crate::control::decide::{self, Applied, AppliedLimit, Charge, Found, Verdict};
use crate::control::queue::Owner;
use crate::glue::{now_ns, value_bits};
use crate::store::{Counter, MAX_KEY_BYTES};

/// `$rate_limit_status` values, as the http variable has them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SessionStatus {
    Passed,
    Delayed,
    Rejected,
    DelayedDryRun,
    RejectedDryRun,
    Blocked,
    BlockedDryRun,
}

impl SessionStatus {
    fn as_str(self) -> &'static str {
        match self {
            SessionStatus::Passed => "PASSED",
            SessionStatus::Delayed => "DELAYED",
            SessionStatus::Rejected => "REJECTED",
            SessionStatus::DelayedDryRun => "DELAYED_DRY_RUN",
            SessionStatus::RejectedDryRun => "REJECTED_DRY_RUN",
            SessionStatus::Blocked => "BLOCKED",
            SessionStatus::BlockedDryRun => "BLOCKED_DRY_RUN",
        }
    }
}

/// Where a session's outcome is kept: `$rate_limit_status`'s own slot in `s->variables`
/// (set: the session was decided already, and is resuming after its delay).
#[derive(Clone, Copy)]
struct SessionState {
    value: *mut ngx_variable_value_t,
}

impl SessionState {
    fn of(s: &ngx_stream_session_t, index: ngx_uint_t) -> SessionState {
        // SAFETY: `s->variables` has one entry per indexed stream variable of this
        // configuration, and `index` was obtained from ngx_stream_get_variable_index.
        SessionState {
            value: unsafe { s.variables.add(index) },
        }
    }

    fn is_set(self) -> bool {
        let bits = value_bits::read(self.value);
        bits & value_bits::VALID != 0 && bits & value_bits::LEN != 0
    }

    fn set(self, status: SessionStatus) {
        let text = status.as_str();
        // SAFETY: `value` points into the live session's variables; the text is static.
        unsafe { (*self.value).data = text.as_ptr().cast_mut() };
        // A cacheable value: ngx_stream_get_flushed_variable returns it as it is.
        value_bits::write_all(self.value, text.len() as u32 | value_bits::VALID);
    }
}

/// Register the stream `$rate_limit_status`.
pub fn add_variables(cf: &mut ngx::ffi::ngx_conf_t, main: &MainConf) -> Result<(), ConfError> {
    let mut name = ngx_str_t {
        len: "rate_limit_status".len(),
        data: c"rate_limit_status".as_ptr().cast_mut().cast(),
    };
    let flags = NGX_STREAM_VAR_NOCACHEABLE as ngx_uint_t;
    // SAFETY: `cf` is valid; the name is static.
    let var = unsafe { (main.api.add_variable)(cf, &mut name, flags) };
    // SAFETY: a non-null result is a live variable definition.
    let var = unsafe { var.as_mut() }.ok_or(ConfError::Logged)?;
    var.get_handler = Some(status_variable);
    Ok(())
}

/// Called only while no outcome is stored in the session's variables: no limit applied.
unsafe extern "C" fn status_variable(
    _s: *mut ngx_stream_session_t,
    v: *mut ngx_variable_value_t,
    _data: usize,
) -> ngx_int_t {
    value_bits::write(v, value_bits::NOT_FOUND);
    Status::NGX_OK.into()
}

fn main_conf(s: &ngx_stream_session_t) -> Option<&'static MainConf> {
    // SAFETY: a session's main_conf array has an element per stream module, ours at its
    // ctx_index, in the cycle's configuration pool.
    unsafe {
        let index = (*super::module_ptr()).ctx_index;
        (*s.main_conf.add(index)).cast::<MainConf>().as_ref()
    }
}

fn srv_conf(s: &ngx_stream_session_t) -> Option<&'static SrvConf> {
    // SAFETY: as for `main_conf`, with the session's server configurations.
    unsafe {
        let index = (*super::module_ptr()).ctx_index;
        (*s.srv_conf.add(index)).cast::<SrvConf>().as_ref()
    }
}

fn session_log(s: &ngx_stream_session_t) -> *mut ngx_log_t {
    // SAFETY: a live session always has a connection with a log.
    unsafe { (*s.connection).log }
}

/// The stream zone of a line (a stream `rate_limit` only names stream zones: checked when the
/// stream block was read).
fn stream_zone(limit: &LimitConf) -> Option<&'static StreamZone> {
    // SAFETY: the line's shm_zone was returned by ngx_shared_memory_add for this cycle; its
    // data, when set, is a ZoneConf, which a stream zone's StreamZone starts with.
    unsafe {
        let zone_conf = (*limit.shm_zone).data.cast::<ZoneConf>().as_ref()?;
        zone_conf
            .stream
            .then(|| &*ptr::from_ref(zone_conf).cast::<StreamZone>())
    }
}

/// The session's key in a stream zone (empty when its variables are not found).
fn evaluate_key<'s>(
    s: &'s mut ngx_stream_session_t,
    main: &MainConf,
    zone: &StreamZone,
) -> Option<&'s [u8]> {
    if let Some(index) = zone.key_variable {
        // SAFETY: `s` is the live session and `index` a stream variable index of this
        // configuration.
        let value = unsafe { (main.api.get_flushed_variable)(s, index) };
        // SAFETY: a non-null result is a live variable value of the session, in its pool.
        return Some(unsafe { value_bits::found(value) }.unwrap_or(&[]));
    }
    let mut key = ngx_str_t {
        len: 0,
        data: ptr::null_mut(),
    };
    let key_cv = ptr::addr_of!(zone.key).cast_mut();
    // SAFETY: `s` is the live session; the complex value was compiled at configuration time.
    if unsafe { (main.api.complex_value)(s, key_cv, &mut key) } != 0 {
        return None;
    }
    if key.len == 0 {
        return Some(&[]);
    }
    // SAFETY: the value lives in the session's pool (or the configuration, for a constant).
    Some(unsafe { core::slice::from_raw_parts(key.data.cast_const(), key.len) })
}

/// The zone's slot for the session's key; `None` when the key is empty or too long, or the
/// zone is not set up.
fn find_key(
    s: &mut ngx_stream_session_t,
    main: &MainConf,
    zone: &'static StreamZone,
    now_ns: u64,
) -> Option<Found<'static>> {
    let shared = zone.conf.zone.as_ref()?;
    let log = session_log(s);
    let key = evaluate_key(s, main, zone)?;
    if key.is_empty() {
        return None;
    }
    if key.len() > MAX_KEY_BYTES {
        ngx_log_error!(
            ngx::ffi::NGX_LOG_ERR,
            log,
            "the value of the \"{}\" key is more than 65535 bytes",
            zone.conf.key_text
        );
        return None;
    }
    let (found, evicted) = decide::find(&zone.conf, shared, key, now_ns);
    if evicted {
        found.log_zone_full(now_ns, log);
    }
    Some(found)
}

/// The key copied, for the top keys and the penalty box (only delayed, rejected and blocked
/// sessions ask).
#[cold]
fn key_bytes(
    s: &mut ngx_stream_session_t,
    main: &MainConf,
    zone_conf: &ZoneConf,
) -> Option<Vec<u8>> {
    if !zone_conf.stream {
        return None;
    }
    // SAFETY: a stream zone's ZoneConf is the first field of its StreamZone.
    let zone = unsafe { &*ptr::from_ref(zone_conf).cast::<StreamZone>() };
    evaluate_key(s, main, zone)
        .filter(|key| !key.is_empty())
        .map(<[u8]>::to_vec)
}

/// The stream preaccess phase handler.
pub unsafe extern "C" fn preaccess_handler(s: *mut ngx_stream_session_t) -> ngx_int_t {
    // SAFETY: nginx calls phase handlers with the live session.
    let s = unsafe { &mut *s };
    let (Some(main), Some(srv)) = (main_conf(s), srv_conf(s)) else {
        return Status::NGX_DECLINED.into();
    };
    if srv.limits().is_empty() {
        return Status::NGX_DECLINED.into();
    }
    let Some(index) = main.status_variable else {
        return Status::NGX_DECLINED.into();
    };
    let state = SessionState::of(s, index);
    if state.is_set() {
        // Resumed after its delay.
        return Status::NGX_DECLINED.into();
    }
    let now = now_ns();
    if let Some(rc) = take_slots(s, main, srv, state, now) {
        return rc;
    }
    let mut applied: SmallVec<[AppliedLimit; 2]> = SmallVec::new();
    for limit in srv.limits() {
        let Some(zone) = stream_zone(limit) else {
            continue;
        };
        if zone.conf.algorithm.counts_in_flight() {
            continue;
        }
        let Some(found) = find_key(s, main, zone, now) else {
            continue;
        };
        if let Some(own) = Applied::new(found, limit, now) {
            applied.push(AppliedLimit::new(own, None));
        }
    }
    if applied.is_empty() {
        if !state.is_set() {
            state.set(SessionStatus::Passed);
        }
        return Status::NGX_DECLINED.into();
    }
    let verdict = decide::decide(&mut applied, now, Charge::Now);
    finish(s, main, srv, state, &applied, &verdict, now)
}

/// The session's concurrency lines: a slot of each, held in a cleanup of the session's pool
/// (given back however the session ends). `Some` with the answer when a line refuses it.
/// A stream session over the limit is closed at once: it does not wait in a queue.
fn take_slots(
    s: &mut ngx_stream_session_t,
    main: &MainConf,
    srv: &SrvConf,
    state: SessionState,
    now: u64,
) -> Option<ngx_int_t> {
    let dry_run = srv.dry_run();
    for limit in srv.limits() {
        let Some(zone) = stream_zone(limit) else {
            continue;
        };
        if !zone.conf.algorithm.counts_in_flight() {
            continue;
        }
        let Some(found) = find_key(s, main, zone, now) else {
            continue;
        };
        let line = Line {
            zone_conf: &zone.conf,
            zone: *found.zone,
            slot: found.slot,
            hash: found.hash(),
            cost: limit.cost,
            queue: Some(0),
        };
        // SAFETY: a live session's connection has its pool, freed when the session ends.
        let pool = unsafe { (*s.connection).pool };
        // No queue (`queue: Some(0)`): nothing ever waits, so no owner is ever told.
        match slots::arrive(pool, &line, now, dry_run, Owner::Lua) {
            Arrival::Admitted { .. } => found.zone.count(Counter::Passed),
            Arrival::Unlimited | Arrival::Queued { .. } => {}
            Arrival::Rejected(refusal) | Arrival::DryRun { refusal, .. } => {
                let dry = if dry_run { ", dry run" } else { "" };
                ngx_log_error!(
                    srv.log_level(),
                    session_log(s),
                    "limiting connections{dry}, in flight: {} of {} by zone \"{}\"",
                    refusal.in_flight,
                    refusal.limit,
                    zone.conf.name
                );
                if let Some(key) = key_bytes(s, main, &zone.conf) {
                    found.zone.record_top(TopKind::Rejected, now, &key);
                }
                if dry_run {
                    found.zone.count(Counter::RejectedDryRun);
                    state.set(SessionStatus::RejectedDryRun);
                    continue;
                }
                found.zone.count(Counter::Rejected);
                state.set(SessionStatus::Rejected);
                // The slots taken at earlier lines come back when the session's pool is freed,
                // right after.
                return Some(NGX_STREAM_SERVICE_UNAVAILABLE as ngx_int_t);
            }
        }
    }
    None
}

/// Act on the verdict of the rate lines: log, account, `$rate_limit_status`, then close,
/// delay or go on.
fn finish(
    s: &mut ngx_stream_session_t,
    main: &MainConf,
    srv: &SrvConf,
    state: SessionState,
    applied: &[AppliedLimit],
    verdict: &Verdict,
    now: u64,
) -> ngx_int_t {
    let dry_run = srv.dry_run();
    let dry = if dry_run { ", dry run" } else { "" };
    let decision = verdict.decision;
    let log = session_log(s);
    let status = |state: SessionState, real: SessionStatus, dry: SessionStatus| {
        state.set(if dry_run { dry } else { real });
        if dry_run {
            Status::NGX_DECLINED.into()
        } else {
            NGX_STREAM_SERVICE_UNAVAILABLE as ngx_int_t
        }
    };

    if let (Outcome::Rejected, true) = (verdict.outcome, verdict.blocked) {
        decide::account(applied, verdict, dry_run, now, |zone_conf| {
            key_bytes(s, main, zone_conf)
        });
        return status(state, SessionStatus::Blocked, SessionStatus::BlockedDryRun);
    }
    if let (Outcome::Rejected, Some(index)) = (verdict.outcome, verdict.by) {
        let zone_conf = applied[index].own.zone_conf;
        ngx_log_error!(
            srv.log_level(),
            log,
            "limiting connections{dry}, excess: {} by zone \"{}\"",
            format_excess(decision.excess_milli),
            zone_conf.name
        );
        let started = decide::account(applied, verdict, dry_run, now, |zone_conf| {
            key_bytes(s, main, zone_conf)
        });
        if let Some(started) = started {
            let zone_conf = applied[started.by].own.zone_conf;
            let block_max = zone_conf.block.map_or(0, |policy| policy.block_max_ns);
            ngx_log_error!(
                srv.log_level(),
                log,
                "blocking the key{dry} for {}, level {} (block_max {}), by zone \"{}\"",
                duration_text(started.block.duration_ns()),
                started.block.level,
                duration_text(block_max),
                zone_conf.name
            );
        }
        return status(
            state,
            SessionStatus::Rejected,
            SessionStatus::RejectedDryRun,
        );
    }
    decide::account(applied, verdict, dry_run, now, |zone_conf| {
        key_bytes(s, main, zone_conf)
    });
    let (Outcome::Delayed, Some(index)) = (verdict.outcome, verdict.by) else {
        if !state.is_set() {
            state.set(SessionStatus::Passed);
        }
        return Status::NGX_DECLINED.into();
    };
    ngx_log_error!(
        srv.delay_log_level(),
        log,
        "delaying connection{dry}, excess: {}, by zone \"{}\"",
        format_excess(decision.excess_milli),
        applied[index].own.zone_conf.name
    );
    if dry_run {
        state.set(SessionStatus::DelayedDryRun);
        return Status::NGX_DECLINED.into();
    }
    state.set(SessionStatus::Delayed);
    start_delay(s, decision.delay_ns)
}

/// Hold the session on a timer of its connection's read event: when it fires, the phases
/// run again (the handler then declines, the outcome being set). Data the client sends
/// meanwhile waits in the socket (TCP); a datagram of a UDP session that arrives meanwhile
/// is dropped, as nginx drops what no handler reads.
fn start_delay(s: &mut ngx_stream_session_t, delay_ns: u64) -> ngx_int_t {
    // SAFETY: the session's connection and its read event are live while the session is.
    unsafe {
        let read = (*s.connection).read;
        (*read).handler = Some(delay_expired);
        let delay_ms = delay_ns.div_ceil(1_000_000).max(1);
        nginx_sys::ngx_add_timer(read, delay_ms as ngx::ffi::ngx_msec_t);
    }
    Status::NGX_AGAIN.into()
}

/// The read handler while delayed.
unsafe extern "C" fn delay_expired(event: *mut ngx_event_t) {
    // SAFETY: nginx calls event handlers with the live event, whose data is the session's
    // connection, whose data is the session.
    let (event, s) = unsafe {
        let event = &mut *event;
        let connection = event.data.cast::<ngx::ffi::ngx_connection_t>();
        (event, (*connection).data.cast::<ngx_stream_session_t>())
    };
    if event.timedout() == 0 {
        // The client sent something (or closed) before the delay ended: read after it.
        return;
    }
    event.set_timedout(0);
    // SAFETY: the session is live while its connection is.
    let Some(main) = main_conf(unsafe { &*s }) else {
        return;
    };
    // SAFETY: the session is live; running its phases goes on where the delay stopped them.
    unsafe { (main.api.run_phases)(s) };
}

/// limit_req's "excess: 1.500": whole requests and thousandths.
fn format_excess(excess_milli: u64) -> String {
    format!("{}.{:03}", excess_milli / 1000, excess_milli % 1000)
}
