//! Rates written like nginx's `rate=10r/s`.

use std::fmt;

use crate::spec::SpecError;
use crate::NANOS_PER_SEC;

/// The unit after `r/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RateUnit {
    Second,
    Minute,
    Hour,
    Day,
}

impl RateUnit {
    /// Length of one unit in nanoseconds (also the window of the sliding algorithms).
    pub fn nanos(self) -> u64 {
        match self {
            RateUnit::Second => NANOS_PER_SEC,
            RateUnit::Minute => 60 * NANOS_PER_SEC,
            RateUnit::Hour => 3_600 * NANOS_PER_SEC,
            RateUnit::Day => 86_400 * NANOS_PER_SEC,
        }
    }

    /// `s`, `m`, `h` or `d`.
    pub fn suffix(self) -> &'static str {
        match self {
            RateUnit::Second => "s",
            RateUnit::Minute => "m",
            RateUnit::Hour => "h",
            RateUnit::Day => "d",
        }
    }
}

/// A rate: `milli_requests / 1000` requests per `unit`. Kept as an exact integer so that
/// `0.5r/s` and `10r/s` round-trip through the admin API and the state file unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rate {
    /// Requests per unit, times 1000 (`10r/s` is 10_000). Always at least 1.
    pub milli_requests: u64,
    pub unit: RateUnit,
}

impl Rate {
    /// Largest accepted `milli_requests` (fits the packed form of [`crate::Limits`]).
    pub const MAX_MILLI_REQUESTS: u64 = (1 << 40) - 1;

    /// Parse `10r/s`, `0.5r/m`, `100r/h`, `2r/d` (at most three decimals, greater than zero).
    /// Errors quote the whole text: `invalid rate "abc"`.
    pub fn parse(text: &str) -> Result<Rate, SpecError> {
        let _ = text;
        unimplemented!()
    }

    /// Time between two requests at this rate (the GCRA emission interval), in nanoseconds,
    /// rounded to the nearest nanosecond and at least 1.
    pub fn interval_ns(&self) -> u64 {
        unimplemented!()
    }

    /// The unit's length in nanoseconds: the window of the sliding algorithms.
    pub fn window_ns(&self) -> u64 {
        self.unit.nanos()
    }

    /// `Some(N)` when the rate is a whole number of requests per unit.
    pub fn whole_requests(&self) -> Option<u64> {
        (self.milli_requests % 1000 == 0).then_some(self.milli_requests / 1000)
    }
}

impl fmt::Display for Rate {
    /// The shortest text `parse` reads back to the same rate: `10r/s`, `0.5r/m`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let _ = f;
        unimplemented!()
    }
}
