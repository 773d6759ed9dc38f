//! The `Task` trait: a task body written in Rust, shipped as its own executor binary.
//!
//! ```no_run
//! use perago_executor::task::{Task, TaskContext, TaskError};
//! use serde_json::{Map, Value, json};
//!
//! struct Sum;
//!
//! impl Task for Sum {
//!     fn run(&self, _ctx: &TaskContext, params: &Map<String, Value>) -> Result<Value, TaskError> {
//!         let a = params.get("a").and_then(Value::as_i64).ok_or_else(|| TaskError::terminal("params.a must be an integer"))?;
//!         let b = params.get("b").and_then(Value::as_i64).unwrap_or(0);
//!         Ok(json!({"sum": a + b}))
//!     }
//! }
//!
//! fn main() {
//!     std::process::exit(perago_executor::task::main(Sum));
//! }
//! ```
//!
//! Point the manifest's `body.executor` at the built binary. The supervisor starts it in place
//! of `perago-executor`; everything around the body (input shape, schemas, guardrails, the slot
//! protocol, logs) is the same. `run` is called on the executor's body thread, one assignment at
//! a time (the thread is in the runtime's context: `tokio::runtime::Handle::current()` works).
//! A body that overruns `task.timeout_seconds` is reported as FAILED, and the executor then
//! exits so that the supervisor replaces the process (a thread cannot be stopped safely).

use serde_json::{Map, Value};
use std::sync::Arc;

/// What a Rust body knows about its assignment.
#[derive(Debug, Clone)]
pub struct TaskContext {
    /// The Conductor task id.
    pub task_id: String,
    /// This execution's id.
    pub execution_id: String,
    /// This executor's worker id.
    pub worker_id: String,
    /// The workflow instance id.
    pub workflow_id: String,
    /// The attempt's retry count (0 for the first attempt).
    pub retry_count: u32,
    /// A workspace task's working directory (its files, as `PERAGO_WORKSPACE_DIR` tells a
    /// command body); `None` for a workspace-free task.
    pub workspace_dir: Option<std::path::PathBuf>,
    /// While the runtime exports traces (`OTEL_EXPORTER_OTLP_ENDPOINT`): the W3C
    /// `traceparent` of the attempt's `body` span, for the body's own spans to be children of
    /// (an OpenTelemetry propagator takes it as the `traceparent` header). `None` otherwise.
    pub traceparent: Option<String>,
    /// The trace's W3C `tracestate`, when it has one.
    pub tracestate: Option<String>,
}

/// A body failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskError {
    /// FAILED: Conductor may retry.
    Retriable(String),
    /// FAILED_WITH_TERMINAL_ERROR: never retried.
    Terminal(String),
}

impl TaskError {
    /// A failure Conductor may retry.
    pub fn retriable(message: impl Into<String>) -> Self {
        Self::Retriable(message.into())
    }

    /// A failure that must not be retried.
    pub fn terminal(message: impl Into<String>) -> Self {
        Self::Terminal(message.into())
    }
}

/// A task body written in Rust.
pub trait Task: Send + Sync + 'static {
    /// Runs one assignment: the validated `params` in, the result document out.
    fn run(&self, ctx: &TaskContext, params: &Map<String, Value>) -> Result<Value, TaskError>;
}

/// The entry point of a Rust task binary: the same start-up as `perago-executor`, with
/// `task` as the body. Returns the process exit code.
pub fn main(task: impl Task) -> i32 {
    crate::cli::main_with(Some(Arc::new(task)))
}
