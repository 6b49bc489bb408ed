//! The file on disk: replaced whole by each save (a temporary file synced, then renamed over
//! it), the save before kept as `PATH.prev`; read back within a size bound, the previous copy
//! consulted for what a damaged file lacks.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use super::{read, Note, Reading, StateError, StateFile, ZoneState};

/// `PATH.suffix`
pub fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// The largest file read for zones of these sizes (bytes of shared memory each): 8 bytes of
/// text for every byte of them, and 1 MiB. A save writes less (a key's count is about 35
/// bytes of text for a slot of at least 16 bytes, an override at most 3 bytes a byte of its
/// key and 60 more); a file beyond it is read up to the bound only.
///
/// ```
/// use ratelimit_admin::state::size_bound;
///
/// assert_eq!(size_bound([1 << 20, 1 << 20]), 17 << 20);
/// ```
pub fn size_bound(zone_bytes: impl IntoIterator<Item = u64>) -> u64 {
    zone_bytes.into_iter().fold(1 << 20, |sum, bytes| {
        sum.saturating_add(bytes.saturating_mul(8))
    })
}

/// Read one file, at most `max_bytes` of it.
pub fn read_file(path: &Path, max_bytes: u64) -> Result<Reading, StateError> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Err(StateError::Missing),
        Err(error) => return Err(StateError::Io(error)),
    };
    let mut text = Vec::new();
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut text)?;
    if text.len() as u64 <= max_bytes {
        return Ok(read(&text));
    }
    // Beyond the bound: what its whole lines hold, as if the file ended there.
    text.truncate(max_bytes as usize);
    let end = text
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |at| at + 1);
    text.truncate(end);
    let mut reading = read(&text);
    reading.problems.insert(
        0,
        format!(
            "it is larger than its zones can fill (at most {max_bytes} bytes): the rest is not \
             read"
        ),
    );
    Ok(reading)
}

/// The file read back, with its previous copy when it is damaged.
#[derive(Debug)]
pub struct Loaded {
    pub current: Reading,
    /// `PATH.prev`, read only when `current` is not whole: `None` when it does not exist.
    pub previous: Option<Reading>,
    previous_path: PathBuf,
}

/// Read the file at `path` (at most `max_bytes` of it, see [`size_bound`]) and, when it is
/// damaged, its previous copy. `Err(Missing)` when `path` does not exist: a file deleted by
/// hand starts every zone afresh, whatever the previous copy holds.
pub fn load(path: &Path, max_bytes: u64) -> Result<Loaded, StateError> {
    let current = match read_file(path, max_bytes) {
        Ok(reading) => reading,
        Err(StateError::Missing) => return Err(StateError::Missing),
        Err(error) => Reading::refused(error.to_string()),
    };
    let previous_path = sibling(path, ".prev");
    let previous = if current.is_whole() {
        None
    } else {
        match read_file(&previous_path, max_bytes) {
            Ok(reading) => Some(reading),
            Err(StateError::Missing) => None,
            Err(error) => Some(Reading::refused(error.to_string())),
        }
    };
    Ok(Loaded {
        current,
        previous,
        previous_path,
    })
}

/// What was found wrong, as one line: the first few problems, and how many in all.
fn listed(problems: &[String]) -> String {
    const SHOWN: usize = 3;
    let mut text = problems
        .iter()
        .take(SHOWN)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join("; ");
    if problems.len() > SHOWN {
        text.push_str(&format!(" ({} problems in all)", problems.len()));
    }
    text
}

/// What a zone gets from the file, and the line to log about it.
#[derive(Debug)]
pub struct Chosen<'a> {
    pub state: Option<&'a ZoneState>,
    pub note: Option<Note>,
}

impl Loaded {
    /// The line to log about the file as a whole (after `rate_limit_state_file "PATH" `),
    /// when it is not whole: what is wrong, and where the zones it lacks come from.
    pub fn file_note(&self) -> Option<String> {
        if self.current.is_whole() {
            return None;
        }
        let what = match &self.current.refused {
            Some(reason) => format!("is ignored: {reason}"),
            None => format!("is damaged: {}", listed(&self.current.problems_all())),
        };
        let previous = self.previous_path.display();
        let from = match &self.previous {
            None => format!("its previous copy \"{previous}\" does not exist"),
            Some(reading) => match &reading.refused {
                Some(reason) => {
                    format!("its previous copy \"{previous}\" is ignored too: {reason}")
                }
                None => {
                    format!("the zones it lacks are read from its previous copy \"{previous}\"")
                }
            },
        };
        Some(format!("{what}; {from}"))
    }

