//! `status`: read a running runtime's state over `Admin.Status` and print it for a person
//! (a table) or a program (`--json`); `status --watch` follows it over `Admin.Watch`.

use crate::{
    cli::{Probe, StatusArgs},
    errors::ExpectedError,
    runtime::root::runtime_dir,
};
use perago_core::{manifest::Manifest, memory::format_bytes};
use perago_proto::admin::v1::{
    BrokerCounters, Capacity, SlotState, StatusRequest, StatusResponse, WatchRequest,
    admin_client::AdminClient,
};
use serde_json::{Value, json};
use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::PathBuf,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

/// `status` or a probe found no runtime, or a ready probe found it draining or paused.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// Nothing answers on the socket.
    #[error("no perago runtime answers at {}", socket.display())]
    NoAnswer {
        /// The runtime's socket.
        socket: PathBuf,
        /// Why there is no answer.
        #[source]
        cause: NoAnswer,
    },
    /// `--probe ready`: the broker answers but does not serve (it is draining).
    #[error("the broker at {} is {status} (draining)", socket.display())]
    NotServing {
        /// The runtime's socket.
        socket: PathBuf,
        /// The health status's name.
        status: &'static str,
    },
    /// `--probe ready`: the broker answers but does not serve: its polling is paused.
    #[error(
        "the broker at {} is {status} (paused: `perago-supervisor resume` resumes it)",
        socket.display()
    )]
    Paused {
        /// The runtime's socket.
        socket: PathBuf,
        /// The health status's name.
        status: &'static str,
    },
}

/// Why a runtime's socket gave no answer. Its text is the whole of the why (tonic's wrappers
/// say nothing an operator can use), so it is the end of the chain: no variant has a source.
#[derive(Debug, thiserror::Error)]
pub enum NoAnswer {
    /// Connecting or calling took longer than 5 s.
    #[error("no answer within 5 s")]
    Timeout,
    /// The connection failed; the text is its causes' (`Connection refused …`), without
    /// tonic's `transport error`.
    #[error("{}", perago_core::errors::causes(.0).unwrap_or_else(|| .0.to_string()))]
    Connect(tonic::transport::Error),
    /// The call failed; the text is the status's message.
    #[error("{}", cell(.0.message(), 500))]
    Call(Box<tonic::Status>),
}

/// The broker sockets to ask: `--socket`; each manifest's runtime (through its workspace
/// root, as `start` placed it, or the running supervisors' records); or, with neither, every
/// runtime of every running supervisor of this user.
pub(crate) fn sockets_of(
    socket: Option<&PathBuf>,
    manifests: &[PathBuf],
    vars: &BTreeMap<String, String>,
) -> Result<Vec<PathBuf>, ExpectedError> {
    if let Some(socket) = socket {
        return Ok(vec![socket.clone()]);
    }
    let registry_dir = crate::runtime::registry::dir(vars);
    let running = match crate::runtime::registry::running(&registry_dir) {
        Ok(found) => {
            for skipped in &found.skipped {
                eprintln!(
                    "warning: ignoring the supervisor record {}",
                    cell(skipped, 500)
                );
            }
            Ok(found.records)
        }
        Err(e) => Err(e),
    };
    if manifests.is_empty() {
        let running =
            running.map_err(|e| ExpectedError::Config(vec![perago_core::errors::chain(&e)]))?;
        let sockets: Vec<PathBuf> = running
            .into_iter()
            .flat_map(|r| r.runtimes.into_iter().map(|e| e.socket))
            .collect();
        if sockets.is_empty() {
            return Err(ExpectedError::Config(vec![format!(
                "no perago supervisor of this user is running (none is recorded in {}); give the task's MANIFEST or --socket PATH",
                registry_dir.display()
            )]));
        }
        return Ok(sockets);
    }
    // With manifests the records only help find a supervisor of several task types: a folder
    // that cannot be trusted is said, and the sockets are found through the roots alone.
    let running = running.unwrap_or_else(|e| {
        eprintln!("warning: {}", perago_core::errors::DisplayChain(&e));
        Vec::new()
    });
    let several = manifests.len() > 1;
    let mut sockets = Vec::new();
    for path in manifests {
        let manifest = Manifest::load(path)?;
        sockets.push(socket_of_task(&manifest.task.name, vars, several, &running));
    }
    Ok(sockets)
}

/// The broker socket of the task `name`'s runtime: through its workspace root, as `start`
/// placed it, or the running supervisors' records.
pub(crate) fn socket_of_task(
    name: &str,
    vars: &BTreeMap<String, String>,
    several: bool,
    running: &[crate::runtime::registry::Record],
) -> PathBuf {
    let root = crate::start::workspace_root_of(name, vars, several);
    let root = std::fs::canonicalize(&root).unwrap_or(root);
    let socket = runtime_dir(&root, vars).join("broker.sock");
    // A supervisor of several task types keeps each root in a folder of its own.
    let recorded = running
        .iter()
        .flat_map(|r| &r.runtimes)
        .find(|e| e.task == name)
        .map(|e| e.socket.clone());
    match recorded {
        Some(recorded) if !socket.exists() => recorded,
        _ => socket,
    }
}

/// The widest a worker id, task id or phase column grows; longer values are cut with `…`.
const MAX_CELL_CHARS: usize = 64;

