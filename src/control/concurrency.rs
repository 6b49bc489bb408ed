//! Concurrency zones: a request takes slots of its key, waits in the key's queue, and gives
//! its slots back exactly once, however it ends. The front doors (the request path, Lua) call
//! [`arrive`]; what a request holds is a [`Holding`] in its pool, whose cleanup gives the
//! slots back when the request is freed (response sent, client gone, upstream error or
//! timeout, internal redirect: nginx frees a request's pool once, at its very end). The slots
//! of a worker that died come back when the master starts its replacement ([`reclaim`]).
//!
//! The arithmetic is `ratelimit_core::concurrency` (slots and queue) and
//! `ratelimit_core::adaptive` (the limit of `limit=adaptive`); the words are the store's.

use core::mem;
use core::ptr;
use core::sync::atomic::Ordering;

use ngx::ffi::{
    ngx_cycle_t, ngx_http_request_t, ngx_http_upstream_state_t, ngx_log_t, ngx_pool_cleanup_add,
    ngx_pool_t, NGX_LOG_NOTICE,
};
use ngx::ngx_log_error;
use ratelimit_core::adaptive::{
    bucket_position, histogram_add, AdaptiveBounds, AdaptiveLimit, Phase, Window,
};
use ratelimit_core::concurrency::{
    self as arithmetic, Arrival as Step, ConcurrencyLimit, ConcurrencyLimits,
};
use ratelimit_core::NANOS_PER_SEC;

use super::queue;
use super::tickets::{key_ceiling, key_limit, process_slot, skip_stale_head};
use crate::conf::{registry, ZoneConf};
use crate::glue::now_ns;
use crate::store::concurrency::KeyWords;
use crate::store::{SlotIndex, Zone};

/// One concurrency line applied to a request: its key's slot and what the line asks.
#[derive(Clone, Copy)]
pub struct Line<'a> {
    pub zone_conf: &'a ZoneConf,
    pub zone: Zone,
    pub slot: SlotIndex,
    pub hash: u64,
    pub cost: u64,
    /// The line's `burst=`: its queue's places, in place of the zone's `queue=`.
    pub queue: Option<u64>,
}

/// What became of a request at a concurrency line.
pub enum Arrival {
    /// It holds its slots; the key's requests in flight now, and its limit.
    Admitted { in_flight: u32, limit: u32 },
    /// It waits in the queue with this id in the worker's queue: its owner is told when it is
    /// its turn (or it gave up).
    Queued { waiter: u64 },
    /// Over the limit, and the queue is full (or there is none).
    Rejected(Refusal),
    /// In dry run: the request goes on without slots; `queued` tells whether it would have
    /// waited rather than been rejected.
    DryRun { queued: bool, refusal: Refusal },
    /// The zone's memory is not what it should be, or no memory for the request's record:
    /// not limited.
    Unlimited,
}

/// Where the key stood when a request was refused: for the log line and `Retry-After`.
#[derive(Clone, Copy, Debug)]
pub struct Refusal {
    pub in_flight: u32,
    pub queued: u32,
    pub limit: u32,
    pub retry_after_ns: u64,
}

