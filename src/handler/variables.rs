//! The http door's variables, in one table registered by one loop.

use ngx::ffi::{
    ngx_conf_t, ngx_http_add_variable, ngx_http_get_variable_pt, ngx_http_request_t,
    ngx_http_variable_value_t, ngx_int_t, ngx_uint_t, NGX_HTTP_VAR_NOCACHEABLE,
};
use ratelimit_core::api_key::Api;

use super::api_key::{api_key_variable, LOCATION_API};
use super::body::model_variable;
use super::remote_net::remote_net_variable;
use super::status::status_variable;
use super::usage::{
    usage_variable, CACHED_TOKENS, COMPLETION_TOKENS, COST, MODEL, PROMPT_TOKENS, TOTAL_TOKENS,
};
use crate::conf::ConfError;
use crate::glue::variables::{register, Variable};

/// Recomputed at each read: `$rate_limit_remote_net` and `$rate_limit_api_key` depend on the
/// location they are read in (an internal redirect may land in a location with other prefix
/// lengths; a server-level `if` reads the key before the location is known, with every place
/// read); the request's outcome, its body's model and its response's usage are known only
/// as the request goes on.
const NOCACHEABLE: ngx_uint_t = NGX_HTTP_VAR_NOCACHEABLE as ngx_uint_t;

/// Name, getter, the getter's `data`, flags. The per-provider `$rate_limit_api_key_*` are
/// cacheable: the headers and the query string they read are the request's own.
#[rustfmt::skip]
static VARIABLES: [Variable<ngx_http_get_variable_pt>; 14] = [
    row("rate_limit_status",                  status_variable,     0, NOCACHEABLE),
    row("rate_limit_remote_net",              remote_net_variable, 0, NOCACHEABLE),
    row("rate_limit_api_key",                 api_key_variable,    LOCATION_API, NOCACHEABLE),
    row("rate_limit_api_key_openai",          api_key_variable,    Api::OpenAi as usize, 0),
    row("rate_limit_api_key_anthropic",       api_key_variable,    Api::Anthropic as usize, 0),
    row("rate_limit_api_key_gemini",          api_key_variable,    Api::Gemini as usize, 0),
    row("rate_limit_api_key_azure",           api_key_variable,    Api::Azure as usize, 0),
    row("rate_limit_llm_model",               model_variable,      0, NOCACHEABLE),
    row("rate_limit_usage_prompt_tokens",     usage_variable,      PROMPT_TOKENS, NOCACHEABLE),
    row("rate_limit_usage_completion_tokens", usage_variable,      COMPLETION_TOKENS, NOCACHEABLE),
    row("rate_limit_usage_cached_tokens",     usage_variable,      CACHED_TOKENS, NOCACHEABLE),
    row("rate_limit_usage_total_tokens",      usage_variable,      TOTAL_TOKENS, NOCACHEABLE),
    row("rate_limit_usage_cost",              usage_variable,      COST, NOCACHEABLE),
    row("rate_limit_usage_model",             usage_variable,      MODEL, NOCACHEABLE),
];

/// A getter as nginx calls it.
type Getter = unsafe extern "C" fn(
    *mut ngx_http_request_t,
    *mut ngx_http_variable_value_t,
    usize,
) -> ngx_int_t;

const fn row(
    name: &'static str,
    get: Getter,
    data: usize,
    flags: ngx_uint_t,
) -> Variable<ngx_http_get_variable_pt> {
    Variable {
        name,
        get: Some(get),
        data,
        flags,
    }
}

/// Register the module's variables: `$rate_limit_status`, `$rate_limit_remote_net`,
/// `$rate_limit_api_key` (and its four per-provider twins), `$rate_limit_llm_model` and the
/// `$rate_limit_usage_*`.
pub fn add_variables(cf: &mut ngx_conf_t) -> Result<(), ConfError> {
    // SAFETY: `cf` is the live configuration being read; ngx_http_add_variable returns null
    // (having logged why) or the live definition of the name.
    unsafe {
        register(&VARIABLES, |name, flags| {
            ngx_http_add_variable(cf, name, flags)
        })
    }
    .ok_or(ConfError::Logged)
}
