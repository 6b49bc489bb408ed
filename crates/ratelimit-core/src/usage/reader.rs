//! The response-body reader: fed every buffer of a response as it passes (never holding
//! one back), it finds the usage the provider reports, in plain JSON or in a stream of
//! server-sent events, for any split of the bytes into chunks.
//!
//! | provider | plain JSON | streamed (SSE) |
//! |---|---|---|
//! | `openai` | `usage` (Chat Completions: `prompt_tokens`, `completion_tokens`, `total_tokens`, `prompt_tokens_details.cached_tokens`; Responses: `input_tokens`, `output_tokens`, `total_tokens`, `input_tokens_details.cached_tokens`) | a chunk's `usage` (the last chunk, when the request set `stream_options.include_usage`); `response.usage` of `response.completed` (also `.incomplete`, `.failed`) |
//! | `anthropic` | `usage` (`input_tokens`, `output_tokens`, `cache_read_input_tokens`, `cache_creation_input_tokens`) | `message_start`'s `message.usage`, then each `message_delta`'s `usage` (cumulative) |
//! | `gemini` | `usageMetadata` (`promptTokenCount`, `candidatesTokenCount`, `thoughtsTokenCount`, `totalTokenCount`, `cachedContentTokenCount`), also in each element of a JSON array | each chunk's `usageMetadata` (cumulative; the last wins) |
//!
//! Whether a body is a stream of events is told by its first bytes (a field, `data:`,
//! `event:`, `id:`, `retry:`, or a `:` comment; JSON begins with `{` or `[`), whatever the
//! `Content-Type` says; only a body whose first bytes tell neither is read as that says.
//!
//! Later reports replace earlier ones field by field (the providers' counts are cumulative).
//! A figure that is not an integer from 0 to 2^53 makes the response's usage malformed
//! ([`Reported::Malformed`]): no usage, whatever else it reported.
//! Memory is bounded: a plain body is kept whole up to [`JSON_WHOLE_MAX`] bytes, an event's
//! data up to [`EVENT_WHOLE_MAX`]; past that only the last [`TAIL_MAX`] bytes are kept and
//! the usage object is looked for in them (the providers write it last). A body must reach
//! the reader uncompressed.

use std::sync::OnceLock;

use memchr::memmem::Finder;

use super::counts::{Capped, Counts, Malformed, Raw};
use super::json;
use super::sse::EventStream;
use super::{Provider, Usage};

/// The largest plain JSON body kept whole.
pub const JSON_WHOLE_MAX: usize = 256 << 10;
/// The largest event data kept whole.
pub const EVENT_WHOLE_MAX: usize = 64 << 10;
/// What is kept of the end of a longer body or event.
pub const TAIL_MAX: usize = 64 << 10;

/// Read the provider's usage from `kept`: the whole document (`event`: the event's name,
/// for an event's data) when it was kept whole; else the usage object found nearest the end
/// of the tail, under its key. Whether it carried usage. A document that names a usage (not
/// `null`) but is not JSON the provider's view reads (a key twice, a number out of range,
/// `NaN`) makes the usage malformed; one that ends before its JSON does (a body cut short)
/// carried none.
fn read_kept(kept: &Capped, provider: Provider, event: Option<&[u8]>, counts: &mut Counts) -> bool {
    let unreadable = |error: serde_json::Error, counts: &mut Counts| {
        counts.reported = true;
        counts
            .malformed
            .get_or_insert(Malformed::unreadable(&error));
        false
    };
    if !kept.is_truncated() {
        let read = match event {
            Some(event) => json::read_event(provider, event, kept.bytes(), counts),
            None => json::read_document(provider, kept.bytes(), counts),
        };
        return match read {
            Ok(found) => found,
            Err(error) if error.is_eof() => false,
            Err(error) => {
                let names_usage = !usage_only_null(kept.bytes(), usage_finder(provider), is_blank);
                names_usage && unreadable(error, counts)
            }
        };
    }
    let key = usage_key(provider);
    let needle = format!("\"{key}\"");
    let mut end = kept.bytes().len();
    while let Some(at) = memchr::memmem::rfind(&kept.bytes()[..end], needle.as_bytes()) {
        end = at;
        let rest = trim_start(&kept.bytes()[at + needle.len()..]);
        let Some(rest) = rest.strip_prefix(b":") else {
            continue;
        };
        // The nearest object that carries counts (an earlier one may, when the last is
        // `null` or cut).
        match json::read_usage_object(provider, trim_start(rest), counts) {
            Ok(true) => return true,
            Ok(false) => {}
            Err(error) if error.is_eof() => {}
            Err(error) => return unreadable(error, counts),
        }
    }
    false
}

/// Any JSON blank.
fn is_blank(byte: u8) -> bool {
    byte.is_ascii_whitespace()
}

