//! From a request line to a [`Route`]: the location prefix, the path's segments, percent-decoding
//! of zone names and keys, and which methods each path accepts.

use crate::error::ApiError;
use crate::percent::hex;
pub use crate::percent::{percent_decode, percent_encode};
use crate::top::{parse_query, TopQuery};

/// What a request asks for, with its method already checked against the path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// `GET zones`
    ListZones,
    /// `GET zones/NAME`
    GetZone { zone: String },
    /// `PATCH zones/NAME`
    PatchZone { zone: String },
    /// `GET zones/NAME/keys/KEY`
    GetKey { zone: String, key: Vec<u8> },
    /// `DELETE zones/NAME/keys/KEY`
    ForgetKey { zone: String, key: Vec<u8> },
    /// `GET zones/NAME/overrides`
    ListOverrides { zone: String },
    /// `GET zones/NAME/overrides/KEY`
    GetOverride { zone: String, key: Vec<u8> },
    /// `PUT zones/NAME/overrides/KEY`
    PutOverride { zone: String, key: Vec<u8> },
    /// `DELETE zones/NAME/overrides/KEY`
    RemoveOverride { zone: String, key: Vec<u8> },
    /// `GET zones/NAME/blocked`
    ListBlocked { zone: String },
    /// `GET zones/NAME/blocked/KEY`
    GetBlocked { zone: String, key: Vec<u8> },
    /// `PUT zones/NAME/blocked/KEY`: block by hand
    PutBlocked { zone: String, key: Vec<u8> },
    /// `DELETE zones/NAME/blocked/KEY`: release
    ReleaseBlocked { zone: String, key: Vec<u8> },
    /// `GET metrics`
    Metrics,
    /// `GET zones/NAME/top?by=..&window=..&limit=..`
    Top { zone: String, query: TopQuery },
    /// `GET zones/NAME/history`: requests per second over the last minutes.
    History { zone: String },
    /// `GET` of the location's root: what the API offers here (`write`: the location allows
    /// changes, set by [`crate::plan`]).
    Root { write: bool },
    /// `GET dashboard` (or the root asked for as `text/html`): the live dashboard page.
    Dashboard,
}

impl Route {
    /// Whether the route changes anything (refused on a location without `write=on`).
    pub fn writes(&self) -> bool {
        matches!(
            self,
            Route::PatchZone { .. }
                | Route::ForgetKey { .. }
                | Route::PutOverride { .. }
                | Route::RemoveOverride { .. }
                | Route::PutBlocked { .. }
                | Route::ReleaseBlocked { .. }
        )
    }

    /// Whether the route reads a JSON request body.
    pub fn takes_body(&self) -> bool {
        matches!(
            self,
            Route::PatchZone { .. } | Route::PutOverride { .. } | Route::PutBlocked { .. }
        )
    }
}

/// The resources of the API, before the method is looked at.
enum Resource {
    Zones,
    Zone(String),
    Key(String, Vec<u8>),
    Overrides(String),
    Override(String, Vec<u8>),
    Blocked(String),
    BlockedKey(String, Vec<u8>),
    Metrics,
    Top(String),
    History(String),
    Root,
    Dashboard,
}

impl Resource {
    /// Methods the resource accepts, as an `Allow` header says them.
    fn allow(&self) -> &'static str {
        match self {
            Resource::Zones
            | Resource::Overrides(_)
            | Resource::Blocked(_)
            | Resource::Metrics
            | Resource::Top(_)
            | Resource::History(_)
            | Resource::Root
            | Resource::Dashboard => "GET, HEAD",
            Resource::Zone(_) => "GET, HEAD, PATCH",
            Resource::Key(..) => "GET, HEAD, DELETE",
            Resource::Override(..) | Resource::BlockedKey(..) => "GET, HEAD, PUT, DELETE",
        }
    }
}

/// Parse `method` and `path` (relative to the admin location, still percent-encoded, without
/// the query string) into a route.
///
/// ```
/// use ratelimit_admin::route::{parse, Route};
///
/// let route = parse(b"DELETE", b"zones/api/keys/user%2F7%20a").unwrap();
/// assert_eq!(route, Route::ForgetKey { zone: "api".into(), key: b"user/7 a".to_vec() });
/// // Slashes need no encoding in a key: everything after `keys/` is the key.
/// assert_eq!(parse(b"GET", b"zones/api/keys/a/b").unwrap(),
///            Route::GetKey { zone: "api".into(), key: b"a/b".to_vec() });
/// assert_eq!(parse(b"POST", b"zones").unwrap_err().status(), 405);
/// ```
pub fn parse(method: &[u8], path: &[u8]) -> Result<Route, ApiError> {
    parse_with_query(method, path, b"")
}

