//! How a zone's keys are written for people: as the bytes they are, or, for a zone keyed by
//! `$binary_remote_addr`, as the client address those bytes are.
//!
//! `$binary_remote_addr` is 4 bytes for an IPv4 client and 16 for IPv6 (nginx's
//! `ngx_http_variable_binary_remote_addr`); for a client on a UNIX socket it is the text
//! `unix:`. Such keys are shown as `127.0.0.1`, `::1` (or `unix:`) and accepted in that form
//! wherever a key is given (the admin API's paths, Lua); the raw bytes are still accepted.
//!
//! `$rate_limit_remote_net` is the client's network: its address with the bits past the
//! prefix length of `rate_limit_remote_net ipv4=N ipv6=M` cleared, followed by that length
//! (5 bytes for IPv4, 17 for IPv6; [`network_key`]). Such keys are shown and taken as
//! `198.51.100.0/24` and `2001:db8::/64`.

use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::spec::SpecError;

/// What a zone's key bytes are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KeyForm {
    /// Any bytes: shown as text (invalid UTF-8 replaced), taken as given.
    #[default]
    Text,
    /// A client address in network byte order (`$binary_remote_addr`).
    BinaryAddress,
    /// A client network: the masked address and its prefix length (`$rate_limit_remote_net`).
    Network,
}

/// The one KEY of `rate_limit_zone` whose value is a binary address.
const BINARY_ADDRESS_KEY: &str = "$binary_remote_addr";

/// The KEY of `rate_limit_zone` whose value is a client network.
const NETWORK_KEY: &str = "$rate_limit_remote_net";

/// The prefix lengths of `rate_limit_remote_net`: how much of a client's address names its
/// network.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetPrefixes {
    /// The bits of an IPv4 address that name its network (0 to 32).
    pub ipv4: u8,
    /// The bits of an IPv6 address that name its network (0 to 128).
    pub ipv6: u8,
}

impl Default for NetPrefixes {
    /// One IPv4 address; one IPv6 /64, the smallest network a subscriber is given.
    fn default() -> NetPrefixes {
        NetPrefixes { ipv4: 32, ipv6: 64 }
    }
}

impl NetPrefixes {
    /// The words of `rate_limit_remote_net` (`ipv4=24`, `ipv6=56`); a family not named keeps
    /// its default.
    ///
    /// ```
    /// use ratelimit_core::key_form::NetPrefixes;
    ///
    /// let prefixes = NetPrefixes::parse_words(&["ipv4=24"]).unwrap();
    /// assert_eq!((prefixes.ipv4, prefixes.ipv6), (24, 64));
    /// assert!(NetPrefixes::parse_words(&["ipv4=33"]).is_err());
    /// ```
    pub fn parse_words(words: &[&str]) -> Result<NetPrefixes, SpecError> {
        let mut prefixes = NetPrefixes::default();
        for &word in words {
            let (family, value, max) = if let Some(value) = word.strip_prefix("ipv4=") {
                ("ipv4", value, 32)
            } else if let Some(value) = word.strip_prefix("ipv6=") {
                ("ipv6", value, 128)
            } else {
                return Err(SpecError::invalid_parameter(word, &["ipv4=", "ipv6="]));
            };
            let length = crate::spec::parse_integer(value)
                .filter(|&length| length <= max)
                .ok_or_else(|| SpecError::InvalidPrefix {
                    word: word.into(),
                    family,
                    max,
                })?;
            match family {
                "ipv4" => prefixes.ipv4 = length as u8,
                _ => prefixes.ipv6 = length as u8,
            }
        }
        Ok(prefixes)
    }
}

/// The longest network key: an IPv6 address and its prefix length.
pub const NETWORK_KEY_MAX: usize = 17;

/// The network key of `address` into `out`; its length (5 or 17). An IPv4 address mapped into
/// IPv6 (`::ffff:198.51.100.7`, a client of a dual-stack socket) is taken as the IPv4 address
/// it is.
///
/// ```
/// use ratelimit_core::key_form::{network_key, KeyForm, NetPrefixes};
///
/// let mut key = [0; 17];
/// let prefixes = NetPrefixes { ipv4: 24, ipv6: 64 };
/// let len = network_key("198.51.100.7".parse().unwrap(), prefixes, &mut key);
/// assert_eq!(&key[..len], &[198, 51, 100, 0, 24]);
/// assert_eq!(KeyForm::Network.show(&key[..len]), "198.51.100.0/24");
/// let len = network_key("2001:db8:0:1:2:3:4:5".parse().unwrap(), prefixes, &mut key);
/// assert_eq!(KeyForm::Network.show(&key[..len]), "2001:db8:0:1::/64");
/// ```
pub fn network_key(address: IpAddr, prefixes: NetPrefixes, out: &mut [u8; 17]) -> usize {
    let address = match address {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    let length = match address {
        IpAddr::V4(_) => prefixes.ipv4,
        IpAddr::V6(_) => prefixes.ipv6,
    };
    write_network(address, length, out)
}

/// `address` masked to `length` bits, then `length`, into `out`; the key's length.
fn write_network(address: IpAddr, length: u8, out: &mut [u8; 17]) -> usize {
    match address {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4) & mask_u32(length);
            out[..4].copy_from_slice(&bits.to_be_bytes());
            out[4] = length;
            5
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & mask_u128(length);
            out[..16].copy_from_slice(&bits.to_be_bytes());
            out[16] = length;
            17
        }
    }
}

