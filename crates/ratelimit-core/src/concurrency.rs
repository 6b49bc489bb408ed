//! Requests in flight per key, and a first-in first-out queue for those beyond the limit:
//! `algorithm=concurrency`.
//!
//! A key's whole state is one word ([`Slots`]): the slots held (`in_flight`, a request of
//! `cost=c` holds `c`) and the queue as two 16-bit ticket counters, `head` (the ticket whose
//! turn it is) and `tail` (the next ticket to hand out). Every change is one compare-and-swap
//! of that word, so workers never hold a lock for it:
//!
//! * a request arrives ([`arrive`]): it takes its slots at once if the queue is empty and they
//!   are free, else a ticket if the queue has a place (and its cost can ever fit), else it is
//!   rejected;
//! * a queued request takes its slots only when its ticket is at the head and they are free
//!   ([`take_turn`]), moving the head on: tickets are served in the order they were handed
//!   out, whichever worker holds them;
//! * a queued request that gives up (timeout, client gone) moves the head on when its ticket
//!   reaches it ([`leave`]); until then the ticket keeps its place, which costs a place but
//!   never a slot;
//! * a finished request gives its slots back ([`release`]).
//!
//! A ticket whose holder died never reaches [`leave`]: any worker may skip a head that has not
//! moved for longer than any live holder waits ([`head_is_stale`], [`skip_head`]), which needs
//! the time the head last moved, kept in a second word written *before* each compare-and-swap
//! that moves the head or queues into an empty queue (so a reader that sees the new head sees
//! its time too).
//!
//! Slots held by a worker that died are given back from per-process counts kept next to the
//! key ([`Lanes`]): each process adds what it holds to its own lane, and the process that
//! takes over a dead one's slot in nginx's process table subtracts the lane from `in_flight`.
//! Tickets are owned the same way: a lane's top bit says that its process holds tickets of
//! the key, and whoever sweeps a dead (or exiting) process's lane empties the key's queue
//! ([`reset_queue`]). Tickets cannot be taken out of the middle of the queue, so the live
//! holders of the other tickets find theirs skipped and queue again ([`arrive`]): they keep
//! their deadlines but not their order.

use std::fmt;

use crate::adaptive::{AdaptiveBounds, MAX_LIMIT};
use crate::rate::NANOS_PER_SEC;
use crate::spec::{parse_zone, SpecError};

/// The parameters of a concurrency zone's `rate_limit_zone`, for the error that quotes an
/// unknown one.
pub const CONCURRENCY_PARAMETERS: &[&str] = &[
    "zone=",
    "algorithm=",
    "limit=",
    "min=",
    "max=",
    "queue=",
    "queue_timeout=",
    "sync",
];

/// Most queue places (`queue=`): tickets are 16-bit and half the range tells waiting tickets
/// from skipped ones.
pub const MAX_QUEUE: u32 = (1 << 15) - 1;
/// How much longer than `queue_timeout` a head may stand still before any worker skips it.
pub const STALE_HEAD_GRACE_NS: u64 = NANOS_PER_SEC;
/// Longest `queue_timeout`.
pub const MAX_QUEUE_TIMEOUT_NS: u64 = 24 * 3600 * NANOS_PER_SEC;
/// `queue_timeout` when `queue=` is given without it.
pub const DEFAULT_QUEUE_TIMEOUT_NS: u64 = 5 * NANOS_PER_SEC;

/// Words of a key: its [`Slots`], the time its queue's head last moved, its [`Lanes`].
pub const KEY_WORDS: usize = 2 + LANE_WORDS;
/// Words a key of `limit=adaptive` takes on top: its [`crate::adaptive::AdaptiveLimit`], the
/// window's histogram ([`crate::adaptive::histogram_add`]) and the most in flight in the
/// window.
pub const ADAPTIVE_KEY_WORDS: usize =
    crate::adaptive::ADAPTIVE_WORDS + crate::adaptive::HISTOGRAM_WORDS + 1;

/// Words a key of a `sync` zone takes on top: its lease ([`crate::lease::LeaseWord`]) and its
/// requests refused since the sync loop last looked (what it asks the fleet for).
pub const LEASE_KEY_WORDS: usize = 2;

/// The `u64` words a key of a concurrency zone takes (after its hash). A `sync` zone's
/// limit is fixed (`limit=adaptive` cannot be synced).
pub fn state_words(adaptive: bool, sync: bool) -> usize {
    if adaptive {
        KEY_WORDS + ADAPTIVE_KEY_WORDS
    } else if sync {
        KEY_WORDS + LEASE_KEY_WORDS
    } else {
        KEY_WORDS
    }
}

/// One key's slots and queue, packed in one `u64`: `[in_flight:32][head:16][tail:16]`.
/// `0` is a key with nothing in flight and an empty queue (a fresh key).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Slots {
    /// Slots held by requests being served (the sum of their costs).
    pub in_flight: u32,
    /// The ticket whose turn it is.
    pub head: u16,
    /// The next ticket to hand out; `tail - head` (wrapping) tickets are queued.
    pub tail: u16,
}

