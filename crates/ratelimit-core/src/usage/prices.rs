//! Prices per model, so that a usage-based limit counts money rather than tokens: a table of
//! `MODEL input=USD output=USD [cached=USD]` lines (dollars per million tokens, the unit the
//! providers' price lists use) and a `default` line, matched against the model a response
//! names. A cost is in micro-dollars (1 USD = 1,000,000): a quota of `limit=500000000` is
//! $500.
//!
//! A price per million tokens in dollars is a price per token in micro-dollars, so each
//! model's prices are [`Weights`] and its cost is [`Weights::cost`] of the usage: kept to the
//! thousandth of a micro-dollar per token ($0.001 per million tokens); a finer price is
//! rounded up.

use super::Weights;
use crate::policy::SpecError;

/// The most a price may be, in dollars per million tokens (the largest [`Weights`] holds).
pub const MAX_USD_PER_MILLION: u64 = 1000;

/// One model's prices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelPrice {
    /// The model's name, or its prefix (matched when no name is equal).
    pub model: String,
    /// Micro-dollars per token, in thousandths (dollars per million tokens, times 1000).
    pub weights: Weights,
}

/// A `rate_limit_prices` table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PriceTable {
    /// The models, in the order given.
    pub models: Vec<ModelPrice>,
    /// The `default` line's prices, for a model no line matches.
    pub default: Option<Weights>,
}

impl PriceTable {
    /// Add the words of one line: `MODEL input=USD output=USD [cached=USD]`, or `default ...`.
    /// `cached` costs as `input` when it is not given.
    ///
    /// ```
    /// use ratelimit_core::usage::prices::PriceTable;
    ///
    /// let mut table = PriceTable::default();
    /// table.add_line(&["gpt-4o", "input=2.5", "output=10", "cached=1.25"]).unwrap();
    /// assert_eq!(table.models[0].weights.output_milli, 10_000);
    /// assert_eq!(
    ///     table.add_line(&["gpt-4o", "input=3", "output=12"]).unwrap_err().to_string(),
    ///     "duplicate model \"gpt-4o\" in rate_limit_prices"
    /// );
    /// ```
    pub fn add_line(&mut self, words: &[&str]) -> Result<(), SpecError> {
        let (&model, prices) = words.split_first().ok_or_else(|| {
            SpecError::InvalidValue("a rate_limit_prices line needs a model".into())
        })?;
        let (mut input, mut output, mut cached) = (None, None, None);
        for &word in prices {
            let (name, value) = word.split_once('=').unwrap_or((word, ""));
            let slot = match name {
                "input" => &mut input,
                "output" => &mut output,
                "cached" => &mut cached,
                _ => {
                    return Err(SpecError::invalid_parameter(
                        word,
                        &["input=", "output=", "cached="],
                    ))
                }
            };
            if slot.is_some() {
                return Err(SpecError::InvalidValue(format!(
                    "duplicate \"{name}\" for model \"{model}\" in rate_limit_prices"
                )));
            }
            *slot = Some(parse_usd(word, value)?);
        }
        let missing = |name| {
            SpecError::InvalidValue(format!(
                "model \"{model}\" in rate_limit_prices must have \"{name}=\": its price in \
                 dollars per million tokens"
            ))
        };
        let input_milli = input.ok_or_else(|| missing("input"))?;
        let output_milli = output.ok_or_else(|| missing("output"))?;
        let weights = Weights {
            input_milli,
            output_milli,
            cached_milli: cached.unwrap_or(input_milli),
        };
        let taken = if model == "default" {
            self.default.replace(weights).is_some()
        } else if self.models.iter().any(|price| price.model == model) {
            true
        } else {
            self.models.push(ModelPrice {
                model: model.to_string(),
                weights,
            });
            false
        };
        if taken {
            return Err(SpecError::InvalidValue(format!(
                "duplicate model \"{model}\" in rate_limit_prices"
            )));
        }
        Ok(())
    }

