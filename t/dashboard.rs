//! The dashboard in a real browser: Debian's chromium, headless, driven over WebDriver. The
//! page loads with no console error; its first paint already charts the traffic sent before
//! it opened (the zone keeps its own history), with a scale and clock times on the axes; the
//! zones share the window's width; the forms show whole placeholders, check what is typed and
//! say what the API refused without JSON positions; a rate changed through the page (with its
//! confirmation) changes what nginx admits, and a read-only location shows no control.
//! Screenshots go to target/screenshots/.

mod common;

#[path = "common/webdriver.rs"]
mod webdriver;

use std::path::PathBuf;

use common::{key_statuses, send, Nginx, Request};
use serde_json::Value;
use webdriver::Browser;

fn screenshot_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target/screenshots")
        .join(format!("{name}.png"))
}

fn zone_text(browser: &Browser, zone: &str, class: &str) -> String {
    browser.text(&browser.find(&format!("section[data-zone=\"{zone}\"] .{class}")))
}

fn api(nginx: &Nginx, path: &str) -> Value {
    let response = send(nginx.port(), &Request::get(&format!("/ratelimit/{path}")));
    serde_json::from_slice(&response.body).expect("JSON")
}

/// Seconds of the y coordinate of a polyline's points that rose above the chart's floor (the
/// lowest y of its points is the floor: `0/s`).
fn risen_points(points: &str) -> usize {
    let ys: Vec<f64> = points
        .split(' ')
        .filter_map(|point| point.split(',').nth(1)?.parse().ok())
        .collect();
    let floor = ys.iter().copied().fold(f64::MIN, f64::max);
    ys.iter().filter(|&&y| y < floor - 1.0).count()
}

