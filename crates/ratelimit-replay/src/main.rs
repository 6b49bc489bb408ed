//! `ratelimit-replay`: run a timeline or an nginx access log through a zone's algorithm and
//! show, request by request, what the module would have decided; then per-key totals and the
//! smallest limit that would have rejected nothing.

mod plot;

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use ratelimit_core::replay::{
    policy_from_specs, InputFormat, KeySummary, LineReader, Needed, Replay, Request,
};
use ratelimit_core::{Algorithm, Decision, DelayMode, LimitSpec, Policy, ZoneSpec};
use serde_json::json;

/// Exit status for bad arguments, a bad spec or bad input.
const EXIT_BAD_INPUT: u8 = 2;
/// Exit status when the output cannot be written.
const EXIT_OUTPUT: u8 = 1;

/// Replay requests through a rate limit, deciding each as the nginx module would.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// The zone's words after KEY, as in `rate_limit_zone` (zone= may be left out):
    /// 'rate=2r/s burst=5 algorithm=token_bucket'
    #[arg(long)]
    zone: String,

    /// The words of `rate_limit` (zone= may be left out): 'burst=3 nodelay', 'cost=2'
    #[arg(long)]
    limit: Option<String>,

    /// What the input lines are
    #[arg(long, value_enum, default_value_t = Format::Timeline)]
    format: Format,

    /// access-log: the whitespace-separated field (1-based) holding the key
    #[arg(long, value_name = "N", default_value_t = 2)]
    key_field: usize,

    /// One JSON object per request, then one with "summary"
    #[arg(long)]
    json: bool,

    /// Also draw the replay as SVG into FILE: per key (the ones with the most requests when
    /// there are many), requests over time by decision and the bucket's level against its
    /// burst
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,

    /// Input file; standard input when absent or `-`
    input: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Format {
    /// `SECONDS [KEY]` a line, `#` comments
    Timeline,
    /// nginx access log with a format starting `$msec $remote_addr`
    AccessLog,
}

/// Why the replay stopped.
enum Failure {
    /// Bad spec or input: the message is shown, exit status 2.
    Input(String),
    /// Writing the output failed.
    Output(io::Error),
}

impl From<io::Error> for Failure {
    fn from(error: io::Error) -> Failure {
        Failure::Output(error)
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Input(message)) => {
            eprintln!("ratelimit-replay: {message}");
            ExitCode::from(EXIT_BAD_INPUT)
        }
        // `ratelimit-replay ... | head` is not an error.
        Err(Failure::Output(error)) if error.kind() == io::ErrorKind::BrokenPipe => {
            ExitCode::SUCCESS
        }
        Err(Failure::Output(error)) => {
            eprintln!("ratelimit-replay: cannot write the output: {error}");
            ExitCode::from(EXIT_OUTPUT)
        }
    }
}

