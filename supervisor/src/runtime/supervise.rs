//! The supervisor's dispatcher: one loop over child exits, restart timers, signals and the
//! force-kill deadline. It alone starts and reaps processes; it tells the broker about every
//! executor generation over `Control`, and starts a drain over `Admin`.
//!
//! ```text
//! socket free → broker up (answers with its own pid) → per slot: SlotStarted(gen, token) → spawn executor
//! executor exits, not draining → SlotExited → restart after 1, 2, 4, 8, 16, 30, 30… s
//!   (not when the broker retired its slot: `-j MIN..MAX` scaling down)
//! executor exits EXIT_RECYCLED (a recycling limit) → SlotExited → restart at once, no backoff
//! Admin.Status every second: start the executors of slots the broker wants (scaling up)
//! under systemd (`NOTIFY_SOCKET`): READY=1 once the starting executors are attached, STATUS=
//!   busy/idle as Admin.Status changes, STOPPING=1 at a drain, WATCHDOG=1 while the broker answers
//! SIGINT/SIGTERM → Admin.Drain; the broker stops executors and exits once all is reported
//! broker exits unexpectedly → SIGTERM executors, wait, exit 1
//! ```

use super::{
    children::{Child, ChildExit, ChildKind, Launcher},
    notify::{self, NotifyHandle},
};
use perago_core::{env, identity::Slot as SlotNumber, identity::WorkerPrefix, process};
use perago_proto::{
    CONTROL_TOKEN_METADATA,
    admin::v1::{self as admin, admin_client::AdminClient},
    slot::v1::{self as proto, control_client::ControlClient},
};
use std::{
    collections::BTreeMap,
    path::PathBuf,
    time::{Duration, Instant},
};
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::mpsc,
    time::sleep_until,
};
use tonic::{service::Interceptor, transport::Channel};

/// How long the broker has to start serving its socket.
const BROKER_START_DEADLINE: Duration = Duration::from_secs(15);
/// After the executors are force-killed, the broker gets this long to report their failures.
const BROKER_KILL_DELAY: Duration = Duration::from_secs(2);
/// A replacement that has run this long resets its slot's restart backoff (so does its first
/// completed assignment).
const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(60);

/// How often the supervisor reads the broker's status (drain state, wanted slots) while
/// running.
const STATUS_INTERVAL: Duration = Duration::from_secs(1);

/// How often readiness for systemd is checked until the starting executors are attached.
const READY_CHECK_INTERVAL: Duration = Duration::from_millis(25);

/// Every call to the broker is bounded: a wedged broker must not wedge the dispatcher.
const CONTROL_CALL_DEADLINE: Duration = Duration::from_secs(5);

async fn bounded<T>(
    call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<tonic::Response<T>, tonic::Status> {
    tokio::time::timeout(CONTROL_CALL_DEADLINE, call)
        .await
        .unwrap_or_else(|_| {
            Err(tonic::Status::deadline_exceeded(
                "the broker did not answer within 5 s",
            ))
        })
}

/// The restart delay before the `n`-th consecutive restart of a slot (0-based).
pub(crate) fn restart_delay(n: u32) -> Duration {
    const STEPS: [u64; 6] = [1, 2, 4, 8, 16, 30];
    Duration::from_secs(STEPS[(n as usize).min(STEPS.len() - 1)])
}

/// What the runtime needs to start.
#[derive(Debug)]
pub(crate) struct RuntimeSpec {
    pub(crate) task_name: String,
    pub(crate) manifest_path: PathBuf,
    /// `-j` and the other capacity and lifecycle settings (passed to every child).
    pub(crate) capacity: perago_core::capacity::Capacity,
    pub(crate) prefix: WorkerPrefix,
    pub(crate) conductor_url: String,
    pub(crate) socket: PathBuf,
    pub(crate) force_kill_after: Option<Duration>,
    /// `PERAGO_LOG_ROOT` for the children's JSONL logs.
    pub(crate) log_root: PathBuf,
    /// The locked workspace root (`PERAGO_WORKSPACE_ROOT` for the executors).
    pub(crate) workspace_root: PathBuf,
    /// How often the attempt GC runs.
    pub(crate) gc_interval: Duration,
    /// Age after which an attempt not owned by a live executor is removed.
    pub(crate) gc_ttl: Duration,
    /// Extra environment for every child (tests: a shorter long-poll).
    pub(crate) child_env: Vec<(String, String)>,
    /// For the GC to delete staging branches left by killed executors (workspace tasks).
    pub(crate) lakefs: Option<perago_core::lakefs::LakefsClient>,
    /// systemd's notify socket (under a `Type=notify` unit), shared with the other task
    /// types' runtimes of this supervisor.
    pub(crate) notify: Option<NotifyHandle>,
    /// When the supervisor runs several task types: the task name, after an `@` in each
    /// child's argv[0] (`perago-executor-0001@orders.ship`), so `ps` tells them apart.
    pub(crate) process_label: Option<String>,
    /// `PERAGO_STALL_TIMEOUT` (`None`: off): passed to every child; a broker whose
    /// `Admin.Status` has not answered for this long is killed.
    pub(crate) stall_timeout: Option<Duration>,
}

/// What every child gets: the runtime's description (each name is a constant of
/// `perago_core::env` or `perago_core::capacity`, read with the same constant on the other
/// side).
fn base_env(spec: &RuntimeSpec) -> Vec<(String, String)> {
    let path = |p: &std::path::Path| p.display().to_string();
    let mut vars = vec![
        (env::CONDUCTOR_SERVER_URL, spec.conductor_url.clone()),
        (env::PERAGO_TASK_NAME, spec.task_name.clone()),
        (env::PERAGO_MANIFEST, path(&spec.manifest_path)),
        (env::PERAGO_SOCKET, path(&spec.socket)),
        (
            env::PERAGO_WORKER_ID_PREFIX,
            spec.prefix.as_str().to_owned(),
        ),
        (env::PERAGO_LOG_ROOT, path(&spec.log_root)),
        (env::PERAGO_WORKSPACE_ROOT, path(&spec.workspace_root)),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_owned(), value))
    .collect::<Vec<_>>();
    vars.extend(spec.capacity.child_env());
    vars.push((
        perago_core::liveness::PERAGO_STALL_TIMEOUT.to_owned(),
        perago_core::liveness::child_value(spec.stall_timeout),
    ));
    vars.extend(spec.child_env.iter().cloned());
    vars
}

