//! The `perago-devstack` command line: which servers to start, and the process lifecycle
//! (print the bound addresses as one JSON line, serve until SIGINT/SIGTERM, drain, exit).
//!
//! Each server has its own `--NAME ADDR` flag so the lakeFS server can join as `--lakefs ADDR`
//! with its own key in the printed JSON line.

use std::io::Write;
use std::net::SocketAddr;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use crate::conductor::ConductorServer;
use crate::errors::DevstackError;

/// Environment variable for `--conductor`.
pub const ENV_CONDUCTOR: &str = "PERAGO_DEVSTACK_CONDUCTOR";
/// Environment variable for `--time-scale`.
pub const ENV_TIME_SCALE: &str = "PERAGO_DEVSTACK_TIME_SCALE";

/// In-memory development servers for perago's tests and first runs.
///
/// Once every server is bound, prints one JSON line on stdout, e.g.
/// {"conductor":"http://127.0.0.1:8080/api"}, then serves until SIGINT or SIGTERM.
#[derive(Debug, Parser)]
#[command(name = "perago-devstack", version)]
#[deny(missing_docs)]
pub struct Args {
    /// Serve a Conductor-compatible API on ADDR (port 0 picks a free port).
    #[arg(long, value_name = "ADDR", env = ENV_CONDUCTOR)]
    pub conductor: Option<SocketAddr>,

    /// Real seconds per Conductor second for timeouts, retry delays and callbacks
    /// (0.01 = a hundred times faster).
    #[arg(long, value_name = "FACTOR", default_value_t = 1.0, env = ENV_TIME_SCALE)]
    pub time_scale: f64,

    /// More logs on stderr (-v debug, -vv trace); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

/// Logs go to stderr (stdout carries the address line), at a level set by `-v` unless
/// `RUST_LOG` says otherwise.
pub fn init_tracing(verbose: u8) {
    let default = match verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Starts the servers asked for, prints their URLs, and serves until a termination signal.
pub async fn run(args: Args) -> Result<(), DevstackError> {
    let Some(conductor_addr) = args.conductor else {
        return Err(DevstackError::NothingToServe);
    };
    let conductor = ConductorServer::builder()
        .time_scale(args.time_scale)
        .bind(conductor_addr)
        .await?;
    let line = serde_json::json!({ "conductor": conductor.base_url() });
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}")
        .and_then(|()| stdout.flush())
        .map_err(|source| DevstackError::Stdout { source })?;
    drop(stdout);
    let signal = wait_for_signal().await?;
    tracing::info!(signal, "shutting down");
    conductor.shutdown().await;
    Ok(())
}

async fn wait_for_signal() -> Result<&'static str, DevstackError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term =
        signal(SignalKind::terminate()).map_err(|source| DevstackError::Signal { source })?;
    let mut int =
        signal(SignalKind::interrupt()).map_err(|source| DevstackError::Signal { source })?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}

/// Prints an error and its causes on stderr.
pub fn report(error: &DevstackError) {
    let mut message = format!("error: {error}");
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        message.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    eprintln!("{message}");
}
