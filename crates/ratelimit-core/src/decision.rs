//! The answer every algorithm gives.

/// Whether a request goes through, as `$rate_limit_status` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Within the limit: serve now.
    Passed,
    /// Within the burst but over the rate: serve after `delay_ns` (leaky bucket only).
    Delayed,
    /// Over the limit: refuse; nothing was charged.
    Rejected,
}

impl Outcome {
    /// `PASSED`, `DELAYED` or `REJECTED`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Passed => "PASSED",
            Outcome::Delayed => "DELAYED",
            Outcome::Rejected => "REJECTED",
        }
    }
}

/// Everything a caller needs after one decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Passed, delayed or rejected.
    pub outcome: Outcome,
    /// How long to hold the request before serving it; non-zero only for `Delayed`.
    pub delay_ns: u64,
    /// For `Rejected`: the shortest wait after which the same request would pass (assuming no
    /// other request in between), or [`Decision::NEVER_NS`] when no wait is enough (its cost
    /// is more than the limit admits at once). Zero otherwise.
    pub retry_after_ns: u64,
    /// How many more requests of cost 1 would pass (without rejection) right after this one.
    pub remaining: u64,
    /// Time until the key is back to its fresh state (full capacity), after this decision.
    pub reset_ns: u64,
    /// How far over the rate the key is after this decision, in 1/1000 requests (limit_req's
    /// "excess", used in log lines). For a rejection: the excess the request would have had.
    pub excess_milli: u64,
}

impl Decision {
    /// `retry_after_ns` of a request that no wait lets through: it costs more than the limit
    /// ever admits at once, or the key's state would not fit a `u64` (see `gcra`).
    pub const NEVER_NS: u64 = u64::MAX;

    /// Whether this is a rejection that waiting cannot turn into a pass.
    ///
    /// ```
    /// use ratelimit_core::{decide_word, Algorithm, DelayMode, Policy, ZoneSpec};
    ///
    /// let zone = ZoneSpec::parse_words(&["rate=1r/s", "burst=4", "algorithm=token_bucket"])
    ///     .unwrap();
    /// let policy = |cost| Policy {
    ///     algorithm: zone.algorithm,
    ///     limits: zone.limits(),
    ///     delay: DelayMode::NoDelay,
    ///     cost,
    /// };
    /// // Four tokens: a request costing five never passes, one costing four does.
    /// assert!(decide_word(0, 0, &policy(5)).0.never_passes());
    /// assert!(!decide_word(0, 0, &policy(4)).0.never_passes());
    /// ```
    pub fn never_passes(&self) -> bool {
        self.outcome == Outcome::Rejected && self.retry_after_ns == Decision::NEVER_NS
    }

    /// A rejection with the given retry-after, reset and excess; `remaining` is 0.
    pub fn rejected(retry_after_ns: u64, reset_ns: u64, excess_milli: u64) -> Decision {
        Decision {
            outcome: Outcome::Rejected,
            delay_ns: 0,
            retry_after_ns,
            remaining: 0,
            reset_ns,
            excess_milli,
        }
    }
}
