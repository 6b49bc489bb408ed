//! `$rate_limit_api_key`: the caller's credential, read where the line's provider takes it and
//! spelled one way, then replaced by a fingerprint that names it without revealing it.
//!
//! Where the credential is read depends on the API the request is for ([`Api`], named by the
//! location's `usage=` line), never on which header comes first:
//!
//! | API | its credential | when it has none |
//! |---|---|---|
//! | `openai` | `Authorization: Bearer TOKEN` | none |
//! | `anthropic` | `x-api-key` | `Authorization: Bearer` (an OAuth token) |
//! | `gemini` | `x-goog-api-key`, `?key=` (both, when both are sent) | `Authorization: Bearer` (an OAuth token) |
//! | `azure` | `api-key` | `Authorization: Bearer` (a Microsoft Entra ID token) |
//! | none named | every place above | — |
//!
//! A header of another API is not read, so whatever a client adds to a request, its key is
//! the credential its API bills. Every copy of the places read must agree: two `Authorization`
//! headers with two tokens, or `x-goog-api-key` and `?key=` naming two keys, are a
//! [`Credential::Conflict`], whose key is [`CONFLICT_KEY`] (one budget for every such
//! request, never a fresh one: the upstream may bill either credential).
//!
//! Spellings: the `Bearer` scheme in any case (RFC 7235), blanks and tabs around the token or
//! the whole value; blanks around a header's value dropped; `?key=` (its name in any case)
//! percent-decoded. An empty value, and another scheme than `Bearer`, is no credential.
//!
//! The fingerprint is what the variable's value is, so the secret itself never reaches the
//! zone: not its shared memory, top keys, the admin API, logs, the state file nor Redis. It is
//! `HEAD...TAIL~HASH`: the credential's first and last three characters, shown only when it
//! has at least [`SHOWN_MIN_LEN`] characters, all visible ASCII (else `...~HASH`), and
//! [`HASH_HEX_LEN`] hex digits (64 bits) of the SHA-256 of the credential. The 64 bits keep two
//! credentials apart (two of a million keys share a hash with a chance near 3 in 10^8), and
//! they only let whoever holds a fingerprint check a guess: a credential of 24 random
//! characters keeps more than 100 unknown bits after its six shown ones. A short or guessable
//! credential (a password) could be found by trying guesses against the hash: don't use this
//! variable for such.

use std::borrow::Cow;

/// The hex digits of the hash in a fingerprint (64 bits).
pub const HASH_HEX_LEN: usize = 16;
/// The characters a credential needs for its head and tail to be shown.
pub const SHOWN_MIN_LEN: usize = 24;
/// The characters of the head and of the tail shown.
const SHOWN_LEN: usize = 3;
/// The longest fingerprint: `HEAD...TAIL~HASH`.
pub const FINGERPRINT_MAX: usize = SHOWN_LEN + 3 + SHOWN_LEN + 1 + HASH_HEX_LEN;
/// The key of a request whose copies of its credential disagree ([`Credential::Conflict`]):
/// no fingerprint has it (a fingerprint has a `~`).
pub const CONFLICT_KEY: &[u8] = b"conflicting-credentials";

/// The API a request's credential is for: where it is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Api {
    /// OpenAI (and OpenAI-compatible servers): `Authorization: Bearer`.
    OpenAi,
    /// Anthropic: `x-api-key`.
    Anthropic,
    /// Gemini: `x-goog-api-key` or `?key=`.
    Gemini,
    /// Azure OpenAI: `api-key`.
    Azure,
}

impl Api {
    /// Every API, in the order of [`Api::index`].
    pub const ALL: [Api; 4] = [Api::OpenAi, Api::Anthropic, Api::Gemini, Api::Azure];

    /// `openai`, `anthropic`, `gemini`, `azure`: the word of `usage=`.
    pub fn as_str(self) -> &'static str {
        match self {
            Api::OpenAi => "openai",
            Api::Anthropic => "anthropic",
            Api::Gemini => "gemini",
            Api::Azure => "azure",
        }
    }

    /// Its place in [`Api::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The API's own places, and whether `Authorization: Bearer` is read when they hold none.
    fn places(self) -> (&'static [Place], bool) {
        match self {
            Api::OpenAi => (&[Place::Authorization], false),
            Api::Anthropic => (&[Place::XApiKey], true),
            Api::Gemini => (&[Place::XGoogApiKey, Place::QueryKey], true),
            Api::Azure => (&[Place::ApiKey], true),
        }
    }
}

