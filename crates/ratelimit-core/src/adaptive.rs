//! An in-flight limit that finds the upstream's capacity from its latency: a gradient rule.
//!
//! Completed requests report their latency; the samples of a window ([`WINDOW_NS`], or twice
//! the no-load latency when that is longer) are averaged, and at the end of the window the limit moves by the ratio of
//! the no-load latency to that average:
//!
//! ```text
//! gradient = clamp(TOLERANCE · no_load / average, 1/2, 2)
//! limit'   = clamp(limit · gradient + sqrt(limit · gradient), min, max)
//! ```
//!
//! While the latency stays within [`TOLERANCE`] of its no-load level the limit grows (by a
//! quarter and a square root per window); when requests start to queue in the upstream the
//! latency rises with the requests in flight and the limit falls in proportion, at most by
//! half per window. On an upstream that serves `C` requests at once in `b` each and shares
//! itself out beyond (latency `b · inflight / C`), the limit settles where
//! `limit = TOLERANCE · C + sqrt(limit)`, a little above `C`: every slot of the upstream stays
//! busy and the latency is about `1.5 · b` at `C` = 20, `1.4 · b` at `C` = 100. The square root is the
//! headroom that keeps probing upwards, so a capacity that grows is found too. The limit does
//! not grow in a window whose requests never used half of it (nothing was learnt about more).
//!
//! The no-load latency is measured, not guessed: the limit drops to `min` until
//! [`PROBE_SAMPLES`] requests admitted at that level have completed (the requests admitted
//! before the drop do not count), their average is the new no-load latency, and the limit goes
//! back to where it was. That happens first when the key is new, then every
//! [`RELEARN_INTERVAL_NS`], and whenever the limit has sat at `min` for
//! [`WINDOWS_AT_MIN_BEFORE_RELEARN`] windows in a row (latency high even at the minimum: the
//! upstream's own speed changed). A probe that sees fewer samples than that still ends after
//! [`PROBE_MAX_NS`] with what it has.
//!
//! A sample is capped at [`SAMPLE_CEILING`] times the no-load latency before averaging, so a
//! few very slow requests (a timeout) weigh like a slow window, not like a collapse.
//!
//! The state is a handful of integers ([`AdaptiveLimit`]) that pack into [`ADAPTIVE_WORDS`]
//! words of shared memory; the window's samples accumulate in one more word
//! ([`window_add`]). Time is passed in (`now_ns`, any monotonic clock); nothing here panics.

use crate::NANOS_PER_SEC;

/// Shortest window over which samples are averaged before the limit moves.
pub const WINDOW_NS: u64 = 100_000_000;
/// Latency tolerated above the no-load level before the limit shrinks, as a fraction
/// `TOLERANCE_NUM / TOLERANCE_DEN` (5/4: a quarter above).
pub const TOLERANCE_NUM: u64 = 5;
/// See [`TOLERANCE_NUM`].
pub const TOLERANCE_DEN: u64 = 4;
/// A sample counts as at most this many times the no-load latency.
pub const SAMPLE_CEILING: u64 = 4;
/// How often the no-load latency is measured again.
pub const RELEARN_INTERVAL_NS: u64 = 30 * NANOS_PER_SEC;
/// Windows in a row at `min` after which the no-load latency is measured again.
pub const WINDOWS_AT_MIN_BEFORE_RELEARN: u8 = 5;
/// Samples a probe averages into the no-load latency.
pub const PROBE_SAMPLES: u32 = 16;
/// Longest probe: after this a probe ends with at least one sample.
pub const PROBE_MAX_NS: u64 = 5 * NANOS_PER_SEC;
/// Most samples a window word holds; the window closes before.
pub const WINDOW_MAX_SAMPLES: u32 = (1 << WINDOW_COUNT_BITS) - 1;
/// Largest limit: 24 bits, so that a zone's limits fit one word
/// ([`crate::concurrency::ConcurrencyLimits::pack`]).
pub const MAX_LIMIT: u32 = (1 << 24) - 1;

const WINDOW_COUNT_BITS: u32 = 16;
const WINDOW_SUM_BITS: u32 = 64 - WINDOW_COUNT_BITS;
const WINDOW_SUM_MAX: u64 = (1 << WINDOW_SUM_BITS) - 1;
/// Largest latency a sample or the no-load level holds, in microseconds (about 71 minutes).
const MAX_LATENCY_US: u64 = u32::MAX as u64;

