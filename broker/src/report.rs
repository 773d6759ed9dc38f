//! Talking to Conductor about tasks already handed out: result updates (update-v2 when the
//! server has it, else v1) with retries off the slot, lease extensions with a read-back to
//! notice a lost lease, and hand-backs of tasks the broker will not run.

use crate::{
    actor::Event,
    counters::{Counters, Gauges, exception, outcome},
    health::{Health, Waker},
    journal::{Header, Journal, Written},
    state::{HandBack, Input},
};
use perago_core::{
    attempt::{AttemptSnapshot, TaskStatus},
    backoff::Backoff,
    conductor::{ConductorClient, ConductorError, JsonBody, Polled},
    result::{Outcome, ResultStatus, RuntimeResult},
};
use serde_json::{Value, json};
use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};
use tokio::{sync::mpsc, task::AbortHandle};
use tracing::{Instrument as _, Span};

/// How long a result update is retried before it is given up as lost. The lease keeps being
/// extended meanwhile, so Conductor does not time the task out under us.
const MAX_UPDATE_RETRY: Duration = Duration::from_secs(600);

/// One result to deliver.
#[derive(Debug)]
pub(crate) struct Update {
    pub(crate) workflow_instance_id: String,
    pub(crate) task_id: String,
    pub(crate) execution_id: String,
    pub(crate) result: RuntimeResult,
    pub(crate) use_v2: bool,
    /// The lease extender of the execution, stopped once the update is acknowledged.
    pub(crate) lease: Option<AbortHandle>,
    /// The slot waiting for update-v2's next task.
    pub(crate) slot: Option<u32>,
    /// The attempt's lease was found lost before the report: Conductor will likely ignore it
    /// (see `applied`).
    pub(crate) lease_lost: bool,
    /// A lease extension of the attempt failed: Conductor may have timed it out meanwhile.
    pub(crate) lease_doubted: bool,
    /// The attempt's retry count: a result with one is journaled until acknowledged.
    pub(crate) retry_count: Option<u32>,
    /// The attempt's trace (traces exported), which ends once the update does.
    pub(crate) trace: Option<crate::traces::AttemptTrace>,
}

/// An update Conductor acknowledged.
#[derive(Debug)]
struct Sent {
    /// update-v2's next task.
    next: Option<Polled>,
    /// It took more than one request (an earlier one may have been applied, or the attempt
    /// timed out meanwhile).
    retried: bool,
}

/// Why an update was given up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GaveUp {
    /// Conductor answered and refused it for good (400, 404, ...).
    Refused,
    /// Conductor did not take it within [`MAX_UPDATE_RETRY`] (no answer, 5xx, 429).
    Unreachable,
}

/// Delivers updates; cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Reporter {
    client: ConductorClient,
    /// Whether updates may go through update-v2, shared by the reporter's clones (the updates
    /// in flight); the state machine keeps its own, told by [`Input::UpdateV2Unsupported`].
    v2: Arc<AtomicBool>,
    counters: Arc<Counters>,
    gauges: Arc<Gauges>,
    backoff: Backoff,
    health: Health,
    /// Where results wait until Conductor takes them (see `journal`); `None`: not journaled.
    journal: Option<Arc<Journal>>,
}

