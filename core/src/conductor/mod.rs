//! The Conductor REST client and its errors.

mod client;
mod errors;

pub use client::{BaseUrlError, ConductorClient, MAX_LONG_POLL};
pub use errors::ConductorError;
