//! A stream session's path: the preaccess handler that charges a new connection (TCP) or a
//! new session (UDP) to its zones, closes it over the limit, delays it to the rate, and holds
//! concurrency permits until the session's pool is freed; and `$rate_limit_status`.

use core::ptr;

use nginx_sys::{
    ngx_stream_get_variable_pt, ngx_stream_session_t, NGX_STREAM_SERVICE_UNAVAILABLE,
    NGX_STREAM_VAR_NOCACHEABLE,
};
use ngx::core::Status;
use ngx::ffi::{ngx_event_t, ngx_int_t, ngx_log_t, ngx_str_t, ngx_uint_t, ngx_variable_value_t};
use ngx::ngx_log_error;
use ratelimit_core::top::TopKind;
use smallvec::SmallVec;

use super::conf::{MainConf, SrvConf};
use crate::conf::{ConfError, LimitConf, ZoneConf};
use crate::control::concurrency::{self, Arrival, Line};
use crate::control::decide::{self, Applied, AppliedLimit, Charge, Found, Verdict};
use crate::control::outcome::{self, Action, Door, LimitStatus, StatusValue as SessionState};
use crate::control::queue::Owner;
use crate::glue::variables::{register, Variable};
use crate::glue::{fill_remote_net, now_ns, value_bits};
use crate::store::Counter;

/// Where a session's outcome is kept: `$rate_limit_status`'s own value in `s->variables`
/// (set: the session was decided already, and is resuming after its delay).
fn session_state(s: &ngx_stream_session_t, index: ngx_uint_t) -> SessionState {
    // SAFETY: `s->variables` has one entry per indexed stream variable of this
    // configuration, and `index` was obtained from ngx_stream_get_variable_index; the session
    // outlives its handlers' use of the value.
    unsafe { SessionState::new(s.variables.add(index)) }
}

/// The stream door's variables, recomputed at each read (the outcome is stored once the
/// session is decided; the prefix lengths are the server's).
static VARIABLES: [Variable<ngx_stream_get_variable_pt>; 2] = [
    Variable {
        name: "rate_limit_status",
        get: Some(status_variable),
        data: 0,
        flags: NGX_STREAM_VAR_NOCACHEABLE as ngx_uint_t,
    },
    Variable {
        name: "rate_limit_remote_net",
        get: Some(remote_net_variable),
        data: 0,
        flags: NGX_STREAM_VAR_NOCACHEABLE as ngx_uint_t,
    },
];

/// Register the stream `$rate_limit_status` and `$rate_limit_remote_net`.
pub fn add_variables(cf: &mut ngx::ffi::ngx_conf_t, main: &MainConf) -> Result<(), ConfError> {
    // SAFETY: `cf` is the live configuration being read; ngx_stream_add_variable returns null
    // (having logged why) or the live definition of the name.
    unsafe {
        register(&VARIABLES, |name, flags| {
            (main.api.add_variable)(cf, name, flags)
        })
    }
    .ok_or(ConfError::Logged)
}

/// `$rate_limit_remote_net`: the client's network, masked to the server's
/// `rate_limit_remote_net` prefix lengths.
unsafe extern "C" fn remote_net_variable(
    s: *mut ngx_stream_session_t,
    v: *mut ngx_variable_value_t,
    _data: usize,
) -> ngx_int_t {
    crate::glue::guard::entry(
        "stream::remote_net_variable",
        || crate::glue::guard::not_found(v),
        || {
            // SAFETY: nginx calls variable handlers with the live session and its value to fill.
            let s = unsafe { &*s };
            let prefixes = srv_conf(s)
                .and_then(|srv| srv.remote_net)
                .unwrap_or_default();
            // SAFETY: `v` is the value to fill; the session's connection, its address and its
            // pool are live, and the pool outlives the value.
            unsafe {
                let connection = &*s.connection;
                fill_remote_net(v, connection.pool, connection.sockaddr, prefixes)
            }
        },
    )
}