impl Slots {
    /// The fields of a word.
    #[inline]
    pub fn unpack(word: u64) -> Slots {
        Slots {
            in_flight: (word >> 32) as u32,
            head: (word >> 16) as u16,
            tail: word as u16,
        }
    }

    /// The word of these fields.
    #[inline]
    pub fn pack(&self) -> u64 {
        (u64::from(self.in_flight) << 32) | (u64::from(self.head) << 16) | u64::from(self.tail)
    }

    /// Tickets queued: waiting, or given up and not yet at the head.
    #[inline]
    pub fn queued(&self) -> u32 {
        u32::from(self.tail.wrapping_sub(self.head))
    }

    /// Whether `cost` more slots fit under `limit`.
    #[inline]
    fn fits(&self, cost: u64, limit: u32) -> bool {
        u64::from(self.in_flight) + cost <= u64::from(limit)
    }

    /// How far `ticket` is from the head, if it is still queued.
    #[inline]
    fn position(&self, ticket: u16) -> Option<u32> {
        let position = u32::from(ticket.wrapping_sub(self.head));
        (position < self.queued()).then_some(position)
    }
}

/// What became of a request that arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arrival {
    /// It holds its slots now.
    Admitted,
    /// It waits with this ticket. `first`: it queued into an empty queue, so the caller must
    /// write the head's time before storing the word (see the module's doc).
    Queued {
        /// The ticket to pass to [`take_turn`] and [`leave`].
        ticket: u16,
        /// The queue was empty.
        first: bool,
    },
    /// No slot and no place in the queue, or a cost larger than the limit (which no wait
    /// would fit).
    Rejected,
}

/// A request of `cost` arrives at a key in state `word`, with `limit` slots and `queue`
/// places. Returns what happens and the word to store (`None`: nothing changes).
///
/// Requests do not pass the queue: with tickets waiting, a newcomer queues even when slots
/// are free (the head takes them on its next turn).
///
/// ```
/// use ratelimit_core::concurrency::{arrive, Arrival};
///
/// let (first, word) = arrive(0, 1, 1, 2);
/// assert_eq!(first, Arrival::Admitted);
/// let (second, word) = arrive(word.unwrap(), 1, 1, 2);
/// assert_eq!(second, Arrival::Queued { ticket: 0, first: true });
/// let (third, word) = arrive(word.unwrap(), 1, 1, 2);
/// assert_eq!(third, Arrival::Queued { ticket: 1, first: false });
/// assert_eq!(arrive(word.unwrap(), 1, 1, 2), (Arrival::Rejected, None));
/// ```
#[inline]
pub fn arrive(word: u64, cost: u64, limit: u32, queue: u32) -> (Arrival, Option<u64>) {
    arrive_within(word, cost, limit, limit, queue)
}

/// [`arrive`] where the slots free now (`limit`) may be fewer than the most the key can ever
/// have (`ceiling`): a `sync` key's lease and the fleet's `limit=`. A request that fits the
/// ceiling waits in the queue for a larger lease.
///
/// ```
/// use ratelimit_core::concurrency::{arrive_within, Arrival};
///
/// // No lease yet: queued, not rejected.
/// assert!(matches!(arrive_within(0, 1, 0, 12, 5).0, Arrival::Queued { .. }));
/// ```
pub fn arrive_within(
    word: u64,
    cost: u64,
    limit: u32,
    ceiling: u32,
    queue: u32,
) -> (Arrival, Option<u64>) {
    let slots = Slots::unpack(word);
    let queued = slots.queued();
    if queued == 0 && slots.fits(cost, limit) {
        let in_flight = slots.in_flight + cost as u32;
        return (Arrival::Admitted, Some(Slots { in_flight, ..slots }.pack()));
    }
    if queued < queue.min(MAX_QUEUE) && cost <= u64::from(ceiling) {
        let ticket = slots.tail;
        let tail = ticket.wrapping_add(1);
        let arrival = Arrival::Queued {
            ticket,
            first: queued == 0,
        };
        return (arrival, Some(Slots { tail, ..slots }.pack()));
    }
    (Arrival::Rejected, None)
}

/// A queued request's chance to take its slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Turn {
    /// It holds its slots: store this word (the head moved on: write its time first).
    Admitted(u64),
    /// Not its turn yet, or its slots are not free yet.
    Wait,
    /// Its ticket is no longer queued: it was skipped as stale. The request has lost its place.
    Skipped,
}