/// Where a credential may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    Authorization,
    XApiKey,
    XGoogApiKey,
    ApiKey,
    QueryKey,
}

const PLACES: usize = 5;
const ALL_PLACES: [Place; PLACES] = [
    Place::Authorization,
    Place::XApiKey,
    Place::XGoogApiKey,
    Place::ApiKey,
    Place::QueryKey,
];

/// What one place held, over all its copies.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
enum Seen<'a> {
    #[default]
    Absent,
    One(Cow<'a, [u8]>),
    /// Two copies named two credentials.
    Conflict,
}

impl<'a> Seen<'a> {
    fn add(&mut self, value: Cow<'a, [u8]>) {
        match self {
            Seen::Absent => *self = Seen::One(value),
            Seen::One(seen) if *seen == value => {}
            Seen::One(_) | Seen::Conflict => *self = Seen::Conflict,
        }
    }
}

/// The credential a request carries for an API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Credential<'a> {
    /// None: the variable is empty.
    Absent,
    /// The credential, spelled one way.
    One(&'a [u8]),
    /// Copies of the places read name different credentials.
    Conflict,
}

/// The credentials of a request, place by place: fed every header and the query string.
#[derive(Clone, Debug, Default)]
pub struct Sources<'a> {
    places: [Seen<'a>; PLACES],
}

impl<'a> Sources<'a> {
    /// One request header, any: the ones that hold no credential are skipped.
    pub fn header(&mut self, name: &[u8], value: &'a [u8]) {
        let place = match name.len() {
            7 if name.eq_ignore_ascii_case(b"api-key") => Place::ApiKey,
            9 if name.eq_ignore_ascii_case(b"x-api-key") => Place::XApiKey,
            13 if name.eq_ignore_ascii_case(b"authorization") => Place::Authorization,
            14 if name.eq_ignore_ascii_case(b"x-goog-api-key") => Place::XGoogApiKey,
            _ => return,
        };
        let value = match place {
            Place::Authorization => bearer_token(value),
            _ => Some(trim_blanks(value)).filter(|value| !value.is_empty()),
        };
        if let Some(value) = value {
            self.places[place as usize].add(Cow::Borrowed(value));
        }
    }

    /// The query string (without `?`): every `key=` argument, its name in any case.
    pub fn query(&mut self, args: &'a [u8]) {
        for argument in args.split(|&byte| byte == b'&') {
            let Some((name, value)) = argument.split_at_checked(4) else {
                continue;
            };
            if name.eq_ignore_ascii_case(b"key=") {
                let value = percent_decoded(value);
                if !value.is_empty() {
                    self.places[Place::QueryKey as usize].add(value);
                }
            }
        }
    }

    /// The credential for `api` (`None`: a location that names no API, where every place is
    /// read and all must agree).
    ///
    /// ```
    /// use ratelimit_core::api_key::{Api, Credential, Sources};
    ///
    /// let mut sources = Sources::default();
    /// sources.header(b"x-goog-api-key", b"AIza-1");
    /// sources.header(b"X-Api-Key", b"junk-7");
    /// sources.header(b"authorization", b"bearer \t sk-1 ");
    /// assert_eq!(sources.credential(Some(Api::Gemini)), Credential::One(b"AIza-1"));
    /// assert_eq!(sources.credential(Some(Api::Anthropic)), Credential::One(b"junk-7"));
    /// assert_eq!(sources.credential(Some(Api::OpenAi)), Credential::One(b"sk-1"));
    /// assert_eq!(sources.credential(Some(Api::Azure)), Credential::One(b"sk-1"));
    /// assert_eq!(sources.credential(None), Credential::Conflict);
    /// sources.query(b"alt=sse&key=AI%7Aa");
    /// assert_eq!(sources.credential(Some(Api::Gemini)), Credential::Conflict);
    /// ```
    pub fn credential(&self, api: Option<Api>) -> Credential<'_> {
        let Some(api) = api else {
            return self.agreed(&ALL_PLACES);
        };
        let (own, bearer) = api.places();
        match self.agreed(own) {
            Credential::Absent if bearer => self.agreed(&[Place::Authorization]),
            found => found,
        }
    }

    /// The one credential `places` hold between them.
    fn agreed(&self, places: &[Place]) -> Credential<'_> {
        let mut found: Option<&[u8]> = None;
        for &place in places {
            match &self.places[place as usize] {
                Seen::Absent => {}
                Seen::Conflict => return Credential::Conflict,
                Seen::One(value) => match found {
                    Some(other) if other != value.as_ref() => return Credential::Conflict,
                    _ => found = Some(value),
                },
            }
        }
        found.map_or(Credential::Absent, Credential::One)
    }
}

