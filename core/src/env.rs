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
/// The variable that tells a runtime child (broker, executor) which file descriptor holds the
/// workspace root's lock. The supervisor leaves that descriptor open across `exec`, so the
/// `flock` stays held until the last process of the runtime has exited (see `docs/supervisor.md`,
/// "Workspace root lock"); the child adopts it with `perago_sys::fd::adopt_root_lock`.
pub const PERAGO_ROOT_LOCK_FD: &str = "PERAGO_ROOT_LOCK_FD";

/// Address for Prometheus metrics, e.g. `127.0.0.1:9464`; unset = off. Read by the broker.
pub const PERAGO_METRICS_ADDR: &str = "PERAGO_METRICS_ADDR";
/// The task domain the broker polls in (`…/poll/batch/{type}?domain=…`) and whose queue it
/// counts; unset or empty = the default queue. `start` takes it as `--domain DOMAIN` (the flag
/// wins) and sets it for each broker from its type's domain. Read by the broker.
pub const PERAGO_DOMAIN: &str = "PERAGO_DOMAIN";
/// `1`: the broker shares capacity with other task types (`start --pool`, concurrency groups):
/// it polls only within the permits the supervisor grants (`Admin.ShareGrant`), none until the
/// first grant. Set by `start` for each type under a pool or group. Read by the broker.
pub const PERAGO_SHARE: &str = "PERAGO_SHARE";
/// Long-poll wait in milliseconds (default 5000). Read by the broker.
pub const PERAGO_POLL_WAIT_MS: &str = "PERAGO_POLL_WAIT_MS";
/// How long the broker waits after a poll that brought no task before it polls again, in
/// milliseconds (default 0: the long poll itself paces the loop). Read by the broker; `start`
/// sets it from the Conductor SDK's `poll_interval`.
pub const PERAGO_POLL_INTERVAL_MS: &str = "PERAGO_POLL_INTERVAL_MS";
/// The soft time limit of the runtime's manifest in milliseconds (0: none), which the
/// supervisor gives its broker so `Admin.Status` shows the value in force from the start
/// (`Admin.Reconfigure` changes it; issue #26 item 4).
pub const PERAGO_SOFT_TIME_LIMIT_MS: &str = "PERAGO_SOFT_TIME_LIMIT_MS";
/// The Conductor SDK worker settings `start` applied to a runtime, for its broker to report in
/// `Admin.Status`: a JSON array of `{"property", "value", "variable"}`. Set by the supervisor.
pub const PERAGO_SDK_SETTINGS: &str = "PERAGO_SDK_SETTINGS";
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
/// The body version an executor runs: a JSON [`crate::manifest::ManifestSource`] the supervisor
/// wrote when it took the version (executors; without it, the manifest at [`PERAGO_MANIFEST`]
/// is read).
pub const PERAGO_BODY: &str = "PERAGO_BODY";
/// The number of that body version (executors: 1 at start, +1 per roll; for its logs).
pub const PERAGO_BODY_VERSION: &str = "PERAGO_BODY_VERSION";
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
/// A pipe to the supervisor on which the broker writes one byte once it serves on its socket
/// (bound, mode set, accepting), then closes it: how the supervisor learns the broker is up
/// (s6's notification-fd, systemd's `READY=1`). The broker only; optional.
pub const PERAGO_READY_FD: &str = "PERAGO_READY_FD";

// What an executor hands each body (SPEC §2), besides `PERAGO_WORKER_ID`.

/// The Conductor task id of the assignment.
pub const PERAGO_TASK_ID: &str = "PERAGO_TASK_ID";
/// The execution id of the assignment.
pub const PERAGO_EXECUTION_ID: &str = "PERAGO_EXECUTION_ID";
/// The workflow instance id of the assignment.
pub const PERAGO_WORKFLOW_ID: &str = "PERAGO_WORKFLOW_ID";
/// The attempt's working directory (workspace tasks).
pub const PERAGO_WORKSPACE_DIR: &str = "PERAGO_WORKSPACE_DIR";
/// While the runtime exports traces: the W3C `traceparent` of the attempt's `body` span, under
/// the name OpenTelemetry's environment carrier reads. A body never inherits one of the
/// executor's environment.
pub const TRACEPARENT: &str = "TRACEPARENT";
/// As [`TRACEPARENT`], the trace's W3C `tracestate` (when it has one).
pub const TRACESTATE: &str = "TRACESTATE";

