//! Running one command to completion the way bodies and guardrails run: in its own process
//! group, JSON on stdin, stdout captured up to a cap, the tail of stderr kept for the failure
//! reason, and a time limit enforced with SIGTERM, a grace period, then SIGKILL.

use perago_sys::{
    Spawn,
    reaper::kill_adopted_below,
    signal::{SIGKILL, SIGTERM, SIGUSR1, signal_group, signal_name, signal_process},
};
use std::{
    io,
    os::fd::OwnedFd,
    path::PathBuf,
    process::ExitStatus,
    sync::{Arc, Mutex, OnceLock},
    time::{Duration, Instant},
};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWriteExt},
    net::unix::pipe,
    task::JoinHandle,
};

/// How long the pipes may stay open after the command and everything it left behind were
/// killed (only a process that escaped the subreaper could still hold them); past this the
/// output read so far is used.
const PIPE_DRAIN_LIMIT: Duration = Duration::from_secs(1);

/// What to run.
#[derive(Debug, Clone)]
pub struct CommandSpec {
    /// The program, already resolved.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// The working directory.
    pub dir: PathBuf,
    /// Environment added to the executor's own.
    pub env: Vec<(String, String)>,
    /// Each stderr line is logged with this label (`body`, `pre guardrail`, …).
    pub label: String,
    /// The uid and gid to run as (`body.user`); `None` = the executor's own.
    pub user: Option<(u32, u32)>,
    /// `body.memory_limit`: the run goes in a memory cgroup of its own with this many bytes
    /// (see [`perago_sys::cgroup`]); `None` = none (guardrails, and bodies without a limit).
    pub memory_limit: Option<u64>,
}

/// Bounds on one run.
#[derive(Debug, Clone, Copy)]
pub struct RunLimits {
    /// Time limit; `None` = none.
    pub timeout: Option<Duration>,
    /// Between SIGTERM and SIGKILL when the time limit is hit.
    pub kill_grace: Duration,
    /// Most stdout bytes kept; beyond that the output is drained and flagged as overflowing.
    pub max_stdout: usize,
    /// How many bytes of the end of stderr are kept.
    pub stderr_tail: usize,
}

impl Default for RunLimits {
    fn default() -> Self {
        Self {
            timeout: None,
            kill_grace: Duration::from_secs(10),
            max_stdout: 3 * 1024 * 1024,
            stderr_tail: 2048,
        }
    }
}

/// `body.soft_time_limit` for one run: when the body is asked to wrap up, and the ids logged
/// when it is.
#[derive(Debug, Clone)]
pub struct SoftLimit {
    /// From the start of the run (zero: at once).
    pub after: Duration,
    /// The assignment's task id.
    pub task_id: String,
    /// Its execution id.
    pub execution_id: String,
    /// This executor's worker id.
    pub worker_id: String,
}

impl SoftLimit {
    /// Logs that the soft limit was reached and what the body is sent.
    pub(crate) fn log(&self, sent: &str) {
        tracing::info!(
            task_id = %self.task_id,
            execution_id = %self.execution_id,
            worker_id = %self.worker_id,
            "soft time limit reached (body.soft_time_limit); sending the body {sent}"
        );
    }
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Exited with a code.
    Exited(i32),
    /// Killed by a signal it did not ask for.
    Signaled(i32),
    /// Hit the time limit and was stopped.
    TimedOut,
}

impl Ended {
    fn from_status(status: ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt as _;
        match (status.code(), status.signal()) {
            (Some(code), _) => Self::Exited(code),
            (None, Some(signal)) => Self::Signaled(signal),
            (None, None) => Self::Exited(-1),
        }
    }

    /// `exit status 3`, `signal 9 (SIGKILL)`, `timed out`.
    pub fn describe(self) -> String {
        match self {
            Self::Exited(code) => format!("exit status {code}"),
            Self::Signaled(signal) => format!("signal {signal} ({})", signal_name(signal)),
            Self::TimedOut => "timed out".to_owned(),
        }
    }
}

/// A finished run.
#[derive(Debug)]
pub struct Finished {
    /// How it ended.
    pub ended: Ended,
    /// Stdout, at most `max_stdout` bytes.
    pub stdout: Vec<u8>,
    /// Stdout was longer than `max_stdout`.
    pub stdout_overflow: bool,
    /// The end of stderr (lossy UTF-8).
    pub stderr_tail: String,
    /// Wall time.
    pub elapsed: Duration,
    /// How many bytes the body wrote to stdout, kept or drained.
    pub stdout_len: u64,
    /// What the run's memory cgroup saw (`spec.memory_limit` set).
    pub memory: Option<MemoryOutcome>,
    /// Without a memory cgroup, while `PERAGO_MEMORY_HEADROOM` admits by the observed peak:
    /// the highest resident memory of the body's process tree, sampled every
    /// [`RSS_SAMPLE_EVERY`] (`None`: not sampled, or the body ended before the first sample).
    pub sampled_peak_rss: Option<u64>,
}

