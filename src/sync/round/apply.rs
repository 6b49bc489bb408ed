//! Applying the fleet's replies: each key's share remembered, its grant set and its local
//! state settled.

use std::sync::atomic::Ordering;

use ratelimit_core::fleet::{self, grant_word, ASKED};
use ratelimit_core::fleet_round;

use super::state::{KeyMemory, LoopState, TakenKey, Task, REMEMBERED_KEYS};
use crate::glue::now_ns;

impl Task {
    /// Remember a key's fleet view, within [`REMEMBERED_KEYS`]: when full, the keys not
    /// synced for the longest are forgotten first.
    pub(super) fn remember(state: &mut LoopState, key: (usize, u64), round: u64) -> &mut KeyMemory {
        if state.keys.len() >= REMEMBERED_KEYS && !state.keys.contains_key(&key) {
            let mut age = 64;
            while state.keys.len() >= REMEMBERED_KEYS * 3 / 4 && age > 0 {
                state
                    .keys
                    .retain(|_, memory| round.wrapping_sub(memory.round) < age);
                age /= 2;
            }
            if state.keys.len() >= REMEMBERED_KEYS {
                state.keys.clear();
            }
        }
        state.keys.entry(key).or_default()
    }

    /// Set each key's grant and local state from the fleet's, unless the key's limits changed
    /// since the round was built (an admin change): a reply computed at the old limits is not
    /// applied after the new ones; the key gets a fresh grant instead.
    pub(super) fn apply(
        &self,
        synced: &[(&TakenKey, fleet_round::KeyReply)],
        instances: u64,
        round: u64,
        state: &mut LoopState,
    ) {
        let sync_ns = self.sync_ns();
        let now = now_ns();
        for &(taken, reply) in synced {
            state.unconfirmed.remove(&(taken.zone, taken.hash));
            let zone = &self.zones[taken.zone];
            let key = Self::remember(state, (taken.zone, taken.hash), round);
            let mine = taken.delta + key.last_delta;
            key.last_delta = taken.delta;
            key.share = fleet::share(mine, reply.recent, reply.before, instances);
            key.round = round;
            let Some(entry) = taken.entry else {
                continue; // evicted: nothing left here to grant.
            };
            // Evicted meanwhile: the new key starts from a fresh grant.
            let Some(pinned) = zone.zone.sync_pin(entry, taken.hash) else {
                continue;
            };
            let hash = taken.hash;
            let [local, pending, grant] = pinned.words();
            if zone.shape(hash) != Some(taken.shape) {
                grant.store(0, Ordering::Release);
                continue;
            }
            let room = fleet::fleet_room_milli(&taken.shape, reply.ahead_ns, sync_ns);
            let spent_since = pending.load(Ordering::Acquire) & !ASKED;
            let granted = fleet::grant_milli(room, key.share, spent_since);
            grant.store(grant_word::pack(round as u32, granted), Ordering::Release);
            let algorithm = zone.zone.algorithm();
            let _ = local.fetch_update(Ordering::AcqRel, Ordering::Acquire, |current| {
                let settled = fleet::settle_local_state(
                    current,
                    algorithm,
                    &taken.shape,
                    reply.ahead_ns,
                    now,
                );
                (settled != current).then_some(settled)
            });
        }
    }
}
