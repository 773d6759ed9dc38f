//! Fault injection for tests, administered under `/__devstack/faults` and applied by a
//! middleware in front of the served API (never in front of the admin routes themselves).
//!
//! A rule matches requests by optional method, path prefix and body substring, and does, in order: wait
//! `latencyMs`, then either answer `status` with an `ErrorResponse` body (or with `body`, a JSON
//! text sent as it is: a forged success such as `{"reference": ""}` for a merge; and with
//! `location`, a `Location` header: a redirect), drop the connection
//! without answering (`drop: true`), or pass the request on. `count` limits how many requests
//! the rule applies to (absent: until deleted). The first matching rule with budget left wins.
//!
//! With `detached: true` (and `latencyMs`, no `status`, no `drop`) the request is served late in
//! a task of its own, as a server goes on with a slow merge: it waits `latencyMs` there and is
//! then served, and a client that hangs up meanwhile cancels nothing. With `holdPath` (and
//! `holdMethod`), the requests it names wait until the detached one has been served, as lakeFS
//! deletes a branch only after a merge reading it has landed.
//!
//! ```text
//! POST   /__devstack/faults        {"method":"POST","path":"/api/tasks","status":503,"count":2}
//! POST   /__devstack/faults        {"path":"/api/tasks","bodyContains":"\"extendLease\":true","status":503}
//! POST   /__devstack/faults        {"method":"POST","path":"/api/v1/repositories/r/refs/","status":200,"body":"{\"reference\":\"\"}"}
//! POST   /__devstack/faults        {"method":"POST","path":"/api/v1/repositories/r/refs/","latencyMs":6000,"detached":true,"holdMethod":"DELETE","holdPath":"/api/v1/repositories/r/branches/","count":1}
//! GET    /__devstack/faults        -> [{"id":1,...,"remaining":2,"hits":0}]
//! DELETE /__devstack/faults/{id}   remove one rule
//! DELETE /__devstack/faults        remove all
//! ```

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use serde::{Deserialize, Serialize};

use crate::http::ConnectionControl;

/// Where the admin routes live.
pub const ADMIN_PATH: &str = "/__devstack/faults";

/// The longest request body a `bodyContains` rule reads.
pub const MAX_MATCHED_BODY: usize = 16 << 20;

/// A rule as posted by a test. In-process:
/// `FaultSpec { path: "/api/tasks".into(), status: Some(503), count: Some(1), ..Default::default() }`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FaultSpec {
    /// HTTP method to match (any when absent), e.g. `"POST"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// Path prefix to match, e.g. `"/api/tasks/poll/"`.
    pub path: String,
    /// Match only requests whose body contains this text, e.g. `"\"extendLease\":true"` for
    /// Conductor lease extensions. The body of a request such a rule could match is read (up to
    /// [`MAX_MATCHED_BODY`] bytes; a longer one is answered 413) and passed on unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_contains: Option<String>,
    /// Answer this status instead of serving the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// With `status`: answer this text (as `application/json`, sent as it is) instead of an
    /// `ErrorResponse`, e.g. a forged success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// With `status`: send this `Location` header too (a redirect, with a 3xx status).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// Wait this long before acting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<u64>,
    /// Close the connection without answering.
    #[serde(default)]
    pub drop: bool,
    /// Apply to this many matching requests, then stop; forever when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// With `latencyMs` (and neither `status` nor `drop`): serve the request in a task of its
    /// own, `latencyMs` late; a client that hangs up meanwhile does not cancel it (a slow lakeFS
    /// merge lands all the same).
    #[serde(default)]
    pub detached: bool,
    /// With `detached`: requests whose path starts with this wait until the detached request
    /// has been served (e.g. the staging branch's delete after a slow merge).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_path: Option<String>,
    /// With `holdPath`: only requests of this method wait (any when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_method: Option<String>,
    /// Match `path` exactly, not as a prefix (e.g. `/api/tasks/queue/size` without
    /// `/api/tasks/queue/sizes`).
    #[serde(default)]
    pub path_exact: bool,
}

