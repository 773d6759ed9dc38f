//! A runtime per task type: what one needs ([`RuntimeSpec`]) and running several side by side
//! ([`supervise_all`]). One runtime is an actor (`actor.rs`) performing the effects of the
//! supervisor's machine (`machine.rs`): it alone starts and reaps processes; it tells the
//! broker about every executor generation over `Control`, and starts a drain over `Admin`.
//!
//! ```text
//! socket free → broker up (answers with its own pid) → per slot: SlotStarted(gen, token) → spawn executor
//! executor exits, not draining → SlotExited → restart after 1, 2, 4, 8, 16, 30, 30… s
//!   (not when the broker retired its slot: `-j MIN..MAX` scaling down)
//! executor exits EXIT_RECYCLED (a recycling limit) → SlotExited → restart at once, no backoff
//! Admin.Watch (each change, a heartbeat every second): start the executors of slots the
//!   broker wants (scaling up); silent for PERAGO_STALL_TIMEOUT: the broker is killed
//! under systemd (`NOTIFY_SOCKET`): READY=1 once the starting executors are attached, STATUS=
//!   busy/idle as the broker's state changes, STOPPING=1 at a drain, WATCHDOG=1 while its state
//!   keeps coming
//! SIGINT/SIGTERM → Admin.Drain; the broker stops executors and exits once all is reported
//! broker exits unexpectedly → SIGTERM executors, wait, exit 1
//! ```

use super::{children::Launcher, notify::NotifyHandle};
use perago_core::identity::WorkerPrefix;
use std::{collections::BTreeMap, path::PathBuf, pin::Pin, time::Duration};
use tracing::Instrument as _;

pub(crate) use super::actor::{foreign_broker, supervise};
pub(crate) use crate::errors::RuntimeError;

/// How long the broker has to start serving its socket.
pub(crate) const BROKER_START_DEADLINE: Duration = Duration::from_secs(15);

/// What the runtime needs to start.
#[derive(Debug)]
pub(crate) struct RuntimeSpec {
    pub(crate) task_name: String,
    pub(crate) manifest_path: PathBuf,
    /// The manifest as `start` checked it: body version 1 (executors start from it, not
    /// from the file, which may have changed since).
    pub(crate) manifest: std::sync::Arc<perago_core::manifest::Manifest>,
    /// `-j` and the other capacity and lifecycle settings (passed to every child).
    pub(crate) capacity: perago_core::capacity::Capacity,
    pub(crate) prefix: WorkerPrefix,
    /// The task domain polled in (`PERAGO_DOMAIN` for the broker); `None`: the default queue.
    pub(crate) domain: Option<perago_core::conductor::Domain>,
    pub(crate) conductor_url: String,
    pub(crate) socket: PathBuf,
    pub(crate) force_kill_after: Option<Duration>,
    /// `PERAGO_LOG_ROOT` for the children's JSONL logs.
    pub(crate) log_root: PathBuf,
    /// The locked workspace root (`PERAGO_WORKSPACE_ROOT` for the executors).
    pub(crate) workspace_root: PathBuf,
    /// How often the attempt GC runs.
    pub(crate) gc_interval: Duration,
    /// Age after which an attempt not owned by a live executor is removed.
    pub(crate) gc_ttl: Duration,
    /// Extra environment for every child (tests: a shorter long-poll).
    pub(crate) child_env: Vec<(String, String)>,
    /// For the GC to delete staging branches left by killed executors (workspace tasks).
    pub(crate) lakefs: Option<perago_core::lakefs::LakefsClient>,
    /// systemd's notify socket (under a `Type=notify` unit), shared with the other task
    /// types' runtimes of this supervisor.
    pub(crate) notify: Option<NotifyHandle>,
    /// When the supervisor runs several task types: the task name, after an `@` in each
    /// child's argv[0] (`perago-executor-0001@orders.ship`), so `ps` tells them apart.
    pub(crate) process_label: Option<String>,
    /// `PERAGO_STALL_TIMEOUT` (`None`: off): passed to every child; a broker whose state
    /// stream (`Admin.Watch`) has sent nothing for this long is killed.
    pub(crate) stall_timeout: Option<Duration>,
    /// Where `reload` (and SIGHUP) sends a changed body to roll in (`None`: nothing can ask,
    /// as under `dev`).
    pub(crate) rolls: Option<tokio::sync::mpsc::UnboundedReceiver<super::body::RollRequest>>,
}

