//! The Conductor JSON models the dev server reads and writes, named as on the wire.

mod defs;
mod requests;
mod task;
mod workflow;

pub use defs::{
    RetryLogic, TaskDef, TimeoutPolicy, WorkflowDef, WorkflowTask, WorkflowTimeoutPolicy,
};
pub use requests::{StartWorkflowRequest, TaskResult, TaskResultStatus};
pub use task::{PollData, Task, TaskExecLog, TaskStatus};
pub use workflow::{Workflow, WorkflowStatus, WorkflowView};
