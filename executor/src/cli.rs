//! The stock executor binary: identity from the environment the supervisor sets, the manifest,
//! a current-thread runtime (the slot round trip is fastest there, see SPEC §4), and the slot
//! loop.

use crate::{
    assignment::AssignmentRunner,
    slot::{Served, SlotIdentity, serve},
};
use perago_core::{
    bootstrap::{self, EXIT_OK, Exit},
    env,
    manifest::Manifest,
};
use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use perago_core::env::{
    PERAGO_COMPLETION_FD, PERAGO_GENERATION, PERAGO_MANIFEST, PERAGO_SLOT, PERAGO_SLOT_TOKEN,
    PERAGO_SOCKET,
};

/// An executor environment that cannot be run with, naming the variable at fault.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// Variables the supervisor sets are missing: the executor was not started by it.
    #[error(
        "perago-executor is started by perago-supervisor, which sets its identity; missing {}",
        missing.join(", ")
    )]
    Missing {
        /// Every missing variable.
        missing: Vec<&'static str>,
    },
    /// `PERAGO_SLOT` is not a slot number.
    #[error("{PERAGO_SLOT} must be a slot number")]
    Slot {
        /// The value as given.
        value: String,
    },
    /// `PERAGO_GENERATION` is not a generation number.
    #[error("{PERAGO_GENERATION} must be a generation number")]
    Generation {
        /// The value as given.
        value: String,
    },
    /// A recycling limit is bad.
    #[error(transparent)]
    Recycle(#[from] perago_core::capacity::CapacityError),
}

/// The slot identity and manifest path from `lookup` (the process environment for the
/// binary; the supervisor's child environment in thread mode).
pub fn identity_from(
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<(SlotIdentity, PathBuf), IdentityError> {
    let [worker_id, slot, generation, token, socket, manifest] = env::require(
        &lookup,
        [
            env::PERAGO_WORKER_ID,
            PERAGO_SLOT,
            PERAGO_GENERATION,
            PERAGO_SLOT_TOKEN,
            PERAGO_SOCKET,
            PERAGO_MANIFEST,
        ],
    )
    .map_err(|missing| IdentityError::Missing { missing })?;
    let slot = slot.parse().map_err(|_| IdentityError::Slot {
        value: slot.clone(),
    })?;
    let generation = generation.parse().map_err(|_| IdentityError::Generation {
        value: generation.clone(),
    })?;
    let recycle = crate::recycle::RecycleLimits::from_lookup(&lookup)?;
    let completions = lookup(PERAGO_COMPLETION_FD)
        .and_then(|fd| fd.parse().ok())
        .and_then(perago_sys::fd::adopt_fd)
        .map(Arc::new);
    Ok((
        SlotIdentity {
            worker_id,
            slot,
            generation,
            token,
            socket: PathBuf::from(socket),
            completions,
            recycle,
        },
        PathBuf::from(manifest),
    ))
}

/// The body this executor runs: the version the supervisor wrote for it ([`env::PERAGO_BODY`],
/// a manifest's source as checked when the version was taken), never the manifest file as it
/// is on disk now; without one (an executor started by hand), the file at `manifest_path`.
pub fn manifest_from(
    lookup: impl Fn(&str) -> Option<String>,
    manifest_path: &std::path::Path,
) -> Result<Manifest, String> {
    /// A manifest and two schemas of at most 1 MiB each, escaped as JSON.
    const MAX_BODY_BYTES: u64 = 8 * perago_core::files::MAX_CONFIG_BYTES;
    let Some(file) = lookup(env::PERAGO_BODY).filter(|v| !v.is_empty()) else {
        return Manifest::load(manifest_path).map_err(|e| perago_core::errors::chain(&e));
    };
    let file = PathBuf::from(file);
    // The supervisor wrote it, in its private folder: a symlink there is never what it wrote.
    let text = perago_core::files::read_regular_nofollow(&file, MAX_BODY_BYTES).map_err(|e| {
        format!(
            "cannot read the body version {} ({}): {}",
            file.display(),
            env::PERAGO_BODY,
            perago_core::errors::DisplayChain(&e)
        )
    })?;
    let source: perago_core::manifest::ManifestSource =
        serde_json::from_str(&text).map_err(|e| {
            format!(
                "the body version {} ({}) is not a manifest source: {}",
                file.display(),
                env::PERAGO_BODY,
                perago_core::errors::DisplayChain(&e)
            )
        })?;
    source
        .manifest()
        .map_err(|e| perago_core::errors::chain(&e))
}

/// The workspace side of an executor: the root, the lakeFS client (or why there is none: a
/// workspace assignment then fails with that reason, and the executor keeps running), and the
/// owner identity of its attempt directories.
pub fn workspace_runtime(
    identity: &SlotIdentity,
    lookup: impl Fn(&str) -> Option<String>,
) -> crate::assignment::WorkspaceRuntime {
    use crate::workspace::flow::Owner;
    use perago_core::lakefs::{LakefsClient, LakefsConfig};
    let root = lookup(env::PERAGO_WORKSPACE_ROOT)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("perago-workspace"));
    let lakefs = LakefsConfig::from_lookup(&lookup).and_then(|c| LakefsClient::new(&c));
    crate::assignment::WorkspaceRuntime {
        root,
        lakefs,
        owner: Owner {
            slot: identity.slot,
            generation: identity.generation,
        },
    }
}

