//! End-to-end tests that run the real perago binaries as separate processes.

mod auth;
mod bench;
mod broker;
mod cli;
mod harness;
mod runtime;
mod wire;
mod workspace;
