//! `$rate_limit_api_key`: the caller's credential as a key, read where the location's
//! provider takes it (its `usage=` line): OpenAI's `Authorization: Bearer`, Anthropic's
//! `x-api-key`, Gemini's `x-goog-api-key` or `?key=`, Azure OpenAI's `api-key`. Whatever
//! other providers' headers a client adds, junk or not, one credential has one budget per
//! provider; copies that disagree are one key of their own. The secret itself shows nowhere:
//! not in the admin API's answers, the dashboard's data, the metrics, the top keys, the state
//! file nor the logs, which show and take its fingerprint (`sk-...XYZ~` and 16 hex digits).

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::llm::FakeLlm;
use common::{check_config, config, send, Nginx, Request, Response};
use serde_json::Value;

/// The credential the single-location tests spell; its middle is looked for too.
const SECRET: &str = "sk-test-SECRETsecret0123456789XYZ";

/// One credential per provider, shaped as each issues them.
const OPENAI: &str = "sk-proj-OPENAIsecret0123456789abcXYZ";
const ANTHROPIC: &str = "sk-ant-api03-ANTHROPICsecret0123456789-AAA";
const GEMINI: &str = "AIzaSyGEMINIsecret0123456789abcdefGHI";
const AZURE: &str = "0a1b2c3d4e5f6a7b8c9dAZUREsecret99";

/// The four providers, as this test sends to each.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Provider {
    OpenAi,
    Anthropic,
    Gemini,
    Azure,
}

/// The places a credential may be in, other than a provider's own.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Place {
    Authorization,
    XApiKey,
    XGoogApiKey,
    ApiKey,
    QueryKey,
}

const PLACES: [Place; 5] = [
    Place::Authorization,
    Place::XApiKey,
    Place::XGoogApiKey,
    Place::ApiKey,
    Place::QueryKey,
];

const PROVIDERS: [Provider; 4] = [
    Provider::OpenAi,
    Provider::Anthropic,
    Provider::Gemini,
    Provider::Azure,
];

impl Provider {
    fn name(self) -> &'static str {
        match self {
            Provider::OpenAi => "openai",
            Provider::Anthropic => "anthropic",
            Provider::Gemini => "gemini",
            Provider::Azure => "azure",
        }
    }

    fn secret(self) -> &'static str {
        match self {
            Provider::OpenAi => OPENAI,
            Provider::Anthropic => ANTHROPIC,
            Provider::Gemini => GEMINI,
            Provider::Azure => AZURE,
        }
    }

    /// The provider's own places.
    fn own(self) -> &'static [Place] {
        match self {
            Provider::OpenAi => &[Place::Authorization],
            Provider::Anthropic => &[Place::XApiKey],
            Provider::Gemini => &[Place::XGoogApiKey, Place::QueryKey],
            Provider::Azure => &[Place::ApiKey],
        }
    }

    /// A request of the provider's API through its location, `query` appended.
    fn request(self, query: &str) -> Request {
        let prefix = format!("/{}", self.name());
        let (path, body) = match self {
            Provider::OpenAi => (
                "/v1/chat/completions?prompt=40&completion=60".to_string(),
                r#"{"model":"fake","messages":[{"role":"user","content":"hi"}]}"#,
            ),
            Provider::Anthropic => (
                "/v1/messages?prompt=40&completion=60".to_string(),
                r#"{"model":"claude","max_tokens":60,"messages":[]}"#,
            ),
            Provider::Gemini => (
                "/v1beta/models/gemini-pro:generateContent?prompt=40&completion=60".to_string(),
                r#"{"contents":[{"parts":[{"text":"hi"}]}]}"#,
            ),
            Provider::Azure => (
                "/openai/deployments/gpt/chat/completions?api-version=2024-10-21&prompt=40\
                 &completion=60"
                    .to_string(),
                r#"{"messages":[{"role":"user","content":"hi"}]}"#,
            ),
        };
        Request::new("POST", &format!("{prefix}{path}{query}")).json(body)
    }
}

