//! The replay tool's input: timelines (`SECONDS [KEY]`), access logs whose fields start with
//! `$msec`, and logs in any nginx `log_format` ([`crate::log_format`]), read line by line into
//! [`Request`]s for `ratelimit_core::replay`'s engine.

use ratelimit_core::NANOS_PER_SEC;

pub use crate::log_format::parse_seconds;
use crate::log_format::{FormatError, KeyTemplate, LogFormat, TimeVariable};

/// The key of timeline lines that name none: all such requests share it.
pub const DEFAULT_KEY: &str = "-";

/// What the input lines are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InputFormat {
    /// `SECONDS [KEY]` a line; `#` starts a comment; blank lines are skipped.
    Timeline,
    /// nginx access log lines whose format starts with `$msec`; the key is the whitespace-
    /// separated field `key_field` (1-based; 2 is `$remote_addr` after `$msec`).
    AccessLog {
        /// 1-based index of the field holding the key.
        key_field: usize,
    },
    /// nginx access log lines in a `log_format` (`combined`, `common` or the user's own).
    Log(LogInput),
}

/// How to read an access log written with a `log_format`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogInput {
    /// What the format is called in messages: `combined`, `common`, `--log-format`.
    pub name: String,
    /// The format.
    pub format: LogFormat,
    /// Which variable holds the time.
    pub time: TimeVariable,
    /// What requests are keyed by.
    pub key: KeyTemplate,
}

impl LogInput {
    /// Read `format` (called `name` in messages), keying requests by `key` (a zone's key such
    /// as `$binary_remote_addr`).
    pub fn new(name: &str, format: &str, key: &str) -> Result<LogInput, FormatError> {
        let format = LogFormat::parse(format)?;
        let time = format.time_variable()?;
        let key = KeyTemplate::parse(key, &format)?;
        Ok(LogInput {
            name: name.to_string(),
            format,
            time,
            key,
        })
    }
}

/// One request read from the input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// 1-based line number in the input.
    pub line: usize,
    /// Its time, as written (`0.25`, `1700000000.123`), or as placed within its second
    /// ([`SecondSpreader`]).
    pub time_text: String,
    /// Its time in nanoseconds.
    pub time_ns: u64,
    /// Its key ([`DEFAULT_KEY`] when a timeline line names none).
    pub key: String,
    /// Its response status, when the log has `$status`.
    pub status: Option<u16>,
    /// Its time has whole seconds only (`$time_local`, `$time_iso8601`).
    pub whole_second: bool,
    /// The UTC offset its time was written with, in seconds (0 when none was written).
    pub utc_offset_s: i64,
    /// The values of the variables asked for with [`LineReader::with_fields`], in that
    /// order (empty when the log format has no such variable, or is not a log format).
    pub fields: Vec<String>,
}

/// A bad input line: `line 3: invalid time "abc"`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {problem}")]
pub struct InputError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong, quoting the bad token.
    pub problem: String,
}

/// Reads input lines one by one, checking that times never go backwards.
#[derive(Clone, Debug)]
pub struct LineReader {
    format: InputFormat,
    previous: Option<(u64, String)>,
    fields: Vec<String>,
}

impl LineReader {
    /// A reader for `format`.
    pub fn new(format: InputFormat) -> LineReader {
        LineReader {
            format,
            previous: None,
            fields: Vec::new(),
        }
    }

    /// Also keep, in each request's [`Request::fields`], the values of these log format
    /// variables (names without `$`).
    pub fn with_fields(mut self, names: &[&str]) -> LineReader {
        self.fields = names.iter().map(|name| name.to_string()).collect();
        self
    }

    /// The format it reads.
    pub fn format(&self) -> &InputFormat {
        &self.format
    }

    /// The request on line `line` (1-based), `None` for a blank or comment line.
    pub fn read(&mut self, line: usize, text: &str) -> Result<Option<Request>, InputError> {
        let problem = |problem: String| InputError { line, problem };
        let mut fields = vec![String::new(); self.fields.len()];
        let read = match &self.format {
            InputFormat::Timeline => read_timeline(text),
            InputFormat::AccessLog { key_field } => read_access_log(text, *key_field),
            InputFormat::Log(input) => read_log(input, text, &self.fields, &mut fields),
        };
        let Some(read) = read.map_err(problem)? else {
            return Ok(None);
        };
        let time_ns = self.in_order(&read).map_err(problem)?;
        self.previous = Some((time_ns, read.time_text.clone()));
        Ok(Some(Request {
            line,
            time_text: read.time_text,
            time_ns,
            key: read.key,
            status: read.status,
            whole_second: read.whole_second,
            utc_offset_s: read.utc_offset_s,
            fields,
        }))
    }

