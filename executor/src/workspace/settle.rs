//! Knowing whether a publication landed (SPEC §6, issue #23 item 3).
//!
//! A lakeFS merge that does not answer in time may still land: the server resolves the source
//! when the request starts, and a client hanging up does not cancel it. So an attempt whose
//! merge timed out (or lost its connection, or met a gateway's 502/504) does not report until
//! the target branch shows the merge, reading the branch's log with backoff for up to
//! [`MERGE_SETTLE_LIMIT`] (less when the task's `timeoutSeconds` ends sooner); if it never
//! does, the reason says "publication unknown".
//!
//! Every publication's commits name their workflow task (workflow id, reference task name,
//! iteration: [`WorkflowTask`]). A retry reads the branch's newest [`LOG_SCAN_COMMITS`]
//! first-parent commits for an earlier attempt's publication of the same workflow task before it
//! stages and again before it merges, and does not publish a second time if one landed.

use perago_core::attempt::AttemptSnapshot;
use perago_core::lakefs::{Commit, LakefsClient, LakefsError, MAX_PAGE};
use serde_json::{Map, Value};
use std::time::Duration;
use tokio::time::Instant;

/// The most commits of the target branch's first-parent line read in one search: an earlier
/// publication further back than this is not found.
pub const LOG_SCAN_COMMITS: usize = 2000;
/// The most log pages one search reads (a server that pages by one commit is cut off here).
pub const LOG_SCAN_PAGES: usize = 20;
/// The longest an attempt waits for the branch to show a merge that did not answer.
pub const MERGE_SETTLE_LIMIT: Duration = Duration::from_secs(300);
/// The first wait between two reads of the log while settling; it doubles up to
/// [`SETTLE_MAX_WAIT`].
const SETTLE_FIRST_WAIT: Duration = Duration::from_millis(200);
/// The longest wait between two reads of the log while settling.
const SETTLE_MAX_WAIT: Duration = Duration::from_secs(5);

/// Metadata key: the workflow id.
pub const WORKFLOW_ID_KEY: &str = "workflow_id";
/// Metadata key: the task's reference name in the workflow.
pub const REFERENCE_KEY: &str = "reference_task_name";
/// Metadata key: the task's loop iteration (0 outside a loop).
pub const ITERATION_KEY: &str = "iteration";
/// Metadata key: the attempt's retry count.
pub const RETRY_KEY: &str = "retry_count";
/// Metadata key: the attempt's Conductor task id.
pub const TASK_ID_KEY: &str = "task_id";
/// Metadata key: the attempt's execution id.
pub const EXECUTION_ID_KEY: &str = "execution_id";

/// The workflow task an attempt is one try of: its retries share it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkflowTask {
    /// `workflowInstanceId`.
    pub workflow_id: String,
    /// `referenceTaskName`.
    pub reference_task_name: String,
    /// `iteration`.
    pub iteration: u32,
}

impl WorkflowTask {
    /// The workflow task of `attempt`.
    pub fn of(attempt: &AttemptSnapshot) -> Self {
        Self {
            workflow_id: attempt.workflow_instance_id.clone(),
            reference_task_name: attempt.reference_task_name.clone(),
            iteration: attempt.iteration,
        }
    }

    /// The metadata keys that name it, written on every publication's commits.
    pub fn metadata(&self) -> [(&'static str, String); 3] {
        [
            (WORKFLOW_ID_KEY, self.workflow_id.clone()),
            (REFERENCE_KEY, self.reference_task_name.clone()),
            (ITERATION_KEY, self.iteration.to_string()),
        ]
    }

    /// Whether `metadata` names this workflow task.
    fn named_by(&self, metadata: &Map<String, Value>) -> bool {
        self.metadata()
            .iter()
            .all(|(key, value)| metadata.get(*key).and_then(Value::as_str) == Some(value))
    }
}

/// An earlier attempt's publication found on the branch.
#[derive(Debug, Clone, PartialEq)]
pub struct Earlier {
    /// The merge commit.
    pub commit: String,
    /// Its metadata.
    pub metadata: Map<String, Value>,
    /// The earlier attempt's retry count.
    pub retry_count: u32,
}

impl Earlier {
    /// A metadata value as text, if there is one.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.metadata.get(key).and_then(Value::as_str)
    }
}

