//! Usage mode: `--limit 'usage=$VAR reserve=N [debt=N]'` replays a usage-based (token) limit.
//! Each logged request reserves `reserve` tokens when it came (its end minus `$request_time`)
//! and is settled with the tokens its log line names when it ended
//! ([`ratelimit_replay::replay_usage`], the module's own arithmetic).

use std::collections::HashMap;
use std::io::{self, BufRead, Write};

use ratelimit_core::quota::QuotaSpec;
use ratelimit_core::usage::prices::PriceTable;
use ratelimit_core::usage::settle::{self, End};
use ratelimit_core::usage::{Amount, OnMissing, Usage, UsageSource, UsageSpec};
use ratelimit_core::{Algorithm, Limits, Policy, ZoneSpec};
use ratelimit_replay::log_format::parse_seconds;
use ratelimit_replay::replay::{InputFormat, LineReader, LogInput, SecondSpreader};
use ratelimit_replay::replay_usage::{smallest_burst, UsageKeySummary, UsageReplay, UsageRequest};
use serde_json::json;

use crate::error::ReplayError;
use crate::{rfc3339, Args};

/// The log variable that holds the weighted cost of the built-in readers (`usage=openai`,
/// `anthropic`, `gemini`): what the request's first usage-based line charged.
pub const COST_VARIABLE: &str = "rate_limit_usage_cost";

/// The log variable a usage limit's tokens are read from (without `$`).
pub fn usage_variable(usage: &UsageSpec) -> &str {
    match &usage.source {
        UsageSource::Variable(name) => name,
        UsageSource::Reader(_) => COST_VARIABLE,
    }
}

/// One request read from the log, before the replay.
struct Logged {
    line: usize,
    request: UsageRequest,
    /// The usage field was `-` or empty.
    missing: bool,
}

/// What usage mode needs besides the policy: the checked words.
pub struct UsageSetup {
    pub policy: Policy,
    /// `usage=openai`, `usage=$v`: as given.
    pub usage_word: String,
    pub variable: String,
    pub reserve: u64,
    pub debt: Option<u64>,
    pub on_missing: OnMissing,
    /// A quota zone's limit and calendar.
    pub quota: Option<QuotaSpec>,
    /// `prices=NAME` with `--prices FILE`: each request's cost is priced from the model and
    /// tokens its log line names ([`PRICED_FIELDS`]) instead of read from `$variable`.
    pub prices: Option<PriceTable>,
}

/// The log variables a priced replay reads: the model, then the prompt, completion and cached
/// tokens.
pub const PRICED_FIELDS: [&str; 4] = [
    "rate_limit_usage_model",
    "rate_limit_usage_prompt_tokens",
    "rate_limit_usage_completion_tokens",
    "rate_limit_usage_cached_tokens",
];

impl UsageSetup {
    /// The log variables the usage is read from.
    fn usage_fields(&self) -> Vec<&str> {
        match &self.prices {
            Some(_) => PRICED_FIELDS.to_vec(),
            None => vec![self.variable.as_str()],
        }
    }
}