/// A rule that cannot be applied.
#[derive(Debug, Clone, thiserror::Error)]
#[error("invalid fault rule: {0}")]
pub struct InvalidFault(String);

/// A stored rule with its id and counters.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
struct FaultRule {
    id: u64,
    #[serde(flatten)]
    spec: FaultSpec,
    /// Requests the rule still applies to (`null`: unlimited).
    remaining: Option<u64>,
    /// Requests the rule was applied to.
    hits: u64,
}

impl FaultRule {
    /// Budget left, path prefix and method match (the body is checked apart).
    fn matches_head(&self, method: &Method, path: &str) -> bool {
        self.remaining != Some(0)
            && if self.spec.path_exact {
                path == self.spec.path
            } else {
                path.starts_with(&self.spec.path)
            }
            && self
                .spec
                .method
                .as_deref()
                .is_none_or(|m| m.eq_ignore_ascii_case(method.as_str()))
    }
}

/// Whether `needle` occurs in `haystack` (an empty needle always does).
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

/// What to do with one request.
#[derive(Debug, Clone)]
struct Action {
    latency: Option<Duration>,
    status: Option<StatusCode>,
    body: Option<String>,
    location: Option<String>,
    drop: bool,
    detached: bool,
    hold: Option<(Option<String>, String)>,
}

/// Requests held until a detached request has been served.
#[derive(Debug)]
struct Hold {
    id: u64,
    method: Option<String>,
    path: String,
    served: tokio::sync::watch::Receiver<bool>,
}

/// The rule set, shared by the admin routes and the middleware.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    inner: Arc<Mutex<FaultTable>>,
}

#[derive(Debug, Default)]
struct FaultTable {
    next_id: u64,
    rules: Vec<FaultRule>,
    holds: Vec<Hold>,
}

impl Faults {
    fn table(&self) -> std::sync::MutexGuard<'_, FaultTable> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a rule and returns its id.
    pub fn add(&self, spec: FaultSpec) -> Result<u64, InvalidFault> {
        if spec.body.is_some() && spec.status.is_none() {
            return Err(InvalidFault("body needs a status".to_owned()));
        }
        if let Some(location) = &spec.location {
            if spec.status.is_none() {
                return Err(InvalidFault("location needs a status".to_owned()));
            }
            if axum::http::HeaderValue::from_str(location).is_err() {
                return Err(InvalidFault(format!(
                    "location {location:?} is not a header value"
                )));
            }
        }
        if spec.status.is_none() && spec.latency_ms.is_none() && !spec.drop {
            return Err(InvalidFault(
                "a fault needs status, latencyMs or drop".to_owned(),
            ));
        }
        if spec.status.is_some() && spec.drop {
            return Err(InvalidFault(
                "status and drop exclude each other".to_owned(),
            ));
        }
        if let Some(status) = spec.status
            && StatusCode::from_u16(status).is_err()
        {
            return Err(InvalidFault(format!(
                "status {status} is not an HTTP status"
            )));
        }
        if let Some(method) = spec
            .method
            .iter()
            .chain(&spec.hold_method)
            .find(|m| Method::from_bytes(m.as_bytes()).is_err())
        {
            return Err(InvalidFault(format!("{method} is not an HTTP method")));
        }
        if spec.detached && (spec.latency_ms.is_none() || spec.status.is_some() || spec.drop) {
            return Err(InvalidFault(
                "detached needs latencyMs, and neither status nor drop".to_owned(),
            ));
        }
        if (spec.hold_path.is_some() || spec.hold_method.is_some()) && !spec.detached {
            return Err(InvalidFault("holdPath needs detached".to_owned()));
        }
        if spec.hold_method.is_some() && spec.hold_path.is_none() {
            return Err(InvalidFault("holdMethod needs holdPath".to_owned()));
        }
        let mut table = self.table();
        table.next_id += 1;
        let id = table.next_id;
        table.rules.push(FaultRule {
            id,
            remaining: spec.count,
            spec,
            hits: 0,
        });
        Ok(id)
    }

