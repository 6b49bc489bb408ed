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
    /// The output ceiling the request sets (see the module's table), for each choice.
    pub ceiling: Option<u64>,
    /// How many choices the response holds (`n`, Gemini's `candidateCount`): each up to
    /// the ceiling. 0 in a default value is taken as 1.
    pub choices: u64,
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

/// Why a request body cannot be read for sure. An upstream may read such a body otherwise
/// than this reader would (the last of two `"stream"` keys, `"stream":"true"` as true, a
/// gzip body unpacked): the line's `on_unreadable=` decides, never a free pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unreadable {
    /// Over [`BODY_READ_MAX`] bytes.
    TooLarge,
    /// A `Content-Encoding` other than `identity`: its name.
    Encoded(String),
    /// Not strict JSON (serde's message: a duplicated key, a lone surrogate, a number out of
    /// range, nesting deeper than 128, a byte order mark, NaN...).
    Json(String),
    /// JSON, but not an object.
    NotObject,
    /// A field the limit reads holds a type its API does not take (the upstream may coerce
    /// it): the field and what it held.
    LaxType(&'static str, &'static str),
}

impl Unreadable {
    /// The status a refusal answers with: 413, 415 or 400.
    pub fn status(&self) -> u16 {
        match self {
            Unreadable::TooLarge => 413,
            Unreadable::Encoded(_) => 415,
            _ => 400,
        }
    }

    /// What is wrong and what is valid, for the client and the log.
    pub fn message(&self) -> String {
        match self {
            Unreadable::TooLarge => format!(
                "the request body is over {BODY_READ_MAX} bytes, the most a usage-limited \
                 request may send"
            ),
            Unreadable::Encoded(coding) => format!(
                "the request body is sent with Content-Encoding \"{coding}\": a usage-limited \
                 request must send plain JSON"
            ),
            Unreadable::Json(why) => {
                format!("the request body is not strict JSON ({why}): send each key once, in UTF-8 JSON without a byte order mark")
            }
            Unreadable::NotObject => "the request body is not a JSON object".to_string(),
            Unreadable::LaxType(field, found) => format!(
                "\"{field}\" is {found}: it must be {}",
                expected_type(field)
            ),
        }
    }
}

fn expected_type(field: &str) -> &'static str {
    match field {
        "model" => "a string",
        "stream" | "stream_options.include_usage" => "true or false",
        "stream_options" | "generationConfig" => "an object",
        _ => "a whole number (or a string of digits)",
    }
}

/// A JSON value read strictly: a key twice in one object is an error (serde_json's `Value`
/// keeps the last, as a lenient upstream may, or the first).
struct Strict(serde_json::Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrictVisitor)
    }
}

struct StrictVisitor;

impl<'de> serde::de::Visitor<'de> for StrictVisitor {
    type Value = Strict;

