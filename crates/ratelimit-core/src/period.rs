//! Calendar periods of quota zones (`period=hour|day|week|month tz=ZONE`): where the period
//! holding a given instant starts and ends, in a time zone.
//!
//! Time comes in as Unix milliseconds from the caller; nothing here reads a clock. Periods
//! follow the zone's civil calendar: a day runs from one midnight to the next (23 or 25 hours
//! across a daylight-saving change), a week from Monday 00:00 (ISO 8601), a month from the
//! 1st 00:00. An hour is a civil hour, 60 minutes long: on the night clocks go back, the
//! repeated hour (02:00-03:00 twice in Europe/Berlin) is two periods. (Hours assume clocks
//! move by whole hours; Australia/Lord_Howe's 30-minute change gives one hour period that
//! overlaps its neighbour by 30 minutes twice a year. Its days, weeks and months are exact.)
//!
//! Time zones come from the system's tz database (`/usr/share/zoneinfo`, Debian's `tzdata`),
//! read once when the configuration is, so that a rule change reaches the module with the
//! operating system's updates (and a reload), never with a rebuild.

use std::fmt;

use jiff::civil::Date;
use jiff::tz::{Offset, TimeZone};
use jiff::{Timestamp, Zoned};

/// How long a quota's count lasts before it starts again from zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PeriodUnit {
    /// From one civil hour to the next.
    Hour,
    /// From midnight to midnight.
    Day,
    /// From Monday 00:00 to the next Monday 00:00 (ISO 8601 weeks).
    Week,
    /// From the 1st 00:00 to the next month's 1st 00:00.
    Month,
}

impl PeriodUnit {
    /// `hour`, `day`, `week` or `month`.
    pub fn parse(text: &str) -> Option<PeriodUnit> {
        match text {
            "hour" => Some(PeriodUnit::Hour),
            "day" => Some(PeriodUnit::Day),
            "week" => Some(PeriodUnit::Week),
            "month" => Some(PeriodUnit::Month),
            _ => None,
        }
    }

    /// The name [`PeriodUnit::parse`] reads.
    pub fn as_str(self) -> &'static str {
        match self {
            PeriodUnit::Hour => "hour",
            PeriodUnit::Day => "day",
            PeriodUnit::Week => "week",
            PeriodUnit::Month => "month",
        }
    }
}

/// A period and the time zone whose calendar it follows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Calendar {
    /// Hour, day, week or month.
    pub unit: PeriodUnit,
    /// An IANA time zone or a fixed offset (`UTC` by default).
    pub tz: TimeZone,
    /// The `tz=` text as configured (`UTC` when none was), for what the admin API shows.
    pub tz_name: String,
}

/// One period: `[start_ms, end_ms)` in Unix milliseconds, and its number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Bounds {
    /// The first millisecond of the period.
    pub start_ms: i64,
    /// The first millisecond of the next period.
    pub end_ms: i64,
    /// The period's number: one more for each period after it, the same for every instant in
    /// it (hours and days since 1970-01-01 in the zone's calendar, weeks since the Monday
    /// before it, months since year 0).
    pub index: i64,
}

/// Why a `period=` or `tz=` was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CalendarError {
    /// `invalid period "period=fortnight": it must be hour, day, week or month`
    #[error("invalid period \"{0}\": it must be hour, day, week or month")]
    Period(String),
    /// `unknown time zone "tz=Europe/Berln": ...`
    #[error(
        "unknown time zone \"{0}\": give an IANA name found in the system's tz database \
         (/usr/share/zoneinfo), such as Europe/Berlin or America/New_York, or an offset from \
         -23:59 to +23:59 such as +05:30"
    )]
    TimeZone(String),
}

