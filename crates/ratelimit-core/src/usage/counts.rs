//! What the reader's parts share: the counts a body reported so far ([`Counts`]) and the
//! bounded bytes of a body or an event ([`Capped`]). Below the reader, the JSON views and the
//! event-stream parser, so none of them imports another in a circle.

/// The largest count taken as one: 2^53, the largest integer every JSON reader holds exactly.
/// A provider's figure above it is a wrong figure, not a large one.
pub const MAX_COUNT: u64 = 1 << 53;

/// The bytes of a wrong figure kept to be logged.
pub const RAW_MAX: usize = 40;

/// A figure as the body wrote it (rendered again from what the parser read: `1e3` is read as
/// the float 1000 and shown `1000.0`), cut at [`RAW_MAX`] bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Raw {
    bytes: [u8; RAW_MAX],
    len: u8,
    /// Bytes were cut.
    cut: bool,
}

impl Raw {
    /// `text`, cut at [`RAW_MAX`] bytes.
    pub fn of(text: &[u8]) -> Raw {
        let len = text.len().min(RAW_MAX);
        let mut bytes = [0; RAW_MAX];
        bytes[..len].copy_from_slice(&text[..len]);
        Raw {
            bytes,
            len: len as u8,
            cut: text.len() > RAW_MAX,
        }
    }

    /// The kept bytes, and `...` when some were cut.
    pub fn text(&self) -> String {
        let kept = String::from_utf8_lossy(&self.bytes[..usize::from(self.len)]);
        if self.cut {
            format!("{kept}...")
        } else {
            kept.into_owned()
        }
    }
}

impl core::fmt::Debug for Raw {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{:?}", self.text())
    }
}

/// What makes a response's usage malformed: no usage, whatever else it reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Malformed {
    /// A figure that is not an integer from 0 to [`MAX_COUNT`] (`-5`, `"300"`, `1e3`, a
    /// usage object that is a number), or a usage object without a count (`{}`, all `null`).
    Figure(Raw),
    /// A document that names a usage but is not JSON its reader can read: what the parser
    /// said (a key given twice, a number out of range, `NaN`).
    Unreadable(Raw),
}

impl Malformed {
    /// The malformed figure, or a JSON error, with what is valid: for a log line.
    ///
    /// ```
    /// use ratelimit_core::usage::{Malformed, Raw};
    ///
    /// assert_eq!(
    ///     Malformed::Figure(Raw::of(b"-5")).reason(),
    ///     "a count must be an integer from 0 to 9007199254740992, not -5"
    /// );
    /// ```
    pub fn reason(&self) -> String {
        match self {
            Malformed::Figure(raw) => format!(
                "a count must be an integer from 0 to {MAX_COUNT}, not {}",
                raw.text()
            ),
            Malformed::Unreadable(raw) => format!(
                "the JSON that names it cannot be read ({}): each key once, numbers that fit",
                raw.text()
            ),
        }
    }

    /// The parser's error, without where it was (`duplicate field `usage``).
    pub(crate) fn unreadable(error: &serde_json::Error) -> Malformed {
        let text = error.to_string();
        let text = text.split(" at line ").next().unwrap_or(&text);
        Malformed::Unreadable(Raw::of(text.as_bytes()))
    }
}

/// The counts reported so far, each as the provider names it, and what was wrong with them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    /// A usage object was seen (a count in it or not).
    pub(crate) reported: bool,
    /// The first figure that is not an integer from 0 to [`MAX_COUNT`] and not `null`, or
    /// the first document naming a usage that could not be read.
    pub(crate) malformed: Option<Malformed>,
    /// A count was `null` (read as not reported: the providers write `null` for a count they
    /// do not know, Anthropic's `message_delta` for its input counts).
    pub(crate) null: bool,
    pub(crate) input: Option<u64>,
    pub(crate) output: Option<u64>,
    pub(crate) total: Option<u64>,
    pub(crate) cached: Option<u64>,
    /// Anthropic's `cache_creation_input_tokens` (input, written to the cache).
    pub(crate) cache_creation: Option<u64>,
    /// Gemini's `thoughtsTokenCount` (output).
    pub(crate) thoughts: Option<u64>,
}

/// Bytes kept whole up to a size, then only their end.
pub(crate) struct Capped {
    bytes: Vec<u8>,
    whole_max: usize,
    tail_max: usize,
    truncated: bool,
}

impl Capped {
    pub(crate) fn new(whole_max: usize, tail_max: usize) -> Capped {
        Capped {
            bytes: Vec::new(),
            whole_max,
            tail_max,
            truncated: false,
        }
    }

    pub(crate) fn extend(&mut self, more: &[u8]) {
        if !self.truncated && self.bytes.len() + more.len() <= self.whole_max {
            self.bytes.extend_from_slice(more);
            return;
        }
        self.truncated = true;
        if more.len() >= self.tail_max {
            self.bytes.clear();
            self.bytes
                .extend_from_slice(&more[more.len() - self.tail_max..]);
            return;
        }
        self.bytes.extend_from_slice(more);
        // Cut back to the tail only once it doubled: each byte is moved a bounded number of
        // times.
        if self.bytes.len() > 2 * self.tail_max {
            let cut = self.bytes.len() - self.tail_max;
            self.bytes.drain(..cut);
        }
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.bytes.is_empty() && !self.truncated
    }

    pub(crate) fn strip_last_newline(&mut self) {
        if self.bytes.last() == Some(&b'\n') {
            self.bytes.pop();
        }
    }

    pub(crate) fn clear(&mut self) {
        self.bytes.clear();
        self.truncated = false;
    }

    /// Whether bytes were dropped: only the end is kept.
    pub(crate) fn is_truncated(&self) -> bool {
        self.truncated
    }
}
