//! The broker's one owner of truth: a state machine that holds every slot and decides dispatch,
//! completion, executor death and drain. [`Machine::handle`] takes one [`Input`] and returns
//! the [`Effect`]s to perform (messages to executors, result updates, lease extenders, poll
//! grants) plus the answer to the caller; it performs no I/O and spawns nothing, so every
//! transition can be driven step by step in a unit test. The actor in [`crate::actor`] owns the
//! connections and the Conductor side and carries the effects out.
//!
//! A slot is *free* when its current generation is attached, idle and not stopping. Polls ask
//! for at most `free − reserved − held` tasks, and for one while the last poll came back
//! short (a sparse queue: see [`poll_wait`]); a completion whose update goes through
//! update-v2 keeps its slot reserved (`AwaitingNext`) so the task the server hands back takes
//! exactly the slot that was freed, and never more than N tasks are held.
//!
//! A task the broker received is run, not handed back, wherever that can be done: a task that
//! arrives for a slot that has gone (update-v2's next task after its executor died, a poll
//! that returned while a slot died) is *held* with its lease extended until a slot is free;
//! a drain waits for the poll in flight and runs what it returns before it stops the idle
//! executors. Hand-backs remain only where nothing can run the task (more tasks than asked
//! for, or every executor gone during a drain): Conductor keeps the attempt's `startTime`, so
//! its `timeoutSeconds` keeps running (see docs/runtime.md).
//!
//! What arrives is not believed blindly: a task of another type is handed back untouched
//! (never run, failed or completed here), and a task id already running, held or reported
//! lately is dropped, so one task never runs twice at once (see `receive`).

use crate::{
    counters::Counters,
    counters::Gauges,
    poison::{self, CrashLedger, ExitEvidence, RecentDeaths, Verdict, WorkflowTask},
    recent::RecentlyReported,
    wire,
};
use perago_core::{
    attempt::{AttemptError, AttemptSnapshot, TaskRef},
    capacity::{Capacity, PERAGO_MIN_FREE_MEMORY},
    conductor::{Polled, TaskTypes},
    identity::{Slot as SlotNumber, WorkerPrefix},
    json::RawJson,
    memory::format_bytes,
    result::{Reason, RuntimeResult},
};
use perago_proto::{admin::v1 as admin, slot::v1 as proto};
use std::{
    collections::{HashMap, VecDeque},
    sync::Arc,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};
use tonic::Status;

/// Everything the machine reacts to.
#[derive(Debug)]
pub(crate) enum Input {
    /// An executor said hello on a new `Attach` stream. Answer: [`Reply::Hello`].
    Hello(proto::Hello),
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
    /// A message to an executor could not be queued: its stream is gone.
    SendFailed { slot: u32, generation: u64 },
    /// The supervisor (re)started a slot. Answer: [`Reply::SlotStarted`].
    SlotStarted(proto::SlotStarted),
    /// The supervisor reaped a slot's process.
    SlotExited(proto::SlotExited),
    /// `ReloadAttempt`: which task may this caller read? Answer: [`Reply::Fence`].
    FenceTarget {
        credentials: proto::SlotCredentials,
        execution_id: String,
    },
    /// The poller wants to know how many tasks it may poll for; answered by
    /// [`Effect::GrantPoll`] as soon as a slot is free.
    PollRequest,
    /// A poll returned.
    Polled { tasks: Vec<Polled>, reserved: u32 },
    /// A poll failed; its reservation is released.
    PollFailed { reserved: u32 },
    /// A result update (or a hand-back, with `slot` and `next_task` empty) finished.
    UpdateDone {
        slot: Option<u32>,
        next_task: Option<Polled>,
    },
    /// Conductor no longer has this execution's attempt in progress (read back after a lease
    /// extension): it timed the attempt out or retried it elsewhere.
    LeaseLost { execution_id: String },
    /// Start draining. Answer: [`Reply::Drain`] (whether a drain was already under way).
    Drain,
    /// The task type's queue depth was read from Conductor (`None`: the read failed) at `now`:
    /// the clock of run once and of the adaptive executor count.
    QueueDepth { depth: Option<u64>, now: Instant },
    /// A status snapshot. Answer: [`Reply::Status`].
    Status,
    /// Available memory was measured (only with `PERAGO_MIN_FREE_MEMORY`): admission opens
    /// or closes.
    Memory { available: u64 },
    /// The crashes counted against a parked crash's workflow task before its attempt, as
    /// Conductor's record of the earlier attempts says (`None`: it could not be read); answers
    /// [`Effect::ReadCrashHistory`].
    CrashHistory {
        execution_id: String,
        counted: Option<u32>,
    },
    /// The liveness clock (every third of `PERAGO_STALL_TIMEOUT`): ping every attached
    /// executor, and kill one not heard from for the whole timeout (see `tick`).
    Tick { now: Instant },
    /// An executor answered a ping (any message counts as a sign of life; this one says
    /// nothing else).
    Pong { slot: u32, generation: u64 },
    /// The externalized input of a held task was fetched, or why not; answers
    /// [`Effect::FetchInput`].
    PayloadFetched {
        execution_id: String,
        input: Result<RawJson, InputFailure>,
    },
}

/// Why an externalized input could not be fetched, and whether a retry could do better.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct InputFailure {
    pub(crate) reason: String,
    pub(crate) terminal: bool,
}

/// The machine's answer to the caller of an input that asks a question.
#[derive(Debug)]
pub(crate) enum Reply {
    /// Nothing to answer.
    None,
    /// The attach is accepted as (slot, generation), or refused.
    Hello(Result<(u32, u64), Status>),
    /// `SlotStarted` was taken, or refused (the supervisor acts on the refusal).
    SlotStarted(Result<(), Status>),
    /// The task id the caller may read back, or why not.
    Fence(Result<String, Status>),
    /// A drain was already under way.
    Drain(bool),
    /// The status snapshot.
    Status(Box<admin::StatusResponse>),
}

/// A result update to deliver.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Report {
    pub(crate) workflow_instance_id: String,
    pub(crate) task_id: String,
    pub(crate) execution_id: String,
    pub(crate) result: RuntimeResult,
    /// Through update-v2, whose answer may be the next task for `slot`.
    pub(crate) use_v2: bool,
    /// The slot waiting for update-v2's next task.
    pub(crate) slot: Option<u32>,
    /// The attempt's retry count, for the result journal; `None` for a result the broker made
    /// for a task it could not map (not journaled).
    pub(crate) retry_count: Option<u32>,
}

/// What the actor must do after a transition, in order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Effect {
    /// Queue a message on the stream of the slot's current generation; if that fails, feed
    /// back [`Input::SendFailed`].
    Send {
        slot: u32,
        generation: u64,
        message: proto::BrokerMessage,
    },
    /// Drop the slot's stream (the executor sees its end).
    Detach { slot: u32 },
    /// An execution was dispatched to a slot (its assignment message follows): the actor
    /// opens the assignment's span, which every later line about it is logged in.
    Assigned(Box<Assigned>),
    /// Start extending the lease of this execution's attempt.
    StartLease {
        execution_id: String,
        attempt: Box<AttemptSnapshot>,
    },
    /// Stop extending a lease that no update will stop (the attempt was dropped).
    StopLease { execution_id: String },
    /// Deliver a result (the lease of `execution_id` stops once it is acknowledged).
    Report(Box<Report>),
    /// Give a task back to Conductor (IN_PROGRESS, `callbackAfterSeconds: 0`, v1).
    HandBack(HandBack),
    /// Feed back [`Input::StreamGraceOver`] after a short grace.
    ArmExitGrace { slot: u32, generation: u64 },
    /// Answer the waiting poller: poll for this many tasks (0: stop polling).
    GrantPoll(u32),
    /// From now on every update goes through v1.
    DisableV2,
    /// The drain is complete: every executor detached, every result reported.
    Drained,
    /// Read the task type's queue depth from Conductor after `after`, and feed back
    /// [`Input::QueueDepth`] (run once and the adaptive executor count only).
    ReadQueueDepth { after: Duration },
    /// Read how many crashes Conductor's record of the earlier attempts counts against a
    /// workflow task (walking back `retriedTaskId`), and feed back [`Input::CrashHistory`].
    /// The crash's result waits (parked, its lease extended) until then.
    ReadCrashHistory(Box<HistoryRead>),
    /// SIGKILL the executor process of this generation (through the handle taken when it
    /// attached; never by a bare pid, which may have been reused): it stalled. `why` is for
    /// the log.
    KillExecutor {
        slot: u32,
        generation: u64,
        why: String,
    },
    /// Fetch a held task's input from Conductor's external payload storage (`path` is its
    /// `externalInputPayloadStoragePath`) and feed back [`Input::PayloadFetched`].
    FetchInput {
        execution_id: String,
        task_id: String,
        path: String,
    },
}

