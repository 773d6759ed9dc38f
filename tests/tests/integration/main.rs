//! End-to-end tests that run the real perago binaries as separate processes.

#![forbid(unsafe_code)]

mod adaptive;
mod admission;
mod auth;
mod bad_input;
mod bench;
mod broker;
mod broker_watch;
mod chaos;
mod cli;
mod deploy;
mod descendants;
mod domains;
mod harness;
mod hostile_conductor;
mod hostile_servers;
mod hostile_tasks;
mod journal;
mod jsonl_faults;
mod lakefs_refs;
mod live;
mod log_root;
mod metrics;
mod multi_task;
mod once;
mod ops;
mod pause;
mod poison;
mod polls;
mod publish_once;
mod ready;
mod recycle;
mod roll;
mod runtime;
mod sdk_settings;
mod secrets_channel;
mod soft_limit;
mod stall;
mod status_inputs;
mod systemd;
mod wire;
mod workspace;
mod workspace_checksums;
