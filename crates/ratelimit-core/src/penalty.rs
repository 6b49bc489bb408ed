//! The penalty box: a key rejected by its limit is blocked for a while (`block=`), longer each
//! time it comes back soon (`block_max=`), and a limit can count only the requests whose
//! response says they failed (`on_status=`).
//!
//! Pure arithmetic on a block word, with the time passed in:
//!
//! * [`BlockPolicy`] is the zone's `block=DURATION [block_max=DURATION]`.
//! * [`BlockWord`] is one key's block as a single `u64` that shared memory updates by
//!   compare-and-swap: when the block ends (milliseconds on the caller's clock, 42 bits) and its
//!   escalation level (6 bits). [`BlockWord::blocked_for_ns`] answers "is this key blocked
//!   now", [`BlockWord::after_rejection`] gives the word to store when a request is rejected.
//! * [`StatusMatcher`] is `on_status=401,403` / `4xx`: which final statuses are charged.
//!
//! Escalation: a key blocked again within `block_max` after the end of its last block gets
//! twice the length of that block, up to `block_max`; after `block_max` without a block it
//! starts over at `block`. Level `n` means a block of `block × 2^n` (capped).
//!
//! The record the module keeps per blocked key in the zone's shared memory is described in
//! [`crate::block_table`]: the key's hash, this block word (the only word decisions read and
//! the only one updated by compare-and-swap), when the block started (for display) and the
//! key's text (for listing), 80 bytes a key.

use std::fmt;

use crate::policy::SpecError;

/// Nanoseconds in one millisecond.
const NANOS_PER_MS: u64 = 1_000_000;

/// The zone's `block=` and `block_max=`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockPolicy {
    /// The first block's length.
    pub block_ns: u64,
    /// The longest block, and how long a key must stay unblocked to start over. Equal to
    /// `block_ns` when `block_max=` is not given (no escalation).
    pub block_max_ns: u64,
}

impl BlockPolicy {
    /// The longest block or `block_max=` accepted: 365 days (a block word holds its end in
    /// milliseconds of 42 bits, 139 years).
    pub const MAX_NS: u64 = 365 * 86_400 * 1_000_000_000;

    /// The length of a block of escalation `level`: `block × 2^level`, at most `block_max`.
    pub fn duration_ns(&self, level: u8) -> u64 {
        let doubled = self.block_ns.saturating_mul(1 << level.min(63));
        doubled.min(self.block_max_ns).max(self.block_ns.min(1))
    }

    /// The highest level whose block is still shorter than `block_max`, plus one: the level
    /// at which the length stops growing. Levels never go beyond it.
    pub fn top_level(&self) -> u8 {
        let mut level = 0;
        while level < BlockWord::MAX_LEVEL && self.duration_ns(level) < self.block_max_ns {
            level += 1;
        }
        level
    }
}

/// One key's block, packed into a `u64`: the block's end in milliseconds (bits 63..22) and its
/// escalation level (bits 21..16). `0` is "never blocked". The low 16 bits are zero.
///
/// A word whose end has passed still matters for `block_max` after it: it tells the next
/// block which level to take. After that it can be dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct BlockWord(pub u64);

/// A block that was just set: what the log line and the admin API show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    /// When it started (the caller's clock, nanoseconds, whole milliseconds).
    pub since_ns: u64,
    /// When it ends.
    pub until_ns: u64,
    /// Its escalation level: 0 for a first block, `n` for `block × 2^n`.
    pub level: u8,
}

impl Block {
    /// Its length.
    pub fn duration_ns(&self) -> u64 {
        self.until_ns - self.since_ns
    }
}

impl BlockWord {
    /// The highest level a word holds.
    pub const MAX_LEVEL: u8 = 63;
    /// The latest end a word holds, in milliseconds.
    pub const MAX_UNTIL_MS: u64 = (1 << 42) - 1;

    /// A word for a block ending at `until_ms` with `level`; the end is clamped to what the
    /// word holds (at least 1 ms, so that the word is not 0).
    pub fn new(until_ms: u64, level: u8) -> BlockWord {
        let until_ms = until_ms.clamp(1, BlockWord::MAX_UNTIL_MS);
        let level = u64::from(level.min(BlockWord::MAX_LEVEL));
        BlockWord((until_ms << 22) | (level << 16))
    }

