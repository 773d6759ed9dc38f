//! The executor: attaches to its slot on the broker socket and runs each assignment — input
//! shape, params schema, pre guardrail, body, result schema, post guardrail — and sends the
//! completion back.
//!
//! What exists so far: [`command`] (running a body or guardrail in its own process group with
//! a time limit) and [`assignment`] (one assignment of a workspace-free `exec` body, start to
//! result). The slot client, the `Task` trait, the `jsonl` protocol and workspaces come next.

pub mod assignment;
pub mod cli;
pub mod command;
mod jsonl;
pub mod slot;
pub mod task;
pub mod wire;
pub mod workspace;
