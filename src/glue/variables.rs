//! A door's variables as one static table, each row a name, a getter, the getter's `data` and
//! nginx's flags, registered in one loop (as nginx-acme registers its own): the http door's
//! in `handler::variables`, the stream door's in `stream::session`.

use nginx_sys::{ngx_http_variable_t, ngx_str_t, ngx_stream_variable_t, ngx_uint_t};

/// One variable of a door's table.
pub struct Variable<Get> {
    pub name: &'static str,
    pub get: Get,
    /// What nginx passes the getter as `data` (for a getter of several variables, which).
    pub data: usize,
    /// `NGX_HTTP_VAR_NOCACHEABLE` (or the stream's), or 0.
    pub flags: ngx_uint_t,
}

/// A variable's definition as nginx's `add_variable` returns it (http's or stream's).
pub trait Definition {
    /// The door's getter type (`ngx_http_get_variable_pt`, `ngx_stream_get_variable_pt`).
    type Get: Copy;
    fn define(&mut self, get: Self::Get, data: usize);
}

impl Definition for ngx_http_variable_t {
    type Get = nginx_sys::ngx_http_get_variable_pt;
    fn define(&mut self, get: Self::Get, data: usize) {
        self.get_handler = get;
        self.data = data;
    }
}

impl Definition for ngx_stream_variable_t {
    type Get = nginx_sys::ngx_stream_get_variable_pt;
    fn define(&mut self, get: Self::Get, data: usize) {
        self.get_handler = get;
        self.data = data;
    }
}

/// Register every variable of `table` through `add` (the door's `ngx_*_add_variable` with its
/// configuration, given a name and flags). `None` at the first one nginx refused (it said why).
///
/// # Safety
/// `add` returns null or a live definition.
pub unsafe fn register<D: Definition>(
    table: &'static [Variable<D::Get>],
    mut add: impl FnMut(&mut ngx_str_t, ngx_uint_t) -> *mut D,
) -> Option<()> {
    for variable in table {
        let mut name = ngx_str_t {
            len: variable.name.len(),
            data: variable.name.as_ptr().cast_mut(),
        };
        // SAFETY: the caller's promise: null or a live definition.
        let definition = unsafe { add(&mut name, variable.flags).as_mut() }?;
        definition.define(variable.get, variable.data);
    }
    Some(())
}
