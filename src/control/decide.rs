//! The decision pipeline: every front door (the request path, Lua) decides through here.
//!
//! 1. [`find`]: the key's slot in its zone (claimed for a new key);
//! 2. [`Applied::new`]: the limits the key gets, computed once ([`effective_policy`]);
//! 3. [`decide`] (or [`decide_one`], the request path's common case, then [`verdict`]): the
//!    decisions, the fleet's grant taken for a sync zone, and a [`Verdict`];
//! 4. [`account`] (or [`account_passed`]): what follows a decision, the counters and the
//!    top keys.
//!
//! What a new capability adds to every decision goes into these steps once: a check that
//! may refuse before anything is charged goes first in [`decide`] (and before
//! [`decide_one`]'s charge), what follows a decision goes into [`account`]. The penalty box
//! (`block=`) is both: a blocked key is refused first ([`blocked`]), and a rejection blocks
//! the key in [`account`].

use ngx::ffi::{ngx_log_t, NGX_LOG_WARN};
use ngx::ngx_log_error;
use ratelimit_core::block_table::BlockChange;
use ratelimit_core::penalty::{Block, StatusMatcher};
use ratelimit_core::top::TopKind;
use ratelimit_core::{Algorithm, BucketCharge, Decision, Limits, Outcome, Policy};

use super::fleet;
use crate::conf::{LimitConf, ZoneConf};
use crate::store::{Counter, SlotIndex, Zone};

/// A key found in a zone: its slot, claimed if the key is new.
pub struct Found<'a> {
    pub zone_conf: &'a ZoneConf,
    pub zone: &'a Zone,
    /// The key's slot and id (its hash).
    pub slot: SlotIndex,
}

/// The zone's slot for `key` (1 to `MAX_KEY_BYTES` bytes), claiming one for a new key, and
/// whether the zone has something to say in its log (another key was evicted for it, or its
/// window was busy: [`Found::log_zone_full`]).
#[inline(always)]
pub fn find<'a>(
    zone_conf: &'a ZoneConf,
    zone: &'a Zone,
    key: &[u8],
    now_ns: u64,
) -> (Found<'a>, bool) {
    // The zone's history records its totals as they stand before the first decision of
    // each second (nothing but a load and compare in the other requests).
    zone.record_second(now_ns);
    let hash = zone.hash_key(key);
    let (slot, note) = zone.find_or_claim(hash, now_ns);
    (
        Found {
            zone_conf,
            zone,
            slot,
        },
        note,
    )
}

/// The zone's slot for `key` if the key has one, claiming none (a give-back, Lua's
/// `uncommit` and `leaving`: they must never evict another key to find nothing to give back).
/// A key without a slot gets a reference that no pin accepts.
pub fn find_existing<'a>(zone_conf: &'a ZoneConf, zone: &'a Zone, key: &[u8]) -> Found<'a> {
    let hash = zone.hash_key(key);
    let slot = zone.find(hash).unwrap_or_else(|| zone.no_slot_for(hash));
    Found {
        zone_conf,
        zone,
        slot,
    }
}

impl Found<'_> {
    /// The key's id (its hash in the zone).
    #[inline(always)]
    pub fn hash(&self) -> u64 {
        self.slot.id
    }

    /// The key got no slot: every slot of its window is busy (requests in flight or queued).
    /// A concurrency zone refuses it; a rate zone decides it as a fresh key, storing nothing.
    pub fn busy(&self) -> bool {
        Zone::names_no_slot(self.slot)
    }

    /// After an eviction or a busy window: say so, once a second at most.
    #[cold]
    pub fn log_zone_full(&self, now_ns: u64, log: *mut ngx_log_t) {
        if self.busy() {
            if self.zone.should_log_no_slot(now_ns) {
                ngx_log_error!(
                    NGX_LOG_WARN,
                    log,
                    "rate_limit zone \"{}\" is full: every slot a new key may take holds \
                     requests in flight or queued, key refused",
                    self.zone_conf.name
                );
            }
            return;
        }
        if self.zone.should_log_full(now_ns) {
            ngx_log_error!(
                NGX_LOG_WARN,
                log,
                "rate_limit zone \"{}\" is full: evicted the key nearest to its fresh state",
                self.zone_conf.name
            );
        }
    }
}

