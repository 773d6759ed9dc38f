//! The `jsonl` body protocol (SPEC §2): one long-lived body process per executor, so bodies in
//! any language pay their start-up once. Per assignment the executor writes one request line
//!
//! ```json
//! {"execution_id": "…", "task_id": "…", "workflow_id": "…", "worker_id": "…", "params": {…}, "workspace_dir": "…"}
//! ```
//!
//! and reads one response line with the same execution id:
//! `{"execution_id": "…", "result": …}` or
//! `{"execution_id": "…", "error": {"message": "…", "terminal": false}}` (`terminal` a boolean
//! or absent; `result` with a non-null `error` is no answer).
//! A process that exits, writes something else, or overruns the time limit fails the
//! assignment; it is stopped (its whole process group) and started again for the next one.
//!
//! A fault is charged to the assignment that caused it, never to the next one. An answer that
//! comes with more (a second line in the same read) fails its own assignment. Before each
//! request the process must be alive, with its stdin open and nothing unread on its stdout:
//! a process that exited after its answer, closed its stdin, or wrote a line after its answer
//! was read, is replaced (logged against the execution it last answered, which has been
//! reported already) and the request goes to a fresh one. A request the process never took
//! (it exited, or closed its stdin, with every byte of the request still in the pipe) goes
//! once to a fresh process; a repeat of the answer before, read while waiting for this
//! one, is skipped, and the process replaced after this assignment.

mod line;

pub(crate) use line::Request;
use line::{Answer, ProtocolError, answer};

use crate::command::{CommandSpec, SoftLimit};
use perago_core::json::RawJson;
use perago_sys::{
    Child, Managed,
    fd::{pipe_states, readable_bytes, set_pipe_size},
    reaper::kill_adopted,
    signal::{SIGKILL, signal_group},
};
use serde_json::json;
use std::{collections::VecDeque, sync::Arc, time::Duration};
use tokio::{
    io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader},
    net::unix::pipe,
    sync::Mutex,
};

/// How long a process that closed its stdout gets to show its exit status, for the reason.
const EXIT_PATIENCE: Duration = Duration::from_millis(500);

/// Bytes of stderr kept for failure reasons.
const STDERR_TAIL: usize = 2048;
/// How long the end of an assignment waits for the body's stderr reader to take what is left.
const STDERR_SETTLE: std::time::Duration = std::time::Duration::from_millis(100);

/// The buffer asked for on the pipes to and from the body.
const PIPE_BYTES: usize = 1024 * 1024;

/// The read buffer on the body's stdout: a pipe's capacity, so a long answer line is read in
/// as few calls as the pipe allows.
const STDOUT_BUFFER: usize = 64 * 1024;

/// The request and answer lines are written and read into buffers kept from one assignment to
/// the next (a large payload then costs no new allocation, nor the page faults a fresh one
/// brings); one that grew past this is let go.
const KEPT_LINE_BYTES: usize = 8 * 1024 * 1024;

/// The longest answer line read, its newline included: the largest output Conductor takes
/// ([`MAX_OUTPUT_BYTES`](crate::assignment::MAX_OUTPUT_BYTES)) and room for the envelope and
/// the escapes around it. A body writing more, or an endless line, fails its assignment
/// terminally (no retry would make its answer fit) and the process is replaced, instead of
/// the executor holding whatever it wrote.
pub(crate) const MAX_LINE_BYTES: usize = crate::assignment::MAX_OUTPUT_BYTES + 1024 * 1024;

/// How one call ended, when it did not produce a result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum JsonlFailure {
    /// The body answered with an error.
    Error { message: String, terminal: bool },
    /// The process or the protocol broke; the reason and the stderr tail.
    Broken { reason: String, stderr_tail: String },
}

struct Running {
    child: Child,
    /// The process's pid and group, kept out of `kill_adopted` while it runs.
    managed: Managed,
    stdin: pipe::Sender,
    stdout: BufReader<pipe::Receiver>,
    /// The request line being written.
    request: String,
    /// The answer line being read.
    line: String,
    /// A second descriptor of the stderr pipe's read end, to see whether the reader has taken
    /// everything the body wrote (see [`JsonlBody::call`]).
    stderr_pending: std::os::fd::OwnedFd,
    /// A second descriptor of the stdin pipe's write end, never written to: its error
    /// readiness wakes the exchange when the body closes its stdin (every reader gone).
    stdin_closed: pipe::Sender,
    /// The execution whose answer this process gave last.
    answered: Option<String>,
    /// The process wrote a line nobody asked for: replace it after this assignment.
    suspect: bool,
    /// The process's memory cgroup (`body.memory_limit`), for its whole life.
    cgroup: Option<perago_sys::cgroup::BodyCgroup>,
    /// Its OOM kills when the current call began: one more is the call's doing.
    oom_kills: u64,
}

