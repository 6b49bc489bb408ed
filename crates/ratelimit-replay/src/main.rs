//! `ratelimit-replay`: run a timeline or an nginx access log through a zone's algorithm and
//! show, request by request, what the module would have decided; then per-key totals and the
//! smallest limit that would have rejected nothing.

#![forbid(unsafe_code)]
mod error;
mod plot;
mod table;
mod usage;

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use ratelimit_core::{penalty, Algorithm, DelayMode, LimitSpec, Policy, ZoneSpec};
use ratelimit_replay::log_format;
use ratelimit_replay::replay::{
    parse_seconds, policy_from_specs, InputFormat, KeySummary, LineReader, LogInput, Needed,
    Replay, Request, SecondSpreader, Verdict,
};
use serde_json::json;

use error::ReplayError;

/// Replay requests through a rate limit, deciding each as the nginx module would.
#[derive(Debug, Parser)]
#[command(version, about, after_help = AFTER_HELP)]
struct Args {
    /// The zone's words after KEY, as in `rate_limit_zone` (zone= may be left out):
    /// 'rate=2r/s burst=5 algorithm=token_bucket', 'rate=5r/m burst=5 block=15m block_max=24h'
    #[arg(long)]
    zone: String,

    /// The words of `rate_limit` (zone= may be left out): 'burst=3 nodelay', 'cost=2',
    /// 'nodelay on_status=401,403' (on_status needs a log with $status).
    /// 'usage=$VARIABLE reserve=N [debt=N] [on_missing=keep]' replays a usage-based (token)
    /// limit: each request's tokens are read from the log's $VARIABLE (give --log-format);
    /// usage=openai|anthropic|gemini|azure read $rate_limit_usage_cost, the weighted cost the
    /// module logs. See "Usage-based limits" below
    #[arg(long)]
    limit: Option<String>,

    /// With --limit 'usage=... prices=NAME': the file (nginx.conf, or one holding just the
    /// block) whose `rate_limit_prices NAME { ... }` prices each request from the model and
    /// tokens its log line names ($rate_limit_usage_model, _prompt_tokens,
    /// _completion_tokens, _cached_tokens): a money budget replayed on a log recorded
    /// without it
    #[arg(long, value_name = "FILE")]
    prices: Option<PathBuf>,

    /// With --limit usage=...: print the smallest burst (the token budget, at the zone's
    /// rate) that refuses at most MAX_REFUSED of the log's requests, instead of the replay
    #[arg(long, value_name = "MAX_REFUSED")]
    calibrate: Option<u64>,

    /// What the input lines are; `auto` tells from the first line: a timeline, an access log
    /// starting with $msec, or nginx's `combined` or the `common` log format
    #[arg(long, value_enum, default_value_t = Format::Auto)]
    format: Format,

    /// The `log_format` string of the access log, as in nginx.conf:
    /// '$remote_addr [$time_local] "$request" $status'. Times come from $msec,
    /// $time_iso8601 or $time_local
    #[arg(long, value_name = "STRING", conflicts_with = "format")]
    log_format: Option<String>,

    /// The zone's key, for logs read with a log format (combined, common, --log-format):
    /// variables of that format, as in `rate_limit_zone KEY` ($binary_remote_addr reads
    /// $remote_addr)
    /// [default: $remote_addr]
    #[arg(long, value_name = "KEY")]
    key: Option<String>,

    /// access-log: the whitespace-separated field (1-based) holding the key [default: 2]
    #[arg(long, value_name = "N")]
    key_field: Option<usize>,

    /// One JSON object per request, then one with "summary"
    #[arg(long)]
    json: bool,

    /// Show a log's times as seconds since the Unix epoch (as $msec writes them) instead of
    /// RFC 3339 UTC (2026-12-01T18:52:55.250Z). A timeline's times are shown as written
    #[arg(long)]
    epoch_times: bool,

    /// Also draw the replay as SVG into FILE: per key (the ones with the most requests when
    /// there are many), requests over time by decision and the key's level against its limit
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,

