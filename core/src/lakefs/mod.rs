//! A lakeFS REST client for exactly what the workspace runtime needs: pin a branch, list and
//! read objects at a commit, cut a staging branch, upload, delete, commit, merge, clean up.
//! Every request has a timeout; idempotent reads are retried on transport errors, 5xx and 429.
//! The secret key never appears in `Debug` output or in error messages.
//!
//! Nothing a server answers is taken on its word: every answer read into memory has a cap
//! ([`MAX_JSON_ANSWER`], error bodies [`MAX_ERROR_ANSWER`]); a listing's keys must come in
//! order after `after`, its `next_offset` must advance (lakeFS's is the last key returned) and
//! it holds at most the entries the caller allows; a download receives exactly the size the
//! listing gave; commit ids must be commit ids (64 lowercase hex characters).
//!
//! Modules: [`config`] (settings), [`errors`], [`limits`] (every cap), [`models`] (what the API
//! answers), the transport in `client`, and the calls by area: `refs` (branches, commits, merge,
//! log, tags, settings), `objects` (listing, download, upload, delete, diff) and `pages` (the one
//! pagination check every listing goes through).

mod client;
mod config;
mod errors;
mod limits;
mod models;
mod objects;
mod pages;
mod refs;

pub use client::LakefsClient;
pub use config::{LakefsConfig, LakefsConfigError};
pub use errors::LakefsError;
pub use limits::*;
pub use models::{Commit, ObjectStats, Page, Pagination, is_branch_id, is_commit_id};
pub use objects::CheckedUpload;
pub use pages::{LogPage, check_log_page};
