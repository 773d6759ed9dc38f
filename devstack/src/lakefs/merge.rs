//! Commits, diffs and the three-way merge, per key and by entry identity, as lakeFS's graveler
//! does them (reference §3.2–3.4).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use super::error::LakefsError;
use super::store::{Commit, CommitDraft, Entry, Repo, Snapshot, now, same};

/// What a commit request asks for.
#[derive(Debug, Default)]
pub(crate) struct CommitRequest {
    pub(crate) message: String,
    pub(crate) metadata: BTreeMap<String, String>,
    pub(crate) date: Option<i64>,
    pub(crate) allow_empty: bool,
}

/// Commits the staging of `branch`: 400 `no changes` when nothing is staged or the staged
/// entries do not change anything by identity (unless `allow_empty`).
pub(crate) fn commit(
    repo: &mut Repo,
    branch: &str,
    committer: &str,
    request: CommitRequest,
) -> Result<Arc<Commit>, LakefsError> {
    let head = repo.head(branch)?;
    let staged = &repo.branch(branch)?.staging;
    if staged.is_empty() && !request.allow_empty {
        return Err(LakefsError::BadRequest("no changes".to_owned()));
    }
    let snapshot = super::refs::apply(&head.snapshot, staged);
    let draft = CommitDraft {
        parents: vec![head.id.clone()],
        committer: committer.to_owned(),
        message: request.message,
        creation_date: request.date.unwrap_or_else(now),
        metadata: request.metadata,
        generation: head.generation + 1,
        snapshot: Arc::new(snapshot),
    };
    let commit = draft.seal();
    if commit.meta_range_id == head.meta_range_id && !request.allow_empty {
        return Err(LakefsError::BadRequest("commit: no changes".to_owned()));
    }
    let commit = Arc::new(commit);
    repo.commits.insert(commit.id.clone(), Arc::clone(&commit));
    let branch = repo.branch_mut(branch)?;
    branch.head = commit.id.clone();
    branch.staging.clear();
    tracing::info!(repository = %repo.id, commit = %commit.id, "committed");
    Ok(commit)
}

/// How a merge settles paths both sides changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Strategy {
    /// 409, nothing merged.
    Default,
    DestWins,
    SourceWins,
}

impl Strategy {
    pub(crate) fn parse(raw: Option<&str>) -> Result<Self, LakefsError> {
        match raw {
            None | Some("") => Ok(Self::Default),
            Some("dest-wins") => Ok(Self::DestWins),
            Some("source-wins") => Ok(Self::SourceWins),
            Some(other) => Err(LakefsError::BadRequest(format!(
                "merge strategy '{other}': invalid merge strategy"
            ))),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::DestWins => "dest-wins",
            Self::SourceWins => "source-wins",
        }
    }
}

/// What a merge request asks for.
#[derive(Debug)]
pub(crate) struct MergeRequest {
    pub(crate) message: String,
    pub(crate) metadata: BTreeMap<String, String>,
    pub(crate) strategy: Strategy,
    pub(crate) allow_empty: bool,
    pub(crate) squash: bool,
}

/// Merges the commit `source` names into branch `destination` and returns the merge commit.
/// Never fast-forwards: a two-parent commit is always written.
pub(crate) fn merge(
    repo: &mut Repo,
    source: &str,
    destination: &str,
    committer: &str,
    request: MergeRequest,
) -> Result<Arc<Commit>, LakefsError> {
    if !repo.branch(destination)?.staging.is_empty() {
        return Err(LakefsError::BadRequest(
            "uncommitted changes (dirty branch)".to_owned(),
        ));
    }
    let dest = repo.head(destination)?;
    let src = repo.resolve_commit(source)?;
    let base = merge_base(repo, &src, &dest)
        .ok_or_else(|| LakefsError::NotFound("merge base: not found".to_owned()))?;
    if src.meta_range_id == base.meta_range_id && !request.allow_empty {
        return Err(LakefsError::BadRequest(format!(
            "update branch {destination}: no changes"
        )));
    }
    let snapshot = if dest.meta_range_id == base.meta_range_id {
        Arc::clone(&src.snapshot)
    } else {
        let merged = three_way(
            &src.snapshot,
            &dest.snapshot,
            &base.snapshot,
            request.strategy,
        );
        Arc::new(merged.map_err(|Conflict { path }| {
            tracing::info!(repository = %repo.id, source, destination, %path, base = %base.id, "merge conflict");
            LakefsError::MergeConflict
        })?)
    };
    let mut metadata = request.metadata;
    metadata.insert(
        ".lakefs.merge.strategy".to_owned(),
        request.strategy.name().to_owned(),
    );
    let mut parents = vec![dest.id.clone()];
    if !request.squash {
        parents.push(src.id.clone());
    }
    let message = if request.message.is_empty() {
        format!("Merge '{source}' into '{destination}'")
    } else {
        request.message
    };
    let commit = Arc::new(
        CommitDraft {
            parents,
            committer: committer.to_owned(),
            message,
            creation_date: now(),
            metadata,
            generation: dest.generation.max(src.generation) + 1,
            snapshot,
        }
        .seal(),
    );
    repo.commits.insert(commit.id.clone(), Arc::clone(&commit));
    repo.branch_mut(destination)?.head = commit.id.clone();
    tracing::info!(repository = %repo.id, source, destination, commit = %commit.id, "merged");
    Ok(commit)
}

