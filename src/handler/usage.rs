//! Usage-based lines (`usage=`) on the request path: the reservation at the door, the body
//! reader (a header filter and a body filter that pass every buffer on at once), the
//! settlement in the log phase, and the `$rate_limit_usage_*` variables.
//!
//! What a request must settle is kept in a cleanup of the request's pool (it survives
//! internal redirects, which clear module contexts, and is freed with the request), found
//! there by its handler. The module's context slot is the concurrency lines'.
//!
//! How each end of a request is charged is `ratelimit_core::usage::settle::charged_tokens`:
//! the body's last buffer passed (complete) or not (cut: the client went away, the upstream
//! timed out or closed mid-body), with the usage found or none.

use core::ffi::c_void;
use core::ptr;
use core::sync::atomic::AtomicU64;

use ngx::core::Status;
use ngx::ffi::{
    ngx_alloc_chain_link, ngx_buf_t, ngx_chain_t, ngx_create_temp_buf,
    ngx_http_output_body_filter_pt, ngx_http_output_header_filter_pt, ngx_http_request_t,
    ngx_http_top_body_filter, ngx_http_top_header_filter, ngx_http_variable_value_t, ngx_int_t,
    ngx_pcalloc, ngx_pool_cleanup_add, ngx_uint_t, NGX_LOG_WARN,
};
use ngx::http::HttpModuleMainConf;
use ngx::ngx_log_error;
use ratelimit_core::top::TopKind;
use ratelimit_core::usage::reader::{Format, Reader, Reported};
use ratelimit_core::usage::request::UsageChunkFilter;
use ratelimit_core::usage::settle::{self, End, Report, Settlement};
use ratelimit_core::usage::{
    parse_tokens, Malformed, OnMissing, Provider, Raw, Usage, Weights, AUTO_DEFAULT_CEILING,
    MAX_COUNT,
};
use ratelimit_core::Outcome;

use crate::conf::{AmountConf, LimitConf, RateLimitModule, UsageConf, UsageSourceConf};
use crate::control::decide::{Applied, AppliedLimit, Charged, Verdict};
use crate::glue::response::{add_header, answer_now};
use crate::glue::{connection_log, now_ns, value_bits};
use crate::store::counters::once_a_second;
use crate::store::Counter;

const NGX_ERROR: ngx_int_t = -1;

// The next filters of each chain, set once in postconfiguration (in the master, before any
// request) and only read afterwards.
static mut NEXT_HEADER_FILTER: ngx_http_output_header_filter_pt = None;
static mut NEXT_BODY_FILTER: ngx_http_output_body_filter_pt = None;

/// The handler of the cleanup that keeps a request's usage state, read from here both when
/// it is set and when it is looked for, so that the two compare equal.
static DROP_STATE: unsafe extern "C" fn(*mut c_void) = drop_state;

/// One usage-based line a request was charged by.
struct Line {
    charged: Charged,
    usage: UsageConf,
    /// The reservation charged at the door.
    reserved: u64,
    /// The key's text, when the zone keeps top keys: its tokens are ranked there.
    key: Option<Vec<u8>>,
    /// The zone's name, for the log line of a malformed usage.
    zone_name: String,
}

/// What a request with usage-based lines keeps until it ends.
struct UsageState {
    lines: Vec<Line>,
    /// The provider whose body the reader reads (the lines with `usage=$var` read none).
    provider: Option<Provider>,
    /// Some line has `prices=`, or `$rate_limit_usage_model` is logged: the reader looks for
    /// the model the body names.
    priced: bool,
    /// Set by the header filter when there is a body to read.
    reader: Option<Reader>,
    /// The body's last buffer passed.
    ended: bool,
    /// The body could not be read (compressed, or in a file): its usage is unknown.
    unreadable: bool,
    settled: bool,
    /// The request was forwarded asking for the usage its client did not ask for: set until
    /// the response's header, then the filter taking the usage chunk out of an event stream.
    strip: Strip,
    /// The request body's prompt estimate (0 when it was not read), for `on_missing=estimate`.
    prompt_estimate: u64,
}

/// Whether the usage chunk is taken out of the response.
enum Strip {
    No,
    /// The client did not ask for usage; the response is not known yet.
    Asked,
    Streaming(UsageChunkFilter),
}

