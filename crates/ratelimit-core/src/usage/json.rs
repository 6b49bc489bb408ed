//! The providers' JSON as the reader needs it: typed views of the few fields that carry
//! usage. serde skips every other field as it parses (no map is built, no string copied,
//! whatever the body holds besides), which is most of what reading a usage event costs.
//!
//! The views are lenient where the providers' documents may vary: an object the reader looks
//! into (`response`, `message`, a `*_details`) that is something else is as if it were
//! absent, and `null` is a count not reported where providers write it (a cache's counts,
//! Gemini's thoughts, Anthropic's input counts, which `message_delta` may leave `null`), and a
//! usage not reported where OpenAI's chunks write `"usage":null`. They are strict on the usage
//! and its counts: an integer from 0 to 2^53 is a count, anything else (negative, fractional
//! or larger, `1e3`, a string, an object, `null` elsewhere), and a usage that is not an object
//! (`"usage":7`), is a malformed figure, noted with its text in [`Counts`] and making the
//! whole usage malformed. A document that is not JSON, or an object that names one of the
//! fields below twice, is an error for the caller ([`super::reader`]), which makes it a
//! malformed usage when the document names one.

use core::fmt;
use std::borrow::Cow;

use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::counts::{Counts, Malformed, Raw, MAX_COUNT};
use super::Provider;

/// A count as the document gave it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Count {
    /// Not in the document.
    #[default]
    Absent,
    /// `null`: not reported.
    Null,
    /// An integer from 0 to [`MAX_COUNT`].
    Valid(u64),
    /// Anything else: a negative, fractional or larger number, a string, an object, ...
    Malformed(Raw),
}

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Count, D::Error> {
        deserializer.deserialize_any(CountVisitor)
    }
}

struct CountVisitor;

/// `value` rendered into a [`Raw`].
fn rendered(value: impl fmt::Display) -> Raw {
    let mut text = String::new();
    let _ = fmt::write(&mut text, format_args!("{value}"));
    Raw::of(text.as_bytes())
}

fn malformed(value: impl fmt::Display) -> Count {
    Count::Malformed(rendered(value))
}

/// A count up to [`MAX_COUNT`]; a larger one is malformed.
fn unsigned(value: u64) -> Count {
    if value <= MAX_COUNT {
        Count::Valid(value)
    } else {
        malformed(value)
    }
}

