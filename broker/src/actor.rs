//! The actor around the broker's state machine: services, the poller and the reporters send it
//! [`Event`]s; it feeds them to [`Machine::handle`], answers the caller, and carries out the
//! effects — the only place that holds the executors' streams, the lease extenders and the
//! poller's pending request.

use crate::{
    report::{Reporter, Update},
    state::{Assigned, Effect, Input, InputFailure, Machine, Now, Output, Reply},
};
use perago_core::conductor::{ConductorClient, Polled};
use perago_core::json::RawJson;
use perago_proto::{admin::v1 as admin, slot::v1 as proto};
use std::{collections::HashMap, time::Duration};
use tokio::{
    sync::{mpsc, oneshot},
    task::AbortHandle,
};
use tonic::Status;
use tracing::{Instrument as _, Span};

/// After a busy executor's stream ends, how long to wait for the supervisor's exit report
/// before failing the assignment without an exit status.
const EXIT_REPORT_GRACE: Duration = Duration::from_millis(500);

/// Messages to one executor's `Attach` response stream.
pub(crate) type SlotSender = mpsc::Sender<Result<proto::BrokerMessage, Status>>;

/// Everything the actor reacts to; the inputs of the machine, with the channels that carry
/// the answers back.
#[derive(Debug)]
pub(crate) enum Event {
    /// An executor said hello on a new `Attach` stream.
    Hello {
        hello: proto::Hello,
        tx: SlotSender,
        reply: oneshot::Sender<Result<(u32, u64), Status>>,
        /// A handle on the process that opened the stream, when it is the one the hello names
        /// (to kill it if it stalls; `None` in thread mode).
        process: Option<perago_sys::reaper::pidfd::ProcessHandle>,
    },
    /// A message of an attached executor, or the end of its stream.
    Slot(Input),
    /// A poll returned (the machine's [`Input::Polled`]), with when it started: the poll
    /// span of its tasks' traces.
    Polled {
        tasks: Vec<Polled>,
        reserved: u32,
        started: std::time::SystemTime,
    },
    /// The supervisor reaped a slot's generation; answered with the broker's view of the slot
    /// once the report is taken.
    SlotExited {
        exited: proto::SlotExited,
        reply: oneshot::Sender<proto::SlotExitedAck>,
    },
    /// The supervisor (re)started a slot.
    SlotStarted {
        started: proto::SlotStarted,
        reply: oneshot::Sender<Result<(), Status>>,
    },
    /// `ReloadAttempt`: which task may this caller read?
    FenceTarget {
        credentials: proto::SlotCredentials,
        execution_id: String,
        reply: oneshot::Sender<Result<String, Status>>,
    },
    /// The poller wants to know how many tasks it may poll for (waits while none).
    PollRequest { reply: oneshot::Sender<u32> },
    /// Start draining.
    Drain { reply: oneshot::Sender<bool> },
    /// Pause polling: answered with whether it was paused already, and since when.
    Pause {
        reply: oneshot::Sender<(bool, std::time::SystemTime)>,
    },
    /// Resume polling: answered with whether it was running already.
    Resume { reply: oneshot::Sender<bool> },
    /// `Control.RollBody`: a new body version rolls.
    Roll {
        body_version: u32,
        reply: oneshot::Sender<()>,
    },
    /// `Admin.Scale`: the executor range becomes `min..=max`.
    Scale {
        min: u32,
        max: u32,
        reply: oneshot::Sender<Result<(u32, u32), Status>>,
    },
    /// `Admin.Reconfigure`: the live settings set change.
    Reconfigure {
        settings: crate::state::Reconfig,
        reply: oneshot::Sender<Result<crate::state::Reconfigured, Status>>,
    },
    /// `Admin.ShareGrant`: the permits this sharing broker may hold.
    ShareGrant {
        limit: u32,
        epoch: u64,
        reply: oneshot::Sender<Result<admin::ShareStatus, Status>>,
    },
    /// A status snapshot.
    Status {
        reply: oneshot::Sender<admin::StatusResponse>,
    },
    /// A lease extension of the execution failed: Conductor may time the attempt out
    /// meanwhile, so its report is doubted (see `applied`).
    LeaseDoubt { execution_id: String },
}

