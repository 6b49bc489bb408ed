//! Quota zones' periods on the request path's clock: the calendar (`ratelimit_core::period`)
//! reads Unix time, decisions the monotonic clock of `glue::now_ns`.

use ratelimit_core::period::Bounds;
use ratelimit_core::quota::QuotaWindow;

use crate::conf::{QuotaPeriod, ZoneConf};
use crate::glue::{unix_minus_local_ms, unix_ms_of};

/// The period a quota zone decides in at `now_ns` (monotonic); the default window for a zone
/// that is not a quota. Each worker keeps the period it computed last and computes the next
/// only once it ended: a request pays one comparison, and the time zone's rules are read once a
/// period.
///
/// Unix time is the monotonic clock plus the offset this process read at its first use
/// (`glue::unix_minus_local_ms`): periods end when the wall clock said they would at that
/// moment; a step of the wall clock later (an NTP correction) is not followed until a restart.
pub fn window(zone_conf: &ZoneConf, now_ns: u64) -> QuotaWindow {
    let cached = zone_conf.quota_period.get();
    if (cached.start_ns..cached.window.end_ns).contains(&now_ns) {
        return cached.window;
    }
    let Some(bounds) = bounds(zone_conf, now_ns) else {
        return QuotaWindow::default();
    };
    let local_ns = |unix_ms: i64| {
        let local_ms = unix_ms.saturating_sub(unix_minus_local_ms()).max(0) as u64;
        local_ms.saturating_mul(1_000_000)
    };
    let period = QuotaPeriod {
        start_ns: local_ns(bounds.start_ms),
        window: QuotaWindow {
            tag: QuotaWindow::tag_of(bounds.index),
            end_ns: local_ns(bounds.end_ms),
        },
        length_ms: bounds.end_ms.saturating_sub(bounds.start_ms).max(0) as u64,
    };
    zone_conf.quota_period.set(period);
    period.window
}

/// The quota zone's period holding `now_ns` (monotonic), in Unix milliseconds; `None` for a
/// zone that is not a quota.
pub fn bounds(zone_conf: &ZoneConf, now_ns: u64) -> Option<Bounds> {
    let quota = zone_conf.quota.as_ref()?;
    Some(quota.calendar.bounds(unix_ms_of(now_ns) as i64))
}
