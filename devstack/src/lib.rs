//! In-memory development servers that speak the Conductor OSS REST API (and, later, the lakeFS
//! REST API) well enough for the official clients. This crate stands apart from the rest of
//! perago: it knows Conductor and lakeFS, not perago.
//!
//! Nothing is implemented yet; see issue #3.
