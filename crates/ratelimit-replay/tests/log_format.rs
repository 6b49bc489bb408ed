//! Properties of reading access logs: a line written from any values in a format reads back
//! as those values, no line panics whatever its bytes, and whole-second times are spread over
//! their second in order.

use proptest::prelude::*;
use ratelimit_replay::input::{InputFormat, LineReader, LogInput, SecondSpreader};
use ratelimit_replay::log_format::{LogFormat, COMBINED, COMMON};

/// A value nginx could log between two separators: no `"`, no space when the format puts a
/// space after it (nginx escapes `"` as `\x22`; spaces occur inside quoted values only).
fn value(quoted: bool) -> impl Strategy<Value = String> {
    if quoted {
        "[a-zA-Z0-9/?=&.:; ()-]{0,40}".boxed()
    } else {
        "[a-zA-Z0-9/?=&.:-]{1,20}".boxed()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A combined line built from random values reads back as those values.
    #[test]
    fn combined_lines_round_trip(
        addr in value(false), user in value(false), request in value(true), status in 100..600u16,
        bytes in 0..1_000_000u32, referer in value(true), agent in value(true),
    ) {
        let time = "01/Dec/2026:18:35:53 +0000";
        let line = format!(
            "{addr} - {user} [{time}] \"{request}\" {status} {bytes} \"{referer}\" \"{agent}\""
        );
        let format = LogFormat::parse(COMBINED).unwrap();
        let values = format.match_line(&line).unwrap();
        let expected = [
            ("remote_addr", addr.as_str()), ("remote_user", user.as_str()),
            ("time_local", time), ("request", request.as_str()),
            ("status", &status.to_string()), ("body_bytes_sent", &bytes.to_string()),
            ("http_referer", referer.as_str()), ("http_user_agent", agent.as_str()),
        ];
        prop_assert_eq!(values.len(), expected.len());
        for ((name, got), (want_name, want)) in values.iter().zip(expected.iter()) {
            prop_assert_eq!(name, want_name);
            prop_assert_eq!(got, want);
        }
    }

    /// Any line, in any of the formats, gives a request or an error naming its line: never a
    /// panic.
    #[test]
    fn no_line_panics(line in any::<String>(), custom in "[$a-z_{} \"\\[\\]:-]{1,30}") {
        let mut formats = vec![
            InputFormat::Timeline,
            InputFormat::AccessLog { key_field: 3 },
            InputFormat::Log(LogInput::new("combined", COMBINED, "$remote_addr").unwrap()),
            InputFormat::Log(LogInput::new("common", COMMON, "$remote_addr").unwrap()),
        ];
        if let Ok(input) = LogInput::new("custom", &custom, "$remote_addr") {
            formats.push(InputFormat::Log(input));
        }
        for format in formats {
            let mut reader = LineReader::new(format);
            if let Err(error) = reader.read(7, &line) {
                prop_assert!(error.to_string().starts_with("line 7: "));
            }
        }
    }

    /// Whole-second requests come out in input order, each inside its own second, evenly
    /// spaced within it.
    #[test]
    fn seconds_are_spread_in_order(counts in prop::collection::vec(1..50usize, 1..20)) {
        let input = LogInput::new("common", COMMON, "$remote_addr").unwrap();
        let mut reader = LineReader::new(InputFormat::Log(input));
        let mut spreader = SecondSpreader::default();
        let mut placed = Vec::new();
        let mut number = 0;
        for (second, &count) in counts.iter().enumerate() {
            for _ in 0..count {
                number += 1;
                let line = format!(
                    "10.0.0.1 - - [01/Dec/2026:18:{:02}:{:02} +0000] \"GET / HTTP/1.1\" 200 5",
                    second / 60,
                    second % 60
                );
                let request = reader.read(number, &line).unwrap().unwrap();
                placed.extend(spreader.push(request));
            }
        }
        placed.extend(spreader.finish());
        prop_assert_eq!(placed.len(), number);
        let base = 1_796_148_000_000_000_000u64; // 18:00:00
        let mut index = 0;
        for (second, &count) in counts.iter().enumerate() {
            for i in 0..count {
                let request = &placed[index];
                prop_assert_eq!(request.line, index + 1);
                let expected = base + second as u64 * 1_000_000_000
                    + i as u64 * 1_000_000_000 / count as u64;
                prop_assert_eq!(request.time_ns, expected);
                index += 1;
            }
        }
    }
}
