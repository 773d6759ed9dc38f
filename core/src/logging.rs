//! Logging for perago's processes: human-readable lines on stderr, and, for the broker and the
//! executors, one JSONL file per worker id under
//! `PERAGO_LOG_ROOT/<task name>/worker_id=<id>/perago.jsonl`, rotated by size
//! (`perago.jsonl.1` … `.N-1`, oldest dropped). Every JSON line carries `ts`, `level`,
//! `worker_id`, `message` and the event's fields (`task_id` and `execution_id` where there is
//! one).
//!
//! A line that cannot be written (a full log root, an I/O error) is dropped, never waited
//! for: the worker goes on. The first drop is said on stderr (with the file and the error),
//! and so is the first line written again (with how many were dropped); every dropped line
//! is counted in [`lines_dropped`] (the broker's `/metrics`: `perago_log_lines_dropped_total`).

use std::{
    fmt::Write as _,
    fs::{self, File, OpenOptions},
    io::{self, Write as _},
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{SystemTime, UNIX_EPOCH},
};
use tracing::{
    Event, Subscriber,
    field::{Field, Visit},
};
use tracing_subscriber::{EnvFilter, Layer, fmt, layer::Context, prelude::*};

pub use crate::env::PERAGO_LOG_ROOT;
/// Rotate a log file past this size (a byte count or a size such as `64MiB`).
pub const PERAGO_LOG_MAX_BYTES: &str = "PERAGO_LOG_MAX_BYTES";
/// Files kept per worker, the current one included.
pub const PERAGO_LOG_MAX_FILES: &str = "PERAGO_LOG_MAX_FILES";
/// Default rotation size: 64 MiB.
pub const DEFAULT_MAX_BYTES: u64 = 64 << 20;
/// The least `PERAGO_LOG_MAX_BYTES`: a smaller file would rotate on every few lines.
pub const MIN_MAX_BYTES: u64 = 1024;
/// Default number of files kept: 5.
pub const DEFAULT_MAX_FILES: usize = 5;
const FILE_NAME: &str = "perago.jsonl";

/// A worker's logging that could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LogConfigError {
    /// `PERAGO_LOG_MAX_BYTES` is not a byte size.
    #[error("{PERAGO_LOG_MAX_BYTES}")]
    MaxBytes(#[source] crate::units::ByteSizeError),
    /// `PERAGO_LOG_MAX_BYTES` is below [`MIN_MAX_BYTES`] (it was raised to it silently).
    #[error("{PERAGO_LOG_MAX_BYTES} {value:?}: must be at least 1KiB")]
    MaxBytesTooSmall {
        /// The value as given.
        value: String,
    },
    /// `PERAGO_LOG_MAX_FILES` is not a count of at least 1.
    #[error("{PERAGO_LOG_MAX_FILES}: expected a count of at least 1, got {value:?}")]
    MaxFiles {
        /// The value as given.
        value: String,
    },
    /// The worker's log folder or file cannot be opened.
    #[error("cannot open the log folder {}", dir.display())]
    Open {
        /// The worker's log folder.
        dir: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
}

/// Where and how one worker writes its JSONL log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonlConfig {
    /// `PERAGO_LOG_ROOT`.
    pub root: PathBuf,
    /// The task name (a folder level).
    pub task: String,
    /// The worker id (the folder `worker_id=<id>`, and a field of every line).
    pub worker_id: String,
    /// Rotation size.
    pub max_bytes: u64,
    /// Files kept, at least 1.
    pub max_files: usize,
}

impl JsonlConfig {
    /// The folder of this worker's files.
    pub fn dir(&self) -> PathBuf {
        self.root
            .join(&self.task)
            .join(format!("worker_id={}", self.worker_id))
    }

    /// Reads the rotation settings from the environment (unset = defaults).
    pub fn from_env(root: PathBuf, task: &str, worker_id: &str) -> Result<Self, LogConfigError> {
        Self::from_lookup(root, task, worker_id, |name| std::env::var(name).ok())
    }