/// The holder of `ticket` tries to take `cost` slots of `limit`: only the head may, and only
/// when they are free.
///
/// ```
/// use ratelimit_core::concurrency::{arrive, release, take_turn, Turn};
///
/// let (_, word) = arrive(0, 1, 1, 5); // in flight
/// let (_, word) = arrive(word.unwrap(), 1, 1, 5); // ticket 0
/// let (_, word) = arrive(word.unwrap(), 1, 1, 5); // ticket 1
/// let word = word.unwrap();
/// assert_eq!(take_turn(word, 0, 1, 1), Turn::Wait); // no free slot
/// let word = release(word, 1);
/// assert_eq!(take_turn(word, 1, 1, 1), Turn::Wait); // not the head
/// let Turn::Admitted(word) = take_turn(word, 0, 1, 1) else { panic!() };
/// assert_eq!(take_turn(word, 0, 1, 1), Turn::Skipped); // served already
/// ```
#[inline]
pub fn take_turn(word: u64, ticket: u16, cost: u64, limit: u32) -> Turn {
    let slots = Slots::unpack(word);
    match slots.position(ticket) {
        None => Turn::Skipped,
        Some(0) if slots.fits(cost, limit) => Turn::Admitted(
            Slots {
                in_flight: slots.in_flight + cost as u32,
                head: slots.head.wrapping_add(1),
                tail: slots.tail,
            }
            .pack(),
        ),
        Some(_) => Turn::Wait,
    }
}

/// A queued request that gives up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Leave {
    /// Its ticket was the head: store this word (the head moved on: write its time first).
    Left(u64),
    /// Tickets ahead of it are still queued: keep the ticket and try again later.
    NotYet,
    /// The ticket is no longer queued (skipped as stale): nothing to do.
    Gone,
}

/// The holder of `ticket` gives up its place. A ticket in the middle of the queue cannot be
/// taken out (the counters only move at the head): its holder keeps it and leaves when it
/// reaches the head, which the tickets ahead of it do within their own timeouts.
#[inline]
pub fn leave(word: u64, ticket: u16) -> Leave {
    let slots = Slots::unpack(word);
    match slots.position(ticket) {
        None => Leave::Gone,
        Some(0) => Leave::Left(
            Slots {
                head: slots.head.wrapping_add(1),
                ..slots
            }
            .pack(),
        ),
        Some(_) => Leave::NotYet,
    }
}

/// A request that held `cost` slots is finished: the word with them free (never below 0).
#[inline]
pub fn release(word: u64, cost: u64) -> u64 {
    let slots = Slots::unpack(word);
    let in_flight = u64::from(slots.in_flight).saturating_sub(cost) as u32;
    Slots { in_flight, ..slots }.pack()
}

/// Whether a head that last moved at `head_since_ns` is stale at `now_ns`: longer than
/// `queue_timeout_ns` and [`STALE_HEAD_GRACE_NS`], which no live holder waits (it takes its
/// slots or gives up within its timeout, and leaves at the head within a poll).
#[inline]
pub fn head_is_stale(head_since_ns: u64, now_ns: u64, queue_timeout_ns: u64) -> bool {
    now_ns.saturating_sub(head_since_ns) > queue_timeout_ns.saturating_add(STALE_HEAD_GRACE_NS)
}

/// The word with its head ticket skipped, if the queue is not empty (the caller checked
/// [`head_is_stale`] after reading `word`, and writes the head's time before storing).
#[inline]
pub fn skip_head(word: u64) -> Option<u64> {
    let slots = Slots::unpack(word);
    (slots.queued() > 0).then(|| {
        Slots {
            head: slots.head.wrapping_add(1),
            ..slots
        }
        .pack()
    })
}

/// The word with its queue emptied (head moved to the tail), slots untouched; `None` when the
/// queue is empty already. The caller writes the head's time before storing.
#[inline]
pub fn reset_queue(word: u64) -> Option<u64> {
    let slots = Slots::unpack(word);
    (slots.queued() > 0).then(|| {
        Slots {
            head: slots.tail,
            ..slots
        }
        .pack()
    })
}

/// The `Retry-After` of a rejected request: when a slot is likely to be free again, at least
/// one second (the header's unit). `latency_ns` is the key's latency estimate (0 when none).
#[inline]
pub fn retry_after_ns(latency_ns: u64) -> u64 {
    latency_ns.max(NANOS_PER_SEC)
}

/// The slots each process holds of one key, so that a dead process's slots can be given
/// back: [`LANES`] lanes of 32 bits, two to a word. Process `p` (its slot in nginx's process
/// table) uses lane `p`; processes at [`LANES`] and beyond keep no lane (their slots are not
/// given back if they die).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Lanes;

/// Lanes per key.
pub const LANES: usize = 16;
/// Words the lanes of one key take.
pub const LANE_WORDS: usize = LANES / 2;
/// The slot count's bits of a lane.
const LANE_COUNT_MASK: u64 = (1 << 31) - 1;

impl Lanes {
    /// The word and the bit shift of process `process_slot`'s lane, if it has one.
    #[inline]
    pub fn position(process_slot: usize) -> Option<(usize, u32)> {
        (process_slot < LANES).then(|| (process_slot / 2, (process_slot % 2) as u32 * 32))
    }

    /// What to add to (or subtract from) a lane word for `cost` slots at `shift`. Counts stay
    /// below 2^31 (the lane's top bit is [`Lanes::tickets_flag`]): a process never holds more
    /// slots of a key than the limit (at most 2^24) allows.
    #[inline]
    pub fn delta(cost: u64, shift: u32) -> u64 {
        (cost & LANE_COUNT_MASK) << shift
    }

