//! `--plot FILE.svg`: the replay drawn per key, so that a calibration can be seen. Each key
//! gets a panel: its requests over time as ticks on four rows (passed, delayed, rejected,
//! blocked), and under them the key's level over time against the limit it is held to:
//!
//! * buckets: limit_req's excess (requests over the rate), which jumps at each charged
//!   request and drains at the rate in between, against a dashed line at the burst;
//! * `sliding_log`: the requests counted in the sliding window, against N;
//! * `sliding_window`: its estimate (previous window weighted by the part still covered,
//!   plus the current window), against N.
//!
//! The level is drawn exactly: it is linear between the instants where something happens
//! (a request, a bucket running empty, a request leaving the window, a window boundary), and
//! the path has a point at each of them. Blocks (`block=`) are shaded over their duration.
//! The time axis has ticks at round intervals, labelled with the wall-clock time when the
//! input's times are epoch seconds (an access log), or with seconds from the start otherwise.
//!
//! Plain SVG written as text: no plotting library. Key text is escaped, so any key gives a
//! valid document.

use std::collections::HashMap;
use std::fmt::Write;

use ratelimit_core::penalty::Block;
use ratelimit_core::{Algorithm, Outcome, Policy};
use ratelimit_replay::replay::Verdict;

/// Keys drawn at most.
pub const MAX_KEYS: usize = 8;

const WIDTH: f64 = 900.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 20.0;
const PANEL_HEIGHT: f64 = 200.0;
const TICKS_TOP: f64 = 28.0;
const ROW: f64 = 14.0;
const LEVEL_TOP: f64 = TICKS_TOP + 4.0 * ROW + 8.0;
const LEVEL_HEIGHT: f64 = 80.0;
const NANOS_PER_SEC: u64 = 1_000_000_000;
/// Times from this many seconds on are read as epoch seconds (after 2001-09-09).
const EPOCH_FROM_S: u64 = 1_000_000_000;

/// One decided request.
#[derive(Clone, Copy, Debug)]
struct Point {
    time_ns: u64,
    row: Row,
    charged: bool,
    excess_milli: u64,
    block: Option<Block>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Row {
    Passed,
    Delayed,
    Rejected,
    Blocked,
}

const ROWS: [(Row, &str, &str); 4] = [
    (Row::Passed, "passed", "#2e7d32"),
    (Row::Delayed, "delayed", "#e69500"),
    (Row::Rejected, "rejected", "#c62828"),
    (Row::Blocked, "blocked", "#6a1b9a"),
];

/// The requests of a replay, gathered as they are decided.
#[derive(Debug, Default)]
pub struct Plot {
    keys: Vec<(String, Vec<Point>)>,
    index: HashMap<String, usize>,
    /// UTC offset of the input's times (seconds east), for wall-clock labels.
    utc_offset_s: Option<i64>,
}

impl Plot {
    /// Note one decided request; `utc_offset_s` is the offset its time was logged with.
    pub fn add(&mut self, key: &str, time_ns: u64, utc_offset_s: i64, verdict: &Verdict) {
        self.utc_offset_s.get_or_insert(utc_offset_s);
        let position = *self.index.entry(key.to_string()).or_insert_with(|| {
            self.keys.push((key.to_string(), Vec::new()));
            self.keys.len() - 1
        });
        let row = match (verdict.blocked, verdict.decision.outcome) {
            (true, _) => Row::Blocked,
            (false, Outcome::Passed) => Row::Passed,
            (false, Outcome::Delayed) => Row::Delayed,
            (false, Outcome::Rejected) => Row::Rejected,
        };
        self.keys[position].1.push(Point {
            time_ns,
            row,
            charged: verdict.charged,
            excess_milli: verdict.decision.excess_milli,
            block: verdict.block,
        });
    }

    /// How many keys there are and how many are drawn.
    pub fn counts(&self) -> (usize, usize) {
        (self.keys.len(), self.keys.len().min(MAX_KEYS))
    }