/// How often the lease of an attempt with this `responseTimeoutSeconds` is extended: at half
/// of it, at least every 250 ms; `None` without a response timeout (0 or absent: nothing to
/// extend). Computed in saturating arithmetic: a timeout near `u64::MAX` seconds (Conductor
/// sends whatever its TaskDef holds) means "rarely", where `rto * 1000` used to wrap to a
/// period of a few hundred milliseconds.
fn lease_period(response_timeout_seconds: Option<u64>) -> Option<Duration> {
    let rto = response_timeout_seconds.filter(|&s| s > 0)?;
    Some(Duration::from_millis(
        (rto.saturating_mul(1000) / 2).max(250),
    ))
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The commit a completed workspace task published (`workspace.commit_id` of its output).
fn published_commit(result: &RuntimeResult) -> Option<String> {
    let perago_core::result::Outcome::Completed(output) = result.outcome() else {
        return None;
    };
    let members = perago_core::json::members(output.as_str()).ok()?;
    let (_, workspace) = members.into_iter().find(|(name, _)| name == "workspace")?;
    let workspace: Value = serde_json::from_str(workspace).ok()?;
    workspace["commit_id"].as_str().map(str::to_owned)
}

/// update-v2 is missing on this server: 405, or a 404 that is not about a task or workflow.
fn v2_unsupported(e: &ConductorError) -> bool {
    match e {
        ConductorError::Status { status: 405, .. } => true,
        ConductorError::Status {
            status: 404, body, ..
        } => !(body.contains("No such task") || body.contains("No such workflow")),
        _ => false,
    }
}

impl Reporter {
    pub(crate) fn new(
        client: ConductorClient,
        counters: Arc<Counters>,
        gauges: Arc<Gauges>,
        backoff: Backoff,
        health: Health,
    ) -> Self {
        Self {
            client,
            v2: Arc::new(AtomicBool::new(true)),
            counters,
            gauges,
            backoff,
            health,
            journal: None,
        }
    }

    /// Journals every result with a retry count in `journal` until Conductor takes it.
    pub(crate) fn with_journal(mut self, journal: Option<Arc<Journal>>) -> Self {
        self.journal = journal;
        self
    }

    /// The journal header of `update` (whose result published `published`), when it is
    /// journaled: there is a journal and the result has an attempt's retry count.
    fn journal_header(&self, update: &Update, published: Option<&str>) -> Option<Header> {
        let journal = self.journal.as_ref()?;
        Some(Header {
            task_type: journal.task_type().to_owned(),
            task_id: update.task_id.clone(),
            workflow_instance_id: update.workflow_instance_id.clone(),
            retry_count: update.retry_count?,
            execution_id: update.execution_id.clone(),
            worker_id: update.result.worker_id().to_owned(),
            status: update.result.status().as_str().to_owned(),
            published_commit: published.map(str::to_owned),
        })
    }

    /// Writes the journal entry of a result about to be reported (flushed to the disk when
    /// it reports a publication); `None` when it was not written.
    async fn journal_entry(
        &self,
        header: Header,
        body: &perago_core::result::TaskResultBody,
    ) -> Option<Written> {
        let journal = self.journal.as_ref()?;
        if header.published_commit.is_none() {
            return journal.record(&header, body.as_bytes(), false);
        }
        // A publication's entry is fsync'd: off the broker's thread.
        let (journal, bytes) = (Arc::clone(journal), body.to_bytes());
        tokio::task::spawn_blocking(move || journal.record(&header, &bytes, true))
            .await
            .ok()
            .flatten()
    }

    fn v2_enabled(&self) -> bool {
        self.v2.load(Ordering::Relaxed)
    }

    /// From now on every update goes through v1 (drain; or the server lacks update-v2).
    pub(crate) fn disable_v2(&self) {
        self.v2.store(false, Ordering::Relaxed);
    }

    /// Delivers `update` in a task of its own, within the assignment's `span`, and reports
    /// back with `UpdateDone`.
    pub(crate) fn spawn(&self, update: Update, events: mpsc::Sender<Event>, span: Span) {
        let this = self.clone();
        tokio::spawn(
            async move {
                let slot = update.slot;
                let next_task = this.deliver(update, &events).await;
                let _ = events
                    .send(Event::Slot(Input::UpdateDone { slot, next_task }))
                    .await;
            }
            .instrument(span),
        );
    }

    async fn deliver(&self, mut update: Update, events: &mpsc::Sender<Event>) -> Option<Polled> {
        let trace = update.trace.take().map(|trace| {
            let failure = match update.result.outcome() {
                Outcome::Completed(_) => None,
                Outcome::Failed(reason) | Outcome::FailedTerminal(reason) => {
                    Some(reason.as_str().chars().take(512).collect::<String>())
                }
            };
            (trace, failure, std::time::SystemTime::now())
        });
        let status = update.result.status();
        let worker_id = update.result.worker_id().to_owned();
        let published = published_commit(&update.result);
        let header = self.journal_header(&update, published.as_deref());
        let body = update.result.into_conductor(
            &update.workflow_instance_id,
            &update.task_id,
            &update.execution_id,
            now_ms(),
        );
        let entry = match header {
            Some(header) => self.journal_entry(header, &body).await,
            None => None,
        };
        let outcome = self
            .send_with_retries((&body).into(), update.use_v2, published.as_deref(), events)
            .await;
        if let Some(lease) = &update.lease {
            lease.abort();
        }
        if let Some((trace, failure, started)) = trace {
            let delivered = match &outcome {
                Ok(_) => Ok(()),
                Err(GaveUp::Refused) => Err("Conductor refused it"),
                Err(GaveUp::Unreachable) => Err("Conductor did not take it in time"),
            };
            trace.reported(status, failure.as_deref(), started, delivered);
        }
        if let (Some(entry), Some(journal)) = (entry, &self.journal) {
            if matches!(outcome, Err(GaveUp::Unreachable)) {
                tracing::warn!(journal = %journal.path().display(), "the result stays in the journal: the next start on this workspace root reports it if Conductor still has the attempt in progress");
            } else {
                journal.remove(entry);
            }
        }
        match outcome {
            Ok(sent) => {
                // Counted by what Conductor did with it, as far as the broker can tell.
                let doubtful = update.lease_lost || update.lease_doubted || sent.retried;
                if doubtful
                    && !crate::applied::applied(
                        &self.client,
                        &update.task_id,
                        status,
                        &worker_id,
                        update.lease_lost,
                    )
                    .await
                {
                    self.counters.results_ignored.inc();
                    return sent.next;
                }
                match status {
                    ResultStatus::Completed => self.counters.completed.inc(),
                    ResultStatus::Failed => self.counters.failed.inc(),
                    ResultStatus::FailedWithTerminalError => self.counters.failed_terminal.inc(),
                }
                tracing::info!(status = status.as_str(), "result reported");
                sent.next
            }
            Err(_) => None,
        }
    }

    /// Sends one update; `Ok` once acknowledged (with update-v2's next task), else why it was given up. Its
    /// lines carry the task's ids from the span it runs in. The first to find the server
    /// without update-v2 tells the state machine through `events`.
    async fn send_with_retries(
        &self,
        body: JsonBody<'_>,
        use_v2: bool,
        published: Option<&str>,
        events: &mpsc::Sender<Event>,
    ) -> Result<Sent, GaveUp> {
        let started = Instant::now();
        let mut attempt = 0u32;
        let mut waker = Waker::default();
        loop {
            let v2 = use_v2 && self.v2_enabled();
            let sending = Instant::now();
            let sent = self.health.observe(if v2 {
                self.client.update_task_v2(body).await
            } else {
                self.client.update_task(body).await.map(|()| None)
            });
            let sdk = &self.gauges.sdk;
            sdk.update_time
                .get_or_create(&outcome(sent.is_ok()))
                .observe(sending.elapsed().as_secs_f64());
            if let Err(e) = &sent {
                sdk.update_errors.get_or_create(&exception(&e.kind())).inc();
            }
            match sent {
                Ok(next) => {
                    if attempt > 0 {
                        tracing::info!(
                            attempts = attempt + 1,
                            "result update went through after retries"
                        );
                    }
                    return Ok(Sent {
                        next,
                        retried: attempt > 0,
                    });
                }
                Err(e) if v2 && v2_unsupported(&e) => {
                    // Concurrent updates may all see the 405; the switch is logged once.
                    if self.v2.swap(false, Ordering::Relaxed) {
                        tracing::warn!(error = %perago_core::errors::DisplayChain(&e), "the Conductor server has no usable update-v2; using v1 from now on");
                        // The machine then keeps no slot for a next task (the answer to this
                        // update, `UpdateDone`, follows this input).
                        let _ = events.send(Event::Slot(Input::UpdateV2Unsupported)).await;
                    }
                }
                Err(e) if e.is_retryable() && started.elapsed() < MAX_UPDATE_RETRY => {
                    self.counters.update_retries.inc();
                    if attempt == 0 {
                        tracing::warn!(error = %perago_core::errors::DisplayChain(&e), "result update failed; retrying with backoff");
                    }
                    // An outage's end wakes the retry at once (see `health`).
                    waker.wait(&self.health, self.backoff.delay(attempt)).await;
                    attempt += 1;
                }
                Err(e) => {
                    self.counters.results_lost.inc();
                    match published {
                        // The change is in lakeFS already: say where, for whoever reconciles.
                        Some(commit) => {
                            tracing::error!(error = %perago_core::errors::DisplayChain(&e), attempts = attempt + 1, published_commit = commit, "task result lost: Conductor did not take the update; its timeout and retry policy decide what happens to the task; its workspace change was published as commit {commit}")
                        }
                        None => {
                            tracing::error!(error = %perago_core::errors::DisplayChain(&e), attempts = attempt + 1, "task result lost: Conductor did not take the update; its timeout and retry policy decide what happens to the task")
                        }
                    }
                    return Err(if e.is_retryable() {
                        GaveUp::Unreachable
                    } else {
                        GaveUp::Refused
                    });
                }
            }
        }
    }

    /// Gives a polled task back to the queue without spending a retry.
    pub(crate) fn spawn_hand_back(
        &self,
        hand_back: HandBack,
        broker_id: String,
        events: mpsc::Sender<Event>,
    ) {
        let HandBack { ids, output } = hand_back;
        let this = self.clone();
        // The task has no execution here: its lines carry its task id only.
        let span = tracing::error_span!(parent: None, "hand_back", task_id = %ids.task_id);
        tokio::spawn(
            async move {
                let mut body = json!({
                    "workflowInstanceId": ids.workflow_instance_id,
                    "taskId": ids.task_id,
                    "workerId": broker_id,
                    "status": "IN_PROGRESS",
                    "callbackAfterSeconds": 0,
                });
                if let Some(output) = output {
                    body["outputData"] = output;
                }
                let _ = this
                    .send_with_retries((&body).into(), false, None, &events)
                    .await;
                let _ = events
                    .send(Event::Slot(Input::UpdateDone {
                        slot: None,
                        next_task: None,
                    }))
                    .await;
            }
            .instrument(span),
        );
    }

    /// Extends the lease of a received attempt at half its `responseTimeoutSeconds` until
    /// aborted, reading the task back after each extension: Conductor silently accepts
    /// extensions for a task it already timed out, so only a read shows a lost lease (then
    /// `LeaseLost` goes to the actor). While Conductor does not answer, extensions wait for it
    /// with the shared backoff instead of firing every period; its recovery wakes them. Its
    /// lines are logged within the execution's `span`.
    pub(crate) fn spawn_lease(
        &self,
        attempt: &AttemptSnapshot,
        execution_id: &str,
        events: mpsc::Sender<Event>,
        span: Span,
    ) -> Option<AbortHandle> {
        let every = lease_period(attempt.response_timeout_seconds)?;
        let this = self.clone();
        let workflow = attempt.workflow_instance_id.clone();
        let task_id = attempt.task_id.clone();
        let retry_count = attempt.retry_count;
        let execution_id = execution_id.to_owned();
        let handle = tokio::spawn(
            async move {
            let body = json!({
                "workflowInstanceId": workflow,
                "taskId": task_id,
                "status": "IN_PROGRESS",
                "extendLease": true,
            });
            let mut failures = 0u32;
            let mut waker = Waker::default();
            loop {
                if failures == 0 {
                    tokio::time::sleep(every).await;
                } else {
                    waker
                        .wait(&this.health, this.backoff.delay(failures - 1))
                        .await;
                }
                if let Err(e) = this.health.observe(this.client.update_task(&body).await) {
                    if failures == 0 {
                        tracing::warn!(error = %perago_core::errors::DisplayChain(&e), "lease extension failed; retrying with backoff");
                        let doubt = Event::LeaseDoubt {
                            execution_id: execution_id.clone(),
                        };
                        let _ = events.send(doubt).await;
                    }
                    failures = failures.saturating_add(1);
                    continue;
                }
                if failures > 0 {
                    tracing::info!(failures, "lease extended again");
                    failures = 0;
                }
                this.counters.lease_extensions.inc();
                let lost = match this.health.observe(this.client.get_task(&task_id).await) {
                    Ok(task) => {
                        let status = task
                            .get("status")
                            .and_then(Value::as_str)
                            .and_then(TaskStatus::parse);
                        let retry = task.get("retryCount").and_then(Value::as_u64);
                        let lost = status != Some(TaskStatus::InProgress)
                            || retry != Some(u64::from(retry_count));
                        if lost {
                            tracing::warn!(status = ?status, "lease lost: Conductor no longer has this attempt in progress; its result will be ignored");
                        }
                        lost
                    }
                    Err(e) if e.is_not_found() => {
                        tracing::warn!("lease lost: Conductor no longer knows the task");
                        true
                    }
                    Err(e) => {
                        tracing::warn!(error = %perago_core::errors::DisplayChain(&e), "cannot read the task back after a lease extension");
                        false
                    }
                };
                if lost {
                    this.counters.leases_lost.inc();
                    let _ = events
                        .send(Event::Slot(Input::LeaseLost { execution_id }))
                        .await;
                    return;
                }
            }
            }
            .instrument(span),
        );
        Some(handle.abort_handle())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_periods_are_half_the_response_timeout_and_saturate() {
        assert_eq!(lease_period(None), None);
        assert_eq!(lease_period(Some(0)), None);
        assert_eq!(lease_period(Some(1)), Some(Duration::from_millis(500)));
        assert_eq!(lease_period(Some(10)), Some(Duration::from_secs(5)));
        // Near u64::MAX seconds the period is as long as a Duration of milliseconds gets,
        // never the 384 ms that `rto * 1000` wrapped to.
        for rto in [
            u64::MAX,
            u64::MAX - 1,
            u64::MAX / 1000 + 1,
            18_446_744_073_709_552,
        ] {
            let every = lease_period(Some(rto)).unwrap();
            assert!(
                every >= Duration::from_secs(u64::MAX / 1000 / 2 - 1),
                "{rto}: {every:?}"
            );
        }
        // Monotonic: a longer timeout never extends more often.
        let mut last = Duration::ZERO;
        for rto in (0..64).map(|b| 1u64 << b).chain([u64::MAX]) {
            let every = lease_period(Some(rto)).unwrap();
            assert!(every >= last, "{rto}");
            last = every;
        }
    }
}
