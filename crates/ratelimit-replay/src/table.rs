//! The key column of the tables. The request table is written as the input is read, before
//! the longest key is known: a key wider than its column is shortened there, keeping its start
//! and its end (API keys and user agents differ at either), and shown whole in the summary
//! (whose column fits the longest key) and in `--json`.

use std::borrow::Cow;

/// The key column's width in the request table, and the least in a summary.
pub const KEY_WIDTH: usize = 16;

/// `key` as the request table shows it: whole when it fits in [`KEY_WIDTH`] characters, else
/// its first 7 and last 8 characters around `…`.
pub fn key_cell(key: &str) -> Cow<'_, str> {
    let length = key.chars().count();
    if length <= KEY_WIDTH {
        return Cow::Borrowed(key);
    }
    let tail = KEY_WIDTH / 2;
    let head = KEY_WIDTH - tail - 1;
    let start: String = key.chars().take(head).collect();
    let end: String = key.chars().skip(length - tail).collect();
    Cow::Owned(format!("{start}…{end}"))
}

/// The width of a summary's key column: its longest key, at least [`KEY_WIDTH`].
pub fn key_column_width<'a>(keys: impl IntoIterator<Item = &'a str>) -> usize {
    keys.into_iter()
        .map(|key| key.chars().count())
        .fold(KEY_WIDTH, usize::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_keys_keep_their_start_and_end() {
        #[rustfmt::skip]
        let rows = [
            ("alice", "alice"),
            ("", ""),
            ("0123456789abcdef", "0123456789abcdef"),
            ("0123456789abcdefg", "0123456…9abcdefg"),
            ("sk-proj-0000000000000000000000001", "sk-proj…00000001"),
            ("2001:db8:85a3::8a2e:370:7334", "2001:db…370:7334"),
            ("ключ-очень-длинный-ключ", "ключ-оч…ный-ключ"),
        ];
        for (key, shown) in rows {
            assert_eq!(key_cell(key), shown, "{key}");
            assert!(key_cell(key).chars().count() <= KEY_WIDTH, "{key}");
        }
    }

    #[test]
    fn summary_columns_fit_the_longest_key() {
        assert_eq!(key_column_width([]), KEY_WIDTH);
        assert_eq!(key_column_width(["a", "b"]), KEY_WIDTH);
        let long = "x".repeat(40);
        assert_eq!(key_column_width(["a", long.as_str(), "b"]), 40);
    }
}
