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
/// stored meanwhile. Callers hold a [`crate::Pin`] of the slot the word belongs to, so every
/// value `step` is shown is the pinned key's.
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
