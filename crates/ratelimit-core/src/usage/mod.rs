//! Usage-based limits: a request's cost known only after the response (the tokens an LLM API
//! reports), reserved at the door and settled afterwards.
//!
//! - [`UsageSpec`]: the words `usage=`, `reserve=`, `debt=`, `on_missing=` and
//!   `usage_weights=` of a `rate_limit` line;
//! - [`settle`]: the arithmetic of settling a bucket after the response (charge the overrun
//!   into debt, up to a bound; what a key in debt waits);
//! - [`reader`]: an incremental reader of response bodies (plain JSON and SSE) that finds the
//!   usage OpenAI, Anthropic and Gemini report, for any split of the bytes into chunks;
//! - [`Usage`] and [`Weights`]: the tokens found and the cost they make;
//! - [`prices`] and [`model`]: the cost in micro-dollars from a price table and the model
//!   the response names (`prices=`).

mod counts;
pub use counts::{Malformed, Raw, MAX_COUNT};
mod json;
pub mod model;
pub mod openai;
pub mod prices;
pub mod reader;
pub mod request;
pub mod settle;
mod sse;

use crate::api_key::Api;
use crate::policy::{parse_integer, SpecError};

/// Whose response body the built-in reader understands (`usage=azure` reads OpenAI's: Azure
/// OpenAI answers in its shapes; what sets it apart is its credential, [`UsageSpec::api`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Provider {
    /// OpenAI Chat Completions and the Responses API (and OpenAI-compatible servers).
    OpenAi,
    /// Anthropic Messages.
    Anthropic,
    /// Gemini `generateContent` / `streamGenerateContent`.
    Gemini,
}

impl Provider {
    /// `openai`, `anthropic`, `gemini`.
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::OpenAi => "openai",
            Provider::Anthropic => "anthropic",
            Provider::Gemini => "gemini",
        }
    }
}

/// Where the cost known after the response comes from (`usage=`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum UsageSource {
    /// The built-in reader of the response body.
    Reader(Provider),
    /// An nginx variable read when the request ends (its name, without `$`): a number, the
    /// cost itself.
    Variable(String),
}

/// A number of tokens given in the configuration or read from a variable per request.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Amount {
    /// `N`
    Fixed(u64),
    /// `$name` (the name without `$`).
    Variable(String),
    /// `auto[:DEFAULT]`: the request body's output ceiling plus its prompt's estimate
    /// ([`request::RequestFacts::reservation`]); `DEFAULT` (4096 when not given) in place of a
    /// ceiling the body does not set.
    Auto(u64),
}

/// `reserve=auto`'s ceiling for a request that sets none.
pub const AUTO_DEFAULT_CEILING: u64 = 4096;

/// What a request whose response carried no usage is charged (`on_missing=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum OnMissing {
    /// `refund` (the default): nothing; the reservation is given back.
    #[default]
    Refund,
    /// `keep`: the reservation.
    Keep,
    /// `estimate`: an estimate from the streamed text ([`reader::Reader::estimate`]): its
    /// characters / 4, plus the prompt's estimate when the request body was read; 0 when the
    /// response streamed no text.
    Estimate,
}

/// What a request whose body cannot be read for sure is (`on_unreadable=`): a duplicated key,
/// a type its API does not take, not strict JSON, over 1 MiB, or sent with a
/// `Content-Encoding` ([`request::Unreadable`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum OnUnreadable {
    /// `refuse` (the default): answered at once with 400, 413 or 415 and a JSON body naming
    /// the cause; nothing is charged, nothing reaches the upstream.
    #[default]
    Refuse,
    /// `estimate`: forwarded as it is, reserving what a body that says nothing reserves, and
    /// never settled below that reservation (a usage the response reports is charged as
    /// found; none is the reservation, whatever `on_missing` says).
    Estimate,
}

/// `usage_weights=input:W,output:W,cached:W`: what each kind of token costs, in thousandths
/// (`output:4` is 4000). Input tokens are the prompt's tokens not read from a cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Weights {
    /// Prompt tokens not read from a cache.
    pub input_milli: u64,
    /// Completion (output) tokens.
    pub output_milli: u64,
    /// Prompt tokens read from a cache.
    pub cached_milli: u64,
}

impl Default for Weights {
    /// Every token counts 1: the cost is the total.
    fn default() -> Weights {
        Weights {
            input_milli: 1000,
            output_milli: 1000,
            cached_milli: 1000,
        }
    }
}

/// The most a weight may be (in thousandths): 1000 per token.
const MAX_WEIGHT_MILLI: u64 = 1_000_000;

