//! This worker's queued requests: a ticket per waiting request, looked at every millisecond
//! (and as soon as a request of this worker gives slots back) until its turn comes, its
//! `queue_timeout` passes or it goes away. A ticket whose request went away stays, as a
//! place in the queue, until it reaches the head and leaves. Workers share nothing here:
//! each sees the others' tickets move through the key's word in shared memory.
//!
//! Tickets are owned: while this worker holds any of a key, its lane in the key says so, and
//! the sweep of a dead or exiting worker's lanes empties those queues; a waiter that finds
//! its ticket gone that way queues again. A worker that exits on a reload waits for its
//! tickets (the queue's timer is not cancelable).
//!
//! Process-local and single-threaded: nginx runs a worker's requests, timers and this queue
//! on one thread.

use core::cell::{Cell, RefCell};
use core::ptr;

use ngx::ffi::{ngx_event_t, ngx_http_request_t};

use super::tickets::{self, Requeue, TurnTaken};
use crate::glue::now_ns;
use crate::store::concurrency::KeyWords;
use crate::store::{SlotIndex, Zone};

/// How often the queue is looked at while it has tickets, in ms.
const TICK_MS: ngx::ffi::ngx_msec_t = 1;

/// What a waiting request is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// It holds its slots now.
    Admitted,
    /// Its `queue_timeout` passed (or its place was taken as stale): it is refused.
    Refused,
}

/// Resumes a request of the request path once its wait is over.
pub type Resume = unsafe fn(*mut ngx_http_request_t, Resolution);

/// Who waits for a ticket.
#[derive(Clone, Copy)]
pub enum Owner {
    /// A request of the request path, resumed by `resume`.
    Request {
        r: *mut ngx_http_request_t,
        resume: Resume,
    },
    /// A Lua call, which asks again itself ([`lua_turn`]).
    Lua,
    /// A stream session, which never waits (a stream line has no queue): never in a queue.
    Session,
}

/// The record of a waiting request, which its queue keeps up to date: its owner (the slots'
/// code) implements it, so that the queue needs nothing of the owner's.
pub trait Record {
    /// The request's turn came (the queue admitted it): it holds its slots now.
    fn turn_taken(&mut self, words: &KeyWords, now_ns: u64, word: u64);
    /// The request queued again with a new ticket.
    fn requeued(&mut self, new_ticket: u16);
    /// The request gave up, or its place was taken from it.
    fn left_queue(&mut self);
}

/// The key a ticket is of, and what its request asks.
#[derive(Clone, Copy)]
pub struct Key {
    pub zone: Zone,
    pub slot: SlotIndex,
    pub hash: u64,
    pub cost: u64,
}

#[derive(Clone, Copy)]
enum Held {
    By(Owner),
    /// The request went away (or gave up) while its ticket was not yet at the head.
    Gone,
}

/// One ticket of this worker.
pub struct Waiter {
    id: u64,
    zone: Zone,
    slot: SlotIndex,
    hash: u64,
    ticket: u16,
    cost: u64,
    /// The places of its line's queue, to queue again with.
    queue_places: u32,
    deadline_ns: u64,
    queue_timeout_ns: u64,
    holding: Option<*mut dyn Record>,
    held: Held,
}

impl Waiter {
    pub fn new(
        key: Key,
        ticket: u16,
        queue_places: u32,
        deadline_ns: u64,
        queue_timeout_ns: u64,
        holding: *mut dyn Record,
        owner: Owner,
    ) -> Waiter {
        Waiter {
            id: 0,
            zone: key.zone,
            slot: key.slot,
            hash: key.hash,
            ticket,
            cost: key.cost,
            queue_places,
            deadline_ns,
            queue_timeout_ns,
            holding: Some(holding),
            held: Held::By(owner),
        }
    }
}

thread_local! {
    static WAITERS: RefCell<Vec<Waiter>> = const { RefCell::new(Vec::new()) };
    static NEXT_ID: Cell<u64> = const { Cell::new(1) };
    static TIMER: Cell<*mut ngx_event_t> = const { Cell::new(ptr::null_mut()) };
}

/// Queue a ticket; returns its id (for [`abandon`] and [`lua_turn`]).
pub fn wait(mut waiter: Waiter) -> u64 {
    let id = NEXT_ID.with(|next| {
        let id = next.get();
        next.set(id + 1);
        id
    });
    waiter.id = id;
    WAITERS.with(|waiters| waiters.borrow_mut().push(waiter));
    arm(TICK_MS);
    id
}

