//! Errors answered to HTTP clients, in the server's `ErrorResponse` shape (§3.8), and the JSON
//! body reader that turns malformed input into the status the real server gives.
//!
//! The real server maps `NotFoundException` to 404, `ConflictException` to 409,
//! `IllegalArgumentException` to 400 and bean-validation failures to 400 with a list of
//! `validationErrors`; anything else, including Jackson failures on malformed JSON or an enum
//! value it does not know, becomes a 500.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The `instance` field of every error body: the real server puts its host name there.
pub(crate) const INSTANCE: &str = "devstack";

/// One entry of `ErrorResponse.validationErrors`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ValidationError {
    pub path: String,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub invalid_value: Option<serde_json::Value>,
}

/// The error body of every non-2xx answer.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorResponse {
    pub status: u16,
    pub message: String,
    pub instance: &'static str,
    pub retryable: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub validation_errors: Vec<ValidationError>,
}

/// A request the server refuses, with the status the real server would answer.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum ApiError {
    /// 404 `NotFoundException`.
    #[error("{0}")]
    NotFound(String),
    /// 409 `ConflictException`.
    #[error("{0}")]
    Conflict(String),
    /// 400 `IllegalArgumentException`.
    #[error("{0}")]
    BadRequest(String),
    /// 400 bean-validation failure.
    #[error("Validation failed, check below errors for detail.")]
    Validation(Vec<ValidationError>),
    /// 500: Jackson failures and everything unmapped.
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    /// A validation failure with one `(path, message)` per broken constraint.
    pub(crate) fn validation<I>(errors: I) -> Self
    where
        I: IntoIterator<Item = (String, String)>,
    {
        Self::Validation(
            errors
                .into_iter()
                .map(|(path, message)| ValidationError {
                    path,
                    message,
                    invalid_value: None,
                })
                .collect(),
        )
    }

    fn status(&self) -> StatusCode {
        match self {
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Conflict(_) => StatusCode::CONFLICT,
            Self::BadRequest(_) | Self::Validation(_) => StatusCode::BAD_REQUEST,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = ErrorResponse {
            status: status.as_u16(),
            message: self.to_string(),
            instance: INSTANCE,
            retryable: false,
            validation_errors: match self {
                Self::Validation(errors) => errors,
                _ => Vec::new(),
            },
        };
        tracing::debug!(status = status.as_u16(), message = %body.message, "request refused");
        (status, Json(body)).into_response()
    }
}

/// Parses a JSON request body the way the server's Jackson mapper does: unknown fields are
/// ignored; malformed JSON and unknown enum values are a 500 (not in the exception map).
pub(crate) fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::Internal(format!("JSON parse error: {e}")))
}