/// When a model is looked for (`Some(None)`) and `kept` was kept whole, the model it names.
fn read_model(kept: &Capped, model: &mut Option<Option<String>>) {
    if let (Some(slot @ None), false) = (model.as_mut(), kept.is_truncated()) {
        *slot = super::model::model_of(kept.bytes());
    }
}

/// Whether an event's data names the provider's usage key with a value other than `null`:
/// only such events are parsed. (A key inside a string is escaped, `\"usage\"`, and does not
/// match; one that does only costs a parse.)
fn may_carry_usage(data: &[u8], needle: &Finder<'static>) -> bool {
    !usage_only_null(data, needle, |byte| byte.is_ascii_whitespace())
}

/// Whether every usage key in `bytes` is followed by `:` and `null`, with only bytes that
/// `blank` accepts around the colon. With spaces and tabs as blanks (on the key's line),
/// no event made of these bytes carries a usage.
fn usage_only_null(bytes: &[u8], needle: &Finder<'static>, blank: fn(u8) -> bool) -> bool {
    let skip_blanks = |bytes: &'_ [u8]| -> usize {
        bytes
            .iter()
            .position(|&byte| !blank(byte))
            .unwrap_or(bytes.len())
    };
    let key = needle.needle();
    let mut rest = bytes;
    // Searched from after each `null`, and not at all in a rest shorter than the key (most
    // buffers end a few bytes after their one `"usage":null`): each search costs a call
    // into the searcher, more than the bytes it looks at here.
    while rest.len() >= key.len() {
        let Some(at) = needle.find(rest) else {
            return true;
        };
        let after = &rest[at + key.len()..];
        let after = &after[skip_blanks(after)..];
        let Some(value) = after.strip_prefix(b":") else {
            return false;
        };
        let Some(next) = value[skip_blanks(value)..].strip_prefix(b"null") else {
            return false;
        };
        rest = next;
    }
    true
}

/// A blank within a line: a space or a tab.
fn space_or_tab(byte: u8) -> bool {
    byte == b' ' || byte == b'\t'
}

/// The provider's usage key, quoted, as [`may_carry_usage`] looks for it: built once per
/// process (building a searcher costs more than a stream's searches with it).
fn usage_finder(provider: Provider) -> &'static Finder<'static> {
    static FINDERS: OnceLock<[Finder<'static>; 2]> = OnceLock::new();
    let [usage, usage_metadata] = FINDERS.get_or_init(|| {
        [
            Finder::new(&b"\"usage\""[..]),
            Finder::new(&b"\"usageMetadata\""[..]),
        ]
    });
    match provider {
        Provider::OpenAi | Provider::Anthropic => usage,
        Provider::Gemini => usage_metadata,
    }
}

/// Whether `bytes` ends with an empty line (two line ends in a row, each `\n`, `\r\n` or
/// `\r`, the last not a lone `\r`): a stream between events before them is between events
/// after them, whatever lines came before.
fn ends_with_blank_line(bytes: &[u8]) -> bool {
    let Some(rest) = bytes.strip_suffix(b"\n") else {
        return false;
    };
    let rest = rest.strip_suffix(b"\r").unwrap_or(rest);
    rest.ends_with(b"\n") || rest.ends_with(b"\r")
}

fn trim_start(bytes: &[u8]) -> &[u8] {
    let start = bytes
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(bytes.len());
    &bytes[start..]
}

fn usage_key(provider: Provider) -> &'static str {
    match provider {
        Provider::OpenAi | Provider::Anthropic => "usage",
        Provider::Gemini => "usageMetadata",
    }
}

/// How the body is framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// One JSON document (or, for Gemini's `streamGenerateContent` without `alt=sse`, a JSON
    /// array of them).
    Json,
    /// `text/event-stream`.
    EventStream,
}

impl Format {
    /// From the response's `Content-Type`: `text/event-stream` (any parameters), else JSON.
    ///
    /// ```
    /// use ratelimit_core::usage::reader::Format;
    ///
    /// assert_eq!(Format::of_content_type(b"text/event-stream; charset=utf-8"), Format::EventStream);
    /// assert_eq!(Format::of_content_type(b"application/json"), Format::Json);
    /// ```
    pub fn of_content_type(content_type: &[u8]) -> Format {
        let essence = content_type
            .split(|&b| b == b';')
            .next()
            .unwrap_or_default();
        let media = b"text/event-stream";
        let prefix = trim_start(essence).get(..media.len());
        if prefix.is_some_and(|prefix| prefix.eq_ignore_ascii_case(media)) {
            Format::EventStream
        } else {
            Format::Json
        }
    }
}