/// Where to start reading a workflow task's crash history, and what each earlier attempt
/// must match to be believed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HistoryRead {
    pub(crate) execution_id: String,
    /// The attempt whose crash waits.
    pub(crate) task_id: String,
    /// The attempt it was retried from: the first one read.
    pub(crate) retried_task_id: String,
    pub(crate) workflow_instance_id: String,
    pub(crate) reference_task_name: String,
    pub(crate) task_def_name: String,
}

/// A task to give back to Conductor without running it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HandBack {
    pub(crate) ids: TaskRef,
    /// The task's `outputData` as it was polled, sent back with it: Conductor replaces a
    /// task's output with every update's, so a task of another type keeps what it had.
    /// `None` for the broker's own tasks, whose output it did not keep.
    pub(crate) output: Option<serde_json::Value>,
}

/// What the actor needs to know of a dispatch: the assignment's ids, and what the
/// "dispatched" line says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Assigned {
    pub(crate) slot: u32,
    pub(crate) worker_id: String,
    pub(crate) task_id: String,
    pub(crate) execution_id: String,
    pub(crate) retry_count: u32,
    pub(crate) response_timeout_seconds: u64,
}

/// The output of one transition.
#[derive(Debug)]
pub(crate) struct Output {
    pub(crate) reply: Reply,
    pub(crate) effects: Vec<Effect>,
}

#[derive(Debug)]
struct Running {
    execution_id: String,
    attempt: AttemptSnapshot,
    dispatched_at: SystemTime,
    phase: proto::Phase,
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
    attached: bool,
    /// The attached executor starts bodies at dispatch (see `Hello.body_at_dispatch`).
    body_at_dispatch: bool,
    work: Work,
    stopping: bool,
    /// The generation asked to be recycled and was told to stop: its exit is no failure.
    recycled: bool,
    exited: bool,
    /// Part of the executor count the runtime wants now (`-j MIN..MAX`: the supervisor runs an
    /// executor for a wanted slot; an unwanted one is retired). Always true with `-j N`.
    wanted: bool,
    /// Since when the slot has been seen free (at a queue-depth read) without taking a task.
    idle_since: Option<Instant>,
    /// Liveness: a message of the attached generation arrived since the last tick.
    heard: bool,
    /// Liveness: the tick at which the attached generation was last heard from.
    last_heard: Option<Instant>,
    /// This generation stopped answering and was killed by the broker (`PERAGO_STALL_TIMEOUT`):
    /// its death is the runtime's doing, never its task's (poison detection must not count it).
    stalled: bool,
}

impl Slot {
    fn free(&self) -> bool {
        self.attached && matches!(self.work, Work::Idle) && !self.stopping && self.wanted
    }

    /// What the slot is doing, as Admin.Status shows it.
    fn state(&self) -> admin::SlotState {
        match (self.attached, &self.work) {
            (false, _) if !self.wanted => admin::SlotState::Retired,
            (false, _) if self.exited => admin::SlotState::Exited,
            (false, _) => admin::SlotState::Waiting,
            (true, _) if self.stopping => admin::SlotState::Stopping,
            (true, Work::Busy(_) | Work::AwaitingNext) => admin::SlotState::Busy,
            (true, Work::Idle) => admin::SlotState::Idle,
        }
    }
}

/// The part of the state a supervisor acts on (see `Admin.Watch`): the actor compares it after
/// each event, in place, and tells the watchers only when it changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct WatchView {
    draining: bool,
    admission_open: bool,
    wanted_executors: u64,
    /// Per slot: state, generation, pid, recycling.
    slots: Vec<(admin::SlotState, u64, u32, bool)>,
}

/// How often the queue depth is read (run once, adaptive executor count).
pub(crate) const QUEUE_DEPTH_INTERVAL: Duration = Duration::from_secs(1);

/// A crash whose count against its workflow task waits for Conductor's record
/// ([`Effect::ReadCrashHistory`]); its lease runs until it is reported.
#[derive(Debug)]
struct Parked {
    run: Running,
    worker_id: String,
    crash: String,
}
/// Run once while the queue depth cannot be read: this many empty polls in a row, every slot
/// idle throughout, end the run.
pub(crate) const ONCE_EMPTY_POLLS: u32 = 3;

/// The `timeout` of a poll for more than one task. Conductor's SQL queues answer a batch poll
/// only once it holds `count` tasks or its timeout has passed, the tasks popped meanwhile
/// waiting in the server: a poll for several tasks must not wait long.
pub(crate) const FILL_WAIT: Duration = Duration::from_millis(100);

/// How long a poll for `count` tasks may wait, given `PERAGO_POLL_WAIT_MS` (`long`): a poll
/// for one task is answered by its first task on every queue backend, so it may wait the
/// whole long poll; a poll for more waits at most [`FILL_WAIT`], so no task waits for a
/// batch to fill.
pub(crate) fn poll_wait(count: u32, long: Duration) -> Duration {
    if count > 1 { FILL_WAIT.min(long) } else { long }
}

/// A task received for which no slot was free yet: its lease runs until one is.
#[derive(Debug)]
struct Held {
    execution_id: String,
    attempt: AttemptSnapshot,
    /// Its input is being fetched from external payload storage: it waits for that, not
    /// only for a slot.
    fetching: bool,
}

/// The state machine.
#[derive(Debug)]
pub(crate) struct Machine {
    task_name: String,
    /// The capacity and lifecycle settings (`-j`, recycling, admission, poison, run once).
    capacity: Capacity,
    /// Memory admission: whether new tasks may be polled (and slots added) now. Always true
    /// without `PERAGO_MIN_FREE_MEMORY`.
    admission_open: bool,
    /// The task type's queue depth as Conductor last reported it (run once, adaptive range).
    queue_depth: Option<u64>,
    /// Executor crashes per workflow task (poison detection, `PERAGO_POISON_AFTER`).
    crashes: CrashLedger,
    /// Unexplained executor deaths lately: the evidence of a burst (poison detection).
    deaths: RecentDeaths,
    /// Crashes waiting for their workflow task's history, by execution id.
    parked: HashMap<String, Parked>,
    /// The clock of burst detection; a test sets it, else the real one.
    clock: Option<Instant>,
    /// Task ids reported lately: a poll that returns one again is not believed.
    reported: RecentlyReported,
    /// Available memory when last measured (memory admission).
    available_memory: Option<u64>,
    /// The waiting poll request has been counted as withheld by memory admission.
    poll_withheld: bool,
    /// Queue-depth reads asked for so far; one is in flight while `depth_read_pending`.
    depth_reads: u64,
    depth_read_pending: bool,
    /// Run once: a poll came back empty while everything was idle, and nothing has happened
    /// since; the value is `depth_reads` then (only a read asked for later confirms it). While
    /// set, no poll is granted: a confirming read of 0 drains with no poll in flight.
    quiet_after: Option<u64>,
    broker_id: String,
    slots: Vec<Slot>,
    held: VecDeque<Held>,
    draining: bool,
    /// Tasks granted to the poll in flight.
    reserved: u32,
    poll_wanted: bool,
    /// The poller has been told to stop.
    poll_stopped: bool,
    updates_in_flight: u32,
    /// Whether completions go through update-v2 (shared with the reporter, which turns it
    /// off when the server lacks update-v2).
    v2: Arc<std::sync::atomic::AtomicBool>,
    counters: Arc<Counters>,
    gauges: Arc<Gauges>,
    started_at: SystemTime,
    drained: bool,
    effects: Vec<Effect>,
    /// `PERAGO_STALL_TIMEOUT` (`None`: liveness off).
    stall_timeout: Option<Duration>,
    /// The last ping's sequence number.
    ping_sequence: u64,
    /// When the last liveness tick came (a late one means the broker itself was not running).
    last_tick: Option<Instant>,
    /// The last queue-depth read failed (both routes): run once cannot confirm an empty
    /// queue that way and counts empty polls instead.
    depth_unreadable: bool,
    /// Run once with the depth unreadable: empty polls in a row while everything was idle.
    once_empty_polls: u32,
    /// The last poll came back with fewer tasks than it asked for: the queue looks sparse, so
    /// the next poll asks for one task (a long poll that its first task answers); after a
    /// poll that came back full, polls ask for every free slot again (with [`FILL_WAIT`]).
    poll_sparse: bool,
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

fn stop_message(reason: &str) -> proto::BrokerMessage {
    proto::BrokerMessage {
        message: Some(proto::broker_message::Message::Stop(proto::Stop {
            reason: reason.to_owned(),
        })),
    }
}

impl Machine {
    pub(crate) fn new(
        task_name: String,
        prefix: &WorkerPrefix,
        capacity: Capacity,
        v2: Arc<std::sync::atomic::AtomicBool>,
        counters: Arc<Counters>,
        gauges: Arc<Gauges>,
        started_at: SystemTime,
    ) -> Self {
        let slots = capacity.max_executors;
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        gauges.slots.store(u64::from(slots), relaxed);
        gauges
            .wanted_executors
            .store(u64::from(capacity.min_executors), relaxed);
        gauges.queue_depth.store(u64::MAX, relaxed);
        gauges.admission_open.store(1, relaxed);
        let slots = (1..=slots)
            .map(|n| Slot {
                number: n,
                worker_id: prefix.worker_id(SlotNumber::new(u64::from(n)).expect("1..=N")),
                generation: 0,
                token: String::new(),
                pid: 0,
                attached: false,
                body_at_dispatch: false,
                work: Work::Idle,
                stopping: false,
                recycled: false,
                exited: false,
                wanted: n <= capacity.min_executors,
                idle_since: None,
                heard: false,
                last_heard: None,
                stalled: false,
            })
            .collect();
        Self {
            task_name,
            capacity,
            admission_open: true,
            queue_depth: None,
            crashes: CrashLedger::default(),
            deaths: RecentDeaths::default(),
            parked: HashMap::new(),
            clock: None,
            reported: RecentlyReported::default(),
            available_memory: None,
            poll_withheld: false,
            depth_reads: 0,
            depth_read_pending: false,
            quiet_after: None,
            broker_id: prefix.broker_id(),
            slots,
            held: VecDeque::new(),
            draining: false,
            reserved: 0,
            poll_wanted: false,
            poll_stopped: false,
            updates_in_flight: 0,
            v2,
            counters,
            gauges,
            started_at,
            drained: false,
            effects: Vec::new(),
            stall_timeout: None,
            ping_sequence: 0,
            last_tick: None,
            depth_unreadable: false,
            once_empty_polls: 0,
            poll_sparse: false,
        }
    }