    fn expecting(&self, f: &mut core::fmt::Formatter) -> core::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Strict, E> {
        Ok(Strict(v.into()))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Strict, E> {
        Ok(Strict(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Strict, E> {
        Ok(Strict(v.into()))
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Strict, E> {
        serde_json::Number::from_f64(v)
            .map(|n| Strict(serde_json::Value::Number(n)))
            .ok_or_else(|| E::custom("a number out of range"))
    }
    fn visit_str<E>(self, v: &str) -> Result<Strict, E> {
        Ok(Strict(v.into()))
    }
    fn visit_string<E>(self, v: String) -> Result<Strict, E> {
        Ok(Strict(v.into()))
    }
    fn visit_unit<E>(self) -> Result<Strict, E> {
        Ok(Strict(serde_json::Value::Null))
    }
    fn visit_none<E>(self) -> Result<Strict, E> {
        Ok(Strict(serde_json::Value::Null))
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Strict, D::Error> {
        Strict::deserialize(d)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Strict, A::Error> {
        let mut items = Vec::new();
        while let Some(Strict(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Strict(serde_json::Value::Array(items)))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Strict, A::Error> {
        let mut object = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(serde::de::Error::custom(format_args!(
                    "the key \"{key}\" twice"
                )));
            }
            let Strict(value) = map.next_value()?;
            object.insert(key, value);
        }
        Ok(Strict(serde_json::Value::Object(object)))
    }
}

/// What a JSON value is, for a message.
fn kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

type Field<'a> = Option<&'a serde_json::Value>;

/// A count in any form an API takes: a whole number, a float with no fraction (`100000.0`),
/// a string of digits (`"100000"`); absent or null is `None`.
fn whole(name: &'static str, field: Field) -> Result<Option<u64>, Unreadable> {
    let Some(value) = field.filter(|value| !value.is_null()) else {
        return Ok(None);
    };
    let read = match value {
        serde_json::Value::Number(number) => number.as_u64().or_else(|| {
            let float = number.as_f64()?;
            (float >= 0.0 && float.fract() == 0.0 && float < 1.8e19).then_some(float as u64)
        }),
        serde_json::Value::String(text) => {
            let digits = text.trim();
            (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
                .then(|| digits.parse::<u64>().unwrap_or(u64::MAX))
        }
        _ => None,
    };
    read.map(Some).ok_or(Unreadable::LaxType(name, kind(value)))
}

fn flag(name: &'static str, field: Field) -> Result<Option<bool>, Unreadable> {
    match field {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::Bool(value)) => Ok(Some(*value)),
        Some(other) => Err(Unreadable::LaxType(name, kind(other))),
    }
}

fn object<'a>(
    name: &'static str,
    field: Field<'a>,
) -> Result<Option<&'a serde_json::Map<String, serde_json::Value>>, Unreadable> {
    match field {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::Object(map)) => Ok(Some(map)),
        Some(other) => Err(Unreadable::LaxType(name, kind(other))),
    }
}

impl RequestFacts {
    /// What `body` says, or why it cannot be read for sure. An empty body says nothing.
    ///
    /// ```
    /// use ratelimit_core::usage::request::{RequestFacts, Unreadable};
    ///
    /// let twice = RequestFacts::check(br#"{"stream":false,"stream":true}"#);
    /// assert!(matches!(twice, Err(Unreadable::Json(_))));
    /// let lax = RequestFacts::check(br#"{"stream":"true"}"#);
    /// assert_eq!(lax, Err(Unreadable::LaxType("stream", "a string")));
    /// let n = RequestFacts::check(br#"{"max_tokens":"100","n":3}"#).unwrap();
    /// assert_eq!((n.ceiling, n.choices), (Some(100), 3));
    /// ```
    pub fn check(body: &[u8]) -> Result<RequestFacts, Unreadable> {
        let bytes = body.len();
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(RequestFacts {
                bytes,
                ..RequestFacts::default()
            });
        }
        if bytes > BODY_READ_MAX {
            return Err(Unreadable::TooLarge);
        }
        let Strict(value) = serde_json::from_slice::<Strict>(body)
            .map_err(|error| Unreadable::Json(error.to_string()))?;
        let top = value.as_object().ok_or(Unreadable::NotObject)?;
        let model = match top.get("model") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(model)) => Some(model.clone()),
            Some(other) => return Err(Unreadable::LaxType("model", kind(other))),
        };
        let generation = object("generationConfig", top.get("generationConfig"))?;
        let gemini_ceiling = whole(
            "generationConfig.maxOutputTokens",
            generation.and_then(|config| config.get("maxOutputTokens")),
        )?;
        let candidates = whole(
            "generationConfig.candidateCount",
            generation.and_then(|config| config.get("candidateCount")),
        )?;
        let ceiling = whole("max_completion_tokens", top.get("max_completion_tokens"))?
            .or(whole("max_tokens", top.get("max_tokens"))?)
            .or(whole("max_output_tokens", top.get("max_output_tokens"))?)
            .or(gemini_ceiling);
        let choices = whole("n", top.get("n"))?.or(candidates).unwrap_or(1).max(1);
        let options = object("stream_options", top.get("stream_options"))?;
        let include_usage = flag(
            "stream_options.include_usage",
            options.and_then(|options| options.get("include_usage")),
        )?;
        // Chat Completions' `messages`, or the legacy Completions' `prompt`: both stream
        // usage only when asked.
        let chat = top.get("messages").is_some_and(serde_json::Value::is_array)
            || top.get("prompt").is_some_and(|prompt| !prompt.is_null());
        Ok(RequestFacts {
            model,
            ceiling,
            choices,
            stream: flag("stream", top.get("stream"))? == Some(true),
            include_usage,
            chat,
            bytes,
        })
    }

    /// The prompt's tokens as estimated from the body's size: a token is about four bytes
    /// of English text (the rest of the body, its JSON, is small next to a prompt).
    pub fn prompt_estimate(&self) -> u64 {
        (self.bytes as u64).div_ceil(4)
    }

    /// `reserve=auto:DEFAULT`: the request's ceiling (`default` when it sets none) times its
    /// choices, plus the prompt's estimate.
    pub fn reservation(&self, default: u64) -> u64 {
        self.ceiling
            .unwrap_or(default)
            .saturating_mul(self.choices.max(1))
            .saturating_add(self.prompt_estimate())
    }

    /// A streamed Chat Completions (or legacy Completions) request that does not ask for
    /// usage (OpenAI reports it only when `stream_options.include_usage` is true).
    pub fn needs_usage_asked(&self) -> bool {
        self.chat && self.stream && self.include_usage != Some(true)
    }
}

/// `body` with `stream_options.include_usage` set to true, or `None` when it is not a JSON
/// object. Only the bytes that ask change; every other byte is the client's (numbers past
/// f64's precision, whitespace, key order, escapes): `"stream_options":{"include_usage":true}`
/// inserted after the first `{`, or `"include_usage":true` after `stream_options`' own `{`,
/// or its value (or a null `stream_options`) replaced.
///
/// ```
/// use ratelimit_core::usage::request::with_usage_asked;
///
/// let body = with_usage_asked(br#"{"stream":true, "seed":123456789012345678901234567890}"#);
/// assert_eq!(
///     body.unwrap(),
///     br#"{"stream_options":{"include_usage":true},"stream":true, "seed":123456789012345678901234567890}"#
/// );
/// ```
pub fn with_usage_asked(body: &[u8]) -> Option<Vec<u8>> {
    use serde_json::value::RawValue;
    use std::collections::HashMap;

    let text = core::str::from_utf8(body).ok()?;
    let top: HashMap<String, &RawValue> = serde_json::from_str(text).ok()?;
    let offset = |raw: &str| raw.as_ptr() as usize - text.as_ptr() as usize;
    let splice = |at: usize, remove: usize, insert: &str| {
        let mut out = Vec::with_capacity(body.len() + insert.len());
        out.extend_from_slice(&body[..at]);
        out.extend_from_slice(insert.as_bytes());
        out.extend_from_slice(&body[at + remove..]);
        out
    };
    let Some(options) = top.get("stream_options") else {
        let open = body.iter().position(|&b| b == b'{')?;
        let comma = if top.is_empty() { "" } else { "," };
        return Some(splice(
            open + 1,
            0,
            &format!(r#""stream_options":{{"include_usage":true}}{comma}"#),
        ));
    };
    let options = options.get();
    if !options.starts_with('{') {
        return Some(splice(
            offset(options),
            options.len(),
            r#"{"include_usage":true}"#,
        ));
    }
    let inner: HashMap<String, &RawValue> = serde_json::from_str(options).ok()?;
    Some(match inner.get("include_usage") {
        Some(value) => splice(offset(value.get()), value.get().len(), "true"),
        None => {
            let comma = if inner.is_empty() { "" } else { "," };
            splice(
                offset(options) + 1,
                0,
                &format!(r#""include_usage":true{comma}"#),
            )
        }
    })
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

    /// What a body says, or nothing but its length when [`RequestFacts::check`] refuses it.
    fn read(body: &[u8]) -> RequestFacts {
        RequestFacts::check(body).unwrap_or(RequestFacts {
            bytes: body.len(),
            ..RequestFacts::default()
        })
    }

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
            let facts = read(body.as_bytes());
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
                read(body.as_bytes()).needs_usage_asked(),
                expected,
                "{body}"
            );
        }
    }

