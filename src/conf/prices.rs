//! `rate_limit_prices NAME { MODEL input=USD output=USD [cached=USD]; ... }`: price tables
//! (`ratelimit_core::usage::prices`) a `usage=` line names with `prices=NAME`. A table may
//! be declared after the lines that use it: a name is given its index when first seen, and
//! every name used must be declared once the `http` block is read.

use core::ffi::{c_char, c_void};
use core::ptr;

use ngx::core::NGX_CONF_OK;
use ngx::ffi::{ngx_command_t, ngx_conf_parse, ngx_conf_t, ngx_http_variable_t};
use ngx::http::{HttpModuleMainConf, NgxHttpCoreModule};
use ratelimit_core::usage::prices::PriceTable;

use super::ext::ConfExt;
use super::{main_conf, ConfError, MainConf};

/// One name of `rate_limit_prices`, declared or only used so far.
#[derive(Default)]
pub struct NamedPrices {
    pub name: String,
    /// `None` until the `rate_limit_prices` block is read.
    pub table: Option<PriceTable>,
    /// Where a `prices=` word first named it: the error if it is never declared.
    pub used_at: Option<(String, usize)>,
}

/// The index of the table `name` in `mcf.prices`, added when it is new.
pub fn index_of(mcf: &mut MainConf, name: &str) -> usize {
    if let Some(index) = mcf.prices.iter().position(|named| named.name == name) {
        return index;
    }
    mcf.prices.push(NamedPrices {
        name: name.to_string(),
        ..NamedPrices::default()
    });
    mcf.prices.len() - 1
}

/// Once the `http` block is read: every table `prices=` names is declared.
pub fn check_declared(mcf: &MainConf) -> Result<(), ConfError> {
    let declared: Vec<&str> = mcf
        .prices
        .iter()
        .filter(|named| named.table.is_some())
        .map(|named| named.name.as_str())
        .collect();
    for named in &mcf.prices {
        if let (None, Some((file, line))) = (&named.table, &named.used_at) {
            return Err(ConfError::At {
                error: Box::new(ConfError::UnknownPrices {
                    name: named.name.clone(),
                    hint: unknown_table_hint(&named.name, &declared),
                }),
                file: file.clone(),
                line: *line,
            });
        }
    }
    Ok(())
}

/// Whether some directive read so far asked for variable `name` by index (a `log_format`
/// does): called once the `http` block is read.
pub fn variable_used(cf: &ngx_conf_t, name: &[u8]) -> bool {
    let Some(cmcf) = NgxHttpCoreModule::main_conf(cf) else {
        return false;
    };
    // SAFETY: the core module's `variables` array holds the variables indexed so far, each
    // an `ngx_http_variable_t`, in the configuration pool.
    let indexed = unsafe { crate::glue::array_slice::<ngx_http_variable_t>(&cmcf.variables) };
    indexed
        .iter()
        .any(|variable| variable.name.as_bytes().eq_ignore_ascii_case(name))
}

/// The table meant, or the tables declared.
fn unknown_table_hint(name: &str, declared: &[&str]) -> String {
    if let Some(meant) = ratelimit_core::hint::nearest_zone(name, declared) {
        return format!(", did you mean \"{meant}\"?");
    }
    let quoted: Vec<String> = declared.iter().map(|name| format!("\"{name}\"")).collect();
    match quoted.as_slice() {
        [] => ": no rate_limit_prices block is declared".to_string(),
        [only] => format!(": the only rate_limit_prices table is {only}"),
        _ => format!(": the rate_limit_prices tables are {}", quoted.join(", ")),
    }
}

/// `rate_limit_prices NAME { ... }`
pub extern "C" fn cmd_rate_limit_prices(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    _conf: *mut c_void,
) -> *mut c_char {
    crate::glue::guard::entry(
        "conf::prices::cmd_rate_limit_prices",
        || ngx::core::NGX_CONF_ERROR,
        || {
            // SAFETY: nginx calls directive handlers with a valid configuration context.
            let cf = unsafe { &mut *cf };
            match rate_limit_prices(cf) {
                Ok(()) => NGX_CONF_OK,
                Err(error) => cf.fail(&error),
            }
        },
    )
}

fn rate_limit_prices(cf: &mut ngx_conf_t) -> Result<(), ConfError> {
    let name = cf.words(1)?[0].to_string();
    let mut table = PriceTable::default();
    // As nginx's own `map` and `types` blocks: the block's lines go to `line_handler`, with
    // the table as its configuration; `cf` is restored afterwards.
    let saved = *cf;
    cf.handler = Some(line_handler);
    cf.handler_conf = ptr::addr_of_mut!(table).cast();
    // SAFETY: `cf` is positioned at the block's `{`; `ngx_conf_parse` reads to its `}`,
    // calling `line_handler` (which only uses the table above, alive for the call).
    let parsed = unsafe { ngx_conf_parse(cf, ptr::null_mut()) };
    *cf = saved;
    if parsed != NGX_CONF_OK {
        return Err(ConfError::Logged);
    }
    if table.models.is_empty() && table.default.is_none() {
        return Err(ConfError::EmptyPrices(name));
    }
    let mcf = main_conf(cf).ok_or(ConfError::Logged)?;
    let index = index_of(mcf, &name);
    let named = &mut mcf.prices[index];
    if named.table.is_some() {
        return Err(ConfError::DuplicatePrices(name));
    }
    named.table = Some(table);
    Ok(())
}

/// One line of a `rate_limit_prices` block.
unsafe extern "C" fn line_handler(
    cf: *mut ngx_conf_t,
    _dummy: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    crate::glue::guard::entry(
        "conf::prices::line_handler",
        || ngx::core::NGX_CONF_ERROR,
        || {
            // SAFETY: `ngx_conf_parse` passes the configuration context and the
            // `handler_conf` `rate_limit_prices` set: its table, alive while the block is read.
            let (cf, table) = unsafe { (&mut *cf, &mut *conf.cast::<PriceTable>()) };
            let result = cf.words(0).and_then(|words| {
                table.add_line(&words).map_err(|error| ConfError::Spec {
                    directive: "rate_limit_prices",
                    error,
                })
            });
            match result {
                Ok(()) => NGX_CONF_OK,
                Err(error) => cf.fail(&error),
            }
        },
    )
}