    /// The count of the lane at `shift` in `word`.
    #[inline]
    pub fn count(word: u64, shift: u32) -> u64 {
        (word >> shift) & LANE_COUNT_MASK
    }

    /// The bit of the lane at `shift` that says its process holds tickets of the key.
    #[inline]
    pub fn tickets_flag(shift: u32) -> u64 {
        1 << (shift + 31)
    }

    /// The whole lane at `shift` (count and flag), to empty it.
    #[inline]
    pub fn mask(shift: u32) -> u64 {
        u64::from(u32::MAX) << shift
    }
}

/// `limit=N` or `limit=adaptive`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConcurrencyLimit {
    /// A fixed number of slots per key.
    Fixed(u32),
    /// Slots that follow the upstream's latency ([`crate::adaptive`]).
    Adaptive(AdaptiveBounds),
}

impl fmt::Display for ConcurrencyLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConcurrencyLimit::Fixed(limit) => write!(f, "{limit}"),
            ConcurrencyLimit::Adaptive(bounds) => {
                write!(f, "adaptive min={} max={}", bounds.min, bounds.max)
            }
        }
    }
}

/// A zone's limits as requests use them now (the admin API changes them live): the limit
/// (or the adaptive bounds) and the queue places, in one word so that no request sees a new
/// limit with an old queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConcurrencyLimits {
    /// `limit=N` or `limit=adaptive min= max=`.
    pub limit: ConcurrencyLimit,
    /// `queue=N`.
    pub queue: u32,
}

impl ConcurrencyLimits {
    /// `[adaptive:1][limit or min:24][max:24][queue:15]`; never 0 (a limit and a min are at
    /// least 1). Out-of-range fields (not produced by the parsers) are clamped.
    ///
    /// ```
    /// use ratelimit_core::adaptive::AdaptiveBounds;
    /// use ratelimit_core::concurrency::{ConcurrencyLimit, ConcurrencyLimits};
    ///
    /// let limits = ConcurrencyLimits { limit: ConcurrencyLimit::Fixed(100), queue: 200 };
    /// assert_eq!(ConcurrencyLimits::unpack(limits.pack()), Some(limits));
    /// let adaptive = ConcurrencyLimit::Adaptive(AdaptiveBounds::new(4, 500));
    /// let limits = ConcurrencyLimits { limit: adaptive, queue: 0 };
    /// assert_eq!(ConcurrencyLimits::unpack(limits.pack()), Some(limits));
    /// assert_eq!(ConcurrencyLimits::unpack(0), None);
    /// ```
    pub fn pack(&self) -> u64 {
        let field = |value: u32| u64::from(value.clamp(1, MAX_LIMIT));
        let (adaptive, first, second) = match self.limit {
            ConcurrencyLimit::Fixed(limit) => (0, field(limit), 0),
            ConcurrencyLimit::Adaptive(bounds) => (1, field(bounds.min), field(bounds.max)),
        };
        (adaptive << 63) | (first << 39) | (second << 15) | u64::from(self.queue.min(MAX_QUEUE))
    }

    /// Inverse of [`ConcurrencyLimits::pack`]; `None` for a word no limits pack to.
    pub fn unpack(word: u64) -> Option<ConcurrencyLimits> {
        const FIELD: u64 = (1 << 24) - 1;
        let first = ((word >> 39) & FIELD) as u32;
        let second = ((word >> 15) & FIELD) as u32;
        if first == 0 {
            return None;
        }
        let limit = if word >> 63 == 1 {
            ConcurrencyLimit::Adaptive(AdaptiveBounds::new(first, second))
        } else {
            ConcurrencyLimit::Fixed(first)
        };
        Some(ConcurrencyLimits {
            limit,
            queue: (word & u64::from(MAX_QUEUE)) as u32,
        })
    }
}

/// The words of a `rate_limit_zone ... algorithm=concurrency` after the key:
/// `[zone=NAME:SIZE] algorithm=concurrency limit=N|adaptive [min=N] [max=N] [queue=N]
/// [queue_timeout=TIME]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConcurrencySpec {
    /// `zone=NAME:SIZE`, as for the other algorithms.
    pub zone: Option<(String, u64)>,
    /// `limit=`, required.
    pub limit: ConcurrencyLimit,
    /// `queue=N` places per key (0: reject at once).
    pub queue: u32,
    /// `queue_timeout=TIME`: the longest a request waits in the queue.
    pub queue_timeout_ns: u64,
    /// `sync`: `limit=` holds across the fleet, handed out as leases ([`crate::lease`]).
    pub sync: bool,
}

impl ConcurrencySpec {
    /// `min=` when not given.
    pub const DEFAULT_MIN: u32 = 4;
    /// `max=` when not given.
    pub const DEFAULT_MAX: u32 = 1000;

    /// The limits this spec configures.
    pub fn limits(&self) -> ConcurrencyLimits {
        ConcurrencyLimits {
            limit: self.limit,
            queue: self.queue,
        }
    }

