//! One outcome path for every front door: a [`Verdict`] becomes one [`Action`] (go on, delay,
//! refuse) and a [`LimitStatus`], with its log lines, counters, top keys and the block a
//! rejection starts, here and only here. The http door maps the action to a 429/503, a gRPC
//! answer or a delay timer; the stream door to a close or a delay.

use core::ptr;

use ngx::ffi::{ngx_log_t, ngx_uint_t, ngx_variable_value_t};
use ngx::ngx_log_error;
use ratelimit_core::penalty::duration_text;
use ratelimit_core::{Outcome, Policy};

use super::decide::{self, AppliedLimit, BlockStarted, Verdict};
use crate::conf::ZoneConf;
use crate::glue::value_bits;

/// `$rate_limit_status` values; 0 means no limit applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum LimitStatus {
    Passed = 1,
    Delayed = 2,
    Rejected = 3,
    DelayedDryRun = 4,
    RejectedDryRun = 5,
    /// Waited in a concurrency zone's queue, then went through.
    Queued = 6,
    /// Refused because the key is blocked (`block=`).
    Blocked = 7,
    BlockedDryRun = 8,
}

impl LimitStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            LimitStatus::Passed => "PASSED",
            LimitStatus::Delayed => "DELAYED",
            LimitStatus::Rejected => "REJECTED",
            LimitStatus::DelayedDryRun => "DELAYED_DRY_RUN",
            LimitStatus::RejectedDryRun => "REJECTED_DRY_RUN",
            LimitStatus::Queued => "QUEUED",
            LimitStatus::Blocked => "BLOCKED",
            LimitStatus::BlockedDryRun => "BLOCKED_DRY_RUN",
        }
    }
}

/// Where a request's or a session's outcome is kept: `$rate_limit_status`'s own value in
/// `r->variables` or `s->variables` (http and stream variable values are one C type). A set
/// value means "limited already": internal redirects keep variable values, subrequests share
/// them, and a delayed session finds it when its phases run again.
#[derive(Clone, Copy)]
pub struct StatusValue {
    value: *mut ngx_variable_value_t,
}

impl StatusValue {
    /// # Safety
    /// `value` is the status variable's live value in a request's or a session's variables,
    /// valid for as long as the copies of the result are used.
    pub unsafe fn new(value: *mut ngx_variable_value_t) -> StatusValue {
        StatusValue { value }
    }

    pub fn is_set(self) -> bool {
        let bits = value_bits::read(self.value);
        bits & value_bits::VALID != 0 && bits & value_bits::LEN != 0
    }

    /// Whether the outcome stored is `status` (the static text it was set to).
    pub fn is(self, status: LimitStatus) -> bool {
        let bits = value_bits::read(self.value);
        let text = status.as_str();
        // SAFETY: `value` points into the live request's or session's variables.
        let data = unsafe { (*self.value).data };
        bits & value_bits::VALID != 0
            && (bits & value_bits::LEN) as usize == text.len()
            && ptr::eq(data.cast_const(), text.as_ptr())
    }

    pub fn set(self, status: LimitStatus) {
        let text = status.as_str();
        // SAFETY: `value` points into the live variables; the text is static.
        unsafe { (*self.value).data = text.as_ptr().cast_mut() };
        // The whole word, cacheable: `escape` is never set on this variable, and nginx's
        // flushed-variable lookups return the value as it is.
        value_bits::write_all(self.value, text.len() as u32 | value_bits::VALID);
    }
}

/// What a door tells the outcome path about itself.
pub struct Door {
    /// What its log lines limit: `"request"` or `"connection"`.
    pub noun: &'static str,
    pub log: *mut ngx_log_t,
    /// The level of rejections (`rate_limit_log_level`); delays are logged at `delay_level`.
    pub level: ngx_uint_t,
    pub delay_level: ngx_uint_t,
    pub dry_run: bool,
    /// The door shows where each zone stands (response headers): after a rejection the zones
    /// not charged are looked at again.
    pub shows_standing: bool,
}

/// What the door does with the request or session.
#[derive(Debug, PartialEq, Eq)]
pub enum Action<'z> {
    /// Go on: it passed, or a dry run let it.
    Proceed,
    /// Hold it this many nanoseconds, then go on.
    Delay(u64),
    /// Refuse it.
    Refuse(Refused<'z>),
}

/// A refusal: why, by which zone, and what it is told about coming back.
#[derive(Debug, PartialEq, Eq)]
pub struct Refused<'z> {
    /// `rate limited`, `key blocked`, ... (gRPC's `grpc-message` says it).
    pub reason: &'static str,
    pub zone: &'z str,
    pub wait: Wait,
}

/// When a refused request may come back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// After this many nanoseconds.
    After(u64),
    /// Never: no wait lets it through.
    Never,
    /// Not said (the line has `headers=off`).
    Unsaid,
}

/// A verdict settled: the status to record and the action to take.
#[derive(Debug)]
pub struct Settled<'z> {
    pub status: LimitStatus,
    pub action: Action<'z>,
}