    /// Like [`JsonlConfig::from_env`], reading the variables through `lookup`.
    pub fn from_lookup(
        root: PathBuf,
        task: &str,
        worker_id: &str,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, LogConfigError> {
        let max_bytes = match lookup(PERAGO_LOG_MAX_BYTES) {
            Some(v) if !v.trim().is_empty() => {
                let bytes = crate::units::parse_byte_size(&v).map_err(LogConfigError::MaxBytes)?;
                if bytes < MIN_MAX_BYTES {
                    return Err(LogConfigError::MaxBytesTooSmall { value: v });
                }
                bytes
            }
            _ => DEFAULT_MAX_BYTES,
        };
        let max_files = match lookup(PERAGO_LOG_MAX_FILES) {
            Some(v) if !v.trim().is_empty() => v
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|n| *n >= 1)
                .ok_or(LogConfigError::MaxFiles { value: v })?,
            _ => DEFAULT_MAX_FILES,
        };
        Ok(Self {
            root,
            task: task.to_owned(),
            worker_id: worker_id.to_owned(),
            max_bytes,
            max_files,
        })
    }
}

/// JSONL lines this process could not write (every worker of the process: thread mode runs
/// several in one).
static LINES_DROPPED: AtomicU64 = AtomicU64::new(0);

/// How many JSONL lines this process has dropped because they could not be written.
pub fn lines_dropped() -> u64 {
    LINES_DROPPED.load(Ordering::Relaxed)
}

/// Whether a log file's writes fail, so that the change is said once each way.
#[derive(Debug, Default)]
struct DropState {
    /// Lines dropped since the writes started failing; `None` while they work.
    dropping: Option<u64>,
}

/// What to tell stderr about a log file's writes.
#[derive(Debug, PartialEq, Eq)]
enum DropNotice {
    /// The first line dropped (with the error).
    Started(String),
    /// The first line written again after `dropped` lines were lost.
    Recovered { dropped: u64 },
}

impl DropState {
    /// Records one line's write; returns what to say, if anything.
    fn record(&mut self, written: &io::Result<()>) -> Option<DropNotice> {
        match (written, &mut self.dropping) {
            (Ok(()), None) => None,
            (Ok(()), dropping @ Some(_)) => {
                let dropped = dropping.take().unwrap_or(0);
                Some(DropNotice::Recovered { dropped })
            }
            (Err(e), None) => {
                self.dropping = Some(1);
                Some(DropNotice::Started(crate::errors::chain(&e)))
            }
            (Err(_), Some(n)) => {
                *n += 1;
                None
            }
        }
    }
}

/// A file writer that rotates by size.
#[derive(Debug)]
pub struct RotatingFile {
    dir: PathBuf,
    max_bytes: u64,
    max_files: usize,
    file: File,
    size: u64,
    drops: DropState,
    /// A failed write may have left part of a line: the next line starts on a new one.
    torn: bool,
}

/// Opens `path` for appending, created 0600. A symlink in its place is refused (the open
/// would follow it, and the 0600 that follows would be set on whatever it points at), and so
/// is anything but a regular file (a FIFO would block the writer; `O_NONBLOCK` keeps the open
/// itself from blocking, and means nothing for a regular file).
fn open_log(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a regular file", path.display()),
        ));
    }
    Ok(file)
}

impl RotatingFile {
    /// Opens (appending) `dir/perago.jsonl`, creating `dir`. Logs name tasks, workflows and
    /// body output: the folders are 0700 and the files 0600 (an existing worker folder and
    /// file are closed too), whatever the umask.
    pub fn open(dir: &Path, max_bytes: u64, max_files: usize) -> io::Result<Self> {
        use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        // Through a descriptor of the folder itself: a symlink put in its place is refused,
        // not followed to chmod what it points at.
        perago_sys::fd::dir::Dir::open(dir)?.chmod(0o700)?;
        let file = open_log(&dir.join(FILE_NAME))?;
        file.set_permissions(fs::Permissions::from_mode(0o600))?;
        let size = file.metadata()?.len();
        Ok(Self {
            dir: dir.to_owned(),
            max_bytes,
            max_files: max_files.max(1),
            file,
            size,
            drops: DropState::default(),
            torn: false,
        })
    }