    /// When the block ends, in milliseconds (0: never blocked).
    pub fn until_ms(self) -> u64 {
        self.0 >> 22
    }

    /// Its level.
    pub fn level(self) -> u8 {
        ((self.0 >> 16) & 0x3f) as u8
    }

    /// How long the key stays blocked from `now_ns`, or `None` when it is not blocked.
    ///
    /// ```
    /// use ratelimit_core::penalty::BlockWord;
    ///
    /// let word = BlockWord::new(10_000, 0); // blocked until 10 s
    /// assert_eq!(word.blocked_for_ns(9_250_000_000), Some(750_000_000));
    /// assert_eq!(word.blocked_for_ns(10_000_000_000), None);
    /// assert_eq!(BlockWord::default().blocked_for_ns(0), None);
    /// ```
    pub fn blocked_for_ns(self, now_ns: u64) -> Option<u64> {
        let until_ns = self.until_ms().saturating_mul(NANOS_PER_MS);
        (until_ns > now_ns).then(|| until_ns - now_ns)
    }

    /// Whether the word no longer changes any decision at `now_ns`: its block has ended and
    /// a new block would start over at level 0. Such a record can be dropped.
    pub fn is_spent(self, now_ns: u64, policy: &BlockPolicy) -> bool {
        let until_ns = self.until_ms().saturating_mul(NANOS_PER_MS);
        self.0 == 0 || until_ns.saturating_add(policy.block_max_ns) < now_ns
    }

    /// The word to store when a request of the key is rejected at `now_ns`, and the block it
    /// starts. A key still blocked keeps its block (the same word comes back); a key whose
    /// last block ended at most `block_max` ago gets the next level; any other starts at
    /// level 0.
    ///
    /// ```
    /// use ratelimit_core::penalty::{BlockPolicy, BlockWord};
    ///
    /// let s = 1_000_000_000;
    /// let policy = BlockPolicy { block_ns: 60 * s, block_max_ns: 300 * s };
    /// let (first, block) = BlockWord::default().after_rejection(0, &policy);
    /// assert_eq!((block.level, block.duration_ns()), (0, 60 * s));
    /// // Back 10 s after its release: twice as long.
    /// let (second, block) = first.after_rejection(70 * s, &policy);
    /// assert_eq!((block.level, block.duration_ns()), (1, 120 * s));
    /// // A clean block_max after that release: starts over.
    /// let (_, block) = second.after_rejection(190 * s + 301 * s, &policy);
    /// assert_eq!((block.level, block.duration_ns()), (0, 60 * s));
    /// ```
    pub fn after_rejection(self, now_ns: u64, policy: &BlockPolicy) -> (BlockWord, Block) {
        let now_ms = now_ns / NANOS_PER_MS;
        if self.blocked_for_ns(now_ns).is_some() {
            let level = self.level();
            let until_ns = self.until_ms() * NANOS_PER_MS;
            let since_ns = until_ns.saturating_sub(policy.duration_ns(level));
            return (
                self,
                Block {
                    since_ns,
                    until_ns,
                    level,
                },
            );
        }
        let level = if self.is_spent(now_ns, policy) {
            0
        } else {
            self.level().saturating_add(1).min(policy.top_level())
        };
        let duration_ms = policy.duration_ns(level).div_ceil(NANOS_PER_MS);
        self.block_at(now_ms, duration_ms, level)
    }

    /// A block set by hand (admin API, Lua) at `now_ns` for `duration_ns`: it replaces any
    /// block of the key and keeps the key's level, so that hand blocks do not escalate.
    pub fn by_hand(self, now_ns: u64, duration_ns: u64) -> (BlockWord, Block) {
        let level = if self.0 == 0 { 0 } else { self.level() };
        self.block_at(
            now_ns / NANOS_PER_MS,
            duration_ns.div_ceil(NANOS_PER_MS),
            level,
        )
    }

    /// The word after a release at `now_ns` (admin API, Lua): the block ends now, the level
    /// stays, so a key released by hand and rejected again soon still escalates.
    pub fn released(self, now_ns: u64) -> BlockWord {
        if self.0 == 0 || self.blocked_for_ns(now_ns).is_none() {
            return self;
        }
        BlockWord::new(now_ns / NANOS_PER_MS, self.level())
    }