/// The bounds of one adaptive limit: `limit=adaptive min=N max=N`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AdaptiveBounds {
    /// The limit never goes below (and probes run at) this many requests in flight; at least 1.
    pub min: u32,
    /// The limit never goes above this; at least `min`.
    pub max: u32,
}

impl AdaptiveBounds {
    /// `min` and `max` made valid: `1 <= min <= max <= MAX_LIMIT`.
    pub fn new(min: u32, max: u32) -> AdaptiveBounds {
        let min = min.clamp(1, MAX_LIMIT);
        AdaptiveBounds {
            min,
            max: max.clamp(min, MAX_LIMIT),
        }
    }

    fn clamp(&self, limit: u64) -> u32 {
        limit.clamp(u64::from(self.min), u64::from(self.max)) as u32
    }
}

/// What the limit is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Measuring the no-load latency at `min` requests in flight.
    Probe,
    /// Following the latency with the gradient rule.
    Track,
}

/// The samples of one window: how many, and their sum in microseconds (each capped).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Window {
    /// Completed requests.
    pub samples: u32,
    /// Sum of their latencies, in microseconds, each at most the ceiling of its time.
    pub sum_us: u64,
    /// Most requests in flight seen while the window was open.
    pub peak_inflight: u32,
}

impl Window {
    /// The average latency in microseconds (0 without samples).
    pub fn average_us(&self) -> u64 {
        self.sum_us
            .checked_div(u64::from(self.samples))
            .unwrap_or(0)
    }
}

/// The packed form of a [`Window`]'s count and sum: `samples` in the top 16 bits, `sum_us`
/// in the low 48. One atomic word that every worker adds its samples to.
///
/// Returns the word with one more sample of `latency_us` (capped at `ceiling_us`), or `None`
/// when the word is full: the caller drops the sample (and closes the window).
///
/// ```
/// use ratelimit_core::adaptive::{window_add, window_unpack};
///
/// let word = window_add(0, 1_500, u64::MAX).unwrap();
/// let word = window_add(word, 9_000, 4_000).unwrap();
/// let window = window_unpack(word, 7);
/// assert_eq!((window.samples, window.sum_us, window.peak_inflight), (2, 5_500, 7));
/// ```
pub fn window_add(word: u64, latency_us: u64, ceiling_us: u64) -> Option<u64> {
    let samples = word >> WINDOW_SUM_BITS;
    let sum = word & WINDOW_SUM_MAX;
    if samples >= u64::from(WINDOW_MAX_SAMPLES) {
        return None;
    }
    let sample = latency_us.min(ceiling_us).min(MAX_LATENCY_US);
    let sum = sum.saturating_add(sample).min(WINDOW_SUM_MAX);
    Some(((samples + 1) << WINDOW_SUM_BITS) | sum)
}

/// The window a word of [`window_add`] holds, with the peak in flight kept next to it.
pub fn window_unpack(word: u64, peak_inflight: u32) -> Window {
    Window {
        samples: (word >> WINDOW_SUM_BITS) as u32,
        sum_us: word & WINDOW_SUM_MAX,
        peak_inflight,
    }
}

/// One key's adaptive limit. Plain integers: the module keeps them in shared memory
/// ([`AdaptiveLimit::pack`]), the simulations in a local.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AdaptiveLimit {
    /// Requests allowed in flight now, within the bounds.
    pub limit: u32,
    /// Probing or tracking.
    pub phase: Phase,
    /// Changes at every change of phase. A request remembers the epoch it was admitted in;
    /// a probe averages only the samples of its own epoch.
    pub epoch: u16,
    /// The no-load latency in microseconds; 0 until the first probe ends.
    pub no_load_us: u32,
    /// The limit to go back to when a probe ends.
    pub resume_limit: u32,
    /// Windows in a row that ended at `min`.
    pub windows_at_min: u8,
    /// The average latency of the last window closed, in microseconds (0 before one): the
    /// latency the limit was last judged by.
    pub last_average_us: u32,
    /// When the current window (or probe) began.
    pub window_start_ns: u64,
    /// When the next periodic probe begins.
    pub next_probe_ns: u64,
}

/// How many `u64` words [`AdaptiveLimit::pack`] fills.
pub const ADAPTIVE_WORDS: usize = 5;