    /// Removes one rule; false if there was no rule with that id.
    pub fn remove(&self, id: u64) -> bool {
        let mut table = self.table();
        let before = table.rules.len();
        table.rules.retain(|r| r.id != id);
        table.rules.len() != before
    }

    /// Removes every rule.
    pub fn clear(&self) {
        self.table().rules.clear();
    }

    /// How many requests rule `id` was applied to so far; `None` if there is no such rule.
    pub fn hits(&self, id: u64) -> Option<u64> {
        self.table()
            .rules
            .iter()
            .find(|r| r.id == id)
            .map(|r| r.hits)
    }

    /// Whether some rule with budget left needs the body of this request to decide.
    fn needs_body(&self, method: &Method, path: &str) -> bool {
        self.table()
            .rules
            .iter()
            .any(|r| r.spec.body_contains.is_some() && r.matches_head(method, path))
    }

    /// The first rule with budget left that matches, counted as applied. `body` is `None` when
    /// no rule needed it: then `bodyContains` rules do not match.
    fn take(&self, method: &Method, path: &str, body: Option<&[u8]>) -> Option<Action> {
        let mut table = self.table();
        let rule = table.rules.iter_mut().find(|r| {
            r.matches_head(method, path)
                && r.spec
                    .body_contains
                    .as_deref()
                    .is_none_or(|needle| body.is_some_and(|b| contains(b, needle.as_bytes())))
        })?;
        rule.hits += 1;
        if let Some(remaining) = &mut rule.remaining {
            *remaining -= 1;
        }
        Some(Action {
            latency: rule.spec.latency_ms.map(Duration::from_millis),
            status: rule.spec.status.and_then(|s| StatusCode::from_u16(s).ok()),
            body: rule.spec.body.clone(),
            location: rule.spec.location.clone(),
            drop: rule.spec.drop,
            detached: rule.spec.detached,
            hold: rule
                .spec
                .hold_path
                .clone()
                .map(|path| (rule.spec.hold_method.clone(), path)),
        })
    }

    /// Holds the requests `hold` names until `served` turns true; the hold's id.
    fn hold(
        &self,
        (method, path): (Option<String>, String),
        served: tokio::sync::watch::Receiver<bool>,
    ) -> u64 {
        let mut table = self.table();
        table.next_id += 1;
        let id = table.next_id;
        table.holds.push(Hold {
            id,
            method,
            path,
            served,
        });
        id
    }

    fn release(&self, id: u64) {
        self.table().holds.retain(|h| h.id != id);
    }

    /// What this request must wait for first.
    fn holding(&self, method: &Method, path: &str) -> Vec<tokio::sync::watch::Receiver<bool>> {
        self.table()
            .holds
            .iter()
            .filter(|h| {
                path.starts_with(&h.path)
                    && h.method
                        .as_deref()
                        .is_none_or(|m| m.eq_ignore_ascii_case(method.as_str()))
            })
            .map(|h| h.served.clone())
            .collect()
    }
}