    /// Input file; standard input when absent or `-`
    input: Option<PathBuf>,
}

const AFTER_HELP: &str = "\
Logs with whole-second times ($time_local, $time_iso8601, as in combined and common): the k
requests logged in one second are spread evenly over it in log order, at S, S+1/k, ... S+(k-1)/k.
A line up to one second older than the one before it (two workers finishing at a second's
edge) counts in the newer second. Log times are when requests ended, not when they came.

Usage-based limits (--limit 'usage=$VARIABLE reserve=N'): a request reserves N tokens when it
came and is settled with the tokens of its log field when it ended (a refund, or a charge into
debt up to debt=, by default one burst). When the format has $request_time a request came at
its log time minus $request_time, else at its log time. A usage field of - (or empty) follows
on_missing=: refund (the default) charges 0 tokens, keep charges the reservation.
reserve=$variable cannot be replayed: give reserve=N.";

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Format {
    /// Tell from the first line
    Auto,
    /// `SECONDS [KEY]` a line, `#` comments
    Timeline,
    /// nginx access log with a format starting `$msec $remote_addr`
    AccessLog,
    /// nginx's default access log format (`access_log FILE;`)
    Combined,
    /// the Common Log Format (combined without referer and user agent)
    Common,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        // `ratelimit-replay ... | head` is not an error.
        Err(ReplayError::Output(error)) if error.kind() == io::ErrorKind::BrokenPipe => {
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("ratelimit-replay: {error}");
            ExitCode::from(error.exit_status())
        }
    }
}

/// The input: the file named, or the standard input.
fn open_input(args: &Args) -> Result<Box<dyn BufRead>, ReplayError> {
    Ok(match &args.input {
        Some(path) if path.as_os_str() != "-" => {
            let file = File::open(path).map_err(|error| ReplayError::Open {
                path: path.clone(),
                error,
            })?;
            Box::new(BufReader::new(file))
        }
        _ => Box::new(io::stdin().lock()),
    })
}

/// The input in messages: a quoted path or "the standard input".
fn input_name(args: &Args) -> String {
    match &args.input {
        Some(path) if path.as_os_str() != "-" => format!("\"{}\"", path.display()),
        _ => "the standard input".to_string(),
    }
}