/// `request` with `value` in `place`.
fn put(request: Request, place: Place, value: &str) -> Request {
    match place {
        Place::Authorization => request.header("Authorization", &format!("Bearer {value}")),
        Place::XApiKey => request.header("x-api-key", value),
        Place::XGoogApiKey => request.header("x-goog-api-key", value),
        Place::ApiKey => request.header("api-key", value),
        Place::QueryKey => {
            let mut request = request;
            request.path.push_str(&format!("&key={value}"));
            request
        }
    }
}

/// A junk credential no request has sent before.
fn junk() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "junk-{}-{nanos}-{}-abcdefghijklmnop",
        NEXT.fetch_add(1, Ordering::Relaxed),
        std::process::id()
    )
}

/// One token zone per provider (1,000 tokens that do not come back during a test, the key
/// `$rate_limit_api_key`), a location per provider reading its usage (`reserve=100`; the fake
/// upstream reports 100) and answering its key in `X-Key`; `/plain/` names no provider;
/// `/gemini-key/` keys by `$rate_limit_api_key_gemini`; the admin API and a state file.
fn start_providers(llm: &FakeLlm) -> Nginx {
    let port = llm.port();
    let mut http = String::from("rate_limit_state_file state.json;\n");
    let mut locations = String::new();
    for provider in PROVIDERS {
        let name = provider.name();
        http.push_str(&format!(
            "rate_limit_zone $rate_limit_api_key zone={name}:1m rate=1r/m burst=1000 \
             algorithm=token_bucket;\n"
        ));
        locations.push_str(&format!(
            "location /{name}/ {{ rate_limit zone={name} usage={name} reserve=100;
                 add_header X-Key $rate_limit_api_key always;
                 proxy_pass http://127.0.0.1:{port}/; }}\n"
        ));
    }
    http.push_str(
        "rate_limit_zone $rate_limit_api_key zone=plain:1m rate=1r/m burst=2;\n\
         rate_limit_zone $rate_limit_api_key_gemini zone=gemini_key:1m rate=1r/m burst=2;\n",
    );
    locations.push_str(
        "location /plain/ { rate_limit zone=plain nodelay;
             add_header X-Key $rate_limit_api_key always; alias html/; }
         location /gemini-key/ { rate_limit zone=gemini_key nodelay;
             add_header X-Key $rate_limit_api_key_gemini always; alias html/; }
         location /ratelimit/ { rate_limit_admin; }",
    );
    let nginx = config()
        .main("user root;")
        .http(&http)
        .locations(&locations)
        .start();
    nginx.write_file("html/index.html", "ok\n");
    nginx
}

/// Every subset of `places`, as bit sets.
fn subsets(places: &[Place]) -> impl Iterator<Item = Vec<Place>> + '_ {
    (0..1u32 << places.len()).map(move |bits| {
        places
            .iter()
            .enumerate()
            .filter(|(at, _)| bits & (1 << at) != 0)
            .map(|(_, place)| *place)
            .collect()
    })
}

