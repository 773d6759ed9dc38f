//! The supervisor's decisions, as a machine: [`Machine::handle`] takes one [`Input`] (a child
//! exited, a signal, the broker's state, the result of an effect, time passing) at `now` and
//! returns the [`Effect`]s to perform; it never reads the clock, never waits and does no I/O
//! (it logs). The actor (`actor.rs`) owns it, performs the effects as tasks and feeds their
//! results back as inputs; [`Machine::next_wake`] says when time next matters.
//!
//! ```text
//! Begin → per slot 1..=MIN in turn: Announce(gen, token) → Announced → Spawn → Spawned
//! executor Exited → HandleExit (SlotExited, answered with the broker's view; kill adopted; GC)
//!   → ExitHandled → retired (stays empty) | draining (stays empty) | recycled (restart now)
//!   | restart after 1, 2, 4, 8, 16, 30, 30… s (reset after a 60 s run or a completed assignment)
//! BrokerState (Admin.Watch: each change, a heartbeat every second): READY=1, STATUS=, a drain
//!   seen, the slots wanted started; none for PERAGO_STALL_TIMEOUT: the broker is killed
//! Signal / Stop → Drain (once; a second one is ignored with a warning)
//! force-kill due → ReadPhases → SIGKILL executors → broker kill due → SIGKILL broker
//! broker Exited: clean = a finished drain; else SIGTERM executors (BROKER_GONE), exit 1
//! ```

use super::children::{Child, ChildExit, ChildKind};
use super::notify;
use crate::errors::RuntimeError;
use perago_core::capacity::Capacity;
use perago_proto::{admin::v1 as admin, slot::v1 as proto};
use perago_sys::signal;
use std::{
    collections::{BTreeMap, VecDeque},
    time::{Duration, Instant},
};

/// After the executors are force-killed, the broker gets this long to report their failures.
pub(crate) const BROKER_KILL_DELAY: Duration = Duration::from_secs(2);
/// A replacement that has run this long resets its slot's restart backoff (so does its first
/// completed assignment).
pub(crate) const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(60);
/// The heartbeat the watcher asks the broker's `Admin.Watch` for (the most it stays quiet): the
/// watchdog accepts a state up to three of these old.
pub(crate) const STATUS_INTERVAL: Duration = Duration::from_secs(1);

/// The restart delay before the `n`-th consecutive restart of a slot (0-based).
pub(crate) fn restart_delay(n: u32) -> Duration {
    const STEPS: [u64; 6] = [1, 2, 4, 8, 16, 30];
    Duration::from_secs(STEPS[(n as usize).min(STEPS.len() - 1)])
}

mod broker_state;
mod exits;
mod protocol;
mod roll;

pub(crate) use protocol::{AnnounceError, Config, Effect, Input, Notice, SlotView};

/// Why a slot's executor is being started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// One of the runtime's first `min_executors`: a failure stops the runtime.
    Startup,
    /// A restart (after an exit, or a failed start): a failure backs off.
    Restart,
    /// A slot the broker wants (`-j MIN..MAX`): a failure backs off.
    ScaleUp,
}

/// An exit whose handling (report, cleanup, the broker's view) is under way.
#[derive(Debug)]
struct PendingExit {
    generation: u64,
    pid: u32,
    status: String,
    ran: Duration,
    recycled: bool,
}

#[derive(Debug)]
struct SlotProc {
    worker_id: String,
    generation: u64,
    /// The generation announced to the broker and not yet acknowledged (a call that timed out
    /// may or may not have been taken): the next try repeats it, token and body version and
    /// all, and the broker answers a repeat as taken. `generation` moves only once the broker
    /// took it.
    announcing: Option<(u64, String, u32)>,
    /// The body version of `generation` (the one announced with it).
    body_version: u32,
    child: Option<Child>,
    started_at: Instant,
    restarts: u32,
    restart_at: Option<Instant>,
    /// Killed at the shutdown deadline (its exit report says so).
    force_killed: bool,
    /// Why the supervisor signalled this generation itself, if it did: its exit report says
    /// so, and the broker never counts such a death against the task it ran.
    killed_by: proto::ExitCause,
    /// An announcement or spawn under way, and why.
    starting: Option<Start>,
    /// The last exit, while it is handled.
    exiting: Option<PendingExit>,
}

