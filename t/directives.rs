//! The directives: what `nginx -t` refuses and why, how `rate_limit` and the other directives
//! are inherited from http to server to location, `rate_limit_status`, and the levels
//! `rate_limit_log_level` logs at.
//!
//! Limited locations serve a static file: `return` runs before the preaccess phase, where the
//! module decides.

mod common;

use common::{check_config, get, start_request, Connection, Nginx, Request, Response};

/// A whole nginx.conf with the module loaded; `http` is the body of the `http` block.
fn config(http: &str) -> String {
    common::config().no_server().http(http).build()
}

/// A server on `%%PORT%%` whose every location is a static file, for `nginx -t` cases.
fn server(locations: &str) -> String {
    format!("server {{\n    listen 127.0.0.1:%%PORT%%;\n    root html;\n    {locations}\n}}\n")
}

/// The RateLimit-Policy of a response: which zones applied to it.
fn policy(response: &Response) -> String {
    response.header_all("RateLimit-Policy").join(", ")
}

#[test]
fn nginx_t_accepts_every_directive() {
    let http = format!(
        "rate_limit_zone $binary_remote_addr zone=a:1m rate=10r/s burst=5;\n\
         rate_limit_zone $http_x_user zone=user:1m rate=1r/m burst=2 algorithm=token_bucket;\n\
         rate_limit_zone global zone=pool:64k rate=10r/m burst=20 algorithm=token_bucket;\n\
         rate_limit_zone $http_x_key zone=log:1m rate=2r/s algorithm=sliding_log;\n\
         rate_limit_zone $http_x_key zone=window:1m rate=2r/s algorithm=sliding_window;\n\
         rate_limit_zone app zone=app:1m algorithm=concurrency limit=100 queue=200 queue_timeout=5s;\n\
         rate_limit_zone app zone=app_auto:1m algorithm=concurrency limit=adaptive min=4 max=500;\n\
         rate_limit_zone $binary_remote_addr zone=login:1m rate=5r/m burst=5 block=15m \
         block_max=24h;\n\
         rate_limit_status 503;\n\
         rate_limit_dry_run off;\n\
         rate_limit_log_level warn;\n\
         rate_limit_headers on;\n\
         rate_limit zone=a burst=3 delay=1;\n\
         {}",
        server(
            "rate_limit_status 429;\n\
             location /a { rate_limit zone=a nodelay; rate_limit zone=log; rate_limit_dry_run on; }\n\
             location /b { rate_limit zone=user global=pool cost=2; rate_limit_headers off; }\n\
             location /c { rate_limit zone=window; rate_limit_log_level info; }\n\
             location /d { rate_limit zone=app burst=3 cost=2; rate_limit zone=a; }\n\
             location /e { rate_limit zone=app_auto; }\n\
             location /login { rate_limit zone=login nodelay on_status=401,403,5xx; }"
        )
    );
    let (ok, output) = check_config(&config(&http));
    assert!(ok, "{output}");
}

