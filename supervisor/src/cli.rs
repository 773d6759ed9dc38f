//! The command line. Doc comments are the help text.

use clap::{Args, Parser, Subcommand, ValueEnum};
use perago_core::mode::ExecutionMode;
use std::path::PathBuf;

/// Settings of `start` that only the environment gives (the README lists every variable).
const START_ENVIRONMENT: &str = "Environment (no flag):
  PERAGO_MIN_FREE_MEMORY=SIZE  poll for new tasks only while at least SIZE (e.g. 1GiB) of memory
                               is available (cgroup v1 or v2 limits when inside one, capped by
                               MemAvailable)
  PERAGO_MEMORY_HEADROOM=SIZE  poll a task type (and scale it up) only while available memory
                               minus SIZE covers its observed peak for each task in flight and
                               the next one (one task at a time until a peak is observed)
  PERAGO_POISON_AFTER=K        fail a workflow task with FAILED_WITH_TERMINAL_ERROR once its
                               attempts have killed their executor K times (default 3; 0 = off)
  PERAGO_STALL_TIMEOUT=DUR     kill an executor (its task FAILED, retried) or the broker (exit 1)
                               that has not answered for DUR (default 30s; off = never)";

/// Run Conductor task types, each with a broker and N executor processes.
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
    /// Validate task manifests locally, without network: each manifest, its schemas, and that
    /// the body and guardrail commands exist.
    Check(CheckArgs),
    /// Write the Conductor TaskDef JSON each manifest describes, for registering before `start`.
    Extract(ExtractArgs),
    /// Run the tasks: for each task type, a broker polling Conductor and N executor processes.
    Start(StartArgs),
    /// Show running runtimes: every slot, the broker's counters, the drain state.
    Status(StatusArgs),
    /// Pause polling of running runtimes: no new task is taken; running tasks finish and are
    /// reported, executors stay up; readiness says NOT_SERVING until `resume`.
    Pause(PauseArgs),
    /// Resume polling of paused runtimes.
    Resume(PauseArgs),
    /// Change a running runtime's executor count live (`-j N` or `-j MIN..MAX`): slots and
    /// worker ids stay; a retired executor finishes its current task first.
    Scale(ScaleArgs),
    /// Re-read the manifests a running supervisor was started with and apply what changed:
    /// `body.soft_time_limit` at once; a change that needs a new TaskDef, a body change or a
    /// manifest that fails `check` refuses the whole reload (every problem listed, exit 1,
    /// the running version keeps running). SIGHUP to the supervisor does the same.
    Reload(ReloadArgs),
    /// Serve KEDA's external scaler over gRPC: Conductor's backlog of the task type (and
    /// domain) a ScaledObject's scalerMetadata names, from the same Conductor settings as
    /// `start`. It never polls a task.
    Scaler(ScalerArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(CompletionsArgs),
    /// Try a task with nothing to install: an embedded development Conductor, one workflow per
    /// --input, the runtime, and each result printed as it completes.
    #[cfg(feature = "dev")]
    Dev(DevArgs),
}

/// `scale`.
#[derive(Debug, Args)]
#[deny(missing_docs)]
#[command(group(clap::ArgGroup::new("runtime").required(true).args(["manifests", "socket"])))]
pub struct ScaleArgs {
    /// The task manifests whose runtimes to scale (found as `status` finds them), each to the
    /// same count. One of MANIFEST or --socket is required: `scale` never scales every runtime
    /// of the user.
    #[arg(value_name = "MANIFEST")]
    pub manifests: Vec<PathBuf>,
    /// The broker socket to ask instead.
    #[arg(long, conflicts_with = "manifests")]
    pub socket: Option<PathBuf>,
    /// The executor count from now on: N, or an adaptive range MIN..MAX (as `start -j`).
    #[arg(short = 'j', long = "jobs", value_name = "N|MIN..MAX", required = true)]
    pub jobs: String,
}

/// Settings of `scaler` that only the environment gives.
const SCALER_ENVIRONMENT: &str = "Environment (no flag):
  CONDUCTOR_SERVER_URL, CONDUCTOR_AUTH_KEY, CONDUCTOR_AUTH_SECRET  as for `start`
  PERAGO_SCALER_INTERVAL=DUR   how often StreamIsActive reads the queue (default 1s)";

/// `scaler`.
#[derive(Debug, Args)]
#[deny(missing_docs)]
#[command(after_help = SCALER_ENVIRONMENT)]
pub struct ScalerArgs {
    /// The TCP address to serve on (`0.0.0.0:9466`; port 0 picks one, logged).
    #[arg(long, value_name = "ADDR")]
    pub listen: std::net::SocketAddr,
    /// The backlog one pod is meant to take when the scalerMetadata has no targetPerPod.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub target_per_pod: u64,
}

