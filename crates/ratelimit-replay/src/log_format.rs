//! nginx `log_format` strings, read back: which variable each part of an access log line
//! holds, so the replay tool can read the log nginx already writes (`combined` by default)
//! or any custom one, given the same `log_format` text.
//!
//! A format is literal text and variables (`$name` or `${name}`, as nginx writes them). A line
//! is matched left to right: literal text must be there as written, and a variable's value
//! runs up to the first place where the literal text after it appears (nginx escapes `"` in
//! values as `\x22`, so a quoted value never holds its own closing quote). Two variables with
//! nothing between them cannot be told apart and are refused.

use std::fmt;

/// nginx's predefined `combined` format (what `access_log FILE;` writes).
pub const COMBINED: &str = "$remote_addr - $remote_user [$time_local] \"$request\" $status \
                            $body_bytes_sent \"$http_referer\" \"$http_user_agent\"";

/// The Common Log Format: `combined` without referer and user agent.
pub const COMMON: &str =
    "$remote_addr - $remote_user [$time_local] \"$request\" $status $body_bytes_sent";

/// The variables that give a request's time, best first: `$msec` has milliseconds, the two
/// others whole seconds.
pub const TIME_VARIABLES: [&str; 3] = ["msec", "time_iso8601", "time_local"];

/// One piece of a format.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    /// Text written as is.
    Literal(String),
    /// A variable, by name without `$`.
    Variable(String),
}

/// A bad `log_format` string or key: the message quotes the bad part.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FormatError(pub String);

/// How a request's time is written in the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeVariable {
    /// `$msec`: `1700000000.123`, seconds with milliseconds.
    Msec,
    /// `$time_iso8601`: `2023-11-14T22:13:20+00:00`, whole seconds.
    Iso8601,
    /// `$time_local`: `14/Nov/2023:22:13:20 +0000`, whole seconds.
    Local,
}

impl TimeVariable {
    /// Whether the time has whole seconds only.
    pub fn whole_seconds(self) -> bool {
        self != TimeVariable::Msec
    }

    /// The variable's name with its `$`.
    pub fn name(self) -> &'static str {
        match self {
            TimeVariable::Msec => "$msec",
            TimeVariable::Iso8601 => "$time_iso8601",
            TimeVariable::Local => "$time_local",
        }
    }

    /// The time in nanoseconds since the Unix epoch and the UTC offset written with it (in
    /// seconds, 0 for `$msec`); `None` when `text` is not such a time.
    pub fn parse(self, text: &str) -> Option<(u64, i64)> {
        match self {
            TimeVariable::Msec => parse_seconds(text).map(|ns| (ns, 0)),
            TimeVariable::Iso8601 => parse_time_iso8601(text),
            TimeVariable::Local => parse_time_local(text),
        }
    }
}

/// A parsed `log_format` string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogFormat {
    text: String,
    pieces: Vec<Piece>,
}

impl LogFormat {
    /// Parse `text` as nginx reads a `log_format` string (the parts after the name, joined).
    ///
    /// ```
    /// use ratelimit_replay::log_format::{LogFormat, Piece};
    ///
    /// let format = LogFormat::parse("$msec ${remote_addr}:$status").unwrap();
    /// assert_eq!(format.pieces()[1], Piece::Literal(" ".into()));
    /// assert_eq!(format.variables().collect::<Vec<_>>(), ["msec", "remote_addr", "status"]);
    /// assert!(LogFormat::parse("$a$b").is_err());
    /// ```
    pub fn parse(text: &str) -> Result<LogFormat, FormatError> {
        let pieces = parse_pieces(text)?;
        for pair in pieces.windows(2) {
            if let [Piece::Variable(a), Piece::Variable(b)] = pair {
                return Err(FormatError(format!(
                    "variables \"${a}\" and \"${b}\" have no text between them in the log \
                     format \"{text}\": their values cannot be told apart"
                )));
            }
        }
        if !pieces.iter().any(|p| matches!(p, Piece::Variable(_))) {
            return Err(FormatError(format!(
                "the log format \"{text}\" has no variable"
            )));
        }
        Ok(LogFormat {
            text: text.to_string(),
            pieces,
        })
    }