    /// Parse the words (`algorithm=concurrency` among them); errors quote the bad word.
    ///
    /// ```
    /// use ratelimit_core::concurrency::{ConcurrencyLimit, ConcurrencySpec};
    ///
    /// let words = ["zone=app:1m", "algorithm=concurrency", "limit=100", "queue=200", "queue_timeout=5s"];
    /// let spec = ConcurrencySpec::parse_words(&words).unwrap();
    /// assert_eq!(spec.limit, ConcurrencyLimit::Fixed(100));
    /// assert_eq!((spec.queue, spec.queue_timeout_ns), (200, 5_000_000_000));
    /// let words = ["algorithm=concurrency", "limit=adaptive", "max=8", "foo"];
    /// let error = ConcurrencySpec::parse_words(&words).unwrap_err();
    /// assert_eq!(
    ///     error.to_string(),
    ///     "invalid parameter \"foo\": it must be zone=, algorithm=, limit=, min=, max=, queue=, \
    ///      queue_timeout= or sync"
    /// );
    /// ```
    pub fn parse_words(words: &[&str]) -> Result<ConcurrencySpec, SpecError> {
        let mut zone = None;
        let mut limit = None;
        let mut adaptive = false;
        let mut min = None;
        let mut max = None;
        let mut queue = None;
        let mut queue_timeout = None;
        let mut sync = false;

        for &word in words {
            if let Some(value) = word.strip_prefix("zone=") {
                zone = Some(parse_zone(word, value)?);
            } else if word == "algorithm=concurrency" {
            } else if let Some(value) = word.strip_prefix("limit=") {
                if value == "adaptive" {
                    adaptive = true;
                } else {
                    limit = Some(parse_count(word, value, "limit", 1, MAX_LIMIT)?);
                }
            } else if let Some(value) = word.strip_prefix("min=") {
                min = Some((word, parse_count(word, value, "min", 1, MAX_LIMIT)?));
            } else if let Some(value) = word.strip_prefix("max=") {
                max = Some((word, parse_count(word, value, "max", 1, MAX_LIMIT)?));
            } else if let Some(value) = word.strip_prefix("queue=") {
                queue = Some(parse_count(word, value, "queue", 0, MAX_QUEUE)?);
            } else if let Some(value) = word.strip_prefix("queue_timeout=") {
                queue_timeout = Some((word, parse_queue_timeout(word, value)?));
            } else if word == "sync" {
                sync = true;
            } else {
                return Err(unknown_word(word));
            }
        }

        let limit = limit_of(limit, adaptive, min, max)?;
        if sync && matches!(limit, ConcurrencyLimit::Adaptive(_)) {
            return Err(SpecError::Conflict(
                "\"sync\" is not supported with \"limit=adaptive\": each instance measures \
                 its own upstream's latency, so the fleet has no one limit to share; use \
                 \"limit=N\" with \"sync\", or \"limit=adaptive\" per instance"
                    .into(),
            ));
        }
        let queue = queue.unwrap_or(0);
        if let (Some((word, _)), 0) = (queue_timeout, queue) {
            return Err(SpecError::Conflict(format!(
                "\"{word}\" needs \"queue=\" places to wait in"
            )));
        }
        Ok(ConcurrencySpec {
            zone,
            limit,
            queue,
            queue_timeout_ns: queue_timeout.map_or(DEFAULT_QUEUE_TIMEOUT_NS, |(_, ns)| ns),
            sync,
        })
    }
}

/// The limit of `limit=N` or `limit=adaptive` (`adaptive`), with the bounds `min=` and
/// `max=` (and the words they were written in), which only an adaptive limit takes.
fn limit_of(
    limit: Option<u32>,
    adaptive: bool,
    min: Option<(&str, u32)>,
    max: Option<(&str, u32)>,
) -> Result<ConcurrencyLimit, SpecError> {
    match (limit, adaptive) {
        (Some(limit), false) => {
            if let Some((word, _)) = min.or(max) {
                return Err(SpecError::Conflict(format!(
                    "\"{word}\" is used only with \"limit=adaptive\""
                )));
            }
            Ok(ConcurrencyLimit::Fixed(limit))
        }
        (None, true) => {
            let min_value = min.map_or(ConcurrencySpec::DEFAULT_MIN, |(_, min)| min);
            let max_value = max.map_or(ConcurrencySpec::DEFAULT_MAX.max(min_value), |(_, max)| max);
            if min_value > max_value {
                return Err(SpecError::Conflict(format!(
                    "\"min={min_value}\" is more than \"max={max_value}\""
                )));
            }
            Ok(ConcurrencyLimit::Adaptive(AdaptiveBounds::new(
                min_value, max_value,
            )))
        }
        // limit=N and limit=adaptive both: the last word wins in nginx, but two limits
        // are a mistake worth a message.
        (Some(_), true) => Err(SpecError::Conflict(
            "\"limit\" is given twice: a number or \"adaptive\"".into(),
        )),
        (None, false) => Err(SpecError::MissingParameter("limit")),
    }
}

