//! The request body of a location whose usage-based lines need it (`reserve=auto`, a built-in
//! reader): read before the location's lines are decided, as nginx reads it for proxying (in
//! memory up to `client_body_buffer_size`, the rest in a temporary file), then read for what
//! it says ([`RequestFacts`]) when it is at most [`BODY_READ_MAX`] bytes. An OpenAI Chat
//! Completions stream that does not ask for its usage is forwarded asking for it (the body
//! replaced, its length with it); the usage chunk is then taken out of the response by the
//! usage filter. Also `$rate_limit_llm_model`.
//!
//! The preaccess handler starts reading and returns `NGX_DONE`; once the body is read, the
//! phases run again from the same handler, which finds the facts kept in a cleanup of the
//! request's pool and goes on.

use core::ffi::c_void;
use core::ptr;

use ngx::core::Status;
use ngx::ffi::{
    ngx_alloc_chain_link, ngx_create_temp_buf, ngx_http_core_run_phases, ngx_http_finalize_request,
    ngx_http_read_client_request_body, ngx_http_request_t, ngx_http_variable_value_t, ngx_int_t,
    ngx_pnalloc, ngx_pool_cleanup_add, ngx_str_t,
};
use ngx::http::HttpModuleLocationConf;
use ratelimit_core::usage::request::{with_usage_asked, RequestFacts, Unreadable, BODY_READ_MAX};
use ratelimit_core::usage::{OnUnreadable, Provider};

use crate::conf::{LocConf, RateLimitModule, UsageSourceConf};
use crate::glue::value_bits;

/// The handler of the cleanup that keeps a request's [`Body`], read from here both when it
/// is set and when it is looked for, so that the two compare equal.
static DROP_BODY: unsafe extern "C" fn(*mut c_void) = drop_body;

/// What the request body said, kept until the request ends.
pub struct Body {
    pub facts: RequestFacts,
    /// The body forwarded asks for the usage the client's did not: the usage chunk is not
    /// the client's to see.
    pub usage_asked_for_client: bool,
    /// Why the body cannot be read for sure, when it cannot: the lines' `on_unreadable=`
    /// refuse it, or charge it at least its reservation.
    pub unreadable: Option<Unreadable>,
}

/// Whether the location has a line reading OpenAI's responses (whose streams report usage
/// only when asked).
fn reads_openai(lcf: &LocConf) -> bool {
    lcf.limits().iter().any(|limit| {
        limit
            .usage
            .is_some_and(|usage| usage.source == UsageSourceConf::Reader(Provider::OpenAi))
    })
}

/// `None` when the body was read (the lines can be decided); otherwise the phase handler's
/// answer while it is being read.
pub fn wait_for_body(r: &mut ngx_http_request_t) -> Option<ngx_int_t> {
    if body_of(r).is_some() {
        return None;
    }
    // SAFETY: `r` is the live main request; `body_read` runs the phases again.
    let rc = unsafe { ngx_http_read_client_request_body(r, Some(body_read)) };
    if rc >= nginx_sys::NGX_HTTP_SPECIAL_RESPONSE as ngx_int_t {
        return Some(rc);
    }
    // SAFETY: ends the reference reading the body took; the request lives on in it.
    unsafe { ngx_http_finalize_request(r, Status::NGX_DONE.into()) };
    Some(Status::NGX_DONE.into())
}

/// The body is read (possibly at once, from inside [`wait_for_body`]): keep what it says and
/// run the phases again from the preaccess handler.
unsafe extern "C" fn body_read(r: *mut ngx_http_request_t) {
    crate::glue::guard::entry(
        "handler::body::body_read",
        || crate::glue::guard::fail_request(r),
        || {
            // SAFETY: nginx calls the post handler with the live request whose body was read.
            let request = unsafe { &mut *r };
            let body = read(request);
            if !keep(request, body) {
                // SAFETY: the live request; this ends the reference reading the body took.
                unsafe {
                    ngx_http_finalize_request(
                        r,
                        nginx_sys::NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t,
                    )
                };
                return;
            }
            request.write_event_handler = Some(ngx_http_core_run_phases);
            // SAFETY: the live request, at the phase that started reading.
            unsafe { ngx_http_core_run_phases(r) };
        },
    )
}

