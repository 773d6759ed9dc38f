//! The actor of one runtime: it starts the broker, then owns the [`Machine`] and runs one
//! `select!` over its input sources (child exits first, completion bytes, signals, the broker's
//! state, the results of effects, the `stop` future and the machine's next wake-up). Each arm
//! only turns what it got into an [`Input`]; the effects the machine returns are performed
//! here without waiting: RPCs run as spawned tasks that send their result back as an input,
//! exit handling and the GC run in order on one cleanup worker. Spawning stays on this task
//! (children are spawned from the supervisor's main thread: their parent-death signal fires
//! only when the supervisor itself dies).

use super::{
    body::{self, Bodies, Snapshot},
    child_env::{broker_env, executor_env},
    children::{ChildExit, ChildKind, Launcher, ReadyPipe},
    machine::{self, AnnounceError, Effect, Input, Machine, Notice},
    notify::NotifyHandle,
    supervise::{BROKER_START_DEADLINE, RuntimeSpec},
};
use crate::errors::RuntimeError;
use perago_core::identity::Slot as SlotNumber;
use perago_proto::{
    CONTROL_TOKEN_METADATA,
    admin::v1::{self as admin, admin_client::AdminClient},
    slot::v1::{self as proto, control_client::ControlClient},
};
use perago_sys::{reaper, signal as sys_signal};
use std::{
    collections::{BTreeMap, VecDeque},
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::mpsc,
};
use tonic::{service::Interceptor, transport::Channel};
use tracing::Instrument as _;

/// Every call to the broker is bounded: a wedged broker must not wedge the runtime.
const CONTROL_CALL_DEADLINE: Duration = Duration::from_secs(5);
/// An `Admin.Status` read.
const STATUS_DEADLINE: Duration = Duration::from_secs(1);

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

#[derive(Debug, Clone)]
pub(crate) struct TokenInterceptor(
    pub(crate) tonic::metadata::MetadataValue<tonic::metadata::Ascii>,
);

impl Interceptor for TokenInterceptor {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut()
            .insert(CONTROL_TOKEN_METADATA, self.0.clone());
        Ok(req)
    }
}

pub(crate) type Control =
    ControlClient<tonic::service::interceptor::InterceptedService<Channel, TokenInterceptor>>;

/// A fresh secret: the control token, each generation's slot token.
pub(crate) fn secret() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// Tells the broker about a slot's generation before its process exists (`Control.SlotStarted`,
/// bounded). A refusal (`FAILED_PRECONDITION`, `NOT_FOUND`) is final; anything else is lost,
/// and the machine repeats the same announcement.
pub(crate) async fn announce(
    control: Option<&mut Control>,
    slot: u32,
    generation: u64,
    token: String,
    body_version: u32,
) -> Result<(), AnnounceError> {
    let Some(control) = control else {
        return Ok(());
    };
    let answer = bounded(control.slot_started(proto::SlotStarted {
        slot,
        generation,
        token,
        pid: 0,
        body_version,
    }))
    .await;
    match answer {
        Ok(_) => Ok(()),
        Err(status)
            if matches!(
                status.code(),
                tonic::Code::FailedPrecondition | tonic::Code::NotFound
            ) =>
        {
            Err(AnnounceError::Refused(status.message().to_owned()))
        }
        Err(status) => Err(AnnounceError::Lost(status)),
    }
}

/// The broker's status, if it answers within [`STATUS_DEADLINE`].
async fn read_status(admin: Option<AdminClient<Channel>>) -> Option<admin::StatusResponse> {
    let mut admin = admin?;
    match tokio::time::timeout(STATUS_DEADLINE, admin.status(admin::StatusRequest {})).await {
        Ok(Ok(status)) => Some(status.into_inner()),
        _ => None,
    }
}

