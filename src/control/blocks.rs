//! The penalty box's changes by hand (admin API, Lua): block a key for a duration, release
//! it, and ask how long it stays blocked. Rejections block keys in the decision pipeline
//! ([`super::decide::account`]).

use ratelimit_core::block_table::BlockChange;
use ratelimit_core::penalty::{Block, BlockWord};

use crate::conf::ZoneConf;

/// Why a key could not be blocked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockError {
    #[error(
        "zone \"{0}\" has no penalty box: \"block=DURATION\" on its rate_limit_zone keeps \
         blocked keys"
    )]
    NoBlocks(String),
    #[error("the block table of zone \"{0}\" has no room")]
    Full(String),
}

/// Block `key` for `duration_ns` from `now_ns`, keeping its escalation level; the sync loop is
/// woken to tell the fleet.
pub fn block_by_hand(
    zone_conf: &ZoneConf,
    key: &[u8],
    duration_ns: u64,
    now_ns: u64,
) -> Result<Block, BlockError> {
    let (Some(policy), Some(zone)) = (&zone_conf.block, &zone_conf.zone) else {
        return Err(BlockError::NoBlocks(zone_conf.name.clone()));
    };
    let hash = zone.hash_key(key);
    let block = zone
        .change_block(hash, key, now_ns, BlockChange::ByHand(duration_ns), policy)
        .ok_or_else(|| BlockError::Full(zone_conf.name.clone()))?;
    super::wake_sync_loop();
    Ok(block)
}

/// End `key`'s block now; false when it was not blocked.
pub fn release(zone_conf: &ZoneConf, key: &[u8], now_ns: u64) -> bool {
    let Some(zone) = zone_conf
        .zone
        .as_ref()
        .filter(|_| zone_conf.block.is_some())
    else {
        return false;
    };
    let released = zone.release_block(zone.hash_key(key), now_ns);
    if released {
        super::wake_sync_loop();
    }
    released
}

/// How long `key` stays blocked from `now_ns`; `None` when it is not (or the zone has no
/// `block=`).
pub fn blocked_for_ns(zone_conf: &ZoneConf, key: &[u8], now_ns: u64) -> Option<u64> {
    zone_conf.block?;
    let zone = zone_conf.zone.as_ref()?;
    zone.blocked_for_ns(zone.hash_key(key), now_ns)
}

/// Take another instance's record of `key` (a sync zone's fleet): its block word, changed at
/// `changed_ms` (this instance's clock); applied only when newer than the local record.
pub fn apply_fleet(zone_conf: &ZoneConf, key: &[u8], word: BlockWord, changed_ms: u64) {
    let (Some(policy), Some(zone)) = (&zone_conf.block, &zone_conf.zone) else {
        return;
    };
    let change = BlockChange::Fleet { word, changed_ms };
    let _ = zone.change_block(
        zone.hash_key(key),
        key,
        crate::glue::now_ns(),
        change,
        policy,
    );
}