/// What a request holds of one key, in its pool: given back by the pool's cleanup unless
/// given back before ([`Holding::release`]).
pub struct Holding {
    zone: Zone,
    slot: SlotIndex,
    hash: u64,
    cost: u64,
    /// The adaptive limit's epoch when the slots were taken.
    epoch: u16,
    /// When the slots were taken (monotonic ns).
    admitted_ns: u64,
    /// The request's latency as measured after the response ([`Holding::measure`]); 0: not
    /// measured, the time from `admitted_ns` to the release is used.
    latency_ns: u64,
    /// The process whose lane counts these slots (nginx's process slot).
    process_slot: usize,
    state: HoldState,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HoldState {
    /// Waiting in the queue with this ticket; the worker's queue knows it by `waiter`.
    Waiting {
        ticket: u16,
        waiter: u64,
    },
    Held,
    Released,
}

/// The adaptive bounds of a zone's limits, if adaptive.
fn bounds_of(limits: &ConcurrencyLimits) -> Option<AdaptiveBounds> {
    match limits.limit {
        ConcurrencyLimit::Adaptive(bounds) => Some(bounds),
        ConcurrencyLimit::Fixed(_) => None,
    }
}

/// A request of `line.cost` arrives at its key. Its record goes into `pool`; if it has to
/// wait, `owner` says who waits (the request path resumes the request, Lua polls).
pub fn arrive(
    pool: *mut ngx_pool_t,
    line: &Line,
    now_ns: u64,
    dry_run: bool,
    owner: queue::Owner,
) -> Arrival {
    let Some(limits) = line.zone.concurrency_limits() else {
        return Arrival::Unlimited;
    };
    // The key's slot pinned while it arrives (found again if the key lost it since it was
    // found); none when every slot of its window holds requests: refused.
    let Some(words) = line.zone.key_words_to_charge(line.slot, now_ns) else {
        return Arrival::Rejected(Refusal {
            in_flight: 0,
            queued: 0,
            limit: 0,
            retry_after_ns: arithmetic::retry_after_ns(0),
        });
    };
    let line = &Line {
        slot: words.slot(),
        ..*line
    };
    let Some(conf) = line.zone_conf.concurrency.as_ref() else {
        return Arrival::Unlimited;
    };
    let queue_places = line.queue.map_or(limits.queue, |places| {
        places.min(u64::from(arithmetic::MAX_QUEUE)) as u32
    });
    let (limit, epoch) = key_limit(&line.zone, &words, &limits, now_ns);
    let ceiling = key_ceiling(&words, &limits, limit);
    let refusal = |word: u64| {
        let slots = arithmetic::Slots::unpack(word);
        Refusal {
            in_flight: slots.in_flight,
            queued: slots.queued(),
            limit,
            retry_after_ns: retry_after_ns(&words, &limits),
        }
    };
    if dry_run {
        let word = words.slots.load(Ordering::Acquire);
        let (step, _) = arithmetic::arrive_within(word, line.cost, limit, ceiling, queue_places);
        match step {
            Step::Admitted => {}
            Step::Queued { .. } => {
                return Arrival::DryRun {
                    queued: true,
                    refusal: refusal(word),
                }
            }
            Step::Rejected => {
                return Arrival::DryRun {
                    queued: false,
                    refusal: refusal(word),
                }
            }
        }
    }
    // The record first: once slots are taken, nothing may fail before they are recorded.
    let Some(holding) = new_holding(pool, line, epoch, now_ns) else {
        return Arrival::Unlimited;
    };
    let mut current = words.slots.load(Ordering::Acquire);
    let mut stale_checked = false;
    let mut marked = false;
    loop {
        let (step, next) =
            arithmetic::arrive_within(current, line.cost, limit, ceiling, queue_places);
        let Some(next) = next else {
            if !stale_checked && arithmetic::Slots::unpack(current).queued() > 0 {
                // A queue full of a dead worker's tickets must not refuse the key for ever.
                stale_checked = true;
                skip_stale_head(&words, conf.queue_timeout_ns, now_ns);
                current = words.slots.load(Ordering::Acquire);
                continue;
            }
            if marked {
                tickets_settled(line, &words);
            }
            if let Some(lease) = words.lease {
                // The fleet is asked for what was refused at the next round.
                lease.refused.fetch_add(1, Ordering::Relaxed);
            }
            return Arrival::Rejected(refusal(current));
        };
        match step {
            Step::Queued { first, .. } => {
                // Owned before it is taken: whoever sweeps this process's lane empties the
                // queue.
                if !marked {
                    words.mark_tickets(process_slot());
                    marked = true;
                }
                if first {
                    // The head's time before the word that makes this ticket the head.
                    words.head_since.store(now_ns, Ordering::Release);
                }
            }
            Step::Admitted | Step::Rejected if marked => {
                tickets_settled(line, &words);
                marked = false;
            }
            Step::Admitted | Step::Rejected => {}
        }
        match words
            .slots
            .compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {
                // SAFETY: `holding` was just written into the request's pool by
                // `new_holding` and nothing else refers to it yet.
                let record = unsafe { &mut *holding };
                return match step {
                    Step::Admitted => {
                        record.admitted(&words, now_ns, next);
                        Arrival::Admitted {
                            in_flight: arithmetic::Slots::unpack(next).in_flight,
                            limit,
                        }
                    }
                    Step::Queued { ticket, .. } => {
                        let deadline_ns = now_ns.saturating_add(conf.queue_timeout_ns);
                        let waiter = queue::wait(queue::Waiter::new(
                            queue::Key {
                                zone: line.zone,
                                slot: line.slot,
                                hash: line.hash,
                                cost: line.cost,
                            },
                            ticket,
                            queue_places,
                            deadline_ns,
                            conf.queue_timeout_ns,
                            holding,
                            owner,
                        ));
                        record.state = HoldState::Waiting { ticket, waiter };
                        Arrival::Queued { waiter }
                    }
                    Step::Rejected => Arrival::Rejected(refusal(current)),
                };
            }
            Err(actual) => current = actual,
        }
    }
}

