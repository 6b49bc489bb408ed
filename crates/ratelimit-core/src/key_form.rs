//! How a zone's keys are written for people: as the bytes they are, or, for a zone keyed by
//! `$binary_remote_addr`, as the client address those bytes are.
//!
//! `$binary_remote_addr` is 4 bytes for an IPv4 client and 16 for IPv6 (nginx's
//! `ngx_http_variable_binary_remote_addr`); for a client on a UNIX socket it is the text
//! `unix:`. Such keys are shown as `127.0.0.1`, `::1` (or `unix:`) and accepted in that form
//! wherever a key is given (the admin API's paths, Lua); the raw bytes are still accepted.

use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// What a zone's key bytes are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KeyForm {
    /// Any bytes: shown as text (invalid UTF-8 replaced), taken as given.
    #[default]
    Text,
    /// A client address in network byte order (`$binary_remote_addr`).
    BinaryAddress,
}

/// The one KEY of `rate_limit_zone` whose value is a binary address.
const BINARY_ADDRESS_KEY: &str = "$binary_remote_addr";

impl KeyForm {
    /// The form of the keys of a zone whose KEY is `key_text`, as written in the
    /// configuration: only exactly `$binary_remote_addr` is binary (a key that joins it with
    /// anything else is bytes of no fixed length).
    ///
    /// ```
    /// use ratelimit_core::key_form::KeyForm;
    ///
    /// assert_eq!(KeyForm::of_key("$binary_remote_addr"), KeyForm::BinaryAddress);
    /// assert_eq!(KeyForm::of_key("${binary_remote_addr}"), KeyForm::BinaryAddress);
    /// assert_eq!(KeyForm::of_key("$binary_remote_addr$uri"), KeyForm::Text);
    /// assert_eq!(KeyForm::of_key("$remote_addr"), KeyForm::Text);
    /// ```
    pub fn of_key(key_text: &str) -> KeyForm {
        let name = key_text
            .strip_prefix("${")
            .and_then(|rest| rest.strip_suffix('}'))
            .map(|name| format!("${name}"));
        let key = name.as_deref().unwrap_or(key_text);
        if key == BINARY_ADDRESS_KEY {
            KeyForm::BinaryAddress
        } else {
            KeyForm::Text
        }
    }

    /// `key` as people read it: an address for a 4 or 16 byte key of a binary address zone,
    /// the bytes as text otherwise.
    ///
    /// ```
    /// use ratelimit_core::key_form::KeyForm;
    ///
    /// let form = KeyForm::BinaryAddress;
    /// assert_eq!(form.show(&[127, 0, 0, 1]), "127.0.0.1");
    /// let mut v6 = [0u8; 16];
    /// v6[15] = 1;
    /// assert_eq!(form.show(&v6), "::1");
    /// assert_eq!(form.show(b"unix:"), "unix:");
    /// assert_eq!(KeyForm::Text.show(&[127, 0, 0, 1]), "\u{7f}\0\0\u{1}");
    /// ```
    pub fn show(self, key: &[u8]) -> String {
        if self == KeyForm::BinaryAddress {
            if let Ok(octets) = <[u8; 4]>::try_from(key) {
                return Ipv4Addr::from(octets).to_string();
            }
            if let Ok(octets) = <[u8; 16]>::try_from(key) {
                let text = Ipv6Addr::from(octets).to_string();
                // `::ab` would be read back as four raw bytes (an IPv4 client): `0::ab` is
                // the same address.
                return if text.len() == 4 {
                    format!("0{text}")
                } else {
                    text
                };
            }
        }
        String::from_utf8_lossy(key).into_owned()
    }

    /// The key bytes meant by `given`: for a binary address zone, an address written as
    /// text (`127.0.0.1`, `::1`, `2001:db8::7`) is its 4 or 16 bytes; anything else (the raw
    /// bytes themselves, `unix:`) is taken as it is. Four bytes are always a raw IPv4 key
    /// (`1::2` is also the bytes of client 49.58.58.50; no IPv4 text is that short). Sixteen
    /// bytes that read as an IPv6 address in text are that address: the raw key of a client
    /// whose 16 bytes happen to spell one (only in ranges made of ASCII digits, letters a-f,
    /// `:` and `.`) is reached by its shown form, which is another text.
    ///
    /// ```
    /// use ratelimit_core::key_form::KeyForm;
    ///
    /// let form = KeyForm::BinaryAddress;
    /// assert_eq!(&*form.parse(b"127.0.0.1"), &[127, 0, 0, 1]);
    /// assert_eq!(form.parse(b"::1").len(), 16);
    /// assert_eq!(&*form.parse(&[127, 0, 0, 1]), &[127, 0, 0, 1]);
    /// assert_eq!(&*form.parse(b"unix:"), b"unix:");
    /// assert_eq!(&*KeyForm::Text.parse(b"127.0.0.1"), b"127.0.0.1");
    /// ```
    pub fn parse(self, given: &[u8]) -> Cow<'_, [u8]> {
        if self == KeyForm::BinaryAddress {
            if let Some(address) = parse_address(given) {
                return Cow::Owned(match address {
                    IpAddr::V4(v4) => v4.octets().to_vec(),
                    IpAddr::V6(v6) => v6.octets().to_vec(),
                });
            }
        }
        Cow::Borrowed(given)
    }
}

/// `given` as an address in text: the shortest is `::` (2 bytes), the longest an IPv6 address
/// with an IPv4 tail (45 bytes); 4 bytes are a binary IPv4 key.
fn parse_address(given: &[u8]) -> Option<IpAddr> {
    if !(2..=45).contains(&given.len()) || given.len() == 4 {
        return None;
    }
    let text = std::str::from_utf8(given).ok()?;
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_addresses_parse_back_to_their_bytes() {
        let form = KeyForm::BinaryAddress;
        let keys: [&[u8]; 5] = [
            &[127, 0, 0, 1],
            &[203, 0, 113, 9],
            &[0; 16],
            &[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7],
            &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 1],
        ];
        for key in keys {
            let shown = form.show(key);
            assert_eq!(&*form.parse(shown.as_bytes()), key, "{shown}");
        }
        assert_eq!(form.show(keys[4]), "::ffff:192.0.2.1");
        // Four raw bytes are an IPv4 client even when they spell an IPv6 text.
        assert_eq!(&*form.parse(b"1::2"), b"1::2");
        let mut short = [0u8; 16];
        short[15] = 0xab;
        assert_eq!(form.show(&short), "0::ab");
        assert_eq!(&*form.parse(b"0::ab"), &short);
    }

    #[test]
    fn other_lengths_and_text_stay_as_they_are() {
        let form = KeyForm::BinaryAddress;
        assert_eq!(form.show(b"abc"), "abc");
        assert_eq!(&*form.parse(b"not an address"), b"not an address");
        assert_eq!(&*form.parse(b"127.0.0.1 "), b"127.0.0.1 ");
        assert_eq!(&*form.parse(b""), b"");
    }
}
