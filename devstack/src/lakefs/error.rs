//! lakeFS errors and how the real server reports them: a status code and an `Error` body
//! `{"message": ...}`, except for the merge conflict, which answers `409 {"reference": ""}`.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// A failed lakeFS API call, with the real server's status code and message text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LakefsError {
    /// 400: validation failures, `no changes`, dirty destination branch, bad ranges.
    #[error("{0}")]
    BadRequest(String),
    /// 401: missing or wrong credentials.
    #[error("error authenticating request")]
    Unauthenticated,
    /// 403: e.g. deleting the default branch.
    #[error("{0}")]
    Forbidden(String),
    /// 404: unknown repository, branch, ref, commit or object.
    #[error("{0}")]
    NotFound(String),
    /// 409: the repository or branch exists already.
    #[error("{0}")]
    Conflict(String),
    /// 409 of a merge: both sides changed a path since the merge base.
    #[error("conflict found")]
    MergeConflict,
    /// 412: `If-None-Match: *` on an existing path.
    #[error("{0}")]
    PreconditionFailed(String),
    /// 501: features the open-source server does not support either (`If-Match`).
    #[error("{0}")]
    NotImplemented(String),
    /// 500: what the real server does not map (e.g. a multipart upload without `content`).
    #[error("{0}")]
    Internal(String),
}

impl LakefsError {
    /// The HTTP status the real server answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::Unauthenticated => StatusCode::UNAUTHORIZED,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Conflict(_) | Self::MergeConflict => StatusCode::CONFLICT,
            Self::PreconditionFailed(_) => StatusCode::PRECONDITION_FAILED,
            Self::NotImplemented(_) => StatusCode::NOT_IMPLEMENTED,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl IntoResponse for LakefsError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::warn!(%status, error = %self, "lakefs request failed");
        } else {
            tracing::debug!(%status, error = %self, "lakefs request refused");
        }
        // The real server's merge handler writes a MergeResult with an empty reference on a
        // conflict (the spec marks this as deprecated), not the Error shape.
        let body = match self {
            Self::MergeConflict => serde_json::json!({ "reference": "" }),
            other => serde_json::json!({ "message": other.to_string() }),
        };
        (status, Json(body)).into_response()
    }
}
