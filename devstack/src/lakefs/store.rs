//! The lakeFS data model in memory: repositories hold immutable commits (each with a full
//! snapshot `path -> entry`) and branches (a head commit plus staged changes). Reading a branch
//! layers its staging over the head snapshot; reading a commit reads its snapshot (see `refs`).
//!
//! Everything lives behind one mutex in [`Lakefs`]: every operation is short and synchronous, so
//! serializing them gives the same results as the real server's per-branch retries.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use sha2::{Digest, Sha256};

use super::error::LakefsError;
use super::server::Credentials;

/// One object version: its bytes and the stats the API reports.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) physical_address: String,
    pub(crate) checksum: String,
    pub(crate) mtime: i64,
    pub(crate) content_type: String,
    pub(crate) metadata: BTreeMap<String, String>,
    pub(crate) data: Bytes,
}

impl Entry {
    /// lakeFS decides "did it change" by identity = (size, checksum, user metadata, content
    /// type); the physical address and mtime are not part of it, so re-uploading the same
    /// bytes is no change.
    pub(crate) fn same_identity(&self, other: &Entry) -> bool {
        self.data.len() == other.data.len()
            && self.checksum == other.checksum
            && self.content_type == other.content_type
            && self.metadata == other.metadata
    }
}

/// Identity comparison of optional entries (absent equals absent).
pub(crate) fn same(a: Option<&Arc<Entry>>, b: Option<&Arc<Entry>>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a.same_identity(b),
        _ => false,
    }
}

/// The objects of a commit, ordered byte-wise by path (Rust's `String` order).
pub(crate) type Snapshot = BTreeMap<String, Arc<Entry>>;

/// An immutable commit.
#[derive(Debug)]
pub(crate) struct Commit {
    pub(crate) id: String,
    pub(crate) parents: Vec<String>,
    pub(crate) committer: String,
    pub(crate) message: String,
    pub(crate) creation_date: i64,
    pub(crate) metadata: BTreeMap<String, String>,
    pub(crate) generation: u64,
    pub(crate) meta_range_id: String,
    pub(crate) snapshot: Arc<Snapshot>,
}

/// What a new commit is made of; [`CommitDraft::seal`] derives the content-addressed ids.
#[derive(Debug)]
pub(crate) struct CommitDraft {
    pub(crate) parents: Vec<String>,
    pub(crate) committer: String,
    pub(crate) message: String,
    pub(crate) creation_date: i64,
    pub(crate) metadata: BTreeMap<String, String>,
    pub(crate) generation: u64,
    pub(crate) snapshot: Arc<Snapshot>,
}

impl CommitDraft {
    pub(crate) fn seal(self) -> Commit {
        let meta_range_id = meta_range_id(&self.snapshot);
        let mut hash = Sha256::new();
        for field in [&self.committer, &self.message, &meta_range_id] {
            absorb(&mut hash, field.as_bytes());
        }
        for parent in &self.parents {
            absorb(&mut hash, parent.as_bytes());
        }
        for (key, value) in &self.metadata {
            absorb(&mut hash, key.as_bytes());
            absorb(&mut hash, value.as_bytes());
        }
        absorb(&mut hash, &self.creation_date.to_be_bytes());
        absorb(&mut hash, &self.generation.to_be_bytes());
        Commit {
            id: hex(&hash.finalize()),
            parents: self.parents,
            committer: self.committer,
            message: self.message,
            creation_date: self.creation_date,
            metadata: self.metadata,
            generation: self.generation,
            meta_range_id,
            snapshot: self.snapshot,
        }
    }
}

/// A content hash of the snapshot's (path, identity) pairs, so that equal contents have equal
/// ids, as the real metarange ids do: the "no changes" rules compare these.
pub(crate) fn meta_range_id(snapshot: &Snapshot) -> String {
    let mut hash = Sha256::new();
    for (path, entry) in snapshot {
        absorb(&mut hash, path.as_bytes());
        absorb(&mut hash, &(entry.data.len() as u64).to_be_bytes());
        absorb(&mut hash, entry.checksum.as_bytes());
        absorb(&mut hash, entry.content_type.as_bytes());
        for (key, value) in &entry.metadata {
            absorb(&mut hash, key.as_bytes());
            absorb(&mut hash, value.as_bytes());
        }
    }
    hex(&hash.finalize())
}

/// Length-prefixed, so that field boundaries cannot be shifted to forge equal hashes.
fn absorb(hash: &mut Sha256, bytes: &[u8]) {
    hash.update((bytes.len() as u64).to_be_bytes());
    hash.update(bytes);
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A branch: its head commit and its uncommitted changes (`None` = tombstone).
#[derive(Debug)]
pub(crate) struct Branch {
    pub(crate) head: String,
    pub(crate) staging: BTreeMap<String, Option<Arc<Entry>>>,
}

/// A repository with its commits and branches.
#[derive(Debug)]
pub(crate) struct Repo {
    pub(crate) id: String,
    pub(crate) storage_namespace: String,
    pub(crate) default_branch: String,
    pub(crate) creation_date: i64,
    pub(crate) read_only: bool,
    pub(crate) commits: HashMap<String, Arc<Commit>>,
    pub(crate) branches: BTreeMap<String, Branch>,
    /// Tags: name -> commit id.
    pub(crate) tags: BTreeMap<String, String>,
    /// Branch protection rules (`/settings/branch_protection`): the patterns, each blocking
    /// staging writes and commits on the branches it matches, as every rule set through the
    /// API does on the real server.
    pub(crate) protection: Vec<String>,
}

/// Whether `pattern` matches all of `name`: `*` any run of characters, `?` one character,
/// anything else itself (the wildcards the real API documents for a protection rule).
pub(crate) fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // The classic two-pointer match with backtracking to the last `*`.
    let (mut i, mut j, mut star, mut mark) = (0, 0, None, 0);
    while j < n.len() {
        if i < p.len() && (p[i] == '?' || (p[i] != '*' && p[i] == n[j])) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some(i);
            mark = j;
            i += 1;
        } else if let Some(s) = star {
            i = s + 1;
            mark += 1;
            j = mark;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|c| *c == '*')
}

