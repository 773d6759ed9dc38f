//! `status`: read a running runtime's state over `Admin.Status` and print it for a person
//! (a table) or a program (`--json`).

use crate::{
    cli::StatusArgs,
    errors::ExpectedError,
    runtime::root::{default_root, runtime_dir},
};
use perago_core::{env, manifest::Manifest};
use perago_proto::admin::v1::{
    BrokerCounters, SlotState, StatusRequest, StatusResponse, admin_client::AdminClient,
};
use serde_json::{Value, json};
use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::PathBuf,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

fn socket_of(args: &StatusArgs, vars: &BTreeMap<String, String>) -> Result<PathBuf, ExpectedError> {
    if let Some(socket) = &args.socket {
        return Ok(socket.clone());
    }
    let Some(manifest) = &args.manifest else {
        return Err(ExpectedError::Config(vec![
            "give the task's MANIFEST or --socket PATH".to_owned(),
        ]));
    };
    let manifest = Manifest::load(manifest)?;
    let root = vars
        .get(env::PERAGO_WORKSPACE_ROOT)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| default_root(&manifest.task.name, vars));
    let root = std::fs::canonicalize(&root).unwrap_or(root);
    Ok(runtime_dir(&root, vars).join("broker.sock"))
}

fn now_ms() -> i64 {
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
        _ => "unknown",
    }
}

fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{:.1}s", d.as_secs_f64()),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

fn counters_json(c: &BrokerCounters) -> Value {
    json!({
        "polls": c.polls, "empty_polls": c.empty_polls, "poll_errors": c.poll_errors,
        "dispatched": c.dispatched, "completed": c.completed, "failed": c.failed,
        "failed_terminal": c.failed_terminal, "update_retries": c.update_retries,
        "lease_extensions": c.lease_extensions, "leases_lost": c.leases_lost,
        "executor_exits": c.executor_exits, "results_lost": c.results_lost,
    })
}

/// The status as JSON (snake_case, as the proto fields).
pub(crate) fn to_json(status: &StatusResponse) -> Value {
    json!({
        "task_name": status.task_name,
        "broker_worker_id": status.broker_worker_id,
        "broker_pid": status.broker_pid,
        "started_at_unix_ms": status.started_at_unix_ms,
        "draining": status.draining,
        "slots": status.slots.iter().map(|s| json!({
            "slot": s.slot, "worker_id": s.worker_id, "generation": s.generation, "pid": s.pid,
            "state": state_name(s.state), "task_id": s.task_id, "execution_id": s.execution_id,
            "busy_since_unix_ms": s.busy_since_unix_ms, "phase": s.phase,
        })).collect::<Vec<_>>(),
        "counters": status.counters.as_ref().map(counters_json),
    })
}

/// The status as a table for a terminal.
pub(crate) fn to_table(status: &StatusResponse) -> String {
    let now = now_ms();
    let up = Duration::from_millis(u64::try_from(now - status.started_at_unix_ms).unwrap_or(0));
    let mut out = format!(
        "task {}  broker {} (pid {})  up {}  draining {}\n",
        status.task_name,
        status.broker_worker_id,
        status.broker_pid,
        human(up),
        if status.draining { "yes" } else { "no" }
    );
    let width = status
        .slots
        .iter()
        .map(|s| s.worker_id.len())
        .max()
        .unwrap_or(9)
        .max(9);
    let _ = writeln!(
        out,
        "SLOT  {:<width$}  GEN  PID      STATE     PHASE       BUSY     TASK ID / EXECUTION ID",
        "WORKER ID"
    );
    for s in &status.slots {
        let busy = if s.busy_since_unix_ms > 0 {
            human(Duration::from_millis(
                u64::try_from(now - s.busy_since_unix_ms).unwrap_or(0),
            ))
        } else {
            String::new()
        };
        let ids = if s.task_id.is_empty() {
            String::new()
        } else {
            format!("{} / {}", s.task_id, s.execution_id)
        };
        let _ = writeln!(
            out,
            "{:<4}  {:<width$}  {:<3}  {:<7}  {:<8}  {:<10}  {:<7}  {}",
            s.slot,
            s.worker_id,
            s.generation,
            s.pid,
            state_name(s.state),
            s.phase,
            busy,
            ids
        );
    }
    if let Some(c) = &status.counters {
        let _ = writeln!(
            out,
            "counters: polls {}, empty polls {}, poll errors {}, dispatched {}, completed {}, failed {}, failed terminal {}, update retries {}, lease extensions {}, leases lost {}, executor exits {}, results lost {}",
            c.polls,
            c.empty_polls,
            c.poll_errors,
            c.dispatched,
            c.completed,
            c.failed,
            c.failed_terminal,
            c.update_retries,
            c.lease_extensions,
            c.leases_lost,
            c.executor_exits,
            c.results_lost
        );
    }
    out
}

/// The staging branches the supervisor's GC could not delete yet (SPEC §9), from the file it
/// keeps beside the broker socket; none when there is no such file.
pub(crate) fn staging_left(socket: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(socket.with_file_name(crate::runtime::gc::LEFTOVERS_FILE))
        .ok()
        .and_then(|text| serde_json::from_str::<Vec<Value>>(&text).ok())
        .unwrap_or_default()
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
        let text = |name: &str| entry[name].as_str().unwrap_or_default().to_owned();
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

pub(crate) fn status(
    args: &StatusArgs,
    vars: &BTreeMap<String, String>,
) -> Result<(), ExpectedError> {
    let socket = socket_of(args, vars)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ExpectedError::Runtime(format!("cannot start the async runtime: {e}")))?;
    let answer = runtime.block_on(async {
        let channel = tokio::time::timeout(
            Duration::from_secs(5),
            perago_executor::slot::connect(&socket),
        )
        .await
        .map_err(|_| "no answer within 5 s".to_owned())?
        .map_err(|e| {
            std::error::Error::source(&e).map_or_else(|| e.to_string(), |s| s.to_string())
        })?;
        tokio::time::timeout(
            Duration::from_secs(5),
            AdminClient::new(channel).status(StatusRequest {}),
        )
        .await
        .map_err(|_| "no answer within 5 s".to_owned())?
        .map(tonic::Response::into_inner)
        .map_err(|s| s.message().to_owned())
    });
    let status = answer.map_err(|cause| {
        ExpectedError::Runtime(format!(
            "no perago runtime answers at {}: {cause}",
            socket.display()
        ))
    })?;
    let left = staging_left(&socket);
    if args.json {
        let mut json = to_json(&status);
        json["staging_branches_left"] = Value::from(left);
        let mut json = serde_json::to_string_pretty(&json).expect("json");
        json.push('\n');
        crate::out::print(&json)?;
    } else {
        let mut table = to_table(&status);
        table.push_str(&staging_table(&left));
        crate::out::print(&table)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_branches_left_are_read_beside_the_socket_and_listed() {
        let tmp = tempfile::tempdir().unwrap();
        let socket = tmp.path().join("broker.sock");
        assert!(staging_left(&socket).is_empty(), "no file: nothing left");
        assert_eq!(staging_table(&[]), "");
        std::fs::write(
            tmp.path().join(crate::runtime::gc::LEFTOVERS_FILE),
            r#"[{"repository":"repo","branch":"perago-staging-e1","attempt_dir":"/r/attempts/e1"}]"#,
        )
        .unwrap();
        let left = staging_left(&socket);
        assert_eq!(left.len(), 1);
        assert_eq!(
            staging_table(&left),
            "staging branches left by killed executors (1; the GC retries every interval):\n  repo/perago-staging-e1  (/r/attempts/e1)\n"
        );
    }
}
