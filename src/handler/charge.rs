//! `on_status=CODES`: a request is charged at the door like any other, and given back after
//! the response (log phase) unless its final status matches.
//!
//! Charging at the door bounds what concurrent requests can do to the limit itself: no more
//! requests of a key can be in flight than its limit lets through, whatever their statuses
//! turn out to be. Sequential requests whose status does not match cost nothing, since each
//! is given back before the next one comes.
//!
//! What must be given back is kept in a cleanup of the request's pool (it survives internal
//! redirects, which clear module contexts, and is freed with the request); the log-phase
//! handler finds it there by its handler.

use core::ffi::c_void;
use core::ptr;

use ngx::core::Status;
use ngx::ffi::{ngx_http_request_t, ngx_int_t, ngx_pool_cleanup_add};
use ratelimit_core::penalty::StatusMatcher;

use crate::control::decide::{Applied, AppliedLimit, Charged};
use crate::glue::now_ns;

/// The handler of the cleanup that keeps a request's charges, read from here both when it is
/// set and when it is looked for, so that the two compare equal.
static DROP_PENDING: unsafe extern "C" fn(*mut c_void) = drop_pending;

/// The charges of one request, each with the statuses that keep it.
struct Pending {
    charges: Vec<(StatusMatcher, Charged)>,
}

/// Keep `applied`'s charge until the response, when its status is not one of `on_status`.
pub fn give_back_one_unless_status(
    r: &mut ngx_http_request_t,
    on_status: StatusMatcher,
    applied: &Applied,
) {
    keep(r, vec![(on_status, applied.charged())]);
}

/// Keep the charges of the limits with `on_status=` among `applied` (a request they let
/// through) until the response.
pub fn give_back_unless_status(r: &mut ngx_http_request_t, applied: &[AppliedLimit]) {
    let mut charges = Vec::new();
    for limit in applied {
        let Some(on_status) = limit.on_status else {
            continue;
        };
        // Each zone of the line that charged the request (with `global=`, a bucket that was
        // empty was not charged).
        for zone in limit.zones() {
            if zone.decision.outcome != ratelimit_core::Outcome::Rejected {
                charges.push((on_status, zone.charged()));
            }
        }
    }
    if !charges.is_empty() {
        keep(r, charges);
    }
}

fn keep(r: &mut ngx_http_request_t, charges: Vec<(StatusMatcher, Charged)>) {
    // SAFETY: the request's pool lives as long as the request.
    let cleanup = unsafe { ngx_pool_cleanup_add(r.pool, 0) };
    // SAFETY: a non-null cleanup is a fresh element of the pool's list.
    let Some(cleanup) = (unsafe { cleanup.as_mut() }) else {
        // No memory: the request stays charged, which errs on the strict side.
        return;
    };
    cleanup.handler = Some(DROP_PENDING);
    cleanup.data = Box::into_raw(Box::new(Pending { charges })).cast::<c_void>();
}

/// Frees what [`keep`] left, with the request's pool (also when no log phase ran).
unsafe extern "C" fn drop_pending(data: *mut c_void) {
    crate::glue::guard::entry(
        "handler::charge::drop_pending",
        || (),
        || {
            if !data.is_null() {
                // SAFETY: `data` is the box `keep` leaked for this cleanup, dropped only here.
                drop(unsafe { Box::from_raw(data.cast::<Pending>()) });
            }
        },
    )
}

/// The log-phase handler: give back every charge whose statuses the response's status is not
/// one of.
pub unsafe extern "C" fn log_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    crate::glue::guard::entry(
        "handler::charge::log_handler",
        || ngx_int_t::from(ngx::core::Status::NGX_ERROR),
        || {
            // SAFETY: nginx calls phase handlers with the live request.
            let r = unsafe { &mut *r };
            // Subrequests share the main request's pool; only the main request's status counts.
            if !ptr::eq(r.main, r) {
                return Status::NGX_OK.into();
            }
            // SAFETY: the pool of a live request; its cleanups form a null-terminated list.
            let mut cleanup = unsafe { (*r.pool).cleanup };
            // SAFETY: each element of the list is live until the pool is destroyed.
            while let Some(element) = unsafe { cleanup.as_mut() } {
                let ours = element
                    .handler
                    .is_some_and(|handler| ptr::fn_addr_eq(handler, DROP_PENDING));
                if ours && !element.data.is_null() {
                    // SAFETY: `data` is the box `keep` leaked; it is taken here, once.
                    let pending = unsafe { Box::from_raw(element.data.cast::<Pending>()) };
                    element.data = ptr::null_mut();
                    let status = final_status(r);
                    let now = now_ns();
                    for (on_status, charged) in &pending.charges {
                        if !on_status.matches(status) {
                            charged.give_back(now);
                        }
                    }
                }
                cleanup = element.next;
            }
            Status::NGX_OK.into()
        },
    )
}

/// The response's status as `$status` shows it.
fn final_status(r: &ngx_http_request_t) -> u16 {
    let status = if r.err_status != 0 {
        r.err_status
    } else {
        r.headers_out.status
    };
    u16::try_from(status).unwrap_or(0)
}
