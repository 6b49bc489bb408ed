//! `--plot FILE.svg`: the replay drawn per key, so that a calibration can be seen. Each key
//! gets a panel: its requests over time as ticks on three rows (passed, delayed, rejected),
//! and the bucket's level (the decision's excess, as limit_req logs it) as a step line
//! against a dashed line at the burst. With many keys, the ones with the most requests are
//! drawn ([`MAX_KEYS`]).
//!
//! Plain SVG written as text: no plotting library. Key text is escaped, so any key gives a
//! valid document.

use std::collections::HashMap;
use std::fmt::Write;

use ratelimit_core::{Decision, Outcome};

/// Keys drawn at most.
pub const MAX_KEYS: usize = 8;

const WIDTH: f64 = 900.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 20.0;
const PANEL_HEIGHT: f64 = 170.0;
const TICKS_TOP: f64 = 28.0;
const ROW: f64 = 14.0;
const LEVEL_TOP: f64 = TICKS_TOP + 3.0 * ROW + 10.0;
const LEVEL_HEIGHT: f64 = 70.0;

/// One decided request.
#[derive(Clone, Copy, Debug)]
struct Point {
    time_ns: u64,
    outcome: Outcome,
    excess_milli: u64,
}

/// The requests of a replay, gathered as they are decided.
#[derive(Debug, Default)]
pub struct Plot {
    keys: Vec<(String, Vec<Point>)>,
    index: HashMap<String, usize>,
}

impl Plot {
    /// Note one decided request.
    pub fn add(&mut self, key: &str, time_ns: u64, decision: &Decision) {
        let position = *self.index.entry(key.to_string()).or_insert_with(|| {
            self.keys.push((key.to_string(), Vec::new()));
            self.keys.len() - 1
        });
        self.keys[position].1.push(Point {
            time_ns,
            outcome: decision.outcome,
            excess_milli: decision.excess_milli,
        });
    }

    /// The SVG document: `title` on top, one panel per key drawn, `burst` as the level's limit.
    pub fn render(&self, title: &str, burst: u64) -> String {
        let mut keys: Vec<&(String, Vec<Point>)> = self.keys.iter().collect();
        // Most requests first; the input order among equals.
        keys.sort_by_key(|(_, points)| std::cmp::Reverse(points.len()));
        let hidden = keys.len().saturating_sub(MAX_KEYS);
        keys.truncate(MAX_KEYS);
        let all = self.keys.iter().flat_map(|(_, points)| points);
        let start = all.clone().map(|p| p.time_ns).min().unwrap_or(0);
        let end = all.map(|p| p.time_ns).max().unwrap_or(0).max(start + 1);
        let axis = Axis { start, end };

        let height = 40.0 + PANEL_HEIGHT * keys.len().max(1) as f64 + 20.0;
        let mut svg = String::new();
        let _ = writeln!(
            svg,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" \
             viewBox=\"0 0 {WIDTH} {height}\" font-family=\"sans-serif\" font-size=\"11\">"
        );
        let _ = writeln!(svg, "<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>");
        let mut heading = escape(title);
        if hidden > 0 {
            let _ = write!(heading, " ({hidden} keys with fewer requests not drawn)");
        }
        let _ = writeln!(
            svg,
            "<text x=\"{LEFT}\" y=\"22\" font-size=\"14\">{heading}</text>"
        );
        for (number, (key, points)) in keys.iter().enumerate() {
            let top = 40.0 + PANEL_HEIGHT * number as f64;
            panel(&mut svg, key, points, top, &axis, burst);
        }
        svg.push_str("</svg>\n");
        svg
    }
}

/// Maps times onto the drawing's width.
struct Axis {
    start: u64,
    end: u64,
}

impl Axis {
    fn x(&self, time_ns: u64) -> f64 {
        let span = (self.end - self.start) as f64;
        LEFT + (WIDTH - LEFT - RIGHT) * (time_ns - self.start) as f64 / span
    }
}

