//! Per-key overrides shared by a fleet (`rate_limit_sync`): which of an instance's overrides
//! to push to the shared store, and which of the store's to apply locally.
//!
//! Each instance's sync loop keeps the map it last agreed on with the fleet. An override that
//! differs locally from that map was changed by this instance's admin API: it is pushed. When
//! the fleet's map (as the store returns it) differs from the local one, the difference is
//! applied locally, each change guarded by the value it replaces (`from`), so that an admin
//! change made meanwhile is not overwritten (it is pushed at the next round instead).
//!
//! Values are packed [`crate::Limits`]; `0` stands for "no override" (never a packed value).

use std::collections::BTreeMap;

/// Keys longer than this stay local: the shared inbox that hands the fleet's changes to the
/// workers has room for this many bytes per key.
pub const KEY_MAX: usize = 256;

/// Key bytes → packed limits (never 0).
pub type OverrideMap = BTreeMap<Vec<u8>, u64>;

/// One override to change locally: from the packed limits `from` to `to` (0: none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// The key's bytes.
    pub key: Vec<u8>,
    /// The packed limits the key has locally now (0: none); the change is skipped when the
    /// key has another value by the time it is applied.
    pub from: u64,
    /// The fleet's packed limits (0: the override is removed).
    pub to: u64,
}

/// What this instance changed since the last agreement: (key, new packed limits or 0 when
/// removed). A key in `stuck` with the agreed value is one the fleet set and this instance
/// could not apply (its table was full): its absence here is no change to push (an override
/// of the key set here is).
pub fn local_changes(
    agreed: &OverrideMap,
    local: &OverrideMap,
    stuck: &OverrideMap,
) -> Vec<(Vec<u8>, u64)> {
    let value = |map: &OverrideMap, key: &[u8]| map.get(key).copied().unwrap_or(0);
    agreed
        .keys()
        .chain(local.keys())
        .filter(|key| key.len() <= KEY_MAX)
        .filter_map(|key| {
            let (was, now) = (value(agreed, key), value(local, key));
            let held = now == 0 && stuck.get(key.as_slice()) == Some(&was);
            (was != now && !held).then(|| (key.clone(), now))
        })
        .collect::<BTreeMap<_, _>>()
        .into_iter()
        .collect()
}

/// What to change locally so that `local` becomes the fleet's map. Keys longer than
/// [`KEY_MAX`] are left as they are.
pub fn fleet_changes(fleet: &OverrideMap, local: &OverrideMap) -> Vec<Change> {
    let value = |map: &OverrideMap, key: &[u8]| map.get(key).copied().unwrap_or(0);
    let mut keys: Vec<&Vec<u8>> = fleet.keys().chain(local.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|key| key.len() <= KEY_MAX)
        .filter_map(|key| {
            let (from, to) = (value(local, key), value(fleet, key));
            (from != to).then(|| Change {
                key: key.clone(),
                from,
                to,
            })
        })
        .collect()
}

/// `changes` (as [`local_changes`] makes them) applied to `map`.
pub fn apply_pushed(map: &mut OverrideMap, changes: &[(Vec<u8>, u64)]) {
    for (key, value) in changes {
        if *value == 0 {
            map.remove(key);
        } else {
            map.insert(key.clone(), *value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, u64)]) -> OverrideMap {
        pairs
            .iter()
            .map(|&(key, value)| (key.as_bytes().to_vec(), value))
            .collect()
    }

    #[test]
    fn local_changes_are_sets_replacements_and_removals() {
        let agreed = map(&[("a", 1), ("b", 2), ("c", 3)]);
        let local = map(&[("a", 1), ("b", 5), ("d", 4)]);
        let changes = local_changes(&agreed, &local, &OverrideMap::new());
        assert_eq!(
            changes,
            vec![(b"b".to_vec(), 5), (b"c".to_vec(), 0), (b"d".to_vec(), 4)]
        );
        let mut pushed = agreed.clone();
        apply_pushed(&mut pushed, &changes);
        assert_eq!(pushed, local);
    }

    #[test]
    fn a_stuck_key_is_not_pushed_as_removed_until_the_fleet_changes_it() {
        let agreed = map(&[("a", 1)]);
        let local = map(&[]);
        assert!(local_changes(&agreed, &local, &map(&[("a", 1)])).is_empty());
        // Set here meanwhile: that is a change.
        assert_eq!(
            local_changes(&agreed, &map(&[("a", 2)]), &map(&[("a", 1)])),
            vec![(b"a".to_vec(), 2)]
        );
        // The fleet moved on to another value: the stuck record is stale.
        let agreed = map(&[("a", 7)]);
        assert_eq!(
            local_changes(&agreed, &local, &map(&[("a", 1)])),
            vec![(b"a".to_vec(), 0)]
        );
    }

    #[test]
    fn fleet_changes_name_what_they_replace() {
        let fleet = map(&[("a", 1), ("b", 2)]);
        let local = map(&[("b", 3), ("c", 4)]);
        assert_eq!(
            fleet_changes(&fleet, &local),
            vec![
                Change {
                    key: b"a".to_vec(),
                    from: 0,
                    to: 1
                },
                Change {
                    key: b"b".to_vec(),
                    from: 3,
                    to: 2
                },
                Change {
                    key: b"c".to_vec(),
                    from: 4,
                    to: 0
                },
            ]
        );
        assert!(fleet_changes(&fleet, &fleet).is_empty());
    }

    #[test]
    fn long_keys_stay_local() {
        let long = vec![b'x'; KEY_MAX + 1];
        let mut local = OverrideMap::new();
        local.insert(long.clone(), 9);
        assert!(local_changes(&OverrideMap::new(), &local, &OverrideMap::new()).is_empty());
        assert!(fleet_changes(&OverrideMap::new(), &local).is_empty());
        let exact = vec![b'x'; KEY_MAX];
        local.insert(exact.clone(), 9);
        assert_eq!(
            local_changes(&OverrideMap::new(), &local, &OverrideMap::new()),
            vec![(exact, 9)]
        );
    }
}