/// The issue's "done when": for each provider, its credential sent with every subset of the
/// other providers' places, each holding junk that changes on every request, before or after
/// its own, is one key: 10 requests of 100 tokens pass on its 1,000, the rest are refused.
#[test]
fn one_credential_with_any_other_providers_headers_shares_one_budget_per_provider() {
    let llm = FakeLlm::start();
    let nginx = start_providers(&llm);
    for provider in PROVIDERS {
        let others: Vec<Place> = PLACES
            .into_iter()
            .filter(|place| !provider.own().contains(place))
            .collect();
        let mut statuses = Vec::new();
        let mut keys = Vec::new();
        let mut sent = 0;
        for (round, extra) in subsets(&others).enumerate() {
            // Gemini's two places in turn; the others' one.
            for &own in provider.own() {
                let mut request = provider.request("");
                if round % 2 == 0 {
                    request = put(request, own, provider.secret());
                }
                for &place in &extra {
                    request = put(request, place, &junk());
                }
                if round % 2 == 1 {
                    request = put(request, own, provider.secret());
                }
                let response = send(nginx.port(), &request);
                statuses.push(response.status);
                keys.push(response.header("X-Key").unwrap_or("").to_string());
                sent += 1;
            }
        }
        assert_eq!(sent, 16, "{provider:?}");
        let passed = statuses.iter().filter(|&&status| status == 200).count();
        assert_eq!(passed, 10, "{provider:?}: {statuses:?} {keys:?}");
        assert!(statuses[10..].iter().all(|&s| s == 429), "{statuses:?}");
        let first = &keys[0];
        let (_, hash) = first.split_once('~').unwrap_or_else(|| panic!("{first}"));
        assert!(
            hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()),
            "{first}"
        );
        assert!(
            keys.iter().all(|key| key == first),
            "{provider:?}: {keys:?}"
        );
        let secret = provider.secret();
        let shown = format!("{}...{}~", &secret[..3], &secret[secret.len() - 3..]);
        assert!(first.starts_with(&shown), "{first}");
    }
    // Each budget is the provider's: the four keys are four zones' one key each.
    for provider in PROVIDERS {
        let zone = admin_json(&nginx, &format!("zones/{}", provider.name()));
        assert_eq!(zone["keys"], 1, "{zone}");
    }
}

fn admin_json(nginx: &Nginx, path: &str) -> Value {
    let response = send(nginx.port(), &Request::get(&format!("/ratelimit/{path}")));
    serde_json::from_slice(&response.body).unwrap_or(Value::Null)
}

fn key_of(nginx: &Nginx, request: Request) -> String {
    let response = send(nginx.port(), &request);
    assert!(
        [200, 429].contains(&response.status),
        "{}: {}",
        response.status,
        response.text()
    );
    response.header("X-Key").unwrap_or("").to_string()
}