/// How often the resident memory of a body without a memory cgroup is sampled (only with
/// `PERAGO_MEMORY_HEADROOM`, which admits by the observed peak).
pub const RSS_SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// Samples the resident memory of `pid`'s tree into `peak` every [`RSS_SAMPLE_EVERY`], until
/// aborted or the process is gone.
fn sample_rss(pid: u32, peak: Arc<std::sync::atomic::AtomicU64>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(RSS_SAMPLE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let read = tokio::task::spawn_blocking(move || perago_core::rss::tree_rss(pid)).await;
            let Ok(Ok(rss)) = read else {
                return;
            };
            peak.fetch_max(rss, std::sync::atomic::Ordering::Relaxed);
        }
    })
}

pub use perago_sys::cgroup::MemoryOutcome;

/// How long a body cgroup's removal waits for its last processes to leave.
const CGROUP_REMOVE_PATIENCE: Duration = Duration::from_secs(2);

/// This process's memory cgroup, where bodies' go: located once (and the cgroups a SIGKILLed
/// runtime left behind removed then).
pub(crate) fn body_cgroups() -> io::Result<&'static perago_sys::cgroup::Located> {
    static LOCATED: OnceLock<Result<perago_sys::cgroup::Located, String>> = OnceLock::new();
    LOCATED
        .get_or_init(|| {
            let located = perago_sys::cgroup::locate()
                .map_err(|e| format!("body.{}", perago_core::errors::DisplayChain(&e)))?;
            let removed = perago_sys::cgroup::collect_stale(&located);
            if removed > 0 {
                tracing::info!(
                    removed,
                    parent = %located.body_parent().display(),
                    "removed the body memory cgroups a runtime that is gone left behind"
                );
            }
            Ok(located)
        })
        .as_ref()
        .map_err(|e| io::Error::other(e.clone()))
}

/// A memory cgroup for one body with `limit` bytes.
pub(crate) fn body_cgroup(limit: u64) -> io::Result<perago_sys::cgroup::BodyCgroup> {
    perago_sys::cgroup::BodyCgroup::create(body_cgroups()?, limit)
        .map_err(|e| io::Error::other(format!("body.{}", perago_core::errors::DisplayChain(&e))))
}

/// Removes a body's cgroup once its tree is gone; a failure is logged (the cgroup is then
/// collected at the next start, once this process is gone).
pub(crate) fn remove_body_cgroup(cgroup: perago_sys::cgroup::BodyCgroup) {
    let dir = cgroup.dir().to_owned();
    if let Err(e) = cgroup.remove(CGROUP_REMOVE_PATIENCE) {
        tracing::warn!(cgroup = %dir.display(), error = %perago_core::errors::DisplayChain(&e), "cannot remove the body's memory cgroup");
    }
}

/// How every OOM reason starts.
pub const OOM_PREFIX: &str = "OOM-killed ";

/// Whether `run` failed with an OOM kill in its memory cgroup (one that exited 0 anyway
/// recovered from it: its result stands).
pub fn oom_killed(run: &Finished) -> bool {
    run.ended != Ended::Exited(0) && run.memory.is_some_and(|m| m.oom_kills > 0)
}

/// `OOM-killed at 2.0 GiB (limit 2 GiB)`: why a body whose cgroup saw an OOM kill failed.
pub fn oom_reason(memory: &MemoryOutcome) -> String {
    let limit = spaced(&perago_core::memory::format_bytes(memory.limit));
    match memory.peak {
        Some(peak) => format!("OOM-killed at {} (limit {limit})", one_decimal(peak)),
        None => format!("OOM-killed (limit {limit})"),
    }
}

/// `2.0 GiB`, `512.0 MiB`: a peak, always with one decimal.
fn one_decimal(n: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    UNITS.iter().find(|(_, size)| n >= *size).map_or_else(
        || format!("{n} B"),
        |(unit, size)| format!("{:.1} {unit}", n as f64 / *size as f64),
    )
}

/// `2GiB` → `2 GiB`.
fn spaced(text: &str) -> String {
    match text.find(|c: char| c.is_ascii_alphabetic()) {
        Some(at) => format!("{} {}", &text[..at], &text[at..]),
        None => text.to_owned(),
    }
}

