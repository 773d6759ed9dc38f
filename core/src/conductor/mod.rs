//! The Conductor REST client and its errors.

mod auth;
mod client;
mod domain;
mod errors;
mod metadata;
mod payload;
mod polled;
mod tasks;

pub use auth::{AUTH_KEY_VAR, AUTH_SECRET_VAR, Credentials, CredentialsError};
pub use client::{
    BaseUrlError, ClientConfigError, ConductorClient, JsonBody, MAX_LONG_POLL, MAX_TASK_ANSWER,
    max_poll_answer,
};
pub use domain::{Domain, DomainError, MAX_DOMAIN_LEN, queue_name};
pub use errors::ConductorError;
pub use payload::{PayloadError, fetch_task_input};
pub use polled::{Polled, TaskTypes};
pub use tasks::{DepthError, DepthRoutes};
