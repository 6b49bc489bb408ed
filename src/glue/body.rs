//! A request's body once nginx has read it (in memory up to `client_body_buffer_size`, the
//! rest in a temporary file), gathered into one piece.

use ngx::ffi::ngx_http_request_t;

/// The request body, or `None` when it is longer than `max` bytes or its temporary file
/// cannot be read. A body nginx kept in a temporary file is read back from it.
pub fn request_body(r: &ngx_http_request_t, max: usize) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    // SAFETY: after the body was read, `request_body` is NULL or a live structure whose
    // `bufs` chain describes the body, in memory or in its temporary file.
    let Some(request_body) = (unsafe { r.request_body.as_ref() }) else {
        return Some(body);
    };
    let mut link = request_body.bufs;
    // SAFETY: each link of the chain and its buffer are live for the request.
    while let Some(chain) = unsafe { link.as_ref() } {
        link = chain.next;
        // SAFETY: as above.
        let Some(buf) = (unsafe { chain.buf.as_ref() }) else {
            continue;
        };
        let in_memory = buf.temporary() != 0 || buf.memory() != 0 || buf.mmap() != 0;
        if in_memory {
            let len = (buf.last as usize).saturating_sub(buf.pos as usize);
            if body.len() + len > max {
                return None;
            }
            if len > 0 {
                // SAFETY: pos..last is the buffer's data.
                body.extend_from_slice(unsafe { core::slice::from_raw_parts(buf.pos, len) });
            }
        } else if buf.in_file() != 0 {
            let len = usize::try_from(buf.file_last - buf.file_pos).unwrap_or(usize::MAX);
            if body.len().saturating_add(len) > max {
                return None;
            }
            // SAFETY: `file` describes the open temporary file holding this part.
            let fd = unsafe { (*buf.file).fd };
            read_file(fd, buf.file_pos, len, &mut body)?;
        }
    }
    Some(body)
}

/// Append `len` bytes at `offset` of `fd` to `body`; `None` on a read error.
fn read_file(fd: i32, offset: i64, len: usize, body: &mut Vec<u8>) -> Option<()> {
    let start = body.len();
    body.resize(start + len, 0);
    let mut done = 0;
    while done < len {
        // SAFETY: the destination has `len - done` bytes left; `fd` is open for reading.
        let read = unsafe {
            libc::pread(
                fd,
                body[start + done..].as_mut_ptr().cast(),
                len - done,
                offset + done as i64,
            )
        };
        if read <= 0 {
            return None;
        }
        done += read as usize;
    }
    Some(())
}

/// The request body's length in bytes, in memory and in its temporary file, without reading
/// it (0 when there is none).
pub fn request_body_len(r: &ngx_http_request_t) -> usize {
    // SAFETY: as in `request_body`: NULL or a live structure describing the body.
    let Some(request_body) = (unsafe { r.request_body.as_ref() }) else {
        return 0;
    };
    let mut total = 0usize;
    let mut link = request_body.bufs;
    // SAFETY: each link of the chain and its buffer are live for the request.
    while let Some(chain) = unsafe { link.as_ref() } {
        link = chain.next;
        // SAFETY: as above.
        let Some(buf) = (unsafe { chain.buf.as_ref() }) else {
            continue;
        };
        let len = if buf.in_file() != 0 && buf.temporary() == 0 && buf.memory() == 0 {
            usize::try_from(buf.file_last - buf.file_pos).unwrap_or(0)
        } else {
            (buf.last as usize).saturating_sub(buf.pos as usize)
        };
        total = total.saturating_add(len);
    }
    total
}
