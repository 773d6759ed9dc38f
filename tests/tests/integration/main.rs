//! End-to-end tests that run the real perago binaries as separate processes.

mod cli;
mod wire;