    /// The SVG document: `title` on top, one panel per key drawn, levels held to `policy`.
    pub fn render(&self, title: &str, policy: &Policy) -> String {
        let mut keys: Vec<&(String, Vec<Point>)> = self.keys.iter().collect();
        // Most requests first; the input order among equals.
        keys.sort_by_key(|(_, points)| std::cmp::Reverse(points.len()));
        let hidden = keys.len().saturating_sub(MAX_KEYS);
        keys.truncate(MAX_KEYS);
        let all = self.keys.iter().flat_map(|(_, points)| points);
        let start = all.clone().map(|p| p.time_ns).min().unwrap_or(0);
        let last = all.map(|p| p.time_ns).max().unwrap_or(0);
        // A little room after the last request so that its level can be seen draining.
        let end = last
            .saturating_add((last - start) / 20)
            .max(start + NANOS_PER_SEC);
        let axis = Axis {
            start,
            end,
            wall_offset_s: (start / NANOS_PER_SEC >= EPOCH_FROM_S)
                .then(|| self.utc_offset_s.unwrap_or(0)),
        };

        let height = 40.0 + PANEL_HEIGHT * keys.len().max(1) as f64 + 24.0;
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
            panel(&mut svg, key, points, top, &axis, policy);
        }
        let _ = writeln!(
            svg,
            "<text class=\"axis-caption\" x=\"{}\" y=\"{}\" text-anchor=\"end\" \
             fill=\"#555\">{}</text>",
            WIDTH - RIGHT,
            height - 6.0,
            escape(&axis.caption())
        );
        svg.push_str("</svg>\n");
        svg
    }
}

/// Maps times onto the drawing's width and labels them.
struct Axis {
    start: u64,
    end: u64,
    /// `Some(offset)`: the times are epoch seconds, labelled as wall-clock time at that UTC
    /// offset; `None`: seconds from the start.
    wall_offset_s: Option<i64>,
}

/// Round tick intervals, in seconds.
const TICK_STEPS_S: [f64; 22] = [
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0,
    120.0, 300.0, 600.0, 1800.0, 3600.0, 86_400.0,
];

impl Axis {
    fn x(&self, time_ns: u64) -> f64 {
        let span = (self.end - self.start) as f64;
        let time_ns = time_ns.clamp(self.start, self.end);
        LEFT + (WIDTH - LEFT - RIGHT) * (time_ns - self.start) as f64 / span
    }

    /// Tick times (ns) at a round interval, at most about eight, and the interval in seconds.
    fn ticks(&self) -> (Vec<u64>, f64) {
        let span_s = (self.end - self.start) as f64 / 1e9;
        let step_s = TICK_STEPS_S
            .iter()
            .copied()
            .find(|step| span_s / step <= 8.0)
            .unwrap_or_else(|| (span_s / 8.0 / 86_400.0).ceil() * 86_400.0);
        let step_ns = (step_s * 1e9).round().max(1.0) as u64;
        // Wall-clock ticks fall on round local times; relative ones on round offsets.
        let origin = match self.wall_offset_s {
            Some(offset) => {
                let shift = offset.rem_euclid(86_400) as u64 * NANOS_PER_SEC;
                let local = self.start + shift;
                local.div_ceil(step_ns) * step_ns - shift
            }
            None => self.start,
        };
        let mut ticks = Vec::new();
        let mut tick = origin;
        while tick <= self.end && ticks.len() < 20 {
            ticks.push(tick);
            tick += step_ns;
        }
        (ticks, step_s)
    }

