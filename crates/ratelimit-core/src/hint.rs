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

/// The zone of `zones` a mistyped zone name means: the nearest name (`perclient` for
/// `per_client`), or the name before a size copied from `zone=NAME:SIZE` (`per_client:1m`).
///
/// ```
/// use ratelimit_core::hint::nearest_zone;
///
/// let zones = ["per_client", "login"];
/// assert_eq!(nearest_zone("perclient", &zones), Some("per_client"));
/// assert_eq!(nearest_zone("per_client:10m", &zones), Some("per_client"));
/// assert_eq!(nearest_zone("api", &zones), None);
/// ```
pub fn nearest_zone<'a>(name: &str, zones: &[&'a str]) -> Option<&'a str> {
    // Zone names are compared whole: an `=` in one is no parameter's.
    let near = |name: &str| {
        zones
            .iter()
            .map(|&zone| (strsim::osa_distance(name, zone), zone))
            .filter(|&(distance, zone)| distance <= 2 && distance * 3 < zone.chars().count())
            .min_by_key(|&(distance, _)| distance)
            .map(|(_, zone)| zone)
    };
    match name.rsplit_once(':') {
        Some((bare, _)) if !bare.is_empty() => near(bare),
        _ => near(name),
    }
}

/// The zones that exist, for an unknown zone's message: `the zones are "a" and "b"`, the
/// first 20 when there are more.
///
/// ```
/// use ratelimit_core::hint::zone_list;
///
/// assert_eq!(zone_list(&["a", "b"]), "the zones are \"a\" and \"b\"");
/// assert_eq!(zone_list(&["a"]), "the only zone is \"a\"");
/// assert_eq!(zone_list(&[]), "no zone is declared");
/// ```
pub fn zone_list(zones: &[&str]) -> String {
    const SHOWN: usize = 20;
    let quoted: Vec<String> = zones
        .iter()
        .take(SHOWN)
        .map(|zone| format!("\"{zone}\""))
        .collect();
    match quoted.as_slice() {
        [] => "no zone is declared".to_string(),
        [only] => format!("the only zone is {only}"),
        _ if zones.len() > SHOWN => format!(
            "the zones are {} and {} more",
            quoted.join(", "),
            zones.len() - SHOWN
        ),
        [rest @ .., last] => format!("the zones are {} and {last}", rest.join(", ")),
    }
}

/// What follows `unknown zone "NAME"`: `, did you mean "per_client"?` for a typo of one of
/// `zones` (or `NAME:SIZE` copied from `rate_limit_zone`), else `: the zones are ...`.
///
/// ```
/// use ratelimit_core::hint::unknown_zone_hint;
///
/// let zones = ["per_client", "login"];
/// assert_eq!(unknown_zone_hint("perclient", &zones), ", did you mean \"per_client\"?");
/// assert_eq!(
///     unknown_zone_hint("api", &zones),
///     ": the zones are \"per_client\" and \"login\""
/// );
/// ```
pub fn unknown_zone_hint(name: &str, zones: &[&str]) -> String {
    match nearest_zone(name, zones) {
        Some(meant) => format!(", did you mean \"{meant}\"?"),
        None => format!(": {}", zone_list(zones)),
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

    #[test]
    fn zone_names() {
        let zones = ["per_client", "login", "api", "tokens_per_key"];
        #[rustfmt::skip]
        let rows: &[(&str, Option<&str>)] = &[
            ("perclient", Some("per_client")),
            ("per_clinet", Some("per_client")),
            ("per-client", Some("per_client")),
            ("Login", Some("login")),
            ("per_client:1m", Some("per_client")),
            ("per_client:10m", Some("per_client")),
            ("perclient:1m", Some("per_client")),
            ("tokens_per_ky", Some("tokens_per_key")),
            // Short names need near-exact matches: "apu" is not meant for "api".
            ("apu", None),
            ("ap", None),
            ("other", None),
            (":1m", None),
            ("", None),
        ];
        for &(name, meant) in rows {
            assert_eq!(nearest_zone(name, &zones), meant, "{name:?}");
        }
    }

    #[test]
    fn zone_lists_read_as_prose() {
        assert_eq!(
            zone_list(&["a", "b", "c"]),
            "the zones are \"a\", \"b\" and \"c\""
        );
        let many: Vec<String> = (0..25).map(|n| format!("z{n}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let list = zone_list(&many);
        assert!(list.starts_with("the zones are \"z0\", \"z1\""), "{list}");
        assert!(list.ends_with("\"z19\" and 5 more"), "{list}");
        assert_eq!(unknown_zone_hint("x", &[]), ": no zone is declared");
    }
}
