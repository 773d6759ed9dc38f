//! Branches, commits, merges, the log, tags and repository settings.

use super::{
    Commit, LakefsClient, LakefsError, LogPage, MAX_LISTED, MAX_PAGE, MAX_PROTECTION_RULES,
    check_log_page,
    client::{Body, REQUEST_TIMEOUT},
    is_branch_id,
    models::{Page, Ref, commit_id},
};
use crate::url::encode_segment as segment;
use reqwest::Method;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use std::time::Duration;

impl LakefsClient {
    /// The commit a ref points at now: a branch, a commit id, a tag, or an expression
    /// (`main~1`, `main@`, `v1.0~2`). A branch id is read from its branch (then, on a 404,
    /// as a commit or tag of that name); anything else from `GET /commits/{ref}`, which lakeFS
    /// resolves for every ref: its branch routes answer 400 to what is not a branch id.
    pub async fn resolve_commit(&self, repo: &str, reference: &str) -> Result<String, LakefsError> {
        let op = format!("resolve {repo}@{reference}");
        if !is_branch_id(reference) {
            return Ok(self.get_commit(repo, reference).await?.id);
        }
        let branch = format!("{}/branches/{}", Self::repo_path(repo), segment(reference));
        let id = match self.read(&op, Method::GET, &branch, &[]).await {
            Ok(bytes) => Self::decode::<Ref>(&op, &bytes)?.commit_id,
            Err(e) if e.is_not_found() => self.get_commit(repo, reference).await?.id,
            Err(e) => return Err(e),
        };
        commit_id(&op, id)
    }

    /// The commit `reference` names (`GET /commits/{ref}`); its id is checked.
    pub async fn get_commit(&self, repo: &str, reference: &str) -> Result<Commit, LakefsError> {
        let op = format!("get commit {repo}@{reference}");
        let path = format!("{}/commits/{}", Self::repo_path(repo), segment(reference));
        let bytes = self.read(&op, Method::GET, &path, &[]).await?;
        let commit = Self::decode::<Commit>(&op, &bytes)?;
        commit_id(&op, commit.id.clone())?;
        Ok(commit)
    }

    /// Creates `branch` from `source` (a commit id or branch).
    pub async fn create_branch(
        &self,
        repo: &str,
        branch: &str,
        source: &str,
    ) -> Result<(), LakefsError> {
        let op = format!("create branch {repo}/{branch}");
        let path = format!("{}/branches", Self::repo_path(repo));
        let body = Body::Json(json!({"name": branch, "source": source}));
        self.send(&op, Method::POST, &path, &[], Some(body), REQUEST_TIMEOUT)
            .await
            .map(drop)
    }

    /// Commits `branch` with `message` and `metadata`.
    pub async fn commit(
        &self,
        repo: &str,
        branch: &str,
        message: &str,
        metadata: &Map<String, Value>,
    ) -> Result<Commit, LakefsError> {
        let op = format!("commit {repo}/{branch}");
        let path = format!(
            "{}/branches/{}/commits",
            Self::repo_path(repo),
            segment(branch)
        );
        let body = Body::Json(json!({"message": message, "metadata": metadata}));
        let (_, bytes) = self
            .send(&op, Method::POST, &path, &[], Some(body), REQUEST_TIMEOUT)
            .await?;
        let commit: Commit = Self::decode(&op, &bytes)?;
        commit_id(&op, commit.id.clone())?;
        Ok(commit)
    }

    /// Merges `source` into `destination` within `timeout`; returns the merge commit id.
    pub async fn merge(
        &self,
        repo: &str,
        source: &str,
        destination: &str,
        message: &str,
        metadata: &Map<String, Value>,
        timeout: Duration,
    ) -> Result<String, LakefsError> {
        let op = format!("merge {repo}/{source} into {destination}");
        let path = format!(
            "{}/refs/{}/merge/{}",
            Self::repo_path(repo),
            segment(source),
            segment(destination)
        );
        let body = Body::Json(json!({"message": message, "metadata": metadata}));
        let (_, bytes) = self
            .send(&op, Method::POST, &path, &[], Some(body), timeout)
            .await
            .map_err(|e| match e {
                // For a merge, 409 means the branches changed the same paths.
                LakefsError::Status {
                    op, status: 409, ..
                } => LakefsError::Conflict { op },
                other => other,
            })?;
        let answer: Value = Self::decode(&op, &bytes)?;
        let reference = answer["reference"]
            .as_str()
            .ok_or_else(|| LakefsError::Decode {
                op: op.clone(),
                message: "no reference in the merge result".into(),
            })?;
        commit_id(&op, reference.to_owned())
    }

    /// The newest commits of `reference`, newest first.
    pub async fn log(
        &self,
        repo: &str,
        reference: &str,
        amount: u32,
    ) -> Result<Vec<Commit>, LakefsError> {
        let op = format!("log {repo}@{reference}");
        let path = format!(
            "{}/refs/{}/commits",
            Self::repo_path(repo),
            segment(reference)
        );
        let amount = amount.min(MAX_PAGE).to_string();
        let bytes = self
            .read(&op, Method::GET, &path, &[("amount", amount.as_str())])
            .await?;
        Ok(Self::decode::<Page<Commit>>(&op, &bytes)?.results)
    }