/// Called only while no outcome is stored in the session's variables: no limit applied.
unsafe extern "C" fn status_variable(
    _s: *mut ngx_stream_session_t,
    v: *mut ngx_variable_value_t,
    _data: usize,
) -> ngx_int_t {
    crate::glue::guard::entry(
        "stream::status_variable",
        || crate::glue::guard::not_found(v),
        || {
            value_bits::write(v, value_bits::NOT_FOUND);
            Status::NGX_OK.into()
        },
    )
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
fn stream_zone(limit: &LimitConf) -> Option<&'static ZoneConf> {
    // SAFETY: the line's shm_zone was returned by ngx_shared_memory_add for this cycle; its
    // data, when set, is the zone's ZoneConf in the cycle's configuration pool.
    let zone_conf = unsafe { (*limit.shm_zone).data.cast::<ZoneConf>().as_ref()? };
    zone_conf.key.is_stream().then_some(zone_conf)
}

/// The session's key in a stream zone (empty when its variables are not found; `None` for a
/// zone of the http block).
fn evaluate_key<'s>(
    s: &'s mut ngx_stream_session_t,
    main: &MainConf,
    zone_conf: &ZoneConf,
) -> Option<&'s [u8]> {
    let zone_key = zone_conf.key.stream()?;
    if let Some(index) = zone_key.variable {
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
    let key_cv = ptr::addr_of!(zone_key.value).cast_mut();
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

/// The zone's entry for the session's key; `None` when the key is empty or too long, or the
/// zone is not set up.
fn find_key(
    s: &mut ngx_stream_session_t,
    main: &MainConf,
    zone: &'static ZoneConf,
    now_ns: u64,
) -> Option<Found<'static>> {
    let shared = zone.zone.as_ref()?;
    let log = session_log(s);
    let key = evaluate_key(s, main, zone)?;
    crate::control::key::entry(zone, shared, key, now_ns, log)
}

/// The key copied, for the top keys and the penalty box (only delayed, rejected and blocked
/// sessions ask).
#[cold]
fn key_bytes(
    s: &mut ngx_stream_session_t,
    main: &MainConf,
    zone_conf: &ZoneConf,
) -> Option<Vec<u8>> {
    outcome::owned_key(evaluate_key(s, main, zone_conf))
}

/// Where a session's lines are decided: most in the preaccess phase, as the connection
/// arrives; those whose zone key uses a variable `ssl_preread` sets (`$ssl_preread_server_name`)
/// after the preread phase, once ssl_preread has read the ClientHello ([`content_handler`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Preaccess,
    AfterPreread,
}

/// What the door does with a session once its lines of one phase are decided.
enum Act {
    /// Go on to the next handler.
    Continue,
    /// End the session with this stream status.
    Close(ngx_int_t),
    /// Wait this long, then go on.
    Delay(u64),
}

/// The stream preaccess phase handler.
pub unsafe extern "C" fn preaccess_handler(s: *mut ngx_stream_session_t) -> ngx_int_t {
    crate::glue::guard::entry(
        "stream::preaccess_handler",
        || nginx_sys::NGX_STREAM_INTERNAL_SERVER_ERROR as ngx_int_t,
        || {
            // SAFETY: nginx calls phase handlers with the live session.
            let s = unsafe { &mut *s };
            let Some((main, srv, state)) = session_conf(s) else {
                return Status::NGX_DECLINED.into();
            };
            if state.is_set() {
                // Resumed after its delay.
                return Status::NGX_DECLINED.into();
            }
            match decide_phase(s, main, srv, state, Phase::Preaccess) {
                Act::Continue => Status::NGX_DECLINED.into(),
                Act::Close(rc) => rc,
                Act::Delay(delay_ns) => start_delay(s, main, delay_ns, delay_expired),
            }
        },
    )
}

/// The content handler of a server with lines decided after the preread phase (their zone
/// key uses a variable ssl_preread sets): in place of the server's own (proxy_pass, return),
/// which it calls once those lines let the session go on. A preread handler could not be
/// sure to run: ssl_preread, once it found a server name, skips the phase's other handlers.
pub unsafe extern "C" fn content_handler(s: *mut ngx_stream_session_t) {
    crate::glue::guard::entry(
        "stream::content_handler",
        || fail_session(s),
        || {
            // SAFETY: nginx calls the content handler with the live session.
            let session = unsafe { &mut *s };
            let Some(content) = srv_conf(session).and_then(|srv| srv.content) else {
                if let Some(main) = main_conf(session) {
                    // SAFETY: the live session.
                    unsafe { (main.api.finalize_session)(s, INTERNAL_ERROR) };
                }
                return;
            };
            let Some((main, srv, state)) = session_conf(session) else {
                // SAFETY: the server's own handler, with the live session.
                return unsafe { content(s) };
            };
            match decide_phase(session, main, srv, state, Phase::AfterPreread) {
                // SAFETY: as above.
                Act::Continue => unsafe { content(s) },
                // SAFETY: the live session.
                Act::Close(rc) => unsafe { (main.api.finalize_session)(s, rc as ngx_uint_t) },
                Act::Delay(delay_ns) => {
                    start_delay(session, main, delay_ns, content_delay_expired);
                }
            }
        },
    )
}