    /// The time of `read`, checked against the previous request's: never earlier, except a
    /// whole-second time at most a second late, which counts in the second being read.
    fn in_order(&self, read: &LineRead) -> Result<u64, String> {
        let Some((previous_ns, previous_text)) = &self.previous else {
            return Ok(read.time_ns);
        };
        if read.time_ns >= *previous_ns {
            return Ok(read.time_ns);
        }
        // Workers write whole-second times as they finish requests: a line can come a
        // second late. It counts in the second being read.
        if read.whole_second && *previous_ns - read.time_ns <= NANOS_PER_SEC {
            return Ok(*previous_ns);
        }
        Err(format!(
            "time \"{}\" is earlier than the previous request's \"{previous_text}\"",
            read.time_text
        ))
    }
}

/// What one line says, before its time is checked against the previous line's.
struct LineRead {
    time_text: String,
    key: String,
    status: Option<u16>,
    time_ns: u64,
    utc_offset_s: i64,
    whole_second: bool,
}

/// A timeline line: `SECONDS [KEY]`, `#` starting a comment.
fn read_timeline(text: &str) -> Result<Option<LineRead>, String> {
    let text = text.split_once('#').map_or(text, |(before, _)| before);
    let mut fields = text.split_whitespace();
    let Some(time) = fields.next() else {
        return Ok(None);
    };
    let key = fields.next().unwrap_or(DEFAULT_KEY);
    if let Some(extra) = fields.next() {
        return Err(format!("unexpected \"{extra}\" after the key"));
    }
    let time_ns = parse_seconds(time).ok_or_else(|| format!("invalid time \"{time}\""))?;
    Ok(Some(LineRead::at_seconds(time, key, time_ns)))
}

/// An access log line whose first field is `$msec`, keyed by its field `key_field` (1-based).
fn read_access_log(text: &str, key_field: usize) -> Result<Option<LineRead>, String> {
    let mut fields = text.split_whitespace();
    let Some(time) = fields.next() else {
        return Ok(None);
    };
    let key = match key_field {
        0 => return Err("key field 0: fields count from 1".to_string()),
        1 => time,
        n => text
            .split_whitespace()
            .nth(n - 1)
            .ok_or_else(|| format!("no field {n} for the key"))?,
    };
    let time_ns = parse_seconds(time).ok_or_else(|| format!("invalid time \"{time}\""))?;
    Ok(Some(LineRead::at_seconds(time, key, time_ns)))
}

/// A line of `input`'s log format; the values of the variables `names` go into `fields`.
fn read_log(
    input: &LogInput,
    text: &str,
    names: &[String],
    fields: &mut [String],
) -> Result<Option<LineRead>, String> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    let values = input
        .format
        .match_line(text)
        .map_err(|mismatch| format!("does not match the {} log format: {mismatch}", input.name))?;
    let value = |name: &str| {
        values
            .iter()
            .find(|(variable, _)| *variable == name)
            .map(|(_, value)| *value)
    };
    let time_name = input.time.name();
    let time_text = value(&time_name[1..]).unwrap_or_default();
    let (time_ns, offset) = input
        .time
        .parse(time_text)
        .ok_or_else(|| format!("invalid {time_name} \"{time_text}\""))?;
    let status = match value("status") {
        Some(text) => Some(
            text.parse::<u16>()
                .ok()
                .filter(|status| (100..=999).contains(status))
                .ok_or_else(|| format!("invalid $status \"{text}\""))?,
        ),
        None => None,
    };
    for (field, name) in fields.iter_mut().zip(names) {
        *field = value(name).unwrap_or_default().to_string();
    }
    Ok(Some(LineRead {
        time_text: time_text.to_string(),
        key: input.key.render(&values),
        status,
        time_ns,
        utc_offset_s: offset,
        whole_second: input.time.whole_seconds(),
    }))
}

impl LineRead {
    /// A line of a timeline or `$msec` log: a time in seconds, no status, no offset.
    fn at_seconds(time: &str, key: &str, time_ns: u64) -> LineRead {
        LineRead {
            time_text: time.to_string(),
            key: key.to_string(),
            status: None,
            time_ns,
            utc_offset_s: 0,
            whole_second: false,
        }
    }
}

/// Places requests whose log time has whole seconds only: the `k` requests logged in one
/// second are spread evenly over it, in log order, at `S + i/k` s (`i = 0..k`). A second's
/// requests are released when a later second starts, or by [`SecondSpreader::finish`].
/// Requests with finer times go through unchanged.
///
/// ```
/// use ratelimit_replay::input::{InputFormat, LineReader, LogInput, SecondSpreader};
/// use ratelimit_replay::log_format::COMMON;
///
/// let input = LogInput::new("common", COMMON, "$remote_addr").unwrap();
/// let mut reader = LineReader::new(InputFormat::Log(input));
/// let mut spreader = SecondSpreader::default();
/// let mut placed = Vec::new();
/// for (i, second) in ["20", "20", "20", "21"].iter().enumerate() {
///     let line = format!("10.0.0.1 - - [14/Nov/2023:22:13:{second} +0000] \"GET / HTTP/1.1\" 200 5");
///     let request = reader.read(i + 1, &line).unwrap().unwrap();
///     placed.extend(spreader.push(request));
/// }
/// placed.extend(spreader.finish());
/// let times: Vec<&str> = placed.iter().map(|r| r.time_text.as_str()).collect();
/// assert_eq!(times, ["1700000000.000", "1700000000.333", "1700000000.667", "1700000001.000"]);
/// ```
#[derive(Clone, Debug, Default)]
pub struct SecondSpreader {
    pending: Vec<Request>,
}