/// `queue_timeout=`: a time from 1 ms to 24 h.
fn parse_queue_timeout(word: &str, value: &str) -> Result<u64, SpecError> {
    parse_time_ns(value)
        .filter(|&ns| (1_000_000..=MAX_QUEUE_TIMEOUT_NS).contains(&ns))
        .ok_or_else(|| {
            SpecError::InvalidValue(format!(
                "invalid queue_timeout value \"{word}\": must be a time from 1ms \
                 to 24h, such as \"5s\" or \"500ms\""
            ))
        })
}

/// The error for a word no concurrency zone takes: `rate=` and `burst=` are told apart.
fn unknown_word(word: &str) -> SpecError {
    if let Some((name, _)) = word.split_once('=') {
        if matches!(name, "rate" | "burst") {
            return SpecError::Conflict(format!(
                "\"{name}\" is not used by concurrency zones, which limit requests in \
                 flight with \"limit=\" and queue with \"queue=\""
            ));
        }
    }
    SpecError::invalid_parameter(word, CONCURRENCY_PARAMETERS)
}

/// An integer from `low` to `high`: `invalid limit value "limit=x": must be ...`.
fn parse_count(word: &str, value: &str, name: &str, low: u32, high: u32) -> Result<u32, SpecError> {
    value
        .parse::<u32>()
        .ok()
        .filter(|n| value.bytes().all(|b| b.is_ascii_digit()) && (low..=high).contains(n))
        .ok_or_else(|| {
            let what = if name == "limit" {
                format!("an integer from {low} to {high}, or \"adaptive\"")
            } else {
                format!("an integer from {low} to {high}")
            };
            SpecError::InvalidValue(format!("invalid {name} value \"{word}\": must be {what}"))
        })
}