    /// The state to restore into zone `name`: the file's when it has the zone whole, else the
    /// previous copy's when that has it whole, else what is left of it in either.
    pub fn zone(&self, name: &str) -> Chosen<'_> {
        let chosen = |state, note| Chosen { state, note };
        let current = self.current.zones.get(name);
        if let Some(zone) = current.filter(|zone| zone.is_whole()) {
            return chosen(zone.state.as_ref(), None);
        }
        let announced = self.current.announced.as_ref();
        let absent =
            current.is_none() && announced.is_some_and(|names| !names.iter().any(|n| n == name));
        if self.current.is_whole() || absent {
            // The last save did not have the zone.
            return chosen(None, None);
        }
        let previous = self
            .previous
            .as_ref()
            .and_then(|reading| reading.zones.get(name));
        let damage = current.map_or("none of its lines is left".to_string(), |zone| {
            listed(&zone.damage)
        });
        let shown = name.escape_debug();
        let from = self.previous_path.display();
        if let Some(zone) = previous.filter(|zone| zone.is_whole()) {
            let note = format!("zone \"{shown}\" is damaged ({damage}): restored from its previous copy \"{from}\", the save before");
            return chosen(zone.state.as_ref(), Some(Note::Warn(note)));
        }
        if let Some(state) = current.and_then(|zone| zone.state.as_ref()) {
            let note = format!("zone \"{shown}\" is restored in part: {damage}");
            return chosen(Some(state), Some(Note::Warn(note)));
        }
        if let Some(zone) = previous.filter(|zone| zone.state.is_some()) {
            let note = format!(
                "zone \"{shown}\" is damaged ({damage}): restored in part from its previous copy \"{from}\": {}",
                listed(&zone.damage)
            );
            return chosen(zone.state.as_ref(), Some(Note::Warn(note)));
        }
        if current.is_some() || previous.is_some() {
            let note = format!("zone \"{shown}\" is not restored: {damage}");
            return chosen(None, Some(Note::Error(note)));
        }
        let note = format!("zone \"{shown}\" is not in what is left of the file: it starts afresh");
        chosen(None, Some(Note::Notice(note)))
    }

    /// The zones the file has (whole or in part), by name.
    pub fn zone_names(&self) -> impl Iterator<Item = &str> {
        self.current.zones.keys().map(String::as_str)
    }
}

/// Replace the file at `path` with what `snapshot` gives, so that a crash at any point leaves
/// either the old file or the new one whole: the text goes to `PATH.tmp`, which is synced, the
/// old file is kept as `PATH.prev` (a hard link, or a copy where links are refused), then
/// `PATH.tmp` is renamed over `PATH`; the directory is synced after each rename, so that they
/// reach the disk in their order (a `PATH` of the new save never beside a `PATH.prev` of
/// the save before the old one). All of it under an exclusive
/// `flock` on `PATH.lock`, so that two processes saving at once cannot interleave (the kernel
/// drops the lock of a process that dies); `snapshot` is called with the lock held, so the
/// state written is the newest one. On an error the old file stays as it was.
pub fn save(path: &Path, snapshot: impl FnOnce() -> StateFile) -> io::Result<()> {
    let lock_path = sibling(path, ".lock");
    let lock = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CREAT)
        .mode(0o644)
        .open(&lock_path)
        .map_err(|error| annotate(error, &lock_path))?;
    let _locked = FileLock::exclusive(&lock).map_err(|error| annotate(error, &lock_path))?;

    let text = snapshot().to_lines();
    let tmp_path = sibling(path, ".tmp");
    let write = || -> io::Result<()> {
        let mut tmp = File::create(&tmp_path)?;
        tmp.write_all(text.as_bytes())?;
        tmp.sync_all()
    };
    if let Err(error) = write() {
        // A full disk keeps no half file: the space goes back, the old file stays.
        let _ = fs::remove_file(&tmp_path);
        return Err(annotate(error, &tmp_path));
    }
    keep_previous(path)?;
    fs::rename(&tmp_path, path).map_err(|error| annotate(error, path))?;
    // The new file is in place: a failure to make its rename durable loses nothing now.
    let _ = sync_dir(path);
    Ok(())
}

/// Sync the directory of `path`: a rename in it is durable once it is.
fn sync_dir(path: &Path) -> io::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|dir| dir.sync_all())
        .map_err(|error| annotate(error, dir))
}

/// `PATH.prev` becomes the file now at `PATH` (whole: it was renamed there), itself by a
/// rename, so that a crash leaves the old `PATH.prev` or the new one; the rename is synced
/// before `PATH` is replaced (an error stops the save with `PATH` as it was).
fn keep_previous(path: &Path) -> io::Result<()> {
    let previous = sibling(path, ".prev");
    let staged = sibling(path, ".prev.tmp");
    let _ = fs::remove_file(&staged);
    match fs::hard_link(path, &staged) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(_) => {
            let copy = || -> io::Result<()> {
                fs::copy(path, &staged)?;
                File::open(&staged)?.sync_all()
            };
            if let Err(error) = copy() {
                let _ = fs::remove_file(&staged);
                return Err(annotate(error, &staged));
            }
        }
    }
    fs::rename(&staged, &previous).map_err(|error| annotate(error, &previous))?;
    sync_dir(path)
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