fn run(args: &Args) -> Result<(), ReplayError> {
    let (policy, zone, limit) = parse_policy(args)?;
    if args.key_field == Some(0) {
        return Err(ReplayError::KeyFieldZero);
    }
    if let Some(spec) = limit.as_ref().and_then(|l| l.usage.as_ref()) {
        let on_status = limit.as_ref().is_some_and(|l| l.on_status.is_some());
        let setup = usage::setup(args, policy, &zone, spec, on_status)?;
        let format = chosen_format(args)?;
        if let Some(format) = &format {
            check_key_options(format, args)?;
        }
        return usage::run(args, format, setup, open_input(args)?, input_name(args));
    }
    if args.calibrate.is_some() {
        return Err(ReplayError::CalibrateWithoutUsage);
    }
    let mut reader = chosen_format(args)?.map(LineReader::new);
    if let Some(reader) = &reader {
        check_status(reader.format(), limit.as_ref())?;
        check_key_options(reader.format(), args)?;
    }
    let input = open_input(args)?;

    let mut out = BufWriter::new(io::stdout().lock());
    let columns = Columns {
        json: args.json,
        status: limit.as_ref().is_some_and(|l| l.on_status.is_some()),
        block: zone.block.is_some(),
        wall_clock: false,
    };
    let mut sink = Sink {
        columns,
        replay: Replay::new(policy)
            .with_quota(zone.quota.clone())
            .with_penalty(zone.block, limit.and_then(|l| l.on_status)),
        requests: 0,
        plot: args.plot.as_ref().map(|_| plot::Plot::default()),
    };
    let mut spreader = SecondSpreader::default();
    for line in numbered_lines(input) {
        let (number, text) = line?;
        let text = text.as_str();
        let reader = match &mut reader {
            Some(reader) => reader,
            None => {
                let trimmed = text.trim();
                if trimmed.is_empty() || trimmed.starts_with('#') {
                    continue;
                }
                let format = detect(number, text, args)?;
                check_status(&format, parse_policy(args).ok().and_then(|p| p.2).as_ref())?;
                check_key_options(&format, args)?;
                reader.insert(LineReader::new(format))
            }
        };
        sink.columns.wall_clock =
            !args.epoch_times && !matches!(reader.format(), InputFormat::Timeline);
        let request = match reader.read(number, text) {
            Ok(Some(request)) => request,
            Ok(None) => continue,
            Err(error) => {
                out.flush()?;
                let hint = hint(reader.format(), number, text, args);
                return Err(ReplayError::BadLine { error, hint });
            }
        };
        for request in spreader.push(request) {
            sink.request(&mut out, &request)?;
        }
    }
    for request in spreader.finish() {
        sink.request(&mut out, &request)?;
    }
    if sink.requests == 0 {
        return Err(ReplayError::NoRequests {
            input: input_name(args),
        });
    }
    sink.columns
        .summary(&mut out, &sink.replay, &sink.replay.summary())?;
    out.flush()?;
    if let (Some(path), Some(plot)) = (&args.plot, &sink.plot) {
        let policy = sink.replay.policy();
        let svg = plot.render(&describe(&sink.replay), policy);
        std::fs::write(path, svg).map_err(|error| ReplayError::WritePlot {
            path: path.clone(),
            error,
        })?;
        let (keys, drawn) = plot.counts();
        eprintln!(
            "ratelimit-replay: plot written to {} ({drawn} of {keys} keys drawn)",
            path.display()
        );
    }
    Ok(())
}

/// The input's lines, numbered from 1, without a line's final `\r`. Access logs may hold
/// bytes that are not UTF-8 in fields never read: they are replaced, not refused.
fn numbered_lines(
    input: impl BufRead,
) -> impl Iterator<Item = Result<(usize, String), ReplayError>> {
    input.split(b'\n').enumerate().map(|(index, line)| {
        let number = index + 1;
        let line = line.map_err(|error| ReplayError::Read {
            line: number,
            error,
        })?;
        let text = String::from_utf8_lossy(&line);
        Ok((number, text.strip_suffix('\r').unwrap_or(&text).to_owned()))
    })
}

/// Where decided requests go: the table or JSON, the plot, the count.
struct Sink {
    columns: Columns,
    replay: Replay,
    requests: u64,
    plot: Option<plot::Plot>,
}

impl Sink {
    fn request(&mut self, out: &mut impl Write, request: &Request) -> Result<(), ReplayError> {
        // The header waits for the first request: an input without any gets an error instead.
        if self.requests == 0 {
            self.columns.header(out)?;
        }
        self.requests += 1;
        let verdict = self
            .replay
            .decide_request(&request.key, request.time_ns, request.status);
        if let Some(plot) = &mut self.plot {
            plot.add(
                &request.key,
                request.time_ns,
                request.utc_offset_s,
                &verdict,
            );
        }
        self.columns.request(out, request, &verdict)?;
        Ok(())
    }
}

/// The zone's key for log formats: `--key`, `$remote_addr` by default.
fn key_of(args: &Args) -> &str {
    args.key.as_deref().unwrap_or("$remote_addr")
}

/// `--key` is for log formats, `--key-field` for `$msec` access logs and timelines have
/// keys of their own: an option the format does not read is an error, not ignored.
fn check_key_options(format: &InputFormat, args: &Args) -> Result<(), ReplayError> {
    match format {
        InputFormat::Log(_) if args.key_field.is_some() => Err(ReplayError::KeyFieldWithLogFormat),
        InputFormat::AccessLog { .. } if args.key.is_some() => Err(ReplayError::KeyWithAccessLog),
        InputFormat::Timeline if args.key.is_some() || args.key_field.is_some() => {
            Err(ReplayError::KeyWithTimeline)
        }
        _ => Ok(()),
    }
}

