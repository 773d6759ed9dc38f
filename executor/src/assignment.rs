//! Running one assignment of a command-body task: input shape → params schema → pre guardrail
//! → body → result schema → post guardrail → result. Every failure becomes a result whose
//! reason names the check first and ends with the tail of the failing command's stderr.

use crate::{
    body_thread::BodyThread,
    command::{self, CommandSpec, Ended, Finished, RunLimits, SoftLimit},
    jsonl::{JsonlBody, JsonlFailure},
    spans::{Open, SpanRecorder},
    task::{Task, TaskContext, TaskError},
    workspace::flow::{Attempt, DownloadLimits, Fence, FenceRead, Owner},
};
use perago_core::{
    attempt::AttemptSnapshot,
    command::{CommandError, resolve_program},
    json::RawJson,
    lakefs::{LakefsClient, LakefsConfigError},
    manifest::{BodyKind, BodyProtocol, Manifest, TaskKind, TimeoutPolicy},
    result::{Reason, RuntimeResult},
    shape::{parse_input, workspace_free_output, workspace_output},
    trace::TraceContext,
};
use perago_proto::slot::v1::Phase;
use perago_sys::fd::dir::{Dir, EntryKind, fstat};
use serde_json::{Map, Value};
use std::{ffi::OsStr, sync::Arc, time::Duration};

/// The largest task output perago delivers: Conductor's `maxTaskOutputPayloadSizeThreshold`
/// (10240 KB by default). Up to it the output goes inline, as the SDKs send it; the server moves
/// what is above `taskOutputPayloadSizeThreshold` (3072 KB) to its external storage itself.
/// Above it the server would force the task to FAILED_WITH_TERMINAL_ERROR, so perago fails it
/// that way first, naming both sizes (see docs/executor.md).
pub const MAX_OUTPUT_BYTES: usize = perago_proto::MAX_TASK_PAYLOAD_BYTES;

/// Room for whitespace around a body's result on stdout: the result is measured after it is
/// trimmed, so stdout may be a little longer than [`MAX_OUTPUT_BYTES`].
const STDOUT_SLACK_BYTES: usize = 64 * 1024;

/// Why an output of `size` bytes is refused: above Conductor's hard limit, terminal there too.
pub fn output_too_large(size: u64) -> Reason {
    Reason::new(format!(
        "task output is {size} bytes, above Conductor's limit of {MAX_OUTPUT_BYTES} bytes (maxTaskOutputPayloadSizeThreshold, 10240 KB); the server fails such a task for good"
    ))
}

/// A manifest this runner cannot execute.
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    /// A body or guardrail program is missing.
    #[error("{key}")]
    Program {
        /// `body.command`, `guardrails.pre`, `guardrails.post`.
        key: &'static str,
        /// Why.
        #[source]
        source: CommandError,
    },
    /// A body kind or task kind this runner does not handle.
    #[error("{0}")]
    Unsupported(&'static str),
    /// `body.user` cannot be used.
    #[error(transparent)]
    User(#[from] perago_sys::user::UserError),
}

#[derive(Debug, Clone)]
struct Program {
    label: String,
    spec: CommandSpec,
}

/// What runs the body.
#[derive(Clone)]
enum Body {
    Command(Program),
    Jsonl(Arc<JsonlBody>),
    Rust(Arc<dyn Task>),
}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Command(p) => f.debug_tuple("Command").field(p).finish(),
            Self::Jsonl(b) => f.debug_tuple("Jsonl").field(b).finish(),
            Self::Rust(_) => f.write_str("Rust"),
        }
    }
}

/// Executes assignments of one manifest for one worker id.
#[derive(Debug, Clone)]
pub struct AssignmentRunner {
    manifest: Arc<Manifest>,
    worker_id: String,
    body: Body,
    pre: Option<Program>,
    post: Option<Program>,
    kill_grace: Duration,
    poisoned: Arc<std::sync::atomic::AtomicBool>,
    /// The thread Rust bodies run on, started with the first (see [`BodyThread`]): what a
    /// body starts directly is a child of that thread.
    body_thread: Arc<std::sync::OnceLock<BodyThread>>,
    /// `body.user`, resolved: the workspace is handed to this uid and gid before the body.
    body_user: Option<(u32, u32)>,
    /// The peak memory of the last body run, as its memory cgroup counted it
    /// (`body.memory_limit`; 0: not measured): see [`AssignmentRunner::take_body_peak`].
    body_peak: Arc<std::sync::atomic::AtomicU64>,
    /// The last body run failed OOM-killed at its memory limit: see
    /// [`AssignmentRunner::take_body_oom`].
    body_oom: Arc<std::sync::atomic::AtomicBool>,
    workspace: Option<WorkspaceRuntime>,
}

/// What workspace assignments need from the executor's environment.
#[derive(Debug, Clone)]
pub struct WorkspaceRuntime {
    /// `PERAGO_WORKSPACE_ROOT`: attempt directories go under `attempts/`.
    pub root: std::path::PathBuf,
    /// The lakeFS client, or why there is none (reported as the assignment's failure).
    pub lakefs: Result<LakefsClient, LakefsConfigError>,
    /// This executor's slot and generation, written to each attempt's owner file.
    pub owner: Owner,
}

/// The slot's side of one assignment: the attempt fence and phase reports.
#[derive(Default)]
pub struct AssignmentIo<'a> {
    /// Reads the attempt back; needed by workspace tasks.
    pub fence: Option<&'a dyn Fence>,
    /// Called as the assignment enters each phase.
    pub progress: Option<&'a (dyn Fn(Phase) + Send + Sync)>,
    /// The soft time limit the broker gave this assignment (a reload changed it:
    /// `Admin.Reconfigure`), in place of the manifest's `body.soft_time_limit`; `Some(None)`:
    /// none. `None`: the manifest's.
    pub soft_time_limit: Option<Option<Duration>>,
    /// The assignment's spans, when the broker exports traces (see [`crate::spans`]).
    pub trace: Option<&'a SpanRecorder>,
}

