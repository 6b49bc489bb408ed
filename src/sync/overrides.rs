//! Per-key overrides shared by the fleet: the sync loop's side.
//!
//! Redis holds a sync zone's overrides in the hash `PREFIX ZONE:overrides`: field `k` + key
//! bytes → packed limits, and field `v`, a version bumped by every change. Each round sends one
//! `EVALSHA` per zone (in the round's pipeline) with the version this loop last saw and this
//! instance's changes; the reply is the version, plus the whole map only when the version is
//! not the one sent, so a quiet round costs a few bytes. The local overrides are read without
//! the lock (`Zone::overrides_unlocked`), the fleet's changes are handed to a worker through
//! the inbox (`crate::store::inbox`); what to push and what to apply is decided in
//! `ratelimit_core::fleet_overrides`.

use redis::Value;

use ratelimit_core::fleet_overrides::{self, Change, OverrideMap};

use super::cluster::Routed;
use crate::store::Zone;

/// ARGV: the version last seen (empty: none), the number of seed pairs (empty: not a seed
/// call), the seed pairs, then the changes: pairs of key bytes and packed limits (`0`: removed).
/// Seed pairs are written only when the fleet has no map yet, so a restarted instance takes
/// the fleet's map while a fresh or emptied Redis gets the instances' own. The changes are
/// applied unless the fleet has no map and the call seeds nothing (reply `{-1}`: the loop
/// seeds next round). The reply is `{version}`, or `{version, 'map', key, limits, ...}` when
/// the version is not ARGV[1].
pub const OVERRIDES_SCRIPT: &str = r#"
local v = redis.call('HGET', KEYS[1], 'v')
local first = 3
if ARGV[2] ~= '' then
  first = 3 + 2 * tonumber(ARGV[2])
  if not v then
    for i = 3, first - 1, 2 do
      redis.call('HSET', KEYS[1], 'k' .. ARGV[i], ARGV[i + 1])
    end
    v = redis.call('HINCRBY', KEYS[1], 'v', 1)
  end
elseif not v then
  return {-1}
end
local changed = false
for i = first, #ARGV, 2 do
  local field = 'k' .. ARGV[i]
  if ARGV[i + 1] == '0' then
    if redis.call('HDEL', KEYS[1], field) == 1 then changed = true end
  elseif redis.call('HGET', KEYS[1], field) ~= ARGV[i + 1] then
    redis.call('HSET', KEYS[1], field, ARGV[i + 1])
    changed = true
  end
