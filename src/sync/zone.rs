//! One sync zone as the loop sees it: the zone in shared memory and what the loop keeps of
//! it between rounds (the limits agreed with the fleet, its overrides, its lines' bursts).
//! Below the loop (`super::task`) and the blocks' exchange (`super::blocks`), which both read
//! it.

use ratelimit_core::fleet::FleetShape;
use ratelimit_core::Limits;

use super::overrides::OverrideSync;
use crate::conf::LocationBursts;
use crate::store::Zone;

/// One sync zone as the loop sees it.
pub struct SyncZone {
    pub name: String,
    pub zone: Zone,
    /// The zone's limits as last agreed with the fleet (packed): a different local value is
    /// an admin change to push, a different fleet value one to apply.
    pub agreed_limits: std::cell::Cell<u64>,
    /// Until the first successful round: the file's value is sent along (see
    /// `LIMITS_SCRIPT`).
    pub first_round: std::cell::Cell<bool>,
    /// `name_seed` of the name (`crate::store::sync_record`): how the inbox and the orphan
    /// ring name the zone to the workers and the loop.
    pub id: u64,
    /// The zone's per-key overrides as agreed with the fleet (`super::overrides`).
    pub overrides: std::cell::RefCell<OverrideSync>,
    /// The bursts the zone's `rate_limit` lines decide with: a key's fleet bucket is the
    /// largest of them (each request is decided locally with its own line's).
    pub bursts: LocationBursts,
    /// `block=`: the zone's blocks are shared too (`super::blocks`).
    pub block: Option<ratelimit_core::penalty::BlockPolicy>,
    /// `algorithm=quota`: the period's counters are shared (`super::quota`).
    pub quota: Option<super::quota_keep::QuotaSync>,
}

impl SyncZone {
    /// The limits of the key `hash` now: its override, else the zone's limits with the
    /// largest burst of its lines.
    pub fn limits(&self, hash: u64) -> Option<Limits> {
        let limits = self.zone.limits()?;
        Some(self.zone.override_for(hash).unwrap_or(Limits {
            burst: self.bursts.largest(limits.burst),
            ..limits
        }))
    }

    /// The fleet bucket of the key `hash` now. `None` for a zone that cannot sync.
    pub fn shape(&self, hash: u64) -> Option<FleetShape> {
        FleetShape::of(self.zone.algorithm(), &self.limits(hash)?)
    }
}
