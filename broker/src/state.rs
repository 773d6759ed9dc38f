//! The broker's one owner of truth: an actor that holds every slot and decides dispatch,
//! completion, executor death and drain. Services, the poller and the reporters talk to it
//! only by [`Event`]s; nothing else touches slot state.
//!
//! A slot is *free* when its current generation is attached, idle and not stopping, and the
//! broker is not draining. Polls ask for at most `free − reserved` tasks; a completion whose
//! update goes through update-v2 keeps its slot reserved (`AwaitingNext`) so the task the
//! server hands back takes exactly the slot that was freed, and never more than N tasks are
//! held.

use crate::{
    counters::{Counters, Gauges},
    report::{Reporter, Update},
    wire,
};
use perago_core::{
    attempt::{AttemptError, AttemptSnapshot, task_ref},
    identity::{Slot as SlotNumber, WorkerPrefix},
    result::{Reason, RuntimeResult},
};
use perago_proto::{admin::v1 as admin, slot::v1 as proto};
use serde_json::Value;
use std::{
    collections::VecDeque,
    sync::Arc,
    time::{SystemTime, UNIX_EPOCH},
};
use tokio::sync::{mpsc, oneshot};
use tonic::Status;

/// After a busy executor's stream ends, how long to wait for the supervisor's exit report
/// before failing the assignment without an exit status.
const EXIT_REPORT_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// Messages to one executor's `Attach` response stream.
pub(crate) type SlotSender = mpsc::Sender<Result<proto::BrokerMessage, Status>>;

/// Everything the actor reacts to.
#[derive(Debug)]
pub(crate) enum Event {
    /// An executor said hello on a new `Attach` stream.
    Hello {
        hello: proto::Hello,
        tx: SlotSender,
        reply: oneshot::Sender<Result<(u32, u64), Status>>,
    },
    /// An executor finished an assignment.
    Completion {
        slot: u32,
        generation: u64,
        completion: proto::Completion,
    },
    /// An executor entered a phase.
    Progress {
        slot: u32,
        generation: u64,
        progress: proto::Progress,
    },
    /// An `Attach` stream ended.
    StreamEnded { slot: u32, generation: u64 },
    /// The grace after a stream end passed without an exit report from the supervisor.
    StreamGraceOver { slot: u32, generation: u64 },
    /// The supervisor (re)started a slot.
    SlotStarted(proto::SlotStarted),
    /// The supervisor reaped a slot's process.
    SlotExited(proto::SlotExited),
    /// `ReloadAttempt`: which task may this caller read?
    FenceTarget {
        credentials: proto::SlotCredentials,
        execution_id: String,
        reply: oneshot::Sender<Result<String, Status>>,
    },
    /// The poller wants to know how many tasks it may poll for (waits while none).
    PollRequest { reply: oneshot::Sender<u32> },
    /// A poll returned.
    Polled { tasks: Vec<Value>, reserved: u32 },
    /// A poll failed; its reservation is released.
    PollFailed { reserved: u32 },
    /// A result update finished (successfully or not).
    UpdateDone {
        slot: Option<u32>,
        next_task: Option<Value>,
    },
    /// Start draining.
    Drain { reply: oneshot::Sender<bool> },
    /// A status snapshot.
    Status {
        reply: oneshot::Sender<admin::StatusResponse>,
    },
}

#[derive(Debug)]
struct Running {
    execution_id: String,
    attempt: AttemptSnapshot,
    dispatched_at: SystemTime,
    phase: proto::Phase,
    lease: Option<tokio::task::AbortHandle>,
}

#[derive(Debug)]
enum Work {
    Idle,
    Busy(Box<Running>),
    /// The completion's update-v2 is in flight; the slot waits for the next task it returns.
    AwaitingNext,
}

#[derive(Debug)]
struct Slot {
    number: u32,
    worker_id: String,
    generation: u64,
    token: String,
    pid: u32,
    conn: Option<SlotSender>,
    work: Work,
    stopping: bool,
    exited: bool,
}

