//! In-memory development servers that speak the Conductor OSS REST API (and, later, the lakeFS
//! REST API) well enough for the official clients, with fault injection for tests. This crate
//! stands apart from the rest of perago: it knows Conductor and lakeFS, not perago.
//!
//! See `devstack/README.md` for the endpoints, the time scale and the fault-injection API.

pub mod cli;
pub mod conductor;
mod errors;
pub mod faults;
mod http;

pub use cli::run;
pub use errors::DevstackError;