/// The cost of `limit` for this request, before the zone's limits: `usage=`'s reservation
/// or `cost=$var`'s value (a value that is not a number costs the line's `cost`, 1).
pub fn request_cost(r: &mut ngx_http_request_t, limit: &LimitConf) -> u64 {
    if let Some(usage) = &limit.usage {
        return match usage.reserve {
            AmountConf::Fixed(tokens) => tokens,
            AmountConf::Variable(index) => number(r, index).unwrap_or(1).max(1),
            AmountConf::Auto(default) => super::body::body_of(r)
                .map_or(default, |body| body.facts.reservation(default))
                .max(1),
        };
    }
    match limit.cost_variable {
        Some(index) => number(r, index)
            .filter(|&cost| cost >= 1)
            .unwrap_or(limit.cost),
        None => limit.cost,
    }
}

/// Set the cost of `applied` for this request. A reservation larger than the bucket is
/// reserved as the whole bucket (it could never pass otherwise; the settlement charges the
/// rest); a `cost=$var` larger than it never passes, as `cost=N` would not.
pub fn set_cost(r: &mut ngx_http_request_t, limit: &LimitConf, applied: &mut Applied) {
    let cost = request_cost(r, limit);
    applied.policy.cost = if limit.usage.is_some() {
        cost.clamp(1, applied.policy.max_cost().max(1))
    } else {
        cost
    };
}

/// What a usage-based line found of the request's usage.
#[derive(Clone, Copy)]
enum Found {
    /// The cost of the usage reported.
    Usage(u64),
    Missing,
    /// A figure that is not an integer from 0 to 2^53, a document that cannot be read.
    Malformed(Malformed),
}

/// `usage=$var`'s value: missing when not found or empty, malformed when not a count.
fn variable_usage(r: &mut ngx_http_request_t, index: ngx_uint_t) -> Found {
    // SAFETY: `r` is the live request and `index` a variable index of this configuration.
    let value = unsafe { ngx::ffi::ngx_http_get_flushed_variable(r, index) };
    // SAFETY: a non-null result is a live variable value of the request, in its pool.
    let Some(text) = (unsafe { value_bits::found(value) }).filter(|text| !text.is_empty()) else {
        return Found::Missing;
    };
    match parse_tokens(text).filter(|&tokens| tokens <= MAX_COUNT) {
        Some(tokens) => Found::Usage(tokens),
        None => Found::Malformed(Malformed::Figure(Raw::of(text))),
    }
}

/// A variable's value as a number of tokens.
fn number(r: &mut ngx_http_request_t, index: ngx_uint_t) -> Option<u64> {
    // SAFETY: `r` is the live request and `index` a variable index of this configuration.
    let value = unsafe { ngx::ffi::ngx_http_get_flushed_variable(r, index) };
    // SAFETY: a non-null result is a live variable value of the request, in its pool.
    parse_tokens(unsafe { value_bits::found(value) }?)
}

/// Keep what the usage-based lines among `applied` (a request they let through; `lines`
/// are their configurations, in the same order) charged, to settle after the response.
pub fn keep(r: &mut ngx_http_request_t, applied: &[AppliedLimit], lines: &[&LimitConf]) {
    let mut kept = Vec::new();
    for (limit, conf) in applied.iter().zip(lines) {
        let Some(usage) = conf.usage else {
            continue;
        };
        if limit.own.decision.outcome == Outcome::Rejected {
            continue;
        }
        let charged = limit.own.charged();
        charged
            .zone()
            .count_by(Counter::TokensReserved, limit.own.policy.cost);
        let key = if charged.zone().keeps_top() {
            super::key::evaluate_key(r, limit.own.zone_conf).map(<[u8]>::to_vec)
        } else {
            None
        };
        kept.push(Line {
            charged,
            usage,
            reserved: limit.own.policy.cost,
            key,
            zone_name: limit.own.zone_conf.name.clone(),
        });
    }
    if kept.is_empty() {
        return;
    }
    let provider = kept.iter().find_map(|line| match line.usage.source {
        UsageSourceConf::Reader(provider) => Some(provider),
        UsageSourceConf::Variable(_) => None,
    });
    // SAFETY: the request's pool lives as long as the request.
    let cleanup = unsafe { ngx_pool_cleanup_add(r.pool, 0) };
    // SAFETY: a non-null cleanup is a fresh element of the pool's list.
    let Some(cleanup) = (unsafe { cleanup.as_mut() }) else {
        // No memory: the reservations stand, which errs on the strict side.
        return;
    };
    let model_logged = RateLimitModule::main_conf(r).is_some_and(|mcf| mcf.usage_model_used);
    let priced = model_logged || kept.iter().any(|line| line.usage.prices.is_some());
    let body = super::body::body_of(r);
    let state = UsageState {
        lines: kept,
        provider,
        priced,
        reader: None,
        ended: false,
        unreadable: false,
        settled: false,
        strip: if body.is_some_and(|body| body.usage_asked_for_client) {
            Strip::Asked
        } else {
            Strip::No
        },
        prompt_estimate: body.map_or(0, |body| body.facts.prompt_estimate()),
    };
    cleanup.handler = Some(DROP_STATE);
    cleanup.data = Box::into_raw(Box::new(state)).cast::<c_void>();
}

