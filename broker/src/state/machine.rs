//! The machine's state (slots, held tasks, counts) and its one entry, [`Machine::handle`]:
//! the input's own transition (in the file of its concern), then the follow-ups every input
//! may cause (held tasks run, a drain settles, the waiting poll is granted).

use super::{Effect, ExecutionIds, Input, Now, Output, Reply};
use crate::{
    counters::{Counters, Gauges},
    poison::{CrashLedger, RecentDeaths},
    recent::RecentlyReported,
};
use perago_core::conductor::Domain;
use perago_core::{
    attempt::AttemptSnapshot,
    capacity::Capacity,
    identity::{Slot as SlotNumber, WorkerPrefix},
};
use perago_proto::slot::v1 as proto;
use std::{
    collections::{HashMap, VecDeque},
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

#[derive(Debug)]
pub(super) struct Running {
    pub(super) execution_id: String,
    pub(super) attempt: AttemptSnapshot,
    pub(super) dispatched_at: SystemTime,
    pub(super) phase: proto::Phase,
}

#[derive(Debug)]
pub(super) enum Work {
    Idle,
    Busy(Box<Running>),
    /// The completion's update-v2 is in flight; the slot waits for the next task it returns.
    AwaitingNext,
}

#[derive(Debug)]
pub(super) struct Slot {
    pub(super) number: u32,
    pub(super) worker_id: String,
    pub(super) generation: u64,
    pub(super) token: String,
    pub(super) pid: u32,
    pub(super) attached: bool,
    /// The attached executor starts bodies at dispatch (see `Hello.body_at_dispatch`).
    pub(super) body_at_dispatch: bool,
    pub(super) work: Work,
    pub(super) stopping: bool,
    /// The generation asked to be recycled and was told to stop: its exit is no failure.
    pub(super) recycled: bool,
    pub(super) exited: bool,
    /// Part of the executor count the runtime wants now (`-j MIN..MAX`: the supervisor runs an
    /// executor for a wanted slot; an unwanted one is retired). Always true with `-j N`.
    pub(super) wanted: bool,
    /// Since when the slot has been seen free (at a queue-depth read) without taking a task.
    pub(super) idle_since: Option<Instant>,
    /// Liveness: a message of the attached generation arrived since the last tick.
    pub(super) heard: bool,
    /// Liveness: the tick at which the attached generation was last heard from.
    pub(super) last_heard: Option<Instant>,
    /// This generation stopped answering and was killed by the broker (`PERAGO_STALL_TIMEOUT`):
    /// its death is the runtime's doing, never its task's (poison detection must not count it).
    pub(super) stalled: bool,
    /// The body peak memory of the slot's last completion that measured one, and the highest
    /// such peak (`body.memory_limit`; 0: none measured).
    pub(super) last_body_peak: u64,
    pub(super) max_body_peak: u64,
    /// The body version this generation runs (`SlotStarted.body_version`; 0 from an older
    /// supervisor counts as 1).
    pub(super) body_version: u32,
}

impl Slot {
    /// Slot `n`, never started yet.
    pub(super) fn new(prefix: &WorkerPrefix, n: u32, wanted: bool) -> Self {
        Self {
            number: n,
            worker_id: prefix.worker_id(SlotNumber::new(u64::from(n)).expect("1..=MAX_SLOT")),
            generation: 0,
            token: String::new(),
            pid: 0,
            attached: false,
            body_at_dispatch: false,
            work: Work::Idle,
            stopping: false,
            recycled: false,
            exited: false,
            wanted,
            idle_since: None,
            heard: false,
            last_heard: None,
            stalled: false,
            last_body_peak: 0,
            max_body_peak: 0,
            body_version: 1,
        }
    }

    pub(super) fn free(&self) -> bool {
        self.attached && matches!(self.work, Work::Idle) && !self.stopping && self.wanted
    }
}

/// A crash whose count against its workflow task waits for Conductor's record
/// ([`Effect::ReadCrashHistory`]); its lease runs until it is reported.
#[derive(Debug)]
pub(super) struct Parked {
    pub(super) run: Running,
    pub(super) worker_id: String,
    pub(super) crash: String,
}
/// A task received for which no slot was free yet: its lease runs until one is.
#[derive(Debug)]
pub(super) struct Held {
    pub(super) execution_id: String,
    pub(super) attempt: AttemptSnapshot,
    /// Its input is being fetched from external payload storage: it waits for that, not
    /// only for a slot.
    pub(super) fetching: bool,
}

/// The most effects whose vector [`Machine::give_back`] keeps for the next transition.
const KEPT_EFFECTS: usize = 64;

/// The state machine.
#[derive(Debug)]
pub(crate) struct Machine {
    pub(super) task_name: String,
    /// The task domain polled in (`PERAGO_DOMAIN`); `None`: the default queue.
    pub(super) domain: Option<Domain>,
    /// The capacity and lifecycle settings (`-j`, recycling, admission, poison, run once).
    pub(super) capacity: Capacity,
    /// Memory admission: whether new tasks may be polled (and slots added) now. Always true
    /// without `PERAGO_MIN_FREE_MEMORY`.
    pub(super) admission_open: bool,
    /// The task type's queue depth as Conductor last reported it (run once, adaptive range).
    pub(super) queue_depth: Option<u64>,
    /// Executor crashes per workflow task (poison detection, `PERAGO_POISON_AFTER`).
    pub(super) crashes: CrashLedger,
    /// Unexplained executor deaths lately: the evidence of a burst (poison detection).
    pub(super) deaths: RecentDeaths,
    /// Crashes waiting for their workflow task's history, by execution id.
    pub(super) parked: HashMap<String, Parked>,
    /// The clock as of the input being handled (the actor reads it; a test sets it).
    pub(super) now: Now,
    /// Where execution ids come from (random in the broker, a counter in tests).
    pub(super) ids: ExecutionIds,
    /// Task ids reported lately: a poll that returns one again is not believed.
    pub(super) reported: RecentlyReported,
    /// Available memory when last measured (memory admission).
    pub(super) available_memory: Option<u64>,
    /// The waiting poll request has been counted as withheld by memory admission.
    pub(super) poll_withheld: bool,
    /// Queue-depth reads asked for so far; one is in flight while `depth_read_pending`.
    pub(super) depth_reads: u64,
    pub(super) depth_read_pending: bool,
    /// Run once: a poll came back empty while everything was idle, and nothing has happened
    /// since; the value is `depth_reads` then (only a read asked for later confirms it). While
    /// set, no poll is granted: a confirming read of 0 drains with no poll in flight.
    pub(super) quiet_after: Option<u64>,
    pub(super) broker_id: String,
    /// The runtime's worker-id prefix: the ids of slots added by `Admin.Scale`.
    pub(super) prefix: WorkerPrefix,
    pub(super) slots: Vec<Slot>,
    pub(super) held: VecDeque<Held>,
    pub(super) draining: bool,
    /// Polling is paused (`Admin.Pause`, `--paused`) since then: no poll is granted and no
    /// completion asks update-v2 for a next task; what runs finishes and is reported.
    pub(super) paused_since: Option<std::time::SystemTime>,
    /// Tasks granted to the poll in flight.
    pub(super) reserved: u32,
    pub(super) poll_wanted: bool,
    /// The poller has been told to stop.
    pub(super) poll_stopped: bool,
    pub(super) updates_in_flight: u32,
    /// Whether completions go through update-v2: until the reporter finds the server lacks
    /// it ([`Input::UpdateV2Unsupported`]).
    pub(super) v2: bool,
    pub(super) counters: Arc<Counters>,
    pub(super) gauges: Arc<Gauges>,
    pub(super) started_at: SystemTime,
    pub(super) drained: bool,
    pub(super) effects: Vec<Effect>,
    /// `PERAGO_STALL_TIMEOUT` (`None`: liveness off).
    pub(super) stall_timeout: Option<Duration>,
    /// The last ping's sequence number.
    pub(super) ping_sequence: u64,
    /// When the last liveness tick came (a late one means the broker itself was not running).
    pub(super) last_tick: Option<Instant>,
    /// The last queue-depth read failed (both routes): run once cannot confirm an empty
    /// queue that way and counts empty polls instead.
    pub(super) depth_unreadable: bool,
    /// Run once with the depth unreadable: empty polls in a row while everything was idle.
    pub(super) once_empty_polls: u32,
    /// The last poll came back with fewer tasks than it asked for: the queue looks sparse, so
    /// the next poll asks for one task (a long poll that its first task answers); after a
    /// poll that came back full, polls ask for every free slot again (with [`FILL_WAIT`]).
    pub(super) poll_sparse: bool,
    /// The soft time limit each assignment carries (`Admin.Reconfigure`, or the manifest's as
    /// the supervisor told it at start), in milliseconds, 0 for none; `None`: not told, the
    /// executors use their manifest's.
    pub(super) soft_time_limit_ms: Option<u64>,
    /// The long poll's wait (`PERAGO_POLL_WAIT_MS`, or a reconfigure's).
    pub(super) poll_wait: Duration,
    /// The wait after an empty poll (`PERAGO_POLL_INTERVAL_MS`, or a reconfigure's).
    pub(super) poll_interval: Duration,
    /// When the last `Admin.Reconfigure` that changed something came.
    pub(super) reconfigured_at: Option<SystemTime>,
    /// Capacity shared across task types (`PERAGO_SHARE`): the permits granted (`None`: not
    /// sharing, no limit).
    pub(super) share: Option<super::share::Permits>,
    /// The body version every generation should run (`Control.RollBody`; 1 at start). A live
    /// generation of an older one is recycled at its first safe moment (see `roll`).
    pub(super) body_version: u32,
    /// A roll started and its end is not logged yet.
    pub(super) roll_open: bool,
    /// The type's recent executions: admission from them (`PERAGO_MEMORY_HEADROOM`,
    /// `--max-runtime`).
    pub(super) profile: super::profile::Profile,
    /// `--max-runtime`: when the run once must be over (counted from the machine's start).
    pub(super) deadline: Option<Instant>,
}

/// Compares secrets without an early exit on the first differing byte.
pub(super) fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

pub(super) fn stop_message(reason: &str) -> proto::BrokerMessage {
    proto::BrokerMessage {
        message: Some(proto::broker_message::Message::Stop(proto::Stop {
            reason: reason.to_owned(),
        })),
    }
}

impl Machine {
    /// The machine of a runtime that polls in `domain` (shown in Admin.Status).
    pub(crate) fn with_domain(mut self, domain: Option<Domain>) -> Self {
        self.domain = domain;
        self
    }

    pub(crate) fn new(
        task_name: String,
        prefix: &WorkerPrefix,
        capacity: Capacity,
        counters: Arc<Counters>,
        gauges: Arc<Gauges>,
        started: Now,
        ids: ExecutionIds,
    ) -> Self {
        let slots = capacity.max_executors;
        let capacity_paused = capacity.paused;
        let capacity_max_runtime = capacity.max_runtime;
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        gauges.slots.store(u64::from(slots), relaxed);
        gauges
            .wanted_executors
            .store(u64::from(capacity.min_executors), relaxed);
        gauges.queue_depth.store(u64::MAX, relaxed);
        gauges.admission_open.store(1, relaxed);
        gauges.paused.store(u64::from(capacity.paused), relaxed);
        let slots = (1..=slots)
            .map(|n| Slot::new(prefix, n, n <= capacity.min_executors))
            .collect();
        Self {
            task_name,
            domain: None,
            capacity,
            admission_open: true,
            queue_depth: None,
            crashes: CrashLedger::default(),
            deaths: RecentDeaths::default(),
            parked: HashMap::new(),
            now: started,
            ids,
            reported: RecentlyReported::default(),
            available_memory: None,
            poll_withheld: false,
            depth_reads: 0,
            depth_read_pending: false,
            quiet_after: None,
            broker_id: prefix.broker_id(),
            prefix: prefix.clone(),
            slots,
            held: VecDeque::new(),
            draining: false,
            paused_since: capacity_paused.then_some(started.wall),
            reserved: 0,
            poll_wanted: false,
            poll_stopped: false,
            updates_in_flight: 0,
            v2: true,
            counters,
            gauges,
            started_at: started.wall,
            drained: false,
            effects: Vec::new(),
            stall_timeout: None,
            ping_sequence: 0,
            last_tick: None,
            depth_unreadable: false,
            once_empty_polls: 0,
            poll_sparse: false,
            soft_time_limit_ms: None,
            poll_wait: perago_core::env::DEFAULT_POLL_WAIT,
            poll_interval: Duration::ZERO,
            reconfigured_at: None,
            share: None,
            body_version: 1,
            roll_open: false,
            profile: super::profile::Profile::default(),
            deadline: Self::deadline_from(started.instant, capacity_max_runtime),
        }
    }

    /// Turns liveness on (`PERAGO_STALL_TIMEOUT`): [`Input::Tick`] pings and judges.
    pub(crate) fn with_stall_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.stall_timeout = timeout;
        self
    }

    /// How many slots there are (the highest maximum the runtime has had).
    pub(crate) fn slot_count(&self) -> usize {
        self.slots.len()
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
    pub(crate) fn handle(&mut self, input: Input, now: Now) -> Output {
        self.now = now;
        self.note_heard(&input);
        let reply = self.step(input);
        self.check_time_left();
        self.stop_unwanted();
        // Before anything is dispatched: an executor of an old body version takes no task.
        self.roll_idle();
        self.roll_ended();
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
        if let Some(p) = self.share {
            let relaxed = std::sync::atomic::Ordering::Relaxed;
            self.gauges.share_limit.store(u64::from(p.limit), relaxed);
            self.gauges
                .share_held
                .store(u64::from(self.share_holding()), relaxed);
        }
        let oldest = self
            .slots
            .iter()
            .filter(|s| s.generation != 0 && !s.exited)
            .map(|s| s.body_version)
            .min()
            .unwrap_or(self.body_version);
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        self.gauges
            .body_version
            .store(u64::from(self.body_version), relaxed);
        self.gauges
            .oldest_body_version
            .store(u64::from(oldest), relaxed);
        self.publish_profile();
        Output {
            reply,
            effects: std::mem::take(&mut self.effects),
        }
    }

    /// Takes back the vector of effects a transition returned, once they are performed, so the
    /// next transition fills it again instead of allocating one (a task takes several
    /// transitions). One that grew past [`KEPT_EFFECTS`] is let go.
    pub(crate) fn give_back(&mut self, mut effects: Vec<Effect>) {
        if self.effects.capacity() == 0 && effects.capacity() <= KEPT_EFFECTS {
            effects.clear();
            self.effects = effects;
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
            Input::SlotExited(exited) => self.slot_exited(exited),
            Input::FenceTarget {
                credentials,
                execution_id,
            } => return Reply::Fence(self.fence_target(&credentials, &execution_id)),
            Input::PollRequest => self.poll_wanted = true,
            Input::Polled { tasks, reserved } => self.polled(tasks, reserved),
            Input::PollFailed { reserved } => {
                self.reserved = self.reserved.saturating_sub(reserved);
            }
            Input::UpdateDone { slot, next_task } => self.update_done(slot, next_task),
            Input::UpdateV2Unsupported => self.v2 = false,
            Input::LeaseLost { execution_id } => self.lease_lost(&execution_id),
            Input::Drain => {
                let already = self.draining;
                self.start_drain();
                return Reply::Drain(already);
            }
            Input::Pause => return self.pause(),
            Input::Resume => return Reply::Resume(self.resume()),
            Input::Status => return Reply::Status(Box::new(self.status())),
            Input::Scale { min, max } => return Reply::Scale(self.scale(min, max)),
            Input::Reconfigure(settings) => {
                return Reply::Reconfigure(self.reconfigure(settings));
            }
            Input::ShareGrant { limit, epoch } => {
                return Reply::ShareGrant(self.share_grant(limit, epoch));
            }
            Input::Roll { body_version } => self.roll(body_version),
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

    pub(super) fn slot_mut(&mut self, number: u32) -> Option<&mut Slot> {
        self.slots
            .get_mut(usize::try_from(number).ok()?.checked_sub(1)?)
    }

    pub(super) fn send(&mut self, slot: u32, generation: u64, message: proto::BrokerMessage) {
        self.effects.push(Effect::Send {
            slot,
            generation,
            message,
        });
    }

    /// Nothing running, reported or held: no slot busy or awaiting update-v2's next task, no
    /// held task, no update in flight.
    pub(super) fn all_idle(&self) -> bool {
        self.held.is_empty()
            && self.updates_in_flight == 0
            && self.slots.iter().all(|s| matches!(s.work, Work::Idle))
    }

    /// Whether polling is paused.
    pub(crate) fn paused(&self) -> bool {
        self.paused_since.is_some()
    }

    /// Whether a drain has started.
    pub(crate) fn draining(&self) -> bool {
        self.draining
    }
}
