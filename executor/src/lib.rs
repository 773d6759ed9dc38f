//! The executor: attaches to its slot on the broker socket and runs each assignment — input
//! shape, params schema, pre guardrail, body, result schema, post guardrail — and sends the
//! completion back. Rust task authors implement a `Task` trait here and ship their own binary.
//!
//! Only the crate exists so far; the runtime lands with issue #4.