impl Event {
    /// A poll that started at `started` returned.
    pub(crate) fn polled(
        tasks: Vec<Polled>,
        reserved: u32,
        started: std::time::SystemTime,
    ) -> Self {
        Self::Polled {
            tasks,
            reserved,
            started,
        }
    }
}

/// The actor: the machine plus what its effects act on.
pub(crate) struct Actor {
    machine: Machine,
    /// Per slot (index = slot − 1): the generation attached and its stream.
    conns: Vec<Option<(u64, SlotSender)>>,
    leases: HashMap<String, AbortHandle>,
    /// Per execution held or running: its span (see [`assignment_span`]). The machine's lines
    /// about it are logged within it, and so are the reporter's, whose tasks carry it on.
    spans: HashMap<String, Span>,
    /// Per execution held or running, while traces are exported: its trace.
    traces: Option<crate::traces::Traces>,
    poll_reply: Option<oneshot::Sender<u32>>,
    /// How the supervisor set the runtime up, added to every status.
    settings: Option<perago_proto::admin::v1::RuntimeSettings>,
    reporter: Reporter,
    events: mpsc::Sender<Event>,
    drained: Option<oneshot::Sender<()>>,
    /// Where queue depths are read (run once, adaptive executor count): the client and the
    /// task type.
    queue: Option<(ConductorClient, String)>,
    /// The poll settings the poll loop follows (see [`Actor::poll_settings`]).
    poll: Option<tokio::sync::watch::Sender<crate::state::PollSettings>>,
    /// Available memory is being measured every second (see `admission`).
    measuring_memory: bool,
    /// What the gRPC health service says (`None` when not served): SERVING while the broker
    /// takes work, NOT_SERVING while paused and from the start of a drain. A task follows it
    /// (see [`Actor::with_health`]).
    serving: Option<tokio::sync::watch::Sender<bool>>,
    /// Per slot: the attached generation's process handle, to kill it if it stalls.
    processes: HashMap<u32, (u64, perago_sys::reaper::pidfd::ProcessHandle)>,
    /// The liveness clock's period (`PERAGO_STALL_TIMEOUT` / 3), when liveness is on.
    ping_every: Option<Duration>,
    /// What queue-depth reads learned: whether the last one failed (so a failure is logged
    /// once, not each second), and whether the server lacks `/tasks/queue/size`.
    depth_failing: std::sync::Arc<crate::depth::Routes>,
    /// Executions whose lease was found lost while they ran: their report is doubted (see
    /// `applied`).
    lost_leases: std::collections::HashSet<String>,
    /// Executions with a failed lease extension: their report is doubted too.
    doubted_leases: std::collections::HashSet<String>,
    /// `Admin.Watch`: bumped each time the supervisor-relevant state changes (see
    /// [`crate::state::WatchView`]); dropped once drained, which ends every watch stream.
    watch: Option<tokio::sync::watch::Sender<u64>>,
    /// The supervisor-relevant state the watchers were last told about.
    watch_view: crate::state::WatchView,
    /// The drain completed: the watchers are let go after this event.
    watch_closing: bool,
}

/// What `Admin.Watch` streams subscribe to: a counter the actor bumps at each change that
/// matters to a supervisor. The watchers read the state itself through [`Event::Status`].
#[derive(Debug, Clone)]
pub(crate) struct Watchers(std::sync::Arc<tokio::sync::watch::Receiver<u64>>);

impl Watchers {
    /// A receiver that has seen the current value: it wakes at the next change.
    pub(crate) fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        let mut rx = (*self.0).clone();
        rx.mark_unchanged();
        rx
    }
}

