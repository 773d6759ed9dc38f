//! What the lakeFS API answers, as far as perago reads it, and the checks on ids.

use super::LakefsError;
use serde::Deserialize;
use serde_json::{Map, Value};

/// One object as listed.
#[derive(Debug, Clone, Deserialize)]
pub struct ObjectStats {
    /// The key.
    pub path: String,
    /// `object` or `common_prefix`.
    pub path_type: String,
    /// lakeFS's checksum: the hex MD5 of the content only for objects uploaded through the
    /// API (`<md5 of the parts' MD5s>-<parts>` through the S3 gateway in parts, the source's
    /// ETag when linked or imported). Checked for length; never compared with local files.
    #[serde(default)]
    pub checksum: String,
    /// Size in bytes.
    #[serde(default)]
    pub size_bytes: Option<u64>,
}

/// A commit.
#[derive(Debug, Clone, Deserialize)]
pub struct Commit {
    /// The commit id.
    pub id: String,
    /// Parent commit ids.
    #[serde(default)]
    pub parents: Vec<String>,
    /// Commit metadata.
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
}

/// A page's `pagination`.
#[derive(Debug, Deserialize)]
pub struct Pagination {
    /// More pages follow.
    pub has_more: bool,
    /// Where the next page starts.
    pub next_offset: String,
}

/// A page of a listing as lakeFS sends it.
#[derive(Debug, Deserialize)]
pub struct Page<T> {
    /// Its pagination.
    pub pagination: Pagination,
    /// Its entries.
    pub results: Vec<T>,
}

#[derive(Debug, Deserialize)]
pub(super) struct Ref {
    pub(super) commit_id: String,
}

/// Whether `reference` is a lakeFS branch id (`^\w[-\w]*$`, ASCII `\w` as Go's regexp has
/// it), the only refs lakeFS's branch routes take.
pub fn is_branch_id(reference: &str) -> bool {
    crate::shape::is_lakefs_branch_id(reference)
}

/// Whether `id` is a lakeFS commit id: 64 lowercase hex characters (a SHA-256).
pub fn is_commit_id(id: &str) -> bool {
    id.len() == 64 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// `id`, if it is a commit id.
pub(super) fn commit_id(op: &str, id: String) -> Result<String, LakefsError> {
    if is_commit_id(&id) {
        return Ok(id);
    }
    let shown: String = id.chars().take(80).collect();
    Err(LakefsError::Decode {
        op: op.to_owned(),
        message: format!("{shown:?} is not a commit id (64 lowercase hex characters)"),
    })
}
