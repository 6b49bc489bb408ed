//! The module next to OpenResty's Lua module (Debian's `libnginx-mod-http-lua`, with its NDK),
//! loaded into the same nginx: Lua handlers in a limited location see `$rate_limit_status`, a
//! rejected request never reaches `access_by_lua`, and a delayed request is delayed before it
//! (our preaccess handler runs before any access handler, whatever the `load_module` order).
//!
//! Debian's Lua module is built for Debian's nginx only, so these tests run when the suite runs
//! against it (`TEST_NGINX_BINARY=/usr/sbin/nginx`, see `.ci/run`); against another nginx
//! they fail, unless the runner declared them skipped (`RATE_LIMIT_TEST_SKIP=lua`, as
//! `.ci/run`'s vendored pass does: see t/common/skip.rs).

mod common;

use std::path::Path;

use common::config::MODULE;
use common::skip;
use common::{get, nginx_binary, start_request, Nginx, Request};

const DEBIAN_NGINX: &str = "/usr/sbin/nginx";
const NDK_MODULE: &str = "/usr/lib/nginx/modules/ndk_http_module.so";
const LUA_MODULE: &str = "/usr/lib/nginx/modules/ngx_http_lua_module.so";

/// The two `load_module` orders: Debian's (NDK, Lua, then ours: `10-mod-http-ndk.conf`,
/// `50-mod-http-lua.conf`, `50-mod-http-rate-limit.conf`) and ours first.
const ORDERS: [[&str; 3]; 2] = [
    [NDK_MODULE, LUA_MODULE, MODULE],
    [MODULE, NDK_MODULE, LUA_MODULE],
];

/// Why the Lua tests cannot run here: `None` when the suite runs against Debian's nginx, for
/// which Debian's Lua module is built. Panics when it does but the Lua module is not installed.
fn lua_unavailable() -> Option<String> {
    let binary = nginx_binary();
    if binary.canonicalize().unwrap_or(binary.clone()) != Path::new(DEBIAN_NGINX) {
        return Some(format!(
            "needs Debian's nginx with Lua: {} is not Debian's {DEBIAN_NGINX}, which Debian's \
             Lua module is built for (run with TEST_NGINX_BINARY={DEBIAN_NGINX} and \
             RATE_LIMIT_MODULE built by scripts/build-for-nginx.sh, as .ci/run does)",
            binary.display()
        ));
    }
    for module in [NDK_MODULE, LUA_MODULE] {
        assert!(
            Path::new(module).is_file(),
            "{module} is missing: apt-get install libnginx-mod-http-lua lua-resty-core"
        );
    }
    None
}

/// `load` is one of [`ORDERS`]; `/limited/` records in `access_by_lua` the status variable
/// and how long the request had waited since nginx read it, and answers both from
/// `content_by_lua`; `/count` says how many requests reached `access_by_lua`.
fn start(load: &[&str], zone: &str, limit: &str) -> Nginx {
    common::config()
        .load_order(load)
        .http("lua_shared_dict counts 1m;")
        .http(zone)
        .locations(&format!(
            r#"location /limited/ {{
    {limit}
    access_by_lua_block {{
        ngx.shared.counts:incr("access", 1, 0)
        ngx.update_time()
        ngx.ctx.access_status = ngx.var.rate_limit_status
        ngx.ctx.waited_s = ngx.now() - ngx.req.start_time()
    }}
    content_by_lua_block {{
        ngx.say(ngx.ctx.access_status, " ", ngx.var.rate_limit_status, " ",
                string.format("%.3f", ngx.ctx.waited_s))
    }}
}}
location = /count {{
    content_by_lua_block {{
        ngx.say(ngx.shared.counts:get("access") or 0)
    }}
}}"#
        ))
        .start()
}

/// `(status seen by access_by_lua, status seen by content_by_lua, seconds waited before
/// access_by_lua)` from a `/limited/` body.
fn lua_view(body: &str) -> (String, String, f64) {
    let words: Vec<&str> = body.split_whitespace().collect();
    assert_eq!(words.len(), 3, "unexpected body: {body:?}");
    let waited_s = words[2]
        .parse()
        .unwrap_or_else(|e| panic!("waited {:?}: {e}", words[2]));
    (words[0].to_string(), words[1].to_string(), waited_s)
}

/// At 1r/m without a burst, of three requests the first passes (both Lua handlers see
/// `PASSED`) and the other two are rejected with 429 before `access_by_lua`: it counted one
/// request.
#[test]
fn a_rejected_request_never_reaches_access_by_lua() {
    if skip::unless_declared("lua", lua_unavailable()).is_some() {
        return;
    }
    for load in ORDERS {
        let nginx = start(
            &load,
            "rate_limit_zone $binary_remote_addr zone=lua:1m rate=1r/m;",
            "rate_limit zone=lua;",
        );
        let first = get(nginx.port(), "/limited/");
        assert_eq!(first.status, 200, "{load:?}: {first:?}");
        let (access_status, content_status, _) = lua_view(&first.text());
        assert_eq!(
            (access_status.as_str(), content_status.as_str()),
            ("PASSED", "PASSED"),
            "{load:?}"
        );
        for _ in 0..2 {
            let rejected = get(nginx.port(), "/limited/");
            assert_eq!(rejected.status, 429, "{load:?}: {rejected:?}");
        }
        let count = get(nginx.port(), "/count");
        assert_eq!(
            count.text().trim(),
            "1",
            "{load:?}: access_by_lua ran for a rejection"
        );
    }
}

/// At 2r/s with burst=5, three requests sent together: the first passes at once, the second
/// and third are delayed by 0.5 s and 1 s before `access_by_lua` runs, and both handlers see
/// `DELAYED`. The bounds are far from the delays: under 0.25 s waited for the first, at least
/// 0.35 s for the others.
#[test]
fn a_delayed_request_is_delayed_before_access_by_lua() {
    if skip::unless_declared("lua", lua_unavailable()).is_some() {
        return;
    }
    for load in ORDERS {
        let nginx = start(
            &load,
            "rate_limit_zone $binary_remote_addr zone=lua:1m rate=2r/s burst=5;",
            "rate_limit zone=lua;",
        );
        let pending: Vec<_> = (0..3)
            .map(|_| start_request(nginx.port(), &Request::get("/limited/")))
            .collect();
        let mut views: Vec<(String, String, f64)> = pending
            .into_iter()
            .map(|request| {
                let response = request.finish();
                assert_eq!(response.status, 200, "{load:?}: {response:?}");
                lua_view(&response.text())
            })
            .collect();
        views.sort_by(|a, b| a.2.total_cmp(&b.2));
        let (access_status, content_status, waited_s) = &views[0];
        assert_eq!(
            (access_status.as_str(), content_status.as_str()),
            ("PASSED", "PASSED")
        );
        assert!(
            *waited_s < 0.25,
            "{load:?}: the first request waited {waited_s} s"
        );
        for (access_status, content_status, waited_s) in &views[1..] {
            assert_eq!(
                (access_status.as_str(), content_status.as_str()),
                ("DELAYED", "DELAYED"),
                "{load:?}"
            );
            assert!(
                *waited_s >= 0.35,
                "{load:?}: a delayed request reached access_by_lua after {waited_s} s: {views:?}"
            );
        }
    }
}
