//! An in-flight limit that finds the upstream's capacity from its latency: a gradient rule on
//! the window's median latency.
//!
//! Completed requests report their latency into a small histogram ([`Window`]: 16 buckets of
//! the ratio of the latency to the key's no-load latency, fine near 1, coarse far from it).
//! At the end of a window ([`WINDOW_NS`], or twice the no-load latency when that is longer)
//! the limit moves by the ratio of the no-load latency to the window's **median**:
//!
//! ```text
//! gradient = clamp(TOLERANCE · no_load / median, 1/2, 2)
//! limit'   = clamp(limit · gradient + sqrt(limit · gradient), min, max)
//! ```
//!
//! The median, not the mean: a minority of requests that are slow on their own (a slow path,
//! an attacker's expensive URL, cache misses) neither moves it nor the no-load level, while a
//! queue in the upstream delays every request and moves it at once. On an upstream that
//! serves `C` requests at once and shares itself out beyond, the limit settles a little above
//! `C` (`limit ≈ TOLERANCE · C + sqrt(limit)`); on a worker pool with a FIFO backlog, where
//! waiting adds to every request, a few requests above `C` wait. The square root is headroom
//! that keeps probing upwards, so a capacity that grows is found again. The limit does not
//! grow in a window whose requests never used half of it (nothing was learnt about more).
//!
//! The no-load latency is measured, not guessed, by a **probe**: the limit drops to half of
//! what it was (never below `min`; a new key probes at `min`) until [`PROBE_SAMPLES`]
//! requests admitted during the probe have completed (requests admitted before do not count:
//! each remembers the epoch it was admitted in); their median is the new no-load latency and
//! the limit goes back to where it was. Half the limit keeps the upstream below its capacity
//! (the limit settles near `1.3 C`), while the slots held by slow requests stay within it,
//! so a probe never parks the key at `min`; it lasts about one no-load latency once the
//! requests over half have drained, at most [`PROBE_MAX_NS`]. A probe runs when a key is new,
//! every [`RELEARN_INTERVAL_NS`], and when the limit has sat at `min` for
//! [`WINDOWS_AT_MIN_BEFORE_RELEARN`] windows in a row (the upstream's own speed changed), then
//! at twice `min`.
//! A probe whose median fell far from the latency it was measured against (a new key's first
//! sample is its reference; the histogram is coarse there) is run again at once.
//!
//! Slow requests whose clients ask again the moment they are answered (an attacker's slow
//! URL) take back every slot they give up, before any other client can: at `min` they may
//! hold every slot, every completion is theirs, and a probe at `min` would be handed to them.
//! Two rules keep their latency from becoming the no-load level. The probe after windows at
//! `min` runs at twice `min`, so that other requests get slots; and a probe whose median is
//! more than twice its first quartile learns the quartile ([`Window::no_load_ratio`]): up to
//! three quarters of its samples may be slow on their own, while a slower upstream slows them
//! all. When that probe finds its own requests fast after slow windows, the key resumes at the
//! probe's limit, with room beside the slow requests, and grows from there.
//!
//! The state is a handful of integers ([`AdaptiveLimit`]) that pack into [`ADAPTIVE_WORDS`]
//! words of shared memory; the window's histogram is [`HISTOGRAM_WORDS`] more words that every
//! worker adds its samples to ([`histogram_add`]). Time is passed in (`now_ns`, any monotonic
//! clock); nothing here panics.

use crate::rate::NANOS_PER_SEC;

