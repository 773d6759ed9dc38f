//! The lakeFS data model in memory: repositories hold immutable commits (each with a full
//! snapshot `path -> entry`) and branches (a head commit plus staged changes). Reading a branch
//! layers its staging over the head snapshot; reading a commit reads its snapshot.
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
}

/// A ref resolved for reading: a commit, plus the branch whose staging is layered over it.
#[derive(Debug)]
pub(crate) struct Resolved {
    pub(crate) commit: Arc<Commit>,
    pub(crate) staging_of: Option<String>,
}

impl Repo {
    pub(crate) fn branch(&self, name: &str) -> Result<&Branch, LakefsError> {
        self.branches
            .get(name)
            .ok_or_else(|| LakefsError::NotFound(format!("branch '{name}' not found")))
    }

    pub(crate) fn branch_mut(&mut self, name: &str) -> Result<&mut Branch, LakefsError> {
        self.branches
            .get_mut(name)
            .ok_or_else(|| LakefsError::NotFound(format!("branch '{name}' not found")))
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

    /// Resolves a ref as lakeFS does: a full commit id, a branch, then a unique commit-id
    /// prefix; then the modifiers `~N` (first parent N times), `^N` (Nth parent), `@` (branch
    /// without staging) and `$` (branch with staging, the default for a bare branch name).
    pub(crate) fn resolve(&self, reference: &str) -> Result<Resolved, LakefsError> {
        let split = reference
            .find(['~', '^', '@', '$'])
            .unwrap_or(reference.len());
        let (base, mut modifiers) = reference.split_at(split);
        if base.is_empty() || base.chars().any(char::is_whitespace) {
            return Err(LakefsError::BadRequest(format!(
                "ref '{reference}': invalid value: validation error"
            )));
        }
        let mut resolved = if let Some(commit) = self.commits.get(base).filter(|_| base.len() == 64)
        {
            Resolved {
                commit: Arc::clone(commit),
                staging_of: None,
            }
        } else if let Some(branch) = self.branches.get(base) {
            Resolved {
                commit: self.commit(&branch.head)?,
                staging_of: Some(base.to_owned()),
            }
        } else {
            Resolved {
                commit: self.commit_by_prefix(base, reference)?,
                staging_of: None,
            }
        };
        while let Some(modifier) = modifiers.chars().next() {
            let rest = &modifiers[1..];
            let digits = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            let count: usize = match &rest[..digits] {
                "" => 1,
                n => n.parse().map_err(|_| {
                    LakefsError::BadRequest(format!("ref '{reference}': invalid modifier"))
                })?,
            };
            match modifier {
                '@' | '$' if resolved.staging_of.is_none() || digits > 0 => {
                    return Err(LakefsError::BadRequest(format!(
                        "ref '{reference}': invalid modifier"
                    )));
                }
                '@' => resolved.staging_of = None,
                '$' => {}
                '~' => {
                    for _ in 0..count {
                        resolved.commit = self.parent(&resolved.commit, 1, reference)?;
                    }
                    resolved.staging_of = None;
                }
                '^' => {
                    if count > 0 {
                        resolved.commit = self.parent(&resolved.commit, count, reference)?;
                    }
                    resolved.staging_of = None;
                }
                _ => {
                    return Err(LakefsError::BadRequest(format!(
                        "ref '{reference}': invalid modifier"
                    )));
                }
            }
            modifiers = &rest[digits..];
        }
        Ok(resolved)
    }

    /// Resolves a ref that must name a commit (branch sources, merge sources, diffs).
    pub(crate) fn resolve_commit(&self, reference: &str) -> Result<Arc<Commit>, LakefsError> {
        if reference.ends_with('$') {
            return Err(LakefsError::BadRequest(format!(
                "ref '{reference}': staging ref not accepted here: validation error"
            )));
        }
        Ok(self.resolve(reference)?.commit)
    }

    fn commit_by_prefix(&self, prefix: &str, reference: &str) -> Result<Arc<Commit>, LakefsError> {
        let not_found = || LakefsError::NotFound(format!("{reference}: not found"));
        if !prefix.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(not_found());
        }
        let mut matches = self.commits.values().filter(|c| c.id.starts_with(prefix));
        match (matches.next(), matches.next()) {
            (Some(commit), None) => Ok(Arc::clone(commit)),
            _ => Err(not_found()),
        }
    }

    fn parent(
        &self,
        commit: &Commit,
        nth: usize,
        reference: &str,
    ) -> Result<Arc<Commit>, LakefsError> {
        let id = commit
            .parents
            .get(nth - 1)
            .ok_or_else(|| LakefsError::NotFound(format!("{reference}: not found")))?;
        self.commit(id)
    }

    /// The objects a resolved ref shows: the commit's snapshot with the branch's staging on top.
    pub(crate) fn view(&self, resolved: &Resolved) -> Arc<Snapshot> {
        let staging = resolved
            .staging_of
            .as_deref()
            .and_then(|b| self.branches.get(b))
            .map(|b| &b.staging)
            .filter(|s| !s.is_empty());
        let Some(staging) = staging else {
            return Arc::clone(&resolved.commit.snapshot);
        };
        Arc::new(apply(&resolved.commit.snapshot, staging))
    }

    /// The objects of a branch, staging included.
    pub(crate) fn branch_view(&self, branch: &str) -> Result<Arc<Snapshot>, LakefsError> {
        let head = self.head(branch)?;
        Ok(self.view(&Resolved {
            commit: head,
            staging_of: Some(branch.to_owned()),
        }))
    }

    /// Every ancestor of `id` (itself included).
    pub(crate) fn ancestors(&self, id: &str, first_parent: bool) -> Vec<Arc<Commit>> {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        let mut stack = vec![id.to_owned()];
        while let Some(id) = stack.pop() {
            if !seen.insert(id.clone()) {
                continue;
            }
            let Some(commit) = self.commits.get(&id) else {
                continue;
            };
            let parents = if first_parent {
                &commit.parents[..commit.parents.len().min(1)]
            } else {
                &commit.parents[..]
            };
            stack.extend(parents.iter().cloned());
            out.push(Arc::clone(commit));
        }
        out
    }
}

/// `base` with `staging` applied (tombstones delete).
pub(crate) fn apply(base: &Snapshot, staging: &BTreeMap<String, Option<Arc<Entry>>>) -> Snapshot {
    let mut out = base.clone();
    for (path, entry) in staging {
        match entry {
            Some(entry) => out.insert(path.clone(), Arc::clone(entry)),
            None => out.remove(path),
        };
    }
    out
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