/// The limits for one request in one zone at `now_ns`: the zone's live limits, the line's
/// `burst=`, then a per-key override, which wins over both; a quota zone's in the period of
/// `now_ns`.
pub fn effective_policy(
    zone_conf: &ZoneConf,
    zone: &Zone,
    limit: &LimitConf,
    hash: u64,
    now_ns: u64,
) -> Option<Policy> {
    let mut limits = zone.limits()?;
    if let Some(burst) = limit.burst {
        limits.burst = burst;
    }
    if let Some(overridden) = zone.override_for(hash) {
        limits = overridden;
    }
    let mut algorithm = zone.algorithm();
    if algorithm.is_quota() {
        algorithm = Algorithm::Quota(super::quota::window(zone_conf, now_ns));
    }
    Some(Policy {
        algorithm,
        limits,
        delay: limit.delay,
        cost: limit.cost,
    })
}

/// One zone applied to a request: where the key is, the limits it gets, and the zone's last
/// decision for it.
pub struct Applied<'a> {
    pub zone_conf: &'a ZoneConf,
    pub zone: &'a Zone,
    /// The key's slot and id (its hash).
    pub slot: SlotIndex,
    pub policy: Policy,
    pub decision: Decision,
}

impl<'a> Applied<'a> {
    /// The key's id (its hash in the zone).
    #[inline(always)]
    pub fn hash(&self) -> u64 {
        self.slot.id
    }

    /// The key found, under the limits of `limit` at `now_ns`; `None` when the zone has no
    /// limits.
    pub fn new(found: Found<'a>, limit: &LimitConf, now_ns: u64) -> Option<Applied<'a>> {
        let policy = effective_policy(found.zone_conf, found.zone, limit, found.hash(), now_ns)?;
        Some(Applied::decided(found, policy, Decision::rejected(0, 0, 0)))
    }

    fn decided(found: Found<'a>, policy: Policy, decision: Decision) -> Applied<'a> {
        Applied {
            zone_conf: found.zone_conf,
            zone: found.zone,
            slot: found.slot,
            policy,
            decision,
        }
    }

    /// Peek (`commit` false: nothing changes) or charge; a sync zone's charge takes the
    /// fleet's grant first.
    #[inline]
    pub fn decide(&mut self, now_ns: u64, commit: bool) -> Decision {
        self.decision = charge_or_peek(self.zone, self.slot, now_ns, &self.policy, commit);
        self.decision
    }

    /// Where the key stands now, charging nothing.
    pub fn stand(&mut self, now_ns: u64) {
        self.decision = self.zone.standing(self.slot, now_ns, &self.policy);
    }

    /// How long the key stays blocked from `now_ns` (`block=`); `None` when it is not, or the
    /// zone has no penalty box.
    #[inline]
    pub fn blocked_for_ns(&self, now_ns: u64) -> Option<u64> {
        self.zone_conf.block?;
        self.zone.blocked_for_ns(self.hash(), now_ns)
    }

    /// Give back a request charged to the key (Lua's `uncommit`, `on_status=`), the fleet's
    /// grant too.
    pub fn uncommit(&self, now_ns: u64) {
        give_back(self.zone, self.slot, &self.policy, now_ns);
    }

    /// What [`give_back`] needs to give this zone's charge back later (after the response).
    pub fn charged(&self) -> Charged {
        Charged {
            zone: *self.zone,
            slot: self.slot,
            policy: self.policy,
        }
    }
}

/// A request charged to a key, to be given back later ([`Charged::give_back`]).
#[derive(Clone, Copy)]
pub struct Charged {
    zone: Zone,
    slot: SlotIndex,
    policy: Policy,
}

impl Charged {
    /// The zone the request was charged in.
    pub fn zone(&self) -> &Zone {
        &self.zone
    }

    /// Give the request back at `now_ns`.
    pub fn give_back(&self, now_ns: u64) {
        give_back(&self.zone, self.slot, &self.policy, now_ns);
    }

    /// Give back `tokens` of what was charged (a usage-based line's settlement, when the
    /// request used less than it reserved).
    pub fn give_back_tokens(&self, tokens: u64, now_ns: u64) {
        let policy = Policy {
            cost: tokens,
            ..self.policy
        };
        give_back(&self.zone, self.slot, &policy, now_ns);
    }

    /// Charge `tokens` more than the door did, into debt up to `debt` tokens past the
    /// bucket's capacity (`None`: one capacity); returns the tokens the bound forgave.
    pub fn charge_into_debt(&self, tokens: u64, debt: Option<u64>, now_ns: u64) -> u64 {
        let debt = if self.policy.algorithm.is_quota() {
            // A quota's debt is one more limit by default: the count may reach twice it.
            debt.unwrap_or_else(|| self.policy.limits.quota_limit())
        } else {
            let Some(bucket) = ratelimit_core::usage::settle::Bucket::of(&self.policy) else {
                return 0;
            };
            debt.unwrap_or_else(|| ratelimit_core::usage::settle::default_debt(&bucket))
        };
        if self.zone.is_sync() {
            return fleet::charge_into_debt(
                &self.zone,
                self.slot,
                now_ns,
                &self.policy,
                tokens,
                debt,
            );
        }
        self.zone
            .charge_into_debt(self.slot, now_ns, &self.policy, tokens, debt)
    }
}

/// Give back a request charged to the key in `slot`, the fleet's grant too.
fn give_back(zone: &Zone, slot: SlotIndex, policy: &Policy, now_ns: u64) {
    if zone.is_sync() {
        fleet::uncommit(zone, slot, now_ns, policy);
    } else {
        zone.uncommit(slot, now_ns, policy);
    }
}

/// One zone's decision for the key in `slot`: a peek changes nothing, a charge of a sync zone
/// takes the fleet's grant first.
#[inline]
fn charge_or_peek(
    zone: &Zone,
    slot: SlotIndex,
    now_ns: u64,
    policy: &Policy,
    commit: bool,
) -> Decision {
    if commit && zone.is_sync() {
        fleet::decide(zone, slot, now_ns, policy)
    } else {
        zone.decide(slot, now_ns, policy, commit)
    }
}

/// A `rate_limit` line applied to a request: its zone and, with `global=`, the global one,
/// with their composed decision.
pub struct AppliedLimit<'a> {
    pub own: Applied<'a>,
    pub global: Option<Applied<'a>>,
    pub decision: Decision,
    /// The line's `on_status=`: its charges are given back after the response unless the
    /// status matches (the request path's business; `None` elsewhere).
    pub on_status: Option<StatusMatcher>,
    /// The line shows in the response's rate limit fields (not `headers=off`).
    pub headers: bool,
}

impl<'a> AppliedLimit<'a> {
    pub fn new(own: Applied<'a>, global: Option<Applied<'a>>) -> AppliedLimit<'a> {
        let decision = own.decision;
        AppliedLimit {
            own,
            global,
            decision,
            on_status: None,
            headers: true,
        }
    }

