//! What a directive handler needs of `ngx_conf_t`: its words, the configuration pool, where
//! it is, and how to fail.

use core::ffi::c_char;
use core::ptr;

use ngx::core::{Pool, NGX_CONF_ERROR};
use ngx::ffi::{ngx_conf_t, ngx_str_t, NGX_LOG_EMERG};
use ngx::{ngx_conf_log_error, ngx_log_error};

use super::ConfError;

pub trait ConfExt {
    /// The directive's arguments, name included (`args()[0]`).
    fn args(&self) -> &'static [ngx_str_t];

    /// Arguments as text; a word that is not UTF-8 is an invalid parameter.
    fn words(&self, from: usize) -> Result<Vec<&'static str>, ConfError>;

    /// Allocate a value in the configuration pool (dropped with it).
    fn alloc<T>(&self, value: T) -> Result<*mut T, ConfError>;

    /// A copy of `bytes` in the configuration pool, which outlives configuration parsing.
    fn copy_str(&self, bytes: &[u8]) -> Result<ngx_str_t, ConfError>;

    /// The file and line of the directive being parsed.
    fn position(&self) -> (String, usize);

    /// Log `error` (at the directive being parsed, or at the place it names) as nginx logs
    /// configuration errors.
    fn log(&mut self, error: &ConfError);

    /// Log `error` and fail the directive.
    fn fail(&mut self, error: &ConfError) -> *mut c_char {
        self.log(error);
        NGX_CONF_ERROR
    }
}

impl ConfExt for ngx_conf_t {
    fn args(&self) -> &'static [ngx_str_t] {
        // SAFETY: while a directive handler runs, `cf.args` is an array of `ngx_str_t` holding
        // the directive name and its arguments, allocated in the configuration pool, which
        // outlives configuration parsing (the only time this is called).
        unsafe {
            let Some(args) = self.args.as_ref() else {
                return &[];
            };
            crate::glue::array_slice(args)
        }
    }

    fn words(&self, from: usize) -> Result<Vec<&'static str>, ConfError> {
        let args = self.args();
        args.get(from..)
            .unwrap_or_default()
            .iter()
            .map(|word| {
                core::str::from_utf8(word.as_bytes()).map_err(|_| {
                    ConfError::InvalidParameter(String::from_utf8_lossy(word.as_bytes()).into())
                })
            })
            .collect()
    }

    fn alloc<T>(&self, value: T) -> Result<*mut T, ConfError> {
        // SAFETY: `cf.pool` is the live configuration pool of the cycle being built.
        let pool = unsafe { Pool::from_ngx_pool(self.pool) };
        let allocated = pool.allocate(value);
        if allocated.is_null() {
            return Err(ConfError::Logged);
        }
        Ok(allocated)
    }

    fn copy_str(&self, bytes: &[u8]) -> Result<ngx_str_t, ConfError> {
        // SAFETY: `cf.pool` is the live configuration pool.
        let copy = unsafe { ngx::ffi::ngx_pnalloc(self.pool, bytes.len().max(1)) }.cast::<u8>();
        if copy.is_null() {
            return Err(ConfError::Logged);
        }
        // SAFETY: `copy` has room for `bytes.len()` bytes.
        unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), copy, bytes.len()) };
        Ok(ngx_str_t {
            len: bytes.len(),
            data: copy,
        })
    }

    fn position(&self) -> (String, usize) {
        // SAFETY: while a directive is parsed, `conf_file` is the file being read.
        match unsafe { self.conf_file.as_ref() } {
            Some(file) => (
                String::from_utf8_lossy(file.file.name.as_bytes()).into_owned(),
                file.line,
            ),
            None => (String::from("(unknown file)"), 0),
        }
    }

    fn log(&mut self, error: &ConfError) {
        match error {
            ConfError::Logged => {}
            // The message names its own place: nginx's position is elsewhere.
            ConfError::At { .. } => {
                ngx_log_error!(NGX_LOG_EMERG, self.log, "{error}");
            }
            _ => {
                ngx_conf_log_error!(NGX_LOG_EMERG, self, "{error}");
            }
        }
    }
}

/// The module of the cycle being configured named `name` (`c"ngx_http_proxy_module"`), when
/// this nginx has it: a build may leave any module out.
pub fn module_named(
    cf: &ngx_conf_t,
    name: &core::ffi::CStr,
) -> Option<&'static ngx::ffi::ngx_module_t> {
    // SAFETY: the cycle being configured and its module table (`modules_n` entries) are live
    // while the configuration is read (and its modules as long as the cycle).
    let modules = unsafe {
        let cycle = cf.cycle.as_ref()?;
        if cycle.modules.is_null() {
            return None;
        }
        core::slice::from_raw_parts(cycle.modules, cycle.modules_n)
    };
    modules.iter().find_map(|&module| {
        // SAFETY: each entry is a registered module; its `name` is a NUL-terminated string.
        let module = unsafe { module.as_ref()? };
        // SAFETY: as above.
        (unsafe { core::ffi::CStr::from_ptr(module.name) } == name).then_some(module)
    })
}