impl AdaptiveLimit {
    /// A new key's limit at `now_ns`: a probe at `min`, to learn the no-load latency first.
    /// The limit the probe resumes to is `min` too: from there it grows by the gradient rule.
    pub fn new(bounds: &AdaptiveBounds, now_ns: u64) -> AdaptiveLimit {
        AdaptiveLimit {
            limit: bounds.min,
            phase: Phase::Probe,
            epoch: 1,
            no_load_us: 0,
            resume_limit: bounds.min,
            windows_at_min: 0,
            last_average_us: 0,
            window_start_ns: now_ns,
            next_probe_ns: now_ns.saturating_add(RELEARN_INTERVAL_NS),
        }
    }

    /// Whether a sample of a request admitted in `epoch` belongs in the current window: a
    /// probe takes only its own requests (admitted at `min`); tracking takes all.
    pub fn accepts(&self, epoch: u16) -> bool {
        self.phase == Phase::Track || epoch == self.epoch
    }

    /// The most a sample counts for, in microseconds: [`SAMPLE_CEILING`] times the no-load
    /// latency while tracking, no cap while probing.
    pub fn sample_ceiling_us(&self) -> u64 {
        match self.phase {
            Phase::Track if self.no_load_us > 0 => {
                u64::from(self.no_load_us).saturating_mul(SAMPLE_CEILING)
            }
            _ => u64::MAX,
        }
    }

    /// How long a tracking window lasts: [`WINDOW_NS`], or twice the no-load latency when
    /// that is longer. A window shorter than a request would judge the limit by requests
    /// admitted under the limit before (the change it made would not show yet) and the limit
    /// would swing.
    pub fn window_ns(&self) -> u64 {
        WINDOW_NS.max(u64::from(self.no_load_us).saturating_mul(2_000))
    }

    /// Whether the window should close at `now_ns` with these samples.
    pub fn due(&self, now_ns: u64, window: &Window) -> bool {
        if window.samples >= WINDOW_MAX_SAMPLES {
            return true;
        }
        let elapsed = now_ns.saturating_sub(self.window_start_ns);
        match self.phase {
            Phase::Track => elapsed >= self.window_ns() && window.samples > 0,
            Phase::Probe => {
                window.samples >= PROBE_SAMPLES || (elapsed >= PROBE_MAX_NS && window.samples > 0)
            }
        }
    }

    /// Close the window at `now_ns`: move the limit by its samples, and start or end a
    /// probe. The caller has checked [`AdaptiveLimit::due`] and clears its window after.
    ///
    /// ```
    /// use ratelimit_core::adaptive::{AdaptiveBounds, AdaptiveLimit, Phase, Window};
    ///
    /// let bounds = AdaptiveBounds::new(4, 500);
    /// let ms = 1_000_000;
    /// let mut limit = AdaptiveLimit::new(&bounds, 0);
    /// // The probe: 16 requests at 20 ms, the no-load latency.
    /// limit.close_window(&bounds, 100 * ms, &Window { samples: 16, sum_us: 16 * 20_000, peak_inflight: 4 });
    /// assert_eq!((limit.phase, limit.no_load_us), (Phase::Track, 20_000));
    /// // Latency at its no-load level with the limit in use: the limit grows.
    /// limit.close_window(&bounds, 200 * ms, &Window { samples: 40, sum_us: 40 * 20_000, peak_inflight: 4 });
    /// assert_eq!(limit.limit, 7); // 4 · 5/4 = 5, plus sqrt(5)
    /// // Twice the no-load latency: it shrinks.
    /// limit.close_window(&bounds, 300 * ms, &Window { samples: 40, sum_us: 40 * 40_000, peak_inflight: 7 });
    /// assert_eq!(limit.limit, 6); // 7 · 5/8 = 4.375, plus sqrt(4.375)
    /// ```
    pub fn close_window(&mut self, bounds: &AdaptiveBounds, now_ns: u64, window: &Window) {
        if window.samples > 0 {
            self.last_average_us = window.average_us().min(MAX_LATENCY_US) as u32;
        }
        match self.phase {
            Phase::Probe => self.end_probe(bounds, now_ns, window),
            Phase::Track => self.track(bounds, now_ns, window),
        }
    }

    fn end_probe(&mut self, bounds: &AdaptiveBounds, now_ns: u64, window: &Window) {
        if window.samples == 0 {
            return;
        }
        self.no_load_us = window.average_us().clamp(1, MAX_LATENCY_US) as u32;
        self.phase = Phase::Track;
        self.epoch = self.epoch.wrapping_add(1);
        self.limit = bounds.clamp(u64::from(self.resume_limit));
        self.windows_at_min = 0;
        self.window_start_ns = now_ns;
        self.next_probe_ns = now_ns.saturating_add(RELEARN_INTERVAL_NS);
    }

