//! End-to-end tests that run the real perago binaries as separate processes.

mod auth;
mod bench;
mod broker;
mod chaos;
mod cli;
mod deploy;
mod harness;
mod ops;
mod runtime;
mod wire;
mod workspace;
