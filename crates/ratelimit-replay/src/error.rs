//! Why a replay stops: bad options, input it cannot read, or output it cannot write.

use std::io;
use std::path::PathBuf;

use ratelimit_core::SpecError;
use ratelimit_replay::log_format::FormatError;
use ratelimit_replay::replay::InputError;

/// A replay that cannot go on. [`ReplayError::Output`] exits with status 1, every other
/// with 2 (bad arguments, a bad spec or bad input).
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("--zone: {0}")]
    Zone(SpecError),
    #[error("--limit: {0}")]
    Limit(SpecError),
    #[error("--prices: {0}")]
    Prices(SpecError),
    #[error(
        "--prices FILE prices a line with prices=NAME: give --limit 'usage=openai prices=NAME' \
         (NAME a rate_limit_prices block of FILE)"
    )]
    PricesWithoutTable,
    /// `--calibrate` or `--plot` on a quota zone.
    #[error(
        "{0} is not available for quota zones (algorithm=quota): the summary's min_limit is \
         the most a key counted in one period"
    )]
    QuotaUnsupported(&'static str),
    #[error("--key-field counts from 1")]
    KeyFieldZero,
    #[error("--log-format: {0}")]
    LogFormat(FormatError),
    #[error("--key: {0}")]
    Key(FormatError),
    #[error(
        "--key-field is for access logs starting with $msec; this log is read with a log \
         format: name the key's variables with --key '$variable'"
    )]
    KeyFieldWithLogFormat,
    #[error(
        "--key is for logs read with a log format (combined, common, --log-format); this \
         access log starts with $msec: name the key's field with --key-field N"
    )]
    KeyWithAccessLog,
    #[error("--key and --key-field are for access logs; a timeline line is \"SECONDS [KEY]\"")]
    KeyWithTimeline,
    #[error(
        "--limit: on_status needs each request's status, and the {0} log format has no \
         $status"
    )]
    NoStatusInFormat(String),
    #[error(
        "--limit: on_status needs each request's status: replay an access log with $status \
         (combined, common, or --log-format with $status)"
    )]
    NoStatus,
    #[error("cannot open \"{}\": {error}", path.display())]
    Open { path: PathBuf, error: io::Error },
    #[error("line {line}: {error}")]
    Read { line: usize, error: io::Error },
    /// A line the format in use cannot read, and a hint of the format it may be in.
    #[error("{error}{hint}")]
    BadLine { error: InputError, hint: String },
    #[error(
        "line {line}: not a format read without --log-format: not a timeline \
         (\"SECONDS [KEY]\"), not an access log starting with $msec $remote_addr, and not \
         nginx's {}; give the log_format of the access_log that wrote it with \
         --log-format '...' (from nginx.conf)",
        refusals.join("; nor ")
    )]
    UnknownFormat { line: usize, refusals: Vec<String> },
    /// `input` names the input: a quoted path or "the standard input".
    #[error(
        "no requests in {input}: nothing to replay (a timeline has one \"SECONDS [KEY]\" per \
         line; an access log one request per line)"
    )]
    NoRequests { input: String },
    #[error("cannot write \"{}\": {error}", path.display())]
    WritePlot { path: PathBuf, error: io::Error },
    #[error(
        "--limit: usage= needs a zone with algorithm=leaky_bucket, token_bucket or quota (a \
         key's overrun is carried as a debt in its bucket or its count); this zone is {0}"
    )]
    UsageZone(String),
    #[error(
        "--limit: reserve={0} is not replayable: the replay reserves the same number of \
         tokens for every request; give reserve=N (a whole number from 1, e.g. a typical \
         reservation)"
    )]
    ReserveVariable(String),
    #[error("{0} is not available with --limit usage=...")]
    UsageUnsupported(&'static str),
    #[error(
        "--limit usage=...: each request's tokens are read from the access log's \
         ${variable}, and {format} has none: give the log_format that wrote the log with \
         --log-format '... ${variable}' (usage=openai|anthropic|gemini|azure read \
         $rate_limit_usage_cost)"
    )]
    UsageNotInFormat { variable: String, format: String },
    #[error(
        "line {line}: ${variable} \"{value}\" is not a number of tokens: it must be a \
         non-negative integer, or - (or empty) when the request reported no usage"
    )]
    BadUsage {
        line: usize,
        variable: String,
        value: String,
    },
    #[error(
        "line {line}: $request_time \"{value}\" is not a duration: it must be seconds, \
         such as 0.250"
    )]
    BadRequestTime { line: usize, value: String },
    #[error(
        "--calibrate is for usage-based limits (--limit 'usage=$VARIABLE reserve=N'); for \
         a request limit the summary's min_burst is the smallest burst that refuses nothing"
    )]
    CalibrateWithoutUsage,
    #[error(
        "--calibrate {max_refused}: even burst={burst} (the largest the zone's rate allows) \
         refuses {refused} of the {requests} requests; raise the rate, or allow more \
         refusals"
    )]
    CalibrationUnreachable {
        max_refused: u64,
        burst: u64,
        refused: u64,
        requests: usize,
    },
    #[error("cannot write the output: {0}")]
    Output(#[from] io::Error),
}

impl ReplayError {
    /// The exit status: 1 when the output cannot be written, 2 for everything the user can
    /// fix in the arguments or the input.
    pub fn exit_status(&self) -> u8 {
        match self {
            ReplayError::Output(_) => 1,
            _ => 2,
        }
    }
}
