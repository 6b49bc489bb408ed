//! Response headers: values written into request-pool memory and pushed onto
//! `headers_out`.

use ngx::ffi::{
    ngx_chain_t, ngx_create_temp_buf, ngx_http_discard_request_body, ngx_http_finalize_request,
    ngx_http_output_filter, ngx_http_request_t, ngx_http_send_header, ngx_int_t, ngx_list_push,
    ngx_pnalloc, ngx_str_t, ngx_table_elt_t, ngx_uint_t, NGX_DONE, NGX_ERROR, NGX_OK,
};

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

/// Answer the request at once, from a phase handler, with `status`, `content_type` and `body`
/// (none at all when empty: a header-only answer, which over HTTP/2 is one HEADERS frame
/// that ends the stream), then finalize it. Returns `NGX_DONE`: the request may be freed
/// already, and the caller must not touch it again. `status` is returned instead, with
/// nothing sent, when the request's body cannot be discarded.
pub fn answer_now(
    r: &mut ngx_http_request_t,
    status: ngx_int_t,
    content_type: &'static [u8],
    body: &[u8],
) -> ngx_int_t {
    // SAFETY: `r` is the live request; its body, if any, is read and dropped as nginx's own
    // error pages do.
    if unsafe { ngx_http_discard_request_body(r) } != NGX_OK as ngx_int_t {
        return status;
    }
    r.headers_out.status = status as ngx_uint_t;
    r.headers_out.content_type_len = content_type.len();
    r.headers_out.content_type = ngx_str_t {
        len: content_type.len(),
        data: content_type.as_ptr().cast_mut(),
    };
    if body.is_empty() {
        r.set_header_only(1);
        r.headers_out.content_length_n = -1;
    } else {
        r.headers_out.content_length_n = body.len() as i64;
    }
    // SAFETY: `r` is the live request with its headers set.
    let rc = unsafe { ngx_http_send_header(r) };
    let rc = if rc == NGX_ERROR as ngx_int_t || rc > NGX_OK as ngx_int_t || r.header_only() != 0 {
        rc
    } else {
        // SAFETY: the request pool is live; the buffer gets exactly the body's bytes.
        unsafe {
            let buf = ngx_create_temp_buf(r.pool, body.len());
            if buf.is_null() {
                NGX_ERROR as ngx_int_t
            } else {
                core::ptr::copy_nonoverlapping(body.as_ptr(), (*buf).pos, body.len());
                (*buf).last = (*buf).pos.add(body.len());
                (*buf).set_last_buf(1);
                (*buf).set_last_in_chain(1);
                let mut out = ngx_chain_t {
                    buf,
                    next: core::ptr::null_mut(),
                };
                ngx_http_output_filter(r, &mut out)
            }
        }
    };
    // The answer is sent from a phase handler: the request ends here.
    // SAFETY: `r` is the live request; nginx finalizes it as after a content handler.
    unsafe { ngx_http_finalize_request(r, rc) };
    NGX_DONE as ngx_int_t
}