/// The variables systemd sets for its notify protocol (`sd_notify(3)`). Only the supervisor
/// speaks for the service: no broker, executor or body gets them.
pub const SYSTEMD_NOTIFY_VARS: [&str; 3] = ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"];

/// The variables that are secrets: a runtime child gets the ones it needs over
/// [`PERAGO_SECRETS_FD`], never in its environment, and bodies never get any.
pub const SECRET_VARS: [&str; 8] = [
    PERAGO_CONTROL_TOKEN,
    PERAGO_SLOT_TOKEN,
    "CONDUCTOR_AUTH_KEY",
    "CONDUCTOR_AUTH_SECRET",
    LAKEFS_ACCESS_KEY_ID,
    LAKEFS_SECRET_ACCESS_KEY,
    OTEL_EXPORTER_OTLP_HEADERS,
    OTEL_EXPORTER_OTLP_TRACES_HEADERS,
];

/// The OTLP exporter's headers (an API key, often): secrets, the broker's only (it exports
/// the traces).
pub const OTEL_EXPORTER_OTLP_HEADERS: &str = "OTEL_EXPORTER_OTLP_HEADERS";
/// As [`OTEL_EXPORTER_OTLP_HEADERS`], for traces alone.
pub const OTEL_EXPORTER_OTLP_TRACES_HEADERS: &str = "OTEL_EXPORTER_OTLP_TRACES_HEADERS";

