//! A fake LLM API for `proxy_pass`: answers in the shapes of OpenAI Chat Completions and
//! Responses, Anthropic Messages and Gemini generateContent, plain JSON or streamed as
//! server-sent events (one event per HTTP chunk, with a delay between them), with the usage
//! numbers the test asks for in the query string. One thread per connection, on a free
//! loopback port; dropped, it stops accepting.
//!
//! | path | answer |
//! |---|---|
//! | `.../chat/completions` | Chat Completions (`stream=1`: chunks, the usage chunk with `include_usage=1`) |
//! | `.../responses` | the Responses API (`stream=1`: events ending with `response.completed`) |
//! | `.../messages` | Anthropic Messages (`stream=1`: `message_start` ... `message_delta` ... `message_stop`) |
//! | `...:generateContent`, `...:streamGenerateContent` | Gemini (`alt=sse`: SSE, else a JSON array) |
//! | `.../models` | a model list: no usage |
//!
//! Query parameters: `prompt`, `completion`, `cached` (tokens), `chunks` (content events),
//! `delay_ms` (before each event, or before a plain answer), `status` (an OpenAI-shaped error with that status),
//! `cut=1` (close the connection before the stream's usage and its end), `usage_header=1`
//! (an `X-Usage-Tokens: TOTAL` header), `model` (the model the answer names: Chat Completions
//! say `fake` without it, the other shapes name none),
//! `from_body=1` (streamed, with the usage chunk, as
//! the JSON body says: `stream`, `stream_options.include_usage`, as OpenAI's API reads them).
//! `.../upload` answers `{"bytes":N,"hash":H}` for the body it received (no usage).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

pub struct FakeLlm {
    port: u16,
    stopping: Arc<AtomicBool>,
    requests: Arc<AtomicUsize>,
}

