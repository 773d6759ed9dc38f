//! perago's system layer: the only crate that calls libc, and the only one allowed `unsafe`
//! (every other crate of the workspace forbids it). Split by concern:
//!
//! - [`spawn`]: starting processes. Bodies through [`Spawn`] (`clone(CLONE_VM | CLONE_VFORK)`,
//!   the steps before `exec` in the child, a pidfd to wait on); the runtime's own children
//!   (broker, executors) through a `tokio::process::Command` with the [`spawn::isolate`] and
//!   [`spawn::inherit_fd`] steps before `exec`.
//! - [`fd`]: descriptor flags (close-on-exec), descriptors handed over by number, pipe sizes and
//!   states; [`fd::dir`] walks a folder tree from held descriptors (`openat`, `O_NOFOLLOW`).
//! - [`signal`]: signals to a process or a process group, and their names.
//! - [`socket`]: a Unix stream socket registered with tokio for reading only, until a write
//!   waits (a peer's read does not wake the runtime).
//! - [`fatal`]: a hook run once when a fatal signal (an abort, a crash) is about to end the
//!   process.
//! - [`reaper`]: the child subreaper, the children perago waits for itself ([`Managed`]), the
//!   clean-up of what bodies leave behind ([`reaper::kill_adopted`]), and pidfds
//!   ([`reaper::pidfd`]).
//! - [`proc`]: what `/proc` says about a process and its children.
//! - [`user`]: the uid and gid bodies run as.
//! - [`guard`]: the thread-mode body guard program.
//! - [`rlimit`]: the descriptor limit.
//! - [`cpu`]: a process's CPU time, to the nanosecond (the benchmark's figures).
//! - [`memory`]: malloc's tunables and whether the process is dumpable.
//! - [`cgroup`]: the memory cgroups bodies run in (`body.memory_limit`), v1 and v2.
//!
//! Every child perago starts (broker, executors, bodies, guardrails) leads its own process
//! group, so a terminal's Ctrl-C or a service manager's SIGTERM reaches only the supervisor, and
//! a whole child tree can be signalled at once. Nothing a body starts outlives it: the executor
//! and the supervisor are child subreapers, so whatever a body detaches (double fork, `setsid`)
//! is re-parented to them instead of init, and [`reaper::kill_adopted`] SIGKILLs and reaps every
//! child that is not [`Managed`]. In thread mode bodies run under [`guard::body_guard_main`],
//! which does the same when the supervisor dies.
//!
//! Pitfall: `PR_SET_PDEATHSIG` fires when the *thread* that spawned the child exits, not the
//! process. Children must therefore be spawned from a long-lived thread (a current-thread
//! runtime's main thread, or a runtime worker), never from `spawn_blocking`, whose idle threads
//! are reaped after a few seconds and would take the child with them.
//!
//! The `SAFETY` notes state the semantic hazards as well as memory safety: a pid read from
//! `/proc` may name another process by the time it is signalled (see [`reaper`] and
//! [`signal`]), and what runs between `clone` and `exec` must be async-signal-safe (see
//! [`spawn`]).

pub mod cgroup;
pub mod cpu;
pub mod fatal;
pub mod fd;
pub mod guard;
pub mod memory;
pub mod proc;
pub mod reaper;
pub mod rlimit;
pub mod signal;
pub mod socket;
pub mod spawn;
pub mod user;

pub use reaper::Managed;
pub use spawn::{Child, Environment, Spawn};
