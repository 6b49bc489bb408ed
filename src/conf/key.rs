//! Keys of the form `$arg_NAME`, read straight from the query string.
//!
//! nginx evaluates `$arg_NAME` through its variable API: an indexed-variable lookup, the
//! prefix variables' handler, then a case-insensitive substring search of the arguments,
//! more work than everything else the module does per request. A zone whose key is exactly
//! one `$arg_NAME` (and whose variable is nginx's own prefix variable, checked once per
//! configuration by [`resolve_query_arg_keys`]) has the request path find the value with
//! `ratelimit_core::key::query_arg` instead, by the same rules (tested there and against
//! nginx's own `$arg_` in t/directives.rs).

use ngx::ffi::{ngx_cycle_t, ngx_http_variable_t};
use ngx::http::{HttpModuleMainConf, NgxHttpCoreModule};

use super::RateLimitModule;
use crate::glue::array_slice;

/// For every zone whose key is a single `$arg_NAME` that nginx resolves with its own `arg_`
/// prefix variable (not a variable of the same name that `map`, `geo` or another module
/// defines), remember NAME so that requests read the value from the query string.
///
/// Runs once per configuration cycle, after nginx has bound every variable to its handler.
pub fn resolve_query_arg_keys(cycle: &ngx_cycle_t) {
    let (Some(mcf), Some(cmcf)) = (
        RateLimitModule::main_conf(cycle),
        NgxHttpCoreModule::main_conf(cycle),
    ) else {
        return;
    };
    // SAFETY: both arrays are initialized by the core module and hold `ngx_http_variable_t`
    // elements; they live as long as the cycle's configuration.
    let variables = unsafe { array_slice::<ngx_http_variable_t>(&cmcf.variables) };
    // SAFETY: as above.
    let prefixes = unsafe { array_slice::<ngx_http_variable_t>(&cmcf.prefix_variables) };
    let Some(arg_prefix) = prefixes
        .iter()
        .find(|prefix| prefix.name.as_bytes() == b"arg_")
    else {
        return;
    };
    for &zone in &mcf.zones {
        // SAFETY: zone configurations live in this cycle's configuration pool, and nothing
        // else reads them while the cycle is being initialized.
        let super::ZoneKey::HttpVariable(key) = &mut (unsafe { &mut *zone }).key else {
            continue;
        };
        key.query_arg = variables
            .get(key.index)
            .filter(|variable| {
                // nginx copied the prefix's handler pointer into the variable (so the two
                // values are equal, not merely the same function), and gave it the
                // variable's own name as its data.
                let handler = |v: &ngx_http_variable_t| v.get_handler.map(|f| f as usize);
                handler(variable).is_some()
                    && handler(variable) == handler(arg_prefix)
                    && variable.data == core::ptr::addr_of!(variable.name) as usize
            })
            .and_then(|variable| variable.name.as_bytes().strip_prefix(b"arg_"))
            .filter(|name| !name.is_empty())
            .map(|name| name.to_ascii_lowercase());
    }
}