/// [`parse`] with the request's query string (without `?`), which only `zones/NAME/top` reads.
///
/// ```
/// use ratelimit_admin::route::{parse_with_query, Route};
///
/// let Route::Top { zone, query } = parse_with_query(b"GET", b"zones/api/top", b"limit=3").unwrap()
/// else { panic!() };
/// assert_eq!((zone.as_str(), query.limit), ("api", 3));
/// assert_eq!(parse_with_query(b"GET", b"zones/api/top", b"limit=0").unwrap_err().status(), 400);
/// ```
pub fn parse_with_query(method: &[u8], path: &[u8], query: &[u8]) -> Result<Route, ApiError> {
    let resource = resource(path)?;
    let route = match (method, resource) {
        (b"GET" | b"HEAD", Resource::Zones) => Route::ListZones,
        (b"GET" | b"HEAD", Resource::Zone(zone)) => Route::GetZone { zone },
        (b"PATCH", Resource::Zone(zone)) => Route::PatchZone { zone },
        (b"GET" | b"HEAD", Resource::Key(zone, key)) => Route::GetKey { zone, key },
        (b"DELETE", Resource::Key(zone, key)) => Route::ForgetKey { zone, key },
        (b"GET" | b"HEAD", Resource::Overrides(zone)) => Route::ListOverrides { zone },
        (b"GET" | b"HEAD", Resource::Override(zone, key)) => Route::GetOverride { zone, key },
        (b"PUT", Resource::Override(zone, key)) => Route::PutOverride { zone, key },
        (b"DELETE", Resource::Override(zone, key)) => Route::RemoveOverride { zone, key },
        (b"GET" | b"HEAD", Resource::Blocked(zone)) => Route::ListBlocked { zone },
        (b"GET" | b"HEAD", Resource::BlockedKey(zone, key)) => Route::GetBlocked { zone, key },
        (b"PUT", Resource::BlockedKey(zone, key)) => Route::PutBlocked { zone, key },
        (b"DELETE", Resource::BlockedKey(zone, key)) => Route::ReleaseBlocked { zone, key },
        (b"GET" | b"HEAD", Resource::Metrics) => Route::Metrics,
        (b"GET" | b"HEAD", Resource::Top(zone)) => Route::Top {
            zone,
            query: parse_query(query)?,
        },
        (b"GET" | b"HEAD", Resource::History(zone)) => Route::History { zone },
        (b"GET" | b"HEAD", Resource::Root) => Route::Root { write: false },
        (b"GET" | b"HEAD", Resource::Dashboard) => Route::Dashboard,
        (_, resource) => {
            return Err(ApiError::MethodNotAllowed {
                method: String::from_utf8_lossy(method).into_owned(),
                allow: resource.allow(),
            })
        }
    };
    Ok(route)
}

fn resource(path: &[u8]) -> Result<Resource, ApiError> {
    let unknown = || ApiError::UnknownPath(String::from_utf8_lossy(path).into_owned());
    let path = path.strip_prefix(b"/").unwrap_or(path);
    let (first, rest) = split_segment(path);
    match (first, rest) {
        (b"", None) => return Ok(Resource::Root),
        (b"dashboard", None) => return Ok(Resource::Dashboard),
        (b"metrics", None | Some(b"")) => return Ok(Resource::Metrics),
        (b"zones", None | Some(b"")) => return Ok(Resource::Zones),
        (b"zones", Some(rest)) => {
            let (name, rest) = split_segment(rest);
            let zone = zone_name(name)?;
            let resource = match rest.map(split_segment) {
                None | Some((b"", None)) => Resource::Zone(zone),
                Some((b"keys", Some(key))) if !key.is_empty() => {
                    Resource::Key(zone, percent_decode(key)?)
                }
                Some((b"overrides", None | Some(b""))) => Resource::Overrides(zone),
                Some((b"overrides", Some(key))) => Resource::Override(zone, percent_decode(key)?),
                Some((b"top", None | Some(b""))) => Resource::Top(zone),
                Some((b"history", None | Some(b""))) => Resource::History(zone),
                Some((b"blocked", None | Some(b""))) => Resource::Blocked(zone),
                Some((b"blocked", Some(key))) => Resource::BlockedKey(zone, percent_decode(key)?),
                Some(_) => return Err(unknown()),
            };
            return Ok(resource);
        }
        _ => {}
    }
    Err(unknown())
}