impl<'de> Visitor<'de> for CountVisitor {
    type Value = Count;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_u64<E>(self, value: u64) -> Result<Count, E> {
        Ok(unsigned(value))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Count, E> {
        match u64::try_from(value) {
            Ok(value) => Ok(unsigned(value)),
            Err(_) => Ok(malformed(value)),
        }
    }

    fn visit_f64<E>(self, value: f64) -> Result<Count, E> {
        // Debug keeps the float's point (`1000.0`, `1.5`, `1.8446744073709552e19`).
        Ok(malformed(format_args!("{value:?}")))
    }

    fn visit_bool<E>(self, value: bool) -> Result<Count, E> {
        Ok(malformed(value))
    }

    fn visit_str<E>(self, value: &str) -> Result<Count, E> {
        Ok(malformed(format_args!("{value:?}")))
    }

    fn visit_unit<E>(self) -> Result<Count, E> {
        Ok(Count::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Count, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(malformed("[...]"))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Count, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(malformed("{...}"))
    }
}

/// An object of type `T`, or `None` where the document has another kind of value.
#[derive(Debug)]
struct Object<T>(Option<T>);

impl<T> Default for Object<T> {
    fn default() -> Self {
        Object(None)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Object<T>, D::Error> {
        deserializer.deserialize_any(ObjectVisitor(core::marker::PhantomData))
    }
}

struct ObjectVisitor<T>(core::marker::PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectVisitor<T> {
    type Value = Object<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Object<T>, A::Error> {
        T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(|t| Object(Some(t)))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Object<T>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Object(None))
    }

    fn visit_u64<E>(self, _: u64) -> Result<Object<T>, E> {
        Ok(Object(None))
    }

    fn visit_i64<E>(self, _: i64) -> Result<Object<T>, E> {
        Ok(Object(None))
    }

    fn visit_f64<E>(self, _: f64) -> Result<Object<T>, E> {
        Ok(Object(None))
    }

    fn visit_bool<E>(self, _: bool) -> Result<Object<T>, E> {
        Ok(Object(None))
    }

    fn visit_str<E>(self, _: &str) -> Result<Object<T>, E> {
        Ok(Object(None))
    }

    fn visit_unit<E>(self) -> Result<Object<T>, E> {
        Ok(Object(None))
    }
}

/// A usage object (`usage`, `usageMetadata`) as the document gave it.
#[derive(Debug, Default)]
enum UsageField<T> {
    /// Not in the document.
    #[default]
    Absent,
    /// `null`: no usage reported (OpenAI's chunks before the last).
    Null,
    Object(T),
    /// Anything else: a malformed usage (`7`, `"1000"`, `[...]`).
    Other(Raw),
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for UsageField<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<UsageField<T>, D::Error> {
        deserializer.deserialize_any(UsageFieldVisitor(core::marker::PhantomData))
    }
}

struct UsageFieldVisitor<T>(core::marker::PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for UsageFieldVisitor<T> {
    type Value = UsageField<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<UsageField<T>, A::Error> {
        T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(UsageField::Object)
    }

    fn visit_unit<E>(self) -> Result<UsageField<T>, E> {
        Ok(UsageField::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<UsageField<T>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(UsageField::Other(Raw::of(b"[...]")))
    }

    fn visit_u64<E>(self, value: u64) -> Result<UsageField<T>, E> {
        Ok(UsageField::Other(rendered(value)))
    }

    fn visit_i64<E>(self, value: i64) -> Result<UsageField<T>, E> {
        Ok(UsageField::Other(rendered(value)))
    }

    fn visit_f64<E>(self, value: f64) -> Result<UsageField<T>, E> {
        Ok(UsageField::Other(rendered(format_args!("{value:?}"))))
    }

    fn visit_bool<E>(self, value: bool) -> Result<UsageField<T>, E> {
        Ok(UsageField::Other(rendered(value)))
    }

    fn visit_str<E>(self, value: &str) -> Result<UsageField<T>, E> {
        Ok(UsageField::Other(rendered(format_args!("{value:?}"))))
    }
}

impl<T> UsageField<T> {
    /// Whether it says nothing: absent or `null`.
    fn is_silent(&self) -> bool {
        matches!(self, UsageField::Absent | UsageField::Null)
    }

    /// Its counts read into `counts` by `read`; a usage that is not an object is malformed.
    /// Whether it carried usage.
    fn read(&self, counts: &mut Counts, read: impl FnOnce(&T, &mut Counts) -> bool) -> bool {
        match self {
            UsageField::Object(usage) => read(usage, counts),
            UsageField::Other(raw) => {
                counts.reported = true;
                counts.malformed.get_or_insert(Malformed::Figure(*raw));
                false
            }
            UsageField::Absent | UsageField::Null => false,
        }
    }
}

/// OpenAI's usage: Chat Completions' names, or the Responses API's.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct OpenAiUsage {
    prompt_tokens: Count,
    input_tokens: Count,
    completion_tokens: Count,
    output_tokens: Count,
    total_tokens: Count,
    prompt_tokens_details: Object<Details>,
    input_tokens_details: Object<Details>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Details {
    cached_tokens: Count,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct AnthropicUsage {
    input_tokens: Count,
    output_tokens: Count,
    cache_read_input_tokens: Count,
    cache_creation_input_tokens: Count,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct GeminiUsage {
    prompt_token_count: Count,
    candidates_token_count: Count,
    thoughts_token_count: Count,
    total_token_count: Count,
    cached_content_token_count: Count,
}

/// An OpenAI chunk or body (`usage`), or a Responses API event (`response.usage`).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct OpenAiDocument {
    usage: UsageField<OpenAiUsage>,
    response: Object<OpenAiResponse>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct OpenAiResponse {
    usage: UsageField<OpenAiUsage>,
}

/// An Anthropic body or event: `usage`, and `message.usage` in `message_start`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct AnthropicDocument<'a> {
    #[serde(rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
    usage: UsageField<AnthropicUsage>,
    message: Object<AnthropicMessage>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct AnthropicMessage {
    usage: UsageField<AnthropicUsage>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct GeminiDocument {
    usage_metadata: UsageField<GeminiUsage>,
}

impl Count {
    /// This count, or `other` where the document has none.
    fn or(self, other: Count) -> Count {
        match self {
            Count::Absent => other,
            _ => self,
        }
    }
}

/// The field of `counts` that `slot` selects takes `value` when it is a valid count; whether
/// it was. Anything else is noted as malformed, `null` included: a count every report carries.
fn take(counts: &mut Counts, slot: fn(&mut Counts) -> &mut Option<u64>, value: Count) -> bool {
    let value = match value {
        Count::Null => Count::Malformed(Raw::of(b"null")),
        value => value,
    };
    take_or_null(counts, slot, value)
}

/// As [`take`], for a count a provider may write `null` when it does not know it (a cache's
/// counts, Anthropic's input counts in `message_delta`): `null` is then not reported.
fn take_or_null(
    counts: &mut Counts,
    slot: fn(&mut Counts) -> &mut Option<u64>,
    value: Count,
) -> bool {
    counts.reported = true;
    match value {
        Count::Valid(count) => {
            *slot(counts) = Some(count);
            true
        }
        Count::Absent => false,
        Count::Null => {
            counts.null = true;
            false
        }
        Count::Malformed(raw) => {
            counts.malformed.get_or_insert(Malformed::Figure(raw));
            false
        }
    }
}

impl OpenAiUsage {
    fn read(&self, counts: &mut Counts) -> bool {
        let input = self.prompt_tokens.or(self.input_tokens);
        let output = self.completion_tokens.or(self.output_tokens);
        let details = self
            .prompt_tokens_details
            .0
            .as_ref()
            .or(self.input_tokens_details.0.as_ref());
        let mut any = take(counts, |c| &mut c.input, input);
        any |= take(counts, |c| &mut c.output, output);
        any |= take(counts, |c| &mut c.total, self.total_tokens);
        if let Some(details) = details {
            take_or_null(counts, |c| &mut c.cached, details.cached_tokens);
        }
        any
    }
}

impl AnthropicUsage {
    fn read(&self, counts: &mut Counts) -> bool {
        let mut any = take_or_null(counts, |c| &mut c.input, self.input_tokens);
        any |= take(counts, |c| &mut c.output, self.output_tokens);
        take_or_null(counts, |c| &mut c.cached, self.cache_read_input_tokens);
        take_or_null(
            counts,
            |c| &mut c.cache_creation,
            self.cache_creation_input_tokens,
        );
        any
    }
}

impl GeminiUsage {
    fn read(&self, counts: &mut Counts) -> bool {
        let mut any = take(counts, |c| &mut c.input, self.prompt_token_count);
        any |= take(counts, |c| &mut c.output, self.candidates_token_count);
        any |= take(counts, |c| &mut c.total, self.total_token_count);
        take_or_null(counts, |c| &mut c.cached, self.cached_content_token_count);
        take_or_null(counts, |c| &mut c.thoughts, self.thoughts_token_count);
        any
    }
}

fn parse<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, serde_json::Error> {
    serde_json::from_slice(bytes)
}

/// One event's data (`event` its `event:` name): whether it carried usage; an error when the
/// data is not JSON its view reads (the caller decides whether it named a usage).
pub(super) fn read_event(
    provider: Provider,
    event: &[u8],
    data: &[u8],
    counts: &mut Counts,
) -> Result<bool, serde_json::Error> {
    Ok(match provider {
        Provider::OpenAi => parse::<OpenAiDocument>(data)?.read(counts),
        Provider::Anthropic => {
            let doc = parse::<AnthropicDocument>(data)?;
            let start = doc.kind.as_deref() == Some("message_start") || event == b"message_start";
            doc.read(start, counts)
        }
        Provider::Gemini => return read_document(provider, data, counts),
    })
}

/// A whole JSON body: whether it carried usage; an error when it is not JSON its view reads.
pub(super) fn read_document(
    provider: Provider,
    body: &[u8],
    counts: &mut Counts,
) -> Result<bool, serde_json::Error> {
    Ok(match provider {
        Provider::OpenAi => parse::<OpenAiDocument>(body)?
            .usage
            .read(counts, OpenAiUsage::read),
        Provider::Anthropic => parse::<AnthropicDocument>(body)?
            .usage
            .read(counts, AnthropicUsage::read),
        // One document, or (`streamGenerateContent` without `alt=sse`) an array of them.
        Provider::Gemini if body.trim_ascii_start().starts_with(b"[") => {
            parse::<Vec<GeminiDocument>>(body)?
                .iter()
                .fold(false, |found, doc| doc.read(counts) | found)
        }
        Provider::Gemini => parse::<GeminiDocument>(body)?.read(counts),
    })
}

/// The provider's usage object at the start of `bytes` (what follows its key's colon, in the
/// kept tail of a body or event too long to keep whole): whether it carried usage; an error
/// when it is not JSON its view reads. Bytes after the object do not matter.
pub(super) fn read_usage_object(
    provider: Provider,
    bytes: &[u8],
    counts: &mut Counts,
) -> Result<bool, serde_json::Error> {
    fn first<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<UsageField<T>, serde_json::Error> {
        let mut values = serde_json::Deserializer::from_slice(bytes).into_iter::<UsageField<T>>();
        values.next().unwrap_or(Ok(UsageField::Absent))
    }
    Ok(match provider {
        Provider::OpenAi => first::<OpenAiUsage>(bytes)?.read(counts, OpenAiUsage::read),
        Provider::Anthropic => first::<AnthropicUsage>(bytes)?.read(counts, AnthropicUsage::read),
        Provider::Gemini => first::<GeminiUsage>(bytes)?.read(counts, GeminiUsage::read),
    })
}

impl OpenAiDocument {
    /// Responses API: `response.completed` (and `.incomplete`, `.failed`) carries
    /// `response.usage`; Chat Completions: the last chunk's `usage`.
    fn read(&self, counts: &mut Counts) -> bool {
        match self.response.0.as_ref().map(|response| &response.usage) {
            Some(usage) if !usage.is_silent() => usage.read(counts, OpenAiUsage::read),
            _ => self.usage.read(counts, OpenAiUsage::read),
        }
    }
}

impl AnthropicDocument<'_> {
    fn read(&self, start: bool, counts: &mut Counts) -> bool {
        match self.message.0.as_ref().map(|message| &message.usage) {
            Some(usage) if start && !usage.is_silent() => usage.read(counts, AnthropicUsage::read),
            _ => self.usage.read(counts, AnthropicUsage::read),
        }
    }
}

impl GeminiDocument {
    fn read(&self, counts: &mut Counts) -> bool {
        self.usage_metadata.read(counts, GeminiUsage::read)
    }
}

/// The characters of generated text an event's data carries: OpenAI Chat Completions'
/// `choices[].delta.content`, the Responses API's `delta` (`response.output_text.delta`),
/// Anthropic's `delta.text`, Gemini's `candidates[].content.parts[].text`; 0 for anything else.
pub(super) fn text_chars(provider: Provider, data: &[u8]) -> u64 {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return 0;
    };
    let chars = |text: &serde_json::Value| text.as_str().map_or(0, |s| s.chars().count() as u64);
    let each = |list: &serde_json::Value, f: &dyn Fn(&serde_json::Value) -> u64| {
        list.as_array().map_or(0, |items| items.iter().map(f).sum())
    };
    match provider {
        Provider::OpenAi => {
            let chat = each(&value["choices"], &|choice| {
                chars(&choice["delta"]["content"])
            });
            let responses = if value["type"] == "response.output_text.delta" {
                chars(&value["delta"])
            } else {
                0
            };
            chat + responses
        }
        Provider::Anthropic => chars(&value["delta"]["text"]),
        Provider::Gemini => each(&value["candidates"], &|candidate| {
            each(&candidate["content"]["parts"], &|part| chars(&part["text"]))
        }),
    }
}
