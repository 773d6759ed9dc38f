//! `start`: argument resolution, preflight (configuration, TaskDef, workspace-root lock), then
//! the process runtime.

use crate::runtime::{
    children::{Launcher, Program},
    gc, root,
    supervise::{self, RuntimeError, RuntimeSpec, supervise},
};
use crate::{cli::StartArgs, errors::ExpectedError};
use perago_core::{
    capacity::{Capacity, parse_jobs},
    conductor::ConductorClient,
    env,
    identity::WorkerPrefix,
    manifest::{BodyKind, Manifest, TaskKind},
    mode::ExecutionMode,
};
use perago_executor::workspace::lakefs::{LakefsClient, LakefsConfig};
use std::{collections::BTreeMap, path::PathBuf, sync::Arc, time::Duration};

/// How long `start` waits, by default, for an earlier runtime under the same root to drain.
const DEFAULT_ROOT_LOCK_WAIT: Duration = Duration::from_secs(30);

/// What `start` resolved from its arguments and environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StartPlan {
    pub(crate) capacity: Capacity,
    pub(crate) mode: ExecutionMode,
}

/// `-j`, the capacity settings and the execution mode, before anything touches the manifest.
pub(crate) fn resolve_args(
    args: &StartArgs,
    vars: &BTreeMap<String, String>,
) -> Result<StartPlan, ExpectedError> {
    parse_jobs(&args.jobs).map_err(|e| ExpectedError::Usage(e.to_string()))?;
    let capacity = Capacity::resolve(&args.capacity_flags(), |name| vars.get(name).cloned())
        .map_err(|e| ExpectedError::Config(e.problems.iter().map(ToString::to_string).collect()))?;
    let mode = ExecutionMode::resolve(
        args.execution_mode.map(Into::into),
        vars.get(env::PERAGO_EXECUTION_MODE).map(String::as_str),
    )?;
    Ok(StartPlan { capacity, mode })
}