/// Shortest window over which samples are gathered before the limit moves.
pub const WINDOW_NS: u64 = 100_000_000;
/// Latency tolerated above the no-load level before the limit shrinks, as a fraction
/// `TOLERANCE_NUM / TOLERANCE_DEN` (5/4: a quarter above).
pub const TOLERANCE_NUM: u64 = 5;
/// See [`TOLERANCE_NUM`].
pub const TOLERANCE_DEN: u64 = 4;
/// How often the no-load latency is measured again.
pub const RELEARN_INTERVAL_NS: u64 = 30 * NANOS_PER_SEC;
/// Windows in a row at `min` after which the no-load latency is measured again.
pub const WINDOWS_AT_MIN_BEFORE_RELEARN: u8 = 5;
/// Samples whose median a probe takes as the no-load latency.
pub const PROBE_SAMPLES: u32 = 16;
/// Fewest samples a probe that ran out of time learns from (a known key keeps its no-load
/// latency otherwise).
pub const PROBE_MIN_SAMPLES: u32 = 4;
/// Longest probe.
pub const PROBE_MAX_NS: u64 = 2 * NANOS_PER_SEC;
/// Buckets of a window's histogram.
pub const BUCKETS: usize = 16;
/// `u64` words of a window's histogram: four 16-bit counts each.
pub const HISTOGRAM_WORDS: usize = BUCKETS / 4;
/// Most samples a window holds; the window closes then.
pub const WINDOW_MAX_SAMPLES: u32 = u16::MAX as u32;
/// Largest limit: 24 bits, so that a zone's limits fit one word
/// ([`crate::concurrency::ConcurrencyLimits::pack`]).
pub const MAX_LIMIT: u32 = (1 << 24) - 1;

/// Largest latency a sample or the no-load level holds, in microseconds (about 71 minutes).
const MAX_LATENCY_US: u64 = u32::MAX as u64;
/// Ratios in 1/1024.
const ONE: u64 = 1024;
/// The upper end of each bucket but the last, as a ratio to the reference in 1/8: bucket `i`
/// holds `[UPPER_EIGHTHS[i - 1], UPPER_EIGHTHS[i])` (from 0 for the first), the last bucket
/// everything from 16 times the reference. Fine steps of 1/8 from 3/4 to 3/2, where the
/// gradient rule decides; up to 16 times for the mean of an upstream of hits and misses.
const UPPER_EIGHTHS: [u64; BUCKETS - 1] = [4, 6, 7, 8, 9, 10, 11, 12, 14, 16, 20, 24, 32, 64, 128];
/// Where the last bucket is taken to end, for interpolation (its samples are at least 16
/// times the reference: the gradient is at its floor of 1/2 long before).
const LAST_UPPER_EIGHTHS: u64 = 256;

/// The bounds of one adaptive limit: `limit=adaptive min=N max=N`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AdaptiveBounds {
    /// The limit never goes below (and a new key's probe runs at) this many requests in
    /// flight; at least 1.
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
    /// Measuring the no-load latency at half the limit (a new key: at `min`).
    Probe,
    /// Following the latency with the gradient rule.
    Track,
}

/// The bucket of a sample of `latency_us` against a reference latency (the key's no-load
/// latency): by the ratio of the two.
///
/// ```
/// use ratelimit_core::adaptive::bucket_of;
///
/// assert_eq!(bucket_of(1_000, 1_000), 4); // ratio 1: [1, 9/8)
/// assert_eq!(bucket_of(1_240, 1_000), 5); // [9/8, 5/4)
/// assert_eq!(bucket_of(100, 1_000), 0); // under 1/2
/// assert_eq!(bucket_of(60_000, 1_000), 15); // 16 and over
/// ```
pub fn bucket_of(latency_us: u64, reference_us: u32) -> usize {
    let reference = u64::from(reference_us.max(1));
    // In 1/64 of the reference, so that the 1/8 steps compare exactly.
    let ratio = latency_us.saturating_mul(64) / reference;
    UPPER_EIGHTHS
        .iter()
        .position(|&upper| ratio < upper * 8)
        .unwrap_or(BUCKETS - 1)
}

/// The histogram word that holds `bucket`'s count, and the count's shift in it.
pub fn bucket_position(bucket: usize) -> (usize, u32) {
    let bucket = bucket.min(BUCKETS - 1);
    (bucket / 4, (bucket % 4) as u32 * 16)
}

/// `word` (the histogram word of `bucket`, [`bucket_position`]) with one more sample in
/// `bucket`; `None` when that count is full: the caller drops the sample (and closes the
/// window).
///
/// ```
/// use ratelimit_core::adaptive::{bucket_of, histogram_add, Window};
///
/// let mut words = [0u64; 4];
/// for latency_us in [1_000, 1_050, 30_000] {
///     let bucket = bucket_of(latency_us, 1_000);
///     words[bucket / 4] = histogram_add(words[bucket / 4], bucket).unwrap();
/// }
/// let window = Window::unpack(&words, 3);
/// assert_eq!((window.samples(), window.buckets[4], window.buckets[15]), (3, 2, 1));
/// ```
pub fn histogram_add(word: u64, bucket: usize) -> Option<u64> {
    let (_, shift) = bucket_position(bucket);
    if (word >> shift) & 0xFFFF == 0xFFFF {
        return None;
    }
    Some(word + (1 << shift))
}