/// The session's configuration and outcome record; `None` when no line applies to it.
fn session_conf(
    s: &ngx_stream_session_t,
) -> Option<(&'static MainConf, &'static SrvConf, SessionState)> {
    let (main, srv) = (main_conf(s)?, srv_conf(s)?);
    if srv.limits().is_empty() {
        return None;
    }
    let state = session_state(s, main.status_variable?);
    Some((main, srv, state))
}

/// Whether a line is decided after ssl_preread (its zone is keyed by an `$ssl_preread_*`
/// variable).
pub fn decided_after_preread(limit: &LimitConf) -> bool {
    stream_zone(limit)
        .and_then(|zone| zone.key.stream())
        .is_some_and(|key| key.after_preread)
}

/// The stream zone of a line, when the line is decided in `phase`.
fn zone_in_phase(limit: &LimitConf, phase: Phase) -> Option<&'static ZoneConf> {
    let zone = stream_zone(limit)?;
    let after_preread = zone.key.stream()?.after_preread;
    (after_preread == (phase == Phase::AfterPreread)).then_some(zone)
}

/// Decide the session's lines of `phase`: concurrency lines first, then the rate lines
/// together (a session refused by one is charged to none of them).
fn decide_phase(
    s: &mut ngx_stream_session_t,
    main: &MainConf,
    srv: &SrvConf,
    state: SessionState,
    phase: Phase,
) -> Act {
    let now = now_ns();
    let held = match take_permits(s, main, srv, state, phase, now) {
        Ok(held) => held,
        Err(rc) => return Act::Close(rc),
    };
    let mut applied: SmallVec<[AppliedLimit; 2]> = SmallVec::new();
    for limit in srv.limits() {
        let Some(zone) = zone_in_phase(limit, phase) else {
            continue;
        };
        if zone.algorithm.counts_in_flight() {
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
        // No line applied (every key empty): `$rate_limit_status` stays not found.
        if held && !state.is_set() {
            state.set(LimitStatus::Passed);
        }
        return Act::Continue;
    }
    let verdict = decide::decide(&mut applied, now, Charge::Now);
    finish(s, main, srv, state, &mut applied, &verdict, now)
}

/// The session's concurrency lines: their permits, held in a cleanup of the session's pool
/// (given back however the session ends). `Ok(whether a line applied)`, `Err` with the
/// answer when a line refuses it. A stream session over the limit is closed at once: it does
/// not wait in a queue.
fn take_permits(
    s: &mut ngx_stream_session_t,
    main: &MainConf,
    srv: &SrvConf,
    state: SessionState,
    phase: Phase,
    now: u64,
) -> Result<bool, ngx_int_t> {
    let dry_run = srv.dry_run();
    let mut applied = false;
    for limit in srv.limits() {
        let Some(zone) = zone_in_phase(limit, phase) else {
            continue;
        };
        if !zone.algorithm.counts_in_flight() {
            continue;
        }
        let Some(found) = find_key(s, main, zone, now) else {
            continue;
        };
        applied = true;
        let line = Line {
            zone_conf: zone,
            zone: *found.zone,
            slot: found.slot,
            hash: found.hash(),
            cost: limit.cost,
            queue: Some(0),
        };
        // SAFETY: a live session's connection has its pool, freed when the session ends.
        let pool = unsafe { (*s.connection).pool };
        // No queue (`queue: Some(0)`): nothing ever waits, so no owner is ever told.
        match concurrency::arrive(pool, &line, now, dry_run, Owner::Session) {
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
                    zone.name
                );
                if let Some(key) = key_bytes(s, main, zone) {
                    found.zone.record_top(TopKind::Rejected, now, &key);
                }
                if dry_run {
                    found.zone.count(Counter::RejectedDryRun);
                    state.set(LimitStatus::RejectedDryRun);
                    continue;
                }
                found.zone.count(Counter::Rejected);
                state.set(LimitStatus::Rejected);
                // The permits taken at earlier lines come back when the session's pool is freed,
                // right after.
                return Err(NGX_STREAM_SERVICE_UNAVAILABLE as ngx_int_t);
            }
        }
    }
    Ok(applied)
}

