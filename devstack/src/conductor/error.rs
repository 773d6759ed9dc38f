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

/// Jackson's default `StreamReadConstraints.maxNestingDepth`, which the server keeps.
pub(crate) const MAX_NESTING_DEPTH: usize = 1000;

/// The deepest array/object nesting of `body`, counted without recursion (brackets inside
/// strings skipped); stops counting past `limit`.
fn nesting_depth(body: &[u8], limit: usize) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for &b in body {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
                if deepest > limit {
                    break;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Parses a JSON request body the way the server's Jackson mapper does: unknown fields are
/// ignored; nesting up to 1,000 levels is accepted (serde_json alone stops at 128); malformed
/// JSON, deeper nesting and unknown enum values are a 500 (not in the exception map).
pub(crate) fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let parse_error = |problem: String| ApiError::Internal(format!("JSON parse error: {problem}"));
    let depth = nesting_depth(body, MAX_NESTING_DEPTH);
    if depth > MAX_NESTING_DEPTH {
        return Err(parse_error(format!(
            "Document nesting depth ({depth}) exceeds the maximum allowed ({MAX_NESTING_DEPTH})"
        )));
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    de.disable_recursion_limit();
    // Within the depth checked above, on a stack that grows as needed.
    let value = T::deserialize(serde_stacker::Deserializer::new(&mut de))
        .map_err(|e| parse_error(crate::errors::chain(&e)))?;
    de.end()
        .map_err(|e| parse_error(crate::errors::chain(&e)))?;
    Ok(value)
}