/// The supervisor's state for one runtime, and its decisions.
#[derive(Debug)]
pub(crate) struct Machine {
    config: Config,
    /// A fresh control token for each new generation (random in the actor).
    tokens: fn() -> String,
    slots: BTreeMap<u32, SlotProc>,
    broker: Option<Child>,
    begun: bool,
    /// Start-up slots not started yet (one at a time, in order).
    startup: VecDeque<u32>,
    draining: bool,
    broker_failed: Option<String>,
    /// The broker refused one of this supervisor's generations: the runtime stops with it.
    refused: Option<RuntimeError>,
    /// When the running executors are force-killed (`PERAGO_SHUTDOWN_FORCE_KILL_AFTER` after
    /// the drain started, whoever started it).
    force_kill_at: Option<Instant>,
    /// The force kill's phase read is under way.
    force_kill_reading: bool,
    /// The deadline passed and executors still running were killed.
    force_killed: bool,
    broker_kill_at: Option<Instant>,
    /// The broker stopped answering for `PERAGO_STALL_TIMEOUT` and was killed: why, for the
    /// error its exit ends the runtime with.
    broker_stalled: Option<String>,
    /// When the broker's state last came.
    status_at: Instant,
    gc_at: Instant,
    gc_running: bool,
    watchdog_at: Option<Instant>,
    /// This runtime told systemd it is ready.
    ready: bool,
    /// The broker's state stream ended cleanly (it drained and exits).
    broker_drained: bool,
    /// `Admin.Scale` changed the executor range since the start: the slots the broker wants are
    /// followed as an adaptive runtime's are, whatever `-j` the runtime started with.
    scaled: bool,
    /// The body version every new generation starts with (1; each [`Input::Roll`] raises it).
    body_version: u32,
    /// A roll is under way: until the broker shows every live generation at `body_version`.
    rolling: bool,
}

impl Machine {
    /// A runtime whose broker (`broker`) serves; nothing starts before [`Input::Begin`].
    pub(crate) fn new(config: Config, tokens: fn() -> String, broker: Child, now: Instant) -> Self {
        let slots = config
            .worker_ids
            .iter()
            .zip(1..)
            .map(|(worker_id, n)| (n, Self::slot_proc(worker_id.clone(), now)))
            .collect();
        Self {
            gc_at: now + config.gc_interval,
            config,
            tokens,
            slots,
            broker: Some(broker),
            begun: false,
            startup: VecDeque::new(),
            draining: false,
            broker_failed: None,
            refused: None,
            force_kill_at: None,
            force_kill_reading: false,
            force_killed: false,
            broker_kill_at: None,
            broker_stalled: None,
            status_at: now,
            gc_running: false,
            watchdog_at: None,
            ready: false,
            broker_drained: false,
            scaled: false,
            body_version: 1,
            rolling: false,
        }
    }

    /// Whether the broker decides which slots run (`-j MIN..MAX`, or a range changed live).
    fn follows_broker(&self) -> bool {
        self.config.capacity.adaptive() || self.scaled
    }

    /// A slot the broker has that this machine does not (`Admin.Scale` added it): a place for
    /// its executor, under the worker id the broker gave it.
    fn slot_proc(worker_id: String, now: Instant) -> SlotProc {
        SlotProc {
            worker_id,
            generation: 0,
            announcing: None,
            body_version: 1,
            child: None,
            started_at: now,
            restarts: 0,
            restart_at: None,
            force_killed: false,
            killed_by: proto::ExitCause::Unspecified,
            starting: None,
            exiting: None,
        }
    }

