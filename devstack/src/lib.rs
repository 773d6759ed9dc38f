//! In-memory development servers that speak the Conductor OSS REST API and the lakeFS REST API
//! well enough for the official clients, with fault injection for tests. This crate
//! stands apart from the rest of perago: it knows Conductor and lakeFS, not perago.
//!
//! The README below is the crate documentation; its examples are compiled as doctests.
#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

pub mod cli;
pub mod conductor;
mod errors;
pub mod faults;
mod http;
pub mod lakefs;

pub use cli::run;
pub use errors::DevstackError;