/// Settle a verdict: its log lines, the zones' counters and top keys, the block a rejection
/// starts ([`decide::account`]), and what the door does next. `key_of` copies the key of a
/// zone (asked only for delayed, rejected and blocked requests).
pub fn settle<'z>(
    door: &Door,
    applied: &mut [AppliedLimit<'z>],
    verdict: &Verdict,
    now: u64,
    key_of: impl FnMut(&ZoneConf) -> Option<Vec<u8>>,
) -> Settled<'z> {
    let dry_run = door.dry_run;
    let dry = if dry_run { ", dry run" } else { "" };
    let decision = verdict.decision;
    let settled = |real, dry_status, action| {
        if dry_run {
            Settled {
                status: dry_status,
                action: Action::Proceed,
            }
        } else {
            Settled {
                status: real,
                action,
            }
        }
    };

    if let (Outcome::Rejected, true) = (verdict.outcome, verdict.blocked) {
        // A blocked key: no log line (the block's start said it once), nothing charged.
        decide::account(applied, verdict, dry_run, now, key_of);
        let by = verdict.by.unwrap_or(0);
        let refused = Refused {
            reason: "key blocked",
            zone: zone_name(applied, by),
            wait: shown(applied, by, decision.retry_after_ns),
        };
        return settled(
            LimitStatus::Blocked,
            LimitStatus::BlockedDryRun,
            Action::Refuse(refused),
        );
    }

    if let (Outcome::Rejected, Some(index)) = (verdict.outcome, verdict.by) {
        if door.shows_standing {
            // The other zones show where they stand: those charged before a late rejection
            // as charged, the rest unchanged.
            let charged = verdict.charged.saturating_sub(1);
            for (position, limit) in applied.iter_mut().enumerate().skip(charged) {
                if position != index {
                    limit.stand(now);
                }
            }
        }
        let zone = zone_name(applied, index);
        if decision.never_passes() {
            log_never_passes(
                door,
                &applied[index].own.policy,
                decision.excess_milli,
                zone,
            );
        } else {
            ngx_log_error!(
                door.level,
                door.log,
                "limiting {}s{dry}, excess: {} by zone \"{zone}\"",
                door.noun,
                format_excess(decision.excess_milli)
            );
        }
        let started = decide::account(applied, verdict, dry_run, now, key_of);
        let mut retry_after_ns = decision.retry_after_ns;
        if let Some(started) = started {
            log_block(door, applied, &started);
            retry_after_ns = retry_after_ns.max(started.block.until_ns.saturating_sub(now));
        }
        // No wait lets a request through that costs more than the zone ever admits at once:
        // it gets the status alone.
        let wait = if decision.never_passes() {
            Wait::Never
        } else {
            shown(applied, index, retry_after_ns)
        };
        let refused = Refused {
            reason: "rate limited",
            zone,
            wait,
        };
        return settled(
            LimitStatus::Rejected,
            LimitStatus::RejectedDryRun,
            Action::Refuse(refused),
        );
    }

    decide::account(applied, verdict, dry_run, now, key_of);
    let (Outcome::Delayed, Some(index)) = (verdict.outcome, verdict.by) else {
        return Settled {
            status: LimitStatus::Passed,
            action: Action::Proceed,
        };
    };
    ngx_log_error!(
        door.delay_level,
        door.log,
        "delaying {}{dry}, excess: {}, by zone \"{}\"",
        door.noun,
        format_excess(decision.excess_milli),
        zone_name(applied, index)
    );
    settled(
        LimitStatus::Delayed,
        LimitStatus::DelayedDryRun,
        Action::Delay(decision.delay_ns),
    )
}

/// The name of line `by`'s own zone, for as long as the zones live.
fn zone_name<'z>(applied: &[AppliedLimit<'z>], by: usize) -> &'z str {
    let zone_conf: &'z ZoneConf = applied[by].own.zone_conf;
    &zone_conf.name
}

/// The wait a refusal by line `by` shows: none for a line with `headers=off`.
fn shown(applied: &[AppliedLimit], by: usize, wait_ns: u64) -> Wait {
    match applied.get(by) {
        Some(limit) if !limit.headers => Wait::Unsaid,
        _ => Wait::After(wait_ns),
    }
}

/// The rejection line of a request no wait lets through: limit_req's line, then why.
#[cold]
#[inline(never)]
fn log_never_passes(door: &Door, policy: &Policy, excess_milli: u64, zone: &str) {
    let dry = if door.dry_run { ", dry run" } else { "" };
    ngx_log_error!(
        door.level,
        door.log,
        "limiting {}s{dry}, excess: {} by zone \"{zone}\"; cost {} can never pass \
         (at most {} at once)",
        door.noun,
        format_excess(excess_milli),
        policy.cost,
        policy.max_cost()
    );
}

/// The error-log line of a block that a rejection started: once per block, not per request.
#[cold]
fn log_block(door: &Door, applied: &[AppliedLimit], started: &BlockStarted) {
    let dry = if door.dry_run { ", dry run" } else { "" };
    let zone_conf = applied[started.by].own.zone_conf;
    let block_max = zone_conf.block.map_or(0, |policy| policy.block_max_ns);
    ngx_log_error!(
        door.level,
        door.log,
        "blocking the key{dry} for {}, level {} (block_max {}), by zone \"{}\"",
        duration_text(started.block.duration_ns()),
        started.block.level,
        duration_text(block_max),
        zone_conf.name
    );
}

/// A key evaluated by a door, copied for the top keys and the penalty box (an empty key is
/// none).
#[cold]
pub fn owned_key(key: Option<&[u8]>) -> Option<Vec<u8>> {
    key.filter(|key| !key.is_empty()).map(<[u8]>::to_vec)
}

/// limit_req's "excess: 1.500": whole requests and thousandths.
fn format_excess(excess_milli: u64) -> String {
    format!("{}.{:03}", excess_milli / 1000, excess_milli % 1000)
}
