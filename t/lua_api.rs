//! The Lua API (`lib/resty/rate_limit.lua` over `src/lua.rs`), in a real nginx with the Lua
//! modules loaded: Lua and the directive decide alike and share zones, `combine` charges all
//! or nothing, `set_rate`/`set_burst` reach every worker, errors come back as messages, and
//! the migration examples of docs/lua.md work as written.
//!
//! The Lua modules are Debian's (`libnginx-mod-http-lua`, `lua-resty-core`), built for
//! Debian's nginx: these tests run against it (`TEST_NGINX_BINARY=/usr/sbin/nginx` and
//! `RATE_LIMIT_MODULE` built for it by `scripts/build-for-nginx.sh`), where they must run. An
//! nginx that cannot load those modules makes them print why (in `cargo test`'s output, see
//! `common::skip`) and return.
//!
//! Rates are per hour (or minute) so that nothing refills while a test runs: every expected
//! outcome is far from a threshold.

mod common;

use std::collections::BTreeSet;
use std::env;
use std::path::{Path, PathBuf};

use std::thread;
use std::time::{Duration, Instant};

use common::fleet::sync_state;
use common::redis::Redis;
use common::{check_config, nginx_binary, send, start_request, Nginx, Request, Response};

/// Where Debian's `libnginx-mod-http-ndk` and `libnginx-mod-http-lua` put their modules.
fn lua_modules_dir() -> PathBuf {
    env::var_os("LUA_NGINX_MODULES_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/lib/nginx/modules"))
}

/// A whole nginx.conf: the Lua modules and ours, `workers` workers, `http` in the http block
/// and `locations` in its one server, which says which worker answered in `X-Pid`.
fn config(workers: usize, http: &str, locations: &str) -> String {
    let lib = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("lib");
    let modules = lua_modules_dir();
    common::config()
        .load(&modules.join("ndk_http_module.so").display().to_string())
        .load(&modules.join("ngx_http_lua_module.so").display().to_string())
        .workers(workers)
        .reuseport()
        .http(&format!("lua_package_path \"{}/?.lua;;\";", lib.display()))
        .http(http)
        .server("add_header X-Pid $pid always;")
        .locations(locations)
        .build()
}

/// Debian's nginx, for which Debian's Lua modules are built.
const DEBIAN_NGINX: &str = "/usr/sbin/nginx";

/// Why the Lua tests cannot run against this nginx, if they cannot: `nginx -t` of a config
/// loading the Lua modules and ours, and requiring `resty.rate_limit`. Against Debian's nginx
/// they must run: a failure there panics.
fn lua_unavailable() -> Option<String> {
    let probe = config(
        1,
        "rate_limit_zone $arg_k zone=probe:1m rate=1r/s;",
        "location / { content_by_lua_block { require \"resty.rate_limit\" } }",
    );
    let (ok, output) = check_config(&probe);
    if ok {
        return None;
    }
    let binary = nginx_binary();
    if binary.canonicalize().unwrap_or(binary.clone()) == Path::new(DEBIAN_NGINX) {
        panic!(
            "Debian's nginx does not load the Lua modules with ours (apt-get install \
             libnginx-mod-http-lua lua-resty-core; RATE_LIMIT_MODULE must be built for this \
             nginx): {output}"
        );
    }
    // nginx's one line that says why (the module's ABI or version), not the whole output.
    let reason = output.lines().find(|line| line.contains("[emerg]"));
    Some(reason.unwrap_or(output.trim()).to_string())
}

/// Returns from the test when the nginx under test cannot load the Lua modules and the runner
/// declared the Lua tests skipped (`RATE_LIMIT_TEST_SKIP=lua`); fails with the reason when it
/// did not.
macro_rules! require_lua {
    () => {
        let unmet = lua_unavailable().map(|reason| {
            format!(
                "needs Debian's nginx with Lua: {} cannot load the Lua modules of {} (these \
                 tests run against Debian's nginx: TEST_NGINX_BINARY={DEBIAN_NGINX} with \
                 RATE_LIMIT_MODULE built by scripts/build-for-nginx.sh): {reason}",
                nginx_binary().display(),
                lua_modules_dir().display()
            )
        });
        if common::skip::unless_declared("lua", unmet).is_some() {
            return;
        }
    };
}

fn get(nginx: &Nginx, path: &str) -> Response {
    send(nginx.port(), &Request::get(path))
}

fn body(nginx: &Nginx, path: &str) -> String {
    let response = get(nginx, path);
    assert_eq!(response.status, 200, "{path}: {}", response.text());
    response.text()
}

/// A location answering with limiter `zone`'s decision for `?k=`, like a `rate_limit zone=
/// nodelay` location: 429 with `Retry-After` when rejected, and the remaining requests in
/// `X-Remaining` when passed.
const LUA_DECIDE: &str = r#"
location = /lua {
    access_by_lua_block {
        local rl = require "resty.rate_limit"
        local lim, err = rl.new(ngx.var.arg_zone, {nodelay = true})
        if not lim then ngx.log(ngx.ERR, err) return ngx.exit(500) end
        local delay, err, info = lim:incoming(ngx.var.arg_k, true)
        if not delay then
            if err == "rejected" then
                ngx.header["Retry-After"] = math.max(1, math.ceil(info))
                return ngx.exit(429)
            end
            ngx.log(ngx.ERR, err)
            return ngx.exit(500)
        end
        ngx.header["X-Remaining"] = info
    }
    empty_gif;
}
"#;

/// One decision as both sides report it: status, Retry-After, remaining (for a pass).
#[derive(Debug, PartialEq)]
struct Seen {
    status: u16,
    retry_after: Option<u64>,
    remaining: Option<u64>,
}

fn seen_lua(response: &Response) -> Seen {
    Seen {
        status: response.status,
        retry_after: response.header("Retry-After").map(|v| v.parse().unwrap()),
        remaining: response.header("X-Remaining").map(|v| v.parse().unwrap()),
    }
}

/// The directive's `RateLimit: "zone";r=N;t=T` gives `remaining` for a passed request.
fn seen_directive(response: &Response) -> Seen {
    let remaining = (response.status == 200).then(|| {
        let item = response.header("RateLimit").expect("RateLimit header");
        let r = item.split(';').find_map(|field| field.strip_prefix("r="));
        r.expect("r= in RateLimit").parse().unwrap()
    });
    Seen {
        status: response.status,
        retry_after: response.header("Retry-After").map(|v| v.parse().unwrap()),
        remaining,
    }
}

/// Retry-After in whole seconds may round differently across a second boundary between the
/// two requests of a step: equal within one second.
fn same_decision(lua: &Seen, directive: &Seen) -> bool {
    let close = match (lua.retry_after, directive.retry_after) {
        (Some(a), Some(b)) => a.abs_diff(b) <= 1,
        (a, b) => a == b,
    };
    lua.status == directive.status && lua.remaining == directive.remaining && close
}

