//! `$rate_limit_api_key`: the caller's credential, found where the LLM APIs take it and
//! spelled one way, then replaced by a fingerprint that names it without revealing it.
//!
//! Where the credential is looked for, first found first:
//! 1. `Authorization: Bearer TOKEN` (the scheme in any case, blanks and tabs around the token
//!    or the whole value: RFC 7235);
//! 2. `x-api-key: TOKEN` (Anthropic), then `x-goog-api-key: TOKEN` (Gemini), blanks around
//!    the value dropped;
//! 3. the query argument `key=TOKEN` (Gemini), percent-decoded.
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

/// The request's headers and query string where a credential may be.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sources<'a> {
    /// `Authorization`
    pub authorization: Option<&'a [u8]>,
    /// `x-api-key`
    pub x_api_key: Option<&'a [u8]>,
    /// `x-goog-api-key`
    pub x_goog_api_key: Option<&'a [u8]>,
    /// The request's query string (without `?`).
    pub args: &'a [u8],
}

/// The credential, spelled one way; `None` when the request carries none.
///
/// ```
/// use ratelimit_core::api_key::{credential, Sources};
///
/// let sources = Sources { authorization: Some(b"bearer \t sk-1 "), ..Sources::default() };
/// assert_eq!(credential(&sources).as_deref(), Some(&b"sk-1"[..]));
/// let sources = Sources { args: b"alt=sse&key=AI%7Aa", ..Sources::default() };
/// assert_eq!(credential(&sources).as_deref(), Some(&b"AIza"[..]));
/// ```
pub fn credential<'a>(sources: &Sources<'a>) -> Option<Cow<'a, [u8]>> {
    if let Some(token) = sources.authorization.and_then(bearer_token) {
        return Some(Cow::Borrowed(token));
    }
    for value in [sources.x_api_key, sources.x_goog_api_key]
        .into_iter()
        .flatten()
    {
        let value = trim_blanks(value);
        if !value.is_empty() {
            return Some(Cow::Borrowed(value));
        }
    }
    let value = crate::key::query_arg(sources.args, b"key")?;
    let decoded = percent_decoded(value);
    (!decoded.is_empty()).then_some(decoded)
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

    #[test]
    fn spellings_of_one_credential() {
        let secret = b"sk-test-0123456789abcdefghijKLM";
        let authorization = |value: &'static [u8]| Sources {
            authorization: Some(value),
            ..Sources::default()
        };
        let rows: &[Sources] = &[
            authorization(b"Bearer sk-test-0123456789abcdefghijKLM"),
            authorization(b"bearer sk-test-0123456789abcdefghijKLM"),
            authorization(b"BEARER   sk-test-0123456789abcdefghijKLM"),
            authorization(b"Bearer\tsk-test-0123456789abcdefghijKLM"),
            authorization(b" \tbEaReR sk-test-0123456789abcdefghijKLM \t"),
            Sources {
                x_api_key: Some(b" sk-test-0123456789abcdefghijKLM"),
                ..Sources::default()
            },
            Sources {
                x_goog_api_key: Some(b"sk-test-0123456789abcdefghijKLM"),
                ..Sources::default()
            },
            Sources {
                args: b"alt=sse&key=sk-test-0123456789abcdefghijKLM",
                ..Sources::default()
            },
            Sources {
                args: b"KEY=sk%2Dtest-0123456789abcdefghijKLM&x=1",
                ..Sources::default()
            },
            // Another scheme in Authorization: the next place is read.
            Sources {
                authorization: Some(b"Basic dXNlcjpwYXNz"),
                x_api_key: Some(b"sk-test-0123456789abcdefghijKLM"),
                ..Sources::default()
            },
        ];
        for sources in rows {
            assert_eq!(
                credential(sources).as_deref(),
                Some(&secret[..]),
                "{sources:?}"
            );
        }
    }

    #[test]
    fn no_credential() {
        let rows: &[Sources] = &[
            Sources::default(),
            Sources {
                authorization: Some(b"Bearer"),
                ..Sources::default()
            },
            Sources {
                authorization: Some(b"Bearer  \t "),
                ..Sources::default()
            },
            Sources {
                authorization: Some(b"Bearerx token"),
                ..Sources::default()
            },
            Sources {
                x_api_key: Some(b"  "),
                args: b"monkey=1&key=",
                ..Sources::default()
            },
        ];
        for sources in rows {
            assert_eq!(credential(sources), None, "{sources:?}");
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