/// The reader of one response body.
pub struct Reader {
    provider: Provider,
    /// `None` until the body's first bytes say which it is.
    format: Option<Format>,
    /// What the `Content-Type` says: the format of a body whose first bytes do not tell.
    declared: Format,
    /// The body's first bytes (blanks skipped) while they do not yet tell the format.
    first: [u8; SNIFF_MAX],
    first_len: usize,
    body: Capped,
    events: Option<EventStream>,
    counts: Counts,
    found: bool,
    /// The provider's usage key (`"usage"`), searched once per buffer and per event.
    needle: &'static Finder<'static>,
    /// The characters of streamed text counted so far, when counting ([`Reader::estimating`]).
    text_chars: Option<u64>,
    /// The model the body names, looked for only after [`Reader::read_model`] (a line with
    /// `prices=`): in a plain body kept whole, or in an event that carries usage.
    model: Option<Option<String>>,
}

/// The most bytes that tell an event stream from JSON: `event:` and `retry:`.
const SNIFF_MAX: usize = 6;

/// What a body's first bytes say it is; `None` while they may still begin either.
///
/// An event stream begins with a field (`data:`, `event:`, `id:`, `retry:`) or a comment
/// (`:`); JSON with `{` or `[`. Anything else is what the `Content-Type` says.
fn sniff(first: &[u8], declared: Format) -> Option<Format> {
    match first.first()? {
        b'{' | b'[' => return Some(Format::Json),
        b':' => return Some(Format::EventStream),
        _ => {}
    }
    let mut undecided = false;
    for field in [&b"data:"[..], b"event:", b"id:", b"retry:"] {
        if first.starts_with(field) {
            return Some(Format::EventStream);
        }
        undecided |= field.starts_with(first);
    }
    (!undecided).then_some(declared)
}

/// What a response reported about its usage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reported {
    /// Counts, every one valid.
    Usage(Usage),
    /// A usage with a figure that is not an integer from 0 to 2^53 (the first such figure),
    /// a usage object with no count at all (`null` figures, or none), or a document naming a
    /// usage that cannot be read: no usage to charge.
    Malformed(Malformed),
    /// No usage object.
    Nothing,
}

impl Reader {
    /// A reader for a body from `provider` whose `Content-Type` says `declared`: the body's
    /// first bytes decide ([`sniff`]), so an event stream sent as `text/plain` or
    /// `application/json` is read as one.
    pub fn new(provider: Provider, declared: Format) -> Reader {
        Reader {
            provider,
            format: None,
            declared,
            first: [0; SNIFF_MAX],
            first_len: 0,
            body: Capped::new(0, 0),
            events: None,
            counts: Counts::default(),
            found: false,
            needle: usage_finder(provider),
            text_chars: None,
            model: None,
        }
    }

    /// Look for the model the body names too ([`Reader::model`]).
    pub fn read_model(&mut self) {
        self.model.get_or_insert(None);
    }

    /// The model the body named, when [`Reader::read_model`] asked for it and one was found.
    pub fn model(&self) -> Option<&str> {
        self.model.as_ref()?.as_deref()
    }

    /// Also count the characters of the text the stream delivers, for [`Reader::estimate`]
    /// (every event is then parsed, not only the ones that may carry usage).
    pub fn estimating(mut self) -> Reader {
        self.text_chars = Some(0);
        self
    }

    /// The output's tokens as estimated from the streamed text: its characters / 4, rounded
    /// up; `None` when not counting or when no text was streamed.
    pub fn estimate(&self) -> Option<u64> {
        self.text_chars
            .filter(|&chars| chars > 0)
            .map(|chars| chars.div_ceil(4))
    }

