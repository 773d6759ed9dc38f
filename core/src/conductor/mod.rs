//! The Conductor REST client and its errors.

mod auth;
mod client;
mod errors;
mod payload;

pub use auth::{AUTH_KEY_VAR, AUTH_SECRET_VAR, Credentials, CredentialsError};
pub use client::{
    BaseUrlError, ClientConfigError, ConductorClient, JsonBody, MAX_LONG_POLL, MAX_TASK_ANSWER,
    Polled, TaskTypes, max_poll_answer,
};
pub use errors::ConductorError;
pub use payload::{PayloadError, fetch_task_input};