/// Copies of the places a provider reads that disagree are one key of their own; OAuth-style
/// bearer tokens stand in where a provider's own places are empty; another provider's
/// credential alone is none; a location that names no provider reads every place.
#[test]
fn conflicts_fallbacks_and_a_location_without_a_provider() {
    let llm = FakeLlm::start();
    let nginx = start_providers(&llm);
    let key = |request: Request| key_of(&nginx, request);
    let gemini = key(put(
        Provider::Gemini.request(""),
        Place::XGoogApiKey,
        GEMINI,
    ));
    assert!(gemini.starts_with("AIz...GHI~"), "{gemini}");
    // Both Gemini places: the same key agrees, two keys conflict.
    let both = put(Provider::Gemini.request(""), Place::XGoogApiKey, GEMINI);
    assert_eq!(key(put(both.clone(), Place::QueryKey, GEMINI)), gemini);
    assert_eq!(
        key(put(both, Place::QueryKey, &junk())),
        "conflicting-credentials"
    );
    // Two x-api-key headers for Anthropic conflict; the same one twice does not.
    let anthropic = key(put(
        Provider::Anthropic.request(""),
        Place::XApiKey,
        ANTHROPIC,
    ));
    let twice = Provider::Anthropic
        .request("")
        .header("x-api-key", ANTHROPIC)
        .header("X-Api-Key", &format!(" {ANTHROPIC}\t"));
    assert_eq!(key(twice), anthropic);
    let two = put(
        put(Provider::Anthropic.request(""), Place::XApiKey, ANTHROPIC),
        Place::XApiKey,
        &junk(),
    );
    assert_eq!(key(two), "conflicting-credentials");
    // Two Authorization headers: nginx 1.23 and later refuse the request itself (400); an
    // older nginx passes them, and two tokens conflict.
    let openai = key(put(
        Provider::OpenAi.request(""),
        Place::Authorization,
        OPENAI,
    ));
    let two = put(
        put(Provider::OpenAi.request(""), Place::Authorization, OPENAI),
        Place::Authorization,
        &junk(),
    );
    let response = send(nginx.port(), &two);
    assert!(
        response.status == 400 || response.header("X-Key") == Some("conflicting-credentials"),
        "{} {:?}",
        response.status,
        response.header("X-Key")
    );
    // Gemini, Anthropic and Azure take a bearer token when their own places are empty.
    for provider in [Provider::Anthropic, Provider::Gemini, Provider::Azure] {
        let bearer = key(put(provider.request(""), Place::Authorization, OPENAI));
        assert_eq!(bearer, openai, "{provider:?}");
    }
    // OpenAI does not take another provider's key: no credential, an empty key.
    let request = put(Provider::OpenAi.request(""), Place::XApiKey, ANTHROPIC);
    assert_eq!(key(put(request, Place::XGoogApiKey, GEMINI)), "");

    // No provider named: every place, which must agree.
    let plain = || Request::get("/plain/index.html");
    let shown = key(put(plain(), Place::XApiKey, SECRET));
    assert!(shown.starts_with("sk-...XYZ~"), "{shown}");
    for place in [Place::Authorization, Place::XGoogApiKey, Place::ApiKey] {
        assert_eq!(key(put(plain(), place, SECRET)), shown, "{place:?}");
    }
    let plain_query = Request::get(&format!("/plain/index.html?key={SECRET}"));
    assert_eq!(key(plain_query), shown);
    let agreeing = put(
        put(plain(), Place::Authorization, SECRET),
        Place::ApiKey,
        SECRET,
    );
    assert_eq!(key(agreeing), shown);
    let disagreeing = put(
        put(plain(), Place::Authorization, SECRET),
        Place::ApiKey,
        &junk(),
    );
    assert_eq!(key(disagreeing), "conflicting-credentials");
    // $rate_limit_api_key_gemini reads Gemini's places wherever it is used.
    let junked = put(
        put(
            Request::get("/gemini-key/index.html"),
            Place::XApiKey,
            &junk(),
        ),
        Place::XGoogApiKey,
        GEMINI,
    );
    assert_eq!(key(junked), gemini);
}

/// Two providers in one location are refused: the credential is read for one.
#[test]
fn nginx_t_refuses_two_providers_in_one_location() {
    let text = config()
        .http(
            "rate_limit_zone $rate_limit_api_key zone=a:1m rate=1r/m burst=100 \
             algorithm=token_bucket;\n\
             rate_limit_zone $rate_limit_api_key zone=b:1m rate=1r/m burst=100 \
             algorithm=token_bucket;",
        )
        .locations(
            "location / { rate_limit zone=a usage=openai; rate_limit zone=b usage=azure;
                 proxy_pass http://127.0.0.1:1; }",
        )
        .build();
    let (ok, output) = check_config(&text);
    assert!(!ok, "{output}");
    assert!(
        output.contains(
            "\"usage=azure\" and \"usage=openai\" in one location: the response is read, and \
             the caller's credential taken, for one provider"
        ),
        "{output}"
    );
}