/// Credentials of the runtime itself, removed from every body's environment: bodies talk to
/// neither Conductor nor lakeFS through perago's identity (a body that needs lakeFS gets its own
/// credentials through `body.env`).
pub(crate) const RUNTIME_SECRETS: [&str; 5] = [
    "CONDUCTOR_AUTH_KEY",
    "CONDUCTOR_AUTH_SECRET",
    "LAKEFS_SECRET_ACCESS_KEY",
    perago_core::env::OTEL_EXPORTER_OTLP_HEADERS,
    perago_core::env::OTEL_EXPORTER_OTLP_TRACES_HEADERS,
];

/// The prefixes of the runtime's own variables. A body inherits none of them: not the slot
/// token or socket (with them it could pose as its executor), not the Conductor or lakeFS
/// configuration and secrets. It gets the per-task `PERAGO_*` variables of SPEC §2, set after
/// this, and its manifest's `body.env`.
const RUNTIME_PREFIXES: [&str; 3] = ["PERAGO_", "CONDUCTOR_", "LAKEFS_"];

/// How every body starts, a command body (and a guardrail) for one run and a `jsonl` body for
/// many alike: so what a body inherits is decided here once, and in [`Spawn`]. It runs
/// `spec.program` (under the body guard in thread mode) with `spec.args` in `spec.dir`, as
/// `spec.user` if set, with the executor's environment less the runtime's variables
/// ([`inherited_environment`]), then `spec.env`, then `env` (the per-task variables). From
/// [`Spawn`] it gets: three pipes as stdio and no other descriptor of the executor (a body must
/// never hold the workspace root's lock, which a daemon it leaves behind would keep forever,
/// nor the completion pipe or a socket of the runtime), a process group of its own, an empty
/// signal mask with caught signals and SIGPIPE at their default, and SIGKILL when the spawning
/// thread dies.
pub(crate) fn body_spawn(spec: &CommandSpec, env: &[(String, String)]) -> Spawn {
    let mut body = Spawn::body(&spec.program);
    body.args(&spec.args)
        .current_dir(&spec.dir)
        .death_signal(SIGKILL)
        .base_env(inherited_environment());
    for (name, value) in spec.env.iter().chain(env) {
        body.env(name, value);
    }
    if let Some((uid, gid)) = spec.user {
        body.user(uid, gid);
    }
    body
}

/// [`body_spawn`], started in `cgroup` (its first step, before the exec) when there is one.
pub(crate) fn spawn_body(
    spec: &CommandSpec,
    env: &[(String, String)],
    cgroup: Option<&perago_sys::cgroup::BodyCgroup>,
) -> io::Result<(perago_sys::Child, perago_sys::Managed)> {
    let mut body = body_spawn(spec, env);
    if let Some(procs) = cgroup.and_then(perago_sys::cgroup::BodyCgroup::procs) {
        body.cgroup(procs);
    }
    body.spawn()
}

/// Runs `spec` with `stdin` as its standard input, within `limits`.
pub async fn run(spec: &CommandSpec, stdin: Vec<u8>, limits: RunLimits) -> io::Result<Finished> {
    run_with_soft_limit(spec, stdin, limits, None).await
}