impl Actor {
    pub(crate) fn new(
        machine: Machine,
        slots: u32,
        reporter: Reporter,
        events: mpsc::Sender<Event>,
        drained: oneshot::Sender<()>,
    ) -> Self {
        Self {
            machine,
            conns: (0..slots).map(|_| None).collect(),
            leases: HashMap::new(),
            spans: HashMap::new(),
            traces: None,
            poll_reply: None,
            settings: None,
            reporter,
            events,
            drained: Some(drained),
            queue: None,
            poll: None,
            measuring_memory: false,
            serving: None,
            processes: HashMap::new(),
            ping_every: None,
            depth_failing: std::sync::Arc::default(),
            lost_leases: std::collections::HashSet::new(),
            doubted_leases: std::collections::HashSet::new(),
            watch: None,
            watch_view: crate::state::WatchView::default(),
            watch_closing: false,
        }
    }

    /// Serves `Admin.Watch`: the returned handle is what the service subscribes with.
    pub(crate) fn watchers(&mut self) -> Watchers {
        let (tx, rx) = tokio::sync::watch::channel(0);
        self.watch = Some(tx);
        Watchers(std::sync::Arc::new(rx))
    }

    /// Turns liveness on: the machine judges and pings at every tick, every third of
    /// `timeout`.
    pub(crate) fn with_stall_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.machine = self.machine.with_stall_timeout(timeout);
        self.ping_every = timeout.map(perago_core::liveness::ping_interval);
        self
    }

    /// Reports `settings` in every status (they never change while the broker runs).
    pub(crate) fn with_settings(
        mut self,
        settings: perago_proto::admin::v1::RuntimeSettings,
    ) -> Self {
        self.settings = Some(settings);
        self
    }

    /// Reports NOT_SERVING on `reporter` while paused and once a drain starts, SERVING
    /// otherwise: one task sets it, in the order the changes happened.
    pub(crate) fn with_health(mut self, reporter: tonic_health::server::HealthReporter) -> Self {
        let (tx, mut rx) = tokio::sync::watch::channel(self.serving_now());
        tokio::spawn(async move {
            loop {
                let serving = *rx.borrow_and_update();
                let status = if serving {
                    tonic_health::ServingStatus::Serving
                } else {
                    tonic_health::ServingStatus::NotServing
                };
                reporter.set_service_status("", status).await;
                if rx.changed().await.is_err() {
                    return;
                }
            }
        });
        self.serving = Some(tx);
        self
    }

    /// Whether the broker takes work now: neither paused nor draining.
    fn serving_now(&self) -> bool {
        !self.machine.draining() && !self.machine.paused()
    }

    /// Reads queue depths of `task_type` through `client` when the machine asks (in the
    /// domain polled in at the time).
    pub(crate) fn with_queue_depth(mut self, client: ConductorClient, task_type: String) -> Self {
        self.queue = Some((client, task_type));
        self
    }

    /// The poll settings in force, followed by the poll loop: a reconfigure that changes
    /// them sends the new ones.
    pub(crate) fn poll_settings(
        &mut self,
    ) -> tokio::sync::watch::Receiver<crate::state::PollSettings> {
        let (tx, rx) = tokio::sync::watch::channel(self.machine.poll_settings());
        self.poll = Some(tx);
        rx
    }

    /// Exports a trace per attempt through `tracer` (see `traces`).
    pub(crate) fn with_traces(
        mut self,
        tracer: perago_core::trace::Tracer,
        task_type: String,
    ) -> Self {
        self.traces = Some(crate::traces::Traces::new(tracer, task_type));
        self
    }

    /// Available memory is measured already (the broker started with a memory floor).
    pub(crate) fn measuring_memory(mut self) -> Self {
        self.measuring_memory = true;
        self
    }

    /// Runs until every event sender is gone.
    pub(crate) async fn run(mut self, mut rx: mpsc::Receiver<Event>) {
        if let Some(every) = self.ping_every {
            tokio::spawn(tick(every, self.events.downgrade()));
        }
        while let Some(event) = rx.recv().await {
            self.on_event(event);
        }
        for (_, lease) in self.leases.drain() {
            lease.abort();
        }
    }

    fn on_event(&mut self, event: Event) {
        self.handle_event(event);
        self.publish();
        // Whoever started it (Admin.Drain, a signal, run once), a drain takes no more work;
        // nor does a paused broker, until resumed.
        let serving = self.serving_now();
        if let Some(tx) = &self.serving {
            tx.send_if_modified(|now| std::mem::replace(now, serving) != serving);
        }
    }

    /// Tells the watchers when the supervisor-relevant state changed: a comparison in place
    /// while someone watches (the handle [`Watchers`] holds counts as one receiver), nothing
    /// otherwise; never a rendered status. Once drained, the watchers are let go. Unwatched,
    /// the view goes stale; a new watcher subscribes before its first read, and that read is
    /// an event with a watcher, which brings the view up to date before anything else can
    /// change.
    fn publish(&mut self) {
        let Some(watch) = &self.watch else {
            return;
        };
        if watch.receiver_count() > 1 && self.machine.update_watch_view(&mut self.watch_view) {
            watch.send_modify(|version| *version = version.wrapping_add(1));
        }
        if self.watch_closing {
            self.watch = None;
        }
    }

    fn handle_event(&mut self, event: Event) {
        match event {
            Event::Hello {
                hello,
                tx,
                reply,
                process,
            } => {
                let out = self.machine.handle(Input::Hello(hello), now());
                let Reply::Hello(answer) = out.reply else {
                    unreachable!("Hello is answered with Reply::Hello");
                };
                if let Ok((slot, generation)) = &answer
                    && let Some(conn) = self.conn_mut(*slot)
                {
                    *conn = Some((*generation, tx));
                    match process {
                        Some(process) => {
                            self.processes.insert(*slot, (*generation, process));
                        }
                        None => {
                            self.processes.remove(slot);
                        }
                    }
                }
                let _ = reply.send(answer);
                self.perform(out.effects);
            }
            Event::Slot(input) => {
                let out = self.handle_input(input);
                self.perform(out.effects);
            }
            Event::Polled {
                tasks,
                reserved,
                started,
            } => {
                if let Some(traces) = &mut self.traces {
                    traces.polled(&tasks, started);
                }
                let out = self.handle_input(Input::Polled { tasks, reserved });
                self.perform(out.effects);
                if let Some(traces) = &mut self.traces {
                    traces.poll_handled();
                }
            }
            Event::SlotExited { exited, reply } => {
                let (slot, generation) = (exited.slot, exited.generation);
                let out = self.handle_input(Input::SlotExited(exited));
                self.perform(out.effects);
                // The view after the report and everything it set off.
                let _ = reply.send(self.machine.exit_ack(slot, generation));
            }
            Event::Roll {
                body_version,
                reply,
            } => {
                let out = self.handle_input(Input::Roll { body_version });
                self.perform(out.effects);
                let _ = reply.send(());
            }
            Event::SlotStarted { started, reply } => {
                let out = self.handle_input(Input::SlotStarted(started));
                if let Reply::SlotStarted(answer) = out.reply {
                    let _ = reply.send(answer);
                }
                self.perform(out.effects);
            }
            Event::FenceTarget {
                credentials,
                execution_id,
                reply,
            } => {
                let out = self.handle_input(Input::FenceTarget {
                    credentials,
                    execution_id,
                });
                if let Reply::Fence(answer) = out.reply {
                    let _ = reply.send(answer);
                }
                self.perform(out.effects);
            }
            Event::PollRequest { reply } => {
                self.poll_reply = Some(reply);
                let out = self.machine.handle(Input::PollRequest, now());
                self.perform(out.effects);
            }
            Event::Drain { reply } => {
                let out = self.machine.handle(Input::Drain, now());
                if let Reply::Drain(already) = out.reply {
                    let _ = reply.send(already);
                }
                self.perform(out.effects);
            }
            Event::Pause { reply } => {
                let out = self.machine.handle(Input::Pause, now());
                if let Reply::Pause { already, since } = out.reply {
                    let _ = reply.send((already, since));
                }
                self.perform(out.effects);
            }
            Event::Resume { reply } => {
                let out = self.machine.handle(Input::Resume, now());
                if let Reply::Resume(already) = out.reply {
                    let _ = reply.send(already);
                }
                self.perform(out.effects);
            }
            Event::Scale { min, max, reply } => {
                let out = self.machine.handle(Input::Scale { min, max }, now());
                // Added slots get a connection place each.
                let slots = self.machine.slot_count();
                if self.conns.len() < slots {
                    self.conns.resize_with(slots, || None);
                }
                if let Reply::Scale(answer) = out.reply {
                    let _ = reply.send(answer);
                }
                self.perform(out.effects);
            }
            Event::Reconfigure { settings, reply } => {
                let out = self.machine.handle(Input::Reconfigure(settings), now());
                if let Reply::Reconfigure(answer) = out.reply {
                    let _ = reply.send(answer);
                }
                self.perform(out.effects);
            }
            Event::ShareGrant {
                limit,
                epoch,
                reply,
            } => {
                let out = self
                    .machine
                    .handle(Input::ShareGrant { limit, epoch }, now());
                if let Reply::ShareGrant(answer) = out.reply {
                    let _ = reply.send(answer);
                }
                self.perform(out.effects);
            }
            Event::Status { reply } => {
                let out = self.machine.handle(Input::Status, now());
                if let Reply::Status(mut status) = out.reply {
                    let settings = status
                        .settings
                        .insert(self.settings.clone().unwrap_or_default());
                    (settings.poll_timeout_ms, settings.poll_interval_ms) = self.machine.poll_ms();
                    let _ = reply.send(*status);
                }
                self.perform(out.effects);
            }
            Event::LeaseDoubt { execution_id } => {
                if self.machine.knows(&execution_id) {
                    self.doubted_leases.insert(execution_id);
                }
            }
        }
    }

    /// Feeds `input` to the machine within the span of the execution it is about, if any: the
    /// machine's lines about an assignment carry its ids without the machine knowing of spans.
    fn handle_input(&mut self, mut input: Input) -> Output {
        if let (Input::Completion { completion, .. }, Some(traces)) = (&mut input, &mut self.traces)
        {
            traces.completion(completion);
        }
        let lease_lost = match &input {
            Input::LeaseLost { execution_id } => Some(execution_id.clone()),
            _ => None,
        };
        let span = self
            .machine
            .execution_of_input(&input)
            .and_then(|execution_id| self.spans.get(execution_id))
            .cloned()
            .unwrap_or_else(Span::none);
        let out = span.in_scope(|| self.machine.handle(input, now()));
        // A held execution whose lease is lost is dropped: nothing else ends its span.
        if let Some(execution_id) = lease_lost {
            if self.machine.knows(&execution_id) {
                self.lost_leases.insert(execution_id);
            } else {
                self.spans.remove(&execution_id);
                if let Some(traces) = &mut self.traces {
                    traces.dropped(&execution_id, "Conductor no longer has the attempt in progress: its lease was lost while it was held");
                }
            }
        }
        out
    }

    /// The span of `execution_id`, opened at its first effect (its lease, or its dispatch).
    fn span_of(&mut self, execution_id: &str, task_id: &str) -> Span {
        self.spans
            .entry(execution_id.to_owned())
            .or_insert_with(|| assignment_span(task_id, execution_id))
            .clone()
    }

    fn conn_mut(&mut self, slot: u32) -> Option<&mut Option<(u64, SlotSender)>> {
        self.conns
            .get_mut(usize::try_from(slot).ok()?.checked_sub(1)?)
    }

    /// Carries out effects in order; an effect that fails feeds its input back at once.
    fn perform(&mut self, effects: Vec<Effect>) {
        let mut queue = std::collections::VecDeque::from(effects);
        while let Some(effect) = queue.pop_front() {
            if let Some(feedback) = self.perform_one(effect) {
                queue.extend(self.handle_input(feedback).effects);
            }
        }
        // Empty now: its allocation serves the next transition.
        self.machine.give_back(Vec::from(queue));
    }

    fn perform_one(&mut self, effect: Effect) -> Option<Input> {
        match effect {
            Effect::Send {
                slot,
                generation,
                mut message,
            } => {
                if let (
                    Some(traces),
                    Some(proto::broker_message::Message::Assignment(assignment)),
                ) = (&mut self.traces, &mut message.message)
                {
                    traces.sending(assignment);
                }
                let sent = self.conn_mut(slot).is_some_and(|conn| {
                    matches!(conn, Some((g, tx)) if *g == generation && tx.try_send(Ok(message)).is_ok())
                });
                if !sent {
                    return Some(Input::SendFailed { slot, generation });
                }
            }
            Effect::Detach { slot } => {
                if let Some(conn) = self.conn_mut(slot) {
                    *conn = None;
                }
            }
            Effect::Assigned(assigned) => {
                if let Some(traces) = &mut self.traces {
                    traces.assigned(&assigned);
                }
                let Assigned {
                    slot,
                    worker_id,
                    task_id,
                    execution_id,
                    retry_count,
                    response_timeout_seconds,
                } = *assigned;
                let span = self.span_of(&execution_id, &task_id);
                span.record("executor_worker_id", tracing::field::display(&worker_id));
                span.in_scope(|| {
                    tracing::info!(slot, retry_count, response_timeout_seconds, "dispatched");
                });
            }
            Effect::StartLease {
                execution_id,
                attempt,
            } => {
                let span = self.span_of(&execution_id, &attempt.task_id);
                if let Some(traces) = &mut self.traces {
                    let domain = self.machine.poll_settings().domain;
                    let domain = domain.as_ref().map_or("", |d| d.as_str());
                    traces.begin(&execution_id, &attempt, domain);
                }
                if let Some(lease) =
                    self.reporter
                        .spawn_lease(&attempt, &execution_id, self.events.clone(), span)
                {
                    self.leases.insert(execution_id, lease);
                }
            }
            Effect::StopLease { execution_id } => {
                // The execution was dropped (handed back): it has no more lines of its own.
                self.spans.remove(&execution_id);
                if let Some(traces) = &mut self.traces {
                    traces.dropped(&execution_id, "handed back to Conductor without a result");
                }
                self.lost_leases.remove(&execution_id);
                self.doubted_leases.remove(&execution_id);
                if let Some(lease) = self.leases.remove(&execution_id) {
                    lease.abort();
                }
            }
            Effect::Report(report) => {
                // The assignment's last work is its report: its span goes with it. A task
                // failed before it had an execution (it cannot be run) gets one for the report.
                let span = self
                    .spans
                    .remove(&report.execution_id)
                    .unwrap_or_else(|| assignment_span(&report.task_id, &report.execution_id));
                let lease = self.leases.remove(&report.execution_id);
                let lease_lost = self.lost_leases.remove(&report.execution_id);
                let lease_doubted = self.doubted_leases.remove(&report.execution_id);
                let trace = self
                    .traces
                    .as_mut()
                    .and_then(|traces| traces.take(&report.execution_id));
                let update = Update {
                    workflow_instance_id: report.workflow_instance_id,
                    task_id: report.task_id,
                    execution_id: report.execution_id,
                    result: report.result,
                    use_v2: report.use_v2,
                    lease,
                    slot: report.slot,
                    lease_lost,
                    lease_doubted,
                    retry_count: report.retry_count,
                    trace,
                };
                self.reporter.spawn(update, self.events.clone(), span);
            }
            Effect::HandBack(hand_back) => {
                self.reporter.spawn_hand_back(
                    hand_back,
                    self.machine.broker_id().to_owned(),
                    self.events.clone(),
                );
            }
            Effect::ArmExitGrace { slot, generation } => {
                let events = self.events.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(EXIT_REPORT_GRACE).await;
                    let _ = events
                        .send(Event::Slot(Input::StreamGraceOver { slot, generation }))
                        .await;
                });
            }
            Effect::GrantPoll(count) => {
                // A poller that went away cannot poll: its grant is released.
                let taken = self
                    .poll_reply
                    .take()
                    .is_some_and(|reply| reply.send(count).is_ok());
                if !taken && count > 0 {
                    return Some(Input::PollFailed { reserved: count });
                }
            }
            Effect::DisableV2 => self.reporter.disable_v2(),
            Effect::Drained => {
                self.watch_closing = true;
                if let Some(done) = self.drained.take() {
                    let _ = done.send(());
                }
            }
            Effect::FetchInput {
                execution_id,
                task_id,
                path,
            } => {
                let Some((client, ..)) = self.queue.clone() else {
                    return Some(Input::PayloadFetched {
                        execution_id,
                        input: Err(InputFailure {
                            reason: "no Conductor client to read external payload storage"
                                .to_owned(),
                            terminal: false,
                        }),
                    });
                };
                let events = self.events.clone();
                let span = self.span_of(&execution_id, &task_id);
                tokio::spawn(
                    async move {
                        let input = fetch_input(&client, &path).await;
                        let _ = events
                            .send(Event::Slot(Input::PayloadFetched {
                                execution_id,
                                input,
                            }))
                            .await;
                    }
                    .instrument(span),
                );
            }
            Effect::ReadCrashHistory(read) => {
                if let Some((client, ..)) = self.queue.clone() {
                    let events = self.events.clone();
                    let span = self.span_of(&read.execution_id, &read.task_id);
                    tokio::spawn(
                        async move {
                            let counted = match crate::crash_history::counted_before(&client, &read).await {
                                Ok(n) => {
                                    tracing::info!(counted = n, "read the crashes counted before this attempt from Conductor");
                                    Some(n)
                                }
                                Err(e) => {
                                    tracing::warn!(error = %perago_core::errors::DisplayChain(&e), "cannot count the crashes before this attempt from Conductor's record");
                                    None
                                }
                            };
                            let _ = events
                                .send(Event::Slot(Input::CrashHistory {
                                    execution_id: read.execution_id,
                                    counted,
                                }))
                                .await;
                        }
                        .instrument(span),
                    );
                } else {
                    return Some(Input::CrashHistory {
                        execution_id: read.execution_id,
                        counted: None,
                    });
                }
            }
            Effect::KillExecutor {
                slot,
                generation,
                why,
            } => match self.processes.remove(&slot) {
                Some((g, process)) if g == generation => {
                    match process.signal(perago_sys::signal::SIGKILL) {
                        Ok(()) => tracing::warn!(
                            slot,
                            generation,
                            pid = process.pid(),
                            "SIGKILLed a stalled executor: {why}"
                        ),
                        Err(e) => {
                            tracing::error!(slot, generation, pid = process.pid(), error = %perago_core::errors::DisplayChain(&e), "cannot SIGKILL a stalled executor: {why}")
                        }
                    }
                }
                _ => {
                    // Thread mode, or a kernel without pidfds: its stream is dropped, which
                    // ends an executor that still runs; one that is stopped stays so.
                    tracing::error!(
                        slot,
                        generation,
                        "no process handle to kill a stalled executor with; its stream is dropped instead: {why}"
                    );
                }
            },
            Effect::PollSettings(settings) => {
                self.machine
                    .gauges()
                    .set_runtime_info(settings.domain.as_ref());
                if let Some(poll) = &self.poll {
                    poll.send_replace(*settings);
                }
            }
            Effect::WatchMemory => {
                if !std::mem::replace(&mut self.measuring_memory, true) {
                    tokio::spawn(crate::admission::watch(self.events.clone(), false));
                }
            }
            Effect::ReadQueueDepth { after } => {
                let domain = self.machine.poll_settings().domain;
                if let Some((client, task_type)) = self.queue.clone() {
                    let events = self.events.clone();
                    let failing = std::sync::Arc::clone(&self.depth_failing);
                    tokio::spawn(async move {
                        tokio::time::sleep(after).await;
                        let depth =
                            crate::depth::read(&client, &task_type, domain.as_ref(), &failing)
                                .await;
                        let now = std::time::Instant::now();
                        let _ = events
                            .send(Event::Slot(Input::QueueDepth { depth, now }))
                            .await;
                    });
                }
            }
        }
        None
    }
}