    fn block_at(self, now_ms: u64, duration_ms: u64, level: u8) -> (BlockWord, Block) {
        let until_ms = now_ms.saturating_add(duration_ms.max(1));
        let word = BlockWord::new(until_ms, level);
        let block = Block {
            since_ns: now_ms.min(word.until_ms()).saturating_mul(NANOS_PER_MS),
            until_ns: word.until_ms().saturating_mul(NANOS_PER_MS),
            level: word.level(),
        };
        (word, block)
    }
}

/// `on_status=CODES`: the statuses whose requests are charged. Codes `100`..`599` and classes
/// `1xx`..`5xx`, separated by commas.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct StatusMatcher {
    /// Bit `s - 100` set for each status `s` matched.
    bits: [u64; 8],
}

impl StatusMatcher {
    /// Parse the value of `on_status=` (`401,403`, `4xx`, `429,5xx`); the error quotes the
    /// whole word `word` as nginx does and says what is valid.
    ///
    /// ```
    /// use ratelimit_core::penalty::StatusMatcher;
    ///
    /// let matcher = StatusMatcher::parse("on_status=401,5xx", "401,5xx").unwrap();
    /// assert!(matcher.matches(401) && matcher.matches(503));
    /// assert!(!matcher.matches(403) && !matcher.matches(200));
    /// assert!(StatusMatcher::parse("on_status=4x", "4x").is_err());
    /// ```
    pub fn parse(word: &str, value: &str) -> Result<StatusMatcher, SpecError> {
        let invalid = || SpecError::InvalidOnStatus(word.to_string());
        let mut bits = [0_u64; 8];
        if value.is_empty() {
            return Err(invalid());
        }
        for code in value.split(',') {
            let bytes = code.as_bytes();
            let range = match bytes {
                [class @ b'1'..=b'5', b'x' | b'X', b'x' | b'X'] => {
                    let first = u16::from(class - b'0') * 100;
                    first..=first + 99
                }
                [b'1'..=b'5', b'0'..=b'9', b'0'..=b'9'] => {
                    let status: u16 = code.parse().map_err(|_| invalid())?;
                    status..=status
                }
                _ => return Err(invalid()),
            };
            for status in range {
                let bit = usize::from(status - 100);
                bits[bit / 64] |= 1 << (bit % 64);
            }
        }
        Ok(StatusMatcher { bits })
    }

    /// Whether a request that ended with `status` is charged.
    pub fn matches(&self, status: u16) -> bool {
        let Some(bit) = status.checked_sub(100).map(usize::from) else {
            return false;
        };
        bit < 500 && self.bits[bit / 64] & (1 << (bit % 64)) != 0
    }
}

impl fmt::Debug for StatusMatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StatusMatcher({self})")
    }
}

impl fmt::Display for StatusMatcher {
    /// The statuses matched, classes folded: `401,403`, `4xx`, `429,5xx`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        for class in 1..=5_u16 {
            let first = class * 100;
            if (first..first + 100).all(|status| self.matches(status)) {
                parts.push(format!("{class}xx"));
            } else {
                parts.extend(
                    (first..first + 100)
                        .filter(|&status| self.matches(status))
                        .map(|status| status.to_string()),
                );
            }
        }
        f.write_str(&parts.join(","))
    }
}