/// Frees what [`keep`] left, with the request's pool. A request that never reached the log
/// phase keeps its reservations (a cut response with no usage found).
unsafe extern "C" fn drop_state(data: *mut c_void) {
    crate::glue::guard::entry(
        "handler::usage::drop_state",
        || (),
        || {
            if !data.is_null() {
                // SAFETY: `data` is the box `keep` leaked for this cleanup, dropped only here.
                drop(unsafe { Box::from_raw(data.cast::<UsageState>()) });
            }
        },
    )
}

/// The usage state of the main request of `r`, if it has one.
fn state_of(r: &ngx_http_request_t) -> Option<&'static mut UsageState> {
    let data = crate::glue::main_request_cleanup(r, DROP_STATE);
    // SAFETY: the data of a DROP_STATE cleanup is the box `keep` leaked, alive until the
    // pool's cleanup; nginx runs one request's handlers one at a time.
    unsafe { data.cast::<UsageState>().as_mut() }
}

/// Put the reader's two filters on top of nginx's header and body filter chains.
pub fn install_filters() {
    // SAFETY: postconfiguration runs single-threaded in the master, before any request;
    // the chain heads are nginx's globals, meant to be replaced this way by filter modules.
    unsafe {
        NEXT_HEADER_FILTER = ngx_http_top_header_filter;
        ngx_http_top_header_filter = Some(header_filter);
        NEXT_BODY_FILTER = ngx_http_top_body_filter;
        ngx_http_top_body_filter = Some(body_filter);
    }
}

/// The response's header: a reader for its body, unless the body is compressed.
unsafe extern "C" fn header_filter(r: *mut ngx_http_request_t) -> ngx_int_t {
    crate::glue::guard::entry(
        "handler::usage::header_filter",
        || ngx_int_t::from(ngx::core::Status::NGX_ERROR),
        || {
            // SAFETY: nginx passes the live request whose header is being sent.
            if let Some(request) = unsafe { r.as_mut() } {
                if ptr::eq(request.main, r) {
                    if let Some(state) = state_of(request) {
                        start_reading(request, state);
                    }
                }
            }
            // SAFETY: read once the filter was installed; the next filter is nginx's, called as
            // every header filter calls the next one.
            match unsafe { NEXT_HEADER_FILTER } {
                Some(next) => unsafe { next(r) },
                None => NGX_ERROR,
            }
        },
    )
}

