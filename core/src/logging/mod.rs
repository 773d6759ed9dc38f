//! Logging for perago's processes: human-readable lines on stderr, and, for the broker and the
//! executors, one JSONL file per worker id under
//! `PERAGO_LOG_ROOT/<task name>/worker_id=<id>/perago.jsonl`, rotated by size
//! (`perago.jsonl.1` … `.N-1`, oldest dropped). Every JSON line carries `ts_ms`, `level`,
//! `worker_id`, `message` and the event's fields (`task_id` and `execution_id` where there is
//! one).
//!
//! Each event is read once and written both ways ([`layer`]). A worker's runtime thread holds
//! its lines while it has work and writes them in one system call per output when it goes
//! idle; warnings and errors go out at once ([`sink`], where the bound on what a SIGKILL loses
//! is written down). A runtime made with [`idle_flushing`] and run with [`block_on`] does this.
//!
//! A line that cannot be written (a full log root, an I/O error) is dropped, never waited
//! for: the worker goes on. The first drop is said on stderr (with the file and the error),
//! and so is the first line written again (with how many were dropped); every dropped line
//! is counted in [`lines_dropped`] (the broker's `/metrics`: `perago_log_lines_dropped_total`).

mod file;
mod layer;
mod sink;

pub use file::{RotatingFile, lines_dropped};
pub use sink::{HOLD_AT_MOST, Holding, flush_held, hold_lines};

use layer::WorkerLayer;
use sink::{LineBuffer, Output};
use std::{
    io,
    path::PathBuf,
    sync::{Arc, OnceLock},
};
use tracing_subscriber::{EnvFilter, prelude::*};

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

fn env_filter() -> EnvFilter {
    env_filter_or("info")
}

fn env_filter_or(default: &str) -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default))
}

/// The process's standard error, as one output of lines (thread mode's workers without a log
/// folder log through the supervisor's subscriber, and so share it).
fn stderr() -> Arc<LineBuffer> {
    static STDERR: OnceLock<Arc<LineBuffer>> = OnceLock::new();
    Arc::clone(STDERR.get_or_init(|| {
        let buffer = LineBuffer::new(Output::Stderr);
        // Kept for the process's life, as the buffer is.
        std::mem::forget(sink::keep_for_fatal_signal(&buffer));
        buffer
    }))
}

/// A worker's layer: stderr and its JSONL file, whose held lines a fatal signal writes for
/// as long as the layer lives (a process's for its life, a thread-mode worker's until its
/// dispatcher is dropped).
fn worker_layer(config: &JsonlConfig) -> io::Result<WorkerLayer> {
    let file = RotatingFile::open(&config.dir(), config.max_bytes, config.max_files)?;
    let file = LineBuffer::new(Output::File(file));
    let kept = sink::keep_for_fatal_signal(&file);
    Ok(WorkerLayer::new(stderr(), Some((&config.worker_id, file))).keeping(kept))
}

/// Installs a stderr subscriber: `RUST_LOG` if set, else `info`. Safe to call twice (the
/// second call is a no-op), so tests that start several components in one process work.
pub fn init_stderr(process: &str) {
    init_stderr_at("info");
    tracing::debug!(process, "logging to stderr");
}

/// Like [`init_stderr`], with `default` as the level filter when `RUST_LOG` is unset.
pub fn init_stderr_at(default: &str) {
    let _ = tracing_subscriber::registry()
        .with(env_filter_or(default))
        .with(WorkerLayer::new(stderr(), None))
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
    Ok(tracing::Dispatch::new(
        tracing_subscriber::registry()
            .with(env_filter())
            .with(worker_layer(config)?),
    ))
}

/// Installs stderr logging plus this worker's JSONL file. Returns the file's folder.
pub fn init_worker(config: &JsonlConfig) -> io::Result<PathBuf> {
    let layer = worker_layer(config)?;
    let _ = tracing_subscriber::registry()
        .with(env_filter())
        .with(layer)
        .try_init();
    Ok(config.dir())
}

/// Makes `builder`'s runtime write the lines its thread holds just before it parks: see
/// [`block_on`].
pub fn idle_flushing(builder: &mut tokio::runtime::Builder) -> &mut tokio::runtime::Builder {
    builder.on_thread_park(flush_held)
}