/// [`run`], and at `soft` the process gets SIGUSR1: the process itself, not its group (the
/// signal's default action would kill the group's other members, which do not expect it).
/// The run then goes on as before: the result of a body that wraps up is used as usual, and
/// the time limit still applies.
pub async fn run_with_soft_limit(
    spec: &CommandSpec,
    stdin: Vec<u8>,
    limits: RunLimits,
    soft: Option<&SoftLimit>,
) -> io::Result<Finished> {
    let started = Instant::now();
    let cgroup = spec.memory_limit.map(body_cgroup).transpose()?;
    let (mut child, managed) = spawn_body(spec, &[], cgroup.as_ref())?;
    let pgid = managed.pid();
    let sampled = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sampler = (cgroup.is_none()
        && std::env::var_os(perago_core::capacity::PERAGO_MEMORY_HEADROOM).is_some())
    .then(|| sample_rss(pgid, Arc::clone(&sampled)));
    let start = tokio::time::Instant::now();
    let kept = Arc::new(Mutex::new(Kept::new(limits.max_stdout)));
    let mut stderr_log = Some(TailLog::new(limits.stderr_tail, spec.label.clone()));
    let mut writer = None;
    let mut stdout = None;
    let mut stderr = None;
    let ended = async {
        if let Some(pipe) = child.stdin.take() {
            writer = feed(pipe, stdin)?;
        }
        if quiet_window_fits(&limits, soft)
            && let Ok(status) = tokio::time::timeout(QUIET_WINDOW, child.wait()).await
        {
            return Ok(Ended::from_status(status?));
        }
        // Still running: its output is read as it comes.
        if let Some(fd) = child.stdout.take() {
            stdout = Some(read_stdout_from(fd, &kept)?);
        }
        if let (Some(fd), Some(log)) = (child.stderr.take(), stderr_log.take()) {
            stderr = Some(read_stderr_from(fd, log)?);
        }
        wait_within_limits(&mut child, pgid, start, &limits, soft).await
    }
    .await;
    if let Some(sampler) = sampler {
        sampler.abort();
    }
    let sampled_peak_rss =
        Some(sampled.load(std::sync::atomic::Ordering::Relaxed)).filter(|&n| n > 0);
    let (stdout_pipe, stderr_pipe) = (child.stdout.take(), child.stderr.take());
    // Not waited for only after an error above: then it is killed here.
    drop(child);
    drop(managed);
    // Whatever the body left running is an orphan now, in its group or (a double fork, a
    // `setsid`) re-parented to this subreaper: end it all, so its pipes close and nothing
    // outlives the assignment. On every path: the slot does not look again after a command
    // body (see `AssignmentRunner::collects_leftovers`).
    let group_killed = signal_group(pgid, SIGKILL);
    // Commands are spawned by the runtime's (main) thread: its children and the orphans
    // handed to it are all there is to look at.
    let killed = kill_adopted_below(&[]);
    if killed > 0 {
        tracing::info!(
            pgid,
            killed,
            "killed the processes the command left running"
        );
    }
    if let Some(writer) = writer {
        writer.abort();
    }
    // The tree is gone: what its cgroup saw is final, and the cgroup goes.
    let memory = cgroup.map(|cgroup| {
        let outcome = cgroup.outcome();
        remove_body_cgroup(cgroup);
        tracing::info!(
            peak_bytes = outcome.peak,
            limit_bytes = outcome.limit,
            oom_kills = outcome.oom_kills,
            "the body's memory cgroup: peak {} of its limit {}",
            outcome
                .peak
                .map_or_else(|| "unknown".to_owned(), one_decimal),
            spaced(&perago_core::memory::format_bytes(outcome.limit))
        );
        outcome
    });
    let ended = match ended.and_then(|ended| group_killed.map(|()| ended)) {
        Ok(ended) => ended,
        Err(e) => {
            if let Some(task) = &stdout {
                task.abort();
            }
            if let Some(task) = &stderr {
                task.abort();
            }
            return Err(e);
        }
    };
    // Exited within the quiet window: what the pipes hold is read now, and only a pipe still
    // open (held by a process that escaped every kill) gets a reader.
    if let Some(fd) = stdout_pipe
        && let Some(fd) = drain_now(fd, |chunk| kept.lock().expect("not poisoned").feed(chunk))
    {
        stdout = Some(read_stdout_from(fd, &kept)?);
    }
    let mut stderr_tail = None;
    if let (Some(fd), Some(mut log)) = (stderr_pipe, stderr_log) {
        match drain_now(fd, |chunk| log.feed(chunk)) {
            Some(fd) => stderr = Some(read_stderr_from(fd, log)?),
            None => stderr_tail = Some(log.finish()),
        }
    }
    // The output is what was read by now and within the drain limit: a process that escaped
    // every kill and still holds the pipe cannot withhold the body's result.
    let _ = join_pipe(stdout).await;
    let Kept {
        bytes: stdout,
        overflow: stdout_overflow,
        seen: stdout_len,
        ..
    } = std::mem::take(&mut *kept.lock().expect("not poisoned"));
    let stderr_tail = match stderr_tail {
        Some(tail) => tail,
        None => join_pipe(stderr).await.unwrap_or_default(),
    };
    Ok(Finished {
        ended,
        stdout,
        stdout_overflow,
        stderr_tail,
        elapsed: started.elapsed(),
        stdout_len,
        memory,
        sampled_peak_rss,
    })
}

/// How long a run first waits for the body to exit before it reads the body's output as it
/// comes. A body that exits within it (a short command) has its output read in one go after
/// its exit: the pipes are not registered with the runtime, and the executor is not woken
/// for each write. A body that fills a pipe (64 KiB) within it waits at most this long for
/// its reader.
const QUIET_WINDOW: Duration = Duration::from_millis(2);

