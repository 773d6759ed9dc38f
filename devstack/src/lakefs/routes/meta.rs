//! Health, setup state, configuration and the current user: what clients call at start-up.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::super::error::LakefsError;
use super::super::store::USER_ID;

/// The version the dev server reports.
const VERSION: &str = "1.0.0-devstack";

pub(super) async fn healthcheck() -> StatusCode {
    StatusCode::NO_CONTENT
}

/// The dev server starts initialized, with its one key pair.
pub(super) async fn setup_state() -> Json<Value> {
    Json(json!({ "state": "initialized", "comm_prefs_missing": false }))
}

pub(super) async fn setup() -> Response {
    LakefsError::Conflict("lakeFS already initialized".to_owned()).into_response()
}

fn storage_config() -> Value {
    // What the real server reports for its `mem` blockstore; `pre_sign_support: false` makes
    // the `lakefs` package upload and read through the API.
    json!({
        "blockstore_type": "mem",
        "blockstore_namespace_example": "mem://example-bucket/",
        "blockstore_namespace_ValidityRegex": "^mem://",
        "default_namespace_prefix": "",
        "pre_sign_support": false,
        "pre_sign_support_ui": false,
        "import_support": false,
        "import_validity_regex": "^mem://",
        "pre_sign_multipart_upload": false,
        "blockstore_id": "",
    })
}

fn version_config() -> Value {
    json!({ "version": VERSION, "upgrade_recommended": false })
}

pub(super) async fn config() -> Json<Value> {
    Json(json!({
        "version_config": version_config(),
        "storage_config": storage_config(),
        "storage_config_list": [],
        "ui_config": {},
        "capabilities_config": {},
    }))
}

pub(super) async fn version() -> Json<Value> {
    Json(version_config())
}

pub(super) async fn storage() -> Json<Value> {
    Json(storage_config())
}

pub(super) async fn user() -> Json<Value> {
    Json(json!({ "user": { "id": USER_ID, "creation_date": 0, "friendly_name": USER_ID } }))
}
