//! The state file (`rate_limit_state_file`): what the admin API changed, so that it survives
//! a restart.
//!
//! ```json
//! {
//!   "version": 1,
//!   "zones": {
//!     "api": {
//!       "algorithm": "leaky_bucket",
//!       "config": { "rate": "10r/s", "burst": 5 },
//!       "limits": { "rate": "20r/s", "burst": 10 },
//!       "overrides": { "user%2F7": { "rate": "100r/s", "burst": 20 } }
//!     }
//!   }
//! }
//! ```
//!
//! `config` is what the configuration file said when `limits` was in force: at start, `limits`
//! is restored only while the configuration still says the same (and the algorithm is the
//! same); once the configuration's own value changes, the configuration wins. Overrides are
//! restored whatever the configuration says, when the zone can still take them. Override keys
//! are percent-encoded as in the API's paths (keys are bytes).
//!
//! The file is replaced atomically: written to `PATH.tmp`, synced, renamed over `PATH`, under
//! an exclusive `flock` on `PATH.lock` so that two workers writing at once cannot interleave
//! (the kernel drops the lock of a process that dies).

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use ratelimit_core::{Algorithm, Limits, Rate};
use serde::{Deserialize, Serialize};

use crate::body::check_limits;
use crate::percent::{percent_decode, percent_encode};

/// The only version written and read.
pub const VERSION: u32 = 1;

/// The whole file, by zone name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StateFile {
    pub zones: BTreeMap<String, ZoneState>,
}

/// One zone's entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZoneState {
    pub algorithm: Algorithm,
    /// The configuration's limits when the entry was written.
    pub config: Limits,
    /// The limits in force when the entry was written.
    pub limits: Limits,
    pub overrides: Vec<(Vec<u8>, Limits)>,
    /// A quota zone's counts, which a restart must not lose.
    pub quota: Option<QuotaCounts>,
}

/// A quota zone's keys: the zone's hash seed and, by key id (a hash with that seed), each
/// key's state word (its period's tag and count). Keys are not kept in the zone, only their
/// ids: the seed lets the next start find the same ids for the same keys.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QuotaCounts {
    /// The zone's period and time zone (`month in UTC`): counts are restored only into the
    /// same calendar.
    pub calendar: String,
    pub seed: [u64; 2],
    pub words: Vec<(u64, u64)>,
}

/// Why a state file was not used.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("no such file")]
    Missing,
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("{0}")]
    Corrupt(String),
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileJson {
    version: u32,
    zones: BTreeMap<String, ZoneJson>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ZoneJson {
    algorithm: String,
    config: LimitsJson,
    limits: LimitsJson,
    #[serde(default)]
    overrides: BTreeMap<String, LimitsJson>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    quota: Option<QuotaJson>,
}

/// `{"seed": "32 hex digits", "counts": {"ID in hex": "WORD in hex"}}`: hex, since JSON
/// readers other than this one may hold numbers as doubles.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaJson {
    calendar: String,
    seed: String,
    counts: BTreeMap<String, String>,
}

impl QuotaJson {
    fn new(quota: &QuotaCounts) -> QuotaJson {
        QuotaJson {
            calendar: quota.calendar.clone(),
            seed: format!("{:016x}{:016x}", quota.seed[0], quota.seed[1]),
            counts: quota
                .words
                .iter()
                .map(|(id, word)| (format!("{id:x}"), format!("{word:x}")))
                .collect(),
        }
    }