/// Whether the quiet window ends before any time limit (it signals nothing).
fn quiet_window_fits(limits: &RunLimits, soft: Option<&SoftLimit>) -> bool {
    limits.timeout.is_none_or(|t| t > QUIET_WINDOW)
        && soft.is_none_or(|s| s.after.is_zero() || s.after > QUIET_WINDOW)
}

/// A reader task for the body's stdout (`fd`, non-blocking), into `kept`.
fn read_stdout_from(fd: OwnedFd, kept: &Arc<Mutex<Kept>>) -> io::Result<JoinHandle<()>> {
    let pipe = pipe::Receiver::from_owned_fd_unchecked(fd)?;
    Ok(tokio::spawn(read_capped(pipe, Arc::clone(kept))))
}

/// A reader task for the body's stderr (`fd`, non-blocking), through `log`.
fn read_stderr_from(fd: OwnedFd, log: TailLog) -> io::Result<JoinHandle<String>> {
    let pipe = pipe::Receiver::from_owned_fd_unchecked(fd)?;
    Ok(tokio::spawn(read_tail(pipe, log)))
}

/// Reads what the non-blocking `pipe` holds now into `sink`. `None` at its end (or on an
/// error, which ends a reader too); the pipe back while it is still open.
fn drain_now(pipe: OwnedFd, mut sink: impl FnMut(&[u8])) -> Option<OwnedFd> {
    use std::io::Read as _;
    let mut file = std::fs::File::from(pipe);
    let mut buf = [0u8; 16 * 1024];
    loop {
        match file.read(&mut buf) {
            Ok(0) => return None,
            Ok(n) => sink(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Some(file.into()),
            Err(_) => return None,
        }
    }
}

/// Waits for `child` within the soft and hard time limits, counted from `start`: SIGUSR1 to
/// the child at the soft limit, SIGTERM to its group at the hard one, SIGKILL after the grace
/// period.
async fn wait_within_limits(
    child: &mut perago_sys::Child,
    pgid: u32,
    start: tokio::time::Instant,
    limits: &RunLimits,
    soft: Option<&SoftLimit>,
) -> io::Result<Ended> {
    let hard = limits.timeout.map(|limit| start + limit);
    if let Some(soft) = soft
        && soft.after.is_zero()
    {
        // A process just spawned has had no time to install a SIGUSR1 handler, and the
        // signal's default action would kill it: a body dispatched past its soft limit is not
        // signalled, and the hard limit applies as usual.
        tracing::info!(
            task_id = %soft.task_id, execution_id = %soft.execution_id, worker_id = %soft.worker_id,
            "soft time limit already past at dispatch (body.soft_time_limit): the body is not sent SIGUSR1, which would kill it before it can install a handler; the hard limit applies"
        );
    } else if let Some(soft) = soft {
        let soft_at = start + soft.after;
        if hard.is_none_or(|hard| soft_at < hard) {
            tokio::select! {
                _ = tokio::time::sleep_until(soft_at) => {
                    soft.log("SIGUSR1");
                    signal_process(pgid, SIGUSR1)?;
                }
                _ = child.wait() => {}
            }
        }
    }
    let left = hard.map(|hard| hard.saturating_duration_since(tokio::time::Instant::now()));
    Ok(match left {
        None => Ended::from_status(child.wait().await?),
        Some(limit) => match tokio::time::timeout(limit, child.wait()).await {
            Ok(status) => Ended::from_status(status?),
            Err(_) => {
                tracing::warn!(pgid, ?limit, "command hit its time limit; sending SIGTERM");
                signal_group(pgid, SIGTERM)?;
                if tokio::time::timeout(limits.kill_grace, child.wait())
                    .await
                    .is_err()
                {
                    tracing::warn!(pgid, grace = ?limits.kill_grace, "command ignored SIGTERM; sending SIGKILL");
                    signal_group(pgid, SIGKILL)?;
                    child.wait().await?;
                }
                Ended::TimedOut
            }
        },
    })
}

/// Writes `input` to a body's stdin (`pipe`, non-blocking) and closes it: what the pipe takes
/// at once (all of an input up to the pipe's buffer, 64 KiB) without a task; the rest, if any,
/// from a task as the body reads. A body that does not read its input closes the pipe early:
/// not an error.
fn feed(pipe: OwnedFd, input: Vec<u8>) -> io::Result<Option<JoinHandle<()>>> {
    use std::io::Write as _;
    let mut file = std::fs::File::from(pipe);
    let mut written = 0;
    while written < input.len() {
        match file.write(&input[written..]) {
            Ok(0) => return Ok(None),
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let mut pipe = pipe::Sender::from_owned_fd_unchecked(file.into())?;
                return Ok(Some(tokio::spawn(async move {
                    let _ = pipe.write_all(&input[written..]).await;
                })));
            }
            Err(_) => return Ok(None),
        }
    }
    Ok(None)
}