/// Whether this worker holds a ticket of the key in `slot` of `zone`.
pub fn holds_tickets(zone: &Zone, slot: SlotIndex, hash: u64) -> bool {
    WAITERS.with(|waiters| {
        waiters
            .borrow()
            .iter()
            .any(|w| w.slot == slot && w.hash == hash && w.zone.is_same(zone))
    })
}

/// A ticket left this worker's list: its lane says so once it was the key's last.
fn removed(waiters: &[Waiter], gone: &Waiter) {
    let others = waiters
        .iter()
        .any(|w| w.slot == gone.slot && w.hash == gone.hash && w.zone.is_same(&gone.zone));
    if others || gone.zone.hash_at(gone.slot) != gone.hash {
        return;
    }
    if let Some(words) = gone.zone.key_words(gone.slot) {
        words.unmark_tickets(tickets::process_slot());
    }
}

/// The request of ticket `id` went away or gave up: its place stays until it reaches the
/// head, where it leaves.
pub fn abandon(id: u64) {
    WAITERS.with(|waiters| {
        if let Some(waiter) = waiters.borrow_mut().iter_mut().find(|w| w.id == id) {
            waiter.held = Held::Gone;
            waiter.holding = None;
        }
    });
}

/// A request of this worker gave slots back: look at the queue now rather than at the next
/// tick.
pub fn slots_freed() {
    let waiting = WAITERS.with(|waiters| !waiters.borrow().is_empty());
    if waiting {
        let timer = timer();
        if !timer.is_null() {
            // SAFETY: the worker's timer event, alive for the process; posted events are
            // run by this thread's event loop.
            unsafe {
                nginx_sys::ngx_post_event(timer, ptr::addr_of_mut!(nginx_sys::ngx_posted_events))
            };
        }
    }
}

/// What a Lua call's ticket got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LuaTurn {
    Admitted,
    Wait,
    Refused,
}

/// A Lua call asks whether its ticket's turn came; with the key's requests in flight and
/// limit now.
pub fn lua_turn(id: u64) -> (LuaTurn, (u32, u32)) {
    let now = now_ns();
    let outcome = WAITERS.with(|waiters| {
        let mut waiters = waiters.borrow_mut();
        let index = waiters
            .iter()
            .position(|w| w.id == id && matches!(w.held, Held::By(Owner::Lua)))?;
        let waiter = &mut waiters[index];
        let (step, keep) = step(waiter, now);
        let standing = tickets::standing(&waiter.zone, waiter.slot, now);
        if !keep {
            let gone = waiters.remove(index);
            removed(&waiters, &gone);
        }
        Some((step, standing))
    });
    match outcome {
        Some((Step::Admitted, standing)) => (LuaTurn::Admitted, standing),
        Some((Step::Wait, standing)) => (LuaTurn::Wait, standing),
        Some((Step::Refused, standing)) => (LuaTurn::Refused, standing),
        None => (LuaTurn::Refused, (0, 0)),
    }
}

enum Step {
    Admitted,
    Wait,
    Refused,
}

