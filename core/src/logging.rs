//! Logging for perago's processes: human-readable lines on stderr, and, for the broker and the
//! executors, one JSONL file per worker id under
//! `PERAGO_LOG_ROOT/<task name>/worker_id=<id>/perago.jsonl`, rotated by size
//! (`perago.jsonl.1` … `.N-1`, oldest dropped). Every JSON line carries `ts`, `level`,
//! `worker_id`, `message` and the event's fields (`task_id` and `execution_id` where there is
//! one).

use std::{
    fmt::Write as _,
    fs::{self, File, OpenOptions},
    io::{self, Write as _},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{SystemTime, UNIX_EPOCH},
};
use tracing::{
    Event, Subscriber,
    field::{Field, Visit},
};
use tracing_subscriber::{EnvFilter, Layer, fmt, layer::Context, prelude::*};

/// Root of the JSONL logs.
pub const PERAGO_LOG_ROOT: &str = "PERAGO_LOG_ROOT";
/// Rotate a log file past this size (a byte count or a size such as `64MiB`).
pub const PERAGO_LOG_MAX_BYTES: &str = "PERAGO_LOG_MAX_BYTES";
/// Files kept per worker, the current one included.
pub const PERAGO_LOG_MAX_FILES: &str = "PERAGO_LOG_MAX_FILES";
/// Default rotation size: 64 MiB.
pub const DEFAULT_MAX_BYTES: u64 = 64 << 20;
/// Default number of files kept: 5.
pub const DEFAULT_MAX_FILES: usize = 5;
const FILE_NAME: &str = "perago.jsonl";

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
    pub fn from_env(root: PathBuf, task: &str, worker_id: &str) -> Result<Self, String> {
        let max_bytes = match std::env::var(PERAGO_LOG_MAX_BYTES) {
            Ok(v) if !v.trim().is_empty() => crate::units::parse_byte_size(&v)
                .map_err(|e| format!("{PERAGO_LOG_MAX_BYTES}: {e}"))?
                .max(1024),
            _ => DEFAULT_MAX_BYTES,
        };
        let max_files = match std::env::var(PERAGO_LOG_MAX_FILES) {
            Ok(v) if !v.trim().is_empty() => v
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|n| *n >= 1)
                .ok_or_else(|| {
                    format!("{PERAGO_LOG_MAX_FILES}: expected a count of at least 1, got {v:?}")
                })?,
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

/// A file writer that rotates by size.
#[derive(Debug)]
pub struct RotatingFile {
    dir: PathBuf,
    max_bytes: u64,
    max_files: usize,
    file: File,
    size: u64,
}

impl RotatingFile {
    /// Opens (appending) `dir/perago.jsonl`, creating `dir`.
    pub fn open(dir: &Path, max_bytes: u64, max_files: usize) -> io::Result<Self> {
        fs::create_dir_all(dir)?;
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(FILE_NAME))?;
        let size = file.metadata()?.len();
        Ok(Self {
            dir: dir.to_owned(),
            max_bytes,
            max_files: max_files.max(1),
            file,
            size,
        })
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
            self.file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.path(0))?;
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

/// Collects an event's fields as JSON.
#[derive(Default)]
struct JsonFields {
    message: String,
    fields: serde_json::Map<String, serde_json::Value>,
}

impl Visit for JsonFields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_owned();
        } else {
            self.fields.insert(field.name().to_owned(), value.into());
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.fields.insert(field.name().to_owned(), value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.fields.insert(field.name().to_owned(), value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.fields.insert(field.name().to_owned(), value.into());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let mut text = String::new();
        let _ = write!(text, "{value:?}");
        if field.name() == "message" {
            self.message = text;
        } else {
            self.fields.insert(field.name().to_owned(), text.into());
        }
    }
}

/// The tracing layer that writes JSONL.
struct JsonlLayer {
    worker_id: String,
    out: Arc<Mutex<RotatingFile>>,
}

impl<S: Subscriber> Layer<S> for JsonlLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut visitor = JsonFields::default();
        event.record(&mut visitor);
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut line = serde_json::Map::new();
        line.insert("ts_ms".into(), ts.into());
        line.insert("level".into(), event.metadata().level().as_str().into());
        line.insert("worker_id".into(), self.worker_id.clone().into());
        line.insert("message".into(), visitor.message.into());
        for (k, v) in visitor.fields {
            line.entry(k).or_insert(v);
        }
        let mut text = serde_json::Value::Object(line).to_string();
        text.push('\n');
        if let Ok(mut out) = self.out.lock() {
            // A full disk must not take the worker down; the terminal still has the line.
            let _ = out.write_line(text.as_bytes());
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
pub fn init_worker_from_env(process: &str, task: &str, worker_id: &str) -> Result<(), String> {
    match std::env::var_os(PERAGO_LOG_ROOT).filter(|v| !v.is_empty()) {
        None => init_stderr(process),
        Some(root) => {
            let config = JsonlConfig::from_env(root.into(), task, worker_id)?;
            init_worker(&config).map_err(|e| {
                format!("cannot open the log folder {}: {e}", config.dir().display())
            })?;
        }
    }
    Ok(())
}

/// Installs stderr logging plus this worker's JSONL file. Returns the file's folder.
pub fn init_worker(config: &JsonlConfig) -> io::Result<PathBuf> {
    let dir = config.dir();
    let file = RotatingFile::open(&dir, config.max_bytes, config.max_files)?;
    let jsonl = JsonlLayer {
        worker_id: config.worker_id.clone(),
        out: Arc::new(Mutex::new(file)),
    };
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