/// The token of `Bearer TOKEN` (the scheme in any case, blanks around); `None` for another
/// scheme or an empty token.
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let value = trim_blanks(value);
    let (scheme, rest) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"bearer") || !rest.first().copied().is_some_and(is_blank) {
        return None;
    }
    let token = trim_blanks(rest);
    (!token.is_empty()).then_some(token)
}

fn is_blank(byte: u8) -> bool {
    byte == b' ' || byte == b'\t'
}

fn trim_blanks(value: &[u8]) -> &[u8] {
    let start = value
        .iter()
        .position(|&b| !is_blank(b))
        .unwrap_or(value.len());
    let end = value
        .iter()
        .rposition(|&b| !is_blank(b))
        .map_or(start, |at| at + 1);
    &value[start..end]
}

/// `%XX` decoded; a `%` not followed by two hex digits is kept as it is.
fn percent_decoded(value: &[u8]) -> Cow<'_, [u8]> {
    if !value.contains(&b'%') {
        return Cow::Borrowed(value);
    }
    let hex = |byte: u8| char::from(byte).to_digit(16);
    let mut decoded = Vec::with_capacity(value.len());
    let mut at = 0;
    while at < value.len() {
        let digits = value.get(at + 1..at + 3);
        match (value[at], digits.map(|d| (hex(d[0]), hex(d[1])))) {
            (b'%', Some((Some(high), Some(low)))) => {
                decoded.push((high * 16 + low) as u8);
                at += 3;
            }
            (byte, _) => {
                decoded.push(byte);
                at += 1;
            }
        }
    }
    Cow::Owned(decoded)
}