/// `text` for a terminal: every control character (newline and tab too, since a cell is one
/// line) and every invisible reordering mark written out (`\x1b`, `\n`, `\u{202e}`), then cut
/// to `max` characters with `…`. What a broker or Conductor sends cannot move the cursor,
/// recolour or rewrite the operator's screen, or stretch a column past `max`.
pub(crate) fn cell(text: &str, max: usize) -> String {
    let invisible = |c: char| {
        c.is_control()
            || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
    };
    let mut out = String::new();
    let mut count = 0;
    for c in text.chars() {
        let piece = match c {
            '\n' => "\\n".to_owned(),
            '\t' => "\\t".to_owned(),
            '\r' => "\\r".to_owned(),
            '\0' => "\\0".to_owned(),
            c if invisible(c) && (c as u32) < 0x100 => format!("\\x{:02x}", c as u32),
            c if invisible(c) => format!("\\u{{{:x}}}", c as u32),
            c => c.to_string(),
        };
        out.push_str(&piece);
        count += piece.chars().count();
        if count > max {
            break;
        }
    }
    if count > max {
        out = out.chars().take(max.saturating_sub(1)).collect();
        out.push('…');
    }
    out
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn state_name(state: i32) -> &'static str {
    match SlotState::try_from(state) {
        Ok(SlotState::Waiting) => "waiting",
        Ok(SlotState::Idle) => "idle",
        Ok(SlotState::Busy) => "busy",
        Ok(SlotState::Stopping) => "stopping",
        Ok(SlotState::Exited) => "exited",
        Ok(SlotState::Retired) => "retired",
        _ => "unknown",
    }
}

pub(crate) fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{:.1}s", d.as_secs_f64()),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// Every counter of the broker, by its name in the .proto (the one list), in its order.
fn counters_json(c: &BrokerCounters) -> Value {
    serde_json::to_value(c).expect("counters always serialize")
}

fn capacity_json(c: &Capacity) -> Value {
    let off_if_zero = |n: u64| (n > 0).then_some(n);
    json!({
        "once": c.once,
        "max_tasks_per_executor": off_if_zero(c.max_tasks_per_executor),
        "max_executor_memory_bytes": off_if_zero(c.max_executor_memory_bytes),
        "min_executors": c.min_executors, "max_executors": c.max_executors,
        "wanted_executors": c.wanted_executors,
        "scale_down_after_ms": c.scale_down_after_ms,
        "min_free_memory_bytes": off_if_zero(c.min_free_memory_bytes),
        "poison_after": c.poison_after,
        "queue_depth": (c.queue_depth >= 0).then_some(c.queue_depth),
        "available_memory_bytes": off_if_zero(c.available_memory_bytes),
        "admission_open": c.admission_open,
        "admission_reason": c.admission_reason,
        "memory_headroom_bytes": off_if_zero(c.memory_headroom_bytes),
        "max_runtime_ms": off_if_zero(c.max_runtime_ms),
        "time_left_ms": (c.max_runtime_ms > 0).then_some(c.time_left_ms),
        "profile": {
            "executions": c.profile_executions,
            "duration_mean_ms": (c.profile_executions > 0).then_some(c.profile_duration_mean_ms),
            "duration_p95_ms": (c.profile_executions > 0).then_some(c.profile_duration_p95_ms),
            "peak_memory_bytes": off_if_zero(c.profile_peak_memory_bytes),
        },
    })
}

/// The capacity lines of the table: only what is on, plus the live figures.
fn capacity_table(c: &Capacity) -> String {
    let mut parts = Vec::new();
    if c.min_executors < c.max_executors {
        parts.push(format!(
            "executors {}..{} (wanted {}, scale down after {})",
            c.min_executors,
            c.max_executors,
            c.wanted_executors,
            human(Duration::from_millis(c.scale_down_after_ms))
        ));
    }
    if c.once {
        parts.push("run once".to_owned());
    }
    if c.max_tasks_per_executor > 0 {
        parts.push(format!("recycle after {} tasks", c.max_tasks_per_executor));
    }
    if c.max_executor_memory_bytes > 0 {
        parts.push(format!(
            "recycle above {}",
            format_bytes(c.max_executor_memory_bytes)
        ));
    }
    if c.min_free_memory_bytes > 0 {
        parts.push(format!(
            "min free memory {}",
            format_bytes(c.min_free_memory_bytes)
        ));
    }
    if c.memory_headroom_bytes > 0 {
        parts.push(format!(
            "memory headroom {}",
            format_bytes(c.memory_headroom_bytes)
        ));
    }
    if c.max_runtime_ms > 0 {
        parts.push(format!(
            "max runtime {}",
            human(Duration::from_millis(c.max_runtime_ms))
        ));
    }
    parts.push(if c.poison_after > 0 {
        format!("poison after {} crashes", c.poison_after)
    } else {
        "poison detection off".to_owned()
    });
    let mut out = format!("capacity: {}\n", parts.join(", "));
    let mut live = Vec::new();
    if c.queue_depth >= 0 {
        live.push(format!("queue depth {}", c.queue_depth));
    }
    if c.available_memory_bytes > 0 {
        live.push(format!(
            "available memory {}",
            format_bytes(c.available_memory_bytes)
        ));
    }
    if c.profile_executions > 0 {
        let mut profile = format!(
            "profile of {} executions: mean {}, p95 {}",
            c.profile_executions,
            human(Duration::from_millis(c.profile_duration_mean_ms)),
            human(Duration::from_millis(c.profile_duration_p95_ms))
        );
        if c.profile_peak_memory_bytes > 0 {
            let _ = write!(
                profile,
                ", peak {}",
                format_bytes(c.profile_peak_memory_bytes)
            );
        }
        live.push(profile);
    }
    if c.max_runtime_ms > 0 {
        live.push(format!(
            "{} left",
            human(Duration::from_millis(c.time_left_ms))
        ));
    }
    live.push(if c.admission_open {
        "admission open".to_owned()
    } else if c.admission_reason.is_empty() {
        "admission CLOSED".to_owned()
    } else {
        format!("admission CLOSED: {}", cell(&c.admission_reason, 200))
    });
    let _ = writeln!(out, "now: {}", live.join(", "));
    out
}