impl Weights {
    /// `input:1,output:4,cached:0.1`: each of `input`, `output`, `cached` at most once, a
    /// number from 0 to 1000 with up to three decimals; the ones not given weigh 1.
    ///
    /// ```
    /// use ratelimit_core::usage::Weights;
    ///
    /// let weights = Weights::parse("usage_weights=output:4,cached:0.1", "output:4,cached:0.1")
    ///     .unwrap();
    /// assert_eq!((weights.input_milli, weights.output_milli, weights.cached_milli), (1000, 4000, 100));
    /// ```
    pub fn parse(word: &str, value: &str) -> Result<Weights, SpecError> {
        let invalid = || {
            SpecError::InvalidValue(format!(
                "invalid usage_weights value \"{word}\": give input:W, output:W and/or cached:W \
                 separated by commas, each W a number from 0 to 1000 with up to three \
                 decimals, as in usage_weights=input:1,output:4,cached:0"
            ))
        };
        let mut weights = Weights::default();
        let mut seen = [false; 3];
        for item in value.split(',') {
            let (name, weight) = item.split_once(':').ok_or_else(invalid)?;
            let weight = parse_milli(weight)
                .filter(|&w| w <= MAX_WEIGHT_MILLI)
                .ok_or_else(invalid)?;
            let (index, field) = match name {
                "input" => (0, &mut weights.input_milli),
                "output" => (1, &mut weights.output_milli),
                "cached" => (2, &mut weights.cached_milli),
                _ => return Err(invalid()),
            };
            if seen[index] {
                return Err(invalid());
            }
            seen[index] = true;
            *field = weight;
        }
        Ok(weights)
    }

    /// The cost of `usage`: the weighted sum, rounded up to a whole token.
    ///
    /// ```
    /// use ratelimit_core::usage::{Usage, Weights};
    ///
    /// let usage = Usage { prompt_tokens: 100, completion_tokens: 10, cached_tokens: 60, total_tokens: 110 };
    /// assert_eq!(Weights::default().cost(&usage), 110);
    /// let weights = Weights { input_milli: 1000, output_milli: 4000, cached_milli: 100 };
    /// assert_eq!(weights.cost(&usage), 40 + 40 + 6);
    /// ```
    pub fn cost(&self, usage: &Usage) -> u64 {
        let cached = usage.cached_tokens.min(usage.prompt_tokens);
        let input = usage.prompt_tokens - cached;
        let sum = u128::from(input) * u128::from(self.input_milli)
            + u128::from(usage.completion_tokens) * u128::from(self.output_milli)
            + u128::from(cached) * u128::from(self.cached_milli);
        u64::try_from(sum.div_ceil(1000)).unwrap_or(u64::MAX)
    }
}

/// `1`, `0.25`, `4.125`: thousandths.
fn parse_milli(text: &str) -> Option<u64> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || !digits(whole) || fraction.len() > 3 || !digits(fraction) {
        return None;
    }
    if text.ends_with('.') {
        return None;
    }
    let whole: u64 = whole.parse().ok()?;
    let mut milli: u64 = 0;
    for (position, byte) in fraction.bytes().enumerate() {
        milli += u64::from(byte - b'0') * [100, 10, 1][position];
    }
    whole.checked_mul(1000)?.checked_add(milli)
}

/// The tokens a response reported, as the reader normalises them: `prompt_tokens` counts
/// every prompt token (a cache read or not), `cached_tokens` those of them read from a cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Usage {
    /// Input tokens, cached ones included.
    pub prompt_tokens: u64,
    /// Output tokens.
    pub completion_tokens: u64,
    /// Input tokens read from a cache (OpenAI `cached_tokens`, Anthropic
    /// `cache_read_input_tokens`, Gemini `cachedContentTokenCount`).
    pub cached_tokens: u64,
    /// The total the provider reports (prompt plus completion when it reports none).
    pub total_tokens: u64,
}

/// The usage words of a `rate_limit` line.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UsageSpec {
    /// `usage=`
    pub source: UsageSource,
    /// The API `usage=` names (`None` for a `$variable`): where `$rate_limit_api_key` reads
    /// the caller's credential in the line's location.
    pub api: Option<Api>,
    /// `reserve=`: charged at the door (default 1).
    pub reserve: Amount,
    /// `debt=N`: how many tokens a key may owe after a settlement; `None`: the bucket's
    /// capacity (one budget).
    pub debt: Option<u64>,
    /// `on_missing=`
    pub on_missing: OnMissing,
    /// `on_unreadable=`
    pub on_unreadable: OnUnreadable,
    /// `usage_weights=` (only with a built-in reader).
    pub weights: Weights,
    /// `prices=NAME`: the `rate_limit_prices` table the cost is read from, in micro-dollars
    /// (only with a built-in reader, instead of `usage_weights=`).
    pub prices: Option<String>,
}

