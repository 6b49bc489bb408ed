//! Agreeing with the fleet on the zones' limits and overrides, and the inbox through which
//! the workers apply the fleet's override changes.

use ratelimit_core::fleet_round::BadValue;
use ratelimit_core::Limits;

use super::replies::limits_reply;
use super::state::Task;
use crate::glue::now_ns;
use crate::store::inbox::INBOX_ENTRIES;
use crate::sync::shared::{Bad, SyncError};
use crate::sync::zone::SyncZone;

/// Why limits from Redis (the fleet's, or an override's) are not taken.
#[derive(Debug, thiserror::Error)]
pub(super) enum BadLimits {
    #[error("{0} is not packed limits")]
    NotPacked(u64),
    #[error(transparent)]
    Refused(#[from] ratelimit_admin::ApiError),
}

impl Task {
    /// The replies to the zones' limits and overrides (next in `results`, in the order
    /// `commands` sent them): agree with the fleet on both, and hand the fleet's override
    /// changes to the workers.
    pub(super) fn agree_control(
        &self,
        results: &mut impl Iterator<Item = Result<redis::Value, SyncError>>,
        with_overrides: &[usize],
    ) {
        let fleet_limits: Vec<Option<Option<u64>>> = results
            .by_ref()
            .take(self.zones.len())
            .map(|result| result.ok().and_then(|value| limits_reply(&value)))
            .collect();
        self.agree_limits(&fleet_limits);
        for &zone in with_overrides {
            let reply = results.next().and_then(Result::ok);
            let synced = &self.zones[zone];
            let check = |packed: u64| self.check_limits(synced, packed);
            let (bad, version) = synced.overrides.borrow_mut().agree(reply.as_ref(), &check);
            for packed in bad {
                self.sync.note_bad(Bad::Override, synced.id, packed, 0);
            }
            if let Some(version) = version {
                self.note(&BadValue::Version(version), synced.id);
            }
        }
        self.post_inbox();
        // What a loop taking over from this one starts from.
        for &zone in with_overrides {
            let zone = &self.zones[zone];
            let version = zone.overrides.borrow().settled();
            self.sync.set_override_version(zone.id, version);
        }
    }

    /// Whether packed limits from Redis are limits the zone's algorithm can take: what the
    /// admin API and the state file accept.
    pub(super) fn check_limits(&self, zone: &SyncZone, packed: u64) -> Result<Limits, BadLimits> {
        let limits = Limits::unpack(packed).ok_or(BadLimits::NotPacked(packed))?;
        ratelimit_admin::body::check_limits(
            &zone.name,
            zone.zone.algorithm(),
            &limits,
            limits.burst != 0,
            0,
        )?;
        Ok(limits)
    }

    /// After a round trip: the fleet's value of each zone's limits is agreed on; when it is
    /// not the zone's own (another instance's admin API changed it), the zone takes it, if
    /// the zone's algorithm can (else it is counted and the zone keeps its own).
    pub(super) fn agree_limits(&self, fleet_limits: &[Option<Option<u64>>]) {
        let now = now_ns();
        for (zone, fleet) in self.zones.iter().zip(fleet_limits) {
            // A zone whose call failed this round tries again next round.
            let Some(fleet) = fleet else {
                continue;
            };
            zone.first_round.set(false);
            let local = zone.zone.limits_word();
            let Some(fleet) = fleet.filter(|&fleet| fleet != local) else {
                zone.agreed_limits.set(local);
                continue;
            };
            if local != zone.agreed_limits.get() {
                // Changed here after this round's push was built: pushed next round.
                continue;
            }
            match self.check_limits(zone, fleet) {
                Ok(limits) => {
                    zone.zone.set_limits(limits, now);
                    zone.agreed_limits.set(fleet);
                }
                Err(_) => self.sync.note_bad(Bad::Limits, zone.id, fleet, 0),
            }
        }
    }

    /// Before a round: read what a worker did with the last inbox (a change it could not
    /// apply is held back from the pushes). Returns whether fleet changes are still on their
    /// way to the zones, when a local difference is not a local change.
    pub(super) fn settle_inbox(&self) -> bool {
        let mut failed = Vec::new();
        let free = self.sync.inbox.settle(&mut failed);
        for (id, change) in failed {
            if let Some(zone) = self.zones.iter().find(|zone| zone.id == id) {
                let mut overrides = zone.overrides.borrow_mut();
                overrides.stuck.insert(change.key, change.to);
            }
        }
        !free
            || self
                .zones
                .iter()
                .any(|zone| !zone.overrides.borrow().to_apply.is_empty())
    }

    /// After a round: hand the fleet's override changes to the workers when the inbox is free.
    pub(super) fn post_inbox(&self) {
        if !self.sync.inbox.is_empty() {
            return;
        }
        let mut batch = Vec::new();
        for zone in &self.zones {
            let mut overrides = zone.overrides.borrow_mut();
            let room = INBOX_ENTRIES - batch.len();
            let take = overrides.to_apply.len().min(room);
            batch.extend(
                overrides
                    .to_apply
                    .drain(..take)
                    .map(|change| (zone.id, change)),
            );
        }
        self.sync.inbox.post(&mut batch);
        // Not taken (another loop got there first across a reload): kept for a later round.
        for (id, change) in batch {
            if let Some(zone) = self.zones.iter().find(|zone| zone.id == id) {
                zone.overrides.borrow_mut().to_apply.push(change);
            }
        }
    }
}
