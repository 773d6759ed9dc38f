//! `PUT .../branches/{b}/staging/backing?path=` (`linkPhysicalAddress`): stages an object that
//! already lives in the object store, with the checksum the client gives, taken as given. This
//! is how objects get checksums that are not their content's MD5 on the real server: a linked
//! or imported object carries its source's ETag, and an S3-gateway multipart upload the MD5 of
//! its parts' MD5s (the multipart ETag without its `-<parts>`, pkg/gateway/operations/postobject.go).
//!
//! The real server links any address outside the repository's storage namespace without
//! reading it, and an address inside only when `GET .../staging/backing` signed it. devstack
//! has no object store to write to, so it links the addresses it holds bytes for: those of
//! objects stored under another repository's namespace; everything else is a 400.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::Path;
use axum::http::{HeaderMap, header};
use serde::Deserialize;
use serde_json::Value;

use super::super::error::LakefsError;
use super::super::model;
use super::super::multipart::OCTET_STREAM;
use super::super::store::{Entry, State, now};
use super::{Params, Shared, json_body};

#[derive(Debug, Deserialize)]
struct StagingLocation {
    #[serde(default)]
    physical_address: Option<String>,
}

/// The request body (`StagingMetadata`); `staging`, `checksum` and `size_bytes` are required.
#[derive(Debug, Deserialize)]
struct StagingMetadata {
    staging: StagingLocation,
    checksum: String,
    size_bytes: i64,
    #[serde(default)]
    user_metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    content_type: Option<String>,
    #[serde(default)]
    mtime: Option<i64>,
    #[serde(default)]
    force: Option<bool>,
}

/// The bytes devstack holds at `address`: any object version of any repository stored there.
fn held_at(state: &State, address: &str) -> Option<Bytes> {
    state.repos.values().find_map(|repo| {
        let staged = repo
            .branches
            .values()
            .flat_map(|b| b.staging.values().flatten());
        let committed = repo.commits.values().flat_map(|c| c.snapshot.values());
        staged
            .chain(committed)
            .find(|e| e.physical_address == address)
            .map(|e| e.data.clone())
    })
}

pub(super) async fn link(
    state: Shared,
    Path((repository, branch)): Path<(String, String)>,
    params: Params,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Value>, LakefsError> {
    let path = super::objects::object_path(&params)?.to_owned();
    let request: StagingMetadata = json_body(&body)?;
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
    let mut lakefs = state.state();
    let namespace = lakefs.repo(&repository)?.storage_namespace.clone();
    let address = request.staging.physical_address.unwrap_or_default();
    // The real server's `normalizePhysicalAddress`: under `<namespace>/data/` is relative, and
    // must carry the signature `GET .../staging/backing` gives (devstack never gives one).
    let data_prefix = format!("{}/data/", namespace.trim_end_matches('/'));
    if address.starts_with(&data_prefix) {
        return Err(LakefsError::BadRequest(
            "address is not signed: link address invalid".to_owned(),
        ));
    }
    // The real server strips quotes and spaces from the ETag it is given.
    let checksum = request
        .checksum
        .trim_matches(|c: char| c == '"' || c.is_whitespace())
        .to_owned();
    if checksum.is_empty() {
        return Err(LakefsError::BadRequest("checksum is required".to_owned()));
    }
    let data = held_at(&lakefs, &address).ok_or_else(|| {
        LakefsError::BadRequest(format!(
            "devstack holds no object at physical address {address:?}: it links only the address of an object stored under another repository's namespace"
        ))
    })?;
    if u64::try_from(request.size_bytes).ok() != Some(data.len() as u64) {
        return Err(LakefsError::BadRequest(format!(
            "size_bytes is {}, but the object at {address:?} has {} bytes",
            request.size_bytes,
            data.len()
        )));
    }
    let repo = lakefs.repo_mut(&repository)?;
    repo.branch(&branch)?;
    if repo.read_only && !request.force.unwrap_or(false) {
        return Err(LakefsError::Forbidden("read-only repository".to_owned()));
    }
    if if_none_match && repo.branch_view(&branch)?.contains_key(&path) {
        return Err(LakefsError::PreconditionFailed(
            "path already exists".to_owned(),
        ));
    }
    let entry = Arc::new(Entry {
        physical_address: address,
        checksum,
        mtime: request.mtime.unwrap_or_else(now),
        content_type: request
            .content_type
            .filter(|c| !c.is_empty())
            .unwrap_or_else(|| OCTET_STREAM.to_owned()),
        metadata: request.user_metadata.unwrap_or_default(),
        data,
    });
    let stats = model::object_stats(&path, &entry, true);
    tracing::debug!(%repository, %branch, %path, "physical address linked");
    repo.branch_mut(&branch)?.staging.insert(path, Some(entry));
    Ok(Json(stats))
}