/// A first ticket of this worker may have been marked for a ticket it did not take: unmark
/// it unless the worker holds tickets of the key.
fn tickets_settled(line: &Line, words: &KeyWords) {
    if !queue::holds_tickets(&line.zone, line.slot, line.hash) {
        words.unmark_tickets(process_slot());
    }
}

/// What a request of `line.cost` would get now, charging nothing (Lua's `incoming` without
/// `commit`): admitted, queued or refused, with where the key stands.
pub fn peek(line: &Line, now_ns: u64) -> Option<(Peek, Refusal)> {
    let words = line.zone.key_words(line.slot)?;
    let limits = line.zone.concurrency_limits()?;
    let queue_places = line.queue.map_or(limits.queue, |places| {
        places.min(u64::from(arithmetic::MAX_QUEUE)) as u32
    });
    let (limit, _) = key_limit(&line.zone, &words, &limits, now_ns);
    let word = words.slots.load(Ordering::Acquire);
    let slots = arithmetic::Slots::unpack(word);
    let standing = Refusal {
        in_flight: slots.in_flight,
        queued: slots.queued(),
        limit,
        retry_after_ns: retry_after_ns(&words, &limits),
    };
    let peek = match arithmetic::arrive(word, line.cost, limit, queue_places).0 {
        Step::Admitted => Peek::Admitted,
        Step::Queued { .. } => Peek::Queued,
        Step::Rejected => Peek::Rejected,
    };
    Some((peek, standing))
}

/// What [`peek`] says a request would get.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peek {
    Admitted,
    Queued,
    Rejected,
}

/// `Retry-After` for a refused request: the key's latency estimate (adaptive), at least 1 s.
fn retry_after_ns(words: &KeyWords, limits: &ConcurrencyLimits) -> u64 {
    let latency_ns = match (words.adaptive, bounds_of(limits)) {
        (Some(adaptive), Some(bounds)) => adaptive
            .load(&bounds)
            .map_or(0, |state| u64::from(state.last_median_us) * 1000),
        _ => 0,
    };
    arithmetic::retry_after_ns(latency_ns)
}

/// A record for the request's pool, released by the pool's cleanup; `None` without memory.
fn new_holding(
    pool: *mut ngx_pool_t,
    line: &Line,
    epoch: u16,
    now_ns: u64,
) -> Option<*mut Holding> {
    // SAFETY: `pool` is the live request's pool; the cleanup's data is `size` bytes of it,
    // aligned for any type of up to NGX_ALIGNMENT (8), which Holding's fields need.
    let cleanup = unsafe { ngx_pool_cleanup_add(pool, mem::size_of::<Holding>()) };
    // SAFETY: checked non-null; a fresh cleanup whose data nobody reads before the write.
    let cleanup = unsafe { cleanup.as_mut() }?;
    let holding = cleanup.data.cast::<Holding>();
    if holding.is_null() {
        return None;
    }
    // SAFETY: `holding` points to `size_of::<Holding>()` bytes of the pool, suitably aligned.
    unsafe {
        holding.write(Holding {
            zone: line.zone,
            slot: line.slot,
            hash: line.hash,
            cost: line.cost,
            epoch,
            admitted_ns: now_ns,
            latency_ns: 0,
            process_slot: process_slot(),
            state: HoldState::Released,
        })
    };
    cleanup.handler = Some(HOLDING_CLEANUP);
    Some(holding)
}

/// The cleanup handler of every [`Holding`], by which a request's holdings are found among
/// its pool's cleanups (one instance: never inlined).
const HOLDING_CLEANUP: unsafe extern "C" fn(*mut core::ffi::c_void) = holding_cleanup;