/// Whether `commit` merged the staging commit `staged`: a well-formed id with `staged` among
/// its parents.
pub fn merges(commit: &Commit, staged: &str) -> bool {
    perago_core::lakefs::is_commit_id(&commit.id) && commit.parents.iter().any(|p| p == staged)
}

/// `commit`, if it is a merge commit publishing an attempt of `task` with a retry count below
/// `retry_count` (an earlier attempt; a rerun starts again at 0).
pub fn earlier_publication(
    commit: &Commit,
    task: &WorkflowTask,
    retry_count: u32,
) -> Option<Earlier> {
    let metadata = commit.metadata.as_ref()?;
    if !perago_core::lakefs::is_commit_id(&commit.id)
        || commit.parents.len() < 2
        || !task.named_by(metadata)
    {
        return None;
    }
    let earlier = metadata
        .get(RETRY_KEY)
        .and_then(Value::as_str)
        .and_then(|r| r.parse::<u32>().ok())
        .filter(|r| *r < retry_count)?;
    Some(Earlier {
        commit: commit.id.clone(),
        metadata: metadata.clone(),
        retry_count: earlier,
    })
}

/// How a merge request ended, for deciding what is known.
#[derive(Debug)]
pub enum MergeAnswer {
    /// Success, with the merge commit the server named.
    Answered(String),
    /// 409: the branches changed the same paths; not merged.
    Conflict,
    /// No answer the server stands behind (a timeout, a connection lost after the request went
    /// out, a gateway's 502 or 504): the merge may land later.
    MayLand(LakefsError),
    /// The server answered an error (or an answer that is not one): the branch is checked
    /// once, as the error may still hide a merge applied.
    Refused(LakefsError),
    /// The request never reached the server (it could not connect): not merged.
    NotSent(LakefsError),
    /// 429: lakeFS retried the merge while the branch kept moving and gave up; the branch was
    /// not updated, so it may be merged again (see `contention`).
    Busy(LakefsError),
}

impl MergeAnswer {
    /// Sorts the result of a merge call.
    pub fn of(result: Result<String, LakefsError>) -> Self {
        match result {
            Ok(commit) => Self::Answered(commit),
            Err(LakefsError::Conflict { .. }) => Self::Conflict,
            Err(e @ LakefsError::Transport { .. }) if transport_not_sent(&e) => Self::NotSent(e),
            Err(e @ LakefsError::Transport { .. }) => Self::MayLand(e),
            Err(
                e @ LakefsError::Status {
                    status: 502 | 504, ..
                },
            ) => Self::MayLand(e),
            Err(e @ LakefsError::Status { status: 429, .. }) => Self::Busy(e),
            Err(e) => Self::Refused(e),
        }
    }
}

fn transport_not_sent(e: &LakefsError) -> bool {
    matches!(e, LakefsError::Transport { source, .. } if source.is_connect())
}

/// Reads `branch`'s first-parent log, newest first, until `find` answers or
/// [`LOG_SCAN_COMMITS`] commits or [`LOG_SCAN_PAGES`] pages were read. (It does not stop at the
/// commit the attempt read: a log ordered by creation date may list a commit before a child
/// made in the same second.)
pub async fn scan_log<T>(
    client: &LakefsClient,
    repo: &str,
    branch: &str,
    mut find: impl FnMut(&Commit) -> Option<T>,
) -> Result<Option<T>, LakefsError> {
    let mut after = String::new();
    let mut read = 0usize;
    for _ in 0..LOG_SCAN_PAGES {
        let left = LOG_SCAN_COMMITS - read;
        let amount = u32::try_from(left).unwrap_or(MAX_PAGE).min(MAX_PAGE);
        let page = client.log_page(repo, branch, &after, amount, true).await?;
        read += page.commits.len();
        for commit in &page.commits {
            if let Some(found) = find(commit) {
                return Ok(Some(found));
            }
        }
        match page.next {
            Some(next) if read < LOG_SCAN_COMMITS => after = next,
            _ => return Ok(None),
        }
    }
    Ok(None)
}

/// What settling a merge found out.
#[derive(Debug)]
pub enum Settled {
    /// The branch shows the merge commit.
    Merged(String),
    /// It did not within the time allowed.
    Unknown {
        /// How long the log was read.
        waited: Duration,
        /// The last read's outcome (`not on the branch yet`, or its error).
        last: String,
    },
}