/// The lookup a runtime child (broker, executor) reads its configuration with: the secrets the
/// supervisor handed over on [`PERAGO_SECRETS_FD`] (read once, here), then the environment.
/// Receiving turns this process non-dumpable first, then asks for the secrets (see
/// [`crate::secrets`]). A channel that is missing, not a socket or broken leaves only
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
                    crate::secrets::receive(fd).map_err(|e| {
                        format!(
                            "cannot take the secrets on descriptor {fd}: {}",
                            crate::errors::DisplayChain(&e)
                        )
                    })
                })
                .and_then(|bytes| {
                    serde_json::from_slice(&bytes).map_err(|e| {
                        format!(
                            "the secrets are not a JSON object of strings: {}",
                            crate::errors::DisplayChain(&e)
                        )
                    })
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
#[error("{name}")]
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

/// The least `PERAGO_POLL_WAIT_MS`: below it an empty queue turns the long poll into a loop
/// of requests (0 gave thousands of polls a second).
pub const MIN_POLL_WAIT_MS: u64 = 100;
/// The default `PERAGO_POLL_WAIT_MS`.
pub const DEFAULT_POLL_WAIT: Duration = Duration::from_secs(5);
/// The least `PERAGO_WORKSPACE_GC_INTERVAL`: the GC walks the whole workspace root each time.
pub const MIN_GC_INTERVAL: Duration = Duration::from_secs(1);

/// Whether `name` is a setting perago reads (or one that decides where it writes: `HOME`,
/// `PATH`): a value of it that is not UTF-8 is an error, never a silent default.
pub fn is_setting(name: &str) -> bool {
    ["PERAGO_", "CONDUCTOR_", "LAKEFS_", "XDG_"]
        .iter()
        .any(|prefix| name.starts_with(prefix))
        || matches!(name, "HOME" | "PATH")
}

/// A setting whose value cannot be used, naming the setting and the value (escaped).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingError {
    /// The value is not UTF-8 text.
    #[error("{name} is not valid UTF-8 ({value}); set it to UTF-8 text or unset it")]
    NotUtf8 {
        /// The variable.
        name: String,
        /// The value, its invalid bytes written as `\xNN`.
        value: String,
    },
    /// The value is out of range or malformed.
    #[error("{name} {value:?}: {problem}")]
    Invalid {
        /// The variable.
        name: &'static str,
        /// The value as given.
        value: String,
        /// What is wrong with it.
        problem: String,
    },
}

/// `bytes` as text, each byte that is not part of valid UTF-8 written as `\xNN` and control
/// characters escaped, for a message.
fn escape_bytes(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.utf8_chunks() {
        out.push_str(&crate::result::escape_controls(chunk.valid()));
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// The environment as text, every setting ([`is_setting`]) checked: a setting whose name or
/// value is not UTF-8 is an error (all of them at once); other variables that are not UTF-8
/// are left out, as nothing of perago reads them. The one way the supervisor and the runtime
/// processes take in their environment.
pub fn utf8_environment(
    vars: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> Result<std::collections::BTreeMap<String, String>, Vec<SettingError>> {
    use std::os::unix::ffi::OsStrExt as _;
    let mut out = std::collections::BTreeMap::new();
    let mut errors = Vec::new();
    for (name, value) in vars {
        let text_name = String::from_utf8_lossy(name.as_bytes()).into_owned();
        match (name.into_string(), value.into_string()) {
            (Ok(name), Ok(value)) => {
                out.insert(name, value);
            }
            (_, Err(value)) if is_setting(&text_name) => {
                errors.push(SettingError::NotUtf8 {
                    name: escape_bytes(text_name.as_bytes()),
                    value: escape_bytes(value.as_bytes()),
                });
            }
            _ => {}
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// Checks this process's environment by [`utf8_environment`]: a runtime process (broker,
/// executor) calls it first, so no later read of a setting can fall back to a default because
/// its value was not UTF-8.
pub fn check_process_environment() -> Result<(), Vec<SettingError>> {
    utf8_environment(std::env::vars_os()).map(drop)
}

/// `PERAGO_POLL_WAIT_MS` from its value (unset or empty: the default): whole milliseconds, at
/// least [`MIN_POLL_WAIT_MS`].
pub fn poll_wait(value: Option<&str>) -> Result<Duration, SettingError> {
    let Some(text) = value.filter(|v| !v.trim().is_empty()) else {
        return Ok(DEFAULT_POLL_WAIT);
    };
    let invalid = |problem: String| SettingError::Invalid {
        name: PERAGO_POLL_WAIT_MS,
        value: text.to_owned(),
        problem,
    };
    let ms: u64 = text
        .trim()
        .parse()
        .map_err(|_| invalid("must be whole milliseconds, such as 5000".to_owned()))?;
    if ms < MIN_POLL_WAIT_MS {
        return Err(invalid(format!(
            "must be at least {MIN_POLL_WAIT_MS} (a shorter long poll turns an empty queue into a loop of requests)"
        )));
    }
    Ok(Duration::from_millis(ms))
}

/// The most `PERAGO_POLL_INTERVAL_MS`: an hour.
pub const MAX_POLL_INTERVAL_MS: u64 = 3_600_000;

/// `PERAGO_POLL_INTERVAL_MS` from its value (unset or empty: zero): whole milliseconds, at
/// most [`MAX_POLL_INTERVAL_MS`].
pub fn poll_interval(value: Option<&str>) -> Result<Duration, SettingError> {
    let Some(text) = value.filter(|v| !v.trim().is_empty()) else {
        return Ok(Duration::ZERO);
    };
    match text.trim().parse::<u64>() {
        Ok(ms) if ms <= MAX_POLL_INTERVAL_MS => Ok(Duration::from_millis(ms)),
        _ => Err(SettingError::Invalid {
            name: PERAGO_POLL_INTERVAL_MS,
            value: text.to_owned(),
            problem: format!("must be whole milliseconds from 0 to {MAX_POLL_INTERVAL_MS}"),
        }),
    }
}

/// A duration variable with a lower bound: [`duration_var`], then at least `min`.
pub fn duration_at_least(
    name: &'static str,
    value: Option<&str>,
    min: Duration,
) -> Result<Option<Duration>, String> {
    match duration_var(name, value).map_err(|e| crate::errors::chain(&e))? {
        Some(d) if d < min => Err(format!(
            "{name}: {:?} is below the least allowed, {}ms",
            value.unwrap_or_default(),
            min.as_millis()
        )),
        other => Ok(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setting_that_is_not_utf8_is_an_error_naming_it() {
        use std::{ffi::OsString, os::unix::ffi::OsStringExt as _};
        let bad = |b: &[u8]| OsString::from_vec(b.to_vec());
        let vars = vec![
            (
                OsString::from("PERAGO_WORKSPACE_ROOT"),
                bad(b"/srv/\xffroot"),
            ),
            (OsString::from("CONDUCTOR_AUTH_KEY"), bad(b"k\x1b\xfe")),
            (
                OsString::from("LAKEFS_ENDPOINT"),
                OsString::from("http://l"),
            ),
            (OsString::from("HOME"), bad(b"/home/\xe9")),
            (OsString::from("LANG_OTHER"), bad(b"\xff")),
            (bad(b"WEIRD\xff"), OsString::from("x")),
        ];
        let errors = utf8_environment(vars).unwrap_err();
        let messages: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(
            messages,
            [
                r"PERAGO_WORKSPACE_ROOT is not valid UTF-8 (/srv/\xffroot); set it to UTF-8 text or unset it",
                r"CONDUCTOR_AUTH_KEY is not valid UTF-8 (k\x1b\xfe); set it to UTF-8 text or unset it",
                r"HOME is not valid UTF-8 (/home/\xe9); set it to UTF-8 text or unset it",
            ]
        );
        let fine = utf8_environment(vec![
            (OsString::from("PERAGO_ONCE"), OsString::from("1")),
            (OsString::from("OTHER"), bad(b"\xff")),
        ])
        .unwrap();
        assert_eq!(fine.len(), 1, "variables perago does not read are left out");
        assert!(is_setting("XDG_STATE_HOME") && is_setting("PATH") && !is_setting("LANG"));
    }

    #[test]
    fn the_poll_interval_is_whole_milliseconds_up_to_an_hour() {
        assert_eq!(poll_interval(None), Ok(Duration::ZERO));
        assert_eq!(poll_interval(Some("")), Ok(Duration::ZERO));
        assert_eq!(poll_interval(Some("250")), Ok(Duration::from_millis(250)));
        assert_eq!(
            poll_interval(Some("1.5")).unwrap_err().to_string(),
            r#"PERAGO_POLL_INTERVAL_MS "1.5": must be whole milliseconds from 0 to 3600000"#
        );
        assert!(poll_interval(Some("3600001")).is_err());
    }

    #[test]
    fn the_poll_wait_has_a_floor() {
        assert_eq!(poll_wait(None), Ok(DEFAULT_POLL_WAIT));
        assert_eq!(poll_wait(Some(" ")), Ok(DEFAULT_POLL_WAIT));
        assert_eq!(poll_wait(Some("250")), Ok(Duration::from_millis(250)));
        assert_eq!(
            poll_wait(Some("0")).unwrap_err().to_string(),
            r#"PERAGO_POLL_WAIT_MS "0": must be at least 100 (a shorter long poll turns an empty queue into a loop of requests)"#
        );
        assert_eq!(
            poll_wait(Some("5s")).unwrap_err().to_string(),
            r#"PERAGO_POLL_WAIT_MS "5s": must be whole milliseconds, such as 5000"#
        );
    }

    #[test]
    fn intervals_have_a_floor() {
        assert_eq!(
            duration_at_least(PERAGO_WORKSPACE_GC_INTERVAL, Some("1ms"), MIN_GC_INTERVAL),
            Err(
                r#"PERAGO_WORKSPACE_GC_INTERVAL: "1ms" is below the least allowed, 1000ms"#
                    .to_owned()
            )
        );
        assert_eq!(
            duration_at_least(PERAGO_WORKSPACE_GC_INTERVAL, Some("1s"), MIN_GC_INTERVAL),
            Ok(Some(Duration::from_secs(1)))
        );
        assert_eq!(
            duration_at_least(PERAGO_WORKSPACE_GC_INTERVAL, None, MIN_GC_INTERVAL),
            Ok(None)
        );
    }

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
            crate::errors::chain(
                &duration_var(PERAGO_WORKSPACE_GC_INTERVAL, Some("0")).unwrap_err()
            ),
            r#"PERAGO_WORKSPACE_GC_INTERVAL: invalid duration "0": must be greater than zero"#
        );
    }
}
