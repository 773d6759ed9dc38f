//! The broker binary's entry: configuration from the environment the supervisor sets.

use crate::{BrokerConfig, run};
use perago_core::{
    bootstrap::{self, EXIT_OK, Exit},
    conductor::ConductorClient,
    env,
    identity::WorkerPrefix,
};
use std::path::PathBuf;

use perago_core::{
    capacity::PERAGO_SLOTS,
    env::{
        PERAGO_CONTROL_PID, PERAGO_CONTROL_TOKEN, PERAGO_METRICS_ADDR, PERAGO_POLL_WAIT_MS,
        PERAGO_SOCKET, PERAGO_TASK_NAME, PERAGO_WORKSPACE_ROOT,
    },
};

/// A broker environment that cannot be run with, naming the variable at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Variables the supervisor sets are missing: the broker was not started by it.
    #[error(
        "perago-broker is started by perago-supervisor, which sets its environment; missing {}",
        missing.join(", ")
    )]
    Missing {
        /// Every missing variable.
        missing: Vec<&'static str>,
    },
    /// `PERAGO_WORKER_ID_PREFIX` is not a prefix.
    #[error(transparent)]
    Prefix(#[from] perago_core::identity::PrefixError),
    /// `PERAGO_SLOTS` is not a positive integer.
    #[error("{PERAGO_SLOTS} must be a positive integer")]
    Slots {
        /// The value as given.
        value: String,
    },
    /// A capacity setting is bad.
    #[error(transparent)]
    Capacity(#[from] perago_core::capacity::CapacityError),
    /// The Conductor client settings are bad.
    #[error(transparent)]
    Conductor(#[from] perago_core::conductor::ClientConfigError),
    /// `PERAGO_POLL_WAIT_MS` or `PERAGO_POLL_INTERVAL_MS` is not milliseconds, or out of range.
    #[error(transparent)]
    PollWait(perago_core::env::SettingError),
    /// `PERAGO_SDK_SETTINGS` is not what the supervisor writes.
    #[error(
        "{} {value:?}: expected a JSON array of {{\"property\", \"value\", \"variable\"}}",
        env::PERAGO_SDK_SETTINGS
    )]
    SdkSettings { value: String },
    /// `PERAGO_CONTROL_PID` is not a process id.
    #[error("{PERAGO_CONTROL_PID} must be a process id")]
    ControlPid {
        /// The value as given.
        value: String,
    },
    /// `PERAGO_METRICS_ADDR` is not a socket address.
    #[error("{PERAGO_METRICS_ADDR} {value:?} is not an address such as 127.0.0.1:9464")]
    MetricsAddr {
        /// The value as given.
        value: String,
    },
    /// `PERAGO_STALL_TIMEOUT` is not a duration or `off`.
    #[error(transparent)]
    StallTimeout(#[from] perago_core::liveness::StallTimeoutError),
    /// `PERAGO_DOMAIN` is not a domain.
    #[error("PERAGO_DOMAIN: {0}")]
    Domain(perago_core::conductor::DomainError),
    /// `PERAGO_SOFT_TIME_LIMIT_MS` is not a number of milliseconds.
    #[error(
        "{} {value:?} must be a whole number of milliseconds",
        env::PERAGO_SOFT_TIME_LIMIT_MS
    )]
    SoftTimeLimit {
        /// The value as given.
        value: String,
    },
    /// `PERAGO_SHARE` is neither 1 nor 0.
    /// The OpenTelemetry environment cannot be used.
    #[error("OpenTelemetry: {0}")]
    Trace(#[from] perago_core::trace::ConfigError),
    #[error("{} {value:?}: expected 1 or 0", env::PERAGO_SHARE)]
    Share {
        /// The value as given.
        value: String,
    },
    /// `PERAGO_READY_FD` is not a descriptor number.
    #[error("{} must be a descriptor number", env::PERAGO_READY_FD)]
    ReadyFd {
        /// The value as given.
        value: String,
    },
}

