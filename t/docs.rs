//! The documentation holds together: every relative link and `#anchor` of README.md,
//! CONTRIBUTING.md and docs/*.md resolves (anchors as GitHub makes them from headings), every
//! whole config the pages show (an `http {}` block) passes `nginx -t` (the concurrency
//! example also limits), `ratelimit-replay` builds without nginx, as docs/replay.md says, and
//! `scripts/build-for-nginx.sh` says why a missing binary fails, as docs/install.md says.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::check_config;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md, CONTRIBUTING.md and every page of docs/, relative to the checkout.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![PathBuf::from("README.md"), PathBuf::from("CONTRIBUTING.md")];
    let mut docs: Vec<PathBuf> = fs::read_dir(repo().join("docs"))
        .expect("cannot read docs/")
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .map(|path| Path::new("docs").join(path.file_name().unwrap()))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// The lines of a Markdown text outside fenced code blocks.
fn prose_lines(text: &str) -> Vec<&str> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            lines.push(line);
        }
    }
    lines
}

/// GitHub's anchor for a heading: lowercase, spaces to hyphens, every character but letters,
/// digits, `-` and `_` dropped (backticks, dots, colons, slashes, parentheses, apostrophes).
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a page's headings; a repeated one gets `-1`, `-2`... as on GitHub.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut anchors = BTreeSet::new();
    for line in prose_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(&line[hashes..]);
        let count = seen.entry(base.clone()).or_insert(0);
        anchors.insert(if *count == 0 {
            base.clone()
        } else {
            format!("{base}-{count}")
        });
        *count += 1;
    }
    anchors
}

/// The targets of the inline links and images of a text (`[text](target)`,
/// `![alt](target)`), outside code blocks and code spans.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for line in prose_lines(text) {
        // Code spans hold commands such as `curl '...?[1-12]'`, not links.
        let prose: String = line
            .split('`')
            .enumerate()
            .filter(|(index, _)| index % 2 == 0)
            .map(|(_, part)| part)
            .collect::<Vec<_>>()
            .join(" ");
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            targets.push(rest[..end].trim().to_string());
            rest = &rest[end..];
        }
    }
    targets
}

/// What is wrong with each relative link of `page` (a path from the checkout): a file that
/// does not exist, or an anchor that no heading of its page makes.
fn broken_links(page: &Path, text: &str, read: &dyn Fn(&Path) -> Option<String>) -> Vec<String> {
    let mut broken = Vec::new();
    for target in link_targets(text) {
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (path, anchor) = match target.split_once('#') {
            Some((path, anchor)) => (path, Some(anchor)),
            None => (target.as_str(), None),
        };
        let linked = if path.is_empty() {
            page.to_path_buf()
        } else {
            normalize(&page.parent().unwrap_or(Path::new("")).join(path))
        };
        if !path.is_empty() && !repo().join(&linked).exists() {
            broken.push(format!(
                "{}: ({target}): {} does not exist",
                page.display(),
                linked.display()
            ));
            continue;
        }
        if let Some(anchor) = anchor {
            let Some(linked_text) = read(&linked) else {
                broken.push(format!(
                    "{}: ({target}): an anchor into {}, which is not a page",
                    page.display(),
                    linked.display()
                ));
                continue;
            };
            if !anchors(&linked_text).contains(anchor) {
                broken.push(format!(
                    "{}: ({target}): {} has no heading whose anchor is #{anchor}",
                    page.display(),
                    linked.display()
                ));
            }
        }
    }
    broken
}

/// `docs/../README.md` as `README.md` (the path need not exist).
fn normalize(path: &Path) -> PathBuf {
    let mut parts: Vec<&std::ffi::OsStr> = Vec::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                parts.pop();
            }
            std::path::Component::CurDir => {}
            other => parts.push(other.as_os_str()),
        }
    }
    parts.iter().collect()
}