/// What a body inherits of the executor's environment: all but the runtime's variables
/// ([`RUNTIME_PREFIXES`], [`RUNTIME_SECRETS`], systemd's notification variables, a trace
/// context). Read once:
/// the executor never changes its environment.
fn inherited_environment() -> &'static perago_sys::Environment {
    static INHERITED: OnceLock<perago_sys::Environment> = OnceLock::new();
    INHERITED.get_or_init(|| {
        perago_sys::Environment::new(std::env::vars_os().filter(|(name, _)| {
            let text = name.to_string_lossy();
            !RUNTIME_SECRETS.contains(&&*text)
                && !perago_core::env::SYSTEMD_NOTIFY_VARS.contains(&&*text)
                // A trace context is the assignment's, never one the executor was started in.
                && text != perago_core::env::TRACEPARENT
                && text != perago_core::env::TRACESTATE
                && !RUNTIME_PREFIXES.iter().any(|p| text.starts_with(p))
        }))
    })
}

async fn join_pipe<T: Default>(task: Option<JoinHandle<T>>) -> Option<T> {
    let mut task = task?;
    match tokio::time::timeout(PIPE_DRAIN_LIMIT, &mut task).await {
        Ok(result) => result.ok(),
        Err(_) => {
            tracing::warn!(
                "a pipe stayed open after the command's process group ended (a process escaped the group)"
            );
            task.abort();
            None
        }
    }
}

/// A body's stdout as kept: at most `cap` bytes, and whether there was more.
#[derive(Debug, Default)]
struct Kept {
    bytes: Vec<u8>,
    overflow: bool,
    cap: usize,
    /// Every byte read, kept or not.
    seen: u64,
}

impl Kept {
    fn new(cap: usize) -> Self {
        Self {
            cap,
            ..Self::default()
        }
    }

    fn feed(&mut self, chunk: &[u8]) {
        self.seen = self.seen.saturating_add(chunk.len() as u64);
        let room = self.cap.saturating_sub(self.bytes.len());
        if chunk.len() > room {
            self.overflow = true;
        }
        self.bytes
            .extend_from_slice(&chunk[..chunk.len().min(room)]);
    }
}

/// Reads `pipe` to its end into `kept`. The bytes live outside the task, so output read
/// before a stuck pipe is given up on stays.
async fn read_capped(mut pipe: impl AsyncRead + Unpin, kept: Arc<Mutex<Kept>>) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => kept.lock().expect("not poisoned").feed(&buf[..n]),
        }
    }
}

/// Longest stderr line logged whole; longer ones are cut.
const MAX_LOGGED_LINE: usize = 4096;

/// How much of a body's stderr one assignment may write to the worker log; the rest is
/// counted and reported in one line, so a body printing hundreds of megabytes cannot rotate
/// the runtime's own records away. The end of stderr is still kept for the failure reason.
pub(crate) const MAX_LOGGED_STDERR: usize = 256 * 1024;

/// A body's stderr on its way to the worker log: line by line, control characters written
/// out, at most [`MAX_LOGGED_STDERR`] bytes per assignment.
#[derive(Debug)]
pub(crate) struct StderrLog {
    /// The assignment's span: lines are logged in it wherever they are read (a reader task,
    /// or a persistent body's reader that outlives the assignment: see [`StderrLog::follow`]).
    span: tracing::Span,
    label: String,
    pending: Vec<u8>,
    logged: usize,
    dropped: u64,
}

impl StderrLog {
    pub(crate) fn new(label: String) -> Self {
        Self {
            span: tracing::Span::current(),
            label,
            pending: Vec::new(),
            logged: 0,
            dropped: 0,
        }
    }

    /// From now on lines are logged in the current span (a persistent body's next assignment).
    pub(crate) fn follow(&mut self) {
        self.span = tracing::Span::current();
    }