/// An nginx time (`ngx_parse_time`): a number and a unit, or several from the largest unit
/// down (`1h30m`); units `ms`, `s`, `m`, `h`, `d`, `w`, `M` (30 days), `y` (365 days); a bare
/// number is seconds. `None` for anything else or an overflow.
///
/// ```
/// use ratelimit_core::penalty::parse_duration_ns;
///
/// let s = 1_000_000_000;
/// assert_eq!(parse_duration_ns("15m"), Some(900 * s));
/// assert_eq!(parse_duration_ns("1h30m"), Some(5400 * s));
/// assert_eq!(parse_duration_ns("30"), Some(30 * s));
/// assert_eq!(parse_duration_ns("500ms"), Some(s / 2));
/// assert_eq!(parse_duration_ns("15x"), None);
/// assert_eq!(parse_duration_ns("30m1h"), None);
/// ```
pub fn parse_duration_ns(text: &str) -> Option<u64> {
    const S: u64 = 1_000_000_000;
    // Largest first: each unit at most once, in this order.
    const UNITS: [(&str, u64); 8] = [
        ("y", 365 * 86_400 * S),
        ("M", 30 * 86_400 * S),
        ("w", 7 * 86_400 * S),
        ("d", 86_400 * S),
        ("h", 3600 * S),
        ("ms", 1_000_000),
        ("m", 60 * S),
        ("s", S),
    ];
    let rank = |unit: &str| match unit {
        "y" => 0,
        "M" => 1,
        "w" => 2,
        "d" => 3,
        "h" => 4,
        "m" => 5,
        "s" => 6,
        _ => 7, // ms
    };
    if text.is_empty() {
        return None;
    }
    let mut rest = text;
    let mut total: u64 = 0;
    let mut last_rank = None;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let value: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit, scale) = if rest.is_empty() {
            // A bare number: seconds, and only alone or last.
            ("s", S)
        } else {
            let (unit, scale) = UNITS.iter().find(|(unit, _)| rest.starts_with(unit))?;
            rest = &rest[unit.len()..];
            (*unit, *scale)
        };
        let rank = rank(unit);
        if last_rank.is_some_and(|last| rank <= last) {
            return None;
        }
        last_rank = Some(rank);
        total = total.checked_add(value.checked_mul(scale)?)?;
    }
    Some(total)
}