    /// The text it was parsed from.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Its pieces in order.
    pub fn pieces(&self) -> &[Piece] {
        &self.pieces
    }

    /// Its variables' names in order.
    pub fn variables(&self) -> impl Iterator<Item = &str> {
        self.pieces.iter().filter_map(|piece| match piece {
            Piece::Variable(name) => Some(name.as_str()),
            Piece::Literal(_) => None,
        })
    }

    /// Whether it logs `$name`.
    pub fn has(&self, name: &str) -> bool {
        self.variables().any(|variable| variable == name)
    }

    /// The best time variable it logs ([`TIME_VARIABLES`] order), or an error saying which
    /// one is needed.
    pub fn time_variable(&self) -> Result<TimeVariable, FormatError> {
        if self.has("msec") {
            Ok(TimeVariable::Msec)
        } else if self.has("time_iso8601") {
            Ok(TimeVariable::Iso8601)
        } else if self.has("time_local") {
            Ok(TimeVariable::Local)
        } else {
            Err(FormatError(format!(
                "the log format \"{}\" has no time: it needs $msec, $time_iso8601 or \
                 $time_local",
                self.text
            )))
        }
    }

    /// The value of each variable in `line`, in the format's order, or where the line stops
    /// matching.
    ///
    /// ```
    /// use ratelimit_replay::log_format::{LogFormat, COMBINED};
    ///
    /// let format = LogFormat::parse(COMBINED).unwrap();
    /// let line = "10.0.0.1 - - [14/Nov/2023:22:13:20 +0000] \"GET / HTTP/1.1\" 401 5 \"-\" \"curl/8\"";
    /// let values = format.match_line(line).unwrap();
    /// assert_eq!(values[0], ("remote_addr", "10.0.0.1"));
    /// assert_eq!(values[4], ("status", "401"));
    /// ```
    pub fn match_line<'a>(&'a self, line: &'a str) -> Result<Vec<(&'a str, &'a str)>, Mismatch> {
        let mut values = Vec::new();
        let mut at = 0;
        let mut pieces = self.pieces.iter().peekable();
        while let Some(piece) = pieces.next() {
            let rest = &line[at..];
            match piece {
                Piece::Literal(text) => {
                    if !rest.starts_with(text.as_str()) {
                        return Err(Mismatch {
                            column: at + 1,
                            expected: format!("\"{text}\""),
                            found: excerpt(rest),
                        });
                    }
                    at += text.len();
                }
                Piece::Variable(name) => {
                    let length = match pieces.peek() {
                        Some(Piece::Literal(next)) => {
                            rest.find(next.as_str()).ok_or_else(|| Mismatch {
                                column: at + 1,
                                expected: format!("${name} and then \"{next}\""),
                                found: excerpt(rest),
                            })?
                        }
                        _ => rest.len(),
                    };
                    values.push((name.as_str(), &rest[..length]));
                    at += length;
                }
            }
        }
        if at < line.len() {
            return Err(Mismatch {
                column: at + 1,
                expected: "the end of the line".to_string(),
                found: excerpt(&line[at..]),
            });
        }
        Ok(values)
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Where and why a line does not match a format.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// 1-based byte column where matching stopped.
    pub column: usize,
    /// What the format has there.
    pub expected: String,
    /// The start of what the line has there (or `end of line`).
    pub found: String,
}

impl fmt::Display for Mismatch {
    /// `column 12: expected "[", found "14/Nov/..."`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "column {}: expected {}, found {}",
            self.column, self.expected, self.found
        )
    }
}

/// The first characters of `text`, quoted, or `the end of the line`.
fn excerpt(text: &str) -> String {
    if text.is_empty() {
        return "the end of the line".to_string();
    }
    let mut cut: String = text.chars().take(24).collect();
    if cut.len() < text.len() {
        cut.push_str("...");
    }
    format!("\"{cut}\"")
}