/// Act on the verdict of the rate lines: settled once for every door (`control::outcome`:
/// log lines, counters, top keys, a block), then `$rate_limit_status`, and close, delay or go
/// on.
fn finish(
    s: &mut ngx_stream_session_t,
    main: &MainConf,
    srv: &SrvConf,
    state: SessionState,
    applied: &mut [AppliedLimit],
    verdict: &Verdict,
    now: u64,
) -> Act {
    let door = Door {
        noun: "connection",
        log: session_log(s),
        level: srv.log_level(),
        delay_level: srv.delay_log_level(),
        dry_run: srv.dry_run(),
        shows_standing: false,
    };
    let settled = outcome::settle(&door, applied, verdict, now, |zone_conf| {
        key_bytes(s, main, zone_conf)
    });
    // A session that passed keeps what a concurrency line's dry run said of it.
    if settled.status != LimitStatus::Passed || !state.is_set() {
        state.set(settled.status);
    }
    match settled.action {
        Action::Proceed => Act::Continue,
        Action::Delay(delay_ns) => Act::Delay(delay_ns),
        Action::Refuse(_) => Act::Close(NGX_STREAM_SERVICE_UNAVAILABLE as ngx_int_t),
    }
}

/// Hold the session on a timer of its connection's read event: when it fires, the phases
/// run again (the handler then declines, the outcome being set). Data the client sends
/// meanwhile waits in the socket (TCP); a datagram of a UDP session that arrives meanwhile
/// is dropped, as nginx drops what no handler reads. A TCP client that closes or resets its
/// connection meanwhile ends the session at once ([`delay_expired`]), as limit_req ends a
/// delayed request whose client has gone.
fn start_delay(
    s: &mut ngx_stream_session_t,
    main: &MainConf,
    delay_ns: u64,
    expired: unsafe extern "C" fn(*mut ngx_event_t),
) -> ngx_int_t {
    // SAFETY: the session's connection and its read event are live while the session is.
    unsafe {
        let connection = &mut *s.connection;
        let read = connection.read;
        (*read).handler = Some(expired);
        let delay_ms = delay_ns.div_ceil(1_000_000).max(1);
        nginx_sys::ngx_add_timer(read, delay_ms as ngx::ffi::ngx_msec_t);
        // Watch the client's socket during the delay (with epoll nginx has not added it yet
        // at this phase): its close or reset wakes the handler. Only where events are edge
        // triggered: a level-triggered method would wake it again and again for data that
        // waits to be proxied.
        if watches_client(connection)
            && nginx_sys::ngx_handle_read_event(read, 0) != ngx_int_t::from(Status::NGX_OK)
        {
            (main.api.finalize_session)(s, INTERNAL_ERROR);
            return Status::NGX_DONE.into();
        }
    }
    Status::NGX_AGAIN.into()
}

const INTERNAL_ERROR: ngx_uint_t = nginx_sys::NGX_STREAM_INTERNAL_SERVER_ERROR as ngx_uint_t;

/// A session whose handler panicked: closed, `$status` 500.
fn fail_session(s: *mut ngx_stream_session_t) {
    // SAFETY: the live session nginx called the handler with.
    if let Some(main) = unsafe { s.as_ref() }.and_then(main_conf) {
        // SAFETY: as above.
        unsafe { (main.api.finalize_session)(s, INTERNAL_ERROR) };
    }
}

/// The session of a connection event whose handler panicked: closed, `$status` 500.
fn fail_event_session(event: *mut ngx_event_t) {
    // SAFETY: the live event of a session's connection, as nginx called the handler with.
    let s = unsafe {
        let Some(event) = event.as_ref() else {
            return;
        };
        (*event.data.cast::<ngx::ffi::ngx_connection_t>())
            .data
            .cast::<ngx_stream_session_t>()
    };
    fail_session(s);
}

