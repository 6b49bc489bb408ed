//! What README.md shows is what a newcomer gets: the admin walkthrough's commands, run as
//! written against `nginx-conf/admin.conf`, print the outputs the README shows. And the
//! source's own description of the zone store names the hash the code uses.
//!
//! Needs `curl` (the walkthrough's commands are curl command lines) and the module built by
//! `cargo build`.

mod common;

use std::fs;
use std::path::PathBuf;
use std::process::Command;

use common::Nginx;
use serde_json::Value;

fn repo_file(relative: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(relative);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// The README section that starts with the heading `## NAME`, up to the next `## `.
fn readme_section(readme: &str, name: &str) -> String {
    let heading = format!("\n## {name}\n");
    let start = readme
        .find(&heading)
        .unwrap_or_else(|| panic!("README.md has no \"## {name}\" section"));
    let body = &readme[start + heading.len()..];
    body[..body.find("\n## ").unwrap_or(body.len())].to_string()
}

/// The fenced code blocks of `text` in `language`, each as its lines.
fn code_blocks(text: &str, language: &str) -> Vec<Vec<String>> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<String>> = None;
    for line in text.lines() {
        match (&mut current, line.trim_end()) {
            (None, fence) if fence == format!("```{language}") => current = Some(Vec::new()),
            (Some(_), "```") => blocks.extend(current.take()),
            (Some(block), line) => block.push(line.to_string()),
            (None, _) => {}
        }
    }
    blocks
}

/// One command of a console block and the output shown under it.
struct Step {
    command: String,
    shown: String,
}

fn steps(block: &[String]) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    for line in block {
        if let Some(command) = line.strip_prefix("$ ") {
            steps.push(Step {
                command: command.to_string(),
                shown: String::new(),
            });
        } else {
            let step = steps
                .last_mut()
                .unwrap_or_else(|| panic!("output before the first command: {line:?}"));
            step.shown.push_str(line);
            step.shown.push('\n');
        }
    }
    steps
}

/// Runs a README command line with bash, the example's default ports replaced by the test's.
fn run(command: &str, port: u16, admin_port: u16) -> String {
    let command = command
        .replace("127.0.0.1:8080", &format!("127.0.0.1:{port}"))
        .replace("127.0.0.1:8081", &format!("127.0.0.1:{admin_port}"));
    let output = Command::new("bash")
        .args(["-c", &command])
        .output()
        .unwrap_or_else(|e| panic!("cannot run bash: {e}"));
    assert!(
        output.status.success(),
        "{command}: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("curl printed UTF-8")
}

/// Whether `real` is what the README shows. JSON is compared value by value, except that
/// `*_ms` fields count down while commands run: those need only be zero where the README's are
/// and otherwise within half a second of the README's (the example's rate is 1r/s, so a
/// different decision would differ by a whole second).
fn same_output(shown: &str, real: &str) -> bool {
    match (
        serde_json::from_str::<Value>(shown),
        serde_json::from_str::<Value>(real),
    ) {
        (Ok(shown), Ok(real)) => same_json("", &shown, &real),
        _ => shown.trim_end() == real.trim_end(),
    }
}

fn same_json(name: &str, shown: &Value, real: &Value) -> bool {
    match (shown, real) {
        (Value::Object(shown), Value::Object(real)) => {
            shown.len() == real.len()
                && shown
                    .iter()
                    .all(|(key, value)| real.get(key).is_some_and(|r| same_json(key, value, r)))
        }
        (Value::Number(shown), Value::Number(real)) if name.ends_with("_ms") => {
            let (shown, real) = (shown.as_i64().unwrap_or(-1), real.as_i64().unwrap_or(-1));
            (shown == 0) == (real == 0) && shown.abs_diff(real) < 500
        }
        _ => shown == real,
    }
}

#[test]
fn readme_admin_walkthrough_prints_what_it_shows() {
    let readme = repo_file("README.md");
    let section = readme_section(&readme, "Admin API");
    let start = code_blocks(&section, "sh");
    assert!(
        start.iter().any(|block| block
            .iter()
            .any(|line| line.trim() == "scripts/run-example.sh nginx-conf/admin.conf")),
        "the Admin API section does not say how to start nginx-conf/admin.conf"
    );
    let blocks = code_blocks(&section, "console");
    assert!(
        blocks.len() >= 3,
        "the walkthrough has {} console blocks",
        blocks.len()
    );

    // As scripts/run-example.sh runs it as root: workers as root write the state file.
    let config = format!("user root;\n{}", repo_file("nginx-conf/admin.conf"));
    let nginx = Nginx::start(&config);
    // No request of our own first: the walkthrough's first request is the key's first.
    let (port, admin_port) = (nginx.port(), nginx.port_n(2));

    let mut commands = 0;
    for block in &blocks {
        for step in steps(block) {
            let real = run(&step.command, port, admin_port);
            assert!(
                same_output(&step.shown, &real),
                "README.md shows for `{}`:\n{}\nbut it printed:\n{real}\nerror.log:\n{}",
                step.command,
                step.shown,
                nginx.error_log()
            );
            commands += 1;
        }
    }
    assert!(commands >= 6, "only {commands} commands in the walkthrough");
    // The changes were persisted where the README says.
    let state = fs::read_to_string(nginx.prefix().join("rate_limit_state.json"))
        .expect("the walkthrough's changes were not written to rate_limit_state.json");
    assert!(state.contains("per_client"), "{state}");
}

/// The comparison is strict where it must be: a different status list, a different field
/// value or a `_ms` field a whole second away is a difference.
#[test]
fn walkthrough_comparison_notices_differences() {
    assert!(same_output("200 429\n", "200 429 \n"));
    assert!(!same_output("200 429\n", "200 200\n"));
    let shown = r#"{"remaining": 0, "retry_after_ms": 980, "reset_ms": 10980}"#;
    assert!(same_output(
        shown,
        r#"{"remaining": 0, "retry_after_ms": 975, "reset_ms": 10975}"#
    ));
    assert!(!same_output(
        shown,
        r#"{"remaining": 1, "retry_after_ms": 975, "reset_ms": 10975}"#
    ));
    assert!(!same_output(
        shown,
        r#"{"remaining": 0, "retry_after_ms": 0, "reset_ms": 9975}"#
    ));
    assert!(!same_output(
        shown,
        r#"{"remaining": 0, "retry_after_ms": 980}"#
    ));
}

/// The store (`src/store/mod.rs`) opens with how keys are identified: by the hash
/// `Zone::hash_key` computes.
#[test]
fn the_store_describes_the_hash_it_uses() {
    let source = repo_file("src/store/mod.rs");
    let module_doc: String = source
        .lines()
        .take_while(|line| line.starts_with("//!"))
        .collect::<Vec<_>>()
        .join("\n");
    let hash_key = &source[source
        .find("pub fn hash_key")
        .expect("src/store/mod.rs has no hash_key")..];
    let body = &hash_key[..hash_key.find("\n    }").unwrap_or(hash_key.len())];
    assert!(
        body.contains("foldhash::"),
        "hash_key no longer uses foldhash: update this test and the module doc:\n{body}"
    );
    assert!(
        module_doc.contains("foldhash"),
        "src/store/mod.rs's opening comment does not say keys are hashed with foldhash:\n{module_doc}"
    );
    for other in ["SipHash", "siphash", "FxHash", "ahash", "xxhash"] {
        assert!(
            !module_doc.contains(other),
            "src/store/mod.rs's opening comment names {other}"
        );
    }
}