/// A duration as nginx would write it in a config, largest units first: `15m`, `1h30m`,
/// `2s`, `500ms`, `0s`.
pub fn duration_text(duration_ns: u64) -> String {
    let mut text = String::new();
    let mut rest = duration_ns / NANOS_PER_MS;
    for (unit, ms) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1000),
    ] {
        if rest >= ms {
            text.push_str(&format!("{}{unit}", rest / ms));
            rest %= ms;
        }
    }
    if rest > 0 {
        text.push_str(&format!("{rest}ms"));
    }
    if text.is_empty() {
        text.push_str("0s");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn policy(block: u64, block_max: u64) -> BlockPolicy {
        BlockPolicy {
            block_ns: block * S,
            block_max_ns: block_max * S,
        }
    }

    /// Rows `(now_s, blocked_before, level, duration_s)`: a rejection at `now_s`, whether the
    /// key was blocked just before it, and the block it then has.
    #[test]
    fn escalation_table() {
        // block=60s block_max=300s: 60, 120, 240, 300, 300 ...
        let policy = policy(60, 300);
        #[rustfmt::skip]
        let rows: [(u64, bool, u8, u64); 9] = [
            (0,    false, 0, 60),   // first offence
            (30,   true,  0, 60),   // rejected while blocked: the same block, not longer
            (61,   false, 1, 120),  // back 1 s after release: twice
            (181,  false, 2, 240),  // released at 181: at once again
            (421,  false, 3, 300),  // 480 would pass block_max: capped
            (721,  false, 3, 300),  // stays at the cap
            (1021, false, 3, 300),  // released at 1021; block_max to wait for a fresh start
            (1621, false, 3, 300),  // 1321 + 300 = 1621: still within block_max
            (2222, false, 0, 60),   // released at 1921, 301 s clean: starts over
        ];
        let mut word = BlockWord::default();
        for (now_s, was_blocked, level, duration_s) in rows {
            let now = now_s * S;
            assert_eq!(
                word.blocked_for_ns(now).is_some(),
                was_blocked,
                "at {now_s}"
            );
            let (next, block) = word.after_rejection(now, &policy);
            assert_eq!(
                (block.level, block.duration_ns()),
                (level, duration_s * S),
                "at {now_s}"
            );
            assert_eq!(next.blocked_for_ns(now), Some(block.until_ns - now));
            word = next;
        }
    }

    #[test]
    fn without_block_max_there_is_no_escalation() {
        let policy = policy(2, 2);
        assert_eq!(policy.top_level(), 0);
        let (word, _) = BlockWord::default().after_rejection(0, &policy);
        let (_, block) = word.after_rejection(2 * S, &policy);
        assert_eq!((block.level, block.duration_ns()), (0, 2 * S));
    }

    #[test]
    fn hand_blocks_and_releases() {
        let policy = policy(60, 3600);
        let (word, block) = BlockWord::default().by_hand(5 * S, 10 * S);
        assert_eq!(
            (block.since_ns, block.until_ns, block.level),
            (5 * S, 15 * S, 0)
        );
        assert_eq!(word.blocked_for_ns(14 * S), Some(S));
        let released = word.released(7 * S);
        assert_eq!(released.blocked_for_ns(7 * S), None);
        // Released by hand and rejected again soon: the next level.
        let (_, block) = released.after_rejection(8 * S, &policy);
        assert_eq!(block.level, 1);
        // Releasing a key that is not blocked changes nothing.
        assert_eq!(released.released(9 * S), released);
        assert_eq!(BlockWord::default().released(1), BlockWord::default());
    }

    #[test]
    fn words_pack() {
        let word = BlockWord::new(BlockWord::MAX_UNTIL_MS, 63);
        assert_eq!(
            (word.until_ms(), word.level()),
            (BlockWord::MAX_UNTIL_MS, 63)
        );
        assert_eq!(word.0 & 0xffff, 0);
        assert_eq!(BlockWord::new(0, 0).until_ms(), 1);
        assert_eq!(BlockWord::new(u64::MAX, 200).level(), 63);
        assert!(BlockWord::default().is_spent(0, &policy(1, 1)));
    }

    #[test]
    fn huge_policies_do_not_overflow() {
        let max = BlockPolicy::MAX_NS;
        let policy = BlockPolicy {
            block_ns: max,
            block_max_ns: max,
        };
        let (word, block) = BlockWord::default().after_rejection(u64::MAX - 1, &policy);
        assert!(block.until_ns >= block.since_ns);
        assert!(word.0 != 0);
        let tiny = BlockPolicy {
            block_ns: 1,
            block_max_ns: max,
        };
        assert!(tiny.top_level() <= BlockWord::MAX_LEVEL);
        assert_eq!(tiny.duration_ns(63), max);
    }

    #[test]
    fn statuses() {
        #[rustfmt::skip]
        let rows = [
            ("401,403", vec![401, 403], vec![400, 404, 200, 0, 99, 600, 1000]),
            ("4xx", vec![400, 401, 499], vec![399, 500]),
            ("429", vec![429], vec![428, 430]),
            ("1XX,599", vec![100, 199, 599], vec![200, 598]),
        ];
        for (value, matched, unmatched) in rows {
            let matcher = StatusMatcher::parse("on_status=", value).unwrap();
            for status in matched {
                assert!(matcher.matches(status), "{value} {status}");
            }
            for status in unmatched {
                assert!(!matcher.matches(status), "{value} {status}");
            }
        }
        let matcher = StatusMatcher::parse("w", "401,4xx,503,429").unwrap();
        assert_eq!(matcher.to_string(), "4xx,503");
        for bad in [
            "", "4x", "40", "4011", "600", "099", "6xx", "0xx", "401,", ",401", "x01",
        ] {
            let word = format!("on_status={bad}");
            assert_eq!(
                StatusMatcher::parse(&word, bad),
                Err(SpecError::InvalidOnStatus(word.clone())),
                "{bad}"
            );
        }
    }

    #[test]
    fn durations() {
        #[rustfmt::skip]
        let rows = [
            ("15m", Some(900 * S)), ("24h", Some(86_400 * S)), ("30s", Some(30 * S)),
            ("2", Some(2 * S)), ("1d12h", Some(129_600 * S)), ("1w", Some(604_800 * S)),
            ("1M", Some(2_592_000 * S)), ("1y", Some(31_536_000 * S)), ("250ms", Some(S / 4)),
            ("1m30s", Some(90 * S)), ("1s500ms", Some(1_500_000_000)),
            ("", None), ("m", None), ("15", Some(15 * S)), ("-1s", None), ("1.5h", None),
            ("1h1h", None), ("1s1m", None), ("1 h", None), ("99999999999y", None),
            ("10m5", Some(605 * S)),
        ];
        for (text, expected) in rows {
            assert_eq!(parse_duration_ns(text), expected, "{text:?}");
        }
        #[rustfmt::skip]
        let texts = [
            (900 * S, "15m"), (86_400 * S, "1d"), (5400 * S, "1h30m"), (2 * S, "2s"),
            (S / 2, "500ms"), (0, "0s"), (90 * S, "1m30s"), (1_500_000_000, "1s500ms"),
        ];
        for (ns, text) in texts {
            assert_eq!(duration_text(ns), text);
        }
    }
}
