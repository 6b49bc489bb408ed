//! nginx's stream functions, found by name when a `stream` block is read.
//!
//! Debian builds the stream module as a dynamic module (`ngx_stream_module.so`): an nginx
//! that does not load it has no `ngx_stream_*` symbol at all, and a module that linked them
//! would fail to load there (nginx loads modules with `RTLD_NOW`). So nothing here names a
//! stream symbol at link time: each is looked up in the process's global scope (the nginx
//! binary, or the stream module loaded `RTLD_GLOBAL` by `load_module`) once a `stream` block
//! is opened, which cannot happen without the stream module.

use core::ffi::{c_void, CStr};

use nginx_sys::{
    ngx_conf_t, ngx_int_t, ngx_module_t, ngx_str_t, ngx_stream_compile_complex_value_t,
    ngx_stream_complex_value_t, ngx_stream_session_t, ngx_stream_variable_t,
    ngx_stream_variable_value_t, ngx_uint_t,
};

type AddVariable =
    unsafe extern "C" fn(*mut ngx_conf_t, *mut ngx_str_t, ngx_uint_t) -> *mut ngx_stream_variable_t;
type GetVariableIndex = unsafe extern "C" fn(*mut ngx_conf_t, *mut ngx_str_t) -> ngx_int_t;
type GetFlushedVariable =
    unsafe extern "C" fn(*mut ngx_stream_session_t, ngx_uint_t) -> *mut ngx_stream_variable_value_t;
type CompileComplexValue =
    unsafe extern "C" fn(*mut ngx_stream_compile_complex_value_t) -> ngx_int_t;
type ComplexValue = unsafe extern "C" fn(
    *mut ngx_stream_session_t,
    *mut ngx_stream_complex_value_t,
    *mut ngx_str_t,
) -> ngx_int_t;
type RunPhases = unsafe extern "C" fn(*mut ngx_stream_session_t);
type FinalizeSession = unsafe extern "C" fn(*mut ngx_stream_session_t, ngx_uint_t);

/// The stream functions and module the stream part calls, as this nginx has them.
pub struct StreamApi {
    pub add_variable: AddVariable,
    pub get_variable_index: GetVariableIndex,
    pub get_flushed_variable: GetFlushedVariable,
    pub compile_complex_value: CompileComplexValue,
    pub complex_value: ComplexValue,
    pub run_phases: RunPhases,
    pub finalize_session: FinalizeSession,
    /// `ngx_stream_core_module`: its `ctx_index` finds the core's configuration.
    pub core_module: *const ngx_module_t,
}

/// The address of `name` in the process's global scope.
fn symbol(name: &'static CStr) -> Result<*mut c_void, &'static CStr> {
    // SAFETY: dlsym with RTLD_DEFAULT only looks a NUL-terminated name up in the global scope.
    let address = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    if address.is_null() {
        Err(name)
    } else {
        Ok(address)
    }
}

macro_rules! function {
    ($name:literal, $type:ty) => {{
        let address = symbol($name)?;
        // SAFETY: the symbol is nginx's function of that name, whose C signature `$type`
        // spells (the same in every nginx from 1.22 on).
        unsafe { core::mem::transmute::<*mut c_void, $type>(address) }
    }};
}

impl StreamApi {
    /// Every function looked up; `Err` names the first one missing.
    pub fn resolve() -> Result<StreamApi, &'static CStr> {
        Ok(StreamApi {
            add_variable: function!(c"ngx_stream_add_variable", AddVariable),
            get_variable_index: function!(c"ngx_stream_get_variable_index", GetVariableIndex),
            get_flushed_variable: function!(c"ngx_stream_get_flushed_variable", GetFlushedVariable),
            compile_complex_value: function!(
                c"ngx_stream_compile_complex_value",
                CompileComplexValue
            ),
            complex_value: function!(c"ngx_stream_complex_value", ComplexValue),
            run_phases: function!(c"ngx_stream_core_run_phases", RunPhases),
            finalize_session: function!(c"ngx_stream_finalize_session", FinalizeSession),
            core_module: symbol(c"ngx_stream_core_module")?.cast_const().cast(),
        })
    }
}
