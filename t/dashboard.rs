//! The dashboard in a real browser: Debian's chromium, headless, driven over WebDriver. The
//! page loads with no console error, shows every zone, its numbers and top keys move after
//! traffic, a rate changed through the page (with its confirmation) changes what nginx
//! admits, and a read-only location shows no control. Screenshots go to target/screenshots/.

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

#[test]
fn dashboard_in_a_real_browser() {
    let nginx = common::admin::dashboard().start();
    nginx.write_file("html/index.html", "ok");
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
    browser.wait_for("the zone's rate", |b| {
        (zone_text(b, "one", "rate") == "1r/m").then_some(())
    });
    assert_eq!(zone_text(&browser, "window", "algorithm"), "sliding_window");
    assert_eq!(zone_text(&browser, "one", "total-rejected"), "0");
    assert_eq!(browser.text(&browser.find("#mode")), "changes allowed");

    // Traffic: the page's totals, chart and top keys follow.
    assert_eq!(
        key_statuses(nginx.port(), "/", "greedy", 5),
        [200, 429, 429, 429, 429]
    );
    assert_eq!(key_statuses(nginx.port(), "/", "modest", 2), [200, 429]);
    browser.wait_for("4 + 1 rejections", |b| {
        (zone_text(b, "one", "total-rejected") == "5").then_some(())
    });
    let top = browser.wait_for("the top keys", |b| {
        let rows = b.texts("section[data-zone=\"one\"] table.top tr");
        (rows.len() == 3).then(|| rows[1..].to_vec())
    });
    assert!(top[0].starts_with("greedy 4"), "{top:?}");
    assert!(top[1].starts_with("modest 1"), "{top:?}");
    // The rejected line rose above the chart's floor at the sample with the traffic.
    browser.wait_for("a rejection on the chart", |b| {
        let line = b.find("section[data-zone=\"one\"] .line-rejected");
        let points = b.attribute(&line, "points").unwrap_or_default();
        let risen = points.split(' ').any(|point| {
            point
                .split(',')
                .nth(1)
                .and_then(|y| y.parse::<f64>().ok())
                .is_some_and(|y| y < 50.0)
        });
        risen.then_some(())
    });
    // ...and is painted in the legend's red.
    let stroke = browser.script(
        "return getComputedStyle(document.querySelector('section[data-zone=\"one\"] .line-rejected')).stroke",
    );
    assert_eq!(stroke, "rgb(198, 40, 40)");
    browser.screenshot(&screenshot_path("dashboard-traffic"));

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
    // One request per microsecond at most: sequential requests over new connections, each
    // far longer than that, all pass now.
    assert_eq!(key_statuses(nginx.port(), "/", "after", 5), [200; 5]);
    browser.screenshot(&screenshot_path("dashboard-changed"));

    // Override a top key from its row, then remove the override, each confirmed.
    let one = "section[data-zone=\"one\"]";
    browser.click(&browser.find(&format!("{one} table.top .limit-key")));
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
    browser.click(&browser.find(&format!("{one} table.override-list .remove-override")));
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
        .locations(
            "location / { rate_limit zone=login nodelay; }\n\
             location /ratelimit/ { rate_limit_admin write=on; }",
        )
        .start();
    assert_eq!(
        key_statuses(nginx.port(), "/", "mallory", 4),
        [200, 429, 429, 429]
    );
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
    browser.click(&browser.find(&format!("{login} .release")));
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
    assert!(
        browser.console_errors().is_empty(),
        "{:?}",
        browser.console_errors()
    );
}
