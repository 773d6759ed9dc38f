//! Commits, log, diffs and merges.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::super::error::LakefsError;
use super::super::listing::{self, Page, Pagination, Row};
use super::super::merge::{self, Change, CommitRequest, MergeRequest, Strategy};
use super::super::model::{self, CommitCreation, MergeBody};
use super::super::store::{Entry, Snapshot};
use super::{Params, Shared, json_body};

pub(super) async fn commit(
    state: Shared,
    Path((repository, branch)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, LakefsError> {
    let request: CommitCreation = json_body(&body)?;
    let committer = state.committer().to_owned();
    let mut lakefs = state.state();
    let repo = lakefs.repo_mut(&repository)?;
    repo.branch(&branch)?;
    repo.unprotected(&branch, true)?;
    if repo.read_only && !request.force {
        return Err(LakefsError::Forbidden("read-only repository".to_owned()));
    }
    let request = CommitRequest {
        message: request.message,
        metadata: request.metadata.unwrap_or_default(),
        date: request.date,
        allow_empty: request.allow_empty,
    };
    let commit = merge::commit(repo, &branch, &committer, request)?;
    Ok((StatusCode::CREATED, Json(model::commit(&commit))).into_response())
}

pub(super) async fn get(
    state: Shared,
    Path((repository, reference)): Path<(String, String)>,
) -> Result<Json<Value>, LakefsError> {
    let lakefs = state.state();
    let commit = lakefs
        .repo(&repository)?
        .resolve_commit(&reference)
        .map_err(|e| match e {
            LakefsError::NotFound(_) => LakefsError::NotFound("commit not found".to_owned()),
            other => other,
        })?;
    Ok(Json(model::commit(&commit)))
}

/// Every ancestor in lakeFS's walk order (newest queued first, ties: larger id first; a
/// parent never before its child); `after` is a commit id.
pub(super) async fn log(
    state: Shared,
    Path((repository, reference)): Path<(String, String)>,
    params: Params,
) -> Result<Json<Value>, LakefsError> {
    let amount = params.amount()?;
    let first_parent = params.bool("first_parent", false)?;
    let lakefs = state.state();
    let repo = lakefs.repo(&repository)?;
    let head = repo.resolve_commit(&reference)?;
    let commits = repo.log(&head.id, first_parent);
    let after = params.str("after");
    let start = commits
        .iter()
        .position(|c| c.id == after)
        .map_or(0, |i| i + 1);
    let page: Vec<_> = commits.iter().skip(start).take(amount).collect();
    let has_more = commits.len() > start + page.len();
    let pagination = Pagination {
        has_more,
        next_offset: if has_more {
            page.last().map(|c| c.id.clone()).unwrap_or_default()
        } else {
            String::new()
        },
        results: page.len(),
        max_per_page: listing::MAX_PER_PAGE,
    };
    let results = page.into_iter().map(|c| model::commit(c)).collect();
    Ok(Json(json!(Page::<Value> {
        pagination,
        results
    })))
}

/// A diff page: rows filtered and folded like object listings.
fn diff_page(left: &Snapshot, right: &Snapshot, params: &Params) -> Result<Value, LakefsError> {
    let query = listing::Query {
        prefix: params.str("prefix"),
        after: params.str("after"),
        delimiter: params.str("delimiter"),
        amount: params.amount()?,
    };
    let changes = merge::diff(left, right);
    let (rows, pagination) =
        listing::page(changes.into_iter().map(|(p, c, e)| (p, (c, e))), &query);
    let results = rows.into_iter().map(|row| diff_row(row)).collect();
    Ok(json!(Page::<Value> {
        pagination,
        results
    }))
}

fn diff_row(row: Row<(Change, &Arc<Entry>)>) -> Value {
    match row {
        Row::Item(path, (change, entry)) => json!({
            "type": change.name(),
            "path": path,
            "path_type": "object",
            "size_bytes": entry.data.len(),
        }),
        Row::CommonPrefix(path) => json!({
            "type": "prefix_changed",
            "path": path,
            "path_type": "common_prefix",
        }),
    }
}

/// Uncommitted changes: the branch (staging included) against its head.
pub(super) async fn diff_branch(
    state: Shared,
    Path((repository, branch)): Path<(String, String)>,
    params: Params,
) -> Result<Json<Value>, LakefsError> {
    let (head, view) = {
        let lakefs = state.state();
        let repo = lakefs.repo(&repository)?;
        (repo.head(&branch)?, repo.branch_view(&branch)?)
    };
    Ok(Json(diff_page(&head.snapshot, &view, &params)?))
}

/// `three_dot` (default): what `right` changed since its merge base with `left`; `two_dot`:
/// the plain difference of the two commits.
pub(super) async fn diff_refs(
    state: Shared,
    Path((repository, left, right)): Path<(String, String, String)>,
    params: Params,
) -> Result<Json<Value>, LakefsError> {
    let (from, to) = {
        let lakefs = state.state();
        let repo = lakefs.repo(&repository)?;
        let left = repo.resolve_commit(&left)?;
        let right = repo.resolve_commit(&right)?;
        let from = match params.str("type") {
            "" | "three_dot" => merge::merge_base(repo, &left, &right)
                .ok_or_else(|| LakefsError::NotFound("merge base: not found".to_owned()))?,
            "two_dot" => left,
            other => {
                return Err(LakefsError::BadRequest(format!(
                    "diff type {other}: invalid value"
                )));
            }
        };
        (from, right)
    };
    Ok(Json(diff_page(&from.snapshot, &to.snapshot, &params)?))
}

pub(super) async fn merge_base(
    state: Shared,
    Path((repository, source, destination)): Path<(String, String, String)>,
) -> Result<Json<Value>, LakefsError> {
    let lakefs = state.state();
    let repo = lakefs.repo(&repository)?;
    let src = repo.resolve_commit(&source)?;
    let dest = repo.head(&destination)?;
    let base = merge::merge_base(repo, &src, &dest)
        .ok_or_else(|| LakefsError::NotFound("merge base: not found".to_owned()))?;
    Ok(Json(json!({
        "source_commit_id": src.id,
        "destination_commit_id": dest.id,
        "base_commit_id": base.id,
    })))
}

pub(super) async fn merge(
    state: Shared,
    Path((repository, source, destination)): Path<(String, String, String)>,
    body: Bytes,
) -> Result<Json<Value>, LakefsError> {
    let request: MergeBody = if body.iter().all(u8::is_ascii_whitespace) {
        MergeBody::default()
    } else {
        json_body(&body)?
    };
    let committer = state.committer().to_owned();
    let mut lakefs = state.state();
    let repo = lakefs.repo_mut(&repository)?;
    if repo.read_only && !request.force {
        return Err(LakefsError::Forbidden("read-only repository".to_owned()));
    }
    let request = MergeRequest {
        message: request.message.unwrap_or_default(),
        metadata: request.metadata.unwrap_or_default(),
        strategy: Strategy::parse(request.strategy.as_deref())?,
        // `force` also lets an empty merge through on the real server.
        allow_empty: request.allow_empty || request.force,
        squash: request.squash_merge,
    };
    let commit = merge::merge(repo, &source, &destination, &committer, request)?;
    Ok(Json(json!({ "reference": commit.id })))
}
