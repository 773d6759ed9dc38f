//! External payload storage, as Conductor does it (core/…/utils/ExternalPayloadStorageUtils.java):
//! a task input above `taskInputPayloadSizeThreshold` (3072 KB) is stored here and the task
//! carries `externalInputPayloadStoragePath` and `inputData: {}`; above
//! `maxTaskInputPayloadSizeThreshold` (10240 KB) the task is FAILED_WITH_TERMINAL_ERROR with
//! the server's message, and so is a task whose result output is above
//! `maxTaskOutputPayloadSizeThreshold`; a workflow input above
//! `maxWorkflowInputPayloadSizeThreshold` refuses the start (500, the server's
//! `TerminateWorkflowException`).
//!
//! `GET /api/tasks/externalstoragelocation` answers where a payload is: with the default
//! storage, a pre-signed URL on the blob store, a loopback HTTP server of its own (another
//! origin than the API, as S3 or Azure is). The blob store, like a pre-signed S3 URL, refuses a
//! request with a wrong signature and one that brings another credential (`Authorization` or
//! Conductor's `X-Authorization`). With [`PayloadStorage::Dummy`] the answer has a `path` and
//! no `uri`, as the server's `DummyPayloadStorage` (the default without a storage module).

use std::collections::HashMap;
use std::sync::Mutex;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use md5::{Digest, Md5};
use serde_json::{Map, Value};
use std::sync::{Arc, OnceLock};

use super::error::ApiError;
use super::routes::Params;

/// Conductor's payload thresholds, in KB (1024 bytes), as `conductor.app.*` sets them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayloadThresholds {
    /// `taskInputPayloadSizeThreshold`: above it a task input is stored externally.
    pub task_input_kb: u64,
    /// `maxTaskInputPayloadSizeThreshold`: above it the task fails for good.
    pub max_task_input_kb: u64,
    /// `taskOutputPayloadSizeThreshold` (the server's storage is invisible to workers).
    pub task_output_kb: u64,
    /// `maxTaskOutputPayloadSizeThreshold`: above it the task fails for good.
    pub max_task_output_kb: u64,
    /// `maxWorkflowInputPayloadSizeThreshold`: above it the start is refused.
    pub max_workflow_input_kb: u64,
}

impl Default for PayloadThresholds {
    /// The server's defaults (ConductorProperties).
    fn default() -> Self {
        Self {
            task_input_kb: 3072,
            max_task_input_kb: 10240,
            task_output_kb: 3072,
            max_task_output_kb: 10240,
            max_workflow_input_kb: 10240,
        }
    }
}

/// Which storage the server is configured with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum PayloadStorage {
    /// A pre-signed URL on devstack's blob store (as the S3 or Azure storage).
    #[default]
    Blob,
    /// `DummyPayloadStorage`: payloads are stored, but a location has no `uri`.
    Dummy,
}

/// The stored payloads and where the blob store listens.
#[derive(Debug)]
pub(crate) struct Payloads {
    pub(crate) thresholds: PayloadThresholds,
    storage: PayloadStorage,
    blobs: Mutex<HashMap<String, Bytes>>,
    /// `http://127.0.0.1:PORT`, set once the blob store is bound.
    blob_origin: OnceLock<String>,
    secret: String,
}

/// JSON size as the server measures it (Jackson, compact).
pub(crate) fn json_size(map: &Map<String, Value>) -> u64 {
    serde_json::to_vec(map).map_or(0, |v| v.len() as u64)
}

impl Payloads {
    pub(crate) fn new(thresholds: PayloadThresholds, storage: PayloadStorage) -> Self {
        Self {
            thresholds,
            storage,
            blobs: Mutex::new(HashMap::new()),
            blob_origin: OnceLock::new(),
            secret: uuid::Uuid::new_v4().simple().to_string(),
        }
    }

    pub(crate) fn set_origin(&self, origin: String) {
        let _ = self.blob_origin.set(origin);
    }

    /// Stores `bytes` under a new key and answers the key (the task's storage path).
    pub(crate) fn store(&self, bytes: Vec<u8>) -> String {
        let key = format!("{}.json", uuid::Uuid::new_v4());
        self.blobs
            .lock()
            .expect("not poisoned")
            .insert(key.clone(), Bytes::from(bytes));
        key
    }