/// The broker's configuration from `lookup` (the process environment for the binary; the
/// supervisor's child environment in thread mode).
pub fn config_from(lookup: impl Fn(&str) -> Option<String>) -> Result<BrokerConfig, ConfigError> {
    let var = |name: &str| lookup(name).filter(|v| !v.is_empty());
    let [_, socket, slots, control_token, task_name, prefix] = env::require(
        &lookup,
        [
            env::CONDUCTOR_SERVER_URL,
            PERAGO_SOCKET,
            PERAGO_SLOTS,
            PERAGO_CONTROL_TOKEN,
            PERAGO_TASK_NAME,
            env::PERAGO_WORKER_ID_PREFIX,
        ],
    )
    .map_err(|missing| ConfigError::Missing { missing })?;
    let prefix = WorkerPrefix::explicit(&prefix)?;
    if !slots.parse::<u32>().is_ok_and(|n| n >= 1) {
        return Err(ConfigError::Slots { value: slots });
    }
    let capacity = perago_core::capacity::Capacity::from_lookup(&lookup)?;
    // CONDUCTOR_SERVER_URL, and CONDUCTOR_AUTH_KEY/SECRET when the server requires a token.
    let conductor = ConductorClient::from_lookup(&lookup)?;
    let poll_wait =
        env::poll_wait(lookup(PERAGO_POLL_WAIT_MS).as_deref()).map_err(ConfigError::PollWait)?;
    let poll_interval = env::poll_interval(lookup(env::PERAGO_POLL_INTERVAL_MS).as_deref())
        .map_err(ConfigError::PollWait)?;
    let settings = runtime_settings(&lookup)?;
    let control_pid = match var(PERAGO_CONTROL_PID) {
        None => std::os::unix::process::parent_id(),
        Some(pid) => pid
            .parse()
            .map_err(|_| ConfigError::ControlPid { value: pid.clone() })?,
    };
    let metrics_addr = match var(PERAGO_METRICS_ADDR) {
        None => None,
        Some(a) => Some(
            a.parse()
                .map_err(|_| ConfigError::MetricsAddr { value: a.clone() })?,
        ),
    };
    let stall_timeout = perago_core::liveness::stall_timeout(
        lookup(perago_core::liveness::PERAGO_STALL_TIMEOUT).as_deref(),
    )?;
    let workspace_root = var(PERAGO_WORKSPACE_ROOT).map(PathBuf::from);
    let domain = match var(env::PERAGO_DOMAIN) {
        None => None,
        Some(d) => Some(perago_core::conductor::Domain::parse(&d).map_err(ConfigError::Domain)?),
    };
    let share = match var(env::PERAGO_SHARE).as_deref() {
        None | Some("0") => false,
        Some("1") => true,
        Some(other) => {
            return Err(ConfigError::Share {
                value: other.to_owned(),
            });
        }
    };
    let ready_fd = match var(env::PERAGO_READY_FD) {
        None => None,
        Some(fd) => Some(
            fd.parse()
                .ok()
                .filter(|fd: &std::os::fd::RawFd| *fd > 2)
                .ok_or(ConfigError::ReadyFd { value: fd })?,
        ),
    };
    let soft_time_limit_ms = match var(env::PERAGO_SOFT_TIME_LIMIT_MS) {
        None => None,
        Some(ms) => Some(
            ms.parse()
                .map_err(|_| ConfigError::SoftTimeLimit { value: ms.clone() })?,
        ),
    };
    // The standard OpenTelemetry environment: traces are exported while an endpoint is set.
    let trace = perago_core::trace::Config::from_env(&lookup)?;
    Ok(BrokerConfig {
        trace,
        soft_time_limit_ms,
        task_name,
        prefix,
        capacity,
        conductor,
        socket: PathBuf::from(socket),
        control_token,
        control_pid,
        poll_wait,
        domain,
        poll_interval,
        settings,
        metrics_addr,
        stall_timeout,
        workspace_root,
        ready_fd,
        share,
    })
}

/// Runs the broker process; returns the exit code ([`bootstrap`]'s: 0 once drained, 2 for
/// an environment it cannot run with, 1 for any other failure).
pub fn main() -> i32 {
    bootstrap::exit_code(start())
}

