//! The admin API of the rate limit module (`rate_limit_admin`), without nginx.
//!
//! The module reads a request's method, path and body, and hands them here with a view of its
//! zones ([`AdminZone`]); this crate answers with a [`Response`] to send as is. Everything here
//! runs in an nginx worker, where a panic would kill the worker: no input makes any function
//! of this crate panic (a property test feeds it arbitrary requests).
//!
//! | method + path | does |
//! |---|---|
//! | `GET zones` | object: zone name → zone |
//! | `GET zones/NAME` | one zone |
//! | `PATCH zones/NAME` | `{"rate": "20r/s", "burst": 10}`, either field optional |
//! | `GET zones/NAME/keys/KEY` | one key's state; 404 when untracked |
//! | `DELETE zones/NAME/keys/KEY` | forget the key's state (204) |
//! | `GET zones/NAME/overrides` | object: key → `{"rate", "burst"}` |
//! | `GET zones/NAME/overrides/KEY` | one override |
//! | `PUT zones/NAME/overrides/KEY` | `{"rate": "100r/s", "burst": 20}`; 201 new, 200 replaced |
//! | `DELETE zones/NAME/overrides/KEY` | back to the zone's limits (204) |
//! | `GET metrics` | Prometheus text |
//! | `GET zones/NAME/top?by=rejected\|delayed\|blocked\|tokens&window=1m\|10m&limit=N` | the keys limited most, or using the most tokens |
//! | `GET zones/NAME/history` | requests per second (passed, delayed, rejected), last 5 minutes |
//! | `GET zones/NAME/blocked` | the keys blocked now (`block=`): key, since, until, level |
//! | `GET zones/NAME/blocked/KEY` | one key's block; 404 when not blocked |
//! | `PUT zones/NAME/blocked/KEY` | `{"duration": "15m"}`: block by hand; 201 new, 200 replaced |
//! | `DELETE zones/NAME/blocked/KEY` | release the key (204) |
//! | `GET` (the root) | `{"write": bool, "zones": [...], ...}`: what this location offers |
//! | `GET dashboard` (or the root with `Accept: text/html`) | the live dashboard page |
//!
//! ```
//! use ratelimit_admin::memory::MemoryZone;
//! use ratelimit_admin::handle;
//! use ratelimit_core::{Algorithm, Limits, Rate};
//!
//! let limits = Limits { rate: Rate::parse("10r/s").unwrap(), burst: 5 };
//! let zones = [MemoryZone::new("api", Algorithm::LeakyBucket, limits)];
//! let response = handle(b"PATCH", b"zones/api", br#"{"rate": "20r/s"}"#, true, &zones);
//! assert_eq!((response.status, response.changed), (200, true));
//! let response = handle(b"PATCH", b"zones/api", br#"{"rate": "20r/s"}"#, false, &zones);
//! assert_eq!(response.status, 403);
//! assert_eq!(response.body_text(), "{\n  \"error\": \"this location is read-only: \\\"rate_limit_admin write=on\\\" allows changes\"\n}\n");
//! ```

// `unsafe` only in the state file's lock (`flock`: `File::lock` needs Rust 1.89, the workspace
// builds with 1.88).
#![deny(unsafe_code)]
pub mod body;
pub mod concurrency;
pub mod error;
pub mod history;
pub mod json;
pub mod memory;
pub mod metrics;
pub mod percent;
pub mod route;
pub mod state;
pub mod store;
pub mod top;
pub mod units;

pub use error::ApiError;
pub use route::Route;
pub use store::{
    AdminZone, BlockCounts, BlockInfo, BlockRefused, Counters, KeyState, OverrideRefused, Period,
    QuotaInfo, SpendInfo, SyncInfo, UsageInfo, ZoneInfo,
};

use std::borrow::Cow;

use ratelimit_core::top::{TopKind, TopWindow};
use ratelimit_core::Limits;

use json::{
    BlockJson, BlockedJson, Entries, ErrorJson, KeyJson, LimitsJson, OverrideJson, ZoneJson,
};

/// `GET` of the admin location's root.
#[derive(serde::Serialize)]
struct RootJson<'a> {
    /// Whether this location accepts changes (`rate_limit_admin write=on`).
    write: bool,
    /// The zones, in the configuration's order.
    zones: Vec<&'a str>,
    /// The zones that keep top keys (`GET zones/NAME/top`).
    top: Vec<&'a str>,
    /// The zones with a penalty box (`block=`, `GET zones/NAME/blocked`).
    blocks: Vec<&'a str>,
    /// The dashboard's path, relative to this location.
    dashboard: &'static str,
}

/// Largest request body read (`413` above), whatever `client_max_body_size` says.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// `Content-Type` of every answer but the metrics.
pub const JSON_CONTENT_TYPE: &str = "application/json";

/// `Content-Type` of the dashboard.
pub const HTML_CONTENT_TYPE: &str = "text/html; charset=utf-8";

/// The dashboard: one self-contained page (no external script, style, font or image).
pub const DASHBOARD_HTML: &str = include_str!("dashboard.html");

/// Attempts at a compare-and-swap of a zone's limits before giving up (another worker changing
/// the same zone hundreds of times meanwhile; never seen in practice).
const REPLACE_ATTEMPTS: usize = 1000;

/// What to send back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    /// Empty for 204.
    pub body: Vec<u8>,
    /// The `Allow` header of a 405.
    pub allow: Option<&'static str>,
    /// A zone's limits or overrides changed: the state file is to be written.
    pub changed: bool,
}

impl Response {
    fn json<T: serde::Serialize>(status: u16, value: &T) -> Response {
        Response::json_body(status, json::to_body(value))
    }

    /// A JSON answer serialized by the caller.
    fn json_body(status: u16, body: Vec<u8>) -> Response {
        Response {
            status,
            content_type: JSON_CONTENT_TYPE,
            body,
            allow: None,
            changed: false,
        }
    }

    fn no_content() -> Response {
        Response {
            status: 204,
            content_type: JSON_CONTENT_TYPE,
            body: Vec::new(),
            allow: None,
            changed: false,
        }
    }

    fn changed(mut self) -> Response {
        self.changed = true;
        self
    }

    /// The answer to a refused request: `{"error": "..."}` with the error's status.
    pub fn error(error: &ApiError) -> Response {
        let mut response = Response::json(
            error.status(),
            &ErrorJson {
                error: &error.to_string(),
            },
        );
        response.allow = error.allow();
        response
    }

    /// The body as text (lossy), for tests and logs.
    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Route a request before its body is read: the path, the method, and whether the location
/// allows writes (`write_allowed`, from `rate_limit_admin write=on`).
pub fn plan(method: &[u8], path: &[u8], write_allowed: bool) -> Result<Route, ApiError> {
    plan_with_query(method, path, b"", write_allowed)
}

/// [`plan`] with the request's query string (without `?`).
pub fn plan_with_query(
    method: &[u8],
    path: &[u8],
    query: &[u8],
    write_allowed: bool,
) -> Result<Route, ApiError> {
    let mut route = route::parse_with_query(method, path, query)?;
    if route.writes() && !write_allowed {
        return Err(ApiError::ReadOnly);
    }
    if let Route::Root { write } = &mut route {
        *write = write_allowed;
    }
    Ok(route)
}

/// Answer a whole request: [`plan`], the body limit, then [`execute`].
pub fn handle<Z: AdminZone>(
    method: &[u8],
    path: &[u8],
    body: &[u8],
    write_allowed: bool,
    zones: &[Z],
) -> Response {
    let route = match plan(method, path, write_allowed) {
        Ok(route) => route,
        Err(error) => return Response::error(&error),
    };
    if body.len() > MAX_BODY_BYTES && route.takes_body() {
        return Response::error(&ApiError::BodyTooLarge {
            limit: MAX_BODY_BYTES,
        });
    }
    execute(&route, body, zones)
}

/// Carry out a planned request. `body` is ignored by routes that take none.
pub fn execute<Z: AdminZone>(route: &Route, body: &[u8], zones: &[Z]) -> Response {
    match try_execute(route, body, zones) {
        Ok(response) => response,
        Err(error) => Response::error(&error),
    }
}

fn find<'a, Z: AdminZone>(zones: &'a [Z], name: &str) -> Result<&'a Z, ApiError> {
    zones
        .iter()
        .find(|zone| zone.name() == name)
        .ok_or_else(|| {
            let names: Vec<&str> = zones.iter().map(AdminZone::name).collect();
            ApiError::unknown_zone(name, &names)
        })
}

