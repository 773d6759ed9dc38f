//! The `perago-devstack` command line: which servers to start, and the process lifecycle
//! (print the bound addresses as one JSON line, serve until SIGINT/SIGTERM, drain, exit).
//!
//! Each server has its own `--NAME ADDR` flag and its own key in the printed JSON line.

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use crate::conductor::{ConductorServer, PayloadStorage, PayloadThresholds, QueueSemantics};
use crate::errors::DevstackError;
use crate::lakefs::{DEFAULT_ACCESS_KEY_ID, DEFAULT_SECRET_ACCESS_KEY, LakefsServer};

/// Environment variable for `--conductor`.
pub const ENV_CONDUCTOR: &str = "PERAGO_DEVSTACK_CONDUCTOR";
/// Environment variable for `--conductor-auth`.
pub const ENV_CONDUCTOR_AUTH: &str = "PERAGO_DEVSTACK_CONDUCTOR_AUTH";
/// Environment variable for `--conductor-token-ttl`.
pub const ENV_CONDUCTOR_TOKEN_TTL: &str = "PERAGO_DEVSTACK_CONDUCTOR_TOKEN_TTL";
/// Environment variable for `--lakefs`.
pub const ENV_LAKEFS: &str = "PERAGO_DEVSTACK_LAKEFS";
/// Environment variable for `--lakefs-access-key-id`.
pub const ENV_LAKEFS_ACCESS_KEY_ID: &str = "PERAGO_DEVSTACK_LAKEFS_ACCESS_KEY_ID";
/// Environment variable for `--lakefs-secret-access-key`.
pub const ENV_LAKEFS_SECRET_ACCESS_KEY: &str = "PERAGO_DEVSTACK_LAKEFS_SECRET_ACCESS_KEY";
/// Environment variable for `--time-scale`.
pub const ENV_TIME_SCALE: &str = "PERAGO_DEVSTACK_TIME_SCALE";
/// Environment variable for `--sweep-lag`.
pub const ENV_SWEEP_LAG: &str = "PERAGO_DEVSTACK_SWEEP_LAG";
/// Environment variable for `--queue-semantics`.
pub const ENV_QUEUE_SEMANTICS: &str = "PERAGO_DEVSTACK_QUEUE_SEMANTICS";

/// In-memory development servers for perago's tests and first runs.
///
/// Once every server is bound, prints one JSON line on stdout, e.g.
/// {"conductor":"http://127.0.0.1:8080/api","lakefs":"http://127.0.0.1:8000",
/// "lakefs_access_key_id":"AKIA…","lakefs_secret_access_key":"…"}, then serves until SIGINT or
/// SIGTERM. The lakeFS API is under /api/v1 of the printed endpoint; the key pair is the one it
/// accepts, so a client can be configured from the line alone.
#[derive(Debug, Parser)]
#[command(name = "perago-devstack", version)]
#[deny(missing_docs)]
pub struct Args {
    /// Serve a Conductor-compatible API on ADDR (port 0 picks a free port).
    #[arg(long, value_name = "ADDR", env = ENV_CONDUCTOR)]
    pub conductor: Option<SocketAddr>,