    /// Takes `input` at `now`; returns what to do.
    pub(crate) fn handle(&mut self, input: Input, now: Instant) -> Vec<Effect> {
        let mut out = Vec::new();
        match input {
            Input::Begin => self.begin(now, &mut out),
            Input::Exited(exit) => self.on_exit(exit, now, &mut out),
            Input::Completed(kind) => self.on_completion(kind),
            Input::Signal(why) => self.start_drain(why, now, &mut out),
            Input::Stop(why) => self.start_drain(&why, now, &mut out),
            Input::BrokerState(seen) => self.on_broker_state(&seen, now, &mut out),
            Input::BrokerDrained => self.on_broker_drained(now),
            Input::PhasesRead(status) => self.on_phases_read(status, now, &mut out),
            Input::Announced {
                slot,
                generation,
                result,
            } => self.on_announced(slot, generation, result, now, &mut out),
            Input::Spawned {
                slot,
                generation,
                result,
            } => self.on_spawned(slot, generation, result, now, &mut out),
            Input::ExitHandled {
                slot,
                generation,
                seen,
            } => self.on_exit_handled(slot, generation, seen, now),
            Input::GcDone => self.gc_running = false,
            Input::DrainFailed(e) => {
                tracing::warn!(error = %perago_core::errors::DisplayChain(&e), "cannot ask the broker to drain; stopping it with SIGTERM");
                if let Some(broker) = self.broker {
                    out.push(Effect::Signal {
                        child: broker,
                        signal: signal::SIGTERM,
                    });
                }
            }
            Input::Roll { body_version } => self.on_roll(body_version, &mut out),
            Input::Tick => {}
        }
        if self.begun {
            self.timers(now, &mut out);
        }
        out
    }

