//! The REST routes under `/api`, plus `/health`. Handlers parse, take the state lock for one
//! synchronous transition, and answer; only long polls wait, and never under the lock.

mod metadata;
mod tasks;
mod workflow;

use std::str::FromStr;
use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Query};
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::error::ApiError;
use super::store::Conductor;

pub(crate) type Shared = Arc<Conductor>;

/// Largest request body accepted.
const BODY_LIMIT: usize = 64 * 1024 * 1024;

/// All Conductor routes.
pub(crate) fn router(conductor: Shared) -> Router {
    Router::new()
        .merge(tasks::routes())
        .merge(metadata::routes())
        .merge(workflow::routes())
        .route("/health", get(health))
        .route("/api/health", get(health))
        // axum's default 2 MB body limit would refuse results the real server accepts (it only
        // externalizes task output above 3 MB and fails it above 10 MB).
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(conductor)
}

async fn health() -> Response {
    Json(serde_json::json!({
        "healthResults": [],
        "suppressedHealthResults": [],
        "healthy": true,
    }))
    .into_response()
}

async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::NotFound(format!("No handler found for {}", uri.path()))
}

async fn method_not_allowed(method: axum::http::Method) -> Response {
    let body = serde_json::json!({
        "status": 405,
        "message": format!("Request method '{method}' is not supported"),
        "instance": super::error::INSTANCE,
        "retryable": false,
    });
    (axum::http::StatusCode::METHOD_NOT_ALLOWED, Json(body)).into_response()
}

/// Query parameters, kept as pairs so repeated keys (`taskType=a&taskType=b`) survive.
#[derive(Debug)]
pub(crate) struct Params(Vec<(String, String)>);

impl Params {
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn non_empty(&self, name: &str) -> Option<&str> {
        self.get(name).filter(|v| !v.is_empty())
    }

    fn all(&self, name: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// A typed parameter; a value that does not parse is a 500, as Spring's type-mismatch
    /// exception is not in the server's exception map.
    fn parse<T: FromStr>(&self, name: &str) -> Result<Option<T>, ApiError> {
        self.non_empty(name)
            .map(|v| {
                v.parse().map_err(|_| {
                    ApiError::Internal(format!("Failed to convert value '{v}' of parameter {name}"))
                })
            })
            .transpose()
    }

    /// A boolean parameter, case-insensitive as Spring's conversion is.
    fn flag(&self, name: &str) -> Result<Option<bool>, ApiError> {
        self.non_empty(name)
            .map(|v| match v.to_ascii_lowercase().as_str() {
                "true" => Ok(true),
                "false" => Ok(false),
                _ => Err(ApiError::Internal(format!(
                    "Failed to convert value '{v}' of parameter {name}"
                ))),
            })
            .transpose()
    }

    pub(crate) fn required(&self, name: &str) -> Result<&str, ApiError> {
        self.get(name).ok_or_else(|| {
            ApiError::Internal(format!(
                "Required request parameter '{name}' is not present"
            ))
        })
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Params {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Query::<Vec<(String, String)>>::from_request_parts(parts, state)
            .await
            .map(|Query(pairs)| Self(pairs))
            .map_err(|e| ApiError::Internal(e.body_text()))
    }
}