    /// Turns liveness on (`PERAGO_STALL_TIMEOUT`): [`Input::Tick`] pings and judges.
    pub(crate) fn with_stall_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.stall_timeout = timeout;
        self
    }

    /// The broker's own worker id (polls, hand-backs).
    pub(crate) fn broker_id(&self) -> &str {
        &self.broker_id
    }

    /// The execution slot `number` runs now, if it is busy.
    pub(crate) fn execution_of(&self, number: u32) -> Option<&str> {
        let slot = self
            .slots
            .get(usize::try_from(number).ok()?.checked_sub(1)?)?;
        match &slot.work {
            Work::Busy(run) => Some(&run.execution_id),
            _ => None,
        }
    }

    /// Whether `execution_id` is held or running here.
    pub(crate) fn knows(&self, execution_id: &str) -> bool {
        self.held.iter().any(|h| h.execution_id == execution_id)
            || self.parked.contains_key(execution_id)
            || self
                .slots
                .iter()
                .any(|s| matches!(&s.work, Work::Busy(run) if run.execution_id == execution_id))
    }

    /// The execution an input is about, if it concerns one the machine holds or runs: the
    /// actor handles it within that assignment's span.
    pub(crate) fn execution_of_input<'a>(&'a self, input: &'a Input) -> Option<&'a str> {
        match input {
            Input::Completion { completion, .. } => Some(&completion.execution_id),
            Input::Progress { progress, .. } => Some(&progress.execution_id),
            Input::LeaseLost { execution_id }
            | Input::FenceTarget { execution_id, .. }
            | Input::PayloadFetched { execution_id, .. } => Some(execution_id),
            Input::StreamEnded { slot, .. }
            | Input::StreamGraceOver { slot, .. }
            | Input::SendFailed { slot, .. } => self.execution_of(*slot),
            Input::SlotStarted(started) => self.execution_of(started.slot),
            Input::SlotExited(exited) => self.execution_of(exited.slot),
            Input::CrashHistory { execution_id, .. } => Some(execution_id),
            _ => None,
        }
    }

    /// One transition: the answer to `input` and the effects to perform, in order.
    pub(crate) fn handle(&mut self, input: Input) -> Output {
        self.note_heard(&input);
        let reply = self.step(input);
        self.run_held();
        self.settle_drain();
        self.grant_poll();
        self.check_drained();
        if !self.all_idle() {
            self.quiet_after = None;
            self.once_empty_polls = 0;
        }
        self.request_queue_depth();
        let busy = self
            .slots
            .iter()
            .filter(|s| matches!(s.work, Work::Busy(_)))
            .count() as u64;
        self.gauges
            .busy_slots
            .store(busy, std::sync::atomic::Ordering::Relaxed);
        Output {
            reply,
            effects: std::mem::take(&mut self.effects),
        }
    }

    fn step(&mut self, input: Input) -> Reply {
        match input {
            Input::Hello(hello) => return Reply::Hello(self.attach(hello)),
            Input::Completion {
                slot,
                generation,
                completion,
            } => self.complete(slot, generation, completion),
            Input::Progress {
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
            Input::StreamEnded { slot, generation } => self.stream_ended(slot, generation),
            Input::StreamGraceOver { slot, generation } => {
                self.generation_gone(slot, generation, "attach stream closed");
            }
            Input::SendFailed { slot, generation } => {
                self.generation_gone(slot, generation, "its stream closed");
            }
            Input::SlotStarted(started) => return Reply::SlotStarted(self.slot_started(started)),
            Input::SlotExited(exited) => {
                let status = exited.status.clone();
                if let Some(s) = self.slot_mut(exited.slot)
                    && s.generation == exited.generation
                {
                    if exited.pid != 0 {
                        s.pid = exited.pid;
                    }
                    s.exited = true;
                }
                let evidence = ExitEvidence::of(&exited);
                self.generation_gone_with(exited.slot, exited.generation, &status, Some(evidence));
            }
            Input::FenceTarget {
                credentials,
                execution_id,
            } => return Reply::Fence(self.fence_target(&credentials, &execution_id)),
            Input::PollRequest => self.poll_wanted = true,
            Input::Polled { tasks, reserved } => {
                self.reserved = self.reserved.saturating_sub(reserved);
                self.poll_sparse = tasks.len() < reserved as usize;
                if tasks.is_empty() && self.capacity.once && self.all_idle() {
                    self.once_idle_empty_poll();
                } else {
                    self.once_empty_polls = 0;
                }
                for task in tasks {
                    self.receive(task, None);
                }
            }
            Input::PollFailed { reserved } => {
                self.reserved = self.reserved.saturating_sub(reserved);
            }
            Input::UpdateDone { slot, next_task } => {
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
                    self.receive(task, reserved_slot);
                }
            }
            Input::LeaseLost { execution_id } => self.lease_lost(&execution_id),
            Input::Drain => {
                let already = self.draining;
                self.start_drain();
                return Reply::Drain(already);
            }
            Input::Status => return Reply::Status(Box::new(self.status())),
            Input::Memory { available } => self.memory_measured(available),
            Input::QueueDepth { depth, now } => self.queue_depth_read(depth, now),
            Input::CrashHistory {
                execution_id,
                counted,
            } => self.crash_history_read(&execution_id, counted),
            Input::Tick { now } => self.tick(now),
            // Heard (see `note_heard`): nothing more to do.
            Input::Pong { .. } => {}
            Input::PayloadFetched {
                execution_id,
                input,
            } => self.input_fetched(&execution_id, input),
        }
        Reply::None
    }

    fn slot_mut(&mut self, number: u32) -> Option<&mut Slot> {
        self.slots
            .get_mut(usize::try_from(number).ok()?.checked_sub(1)?)
    }

    fn send(&mut self, slot: u32, generation: u64, message: proto::BrokerMessage) {
        self.effects.push(Effect::Send {
            slot,
            generation,
            message,
        });
    }