    fn label(&self, time_ns: u64, step_s: f64) -> String {
        match self.wall_offset_s {
            Some(offset) => {
                let local_ns = time_ns as i128 + i128::from(offset) * 1_000_000_000;
                let local_s = local_ns.div_euclid(1_000_000_000) as i64;
                let millis = (local_ns.rem_euclid(1_000_000_000) / 1_000_000) as i64;
                let day_s = local_s.rem_euclid(86_400);
                let (h, m, s) = (day_s / 3600, day_s / 60 % 60, day_s % 60);
                if step_s >= 86_400.0 {
                    let (year, month, day) = civil_from_days(local_s.div_euclid(86_400));
                    format!("{year:04}-{month:02}-{day:02}")
                } else if step_s >= 60.0 {
                    format!("{h:02}:{m:02}")
                } else if step_s >= 1.0 {
                    format!("{h:02}:{m:02}:{s:02}")
                } else {
                    format!("{h:02}:{m:02}:{s:02}.{millis:03}")
                }
            }
            None => {
                let seconds = (time_ns - self.start) as f64 / 1e9;
                let decimals = if step_s >= 1.0 {
                    0
                } else {
                    (-step_s.log10()).ceil() as usize
                };
                format!("{seconds:.decimals$} s")
            }
        }
    }

    /// What the axis shows: `time (UTC+01:00), from 2026-12-01 18:35:53` or `seconds from
    /// the first request`.
    fn caption(&self) -> String {
        match self.wall_offset_s {
            Some(offset) => {
                let local_s = (self.start / NANOS_PER_SEC) as i64 + offset;
                let (year, month, day) = civil_from_days(local_s.div_euclid(86_400));
                let day_s = local_s.rem_euclid(86_400);
                let zone = if offset == 0 {
                    "UTC".to_string()
                } else {
                    let sign = if offset < 0 { '-' } else { '+' };
                    let minutes = offset.abs() / 60;
                    format!("UTC{sign}{:02}:{:02}", minutes / 60, minutes % 60)
                };
                format!(
                    "time ({zone}), from {year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
                    day_s / 3600,
                    day_s / 60 % 60,
                    day_s % 60
                )
            }
            None => "seconds from the first request".to_string(),
        }
    }
}

/// The civil date of a day counted from 1970-01-01 (proleptic Gregorian, 400-year eras).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_from_march + 2) / 5 + 1) as u32;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn panel(svg: &mut String, key: &str, points: &[Point], top: f64, axis: &Axis, policy: &Policy) {
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
    for (row, (_, name, color)) in ROWS.iter().enumerate() {
        let y = TICKS_TOP + ROW * row as f64;
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\" fill=\"{color}\">{name}</text>\
             <line x1=\"{LEFT}\" y1=\"{y}\" x2=\"{right}\" y2=\"{y}\" stroke=\"#eee\"/>",
            LEFT - 6.0,
            y + 4.0
        );
    }
    // Blocks first, so that ticks and the level are drawn over them.
    for block in points.iter().filter_map(|point| point.block) {
        let (x1, x2) = (axis.x(block.since_ns), axis.x(block.until_ns));
        let _ = writeln!(
            svg,
            "<rect class=\"block\" data-level=\"{}\" x=\"{x1:.2}\" y=\"{}\" width=\"{:.2}\" \
             height=\"{}\" fill=\"#6a1b9a\" fill-opacity=\"0.08\"/>",
            block.level,
            TICKS_TOP - 7.0,
            (x2 - x1).max(0.5),
            LEVEL_TOP + LEVEL_HEIGHT - TICKS_TOP + 7.0
        );
    }
    for point in points {
        let Some(row) = ROWS.iter().position(|(r, ..)| *r == point.row) else {
            continue;
        };
        let (_, name, color) = ROWS[row];
        let (x, y) = (axis.x(point.time_ns), TICKS_TOP + ROW * row as f64);
        // A request let through without being counted (on_status) is drawn pale.
        let opacity = if point.charged || point.row != Row::Passed {
            "1"
        } else {
            "0.35"
        };
        let _ = writeln!(
            svg,
            "<line class=\"request {name}\" data-t=\"{}\" data-charged=\"{}\" x1=\"{x:.2}\" \
             y1=\"{:.1}\" x2=\"{x:.2}\" y2=\"{:.1}\" stroke=\"{color}\" stroke-opacity=\"{opacity}\" \
             stroke-width=\"1.5\"/>",
            seconds_text(point.time_ns),
            point.charged,
            y - 5.0,
            y + 5.0
        );
    }
    level(svg, points, axis, policy);
    time_axis(svg, axis);
    svg.push_str("</g>\n");
}

