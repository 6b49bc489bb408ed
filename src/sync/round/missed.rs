//! A round that failed or a reply dropped: the deltas back to the keys, the mode after the
//! misses, and grants from shares while the fleet does not answer.

use std::sync::atomic::Ordering;

use ratelimit_core::fleet::{self, grant_word, FleetShape};
use ratelimit_core::sync_spec::{OnFailure, SyncSpec};

use super::state::{Candidate, LoopState, TakenKey, Task, REMEMBERED_KEYS, UNCONFIRMED};
use crate::sync::shared::Mode;

impl Task {
    /// A round that failed: the mode follows the misses. Returns the mode now.
    pub(super) fn miss(&self) -> Mode {
        let missed = self.sync.missed.fetch_add(1, Ordering::AcqRel) + 1;
        let was = self.sync.mode();
        let mode = if missed >= u64::from(SyncSpec::FAILED_AFTER_ROUNDS) {
            match self.spec.on_failure {
                OnFailure::LocalShare => Mode::LocalShare,
                OnFailure::Open => Mode::Open,
                OnFailure::Closed => Mode::Closed,
            }
        } else if was == Mode::Starting {
            Mode::Starting
        } else {
            Mode::Degraded
        };
        self.sync.mode.store(mode as u64, Ordering::Release);
        mode
    }

    /// Keys whose send failed (or whose reply was dropped): the deltas go back to their entries
    /// (the fleet is charged for them later; an evicted key's to the orphan ring), the send
    /// is remembered as possibly applied late, and the keys get grants from shares.
    pub(super) fn missed(
        &self,
        taken_keys: &[&TakenKey],
        round: u64,
        send: u64,
        mode: Mode,
        state: &mut LoopState,
    ) {
        for taken in taken_keys {
            let zone = &self.zones[taken.zone];
            let key = (taken.zone, taken.hash);
            if state.unconfirmed.len() < REMEMBERED_KEYS || state.unconfirmed.contains_key(&key) {
                let sends = state.unconfirmed.entry(key).or_default();
                if sends.len() == UNCONFIRMED {
                    sends.remove(1);
                }
                sends.push((send, taken.delta));
            }
            let pinned = taken
                .entry
                .and_then(|entry| zone.zone.sync_pin(entry, taken.hash));
            let Some(pinned) = pinned else {
                self.sync.orphans.push(zone.id, taken.hash, taken.delta);
                continue;
            };
            let [_, pending, grant] = pinned.words();
            pending.fetch_add(taken.delta, Ordering::AcqRel);
            self.grant_from_share(
                grant,
                taken.zone,
                taken.hash,
                &taken.shape,
                round,
                mode,
                state,
            );
        }
    }

    /// While Redis does not answer: the keys that need the fleet get grants from shares.
    pub(super) fn grant_locally(
        &self,
        candidates: &[Candidate],
        round: u64,
        mode: Mode,
        state: &LoopState,
    ) {
        for candidate in candidates {
            let zone = &self.zones[candidate.zone];
            let Some(pinned) = zone.zone.sync_pin(candidate.entry, candidate.hash) else {
                continue;
            };
            let (hash, [_, _, grant]) = (candidate.hash, pinned.words());
            let Some(shape) = zone.shape(hash) else {
                continue;
            };
            self.grant_from_share(grant, candidate.zone, hash, &shape, round, mode, state);
        }
    }

    /// A grant from the key's last share (one or two missed rounds), or `1 / N̂` of the limit
    /// (`local_share`), refilled from what is left.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn grant_from_share(
        &self,
        grant: &core::sync::atomic::AtomicU64,
        zone: usize,
        hash: u64,
        shape: &FleetShape,
        round: u64,
        mode: Mode,
        state: &LoopState,
    ) {
        let sync_ns = self.sync_ns();
        let instances = self.sync.instances();
        let share = state.keys.get(&(zone, hash)).map_or(0, |key| key.share);
        let (_, left) = grant_word::unpack(grant.load(Ordering::Acquire));
        let granted = match mode {
            Mode::Degraded if share > 0 => {
                fleet::share_refill_grant_milli(shape, share, sync_ns, left)
            }
            _ => fleet::local_share_grant_milli(shape, instances, sync_ns, left),
        };
        grant.store(grant_word::pack(round as u32, granted), Ordering::Release);
    }
}
