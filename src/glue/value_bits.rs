//! The first 32 bits of `ngx_variable_value_t`: `len:28, valid:1, no_cacheable:1,
//! not_found:1, escape:1`, read and written whole. bindgen's accessors for the 28-bit `len`
//! loop over it bit by bit (hundreds of instructions a call, on every request);
//! [`layout_matches`] checks at configuration time that the packing is the one assumed here.

use ngx::ffi::ngx_variable_value_t;

pub const LEN: u32 = (1 << 28) - 1;
pub const VALID: u32 = 1 << 28;
pub const NO_CACHEABLE: u32 = 1 << 29;
pub const NOT_FOUND: u32 = 1 << 30;

pub fn read(value: *const ngx_variable_value_t) -> u32 {
    // SAFETY: callers pass a live value; the bitfield unit is its first 4 bytes, aligned
    // for u32 (the struct starts with a zero-length [u32; 0] alignment member).
    unsafe { value.cast::<u32>().read() }
}

/// The bytes of a variable value nginx returned: `None` when there is no value (a null
/// pointer, `not_found`, or no data), its `len` bytes otherwise.
///
/// # Safety
/// `value` is null or a live variable value whose `data` holds `len` bytes that live for
/// `'a` (the request's or session's pool).
pub unsafe fn found<'a>(value: *const ngx_variable_value_t) -> Option<&'a [u8]> {
    if value.is_null() {
        return None;
    }
    let bits = read(value);
    // SAFETY: `value` is live (the caller's promise).
    let data = unsafe { (*value).data };
    if bits & NOT_FOUND != 0 || data.is_null() {
        return None;
    }
    // SAFETY: a found value holds `len` bytes at `data`, living for `'a`.
    Some(unsafe { core::slice::from_raw_parts(data, (bits & LEN) as usize) })
}

/// Replace `len` and the three flags, keeping `escape`.
pub fn write(value: *mut ngx_variable_value_t, bits: u32) {
    let escape = read(value) & !(LEN | VALID | NO_CACHEABLE | NOT_FOUND);
    // SAFETY: as for `read`.
    unsafe { value.cast::<u32>().write(escape | bits) };
}

/// Replace all 32 bits (`escape` cleared).
#[inline]
pub fn write_all(value: *mut ngx_variable_value_t, bits: u32) {
    // SAFETY: as for `read`.
    unsafe { value.cast::<u32>().write(bits) };
}

/// Whether bindgen's accessors and these masks agree on this target.
pub fn layout_matches() -> bool {
    // SAFETY: an all-zero ngx_variable_value_t is valid (a null data pointer, no flags).
    let mut value: ngx_variable_value_t = unsafe { core::mem::zeroed() };
    value.set_len(0x0ab_cdef);
    value.set_no_cacheable(1);
    let first = read(&value) == 0x0ab_cdef | NO_CACHEABLE;
    value.set_len(0);
    value.set_no_cacheable(0);
    value.set_valid(1);
    value.set_not_found(1);
    first && read(&value) == VALID | NOT_FOUND
}
