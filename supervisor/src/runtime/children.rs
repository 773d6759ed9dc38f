//! Starting the broker and the executors, as processes or (thread mode) as tasks of the
//! supervisor process.
//!
//! Process mode: argv[0] is the name operators see in `ps -o args` (`comm` holds only 15
//! bytes, so the full name lives in argv[0]); each child leads its own process group and gets
//! SIGTERM if the supervisor dies. Each child also inherits the workspace root's lock (its
//! descriptor number in `PERAGO_ROOT_LOCK_FD`), so the root stays locked until the last process
//! of the runtime has exited, even when the supervisor was killed first; the children mark it
//! close-on-exec at once, so their bodies never hold it. Thread mode runs the same broker and
//! slot code in this process, over the same socket; bodies are still subprocesses (and never
//! inherit the lock, which is opened close-on-exec).

use perago_core::{
    env,
    manifest::{BodyKind, Manifest},
    recycle, secrets,
};
use perago_sys::{guard, reaper, signal, spawn};
use std::{
    collections::BTreeMap,
    os::fd::RawFd,
    path::PathBuf,
    process::ExitStatus,
    sync::{Arc, atomic::AtomicBool},
};
use tokio::{process::Command, sync::mpsc};
use tracing::Instrument as _;

/// Which child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChildKind {
    Broker,
    Executor { slot: u32, generation: u64 },
}

/// How a child ended.
#[derive(Debug)]
pub(crate) enum Ended {
    /// A process, reaped.
    Process(std::io::Result<ExitStatus>),
    /// A thread-mode task.
    Task(Result<(), String>),
    /// A thread-mode executor task that ended to be recycled (the reason says which limit).
    Recycled(String),
}

impl Ended {
    pub(crate) fn success(&self) -> bool {
        match self {
            Self::Process(Ok(s)) => s.success(),
            Self::Process(Err(_)) => false,
            Self::Task(r) => r.is_ok(),
            Self::Recycled(_) => true,
        }
    }

    /// An executor that left to be recycled (exit code
    /// [`EXIT_RECYCLED`](recycle::EXIT_RECYCLED), or its thread-mode task's end).
    pub(crate) fn recycled(&self) -> bool {
        match self {
            Self::Process(Ok(s)) => s.code() == Some(recycle::EXIT_RECYCLED),
            Self::Recycled(_) => true,
            _ => false,
        }
    }

    /// The signal that ended a process, if one did.
    pub(crate) fn signal(&self) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt as _;
        match self {
            Self::Process(Ok(s)) => s.signal(),
            _ => None,
        }
    }

    /// The exit code a process chose, if it exited by itself.
    pub(crate) fn exit_code(&self) -> Option<i32> {
        match self {
            Self::Process(Ok(s)) => s.code(),
            _ => None,
        }
    }

    /// `exit status 1`, `signal 9 (SIGKILL)`, `task ended: …`.
    pub(crate) fn describe(&self) -> String {
        use std::os::unix::process::ExitStatusExt as _;
        match self {
            Self::Process(Ok(s)) => match (s.code(), s.signal()) {
                (Some(code), _) => format!("exit status {code}"),
                (None, Some(sig)) => format!("signal {sig} ({})", signal::signal_name(sig)),
                (None, None) => "unknown status".to_owned(),
            },
            Self::Process(Err(e)) => {
                format!("wait failed: {}", perago_core::errors::DisplayChain(&e))
            }
            Self::Task(Ok(())) => "finished".to_owned(),
            Self::Task(Err(why)) => format!("failed: {why}"),
            Self::Recycled(why) => format!("recycled: {why}"),
        }
    }
}

/// A child's end, reported by the task that waits for it.
#[derive(Debug)]
pub(crate) struct ChildExit {
    pub(crate) kind: ChildKind,
    /// 0 for thread-mode tasks.
    pub(crate) pid: u32,
    pub(crate) ended: Ended,
}

/// A running child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Child {
    Process(u32),
    Task,
}

