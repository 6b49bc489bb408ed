//! Delays: a request held on a timer, as limit_req holds it.

use core::ptr;

use ngx::core::Status;
use ngx::ffi::{
    ngx_handle_read_event, ngx_handle_write_event, ngx_http_block_reading,
    ngx_http_core_run_phases, ngx_http_finalize_request, ngx_http_request_t, ngx_http_test_reading,
    ngx_int_t, ngx_posted_events,
};

/// Hold the request on a timer: the worker keeps serving others, and a client that goes
/// away meanwhile is noticed by `ngx_http_test_reading`.
pub fn start_delay(r: &mut ngx_http_request_t, delay_ns: u64) -> ngx_int_t {
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

/// The write handler while delayed: when the timer fires, resume the phases (the preaccess
/// handler then declines, the request's outcome being set).
unsafe extern "C" fn delay_expired(r: *mut ngx_http_request_t) {
    crate::glue::guard::entry(
        "handler::delay::delay_expired",
        || crate::glue::guard::fail_request(r),
        || {
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
                    ngx_http_finalize_request(
                        r,
                        nginx_sys::NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t,
                    );
                    return;
                }
                r.read_event_handler = Some(ngx_http_block_reading);
                r.write_event_handler = Some(ngx_http_core_run_phases);
                ngx_http_core_run_phases(r);
            }
        },
    )
}