/// The samples of one window: how many fell in each bucket, and the most requests in flight
/// seen while it was open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Window {
    /// Samples per bucket of [`bucket_of`].
    pub buckets: [u16; BUCKETS],
    /// Most requests in flight seen while the window was open.
    pub peak_inflight: u32,
}

impl Window {
    /// The window in [`HISTOGRAM_WORDS`] words of [`histogram_add`], with its peak in flight.
    pub fn unpack(words: &[u64; HISTOGRAM_WORDS], peak_inflight: u32) -> Window {
        let mut buckets = [0u16; BUCKETS];
        for (bucket, count) in buckets.iter_mut().enumerate() {
            let (word, shift) = bucket_position(bucket);
            *count = (words[word] >> shift) as u16;
        }
        Window {
            buckets,
            peak_inflight,
        }
    }

    /// A window whose samples all have this latency (tests, examples).
    pub fn of(samples: u16, latency_us: u64, reference_us: u32, peak_inflight: u32) -> Window {
        let mut window = Window {
            peak_inflight,
            ..Window::default()
        };
        window.buckets[bucket_of(latency_us, reference_us)] = samples;
        window
    }

    /// Completed requests.
    pub fn samples(&self) -> u32 {
        self.buckets.iter().map(|&count| u32::from(count)).sum()
    }

    /// The median as a ratio to the reference, in 1/1024, interpolated within its bucket;
    /// `None` without samples.
    pub fn median_ratio(&self) -> Option<u64> {
        self.quantile_ratio(1, 2)
    }

    /// What a probe learns as the no-load latency, as a ratio to the reference in 1/1024: the
    /// median, or the first quartile when the median is more than twice that. The probe's
    /// samples are then two kinds, and the fast one is the upstream's: a slow URL whose
    /// clients ask again the moment they are answered takes back each slot it gives up, so a
    /// probe may see more of its requests than of anyone's. Up to three quarters of slow
    /// samples do not raise the no-load latency; a slower upstream slows them all.
    pub fn no_load_ratio(&self) -> Option<u64> {
        let median = self.median_ratio()?;
        let quartile = self.quantile_ratio(1, 4)?;
        Some(if quartile.saturating_mul(2) < median {
            quartile
        } else {
            median
        })
    }

    /// The mean as a ratio to the reference, in 1/1024, each sample at its bucket's middle and
    /// the last bucket's at 16 times the reference; `None` without samples.
    pub fn capped_mean_ratio(&self) -> Option<u64> {
        let samples = u64::from(self.samples());
        if samples == 0 {
            return None;
        }
        let mut sum = 0u64;
        for (bucket, &count) in self.buckets.iter().enumerate() {
            let lower = if bucket == 0 {
                0
            } else {
                UPPER_EIGHTHS[bucket - 1]
            };
            let middle_16ths = match UPPER_EIGHTHS.get(bucket) {
                Some(&upper) => lower + upper,
                None => 2 * lower,
            };
            sum += u64::from(count) * middle_16ths;
        }
        Some(sum * ONE / 16 / samples)
    }