impl Child {
    /// The pid, 0 for a task.
    pub(crate) fn pid(self) -> u32 {
        match self {
            Self::Process(pid) => pid,
            Self::Task => 0,
        }
    }

    /// Signals a process's group. Tasks stop through the protocol (drain), not signals.
    pub(crate) fn signal(self, signal: i32) {
        if let Self::Process(pid) = self {
            let _ = signal::signal_group(pid, signal);
        }
    }
}

/// The first argument that makes this program a broker (see [`Program::this_program`]).
pub(crate) const BROKER_ROLE_ARG: &str = "__perago-broker";
/// The first argument that makes this program an executor.
pub(crate) const EXECUTOR_ROLE_ARG: &str = "__perago-executor";

/// A runtime child's program: a binary of its own, or this program in a role.
#[derive(Debug, Clone)]
pub(crate) struct Program {
    path: PathBuf,
    role_arg: Option<&'static str>,
}

impl Program {
    /// `path` (`perago-broker`, `perago-executor`, a Rust task binary).
    pub(crate) fn binary(path: PathBuf) -> Self {
        Self {
            path,
            role_arg: None,
        }
    }

    /// This very program, started with `role_arg` ([`BROKER_ROLE_ARG`], [`EXECUTOR_ROLE_ARG`]):
    /// `cargo run -p perago-supervisor` builds no other binary, and it is the same build.
    #[cfg(feature = "dev")]
    pub(crate) fn this_program(role_arg: &'static str) -> std::io::Result<Self> {
        Ok(Self {
            path: std::env::current_exe()?,
            role_arg: Some(role_arg),
        })
    }
}

/// How children are started.
#[derive(Debug)]
pub(crate) enum Launcher {
    Process {
        broker_bin: Program,
        /// The stock executor (`perago-executor`): what runs a `body.command`; a body version
        /// whose body is `body.executor` runs that binary instead.
        executor_bin: Program,
        /// The workspace root lock's descriptor, inherited by every child.
        lock_fd: Option<RawFd>,
    },
    Thread {
        tasks: Vec<WorkerThread>,
    },
}

/// A thread-mode broker or executor: a thread of its own running a current-thread runtime,
/// as its process would (so blocking work in one never stalls another), with its worker's
/// logging as the thread's default.
#[derive(Debug)]
pub(crate) struct WorkerThread {
    kind: ChildKind,
    /// Ends the work (dropping it: an assignment's drop SIGKILLs its body).
    abort: Arc<tokio::sync::Notify>,
    thread: std::thread::JoinHandle<()>,
}

impl Launcher {
    /// Thread mode refuses an executor binary: it can only run as its own process.
    pub(crate) fn thread(manifest: Arc<Manifest>) -> Result<Self, crate::errors::ThreadModeError> {
        if let BodyKind::Executor(path) = &manifest.body.kind {
            return Err(crate::errors::ThreadModeError::ExecutorBinary { path: path.clone() });
        }
        // Bodies run under this same binary as their guard: a subreaper that kills whatever
        // the body started when the body exits or when this process dies, even by SIGKILL.
        match std::env::current_exe() {
            Ok(exe) => guard::set_body_guard(exe),
            Err(e) => {
                tracing::warn!(error = %perago_core::errors::DisplayChain(&e), "cannot find this program to guard thread-mode bodies: processes a body starts may outlive a SIGKILLed supervisor")
            }
        }
        Ok(Self::Thread { tasks: Vec::new() })
    }