    /// Peek (commit = false) or charge. With a global bucket, a token is taken from each
    /// bucket that has one and the request passes if either had one.
    fn decide(&mut self, now_ns: u64, commit: bool) -> Decision {
        self.decision = match &mut self.global {
            None => self.own.decide(now_ns, commit),
            Some(global) => {
                self.own.decide(now_ns, false);
                global.decide(now_ns, false);
                if commit {
                    if self.own.decision.outcome != Outcome::Rejected {
                        self.own.decide(now_ns, true);
                    }
                    if global.decision.outcome != Outcome::Rejected {
                        global.decide(now_ns, true);
                    }
                }
                ratelimit_core::token_bucket::compose_global(&self.own.decision, &global.decision)
            }
        };
        self.decision
    }

    /// Record where each zone of this limit stands, charging nothing.
    pub fn stand(&mut self, now_ns: u64) {
        self.own.stand(now_ns);
        if let Some(global) = &mut self.global {
            global.stand(now_ns);
        }
    }

    /// The zones of this limit: its own, then the global one.
    pub fn zones(&self) -> impl Iterator<Item = &Applied<'a>> + Clone {
        core::iter::once(&self.own).chain(self.global.iter())
    }
}

/// What the pipeline says of a request.
#[derive(Clone, Copy, Debug)]
pub struct Verdict {
    /// Passed, delayed (by the limit asking the longest delay) or rejected.
    pub outcome: Outcome,
    /// The limit that rejected the request, or that delays it longest.
    pub by: Option<usize>,
    /// Its decision (for a log line, `Retry-After`, the delay).
    pub decision: Decision,
    /// The limits that were charged, in order (with a rejection, those before it and itself).
    pub charged: usize,
    /// Refused because the key of limit `by` is blocked (`block=`): nothing was charged, and
    /// `decision.retry_after_ns` is the time left of the block.
    pub blocked: bool,
}

/// Whether the pipeline charges the request or only looks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Charge {
    Now,
    Peek,
}

