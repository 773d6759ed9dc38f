//! Branch protection rules (`/repositories/{r}/settings/branch_protection`). Every rule set
//! through the API blocks staging writes and commits on the branches its pattern matches
//! (`SetBranchProtectionRules` in pkg/api/controller.go gives each the same two actions):
//! uploads, deletes and resets answer `403 cannot write to protected branch`, commits
//! `403 cannot commit to protected branch`; merges into a protected branch are allowed.

use axum::Json;
use axum::body::Bytes;
use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::super::error::LakefsError;
use super::super::store::hex;
use super::{Shared, json_body};

/// `BranchProtectionRule`.
#[derive(Debug, Deserialize)]
struct Rule {
    pattern: String,
}

fn etag(patterns: &[String]) -> String {
    use sha2::Digest as _;
    hex(&sha2::Sha256::digest(patterns.join("\n").as_bytes()))
}

pub(super) async fn get(
    state: Shared,
    Path(repository): Path<String>,
) -> Result<Response, LakefsError> {
    let lakefs = state.state();
    let patterns = &lakefs.repo(&repository)?.protection;
    let rules: Vec<_> = patterns.iter().map(|p| json!({ "pattern": p })).collect();
    Ok(([(header::ETAG, etag(patterns))], Json(rules)).into_response())
}

pub(super) async fn set(
    state: Shared,
    Path(repository): Path<String>,
    body: Bytes,
) -> Result<StatusCode, LakefsError> {
    let rules: Vec<Rule> = json_body(&body)?;
    if rules.iter().any(|r| r.pattern.is_empty()) {
        return Err(LakefsError::BadRequest(
            "request body has an error: doesn't match schema: pattern: minimum string length is 1"
                .to_owned(),
        ));
    }
    let mut lakefs = state.state();
    let repo = lakefs.repo_mut(&repository)?;
    repo.protection = rules.into_iter().map(|r| r.pattern).collect();
    tracing::info!(%repository, rules = ?repo.protection, "branch protection rules set");
    Ok(StatusCode::NO_CONTENT)
}
