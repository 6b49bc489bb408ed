//! Glue: the nginx helpers every other part of the module uses (clock, response headers,
//! logging, the slab pool's lock, variable values). Imports nothing of ours.

pub mod guard;
pub mod pool;
pub mod response;
pub mod value_bits;

use ngx::ffi::{ngx_array_t, ngx_http_request_t, ngx_log_t};

/// Nanoseconds in one second.
const NANOS_PER_SEC: u64 = 1_000_000_000;

/// Monotonic nanoseconds: the same clock in every worker (and in the sync thread),
/// unaffected by wall-clock changes.
#[inline]
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    // Seconds since boot times 1e9 fits a u64 for 584 years.
    (ts.tv_sec as u64)
        .wrapping_mul(NANOS_PER_SEC)
        .wrapping_add(ts.tv_nsec as u64)
}

/// Monotonic milliseconds, on the clock of [`now_ns`].
pub fn now_ms() -> u64 {
    now_ns() / 1_000_000
}

/// Unix milliseconds of `monotonic_ns`, a time on the clock of [`now_ns`] (for what the admin
/// API shows and what instances exchange; the shared memory keeps monotonic times).
pub fn unix_ms_of(monotonic_ns: u64) -> u64 {
    let local_ms = (monotonic_ns / 1_000_000) as i64;
    local_ms.saturating_add(unix_minus_local_ms()).max(0) as u64
}

/// The wall clock minus the clock of [`now_ns`], in milliseconds, as this process first read
/// it: kept, so that a time converted back and forth comes back the same (a wall-clock step
/// after the process started is not followed).
pub fn unix_minus_local_ms() -> i64 {
    static OFFSET_MS: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *OFFSET_MS.get_or_init(|| {
        let wall_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_millis() as i64);
        wall_ms - now_ms() as i64
    })
}

/// The log of the request's connection.
pub fn connection_log(r: &ngx_http_request_t) -> *mut ngx_log_t {
    // SAFETY: a live request always has a connection with a log.
    unsafe { (*r.connection).log }
}

/// `N` bytes from `/dev/urandom`; `None` when it cannot be read (the caller falls back to
/// something weaker).
pub fn random_bytes<const N: usize>() -> Option<[u8; N]> {
    use std::io::Read;
    let mut bytes = [0u8; N];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut file| file.read_exact(&mut bytes))
        .ok()?;
    Some(bytes)
}

/// Whether process `pid` exists (it may belong to another user).
pub fn process_alive(pid: u64) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists.
    let result = unsafe { libc::kill(pid, 0) };
    result == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// The elements of an nginx array.
///
/// # Safety
/// `array` must be initialized with elements of type `T`.
pub unsafe fn array_slice<T>(array: &ngx_array_t) -> &[T] {
    if array.elts.is_null() || array.nelts == 0 {
        return &[];
    }
    // SAFETY: the caller guarantees `nelts` elements of `T` at `elts`.
    unsafe { core::slice::from_raw_parts(array.elts.cast::<T>(), array.nelts) }
}

/// Whether this process serves requests (a worker, or nginx without a master).
pub fn is_worker_process() -> bool {
    // SAFETY: set by nginx before init_process callbacks run, and only read afterwards.
    let process = unsafe { nginx_sys::ngx_process };
    process == nginx_sys::NGX_PROCESS_WORKER as ngx::ffi::ngx_uint_t
        || process == nginx_sys::NGX_PROCESS_SINGLE as ngx::ffi::ngx_uint_t
}
