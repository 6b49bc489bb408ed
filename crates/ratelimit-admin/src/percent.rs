//! Percent-encoding of the admin API's path segments and query values, and of the keys the
//! state file writes.

use crate::error::ApiError;

/// Decode `%XX` sequences (either case). `+` stays `+`: this is a path, not a form.
///
/// ```
/// use ratelimit_admin::percent::percent_decode;
///
/// assert_eq!(percent_decode(b"a%2Fb%20c%ff").unwrap(), b"a/b c\xff");
/// assert!(percent_decode(b"50%").is_err());
/// ```
pub fn percent_decode(raw: &[u8]) -> Result<Vec<u8>, ApiError> {
    let mut decoded = Vec::with_capacity(raw.len());
    let mut at = 0;
    while let Some(&byte) = raw.get(at) {
        if byte != b'%' {
            decoded.push(byte);
            at += 1;
            continue;
        }
        let value = match (raw.get(at + 1), raw.get(at + 2)) {
            (Some(&high), Some(&low)) => hex(high).zip(hex(low)).map(|(h, l)| h << 4 | l),
            _ => None,
        };
        let Some(value) = value else {
            let end = raw.len().min(at + 3);
            return Err(ApiError::BadPercentEncoding(
                String::from_utf8_lossy(&raw[at..end]).into_owned(),
            ));
        };
        decoded.push(value);
        at += 3;
    }
    Ok(decoded)
}

pub(crate) fn hex(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

/// Encode every byte but the unreserved ones of RFC 3986 (`A-Z a-z 0-9 - . _ ~`) and a few
/// that are safe in a path segment and common in keys (`: @`), so that the result can be pasted
/// into an admin URL as one segment, and decodes back to the same bytes.
///
/// ```
/// use ratelimit_admin::percent::percent_encode;
///
/// assert_eq!(percent_encode(b"10.0.0.1"), "10.0.0.1");
/// assert_eq!(percent_encode(b"user/7 a\xff%"), "user%2F7%20a%FF%25");
/// ```
pub fn percent_encode(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut encoded = String::with_capacity(bytes.len());
    for &byte in bytes {
        if byte.is_ascii_alphanumeric() || b"-._~:@".contains(&byte) {
            encoded.push(char::from(byte));
        } else {
            encoded.push('%');
            encoded.push(char::from(HEX[usize::from(byte >> 4)]));
            encoded.push(char::from(HEX[usize::from(byte & 0xf)]));
        }
    }
    encoded
}
