//! The slab pool's mutex: the one cross-process lock the module takes. nginx's master
//! releases it when a worker dies holding it.

use core::ptr;

use nginx_sys::{ngx_shmtx_lock, ngx_shmtx_unlock, ngx_slab_pool_t};

/// Holds a slab pool's mutex; released on drop.
#[must_use]
pub struct PoolLock(*mut ngx_slab_pool_t);

impl PoolLock {
    /// Take the pool's mutex, waiting for it.
    ///
    /// # Safety
    /// `shpool` is an initialized slab pool that outlives the returned lock.
    pub unsafe fn take(shpool: *mut ngx_slab_pool_t) -> PoolLock {
        // SAFETY: the caller passes an initialized pool, whose mutex nginx set up with it.
        unsafe { ngx_shmtx_lock(ptr::addr_of_mut!((*shpool).mutex)) };
        PoolLock(shpool)
    }
}

impl Drop for PoolLock {
    fn drop(&mut self) {
        // SAFETY: locked by `PoolLock::take` on this pool, which is still alive.
        unsafe { ngx_shmtx_unlock(ptr::addr_of_mut!((*self.0).mutex)) };
    }
}