    /// Writes one whole line as [`Self::write_line`] does; a line that cannot be written is
    /// dropped and counted, and the first drop and the first line written after drops are
    /// said on stderr (not through `tracing`: this is the log).
    pub fn write_line_or_drop(&mut self, line: &[u8]) {
        let written = self.write_whole_line(line);
        if written.is_err() {
            LINES_DROPPED.fetch_add(1, Ordering::Relaxed);
        }
        match self.drops.record(&written) {
            None => {}
            Some(DropNotice::Started(problem)) => eprintln!(
                "perago: cannot write the log file {}: {problem}; dropping its lines until \
                 writing works again (counted in perago_log_lines_dropped_total)",
                self.path(0).display()
            ),
            Some(DropNotice::Recovered { dropped }) => eprintln!(
                "perago: writing the log file {} again; {dropped} lines were dropped",
                self.path(0).display()
            ),
        }
    }

    /// [`Self::write_line`], after a newline if an earlier failed write left part of a line.
    fn write_whole_line(&mut self, line: &[u8]) -> io::Result<()> {
        if self.torn {
            self.file.write_all(b"\n")?;
            self.size += 1;
            self.torn = false;
        }
        let before = self.size;
        let written = self.write_line(line);
        if written.is_err()
            && let Ok(meta) = self.file.metadata()
        {
            // Some bytes may have gone out: the file is longer than before the line. (Read
            // only after a failure: the common path costs no system call more.)
            self.torn = meta.len() > before;
            self.size = meta.len();
        }
        written
    }

    fn path(&self, n: usize) -> PathBuf {
        if n == 0 {
            self.dir.join(FILE_NAME)
        } else {
            self.dir.join(format!("{FILE_NAME}.{n}"))
        }
    }

    fn rotate(&mut self) -> io::Result<()> {
        if self.max_files == 1 {
            self.file.set_len(0)?;
        } else {
            let _ = fs::remove_file(self.path(self.max_files - 1));
            for n in (0..self.max_files - 1).rev() {
                let from = self.path(n);
                if from.exists() {
                    fs::rename(&from, self.path(n + 1))?;
                }
            }
            self.file = open_log(&self.path(0))?;
        }
        self.size = 0;
        Ok(())
    }

    /// Writes one whole line, rotating first if it would overflow the current file.
    pub fn write_line(&mut self, line: &[u8]) -> io::Result<()> {
        if self.size > 0 && self.size + line.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        self.file.write_all(line)?;
        self.size += line.len() as u64;
        Ok(())
    }
}

/// Appends `text` to `out` as a JSON string (quoted and escaped).
fn push_json_str(out: &mut Vec<u8>, text: &str) {
    // Writing into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, text);
}

/// The names a line sets itself: an event field of the same name is left out.
const RESERVED: [&str; 4] = ["ts_ms", "level", "worker_id", "message"];

/// Writes an event's fields as JSON members (`,"name":value`) straight into the line, and
/// keeps its message apart: no map is built per event.
#[derive(Default)]
struct JsonFields {
    message: String,
    members: Vec<u8>,
    /// The names written, in order; `ends[i]` is where member `i` ends in `members`.
    names: Vec<&'static str>,
    ends: Vec<usize>,
}

impl JsonFields {
    fn member(&mut self, field: &Field) -> bool {
        let name = field.name();
        if RESERVED.contains(&name) {
            return false;
        }
        // The member before this one ends here (unless `close` ended it already).
        if self.ends.len() < self.names.len() {
            self.ends.push(self.members.len());
        }
        self.names.push(name);
        self.members.push(b',');
        push_json_str(&mut self.members, name);
        self.members.push(b':');
        true
    }
}