/// The format the options name, or `None` for `--format auto` (told from the first line).
fn chosen_format(args: &Args) -> Result<Option<InputFormat>, ReplayError> {
    let log = |name: &str, format: &str| {
        LogInput::new(name, format, key_of(args))
            .map(|input| Some(InputFormat::Log(input)))
            .map_err(ReplayError::LogFormat)
    };
    if let Some(format) = &args.log_format {
        return log("--log-format", format);
    }
    match args.format {
        Format::Auto => Ok(None),
        Format::Timeline => Ok(Some(InputFormat::Timeline)),
        Format::AccessLog => Ok(Some(InputFormat::AccessLog {
            key_field: args.key_field.unwrap_or(2),
        })),
        Format::Combined => log("combined", log_format::COMBINED),
        Format::Common => log("common", log_format::COMMON),
    }
}

/// `--format auto`: the format of the first line that is not blank or a comment.
fn detect(number: usize, text: &str, args: &Args) -> Result<InputFormat, ReplayError> {
    // A line starting with a number is a timeline's (its errors then say what is wrong)
    // unless it reads like an access log starting with `$msec $remote_addr`.
    let starts_with_time = text
        .split_whitespace()
        .next()
        .is_some_and(|first| parse_seconds(first).is_some());
    if looks_like_access_log(text) {
        return Ok(InputFormat::AccessLog {
            key_field: args.key_field.unwrap_or(2),
        });
    }
    if starts_with_time {
        return Ok(InputFormat::Timeline);
    }
    let mut refusals = Vec::new();
    for (name, format) in [
        ("combined", log_format::COMBINED),
        ("common", log_format::COMMON),
    ] {
        let input = LogInput::new(name, format, key_of(args)).map_err(ReplayError::Key)?;
        match input.format.match_line(text) {
            Ok(_) => return Ok(InputFormat::Log(input)),
            Err(mismatch) => refusals.push(format!("{name}: {mismatch}")),
        }
    }
    Err(ReplayError::UnknownFormat {
        line: number,
        refusals,
    })
}

/// `on_status=` needs each request's status: refuse a format without one.
fn check_status(format: &InputFormat, limit: Option<&LimitSpec>) -> Result<(), ReplayError> {
    if limit.is_none_or(|l| l.on_status.is_none()) {
        return Ok(());
    }
    match format {
        InputFormat::Log(input) if input.format.has("status") => Ok(()),
        InputFormat::Log(input) => Err(ReplayError::NoStatusInFormat(input.name.to_string())),
        _ => Err(ReplayError::NoStatus),
    }
}

/// What to add to a bad line's message: the format in use and how to read another one, and
/// when the line is in another format the tool knows (a log whose format changed midway),
/// which.
fn hint(format: &InputFormat, number: usize, text: &str, args: &Args) -> String {
    let mixed = match detect(number, text, args) {
        Ok(other) if kind(&other) != kind(format) => format!(
            "; this line reads as {}: a log mixing formats is replayed one format at a time, \
             the lines of each in a file of their own",
            kind(&other)
        ),
        _ => String::new(),
    };
    let another = "for another log_format give it with --log-format '...'";
    match format {
        InputFormat::Timeline if looks_like_access_log(text) => {
            " (an nginx access log? add --format access-log)".to_string()
        }
        InputFormat::Timeline if mixed.is_empty() => String::new(),
        InputFormat::Timeline => {
            format!(" (format in use: a timeline, \"SECONDS [KEY]\" a line{mixed}; {another})")
        }
        InputFormat::AccessLog { key_field } => format!(
            " (format in use: an access log starting with $msec, the key in field \
             {key_field}{mixed}; {another})"
        ),
        InputFormat::Log(input) if args.log_format.is_some() => format!(
            " (format in use: --log-format '{}'{mixed}; is it the log_format of the access_log \
             that wrote this file, as in nginx.conf?)",
            input.format
        ),
        InputFormat::Log(input) => format!(
            " (format in use: nginx's {} '{}'{mixed}; {another})",
            input.name, input.format
        ),
    }
}

