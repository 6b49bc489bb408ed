//! Configuration errors, worded as nginx words its own (`invalid rate "%V"`,
//! `zone "%V" is too small`), each quoting the token at fault.

use ratelimit_core::sync_spec::SyncSpecError;
use ratelimit_core::SpecError;

use super::tls::TlsFileError;

#[derive(Debug, thiserror::Error)]
pub enum ConfError {
    /// nginx said why already (an allocation or a complex value that failed): nothing to add.
    #[error("")]
    Logged,
    /// `invalid parameter "zone=a:1m\xff"`: a word that is not UTF-8.
    #[error("invalid parameter \"{0}\"")]
    InvalidParameter(String),
    /// `invalid parameter "wirte=on", did you mean "write=on"?`: a word of a directive, then
    /// `ratelimit_core::hint::parameter_hint`.
    #[error("invalid parameter \"{word}\"{hint}")]
    UnknownParameter { word: String, hint: String },
    /// A parameter of `rate_limit_zone` or `rate_limit` (the directive names a missing one).
    #[error("{}", spec_message(.directive, .error))]
    Spec {
        directive: &'static str,
        error: SpecError,
    },
    #[error("{0}")]
    Sync(#[from] SyncSpecError),
    #[error("{0}")]
    Tls(#[from] TlsFileError),
    /// A usage-based line (`usage=`) on a zone that cannot carry it.
    #[error("\"usage\" {reason}: zone \"{zone}\" {what}")]
    Usage {
        reason: &'static str,
        zone: String,
        what: String,
    },
    #[error("\"{0}\" must have \"zone\" parameter")]
    NoZone(&'static str),
    #[error("zone \"{name}\" is too small{hint}")]
    ZoneTooSmall { name: String, hint: String },
    #[error("duplicate zone \"{0}\"")]
    DuplicateZone(String),
    /// A `rate_limit_zone` of the name in the other context (`http` or `stream`): the two
    /// would share one memory.
    #[error(
        "zone \"{name}\" is already declared in the \"{other}\" block: http and stream zones \
         share one namespace (nginx's shared memory names), give this one another name"
    )]
    ZoneInOtherContext { name: String, other: &'static str },
    /// A `rate_limit` word that the stream block does not take.
    #[error("\"{word}\" is not available in the stream block: {why}")]
    NotInStream {
        word: &'static str,
        why: &'static str,
    },
    /// A stream zone with `sync`: the fleet's `rate_limit_sync` lives in the `http` block,
    /// which must be read first.
    #[error(
        "stream zone \"{0}\" has \"sync\" but no \"rate_limit_sync\" is configured in an \
         http block before the stream block"
    )]
    StreamSyncNotConfigured(String),
    /// `prices=NAME` naming no `rate_limit_prices` block, then the hint of `unknown_zone`.
    #[error("unknown price table \"{name}\"{hint}")]
    UnknownPrices { name: String, hint: String },
    #[error("duplicate rate_limit_prices \"{0}\"")]
    DuplicatePrices(String),
    #[error(
        "rate_limit_prices \"{0}\" has no price: give lines such as \
         \"gpt-4o input=2.5 output=10;\" or \"default input=1 output=4;\""
    )]
    EmptyPrices(String),
    #[error("duplicate limit \"{0}\"")]
    DuplicateLimit(String),
    #[error("\"{0}\" directive is duplicate")]
    Duplicate(&'static str),
    /// `rate_limit_admin` in a regex or named location, whose requests' paths do not start
    /// with the location's name: the API could not find its routes there.
    #[error(
        "\"rate_limit_admin\" cannot be used in the {kind} location \"{name}\": the API's \
         paths follow the location's prefix, so it needs a prefix location, such as \
         \"location /ratelimit/ {{ rate_limit_admin; }}\""
    )]
    AdminLocation { kind: &'static str, name: String },
    /// `rate_limit_log_level`: the value, then the valid levels, in the words of nginx's own
    /// `on`/`off` error.
    #[error(
        "invalid value \"{0}\" in \"rate_limit_log_level\" directive, it must be \"info\", \
         \"notice\", \"warn\" or \"error\""
    )]
    InvalidLogLevel(String),
    #[error("invalid status \"{0}\": value must be between 400 and 599")]
    InvalidStatus(isize),
    #[error("invalid state file path \"\"")]
    EmptyStateFile,
    /// `usage=$rate_limit_usage_cost` and the like: a line charged by its own settlement.
    #[error(
        "invalid \"{word}=${name}\": ${name} is what a usage= line settled, known only after \
         the response, so no line can be charged or reserved by it; use usage=openai, \
         usage=anthropic, usage=gemini or a variable of your own"
    )]
    OwnUsageVariable { word: &'static str, name: String },
    #[error("invalid Redis URL \"{url}\": {reason}")]
    InvalidRedisUrl { url: String, reason: String },
    #[error("invalid Redis URL \"{0}\": several URLs need \"cluster\"")]
    UrlsNeedCluster(String),
    /// Found once the `http` block is read: a zone `rate_limit` names that does not exist,
    /// then `ratelimit_core::hint::unknown_zone_hint` (the zone meant, or the zones declared).
    #[error("unknown zone \"{name}\"{hint}")]
    UnknownZone { name: String, hint: String },
    #[error(
        "{role} \"{zone}\" used with \"global=\" must use algorithm=token_bucket, not {algorithm}"
    )]
    GlobalNeedsTokenBucket {
        role: &'static str,
        zone: String,
        algorithm: ratelimit_core::Algorithm,
    },
    #[error("\"burst\" is not used by {algorithm} (zone \"{zone}\")")]
    BurstNotUsed {
        algorithm: ratelimit_core::Algorithm,
        zone: String,
    },
    #[error(
        "\"{word}\" is not used by concurrency zone \"{zone}\": requests over its limit wait \
         in its queue (\"queue=\", or \"burst=\" here) or are rejected"
    )]
    DelayNotUsed { word: &'static str, zone: String },
    #[error(
        "global zone \"{0}\" has \"block\": a global zone keeps one bucket for every key, \
         so blocking it would block everyone; put block= on the key's own zone"
    )]
    GlobalWithBlock(String),
    #[error("zone \"{0}\" has \"sync\" but no \"rate_limit_sync\" is configured")]
    SyncNotConfigured(String),
    /// An error about the `rate_limit` line at FILE:LINE, found after the whole `http` block
    /// was read (when nginx's own position is its `}`).
    #[error("{error} in {file}:{line}")]
    At {
        error: Box<ConfError>,
        file: String,
        line: usize,
    },
}

impl ConfError {
    /// `unknown zone "NAME"` among the zones `declared` (by name) in the same block.
    pub fn unknown_zone<'a>(name: &str, declared: impl Iterator<Item = &'a str>) -> ConfError {
        let declared: Vec<&str> = declared.collect();
        ConfError::UnknownZone {
            name: name.to_string(),
            hint: ratelimit_core::hint::unknown_zone_hint(name, &declared),
        }
    }
}

fn spec_message(directive: &str, error: &SpecError) -> String {
    match error {
        SpecError::MissingParameter(_) => format!("\"{directive}\" {error}"),
        _ => error.to_string(),
    }
}