impl Calendar {
    /// `period` (`hour|day|week|month`) in `tz` (an IANA name, `±HH:MM`, or `None` for
    /// UTC). Errors quote the whole word as configured (`period=...`, `tz=...`).
    ///
    /// ```
    /// use ratelimit_core::period::{Calendar, PeriodUnit};
    ///
    /// let calendar = Calendar::parse("month", Some("+02:00")).unwrap();
    /// assert_eq!(calendar.unit, PeriodUnit::Month);
    /// // 2028-02-29T23:00:00Z is March 1st 01:00 at +02:00: March, to April 1st 00:00.
    /// let bounds = calendar.bounds(1_835_478_000_000);
    /// assert_eq!(bounds.start_ms, 1_835_474_400_000); // 2028-02-29T22:00:00Z
    /// assert!(Calendar::parse("fortnight", None).is_err());
    /// ```
    pub fn parse(period: &str, tz: Option<&str>) -> Result<Calendar, CalendarError> {
        let unit = PeriodUnit::parse(period)
            .ok_or_else(|| CalendarError::Period(format!("period={period}")))?;
        let (tz, tz_name) = match tz {
            None => (TimeZone::UTC, "UTC".to_string()),
            Some(name) => {
                let zone = parse_offset(name)
                    .map(TimeZone::fixed)
                    .or_else(|| jiff::tz::db().get(name).ok())
                    .ok_or_else(|| CalendarError::TimeZone(format!("tz={name}")))?;
                (zone, name.to_string())
            }
        };
        Ok(Calendar { unit, tz, tz_name })
    }

    /// The period holding the instant `now_ms` (Unix milliseconds).
    ///
    /// Instants jiff cannot represent (before year -9999 or after 9999) are clamped to its
    /// range: no caller's clock is anywhere near it.
    pub fn bounds(&self, now_ms: i64) -> Bounds {
        let now = Timestamp::from_millisecond(now_ms).unwrap_or(if now_ms < 0 {
            Timestamp::MIN
        } else {
            Timestamp::MAX
        });
        let zoned = now.to_zoned(self.tz.clone());
        match self.unit {
            PeriodUnit::Hour => {
                // Back to the hour's start in absolute time: the two 02:xx hours of a night
                // that repeats them are told apart by the instant, not by the clock's face.
                let into_hour_ms = i64::from(zoned.minute()) * 60_000
                    + i64::from(zoned.second()) * 1_000
                    + i64::from(zoned.millisecond());
                let start_ms = now.as_millisecond() - into_hour_ms;
                Bounds {
                    start_ms,
                    end_ms: start_ms + 3_600_000,
                    index: start_ms.div_euclid(3_600_000),
                }
            }
            PeriodUnit::Day => self.days(zoned.date(), 1, days_since_epoch(zoned.date())),
            PeriodUnit::Week => {
                let offset = i64::from(zoned.weekday().to_monday_zero_offset());
                let monday = add_days(zoned.date(), -offset);
                // 1970-01-01 was a Thursday: Mondays fall on days ≡ 4 (mod 7).
                self.days(monday, 7, (days_since_epoch(monday) + 3).div_euclid(7))
            }
            PeriodUnit::Month => {
                let first = zoned.date().first_of_month();
                let days = i64::from(first.days_in_month());
                let index = i64::from(first.year()) * 12 + i64::from(first.month()) - 1;
                self.days(first, days, index)
            }
        }
    }

    /// The period from `first`'s first instant to that of `days` days later.
    fn days(&self, first: Date, days: i64, index: i64) -> Bounds {
        Bounds {
            start_ms: self.start_of(first),
            end_ms: self.start_of(add_days(first, days)),
            index,
        }
    }

    /// The first instant of `date` in the zone: midnight, or the end of a gap that skips it.
    fn start_of(&self, date: Date) -> i64 {
        date.to_zoned(self.tz.clone())
            .and_then(|zoned| zoned.start_of_day())
            .map_or(i64::MAX, |zoned: Zoned| zoned.timestamp().as_millisecond())
    }
}

impl fmt::Display for Calendar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} in {}", self.unit.as_str(), self.tz_name)
    }
}

/// `+HH:MM` or `-HH:MM` (hours 00 to 23, minutes 00 to 59).
fn parse_offset(text: &str) -> Option<Offset> {
    let (sign, rest) = match text.as_bytes().first()? {
        b'+' => (1, &text[1..]),
        b'-' => (-1, &text[1..]),
        _ => return None,
    };
    let (hours, minutes) = rest.split_once(':')?;
    let two_digits = |s: &str| s.len() == 2 && s.bytes().all(|b| b.is_ascii_digit());
    if !two_digits(hours) || !two_digits(minutes) {
        return None;
    }
    let (hours, minutes): (i32, i32) = (hours.parse().ok()?, minutes.parse().ok()?);
    if hours > 23 || minutes > 59 {
        return None;
    }
    Offset::from_seconds(sign * (hours * 3600 + minutes * 60)).ok()
}

