//! What goes into the machine and what comes out: its [`Input`]s, the [`Reply`] to the
//! caller of an input that asks a question, and the [`Effect`]s the actor performs.

use perago_core::{
    attempt::{AttemptSnapshot, TaskRef},
    conductor::Polled,
    json::RawJson,
    result::RuntimeResult,
};
use perago_proto::{admin::v1 as admin, slot::v1 as proto};
use std::time::{Duration, Instant};
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
    /// The reporter found that the server has no usable update-v2: from now on completions
    /// go through v1 and keep no slot for a next task.
    UpdateV2Unsupported,
    /// Conductor no longer has this execution's attempt in progress (read back after a lease
    /// extension): it timed the attempt out or retried it elsewhere.
    LeaseLost { execution_id: String },
    /// Start draining. Answer: [`Reply::Drain`] (whether a drain was already under way).
    Drain,
    /// The task type's queue depth was read from Conductor (`None`: the read failed) at `now`:
    /// the clock of run once and of the adaptive executor count.
    QueueDepth { depth: Option<u64>, now: Instant },
    /// Pause polling. Answer: [`Reply::Pause`].
    Pause,
    /// Resume polling. Answer: [`Reply::Resume`].
    Resume,
    /// A status snapshot. Answer: [`Reply::Status`].
    Status,
    /// `Admin.Scale`: the executor count becomes `min..=max` live. Answer: [`Reply::Scale`].
    Scale { min: u32, max: u32 },
    /// `Admin.Reconfigure`: the live settings set (`None`: unchanged) apply to every
    /// assignment dispatched from now on. Answer: [`Reply::Reconfigure`].
    Reconfigure(super::reconfigure::Reconfig),
    /// `Admin.ShareGrant`: the permits this sharing broker may hold from now on (ignored when
    /// `epoch` is older than the grant in force). Answer: [`Reply::ShareGrant`].
    ShareGrant { limit: u32, epoch: u64 },
    /// `Control.RollBody`: every generation should run `body_version` (or newer) from now on.
    Roll { body_version: u32 },
    /// Available memory was measured (only with `PERAGO_MIN_FREE_MEMORY` or
    /// `PERAGO_MEMORY_HEADROOM`): admission opens or closes.
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
    /// Whether polling was paused already, and since when (the pause in force now).
    Pause {
        already: bool,
        since: std::time::SystemTime,
    },
    /// Polling was running already.
    Resume(bool),
    /// The status snapshot.
    Status(Box<admin::StatusResponse>),
    /// The range before the scale, or why it was refused.
    Scale(Result<(u32, u32), Status>),
    /// Whether nothing changed and the soft time limit before, or why it was refused.
    Reconfigure(Result<super::reconfigure::Reconfigured, Status>),
    /// The permits in force after a grant, or why it was refused (not sharing).
    ShareGrant(Result<admin::ShareStatus, Status>),
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
    /// The poll settings changed (a reconfigure): the poll loop and the queue-depth reads
    /// use these from their next request on.
    PollSettings(Box<super::reconfigure::PollSettings>),
    /// Start measuring available memory (a reconfigure set a memory floor; no-op when the
    /// measurements run already).
    WatchMemory,
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