/// The pool's cleanup: give the slots back, or the queue's place.
#[inline(never)]
unsafe extern "C" fn holding_cleanup(data: *mut core::ffi::c_void) {
    crate::glue::guard::entry(
        "control::concurrency::holding_cleanup",
        || (),
        || {
            // SAFETY: `data` is the Holding written by `new_holding`, alive until the pool's memory
            // is freed after its cleanups ran.
            let Some(holding) = (unsafe { data.cast::<Holding>().as_mut() }) else {
                return;
            };
            holding.end(now_ns());
        },
    )
}

impl Holding {
    /// The request got its slots (at once or from the queue): its lane counts them, the
    /// window's peak sees them.
    fn admitted(&mut self, words: &KeyWords, now_ns: u64, word: u64) {
        words.lane_add(self.process_slot, self.cost);
        if let Some(adaptive) = words.adaptive {
            let in_flight = u64::from(arithmetic::Slots::unpack(word).in_flight);
            adaptive.peak.fetch_max(in_flight, Ordering::AcqRel);
        }
        self.admitted_ns = now_ns;
        self.state = HoldState::Held;
    }

    /// Whether this record holds slots of the key in `slot` of `zone`.
    pub fn is_held_for(&self, zone: &Zone, slot: SlotIndex) -> bool {
        self.state == HoldState::Held && zone.is_same(&self.zone) && slot == self.slot
    }

    /// Note the request's latency: the time since its admission, capped at its upstream's
    /// time (`$upstream_response_time`, 1 ms resolution, plus that millisecond) when it had
    /// one, so that a slow client's download does not count as the upstream's latency.
    pub fn measure(&mut self, upstream_ms: Option<u64>, now_ns: u64) {
        if self.state != HoldState::Held {
            return;
        }
        let own = now_ns.saturating_sub(self.admitted_ns).max(1);
        self.latency_ns = match upstream_ms {
            Some(ms) => own.min(ms.saturating_add(1).saturating_mul(1_000_000)),
            None => own,
        };
    }

    /// Note a latency given by the caller (Lua's `leaving(key, latency)`).
    pub fn set_latency(&mut self, latency_ns: u64) {
        self.latency_ns = latency_ns.max(1);
    }

    /// Give the slots back now (the request is rejected by a later limit, Lua's `leaving`);
    /// the pool's cleanup then has nothing to do. `sample`: the latency counts for an
    /// adaptive limit. Returns the key's requests in flight after.
    pub fn release(&mut self, now_ns: u64, sample: bool) -> u32 {
        match self.state {
            HoldState::Held => {
                if !sample {
                    self.latency_ns = u64::MAX;
                }
                self.give_back(now_ns)
            }
            HoldState::Waiting { waiter, .. } => {
                queue::abandon(waiter);
                self.state = HoldState::Released;
                self.in_flight()
            }
            HoldState::Released => self.in_flight(),
        }
    }

    /// The request ends (its pool's cleanup).
    fn end(&mut self, now_ns: u64) {
        self.release(now_ns, true);
    }

    fn in_flight(&self) -> u32 {
        self.zone
            .key_words(self.slot)
            .map_or(0, |words| words.load().in_flight)
    }

    fn give_back(&mut self, now_ns: u64) -> u32 {
        self.state = HoldState::Released;
        let Some(words) = self.zone.key_words(self.slot) else {
            return 0;
        };
        // A key holding slots is never evicted; the check keeps a bug from counting against
        // another key.
        if self.zone.hash_at(self.slot) != self.hash {
            return 0;
        }
        words.lane_sub(self.process_slot, self.cost);
        let cost = self.cost;
        let mut current = words.slots.load(Ordering::Acquire);
        let after = loop {
            let next = arithmetic::release(current, cost);
            match words.slots.compare_exchange_weak(
                current,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break next,
                Err(actual) => current = actual,
            }
        };
        queue::slots_freed();
        if self.latency_ns != u64::MAX {
            // Never more than the time the slots were held: a caller's own measure (Lua) may
            // include its wait in the queue.
            let held_ns = now_ns.saturating_sub(self.admitted_ns).max(1);
            let latency_ns = match self.latency_ns {
                0 => held_ns,
                measured => measured.min(held_ns),
            };
            sample(&self.zone, &words, self.epoch, latency_ns, now_ns);
        }
        arithmetic::Slots::unpack(after).in_flight
    }

