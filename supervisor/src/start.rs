//! `start`: argument resolution and preflight. The runtime itself (broker, executors,
//! restarts, drain) is not built yet, and `start` says so instead of pretending.

use crate::{cli::StartArgs, errors::ExpectedError};
use perago_core::{
    env,
    manifest::{Manifest, TaskKind},
    mode::{ExecutionMode, WorkerCount},
};
use std::collections::BTreeMap;

/// What `start` resolved from its arguments and environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StartPlan {
    pub(crate) workers: WorkerCount,
    pub(crate) mode: ExecutionMode,
}

/// `-j` and the execution mode, before anything touches the manifest.
pub(crate) fn resolve_args(
    args: &StartArgs,
    vars: &BTreeMap<String, String>,
) -> Result<StartPlan, ExpectedError> {
    let workers = WorkerCount::new(args.jobs)?;
    let mode = ExecutionMode::resolve(
        args.execution_mode.map(Into::into),
        vars.get(env::PERAGO_EXECUTION_MODE).map(String::as_str),
    )?;
    Ok(StartPlan { workers, mode })
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

pub(crate) fn start(
    args: &StartArgs,
    vars: &BTreeMap<String, String>,
) -> Result<(), ExpectedError> {
    let _plan = resolve_args(args, vars)?;
    let manifest = Manifest::load(&args.manifest)?;
    preflight_config(&manifest, vars)?;
    Err(ExpectedError::NotYetAvailable(
        "perago start cannot run tasks yet: the broker and executor runtime is not built (the manifest and configuration above were checked)",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::ModeArg;
    use std::path::PathBuf;

    fn args(jobs: i64, mode: Option<ModeArg>) -> StartArgs {
        StartArgs {
            manifest: PathBuf::from("task.toml"),
            jobs,
            execution_mode: mode,
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
        assert_eq!(plan.workers.get(), 4);
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