/// Runs the runtimes of several task types side by side (one runtime each: its own broker,
/// executors, socket and root), each until its drain completes, and returns each task name
/// with its runtime's result, in order. A runtime that fails (its broker died, a generation
/// was refused, …) drains the others: a supervisor stands or falls as a whole. Signals reach
/// every runtime (each drains on SIGINT/SIGTERM).
/// `stop` drains them all (with the reason it gives).
pub(crate) async fn supervise_all(
    runs: Vec<(RuntimeSpec, Launcher)>,
    stop: impl Future<Output = String>,
) -> Vec<(String, Result<(), RuntimeError>)> {
    let runs = runs
        .into_iter()
        .map(|(spec, launcher)| {
            let name = spec.task_name.clone();
            // Each line a runtime logs says which task type it is.
            let span = tracing::info_span!("runtime", task = %name);
            let run = move |stop: StopFuture| supervise(spec, launcher, stop).instrument(span);
            (name, run)
        })
        .collect();
    run_all(runs, stop).await
}

/// What drains a runtime of [`run_all`], with the reason.
pub(crate) type StopFuture = Pin<Box<dyn Future<Output = String> + Send>>;

/// [`supervise_all`] over any runtimes: each `(task name, run)` is started with the future
/// that tells it to drain.
pub(crate) async fn run_all<R, F>(
    runs: Vec<(String, R)>,
    stop: impl Future<Output = String>,
) -> Vec<(String, Result<(), RuntimeError>)>
where
    R: FnOnce(StopFuture) -> F,
    F: Future<Output = Result<(), RuntimeError>> + Send + 'static,
{
    // The first reason to stop them all; every runtime drains when it is set.
    let (stop_tx, _) = tokio::sync::watch::channel(None::<String>);
    let stop_all = |why: String| {
        stop_tx
            .send_if_modified(|current| current.is_none().then(|| *current = Some(why)).is_some());
    };
    let mut stop = std::pin::pin!(stop);
    let mut stop_fired = false;
    let mut running = tokio::task::JoinSet::new();
    let mut index_of = BTreeMap::new();
    let names: Vec<String> = runs.iter().map(|(name, _)| name.clone()).collect();
    for (index, (name, run)) in runs.into_iter().enumerate() {
        let mut stop_rx = stop_tx.subscribe();
        let stop: StopFuture = Box::pin(async move {
            let why = stop_rx
                .wait_for(Option::is_some)
                .await
                .map(|why| why.clone().unwrap_or_default());
            match why {
                Ok(why) => why,
                // Never: the sender outlives every runtime.
                Err(_) => std::future::pending().await,
            }
        });
        debug_assert_eq!(name, names[index]);
        let task = running.spawn(run(stop));
        index_of.insert(task.id(), index);
    }
    let mut results: Vec<Option<Result<(), RuntimeError>>> = names.iter().map(|_| None).collect();
    loop {
        tokio::select! {
            joined = running.join_next_with_id() => {
                let (id, result) = match joined {
                    None => break,
                    Some(Ok((id, result))) => (id, result),
                    Some(Err(e)) => (e.id(), Err(RuntimeError::Panicked { cause: perago_core::errors::chain(&e) })),
                };
                let index = index_of[&id];
                if let Err(e) = &result
                    && !matches!(e, RuntimeError::ForceKilled { .. })
                {
                    stop_all(format!("the runtime of task {} stopped ({})", names[index], perago_core::errors::DisplayChain(&e)));
                }
                results[index] = Some(result);
            }
            why = &mut stop, if !stop_fired => {
                stop_fired = true;
                stop_all(why);
            }
        }
    }
    names
        .into_iter()
        .zip(results)
        .map(|(name, result)| (name, result.expect("every runtime's task was joined")))
        .collect()
}

#[cfg(test)]
#[path = "supervise_tests.rs"]
mod tests;