impl Running {
    /// Why the process broke, if its cgroup saw an OOM kill during this call.
    fn oom(&self) -> Option<String> {
        let memory = self.cgroup.as_ref()?.outcome();
        (memory.oom_kills > self.oom_kills).then(|| crate::command::oom_reason(&memory))
    }
}

impl Running {
    /// Why this process cannot take a request now, if it cannot: it exited, closed its stdin
    /// or its stdout, or left something unread on its stdout (a line after its answer).
    fn unfit(&mut self) -> Option<String> {
        use std::os::fd::AsRawFd as _;
        if let Ok(Some(status)) = self.child.try_wait() {
            return Some(format!("exited ({status})"));
        }
        let stdout = self.stdout.get_ref().as_raw_fd();
        // One poll for both ends; the bytes unread are counted only when there are some.
        let [out, into] = pipe_states([stdout, self.stdin.as_raw_fd()]).unwrap_or_default();
        let pending = if out.readable || out.hung_up {
            readable_bytes(stdout).unwrap_or_default()
        } else {
            0
        };
        let unread = self.stdout.buffer().len() + pending;
        if unread > 0 {
            return Some(format!(
                "wrote {unread} bytes on its stdout that no request asked for"
            ));
        }
        if out.hung_up {
            return Some("closed its stdout".to_owned());
        }
        if into.broken {
            return Some("closed its stdin".to_owned());
        }
        None
    }
}

/// The persistent body of one executor.
pub(crate) struct JsonlBody {
    spec: CommandSpec,
    /// The process's peak memory as its cgroup counted it at the end of the last call (0: not
    /// measured).
    last_peak: std::sync::atomic::AtomicU64,
    running: Mutex<Option<Running>>,
    stderr_tail: Arc<std::sync::Mutex<VecDeque<u8>>>,
    stderr_log: Arc<std::sync::Mutex<crate::command::StderrLog>>,
}

impl std::fmt::Debug for JsonlBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonlBody")
            .field("spec", &self.spec)
            .finish()
    }
}

impl JsonlBody {
    pub(crate) fn new(spec: CommandSpec) -> Self {
        Self {
            last_peak: std::sync::atomic::AtomicU64::new(0),
            running: Mutex::new(None),
            stderr_tail: Arc::new(std::sync::Mutex::new(VecDeque::new())),
            stderr_log: Arc::new(std::sync::Mutex::new(crate::command::StderrLog::new(
                spec.label.clone(),
            ))),
            spec,
        }
    }

    fn tail(&self) -> String {
        let tail = self.stderr_tail.lock().expect("not poisoned");
        String::from_utf8_lossy(&tail.iter().copied().collect::<Vec<_>>()).into_owned()
    }