/// Check that `usage` can be replayed on `zone` with these options.
pub fn setup(
    args: &Args,
    policy: Policy,
    zone: &ZoneSpec,
    usage: &UsageSpec,
    on_status: bool,
) -> Result<UsageSetup, ReplayError> {
    if !matches!(
        zone.algorithm,
        Algorithm::LeakyBucket | Algorithm::TokenBucket | Algorithm::Quota(_)
    ) {
        return Err(ReplayError::UsageZone(zone.algorithm.to_string()));
    }
    if zone.quota.is_some() && args.calibrate.is_some() {
        return Err(ReplayError::QuotaUnsupported("--calibrate"));
    }
    let reserve = match &usage.reserve {
        Amount::Fixed(n) => *n,
        Amount::Variable(name) => return Err(ReplayError::ReserveVariable(format!("${name}"))),
        Amount::Auto(_) => return Err(ReplayError::ReserveVariable("auto".into())),
    };
    if args.plot.is_some() {
        return Err(ReplayError::UsageUnsupported("--plot"));
    }
    if on_status {
        return Err(ReplayError::UsageUnsupported("on_status="));
    }
    let prices = match (&usage.prices, &args.prices) {
        (Some(name), Some(path)) => {
            let text = std::fs::read_to_string(path).map_err(|error| ReplayError::Open {
                path: path.clone(),
                error,
            })?;
            Some(PriceTable::from_conf_text(&text, name).map_err(ReplayError::Prices)?)
        }
        (None, Some(_)) => return Err(ReplayError::PricesWithoutTable),
        // The logged $rate_limit_usage_cost of a priced line is already micro-dollars.
        (_, None) => None,
    };
    Ok(UsageSetup {
        policy,
        variable: usage_variable(usage).to_string(),
        usage_word: match &usage.source {
            UsageSource::Reader(provider) => format!("usage={}", provider.as_str()),
            UsageSource::Variable(name) => format!("usage=${name}"),
        },
        reserve,
        debt: usage.debt,
        on_missing: usage.on_missing,
        quota: zone.quota.clone(),
        prices,
    })
}

/// The log format usage mode reads: one with every usage variable.
fn usage_input(format: Option<InputFormat>, variables: &[&str]) -> Result<LogInput, ReplayError> {
    let missing = |input: &LogInput| {
        variables
            .iter()
            .find(|variable| !input.format.has(variable))
            .map(|variable| variable.to_string())
    };
    let variable = variables.first().copied().unwrap_or_default();
    match format {
        Some(InputFormat::Log(input)) if missing(&input).is_none() => Ok(input),
        Some(InputFormat::Log(input)) => Err(ReplayError::UsageNotInFormat {
            variable: missing(&input).unwrap_or_default(),
            format: if input.name == "--log-format" {
                format!("--log-format '{}'", input.format)
            } else {
                format!("nginx's {} log format '{}'", input.name, input.format)
            },
        }),
        Some(InputFormat::Timeline) => Err(ReplayError::UsageNotInFormat {
            variable: variable.to_string(),
            format: "a timeline".to_string(),
        }),
        Some(InputFormat::AccessLog { .. }) | None => Err(ReplayError::UsageNotInFormat {
            variable: variable.to_string(),
            format: "an access log read without --log-format".to_string(),
        }),
    }
}

/// Read the whole log into requests in start order.
fn read_log(
    input: Box<dyn BufRead>,
    log: LogInput,
    setup: &UsageSetup,
    reserved: u64,
) -> Result<Vec<Logged>, ReplayError> {
    let has_request_time = log.format.has("request_time");
    let format = log.format.clone();
    let mut fields = setup.usage_fields();
    let usage_count = fields.len();
    if has_request_time {
        fields.push("request_time");
    }
    let mut reader = LineReader::new(InputFormat::Log(log)).with_fields(&fields);
    let mut spreader = SecondSpreader::default();
    // Per line: (used, missing, request_time_ns), joined to the reader's request by line.
    let mut extras: HashMap<usize, (u64, bool, u64)> = HashMap::new();
    let mut logged = Vec::new();
    let mut place = |request: ratelimit_replay::replay::Request,
                     extras: &mut HashMap<usize, (u64, bool, u64)>| {
        let (used, missing, duration_ns) = extras.remove(&request.line).unwrap_or_default();
        logged.push(Logged {
            line: request.line,
            request: UsageRequest {
                key: request.key,
                start_ns: request.time_ns.saturating_sub(duration_ns),
                end_ns: request.time_ns,
                used,
            },
            missing,
        });
    };
    for line in crate::numbered_lines(input) {
        let (number, text) = line?;
        let text = text.as_str();
        let request = match reader.read(number, text) {
            Ok(Some(request)) => request,
            Ok(None) => continue,
            Err(error) => {
                let hint = format!(
                    " (format in use: --log-format '{format}'; is it the log_format of the \
                     access_log that wrote this file, as in nginx.conf?)"
                );
                return Err(ReplayError::BadLine { error, hint });
            }
        };
        let field = request.fields.first().map_or("", |field| field.trim());
        let (used, missing) = if let Some(table) = &setup.prices {
            priced(number, &request.fields, table, reserved, setup.on_missing)?
        } else if field.is_empty() || field == "-" {
            let end = End::Complete;
            let used = settle::charged_tokens(reserved, None, end, setup.on_missing);
            (used, true)
        } else {
            let used = field.parse::<u64>().map_err(|_| ReplayError::BadUsage {
                line: number,
                variable: setup.variable.clone(),
                value: field.to_string(),
            })?;
            (used, false)
        };
        let duration_ns = match request.fields.get(usage_count) {
            Some(text) => {
                parse_seconds(text.trim()).ok_or_else(|| ReplayError::BadRequestTime {
                    line: number,
                    value: text.trim().to_string(),
                })?
            }
            None => 0,
        };
        extras.insert(number, (used, missing, duration_ns));
        for request in spreader.push(request) {
            place(request, &mut extras);
        }
    }
    for request in spreader.finish() {
        place(request, &mut extras);
    }
    // The replay decides requests when they came; the log wrote them when they ended.
    logged.sort_by_key(|logged| logged.request.start_ns);
    Ok(logged)
}