/// Literal text and `$name` / `${name}` variables; names are letters, digits and `_`, as in
/// nginx.
fn parse_pieces(text: &str) -> Result<Vec<Piece>, FormatError> {
    let mut pieces = Vec::new();
    let mut literal = String::new();
    let mut chars = text.char_indices().peekable();
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
    while let Some((at, c)) = chars.next() {
        if c != '$' {
            literal.push(c);
            continue;
        }
        let braced = chars.next_if(|&(_, c)| c == '{').is_some();
        let mut name = String::new();
        while let Some((_, c)) = chars.next_if(|&(_, c)| is_name(c)) {
            name.push(c);
        }
        if braced && chars.next_if(|&(_, c)| c == '}').is_none() {
            return Err(FormatError(format!(
                "the variable at position {} of \"{text}\" misses its closing \"}}\"",
                at + 1
            )));
        }
        if name.is_empty() {
            return Err(FormatError(format!(
                "invalid variable name at position {} of \"{text}\": a \"$\" must be followed \
                 by a name of letters, digits and \"_\", or by \"{{name}}\"",
                at + 1
            )));
        }
        if !literal.is_empty() {
            pieces.push(Piece::Literal(std::mem::take(&mut literal)));
        }
        pieces.push(Piece::Variable(name));
    }
    if !literal.is_empty() {
        pieces.push(Piece::Literal(literal));
    }
    Ok(pieces)
}

/// What a replay keys requests by: a template of the logged variables, like a zone's key
/// (`$binary_remote_addr`, `$remote_addr$http_x_api_key`, `user:$cookie_user`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyTemplate {
    text: String,
    pieces: Vec<Piece>,
}

impl KeyTemplate {
    /// Parse `text` (a zone's key) against the variables `format` logs. `$binary_remote_addr`
    /// reads `$remote_addr` (the same address, as text). A variable the format does not log
    /// is an error naming the ones it does.
    ///
    /// ```
    /// use ratelimit_replay::log_format::{KeyTemplate, LogFormat, COMBINED};
    ///
    /// let format = LogFormat::parse(COMBINED).unwrap();
    /// let key = KeyTemplate::parse("$binary_remote_addr", &format).unwrap();
    /// let values = [("remote_addr", "10.0.0.1")];
    /// assert_eq!(key.render(&values), "10.0.0.1");
    /// assert!(KeyTemplate::parse("$http_x_api_key", &format).is_err());
    /// ```
    pub fn parse(text: &str, format: &LogFormat) -> Result<KeyTemplate, FormatError> {
        let mut pieces = parse_pieces(text)?;
        for piece in &mut pieces {
            if let Piece::Variable(name) = piece {
                if name == "binary_remote_addr" {
                    *name = "remote_addr".to_string();
                }
                if !format.has(name) {
                    let logged: Vec<String> = format.variables().map(|v| format!("${v}")).collect();
                    return Err(FormatError(format!(
                        "the key \"{text}\" needs \"${name}\", which the log format does not \
                         log (it logs {}); give the zone's key with --key",
                        logged.join(" ")
                    )));
                }
            }
        }
        if !pieces.iter().any(|p| matches!(p, Piece::Variable(_))) {
            return Err(FormatError(format!(
                "the key \"{text}\" has no variable: every request would share it"
            )));
        }
        Ok(KeyTemplate {
            text: text.to_string(),
            pieces,
        })
    }

    /// The key's text for a line's `values`; a variable logged as `-` (nginx's empty value)
    /// counts as empty.
    pub fn render(&self, values: &[(&str, &str)]) -> String {
        let mut key = String::new();
        for piece in &self.pieces {
            match piece {
                Piece::Literal(text) => key.push_str(text),
                Piece::Variable(name) => {
                    let value = values
                        .iter()
                        .find(|(variable, _)| variable == name)
                        .map_or("", |(_, value)| *value);
                    if value != "-" {
                        key.push_str(value);
                    }
                }
            }
        }
        key
    }