fn read_page(path: &Path) -> Option<String> {
    if path.extension().is_some_and(|ext| ext == "md") {
        fs::read_to_string(repo().join(path)).ok()
    } else {
        None
    }
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut broken = Vec::new();
    let mut links = 0;
    for page in pages() {
        let text = read_page(&page).unwrap_or_else(|| panic!("cannot read {}", page.display()));
        links += link_targets(&text).len();
        broken.extend(broken_links(&page, &text, &read_page));
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(
        links > 50,
        "only {links} links found: is the link reader broken?"
    );
}

/// The checker itself: GitHub's slugs, repeated headings, code left alone, and a missing
/// file or anchor reported.
#[test]
fn the_link_checker_finds_broken_links() {
    assert_eq!(
        slug("Any installed nginx: `scripts/build-for-nginx.sh`"),
        "any-installed-nginx-scriptsbuild-for-nginxsh"
    );
    assert_eq!(
        slug("Next to OpenResty's Lua module"),
        "next-to-openrestys-lua-module"
    );
    assert_eq!(slug("limit=adaptive"), "limitadaptive");
    let text =
        "# A\n\n## rate_limit_status\n\n## $rate_limit_status\n\n```sh\n# not a heading\n```\n";
    assert_eq!(
        anchors(text),
        ["a", "rate_limit_status", "rate_limit_status-1"]
            .map(String::from)
            .into()
    );
    let page = Path::new("docs/x.md");
    let text = "[ok](#a) [no](#b) [file](../README.md#try-it) [gone](nope.md) \
                [bad](../README.md#nope) `[code](#c)` [web](https://example.com/#x)";
    let read = |path: &Path| -> Option<String> {
        match path.to_str() {
            Some("docs/x.md") => Some("# A\n".to_string()),
            _ => read_page(path),
        }
    };
    let broken = broken_links(page, text, &read);
    assert_eq!(broken.len(), 3, "{broken:#?}");
    assert!(broken[0].contains("#b"), "{broken:#?}");
    assert!(
        broken[1].contains("docs/nope.md does not exist"),
        "{broken:#?}"
    );
    assert!(broken[2].contains("#nope"), "{broken:#?}");
}

/// The `nginx` blocks of the pages that are whole configs (an `http {` line), made runnable
/// here: the module's `load_module` line pointed at the module under test, `events {}` added
/// when missing, each `listen` on a free loopback port.
fn whole_configs() -> Vec<(String, String)> {
    let mut configs = Vec::new();
    for page in pages() {
        let text = read_page(&page).unwrap();
        let mut block: Option<Vec<&str>> = None;
        for line in text.lines() {
            match (&mut block, line.trim_end()) {
                (None, "```nginx") => block = Some(Vec::new()),
                (Some(lines), "```") => {
                    if lines.iter().any(|line| line.starts_with("http {")) {
                        configs.push((page.display().to_string(), runnable(lines)));
                    }
                    block = None;
                }
                (Some(lines), line) => lines.push(line),
                (None, _) => {}
            }
        }
    }
    configs
}

fn runnable(lines: &[&str]) -> String {
    let mut port = 0;
    let mut config = String::from("load_module %%MODULE%%;\n");
    if !lines.iter().any(|line| line.starts_with("events")) {
        config.push_str("events {}\n");
    }
    for line in lines {
        let code = line.split('#').next().unwrap_or_default();
        if code.trim_start().starts_with("load_module") {
            continue;
        }
        if let Some(at) = code.find("listen ") {
            port += 1;
            let placeholder = if port == 1 {
                "%%PORT%%".to_string()
            } else {
                format!("%%PORT{port}%%")
            };
            config.push_str(&format!("{}listen 127.0.0.1:{placeholder};\n", &code[..at]));
            continue;
        }
        // The host's directories stay the host's: nginx -t opens logs (and a state file's
        // directory is written) under the test's prefix instead.
        let line = line
            .replace("/var/log/nginx/", "logs/")
            .replace("/var/lib/nginx/", "");
        config.push_str(&line);
        config.push('\n');
    }
    config
}

/// A config pasted from the README or docs/ (the README's first limit, the directives'
/// example, the concurrency and penalty box examples, the fleet's) is accepted by nginx as
/// it stands: every directive in its context, every upstream it names defined.
#[test]
fn every_whole_config_in_the_docs_passes_nginx_t() {
    let configs = whole_configs();
    let pages: BTreeSet<&str> = configs.iter().map(|(page, _)| page.as_str()).collect();
    for expected in [
        "README.md",
        "docs/directives.md",
        "docs/concurrency.md",
        "docs/abusers.md",
    ] {
        assert!(
            pages.contains(expected),
            "no whole config in {expected}: {pages:?}"
        );
    }
    for (page, config) in &configs {
        let (ok, output) = check_config(config);
        assert!(ok, "{page}: nginx -t refuses\n{config}\n{output}");
    }
}

/// `cargo build -p ratelimit-replay` and `cargo install --path crates/ratelimit-replay`
/// (docs/replay.md) build no nginx: the tool's dependency tree (normal and build
/// dependencies) holds no nginx crate.
#[test]
fn ratelimit_replay_builds_without_nginx() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let output = Command::new(&cargo)
        .current_dir(repo())
        .args([
            "tree",
            "--offline",
            "-p",
            "ratelimit-replay",
            "-e",
            "normal,build",
            "--prefix",
            "none",
        ])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cargo}: {e}"));
    let tree = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(tree.contains("ratelimit-core"), "{tree}");
    let nginx: Vec<&str> = tree
        .lines()
        .filter(|line| line.starts_with("nginx-") || line.starts_with("ngx "))
        .collect();
    assert!(nginx.is_empty(), "ratelimit-replay depends on {nginx:?}");
    // The module itself does (the check can see nginx where it is).
    let module = Command::new(&cargo)
        .current_dir(repo())
        .args([
            "tree",
            "--offline",
            "-p",
            "ngx-rate-limit",
            "-e",
            "normal,build",
        ])
        .args(["--prefix", "none"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cargo}: {e}"));
    assert!(
        String::from_utf8_lossy(&module.stdout)
            .lines()
            .any(|line| line.starts_with("nginx-sys")),
        "the module's tree shows no nginx-sys: the check cannot see it"
    );
}