fn start_reading(r: &mut ngx_http_request_t, state: &mut UsageState) {
    let strip = core::mem::replace(&mut state.strip, Strip::No);
    let Some(provider) = state.provider else {
        return;
    };
    let out = &r.headers_out;
    // SAFETY: a set Content-Encoding header is a live element of headers_out.headers.
    if let Some(encoding) = unsafe { out.content_encoding.as_ref() } {
        if encoding.hash != 0 && !encoding.value.as_bytes().eq_ignore_ascii_case(b"identity") {
            state.unreadable = true;
            return;
        }
    }
    let format = Format::of_content_type(out.content_type.as_bytes());
    let mut reader = Reader::new(provider, format);
    if state.priced {
        reader.read_model();
    }
    let estimating = state
        .lines
        .iter()
        .any(|line| line.usage.on_missing == OnMissing::Estimate);
    state.reader = Some(if estimating {
        reader.estimating()
    } else {
        reader
    });
    if matches!(strip, Strip::Asked) && format == Format::EventStream {
        // What passes is shorter by the usage chunk: its length is no longer known.
        r.headers_out.content_length_n = -1;
        // SAFETY: a set Content-Length header is a live element of headers_out.headers.
        if let Some(length) = unsafe { r.headers_out.content_length.as_mut() } {
            length.hash = 0;
        }
        r.headers_out.content_length = ptr::null_mut();
        state.strip = Strip::Streaming(UsageChunkFilter::default());
    }
}

/// Every buffer of the body, read as it passes and passed on at once, unchanged.
unsafe extern "C" fn body_filter(r: *mut ngx_http_request_t, chain: *mut ngx_chain_t) -> ngx_int_t {
    crate::glue::guard::entry(
        "handler::usage::body_filter",
        || ngx_int_t::from(ngx::core::Status::NGX_ERROR),
        || {
            // SAFETY: read once the filter was installed.
            let Some(next) = (unsafe { NEXT_BODY_FILTER }) else {
                return NGX_ERROR;
            };
            let mut chain = chain;
            // SAFETY: nginx passes the live request whose body is being sent.
            if let Some(request) = unsafe { r.as_mut() } {
                if ptr::eq(request.main, r) {
                    if let Some(state) = state_of(request) {
                        read_chain(state, chain);
                        if let Strip::Streaming(filter) = &mut state.strip {
                            match strip_chain(request, filter, chain) {
                                Some(stripped) => chain = stripped,
                                None => return NGX_ERROR,
                            }
                        }
                    }
                }
            }
            // SAFETY: passing the chain on (unchanged, or without the usage chunk), as every
            // body filter does.
            unsafe { next(r, chain) }
        },
    )
}

fn read_chain(state: &mut UsageState, chain: *mut ngx_chain_t) {
    let mut link = chain;
    // SAFETY: `chain` is a well-formed list of links with valid buffers.
    while let Some(current) = unsafe { link.as_ref() } {
        // SAFETY: as above.
        if let Some(buf) = unsafe { current.buf.as_ref() } {
            let in_memory = buf.temporary() != 0 || buf.memory() != 0 || buf.mmap() != 0;
            if in_memory && !buf.pos.is_null() && buf.last > buf.pos {
                if let (Some(reader), false) = (state.reader.as_mut(), state.unreadable) {
                    // SAFETY: a buffer in memory holds the bytes from `pos` to `last`.
                    let bytes = unsafe {
                        core::slice::from_raw_parts(buf.pos, buf.last.offset_from(buf.pos) as usize)
                    };
                    reader.feed(bytes);
                }
            } else if buf.in_file() != 0 && buf.file_last > buf.file_pos {
                // Bytes nginx wrote to a temporary file pass without being read here.
                state.unreadable = true;
            }
            if buf.last_buf() != 0 {
                state.ended = true;
                if let Some(reader) = state.reader.as_mut() {
                    reader.finish();
                }
            }
        }
        link = current.next;
    }
}