impl std::fmt::Debug for AssignmentIo<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AssignmentIo")
            .field("fence", &self.fence.is_some())
            .field("trace", &self.trace.is_some())
            .finish()
    }
}

impl AssignmentIo<'_> {
    fn phase(&self, phase: Phase) {
        if let Some(progress) = self.progress {
            progress(phase);
        }
    }

    /// Runs `work` within a span named `name` (while traced), failed when `work` fails.
    async fn traced<T>(
        &self,
        name: &'static str,
        work: impl Future<Output = Result<T, Failure>>,
    ) -> Result<T, Failure> {
        let Some(trace) = self.trace else {
            return work.await;
        };
        let open = trace.start(name);
        let result = work.await;
        trace.end(open, result.as_ref().err().map(Failure::reason));
        result
    }
}

/// A fence whose every read is a `workspace.fence` span.
struct TracedFence<'a> {
    fence: &'a dyn Fence,
    trace: &'a SpanRecorder,
}

impl Fence for TracedFence<'_> {
    fn reload(&self) -> std::pin::Pin<Box<dyn Future<Output = FenceRead> + Send + '_>> {
        Box::pin(async move {
            let open = self.trace.start("workspace.fence");
            let read = self.fence.reload().await;
            let error = match &read {
                FenceRead::Fresh(_) => None,
                FenceRead::Gone => Some("Conductor no longer knows the task"),
                FenceRead::Unavailable(why) => Some(why.as_str()),
            };
            self.trace.end(open, error);
            read
        })
    }
}

/// Ends the span in `slot`, if one is open there.
fn end_open(
    trace: Option<&SpanRecorder>,
    slot: &std::sync::Mutex<Option<Open>>,
    error: Option<&str>,
) {
    let open = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let (Some(trace), Some(open)) = (trace, open) {
        trace.end(open, error);
    }
}

impl AssignmentRunner {
    /// Resolves the body and guardrail programs (against the manifest folder and `path_var`).
    pub fn new(
        manifest: Arc<Manifest>,
        worker_id: String,
        path_var: Option<&OsStr>,
    ) -> Result<Self, RunnerError> {
        Self::build(manifest, worker_id, path_var, None)
    }

    /// A runner whose body is a Rust [`Task`] (the manifest's `body.executor` is this binary).
    pub fn with_task(
        manifest: Arc<Manifest>,
        worker_id: String,
        path_var: Option<&OsStr>,
        task: Arc<dyn Task>,
    ) -> Result<Self, RunnerError> {
        Self::build(manifest, worker_id, path_var, Some(task))
    }