fn start() -> Result<i32, Exit> {
    // Payloads up to megabytes reuse warm memory instead of fresh pages for every task.
    perago_sys::memory::retain_freed_memory();
    // Hold the workspace root's lock for as long as this process lives, but never pass it on.
    perago_sys::fd::adopt_root_lock(
        std::env::var(perago_core::env::PERAGO_ROOT_LOCK_FD)
            .ok()
            .as_deref(),
    );
    // It holds the control token and the Conductor credentials: no other process of this
    // user may read its memory or /proc/<pid>/environ. Its secrets come over a socket, asked for
    // only after.
    if let Err(e) = perago_sys::memory::set_non_dumpable() {
        eprintln!(
            "warning: cannot make the broker non-dumpable: {}",
            perago_core::errors::DisplayChain(&e)
        );
    }
    bootstrap::check_environment()?;
    let config = config_from(perago_core::env::secrets_then_env())
        .map_err(|e| bootstrap::config_error(perago_core::errors::DisplayChain(&e)))?;
    bootstrap::init_logging(
        "perago-conductor-broker",
        &config.task_name,
        &config.prefix.broker_id(),
    )?;
    let runtime = bootstrap::runtime()?;
    let result = perago_core::logging::block_on(&runtime, async {
        let stop = async {
            use tokio::signal::unix::{SignalKind, signal};
            let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
            let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM: draining"),
                _ = int.recv() => tracing::info!("SIGINT: draining"),
            }
        };
        run(config, stop).await
    });
    Ok(match result {
        Ok(()) => EXIT_OK,
        Err(e) => bootstrap::failed("broker failed", &perago_core::errors::DisplayChain(&e)),
    })
}