    /// Takes the next bytes read from stderr.
    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
        while let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            self.line(&line[..end]);
        }
        if self.pending.len() > MAX_LOGGED_LINE {
            let line = std::mem::take(&mut self.pending);
            self.line(&line);
        }
    }

    fn line(&mut self, line: &[u8]) {
        if self.logged >= MAX_LOGGED_STDERR {
            self.dropped += line.len() as u64 + 1;
            return;
        }
        let kept = &line[..line.len().min(MAX_LOGGED_LINE)];
        self.logged += kept.len() + 1;
        let text = String::from_utf8_lossy(kept);
        let text = perago_core::result::escape_controls(text.trim_end());
        if !text.is_empty() {
            self.span
                .in_scope(|| tracing::info!(stream = "stderr", source = %self.label, "{text}"));
        }
    }

    /// The assignment is over: logs what is left and how much was dropped, and starts the
    /// next assignment's allowance.
    pub(crate) fn finish(&mut self) {
        let rest = std::mem::take(&mut self.pending);
        self.line(&rest);
        if self.dropped > 0 {
            self.span.in_scope(|| {
                tracing::warn!(
                    stream = "stderr", source = %self.label, dropped_bytes = self.dropped,
                    "… {} bytes of stderr dropped: the log keeps {MAX_LOGGED_STDERR} bytes per assignment",
                    self.dropped
                );
            });
        }
        self.logged = 0;
        self.dropped = 0;
    }
}

/// A body's stderr on its way: lines to the worker log, the last `keep` bytes kept for the
/// failure reason.
#[derive(Debug)]
struct TailLog {
    tail: Vec<u8>,
    keep: usize,
    log: StderrLog,
}

impl TailLog {
    fn new(keep: usize, label: String) -> Self {
        Self {
            tail: Vec::new(),
            keep,
            log: StderrLog::new(label),
        }
    }

    fn feed(&mut self, chunk: &[u8]) {
        self.log.feed(chunk);
        self.tail.extend_from_slice(chunk);
        if self.tail.len() > self.keep * 2 {
            self.tail.drain(..self.tail.len() - self.keep);
        }
    }

    /// The end of the stream: the rest logged, the tail as text.
    fn finish(mut self) -> String {
        self.log.finish();
        if self.tail.len() > self.keep {
            self.tail.drain(..self.tail.len() - self.keep);
        }
        String::from_utf8_lossy(&self.tail).into_owned()
    }
}