impl Visit for JsonFields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            value.clone_into(&mut self.message);
        } else if self.member(field) {
            push_json_str(&mut self.members, value);
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        if self.member(field) {
            let _ = write!(VecWriter(&mut self.members), "{value}");
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        if self.member(field) {
            let _ = write!(VecWriter(&mut self.members), "{value}");
        }
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        if self.member(field) {
            self.members
                .extend_from_slice(if value { b"true" } else { b"false" });
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message.clear();
            let _ = write!(self.message, "{value:?}");
        } else if self.member(field) {
            let mut text = String::new();
            let _ = write!(text, "{value:?}");
            push_json_str(&mut self.members, &text);
        }
    }
}

impl JsonFields {
    /// Closes the member list: `ends` then has one entry per name.
    fn close(&mut self) {
        if self.ends.len() < self.names.len() {
            self.ends.push(self.members.len());
        }
    }

    /// Each member's name and text (`,"name":value`).
    fn each(&self) -> impl Iterator<Item = (&'static str, &[u8])> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        self.names
            .iter()
            .zip(starts.zip(self.ends.iter().copied()))
            .map(|(name, (start, end))| (*name, &self.members[start..end]))
    }
}

/// The fields of a span, as JSON members, kept in its extensions: every event inside the span
/// carries them (the ids of an assignment, say) unless it sets the same name itself.
struct SpanMembers(JsonFields);

/// `fmt::Write` into a byte buffer (for numbers).
struct VecWriter<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for VecWriter<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// The tracing layer that writes JSONL.
struct JsonlLayer {
    /// `"worker_id":"<id>"`, escaped once.
    worker_member: Vec<u8>,
    out: Arc<Mutex<RotatingFile>>,
}

impl JsonlLayer {
    fn new(worker_id: &str, out: RotatingFile) -> Self {
        let mut worker_member = b"\"worker_id\":".to_vec();
        push_json_str(&mut worker_member, worker_id);
        Self {
            worker_member,
            out: Arc::new(Mutex::new(out)),
        }
    }

    /// One event's line: `ts_ms`, `level`, `worker_id`, `message`, then its fields in order.
    fn line(&self, level: &str, ts_ms: u64, fields: &JsonFields) -> Vec<u8> {
        let mut line = Vec::with_capacity(96 + fields.message.len() + fields.members.len());
        let _ = write!(VecWriter(&mut line), "{{\"ts_ms\":{ts_ms},\"level\":");
        push_json_str(&mut line, level);
        line.push(b',');
        line.extend_from_slice(&self.worker_member);
        line.extend_from_slice(b",\"message\":");
        push_json_str(&mut line, &fields.message);
        line.extend_from_slice(&fields.members);
        line.extend_from_slice(b"}\n");
        line
    }
}

impl<S> Layer<S> for JsonlLayer
where
    S: Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: Context<'_, S>,
    ) {
        let mut fields = JsonFields::default();
        attrs.record(&mut fields);
        fields.close();
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(SpanMembers(fields));
        }
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        ctx: Context<'_, S>,
    ) {
        if let Some(span) = ctx.span(id)
            && let Some(SpanMembers(fields)) = span.extensions_mut().get_mut::<SpanMembers>()
        {
            values.record(fields);
            fields.close();
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = JsonFields::default();
        event.record(&mut fields);
        fields.close();
        // The fields of the spans the event is in, innermost first, each name once.
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope {
                let extensions = span.extensions();
                let Some(SpanMembers(outer)) = extensions.get::<SpanMembers>() else {
                    continue;
                };
                for (name, member) in outer.each() {
                    if !fields.names.contains(&name) {
                        fields.names.push(name);
                        fields.members.extend_from_slice(member);
                        fields.ends.push(fields.members.len());
                    }
                }
            }
        }
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let line = self.line(event.metadata().level().as_str(), ts, &fields);
        if let Ok(mut out) = self.out.lock() {
            // A full disk must not take the worker down; the terminal still has the line.
            out.write_line_or_drop(&line);
        }
    }
}

fn env_filter() -> EnvFilter {
    env_filter_or("info")
}

fn env_filter_or(default: &str) -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default))
}

