//! The request side of usage-based limits: what an LLM request's JSON body says about its
//! cost before the response (its model, its output ceiling, whether it streams and asks for
//! usage), the body rewritten so that an OpenAI Chat Completions stream reports its usage,
//! and the filter that takes that report out of the stream again for a client that had not
//! asked for it.
//!
//! | field | API |
//! |---|---|
//! | `max_completion_tokens`, `max_tokens` | OpenAI Chat Completions |
//! | `max_output_tokens` | OpenAI Responses |
//! | `max_tokens` | Anthropic Messages |
//! | `generationConfig.maxOutputTokens` | Gemini |

use serde::de::IgnoredAny;
use serde::Deserialize;

/// The largest body read for what it says; a larger one is forwarded untouched and reserves
/// as a body that says nothing (`reserve=auto`'s default, no model, no rewrite).
pub const BODY_READ_MAX: usize = 1 << 20;

/// What a request's body says, as far as usage-based limits care.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestFacts {
    /// `model`, when a string.
    pub model: Option<String>,
    /// The output ceiling the request sets (see the module's table).
    pub ceiling: Option<u64>,
    /// `stream: true`.
    pub stream: bool,
    /// `stream_options.include_usage`, when a boolean.
    pub include_usage: Option<bool>,
    /// A `messages` array: the shape of a Chat Completions request (the Responses API's
    /// has `input`, and no `stream_options.include_usage`).
    pub chat: bool,
    /// The body's length in bytes.
    pub bytes: usize,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Body {
    model: Option<Text>,
    max_completion_tokens: Option<Whole>,
    max_tokens: Option<Whole>,
    max_output_tokens: Option<Whole>,
    #[serde(rename = "generationConfig")]
    generation_config: Option<Loose<GenerationConfig>>,
    stream: Option<Flag>,
    stream_options: Option<Loose<StreamOptions>>,
    messages: Option<Loose<Vec<IgnoredAny>>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct GenerationConfig {
    #[serde(rename = "maxOutputTokens")]
    max_output_tokens: Option<Whole>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct StreamOptions {
    include_usage: Option<Flag>,
}

/// Any JSON value, kept when it is `T`.
struct Loose<T>(Option<T>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Loose<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(deserializer)?;
        Ok(Loose(T::deserialize(value).ok()))
    }
}

/// A string, or nothing for any other value.
type Text = Loose<String>;
/// A non-negative integer, or nothing for any other value.
type Whole = Loose<u64>;
/// A boolean, or nothing for any other value.
type Flag = Loose<bool>;

impl RequestFacts {
    /// Read `body` (JSON; anything else says nothing but its length).
    ///
    /// ```
    /// use ratelimit_core::usage::request::RequestFacts;
    ///
    /// let facts = RequestFacts::read(br#"{"model":"m","max_tokens":300,"stream":true}"#);
    /// assert_eq!((facts.model.as_deref(), facts.ceiling, facts.stream), (Some("m"), Some(300), true));
    /// ```
    pub fn read(body: &[u8]) -> RequestFacts {
        let bytes = body.len();
        // An object only: serde would read an array's elements as the fields, in order.
        let object = body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
        let parsed = serde_json::from_slice::<Body>(body).ok().filter(|_| object);
        let Some(parsed) = parsed else {
            return RequestFacts {
                bytes,
                ..RequestFacts::default()
            };
        };
        let whole = |field: Option<Whole>| field.and_then(|loose| loose.0);
        let ceiling = whole(parsed.max_completion_tokens)
            .or(whole(parsed.max_tokens))
            .or(whole(parsed.max_output_tokens))
            .or_else(|| whole(parsed.generation_config?.0?.max_output_tokens));
        RequestFacts {
            model: parsed.model.and_then(|loose| loose.0),
            ceiling,
            stream: parsed.stream.and_then(|loose| loose.0) == Some(true),
            include_usage: parsed
                .stream_options
                .and_then(|loose| loose.0?.include_usage?.0),
            chat: parsed.messages.is_some_and(|loose| loose.0.is_some()),
            bytes,
        }
    }

    /// The prompt's tokens as estimated from the body's size: a token is about four bytes
    /// of English text (the rest of the body, its JSON, is small next to a prompt).
    pub fn prompt_estimate(&self) -> u64 {
        (self.bytes as u64).div_ceil(4)
    }

    /// `reserve=auto:DEFAULT`: the request's ceiling (`default` when it sets none) plus the
    /// prompt's estimate.
    pub fn reservation(&self, default: u64) -> u64 {
        self.ceiling
            .unwrap_or(default)
            .saturating_add(self.prompt_estimate())
    }

    /// A streamed Chat Completions request that does not ask for usage (OpenAI reports it
    /// only when `stream_options.include_usage` is true).
    pub fn needs_usage_asked(&self) -> bool {
        self.chat && self.stream && self.include_usage != Some(true)
    }
}

/// `body` with `stream_options.include_usage` set to true, or `None` when it is not a JSON
/// object. A body without `stream_options` gets it inserted after its first `{`, every other
/// byte as it was; one with `stream_options` is written again whole.
///
/// ```
/// use ratelimit_core::usage::request::with_usage_asked;
///
/// let body = with_usage_asked(br#"{"stream":true}"#).unwrap();
/// assert_eq!(body, br#"{"stream_options":{"include_usage":true},"stream":true}"#);
/// ```
pub fn with_usage_asked(body: &[u8]) -> Option<Vec<u8>> {
    let mut value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let object = value.as_object_mut()?;
    if !object.contains_key("stream_options") {
        let open = body.iter().position(|&b| b == b'{')?;
        let mut out = Vec::with_capacity(body.len() + 48);
        out.extend_from_slice(&body[..=open]);
        out.extend_from_slice(br#""stream_options":{"include_usage":true}"#);
        if !object.is_empty() {
            out.push(b',');
        }
        out.extend_from_slice(&body[open + 1..]);
        return Some(out);
    }
    let options = object.get_mut("stream_options")?;
    if !options.is_object() {
        *options = serde_json::Value::Object(serde_json::Map::new());
    }
    options
        .as_object_mut()?
        .insert("include_usage".into(), serde_json::Value::Bool(true));
    serde_json::to_vec(&value).ok()
}

/// Takes OpenAI's usage chunk (an event whose data has an empty `choices` and a `usage`
/// object) out of a Chat Completions stream, for any split of the stream into buffers; every
/// other byte passes unchanged. An event is held until its blank line (or the end), so that
/// what passes is whole events.
#[derive(Default)]
pub struct UsageChunkFilter {
    /// The bytes of the event not yet ended.
    pending: Vec<u8>,
}

/// The largest event held back: a longer one cannot be the usage chunk and passes as it
/// comes.
const HELD_MAX: usize = 64 << 10;

impl UsageChunkFilter {
    /// Filter `bytes`, appending what passes to `out`.
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<u8>) {
        let mut rest = bytes;
        while !rest.is_empty() {
            match event_end(&self.pending, rest) {
                Some(taken) => {
                    self.pending.extend_from_slice(&rest[..taken]);
                    rest = &rest[taken..];
                    if !is_usage_chunk(&self.pending) {
                        out.extend_from_slice(&self.pending);
                    }
                    self.pending.clear();
                }
                None => {
                    self.pending.extend_from_slice(rest);
                    if self.pending.len() > HELD_MAX {
                        out.extend_from_slice(&self.pending);
                        self.pending.clear();
                    }
                    return;
                }
            }
        }
    }

    /// The stream ended: what is held passes.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        out.append(&mut self.pending);
    }
}