/// Decide a request against all its limits. All must pass, and a request rejected by one
/// is charged to none: with several, every limit is looked at first, then each is charged
/// in order (a charge can still be refused by a request of another worker meanwhile).
pub fn decide(limits: &mut [AppliedLimit], now_ns: u64, charge: Charge) -> Verdict {
    if let Some(verdict) = blocked(limits, now_ns) {
        return verdict;
    }
    let looked_first = limits.len() > 1 || charge == Charge::Peek;
    if looked_first {
        let rejected = limits
            .iter_mut()
            .position(|limit| limit.decide(now_ns, false).outcome == Outcome::Rejected);
        if let Some(index) = rejected {
            return rejected_by(limits, index, 0);
        }
    }
    if charge == Charge::Now {
        for index in 0..limits.len() {
            if limits[index].decide(now_ns, true).outcome == Outcome::Rejected {
                return rejected_by(limits, index, index + 1);
            }
        }
    }
    let charged = if charge == Charge::Now {
        limits.len()
    } else {
        0
    };
    passed(limits, charged)
}

/// The first limit whose key is blocked in its zone (`block=`): the request is refused at
/// once, charged to none. A `global=` zone has no penalty box (configuration refuses it).
#[inline]
pub fn blocked(limits: &mut [AppliedLimit], now_ns: u64) -> Option<Verdict> {
    for index in 0..limits.len() {
        if let Some(left_ns) = limits[index].own.blocked_for_ns(now_ns) {
            return Some(blocked_verdict(limits, index, left_ns, now_ns));
        }
    }
    None
}

/// Limit `index`'s key is blocked for `left_ns` more: every limit shows where it stands.
pub fn blocked_verdict(
    limits: &mut [AppliedLimit],
    index: usize,
    left_ns: u64,
    now_ns: u64,
) -> Verdict {
    for limit in limits.iter_mut() {
        limit.stand(now_ns);
    }
    let standing = limits[index].decision;
    limits[index].decision = Decision {
        outcome: Outcome::Rejected,
        delay_ns: 0,
        retry_after_ns: left_ns,
        remaining: 0,
        reset_ns: standing.reset_ns.max(left_ns),
        excess_milli: standing.excess_milli,
    };
    Verdict {
        outcome: Outcome::Rejected,
        by: Some(index),
        decision: limits[index].decision,
        charged: 0,
        blocked: true,
    }
}

/// The verdict on limits that were all charged, each with its decision: the first that
/// rejected, else the longest delay.
pub fn verdict(limits: &[AppliedLimit]) -> Verdict {
    match limits
        .iter()
        .position(|limit| limit.decision.outcome == Outcome::Rejected)
    {
        Some(index) => rejected_by(limits, index, index + 1),
        None => passed(limits, limits.len()),
    }
}

fn rejected_by(limits: &[AppliedLimit], index: usize, charged: usize) -> Verdict {
    Verdict {
        outcome: Outcome::Rejected,
        by: Some(index),
        decision: limits[index].decision,
        charged,
        blocked: false,
    }
}

/// Every limit let the request through: delayed by the longest delay any asks for.
fn passed(limits: &[AppliedLimit], charged: usize) -> Verdict {
    let mut verdict = Verdict {
        outcome: Outcome::Passed,
        by: None,
        decision: limits
            .first()
            .map_or(Decision::rejected(0, 0, 0), |limit| limit.decision),
        charged,
        blocked: false,
    };
    let mut delay_ns = 0;
    for (index, limit) in limits.iter().enumerate() {
        let decision = limit.decision;
        if decision.outcome == Outcome::Delayed && decision.delay_ns > delay_ns {
            delay_ns = decision.delay_ns;
            verdict = Verdict {
                outcome: Outcome::Delayed,
                by: Some(index),
                decision,
                charged,
                blocked: false,
            };
        }
    }
    verdict
}

