//! The module's context of a request: what the request path keeps with a request until it
//! ends (the request body's facts, the usage lines to settle, the progress through the
//! concurrency lines), one [`RequestCtx`] per main request.
//!
//! It lives in the request's pool, dropped by one cleanup of that pool however the request
//! ends, and is found through the module's slot of the main request's `ctx` array. An
//! internal redirect (`error_page`, a named location, `try_files`' last word) zeroes that
//! array; the next lookup then finds the context by its cleanup and puts it back in the slot.
//!
//! Each accessor lends one part for a borrow of the request, so that two parts (the usage
//! state and the body it was reserved by) can be held at once without either aliasing the
//! other.

use core::ffi::c_void;
use core::mem;
use core::ptr;

use ngx::ffi::{ngx_http_request_t, ngx_pool_cleanup_add};
use ngx::http::HttpModule;

use super::body::Body;
use super::concurrency::Ctx;
use super::usage::UsageState;
use crate::conf::RateLimitModule;

/// What the request path keeps with a main request.
#[derive(Default)]
pub struct RequestCtx {
    body: Option<Body>,
    usage: Option<UsageState>,
    concurrency: Option<Ctx>,
}

// The pool's cleanup memory is aligned to NGX_ALIGNMENT (an unsigned long).
const _: () = assert!(mem::align_of::<RequestCtx>() <= mem::align_of::<usize>());

/// The handler of the cleanup that drops a request's context, read from here both when it is
/// set and when it is looked for, so that the two compare equal.
static DROP_CTX: unsafe extern "C" fn(*mut c_void) = drop_ctx;

unsafe extern "C" fn drop_ctx(data: *mut c_void) {
    crate::glue::guard::entry(
        "handler::request_ctx::drop_ctx",
        || (),
        || {
            if !data.is_null() {
                // SAFETY: `data` is the context `add` wrote, dropped only here, as the pool
                // (which frees its memory) is destroyed.
                unsafe { ptr::drop_in_place(data.cast::<RequestCtx>()) };
            }
        },
    )
}

/// The module's slot in the `ctx` array of the main request of `r`.
fn slot(r: &ngx_http_request_t) -> *mut *mut c_void {
    // SAFETY: a live request's main request is live; its `ctx` has one pointer per HTTP
    // module, ours at our ctx_index.
    unsafe { (*r.main).ctx.add(RateLimitModule::module().ctx_index) }
}

/// The context of the main request of `r`, or null when it has none.
fn find(r: &ngx_http_request_t) -> *mut RequestCtx {
    let slot = slot(r);
    // SAFETY: `slot` is the live request's own element of its ctx array.
    let ctx = unsafe { *slot };
    if !ctx.is_null() {
        return ctx.cast();
    }
    // Zeroed by an internal redirect, or never set.
    let kept = crate::glue::main_request_cleanup(r, DROP_CTX);
    if !kept.is_null() {
        // SAFETY: as above.
        unsafe { *slot = kept };
    }
    kept.cast()
}

/// The context of the main request of `r`, added if it has none; null when the pool has no
/// memory for it.
fn find_or_add(r: &mut ngx_http_request_t) -> *mut RequestCtx {
    let ctx = find(r);
    if !ctx.is_null() {
        return ctx;
    }
    // SAFETY: the main request's pool lives as long as the request.
    let cleanup = unsafe { ngx_pool_cleanup_add((*r.main).pool, mem::size_of::<RequestCtx>()) };
    // SAFETY: a non-null cleanup is a fresh element of the pool's list, with its data.
    let Some(cleanup) = (unsafe { cleanup.as_mut() }) else {
        return ptr::null_mut();
    };
    let ctx = cleanup.data.cast::<RequestCtx>();
    // SAFETY: fresh pool memory of RequestCtx's size, aligned for it (checked above).
    unsafe { ctx.write(RequestCtx::default()) };
    cleanup.handler = Some(DROP_CTX);
    // SAFETY: the live request's own element of its ctx array.
    unsafe { *slot(r) = ctx.cast() };
    ctx
}

/// What the request body said, once it was read.
pub fn body(r: &ngx_http_request_t) -> Option<&Body> {
    let ctx = find(r);
    // SAFETY: a found context lives until the pool is destroyed, after the request's last
    // handler; the body is written once, by `keep_body`, before it is first lent.
    unsafe { ctx.as_ref()?.body.as_ref() }
}

/// Keep what the request body said; `false` when there is no memory for it.
pub fn keep_body(r: &mut ngx_http_request_t, body: Body) -> bool {
    let ctx = find_or_add(r);
    if ctx.is_null() {
        return false;
    }
    // SAFETY: a live context; only this field is written, and no part of it is lent now.
    unsafe { *ptr::addr_of_mut!((*ctx).body) = Some(body) };
    true
}

/// Keep the usage lines the request must settle; `false` when there is no memory for them.
pub fn keep_usage(r: &mut ngx_http_request_t, state: UsageState) -> bool {
    let ctx = find_or_add(r);
    if ctx.is_null() {
        return false;
    }
    // SAFETY: as in `keep_body`: the usage state is kept once, before it is first lent.
    unsafe { *ptr::addr_of_mut!((*ctx).usage) = Some(state) };
    true
}

/// Run `f` with the request and its usage state, if it has one.
pub fn with_usage<T>(
    r: &mut ngx_http_request_t,
    f: impl FnOnce(&mut ngx_http_request_t, &mut UsageState) -> T,
) -> Option<T> {
    let ctx = find(r);
    if ctx.is_null() {
        return None;
    }
    // SAFETY: a live context; the one mutable borrow of its usage field, for `f`'s call
    // (nginx runs one request's handlers one at a time, and none of `f`'s callees lends the
    // usage state again). The field is apart from the request itself and from the body.
    let state = unsafe { (*ptr::addr_of_mut!((*ctx).usage)).as_mut() }?;
    Some(f(r, state))
}

/// Start the request's progress through its concurrency lines afresh; `false` when there
/// is no memory for it.
pub fn new_concurrency(r: &mut ngx_http_request_t) -> bool {
    let ctx = find_or_add(r);
    if ctx.is_null() {
        return false;
    }
    // SAFETY: a live context; its concurrency field is not lent while a location's lines
    // start.
    unsafe { *ptr::addr_of_mut!((*ctx).concurrency) = Some(Ctx::default()) };
    true
}

/// Run `f` with the request and its progress through its concurrency lines, if it has one.
/// Only the slot is read: a request that took a line's permits or a place in a queue went
/// through no internal redirect since (a redirect ends that location's lines).
pub fn with_concurrency<T>(
    r: &mut ngx_http_request_t,
    f: impl FnOnce(&mut ngx_http_request_t, &mut Ctx) -> T,
) -> Option<T> {
    // SAFETY: the live request's own element of its ctx array: null or a context.
    let ctx = unsafe { *slot(r) }.cast::<RequestCtx>();
    if ctx.is_null() {
        return None;
    }
    // SAFETY: as in `with_usage`, for the concurrency field.
    let progress = unsafe { (*ptr::addr_of_mut!((*ctx).concurrency)).as_mut() }?;
    Some(f(r, progress))
}
