//! `$rate_limit_api_key`: the caller's credential as a key. The spellings of one credential
//! (`Authorization: Bearer` in any case and blanks, `x-api-key`, `x-goog-api-key`, `?key=`)
//! share one budget, and the secret itself shows nowhere: not in the admin API's answers,
//! the dashboard, the metrics, the top keys, the state file nor the logs, which show and take
//! its fingerprint (`sk-...XYZ~` and 16 hex digits).

mod common;

use common::llm::FakeLlm;
use common::{config, send, Nginx, Request, Response};
use serde_json::Value;

/// The credential every test spells; its middle is looked for too (a partial leak).
const SECRET: &str = "sk-test-SECRETsecret0123456789XYZ";
const SECRET_MIDDLE: &str = "SECRETsecret0123456789";

/// Zone `keys` (1r/m, burst 2, `block=1h`) on `/`, zone `tokens` (a token bucket of 1000
/// tokens, `usage=openai`) on `/v1/` in front of `llm`, both keyed by the credential; the
/// admin API, a state file, an access log with the key, rejections logged at `info`.
fn start(llm: &FakeLlm) -> Nginx {
    let port = llm.port();
    let nginx = config()
        .main("user root;")
        .error_log("info")
        .http(
            "rate_limit_state_file state.json;\n\
             rate_limit_zone $rate_limit_api_key zone=keys:1m rate=1r/m burst=2 block=1h;\n\
             rate_limit_zone $rate_limit_api_key zone=tokens:1m rate=1r/m burst=1000 \
             algorithm=token_bucket;",
        )
        .access_log(
            "log_format keyed '$remote_addr [$time_local] \"$request\" $status \
             key=\"$rate_limit_api_key\" $rate_limit_status';\n\
             access_log logs/access.log keyed;",
        )
        .locations(&format!(
            "location / {{ rate_limit zone=keys nodelay; rate_limit_log_level info;
                 alias html/; }}
             location /v1/ {{ rate_limit zone=tokens usage=openai reserve=100;
                 proxy_pass http://127.0.0.1:{port}; }}
             location /ratelimit/ {{ rate_limit_admin write=on; }}
             location = /key {{ return 200 \"$rate_limit_api_key\"; }}"
        ))
        .start();
    nginx.write_file("html/index.html", "ok\n");
    nginx
}

/// Seven spellings of [`SECRET`] in headers.
fn spellings() -> Vec<Request> {
    let get = || Request::get("/index.html");
    vec![
        get().header("Authorization", &format!("Bearer {SECRET}")),
        get().header("Authorization", &format!("bearer {SECRET}")),
        get().header("Authorization", &format!("BEARER   {SECRET}")),
        get().header("Authorization", &format!("Bearer\t{SECRET}")),
        get().header("Authorization", &format!("bEaReR \t{SECRET} \t")),
        get().header("x-api-key", SECRET),
        get().header("X-Goog-Api-Key", &format!(" {SECRET}")),
    ]
}

fn admin(nginx: &Nginx, method: &str, path: &str, body: Option<&str>) -> (u16, Value, String) {
    let request = Request::new(method, &format!("/ratelimit/{path}"));
    let request = match body {
        Some(body) => request.json(body),
        None => request,
    };
    let response = send(nginx.port(), &request);
    let text = response.text();
    let json = serde_json::from_slice(&response.body).unwrap_or(Value::Null);
    (response.status, json, text)
}

fn assert_no_secret(what: &str, text: &str) {
    assert!(
        !text.contains(SECRET) && !text.contains(SECRET_MIDDLE),
        "the secret is in {what}:\n{text}"
    );
}

/// The fingerprint of [`SECRET`], as `/key` answers it.
fn fingerprint(nginx: &Nginx, request: Request) -> String {
    let response: Response = send(nginx.port(), &request);
    assert_eq!(response.status, 200);
    response.text()
}

#[test]
fn seven_spellings_share_one_budget_and_the_secret_shows_nowhere() {
    let llm = FakeLlm::start();
    let nginx = start(&llm);
    let shown = fingerprint(
        &nginx,
        Request::get("/key").header("Authorization", &format!("Bearer {SECRET}")),
    );
    assert!(shown.starts_with("sk-...XYZ~"), "{shown}");
    assert_eq!(shown.len(), "sk-...XYZ~".len() + 16, "{shown}");

    // Burst 2: three requests pass, whatever the spelling; the fourth is rejected, and blocks
    // the key for an hour.
    let statuses: Vec<u16> = spellings()
        .iter()
        .map(|request| send(nginx.port(), request).status)
        .collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429, 429]);
    // Another credential, and no credential at all, have budgets of their own.
    let other = Request::get("/index.html").header("Authorization", "Bearer sk-other-key");
    assert_eq!(send(nginx.port(), &other).status, 200);
    assert_eq!(send(nginx.port(), &Request::get("/index.html")).status, 200);

    // A usage-based zone: the tokens of the key are counted under its fingerprint.
    let chat = Request::new("POST", "/v1/chat/completions?prompt=20&completion=30")
        .header("x-api-key", SECRET)
        .json(r#"{"model":"fake","messages":[]}"#);
    assert_eq!(send(nginx.port(), &chat).status, 200);

    // The admin API finds the key by its fingerprint, and answers with it.
    let path = format!("zones/keys/keys/{shown}");
    let (status, key, text) = admin(&nginx, "GET", &path, None);
    assert_eq!(status, 200, "{text}");
    assert_eq!(key["key"], shown.as_str());
    let (status, blocked, text) = admin(&nginx, "GET", "zones/keys/blocked", None);
    assert_eq!(status, 200, "{text}");
    assert!(text.contains(&shown), "{blocked}");
    let (status, top, text) = admin(&nginx, "GET", "zones/keys/top", None);
    assert_eq!(status, 200, "{text}");
    assert_eq!(top["keys"][0]["key"], shown.as_str(), "{top}");
    // Overrides and blocks take it: written to the state file too.
    let (status, _, text) = admin(
        &nginx,
        "PUT",
        &format!("zones/keys/overrides/{shown}"),
        Some(r#"{"rate": "9r/s", "burst": 5}"#),
    );
    assert!(status == 201, "{status} {text}");
    let (status, _, text) = admin(
        &nginx,
        "DELETE",
        &format!("zones/keys/blocked/{shown}"),
        None,
    );
    assert_eq!(status, 204, "{text}");
    let mut answers = String::new();
    for path in [
        "",
        "zones",
        "zones/keys",
        "zones/keys/overrides",
        "zones/keys/top?by=blocked",
        "zones/tokens",
        "metrics",
    ] {
        let (status, _, text) = admin(&nginx, "GET", path, None);
        assert_eq!(status, 200, "{path}: {text}");
        answers.push_str(&text);
    }
    // Settled in the log phase: the top keys by tokens show the fingerprint once it is.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (_, top, text) = admin(&nginx, "GET", "zones/tokens/top?by=tokens", None);
        if top["keys"][0]["key"] == shown.as_str() {
            answers.push_str(&text);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{text}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // The dashboard's page, as a browser asks for it.
    let dashboard = send(
        nginx.port(),
        &Request::get("/ratelimit/").header("Accept", "text/html"),
    );
    assert_eq!(dashboard.status, 200);
    answers.push_str(&dashboard.text());
    assert_no_secret("the admin API's answers", &answers);

    // Forgotten, the key starts afresh under its override (burst 5), whatever the spelling.
    let (status, _, text) = admin(&nginx, "DELETE", &format!("zones/keys/keys/{shown}"), None);
    assert_eq!(status, 204, "{text}");
    let statuses: Vec<u16> = spellings()
        .iter()
        .map(|request| send(nginx.port(), request).status)
        .collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 200, 429]);

    let read = |name: &str| std::fs::read_to_string(nginx.prefix().join(name)).expect(name);
    let state = read("state.json");
    assert!(state.contains(&shown), "{state}");
    assert_no_secret("the state file", &state);
    let access_log = read("logs/access.log");
    let error_log = nginx.error_log();
    assert!(
        access_log.contains(&format!("key=\"{shown}\" REJECTED")),
        "{access_log}"
    );
    assert_no_secret("the access log", &access_log);
    assert!(error_log.contains("limiting requests"), "{error_log}");
    assert_no_secret("the error log", &error_log);
}

/// `?key=` (Gemini's), percent-encoded or not, is the same credential as the headers'; a
/// header wins over the query; `Basic` is no bearer token.
#[test]
fn the_query_argument_and_which_source_wins() {
    let llm = FakeLlm::start();
    let nginx = start(&llm);
    let key = |request: Request| fingerprint(&nginx, request);
    let shown = key(Request::get("/key").header("x-api-key", SECRET));
    assert_eq!(
        key(Request::get(&format!("/key?alt=sse&key={SECRET}"))),
        shown
    );
    let encoded = SECRET.replace('-', "%2D").replace('S', "%53");
    assert_eq!(key(Request::get(&format!("/key?key={encoded}"))), shown);
    assert_eq!(
        key(Request::get("/key?key=sk-other").header("Authorization", &format!("Bearer {SECRET}"))),
        shown
    );
    assert_eq!(
        key(Request::get("/key")
            .header("Authorization", "Basic dXNlcjpwYXNz")
            .header("x-goog-api-key", SECRET)),
        shown
    );
    // No credential: empty.
    assert_eq!(key(Request::get("/key?monkey=1")), "");
    assert_eq!(
        key(Request::get("/key").header("Authorization", "Bearer ")),
        ""
    );
    // A short credential shows none of its characters.
    let short = key(Request::get("/key").header("x-api-key", "hunter2"));
    assert!(
        short.starts_with("...~") && !short.contains("hun"),
        "{short}"
    );
    let statuses: Vec<u16> = (0..4)
        .map(|_| {
            send(
                nginx.port(),
                &Request::get(&format!("/index.html?key={SECRET}")),
            )
            .status
        })
        .collect();
    assert_eq!(statuses, [200, 200, 200, 429]);
    let (_, top, _) = admin(&nginx, "GET", "zones/keys/top", None);
    assert_eq!(top["keys"][0]["key"], shown.as_str(), "{top}");
}
