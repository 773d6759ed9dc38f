//! perago's shared, wire-independent core: the task manifest, the attempt snapshot and fence,
//! input/output shapes, the runtime result, worker identity, execution mode and worker count,
//! durations and byte sizes, available memory (cgroup v2 aware), the environment variables,
//! the Conductor TaskDef a manifest describes, and the clients more than one process uses: the
//! Conductor client, the lakeFS client ([`lakefs`]: the executor's workspace, the supervisor's
//! GC and `dev`) and the broker socket's connector ([`socket`]).
//!
//! It calls no libc function itself: the system layer is `perago-sys`. Of the other perago
//! crates it depends only on `perago-sys` and `perago-proto` (the slot message limit the
//! socket's windows are sized for): the broker, the executors and the supervisor all build on
//! it.

#![forbid(unsafe_code)]

pub mod attempt;
pub mod backoff;
pub mod bootstrap;
pub mod capacity;
pub mod command;
pub mod conductor;
pub mod env;
#[cfg(test)]
mod error_texts;
pub mod errors;
pub mod files;
pub mod http;
pub mod identity;
pub mod json;
pub mod lakefs;
pub mod liveness;
pub mod logging;
pub mod manifest;
pub mod memory;
pub mod metrics_text;
pub mod mode;
pub mod owner;
pub mod recycle;
pub mod result;
pub mod rss;
pub mod secrets;
pub mod shape;
pub mod socket;
pub mod taskdef;
pub mod trace;
pub mod units;
pub mod url;
