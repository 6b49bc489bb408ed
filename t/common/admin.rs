//! The configs of the admin API's tests (t/admin.rs), its top keys (t/top.rs) and its
//! dashboard (t/dashboard.rs): two workers, the API at `/ratelimit/` (`write=on`) and
//! `/readonly/`, and `location /` limited by zone `one` (`$http_x_key`, `1r/m`, `nodelay`);
//! and their answers read as JSON.

use super::config::{config, Config};
use super::{send, Nginx, Request};

/// The admin API's answer to METHOD /ratelimit/PATH: its status and JSON (`null` when the
/// body is none).
pub fn admin_json(
    nginx: &Nginx,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> (u16, serde_json::Value) {
    let mut request = Request::new(method, &format!("/ratelimit/{path}"));
    if let Some(body) = body {
        request = request.json(body);
    }
    let response = send(nginx.port(), &request);
    let value = serde_json::from_slice(&response.body).unwrap_or(serde_json::Value::Null);
    (response.status, value)
}

/// What the three share; `zones` are the zones besides `one`, `locations` the locations
/// besides `/`, `/ratelimit/` and `/readonly/`.
fn admin_location(zones: &str, locations: &str) -> Config {
    config()
        .workers(2)
        .reuseport()
        .error_log("notice")
        .http("rate_limit_zone $http_x_key zone=one:1m rate=1r/m;")
        .http(zones)
        .server("add_header X-Pid $pid always;")
        .locations("location / { rate_limit zone=one nodelay; }")
        .locations(locations)
        .locations("location /ratelimit/ { rate_limit_admin write=on; }")
        .locations("location /readonly/ { rate_limit_admin; }")
}

/// t/admin.rs: a zone per algorithm; `/bucket/` and `/log/` limited by their zones.
pub fn admin_api() -> Config {
    admin_location(
        "rate_limit_zone $http_x_key zone=bucket:1m rate=1r/m burst=2 algorithm=token_bucket;\n\
         rate_limit_zone $http_x_key zone=log:1m rate=10r/m algorithm=sliding_log;\n\
         rate_limit_zone $http_x_key zone=window:1m rate=10r/m algorithm=sliding_window;",
        "location /bucket/ { rate_limit zone=bucket; alias html/; }\n\
         location /log/ { rate_limit zone=log; alias html/; }",
    )
}

/// t/top.rs: `/dry/` (delays, dry run), and two small zones: `tiny` too small to keep top
/// keys (252k), `quarter` just large enough (256k).
pub fn top_keys() -> Config {
    admin_location(
        "rate_limit_zone $http_x_key zone=slow:1m rate=1r/m burst=5;\n\
         rate_limit_zone $http_x_key zone=tiny:252k rate=1r/m;\n\
         rate_limit_zone $http_x_key zone=quarter:256k rate=1r/m;",
        "location /dry/ { rate_limit zone=slow; rate_limit_dry_run on; alias html/; }\n\
         location /tiny/ { rate_limit zone=tiny nodelay; alias html/; }\n\
         location /quarter/ { rate_limit zone=quarter nodelay; alias html/; }",
    )
}

/// t/dashboard.rs: a sliding window zone on `/window/` besides `one`.
pub fn dashboard() -> Config {
    admin_location(
        "rate_limit_zone $http_x_key zone=window:1m rate=10r/m algorithm=sliding_window;",
        "location /window/ { rate_limit zone=window; alias html/; }",
    )
}