    fn counts(&self, place: &str) -> Result<QuotaCounts, StateError> {
        let corrupt = |what: &str| StateError::Corrupt(format!("{place}: invalid {what}"));
        let hex = |text: &str, what: &str| {
            if text.is_empty() || text.len() > 16 {
                return Err(corrupt(what));
            }
            u64::from_str_radix(text, 16).map_err(|_| corrupt(what))
        };
        if self.seed.len() != 32 || !self.seed.is_ascii() {
            return Err(corrupt("quota seed"));
        }
        let seed = [
            hex(&self.seed[..16], "quota seed")?,
            hex(&self.seed[16..], "quota seed")?,
        ];
        let mut words = Vec::with_capacity(self.counts.len());
        for (id, word) in &self.counts {
            let id = hex(id, "quota key id")?;
            if id == 0 {
                return Err(corrupt("quota key id"));
            }
            words.push((id, hex(word, "quota count")?));
        }
        Ok(QuotaCounts {
            calendar: self.calendar.clone(),
            seed,
            words,
        })
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsJson {
    rate: String,
    burst: u64,
}

impl LimitsJson {
    fn new(limits: &Limits) -> LimitsJson {
        LimitsJson {
            rate: limits.rate.to_string(),
            burst: limits.burst,
        }
    }

    fn limits(&self, place: &str) -> Result<Limits, StateError> {
        let rate = Rate::parse(&self.rate)
            .map_err(|error| StateError::Corrupt(format!("{place}: {error}")))?;
        if self.burst > Limits::MAX_BURST {
            return Err(StateError::Corrupt(format!(
                "{place}: invalid burst {}",
                self.burst
            )));
        }
        Ok(Limits {
            rate,
            burst: self.burst,
        })
    }
}

impl StateFile {
    /// The file's text: pretty JSON, zones and overrides sorted by name.
    pub fn to_json(&self) -> String {
        let file = FileJson {
            version: VERSION,
            zones: self
                .zones
                .iter()
                .map(|(name, zone)| {
                    let overrides = zone
                        .overrides
                        .iter()
                        .map(|(key, limits)| (percent_encode(key), LimitsJson::new(limits)))
                        .collect();
                    let entry = ZoneJson {
                        algorithm: zone.algorithm.as_str().to_string(),
                        config: LimitsJson::new(&zone.config),
                        limits: LimitsJson::new(&zone.limits),
                        overrides,
                        quota: zone.quota.as_ref().map(QuotaJson::new),
                    };
                    (name.clone(), entry)
                })
                .collect(),
        };
        let mut text = serde_json::to_string_pretty(&file).unwrap_or_default();
        text.push('\n');
        text
    }

    /// Read a file's text. Any problem makes the whole file corrupt: a half-applied state is
    /// harder to reason about than none.
    ///
    /// ```
    /// use ratelimit_admin::state::StateFile;
    ///
    /// let error = StateFile::parse(b"{\"version\": 1, \"zones\": {").unwrap_err();
    /// assert_eq!(error.to_string(), "invalid JSON: EOF while parsing an object at line 1 column 25");
    /// ```
    pub fn parse(text: &[u8]) -> Result<StateFile, StateError> {
        let file: FileJson = serde_json::from_slice(text)
            .map_err(|error| StateError::Corrupt(format!("invalid JSON: {error}")))?;
        if file.version != VERSION {
            return Err(StateError::Corrupt(format!(
                "unsupported version {} (this module writes {VERSION})",
                file.version
            )));
        }
        let mut zones = BTreeMap::new();
        for (name, zone) in file.zones {
            let algorithm = Algorithm::parse(&zone.algorithm)
                .map_err(|error| StateError::Corrupt(format!("zone \"{name}\": {error}")))?;
            let mut overrides = Vec::with_capacity(zone.overrides.len());
            for (key, limits) in &zone.overrides {
                let place = format!("zone \"{name}\", override \"{key}\"");
                let decoded = percent_decode(key.as_bytes())
                    .map_err(|error| StateError::Corrupt(format!("{place}: {error}")))?;
                overrides.push((decoded, limits.limits(&place)?));
            }
            let quota = match &zone.quota {
                Some(quota) => Some(quota.counts(&format!("zone \"{name}\""))?),
                None => None,
            };
            let state = ZoneState {
                algorithm,
                config: zone.config.limits(&format!("zone \"{name}\", config"))?,
                limits: zone.limits.limits(&format!("zone \"{name}\", limits"))?,
                overrides,
                quota,
            };
            zones.insert(name, state);
        }
        Ok(StateFile { zones })
    }
}

/// Read and parse the file at `path`.
pub fn load(path: &Path) -> Result<StateFile, StateError> {
    match fs::read(path) {
        Ok(text) => StateFile::parse(&text),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Err(StateError::Missing),
        Err(error) => Err(StateError::Io(error)),
    }
}

/// `PATH.suffix`
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Replace the file at `path` with `state`, atomically (see the module's documentation).
/// `snapshot` is called with the lock held, so the state written is the newest one even when
/// several processes save at once.
pub fn save(path: &Path, snapshot: impl FnOnce() -> StateFile) -> io::Result<()> {
    let lock_path = sibling(path, ".lock");
    let lock = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CREAT)
        .mode(0o644)
        .open(&lock_path)
        .map_err(|error| annotate(error, &lock_path))?;
    let _locked = FileLock::exclusive(&lock).map_err(|error| annotate(error, &lock_path))?;

    let text = snapshot().to_json();
    let tmp_path = sibling(path, ".tmp");
    let write = || -> io::Result<()> {
        let mut tmp = File::create(&tmp_path)?;
        tmp.write_all(text.as_bytes())?;
        tmp.sync_all()
    };
    write().map_err(|error| annotate(error, &tmp_path))?;
    fs::rename(&tmp_path, path).map_err(|error| annotate(error, path))?;
    // The rename is durable once the directory is synced; a failure here loses nothing now.
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        let _ = File::open(dir).and_then(|dir| dir.sync_all());
    }
    Ok(())
}

fn annotate(error: io::Error, path: &Path) -> io::Error {
    io::Error::new(error.kind(), format!("{}: {error}", path.display()))
}

/// An exclusive `flock`, released on drop (and by the kernel if the process dies).
struct FileLock<'a>(&'a File);