/// What kind of input a format reads, to tell a line of one from a line of another.
fn kind(format: &InputFormat) -> String {
    match format {
        InputFormat::Timeline => "a timeline".to_string(),
        InputFormat::AccessLog { .. } => "an access log starting with $msec".to_string(),
        InputFormat::Log(input) => format!("nginx's {} format", input.name),
    }
}

/// Whether a line the timeline reader refused reads like a line of an access log in the
/// format the tool reads (`$msec $remote_addr ...`): a time, an IP address, more fields.
fn looks_like_access_log(line: &str) -> bool {
    let mut fields = line.split_whitespace();
    let time = fields
        .next()
        .is_some_and(|time| time.parse::<f64>().is_ok());
    let address = fields
        .next()
        .is_some_and(|address| address.parse::<std::net::IpAddr>().is_ok());
    time && address && fields.next().is_some()
}

/// `--zone` and `--limit` as the module reads them (`block=` and `on_status=` included); the
/// message is the spec error.
fn parse_policy(args: &Args) -> Result<(Policy, ZoneSpec, Option<LimitSpec>), ReplayError> {
    let zone_words: Vec<&str> = args.zone.split_whitespace().collect();
    let zone = ZoneSpec::parse_words(&zone_words).map_err(ReplayError::Zone)?;
    if zone.quota.is_some() && args.plot.is_some() {
        return Err(ReplayError::QuotaUnsupported("--plot"));
    }
    let limit = match &args.limit {
        Some(words) => {
            let words: Vec<&str> = words.split_whitespace().collect();
            Some(LimitSpec::parse_words(&words).map_err(ReplayError::Limit)?)
        }
        None => None,
    };
    let policy = policy_from_specs(&zone, limit.as_ref()).map_err(ReplayError::Limit)?;
    Ok((policy, zone, limit))
}

/// What each output line shows: the table or JSON, with the status and block columns when
/// `on_status=` and `block=` are replayed.
#[derive(Clone, Copy)]
struct Columns {
    json: bool,
    status: bool,
    block: bool,
    /// Times are a log's (seconds since the Unix epoch): shown in RFC 3339, UTC.
    wall_clock: bool,
}

impl Columns {
    /// The width of the time column.
    fn time_width(self) -> usize {
        if self.wall_clock {
            24
        } else {
            16
        }
    }

    fn header(self, out: &mut impl Write) -> io::Result<()> {
        if self.json {
            return Ok(());
        }
        write!(
            out,
            "{:<width$} {:<16} {:<9} {:>10} {:>14} {:>9}",
            "t",
            "key",
            "decision",
            "delay_ms",
            "retry_after_ms",
            "remaining",
            width = self.time_width()
        )?;
        if self.status {
            write!(out, " {:>6} {:>7}", "status", "charged")?;
        }
        if self.block {
            write!(out, " {:<14}", "block")?;
        }
        writeln!(out)
    }