/// The status as JSON (snake_case, as the proto fields).
pub(crate) fn to_json(status: &StatusResponse) -> Value {
    json!({
        "task_name": status.task_name,
        "domain": status.domain,
        "broker_worker_id": status.broker_worker_id,
        "broker_pid": status.broker_pid,
        "started_at_unix_ms": status.started_at_unix_ms,
        "draining": status.draining,
        "paused": status.paused,
        "paused_since_unix_ms": status.paused_since_unix_ms,
        "body_version": body_version(status.body_version),
        "rolling": status.rolling,
        "slots": status.slots.iter().map(|s| json!({
            "slot": s.slot, "worker_id": s.worker_id, "generation": s.generation, "pid": s.pid,
            "state": state_name(s.state), "task_id": s.task_id, "execution_id": s.execution_id,
            "busy_since_unix_ms": s.busy_since_unix_ms, "phase": s.phase, "recycling": s.recycling,
            "last_body_peak_memory_bytes": (s.last_body_peak_memory_bytes > 0).then_some(s.last_body_peak_memory_bytes),
            "max_body_peak_memory_bytes": (s.max_body_peak_memory_bytes > 0).then_some(s.max_body_peak_memory_bytes),
            "body_version": body_version(s.body_version),
        })).collect::<Vec<_>>(),
        "counters": status.counters.as_ref().map(counters_json),
        "capacity": status.capacity.as_ref().map(capacity_json),
        "execution_mode": status.settings.as_ref().map(|s| s.execution_mode.clone()),
        "sdk_settings": status.settings.as_ref().map(|s| s.sdk_settings.iter().map(|x| json!({
            "property": x.property, "value": x.value, "variable": x.variable,
        })).collect::<Vec<_>>()).unwrap_or_default(),
        "poll_timeout_ms": status.settings.as_ref().map(|s| s.poll_timeout_ms).filter(|ms| *ms > 0),
        "poll_interval_ms": status.settings.as_ref().filter(|s| s.poll_timeout_ms > 0).map(|s| s.poll_interval_ms),
        "soft_time_limit_ms": status.soft_time_limit_ms,
        "reconfigured_at_unix_ms": status.reconfigured_at_unix_ms,
        "share": status.share.as_ref().map(|s| json!({
            "limit": s.limit, "epoch": s.epoch, "held": s.held, "fillable": s.fillable,
            "empty": s.empty, "started": s.started,
        })),
    })
}

/// The live settings a reload changes, when there is one to show: a soft time limit, or any
/// that a reload changed (`Admin.Reconfigure`).
fn live_settings_line(status: &StatusResponse, now: i64) -> Option<String> {
    let soft = status.soft_time_limit_ms?;
    if soft == 0 && status.reconfigured_at_unix_ms == 0 {
        return None;
    }
    let mut line = match soft {
        0 => "soft time limit none".to_owned(),
        ms => format!("soft time limit {}", human(Duration::from_millis(ms))),
    };
    if status.reconfigured_at_unix_ms > 0 {
        let ago = Duration::from_millis(
            u64::try_from(now.saturating_sub(status.reconfigured_at_unix_ms)).unwrap_or(0),
        );
        let _ = write!(line, " (changed by a reload {} ago)", human(ago));
    }
    Some(line)
}

/// A body version as a broker reports it: 0 (a broker of before body versions) is version 1.
fn body_version(v: u32) -> u32 {
    v.max(1)
}

/// The body version line: the version new executors start with and, during a roll, the slots
/// still at an older one.
fn body_line(status: &StatusResponse) -> String {
    let current = body_version(status.body_version);
    let mut line = format!("body version {current}");
    if status.rolling {
        let older: Vec<String> = status
            .slots
            .iter()
            .filter(|s| s.generation > 0 && body_version(s.body_version) < current)
            .map(|s| format!("{} (v{})", s.slot, body_version(s.body_version)))
            .collect();
        let _ = write!(
            line,
            "  rolling: slots at an older version: {}",
            older.join(", ")
        );
    }
    line
}