    fn track(&mut self, bounds: &AdaptiveBounds, now_ns: u64, window: &Window) {
        self.window_start_ns = now_ns;
        let average = window.average_us();
        if average > 0 && self.no_load_us > 0 {
            self.limit = next_limit(self.limit, self.no_load_us, average, window, bounds);
        } else {
            self.limit = bounds.clamp(u64::from(self.limit));
        }
        self.windows_at_min = if self.limit == bounds.min {
            self.windows_at_min.saturating_add(1)
        } else {
            0
        };
        if now_ns >= self.next_probe_ns || self.windows_at_min >= WINDOWS_AT_MIN_BEFORE_RELEARN {
            self.start_probe(bounds, now_ns);
        }
    }

    fn start_probe(&mut self, bounds: &AdaptiveBounds, now_ns: u64) {
        self.resume_limit = self.limit;
        self.limit = bounds.min;
        self.phase = Phase::Probe;
        self.epoch = self.epoch.wrapping_add(1);
        self.windows_at_min = 0;
        self.window_start_ns = now_ns;
    }

    /// The bounds changed (a reload, the admin API): bring the limits within them.
    pub fn rebound(&mut self, bounds: &AdaptiveBounds) {
        self.limit = bounds.clamp(u64::from(self.limit));
        self.resume_limit = bounds.clamp(u64::from(self.resume_limit));
    }

    /// The state as [`ADAPTIVE_WORDS`] words for shared memory: `[limit:32 resume_limit:32]`,
    /// `[no_load_us:32 epoch:16 windows_at_min:8 0:6 phase:1 1:1]`, `window_start_ns`,
    /// `next_probe_ns`, `last_average_us`. The second word is never 0, so all zeros reads as
    /// "not set yet".
    pub fn pack(&self) -> [u64; ADAPTIVE_WORDS] {
        let phase = match self.phase {
            Phase::Probe => 0,
            Phase::Track => 1,
        };
        [
            (u64::from(self.limit) << 32) | u64::from(self.resume_limit),
            (u64::from(self.no_load_us) << 32)
                | (u64::from(self.epoch) << 16)
                | (u64::from(self.windows_at_min) << 8)
                | (phase << 1)
                | 1,
            self.window_start_ns,
            self.next_probe_ns,
            u64::from(self.last_average_us),
        ]
    }

    /// Inverse of [`AdaptiveLimit::pack`]; `None` for words never set (all zeros: a new key).
    /// Limits outside `bounds` (a reload changed them) come back within.
    pub fn unpack(words: &[u64; ADAPTIVE_WORDS], bounds: &AdaptiveBounds) -> Option<AdaptiveLimit> {
        let control = words[1];
        if control & 1 == 0 {
            return None;
        }
        let mut state = AdaptiveLimit {
            limit: (words[0] >> 32) as u32,
            resume_limit: words[0] as u32,
            no_load_us: (control >> 32) as u32,
            epoch: (control >> 16) as u16,
            windows_at_min: (control >> 8) as u8,
            phase: if control & 2 == 0 {
                Phase::Probe
            } else {
                Phase::Track
            },
            window_start_ns: words[2],
            next_probe_ns: words[3],
            last_average_us: words[4].min(MAX_LATENCY_US) as u32,
        };
        state.rebound(bounds);
        Some(state)
    }
}

/// The gradient rule for one window.
fn next_limit(
    limit: u32,
    no_load_us: u32,
    average_us: u64,
    window: &Window,
    bounds: &AdaptiveBounds,
) -> u32 {
    // gradient = TOLERANCE · no_load / average, within [1/2, 2], in 1/1024.
    const ONE: u64 = 1024;
    let target = u64::from(no_load_us).saturating_mul(TOLERANCE_NUM * ONE) / TOLERANCE_DEN;
    let gradient = (target / average_us.max(1)).clamp(ONE / 2, 2 * ONE);
    // A window that used less than half the limit says nothing about a larger one.
    if gradient > ONE && u64::from(window.peak_inflight) * 2 < u64::from(limit) {
        return bounds.clamp(u64::from(limit));
    }
    let scaled = u64::from(limit) * gradient / ONE;
    bounds.clamp(scaled + isqrt(scaled))
}

/// The integer square root (floor).
fn isqrt(n: u64) -> u64 {
    if n < 2 {
        return n;
    }
    let mut x = (n as f64).sqrt() as u64;
    while x.saturating_mul(x) > n {
        x -= 1;
    }
    while (x + 1).saturating_mul(x + 1) <= n {
        x += 1;
    }
    x
}