/// Follows the broker's `Admin.Watch` stream on its own task (heartbeat
/// [`machine::STATUS_INTERVAL`]) and publishes the latest state (states that come faster than
/// the actor takes them are merged), through a drain too, where the stream's messages are the
/// broker's liveness (`PERAGO_STALL_TIMEOUT`: a wedged broker sends nothing). A clean end (the
/// broker drained) is [`Input::BrokerDrained`]; a broken stream is followed again after a
/// heartbeat. The actor aborts the task when the broker exits.
fn watch_status(
    mut admin: AdminClient<Channel>,
    inputs: mpsc::UnboundedSender<Input>,
) -> (
    tokio::sync::watch::Receiver<Option<admin::StatusResponse>>,
    tokio::task::JoinHandle<()>,
) {
    let (tx, rx) = tokio::sync::watch::channel(None);
    let request = admin::WatchRequest {
        heartbeat_ms: u32::try_from(machine::STATUS_INTERVAL.as_millis()).unwrap_or(1000),
    };
    let task = tokio::spawn(
        async move {
            while !tx.is_closed() {
                if let Ok(stream) = admin.watch(request).await {
                    let mut stream = stream.into_inner();
                    loop {
                        match stream.message().await {
                            Ok(Some(status)) => {
                                if tx.send(Some(status)).is_err() {
                                    return;
                                }
                            }
                            Ok(None) => {
                                let _ = inputs.send(Input::BrokerDrained);
                                return;
                            }
                            Err(e) => {
                                tracing::debug!(error = %perago_core::errors::DisplayChain(&e), "the broker's state stream broke; following it again");
                                break;
                            }
                        }
                    }
                }
                tokio::time::sleep(machine::STATUS_INTERVAL).await;
            }
        }
        .in_current_span(),
    );
    (rx, task)
}

/// Work for the cleanup worker, done in the order it was asked for.
enum Cleanup {
    Exit(Box<ExitCleanup>),
    Expired,
}

/// An executor's exit to handle (see [`handle_exit`]).
struct ExitCleanup {
    report: proto::SlotExited,
    worker_id: String,
    /// The broker to report to (`None`: not told).
    control: Option<Control>,
    draining: bool,
}

/// What the cleanup worker works on.
struct CleanupRoot {
    workspace_root: PathBuf,
    socket: PathBuf,
    gc_ttl: Duration,
    lakefs: Option<perago_core::lakefs::LakefsClient>,
    /// Each slot's current generation, as the machine has it now.
    generations: tokio::sync::watch::Receiver<BTreeMap<u32, u64>>,
}

/// Exit handling and the GC, one request at a time (the sweeps of one root never run
/// concurrently), each answered on `inputs`.
async fn cleanup_worker(
    root: CleanupRoot,
    mut requests: mpsc::UnboundedReceiver<Cleanup>,
    inputs: mpsc::UnboundedSender<Input>,
) {
    while let Some(request) = requests.recv().await {
        let answer = match request {
            Cleanup::Exit(exit) => handle_exit(&root, *exit).await,
            Cleanup::Expired => {
                let current = root.generations.borrow().clone();
                super::gc::sweep_expired(
                    &root.workspace_root,
                    root.gc_ttl,
                    |slot, generation| current.get(&slot) == Some(&generation),
                    root.lakefs.as_ref(),
                )
                .await;
                super::gc::report_leftovers(&root.workspace_root, &root.socket);
                Input::GcDone
            }
        };
        let _ = inputs.send(answer);
    }
}

