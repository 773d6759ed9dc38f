//! End-to-end tests that run the real perago binaries as separate processes.

mod adaptive;
mod admission;
mod auth;
mod bad_input;
mod bench;
mod broker;
mod chaos;
mod cli;
mod deploy;
mod descendants;
mod harness;
mod hostile_servers;
mod hostile_tasks;
mod metrics;
mod multi_task;
mod once;
mod ops;
mod poison;
mod recycle;
mod runtime;
mod soft_limit;
mod systemd;
mod wire;
mod workspace;
