//! `--plot FILE.svg`: a valid SVG document (read back with an XML parser) that shows the
//! decisions of a known timeline, per key, and the level against the burst.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// Run the binary with `--plot` on `timeline`; the SVG text.
fn plot(name: &str, args: &[&str], timeline: &str) -> String {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}.svg"));
    let _ = std::fs::remove_file(&path);
    let mut child = Command::new(env!("CARGO_BIN_EXE_ratelimit-replay"))
        .args(args)
        .arg("--plot")
        .arg(&path)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(timeline.as_bytes()).unwrap();
    drop(stdin);
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::read_to_string(&path).expect("the plot was written")
}

/// `(key, [(t, decision)])` of each key panel, in drawing order.
fn decisions(document: &roxmltree::Document) -> Vec<(String, Vec<(String, String)>)> {
    document
        .descendants()
        .filter(|node| node.attribute("class") == Some("key"))
        .map(|panel| {
            let requests = panel
                .descendants()
                .filter_map(|node| {
                    let class = node.attribute("class")?;
                    let decision = class.strip_prefix("request ")?;
                    Some((node.attribute("data-t")?.to_string(), decision.to_string()))
                })
                .collect();
            (panel.attribute("data-key").unwrap().to_string(), requests)
        })
        .collect()
}

const TIMELINE: &str = "\
0 alice
0 alice
0 alice
0.25 bob
0.5 alice
";

#[test]
fn a_known_timeline_is_drawn_per_key() {
    let svg = plot("known", &["--zone", "rate=2r/s burst=1"], TIMELINE);
    let document = roxmltree::Document::parse(&svg).expect("valid XML");
    let root = document.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    assert_eq!(
        root.tag_name().namespace(),
        Some("http://www.w3.org/2000/svg")
    );
    let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
        list.iter()
            .map(|(t, d)| (t.to_string(), d.to_string()))
            .collect()
    };
    // The same decisions as the table (tests/cli.rs, table_with_summary).
    assert_eq!(
        decisions(&document),
        [
            (
                "alice".to_string(),
                pairs(&[
                    ("0", "passed"),
                    ("0", "delayed"),
                    ("0", "rejected"),
                    ("0.5", "delayed")
                ])
            ),
            ("bob".to_string(), pairs(&[("0.25", "passed")])),
        ]
    );
    // Each panel has its level line and the burst it is measured against.
    let bursts: Vec<&str> = document
        .descendants()
        .filter(|node| node.attribute("class") == Some("burst"))
        .filter_map(|node| node.attribute("data-burst"))
        .collect();
    assert_eq!(bursts, ["1", "1"]);
    let levels = document
        .descendants()
        .filter(|node| node.attribute("class") == Some("level"))
        .count();
    assert_eq!(levels, 2);
    // The title says which limit was replayed.
    assert!(svg.contains("rate=2r/s burst=1 algorithm=leaky_bucket"));
}

#[test]
fn any_key_text_gives_valid_xml_and_many_keys_are_cut_to_the_busiest() {
    let mut timeline = String::new();
    // Key k<n> sends n + 1 requests; one key is full of XML's special characters.
    for n in 0..12 {
        for _ in 0..=n {
            timeline.push_str(&format!("{n} k{n}\n"));
        }
    }
    timeline.push_str("20 a<b&\"c'>\n");
    let svg = plot("many", &["--zone", "rate=1r/s burst=2"], &timeline);
    let document = roxmltree::Document::parse(&svg).expect("valid XML");
    let keys: Vec<String> = decisions(&document)
        .into_iter()
        .map(|(key, _)| key)
        .collect();
    assert_eq!(keys, ["k11", "k10", "k9", "k8", "k7", "k6", "k5", "k4"]);
    assert!(svg.contains("(5 keys with fewer requests not drawn)"));

    let svg = plot(
        "special",
        &["--zone", "rate=1r/s"],
        "0 a<b&\"c'>\n1 a<b&\"c'>\n",
    );
    let document = roxmltree::Document::parse(&svg).expect("valid XML");
    assert_eq!(decisions(&document)[0].0, "a<b&\"c'>");
}