/// A priced line's cost from its log fields (model, prompt, completion, cached tokens): the
/// table's price of the model; a usage of `-` follows `on_missing=`, and a model the table
/// does not price (or `-`) is charged at the table's highest prices, as in the module.
fn priced(
    line: usize,
    fields: &[String],
    table: &PriceTable,
    reserved: u64,
    on_missing: OnMissing,
) -> Result<(u64, bool), ReplayError> {
    let field = |index: usize| fields.get(index).map_or("", |field| field.trim());
    let tokens = |index: usize| -> Result<Option<u64>, ReplayError> {
        let text = field(index);
        if text.is_empty() || text == "-" {
            return Ok(None);
        }
        text.parse().map(Some).map_err(|_| ReplayError::BadUsage {
            line,
            variable: PRICED_FIELDS[index].to_string(),
            value: text.to_string(),
        })
    };
    let Some(prompt_tokens) = tokens(1)? else {
        let used = settle::charged_tokens(reserved, None, End::Complete, on_missing);
        return Ok((used, true));
    };
    let usage = Usage {
        prompt_tokens,
        completion_tokens: tokens(2)?.unwrap_or(0),
        cached_tokens: tokens(3)?.unwrap_or(0),
        total_tokens: 0,
    };
    let model = match field(0) {
        "" | "-" => None,
        model => Some(model),
    };
    let (weights, _) = table.price_for(model, None);
    Ok((weights.cost(&usage), false))
}

