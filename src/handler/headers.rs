//! `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers-10), one item per
//! zone applied to the request. Built in stack buffers without `format!`: this runs on every
//! limited request.

use ngx::ffi::ngx_http_request_t;
use ratelimit_core::{Rate, NANOS_PER_SEC};

use crate::conf::ZoneConf;
use crate::control::decide::{Applied, AppliedLimit};
use crate::glue::response::{push_header, PoolWriter};

/// Both headers for the one zone applied to the request.
pub fn add_one(r: &mut ngx_http_request_t, applied: &Applied) {
    write_rate_limit_headers(r, core::iter::once(applied));
}

/// Both headers for the limits applied to the request, but those of lines with
/// `headers=off`.
pub fn add_rate_limit_headers(r: &mut ngx_http_request_t, applied: &[AppliedLimit]) {
    match applied {
        // The common case: one item, for which the writer's loops compile away.
        [AppliedLimit {
            own,
            global: None,
            headers: true,
            ..
        }] => write_rate_limit_headers(r, core::iter::once(own)),
        _ if applied.iter().any(|limit| limit.headers) => {
            let shown = applied.iter().filter(|limit| limit.headers);
            write_rate_limit_headers(r, shown.flat_map(AppliedLimit::zones));
        }
        _ => {}
    }
}

/// Both headers with one item per zone in `items`.
fn write_rate_limit_headers<'a, 'z: 'a>(
    r: &mut ngx_http_request_t,
    items: impl Iterator<Item = &'a Applied<'z>> + Clone,
) {
    // Each item is `"NAME";x=N;y=N`: at most the name, 10 bytes of punctuation and two
    // 20-digit numbers, plus ", " between items. Both values are written once, straight into
    // one piece of request-pool memory of that size.
    let item_capacity: usize = items
        .clone()
        .map(|applied| applied.zone_conf.name.len() + 52)
        .sum();
    let Some(mut out) = PoolWriter::new(r, 2 * item_capacity) else {
        return;
    };
    for (position, applied) in items.clone().enumerate() {
        if position > 0 {
            out.put(b", ");
        }
        if applied.policy.algorithm.is_quota() {
            put_quota_item(&mut out, applied);
        } else {
            put_policy_item(&mut out, applied.zone_conf, &applied.policy.limits.rate);
        }
    }
    let policy = out.take();
    for (position, applied) in items.enumerate() {
        if position > 0 {
            out.put(b", ");
        }
        put_state_item(&mut out, applied);
    }
    push_header(r, "RateLimit-Policy", policy);
    push_header(r, "RateLimit", out.take());
}

/// `"NAME";r=R;t=T`: where the zone stands after the request.
#[inline]
fn put_state_item(out: &mut PoolWriter, applied: &Applied) {
    let mut numbers = itoa::Buffer::new();
    out.put(b"\"");
    out.put(applied.zone_conf.name.as_bytes());
    out.put(b"\";r=");
    out.put(numbers.format(applied.decision.remaining).as_bytes());
    out.put(b";t=");
    out.put(
        numbers
            .format(applied.decision.reset_ns.div_ceil(NANOS_PER_SEC))
            .as_bytes(),
    );
}

/// `"NAME";q=Q;w=W` for the zone at `rate`, formatted once per rate in each worker.
fn put_policy_item(out: &mut PoolWriter, zone_conf: &ZoneConf, rate: &Rate) {
    let format = || {
        let (quota, window) = quota_and_window(rate);
        let mut numbers = itoa::Buffer::new();
        let mut item = Vec::with_capacity(zone_conf.name.len() + 46);
        item.push(b'"');
        item.extend_from_slice(zone_conf.name.as_bytes());
        item.extend_from_slice(b"\";q=");
        item.extend_from_slice(numbers.format(quota).as_bytes());
        item.extend_from_slice(b";w=");
        item.extend_from_slice(numbers.format(window).as_bytes());
        item
    };
    let Ok(mut cached) = zone_conf.policy_item.try_borrow_mut() else {
        out.put(&format());
        return;
    };
    match &*cached {
        Some((cached_rate, item)) if cached_rate == rate => out.put(item),
        _ => {
            let item = format();
            out.put(&item);
            *cached = Some((*rate, item));
        }
    }
}

/// `"NAME";q=N;w=W` for a quota zone: its key's limit over the current period's length in
/// seconds (a day may have 23 or 25 hours, a month 28 to 31 days).
#[cold]
fn put_quota_item(out: &mut PoolWriter, applied: &Applied) {
    let period = applied.zone_conf.quota_period.get();
    let window_secs = period.length_ms.div_ceil(1000);
    let mut numbers = itoa::Buffer::new();
    out.put(b"\"");
    out.put(applied.zone_conf.name.as_bytes());
    out.put(b"\";q=");
    out.put(
        numbers
            .format(applied.policy.limits.quota_limit())
            .as_bytes(),
    );
    out.put(b";w=");
    out.put(numbers.format(window_secs).as_bytes());
}

/// The rate as whole requests `q` per `w` seconds: `10r/s` is q=10 w=1, `0.5r/s` is q=1 w=2.
fn quota_and_window(rate: &Rate) -> (u64, u64) {
    let milli = rate.milli_requests.max(1);
    let unit_secs = rate.unit.nanos() / NANOS_PER_SEC;
    let divisor = gcd(milli, 1000);
    (milli / divisor, unit_secs * 1000 / divisor)
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}