/// The broker's environment: the base, the control token and the one process whose `Control`
/// calls it takes (`control_pid`: this supervisor).
fn broker_env(spec: &RuntimeSpec, control_token: &str, control_pid: u32) -> Vec<(String, String)> {
    let mut vars = vec![
        (
            env::PERAGO_CONTROL_TOKEN.to_owned(),
            control_token.to_owned(),
        ),
        (env::PERAGO_CONTROL_PID.to_owned(), control_pid.to_string()),
    ];
    vars.extend(base_env(spec));
    vars
}

/// An executor's environment: the base and its identity.
fn executor_env(
    spec: &RuntimeSpec,
    worker_id: &str,
    slot: u32,
    generation: u64,
    token: String,
) -> Vec<(String, String)> {
    let mut vars = base_env(spec);
    vars.extend([
        (env::PERAGO_WORKER_ID.to_owned(), worker_id.to_owned()),
        (env::PERAGO_SLOT.to_owned(), slot.to_string()),
        (env::PERAGO_GENERATION.to_owned(), generation.to_string()),
        (env::PERAGO_SLOT_TOKEN.to_owned(), token),
    ]);
    vars
}

/// Why the runtime ended with a failure.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The supervision of the runtime panicked (a bug); the other task types' runtimes drain.
    #[error("the supervision of this runtime failed: {cause}")]
    Panicked {
        /// The panic, as the task's join error tells it.
        cause: String,
    },
    /// A child process or thread cannot be started.
    #[error("cannot start {what}: {source}")]
    Spawn {
        /// What was being started.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The broker did not serve within the start-up deadline.
    #[error("the broker did not start serving on {} within {}s", socket.display(), BROKER_START_DEADLINE.as_secs())]
    BrokerStart {
        /// The runtime's socket.
        socket: PathBuf,
    },
    /// The broker exited before it served.
    #[error("the broker exited during start-up ({status})")]
    BrokerDiedAtStart {
        /// Its exit status.
        status: String,
    },
    /// Another runtime's broker answers on the socket.
    #[error(
        "another runtime is running under this workspace root: {who} already answers on {}; this supervisor did not start it and will not use it (stop that runtime first)",
        socket.display()
    )]
    ForeignBroker {
        /// The runtime's socket.
        socket: PathBuf,
        /// Who answers there.
        who: String,
    },
    /// The broker's control service failed.
    #[error("cannot reach the broker's control service: {0}")]
    Control(#[from] tonic::Status),
    /// The broker exited while the runtime ran.
    #[error("the broker exited ({status}) while the runtime was running")]
    BrokerDied {
        /// Its exit status.
        status: String,
    },
    /// The broker refused a generation this supervisor announced.
    #[error(
        "the broker refused generation {generation} of slot {slot} ({reason}): the slot's generations no longer follow this supervisor's, so another process holding the control token has announced one (the runtime's credentials may have leaked); the runtime stopped rather than fight over the slot"
    )]
    GenerationRefused {
        /// The slot.
        slot: u32,
        /// The generation refused.
        generation: u64,
        /// The broker's reason.
        reason: String,
    },
    /// The drain hit the shutdown deadline and running executors were killed.
    #[error(
        "the drain did not finish within PERAGO_SHUTDOWN_FORCE_KILL_AFTER ({}s): executors still running were killed and their tasks reported FAILED",
        deadline.as_secs()
    )]
    ForceKilled {
        /// `PERAGO_SHUTDOWN_FORCE_KILL_AFTER`.
        deadline: Duration,
    },
}

#[derive(Debug, Clone)]
struct TokenInterceptor(tonic::metadata::MetadataValue<tonic::metadata::Ascii>);

impl Interceptor for TokenInterceptor {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut()
            .insert(CONTROL_TOKEN_METADATA, self.0.clone());
        Ok(req)
    }
}

type Control =
    ControlClient<tonic::service::interceptor::InterceptedService<Channel, TokenInterceptor>>;

fn secret() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// Tells the broker about the slot's next generation (or repeats the one announced last, if
/// the broker's answer was lost) before its process exists, so the executor can never attach
/// before it is expected; returns the generation and its token once the broker took it. The
/// broker takes generations only in order (exactly one past the slot's current one).
async fn announce(
    control: Option<&mut Control>,
    slot: u32,
    proc: &mut SlotProc,
) -> Result<(u64, String), RuntimeError> {
    let (generation, token) = proc
        .announcing
        .get_or_insert_with(|| (proc.generation + 1, secret()))
        .clone();
    if let Some(control) = control {
        let answer = bounded(control.slot_started(proto::SlotStarted {
            slot,
            generation,
            token: token.clone(),
            pid: 0,
        }))
        .await;
        match answer {
            Ok(_) => {}
            // Refused, not lost: the broker's slot is at another generation than this
            // supervisor's (see `RuntimeError::GenerationRefused`). Retrying could never
            // succeed, and re-announcing the generation the broker expects would race whoever
            // holds the token: stop, loudly.
            Err(status)
                if matches!(
                    status.code(),
                    tonic::Code::FailedPrecondition | tonic::Code::NotFound
                ) =>
            {
                return Err(RuntimeError::GenerationRefused {
                    slot,
                    generation,
                    reason: status.message().to_owned(),
                });
            }
            // Lost or not delivered: the next try repeats this announcement, token and all.
            Err(status) => return Err(status.into()),
        }
    }
    proc.announcing = None;
    proc.generation = generation;
    Ok((generation, token))
}

#[derive(Debug)]
struct SlotProc {
    worker_id: String,
    generation: u64,
    /// The generation announced to the broker and not yet acknowledged (a call that timed out
    /// may or may not have been taken): the next try repeats it, token and all, and the broker
    /// answers a repeat as taken. `generation` moves only once the broker took it.
    announcing: Option<(u64, String)>,
    child: Option<Child>,
    started_at: Instant,
    restarts: u32,
    restart_at: Option<Instant>,
    /// Killed at the shutdown deadline (its exit report says so).
    force_killed: bool,
    /// Why the supervisor signalled this generation itself, if it did: its exit report says
    /// so, and the broker never counts such a death against the task it ran.
    killed_by: proto::ExitCause,
}