fn time_axis(svg: &mut String, axis: &Axis) {
    let y = LEVEL_TOP + LEVEL_HEIGHT;
    let (ticks, step_s) = axis.ticks();
    for tick in ticks {
        let x = axis.x(tick);
        let _ = writeln!(
            svg,
            "<line x1=\"{x:.2}\" y1=\"{y}\" x2=\"{x:.2}\" y2=\"{}\" stroke=\"#999\"/>\
             <text class=\"tick\" x=\"{x:.2}\" y=\"{}\" text-anchor=\"middle\" \
             fill=\"#555\">{}</text>",
            y + 4.0,
            y + 15.0,
            escape(&axis.label(tick, step_s))
        );
    }
}

/// The key's level (in 1/1000 requests) just before and just after each instant where it
/// changes course, as `(time, before, after)`.
fn level_course(points: &[Point], policy: &Policy, end_ns: u64) -> Vec<(u64, f64, f64)> {
    let charged: Vec<&Point> = points.iter().filter(|p| p.charged).collect();
    let cost = policy.cost.max(1) as f64 * 1000.0;
    let mut course = Vec::new();
    match policy.algorithm {
        Algorithm::LeakyBucket | Algorithm::TokenBucket => {
            // Drains 1000 per emission interval.
            let interval = policy.limits.rate.interval_ns().max(1) as f64;
            let mut last: Option<(u64, f64)> = None;
            let drained = |last: Option<(u64, f64)>, t: u64| match last {
                Some((at, level)) => (level - (t - at) as f64 * 1000.0 / interval).max(0.0),
                None => 0.0,
            };
            for point in &charged {
                if let Some((at, level)) = last {
                    let empty_at = at.saturating_add((level * interval / 1000.0) as u64);
                    if level > 0.0 && empty_at < point.time_ns {
                        course.push((empty_at, 0.0, 0.0));
                    }
                }
                let before = drained(last, point.time_ns);
                let after = point.excess_milli as f64;
                course.push((point.time_ns, before, after));
                last = Some((point.time_ns, after));
            }
            if let Some((at, level)) = last {
                let empty_at = at.saturating_add((level * interval / 1000.0) as u64);
                if level > 0.0 && empty_at < end_ns {
                    course.push((empty_at, 0.0, 0.0));
                }
                let left = drained(last, end_ns);
                course.push((end_ns, left, left));
            }
        }
        Algorithm::SlidingLog => {
            // +cost when a request is counted, -cost when it leaves the window.
            let window = policy.limits.rate.window_ns().max(1);
            let mut events: Vec<(u64, f64)> = Vec::new();
            for point in &charged {
                events.push((point.time_ns, cost));
                events.push((point.time_ns.saturating_add(window), -cost));
            }
            events.sort_by_key(|&(t, _)| t);
            let mut level = 0.0;
            for (t, change) in events {
                if t > end_ns {
                    break;
                }
                let before = level;
                level += change;
                match course.last_mut() {
                    Some((at, _, after)) if *at == t => *after = level,
                    _ => course.push((t, before, level)),
                }
            }
            course.push((end_ns, level, level));
        }
        // Never plotted: a replay refuses concurrency zones.
        Algorithm::Concurrency | Algorithm::Quota(_) => {}
        Algorithm::SlidingWindow => {
            // prev × (uncovered part of the window) + cur: linear within a window.
            let window = policy.limits.rate.window_ns().max(1);
            let mut counts: HashMap<u64, f64> = HashMap::new();
            let mut instants: Vec<u64> = Vec::new();
            for point in &charged {
                let index = point.time_ns / window;
                instants.push(point.time_ns);
                for boundary in [index + 1, index + 2] {
                    instants.push(boundary.saturating_mul(window));
                }
            }
            instants.push(end_ns);
            instants.sort_unstable();
            instants.dedup();
            let mut next = charged.iter().peekable();
            let estimate = |counts: &HashMap<u64, f64>, t: u64| {
                let index = t / window;
                let previous = index
                    .checked_sub(1)
                    .and_then(|i| counts.get(&i))
                    .copied()
                    .unwrap_or(0.0);
                let current = counts.get(&index).copied().unwrap_or(0.0);
                let uncovered = (window - t % window) as f64 / window as f64;
                previous * uncovered + current
            };
            for t in instants.into_iter().filter(|&t| t <= end_ns) {
                let before = estimate(&counts, t);
                while let Some(point) = next.next_if(|p| p.time_ns == t) {
                    *counts.entry(point.time_ns / window).or_default() += cost;
                }
                course.push((t, before, estimate(&counts, t)));
            }
        }
    }
    course
}

