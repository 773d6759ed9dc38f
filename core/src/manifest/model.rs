//! The validated task manifest: one task, its body, guardrails and workspace settings.

use super::schemas::Schemas;
use std::{collections::BTreeMap, fmt, path::PathBuf};

/// A loaded, validated task manifest. Every field has passed the checks of
/// [`Manifest::load`](crate::manifest::Manifest::load); paths are resolved against the manifest's
/// folder.
#[derive(Debug, Clone)]
pub struct Manifest {
    /// The manifest file as the user named it (for messages).
    pub path: PathBuf,
    /// The absolute folder holding the manifest: bodies and guardrails run here.
    pub dir: PathBuf,
    /// The `[task]` table.
    pub task: TaskSpec,
    /// The `[body]` table.
    pub body: BodySpec,
    /// The `[guardrails]` table.
    pub guardrails: Guardrails,
    /// The `[workspace]` table; present exactly for workspace tasks.
    pub workspace: Option<WorkspaceSpec>,
    /// The compiled params/result schemas.
    pub schemas: Schemas,
    /// The `[dev]` table.
    pub dev: DevSpec,
    /// The `[worker]` table: runtime settings `reload` re-reads and applies live.
    pub worker: WorkerSpec,
    /// What it was made from: its text and the files it names, as read when it was checked
    /// (the supervisor hands executors this, not the file on disk).
    pub source: std::sync::Arc<super::source::ManifestSource>,
}

/// The `[worker]` table: how the runtime of this task type polls, recycles and admits, as a
/// file that `reload` (and SIGHUP) re-reads, so each applies live. Each is the lowest layer of
/// its setting: a `start` flag, a `PERAGO_*` variable or the Conductor SDK's variable for it
/// wins. Unset: the runtime's default.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WorkerSpec {
    /// `worker.domain`: the task domain polled in (as `--domain`).
    pub domain: Option<crate::conductor::Domain>,
    /// `worker.paused`: polling paused (as `--paused`; `resume` resumes it).
    pub paused: Option<bool>,
    /// `worker.poll_interval`: the wait after an empty poll (as `PERAGO_POLL_INTERVAL_MS`).
    pub poll_interval: Option<std::time::Duration>,
    /// `worker.poll_timeout`: the long poll's wait (as `PERAGO_POLL_WAIT_MS`).
    pub poll_timeout: Option<std::time::Duration>,
    /// `worker.max_tasks_per_executor` (as `--max-tasks-per-executor`).
    pub max_tasks_per_executor: Option<u64>,
    /// `worker.max_executor_memory`, in bytes (as `--max-executor-memory`).
    pub max_executor_memory: Option<u64>,
    /// `worker.min_free_memory`, in bytes (as `PERAGO_MIN_FREE_MEMORY`).
    pub min_free_memory: Option<u64>,
}

/// The `[dev]` table: what `perago-supervisor dev` seeds its embedded servers with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevSpec {
    /// A folder whose files become the initial content of the dev repository's branch
    /// (workspace tasks).
    pub seed: Option<PathBuf>,
    /// The dev lakeFS repository (default `dev-repo`).
    pub repository: String,
    /// Its branch (default `main`).
    pub branch: String,
}

impl Default for DevSpec {
    fn default() -> Self {
        Self {
            seed: None,
            repository: "dev-repo".to_owned(),
            branch: "main".to_owned(),
        }
    }
}

/// Whether a task owns a lakeFS workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskKind {
    /// Input `{workspace, params}`, output `{workspace, result}`.
    Workspace,
    /// Input `{params}`, output `{result}`.
    WorkspaceFree,
}

impl TaskKind {
    /// The manifest spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Workspace => "workspace",
            Self::WorkspaceFree => "workspace-free",
        }
    }

    /// The top-level input keys, exactly.
    pub fn input_keys(self) -> &'static [&'static str] {
        match self {
            Self::Workspace => &["workspace", "params"],
            Self::WorkspaceFree => &["params"],
        }
    }

    /// The top-level output keys of a completed task, exactly.
    pub fn output_keys(self) -> &'static [&'static str] {
        match self {
            Self::Workspace => &["workspace", "result"],
            Self::WorkspaceFree => &["result"],
        }
    }
}

impl fmt::Display for TaskKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Conductor's `retryLogic`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryLogic {
    /// `FIXED` (Conductor's default).
    Fixed,
    /// `EXPONENTIAL_BACKOFF`.
    ExponentialBackoff,
    /// `LINEAR_BACKOFF`.
    LinearBackoff,
}

impl RetryLogic {
    /// Every value, in the order error messages list them.
    pub const ALL: [Self; 3] = [Self::Fixed, Self::ExponentialBackoff, Self::LinearBackoff];

    /// Conductor's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fixed => "FIXED",
            Self::ExponentialBackoff => "EXPONENTIAL_BACKOFF",
            Self::LinearBackoff => "LINEAR_BACKOFF",
        }
    }
}

/// Conductor's `timeoutPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeoutPolicy {
    /// `RETRY`: a timed-out attempt is retried.
    Retry,
    /// `TIME_OUT_WF` (Conductor's default): the workflow times out.
    TimeOutWorkflow,
    /// `ALERT_ONLY`.
    AlertOnly,
}

impl TimeoutPolicy {
    /// Every value, in the order error messages list them.
    pub const ALL: [Self; 3] = [Self::Retry, Self::TimeOutWorkflow, Self::AlertOnly];