/// The status as a table for a terminal.
pub(crate) fn to_table(status: &StatusResponse) -> String {
    let now = now_ms();
    let up = Duration::from_millis(
        u64::try_from(now.saturating_sub(status.started_at_unix_ms)).unwrap_or(0),
    );
    // The domain is shown only when there is one: no domain is the usual case.
    let domain = if status.domain.is_empty() {
        String::new()
    } else {
        format!("  domain {}", cell(&status.domain, MAX_CELL_CHARS))
    };
    let paused = if status.paused {
        let since = Duration::from_millis(
            u64::try_from(now.saturating_sub(status.paused_since_unix_ms)).unwrap_or(0),
        );
        format!("yes (for {})", human(since))
    } else {
        "no".to_owned()
    };
    let mut out = format!(
        "task {}{domain}  broker {} (pid {})  up {}  draining {}  paused {paused}\n",
        cell(&status.task_name, MAX_CELL_CHARS),
        cell(&status.broker_worker_id, MAX_CELL_CHARS),
        status.broker_pid,
        human(up),
        if status.draining { "yes" } else { "no" }
    );
    if let Some(settings) = &status.settings {
        let mut line = format!(
            "execution mode {}",
            cell(&settings.execution_mode, MAX_CELL_CHARS)
        );
        if !settings.sdk_settings.is_empty() {
            let sdk: Vec<String> = settings
                .sdk_settings
                .iter()
                .map(|x| {
                    format!(
                        "{}={} ({})",
                        cell(&x.property, MAX_CELL_CHARS),
                        cell(&x.value, MAX_CELL_CHARS),
                        cell(&x.variable, MAX_CELL_CHARS)
                    )
                })
                .collect();
            let _ = write!(line, "  SDK settings: {}", sdk.join(", "));
        }
        // 0: a broker of before the poll settings were reported.
        if settings.poll_timeout_ms > 0 {
            let _ = write!(line, "  long poll {}ms", settings.poll_timeout_ms);
            if settings.poll_interval_ms > 0 {
                let _ = write!(
                    line,
                    ", {}ms after an empty poll",
                    settings.poll_interval_ms
                );
            }
        }
        let _ = writeln!(out, "{line}");
    }
    if let Some(line) = live_settings_line(status, now) {
        let _ = writeln!(out, "{line}");
    }
    // Capacity shared across task types (`start --pool`, concurrency groups).
    if let Some(share) = &status.share {
        let _ = writeln!(
            out,
            "shared capacity: {} of {} permits held, {} more could start{}",
            share.held,
            share.limit,
            share.fillable,
            if share.empty {
                " (its last poll came back empty)"
            } else {
                ""
            }
        );
    }
    let _ = writeln!(out, "{}", body_line(status));
    let worker_ids: Vec<String> = status
        .slots
        .iter()
        .map(|s| cell(&s.worker_id, MAX_CELL_CHARS))
        .collect();
    let width = worker_ids
        .iter()
        .map(|id| id.chars().count())
        .max()
        .unwrap_or(9)
        .max(9);
    let _ = writeln!(
        out,
        "SLOT  {:<width$}  GEN  PID      STATE     BODY  PHASE       BUSY     TASK ID / EXECUTION ID",
        "WORKER ID"
    );
    for (s, worker_id) in status.slots.iter().zip(&worker_ids) {
        let busy = if s.busy_since_unix_ms > 0 {
            human(Duration::from_millis(
                u64::try_from(now.saturating_sub(s.busy_since_unix_ms)).unwrap_or(0),
            ))
        } else {
            String::new()
        };
        let ids = if s.task_id.is_empty() {
            String::new()
        } else {
            format!(
                "{} / {}",
                cell(&s.task_id, MAX_CELL_CHARS),
                cell(&s.execution_id, MAX_CELL_CHARS)
            )
        };
        let _ = writeln!(
            out,
            "{:<4}  {:<width$}  {:<3}  {:<7}  {:<8}  {:<4}  {:<10}  {:<7}  {}",
            s.slot,
            worker_id,
            s.generation,
            s.pid,
            state_name(s.state),
            format!("v{}", body_version(s.body_version)),
            cell(&s.phase, MAX_CELL_CHARS),
            busy,
            ids
        );
    }
    // body.memory_limit: what each slot's bodies peaked at, where their cgroups measured it.
    let peaks: Vec<String> = status
        .slots
        .iter()
        .filter(|s| s.max_body_peak_memory_bytes > 0)
        .map(|s| {
            format!(
                "slot {} last {} max {}",
                s.slot,
                format_bytes(s.last_body_peak_memory_bytes),
                format_bytes(s.max_body_peak_memory_bytes)
            )
        })
        .collect();
    if !peaks.is_empty() {
        let _ = writeln!(out, "body memory peaks: {}", peaks.join(", "));
    }
    if let Some(c) = &status.counters {
        let listed: Vec<String> = counters_json(c)
            .as_object()
            .expect("a message serializes to an object")
            .iter()
            .map(|(name, value)| format!("{} {value}", name.replace('_', " ")))
            .collect();
        let _ = writeln!(out, "counters: {}", listed.join(", "));
    }
    if let Some(c) = &status.capacity {
        out.push_str(&capacity_table(c));
        // `scale` lowered a fixed count: the table lists more slots than run.
        if c.min_executors == c.max_executors && status.slots.len() > c.max_executors as usize {
            let _ = writeln!(
                out,
                "executors {} (scaled down: the slots above it are retired)",
                c.max_executors
            );
        }
    }
    out
}

/// The largest `staging-branches.json` read (thousands of entries).
const MAX_LEFTOVERS_BYTES: u64 = 1024 * 1024;

/// The staging branches the supervisor's GC could not delete yet (SPEC §9), from the file it
/// keeps beside the broker socket: none when there is no such file; an error naming the file
/// when it is not a regular file (a symlink is not followed), is too big or is not the list.
pub(crate) fn staging_left(socket: &std::path::Path) -> Result<Vec<Value>, String> {
    let path = socket.with_file_name(crate::runtime::gc::LEFTOVERS_FILE);
    let text = match perago_core::files::read_regular_nofollow(&path, MAX_LEFTOVERS_BYTES) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(format!(
                "cannot read {}: {}",
                path.display(),
                perago_core::errors::DisplayChain(&e)
            ));
        }
    };
    serde_json::from_str::<Vec<Value>>(&text).map_err(|e| {
        format!(
            "cannot read {}: not a list of branches: {}",
            path.display(),
            perago_core::errors::DisplayChain(&e)
        )
    })
}

/// The table lines for `left`: nothing when it is empty.
pub(crate) fn staging_table(left: &[Value]) -> String {
    let mut out = String::new();
    if left.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "staging branches left by killed executors ({}; the GC retries every interval):",
        left.len()
    );
    for entry in left {
        let text = |name: &str| cell(entry[name].as_str().unwrap_or_default(), 200);
        let _ = writeln!(
            out,
            "  {}/{}  ({})",
            text("repository"),
            text("branch"),
            text("attempt_dir")
        );
    }
    out
}

/// One call to the broker at `socket`: connect, then `call` on the channel, each within 5 s.
pub(crate) fn call_broker<T, Fut>(
    socket: &std::path::Path,
    runtime: &tokio::runtime::Runtime,
    call: impl FnOnce(tonic::transport::Channel) -> Fut,
) -> Result<T, ProbeError>
where
    Fut: Future<Output = Result<T, tonic::Status>>,
{
    runtime.block_on(answer_of(socket, call))
}

/// Connects to the broker at `socket` and makes `call` on the channel, each within 5 s.
async fn answer_of<T, Fut>(
    socket: &std::path::Path,
    call: impl FnOnce(tonic::transport::Channel) -> Fut,
) -> Result<T, ProbeError>
where
    Fut: Future<Output = Result<T, tonic::Status>>,
{
    const PATIENCE: Duration = Duration::from_secs(5);
    let answer = async {
        let channel = tokio::time::timeout(PATIENCE, perago_core::socket::connect(socket))
            .await
            .map_err(|_| NoAnswer::Timeout)?
            .map_err(NoAnswer::Connect)?;
        tokio::time::timeout(PATIENCE, call(channel))
            .await
            .map_err(|_| NoAnswer::Timeout)?
            .map_err(|s| NoAnswer::Call(Box::new(s)))
    };
    answer.await.map_err(|cause| ProbeError::NoAnswer {
        socket: socket.to_owned(),
        cause,
    })
}

