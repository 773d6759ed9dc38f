//! Objects: upload and delete on a branch (staged until commit), stat/get/list on any ref.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use md5::{Digest, Md5};
use serde_json::{Value, json};

use super::super::error::LakefsError;
use super::super::listing::{self, Page, Row};
use super::super::model::{self, PathList};
use super::super::multipart;
use super::super::store::{Entry, Repo, hex, now};
use super::{Params, Shared, json_body};

/// Object keys are 1..1024 bytes of anything.
const MAX_PATH_BYTES: usize = 1024;
/// Paths per delete-many call.
const MAX_DELETE_PATHS: usize = 1000;

pub(super) fn object_path(params: &Params) -> Result<&str, LakefsError> {
    let path = params.required("path")?;
    if path.is_empty() || path.len() > MAX_PATH_BYTES {
        return Err(LakefsError::BadRequest(format!(
            "argument path: path: invalid value: validation error: must be 1..{MAX_PATH_BYTES} bytes"
        )));
    }
    Ok(path)
}

fn object_not_found() -> LakefsError {
    LakefsError::NotFound("object not found: not found".to_owned())
}

fn writable<'r>(
    repo: &'r mut Repo,
    branch: &str,
    force: bool,
) -> Result<&'r mut Repo, LakefsError> {
    repo.branch(branch)?;
    repo.unprotected(branch, false)?;
    if repo.read_only && !force {
        return Err(LakefsError::Forbidden("read-only repository".to_owned()));
    }
    repo.branch(branch)?;
    Ok(repo)
}