/// Reads the log with `read` (the merge commit, if the branch shows it) with backoff until it
/// answers a commit or `deadline` passes; it reads at least once.
pub async fn settle<F, Fut>(deadline: Instant, mut read: F) -> Settled
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<String>, LakefsError>>,
{
    let started = Instant::now();
    let mut wait = SETTLE_FIRST_WAIT;
    loop {
        let last = match read().await {
            Ok(Some(commit)) => return Settled::Merged(commit),
            Ok(None) => "the branch does not show it".to_owned(),
            Err(e) => perago_core::errors::chain(&e),
        };
        let now = Instant::now();
        if now >= deadline {
            return Settled::Unknown {
                waited: now - started,
                last,
            };
        }
        tracing::info!(last = %last, wait = ?wait, "the merge is not settled yet; reading the branch again");
        tokio::time::sleep(wait.min(deadline - now)).await;
        wait = (wait * 2).min(SETTLE_MAX_WAIT);
    }
}

/// How long an attempt settles a merge: [`MERGE_SETTLE_LIMIT`], or the task's time left if
/// that is sooner.
pub fn settle_window(time_left: Option<Duration>) -> Duration {
    time_left.map_or(MERGE_SETTLE_LIMIT, |left| left.min(MERGE_SETTLE_LIMIT))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn commit(id: &str, parents: &[&str], metadata: Value) -> Commit {
        serde_json::from_value(json!({"id": id, "parents": parents, "metadata": metadata})).unwrap()
    }

    fn task() -> WorkflowTask {
        WorkflowTask {
            workflow_id: "wf-1".into(),
            reference_task_name: "ref".into(),
            iteration: 2,
        }
    }

    fn named(retry: &str) -> Value {
        json!({"workflow_id": "wf-1", "reference_task_name": "ref", "iteration": "2", "retry_count": retry, "task_id": "t-0"})
    }

    #[test]
    fn only_a_merge_commit_of_an_earlier_attempt_of_the_same_workflow_task_counts() {
        let (id, head, staged) = ("a".repeat(64), "b".repeat(64), "c".repeat(64));
        let merge = commit(&id, &[&head, &staged], named("0"));
        let found = earlier_publication(&merge, &task(), 1).unwrap();
        assert_eq!(found.commit, id);
        assert_eq!((found.retry_count, found.get("task_id")), (0, Some("t-0")));
        // Not earlier: the same or a later retry (and a first attempt has no earlier one).
        assert!(earlier_publication(&merge, &task(), 0).is_none());
        assert!(
            earlier_publication(&commit(&id, &[&head, &staged], named("1")), &task(), 1).is_none()
        );
        // The staging commit itself (one parent) is not the publication.
        assert!(earlier_publication(&commit(&id, &[&head], named("0")), &task(), 1).is_none());
        // Another workflow task: another iteration, reference name or workflow.
        for (key, value) in [
            ("iteration", "3"),
            ("reference_task_name", "other"),
            ("workflow_id", "wf-2"),
        ] {
            let mut metadata = named("0");
            metadata[key] = json!(value);
            assert!(
                earlier_publication(&commit(&id, &[&head, &staged], metadata), &task(), 1)
                    .is_none(),
                "{key}"
            );
        }
        // Malformed: no retry count, a number where text is due, a bad id, no metadata.
        let mut metadata = named("0");
        metadata.as_object_mut().unwrap().remove("retry_count");
        assert!(
            earlier_publication(&commit(&id, &[&head, &staged], metadata), &task(), 1).is_none()
        );
        let mut metadata = named("0");
        metadata["iteration"] = json!(2);
        assert!(
            earlier_publication(&commit(&id, &[&head, &staged], metadata), &task(), 1).is_none()
        );
        assert!(
            earlier_publication(&commit("x", &[&head, &staged], named("0")), &task(), 1).is_none()
        );
        assert!(
            earlier_publication(&commit(&id, &[&head, &staged], Value::Null), &task(), 1).is_none()
        );
    }

    #[test]
    fn a_merge_is_the_commit_with_the_staged_commit_among_its_parents() {
        let (id, head, staged) = ("a".repeat(64), "b".repeat(64), "c".repeat(64));
        assert!(merges(
            &commit(&id, &[&head, &staged], Value::Null),
            &staged
        ));
        assert!(!merges(&commit(&id, &[&head], Value::Null), &staged));
        assert!(!merges(
            &commit("not-an-id", &[&head, &staged], Value::Null),
            &staged
        ));
    }

    #[test]
    fn only_a_request_that_never_went_out_or_a_server_error_is_known_not_merged() {
        let status = |status| LakefsError::Status {
            op: "merge".into(),
            status,
            message: "m".into(),
        };
        assert!(matches!(MergeAnswer::of(Ok("c".into())), MergeAnswer::Answered(c) if c == "c"));
        assert!(matches!(
            MergeAnswer::of(Err(LakefsError::Conflict { op: "merge".into() })),
            MergeAnswer::Conflict
        ));
        for gateway in [502, 504] {
            assert!(
                matches!(
                    MergeAnswer::of(Err(status(gateway))),
                    MergeAnswer::MayLand(_)
                ),
                "{gateway}"
            );
        }
        for answered in [400, 404, 500, 503] {
            assert!(
                matches!(
                    MergeAnswer::of(Err(status(answered))),
                    MergeAnswer::Refused(_)
                ),
                "{answered}"
            );
        }
        // lakeFS gave up retrying against a moving branch: not applied, merge again.
        assert!(matches!(
            MergeAnswer::of(Err(status(429))),
            MergeAnswer::Busy(_)
        ));
    }

    #[tokio::test]
    async fn transport_errors_are_sorted_by_whether_the_request_went_out() {
        // Nothing listens on port 9 of loopback: the request never leaves.
        let client = perago_core::http::client_builder("http://127.0.0.1:9/")
            .build()
            .unwrap();
        let refused = client.get("http://127.0.0.1:9/").send().await.unwrap_err();
        let refused = LakefsError::Transport {
            op: "merge".into(),
            source: refused,
        };
        assert!(matches!(
            MergeAnswer::of(Err(refused)),
            MergeAnswer::NotSent(_)
        ));
        // A server that takes the request and never answers: a timeout, which may still land.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let _held = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            std::future::pending::<()>().await;
            drop(socket);
        });
        let timed_out = client
            .post(format!("http://{address}/"))
            .timeout(Duration::from_millis(200))
            .send()
            .await
            .unwrap_err();
        let timed_out = LakefsError::Transport {
            op: "merge".into(),
            source: timed_out,
        };
        assert!(matches!(
            MergeAnswer::of(Err(timed_out)),
            MergeAnswer::MayLand(_)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn settling_reads_until_the_branch_shows_the_merge_or_the_window_ends() {
        // The merge shows on the fourth read; read errors in between are retried.
        let reads = AtomicUsize::new(0);
        let settled = settle(Instant::now() + Duration::from_secs(60), || {
            let n = reads.fetch_add(1, Ordering::SeqCst);
            async move {
                match n {
                    0 | 2 => Ok(None),
                    1 => Err(LakefsError::Decode {
                        op: "log".into(),
                        message: "bad".into(),
                    }),
                    _ => Ok(Some("m".to_owned())),
                }
            }
        })
        .await;
        assert!(
            matches!(settled, Settled::Merged(ref c) if c == "m"),
            "{settled:?}"
        );
        assert_eq!(reads.load(Ordering::SeqCst), 4);

        // Never shown: unknown once the window ends, with the last read's outcome, after
        // reads spaced out by the backoff.
        let reads = AtomicUsize::new(0);
        let started = Instant::now();
        let settled = settle(started + Duration::from_secs(30), || {
            reads.fetch_add(1, Ordering::SeqCst);
            async { Ok(None) }
        })
        .await;
        match settled {
            Settled::Unknown { waited, last } => {
                assert_eq!(waited, Duration::from_secs(30));
                assert_eq!(last, "the branch does not show it");
            }
            other => panic!("{other:?}"),
        }
        let reads = reads.load(Ordering::SeqCst);
        assert!((6..=12).contains(&reads), "{reads} reads in 30 s");

        // A window already over still reads once.
        let reads = AtomicUsize::new(0);
        let settled = settle(Instant::now(), || {
            reads.fetch_add(1, Ordering::SeqCst);
            async { Ok(None) }
        })
        .await;
        assert!(matches!(settled, Settled::Unknown { .. }));
        assert_eq!(reads.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn the_settle_window_is_the_limit_or_the_task_time_left() {
        assert_eq!(settle_window(None), MERGE_SETTLE_LIMIT);
        assert_eq!(
            settle_window(Some(Duration::from_secs(20))),
            Duration::from_secs(20)
        );
        assert_eq!(
            settle_window(Some(Duration::from_secs(3600))),
            MERGE_SETTLE_LIMIT
        );
    }
}