fn stderr_layer<S>() -> impl Layer<S>
where
    S: Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fmt::layer()
        .with_writer(io::stderr)
        .with_target(false)
        .with_ansi(io::IsTerminal::is_terminal(&io::stderr()))
}

/// Installs a stderr subscriber: `RUST_LOG` if set, else `info`. Safe to call twice (the
/// second call is a no-op), so tests that start several components in one process work.
pub fn init_stderr(process: &str) {
    let _ = tracing_subscriber::registry()
        .with(env_filter())
        .with(stderr_layer())
        .try_init();
    tracing::debug!(process, "logging to stderr");
}

/// Like [`init_stderr`], with `default` as the level filter when `RUST_LOG` is unset.
pub fn init_stderr_at(default: &str) {
    let _ = tracing_subscriber::registry()
        .with(env_filter_or(default))
        .with(stderr_layer())
        .try_init();
}

/// The logging of a broker or executor process: stderr, plus the worker's JSONL folder when
/// `PERAGO_LOG_ROOT` is set. The error names the variable or folder at fault.
pub fn init_worker_from_env(
    process: &str,
    task: &str,
    worker_id: &str,
) -> Result<(), LogConfigError> {
    match std::env::var_os(PERAGO_LOG_ROOT).filter(|v| !v.is_empty()) {
        None => init_stderr(process),
        Some(root) => {
            let config = JsonlConfig::from_env(root.into(), task, worker_id)?;
            init_worker(&config).map_err(|source| LogConfigError::Open {
                dir: config.dir(),
                source,
            })?;
        }
    }
    Ok(())
}

/// The logging of one worker as a dispatcher of its own, not installed: stderr plus the
/// worker's JSONL file, as [`init_worker`] installs for a whole process. Thread mode runs each
/// worker on threads of its own and makes this their default (`tracing::dispatcher::set_default`),
/// so each worker id still gets its folder.
pub fn worker_dispatch(config: &JsonlConfig) -> io::Result<tracing::Dispatch> {
    let file = RotatingFile::open(&config.dir(), config.max_bytes, config.max_files)?;
    let jsonl = JsonlLayer::new(&config.worker_id, file);
    Ok(tracing::Dispatch::new(
        tracing_subscriber::registry()
            .with(env_filter())
            .with(stderr_layer())
            .with(jsonl),
    ))
}