fn run(args: &Args) -> Result<(), Failure> {
    let policy = parse_policy(args).map_err(Failure::Input)?;
    let format = match args.format {
        Format::Timeline => InputFormat::Timeline,
        Format::AccessLog => InputFormat::AccessLog {
            key_field: args.key_field,
        },
    };
    if args.key_field == 0 {
        return Err(Failure::Input("--key-field counts from 1".to_string()));
    }
    let input: Box<dyn BufRead> = match &args.input {
        Some(path) if path.as_os_str() != "-" => {
            let file = File::open(path).map_err(|error| {
                Failure::Input(format!("cannot open \"{}\": {error}", path.display()))
            })?;
            Box::new(BufReader::new(file))
        }
        _ => Box::new(io::stdin().lock()),
    };

    let mut out = BufWriter::new(io::stdout().lock());
    let output = if args.json {
        Output::Json
    } else {
        Output::Table
    };
    let mut reader = LineReader::new(format);
    let mut replay = Replay::new(policy);
    let mut requests = 0_u64;
    let mut plot = args.plot.as_ref().map(|_| plot::Plot::default());
    for (index, line) in input.split(b'\n').enumerate() {
        let number = index + 1;
        let line = line.map_err(|error| Failure::Input(format!("line {number}: {error}")))?;
        // Access logs may hold bytes that are not UTF-8 in fields we never read.
        let text = String::from_utf8_lossy(&line);
        let text = text.strip_suffix('\r').unwrap_or(&text);
        let request = match reader.read(number, text) {
            Ok(Some(request)) => request,
            Ok(None) => continue,
            Err(error) => {
                out.flush()?;
                let hint = match args.format {
                    Format::Timeline if looks_like_access_log(text) => {
                        " (an nginx access log? add --format access-log)"
                    }
                    _ => "",
                };
                return Err(Failure::Input(format!("{error}{hint}")));
            }
        };
        // The header waits for the first request: an input without any gets an error instead.
        if requests == 0 {
            output.header(&mut out)?;
        }
        requests += 1;
        let decision = replay.decide(&request.key, request.time_ns);
        if let Some(plot) = &mut plot {
            plot.add(&request.key, request.time_ns, &decision);
        }
        output.request(&mut out, &request, &decision)?;
    }
    if requests == 0 {
        let name = match &args.input {
            Some(path) if path.as_os_str() != "-" => format!("\"{}\"", path.display()),
            _ => "the standard input".to_string(),
        };
        return Err(Failure::Input(format!(
            "no requests in {name}: nothing to replay (a timeline has one \"SECONDS [KEY]\" \
             per line; an access log needs --format access-log)"
        )));
    }
    output.summary(&mut out, replay.policy(), &replay.summary())?;
    out.flush()?;
    if let (Some(path), Some(plot)) = (&args.plot, plot) {
        let svg = plot.render(&describe(replay.policy()), replay.policy().limits.burst);
        std::fs::write(path, svg).map_err(|error| {
            Failure::Input(format!("cannot write \"{}\": {error}", path.display()))
        })?;
    }
    Ok(())
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

/// `--zone` and `--limit` as the module would read them; the message is the spec error.
fn parse_policy(args: &Args) -> Result<Policy, String> {
    let zone_words: Vec<&str> = args.zone.split_whitespace().collect();
    let zone = ZoneSpec::parse_words(&zone_words).map_err(|error| format!("--zone: {error}"))?;
    let limit = match &args.limit {
        Some(words) => {
            let words: Vec<&str> = words.split_whitespace().collect();
            Some(LimitSpec::parse_words(&words).map_err(|error| format!("--limit: {error}"))?)
        }
        None => None,
    };
    policy_from_specs(&zone, limit.as_ref()).map_err(|error| format!("--limit: {error}"))
}

#[derive(Clone, Copy)]
enum Output {
    Table,
    Json,
}

impl Output {
    fn header(self, out: &mut impl Write) -> io::Result<()> {
        match self {
            Output::Table => writeln!(
                out,
                "{:<16} {:<16} {:<9} {:>10} {:>14} {:>9}",
                "t", "key", "decision", "delay_ms", "retry_after_ms", "remaining"
            ),
            Output::Json => Ok(()),
        }
    }

    fn request(
        self,
        out: &mut impl Write,
        request: &Request,
        decision: &Decision,
    ) -> io::Result<()> {
        match self {
            Output::Table => writeln!(
                out,
                "{:<16} {:<16} {:<9} {:>10} {:>14} {:>9}",
                request.time_text,
                request.key,
                decision.outcome.as_str(),
                millis_text(decision.delay_ns),
                retry_text(decision),
                decision.remaining
            ),
            Output::Json => {
                let object = json!({
                    "line": request.line,
                    "t": seconds(request.time_ns),
                    "key": request.key,
                    "decision": decision.outcome.as_str(),
                    "delay_ms": millis(decision.delay_ns),
                    "retry_after_ms": (!decision.never_passes())
                        .then(|| millis(decision.retry_after_ns)),
                    "remaining": decision.remaining,
                    "reset_ms": millis(decision.reset_ns),
                    "excess": decision.excess_milli as f64 / 1000.0,
                });
                writeln!(out, "{object}")
            }
        }
    }

    fn summary(self, out: &mut impl Write, policy: &Policy, keys: &[KeySummary]) -> io::Result<()> {
        match self {
            Output::Table => {
                let needed_column = match keys.first().map(|key| key.needed) {
                    Some(Needed::RequestsPerWindow(_)) => "min_requests_per_window",
                    _ => "min_burst",
                };
                writeln!(out)?;
                writeln!(out, "summary: {}", describe(policy))?;
                let width = needed_column.len();
                writeln!(
                    out,
                    "{:<16} {:>9} {:>9} {:>9} {needed_column:>width$}",
                    "key", "passed", "delayed", "rejected"
                )?;
                for key in keys {
                    let needed = match key.needed {
                        Needed::Burst(n) | Needed::RequestsPerWindow(n) => n,
                    };
                    writeln!(
                        out,
                        "{:<16} {:>9} {:>9} {:>9} {needed:>width$}",
                        key.key, key.passed, key.delayed, key.rejected
                    )?;
                }
                Ok(())
            }
            Output::Json => {
                let keys: Vec<_> = keys
                    .iter()
                    .map(|key| {
                        let mut object = json!({
                            "key": key.key,
                            "passed": key.passed,
                            "delayed": key.delayed,
                            "rejected": key.rejected,
                        });
                        let (name, value) = match key.needed {
                            Needed::Burst(n) => ("min_burst", n),
                            Needed::RequestsPerWindow(n) => ("min_requests_per_window", n),
                        };
                        object[name] = json!(value);
                        object
                    })
                    .collect();
                let summary = json!({
                    "summary": {
                        "policy": describe(policy),
                        "algorithm": policy.algorithm.as_str(),
                        "rate": policy.limits.rate.to_string(),
                        "burst": policy.limits.burst,
                        "cost": policy.cost,
                        "keys": keys,
                    }
                });
                writeln!(out, "{summary}")
            }
        }
    }
}

/// `rate=2r/s burst=5 nodelay algorithm=leaky_bucket cost=1`: the words that matter for the
/// zone's algorithm.
fn describe(policy: &Policy) -> String {
    let mut words = vec![format!("rate={}", policy.limits.rate)];
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
        Algorithm::SlidingLog | Algorithm::SlidingWindow => {}
    }
    words.push(format!("algorithm={}", policy.algorithm));
    words.push(format!("cost={}", policy.cost));
    words.join(" ")
}

/// Milliseconds with three decimals (microseconds, rounded down): `1500.000`.
fn millis_text(ns: u64) -> String {
    format!("{}.{:03}", ns / 1_000_000, ns / 1_000 % 1_000)
}

/// `retry_after_ms` in the table: `never` for a request no wait lets through (it costs more
/// than the limit admits at once).
fn retry_text(decision: &Decision) -> String {
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