    /// Require Orkes-style auth on the Conductor API: POST /api/token with {"keyId": KEY,
    /// "keySecret": SECRET} answers a token, which every other /api route but health wants in
    /// the X-Authorization header. The secret is everything after the first ':'. Prefer the
    /// environment variable: arguments are visible to other users.
    #[arg(long, value_name = "KEY:SECRET", env = ENV_CONDUCTOR_AUTH, hide_env_values = true,
          value_parser = parse_key_pair)]
    pub conductor_auth: Option<KeyPair>,

    /// Lifetime of Conductor auth tokens in seconds (rounded up to whole seconds).
    #[arg(long, value_name = "SECONDS", default_value_t = 3600.0, env = ENV_CONDUCTOR_TOKEN_TTL,
          value_parser = parse_seconds)]
    pub conductor_token_ttl: f64,

    /// Serve a lakeFS-compatible API on ADDR (port 0 picks a free port).
    #[arg(long, value_name = "ADDR", env = ENV_LAKEFS)]
    pub lakefs: Option<SocketAddr>,

    /// Access key id lakeFS clients must send (HTTP basic auth user).
    #[arg(long, value_name = "KEY", default_value = DEFAULT_ACCESS_KEY_ID, env = ENV_LAKEFS_ACCESS_KEY_ID)]
    pub lakefs_access_key_id: String,

    /// Secret access key lakeFS clients must send (HTTP basic auth password); defaults to the
    /// secret of lakeFS's quickstart user.
    #[arg(long, value_name = "SECRET", default_value = DEFAULT_SECRET_ACCESS_KEY,
          env = ENV_LAKEFS_SECRET_ACCESS_KEY, hide_default_value = true,
        hide_env_values = true)]
    pub lakefs_secret_access_key: String,

    /// Real seconds per Conductor second for timeouts, retry delays and callbacks
    /// (0.01 = a hundred times faster).
    #[arg(long, value_name = "FACTOR", default_value_t = 1.0, env = ENV_TIME_SCALE)]
    pub time_scale: f64,

    /// Fire Conductor timeouts (response, task, poll) this many Conductor seconds after their
    /// deadline, as the real server does when it next decides the workflow (on Postgres up to
    /// about 60 s late); scaled by --time-scale. 0 fires them within milliseconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 0.0, env = ENV_SWEEP_LAG,
          value_parser = parse_lag)]
    pub sweep_lag: f64,

    /// More logs on stderr (-v debug, -vv trace); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,

    /// Conductor's `taskInputPayloadSizeThreshold` in KB: a larger task input is moved to
    /// external payload storage (the task gets `inputData: {}` and its path).
    #[arg(long, value_name = "KB", default_value_t = 3072)]
    pub task_input_payload_threshold_kb: u64,

    /// Conductor's `maxTaskInputPayloadSizeThreshold` in KB: a larger task input fails the task
    /// (FAILED_WITH_TERMINAL_ERROR); `maxWorkflowInputPayloadSizeThreshold` too: a larger
    /// workflow input refuses the start.
    #[arg(long, value_name = "KB", default_value_t = 10240)]
    pub max_task_input_payload_threshold_kb: u64,

    /// Conductor's `maxTaskOutputPayloadSizeThreshold` in KB: a result with a larger output
    /// fails the task (FAILED_WITH_TERMINAL_ERROR).
    #[arg(long, value_name = "KB", default_value_t = 10240)]
    pub max_task_output_payload_threshold_kb: u64,

    /// The external payload storage Conductor is configured with: `blob` (pre-signed URLs on a
    /// blob store of its own port, as S3) or `dummy` (the server's default without a storage
    /// module: locations have no `uri`).
    #[arg(long, value_name = "KIND", default_value = "blob")]
    pub payload_storage: PayloadStorage,

    /// When a Conductor batch poll answers: fill-or-timeout (Conductor's SQL queues, the
    /// server's default: once it holds `count` tasks or its `timeout` has passed, the tasks
    /// popped meanwhile waiting in the server) or immediate (as soon as one task is there).
    #[arg(long, value_name = "SEMANTICS", default_value = "fill-or-timeout",
          env = ENV_QUEUE_SEMANTICS)]
    pub queue_semantics: QueueSemantics,
}

/// A key id and its secret; `Debug` hides the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyPair {
    /// The key id.
    pub key_id: String,
    /// The secret.
    pub secret: String,
}

impl std::fmt::Debug for KeyPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyPair")
            .field("key_id", &self.key_id)
            .field("secret", &"<redacted>")
            .finish()
    }
}

fn parse_key_pair(text: &str) -> Result<KeyPair, String> {
    match text.split_once(':') {
        Some((key_id, secret)) if !key_id.is_empty() && !secret.is_empty() => Ok(KeyPair {
            key_id: key_id.to_owned(),
            secret: secret.to_owned(),
        }),
        _ => Err("expected KEY:SECRET, both non-empty".to_owned()),
    }
}

fn parse_seconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s < 1e9 => Ok(s),
        _ => Err("expected a number of seconds greater than 0".to_owned()),
    }
}