#[allow(unsafe_code)]
impl<'a> FileLock<'a> {
    fn exclusive(file: &'a File) -> io::Result<FileLock<'a>> {
        loop {
            // SAFETY: flock takes a file descriptor we own (borrowed for the lock's lifetime).
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(FileLock(file));
            }
            let error = io::Error::last_os_error();
            if error.kind() != io::ErrorKind::Interrupted {
                return Err(error);
            }
        }
    }
}

#[allow(unsafe_code)]
impl Drop for FileLock<'_> {
    fn drop(&mut self) {
        // SAFETY: as above; unlocking a lock we hold.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// A line for the error log about restoring a zone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Note {
    /// Expected after a configuration change (nginx's `notice` level).
    Notice(String),
    /// An entry the zone cannot take any more (nginx's `warn` level).
    Warn(String),
}

/// What to restore into a zone whose memory is fresh.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Restore {
    /// New zone limits, when the saved runtime value still applies and differs from the
    /// configuration's.
    pub limits: Option<Limits>,
    pub overrides: Vec<(Vec<u8>, Limits)>,
    pub notes: Vec<Note>,
}

/// Decide what of `saved` applies to zone `name`, which now runs `algorithm` with `config`
/// from the configuration file.
///
/// ```
/// use ratelimit_admin::state::{plan_restore, ZoneState};
/// use ratelimit_core::{Algorithm, Limits, Rate};
///
/// let limits = |rate| Limits { rate: Rate::parse(rate).unwrap(), burst: 0 };
/// let saved = ZoneState {
///     algorithm: Algorithm::LeakyBucket,
///     config: limits("10r/s"),
///     limits: limits("20r/s"),
///     overrides: vec![(b"vip".to_vec(), limits("100r/s"))],
///     quota: None,
/// };
/// // Same configuration: the runtime value comes back.
/// let restore = plan_restore(&saved, "api", Algorithm::LeakyBucket, limits("10r/s"));
/// assert_eq!(restore.limits, Some(limits("20r/s")));
/// // The configuration changed: it wins; the override stays.
/// let restore = plan_restore(&saved, "api", Algorithm::LeakyBucket, limits("15r/s"));
/// assert_eq!((restore.limits, restore.overrides.len()), (None, 1));
/// ```
pub fn plan_restore(
    saved: &ZoneState,
    name: &str,
    algorithm: Algorithm,
    config: Limits,
) -> Restore {
    let mut restore = Restore::default();
    let capacity = ratelimit_core::sliding_log::window_limit(&config.rate);
    let check = |limits: &Limits| {
        check_limits(
            name,
            algorithm,
            limits,
            !algorithm.takes_burst() && limits.burst != 0,
            capacity,
        )
    };
    let shown = |limits: &Limits| format!("rate {} burst {}", limits.rate, limits.burst);

    if saved.algorithm != algorithm {
        if saved.limits != saved.config {
            restore.notes.push(Note::Notice(format!(
                "zone \"{name}\" now uses {algorithm} instead of {}: its runtime limits \
                 ({}) are dropped",
                saved.algorithm,
                shown(&saved.limits)
            )));
        }
    } else if saved.config != config {
        if saved.limits != saved.config {
            restore.notes.push(Note::Notice(format!(
                "zone \"{name}\": the configuration changed from {} to {}, it wins over the \
                 runtime limits ({})",
                shown(&saved.config),
                shown(&config),
                shown(&saved.limits)
            )));
        }
    } else if saved.limits != config {
        match check(&saved.limits) {
            Ok(()) => restore.limits = Some(saved.limits),
            Err(error) => restore.notes.push(Note::Warn(format!(
                "zone \"{name}\": runtime limits ({}) dropped: {error}",
                shown(&saved.limits)
            ))),
        }
    }

    for (key, limits) in &saved.overrides {
        match check(limits) {
            Ok(()) => restore.overrides.push((key.clone(), *limits)),
            Err(error) => restore.notes.push(Note::Warn(format!(
                "zone \"{name}\": override for key \"{}\" dropped: {error}",
                String::from_utf8_lossy(key)
            ))),
        }
    }
    restore
}