    fn request(self, out: &mut impl Write, request: &Request, verdict: &Verdict) -> io::Result<()> {
        let decision = &verdict.decision;
        if self.json {
            let mut object = json!({
                "line": request.line,
                "t": seconds(request.time_ns),
                "key": request.key,
                "decision": verdict.as_str(),
                "delay_ms": millis(decision.delay_ns),
                "retry_after_ms": (!decision.never_passes())
                    .then(|| millis(decision.retry_after_ns)),
                "remaining": decision.remaining,
                "reset_ms": millis(decision.reset_ns),
                "excess": decision.excess_milli as f64 / 1000.0,
            });
            if self.wall_clock {
                object["time"] = json!(rfc3339(request.time_ns));
            }
            if self.status {
                object["status"] = json!(request.status);
                object["charged"] = json!(verdict.charged);
            }
            if self.block {
                object["block"] = match &verdict.block {
                    Some(block) => json!({
                        "level": block.level,
                        "duration_ms": millis(block.duration_ns()),
                        "until": seconds(block.until_ns),
                    }),
                    None => serde_json::Value::Null,
                };
            }
            return writeln!(out, "{object}");
        }
        let time = if self.wall_clock {
            rfc3339(request.time_ns)
        } else {
            request.time_text.clone()
        };
        write!(
            out,
            "{time:<width$} {:<16} {:<9} {:>10} {:>14} {:>9}",
            table::key_cell(&request.key),
            verdict.as_str(),
            millis_text(decision.delay_ns),
            retry_text(decision),
            decision.remaining,
            width = self.time_width()
        )?;
        if self.status {
            let status = request.status.map_or("-".to_string(), |s| s.to_string());
            let charged = if verdict.charged { "yes" } else { "no" };
            write!(out, " {status:>6} {charged:>7}")?;
        }
        if self.block {
            let block = match &verdict.block {
                Some(block) => format!(
                    "{},level={}",
                    penalty::duration_text(block.duration_ns()),
                    block.level
                ),
                None => "-".to_string(),
            };
            write!(out, " {block:<14}")?;
        }
        writeln!(out)
    }

    fn summary(self, out: &mut impl Write, replay: &Replay, keys: &[KeySummary]) -> io::Result<()> {
        let policy = replay.policy();
        let needed_of = |key: &KeySummary| match key.needed {
            Needed::Burst(n) => ("min_burst", n),
            Needed::RequestsPerWindow(n) => ("min_requests_per_window", n),
            Needed::Limit(n) => ("min_limit", n),
        };
        if self.json {
            let keys: Vec<_> = keys
                .iter()
                .map(|key| {
                    let mut object = json!({
                        "key": key.key,
                        "passed": key.passed,
                        "delayed": key.delayed,
                        "rejected": key.rejected,
                    });
                    if self.block {
                        object["blocked"] = json!(key.blocked);
                        object["blocks"] = json!(key.blocks);
                        object["longest_block_ms"] = json!(millis(key.longest_block_ns));
                    }
                    if self.status {
                        object["uncharged"] = json!(key.uncharged);
                    }
                    let (name, value) = needed_of(key);
                    object[name] = json!(value);
                    object
                })
                .collect();
            let summary = json!({
                "summary": {
                    "policy": describe(replay),
                    "algorithm": policy.algorithm.as_str(),
                    "rate": policy.limits.rate.to_string(),
                    "burst": policy.limits.burst,
                    "cost": policy.cost,
                    "keys": keys,
                }
            });
            return writeln!(out, "{summary}");
        }
        let needed_column = match keys.first().map(|key| key.needed) {
            Some(Needed::RequestsPerWindow(_)) => "min_requests_per_window",
            Some(Needed::Limit(_)) => "min_limit",
            _ => "min_burst",
        };
        writeln!(out)?;
        writeln!(out, "summary: {}", describe(replay))?;
        let width = needed_column.len();
        let key_width = table::key_column_width(keys.iter().map(|key| key.key.as_str()));
        write!(
            out,
            "{:<key_width$} {:>9} {:>9} {:>9}",
            "key", "passed", "delayed", "rejected"
        )?;
        if self.block {
            write!(
                out,
                " {:>9} {:>6} {:>13}",
                "blocked", "blocks", "longest_block"
            )?;
        }
        if self.status {
            write!(out, " {:>9}", "uncharged")?;
        }
        writeln!(out, " {needed_column:>width$}")?;
        for key in keys {
            write!(
                out,
                "{:<key_width$} {:>9} {:>9} {:>9}",
                key.key, key.passed, key.delayed, key.rejected
            )?;
            if self.block {
                let longest = if key.blocks == 0 {
                    "-".to_string()
                } else {
                    penalty::duration_text(key.longest_block_ns)
                };
                write!(out, " {:>9} {:>6} {longest:>13}", key.blocked, key.blocks)?;
            }
            if self.status {
                write!(out, " {:>9}", key.uncharged)?;
            }
            writeln!(out, " {:>width$}", needed_of(key).1)?;
        }
        Ok(())
    }
}