/// The middleware: applies the first matching rule, if any.
pub(crate) async fn inject(State(faults): State<Faults>, request: Request, next: Next) -> Response {
    for mut served in faults.holding(request.method(), request.uri().path()) {
        tracing::info!(method = %request.method(), path = request.uri().path(), "held until a detached request has been served");
        // A sender dropped without sending (the task gone) releases the hold too.
        let _ = served.wait_for(|served| *served).await;
    }
    let (request, body) = if faults.needs_body(request.method(), request.uri().path()) {
        let (parts, body) = request.into_parts();
        match axum::body::to_bytes(body, MAX_MATCHED_BODY).await {
            Ok(bytes) => (
                Request::from_parts(parts, Body::from(bytes.clone())),
                Some(bytes),
            ),
            Err(error) => {
                return error_body(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    &format!(
                        "cannot read the body for a bodyContains fault: {}",
                        crate::errors::DisplayChain(&error)
                    ),
                );
            }
        }
    } else {
        (request, None)
    };
    let Some(action) = faults.take(request.method(), request.uri().path(), body.as_deref()) else {
        return next.run(request).await;
    };
    tracing::info!(method = %request.method(), path = request.uri().path(), ?action, "fault injected");
    if action.detached {
        return detached(faults, action, request, next).await;
    }
    if let Some(latency) = action.latency {
        tokio::time::sleep(latency).await;
    }
    if action.drop {
        match request.extensions().get::<ConnectionControl>() {
            Some(control) => {
                control.kill();
                // The connection loop drops this future together with the connection.
                std::future::pending::<()>().await;
            }
            None => tracing::warn!("drop fault on a connection that cannot be dropped"),
        }
    }
    let mut response = match (action.status, action.body) {
        (Some(status), Some(body)) => (
            status,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        (Some(status), None) => error_body(status, "fault injected by devstack"),
        (None, _) => return next.run(request).await,
    };
    if let Some(location) = action
        .location
        .and_then(|l| axum::http::HeaderValue::from_str(&l).ok())
    {
        response
            .headers_mut()
            .insert(axum::http::header::LOCATION, location);
    }
    response
}

/// Serves `request` `action.latency` late in a task of its own: the client hanging up does not
/// cancel it. The requests `action.hold` names wait until it has been served.
async fn detached(faults: Faults, action: Action, request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    // Read now: once the client has hung up, its body could not be.
    let body = match axum::body::to_bytes(body, MAX_MATCHED_BODY).await {
        Ok(bytes) => bytes,
        Err(error) => {
            return error_body(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!(
                    "cannot read the body for a detached fault: {}",
                    crate::errors::DisplayChain(&error)
                ),
            );
        }
    };
    let request = Request::from_parts(parts, Body::from(body));
    let (served_tx, served) = tokio::sync::watch::channel(false);
    let hold = action.hold.map(|hold| faults.hold(hold, served));
    let (answer, answered) = tokio::sync::oneshot::channel();
    let latency = action.latency.unwrap_or_default();
    tokio::spawn(async move {
        tokio::time::sleep(latency).await;
        let response = next.run(request).await;
        tracing::info!(status = %response.status(), "detached request served");
        let _ = served_tx.send(true);
        if let Some(id) = hold {
            faults.release(id);
        }
        // The client may be gone: the request was served all the same.
        let _ = answer.send(response);
    });
    answered.await.unwrap_or_else(|_| {
        error_body(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the detached request was lost",
        )
    })
}

fn error_body(status: StatusCode, message: &str) -> Response {
    let body = serde_json::json!({
        "status": status.as_u16(),
        "message": message,
        "instance": crate::conductor::INSTANCE,
        "retryable": status.is_server_error(),
    });
    (status, Json(body)).into_response()
}

/// The admin routes under [`ADMIN_PATH`].
pub(crate) fn admin_router(faults: Faults) -> Router {
    Router::new()
        .route(ADMIN_PATH, get(list).post(add).delete(clear))
        .route(&format!("{ADMIN_PATH}/{{id}}"), delete(remove))
        .with_state(faults)
}

async fn list(State(faults): State<Faults>) -> Response {
    Json(faults.table().rules.clone()).into_response()
}

async fn add(State(faults): State<Faults>, body: Bytes) -> Response {
    let spec: FaultSpec = match serde_json::from_slice(&body) {
        Ok(spec) => spec,
        Err(e) => {
            return error_body(
                StatusCode::BAD_REQUEST,
                &format!("bad fault: {}", crate::errors::DisplayChain(&e)),
            );
        }
    };
    match faults.add(spec) {
        Ok(id) => Json(serde_json::json!({ "id": id })).into_response(),
        Err(error) => error_body(StatusCode::BAD_REQUEST, &crate::errors::chain(&error)),
    }
}

async fn clear(State(faults): State<Faults>) -> StatusCode {
    faults.clear();
    StatusCode::OK
}

async fn remove(State(faults): State<Faults>, Path(id): Path<u64>) -> Response {
    if faults.remove(id) {
        Response::new(Body::empty())
    } else {
        error_body(StatusCode::NOT_FOUND, &format!("no fault with id {id}"))
    }
}