/// The time an input is handled at: the machine reads no clock of its own.
fn now() -> Now {
    Now {
        instant: std::time::Instant::now(),
        wall: std::time::SystemTime::now(),
    }
}

/// The liveness clock: an [`Input::Tick`] every `every` while the actor lives.
async fn tick(every: Duration, events: mpsc::WeakSender<Event>) {
    let mut interval = tokio::time::interval(every);
    // A late tick is one tick, not a burst: the machine sees how late it is.
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let Some(events) = events.upgrade() else {
            return;
        };
        let now = std::time::Instant::now();
        if events.send(Event::Slot(Input::Tick { now })).await.is_err() {
            return;
        }
    }
}

/// The span of one execution, from its first effect to its report: every broker line about
/// the assignment is logged within it, so it carries `task_id`, `execution_id` and, once the
/// execution is dispatched, `executor_worker_id`: the worker id of the executor running it
/// (the JSONL layer writes a span's fields into each line; a line's `worker_id` is its file's
/// worker, the broker).
///
/// At ERROR level so that it is on whenever any line is: a warning such as "task result lost"
/// keeps its ids at `RUST_LOG=warn` too. It has no parent: it outlives whatever was being
/// handled when it opened.
fn assignment_span(task_id: &str, execution_id: &str) -> Span {
    tracing::error_span!(
        parent: None,
        "assignment",
        task_id = %task_id,
        execution_id = %execution_id,
        executor_worker_id = tracing::field::Empty,
    )
}