/// A credential's fingerprint, written into `out`: its length.
///
/// ```
/// use ratelimit_core::api_key::{fingerprint, FINGERPRINT_MAX};
///
/// let mut out = [0; FINGERPRINT_MAX];
/// let len = fingerprint(b"sk-proj-abcdefghijklmnopqrstuvwxyzXYZ", &mut out);
/// let shown = std::str::from_utf8(&out[..len]).unwrap();
/// assert!(shown.starts_with("sk-...XYZ~"));
/// assert_eq!(shown.len(), FINGERPRINT_MAX);
/// let len = fingerprint(b"short", &mut out);
/// assert!(out[..len].starts_with(b"...~"));
/// ```
pub fn fingerprint(credential: &[u8], out: &mut [u8; FINGERPRINT_MAX]) -> usize {
    let digest = ring::digest::digest(&ring::digest::SHA256, credential);
    let shown = credential.len() >= SHOWN_MIN_LEN && credential.iter().all(u8::is_ascii_graphic);
    let mut len = 0;
    let mut put = |bytes: &[u8]| {
        out[len..len + bytes.len()].copy_from_slice(bytes);
        len += bytes.len();
    };
    if shown {
        put(&credential[..SHOWN_LEN]);
    }
    put(b"...");
    if shown {
        put(&credential[credential.len() - SHOWN_LEN..]);
    }
    put(b"~");
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for &byte in &digest.as_ref()[..HASH_HEX_LEN / 2] {
        put(&[HEX[usize::from(byte >> 4)], HEX[usize::from(byte & 15)]]);
    }
    len
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(credential: &[u8]) -> String {
        let mut out = [0; FINGERPRINT_MAX];
        let len = fingerprint(credential, &mut out);
        String::from_utf8(out[..len].to_vec()).unwrap()
    }

    const SECRET: &[u8] = b"sk-test-0123456789abcdefghijKLM";

    /// The credential of a request of `headers` and `query` for `api`.
    fn read(headers: &[(&str, &str)], query: &str, api: Option<Api>) -> Option<Vec<u8>> {
        let mut sources = Sources::default();
        for (name, value) in headers {
            sources.header(name.as_bytes(), value.as_bytes());
        }
        sources.query(query.as_bytes());
        match sources.credential(api) {
            Credential::Absent => None,
            Credential::One(value) => Some(value.to_vec()),
            Credential::Conflict => Some(CONFLICT_KEY.to_vec()),
        }
    }

    #[test]
    fn spellings_of_one_credential() {
        let secret = "sk-test-0123456789abcdefghijKLM";
        let bearer = |spelling: &str| spelling.replace("TOKEN", secret);
        for spelling in [
            "Bearer TOKEN",
            "bearer TOKEN",
            "BEARER   TOKEN",
            "Bearer\tTOKEN",
            " \tbEaReR TOKEN \t",
        ] {
            let value = bearer(spelling);
            for api in [Some(Api::OpenAi), None] {
                let headers = [("Authorization", value.as_str())];
                assert_eq!(
                    read(&headers, "", api).as_deref(),
                    Some(SECRET),
                    "{spelling:?}"
                );
            }
        }
        #[rustfmt::skip]
        let rows: &[(&str, &str, &str, Api)] = &[
            ("x-api-key", " sk-test-0123456789abcdefghijKLM", "", Api::Anthropic),
            ("X-Goog-Api-Key", "sk-test-0123456789abcdefghijKLM\t", "", Api::Gemini),
            ("API-KEY", "sk-test-0123456789abcdefghijKLM", "", Api::Azure),
            ("x-other", "1", "alt=sse&key=sk-test-0123456789abcdefghijKLM", Api::Gemini),
            ("x-other", "1", "KEY=sk%2Dtest-0123456789abcdefghijKLM&x=1", Api::Gemini),
            // Both of Gemini's places, agreeing.
            ("x-goog-api-key", "sk-test-0123456789abcdefghijKLM", "key=sk-test-0123456789abcdefghijKLM", Api::Gemini),
        ];
        for &(name, value, query, api) in rows {
            assert_eq!(
                read(&[(name, value)], query, Some(api)).as_deref(),
                Some(SECRET),
                "{name} {query}"
            );
            // A location that names no API reads every place.
            assert_eq!(
                read(&[(name, value)], query, None).as_deref(),
                Some(SECRET),
                "{name} {query}"
            );
        }
    }

    /// Each API reads its own places only: another API's header, junk or not, never changes
    /// the key; `Authorization: Bearer` stands in only where the API's own places are empty.
    #[test]
    fn each_api_reads_its_own_places() {
        let junk = [
            ("Authorization", "Bearer junk-1"),
            ("x-api-key", "junk-2"),
            ("x-goog-api-key", "junk-3"),
            ("api-key", "junk-4"),
        ];
        let own = |api: Api| match api {
            Api::OpenAi => ("authorization", "Bearer sk-test-0123456789abcdefghijKLM"),
            Api::Anthropic => ("X-API-KEY", "sk-test-0123456789abcdefghijKLM"),
            Api::Gemini => ("x-goog-api-key", "sk-test-0123456789abcdefghijKLM"),
            Api::Azure => ("Api-Key", "sk-test-0123456789abcdefghijKLM"),
        };
        for api in Api::ALL {
            // Every subset of the other APIs' headers, before and after the API's own.
            let others: Vec<_> = junk
                .iter()
                .filter(|(name, _)| !name.eq_ignore_ascii_case(own(api).0))
                .collect();
            for subset in 0..1u32 << others.len() {
                let picked: Vec<(&str, &str)> = others
                    .iter()
                    .enumerate()
                    .filter(|(at, _)| subset & (1 << at) != 0)
                    .map(|(_, header)| **header)
                    .collect();
                for own_first in [true, false] {
                    let mut headers = picked.clone();
                    if own_first {
                        headers.insert(0, own(api));
                    } else {
                        headers.push(own(api));
                    }
                    let query = if subset & 1 != 0 { "key=junk-5" } else { "" };
                    let query = if api == Api::Gemini { "" } else { query };
                    assert_eq!(
                        read(&headers, query, Some(api)).as_deref(),
                        Some(SECRET),
                        "{api:?} {headers:?} {query}"
                    );
                }
            }
        }
        // None of its own: Bearer for the APIs that take OAuth tokens, not another API's key.
        let only_bearer = [
            ("Authorization", "Bearer sk-test-0123456789abcdefghijKLM"),
            ("x-api-key", "junk"),
        ];
        assert_eq!(
            read(&only_bearer, "", Some(Api::Gemini)).as_deref(),
            Some(SECRET)
        );
        assert_eq!(
            read(&only_bearer, "", Some(Api::Azure)).as_deref(),
            Some(SECRET)
        );
        assert_eq!(
            read(&only_bearer[1..], "key=junk-5", Some(Api::OpenAi)),
            None
        );
        assert_eq!(read(&only_bearer[1..], "", Some(Api::Gemini)), None);
        assert_eq!(
            read(&[("x-goog-api-key", "junk")], "", Some(Api::Azure)),
            None
        );
    }

    /// `(headers, query, API, credential)`; `None`: a conflict.
    type Row<'a> = (
        &'a [(&'a str, &'a str)],
        &'a str,
        Option<Api>,
        Option<&'a [u8]>,
    );

    /// Copies of one place, or Gemini's two places, that disagree are a conflict; copies
    /// that agree, or a copy that says nothing (empty, another scheme), are not.
    #[test]
    fn conflicts() {
        let conflict = Some(CONFLICT_KEY.to_vec());
        #[rustfmt::skip]
        let rows: &[Row] = &[
            (&[("Authorization", "Bearer sk-a"), ("authorization", "Bearer sk-b")], "", Some(Api::OpenAi), None),
            (&[("Authorization", "Bearer sk-a"), ("authorization", "bearer  sk-a")], "", Some(Api::OpenAi), Some(b"sk-a")),
            (&[("Authorization", "Basic dXNlcjpwYXNz"), ("authorization", "Bearer sk-a")], "", Some(Api::OpenAi), Some(b"sk-a")),
            (&[("Authorization", "Bearer "), ("authorization", "Bearer sk-a")], "", Some(Api::OpenAi), Some(b"sk-a")),
            (&[("x-goog-api-key", "AIza-a")], "key=AIza-b", Some(Api::Gemini), None),
            (&[("x-goog-api-key", "AIza-a")], "key=AIza-a&KEY=AIza%2Da", Some(Api::Gemini), Some(b"AIza-a")),
            (&[], "key=AIza-a&Key=AIza-b", Some(Api::Gemini), None),
            (&[("x-api-key", "a"), ("X-Api-Key", "b")], "", Some(Api::Anthropic), None),
            (&[("api-key", "a"), ("api-key", "b"), ("Authorization", "Bearer t")], "", Some(Api::Azure), None),
            // A conflict of one API is none of another's business.
            (&[("x-api-key", "a"), ("X-Api-Key", "b"), ("Authorization", "Bearer sk-a")], "", Some(Api::OpenAi), Some(b"sk-a")),
            // No API named: every place must agree.
            (&[("Authorization", "Bearer sk-a"), ("x-api-key", "sk-a")], "key=sk-a", None, Some(b"sk-a")),
            (&[("Authorization", "Bearer sk-a"), ("x-api-key", "sk-b")], "", None, None),
            (&[("api-key", "sk-a")], "key=sk-b", None, None),
        ];
        for &(headers, query, api, expected) in rows {
            let expected = match expected {
                Some(value) => Some(value.to_vec()),
                None => conflict.clone(),
            };
            assert_eq!(
                read(headers, query, api),
                expected,
                "{headers:?} {query} {api:?}"
            );
        }
    }

    #[test]
    fn no_credential() {
        #[rustfmt::skip]
        let rows: &[(&[(&str, &str)], &str)] = &[
            (&[], ""),
            (&[("Authorization", "Bearer")], ""),
            (&[("Authorization", "Bearer  \t ")], ""),
            (&[("Authorization", "Bearerx token")], ""),
            (&[("Authorization", "Basic dXNlcjpwYXNz")], ""),
            (&[("x-api-key", "  "), ("api-key", ""), ("x-goog-api-key", "\t")], "monkey=1&key=&keys=2"),
            (&[("x-api-keys", "a"), ("xapi-key", "b"), ("authorisation", "Bearer c")], "akey=1&key"),
        ];
        for &(headers, query) in rows {
            for api in [
                None,
                Some(Api::OpenAi),
                Some(Api::Anthropic),
                Some(Api::Gemini),
                Some(Api::Azure),
            ] {
                assert_eq!(
                    read(headers, query, api),
                    None,
                    "{headers:?} {query} {api:?}"
                );
            }
        }
    }

    #[test]
    fn fingerprints() {
        let long = shown(b"sk-proj-0123456789abcdefghijXYZ");
        assert_eq!(&long[..10], "sk-...XYZ~");
        assert_eq!(long.len(), FINGERPRINT_MAX);
        assert!(long[10..].bytes().all(|b| b.is_ascii_hexdigit()));
        // Stable: the state file and a fleet's other nodes see the same fingerprint.
        assert_eq!(long, shown(b"sk-proj-0123456789abcdefghijXYZ"));
        assert_ne!(long, shown(b"sk-proj-0123456789abcdefghiJXYZ"));
        // Short, or not all visible ASCII: the hash only.
        for credential in [&b"sk-123"[..], b"sk-proj-0123456789 abcdefghijXYZ"] {
            let fingerprint = shown(credential);
            assert!(fingerprint.starts_with("...~"), "{fingerprint}");
            assert_eq!(fingerprint.len(), 4 + HASH_HEX_LEN);
        }
    }
}