/// Whether a delay watches the client's socket for its close: a TCP connection, under an
/// edge-triggered event method (epoll, kqueue).
fn watches_client(connection: &ngx::ffi::ngx_connection_t) -> bool {
    // SAFETY: ngx_event_flags is set once the event module is initialized, before any session.
    let flags = unsafe { nginx_sys::ngx_event_flags };
    connection.type_ == libc::SOCK_STREAM && flags & nginx_sys::NGX_USE_LEVEL_EVENT as usize == 0
}

/// The read handler while delayed in the preaccess phase: at the timer, the phases go on.
unsafe extern "C" fn delay_expired(event: *mut ngx_event_t) {
    crate::glue::guard::entry(
        "stream::delay_expired",
        || fail_event_session(event),
        || {
            // SAFETY: nginx calls event handlers with the live event.
            unsafe { delay_event(event, |s, main| (main.api.run_phases)(s)) }
        },
    )
}

/// The read handler while delayed before the content handler: at the timer, the server's own
/// content handler runs.
unsafe extern "C" fn content_delay_expired(event: *mut ngx_event_t) {
    crate::glue::guard::entry(
        "stream::content_delay_expired",
        || fail_event_session(event),
        || {
            // SAFETY: nginx calls event handlers with the live event.
            unsafe {
                delay_event(event, |s, main| {
                    match srv_conf(&*s).and_then(|srv| srv.content) {
                        Some(content) => content(s),
                        None => (main.api.finalize_session)(s, INTERNAL_ERROR),
                    }
                })
            }
        },
    )
}

/// A delayed session's read event: at the timer, `resume`; before it, the client sent data
/// (which waits) or closed its connection (the session ends).
///
/// # Safety
/// `event` is the live read event of a stream session's connection; `resume` is called with
/// the live session.
unsafe fn delay_event(
    event: *mut ngx_event_t,
    resume: impl FnOnce(*mut ngx_stream_session_t, &MainConf),
) {
    // SAFETY: the caller's contract: the event's data is the session's connection, whose
    // data is the session.
    let (event, connection, s) = unsafe {
        let event = &mut *event;
        let connection = &mut *event.data.cast::<ngx::ffi::ngx_connection_t>();
        let s = connection.data.cast::<ngx_stream_session_t>();
        (event, connection, s)
    };
    // SAFETY: the session is live while its connection is.
    let Some(main) = main_conf(unsafe { &*s }) else {
        return;
    };
    if event.timedout() == 0 {
        if watches_client(connection) && client_gone(connection) {
            // SAFETY: the live session; finalizing closes its connection (and its timer).
            unsafe { (main.api.finalize_session)(s, nginx_sys::NGX_STREAM_OK as ngx_uint_t) };
        }
        return;
    }
    event.set_timedout(0);
    resume(s, main);
}

/// Whether the client closed or reset the connection: a peek at its socket (the data it sent,
/// if any, stays there for the upstream), as nginx's `ngx_http_test_reading` does.
fn client_gone(connection: &mut ngx::ffi::ngx_connection_t) -> bool {
    // epoll told of the client's FIN (EPOLLRDHUP): gone, even with data still to read (a
    // ClientHello ssl_preread peeked at), as nginx's own test of a delayed request has it.
    // SAFETY: the connection's read event is live.
    if unsafe { (*connection.read).pending_eof() } != 0 {
        ngx_log_error!(
            ngx::ffi::NGX_LOG_INFO,
            connection.log,
            "client prematurely closed connection while delayed"
        );
        return true;
    }
    let mut byte = 0u8;
    // SAFETY: a live TCP socket and a one-byte buffer.
    let n = unsafe {
        libc::recv(
            connection.fd,
            ptr::addr_of_mut!(byte).cast(),
            1,
            libc::MSG_PEEK,
        )
    };
    if n > 0 {
        return false;
    }
    let error = std::io::Error::last_os_error();
    let code = error.raw_os_error().unwrap_or(0);
    if n < 0 && (code == libc::EAGAIN || code == libc::EINTR) {
        // SAFETY: the connection's read event is live.
        unsafe { (*connection.read).set_ready(0) };
        return false;
    }
    let log = connection.log;
    if n == 0 {
        ngx_log_error!(
            ngx::ffi::NGX_LOG_INFO,
            log,
            "client prematurely closed connection while delayed"
        );
    } else {
        ngx_log_error!(
            ngx::ffi::NGX_LOG_INFO,
            log,
            "client connection failed while delayed: {error}"
        );
    }
    true
}