    /// The latency that `share_num / share_den` of the samples stay under, as a ratio to the
    /// reference in 1/1024, interpolated within its bucket; `None` without samples.
    pub fn quantile_ratio(&self, share_num: u64, share_den: u64) -> Option<u64> {
        let samples = u64::from(self.samples());
        if samples == 0 || share_den == 0 {
            return None;
        }
        // The sample's position from the bottom, in halves of a sample.
        let middle = samples * 2 * share_num.min(share_den) / share_den;
        let mut below = 0u64;
        for (bucket, &count) in self.buckets.iter().enumerate() {
            let count = u64::from(count);
            if count == 0 || (below + count) * 2 < middle {
                below += count;
                continue;
            }
            let lower = if bucket == 0 {
                0
            } else {
                UPPER_EIGHTHS[bucket - 1]
            };
            let upper = UPPER_EIGHTHS
                .get(bucket)
                .copied()
                .unwrap_or(LAST_UPPER_EIGHTHS);
            // The samples spread evenly over the bucket: the middle one at this share of it.
            let into = middle.saturating_sub(below * 2).min(count * 2);
            let eighths_1024 = lower * ONE + (upper - lower) * ONE * into / (count * 2);
            return Some(eighths_1024 / 8);
        }
        None
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
    /// a probe takes only the samples of its own epoch.
    pub epoch: u16,
    /// The no-load latency in microseconds, the reference of the window's histogram; 0 until
    /// the first sample (which is the first reference, [`AdaptiveLimit::seed`]).
    pub no_load_us: u32,
    /// The no-load latency is a first guess (a new key's first sample, or a probe whose
    /// median fell far from its reference): the next window starts another probe.
    pub provisional: bool,
    /// The limit to go back to when a probe ends.
    pub resume_limit: u32,
    /// Windows in a row that ended at `min`.
    pub windows_at_min: u8,
    /// The median latency of the last window closed, in microseconds (0 before one): the
    /// latency the limit was last judged by.
    pub last_median_us: u32,
    /// The mean latency at no load, each sample counted as at most 16 times the no-load
    /// (median) latency, in microseconds: the time a request takes the upstream's, by which
    /// the wait the median shows is judged (on an upstream of cache hits and misses the median
    /// is a hit, while the waiting comes from the misses too).
    pub service_us: u32,
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
            provisional: true,
            resume_limit: bounds.min,
            windows_at_min: 0,
            last_median_us: 0,
            service_us: 0,
            window_start_ns: now_ns,
            next_probe_ns: now_ns.saturating_add(RELEARN_INTERVAL_NS),
        }
    }

    /// A key without a reference takes its first sample's latency as one; true if it did
    /// (the caller stores the state).
    pub fn seed(&mut self, latency_us: u64) -> bool {
        if self.no_load_us != 0 {
            return false;
        }
        self.no_load_us = latency_us.clamp(1, MAX_LATENCY_US) as u32;
        self.provisional = true;
        true
    }

    /// Whether a sample of a request admitted in `epoch` belongs in the current window: a
    /// probe takes only its own requests; tracking takes all.
    pub fn accepts(&self, epoch: u16) -> bool {
        self.phase == Phase::Track || epoch == self.epoch
    }

    /// The bucket of a sample of `latency_us` in this key's window.
    pub fn bucket(&self, latency_us: u64) -> usize {
        bucket_of(latency_us, self.no_load_us)
    }

    /// How long a tracking window lasts: [`WINDOW_NS`], or twice the service time when that
    /// is longer. A window shorter than a request would judge the limit by requests admitted
    /// under the limit before (the change it made would not show yet) and the limit would
    /// swing.
    pub fn window_ns(&self) -> u64 {
        let service_us = self.service_us.max(self.no_load_us);
        WINDOW_NS.max(u64::from(service_us).saturating_mul(2_000))
    }

    /// The shortest probe: four service times (at most [`PROBE_MAX_NS`]). The first requests to
    /// complete are the fastest; a probe that ended with them would take a cache hit for the
    /// service time of an upstream of hits and misses.
    pub fn probe_min_ns(&self) -> u64 {
        let service_us = self.service_us.max(self.no_load_us);
        u64::from(service_us)
            .saturating_mul(4_000)
            .min(PROBE_MAX_NS)
    }

    /// Whether the window should close at `now_ns` with these samples. A probe also closes
    /// when its time is up, with whatever it has (the caller checks this at every sample,
    /// even one the window does not take).
    pub fn due(&self, now_ns: u64, window: &Window) -> bool {
        let samples = window.samples();
        if samples >= WINDOW_MAX_SAMPLES || window.buckets.contains(&u16::MAX) {
            return true;
        }
        let elapsed = now_ns.saturating_sub(self.window_start_ns);
        match self.phase {
            Phase::Track => elapsed >= self.window_ns() && samples > 0,
            Phase::Probe => {
                (samples >= PROBE_SAMPLES && elapsed >= self.probe_min_ns())
                    || (elapsed >= PROBE_MAX_NS && (samples > 0 || self.no_load_us > 0))
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
    /// limit.seed(20_000); // the first sample: 20 ms
    /// // The probe: 16 requests at 20 ms, the no-load latency (read at the middle of its
    /// // bucket, [1, 9/8) of the reference: 21.25 ms).
    /// limit.close_window(&bounds, 100 * ms, &Window::of(16, 20_000, limit.no_load_us, 4));
    /// assert_eq!((limit.phase, limit.no_load_us, limit.provisional), (Phase::Track, 21_250, false));
    /// // The median at its no-load level with the limit in use: the limit grows.
    /// let no_load = limit.no_load_us;
    /// limit.close_window(&bounds, 200 * ms, &Window::of(40, no_load.into(), no_load, 4));
    /// assert_eq!(limit.limit, 6); // 4 · 1.18 = 4.7, plus sqrt
    /// // Three times the no-load latency: it shrinks.
    /// limit.close_window(&bounds, 300 * ms, &Window::of(40, 3 * u64::from(no_load), no_load, 6));
    /// assert!(limit.limit < 6);
    /// ```
    pub fn close_window(&mut self, bounds: &AdaptiveBounds, now_ns: u64, window: &Window) {
        let before_us = self.last_median_us;
        if let Some(ratio) = window.median_ratio() {
            self.last_median_us = scale(self.no_load_us, ratio);
        }
        match self.phase {
            Phase::Probe => self.end_probe(bounds, now_ns, window, before_us),
            Phase::Track => self.track(bounds, now_ns, window),
        }
    }

    /// `before_us`: the median of the window before the probe (0 for a new key's).
    fn end_probe(&mut self, bounds: &AdaptiveBounds, now_ns: u64, window: &Window, before_us: u32) {
        let samples = window.samples();
        let learns = samples >= PROBE_MIN_SAMPLES || (self.provisional && samples > 0);
        if let (true, Some(ratio)) = (learns, window.no_load_ratio()) {
            if self.service_us == 0 || self.provisional {
                let mean = window.capped_mean_ratio().unwrap_or(ratio);
                self.service_us = scale(self.no_load_us, mean.max(ratio)).max(1);
            }
            self.no_load_us = scale(self.no_load_us, ratio).max(1);
            // The windows at `min` were slow, the probe's own requests are not: the slots were
            // held by requests slow on their own, not by a slow upstream. The key resumes at
            // the probe's limit, with room for requests that are not theirs.
            if self.resume_limit <= bounds.min
                && u64::from(self.no_load_us) * 2 < u64::from(before_us)
            {
                self.resume_limit = self.limit;
            }
            // The histogram is coarse far from its reference: measure again around the new one.
            self.provisional = !(ONE / 2..=2 * ONE).contains(&ratio) || samples < PROBE_MIN_SAMPLES;
        } else if self.no_load_us == 0 || samples == 0 && self.provisional {
            // Nothing to learn from yet: the probe goes on.
            return;
        }
        self.phase = Phase::Track;
        self.epoch = self.epoch.wrapping_add(1);
        self.limit = bounds.clamp(u64::from(self.resume_limit));
        self.windows_at_min = 0;
        self.window_start_ns = now_ns;
        self.next_probe_ns = now_ns.saturating_add(RELEARN_INTERVAL_NS);
    }

    fn track(&mut self, bounds: &AdaptiveBounds, now_ns: u64, window: &Window) {
        self.window_start_ns = now_ns;
        self.limit = match window.median_ratio() {
            Some(ratio) if self.no_load_us > 0 => {
                let limit = next_limit(self.limit, self.queueing_ratio(ratio), window, bounds);
                self.learn_service(ratio, window);
                limit
            }
            _ => bounds.clamp(u64::from(self.limit)),
        };
        self.windows_at_min = if self.limit == bounds.min {
            self.windows_at_min.saturating_add(1)
        } else {
            0
        };
        if self.windows_at_min >= WINDOWS_AT_MIN_BEFORE_RELEARN {
            // Twice `min`: the slots may all be held by requests slow on their own (an
            // attacker's slow URL, whose clients ask again the moment they are answered), and
            // a probe at `min` would hand its slots to them and learn their latency.
            self.start_probe(bounds, now_ns, bounds.min.saturating_mul(2));
        } else if now_ns >= self.next_probe_ns || self.provisional {
            self.start_probe(bounds, now_ns, self.limit / 2);
        }
    }

    /// Follow the service time: the window's mean less its wait (the median over the no-load
    /// latency), an eighth of the way per window. Where waiting adds to every request (a FIFO
    /// backlog) that is exact; where the upstream shares itself out it overestimates in
    /// proportion to the slowdown, which the median's rise cuts anyway.
    fn learn_service(&mut self, median_ratio: u64, window: &Window) {
        let Some(mean) = window.capped_mean_ratio() else {
            return;
        };
        let estimate = scale(
            self.no_load_us,
            (mean + ONE).saturating_sub(median_ratio).max(ONE),
        );
        let service = u64::from(self.service_us);
        self.service_us = if service == 0 {
            estimate
        } else {
            ((service * 7 + u64::from(estimate)) / 8).min(MAX_LATENCY_US) as u32
        };
    }

    /// The median's wait over the service time, as the ratio of the latency to the service
    /// time it is on an upstream of one speed: `1 + (median - no_load) / service`, in 1/1024.
    fn queueing_ratio(&self, median_ratio: u64) -> u64 {
        let no_load = u64::from(self.no_load_us.max(1));
        let service = u64::from(self.service_us).max(no_load);
        let median_us = no_load * median_ratio / ONE;
        if median_us >= no_load {
            ONE + (median_us - no_load) * ONE / service
        } else {
            ONE - (no_load - median_us) * ONE / service
        }
    }

    fn start_probe(&mut self, bounds: &AdaptiveBounds, now_ns: u64, probe_limit: u32) {
        self.resume_limit = self.limit;
        self.limit = bounds.clamp(u64::from(probe_limit));
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
    /// `[no_load_us:32 epoch:16 windows_at_min:8 0:5 provisional:1 phase:1 1:1]`,
    /// `window_start_ns`, `next_probe_ns`, `[service_us:32 last_median_us:32]`. The second
    /// word is never 0, so
    /// all zeros reads as "not set yet".
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
                | (u64::from(self.provisional) << 2)
                | (phase << 1)
                | 1,
            self.window_start_ns,
            self.next_probe_ns,
            (u64::from(self.service_us) << 32) | u64::from(self.last_median_us),
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
            provisional: control & 4 != 0,
            phase: if control & 2 == 0 {
                Phase::Probe
            } else {
                Phase::Track
            },
            window_start_ns: words[2],
            next_probe_ns: words[3],
            last_median_us: words[4] as u32,
            service_us: (words[4] >> 32) as u32,
        };
        state.rebound(bounds);
        Some(state)
    }
}

/// `latency_us` times a ratio in 1/1024, in microseconds within what a state holds.
fn scale(latency_us: u32, ratio: u64) -> u32 {
    (u64::from(latency_us).saturating_mul(ratio) / ONE).min(MAX_LATENCY_US) as u32
}

/// The gradient rule for one window whose median is `ratio` (1/1024) of the no-load latency.
fn next_limit(limit: u32, ratio: u64, window: &Window, bounds: &AdaptiveBounds) -> u32 {
    // gradient = TOLERANCE / ratio, within [1/2, 2], in 1/1024.
    let gradient =
        (TOLERANCE_NUM * ONE * ONE / TOLERANCE_DEN / ratio.max(1)).clamp(ONE / 2, 2 * ONE);
    // A window that used less than half the limit says nothing about a larger one.
    if gradient > ONE && u64::from(window.peak_inflight) * 2 < u64::from(limit) {
        return bounds.clamp(u64::from(limit));
    }
    let scaled = u64::from(limit) * gradient / ONE;
    let target = scaled + isqrt(scaled);
    if !(ONE * 9 / 8..3 * ONE).contains(&ratio) {
        // Nothing waits, or the upstream is far past its capacity: the whole step.
        return bounds.clamp(target);
    }
    // Half way from the limit to the rule's: the latency of a window is that of requests
    // admitted up to a latency before, so a full step overshoots and the limit swings (on a
    // FIFO backlog most, where waiting shows only once the backlog is served).
    bounds.clamp((u64::from(limit) + target).div_ceil(2))
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