#[test]
fn lua_and_directive_decide_alike_for_every_algorithm() {
    require_lua!();
    let algorithms = [
        ("leaky_bucket", "rate=3r/h burst=2"),
        ("token_bucket", "rate=3r/h burst=3"),
        ("sliding_window", "rate=3r/h"),
        ("sliding_log", "rate=3r/h"),
    ];
    let mut http = String::new();
    let mut locations = LUA_DECIDE.to_string();
    for (algorithm, limits) in algorithms {
        for side in ["lua", "dir"] {
            http += &format!(
                "rate_limit_zone $arg_k zone={side}_{algorithm}:1m {limits} \
                 algorithm={algorithm};\n"
            );
        }
        locations += &format!(
            "location = /dir/{algorithm} {{ rate_limit zone=dir_{algorithm} nodelay; \
             empty_gif; }}\n"
        );
    }
    let nginx = Nginx::start(&config(1, &http, &locations));
    // Two keys, one exhausted and one not, then the first again.
    let keys = ["a", "a", "b", "a", "a", "a", "b", "a"];
    for (algorithm, _) in algorithms {
        let mut lua_statuses = Vec::new();
        for (step, key) in keys.iter().enumerate() {
            let directive = seen_directive(&get(&nginx, &format!("/dir/{algorithm}?k={key}")));
            let lua = seen_lua(&get(&nginx, &format!("/lua?zone=lua_{algorithm}&k={key}")));
            assert!(
                same_decision(&lua, &directive),
                "{algorithm}, step {step} (key {key}): Lua {lua:?}, directive {directive:?}"
            );
            lua_statuses.push(lua.status);
        }
        let passed = lua_statuses.iter().filter(|&&status| status == 200).count();
        // Key a: 3 pass (leaky: 1 + burst 2; token: 3 tokens; sliding: 3 per window), then
        // rejections; key b: both pass.
        assert_eq!(passed, 5, "{algorithm}: {lua_statuses:?}");
    }
}

/// resty.limit.req is limit_req's arithmetic in Lua; resty.rate_limit on a leaky bucket zone
/// decides a timeline as nginx's own limit_req does (the "Done when" of issue 13: switching
/// keeps the decisions).
#[test]
fn lua_decides_like_nginx_limit_req() {
    require_lua!();
    let http = "rate_limit_zone $arg_k zone=lua_leaky:1m rate=1r/m burst=2;
                limit_req_zone $arg_k zone=native:1m rate=1r/m;
                limit_req_status 429;";
    let locations = format!(
        "{LUA_DECIDE}
         location = /native {{ limit_req zone=native burst=2 nodelay; empty_gif; }}"
    );
    let nginx = Nginx::start(&config(1, http, &locations));
    let keys = ["a", "a", "b", "a", "a", "b", "b", "b", "a"];
    let native: Vec<u16> = keys
        .iter()
        .map(|key| get(&nginx, &format!("/native?k={key}")).status)
        .collect();
    let lua: Vec<u16> = keys
        .iter()
        .map(|key| get(&nginx, &format!("/lua?zone=lua_leaky&k={key}")).status)
        .collect();
    assert_eq!(lua, native, "keys {keys:?}");
    assert_eq!(native, [200, 200, 200, 200, 429, 200, 200, 429, 429]);
}

