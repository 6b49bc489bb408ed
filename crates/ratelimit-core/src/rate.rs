//! Rates written like nginx's `rate=10r/s`.

use std::fmt;
use std::num::NonZeroU64;

/// Nanoseconds in one second.
pub const NANOS_PER_SEC: u64 = 1_000_000_000;

/// What a rate looks like, for the errors that quote a bad one.
pub const RATE_SYNTAX: &str =
    "it must be NUMBERr/s|m|h|d with NUMBER above 0, e.g. 10r/s or 0.5r/m";

/// A rate that does not read as one: `invalid rate "abc": it must be NUMBERr/s|m|h|d ...`
/// (the whole text quoted, then what a rate looks like).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid rate \"{0}\": {RATE_SYNTAX}")]
pub struct InvalidRate(pub String);

/// The unit after `r/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RateUnit {
    /// `r/s`
    Second,
    /// `r/m`
    Minute,
    /// `r/h`
    Hour,
    /// `r/d`
    Day,
}

impl RateUnit {
    /// Length of one unit in nanoseconds (also the window of the sliding algorithms).
    #[inline]
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
    /// The period the requests are counted over.
    pub unit: RateUnit,
}

impl Rate {
    /// Largest accepted `milli_requests` (fits the packed form of [`crate::Limits`]).
    pub const MAX_MILLI_REQUESTS: u64 = (1 << 40) - 1;

    /// Parse `10r/s`, `0.5r/m`, `100r/h`, `2r/d` (at most three decimals, greater than zero).
    /// Errors quote the whole text and say what a rate looks like: `invalid rate "abc": it must
    /// be NUMBERr/s|m|h|d ...`.
    ///
    /// ```
    /// use ratelimit_core::{Rate, RateUnit};
    ///
    /// let rate = Rate::parse("0.5r/m").unwrap();
    /// assert_eq!(rate, Rate { milli_requests: 500, unit: RateUnit::Minute });
    /// assert_eq!(rate.to_string(), "0.5r/m");
    /// assert_eq!(Rate::parse("10r/s").unwrap().interval_ns(), 100_000_000);
    /// assert!(Rate::parse("abc")
    ///     .unwrap_err()
    ///     .to_string()
    ///     .starts_with("invalid rate \"abc\": it must be NUMBERr/s|m|h|d"));
    /// ```
    pub fn parse(text: &str) -> Result<Rate, InvalidRate> {
        let invalid = || InvalidRate(text.to_string());
        let (number, unit) = text.split_once("r/").ok_or_else(invalid)?;
        let unit = match unit {
            "s" => RateUnit::Second,
            "m" => RateUnit::Minute,
            "h" => RateUnit::Hour,
            "d" => RateUnit::Day,
            _ => return Err(invalid()),
        };
        let (whole, fraction) = match number.split_once('.') {
            Some((whole, fraction)) => (whole, fraction),
            None => (number, "0"),
        };
        let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !all_digits(whole) || !all_digits(fraction) || fraction.len() > 3 {
            return Err(invalid());
        }
        // "0.5" is read as the digits "0500": the whole part, then exactly three decimals.
        let digits = format!("{whole}{fraction:0<3}");
        let milli_requests = digits.parse::<u64>().map_err(|_| invalid())?;
        if milli_requests == 0 || milli_requests > Rate::MAX_MILLI_REQUESTS {
            return Err(invalid());
        }
        Ok(Rate {
            milli_requests,
            unit,
        })
    }

    /// Time between two requests at this rate (the GCRA emission interval), in nanoseconds,
    /// rounded up: a bucket never admits more than the rate, only up to half a nanosecond
    /// per request less (0.02% at 2.5 million r/s, 1e-9 at 3r/s).
    #[inline]
    pub fn interval_ns(&self) -> u64 {
        // In u64 for every valid rate: `unit * 1000` is at most 8.64e16 and `milli` at most
        // 2^40. (Invalid rates beyond that saturate: a longer interval, never a shorter one.)
        let milli = self.milli_requests.max(1);
        let numerator = self.unit.nanos() * 1000;
        numerator.saturating_add(milli - 1) / milli
    }

    /// How early a request may arrive and still be judged on time by the buckets: half the
    /// interval when the interval is under a millisecond, else 0 (see the leaky bucket).
    #[inline]
    pub fn jitter_tolerance_ns(&self) -> u64 {
        jitter_tolerance_ns(NonZeroU64::new(self.interval_ns()).unwrap_or(NonZeroU64::MIN))
    }