    fn spawn_process(
        program: &Program,
        argv0: &str,
        env: &[(String, String)],
        kind: ChildKind,
        lock_fd: Option<RawFd>,
        exits: &mpsc::UnboundedSender<ChildExit>,
        inherit: Option<std::os::fd::RawFd>,
    ) -> std::io::Result<Child> {
        let mut cmd = Command::new(&program.path);
        cmd.args(program.role_arg);
        // First of the child's pre-exec steps: whatever the supervisor itself was started
        // holding (an operator's shell, a service manager, a test runner's jobserver) is
        // close-on-exec; the steps below pass on exactly the descriptors named here.
        spawn::inherit_only_stdio(&mut cmd);
        if let Some(fd) = inherit {
            spawn::inherit_fd(&mut cmd, fd);
        }
        // Descriptors are passed by this launcher only: none named in the supervisor's own
        // environment reaches a child (the broker's ready pipe is in its `env`).
        cmd.env_remove(env::PERAGO_READY_FD);
        cmd.env_remove(env::PERAGO_COMPLETION_FD);
        cmd.arg0(argv0).envs(env.iter().map(|(k, v)| (k, v)));
        cmd.env_remove(env::PERAGO_ROOT_LOCK_FD);
        // Only the supervisor speaks for a systemd service.
        for name in super::notify::VARIABLES {
            cmd.env_remove(name);
        }
        if let Some(fd) = lock_fd {
            spawn::inherit_fd(&mut cmd, fd);
            cmd.env(env::PERAGO_ROOT_LOCK_FD, fd.to_string());
        }
        // Secrets never travel in a child's environment (which /proc/<pid>/environ shows for
        // its whole life): each child gets the ones it needs over a socket of its own, once it
        // has said it is non-dumpable, and no other. Only the broker talks to Conductor; only
        // executors talk to lakeFS.
        let wanted: &[&str] = match kind {
            ChildKind::Broker => &[
                perago_core::env::PERAGO_CONTROL_TOKEN,
                "CONDUCTOR_AUTH_KEY",
                "CONDUCTOR_AUTH_SECRET",
                perago_core::env::OTEL_EXPORTER_OTLP_HEADERS,
                perago_core::env::OTEL_EXPORTER_OTLP_TRACES_HEADERS,
            ],
            ChildKind::Executor { .. } => &[
                perago_core::env::PERAGO_SLOT_TOKEN,
                perago_core::env::LAKEFS_ACCESS_KEY_ID,
                perago_core::env::LAKEFS_SECRET_ACCESS_KEY,
            ],
        };
        let mut secrets = std::collections::BTreeMap::new();
        for name in perago_core::env::SECRET_VARS {
            let value = env
                .iter()
                .rev()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
                .or_else(|| std::env::var(name).ok());
            cmd.env_remove(name);
            if let Some(value) = value.filter(|_| wanted.contains(&name)) {
                secrets.insert(name, value);
            }
        }
        let secrets = serde_json::to_vec(&secrets).expect("strings always serialize");
        let (ours, theirs) = secrets::channel()?;
        let secrets_fd = std::os::fd::AsRawFd::as_raw_fd(&theirs);
        spawn::inherit_fd(&mut cmd, secrets_fd);
        cmd.env(perago_core::env::PERAGO_SECRETS_FD, secrets_fd.to_string());
        spawn::isolate(&mut cmd, signal::SIGTERM);
        let (mut child, managed) = reaper::spawn(&mut cmd)?;
        // The child has its own copy: its end closes with the child.
        drop(theirs);
        let pid = managed.pid();
        let exits = exits.clone();
        let task = async move {
            // The secrets go once the child says it is non-dumpable; one that does not, in
            // time, gets nothing and is stopped (a failed start). The exit is watched
            // meanwhile, so the group is signalled only while its leader is unreaped.
            let hand_over = secrets::hand_over(ours, &secrets, secrets::TIMEOUT);
            let status = tokio::select! {
                status = child.wait() => Some(status),
                handed = hand_over => match handed {
                    Ok(()) => None,
                    Err(e) => {
                        tracing::warn!(error = %perago_core::errors::DisplayChain(&e), "the child got no secrets; it is stopped");
                        let _ = signal::signal_group(pid, signal::SIGKILL);
                        None
                    }
                },
            };
            let status = match status {
                Some(status) => status,
                None => child.wait().await,
            };
            drop(managed);
            let _ = exits.send(ChildExit {
                kind,
                pid,
                ended: Ended::Process(status),
            });
        };
        tokio::spawn(task.instrument(tracing::info_span!("child", pid, kind = ?kind)));
        Ok(Child::Process(pid))
    }