#[test]
fn lua_and_directive_share_one_zone_and_its_counters() {
    require_lua!();
    let http = "rate_limit_zone $arg_k zone=shared:1m rate=3r/h burst=2;";
    let locations = format!(
        "{LUA_DECIDE}
         location = /dir {{ rate_limit zone=shared nodelay; empty_gif; }}
         location /admin/ {{ rate_limit_admin write=on; }}"
    );
    let nginx = Nginx::start(&config(1, http, &locations));
    let lua = |key: &str| get(&nginx, &format!("/lua?zone=shared&k={key}")).status;
    let directive = |key: &str| get(&nginx, &format!("/dir?k={key}")).status;
    // One budget of 3 for key k, spent from both sides.
    assert_eq!(lua("k"), 200);
    assert_eq!(directive("k"), 200);
    assert_eq!(lua("k"), 200);
    assert_eq!(directive("k"), 429);
    assert_eq!(lua("k"), 429);
    // Another key has its own budget.
    assert_eq!(directive("other"), 200);

    let zone: serde_json::Value =
        serde_json::from_str(&body(&nginx, "/admin/zones/shared")).unwrap();
    assert_eq!(zone["passed"], 4, "{zone}");
    assert_eq!(zone["rejected"], 2, "{zone}");

    // A per-key override set through the admin API applies to Lua's decisions too: 1 + 5.
    let put = Request::new("PUT", "/admin/zones/shared/overrides/vip")
        .json(r#"{"rate": "3r/h", "burst": 5}"#);
    assert_eq!(send(nginx.port(), &put).status, 201);
    let vip: Vec<u16> = (0..7).map(|_| lua("vip")).collect();
    assert_eq!(vip, [200, 200, 200, 200, 200, 200, 429]);
}

#[test]
fn delays_follow_the_leaky_bucket() {
    require_lua!();
    let http = "rate_limit_zone $arg_k zone=slow:1m rate=1r/h burst=5;";
    let locations = r#"
        location = /delays {
            content_by_lua_block {
                local rl = require "resty.rate_limit"
                local lim = rl.new("slow")
                local threshold = rl.new("slow", {delay = 2})
                for _, l in ipairs({lim, lim, lim, threshold, threshold}) do
                    local delay, excess = l:incoming("k", true)
                    ngx.say(string.format("%.0f %.3f", delay, excess))
                end
            }
        }
    "#;
    let nginx = Nginx::start(&config(1, http, locations));
    // limit_req at 1r/h: the n-th request is delayed (n - 1) hours' worth of interval; with
    // delay=2 the excess up to 2 goes at once (excess 3 waits one interval, 4 two).
    let lines: Vec<String> = body(&nginx, "/delays").lines().map(String::from).collect();
    let delays: Vec<u64> = lines
        .iter()
        .map(|line| line.split(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(delays, [0, 3600, 7200, 3600, 7200], "{lines:?}");
}

#[test]
fn combine_charges_every_limiter_or_none() {
    require_lua!();
    let http = "rate_limit_zone $arg_k zone=one:1m rate=1r/h burst=1 algorithm=token_bucket;
                rate_limit_zone $arg_k zone=two:1m rate=1r/h burst=2 algorithm=token_bucket;";
    let locations = r#"
        location = /combine {
            content_by_lua_block {
                local rl = require "resty.rate_limit"
                local one, two = rl.new("one"), rl.new("two")
                local function remaining(lim, key) return (lim:state(key)) end
                -- two limiters: "one" refuses the second request, which then costs "two"
                -- nothing
                ngx.say(rl.combine({one, two}, {"x", "x"}))
                ngx.say(rl.combine({one, two}, {"x", "x"}))
                ngx.say(remaining(one, "x"), " ", remaining(two, "x"))
                -- the same limiter twice on a key with one token: the look passes both, the
                -- last is charged, the first then refused: the last is given back
                ngx.say(rl.combine({one, one}, {"y", "y"}))
                ngx.say(remaining(one, "y"))
                local states = {}
                ngx.say(rl.combine({two, two}, {"z", "z"}, states), " ", #states)
                ngx.say(rl.combine({one}, {}))
            }
        }
    "#;
    let nginx = Nginx::start(&config(1, http, locations));
    assert_eq!(
        body(&nginx, "/combine"),
        "0\nnilrejected\n0 1\nnilrejected\n1\n0 2\nnilmissing keys[1]\n"
    );
}

#[test]
fn uncommit_gives_back_in_every_algorithm() {
    require_lua!();
    let http = "rate_limit_zone $arg_k zone=lb:1m rate=1r/h burst=1;
                rate_limit_zone $arg_k zone=tb:1m rate=1r/h burst=2 algorithm=token_bucket;
                rate_limit_zone $arg_k zone=sw:1m rate=2r/h algorithm=sliding_window;
                rate_limit_zone $arg_k zone=sl:1m rate=2r/h algorithm=sliding_log;";
    let locations = r#"
        location = /uncommit {
            content_by_lua_block {
                local rl = require "resty.rate_limit"
                for _, zone in ipairs({"lb", "tb", "sw", "sl"}) do
                    local lim = rl.new(zone, {nodelay = true})
                    local out = {zone}
                    for i = 1, 2 do out[#out + 1] = (lim:incoming("k", true)) end
                    out[#out + 1] = select(2, lim:incoming("k", true))
                    out[#out + 1] = tostring(lim:uncommit("k"))
                    out[#out + 1] = (lim:incoming("k", true))
                    out[#out + 1] = select(2, lim:incoming("k", true))
                    ngx.say(table.concat(out, " "))
                end
            }
        }
    "#;
    let nginx = Nginx::start(&config(1, http, locations));
    // Two pass, the third is refused; one given back lets exactly one more through.
    let expected: String = ["lb", "tb", "sw", "sl"]
        .iter()
        .map(|zone| format!("{zone} 0 0 rejected true 0 rejected\n"))
        .collect();
    assert_eq!(body(&nginx, "/uncommit"), expected);
}

/// Usage-based limits from Lua: `reserve` at the door, `settle` once the usage is known:
/// less is given back, more goes into debt (up to `debt`, the rest forgiven), and a key in
/// debt is refused; bad arguments get a message.
#[test]
fn reserve_and_settle_tokens() {
    require_lua!();
    let http = "rate_limit_zone $arg_k zone=tpm:1m rate=1r/h burst=100 algorithm=token_bucket;
                rate_limit_zone $arg_k zone=sw:1m rate=2r/h algorithm=sliding_window;";
    let locations = r#"
        location = /settle {
            content_by_lua_block {
                local rl = require "resty.rate_limit"
                local lim = rl.new("tpm", {nodelay = true})
                local function show(...)
                    local out = {}
                    for i = 1, select('#', ...) do out[i] = tostring((select(i, ...))) end
                    ngx.say(table.concat(out, " "))
                end
                -- A pass's delay and remaining tokens (its excess moves with the clock).
                local function passed(delay, _, remaining) return delay, remaining end
                -- Over: 10 reserved, 60 used, then 10 reserved and 200 used with debt=20.
                show(passed(lim:reserve("a", 10)))
                show(lim:settle("a", 10, 60))
                show((lim:state("a")))
                show(passed(lim:reserve("a", 10)))
                show(lim:settle("a", 10, 200, 20))
                local ok, err = lim:reserve("a", 1)
                show(ok, err)
                -- Under: 50 reserved, 5 used.
                show(passed(lim:reserve("b", 50)))
                show(lim:settle("b", 50, 5))
                show((lim:state("b")))
                -- More than the bucket holds is never admitted.
                ok, err = lim:reserve("c", 101)
                show(ok, err)
                -- Bad arguments.
                show(lim:settle("b", 0, 5))
                show(lim:settle("b", 5, -1))
                show(lim:settle("b", 5, 1, 1.5))
                show(lim:reserve("b", "ten"))
                show(rl.new("sw"):settle("b", 1, 2))
            }
        }
    "#;
    let nginx = Nginx::start(&config(1, http, locations));
    let expected = [
        "0 90",
        "true 0",
        "40",
        "0 30",
        // The level was 70: 120 at most (capacity 100 + debt 20), 140 of 190 forgiven.
        "true 140",
        "nil rejected",
        "0 50",
        "true 0",
        "95",
        "nil rejected",
        "nil reserved must be a whole number of at least 1, got 0",
        "nil used must be a whole number of at least 0, got -1",
        "nil debt must be a whole number of at least 0, got 1.5",
        "nil tokens must be a whole number of at least 1, got ten",
        "nil zone \"sw\" is not a leaky_bucket or token_bucket zone: only a bucket can settle \
         usage",
    ];
    assert_eq!(
        body(&nginx, "/settle").lines().collect::<Vec<_>>(),
        expected
    );
}

/// `/probe?k=KEY`: which worker answered, and for a fresh KEY what `state` shows (remaining)
/// and, after two requests, the second's retry-after in whole seconds.
const PROBE: &str = r#"
location = /probe {
    content_by_lua_block {
        local rl = require "resty.rate_limit"
        local lim = rl.new("tunable", {nodelay = true})
        local remaining = lim:state(ngx.var.arg_k)
        lim:incoming(ngx.var.arg_k, true)
        local delay, _, info = lim:incoming(ngx.var.arg_k, true)
        ngx.say(ngx.worker.pid(), " ", remaining, " ", delay and 0 or math.ceil(info))
    }
}
location = /set {
    content_by_lua_block {
        local lim = require("resty.rate_limit").new("tunable")
        local ok, err
        if ngx.var.arg_rate then
            ok, err = lim:set_rate(tonumber(ngx.var.arg_rate) or ngx.var.arg_rate)
        else
            ok, err = lim:set_burst(tonumber(ngx.var.arg_burst))
        end
        ngx.say(tostring(ok), " ", tostring(err))
    }
}
location = /dir { rate_limit zone=tunable nodelay; empty_gif; }
location /admin/ { rate_limit_admin; }
"#;

/// Probes on 40 fresh connections (the kernel spreads them over both workers): the set of
/// worker pids seen, and every `remaining retry_after` answered.
fn probe_all(nginx: &Nginx, round: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut pids = BTreeSet::new();
    let mut answers = BTreeSet::new();
    for i in 0..40 {
        let text = body(nginx, &format!("/probe?k={round}{i}"));
        let (pid, answer) = text.trim().split_once(' ').unwrap();
        pids.insert(pid.to_string());
        answers.insert(answer.to_string());
    }
    (pids, answers)
}

#[test]
fn set_rate_and_set_burst_reach_both_workers() {
    require_lua!();
    let http = "rate_limit_zone $arg_k zone=tunable:1m rate=1r/h burst=1 algorithm=token_bucket;";
    let nginx = Nginx::start(&config(2, http, PROBE));

    // Before: one token, refilled once an hour; both workers answer (and have decided once).
    let (pids, answers) = probe_all(&nginx, "before");
    assert_eq!(pids.len(), 2, "both workers answered");
    assert_eq!(answers, BTreeSet::from(["1 3600".to_string()]));

    assert_eq!(body(&nginx, "/set?burst=4"), "true nil\n");
    assert_eq!(body(&nginx, "/set?rate=2"), "true nil\n");
    let (pids, answers) = probe_all(&nginx, "after");
    assert_eq!(pids.len(), 2, "both workers answered");
    // 4 tokens; the second request passes too, so no retry-after.
    assert_eq!(answers, BTreeSet::from(["4 0".to_string()]));

    // The directive sees it as well, and the admin API shows it.
    assert_eq!(body(&nginx, "/set?rate=1r/m"), "true nil\n");
    assert_eq!(body(&nginx, "/set?burst=1"), "true nil\n");
    assert_eq!(get(&nginx, "/dir?k=d").status, 200);
    let refused = get(&nginx, "/dir?k=d");
    assert_eq!(refused.status, 429);
    let retry: u64 = refused.header("Retry-After").unwrap().parse().unwrap();
    assert!((55..=60).contains(&retry), "Retry-After {retry} at 1r/m");
    let zone: serde_json::Value =
        serde_json::from_str(&body(&nginx, "/admin/zones/tunable")).unwrap();
    assert_eq!(zone["rate"], "1r/m", "{zone}");
    assert_eq!(zone["burst"], 1, "{zone}");

    // The admin API's checks and messages.
    assert_eq!(
        body(&nginx, "/set?rate=fast"),
        "nil invalid rate \"fast\": must be a positive number of requests (at most 3 decimals) \
         per s, m, h or d, such as \"10r/s\"\n"
    );
    assert_eq!(
        body(&nginx, "/set?burst=-1"),
        "nil invalid burst -1: must be an integer from 0 to 4194303\n"
    );
    // Checked as numbers before they reach the module: 1e300 would wrap to i64::MIN, and an
    // empty rate would read as "no change" and answer true.
    assert_eq!(
        body(&nginx, "/set?burst=1e300"),
        "nil invalid burst 1e+300: must be an integer from 0 to 4194303\n"
    );
    assert_eq!(
        body(&nginx, "/set?burst=4194304"),
        "nil invalid burst 4194304: must be an integer from 0 to 4194303\n"
    );
    assert_eq!(
        body(&nginx, "/set?burst=2.5"),
        "nil invalid burst 2.5: must be an integer from 0 to 4194303\n"
    );
    let syntax = "must be a positive number of requests (at most 3 decimals) per s, m, h or d, \
                  such as \"10r/s\"";
    assert_eq!(
        body(&nginx, "/set?rate="),
        format!("nil invalid rate \"\": {syntax}\n")
    );
    assert_eq!(
        body(&nginx, "/set?rate=-2"),
        format!("nil invalid rate -2: {syntax}\n")
    );
    // The largest burst the rate allows, as the admin API says it.
    assert_eq!(body(&nginx, "/set?rate=0.001r/d"), "true nil\n");
    assert_eq!(
        body(&nginx, "/set?burst=300"),
        "nil burst 300 is too large for rate \"0.001r/d\" (at most 36: a token_bucket must \
         refill within 100 years)\n"
    );
    assert_eq!(body(&nginx, "/set?burst=36"), "true nil\n");
    let zone: serde_json::Value =
        serde_json::from_str(&body(&nginx, "/admin/zones/tunable")).unwrap();
    assert_eq!(
        (&zone["rate"], &zone["burst"]),
        (&"0.001r/d".into(), &36.into())
    );
}

#[test]
fn bad_use_gets_an_error_and_no_worker_crashes() {
    require_lua!();
    let http = r#"
        rate_limit_zone $arg_k zone=z:1m rate=1r/h burst=1;
        rate_limit_zone $arg_k zone=window:1m rate=5r/h algorithm=sliding_window;
        rate_limit_zone $arg_k zone=log:1m rate=5r/h algorithm=sliding_log;
        rate_limit_zone $arg_k zone=slow:1m rate=0.001r/d;
        init_by_lua_block {
            local rl = require "resty.rate_limit"
            local lim = assert(rl.new("z"))
            INIT_RESULT = table.concat({tostring((lim:incoming("k", true))),
                                        select(2, lim:incoming("k", true))}, " ")
        }
        init_worker_by_lua_block {
            local lim = assert(require("resty.rate_limit").new("z"))
            INIT_WORKER_RESULT = table.concat({lim:incoming("worker", true)}, " ")
        }
    "#;
    let locations = r#"
        location = /errors {
            content_by_lua_block {
                local rl = require "resty.rate_limit"
                local z = rl.new("z")
                local function show(...) ngx.say(table.concat({tostring(select(1, ...)),
                                                               tostring(select(2, ...))}, " | ")) end
                ngx.say(INIT_RESULT)
                ngx.say(INIT_WORKER_RESULT)
                show(rl.new("nope"):incoming("k", true))
                show(z:incoming(42, true))
                show(z:incoming(nil, true))
                show(z:incoming("", true))
                show(z:incoming(string.rep("k", 65536), true))
                show(z:incoming(string.rep("k", 65535), true))
                show(z:state({}))
                show(z:uncommit(1))
                show(rl.new("z", {burst = -1}))
                show(rl.new("z", {burst = "5"}))
                show(rl.new("z", {delay = 1, nodelay = true}))
                show(rl.new("z", {cost = 0}))
                show(rl.new("z", {speed = 1}))
                show(rl.new("z", 5))
                show(rl.new(""))
                show(rl.new("window", {burst = 2}):incoming("k", true))
                show(rl.new("log"):set_rate("10r/h"))
                -- A cost above the bucket (burst=1: two requests) never passes: no wait.
                local big = rl.new("z", {cost = 3})
                ngx.say(table.concat({tostring(select(1, big:incoming("big", true))),
                                      tostring(select(2, big:incoming("big", true))),
                                      tostring(select(3, big:incoming("big", true)))}, " | "))
                local remaining, reset, wait = big:state("big")
                ngx.say(table.concat({tostring(remaining), tostring(reset), tostring(wait)}, " | "))
                -- A burst larger than the zone's rate allows, as a rate_limit line's would be.
                local slow = rl.new("slow", {burst = 300})
                show(slow:incoming("k", true))
                show(slow:state("k"))
                show(slow:uncommit("k"))
                show(rl.new("slow", {burst = 35, nodelay = true}):incoming("k", true))
                -- The C call itself refuses to change nothing (set_rate("") stops before it).
                local ffi = require "ffi"
                local buf, len = ffi.new("unsigned char[256]"), ffi.new("size_t[1]", 256)
                local request = require("resty.core.base").get_request()
                local st = ffi.C.ngx_http_rate_limit_lua_set_limits(request, "z", 1, "", 0, -1,
                                                                    buf, len)
                ngx.say(st, " | ", ffi.string(buf, len[0]))
                rl.ABI_VERSION = 5
                show(rl.new("z"))
                rl.ABI_VERSION = 4
                show(rl.new("z"):incoming("fine", true))
            }
        }
    "#;
    let nginx = Nginx::start(&config(1, http, locations));
    let workers = nginx.worker_pids();
    let expected = [
        "nil no request: resty.rate_limit works only while handling a request",
        "0 0 1",
        "nil | unknown zone \"nope\"",
        "nil | key must be a string, got number",
        "nil | key must be a string, got nil",
        "nil | empty key",
        "nil | key is more than 65535 bytes",
        "0 | 0",
        "nil | key must be a string, got table",
        "nil | key must be a string, got number",
        "nil | invalid burst value \"burst=-1\"",
        "nil | burst must be a number, got string",
        "nil | \"nodelay\" and \"delay\" cannot be used together",
        "nil | invalid cost value \"cost=0\": it must be a number from 1 up, or a $variable",
        "nil | unknown option \"speed\"",
        "nil | options must be a table",
        "nil | zone name must be a non-empty string",
        "nil | \"burst\" is not used by the algorithm of zone \"window\"",
        "nil | rate \"10r/h\" is more than zone \"log\" can count: each key's sliding_log has \
         room for 5 requests per window, as configured; raise the rate in the configuration \
         and reload instead",
        "nil | rejected | nil",
        "2 | 0 | nil",
        "nil | burst 300 is too large for the rate of zone \"slow\" (at most 35): a bucket \
         must drain or refill within 100 years",
        "nil | burst 300 is too large for the rate of zone \"slow\" (at most 35): a bucket \
         must drain or refill within 100 years",
        "nil | burst 300 is too large for the rate of zone \"slow\": a bucket must drain or \
         refill within 100 years",
        "0 | 0",
        "-6 | nothing to change: give a rate (such as \"10r/s\") or a burst",
        "nil | ABI version mismatch: ngx_http_rate_limit_module has 4, resty.rate_limit needs 5",
        "0 | 0",
    ];
    let text = body(&nginx, "/errors");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines, expected);
    assert_eq!(nginx.worker_pids(), workers, "no worker was replaced");
    assert!(
        !nginx.error_log().contains("[alert]"),
        "{}",
        nginx.error_log()
    );
}

/// `nginx-conf/lua.conf`, whose locations are the README's Lua examples (t/readme.rs checks
/// that they are), with this machine's directory of the Lua modules.
fn lua_example_config() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/nginx-conf/lua.conf");
    let config = std::fs::read_to_string(path).expect("nginx-conf/lua.conf");
    config.replace(
        "/usr/lib/nginx/modules/",
        &format!("{}/", lua_modules_dir().display()),
    )
}

/// `config` (lua.conf) with `/conn_state/`: what `/conn/`'s key would get now, charging
/// nothing (resty.rate_limit's `incoming(key, false)`): "rejected" (both slots and the queue's
/// place taken), or "admitted N" / "queued N" with its requests in flight.
fn with_conn_state(config: &str) -> String {
    let end = config
        .rfind("    }\n}")
        .expect("lua.conf ends its server and http blocks");
    let location = r#"
        location /conn_state/ {
            content_by_lua_block {
                local lim = require("resty.rate_limit").conn("my_limit_conn_store")
                local delay, in_flight = lim:incoming(ngx.var.binary_remote_addr, false)
                if not delay then
                    ngx.print(in_flight)
                else
                    ngx.print(delay > 0 and "queued " or "admitted ", in_flight)
                end
            }
        }
"#;
    format!("{}{location}{}", &config[..end], &config[end..])
}

/// Polls `/conn_state/` until it says `want`, for at most 5 s.
fn wait_conn_state(nginx: &Nginx, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let response = get(nginx, "/conn_state/");
        let said = String::from_utf8_lossy(&response.body).into_owned();
        if response.status == 200 && said == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "/conn_state/ says {said:?}, not {want:?}"
        );
        thread::sleep(Duration::from_millis(5));
    }
}

/// The statuses of GETs of `paths`, one after the other, each on a new connection.
fn path_statuses(nginx: &Nginx, paths: &[&str]) -> Vec<u16> {
    paths.iter().map(|path| get(nginx, path).status).collect()
}

/// The examples of `nginx-conf/lua.conf` (docs/lua.md's), started as the whole file with its
/// two workers: each limits as docs/lua.md says, and a request without the key its example
/// reads is answered as `rate_limit_zone` answers an empty key, never with a 500.
#[test]
fn lua_conf_examples_run() {
    require_lua!();
    let nginx = Nginx::start(&with_conn_state(&lua_example_config()));

    // resty.limit.req: four at once at 1r/s with burst=2: one at once, two delayed 1 s and
    // 2 s (ngx.sleep), the fourth refused.
    let pending: Vec<_> = (0..4)
        .map(|_| start_request(nginx.port(), &Request::get("/req/")))
        .collect();
    let responses: Vec<Response> = pending.into_iter().map(|p| p.finish()).collect();
    let mut got: Vec<u16> = responses.iter().map(|response| response.status).collect();
    got.sort_unstable();
    assert_eq!(got, [200, 200, 200, 503]);
    // Read one after the other, the last answer is read after the longest sleep.
    let longest = responses
        .iter()
        .map(|response| response.elapsed)
        .max()
        .unwrap();
    assert!(
        longest.as_millis() >= 1500,
        "the second delayed request waited {longest:?}"
    );

    // resty.limit.count: three logins a minute per user; none without a user.
    let remaining: Vec<String> = (0..3)
        .map(|_| {
            let response = get(&nginx, "/login?user=ann");
            assert_eq!(response.status, 200);
            response
                .header("X-RateLimit-Remaining")
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(remaining, ["2", "1", "0"]);
    let refused = get(&nginx, "/login?user=ann");
    assert_eq!(refused.status, 429);
    let retry: u64 = refused.header("Retry-After").unwrap().parse().unwrap();
    assert!(retry > 1 && retry <= 120, "Retry-After {retry}");
    assert_eq!(get(&nginx, "/login?user=bob").status, 200);
    assert_eq!(path_statuses(&nginx, &["/login"; 5]), [200; 5]);
    assert_eq!(path_statuses(&nginx, &["/login?user="; 5]), [200; 5]);

    // combine: ann's third request is refused by her limit and takes nothing from the
    // server's 3 tokens, so bob gets the third; then the server-wide limit alone decides
    // requests without a user: none left.
    let got = path_statuses(
        &nginx,
        &[
            "/combined?user=ann",
            "/combined?user=ann",
            "/combined?user=ann",
            "/combined?user=bob",
            "/combined",
            "/combined?user=",
        ],
    );
    assert_eq!(got, [200, 200, 429, 200, 429, 429]);

    // resty.limit.rate: 10 tokens, 2 a request; not limited without a token.
    let paths = ["/upload?token=t"; 6];
    assert_eq!(
        path_statuses(&nginx, &paths),
        [200, 200, 200, 200, 200, 429]
    );
    assert_eq!(path_statuses(&nginx, &["/upload"; 7]), [200; 7]);

    // The pool (3 tokens) plus the user's own 2: a request without a user takes from the
    // pool alone; ann: her 2 tokens and the pool's next 2 (one of each while there are),
    // then none; bob: his own 2 only; no user: the pool is dry.
    let got = path_statuses(
        &nginx,
        &[
            "/pooled",
            "/pooled?user=ann",
            "/pooled?user=ann",
            "/pooled?user=ann",
            "/pooled?user=bob",
            "/pooled?user=bob",
            "/pooled?user=bob",
            "/pooled",
        ],
    );
    assert_eq!(got, [200, 200, 200, 429, 200, 200, 429, 429]);

    // resty.limit.conn: two slots and one queue place: two served at once (0.5 s of work
    // each), one after waiting its turn, a fourth refused at once.
    // The fourth is sent once the three are in (two slots and the queue's place taken): the
    // three connections may reach nginx's two workers in any order, and a fourth that came
    // first would take a place of theirs.
    let pending: Vec<_> = (0..3)
        .map(|_| start_request(nginx.port(), &Request::get("/conn/")))
        .collect();
    wait_conn_state(&nginx, "rejected");
    let refused = get(&nginx, "/conn/");
    assert_eq!(refused.status, 503);
    assert!(
        refused.elapsed < Duration::from_millis(400),
        "{:?}",
        refused.elapsed
    );
    let started = Instant::now();
    let responses: Vec<Response> = pending.into_iter().map(|p| p.finish()).collect();
    let got: Vec<u16> = responses.iter().map(|response| response.status).collect();
    assert_eq!(got, [200, 200, 200]);
    // The queued one got its turn when a slot was given back, about 0.5 s later.
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "all three done {:?} after the refusal",
        started.elapsed()
    );
    // Every slot and place came back (each in its request's log phase, which may run just
    // after the client has read the response): three at once again all get through.
    wait_conn_state(&nginx, "admitted 0");
    let again: Vec<_> = (0..3)
        .map(|_| start_request(nginx.port(), &Request::get("/conn/")))
        .collect();
    let got: Vec<u16> = again.into_iter().map(|p| p.finish().status).collect();
    assert_eq!(got, [200, 200, 200]);

    let log = nginx.error_log();
    assert!(
        !log.contains("[error]") && !log.contains("[alert]"),
        "an example logged an error:\n{log}"
    );
}

/// Lua on a `sync` zone (`rate_limit_sync`): two instances decide one key from Lua and share
/// its limit through Redis (about K = 6 of 12 requests pass, where two instances alone would
/// pass 12); requests given back with `uncommit` are not charged to the fleet (after six
/// charged and given back on one instance, the other still passes K's worth).
#[test]
fn lua_on_a_sync_zone_shares_the_fleet_limit() {
    require_lua!();
    let redis = Redis::start();
    let http = format!(
        "rate_limit_sync redis://127.0.0.1:{} interval=100ms;
         rate_limit_zone $arg_k zone=api:1m rate=6r/m burst=5 sync;",
        redis.port
    );
    let locations = format!(
        r#"{LUA_DECIDE}
        location /ratelimit/ {{ rate_limit_admin; }}
        location = /give_back {{
            content_by_lua_block {{
                local lim = require("resty.rate_limit").new("api", {{nodelay = true}})
                for i = 1, 6 do
                    assert(lim:incoming(ngx.var.arg_k, true))
                    assert(lim:uncommit(ngx.var.arg_k))
                end
                ngx.say("given back")
            }}
        }}"#
    );
    let fleet: Vec<Nginx> = (0..2)
        .map(|_| Nginx::start(&config(2, &http, &locations)))
        .collect();
    redis.wait_instances(2);
    let spaced = |instances: &[&Nginx], key: &str| -> usize {
        (0..12)
            .filter(|at| {
                thread::sleep(Duration::from_millis(250));
                let status = get(
                    instances[at % instances.len()],
                    &format!("/lua?zone=api&k={key}"),
                )
                .status;
                assert!(status == 200 || status == 429, "{status}");
                status == 200
            })
            .count()
    };
    let passed = spaced(&[&fleet[0], &fleet[1]], "shared");
    assert!(
        (5..=7).contains(&passed),
        "{passed} of 12 passed over two instances"
    );

    assert_eq!(
        body(&fleet[0], "/give_back?k=returned").trim(),
        "given back"
    );
    let round_trips = |nginx: &Nginx| {
        sync_state(nginx)["round_trips"]
            .as_u64()
            .expect("round_trips")
    };
    let before = round_trips(&fleet[0]);
    let waited = Instant::now();
    while round_trips(&fleet[0]) < before + 3 {
        assert!(
            waited.elapsed() < Duration::from_secs(5),
            "the loop stopped"
        );
        thread::sleep(Duration::from_millis(20));
    }
    let passed = spaced(&[&fleet[1]], "returned");
    assert!(
        (5..=7).contains(&passed),
        "{passed} of 12 passed after the give-backs"
    );
}

/// `rate_limit.conn` and a `rate_limit` line share one concurrency zone: a slot Lua holds is
/// one the directive cannot take, and back once Lua gives it back; the conn calls refuse a rate
/// zone and the rate calls a concurrency zone, with the reason; `set_conn` changes the limit
/// for the directive too.
#[test]
fn conn_shares_the_zone_with_the_directive() {
    require_lua!();
    let upstream = common::upstream::Upstream::start();
    let http = "rate_limit_zone $arg_k zone=conc:1m algorithm=concurrency limit=1;\n\
                rate_limit_zone $arg_k zone=rate:1m rate=1r/m;";
    let locations = format!(
        r#"
location = /hold {{
    access_by_lua_block {{
        local lim = require("resty.rate_limit").conn("conc")
        local delay, conn = lim:incoming(ngx.var.arg_k, true)
        if not delay then return ngx.exit(conn == "rejected" and 429 or 500) end
        ngx.header["X-Conn"] = conn
        ngx.header["X-Committed"] = tostring(lim:is_committed())
        ngx.sleep(tonumber(ngx.var.arg_s))
        ngx.header["X-Left"] = lim:leaving(ngx.var.arg_k, 0.01)
    }}
    content_by_lua_block {{ ngx.say("held") }}
}}
location = /directive {{
    rate_limit zone=conc;
    proxy_pass http://127.0.0.1:{port}/;
}}
location = /errors {{
    content_by_lua_block {{
        local rl = require "resty.rate_limit"
        local out = {{}}
        local _, err = rl.conn("rate"):incoming("k", true)
        out[#out + 1] = err
        _, err = rl.new("conc"):incoming("k", true)
        out[#out + 1] = err
        _, err = rl.conn("conc"):leaving("nobody")
        out[#out + 1] = err
        _, err = rl.conn("conc"):set_conn(0)
        out[#out + 1] = err
        _, err = rl.conn("conc", {{cost = 0}})
        out[#out + 1] = err
        ngx.say(table.concat(out, "\n"))
    }}
}}
location /admin/ {{ rate_limit_admin; }}
location = /set {{
    content_by_lua_block {{
        local ok, err = require("resty.rate_limit").conn("conc"):set_conn(tonumber(ngx.var.arg_n))
        ngx.say(tostring(ok or err))
    }}
}}
"#,
        port = upstream.port()
    );
    let nginx = Nginx::start(&config(2, http, &locations));
    let held = start_request(nginx.port(), &Request::get("/hold?k=a&s=1"));
    // Once Lua holds the one slot, the directive is refused until Lua leaves.
    wait_in_flight(&nginx, "a", 1);
    assert_eq!(get(&nginx, "/directive?k=a").status, 429);
    let held = held.finish();
    assert_eq!(held.status, 200, "{}", held.text());
    assert_eq!(
        (
            held.header("X-Conn"),
            held.header("X-Committed"),
            held.header("X-Left")
        ),
        (Some("1"), Some("true"), Some("0"))
    );
    assert_eq!(get(&nginx, "/directive?k=a").status, 200);

    let errors = body(&nginx, "/errors");
    assert_eq!(
        errors.lines().collect::<Vec<_>>(),
        [
            "zone \"rate\" is not a concurrency zone: use rate_limit.new",
            "zone \"conc\" is a concurrency zone: use rate_limit.conn",
            "this request holds no slot of the key in zone \"conc\"",
            "invalid limit 0: must be an integer from 1 to 16777215",
            "cost must be a positive integer",
        ]
    );
    // Two slots now, for the directive too, in both workers.
    assert_eq!(body(&nginx, "/set?n=2").trim(), "true");
    let first = start_request(nginx.port(), &Request::get("/hold?k=b&s=1"));
    let second = start_request(nginx.port(), &Request::get("/hold?k=b&s=1"));
    wait_in_flight(&nginx, "b", 2);
    assert_eq!(get(&nginx, "/directive?k=b").status, 429);
    assert_eq!((first.finish().status, second.finish().status), (200, 200));
    wait_in_flight(&nginx, "b", 0);
    drop(upstream);
}

/// Issue 27, point 7: `set_conn(-1)` and `set_burst(-1)` are refused (-1 is the ABI's
/// "unchanged": they used to answer true and change nothing), a huge number is quoted as Lua
/// has it (not wrapped to -9223372036854775808), and a Lua `conn` slot followed by `ngx.exec`
/// into a `rate_limit` line of the same zone is one request: with `limit=1` it used to be
/// refused by its own slot (or counted twice with more).
#[test]
fn conn_refuses_minus_one_and_exec_counts_once() {
    require_lua!();
    let upstream = common::upstream::Upstream::start();
    let http = "rate_limit_zone $arg_k zone=conc:1m algorithm=concurrency limit=1 queue=2;";
    let locations = format!(
        r#"
location = /set {{
    content_by_lua_block {{
        local lim = require("resty.rate_limit").conn("conc")
        local n = tonumber(ngx.var.arg_n)
        local ok, err
        if ngx.var.arg_what == "queue" then ok, err = lim:set_burst(n) else ok, err = lim:set_conn(n) end
        ngx.say(tostring(ok or err))
    }}
}}
location = /lua_then_exec {{
    access_by_lua_block {{
        local lim = require("resty.rate_limit").conn("conc")
        local delay, conn = lim:incoming(ngx.var.arg_k, true)
        if not delay then return ngx.exit(conn == "rejected" and 429 or 500) end
        return ngx.exec("/directive", ngx.var.args)
    }}
}}
location = /directive {{
    rate_limit zone=conc;
    proxy_pass http://127.0.0.1:{port}/hold/exec;
}}
location /admin/ {{ rate_limit_admin; }}
"#,
        port = upstream.port()
    );
    let nginx = Nginx::start(&config(2, http, &locations));
    for (query, expected) in [
        (
            "n=-1",
            "invalid limit -1: must be an integer from 1 to 16777215",
        ),
        (
            "what=queue&n=-1",
            "invalid queue -1: must be an integer from 0 to 32767",
        ),
        (
            "n=1e300",
            "invalid limit 1e+300: must be an integer from 1 to 16777215",
        ),
        (
            "what=queue&n=1e300",
            "invalid queue 1e+300: must be an integer from 0 to 32767",
        ),
        (
            "n=16777216",
            "invalid limit 16777216: must be an integer from 1 to 16777215",
        ),
        (
            "n=1.5",
            "invalid limit 1.5: must be an integer from 1 to 16777215",
        ),
    ] {
        assert_eq!(
            body(&nginx, &format!("/set?{query}")).trim(),
            expected,
            "{query}"
        );
    }
    let zone: serde_json::Value =
        serde_json::from_slice(&get(&nginx, "/admin/zones/conc").body).unwrap();
    assert_eq!(
        (&zone["limit"], &zone["queue"]),
        (&1.into(), &2.into()),
        "{zone}"
    );

    let held = start_request(nginx.port(), &Request::get("/lua_then_exec?k=a"));
    upstream.wait_arrivals(1, Duration::from_secs(10));
    wait_in_flight(&nginx, "a", 1);
    upstream.release_all();
    let held = held.finish();
    assert_eq!(held.status, 200, "{}", held.text());
    wait_in_flight(&nginx, "a", 0);
}

/// Wait until key `key` of zone `conc` has `expected` requests in flight (admin API).
fn wait_in_flight(nginx: &Nginx, key: &str, expected: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let response = get(nginx, &format!("/admin/zones/conc/keys/{key}"));
        // 200: the key's state; 404 "is not tracked": a key without state holds nothing in
        // flight. Anything else (an unknown zone, a 500, a wrong path) is a failure, not 0.
        let in_flight = match response.status {
            200 => serde_json::from_slice::<serde_json::Value>(&response.body).unwrap()
                ["in_flight"]
                .as_u64()
                .unwrap(),
            404 if response.text().contains("is not tracked in zone") => 0,
            status => panic!("GET key {key}: {status} {}", response.text()),
        };
        if in_flight == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "key {key}: {in_flight} in flight, not {expected}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// The penalty box from Lua: `block`/`blocked` on a zone with `block=`, shared with the
/// directive's location; on_status semantics with `incoming(key, false)` at access and
/// `charge(key)` at log (failures charged, successes not, the key blocked once over its
/// limit); errors as messages.
#[test]
fn lua_blocks_keys_and_charges_after_the_response() {
    require_lua!();
    let http = "rate_limit_zone $arg_k zone=login:1m rate=3r/h burst=1 block=1h;\n\
                rate_limit_zone $arg_k zone=plain:1m rate=3r/h;";
    let locations = r#"
        location = /login {
            access_by_lua_block {
                local lim = require("resty.rate_limit").new("login", {nodelay = true})
                local delay, err, info = lim:incoming(ngx.var.arg_k, false)
                if not delay then
                    ngx.header["Retry-After"] = math.ceil(info)
                    return ngx.exit(429)
                end
            }
            content_by_lua_block {
                ngx.status = tonumber(ngx.var.arg_status) or 200
                ngx.say("answered")
            }
            log_by_lua_block {
                if ngx.status == 401 then
                    require("resty.rate_limit").new("login", {nodelay = true}):charge(ngx.var.arg_k)
                end
            }
        }
        location = /directive { rate_limit zone=login nodelay; empty_gif; }
        location = /block {
            content_by_lua_block {
                local rl = require "resty.rate_limit"
                local function show(a, b) ngx.say(tostring(a), " ", tostring(b)) end
                show(rl.new("login"):block(ngx.var.arg_k, tonumber(ngx.var.arg_s)))
            }
        }
        location = /blocked {
            content_by_lua_block {
                local rl = require "resty.rate_limit"
                local left, err = rl.new(ngx.var.arg_zone or "login"):blocked(ngx.var.arg_k)
                ngx.say(tostring(left and math.ceil(left)), " ", tostring(err))
            }
        }
        location = /errors {
            content_by_lua_block {
                local rl = require "resty.rate_limit"
                local function show(a, b) ngx.say(tostring(a), " ", tostring(b)) end
                show(rl.new("plain"):block("k", 10))
                show(rl.new("login"):block("k", 0))
                show(rl.new("login"):block("k", "x"))
                show(rl.new("login"):block(5, 10))
                show(rl.new("nope"):blocked("k"))
                show(rl.new("login", {nodelay = true, on_status = "401"}))
            }
        }
        location /ratelimit/ { rate_limit_admin; }
    "#;
    let nginx = Nginx::start(&config(1, http, locations));
    let status = |path: &str| get(&nginx, path).status;
    // Successes are never charged: ten in a row pass.
    for _ in 0..10 {
        assert_eq!(status("/login?k=alice"), 200);
    }
    // Failures are: two pass (1 + burst 1), charged at log time; the third is over the limit
    // at the door, which rejects it and blocks the key; from then on the door refuses it.
    assert_eq!(status("/login?k=mallory&status=401"), 401);
    assert_eq!(status("/login?k=mallory&status=401"), 401);
    let rejected = get(&nginx, "/login?k=mallory&status=401");
    assert_eq!(rejected.status, 429);
    assert_eq!(rejected.header("Retry-After"), Some("3600"));
    let refused = get(&nginx, "/login?k=mallory");
    assert_eq!(refused.status, 429);
    let left: u64 = refused.header("Retry-After").unwrap().parse().unwrap();
    assert!((3590..=3600).contains(&left), "{left}");
    assert_eq!(body(&nginx, "/blocked?k=mallory"), "3600 nil\n");
    // The directive's location sees the same block.
    assert_eq!(status("/directive?k=mallory"), 429);
    // By hand: blocked for 30 s, seen by Lua, the directive and the admin API.
    let blocked = get(&nginx, "/block?k=trudy&s=30");
    assert_eq!(
        (blocked.status, blocked.text()),
        (200, "true nil\n".to_string()),
        "{}",
        nginx.error_log()
    );
    assert_eq!(body(&nginx, "/blocked?k=trudy"), "30 nil\n");
    assert_eq!(status("/directive?k=trudy"), 429);
    assert_eq!(status("/login?k=trudy"), 429);
    let list: serde_json::Value =
        serde_json::from_str(&body(&nginx, "/ratelimit/zones/login/blocked")).unwrap();
    let keys: Vec<&str> = list["keys"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|key| key["key"].as_str())
        .collect();
    assert_eq!(keys, ["trudy", "mallory"], "{list}");
    assert_eq!(body(&nginx, "/blocked?k=alice"), "nil nil\n");
    assert_eq!(body(&nginx, "/blocked?k=alice&zone=plain"), "nil nil\n");
    let expected = [
        "nil zone \"plain\" has no penalty box: \"block=DURATION\" on its rate_limit_zone \
         keeps blocked keys",
        "nil seconds must be a positive number",
        "nil seconds must be a positive number",
        "nil key must be a string, got number",
        "nil unknown zone \"nope\"",
        "nil invalid parameter \"on_status\": in Lua, call incoming(key, false) at access and \
         charge(key) at log when the status matches",
    ];
    let text = body(&nginx, "/errors");
    assert_eq!(text.lines().collect::<Vec<_>>(), expected);
    assert!(
        !nginx.error_log().contains("[alert]"),
        "{}",
        nginx.error_log()
    );
}

/// A `$binary_remote_addr` zone takes its keys from Lua as the address in text or as the raw
/// bytes, alike: a block by address refuses the client at the directive's door, and a charge
/// by address is the same key's as the directive's.
#[test]
fn lua_takes_binary_address_keys_as_addresses() {
    require_lua!();
    let http = "rate_limit_zone $binary_remote_addr zone=addr:1m rate=3r/h burst=1 block=1h;";
    let locations = r#"
        location = /directive { rate_limit zone=addr nodelay; empty_gif; }
        location = /lua {
            content_by_lua_block {
                local lim = require("resty.rate_limit").new("addr", {nodelay = true})
                local key = ngx.var.arg_raw and ngx.var.binary_remote_addr or ngx.var.arg_k
                local delay, excess = lim:incoming(key, true)
                ngx.say(tostring(delay), " ", tostring(excess and math.ceil(excess)))
            }
        }
        location = /block {
            content_by_lua_block {
                local ok, err = require("resty.rate_limit").new("addr"):block(ngx.var.arg_k, 30)
                ngx.say(tostring(ok), " ", tostring(err))
            }
        }
        location = /blocked {
            content_by_lua_block {
                local left = require("resty.rate_limit").new("addr"):blocked(ngx.var.binary_remote_addr)
                ngx.say(tostring(left and math.ceil(left)))
            }
        }
        location /ratelimit/ { rate_limit_admin write=on; }
    "#;
    let nginx = Nginx::start(&config(1, http, locations));
    // One charge by address, one by the raw bytes (the excess says it is the same key), then
    // the directive: the third of 1 + burst 1.
    assert_eq!(body(&nginx, "/lua?k=127.0.0.1"), "0 0\n");
    assert_eq!(body(&nginx, "/lua?raw=1"), "0 1\n");
    assert_eq!(get(&nginx, "/directive").status, 429);
    let list: serde_json::Value =
        serde_json::from_str(&body(&nginx, "/ratelimit/zones/addr/blocked")).unwrap();
    assert_eq!(list["keys"][0]["key"], "127.0.0.1", "{list}");
    // Released through the API by address, then blocked by hand from Lua by address.
    let release = send(
        nginx.port(),
        &Request::new("DELETE", "/ratelimit/zones/addr/blocked/127.0.0.1"),
    );
    assert_eq!(release.status, 204);
    assert_eq!(body(&nginx, "/blocked"), "nil\n");
    assert_eq!(body(&nginx, "/block?k=127.0.0.1"), "true nil\n");
    assert_eq!(body(&nginx, "/blocked"), "30\n");
}