    /// Conductor's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Retry => "RETRY",
            Self::TimeOutWorkflow => "TIME_OUT_WF",
            Self::AlertOnly => "ALERT_ONLY",
        }
    }
}

/// The `[task]` table: the TaskDef.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskSpec {
    /// The Conductor TaskDef name (the task type polled).
    pub name: String,
    /// Workspace or workspace-free.
    pub kind: TaskKind,
    /// TaskDef `description`.
    pub description: Option<String>,
    /// TaskDef `ownerEmail`.
    pub owner_email: Option<String>,
    /// TaskDef `timeoutSeconds`, also the body's time limit; 0 = none.
    pub timeout_seconds: u64,
    /// TaskDef `responseTimeoutSeconds`: as set, derived from the publish budget, or the
    /// default (3600, capped at `timeout_seconds`).
    pub response_timeout_seconds: u64,
    /// TaskDef `retryCount`.
    pub retry_count: u32,
    /// TaskDef `retryLogic`.
    pub retry_logic: RetryLogic,
    /// TaskDef `retryDelaySeconds`.
    pub retry_delay_seconds: u32,
    /// TaskDef `timeoutPolicy`.
    pub timeout_policy: TimeoutPolicy,
    /// Params JSON Schema file, resolved against the manifest folder.
    pub params_schema: Option<PathBuf>,
    /// Result JSON Schema file, resolved against the manifest folder.
    pub result_schema: Option<PathBuf>,
    /// `concurrency_group`, `concurrency_limit`, `cost_units`: the group whose limits this
    /// type's in-flight tasks count against, across every type of one supervisor.
    pub concurrency: Option<ConcurrencyGroup>,
}

/// A task type's membership of a concurrency group (`[task] concurrency_group = "…"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConcurrencyGroup {
    /// The group's name (letters, digits, `_`, `-`, `.`).
    pub name: String,
    /// `concurrency_limit`: the most tasks of the group in flight at once, across every type
    /// of the supervisor; every member that sets it must set the same.
    pub limit: Option<u32>,
    /// `cost_units` (default 1): what one task of this type costs against the group's budget
    /// (`--group-budget NAME=UNITS`).
    pub cost_units: u32,
}

/// How the executor talks to a command body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyProtocol {
    /// One process per assignment: params JSON on stdin, result JSON on stdout, exit 0.
    Exec,
    /// One long-lived process: a JSON request line in, a JSON response line out.
    Jsonl,
}

impl BodyProtocol {
    /// The manifest spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Exec => "exec",
            Self::Jsonl => "jsonl",
        }
    }
}

/// What runs the task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyKind {
    /// A command the stock executor runs.
    Command {
        /// argv; `argv[0]` is a path relative to the manifest folder (if it has a `/`) or a
        /// name looked up on `PATH`.
        argv: Vec<String>,
        /// exec or jsonl.
        protocol: BodyProtocol,
    },
    /// A binary built on the `perago-executor` library, started in place of the stock
    /// executor. Resolved against the manifest folder.
    Executor(PathBuf),
}

/// The `[body]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodySpec {
    /// Command or executor binary.
    pub kind: BodyKind,
    /// Extra environment for the body.
    pub env: BTreeMap<String, String>,
    /// `body.user`: the user bodies and guardrails run as (the runtime must run as root to
    /// switch to it); `None` = the runtime's own user.
    pub user: Option<String>,
    /// `body.soft_time_limit`: when the body is asked to wrap up (an `exec` body gets SIGUSR1,
    /// a `jsonl` body a `{"cancel": "<execution id>"}` line), counted on the same clock as
    /// `task.timeout_seconds`; `None` = never.
    pub soft_time_limit: Option<std::time::Duration>,
    /// `body.memory_limit`, in bytes: each body (the whole tree it forks) runs in a memory
    /// cgroup of its own with this limit, and an OOM kill fails the task; `None` = no limit.
    /// Command bodies only.
    pub memory_limit: Option<u64>,
}

/// The `[guardrails]` table: commands run before and after the body.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Guardrails {
    /// argv of the pre guardrail; a non-zero exit is FAILED_WITH_TERMINAL_ERROR.
    pub pre: Option<Vec<String>>,
    /// argv of the post guardrail; a non-zero exit is FAILED.
    pub post: Option<Vec<String>>,
}

/// The `[workspace]` table of a workspace task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceSpec {
    /// The lakeFS path prefix inputs may narrow within (empty = the whole branch). Normalized
    /// to end with `/` when non-empty.
    pub prefix: String,
    /// Seconds the merge may take (default: the budget's seconds, else 300).
    pub merge_timeout_seconds: u64,
    /// Limits on what one attempt may publish.
    pub publish_budget: Option<PublishBudget>,
    /// Limits on what one attempt may download.
    pub download_budget: Option<DownloadBudget>,
}

/// The `[workspace.download_budget]` table: checked against the listing before anything is
/// downloaded, and on the bytes received.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DownloadBudget {
    /// Most objects one attempt may download (the listing may hold no more).
    pub max_objects: Option<u64>,
    /// Most bytes one attempt may download.
    pub max_bytes: Option<u64>,
}

/// The `[workspace.publish_budget]` table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PublishBudget {
    /// Most objects one attempt may publish (changed + added + removed).
    pub max_objects: Option<u64>,
    /// Most bytes one attempt may upload.
    pub max_bytes: Option<u64>,
    /// Seconds the whole publication may take; sets `responseTimeoutSeconds`.
    pub seconds: Option<u64>,
}