/// `chain` without OpenAI's usage chunk: its bytes in memory go through `filter` into one new
/// buffer (the ones read are marked sent), with the flags of the ones they came in. A part
/// of the body in a file passes as it is, after what the filter held, with the rest of its
/// chain (nothing in the module reads files of a response). `None` when there is no memory.
fn strip_chain(
    r: &mut ngx_http_request_t,
    filter: &mut UsageChunkFilter,
    chain: *mut ngx_chain_t,
) -> Option<*mut ngx_chain_t> {
    let mut out = Vec::new();
    let (mut last_buf, mut last_in_chain, mut flush) = (false, false, false);
    let mut link = chain;
    // SAFETY: `chain` is a well-formed list of links with valid buffers.
    while let Some(current) = unsafe { link.as_ref() } {
        // SAFETY: as above.
        let Some(buf) = (unsafe { current.buf.as_mut() }) else {
            link = current.next;
            continue;
        };
        if buf.in_file() != 0 {
            // What was held goes first, then the rest as it is.
            filter.finish(&mut out);
            return prepend(r, &out, link);
        }
        let in_memory = buf.temporary() != 0 || buf.memory() != 0 || buf.mmap() != 0;
        if in_memory && !buf.pos.is_null() && buf.last > buf.pos {
            // SAFETY: a buffer in memory holds the bytes from `pos` to `last`.
            let bytes = unsafe {
                core::slice::from_raw_parts(buf.pos, buf.last.offset_from(buf.pos) as usize)
            };
            filter.feed(bytes, &mut out);
            buf.pos = buf.last;
        }
        last_buf |= buf.last_buf() != 0;
        last_in_chain |= buf.last_in_chain() != 0;
        flush |= buf.flush() != 0;
        link = current.next;
    }
    if last_buf {
        filter.finish(&mut out);
    }
    if out.is_empty() && !last_buf && !last_in_chain && !flush {
        return Some(ptr::null_mut());
    }
    let stripped = prepend(r, &out, ptr::null_mut())?;
    // SAFETY: `prepend` returned a fresh link with its buffer.
    let buf = unsafe { &mut *(*stripped).buf };
    buf.set_last_buf(u32::from(last_buf));
    buf.set_last_in_chain(u32::from(last_in_chain));
    buf.set_flush(u32::from(flush || !last_buf));
    Some(stripped)
}

/// A new link holding `bytes` (an empty special buffer when there are none) before `rest`.
fn prepend(
    r: &mut ngx_http_request_t,
    bytes: &[u8],
    rest: *mut ngx_chain_t,
) -> Option<*mut ngx_chain_t> {
    // SAFETY: the request's pool is live; what it allocates lives as long as the request.
    let (buf, link) = unsafe {
        let buf = if bytes.is_empty() {
            ngx_pcalloc(r.pool, core::mem::size_of::<ngx_buf_t>()).cast::<ngx_buf_t>()
        } else {
            ngx_create_temp_buf(r.pool, bytes.len())
        };
        (buf.as_mut()?, ngx_alloc_chain_link(r.pool).as_mut()?)
    };
    if !bytes.is_empty() {
        // SAFETY: the buffer has room for `bytes.len()` bytes from `pos`.
        unsafe {
            ptr::copy_nonoverlapping(bytes.as_ptr(), buf.pos, bytes.len());
            buf.last = buf.pos.add(bytes.len());
        }
    } else if rest.is_null() {
        buf.set_flush(1);
    } else {
        return Some(rest);
    }
    link.buf = buf;
    link.next = rest;
    Some(link)
}

impl UsageState {
    fn usage(&self) -> Option<Usage> {
        if self.unreadable {
            return None;
        }
        self.reader.as_ref()?.usage()
    }

    /// `on_missing=estimate`'s figure: the streamed text's tokens plus the prompt's estimate;
    /// `None` when no text was streamed (an error, a body that is not a stream).
    fn estimate(&self) -> Option<u64> {
        let output = self.reader.as_ref()?.estimate()?;
        Some(output.saturating_add(self.prompt_estimate))
    }

    /// The tokens `line` owes as the request ends now, and what usage it found
    /// (`settle::owed`). A priced line whose table has no price for the model (or that no
    /// model names) charges the table's highest prices.
    fn owed(&self, r: &mut ngx_http_request_t, line: &Line) -> Owed {
        let mut unpriced = None;
        let found = match line.usage.source {
            UsageSourceConf::Reader(_) => match self.reader.as_ref().map(Reader::reported) {
                _ if self.unreadable => Found::Missing,
                Some(Reported::Usage(usage)) => {
                    Found::Usage(self.cost(r, line, &usage, &mut unpriced))
                }
                Some(Reported::Malformed(malformed)) => Found::Malformed(malformed),
                Some(Reported::Nothing) | None => Found::Missing,
            },
            UsageSourceConf::Variable(index) => variable_usage(r, index),
        };
        // A body that could not be read for sure (`on_unreadable=estimate`) never settles
        // below its reservation: the upstream may have read it as a stream, and not asked
        // for usage.
        let body_unreadable = super::body::body_of(r).is_some_and(|body| body.unreadable.is_some());
        let report = match found {
            Found::Usage(cost) => Report::Usage(cost),
            Found::Missing if body_unreadable => Report::Malformed { bound: None },
            Found::Missing => Report::Missing {
                estimate: (line.usage.on_missing == OnMissing::Estimate)
                    .then(|| self.estimate())
                    .flatten(),
            },
            // A variable's value is the cost in the operator's own unit: only the
            // reservation says what the request may cost.
            Found::Malformed(_) => Report::Malformed {
                bound: match line.usage.source {
                    UsageSourceConf::Reader(_) => self
                        .request_bound(r, line)
                        .map(|usage| self.cost(r, line, &usage, &mut unpriced)),
                    UsageSourceConf::Variable(_) => None,
                },
            },
        };
        Owed {
            tokens: settle::owed(line.reserved, report, self.end(r), line.usage.on_missing),
            found,
            unpriced,
        }
    }