    /// If this record waits with ticket `waiter`, stop waiting (the ticket stays as a place in
    /// the queue until it reaches the head).
    pub(super) fn abandon_ticket(&mut self, waiter: u64) {
        if let HoldState::Waiting { waiter: id, .. } = self.state {
            if id == waiter {
                queue::abandon(waiter);
                self.state = HoldState::Released;
            }
        }
    }
}

impl queue::Record for Holding {
    /// The queued request's turn came (the queue admitted it): it holds its slots now.
    fn turn_taken(&mut self, words: &KeyWords, now_ns: u64, word: u64) {
        if let Some(limits) = self.zone.concurrency_limits() {
            self.epoch = key_limit(&self.zone, words, &limits, now_ns).1;
        }
        self.admitted(words, now_ns, word);
    }

    /// The queued request queued again with a new ticket.
    fn requeued(&mut self, new_ticket: u16) {
        if let HoldState::Waiting { ticket, .. } = &mut self.state {
            *ticket = new_ticket;
        }
    }

    /// The queued request gave up, or its place was taken from it.
    fn left_queue(&mut self) {
        self.state = HoldState::Released;
    }
}

/// One latency sample for an adaptive key, closing its window when due. A sample of a request
/// admitted before a probe does not count, but still closes a probe whose time is up.
fn sample(zone: &Zone, words: &KeyWords, epoch: u16, latency_ns: u64, now_ns: u64) {
    let (Some(adaptive), Some(bounds)) = (
        words.adaptive,
        zone.concurrency_limits().as_ref().and_then(bounds_of),
    ) else {
        return;
    };
    let Some(mut state) = adaptive.load(&bounds) else {
        return;
    };
    let latency_us = latency_ns.div_ceil(1000);
    if state.no_load_us == 0 {
        // A new key's first sample is its histogram's reference: once, under the lock.
        let _lock = zone.lock();
        let Some(mut fresh) = adaptive.load(&bounds) else {
            return;
        };
        if fresh.seed(latency_us) {
            adaptive.store(&fresh);
        }
        state = fresh;
    }
    if state.accepts(epoch) {
        let bucket = state.bucket(latency_us);
        let (index, _) = bucket_position(bucket);
        let word = &adaptive.histogram[index];
        let mut current = word.load(Ordering::Acquire);
        // A full count drops the sample; the window is due then.
        while let Some(next) = histogram_add(current, bucket) {
            match word.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(actual) => current = actual,
            }
        }
    }
    let peak = adaptive.peak.load(Ordering::Acquire) as u32;
    if !state.due(now_ns, &Window::unpack(&adaptive.histogram_words(), peak)) {
        return;
    }
    // One worker closes the window: under the zone's lock (released by the master if the
    // worker dies holding it), on the state as it is then.
    let _lock = zone.lock();
    let Some(mut state) = adaptive.load(&bounds) else {
        return;
    };
    let peak = adaptive.peak.load(Ordering::Acquire) as u32;
    if !state.due(now_ns, &Window::unpack(&adaptive.histogram_words(), peak)) {
        return;
    }
    let histogram = adaptive.take_histogram();
    let in_flight = u64::from(words.load().in_flight);
    let peak = adaptive.peak.swap(in_flight, Ordering::AcqRel) as u32;
    state.close_window(&bounds, now_ns, &Window::unpack(&histogram, peak));
    adaptive.store(&state);
}

/// The owner sweep of this process's lanes. In a worker at start: give back the slots the
/// previous holder of this process slot held when it died, and empty the queues it held
/// tickets in (nginx's master starts a crashed worker's replacement in its slot; a worker
/// that exited normally left its lanes empty). In a worker at exit (`exiting`): the same for
/// what it leaves behind (requests its exit aborts, after `worker_shutdown_timeout`).
pub fn reclaim(cycle: &ngx_cycle_t, exiting: bool) {
    if !crate::glue::is_worker_process() {
        return;
    }
    let now = now_ns();
    let Some(registry) = registry::of(cycle) else {
        return;
    };
    let process_slot = process_slot();
    for zone_conf in registry.zones() {
        let Some(zone) = zone_conf
            .zone
            .filter(|zone| zone.algorithm().counts_in_flight())
        else {
            continue;
        };
        let mut given_back = 0;
        let mut tickets_dropped = 0;
        for (_, words) in zone.concurrency_keys() {
            let (held, tickets) = words.lane_take(process_slot);
            if tickets {
                tickets_dropped += u64::from(words.reset_queue(now));
            }
            if held == 0 {
                continue;
            }
            given_back += held;
            let mut current = words.slots.load(Ordering::Acquire);
            loop {
                let next = arithmetic::release(current, held);
                match words.slots.compare_exchange_weak(
                    current,
                    next,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => break,
                    Err(actual) => current = actual,
                }
            }
        }
        if given_back > 0 || tickets_dropped > 0 {
            log_reclaimed(
                cycle.log,
                &zone_conf.name,
                (given_back, tickets_dropped),
                process_slot,
                exiting,
            );
        }
    }
}

