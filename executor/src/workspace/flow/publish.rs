//! The publish: upload the change to a staging branch, commit it, fence again, merge it, settle the merge.

use super::download::TRANSFER_CONCURRENCY;
use super::*;
use crate::workspace::{
    contention::MergeTries,
    refusal,
    scan::Changes,
    settle::{
        EXECUTION_ID_KEY, Earlier, MergeAnswer, RETRY_KEY, Settled, TASK_ID_KEY, WorkflowTask,
        earlier_publication, merges, scan_log, settle, settle_window,
    },
};
use perago_core::{
    attempt::AttemptSnapshot,
    lakefs::LakefsError,
    manifest::{PublishBudget, WorkspaceSpec},
};
use serde_json::{Map, Value, json};
use std::{sync::Arc, time::Duration};
use tokio::{sync::Semaphore, task::JoinSet};

impl Attempt {
    /// Stages and publishes `changes`; returns the `workspace` output object. `publishing` is
    /// called once the change is staged (uploaded and committed on the staging branch), right
    /// before the last fence and the merge: the phase an operator sees is the one it is in.
    /// A write lakeFS refuses for its configuration or a hook says what to change (`refusal`).
    #[expect(
        clippy::too_many_arguments,
        reason = "each is a distinct input of one publish"
    )]
    pub async fn publish(
        &mut self,
        changes: &Changes,
        spec: &WorkspaceSpec,
        fence: &dyn Fence,
        polled: &AttemptSnapshot,
        execution_id: &str,
        metadata: Map<String, Value>,
        publishing: &(dyn Fn() + Send + Sync),
    ) -> Result<Value, WorkspaceFailure> {
        let published = self
            .publish_change(
                changes,
                spec,
                fence,
                polled,
                execution_id,
                metadata,
                publishing,
            )
            .await;
        match published {
            Err(failure) => Err(self.explain_refusal(failure, execution_id).await),
            ok => ok,
        }
    }

    /// `failure`, said as what lakeFS refused and what to change when it is a 403 or 412 of a
    /// write; the repository's protection rules are read to name the one that blocks.
    pub(super) async fn explain_refusal(
        &self,
        failure: WorkspaceFailure,
        execution_id: &str,
    ) -> WorkspaceFailure {
        let Some((step, status, message)) = refusal::refused(&failure) else {
            return failure;
        };
        let repo = &self.input.repository;
        let rules = if status == 403 && message.contains("protected branch") {
            Some(
                self.client
                    .branch_protection_rules(repo)
                    .await
                    .map_err(|e| perago_core::errors::chain(&e)),
            )
        } else {
            None
        };
        let staging = format!("perago-staging-{execution_id}");
        let target = refusal::Target {
            repository: repo,
            branch: &self.input.branch,
            staging: &staging,
        };
        refusal::explain(step, status, message, target, rules)
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "each is a distinct input of one publish"
    )]
    pub(super) async fn publish_change(
        &mut self,
        changes: &Changes,
        spec: &WorkspaceSpec,
        fence: &dyn Fence,
        polled: &AttemptSnapshot,
        execution_id: &str,
        metadata: Map<String, Value>,
        publishing: &(dyn Fn() + Send + Sync),
    ) -> Result<Value, WorkspaceFailure> {
        if let Some(budget) = spec.publish_budget {
            // What is sent is exactly these sizes (see `LakefsClient::upload_file`).
            check_budget(budget, changes.objects(), changes.upload_bytes())?;
        }
        let counts = |commit: &str| {
            json!({
                "repository": self.input.repository, "branch": self.input.branch,
                "prefix": self.input.prefix, "source_commit_id": self.source_commit,
                "commit_id": commit, "added": changes.added.len(),
                "changed": changes.changed.len(), "removed": changes.removed.len(),
            })
        };
        // Every publication names its workflow task and what it changed: a retry finds it by
        // these (see `settle`), and reports the counts of the one that landed.
        let task = WorkflowTask::of(polled);
        let mut metadata = metadata;
        let named = task.metadata().into_iter().chain([
            (RETRY_KEY, polled.retry_count.to_string()),
            (TASK_ID_KEY, polled.task_id.clone()),
            (EXECUTION_ID_KEY, execution_id.to_owned()),
            ("added", changes.added.len().to_string()),
            ("changed", changes.changed.len().to_string()),
            ("removed", changes.removed.len().to_string()),
        ]);
        for (key, value) in named {
            metadata.insert(key.to_owned(), Value::String(value));
        }
        // The fence runs whatever the body did: an attempt Conductor has given up on is FAILED,
        // also when it has nothing to publish.
        check_fence(fence, polled, "before staging").await?;
        if let Some(earlier) = self
            .earlier(&task, polled.retry_count, "before staging")
            .await?
        {
            return Ok(self.already_published(&earlier));
        }
        if changes.is_empty() {
            tracing::info!("the body changed nothing; nothing to publish");
            return Ok(counts(&self.source_commit.clone()));
        }

        let repo = self.input.repository.clone();
        let staging = format!("perago-staging-{execution_id}");
        // Recorded before the branch exists: an executor killed from here on leaves a branch
        // the supervisor can find.
        self.dir.verify()?;
        self.dir.record(|owner| {
            owner.repository = Some(repo.clone());
            owner.staging_branch = Some(staging.clone());
        })?;
        self.client
            .create_branch(&repo, &staging, &self.source_commit)
            .await
            .map_err(WorkspaceFailure::Staging)?;
        self.staging = Some(staging.clone());
        self.upload(&repo, &staging, changes).await?;
        // What was uploaded was read from the directory this executor filled.
        self.dir.verify()?;
        if !changes.removed.is_empty() {
            self.client
                .delete_objects(&repo, &staging, &changes.removed)
                .await
                .map_err(WorkspaceFailure::Staging)?;
        }
        let message = format!(
            "perago: {} of workflow {} (retry {})",
            polled.task_id, polled.workflow_instance_id, polled.retry_count
        );
        let staged = self
            .client
            .commit(&repo, &staging, &message, &metadata)
            .await
            .map_err(WorkspaceFailure::StagingCommit)?;

        publishing();
        check_fence(fence, polled, "before publishing").await?;
        // An earlier attempt's merge may have landed while this one staged.
        if let Some(earlier) = self
            .earlier(&task, polled.retry_count, "before publishing")
            .await?
        {
            return Ok(self.already_published(&earlier));
        }
        let budget = Duration::from_secs(spec.merge_timeout_seconds);
        let mut tries = MergeTries::new(tokio::time::Instant::now(), budget);
        let merged = loop {
            let answer = MergeAnswer::of(
                self.client
                    .merge(
                        &repo,
                        &staging,
                        &self.input.branch,
                        &message,
                        &metadata,
                        tries.timeout(tokio::time::Instant::now()),
                    )
                    .await,
            );
            let MergeAnswer::Busy(refused) = answer else {
                break self.settle_merge(answer, &staged.id).await?;
            };
            // Not applied (see `contention`): merge again, within the budget, behind the fence.
            let Some(wait) = tries.refused_at(tokio::time::Instant::now()) else {
                return Err(WorkspaceFailure::MergeContended {
                    branch: self.input.branch.clone(),
                    staged: staged.id.clone(),
                    tries: tries.refused(),
                    budget_seconds: spec.merge_timeout_seconds,
                    last: refused,
                });
            };
            tracing::warn!(error = %perago_core::errors::DisplayChain(&refused), tries = tries.refused(), wait = ?wait, "the merge was refused under contention; merging again");
            tokio::time::sleep(wait).await;
            check_fence(fence, polled, "before merging again").await?;
            if let Some(earlier) = self
                .earlier(&task, polled.retry_count, "before merging again")
                .await?
            {
                return Ok(self.already_published(&earlier));
            }
            // Never twice: a 429 from something in front of lakeFS need not mean what lakeFS's
            // does.
            if let Some(commit) = self.merged(&staged.id).await.ok().flatten() {
                tracing::warn!(commit = %commit, "the merge refused under contention was applied after all");
                break commit;
            }
        };
        tracing::info!(repository = %repo, branch = %self.input.branch, commit = %merged, "workspace published");
        Ok(counts(&merged))
    }

    /// The merge commit, once the branch shows it: what is known after the merge `answer`.
    /// An answer is not proof (the branch must show that commit merging the staged one); an
    /// error the server answered may still hide a merge applied (the branch is read once); a
    /// merge that did not answer may land later, so the branch is read with backoff for the
    /// settle window before the attempt reports "publication unknown".
    pub(super) async fn settle_merge(
        &self,
        answer: MergeAnswer,
        staged: &str,
    ) -> Result<String, WorkspaceFailure> {
        let branch = || self.input.branch.clone();
        let window = settle_window(
            self.task_deadline
                .map(|d| d.saturating_duration_since(tokio::time::Instant::now())),
        );
        let unknown = |what: String, waited, last| WorkspaceFailure::PublicationUnknown {
            branch: branch(),
            staged: staged.to_owned(),
            what,
            waited,
            last,
        };
        match answer {
            MergeAnswer::Answered(answered) => {
                let shown = match self.merged(staged).await {
                    Ok(shown) => shown,
                    // The branch cannot be read: read it again until it can.
                    Err(e) => {
                        tracing::warn!(error = %perago_core::errors::DisplayChain(&e), "cannot read the branch to confirm the merge; retrying");
                        match settle(tokio::time::Instant::now() + window, || async {
                            // Readable now: what it shows is the answer, shown or not.
                            self.merged(staged)
                                .await
                                .map(|shown| Some(shown.unwrap_or_default()))
                        })
                        .await
                        {
                            Settled::Merged(shown) => Some(shown).filter(|s| !s.is_empty()),
                            Settled::Unknown { waited, last } => {
                                return Err(unknown(
                                    format!("answered commit {answered}"),
                                    waited,
                                    last,
                                ));
                            }
                        }
                    }
                };
                match shown {
                    Some(commit) if commit == answered => Ok(commit),
                    _ => Err(WorkspaceFailure::MergeNotOnBranch {
                        branch: branch(),
                        answered,
                        staged: staged.to_owned(),
                    }),
                }
            }
            MergeAnswer::Conflict => Err(WorkspaceFailure::MergeConflict {
                branch: branch(),
                source_commit: self.source_commit.clone(),
            }),
            MergeAnswer::NotSent(e) => Err(WorkspaceFailure::Publish(e)),
            MergeAnswer::Refused(e) | MergeAnswer::Busy(e) => {
                match self.merged(staged).await.ok().flatten() {
                    Some(commit) => {
                        tracing::warn!(error = %perago_core::errors::DisplayChain(&e), commit = %commit, "the merge answered with an error but was applied");
                        Ok(commit)
                    }
                    None => Err(WorkspaceFailure::Publish(e)),
                }
            }
            MergeAnswer::MayLand(e) => {
                tracing::warn!(error = %perago_core::errors::DisplayChain(&e), window = ?window, "the merge did not answer; reading the branch until it shows whether it landed");
                match settle(tokio::time::Instant::now() + window, || self.merged(staged)).await {
                    Settled::Merged(commit) => {
                        tracing::warn!(error = %perago_core::errors::DisplayChain(&e), commit = %commit, "the merge did not answer but landed");
                        Ok(commit)
                    }
                    Settled::Unknown { waited, last } => Err(unknown(
                        format!("did not answer ({})", perago_core::errors::DisplayChain(&e)),
                        waited,
                        last,
                    )),
                }
            }
        }
    }

    /// An earlier attempt's publication of `task` on the branch, for a retry (`retry_count` >
    /// 0); a first attempt has none to look for.
    pub(super) async fn earlier(
        &self,
        task: &WorkflowTask,
        retry_count: u32,
        when: &'static str,
    ) -> Result<Option<Earlier>, WorkspaceFailure> {
        if retry_count == 0 {
            return Ok(None);
        }
        scan_log(
            &self.client,
            &self.input.repository,
            &self.input.branch,
            |commit| earlier_publication(commit, task, retry_count),
        )
        .await
        .map_err(|source| WorkspaceFailure::EarlierUnknown {
            branch: self.input.branch.clone(),
            when,
            cause: source,
        })
    }

    /// The `workspace` output of a retry whose workflow task an earlier attempt published: the
    /// earlier merge commit and its counts, and who published it; nothing is published again.
    pub(super) fn already_published(&self, earlier: &Earlier) -> Value {
        let count = |key: &str| {
            earlier
                .get(key)
                .and_then(|v| v.parse::<u64>().ok())
                .map_or(Value::Null, Value::from)
        };
        tracing::warn!(
            commit = %earlier.commit,
            task_id = earlier.get(TASK_ID_KEY).unwrap_or_default(),
            retry_count = earlier.retry_count,
            "an earlier attempt of this workflow task already published its change as commit {}; not publishing again",
            earlier.commit
        );
        json!({
            "repository": self.input.repository, "branch": self.input.branch,
            "prefix": self.input.prefix, "source_commit_id": self.source_commit,
            "commit_id": earlier.commit, "added": count("added"),
            "changed": count("changed"), "removed": count("removed"),
            "already_published_by": {
                "task_id": earlier.get(TASK_ID_KEY),
                "execution_id": earlier.get(EXECUTION_ID_KEY),
                "retry_count": earlier.retry_count,
            },
        })
    }

    pub(super) async fn upload(
        &self,
        repo: &str,
        staging: &str,
        changes: &Changes,
    ) -> Result<(), WorkspaceFailure> {
        let limit = Arc::new(Semaphore::new(TRANSFER_CONCURRENCY));
        let mut transfers = JoinSet::new();
        for upload in changes.added.iter().chain(&changes.changed) {
            let (client, repo, staging) =
                (self.client.clone(), repo.to_owned(), staging.to_owned());
            let (upload, limit) = (upload.clone(), Arc::clone(&limit));
            transfers.spawn(async move {
                let _permit = limit.acquire_owned().await.expect("never closed");
                client
                    .upload_file(&repo, &staging, &upload)
                    .await
                    .map_err(WorkspaceFailure::Staging)
            });
        }
        while let Some(done) = transfers.join_next().await {
            done.map_err(|source| WorkspaceFailure::TransferTask {
                transfer: Transfer::Upload,
                source,
            })??;
        }
        Ok(())
    }

    /// The target branch's commit that merged `staged`, if its first-parent line shows one
    /// among its newest commits (at most
    /// [`LOG_SCAN_COMMITS`](crate::workspace::settle::LOG_SCAN_COMMITS) commits): a well-formed commit id
    /// with `staged` among its parents.
    pub(super) async fn merged(&self, staged: &str) -> Result<Option<String>, LakefsError> {
        scan_log(
            &self.client,
            &self.input.repository,
            &self.input.branch,
            |c| merges(c, staged).then(|| c.id.clone()),
        )
        .await
    }
}

/// Fails when `objects` or `bytes` exceed the publish budget.
pub(super) fn check_budget(
    budget: PublishBudget,
    objects: u64,
    bytes: u64,
) -> Result<(), WorkspaceFailure> {
    if let Some(max) = budget.max_objects
        && objects > max
    {
        return Err(WorkspaceFailure::TooManyObjects { objects, max });
    }
    if let Some(max) = budget.max_bytes
        && bytes > max
    {
        return Err(WorkspaceFailure::TooManyBytes { bytes, max });
    }
    Ok(())
}