    /// The cost of `usage` for `line`: weighted, or priced (`unpriced` set when the model
    /// had no price and the table's highest were charged).
    fn cost(
        &self,
        r: &ngx_http_request_t,
        line: &Line,
        usage: &Usage,
        unpriced: &mut Option<usize>,
    ) -> u64 {
        let Some(index) = line.usage.prices else {
            return line.usage.weights.cost(usage);
        };
        let Some((weights, priced)) = self.prices(r, index) else {
            *unpriced = Some(index);
            return line.reserved;
        };
        if !priced {
            *unpriced = Some(index);
        }
        weights.cost(usage)
    }

    /// The most the request may use as its body says (`reserve=auto`'s figure), when the
    /// body was read.
    fn request_bound(&self, r: &ngx_http_request_t, line: &Line) -> Option<Usage> {
        let facts = &super::body::body_of(r)?.facts;
        let default = match line.usage.reserve {
            AmountConf::Auto(default) => default,
            AmountConf::Fixed(_) | AmountConf::Variable(_) => AUTO_DEFAULT_CEILING,
        };
        Some(settle::request_bound(
            facts.reservation(default),
            facts.prompt_estimate(),
        ))
    }

    /// The model the response named.
    fn model(&self) -> Option<&str> {
        self.reader.as_ref()?.model()
    }

    /// The prices in table `index` of the model the response names, else of the request's,
    /// in micro-dollars per token, and whether the table prices it (else its highest prices).
    fn prices(&self, r: &ngx_http_request_t, index: usize) -> Option<(Weights, bool)> {
        let table = RateLimitModule::main_conf(r)?
            .prices
            .get(index)?
            .table
            .as_ref()?;
        let request = super::body::body_of(r).and_then(|body| body.facts.model.as_deref());
        Some(table.price_for(self.model(), request))
    }

    /// The model a priced line charges for: the one the response named, else the request
    /// body's `model`.
    fn priced_model<'a>(&'a self, r: &ngx_http_request_t) -> Option<&'a str> {
        self.model()
            .or_else(|| super::body::body_of(r)?.facts.model.as_deref())
    }

    fn end(&self, r: &ngx_http_request_t) -> End {
        // SAFETY: a live request has its connection.
        let client_gone = unsafe { (*r.connection).error() } != 0;
        let unread = self.unreadable && self.provider.is_some();
        if self.ended && !client_gone && !unread {
            End::Complete
        } else {
            End::Cut
        }
    }
}

