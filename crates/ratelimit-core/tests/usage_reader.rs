//! The usage reader against transcripts shaped like each provider's responses (tests/data/):
//! the usage found is the same however the body is split into chunks: at every single byte
//! boundary, one byte at a time, and in random chunkings.

use proptest::prelude::*;
use ratelimit_core::usage::reader::{Format, Reader};
use ratelimit_core::usage::{Provider, Usage};

struct Transcript {
    name: &'static str,
    provider: Provider,
    format: Format,
    body: &'static [u8],
    usage: Usage,
}

fn usage(prompt: u64, completion: u64, cached: u64, total: u64) -> Usage {
    Usage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        cached_tokens: cached,
        total_tokens: total,
    }
}

fn transcripts() -> Vec<Transcript> {
    use Format::{EventStream, Json};
    use Provider::*;
    macro_rules! data {
        ($name:literal) => {
            include_bytes!(concat!("data/", $name))
        };
    }
    vec![
        Transcript {
            name: "openai_chat_stream.sse",
            provider: OpenAi,
            format: EventStream,
            body: data!("openai_chat_stream.sse"),
            usage: usage(1200, 345, 1024, 1545),
        },
        Transcript {
            name: "openai_responses_stream.sse",
            provider: OpenAi,
            format: EventStream,
            body: data!("openai_responses_stream.sse"),
            usage: usage(321, 98, 64, 419),
        },
        Transcript {
            name: "anthropic_stream.sse",
            provider: Anthropic,
            format: EventStream,
            body: data!("anthropic_stream.sse"),
            usage: usage(610, 77, 200, 687),
        },
        Transcript {
            name: "gemini_stream.sse",
            provider: Gemini,
            format: EventStream,
            body: data!("gemini_stream.sse"),
            usage: usage(52, 23, 32, 75),
        },
        Transcript {
            name: "openai_chat.json",
            provider: OpenAi,
            format: Json,
            body: data!("openai_chat.json"),
            usage: usage(900, 120, 512, 1020),
        },
        Transcript {
            name: "openai_responses.json",
            provider: OpenAi,
            format: Json,
            body: data!("openai_responses.json"),
            usage: usage(75, 125, 0, 200),
        },
        Transcript {
            name: "anthropic.json",
            provider: Anthropic,
            format: Json,
            body: data!("anthropic.json"),
            usage: usage(2495, 503, 300, 2998),
        },
        Transcript {
            name: "gemini.json",
            provider: Gemini,
            format: Json,
            body: data!("gemini.json"),
            usage: usage(11, 44, 0, 55),
        },
    ]
}

fn read(
    transcript: &Transcript,
    chunks: impl IntoIterator<Item = std::ops::Range<usize>>,
) -> Option<Usage> {
    let mut reader = Reader::new(transcript.provider, transcript.format);
    for range in chunks {
        reader.feed(&transcript.body[range]);
    }
    reader.finish();
    reader.usage()
}

#[test]
fn whole_transcripts() {
    for transcript in transcripts() {
        let len = transcript.body.len();
        assert_eq!(
            read(&transcript, std::iter::once(0..len)),
            Some(transcript.usage),
            "{}",
            transcript.name
        );
    }
}

#[test]
fn split_at_every_byte_boundary() {
    for transcript in transcripts() {
        let len = transcript.body.len();
        for at in 0..=len {
            assert_eq!(
                read(&transcript, [0..at, at..len]),
                Some(transcript.usage),
                "{} split at {at}",
                transcript.name
            );
        }
        assert_eq!(
            read(&transcript, (0..len).map(|at| at..at + 1)),
            Some(transcript.usage),
            "{} one byte at a time",
            transcript.name
        );
    }
}

#[test]
fn an_unfinished_first_event_counts_nothing() {
    for transcript in transcripts()
        .iter()
        .filter(|t| t.format == Format::EventStream)
    {
        // Up to the first line end: no event is complete yet, so no usage is read, even where
        // the first event carries some (Anthropic, Gemini).
        let first_event_end = transcript
            .body
            .windows(2)
            .position(|w| w == b"\n\n" || w == b"\r\n")
            .unwrap();
        let found = read(transcript, std::iter::once(0..first_event_end));
        assert_eq!(found, None, "{}", transcript.name);
    }
}

proptest! {
    #[test]
    fn any_chunking_gives_the_same_usage(index in 0usize..8, cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..40)) {
        let transcripts = transcripts();
        let transcript = &transcripts[index];
        let len = transcript.body.len();
        let mut points: Vec<usize> = cuts.iter().map(|cut| cut.index(len + 1)).collect();
        points.push(0);
        points.push(len);
        points.sort_unstable();
        let chunks = points.windows(2).map(|w| w[0]..w[1]);
        prop_assert_eq!(read(transcript, chunks), Some(transcript.usage));
    }
}