/// The text of SVG elements (which have no `innerText`).
fn svg_texts(browser: &Browser, css: &str) -> Vec<String> {
    let script = format!(
        "return [...document.querySelectorAll({})].map(e => e.textContent)",
        serde_json::to_string(css).unwrap()
    );
    let texts = browser.script(&script);
    texts
        .as_array()
        .map(|list| {
            list.iter()
                .filter_map(|text| text.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn line_points(browser: &Browser, zone: &str, series: &str) -> Option<String> {
    let lines = browser.find_all(&format!("section[data-zone=\"{zone}\"] .line-{series}"));
    lines
        .first()
        .and_then(|line| browser.attribute(line, "points"))
        .filter(|points| !points.is_empty())
}

#[test]
fn dashboard_in_a_real_browser() {
    let nginx = common::admin::dashboard().start();
    nginx.write_file("html/index.html", "ok");
    // Traffic before any page is open: the chart must show it at its first paint, since the
    // zone keeps its own history.
    assert_eq!(
        key_statuses(nginx.port(), "/", "greedy", 5),
        [200, 429, 429, 429, 429]
    );
    assert_eq!(key_statuses(nginx.port(), "/", "modest", 2), [200, 429]);
    // The chart leaves out the current second: let the traffic's second end.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let history = api(&nginx, "zones/one/history");
    let rejected: u64 = history["rejected"]
        .as_array()
        .expect("rejected counts")
        .iter()
        .filter_map(Value::as_u64)
        .sum();
    assert_eq!(rejected, 5, "{history}");

    let browser = Browser::start();
    let base = format!("http://127.0.0.1:{}", nginx.port());
    browser.goto(&format!("{base}/ratelimit/"));
    let zones = browser.wait_for("both zones", |b| {
        let names: Vec<String> = b
            .find_all("section.zone")
            .iter()
            .filter_map(|zone| b.attribute(zone, "data-zone"))
            .collect();
        (names.len() == 2).then_some(names)
    });
    assert_eq!(zones, ["one", "window"]);
    // The first chart drawn already holds the rejections made before the page opened.
    let first = browser.wait_for("the first chart", |b| line_points(b, "one", "rejected"));
    assert!(
        risen_points(&first) >= 1,
        "the first paint shows no rejection: {first}"
    );
    assert_eq!(
        browser.text(&browser.find("section[data-zone=\"one\"] .rate-passed")),
        "0",
        "the last complete second had no traffic"
    );
    // Axes: requests per second from 0 to a round number, a clock time at each minute.
    let y_labels = svg_texts(&browser, "section[data-zone=\"one\"] .y-label");
    assert_eq!(
        y_labels.first().map(String::as_str),
        Some("0/s"),
        "{y_labels:?}"
    );
    assert!(
        y_labels.iter().any(|label| label == "5/s"),
        "5 rejections in a second make the scale 5/s: {y_labels:?}"
    );
    let x_labels = svg_texts(&browser, "section[data-zone=\"one\"] .x-label");
    assert!(
        (4..=5).contains(&x_labels.len())
            && x_labels.iter().all(|label| {
                label.len() == 5
                    && label.as_bytes()[2] == b':'
                    && label.replace(':', "").parse::<u32>().is_ok()
            }),
        "one HH:MM label per minute of the last five: {x_labels:?}"
    );
    // The zones share the window's width: two cards side by side, each wider than 600 px.
    let widths = browser.script(
        "return [...document.querySelectorAll('section.zone')].map(z => z.getBoundingClientRect().width)",
    );
    let widths: Vec<f64> = widths
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_f64)
        .collect();
    assert!(
        widths.len() == 2 && widths.iter().all(|&width| width > 600.0),
        "{widths:?}"
    );
    // Every input shows its whole placeholder.
    let cut = browser.script(
        "const c = document.createElement('canvas').getContext('2d'); \
         return [...document.querySelectorAll('input')].filter(i => { \
           const s = getComputedStyle(i); c.font = s.font; \
           const room = i.clientWidth - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight); \
           return c.measureText(i.placeholder).width > room; }).map(i => i.placeholder)",
    );
    assert_eq!(cut, serde_json::json!([]), "placeholders cut off");
    assert_eq!(zone_text(&browser, "window", "algorithm"), "sliding_window");
    assert_eq!(zone_text(&browser, "one", "total-rejected"), "5");
    assert_eq!(browser.text(&browser.find("#mode")), "changes allowed");
    browser.screenshot(&screenshot_path("dashboard-first-paint"));

    // A page opened later draws the same history: not one that starts empty.
    browser.goto(&format!("{base}/ratelimit/dashboard"));
    let again = browser.wait_for("the chart again", |b| line_points(b, "one", "rejected"));
    assert!(risen_points(&again) >= 1, "{again}");

    let top = browser.wait_for("the top keys", |b| {
        let rows = b.texts("section[data-zone=\"one\"] table.top tr");
        (rows.len() == 3).then(|| rows[1..].to_vec())
    });
    assert!(top[0].starts_with("greedy 4"), "{top:?}");
    assert!(top[1].starts_with("modest 1"), "{top:?}");
    // ...and the rejected line is painted in the legend's red.
    let stroke = browser.script(
        "return getComputedStyle(document.querySelector('section[data-zone=\"one\"] .line-rejected')).stroke",
    );
    assert_eq!(stroke, "rgb(198, 40, 40)");

    // The forms check what is typed before anything is sent, and say what is valid.
    let one = "section[data-zone=\"one\"]";
    let message = |b: &Browser| b.text(&b.find(&format!("{one} .message")));
    browser.click(&browser.find(&format!("{one} .apply-limits")));
    assert_eq!(message(&browser), "give a rate, a burst or both");
    browser.type_into(&browser.find(&format!("{one} .rate-input")), "10/s");
    browser.click(&browser.find(&format!("{one} .apply-limits")));
    assert_eq!(
        message(&browser),
        "\"10/s\" is not a rate: write a number above 0 then r/s, r/m, r/h or r/d, e.g. 10r/s or 0.5r/m"
    );
    browser.type_into(&browser.find(&format!("{one} .override-key")), "k");
    browser.click(&browser.find(&format!("{one} .apply-override")));
    assert_eq!(message(&browser), "give a rate");
    let hidden = browser.script(
        "return !document.querySelector('section[data-zone=\"one\"] .confirm').classList.contains('shown')",
    );
    assert_eq!(hidden, true, "a question was asked for an invalid change");
    assert_eq!(api(&nginx, "zones/one")["rate"], "1r/m");
    // What the API refuses is said without JSON positions: a burst on a sliding window.
    let window = "section[data-zone=\"window\"]";
    browser.type_into(&browser.find(&format!("{window} .burst-input")), "5");
    browser.click(&browser.find(&format!("{window} .apply-limits")));
    browser.click(&browser.find(&format!("{window} .confirm-yes")));
    let refused = browser.wait_for("the refusal", |b| {
        let text = b.text(&b.find(&format!("{window} .message")));
        (!text.is_empty()).then_some(text)
    });
    assert_eq!(
        refused,
        "not changed: \"burst\" is not used by sliding_window"
    );
    // The browser logs the refused PATCH as a failed load: that one, and nothing else so far.
    let errors = browser.console_errors();
    assert!(
        errors.len() == 1 && errors[0].contains("zones/window - Failed to load resource"),
        "console errors: {errors:?}"
    );

    // Change the rate through the page: 1r/m to a million a second.
    assert_eq!(
        key_statuses(nginx.port(), "/", "before", 3),
        [200, 429, 429]
    );
    let rate_input = browser.find("section[data-zone=\"one\"] .rate-input");
    browser.type_into(&rate_input, "1000000r/s");
    browser.click(&browser.find("section[data-zone=\"one\"] .apply-limits"));
    let question = browser.text(&browser.find("section[data-zone=\"one\"] .question"));
    assert_eq!(question, "Change zone \"one\" to rate 1000000r/s?");
    // Nothing changes before the confirmation.
    assert_eq!(api(&nginx, "zones/one")["rate"], "1r/m");
    browser.click(&browser.find("section[data-zone=\"one\"] .confirm-yes"));
    browser.wait_for("the new rate", |b| {
        (zone_text(b, "one", "rate") == "1000000r/s").then_some(())
    });
    assert_eq!(api(&nginx, "zones/one")["rate"], "1000000r/s");
    assert_eq!(
        message(&browser),
        "zone \"one\" now has rate 1000000r/s, burst 0 (the configuration says 1r/m, burst 0)"
    );
    // One request per microsecond at most: sequential requests over new connections, each
    // far longer than that, all pass now.
    assert_eq!(key_statuses(nginx.port(), "/", "after", 5), [200; 5]);
    browser.screenshot(&screenshot_path("dashboard-changed"));

    // Override a top key from its row, then remove the override, each confirmed.
    let one = "section[data-zone=\"one\"]";
    browser.click_on(&format!("{one} table.top .limit-key"));
    let prefilled = browser
        .script("return document.querySelector('section[data-zone=\"one\"] .override-key').value");
    assert_eq!(prefilled, "greedy");
    browser.type_into(&browser.find(&format!("{one} .override-rate")), "1r/m");
    browser.click(&browser.find(&format!("{one} .apply-override")));
    assert_eq!(
        browser.text(&browser.find(&format!("{one} .question"))),
        "Give key \"greedy\" of zone \"one\" rate 1r/m?"
    );
    browser.click(&browser.find(&format!("{one} .confirm-yes")));
    browser.wait_for("the new override", |b| {
        let rows = b.texts(&format!("{one} table.override-list tr"));
        rows.iter()
            .any(|row| row.starts_with("greedy 1r/m burst 0"))
            .then_some(())
    });
    assert_eq!(key_statuses(nginx.port(), "/", "greedy", 2), [200, 429]);
    assert_eq!(key_statuses(nginx.port(), "/", "other", 2), [200, 200]);
    browser.click_on(&format!("{one} table.override-list .remove-override"));
    browser.click(&browser.find(&format!("{one} .confirm-yes")));
    browser.wait_for("no override", |b| {
        let rows = b.texts(&format!("{one} table.override-list tr"));
        (rows == ["none"]).then_some(())
    });
    assert_eq!(key_statuses(nginx.port(), "/", "greedy", 2), [200, 200]);
    // A zone whose JSON has a `sync` object (cluster sync) shows each of its fields; the
    // zones here have none, so the renderer is fed one, and the next poll clears it again.
    let sync = browser.script(
        "const zone = view.zones.get('one'); \
         showSync(zone, {state: 'connected', peers: 2, last: {lag_ms: 12}}); \
         return [...zone.card.querySelectorAll('.sync tr')].map(r => r.innerText.replace(/\\s+/g, ' '))",
    );
    assert_eq!(
        sync,
        serde_json::json!(["state connected", "peers 2", "last {\"lag_ms\":12}"])
    );
    browser.wait_for("no sync state", |b| {
        b.texts("section[data-zone=\"one\"] .sync tr")
            .is_empty()
            .then_some(())
    });
    let errors = browser.console_errors();
    assert!(errors.is_empty(), "console errors: {errors:?}");

    // A read-only location: the same numbers, no control.
    let put = Request::new("PUT", "/ratelimit/zones/one/overrides/vip").json(r#"{"rate": "5r/s"}"#);
    assert_eq!(send(nginx.port(), &put).status, 201);
    browser.goto(&format!("{base}/readonly/dashboard"));
    browser.wait_for("the override, read-only", |b| {
        let rows = b.texts("section[data-zone=\"one\"] table.override-list tr");
        rows.iter().any(|row| row.starts_with("vip")).then_some(())
    });
    assert_eq!(browser.text(&browser.find("#mode")), "read-only");
    // greedy 4, before 2, modest 1 (the header row first).
    browser.wait_for("the top keys, read-only", |b| {
        let rows = b.texts("section[data-zone=\"one\"] table.top tr");
        let firsts: Vec<&str> = rows
            .iter()
            .skip(1)
            .filter_map(|t| t.split_whitespace().next())
            .collect();
        (firsts == ["greedy", "before", "modest"]).then_some(())
    });
    for control in [
        ".controls",
        "input",
        "button",
        ".limit-key",
        ".remove-override",
    ] {
        assert!(
            browser.find_all(control).is_empty(),
            "a read-only page shows {control}"
        );
    }
    browser.screenshot(&screenshot_path("dashboard-readonly"));
    let errors = browser.console_errors();
    assert!(errors.is_empty(), "console errors: {errors:?}");
    assert!(!nginx.error_log().contains("[alert]"));
}

/// A zone with `block=` on the module: the page lists the keys its rejections blocked, with
/// the block's level, and releases one from its row after a confirmation.
#[test]
fn dashboard_lists_blocked_keys_and_releases_one() {
    let nginx = common::config()
        .workers(2)
        .reuseport()
        .http("rate_limit_zone $http_x_key zone=login:1m rate=1r/m block=1h block_max=1d;")
        .http("rate_limit_zone $binary_remote_addr zone=addr:1m rate=1r/m block=1h;")
        .locations(
            "location / { rate_limit zone=login nodelay; }\n\
             location /addr { rate_limit zone=addr nodelay; empty_gif; }\n\
             location /ratelimit/ { rate_limit_admin write=on; }",
        )
        .start();
    assert_eq!(
        key_statuses(nginx.port(), "/", "mallory", 4),
        [200, 429, 429, 429]
    );
    assert_eq!(key_statuses(nginx.port(), "/addr", "-", 2), [200, 429]);
    let browser = Browser::start();
    browser.goto(&format!("http://127.0.0.1:{}/ratelimit/", nginx.port()));
    let login = "section[data-zone=\"login\"]";
    let rows = browser.wait_for("the blocked key", |b| {
        let rows = b.texts(&format!("{login} table.blocked-list tr"));
        (rows.len() == 2).then_some(rows)
    });
    assert!(rows[1].starts_with("mallory "), "{rows:?}");
    assert!(rows[1].contains("60 min"), "{rows:?}");
    let summary = zone_text(&browser, "login", "blocked-summary");
    assert_eq!(
        summary,
        "(block=1h block_max=1d, 2 requests refused while blocked)"
    );
    browser.screenshot(&screenshot_path("dashboard-blocked"));
    browser.click_on(&format!("{login} .release"));
    assert_eq!(
        browser.text(&browser.find(&format!("{login} .question"))),
        "Release key \"mallory\" in zone \"login\"?"
    );
    // Nothing changes before the confirmation.
    assert_eq!(api(&nginx, "zones/login/blocked")["count"], 1);
    browser.click(&browser.find(&format!("{login} .confirm-yes")));
    browser.wait_for("the release", |b| {
        let rows = b.texts(&format!("{login} table.blocked-list tr"));
        (rows == ["none"]).then_some(())
    });
    assert_eq!(api(&nginx, "zones/login/blocked")["count"], 0);
    // A $binary_remote_addr zone lists the client by address and releases it.
    let addr = "section[data-zone=\"addr\"]";
    let rows = browser.wait_for("the blocked address", |b| {
        let rows = b.texts(&format!("{addr} table.blocked-list tr"));
        (rows.len() == 2).then_some(rows)
    });
    assert!(rows[1].starts_with("127.0.0.1 "), "{rows:?}");
    browser.click_on(&format!("{addr} .release"));
    assert_eq!(
        browser.text(&browser.find(&format!("{addr} .question"))),
        "Release key \"127.0.0.1\" in zone \"addr\"?"
    );
    browser.click(&browser.find(&format!("{addr} .confirm-yes")));
    browser.wait_for("the address's release", |b| {
        let rows = b.texts(&format!("{addr} table.blocked-list tr"));
        (rows == ["none"]).then_some(())
    });
    assert_eq!(api(&nginx, "zones/addr/blocked")["count"], 0);
    assert!(
        browser.console_errors().is_empty(),
        "{:?}",
        browser.console_errors()
    );
}

/// A concurrency zone on the page: its limit and queue, requests in flight charted against
/// the limit, no override controls, and its limit changed through the page's form, which
/// checks the limit and queue typed.
#[test]
fn dashboard_charts_in_flight_against_the_limit() {
    let upstream = common::upstream::Upstream::start();
    let nginx = common::admin::dashboard()
        .http("rate_limit_zone $http_x_key zone=app:1m algorithm=concurrency limit=2 queue=3;")
        .locations(&format!(
            "location /app/ {{ rate_limit zone=app; proxy_pass http://127.0.0.1:{}/; }}",
            upstream.port()
        ))
        .start();
    let browser = Browser::start();
    let base = format!("http://127.0.0.1:{}", nginx.port());
    browser.goto(&format!("{base}/ratelimit/"));
    browser.wait_for("the concurrency zone's card", |b| {
        (!b.find_all("section[data-zone=\"app\"] dd.rate").is_empty()).then_some(())
    });
    browser.wait_for("the concurrency zone's limit", |b| {
        (zone_text(b, "app", "rate") == "2").then_some(())
    });
    assert_eq!(zone_text(&browser, "app", "burst"), "3");
    assert_eq!(zone_text(&browser, "app", "config"), "2 / 3");
    let labels = browser.texts("section[data-zone=\"app\"] dl.stats dt");
    assert_eq!(labels[..2], ["limit", "queue"], "{labels:?}");
    // The rate zones show no in-flight chart; the concurrency zone no overrides.
    for (zone, part) in [("one", "svg.inflight"), ("app", "table.override-list")] {
        let shown = browser.script(&format!(
            "return getComputedStyle(document.querySelector('section[data-zone=\"{zone}\"] \
             {part}')).display"
        ));
        assert_eq!(shown, "none", "{zone} {part}");
    }
    // ...nor the rest of it: the in-flight numbers, the override form and buttons.
    for (zone, part) in [
        ("one", "dd.in-flight"),
        ("one", ".now-limit"),
        ("app", ".override-form"),
        ("app", ".override-title"),
        ("app", ".overrides-title"),
    ] {
        let visible = browser.script(&format!(
            "return document.querySelector('section[data-zone=\"{zone}\"] {part}')\
             .checkVisibility()"
        ));
        assert_eq!(visible, false, "{zone} {part}");
    }
    assert_eq!(
        browser.script(
            "return document.querySelector('section[data-zone=\"app\"] dd.in-flight')\
             .checkVisibility()"
        ),
        true
    );

    let held: Vec<_> = ["a", "b"]
        .iter()
        .map(|name| {
            common::start_request(
                nginx.port(),
                &Request::get(&format!("/app/hold/{name}")).header("X-Key", "k"),
            )
        })
        .collect();
    upstream.wait_arrivals(2, std::time::Duration::from_secs(10));
    browser.wait_for("two in flight", |b| {
        (zone_text(b, "app", "in-flight") == "2" && zone_text(b, "app", "now-limit") == "2")
            .then_some(())
    });
    // The in-flight line reaches the limit's (the top of the chart).
    let ys = |b: &Browser, series: &str| -> Vec<f64> {
        line_points(b, "app", series)
            .unwrap_or_default()
            .split(' ')
            .filter_map(|point| point.split(',').nth(1)?.parse::<f64>().ok())
            .collect()
    };
    browser.wait_for("in flight at the limit on the chart", |b| {
        let limit = ys(b, "limit").into_iter().fold(f64::MAX, f64::min);
        let at_top = ys(b, "in-flight").iter().any(|&y| (y - limit).abs() < 0.5);
        (at_top && limit < 10.0).then_some(())
    });
    browser.screenshot(&screenshot_path("dashboard-concurrency"));

    // The zone's form takes a limit and queue places, checked before anything is sent.
    let app = "section[data-zone=\"app\"]";
    let placeholders = browser.script(
        "return [...document.querySelectorAll('section[data-zone=\"app\"] .limits-form input')]\
         .map(i => i.placeholder)",
    );
    assert_eq!(
        placeholders,
        serde_json::json!(["limit, e.g. 100", "queue, e.g. 20"])
    );
    let message = |b: &Browser| b.text(&b.find(&format!("{app} .message")));
    browser.click(&browser.find(&format!("{app} .apply-limits")));
    assert_eq!(message(&browser), "give a limit, a queue or both");
    browser.type_into(&browser.find(&format!("{app} .rate-input")), "0");
    browser.click(&browser.find(&format!("{app} .apply-limits")));
    assert_eq!(
        message(&browser),
        "\"0\" is not a limit: write a whole number from 1 to 16777215"
    );
    browser.type_into(&browser.find(&format!("{app} .rate-input")), "5");
    browser.type_into(&browser.find(&format!("{app} .burst-input")), "40000");
    browser.click(&browser.find(&format!("{app} .apply-limits")));
    assert_eq!(
        message(&browser),
        "\"40000\" is not a queue: write a whole number from 0 to 32767"
    );
    let hidden = browser.script(&format!(
        "return !document.querySelector('{app} .confirm').classList.contains('shown')"
    ));
    assert_eq!(hidden, true, "a question was asked for an invalid change");
    browser.type_into(&browser.find(&format!("{app} .burst-input")), "");
    browser.click(&browser.find(&format!("{app} .apply-limits")));
    assert_eq!(
        browser.text(&browser.find(&format!("{app} .question"))),
        "Change zone \"app\" to limit 5?"
    );
    browser.click(&browser.find(&format!("{app} .confirm-yes")));
    browser.wait_for("the new limit", |b| {
        (zone_text(b, "app", "rate") == "5").then_some(())
    });
    assert_eq!(api(&nginx, "zones/app")["limit"], 5);
    browser.wait_for("what changed", |b| {
        (message(b) == "zone \"app\" now has limit 5, queue 3 (the configuration says 2, queue 3)")
            .then_some(())
    });
    upstream.release_all();
    for pending in held {
        assert_eq!(pending.finish().status, 200);
    }
    browser.wait_for("nothing in flight", |b| {
        (zone_text(b, "app", "in-flight") == "0").then_some(())
    });
    let errors = browser.console_errors();
    assert!(errors.is_empty(), "console errors: {errors:?}");
}

/// A usage-based zone on the page: its top keys by the tokens they used, chosen in the top
/// table's menu (the heaviest user first, whatever its number of requests).
#[test]
fn dashboard_ranks_keys_by_tokens_used() {
    let llm = common::llm::FakeLlm::start();
    let nginx = common::admin::dashboard()
        .http(
            "rate_limit_zone $http_authorization zone=tpm:1m rate=6000r/m burst=10000 \
             algorithm=token_bucket;",
        )
        .locations(&format!(
            "location /v1/ {{ rate_limit zone=tpm usage=openai reserve=10; \
             proxy_pass http://127.0.0.1:{}; }}",
            llm.port()
        ))
        .start();
    let chat = |key: &str, completion: u32| {
        let request = Request::new(
            "POST",
            &format!("/v1/chat/completions?prompt=10&completion={completion}"),
        )
        .header("Authorization", key)
        .json(r#"{"model":"fake","messages":[{"role":"user","content":"hi"}]}"#);
        assert_eq!(send(nginx.port(), &request).status, 200);
    };
    // One large request against five small ones.
    chat("Bearer big", 990);
    for _ in 0..5 {
        chat("Bearer chatty", 10);
    }
    let browser = Browser::start();
    browser.goto(&format!("http://127.0.0.1:{}/ratelimit/", nginx.port()));
    browser.wait_for("the usage zone's card", |b| {
        (!b.find_all("section[data-zone=\"tpm\"] select.top-by")
            .is_empty())
        .then_some(())
    });
    browser.script(
        "const select = document.querySelector('section[data-zone=\"tpm\"] select.top-by'); \
         select.value = 'tokens'; select.dispatchEvent(new Event('change')); return null",
    );
    let rows = browser.wait_for("the keys by tokens", |b| {
        let rows = b.texts("section[data-zone=\"tpm\"] table.top tr");
        (rows.len() == 3 && rows[0].contains("tokens")).then_some(rows)
    });
    assert!(rows[1].starts_with("Bearer big 1000"), "{rows:?}");
    assert!(rows[2].starts_with("Bearer chatty 100"), "{rows:?}");
    assert!(
        browser.console_errors().is_empty(),
        "{:?}",
        browser.console_errors()
    );
}

/// A priced quota zone ($1 a day, micro-dollars): the card names the limit, the period and
/// its end, what the zone spent in dollars, and each top key's use of the period; the
/// ranking by tokens is by micro-dollars spent; a key's override is listed as a limit.
#[test]
fn dashboard_shows_a_priced_quota() {
    let llm = common::llm::FakeLlm::start();
    let nginx = common::admin::dashboard()
        .http(
            "rate_limit_prices models { big input=10 output=30; }
             rate_limit_zone $http_authorization zone=daily:1m algorithm=quota limit=1000000 \
             period=day tz=Europe/Berlin;",
        )
        .locations(&format!(
            "location /v1/ {{ rate_limit zone=daily usage=openai prices=models; \
             proxy_pass http://127.0.0.1:{}; }}",
            llm.port()
        ))
        .start();
    // $0.31 a request: three spend $0.93.
    for _ in 0..3 {
        let request = Request::new(
            "POST",
            "/v1/chat/completions?prompt=1000&completion=10000&model=big",
        )
        .header("Authorization", "team-a")
        .json(r#"{"model":"big","messages":[]}"#);
        assert_eq!(send(nginx.port(), &request).status, 200);
    }
    let browser = Browser::start();
    browser.goto(&format!("http://127.0.0.1:{}/ratelimit/", nginx.port()));
    let spent = browser.wait_for("the zone's spend", |b| {
        let cards = b.find_all("section[data-zone=\"daily\"] dd.spent");
        let text = cards.first().map(|card| b.text(card)).unwrap_or_default();
        (text == "$0.93").then_some(text)
    });
    assert_eq!(spent, "$0.93");
    assert_eq!(zone_text(&browser, "daily", "rate"), "1000000");
    assert_eq!(zone_text(&browser, "daily", "burst"), "day (Europe/Berlin)");
    let end = api(&nginx, "zones/daily")["period_end"].as_f64().unwrap();
    assert!(
        !zone_text(&browser, "daily", "period-end").is_empty(),
        "{end}"
    );
    browser.script(
        "const select = document.querySelector('section[data-zone=\"daily\"] select.top-by'); \
         select.value = 'tokens'; select.dispatchEvent(new Event('change')); return null",
    );
    let rows = browser.wait_for("the keys by spend", |b| {
        let rows = b.texts("section[data-zone=\"daily\"] table.top tr");
        (rows.len() == 2 && rows[0].contains("µ$ spent") && rows[1].contains("of")).then_some(rows)
    });
    assert!(
        rows[1].starts_with("team-a 930000") && rows[1].contains("930000 of 1000000"),
        "{rows:?}"
    );
    let request = Request::new("PUT", "/ratelimit/zones/daily/overrides/team-a")
        .json(r#"{"limit": 5000000}"#);
    assert_eq!(send(nginx.port(), &request).status, 201);
    browser.wait_for("the override", |b| {
        let rows = b.texts("section[data-zone=\"daily\"] table.override-list tr");
        rows.iter()
            .any(|row| row.starts_with("team-a limit 5000000"))
            .then_some(())
    });
    browser.script(
        "document.querySelector('section[data-zone=\"daily\"]').scrollIntoView(); return null",
    );
    browser.screenshot(&screenshot_path("dashboard-quota"));
    assert!(
        browser.console_errors().is_empty(),
        "{:?}",
        browser.console_errors()
    );
}