/// A `Content-Encoding` of the request other than `identity`.
fn content_coding(r: &ngx_http_request_t) -> Option<String> {
    // SAFETY: `headers_in.headers` is the live request's list of parsed headers.
    let mut headers = unsafe { ngx::http::list_iterator(&r.headers_in.headers) };
    headers.find_map(|(key, value)| {
        let coding = String::from_utf8_lossy(value.as_bytes())
            .trim()
            .to_ascii_lowercase();
        let encoded = key.as_bytes().eq_ignore_ascii_case(b"content-encoding")
            && !coding.is_empty()
            && coding != "identity";
        encoded.then_some(coding)
    })
}

/// What the body says, the body replaced when it must ask for usage.
fn read(r: &mut ngx_http_request_t) -> Body {
    // What an unreadable body reserves: as one that says nothing, of its length.
    let unreadable = |why| Body {
        facts: RequestFacts {
            bytes: crate::glue::body::request_body_len(r),
            ..RequestFacts::default()
        },
        usage_asked_for_client: false,
        unreadable: Some(why),
    };
    if let Some(coding) = content_coding(r) {
        return unreadable(Unreadable::Encoded(coding));
    }
    let Some(bytes) = crate::glue::body::request_body(r, BODY_READ_MAX) else {
        // Too large to read (or its temporary file unreadable): forwarded as it is only
        // when the lines estimate it.
        return unreadable(Unreadable::TooLarge);
    };
    let facts = match RequestFacts::check(&bytes) {
        Ok(facts) => facts,
        Err(why) => return unreadable(why),
    };
    let ask =
        facts.needs_usage_asked() && RateLimitModule::location_conf(r).is_some_and(reads_openai);
    let usage_asked_for_client = ask
        && with_usage_asked(&bytes).is_some_and(|rewritten| replace_body(r, &rewritten).is_some());
    Body {
        facts,
        usage_asked_for_client,
        unreadable: None,
    }
}

/// The answer to a request whose body cannot be read for sure, in a location where a line
/// refuses such bodies (`on_unreadable=refuse`, the default): 400, 413 or 415 with a JSON
/// body naming the cause, in OpenAI's error shape, logged at info. `None`: the request goes
/// on (a readable body, or lines that all estimate).
pub fn refused(r: &mut ngx_http_request_t, lcf: &LocConf) -> Option<ngx_int_t> {
    let why = body_of(r)?.unreadable.as_ref()?;
    let refuses = lcf.limits().iter().any(|limit| {
        limit
            .usage
            .is_some_and(|usage| usage.on_unreadable == OnUnreadable::Refuse)
    });
    if !refuses {
        return None;
    }
    let message = format!("rate_limit: {}", why.message());
    ngx::ngx_log_error!(
        nginx_sys::NGX_LOG_INFO,
        crate::glue::connection_log(r),
        "{message}, refused with {}",
        why.status()
    );
    let body = serde_json::json!({
        "error": {"message": message, "type": "invalid_request_error", "code": "unreadable_body"}
    })
    .to_string();
    Some(crate::glue::response::answer_now(
        r,
        why.status() as ngx_int_t,
        b"application/json",
        body.as_bytes(),
    ))
}

/// Forward `bytes` as the request body: one buffer in memory, in place of what was read
/// (in memory or in a temporary file), and the length to match.
fn replace_body(r: &mut ngx_http_request_t, bytes: &[u8]) -> Option<()> {
    // SAFETY: the body was read: `request_body` is live (or null when there was none).
    let request_body = unsafe { r.request_body.as_mut() }?;
    // SAFETY: the request's pool is live; the buffer and link live as long as it.
    let (buf, link) = unsafe {
        (
            ngx_create_temp_buf(r.pool, bytes.len()).as_mut()?,
            ngx_alloc_chain_link(r.pool).as_mut()?,
        )
    };
    // SAFETY: the buffer has room for `bytes.len()` bytes from `pos`.
    unsafe {
        ptr::copy_nonoverlapping(bytes.as_ptr(), buf.pos, bytes.len());
        buf.last = buf.pos.add(bytes.len());
    }
    buf.set_last_buf(1);
    buf.set_last_in_chain(1);
    link.buf = buf;
    link.next = ptr::null_mut();
    let length = set_content_length(r, bytes.len())?;
    r.headers_in.content_length_n = length;
    request_body.bufs = link;
    Some(())
}