    /// Runs the future `work` makes on a thread named `name`, on a current-thread runtime of
    /// its own (the runtime's blocking threads too log through `log`), and reports its end as
    /// `kind` on `exits`.
    fn spawn_thread<F, W>(
        &mut self,
        name: String,
        kind: ChildKind,
        log: Option<tracing::Dispatch>,
        exits: &mpsc::UnboundedSender<ChildExit>,
        work: W,
    ) -> std::io::Result<Child>
    where
        W: FnOnce() -> F + Send + 'static,
        F: Future<Output = Ended> + 'static,
    {
        let abort = Arc::new(tokio::sync::Notify::new());
        let exits = exits.clone();
        let stop = Arc::clone(&abort);
        let thread = std::thread::Builder::new().name(name).spawn(move || {
            let _log = log.as_ref().map(tracing::dispatcher::set_default);
            let ended = run_worker(log, stop, work);
            let _ = exits.send(ChildExit {
                kind,
                pid: 0,
                ended,
            });
        })?;
        if let Self::Thread { tasks, .. } = self {
            tasks.retain(|t| !t.thread.is_finished());
            tasks.push(WorkerThread {
                kind,
                abort,
                thread,
            });
        }
        Ok(Child::Task)
    }

    /// Starts the broker with `env`; `argv0` is its process's name. Returns it and the read
    /// end of its ready pipe ([`PERAGO_READY_FD`](env::PERAGO_READY_FD)): one byte once it
    /// serves, end of file without one if it closed or lost its end first.
    pub(crate) fn broker(
        &mut self,
        argv0: &str,
        env: &[(String, String)],
        exits: &mpsc::UnboundedSender<ChildExit>,
    ) -> std::io::Result<(Child, ReadyPipe)> {
        use std::os::fd::{AsRawFd as _, IntoRawFd as _};
        // Both ends close-on-exec: only the broker's copy of the write end is inherited.
        let (write, ready) = tokio::net::unix::pipe::pipe()?;
        let write = write.into_blocking_fd()?;
        let child = match self {
            Self::Process {
                broker_bin,
                lock_fd,
                ..
            } => {
                let mut env = env.to_vec();
                env.push((
                    env::PERAGO_READY_FD.to_owned(),
                    write.as_raw_fd().to_string(),
                ));
                // The child has its copy; ours closes when `write` drops, so the pipe ends
                // (end of file) when the broker closes its end or dies.
                Self::spawn_process(
                    &broker_bin.clone(),
                    argv0,
                    &env,
                    ChildKind::Broker,
                    *lock_fd,
                    exits,
                    Some(write.as_raw_fd()),
                )?
            }
            Self::Thread { .. } => {
                let mut config =
                    perago_broker::cli::config_from(lookup(env)).map_err(std::io::Error::other)?;
                let log = worker_log(env, &config.task_name, &config.prefix.broker_id())?;
                let work = move || async move {
                    // The broker owns the write end from here (`run` adopts it); dropped
                    // unstarted, the closure closes it.
                    config.ready_fd = Some(write.into_raw_fd());
                    // Drains come over Admin.Drain, as in process mode.
                    Ended::Task(
                        perago_broker::run(config, std::future::pending())
                            .await
                            .map_err(|e| perago_core::errors::chain(&e)),
                    )
                };
                self.spawn_thread(
                    "perago-broker".to_owned(),
                    ChildKind::Broker,
                    log,
                    exits,
                    work,
                )?
            }
        };
        Ok((child, ready))
    }

