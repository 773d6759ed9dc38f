//! The process runtime of `start`: the workspace root and its lock, the child processes and
//! the machine that decides and the actor that supervises them.

pub(crate) mod actor;
pub(crate) mod body;
pub(crate) mod child_env;
pub(crate) mod children;
pub(crate) mod gc;
pub(crate) mod machine;
pub(crate) mod metrics;
pub(crate) mod notify;
pub(crate) mod registry;
pub(crate) mod root;
pub(crate) mod share_task;
pub(crate) mod supervise;