/// The zone called `name` and the key bytes a path's `key` means there (a `$binary_remote_addr`
/// zone takes `127.0.0.1` for its 4 bytes).
fn find_key<'a, 'k, Z: AdminZone>(
    zones: &'a [Z],
    name: &str,
    key: &'k [u8],
) -> Result<(&'a Z, Cow<'k, [u8]>), ApiError> {
    let zone = find(zones, name)?;
    Ok((zone, zone.key_form().parse(key)))
}

/// `key` as the zone's keys are shown (`127.0.0.1` for a `$binary_remote_addr` zone).
fn shown<Z: AdminZone>(zone: &Z, key: &[u8]) -> String {
    zone.key_form().show(key)
}

/// Apply a parsed `PATCH zones/NAME` body to the zone called `name`: what the route does, and
/// what the Lua API's `set_rate` and `set_burst` do, so every worker sees the change at once.
/// The caller persists the change (the state file) when this succeeds.
pub fn patch_zone<'a, Z: AdminZone>(
    zones: &'a [Z],
    name: &str,
    patch: &body::LimitsBody,
) -> Result<&'a Z, ApiError> {
    let zone = find(zones, name)?;
    if zone.concurrency_limits().is_some() {
        let field = if patch.rate.is_some() {
            "rate"
        } else {
            "burst"
        };
        return Err(ApiError::BadValue(format!(
            "zone \"{name}\" is a concurrency zone: it takes \"limit\" and \"queue\", not \
             \"{field}\""
        )));
    }
    let info = zone.info();
    patch.check_fields(name, info.algorithm)?;
    let mut current = zone.limits();
    for _ in 0..REPLACE_ATTEMPTS {
        let new = patch.apply_to(current);
        let burst_given = patch.burst.is_some();
        let capacity = info.log_capacity();
        body::check_limits(name, info.algorithm, &new, burst_given, capacity)?;
        // A `rate_limit` line's own burst meets the new rate too.
        if let Some(line_burst) = info.line_burst {
            let line = Limits {
                burst: line_burst,
                ..new
            };
            line.check_bucket(info.algorithm).map_err(|error| {
                ApiError::BadValue(format!(
                    "{error}: the burst= of a rate_limit line using zone \"{name}\""
                ))
            })?;
        }
        match zone.replace_limits(current, new) {
            Ok(()) => return Ok(zone),
            Err(found) => current = found,
        }
    }
    Err(ApiError::BadValue(format!(
        "zone \"{name}\" changed too often meanwhile, try again"
    )))
}

/// Apply a parsed `PATCH zones/NAME` body to concurrency zone `name`: one compare-and-swap
/// of its limits word, seen by every worker at once. The Lua API's `set_conn` and
/// `set_burst` on a concurrency zone.
pub fn patch_concurrency<'a, Z: AdminZone>(
    zones: &'a [Z],
    name: &str,
    patch: &concurrency::PatchBody,
) -> Result<&'a Z, ApiError> {
    let zone = find(zones, name)?;
    let Some(mut current) = zone.concurrency_limits() else {
        return Err(ApiError::BadValue(format!(
            "zone \"{name}\" is not a concurrency zone: it takes \"rate\" and \"burst\""
        )));
    };
    for _ in 0..REPLACE_ATTEMPTS {
        let new = patch.apply_to(name, current)?;
        match zone.replace_concurrency_limits(current, new) {
            Ok(()) => return Ok(zone),
            Err(found) => current = found,
        }
    }
    Err(ApiError::BadValue(format!(
        "zone \"{name}\" changed too often meanwhile, try again"
    )))
}

/// Carry out `route`: one function per route, in groups (zones, keys, the penalty box,
/// overrides, what the zones show).
fn try_execute<Z: AdminZone>(
    route: &Route,
    body: &[u8],
    zones: &[Z],
) -> Result<Response, ApiError> {
    match route {
        Route::ListZones => list_zones(zones),
        Route::GetZone { zone } => get_zone(zones, zone),
        Route::PatchZone { zone: name } => patch(zones, name, body),
        Route::GetKey { zone: name, key } => get_key(zones, name, key),
        Route::ForgetKey { zone: name, key } => forget_key(zones, name, key),
        Route::ListBlocked { zone: name } => list_blocked(zones, name),
        Route::GetBlocked { zone: name, key } => get_blocked(zones, name, key),
        Route::PutBlocked { zone: name, key } => put_blocked(zones, name, key, body),
        Route::ReleaseBlocked { zone: name, key } => release_blocked(zones, name, key),
        Route::ListOverrides { zone: name } => list_overrides(zones, name),
        Route::GetOverride { zone: name, key } => get_override(zones, name, key),
        Route::PutOverride { zone: name, key } => put_override(zones, name, key, body),
        Route::RemoveOverride { zone: name, key } => remove_override(zones, name, key),
        Route::Top { zone: name, query } => top_keys(zones, name, query),
        Route::History { zone: name } => history(zones, name),
        Route::Root { write } => root(zones, *write),
        Route::Dashboard => dashboard(),
        Route::Metrics => metrics(zones),
    }
}

// Zones.

/// `GET zones`.
fn list_zones<Z: AdminZone>(zones: &[Z]) -> Result<Response, ApiError> {
    let infos: Vec<_> = zones.iter().map(|zone| (zone, zone.info())).collect();
    let entries = infos
        .iter()
        .map(|(zone, info)| (zone.name().to_string(), ZoneJson::from(info)))
        .collect();
    Ok(Response::json(200, &Entries(entries)))
}

/// `GET zones/NAME`.
fn get_zone<Z: AdminZone>(zones: &[Z], zone: &str) -> Result<Response, ApiError> {
    let info = find(zones, zone)?.info();
    Ok(Response::json(200, &ZoneJson::from(&info)))
}

/// `PATCH zones/NAME`: a rate zone's rate and burst, a concurrency zone's limit and queue.
fn patch<Z: AdminZone>(zones: &[Z], name: &str, body: &[u8]) -> Result<Response, ApiError> {
    let zone = if find(zones, name)?.concurrency_limits().is_some() {
        let patch = concurrency::parse_patch(name, body)?;
        patch_concurrency(zones, name, &patch)?
    } else {
        patch_zone(zones, name, &body::parse_patch(body)?)?
    };
    Ok(Response::json(200, &ZoneJson::from(&zone.info())).changed())
}

// Keys.

/// `GET zones/NAME/keys/KEY`.
fn get_key<Z: AdminZone>(zones: &[Z], name: &str, key: &[u8]) -> Result<Response, ApiError> {
    if find(zones, name)?.concurrency_limits().is_some() {
        return get_concurrency_key(zones, name, key);
    }
    let (zone, key) = find_key(zones, name, key)?;
    let form = zone.key_form();
    let block = zone.block_of(&key);
    let state = zone.key_state(&key);
    match (state, block) {
        (Some(state), block) => {
            let mut json = KeyJson::new(name, shown(zone, &key), &state);
            json.block = block.as_ref().map(|block| BlockJson::new(block, form));
            if let Some(block) = &block {
                // Blocked: nothing passes before the block ends.
                json.would_pass = false;
                json.remaining = 0;
                json.retry_after_ms = json.retry_after_ms.max(block.left_ms);
            }
            Ok(Response::json(200, &json))
        }
        // A blocked key whose bucket drained (and was dropped) is still blocked.
        (None, Some(block)) => Ok(Response::json(200, &BlockJson::new(&block, form))),
        (None, None) => Err(ApiError::KeyNotTracked {
            zone: name.to_string(),
            key: shown(zone, &key),
        }),
    }
}