impl SecondSpreader {
    /// Take one request; returns the requests now placed, in order.
    pub fn push(&mut self, request: Request) -> Vec<Request> {
        if !request.whole_second {
            let mut placed = self.finish();
            placed.push(request);
            return placed;
        }
        let placed = match self.pending.first() {
            Some(first) if first.time_ns != request.time_ns => self.finish(),
            _ => Vec::new(),
        };
        self.pending.push(request);
        placed
    }

    /// Place the requests still held.
    pub fn finish(&mut self) -> Vec<Request> {
        let count = self.pending.len() as u64;
        let mut placed = std::mem::take(&mut self.pending);
        for (index, request) in placed.iter_mut().enumerate() {
            // Below one second: no overflow for any count.
            let offset_ns = index as u64 * NANOS_PER_SEC / count.max(1);
            request.time_ns = request.time_ns.saturating_add(offset_ns);
            let millis = (request.time_ns + 500_000) / 1_000_000;
            request.time_text = format!("{}.{:03}", millis / 1000, millis % 1000);
        }
        placed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_format_reader_keeps_the_fields_asked_for() {
        let input = LogInput::new(
            "--log-format",
            "$msec $remote_addr $request_time $upstream_http_x_tokens",
            "$remote_addr",
        )
        .unwrap();
        let mut reader = LineReader::new(InputFormat::Log(input)).with_fields(&[
            "upstream_http_x_tokens",
            "request_time",
            "status",
        ]);
        let request = reader.read(1, "10.5 10.0.0.1 0.250 420").unwrap().unwrap();
        assert_eq!(
            (request.key.as_str(), request.time_ns),
            ("10.0.0.1", 10_500_000_000)
        );
        // A variable the format lacks reads as empty.
        assert_eq!(request.fields, ["420", "0.250", ""]);
        // A reader that asks for none keeps none.
        let mut plain = LineReader::new(InputFormat::Timeline);
        assert!(plain.read(1, "1 alice").unwrap().unwrap().fields.is_empty());
    }

    #[test]
    fn timeline_lines() {
        let mut reader = LineReader::new(InputFormat::Timeline);
        assert_eq!(reader.read(1, "# a comment"), Ok(None));
        assert_eq!(reader.read(2, "   "), Ok(None));
        let request = reader.read(3, "0.25 alice # first").unwrap().unwrap();
        assert_eq!(
            (request.time_ns, request.key.as_str()),
            (250_000_000, "alice")
        );
        let request = reader.read(4, "1").unwrap().unwrap();
        assert_eq!(
            (request.time_ns, request.key.as_str(), request.line),
            (NANOS_PER_SEC, "-", 4)
        );
        #[rustfmt::skip]
        let errors = [
            ("abc", "line 9: invalid time \"abc\""),
            ("1.0000000001", "line 9: invalid time \"1.0000000001\""),
            ("-1", "line 9: invalid time \"-1\""),
            ("2 bob extra", "line 9: unexpected \"extra\" after the key"),
            ("0.5", "line 9: time \"0.5\" is earlier than the previous request's \"1\""),
        ];
        for (line, message) in errors {
            assert_eq!(reader.read(9, line).unwrap_err().to_string(), message);
        }
    }

    #[test]
    fn access_log_lines() {
        let line =
            "1700000000.123 10.0.0.1 - - [14/Nov/2023:22:13:20 +0000] \"GET / HTTP/1.1\" 200";
        let mut reader = LineReader::new(InputFormat::AccessLog { key_field: 2 });
        let request = reader.read(1, line).unwrap().unwrap();
        assert_eq!(request.time_ns, 1_700_000_000_123_000_000);
        assert_eq!(
            (request.key.as_str(), request.time_text.as_str()),
            ("10.0.0.1", "1700000000.123")
        );
        let mut by_status = LineReader::new(InputFormat::AccessLog { key_field: 10 });
        assert_eq!(by_status.read(1, line).unwrap().unwrap().key, "200");
        let mut too_far = LineReader::new(InputFormat::AccessLog { key_field: 11 });
        assert_eq!(
            too_far.read(7, line).unwrap_err().to_string(),
            "line 7: no field 11 for the key"
        );
        assert_eq!(reader.read(2, "").unwrap(), None);
        let bad = reader.read(3, "[14/Nov/2023] 10.0.0.1").unwrap_err();
        assert_eq!(bad.to_string(), "line 3: invalid time \"[14/Nov/2023]\"");
    }
}