/// `^\w[-\w]*$` with ASCII `\w`, the branch id every branch route validates first.
pub(crate) fn valid_branch_id(id: &str) -> bool {
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut bytes = id.bytes();
    bytes.next().is_some_and(word) && bytes.all(|b| word(b) || b == b'-')
}

/// The 400 of a branch id that is not one.
pub(crate) fn invalid_branch() -> LakefsError {
    LakefsError::BadRequest(
        "argument branch: branch id: invalid value: validation error: branch id must consist of \
         letters, digits, underscores and dashes, and cannot start with a dash"
            .to_owned(),
    )
}

impl Repo {
    /// The branch `name`: 400 if `name` is not a branch id (`main~1`, `v1.0`: the real server
    /// validates the id on every branch route before it looks), 404 if there is none.
    pub(crate) fn branch(&self, name: &str) -> Result<&Branch, LakefsError> {
        if !valid_branch_id(name) {
            return Err(invalid_branch());
        }
        self.branches
            .get(name)
            .ok_or_else(|| LakefsError::NotFound(format!("branch '{name}' not found")))
    }

    pub(crate) fn branch_mut(&mut self, name: &str) -> Result<&mut Branch, LakefsError> {
        if !valid_branch_id(name) {
            return Err(invalid_branch());
        }
        self.branches
            .get_mut(name)
            .ok_or_else(|| LakefsError::NotFound(format!("branch '{name}' not found")))
    }

    /// 403 if a branch protection rule covers `branch`: `commit` says what was refused
    /// (`cannot commit to protected branch`), else a staging write
    /// (`cannot write to protected branch`), the real server's texts.
    pub(crate) fn unprotected(&self, branch: &str, commit: bool) -> Result<(), LakefsError> {
        if !self.protection.iter().any(|p| glob_match(p, branch)) {
            return Ok(());
        }
        Err(LakefsError::Forbidden(
            if commit {
                "cannot commit to protected branch"
            } else {
                "cannot write to protected branch"
            }
            .to_owned(),
        ))
    }

    pub(crate) fn commit(&self, id: &str) -> Result<Arc<Commit>, LakefsError> {
        self.commits
            .get(id)
            .cloned()
            .ok_or_else(|| LakefsError::NotFound("commit not found".to_owned()))
    }

    pub(crate) fn head(&self, branch: &str) -> Result<Arc<Commit>, LakefsError> {
        self.commit(&self.branch(branch)?.head)
    }
}

/// All repositories, and every storage namespace ever used (the real server refuses to reuse
/// one, even after the repository is deleted).
#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) repos: BTreeMap<String, Repo>,
    pub(crate) namespaces: HashSet<String>,
}

impl State {
    pub(crate) fn repo(&self, id: &str) -> Result<&Repo, LakefsError> {
        self.repos
            .get(id)
            .ok_or_else(|| LakefsError::NotFound("repository not found".to_owned()))
    }

    pub(crate) fn repo_mut(&mut self, id: &str) -> Result<&mut Repo, LakefsError> {
        self.repos
            .get_mut(id)
            .ok_or_else(|| LakefsError::NotFound("repository not found".to_owned()))
    }
}

/// The server's shared state: credentials and the data behind one lock.
#[derive(Debug)]
pub(crate) struct Lakefs {
    pub(crate) credentials: Credentials,
    state: Mutex<State>,
}

impl Lakefs {
    pub(crate) fn new(credentials: Credentials) -> Self {
        Self {
            credentials,
            state: Mutex::new(State::default()),
        }
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        // A panicking handler leaves consistent data: every mutation is a single insert/replace.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The committer name of API calls: the user `/user` reports.
    pub(crate) fn committer(&self) -> &str {
        USER_ID
    }
}

/// The one user of the dev server (the real quickstart user is also named this way).
pub(crate) const USER_ID: &str = "admin";

/// Seconds since the epoch, as lakeFS timestamps are.
pub(crate) fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

#[cfg(test)]
mod tests {
    use super::glob_match;

    #[test]
    fn protection_patterns_match_whole_names_with_star_and_question_mark() {
        for (pattern, name) in [
            ("*", "perago-staging-1"),
            ("perago-*", "perago-staging-1"),
            ("main", "main"),
            ("rel?", "rel1"),
            ("*-staging-*", "perago-staging-x"),
            ("a*b*c", "aXbYc"),
        ] {
            assert!(glob_match(pattern, name), "{pattern} ~ {name}");
        }
        for (pattern, name) in [
            ("main", "main2"),
            ("perago-*", "main"),
            ("rel?", "rel"),
            ("a*b*c", "aXbY"),
            ("", "x"),
        ] {
            assert!(!glob_match(pattern, name), "{pattern} !~ {name}");
        }
    }
}