    /// The text it was parsed from.
    pub fn text(&self) -> &str {
        &self.text
    }
}

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// `$time_local`: `14/Nov/2023:22:13:20 +0000` as epoch nanoseconds and the offset in seconds.
///
/// ```
/// use ratelimit_replay::log_format::parse_time_local;
///
/// assert_eq!(parse_time_local("14/Nov/2023:22:13:20 +0000"), Some((1_700_000_000_000_000_000, 0)));
/// assert_eq!(parse_time_local("14/Nov/2023:23:13:20 +0100"), Some((1_700_000_000_000_000_000, 3600)));
/// assert_eq!(parse_time_local("14/Nov/2023"), None);
/// ```
pub fn parse_time_local(text: &str) -> Option<(u64, i64)> {
    let (date_time, zone) = text.split_once(' ')?;
    let mut parts = date_time.splitn(3, '/');
    let day = number(parts.next()?, 2)?;
    let month_name = parts.next()?;
    let month = MONTHS.iter().position(|&m| m == month_name)? as u64 + 1;
    let rest = parts.next()?;
    let (year, clock) = rest.split_once(':')?;
    let year = number(year, 4)?;
    let seconds = clock_seconds(clock)?;
    let offset = zone_offset(zone)?;
    epoch_ns(year, month, day, seconds, offset)
}

/// `$time_iso8601`: `2023-11-14T22:13:20+00:00` (or `Z`) as epoch nanoseconds and the offset.
///
/// ```
/// use ratelimit_replay::log_format::parse_time_iso8601;
///
/// assert_eq!(parse_time_iso8601("2023-11-14T22:13:20+00:00"), Some((1_700_000_000_000_000_000, 0)));
/// assert_eq!(parse_time_iso8601("2023-11-14T17:13:20-05:00"), Some((1_700_000_000_000_000_000, -18000)));
/// ```
pub fn parse_time_iso8601(text: &str) -> Option<(u64, i64)> {
    let (date, rest) = text.split_once('T')?;
    let mut parts = date.splitn(3, '-');
    let year = number(parts.next()?, 4)?;
    let month = number(parts.next()?, 2)?;
    let day = number(parts.next()?, 2)?;
    if rest.len() < 8 || !rest.is_char_boundary(8) {
        return None;
    }
    let (clock, zone) = rest.split_at(8);
    let seconds = clock_seconds(clock)?;
    let offset = if zone == "Z" {
        0
    } else {
        zone_offset(&zone.replacen(':', "", 1))?
    };
    epoch_ns(year, month, day, seconds, offset)
}