/// The log-phase handler: settle every usage-based line the request was charged by.
pub unsafe extern "C" fn log_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    crate::glue::guard::entry(
        "handler::usage::log_handler",
        || ngx_int_t::from(ngx::core::Status::NGX_ERROR),
        || {
            // SAFETY: nginx calls phase handlers with the live request.
            let r = unsafe { &mut *r };
            if !ptr::eq(r.main, r) {
                return Status::NGX_OK.into();
            }
            let Some(state) = state_of(r) else {
                return Status::NGX_OK.into();
            };
            if state.settled {
                return Status::NGX_OK.into();
            }
            state.settled = true;
            let now = now_ns();
            let mut logged = false;
            for line in &state.lines {
                let Owed {
                    tokens: owed,
                    found,
                    unpriced,
                } = state.owed(r, line);
                let zone = line.charged.zone();
                zone.count_by(Counter::TokensUsed, owed);
                if line.usage.prices.is_some() {
                    zone.count_by(Counter::SpentMicroUsd, owed);
                }
                if let Some(index) = unpriced {
                    zone.count(Counter::Unpriced);
                    log_unpriced(r, state.priced_model(r), index, owed, now);
                }
                if let Some(key) = &line.key {
                    zone.record_top_amount(TopKind::Tokens, now, key, owed);
                }
                zone.count(match found {
                    Found::Usage(_) => Counter::UsageFound,
                    Found::Missing | Found::Malformed(_) => Counter::UsageMissing,
                });
                if let Found::Malformed(malformed) = found {
                    zone.count(Counter::UsageBad);
                    // One line a request, however many zones settle it.
                    if !logged && zone.should_log_bad_usage(now) {
                        log_malformed(r, &line.zone_name, &malformed, owed, line.reserved);
                        logged = true;
                    }
                }
                match settle::settlement(line.reserved, owed) {
                    Settlement::Refund(tokens) => {
                        line.charged.give_back_tokens(tokens, now);
                        zone.count_by(Counter::TokensRefunded, tokens);
                    }
                    Settlement::Charge(tokens) => {
                        let forgiven = line.charged.charge_into_debt(tokens, line.usage.debt, now);
                        zone.count_by(Counter::TokensOverrun, tokens);
                        zone.count_by(Counter::TokensForgiven, forgiven);
                    }
                    Settlement::Even => {}
                }
            }
            Status::NGX_OK.into()
        },
    )
}

/// What a line owes as its request ends.
struct Owed {
    tokens: u64,
    /// The usage found.
    found: Found,
    /// The line's price table (its index) has no price for the response's model.
    unpriced: Option<usize>,
}

/// The second a worker last logged a model without a price (so at most once a second).
static UNPRICED_LOGGED_SEC: AtomicU64 = AtomicU64::new(u64::MAX);

/// A usage priced by no line of its table: logged at most once a second per worker.
fn log_unpriced(r: &ngx_http_request_t, model: Option<&str>, index: usize, owed: u64, now_ns: u64) {
    if !once_a_second(&UNPRICED_LOGGED_SEC, now_ns) {
        return;
    }
    let table = RateLimitModule::main_conf(r)
        .and_then(|mcf| mcf.prices.get(index))
        .map_or("", |named| named.name.as_str());
    let what = match model {
        Some(model) => format!("no price for model \"{}\"", model.escape_debug()),
        None => "no model named by the response or the request".to_string(),
    };
    ngx_log_error!(
        NGX_LOG_WARN,
        connection_log(r),
        "rate_limit: {what} in rate_limit_prices \"{table}\": charged {owed} at the table's \
         highest prices; add the model or a \"default\" line"
    );
}

/// A malformed usage, at most once a second per zone: what the response said, cut, and what
/// the request was charged for it.
fn log_malformed(
    r: &ngx_http_request_t,
    zone_name: &str,
    malformed: &Malformed,
    owed: u64,
    reserved: u64,
) {
    ngx_log_error!(
        NGX_LOG_WARN,
        connection_log(r),
        "rate_limit: malformed usage in the response, zone \"{zone_name}\" charged {owed} (the \
         most the request may use, at least its reservation of {reserved}): {}",
        malformed.reason()
    );
}

/// The `data` of each `$rate_limit_usage_*` variable (`handler::variables`).
pub(super) const PROMPT_TOKENS: usize = 0;
pub(super) const COMPLETION_TOKENS: usize = 1;
pub(super) const CACHED_TOKENS: usize = 2;
pub(super) const TOTAL_TOKENS: usize = 3;
pub(super) const COST: usize = 4;
pub(super) const MODEL: usize = 5;

