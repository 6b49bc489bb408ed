//! What the reader's parts share: the counts a body reported so far ([`Counts`]) and the
//! bounded bytes of a body or an event ([`Capped`]). Below the reader, the JSON views and the
//! event-stream parser, so none of them imports another in a circle.

/// The counts reported so far, each as the provider names it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counts {
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