struct Supervisor {
    spec: RuntimeSpec,
    launcher: Launcher,
    exits: mpsc::UnboundedSender<ChildExit>,
    /// Each assignment an executor generation completes (see `completion_pipe`).
    completions: mpsc::UnboundedSender<ChildKind>,
    slots: BTreeMap<u32, SlotProc>,
    broker: Option<Child>,
    control: Option<Control>,
    admin: Option<AdminClient<Channel>>,
    draining: bool,
    broker_failed: Option<String>,
    /// The broker refused one of this supervisor's generations: the runtime stops with it.
    refused: Option<RuntimeError>,
    /// When the running executors are force-killed (`PERAGO_SHUTDOWN_FORCE_KILL_AFTER` after
    /// the drain started, whoever started it).
    force_kill_at: Option<tokio::time::Instant>,
    /// The deadline passed and executors still running were killed.
    force_killed: bool,
    /// systemd's notify socket, under a `Type=notify` unit.
    notifier: Option<NotifyHandle>,
    /// The broker stopped answering for `PERAGO_STALL_TIMEOUT` and was killed: why, for the
    /// error its exit ends the runtime with.
    broker_stalled: Option<String>,
}

impl Supervisor {
    /// From now on no slot restarts, and the shutdown deadline runs (once, from the first
    /// drain: a signal, Admin.Drain or the broker's death).
    fn set_draining(&mut self) {
        self.draining = true;
        for proc in self.slots.values_mut() {
            proc.restart_at = None;
        }
        if self.force_kill_at.is_none()
            && !self.force_killed
            && let Some(after) = self.spec.force_kill_after
        {
            self.force_kill_at = Some(tokio::time::Instant::now() + after);
        }
    }

    async fn start_executor(&mut self, slot: u32) -> Result<(), RuntimeError> {
        let proc = self.slots.get_mut(&slot).expect("known slot");
        proc.restart_at = None;
        let worker_id = proc.worker_id.clone();
        let (generation, token) = announce(self.control.as_mut(), slot, proc).await?;
        let env = executor_env(&self.spec, &worker_id, slot, generation, token);
        let mut argv0 = format!(
            "perago-executor-{}",
            SlotNumber::new(u64::from(slot)).expect("slot in range")
        );
        if let Some(label) = &self.spec.process_label {
            argv0 = format!("{argv0}@{label}");
        }
        let child = self
            .launcher
            .executor(
                &argv0,
                ChildKind::Executor { slot, generation },
                &env,
                &self.exits,
                &self.completions,
            )
            .map_err(|source| RuntimeError::Spawn {
                what: format!("executor {worker_id}"),
                source,
            })?;
        let pid = child.pid();
        let proc = self.slots.get_mut(&slot).expect("known slot");
        proc.child = Some(child);
        proc.started_at = Instant::now();
        tracing::info!(worker_id = %worker_id, slot, generation, pid, "executor started");
        Ok(())
    }