/// What [`decide_one`] says of a request.
pub enum One<'a> {
    /// Passed on the quick path: charged and counted, nothing to report.
    Passed,
    /// Charged with its whole decision: to be reported, and accounted for
    /// ([`account_passed`], or [`verdict`] and [`account`]).
    Decided(Applied<'a>),
    /// The key is blocked (`block=`) for this long more: refused, charged nothing (to be
    /// reported with [`blocked_verdict`] and accounted for).
    Blocked(Applied<'a>, u64),
    /// The zone has no limits in force (its memory is not what it should be): not limited.
    Unlimited,
}

/// The request path's common case: one `rate_limit` line without `global=`, charged at once.
/// Unless `report` asks for the decision (to write headers), a request that passes costs
/// only its outcome: a bucket with no per-key override is charged with its precomputed
/// constants ([`BucketCharge`]), another single-word state without the decision's other
/// fields, and the policy is computed only when the request does not pass.
#[inline(always)]
pub fn decide_one<'a>(found: Found<'a>, limit: &LimitConf, now_ns: u64, report: bool) -> One<'a> {
    let (zone, hash, slot) = (found.zone, found.hash(), found.slot);
    if found.zone_conf.block.is_some() {
        if let Some(left_ns) = zone.blocked_for_ns(hash, now_ns) {
            return match Applied::new(found, limit, now_ns) {
                Some(applied) => One::Blocked(applied, left_ns),
                None => One::Unlimited,
            };
        }
    }
    // A sync zone decides through `Applied::decide`, which takes the fleet's grant first.
    if !report && !zone.is_sync() {
        return decide_quick(found, limit, now_ns);
    }
    let Some(policy) = effective_policy(found.zone_conf, zone, limit, hash, now_ns) else {
        return One::Unlimited;
    };
    let decision = charge_or_peek(zone, slot, now_ns, &policy, true);
    One::Decided(Applied::decided(found, policy, decision))
}

/// [`decide_one`] of a line with nothing to report, on a zone without `sync` or `block=`
/// (the caller knows): a request that passes is charged with one compare-and-swap.
#[inline(always)]
pub fn decide_quick<'a>(found: Found<'a>, limit: &LimitConf, now_ns: u64) -> One<'a> {
    let (zone, hash, slot) = (found.zone, found.hash(), found.slot);
    if let Some(charge) = bucket_charge(limit, zone, hash) {
        // The policy is computed only for a request that does not pass (and by the fallback,
        // for a state the constants cannot decide: a product over 64 bits).
        let charged =
            zone.charge_bucket(slot, now_ns, &charge, |state, now| {
                match effective_policy(found.zone_conf, zone, limit, hash, now) {
                    Some(policy) => ratelimit_core::decide_word(state, now, &policy),
                    None => (Decision::rejected(0, 0, 0), None),
                }
            });
        if charged.answer == Outcome::Passed {
            account_passed(zone);
            return One::Passed;
        }
        return decided_from(found, limit, charged.state, charged.now_ns);
    }
    decide_quick_by_policy(found, limit, now_ns)
}

/// The whole decision of a request the quick path did not pass, from the state and the time
/// it was decided at. Out of line: the passing path stays short.
#[inline(never)]
fn decided_from<'a>(found: Found<'a>, limit: &LimitConf, previous: u64, now_ns: u64) -> One<'a> {
    let Some(policy) = effective_policy(found.zone_conf, found.zone, limit, found.hash(), now_ns)
    else {
        return One::Unlimited;
    };
    let decision = ratelimit_core::decide_word(previous, now_ns, &policy).0;
    One::Decided(Applied::decided(found, policy, decision))
}

/// [`decide_quick`] of a key the bucket constants do not decide: a sliding zone, or a key
/// with an override.
#[inline(never)]
fn decide_quick_by_policy<'a>(found: Found<'a>, limit: &LimitConf, now_ns: u64) -> One<'a> {
    let (zone, hash, slot) = (found.zone, found.hash(), found.slot);
    let Some(policy) = effective_policy(found.zone_conf, zone, limit, hash, now_ns) else {
        return One::Unlimited;
    };
    if policy.algorithm.is_single_word() {
        let charged = zone.charge(slot, now_ns, &policy);
        if charged.answer == Outcome::Passed {
            account_passed(zone);
            return One::Passed;
        }
        let decision = ratelimit_core::decide_word(charged.state, charged.now_ns, &policy).0;
        return One::Decided(Applied::decided(found, policy, decision));
    }
    let decision = charge_or_peek(zone, slot, now_ns, &policy, true);
    One::Decided(Applied::decided(found, policy, decision))
}

