//! Running one assignment of a command-body task: input shape → params schema → pre guardrail
//! → body → result schema → post guardrail → result. Every failure becomes a result whose
//! reason names the check first and ends with the tail of the failing command's stderr.

use crate::{
    command::{self, CommandSpec, Ended, Finished, RunLimits},
    task::{Task, TaskContext, TaskError},
};
use perago_core::{
    attempt::AttemptSnapshot,
    command::{CommandError, resolve_program},
    manifest::{BodyKind, BodyProtocol, Manifest, TaskKind},
    result::{Reason, RuntimeResult},
    shape::{parse_input, workspace_free_output},
};
use serde_json::Value;
use std::{ffi::OsStr, sync::Arc, time::Duration};

/// Conductor externalizes task output above 3 MB (and fails it above 10 MB); perago fails
/// earlier and says why.
pub const MAX_OUTPUT_BYTES: usize = 3 * 1024 * 1024;

/// A manifest this runner cannot execute.
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    /// A body or guardrail program is missing.
    #[error("{key}: {source}")]
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
    Rust(Arc<dyn Task>),
}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Command(p) => f.debug_tuple("Command").field(p).finish(),
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
        if manifest.task.kind == TaskKind::Workspace {
            return Err(RunnerError::Unsupported(
                "workspace tasks need the lakeFS workspace runtime, which this executor does not have yet",
            ));
        }
        let argv = match (&manifest.body.kind, &task) {
            (BodyKind::Executor(_), Some(_)) => None,
            (BodyKind::Command { .. }, Some(_)) => {
                return Err(RunnerError::Unsupported(
                    "this binary implements the task in Rust, but the manifest names body.command; set body.executor to this binary",
                ));
            }
            (
                BodyKind::Command {
                    argv,
                    protocol: BodyProtocol::Exec,
                },
                None,
            ) => Some(argv),
            (
                BodyKind::Command {
                    protocol: BodyProtocol::Jsonl,
                    ..
                },
                None,
            ) => {
                return Err(RunnerError::Unsupported(
                    "body.protocol = \"jsonl\" is not supported by this executor yet; use \"exec\"",
                ));
            }
            (BodyKind::Executor(_), None) => {
                return Err(RunnerError::Unsupported(
                    "a body.executor binary runs in place of the stock executor",
                ));
            }
        };
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
                },
            })
        };
        let body = match (argv, task) {
            (Some(argv), _) => Body::Command(program("body.command", argv)?),
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
        Ok(Self {
            manifest,
            worker_id,
            body,
            pre,
            post,
            kill_grace: Duration::from_secs(10),
            poisoned: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        })
    }

    /// Sets the time between SIGTERM and SIGKILL when the body overruns (default 10 s).
    pub fn with_kill_grace(mut self, grace: Duration) -> Self {
        self.kill_grace = grace;
        self
    }

    /// Runs one assignment to its result. Never panics on bad input or a failing body: every
    /// path ends in a result for Conductor.
    pub async fn execute(&self, execution_id: &str, attempt: &AttemptSnapshot) -> RuntimeResult {
        match self.try_execute(execution_id, attempt).await {
            Ok(result) => RuntimeResult::completed(&self.worker_id, workspace_free_output(result)),
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
    ) -> Result<Value, Failure> {
        let task = &self.manifest.task;
        let input = parse_input(task.kind, &attempt.input_data, "")
            .map_err(|e| Failure::Retriable(Reason::new(e.to_string())))?;
        let params = Value::Object(input.params);
        if let Some(schema) = &self.manifest.schemas.params {
            schema.validate("params", &params).map_err(|v| {
                Failure::Retriable(Reason::new(format!(
                    "bad input: params do not match the params schema: {v}"
                )))
            })?;
        }
        let params_json = serde_json::to_vec(&params).expect("a Value always serializes");
        let env = [
            ("PERAGO_TASK_ID", attempt.task_id.as_str()),
            ("PERAGO_EXECUTION_ID", execution_id),
            ("PERAGO_WORKER_ID", self.worker_id.as_str()),
            ("PERAGO_WORKFLOW_ID", attempt.workflow_instance_id.as_str()),
        ];
        let guardrail_limits = RunLimits {
            timeout: self.time_limit(),
            kill_grace: self.kill_grace,
            ..RunLimits::default()
        };

        if let Some(pre) = &self.pre {
            // A pre guardrail says the input can never succeed: no retry.
            self.guardrail(
                "pre",
                pre,
                &env,
                params_json.clone(),
                guardrail_limits,
                Failure::Terminal,
            )
            .await?;
        }

        let limits = RunLimits {
            timeout: self.time_limit(),
            kill_grace: self.kill_grace,
            max_stdout: MAX_OUTPUT_BYTES,
            ..RunLimits::default()
        };
        let result = match &self.body {
            Body::Command(program) => {
                let run = self
                    .run(program, &env, params_json, limits)
                    .await
                    .map_err(|e| {
                        Failure::Retriable(Reason::new(format!("body could not start: {e}")))
                    })?;
                body_result(&run, task.timeout_seconds)?
            }
            Body::Rust(body) => {
                let ctx = TaskContext {
                    task_id: attempt.task_id.clone(),
                    execution_id: execution_id.to_owned(),
                    worker_id: self.worker_id.clone(),
                    workflow_id: attempt.workflow_instance_id.clone(),
                    retry_count: attempt.retry_count,
                };
                self.run_rust(Arc::clone(body), ctx, params).await?
            }
        };

        if let Some(schema) = &self.manifest.schemas.result {
            schema.validate("result", &result).map_err(|v| {
                Failure::Retriable(Reason::new(format!(
                    "result does not match the result schema: {v}"
                )))
            })?;
        }
        if let Some(post) = &self.post {
            let result_json = serde_json::to_vec(&result).expect("a Value always serializes");
            self.guardrail(
                "post",
                post,
                &env,
                result_json,
                guardrail_limits,
                Failure::Retriable,
            )
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
        env: &[(&str, &str)],
        stdin: Vec<u8>,
        limits: RunLimits,
        failure: fn(Reason) -> Failure,
    ) -> Result<(), Failure> {
        let run = self.run(program, env, stdin, limits).await.map_err(|e| {
            Failure::Retriable(Reason::new(format!(
                "{which} guardrail {} could not start: {e}",
                program.label
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

    /// Runs a Rust body on a blocking thread within the time limit. An overrun cannot be
    /// stopped from outside the thread: it is reported, and the executor is marked to exit
    /// after the completion so the supervisor replaces the process.
    async fn run_rust(
        &self,
        body: Arc<dyn Task>,
        ctx: TaskContext,
        params: Value,
    ) -> Result<Value, Failure> {
        let Value::Object(params) = params else {
            unreachable!("params were checked to be an object");
        };
        let work = tokio::task::spawn_blocking(move || body.run(&ctx, &params));
        let outcome = match self.time_limit() {
            None => work.await,
            Some(limit) => match tokio::time::timeout(limit, work).await {
                Ok(joined) => joined,
                Err(_) => {
                    self.poisoned
                        .store(true, std::sync::atomic::Ordering::SeqCst);
                    return Err(Failure::Retriable(Reason::new(format!(
                        "body timed out after {}s (task.timeout_seconds); the executor restarts to stop it",
                        self.manifest.task.timeout_seconds
                    ))));
                }
            },
        };
        match outcome {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(TaskError::Retriable(m))) => Err(Failure::Retriable(Reason::new(m))),
            Ok(Err(TaskError::Terminal(m))) => Err(Failure::Terminal(Reason::new(m))),
            Err(e) => {
                let message = e
                    .try_into_panic()
                    .ok()
                    .and_then(|p| {
                        p.downcast_ref::<&str>()
                            .map(|s| (*s).to_owned())
                            .or_else(|| p.downcast_ref::<String>().cloned())
                    })
                    .unwrap_or_else(|| "unknown panic".to_owned());
                Err(Failure::Retriable(Reason::new(format!(
                    "body panicked: {message}"
                ))))
            }
        }
    }

    /// True once a Rust body overran its time limit: the executor should exit after sending
    /// the completion.
    pub fn poisoned(&self) -> bool {
        self.poisoned.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn time_limit(&self) -> Option<Duration> {
        match self.manifest.task.timeout_seconds {
            0 => None,
            s => Some(Duration::from_secs(s)),
        }
    }

    async fn run(
        &self,
        program: &Program,
        env: &[(&str, &str)],
        stdin: Vec<u8>,
        limits: RunLimits,
    ) -> std::io::Result<Finished> {
        let mut spec = program.spec.clone();
        spec.env
            .extend(env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        command::run(&spec, stdin, limits).await
    }
}

#[derive(Debug)]
enum Failure {
    Retriable(Reason),
    Terminal(Reason),
}

/// The body's result document, or why there is none.
fn body_result(run: &Finished, timeout_seconds: u64) -> Result<Value, Failure> {
    let fail = |head: String| {
        Err(Failure::Retriable(Reason::with_tail(
            &head,
            &run.stderr_tail,
        )))
    };
    match run.ended {
        Ended::Exited(0) => {}
        Ended::TimedOut => {
            return fail(format!(
                "body timed out after {timeout_seconds}s (task.timeout_seconds) and was stopped"
            ));
        }
        ended => return fail(format!("body failed ({})", ended.describe())),
    }
    if run.stdout_overflow {
        return fail(format!(
            "body result is larger than {} MiB; Conductor cannot take it inline",
            MAX_OUTPUT_BYTES >> 20
        ));
    }
    let text = String::from_utf8_lossy(&run.stdout);
    if text.trim().is_empty() {
        return fail("body printed no result on stdout (expected one JSON document)".to_owned());
    }
    serde_json::from_str(&text)
        .or_else(|e| fail(format!("body result on stdout is not valid JSON: {e}")))
}