/// `reload`.
#[derive(Debug, Args)]
#[deny(missing_docs)]
pub struct ReloadArgs {
    /// The task manifests whose runtimes to reload (found as `status` finds them; the
    /// supervisor re-reads each from the path `start` was given). None: every task type of
    /// every supervisor of this user that is running.
    #[arg(value_name = "MANIFEST")]
    pub manifests: Vec<PathBuf>,
    /// The supervisor's control socket to ask instead (`supervisor.sock`, beside the
    /// runtime's `broker.sock`): every task type of that supervisor.
    #[arg(long, conflicts_with = "manifests")]
    pub socket: Option<PathBuf>,
}

/// `check`.
#[derive(Debug, Args)]
#[deny(missing_docs)]
pub struct CheckArgs {
    /// The task manifests (TOML), each checked; every problem is reported.
    #[arg(required = true, value_name = "MANIFEST")]
    pub manifests: Vec<PathBuf>,
}

/// `extract`.
#[derive(Debug, Args)]
#[deny(missing_docs)]
pub struct ExtractArgs {
    /// The task manifests (TOML).
    #[arg(required = true, value_name = "MANIFEST")]
    pub manifests: Vec<PathBuf>,
    /// Where to write the TaskDef JSON; `-` for standard output. Parent folders are created.
    /// With several manifests: a folder that gets one `<task name>.json` per task, or `-` for
    /// a JSON array of them (what Conductor's `POST /api/metadata/taskdefs` takes).
    #[arg(long, short)]
    pub output: PathBuf,
}

/// `start`.
#[derive(Debug, Args)]
#[deny(missing_docs)]
#[command(after_help = START_ENVIRONMENT)]
pub struct StartArgs {
    /// The task manifests (TOML): each task type gets a runtime of its own (broker, executors,
    /// socket, workspace root), all under this supervisor.
    #[arg(required = true, value_name = "MANIFEST")]
    pub manifests: Vec<PathBuf>,
    /// Executor processes (slots) of every task type: `N` (at least 1), or an adaptive range
    /// `MIN..MAX` that starts MIN, grows towards MAX while Conductor's queue for the task has a
    /// backlog, and retires slots idle for PERAGO_SCALE_DOWN_AFTER (default 30s). `NAME=N` or
    /// `NAME=MIN..MAX` (repeatable) sets the task type NAME's own.
    #[arg(
        short = 'j',
        long = "jobs",
        value_name = "[NAME=]N|MIN..MAX",
        default_value = "1",
        allow_hyphen_values = true
    )]
    pub jobs: Vec<String>,
    /// `process` (a broker and N executor processes) or `thread` (one process). Default: the
    /// PERAGO_EXECUTION_MODE environment variable, else `process`. `NAME=process` or
    /// `NAME=thread` (repeatable) sets the task type NAME's own.
    #[arg(long, value_name = "[NAME=]process|thread", value_parser = mode_spec)]
    pub execution_mode: Vec<ModeSpec>,
    /// Whether `-j` was given on the command line (not its default): the Conductor SDK's
    /// `thread_count` applies only without it.
    #[arg(skip)]
    pub jobs_given: bool,
    /// Work until Conductor has no task of this type left and every slot is idle, then drain
    /// and exit 0 (cron jobs, CI, backfills). Also PERAGO_ONCE=1.
    #[arg(long)]
    pub once: bool,
    /// Start paused: executors start, nothing is polled until `perago-supervisor resume`.
    /// Also PERAGO_PAUSED=1.
    #[arg(long)]
    pub paused: bool,
    /// With --once: finish within DURATION (e.g. 10m). A task type whose observed p95 task
    /// duration exceeds the time left is not polled any more; running tasks finish and are
    /// reported, then the run exits 0. Also PERAGO_MAX_RUNTIME.
    #[arg(long, value_name = "DURATION")]
    pub max_runtime: Option<String>,
    /// Replace an executor by a fresh process after N assignments (it finishes and reports
    /// the last one first). Also PERAGO_EXECUTOR_MAX_TASKS.
    #[arg(long, value_name = "N")]
    pub max_tasks_per_executor: Option<String>,
    /// Replace an executor after an assignment that leaves it and its bodies' processes above
    /// SIZE resident memory, e.g. 512MiB. Also PERAGO_EXECUTOR_MAX_MEMORY.
    #[arg(long, value_name = "SIZE")]
    pub max_executor_memory: Option<String>,
    /// Poll every task type in the Conductor task domain DOMAIN: the runtime takes only the
    /// tasks workflows route to it (`taskToDomain`), from the queue DOMAIN:type. `NAME=DOMAIN`
    /// (repeatable) sets the task type NAME's own, and wins over the form for every type.
    /// Letters, digits, `_`, `-` and `.`. Also PERAGO_DOMAIN (for every type). Default: no
    /// domain (the type's default queue).
    #[arg(long, value_name = "[NAME=]DOMAIN")]
    pub domain: Vec<String>,
    /// The task types given share N busy executors: each keeps its own, but at most N run
    /// tasks at once across them, offered capacity by --priority as it frees. Default: off
    /// (each type runs its -j at once).
    #[arg(long, value_name = "N")]
    pub pool: Option<u32>,
    /// How --pool's capacity is offered as it frees: `strict` (the default: in the order the
    /// manifests are given; a lower type runs only while every higher one has nothing to
    /// give, and can starve) or `weighted=3,2,1` (one weight per manifest, in order: shares
    /// of the starts under contention).
    #[arg(long, value_name = "strict|weighted=W,…")]
    pub priority: Option<String>,
    /// Caps the summed `cost_units` of the tasks in flight of the concurrency group NAME
    /// (`[task] concurrency_group`) across the task types given (repeatable). Also
    /// PERAGO_GROUP_BUDGETS=NAME=UNITS,… (the flags win). Default: no budget.
    #[arg(long, value_name = "NAME=UNITS")]
    pub group_budget: Vec<String>,
}