#[test]
fn nginx_t_refuses_bad_configuration() {
    let zone = "rate_limit_zone $binary_remote_addr zone=a:1m rate=1r/s;";
    let token = "algorithm=token_bucket";
    // (what is wrong, http block body, the message nginx -t must print)
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "rate that is not a number",
            "rate_limit_zone $binary_remote_addr zone=a:1m rate=abc;".to_string(),
            "invalid rate \"rate=abc\"",
        ),
        (
            "rate_limit of an undeclared zone",
            format!("{zone}\n{}", server("location / { rate_limit zone=missing; }")),
            "unknown zone \"missing\": the only zone is \"a\"",
        ),
        (
            "rate_limit of a mistyped zone",
            format!(
                "rate_limit_zone $binary_remote_addr zone=per_client:1m rate=1r/s;\n\
                 rate_limit_zone $binary_remote_addr zone=login:1m rate=5r/m;\n{}",
                server("location / { rate_limit zone=perclient; }")
            ),
            "unknown zone \"perclient\", did you mean \"per_client\"?",
        ),
        (
            "rate_limit naming a zone with its size, as rate_limit_zone does",
            format!(
                "rate_limit_zone $binary_remote_addr zone=per_client:1m rate=1r/s;\n{}",
                server("location / { rate_limit zone=per_client:1m; }")
            ),
            "unknown zone \"per_client:1m\", did you mean \"per_client\"?",
        ),
        (
            "rate_limit of an undeclared zone among several",
            format!(
                "{zone}\nrate_limit_zone $binary_remote_addr zone=login:1m rate=5r/m;\n{}",
                server("location / { rate_limit zone=api; }")
            ),
            "unknown zone \"api\": the zones are \"a\" and \"login\"",
        ),
        (
            "zone size with a unit nginx does not write",
            "rate_limit_zone $binary_remote_addr zone=per_client:1mb rate=1r/s;".to_string(),
            "invalid zone size \"zone=per_client:1mb\", did you mean \"zone=per_client:1m\"?",
        ),
        (
            "zone without its size",
            "rate_limit_zone $binary_remote_addr zone=per_client rate=1r/s;".to_string(),
            "invalid zone size \"zone=per_client\": it must be zone=NAME:SIZE, the SIZE in \
             bytes or with k, m or g (65536, 512k, 10m), as in limit_req_zone",
        ),
        (
            "concurrency zone size with a unit nginx does not write",
            "rate_limit_zone app zone=app:10MB algorithm=concurrency limit=10;".to_string(),
            "invalid zone size \"zone=app:10MB\", did you mean \"zone=app:10m\"?",
        ),
        (
            "zone smaller than 32k",
            "rate_limit_zone $binary_remote_addr zone=a:16k rate=1r/s;".to_string(),
            "zone \"a\" is too small",
        ),
        (
            "zone declared twice",
            format!("{zone}\nrate_limit_zone $http_x_key zone=a:1m rate=2r/s;"),
            "duplicate zone \"a\"",
        ),
        (
            "block= not a duration",
            "rate_limit_zone $binary_remote_addr zone=a:1m rate=5r/m block=15x;".to_string(),
            "invalid block value \"block=15x\": give a duration such as 30s, 15m, 24h or 1h30m",
        ),
        (
            "block_max= shorter than block=",
            "rate_limit_zone $binary_remote_addr zone=a:1m rate=5r/m block=1h block_max=30m;"
                .to_string(),
            "\"block_max=30m\" is shorter than \"block\": block_max is the longest block",
        ),
        (
            "block_max= without block=",
            "rate_limit_zone $binary_remote_addr zone=a:1m rate=5r/m block_max=1h;".to_string(),
            "\"block_max\" needs \"block\"",
        ),
        (
            "on_status= not a status",
            format!("{zone}\n{}", server("location / { rate_limit zone=a on_status=4x; }")),
            "invalid on_status value \"on_status=4x\": give status codes (401) or classes (4xx)",
        ),
        (
            "block= on a global zone",
            format!(
                "rate_limit_zone $binary_remote_addr zone=a:1m rate=1r/s algorithm=token_bucket;\n\
                 rate_limit_zone $server_name zone=all:1m rate=100r/s algorithm=token_bucket \
                 block=1m;\n{}",
                server("location / { rate_limit zone=a global=all; }")
            ),
            "global zone \"all\" has \"block\"",
        ),
        (
            "zone too small for its block table",
            "rate_limit_zone $binary_remote_addr zone=a:24k rate=1r/s block=1m;".to_string(),
            "zone \"a\" is too small with block= (an eighth of the zone, at least 64 keys of 96 \
             bytes, keeps the blocked keys): the minimum is",
        ),
        (
            "unknown algorithm",
            "rate_limit_zone $binary_remote_addr zone=a:1m rate=1r/s algorithm=fast;"
                .to_string(),
            "unknown algorithm \"fast\"",
        ),
        (
            "rate_limit_zone without zone=",
            "rate_limit_zone $binary_remote_addr rate=1r/s;".to_string(),
            "\"rate_limit_zone\" must have \"zone\" parameter",
        ),
        (
            "rate_limit without zone=",
            format!("{zone}\n{}", server("location / { rate_limit burst=5; }")),
            "\"rate_limit\" must have \"zone\" parameter",
        ),
        (
            "status below 400",
            format!("{zone}\nrate_limit_status 200;"),
            "invalid status \"200\": value must be between 400 and 599",
        ),
        (
            "status above 599",
            format!("{zone}\n{}", server("rate_limit_status 600;")),
            "invalid status \"600\": value must be between 400 and 599",
        ),
        // nginx's own setters read these three: their errors are nginx's own words.
        (
            "status not a number",
            format!("{zone}\nrate_limit_status abc;"),
            "\"rate_limit_status\" directive invalid number",
        ),
        (
            "dry run neither on nor off",
            format!("{zone}\nrate_limit_dry_run maybe;"),
            "invalid value \"maybe\" in \"rate_limit_dry_run\" directive, it must be \"on\" or \"off\"",
        ),
        (
            "headers set twice",
            format!("{zone}\n{}", server("rate_limit_headers on; rate_limit_headers off;")),
            "\"rate_limit_headers\" directive is duplicate",
        ),
        (
            "unknown log level",
            format!("{zone}\nrate_limit_log_level loud;"),
            "invalid value \"loud\"",
        ),
        (
            "global= with a leaky_bucket user zone",
            format!(
                "{zone}\nrate_limit_zone global zone=pool:1m rate=1r/s {token};\n{}",
                server("location / { rate_limit zone=a global=pool; }")
            ),
            "zone \"a\" used with \"global=\" must use algorithm=token_bucket",
        ),
        (
            "global= naming a leaky_bucket zone",
            format!(
                "rate_limit_zone $http_x_user zone=user:1m rate=1r/s {token};\n\
                 rate_limit_zone global zone=pool:1m rate=1r/s;\n{}",
                server("location / { rate_limit zone=user global=pool; }")
            ),
            "global zone \"pool\" used with \"global=\" must use algorithm=token_bucket",
        ),
        (
            "burst= on a sliding_log zone",
            "rate_limit_zone $binary_remote_addr zone=a:1m rate=1r/s burst=5 \
             algorithm=sliding_log;"
                .to_string(),
            "\"burst\" is not used by sliding_log",
        ),
        (
            "rate_limit burst= on a sliding_log zone",
            format!(
                "rate_limit_zone $binary_remote_addr zone=a:1m rate=1r/s algorithm=sliding_log;\n{}",
                server("location / { rate_limit zone=a burst=5; }")
            ),
            "\"burst\" is not used by sliding_log",
        ),
        (
            "concurrency limit=0",
            "rate_limit_zone $server_name zone=c:1m algorithm=concurrency limit=0;".to_string(),
            "invalid limit value \"limit=0\": must be an integer from 1 to 16777215, or \
             \"adaptive\"",
        ),
        (
            "concurrency without limit",
            "rate_limit_zone $server_name zone=c:1m algorithm=concurrency queue=5;".to_string(),
            "\"rate_limit_zone\" must have \"limit\" parameter",
        ),
        (
            "concurrency with a rate",
            "rate_limit_zone $server_name zone=c:1m algorithm=concurrency limit=5 rate=1r/s;"
                .to_string(),
            "\"rate\" is not used by concurrency zones",
        ),
        (
            "queue_timeout without queue",
            "rate_limit_zone $server_name zone=c:1m algorithm=concurrency limit=5 \
             queue_timeout=1s;"
                .to_string(),
            "\"queue_timeout=1s\" needs \"queue=\" places to wait in",
        ),
        (
            "queue_timeout that is not a time",
            "rate_limit_zone $server_name zone=c:1m algorithm=concurrency limit=5 queue=1 \
             queue_timeout=soon;"
                .to_string(),
            "invalid queue_timeout value \"queue_timeout=soon\"",
        ),
        (
            "adaptive min over max",
            "rate_limit_zone $server_name zone=c:1m algorithm=concurrency limit=adaptive \
             min=50 max=10;"
                .to_string(),
            "\"min=50\" is more than \"max=10\"",
        ),
        (
            "sync on an adaptive concurrency zone",
            "rate_limit_zone $server_name zone=c:1m algorithm=concurrency limit=adaptive sync;"
                .to_string(),
            "\"sync\" is not supported with \"limit=adaptive\"",
        ),
        (
            "nodelay on a concurrency line",
            format!(
                "rate_limit_zone $server_name zone=c:1m algorithm=concurrency limit=5;\n{}",
                server("location / { rate_limit zone=c nodelay; }")
            ),
            "\"nodelay\" is not used by concurrency zone \"c\": requests over its limit wait \
             in its queue (\"queue=\", or \"burst=\" here) or are rejected",
        ),
        (
            "delay= on a concurrency line",
            format!(
                "rate_limit_zone $server_name zone=c:1m algorithm=concurrency limit=5;\n{}",
                server("location / { rate_limit zone=c delay=2; }")
            ),
            "\"delay\" is not used by concurrency zone \"c\"",
        ),
        (
            "global= with a concurrency zone",
            format!(
                "rate_limit_zone $server_name zone=c:1m algorithm=concurrency limit=5;\n\
                 rate_limit_zone global zone=pool:64k rate=10r/m burst=20 {token};\n{}",
                server("location / { rate_limit zone=c global=pool; }")
            ),
            "zone \"c\" used with \"global=\" must use algorithm=token_bucket, not concurrency",
        ),
        (
            "a leaky bucket that would take more than 100 years to drain",
            "rate_limit_zone $arg_k zone=a:1m rate=0.001r/d burst=300;".to_string(),
            "burst 300 is too large for rate \"0.001r/d\" (at most 35: a leaky_bucket must \
             drain within 100 years)",
        ),
        (
            "a token bucket that would take more than 100 years to refill",
            "rate_limit_zone $arg_k zone=a:1m rate=0.001r/d burst=4194303 \
             algorithm=token_bucket;"
                .to_string(),
            "burst 4194303 is too large for rate \"0.001r/d\" (at most 36: a token_bucket must \
             refill within 100 years)",
        ),
        (
            "a rate_limit line's burst too large for its zone's rate",
            format!(
                "rate_limit_zone $arg_k zone=slow:1m rate=0.001r/d;\n{}",
                server("location / { rate_limit zone=slow burst=300 nodelay; }")
            ),
            "burst 300 is too large for rate \"0.001r/d\" (at most 35: a leaky_bucket must \
             drain within 100 years) in ",
        ),
        (
            "a rate_limit line's burst too large for its global zone's rate",
            format!(
                "rate_limit_zone $arg_k zone=user:1m rate=1r/s {token};\n\
                 rate_limit_zone global zone=pool:1m rate=0.001r/d {token};\n{}",
                server("location / { rate_limit zone=user global=pool burst=100; }")
            ),
            "burst 100 is too large for rate \"0.001r/d\" (at most 36: a token_bucket must \
             refill within 100 years) in ",
        ),
        (
            "a usage= line charged by its own settlement's result",
            format!(
                "rate_limit_zone $arg_k zone=tpm:1m rate=1000r/m {token};\n{}",
                server("location / { rate_limit zone=tpm usage=$rate_limit_usage_cost; }")
            ),
            "invalid \"usage=$rate_limit_usage_cost\": $rate_limit_usage_cost is what a usage= \
             line settled",
        ),
        (
            "reserve= from a settlement's result",
            format!(
                "rate_limit_zone $arg_k zone=tpm:1m rate=1000r/m {token};\n{}",
                server(
                    "location / { rate_limit zone=tpm usage=openai \
                     reserve=$rate_limit_usage_total_tokens; }"
                )
            ),
            "invalid \"reserve=$rate_limit_usage_total_tokens\"",
        ),
        (
            "cost= from a settlement's result",
            format!(
                "rate_limit_zone $arg_k zone=tpm:1m rate=1000r/m {token};\n{}",
                server("location / { rate_limit zone=tpm cost=$rate_limit_usage_prompt_tokens; }")
            ),
            "invalid \"cost=$rate_limit_usage_prompt_tokens\"",
        ),
    ];

    let mut failures = Vec::new();
    for (what, http, expected) in &cases {
        let (ok, output) = check_config(&config(http));
        if ok {
            failures.push(format!("{what}: nginx -t accepted it:\n{output}"));
        } else if !output.contains("[emerg]") || !output.contains(expected) {
            failures.push(format!(
                "{what}: expected an [emerg] with {expected:?}, got:\n{output}"
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// Errors that quote a word nobody recognises also say what is valid: the rate syntax, the
/// algorithms, the parameter meant by a typo (or every parameter), the log levels, the Redis
/// URL form.
#[test]
fn nginx_t_errors_say_what_is_valid() {
    let zone = "rate_limit_zone $binary_remote_addr zone=a:1m rate=1r/s;";
    let limited = |limit: &str| format!("{zone}\n{}", server(&format!("location / {{ {limit} }}")));
    // (http block body, the message nginx -t must print)
    let cases: Vec<(String, &str)> = vec![
        (
            "rate_limit_zone $binary_remote_addr zone=a:1m rate=10/s;".to_string(),
            "invalid rate \"rate=10/s\": it must be NUMBERr/s|m|h|d with NUMBER above 0, \
             e.g. 10r/s or 0.5r/m in ",
        ),
        (
            "rate_limit_zone $binary_remote_addr zone=a:1m rate=1r/s algorithm=token-bucket;"
                .to_string(),
            "unknown algorithm \"token-bucket\": it must be leaky_bucket, token_bucket, \
             sliding_log, sliding_window, concurrency or quota in ",
        ),
        (
            "rate_limit_zone $binary_remote_addr zone=a:1m rate=1r/s brust=5;".to_string(),
            "invalid parameter \"brust=5\", did you mean \"burst=\"? in ",
        ),
        (
            limited("rate_limit zone=a nodleay;"),
            "invalid parameter \"nodleay\", did you mean \"nodelay\"? in ",
        ),
        (
            limited("rate_limit zone=a rate=1r/s;"),
            "invalid parameter \"rate=1r/s\": it must be zone=, burst=, nodelay, delay=, \
             global=, cost=, on_status=, usage=, reserve=, debt=, on_missing=, \
             usage_weights=, prices= or headers= in ",
        ),
        (
            limited("rate_limit zone=a headers=no;"),
            "invalid headers value \"headers=no\": it must be headers=on or headers=off in ",
        ),
        (
            limited("rate_limit_admin wirte=on;"),
            "invalid parameter \"wirte=on\", did you mean \"write=on\"? in ",
        ),
        (
            format!("{zone}\nrate_limit_log_level debug;"),
            "invalid value \"debug\" in \"rate_limit_log_level\" directive, it must be \
             \"info\", \"notice\", \"warn\" or \"error\" in ",
        ),
        (
            format!("rate_limit_sync 127.0.0.1:6379;\n{zone}"),
            "invalid Redis URL \"127.0.0.1:6379\": it must be \
             redis://[user:password@]host:port[/db] (rediss:// for TLS) in ",
        ),
        (
            format!("rate_limit_sync redis://127.0.0.1:6379 intervall=1s;\n{zone}"),
            "invalid parameter \"intervall=1s\", did you mean \"interval=\"? in ",
        ),
    ];
    let mut failures = Vec::new();
    for (http, expected) in &cases {
        let (ok, output) = check_config(&config(http));
        if ok || !output.contains("[emerg]") || !output.contains(expected) {
            failures.push(format!(
                "expected an [emerg] with {expected:?}, got:\n{output}"
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// `zone "a" is too small` gives the smallest size that works, and it is exact: nginx starts
/// and limits with that size, and refuses one KiB less with the same message.
#[test]
fn zone_too_small_gives_the_exact_minimum() {
    for params in [
        "rate=1r/s",
        "rate=5r/s burst=10 algorithm=token_bucket",
        "rate=100r/m algorithm=sliding_log",
        "rate=4096r/s algorithm=sliding_log",
        "algorithm=concurrency limit=10",
        "algorithm=concurrency limit=adaptive",
        "rate=1r/s block=1m",
        "rate=100r/m algorithm=sliding_log block=1m block_max=1h",
    ] {
        let http = |size: usize| {
            format!(
                "rate_limit_zone $binary_remote_addr zone=a:{size}k {params};\n{}",
                server("location / { rate_limit zone=a; }")
            )
        };
        let (ok, output) = check_config(&config(&http(1)));
        assert!(!ok, "{params}: a 1k zone was accepted:\n{output}");
        let minimum: usize = output
            .split_once("the minimum is ")
            .and_then(|(_, rest)| rest.split_once("k in "))
            .and_then(|(number, _)| number.parse().ok())
            .unwrap_or_else(|| panic!("{params}: no \"the minimum is Nk\" in:\n{output}"));

        let (ok, below) = check_config(&config(&http(minimum - 1)));
        assert!(!ok, "{params}: {}k was accepted:\n{below}", minimum - 1);
        assert!(
            below.contains("zone \"a\" is too small")
                && below.contains(&format!("the minimum is {minimum}k")),
            "{params}: {below}"
        );
        let nginx = Nginx::start(&config(&http(minimum)));
        assert_eq!(get(nginx.port(), "/").status, 200, "{params}: {minimum}k");
        assert!(
            !nginx.error_log().contains("[emerg]"),
            "{params}: {minimum}k: {}",
            nginx.error_log()
        );
    }
}

/// Errors found once the whole `http` block is read (a zone name nothing declares, `global=`
/// and `burst=` that do not fit the zone's algorithm) name the file and line of the
/// `rate_limit` that is wrong, as nginx's own messages do, not the `}` that closes `http`.
#[test]
fn nginx_t_names_the_line_of_the_wrong_rate_limit() {
    let token = "algorithm=token_bucket";
    // (what is wrong, http block body, the message, the text of the line it must name)
    let cases = [
        (
            "unknown zone",
            format!(
                "rate_limit_zone $binary_remote_addr zone=per_client:1m rate=1r/s;\n{}",
                server("location / {\n rate_limit zone=per_clinet;\n }")
            ),
            "unknown zone \"per_clinet\", did you mean \"per_client\"?",
            "rate_limit zone=per_clinet;",
        ),
        (
            "global= with a leaky_bucket user zone",
            format!(
                "rate_limit_zone $binary_remote_addr zone=a:1m rate=1r/s;\n\
                 rate_limit_zone global zone=pool:1m rate=1r/s {token};\n{}",
                server("location / {\n rate_limit zone=a global=pool;\n }")
            ),
            "zone \"a\" used with \"global=\" must use algorithm=token_bucket",
            "rate_limit zone=a global=pool;",
        ),
        (
            "global= naming a leaky_bucket zone",
            format!(
                "rate_limit_zone $http_x_user zone=user:1m rate=1r/s {token};\n\
                 rate_limit_zone global zone=pool:1m rate=1r/s;\n{}",
                server("location / {\n rate_limit zone=user global=pool;\n }")
            ),
            "global zone \"pool\" used with \"global=\" must use algorithm=token_bucket",
            "rate_limit zone=user global=pool;",
        ),
        (
            "burst= on a sliding_window zone",
            format!(
                "rate_limit_zone $binary_remote_addr zone=w:1m rate=1r/s algorithm=sliding_window;\n{}",
                server("location / {\n rate_limit zone=w burst=5;\n }")
            ),
            "\"burst\" is not used by sliding_window",
            "rate_limit zone=w burst=5;",
        ),
    ];
    for (what, http, message, wrong_line) in cases {
        let config = config(&http);
        // Placeholders are replaced within their line, so line numbers are the template's.
        let line = 1 + config
            .lines()
            .position(|text| text.trim() == wrong_line)
            .unwrap_or_else(|| panic!("{what}: no line {wrong_line:?} in the test config"));
        let (ok, output) = check_config(&config);
        assert!(!ok, "{what}: nginx -t accepted it:\n{output}");
        let emerg = output
            .lines()
            .find(|text| text.contains("[emerg]"))
            .unwrap_or_else(|| panic!("{what}: no [emerg] in:\n{output}"));
        assert!(emerg.contains(message), "{what}: {emerg}");
        assert!(
            emerg.ends_with(&format!("/nginx.conf:{line}")),
            "{what}: the message must end with nginx.conf:{line}, the line of {wrong_line:?}: {emerg}"
        );
    }
}

/// `rate_limit` in http applies to every location without one of its own; a server or a
/// location that has its own uses only its own (as limit_req).
#[test]
fn rate_limit_is_inherited_until_a_level_has_its_own() {
    let nginx = Nginx::start(&config(&format!(
        "rate_limit_zone $binary_remote_addr zone=top:1m rate=1r/m;\n\
         rate_limit_zone $binary_remote_addr zone=own:1m rate=1r/m burst=2;\n\
         rate_limit_zone $binary_remote_addr zone=srv:1m rate=1r/m burst=1;\n\
         rate_limit zone=top;\n\
         {}\
         server {{\n\
             listen 127.0.0.1:%%PORT2%%;\n\
             root html;\n\
             rate_limit zone=srv nodelay;\n\
             location / {{ }}\n\
         }}\n",
        server(
            "location /inherit/ { }\n\
             location /own/ { rate_limit zone=own nodelay; }"
        )
    )));
    for dir in ["inherit", "own"] {
        nginx.write_file(&format!("html/{dir}/index.html"), "ok\n");
    }

    // /inherit/ is limited by `top` alone: one request a minute.
    let mut connection = Connection::open(nginx.port());
    let first = connection.get("/inherit/index.html");
    let second = connection.get("/inherit/index.html");
    assert_eq!((first.status, second.status), (200, 429), "{second:?}");
    assert_eq!(policy(&first), "\"top\";q=1;w=60");

    // /own/ has its own limit, which replaces `top` (exhausted above): 1 + burst 2 pass.
    let statuses: Vec<u16> = (0..4)
        .map(|_| {
            let response = connection.get("/own/index.html");
            assert_eq!(policy(&response), "\"own\";q=1;w=60", "{response:?}");
            response.status
        })
        .collect();
    assert_eq!(statuses, [200, 200, 200, 429]);

    // The second server's own `rate_limit` replaces http's too: 1 + burst 1 pass.
    let mut connection = Connection::open(nginx.port_n(2));
    let statuses: Vec<u16> = (0..3)
        .map(|_| {
            let response = connection.get("/index.html");
            assert_eq!(policy(&response), "\"srv\";q=1;w=60", "{response:?}");
            response.status
        })
        .collect();
    assert_eq!(statuses, [200, 200, 429]);
}

/// `rate_limit_status` sets the rejection code, default 429, inherited like the limits.
#[test]
fn rate_limit_status_sets_the_rejection_code() {
    let nginx = Nginx::start(&config(&format!(
        "rate_limit_zone $uri zone=one:1m rate=1r/m;\n\
         rate_limit zone=one;\n\
         {}\
         server {{\n\
             listen 127.0.0.1:%%PORT2%%;\n\
             root html;\n\
             rate_limit_status 503;\n\
             location /inherited/ {{ }}\n\
             location /own/ {{ rate_limit_status 418; }}\n\
         }}\n",
        server("location /default/ { }")
    )));
    for dir in ["default", "inherited", "own"] {
        nginx.write_file(&format!("html/{dir}/index.html"), "ok\n");
    }
    for (port, path, expected) in [
        (nginx.port(), "/default/index.html", 429),
        (nginx.port_n(2), "/inherited/index.html", 503),
        (nginx.port_n(2), "/own/index.html", 418),
    ] {
        let mut connection = Connection::open(port);
        let first = connection.get(path);
        let second = connection.get(path);
        assert_eq!(first.status, 200, "{path}: {first:?}");
        assert_eq!(second.status, expected, "{path}: {second:?}");
        assert!(
            second.header("Retry-After").is_some(),
            "{path}: no Retry-After: {second:?}"
        );
    }
}

/// Each location rejects and delays one request; the log lines are at `rate_limit_log_level`
/// (default error) and delays one level below it (info stays info), as limit_req's.
#[test]
fn log_lines_use_the_configured_level_and_one_below_for_delays() {
    // (zone and location name, directive, rejection level, delay level)
    let levels = [
        ("default", "", "error", "warn"),
        ("error", "rate_limit_log_level error;", "error", "warn"),
        ("warn", "rate_limit_log_level warn;", "warn", "notice"),
        ("notice", "rate_limit_log_level notice;", "notice", "info"),
        ("info", "rate_limit_log_level info;", "info", "info"),
    ];
    let mut http = String::new();
    let mut locations = String::new();
    for (name, directive, _, _) in levels {
        // 5r/s with burst=1: the second request waits 200 ms, a third one meanwhile is
        // rejected.
        http.push_str(&format!(
            "rate_limit_zone $uri zone={name}:1m rate=5r/s burst=1;\n"
        ));
        locations.push_str(&format!(
            "location /{name}/ {{ rate_limit zone={name}; {directive} }}\n"
        ));
    }
    http.push_str(&server(&locations));
    let nginx = Nginx::start(&config(&http));

    for (name, _, _, _) in levels {
        let path = format!("/{name}/index.html");
        nginx.write_file(&format!("html{path}"), "ok\n");
        assert_eq!(get(nginx.port(), &path).status, 200);
        // Sent within a few milliseconds of each other, far inside the 200 ms interval.
        let delayed = start_request(nginx.port(), &Request::get(&path));
        let rejected = get(nginx.port(), &path);
        let delayed = delayed.finish();
        assert_eq!(
            (delayed.status, rejected.status),
            (200, 429),
            "{path}: {delayed:?}"
        );
    }

    let log = nginx.error_log();
    // The excess is exact (about 1 and 2 here), not limit_req's whole thousandths.
    let line = |start: &str, end: &str| -> &str {
        let needle = format!("{start} ... {end}");
        let mut lines = log
            .lines()
            .filter(|line| line.contains(start) && line.contains(end));
        let found = lines
            .next()
            .unwrap_or_else(|| panic!("no line with {needle:?} in the error log:\n{log}"));
        assert!(
            lines.next().is_none(),
            "more than one line with {needle:?}:\n{log}"
        );
        found
    };
    for (name, _, reject_level, delay_level) in levels {
        let reject = line(
            "limiting requests, excess: ",
            &format!(" by zone \"{name}\""),
        );
        assert!(
            reject.contains(&format!(" [{reject_level}] ")),
            "zone {name}: rejection not at {reject_level}: {reject}"
        );
        let delay = line(
            "delaying request, excess: ",
            &format!(", by zone \"{name}\""),
        );
        assert!(
            delay.contains(&format!(" [{delay_level}] ")),
            "zone {name}: delay not at {delay_level}: {delay}"
        );
    }
}

/// With the error log at `error`, a `warn` level hides both lines, `error` shows the rejection
/// only: the levels are real nginx levels, filtered by `error_log`.
#[test]
fn error_log_level_filters_the_lines() {
    let nginx = Nginx::start(
        &config(&format!(
            "rate_limit_zone $uri zone=quiet:1m rate=5r/s burst=1;\n\
             rate_limit_zone $uri zone=loud:1m rate=5r/s burst=1;\n{}",
            server(
                "location /quiet/ { rate_limit zone=quiet; rate_limit_log_level warn; }\n\
                 location /loud/ { rate_limit zone=loud; }"
            )
        ))
        .replace(
            "error_log logs/error.log info;",
            "error_log logs/error.log error;",
        ),
    );
    for name in ["quiet", "loud"] {
        let path = format!("/{name}/index.html");
        nginx.write_file(&format!("html{path}"), "ok\n");
        assert_eq!(get(nginx.port(), &path).status, 200);
        let delayed = start_request(nginx.port(), &Request::get(&path));
        assert_eq!(get(nginx.port(), &path).status, 429);
        assert_eq!(delayed.finish().status, 200);
    }
    let log = nginx.error_log();
    assert!(
        log.lines()
            .any(|line| line.contains("limiting requests, excess: ")
                && line.contains(" by zone \"loud\"")),
        "{log}"
    );
    for hidden in ["by zone \"quiet\"", "delaying request"] {
        assert!(!log.contains(hidden), "{hidden:?} logged:\n{log}");
    }
}

/// A key of one `$arg_NAME` is read from the query string by the module itself (not through
/// nginx's variable API): it must be the value nginx's own `$arg_NAME` has, which each
/// response echoes. A value `set` on the variable, or a `map` defining a variable of that
/// name, must win as it does in nginx.
#[test]
fn arg_keys_are_the_values_nginx_gives_arg_variables() {
    let nginx = Nginx::start(&config(&format!(
        "rate_limit_zone $arg_k zone=args:1m rate=1r/m;\n\
         rate_limit_zone $arg_m zone=mapped:1m rate=1r/m;\n\
         map $uri $arg_m {{ default from-map; }}\n\
         {}",
        server(
            "add_header X-Arg \"[$arg_k]\" always;\n\
             location /q/ { rate_limit zone=args; }\n\
             location /set/ { set $arg_k assigned; rate_limit zone=args; }\n\
             location /map/ { add_header X-Arg \"[$arg_m]\" always; rate_limit zone=mapped; }"
        )
    )));
    for dir in ["q", "set", "map"] {
        nginx.write_file(&format!("html/{dir}/index.html"), "ok\n");
    }
    // (query string, the value of $arg_k): every value a key used by no other case.
    let cases = [
        ("k=c1", "c1"),
        ("K=c2", "c2"),
        ("a=0&k=c3&k=zz", "c3"),
        ("kk=zz&k=c4", "c4"),
        ("xk=zz&k=c5", "c5"),
        ("k=c6&", "c6"),
        ("&k=c7", "c7"),
        ("k=c8%20x", "c8%20x"),
        ("k==c9", "=c9"),
        ("k=c10;k=zz", "c10;k=zz"),
        ("k&k=c11", "c11"),
        ("k", ""),
        ("k=", ""),
        ("", ""),
        ("kx=1", ""),
        ("x=k=1", ""),
    ];
    for (query, value) in cases {
        let path = format!("/q/index.html?{query}");
        let first = get(nginx.port(), &path);
        assert_eq!(first.status, 200, "{path}: {first:?}");
        assert_eq!(
            first.header("X-Arg"),
            Some(format!("[{value}]").as_str()),
            "{path}: nginx's $arg_k"
        );
        if value.is_empty() {
            // No key: never limited.
            let again = get(nginx.port(), &path);
            assert_eq!(again.status, 200, "{path} again: {again:?}");
        } else {
            // The first request was charged to the key `value`, whose one request per
            // minute is now taken.
            let same_key = get(nginx.port(), &format!("/q/index.html?k={value}"));
            assert_eq!(
                same_key.status, 429,
                "{path}, then ?k={value}: {same_key:?}"
            );
        }
    }
    for (dir, arg, echoed) in [("set", "k", "[assigned]"), ("map", "m", "[from-map]")] {
        let first = get(nginx.port(), &format!("/{dir}/index.html?{arg}=one"));
        let second = get(nginx.port(), &format!("/{dir}/index.html?{arg}=two"));
        assert_eq!(first.header("X-Arg"), Some(echoed), "/{dir}/: {first:?}");
        assert_eq!(
            (first.status, second.status),
            (200, 429),
            "/{dir}/: both requests have the key {echoed}"
        );
    }
}
