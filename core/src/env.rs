//! The environment variables perago reads, in one place. Every name an operator can set is a
//! constant here, so the docs, the preflight and the tests agree on spelling.

use crate::units::{DurationError, parse_duration};
use std::time::Duration;

/// Conductor API base URL including `/api`, as the SDKs take it.
pub const CONDUCTOR_SERVER_URL: &str = "CONDUCTOR_SERVER_URL";
/// lakeFS endpoint URL.
pub const LAKEFS_ENDPOINT: &str = "LAKEFS_ENDPOINT";
/// lakeFS access key id.
pub const LAKEFS_ACCESS_KEY_ID: &str = "LAKEFS_ACCESS_KEY_ID";
/// lakeFS secret access key. Never logged.
pub const LAKEFS_SECRET_ACCESS_KEY: &str = "LAKEFS_SECRET_ACCESS_KEY";
/// `process` or `thread`; the `--execution-mode` flag wins.
pub const PERAGO_EXECUTION_MODE: &str = "PERAGO_EXECUTION_MODE";
/// Worker id prefix; default: the task name's ASCII alphanumerics.
pub const PERAGO_WORKER_ID_PREFIX: &str = "PERAGO_WORKER_ID_PREFIX";
/// Set by the supervisor for each executor: prefix + 4-digit slot.
pub const PERAGO_WORKER_ID: &str = "PERAGO_WORKER_ID";
/// Root of the attempt workspaces, the runtime dir and the supervisor lock.
pub const PERAGO_WORKSPACE_ROOT: &str = "PERAGO_WORKSPACE_ROOT";
/// How long `start` waits for the processes of an earlier runtime (whose supervisor died) to
/// finish draining and release the workspace root (default 30s); past it, `start` refuses.
pub const PERAGO_ROOT_LOCK_WAIT: &str = "PERAGO_ROOT_LOCK_WAIT";
/// Root of the JSONL logs.
pub const PERAGO_LOG_ROOT: &str = "PERAGO_LOG_ROOT";
/// How often the workspace GC runs (default 5m).
pub const PERAGO_WORKSPACE_GC_INTERVAL: &str = "PERAGO_WORKSPACE_GC_INTERVAL";
/// Age after which an unowned attempt dir is removed (default 24h).
pub const PERAGO_WORKSPACE_GC_TTL: &str = "PERAGO_WORKSPACE_GC_TTL";
/// Kill children still alive this long after the first stop signal; unset = never.
pub const PERAGO_SHUTDOWN_FORCE_KILL_AFTER: &str = "PERAGO_SHUTDOWN_FORCE_KILL_AFTER";
/// The descriptor a runtime child reads its secrets from (a JSON object of variable names and
/// values), so that they are never in its environment.
pub const PERAGO_SECRETS_FD: &str = "PERAGO_SECRETS_FD";

/// Address for Prometheus metrics, e.g. `127.0.0.1:9464`; unset = off. Read by the broker.
pub const PERAGO_METRICS_ADDR: &str = "PERAGO_METRICS_ADDR";
/// Long-poll wait in milliseconds (default 5000). Read by the broker.
pub const PERAGO_POLL_WAIT_MS: &str = "PERAGO_POLL_WAIT_MS";
/// The broker program `start` runs (default: `perago-broker` beside the supervisor).
pub const PERAGO_BROKER_BIN: &str = "PERAGO_BROKER_BIN";
/// The stock executor program `start` runs (default: `perago-executor` beside the supervisor).
pub const PERAGO_EXECUTOR_BIN: &str = "PERAGO_EXECUTOR_BIN";

// What the supervisor hands its children. The supervisor sets these (and the operator's
// variables above that a child reads: `CONDUCTOR_SERVER_URL`, `PERAGO_WORKER_ID_PREFIX`,
// `PERAGO_LOG_ROOT`, `PERAGO_WORKSPACE_ROOT`, the capacity settings of `crate::capacity`); the
// broker and executors read them with these same constants.

/// The broker socket (broker and executors).
pub const PERAGO_SOCKET: &str = "PERAGO_SOCKET";
/// The task name (broker).
pub const PERAGO_TASK_NAME: &str = "PERAGO_TASK_NAME";
/// The manifest's path (broker and executors).
pub const PERAGO_MANIFEST: &str = "PERAGO_MANIFEST";
/// The supervisor's control secret (broker; a secret, passed over [`PERAGO_SECRETS_FD`]).
pub const PERAGO_CONTROL_TOKEN: &str = "PERAGO_CONTROL_TOKEN";
/// The only process whose `Control` calls the broker takes (the supervisor's pid; by default
/// the broker's parent).
pub const PERAGO_CONTROL_PID: &str = "PERAGO_CONTROL_PID";
/// The executor's slot number.
pub const PERAGO_SLOT: &str = "PERAGO_SLOT";
/// The executor's generation.
pub const PERAGO_GENERATION: &str = "PERAGO_GENERATION";
/// The generation's token (a secret, passed over [`PERAGO_SECRETS_FD`]).
pub const PERAGO_SLOT_TOKEN: &str = "PERAGO_SLOT_TOKEN";
/// A pipe to the supervisor on which an executor writes one byte for the first assignment its
/// generation completes (the supervisor then resets the slot's restart backoff). Optional.
pub const PERAGO_COMPLETION_FD: &str = "PERAGO_COMPLETION_FD";

