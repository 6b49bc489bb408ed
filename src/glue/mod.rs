//! Glue: the nginx helpers every other part of the module uses (clock, response headers,
//! logging, the slab pool's lock, variable values). Imports nothing of ours.

pub mod body;
pub mod guard;
pub mod pool;
pub mod response;
pub mod value_bits;
pub mod variables;

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

/// Fill `value` with `$rate_limit_remote_net` (http and stream) for a client at `sockaddr`:
/// its network key (`ratelimit_core::key_form::network_key`) in `pool` memory, `unix:` for a
/// client on a UNIX socket (as `$binary_remote_addr` has it). `NGX_OK`, or `NGX_ERROR` when
/// memory runs out.
///
/// # Safety
/// `value` is the live value to fill, `sockaddr` a connection's live address (nginx's
/// `c->sockaddr`, which realip rewrites) and `pool` a live pool that outlives the value.
pub unsafe fn fill_remote_net(
    value: *mut ngx::ffi::ngx_variable_value_t,
    pool: *mut ngx::ffi::ngx_pool_t,
    sockaddr: *const ngx::ffi::sockaddr,
    prefixes: ratelimit_core::key_form::NetPrefixes,
) -> ngx::ffi::ngx_int_t {
    use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    // SAFETY: the caller passes a live address; its family says which structure it is.
    let address = unsafe {
        match i32::from((*sockaddr).sa_family) {
            libc::AF_INET => {
                let v4 = &*sockaddr.cast::<libc::sockaddr_in>();
                Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr))))
            }
            libc::AF_INET6 => {
                let v6 = &*sockaddr.cast::<libc::sockaddr_in6>();
                Some(IpAddr::V6(Ipv6Addr::from(v6.sin6_addr.s6_addr)))
            }
            _ => None,
        }
    };
    let mut key = [0; ratelimit_core::key_form::NETWORK_KEY_MAX];
    let bytes: &[u8] = match address {
        Some(address) => {
            let len = ratelimit_core::key_form::network_key(address, prefixes, &mut key);
            &key[..len]
        }
        None => b"unix:",
    };
    // SAFETY: the caller's promise: `value` and `pool` are live.
    unsafe { set_value(value, pool, bytes, value_bits::VALID) }
}

/// Fill a variable's `value` with a copy of `bytes` in `pool`, with `bits` (`VALID`, and
/// `NO_CACHEABLE` if so) besides the length: `NGX_OK`, or `NGX_ERROR` when the pool has no
/// room.
///
/// # Safety
/// `value` and `pool` are live, and the pool outlives the value's use.
pub unsafe fn set_value(
    value: *mut ngx::ffi::ngx_variable_value_t,
    pool: *mut ngx::ffi::ngx_pool_t,
    bytes: &[u8],
    bits: u32,
) -> ngx::ffi::ngx_int_t {
    // SAFETY: the pool is live; the memory gets exactly the value's bytes and lives with the
    // pool; `value` is live (the caller's promise).
    unsafe {
        let at = ngx::ffi::ngx_pnalloc(pool, bytes.len()).cast::<u8>();
        if at.is_null() {
            return ngx::ffi::NGX_ERROR as ngx::ffi::ngx_int_t;
        }
        core::ptr::copy_nonoverlapping(bytes.as_ptr(), at, bytes.len());
        (*value).data = at;
    }
    value_bits::write(value, bytes.len() as u32 | bits);
    ngx::ffi::NGX_OK as ngx::ffi::ngx_int_t
}

/// The data of the first cleanup of the main request of `r` whose handler is `handler`
/// (what a module keeps with a request until its pool is destroyed), or null.
pub fn main_request_cleanup(
    r: &ngx_http_request_t,
    handler: unsafe extern "C" fn(*mut core::ffi::c_void),
) -> *mut core::ffi::c_void {
    // SAFETY: a live request's main request is live, with its pool.
    let Some(main) = (unsafe { r.main.as_ref() }) else {
        return core::ptr::null_mut();
    };
    // SAFETY: the cleanups form a null-terminated list, each live until the pool goes.
    let mut cleanup = unsafe { (*main.pool).cleanup };
    // SAFETY: as above.
    while let Some(element) = unsafe { cleanup.as_ref() } {
        if element
            .handler
            .is_some_and(|ours| core::ptr::fn_addr_eq(ours, handler))
        {
            return element.data;
        }
        cleanup = element.next;
    }
    core::ptr::null_mut()
}
