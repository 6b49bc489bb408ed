//! How nginx's `$arg_NAME` reads a query argument, for keys read without nginx's variable
//! machinery (the module reads `$arg_NAME` keys this way; see its `key` module).
//!
//! The rules of `$arg_NAME`: the value of the first argument whose name equals NAME ignoring
//! ASCII case, an argument being a `&`-separated part of the query string that has `=` right
//! after its name; the value is the bytes after that `=` up to the next `&` or the end, not
//! URL-decoded. With no such argument the variable is not found (`None`).

/// The value of the query argument `name` (lowercase ASCII, not empty) in `args`.
///
/// One pass: at the start of each argument, compare the name and `=`; then find the `&` that
/// ends the value (on a match) or the argument (otherwise). Only the argument's bytes are
/// folded to lowercase: `name` already is.
#[inline]
pub fn query_arg<'a>(args: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    if name.is_empty() {
        return None;
    }
    let mut rest = args;
    loop {
        if let Some((head, [b'=', value @ ..])) = rest.split_at_checked(name.len()) {
            if head
                .iter()
                .zip(name)
                .all(|(&byte, &lower)| byte.to_ascii_lowercase() == lower)
            {
                return Some(&value[..find_ampersand(value).unwrap_or(value.len())]);
            }
        }
        rest = &rest[find_ampersand(rest)? + 1..];
    }
}

/// The index of the first `&` in `bytes`, eight bytes at a time: a query value is typically
/// an 8 to 64 byte token, and a byte loop would cost more than the rest of the lookup.
#[inline]
fn find_ampersand(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let mut chunks = bytes.chunks_exact(8);
    let mut offset = 0;
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        // Bytes equal to `&` become zero; the lowest zero byte sets its high bit here (bits
        // above it may be wrong, which the lowest set bit does not care about).
        let x = u64::from_le_bytes(word) ^ (ONES * u64::from(b'&'));
        let zero_bytes = x.wrapping_sub(ONES) & !x & HIGHS;
        if zero_bytes != 0 {
            return Some(offset + (zero_bytes.trailing_zeros() / 8) as usize);
        }
        offset += 8;
    }
    let tail = chunks.remainder();
    tail.iter()
        .position(|&byte| byte == b'&')
        .map(|index| offset + index)
}

#[cfg(test)]
mod tests {
    use super::query_arg;
    use proptest::prelude::*;

    /// The rules read literally: split at `&`, take the first argument that is the name,
    /// ignoring ASCII case, followed by `=`.
    fn by_the_rules<'a>(args: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
        if name.is_empty() {
            return None;
        }
        args.split(|&byte| byte == b'&').find_map(|argument| {
            let (candidate, rest) = argument.split_at_checked(name.len())?;
            let value = rest.strip_prefix(b"=")?;
            candidate.eq_ignore_ascii_case(name).then_some(value)
        })
    }

    proptest! {
        #[test]
        fn matches_the_rules(
            args in proptest::collection::vec(
                prop::sample::select(b"kKab=&%\x00\xc9".to_vec()), 0..48),
            name in prop::sample::select(vec![&b"k"[..], b"ka", b"kk", b"a", b""]),
        ) {
            prop_assert_eq!(query_arg(&args, name), by_the_rules(&args, name));
        }
    }

    #[test]
    fn the_first_argument_with_the_name() {
        let cases: &[(&str, Option<&str>)] = &[
            ("k=1", Some("1")),
            ("K=1", Some("1")),
            ("a=0&k=2&k=3", Some("2")),
            ("kk=0&k=4", Some("4")),
            ("xk=0&k=5", Some("5")),
            ("k=6&", Some("6")),
            ("&k=7", Some("7")),
            ("k=", Some("")),
            ("k==8", Some("=8")),
            ("k=a%20b", Some("a%20b")),
            ("k=9;k=0", Some("9;k=0")),
            ("k", None),
            ("k&k=10", Some("10")),
            ("", None),
            ("=k=1", None),
            ("kx=1", None),
            ("x=k=1", None),
        ];
        for &(args, expected) in cases {
            let found = query_arg(args.as_bytes(), b"k").map(|v| std::str::from_utf8(v).unwrap());
            assert_eq!(found, expected, "args {args:?}");
        }
    }

    #[test]
    fn ampersands_are_found_at_every_position() {
        for length in 0..40 {
            let plain = vec![b'x'; length];
            assert_eq!(super::find_ampersand(&plain), None, "length {length}");
            for at in 0..length {
                let mut bytes = vec![b'%'; length];
                bytes[at] = b'&';
                if at + 1 < length {
                    bytes[length - 1] = b'&';
                }
                assert_eq!(super::find_ampersand(&bytes), Some(at), "{length} {at}");
                // Bytes just around `&` in value (0x25, 0x27) and high bytes are no match.
                bytes[at] = [0x25, 0x27, 0xa6, 0x00][at % 4];
                let expected = bytes.iter().position(|&byte| byte == b'&');
                assert_eq!(super::find_ampersand(&bytes), expected, "{length} {at}");
            }
        }
    }

    #[test]
    fn longer_names_ignore_ascii_case_only() {
        assert_eq!(query_arg(b"Api_Key=abc", b"api_key"), Some(&b"abc"[..]));
        assert_eq!(query_arg(b"api=1&api_key=2", b"api_key"), Some(&b"2"[..]));
        assert_eq!(query_arg(b"api_ke=1", b"api_key"), None);
        assert_eq!(query_arg("\u{c9}=1".as_bytes(), "\u{e9}".as_bytes()), None);
        assert_eq!(query_arg(b"k=1", b""), None);
    }
}
