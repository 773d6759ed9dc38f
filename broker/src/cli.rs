//! The broker binary's entry: configuration from the environment the supervisor sets.

use crate::{BrokerConfig, run};
use perago_core::{conductor::ConductorClient, env, identity::WorkerPrefix};
use std::{path::PathBuf, time::Duration};

use perago_core::{
    capacity::PERAGO_SLOTS,
    env::{
        PERAGO_CONTROL_PID, PERAGO_CONTROL_TOKEN, PERAGO_METRICS_ADDR, PERAGO_POLL_WAIT_MS,
        PERAGO_SOCKET, PERAGO_TASK_NAME,
    },
};

/// The broker's configuration from `lookup` (the process environment for the binary; the
/// supervisor's child environment in thread mode).
pub fn config_from(lookup: impl Fn(&str) -> Option<String>) -> Result<BrokerConfig, String> {
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
    .map_err(|missing| {
        format!(
            "perago-broker is started by perago-supervisor, which sets its environment; missing {}",
            missing.join(", ")
        )
    })?;
    let prefix = WorkerPrefix::explicit(&prefix).map_err(|e| e.to_string())?;
    if !slots.parse::<u32>().is_ok_and(|n| n >= 1) {
        return Err(format!("{PERAGO_SLOTS} must be a positive integer"));
    }
    let capacity = perago_core::capacity::Capacity::from_lookup(&lookup)?;
    // CONDUCTOR_SERVER_URL, and CONDUCTOR_AUTH_KEY/SECRET when the server requires a token.
    let conductor = ConductorClient::from_lookup(&lookup).map_err(|e| e.to_string())?;
    let poll_wait = match var(PERAGO_POLL_WAIT_MS) {
        None => Duration::from_secs(5),
        Some(ms) => Duration::from_millis(
            ms.parse()
                .map_err(|_| format!("{PERAGO_POLL_WAIT_MS} must be milliseconds"))?,
        ),
    };
    let control_pid = match var(PERAGO_CONTROL_PID) {
        None => std::os::unix::process::parent_id(),
        Some(pid) => pid
            .parse()
            .map_err(|_| format!("{PERAGO_CONTROL_PID} must be a process id"))?,
    };
    let metrics_addr = match var(PERAGO_METRICS_ADDR) {
        None => None,
        Some(a) => Some(a.parse().map_err(|_| {
            format!("{PERAGO_METRICS_ADDR} {a:?} is not an address such as 127.0.0.1:9464")
        })?),
    };
    Ok(BrokerConfig {
        task_name,
        prefix,
        capacity,
        conductor,
        socket: PathBuf::from(socket),
        control_token,
        control_pid,
        poll_wait,
        metrics_addr,
    })
}

/// Runs the broker process; returns the exit code.
pub fn main() -> i32 {
    // Payloads up to megabytes reuse warm memory instead of fresh pages for every task.
    perago_core::process::retain_freed_memory();
    // Hold the workspace root's lock for as long as this process lives, but never pass it on.
    perago_core::process::adopt_root_lock(
        std::env::var(perago_core::process::ROOT_LOCK_FD)
            .ok()
            .as_deref(),
    );
    // It holds the control token and the Conductor credentials: no other process of this
    // user may read its memory or /proc/<pid>/environ. The secrets came over a pipe.
    if let Err(e) = perago_core::process::set_non_dumpable() {
        eprintln!("warning: cannot make the broker non-dumpable: {e}");
    }
    let config = match config_from(perago_core::env::secrets_then_env()) {
        Ok(c) => c,
        Err(message) => {
            eprintln!("error: {message}");
            return 2;
        }
    };
    if let Err(message) = perago_core::logging::init_worker_from_env(
        "perago-conductor-broker",
        &config.task_name,
        &config.prefix.broker_id(),
    ) {
        eprintln!("error: {message}");
        return 1;
    }
    // One thread: the broker's work per task is a few small messages and two HTTP calls, and
    // a second worker thread costs more in wake-ups and hand-offs between the threads (futex,
    // park/unpark) than it saves; thread mode has always run the broker this way.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return 1;
        }
    };
    let result = runtime.block_on(async {
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
    match result {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!(error = %e, "broker failed");
            eprintln!("error: {e}");
            1
        }
    }
}
