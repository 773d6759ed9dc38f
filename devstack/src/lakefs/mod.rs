//! The lakeFS half of devstack: an in-memory server speaking the subset of the lakeFS REST API
//! (`/api/v1`) that perago's workspaces and the official Python clients use, with HTTP basic
//! auth, staged changes on branches, commits with metadata, diffs and three-way merges.
//!
//! Modules, one concept each: `store` (repositories, commits, branches), `refs` (ref resolution and views),
//! `merge` (commit, diff, merge base, three-way merge), `listing` (pagination and delimiters),
//! `model` (wire JSON), `multipart` (upload bodies), `auth` (basic auth), `error` (status codes
//! and bodies), `routes` (HTTP), `server` (builder and handle).

mod auth;
mod error;
mod listing;
mod merge;
mod model;
mod multipart;
mod refs;
mod routes;
mod server;
mod store;

pub use error::LakefsError;
pub use server::{
    Credentials, DEFAULT_ACCESS_KEY_ID, DEFAULT_SECRET_ACCESS_KEY, LakefsHandle, LakefsServer,
    LakefsServerBuilder,
};