fn days_since_epoch(date: Date) -> i64 {
    let midnight_utc = date
        .to_zoned(TimeZone::UTC)
        .map_or(0, |zoned| zoned.timestamp().as_second());
    midnight_utc.div_euclid(86_400)
}

fn add_days(date: Date, days: i64) -> Date {
    date.checked_add(jiff::Span::new().days(days))
        .unwrap_or(date)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unix milliseconds of an RFC 3339 instant.
    fn ms(text: &str) -> i64 {
        text.parse::<Timestamp>().unwrap().as_millisecond()
    }

    fn hours(bounds: &Bounds) -> f64 {
        (bounds.end_ms - bounds.start_ms) as f64 / 3_600_000.0
    }

    #[test]
    fn table() {
        // (period, tz, now, start, end, length in hours)
        #[rustfmt::skip]
        let rows = [
            // Europe/Berlin's spring day (2026-03-29: 02:00 CET becomes 03:00 CEST) has 23
            // hours, its autumn day (2026-10-25: 03:00 CEST becomes 02:00 CET) 25.
            ("day", "Europe/Berlin", "2026-03-29T12:00:00Z",
             "2026-03-28T23:00:00Z", "2026-03-29T22:00:00Z", 23.0),
            ("day", "Europe/Berlin", "2026-10-25T12:00:00Z",
             "2026-10-24T22:00:00Z", "2026-10-25T23:00:00Z", 25.0),
            ("day", "Europe/Berlin", "2026-10-26T00:30:00Z",
             "2026-10-25T23:00:00Z", "2026-10-26T23:00:00Z", 24.0),
            // The repeated hour: 02:30 CEST and 02:30 CET are two periods.
            ("hour", "Europe/Berlin", "2026-10-25T00:30:00Z",
             "2026-10-25T00:00:00Z", "2026-10-25T01:00:00Z", 1.0),
            ("hour", "Europe/Berlin", "2026-10-25T01:30:00Z",
             "2026-10-25T01:00:00Z", "2026-10-25T02:00:00Z", 1.0),
            // The skipped hour: 01:59:59.999 CET is followed by 03:00 CEST.
            ("hour", "Europe/Berlin", "2026-03-29T00:59:59.999Z",
             "2026-03-29T00:00:00Z", "2026-03-29T01:00:00Z", 1.0),
            ("hour", "Europe/Berlin", "2026-03-29T01:00:00Z",
             "2026-03-29T01:00:00Z", "2026-03-29T02:00:00Z", 1.0),
            // A half-hour offset: hours start at :30 UTC.
            ("hour", "Asia/Kolkata", "2026-06-01T10:15:00Z",
             "2026-06-01T09:30:00Z", "2026-06-01T10:30:00Z", 1.0),
            // A month across the spring change is one hour short; month lengths.
            ("month", "Europe/Berlin", "2026-03-15T00:00:00Z",
             "2026-02-28T23:00:00Z", "2026-03-31T22:00:00Z", 31.0 * 24.0 - 1.0),
            ("month", "UTC", "2026-04-30T23:59:59.999Z",
             "2026-04-01T00:00:00Z", "2026-05-01T00:00:00Z", 30.0 * 24.0),
            ("month", "UTC", "2026-02-10T00:00:00Z",
             "2026-02-01T00:00:00Z", "2026-03-01T00:00:00Z", 28.0 * 24.0),
            // Leap years: February 2028 has 29 days, and the 29th is a day of its own.
            ("month", "UTC", "2028-02-29T12:00:00Z",
             "2028-02-01T00:00:00Z", "2028-03-01T00:00:00Z", 29.0 * 24.0),
            ("day", "UTC", "2028-02-29T23:59:59.999Z",
             "2028-02-29T00:00:00Z", "2028-03-01T00:00:00Z", 24.0),
            ("month", "UTC", "2100-02-10T00:00:00Z",
             "2100-02-01T00:00:00Z", "2100-03-01T00:00:00Z", 28.0 * 24.0),
            ("month", "UTC", "2026-12-31T23:59:59.999Z",
             "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z", 31.0 * 24.0),
            // ISO weeks across a year's end: 2026-12-28 (Monday, week 53) to 2027-01-04.
            ("week", "UTC", "2027-01-03T23:59:59.999Z",
             "2026-12-28T00:00:00Z", "2027-01-04T00:00:00Z", 7.0 * 24.0),
            ("week", "UTC", "2027-01-04T00:00:00Z",
             "2027-01-04T00:00:00Z", "2027-01-11T00:00:00Z", 7.0 * 24.0),
            // 2024-12-30 (a Monday) starts 2025's week 1.
            ("week", "UTC", "2025-01-01T08:00:00Z",
             "2024-12-30T00:00:00Z", "2025-01-06T00:00:00Z", 7.0 * 24.0),
            // A week across Berlin's autumn change has 169 hours.
            ("week", "Europe/Berlin", "2026-10-25T12:00:00Z",
             "2026-10-18T22:00:00Z", "2026-10-25T23:00:00Z", 7.0 * 24.0 + 1.0),
            // Fixed offsets: the local calendar, east and west of UTC.
            ("day", "+05:30", "2026-06-01T20:00:00Z",
             "2026-06-01T18:30:00Z", "2026-06-02T18:30:00Z", 24.0),
            ("month", "-08:00", "2026-07-01T03:00:00Z",
             "2026-06-01T08:00:00Z", "2026-07-01T08:00:00Z", 30.0 * 24.0),
            ("month", "+14:00", "2026-06-30T10:00:00Z",
             "2026-06-30T10:00:00Z", "2026-07-31T10:00:00Z", 31.0 * 24.0),
            // Before 1970.
            ("day", "UTC", "1969-12-31T12:00:00Z",
             "1969-12-31T00:00:00Z", "1970-01-01T00:00:00Z", 24.0),
        ];
        for (period, tz, now, start, end, length) in rows {
            let calendar = Calendar::parse(period, Some(tz)).unwrap();
            let bounds = calendar.bounds(ms(now));
            let row = format!("{period} {tz} {now}");
            assert_eq!(
                (bounds.start_ms, bounds.end_ms),
                (ms(start), ms(end)),
                "{row}"
            );
            assert_eq!(hours(&bounds), length, "{row}");
            // Every instant of the period has the same bounds; the next period's number is
            // one more.
            assert_eq!(calendar.bounds(bounds.start_ms), bounds, "{row}");
            assert_eq!(calendar.bounds(bounds.end_ms - 1), bounds, "{row}");
            let next = calendar.bounds(bounds.end_ms);
            assert_eq!(
                (next.start_ms, next.index),
                (bounds.end_ms, bounds.index + 1),
                "{row}"
            );
        }
    }

    /// Walking any calendar period by period from 2023 to 2030 never skips or repeats a
    /// number, and periods tile time with no gap.
    #[test]
    fn periods_tile_time() {
        for tz in [
            "Europe/Berlin",
            "America/New_York",
            "Australia/Lord_Howe",
            "UTC",
            "-03:30",
        ] {
            for period in ["hour", "day", "week", "month"] {
                if period == "hour" && tz == "Australia/Lord_Howe" {
                    // Its clocks move by 30 minutes: see the module's note on hours.
                    continue;
                }
                let calendar = Calendar::parse(period, Some(tz)).unwrap();
                let mut bounds = calendar.bounds(ms("2023-01-01T00:00:00Z"));
                while bounds.start_ms < ms("2030-01-01T00:00:00Z") {
                    let next = calendar.bounds(bounds.end_ms);
                    assert!(bounds.end_ms > bounds.start_ms, "{period} {tz} {bounds:?}");
                    assert_eq!(next.start_ms, bounds.end_ms, "{period} {tz} {bounds:?}");
                    assert_eq!(next.index, bounds.index + 1, "{period} {tz} {bounds:?}");
                    bounds = next;
                }
            }
        }
    }

    #[test]
    fn errors_quote_the_word() {
        assert_eq!(
            Calendar::parse("fortnight", None).unwrap_err().to_string(),
            "invalid period \"period=fortnight\": it must be hour, day, week or month"
        );
        for tz in [
            "Europe/Berln",
            "+24:00",
            "+5:30",
            "05:30",
            "+05:60",
            "",
            "../etc/passwd",
        ] {
            let error = Calendar::parse("day", Some(tz)).unwrap_err().to_string();
            assert!(
                error.starts_with(&format!("unknown time zone \"tz={tz}\": give an IANA name")),
                "{error}"
            );
        }
        assert_eq!(Calendar::parse("day", None).unwrap().tz_name, "UTC");
        assert!(Calendar::parse("week", Some("-00:00")).is_ok());
    }
}