/// One look at a ticket: its turn, its timeout, or (gone) its leaving. Returns what its
/// owner is told and whether the ticket stays queued.
fn step(waiter: &mut Waiter, now: u64) -> (Step, bool) {
    let Some(words) = waiter.zone.key_words(waiter.slot) else {
        return (Step::Refused, false);
    };
    if waiter.zone.hash_at(waiter.slot) != waiter.hash {
        // A key with tickets out is never evicted; nothing to leave if it was.
        return (Step::Refused, false);
    }
    tickets::skip_stale_head(&words, waiter.queue_timeout_ns, now);
    let Held::By(_) = waiter.held else {
        let left = tickets::leave(&words, waiter.ticket, now);
        return (Step::Refused, !left);
    };
    if now >= waiter.deadline_ns {
        let left = tickets::leave(&words, waiter.ticket, now);
        // SAFETY: a waiter held by its request points to the request's live holding.
        if let Some(holding) = waiter
            .holding
            .and_then(|holding| unsafe { holding.as_mut() })
        {
            holding.left_queue();
        }
        waiter.held = Held::Gone;
        waiter.holding = None;
        return (Step::Refused, !left);
    }
    match tickets::take_turn(&words, &waiter.zone, waiter.ticket, waiter.cost, now) {
        TurnTaken::Admitted(word) => {
            // SAFETY: as above.
            if let Some(holding) = waiter
                .holding
                .and_then(|holding| unsafe { holding.as_mut() })
            {
                holding.turn_taken(&words, now, word);
            }
            (Step::Admitted, false)
        }
        TurnTaken::Wait => (Step::Wait, true),
        TurnTaken::Lost => {
            // The queue was emptied under it (a dead worker's tickets, a forgotten key):
            // queue again, within the same deadline.
            match tickets::requeue(&words, &waiter.zone, waiter.cost, waiter.queue_places, now) {
                Requeue::Admitted(word) => {
                    // SAFETY: as above.
                    if let Some(holding) = waiter
                        .holding
                        .and_then(|holding| unsafe { holding.as_mut() })
                    {
                        holding.turn_taken(&words, now, word);
                    }
                    (Step::Admitted, false)
                }
                Requeue::Queued(ticket) => {
                    waiter.ticket = ticket;
                    // SAFETY: as above.
                    if let Some(holding) = waiter
                        .holding
                        .and_then(|holding| unsafe { holding.as_mut() })
                    {
                        holding.requeued(ticket);
                    }
                    (Step::Wait, true)
                }
                Requeue::Rejected => {
                    // SAFETY: as above.
                    if let Some(holding) = waiter
                        .holding
                        .and_then(|holding| unsafe { holding.as_mut() })
                    {
                        holding.left_queue();
                    }
                    (Step::Refused, false)
                }
            }
        }
    }
}

/// The tick: every ticket of this worker looked at once; requests whose wait is over are
/// resumed after (resuming runs their phases, which may queue them again).
unsafe extern "C" fn tick(_event: *mut ngx_event_t) {
    crate::glue::guard::entry(
        "control::queue::tick",
        || (),
        || {
            let now = now_ns();
            let mut resumed = Vec::new();
            let waiting = WAITERS.with(|waiters| {
                let mut waiters = waiters.borrow_mut();
                let mut index = 0;
                while index < waiters.len() {
                    let waiter = &mut waiters[index];
                    // Lua asks itself; a dead worker's head is skipped for it here too.
                    if let Held::By(Owner::Lua | Owner::Session) = waiter.held {
                        if let Some(words) = waiter.zone.key_words(waiter.slot) {
                            tickets::skip_stale_head(&words, waiter.queue_timeout_ns, now);
                        }
                        index += 1;
                        continue;
                    }
                    let owner = waiter.held;
                    let (step, keep) = step(waiter, now);
                    if let Held::By(Owner::Request { r, resume }) = owner {
                        match step {
                            Step::Admitted => resumed.push((r, resume, Resolution::Admitted)),
                            Step::Refused => resumed.push((r, resume, Resolution::Refused)),
                            Step::Wait => {}
                        }
                    }
                    if keep {
                        index += 1;
                    } else {
                        let gone = waiters.remove(index);
                        removed(&waiters, &gone);
                    }
                }
                !waiters.is_empty()
            });
            for (r, resume, resolution) in resumed {
                // SAFETY: a request waiting in the queue is alive: it ends only through its pool's
                // cleanup, which turns its ticket into a gone one first.
                unsafe { resume(r, resolution) };
            }
            if waiting {
                arm(TICK_MS);
            }
        },
    )
}

/// This worker's timer event, made on first use; null if it could not be.
fn timer() -> *mut ngx_event_t {
    TIMER.with(|timer| {
        if timer.get().is_null() {
            // SAFETY: all-zero is a valid idle event; it lives for the process (leaked).
            let mut event: Box<ngx_event_t> = Box::new(unsafe { core::mem::zeroed() });
            event.handler = Some(tick);
            // SAFETY: the running cycle and its log outlive the worker's events.
            event.log = unsafe { (*nginx_sys::ngx_cycle).log };
            // Not cancelable: a worker shutting down (a reload) stays until its queued
            // requests are served or time out, and its tickets have left the queue.
            timer.set(Box::into_raw(event));
        }
        timer.get()
    })
}

fn arm(ms: ngx::ffi::ngx_msec_t) {
    let timer = timer();
    // SAFETY: the worker's own event; timers are this thread's.
    unsafe {
        if !timer.is_null() && (*timer).timer_set() == 0 {
            nginx_sys::ngx_add_timer(timer, ms);
        }
    }
}