/// Zone `keys` (1r/m, burst 2, `block=1h`, top keys) on `/`, a token zone per provider, the
/// admin API, a state file, an access log with the key and an llm.conf-style one with the
/// usage, the error log at `level`, rejections logged at `info`.
fn start_llm(llm: &FakeLlm, level: &'static str) -> Nginx {
    let port = llm.port();
    let mut http = String::from(
        "rate_limit_state_file state.json;\n\
         rate_limit_zone $rate_limit_api_key zone=keys:1m rate=1r/m burst=2 block=1h;\n",
    );
    let mut locations = String::from(
        "location / { rate_limit zone=keys nodelay; rate_limit_log_level info; alias html/; }
         location /ratelimit/ { rate_limit_admin write=on; }\n",
    );
    for provider in PROVIDERS {
        let name = provider.name();
        http.push_str(&format!(
            "rate_limit_zone $rate_limit_api_key zone={name}:10m rate=1r/m burst=300 \
             algorithm=token_bucket;\n"
        ));
        locations.push_str(&format!(
            "location /{name}/ {{ if ($rate_limit_api_key = \"\") {{ return 401; }}
                 rate_limit zone={name} usage={name} reserve=auto:100;
                 rate_limit_log_level info; rate_limit_openai_headers on;
                 proxy_pass http://127.0.0.1:{port}/; proxy_set_header Accept-Encoding \"\";
                 proxy_buffering off; access_log logs/llm.log llm; }}\n"
        ));
    }
    let nginx = config()
        .main("user root;")
        .error_log(level)
        .http(&http)
        .access_log(
            "log_format keyed '$remote_addr [$time_local] \"$request_method $uri\" $status \
             key=\"$rate_limit_api_key\" $rate_limit_status';\n\
             log_format llm '$remote_addr [$time_local] \"$request_method $uri\" $status \
             key=$rate_limit_api_key prompt=$rate_limit_usage_prompt_tokens \
             completion=$rate_limit_usage_completion_tokens cost=$rate_limit_usage_cost';\n\
             access_log logs/access.log keyed;",
        )
        .locations(&locations)
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

