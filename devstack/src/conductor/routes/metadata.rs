//! `/api/metadata`: task definitions (create, update, get, list, delete) and workflow
//! definitions (register, bulk upsert, get, list, delete).

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use serde_json::json;

use super::{Params, Shared};
use crate::conductor::clock::now_ms;
use crate::conductor::error::{ApiError, parse_json};
use crate::conductor::model::{TaskDef, WorkflowDef};

pub(super) fn routes() -> Router<Shared> {
    Router::new()
        .route(
            "/api/metadata/taskdefs",
            get(list_task_defs)
                .post(create_task_defs)
                .put(update_task_def),
        )
        .route(
            "/api/metadata/taskdefs/{tasktype}",
            get(get_task_def).delete(delete_task_def),
        )
        .route(
            "/api/metadata/workflow",
            get(list_workflow_defs)
                .post(create_workflow_def)
                .put(upsert_workflow_defs),
        )
        .route("/api/metadata/workflow/{name}", get(get_workflow_def))
        .route(
            "/api/metadata/workflow/{name}/{version}",
            delete(delete_workflow_def),
        )
}

async fn create_task_defs(State(c): State<Shared>, body: Bytes) -> Result<(), ApiError> {
    let defs: Vec<TaskDef> = parse_json(&body)?;
    c.with(|s| s.create_task_defs(defs, now_ms()))
}

async fn update_task_def(State(c): State<Shared>, body: Bytes) -> Result<(), ApiError> {
    let def: TaskDef = parse_json(&body)?;
    c.with(|s| s.update_task_def(def, now_ms()))
}

async fn list_task_defs(State(c): State<Shared>) -> Response {
    c.with(|s| Json(s.task_defs.values().collect::<Vec<_>>()).into_response())
}

async fn get_task_def(
    State(c): State<Shared>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    c.with(|s| s.task_def(&name).map(|d| Json(d).into_response()))
}

async fn delete_task_def(State(c): State<Shared>, Path(name): Path<String>) {
    c.with(|s| s.task_defs.remove(&name));
}

async fn create_workflow_def(
    State(c): State<Shared>,
    params: Params,
    body: Bytes,
) -> Result<(), ApiError> {
    let def: WorkflowDef = parse_json(&body)?;
    let overwrite = params.flag("overwrite")?.unwrap_or(false);
    c.with(|s| s.register_workflow_def(def, overwrite, now_ms()))
}

/// `PUT /api/metadata/workflow`: upsert each definition and report per name, as `BulkResponse`.
async fn upsert_workflow_defs(State(c): State<Shared>, body: Bytes) -> Result<Response, ApiError> {
    let defs: Vec<WorkflowDef> = parse_json(&body)?;
    let mut ok = Vec::new();
    let mut failed = serde_json::Map::new();
    c.with(|s| {
        for def in defs {
            let name = def.name.clone();
            match s.register_workflow_def(def, true, now_ms()) {
                Ok(()) => ok.push(name),
                Err(e) => {
                    failed.insert(name, json!(crate::errors::chain(&e)));
                }
            }
        }
    });
    Ok(Json(json!({
        "bulkSuccessfulResults": ok,
        "bulkErrorResults": failed,
        "message": "",
    }))
    .into_response())
}

async fn get_workflow_def(
    State(c): State<Shared>,
    Path(name): Path<String>,
    params: Params,
) -> Result<Response, ApiError> {
    let version = params.parse::<i32>("version")?;
    c.with(|s| {
        s.workflow_def(&name, version)
            .map(|d| Json(d).into_response())
    })
}

async fn list_workflow_defs(State(c): State<Shared>) -> Response {
    c.with(|s| {
        let defs: Vec<_> = s
            .workflow_defs
            .values()
            .flat_map(|versions| versions.values())
            .collect();
        Json(defs).into_response()
    })
}

async fn delete_workflow_def(
    State(c): State<Shared>,
    Path((name, version)): Path<(String, i32)>,
) -> Result<(), ApiError> {
    c.with(|s| {
        s.workflow_def(&name, Some(version))?;
        if let Some(versions) = s.workflow_defs.get_mut(&name) {
            versions.remove(&version);
        }
        Ok(())
    })
}
