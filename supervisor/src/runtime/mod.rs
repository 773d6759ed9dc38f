//! The process runtime of `start`: the workspace root and its lock, the child processes and
//! the dispatcher loop that supervises them.

pub(crate) mod children;
pub(crate) mod gc;
pub(crate) mod metrics;
pub(crate) mod notify;
pub(crate) mod registry;
pub(crate) mod root;
pub(crate) mod supervise;