/// The `rate_limit` words of usage-based limits, for the error that quotes an unknown one.
pub const USAGE_PARAMETERS: &[&str] = &[
    "usage=",
    "reserve=",
    "debt=",
    "on_missing=",
    "on_unreadable=",
    "usage_weights=",
    "prices=",
];

/// The words of [`UsageSpec`] as `rate_limit` collects them.
#[derive(Default)]
pub(crate) struct UsageWords<'a> {
    source: Option<UsageSource>,
    api: Option<Api>,
    reserve: Option<Amount>,
    debt: Option<u64>,
    on_missing: Option<OnMissing>,
    on_unreadable: Option<OnUnreadable>,
    weights: Option<Weights>,
    prices: Option<&'a str>,
    /// The first word given that needs `usage=`.
    needs_usage: Option<&'a str>,
}

impl<'a> UsageWords<'a> {
    /// Take `word` if it is one of [`USAGE_PARAMETERS`]; `Ok(false)` when it is not.
    pub(crate) fn take(&mut self, word: &'a str) -> Result<bool, SpecError> {
        let (name, value) = word.split_once('=').unwrap_or((word, ""));
        match name {
            "usage" => {
                let api = Api::ALL.into_iter().find(|api| api.as_str() == value);
                self.api = api;
                self.source = Some(match api {
                    Some(Api::OpenAi | Api::Azure) => UsageSource::Reader(Provider::OpenAi),
                    Some(Api::Anthropic) => UsageSource::Reader(Provider::Anthropic),
                    Some(Api::Gemini) => UsageSource::Reader(Provider::Gemini),
                    None => UsageSource::Variable(variable_name(value).ok_or_else(|| {
                        SpecError::InvalidValue(format!(
                            "invalid usage value \"{word}\": it must be openai, anthropic, \
                             gemini, azure or a $variable"
                        ))
                    })?),
                });
                return Ok(true);
            }
            "reserve" => {
                self.reserve = Some(parse_amount(value).ok_or_else(|| {
                    SpecError::InvalidValue(format!(
                        "invalid reserve value \"{word}\": it must be a number of tokens from \
                         1 to {}, a $variable, or auto[:N] (the request's own ceiling, N \
                         when it sets none)",
                        crate::policy::Limits::MAX_BURST
                    ))
                })?);
            }
            "debt" => {
                self.debt = Some(
                    parse_integer(value)
                        .filter(|&debt| debt <= crate::policy::Limits::MAX_BURST)
                        .ok_or_else(|| {
                            SpecError::InvalidValue(format!(
                                "invalid debt value \"{word}\": it must be a number of tokens \
                                 from 0 to {}",
                                crate::policy::Limits::MAX_BURST
                            ))
                        })?,
                );
            }
            "on_missing" => {
                self.on_missing = Some(match value {
                    "refund" => OnMissing::Refund,
                    "keep" => OnMissing::Keep,
                    "estimate" => OnMissing::Estimate,
                    _ => {
                        return Err(SpecError::InvalidValue(format!(
                            "invalid on_missing value \"{word}\": it must be refund, keep or \
                             estimate"
                        )))
                    }
                });
            }
            "on_unreadable" => {
                self.on_unreadable = Some(match value {
                    "refuse" => OnUnreadable::Refuse,
                    "estimate" => OnUnreadable::Estimate,
                    _ => {
                        return Err(SpecError::InvalidValue(format!(
                            "invalid on_unreadable value \"{word}\": it must be refuse or \
                             estimate"
                        )))
                    }
                });
            }
            "usage_weights" => self.weights = Some(Weights::parse(word, value)?),
            "prices" => {
                let valid = !value.is_empty()
                    && value
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
                if !valid {
                    return Err(SpecError::InvalidValue(format!(
                        "invalid prices value \"{word}\": it must name a rate_limit_prices \
                         table, as in prices=models"
                    )));
                }
                self.prices = Some(value);
            }
            _ => return Ok(false),
        }
        self.needs_usage.get_or_insert(word);
        Ok(true)
    }