/// `GET zones/NAME/keys/KEY` of a concurrency zone.
fn get_concurrency_key<Z: AdminZone>(
    zones: &[Z],
    name: &str,
    key: &[u8],
) -> Result<Response, ApiError> {
    let (zone, key) = find_key(zones, name, key)?;
    let state = zone
        .concurrency_key(&key)
        .ok_or_else(|| ApiError::KeyNotTracked {
            zone: name.to_string(),
            key: shown(zone, &key),
        })?;
    Ok(Response::json(
        200,
        &concurrency::KeyJson::new(name, shown(zone, &key), &state),
    ))
}

/// `DELETE zones/NAME/keys/KEY`.
fn forget_key<Z: AdminZone>(zones: &[Z], name: &str, key: &[u8]) -> Result<Response, ApiError> {
    let (zone, key) = find_key(zones, name, key)?;
    if !zone.forget_key(&key) {
        return Err(ApiError::KeyNotTracked {
            zone: name.to_string(),
            key: shown(zone, &key),
        });
    }
    Ok(Response::no_content())
}

// The penalty box (`block=`).

/// `GET zones/NAME/blocked`.
fn list_blocked<Z: AdminZone>(zones: &[Z], name: &str) -> Result<Response, ApiError> {
    let zone = find(zones, name)?;
    let counts = zone
        .block_counts()
        .ok_or_else(|| ApiError::NoBlocks(name.to_string()))?;
    let form = zone.key_form();
    let blocked: Vec<BlockJson> = zone
        .blocked()
        .iter()
        .map(|block| BlockJson::new(block, form))
        .collect();
    Ok(Response::json(
        200,
        &BlockedJson::new(name, &counts, blocked),
    ))
}

/// `GET zones/NAME/blocked/KEY`.
fn get_blocked<Z: AdminZone>(zones: &[Z], name: &str, key: &[u8]) -> Result<Response, ApiError> {
    let (zone, key) = find_key(zones, name, key)?;
    zone.block_counts()
        .ok_or_else(|| ApiError::NoBlocks(name.to_string()))?;
    let block = zone.block_of(&key).ok_or_else(|| ApiError::NotBlocked {
        zone: name.to_string(),
        key: shown(zone, &key),
    })?;
    Ok(Response::json(
        200,
        &BlockJson::new(&block, zone.key_form()),
    ))
}

/// `PUT zones/NAME/blocked/KEY`: block by hand.
fn put_blocked<Z: AdminZone>(
    zones: &[Z],
    name: &str,
    key: &[u8],
    body: &[u8],
) -> Result<Response, ApiError> {
    let (zone, key) = find_key(zones, name, key)?;
    if key.is_empty() {
        return Err(ApiError::EmptyKey);
    }
    zone.block_counts()
        .ok_or_else(|| ApiError::NoBlocks(name.to_string()))?;
    let duration_ns = body::parse_block(body)?;
    let existed = zone.block_of(&key).is_some();
    let block = zone
        .block_key(&key, duration_ns)
        .map_err(|refused| match refused {
            BlockRefused::NoBlocks => ApiError::NoBlocks(name.to_string()),
            BlockRefused::Full => ApiError::BlocksFull(name.to_string()),
        })?;
    let status = if existed { 200 } else { 201 };
    Ok(Response::json(
        status,
        &BlockJson::new(&block, zone.key_form()),
    ))
}

/// `DELETE zones/NAME/blocked/KEY`: the block ends and the key's count is forgotten, so its
/// next request passes (a key released with a full bucket would be refused, and blocked
/// again, by its very next request). Its level is kept: caught again soon, it escalates.
fn release_blocked<Z: AdminZone>(
    zones: &[Z],
    name: &str,
    key: &[u8],
) -> Result<Response, ApiError> {
    let (zone, key) = find_key(zones, name, key)?;
    zone.block_counts()
        .ok_or_else(|| ApiError::NoBlocks(name.to_string()))?;
    if !zone.release_key(&key) {
        return Err(ApiError::NotBlocked {
            zone: name.to_string(),
            key: shown(zone, &key),
        });
    }
    // Not tracked (its bucket drained while blocked) is as good as forgotten.
    zone.forget_key(&key);
    Ok(Response::no_content())
}

// Overrides.

/// `GET zones/NAME/overrides`.
fn list_overrides<Z: AdminZone>(zones: &[Z], name: &str) -> Result<Response, ApiError> {
    let zone = find(zones, name)?;
    let algorithm = zone.algorithm();
    let entries = zone
        .overrides()
        .iter()
        .map(|(key, limits)| (shown(zone, key), LimitsJson::new(algorithm, limits)))
        .collect();
    Ok(Response::json(200, &Entries(entries)))
}

/// `GET zones/NAME/overrides/KEY`.
fn get_override<Z: AdminZone>(zones: &[Z], name: &str, key: &[u8]) -> Result<Response, ApiError> {
    let (zone, key) = find_key(zones, name, key)?;
    let limits = zone
        .override_for(&key)
        .ok_or_else(|| ApiError::NoOverride {
            zone: name.to_string(),
            key: shown(zone, &key),
        })?;
    Ok(Response::json(
        200,
        &OverrideJson::new(name, shown(zone, &key), zone.algorithm(), &limits),
    ))
}

/// `PUT zones/NAME/overrides/KEY`.
fn put_override<Z: AdminZone>(
    zones: &[Z],
    name: &str,
    key: &[u8],
    body: &[u8],
) -> Result<Response, ApiError> {
    let (zone, key) = find_key(zones, name, key)?;
    if zone.concurrency_limits().is_some() {
        return Err(ApiError::BadValue(format!(
            "zone \"{name}\" is a concurrency zone: it has no per-key overrides"
        )));
    }
    if key.is_empty() {
        return Err(ApiError::EmptyKey);
    }
    let request = body::parse_override(body)?;
    let info = zone.info();
    request.check_fields(name, info.algorithm)?;
    let limits = request.apply_to(info.limits);
    let burst_given = request.burst.is_some();
    let capacity = info.log_capacity();
    body::check_limits(name, info.algorithm, &limits, burst_given, capacity)?;
    let created = zone
        .set_override(&key, limits)
        .map_err(|refused| match refused {
            OverrideRefused::TableFull => ApiError::OverridesFull {
                zone: name.to_string(),
                capacity: info.override_capacity as usize,
            },
            OverrideRefused::NoMemory => ApiError::OverrideKeyNoMemory {
                zone: name.to_string(),
                key_bytes: key.len(),
                size: info.size,
            },
        })?;
    let status = if created { 201 } else { 200 };
    let json = OverrideJson::new(name, shown(zone, &key), info.algorithm, &limits);
    Ok(Response::json(status, &json).changed())
}

/// `DELETE zones/NAME/overrides/KEY`.
fn remove_override<Z: AdminZone>(
    zones: &[Z],
    name: &str,
    key: &[u8],
) -> Result<Response, ApiError> {
    let (zone, key) = find_key(zones, name, key)?;
    if !zone.remove_override(&key) {
        return Err(ApiError::NoOverride {
            zone: name.to_string(),
            key: shown(zone, &key),
        });
    }
    Ok(Response::no_content().changed())
}

// What the zones show: top keys, history, the root, the dashboard, the metrics.

