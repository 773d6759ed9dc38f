//! Tags (`/repositories/{r}/tags`): a name for a commit, resolved by every ref route after
//! branches (`pkg/graveler/ref/resolve_ref.go`).

use axum::Json;
use axum::body::Bytes;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::super::error::LakefsError;
use super::super::model::RefJson;
use super::{Shared, json_body};

/// `TagCreation`.
#[derive(Debug, Deserialize)]
struct TagCreation {
    id: String,
    #[serde(rename = "ref")]
    reference: String,
    #[serde(default)]
    force: bool,
}

/// `ValidateTagID` (pkg/graveler/validate.go): git's ref format, `~` allowed.
fn valid_tag_id(id: &str) -> bool {
    !id.is_empty()
        && id != "@"
        && !id.ends_with('.')
        && !id.ends_with(".lock")
        && !id.contains("..")
        && !id.contains('/')
        && !id.contains("@{")
        && !id.contains(['^', ':', '?', '*', '[', '\\'])
        && !id.chars().any(|c| c <= ' ')
}

fn invalid_tag() -> LakefsError {
    LakefsError::BadRequest("tag id: invalid value".to_owned())
}

fn tag_not_found() -> LakefsError {
    LakefsError::NotFound("tag not found".to_owned())
}

pub(super) async fn create(
    state: Shared,
    Path(repository): Path<String>,
    body: Bytes,
) -> Result<Response, LakefsError> {
    let request: TagCreation = json_body(&body)?;
    if !valid_tag_id(&request.id) {
        return Err(invalid_tag());
    }
    let mut lakefs = state.state();
    let repo = lakefs.repo_mut(&repository)?;
    if repo.read_only && !request.force {
        return Err(LakefsError::Forbidden("read-only repository".to_owned()));
    }
    if repo.tags.contains_key(&request.id) && !request.force {
        return Err(LakefsError::Conflict(
            "tag already exists: not unique".to_owned(),
        ));
    }
    let commit = repo.resolve_commit(&request.reference)?;
    repo.tags.insert(request.id.clone(), commit.id.clone());
    tracing::info!(%repository, tag = %request.id, commit = %commit.id, "tag created");
    Ok((
        StatusCode::CREATED,
        Json(json!(RefJson {
            id: &request.id,
            commit_id: &commit.id
        })),
    )
        .into_response())
}

pub(super) async fn get(
    state: Shared,
    Path((repository, tag)): Path<(String, String)>,
) -> Result<Json<Value>, LakefsError> {
    if !valid_tag_id(&tag) {
        return Err(invalid_tag());
    }
    let lakefs = state.state();
    let commit = lakefs
        .repo(&repository)?
        .tags
        .get(&tag)
        .ok_or_else(tag_not_found)?;
    Ok(Json(json!(RefJson {
        id: &tag,
        commit_id: commit
    })))
}

pub(super) async fn delete(
    state: Shared,
    Path((repository, tag)): Path<(String, String)>,
) -> Result<StatusCode, LakefsError> {
    if !valid_tag_id(&tag) {
        return Err(invalid_tag());
    }
    let mut lakefs = state.state();
    let repo = lakefs.repo_mut(&repository)?;
    if repo.read_only {
        return Err(LakefsError::Forbidden("read-only repository".to_owned()));
    }
    repo.tags.remove(&tag).ok_or_else(tag_not_found)?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::valid_tag_id;

    #[test]
    fn tag_ids_follow_the_real_validator() {
        for good in ["v1.0", "release-2", "a~b", "x_y"] {
            assert!(valid_tag_id(good), "{good:?}");
        }
        for bad in [
            "", "@", "v1.", "a.lock", "a..b", "a/b", "a@{1", "a^", "a b", "a:b",
        ] {
            assert!(!valid_tag_id(bad), "{bad:?}");
        }
    }
}
