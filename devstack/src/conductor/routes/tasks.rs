//! `/api/tasks`: poll, batch (long) poll, update, update-v2, get task, logs and queue sizes.
//!
//! Empty answers follow the real server exactly: single poll → 204, batch poll → `200 []`,
//! update-v2 without a next task → 204, logs of a task without logs → 204.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio::time::Instant;

use super::{Params, Shared};
use crate::conductor::clock::{ms_duration, now_ms};
use crate::conductor::error::{ApiError, parse_json};
use crate::conductor::fill::{QueueSemantics, poll_fill};
use crate::conductor::model::{Task, TaskResult};
use crate::conductor::queue::queue_name;
use crate::conductor::store::Conductor;

/// The wait of a single poll and of update-v2's follow-up poll (`getLastPollTask`).
const SHORT_POLL: Duration = Duration::from_millis(100);
/// Default and maximum `timeout` of a batch poll, in ms.
const DEFAULT_POLL_TIMEOUT_MS: u64 = 100;
const MAX_POLL_TIMEOUT_MS: u64 = 5000;

pub(super) fn routes() -> Router<Shared> {
    Router::new()
        .route("/api/tasks", post(update_v1))
        .route("/api/tasks/update-v2", post(update_v2))
        .route("/api/tasks/poll/{tasktype}", get(poll_one))
        .route("/api/tasks/poll/batch/{tasktype}", get(poll_batch))
        .route("/api/tasks/{task_id}", get(get_task))
        .route("/api/tasks/{task_id}/log", get(get_logs).post(add_log))
        .route(
            "/api/tasks/externalstoragelocation",
            get(external_storage_location),
        )
        .route(
            "/api/tasks/external-storage-location",
            get(external_storage_location),
        )
        .route("/api/tasks/queue/size", get(queue_size))
        .route("/api/tasks/queue/sizes", get(queue_sizes))
        .route("/api/tasks/queue/all", get(queue_all))
        .route("/api/tasks/queue/polldata", get(poll_data))
        .route("/api/tasks/queue/polldata/all", get(poll_data_all))
}

/// Polls `count` tasks. On the SQL queues' semantics (the default) see [`poll_fill`]; else
/// it waits up to `timeout` for the first one. Waiters register on the
/// queue's `Notify` before looking at the queue, so a push in between is never missed; a
/// delayed message wakes them at its due time.
pub(crate) async fn poll_wait(
    conductor: &Conductor,
    task_type: &str,
    domain: Option<&str>,
    worker_id: Option<&str>,
    count: usize,
    timeout: Duration,
) -> Vec<Task> {
    if conductor.queue_semantics == QueueSemantics::FillOrTimeout {
        return poll_fill(conductor, task_type, domain, worker_id, count, timeout).await;
    }
    let queue = queue_name(task_type, domain);
    let notify = conductor.with(|s| s.queues.notifier(&queue));
    let deadline = Instant::now() + timeout;
    let mut waiting = None;
    loop {
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let now = now_ms();
        let (tasks, next_due) = conductor.with(|s| {
            let tasks = s.poll(task_type, domain, worker_id, count, now);
            (tasks, s.queues.next_due(&queue))
        });
        if !tasks.is_empty() || Instant::now() >= deadline {
            return tasks;
        }
        // Counted from the first empty look until the poll answers or its client goes away.
        waiting.get_or_insert_with(|| conductor.poll_waits());
        let wake = next_due.map_or(deadline, |due| {
            deadline.min(Instant::now() + ms_duration(due.saturating_sub(now_ms())))
        });
        tokio::select! {
            () = &mut notified => {}
            () = tokio::time::sleep_until(wake) => {}
        }
    }
}

async fn poll_one(
    State(c): State<Shared>,
    Path(task_type): Path<String>,
    params: Params,
) -> Response {
    let domain = params.non_empty("domain");
    let worker = params.get("workerid");
    let mut tasks = poll_wait(&c, &task_type, domain, worker, 1, SHORT_POLL).await;
    match tasks.pop() {
        Some(task) => Json(task).into_response(),
        None => StatusCode::NO_CONTENT.into_response(),
    }
}

async fn poll_batch(
    State(c): State<Shared>,
    Path(task_type): Path<String>,
    params: Params,
) -> Result<Response, ApiError> {
    let count = params.parse::<i64>("count")?.unwrap_or(1).max(1);
    let timeout = params
        .parse::<i64>("timeout")?
        .map_or(DEFAULT_POLL_TIMEOUT_MS, |t| u64::try_from(t).unwrap_or(0));
    if timeout > MAX_POLL_TIMEOUT_MS {
        return Err(ApiError::BadRequest(
            "Long Poll Timeout value cannot be more than 5 seconds".to_owned(),
        ));
    }
    let count = usize::try_from(count).unwrap_or(usize::MAX);
    let tasks = poll_wait(
        &c,
        &task_type,
        params.non_empty("domain"),
        params.get("workerid"),
        count,
        Duration::from_millis(timeout),
    )
    .await;
    Ok(Json(tasks).into_response())
}

