//! Which keys go out this round: the scan for the most urgent, their pending deltas taken,
//! and the orphan ring's.

use std::collections::BinaryHeap;
use std::sync::atomic::Ordering;

use ratelimit_core::fleet::ASKED;
use ratelimit_core::fleet_round;

use super::state::{Candidate, LoopState, TakenKey, Task};

impl Task {
    /// The keys that need the fleet this round, most urgent first: at most `budget` of them,
    /// every zone with keys given at least its fair part (so a zone later in the
    /// configuration is never starved by an earlier one's many keys). Nothing is taken yet.
    pub(super) fn scan(&self, budget: usize, instances: u64) -> Vec<Candidate> {
        let sync_ns = self.sync_ns();
        let mut per_zone: Vec<Vec<Candidate>> = Vec::with_capacity(self.zones.len());
        for (zone_index, synced) in self.zones.iter().enumerate() {
            let zone = &synced.zone;
            if synced.quota.is_some() {
                // Its keys have no grants: their counters go in `sync_quotas`.
                per_zone.push(Vec::new());
                continue;
            }
            // The `budget` most urgent keys of the zone: a min-heap of the best so far.
            let mut best: BinaryHeap<std::cmp::Reverse<Candidate>> = BinaryHeap::new();
            for entry in 0..zone.slot_count() {
                let Some((hash, word)) = zone.sync_slot(entry) else {
                    break;
                };
                if hash == 0 || word == 0 {
                    continue;
                }
                let Some(shape) = synced.shape(hash) else {
                    continue;
                };
                let Some(rank) = fleet_round::urgency(word, &shape, instances, sync_ns) else {
                    continue;
                };
                let candidate = Candidate {
                    rank,
                    zone: zone_index,
                    entry,
                    hash,
                };
                if best.len() < budget {
                    best.push(std::cmp::Reverse(candidate));
                } else if best.peek().is_some_and(|least| least.0.rank < rank) {
                    best.pop();
                    best.push(std::cmp::Reverse(candidate));
                }
            }
            let mut zone_best: Vec<Candidate> = best.into_iter().map(|c| c.0).collect();
            zone_best.sort_unstable_by(|a, b| b.cmp(a));
            per_zone.push(zone_best);
        }
        let fair = budget / (2 * self.zones.len().max(1));
        let mut chosen = Vec::new();
        let mut rest = Vec::new();
        for zone in per_zone {
            let (first, others) = zone.split_at(zone.len().min(fair));
            chosen.extend_from_slice(first);
            rest.extend_from_slice(others);
        }
        rest.sort_unstable_by(|a, b| b.cmp(a));
        let room = budget.saturating_sub(chosen.len());
        chosen.extend(rest.into_iter().take(room));
        chosen
    }

    /// Take the chosen keys' pending deltas (swapped to 0: whatever is charged from now on
    /// goes to the next round).
    pub(super) fn take(
        &self,
        candidates: &[Candidate],
        taken_keys: &mut Vec<TakenKey>,
        state: &LoopState,
    ) {
        for candidate in candidates {
            let synced = &self.zones[candidate.zone];
            // Evicted meanwhile: its delta went to the orphan ring.
            let Some(pinned) = synced.zone.sync_pin(candidate.entry, candidate.hash) else {
                continue;
            };
            let hash = candidate.hash;
            let [_, pending, _] = pinned.words();
            let Some(shape) = synced.shape(hash) else {
                continue;
            };
            let word = pending.swap(0, Ordering::AcqRel);
            drop(pinned);
            taken_keys.push(TakenKey {
                zone: candidate.zone,
                entry: Some(candidate.entry),
                hash,
                delta: (word & !ASKED).min(shape.carry_limit()),
                shape,
                unconfirmed: state
                    .unconfirmed
                    .get(&(candidate.zone, hash))
                    .cloned()
                    .unwrap_or_default(),
            });
        }
    }

    /// The deltas of keys evicted since the last round (the orphan ring), those that need
    /// the fleet, within the round's budget; the others are within their share and dropped.
    pub(super) fn take_orphans(
        &self,
        taken_keys: &mut Vec<TakenKey>,
        budget: usize,
        state: &LoopState,
    ) {
        let instances = self.sync.instances();
        let sync_ns = self.sync_ns();
        self.sync.orphans.drain(|zone_id, hash, delta| {
            let Some(zone) = self.zones.iter().position(|zone| zone.id == zone_id) else {
                return;
            };
            let Some(shape) = self.zones[zone].shape(hash) else {
                return;
            };
            if taken_keys.len() >= budget
                || fleet_round::urgency(delta, &shape, instances, sync_ns).is_none()
            {
                self.sync.orphans_dropped.fetch_add(1, Ordering::Relaxed);
                return;
            }
            taken_keys.push(TakenKey {
                zone,
                entry: None,
                hash,
                delta: (delta & !ASKED).min(shape.carry_limit()),
                shape,
                unconfirmed: state
                    .unconfirmed
                    .get(&(zone, hash))
                    .cloned()
                    .unwrap_or_default(),
            });
        });
    }
}
