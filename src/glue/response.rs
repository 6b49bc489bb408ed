//! Response headers: values written into request-pool memory and pushed onto
//! `headers_out`.

use ngx::ffi::{ngx_http_request_t, ngx_list_push, ngx_pnalloc, ngx_str_t, ngx_table_elt_t};

/// Bytes written in order into request-pool memory of a fixed size (never past it).
pub struct PoolWriter {
    buffer: &'static mut [u8],
    len: usize,
}

impl PoolWriter {
    pub fn new(r: &mut ngx_http_request_t, capacity: usize) -> Option<PoolWriter> {
        // SAFETY: the request pool is live; the memory stays valid as long as the request.
        let data = unsafe { ngx_pnalloc(r.pool, capacity.max(1)) }.cast::<u8>();
        if data.is_null() {
            return None;
        }
        // SAFETY: `data` has `capacity` writable bytes, used by this writer alone.
        let buffer = unsafe { core::slice::from_raw_parts_mut(data, capacity) };
        Some(PoolWriter { buffer, len: 0 })
    }

    #[inline]
    pub fn put(&mut self, bytes: &[u8]) {
        if let Some(target) = self.buffer.get_mut(self.len..self.len + bytes.len()) {
            target.copy_from_slice(bytes);
            self.len += bytes.len();
        }
    }

    pub fn finish(mut self) -> ngx_str_t {
        self.take()
    }

    /// The bytes written since the last `take` (or since the start); later writes go after
    /// them, into the rest of the memory.
    pub fn take(&mut self) -> ngx_str_t {
        let (written, rest) = core::mem::take(&mut self.buffer).split_at_mut(self.len);
        self.buffer = rest;
        self.len = 0;
        ngx_str_t {
            len: written.len(),
            data: written.as_mut_ptr(),
        }
    }
}

/// Append a response header; values are copied into the request pool.
pub fn add_header(r: &mut ngx_http_request_t, name: &'static str, value: &[u8]) {
    let Some(mut copy) = PoolWriter::new(r, value.len()) else {
        return;
    };
    copy.put(value);
    push_header(r, name, copy.finish());
}

/// Append a response header whose value already lives in the request pool.
pub fn push_header(r: &mut ngx_http_request_t, name: &'static str, value: ngx_str_t) {
    // The element starts zeroed and only the fields every supported nginx has are set: from
    // 1.23.0 on it also has `next` (null for a single header), which 1.22's headers lack.
    // SAFETY: ngx_table_elt_t is plain data for which all-zero bytes are a valid value.
    let mut element: ngx_table_elt_t = unsafe { core::mem::zeroed() };
    element.hash = 1;
    element.key = ngx_str_t {
        len: name.len(),
        data: name.as_ptr().cast_mut(),
    };
    element.value = value;
    // SAFETY: the request's output header list is live.
    let header = unsafe { ngx_list_push(&mut r.headers_out.headers) }.cast::<ngx_table_elt_t>();
    if header.is_null() {
        return;
    }
    // SAFETY: a fresh element of the list; fully initialized before nginx sees it.
    unsafe { header.write(element) };
}