/// `GET zones/NAME/top`.
fn top_keys<Z: AdminZone>(
    zones: &[Z],
    name: &str,
    query: &top::TopQuery,
) -> Result<Response, ApiError> {
    let zone = find(zones, name)?;
    let list = zone
        .top(query.kind, query.window, query.limit)
        .ok_or_else(|| ApiError::NoTopKeys(name.to_string()))?;
    let json = top::TopJson::new(name, query, &list, zone.key_form());
    Ok(Response::json(200, &json))
}

/// `GET zones/NAME/history`.
fn history<Z: AdminZone>(zones: &[Z], name: &str) -> Result<Response, ApiError> {
    let history = find(zones, name)?
        .history()
        .ok_or_else(|| ApiError::NoHistory(name.to_string()))?;
    // 900 numbers: each series on one line, not a line per number.
    let body = json::to_body_arrays_on_one_line(&history::HistoryJson::new(name, &history));
    Ok(Response::json_body(200, body))
}

/// `GET` of the location's root.
fn root<Z: AdminZone>(zones: &[Z], write: bool) -> Result<Response, ApiError> {
    Ok(Response::json(
        200,
        &RootJson {
            write,
            zones: zones.iter().map(|zone| zone.name()).collect(),
            top: zones
                .iter()
                .filter(|zone| {
                    let (kind, window) = (TopKind::Rejected, TopWindow::OneMinute);
                    zone.top(kind, window, 1).is_some()
                })
                .map(|zone| zone.name())
                .collect(),
            blocks: zones
                .iter()
                .filter(|zone| zone.block_counts().is_some())
                .map(|zone| zone.name())
                .collect(),
            dashboard: "dashboard",
        },
    ))
}

/// `GET dashboard`.
fn dashboard() -> Result<Response, ApiError> {
    Ok(Response {
        status: 200,
        content_type: HTML_CONTENT_TYPE,
        body: DASHBOARD_HTML.as_bytes().to_vec(),
        allow: None,
        changed: false,
    })
}