async fn read_tail(mut pipe: impl AsyncRead + Unpin, mut log: TailLog) -> String {
    let mut buf = [0u8; 8 * 1024];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => log.feed(&buf[..n]),
        }
    }
    log.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alive_with(marker: &str) -> usize {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter(|e| {
                let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
                String::from_utf8_lossy(&cmdline).contains(marker)
                    && e.file_name()
                        .to_str()
                        .and_then(|p| p.parse().ok())
                        .and_then(perago_sys::proc::stat)
                        .is_some_and(|s| s.state != 'Z')
            })
            .count()
    }

    fn sh(script: &str, dir: &std::path::Path) -> CommandSpec {
        CommandSpec {
            program: PathBuf::from("/bin/sh"),
            args: vec!["-c".to_owned(), script.to_owned()],
            dir: dir.to_owned(),
            env: Vec::new(),
            label: "body".to_owned(),
            user: None,
            memory_limit: None,
        }
    }

    #[tokio::test]
    async fn drain_now_reads_what_a_pipe_holds_and_gives_it_back_while_it_is_open() {
        use std::io::Write as _;
        let (write, read) = pipe::pipe().unwrap();
        let read = read.into_nonblocking_fd().unwrap();
        let mut write = std::fs::File::from(write.into_blocking_fd().unwrap());
        write.write_all(b"first").unwrap();
        let mut got = Vec::new();
        let read = drain_now(read, |c| got.extend_from_slice(c)).expect("still open");
        assert_eq!(got, b"first");
        write.write_all(b" second").unwrap();
        drop(write);
        assert!(
            drain_now(read, |c| got.extend_from_slice(c)).is_none(),
            "at its end"
        );
        assert_eq!(got, b"first second");
    }

    #[tokio::test]
    async fn a_body_that_exits_at_once_has_its_stdout_and_stderr_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let script = "printf '{\"ok\": true}'; printf 'one\\ntwo' >&2; exit 3";
        let whole = run(&sh(script, dir.path()), Vec::new(), RunLimits::default())
            .await
            .unwrap();
        assert_eq!(whole.ended, Ended::Exited(3));
        assert_eq!(whole.stdout, br#"{"ok": true}"#);
        assert_eq!(whole.stderr_tail, "one\ntwo");
        let capped = RunLimits {
            max_stdout: 4,
            stderr_tail: 3,
            ..RunLimits::default()
        };
        let cut = run(&sh(script, dir.path()), Vec::new(), capped)
            .await
            .unwrap();
        assert_eq!(
            (cut.stdout.as_slice(), cut.stdout_overflow),
            (&b"{\"ok"[..], true)
        );
        assert_eq!(cut.stderr_tail, "two");
    }

    #[tokio::test]
    async fn a_double_forked_setsid_daemon_holding_stdout_neither_delays_nor_spoils_the_result() {
        perago_sys::reaper::become_subreaper().unwrap();
        let marker = format!("9000.{}1", std::process::id());
        let dir = tempfile::tempdir().unwrap();
        // The body exits only once the daemon has left its group and session.
        let script = format!(
            "(setsid sh -c 'touch detached; exec sleep {marker}' &)\n\
             while [ ! -e detached ]; do sleep 0.01; done\n\
             echo '{{\"ok\": true}}'"
        );
        let run = run(&sh(&script, dir.path()), Vec::new(), RunLimits::default())
            .await
            .unwrap();
        assert_eq!(run.ended, Ended::Exited(0));
        assert_eq!(
            String::from_utf8_lossy(&run.stdout).trim(),
            r#"{"ok": true}"#
        );
        assert!(
            run.elapsed < PIPE_DRAIN_LIMIT,
            "the result waited on the daemon: {:?}",
            run.elapsed
        );
        assert_eq!(alive_with(&marker), 0, "the daemon outlived the body");
    }

    #[test]
    fn oom_reasons_name_the_peak_and_the_limit() {
        let memory = MemoryOutcome {
            limit: 2 << 30,
            peak: Some((2 << 30) - 4096),
            oom_kills: 1,
        };
        assert_eq!(oom_reason(&memory), "OOM-killed at 2.0 GiB (limit 2 GiB)");
        let memory = MemoryOutcome {
            limit: 64_000_000,
            peak: None,
            oom_kills: 1,
        };
        assert_eq!(oom_reason(&memory), "OOM-killed (limit 61.0 MiB)");
    }

    /// Needs a writable memory cgroup (this project's machines and CI: root, cgroup v1); fails
    /// saying so elsewhere.
    #[tokio::test]
    async fn a_body_past_its_memory_limit_is_oom_killed_in_its_own_cgroup_which_then_goes() {
        perago_sys::reaper::become_subreaper().unwrap();
        let dir = tempfile::tempdir().unwrap();
        // dd's one 128 MiB buffer, filled from /dev/zero: every page touched.
        let mut spec = sh(
            "cat /proc/self/cgroup >&2; dd if=/dev/zero of=/dev/null bs=128M count=1; echo '{}'",
            dir.path(),
        );
        spec.memory_limit = Some(32 << 20);
        let run = run(&spec, Vec::new(), RunLimits::default())
            .await
            .unwrap_or_else(|e| panic!("this test needs a writable memory cgroup: {e}"));
        let memory = run.memory.expect("a limited run reports its cgroup");
        assert!(
            memory.oom_kills >= 1,
            "{memory:?}; stderr: {}",
            run.stderr_tail
        );
        assert_eq!(memory.limit, 32 << 20);
        assert!(
            memory.peak.is_some_and(|p| p > 16 << 20 && p <= 32 << 20),
            "{memory:?}"
        );
        // The shell went on after dd was killed (exit 0): not a failure of the run itself.
        assert!(
            run.stderr_tail.contains("perago-body-"),
            "the body ran in its cgroup: {}",
            run.stderr_tail
        );
        let located = body_cgroups().unwrap();
        let name = run
            .stderr_tail
            .split(['/', '\n'])
            .find(|part| part.starts_with("perago-body-"))
            .unwrap()
            .to_owned();
        assert!(
            !located.body_parent().join(&name).exists(),
            "the cgroup {name} is removed after the run"
        );
        // The executor's own cgroup is not the body's.
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        assert!(!own.contains("perago-body-"), "{own}");
    }

    #[tokio::test]
    async fn a_background_job_of_a_timed_out_body_is_killed_with_it() {
        perago_sys::reaper::become_subreaper().unwrap();
        let marker = format!("9000.{}2", std::process::id());
        let limits = RunLimits {
            timeout: Some(Duration::from_millis(300)),
            kill_grace: Duration::from_millis(200),
            ..RunLimits::default()
        };
        // The shell ignores SIGTERM; its setsid child is outside the group the limit signals.
        let script = format!("trap '' TERM; setsid sleep {marker} & wait");
        let dir = tempfile::tempdir().unwrap();
        let run = run(&sh(&script, dir.path()), Vec::new(), limits)
            .await
            .unwrap();
        assert_eq!(run.ended, Ended::TimedOut);
        assert_eq!(alive_with(&marker), 0, "the job outlived the body");
    }
}