/// `bytes` in base64, with `alphabet`'s last two characters, padded or not.
fn base64(bytes: &[u8], alphabet_end: &str, pad: bool) -> String {
    let alphabet: Vec<u8> =
        format!("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789{alphabet_end}")
            .into_bytes();
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let word = chunk.iter().enumerate().fold(0u32, |word, (at, &byte)| {
            word | u32::from(byte) << (16 - 8 * at)
        });
        for at in 0..=chunk.len() {
            out.push(alphabet[(word >> (18 - 6 * at) & 63) as usize] as char);
        }
        if pad {
            out.push_str(&"=".repeat(3 - chunk.len()));
        }
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// What a leak of `secret` may look like: itself, its middle, a prefix or suffix of 8 or more
/// characters (its fingerprint shows 3 of each), its base64 (in every alphabet and any
/// alignment of the bytes around it: `Basic` credentials, JWT parts), hex, percent-encoding,
/// and the part of its SHA-256 past the 64 bits the fingerprint shows.
fn leaks_of(secret: &str) -> Vec<String> {
    let bytes = secret.as_bytes();
    let mut leaks = vec![
        secret.to_string(),
        secret[3..secret.len() - 3].to_string(),
        secret[..8].to_string(),
        secret[secret.len() - 8..].to_string(),
        hex(bytes),
        hex(bytes).to_uppercase(),
        secret.bytes().map(|byte| format!("%{byte:02X}")).collect(),
    ];
    for offset in 0..3 {
        // The base64 of the secret behind `offset` other bytes: its characters from the
        // first group holding only the secret's bits, to the last such.
        let mut shifted = vec![b'x'; offset];
        shifted.extend_from_slice(bytes);
        for (end, pad) in [("+/", true), ("-_", false)] {
            let encoded = base64(&shifted, end, pad);
            let skip = if offset == 0 { 0 } else { 4 };
            leaks.push(encoded[skip..skip + 24].to_string());
        }
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    leaks.push(hex(digest.as_ref())[16..].to_string());
    leaks
}

fn assert_no_leak(what: &str, text: &str, secrets: &[&str]) {
    for secret in secrets {
        for leak in leaks_of(secret) {
            assert!(
                !text.contains(&leak),
                "{what} holds {leak:?}, a form of the secret {secret:?}:\n{text}"
            );
        }
    }
}

/// The one key of a provider's zone, as its top keys by tokens name it (every request
/// [`run_every_path`] sent it is settled).
fn fingerprint_of(nginx: &Nginx, provider: Provider) -> String {
    let top = admin_json(nginx, &format!("zones/{}/top?by=tokens", provider.name()));
    let keys = top["keys"].as_array().cloned().unwrap_or_default();
    assert_eq!(keys.len(), 1, "{top}");
    keys[0]["key"].as_str().unwrap_or("").to_string()
}

/// Every answer of the admin API a dashboard or an operator reads, for every zone.
fn every_answer(nginx: &Nginx, zones: &[&str], keys: &[String]) -> String {
    let mut answers = String::new();
    let mut paths = vec![
        "".to_string(),
        "zones".into(),
        "metrics".into(),
        "dashboard".into(),
    ];
    for zone in zones {
        for tail in [
            "",
            "/overrides",
            "/history",
            "/top",
            "/top?by=rejected&window=10m",
            "/top?by=delayed",
            "/top?by=tokens",
            "/top?by=tokens&window=10m",
        ] {
            paths.push(format!("zones/{zone}{tail}"));
        }
        for key in keys {
            paths.push(format!("zones/{zone}/keys/{key}"));
        }
    }
    paths.push("zones/keys/blocked".into());
    paths.push("zones/keys/top?by=blocked".into());
    for path in paths {
        let (status, _, text) = admin(nginx, "GET", &path, None);
        assert!([200, 400, 404].contains(&status), "{path}: {status} {text}");
        answers.push_str(&format!("GET {path}\n{text}\n"));
    }
    let page = send(
        nginx.port(),
        &Request::get("/ratelimit/").header("Accept", "text/html"),
    );
    answers.push_str(&page.text());
    answers
}

/// The log entries (a line, and the lines of a multi-line message with it) of `log`.
fn entries(log: &str) -> Vec<String> {
    let mut entries: Vec<String> = Vec::new();
    for line in log.lines() {
        let starts = line.len() > 20
            && line.as_bytes()[4] == b'/'
            && line.as_bytes()[7] == b'/'
            && line[..4].bytes().all(|b| b.is_ascii_digit());
        match entries.last_mut() {
            Some(entry) if !starts => {
                entry.push('\n');
                entry.push_str(line);
            }
            _ => entries.push(line.to_string()),
        }
    }
    entries
}

/// The secrets of every provider, sent in every place each reads and spelled every way,
/// through real nginx: the admin API's every answer (zones, keys, overrides, blocks, top keys
/// by every ranking, history, metrics), the dashboard, the state file, both access logs and
/// the error log at `info` (the module's lowest level) hold none of them in any form.
#[test]
fn the_secret_shows_nowhere() {
    let llm = FakeLlm::start();
    let nginx = start_llm(&llm, "info");
    let secrets = [SECRET, OPENAI, ANTHROPIC, GEMINI, AZURE];
    run_every_path(&nginx);
    let mut keys = Vec::new();
    for provider in PROVIDERS {
        keys.push(fingerprint_of(&nginx, provider));
    }
    let (_, top, _) = admin(&nginx, "GET", "zones/keys/top", None);
    keys.push(top["keys"][0]["key"].as_str().unwrap_or("").to_string());
    for key in &keys {
        assert!(key.contains("...") && key.contains('~'), "{keys:?}");
    }
    let zones = ["keys", "openai", "anthropic", "gemini", "azure"];
    let answers = every_answer(&nginx, &zones, &keys);
    for key in &keys {
        assert!(
            answers.contains(key.as_str()),
            "{key} is in no answer:\n{answers}"
        );
    }
    assert_no_leak("the admin API's answers", &answers, &secrets);

    // Written to the state file, by the write an override makes and at the stop.
    let state = wait_state_file(&nginx, &keys[4]);
    assert_no_leak("the state file", &state, &secrets);
    let read = |name: &str| std::fs::read_to_string(nginx.prefix().join(name)).expect(name);
    let access_log = read("logs/access.log");
    assert!(
        access_log.contains(&format!("key=\"{}\" REJECTED", keys[4])),
        "{access_log}"
    );
    assert_no_leak("the access log", &access_log, &secrets);
    let llm_log = read("logs/llm.log");
    assert!(llm_log.contains(&format!("key={}", keys[0])), "{llm_log}");
    assert_no_leak("the llm log", &llm_log, &secrets);
    let error_log = nginx.error_log();
    assert!(error_log.contains("limiting requests"), "{error_log}");
    // A credential sent as `?key=` is in nginx's own `request: "..."` of the entries about
    // that request, as nginx writes every request line: left out of the check.
    let own: String = entries(&error_log)
        .iter()
        .map(|entry| {
            entry
                .split(", request: \"")
                .next()
                .unwrap_or(entry)
                .to_string()
                + "\n"
        })
        .collect();
    assert_no_leak("the error log", &own, &secrets);
    let without_query_keys = entries(&error_log)
        .into_iter()
        .filter(|entry| !entry.contains("key="))
        .collect::<Vec<_>>()
        .join("\n");
    assert_no_leak("the error log", &without_query_keys, &secrets);
}

/// The error log at `debug`, when the nginx under test was built `--with-debug` (Debian's
/// is): a secret is only in nginx's own dumps of the headers it parsed and sent (nginx logs
/// every request header at `debug`) and of the URI with its arguments (a `?key=`), never in an entry above `debug` nor in one of this
/// module's (whose lowest level is `info`).
#[test]
fn at_debug_only_nginx_own_header_dumps_hold_the_secret() {
    let version = std::process::Command::new(common::nginx::nginx_binary())
        .arg("-V")
        .output()
        .expect("nginx -V");
    let version = String::from_utf8_lossy(&version.stderr).into_owned();
    let llm = FakeLlm::start();
    let nginx = start_llm(&llm, "debug");
    let secrets = [SECRET, OPENAI, ANTHROPIC, GEMINI, AZURE];
    run_every_path(&nginx);
    let log = nginx.error_log();
    let entries = entries(&log);
    let debug = entries
        .iter()
        .filter(|entry| entry.contains(" [debug] "))
        .count();
    if version.contains("--with-debug") {
        assert!(debug > 100, "{debug} debug entries:\n{log}");
    } else {
        println!(
            "{} has no --with-debug: no debug entries",
            common::nginx::nginx_binary().display()
        );
        assert_eq!(debug, 0, "{log}");
    }
    // nginx's own dumps: a header parsed ("http header:", HTTP/2's "http2 header:"), the
    // request line and its arguments, the headers proxied upstream, and the URI with its
    // arguments (a `?key=`) that nginx's core filters and finalizer print (nginx 1.22).
    const NGINX_DUMPS: [&str; 10] = [
        "http header: \"",
        "http proxy header:",
        "http request line: \"",
        "http args: \"",
        "http uri: \"",
        "http2 header:",
        "http output filter \"",
        "http copy filter: ",
        "http postpone filter \"",
        "http finalize request: ",
    ];
    for entry in &entries {
        let message = entry.split(", request: \"").next().unwrap_or(entry);
        let leaks = secrets
            .iter()
            .flat_map(|secret| leaks_of(secret))
            .any(|leak| message.contains(&leak));
        if !leaks {
            continue;
        }
        assert!(
            entry.contains(" [debug] ") && NGINX_DUMPS.iter().any(|dump| entry.contains(dump)),
            "an entry that is not one of nginx's own header dumps holds a secret:\n{entry}"
        );
    }
}

/// Sends every provider's secret in every place it reads, and [`SECRET`] in seven spellings
/// (a block on zone `keys`, an override, a DELETE of the block): every path a secret could
/// take into the zones, the admin API and the logs.
fn run_every_path(nginx: &Nginx) {
    for provider in PROVIDERS {
        for &place in provider.own() {
            for extra in [None, Some(Place::Authorization), Some(Place::XApiKey)] {
                let mut request = put(provider.request(""), place, provider.secret());
                if let Some(extra) = extra.filter(|extra| !provider.own().contains(extra)) {
                    request = put(request, extra, &junk());
                }
                let status = send(nginx.port(), &request).status;
                assert!([200, 429].contains(&status), "{provider:?}: {status}");
            }
        }
        // Streamed too, and refused with OpenAI's 429 body once its 300 tokens are gone.
        let mut request = put(
            provider.request("&stream=1&alt=sse"),
            provider.own()[0],
            provider.secret(),
        );
        request.path = request
            .path
            .replace("generateContent", "streamGenerateContent");
        send(nginx.port(), &request);
        for _ in 0..3 {
            let request = put(provider.request(""), provider.own()[0], provider.secret());
            send(nginx.port(), &request);
        }
    }
    let statuses: Vec<u16> = spellings()
        .iter()
        .map(|request| send(nginx.port(), request).status)
        .collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429, 429]);
    let (_, top, _) = admin(nginx, "GET", "zones/keys/top", None);
    let shown = top["keys"][0]["key"].as_str().unwrap_or("").to_string();
    assert!(shown.starts_with("sk-...XYZ~"), "{top}");
    let (status, _, text) = admin(
        nginx,
        "PUT",
        &format!("zones/keys/overrides/{shown}"),
        Some(r#"{"rate": "9r/s", "burst": 5}"#),
    );
    assert_eq!(status, 201, "{text}");
    let (status, _, text) = admin(
        nginx,
        "DELETE",
        &format!("zones/keys/blocked/{shown}"),
        None,
    );
    assert_eq!(status, 204, "{text}");
    // The release forgot the key's count: the key starts afresh under its override (burst 5),
    // whatever the spelling, and there is no count left to forget.
    let (status, _, text) = admin(nginx, "DELETE", &format!("zones/keys/keys/{shown}"), None);
    assert_eq!(status, 404, "{text}");
    let statuses: Vec<u16> = spellings()
        .iter()
        .map(|request| send(nginx.port(), request).status)
        .collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 200, 429]);
    // Settled in the log phase: wait until every provider's zone has settled.
    let deadline = Instant::now() + Duration::from_secs(10);
    for provider in PROVIDERS {
        loop {
            let zone = admin_json(nginx, &format!("zones/{}", provider.name()));
            let usage = &zone["usage"];
            let settled = usage["settled_with_usage"].as_u64().unwrap_or(0)
                + usage["settled_without_usage"].as_u64().unwrap_or(0);
            let reserved = usage["tokens_reserved"].as_u64().unwrap_or(0);
            if settled > 0 && reserved > 0 {
                break;
            }
            assert!(Instant::now() < deadline, "{zone}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The state file once it holds `key` (written when an override is set).
fn wait_state_file(nginx: &Nginx, key: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let state = std::fs::read_to_string(nginx.prefix().join("state.json")).unwrap_or_default();
        if state.contains(key) {
            return state;
        }
        assert!(
            Instant::now() < deadline,
            "{key} not in the state file:\n{state}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn seven_spellings_share_one_budget() {
    let llm = FakeLlm::start();
    let nginx = start_llm(&llm, "info");
    let statuses: Vec<u16> = spellings()
        .iter()
        .map(|request| send(nginx.port(), request).status)
        .collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429, 429]);
    // Another credential, and no credential at all, have budgets of their own.
    let other = Request::get("/index.html").header("Authorization", "Bearer sk-other-key");
    assert_eq!(send(nginx.port(), &other).status, 200);
    let nobody: Response = send(nginx.port(), &Request::get("/index.html"));
    assert_eq!(nobody.status, 200);
    // No credential in a provider's location: 401, as llm.conf answers.
    let none = Provider::OpenAi.request("").header("x-api-key", SECRET);
    assert_eq!(send(nginx.port(), &none).status, 401);
}
