//! An incremental reader of `text/event-stream` (the WHATWG HTML standard's server-sent
//! events): lines end with CRLF, LF or CR; `field: value` lines (one optional space after the
//! colon), `:` comments, and a blank line that dispatches the event. Bytes go straight into
//! the field they belong to, so no line is kept: memory is the event's data, capped
//! ([`Capped`]).

use memchr::memchr2;

use super::counts::Capped;

/// The longest event name kept (longer ones are cut; none of the providers' is near it).
const EVENT_NAME_MAX: usize = 64;
/// The longest field name told apart (`data`, `event`, `id`, `retry`).
const FIELD_NAME_MAX: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    Data,
    Event,
    Other,
}

#[derive(Debug)]
enum Line {
    /// Nothing of the line read yet.
    Start,
    /// The field's name so far (cut at [`FIELD_NAME_MAX`]: then no field we read).
    Name {
        name: [u8; FIELD_NAME_MAX],
        len: usize,
        long: bool,
    },
    /// The value of `field`; `first` until its first byte (a leading space is dropped).
    Value { field: Field, first: bool },
    /// A comment line.
    Comment,
}

/// The reader's state between chunks.
pub(crate) struct EventStream {
    line: Line,
    /// The previous chunk ended with CR: a LF first in the next one ends nothing more.
    after_cr: bool,
    data: Capped,
    event: Vec<u8>,
}

impl EventStream {
    pub(crate) fn new(data: Capped) -> EventStream {
        EventStream {
            line: Line::Start,
            after_cr: false,
            data,
            event: Vec::new(),
        }
    }

    /// Read `bytes`, calling `dispatch(event name, data)` for each event they complete.
    pub(crate) fn feed(&mut self, mut bytes: &[u8], dispatch: &mut impl FnMut(&[u8], &Capped)) {
        if self.after_cr {
            self.after_cr = false;
            if let Some(rest) = bytes.strip_prefix(b"\n") {
                bytes = rest;
            }
        }
        while !bytes.is_empty() {
            match memchr2(b'\n', b'\r', bytes) {
                None => {
                    self.line_bytes(bytes);
                    return;
                }
                Some(at) => {
                    self.line_bytes(&bytes[..at]);
                    self.end_line(dispatch);
                    let cr = bytes[at] == b'\r';
                    bytes = &bytes[at + 1..];
                    if cr {
                        match bytes.first() {
                            Some(b'\n') => bytes = &bytes[1..],
                            Some(_) => {}
                            None => self.after_cr = true,
                        }
                    }
                }
            }
        }
    }

    /// Whether the stream is between events: no line begun, nothing gathered, no `\r` whose
    /// `\n` may follow.
    pub(crate) fn between_events(&self) -> bool {
        matches!(self.line, Line::Start)
            && !self.after_cr
            && self.data.is_empty()
            && self.event.is_empty()
    }

    fn line_bytes(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            match &mut self.line {
                Line::Start => {
                    if bytes[0] == b':' {
                        self.line = Line::Comment;
                        return;
                    }
                    self.line = Line::Name {
                        name: [0; FIELD_NAME_MAX],
                        len: 0,
                        long: false,
                    };
                }
                Line::Name { name, len, long } => {
                    let (part, rest) = match memchr::memchr(b':', bytes) {
                        Some(at) => (&bytes[..at], Some(&bytes[at + 1..])),
                        None => (bytes, None),
                    };
                    for &byte in part {
                        if *len < FIELD_NAME_MAX {
                            name[*len] = byte;
                            *len += 1;
                        } else {
                            *long = true;
                        }
                    }
                    let Some(rest) = rest else { return };
                    let field = field_of(&name[..*len], *long);
                    if field == Field::Event {
                        self.event.clear();
                    }
                    self.line = Line::Value { field, first: true };
                    bytes = rest;
                }
                Line::Value { field, first } => {
                    if *first {
                        *first = false;
                        if bytes[0] == b' ' {
                            bytes = &bytes[1..];
                            continue;
                        }
                    }
                    match field {
                        Field::Data => self.data.extend(bytes),
                        Field::Event => {
                            let room = EVENT_NAME_MAX.saturating_sub(self.event.len());
                            self.event
                                .extend_from_slice(&bytes[..bytes.len().min(room)]);
                        }
                        Field::Other => {}
                    }
                    return;
                }
                Line::Comment => return,
            }
        }
    }

    fn end_line(&mut self, dispatch: &mut impl FnMut(&[u8], &Capped)) {
        match core::mem::replace(&mut self.line, Line::Start) {
            Line::Start => self.dispatch(dispatch),
            // A field name alone has an empty value.
            Line::Name { name, len, long } => match field_of(&name[..len], long) {
                Field::Data => self.data.extend(b"\n"),
                Field::Event => self.event.clear(),
                Field::Other => {}
            },
            Line::Value {
                field: Field::Data, ..
            } => self.data.extend(b"\n"),
            Line::Value { .. } | Line::Comment => {}
        }
    }

    fn dispatch(&mut self, dispatch: &mut impl FnMut(&[u8], &Capped)) {
        if !self.data.is_empty() {
            self.data.strip_last_newline();
            dispatch(&self.event, &self.data);
        }
        self.data.clear();
        self.event.clear();
    }
}

fn field_of(name: &[u8], long: bool) -> Field {
    match (name, long) {
        (b"data", false) => Field::Data,
        (b"event", false) => Field::Event,
        _ => Field::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(chunks: &[&[u8]]) -> Vec<(String, String)> {
        let mut stream = EventStream::new(Capped::new(1 << 10, 1 << 10));
        let mut seen = Vec::new();
        for chunk in chunks {
            stream.feed(chunk, &mut |event, data| {
                seen.push((
                    String::from_utf8_lossy(event).into_owned(),
                    String::from_utf8_lossy(data.bytes()).into_owned(),
                ))
            });
        }
        seen
    }

    #[test]
    fn fields_lines_and_endings() {
        let pair = |e: &str, d: &str| (e.to_string(), d.to_string());
        #[rustfmt::skip]
        type Row<'a> = (&'a [&'a [u8]], Vec<(String, String)>);
        let rows: &[Row] = &[
            (&[b"data: a\n\n"], vec![pair("", "a")]),
            (&[b"data:a\r\n\r\n"], vec![pair("", "a")]),
            (
                &[b"data: a\r\rdata: b\r", b"\n\r", b"\n"],
                vec![pair("", "a"), pair("", "b")],
            ),
            (
                &[b"event: x\ndata: 1\ndata:  2\n\n"],
                vec![pair("x", "1\n 2")],
            ),
            (&[b": comment\ndata\n\n"], vec![pair("", "")]),
            (&[b"data\ndata: z\n\n"], vec![pair("", "\nz")]),
            (&[b"id: 3\nretry: 5\ndata: q\n\n"], vec![pair("", "q")]),
            (&[b"datum: no\n\n"], vec![]),
            (&[b"event: only\n\ndata: next\n\n"], vec![pair("", "next")]),
            (&[b"data: cut at the end"], vec![]),
        ];
        for (chunks, expected) in rows {
            assert_eq!(&events(chunks), expected, "{chunks:?}");
        }
    }
}