/// Runs `future` on `runtime` (made with [`idle_flushing`]) with this thread's lines held
/// between the runtime's wake-ups: written when it goes idle, and when this returns or
/// unwinds.
pub fn block_on<F: std::future::Future>(runtime: &tokio::runtime::Runtime, future: F) -> F::Output {
    let _holding = hold_lines();
    runtime.block_on(future)
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
            let text = std::fs::read_to_string(config(id).dir().join(FILE_NAME)).unwrap();
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

    /// Set in the child of [`held_lines_are_written_when_a_fatal_signal_ends_the_process`]:
    /// the log root, and how the child dies.
    const FATAL_CHILD_ROOT: &str = "PERAGO_TEST_FATAL_CHILD_ROOT";
    const FATAL_CHILD_HOW: &str = "PERAGO_TEST_FATAL_CHILD_HOW";

    /// The child: holds an info line as a worker's runtime thread does (a process's, or a
    /// thread-mode worker's with a dispatcher of its own), checks it is not yet in the file,
    /// then dies as `how` says.
    fn fatal_child(root: PathBuf, how: &str) -> ! {
        let config = JsonlConfig {
            root,
            task: "t".into(),
            worker_id: "w0001".into(),
            max_bytes: DEFAULT_MAX_BYTES,
            max_files: DEFAULT_MAX_FILES,
        };
        // Thread mode: the worker's dispatcher is this thread's default, not the process's.
        let thread_mode = how.strip_suffix(", in a thread-mode worker");
        let _default = match thread_mode {
            Some(_) => Some(tracing::dispatcher::set_default(
                &worker_dispatch(&config).unwrap(),
            )),
            None => {
                init_worker(&config).unwrap();
                None
            }
        };
        let how = thread_mode.unwrap_or(how);
        let _holding = hold_lines();
        tracing::info!("held when the signal came");
        let text = std::fs::read_to_string(config.dir().join(FILE_NAME)).unwrap();
        if text.contains("held when the signal came") {
            eprintln!("the line was not held");
            std::process::exit(3);
        }
        match how {
            "abort" => std::process::abort(),
            "sent SIGSEGV" => {
                perago_sys::signal::signal_process(std::process::id(), libc::SIGSEGV).unwrap();
                // Delivered to some thread of this process; this one waits for the end.
                loop {
                    std::thread::park();
                }
            }
            "stack overflow" => {
                fn deeper(n: u64) -> u64 {
                    let frame = std::hint::black_box([n; 64]);
                    if frame[63] == u64::MAX {
                        return 0;
                    }
                    frame[0] + deeper(std::hint::black_box(n + 1))
                }
                let _ = std::thread::Builder::new()
                    .stack_size(128 * 1024)
                    .spawn(|| deeper(0))
                    .unwrap()
                    .join();
                std::process::exit(4)
            }
            other => panic!("unknown way to die: {other}"),
        }
    }

    /// A line held by a runtime thread reaches the file and stderr when an abort, a crash or a
    /// sent fatal signal ends the process — a worker process's, and a thread-mode worker's —
    /// which still dies of that signal (and Rust's report
    /// of a stack overflow is still printed). Each case runs in a child process: this test's
    /// own binary, run for this test alone.
    #[test]
    fn held_lines_are_written_when_a_fatal_signal_ends_the_process() {
        use std::os::unix::process::ExitStatusExt as _;
        if let Some(root) = std::env::var_os(FATAL_CHILD_ROOT) {
            let how = std::env::var(FATAL_CHILD_HOW).unwrap();
            fatal_child(root.into(), &how);
        }
        for (how, signal) in [
            ("abort", libc::SIGABRT),
            ("sent SIGSEGV", libc::SIGSEGV),
            ("stack overflow", libc::SIGABRT),
            ("abort, in a thread-mode worker", libc::SIGABRT),
            ("sent SIGSEGV, in a thread-mode worker", libc::SIGSEGV),
        ] {
            let root = tempfile::tempdir().unwrap();
            let output = std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "logging::tests::held_lines_are_written_when_a_fatal_signal_ends_the_process",
                    "--exact",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(FATAL_CHILD_ROOT, root.path())
                .env(FATAL_CHILD_HOW, how)
                .env("RUST_LOG", "info")
                .env("RUST_BACKTRACE", "0")
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(
                output.status.signal(),
                Some(signal),
                "{how}: {:?}, stderr: {stderr}",
                output.status
            );
            let file = root.path().join("t/worker_id=w0001").join(FILE_NAME);
            let text = std::fs::read_to_string(&file).unwrap();
            let lines: Vec<serde_json::Value> = text
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            assert_eq!(lines.len(), 1, "{how}: {text}");
            assert_eq!(lines[0]["message"], "held when the signal came", "{how}");
            assert_eq!(
                stderr.matches("held when the signal came").count(),
                1,
                "{how}: stderr: {stderr}"
            );
            if how == "stack overflow" {
                assert!(
                    stderr.contains("has overflowed its stack"),
                    "Rust's own report still comes: {stderr}"
                );
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