fn parse_lag(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if s.is_finite() && (0.0..1e9).contains(&s) => Ok(s),
        _ => Err("expected a number of seconds, 0 or more".to_owned()),
    }
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
    if args.conductor.is_none() && args.lakefs.is_none() {
        return Err(DevstackError::NothingToServe);
    }
    // Handlers go in before the address line is printed: a supervisor that reads the line and
    // sends SIGTERM at once must get a drain, not the default action (death by signal).
    let signals = Signals::install()?;
    let mut line = serde_json::Map::new();
    let conductor = match args.conductor {
        Some(addr) => {
            let mut builder = ConductorServer::builder()
                .payload_thresholds(PayloadThresholds {
                    task_input_kb: args.task_input_payload_threshold_kb,
                    max_task_input_kb: args.max_task_input_payload_threshold_kb,
                    max_task_output_kb: args.max_task_output_payload_threshold_kb,
                    max_workflow_input_kb: args.max_task_input_payload_threshold_kb,
                    ..PayloadThresholds::default()
                })
                .payload_storage(args.payload_storage)
                .time_scale(args.time_scale)
                .token_ttl(Duration::from_secs_f64(args.conductor_token_ttl))
                .sweep_lag(Duration::from_secs_f64(args.sweep_lag))
                .queue_semantics(args.queue_semantics);
            if let Some(pair) = args.conductor_auth {
                builder = builder.auth(pair.key_id, pair.secret);
            }
            let server = builder.bind(addr).await?;
            line.insert("conductor".into(), server.base_url().into());
            Some(server)
        }
        None => None,
    };
    let lakefs = match args.lakefs {
        Some(addr) => {
            let server = LakefsServer::builder()
                .credentials(
                    args.lakefs_access_key_id.clone(),
                    args.lakefs_secret_access_key.clone(),
                )
                .bind(addr)
                .await?;
            line.insert("lakefs".into(), server.endpoint().into());
            // A development server's key pair: printed so a client needs nothing else.
            line.insert(
                "lakefs_access_key_id".into(),
                args.lakefs_access_key_id.into(),
            );
            line.insert(
                "lakefs_secret_access_key".into(),
                args.lakefs_secret_access_key.into(),
            );
            Some(server)
        }
        None => None,
    };
    let line = serde_json::Value::Object(line);
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}")
        .and_then(|()| stdout.flush())
        .map_err(|source| DevstackError::Stdout { source })?;
    drop(stdout);
    let signal = signals.recv().await;
    tracing::info!(signal, "shutting down");
    // Both drain at once: each is bounded by its own grace period.
    let conductor = async {
        if let Some(server) = conductor {
            server.shutdown().await;
        }
    };
    let lakefs = async {
        if let Some(server) = lakefs {
            server.shutdown().await;
        }
    };
    tokio::join!(conductor, lakefs);
    Ok(())
}

/// SIGTERM and SIGINT, caught.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Result<Self, DevstackError> {
        use tokio::signal::unix::{SignalKind, signal};
        let install = |kind| signal(kind).map_err(|source| DevstackError::Signal { source });
        Ok(Self {
            term: install(SignalKind::terminate())?,
            int: install(SignalKind::interrupt())?,
        })
    }

    async fn recv(mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// Prints an error and its causes on stderr.
pub fn report(error: &DevstackError) {
    eprintln!("{}", report_line(error));
}

/// `error: message: cause: cause`, one line.
fn report_line(error: &DevstackError) -> String {
    format!("error: {}", crate::errors::DisplayChain(error))
}

#[cfg(test)]
mod error_texts {
    use super::*;

    /// The text each error with a cause prints, pinned.
    #[test]
    fn errors_print_as_before() {
        let denied = || std::io::Error::other("denied");
        let cases = [
            (
                DevstackError::Bind { source: denied() },
                "error: failed to bind the listening socket: denied",
            ),
            (
                DevstackError::Signal { source: denied() },
                "error: failed to install signal handlers: denied",
            ),
            (
                DevstackError::Stdout { source: denied() },
                "error: failed to print the bound addresses: denied",
            ),
        ];
        for (error, text) in cases {
            assert_eq!(report_line(&error), text);
        }
    }
}