    /// The prices of `model`: the line naming it exactly, else the line whose name is its
    /// longest prefix (`gpt-4o` for `gpt-4o-2024-08-06`), else `default`; `None` when none
    /// applies ([`PriceTable::price_for`] then charges the table's highest prices).
    ///
    /// ```
    /// use ratelimit_core::usage::prices::PriceTable;
    ///
    /// let mut table = PriceTable::default();
    /// table.add_line(&["gpt-4o", "input=2.5", "output=10"]).unwrap();
    /// table.add_line(&["gpt-4o-mini", "input=0.15", "output=0.6"]).unwrap();
    /// let output = |model| table.prices(model).map(|weights| weights.output_milli);
    /// assert_eq!(output("gpt-4o-mini-2024-07-18"), Some(600));
    /// assert_eq!(output("gpt-4o-2024-08-06"), Some(10_000));
    /// assert_eq!(output("claude-sonnet-4"), None);
    /// ```
    pub fn prices(&self, model: &str) -> Option<Weights> {
        self.named(model).or(self.default)
    }
}

impl PriceTable {
    /// The highest price of each kind of token over the table's lines (`default` included):
    /// what a model the table does not price costs, so that it is never nearly free.
    ///
    /// ```
    /// use ratelimit_core::usage::prices::PriceTable;
    ///
    /// let mut table = PriceTable::default();
    /// table.add_line(&["big", "input=10", "output=30", "cached=1"]).unwrap();
    /// table.add_line(&["odd", "input=15", "output=1"]).unwrap();
    /// let highest = table.highest();
    /// assert_eq!((highest.input_milli, highest.output_milli, highest.cached_milli), (15_000, 30_000, 15_000));
    /// ```
    pub fn highest(&self) -> Weights {
        let lines = self
            .models
            .iter()
            .map(|price| price.weights)
            .chain(self.default);
        lines.fold(
            Weights {
                input_milli: 0,
                output_milli: 0,
                cached_milli: 0,
            },
            |top, line| Weights {
                input_milli: top.input_milli.max(line.input_milli),
                output_milli: top.output_milli.max(line.output_milli),
                cached_milli: top.cached_milli.max(line.cached_milli),
            },
        )
    }

    /// The prices a request is charged at, and whether the table prices its model: the
    /// model the response names, matched exactly or by prefix, else the one the request
    /// named, else `default`, else (`false`) the table's [`PriceTable::highest`], so that a
    /// model it does not price is never nearly free.
    ///
    /// ```
    /// use ratelimit_core::usage::prices::PriceTable;
    ///
    /// let mut table = PriceTable::default();
    /// table.add_line(&["big", "input=10", "output=30"]).unwrap();
    /// table.add_line(&["small", "input=0.5", "output=1.5"]).unwrap();
    /// let output = |response, request| {
    ///     let (weights, priced) = table.price_for(response, request);
    ///     (weights.output_milli, priced)
    /// };
    /// assert_eq!(output(Some("small-2025"), Some("big")), (1_500, true));
    /// assert_eq!(output(Some("mystery"), Some("small")), (1_500, true));
    /// assert_eq!(output(None, Some("mystery")), (30_000, false));
    /// assert_eq!(output(None, None), (30_000, false));
    /// ```
    pub fn price_for(&self, response: Option<&str>, request: Option<&str>) -> (Weights, bool) {
        let named = [response, request]
            .into_iter()
            .flatten()
            .find_map(|model| self.named(model))
            .or(self.default);
        match named {
            Some(weights) => (weights, true),
            None => (self.highest(), false),
        }
    }

    /// The line naming `model` exactly, else the one whose name is its longest prefix.
    fn named(&self, model: &str) -> Option<Weights> {
        if let Some(exact) = self.models.iter().find(|price| price.model == model) {
            return Some(exact.weights);
        }
        self.models
            .iter()
            .filter(|price| model.starts_with(price.model.as_str()))
            .max_by_key(|price| price.model.len())
            .map(|price| price.weights)
    }
}

