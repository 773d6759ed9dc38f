//! The command line. Doc comments are the help text.

use clap::{Args, Parser, Subcommand, ValueEnum};
use perago_core::mode::ExecutionMode;
use std::path::PathBuf;

/// Settings of `start` that only the environment gives (the README lists every variable).
const START_ENVIRONMENT: &str = "Environment (no flag):
  PERAGO_MIN_FREE_MEMORY=SIZE  poll for new tasks only while at least SIZE (e.g. 1GiB) of memory
                               is available (cgroup v2 limits when inside one, else MemAvailable)
  PERAGO_POISON_AFTER=K        fail a workflow task with FAILED_WITH_TERMINAL_ERROR once its
                               attempts have killed their executor K times (default 3; 0 = off)";

/// Run one Conductor task type with a broker and N executor processes.
#[derive(Debug, Parser)]
#[command(name = "perago-supervisor", version, max_term_width = 100)]
#[deny(missing_docs)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
#[deny(missing_docs)]
pub enum Command {
    /// Validate a task manifest locally, without network: the manifest, its schemas, and that
    /// the body and guardrail commands exist.
    Check(CheckArgs),
    /// Write the Conductor TaskDef JSON a manifest describes, for registering before `start`.
    Extract(ExtractArgs),
    /// Run the task: a broker polling Conductor and N executor processes.
    Start(StartArgs),
    /// Show a running runtime: every slot, the broker's counters, the drain state.
    Status(StatusArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(CompletionsArgs),
    /// Try a task with nothing to install: an embedded development Conductor, one workflow per
    /// --input, the runtime, and each result printed as it completes.
    Dev(DevArgs),
}

/// `check`.
#[derive(Debug, Args)]
#[deny(missing_docs)]
pub struct CheckArgs {
    /// The task manifest (TOML).
    pub manifest: PathBuf,
}

/// `extract`.
#[derive(Debug, Args)]
#[deny(missing_docs)]
pub struct ExtractArgs {
    /// The task manifest (TOML).
    pub manifest: PathBuf,
    /// Where to write the TaskDef JSON; `-` for standard output. Parent folders are created.
    #[arg(long, short)]
    pub output: PathBuf,
}

/// `start`.
#[derive(Debug, Args)]
#[deny(missing_docs)]
#[command(after_help = START_ENVIRONMENT)]
pub struct StartArgs {
    /// The task manifest (TOML).
    pub manifest: PathBuf,
    /// Executor processes (slots): `N` (at least 1), or an adaptive range `MIN..MAX` that
    /// starts MIN, grows towards MAX while Conductor's queue for the task has a backlog, and
    /// retires slots idle for PERAGO_SCALE_DOWN_AFTER (default 30s).
    #[arg(
        short = 'j',
        long = "jobs",
        value_name = "N|MIN..MAX",
        default_value = "1",
        allow_hyphen_values = true
    )]
    pub jobs: String,
    /// `process` (a broker and N executor processes) or `thread` (one process). Default: the
    /// PERAGO_EXECUTION_MODE environment variable, else `process`.
    #[arg(long, value_enum)]
    pub execution_mode: Option<ModeArg>,
    /// Work until Conductor has no task of this type left and every slot is idle, then drain
    /// and exit 0 (cron jobs, CI, backfills). Also PERAGO_ONCE=1.
    #[arg(long)]
    pub once: bool,
    /// Replace an executor by a fresh process after N assignments (it finishes and reports
    /// the last one first). Also PERAGO_EXECUTOR_MAX_TASKS.
    #[arg(long, value_name = "N")]
    pub max_tasks_per_executor: Option<String>,
    /// Replace an executor after an assignment that leaves it and its bodies' processes above
    /// SIZE resident memory, e.g. 512MiB. Also PERAGO_EXECUTOR_MAX_MEMORY.
    #[arg(long, value_name = "SIZE")]
    pub max_executor_memory: Option<String>,
}

impl StartArgs {
    /// The capacity flags, for [`perago_core::capacity::Capacity::resolve`].
    pub fn capacity_flags(&self) -> perago_core::capacity::CapacityFlags {
        perago_core::capacity::CapacityFlags {
            jobs: self.jobs.clone(),
            once: self.once,
            max_tasks_per_executor: self.max_tasks_per_executor.clone(),
            max_executor_memory: self.max_executor_memory.clone(),
        }
    }
}

/// `completions`.
#[derive(Debug, Args)]
#[deny(missing_docs)]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// `status`.
#[derive(Debug, Args)]
#[deny(missing_docs)]
pub struct StatusArgs {
    /// The task manifest: its runtime is found through its workspace root
    /// (PERAGO_WORKSPACE_ROOT, else the default).
    pub manifest: Option<PathBuf>,
    /// The broker socket to ask instead.
    #[arg(long, conflicts_with = "manifest")]
    pub socket: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Ask only the broker's gRPC health service, as a probe would, and exit 0 or 1: `live`
    /// passes while the broker answers at all (a liveness probe: a drain is alive), `ready`
    /// only while it is SERVING (not draining).
    #[arg(long, value_enum, conflicts_with = "json")]
    pub probe: Option<Probe>,
}

/// The `status --probe` kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Probe {
    /// The broker answers its health service.
    Live,
    /// The broker answers SERVING.
    Ready,
}

/// `dev`.
#[derive(Debug, Args)]
#[deny(missing_docs)]
pub struct DevArgs {
    /// The task manifest (TOML).
    pub manifest: PathBuf,
    /// Number of executors (slots), at least 1.
    #[arg(
        short = 'j',
        long = "jobs",
        value_name = "N",
        default_value_t = 1,
        allow_negative_numbers = true
    )]
    pub jobs: i64,
    /// A task input as JSON, e.g. '{"params": {"name": "Ada"}}'; one workflow per --input.
    #[arg(long, value_name = "JSON")]
    pub input: Vec<String>,
    /// `thread` (default: no other binaries needed) or `process`.
    #[arg(long, value_enum)]
    pub execution_mode: Option<ModeArg>,
}

/// The `--execution-mode` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    /// A broker process and N executor processes.
    Process,
    /// Broker and executor slots in the supervisor process; bodies are still subprocesses.
    Thread,
}

impl From<ModeArg> for ExecutionMode {
    fn from(m: ModeArg) -> Self {
        match m {
            ModeArg::Process => Self::Process,
            ModeArg::Thread => Self::Thread,
        }
    }
}