end
if changed then v = redis.call('HINCRBY', KEYS[1], 'v', 1) end
v = tonumber(v)
if tostring(v) == ARGV[1] then return {v} end
local reply = {v, 'map'}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if string.sub(all[i], 1, 1) == 'k' then
    reply[#reply + 1] = string.sub(all[i], 2)
    reply[#reply + 1] = all[i + 1]
  end
end
return reply
"#;

/// What the loop remembers of one zone's overrides between rounds.
#[derive(Default)]
pub struct OverrideSync {
    /// The map last agreed on with the fleet. Before the first reply, the local overrides
    /// when the loop started (so an admin change made here meanwhile is pushed as one).
    agreed: Option<OverrideMap>,
    /// Until a reply with the fleet's map (from the start, and again when Redis lost the map):
    /// calls seed with `agreed`, which Redis takes only when it has no map.
    seeding: bool,
    /// The fleet's version of `agreed`.
    version: Option<u64>,
    /// The local overrides when this round's call was built, and what it pushed.
    snapshot: Option<OverrideMap>,
    pushed: Vec<(Vec<u8>, u64)>,
    /// The fleet's changes still to hand to a worker.
    pub to_apply: Vec<Change>,
    /// Fleet values a worker could not apply (no room): not pushed back as local removals.
    pub stuck: OverrideMap,
    /// The fleet version an earlier loop of this instance last matched (a take-over after a
    /// reload or a worker crash): when the fleet is still at it, every local difference is a
    /// change made here meanwhile, to push rather than undo.
    inherited: Option<u64>,
    /// Whether this round's call was built with the fleet's changes all applied here.
    built_settled: bool,
}

impl OverrideSync {
    /// A loop taking over from an earlier one of this instance, which last matched the
    /// fleet's version `version` (0: unknown, start as after a restart).
    pub fn inherit(&mut self, version: u64) {
        self.inherited = (version > 0).then_some(version);
    }

    /// The fleet version this instance's overrides match now, for a later loop: known when
    /// the map is agreed, every fleet change was handed to the workers (applied, or waiting in
    /// the inbox, which a later loop settles before it trusts this), and none is stuck (a
    /// later loop would take a stuck key's absence here for a removal).
    pub fn settled(&self) -> u64 {
        let settled = !self.seeding
            && self.inherited.is_none()
            && self.to_apply.is_empty()
            && self.stuck.is_empty();
        self.version.filter(|_| settled).unwrap_or(0)
    }

    /// This round's call for the zone, or `None` when its overrides could not be read
    /// consistently (a worker was changing them): the zone sits this round out. `busy`: the
    /// fleet's changes are not all applied yet, so a local difference is not a local change.
    pub fn command(&mut self, zone: &Zone, key: String, busy: bool) -> Option<Routed> {
        self.snapshot = None;
        self.pushed.clear();
        let local: OverrideMap = zone.overrides_unlocked()?.into_iter().collect();
        let mut command = redis::cmd("EVALSHA");
        command
            .arg(redis::Script::new(OVERRIDES_SCRIPT).get_hash())
            .arg(1)
            .arg(&key);
        self.built_settled = !busy;
        if self.agreed.is_none() && self.inherited.is_none() {
            self.agreed = Some(local.clone());
            self.seeding = true;
        }
        let agreed = self.agreed.get_or_insert_with(OverrideMap::new);
        // Without a map agreed on (seeding, or taking over), ask for the fleet's whole map.
        match self
            .version
            .filter(|_| !self.seeding && self.inherited.is_none())
        {
            Some(version) => command.arg(version.to_string()),
            None => command.arg(""),
        };
        if self.seeding {
            let seeds: Vec<_> = agreed
                .iter()
                .filter(|(key, _)| key.len() <= fleet_overrides::KEY_MAX)
                .collect();
            command.arg(seeds.len());
            for (key, limits) in seeds {
                command.arg(key.as_slice()).arg(limits.to_string());
            }
        } else {
            command.arg("");
        }
        if !busy && self.inherited.is_none() {
            self.pushed = fleet_overrides::local_changes(agreed, &local, &self.stuck);
        }
        for (key, limits) in &self.pushed {
            command.arg(key.as_slice()).arg(limits.to_string());
        }
        self.snapshot = Some(local);
        Some(Routed { key, command })
    }

    /// The reply of this round's call (`None`: it failed; the changes are pushed again next
    /// round since they still differ from the agreed map). `check` says whether the zone's
    /// algorithm can take packed limits (what the admin API accepts): a fleet value it cannot
    /// take is not applied here (the key keeps its local value, which is not pushed back
    /// either, as for a value this instance had no room for). Returns those values, and a
    /// version out of range (below -1), for which the whole reply is dropped.
    pub fn agree<T, E>(
        &mut self,
        reply: Option<&Value>,
        check: &impl Fn(u64) -> Result<T, E>,
    ) -> (Vec<u64>, Option<i64>) {
        let (Some(reply), Some(local)) = (reply, self.snapshot.take()) else {
            return (Vec::new(), None);
        };
        let Some((version, fleet)) = parse(reply) else {
            return (Vec::new(), None);
        };
        if version < -1 {
            return (Vec::new(), Some(version));
        }
        if version < 0 {
            // Redis lost the map (restarted empty): seed it again with the agreed one (after a
            // take-over, the local overrides).
            self.seeding = true;
            if self.inherited.take().is_some() {
                self.agreed = Some(local);
            }
            return (Vec::new(), None);
        }
        self.version = Some(version as u64);
        let mut bad = Vec::new();
        match fleet {
            None => {
                if let Some(agreed) = &mut self.agreed {
                    fleet_overrides::apply_pushed(agreed, &self.pushed);
                }
            }
            Some(_) if self.inherited.is_some() && !self.built_settled => {
                // Taking over while the earlier loop's last changes still wait in the inbox:
                // decided once the workers have applied them.
            }
            Some(fleet) => {
                self.seeding = false;
                // What this instance can apply: the fleet's map with every value the zone
                // cannot take replaced by the local one (no change either way).
                let mut applicable = fleet.clone();
                for (key, &limits) in &fleet {
                    if check(limits).is_err() {
                        bad.push(limits);
                        match local.get(key) {
                            Some(&mine) => applicable.insert(key.clone(), mine),
                            None => applicable.remove(key),
                        };
                        self.stuck.insert(key.clone(), limits);
                    }
                }
                // Taking over with the fleet where the earlier loop left it: the local
                // differences are this instance's changes, pushed from the next call on.
                let inherited = self.inherited.take();
                self.to_apply = if inherited == Some(version as u64) {
                    Vec::new()
                } else {
                    fleet_overrides::fleet_changes(&applicable, &local)
                };
                self.stuck
                    .retain(|key, limits| fleet.get(key).copied().unwrap_or(0) == *limits);
                self.agreed = Some(fleet);
            }
        }
        (bad, None)
    }
}

/// `{version}` or `{version, 'map', key, limits, ...}`.
fn parse(reply: &Value) -> Option<(i64, Option<OverrideMap>)> {
    let Value::Array(items) = reply else {
        return None;
    };
    let version = match items.first()? {
        Value::Int(version) => *version,
        _ => return None,
    };
    if items.len() == 1 {
        return Some((version, None));
    }
    let mut map = OverrideMap::new();
    for pair in items[2..].chunks(2) {
        let [key, limits] = pair else {
            return None;
        };
        let key: Vec<u8> = redis::from_redis_value(key).ok()?;
        let limits: String = redis::from_redis_value(limits).ok()?;
        let limits: u64 = limits.parse().ok()?;
        // Checked by the caller against the zone's algorithm (a value no valid limits pack
        // to fails that check too).
        map.insert(key, limits);
    }
    Some((version, Some(map)))
}