/// `--limit usage=...`: replay the log, or calibrate with `--calibrate`.
pub fn run(
    args: &Args,
    format: Option<InputFormat>,
    setup: UsageSetup,
    input: Box<dyn BufRead>,
    input_name: String,
) -> Result<(), ReplayError> {
    let log = usage_input(format, &setup.usage_fields())?;
    let mut replay = match &setup.quota {
        Some(quota) => UsageReplay::quota(&setup.policy, quota.clone(), setup.reserve, setup.debt),
        None => UsageReplay::new(&setup.policy, setup.reserve, setup.debt),
    }
    .map_err(|error| ReplayError::UsageZone(error.0))?;
    let logged = read_log(input, log, &setup, replay.reserved())?;
    if logged.is_empty() {
        return Err(ReplayError::NoRequests { input: input_name });
    }
    let mut out = io::BufWriter::new(io::stdout().lock());
    if let Some(max_refused) = args.calibrate {
        return calibrate(&mut out, args, &setup, &logged, max_refused);
    }
    let width = if args.epoch_times { 14 } else { 24 };
    if !args.json {
        writeln!(
            out,
            "{:<width$} {:<16} {:<9} {:>9} {:>9}",
            "t", "key", "decision", "reserved", "used"
        )?;
    }
    for logged in &logged {
        let admitted = replay.request(&logged.request);
        let decision = if admitted { "ADMITTED" } else { "REFUSED" };
        let request = &logged.request;
        if args.json {
            let mut object = json!({
                "line": logged.line,
                "t": crate::seconds(request.start_ns),
                "end": crate::seconds(request.end_ns),
                "key": request.key,
                "decision": decision,
                "reserved": replay.reserved(),
                "used": request.used,
                "usage_missing": logged.missing,
            });
            if !args.epoch_times {
                object["time"] = json!(rfc3339(request.start_ns));
            }
            writeln!(out, "{object}")?;
        } else {
            let used = if logged.missing {
                format!("-({})", request.used)
            } else {
                request.used.to_string()
            };
            writeln!(
                out,
                "{:<width$} {:<16} {decision:<9} {:>9} {used:>9}",
                time_text(request.start_ns, args.epoch_times),
                crate::table::key_cell(&request.key),
                replay.reserved(),
            )?;
        }
    }
    let first = logged.iter().map(|l| l.request.start_ns).min().unwrap_or(0);
    let last = logged.iter().map(|l| l.request.end_ns).max().unwrap_or(0);
    summary(&mut out, args, &setup, &replay, last.saturating_sub(first))?;
    out.flush()?;
    Ok(())
}

/// `rate=600r/m burst=1000 algorithm=token_bucket usage=$v reserve=400 debt=1000`
fn describe(setup: &UsageSetup, burst: u64, reserved: u64) -> String {
    let policy = &setup.policy;
    let mut words = match &setup.quota {
        Some(quota) => vec![
            format!("limit={}", quota.limit),
            format!("period={}", quota.calendar.unit.as_str()),
            format!("tz={}", quota.calendar.tz_name),
        ],
        None => vec![
            format!("rate={}", policy.limits.rate),
            format!("burst={burst}"),
        ],
    };
    words.extend([
        format!("algorithm={}", policy.algorithm),
        setup.usage_word.clone(),
        format!("reserve={reserved}"),
    ]);
    if let Some(debt) = setup.debt {
        words.push(format!("debt={debt}"));
    }
    if setup.on_missing == OnMissing::Keep {
        words.push("on_missing=keep".to_string());
    }
    words.join(" ")
}

/// Tokens a minute at the zone's rate (a key's budget refills at this pace).
fn rate_per_minute(policy: &Policy) -> f64 {
    60.0 * 1e9 / policy.limits.rate.interval_ns().max(1) as f64
}