/// An nginx time: one or more `NUMBER[UNIT]` parts, units `ms`, `s`, `m`, `h`, `d` (none:
/// seconds, as nginx reads times), such as `5s`, `500ms`, `1m30s`. `None` for anything else.
///
/// ```
/// use ratelimit_core::concurrency::parse_time_ns;
///
/// assert_eq!(parse_time_ns("1m30s"), Some(90_000_000_000));
/// assert_eq!(parse_time_ns("250ms"), Some(250_000_000));
/// assert_eq!(parse_time_ns("2"), Some(2_000_000_000));
/// assert_eq!(parse_time_ns("5x"), None);
/// ```
pub fn parse_time_ns(text: &str) -> Option<u64> {
    const MS: u64 = 1_000_000;
    let mut rest = text;
    let mut total: u64 = 0;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let number: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (scale, unit_len) = if rest.starts_with("ms") {
            (MS, 2)
        } else {
            match rest.bytes().next() {
                None => (NANOS_PER_SEC, 0),
                Some(b's') => (NANOS_PER_SEC, 1),
                Some(b'm') => (60 * NANOS_PER_SEC, 1),
                Some(b'h') => (3600 * NANOS_PER_SEC, 1),
                Some(b'd') => (86_400 * NANOS_PER_SEC, 1),
                Some(_) => return None,
            }
        };
        rest = &rest[unit_len..];
        total = total.checked_add(number.checked_mul(scale)?)?;
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(words: &str) -> Result<ConcurrencySpec, String> {
        let words: Vec<&str> = words.split_whitespace().collect();
        ConcurrencySpec::parse_words(&words).map_err(|e| e.to_string())
    }

    #[test]
    fn words() {
        let fixed =
            spec("zone=app:1m algorithm=concurrency limit=100 queue=200 queue_timeout=5s").unwrap();
        assert_eq!(fixed.zone, Some(("app".into(), 1 << 20)));
        assert_eq!(fixed.limit, ConcurrencyLimit::Fixed(100));
        assert_eq!(
            (fixed.queue, fixed.queue_timeout_ns),
            (200, 5 * NANOS_PER_SEC)
        );

        let adaptive =
            spec("zone=a:1m algorithm=concurrency limit=adaptive min=4 max=500").unwrap();
        assert_eq!(
            adaptive.limit,
            ConcurrencyLimit::Adaptive(AdaptiveBounds { min: 4, max: 500 })
        );
        assert_eq!(
            (adaptive.queue, adaptive.queue_timeout_ns),
            (0, DEFAULT_QUEUE_TIMEOUT_NS)
        );
        assert_eq!(adaptive.limit.to_string(), "adaptive min=4 max=500");

        let defaults = spec("limit=adaptive").unwrap();
        assert_eq!(
            defaults.limit,
            ConcurrencyLimit::Adaptive(AdaptiveBounds { min: 4, max: 1000 })
        );
        let high_min = spec("limit=adaptive min=2000").unwrap();
        assert_eq!(
            high_min.limit,
            ConcurrencyLimit::Adaptive(AdaptiveBounds {
                min: 2000,
                max: 2000
            })
        );
        assert_eq!(spec("limit=1 queue=32767").unwrap().queue, MAX_QUEUE);
    }

    #[test]
    fn errors_name_the_word() {
        #[rustfmt::skip]
        let rows = [
            ("queue=5", "must have \"limit\" parameter"),
            ("limit=0", "invalid limit value \"limit=0\": must be an integer from 1 to 16777215, or \"adaptive\""),
            ("limit=-3", "invalid limit value \"limit=-3\": must be an integer from 1 to 16777215, or \"adaptive\""),
            ("limit=+3", "invalid limit value \"limit=+3\": must be an integer from 1 to 16777215, or \"adaptive\""),
            ("limit=fast", "invalid limit value \"limit=fast\": must be an integer from 1 to 16777215, or \"adaptive\""),
            ("limit=16777217", "invalid limit value \"limit=16777217\": must be an integer from 1 to 16777215, or \"adaptive\""),
            ("limit=adaptive min=0", "invalid min value \"min=0\": must be an integer from 1 to 16777215"),
            ("limit=adaptive max=x", "invalid max value \"max=x\": must be an integer from 1 to 16777215"),
            ("limit=adaptive min=10 max=5", "\"min=10\" is more than \"max=5\""),
            ("limit=10 min=2", "\"min=2\" is used only with \"limit=adaptive\""),
            ("limit=10 limit=adaptive", "\"limit\" is given twice: a number or \"adaptive\""),
            ("limit=10 queue=32768", "invalid queue value \"queue=32768\": must be an integer from 0 to 32767"),
            ("limit=10 queue=1 queue_timeout=0", "invalid queue_timeout value \"queue_timeout=0\": must be a time from 1ms to 24h, such as \"5s\" or \"500ms\""),
            ("limit=10 queue=1 queue_timeout=5x", "invalid queue_timeout value \"queue_timeout=5x\": must be a time from 1ms to 24h, such as \"5s\" or \"500ms\""),
            ("limit=10 queue=1 queue_timeout=2d", "invalid queue_timeout value \"queue_timeout=2d\": must be a time from 1ms to 24h, such as \"5s\" or \"500ms\""),
            ("limit=10 queue_timeout=5s", "\"queue_timeout=5s\" needs \"queue=\" places to wait in"),
            ("limit=10 rate=5r/s", "\"rate\" is not used by concurrency zones, which limit requests in flight with \"limit=\" and queue with \"queue=\""),
            ("limit=10 burst=5", "\"burst\" is not used by concurrency zones, which limit requests in flight with \"limit=\" and queue with \"queue=\""),
            ("limit=adaptive sync", "\"sync\" is not supported with \"limit=adaptive\": each instance measures its own upstream's latency, so the fleet has no one limit to share; use \"limit=N\" with \"sync\", or \"limit=adaptive\" per instance"),
            ("limit=10 nodelay", "invalid parameter \"nodelay\": it must be zone=, algorithm=, limit=, min=, max=, queue=, queue_timeout= or sync"),
            ("limit=10 color=red", "invalid parameter \"color=red\": it must be zone=, algorithm=, limit=, min=, max=, queue=, queue_timeout= or sync"),
            ("limit=10 queue_timout=5s", "invalid parameter \"queue_timout=5s\", did you mean \"queue_timeout=\"?"),
            ("limit=10 zone=a", "invalid zone size \"zone=a\": it must be zone=NAME:SIZE, \
              the SIZE in bytes or with k, m or g (65536, 512k, 10m), as in limit_req_zone"),
            ("limit=10 zone=:1m", "invalid zone name \"zone=:1m\""),
        ];
        for (words, message) in rows {
            assert_eq!(spec(words), Err(message.to_string()), "{words}");
        }
    }

    #[test]
    fn times() {
        #[rustfmt::skip]
        let rows = [
            ("5s", Some(5_000)), ("500ms", Some(500)), ("1m", Some(60_000)), ("1h", Some(3_600_000)),
            ("1d", Some(86_400_000)), ("1m30s", Some(90_000)), ("3", Some(3_000)), ("1s500ms", Some(1_500)),
            ("", None), ("s", None), ("5 s", None), ("-1s", None), ("1.5s", None), ("5sec", None),
            ("99999999999999999999s", None),
        ];
        for (text, ms) in rows {
            assert_eq!(
                parse_time_ns(text),
                ms.map(|ms: u64| ms * 1_000_000),
                "{text:?}"
            );
        }
    }

    /// Rows of (word before, request, result, word after) as `(in_flight, head, tail)`.
    #[test]
    fn arrivals_table() {
        #[rustfmt::skip]
        let rows = [
            // limit 2, queue 2, cost 1
            ((0, 0, 0), 1, 2, 2, Arrival::Admitted, Some((1, 0, 0))),
            ((1, 0, 0), 1, 2, 2, Arrival::Admitted, Some((2, 0, 0))),
            ((2, 0, 0), 1, 2, 2, Arrival::Queued { ticket: 0, first: true }, Some((2, 0, 1))),
            ((2, 0, 1), 1, 2, 2, Arrival::Queued { ticket: 1, first: false }, Some((2, 0, 2))),
            ((2, 0, 2), 1, 2, 2, Arrival::Rejected, None),
            // A free slot with tickets waiting: the newcomer queues behind them.
            ((1, 0, 1), 1, 2, 2, Arrival::Queued { ticket: 1, first: false }, Some((1, 0, 2))),
            // No queue: rejected at once.
            ((2, 0, 0), 1, 2, 0, Arrival::Rejected, None),
            // cost 3 of limit 4 with 2 in flight: queued; cost 5 never fits: rejected.
            ((2, 0, 0), 3, 4, 2, Arrival::Queued { ticket: 0, first: true }, Some((2, 0, 1))),
            ((0, 0, 0), 5, 4, 2, Arrival::Rejected, None),
            // Tickets wrap around 2^16.
            ((2, 65535, 65535), 1, 2, 2, Arrival::Queued { ticket: 65535, first: true }, Some((2, 65535, 0))),
            ((2, 65535, 0), 1, 2, 2, Arrival::Queued { ticket: 0, first: false }, Some((2, 65535, 1))),
            // More in flight than the limit (it was lowered): no admission.
            ((9, 0, 0), 1, 2, 2, Arrival::Queued { ticket: 0, first: true }, Some((9, 0, 1))),
        ];
        let word = |(in_flight, head, tail): (u32, u16, u16)| {
            Slots {
                in_flight,
                head,
                tail,
            }
            .pack()
        };
        for (before, cost, limit, queue, arrival, after) in rows {
            assert_eq!(
                arrive(word(before), cost, limit, queue),
                (arrival, after.map(word)),
                "{before:?} cost {cost} limit {limit} queue {queue}"
            );
        }
    }

    #[test]
    fn turns_and_leaving() {
        let word = |in_flight, head, tail| {
            Slots {
                in_flight,
                head,
                tail,
            }
            .pack()
        };
        // Head with a free slot: admitted, head moves.
        assert_eq!(
            take_turn(word(1, 5, 8), 5, 1, 2),
            Turn::Admitted(word(2, 6, 8))
        );
        // Head without room for its cost: waits.
        assert_eq!(take_turn(word(1, 5, 8), 5, 2, 2), Turn::Wait);
        // Behind the head: waits, even with room.
        assert_eq!(take_turn(word(0, 5, 8), 6, 1, 2), Turn::Wait);
        // Outside [head, tail): skipped.
        assert_eq!(take_turn(word(0, 5, 8), 4, 1, 2), Turn::Skipped);
        assert_eq!(take_turn(word(0, 5, 8), 8, 1, 2), Turn::Skipped);
        // Across the wrap.
        assert_eq!(
            take_turn(word(0, 65535, 2), 65535, 1, 2),
            Turn::Admitted(word(1, 0, 2))
        );
        assert_eq!(take_turn(word(0, 65535, 2), 1, 1, 2), Turn::Wait);

        assert_eq!(leave(word(2, 5, 8), 5), Leave::Left(word(2, 6, 8)));
        assert_eq!(leave(word(2, 5, 8), 7), Leave::NotYet);
        assert_eq!(leave(word(2, 5, 8), 8), Leave::Gone);

        // A reset empties the queue, keeps the slots, and every old ticket is then skipped.
        assert_eq!(reset_queue(word(2, 5, 8)), Some(word(2, 8, 8)));
        assert_eq!(reset_queue(word(2, 8, 8)), None);
        for ticket in 5..8 {
            assert_eq!(take_turn(word(0, 8, 9), ticket, 1, 2), Turn::Skipped);
            assert_eq!(leave(word(0, 8, 9), ticket), Leave::Gone);
        }

        assert_eq!(release(word(3, 1, 2), 2), word(1, 1, 2));
        assert_eq!(release(word(1, 1, 2), 5), word(0, 1, 2));

        assert_eq!(skip_head(word(0, 5, 8)), Some(word(0, 6, 8)));
        assert_eq!(skip_head(word(0, 5, 5)), None);

        let s = NANOS_PER_SEC;
        assert!(!head_is_stale(10 * s, 16 * s, 5 * s));
        assert!(head_is_stale(10 * s, 16 * s + 1, 5 * s));
        assert!(
            !head_is_stale(20 * s, 10 * s, 5 * s),
            "a clock read earlier elsewhere"
        );

        assert_eq!(retry_after_ns(0), s);
        assert_eq!(retry_after_ns(3 * s), 3 * s);
    }

    #[test]
    fn lanes() {
        assert_eq!(Lanes::position(0), Some((0, 0)));
        assert_eq!(Lanes::position(1), Some((0, 32)));
        assert_eq!(Lanes::position(15), Some((7, 32)));
        assert_eq!(Lanes::position(16), None);
        let mut word = 0u64;
        word += Lanes::delta(3, 32);
        word += Lanes::delta(5, 0);
        assert_eq!((Lanes::count(word, 0), Lanes::count(word, 32)), (5, 3));
        word -= Lanes::delta(5, 0);
        assert_eq!((Lanes::count(word, 0), Lanes::count(word, 32)), (0, 3));
        word |= Lanes::tickets_flag(32);
        assert_eq!((Lanes::count(word, 0), Lanes::count(word, 32)), (0, 3));
        assert_eq!(
            word & Lanes::mask(32),
            Lanes::delta(3, 32) | Lanes::tickets_flag(32)
        );
        assert_eq!(word & Lanes::mask(0), 0);
    }
}