    async fn on_exit(&mut self, exit: ChildExit) {
        let status = exit.ended.describe();
        match exit.kind {
            ChildKind::Broker => {
                self.broker = None;
                self.control = None;
                self.admin = None;
                // A broker exits 0 only after a completed drain, also one an operator started
                // with Admin.Drain or one it started itself (run once: no task left).
                let clean = exit.ended.success();
                if clean && !self.draining {
                    tracing::info!(
                        "the broker finished a drain (Admin.Drain, or run once with no task left)"
                    );
                    self.set_draining();
                }
                if clean {
                    tracing::info!(pid = exit.pid, "broker finished its drain");
                    return;
                }
                let status = match self.broker_stalled.take() {
                    Some(why) => format!("{status}: {why}"),
                    None => status,
                };
                tracing::error!(pid = exit.pid, status = %status, "broker exited; stopping the runtime");
                self.broker_failed = Some(status);
                self.set_draining();
                for proc in self.slots.values_mut() {
                    if let Some(child) = proc.child {
                        // No result can be reported any more: executors stop their bodies
                        // (SIGTERM, a short grace, SIGKILL) as soon as their slot stream ends,
                        // and exit; an idle one exits on this signal.
                        child.signal(process::SIGTERM);
                        proc.killed_by = proto::ExitCause::BrokerGone;
                    }
                }
            }
            ChildKind::Executor { slot, generation } => {
                let Some(proc) = self.slots.get_mut(&slot) else {
                    return;
                };
                if proc.generation != generation {
                    return;
                }
                proc.child = None;
                let cause = std::mem::replace(&mut proc.killed_by, proto::ExitCause::Unspecified);
                let ran = proc.started_at.elapsed();
                let worker_id = proc.worker_id.clone();
                let status = if std::mem::take(&mut proc.force_killed) {
                    // The broker puts this in the FAILED reason Conductor gets.
                    format!(
                        "killed by the supervisor at the shutdown deadline, PERAGO_SHUTDOWN_FORCE_KILL_AFTER={}s after the drain started: {status}",
                        self.spec.force_kill_after.unwrap_or_default().as_secs()
                    )
                } else {
                    status
                };
                if let Some(control) = &mut self.control {
                    let report = proto::SlotExited {
                        slot,
                        generation,
                        pid: exit.pid,
                        status: status.clone(),
                        cause: cause.into(),
                        signal: exit.ended.signal(),
                        exit_code: exit.ended.exit_code(),
                    };
                    match bounded(control.slot_exited(report)).await {
                        Ok(_) => {}
                        // A broker that finished its drain has closed its socket.
                        Err(e) if self.draining => tracing::debug!(error = %e, "broker gone"),
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot tell the broker about an executor exit")
                        }
                    }
                }
                // The executor is gone, and its bodies with it (parent-death signal); whatever
                // they started was re-parented to this subreaper: kill it before its attempt
                // directories go.
                let killed = process::kill_adopted();
                if killed > 0 {
                    tracing::info!(worker_id = %worker_id, killed, "killed the processes its bodies left running");
                }
                super::gc::sweep_generation(
                    &self.spec.workspace_root,
                    slot,
                    generation,
                    self.spec.lakefs.as_ref(),
                )
                .await;
                super::gc::report_leftovers(&self.spec.workspace_root, &self.spec.socket);
                // One read of the broker's view of the slot decides what comes next.
                let seen = if self.draining {
                    None
                } else {
                    self.broker_status().await
                };
                let slot_seen = seen
                    .as_ref()
                    .and_then(|s| s.slots.iter().find(|s| s.slot == slot).cloned());
                if seen.as_ref().is_some_and(|s| s.draining) && !self.draining {
                    tracing::info!("the broker is draining (Admin.Drain): no restarts");
                    self.set_draining();
                }
                if !self.draining
                    && self.spec.capacity.adaptive()
                    && slot_seen
                        .as_ref()
                        .is_some_and(|s| s.state() == admin::SlotState::Retired)
                {
                    tracing::info!(worker_id = %worker_id, pid = exit.pid, generation, status = %status, "executor retired (scale down): its slot stays empty until the broker wants it again");
                    self.slots.get_mut(&slot).expect("checked above").restarts = 0;
                    return;
                }
                let proc = self.slots.get_mut(&slot).expect("checked above");
                if self.draining {
                    tracing::info!(worker_id = %worker_id, pid = exit.pid, generation, status = %status, "executor exited");
                    return;
                }
                // Recycled: it said so with its last completion (the broker's word, for this
                // generation) and exited with the recycling code. The exit code alone is not
                // enough: a `body.executor` binary exiting 75 on its own must not restart in a
                // tight loop.
                let broker_says_recycled = slot_seen
                    .as_ref()
                    .is_some_and(|s| s.generation == generation && s.recycling);
                if exit.ended.recycled() && broker_says_recycled {
                    // It left on purpose between assignments: no failure, no backoff.
                    proc.restart_at = Some(Instant::now());
                    tracing::info!(
                        worker_id = %worker_id, pid = exit.pid, generation, status = %status,
                        "executor recycled: restarting the slot at once"
                    );
                    return;
                }
                if ran >= BACKOFF_RESET_AFTER {
                    proc.restarts = 0;
                }
                let delay = restart_delay(proc.restarts);
                proc.restarts += 1;
                proc.restart_at = Some(Instant::now() + delay);
                tracing::warn!(
                    worker_id = %worker_id, pid = exit.pid, generation, status = %status,
                    restart_in_s = delay.as_secs(), "executor exited; slot restart scheduled"
                );
            }
        }
    }

    /// An executor generation completed an assignment: it works, so the slot's next restart
    /// starts the backoff over (an agent killing executors now and then cannot park a slot at
    /// the 30 s cap while it does useful work in between).
    fn on_completion(&mut self, kind: ChildKind) {
        if let ChildKind::Executor { slot, generation } = kind
            && let Some(proc) = self.slots.get_mut(&slot)
            && proc.generation == generation
            && proc.restarts > 0
        {
            tracing::debug!(
                slot,
                generation,
                "a replacement completed an assignment: restart backoff reset"
            );
            proc.restarts = 0;
        }
    }

    async fn start_drain(&mut self, why: &str) {
        if self.draining {
            tracing::warn!(
                "{why} during drain: ignored; the drain goes on (set PERAGO_SHUTDOWN_FORCE_KILL_AFTER to bound it)"
            );
            return;
        }
        tracing::info!("{why}: draining (no new tasks; running ones finish and are reported)");
        if let Some(notifier) = &mut self.notifier {
            notifier.stopping(why);
        }
        self.set_draining();
        if let Some(admin) = &mut self.admin
            && let Err(e) = bounded(admin.drain(admin::DrainRequest {})).await
        {
            tracing::warn!(error = %e, "cannot ask the broker to drain; stopping it with SIGTERM");
            if let Some(broker) = self.broker {
                broker.signal(process::SIGTERM);
            }
        }
    }

    /// The broker has not answered `Admin.Status` for `timeout`: it is treated as dead. A
    /// broker process is SIGKILLed (its exit then stops the runtime as any broker death does:
    /// executors told to stop, exit 1); a thread-mode broker is aborted.
    fn broker_is_stalled(&mut self, timeout: Duration) {
        let t = perago_core::liveness::describe(timeout);
        let why = format!(
            "the broker did not answer for {t} ({}={t}); killed",
            perago_core::liveness::PERAGO_STALL_TIMEOUT
        );
        let Some(broker) = self.broker else {
            return;
        };
        tracing::error!(pid = broker.pid(), "{why}");
        self.broker_stalled = Some(why);
        match broker {
            Child::Process(_) => broker.signal(process::SIGKILL),
            Child::Task => self.launcher.abort_all(),
        }
    }

    /// Kills every executor still running. The broker stays up to report their assignments
    /// FAILED (with the deadline as the reason); it is killed [`BROKER_KILL_DELAY`] later.
    async fn force_kill(&mut self, deadline: Duration) {
        let phases = self.phases().await;
        for (slot, proc) in &mut self.slots {
            if let Some(child) = proc.child {
                let phase = phases.get(slot).map_or("unknown", String::as_str);
                tracing::error!(worker_id = %proc.worker_id, pid = child.pid(), phase = %phase, deadline_s = deadline.as_secs(), "force-killing an executor still running after the shutdown deadline");
                child.signal(process::SIGKILL);
                proc.force_killed = true;
                proc.killed_by = proto::ExitCause::ShutdownDeadline;
                self.force_killed = true;
            }
        }
        self.launcher.abort_executors();
    }

    async fn phases(&mut self) -> BTreeMap<u32, String> {
        let Some(admin) = &mut self.admin else {
            return BTreeMap::new();
        };
        match tokio::time::timeout(
            Duration::from_secs(1),
            admin.status(admin::StatusRequest {}),
        )
        .await
        {
            Ok(Ok(status)) => status
                .into_inner()
                .slots
                .into_iter()
                .map(|s| {
                    let phase = if s.phase.is_empty() {
                        "idle".to_owned()
                    } else {
                        s.phase
                    };
                    (s.slot, phase)
                })
                .collect(),
            _ => BTreeMap::new(),
        }
    }

    /// The broker's status (draining, and each slot as it sees it), if it answers within 1 s.
    async fn broker_status(&mut self) -> Option<admin::StatusResponse> {
        let admin = self.admin.as_mut()?;
        match tokio::time::timeout(
            Duration::from_secs(1),
            admin.status(admin::StatusRequest {}),
        )
        .await
        {
            Ok(Ok(status)) => Some(status.into_inner()),
            _ => None,
        }
    }

    /// The slots the broker wants run (`-j MIN..MAX`) that have no executor here, none
    /// starting and no restart pending, as of `status` (a slot whose generation moved since is
    /// not one).
    fn slots_to_start(&self, status: &admin::StatusResponse) -> Vec<u32> {
        if !self.spec.capacity.adaptive() || self.draining || status.draining {
            return Vec::new();
        }
        status
            .slots
            .iter()
            .filter(|s| {
                matches!(
                    s.state(),
                    admin::SlotState::Waiting | admin::SlotState::Exited
                )
            })
            .filter(|s| {
                self.slots.get(&s.slot).is_some_and(|p| {
                    p.child.is_none() && p.restart_at.is_none() && p.generation == s.generation
                })
            })
            .map(|s| s.slot)
            .collect()
    }

    /// Scaling up: starts the executors of the slots the broker wants and no executor serves
    /// (at once: a new slot, not a restart). `seen` is the last status read; the broker is
    /// asked again before anything starts, so a slot retired since is left alone.
    async fn scale_up(&mut self, seen: &admin::StatusResponse) {
        if self.slots_to_start(seen).is_empty() {
            return;
        }
        let Some(admin) = &mut self.admin else {
            return;
        };
        let fresh = match tokio::time::timeout(
            Duration::from_secs(1),
            admin.status(admin::StatusRequest {}),
        )
        .await
        {
            Ok(Ok(status)) => status.into_inner(),
            _ => return,
        };
        for slot in self.slots_to_start(&fresh) {
            tracing::info!(slot, "scaling up: the broker wants this slot's executor");
            match self.start_executor(slot).await {
                Ok(()) => {}
                Err(e @ RuntimeError::GenerationRefused { .. }) => {
                    tracing::error!(error = %e, "the broker refused an executor generation; stopping the runtime");
                    self.start_drain("a refused generation").await;
                    self.refused.get_or_insert(e);
                    return;
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot start an executor; retrying with backoff");
                    let proc = self.slots.get_mut(&slot).expect("known slot");
                    proc.restart_at = Some(Instant::now() + restart_delay(proc.restarts));
                    proc.restarts += 1;
                }
            }
        }
    }

    fn alive_executors(&self) -> usize {
        self.slots.values().filter(|p| p.child.is_some()).count()
    }

    fn next_restart(&self) -> Option<(u32, Instant)> {
        self.slots
            .iter()
            .filter_map(|(slot, p)| p.restart_at.map(|at| (*slot, at)))
            .min_by_key(|(_, at)| *at)
    }
}

