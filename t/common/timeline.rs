//! Timelines: requests sent at fixed offsets (in milliseconds) from one start instant, each on
//! its own connection and thread, so a delayed response never holds back the next request.
//!
//! Sleeping until an offset is only as precise as the scheduler (a few milliseconds, more on a
//! loaded machine): tests choose offsets whose decisions stay the same if a request leaves
//! tens of milliseconds late, and the outcomes record when each request really left.

use std::fmt::Write as _;
use std::thread;
use std::time::{Duration, Instant};

use super::http::{send, Request, Response};

/// Time to spawn every thread before the first offset.
const LEAD_IN: Duration = Duration::from_millis(50);

/// One request of a timeline.
#[derive(Clone, Debug)]
pub struct Step {
    /// When to send, from the timeline's start.
    pub at_ms: u64,
    pub port: u16,
    pub request: Request,
}

impl Step {
    pub fn new(at_ms: u64, port: u16, request: Request) -> Step {
        Step {
            at_ms,
            port,
            request,
        }
    }
}

/// What happened to one step.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The step's planned offset.
    pub at_ms: u64,
    /// When the request really left, from the timeline's start.
    pub sent_at: Duration,
    pub response: Response,
}

impl Outcome {
    pub fn status(&self) -> u16 {
        self.response.status
    }

    /// Time from sending the request to the end of its response.
    pub fn elapsed(&self) -> Duration {
        self.response.elapsed
    }
}

/// Sends every step at its offset and returns the outcomes in the order of `steps`.
pub fn run_timeline(steps: &[Step]) -> Vec<Outcome> {
    let start = Instant::now() + LEAD_IN;
    thread::scope(|scope| {
        let threads: Vec<_> = steps
            .iter()
            .map(|step| {
                scope.spawn(move || {
                    let at = start + Duration::from_millis(step.at_ms);
                    if let Some(wait) = at.checked_duration_since(Instant::now()) {
                        thread::sleep(wait);
                    }
                    let sent_at = Instant::now().saturating_duration_since(start);
                    let response = send(step.port, &step.request);
                    Outcome {
                        at_ms: step.at_ms,
                        sent_at,
                        response,
                    }
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|thread| {
                thread
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    })
}

impl super::http::Answer for Outcome {
    fn status(&self) -> u16 {
        Outcome::status(self)
    }
}

/// One line per outcome, for assertion messages: planned and real send time, status, latency.
pub fn describe(steps: &[Step], outcomes: &[Outcome]) -> String {
    let mut text = String::new();
    for (step, outcome) in steps.iter().zip(outcomes) {
        let _ = writeln!(
            text,
            "  at {:>5} ms (sent {:>7.1} ms) {} {}{} -> {} in {:.1} ms",
            step.at_ms,
            outcome.sent_at.as_secs_f64() * 1000.0,
            step.request.method,
            step.request.path,
            step.request
                .headers
                .iter()
                .map(|(name, value)| format!(" [{name}: {value}]"))
                .collect::<String>(),
            outcome.status(),
            outcome.elapsed().as_secs_f64() * 1000.0
        );
    }
    text
}
