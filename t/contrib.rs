//! contrib/: the Grafana dashboard and the Prometheus alert rules query only metrics (and
//! `outcome` label values) that a real nginx with the module exports on its admin location.

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;

use common::{get, Request};
use serde_json::Value;

/// One worker, a zone on `/` and a read-only admin location; a sync zone, so that the
/// rate_limit_sync_* families are exported (nothing listens on the Redis port, and nginx runs
/// in the on_failure mode).
fn config() -> common::Config {
    common::config()
        .workers(1)
        .error_log("notice")
        .http("rate_limit_zone $http_x_key zone=one:1m rate=1r/m;")
        .http("rate_limit_sync redis://127.0.0.1:%%PORT2%% interval=100ms;")
        .http("rate_limit_zone $http_x_key zone=fleet:1m rate=1r/m sync;")
        .locations("location / { rate_limit zone=one nodelay; }")
        .locations("location /ratelimit/ { rate_limit_admin; }")
}

fn contrib(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("contrib")
        .join(path)
}

/// Every string under an `expr` key, or a `query` key (Grafana's template variables), at any
/// depth.
fn queries(value: &Value, found: &mut Vec<String>) {
    match value {
        Value::Object(fields) => {
            for (name, field) in fields {
                match (name.as_str(), field) {
                    ("expr" | "query", Value::String(text)) => found.push(text.clone()),
                    _ => queries(field, found),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| queries(item, found)),
        _ => {}
    }
}

/// The metric names a PromQL expression mentions: every `rate_limit_…` identifier.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("rate_limit_") {
        let boundary = rest[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        if boundary {
            names.push(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    names
}

/// The `outcome` values an expression matches on (`outcome="x"`, `outcome=~"a|b"`).
fn outcomes(expr: &str) -> Vec<String> {
    let mut values = Vec::new();
    for part in expr.split("outcome").skip(1) {
        let part = part.trim_start_matches(['=', '~']);
        if let Some(quoted) = part.strip_prefix('"').and_then(|p| p.split('"').next()) {
            values.extend(quoted.split('|').map(str::to_string));
        }
    }
    values
}

#[test]
fn contrib_queries_name_exported_metrics() {
    let nginx = config().start();
    for _ in 0..2 {
        common::send(nginx.port(), &Request::get("/").header("X-Key", "k"));
    }
    let response = get(nginx.port(), "/ratelimit/metrics");
    assert_eq!(response.status, 200);
    let text = response.text();
    let lines = text.lines().map(|line| Ok(line.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("the exposition parses");
    let exported: BTreeSet<&str> = scrape.samples.iter().map(|s| s.metric.as_str()).collect();
    let exported_outcomes: BTreeSet<&str> = scrape
        .samples
        .iter()
        .filter_map(|s| s.labels.get("outcome"))
        .collect();

    let mut files: Vec<(String, Vec<String>)> = Vec::new();
    for entry in std::fs::read_dir(contrib("grafana")).expect("contrib/grafana") {
        let path = entry.expect("entry").path();
        let board: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("read"))
            .unwrap_or_else(|e| panic!("{}: not JSON: {e}", path.display()));
        let mut found = Vec::new();
        queries(&board["panels"], &mut found);
        queries(&board["templating"], &mut found);
        files.push((path.display().to_string(), found));
    }
    let alerts_path = contrib("prometheus/alerts.yml");
    let alerts: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&alerts_path).expect("read alerts"))
            .unwrap_or_else(|e| panic!("alerts.yml: not YAML: {e}"));
    let mut found = Vec::new();
    for group in alerts["groups"].as_array().expect("groups") {
        for rule in group["rules"].as_array().expect("rules") {
            assert!(rule["alert"].is_string(), "a rule without a name: {rule}");
            found.push(rule["expr"].as_str().expect("expr").to_string());
        }
    }
    files.push(("alerts.yml".to_string(), found));

    for (file, exprs) in &files {
        let names: Vec<String> = exprs.iter().flat_map(|e| metric_names(e)).collect();
        assert!(names.len() >= 3, "{file} queries almost nothing: {exprs:?}");
        for name in &names {
            assert!(
                exported.contains(name.as_str()),
                "{file} queries {name}, which the module does not export: {exported:?}"
            );
        }
        for outcome in exprs.iter().flat_map(|e| outcomes(e)) {
            assert!(
                exported_outcomes.contains(outcome.as_str()),
                "{file} matches outcome \"{outcome}\", which no sample has"
            );
        }
    }
}

#[test]
fn the_checks_see_a_wrong_name() {
    assert_eq!(
        metric_names("rate(rate_limit_requests_total{a=\"b\"}[5m]) / x_rate_limit_keys"),
        ["rate_limit_requests_total"]
    );
    assert_eq!(
        outcomes("x{outcome=~\"rejected|delayed\"} + y{outcome=\"passed\"}"),
        ["rejected", "delayed", "passed"]
    );
}