/// Notices for the zones of `saved` that the configuration no longer has (their entries are
/// dropped when the file is next written).
pub fn gone_zones<'a>(saved: &StateFile, configured: impl Fn(&str) -> bool + 'a) -> Vec<String> {
    saved
        .zones
        .iter()
        .filter(|(name, _)| !configured(name))
        .map(|(name, zone)| {
            format!(
                "zone \"{name}\" is no longer configured: its runtime limits and {} \
                 override(s) are dropped",
                zone.overrides.len()
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn limits(rate: &str, burst: u64) -> Limits {
        Limits {
            rate: Rate::parse(rate).unwrap(),
            burst,
        }
    }

    fn sample() -> StateFile {
        let mut zones = BTreeMap::new();
        zones.insert(
            "api".to_string(),
            ZoneState {
                algorithm: Algorithm::LeakyBucket,
                config: limits("10r/s", 5),
                limits: limits("0.5r/s", 10),
                overrides: vec![
                    (b"user/7 \xff\"".to_vec(), limits("100r/m", 20)),
                    (b"vip".to_vec(), limits("1r/d", 0)),
                ],
                quota: None,
            },
        );
        zones.insert(
            "log".to_string(),
            ZoneState {
                algorithm: Algorithm::SlidingLog,
                config: limits("100r/m", 0),
                limits: limits("50r/m", 0),
                overrides: Vec::new(),
                quota: None,
            },
        );
        zones.insert(
            "monthly".to_string(),
            ZoneState {
                algorithm: Algorithm::parse("quota").unwrap(),
                config: Limits::quota(1_000_000),
                limits: Limits::quota(1_000_000),
                overrides: vec![(b"acme".to_vec(), Limits::quota(3_000_000_000))],
                quota: Some(QuotaCounts {
                    calendar: "month in Europe/Berlin".into(),
                    seed: [u64::MAX, 7],
                    words: vec![(1, u64::MAX), (0xabc_def, 42 << 54 | 999_999)],
                }),
            },
        );
        StateFile { zones }
    }

    fn temp_dir() -> PathBuf {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "ratelimit-admin-state-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn round_trips_through_text() {
        let state = sample();
        let text = state.to_json();
        assert!(text.contains("\"user%2F7%20%FF%22\""), "{text}");
        assert!(text.contains("\"rate\": \"0.5r/s\""), "{text}");
        let mut parsed = StateFile::parse(text.as_bytes()).unwrap();
        // Overrides come back sorted by their encoded key.
        for zone in parsed.zones.values_mut() {
            zone.overrides.sort_by(|a, b| a.0.cmp(&b.0));
        }
        assert_eq!(parsed, state);
    }

    #[test]
    fn corrupt_files_say_why() {
        #[rustfmt::skip]
        let rows = [
            ("", "invalid JSON: EOF while parsing a value at line 1 column 0"),
            ("garbage", "invalid JSON: expected value at line 1 column 1"),
            (r#"{"version": 2, "zones": {}}"#, "unsupported version 2 (this module writes 1)"),
            (r#"{"zones": {}}"#, "invalid JSON: missing field `version`"),
            (r#"{"version": 1, "zones": {}, "x": 1}"#, "invalid JSON: unknown field `x`"),
            (r#"{"version": 1, "zones": {"a": {"algorithm": "fast",
                "config": {"rate": "1r/s", "burst": 0}, "limits": {"rate": "1r/s", "burst": 0}}}}"#,
             "zone \"a\": unknown algorithm \"fast\""),
            (r#"{"version": 1, "zones": {"a": {"algorithm": "token_bucket",
                "config": {"rate": "1r/s", "burst": 0}, "limits": {"rate": "0r/s", "burst": 0}}}}"#,
             "zone \"a\", limits: invalid rate \"0r/s\""),
            (r#"{"version": 1, "zones": {"a": {"algorithm": "token_bucket",
                "config": {"rate": "1r/s", "burst": 99999999}, "limits": {"rate": "1r/s", "burst": 0}}}}"#,
             "zone \"a\", config: invalid burst 99999999"),
            (r#"{"version": 1, "zones": {"a": {"algorithm": "token_bucket",
                "config": {"rate": "1r/s", "burst": 0}, "limits": {"rate": "1r/s", "burst": 0},
                "overrides": {"%zz": {"rate": "1r/s", "burst": 0}}}}}"#,
             "zone \"a\", override \"%zz\": invalid percent-encoding \"%zz\" in path"),
        ];
        for (text, start) in rows {
            let message = StateFile::parse(text.as_bytes()).unwrap_err().to_string();
            assert!(message.starts_with(start), "{text}: {message}");
        }
    }

    #[test]
    fn save_replaces_the_file_and_load_reads_it() {
        let dir = temp_dir();
        let path = dir.join("state.json");
        assert!(matches!(load(&path), Err(StateError::Missing)));
        save(&path, sample).unwrap();
        save(&path, sample).unwrap();
        let mut loaded = load(&path).unwrap();
        for zone in loaded.zones.values_mut() {
            zone.overrides.sort_by(|a, b| a.0.cmp(&b.0));
        }
        assert_eq!(loaded, sample());
        assert!(!dir.join("state.json.tmp").exists());
        assert!(dir.join("state.json.lock").exists());

        fs::write(&path, "{").unwrap();
        assert!(matches!(load(&path), Err(StateError::Corrupt(_))));

        let error = save(&dir.join("missing/state.json"), sample).unwrap_err();
        assert!(
            error.to_string().contains("missing/state.json.lock"),
            "{error}"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn concurrent_saves_never_interleave() {
        let dir = temp_dir();
        let path = dir.join("state.json");
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..20 {
                        save(&path, sample).unwrap();
                        assert!(load(&path).is_ok());
                    }
                });
            }
        });
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn restore_follows_the_configuration_rule() {
        let saved = &sample().zones["api"];
        let bucket = Algorithm::LeakyBucket;

        let same = plan_restore(saved, "api", bucket, limits("10r/s", 5));
        assert_eq!(same.limits, Some(limits("0.5r/s", 10)));
        assert_eq!(same.overrides.len(), 2);
        assert!(same.notes.is_empty());

        let changed = plan_restore(saved, "api", bucket, limits("10r/s", 6));
        assert_eq!(changed.limits, None);
        assert_eq!(changed.overrides.len(), 2);
        assert_eq!(
            changed.notes,
            [Note::Notice(
                "zone \"api\": the configuration changed from rate 10r/s burst 5 to rate \
                 10r/s burst 6, it wins over the runtime limits (rate 0.5r/s burst 10)"
                    .into()
            )]
        );

        // Another algorithm: limits dropped, overrides kept when the algorithm takes them.
        let other = plan_restore(saved, "api", Algorithm::SlidingWindow, limits("10r/s", 0));
        assert_eq!(other.limits, None);
        assert_eq!(other.overrides, [(b"vip".to_vec(), limits("1r/d", 0))]);
        assert_eq!(other.notes.len(), 2, "{:?}", other.notes);
        assert!(matches!(&other.notes[1], Note::Warn(text) if text.contains("user/7")));

        // A runtime value equal to the configuration restores nothing.
        let mut plain = saved.clone();
        plain.limits = plain.config;
        assert_eq!(
            plan_restore(&plain, "api", bucket, plain.config).limits,
            None
        );
    }

    #[test]
    fn sliding_log_overrides_above_the_log_are_dropped() {
        let mut saved = sample().zones["log"].clone();
        saved.overrides = vec![
            (b"small".to_vec(), limits("10r/m", 0)),
            (b"big".to_vec(), limits("200r/m", 0)),
        ];
        let restore = plan_restore(&saved, "log", Algorithm::SlidingLog, limits("100r/m", 0));
        assert_eq!(restore.limits, Some(limits("50r/m", 0)));
        assert_eq!(restore.overrides, [(b"small".to_vec(), limits("10r/m", 0))]);
        assert!(matches!(&restore.notes[..], [Note::Warn(text)] if text.contains("\"big\"")));
    }

    /// A bucket beyond the largest the rate allows (written by hand, or by a version that
    /// took it) is dropped with the API's message, whether runtime limits or an override.
    #[test]
    fn buckets_too_large_for_their_rate_are_dropped() {
        let mut saved = sample().zones["api"].clone();
        saved.limits = limits("0.001r/d", 300);
        saved.overrides = vec![
            (b"fine".to_vec(), limits("0.001r/d", 35)),
            (b"huge".to_vec(), limits("0.001r/d", 4194303)),
        ];
        let restore = plan_restore(&saved, "api", Algorithm::LeakyBucket, saved.config);
        assert_eq!(restore.limits, None);
        assert_eq!(
            restore.overrides,
            [(b"fine".to_vec(), limits("0.001r/d", 35))]
        );
        assert_eq!(
            restore.notes,
            [
                Note::Warn(
                    "zone \"api\": runtime limits (rate 0.001r/d burst 300) dropped: burst 300 \
                     is too large for rate \"0.001r/d\" (at most 35: a leaky_bucket must drain \
                     within 100 years)"
                        .into()
                ),
                Note::Warn(
                    "zone \"api\": override for key \"huge\" dropped: burst 4194303 is too \
                     large for rate \"0.001r/d\" (at most 35: a leaky_bucket must drain within \
                     100 years)"
                        .into()
                ),
            ]
        );
    }

    #[test]
    fn zones_no_longer_configured_are_named() {
        let notes = gone_zones(&sample(), |name| name == "api" || name == "monthly");
        assert_eq!(
            notes,
            ["zone \"log\" is no longer configured: its runtime limits and 0 override(s) are dropped"]
        );
    }
}