/// Runs the stock executor process; returns the exit code.
pub fn main() -> i32 {
    main_with(None)
}

/// Runs an executor process whose body is `task` (a Rust task binary) or the manifest's
/// command; returns the exit code.
pub(crate) fn main_with(task: Option<Arc<dyn crate::task::Task>>) -> i32 {
    bootstrap::exit_code(start(task))
}

/// The executor's start ([`bootstrap`]'s exit codes: 2 for an identity it cannot run with, 1
/// for any other failure; 0 when stopped, [`perago_core::recycle::EXIT_RECYCLED`] when it
/// leaves to be recycled).
fn start(task: Option<Arc<dyn crate::task::Task>>) -> Result<i32, Exit> {
    // Payloads up to megabytes reuse warm memory instead of fresh pages for every task.
    perago_sys::memory::retain_freed_memory();
    // This process holds the workspace root's lock (inherited from the supervisor) until it
    // exits; close-on-exec keeps it from every body, which might daemonize and outlive us.
    perago_sys::fd::adopt_root_lock(
        std::env::var(perago_core::env::PERAGO_ROOT_LOCK_FD)
            .ok()
            .as_deref(),
    );
    // It holds its slot token and the lakeFS credentials: no body of the same user may read
    // its memory or /proc/<pid>/environ. Its secrets come over a socket, asked for only after.
    if let Err(e) = perago_sys::memory::set_non_dumpable() {
        eprintln!(
            "warning: cannot make the executor non-dumpable: {}",
            perago_core::errors::DisplayChain(&e)
        );
    }
    // A publication holds a descriptor on every folder of the workspace and on every file it
    // uploads, from the check to the upload (see `workspace::scan`).
    perago_sys::rlimit::raise_nofile_limit();
    // No setting may fall back to its default because its value is not UTF-8.
    bootstrap::check_environment()?;
    let lookup = perago_core::env::secrets_then_env();
    let (identity, manifest_path) = identity_from(&lookup)
        .map_err(|e| bootstrap::config_error(perago_core::errors::DisplayChain(&e)))?;
    let manifest =
        Arc::new(manifest_from(&lookup, &manifest_path).map_err(bootstrap::start_error)?);
    bootstrap::init_logging("perago-executor", &manifest.task.name, &identity.worker_id)?;
    // Whatever a body starts and leaves behind is re-parented here, not to init, so it can
    // be killed when the assignment ends.
    if let Err(e) = perago_sys::reaper::become_subreaper() {
        tracing::warn!(error = %perago_core::errors::DisplayChain(&e), "cannot become a child subreaper: processes a body detaches may outlive it");
    }
    let path = std::env::var_os("PATH");
    let built = match task {
        None => AssignmentRunner::new(manifest, identity.worker_id.clone(), path.as_deref()),
        Some(task) => {
            AssignmentRunner::with_task(manifest, identity.worker_id.clone(), path.as_deref(), task)
        }
    };
    let built = built.map(|runner| runner.with_workspace(workspace_runtime(&identity, &lookup)));
    let runner =
        built.map_err(|e| bootstrap::start_error(perago_core::errors::DisplayChain(&e)))?;
    let runtime = bootstrap::runtime()?;
    let code = perago_core::logging::block_on(&runtime, async {
        let stop = Arc::new(AtomicBool::new(false));
        let (wake_tx, wake_rx) = tokio::sync::mpsc::channel(1);
        let flag = Arc::clone(&stop);
        // The signal handler only sets a flag (and wakes an idle loop to look at it).
        tokio::spawn(async move {
            use tokio::signal::unix::{SignalKind, signal};
            let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
            let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
            loop {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
                flag.store(true, Ordering::SeqCst);
                let _ = wake_tx.try_send(());
            }
        });
        // The slot loop runs as a task of its own, not as the future the runtime blocks on:
        // a wake-up of that future (each message the connection's task hands it) makes the
        // runtime poll the kernel for events first (an `epoll_wait` per message), a task's
        // wake-up only queues it.
        let worker_id = identity.worker_id.clone();
        let served = tokio::spawn(async move { serve(&identity, &runner, stop, wake_rx).await })
            .await
            .unwrap_or_else(|e| match e.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                // Only an abort or the runtime's shutdown cancels a task: neither happens while
                // the runtime runs this.
                Err(e) => unreachable!(
                    "the slot loop's task was cancelled: {}",
                    perago_core::errors::DisplayChain(&e)
                ),
            });
        match served {
            Ok(Served::Stopped) => EXIT_OK,
            Ok(Served::Recycled(why)) => {
                tracing::info!(worker_id = %worker_id, "executor recycled ({why}); exiting for the next generation");
                perago_core::recycle::EXIT_RECYCLED
            }
            Err(e) => bootstrap::failed("slot loop ended", &perago_core::errors::DisplayChain(&e)),
        }
    });
    // A Rust body that overran may still hold a blocking thread: do not wait for it.
    runtime.shutdown_background();
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_identities_are_named_by_their_variant() {
        let missing = identity_from(|_| None).unwrap_err();
        assert!(matches!(missing, IdentityError::Missing { ref missing } if missing.len() == 6));
        let vars = |slot: &'static str| {
            move |name: &str| {
                Some(match name {
                    PERAGO_SLOT => slot.to_owned(),
                    PERAGO_GENERATION => "1".to_owned(),
                    PERAGO_COMPLETION_FD
                    | perago_core::capacity::PERAGO_EXECUTOR_MAX_TASKS
                    | perago_core::capacity::PERAGO_EXECUTOR_MAX_MEMORY => return None,
                    _ if name.starts_with("PERAGO_")
                        && name != env::PERAGO_WORKER_ID
                        && name != PERAGO_SLOT_TOKEN
                        && name != PERAGO_SOCKET
                        && name != PERAGO_MANIFEST =>
                    {
                        return None;
                    }
                    _ => "x".to_owned(),
                })
            }
        };
        assert!(identity_from(vars("1")).is_ok());
        let slot = identity_from(vars("first")).unwrap_err();
        assert!(matches!(slot, IdentityError::Slot { ref value } if value == "first"));
        assert_eq!(slot.to_string(), "PERAGO_SLOT must be a slot number");
    }
}
