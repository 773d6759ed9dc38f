//! Log set-up for perago's processes. Lines go to stderr (human-readable); the per-worker
//! JSONL files under `PERAGO_LOG_ROOT` come with the supervisor's log plumbing.

use tracing_subscriber::{EnvFilter, fmt};

/// Installs a stderr subscriber: `RUST_LOG` if set, else `info`. Safe to call twice (the
/// second call is a no-op), so tests that start several components in one process work.
pub fn init_stderr(process: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    tracing::debug!(process, "logging to stderr");
}