/// The service configuration `start` needs, every missing name reported at once.
pub(crate) fn preflight_config(
    manifest: &Manifest,
    vars: &BTreeMap<String, String>,
) -> Result<(), ExpectedError> {
    let set = |name: &str| vars.get(name).is_some_and(|v| !v.trim().is_empty());
    let mut problems = Vec::new();
    if !set(env::CONDUCTOR_SERVER_URL) {
        problems.push("CONDUCTOR_SERVER_URL is required for perago start".to_owned());
    }
    if manifest.task.kind == TaskKind::Workspace {
        let missing: Vec<&str> = [
            env::LAKEFS_ENDPOINT,
            env::LAKEFS_ACCESS_KEY_ID,
            env::LAKEFS_SECRET_ACCESS_KEY,
        ]
        .into_iter()
        .filter(|name| !set(name))
        .collect();
        if !missing.is_empty() {
            problems.push(format!(
                "LakeFS config is required for workspace tasks: missing {}",
                missing.join(", ")
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(ExpectedError::Config(problems))
    }
}

/// A child binary: `env_override` if set, else `name` beside the running executable.
pub(crate) fn sibling_binary(
    vars: &BTreeMap<String, String>,
    env_override: &str,
    name: &str,
) -> PathBuf {
    if let Some(path) = vars.get(env_override).filter(|v| !v.is_empty()) {
        return PathBuf::from(path);
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join(name)))
        .unwrap_or_else(|| PathBuf::from(name))
}

pub(crate) fn start(
    args: &StartArgs,
    vars: &BTreeMap<String, String>,
) -> Result<(), ExpectedError> {
    let plan = resolve_args(args, vars)?;
    let manifest = Manifest::load(&args.manifest)?;
    preflight_config(&manifest, vars)?;
    let mut problems = Vec::new();
    let prefix = WorkerPrefix::resolve(
        &manifest.task.name,
        vars.get(env::PERAGO_WORKER_ID_PREFIX).map(String::as_str),
    )
    .map_err(|e| problems.push(e.to_string()))
    .ok();
    if let Some(user) = &manifest.body.user
        && let Err(e) = perago_core::process::body_user(user)
    {
        problems.push(e.to_string());
    }
    let force_kill_after = env::duration_var(
        env::PERAGO_SHUTDOWN_FORCE_KILL_AFTER,
        vars.get(env::PERAGO_SHUTDOWN_FORCE_KILL_AFTER)
            .map(String::as_str),
    )
    .map_err(|e| problems.push(e.to_string()))
    .ok()
    .flatten();
    let mut durations = [
        (env::PERAGO_WORKSPACE_GC_INTERVAL, Duration::from_secs(300)),
        (env::PERAGO_WORKSPACE_GC_TTL, Duration::from_secs(24 * 3600)),
        (env::PERAGO_ROOT_LOCK_WAIT, DEFAULT_ROOT_LOCK_WAIT),
    ];
    for (name, value) in &mut durations {
        match env::duration_var(name, vars.get(*name).map(String::as_str)) {
            Ok(Some(d)) => *value = d,
            Ok(None) => {}
            Err(e) => problems.push(e.to_string()),
        }
    }
    let [(_, gc_interval), (_, gc_ttl), (_, lock_wait)] = durations;
    let conductor = ConductorClient::from_lookup(|name| vars.get(name).cloned())
        .map_err(|e| problems.push(e.to_string()))
        .ok();
    if !problems.is_empty() {
        return Err(ExpectedError::Config(problems));
    }
    let (prefix, conductor) = (
        prefix.expect("no problems"),
        conductor.expect("no problems"),
    );

    perago_core::logging::init_stderr("perago-supervisor");
    // A current-thread runtime: children are spawned from the main thread, which lives as long
    // as the supervisor, so their parent-death signal fires only when the supervisor dies.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ExpectedError::AsyncRuntime)?;
    runtime.block_on(async {
        let name = &manifest.task.name;
        match conductor.get_task_def(name).await {
            Ok(Some(_)) => {}
            Ok(None) => return Err(ExpectedError::TaskDefMissing(name.clone())),
            Err(e) => {
                return Err(ExpectedError::TaskDefCheck {
                    name: name.clone(),
                    url: conductor.base_url().to_owned(),
                    cause: e.to_string(),
                });
            }
        }
        let root_path = vars
            .get(env::PERAGO_WORKSPACE_ROOT)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| root::default_root(name, vars));
        // The lock is held by every process of a runtime: once it is ours, no process of an
        // earlier runtime is left to use its attempt directories, and the sweep is safe.
        let locked = root::lock(&root_path, vars, lock_wait).await?;
        tracing::info!(root = %locked.root.display(), runtime_dir = %locked.runtime_dir.display(), "workspace root locked");
        // Another runtime's broker on the socket: touch nothing of it, not even its attempts.
        if let Some(foreign) = supervise::foreign_broker(&locked.socket).await {
            return Err(foreign.into());
        }
        // Staging branches named by the attempts swept are deleted with them.
        let lakefs = (manifest.task.kind == TaskKind::Workspace)
            .then(|| LakefsConfig::from_lookup(|name| vars.get(name).cloned()))
            .and_then(Result::ok)
            .and_then(|config| LakefsClient::new(&config).ok());
        gc::sweep_all(
            &locked.root,
            "left behind by an earlier runtime",
            lakefs.as_ref(),
        )
        .await;
        gc::report_leftovers(&locked.root, &locked.socket);
        let launcher = match plan.mode {
            ExecutionMode::Process => Launcher::Process {
                lock_fd: Some(locked.lock_fd()),
                broker_bin: Program::binary(sibling_binary(
                    vars,
                    env::PERAGO_BROKER_BIN,
                    "perago-broker",
                )),
                executor_bin: Program::binary(match &manifest.body.kind {
                    BodyKind::Executor(path) => path.clone(),
                    BodyKind::Command { .. } => {
                        sibling_binary(vars, env::PERAGO_EXECUTOR_BIN, "perago-executor")
                    }
                }),
            },
            ExecutionMode::Thread => {
                Launcher::thread(Arc::new(manifest.clone()))?
            }
        };
        let manifest_path = std::fs::canonicalize(&args.manifest)
            .unwrap_or_else(|_| args.manifest.clone());
        let spec = RuntimeSpec {
            task_name: name.clone(),
            manifest_path,
            capacity: plan.capacity.clone(),
            prefix,
            conductor_url: conductor.base_url().to_owned(),
            socket: locked.socket.clone(),
            force_kill_after,
            log_root: vars
                .get(env::PERAGO_LOG_ROOT)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .unwrap_or_else(|| root::default_log_root(vars)),
            workspace_root: locked.root.clone(),
            gc_interval,
            gc_ttl,
            child_env: Vec::new(),
            lakefs: lakefs.clone(),
        };
        let result = supervise(spec, launcher, std::future::pending()).await;
        if !matches!(result, Err(RuntimeError::ForeignBroker { .. })) {
            gc::sweep_all(&locked.root, "final sweep after shutdown", lakefs.as_ref()).await;
            gc::report_leftovers(&locked.root, &locked.socket);
        }
        drop(locked);
        Ok(result?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::ModeArg;
    use std::path::PathBuf;

    fn args(jobs: i64, mode: Option<ModeArg>) -> StartArgs {
        StartArgs {
            manifest: PathBuf::from("task.toml"),
            jobs: jobs.to_string(),
            execution_mode: mode,
            once: false,
            max_tasks_per_executor: None,
            max_executor_memory: None,
        }
    }

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn worker_count_is_checked_first() {
        for jobs in [0, -1] {
            let err = resolve_args(&args(jobs, None), &vars(&[])).unwrap_err();
            assert_eq!(err.to_string(), "worker process count must be at least 1");
            assert_eq!(err.process_exit_code(), 2);
        }
        let plan = resolve_args(&args(4, None), &vars(&[])).unwrap();
        assert_eq!(plan.capacity, Capacity::fixed(4));
        let mut range = args(1, None);
        range.jobs = "4..2".to_owned();
        let err = resolve_args(&range, &vars(&[])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "-j 4..2: the minimum (4) is above the maximum (2)"
        );
        assert_eq!(err.process_exit_code(), 2);
        // Capacity problems are configuration errors, all at once, each named.
        let mut bad = args(2, None);
        bad.max_tasks_per_executor = Some("none".to_owned());
        let err = resolve_args(&bad, &vars(&[("PERAGO_MIN_FREE_MEMORY", "x")])).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("--max-tasks-per-executor \"none\""), "{text}");
        assert!(text.contains("PERAGO_MIN_FREE_MEMORY"), "{text}");
        assert_eq!(err.process_exit_code(), 1);
    }

    #[test]
    fn execution_mode_flag_then_env_then_process() {
        let mode = |m, env: &[(&str, &str)]| resolve_args(&args(1, m), &vars(env)).map(|p| p.mode);
        assert_eq!(mode(None, &[]).unwrap(), ExecutionMode::Process);
        assert_eq!(
            mode(None, &[("PERAGO_EXECUTION_MODE", "thread")]).unwrap(),
            ExecutionMode::Thread
        );
        assert_eq!(
            mode(
                Some(ModeArg::Process),
                &[("PERAGO_EXECUTION_MODE", "thread")]
            )
            .unwrap(),
            ExecutionMode::Process
        );
        assert_eq!(
            mode(None, &[("PERAGO_EXECUTION_MODE", "fork")])
                .unwrap_err()
                .to_string(),
            "invalid execution mode \"fork\" in PERAGO_EXECUTION_MODE: expected process or thread"
        );
    }
}