impl PriceTable {
    /// The `rate_limit_prices NAME { ... }` block of `text` (an nginx configuration, or just the
    /// block): for the replay tool, which prices a log with the tables nginx.conf declares.
    /// `#` comments are skipped; quotes are not read (the model names of a price list need none).
    ///
    /// ```
    /// use ratelimit_core::usage::prices::PriceTable;
    ///
    /// let conf = "http {\n  rate_limit_prices models {  # $ per 1M tokens\n    big input=10 output=30;\n  }\n}";
    /// let table = PriceTable::from_conf_text(conf, "models").unwrap();
    /// assert_eq!(table.prices("big").unwrap().output_milli, 30_000);
    /// assert!(PriceTable::from_conf_text(conf, "other").is_err());
    /// ```
    pub fn from_conf_text(text: &str, name: &str) -> Result<PriceTable, SpecError> {
        let words: Vec<&str> = text
            .lines()
            .map(|line| line.split('#').next().unwrap_or_default())
            .flat_map(|line| {
                line.split_inclusive([';', '{', '}'])
                    .flat_map(|part| {
                        let (body, end) = match part.char_indices().last() {
                            Some((at, ';' | '{' | '}')) => part.split_at(at),
                            _ => (part, ""),
                        };
                        body.split_whitespace()
                            .chain((!end.is_empty()).then_some(end))
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        let start = words
            .windows(3)
            .position(|w| w[0] == "rate_limit_prices" && w[1] == name && w[2] == "{")
            .ok_or_else(|| {
                SpecError::InvalidValue(format!(
                    "no \"rate_limit_prices {name} {{ ... }}\" block found"
                ))
            })?;
        let mut table = PriceTable::default();
        let mut line = Vec::new();
        for &word in &words[start + 3..] {
            match word {
                "}" => {
                    if !line.is_empty() {
                        return Err(SpecError::InvalidValue(format!(
                            "rate_limit_prices {name}: \"{}\" must end with \";\"",
                            line.join(" ")
                        )));
                    }
                    if table.models.is_empty() && table.default.is_none() {
                        return Err(SpecError::InvalidValue(format!(
                            "rate_limit_prices {name} has no price"
                        )));
                    }
                    return Ok(table);
                }
                ";" => {
                    table.add_line(&line)?;
                    line.clear();
                }
                _ => line.push(word),
            }
        }
        Err(SpecError::InvalidValue(format!(
            "rate_limit_prices {name}: its block has no \"}}\""
        )))
    }
}

/// `2.5`, `0.15`, `0.01875`: dollars per million tokens as thousandths of a micro-dollar per
/// token, rounded up past three decimals; from 0 to [`MAX_USD_PER_MILLION`].
fn parse_usd(word: &str, value: &str) -> Result<u64, SpecError> {
    let invalid = || {
        SpecError::InvalidValue(format!(
            "invalid price \"{word}\": give dollars per million tokens, a number from 0 to \
             {MAX_USD_PER_MILLION} with up to 6 decimals, as in input=2.5"
        ))
    };
    let (whole, fraction) = value.split_once('.').unwrap_or((value, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || !digits(whole) || !digits(fraction) || fraction.len() > 6 {
        return Err(invalid());
    }
    if value.ends_with('.') {
        return Err(invalid());
    }
    let whole: u64 = whole.parse().map_err(|_| invalid())?;
    let micro: u64 = format!("{fraction:0<6}").parse().map_err(|_| invalid())?;
    let milli = whole
        .checked_mul(1000)
        .and_then(|milli| milli.checked_add(micro.div_ceil(1000)))
        .filter(|&milli| milli <= MAX_USD_PER_MILLION * 1000)
        .ok_or_else(invalid)?;
    Ok(milli)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::Outcome;
    use crate::policy::{Algorithm, DelayMode, Limits, Policy};
    use crate::quota::{self, QuotaWindow};
    use crate::usage::Usage;

    fn table(lines: &[&str]) -> PriceTable {
        let mut table = PriceTable::default();
        for line in lines {
            let words: Vec<&str> = line.split_whitespace().collect();
            table.add_line(&words).unwrap();
        }
        table
    }

    #[test]
    fn matching_exact_then_longest_prefix_then_default() {
        let table = table(&[
            "gpt-4 input=30 output=60",
            "gpt-4o input=2.5 output=10 cached=1.25",
            "gpt-4o-mini input=0.15 output=0.6",
            "default input=1 output=2",
        ]);
        let input = |model| table.prices(model).unwrap().input_milli;
        assert_eq!(input("gpt-4"), 30_000);
        assert_eq!(input("gpt-4-turbo"), 30_000);
        assert_eq!(input("gpt-4o"), 2_500);
        assert_eq!(input("gpt-4o-2024-11-20"), 2_500);
        assert_eq!(input("gpt-4o-mini"), 150);
        assert_eq!(input("o3"), 1_000);
        assert_eq!(input(""), 1_000);
        assert_eq!(table.prices("gpt-4o").unwrap().cached_milli, 1_250);
        // cached costs as input when the line does not say.
        assert_eq!(table.prices("gpt-4").unwrap().cached_milli, 30_000);
    }

    #[test]
    fn costs_in_micro_dollars() {
        let table = table(&[
            "big input=10 output=30",
            "small input=0.5 output=1.5 cached=0.05",
        ]);
        let usage = Usage {
            prompt_tokens: 1_000,
            completion_tokens: 10_000,
            cached_tokens: 0,
            total_tokens: 11_000,
        };
        // 1,000 × $10/M + 10,000 × $30/M = $0.31.
        assert_eq!(table.prices("big").unwrap().cost(&usage), 310_000);
        assert_eq!(table.prices("small").unwrap().cost(&usage), 15_500);
        let cached = Usage {
            cached_tokens: 800,
            ..usage
        };
        // 200 × 0.5 + 800 × 0.05 + 10,000 × 1.5 = 100 + 40 + 15,000.
        assert_eq!(table.prices("small").unwrap().cost(&cached), 15_140);
    }

    /// The issue's target, on the quota's own arithmetic: a $1-a-day quota, each request
    /// reserving 1 micro-dollar at the door and settled into debt from 1,000 prompt and 10,000
    /// completion tokens, admits 4 of 8 at $10/$30 and 65 of 80 at $0.5/$1.5.
    #[test]
    fn a_dollar_a_day_admits_4_or_65() {
        let table = table(&["big input=10 output=30", "small input=0.5 output=1.5"]);
        let usage = Usage {
            prompt_tokens: 1_000,
            completion_tokens: 10_000,
            cached_tokens: 0,
            total_tokens: 11_000,
        };
        for (model, requests, admitted) in [("big", 8, 4), ("small", 80, 65)] {
            let policy = Policy {
                algorithm: Algorithm::Quota(QuotaWindow {
                    tag: 1,
                    end_ns: 86_400,
                }),
                limits: Limits::quota(1_000_000),
                delay: DelayMode::NoDelay,
                cost: 1,
            };
            let cost = table.prices(model).unwrap().cost(&usage);
            let mut state = 0;
            let mut passed = 0;
            for _ in 0..requests {
                let (decision, next) = quota::decide(state, 0, &policy);
                if decision.outcome == Outcome::Rejected {
                    continue;
                }
                passed += 1;
                // Settled: what it cost beyond its reservation, into debt (one limit).
                (state, _) = quota::charge_into_debt(next.unwrap(), &policy, cost - 1, 1_000_000);
            }
            assert_eq!(passed, admitted, "{model}");
        }
    }

    #[test]
    fn errors_name_the_word() {
        let error = |line: &str| {
            let words: Vec<&str> = line.split_whitespace().collect();
            PriceTable::default()
                .add_line(&words)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            error("m input=x output=1"),
            "invalid price \"input=x\": give dollars per million tokens, a number from 0 to \
             1000 with up to 6 decimals, as in input=2.5"
        );
        assert!(error("m input=1 output=1000.001").starts_with("invalid price \"output="));
        assert!(error("m input=0.0000001 output=1").starts_with("invalid price \"input="));
        assert_eq!(
            error("m output=1"),
            "model \"m\" in rate_limit_prices must have \"input=\": its price in dollars per \
             million tokens"
        );
        assert_eq!(
            error("m input=1 input=2 output=1"),
            "duplicate \"input\" for model \"m\" in rate_limit_prices"
        );
        assert!(error("m input=1 outptu=2").contains("did you mean \"output=\"?"));
        // A price finer than $0.001 per million tokens is rounded up.
        let mut table = PriceTable::default();
        table
            .add_line(&["flash", "input=0.075", "output=0.3", "cached=0.01875"])
            .unwrap();
        assert_eq!(table.prices("flash").unwrap().cached_milli, 19);
    }
}