/// `GET metrics`.
fn metrics<Z: AdminZone>(zones: &[Z]) -> Result<Response, ApiError> {
    let infos: Vec<_> = zones
        .iter()
        .map(|zone| (zone.name().to_string(), zone.info()))
        .collect();
    let blocks: Vec<_> = zones.iter().map(|zone| zone.block_counts()).collect();
    Ok(Response {
        status: 200,
        content_type: metrics::CONTENT_TYPE,
        body: metrics::render_with_blocks(&infos, &blocks).into_bytes(),
        allow: None,
        changed: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use memory::MemoryZone;
    use ratelimit_core::{Algorithm, Limits, Rate};
    use serde_json::{json, Value};

    fn limits(rate: &str, burst: u64) -> Limits {
        Limits {
            rate: Rate::parse(rate).unwrap(),
            burst,
        }
    }

    fn zones() -> Vec<MemoryZone> {
        vec![
            MemoryZone::new("one", Algorithm::LeakyBucket, limits("10r/s", 5)),
            MemoryZone::new("log", Algorithm::SlidingLog, limits("100r/m", 0)),
        ]
    }

    /// (status, body as JSON) of a request on a location with write=on.
    fn call(zones: &[MemoryZone], method: &str, path: &str, body: &str) -> (u16, Value) {
        let response = handle(
            method.as_bytes(),
            path.as_bytes(),
            body.as_bytes(),
            true,
            zones,
        );
        let value = if response.body.is_empty() {
            Value::Null
        } else if response.content_type == JSON_CONTENT_TYPE {
            serde_json::from_slice(&response.body).unwrap()
        } else {
            Value::String(response.body_text())
        };
        (response.status, value)
    }

    #[test]
    fn zones_and_zone() {
        let zones = zones();
        zones[0].set_counters(Counters {
            passed: 3,
            rejected: 1,
            ..Counters::default()
        });
        zones[0].track(b"k", 2);
        let (status, all) = call(&zones, "GET", "zones", "");
        assert_eq!(status, 200);
        assert_eq!(all.as_object().unwrap().len(), 2);
        // Zones come in the configuration's order.
        let text = handle(b"GET", b"zones", b"", false, &zones).body_text();
        assert!(text.find("\"one\"") < text.find("\"log\""), "{text}");
        let (status, one) = call(&zones, "GET", "zones/one", "");
        assert_eq!(status, 200);
        assert_eq!(one, all["one"]);
        assert_eq!(
            one,
            json!({
                "algorithm": "leaky_bucket", "key": "$binary_remote_addr", "rate": "10r/s",
                "burst": 5, "size": 1048576, "slots": 1024, "keys": 1, "passed": 3,
                "delayed": 0, "rejected": 1, "delayed_dry_run": 0, "rejected_dry_run": 0,
                "evictions": 0, "no_slot": 0, "overrides": 0, "config": {"rate": "10r/s", "burst": 5}
            })
        );
        assert_eq!(call(&zones, "GET", "zones/two", "").0, 404);
    }

    #[test]
    fn patch_changes_either_field() {
        let zones = zones();
        let (status, zone) = call(&zones, "PATCH", "zones/one", r#"{"rate": "20r/s"}"#);
        assert_eq!(
            (status, &zone["rate"], &zone["burst"]),
            (200, &json!("20r/s"), &json!(5))
        );
        let (_, zone) = call(&zones, "PATCH", "zones/one", r#"{"burst": 0}"#);
        assert_eq!(
            (&zone["rate"], &zone["burst"]),
            (&json!("20r/s"), &json!(0))
        );
        assert_eq!(zone["config"], json!({"rate": "10r/s", "burst": 5}));
        let (status, _) = call(&zones, "PATCH", "zones/one", "{}");
        assert_eq!(status, 200);
        assert_eq!(zones[0].limits(), limits("20r/s", 0));
    }

    #[test]
    fn bad_patches_change_nothing() {
        let zones = zones();
        #[rustfmt::skip]
        let rows = [
            ("one", "{\"rate\": ", 400),
            ("one", r#"{"rate": 5}"#, 400),
            ("one", r#"{"burst": -1}"#, 400),
            ("one", r#"{"rate": "0r/s"}"#, 400),
            ("one", r#"{"rate": "1r/s", "extra": 1}"#, 400),
            ("log", r#"{"burst": 0}"#, 400),
            ("log", r#"{"rate": "101r/m"}"#, 400),
            ("log", r#"{"rate": "1.5r/m"}"#, 400),
            ("two", r#"{"rate": "1r/s"}"#, 404),
            ("one", r#"{"rate": "0.001r/d", "burst": 4194303}"#, 400),
            ("one", r#"{"rate": "0.001r/d", "burst": 36}"#, 400),
        ];
        for (zone, body, status) in rows {
            let (got, error) = call(&zones, "PATCH", &format!("zones/{zone}"), body);
            assert_eq!(got, status, "{body}: {error}");
            assert!(error["error"].is_string(), "{body}: {error}");
        }
        assert_eq!(zones[0].limits(), limits("10r/s", 5));
        assert_eq!(zones[1].limits(), limits("100r/m", 0));
        // A bucket that would take longer than 100 years names the largest burst.
        let (_, error) = call(
            &zones,
            "PATCH",
            "zones/one",
            r#"{"rate": "0.001r/d", "burst": 300}"#,
        );
        assert_eq!(
            error["error"],
            "burst 300 is too large for rate \"0.001r/d\" \
             (at most 35: a leaky_bucket must drain within 100 years)"
        );
        assert_eq!(
            call(
                &zones,
                "PATCH",
                "zones/one",
                r#"{"rate": "0.001r/d", "burst": 35}"#
            )
            .0,
            200
        );
        assert_eq!(
            call(
                &zones,
                "PATCH",
                "zones/one",
                r#"{"rate": "10r/s", "burst": 5}"#
            )
            .0,
            200
        );
        // A line's own burst must fit the new rate too: 300 at 0.001r/d does not.
        zones[0].set_line_burst(300);
        let (status, error) = call(&zones, "PATCH", "zones/one", r#"{"rate": "0.001r/d"}"#);
        assert_eq!(status, 400);
        assert_eq!(
            error["error"],
            "burst 300 is too large for rate \"0.001r/d\" (at most 35: a leaky_bucket must \
             drain within 100 years): the burst= of a rate_limit line using zone \"one\""
        );
        assert_eq!(zones[0].limits(), limits("10r/s", 5));
        assert_eq!(
            call(&zones, "PATCH", "zones/one", r#"{"rate": "1r/d"}"#).0,
            200
        );
        // Lowering a sliding log's N is fine; raising it back up to the configured N too.
        assert_eq!(
            call(&zones, "PATCH", "zones/log", r#"{"rate": "50r/m"}"#).0,
            200
        );
        assert_eq!(
            call(&zones, "PATCH", "zones/log", r#"{"rate": "100r/m"}"#).0,
            200
        );
    }

    #[test]
    fn keys() {
        let zones = zones();
        zones[0].track(b"a/b c", 0);
        let (status, error) = call(&zones, "GET", "zones/one/keys/nobody", "");
        assert_eq!(status, 404);
        assert_eq!(
            error["error"],
            "key \"nobody\" is not tracked in zone \"one\""
        );
        let (status, key) = call(&zones, "GET", "zones/one/keys/a%2Fb%20c", "");
        assert_eq!(status, 200);
        assert_eq!(
            key,
            json!({
                "zone": "one", "key": "a/b c", "rate": "10r/s", "burst": 5, "override": null,
                "would_pass": false, "remaining": 0, "retry_after_ms": 2, "reset_ms": 2001
            })
        );
        assert_eq!(
            call(&zones, "DELETE", "zones/one/keys/a/b%20c", ""),
            (204, Value::Null)
        );
        assert_eq!(call(&zones, "DELETE", "zones/one/keys/a/b%20c", "").0, 404);
        assert_eq!(call(&zones, "GET", "zones/one/keys/a/b%20c", "").0, 404);
    }

    #[test]
    fn overrides() {
        let zones = zones();
        let put = |key: &str, body: &str| {
            call(&zones, "PUT", &format!("zones/one/overrides/{key}"), body)
        };
        let (status, created) = put("vip%FF", r#"{"rate": "100r/s"}"#);
        assert_eq!(status, 201);
        assert_eq!(
            created,
            json!({"zone": "one", "key": "vip\u{fffd}", "rate": "100r/s", "burst": 5})
        );
        let (status, replaced) = put("vip%FF", r#"{"rate": "100r/s", "burst": 50}"#);
        assert_eq!((status, &replaced["burst"]), (200, &json!(50)));
        assert_eq!(
            put("", r#"{"rate": "1r/s"}"#).0,
            405,
            "an empty key is the list: GET only"
        );
        assert_eq!(put("x", r#"{"burst": 1}"#).0, 400);
        assert_eq!(put("x", r#"{"rate": "1r/s", "burst": -3}"#).0, 400);

        zones[0].track(b"vip\xff", 7);
        let (_, key) = call(&zones, "GET", "zones/one/keys/vip%ff", "");
        assert_eq!(key["override"], json!({"rate": "100r/s", "burst": 50}));
        assert_eq!(
            (&key["rate"], &key["burst"]),
            (&json!("100r/s"), &json!(50))
        );

        let (status, list) = call(&zones, "GET", "zones/one/overrides", "");
        assert_eq!(
            (status, list),
            (200, json!({"vip\u{fffd}": {"rate": "100r/s", "burst": 50}}))
        );
        assert_eq!(call(&zones, "GET", "zones/one/overrides/vip%FF", "").0, 200);
        assert_eq!(
            call(&zones, "DELETE", "zones/one/overrides/vip%FF", ""),
            (204, Value::Null)
        );
        assert_eq!(
            call(&zones, "DELETE", "zones/one/overrides/vip%FF", "").0,
            404
        );
        assert_eq!(call(&zones, "GET", "zones/one/overrides/vip%FF", "").0, 404);
        assert_eq!(call(&zones, "GET", "zones/one/overrides", "").1, json!({}));

        // Sliding algorithms take no burst; the log's capacity bounds overrides too.
        let put_log = |body: &str| call(&zones, "PUT", "zones/log/overrides/k", body);
        assert_eq!(put_log(r#"{"rate": "100r/m"}"#).0, 201);
        assert_eq!(put_log(r#"{"rate": "10r/m", "burst": 1}"#).0, 400);
        assert_eq!(put_log(r#"{"rate": "1000r/m"}"#).0, 400);
    }

    /// The zone's memory, not its table, is what is short: the 507 says so.
    #[test]
    fn overrides_out_of_memory_are_507_naming_the_memory() {
        let zones = zones();
        let key = |c: char| format!("zones/one/overrides/{}", c.to_string().repeat(700_000));
        assert_eq!(call(&zones, "PUT", &key('a'), r#"{"rate": "1r/s"}"#).0, 201);
        let (status, error) = call(&zones, "PUT", &key('b'), r#"{"rate": "1r/s"}"#);
        assert_eq!(status, 507);
        assert_eq!(
            error["error"],
            "zone \"one\" has no memory left for the key of another override (700000 bytes): \
             its 1048576 bytes are in use; a larger zone size holds more"
        );
    }

    #[test]
    fn a_full_override_table_is_507() {
        let zones = zones();
        for n in 0..4 {
            let path = format!("zones/one/overrides/k{n}");
            assert_eq!(call(&zones, "PUT", &path, r#"{"rate": "1r/s"}"#).0, 201);
        }
        let (status, error) = call(
            &zones,
            "PUT",
            "zones/one/overrides/k4",
            r#"{"rate": "1r/s"}"#,
        );
        assert_eq!(status, 507);
        assert_eq!(
            error["error"],
            "zone \"one\" has no room for another override (4 at most)"
        );
        // Replacing one still works.
        assert_eq!(
            call(
                &zones,
                "PUT",
                "zones/one/overrides/k0",
                r#"{"rate": "2r/s"}"#
            )
            .0,
            200
        );
    }

    #[test]
    fn changed_marks_the_writes_that_persist() {
        let zones = zones();
        zones[0].track(b"k", 1);
        #[rustfmt::skip]
        let rows = [
            ("PATCH", "zones/one", r#"{"burst": 1}"#, true),
            ("PUT", "zones/one/overrides/k", r#"{"rate": "1r/s"}"#, true),
            ("DELETE", "zones/one/overrides/k", "", true),
            ("DELETE", "zones/one/keys/k", "", false),
            ("PATCH", "zones/one", r#"{"burst": -1}"#, false),
            ("GET", "zones", "", false),
        ];
        for (method, path, body, changed) in rows {
            let response = handle(
                method.as_bytes(),
                path.as_bytes(),
                body.as_bytes(),
                true,
                &zones,
            );
            assert_eq!(response.changed, changed, "{method} {path}");
        }
    }

    #[test]
    fn read_only_locations_refuse_every_write() {
        let zones = zones();
        zones[0].track(b"k", 1);
        for (method, path) in [
            ("PATCH", "zones/one"),
            ("DELETE", "zones/one/keys/k"),
            ("PUT", "zones/one/overrides/k"),
            ("DELETE", "zones/one/overrides/k"),
        ] {
            let response = handle(method.as_bytes(), path.as_bytes(), b"{}", false, &zones);
            assert_eq!(response.status, 403, "{method} {path}");
        }
        assert!(zones[0].key_state(b"k").is_some());
        let response = handle(b"GET", b"zones/one/keys/k", b"", false, &zones);
        assert_eq!(response.status, 200);
    }

    #[test]
    fn bodies_over_the_limit_are_413() {
        let zones = zones();
        let big = format!("{{\"rate\": \"1r/s\"{}}}", " ".repeat(MAX_BODY_BYTES));
        let response = handle(b"PATCH", b"zones/one", big.as_bytes(), true, &zones);
        assert_eq!(response.status, 413);
        assert_eq!(zones[0].limits(), limits("10r/s", 5));
    }

    #[test]
    fn errors_are_json_with_allow_on_405() {
        let zones = zones();
        let response = handle(b"POST", b"zones/one", b"", true, &zones);
        assert_eq!(
            (response.status, response.allow),
            (405, Some("GET, HEAD, PATCH"))
        );
        let error: Value = serde_json::from_slice(&response.body).unwrap();
        assert_eq!(
            error,
            json!({"error": "method POST is not allowed here, use GET, HEAD, PATCH"})
        );
    }

    #[test]
    fn history_is_the_zones_own() {
        let zones = zones();
        let response = handle(b"GET", b"zones/one/history", b"", false, &zones);
        assert_eq!(response.status, 404);
        assert_eq!(
            response.body_text(),
            "{\n  \"error\": \"zone \\\"one\\\" keeps no history\"\n}\n"
        );
        let mut passed = vec![0; ratelimit_core::history::SECONDS];
        passed[299] = 4;
        zones[0].set_history(history::History {
            end_unix_s: 1_764_612_345,
            passed: passed.clone(),
            delayed: vec![0; 300],
            rejected: vec![1; 300],
        });
        let response = handle(b"GET", b"zones/one/history/", b"", false, &zones);
        assert_eq!(response.status, 200);
        let body: Value = serde_json::from_slice(&response.body).unwrap();
        assert_eq!(body["zone"], "one");
        assert_eq!(
            (body["seconds"].as_u64(), body["end"].as_u64()),
            (Some(300), Some(1_764_612_345))
        );
        assert_eq!(body["passed"], json!(passed));
        assert_eq!(body["rejected"][0], 1);
        let response = handle(b"PUT", b"zones/one/history", b"", true, &zones);
        assert_eq!((response.status, response.allow), (405, Some("GET, HEAD")));
        assert_eq!(
            handle(b"GET", b"zones/nope/history", b"", false, &zones).status,
            404
        );
    }

    /// 900 counts, one series a line: the object is pretty, its arrays are not.
    #[test]
    fn history_prints_each_series_on_one_line() {
        let zones = zones();
        let series = |first: u64| {
            let mut counts = vec![0; ratelimit_core::history::SECONDS];
            counts[..4].copy_from_slice(&[first, 0, 3, 11]);
            counts
        };
        zones[0].set_history(history::History {
            end_unix_s: 1_764_612_345,
            passed: series(7),
            delayed: series(8),
            rejected: series(9),
        });
        let response = handle(b"GET", b"zones/one/history", b"", false, &zones);
        let text = response.body_text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 8, "{text}");
        assert_eq!(
            lines[..4],
            [
                "{",
                "  \"zone\": \"one\",",
                "  \"seconds\": 300,",
                "  \"end\": 1764612345,"
            ]
        );
        let zeros = ", 0".repeat(296);
        assert_eq!(lines[4], format!("  \"passed\": [7, 0, 3, 11{zeros}],"));
        assert_eq!(lines[6], format!("  \"rejected\": [9, 0, 3, 11{zeros}]"));
        assert_eq!(lines[7], "}");
        assert!(text.ends_with("}\n"));
        let body: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(body["delayed"], json!(series(8)));
        // Every other answer stays as it was: pretty, arrays one value a line.
        let root = handle(b"GET", b"", b"", false, &zones).body_text();
        assert!(
            root.contains("\"zones\": [\n    \"one\",\n    \"log\"\n  ]"),
            "{root}"
        );
    }

    #[test]
    fn unknown_zones_are_named_with_the_zones_there_are() {
        let zones = [
            MemoryZone::new("per_client", Algorithm::LeakyBucket, limits("10r/s", 5)),
            MemoryZone::new("log", Algorithm::SlidingLog, limits("100r/m", 0)),
        ];
        let error = |path: &str| {
            let response = handle(b"GET", path.as_bytes(), b"", false, &zones);
            assert_eq!(response.status, 404, "{path}");
            let body: Value = serde_json::from_slice(&response.body).unwrap();
            body["error"].as_str().unwrap().to_string()
        };
        let list = "the zones are \"per_client\" and \"log\"";
        assert_eq!(
            error("zones/nozone"),
            format!("unknown zone \"nozone\": {list}")
        );
        // A three-letter name is too short to guess a typo of.
        assert_eq!(
            error("zones/logs/keys/k"),
            format!("unknown zone \"logs\": {list}")
        );
        assert_eq!(
            error("zones/perclient/history"),
            format!("unknown zone \"perclient\", did you mean \"per_client\"? {list}")
        );
        assert_eq!(
            error("zones/%FF"),
            "unknown zone \"\u{fffd}\": zone names are UTF-8 text"
        );
        let none: [MemoryZone; 0] = [];
        let response = handle(b"GET", b"zones/one", b"", false, &none);
        assert!(response
            .body_text()
            .contains("unknown zone \\\"one\\\": no zone is declared"));
    }

    #[test]
    fn top_keys_and_their_parameters() {
        let zones = zones();
        let now_ns = 20_000_000_000;
        for key in ["a", "b", "a", "c", "a", "b"] {
            zones[0].record_top(TopKind::Rejected, now_ns, key.as_bytes());
        }
        zones[0].record_top(TopKind::Delayed, now_ns, b"slow");
        let (status, top) = call(&zones, "GET", "zones/one/top", "");
        assert_eq!(status, 200);
        assert_eq!(
            top,
            json!({
                "zone": "one", "by": "rejected", "window": "1m", "total": 6,
                "capacity": 16, "key_bytes": 60,
                "keys": [
                    {"key": "a", "count": 3, "error": 0, "truncated": false},
                    {"key": "b", "count": 2, "error": 0, "truncated": false},
                    {"key": "c", "count": 1, "error": 0, "truncated": false}
                ]
            })
        );
        let top = |query: &str| {
            let response = handle_with_query(b"GET", b"zones/one/top", query.as_bytes(), &zones);
            let body: Value = serde_json::from_slice(&response.body).unwrap();
            (response.status, body)
        };
        let (_, limited) = top("limit=1&window=10m");
        assert_eq!(limited["keys"].as_array().unwrap().len(), 1);
        assert_eq!(limited["window"], "10m");
        assert_eq!(top("by=delayed").1["keys"][0]["key"], "slow");
        #[rustfmt::skip]
        let bad = [
            ("by=passed", "invalid by \"passed\": use rejected, delayed, blocked or tokens"),
            ("window=1h", "invalid window \"1h\": use 1m or 10m"),
            ("limit=0", "invalid limit \"0\": use a number from 1 to 100"),
            ("limit=101", "invalid limit \"101\": use a number from 1 to 100"),
            ("limit=x", "invalid limit \"x\": use a number from 1 to 100"),
            ("sort=count", "unknown parameter \"sort\": use by, window and limit"),
            ("by=%zz", "invalid percent-encoding \"%zz\" in path"),
        ];
        for (query, error) in bad {
            let (status, body) = top(query);
            assert_eq!(
                (status, body["error"].as_str().unwrap()),
                (400, error),
                "{query}"
            );
        }
        assert_eq!(call(&zones, "GET", "zones/nope/top", "").0, 404);
        assert_eq!(call(&zones, "PUT", "zones/one/top", "").0, 405);
    }

    /// `handle` with a query string, on a read-only location.
    fn handle_with_query(
        method: &[u8],
        path: &[u8],
        query: &[u8],
        zones: &[MemoryZone],
    ) -> Response {
        match plan_with_query(method, path, query, false) {
            Ok(route) => execute(&route, b"", zones),
            Err(error) => Response::error(&error),
        }
    }

    #[test]
    fn root_says_what_the_location_offers() {
        let zones = zones();
        for write in [true, false] {
            let response = handle(b"GET", b"", b"", write, &zones);
            let body: Value = serde_json::from_slice(&response.body).unwrap();
            assert_eq!(
                body,
                json!({
                    "write": write, "zones": ["one", "log"], "top": ["one", "log"],
                    "blocks": [], "dashboard": "dashboard"
                })
            );
        }
        let page = handle(b"GET", b"dashboard", b"", false, &zones);
        assert_eq!((page.status, page.content_type), (200, HTML_CONTENT_TYPE));
        let text = page.body_text();
        // Self-contained: nothing is loaded from elsewhere.
        // (The SVG namespace is a name, not a resource.)
        let text = text.replace("\"http://www.w3.org/2000/svg\"", "");
        for outside in ["http://", "https://", "src=", "@import", "url(", "//cdn"] {
            assert!(!text.contains(outside), "the dashboard refers to {outside}");
        }
        assert!(text.len() < 64 * 1024, "{} bytes", text.len());
    }

    #[test]
    fn concurrency_zones() {
        use concurrency::{AdaptiveKeyState, ConcurrencyKeyState};
        use ratelimit_core::adaptive::AdaptiveBounds;
        use ratelimit_core::concurrency::{ConcurrencyLimit, ConcurrencyLimits};
        let fixed = ConcurrencyLimits {
            limit: ConcurrencyLimit::Fixed(2),
            queue: 0,
        };
        let adaptive = ConcurrencyLimits {
            limit: ConcurrencyLimit::Adaptive(AdaptiveBounds::new(4, 500)),
            queue: 10,
        };
        let zones = vec![
            MemoryZone::concurrency("app", fixed),
            MemoryZone::concurrency("auto", adaptive),
        ];
        let held = ConcurrencyKeyState {
            lease: None,
            in_flight: 1,
            queued: 0,
            limit: 2,
            adaptive: None,
        };
        zones[0].set_in_flight(b"k", held);
        let (status, zone) = call(&zones, "GET", "zones/app", "");
        assert_eq!(status, 200);
        assert_eq!(
            zone,
            json!({
                "algorithm": "concurrency", "key": "$binary_remote_addr", "limit": 2,
                "queue": 0, "queue_timeout_ms": 5000, "in_flight": 1, "queued": 0,
                "size": 1048576, "slots": 1024, "keys": 1, "passed": 0, "delayed": 0,
                "rejected": 0, "delayed_dry_run": 0, "rejected_dry_run": 0, "evictions": 0, "no_slot": 0,
                "overrides": 0, "config": {"limit": 2, "queue": 0}
            })
        );
        let (status, key) = call(&zones, "GET", "zones/app/keys/k", "");
        assert_eq!(status, 200);
        assert_eq!(
            key,
            json!({"zone": "app", "key": "k", "in_flight": 1, "queued": 0, "limit": 2,
                   "would_pass": true})
        );
        assert_eq!(call(&zones, "GET", "zones/app/keys/nobody", "").0, 404);

        let (status, zone) = call(&zones, "PATCH", "zones/app", r#"{"limit": 3, "queue": 4}"#);
        assert_eq!(status, 200, "{zone}");
        assert_eq!((&zone["limit"], &zone["queue"]), (&json!(3), &json!(4)));
        assert_eq!(zone["config"], json!({"limit": 2, "queue": 0}));

        let learnt = ConcurrencyKeyState {
            lease: None,
            in_flight: 30,
            queued: 2,
            limit: 37,
            adaptive: Some(AdaptiveKeyState {
                phase: "track",
                no_load_us: 100_000,
                latency_us: 131_400,
            }),
        };
        zones[1].set_in_flight(b"api", learnt);
        let (_, zone) = call(&zones, "GET", "zones/auto", "");
        assert_eq!(
            (&zone["limit"], &zone["min"], &zone["max"]),
            (&json!("adaptive"), &json!(4), &json!(500))
        );
        assert_eq!(
            zone["adaptive"],
            json!({"limit": 37, "in_flight": 30, "phase": "track",
                   "no_load_latency_ms": 100.0, "latency_ms": 131.4})
        );
        let (_, key) = call(&zones, "GET", "zones/auto/keys/api", "");
        assert_eq!(
            (&key["limit"], &key["phase"]),
            (&json!(37), &json!("track"))
        );
        let (status, zone) = call(&zones, "PATCH", "zones/auto", r#"{"min": 8, "max": 50}"#);
        assert_eq!(
            (status, &zone["min"], &zone["max"]),
            (200, &json!(8), &json!(50))
        );

        #[rustfmt::skip]
        let refused = [
            ("app", r#"{"limit": 0}"#, "invalid limit 0: must be an integer from 1 to 16777215"),
            ("app", r#"{"queue": 40000}"#, "invalid queue 40000: must be an integer from 0 to 32767"),
            ("app", r#"{"limit": "7"}"#, "invalid limit \"7\": must be an integer from 1 to 16777215"),
            ("app", r#"{"rate": "1r/s"}"#, "zone \"app\" is a concurrency zone: it takes \"limit\" and \"queue\", not \"rate\""),
            ("app", r#"{"min": 2}"#, "zone \"app\" has a fixed limit: \"min\" and \"max\" are for limit=adaptive"),
            ("auto", r#"{"limit": 5}"#, "zone \"auto\" has limit=adaptive: change its \"min\" and \"max\""),
            ("auto", r#"{"min": 60}"#, "\"min\" 60 is more than \"max\" 50"),
            ("app", r#"{"other": 1}"#, "unknown field `other`, expected one of `limit`, `min`, `max`, `queue`, `rate`, `burst` at line 1 column 8"),
        ];
        for (zone, body, message) in refused {
            let (status, error) = call(&zones, "PATCH", &format!("zones/{zone}"), body);
            assert_eq!(
                (status, error["error"].as_str()),
                (400, Some(message)),
                "{body}"
            );
        }
        let (status, error) = call(
            &zones,
            "PUT",
            "zones/app/overrides/k",
            r#"{"rate": "1r/s"}"#,
        );
        assert_eq!(status, 400);
        assert_eq!(
            error["error"],
            "zone \"app\" is a concurrency zone: it has no per-key overrides"
        );
        assert_eq!(zones[0].concurrency_limits().map(|l| l.queue), Some(4));
    }

    #[test]
    fn metrics_are_text() {
        let zones = zones();
        let response = handle(b"GET", b"metrics", b"", false, &zones);
        assert_eq!(response.status, 200);
        assert_eq!(response.content_type, metrics::CONTENT_TYPE);
        assert!(response
            .body_text()
            .contains("rate_limit_zone_size_bytes{zone=\"log\"} 1048576\n"));
    }

    const S: u64 = 1_000_000_000;
    /// 2026-12-01 18:35:53 UTC, in nanoseconds.
    const NOW: u64 = 1_796_150_153 * S;

    fn penalty_zones() -> Vec<MemoryZone> {
        let login = MemoryZone::new("login", Algorithm::LeakyBucket, limits("5r/m", 5))
            .with_blocks(
                ratelimit_core::penalty::BlockPolicy {
                    block_ns: 900 * S,
                    block_max_ns: 86_400 * S,
                },
                64,
            );
        login.set_now(NOW);
        vec![login, zones().remove(0)]
    }

    #[test]
    fn blocked_keys_are_listed_set_and_released() {
        let zones = penalty_zones();
        zones[0].reject(b"203.0.113.9");
        zones[0].refuse_blocked(53);
        let (status, list) = call(&zones, "GET", "zones/login/blocked", "");
        assert_eq!(status, 200);
        assert_eq!(
            list,
            json!({
                "zone": "login", "block": "15m", "block_max": "1d", "count": 1, "capacity": 64,
                "blocked_requests": 53, "blocked_dry_run_requests": 0, "not_recorded": 0,
                "keys": [{"key": "203.0.113.9", "truncated": false, "since": 1_796_150_153.0,
                          "until": 1_796_151_053.0, "level": 0, "left_ms": 900_000}]
            })
        );
        // By hand: 201 for a new block, 200 when it replaces one.
        let (status, block) = call(
            &zones,
            "PUT",
            "zones/login/blocked/user%2F7",
            r#"{"duration": "2h"}"#,
        );
        assert_eq!(status, 201, "{block}");
        assert_eq!(
            (&block["key"], &block["left_ms"]),
            (&json!("user/7"), &json!(7_200_000))
        );
        let (status, _) = call(
            &zones,
            "PUT",
            "zones/login/blocked/user%2F7",
            r#"{"duration": "1m"}"#,
        );
        assert_eq!(status, 200);
        let (status, block) = call(&zones, "GET", "zones/login/blocked/user%2F7", "");
        assert_eq!((status, &block["left_ms"]), (200, &json!(60_000)));
        // A key's state shows its block; a blocked key whose bucket is gone still answers.
        zones[0].track(b"203.0.113.9", 3);
        let (status, key) = call(&zones, "GET", "zones/login/keys/203.0.113.9", "");
        assert_eq!(status, 200);
        assert_eq!(
            (&key["would_pass"], &key["remaining"]),
            (&json!(false), &json!(0))
        );
        assert_eq!(key["retry_after_ms"], 900_000);
        assert_eq!(key["block"]["level"], 0);
        let (status, key) = call(&zones, "GET", "zones/login/keys/user%2F7", "");
        assert_eq!((status, &key["left_ms"]), (200, &json!(60_000)));
        // Release: 204, then 404.
        let (status, _) = call(&zones, "DELETE", "zones/login/blocked/203.0.113.9", "");
        assert_eq!(status, 204);
        let (status, error) = call(&zones, "DELETE", "zones/login/blocked/203.0.113.9", "");
        assert_eq!(status, 404);
        assert_eq!(
            error["error"],
            "key \"203.0.113.9\" is not blocked in zone \"login\""
        );
        // The release forgot the key's count: nothing is left to show.
        let (status, _) = call(&zones, "GET", "zones/login/keys/203.0.113.9", "");
        assert_eq!(status, 404);
        let (_, list) = call(&zones, "GET", "zones/login/blocked", "");
        assert_eq!(list["count"], 1);
        // Rejected again within block_max of its release: the next level, twice as long.
        zones[0].reject(b"203.0.113.9");
        let (_, block) = call(&zones, "GET", "zones/login/blocked/203.0.113.9", "");
        assert_eq!(
            (&block["level"], &block["left_ms"]),
            (&json!(1), &json!(1_800_000))
        );
        // The root names the zones with blocks.
        let (_, root) = call(&zones, "GET", "", "");
        assert_eq!(root["blocks"], json!(["login"]));
    }

    #[test]
    fn binary_address_keys_are_shown_and_given_as_addresses() {
        let login = penalty_zones()
            .remove(0)
            .with_key_form(ratelimit_core::key_form::KeyForm::BinaryAddress);
        let zones = vec![login];
        let v6 = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7];
        zones[0].reject(&[127, 0, 0, 1]);
        zones[0].reject(&v6);
        zones[0].track(&[127, 0, 0, 1], 3);
        zones[0].record_top(TopKind::Rejected, NOW, &[127, 0, 0, 1]);
        let (_, list) = call(&zones, "GET", "zones/login/blocked", "");
        let keys: Vec<_> = list["keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| &k["key"])
            .collect();
        assert_eq!(keys, [&json!("127.0.0.1"), &json!("2001:db8::7")]);
        let (status, block) = call(&zones, "GET", "zones/login/blocked/2001:db8::7", "");
        assert_eq!((status, &block["key"]), (200, &json!("2001:db8::7")));
        let (status, key) = call(&zones, "GET", "zones/login/keys/127.0.0.1", "");
        assert_eq!((status, &key["key"]), (200, &json!("127.0.0.1")), "{key}");
        let (_, top) = call(&zones, "GET", "zones/login/top", "");
        assert_eq!(top["keys"][0]["key"], "127.0.0.1");
        // Overrides: given, listed and removed by address; the raw bytes still work.
        let (status, set) = call(
            &zones,
            "PUT",
            "zones/login/overrides/10.0.0.2",
            r#"{"rate": "1r/s"}"#,
        );
        assert_eq!((status, &set["key"]), (201, &json!("10.0.0.2")));
        assert!(zones[0].override_for(&[10, 0, 0, 2]).is_some());
        let (_, overrides) = call(&zones, "GET", "zones/login/overrides", "");
        assert!(overrides.get("10.0.0.2").is_some(), "{overrides}");
        assert_eq!(
            call(&zones, "DELETE", "zones/login/overrides/%0A%00%00%02", "").0,
            204
        );
        // Released by address: 204, then "not blocked", named by address.
        assert_eq!(
            call(&zones, "DELETE", "zones/login/blocked/127.0.0.1", "").0,
            204
        );
        let (status, error) = call(&zones, "DELETE", "zones/login/blocked/127.0.0.1", "");
        assert_eq!(status, 404);
        assert_eq!(
            error["error"],
            "key \"127.0.0.1\" is not blocked in zone \"login\""
        );
        // The release forgot the address's count too.
        assert!(zones[0].key_state(&[127, 0, 0, 1]).is_none());
        assert_eq!(
            call(&zones, "DELETE", "zones/login/keys/127.0.0.1", "").0,
            404
        );
    }

    #[test]
    fn block_errors_say_what_is_valid() {
        let zones = penalty_zones();
        #[rustfmt::skip]
        let rows = [
            ("GET", "zones/one/blocked", "", 404,
             "zone \"one\" has no penalty box: \"block=DURATION\" on its rate_limit_zone keeps blocked keys"),
            ("PUT", "zones/one/blocked/k", r#"{"duration": "1m"}"#, 404, "has no penalty box"),
            ("PUT", "zones/login/blocked/k", r#"{"duration": "15x"}"#, 400,
             "invalid duration \"15x\": give a duration such as 30s, 15m, 24h or 1h30m, from 1ms to 365d"),
            ("PUT", "zones/login/blocked/k", r#"{"seconds": 5}"#, 400,
             "unknown field `seconds`, expected `duration`"),
            ("PUT", "zones/login/blocked/k", "[1]", 400,
             "the body must be a JSON object such as {\"duration\": \"15m\"}"),
            ("PUT", "zones/login/blocked/", r#"{"duration": "1m"}"#, 405, "method PUT is not allowed here"),
            ("GET", "zones/login/blocked/nobody", "", 404, "key \"nobody\" is not blocked"),
            ("POST", "zones/login/blocked/k", "", 405, "use GET, HEAD, PUT, DELETE"),
        ];
        for (method, path, body, status, message) in rows {
            let (got, error) = call(&zones, method, path, body);
            assert_eq!(got, status, "{method} {path}: {error}");
            let text = error["error"].as_str().unwrap_or_default();
            assert!(text.contains(message), "{method} {path}: {text}");
        }
        // A read-only location refuses changes.
        let response = handle(b"DELETE", b"zones/login/blocked/k", b"", false, &zones);
        assert_eq!(response.status, 403);
    }

    #[test]
    fn blocked_metrics() {
        let zones = penalty_zones();
        zones[0].reject(b"a");
        zones[0].reject(b"b");
        zones[0].refuse_blocked(7);
        let text = handle(b"GET", b"metrics", b"", false, &zones).body_text();
        assert!(text.contains("rate_limit_requests_total{zone=\"login\",outcome=\"blocked\"} 7\n"));
        assert!(
            text.contains("rate_limit_blocked_keys{zone=\"login\"} 2\n"),
            "{text}"
        );
        // Zones without block= have neither.
        assert!(!text.contains("zone=\"one\",outcome=\"blocked\""));
        assert!(!text.contains("rate_limit_blocked_keys{zone=\"one\"}"));
    }
}
