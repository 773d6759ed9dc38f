//! `/api/workflow`: start (by name with the input as body, or with a `StartWorkflowRequest`),
//! get an execution with its tasks, and terminate.

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Map, Value};

use super::{Params, Shared};
use crate::conductor::clock::now_ms;
use crate::conductor::engine::StartParams;
use crate::conductor::error::{ApiError, parse_json};
use crate::conductor::model::{StartWorkflowRequest, WorkflowStatus};

pub(super) fn routes() -> Router<Shared> {
    Router::new()
        .route("/api/workflow", post(start_with_request))
        .route(
            "/api/workflow/{id}",
            post(start_by_name).get(get_workflow).delete(terminate),
        )
}

/// `POST /api/workflow/{name}?version=&correlationId=&priority=`, body = input; text/plain id.
async fn start_by_name(
    State(c): State<Shared>,
    Path(name): Path<String>,
    params: Params,
    body: Bytes,
) -> Result<String, ApiError> {
    let input: Map<String, Value> = parse_json(&body)?;
    let version = params.parse::<i32>("version")?;
    let priority = params.parse::<i32>("priority")?.unwrap_or(0);
    let correlation_id = params.non_empty("correlationId").map(str::to_owned);
    c.with(|s| {
        let def = s.workflow_def(&name, version)?;
        s.payloads.check_workflow_input(&input)?;
        Ok(s.start_workflow(
            StartParams {
                def,
                input,
                correlation_id,
                priority,
                task_to_domain: Default::default(),
            },
            now_ms(),
        ))
    })
}

/// `POST /api/workflow` with a `StartWorkflowRequest`; text/plain id.
async fn start_with_request(State(c): State<Shared>, body: Bytes) -> Result<String, ApiError> {
    let request: StartWorkflowRequest = parse_json(&body)?;
    let name = request.name.filter(|n| !n.is_empty()).ok_or_else(|| {
        ApiError::validation([(
            "startWorkflow.startWorkflowRequest.name".to_owned(),
            "Workflow name cannot be null or empty".to_owned(),
        )])
    })?;
    if let Some(priority) = request.priority
        && !(0..=99).contains(&priority)
    {
        return Err(ApiError::validation([(
            "startWorkflow.startWorkflowRequest.priority".to_owned(),
            "priority: Priority cannot be less than 0 or greater than 99".to_owned(),
        )]));
    }
    let input = request.input.unwrap_or_default();
    c.with(|s| {
        let def = s.definition_for_start(&name, request.version, request.workflow_def)?;
        s.payloads.check_workflow_input(&input)?;
        Ok(s.start_workflow(
            StartParams {
                def,
                input,
                correlation_id: request.correlation_id,
                priority: request.priority.unwrap_or(0),
                task_to_domain: request.task_to_domain.unwrap_or_default(),
            },
            now_ms(),
        ))
    })
}

/// `GET /api/workflow/{id}?includeTasks=` (tasks included by default).
async fn get_workflow(
    State(c): State<Shared>,
    Path(id): Path<String>,
    params: Params,
) -> Result<Response, ApiError> {
    let include_tasks = params.flag("includeTasks")?.unwrap_or(true);
    c.with(|s| {
        let workflow = s.workflow(&id)?;
        let tasks = if include_tasks {
            s.workflow_tasks(workflow)
        } else {
            Vec::new()
        };
        Ok(Json(workflow.view(tasks)).into_response())
    })
}

/// `DELETE /api/workflow/{id}?reason=`: terminate a running workflow.
async fn terminate(
    State(c): State<Shared>,
    Path(id): Path<String>,
    params: Params,
) -> Result<(), ApiError> {
    let reason = params.non_empty("reason").map(str::to_owned);
    c.with(|s| {
        let running = !s.workflow(&id)?.status.is_terminal();
        if running {
            s.end_workflow(&id, WorkflowStatus::Terminated, reason, None, now_ms());
        }
        Ok(())
    })
}