/// What the supervisor says about how this runtime runs (`PERAGO_EXECUTION_MODE`,
/// `PERAGO_SDK_SETTINGS`), reported as is in `Admin.Status`.
fn runtime_settings(
    lookup: &impl Fn(&str) -> Option<String>,
) -> Result<perago_proto::admin::v1::RuntimeSettings, ConfigError> {
    use perago_proto::admin::v1::{RuntimeSettings, SdkSetting};
    let execution_mode = lookup(env::PERAGO_EXECUTION_MODE).unwrap_or_default();
    let sdk_settings = match lookup(env::PERAGO_SDK_SETTINGS).filter(|v| !v.trim().is_empty()) {
        None => Vec::new(),
        Some(value) => {
            let bad = || ConfigError::SdkSettings {
                value: value.clone(),
            };
            let rows: Vec<serde_json::Map<String, serde_json::Value>> =
                serde_json::from_str(&value).map_err(|_| bad())?;
            rows.iter()
                .map(|row| {
                    let field = |name: &str| {
                        row.get(name)
                            .and_then(serde_json::Value::as_str)
                            .map(str::to_owned)
                            .ok_or_else(bad)
                    };
                    Ok::<_, ConfigError>(SdkSetting {
                        property: field("property")?,
                        value: field("value")?,
                        variable: field("variable")?,
                    })
                })
                .collect::<Result<_, _>>()?
        }
    };
    Ok(RuntimeSettings {
        execution_mode,
        sdk_settings,
        // The ones in force, filled in by the actor at each status.
        ..RuntimeSettings::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn config(pairs: &[(&str, &str)]) -> Result<BrokerConfig, ConfigError> {
        let mut vars: BTreeMap<String, String> = [
            (env::CONDUCTOR_SERVER_URL, "http://127.0.0.1:1/api"),
            (PERAGO_SOCKET, "/tmp/perago.sock"),
            (PERAGO_SLOTS, "2"),
            (PERAGO_CONTROL_TOKEN, "token"),
            (PERAGO_TASK_NAME, "sum"),
            (env::PERAGO_WORKER_ID_PREFIX, "sum"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        for (k, v) in pairs {
            vars.insert((*k).to_owned(), (*v).to_owned());
        }
        config_from(|name| vars.get(name).cloned())
    }

    #[test]
    fn the_runtime_settings_and_poll_interval_are_read_and_checked() {
        let ok = config(&[
            (env::PERAGO_EXECUTION_MODE, "thread"),
            (env::PERAGO_POLL_INTERVAL_MS, "75"),
            (
                env::PERAGO_SDK_SETTINGS,
                r#"[{"property":"poll_interval","value":"75","variable":"CONDUCTOR_WORKER_ALL_POLL_INTERVAL"}]"#,
            ),
        ])
        .unwrap();
        assert_eq!(ok.poll_interval, std::time::Duration::from_millis(75));
        assert_eq!(ok.settings.execution_mode, "thread");
        assert_eq!(ok.settings.sdk_settings.len(), 1);
        assert_eq!(
            config(&[]).unwrap().poll_interval,
            std::time::Duration::ZERO
        );
        for bad in ["{}", "[1]", r#"[{"property":"x"}]"#] {
            let err = config(&[(env::PERAGO_SDK_SETTINGS, bad)]).unwrap_err();
            assert!(
                err.to_string().starts_with("PERAGO_SDK_SETTINGS "),
                "{bad}: {err}"
            );
        }
        let err = config(&[(env::PERAGO_POLL_INTERVAL_MS, "soon")]).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("PERAGO_POLL_INTERVAL_MS \"soon\""),
            "{err}"
        );
    }

    #[test]
    fn every_bad_variable_is_named_by_its_variant() {
        assert!(config(&[]).is_ok());
        let missing = config_from(|_| None).unwrap_err();
        assert!(matches!(missing, ConfigError::Missing { ref missing } if missing.len() == 6));
        assert!(
            missing
                .to_string()
                .starts_with("perago-broker is started by perago-supervisor")
        );
        let slots = config(&[(PERAGO_SLOTS, "0")]).unwrap_err();
        assert!(matches!(slots, ConfigError::Slots { ref value } if value == "0"));
        assert_eq!(slots.to_string(), "PERAGO_SLOTS must be a positive integer");
        assert!(matches!(
            config(&[(PERAGO_POLL_WAIT_MS, "soon")]),
            Err(ConfigError::PollWait(_))
        ));
        // Zero made an empty queue a loop of polls.
        let zero = config(&[(PERAGO_POLL_WAIT_MS, "0")]).unwrap_err();
        assert!(
            zero.to_string()
                .starts_with("PERAGO_POLL_WAIT_MS \"0\": must be at least 100"),
            "{zero}"
        );
        assert!(matches!(
            config(&[(PERAGO_CONTROL_PID, "me")]),
            Err(ConfigError::ControlPid { .. })
        ));
        let addr = config(&[(PERAGO_METRICS_ADDR, "here")]).unwrap_err();
        assert!(matches!(addr, ConfigError::MetricsAddr { .. }));
        assert_eq!(
            addr.to_string(),
            "PERAGO_METRICS_ADDR \"here\" is not an address such as 127.0.0.1:9464"
        );
        assert!(matches!(
            config(&[(env::PERAGO_WORKER_ID_PREFIX, "a b")]),
            Err(ConfigError::Prefix(_))
        ));
        assert!(matches!(
            config(&[(perago_core::capacity::PERAGO_POISON_AFTER, "x")]),
            Err(ConfigError::Capacity(_))
        ));
        let stall = config(&[(perago_core::liveness::PERAGO_STALL_TIMEOUT, "1")]).unwrap_err();
        assert!(matches!(stall, ConfigError::StallTimeout(_)), "{stall}");
        let ready = config(&[(env::PERAGO_READY_FD, "1")]).unwrap_err();
        assert!(matches!(ready, ConfigError::ReadyFd { ref value } if value == "1"));
        assert_eq!(
            ready.to_string(),
            "PERAGO_READY_FD must be a descriptor number"
        );
        assert_eq!(
            config(&[(env::PERAGO_READY_FD, "7")]).unwrap().ready_fd,
            Some(7)
        );
        assert_eq!(config(&[]).unwrap().ready_fd, None);
        let domain = config(&[(env::PERAGO_DOMAIN, "a:b")]).unwrap_err();
        assert!(
            domain
                .to_string()
                .starts_with("PERAGO_DOMAIN: domain \"a:b\": only ASCII"),
            "{domain}"
        );
        assert_eq!(
            config(&[(env::PERAGO_DOMAIN, "blue")])
                .unwrap()
                .domain
                .map(|d| d.to_string()),
            Some("blue".to_owned())
        );
        assert_eq!(config(&[]).unwrap().domain, None);
        assert_eq!(
            config(&[]).unwrap().stall_timeout,
            Some(perago_core::liveness::DEFAULT_STALL_TIMEOUT)
        );
        assert_eq!(
            config(&[(perago_core::liveness::PERAGO_STALL_TIMEOUT, "off")])
                .unwrap()
                .stall_timeout,
            None
        );
    }
}
