//! Wire JSON: request bodies the handlers accept and the response shapes the SDK's pydantic
//! models check (`mtime` an integer, enums exact, required fields always present).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::store::{Commit, Entry, Repo};

/// `RepositoryCreation`.
#[derive(Debug, Deserialize)]
pub(crate) struct RepositoryCreation {
    pub(crate) name: String,
    pub(crate) storage_namespace: String,
    pub(crate) default_branch: Option<String>,
    #[serde(default)]
    pub(crate) read_only: bool,
}

/// `BranchCreation`.
#[derive(Debug, Deserialize)]
pub(crate) struct BranchCreation {
    pub(crate) name: String,
    pub(crate) source: String,
    #[serde(default)]
    pub(crate) force: bool,
}

/// `CommitCreation`.
#[derive(Debug, Deserialize)]
pub(crate) struct CommitCreation {
    pub(crate) message: String,
    #[serde(default)]
    pub(crate) metadata: Option<BTreeMap<String, String>>,
    pub(crate) date: Option<i64>,
    #[serde(default)]
    pub(crate) allow_empty: bool,
    #[serde(default)]
    pub(crate) force: bool,
}

/// `Merge` (the whole body is optional).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct MergeBody {
    #[serde(default)]
    pub(crate) message: Option<String>,
    #[serde(default)]
    pub(crate) metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub(crate) strategy: Option<String>,
    #[serde(default)]
    pub(crate) force: bool,
    #[serde(default)]
    pub(crate) allow_empty: bool,
    #[serde(default)]
    pub(crate) squash_merge: bool,
}

/// `ResetCreation`.
#[derive(Debug, Deserialize)]
pub(crate) struct ResetCreation {
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) path: Option<String>,
}

/// `PathList`.
#[derive(Debug, Deserialize)]
pub(crate) struct PathList {
    pub(crate) paths: Vec<String>,
}

/// `Ref`.
#[derive(Debug, Serialize)]
pub(crate) struct RefJson<'a> {
    pub(crate) id: &'a str,
    pub(crate) commit_id: &'a str,
}

pub(crate) fn repository(repo: &Repo) -> Value {
    json!({
        "id": repo.id,
        "creation_date": repo.creation_date,
        "default_branch": repo.default_branch,
        "storage_namespace": repo.storage_namespace,
        // The real server always fills these; the `lakefs` package reads `storage_id`.
        "storage_id": "",
        "read_only": repo.read_only,
    })
}

pub(crate) fn commit(commit: &Commit) -> Value {
    json!({
        "id": commit.id,
        "parents": commit.parents,
        "committer": commit.committer,
        "message": commit.message,
        "creation_date": commit.creation_date,
        "meta_range_id": commit.meta_range_id,
        "metadata": commit.metadata,
        "generation": commit.generation,
        "version": 1,
    })
}

/// `ObjectStats` of an object. `stat` always reports `metadata` (`{}` at least); listings leave
/// it out for objects without any.
pub(crate) fn object_stats(path: &str, entry: &Entry, always_metadata: bool) -> Value {
    let mut stats = json!({
        "path": path,
        "path_type": "object",
        "physical_address": entry.physical_address,
        "checksum": entry.checksum,
        "mtime": entry.mtime,
        "size_bytes": entry.data.len(),
        "content_type": entry.content_type,
    });
    if always_metadata || !entry.metadata.is_empty() {
        stats["metadata"] = json!(entry.metadata);
    }
    stats
}

/// `ObjectStats` of a common prefix: Go zero values in the required fields.
pub(crate) fn common_prefix(path: &str) -> Value {
    json!({
        "path": path,
        "path_type": "common_prefix",
        "physical_address": "",
        "checksum": "",
        "mtime": 0,
    })
}