    /// One page of the log of `reference`, newest first: at most `amount` commits after commit
    /// `after` (empty: from the head), following first parents only when `first_parent`. The
    /// page is checked by [`check_log_page`] before anything in it is used.
    pub async fn log_page(
        &self,
        repo: &str,
        reference: &str,
        after: &str,
        amount: u32,
        first_parent: bool,
    ) -> Result<LogPage, LakefsError> {
        let op = format!("log {repo}@{reference}");
        let path = format!(
            "{}/refs/{}/commits",
            Self::repo_path(repo),
            segment(reference)
        );
        let amount = amount.clamp(1, MAX_PAGE);
        let amount_text = amount.to_string();
        let mut query = vec![("amount", amount_text.as_str())];
        if !after.is_empty() {
            query.push(("after", after));
        }
        if first_parent {
            query.push(("first_parent", "true"));
        }
        let bytes = self.read(&op, Method::GET, &path, &query).await?;
        let page: Page<Commit> = Self::decode(&op, &bytes)?;
        drop(bytes);
        check_log_page(&op, after, amount, page)
    }

    /// The patterns of `repo`'s branch protection rules (at most [`MAX_PROTECTION_RULES`]).
    pub async fn branch_protection_rules(&self, repo: &str) -> Result<Vec<String>, LakefsError> {
        #[derive(Deserialize)]
        struct Rule {
            pattern: String,
        }
        let op = format!("read branch protection rules of {repo}");
        let path = format!("{}/settings/branch_protection", Self::repo_path(repo));
        let bytes = self.read(&op, Method::GET, &path, &[]).await?;
        let rules: Vec<Rule> = Self::decode(&op, &bytes)?;
        if rules.len() > MAX_PROTECTION_RULES {
            return Err(LakefsError::TooMany {
                op,
                max: MAX_PROTECTION_RULES,
            });
        }
        Ok(rules.into_iter().map(|r| r.pattern).collect())
    }

    /// Sets `repo`'s branch protection rules to `patterns` (for tests).
    pub async fn set_branch_protection_rules(
        &self,
        repo: &str,
        patterns: &[&str],
    ) -> Result<(), LakefsError> {
        let op = format!("set branch protection rules of {repo}");
        let path = format!("{}/settings/branch_protection", Self::repo_path(repo));
        let rules: Vec<Value> = patterns.iter().map(|p| json!({"pattern": p})).collect();
        self.send(
            &op,
            Method::PUT,
            &path,
            &[],
            Some(Body::Json(Value::Array(rules))),
            REQUEST_TIMEOUT,
        )
        .await
        .map(drop)
    }

    /// Creates tag `tag` at `reference` (for tests); returns the commit it names.
    pub async fn create_tag(
        &self,
        repo: &str,
        tag: &str,
        reference: &str,
    ) -> Result<String, LakefsError> {
        let op = format!("create tag {repo}/{tag}");
        let path = format!("{}/tags", Self::repo_path(repo));
        let body = Body::Json(json!({"id": tag, "ref": reference}));
        let (_, bytes) = self
            .send(&op, Method::POST, &path, &[], Some(body), REQUEST_TIMEOUT)
            .await?;
        commit_id(&op, Self::decode::<Ref>(&op, &bytes)?.commit_id)
    }

    /// Creates a repository (for `dev` and tests); an existing one is left as it is.
    pub async fn ensure_repository(
        &self,
        repo: &str,
        storage_namespace: &str,
        default_branch: &str,
    ) -> Result<(), LakefsError> {
        let op = format!("create repository {repo}");
        let body = Body::Json(json!({
            "name": repo, "storage_namespace": storage_namespace, "default_branch": default_branch,
        }));
        match self
            .send(
                &op,
                Method::POST,
                "/repositories",
                &[],
                Some(body),
                REQUEST_TIMEOUT,
            )
            .await
        {
            Err(LakefsError::Status { status: 409, .. }) => Ok(()),
            other => other.map(drop),
        }
    }

    /// Every branch name of `repo`.
    pub async fn list_branches(&self, repo: &str) -> Result<Vec<String>, LakefsError> {
        #[derive(Deserialize)]
        struct Named {
            id: String,
        }
        let op = format!("list branches of {repo}");
        let path = format!("{}/branches", Self::repo_path(repo));
        let branches: Vec<Named> = self
            .list_pages(&op, &path, &[], MAX_LISTED, |b: &Named| &b.id, |_| Ok(()))
            .await?;
        Ok(branches.into_iter().map(|b| b.id).collect())
    }

    /// Deletes `branch`; a branch that is already gone is not an error.
    pub async fn delete_branch(&self, repo: &str, branch: &str) -> Result<(), LakefsError> {
        let op = format!("delete branch {repo}/{branch}");
        let path = format!("{}/branches/{}", Self::repo_path(repo), segment(branch));
        match self.read(&op, Method::DELETE, &path, &[]).await {
            Err(e) if e.is_not_found() => Ok(()),
            other => other.map(drop),
        }
    }
}