    /// The spec, once every word is read; `cost_given` is the line's `cost=` word if any.
    pub(crate) fn finish(self, cost_given: Option<&str>) -> Result<Option<UsageSpec>, SpecError> {
        let Some(source) = self.source else {
            if let Some(word) = self.needs_usage {
                let name = word.split('=').next().unwrap_or(word);
                return Err(SpecError::Conflict(format!(
                    "\"{name}\" needs \"usage\": usage=openai|anthropic|gemini|azure|$variable says \
                     where the cost known after the response comes from"
                )));
            }
            return Ok(None);
        };
        if let Some(cost) = cost_given {
            return Err(SpecError::Conflict(format!(
                "\"{cost}\" and \"usage\" cannot be used together: with usage=, reserve= is \
                 what is charged at the door"
            )));
        }
        if let (UsageSource::Variable(name), Some(_)) = (&source, self.weights) {
            return Err(SpecError::Conflict(format!(
                "\"usage_weights\" apply to a built-in reader (openai, anthropic, gemini, azure): the \
                 value of \"${name}\" is the cost itself"
            )));
        }
        if let Some(prices) = self.prices {
            if let UsageSource::Variable(name) = &source {
                return Err(SpecError::Conflict(format!(
                    "\"prices\" apply to a built-in reader (openai, anthropic, gemini, azure): the \
                     value of \"${name}\" is the cost itself"
                )));
            }
            if self.weights.is_some() {
                return Err(SpecError::Conflict(format!(
                    "\"prices={prices}\" and \"usage_weights\" cannot be used together: the \
                     price table gives each kind of token its price"
                )));
            }
        }
        Ok(Some(UsageSpec {
            source,
            api: self.api,
            reserve: self.reserve.unwrap_or(Amount::Fixed(1)),
            debt: self.debt,
            on_missing: self.on_missing.unwrap_or_default(),
            on_unreadable: self.on_unreadable.unwrap_or_default(),
            weights: self.weights.unwrap_or_default(),
            prices: self.prices.map(str::to_string),
        }))
    }
}

/// `N` (1 to `Limits::MAX_BURST`), `$name`, `auto` or `auto:N`.
pub(crate) fn parse_amount(value: &str) -> Option<Amount> {
    if let Some(name) = variable_name(value) {
        return Some(Amount::Variable(name));
    }
    let tokens = |text: &str| {
        parse_integer(text).filter(|&n| (1..=crate::policy::Limits::MAX_BURST).contains(&n))
    };
    if value == "auto" {
        return Some(Amount::Auto(AUTO_DEFAULT_CEILING));
    }
    if let Some(default) = value.strip_prefix("auto:") {
        return tokens(default).map(Amount::Auto);
    }
    tokens(value).map(Amount::Fixed)
}

/// `$name` (letters, digits, `_`): the name.
pub fn variable_name(text: &str) -> Option<String> {
    let name = text.strip_prefix('$')?;
    let valid = !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    valid.then(|| name.to_string())
}

/// A variable's value as a number of tokens: decimal digits (surrounding spaces allowed);
/// `None` for anything else (empty, negative, not a number).
///
/// ```
/// use ratelimit_core::usage::parse_tokens;
///
/// assert_eq!(parse_tokens(b" 1500"), Some(1500));
/// assert_eq!(parse_tokens(b"-3"), None);
/// assert_eq!(parse_tokens(b""), None);
/// ```
pub fn parse_tokens(value: &[u8]) -> Option<u64> {
    let text = core::str::from_utf8(value).ok()?.trim();
    parse_integer(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_parse() {
        #[rustfmt::skip]
        type Row<'a> = (&'a str, Option<(u64, u64, u64)>);
        let rows: &[Row] = &[
            ("input:1,output:4,cached:0", Some((1000, 4000, 0))),
            ("output:4", Some((1000, 4000, 1000))),
            ("cached:0.125", Some((1000, 1000, 125))),
            ("cached:1000", Some((1000, 1000, 1_000_000))),
            ("cached:1000.001", None),
            ("cached:0.1234", None),
            ("cached:1.", None),
            ("cached:.5", None),
            ("cached:-1", None),
            ("output:4,output:2", None),
            ("reasoning:2", None),
            ("output", None),
            ("", None),
        ];
        for (value, expected) in rows {
            let parsed = Weights::parse("usage_weights=x", value)
                .ok()
                .map(|w| (w.input_milli, w.output_milli, w.cached_milli));
            assert_eq!(parsed, *expected, "{value}");
        }
    }

    #[test]
    fn cost_rounds_up_and_never_overflows() {
        let usage = Usage {
            prompt_tokens: 3,
            completion_tokens: 0,
            cached_tokens: 5,
            total_tokens: 3,
        };
        let weights = Weights {
            input_milli: 1000,
            output_milli: 1000,
            cached_milli: 333,
        };
        // Cached is at most the prompt: 3 cached at 0.333 = 0.999, rounded up.
        assert_eq!(weights.cost(&usage), 1);
        let huge = Usage {
            prompt_tokens: u64::MAX,
            completion_tokens: u64::MAX,
            cached_tokens: 0,
            total_tokens: u64::MAX,
        };
        assert_eq!(Weights::default().cost(&huge), u64::MAX);
    }
}