impl StartArgs {
    /// The capacity flags with `jobs` as `-j`, for
    /// [`perago_core::capacity::Capacity::resolve`].
    pub fn capacity_flags(&self, jobs: &str) -> perago_core::capacity::CapacityFlags {
        perago_core::capacity::CapacityFlags {
            jobs: jobs.to_owned(),
            once: self.once,
            paused: self.paused,
            max_tasks_per_executor: self.max_tasks_per_executor.clone(),
            max_executor_memory: self.max_executor_memory.clone(),
            max_runtime: self.max_runtime.clone(),
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
    /// The task manifests: each runtime is found through its workspace root
    /// (PERAGO_WORKSPACE_ROOT, else the default). None: every runtime of every supervisor of
    /// this user that is running.
    #[arg(value_name = "MANIFEST")]
    pub manifests: Vec<PathBuf>,
    /// The broker socket to ask instead.
    #[arg(long, conflicts_with = "manifests")]
    pub socket: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Ask only the broker's gRPC health service, as a probe would, and exit 0 or 1: `live`
    /// passes while the broker answers at all (a liveness probe: a drain is alive), `ready`
    /// only while it is SERVING (not draining).
    #[arg(long, value_enum, conflicts_with = "json")]
    pub probe: Option<Probe>,
    /// Follow the runtimes (`Admin.Watch`): print again at each change and each second, until
    /// every broker has drained. A table is redrawn in place on a terminal; `--json` prints
    /// one line per message, the object of the runtime it came from. A broker silent for 5 s
    /// is given up on (exit 1).
    #[arg(long, conflicts_with = "probe")]
    pub watch: bool,
}

/// `pause` and `resume`.
#[derive(Debug, Args)]
#[deny(missing_docs)]
pub struct PauseArgs {
    /// The task manifests whose runtimes to pause or resume, found as `status` finds them.
    /// None: every task type of every supervisor of this user that is running.
    #[arg(value_name = "MANIFEST")]
    pub manifests: Vec<PathBuf>,
    /// The broker socket to ask instead.
    #[arg(long, conflicts_with = "manifests")]
    pub socket: Option<PathBuf>,
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
#[cfg(feature = "dev")]
#[derive(Debug, Args)]
#[deny(missing_docs)]
pub struct DevArgs {
    /// The task manifests (TOML): every task type runs, each with its own runtime.
    #[arg(required = true, value_name = "MANIFEST")]
    pub manifests: Vec<PathBuf>,
    /// Number of executors (slots) of each task type, at least 1.
    #[arg(
        short = 'j',
        long = "jobs",
        value_name = "N",
        default_value_t = 1,
        allow_negative_numbers = true
    )]
    pub jobs: i64,
    /// A task input as JSON, e.g. '{"params": {"name": "Ada"}}'; one workflow per --input (of
    /// every task type given; `NAME=JSON` for the task NAME only).
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

/// One `--execution-mode` of `start`: every task type's (`task` none) or one task type's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModeSpec {
    /// `NAME=` of `NAME=MODE`.
    pub task: Option<String>,
    /// The mode.
    pub mode: ExecutionMode,
}

/// `process`, `thread`, `NAME=process` or `NAME=thread`.
fn mode_spec(value: &str) -> Result<ModeSpec, String> {
    let (task, mode) = match value.split_once('=') {
        Some((name, mode)) => {
            let name = name.trim();
            if name.is_empty() {
                return Err("expected NAME=process or NAME=thread".to_owned());
            }
            (Some(name.to_owned()), mode)
        }
        None => (None, value),
    };
    let mode = mode
        .parse()
        .map_err(|_| "expected process or thread, or NAME=process or NAME=thread".to_owned())?;
    Ok(ModeSpec { task, mode })
}

impl From<ModeArg> for ExecutionMode {
    fn from(m: ModeArg) -> Self {
        match m {
            ModeArg::Process => Self::Process,
            ModeArg::Thread => Self::Thread,
        }
    }
}