    /// The unit's length in nanoseconds: the window of the sliding algorithms.
    #[inline]
    pub fn window_ns(&self) -> u64 {
        self.unit.nanos()
    }

    /// `Some(N)` when the rate is a whole number of requests per unit.
    pub fn whole_requests(&self) -> Option<u64> {
        // Not `is_multiple_of`: the workspace supports Rust 1.81.
        let thousandths = self.milli_requests % 1000;
        (thousandths == 0).then_some(self.milli_requests / 1000)
    }
}

/// Intervals shorter than this forgive arrival jitter (see the module documentation of `gcra`).
pub(crate) const JITTER_FORGIVEN_BELOW_NS: u64 = 1_000_000;

/// How much earlier than its turn a request may arrive, for an interval `T`: `T / 2` under a
/// millisecond, else 0.
#[inline(always)]
pub(crate) fn jitter_tolerance_ns(interval_ns: NonZeroU64) -> u64 {
    if interval_ns.get() < JITTER_FORGIVEN_BELOW_NS {
        interval_ns.get() / 2
    } else {
        0
    }
}

impl fmt::Display for Rate {
    /// The shortest text `parse` reads back to the same rate: `10r/s`, `0.5r/m`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whole = self.milli_requests / 1000;
        let fraction = self.milli_requests % 1000;
        if fraction == 0 {
            write!(f, "{whole}r/{}", self.unit.suffix())
        } else {
            let decimals = format!("{fraction:03}");
            write!(
                f,
                "{whole}.{}r/{}",
                decimals.trim_end_matches('0'),
                self.unit.suffix()
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_displays() {
        #[rustfmt::skip]
        let rows: &[(&str, u64, RateUnit, &str, u64)] = &[
            ("10r/s",    10_000, RateUnit::Second, "10r/s",   100_000_000),
            ("0.5r/s",   500,    RateUnit::Second, "0.5r/s",  2_000_000_000),
            ("0.5r/m",   500,    RateUnit::Minute, "0.5r/m",  120_000_000_000),
            ("100r/h",   100_000, RateUnit::Hour,  "100r/h",  36_000_000_000),
            ("2r/d",     2_000,  RateUnit::Day,    "2r/d",    43_200_000_000_000),
            ("0.001r/d", 1,      RateUnit::Day,    "0.001r/d", 86_400_000_000_000_000),
            ("1.250r/s", 1_250,  RateUnit::Second, "1.25r/s", 800_000_000),
            ("3r/s",     3_000,  RateUnit::Second, "3r/s",    333_333_334), // rounded up
            ("6r/s",     6_000,  RateUnit::Second, "6r/s",    166_666_667),
        ];
        for &(text, milli_requests, unit, shown, interval_ns) in rows {
            let rate = Rate::parse(text).unwrap();
            assert_eq!(
                rate,
                Rate {
                    milli_requests,
                    unit
                },
                "{text}"
            );
            assert_eq!(rate.to_string(), shown, "{text}");
            assert_eq!(Rate::parse(shown), Ok(rate), "{text}");
            assert_eq!(rate.interval_ns(), interval_ns, "{text}");
        }
    }

    #[test]
    fn rejects_bad_rates() {
        for text in [
            "",
            "abc",
            "10",
            "10r",
            "10r/",
            "10r/x",
            "r/s",
            "0r/s",
            "0.0r/s",
            "0.0001r/s",
            "-1r/s",
            "1.r/s",
            ".5r/s",
            "1e3r/s",
            " 1r/s",
            "1r/s ",
            "99999999999999999999r/s",
            "1099511628r/s",
        ] {
            assert_eq!(Rate::parse(text), Err(InvalidRate(text.into())), "{text:?}");
        }
        let largest = Rate {
            milli_requests: Rate::MAX_MILLI_REQUESTS,
            unit: RateUnit::Second,
        };
        assert_eq!(Rate::parse(&largest.to_string()), Ok(largest));
    }

    #[test]
    fn interval_is_at_least_one_nanosecond() {
        let rate = Rate {
            milli_requests: Rate::MAX_MILLI_REQUESTS,
            unit: RateUnit::Second,
        };
        assert_eq!(rate.interval_ns(), 1);
        assert_eq!(
            Rate {
                milli_requests: 0,
                unit: RateUnit::Second
            }
            .interval_ns(),
            1_000_000_000_000
        );
    }
}