fn summary(
    out: &mut impl Write,
    args: &Args,
    setup: &UsageSetup,
    replay: &UsageReplay,
    span_ns: u64,
) -> io::Result<()> {
    let keys = replay.summary();
    let total = |f: fn(&UsageKeySummary) -> u64| keys.values().map(f).sum::<u64>();
    let admitted_tokens = total(|k| k.tokens_admitted);
    // None for a log within one instant: no minute to divide by.
    let per_minute = (span_ns > 0).then(|| round3(admitted_tokens as f64 * 60e9 / span_ns as f64));
    let rate = rate_per_minute(&setup.policy);
    let policy_text = describe(setup, setup.policy.limits.burst, replay.reserved());
    if args.json {
        let keys: Vec<_> = keys
            .iter()
            .map(|(key, s)| {
                json!({
                    "key": key,
                    "admitted": s.admitted,
                    "refused": s.refused,
                    "tokens_admitted": s.tokens_admitted,
                    "tokens_refused": s.tokens_refused,
                    "tokens_forgiven": s.tokens_forgiven,
                })
            })
            .collect();
        let summary = json!({
            "summary": {
                "policy": policy_text,
                "algorithm": setup.policy.algorithm.as_str(),
                "rate": setup.policy.limits.rate.to_string(),
                "burst": setup.policy.limits.burst,
                "reserve": replay.reserved(),
                "usage_variable": format!("${}", setup.variable),
                "keys": keys,
                "span_s": crate::seconds(span_ns),
                "tokens_admitted": admitted_tokens,
                "tokens_admitted_per_minute": per_minute,
                "rate_per_minute": round3(rate),
            }
        });
        return writeln!(out, "{summary}");
    }
    writeln!(out)?;
    writeln!(out, "summary: {policy_text}")?;
    let key_width = crate::table::key_column_width(keys.keys().map(String::as_str));
    writeln!(
        out,
        "{:<key_width$} {:>9} {:>9} {:>15} {:>14} {:>15}",
        "key", "admitted", "refused", "tokens_admitted", "tokens_refused", "tokens_forgiven"
    )?;
    for (key, s) in keys {
        writeln!(
            out,
            "{key:<key_width$} {:>9} {:>9} {:>15} {:>14} {:>15}",
            s.admitted, s.refused, s.tokens_admitted, s.tokens_refused, s.tokens_forgiven
        )?;
    }
    let per_minute = per_minute.map_or("-".to_string(), |m| m.to_string());
    let span = crate::millis_text(span_ns / 1000);
    if let Some(quota) = &setup.quota {
        return writeln!(
            out,
            "tokens admitted: {admitted_tokens} over {span} s ({per_minute} per minute, all \
             keys); a key's count starts from 0 each {}, up to limit={}",
            quota.calendar.unit.as_str(),
            quota.limit
        );
    }
    writeln!(
        out,
        "tokens admitted: {admitted_tokens} over {span} s ({per_minute} per minute, all keys); \
         the budget refills {} per minute a key, on top of burst={}",
        round3(rate),
        setup.policy.limits.burst
    )
}

fn round3(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

fn time_text(time_ns: u64, epoch: bool) -> String {
    if epoch {
        format!(
            "{}.{:03}",
            time_ns / 1_000_000_000,
            time_ns / 1_000_000 % 1_000
        )
    } else {
        rfc3339(time_ns)
    }
}

/// `--calibrate MAX_REFUSED`: the smallest burst at the zone's rate that refuses at most
/// `max_refused` of the log's requests.
fn calibrate(
    out: &mut impl Write,
    args: &Args,
    setup: &UsageSetup,
    logged: &[Logged],
    max_refused: u64,
) -> Result<(), ReplayError> {
    let requests: Vec<UsageRequest> = logged.iter().map(|l| l.request.clone()).collect();
    let policy = &setup.policy;
    let limit = Limits::max_burst(policy.algorithm, &policy.limits.rate);
    let found = smallest_burst(
        &requests,
        policy,
        setup.reserve,
        setup.debt,
        max_refused,
        limit,
    )
    .map_err(|error| ReplayError::UsageZone(error.0))?;
    let refused_at = |burst: u64| {
        ratelimit_replay::replay_usage::refused_with_burst(
            &requests,
            policy,
            burst,
            setup.reserve,
            setup.debt,
        )
        .unwrap_or(u64::MAX)
    };
    let Some(burst) = found else {
        return Err(ReplayError::CalibrationUnreachable {
            max_refused,
            burst: limit,
            refused: refused_at(limit),
            requests: requests.len(),
        });
    };
    let refused = refused_at(burst);
    let mut calibrated = *policy;
    calibrated.limits.burst = burst;
    let reserved = UsageReplay::new(&calibrated, setup.reserve, setup.debt)
        .map_err(|error| ReplayError::UsageZone(error.0))?
        .reserved();
    if args.json {
        writeln!(
            out,
            "{}",
            json!({"calibration": {
                "max_refused": max_refused,
                "burst": burst,
                "refused": refused,
                "requests": requests.len(),
                "policy": describe(setup, burst, reserved),
            }})
        )?;
    } else {
        writeln!(
            out,
            "burst={burst}: the smallest budget at rate={} that refuses at most {max_refused} \
             of the {} requests (it refuses {refused})",
            policy.limits.rate,
            requests.len()
        )?;
        writeln!(out, "policy: {}", describe(setup, burst, reserved))?;
    }
    out.flush()?;
    Ok(())
}