// What an executor hands each body (SPEC §2), besides `PERAGO_WORKER_ID`.

/// The Conductor task id of the assignment.
pub const PERAGO_TASK_ID: &str = "PERAGO_TASK_ID";
/// The execution id of the assignment.
pub const PERAGO_EXECUTION_ID: &str = "PERAGO_EXECUTION_ID";
/// The workflow instance id of the assignment.
pub const PERAGO_WORKFLOW_ID: &str = "PERAGO_WORKFLOW_ID";
/// The attempt's working directory (workspace tasks).
pub const PERAGO_WORKSPACE_DIR: &str = "PERAGO_WORKSPACE_DIR";

/// The variables systemd sets for its notify protocol (`sd_notify(3)`). Only the supervisor
/// speaks for the service: no broker, executor or body gets them.
pub const SYSTEMD_NOTIFY_VARS: [&str; 3] = ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"];

/// The variables that are secrets: a runtime child gets the ones it needs over
/// [`PERAGO_SECRETS_FD`], never in its environment, and bodies never get any.
pub const SECRET_VARS: [&str; 6] = [
    PERAGO_CONTROL_TOKEN,
    PERAGO_SLOT_TOKEN,
    "CONDUCTOR_AUTH_KEY",
    "CONDUCTOR_AUTH_SECRET",
    LAKEFS_ACCESS_KEY_ID,
    LAKEFS_SECRET_ACCESS_KEY,
];

/// The lookup a runtime child (broker, executor) reads its configuration with: the secrets the
/// supervisor handed over on [`PERAGO_SECRETS_FD`] (read once, here), then the environment.
/// Receiving turns this process non-dumpable first, then asks for the secrets (see
/// [`crate::process::secrets`]). A channel that is missing, not a socket or broken leaves only
/// the environment, with a warning on stderr when one was named.
pub fn secrets_then_env() -> impl Fn(&str) -> Option<String> + use<> {
    let secrets: std::collections::BTreeMap<String, String> = std::env::var(PERAGO_SECRETS_FD)
        .ok()
        .and_then(|fd| {
            let received = fd
                .trim()
                .parse()
                .map_err(|_| format!("{PERAGO_SECRETS_FD} is not a descriptor number: {fd:?}"))
                .and_then(|fd| {
                    crate::process::secrets::receive(fd)
                        .map_err(|e| format!("cannot take the secrets on descriptor {fd}: {e}"))
                })
                .and_then(|bytes| {
                    serde_json::from_slice(&bytes)
                        .map_err(|e| format!("the secrets are not a JSON object of strings: {e}"))
                });
            received
                .map_err(|message| eprintln!("warning: {message}"))
                .ok()
        })
        .unwrap_or_default();
    move |name| {
        secrets
            .get(name)
            .cloned()
            .or_else(|| std::env::var(name).ok())
    }
}

/// The values of `names` from `lookup`, an empty value counting as unset; or every name that
/// is missing, so one message can list them all.
pub fn require<const N: usize>(
    lookup: impl Fn(&str) -> Option<String>,
    names: [&'static str; N],
) -> Result<[String; N], Vec<&'static str>> {
    let values = names.map(|n| lookup(n).filter(|v| !v.trim().is_empty()));
    let missing: Vec<&'static str> = names
        .iter()
        .zip(&values)
        .filter(|(_, v)| v.is_none())
        .map(|(n, _)| *n)
        .collect();
    if missing.is_empty() {
        Ok(values.map(|v| v.expect("checked")))
    } else {
        Err(missing)
    }
}

/// An environment value that is set but not usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name}: {source}")]
pub struct EnvDurationError {
    /// The variable's name.
    pub name: &'static str,
    /// Why its value is rejected.
    #[source]
    pub source: DurationError,
}

/// Reads a duration variable from `value` (the variable's value, if set), naming the variable
/// in the error. Unset or empty means `None`.
pub fn duration_var(
    name: &'static str,
    value: Option<&str>,
) -> Result<Option<Duration>, EnvDurationError> {
    match value {
        None => Ok(None),
        Some(v) if v.trim().is_empty() => Ok(None),
        Some(v) => parse_duration(v)
            .map(Some)
            .map_err(|source| EnvDurationError { name, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn require_lists_every_missing_name() {
        let lookup = |n: &str| match n {
            "A" => Some("1".to_owned()),
            "B" => Some(" ".to_owned()),
            _ => None,
        };
        assert_eq!(require(lookup, ["A"]), Ok(["1".to_owned()]));
        assert_eq!(require(lookup, ["A", "B", "C"]), Err(vec!["B", "C"]));
    }

    #[test]
    fn duration_var_names_the_variable() {
        assert_eq!(
            duration_var(PERAGO_SHUTDOWN_FORCE_KILL_AFTER, Some("30s")),
            Ok(Some(Duration::from_secs(30)))
        );
        assert_eq!(duration_var(PERAGO_WORKSPACE_GC_TTL, None), Ok(None));
        assert_eq!(duration_var(PERAGO_WORKSPACE_GC_TTL, Some("")), Ok(None));
        assert_eq!(
            duration_var(PERAGO_WORKSPACE_GC_INTERVAL, Some("0"))
                .unwrap_err()
                .to_string(),
            r#"PERAGO_WORKSPACE_GC_INTERVAL: invalid duration "0": must be greater than zero"#
        );
    }
}
