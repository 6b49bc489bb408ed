//! The model a response names, for a price table (`prices=`): OpenAI's `model` (Chat
//! Completions, and `response.model` of the Responses API), Anthropic's `model` (and
//! `message.model` of `message_start`), Gemini's `modelVersion`. Read only from a document
//! kept whole; a value that is not a string names no model.

use std::borrow::Cow;

use serde::Deserialize;

#[derive(Default, Deserialize)]
#[serde(default)]
struct Named<'a> {
    #[serde(borrow)]
    model: Option<Cow<'a, str>>,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct Document<'a> {
    #[serde(borrow)]
    model: Option<Cow<'a, str>>,
    #[serde(rename = "modelVersion", borrow)]
    model_version: Option<Cow<'a, str>>,
    #[serde(borrow)]
    response: Option<Named<'a>>,
    #[serde(borrow)]
    message: Option<Named<'a>>,
}

impl<'a> Document<'a> {
    fn model(self) -> Option<String> {
        let nested = |named: Option<Named<'a>>| named.and_then(|named| named.model);
        self.model
            .or(self.model_version)
            .or_else(|| nested(self.response))
            .or_else(|| nested(self.message))
            .filter(|model| !model.is_empty())
            .map(Cow::into_owned)
    }
}

/// The model `bytes` (a whole JSON document, or a JSON array of them: the last that names
/// one) names.
///
/// ```
/// use ratelimit_core::usage::model::model_of;
///
/// assert_eq!(model_of(br#"{"model":"gpt-4o-2024-08-06","usage":{}}"#).as_deref(), Some("gpt-4o-2024-08-06"));
/// assert_eq!(model_of(br#"{"type":"message_start","message":{"model":"claude-sonnet-4"}}"#).as_deref(), Some("claude-sonnet-4"));
/// assert_eq!(model_of(br#"{"model":7}"#), None);
/// ```
pub fn model_of(bytes: &[u8]) -> Option<String> {
    if bytes.trim_ascii_start().starts_with(b"[") {
        let documents: Vec<Document> = serde_json::from_slice(bytes).ok()?;
        return documents.into_iter().rev().find_map(Document::model);
    }
    serde_json::from_slice::<Document>(bytes).ok()?.model()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_provider_shape() {
        #[rustfmt::skip]
        let rows: &[(&str, Option<&str>)] = &[
            (r#"{"id":"c","object":"chat.completion","model":"gpt-4o-mini","usage":{"prompt_tokens":1}}"#, Some("gpt-4o-mini")),
            (r#"{"type":"response.completed","response":{"model":"o3","usage":{"input_tokens":1}}}"#, Some("o3")),
            (r#"{"type":"message","model":"claude-opus-4","usage":{"input_tokens":1}}"#, Some("claude-opus-4")),
            (r#"{"usageMetadata":{"promptTokenCount":1},"modelVersion":"gemini-2.5-flash"}"#, Some("gemini-2.5-flash")),
            (r#"[{"modelVersion":"gemini-2.5-pro"},{"usageMetadata":{}}]"#, Some("gemini-2.5-pro")),
            (r#"{"model":"","usage":{}}"#, None),
            (r#"{"model":null}"#, None),
            (r#"{"usage":{"prompt_tokens":1}}"#, None),
            (r#"{"model":"cut"#, None),
            ("not json", None),
        ];
        for (body, model) in rows {
            assert_eq!(model_of(body.as_bytes()).as_deref(), *model, "{body}");
        }
    }
}