    fn build(
        manifest: Arc<Manifest>,
        worker_id: String,
        path_var: Option<&OsStr>,
        task: Option<Arc<dyn Task>>,
    ) -> Result<Self, RunnerError> {
        let argv = match (&manifest.body.kind, &task) {
            (BodyKind::Executor(_), Some(_)) => None,
            (BodyKind::Command { .. }, Some(_)) => {
                return Err(RunnerError::Unsupported(
                    "this binary implements the task in Rust, but the manifest names body.command; set body.executor to this binary",
                ));
            }
            (BodyKind::Command { argv, .. }, None) => Some(argv),
            (BodyKind::Executor(_), None) => {
                return Err(RunnerError::Unsupported(
                    "a body.executor binary runs in place of the stock executor",
                ));
            }
        };
        let user = manifest
            .body
            .user
            .as_deref()
            .map(perago_sys::user::body_user)
            .transpose()
            .map_err(RunnerError::User)?;
        let env: Vec<(String, String)> = manifest
            .body
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let program = |key: &'static str, argv: &[String]| -> Result<Program, RunnerError> {
            let label = match key {
                "guardrails.pre" => "pre guardrail",
                "guardrails.post" => "post guardrail",
                _ => "body",
            };
            let path = resolve_program(&argv[0], &manifest.dir, path_var)
                .map_err(|source| RunnerError::Program { key, source })?;
            Ok(Program {
                label: argv.join(" "),
                spec: CommandSpec {
                    program: path,
                    args: argv[1..].to_vec(),
                    dir: manifest.dir.clone(),
                    env: env.clone(),
                    label: label.to_owned(),
                    user,
                    // The body's limit; guardrails run outside it.
                    memory_limit: (key == "body.command")
                        .then_some(manifest.body.memory_limit)
                        .flatten(),
                },
            })
        };
        let body = match (argv, task) {
            (Some(argv), _) => {
                let program = program("body.command", argv)?;
                match &manifest.body.kind {
                    BodyKind::Command {
                        protocol: BodyProtocol::Jsonl,
                        ..
                    } => Body::Jsonl(Arc::new(JsonlBody::new(program.spec))),
                    _ => Body::Command(program),
                }
            }
            (None, Some(task)) => Body::Rust(task),
            (None, None) => unreachable!("an executor body without a task is refused above"),
        };
        let pre = manifest
            .guardrails
            .pre
            .as_deref()
            .map(|a| program("guardrails.pre", a))
            .transpose()?;
        let post = manifest
            .guardrails
            .post
            .as_deref()
            .map(|a| program("guardrails.post", a))
            .transpose()?;
        if manifest.body.memory_limit.is_some() {
            // Located now, so what a SIGKILLed runtime left is collected at start; a failure
            // fails each body's start, saying why.
            let _ = command::body_cgroups();
        }
        Ok(Self {
            manifest,
            worker_id,
            body,
            pre,
            post,
            kill_grace: Duration::from_secs(10),
            poisoned: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            body_thread: Arc::default(),
            workspace: None,
            body_user: user,
            body_peak: Arc::default(),
            body_oom: Arc::default(),
        })
    }

    /// Enables workspace assignments.
    pub fn with_workspace(mut self, runtime: WorkspaceRuntime) -> Self {
        self.workspace = Some(runtime);
        self
    }

    /// Sets the time between SIGTERM and SIGKILL when the body overruns (default 10 s).
    pub fn with_kill_grace(mut self, grace: Duration) -> Self {
        self.kill_grace = grace;
        self
    }

    /// Runs one assignment to its result. Never panics on bad input or a failing body: every
    /// path ends in a result for Conductor. Workspace tasks need `io.fence`.
    pub async fn execute(&self, execution_id: &str, attempt: &AttemptSnapshot) -> RuntimeResult {
        self.execute_with(execution_id, attempt, &AssignmentIo::default())
            .await
    }

    /// [`execute`](Self::execute) with the slot's fence and progress reporting.
    pub async fn execute_with(
        &self,
        execution_id: &str,
        attempt: &AttemptSnapshot,
        io: &AssignmentIo<'_>,
    ) -> RuntimeResult {
        match self.try_execute(execution_id, attempt, io).await {
            // Every body kind (a Rust `Task` too), the whole output (workspace included).
            Ok(output) => match output.len() {
                size if size > MAX_OUTPUT_BYTES => {
                    RuntimeResult::failed_terminal(&self.worker_id, output_too_large(size as u64))
                }
                _ => RuntimeResult::completed(&self.worker_id, output),
            },
            Err(Failure::Retriable(reason)) => RuntimeResult::failed(&self.worker_id, reason),
            Err(Failure::Terminal(reason)) => {
                RuntimeResult::failed_terminal(&self.worker_id, reason)
            }
        }
    }

    async fn try_execute(
        &self,
        execution_id: &str,
        attempt: &AttemptSnapshot,
        io: &AssignmentIo<'_>,
    ) -> Result<RawJson, Failure> {
        // No `Preparing` message: the broker shows a dispatched assignment as preparing until
        // the next phase arrives, and a message less per task is CPU saved on both sides.
        let budget = Budget::new(
            self.manifest.task.timeout_seconds,
            io.soft_time_limit
                .unwrap_or(self.manifest.body.soft_time_limit),
            self.manifest.task.timeout_policy != TimeoutPolicy::AlertOnly,
            attempt.timeout_clock_started_ms,
            now_unix_ms(),
        );
        if budget.exhausted() {
            return Err(Failure::Retriable(Reason::new(format!(
                "no time left to run: Conductor started this attempt {}s ago and task.timeout_seconds is {}s",
                budget.spent.as_secs(),
                budget.seconds
            ))));
        }
        let allowed_prefix = self
            .manifest
            .workspace
            .as_ref()
            .map_or("", |w| w.prefix.as_str());
        let input = parse_input(self.manifest.task.kind, &attempt.input_data, allowed_prefix)
            .map_err(|e| Failure::Retriable(Reason::new(perago_core::errors::chain(&e))))?;
        // The params stay text: parsed only for a schema (a Rust body parses them too).
        let params = input.params;
        if let Some(schema) = &self.manifest.schemas.params {
            schema
                .validate("params", &parsed_params(params)?)
                .map_err(|v| {
                    Failure::Retriable(Reason::new(format!(
                        "bad input: params do not match the params schema: {v}"
                    )))
                })?;
        }
        let mut env = vec![
            (
                perago_core::env::PERAGO_TASK_ID.to_owned(),
                attempt.task_id.clone(),
            ),
            (
                perago_core::env::PERAGO_EXECUTION_ID.to_owned(),
                execution_id.to_owned(),
            ),
            (
                perago_core::env::PERAGO_WORKER_ID.to_owned(),
                self.worker_id.clone(),
            ),
            (
                perago_core::env::PERAGO_WORKFLOW_ID.to_owned(),
                attempt.workflow_instance_id.clone(),
            ),
        ];
        if let Some(pre) = &self.pre {
            // A pre guardrail says the input can never succeed: no retry.
            let limits = self.guardrail_limits(&budget);
            self.guardrail(
                "pre",
                pre,
                &env,
                params.as_bytes().to_vec(),
                limits,
                Failure::Terminal,
            )
            .await?;
        }

        let Some(workspace_input) = input.workspace else {
            let result = self
                .run_body(execution_id, attempt, &env, params, io, &budget)
                .await?;
            return Ok(workspace_free_output(result));
        };
        let failed = |m: String| Failure::Retriable(Reason::new(m));
        let runtime = self.workspace.as_ref().ok_or_else(|| {
            failed("this executor has no workspace root (PERAGO_WORKSPACE_ROOT)".to_owned())
        })?;
        let client = runtime
            .lakefs
            .clone()
            .map_err(|e| failed(perago_core::errors::chain(&e)))?;
        let fence = io
            .fence
            .ok_or_else(|| failed("no attempt fence is available to this executor".to_owned()))?;
        io.phase(Phase::Downloading);
        // The listing and the downloads count against the task's time, as the body does.
        let limits = DownloadLimits {
            budget: self
                .manifest
                .workspace
                .as_ref()
                .and_then(|w| w.download_budget),
            time_left: budget.left(),
        };
        let mut ws = io
            .traced("workspace.download", async {
                Attempt::prepare_within(
                    client,
                    &runtime.root,
                    execution_id,
                    runtime.owner,
                    workspace_input,
                    limits,
                )
                .await
                .map_err(|e| failed(perago_core::errors::chain(&e)))
            })
            .await?;
        if let Some((uid, gid)) = self.body_user {
            // The body runs as another user: the files it works on become its own, and the
            // folders above them must let it through.
            hand_over(&runtime.root, ws.work_dir(), uid, gid)
                .map_err(|e| failed(perago_core::errors::chain(&e)))?;
        }
        env.push((
            perago_core::env::PERAGO_WORKSPACE_DIR.to_owned(),
            ws.work_dir().display().to_string(),
        ));
        let outcome = async {
            let result = self
                .run_body(execution_id, attempt, &env, params, io, &budget)
                .await?;
            io.phase(Phase::Staging);
            // Staging lasts until the change is staged; the merge from there (`publishing`).
            let stage = std::sync::Mutex::new(io.trace.map(|t| t.start("workspace.stage")));
            let merge = std::sync::Mutex::new(None);
            let traced_fence = io.trace.map(|trace| TracedFence { fence, trace });
            let fence: &dyn Fence = match &traced_fence {
                Some(traced) => traced,
                None => fence,
            };
            let spec = self.manifest.workspace.as_ref().expect("workspace task");
            // The body has ended: the tree is taken back from its user before it is read.
            let changes = ws
                .changes(self.body_user.map(|(uid, _)| uid), spec.publish_budget)
                .map_err(|e| failed(perago_core::errors::chain(&e)));
            let changes = match changes {
                Ok(changes) => changes,
                Err(failure) => {
                    end_open(io.trace, &stage, Some(failure.reason()));
                    return Err(failure);
                }
            };
            let metadata: Map<String, Value> = [
                ("workflow_id", attempt.workflow_instance_id.clone()),
                ("task_id", attempt.task_id.clone()),
                ("retry_count", attempt.retry_count.to_string()),
                ("execution_id", execution_id.to_owned()),
                ("worker_id", self.worker_id.clone()),
            ]
            .into_iter()
            // The attempt this one retries, when Conductor says (seed 001: for tracing a
            // publication back through retries).
            .chain(
                attempt
                    .retried_task_id
                    .clone()
                    .map(|id| ("retried_task_id", id)),
            )
            .map(|(k, v)| (k.to_owned(), Value::String(v)))
            .collect();
            // A merge that does not answer is settled within the task's time left.
            ws.set_time_left(budget.left());
            // Still staging while files upload; publishing from the merge on.
            let published = ws
                .publish(
                    &changes,
                    spec,
                    fence,
                    attempt,
                    execution_id,
                    metadata,
                    &|| {
                        io.phase(Phase::Publishing);
                        if let Some(trace) = io.trace {
                            end_open(io.trace, &stage, None);
                            *merge.lock().unwrap_or_else(|e| e.into_inner()) =
                                Some(trace.start("workspace.merge"));
                        }
                    },
                )
                .await
                .map_err(|e| {
                    if e.is_terminal() {
                        Failure::Terminal(Reason::new(perago_core::errors::chain(&e)))
                    } else {
                        failed(perago_core::errors::chain(&e))
                    }
                });
            // Whichever of the two was open when the publish ended ends with it.
            let error = published.as_ref().err().map(Failure::reason);
            end_open(io.trace, &stage, error);
            end_open(io.trace, &merge, error);
            let published = published?;
            Ok::<_, Failure>(workspace_output(&published, result))
        }
        .await;
        io.phase(Phase::Cleanup);
        ws.cleanup().await;
        outcome
    }

    fn guardrail_limits(&self, budget: &Budget) -> RunLimits {
        RunLimits {
            timeout: budget.left(),
            kill_grace: self.kill_grace,
            ..RunLimits::default()
        }
    }

    /// The body, the result schema and the post guardrail.
    /// While traced, all of it is the `body` span, and the body is handed that span's context
    /// (`TRACEPARENT`, the `jsonl` request's fields, [`TaskContext::traceparent`]).
    async fn run_body(
        &self,
        execution_id: &str,
        attempt: &AttemptSnapshot,
        env: &[(String, String)],
        params: &str,
        io: &AssignmentIo<'_>,
        budget: &Budget,
    ) -> Result<RawJson, Failure> {
        let Some(trace) = io.trace else {
            return self
                .run_body_within(execution_id, attempt, env, params, io, budget, None)
                .await;
        };
        let mut open = trace.start("body");
        let context = open.context(trace);
        let result = self
            .run_body_within(
                execution_id,
                attempt,
                env,
                params,
                io,
                budget,
                Some((&context, &mut open)),
            )
            .await;
        trace.end(open, result.as_ref().err().map(Failure::reason));
        result
    }

    #[expect(clippy::too_many_arguments, reason = "run_body's, and the body span")]
    async fn run_body_within(
        &self,
        execution_id: &str,
        attempt: &AttemptSnapshot,
        env: &[(String, String)],
        params: &str,
        io: &AssignmentIo<'_>,
        budget: &Budget,
        mut traced: Option<(&TraceContext, &mut Open)>,
    ) -> Result<RawJson, Failure> {
        let traceparent = traced.as_ref().map(|(context, _)| context.traceparent());
        let tracestate = traced
            .as_ref()
            .and_then(|(context, _)| context.trace_state.clone());
        if !self.body_at_dispatch() {
            io.phase(Phase::Body);
        }
        let limits = RunLimits {
            timeout: budget.left(),
            kill_grace: self.kill_grace,
            max_stdout: MAX_OUTPUT_BYTES + STDOUT_SLACK_BYTES,
            ..RunLimits::default()
        };
        let result = match &self.body {
            Body::Command(program) => {
                let mut spec = program.spec.clone();
                spec.env.extend(env.iter().cloned());
                spec.env
                    .extend(trace_env(traceparent.as_deref(), tracestate.as_deref()));
                let soft = soft_limit(budget, &attempt.task_id, execution_id, &self.worker_id);
                let stdin = params.as_bytes().to_vec();
                let run = command::run_with_soft_limit(&spec, stdin, limits, soft.as_ref())
                    .await
                    .map_err(|e| {
                        Failure::Retriable(Reason::new(format!(
                            "body could not start: {}",
                            perago_core::errors::DisplayChain(&e)
                        )))
                    })?;
                // The cgroup's count, else (PERAGO_MEMORY_HEADROOM) the sampled RSS.
                if let Some(peak) = run.memory.and_then(|m| m.peak).or(run.sampled_peak_rss) {
                    self.body_peak
                        .store(peak, std::sync::atomic::Ordering::Relaxed);
                }
                self.body_oom.store(
                    command::oom_killed(&run),
                    std::sync::atomic::Ordering::Relaxed,
                );
                if let Some((_, span)) = &mut traced {
                    match run.ended {
                        Ended::Exited(code) => span.int("process.exit.code", code.into()),
                        Ended::Signaled(signal) => span.int("perago.body.signal", signal.into()),
                        Ended::TimedOut => span.string("perago.body.ended", "timed out"),
                    }
                }
                body_result(&run, budget)?
            }
            Body::Jsonl(body) => {
                let workspace_dir = env
                    .iter()
                    .find(|(k, _)| k == perago_core::env::PERAGO_WORKSPACE_DIR)
                    .map(|(_, v)| v.as_str());
                let request = crate::jsonl::Request {
                    execution_id,
                    task_id: &attempt.task_id,
                    workflow_id: &attempt.workflow_instance_id,
                    worker_id: &self.worker_id,
                    params,
                    workspace_dir,
                    traceparent: traceparent.as_deref(),
                    tracestate: tracestate.as_deref(),
                };
                let process_env = self.jsonl_process_env();
                let soft = soft_limit(budget, &attempt.task_id, execution_id, &self.worker_id);
                let answer = body
                    .call(
                        execution_id,
                        &request,
                        &process_env,
                        budget.left(),
                        soft.as_ref(),
                    )
                    .await;
                self.body_peak
                    .store(body.last_peak(), std::sync::atomic::Ordering::Relaxed);
                match answer {
                    Ok(result) => {
                        // The size of the text that goes on to Conductor.
                        if result.len() > MAX_OUTPUT_BYTES {
                            return Err(Failure::Terminal(output_too_large(result.len() as u64)));
                        }
                        result
                    }
                    Err(JsonlFailure::Error { message, terminal }) => {
                        let reason = Reason::new(message);
                        return Err(if terminal {
                            Failure::Terminal(reason)
                        } else {
                            Failure::Retriable(reason)
                        });
                    }
                    Err(JsonlFailure::Broken {
                        reason,
                        stderr_tail,
                    }) => {
                        self.body_oom.store(
                            reason.starts_with(command::OOM_PREFIX),
                            std::sync::atomic::Ordering::Relaxed,
                        );
                        return Err(Failure::Retriable(Reason::with_tail(&reason, &stderr_tail)));
                    }
                }
            }
            Body::Rust(body) => {
                let ctx = TaskContext {
                    task_id: attempt.task_id.clone(),
                    execution_id: execution_id.to_owned(),
                    worker_id: self.worker_id.clone(),
                    workflow_id: attempt.workflow_instance_id.clone(),
                    retry_count: attempt.retry_count,
                    workspace_dir: env
                        .iter()
                        .find(|(name, _)| name == perago_core::env::PERAGO_WORKSPACE_DIR)
                        .map(|(_, dir)| dir.into()),
                    traceparent: traceparent.clone(),
                    tracestate: tracestate.clone(),
                };
                let Value::Object(params) = parsed_params(params)? else {
                    unreachable!("params were checked to be an object");
                };
                let result = self.run_rust(Arc::clone(body), ctx, params, budget).await?;
                RawJson::from_value(&result)
            }
        };
        if let Some(schema) = &self.manifest.schemas.result {
            let parsed = result.to_value().map_err(|e| {
                Failure::Retriable(Reason::new(format!(
                    "result does not match the result schema: {}",
                    perago_core::errors::DisplayChain(&e)
                )))
            })?;
            schema.validate("result", &parsed).map_err(|v| {
                Failure::Retriable(Reason::new(format!(
                    "result does not match the result schema: {v}"
                )))
            })?;
        }
        if let Some(post) = &self.post {
            let result_json = result.as_str().as_bytes().to_vec();
            let limits = self.guardrail_limits(budget);
            self.guardrail("post", post, env, result_json, limits, Failure::Retriable)
                .await?;
        }
        Ok(result)
    }

    /// Runs a guardrail with `stdin`; a non-zero exit fails the assignment as `failure` says.
    /// One that cannot start is a retriable failure (the deployment, not the input, is wrong).
    async fn guardrail(
        &self,
        which: &str,
        program: &Program,
        env: &[(String, String)],
        stdin: Vec<u8>,
        limits: RunLimits,
        failure: fn(Reason) -> Failure,
    ) -> Result<(), Failure> {
        let run = self.run(program, env, stdin, limits).await.map_err(|e| {
            Failure::Retriable(Reason::new(format!(
                "{which} guardrail {} could not start: {}",
                program.label,
                perago_core::errors::DisplayChain(&e)
            )))
        })?;
        if run.ended == Ended::Exited(0) {
            return Ok(());
        }
        Err(failure(Reason::with_tail(
            &format!(
                "{which} guardrail {} failed ({})",
                program.label,
                run.ended.describe()
            ),
            &run.stderr_tail,
        )))
    }

    /// Runs a Rust body on the executor's body thread (started with the first) within the time
    /// limit. An overrun cannot be stopped from outside the thread: it is reported, and the
    /// executor is marked to exit after the completion so the supervisor replaces the process.
    async fn run_rust(
        &self,
        body: Arc<dyn Task>,
        ctx: TaskContext,
        params: Map<String, Value>,
        budget: &Budget,
    ) -> Result<Value, Failure> {
        let thread = match self.body_thread.get() {
            Some(thread) => thread,
            None => {
                let started =
                    BodyThread::start(tokio::runtime::Handle::current()).map_err(|e| {
                        Failure::Retriable(Reason::new(format!(
                            "cannot start the body's thread: {}",
                            perago_core::errors::DisplayChain(&e)
                        )))
                    })?;
                self.body_thread.get_or_init(|| started)
            }
        };
        let work = thread.run(move || body.run(&ctx, &params));
        let outcome = match budget.left() {
            None => work.await,
            Some(limit) => match tokio::time::timeout(limit, work).await {
                Ok(joined) => joined,
                Err(_) => {
                    self.poisoned
                        .store(true, std::sync::atomic::Ordering::SeqCst);
                    return Err(Failure::Retriable(Reason::new(format!(
                        "body timed out after {}; the executor restarts to stop it",
                        budget.describe()
                    ))));
                }
            },
        };
        match outcome {
            Ok(Ok(Ok(value))) => Ok(value),
            Ok(Ok(Err(TaskError::Retriable(m)))) => Err(Failure::Retriable(Reason::new(m))),
            Ok(Ok(Err(TaskError::Terminal(m)))) => Err(Failure::Terminal(Reason::new(m))),
            Ok(Err(panic)) => {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".to_owned());
                Err(Failure::Retriable(Reason::new(format!(
                    "body panicked: {message}"
                ))))
            }
            // The thread never drops a call unanswered while this runner holds it.
            Err(_) => Err(Failure::Retriable(Reason::new(
                "the body's thread ended before the body returned",
            ))),
        }
    }

    /// Whether the body starts as soon as an assignment arrives: no pre guardrail, no workspace
    /// to download. The broker then shows the body phase from dispatch, and `Body` progress
    /// is not sent (see `Hello.body_at_dispatch`).
    pub fn body_at_dispatch(&self) -> bool {
        self.pre.is_none() && self.manifest.task.kind == TaskKind::WorkspaceFree
    }

    /// The persistent (`jsonl`) body process outlives assignments: only its stable identity
    /// is in its env.
    fn jsonl_process_env(&self) -> [(String, String); 1] {
        [(
            perago_core::env::PERAGO_WORKER_ID.to_owned(),
            self.worker_id.clone(),
        )]
    }

    /// Starts the persistent (`jsonl`) body process now, as the next assignment would, if none
    /// runs; its pid (`None` for other bodies). For tests of a time limit that must not include
    /// the interpreter's start-up: the executor itself starts the process with the first
    /// assignment that needs one.
    #[doc(hidden)]
    pub async fn start_body(&self) -> std::io::Result<Option<u32>> {
        match &self.body {
            Body::Jsonl(body) => body.start_now(&self.jsonl_process_env()).await.map(Some),
            _ => Ok(None),
        }
    }

    /// The peak memory of the body of the assignment run last, as its memory cgroup counted it
    /// (`body.memory_limit`; a `jsonl` body: its process's whole life so far), and 0 from then
    /// on; 0 when not measured. For the completion (`Completion.body_peak_memory_bytes`).
    pub fn take_body_peak(&self) -> u64 {
        self.body_peak.swap(0, std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the assignment run last failed because its body was OOM-killed at its memory
    /// limit (then false from then on). For the completion (`Completion.body_oom_killed`:
    /// the broker counts it toward poison detection).
    pub fn take_body_oom(&self) -> bool {
        self.body_oom
            .swap(false, std::sync::atomic::Ordering::Relaxed)
    }

    /// The pid of the persistent (`jsonl`) body process, while one runs between assignments.
    pub fn body_pid(&self) -> Option<u32> {
        match &self.body {
            Body::Jsonl(body) => body.pid(),
            _ => None,
        }
    }

    /// Whether an assignment ends with what its body left running already killed and reaped:
    /// a command body's run does it itself (see `command::run`), so the slot need not look
    /// again; a Rust body's threads and a persistent `jsonl` body leave it to the slot.
    pub fn collects_leftovers(&self) -> bool {
        matches!(self.body, Body::Command(_))
    }

    /// The id of the thread Rust bodies run on, once one has run (see
    /// [`perago_sys::reaper::kill_adopted_below`]).
    pub fn body_thread_id(&self) -> Option<u32> {
        self.body_thread.get().map(BodyThread::tid)
    }

    /// True once a Rust body overran its time limit: the executor should exit after sending
    /// the completion.
    pub fn poisoned(&self) -> bool {
        self.poisoned.load(std::sync::atomic::Ordering::SeqCst)
    }

    async fn run(
        &self,
        program: &Program,
        env: &[(String, String)],
        stdin: Vec<u8>,
        limits: RunLimits,
    ) -> std::io::Result<Finished> {
        let mut spec = program.spec.clone();
        spec.env.extend(env.iter().cloned());
        command::run(&spec, stdin, limits).await
    }
}

/// The time an attempt may still run: `task.timeout_seconds`, counted as Conductor counts its
/// task timeout, from the attempt's start (`startTime + startDelayInSeconds`), so a task that
/// was handed back and polled again, or waited for a slot, gets only what Conductor has left.
/// With `ALERT_ONLY` Conductor enforces nothing and the limit counts from this execution's
/// start; so it does when the start is unknown.
#[derive(Debug, Clone, Copy)]
struct Budget {
    /// `task.timeout_seconds`; 0 = no limit.
    seconds: u64,
    /// How much of it was gone when this execution began.
    spent: Duration,
    deadline: Option<tokio::time::Instant>,
    /// `body.soft_time_limit` on the same clock: when the body is asked to wrap up.
    soft_deadline: Option<tokio::time::Instant>,
}

impl Budget {
    fn new(
        seconds: u64,
        soft: Option<Duration>,
        enforced: bool,
        clock_started_ms: Option<i64>,
        now_ms: i64,
    ) -> Self {
        let spent = match clock_started_ms {
            Some(started) if enforced => {
                Duration::from_millis(u64::try_from(now_ms.saturating_sub(started)).unwrap_or(0))
            }
            _ => Duration::ZERO,
        };
        let now = tokio::time::Instant::now();
        let total = Duration::from_secs(seconds);
        let deadline = (seconds > 0).then(|| now + total.saturating_sub(spent));
        // Already past the soft limit at dispatch: zero (a jsonl body is asked to wrap up at
        // once; an exec body, just started, is not signalled: see `command::run_with_soft_limit`).
        let soft_deadline = soft.map(|soft| now + soft.saturating_sub(spent));
        Self {
            seconds,
            spent,
            deadline,
            soft_deadline,
        }
    }

    /// The time left from now; `None` = no limit.
    fn left(&self) -> Option<Duration> {
        self.deadline
            .map(|d| d.saturating_duration_since(tokio::time::Instant::now()))
    }

    /// The time left until the soft limit; `None` = no soft limit.
    fn soft_left(&self) -> Option<Duration> {
        self.soft_deadline
            .map(|d| d.saturating_duration_since(tokio::time::Instant::now()))
    }

    fn exhausted(&self) -> bool {
        self.seconds > 0 && self.spent >= Duration::from_secs(self.seconds)
    }

    /// How the limit was counted, for a timeout's reason.
    fn describe(&self) -> String {
        if self.spent.is_zero() {
            format!("{}s (task.timeout_seconds)", self.seconds)
        } else {
            format!(
                "{}s (task.timeout_seconds) counted from the attempt's start in Conductor, {}s before this execution",
                self.seconds,
                self.spent.as_secs()
            )
        }
    }
}

/// The soft limit of this assignment's body, if the manifest sets one.
fn soft_limit(
    budget: &Budget,
    task_id: &str,
    execution_id: &str,
    worker_id: &str,
) -> Option<SoftLimit> {
    budget.soft_left().map(|after| SoftLimit {
        after,
        task_id: task_id.to_owned(),
        execution_id: execution_id.to_owned(),
        worker_id: worker_id.to_owned(),
    })
}

fn now_unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Hands the attempt's `work` folder to `body.user`: the folder and everything in it become
/// that user's (folders 0700, files 0600), the attempt folders between it and the workspace
/// root let others through (0711: no listing), and every folder above must already let that
/// user through, or the assignment fails saying which one.
fn hand_over(
    workspace_root: &std::path::Path,
    work: &std::path::Path,
    uid: u32,
    gid: u32,
) -> Result<(), HandOverError> {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let chown = |source| HandOverError::Chown { uid, source };
    let dir = Dir::open(work).map_err(chown)?;
    chown_tree(&dir, uid, gid).map_err(chown)?;
    // The folder itself last: until then the body's user cannot enter it.
    dir.chmod(0o700)
        .and_then(|()| dir.chown(uid, gid))
        .map_err(chown)?;
    let mut dir = work.parent();
    while let Some(d) = dir {
        let meta = std::fs::metadata(d).map_err(|source| HandOverError::Read {
            dir: d.to_owned(),
            source,
        })?;
        if d.starts_with(workspace_root) && d != workspace_root {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o711)).map_err(
                |source| HandOverError::Open {
                    dir: d.to_owned(),
                    source,
                },
            )?;
        } else {
            let mode = meta.mode();
            let through = (meta.uid() == uid && mode & 0o100 != 0)
                || (meta.gid() == gid && mode & 0o010 != 0)
                || mode & 0o001 != 0;
            if !through {
                return Err(HandOverError::NotTraversable {
                    uid,
                    dir: d.to_owned(),
                });
            }
        }
        dir = d.parent();
    }
    Ok(())
}

