//! The task manifest: one TOML file defining exactly one task (SPEC §2). Loading validates
//! every table and cross-field rule and reports all problems with the file and dotted key.

mod errors;
mod load;
mod model;
mod reader;
mod schemas;
mod source;

pub use errors::{ManifestError, Problem};
pub use load::{
    DEFAULT_MERGE_TIMEOUT_SECONDS, DEFAULT_RESPONSE_TIMEOUT_SECONDS, DEFAULT_RETRY_COUNT,
    DEFAULT_RETRY_DELAY_SECONDS,
};
pub use model::*;
pub use schemas::{Schema, SchemaError, SchemaViolations, Schemas, Violation};
pub use source::ManifestSource;

#[cfg(test)]
mod tests;
