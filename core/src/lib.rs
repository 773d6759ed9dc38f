//! perago's shared, wire-independent core: the task manifest, the attempt snapshot and fence,
//! input/output shapes, the runtime result, worker identity, execution mode and worker count,
//! durations and byte sizes, available memory (cgroup v2 aware), the environment variables,
//! and the Conductor TaskDef a manifest describes.
//!
//! It calls no libc function itself: the system layer is `perago-sys`, the one perago crate
//! it depends on. The broker, the executors and the supervisor all build on it.

#![forbid(unsafe_code)]

pub mod attempt;
pub mod backoff;
pub mod bootstrap;
pub mod capacity;
pub mod command;
pub mod conductor;
pub mod env;
pub mod files;
pub mod http;
pub mod identity;
pub mod json;
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
pub mod taskdef;
pub mod units;
pub mod url;