/// The attempt's `work` folder cannot be handed to `body.user`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HandOverError {
    /// The files cannot be chowned.
    #[error("cannot hand the workspace to body.user (uid {uid})")]
    Chown {
        uid: u32,
        #[source]
        source: std::io::Error,
    },
    /// A folder above it cannot be read.
    #[error("cannot read {}", dir.display())]
    Read {
        dir: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// An attempt folder cannot be opened to the user.
    #[error("cannot open {} to body.user", dir.display())]
    Open {
        dir: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A folder above the workspace root does not let the user through.
    #[error(
        "body.user (uid {uid}) cannot reach its workspace: {} does not let it through; make PERAGO_WORKSPACE_ROOT and the folders above it traversable by that user",
        dir.display()
    )]
    NotTraversable { uid: u32, dir: std::path::PathBuf },
}

/// Hands everything below the open folder `dir` to `uid`:`gid`, deepest first and from held
/// descriptors (never a path, never through a symlink: a symlink itself is chowned): each
/// folder is given away only once all it holds is, so the body's user can change nothing in
/// the tree before it is all handed over. Folders become 0700, files 0600.
fn chown_tree(dir: &Dir, uid: u32, gid: u32) -> std::io::Result<()> {
    use std::os::{fd::AsFd as _, unix::fs::PermissionsExt as _};
    for name in dir.entries()? {
        let stat = dir.stat_at(&name)?;
        match stat.kind {
            EntryKind::Dir => {
                let sub = dir.open_dir(&name)?;
                chown_tree(&sub, uid, gid)?;
                sub.chmod(0o700)?;
                sub.chown(uid, gid)?;
            }
            EntryKind::File => {
                let file = dir.open_file(&name)?;
                if !fstat(file.as_fd())?.same_file(&stat) {
                    return Err(std::io::Error::other(format!(
                        "{} changed while it was handed over",
                        std::path::Path::new(&name).display()
                    )));
                }
                file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
                std::os::unix::fs::fchown(&file, Some(uid), Some(gid))?;
            }
            EntryKind::Symlink | EntryKind::Special => dir.chown_at(&name, uid, gid)?,
        }
    }
    Ok(())
}