pub(super) async fn upload(
    state: Shared,
    Path((repository, branch)): Path<(String, String)>,
    params: Params,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, LakefsError> {
    // Repository, then branch, then the request itself, in the real handler's order.
    state.state().repo(&repository)?.branch(&branch)?;
    let path = object_path(&params)?.to_owned();
    let force = params.bool("force", false)?;
    if headers.contains_key(header::IF_MATCH) {
        return Err(LakefsError::NotImplemented(
            "If-Match is not supported".to_owned(),
        ));
    }
    let if_none_match = match headers.get(header::IF_NONE_MATCH) {
        None => false,
        Some(v) if v == "*" => true,
        Some(_) => {
            return Err(LakefsError::NotImplemented(
                "only If-None-Match: * is supported".to_owned(),
            ));
        }
    };
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let (content_type, data) = multipart::object_body(content_type, body)?;
    let metadata: BTreeMap<String, String> = headers
        .iter()
        .filter_map(|(name, value)| {
            let key = name.as_str().strip_prefix("x-lakefs-meta-")?;
            Some((key.to_ascii_lowercase(), value.to_str().ok()?.to_owned()))
        })
        .collect();
    let mut lakefs = state.state();
    let repo = writable(lakefs.repo_mut(&repository)?, &branch, force)?;
    if if_none_match && repo.branch_view(&branch)?.contains_key(&path) {
        return Err(LakefsError::PreconditionFailed(
            "path already exists".to_owned(),
        ));
    }
    let entry = Arc::new(Entry {
        physical_address: format!(
            "{}/data/{}/{}",
            repo.storage_namespace.trim_end_matches('/'),
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        ),
        checksum: hex(&Md5::digest(&data)),
        mtime: now(),
        content_type,
        metadata,
        data,
    });
    let stats = model::object_stats(&path, &entry, true);
    tracing::debug!(%repository, %branch, %path, size = entry.data.len(), "object staged");
    repo.branch_mut(&branch)?.staging.insert(path, Some(entry));
    Ok((StatusCode::CREATED, Json(stats)).into_response())
}

/// Stages a tombstone; deleting a missing object is not an error.
pub(super) async fn delete_one(
    state: Shared,
    Path((repository, branch)): Path<(String, String)>,
    params: Params,
) -> Result<StatusCode, LakefsError> {
    let mut lakefs = state.state();
    let repo = lakefs.repo_mut(&repository)?;
    repo.branch(&branch)?;
    let path = object_path(&params)?.to_owned();
    let force = params.bool("force", false)?;
    writable(repo, &branch, force)?
        .branch_mut(&branch)?
        .staging
        .insert(path, None);
    Ok(StatusCode::NO_CONTENT)
}

pub(super) async fn delete_many(
    state: Shared,
    Path((repository, branch)): Path<(String, String)>,
    params: Params,
    body: Bytes,
) -> Result<Json<Value>, LakefsError> {
    let mut lakefs = state.state();
    let repo = lakefs.repo_mut(&repository)?;
    repo.branch(&branch)?;
    let request: PathList = json_body(&body)?;
    if request.paths.len() > MAX_DELETE_PATHS {
        return Err(LakefsError::BadRequest(format!(
            "validation error: too many paths: {} > {MAX_DELETE_PATHS}",
            request.paths.len()
        )));
    }
    let force = params.bool("force", false)?;
    // The real server reports a protected branch per path, in a 200.
    if let Err(refused) = repo.unprotected(&branch, false) {
        let errors: Vec<Value> = request
            .paths
            .iter()
            .map(|path| json!({ "status_code": 403, "message": refused.to_string(), "path": path }))
            .collect();
        return Ok(Json(json!({ "errors": errors })));
    }
    let staging = &mut writable(repo, &branch, force)?.branch_mut(&branch)?.staging;
    let mut errors = Vec::new();
    for path in request.paths {
        if path.is_empty() || path.len() > MAX_PATH_BYTES {
            errors.push(json!({ "status_code": 400, "message": "invalid path", "path": path }));
        } else {
            staging.insert(path, None);
        }
    }
    Ok(Json(json!({ "errors": errors })))
}

/// The entry at `path` of `reference`, staging included for a branch.
fn lookup(
    state: &Shared,
    repository: &str,
    reference: &str,
    path: &str,
) -> Result<Arc<Entry>, LakefsError> {
    let lakefs = state.state();
    let repo = lakefs.repo(repository)?;
    repo.entry(&repo.resolve(reference)?, path)
        .ok_or_else(object_not_found)
}

pub(super) async fn stat(
    state: Shared,
    Path((repository, reference)): Path<(String, String)>,
    params: Params,
) -> Result<Json<Value>, LakefsError> {
    let path = object_path(&params)?;
    let entry = lookup(&state, &repository, &reference, path)?;
    let mut stats = model::object_stats(path, &entry, true);
    if !params.bool("user_metadata", true)? {
        stats["metadata"] = json!({});
    }
    Ok(Json(stats))
}

pub(super) async fn get(
    state: Shared,
    Path((repository, reference)): Path<(String, String)>,
    params: Params,
    headers: HeaderMap,
) -> Result<Response, LakefsError> {
    let path = object_path(&params)?;
    let entry = lookup(&state, &repository, &reference, path)?;
    let etag = format!("\"{}\"", entry.checksum);
    if headers
        .get(header::IF_NONE_MATCH)
        .is_some_and(|v| v.as_bytes() == etag.as_bytes())
    {
        return Ok(StatusCode::NOT_MODIFIED.into_response());
    }
    let size = entry.data.len() as u64;
    let range = match headers.get(header::RANGE) {
        None => None,
        Some(value) => match parse_range(value.to_str().unwrap_or_default(), size) {
            RangeAnswer::Part(start, end) => Some((start, end)),
            RangeAnswer::Invalid => {
                return Err(LakefsError::BadRequest("invalid range header".to_owned()));
            }
            RangeAnswer::Unsatisfiable(content_range) => {
                let mut response = (
                    StatusCode::RANGE_NOT_SATISFIABLE,
                    Json(json!({"message": "Requested Range Not Satisfiable"})),
                )
                    .into_response();
                if content_range {
                    response.headers_mut().insert(
                        header::CONTENT_RANGE,
                        header_value(&format!("bytes */{size}")),
                    );
                }
                return Ok(response);
            }
        },
    };
    let (status, body) = match range {
        Some((start, end)) => (
            StatusCode::PARTIAL_CONTENT,
            entry.data.slice(start as usize..=end as usize),
        ),
        None => (StatusCode::OK, entry.data.clone()),
    };
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    let out = response.headers_mut();
    out.insert(header::CONTENT_TYPE, header_value(&entry.content_type));
    out.insert(header::ETAG, header_value(&etag));
    let modified = UNIX_EPOCH + Duration::from_secs(entry.mtime.max(0) as u64);
    out.insert(
        header::LAST_MODIFIED,
        header_value(&httpdate::fmt_http_date(modified)),
    );
    out.insert(
        header::CONTENT_DISPOSITION,
        HeaderValue::from_static("inline"),
    );
    out.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-store, must-revalidate"),
    );
    if let Some((start, end)) = range {
        out.insert(
            header::CONTENT_RANGE,
            header_value(&format!("bytes {start}-{end}/{size}")),
        );
    }
    Ok(response)
}