/// An executor's exit, in order: report it to the broker, kill what its bodies left to this
/// subreaper, sweep its attempts, then read the broker's view of the slot.
async fn handle_exit(root: &CleanupRoot, exit: ExitCleanup) -> Input {
    let ExitCleanup {
        report,
        worker_id,
        control,
        draining,
    } = exit;
    let (slot, generation) = (report.slot, report.generation);
    let mut seen = None;
    if let Some(mut control) = control {
        match bounded(control.slot_exited(report)).await {
            Ok(ack) => seen = Some(machine::SlotView::from(ack.into_inner())),
            // A broker that finished its drain has closed its socket.
            Err(e) if draining => {
                tracing::debug!(error = %perago_core::errors::DisplayChain(&e), "broker gone")
            }
            Err(e) => {
                tracing::warn!(error = %perago_core::errors::DisplayChain(&e), "cannot tell the broker about an executor exit");
            }
        }
    }
    // The executor is gone, and its bodies with it (parent-death signal); whatever they
    // started was re-parented to this subreaper: kill it before its attempt directories go.
    let killed = tokio::task::spawn_blocking(reaper::kill_adopted)
        .await
        .unwrap_or(0);
    if killed > 0 {
        tracing::info!(worker_id = %worker_id, killed, "killed the processes its bodies left running");
    }
    super::gc::sweep_generation(&root.workspace_root, slot, generation, root.lakefs.as_ref()).await;
    super::gc::report_leftovers(&root.workspace_root, &root.socket);
    Input::ExitHandled {
        slot,
        generation,
        seen,
    }
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

/// Waits until the broker this supervisor started (`broker_pid`) says it serves on the
/// socket (its ready pipe), then connects once. A server that answers but reports another pid
/// is another runtime's broker: an error, never a broker to talk to.
async fn wait_for_broker(
    spec: &RuntimeSpec,
    broker_pid: u32,
    ready: ReadyPipe,
    exits: &mut mpsc::UnboundedReceiver<ChildExit>,
) -> Result<Channel, RuntimeError> {
    let deadline = tokio::time::Instant::now() + BROKER_START_DEADLINE;
    if wait_ready(ready, exits, deadline, &spec.socket).await?
        && let Ok(channel) = perago_core::socket::connect(&spec.socket).await
    {
        match bounded(AdminClient::new(channel.clone()).status(admin::StatusRequest {})).await {
            Ok(status) if status.get_ref().broker_pid == broker_pid => return Ok(channel),
            Ok(status) => {
                return Err(RuntimeError::ForeignBroker {
                    socket: spec.socket.clone(),
                    who: format!("a broker (pid {})", status.get_ref().broker_pid),
                });
            }
            Err(_) => {}
        }
    }
    // Said it serves but does not answer, or closed its pipe unready: its exit follows.
    Err(exit_or_deadline(exits, deadline, &spec.socket).await)
}

/// Waits for the broker's ready byte on `ready`, racing its exit and `deadline`: `Ok(true)`
/// once it says it serves, `Ok(false)` at end of file without the byte (it closed its end or
/// died: its exit follows), else the error to stop with. The read is the runtime's, never a
/// blocking one.
pub(super) async fn wait_ready(
    mut ready: ReadyPipe,
    exits: &mut mpsc::UnboundedReceiver<ChildExit>,
    deadline: tokio::time::Instant,
    socket: &std::path::Path,
) -> Result<bool, RuntimeError> {
    use tokio::io::AsyncReadExt as _;
    let mut byte = [0u8; 1];
    tokio::select! {
        read = ready.read(&mut byte) => Ok(matches!(read, Ok(n) if n > 0)),
        exit = exits.recv() => Err(died_at_start(exit)),
        () = tokio::time::sleep_until(deadline) => Err(RuntimeError::BrokerStart {
            socket: socket.to_owned(),
        }),
    }
}

/// The error once the broker cannot be ready: its exit, or the deadline if it lives on.
pub(super) async fn exit_or_deadline(
    exits: &mut mpsc::UnboundedReceiver<ChildExit>,
    deadline: tokio::time::Instant,
    socket: &std::path::Path,
) -> RuntimeError {
    tokio::select! {
        exit = exits.recv() => died_at_start(exit),
        () = tokio::time::sleep_until(deadline) => RuntimeError::BrokerStart {
            socket: socket.to_owned(),
        },
    }
}

fn died_at_start(exit: Option<ChildExit>) -> RuntimeError {
    RuntimeError::BrokerDiedAtStart {
        status: exit.map_or_else(|| "unknown".to_owned(), |e| e.ended.describe()),
    }
}

/// The actor's side of one runtime: what performs the machine's effects.
struct Actor {
    spec: RuntimeSpec,
    launcher: Launcher,
    machine: Machine,
    exits: mpsc::UnboundedSender<ChildExit>,
    completions: mpsc::UnboundedSender<ChildKind>,
    /// Results of effects, back as inputs.
    inputs: mpsc::UnboundedSender<Input>,
    cleanup: mpsc::UnboundedSender<Cleanup>,
    /// Each slot's current generation, for the GC.
    generations: tokio::sync::watch::Sender<BTreeMap<u32, u64>>,
    /// The task following the broker's state, while the broker lives.
    watcher: Option<tokio::task::JoinHandle<()>>,
    /// The broker's clients, while it lives.
    control: Option<Control>,
    admin: Option<AdminClient<Channel>>,
    notifier: Option<NotifyHandle>,
    /// The body versions taken so far (version 1: the manifest checked at start).
    bodies: Bodies,
}

impl Actor {
    /// Hands `input` to the machine and performs what it says, and so on for the inputs
    /// performing gives at once (a spawn's result).
    fn feed(&mut self, input: Input) {
        let mut queue = VecDeque::from([input]);
        while let Some(input) = queue.pop_front() {
            for effect in self.machine.handle(input, Instant::now()) {
                if let Some(next) = self.perform(effect) {
                    queue.push_back(next);
                }
            }
        }
        let now = self.machine.generations();
        self.generations.send_if_modified(|current| {
            let changed = *current != now;
            *current = now;
            changed
        });
    }

    fn on_exit(&mut self, exit: ChildExit) {
        if exit.kind == ChildKind::Broker {
            self.control = None;
            self.admin = None;
            if let Some(watcher) = self.watcher.take() {
                watcher.abort();
            }
        }
        self.feed(Input::Exited(exit));
    }

    /// Rolls `next` in as the next body version if its body differs from the newest one's:
    /// `Ok(Some(version))` once it rolls, `Ok(None)` if its body is the same; an error (every
    /// problem) if it changes what cannot roll (the TaskDef, the workspace), if this runtime
    /// cannot run it (thread mode and an executor binary), or if it cannot be stored. What a
    /// reload (`perago-supervisor reload`, SIGHUP) asks through [`RuntimeSpec::rolls`].
    pub(crate) fn roll(&mut self, next: Snapshot) -> Result<Option<u32>, Vec<String>> {
        let current = Arc::clone(self.bodies.current_manifest());
        let fields = match body::compare(&current, &next.manifest)? {
            body::Change::Same => {
                tracing::info!("the manifest's body is unchanged: nothing rolls");
                return Ok(None);
            }
            body::Change::Body(fields) => fields,
        };
        if matches!(self.launcher, Launcher::Thread { .. })
            && let perago_core::manifest::BodyKind::Executor(path) = &next.manifest.body.kind
        {
            return Err(vec![
                crate::errors::ThreadModeError::ExecutorBinary { path: path.clone() }.to_string(),
            ]);
        }
        let version = self.bodies.add(next.manifest).map_err(|e| {
            vec![format!(
                "cannot store the new body version: {}",
                perago_core::errors::DisplayChain(&e)
            )]
        })?;
        tracing::info!(body_version = version, changed = %fields.join(", "), "a new body version");
        self.feed(Input::Roll {
            body_version: version,
        });
        Ok(Some(version))
    }

    /// Performs `effect`; returns its result when it is there at once.
    fn perform(&mut self, effect: Effect) -> Option<Input> {
        match effect {
            Effect::Announce {
                slot,
                generation,
                token,
                body_version,
            } => {
                let mut control = self.control.clone();
                let inputs = self.inputs.clone();
                tokio::spawn(
                    async move {
                        let result =
                            announce(control.as_mut(), slot, generation, token, body_version).await;
                        let _ = inputs.send(Input::Announced {
                            slot,
                            generation,
                            result,
                        });
                    }
                    .in_current_span(),
                );
            }
            Effect::Spawn {
                slot,
                generation,
                token,
                worker_id,
                body_version,
            } => {
                let mut env = executor_env(&self.spec, &worker_id, slot, generation, token);
                let (body, file) = self
                    .bodies
                    .get(body_version)
                    .expect("the machine announces only versions taken");
                env.push((
                    perago_core::env::PERAGO_BODY_VERSION.to_owned(),
                    body_version.to_string(),
                ));
                if let Some(file) = file {
                    env.push((
                        perago_core::env::PERAGO_BODY.to_owned(),
                        file.display().to_string(),
                    ));
                }
                let mut argv0 = format!(
                    "perago-executor-{}",
                    SlotNumber::new(u64::from(slot)).expect("slot in range")
                );
                if let Some(label) = &self.spec.process_label {
                    argv0 = format!("{argv0}@{label}");
                }
                let result = self.launcher.executor(
                    &argv0,
                    ChildKind::Executor { slot, generation },
                    &body,
                    &env,
                    &self.exits,
                    &self.completions,
                );
                return Some(Input::Spawned {
                    slot,
                    generation,
                    result,
                });
            }
            Effect::Roll { body_version } => {
                if let Some(mut control) = self.control.clone() {
                    tokio::spawn(
                        async move {
                            let call = control.roll_body(proto::RollBody { body_version });
                            if let Err(e) = bounded(call).await {
                                tracing::warn!(error = %perago_core::errors::DisplayChain(&e), body_version, "cannot tell the broker of the new body version; asking again at its next state");
                            }
                        }
                        .in_current_span(),
                    );
                }
            }
            Effect::Signal { child, signal } => child.signal(signal),
            Effect::AbortExecutors => self.launcher.abort_executors(),
            Effect::AbortAll => self.launcher.abort_all(),
            Effect::Drain => {
                if let Some(mut admin) = self.admin.clone() {
                    let inputs = self.inputs.clone();
                    tokio::spawn(
                        async move {
                            if let Err(e) = bounded(admin.drain(admin::DrainRequest {})).await {
                                let _ = inputs.send(Input::DrainFailed(e));
                            }
                        }
                        .in_current_span(),
                    );
                }
            }
            Effect::HandleExit {
                report,
                worker_id,
                tell_broker,
                draining,
            } => {
                let request = Cleanup::Exit(Box::new(ExitCleanup {
                    report,
                    worker_id,
                    control: self.control.clone().filter(|_| tell_broker),
                    draining,
                }));
                let _ = self.cleanup.send(request);
            }
            Effect::SweepExpired => {
                let _ = self.cleanup.send(Cleanup::Expired);
            }
            Effect::ReadPhases => {
                let Some(admin) = self.admin.clone() else {
                    return Some(Input::PhasesRead(None));
                };
                let inputs = self.inputs.clone();
                tokio::spawn(
                    async move {
                        let status = read_status(Some(admin)).await;
                        let _ = inputs.send(Input::PhasesRead(status));
                    }
                    .in_current_span(),
                );
            }
            Effect::Notify(notice) => {
                if let Some(notifier) = &self.notifier {
                    match notice {
                        Notice::Ready(status) => notifier.ready(status),
                        Notice::Status(status) => notifier.status(status),
                        Notice::Stopping(why) => notifier.stopping(&why),
                        Notice::Ping => notifier.ping(),
                    }
                }
            }
        }
        None
    }
}

/// Runs the runtime until a drain completes (Ok) or the broker dies (Err). A drain starts on
/// SIGINT/SIGTERM or when `stop` resolves (with the reason to log).
pub(crate) async fn supervise(
    mut spec: RuntimeSpec,
    mut launcher: Launcher,
    stop: impl Future<Output = String>,
) -> Result<(), RuntimeError> {
    let mut stop = std::pin::pin!(stop);
    let mut stop_fired = false;
    let (exits_tx, mut exits) = mpsc::unbounded_channel();
    let (completions_tx, mut completions) = mpsc::unbounded_channel();
    // What bodies start and leave behind is re-parented here when their executor dies (or, in
    // thread mode, when the body exits), so it can be killed.
    if let Err(e) = reaper::become_subreaper() {
        tracing::warn!(error = %perago_core::errors::DisplayChain(&e), "cannot become a child subreaper: processes a body detaches may outlive it");
    }
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    let mut rolls = spec.rolls.take();
    // Version 1 of the body: the manifest as `start` checked it, never re-read from disk.
    let bodies = {
        let dir = matches!(launcher, Launcher::Process { .. }).then(|| {
            let runtime_dir = spec.socket.parent().unwrap_or(&spec.workspace_root);
            runtime_dir.join(body::BODY_DIR)
        });
        Bodies::new(Arc::clone(&spec.manifest), dir).map_err(|source| RuntimeError::Spawn {
            what: "the body version's folder".to_owned(),
            source,
        })?
    };

    let control_token = secret();
    let broker_env = broker_env(&spec, &control_token, std::process::id());
    let notifier = spec.notify.take();
    if let Some(foreign) = foreign_broker(&spec.socket).await {
        return Err(foreign);
    }
    let (broker, ready) = launcher
        .broker(
            &spec.process_label.as_ref().map_or_else(
                || "perago-conductor-broker".to_owned(),
                |l| format!("perago-conductor-broker@{l}"),
            ),
            &broker_env,
            &exits_tx,
        )
        .map_err(|source| RuntimeError::Spawn {
            what: "the broker".to_owned(),
            source,
        })?;
    tracing::info!(pid = broker.pid(), "broker started");
    // A thread-mode broker runs in this process.
    let broker_pid = match broker {
        super::children::Child::Process(pid) => pid,
        super::children::Child::Task => std::process::id(),
    };
    let channel = match wait_for_broker(&spec, broker_pid, ready, &mut exits).await {
        Ok(c) => c,
        Err(e) => {
            broker.signal(sys_signal::SIGKILL);
            launcher.abort_all();
            return Err(e);
        }
    };
    let token = control_token
        .parse()
        .expect("a hex token is valid metadata");
    let control = ControlClient::with_interceptor(channel.clone(), TokenInterceptor(token));
    let admin = AdminClient::new(channel);

    let config = machine::Config {
        capacity: spec.capacity.clone(),
        worker_ids: (1..=spec.capacity.max_executors)
            .map(|n| {
                spec.prefix
                    .worker_id(SlotNumber::new(u64::from(n)).expect("1..=N"))
            })
            .collect(),
        force_kill_after: spec.force_kill_after,
        gc_interval: spec.gc_interval,
        stall_timeout: spec.stall_timeout,
        notify: notifier.is_some(),
        watchdog: notifier.as_ref().and_then(NotifyHandle::watchdog_interval),
    };
    let (inputs_tx, mut inputs) = mpsc::unbounded_channel();
    let (cleanup_tx, cleanup_rx) = mpsc::unbounded_channel();
    let (generations_tx, generations) = tokio::sync::watch::channel(BTreeMap::new());
    let cleanup = tokio::spawn(
        cleanup_worker(
            CleanupRoot {
                workspace_root: spec.workspace_root.clone(),
                socket: spec.socket.clone(),
                gc_ttl: spec.gc_ttl,
                lakefs: spec.lakefs.take(),
                generations,
            },
            cleanup_rx,
            inputs_tx.clone(),
        )
        .in_current_span(),
    );
    // How the supervisor learns of a drain started over Admin.Drain while executors are busy,
    // of the slots an adaptive runtime wants, and that the broker is alive.
    let (mut status_seen, watcher) = watch_status(admin.clone(), inputs_tx.clone());
    let mut actor = Actor {
        machine: Machine::new(config, secret, broker, Instant::now()),
        spec,
        launcher,
        exits: exits_tx,
        completions: completions_tx,
        inputs: inputs_tx,
        cleanup: cleanup_tx,
        generations: generations_tx,
        watcher: Some(watcher),
        control: Some(control),
        admin: Some(admin),
        notifier,
        bodies,
    };
    actor.feed(Input::Begin);
    while !actor.machine.done() {
        let wake = actor.machine.next_wake();
        let far = Instant::now() + Duration::from_secs(3600);
        let sleep = tokio::time::sleep_until(wake.unwrap_or(far).into());
        tokio::select! {
            // Exits first: a burst of signals must not starve reaping.
            biased;
            Some(exit) = exits.recv() => actor.on_exit(exit),
            Some(kind) = completions.recv() => actor.feed(Input::Completed(kind)),
            _ = term.recv() => actor.feed(Input::Signal("SIGTERM")),
            _ = int.recv() => actor.feed(Input::Signal("SIGINT")),
            Some(ask) = async {
                match rolls.as_mut() {
                    Some(rolls) => rolls.recv().await,
                    None => std::future::pending().await,
                }
            } => {
                let _ = ask.reply.send(actor.roll(ask.snapshot));
            }
            Some(input) = inputs.recv() => actor.feed(input),
            Ok(()) = status_seen.changed() => {
                let seen = status_seen.borrow_and_update().clone();
                if let Some(seen) = seen {
                    actor.feed(Input::BrokerState(seen));
                }
            }
            why = &mut stop, if !stop_fired => {
                stop_fired = true;
                actor.feed(Input::Stop(why));
            }
            () = sleep, if wake.is_some() => actor.feed(Input::Tick),
        }
    }
    let Actor {
        machine,
        cleanup: cleanup_tx,
        ..
    } = actor;
    drop(cleanup_tx);
    let _ = cleanup.await;
    // Bodies of executors that died last may have left processes to this subreaper.
    let _ = tokio::task::spawn_blocking(reaper::kill_adopted).await;
    machine.outcome()
}

#[cfg(test)]
#[path = "actor_tests.rs"]
mod tests;