    fn signature(&self, operation: &str, key: &str) -> String {
        let mut md5 = Md5::new();
        md5.update(format!("{}:{operation}:{key}", self.secret));
        md5.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// verifyAndUpload(WORKFLOW_INPUT) as a workflow is created: above the hard limit the
    /// server throws `TerminateWorkflowException`, unmapped, so the start answers 500 and no
    /// workflow exists. (Between `workflowInputPayloadSizeThreshold`, 5120 KB, and the limit it
    /// stores the input externally, which workers never see: devstack keeps it inline.)
    pub(crate) fn check_workflow_input(&self, input: &Map<String, Value>) -> Result<(), ApiError> {
        let size = json_size(input);
        let max = self.thresholds.max_workflow_input_kb.saturating_mul(1024);
        if size > max {
            let id = uuid::Uuid::new_v4();
            return Err(ApiError::Internal(workflow_too_large(
                size,
                &id.to_string(),
                max,
            )));
        }
        Ok(())
    }

    /// `GET /api/tasks/externalstoragelocation` (ExecutionService.getExternalStorageLocation).
    pub(crate) fn location(&self, params: &Params) -> Result<Value, ApiError> {
        let path = params.required("path")?;
        let operation = params.required("operation")?;
        let payload_type = params.required("payloadType")?;
        let op = operation.to_ascii_uppercase();
        let known_type = matches!(
            payload_type.to_ascii_uppercase().as_str(),
            "WORKFLOW_INPUT" | "WORKFLOW_OUTPUT" | "TASK_INPUT" | "TASK_OUTPUT"
        );
        if !matches!(op.as_str(), "READ" | "WRITE") || !known_type {
            return Err(ApiError::BadRequest(format!(
                "Invalid input - Operation: {operation}, PayloadType: {payload_type}"
            )));
        }
        match self.storage {
            // DummyPayloadStorage.getLocation: `path + UUID + ".json"`, no uri, whatever the
            // operation.
            PayloadStorage::Dummy => Ok(serde_json::json!({
                "path": format!("{path}{}.json", uuid::Uuid::new_v4()),
            })),
            PayloadStorage::Blob => {
                let key = if path.is_empty() {
                    format!("{}.json", uuid::Uuid::new_v4())
                } else {
                    path.to_owned()
                };
                let origin = self.blob_origin.get().cloned().unwrap_or_default();
                let signature = self.signature(&op, &key);
                Ok(serde_json::json!({
                    "uri": format!("{origin}/payloads/{key}?X-Amz-Signature={signature}"),
                    "path": key,
                }))
            }
        }
    }
}

/// The message of a task failed for a payload above its limit (failTask).
pub(crate) fn task_too_large(size: u64, task_id: &str, workflow_id: &str, limit: u64) -> String {
    format!(
        "The payload size: {size} of task: {task_id} in workflow: {workflow_id}  is greater than the permissible limit: {limit} bytes"
    )
}

/// The message of a workflow refused for its input (failWorkflow).
pub(crate) fn workflow_too_large(size: u64, workflow_id: &str, limit: u64) -> String {
    format!(
        "The payload size: {size} of workflow: {workflow_id} is greater than the permissible limit: {limit} bytes"
    )
}

/// The blob store's routes: `GET` and `PUT /payloads/{key}?X-Amz-Signature=…`.
pub(crate) fn blob_router(payloads: Arc<Payloads>) -> Router {
    Router::new()
        .route("/payloads/{key}", get(read_blob).put(write_blob))
        .layer(axum::extract::DefaultBodyLimit::max(32 << 20))
        .with_state(payloads)
}

fn refuse(status: StatusCode, code: &str, message: &str) -> Response {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>{message}</Message></Error>"
    );
    (status, [("content-type", "application/xml")], body).into_response()
}

/// Checks a request as S3 checks a pre-signed one: the signature for this operation and key,
/// and no second credential.
fn check(
    payloads: &Payloads,
    operation: &str,
    key: &str,
    query: &Params,
    headers: &HeaderMap,
) -> Option<Response> {
    for header in ["authorization", super::AUTH_HEADER] {
        if headers.contains_key(header) {
            tracing::warn!(header, "blob store: a request brought a credential");
            return Some(refuse(
                StatusCode::BAD_REQUEST,
                "InvalidArgument",
                &format!(
                    "Only one auth mechanism allowed; the pre-signed URL is one, and the request also sent {header}"
                ),
            ));
        }
    }
    let good = query
        .get("X-Amz-Signature")
        .is_some_and(|s| s == payloads.signature(operation, key));
    (!good).then(|| {
        refuse(
            StatusCode::FORBIDDEN,
            "SignatureDoesNotMatch",
            "The request signature we calculated does not match the signature you provided.",
        )
    })
}

async fn read_blob(
    State(payloads): State<Arc<Payloads>>,
    Path(key): Path<String>,
    query: Params,
    headers: HeaderMap,
) -> Response {
    if let Some(refused) = check(&payloads, "READ", &key, &query, &headers) {
        return refused;
    }
    let blob = payloads
        .blobs
        .lock()
        .expect("not poisoned")
        .get(&key)
        .cloned();
    match blob {
        Some(bytes) => (
            StatusCode::OK,
            [("content-type", "application/json")],
            bytes,
        )
            .into_response(),
        None => refuse(
            StatusCode::NOT_FOUND,
            "NoSuchKey",
            "The specified key does not exist.",
        ),
    }
}

async fn write_blob(
    State(payloads): State<Arc<Payloads>>,
    Path(key): Path<String>,
    query: Params,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(refused) = check(&payloads, "WRITE", &key, &query, &headers) {
        return refused;
    }
    payloads
        .blobs
        .lock()
        .expect("not poisoned")
        .insert(key, body);
    StatusCode::OK.into_response()
}