/// Reads the broker's status every [`STATUS_INTERVAL`] on its own task (a wedged broker must
/// not stall the dispatcher) and publishes the latest, for as long as the dispatcher listens:
/// through a drain too, where its freshness is the broker's liveness (`PERAGO_STALL_TIMEOUT`).
fn watch_status(
    admin: Option<AdminClient<Channel>>,
) -> tokio::sync::watch::Receiver<Option<admin::StatusResponse>> {
    let (tx, rx) = tokio::sync::watch::channel(None);
    if let Some(mut admin) = admin {
        tokio::spawn(async move {
            while !tx.is_closed() {
                tokio::time::sleep(STATUS_INTERVAL).await;
                let status =
                    tokio::time::timeout(STATUS_INTERVAL, admin.status(admin::StatusRequest {}))
                        .await;
                if let Ok(Ok(status)) = status
                    && tx.send(Some(status.into_inner())).is_err()
                {
                    return;
                }
            }
        });
    }
    rx
}

/// The error to stop with if anything already serves on `socket`: under a locked root, a
/// server there belongs to a runtime the lock does not cover (one that is not ours, whatever
/// it is), and is never talked to. Says who answers: `a broker (pid N)`, else `a process`.
pub(crate) async fn foreign_broker(socket: &std::path::Path) -> Option<RuntimeError> {
    let who = serving(socket).await?;
    Some(RuntimeError::ForeignBroker {
        socket: socket.to_owned(),
        who,
    })
}

/// Who listens on `socket`, if anyone. A listener that accepts the connection but never
/// answers (a wedged process) holds the path all the same: "a process".
async fn serving(socket: &std::path::Path) -> Option<String> {
    const ASK: Duration = Duration::from_secs(1);
    match tokio::time::timeout(ASK, tokio::net::UnixStream::connect(socket)).await {
        Ok(Ok(_)) => {}
        Ok(Err(_)) => return None,
        Err(_) => return Some("a process".to_owned()),
    }
    let status = tokio::time::timeout(ASK, async {
        let channel = perago_core::socket::connect(socket).await.ok()?;
        AdminClient::new(channel)
            .status(admin::StatusRequest {})
            .await
            .ok()
    })
    .await;
    Some(match status {
        Ok(Some(s)) => format!("a broker (pid {})", s.get_ref().broker_pid),
        _ => "a process".to_owned(),
    })
}