/// `status --watch`: the heartbeat asked of each broker, so that the busy times move.
const WATCH_HEARTBEAT_MS: u32 = 1000;

/// `status --watch` gives up on a runtime that has sent nothing for this long (five
/// heartbeats): its broker is stopped, wedged or gone.
const WATCH_SILENCE: Duration = Duration::from_secs(5);

/// Clears a terminal and puts the cursor at the top, before each redraw of the table.
const CLEAR_SCREEN: &str = "\x1b[H\x1b[2J";

/// `status --watch`: follows every runtime's `Admin.Watch` stream and prints again at each
/// message, until every stream has ended (its broker drained) or the reader went away. A
/// runtime silent for [`WATCH_SILENCE`] is given up on, as one that fails: the command then
/// exits non-zero once the others have ended.
/// Tables: all runtimes each time, redrawn in place on a terminal, else one after the other
/// with a blank line between; `--json`: one line per message, the object of its runtime.
fn watch(
    args: &StatusArgs,
    sockets: &[PathBuf],
    runtime: &tokio::runtime::Runtime,
) -> Result<(), ExpectedError> {
    use std::io::IsTerminal as _;
    let single = sockets.len() == 1;
    let terminal = std::io::stdout().is_terminal();
    runtime.block_on(async {
        // Each stream is read in a task of its own; they all come here: (runtime, message),
        // and the end of a stream as `Ok(None)`.
        let (tx, mut messages) = tokio::sync::mpsc::channel(16);
        let mut failed: Vec<ExpectedError> = Vec::new();
        for (i, socket) in sockets.iter().enumerate() {
            let opened = answer_of(socket, |channel| async move {
                AdminClient::new(channel)
                    .watch(WatchRequest {
                        heartbeat_ms: WATCH_HEARTBEAT_MS,
                    })
                    .await
                    .map(tonic::Response::into_inner)
            })
            .await;
            match opened {
                Ok(mut stream) => {
                    let tx = tx.clone();
                    tokio::spawn(async move {
                        loop {
                            let message =
                                match tokio::time::timeout(WATCH_SILENCE, stream.message()).await {
                                    Ok(message) => message.map_err(|s| NoAnswer::Call(Box::new(s))),
                                    Err(_) => Err(NoAnswer::Timeout),
                                };
                            let end = !matches!(message, Ok(Some(_)));
                            if tx.send((i, message)).await.is_err() || end {
                                return;
                            }
                        }
                    });
                }
                Err(e) if single => return Err(e.into()),
                Err(e) => failed.push(e.into()),
            }
        }
        drop(tx);
        let mut latest: Vec<Option<StatusResponse>> = vec![None; sockets.len()];
        while let Some((i, message)) = messages.recv().await {
            let socket = &sockets[i];
            let status = match message {
                Ok(Some(status)) => status,
                // The broker drained: its last state stays on screen.
                Ok(None) => continue,
                Err(cause) => {
                    failed.push(
                        ProbeError::NoAnswer {
                            socket: socket.clone(),
                            cause,
                        }
                        .into(),
                    );
                    continue;
                }
            };
            let text = if args.json {
                let mut json = to_json(&status);
                json["staging_branches_left"] = Value::from(leftovers(socket));
                latest[i] = Some(status);
                let mut line = serde_json::to_string(&json).expect("json");
                line.push('\n');
                line
            } else {
                latest[i] = Some(status);
                let mut text = String::from(if terminal { CLEAR_SCREEN } else { "" });
                for (status, socket) in latest.iter().zip(sockets) {
                    let Some(status) = status else { continue };
                    text.push_str(&to_table(status));
                    text.push_str(&staging_table(&leftovers(socket)));
                    if !terminal || !single {
                        text.push('\n');
                    }
                }
                text
            };
            if !crate::out::print_while_read(&text)? {
                return Ok(());
            }
        }
        match failed.len() {
            0 => Ok(()),
            1 => Err(failed.remove(0)),
            _ => Err(ExpectedError::Each(failed)),
        }
    })
}

/// The staging branches left beside `socket`, a problem reading them said as a warning.
fn leftovers(socket: &std::path::Path) -> Vec<Value> {
    staging_left(socket).unwrap_or_else(|e| {
        eprintln!("warning: {}", cell(&e, 1000));
        Vec::new()
    })
}

/// `status --probe`: one `grpc.health.v1.Health/Check` of the whole server (service `""`).
fn probe(
    kind: Probe,
    socket: &std::path::Path,
    runtime: &tokio::runtime::Runtime,
) -> Result<(), ExpectedError> {
    use tonic_health::pb::{
        HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
    };
    let status = call_broker(socket, runtime, |channel| async move {
        HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .map(|r| r.into_inner().status())
    })?;
    crate::out::print(&format!("{}\n", status.as_str_name()))?;
    match (kind, status) {
        (Probe::Live, _) | (Probe::Ready, ServingStatus::Serving) => Ok(()),
        (Probe::Ready, other) => {
            // Paused or draining: the status says which (a drain is named first).
            let paused = ask(socket, runtime).is_ok_and(|s| s.paused && !s.draining);
            let (socket, status) = (socket.to_owned(), other.as_str_name());
            Err(if paused {
                ProbeError::Paused { socket, status }
            } else {
                ProbeError::NotServing { socket, status }
            }
            .into())
        }
    }
}

/// One broker's status over its socket.
fn ask(
    socket: &std::path::Path,
    runtime: &tokio::runtime::Runtime,
) -> Result<StatusResponse, ExpectedError> {
    Ok(call_broker(socket, runtime, |channel| async move {
        AdminClient::new(channel)
            .status(StatusRequest {})
            .await
            .map(tonic::Response::into_inner)
    })?)
}