fn mask_u32(length: u8) -> u32 {
    u32::MAX
        .checked_shl(32 - u32::from(length.min(32)))
        .unwrap_or(0)
}

fn mask_u128(length: u8) -> u128 {
    u128::MAX
        .checked_shl(128 - u32::from(length.min(128)))
        .unwrap_or(0)
}

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
        } else if key == NETWORK_KEY {
            KeyForm::Network
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
        if self == KeyForm::Network {
            if let Some((address, length)) = network_of_key(key) {
                return format!("{address}/{length}");
            }
        }
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
        if self == KeyForm::Network {
            if let Some(key) = parse_network(given) {
                return Cow::Owned(key);
            }
        }
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

/// The network a 5 or 17 byte network key names, with its prefix length.
fn network_of_key(key: &[u8]) -> Option<(IpAddr, u8)> {
    match key {
        [a, b, c, d, length @ 0..=32] => Some((Ipv4Addr::new(*a, *b, *c, *d).into(), *length)),
        [octets @ .., length] if octets.len() == 16 && *length <= 128 => {
            let octets: [u8; 16] = octets.try_into().ok()?;
            Some((Ipv6Addr::from(octets).into(), *length))
        }
        _ => None,
    }
}

/// `198.51.100.0/24` or `2001:db8::/64` as the network key it shows (host bits given are
/// cleared); `None` for anything else.
fn parse_network(given: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(given).ok()?;
    let (address, length) = text.split_once('/')?;
    let address: IpAddr = address.parse().ok()?;
    let length: u8 = crate::spec::parse_integer(length)?.try_into().ok()?;
    let max = if address.is_ipv4() { 32 } else { 128 };
    if length > max {
        return None;
    }
    // An IPv6 text is kept IPv6 here, mapped or not: it names the key of its own family.
    let mut key = [0; NETWORK_KEY_MAX];
    let len = write_network(address, length, &mut key);
    Some(key[..len].to_vec())
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
    fn networks_show_and_parse_back() {
        let form = KeyForm::Network;
        let prefixes = NetPrefixes { ipv4: 24, ipv6: 64 };
        let rows = [
            ("198.51.100.7", "198.51.100.0/24"),
            ("198.51.100.200", "198.51.100.0/24"),
            ("::ffff:198.51.101.9", "198.51.101.0/24"),
            ("2001:db8:0:1:ffff::1", "2001:db8:0:1::/64"),
            ("2001:db8::1", "2001:db8::/64"),
        ];
        for (address, shown) in rows {
            let mut key = [0; NETWORK_KEY_MAX];
            let len = network_key(address.parse().unwrap(), prefixes, &mut key);
            assert_eq!(form.show(&key[..len]), shown, "{address}");
            assert_eq!(&*form.parse(shown.as_bytes()), &key[..len], "{shown}");
        }
        // Host bits given are cleared; a length beyond the family's is not a network.
        assert_eq!(&*form.parse(b"198.51.100.7/24"), &[198, 51, 100, 0, 24]);
        assert_eq!(&*form.parse(b"198.51.100.0/33"), b"198.51.100.0/33");
        let whole = NetPrefixes { ipv4: 0, ipv6: 128 };
        let mut key = [0; NETWORK_KEY_MAX];
        let len = network_key("203.0.113.5".parse().unwrap(), whole, &mut key);
        assert_eq!(form.show(&key[..len]), "0.0.0.0/0");
        let len = network_key("2001:db8::5".parse().unwrap(), whole, &mut key);
        assert_eq!(form.show(&key[..len]), "2001:db8::5/128");
    }

    #[test]
    fn prefix_lengths_are_checked() {
        let error = |words: &[&str]| NetPrefixes::parse_words(words).unwrap_err().to_string();
        assert_eq!(
            error(&["ipv4=33"]),
            "invalid ipv4 value \"ipv4=33\": it must be a prefix length from 0 to 32"
        );
        assert_eq!(
            error(&["ipv6=129"]),
            "invalid ipv6 value \"ipv6=129\": it must be a prefix length from 0 to 128"
        );
        assert_eq!(
            error(&["ipv5=1"]),
            "invalid parameter \"ipv5=1\", did you mean \"ipv4=\"?"
        );
        let both = NetPrefixes::parse_words(&["ipv6=48", "ipv4=16"]).unwrap();
        assert_eq!(both, NetPrefixes { ipv4: 16, ipv6: 48 });
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
