//! The atomic word the table is made of, as a trait: production passes `core`'s `AtomicU64`
//! (words in nginx's shared memory), the model tests loom's.

use core::sync::atomic::Ordering;

/// A 64-bit atomic word: the operations the table and its users need, with the meaning of
/// `core::sync::atomic::AtomicU64`'s methods of the same names.
#[allow(missing_docs)]
pub trait Word {
    /// A word holding `value` (tables in tests and models).
    fn new(value: u64) -> Self
    where
        Self: Sized;
    fn load(&self, order: Ordering) -> u64;
    fn store(&self, value: u64, order: Ordering);
    fn swap(&self, value: u64, order: Ordering) -> u64;
    fn compare_exchange(
        &self,
        current: u64,
        new: u64,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u64, u64>;
    fn compare_exchange_weak(
        &self,
        current: u64,
        new: u64,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u64, u64>;
    fn fetch_add(&self, value: u64, order: Ordering) -> u64;
    fn fetch_sub(&self, value: u64, order: Ordering) -> u64;
    fn fetch_xor(&self, value: u64, order: Ordering) -> u64;
}

macro_rules! impl_word {
    ($atomic:ty) => {
        impl Word for $atomic {
            #[inline(always)]
            fn new(value: u64) -> Self {
                <$atomic>::new(value)
            }
            #[inline(always)]
            fn load(&self, order: Ordering) -> u64 {
                <$atomic>::load(self, order)
            }
            #[inline(always)]
            fn store(&self, value: u64, order: Ordering) {
                <$atomic>::store(self, value, order)
            }
            #[inline(always)]
            fn swap(&self, value: u64, order: Ordering) -> u64 {
                <$atomic>::swap(self, value, order)
            }
            #[inline(always)]
            fn compare_exchange(
                &self,
                current: u64,
                new: u64,
                success: Ordering,
                failure: Ordering,
            ) -> Result<u64, u64> {
                <$atomic>::compare_exchange(self, current, new, success, failure)
            }
            #[inline(always)]
            fn compare_exchange_weak(
                &self,
                current: u64,
                new: u64,
                success: Ordering,
                failure: Ordering,
            ) -> Result<u64, u64> {
                <$atomic>::compare_exchange_weak(self, current, new, success, failure)
            }
            #[inline(always)]
            fn fetch_add(&self, value: u64, order: Ordering) -> u64 {
                <$atomic>::fetch_add(self, value, order)
            }
            #[inline(always)]
            fn fetch_sub(&self, value: u64, order: Ordering) -> u64 {
                <$atomic>::fetch_sub(self, value, order)
            }
            #[inline(always)]
            fn fetch_xor(&self, value: u64, order: Ordering) -> u64 {
                <$atomic>::fetch_xor(self, value, order)
            }
        }
    };
}

impl_word!(core::sync::atomic::AtomicU64);
#[cfg(loom)]
impl_word!(loom::sync::atomic::AtomicU64);

/// Update a word by compare-and-swap: `step` gives, for the value it is shown, what to answer
/// and the value to store (`None`: store nothing). Tried again on the value another writer
/// stored meanwhile; never locks, so a process killed here leaves either the old value or
/// the new one. Callers hold a [`crate::Pin`] of the slot the word belongs to, so every value
/// `step` is shown is the pinned key's. Inlined, so that each caller compiles to its own
/// arithmetic.
#[inline(always)]
pub fn update<W: Word, T>(word: &W, mut step: impl FnMut(u64) -> (T, Option<u64>)) -> T {
    let mut current = word.load(Ordering::Acquire);
    loop {
        let (answer, next) = step(current);
        let Some(next) = next else {
            return answer;
        };
        match word.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return answer,
            Err(actual) => current = actual,
        }
    }
}

/// What [`decide_at`] answered, with the state it decided on and the time it decided at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decided<T> {
    /// `step`'s answer.
    pub answer: T,
    /// The state the answer was decided on (the value before the one stored, if any).
    pub state: u64,
    /// The time the answer was decided at: `now_ns`, or a later reading of `clock`.
    pub now_ns: u64,
}

/// A decision on a word at a time, stored by compare-and-swap as [`update`] does: `step` gives,
/// for a state and a time, what to answer and the state to store (`None`: store nothing).
///
/// `now_ns` was read before the state was, and another process may have stored a state
/// decided at a later time meanwhile: a time-keeping state (a bucket's theoretical arrival
/// time) then looks further ahead of `now_ns` than any clock reading after it, and a request
/// its own key's history lets through would be refused. So an answer that does not `pass`
/// (a refusal, a delay) is decided again, before anything is stored, at `clock` read after the
/// state was loaded: every state stored before that load was decided at a time no later than
/// that reading (see docs/architecture.md, "A request's time"). A passing answer keeps
/// `now_ns`: it costs no clock reading. When the compare-and-swap fails, the state another
/// process stored is decided on afresh (after a refusal, at a new reading).
#[inline(always)]
pub fn decide_at<W: Word, T>(
    word: &W,
    now_ns: u64,
    clock: impl Fn() -> u64,
    pass: impl Fn(&T) -> bool,
    mut step: impl FnMut(u64, u64) -> (T, Option<u64>),
) -> Decided<T> {
    let mut current = word.load(Ordering::Acquire);
    loop {
        let (answer, next) = step(current, now_ns);
        if !pass(&answer) {
            return decide_again(word, current, now_ns, clock, step);
        }
        match store(word, current, now_ns, (answer, next)) {
            Ok(decided) => return decided,
            Err(actual) => current = actual,
        }
    }
}

/// [`decide_at`] of an answer that did not pass on `current`, loaded before `clock` is read
/// here: decided at that reading, and at a new one after each state another process stored
/// meanwhile. Out of line: a passing request never comes here.
#[cold]
#[inline(never)]
fn decide_again<W: Word, T>(
    word: &W,
    mut current: u64,
    mut now_ns: u64,
    clock: impl Fn() -> u64,
    mut step: impl FnMut(u64, u64) -> (T, Option<u64>),
) -> Decided<T> {
    loop {
        now_ns = now_ns.max(clock());
        match store(word, current, now_ns, step(current, now_ns)) {
            Ok(decided) => return decided,
            Err(actual) => current = actual,
        }
    }
}

/// Store the state decided on `current` at `now_ns` (`None`: nothing to store) by
/// compare-and-swap: the decision, or the state another process stored first.
#[inline(always)]
fn store<W: Word, T>(
    word: &W,
    current: u64,
    now_ns: u64,
    (answer, next): (T, Option<u64>),
) -> Result<Decided<T>, u64> {
    let decided = Decided {
        answer,
        state: current,
        now_ns,
    };
    match next {
        None => Ok(decided),
        Some(next) => word
            .compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire)
            .map(|_| decided),
    }
}