pub(crate) fn status(
    args: &StatusArgs,
    vars: &BTreeMap<String, String>,
) -> Result<(), ExpectedError> {
    let sockets = sockets_of(args.socket.as_ref(), &args.manifests, vars)?;
    let runtime = crate::pause::client_runtime()?;
    if let Some(kind) = args.probe {
        // Every runtime must pass: a probe of a supervisor is a probe of all its task types.
        let failed: Vec<ExpectedError> = sockets
            .iter()
            .filter_map(|socket| probe(kind, socket, &runtime).err())
            .collect();
        return match failed.len() {
            0 => Ok(()),
            1 => Err(failed.into_iter().next().expect("one")),
            _ => Err(ExpectedError::Each(failed)),
        };
    }
    if args.watch {
        return watch(args, &sockets, &runtime);
    }
    let single = sockets.len() == 1;
    let mut json_all = Vec::new();
    let mut text = String::new();
    let mut failed = Vec::new();
    for socket in &sockets {
        let status = match ask(socket, &runtime) {
            Ok(status) => status,
            Err(e) if single => return Err(e),
            Err(e) => {
                failed.push(e);
                continue;
            }
        };
        let left = leftovers(socket);
        if args.json {
            let mut json = to_json(&status);
            json["staging_branches_left"] = Value::from(left);
            json_all.push(json);
        } else {
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(&to_table(&status));
            text.push_str(&staging_table(&left));
        }
    }
    if args.json {
        // One runtime: its object, as always; several: an array of them.
        let value = match json_all.len() {
            1 if single => json_all.remove(0),
            _ => Value::from(json_all),
        };
        let mut json = serde_json::to_string_pretty(&value).expect("json");
        json.push('\n');
        crate::out::print(&json)?;
    } else {
        crate::out::print(&text)?;
    }
    match failed.len() {
        0 => Ok(()),
        1 => Err(failed.remove(0)),
        _ => Err(ExpectedError::Each(failed)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_answer_says_why_by_its_variant() {
        let error = ProbeError::NoAnswer {
            socket: "/run/broker.sock".into(),
            cause: NoAnswer::Timeout,
        };
        assert!(matches!(
            error,
            ProbeError::NoAnswer {
                cause: NoAnswer::Timeout,
                ..
            }
        ));
        assert_eq!(
            perago_core::errors::chain(&error),
            "no perago runtime answers at /run/broker.sock: no answer within 5 s"
        );
        let call = NoAnswer::Call(Box::new(tonic::Status::unavailable("gone away")));
        assert_eq!(call.to_string(), "gone away");
    }

    #[tokio::test]
    async fn a_refused_connection_names_its_cause() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("none.sock");
        let cause = perago_core::socket::connect(&socket)
            .await
            .map_err(NoAnswer::Connect)
            .unwrap_err();
        assert!(matches!(cause, NoAnswer::Connect(_)));
        assert!(
            !cause.to_string().contains("transport error"),
            "the cause, not tonic's wrapper: {cause}"
        );
    }

    #[test]
    fn body_memory_peaks_show_where_measured() {
        use perago_proto::admin::v1::SlotStatus;
        let slot = |n: u32, last: u64, max: u64| SlotStatus {
            slot: n,
            last_body_peak_memory_bytes: last,
            max_body_peak_memory_bytes: max,
            ..SlotStatus::default()
        };
        let status = StatusResponse {
            slots: vec![slot(1, 3 << 20, 64 << 20), slot(2, 0, 0)],
            ..StatusResponse::default()
        };
        let table = to_table(&status);
        assert!(
            table.contains("body memory peaks: slot 1 last 3MiB max 64MiB\n"),
            "{table}"
        );
        let json = to_json(&status);
        assert_eq!(json["slots"][0]["last_body_peak_memory_bytes"], 3 << 20);
        assert_eq!(json["slots"][0]["max_body_peak_memory_bytes"], 64 << 20);
        assert_eq!(json["slots"][1]["max_body_peak_memory_bytes"], Value::Null);
        let unmeasured = to_table(&StatusResponse {
            slots: vec![slot(1, 0, 0)],
            ..StatusResponse::default()
        });
        assert!(!unmeasured.contains("body memory peaks"), "{unmeasured}");
    }

    /// The profile, the headroom and --max-runtime in the table and the JSON (issue #27
    /// item 3).
    #[test]
    fn capacity_shows_the_profile_the_headroom_and_the_time_left() {
        let c = Capacity {
            min_executors: 2,
            max_executors: 2,
            poison_after: 3,
            queue_depth: -1,
            once: true,
            memory_headroom_bytes: 64 << 20,
            max_runtime_ms: 10_000,
            time_left_ms: 1_000,
            profile_executions: 3,
            profile_duration_mean_ms: 3_000,
            profile_duration_p95_ms: 3_000,
            profile_peak_memory_bytes: 400 << 20,
            admission_open: false,
            admission_reason: "--max-runtime 10s: the observed p95 duration 3s exceeds the 1s left"
                .to_owned(),
            ..Capacity::default()
        };
        let table = capacity_table(&c);
        assert!(
            table.contains("run once, memory headroom 64MiB, max runtime 10.0s, poison after 3"),
            "{table}"
        );
        assert!(
            table.contains(
                "now: profile of 3 executions: mean 3.0s, p95 3.0s, peak 400MiB, 1.0s left, admission CLOSED: --max-runtime 10s"
            ),
            "{table}"
        );
        let json = capacity_json(&c);
        assert_eq!(json["memory_headroom_bytes"], 64 << 20);
        assert_eq!(json["time_left_ms"], 1000);
        assert_eq!(json["profile"]["duration_p95_ms"], 3000);
        assert_eq!(json["profile"]["peak_memory_bytes"], 400u64 << 20);
        let off = capacity_json(&Capacity::default());
        assert_eq!(off["time_left_ms"], Value::Null);
        assert_eq!(off["profile"]["duration_mean_ms"], Value::Null);
    }

    #[test]
    fn capacity_shows_what_is_on_and_why_admission_is_closed() {
        let mut c = Capacity {
            min_executors: 2,
            max_executors: 2,
            wanted_executors: 2,
            scale_down_after_ms: 30_000,
            poison_after: 3,
            queue_depth: -1,
            admission_open: true,
            ..Capacity::default()
        };
        assert_eq!(
            capacity_table(&c),
            "capacity: poison after 3 crashes\nnow: admission open\n"
        );
        assert_eq!(capacity_json(&c)["queue_depth"], Value::Null);
        c.max_executors = 8;
        c.wanted_executors = 3;
        c.once = true;
        c.max_tasks_per_executor = 5;
        c.max_executor_memory_bytes = 512 << 20;
        c.min_free_memory_bytes = 3 << 29;
        c.queue_depth = 12;
        c.available_memory_bytes = 1 << 30;
        c.admission_open = false;
        c.admission_reason = "available 1GiB < PERAGO_MIN_FREE_MEMORY 1.5GiB".to_owned();
        assert_eq!(
            capacity_table(&c),
            "capacity: executors 2..8 (wanted 3, scale down after 30.0s), run once, recycle after 5 tasks, recycle above 512MiB, min free memory 1.5GiB, poison after 3 crashes\nnow: queue depth 12, available memory 1GiB, admission CLOSED: available 1GiB < PERAGO_MIN_FREE_MEMORY 1.5GiB\n"
        );
        let json = capacity_json(&c);
        assert_eq!(json["queue_depth"], 12);
        assert_eq!(json["max_executor_memory_bytes"], 512 << 20);
        assert_eq!(json["admission_open"], false);
    }

    #[test]
    fn staging_branches_left_are_read_beside_the_socket_and_listed() {
        let tmp = tempfile::tempdir().unwrap();
        let socket = tmp.path().join("broker.sock");
        assert!(
            staging_left(&socket).unwrap().is_empty(),
            "no file: nothing left"
        );
        assert_eq!(staging_table(&[]), "");
        std::fs::write(
            tmp.path().join(crate::runtime::gc::LEFTOVERS_FILE),
            r#"[{"repository":"repo","branch":"perago-staging-e1","attempt_dir":"/r/attempts/e1"}]"#,
        )
        .unwrap();
        let left = staging_left(&socket).unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(
            staging_table(&left),
            "staging branches left by killed executors (1; the GC retries every interval):\n  repo/perago-staging-e1  (/r/attempts/e1)\n"
        );
    }

    /// The side file is read with the manifests' rule: a regular file within a size cap, opened
    /// without blocking and without following a symlink.
    #[test]
    fn a_hostile_staging_file_is_refused_at_once_naming_why() {
        let tmp = tempfile::tempdir().unwrap();
        let socket = tmp.path().join("broker.sock");
        let file = tmp.path().join(crate::runtime::gc::LEFTOVERS_FILE);
        // 300 MB (sparse): refused from its size, never read into memory.
        std::fs::File::create(&file)
            .unwrap()
            .set_len(300_000_000)
            .unwrap();
        let err = staging_left(&socket).unwrap_err();
        assert!(
            err.ends_with("300000000 bytes is above the limit of 1048576 bytes"),
            "{err}"
        );
        std::fs::remove_file(&file).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(&file)
            .status()
            .unwrap();
        assert!(made.success());
        let started = std::time::Instant::now();
        let err = staging_left(&socket).unwrap_err();
        assert!(
            err.ends_with("a FIFO (only regular files are read)"),
            "{err}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        std::fs::remove_file(&file).unwrap();
        let target = tmp.path().join("elsewhere.json");
        std::fs::write(&target, "[]").unwrap();
        std::os::unix::fs::symlink(&target, &file).unwrap();
        assert!(staging_left(&socket).is_err(), "a symlink is not followed");
        std::fs::remove_file(&file).unwrap();
        std::fs::write(&file, "{}").unwrap();
        let err = staging_left(&socket).unwrap_err();
        assert!(err.contains("not a list of branches"), "{err}");
        // Escape sequences in an entry are written out.
        let entry =
            json!({"repository": "r\u{1b}[2J", "branch": "b\nfake line", "attempt_dir": "a"});
        let table = staging_table(&[entry]);
        assert!(!table.contains('\u{1b}'), "{table:?}");
        assert!(table.contains("r\\x1b[2J/b\\nfake line"), "{table:?}");
    }

    #[test]
    fn cells_escape_controls_and_are_capped() {
        assert_eq!(cell("plain", 10), "plain");
        assert_eq!(cell("0123456789", 10), "0123456789");
        assert_eq!(cell("0123456789a", 10), "012345678…");
        assert_eq!(
            cell("a\u{1b}[31mred\r\n\t\0\u{9b}\u{202e}z", 100),
            "a\\x1b[31mred\\r\\n\\t\\0\\x9b\\u{202e}z"
        );
        assert_eq!(cell("é".repeat(100).as_str(), 5), "éééé…");
        assert_eq!(cell("\u{1b}".repeat(100).as_str(), 6).chars().count(), 6);
    }

    /// What a hostile broker can put in a status answer: no panic (a 3 MiB worker id was a
    /// formatting width panic), no raw escape sequence, bounded columns; the JSON stays exact.
    #[test]
    fn a_hostile_status_is_printed_safely_and_its_json_kept_exact() {
        use perago_proto::admin::v1::SlotStatus;
        let huge = "w".repeat(3 << 20);
        let status = StatusResponse {
            task_name: "t\u{1b}]0;owned\u{7}".into(),
            broker_worker_id: "b\u{1b}[2J".into(),
            broker_pid: 1,
            started_at_unix_ms: i64::MIN,
            slots: vec![SlotStatus {
                slot: 1,
                worker_id: huge.clone(),
                state: 99,
                task_id: "task\nFORGED".into(),
                execution_id: "e".repeat(10_000),
                busy_since_unix_ms: i64::MIN,
                phase: "\u{1b}[1A".into(),
                ..SlotStatus::default()
            }],
            capacity: Some(Capacity {
                admission_reason: "\u{1b}[2Jreason".into(),
                ..Capacity::default()
            }),
            ..StatusResponse::default()
        };
        let table = to_table(&status);
        assert!(
            !table.contains('\u{1b}') && !table.contains('\u{7}'),
            "{table:?}"
        );
        assert!(
            table.contains("task t\\x1b]0;owned\\x07  broker b\\x1b[2J"),
            "{table:?}"
        );
        assert!(table.contains("task\\nFORGED / eee"), "{table:?}");
        assert!(
            table.contains("admission CLOSED: \\x1b[2Jreason"),
            "{table:?}"
        );
        for line in table.lines() {
            assert!(line.chars().count() < 400, "{} chars", line.chars().count());
        }
        let json = to_json(&status);
        assert_eq!(json["paused"], false);
        assert_eq!(json["slots"][0]["worker_id"], huge.as_str());
        assert_eq!(json["task_name"], "t\u{1b}]0;owned\u{7}");
        assert_eq!(json["slots"][0]["task_id"], "task\nFORGED");
        assert_eq!(json["domain"], "");
    }

    /// Issue #26, item 1: the domain is in the table (when there is one) and in the JSON.
    #[test]
    fn the_domain_is_shown() {
        let status = StatusResponse {
            task_name: "t".into(),
            broker_worker_id: "tBroker".into(),
            domain: "blue".into(),
            ..StatusResponse::default()
        };
        assert!(
            to_table(&status).starts_with("task t  domain blue  broker tBroker"),
            "{}",
            to_table(&status)
        );
        assert_eq!(to_json(&status)["domain"], "blue");
    }

    /// Issue #27, item 1: a sharing runtime's permits are in the table and the JSON.
    #[test]
    fn a_sharing_runtime_shows_its_permits() {
        let mut status = StatusResponse {
            task_name: "t".into(),
            ..StatusResponse::default()
        };
        assert!(!to_table(&status).contains("shared capacity"));
        assert!(to_json(&status)["share"].is_null());
        status.share = Some(perago_proto::admin::v1::ShareStatus {
            limit: 2,
            epoch: 7,
            held: 1,
            fillable: 3,
            empty: false,
            started: 9,
        });
        assert!(
            to_table(&status)
                .contains("shared capacity: 1 of 2 permits held, 3 more could start\n"),
            "{}",
            to_table(&status)
        );
        assert_eq!(to_json(&status)["share"]["limit"], 2);
        assert_eq!(to_json(&status)["share"]["started"], 9);
    }

    /// The table's header says whether polling is paused and for how long; the JSON has both
    /// fields (issue #26 item 2).
    #[test]
    fn a_paused_runtime_says_so_and_since_when() {
        let mut status = StatusResponse {
            task_name: "t".into(),
            started_at_unix_ms: now_ms() - 60_000,
            ..StatusResponse::default()
        };
        assert!(
            to_table(&status)
                .lines()
                .next()
                .unwrap()
                .ends_with("  paused no")
        );
        status.paused = true;
        status.paused_since_unix_ms = now_ms() - 125_000;
        let header = to_table(&status).lines().next().unwrap().to_owned();
        assert!(header.ends_with("  paused yes (for 2m05s)"), "{header}");
        let json = to_json(&status);
        assert_eq!(json["paused"], true);
        assert_eq!(json["paused_since_unix_ms"], status.paused_since_unix_ms);
    }

    /// Issue #26 item 4: the soft time limit in force, and whether a reload changed it.
    #[test]
    fn the_live_settings_show_what_a_reload_changed() {
        let mut status = StatusResponse {
            task_name: "t".into(),
            ..StatusResponse::default()
        };
        assert!(!to_table(&status).contains("soft time limit"));
        status.soft_time_limit_ms = Some(0);
        assert!(!to_table(&status).contains("soft time limit"));
        status.soft_time_limit_ms = Some(90_000);
        assert!(
            to_table(&status).contains("\nsoft time limit 1m30s\n"),
            "{}",
            to_table(&status)
        );
        status.reconfigured_at_unix_ms = now_ms() - 5_000;
        let table = to_table(&status);
        assert!(
            table.contains("soft time limit 1m30s (changed by a reload 5."),
            "{table}"
        );
        status.settings = Some(perago_proto::admin::v1::RuntimeSettings {
            execution_mode: "process".into(),
            poll_timeout_ms: 2000,
            poll_interval_ms: 250,
            ..Default::default()
        });
        let table = to_table(&status);
        assert!(
            table.contains("execution mode process  long poll 2000ms, 250ms after an empty poll\n"),
            "{table}"
        );
        let json = to_json(&status);
        assert_eq!(json["poll_timeout_ms"], 2000);
        assert_eq!(json["poll_interval_ms"], 250);
        assert_eq!(json["soft_time_limit_ms"], 90_000);
        assert_eq!(
            json["reconfigured_at_unix_ms"],
            status.reconfigured_at_unix_ms
        );
    }

    /// Issue #26 item 4: the body version of each slot and the runtime's, and a roll under
    /// way with the slots still at an older version, in the table and the JSON.
    #[test]
    fn the_body_versions_and_a_roll_are_shown() {
        let slot = |slot, body_version| perago_proto::admin::v1::SlotStatus {
            slot,
            worker_id: format!("t{slot:04}"),
            generation: 1,
            body_version,
            ..Default::default()
        };
        let mut status = StatusResponse {
            task_name: "t".into(),
            slots: vec![slot(1, 0), slot(2, 0)],
            ..StatusResponse::default()
        };
        let table = to_table(&status);
        assert!(
            table.contains("\nbody version 1\n"),
            "0 is version 1: {table}"
        );
        status.body_version = 2;
        status.rolling = true;
        status.slots = vec![slot(1, 2), slot(2, 1)];
        let table = to_table(&status);
        assert!(
            table.contains("\nbody version 2  rolling: slots at an older version: 2 (v1)\n"),
            "{table}"
        );
        let row = table.lines().find(|l| l.starts_with("2 ")).unwrap();
        assert_eq!(row.split_whitespace().nth(5), Some("v1"), "{row}");
        let json = to_json(&status);
        assert_eq!(json["body_version"], 2);
        assert_eq!(json["rolling"], true);
        assert_eq!(json["slots"][1]["body_version"], 1);
    }
}
