//! Repositories and branches.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::super::error::LakefsError;
use super::super::listing::{self, Page, Row};
use super::super::model::{self, BranchCreation, RefJson, RepositoryCreation, ResetCreation};
use super::super::store::{
    Branch, CommitDraft, Repo, Snapshot, invalid_branch, now, valid_branch_id,
};
use super::{Params, Shared, json_body};

/// `^[a-z0-9][a-z0-9-]{2,62}$`.
fn valid_repository_id(id: &str) -> bool {
    let mut bytes = id.bytes();
    (3..=63).contains(&id.len())
        && bytes
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// The schema's storage namespace pattern `^(s3|gs|https?|mem|local|transient)://.*$`.
fn valid_namespace(namespace: &str) -> bool {
    ["s3", "gs", "http", "https", "mem", "local", "transient"]
        .iter()
        .any(|scheme| {
            namespace
                .strip_prefix(scheme)
                .is_some_and(|rest| rest.starts_with("://"))
        })
}

pub(super) async fn create(
    state: Shared,
    params: Params,
    body: Bytes,
) -> Result<Response, LakefsError> {
    let request: RepositoryCreation = json_body(&body)?;
    let bare = params.bool("bare", false)?;
    if !valid_repository_id(&request.name) {
        return Err(LakefsError::BadRequest(format!(
            "argument name: repository id: invalid value: validation error: {:?}",
            request.name
        )));
    }
    if !valid_namespace(&request.storage_namespace) {
        return Err(LakefsError::BadRequest(
            "request body has an error: doesn't match schema: storage_namespace".to_owned(),
        ));
    }
    let default_branch = request.default_branch.unwrap_or_else(|| "main".to_owned());
    if !valid_branch_id(&default_branch) {
        return Err(invalid_branch());
    }
    let mut lakefs = state.state();
    if lakefs.repos.contains_key(&request.name) {
        return Err(LakefsError::Conflict(
            "error creating repository: not unique".to_owned(),
        ));
    }
    let namespace = request.storage_namespace.trim_end_matches('/').to_owned();
    if !bare && !lakefs.namespaces.insert(namespace.clone()) {
        return Err(LakefsError::BadRequest(format!(
            "failed to create repository: found lakeFS objects in the storage namespace({}): storage namespace already in use",
            request.storage_namespace
        )));
    }
    let created = now();
    let initial = Arc::new(
        CommitDraft {
            parents: Vec::new(),
            committer: String::new(),
            message: "Repository created".to_owned(),
            creation_date: created,
            metadata: BTreeMap::new(),
            generation: 1,
            snapshot: Arc::new(Snapshot::new()),
        }
        .seal(),
    );
    let branch = Branch {
        head: initial.id.clone(),
        staging: BTreeMap::new(),
    };
    let repo = Repo {
        id: request.name.clone(),
        storage_namespace: request.storage_namespace,
        default_branch: default_branch.clone(),
        creation_date: created,
        read_only: request.read_only,
        commits: HashMap::from([(initial.id.clone(), initial)]),
        branches: BTreeMap::from([(default_branch, branch)]),
        tags: BTreeMap::new(),
        protection: Vec::new(),
    };
    let body = model::repository(&repo);
    tracing::info!(repository = %repo.id, "repository created");
    lakefs.repos.insert(request.name, repo);
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

pub(super) async fn get(
    state: Shared,
    Path(repository): Path<String>,
) -> Result<Json<Value>, LakefsError> {
    Ok(Json(model::repository(state.state().repo(&repository)?)))
}

pub(super) async fn delete(
    state: Shared,
    Path(repository): Path<String>,
) -> Result<StatusCode, LakefsError> {
    state
        .state()
        .repos
        .remove(&repository)
        .ok_or_else(|| LakefsError::NotFound("repository not found".to_owned()))?;
    tracing::info!(%repository, "repository deleted");
    Ok(StatusCode::NO_CONTENT)
}

pub(super) async fn list(state: Shared, params: Params) -> Result<Json<Value>, LakefsError> {
    let query = listing::Query {
        prefix: params.str("prefix"),
        after: params.str("after"),
        amount: params.amount()?,
        ..Default::default()
    };
    let search = params.str("search");
    let lakefs = state.state();
    let repos = lakefs
        .repos
        .iter()
        .filter(|(id, _)| id.contains(search))
        .map(|(id, r)| (id.as_str(), r));
    let (rows, pagination) = listing::page(repos, &query);
    let results = rows
        .into_iter()
        .filter_map(|row| match row {
            Row::Item(_, repo) => Some(model::repository(repo)),
            Row::CommonPrefix(_) => None,
        })
        .collect();
    Ok(Json(json!(Page::<Value> {
        pagination,
        results
    })))
}

pub(super) async fn list_branches(
    state: Shared,
    Path(repository): Path<String>,
    params: Params,
) -> Result<Json<Value>, LakefsError> {
    let query = listing::Query {
        prefix: params.str("prefix"),
        after: params.str("after"),
        amount: params.amount()?,
        ..Default::default()
    };
    let lakefs = state.state();
    let repo = lakefs.repo(&repository)?;
    let (rows, pagination) =
        listing::page(repo.branches.iter().map(|(n, b)| (n.as_str(), b)), &query);
    let results = rows
        .into_iter()
        .filter_map(|row| match row {
            Row::Item(name, branch) => Some(json!(RefJson {
                id: &name,
                commit_id: &branch.head
            })),
            Row::CommonPrefix(_) => None,
        })
        .collect();
    Ok(Json(json!(Page::<Value> {
        pagination,
        results
    })))
}

pub(super) async fn create_branch(
    state: Shared,
    Path(repository): Path<String>,
    body: Bytes,
) -> Result<Response, LakefsError> {
    let request: BranchCreation = json_body(&body)?;
    if !valid_branch_id(&request.name) {
        return Err(invalid_branch());
    }
    let mut lakefs = state.state();
    let repo = lakefs.repo_mut(&repository)?;
    if repo.read_only && !request.force {
        return Err(LakefsError::Forbidden("read-only repository".to_owned()));
    }
    if repo.branches.contains_key(&request.name) {
        return Err(LakefsError::Conflict(
            "branch already exists: not unique".to_owned(),
        ));
    }
    if repo.commits.contains_key(&request.name) {
        return Err(LakefsError::Conflict(format!(
            "commit ID {}: conflict found",
            request.name
        )));
    }
    // Uncommitted changes of a source branch are not carried over.
    let source = repo.resolve_commit(&request.source)?;
    repo.branches.insert(
        request.name.clone(),
        Branch {
            head: source.id.clone(),
            staging: BTreeMap::new(),
        },
    );
    tracing::info!(%repository, branch = %request.name, source = %request.source, commit = %source.id, "branch created");
    // The real server writes the bare commit id as plain text, not JSON.
    Ok((
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        source.id.clone(),
    )
        .into_response())
}

pub(super) async fn get_branch(
    state: Shared,
    Path((repository, branch)): Path<(String, String)>,
) -> Result<Json<Value>, LakefsError> {
    let lakefs = state.state();
    let head = &lakefs.repo(&repository)?.branch(&branch)?.head;
    Ok(Json(json!(RefJson {
        id: &branch,
        commit_id: head
    })))
}

pub(super) async fn delete_branch(
    state: Shared,
    Path((repository, branch)): Path<(String, String)>,
) -> Result<StatusCode, LakefsError> {
    let mut lakefs = state.state();
    let repo = lakefs.repo_mut(&repository)?;
    repo.branch(&branch)?;
    if repo.default_branch == branch {
        return Err(LakefsError::Forbidden(
            "cannot delete repository default branch".to_owned(),
        ));
    }
    // Uncommitted changes go with it.
    repo.branches.remove(&branch);
    tracing::info!(%repository, %branch, "branch deleted");
    Ok(StatusCode::NO_CONTENT)
}

/// Discards uncommitted changes: all of them, one object, or those under a prefix.
pub(super) async fn reset_branch(
    state: Shared,
    Path((repository, branch)): Path<(String, String)>,
    body: Bytes,
) -> Result<StatusCode, LakefsError> {
    let request: ResetCreation = json_body(&body)?;
    let mut lakefs = state.state();
    let repo = lakefs.repo_mut(&repository)?;
    repo.branch(&branch)?;
    repo.unprotected(&branch, false)?;
    let staging = &mut repo.branch_mut(&branch)?.staging;
    let path = request.path.unwrap_or_default();
    match request.kind.as_str() {
        "reset" => staging.clear(),
        "object" => {
            staging.remove(&path);
        }
        "common_prefix" => staging.retain(|key, _| !key.starts_with(&path)),
        other => {
            return Err(LakefsError::BadRequest(format!(
                "{other}: unknown reset type"
            )));
        }
    }
    Ok(StatusCode::NO_CONTENT)
}