    fn start(&self, env: &[(String, String)]) -> std::io::Result<Running> {
        // Started as a command body is (see `body_spawn`); dropped before it was waited for,
        // it is killed.
        let cgroup = self
            .spec
            .memory_limit
            .map(crate::command::body_cgroup)
            .transpose()?;
        let (mut child, managed) = crate::command::spawn_body(&self.spec, env, cgroup.as_ref())?;
        let pgid = managed.pid();
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        // A megabyte payload crosses in one write and one read each way, not a wake-up of
        // both processes per 64 KiB (best effort: the default size still works).
        {
            use std::os::fd::AsRawFd as _;
            for fd in [stdin.as_raw_fd(), stdout.as_raw_fd()] {
                let _ = set_pipe_size(fd, PIPE_BYTES);
            }
        }
        let stdin = pipe::Sender::from_owned_fd(stdin)?;
        let stdout =
            BufReader::with_capacity(STDOUT_BUFFER, pipe::Receiver::from_owned_fd(stdout)?);
        let stderr = pipe::Receiver::from_owned_fd(child.stderr.take().expect("piped"))?;
        let stderr_pending = {
            use std::os::fd::AsFd as _;
            stderr.as_fd().try_clone_to_owned()?
        };
        let stdin_closed = {
            use std::os::fd::AsFd as _;
            pipe::Sender::from_owned_fd(stdin.as_fd().try_clone_to_owned()?)?
        };
        let tail = Arc::clone(&self.stderr_tail);
        let log = Arc::clone(&self.stderr_log);
        // Stderr is drained for the whole life of the process: into the log (within each
        // assignment's allowance, see `call`), and its end kept for failure reasons. Bytes are
        // read and logged under the log's lock, so `call` can tell (lock held, pipe empty) that
        // everything written so far is logged, in the assignment it was written during.
        tokio::spawn(async move {
            let mut buf = [0u8; 8192];
            loop {
                if stderr.readable().await.is_err() {
                    break;
                }
                let mut log = log.lock().expect("not poisoned");
                let n = match stderr.try_read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    Err(_) => break,
                };
                {
                    let mut t = tail.lock().expect("not poisoned");
                    t.extend(&buf[..n]);
                    while t.len() > STDERR_TAIL {
                        t.pop_front();
                    }
                }
                log.feed(&buf[..n]);
            }
            log.lock().expect("not poisoned").finish();
        });
        tracing::info!(pid = pgid, program = %self.spec.program.display(), "started the jsonl body process");
        Ok(Running {
            child,
            managed,
            stdin,
            stdout,
            request: String::new(),
            line: String::new(),
            stderr_pending,
            stdin_closed,
            answered: None,
            suspect: false,
            cgroup,
            oom_kills: 0,
        })
    }

    /// Stops the process (its whole group, and whatever it left re-parented to this
    /// subreaper) so the next call starts a fresh one.
    async fn discard(running: &mut Option<Running>) {
        if let Some(mut r) = running.take() {
            let _ = signal_group(r.managed.pid(), SIGKILL);
            let _ = r.child.wait().await;
            let cgroup = r.cgroup.take();
            drop(r);
            kill_adopted();
            if let Some(cgroup) = cgroup {
                crate::command::remove_body_cgroup(cgroup);
            }
        }
    }

    /// Ends the assignment's stderr once the pipe `pending` (when the process still runs) has
    /// nothing left unread: the reader reads and logs under the log's lock, so an empty pipe
    /// seen with the lock held means every byte written so far has been logged. A body that
    /// keeps writing is not waited for past [`STDERR_SETTLE`].
    async fn finish_stderr(&self, pending: Option<std::os::fd::RawFd>) {
        let deadline = tokio::time::Instant::now() + STDERR_SETTLE;
        loop {
            {
                let mut log = self.stderr_log.lock().expect("not poisoned");
                let empty = pending.is_none_or(|fd| readable_bytes(fd).is_ok_and(|n| n == 0));
                if empty || tokio::time::Instant::now() >= deadline {
                    log.finish();
                    return;
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    /// Starts the process now if none runs; its pid. Only tests call it (see
    /// [`AssignmentRunner::start_body`](crate::assignment::AssignmentRunner::start_body)).
    pub(crate) async fn start_now(&self, env: &[(String, String)]) -> std::io::Result<u32> {
        let mut guard = self.running.lock().await;
        if guard.is_none() {
            self.stderr_tail.lock().expect("not poisoned").clear();
            *guard = Some(self.start(env)?);
        }
        Ok(guard.as_ref().expect("started above").managed.pid())
    }

    /// The process's peak memory at the end of the last call, as its memory cgroup counted it
    /// over the process's life (`body.memory_limit`; 0: not measured).
    pub(crate) fn last_peak(&self) -> u64 {
        self.last_peak.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The running process's pid (`None` when none runs, or while a call holds it).
    pub(crate) fn pid(&self) -> Option<u32> {
        self.running
            .try_lock()
            .ok()
            .and_then(|r| r.as_ref().map(|r| r.managed.pid()))
    }

    /// Runs one assignment through the persistent process; the answer's `result` comes back
    /// as the text the body wrote.
    pub(crate) async fn call(
        &self,
        execution_id: &str,
        request: &Request<'_>,
        env: &[(String, String)],
        limit: Option<Duration>,
        soft: Option<&SoftLimit>,
    ) -> Result<RawJson, JsonlFailure> {
        let mut guard = self.running.lock().await;
        // The body's stderr lines from now on belong to this assignment.
        self.stderr_log.lock().expect("not poisoned").follow();
        // A process that cannot take the request now is replaced: what it did after its last
        // answer is that assignment's doing (reported already), never this one's.
        if let Some(running) = guard.as_mut()
            && let Some(why) = running.unfit()
        {
            tracing::warn!(
                answered = running.answered.as_deref().unwrap_or_default(),
                "the jsonl body process {why} after its answer for execution {}; it is stopped and a fresh one takes execution {execution_id}",
                running.answered.as_deref().unwrap_or("(none)"),
            );
            Self::discard(&mut guard).await;
        }
        let now = tokio::time::Instant::now();
        let deadline = limit.map(|limit| now + limit);
        let soft = soft.map(|soft| (soft, now + soft.after));
        let mut retried = false;
        let outcome = loop {
            if guard.is_none() {
                self.stderr_tail.lock().expect("not poisoned").clear();
                *guard = Some(self.start(env).map_err(|e| JsonlFailure::Broken {
                    reason: format!(
                        "body could not start: {}",
                        perago_core::errors::DisplayChain(&e)
                    ),
                    stderr_tail: String::new(),
                })?);
            }
            let running = guard.as_mut().expect("started above");
            if let Some(cgroup) = &running.cgroup {
                running.oom_kills = cgroup.outcome().oom_kills;
            }
            let exchange = exchange(running, execution_id, request, soft);
            let outcome = match (deadline, limit) {
                (Some(deadline), Some(limit)) => {
                    match tokio::time::timeout_at(deadline, exchange).await {
                        Ok(r) => r,
                        // The limit is what was left of task.timeout_seconds: whole seconds, up.
                        Err(_) => Err(ProtocolError::TimedOut {
                            seconds: limit.as_secs_f64().ceil(),
                        }),
                    }
                }
                _ => exchange.await,
            };
            match outcome {
                // It never took the request (it was on its way out, or closed its stdin): the
                // request goes, once, to a fresh process.
                Err(ProtocolError::NotTaken { why }) if !retried => {
                    retried = true;
                    tracing::warn!(
                        "the jsonl body process {why} before it took execution {execution_id}; a fresh one takes it"
                    );
                    Self::discard(&mut guard).await;
                }
                outcome => break outcome,
            }
        };
        // What the body wrote to stderr before its answer belongs to this assignment: wait
        // (briefly) until the reader has taken it all, then close the assignment's allowance.
        let pending = guard.as_ref().map(|r| {
            use std::os::fd::AsRawFd as _;
            r.stderr_pending.as_raw_fd()
        });
        self.finish_stderr(pending).await;
        let peak = guard
            .as_ref()
            .and_then(|r| r.cgroup.as_ref())
            .and_then(|c| c.outcome().peak)
            .unwrap_or(0);
        self.last_peak
            .store(peak, std::sync::atomic::Ordering::Relaxed);
        match outcome {
            Ok(answer) => {
                if let Some(running) = guard.as_mut() {
                    running.answered = Some(execution_id.to_owned());
                    if running.suspect {
                        tracing::warn!(
                            "the jsonl body process wrote a line nobody asked for while running execution {execution_id}; it is stopped and a fresh one takes the next"
                        );
                        Self::discard(&mut guard).await;
                    }
                }
                match answer {
                    Answer::Result(result) => Ok(result),
                    Answer::Error { message, terminal } => {
                        Err(JsonlFailure::Error { message, terminal })
                    }
                }
            }
            Err(error) => {
                let too_long = matches!(error, ProtocolError::LineTooLong { .. });
                let mut reason = perago_core::errors::chain(&error);
                // Stdout closes a moment before the exit status is there to read.
                let (exiting, doing) = match error {
                    ProtocolError::StdoutClosed => (true, "while running"),
                    ProtocolError::NotTaken { .. } => (true, "before it took the request for"),
                    _ => (false, "while running"),
                };
                if let Some(r) = guard.as_mut().filter(|_| !too_long)
                    && let Ok(Some(status)) = if exiting {
                        tokio::time::timeout(EXIT_PATIENCE, r.child.wait())
                            .await
                            .map_or(Ok(None), |status| status.map(Some))
                    } else {
                        r.child.try_wait()
                    }
                {
                    reason =
                        format!("body process exited ({status}) {doing} execution {execution_id}");
                }
                if let Some(oom) = guard.as_ref().and_then(Running::oom) {
                    reason = format!("{oom}: {reason}");
                }
                Self::discard(&mut guard).await;
                if too_long {
                    return Err(JsonlFailure::Error {
                        message: reason,
                        terminal: true,
                    });
                }
                Err(JsonlFailure::Broken {
                    reason,
                    stderr_tail: self.tail(),
                })
            }
        }
    }
}

/// Writes the request line and reads the response line; any protocol break is an error. At
/// the soft limit (the instant given) a `{"cancel": "<execution id>"}` line is written
/// meanwhile. A line that repeats the answer to the execution before is skipped (and the
/// process marked suspect); more than one line read with the answer fails it.
async fn exchange(
    running: &mut Running,
    execution_id: &str,
    request: &Request<'_>,
    soft: Option<(&SoftLimit, tokio::time::Instant)>,
) -> Result<Answer, ProtocolError> {
    let Running {
        stdin,
        stdout,
        request: out,
        line,
        stdin_closed,
        answered,
        suspect,
        ..
    } = running;
    out.clear();
    request.write(out);
    // Written here, counting, so that a request the process never took is known as such.
    let mut written = 0;
    let mut failed = None;
    while written < out.len() {
        match stdin.write(&out.as_bytes()[written..]).await {
            Ok(0) => {
                failed = Some(std::io::Error::from(std::io::ErrorKind::WriteZero));
                break;
            }
            Ok(n) => written += n,
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    keep_or_let_go(out);
    if let Some(e) = failed {
        if took_none_of(stdin, written) {
            return Err(ProtocolError::NotTaken {
                why: "closed its stdin",
            });
        }
        return Err(ProtocolError::Write(e));
    }
    let _ = stdin.flush().await;
    let mut soft = soft;
    // Whether a closed stdin still matters: once the request is taken, it does not.
    let mut watch_stdin = true;
    loop {
        line.clear();
        // One byte more than the cap: a line that reaches it is too long, whether or not its
        // newline came with it.
        let mut capped = (&mut *stdout).take(MAX_LINE_BYTES as u64 + 1);
        let read = {
            let mut next = std::pin::pin!(capped.read_line(line));
            loop {
                tokio::select! {
                    read = &mut next => break read,
                    () = async {
                        match soft {
                            Some((_, at)) => tokio::time::sleep_until(at).await,
                            None => std::future::pending().await,
                        }
                    } => {
                        let (limit, _) = soft.take().expect("armed");
                        limit.log("a cancel line");
                        let mut cancel = json!({ "cancel": execution_id }).to_string();
                        cancel.push('\n');
                        // A body that stopped reading shows it in its answer (or its time limit).
                        if stdin.write_all(cancel.as_bytes()).await.is_ok() {
                            written += cancel.len();
                        }
                        let _ = stdin.flush().await;
                    }
                    ready = stdin_closed.ready(tokio::io::Interest::ERROR), if watch_stdin => {
                        // Every reader of its stdin is gone: with the request all unread, it
                        // never will be; taken, the answer may still come.
                        if ready.is_ok() && took_none_of(stdin, written) {
                            return Err(ProtocolError::NotTaken {
                                why: "closed its stdin",
                            });
                        }
                        watch_stdin = false;
                    }
                }
            }
        };
        let too_long = capped.limit() == 0;
        let got = match read {
            _ if too_long => Err(ProtocolError::LineTooLong {
                limit: MAX_LINE_BYTES,
            }),
            Ok(0) => {
                if took_none_of(stdin, written) {
                    return Err(ProtocolError::NotTaken { why: "exited" });
                }
                Err(ProtocolError::StdoutClosed)
            }
            Ok(_) => {
                // As `lines()` gives it: without its `\n` or `\r\n`.
                if line.ends_with('\n') {
                    line.pop();
                    if line.ends_with('\r') {
                        line.pop();
                    }
                }
                answer(line, execution_id)
            }
            Err(e) => Err(ProtocolError::Read(e)),
        };
        keep_or_let_go(line);
        match got {
            // A late repeat for the execution before: that one's doing, not this one's.
            Err(ProtocolError::OtherExecution {
                ref answered_for, ..
            }) if answered
                .as_deref()
                .is_some_and(|a| *answered_for == json!(a)) =>
            {
                tracing::warn!(
                    "the jsonl body process wrote another line for execution {answered_for} while running execution {execution_id}; skipped"
                );
                *suspect = true;
            }
            Ok(answer) => {
                use std::os::fd::AsRawFd as _;
                let more = stdout.buffer().len()
                    + readable_bytes(stdout.get_ref().as_raw_fd()).unwrap_or_default();
                if more > 0 {
                    return Err(ProtocolError::MoreThanTheAnswer {
                        execution_id: execution_id.to_owned(),
                        bytes: more,
                    });
                }
                return Ok(answer);
            }
            Err(e) => return Err(e),
        }
    }
}

/// Whether the body has taken none of the `written` bytes on its stdin: they are all still
/// in the pipe.
fn took_none_of(stdin: &pipe::Sender, written: usize) -> bool {
    use std::os::fd::AsRawFd as _;
    readable_bytes(stdin.as_raw_fd()).is_ok_and(|unread| unread == written)
}

/// Lets a line buffer go when it grew past [`KEPT_LINE_BYTES`].
fn keep_or_let_go(buffer: &mut String) {
    if buffer.capacity() > KEPT_LINE_BYTES {
        *buffer = String::new();
    }
}