/// `a/b/c` → (`a`, Some(`b/c`)); `a` → (`a`, None).
fn split_segment(path: &[u8]) -> (&[u8], Option<&[u8]>) {
    match path.iter().position(|&b| b == b'/') {
        Some(at) => (&path[..at], Some(&path[at + 1..])),
        None => (path, None),
    }
}

fn zone_name(raw: &[u8]) -> Result<String, ApiError> {
    let decoded = percent_decode(raw)?;
    if decoded.is_empty() {
        return Err(ApiError::UnknownPath(
            String::from_utf8_lossy(raw).into_owned(),
        ));
    }
    // Zone names come from the configuration, which nginx reads as bytes; a name that is not
    // UTF-8 cannot match any zone (the module keeps names as UTF-8 text).
    String::from_utf8(decoded).map_err(|error| ApiError::UnknownZone {
        name: String::from_utf8_lossy(error.as_bytes()).into(),
        hint: ": zone names are UTF-8 text".to_string(),
    })
}

/// What follows the location's prefix in a request target (`/ratelimit/zones?x=1` under
/// `location /ratelimit/` gives `zones`), without the query string.
///
/// nginx matched the location against the decoded URI, so the prefix is compared with the
/// target decoded on the fly (`/rate%6Cimit/zones` still gives `zones`); the rest is returned
/// still encoded, so that `%2F` inside a key stays distinct from `/`. `None` when the target
/// does not start with the prefix (a regex location, or slashes nginx merged): the API answers
/// 404 then.
///
/// ```
/// use ratelimit_admin::route::strip_location;
///
/// assert_eq!(strip_location(b"/ratelimit/zones/a%2Fb?x", b"/ratelimit/"), Some(&b"zones/a%2Fb"[..]));
/// assert_eq!(strip_location(b"/rate%6Cimit/metrics", b"/ratelimit/"), Some(&b"metrics"[..]));
/// assert_eq!(strip_location(b"/other/zones", b"/ratelimit/"), None);
/// ```
pub fn strip_location<'a>(target: &'a [u8], location: &[u8]) -> Option<&'a [u8]> {
    let path = match target.iter().position(|&b| b == b'?') {
        Some(at) => &target[..at],
        None => target,
    };
    let mut at = 0;
    for &expected in location {
        let byte = *path.get(at)?;
        let decoded = if byte == b'%' {
            let value = hex(*path.get(at + 1)?).zip(hex(*path.get(at + 2)?));
            let (high, low) = value?;
            at += 3;
            high << 4 | low
        } else {
            at += 1;
            byte
        };
        if decoded != expected {
            return None;
        }
    }
    path.get(at..)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(method: &str, path: &str) -> Result<Route, (u16, String)> {
        parse(method.as_bytes(), path.as_bytes()).map_err(|e| (e.status(), e.to_string()))
    }

    fn zone(name: &str) -> String {
        name.to_string()
    }

    #[test]
    fn every_row_of_the_table() {
        #[rustfmt::skip]
        let rows: Vec<(&str, &str, Route)> = vec![
            ("GET", "zones", Route::ListZones),
            ("HEAD", "zones/", Route::ListZones),
            ("GET", "/zones", Route::ListZones),
            ("GET", "zones/one", Route::GetZone { zone: zone("one") }),
            ("GET", "zones/one/", Route::GetZone { zone: zone("one") }),
            ("GET", "zones/o%6Ee", Route::GetZone { zone: zone("one") }),
            ("PATCH", "zones/one", Route::PatchZone { zone: zone("one") }),
            ("GET", "zones/one/keys/k", Route::GetKey { zone: zone("one"), key: b"k".to_vec() }),
            ("DELETE", "zones/one/keys/a%2Fb%20c", Route::ForgetKey { zone: zone("one"), key: b"a/b c".to_vec() }),
            ("GET", "zones/one/keys/a/b/", Route::GetKey { zone: zone("one"), key: b"a/b/".to_vec() }),
            ("GET", "zones/one/keys/%FF%00", Route::GetKey { zone: zone("one"), key: b"\xff\0".to_vec() }),
            ("GET", "zones/one/overrides", Route::ListOverrides { zone: zone("one") }),
            ("GET", "zones/one/overrides/", Route::ListOverrides { zone: zone("one") }),
            ("GET", "zones/one/overrides/k", Route::GetOverride { zone: zone("one"), key: b"k".to_vec() }),
            ("PUT", "zones/one/overrides/k+1", Route::PutOverride { zone: zone("one"), key: b"k+1".to_vec() }),
            ("DELETE", "zones/one/overrides/k", Route::RemoveOverride { zone: zone("one"), key: b"k".to_vec() }),
            ("GET", "metrics", Route::Metrics),
            ("HEAD", "metrics/", Route::Metrics),
        ];
        for (method, path, expected) in rows {
            assert_eq!(route(method, path), Ok(expected), "{method} {path}");
        }
    }

    #[test]
    fn root_dashboard_and_top() {
        assert_eq!(route("GET", ""), Ok(Route::Root { write: false }));
        assert_eq!(route("GET", "/"), Ok(Route::Root { write: false }));
        assert_eq!(route("HEAD", "dashboard"), Ok(Route::Dashboard));
        assert_eq!(
            route("GET", "zones/one/top/"),
            Ok(Route::Top {
                zone: "one".into(),
                query: TopQuery::default()
            })
        );
        assert_eq!(route("POST", "").map_err(|e| e.0), Err(405));
    }

    #[test]
    fn unknown_paths_are_404_and_bad_encoding_400() {
        for path in [
            "zone",
            "zones//",
            "zones/one/keys",
            "zones/one/keys/",
            "zones/one/other",
            "zones/one/overrides/k/../x/../..%2F",
            "metrics/x",
            "metricsx",
            "dashboard/",
            "zones/one/top/x",
        ] {
            let result = route("GET", path);
            if path == "zones/one/overrides/k/../x/../..%2F" {
                // Everything after `overrides/` is a key, dots and all.
                assert!(result.is_ok(), "{path}");
                continue;
            }
            assert_eq!(result.map_err(|e| e.0), Err(404), "{path}");
        }
        for path in ["zones/a%zz", "zones/one/keys/%4", "zones/one/overrides/%"] {
            let (status, message) = route("GET", path).unwrap_err();
            assert_eq!(status, 400, "{path}");
            assert!(message.contains("percent"), "{message}");
        }
    }

    #[test]
    fn wrong_methods_name_the_allowed_ones() {
        #[rustfmt::skip]
        let rows = [
            ("POST", "zones", "GET, HEAD"),
            ("PATCH", "zones", "GET, HEAD"),
            ("DELETE", "zones/one", "GET, HEAD, PATCH"),
            ("PUT", "zones/one/keys/k", "GET, HEAD, DELETE"),
            ("POST", "zones/one/overrides", "GET, HEAD"),
            ("PATCH", "zones/one/overrides/k", "GET, HEAD, PUT, DELETE"),
            ("DELETE", "metrics", "GET, HEAD"),
            ("get", "metrics", "GET, HEAD"),
        ];
        for (method, path, allow) in rows {
            let error = parse(method.as_bytes(), path.as_bytes()).unwrap_err();
            assert_eq!(error.status(), 405, "{method} {path}");
            assert_eq!(error.allow(), Some(allow), "{method} {path}");
            assert!(error.to_string().contains(method), "{error}");
        }
    }

    #[test]
    fn writes_and_bodies() {
        assert!(route("PATCH", "zones/a").unwrap().writes());
        assert!(route("PATCH", "zones/a").unwrap().takes_body());
        assert!(route("DELETE", "zones/a/keys/k").unwrap().writes());
        assert!(!route("DELETE", "zones/a/keys/k").unwrap().takes_body());
        assert!(route("PUT", "zones/a/overrides/k").unwrap().takes_body());
        assert!(!route("GET", "zones/a/overrides/k").unwrap().writes());
        assert!(!route("GET", "metrics").unwrap().writes());
    }

    #[test]
    fn encoding_round_trips() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(
            percent_decode(percent_encode(&all).as_bytes()).unwrap(),
            all
        );
    }

    #[test]
    fn location_prefixes() {
        #[rustfmt::skip]
        let rows: [(&str, &str, Option<&str>); 8] = [
            ("/ratelimit/zones", "/ratelimit/", Some("zones")),
            ("/ratelimit/zones", "/ratelimit", Some("/zones")),
            ("/ratelimit/", "/ratelimit/", Some("")),
            ("/ratelimit/?a=b", "/ratelimit/", Some("")),
            ("/ratelimit", "/ratelimit/", None),
            ("/ratelimit%2fzones", "/ratelimit/", Some("zones")),
            ("/ratelimit%2", "/ratelimit/", None),
            ("/x", "", Some("/x")),
        ];
        for (target, location, rest) in rows {
            let got = strip_location(target.as_bytes(), location.as_bytes());
            assert_eq!(got, rest.map(str::as_bytes), "{target} under {location}");
        }
    }
}
