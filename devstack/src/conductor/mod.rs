//! The Conductor half of devstack: an in-memory server speaking the Conductor OSS REST API
//! (v3.32 semantics) well enough for the official SDKs.
//!
//! Modules, one concept each: `model` (wire JSON), `store` (the state and its lock), `engine`
//! (workflow decider and retries), `worker_ops` (poll and update), `sweeper` (timeouts),
//! `queue` (delayed queues with long-poll wake-ups), `domains` (`taskToDomain` routing), `expr` (`${…}` inputs), `routes` (HTTP),
//! `server` (builder and handle), `auth` (optional Orkes-style tokens), `fill` (when a batch
//! poll answers: the queue backend's semantics).

mod auth;
mod clock;
mod domains;
mod engine;
mod error;
mod expr;
mod fill;
pub mod model;
mod payloads;
mod queue;
mod retry;
mod routes;
mod server;
mod store;
mod sweeper;
mod worker_ops;

pub use auth::{AUTH_HEADER, DEFAULT_TOKEN_TTL};
pub use clock::TimeScale;
pub(crate) use error::INSTANCE;
pub use error::{ErrorResponse, ValidationError};
pub use fill::QueueSemantics;
pub use payloads::{PayloadStorage, PayloadThresholds};
pub use server::{ConductorHandle, ConductorServer, ConductorServerBuilder};
