//! Refs and what they show: resolving a ref name to a commit (plus the branch whose staging a
//! read layers over it), the snapshot a ref shows, and commit ancestry.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use super::error::LakefsError;
use super::store::{Commit, Entry, Repo, Snapshot};

/// A ref resolved for reading: a commit, plus the branch whose staging is layered over it.
#[derive(Debug)]
pub(crate) struct Resolved {
    pub(crate) commit: Arc<Commit>,
    pub(crate) staging_of: Option<String>,
}

impl Repo {
    /// Resolves a ref as lakeFS does: a full commit id, a branch, a tag, then a unique
    /// commit-id prefix; then the modifiers `~N` (first parent N times), `^N` (Nth parent), `@` (branch
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
        } else if let Some(tagged) = self.tags.get(base) {
            Resolved {
                commit: self.commit(tagged)?,
                staging_of: None,
            }
        } else {
            Resolved {
                commit: self.commit_by_prefix(base, reference)?,
                staging_of: None,
            }
        };
        while let Some(modifier) = modifiers.chars().next() {
            // Only the first modifier is known to be ASCII; later ones can be anything.
            let rest = &modifiers[modifier.len_utf8()..];
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

    /// The log of `id` in lakeFS's order (graveler's commit iterator): a walk that always takes
    /// the queued commit of latest creation date (ties: larger id first) and queues its
    /// parents (only the first with `first_parent`) once each. A commit never comes before a
    /// child of it, even one made in the same second.
    pub(crate) fn log(&self, id: &str, first_parent: bool) -> Vec<Arc<Commit>> {
        let mut queued = HashSet::new();
        let mut heap = std::collections::BinaryHeap::new();
        let mut out = Vec::new();
        if let Some(commit) = self.commits.get(id) {
            queued.insert(commit.id.clone());
            heap.push((commit.creation_date, commit.id.clone()));
        }
        while let Some((_, id)) = heap.pop() {
            let Some(commit) = self.commits.get(&id) else {
                continue;
            };
            let parents = if first_parent {
                &commit.parents[..commit.parents.len().min(1)]
            } else {
                &commit.parents[..]
            };
            for parent in parents {
                if let Some(p) = self.commits.get(parent)
                    && queued.insert(p.id.clone())
                {
                    heap.push((p.creation_date, p.id.clone()));
                }
            }
            out.push(Arc::clone(commit));
        }
        out
    }

    /// The entry at `path` as a resolved ref shows it, without building the whole view.
    pub(crate) fn entry(&self, resolved: &Resolved, path: &str) -> Option<Arc<Entry>> {
        let staged = resolved
            .staging_of
            .as_deref()
            .and_then(|b| self.branches.get(b))
            .and_then(|b| b.staging.get(path));
        match staged {
            Some(staged) => staged.clone(),
            None => resolved.commit.snapshot.get(path).cloned(),
        }
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

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};
    use std::sync::Arc;

    use crate::lakefs::store::{Branch, CommitDraft, Repo, Snapshot};

    fn repo() -> (Repo, String, String) {
        let draft = |parents: Vec<String>, generation| CommitDraft {
            parents,
            committer: String::new(),
            message: "m".to_owned(),
            creation_date: 0,
            metadata: BTreeMap::new(),
            generation,
            snapshot: Arc::new(Snapshot::new()),
        };
        let root = Arc::new(draft(Vec::new(), 1).seal());
        let child = Arc::new(draft(vec![root.id.clone()], 2).seal());
        let branch = Branch {
            head: child.id.clone(),
            staging: BTreeMap::new(),
        };
        let repo = Repo {
            id: "repo".to_owned(),
            storage_namespace: "mem://x".to_owned(),
            default_branch: "main".to_owned(),
            creation_date: 0,
            read_only: false,
            commits: HashMap::from([
                (root.id.clone(), Arc::clone(&root)),
                (child.id.clone(), Arc::clone(&child)),
            ]),
            branches: BTreeMap::from([("main".to_owned(), branch)]),
            tags: BTreeMap::new(),
            protection: Vec::new(),
        };
        (repo, root.id.clone(), child.id.clone())
    }

    #[test]
    fn refs_resolve_by_id_branch_prefix_and_modifiers() {
        let (repo, root, child) = repo();
        let id = |r: &str| repo.resolve(r).map(|x| x.commit.id.clone());
        assert_eq!(id("main").unwrap(), child);
        assert_eq!(id(&child).unwrap(), child);
        assert_eq!(id(&root[..10]).unwrap(), root);
        assert_eq!(id("main~1").unwrap(), root);
        assert_eq!(id("main~").unwrap(), root);
        assert_eq!(id("main^1").unwrap(), root);
        assert_eq!(id("main^0").unwrap(), child);
        assert!(repo.resolve("main").unwrap().staging_of.is_some());
        assert!(repo.resolve("main@").unwrap().staging_of.is_none());
        assert!(repo.resolve_commit("main$").is_err());
        for bad in [
            "main~2", "main^2", "nope", "", "@", "main@@", "main~1@", "main x",
        ] {
            assert!(id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn tags_resolve_after_branches_and_branch_routes_refuse_what_is_not_a_branch_id() {
        let (mut repo, root, child) = repo();
        repo.tags.insert("v1.0".to_owned(), root.clone());
        repo.tags.insert("main".to_owned(), root.clone());
        let id = |repo: &crate::lakefs::store::Repo, r: &str| {
            repo.resolve(r).map(|x| x.commit.id.clone())
        };
        assert_eq!(id(&repo, "v1.0").unwrap(), root);
        assert!(repo.resolve("v1.0").unwrap().staging_of.is_none());
        // A branch wins over a tag of the same name, as lakeFS resolves branches first.
        assert_eq!(id(&repo, "main").unwrap(), child);
        for not_a_branch_id in ["main~1", "main@", "v1.0", "-main", "a.b", ""] {
            let refused = repo.branch(not_a_branch_id).unwrap_err();
            assert_eq!(
                refused.status(),
                axum::http::StatusCode::BAD_REQUEST,
                "{not_a_branch_id:?}: {refused}"
            );
        }
        assert_eq!(
            repo.branch("nope").unwrap_err().status(),
            axum::http::StatusCode::NOT_FOUND
        );
    }

    #[test]
    fn arbitrary_ref_strings_never_panic() {
        let (repo, _, child) = repo();
        let pieces = [
            "main",
            &child[..6],
            "~",
            "^",
            "@",
            "$",
            "é",
            "9",
            "99999999999999999999999",
            " ",
            "",
        ];
        for a in pieces {
            for b in pieces {
                for c in pieces {
                    let _ = repo.resolve(&format!("{a}{b}{c}"));
                }
            }
        }
    }
}
