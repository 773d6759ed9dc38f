//! The executor: attaches to its slot on the broker socket and runs each assignment — input
//! shape, params schema, pre guardrail, body, result schema, post guardrail — and sends the
//! completion back.
//!
//! Modules: [`slot`] (the slot client), [`assignment`] (one assignment, start to result),
//! [`command`] (bodies and guardrails in their own process group with a time limit), the
//! `jsonl` protocol, `body_thread` (the thread Rust bodies run on), [`recycle`] (leaving after
//! a number of assignments or above a memory size), [`task`] (the `Task` trait for Rust task
//! binaries), [`workspace`] (the lakeFS workspace flow) and [`wire`] (slot-protocol
//! conversions).

#![forbid(unsafe_code)]

pub mod assignment;
mod body_thread;
pub mod cli;
pub mod command;
#[cfg(test)]
mod error_texts;
mod jsonl;
pub mod recycle;
pub mod slot;
pub mod spans;
pub mod task;
pub mod wire;
pub mod workspace;
