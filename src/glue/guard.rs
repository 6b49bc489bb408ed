//! One panic policy for every `extern "C"` entry of the module: nginx calls it, a panic must
//! not unwind into C (Rust aborts the process there, and nginx's master then starts a new
//! worker, dropping every connection of the old one). [`entry`] runs the entry's work; a panic
//! is caught, logged in one `alert` line naming the entry, where it panicked and its message,
//! and the entry answers what its caller takes for a failure (a request's 500, a closed
//! session, `NGX_ERROR`, a failed directive).
//!
//! A test provokes one through `RATE_LIMIT_PANIC_AT`, an environment variable of the master,
//! read when a configuration is read: the handler it names (`handler::preaccess_handler`,
//! `stream::preaccess_handler`) is installed as one that panics in its guard, in place of the
//! real one, so that the request path pays nothing for the test. Only who starts nginx can set
//! it; no client can.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, Once};

use ngx::ffi::{ngx_int_t, NGX_LOG_ALERT};
use ngx::ngx_log_error;

/// The last panic of nginx's own thread (where and why), for its entry's log line. Written by
/// the hook, read by [`entry`] only after a panic: nothing on the way of an entry that does
/// not panic.
static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);

/// The entry `RATE_LIMIT_PANIC_AT` names, read with the configuration.
static PANIC_AT: Mutex<String> = Mutex::new(String::new());

/// Install the panic hook (once per process) and read `RATE_LIMIT_PANIC_AT`; called when a
/// configuration is read.
pub fn configure() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // Threads of ours have names (the sync loop's): they keep the default report.
            // nginx's own thread, which Rust did not start, has none.
            if std::thread::current().name().is_some() {
                return previous(info);
            }
            *LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()) = Some(info.to_string());
        }));
    });
    let at = std::env::var("RATE_LIMIT_PANIC_AT").unwrap_or_default();
    *PANIC_AT.lock().unwrap_or_else(|e| e.into_inner()) = at;
}

/// Run `work`, the body of the `extern "C"` entry `name`; after a panic, log it and answer
/// `failed()`.
#[inline]
pub fn entry<T>(name: &str, failed: impl FnOnce() -> T, work: impl FnOnce() -> T) -> T {
    let result = catch_unwind(AssertUnwindSafe(work));
    match result {
        Ok(value) => value,
        Err(_) => {
            logged(name);
            failed()
        }
    }
}

#[cold]
fn logged(name: &str) {
    let report = LAST_PANIC
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
        .unwrap_or_default();
    // SAFETY: `ngx_cycle` is the current cycle, whose log lives as long as it.
    let log = unsafe { nginx_sys::ngx_cycle.as_ref() }.map_or(core::ptr::null_mut(), |c| c.log);
    ngx_log_error!(
        NGX_LOG_ALERT,
        log,
        "rate_limit: {name} panicked ({}): it failed instead of ending the worker",
        report.replace('\n', " ")
    );
}

/// The phase handler to install as the entry `name` (http's or stream's, `S` its request or
/// session): `handler`, or [`panicking`] when `RATE_LIMIT_PANIC_AT` names it.
pub fn phase_handler<S>(name: &str, handler: PhaseHandler<S>) -> PhaseHandler<S> {
    if *PANIC_AT.lock().unwrap_or_else(|e| e.into_inner()) == name {
        panicking::<S>
    } else {
        handler
    }
}

/// A phase handler, as nginx calls it with a request (http) or a session (stream).
pub type PhaseHandler<S> = unsafe extern "C" fn(*mut S) -> ngx_int_t;

// A panicking handler answers both phases' internal error with one number.
const _: () = assert!(
    nginx_sys::NGX_HTTP_INTERNAL_SERVER_ERROR == nginx_sys::NGX_STREAM_INTERNAL_SERVER_ERROR
);

/// The phase handler installed in place of the one `RATE_LIMIT_PANIC_AT` names (t/panic.rs):
/// it panics inside its guard, which answers 500 (a request's, or a session closed with it).
unsafe extern "C" fn panicking<S>(_: *mut S) -> ngx_int_t {
    let name = PANIC_AT.lock().unwrap_or_else(|e| e.into_inner()).clone();
    entry(
        &name,
        || nginx_sys::NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t,
        || provoke(&name),
    )
}

#[cold]
fn provoke(name: &str) -> ! {
    panic!("RATE_LIMIT_PANIC_AT={name}");
}

/// A request whose event handler panicked: finished with a 500.
pub fn fail_request(r: *mut ngx::ffi::ngx_http_request_t) {
    if r.is_null() {
        return;
    }
    // SAFETY: the live request nginx called the handler with.
    unsafe {
        ngx::ffi::ngx_http_finalize_request(
            r,
            nginx_sys::NGX_HTTP_INTERNAL_SERVER_ERROR as ngx::ffi::ngx_int_t,
        )
    };
}

/// A variable whose handler panicked: not found (`-` in a log).
pub fn not_found(v: *mut ngx::ffi::ngx_variable_value_t) -> ngx::ffi::ngx_int_t {
    if !v.is_null() {
        super::value_bits::write(v, super::value_bits::NOT_FOUND);
    }
    ngx::core::Status::NGX_OK.into()
}