/// The `Content-Length` header the client sent (if any) made `len`; the new length.
fn set_content_length(r: &mut ngx_http_request_t, len: usize) -> Option<i64> {
    // SAFETY: a set `content_length` is a live element of the request's headers.
    if let Some(header) = unsafe { r.headers_in.content_length.as_mut() } {
        let mut digits = itoa::Buffer::new();
        let text = digits.format(len).as_bytes();
        // SAFETY: the request's pool is live; the copy stays within the allocation.
        let data = unsafe { ngx_pnalloc(r.pool, text.len()).cast::<u8>() };
        if data.is_null() {
            return None;
        }
        // SAFETY: as above.
        unsafe { ptr::copy_nonoverlapping(text.as_ptr(), data, text.len()) };
        header.value = ngx_str_t {
            len: text.len(),
            data,
        };
    }
    i64::try_from(len).ok()
}

/// Keep `body` with the request; `false` when there is no memory for it.
fn keep(r: &mut ngx_http_request_t, body: Body) -> bool {
    // SAFETY: the request's pool lives as long as the request.
    let cleanup = unsafe { ngx_pool_cleanup_add(r.pool, 0) };
    // SAFETY: a non-null cleanup is a fresh element of the pool's list.
    let Some(cleanup) = (unsafe { cleanup.as_mut() }) else {
        return false;
    };
    cleanup.handler = Some(DROP_BODY);
    cleanup.data = Box::into_raw(Box::new(body)).cast::<c_void>();
    true
}

/// Frees what [`keep`] left, with the request's pool.
unsafe extern "C" fn drop_body(data: *mut c_void) {
    crate::glue::guard::entry(
        "handler::body::drop_body",
        || (),
        || {
            if !data.is_null() {
                // SAFETY: `data` is the box `keep` leaked for this cleanup, dropped only here.
                drop(unsafe { Box::from_raw(data.cast::<Body>()) });
            }
        },
    )
}

/// What the body of the main request of `r` said, once it was read.
pub fn body_of(r: &ngx_http_request_t) -> Option<&'static Body> {
    let data = crate::glue::main_request_cleanup(r, DROP_BODY);
    // SAFETY: the data of a DROP_BODY cleanup is the box `keep` leaked, alive until the
    // pool's cleanup.
    unsafe { data.cast::<Body>().as_ref() }
}

/// `$rate_limit_llm_model`: the request body's `model` (a string), empty when it names none
/// or was not read (a location without a line that reads it).
pub(super) unsafe extern "C" fn model_variable(
    r: *mut ngx_http_request_t,
    v: *mut ngx_http_variable_value_t,
    _data: usize,
) -> ngx_int_t {
    crate::glue::guard::entry(
        "handler::body::model_variable",
        || crate::glue::guard::not_found(v),
        || {
            // SAFETY: nginx calls variable handlers with the live request and its value to fill.
            let r = unsafe { &*r };
            let model = body_of(r)
                .and_then(|body| body.facts.model.as_deref())
                .unwrap_or_default();
            let len = u32::try_from(model.len())
                .unwrap_or(value_bits::LEN)
                .min(value_bits::LEN);
            // SAFETY: `v` is the value to fill; the model lives in the request's cleanup, freed
            // with its pool, after every use of the value.
            unsafe { (*v).data = model.as_ptr().cast_mut() };
            value_bits::write(v, len | value_bits::VALID | value_bits::NO_CACHEABLE);
            Status::NGX_OK.into()
        },
    )
}