    /// The next bytes of the body.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.format.is_some() {
            return self.feed_known(bytes);
        }
        // Leading blanks say nothing (JSON ignores them; in a stream they are empty lines),
        // nor does a byte order mark (its bytes skipped one by one: they may be split).
        let bytes = if self.first_len == 0 {
            let start = bytes
                .iter()
                .position(|&b| !b.is_ascii_whitespace() && !matches!(b, 0xEF | 0xBB | 0xBF))
                .unwrap_or(bytes.len());
            &bytes[start..]
        } else {
            bytes
        };
        let taken = bytes.len().min(SNIFF_MAX - self.first_len);
        self.first[self.first_len..self.first_len + taken].copy_from_slice(&bytes[..taken]);
        self.first_len += taken;
        if let Some(format) = sniff(&self.first[..self.first_len], self.declared) {
            self.decide(format);
            self.feed_known(&bytes[taken..]);
        }
    }

    /// Read as `format` from now on, beginning with the bytes kept to decide.
    fn decide(&mut self, format: Format) {
        self.format = Some(format);
        match format {
            Format::Json => self.body = Capped::new(JSON_WHOLE_MAX, TAIL_MAX),
            Format::EventStream => {
                self.events = Some(EventStream::new(Capped::new(EVENT_WHOLE_MAX, TAIL_MAX)))
            }
        }
        let first = self.first;
        self.feed_known(&first[..self.first_len]);
    }

    fn feed_known(&mut self, bytes: &[u8]) {
        match &mut self.events {
            Some(events) => {
                // Whole events in which the usage key is only ever `null` change nothing:
                // each would be gathered, dispatched and skipped below. (An event's data is
                // its lines' values joined by line feeds, and the key holds none: a key in
                // any event's data is in the buffer, followed on its line by the same bytes.)
                // Most buffers of a stream are such: OpenAI's chunks say `"usage":null`.
                if self.text_chars.is_none()
                    && events.between_events()
                    && ends_with_blank_line(bytes)
                    && usage_only_null(bytes, self.needle, space_or_tab)
                {
                    return;
                }
                let (provider, counts, found) = (self.provider, &mut self.counts, &mut self.found);
                let (needle, model) = (self.needle, &mut self.model);
                let text_chars = &mut self.text_chars;
                events.feed(bytes, &mut |event, data| {
                    if let Some(chars) = text_chars.as_mut() {
                        *chars = chars.saturating_add(json::text_chars(provider, data.bytes()));
                    }
                    // Most events carry no usage (content deltas, or `"usage":null`): they
                    // are not parsed at all.
                    if !may_carry_usage(data.bytes(), needle) {
                        return;
                    }
                    *found |= read_kept(data, provider, Some(event), counts);
                    read_model(data, model);
                });
            }
            None => self.body.extend(bytes),
        }
    }

    /// The body ended: a plain body is read now. (An event the stream left unfinished is
    /// dropped, as the standard says.)
    pub fn finish(&mut self) {
        if self.format.is_none() {
            self.decide(self.declared);
        }
        if self.format == Some(Format::Json) {
            self.found |= read_kept(&self.body, self.provider, None, &mut self.counts);
            read_model(&self.body, &mut self.model);
            self.body.clear();
        }
    }

    /// The format the body was read as, once its first bytes told.
    pub fn format(&self) -> Option<Format> {
        self.format
    }

    /// The usage found so far, `None` when none was or it was malformed.
    pub fn usage(&self) -> Option<Usage> {
        match self.reported() {
            Reported::Usage(usage) => Some(usage),
            Reported::Malformed(_) | Reported::Nothing => None,
        }
    }

    /// What the body reported so far.
    pub fn reported(&self) -> Reported {
        if let Some(malformed) = self.counts.malformed {
            return Reported::Malformed(malformed);
        }
        if self.found {
            return Reported::Usage(self.normalised());
        }
        if self.counts.reported {
            let raw: &[u8] = if self.counts.null { b"null" } else { b"{}" };
            return Reported::Malformed(Malformed::Figure(Raw::of(raw)));
        }
        Reported::Nothing
    }

    fn normalised(&self) -> Usage {
        let c = &self.counts;
        let value = |field: Option<u64>| field.unwrap_or(0);
        let (prompt, completion, cached) = match self.provider {
            Provider::OpenAi => (value(c.input), value(c.output), value(c.cached)),
            // Anthropic's input_tokens leaves out what was read from or written to a cache.
            Provider::Anthropic => (
                value(c.input)
                    .saturating_add(value(c.cached))
                    .saturating_add(value(c.cache_creation)),
                value(c.output),
                value(c.cached),
            ),
            Provider::Gemini => (
                value(c.input),
                value(c.output).saturating_add(value(c.thoughts)),
                value(c.cached),
            ),
        };
        let total = match (self.provider, c.total) {
            (Provider::Anthropic, _) | (_, None) => prompt.saturating_add(completion),
            (_, Some(total)) => total,
        };
        Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            cached_tokens: cached,
            total_tokens: total,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimate_counts_each_providers_streamed_text() {
        #[rustfmt::skip]
        let rows: &[(Provider, &str, Option<u64>)] = &[
            (Provider::OpenAi, "data: {\"choices\":[{\"delta\":{\"content\":\"h\\u00e9llo\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"abc\"}}]}\n\ndata: [DONE]\n\n", Some(2)),
            (Provider::OpenAi, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"abcdefghi\"}\n\n", Some(3)),
            (Provider::Anthropic, "event: content_block_delta\ndata: {\"delta\":{\"type\":\"text_delta\",\"text\":\"abcd\"}}\n\n", Some(1)),
            (Provider::Gemini, "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"ab\"},{\"text\":\"cdefg\"}]}}]}\n\n", Some(2)),
            (Provider::OpenAi, "data: {\"choices\":[],\"usage\":null}\n\n", None),
        ];
        for &(provider, stream, expected) in rows {
            let mut reader = Reader::new(provider, Format::EventStream).estimating();
            for byte in stream.as_bytes() {
                reader.feed(core::slice::from_ref(byte));
            }
            reader.finish();
            assert_eq!(reader.estimate(), expected, "{stream}");
            let mut whole = Reader::new(provider, Format::EventStream).estimating();
            whole.feed(stream.as_bytes());
            assert_eq!(whole.estimate(), expected, "{stream}");
        }
        let mut not_counting = Reader::new(Provider::OpenAi, Format::EventStream);
        not_counting.feed(rows[0].1.as_bytes());
        assert_eq!(not_counting.estimate(), None);
    }

    fn read(provider: Provider, format: Format, body: &[u8]) -> Option<Usage> {
        let mut reader = Reader::new(provider, format);
        reader.feed(body);
        reader.finish();
        reader.usage()
    }

    fn usage(prompt: u64, completion: u64, cached: u64, total: u64) -> Option<Usage> {
        Some(Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            cached_tokens: cached,
            total_tokens: total,
        })
    }

    /// The model is looked for only when asked, in a plain body and in the event that carries
    /// the usage, for any split of the bytes.
    #[test]
    fn model_named_by_the_body() {
        let plain = br#"{"model":"gpt-4o-mini","usage":{"prompt_tokens":1,"completion_tokens":2}}"#;
        let stream = b"data: {\"model\":\"gpt-4o\",\"choices\":[],\"usage\":null}\n\n\
            data: {\"model\":\"gpt-4o-2024-08-06\",\"usage\":{\"prompt_tokens\":3}}\n\n\
            data: [DONE]\n\n";
        for (format, body, model) in [
            (Format::Json, &plain[..], "gpt-4o-mini"),
            (Format::EventStream, &stream[..], "gpt-4o-2024-08-06"),
        ] {
            for split in 1..body.len() {
                let mut reader = Reader::new(Provider::OpenAi, format);
                reader.read_model();
                reader.feed(&body[..split]);
                reader.feed(&body[split..]);
                reader.finish();
                assert_eq!(reader.model(), Some(model), "split at {split}");
                assert!(reader.usage().is_some());
            }
            let mut reader = Reader::new(Provider::OpenAi, format);
            reader.feed(body);
            reader.finish();
            assert_eq!(reader.model(), None, "not asked");
        }
    }

    #[test]
    fn plain_bodies() {
        use Format::Json;
        use Provider::*;
        #[rustfmt::skip]
        let rows: &[(Provider, &str, Option<Usage>)] = &[
            (OpenAi, r#"{"object":"chat.completion","usage":{"prompt_tokens":12,"completion_tokens":30,"total_tokens":42,"prompt_tokens_details":{"cached_tokens":4}}}"#, usage(12, 30, 4, 42)),
            (OpenAi, r#"{"object":"response","usage":{"input_tokens":7,"output_tokens":9,"total_tokens":16,"input_tokens_details":{"cached_tokens":0}}}"#, usage(7, 9, 0, 16)),
            (OpenAi, r#"{"object":"list","data":[{"id":"gpt"}]}"#, None),
            (OpenAi, r#"{"error":{"message":"bad","type":"invalid_request_error"}}"#, None),
            (OpenAi, r#"{"usage":null}"#, None),
            (OpenAi, r#"{"usage":{"prompt_tokens":-1}}"#, None),
            (OpenAi, "not json", None),
            (Anthropic, r#"{"type":"message","usage":{"input_tokens":10,"cache_read_input_tokens":5,"cache_creation_input_tokens":2,"output_tokens":20}}"#, usage(17, 20, 5, 37)),
            (Gemini, r#"{"candidates":[],"usageMetadata":{"promptTokenCount":8,"candidatesTokenCount":3,"totalTokenCount":11,"cachedContentTokenCount":2}}"#, usage(8, 3, 2, 11)),
            (Gemini, r#"[{"usageMetadata":{"promptTokenCount":8,"candidatesTokenCount":1,"totalTokenCount":9}},{"usageMetadata":{"promptTokenCount":8,"candidatesTokenCount":5,"totalTokenCount":13}}]"#, usage(8, 5, 0, 13)),
            (Gemini, r#"{"usageMetadata":{"promptTokenCount":8,"candidatesTokenCount":3,"thoughtsTokenCount":4,"totalTokenCount":15}}"#, usage(8, 7, 0, 15)),
            // Lenient where documents vary: an object that is something else is absent, a
            // `null` count is not reported, the other fields are skipped whatever they hold.
            // Strict on the counts: any that is not an integer from 0 to 2^53 makes the
            // usage malformed, which is no usage (`malformed_figures` below).
            (OpenAi, r#"{"usage":{"prompt_tokens":3.5,"completion_tokens":"4","total_tokens":9,"prompt_tokens_details":null}}"#, None),
            (OpenAi, r#"{"usage":{"prompt_tokens":3,"completion_tokens":4,"prompt_tokens_details":[1],"input_tokens_details":{"cached_tokens":1}}}"#, usage(3, 4, 1, 7)),
            (OpenAi, r#"{"usage":{"prompt_tokens":3,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":null},"extra":{"deep":[{"a":null}]}}}"#, usage(3, 4, 0, 7)),
            (OpenAi, r#"{"usage":{"prompt_tokens":3,"completion_tokens":null}}"#, None),
            (OpenAi, r#"{"usage":{"prompt_tokens":3,"completion_tokens":{"n":4}}}"#, None),
            (Anthropic, r#"{"usage":{"input_tokens":5,"output_tokens":2,"cache_read_input_tokens":null,"cache_creation_input_tokens":null}}"#, usage(5, 2, 0, 7)),
            (OpenAi, r#"{"usage":7,"choices":[{"message":{"content":"\u00e9 \"usage\""}}]}"#, None),
            (OpenAi, r#"{"usage":{"prompt_tokens":18446744073709551616}}"#, None),
            (Anthropic, r#"{"type":"mess\u0061ge","usage":{"input_tokens":1,"output_tokens":2}}"#, usage(1, 2, 0, 3)),
            (Gemini, r#"  [{"usageMetadata":null},{"usageMetadata":{"promptTokenCount":2,"candidatesTokenCount":1}}]"#, usage(2, 1, 0, 3)),
        ];
        for (provider, body, expected) in rows {
            assert_eq!(&read(*provider, Json, body.as_bytes()), expected, "{body}");
        }
    }

    #[test]
    fn events_without_usage_are_not_parsed() {
        use Provider::*;
        #[rustfmt::skip]
        let rows: &[(Provider, &str, bool)] = &[
            (OpenAi, r#"{"choices":[{"delta":{"content":"hi"}}],"usage":null}"#, false),
            (OpenAi, r#"{"choices":[],"usage" : null , "x": 1}"#, false),
            (OpenAi, r#"{"choices":[],"usage":{"prompt_tokens":1}}"#, true),
            (OpenAi, r#"{"delta":"a \"usage\": {"}"#, false),
            (Anthropic, r#"{"type":"content_block_delta","delta":{"text":"x"}}"#, false),
            (Anthropic, r#"{"type":"message_delta","usage":{"output_tokens":3}}"#, true),
            (Gemini, r#"{"usageMetadata":{"promptTokenCount":1}}"#, true),
            (Gemini, r#"{"usage":{"promptTokenCount":1}}"#, false),
        ];
        for (provider, data, expected) in rows {
            assert_eq!(
                may_carry_usage(data.as_bytes(), usage_finder(*provider)),
                *expected,
                "{data}"
            );
        }
    }

    #[test]
    fn a_long_body_is_read_from_its_tail() {
        let content = "x".repeat(JSON_WHOLE_MAX * 3);
        let body = format!(
            r#"{{"choices":[{{"message":{{"content":"{content} \"usage\": 1"}}}}],"usage":{{"prompt_tokens":5,"completion_tokens":900,"total_tokens":905}}}}"#
        );
        let mut reader = Reader::new(Provider::OpenAi, Format::Json);
        for chunk in body.as_bytes().chunks(4096) {
            reader.feed(chunk);
            assert!(reader.body.bytes().len() <= JSON_WHOLE_MAX.max(2 * TAIL_MAX + 4096));
        }
        reader.finish();
        assert_eq!(reader.usage(), usage(5, 900, 0, 905));
    }

    #[test]
    fn buffers_whose_usage_is_only_null() {
        let needle = usage_finder(Provider::OpenAi);
        for (bytes, only_null) in [
            (&br#"data: {"choices":[]}"#[..], true),
            (br#"data: {"usage":null}"#, true),
            (br#"data: {"usage" :	 null}\n\ndata: {"usage":null}"#, true),
            (
                br#"data: {"usage":null}\n\ndata: {"usage":{"total_tokens":3}}"#,
                false,
            ),
            // A line may end between the key and its value: not known from here.
            (b"data: {\"usage\"\ndata: :null}", false),
            (br#"data: {"usage"}"#, false),
            // Searched again after each `null`, up to a rest shorter than the key.
            (br#"{"usage":null,"usage":1}"#, false),
            (br#"{"usage":null}"usage":null"#, true),
            (br#"{"usage":null}"usage""#, false),
            (br#"{"usage":null}"usag"#, true),
        ] {
            assert_eq!(
                usage_only_null(bytes, needle, space_or_tab),
                only_null,
                "{:?}",
                String::from_utf8_lossy(bytes)
            );
        }
    }

    #[test]
    fn a_blank_line_at_the_end_in_every_line_ending() {
        for bytes in [
            &b"data: x\n\n"[..],
            b"x\r\n\r\n",
            b"x\r\n\n",
            b"x\n\r\n",
            b"x\r\r\n",
            b"\n\n",
        ] {
            assert!(ends_with_blank_line(bytes), "{bytes:?}");
        }
        // One line end, a lone `\r` (its `\n` may come next), or nothing.
        for bytes in [
            &b"data: x\n"[..],
            b"x\r\n",
            b"x\n\r",
            b"x\r\r",
            b"\n",
            b"",
            b"x",
        ] {
            assert!(!ends_with_blank_line(bytes), "{bytes:?}");
        }
    }

    #[test]
    fn streams() {
        use Format::EventStream;
        use Provider::*;
        #[rustfmt::skip]
        let rows: &[(Provider, &str, Option<Usage>)] = &[
            (OpenAi, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5}}\n\ndata: [DONE]\n\n", usage(3, 2, 0, 5)),
            // Without stream_options.include_usage: no usage.
            (OpenAi, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n", None),
            (OpenAi, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"usage\":null}}\n\nevent: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":4,\"output_tokens\":6,\"total_tokens\":10,\"input_tokens_details\":{\"cached_tokens\":1}}}}\n\n", usage(4, 6, 1, 10)),
            (Anthropic, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"cache_read_input_tokens\":5,\"output_tokens\":1}}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", usage(30, 15, 5, 45)),
            (Gemini, "data: {\"usageMetadata\":{\"promptTokenCount\":6,\"candidatesTokenCount\":1,\"totalTokenCount\":7}}\r\n\r\ndata: {\"usageMetadata\":{\"promptTokenCount\":6,\"candidatesTokenCount\":9,\"totalTokenCount\":15}}\r\n\r\n", usage(6, 9, 0, 15)),
        ];
        for (provider, body, expected) in rows {
            assert_eq!(
                &read(*provider, EventStream, body.as_bytes()),
                expected,
                "{body}"
            );
        }
    }

    #[test]
    fn malformed_figures() {
        use Provider::*;
        let huge = "18446744073709551617";
        #[rustfmt::skip]
        let rows: &[(Provider, String, Reported)] = &[
            (OpenAi, r#"{"usage":{"prompt_tokens":null,"completion_tokens":null,"total_tokens":null}}"#.into(), malformed("null")),
            (OpenAi, r#"{"usage":{"prompt_tokens":-5,"completion_tokens":10}}"#.into(), malformed("-5")),
            (OpenAi, r#"{"usage":{"prompt_tokens":1.5,"completion_tokens":10}}"#.into(), malformed("1.5")),
            (OpenAi, r#"{"usage":{"prompt_tokens":5,"completion_tokens":"300"}}"#.into(), malformed("\"300\"")),
            (OpenAi, format!(r#"{{"usage":{{"total_tokens":{huge}}}}}"#), malformed("1.8446744073709552e19")),
            (OpenAi, r#"{"usage":{"total_tokens":1e3}}"#.into(), malformed("1000.0")),
            (OpenAi, r#"{"usage":{"total_tokens":9007199254740993}}"#.into(), malformed("9007199254740993")),
            (OpenAi, r#"{"usage":{"total_tokens":true}}"#.into(), malformed("true")),
            (OpenAi, r#"{"usage":{}}"#.into(), malformed("{}")),
            (OpenAi, r#"{"usage":{"prompt_tokens":null,"completion_tokens":0,"total_tokens":0}}"#.into(), malformed("null")),
            (Anthropic, r#"{"usage":{"input_tokens":null,"cache_read_input_tokens":null}}"#.into(), malformed("null")),
            (OpenAi, format!(r#"{{"usage":{{"total_tokens":"{}"}}}}"#, "x".repeat(100)), Reported::Malformed(Malformed::Figure(Raw::of(format!("\"{}", "x".repeat(100)).as_bytes())))),
            (OpenAi, r#"{"usage":{"total_tokens":9007199254740992}}"#.into(), Reported::Usage(Usage { prompt_tokens: 0, completion_tokens: 0, cached_tokens: 0, total_tokens: 1 << 53 })),
            (OpenAi, r#"{"usage":null}"#.into(), Reported::Nothing),
            (Gemini, r#"{"usageMetadata":{"promptTokenCount":2,"candidatesTokenCount":-1}}"#.into(), malformed("-1")),
            (Anthropic, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":-15}}\n\n".into(), malformed("-15")),
            // Hostile documents: a key twice (a JSON reader that keeps the last one would read
            // another usage), numbers no reader holds, a usage that is not an object.
            (OpenAi, r#"{"usage":{"prompt_tokens":5,"completion_tokens":0,"completion_tokens":900}}"#.into(), unreadable("duplicate field `completion_tokens`")),
            (OpenAi, r#"{"usage":{"total_tokens":0},"usage":{"total_tokens":900}}"#.into(), unreadable("duplicate field `usage`")),
            (OpenAi, r#"{"usage":{"total_tokens":1e400}}"#.into(), unreadable("number out of range")),
            (OpenAi, r#"{"usage":{"total_tokens":NaN}}"#.into(), unreadable("expected value")),
            (Anthropic, r#"{"type":"message","type":"x","usage":{"input_tokens":1,"output_tokens":2}}"#.into(), unreadable("duplicate field `type`")),
            (Gemini, r#"[{"usageMetadata":{"promptTokenCount":1}},{"usageMetadata":{"promptTokenCount":1,"promptTokenCount":2}}]"#.into(), unreadable("duplicate field `promptTokenCount`")),
            (OpenAi, r#"{"usage":7}"#.into(), malformed("7")),
            (OpenAi, r#"{"usage":"1000"}"#.into(), malformed("\"1000\"")),
            (OpenAi, r#"{"usage":[1000]}"#.into(), malformed("[...]")),
            (Gemini, r#"{"usageMetadata":true}"#.into(), malformed("true")),
            (OpenAi, "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":-1}}\n\n".into(), malformed("-1")),
            (OpenAi, "data: {\"choices\":[],\"usage\":{\"total_tokens\":1,\"total_tokens\":9}}\n\ndata: [DONE]\n\n".into(), unreadable("duplicate field `total_tokens`")),
            (OpenAi, "data: {\"choices\":[],\"usage\":null,\"usage\":{\"total_tokens\":9}}\n\n".into(), unreadable("duplicate field `usage`")),
            // Not a usage: other keys twice, a body that is not JSON, one cut short, `null`.
            (OpenAi, r#"{"id":"a","id":"b","usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}"#.into(), Reported::Usage(Usage { prompt_tokens: 1, completion_tokens: 2, cached_tokens: 0, total_tokens: 3 })),
            (OpenAi, "<html>502 Bad Gateway</html>".into(), Reported::Nothing),
            (OpenAi, r#"{"usage":{"prompt_tokens":1,"comp"#.into(), Reported::Nothing),
            (OpenAi, r#"{"usage":null,"x":NaN}"#.into(), Reported::Nothing),
            (OpenAi, r#"{"error":{"message":"the \"usage\": field","x":1e400}}"#.into(), Reported::Nothing),
            // Anthropic's message_delta may say `null` for the input counts it does not repeat.
            (Anthropic, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"input_tokens\":null,\"output_tokens\":15}}\n\n".into(), Reported::Usage(Usage { prompt_tokens: 25, completion_tokens: 15, cached_tokens: 0, total_tokens: 40 })),
        ];
        for (provider, body, expected) in rows {
            let mut reader = Reader::new(*provider, Format::Json);
            reader.feed(body.as_bytes());
            reader.finish();
            assert_eq!(&reader.reported(), expected, "{body}");
            let usage = match expected {
                Reported::Usage(usage) => Some(*usage),
                _ => None,
            };
            assert_eq!(reader.usage(), usage, "{body}");
        }
    }

    fn malformed(text: &str) -> Reported {
        Reported::Malformed(Malformed::Figure(Raw::of(text.as_bytes())))
    }

    fn unreadable(text: &str) -> Reported {
        Reported::Malformed(Malformed::Unreadable(Raw::of(text.as_bytes())))
    }

    #[test]
    fn the_first_bytes_tell_the_format() {
        let stream = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5}}\n\ndata: [DONE]\n\n";
        let plain = r#"  {"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}"#;
        let five = usage(3, 2, 0, 5);
        #[rustfmt::skip]
        let rows: &[(String, Format, Option<Format>)] = &[
            (stream.into(), Format::Json, Some(Format::EventStream)),
            (format!("\u{feff}\r\n{stream}"), Format::Json, Some(Format::EventStream)),
            (format!("event: x\n{stream}"), Format::Json, Some(Format::EventStream)),
            (format!(": keep-alive\n\n{stream}"), Format::Json, Some(Format::EventStream)),
            (format!("id: 1\n{stream}"), Format::Json, Some(Format::EventStream)),
            (format!("retry: 10\n{stream}"), Format::Json, Some(Format::EventStream)),
            (plain.into(), Format::EventStream, Some(Format::Json)),
        ];
        for (body, declared, format) in rows {
            // Whole, and one byte at a time (the first bytes then arrive in several buffers).
            for chunk in [body.len(), 1] {
                let mut reader = Reader::new(Provider::OpenAi, *declared);
                for piece in body.as_bytes().chunks(chunk) {
                    reader.feed(piece);
                }
                reader.finish();
                assert_eq!(reader.format(), *format, "{body:?} by {chunk}");
                assert_eq!(reader.usage(), five, "{body:?} by {chunk}");
            }
        }
        // Neither: the Content-Type says.
        for declared in [Format::Json, Format::EventStream] {
            for body in ["", "  ", "da", "not json"] {
                let mut reader = Reader::new(Provider::OpenAi, declared);
                reader.feed(body.as_bytes());
                reader.finish();
                assert_eq!(reader.format(), Some(declared), "{body:?}");
                assert_eq!(reader.usage(), None);
            }
        }
    }
}