/// `$rate_limit_usage_*`: the tokens the response reported (not found when it reported
/// none), `_cost`: what the first usage-based line charges for the request, and `_model`:
/// the model the response named (not found when it named none).
pub(super) unsafe extern "C" fn usage_variable(
    r: *mut ngx_http_request_t,
    v: *mut ngx_http_variable_value_t,
    data: usize,
) -> ngx_int_t {
    crate::glue::guard::entry(
        "handler::usage::usage_variable",
        || crate::glue::guard::not_found(v),
        || {
            // SAFETY: nginx passes the live request and the value to fill.
            let Some(r) = (unsafe { r.as_mut() }) else {
                return NGX_ERROR;
            };
            let mut digits = itoa::Buffer::new();
            let value = state_of(r).and_then(|state| {
                if data == MODEL {
                    return state.model().map(|model| model.as_bytes().to_vec());
                }
                let number = if data == COST {
                    let line = state.lines.first()?;
                    state.owed(r, line).tokens
                } else {
                    let usage = state.usage()?;
                    match data {
                        PROMPT_TOKENS => usage.prompt_tokens,
                        COMPLETION_TOKENS => usage.completion_tokens,
                        CACHED_TOKENS => usage.cached_tokens,
                        _ => usage.total_tokens,
                    }
                };
                Some(digits.format(number).as_bytes().to_vec())
            });
            let Some(text) = value else {
                value_bits::write(v, value_bits::NOT_FOUND);
                return Status::NGX_OK.into();
            };
            let bits = value_bits::VALID | value_bits::NO_CACHEABLE;
            // SAFETY: `v` and the request's pool are live; the pool outlives the value.
            unsafe { crate::glue::set_value(v, r.pool, &text, bits) }
        },
    )
}

/// The line of each kind that is nearest its limit: `(line, kind)` for the tokens
/// (usage-based lines) and the requests (the others).
fn tightest<'a, 'b>(
    applied: &'b [AppliedLimit<'a>],
    confs: &[&LimitConf],
    tokens: bool,
) -> Option<&'b Applied<'a>> {
    applied
        .iter()
        .zip(confs)
        .filter(|(_, conf)| conf.usage.is_some() == tokens)
        .map(|(limit, _)| &limit.own)
        .min_by_key(|own| own.decision.remaining)
}

/// `rate_limit_openai_headers on`: `x-ratelimit-{limit,remaining,reset}-tokens` for the
/// usage-based line nearest its limit, `-requests` for the other lines'.
pub fn add_openai_headers(
    r: &mut ngx_http_request_t,
    applied: &[AppliedLimit],
    confs: &[&LimitConf],
) {
    type Names = [&'static str; 3];
    const TOKENS: Names = [
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
    ];
    const REQUESTS: Names = [
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests",
    ];
    for (tokens, names) in [(false, REQUESTS), (true, TOKENS)] {
        let Some(own) = tightest(applied, confs, tokens) else {
            continue;
        };
        let limit = own.policy.max_cost();
        let mut digits = itoa::Buffer::new();
        add_header(r, names[0], digits.format(limit).as_bytes());
        add_header(
            r,
            names[1],
            digits.format(own.decision.remaining).as_bytes(),
        );
        let reset = ratelimit_core::usage::openai::reset_text(own.decision.reset_ns);
        add_header(r, names[2], reset.as_bytes());
    }
}

/// A refusal answered with OpenAI's 429 body (`error.code` `rate_limit_exceeded`, a message
/// with the limit, what is used and what was asked); `status` is the refusal's status, the
/// answer when the body cannot be sent.
pub fn reject_in_openai_json(
    r: &mut ngx_http_request_t,
    applied: &[AppliedLimit],
    confs: &[&LimitConf],
    verdict: &Verdict,
    status: ngx_int_t,
) -> ngx_int_t {
    use ratelimit_core::usage::openai::{error_body, Kind};
    let Some((limit, conf)) = verdict.by.and_then(|by| applied.get(by).zip(confs.get(by))) else {
        return status;
    };
    let own = &limit.own;
    let kind = if conf.usage.is_some() {
        Kind::Tokens
    } else {
        Kind::Requests
    };
    let capacity = own.policy.max_cost();
    let used = capacity.saturating_sub(verdict.decision.remaining);
    let body = error_body(
        kind,
        &own.zone_conf.name,
        capacity,
        used,
        own.policy.cost,
        verdict.decision.retry_after_ns,
    );
    answer_now(r, status, b"application/json", body.as_bytes())
}