/// How many bytes of `more` complete the event `held` begins (its blank line: two line
/// ends in a row, each LF or CRLF), or `None`.
fn event_end(held: &[u8], more: &[u8]) -> Option<usize> {
    // The last byte held that is not a CR, and whether it is a LF (a line just ended).
    let mut after_line_end = held
        .iter()
        .rev()
        .find(|&&b| b != b'\r')
        .is_none_or(|&b| b == b'\n')
        && !held.is_empty();
    for (at, &byte) in more.iter().enumerate() {
        match byte {
            b'\n' if after_line_end => return Some(at + 1),
            b'\n' => after_line_end = true,
            b'\r' => {}
            _ => after_line_end = false,
        }
    }
    None
}

#[derive(Deserialize)]
struct Chunk {
    choices: Vec<IgnoredAny>,
    usage: Option<IgnoredAny>,
}

/// Whether `event` (its raw lines) is OpenAI's usage chunk.
fn is_usage_chunk(event: &[u8]) -> bool {
    let mut data = Vec::new();
    for line in event.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(value) = line.strip_prefix(b"data:") {
            if !data.is_empty() {
                data.push(b'\n');
            }
            data.extend_from_slice(value.strip_prefix(b" ").unwrap_or(value));
        }
    }
    serde_json::from_slice::<Chunk>(&data)
        .is_ok_and(|chunk| chunk.choices.is_empty() && chunk.usage.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_of_each_api() {
        #[rustfmt::skip]
        type Row<'a> = (&'a str, Option<&'a str>, Option<u64>, bool, Option<bool>);
        let rows: &[Row] = &[
            (
                r#"{"model":"gpt","max_tokens":200,"stream":true}"#,
                Some("gpt"),
                Some(200),
                true,
                None,
            ),
            (
                r#"{"max_completion_tokens":70,"max_tokens":9}"#,
                None,
                Some(70),
                false,
                None,
            ),
            (
                r#"{"model":"o","max_output_tokens":500}"#,
                Some("o"),
                Some(500),
                false,
                None,
            ),
            (
                r#"{"generationConfig":{"maxOutputTokens":64}}"#,
                None,
                Some(64),
                false,
                None,
            ),
            (
                r#"{"stream":true,"stream_options":{"include_usage":false}}"#,
                None,
                None,
                true,
                Some(false),
            ),
            (
                r#"{"stream":"yes","stream_options":7,"max_tokens":-5,"model":3}"#,
                None,
                None,
                false,
                None,
            ),
            (
                r#"{"max_tokens":1.5,"generationConfig":[]}"#,
                None,
                None,
                false,
                None,
            ),
            ("not json", None, None, false, None),
            ("[1,2]", None, None, false, None),
        ];
        for &(body, model, ceiling, stream, include_usage) in rows {
            let facts = RequestFacts::read(body.as_bytes());
            assert_eq!(facts.model.as_deref(), model, "{body}");
            assert_eq!(facts.ceiling, ceiling, "{body}");
            assert_eq!(facts.stream, stream, "{body}");
            assert_eq!(facts.include_usage, include_usage, "{body}");
            assert_eq!(facts.bytes, body.len());
        }
    }

    #[test]
    fn only_chat_streams_need_usage_asked() {
        #[rustfmt::skip]
        let rows: &[(&str, bool)] = &[
            (r#"{"stream":true,"messages":[]}"#, true),
            (r#"{"stream":true,"messages":[],"stream_options":{"include_usage":false}}"#, true),
            (r#"{"stream":true,"messages":[],"stream_options":{"include_usage":true}}"#, false),
            (r#"{"stream":false,"messages":[]}"#, false),
            (r#"{"stream":true,"input":"hi"}"#, false),
            (r#"{"stream":true,"messages":"hi"}"#, false),
        ];
        for &(body, expected) in rows {
            assert_eq!(
                RequestFacts::read(body.as_bytes()).needs_usage_asked(),
                expected,
                "{body}"
            );
        }
    }

    #[test]
    fn reservation_is_ceiling_plus_prompt() {
        let facts = RequestFacts::read(br#"{"max_tokens":300}"#);
        assert_eq!(facts.reservation(4096), 300 + 5);
        let none = RequestFacts::read(b"{}");
        assert_eq!(none.reservation(4096), 4096 + 1);
        let huge = RequestFacts {
            ceiling: Some(u64::MAX),
            bytes: 8,
            ..RequestFacts::default()
        };
        assert_eq!(huge.reservation(1), u64::MAX);
    }

    #[test]
    fn usage_asked_in_every_shape() {
        let rows: &[&str] = &[
            r#"{"stream":true}"#,
            r#"  {"model":"m","stream":true,"messages":[{"role":"user","content":"{x}"}]}"#,
            r#"{"stream":true,"stream_options":{"include_usage":false,"other":1}}"#,
            r#"{"stream":true,"stream_options":null}"#,
            r#"{}"#,
        ];
        for body in rows {
            let asked = with_usage_asked(body.as_bytes()).unwrap();
            let facts = RequestFacts::read(&asked);
            assert_eq!(facts.include_usage, Some(true), "{body}");
            let before: serde_json::Value = serde_json::from_str(body).unwrap();
            let mut after: serde_json::Value = serde_json::from_slice(&asked).unwrap();
            after["stream_options"]
                .as_object_mut()
                .unwrap()
                .remove("include_usage");
            let after_options = after.as_object_mut().unwrap().remove("stream_options");
            let mut before = before;
            let before_options = before.as_object_mut().unwrap().remove("stream_options");
            assert_eq!(after, before, "{body}");
            if let Some(serde_json::Value::Object(options)) = before_options {
                let mut options = options;
                options.remove("include_usage");
                assert_eq!(after_options, Some(serde_json::Value::Object(options)));
            }
        }
        assert_eq!(with_usage_asked(b"[]"), None);
        assert_eq!(with_usage_asked(b"nope"), None);
    }

    const STREAM: &str =
        "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n\
        : comment\r\n\r\n\
        data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\r\n\r\n\
        data: [DONE]\n\n";

    #[test]
    fn usage_chunk_taken_out_for_any_split() {
        let expected = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n\
            : comment\r\n\r\n\
            data: [DONE]\n\n";
        let bytes = STREAM.as_bytes();
        for first in 0..bytes.len() {
            for second in first..bytes.len() {
                let mut filter = UsageChunkFilter::default();
                let mut out = Vec::new();
                filter.feed(&bytes[..first], &mut out);
                filter.feed(&bytes[first..second], &mut out);
                filter.feed(&bytes[second..], &mut out);
                filter.finish(&mut out);
                assert_eq!(
                    String::from_utf8(out).unwrap(),
                    expected,
                    "{first} {second}"
                );
            }
        }
    }

    #[test]
    fn other_events_pass_whole() {
        let stream = "data: {\"choices\":[],\"usage\":null}\n\ndata: {\"usage\":{}}\n\nend";
        let mut filter = UsageChunkFilter::default();
        let mut out = Vec::new();
        filter.feed(stream.as_bytes(), &mut out);
        filter.finish(&mut out);
        assert_eq!(out, stream.as_bytes());
    }
}