fn header_value(text: &str) -> HeaderValue {
    HeaderValue::from_str(text)
        .unwrap_or_else(|_| HeaderValue::from_static("application/octet-stream"))
}

#[derive(Debug, PartialEq, Eq)]
enum RangeAnswer {
    Part(u64, u64),
    /// 400: does not match the spec's `^bytes=` pattern.
    Invalid,
    /// 416; with `Content-Range: bytes */SIZE` unless the header did not parse (lists).
    Unsatisfiable(bool),
}

/// One range, as lakeFS's `httputil/range.go`: `S-`, `S-E` (E clamped), `-N`.
fn parse_range(value: &str, size: u64) -> RangeAnswer {
    let Some(spec) = value.strip_prefix("bytes=") else {
        return RangeAnswer::Invalid;
    };
    let Some((start, end)) = spec.split_once('-').filter(|_| !spec.contains(',')) else {
        return RangeAnswer::Unsatisfiable(false);
    };
    let number = |s: &str| s.trim().parse::<u64>().ok();
    match (start.trim().is_empty(), number(start), number(end)) {
        (true, _, Some(n)) if n > 0 && size > 0 => RangeAnswer::Part(size - n.min(size), size - 1),
        (false, Some(s), _) if s >= size => RangeAnswer::Unsatisfiable(true),
        (false, Some(s), None) if end.trim().is_empty() => RangeAnswer::Part(s, size - 1),
        (false, Some(s), Some(e)) if e >= s => RangeAnswer::Part(s, e.min(size - 1)),
        (true, _, Some(_)) => RangeAnswer::Unsatisfiable(true),
        _ if size == 0 => RangeAnswer::Unsatisfiable(true),
        _ => RangeAnswer::Unsatisfiable(false),
    }
}

pub(super) async fn list(
    state: Shared,
    Path((repository, reference)): Path<(String, String)>,
    params: Params,
) -> Result<Json<Value>, LakefsError> {
    let query = listing::Query {
        prefix: params.str("prefix"),
        after: params.str("after"),
        delimiter: params.str("delimiter"),
        amount: params.amount()?,
    };
    let user_metadata = params.bool("user_metadata", true)?;
    let view = {
        let lakefs = state.state();
        let repo = lakefs.repo(&repository)?;
        repo.view(&repo.resolve(&reference)?)
    };
    let (rows, pagination) = listing::page(view.iter().map(|(k, e)| (k.as_str(), e)), &query);
    let results = rows
        .into_iter()
        .map(|row| match row {
            Row::Item(path, entry) => {
                let mut stats = model::object_stats(&path, entry, false);
                if !user_metadata && let Some(object) = stats.as_object_mut() {
                    object.remove("metadata");
                }
                stats
            }
            Row::CommonPrefix(path) => model::common_prefix(&path),
        })
        .collect();
    Ok(Json(json!(Page::<Value> {
        pagination,
        results
    })))
}

#[cfg(test)]
mod tests {
    use super::{RangeAnswer::*, parse_range};

    #[test]
    fn ranges_follow_lakefs() {
        assert_eq!(parse_range("bytes=0-", 10), Part(0, 9));
        assert_eq!(parse_range("bytes=2-4", 10), Part(2, 4));
        assert_eq!(parse_range("bytes=2-400", 10), Part(2, 9));
        assert_eq!(parse_range("bytes=-3", 10), Part(7, 9));
        assert_eq!(parse_range("bytes=-30", 10), Part(0, 9));
        assert_eq!(parse_range("bytes=10-", 10), Unsatisfiable(true));
        assert_eq!(parse_range("bytes=0-", 0), Unsatisfiable(true));
        assert_eq!(parse_range("bytes=0-5", 0), Unsatisfiable(true));
        assert_eq!(parse_range("bytes=0-1,3-4", 10), Unsatisfiable(false));
        assert_eq!(parse_range("bytes=5-2", 10), Unsatisfiable(false));
        assert_eq!(parse_range("items=0-1", 10), Invalid);
    }
}