/// docs/concurrency.md's example limits where it is pasted: its server has no `server_name`
/// (as many pasted configs and every default server), and its zones' key is a constant, so
/// every request counts. Run as printed but for the first zone's limit (`limit=2` without a
/// queue, so that a test reaches it) and the upstream's address: two requests held by the
/// upstream, the third is refused with 429.
#[test]
fn the_concurrency_example_limits_in_a_server_without_server_name() {
    let (_, config) = whole_configs()
        .into_iter()
        .find(|(page, _)| page == "docs/concurrency.md")
        .expect("docs/concurrency.md has no whole config");
    assert!(
        !config
            .lines()
            .any(|line| line.trim_start().starts_with("server_name")),
        "{config}"
    );
    let upstream = common::upstream::Upstream::start();
    let config = config
        .replace("10.0.0.7:8000", &format!("127.0.0.1:{}", upstream.port()))
        .replacen("limit=100 queue=200 queue_timeout=5s", "limit=2", 1);
    assert!(config.contains("limit=2;"), "{config}");
    let nginx = common::Nginx::start(&config);
    let held: Vec<_> = ["a", "b"]
        .iter()
        .map(|name| {
            common::start_request(
                nginx.port(),
                &common::Request::get(&format!("/api/hold/{name}")),
            )
        })
        .collect();
    upstream.wait_arrivals(2, std::time::Duration::from_secs(10));
    let third = common::get(nginx.port(), "/api/hold/c");
    assert_eq!(third.status, 429, "{}", third.text());
    upstream.release_all();
    for request in held {
        assert_eq!(request.finish().status, 200);
    }
}

/// docs/install.md: `scripts/build-for-nginx.sh` refuses a binary that does not exist with
/// the reason and where to find the right one (it used to exit 1 without a word).
#[test]
fn build_for_nginx_says_why_a_missing_binary_fails() {
    let output = Command::new(repo().join("scripts/build-for-nginx.sh"))
        .arg("/nonexistent/sbin/nginx")
        .output()
        .expect("cannot run scripts/build-for-nginx.sh");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("/nonexistent/sbin/nginx does not exist")
            && stderr.contains("command -v nginx"),
        "{stderr}"
    );
    assert!(
        output.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
}