/// `rate=2r/s burst=5 nodelay algorithm=leaky_bucket cost=1`: the words that matter for the
/// zone's algorithm, then `block=`, `block_max=` and `on_status=` when replayed.
fn describe(replay: &Replay) -> String {
    let policy = replay.policy();
    let mut words = match replay.calendar() {
        Some(calendar) => vec![
            format!("limit={}", policy.limits.quota_limit()),
            format!("period={}", calendar.unit.as_str()),
            format!("tz={}", calendar.tz_name),
        ],
        None => vec![format!("rate={}", policy.limits.rate)],
    };
    match policy.algorithm {
        Algorithm::LeakyBucket => {
            words.push(format!("burst={}", policy.limits.burst));
            match policy.delay {
                DelayMode::Delay => {}
                DelayMode::NoDelay => words.push("nodelay".to_string()),
                DelayMode::Threshold(n) => words.push(format!("delay={n}")),
            }
        }
        Algorithm::TokenBucket => words.push(format!("burst={}", policy.limits.burst)),
        // A concurrency zone is refused when the zone's words are read.
        Algorithm::SlidingLog
        | Algorithm::SlidingWindow
        | Algorithm::Concurrency
        | Algorithm::Quota(_) => {}
    }
    words.push(format!("algorithm={}", policy.algorithm));
    words.push(format!("cost={}", policy.cost));
    if let Some(block) = replay.block_policy() {
        words.push(format!("block={}", penalty::duration_text(block.block_ns)));
        if block.block_max_ns != block.block_ns {
            words.push(format!(
                "block_max={}",
                penalty::duration_text(block.block_max_ns)
            ));
        }
    }
    if let Some(on_status) = replay.on_status() {
        words.push(format!("on_status={on_status}"));
    }
    words.join(" ")
}

/// A log's time (nanoseconds since the Unix epoch) in RFC 3339, UTC, to the millisecond:
/// `2026-12-01T18:52:55.250Z`.
fn rfc3339(time_ns: u64) -> String {
    let seconds = i64::try_from(time_ns / 1_000_000_000).unwrap_or(i64::MAX);
    let nanos = (time_ns % 1_000_000_000) as u32;
    match chrono::DateTime::from_timestamp(seconds, nanos) {
        Some(time) => time.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        None => format!(
            "{}.{:03}",
            time_ns / 1_000_000_000,
            time_ns / 1_000_000 % 1_000
        ),
    }
}

/// Milliseconds with three decimals (microseconds, rounded down): `1500.000`.
fn millis_text(ns: u64) -> String {
    format!("{}.{:03}", ns / 1_000_000, ns / 1_000 % 1_000)
}

/// `retry_after_ms` in the table: `never` for a request no wait lets through (it costs more
/// than the limit admits at once).
fn retry_text(decision: &ratelimit_core::Decision) -> String {
    if decision.never_passes() {
        "never".to_string()
    } else {
        millis_text(decision.retry_after_ns)
    }
}

/// The same as a JSON number.
fn millis(ns: u64) -> f64 {
    (ns / 1_000) as f64 / 1_000.0
}

/// Nanoseconds as the nearest `f64` of seconds, so JSON shows `1796049057.702` for a logged
/// `1796049057.702` (dividing by 1e9 in floating point would print `...7020001`).
fn seconds(time_ns: u64) -> f64 {
    let text = format!("{}.{:09}", time_ns / 1_000_000_000, time_ns % 1_000_000_000);
    text.parse().unwrap_or(time_ns as f64 / 1e9)
}