    #[test]
    fn reservation_is_ceiling_plus_prompt() {
        let facts = read(br#"{"max_tokens":300}"#);
        assert_eq!(facts.reservation(4096), 300 + 5);
        let none = read(b"{}");
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
            let facts = read(&asked);
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

    /// Issue 46: what a lenient upstream reads otherwise is never read as nothing.
    #[test]
    fn bodies_an_upstream_may_read_otherwise_are_unreadable() {
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let deep = format!(r#"{{"stream":true,"x":{deep}}}"#);
        let rows: Vec<(&[u8], &str)> = vec![
            (br#"{"model":"a","model":"b"}"#, "twice"),
            (br#"{"stream":false,"stre\u0061m":true}"#, "twice"),
            (br#"{"max_tokens":1,"max_tokens":100000}"#, "twice"),
            (
                br#"{"stream_options":{"include_usage":false,"include_usage":true}}"#,
                "twice",
            ),
            (br#"{"stream":NaN}"#, "expected value"),
            (br#"{"max_tokens":1e400}"#, "out of range"),
            (b"\xef\xbb\xbf{\"stream\":true}", "expected value"),
            (br#"{"stream":true,"x":"\ud800"}"#, "escape"),
            (deep.as_bytes(), "recursion limit"),
            (b"{\"stream\":true,\"x\":\"\xff\"}", "invalid unicode"),
        ];
        for (body, why) in rows {
            match RequestFacts::check(body) {
                Err(Unreadable::Json(message)) => {
                    assert!(
                        message.contains(why),
                        "{}: {message}",
                        String::from_utf8_lossy(body)
                    )
                }
                other => panic!("{}: {other:?}", String::from_utf8_lossy(body)),
            }
        }
        let lax: &[(&str, Unreadable)] = &[
            (
                r#"{"stream":"true"}"#,
                Unreadable::LaxType("stream", "a string"),
            ),
            (r#"{"stream":1}"#, Unreadable::LaxType("stream", "a number")),
            (
                r#"{"max_tokens":-5}"#,
                Unreadable::LaxType("max_tokens", "a number"),
            ),
            (
                r#"{"max_tokens":"1e5"}"#,
                Unreadable::LaxType("max_tokens", "a string"),
            ),
            (r#"{"model":3}"#, Unreadable::LaxType("model", "a number")),
            (
                r#"{"stream_options":7}"#,
                Unreadable::LaxType("stream_options", "a number"),
            ),
            (r#"{"n":2.5}"#, Unreadable::LaxType("n", "a number")),
            ("[1,2]", Unreadable::NotObject),
        ];
        for (body, expected) in lax {
            assert_eq!(
                RequestFacts::check(body.as_bytes()).as_ref(),
                Err(expected),
                "{body}"
            );
        }
        assert_eq!(
            RequestFacts::check(&vec![b' '; BODY_READ_MAX + 1]).map(|f| f.bytes),
            Ok(BODY_READ_MAX + 1)
        );
        let mut huge = b"{\"stream\":true}".to_vec();
        huge.resize(BODY_READ_MAX + 1, b' ');
        assert_eq!(RequestFacts::check(&huge), Err(Unreadable::TooLarge));
    }

    /// `reserve=auto` reads every form of the ceiling, times `n`.
    #[test]
    fn every_form_of_the_ceiling_and_n() {
        for body in [
            r#"{"max_tokens":100000}"#,
            r#"{"max_tokens":100000.0}"#,
            r#"{"max_tokens":"100000"}"#,
            r#"{"max_tokens":1e5}"#,
            r#"{"max_tokens":null,"max_completion_tokens":100000}"#,
            r#"{"generationConfig":{"maxOutputTokens":"100000"}}"#,
        ] {
            assert_eq!(
                RequestFacts::check(body.as_bytes()).unwrap().ceiling,
                Some(100_000),
                "{body}"
            );
        }
        let n = RequestFacts::check(br#"{"max_tokens":1000,"n":4}"#).unwrap();
        assert_eq!(n.reservation(1), 4000 + 7);
        let gemini = RequestFacts::check(
            br#"{"generationConfig":{"maxOutputTokens":10,"candidateCount":3}}"#,
        )
        .unwrap();
        assert_eq!(gemini.reservation(1), 30 + 16);
        let legacy = RequestFacts::check(br#"{"prompt":"hi","stream":true}"#).unwrap();
        assert!(legacy.needs_usage_asked());
    }

    /// The edit keeps every byte but the ones that ask.
    #[test]
    fn usage_asked_keeps_every_other_byte() {
        let rows: &[(&str, &str)] = &[
            (
                "{ \"seed\" : 123456789012345678901234567890 ,\n\t\"stream\":true }",
                "{\"stream_options\":{\"include_usage\":true}, \"seed\" : 123456789012345678901234567890 ,\n\t\"stream\":true }",
            ),
            (
                r#"{"stream":true,"stream_options":{ "include_usage" : false ,"x":1e999999}}"#,
                r#"{"stream":true,"stream_options":{ "include_usage" : true ,"x":1e999999}}"#,
            ),
            (
                r#"{"stream":true,"stream_options":{"x":0.10000000000000000001}}"#,
                r#"{"stream":true,"stream_options":{"include_usage":true,"x":0.10000000000000000001}}"#,
            ),
            (
                r#"{"stream":true,"stream_options":{ }}"#,
                r#"{"stream":true,"stream_options":{"include_usage":true }}"#,
            ),
            (
                r#"{"stream":true,"stream_options":null ,"m":"\u00e9"}"#,
                r#"{"stream":true,"stream_options":{"include_usage":true} ,"m":"\u00e9"}"#,
            ),
        ];
        for (body, expected) in rows {
            let asked = with_usage_asked(body.as_bytes()).unwrap();
            assert_eq!(String::from_utf8(asked).unwrap(), *expected, "{body}");
        }
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