    /// Starts the executor of `slot` at `generation` with `env` (identity included), running
    /// `body` (its body version's manifest: a thread takes it as it is; a process reads the
    /// same version's source, named in `env`). Each assignment it completes is sent to
    /// `completions`.
    pub(crate) fn executor(
        &mut self,
        slot_name: &str,
        kind: ChildKind,
        body: &Arc<Manifest>,
        env: &[(String, String)],
        exits: &mpsc::UnboundedSender<ChildExit>,
        completions: &mpsc::UnboundedSender<ChildKind>,
    ) -> std::io::Result<Child> {
        use std::os::fd::{AsRawFd as _, IntoRawFd as _};
        let pipe = completion_pipe(kind, completions)?;
        let mut env = env.to_vec();
        match self {
            Self::Process {
                executor_bin,
                lock_fd,
                ..
            } => {
                env.push((
                    perago_core::env::PERAGO_COMPLETION_FD.to_owned(),
                    pipe.as_raw_fd().to_string(),
                ));
                let program = match &body.body.kind {
                    BodyKind::Executor(path) => Program::binary(path.clone()),
                    BodyKind::Command { .. } => executor_bin.clone(),
                };
                // The child has its copy; ours closes when `pipe` drops.
                Self::spawn_process(
                    &program,
                    slot_name,
                    &env,
                    kind,
                    *lock_fd,
                    exits,
                    Some(pipe.as_raw_fd()),
                )
            }
            Self::Thread { .. } => {
                let manifest = body;
                // The executor task owns the write end from here (`adopt_fd`).
                env.push((
                    perago_core::env::PERAGO_COMPLETION_FD.to_owned(),
                    pipe.into_raw_fd().to_string(),
                ));
                let env = env.as_slice();
                let (mut identity, _) = perago_executor::cli::identity_from(lookup(env))
                    .map_err(std::io::Error::other)?;
                // The executor shares this process: only its bodies' memory is its own.
                identity.recycle.scope = perago_executor::recycle::MemoryScope::Bodies;
                let workspace = perago_executor::cli::workspace_runtime(&identity, lookup(env));
                let path = std::env::var_os("PATH");
                let runner = perago_executor::assignment::AssignmentRunner::new(
                    Arc::clone(manifest),
                    identity.worker_id.clone(),
                    path.as_deref(),
                )
                .map_err(|e| std::io::Error::other(perago_core::errors::chain(&e)))?
                .with_workspace(workspace);
                let log = worker_log(env, &manifest.task.name, &identity.worker_id)?;
                let work = move || async move {
                    // Never signalled: a thread-mode slot stops through the broker's Stop.
                    let (_keep, signalled) = mpsc::channel(1);
                    let stop = Arc::new(AtomicBool::new(false));
                    let result =
                        perago_executor::slot::serve(&identity, &runner, stop, signalled).await;
                    drop(_keep);
                    match result {
                        Ok(perago_executor::slot::Served::Recycled(why)) => Ended::Recycled(why),
                        Ok(perago_executor::slot::Served::Stopped) => Ended::Task(Ok(())),
                        Err(e) => Ended::Task(Err(perago_core::errors::chain(&e))),
                    }
                };
                // `executor-0001`: a thread's name holds 15 bytes.
                let name = slot_name.strip_prefix("perago-").unwrap_or(slot_name);
                let name = name.split('@').next().unwrap_or(name);
                self.spawn_thread(name.to_owned(), kind, log, exits, work)
            }
        }
    }

    /// Ends every thread-mode executor (the force-kill of thread mode): dropping an
    /// assignment SIGKILLs its body; the broker stays to report it.
    pub(crate) fn abort_executors(&self) {
        if let Self::Thread { tasks, .. } = self {
            for t in tasks {
                if matches!(t.kind, ChildKind::Executor { .. }) {
                    t.abort.notify_one();
                }
            }
        }
    }

    /// Ends every thread-mode worker, the broker too.
    pub(crate) fn abort_all(&self) {
        if let Self::Thread { tasks, .. } = self {
            for t in tasks {
                t.abort.notify_one();
            }
        }
    }
}