/// The longest a task input's download from external payload storage may take (10 MiB at
/// a slow 100 KiB/s); the location request has its own 30 s bound. The task's lease is
/// extended meanwhile.
const INPUT_FETCH_TIMEOUT: Duration = Duration::from_secs(100);

/// Fetches a task input from Conductor's external payload storage, in a task of its own: the
/// actor's loop and the other slots never wait for it.
async fn fetch_input(client: &ConductorClient, path: &str) -> Result<RawJson, InputFailure> {
    let started = std::time::Instant::now();
    match perago_core::conductor::fetch_task_input(
        client,
        path,
        perago_proto::MAX_TASK_PAYLOAD_BYTES,
        INPUT_FETCH_TIMEOUT,
    )
    .await
    {
        Ok(input) => {
            tracing::info!(
                bytes = input.len(),
                ms = started.elapsed().as_millis() as u64,
                "fetched the task input from external payload storage"
            );
            Ok(input)
        }
        Err(e) => {
            tracing::warn!(error = %perago_core::errors::DisplayChain(&e), terminal = e.is_terminal(), "cannot fetch the task input from external payload storage");
            Err(InputFailure {
                reason: format!(
                    "task input in external payload storage: {}",
                    perago_core::errors::DisplayChain(&e)
                ),
                terminal: e.is_terminal(),
            })
        }
    }
}
