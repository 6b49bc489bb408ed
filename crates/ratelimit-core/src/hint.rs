//! What a configuration error says after the word it quotes: the valid word nearest to a
//! typo (`invalid parameter "brust=5", did you mean "burst="?`), else every valid word.

/// The word of `valid` nearest to `word`, when it is close enough to be the one meant.
///
/// A `name=value` word is compared by its `name=`; a valid word ends with `=` when it takes
/// any value (`burst=`), is bare when it takes none (`nodelay`), and is whole when only that
/// value is valid (`write=on`, compared with the whole word). Close enough: at most two edits
/// (insertion, deletion, substitution, or two neighbours swapped), and fewer than a third of
/// the valid word's letters.
///
/// ```
/// use ratelimit_core::hint::nearest;
///
/// let valid = ["zone=", "burst=", "nodelay", "delay="];
/// assert_eq!(nearest("brust=5", &valid), Some("burst="));
/// assert_eq!(nearest("burst", &valid), Some("burst="));
/// assert_eq!(nearest("nodealy", &valid), Some("nodelay"));
/// assert_eq!(nearest("rate=1r/s", &valid), None);
/// ```
pub fn nearest<'a>(word: &str, valid: &[&'a str]) -> Option<&'a str> {
    let name = match word.find('=') {
        Some(at) => &word[..at],
        None => word,
    };
    valid
        .iter()
        .map(|&candidate| {
            let bare = candidate.trim_end_matches('=');
            // A whole word with its value (`write=on`) is compared with the whole word.
            let typed = if bare.contains('=') { word } else { name };
            (strsim::osa_distance(typed, bare), candidate)
        })
        .filter(|&(distance, candidate)| distance <= 2 && distance * 3 < candidate.len())
        .min_by_key(|&(distance, _)| distance)
        .map(|(_, candidate)| candidate)
}

/// `a, b or c`.
pub fn one_of(valid: &[&str]) -> String {
    match valid {
        [] => String::new(),
        [only] => only.to_string(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
    }
}

/// What follows `invalid parameter "WORD"`: `, did you mean "burst="?` for a typo of a valid
/// word, else `: it must be zone=, burst=... or cost=`.
///
/// ```
/// use ratelimit_core::hint::parameter_hint;
///
/// let valid = ["zone=", "burst=", "nodelay"];
/// assert_eq!(parameter_hint("brust=5", &valid), ", did you mean \"burst=\"?");
/// assert_eq!(parameter_hint("fast", &valid), ": it must be zone=, burst= or nodelay");
/// ```
pub fn parameter_hint(word: &str, valid: &[&str]) -> String {
    match nearest(word, valid) {
        Some(meant) => format!(", did you mean \"{meant}\"?"),
        None => format!(": it must be {}", one_of(valid)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_and_strangers() {
        let zone = ["zone=", "rate=", "burst=", "algorithm=", "sync"];
        #[rustfmt::skip]
        let rows: &[(&str, Option<&str>)] = &[
            ("brust=5", Some("burst=")),
            ("bursts=5", Some("burst=")),
            ("algoritm=token_bucket", Some("algorithm=")),
            ("rates=1r/s", Some("rate=")),
            ("synk", Some("sync")),
            ("sync=on", Some("sync")),
            ("Rate=1r/s", Some("rate=")),
            // Too far from anything: the list is the better hint.
            ("foo", None),
            ("nodelay", None),
            ("key=x", None),
            ("", None),
        ];
        for &(word, meant) in rows {
            assert_eq!(nearest(word, &zone), meant, "{word:?}");
        }
    }

    #[test]
    fn whole_words_with_their_value() {
        let admin = ["write=on", "write=off"];
        assert_eq!(nearest("wirte=on", &admin), Some("write=on"));
        assert_eq!(nearest("wrte=off", &admin), Some("write=off"));
        assert_eq!(nearest("write=yes", &admin), None);
    }

    #[test]
    fn lists_read_as_prose() {
        assert_eq!(one_of(&[]), "");
        assert_eq!(one_of(&["a"]), "a");
        assert_eq!(one_of(&["a", "b"]), "a or b");
        assert_eq!(one_of(&["a", "b", "c"]), "a, b or c");
    }
}