impl FakeLlm {
    pub fn start() -> FakeLlm {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the fake LLM");
        let port = listener.local_addr().unwrap().port();
        let stopping = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(AtomicUsize::new(0));
        let (stop, count) = (Arc::clone(&stopping), Arc::clone(&requests));
        thread::spawn(move || {
            for stream in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                count.fetch_add(1, Ordering::SeqCst);
                thread::spawn(move || serve(stream));
            }
        });
        FakeLlm {
            port,
            stopping,
            requests,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Requests that reached it.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

impl Drop for FakeLlm {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// The usage a fake answer reports.
struct Ask {
    prompt: u64,
    completion: u64,
    cached: u64,
    chunks: u64,
    delay: Duration,
    stream: bool,
    include_usage: bool,
    cut: bool,
    usage_header: bool,
    status: u16,
    model: Option<String>,
}

fn serve(stream: TcpStream) {
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
        return;
    }
    let mut content_length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        if line == "\r\n" || line == "\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                content_length = value.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0; content_length];
    let _ = reader.read_exact(&mut body);
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let target = request_line.split_whitespace().nth(1).unwrap_or("/");
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let params: HashMap<&str, &str> = query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .collect();
    let number = |name: &str, default: u64| {
        params
            .get(name)
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let from_body = number("from_body", 0) == 1;
    let ask = Ask {
        prompt: number("prompt", 10),
        completion: number("completion", 20),
        cached: number("cached", 0),
        chunks: number("chunks", 3),
        delay: Duration::from_millis(number("delay_ms", 0)),
        stream: number("stream", 0) == 1
            || params.get("alt") == Some(&"sse")
            || (from_body && json["stream"] == true),
        include_usage: if from_body {
            json["stream_options"]["include_usage"] == true
        } else {
            number("include_usage", 1) == 1
        },
        cut: number("cut", 0) == 1,
        usage_header: number("usage_header", 0) == 1,
        status: number("status", 200) as u16,
        model: params.get("model").map(|model| model.to_string()),
    };
    let mut out = stream;
    if ask.status != 200 {
        let body = format!(
            r#"{{"error":{{"message":"fake error {}","type":"server_error","code":null}}}}"#,
            ask.status
        );
        let _ = write_json(&mut out, ask.status, &body, None);
        return;
    }
    let header = ask
        .usage_header
        .then(|| format!("X-Usage-Tokens: {}\r\n", ask.prompt + ask.completion));
    let header = header.as_deref();
    if path.ends_with("/upload") {
        let answer = format!(r#"{{"bytes":{},"hash":{}}}"#, body.len(), body_hash(&body));
        let _ = write_json(&mut out, 200, &answer, None);
        return;
    }
    if path.ends_with("/models") {
        let _ = write_json(
            &mut out,
            200,
            r#"{"object":"list","data":[{"id":"fake-model","object":"model"}]}"#,
            header,
        );
        return;
    }
    let shape = if path.ends_with("/chat/completions") {
        Shape::Chat
    } else if path.ends_with("/responses") {
        Shape::Responses
    } else if path.ends_with("/messages") {
        Shape::Anthropic
    } else if path.contains(":generateContent") || path.contains(":streamGenerateContent") {
        Shape::Gemini
    } else {
        let _ = write_json(
            &mut out,
            404,
            r#"{"error":{"message":"no such path"}}"#,
            None,
        );
        return;
    };
    if !ask.stream {
        thread::sleep(ask.delay);
        let _ = write_json(&mut out, 200, &shape.document(&ask), header);
        return;
    }
    let _ = write_stream(&mut out, shape, &ask, header);
}

impl Ask {
    /// The model of a Chat Completions answer, and `"model":"NAME",` for the other shapes
    /// (empty without `model=`).
    fn names(&self) -> (&str, String) {
        let chat = self.model.as_deref().unwrap_or("fake");
        let named = self
            .model
            .as_ref()
            .map_or(String::new(), |model| format!(r#""model":"{model}","#));
        (chat, named)
    }

    /// `"modelVersion":"NAME",` (empty without `model=`).
    fn gemini_version(&self) -> String {
        self.model.as_ref().map_or(String::new(), |model| {
            format!(r#""modelVersion":"{model}","#)
        })
    }
}

#[derive(Clone, Copy)]
enum Shape {
    Chat,
    Responses,
    Anthropic,
    Gemini,
}

impl Shape {
    fn document(self, ask: &Ask) -> String {
        let (p, c, k) = (ask.prompt, ask.completion, ask.cached);
        let t = p + c;
        let (chat_model, named) = ask.names();
        let gemini = ask.gemini_version();
        match self {
            Shape::Chat => format!(
                r#"{{"id":"chatcmpl-f","object":"chat.completion","model":"{chat_model}","choices":[{{"index":0,"message":{{"role":"assistant","content":"fake"}},"finish_reason":"stop"}}],"usage":{{"prompt_tokens":{p},"completion_tokens":{c},"total_tokens":{t},"prompt_tokens_details":{{"cached_tokens":{k}}}}}}}"#
            ),
            Shape::Responses => format!(
                r#"{{"id":"resp_f","object":"response",{named}"status":"completed","output":[],"usage":{{"input_tokens":{p},"input_tokens_details":{{"cached_tokens":{k}}},"output_tokens":{c},"total_tokens":{t}}}}}"#
            ),
            // Anthropic's input_tokens leaves out the cache reads.
            Shape::Anthropic => format!(
                r#"{{"id":"msg_f","type":"message",{named}"role":"assistant","content":[{{"type":"text","text":"fake"}}],"usage":{{"input_tokens":{},"cache_read_input_tokens":{k},"cache_creation_input_tokens":0,"output_tokens":{c}}}}}"#,
                p - k.min(p)
            ),
            Shape::Gemini => format!(
                r#"[{{"candidates":[{{"content":{{"parts":[{{"text":"fake"}}],"role":"model"}}}}],{gemini}"usageMetadata":{{"promptTokenCount":{p},"candidatesTokenCount":{c},"totalTokenCount":{t},"cachedContentTokenCount":{k}}}}}]"#
            ),
        }
    }

    /// The stream's events: `(event name, data)`; the last ones carry the usage.
    fn events(self, ask: &Ask) -> (Vec<(Option<&'static str>, String)>, usize) {
        let (p, c, k, n) = (ask.prompt, ask.completion, ask.cached, ask.chunks.max(1));
        let t = p + c;
        let (chat_model, named) = ask.names();
        let gemini = ask.gemini_version();
        let mut events = Vec::new();
        // The index from which the events carry (or complete) the usage.
        let usage_from;
        match self {
            Shape::Chat => {
                for i in 0..n {
                    events.push((None, format!(r#"{{"object":"chat.completion.chunk","choices":[{{"index":0,"delta":{{"content":"w{i} "}}}}],"usage":null}}"#)));
                }
                usage_from = events.len();
                if ask.include_usage {
                    events.push((None, format!(r#"{{"object":"chat.completion.chunk","model":"{chat_model}","choices":[],"usage":{{"prompt_tokens":{p},"completion_tokens":{c},"total_tokens":{t},"prompt_tokens_details":{{"cached_tokens":{k}}}}}}}"#)));
                }
                events.push((None, "[DONE]".into()));
            }
            Shape::Responses => {
                events.push((
                    Some("response.created"),
                    r#"{"type":"response.created","response":{"usage":null}}"#.into(),
                ));
                for i in 0..n {
                    events.push((
                        Some("response.output_text.delta"),
                        format!(r#"{{"type":"response.output_text.delta","delta":"w{i} "}}"#),
                    ));
                }
                usage_from = events.len();
                events.push((Some("response.completed"), format!(r#"{{"type":"response.completed","response":{{{named}"status":"completed","usage":{{"input_tokens":{p},"input_tokens_details":{{"cached_tokens":{k}}},"output_tokens":{c},"total_tokens":{t}}}}}}}"#)));
            }
            Shape::Anthropic => {
                events.push((Some("message_start"), format!(r#"{{"type":"message_start","message":{{{named}"usage":{{"input_tokens":{},"cache_read_input_tokens":{k},"output_tokens":1}}}}}}"#, p - k.min(p))));
                for i in 0..n {
                    events.push((Some("content_block_delta"), format!(r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":"w{i} "}}}}"#)));
                }
                usage_from = events.len();
                events.push((Some("message_delta"), format!(r#"{{"type":"message_delta","delta":{{"stop_reason":"end_turn"}},"usage":{{"output_tokens":{c}}}}}"#)));
                events.push((Some("message_stop"), r#"{"type":"message_stop"}"#.into()));
            }
            Shape::Gemini => {
                for i in 0..n {
                    // Cumulative counts on every chunk; the last is the whole.
                    let so_far = c * (i + 1) / (n + 1);
                    events.push((None, format!(r#"{{"candidates":[{{"content":{{"parts":[{{"text":"w{i} "}}]}}}}],"usageMetadata":{{"promptTokenCount":{p},"candidatesTokenCount":{so_far},"totalTokenCount":{}}}}}"#, p + so_far)));
                }
                usage_from = events.len();
                events.push((None, format!(r#"{{"candidates":[{{"content":{{"parts":[{{"text":"end"}}]}},"finishReason":"STOP"}}],{gemini}"usageMetadata":{{"promptTokenCount":{p},"candidatesTokenCount":{c},"totalTokenCount":{t},"cachedContentTokenCount":{k}}}}}"#)));
            }
        }
        (events, usage_from)
    }
}

/// A hash of `body` the test computes again on what it sent.
pub fn body_hash(body: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    body.hash(&mut hasher);
    hasher.finish()
}

fn write_json(
    out: &mut TcpStream,
    status: u16,
    body: &str,
    header: Option<&str>,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{}Connection: close\r\n\r\n",
        body.len(),
        header.unwrap_or("")
    );
    out.write_all(head.as_bytes())?;
    out.write_all(body.as_bytes())
}

fn write_stream(
    out: &mut TcpStream,
    shape: Shape,
    ask: &Ask,
    header: Option<&str>,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n{}Connection: close\r\n\r\n",
        header.unwrap_or("")
    );
    out.write_all(head.as_bytes())?;
    out.flush()?;
    let (events, usage_from) = shape.events(ask);
    for (index, (name, data)) in events.iter().enumerate() {
        if ask.cut && index >= usage_from {
            // Closed mid-stream: no usage event, no last chunk.
            return Ok(());
        }
        thread::sleep(ask.delay);
        let event = match name {
            Some(name) => format!("event: {name}\ndata: {data}\n\n"),
            None => format!("data: {data}\n\n"),
        };
        out.write_all(format!("{:x}\r\n{event}\r\n", event.len()).as_bytes())?;
        out.flush()?;
    }
    out.write_all(b"0\r\n\r\n")
}
