//! The round's pipeline: the heartbeat, each zone's limits and overrides, and the key
//! script calls in batches of one hash-tag group.

use super::scripts::{HEARTBEAT_SCRIPT, KEY_SCRIPT, LIMITS_SCRIPT};
use super::state::{TakenKey, Task};
use crate::sync::cluster;
use crate::sync::zone::SyncZone;

/// Keys in one key script call: a call runs alone in Redis, so a few milliseconds at most.
const KEYS_PER_CALL: usize = 256;

/// Hash-tag groups of a zone's keys: a key's Redis name carries `{NN}`, one of this many hash
/// tags, so that a Redis Cluster puts the keys of one group in one hash slot (a script call's
/// keys must share a hash slot) while the groups spread over the cluster's nodes.
const HASH_TAG_GROUPS: u64 = 64;

impl Task {
    /// A key's Redis name: `prefix zone:{group}:id`.
    pub(super) fn key_name(&self, zone: &SyncZone, hash: u64) -> String {
        format!(
            "{}{}:{{{:02x}}}:{:016x}",
            self.spec.prefix,
            zone.name,
            hash % HASH_TAG_GROUPS,
            hash
        )
    }

    /// The round's commands, each with the key that routes it: the heartbeat, each zone's
    /// limits, the overrides of the zones listed in the second value (those whose overrides
    /// could be read), then the key script calls, each for the keys taken in its range of the
    /// third value (at most [`KEYS_PER_CALL`] keys of one hash-tag group).
    #[allow(clippy::type_complexity)]
    pub(super) fn commands(
        &self,
        taken_keys: &[TakenKey],
        send: u64,
        busy: bool,
    ) -> (
        Vec<cluster::Routed>,
        Vec<usize>,
        Vec<std::ops::Range<usize>>,
    ) {
        let mut commands = Vec::with_capacity(1 + 2 * self.zones.len());
        commands.push(self.heartbeat_command());
        self.limits_commands(&mut commands);
        let with_overrides = self.overrides_commands(&mut commands, busy);
        let batches = self.key_commands(&mut commands, taken_keys, send);
        (commands, with_overrides, batches)
    }

    /// How long an instance counts as alive after its last heartbeat (ms).
    fn alive_ms(&self) -> u64 {
        (3 * self.spec.interval_ms).max(1000)
    }

    /// This instance alive, and how many are ([`HEARTBEAT_SCRIPT`]).
    fn heartbeat_command(&self) -> cluster::Routed {
        let key = format!("{}instances", self.spec.prefix);
        let mut command = redis::cmd("EVALSHA");
        command
            .arg(redis::Script::new(HEARTBEAT_SCRIPT).get_hash())
            .arg(1)
            .arg(&key)
            .arg(format!("{:016x}", self.sync.instance_id))
            .arg(self.alive_ms());
        cluster::Routed { key, command }
    }

    /// Each zone's limits ([`LIMITS_SCRIPT`]): its own when changed here (or in a loop's
    /// first round, with its file's), the fleet's back.
    fn limits_commands(&self, commands: &mut Vec<cluster::Routed>) {
        let limits_hash = redis::Script::new(LIMITS_SCRIPT).get_hash().to_string();
        for zone in &self.zones {
            let local = zone.zone.limits_word();
            let first = zone.first_round.get();
            let changed = first || local != zone.agreed_limits.get();
            let config = zone.zone.config_limits_word();
            let key = format!("{}{}:limits", self.spec.prefix, zone.name);
            let mut command = redis::cmd("EVALSHA");
            command
                .arg(&limits_hash)
                .arg(1)
                .arg(&key)
                .arg(if changed {
                    local.to_string()
                } else {
                    String::new()
                })
                .arg(if first {
                    config.to_string()
                } else {
                    String::new()
                });
            commands.push(cluster::Routed { key, command });
        }
    }

    /// Each zone's overrides (`sync::overrides`), when they can be read: the zones sent.
    fn overrides_commands(&self, commands: &mut Vec<cluster::Routed>, busy: bool) -> Vec<usize> {
        let mut with_overrides = Vec::new();
        for (index, zone) in self.zones.iter().enumerate() {
            let key = format!("{}{}:overrides", self.spec.prefix, zone.name);
            let command = zone.overrides.borrow_mut().command(&zone.zone, key, busy);
            if let Some(command) = command {
                commands.push(command);
                with_overrides.push(index);
            }
        }
        with_overrides
    }

    /// The key script calls ([`KEY_SCRIPT`]) for `taken_keys`, sent as number `send`: each
    /// call's range of `taken_keys`.
    fn key_commands(
        &self,
        commands: &mut Vec<cluster::Routed>,
        taken_keys: &[TakenKey],
        send: u64,
    ) -> Vec<std::ops::Range<usize>> {
        // Taken keys in order of their hash-tag group (a Cluster needs one hash slot per call;
        // one server
        // takes any mix, and the order changes nothing there).
        let mut batches = Vec::new();
        let key_hash = redis::Script::new(KEY_SCRIPT).get_hash().to_string();
        let instance = format!("{:016x}", self.sync.instance_id);
        let mut at = 0;
        while at < taken_keys.len() {
            let group = taken_keys[at].hash % HASH_TAG_GROUPS;
            let mut end = at + 1;
            while end < taken_keys.len()
                && end - at < KEYS_PER_CALL
                && (!self.spec.cluster || taken_keys[end].hash % HASH_TAG_GROUPS == group)
            {
                end += 1;
            }
            let batch = &taken_keys[at..end];
            let names: Vec<String> = batch
                .iter()
                .map(|taken| self.key_name(&self.zones[taken.zone], taken.hash))
                .collect();
            let mut command = redis::cmd("EVALSHA");
            command.arg(&key_hash).arg(batch.len());
            for name in &names {
                command.arg(name);
            }
            command.arg(&instance).arg(send).arg(self.spec.interval_ms);
            for taken in batch {
                self.key_arguments(&mut command, taken);
            }
            commands.push(cluster::Routed {
                key: names[0].clone(),
                command,
            });
            batches.push(at..end);
            at = end;
        }
        batches
    }

    /// One key's arguments to [`KEY_SCRIPT`]: its delta, shape, idle expiry and the earlier
    /// sends it carries again.
    fn key_arguments(&self, command: &mut redis::Cmd, taken: &TakenKey) {
        let idle_ms = (taken.shape.capacity_ns() / 1_000_000)
            .saturating_add(2 * self.alive_ms())
            .saturating_add(self.spec.interval_ms);
        command
            .arg(taken.delta)
            .arg(taken.shape.interval_ns)
            .arg(taken.shape.capacity)
            .arg(idle_ms)
            .arg(taken.unconfirmed.len());
        for &(earlier, sent) in &taken.unconfirmed {
            command.arg(earlier).arg(sent);
        }
    }
}