/// The best common ancestor: among the commits reachable from both, the one with the highest
/// generation (ties broken by the larger id, for determinism).
pub(crate) fn merge_base(repo: &Repo, a: &Commit, b: &Commit) -> Option<Arc<Commit>> {
    let of_a: HashSet<String> = repo
        .ancestors(&a.id, false)
        .into_iter()
        .map(|c| c.id.clone())
        .collect();
    repo.ancestors(&b.id, false)
        .into_iter()
        .filter(|c| of_a.contains(&c.id))
        .max_by(|x, y| {
            x.generation
                .cmp(&y.generation)
                .then_with(|| x.id.cmp(&y.id))
        })
}

/// Both sides of a merge changed a path, and no strategy picks one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}")]
struct Conflict {
    /// The first conflicting path.
    path: String,
}

/// The per-key three-way merge of source `s` and destination `d` from base `b`; on a conflict
/// without a strategy, the first conflicting path.
fn three_way(
    s: &Snapshot,
    d: &Snapshot,
    b: &Snapshot,
    strategy: Strategy,
) -> Result<Snapshot, Conflict> {
    let keys: BTreeSet<&String> = s.keys().chain(d.keys()).chain(b.keys()).collect();
    let mut out = Snapshot::new();
    for key in keys {
        let (sv, dv, bv) = (s.get(key), d.get(key), b.get(key));
        let pick = if same(sv, dv) || same(dv, bv) {
            sv
        } else if same(sv, bv) {
            dv
        } else {
            match strategy {
                Strategy::Default => return Err(Conflict { path: key.clone() }),
                Strategy::DestWins => dv,
                Strategy::SourceWins => sv,
            }
        };
        if let Some(entry) = pick {
            out.insert(key.clone(), Arc::clone(entry));
        }
    }
    Ok(out)
}

/// The kind of one diff row.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Change {
    Added,
    Removed,
    Changed,
}

impl Change {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Added => "added",
            Self::Removed => "removed",
            Self::Changed => "changed",
        }
    }
}

/// Paths that differ by identity from `left` to `right`, in path order, with the entry that
/// describes the change (the right one, or the left one for a removal).
pub(crate) fn diff<'a>(
    left: &'a Snapshot,
    right: &'a Snapshot,
) -> Vec<(&'a str, Change, &'a Arc<Entry>)> {
    let keys: BTreeSet<&String> = left.keys().chain(right.keys()).collect();
    keys.into_iter()
        .filter_map(|key| match (left.get(key), right.get(key)) {
            (None, Some(r)) => Some((key.as_str(), Change::Added, r)),
            (Some(l), None) => Some((key.as_str(), Change::Removed, l)),
            (Some(l), Some(r)) if !l.same_identity(r) => Some((key.as_str(), Change::Changed, r)),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use super::{Strategy, three_way};
    use crate::lakefs::store::{Entry, Snapshot};

    fn entry(content: &str) -> Arc<Entry> {
        Arc::new(Entry {
            // A fresh address per entry, even for equal content: identity ignores it.
            physical_address: format!("mem://x/{}", uuid::Uuid::new_v4()),
            checksum: format!("md5-of-{content}"),
            mtime: 0,
            content_type: "application/octet-stream".to_owned(),
            metadata: BTreeMap::new(),
            data: axum::body::Bytes::from(content.to_owned()),
        })
    }

    fn snapshot(pairs: &[(&str, &str)]) -> Snapshot {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), entry(v)))
            .collect()
    }

    fn contents(s: &Snapshot) -> Vec<(String, String)> {
        s.iter()
            .map(|(k, e)| (k.clone(), String::from_utf8_lossy(&e.data).into_owned()))
            .collect()
    }

    #[test]
    fn each_key_takes_the_side_that_changed_it() {
        let base = snapshot(&[
            ("same", "0"),
            ("src", "0"),
            ("dst", "0"),
            ("both-equal", "0"),
            ("src-del", "0"),
            ("dst-del", "0"),
        ]);
        let src = snapshot(&[
            ("same", "0"),
            ("src", "1"),
            ("dst", "0"),
            ("both-equal", "2"),
            ("dst-del", "0"),
            ("src-add", "n"),
        ]);
        let dst = snapshot(&[
            ("same", "0"),
            ("src", "0"),
            ("dst", "1"),
            ("both-equal", "2"),
            ("src-del", "0"),
            ("dst-add", "m"),
        ]);
        let merged = three_way(&src, &dst, &base, Strategy::Default).unwrap();
        let expected = [
            ("both-equal", "2"),
            ("dst", "1"),
            ("dst-add", "m"),
            ("same", "0"),
            ("src", "1"),
            ("src-add", "n"),
        ];
        assert_eq!(
            contents(&merged),
            expected.map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
    }

    #[test]
    fn both_sides_changing_a_key_differently_conflicts_unless_a_strategy_settles_it() {
        let base = snapshot(&[("k", "0")]);
        let src = snapshot(&[("k", "s")]);
        let dst = snapshot(&[]);
        assert_eq!(
            three_way(&src, &dst, &base, Strategy::Default).unwrap_err(),
            super::Conflict {
                path: "k".to_owned()
            }
        );
        assert!(
            three_way(&src, &dst, &base, Strategy::DestWins)
                .unwrap()
                .is_empty()
        );
        let merged = three_way(&src, &dst, &base, Strategy::SourceWins).unwrap();
        assert_eq!(contents(&merged), [("k".to_owned(), "s".to_owned())]);
        let added_twice = three_way(
            &snapshot(&[("n", "a")]),
            &snapshot(&[("n", "b")]),
            &Snapshot::new(),
            Strategy::Default,
        );
        assert!(added_twice.is_err());
    }
}