fn log_reclaimed(
    log: *mut ngx_log_t,
    zone: &str,
    (slots, tickets): (u64, u64),
    process_slot: usize,
    exiting: bool,
) {
    let plural = if slots == 1 { "" } else { "s" };
    let whose = if exiting {
        "held by this exiting process".to_string()
    } else {
        format!(
            "held by the process that ran in process slot {process_slot} before this one and died"
        )
    };
    ngx_log_error!(
        NGX_LOG_NOTICE,
        log,
        "rate_limit zone \"{zone}\": gave back {slots} slot{plural} and emptied queues of \
         {tickets} tickets {whose}"
    );
}

/// The request's time at its upstream, in ms: the sum of `$upstream_response_time`'s values;
/// `None` when it had none.
pub fn upstream_ms(r: &ngx_http_request_t) -> Option<u64> {
    // SAFETY: `upstream_states` is null or an array of upstream states in the request's pool.
    let states = unsafe { r.upstream_states.as_ref() }?;
    // SAFETY: nginx keeps `ngx_http_upstream_state_t` elements in this array.
    let states = unsafe { crate::glue::array_slice::<ngx_http_upstream_state_t>(states) };
    let mut total = None;
    for state in states {
        // (ngx_msec_t) -1: the attempt did not finish.
        if state.response_time != ngx::ffi::ngx_msec_t::MAX {
            total = Some(total.unwrap_or(0) + state.response_time as u64);
        }
    }
    total
}

/// Call `each` on every holding in a request's pool (newest first).
///
/// # Safety
/// `pool` is null or the pool of a live request.
pub unsafe fn each_holding(pool: *mut ngx_pool_t, mut each: impl FnMut(&mut Holding)) {
    // SAFETY: the caller's contract; a pool's cleanup list is a null-terminated linked list.
    let mut cleanup = unsafe { pool.as_ref() }.map_or(ptr::null_mut(), |pool| pool.cleanup);
    while !cleanup.is_null() {
        // SAFETY: a node of the pool's cleanup list, in the pool's memory.
        let node = unsafe { &*cleanup };
        let ours = node
            .handler
            .is_some_and(|handler| core::ptr::fn_addr_eq(handler, HOLDING_CLEANUP));
        if ours {
            // SAFETY: every cleanup with this handler carries a Holding (`new_holding`), and
            // nothing else borrows it while the request's code runs.
            if let Some(holding) = unsafe { node.data.cast::<Holding>().as_mut() } {
                each(holding);
            }
        }
        cleanup = node.next;
    }
}

/// A Lua call stops waiting for ticket `id` (it cannot wait where it runs, or gave up): its
/// record in the request's `pool` is released and the ticket leaves the queue at the head.
pub fn abandon_lua(pool: *mut ngx::ffi::ngx_pool_t, id: u64) {
    // SAFETY: the pool of the live request making the call.
    unsafe {
        each_holding(pool, |holding| holding.abandon_ticket(id));
    }
}

/// The adaptive view of a key for the admin API: limit, phase, no-load and last latencies.
pub fn adaptive_view(zone: &Zone, words: &KeyWords) -> Option<AdaptiveLimit> {
    let bounds = zone.concurrency_limits().as_ref().and_then(bounds_of)?;
    words.adaptive?.load(&bounds)
}

/// Whether a phase is a probe (for the admin API's text).
pub fn phase_name(phase: Phase) -> &'static str {
    match phase {
        Phase::Probe => "probe",
        Phase::Track => "track",
    }
}

/// Retry-After in whole seconds for a refusal.
pub fn retry_after_seconds(refusal: &Refusal) -> u64 {
    refusal.retry_after_ns.div_ceil(NANOS_PER_SEC).max(1)
}