async fn update_v1(State(c): State<Shared>, body: Bytes) -> Result<String, ApiError> {
    let result: TaskResult = parse_json(&body)?;
    let outcome = c.with(|s| s.update_task(result, now_ms()))?;
    Ok(outcome.task_id)
}

/// v3.32 semantics: poll for the next task only when the update left the task terminal.
async fn update_v2(State(c): State<Shared>, body: Bytes) -> Result<Response, ApiError> {
    let result: TaskResult = parse_json(&body)?;
    let outcome = c.with(|s| s.update_task(result, now_ms()))?;
    let Some(target) = outcome.poll_next else {
        return Ok(StatusCode::NO_CONTENT.into_response());
    };
    let mut next = poll_wait(
        &c,
        &target.task_type,
        target.domain.as_deref(),
        target.worker_id.as_deref(),
        1,
        SHORT_POLL,
    )
    .await;
    Ok(match next.pop() {
        Some(task) => Json(task).into_response(),
        None => StatusCode::NO_CONTENT.into_response(),
    })
}

async fn get_task(
    State(c): State<Shared>,
    Path(task_id): Path<String>,
) -> Result<Response, ApiError> {
    c.with(|s| match s.tasks.get(&task_id) {
        Some(task) => Ok(Json(task).into_response()),
        None => Err(ApiError::NotFound(format!(
            "Task not found for taskId: {task_id}"
        ))),
    })
}

async fn add_log(State(c): State<Shared>, Path(task_id): Path<String>, body: Bytes) {
    let log = String::from_utf8_lossy(&body).into_owned();
    c.with(|s| s.add_log(&task_id, log, now_ms()));
}

async fn get_logs(State(c): State<Shared>, Path(task_id): Path<String>) -> Response {
    c.with(|s| match s.logs.get(&task_id) {
        Some(logs) if !logs.is_empty() => Json(logs).into_response(),
        _ => StatusCode::NO_CONTENT.into_response(),
    })
}

async fn queue_size(State(c): State<Shared>, params: Params) -> Result<Response, ApiError> {
    let task_type = params.required("taskType")?;
    let queue = queue_name(task_type, params.non_empty("domain"));
    Ok(c.with(|s| Json(s.queues.size(&queue)).into_response()))
}

async fn queue_sizes(State(c): State<Shared>, params: Params) -> Result<Response, ApiError> {
    let types = spring_list(&params.all("taskType"));
    if types.is_empty() {
        return Err(ApiError::Internal("taskType is required".to_owned()));
    }
    let sizes: BTreeMap<&str, usize> =
        c.with(|s| types.iter().map(|t| (*t, s.queues.size(t))).collect());
    Ok(Json(sizes).into_response())
}

/// The list Spring binds a `List<String>` request parameter to: a parameter given once is one
/// string, which its `StringToCollectionConverter` splits at every comma and trims
/// (`StringUtils.commaDelimitedListToStringArray`: empty pieces kept, an empty string gives no
/// element); a parameter given several times is taken value by value, neither split nor
/// trimmed. So `taskType=a,b` asks for the queues `a` and `b`, and only
/// `taskType=a,b&taskType=a,b` for the queue `a,b`.
fn spring_list<'a>(values: &[&'a str]) -> Vec<&'a str> {
    match values {
        [] | [""] => Vec::new(),
        [one] => one.split(',').map(str::trim).collect(),
        several => several.to_vec(),
    }
}

async fn queue_all(State(c): State<Shared>) -> Response {
    c.with(|s| Json(s.queues.sizes()).into_response())
}

async fn poll_data(State(c): State<Shared>, params: Params) -> Result<Response, ApiError> {
    let task_type = params.required("taskType")?.to_owned();
    Ok(c.with(|s| {
        let data: Vec<_> = s
            .poll_data
            .values()
            .filter(|p| {
                p.queue_name == task_type || p.queue_name.ends_with(&format!(":{task_type}"))
            })
            .collect();
        Json(data).into_response()
    }))
}

async fn poll_data_all(State(c): State<Shared>) -> Response {
    c.with(|s| Json(s.poll_data.values().collect::<Vec<_>>()).into_response())
}

/// `GET /api/tasks/externalstoragelocation?path=&operation=&payloadType=` → an
/// `ExternalStorageLocation` (see `payloads.rs`).
async fn external_storage_location(
    State(c): State<Shared>,
    params: Params,
) -> Result<Json<serde_json::Value>, ApiError> {
    let payloads = c.with(|s| std::sync::Arc::clone(&s.payloads));
    payloads.location(&params).map(Json)
}