/// The level as a path through [`level_course`], and the limit as a dashed line: the burst
/// for the buckets (limit_req rejects above it), N requests per window for the sliding
/// algorithms.
fn level(svg: &mut String, points: &[Point], axis: &Axis, policy: &Policy) {
    let course = level_course(points, policy, axis.end);
    let (limit_milli, limit_name, limit_class) = match policy.algorithm {
        Algorithm::LeakyBucket | Algorithm::TokenBucket => {
            let burst = policy.limits.burst;
            (burst * 1000, format!("burst {burst}"), "burst")
        }
        Algorithm::SlidingLog | Algorithm::SlidingWindow => {
            let n = policy.limits.rate.whole_requests().unwrap_or(1);
            (n * 1000, format!("limit {n} per window"), "burst")
        }
        // Never plotted: a replay refuses concurrency zones.
        Algorithm::Concurrency | Algorithm::Quota(_) => (0, String::new(), "burst"),
    };
    let top_milli = course
        .iter()
        .map(|&(_, before, after)| before.max(after))
        .fold(0.0, f64::max)
        .max(limit_milli as f64)
        .max(1000.0);
    let y = |milli: f64| LEVEL_TOP + LEVEL_HEIGHT * (1.0 - milli / top_milli);
    let bottom = y(0.0);
    let right = WIDTH - RIGHT;
    let _ = writeln!(
        svg,
        "<line x1=\"{LEFT}\" y1=\"{bottom:.1}\" x2=\"{right}\" y2=\"{bottom:.1}\" stroke=\"#999\"/>\
         <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#555\">level</text>",
        LEFT - 6.0,
        bottom
    );
    let limit_y = y(limit_milli as f64);
    let _ = writeln!(
        svg,
        "<line class=\"{limit_class}\" data-burst=\"{}\" x1=\"{LEFT}\" y1=\"{limit_y:.1}\" \
         x2=\"{right}\" y2=\"{limit_y:.1}\" stroke=\"#c62828\" stroke-dasharray=\"4 3\"/>\
         <text x=\"{right}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#c62828\">{limit_name}</text>",
        limit_milli / 1000,
        limit_y - 3.0
    );
    let mut path = String::new();
    let mut last_y = bottom;
    for &(t, before, after) in &course {
        let x = axis.x(t);
        let command = if path.is_empty() { 'M' } else { 'L' };
        let _ = write!(
            path,
            "{command}{x:.2},{:.1} L{x:.2},{:.1} ",
            y(before),
            y(after)
        );
        last_y = y(after);
    }
    if !path.is_empty() {
        let _ = writeln!(
            svg,
            "<path class=\"level\" d=\"{}\" data-last=\"{last_y:.1}\" fill=\"none\" \
             stroke=\"#4a78b5\" stroke-width=\"1.5\"/>",
            path.trim_end()
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

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimit_core::{DelayMode, Limits, Rate};

    fn policy(algorithm: Algorithm, rate: &str, burst: u64) -> Policy {
        Policy {
            algorithm,
            limits: Limits {
                rate: Rate::parse(rate).unwrap(),
                burst,
            },
            delay: DelayMode::NoDelay,
            cost: 1,
        }
    }

    fn point(time_ms: u64, excess_milli: u64) -> Point {
        Point {
            time_ns: time_ms * 1_000_000,
            row: Row::Passed,
            charged: true,
            excess_milli,
            block: None,
        }
    }

    const MS: u64 = 1_000_000;

    /// A client loading a page every 2 s at 5r/s: the level drains to zero between loads
    /// (the old plot held it at the last value).
    #[test]
    fn bucket_levels_drain_between_requests() {
        let policy = policy(Algorithm::LeakyBucket, "5r/s", 10);
        // Three at once (excess 0, 1, 2), then one 2 s later.
        let points = [point(0, 0), point(0, 1000), point(0, 2000), point(2000, 0)];
        let course = level_course(&points, &policy, 3000 * MS);
        // 2000 milli drains at 1000 per 200 ms: empty at 400 ms.
        assert_eq!(course[3], (400 * MS, 0.0, 0.0));
        assert_eq!(course[4], (2000 * MS, 0.0, 0.0));
        assert_eq!(course.last(), Some(&(3000 * MS, 0.0, 0.0)));
        // Half-way it is half.
        let policy = policy_with(Algorithm::LeakyBucket, "1r/s");
        let course = level_course(&[point(0, 4000)], &policy, 2000 * MS);
        assert_eq!(course.last(), Some(&(2000 * MS, 2000.0, 2000.0)));
    }

    fn policy_with(algorithm: Algorithm, rate: &str) -> Policy {
        policy(algorithm, rate, 0)
    }

    #[test]
    fn sliding_log_counts_leave_the_window() {
        let policy = policy_with(Algorithm::SlidingLog, "2r/s");
        let course = level_course(&[point(0, 0), point(300, 0)], &policy, 2000 * MS);
        assert_eq!(
            course,
            [
                (0, 0.0, 1000.0),
                (300 * MS, 1000.0, 2000.0),
                (1000 * MS, 2000.0, 1000.0),
                (1300 * MS, 1000.0, 0.0),
                (2000 * MS, 0.0, 0.0),
            ]
        );
    }

    #[test]
    fn sliding_window_weighs_the_previous_window() {
        let policy = policy_with(Algorithm::SlidingWindow, "4r/s");
        let course = level_course(&[point(500, 0), point(500, 0)], &policy, 2500 * MS);
        assert_eq!(course[0], (500 * MS, 0.0, 2000.0));
        assert_eq!(course[1], (1000 * MS, 2000.0, 2000.0)); // the window turns: all of prev
        assert_eq!(course[2], (2000 * MS, 0.0, 0.0));
        assert_eq!(course[3], (2500 * MS, 0.0, 0.0));
    }

    #[test]
    fn wall_clock_ticks() {
        // 2026-12-01 18:35:53 UTC, 10 s.
        let start = 1_796_150_153 * NANOS_PER_SEC;
        let axis = Axis {
            start,
            end: start + 10 * NANOS_PER_SEC,
            wall_offset_s: Some(3600),
        };
        let (ticks, step) = axis.ticks();
        assert_eq!(step, 2.0);
        let labels: Vec<String> = ticks.iter().map(|&t| axis.label(t, step)).collect();
        assert_eq!(
            labels,
            ["19:35:54", "19:35:56", "19:35:58", "19:36:00", "19:36:02"]
        );
        assert_eq!(axis.caption(), "time (UTC+01:00), from 2026-12-01 19:35:53");
        let relative = Axis {
            start: 0,
            end: 3 * NANOS_PER_SEC,
            wall_offset_s: None,
        };
        let (ticks, step) = relative.ticks();
        assert_eq!(step, 0.5);
        assert_eq!(relative.label(ticks[1], step), "0.5 s");
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_788), (2026, 12, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
    }
}