/// The line's precomputed bucket constants for this key, when they apply: a leaky or token
/// bucket and no per-key override. Recomputed only when the zone's limits change.
#[inline(always)]
fn bucket_charge(limit: &LimitConf, zone: &Zone, hash: u64) -> Option<BucketCharge> {
    if zone.override_for(hash).is_some() {
        return None;
    }
    // A sliding zone caches `None` (BucketCharge::new declines it); the initial (0, None)
    // matches no valid limits word, and would answer `None` anyway.
    let word = zone.limits_word();
    let (cached_word, cached) = limit.charge_cache.get();
    if cached_word == word {
        return cached;
    }
    let charge = Limits::unpack(word).and_then(|mut limits| {
        if let Some(burst) = limit.burst {
            limits.burst = burst;
        }
        BucketCharge::new(&Policy {
            algorithm: zone.algorithm(),
            limits,
            delay: limit.delay,
            cost: limit.cost,
        })
    });
    limit.charge_cache.set((word, charge));
    charge
}

/// A block that a rejection started: what the error log says once.
#[derive(Clone, Copy, Debug)]
pub struct BlockStarted {
    /// The limit whose zone blocked the key.
    pub by: usize,
    pub block: Block,
}

/// After a decision: each zone's counters, the top keys of the zones that delayed, rejected
/// or refused a blocked key, and the penalty box. A rejection counts in the zones of the
/// limit that rejected and blocks the key there when its zone has `block=` (in a dry run
/// too, so that the dry run shows the blocks); a refusal of a blocked key counts as
/// `blocked` in that zone; otherwise every limit counts its own outcome. `key_of` gives a
/// zone's key for the request, asked only for a delay, a rejection or a block (a passing
/// request costs nothing more). Returns the block a rejection started, if it did.
pub fn account(
    limits: &[AppliedLimit],
    verdict: &Verdict,
    dry_run: bool,
    now_ns: u64,
    mut key_of: impl FnMut(&ZoneConf) -> Option<Vec<u8>>,
) -> Option<BlockStarted> {
    if verdict.outcome == Outcome::Rejected {
        let by = verdict.by?;
        let limit = limits.get(by)?;
        if verdict.blocked {
            let counter = if dry_run {
                Counter::BlockedDryRun
            } else {
                Counter::Blocked
            };
            let applied = &limit.own;
            applied.zone.count(counter);
            if let Some(key) = key_of(applied.zone_conf) {
                applied.zone.record_top(TopKind::Blocked, now_ns, &key);
            }
            return None;
        }
        let counter = if dry_run {
            Counter::RejectedDryRun
        } else {
            Counter::Rejected
        };
        let mut started = None;
        for applied in limit.zones() {
            applied.zone.count(counter);
            let Some(key) = key_of(applied.zone_conf) else {
                continue;
            };
            applied.zone.record_top(TopKind::Rejected, now_ns, &key);
            // A sync zone also refuses a key for want of the fleet's grant (a new key's first
            // request, before a round gave it one): that blocks only when the key is over its
            // limit by what this instance knows of the fleet.
            let over_limit = || {
                !applied.zone.is_sync()
                    || applied
                        .zone
                        .decide(applied.slot, now_ns, &applied.policy, false)
                        .outcome
                        == Outcome::Rejected
            };
            if let Some(policy) = applied.zone_conf.block.as_ref().filter(|_| over_limit()) {
                let before = applied.zone.block_word(applied.hash());
                let block = applied.zone.change_block(
                    applied.hash(),
                    &key,
                    now_ns,
                    BlockChange::Rejected,
                    policy,
                );
                if block.is_none() {
                    // A full table keeps its blocks: the key stays rate-limited only.
                    applied.zone.count(Counter::BlockNotRecorded);
                }
                if let Some(block) = block.filter(|_| before.blocked_for_ns(now_ns).is_none()) {
                    started = Some(BlockStarted { by, block });
                    if applied.zone.is_sync() {
                        // The fleet gets the block now, not at the next round.
                        super::wake_sync_loop();
                    }
                }
            }
        }
        return started;
    }
    for limit in limits {
        let delayed = limit.decision.outcome == Outcome::Delayed;
        let counter = match (delayed, dry_run) {
            (false, _) => Counter::Passed,
            (true, false) => Counter::Delayed,
            (true, true) => Counter::DelayedDryRun,
        };
        for applied in limit.zones() {
            applied.zone.count(counter);
            if delayed {
                if let Some(key) = key_of(applied.zone_conf) {
                    applied.zone.record_top(TopKind::Delayed, now_ns, &key);
                }
            }
        }
    }
    None
}

/// [`account`] for a request one zone let through.
#[inline]
pub fn account_passed(zone: &Zone) {
    zone.count(Counter::Passed);
}