/// Installs stderr logging plus this worker's JSONL file. Returns the file's folder.
pub fn init_worker(config: &JsonlConfig) -> io::Result<PathBuf> {
    let dir = config.dir();
    let file = RotatingFile::open(&dir, config.max_bytes, config.max_files)?;
    let jsonl = JsonlLayer::new(&config.worker_id, file);
    let _ = tracing_subscriber::registry()
        .with(env_filter())
        .with(stderr_layer())
        .with(jsonl)
        .try_init();
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_rotation_settings_name_the_variable() {
        let config = |name: &'static str, value: &'static str| {
            JsonlConfig::from_lookup("/logs".into(), "t", "w", move |n| {
                (n == name).then(|| value.to_owned())
            })
        };
        let err = config(PERAGO_LOG_MAX_BYTES, "lots").unwrap_err();
        assert!(matches!(err, LogConfigError::MaxBytes(ref e) if e.value == "lots"));
        assert!(
            crate::errors::chain(&err)
                .starts_with("PERAGO_LOG_MAX_BYTES: invalid byte size \"lots\"")
        );
        let err = config(PERAGO_LOG_MAX_BYTES, "0").unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"PERAGO_LOG_MAX_BYTES "0": must be at least 1KiB"#
        );
        assert!(config(PERAGO_LOG_MAX_BYTES, "1KiB").is_ok());
        let err = config(PERAGO_LOG_MAX_FILES, "0").unwrap_err();
        assert!(matches!(err, LogConfigError::MaxFiles { ref value } if value == "0"));
        assert_eq!(
            err.to_string(),
            "PERAGO_LOG_MAX_FILES: expected a count of at least 1, got \"0\""
        );
        let ok = config(PERAGO_LOG_MAX_FILES, "2").unwrap();
        assert_eq!((ok.max_bytes, ok.max_files), (DEFAULT_MAX_BYTES, 2));
    }

    #[test]
    fn a_symlink_in_place_of_a_log_file_or_folder_is_refused_not_followed() {
        use std::os::unix::fs::PermissionsExt as _;
        let tmp = tempfile::tempdir().unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        // Someone else's file, which a log opened through a symlink would append to and close.
        let victim = tmp.path().join("victim");
        fs::write(&victim, "theirs\n").unwrap();
        fs::set_permissions(&victim, fs::Permissions::from_mode(0o644)).unwrap();
        let dir = tmp.path().join("worker_id=w1");
        fs::create_dir(&dir).unwrap();
        std::os::unix::fs::symlink(&victim, dir.join(FILE_NAME)).unwrap();
        let err = RotatingFile::open(&dir, 1000, 2).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ELOOP), "{err}");
        assert_eq!(fs::read_to_string(&victim).unwrap(), "theirs\n");
        assert_eq!(mode(&victim), 0o644);
        // A folder replaced by a symlink to another folder: that folder keeps its mode.
        let other = tmp.path().join("other");
        fs::create_dir(&other).unwrap();
        fs::set_permissions(&other, fs::Permissions::from_mode(0o755)).unwrap();
        let linked = tmp.path().join("worker_id=w2");
        std::os::unix::fs::symlink(&other, &linked).unwrap();
        assert!(RotatingFile::open(&linked, 1000, 2).is_err());
        assert_eq!(mode(&other), 0o755);
        assert!(!other.join(FILE_NAME).exists());
    }

    #[test]
    fn logs_are_readable_by_their_user_only() {
        use std::os::unix::fs::PermissionsExt as _;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("task/worker_id=w1");
        // An earlier, open folder is closed too.
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        let mut f = RotatingFile::open(&dir, 100, 3).unwrap();
        for _ in 0..5 {
            f.write_line(&[b'x'; 60]).unwrap();
        }
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        RotatingFile::open(&tmp.path().join("new/worker_id=w2"), 100, 3).unwrap();
        assert_eq!(mode(&tmp.path().join("new")), 0o700);
        for name in ["perago.jsonl", "perago.jsonl.1", "perago.jsonl.2"] {
            assert_eq!(mode(&dir.join(name)), 0o600, "{name}");
        }
    }

    /// A full log root: the first dropped line is said, the others only counted, and the
    /// first line written again is said with the count; writing never fails the caller.
    #[test]
    fn drops_are_said_once_each_way() {
        let enospc = || Err(io::Error::from_raw_os_error(28));
        let mut state = DropState::default();
        assert_eq!(state.record(&Ok(())), None);
        let started = state.record(&enospc());
        assert!(
            matches!(&started, Some(DropNotice::Started(e)) if e.contains("No space left on device")),
            "{started:?}"
        );
        for _ in 0..4 {
            assert_eq!(state.record(&enospc()), None, "said once");
        }
        assert_eq!(
            state.record(&Ok(())),
            Some(DropNotice::Recovered { dropped: 5 })
        );
        assert_eq!(state.record(&Ok(())), None);
        assert!(matches!(
            state.record(&enospc()),
            Some(DropNotice::Started(_))
        ));
    }

    /// Lines to a sink that answers ENOSPC (`/dev/full`) are dropped and counted in
    /// `lines_dropped`; the writer goes on.
    #[test]
    fn lines_to_a_full_sink_are_counted_as_dropped() {
        let tmp = tempfile::tempdir().unwrap();
        let mut f = RotatingFile::open(tmp.path(), 1 << 20, 2).unwrap();
        // The sink swapped for /dev/full (opened here, never chmod-ed: it is the system's).
        f.file = OpenOptions::new().append(true).open("/dev/full").unwrap();
        let before = lines_dropped();
        for _ in 0..3 {
            f.write_line_or_drop(b"{\"message\":\"x\"}\n");
        }
        // Other tests of this process may drop lines too: at least ours.
        assert!(lines_dropped() >= before + 3);
        assert_eq!(f.drops.dropping, Some(3));
        // Back on a file: the next line goes in, whole, and ends the drop.
        f.file = open_log(&tmp.path().join(FILE_NAME)).unwrap();
        f.write_line_or_drop(b"{\"message\":\"y\"}\n");
        assert_eq!(f.drops.dropping, None);
        let text = fs::read_to_string(tmp.path().join(FILE_NAME)).unwrap();
        assert!(text.ends_with("{\"message\":\"y\"}\n"), "{text:?}");
    }

    /// A write cut short (part of a line written, then ENOSPC) leaves no torn line in front
    /// of the next one.
    #[test]
    fn a_torn_line_is_ended_before_the_next() {
        let tmp = tempfile::tempdir().unwrap();
        let mut f = RotatingFile::open(tmp.path(), 1 << 20, 2).unwrap();
        f.write_line_or_drop(b"{\"n\":1}\n");
        // What a write cut short leaves: part of a line, the rest refused.
        f.file.write_all(b"{\"n\":").unwrap();
        f.file = OpenOptions::new().append(true).open("/dev/full").unwrap();
        f.write_line_or_drop(b"{\"n\":2}\n");
        f.torn = true;
        f.file = open_log(&tmp.path().join(FILE_NAME)).unwrap();
        f.write_line_or_drop(b"{\"n\":3}\n");
        let text = fs::read_to_string(tmp.path().join(FILE_NAME)).unwrap();
        assert_eq!(text, "{\"n\":1}\n{\"n\":\n{\"n\":3}\n");
    }

    #[test]
    fn rotation_keeps_max_files() {
        let tmp = tempfile::tempdir().unwrap();
        let mut f = RotatingFile::open(tmp.path(), 100, 3).unwrap();
        for n in 0..20 {
            f.write_line(
                format!("{{\"n\": {n:>3}, \"pad\": \"xxxxxxxxxxxxxxxxxxxx\"}}\n").as_bytes(),
            )
            .unwrap();
        }
        let mut names: Vec<String> = fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["perago.jsonl", "perago.jsonl.1", "perago.jsonl.2"]);
        for name in &names {
            let text = fs::read_to_string(tmp.path().join(name)).unwrap();
            assert!(text.len() <= 100, "{name}: {} bytes", text.len());
            for line in text.lines() {
                serde_json::from_str::<serde_json::Value>(line).unwrap();
            }
        }
        // The newest line is in the current file.
        let current = fs::read_to_string(tmp.path().join("perago.jsonl")).unwrap();
        assert!(current.contains("\"n\":  19"));
    }

    #[test]
    fn one_file_is_truncated_in_place() {
        let tmp = tempfile::tempdir().unwrap();
        let mut f = RotatingFile::open(tmp.path(), 50, 1).unwrap();
        for _ in 0..10 {
            f.write_line(b"0123456789012345678901234567890\n").unwrap();
        }
        let text = fs::read_to_string(tmp.path().join("perago.jsonl")).unwrap();
        assert_eq!(text.lines().count(), 1);
    }

    /// Each line is one JSON object: the layer's own members first (an event field of the
    /// same name is left out), then the event's fields in order, every string escaped.
    #[test]
    fn a_line_is_json_with_the_layers_members_first() {
        use tracing_subscriber::prelude::*;
        let tmp = tempfile::tempdir().unwrap();
        let file = RotatingFile::open(tmp.path(), DEFAULT_MAX_BYTES, 1).unwrap();
        let layer = JsonlLayer::new("w\"0001", file);
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(
                task_id = "t-1", n = 7u64, neg = -3i64, ok = true, worker_id = "other",
                debug = ?vec![1, 2], "said \"hi\"\n{}", "twice"
            );
        });
        let text = fs::read_to_string(tmp.path().join("perago.jsonl")).unwrap();
        assert!(text.ends_with('\n'));
        let line: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap();
        let keys: Vec<&str> = line
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            [
                "ts_ms",
                "level",
                "worker_id",
                "message",
                "task_id",
                "n",
                "neg",
                "ok",
                "debug"
            ]
        );
        assert_eq!(line["level"], "INFO");
        assert_eq!(line["worker_id"], "w\"0001");
        assert_eq!(line["message"], "said \"hi\"\ntwice");
        assert_eq!(line["n"], 7);
        assert_eq!(line["neg"], -3);
        assert_eq!(line["ok"], true);
        assert_eq!(line["debug"], "[1, 2]");
        assert!(line["ts_ms"].as_u64().unwrap() > 1_700_000_000_000);
    }

    /// Events inside spans carry the spans' fields (innermost first); the event's own field
    /// of the same name wins, a field recorded later on the span is carried too, and an event
    /// outside every span carries none.
    #[test]
    fn events_carry_the_fields_of_their_spans() {
        use tracing_subscriber::prelude::*;
        let tmp = tempfile::tempdir().unwrap();
        let file = RotatingFile::open(tmp.path(), DEFAULT_MAX_BYTES, 1).unwrap();
        let layer = JsonlLayer::new("w0001", file);
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            let assignment = tracing::info_span!(
                "assignment",
                task_id = "t-1",
                execution_id = "e-1",
                worker_id = "ignored",
                phase = tracing::field::Empty
            );
            let _in = assignment.enter();
            tracing::info!(stream = "stderr", "from the body");
            let inner = tracing::info_span!("publish", execution_id = "e-inner", files = 3u64);
            inner.in_scope(|| tracing::info!(task_id = "t-own", "published"));
            assignment.record("phase", "body");
            tracing::info!("later");
            drop(_in);
            tracing::info!("outside");
        });
        let text = fs::read_to_string(tmp.path().join("perago.jsonl")).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert_eq!(lines[0]["task_id"], "t-1");
        assert_eq!(lines[0]["execution_id"], "e-1");
        assert_eq!(lines[0]["stream"], "stderr");
        assert_eq!(lines[0]["worker_id"], "w0001", "the line's own");
        assert_eq!(lines[1]["task_id"], "t-own", "the event's own wins");
        assert_eq!(
            lines[1]["execution_id"], "e-inner",
            "the innermost span wins"
        );
        assert_eq!(lines[1]["files"], 3);
        assert_eq!(lines[2]["phase"], "body");
        assert_eq!(lines[2]["task_id"], "t-1");
        assert!(lines[3].get("task_id").is_none(), "{}", lines[3]);
    }

    #[test]
    fn worker_dispatchers_on_their_own_threads_write_only_their_workers_lines() {
        let root = tempfile::tempdir().unwrap();
        let config = |worker_id: &str| JsonlConfig {
            root: root.path().to_owned(),
            task: "t".into(),
            worker_id: worker_id.into(),
            max_bytes: DEFAULT_MAX_BYTES,
            max_files: DEFAULT_MAX_FILES,
        };
        let threads: Vec<_> = ["w0001", "w0002"]
            .into_iter()
            .map(|id| {
                let dispatch = worker_dispatch(&config(id)).unwrap();
                std::thread::spawn(move || {
                    let _default = tracing::dispatcher::set_default(&dispatch);
                    for n in 0..3 {
                        tracing::warn!(n, "line of {id}");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        for id in ["w0001", "w0002"] {
            let text = fs::read_to_string(config(id).dir().join(FILE_NAME)).unwrap();
            let lines: Vec<serde_json::Value> = text
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            assert_eq!(lines.len(), 3, "{text}");
            for line in lines {
                assert_eq!(line["worker_id"], id);
                assert_eq!(line["message"], format!("line of {id}"));
            }
        }
    }

    #[test]
    fn folder_layout() {
        let c = JsonlConfig {
            root: PathBuf::from("/var/log/perago"),
            task: "features.build".into(),
            worker_id: "featuresbuild0002".into(),
            max_bytes: DEFAULT_MAX_BYTES,
            max_files: DEFAULT_MAX_FILES,
        };
        assert_eq!(
            c.dir(),
            PathBuf::from("/var/log/perago/features.build/worker_id=featuresbuild0002")
        );
    }
}