fn panel(svg: &mut String, key: &str, points: &[Point], top: f64, axis: &Axis, burst: u64) {
    let right = WIDTH - RIGHT;
    let _ = writeln!(
        svg,
        "<g class=\"key\" data-key=\"{}\" transform=\"translate(0 {top})\">",
        escape(key)
    );
    let _ = writeln!(
        svg,
        "<text x=\"{LEFT}\" y=\"12\" font-weight=\"bold\">{}</text>",
        escape(key)
    );
    let rows = [
        (Outcome::Passed, "passed", "#2e7d32"),
        (Outcome::Delayed, "delayed", "#e69500"),
        (Outcome::Rejected, "rejected", "#c62828"),
    ];
    for (row, (_, name, color)) in rows.iter().enumerate() {
        let y = TICKS_TOP + ROW * row as f64;
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\" fill=\"{color}\">{name}</text>\
             <line x1=\"{LEFT}\" y1=\"{y}\" x2=\"{right}\" y2=\"{y}\" stroke=\"#eee\"/>",
            LEFT - 6.0,
            y + 4.0
        );
    }
    for point in points {
        let Some(row) = rows
            .iter()
            .position(|(outcome, ..)| *outcome == point.outcome)
        else {
            continue;
        };
        let (_, name, color) = rows[row];
        let (x, y) = (axis.x(point.time_ns), TICKS_TOP + ROW * row as f64);
        let _ = writeln!(
            svg,
            "<line class=\"request {name}\" data-t=\"{}\" x1=\"{x:.2}\" y1=\"{:.1}\" \
             x2=\"{x:.2}\" y2=\"{:.1}\" stroke=\"{color}\" stroke-width=\"1.5\"/>",
            seconds_text(point.time_ns),
            y - 5.0,
            y + 5.0
        );
    }
    level(svg, points, axis, burst);
    let _ = writeln!(
        svg,
        "<text x=\"{LEFT}\" y=\"{}\" fill=\"#555\">{} s</text>\
         <text x=\"{right}\" y=\"{}\" text-anchor=\"end\" fill=\"#555\">{} s</text>",
        LEVEL_TOP + LEVEL_HEIGHT + 14.0,
        seconds_text(axis.start),
        LEVEL_TOP + LEVEL_HEIGHT + 14.0,
        seconds_text(axis.end)
    );
    svg.push_str("</g>\n");
}

/// The level after each request as a step line, and the burst as a dashed line. A rejected
/// request changes no state: the line stays where it was (its excess is what it would have
/// made the level).
fn level(svg: &mut String, points: &[Point], axis: &Axis, burst: u64) {
    let charged = || points.iter().filter(|p| p.outcome != Outcome::Rejected);
    let top_milli = charged()
        .map(|p| p.excess_milli)
        .max()
        .unwrap_or(0)
        .max(burst * 1000)
        .max(1000);
    let y = |milli: u64| LEVEL_TOP + LEVEL_HEIGHT * (1.0 - milli as f64 / top_milli as f64);
    let bottom = y(0);
    let right = WIDTH - RIGHT;
    let _ = writeln!(
        svg,
        "<line x1=\"{LEFT}\" y1=\"{bottom:.1}\" x2=\"{right}\" y2=\"{bottom:.1}\" stroke=\"#999\"/>\
         <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#555\">level</text>",
        LEFT - 6.0,
        bottom
    );
    let burst_y = y(burst * 1000);
    let _ = writeln!(
        svg,
        "<line class=\"burst\" data-burst=\"{burst}\" x1=\"{LEFT}\" y1=\"{burst_y:.1}\" \
         x2=\"{right}\" y2=\"{burst_y:.1}\" stroke=\"#c62828\" stroke-dasharray=\"4 3\"/>\
         <text x=\"{right}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#c62828\">burst {burst}</text>",
        burst_y - 3.0
    );
    let mut path = String::new();
    let mut last_y = bottom;
    for (index, point) in charged().enumerate() {
        let x = axis.x(point.time_ns);
        let next_y = y(point.excess_milli);
        if index == 0 {
            let _ = write!(path, "M{x:.2},{next_y:.1}");
        } else {
            let _ = write!(path, " H{x:.2} V{next_y:.1}");
        }
        last_y = next_y;
    }
    if !path.is_empty() {
        let _ = writeln!(
            svg,
            "<path class=\"level\" d=\"{path} H{right}\" data-last=\"{last_y:.1}\" fill=\"none\" \
             stroke=\"#4a78b5\" stroke-width=\"1.5\"/>"
        );
    }
}

/// Seconds with up to three decimals, trailing zeros dropped: `0.25`, `3`.
fn seconds_text(time_ns: u64) -> String {
    let millis = time_ns / 1_000_000;
    let text = format!("{}.{:03}", millis / 1000, millis % 1000);
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Text safe inside an element or a double-quoted attribute.
fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&apos;"),
            // XML 1.0 allows no other control characters.
            c if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') => escaped.push('\u{fffd}'),
            c => escaped.push(c),
        }
    }
    escaped
}
