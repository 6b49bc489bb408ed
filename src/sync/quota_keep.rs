//! What the sync loop keeps of a `sync` quota zone between rounds (its calendar, where its
//! reads resume, the sends Redis has not confirmed): below the zone as the loop sees it
//! (`super::zone`) and the exchange that uses it (`super::quota`).

use core::cell::{Cell, RefCell};
use std::collections::HashMap;

use ratelimit_core::period::Calendar;
use ratelimit_core::quota::QuotaWindow;

use crate::glue::{now_ns, unix_ms_of};

/// Keys whose failed sends a loop remembers per zone: beyond, a key's are forgotten, and a
/// forgotten send that Redis applied late is counted twice (the strict side).
pub(super) const UNCONFIRMED_KEYS: usize = 65_536;

/// Failed sends a key remembers (the oldest go first).
pub(super) const UNCONFIRMED: usize = 8;

/// A key's period (its tag) and the (number, delta) of each of its failed sends in it.
pub(super) type FailedSends = (u64, Vec<(u64, u64)>);

/// What the loop keeps of a quota zone between rounds.
pub struct QuotaSync {
    pub calendar: Calendar,
    /// The entry where the next round's reads begin.
    pub(super) cursor: Cell<usize>,
    /// Each key's failed sends since its last applied one, by the key's id.
    pub(super) unconfirmed: RefCell<HashMap<u64, FailedSends>>,
}

impl QuotaSync {
    pub fn new(calendar: Calendar) -> QuotaSync {
        QuotaSync {
            calendar,
            cursor: Cell::new(0),
            unconfirmed: RefCell::new(HashMap::new()),
        }
    }

    /// The period of now, on the request path's clock (`control::quota::window`'s).
    pub(super) fn period(&self) -> (QuotaWindow, i64, i64) {
        let bounds = self.calendar.bounds(unix_ms_of(now_ns()) as i64);
        let window = QuotaWindow {
            tag: QuotaWindow::tag_of(bounds.index),
            end_ns: 0,
        };
        (window, bounds.start_ms, bounds.end_ms)
    }
}