    fn attach(&mut self, hello: proto::Hello) -> Result<(u32, u64), Status> {
        if hello.protocol_version != proto::ProtocolVersion::ProtocolVersion1 as i32 {
            return Err(Status::failed_precondition(format!(
                "protocol version {} is not supported; this broker speaks version 1",
                hello.protocol_version
            )));
        }
        let creds = hello
            .credentials
            .ok_or_else(|| Status::unauthenticated("hello without credentials"))?;
        let broker_id = self.broker_id.clone();
        let stall_timeout_ms = self
            .stall_timeout
            .map_or(0, |t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX));
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
        if slot.stalled {
            return Err(Status::unauthenticated(format!(
                "generation {} of slot {} was killed for not answering",
                creds.generation, creds.slot
            )));
        }
        if slot.attached {
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
                stall_timeout_ms,
            })),
        };
        slot.pid = hello.pid;
        slot.body_at_dispatch = hello.body_at_dispatch;
        slot.attached = true;
        slot.work = Work::Idle;
        slot.exited = false;
        // Heard: its first tick starts its liveness clock.
        slot.heard = true;
        slot.last_heard = None;
        tracing::info!(slot = slot.number, generation = slot.generation, worker_id = %slot.worker_id, pid = hello.pid, "executor attached");
        let stopping = slot.stopping;
        self.send(creds.slot, creds.generation, welcome);
        if stopping && self.draining {
            // The drain told this slot to stop before its executor attached.
            self.send(creds.slot, creds.generation, stop_message("drain"));
        }
        Ok((creds.slot, creds.generation))
    }

    fn slot_started(&mut self, started: proto::SlotStarted) -> Result<(), Status> {
        let number = started.slot;
        let Some(slot) = self.slot_mut(number) else {
            tracing::warn!(
                slot = number,
                "SlotStarted for a slot this broker does not have"
            );
            return Err(Status::not_found(format!(
                "this broker has no slot {number}"
            )));
        };
        // Generations are taken only in the order the supervisor issues them: exactly one
        // past the current. The control token is the credential; this order is what keeps a
        // leaked or replayed announcement from jumping ahead (a generation far in the future
        // would make every later one of the real supervisor look old) or from replaying an
        // old one. The supervisor's retry of the announcement it is waiting on (same
        // generation, same token, nothing attached yet) is answered as taken.
        let expected = slot.generation + 1;
        if started.generation == slot.generation
            && slot.generation != 0
            && !slot.attached
            && same_secret(&started.token, &slot.token)
        {
            return Ok(());
        }
        if started.generation != expected {
            tracing::error!(
                slot = number,
                generation = started.generation,
                current = slot.generation,
                expected,
                "refused a SlotStarted out of order (the slot keeps its executor)"
            );
            return Err(Status::failed_precondition(format!(
                "slot {number} is at generation {}: it takes generation {expected} next, not {}",
                slot.generation, started.generation
            )));
        }
        // The old generation is gone first (its assignment failed and reported, its stream
        // dropped): only then does the new one take the slot.
        let previous = slot.generation;
        self.generation_gone(number, previous, "replaced by a new generation");
        let slot = self.slot_mut(number).expect("checked above");
        slot.generation = started.generation;
        slot.token = started.token;
        slot.pid = started.pid;
        slot.stopping = false;
        slot.recycled = false;
        slot.exited = false;
        slot.attached = false;
        slot.work = Work::Idle;
        slot.stalled = false;
        Ok(())
    }

    /// The executor's stream ended. An idle slot is simply detached; a busy one waits a moment
    /// for the supervisor's exit report, whose status makes a better failure reason.
    fn stream_ended(&mut self, number: u32, generation: u64) {
        let Some(slot) = self.slot_mut(number) else {
            return;
        };
        if slot.generation != generation || !slot.attached {
            return;
        }
        if !matches!(slot.work, Work::Busy(_)) {
            self.generation_gone(number, generation, "attach stream closed");
            return;
        }
        slot.attached = false;
        self.effects.push(Effect::Detach { slot: number });
        self.effects.push(Effect::ArmExitGrace {
            slot: number,
            generation,
        });
    }

    /// A generation is gone (stream end, exit report or replacement): fail its assignment.
    /// Idempotent: the second report finds nothing to do.
    fn generation_gone(&mut self, number: u32, generation: u64, how: &str) {
        self.generation_gone_with(number, generation, how, None);
    }

    /// [`Machine::generation_gone`] with the supervisor's exit report, whose evidence decides
    /// whether the death counts against the task it ran (poison detection).
    fn generation_gone_with(
        &mut self,
        number: u32,
        generation: u64,
        how: &str,
        evidence: Option<ExitEvidence>,
    ) {
        let draining = self.draining;
        let Some(slot) = self.slot_mut(number) else {
            return;
        };
        if slot.generation != generation || generation == 0 {
            return;
        }
        let retired = !slot.wanted;
        let stopping = slot.stopping;
        let had_stream = std::mem::replace(&mut slot.attached, false);
        let was_attached = had_stream || matches!(slot.work, Work::Busy(_));
        let work = std::mem::replace(&mut slot.work, Work::Idle);
        let worker_id = slot.worker_id.clone();
        let pid = slot.pid;
        let recycled = slot.recycled;
        if had_stream {
            self.effects.push(Effect::Detach { slot: number });
        }
        if was_attached {
            tracing::info!(slot = number, generation, worker_id = %worker_id, "executor detached: {how}");
            if !draining && !recycled && !retired {
                self.counters.executor_exits.inc();
            }
        }
        let verdict = poison::judge(
            evidence,
            poison::SlotState {
                draining,
                recycled,
                retired,
                stopping,
            },
        );
        if let Work::Busy(run) = work {
            let crash = format!(
                "executor {worker_id} (pid {pid}, generation {generation}) exited ({how}) while running execution {}",
                run.execution_id
            );
            // The ids come from the assignment's span, which the actor enters for this input.
            tracing::warn!("{crash}");
            self.judge_crash(*run, worker_id, crash, verdict);
        } else if was_attached && !stopping && verdict == Verdict::Outside {
            // An idle executor killed from outside is evidence of a burst too.
            let now = self.now();
            self.deaths.record(now, None);
        }
    }

    fn now(&self) -> Instant {
        self.clock.unwrap_or_else(Instant::now)
    }

    /// Sets the clock of burst detection (tests).
    #[cfg(test)]
    pub(crate) fn set_clock(&mut self, now: Instant) {
        self.clock = Some(now);
    }

    /// Fails the assignment of an executor that died, counting the death against its
    /// workflow task only where the evidence points at the task (see [`poison::judge`]): every
    /// reason says whether it was counted, and the running total. A counted crash whose
    /// earlier count this broker cannot vouch for is parked until Conductor's record says it.
    fn judge_crash(&mut self, run: Running, worker_id: String, crash: String, verdict: Verdict) {
        let limit = self.capacity.poison_after;
        let task = WorkflowTask::of(&run.attempt);
        let not_counted = match verdict {
            Verdict::Runtime(why) => Some(why),
            Verdict::SelfInflicted => None,
            Verdict::Outside => {
                let others = self.deaths.record(self.now(), Some(&task));
                (others > 0).then(|| {
                    format!(
                        "{others} other executor deaths in the last {} s (a burst, not this task's doing)",
                        poison::BURST_WINDOW.as_secs()
                    )
                })
            }
        };
        if limit == 0 {
            self.report(
                None,
                run,
                RuntimeResult::failed(worker_id, Reason::new(crash)),
                false,
            );
            return;
        }
        let prior = self.crashes.prior(&run.attempt);
        if let Some(why) = not_counted {
            if let Some(n) = prior {
                // The next attempt's count still starts from here.
                self.crashes.record(task.clone(), n, &run.attempt.task_id);
            }
            tracing::info!(
                "executor death not counted against workflow task {}: {why}",
                task.reference_task_name
            );
            let reason = format!("{crash}{}", poison::not_counted_suffix(&why, prior, limit));
            self.report(
                None,
                run,
                RuntimeResult::failed(worker_id, Reason::new(reason)),
                false,
            );
            return;
        }
        match prior {
            Some(prior) => self.count_crash(run, worker_id, &crash, prior),
            None => {
                let retried_task_id = run.attempt.retried_task_id.clone().unwrap_or_default();
                tracing::info!(retried_task_id = %retried_task_id, "reading the workflow task's earlier attempts from Conductor to count this crash");
                // The result waits: it is in flight (a drain waits for it) and reported.
                self.updates_in_flight += 1;
                self.reported.insert(&run.attempt.task_id);
                self.effects
                    .push(Effect::ReadCrashHistory(Box::new(HistoryRead {
                        execution_id: run.execution_id.clone(),
                        task_id: run.attempt.task_id.clone(),
                        retried_task_id,
                        workflow_instance_id: run.attempt.workflow_instance_id.clone(),
                        reference_task_name: run.attempt.reference_task_name.clone(),
                        task_def_name: run.attempt.task_def_name.clone(),
                    })));
                self.parked.insert(
                    run.execution_id.clone(),
                    Parked {
                        run,
                        worker_id,
                        crash,
                    },
                );
            }
        }
    }

    /// Conductor's record of a parked crash's workflow task was read: the crash is counted
    /// on top of it (on a failed read, on top of this broker's own count) and reported.
    fn crash_history_read(&mut self, execution_id: &str, counted: Option<u32>) {
        let Some(parked) = self.parked.remove(execution_id) else {
            return;
        };
        self.updates_in_flight = self.updates_in_flight.saturating_sub(1);
        let prior = counted.unwrap_or_else(|| {
            let local = self.crashes.local(&WorkflowTask::of(&parked.run.attempt));
            tracing::warn!("cannot read the workflow task's earlier attempts from Conductor: counting this crash on this runtime's own count ({local} so far)");
            local
        });
        self.count_crash(parked.run, parked.worker_id, &parked.crash, prior);
    }

    /// Counts a crash on top of `prior` and reports it: FAILED with the running total, or,
    /// once the total reaches `poison_after`, FAILED_WITH_TERMINAL_ERROR (its key is
    /// forgotten, so a rerun of the workflow starts afresh).
    fn count_crash(&mut self, run: Running, worker_id: String, crash: &str, prior: u32) {
        let limit = self.capacity.poison_after;
        let task = WorkflowTask::of(&run.attempt);
        let counted = prior.saturating_add(1);
        if counted < limit {
            self.crashes.record(task, counted, &run.attempt.task_id);
            let reason = format!("{crash}{}", poison::counted_suffix(counted, limit));
            self.report(
                None,
                run,
                RuntimeResult::failed(worker_id, Reason::new(reason)),
                false,
            );
            return;
        }
        self.crashes.forget(&task);
        let reason = format!(
            "{}attempts of workflow task {} in workflow {} killed their executor {counted} times ({}={limit}); last: {crash}",
            poison::POISON_PREFIX,
            task.reference_task_name,
            task.workflow_instance_id,
            perago_core::capacity::PERAGO_POISON_AFTER,
        );
        tracing::warn!("{reason}");
        self.counters.tasks_poisoned.inc();
        let result = RuntimeResult::failed_terminal(worker_id, Reason::new(reason));
        self.report(None, run, result, false);
    }

    /// Any message of the attached generation is a sign of life (a completion, a progress
    /// report, a pong).
    fn note_heard(&mut self, input: &Input) {
        let (slot, generation) = match input {
            Input::Completion {
                slot, generation, ..
            }
            | Input::Progress {
                slot, generation, ..
            }
            | Input::Pong { slot, generation } => (*slot, *generation),
            _ => return,
        };
        if let Some(s) = self.slot_mut(slot)
            && s.attached
            && s.generation == generation
        {
            s.heard = true;
        }
    }

    /// The liveness clock: every attached executor heard from since the last tick is alive
    /// as of `now`; one not heard from for `PERAGO_STALL_TIMEOUT` is stalled (killed, its
    /// assignment failed); the others are pinged. A tick that comes far later than the last
    /// one means the broker itself was not running (stopped, starved): nobody is judged on
    /// the silence that caused, every clock starts over.
    fn tick(&mut self, now: Instant) {
        let Some(timeout) = self.stall_timeout else {
            return;
        };
        let interval = perago_core::liveness::ping_interval(timeout);
        let late = self
            .last_tick
            .is_some_and(|last| now.saturating_duration_since(last) > interval * 2);
        self.last_tick = Some(now);
        for index in 0..self.slots.len() {
            let slot = &mut self.slots[index];
            if !slot.attached {
                continue;
            }
            let heard = std::mem::take(&mut slot.heard);
            match slot.last_heard {
                Some(since) if !heard && !late => {
                    if now.saturating_duration_since(since) >= timeout {
                        self.stalled(index, timeout);
                        continue;
                    }
                }
                _ => slot.last_heard = Some(now),
            }
            let (number, generation) = (slot.number, slot.generation);
            self.ping_sequence += 1;
            let ping = proto::BrokerMessage {
                message: Some(proto::broker_message::Message::Ping(proto::Ping {
                    sequence: self.ping_sequence,
                })),
            };
            self.send(number, generation, ping);
        }
    }

    /// The attached executor of slot `index` has not been heard from for `timeout`: it is
    /// killed and detached, and its assignment (if any) failed with FAILED, a reason that says
    /// so, and no poison count (the runtime killed it; its task did nothing). Its later stream
    /// end and exit report find nothing left to do; the supervisor restarts the slot as after
    /// any exit.
    fn stalled(&mut self, index: usize, timeout: Duration) {
        let draining = self.draining;
        let slot = &mut self.slots[index];
        let (number, generation, pid) = (slot.number, slot.generation, slot.pid);
        let worker_id = slot.worker_id.clone();
        let quiet_exit = draining || slot.recycled || !slot.wanted;
        slot.attached = false;
        slot.stalled = true;
        slot.heard = false;
        slot.last_heard = None;
        let work = std::mem::replace(&mut slot.work, Work::Idle);
        let t = perago_core::liveness::describe(timeout);
        let what = format!(
            "executor {worker_id} (pid {pid}, generation {generation}) did not answer for {t} ({}={t}); killed",
            perago_core::liveness::PERAGO_STALL_TIMEOUT
        );
        tracing::error!(slot = number, generation, worker_id = %worker_id, pid, "{what}");
        self.effects.push(Effect::KillExecutor {
            slot: number,
            generation,
            why: what.clone(),
        });
        self.effects.push(Effect::Detach { slot: number });
        if !quiet_exit {
            self.counters.executor_exits.inc();
        }
        if let Work::Busy(run) = work {
            let reason = format!("{what} while running execution {}", run.execution_id);
            tracing::warn!("{reason}");
            let result = RuntimeResult::failed(worker_id, Reason::new(reason));
            self.report(None, *run, result, false);
        }
    }

    /// Whether the current generation of slot `number` was killed for stalling (its death is
    /// the runtime's doing).
    #[cfg_attr(
        not(test),
        expect(dead_code, reason = "read by poison detection and tests")
    )]
    pub(crate) fn stalled_generation(&self, number: u32, generation: u64) -> bool {
        let Some(slot) = usize::try_from(number)
            .ok()
            .and_then(|n| n.checked_sub(1))
            .and_then(|i| self.slots.get(i))
        else {
            return false;
        };
        slot.generation == generation && slot.stalled
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
        // A generation that leaves to be recycled gets no next task: v1.
        let recycle = completion.recycle.clone();
        let v2 = !self.draining
            && recycle.is_empty()
            && self.v2.load(std::sync::atomic::Ordering::Relaxed);
        let Some(slot) = self.slot_mut(number) else {
            return;
        };
        let matches = slot.generation == generation
            && matches!(&slot.work, Work::Busy(run)
                if run.execution_id == completion.execution_id
                    && run.attempt.task_id == completion.task_id);
        if !matches {
            counters.rejected_completions.inc();
            // Its own ids: a completion that is no assignment of this slot has no span of its own.
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
        tracing::debug!(
            slot = number,
            status = result.status().as_str(),
            "execution finished"
        );
        if let Ok(took) = run.dispatched_at.elapsed() {
            self.gauges.task_duration.observe(took.as_secs_f64());
            let completed = result.status() == perago_core::result::ResultStatus::Completed;
            self.gauges
                .sdk
                .execute_time
                .get_or_create(&crate::counters::outcome(completed))
                .observe(took.as_secs_f64());
        }
        if let perago_core::result::Outcome::Completed(output) = result.outcome() {
            self.gauges.sdk.result_size.observe(output.len() as f64);
        }
        self.report(v2.then_some(number), *run, result, v2);
        if !recycle.is_empty() {
            self.recycle(number, &recycle);
        }
    }

    /// The executor of `number` reached a recycling limit with the assignment it just
    /// completed: it is told to stop, and the supervisor starts the next generation at once.
    fn recycle(&mut self, number: u32, why: &str) {
        let Some(slot) = self.slot_mut(number) else {
            return;
        };
        tracing::info!(slot = number, generation = slot.generation, worker_id = %slot.worker_id, pid = slot.pid, "executor recycled: {why}");
        slot.recycled = true;
        let already = std::mem::replace(&mut slot.stopping, true);
        let (generation, attached) = (slot.generation, slot.attached);
        self.counters.executors_recycled.inc();
        if !already && attached {
            self.send(
                number,
                generation,
                stop_message(perago_core::process::STOP_RECYCLE),
            );
        }
    }

    fn report(&mut self, slot: Option<u32>, run: Running, result: RuntimeResult, v2: bool) {
        self.updates_in_flight += 1;
        self.reported.insert(&run.attempt.task_id);
        self.effects.push(Effect::Report(Box::new(Report {
            workflow_instance_id: run.attempt.workflow_instance_id,
            task_id: run.attempt.task_id,
            execution_id: run.execution_id,
            result,
            use_v2: v2,
            slot,
            retry_count: Some(run.attempt.retry_count),
        })));
    }

    /// Hands a task the broker cannot run back to Conductor, re-queued without spending a
    /// retry. Its `startTime` stays, so the task's `timeoutSeconds` keeps running.
    fn hand_back(&mut self, ids: TaskRef, why: &str) {
        tracing::warn!(task_id = %ids.task_id, "handing a task back to Conductor: {why}; its timeout keeps running from its first start");
        self.updates_in_flight += 1;
        self.effects
            .push(Effect::HandBack(HandBack { ids, output: None }));
    }

    /// Hands back, untouched, a task of another type than the broker's: it is not run, failed
    /// or completed here. Conductor re-queues it in its own type's queue, for its own workers.
    fn hand_back_foreign(
        &mut self,
        ids: TaskRef,
        types: &TaskTypes,
        output: Option<serde_json::Value>,
    ) {
        tracing::warn!(task_id = %ids.task_id, workflow_instance_id = %ids.workflow_instance_id, "handing back a task of another type without running it: this broker runs {:?}, the task has {types}", self.task_name);
        self.updates_in_flight += 1;
        self.effects
            .push(Effect::HandBack(HandBack { ids, output }));
    }

    /// Why a task arriving now must not run: it is running or held here already, or a result
    /// for it was reported lately (each report is terminal: Conductor does not hand such a
    /// task out again, so one that does is not believed).
    fn already_here(&self, task_id: &str) -> Option<String> {
        if let Some(slot) = self
            .slots
            .iter()
            .find(|s| matches!(&s.work, Work::Busy(run) if run.attempt.task_id == task_id))
        {
            return Some(format!("it is running on slot {}", slot.number));
        }
        if self.held.iter().any(|h| h.attempt.task_id == task_id) {
            return Some("it is held here already, waiting for a slot".to_owned());
        }
        if self.reported.contains(task_id) {
            return Some("a result for it was reported moments ago".to_owned());
        }
        None
    }

    /// Tasks received or held now, free slots excluded.
    fn tasks_held(&self) -> usize {
        self.held.len()
            + self
                .slots
                .iter()
                .filter(|s| !matches!(s.work, Work::Idle))
                .count()
    }

    /// Fails a task the broker cannot map, for good: a retry would get the same task.
    fn fail_unmappable(&mut self, ids: TaskRef, problem: &str) {
        tracing::warn!(task_id = %ids.task_id, "failing a task that cannot be run: {problem}");
        let result = RuntimeResult::failed_terminal(self.broker_id.clone(), Reason::new(problem));
        self.updates_in_flight += 1;
        self.reported.insert(&ids.task_id);
        self.effects.push(Effect::Report(Box::new(Report {
            workflow_instance_id: ids.workflow_instance_id,
            task_id: ids.task_id,
            execution_id: String::from("-"),
            result,
            use_v2: false,
            slot: None,
            retry_count: None,
        })));
    }

    /// A task arrived (from a poll or update-v2): checked first, then run on a free slot
    /// (`preferred` first), else held while fewer than N tasks are held, else handed back.
    /// Checked: a task without ids is dropped (nothing can be told about it); one already
    /// running, held or lately reported here is dropped (the same task id twice in one answer
    /// would run twice at once); one of another type is handed back as it came; one that
    /// cannot be decoded or mapped is failed for good.
    fn receive(&mut self, task: Polled, preferred: Option<u32>) {
        let (ids, types) = match &task {
            Polled::Task(task) => match task.task_ref() {
                Ok(ids) => (ids, TaskTypes::of(&task.fields)),
                Err(e) => {
                    tracing::error!("dropped a polled task that cannot be identified: {e}");
                    return;
                }
            },
            Polled::Undecodable {
                ids: Some(ids),
                types,
                ..
            } => (ids.clone(), types.clone()),
            Polled::Undecodable {
                ids: None, problem, ..
            } => {
                tracing::error!(
                    "dropped a polled task that cannot be decoded or identified: {problem}"
                );
                return;
            }
        };
        if let Some(why) = self.already_here(&ids.task_id) {
            tracing::warn!(task_id = %ids.task_id, workflow_instance_id = %ids.workflow_instance_id, "dropped a task Conductor handed out again: {why}");
            return;
        }
        if !types.is(&self.task_name) {
            let output = match &task {
                Polled::Task(task) => task.fields.get("outputData").cloned(),
                Polled::Undecodable { .. } => None,
            };
            self.hand_back_foreign(ids, &types, output);
            return;
        }
        let task = match task {
            Polled::Task(task) => task,
            Polled::Undecodable { problem, .. } => {
                self.fail_unmappable(ids, &format!("the task cannot be decoded: {problem}"));
                return;
            }
        };
        let external = task.external_input_path().map(str::to_owned);
        let attempt = match AttemptSnapshot::from_polled(task) {
            Ok(a) => a,
            Err(AttemptError::Unidentifiable { field }) => {
                tracing::error!(
                    field,
                    "dropped a polled task that cannot be identified: {field} is missing"
                );
                return;
            }
            Err(e) => {
                self.fail_unmappable(ids, &e.to_string());
                return;
            }
        };
        if let Some(path) = external {
            self.fetch_input(attempt, path);
            return;
        }
        // The whole input crosses the slot protocol in one message: above Conductor's largest
        // payload threshold it is failed here, naming the size and the limit.
        let input_bytes = wire::input_json_len(&attempt);
        if input_bytes > perago_proto::MAX_TASK_PAYLOAD_BYTES {
            let ids = TaskRef {
                task_id: attempt.task_id,
                workflow_instance_id: attempt.workflow_instance_id,
            };
            self.fail_unmappable(
                ids,
                &format!(
                    "task input is {input_bytes} bytes; perago takes at most {} bytes inline (Conductor's largest payload threshold)",
                    perago_proto::MAX_TASK_PAYLOAD_BYTES
                ),
            );
            return;
        }
        let execution_id = uuid::Uuid::new_v4().to_string();
        let index = preferred
            .and_then(|n| usize::try_from(n).ok()?.checked_sub(1))
            .filter(|&i| self.slots.get(i).is_some_and(Slot::free))
            .or_else(|| self.slots.iter().position(Slot::free));
        if let Some(index) = index {
            self.effects.push(Effect::StartLease {
                execution_id: execution_id.clone(),
                attempt: Box::new(attempt.without_input()),
            });
            self.assign(index, execution_id, attempt);
            return;
        }
        let can_run_later = !self.draining || self.slots.iter().any(|s| s.attached && !s.stopping);
        if self.tasks_held() < self.slots.len() && can_run_later {
            // Its own ids: the execution's span opens with the lease that follows.
            tracing::info!(task_id = %attempt.task_id, execution_id = %execution_id, "holding a task until a slot is free; its lease is extended meanwhile");
            self.effects.push(Effect::StartLease {
                execution_id: execution_id.clone(),
                attempt: Box::new(attempt.without_input()),
            });
            self.held.push_back(Held {
                execution_id,
                attempt,
                fetching: false,
            });
            return;
        }
        let ids = TaskRef {
            task_id: attempt.task_id,
            workflow_instance_id: attempt.workflow_instance_id,
        };
        let why = if can_run_later {
            "more tasks than slots"
        } else {
            "draining and no executor left to run it"
        };
        self.hand_back(ids, why);
    }

    /// Sends an assignment to slot `index` (free, checked by the caller).
    fn assign(&mut self, index: usize, execution_id: String, mut attempt: AttemptSnapshot) {
        let slot = &mut self.slots[index];
        let message = proto::BrokerMessage {
            message: Some(proto::broker_message::Message::Assignment(
                proto::Assignment {
                    execution_id: execution_id.clone(),
                    attempt: Some(wire::attempt_into_wire(&mut attempt)),
                },
            )),
        };
        self.effects.push(Effect::Assigned(Box::new(Assigned {
            slot: slot.number,
            worker_id: slot.worker_id.clone(),
            task_id: attempt.task_id.clone(),
            execution_id: execution_id.clone(),
            retry_count: attempt.retry_count,
            response_timeout_seconds: attempt.response_timeout_seconds.unwrap_or(0),
        })));
        slot.idle_since = None;
        slot.work = Work::Busy(Box::new(Running {
            execution_id,
            attempt,
            dispatched_at: SystemTime::now(),
            // Shown as "preparing" until the executor reports a phase, unless it starts the
            // body at once and reports nothing.
            phase: if slot.body_at_dispatch {
                proto::Phase::Body
            } else {
                proto::Phase::Unspecified
            },
        }));
        let (number, generation) = (slot.number, slot.generation);
        self.counters.dispatched.inc();
        self.send(number, generation, message);
    }

    /// Held tasks take free slots first, in arrival order.
    fn run_held(&mut self) {
        while let Some(next) = self.held.iter().position(|h| !h.fetching) {
            let Some(index) = self.slots.iter().position(Slot::free) else {
                return;
            };
            let held = self.held.remove(next).expect("index from position");
            self.assign(index, held.execution_id, held.attempt);
        }
    }

    /// A task whose input Conductor moved to external payload storage: held (its lease
    /// extended) while the actor fetches the input, then run as if it had come inline. Like
    /// any held task it counts against the polls, so no slot is promised twice.
    fn fetch_input(&mut self, attempt: AttemptSnapshot, path: String) {
        let can_run_later = !self.draining || self.slots.iter().any(|s| s.attached && !s.stopping);
        if self.tasks_held() >= self.slots.len() || !can_run_later {
            let ids = TaskRef {
                task_id: attempt.task_id,
                workflow_instance_id: attempt.workflow_instance_id,
            };
            self.hand_back(ids, "no slot for a task whose input is in external storage");
            return;
        }
        let execution_id = uuid::Uuid::new_v4().to_string();
        tracing::info!(task_id = %attempt.task_id, execution_id = %execution_id, path = %path, "fetching the task input from Conductor's external payload storage");
        self.effects.push(Effect::StartLease {
            execution_id: execution_id.clone(),
            attempt: Box::new(attempt.without_input()),
        });
        self.effects.push(Effect::FetchInput {
            execution_id: execution_id.clone(),
            task_id: attempt.task_id.clone(),
            path,
        });
        self.held.push_back(Held {
            execution_id,
            attempt,
            fetching: true,
        });
    }

    /// The fetch of a held task's input ended: with the input it waits for a slot as any held
    /// task; without, the attempt fails (FAILED, so Conductor retries it, or for good when a
    /// retry would meet the same answer), reason given.
    fn input_fetched(&mut self, execution_id: &str, input: Result<RawJson, InputFailure>) {
        let Some(i) = self
            .held
            .iter()
            .position(|h| h.execution_id == execution_id && h.fetching)
        else {
            tracing::debug!(
                execution_id,
                "a fetched input for a task no longer held here"
            );
            return;
        };
        match input {
            Ok(input) => {
                let held = &mut self.held[i];
                held.attempt.input_data = input;
                held.fetching = false;
            }
            Err(failure) => {
                let held = self.held.remove(i).expect("index from position");
                let reason = Reason::new(&failure.reason);
                let result = if failure.terminal {
                    RuntimeResult::failed_terminal(self.broker_id.clone(), reason)
                } else {
                    RuntimeResult::failed(self.broker_id.clone(), reason)
                };
                let run = Running {
                    execution_id: held.execution_id,
                    attempt: held.attempt,
                    dispatched_at: SystemTime::now(),
                    phase: proto::Phase::Unspecified,
                };
                tracing::warn!(task_id = %run.attempt.task_id, terminal = failure.terminal, "failing a task whose input cannot be fetched: {}", failure.reason);
                self.report(None, run, result, false);
            }
        }
    }

    fn lease_lost(&mut self, execution_id: &str) {
        if let Some(i) = self
            .held
            .iter()
            .position(|h| h.execution_id == execution_id)
        {
            self.held.remove(i).expect("index from position");
            tracing::warn!("dropped a held task: Conductor no longer has its attempt in progress");
            return;
        }
        // A running attempt goes on: a workspace task's fence stops it from publishing, and
        // Conductor ignores the late result.
        tracing::warn!(
            "the lease of a running execution is lost; its result will be ignored by Conductor"
        );
    }

    fn grant_poll(&mut self) {
        if !self.poll_wanted {
            return;
        }
        if self.draining {
            if !self.poll_stopped {
                self.poll_wanted = false;
                self.poll_stopped = true;
                self.effects.push(Effect::GrantPoll(0));
            }
            return;
        }
        if self.quiet_after.is_some() {
            // Run once: the queue looked empty; a queue-depth read confirms it first.
            return;
        }
        let free = self.slots.iter().filter(|s| s.free()).count() as u32;
        let held = u32::try_from(self.held.len()).unwrap_or(u32::MAX);
        let available = free.saturating_sub(self.reserved).saturating_sub(held);
        if available > 0 && !self.admission_open {
            // Counted once per poll request that memory alone keeps waiting.
            if !self.poll_withheld {
                self.poll_withheld = true;
                self.counters.polls_withheld.inc();
            }
            return;
        }
        if available > 0 {
            // A sparse queue: one task per poll, so none waits for a batch to fill.
            let count = if self.poll_sparse { 1 } else { available };
            self.poll_wanted = false;
            self.poll_withheld = false;
            self.reserved += count;
            self.effects.push(Effect::GrantPoll(count));
        }
    }

    /// Memory admission: new tasks are polled only while at least `PERAGO_MIN_FREE_MEMORY` is
    /// available. Tasks already received run regardless; the waiting poll is granted as soon
    /// as admission opens again (see `grant_poll`).
    fn memory_measured(&mut self, available: u64) {
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        self.available_memory = Some(available);
        self.gauges.available_memory.store(available, relaxed);
        let Some(min) = self.capacity.min_free_memory else {
            return;
        };
        let open = available >= min;
        if open != self.admission_open {
            let (available, min) = (format_bytes(available), format_bytes(min));
            if open {
                tracing::info!(available = %available, min_free_memory = %min, "admission open: available memory {available} is at least {PERAGO_MIN_FREE_MEMORY} {min}; polling resumes");
            } else {
                tracing::warn!(available = %available, min_free_memory = %min, "admission closed: available memory {available} is below {PERAGO_MIN_FREE_MEMORY} {min}; no new tasks are polled until it is back (running tasks go on)");
            }
        }
        self.admission_open = open;
        self.gauges.admission_open.store(u64::from(open), relaxed);
    }

    /// Why admission is closed, for Admin.Status (empty while open).
    fn admission_reason(&self) -> String {
        match (
            self.admission_open,
            self.available_memory,
            self.capacity.min_free_memory,
        ) {
            (false, Some(available), Some(min)) => format!(
                "available memory {} is below {PERAGO_MIN_FREE_MEMORY} {}",
                format_bytes(available),
                format_bytes(min)
            ),
            _ => String::new(),
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
        self.effects.push(Effect::DisableV2);
        // Busy slots are told now (they finish their assignment, then exit); idle ones once
        // nothing is left for them to run (see `settle_drain`). A slot awaiting update-v2's
        // next task is idle to its executor: it is told once that task has run or not come.
        for i in 0..self.slots.len() {
            if matches!(self.slots[i].work, Work::Busy(_)) {
                self.stop_slot(i);
            }
        }
    }

    fn stop_slot(&mut self, index: usize) {
        let slot = &mut self.slots[index];
        if slot.stopping {
            return;
        }
        slot.stopping = true;
        if slot.attached {
            let (number, generation) = (slot.number, slot.generation);
            self.send(number, generation, stop_message("drain"));
        }
    }

    /// While draining: once no poll is in flight and nothing is held, every idle slot is told
    /// to stop; held tasks no executor can run any more are handed back.
    fn settle_drain(&mut self) {
        if !self.draining || self.reserved > 0 {
            return;
        }
        if !self.held.is_empty() {
            let runnable = self.slots.iter().any(|s| s.attached && !s.stopping);
            if runnable {
                return;
            }
            while let Some(held) = self.held.pop_front() {
                self.effects.push(Effect::StopLease {
                    execution_id: held.execution_id,
                });
                let ids = TaskRef {
                    task_id: held.attempt.task_id,
                    workflow_instance_id: held.attempt.workflow_instance_id,
                };
                self.hand_back(ids, "draining and no executor left to run it");
            }
        }
        for i in 0..self.slots.len() {
            if matches!(self.slots[i].work, Work::Idle) {
                self.stop_slot(i);
            }
        }
    }

    fn check_drained(&mut self) {
        if !self.draining || self.drained || self.updates_in_flight > 0 || self.reserved > 0 {
            return;
        }
        let quiet = self.held.is_empty()
            && self
                .slots
                .iter()
                .all(|s| !s.attached && matches!(s.work, Work::Idle));
        if quiet {
            tracing::info!("drained: every executor detached and every result reported");
            self.drained = true;
            self.effects.push(Effect::Drained);
        }
    }

    /// Nothing running, reported or held: no slot busy or awaiting update-v2's next task, no
    /// held task, no update in flight.
    fn all_idle(&self) -> bool {
        self.held.is_empty()
            && self.updates_in_flight == 0
            && self.slots.iter().all(|s| matches!(s.work, Work::Idle))
    }

    /// Run once: a poll came back empty while everything was idle. With the queue depth
    /// readable, a read asked for after it decides (`quiet_after`); without, the poll itself
    /// is the evidence: [`ONCE_EMPTY_POLLS`] in a row drain, and polling goes on until then.
    fn once_idle_empty_poll(&mut self) {
        if !self.depth_unreadable {
            self.once_empty_polls = 0;
            self.quiet_after.get_or_insert(self.depth_reads);
            return;
        }
        self.once_empty_polls += 1;
        if self.once_empty_polls >= ONCE_EMPTY_POLLS {
            tracing::info!(
                "run once: no task of {} left ({} empty polls in a row, the queue depth \
                 unreadable) and every slot idle; draining",
                self.task_name,
                self.once_empty_polls
            );
            self.start_drain();
        }
    }

    /// Asks for the next queue-depth read (the first at once, then every
    /// [`QUEUE_DEPTH_INTERVAL`]) while run once or the adaptive range needs it.
    fn request_queue_depth(&mut self) {
        let needed = self.capacity.once || self.capacity.adaptive();
        if !needed || self.draining || self.depth_read_pending {
            return;
        }
        // The first read, and run once's confirming read when the last answer was asked for
        // before the empty poll, go at once.
        let stale = self.quiet_after.is_some_and(|q| self.depth_reads <= q);
        let after = if self.depth_reads == 0 || stale {
            Duration::ZERO
        } else {
            QUEUE_DEPTH_INTERVAL
        };
        self.depth_reads += 1;
        self.depth_read_pending = true;
        self.effects.push(Effect::ReadQueueDepth { after });
    }

    /// A queue-depth read answered: run once may drain, the adaptive range may scale.
    fn queue_depth_read(&mut self, depth: Option<u64>, now: Instant) {
        self.depth_read_pending = false;
        self.depth_unreadable = depth.is_none();
        if let Some(depth) = depth {
            self.queue_depth = Some(depth);
            self.gauges
                .queue_depth
                .store(depth, std::sync::atomic::Ordering::Relaxed);
        }
        if self.draining {
            return;
        }
        if let Some(quiet) = self.quiet_after
            && depth.is_none()
            && self.depth_reads > quiet
        {
            // The confirming read failed: polls decide instead (see `once_idle_empty_poll`),
            // so polling resumes rather than waiting for a read that may never work.
            self.quiet_after = None;
        }
        if let Some(quiet) = self.quiet_after
            && depth.is_some()
        {
            // A read asked for after the empty poll decides: 0 drains, more polls again.
            if self.depth_reads > quiet {
                if depth == Some(0) && self.all_idle() {
                    tracing::info!(
                        "run once: no task of {} left and every slot idle; draining",
                        self.task_name
                    );
                    self.start_drain();
                    return;
                }
                self.quiet_after = None;
            }
        }
        if self.capacity.adaptive() {
            self.scale_up();
            self.scale_down(now);
            let wanted = self.slots.iter().filter(|s| s.wanted).count() as u64;
            self.gauges
                .wanted_executors
                .store(wanted, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Adaptive range: while tasks wait (in Conductor's queue or held here) beyond the wanted
    /// slots that can take one now or soon (free, or starting), more slots are wanted, up to
    /// the maximum. Not while memory admission is closed.
    fn scale_up(&mut self) {
        let Some(depth) = self.queue_depth else {
            return;
        };
        if !self.admission_open {
            return;
        }
        let backlog = depth.saturating_add(self.held.len() as u64);
        let ready = self
            .slots
            .iter()
            .filter(|s| s.wanted && !s.stopping && matches!(s.work, Work::Idle))
            .count() as u64;
        let wanted = self.slots.iter().filter(|s| s.wanted).count() as u64;
        let room = u64::from(self.capacity.max_executors).saturating_sub(wanted);
        let mut add = backlog.saturating_sub(ready).min(room);
        if add == 0 {
            return;
        }
        let mut added = Vec::new();
        // A slot whose retired executor is still attached comes back once it has exited.
        for slot in self.slots.iter_mut().filter(|s| !s.wanted && !s.attached) {
            if add == 0 {
                break;
            }
            slot.wanted = true;
            slot.idle_since = None;
            added.push(slot.number);
            self.counters.scale_ups.inc();
            add -= 1;
        }
        if !added.is_empty() {
            tracing::info!(
                queue_depth = depth, slots = ?added, wanted = wanted + added.len() as u64,
                max = self.capacity.max_executors,
                "scaling up: tasks wait and every wanted executor is busy"
            );
        }
    }

    /// Adaptive range: each slot free for `scale_down_after` makes one wanted slot above the
    /// minimum too many; as many free slots are retired, highest slot numbers first (so the
    /// low ones stay), their idle executors told to stop. A slot attached while not wanted is
    /// stopped too.
    fn scale_down(&mut self, now: Instant) {
        let after = self.capacity.scale_down_after;
        let mut long_idle = 0u32;
        for i in 0..self.slots.len() {
            let slot = &mut self.slots[i];
            if !slot.wanted && slot.attached && !slot.stopping && matches!(slot.work, Work::Idle) {
                // Started by the supervisor for a slot no longer wanted.
                slot.stopping = true;
                let (number, generation) = (slot.number, slot.generation);
                self.send(number, generation, stop_message("scale down"));
                continue;
            }
            if !slot.free() {
                slot.idle_since = None;
                continue;
            }
            let since = *slot.idle_since.get_or_insert(now);
            if now.duration_since(since) >= after {
                long_idle += 1;
            }
        }
        let mut wanted = self.slots.iter().filter(|s| s.wanted).count() as u32;
        let mut retire = long_idle.min(wanted.saturating_sub(self.capacity.min_executors));
        for i in (0..self.slots.len()).rev() {
            if retire == 0 {
                break;
            }
            let slot = &mut self.slots[i];
            if !slot.free() {
                continue;
            }
            slot.wanted = false;
            slot.stopping = true;
            slot.idle_since = None;
            retire -= 1;
            wanted -= 1;
            let (number, generation, worker_id) =
                (slot.number, slot.generation, slot.worker_id.clone());
            self.counters.scale_downs.inc();
            tracing::info!(
                slot = number, worker_id = %worker_id, wanted,
                scale_down_after_s = after.as_secs_f64(),
                "scaling down: retiring an idle executor (slots were free for PERAGO_SCALE_DOWN_AFTER)"
            );
            self.send(number, generation, stop_message("scale down"));
        }
    }

    /// Whether a drain has started.
    pub(crate) fn draining(&self) -> bool {
        self.draining
    }

    /// The broker's view of `slot` after an exit report of its `generation` (the answer to
    /// `Control.SlotExited`): exactly what Admin.Status would show the supervisor then.
    pub(crate) fn exit_ack(&self, slot: u32, generation: u64) -> proto::SlotExitedAck {
        let seen = usize::try_from(slot)
            .ok()
            .and_then(|n| n.checked_sub(1))
            .and_then(|i| self.slots.get(i));
        proto::SlotExitedAck {
            draining: self.draining,
            retired: seen.is_some_and(|s| s.state() == admin::SlotState::Retired),
            recycling: seen.is_some_and(|s| s.generation == generation && s.recycled),
        }
    }

    /// Brings `view` up to date with the supervisor-relevant state; true if anything changed.
    /// Cheap (no allocation once `view` has its slots): called after every event while
    /// someone watches.
    pub(crate) fn update_watch_view(&self, view: &mut WatchView) -> bool {
        let mut changed = false;
        let mut set = |field: &mut bool, value: bool| {
            if *field != value {
                *field = value;
                changed = true;
            }
        };
        set(&mut view.draining, self.draining);
        set(&mut view.admission_open, self.admission_open);
        let wanted = self
            .gauges
            .wanted_executors
            .load(std::sync::atomic::Ordering::Relaxed);
        if view.wanted_executors != wanted {
            view.wanted_executors = wanted;
            changed = true;
        }
        if view.slots.len() != self.slots.len() {
            view.slots.clear();
            view.slots.resize(self.slots.len(), Default::default());
            changed = true;
        }
        for (seen, s) in view.slots.iter_mut().zip(&self.slots) {
            let now = (s.state(), s.generation, s.pid, s.recycled);
            if *seen != now {
                *seen = now;
                changed = true;
            }
        }
        changed
    }

    fn status(&self) -> admin::StatusResponse {
        let slots = self
            .slots
            .iter()
            .map(|s| {
                let state = s.state();
                let (task_id, execution_id, since, phase) = match &s.work {
                    Work::Busy(run) => (
                        run.attempt.task_id.clone(),
                        run.execution_id.clone(),
                        unix_ms(run.dispatched_at),
                        run.phase.status_name(),
                    ),
                    // The result is being reported; update-v2 may bring the next task.
                    Work::AwaitingNext => (
                        String::new(),
                        String::new(),
                        0,
                        proto::Phase::Reporting.status_name(),
                    ),
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
                    recycling: s.recycled,
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
            capacity: Some(self.capacity_status()),
        }
    }

    /// The capacity settings and the live figures they act on, for Admin.Status.
    fn capacity_status(&self) -> admin::Capacity {
        let c = &self.capacity;
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        admin::Capacity {
            once: c.once,
            max_tasks_per_executor: c.max_tasks_per_executor.unwrap_or(0),
            max_executor_memory_bytes: c.max_executor_memory.unwrap_or(0),
            min_executors: c.min_executors,
            max_executors: c.max_executors,
            scale_down_after_ms: u64::try_from(c.scale_down_after.as_millis()).unwrap_or(u64::MAX),
            min_free_memory_bytes: c.min_free_memory.unwrap_or(0),
            poison_after: c.poison_after,
            wanted_executors: u32::try_from(self.gauges.wanted_executors.load(relaxed))
                .unwrap_or(u32::MAX),
            queue_depth: self
                .queue_depth
                .map_or(-1, |d| i64::try_from(d).unwrap_or(i64::MAX)),
            available_memory_bytes: self.gauges.available_memory.load(relaxed),
            admission_open: self.admission_open,
            admission_reason: self.admission_reason(),
        }
    }
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