/// Exactly `digits` ASCII digits.
fn number(text: &str, digits: usize) -> Option<u64> {
    if text.len() != digits || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// `HH:MM:SS` in seconds.
fn clock_seconds(text: &str) -> Option<u64> {
    let mut parts = text.split(':');
    let hours = number(parts.next()?, 2)?;
    let minutes = number(parts.next()?, 2)?;
    let seconds = number(parts.next()?, 2)?;
    if parts.next().is_some() || hours > 23 || minutes > 59 || seconds > 60 {
        return None;
    }
    Some(hours * 3600 + minutes * 60 + seconds)
}

/// `+0100` / `-0500` in seconds east of UTC.
fn zone_offset(text: &str) -> Option<i64> {
    let (sign, digits) = match text.split_at_checked(1)? {
        ("+", digits) => (1, digits),
        ("-", digits) => (-1, digits),
        _ => return None,
    };
    let value = number(digits, 4)? as i64;
    let (hours, minutes) = (value / 100, value % 100);
    if minutes > 59 {
        return None;
    }
    Some(sign * (hours * 3600 + minutes * 60))
}

/// Days from 1970-01-01 to the given civil date (proleptic Gregorian), counted through
/// 400-year eras of 146097 days.
fn days_from_civil(year: u64, month: u64, day: u64) -> Option<i64> {
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    let year = year as i64 - i64::from(month <= 2);
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month = month as i64;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day as i64 - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    Some(era * 146_097 + day_of_era - 719_468)
}

fn epoch_ns(year: u64, month: u64, day: u64, seconds: u64, offset: i64) -> Option<(u64, i64)> {
    let days = days_from_civil(year, month, day)?;
    let local = days.checked_mul(86_400)?.checked_add(seconds as i64)?;
    let utc = u64::try_from(local.checked_sub(offset)?).ok()?;
    Some((utc.checked_mul(ratelimit_core::NANOS_PER_SEC)?, offset))
}

/// Decimal seconds (`12`, `0.25`, `1700000000.123`, at most 9 decimals) in nanoseconds;
/// `None` for anything else or a time beyond `u64` nanoseconds.
///
/// ```
/// use ratelimit_replay::log_format::parse_seconds;
///
/// assert_eq!(parse_seconds("0.25"), Some(250_000_000));
/// assert_eq!(parse_seconds("-1"), None);
/// ```
pub fn parse_seconds(text: &str) -> Option<u64> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, "0"));
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(whole) || !all_digits(fraction) || fraction.len() > 9 {
        return None;
    }
    let nanos: u64 = format!("{fraction:0<9}").parse().ok()?;
    whole
        .parse::<u64>()
        .ok()?
        .checked_mul(ratelimit_core::NANOS_PER_SEC)?
        .checked_add(nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines written by Debian's nginx 1.22 with its default `combined` log.
    const DEBIAN_COMBINED: [&str; 3] = [
        "127.0.0.1 - - [01/Dec/2026:18:35:53 +0000] \"GET / HTTP/1.1\" 200 3 \"-\" \"curl/7.88.1\"",
        "127.0.0.1 - - [01/Dec/2026:18:35:53 +0000] \"POST /login HTTP/1.1\" 401 179 \
         \"http://example.com/a b\" \"Mozilla/5.0 (X11; Linux x86_64) \\x22quoted\\x22\"",
        "127.0.0.1 - - [01/Dec/2026:18:35:54 +0000] \"GET /a%20b?x=\\x22y\\x22 HTTP/1.1\" 404 \
         153 \"-\" \"curl/7.88.1\"",
    ];

    #[test]
    fn combined_lines_split_into_variables() {
        let format = LogFormat::parse(COMBINED).unwrap();
        let values = format.match_line(DEBIAN_COMBINED[1]).unwrap();
        #[rustfmt::skip]
        let expected = [
            ("remote_addr", "127.0.0.1"), ("remote_user", "-"),
            ("time_local", "01/Dec/2026:18:35:53 +0000"), ("request", "POST /login HTTP/1.1"),
            ("status", "401"), ("body_bytes_sent", "179"),
            ("http_referer", "http://example.com/a b"),
            ("http_user_agent", "Mozilla/5.0 (X11; Linux x86_64) \\x22quoted\\x22"),
        ];
        assert_eq!(values, expected);
        for line in DEBIAN_COMBINED {
            assert!(format.match_line(line).is_ok(), "{line}");
        }
        // The common format reads combined lines too: its last variable takes the rest.
        let common = LogFormat::parse(COMMON).unwrap();
        let values = common.match_line(DEBIAN_COMBINED[0]).unwrap();
        assert_eq!(values[4], ("status", "200"));
    }

    #[test]
    fn mismatches_say_where_and_what() {
        let format = LogFormat::parse(COMBINED).unwrap();
        #[rustfmt::skip]
        let rows = [
            ("1700000000.123 10.0.0.1 200",
             "column 1: expected $remote_addr and then \" - \", \
              found \"1700000000.123 10.0.0.1 ...\""),
            ("10.0.0.1 - - 14/Nov/2023:22:13:20",
             "column 12: expected $remote_user and then \" [\", \
              found \"- 14/Nov/2023:22:13:20\""),
            ("10.0.0.1 - - [14/Nov/2023:22:13:20 +0000] \"GET / HTTP/1.1\" 200 5 \"-\" \"curl\" x",
             "column 76: expected the end of the line, found \" x\""),
            ("10.0.0.1 - - [14/Nov/2023:22:13:20 +0000",
             "column 15: expected $time_local and then \"] \"\", \
              found \"14/Nov/2023:22:13:20 +00...\""),
        ];
        for (line, message) in rows {
            assert_eq!(format.match_line(line).unwrap_err().to_string(), message);
        }
    }

    #[test]
    fn format_syntax() {
        let format = LogFormat::parse("${msec}|$remote_addr|$status").unwrap();
        assert_eq!(
            format.match_line("1.5|::1|429").unwrap(),
            [("msec", "1.5"), ("remote_addr", "::1"), ("status", "429")]
        );
        assert_eq!(format.time_variable(), Ok(TimeVariable::Msec));
        #[rustfmt::skip]
        let errors = [
            ("$remote_addr$status", "variables \"$remote_addr\" and \"$status\" have no text"),
            ("$ x", "invalid variable name at position 1 of \"$ x\""),
            ("${msec x", "misses its closing \"}\""),
            ("plain text", "has no variable"),
        ];
        for (text, message) in errors {
            let error = LogFormat::parse(text).unwrap_err().to_string();
            assert!(error.contains(message), "{text}: {error}");
        }
        let untimed = LogFormat::parse("$remote_addr $status").unwrap();
        assert!(untimed
            .time_variable()
            .unwrap_err()
            .to_string()
            .contains("it needs $msec, $time_iso8601 or $time_local"));
    }

    #[test]
    fn keys_from_variables() {
        let format = LogFormat::parse("$msec $remote_addr \"$http_x_user\"").unwrap();
        let values = format.match_line("1.0 10.0.0.1 \"alice\"").unwrap();
        let key = KeyTemplate::parse("$remote_addr:${http_x_user}", &format).unwrap();
        assert_eq!(key.render(&values), "10.0.0.1:alice");
        let values = format.match_line("1.0 10.0.0.1 \"-\"").unwrap();
        assert_eq!(key.render(&values), "10.0.0.1:");
        let error = KeyTemplate::parse("$cookie_user", &format)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("it logs $msec $remote_addr $http_x_user"),
            "{error}"
        );
        assert!(KeyTemplate::parse("constant", &format).is_err());
    }

    #[test]
    fn times() {
        #[rustfmt::skip]
        let rows = [
            ("01/Jan/1970:00:00:00 +0000", Some((0, 0))),
            ("29/Feb/2024:12:00:00 +0000", Some((1_709_208_000, 0))),
            ("01/Mar/2000:00:00:00 +0000", Some((951_868_800, 0))),
            ("31/Dec/2099:23:59:59 -0130", Some((4_102_444_799 + 5400, -5400))),
            ("01/Dec/2026:18:35:53 +0000", Some((1_796_150_153, 0))),
            ("01/Foo/2026:18:35:53 +0000", None),
            ("1/Dec/2026:18:35:53 +0000", None),
            ("01/Dec/2026:24:00:00 +0000", None),
            ("01/Dec/2026:18:35:53 0000", None),
            ("01/Jan/1970:00:00:00 +0100", None), // before the epoch
        ];
        for (text, expected) in rows {
            let expected = expected.map(|(s, offset): (u64, i64)| (s * 1_000_000_000, offset));
            assert_eq!(parse_time_local(text), expected, "{text}");
        }
        assert_eq!(
            parse_time_iso8601("2026-12-01T18:35:53Z"),
            Some((1_796_150_153_000_000_000, 0))
        );
        assert_eq!(parse_time_iso8601("2026-12-01 18:35:53+00:00"), None);
        assert_eq!(parse_time_iso8601("2026-12-01T18:35+00:00"), None);
        assert_eq!(
            TimeVariable::Msec.parse("1796150153.250"),
            Some((1_796_150_153_250_000_000, 0))
        );
    }
}