    /// The next time something is due (a restart, a deadline, a periodic check), if any.
    pub(crate) fn next_wake(&self) -> Option<Instant> {
        if !self.begun {
            return None;
        }
        let restart = self.next_restart().map(|(_, at)| at);
        let stall = self
            .stall_watched()
            .then(|| self.status_at + self.config.stall_timeout.unwrap_or_default());
        let gc = (!self.gc_running).then_some(self.gc_at);
        [
            restart,
            self.force_kill_at,
            self.broker_kill_at,
            stall,
            gc,
            self.watchdog_at,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The runtime is over: no broker, no executor, and nothing of theirs under way.
    pub(crate) fn done(&self) -> bool {
        self.begun
            && self.broker.is_none()
            && !self.gc_running
            && self
                .slots
                .values()
                .all(|p| p.child.is_none() && p.starting.is_none() && p.exiting.is_none())
    }

    /// How the runtime ended (once [`done`](Self::done)).
    pub(crate) fn outcome(self) -> Result<(), RuntimeError> {
        if let Some(refused) = self.refused {
            return Err(refused);
        }
        match (self.broker_failed, self.force_killed) {
            (Some(status), _) => Err(RuntimeError::BrokerDied { status }),
            (None, true) => Err(RuntimeError::ForceKilled {
                deadline: self.config.force_kill_after.unwrap_or_default(),
            }),
            (None, false) => Ok(()),
        }
    }

    /// Each slot's current generation (the last the broker took): the GC keeps what a live
    /// executor of one of them owns. Read when the sweep runs, not when it was asked for: a
    /// sweep queued behind an exit must know of the generation that exit's restart started.
    pub(crate) fn generations(&self) -> BTreeMap<u32, u64> {
        self.slots.iter().map(|(n, p)| (*n, p.generation)).collect()
    }

    /// Whether the runtime is draining (no restarts).
    #[cfg(test)]
    pub(crate) fn draining(&self) -> bool {
        self.draining
    }

    /// A slot's generation, restart count and pending restart (for tests).
    #[cfg(test)]
    pub(crate) fn slot(&self, slot: u32) -> (u64, u32, Option<Instant>) {
        let p = &self.slots[&slot];
        (p.generation, p.restarts, p.restart_at)
    }

    fn begin(&mut self, now: Instant, out: &mut Vec<Effect>) {
        self.begun = true;
        self.status_at = now;
        self.gc_at = now + self.config.gc_interval;
        self.watchdog_at = self.config.watchdog.map(|_| now);
        // An adaptive runtime starts its minimum; the slots above it start when the queue has
        // a backlog.
        self.startup = (1..=self.config.capacity.min_executors).collect();
        self.next_startup(now, out);
    }

    fn next_startup(&mut self, now: Instant, out: &mut Vec<Effect>) {
        if let Some(slot) = self.startup.pop_front() {
            self.start_executor(slot, Start::Startup, now, out);
        }
    }

    fn stall_watched(&self) -> bool {
        self.config.stall_timeout.is_some()
            && self.broker.is_some()
            && !self.broker_drained
            && self.broker_stalled.is_none()
    }

    fn timers(&mut self, now: Instant, out: &mut Vec<Effect>) {
        while let Some((slot, at)) = self.next_restart()
            && at <= now
        {
            tracing::info!(slot, "restarting the slot");
            self.start_executor(slot, Start::Restart, now, out);
        }
        if self.force_kill_at.is_some_and(|at| at <= now) {
            self.force_kill_at = None;
            self.force_kill_reading = true;
            out.push(Effect::ReadPhases);
        }
        if self.broker_kill_at.is_some_and(|at| at <= now) {
            self.broker_kill_at = None;
            if let Some(broker) = self.broker {
                tracing::error!(
                    pid = broker.pid(),
                    "force-killing the broker after the shutdown deadline"
                );
                out.push(Effect::Signal {
                    child: broker,
                    signal: signal::SIGKILL,
                });
            }
            out.push(Effect::AbortAll);
        }
        if self.stall_watched()
            && let Some(timeout) = self.config.stall_timeout
            && now.saturating_duration_since(self.status_at) >= timeout
        {
            self.broker_is_stalled(timeout, out);
        }
        if !self.gc_running && self.gc_at <= now {
            self.gc_running = true;
            self.gc_at = now + self.config.gc_interval;
            out.push(Effect::SweepExpired);
        }
        if let (Some(at), Some(every)) = (self.watchdog_at, self.config.watchdog)
            && at <= now
        {
            self.watchdog_at = Some(now + every.max(Duration::from_millis(1)));
            // Fresh state, or a drain: the runtime is alive.
            if self.draining
                || now.saturating_duration_since(self.status_at) < every.max(STATUS_INTERVAL * 3)
            {
                out.push(Effect::Notify(Notice::Ping));
            }
        }
    }

    /// From now on no slot restarts, and the shutdown deadline runs (once, from the first
    /// drain: a signal, Admin.Drain or the broker's death).
    fn set_draining(&mut self, now: Instant) {
        if std::mem::take(&mut self.rolling) {
            tracing::info!(
                body_version = self.body_version,
                "the drain ends the body roll: executors of older versions finish as every executor does"
            );
        }
        self.draining = true;
        self.startup.clear();
        for proc in self.slots.values_mut() {
            proc.restart_at = None;
        }
        if self.force_kill_at.is_none()
            && !self.force_kill_reading
            && !self.force_killed
            && let Some(after) = self.config.force_kill_after
        {
            self.force_kill_at = Some(now + after);
        }
    }

    /// Announces the slot's next generation (or repeats the one announced last, if the
    /// broker's answer was lost) before its process exists, so the executor can never attach
    /// before it is expected. The broker takes generations only in order.
    fn start_executor(&mut self, slot: u32, why: Start, _now: Instant, out: &mut Vec<Effect>) {
        let tokens = self.tokens;
        let body_version = self.body_version;
        let proc = self.slots.get_mut(&slot).expect("known slot");
        proc.restart_at = None;
        proc.starting = Some(why);
        // Every new generation starts at the newest body version (a slot that crashed or was
        // recycled mid-roll too); a repeated announcement keeps the version it was made with.
        let (generation, token, body_version) = proc
            .announcing
            .get_or_insert_with(|| (proc.generation + 1, tokens(), body_version))
            .clone();
        out.push(Effect::Announce {
            slot,
            generation,
            token,
            body_version,
        });
    }

    fn on_announced(
        &mut self,
        slot: u32,
        generation: u64,
        result: Result<(), AnnounceError>,
        now: Instant,
        out: &mut Vec<Effect>,
    ) {
        let Some(proc) = self.slots.get_mut(&slot) else {
            return;
        };
        let Some(why) = proc.starting else {
            return;
        };
        match result {
            Ok(()) => {
                let (token, body_version) = proc
                    .announcing
                    .take()
                    .map(|(_, token, version)| (token, version))
                    .unwrap_or_default();
                proc.generation = generation;
                proc.body_version = body_version;
                if self.broker.is_none() || self.draining {
                    // Taken, but nothing is left to attach to, or a drain started meanwhile:
                    // a draining broker gives a new executor no work, and once its drain ends
                    // the executor would only wait out its connect patience.
                    proc.starting = None;
                    return;
                }
                out.push(Effect::Spawn {
                    slot,
                    generation,
                    token,
                    worker_id: proc.worker_id.clone(),
                    body_version,
                });
            }
            Err(AnnounceError::Refused(reason)) => {
                proc.starting = None;
                // Refused, not lost: the broker's slot is at another generation than this
                // supervisor's (see `RuntimeError::GenerationRefused`). Retrying could never
                // succeed, and re-announcing the generation the broker expects would race
                // whoever holds the token: stop, loudly.
                let error = RuntimeError::GenerationRefused {
                    slot,
                    generation,
                    reason,
                };
                self.start_failed(slot, why, error, now, out);
            }
            Err(AnnounceError::Lost(status)) => {
                proc.starting = None;
                self.start_failed(slot, why, status.into(), now, out);
            }
        }
    }

    fn on_spawned(
        &mut self,
        slot: u32,
        generation: u64,
        result: std::io::Result<Child>,
        now: Instant,
        out: &mut Vec<Effect>,
    ) {
        let Some(proc) = self.slots.get_mut(&slot) else {
            return;
        };
        let Some(why) = proc.starting.take() else {
            return;
        };
        match result {
            Ok(child) => {
                proc.child = Some(child);
                proc.started_at = now;
                tracing::info!(worker_id = %proc.worker_id, slot, generation, pid = child.pid(), body_version = proc.body_version, "executor started");
                if self.draining {
                    // Its spawn was under way when the drain started: it would get no work.
                    tracing::info!(worker_id = %proc.worker_id, slot, generation, "draining: the executor just started is stopped");
                    proc.killed_by = proto::ExitCause::Supervisor;
                    out.push(Effect::Signal {
                        child,
                        signal: signal::SIGTERM,
                    });
                    return;
                }
                if self.rolling && proc.body_version == self.body_version {
                    tracing::info!(worker_id = %proc.worker_id, slot, generation, body_version = proc.body_version, "slot rolled to the new body version");
                }
                if why == Start::Startup {
                    self.next_startup(now, out);
                }
            }
            Err(source) => {
                let error = RuntimeError::Spawn {
                    what: format!("executor {}", proc.worker_id),
                    source,
                };
                self.start_failed(slot, why, error, now, out);
            }
        }
    }

    /// A start failed: at start-up the runtime stops; later, a refused generation stops it
    /// and anything else is retried with backoff.
    fn start_failed(
        &mut self,
        slot: u32,
        why: Start,
        error: RuntimeError,
        now: Instant,
        out: &mut Vec<Effect>,
    ) {
        let refused = matches!(error, RuntimeError::GenerationRefused { .. });
        match why {
            Start::Startup => {
                tracing::error!(error = %perago_core::errors::DisplayChain(&error), "cannot start an executor; stopping");
                self.start_drain("start-up failure", now, out);
                if refused {
                    self.refused.get_or_insert(error);
                } else {
                    self.broker_failed
                        .get_or_insert_with(|| perago_core::errors::chain(&error));
                }
            }
            _ if refused => {
                tracing::error!(error = %perago_core::errors::DisplayChain(&error), "the broker refused an executor generation; stopping the runtime");
                self.start_drain("a refused generation", now, out);
                self.refused.get_or_insert(error);
            }
            Start::Restart | Start::ScaleUp => {
                if why == Start::Restart {
                    tracing::error!(error = %perago_core::errors::DisplayChain(&error), "cannot restart an executor; retrying with backoff");
                } else {
                    tracing::error!(error = %perago_core::errors::DisplayChain(&error), "cannot start an executor; retrying with backoff");
                }
                // A drain started while the start was under way: no restart any more.
                if !self.draining {
                    let proc = self.slots.get_mut(&slot).expect("known slot");
                    proc.restart_at = Some(now + restart_delay(proc.restarts));
                    proc.restarts += 1;
                }
            }
        }
    }

    fn start_drain(&mut self, why: &str, now: Instant, out: &mut Vec<Effect>) {
        if self.draining {
            tracing::warn!(
                "{why} during drain: ignored; the drain goes on (set PERAGO_SHUTDOWN_FORCE_KILL_AFTER to bound it)"
            );
            return;
        }
        tracing::info!("{why}: draining (no new tasks; running ones finish and are reported)");
        if self.config.notify {
            out.push(Effect::Notify(Notice::Stopping(why.to_owned())));
        }
        self.set_draining(now);
        if self.broker.is_some() {
            out.push(Effect::Drain);
        }
    }

    fn next_restart(&self) -> Option<(u32, Instant)> {
        self.slots
            .iter()
            .filter_map(|(slot, p)| p.restart_at.map(|at| (*slot, at)))
            .min_by_key(|(_, at)| *at)
    }
}

#[cfg(test)]
#[path = "machine_tests.rs"]
mod tests;