/// The body of a worker thread: a current-thread runtime, as the worker's own process has,
/// running `work` until it ends or `abort` is notified. Whatever the work spawned ends with
/// the runtime.
fn run_worker<F, W>(
    log: Option<tracing::Dispatch>,
    abort: Arc<tokio::sync::Notify>,
    work: W,
) -> Ended
where
    W: FnOnce() -> F,
    F: Future<Output = Ended>,
{
    let mut builder = tokio::runtime::Builder::new_current_thread();
    perago_core::logging::idle_flushing(&mut builder).enable_all();
    if let Some(log) = log {
        // Blocking work (`spawn_blocking`) logs as its worker too.
        builder.on_thread_start(move || {
            BLOCKING_LOG.with(|cell| {
                *cell.borrow_mut() = Some(tracing::dispatcher::set_default(&log));
            });
        });
    }
    let runtime = match builder.build() {
        Ok(rt) => rt,
        Err(e) => {
            return Ended::Task(Err(format!(
                "cannot start its async runtime: {}",
                perago_core::errors::DisplayChain(&e)
            )));
        }
    };
    let ended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        perago_core::logging::block_on(&runtime, async {
            tokio::select! {
                ended = work() => ended,
                () = abort.notified() => Ended::Task(Err("aborted".to_owned())),
            }
        })
    }));
    // As its process would: a blocking call still running is not waited for.
    runtime.shutdown_background();
    ended.unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Ended::Task(Err(format!("panicked: {what}")))
    })
}

thread_local! {
    /// A worker runtime's blocking thread's logging, for the thread's life.
    static BLOCKING_LOG: std::cell::RefCell<Option<tracing::dispatcher::DefaultGuard>> =
        const { std::cell::RefCell::new(None) };
}

/// A thread-mode worker's logging: its JSONL folder under `PERAGO_LOG_ROOT`, as its process
/// would have; `None` without a log root (the supervisor's stderr logging serves).
fn worker_log(
    env: &[(String, String)],
    task: &str,
    worker_id: &str,
) -> std::io::Result<Option<tracing::Dispatch>> {
    // Read as the worker's own process would read them: its environment first.
    let lookup = lookup(env);
    let Some(root) = lookup(perago_core::env::PERAGO_LOG_ROOT).filter(|r| !r.is_empty()) else {
        return Ok(None);
    };
    let config =
        perago_core::logging::JsonlConfig::from_lookup(root.into(), task, worker_id, lookup)
            .map_err(std::io::Error::other)?;
    perago_core::logging::worker_dispatch(&config)
        .map(Some)
        .map_err(|e| {
            std::io::Error::other(format!(
                "cannot open the log folder {}: {}",
                config.dir().display(),
                perago_core::errors::DisplayChain(&e)
            ))
        })
}

/// The read end of the broker's ready pipe.
pub(crate) type ReadyPipe = tokio::net::unix::pipe::Receiver;

/// A pipe from one executor generation: each byte it writes is an assignment it completed,
/// reported as `kind` on `completions`. Returns the write end (non-blocking).
fn completion_pipe(
    kind: ChildKind,
    completions: &mpsc::UnboundedSender<ChildKind>,
) -> std::io::Result<std::os::fd::OwnedFd> {
    use tokio::io::AsyncReadExt as _;
    let (write, mut read) = tokio::net::unix::pipe::pipe()?;
    let completions = completions.clone();
    tokio::spawn(async move {
        let mut buf = [0u8; 64];
        while let Ok(n) = read.read(&mut buf).await {
            if n == 0 {
                break;
            }
            for _ in 0..n {
                let _ = completions.send(kind);
            }
        }
    });
    write.into_nonblocking_fd()
}

/// Looks names up in `env`, then in this process's environment.
fn lookup(env: &[(String, String)]) -> impl Fn(&str) -> Option<String> + use<> {
    let map: BTreeMap<String, String> = env.iter().cloned().collect();
    move |name: &str| map.get(name).cloned().or_else(|| std::env::var(name).ok())
}
