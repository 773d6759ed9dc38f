//! The machine's inputs and effects, and what it is told of the runtime.

use super::*;

/// What the machine needs to know of the runtime.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) capacity: Capacity,
    /// Each slot's worker id, slot 1 first (`max_executors` of them).
    pub(crate) worker_ids: Vec<String>,
    pub(crate) force_kill_after: Option<Duration>,
    pub(crate) gc_interval: Duration,
    pub(crate) stall_timeout: Option<Duration>,
    /// Under a `Type=notify` unit (systemd's notify socket is set).
    pub(crate) notify: bool,
    /// How often systemd wants `WATCHDOG=1`, when it does.
    pub(crate) watchdog: Option<Duration>,
}

/// Something that happened.
#[derive(Debug)]
pub(crate) enum Input {
    /// The broker serves: the start-up executors start.
    Begin,
    /// A child ended.
    Exited(ChildExit),
    /// An executor generation completed an assignment (its completion byte).
    Completed(ChildKind),
    /// SIGTERM or SIGINT.
    Signal(&'static str),
    /// Another runtime failed (or `dev`'s workflows ended): drain, with this reason.
    Stop(String),
    /// The broker's state: a message of its `Admin.Watch` stream (each change, and a
    /// heartbeat every [`STATUS_INTERVAL`](super::STATUS_INTERVAL) otherwise).
    BrokerState(admin::StatusResponse),
    /// The broker's `Admin.Watch` stream ended cleanly: it has drained.
    BrokerDrained,
    /// An [`Effect::ReadPhases`] answered (`None`: no answer within its deadline).
    PhasesRead(Option<admin::StatusResponse>),
    /// An [`Effect::Announce`] ended.
    Announced {
        slot: u32,
        generation: u64,
        result: Result<(), AnnounceError>,
    },
    /// An [`Effect::Spawn`] ended.
    Spawned {
        slot: u32,
        generation: u64,
        result: std::io::Result<Child>,
    },
    /// An [`Effect::HandleExit`] ended, with the broker's view after the exit (`None`: not
    /// told, or no answer).
    ExitHandled {
        slot: u32,
        generation: u64,
        seen: Option<SlotView>,
    },
    /// An [`Effect::SweepExpired`] ended.
    GcDone,
    /// An [`Effect::Drain`] failed.
    DrainFailed(tonic::Status),
    /// A new body version was taken (see `runtime/body.rs`): every new generation starts at
    /// it, and the broker recycles each executor of an older one after its assignment.
    Roll { body_version: u32 },
    /// Time passed (a deadline [`Machine::next_wake`] named).
    Tick,
}

/// The broker's view of a slot after one of its executors exited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SlotView {
    /// The broker is draining.
    pub(crate) draining: bool,
    /// The slot is retired (an adaptive runtime does not want it now).
    pub(crate) retired: bool,
    /// The generation that exited said with its last completion that it was leaving to be
    /// recycled.
    pub(crate) recycling: bool,
}

impl From<proto::SlotExitedAck> for SlotView {
    fn from(ack: proto::SlotExitedAck) -> Self {
        Self {
            draining: ack.draining,
            retired: ack.retired,
            recycling: ack.recycling,
        }
    }
}

#[cfg(test)]
impl SlotView {
    /// The view `status` (read after the exit) gives of `slot`'s `generation`: what
    /// `SlotExitedAck` says, as `Admin.Status` shows it.
    pub(crate) fn from_status(status: &admin::StatusResponse, slot: u32, generation: u64) -> Self {
        let seen = status.slots.iter().find(|s| s.slot == slot);
        Self {
            draining: status.draining,
            retired: seen.is_some_and(|s| s.state() == admin::SlotState::Retired),
            recycling: seen.is_some_and(|s| s.generation == generation && s.recycling),
        }
    }
}

/// How an announcement failed.
#[derive(Debug)]
pub(crate) enum AnnounceError {
    /// The broker refused the generation (`FAILED_PRECONDITION`, `NOT_FOUND`): final.
    Refused(String),
    /// Lost or not delivered: the next try repeats it, token and all.
    Lost(tonic::Status),
}

/// A message for systemd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Notice {
    Ready(String),
    Status(String),
    Stopping(String),
    Ping,
}

/// Something to do.
#[derive(Debug, PartialEq)]
pub(crate) enum Effect {
    /// `Control.SlotStarted` (bounded); answers [`Input::Announced`].
    Announce {
        slot: u32,
        generation: u64,
        token: String,
        /// The body version the generation runs (the broker shows it per slot).
        body_version: u32,
    },
    /// Start the executor; answers [`Input::Spawned`].
    Spawn {
        slot: u32,
        generation: u64,
        token: String,
        worker_id: String,
        /// The body version it starts from.
        body_version: u32,
    },
    /// `Control.RollBody` (bounded): the broker recycles every executor of an older body
    /// version at its first safe moment. Repeated while the broker's state shows an older
    /// version (a lost call).
    Roll { body_version: u32 },
    /// Signal a child's process group (a task ignores it).
    Signal { child: Child, signal: i32 },
    /// Thread mode: end every executor task.
    AbortExecutors,
    /// Thread mode: end every task, the broker's too.
    AbortAll,
    /// `Admin.Drain` (bounded); a failure answers [`Input::DrainFailed`].
    Drain,
    /// In order, on the cleanup worker: `SlotExited` (when `tell_broker`; its answer is the
    /// broker's view of the slot), kill what the bodies left to this subreaper, sweep the
    /// generation's attempts; answers [`Input::ExitHandled`].
    HandleExit {
        report: proto::SlotExited,
        worker_id: String,
        tell_broker: bool,
        /// A failed report is expected then (a broker that drained has closed its socket).
        draining: bool,
    },
    /// The periodic GC, on the cleanup worker, with each slot's current generation
    /// ([`Machine::generations`](super::Machine::generations) when it runs); answers
    /// [`Input::GcDone`].
    SweepExpired,
    /// One `Admin.Status` read (1 s) at the shutdown deadline, for each slot's phase in the
    /// force-kill lines; answers [`Input::PhasesRead`].
    ReadPhases,
    /// Tell systemd.
    Notify(Notice),
}