/// The actor.
#[derive(Debug)]
pub(crate) struct Broker {
    task_name: String,
    broker_id: String,
    slots: Vec<Slot>,
    draining: bool,
    reserved: u32,
    poll_waiters: VecDeque<oneshot::Sender<u32>>,
    updates_in_flight: u32,
    reporter: Reporter,
    counters: Arc<Counters>,
    gauges: Arc<Gauges>,
    events: mpsc::Sender<Event>,
    started_at: SystemTime,
    drained: Option<oneshot::Sender<()>>,
}

fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Compares secrets without an early exit on the first differing byte.
fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

impl Broker {
    #[expect(
        clippy::too_many_arguments,
        reason = "one constructor call site, all fields named"
    )]
    pub(crate) fn new(
        task_name: String,
        prefix: &WorkerPrefix,
        slots: u32,
        reporter: Reporter,
        counters: Arc<Counters>,
        gauges: Arc<Gauges>,
        events: mpsc::Sender<Event>,
        drained: oneshot::Sender<()>,
        started_at: SystemTime,
    ) -> Self {
        gauges
            .slots
            .store(u64::from(slots), std::sync::atomic::Ordering::Relaxed);
        let slots = (1..=slots)
            .map(|n| Slot {
                number: n,
                worker_id: prefix.worker_id(SlotNumber::new(u64::from(n)).expect("1..=N")),
                generation: 0,
                token: String::new(),
                pid: 0,
                conn: None,
                work: Work::Idle,
                stopping: false,
                exited: false,
            })
            .collect();
        Self {
            task_name,
            broker_id: prefix.broker_id(),
            slots,
            draining: false,
            reserved: 0,
            poll_waiters: VecDeque::new(),
            updates_in_flight: 0,
            reporter,
            counters,
            gauges,
            events,
            started_at,
            drained: Some(drained),
        }
    }

    /// Runs until every event sender is gone.
    pub(crate) async fn run(mut self, mut rx: mpsc::Receiver<Event>) {
        while let Some(event) = rx.recv().await {
            self.handle(event);
            self.answer_poll_waiters();
            self.check_drained();
            let busy = self
                .slots
                .iter()
                .filter(|s| matches!(s.work, Work::Busy(_)))
                .count() as u64;
            self.gauges
                .busy_slots
                .store(busy, std::sync::atomic::Ordering::Relaxed);
        }
    }

    fn slot_mut(&mut self, number: u32) -> Option<&mut Slot> {
        self.slots
            .get_mut(usize::try_from(number).ok()?.checked_sub(1)?)
    }

    fn free_slots(&self) -> u32 {
        if self.draining {
            return 0;
        }
        self.slots
            .iter()
            .filter(|s| s.conn.is_some() && matches!(s.work, Work::Idle) && !s.stopping)
            .count() as u32
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Hello { hello, tx, reply } => {
                let _ = reply.send(self.attach(hello, tx));
            }
            Event::Completion {
                slot,
                generation,
                completion,
            } => self.complete(slot, generation, completion),
            Event::Progress {
                slot,
                generation,
                progress,
            } => {
                if let Some(s) = self.slot_mut(slot)
                    && s.generation == generation
                    && let Work::Busy(run) = &mut s.work
                    && run.execution_id == progress.execution_id
                {
                    run.phase =
                        proto::Phase::try_from(progress.phase).unwrap_or(proto::Phase::Unspecified);
                }
            }
            Event::StreamEnded { slot, generation } => self.stream_ended(slot, generation),
            Event::StreamGraceOver { slot, generation } => {
                self.generation_gone(slot, generation, "attach stream closed")
            }
            Event::SlotStarted(started) => self.slot_started(started),
            Event::SlotExited(exited) => {
                let status = exited.status.clone();
                if let Some(s) = self.slot_mut(exited.slot)
                    && s.generation == exited.generation
                {
                    if exited.pid != 0 {
                        s.pid = exited.pid;
                    }
                    s.exited = true;
                }
                self.generation_gone(exited.slot, exited.generation, &status);
            }
            Event::FenceTarget {
                credentials,
                execution_id,
                reply,
            } => {
                let _ = reply.send(self.fence_target(&credentials, &execution_id));
            }
            Event::PollRequest { reply } => self.poll_waiters.push_back(reply),
            Event::Polled { tasks, reserved } => {
                self.reserved = self.reserved.saturating_sub(reserved);
                for task in tasks {
                    self.dispatch(task, None);
                }
            }
            Event::PollFailed { reserved } => {
                self.reserved = self.reserved.saturating_sub(reserved);
            }
            Event::UpdateDone { slot, next_task } => {
                self.updates_in_flight = self.updates_in_flight.saturating_sub(1);
                let mut reserved_slot = None;
                if let Some(n) = slot
                    && let Some(s) = self.slot_mut(n)
                    && matches!(s.work, Work::AwaitingNext)
                {
                    s.work = Work::Idle;
                    reserved_slot = Some(n);
                }
                if let Some(task) = next_task {
                    self.dispatch(task, reserved_slot);
                }
            }
            Event::Drain { reply } => {
                let already = self.draining;
                self.start_drain();
                let _ = reply.send(already);
            }
            Event::Status { reply } => {
                let _ = reply.send(self.status());
            }
        }
    }

    fn attach(&mut self, hello: proto::Hello, tx: SlotSender) -> Result<(u32, u64), Status> {
        if hello.protocol_version != proto::ProtocolVersion::ProtocolVersion1 as i32 {
            return Err(Status::failed_precondition(format!(
                "protocol version {} is not supported; this broker speaks version 1",
                hello.protocol_version
            )));
        }
        let creds = hello
            .credentials
            .ok_or_else(|| Status::unauthenticated("hello without credentials"))?;
        let draining = self.draining;
        let broker_id = self.broker_id.clone();
        let Some(slot) = self.slot_mut(creds.slot) else {
            return Err(Status::unauthenticated(format!(
                "unknown slot {}",
                creds.slot
            )));
        };
        if slot.generation == 0 || creds.generation != slot.generation {
            tracing::warn!(
                slot = creds.slot,
                generation = creds.generation,
                current = slot.generation,
                "refused an attach of a stale or unknown generation"
            );
            return Err(Status::unauthenticated(format!(
                "generation {} of slot {} is not current",
                creds.generation, creds.slot
            )));
        }
        if !same_secret(&creds.token, &slot.token) {
            tracing::warn!(
                slot = creds.slot,
                generation = creds.generation,
                "refused an attach with a wrong token"
            );
            return Err(Status::unauthenticated("wrong slot token"));
        }
        if slot.conn.is_some() {
            return Err(Status::already_exists(format!(
                "generation {} of slot {} is already attached",
                creds.generation, creds.slot
            )));
        }
        if !hello.worker_id.is_empty() && hello.worker_id != slot.worker_id {
            return Err(Status::invalid_argument(format!(
                "slot {} has worker id {}, not {}",
                creds.slot, slot.worker_id, hello.worker_id
            )));
        }
        let welcome = proto::BrokerMessage {
            message: Some(proto::broker_message::Message::Welcome(proto::Welcome {
                protocol_version: proto::ProtocolVersion::ProtocolVersion1 as i32,
                worker_id: slot.worker_id.clone(),
                broker_worker_id: broker_id,
            })),
        };
        if tx.try_send(Ok(welcome)).is_err() {
            return Err(Status::unavailable(
                "the attach stream closed during the handshake",
            ));
        }
        slot.pid = hello.pid;
        slot.conn = Some(tx);
        slot.work = Work::Idle;
        slot.exited = false;
        tracing::info!(slot = slot.number, generation = slot.generation, worker_id = %slot.worker_id, pid = hello.pid, "executor attached");
        if draining {
            Self::send_stop(slot, "drain");
        }
        Ok((creds.slot, creds.generation))
    }

    fn send_stop(slot: &mut Slot, reason: &str) {
        slot.stopping = true;
        if let Some(tx) = &slot.conn {
            let stop = proto::BrokerMessage {
                message: Some(proto::broker_message::Message::Stop(proto::Stop {
                    reason: reason.to_owned(),
                })),
            };
            let _ = tx.try_send(Ok(stop));
        }
    }

    fn slot_started(&mut self, started: proto::SlotStarted) {
        let number = started.slot;
        let Some(slot) = self.slot_mut(number) else {
            tracing::warn!(
                slot = number,
                "SlotStarted for a slot this broker does not have"
            );
            return;
        };
        if started.generation <= slot.generation {
            tracing::warn!(
                slot = number,
                generation = started.generation,
                current = slot.generation,
                "ignored SlotStarted of an old generation"
            );
            return;
        }
        let previous = slot.generation;
        slot.generation = started.generation;
        slot.token = started.token;
        slot.pid = started.pid;
        slot.stopping = false;
        slot.exited = false;
        // A newer generation supersedes whatever the old one was doing.
        self.generation_gone(number, previous, "replaced by a new generation");
        if let Some(slot) = self.slot_mut(number) {
            slot.conn = None;
        }
    }

    /// The executor's stream ended. An idle slot is simply detached; a busy one waits a moment
    /// for the supervisor's exit report, whose status makes a better failure reason.
    fn stream_ended(&mut self, number: u32, generation: u64) {
        let events = self.events.clone();
        let Some(slot) = self.slot_mut(number) else {
            return;
        };
        if slot.generation != generation || slot.conn.is_none() {
            return;
        }
        if !matches!(slot.work, Work::Busy(_)) {
            self.generation_gone(number, generation, "attach stream closed");
            return;
        }
        slot.conn = None;
        tokio::spawn(async move {
            tokio::time::sleep(EXIT_REPORT_GRACE).await;
            let _ = events
                .send(Event::StreamGraceOver {
                    slot: number,
                    generation,
                })
                .await;
        });
    }

    /// A generation is gone (stream end, exit report or replacement): fail its assignment.
    /// Idempotent: the second report finds nothing to do.
    fn generation_gone(&mut self, number: u32, generation: u64, how: &str) {
        let counters = Arc::clone(&self.counters);
        let draining = self.draining;
        let Some(slot) = self.slot_mut(number) else {
            return;
        };
        if slot.generation != generation || generation == 0 {
            return;
        }
        let was_attached = slot.conn.take().is_some() || matches!(slot.work, Work::Busy(_));
        let work = std::mem::replace(&mut slot.work, Work::Idle);
        let worker_id = slot.worker_id.clone();
        let pid = slot.pid;
        if was_attached {
            tracing::info!(slot = number, generation, worker_id = %worker_id, "executor detached: {how}");
            if !draining {
                counters.executor_exits.inc();
            }
        }
        if let Work::Busy(run) = work {
            let reason = Reason::new(format!(
                "executor {worker_id} (pid {pid}, generation {generation}) exited ({how}) while running execution {}",
                run.execution_id
            ));
            tracing::warn!(task_id = %run.attempt.task_id, execution_id = %run.execution_id, worker_id = %worker_id, "{reason}");
            let result = RuntimeResult::failed(worker_id, reason);
            self.report(None, *run, result, false);
        }
    }

    fn fence_target(
        &mut self,
        creds: &proto::SlotCredentials,
        execution_id: &str,
    ) -> Result<String, Status> {
        let slot = self
            .slot_mut(creds.slot)
            .ok_or_else(|| Status::unauthenticated(format!("unknown slot {}", creds.slot)))?;
        if creds.generation != slot.generation || !same_secret(&creds.token, &slot.token) {
            return Err(Status::unauthenticated("wrong slot credentials"));
        }
        match &slot.work {
            Work::Busy(run) if run.execution_id == execution_id => Ok(run.attempt.task_id.clone()),
            _ => Err(Status::failed_precondition(format!(
                "execution {execution_id} is not the current assignment of slot {}",
                creds.slot
            ))),
        }
    }

    fn complete(&mut self, number: u32, generation: u64, completion: proto::Completion) {
        let counters = Arc::clone(&self.counters);
        let draining = self.draining;
        let v2 = !draining && self.reporter.v2_enabled();
        let Some(slot) = self.slot_mut(number) else {
            return;
        };
        let matches = slot.generation == generation
            && matches!(&slot.work, Work::Busy(run)
                if run.execution_id == completion.execution_id
                    && run.attempt.task_id == completion.task_id);
        if !matches {
            counters.rejected_completions.inc();
            tracing::warn!(slot = number, generation, task_id = %completion.task_id, execution_id = %completion.execution_id, "rejected a completion that is not the slot's current assignment");
            return;
        }
        let Work::Busy(run) = std::mem::replace(
            &mut slot.work,
            if v2 { Work::AwaitingNext } else { Work::Idle },
        ) else {
            unreachable!("matched Busy above");
        };
        let worker_id = slot.worker_id.clone();
        let result = match completion.result.map(wire::result_from_wire) {
            Some(Ok(result)) if result.worker_id() == worker_id => result,
            Some(Ok(result)) => RuntimeResult::failed(
                worker_id,
                Reason::new(format!(
                    "executor reported worker id {} for slot {number}",
                    result.worker_id()
                )),
            ),
            Some(Err(e)) => RuntimeResult::failed(worker_id, Reason::new(e.to_string())),
            None => {
                RuntimeResult::failed(worker_id, Reason::new("malformed completion: no result"))
            }
        };
        tracing::debug!(slot = number, task_id = %run.attempt.task_id, execution_id = %run.execution_id, status = result.status().as_str(), "execution finished");
        if let Ok(took) = run.dispatched_at.elapsed() {
            self.gauges.task_duration.observe(took.as_secs_f64());
        }
        self.report(v2.then_some(number), *run, result, v2);
    }

    fn report(&mut self, slot: Option<u32>, run: Running, result: RuntimeResult, v2: bool) {
        self.updates_in_flight += 1;
        let update = Update {
            workflow_instance_id: run.attempt.workflow_instance_id,
            task_id: run.attempt.task_id,
            execution_id: run.execution_id,
            result,
            use_v2: v2,
            lease: run.lease,
            slot,
        };
        self.reporter.spawn(update, self.events.clone());
    }

    /// Hands a task the broker will not run back to Conductor, re-queued without spending a
    /// retry (IN_PROGRESS with `callbackAfterSeconds: 0`, always through v1).
    fn hand_back(&mut self, task: &Value, why: &str) {
        let Ok(ids) = task_ref(task) else {
            tracing::warn!("dropped a task without taskId/workflowInstanceId: {why}");
            return;
        };
        tracing::info!(task_id = %ids.task_id, "handing a task back to Conductor: {why}");
        self.updates_in_flight += 1;
        self.reporter
            .spawn_hand_back(ids, self.broker_id.clone(), self.events.clone());
    }

    fn dispatch(&mut self, task: Value, preferred: Option<u32>) {
        if self.draining {
            self.hand_back(&task, "draining");
            return;
        }
        let attempt = match AttemptSnapshot::from_conductor(&task) {
            Ok(a) => a,
            Err(AttemptError::Unidentifiable { field }) => {
                tracing::error!(
                    field,
                    "dropped a polled task that cannot be identified: {field} is missing"
                );
                return;
            }
            Err(e) => {
                let ids = task_ref(&task).expect("identifiable: checked by from_conductor");
                tracing::warn!(task_id = %ids.task_id, "failing a malformed task: {e}");
                let result =
                    RuntimeResult::failed(self.broker_id.clone(), Reason::new(e.to_string()));
                self.updates_in_flight += 1;
                self.reporter.spawn(
                    Update {
                        workflow_instance_id: ids.workflow_instance_id,
                        task_id: ids.task_id,
                        execution_id: String::from("-"),
                        result,
                        use_v2: false,
                        lease: None,
                        slot: None,
                    },
                    self.events.clone(),
                );
                return;
            }
        };
        let free = |s: &Slot| s.conn.is_some() && matches!(s.work, Work::Idle) && !s.stopping;
        let index = preferred
            .and_then(|n| usize::try_from(n).ok()?.checked_sub(1))
            .filter(|&i| self.slots.get(i).is_some_and(free))
            .or_else(|| self.slots.iter().position(free));
        let Some(index) = index else {
            // More tasks than requested (a server may return more than `count`).
            self.hand_back(&task, "no free slot");
            return;
        };
        let execution_id = uuid::Uuid::new_v4().to_string();
        let lease = self.reporter.spawn_lease(&attempt, &execution_id);
        let slot = &mut self.slots[index];
        let message = proto::BrokerMessage {
            message: Some(proto::broker_message::Message::Assignment(
                proto::Assignment {
                    execution_id: execution_id.clone(),
                    attempt: Some(wire::attempt_to_wire(&attempt)),
                },
            )),
        };
        tracing::info!(
            slot = slot.number, worker_id = %slot.worker_id, task_id = %attempt.task_id,
            execution_id = %execution_id, retry_count = attempt.retry_count,
            response_timeout_seconds = attempt.response_timeout_seconds.unwrap_or(0),
            "dispatched"
        );
        let sent = slot
            .conn
            .as_ref()
            .is_some_and(|tx| tx.try_send(Ok(message)).is_ok());
        slot.work = Work::Busy(Box::new(Running {
            execution_id,
            attempt,
            dispatched_at: SystemTime::now(),
            phase: proto::Phase::Unspecified,
            lease,
        }));
        self.counters.dispatched.inc();
        if !sent {
            let (number, generation) = (slot.number, slot.generation);
            self.generation_gone(number, generation, "assignment could not be sent");
        }
    }

    fn answer_poll_waiters(&mut self) {
        while let Some(waiter) = self.poll_waiters.front() {
            if waiter.is_closed() {
                self.poll_waiters.pop_front();
                continue;
            }
            if self.draining {
                let _ = self.poll_waiters.pop_front().expect("front exists").send(0);
                continue;
            }
            let available = self.free_slots().saturating_sub(self.reserved);
            if available == 0 {
                return;
            }
            let waiter = self.poll_waiters.pop_front().expect("front exists");
            if waiter.send(available).is_ok() {
                self.reserved += available;
            }
        }
    }

    fn start_drain(&mut self) {
        if self.draining {
            return;
        }
        self.draining = true;
        tracing::info!(
            "draining: polling stops; idle executors are told to stop, busy ones finish first"
        );
        self.reporter.disable_v2();
        for slot in &mut self.slots {
            Self::send_stop(slot, "drain");
        }
    }

    fn check_drained(&mut self) {
        if !self.draining || self.updates_in_flight > 0 {
            return;
        }
        let quiet = self
            .slots
            .iter()
            .all(|s| s.conn.is_none() && matches!(s.work, Work::Idle));
        if quiet && let Some(done) = self.drained.take() {
            tracing::info!("drained: every executor detached and every result reported");
            let _ = done.send(());
        }
    }

    fn status(&self) -> admin::StatusResponse {
        let slots = self
            .slots
            .iter()
            .map(|s| {
                let state = match (&s.conn, &s.work) {
                    (None, _) if s.exited => admin::SlotState::Exited,
                    (None, _) => admin::SlotState::Waiting,
                    (Some(_), _) if s.stopping => admin::SlotState::Stopping,
                    (Some(_), Work::Busy(_) | Work::AwaitingNext) => admin::SlotState::Busy,
                    (Some(_), Work::Idle) => admin::SlotState::Idle,
                };
                let (task_id, execution_id, since, phase) = match &s.work {
                    Work::Busy(run) => (
                        run.attempt.task_id.clone(),
                        run.execution_id.clone(),
                        unix_ms(run.dispatched_at),
                        phase_name(run.phase),
                    ),
                    // The result is being reported; update-v2 may bring the next task.
                    Work::AwaitingNext => (String::new(), String::new(), 0, "reporting"),
                    Work::Idle => (String::new(), String::new(), 0, ""),
                };
                admin::SlotStatus {
                    slot: s.number,
                    worker_id: s.worker_id.clone(),
                    generation: s.generation,
                    pid: s.pid,
                    state: state as i32,
                    task_id,
                    execution_id,
                    busy_since_unix_ms: since,
                    phase: phase.to_owned(),
                }
            })
            .collect();
        admin::StatusResponse {
            task_name: self.task_name.clone(),
            broker_worker_id: self.broker_id.clone(),
            draining: self.draining,
            slots,
            counters: Some(self.counters.snapshot()),
            broker_pid: std::process::id(),
            started_at_unix_ms: unix_ms(self.started_at),
        }
    }
}

/// `body`, `staging`, … for status and logs.
pub(crate) fn phase_name(phase: proto::Phase) -> &'static str {
    match phase {
        proto::Phase::Unspecified => "assigned",
        proto::Phase::Idle => "idle",
        proto::Phase::Preparing => "preparing",
        proto::Phase::Downloading => "downloading",
        proto::Phase::Body => "body",
        proto::Phase::Staging => "staging",
        proto::Phase::Publishing => "publishing",
        proto::Phase::Cleanup => "cleanup",
        proto::Phase::Reporting => "reporting",
    }
}