/// Waits until the broker this supervisor started (`broker_pid`) serves on the socket. A
/// server that answers but reports another pid is another runtime's broker: an error, never a
/// broker to talk to.
async fn wait_for_broker(
    spec: &RuntimeSpec,
    broker_pid: u32,
    exits: &mut mpsc::UnboundedReceiver<ChildExit>,
) -> Result<Channel, RuntimeError> {
    let deadline = tokio::time::Instant::now() + BROKER_START_DEADLINE;
    loop {
        if let Ok(exit) = exits.try_recv() {
            return Err(RuntimeError::BrokerDiedAtStart {
                status: exit.ended.describe(),
            });
        }
        if let Ok(channel) = perago_core::socket::connect(&spec.socket).await {
            match bounded(AdminClient::new(channel.clone()).status(admin::StatusRequest {})).await {
                Ok(status) if status.get_ref().broker_pid == broker_pid => return Ok(channel),
                Ok(status) => {
                    return Err(RuntimeError::ForeignBroker {
                        socket: spec.socket.clone(),
                        who: format!("a broker (pid {})", status.get_ref().broker_pid),
                    });
                }
                // Serving, but not ready to answer yet: try again.
                Err(_) => {}
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(RuntimeError::BrokerStart {
                socket: spec.socket.clone(),
            });
        }
        tokio::select! {
            exit = exits.recv() => {
                let status = exit.map_or_else(|| "unknown".to_owned(), |e| e.ended.describe());
                return Err(RuntimeError::BrokerDiedAtStart { status });
            }
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
}

/// Runs the runtimes of several task types side by side (one runtime each: its own broker,
/// executors, socket and root), each until its drain completes, and returns each task name
/// with its runtime's result, in order. A runtime that fails (its broker died, a generation
/// was refused, …) drains the others: a supervisor stands or falls as a whole. Signals reach
/// every runtime (each drains on SIGINT/SIGTERM).
/// `stop` drains them all (with the reason it gives).
pub(crate) async fn supervise_all(
    runs: Vec<(RuntimeSpec, Launcher)>,
    stop: impl Future<Output = String>,
) -> Vec<(String, Result<(), RuntimeError>)> {
    // The first reason to stop them all; every runtime drains when it is set.
    let (stop_tx, _) = tokio::sync::watch::channel(None::<String>);
    let stop_all = |why: String| {
        stop_tx
            .send_if_modified(|current| current.is_none().then(|| *current = Some(why)).is_some());
    };
    let mut stop = std::pin::pin!(stop);
    let mut stop_fired = false;
    let mut running = tokio::task::JoinSet::new();
    let mut index_of = BTreeMap::new();
    let names: Vec<String> = runs
        .iter()
        .map(|(spec, _)| spec.task_name.clone())
        .collect();
    for (index, (spec, launcher)) in runs.into_iter().enumerate() {
        let mut stop_rx = stop_tx.subscribe();
        let stop = async move {
            let why = stop_rx
                .wait_for(Option::is_some)
                .await
                .map(|why| why.clone().unwrap_or_default());
            match why {
                Ok(why) => why,
                // Never: the sender outlives every runtime.
                Err(_) => std::future::pending().await,
            }
        };
        let task = running.spawn(supervise(spec, launcher, stop));
        index_of.insert(task.id(), index);
    }
    let mut results: Vec<Option<Result<(), RuntimeError>>> = names.iter().map(|_| None).collect();
    loop {
        tokio::select! {
            joined = running.join_next_with_id() => {
                let (id, result) = match joined {
                    None => break,
                    Some(Ok((id, result))) => (id, result),
                    Some(Err(e)) => (e.id(), Err(RuntimeError::Panicked { cause: e.to_string() })),
                };
                let index = index_of[&id];
                if let Err(e) = &result
                    && !matches!(e, RuntimeError::ForceKilled { .. })
                {
                    stop_all(format!("the runtime of task {} stopped ({e})", names[index]));
                }
                results[index] = Some(result);
            }
            why = &mut stop, if !stop_fired => {
                stop_fired = true;
                stop_all(why);
            }
        }
    }
    names
        .into_iter()
        .zip(results)
        .map(|(name, result)| (name, result.expect("every runtime's task was joined")))
        .collect()
}

/// Runs the runtime until a drain completes (Ok) or the broker dies (Err). A drain starts on
/// SIGINT/SIGTERM or when `stop` resolves (with the reason to log).
pub(crate) async fn supervise(
    mut spec: RuntimeSpec,
    launcher: Launcher,
    stop: impl Future<Output = String>,
) -> Result<(), RuntimeError> {
    let mut stop = std::pin::pin!(stop);
    let mut stop_fired = false;
    let (exits_tx, mut exits) = mpsc::unbounded_channel();
    let (completions_tx, mut completions) = mpsc::unbounded_channel();
    // What bodies start and leave behind is re-parented here when their executor dies (or, in
    // thread mode, when the body exits), so it can be killed.
    if let Err(e) = process::become_subreaper() {
        tracing::warn!(error = %e, "cannot become a child subreaper: processes a body detaches may outlive it");
    }
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");

    let control_token = secret();
    let broker_env = broker_env(&spec, &control_token, std::process::id());
    let slots = (1..=spec.capacity.max_executors)
        .map(|n| {
            let worker_id = spec
                .prefix
                .worker_id(SlotNumber::new(u64::from(n)).expect("1..=N"));
            (
                n,
                SlotProc {
                    worker_id,
                    generation: 0,
                    announcing: None,
                    child: None,
                    started_at: Instant::now(),
                    restarts: 0,
                    restart_at: None,
                    force_killed: false,
                    killed_by: proto::ExitCause::Unspecified,
                },
            )
        })
        .collect();
    let notifier = spec.notify.take();
    let mut sup = Supervisor {
        spec,
        launcher,
        exits: exits_tx,
        completions: completions_tx,
        slots,
        broker: None,
        control: None,
        admin: None,
        draining: false,
        broker_failed: None,
        refused: None,
        force_kill_at: None,
        force_killed: false,
        notifier,
        broker_stalled: None,
    };
    if let Some(foreign) = foreign_broker(&sup.spec.socket).await {
        return Err(foreign);
    }
    let broker = sup
        .launcher
        .broker(
            &sup.spec.process_label.as_ref().map_or_else(
                || "perago-conductor-broker".to_owned(),
                |l| format!("perago-conductor-broker@{l}"),
            ),
            &broker_env,
            &sup.exits,
        )
        .map_err(|source| RuntimeError::Spawn {
            what: "the broker".to_owned(),
            source,
        })?;
    sup.broker = Some(broker);
    tracing::info!(pid = broker.pid(), "broker started");
    // A thread-mode broker runs in this process.
    let broker_pid = match broker {
        Child::Process(pid) => pid,
        Child::Task => std::process::id(),
    };
    let channel = match wait_for_broker(&sup.spec, broker_pid, &mut exits).await {
        Ok(c) => c,
        Err(e) => {
            broker.signal(process::SIGKILL);
            sup.launcher.abort_all();
            return Err(e);
        }
    };
    let token = control_token
        .parse()
        .expect("a hex token is valid metadata");
    sup.control = Some(ControlClient::with_interceptor(
        channel.clone(),
        TokenInterceptor(token),
    ));
    sup.admin = Some(AdminClient::new(channel));

    // An adaptive runtime starts its minimum; the slots above it start when the queue has a
    // backlog.
    let slot_numbers: Vec<u32> = (1..=sup.spec.capacity.min_executors).collect();
    for slot in slot_numbers {
        if let Err(e) = sup.start_executor(slot).await {
            tracing::error!(error = %e, "cannot start an executor; stopping");
            sup.start_drain("start-up failure").await;
            if matches!(e, RuntimeError::GenerationRefused { .. }) {
                sup.refused.get_or_insert(e);
            } else {
                sup.broker_failed.get_or_insert_with(|| e.to_string());
            }
            break;
        }
    }

    // How the supervisor learns of a drain started over Admin.Drain while executors are busy,
    // and of the slots an adaptive runtime wants.
    let mut status_seen = watch_status(sup.admin.clone());
    let mut gc_timer = tokio::time::interval_at(
        tokio::time::Instant::now() + sup.spec.gc_interval,
        sup.spec.gc_interval,
    );
    let mut broker_kill_at: Option<tokio::time::Instant> = None;
    // systemd: readiness is checked often until the starting executors are attached; the
    // watchdog is pinged while the broker's status keeps coming (a wedged broker stops it).
    let mut ready_check = tokio::time::interval(READY_CHECK_INTERVAL);
    let watchdog_every = sup
        .notifier
        .as_ref()
        .and_then(NotifyHandle::watchdog_interval)
        .unwrap_or(Duration::from_secs(3600));
    let mut watchdog = tokio::time::interval(watchdog_every);
    let mut status_at = Instant::now();
    // Broker liveness: its status must keep coming (every STATUS_INTERVAL, through a drain
    // too); silent for PERAGO_STALL_TIMEOUT, it is stopped or wedged, and killed.
    let mut stall_check = tokio::time::interval(
        sup.spec
            .stall_timeout
            .map_or(Duration::from_secs(3600), |t| {
                perago_core::liveness::ping_interval(t).min(STATUS_INTERVAL)
            }),
    );
    loop {
        if sup.broker.is_none() && sup.alive_executors() == 0 {
            break;
        }
        let restart = sup.next_restart();
        let far = tokio::time::Instant::now() + Duration::from_secs(3600);
        tokio::select! {
            // Exits first: a burst of signals must not starve reaping.
            biased;
            Some(exit) = exits.recv() => sup.on_exit(exit).await,
            Some(kind) = completions.recv() => sup.on_completion(kind),
            _ = term.recv() => sup.start_drain("SIGTERM").await,
            _ = int.recv() => sup.start_drain("SIGINT").await,
            Ok(()) = status_seen.changed() => {
                let seen = status_seen.borrow_and_update().clone();
                status_at = Instant::now();
                if let Some(seen) = seen {
                    // A drain's STATUS= (STOPPING=1) stays: the status keeps coming through a
                    // drain only for the broker's liveness.
                    if let Some(notifier) = &mut sup.notifier
                        && notifier.is_ready()
                        && !sup.draining
                    {
                        notifier.status(notify::status_text(&seen));
                    }
                    if seen.draining {
                        if !sup.draining {
                            tracing::info!("the broker is draining (Admin.Drain or run once): no restarts");
                            sup.set_draining();
                        }
                    } else {
                        sup.scale_up(&seen).await;
                    }
                }
            }
            _ = ready_check.tick(), if sup.notifier.as_ref().is_some_and(|n| !n.is_ready()) && !sup.draining => {
                let wanted = sup.spec.capacity.min_executors;
                if let Some(status) = sup.broker_status().await
                    && notify::all_attached(&status, wanted)
                    && let Some(notifier) = &mut sup.notifier
                {
                    tracing::info!("every executor attached: telling systemd the service is ready");
                    notifier.ready(notify::status_text(&status));
                }
            }
            _ = watchdog.tick(), if sup.notifier.as_ref().is_some_and(|n| n.watchdog_interval().is_some()) => {
                // Fresh status, or a drain (the status watch ends there): the runtime is alive.
                if (sup.draining || status_at.elapsed() < watchdog_every.max(STATUS_INTERVAL * 3))
                    && let Some(notifier) = &sup.notifier
                {
                    notifier.ping();
                }
            }
            _ = stall_check.tick(), if sup.spec.stall_timeout.is_some() && sup.broker.is_some() && sup.broker_stalled.is_none() => {
                let timeout = sup.spec.stall_timeout.expect("guarded");
                if status_at.elapsed() >= timeout {
                    sup.broker_is_stalled(timeout);
                }
            }
            _ = gc_timer.tick() => {
                let current: BTreeMap<u32, u64> =
                    sup.slots.iter().map(|(n, p)| (*n, p.generation)).collect();
                super::gc::sweep_expired(&sup.spec.workspace_root, sup.spec.gc_ttl, |slot, generation| {
                    current.get(&slot) == Some(&generation)
                }, sup.spec.lakefs.as_ref()).await;
                super::gc::report_leftovers(&sup.spec.workspace_root, &sup.spec.socket);
            }
            why = &mut stop, if !stop_fired => {
                stop_fired = true;
                sup.start_drain(&why).await;
            }
            () = sleep_until(restart.map_or(far, |(_, at)| at.into())), if restart.is_some() => {
                let (slot, _) = restart.expect("guarded");
                tracing::info!(slot, "restarting the slot");
                match sup.start_executor(slot).await {
                    Ok(()) => {}
                    Err(e @ RuntimeError::GenerationRefused { .. }) => {
                        tracing::error!(error = %e, "the broker refused an executor generation; stopping the runtime");
                        sup.start_drain("a refused generation").await;
                        sup.refused.get_or_insert(e);
                    }
                    Err(e) => {
                    tracing::error!(error = %e, "cannot restart an executor; retrying with backoff");
                    let proc = sup.slots.get_mut(&slot).expect("known slot");
                    proc.restart_at = Some(Instant::now() + restart_delay(proc.restarts));
                    proc.restarts += 1;
                    }
                }
            }
            () = sleep_until(sup.force_kill_at.unwrap_or(far)), if sup.force_kill_at.is_some() => {
                sup.force_kill_at = None;
                let after = sup.spec.force_kill_after.unwrap_or_default();
                sup.force_kill(after).await;
                broker_kill_at = Some(tokio::time::Instant::now() + BROKER_KILL_DELAY);
            }
            () = sleep_until(broker_kill_at.unwrap_or(far)), if broker_kill_at.is_some() => {
                broker_kill_at = None;
                if let Some(broker) = sup.broker {
                    tracing::error!(pid = broker.pid(), "force-killing the broker after the shutdown deadline");
                    broker.signal(process::SIGKILL);
                }
                sup.launcher.abort_all();
            }
        }
    }
    // Bodies of executors that died last may have left processes to this subreaper.
    process::kill_adopted();
    if let Some(refused) = sup.refused {
        return Err(refused);
    }
    match (sup.broker_failed, sup.force_killed) {
        (Some(status), _) => Err(RuntimeError::BrokerDied { status }),
        (None, true) => Err(RuntimeError::ForceKilled {
            deadline: sup.spec.force_kill_after.unwrap_or_default(),
        }),
        (None, false) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The environment the supervisor writes is what each child reads back: the names are
    /// shared constants, and every value arrives as set.
    #[test]
    fn each_child_reads_back_the_environment_the_supervisor_writes() {
        let mut capacity = perago_core::capacity::Capacity::fixed(3);
        capacity.min_executors = 2;
        let spec = RuntimeSpec {
            task_name: "orders.ship".into(),
            manifest_path: "/etc/perago/task.toml".into(),
            capacity: capacity.clone(),
            prefix: WorkerPrefix::explicit("host7").unwrap(),
            conductor_url: "http://conductor:8080/api".into(),
            socket: "/run/perago/broker.sock".into(),
            force_kill_after: None,
            log_root: "/var/log/perago".into(),
            workspace_root: "/var/lib/perago".into(),
            gc_interval: Duration::from_secs(300),
            gc_ttl: Duration::from_secs(3600),
            child_env: vec![(env::PERAGO_POLL_WAIT_MS.to_owned(), "250".to_owned())],
            lakefs: None,
            notify: None,
            process_label: None,
            stall_timeout: Some(Duration::from_secs(5)),
        };
        let lookup = |vars: Vec<(String, String)>| {
            move |name: &str| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        };
        let broker = perago_broker::cli::config_from(lookup(broker_env(&spec, "c0ffee", 4242)))
            .expect("the broker takes its environment");
        assert_eq!(broker.task_name, "orders.ship");
        assert_eq!(broker.prefix.as_str(), "host7");
        assert_eq!(broker.conductor.base_url(), "http://conductor:8080/api");
        assert_eq!(broker.socket, spec.socket);
        assert_eq!(broker.control_token, "c0ffee");
        assert_eq!(broker.control_pid, 4242);
        assert_eq!(broker.poll_wait, Duration::from_millis(250));
        assert_eq!(broker.capacity, capacity);
        assert_eq!(broker.stall_timeout, Some(Duration::from_secs(5)));

        let vars = executor_env(&spec, "host70002", 2, 9, "t0k3n".into());
        let (identity, manifest) = perago_executor::cli::identity_from(lookup(vars.clone()))
            .expect("the executor takes its environment");
        assert_eq!(identity.worker_id, "host70002");
        assert_eq!((identity.slot, identity.generation), (2, 9));
        assert_eq!(identity.token, "t0k3n");
        assert_eq!(identity.socket, spec.socket);
        assert_eq!(manifest, spec.manifest_path);
        let value = |name: &str| lookup(vars.clone())(name);
        assert_eq!(
            value(env::PERAGO_LOG_ROOT).as_deref(),
            Some("/var/log/perago")
        );
        assert_eq!(
            value(env::PERAGO_WORKSPACE_ROOT).as_deref(),
            Some("/var/lib/perago")
        );
    }

    #[tokio::test]
    async fn a_socket_anyone_listens_on_is_foreign() {
        let tmp = tempfile::tempdir().unwrap();
        let socket = tmp.path().join("broker.sock");
        assert!(foreign_broker(&socket).await.is_none(), "no file");
        // A listener that never accepts nor answers still holds the path.
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let err = foreign_broker(&socket).await.expect("held").to_string();
        assert_eq!(
            err,
            format!(
                "another runtime is running under this workspace root: a process already answers on {}; this supervisor did not start it and will not use it (stop that runtime first)",
                socket.display()
            )
        );
        // A stale file nobody listens on is the broker's to clean up, not a foreign runtime.
        drop(listener);
        assert!(socket.exists());
        assert!(foreign_broker(&socket).await.is_none(), "stale file");
    }

    /// A scripted broker `Control`: answers each `SlotStarted` with the next code, and keeps
    /// what it was told.
    #[derive(Debug, Clone, Default)]
    struct ScriptedControl {
        answers: std::sync::Arc<std::sync::Mutex<Vec<tonic::Code>>>,
        seen: std::sync::Arc<std::sync::Mutex<Vec<(u64, String)>>>,
    }

    #[tonic::async_trait]
    impl proto::control_server::Control for ScriptedControl {
        async fn slot_started(
            &self,
            request: tonic::Request<proto::SlotStarted>,
        ) -> Result<tonic::Response<proto::ControlAck>, tonic::Status> {
            let started = request.into_inner();
            self.seen
                .lock()
                .unwrap()
                .push((started.generation, started.token));
            match self.answers.lock().unwrap().remove(0) {
                tonic::Code::Ok => Ok(tonic::Response::new(proto::ControlAck {})),
                code => Err(tonic::Status::new(code, "scripted")),
            }
        }

        async fn slot_exited(
            &self,
            _request: tonic::Request<proto::SlotExited>,
        ) -> Result<tonic::Response<proto::ControlAck>, tonic::Status> {
            Ok(tonic::Response::new(proto::ControlAck {}))
        }
    }

    /// A lost answer is retried with the same generation and token (the broker takes that
    /// repeat); a refusal is final and names the slot and generation; the slot's generation
    /// moves only when the broker took one.
    #[tokio::test]
    async fn announcements_are_repeated_when_lost_and_final_when_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let socket = tmp.path().join("broker.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let fake = ScriptedControl::default();
        fake.answers.lock().unwrap().extend([
            tonic::Code::Unavailable,
            tonic::Code::Ok,
            tonic::Code::FailedPrecondition,
        ]);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(proto::control_server::ControlServer::new(fake.clone()))
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
        );
        let channel = perago_core::socket::connect(&socket).await.unwrap();
        let mut control =
            ControlClient::with_interceptor(channel, TokenInterceptor("t".parse().unwrap()));
        let mut proc = SlotProc {
            worker_id: "w0001".into(),
            generation: 0,
            announcing: None,
            child: None,
            started_at: Instant::now(),
            restarts: 0,
            restart_at: None,
            force_killed: false,
            killed_by: proto::ExitCause::Unspecified,
        };

        let lost = announce(Some(&mut control), 1, &mut proc)
            .await
            .unwrap_err();
        assert!(matches!(lost, RuntimeError::Control(_)), "{lost}");
        assert_eq!(proc.generation, 0);
        let (generation, token) = announce(Some(&mut control), 1, &mut proc).await.unwrap();
        assert_eq!((generation, proc.generation), (1, 1));
        assert_eq!(
            fake.seen.lock().unwrap().clone(),
            [(1, token.clone()), (1, token.clone())]
        );

        let refused = announce(Some(&mut control), 1, &mut proc)
            .await
            .unwrap_err();
        assert!(
            matches!(
                refused,
                RuntimeError::GenerationRefused {
                    slot: 1,
                    generation: 2,
                    ..
                }
            ),
            "{refused}"
        );
        assert!(
            refused
                .to_string()
                .starts_with("the broker refused generation 2 of slot 1 (scripted)"),
            "{refused}"
        );
        assert_eq!(proc.generation, 1);
        let seen = fake.seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 3);
        assert_eq!(seen[2].0, 2);
        assert_ne!(seen[2].1, token, "a new generation has a new token");
    }

    #[test]
    fn restart_backoff_steps() {
        let delays: Vec<u64> = (0..9).map(|n| restart_delay(n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30, 30, 30]);
        assert_eq!(restart_delay(u32::MAX).as_secs(), 30);
    }
}