#[derive(Debug)]
enum Failure {
    Retriable(Reason),
    Terminal(Reason),
}

impl Failure {
    fn reason(&self) -> &str {
        match self {
            Self::Retriable(reason) | Self::Terminal(reason) => reason.as_str(),
        }
    }
}

/// A command body's trace variables: `TRACEPARENT`, and `TRACESTATE` when the trace has a
/// state (the names OpenTelemetry SDKs read them under).
fn trace_env(
    traceparent: Option<&str>,
    tracestate: Option<&str>,
) -> impl Iterator<Item = (String, String)> {
    let parent = traceparent.map(|v| (perago_core::env::TRACEPARENT.to_owned(), v.to_owned()));
    let state = traceparent
        .and(tracestate)
        .map(|v| (perago_core::env::TRACESTATE.to_owned(), v.to_owned()));
    parent.into_iter().chain(state)
}

/// The params (a JSON object's text, within the input) parsed, for a schema or a Rust body.
fn parsed_params(params: &str) -> Result<Value, Failure> {
    perago_core::json::from_str(params).map_err(|e| {
        Failure::Retriable(Reason::new(format!(
            "bad input: params: {}",
            perago_core::errors::DisplayChain(&e)
        )))
    })
}

/// The body's result document (checked as it would be parsed, kept as text), or why there is
/// none.
fn body_result(run: &Finished, budget: &Budget) -> Result<RawJson, Failure> {
    let fail = |head: String| {
        Err(Failure::Retriable(Reason::with_tail(
            &head,
            &run.stderr_tail,
        )))
    };
    // The kernel killed (part of) the tree at its memory limit: that is why it failed.
    if command::oom_killed(run)
        && let Some(memory) = &run.memory
    {
        return fail(command::oom_reason(memory));
    }
    match run.ended {
        Ended::Exited(0) => {}
        Ended::TimedOut => {
            return fail(format!(
                "body timed out after {} and was stopped",
                budget.describe()
            ));
        }
        ended => return fail(format!("body failed ({})", ended.describe())),
    }
    if run.stdout_overflow {
        return Err(Failure::Terminal(output_too_large(run.stdout_len)));
    }
    let text = String::from_utf8_lossy(&run.stdout);
    if text.trim().is_empty() {
        return fail("body printed no result on stdout (expected one JSON document)".to_owned());
    }
    RawJson::parse(text.into_owned()).or_else(|e| {
        fail(format!(
            "body result on stdout is not valid JSON: {}",
            perago_core::errors::DisplayChain(&e)
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_000_000;

    #[test]
    fn a_workspace_that_cannot_be_handed_over_says_why_by_its_variant() {
        let tmp = tempfile::tempdir().unwrap();
        let work = tmp.path().join("attempts/e-1/work");
        let error = hand_over(tmp.path(), &work, 4242, 4242).unwrap_err();
        assert!(
            matches!(error, HandOverError::Chown { uid: 4242, .. }),
            "{error:?}"
        );
        assert!(
            perago_core::errors::chain(&error)
                .starts_with("cannot hand the workspace to body.user (uid 4242): "),
            "{error}"
        );
    }

    #[test]
    fn a_handed_over_workspace_is_the_body_users_and_closed_to_others() {
        use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _, symlink};
        if perago_sys::user::euid() != 0 {
            eprintln!("skipped: handing files to another user needs root");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let work = tmp.path().join("attempts/e-1/work");
        std::fs::create_dir_all(work.join("sub")).unwrap();
        std::fs::write(work.join("sub/f.txt"), "x").unwrap();
        let outside = tmp.path().join("root-only");
        std::fs::write(&outside, "secret").unwrap();
        symlink(&outside, work.join("link")).unwrap();
        hand_over(tmp.path(), &work, 4242, 4243).unwrap();
        for (path, mode) in [
            (work.clone(), 0o700),
            (work.join("sub"), 0o700),
            (work.join("sub/f.txt"), 0o600),
        ] {
            let meta = std::fs::symlink_metadata(&path).unwrap();
            assert_eq!((meta.uid(), meta.gid()), (4242, 4243), "{}", path.display());
            assert_eq!(
                meta.permissions().mode() & 0o7777,
                mode,
                "{}",
                path.display()
            );
        }
        assert_eq!(
            std::fs::symlink_metadata(work.join("link")).unwrap().uid(),
            4242
        );
        // What the link points to is left alone.
        assert_eq!(std::fs::metadata(&outside).unwrap().uid(), 0);
        let attempt = std::fs::metadata(tmp.path().join("attempts/e-1")).unwrap();
        assert_eq!(attempt.permissions().mode() & 0o7777, 0o711);
    }

    fn near(actual: Option<Duration>, expected: Duration) -> bool {
        // Computed against the clock at two moments a few microseconds apart.
        actual.is_some_and(|a| a <= expected && expected - a < Duration::from_millis(50))
    }

    #[test]
    fn the_soft_limit_counts_from_the_attempts_start_like_the_hard_one() {
        let soft = Some(Duration::from_secs(40));
        // 15 s gone in Conductor: 45 s to the hard limit, 25 s to the soft one.
        let b = Budget::new(60, soft, true, Some(NOW - 15_000), NOW);
        assert!(near(b.left(), Duration::from_secs(45)));
        assert!(near(b.soft_left(), Duration::from_secs(25)));
        // Past the soft limit at dispatch: at once.
        let b = Budget::new(60, soft, true, Some(NOW - 50_000), NOW);
        assert_eq!(b.soft_left(), Some(Duration::ZERO));
        assert!(near(b.left(), Duration::from_secs(10)));
        // ALERT_ONLY, or the start unknown: from this execution's start.
        for b in [
            Budget::new(60, soft, false, Some(NOW - 15_000), NOW),
            Budget::new(60, soft, true, None, NOW),
        ] {
            assert!(near(b.soft_left(), Duration::from_secs(40)));
            assert!(near(b.left(), Duration::from_secs(60)));
        }
        // No hard limit: the soft one still applies.
        let b = Budget::new(0, soft, true, Some(NOW - 15_000), NOW);
        assert_eq!(b.left(), None);
        assert!(near(b.soft_left(), Duration::from_secs(25)));
        // None set.
        assert_eq!(Budget::new(60, None, true, None, NOW).soft_left(), None);
    }
}
