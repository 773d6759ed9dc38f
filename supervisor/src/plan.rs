//! The runtime plan `start` and `dev` share: what every runtime of one supervisor has in
//! common ([`Plan`]), one task type's part ([`TaskPlan`]), and from both, once a task's root is
//! locked, the [`RuntimeSpec`] and [`Launcher`] its runtime runs with. Every default is written
//! here once; `dev` adds only its own (the embedded devstack's URLs and credentials, its
//! fixed capacity, its private root).

use crate::{
    errors::ExpectedError,
    runtime::{
        children::{Launcher, Program},
        notify::NotifyHandle,
        root::LockedRoot,
        supervise::RuntimeSpec,
    },
};
use perago_core::{
    capacity::Capacity, conductor::Domain, env, identity::WorkerPrefix, lakefs::LakefsClient,
    manifest::Manifest, mode::ExecutionMode,
};
use std::{collections::BTreeMap, path::PathBuf, sync::Arc, time::Duration};

/// How often the attempt GC runs by default (`PERAGO_WORKSPACE_GC_INTERVAL`).
pub(crate) const DEFAULT_GC_INTERVAL: Duration = Duration::from_secs(300);
/// The age after which the GC removes an attempt no live executor owns, by default
/// (`PERAGO_WORKSPACE_GC_TTL`).
pub(crate) const DEFAULT_GC_TTL: Duration = Duration::from_secs(24 * 3600);

/// Where the broker and the stock executor come from when no variable
/// (`PERAGO_BROKER_BIN`, `PERAGO_EXECUTOR_BIN`) names them; a manifest's `body.executor` is
/// always its own binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Programs {
    /// `perago-broker` and `perago-executor` beside the running executable (`start`).
    Siblings,
    /// This very program in a role (`dev`: nothing else has to be built).
    #[cfg(feature = "dev")]
    ThisProgram,
}

/// What every runtime of one supervisor shares.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) programs: Programs,
    pub(crate) conductor_url: String,
    /// `PERAGO_SHUTDOWN_FORCE_KILL_AFTER` (`None`: the drain waits).
    pub(crate) force_kill_after: Option<Duration>,
    pub(crate) log_root: PathBuf,
    pub(crate) gc_interval: Duration,
    pub(crate) gc_ttl: Duration,
    /// Extra environment for every child.
    pub(crate) child_env: Vec<(String, String)>,
    pub(crate) stall_timeout: Option<Duration>,
    /// Several task types: each child's argv[0] names its task.
    pub(crate) several: bool,
}

/// One task type of a plan, resolved.
#[derive(Debug)]
pub(crate) struct TaskPlan {
    pub(crate) manifest: Manifest,
    pub(crate) manifest_path: PathBuf,
    pub(crate) capacity: Capacity,
    pub(crate) prefix: WorkerPrefix,
    /// The task domain the broker polls in (`--domain`, `--domain NAME=…`); `None`: the
    /// default queue. A setting from the SDK's names (`CONDUCTOR_WORKER_<TASK>_DOMAIN`) goes
    /// here when no flag gave one (see [`crate::start::StartPlan::domain_of`]).
    pub(crate) domain: Option<Domain>,
    /// How this task type runs (`--execution-mode [NAME=]MODE`).
    pub(crate) mode: ExecutionMode,
    /// Extra environment for this task type's children (the SDK's poll settings).
    pub(crate) env: Vec<(String, String)>,
    /// The Conductor SDK's settings that apply, as `(property, value, variable)`.
    pub(crate) sdk_settings: Vec<(crate::sdk_settings::Property, String, String)>,
    /// The `[worker]` settings a flag or variable set instead of the manifest, by manifest
    /// key (see `reload::Running::overrides`).
    pub(crate) overrides: BTreeMap<&'static str, String>,
}

impl TaskPlan {
    /// A task type with no settings of its own beyond its capacity, in `mode` (`dev`'s).
    #[cfg(any(feature = "dev", test))]
    pub(crate) fn new(
        manifest: Manifest,
        manifest_path: PathBuf,
        capacity: Capacity,
        prefix: WorkerPrefix,
        mode: ExecutionMode,
    ) -> Self {
        Self {
            manifest,
            manifest_path,
            capacity,
            prefix,
            mode,
            env: Vec::new(),
            sdk_settings: Vec::new(),
            domain: None,
            overrides: BTreeMap::new(),
        }
    }
}

impl Plan {
    /// The plan's defaults, for the settings the caller then overrides.
    pub(crate) fn new(programs: Programs, conductor_url: String) -> Self {
        Self {
            programs,
            conductor_url,
            force_kill_after: None,
            log_root: PathBuf::new(),
            gc_interval: DEFAULT_GC_INTERVAL,
            gc_ttl: DEFAULT_GC_TTL,
            child_env: Vec::new(),
            stall_timeout: None,
            several: false,
        }
    }

    /// The runtime of `task` under its locked root: its spec and how its children start.
    pub(crate) fn runtime(
        &self,
        task: TaskPlan,
        locked: &LockedRoot,
        lakefs: Option<LakefsClient>,
        notify: Option<NotifyHandle>,
        vars: &BTreeMap<String, String>,
    ) -> Result<(RuntimeSpec, Launcher), ExpectedError> {
        let launcher = self.launcher(&task.manifest, task.mode, locked, vars)?;
        let mut child_env = self.child_env.clone();
        child_env.extend(task.env);
        // What the broker reports in Admin.Status: how this runtime runs, and the SDK settings
        // that applied to it.
        child_env.push((env::PERAGO_EXECUTION_MODE.to_owned(), task.mode.to_string()));
        // The soft time limit in force, which `reload` changes (Admin.Reconfigure).
        child_env.push((
            env::PERAGO_SOFT_TIME_LIMIT_MS.to_owned(),
            task.manifest
                .body
                .soft_time_limit
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
                .to_string(),
        ));
        if !task.sdk_settings.is_empty() {
            let rows: Vec<serde_json::Value> = task
                .sdk_settings
                .iter()
                .map(|(property, value, variable)| {
                    serde_json::json!({
                        "property": property.name(),
                        "value": value,
                        "variable": variable,
                    })
                })
                .collect();
            child_env.push((
                env::PERAGO_SDK_SETTINGS.to_owned(),
                serde_json::Value::from(rows).to_string(),
            ));
        }
        let name = task.manifest.task.name.clone();
        let spec = RuntimeSpec {
            task_name: name.clone(),
            manifest_path: task.manifest_path,
            manifest: Arc::new(task.manifest),
            capacity: task.capacity,
            prefix: task.prefix,
            domain: task.domain,
            conductor_url: self.conductor_url.clone(),
            socket: locked.socket.clone(),
            force_kill_after: self.force_kill_after,
            log_root: self.log_root.clone(),
            workspace_root: locked.root.clone(),
            gc_interval: self.gc_interval,
            gc_ttl: self.gc_ttl,
            child_env,
            lakefs,
            notify,
            process_label: self.several.then_some(name),
            stall_timeout: self.stall_timeout,
            rolls: None,
        };
        Ok((spec, launcher))
    }

    /// How the children of `manifest`'s runtime start.
    fn launcher(
        &self,
        manifest: &Manifest,
        mode: ExecutionMode,
        locked: &LockedRoot,
        vars: &BTreeMap<String, String>,
    ) -> Result<Launcher, ExpectedError> {
        match mode {
            ExecutionMode::Thread => Ok(Launcher::thread(Arc::new(manifest.clone()))?),
            ExecutionMode::Process => Ok(Launcher::Process {
                lock_fd: Some(locked.lock_fd()),
                broker_bin: self.program(vars, Role::Broker)?,
                // The stock executor; a body version whose body is `body.executor` runs that
                // binary instead (chosen at each spawn: a roll may change it).
                executor_bin: self.program(vars, Role::Executor)?,
            }),
        }
    }

    /// The program of `role`: its variable if set, else as [`Programs`] says.
    fn program(
        &self,
        vars: &BTreeMap<String, String>,
        role: Role,
    ) -> Result<Program, ExpectedError> {
        let (variable, sibling) = match role {
            Role::Broker => (env::PERAGO_BROKER_BIN, "perago-broker"),
            Role::Executor => (env::PERAGO_EXECUTOR_BIN, "perago-executor"),
        };
        match self.programs {
            Programs::Siblings => Ok(Program::binary(crate::start::sibling_binary(
                vars, variable, sibling,
            ))),
            #[cfg(feature = "dev")]
            Programs::ThisProgram => {
                use crate::runtime::children::{BROKER_ROLE_ARG, EXECUTOR_ROLE_ARG};
                if let Some(path) = vars.get(variable).filter(|v| !v.is_empty()) {
                    return Ok(Program::binary(path.into()));
                }
                let role = match role {
                    Role::Broker => BROKER_ROLE_ARG,
                    Role::Executor => EXECUTOR_ROLE_ARG,
                };
                Program::this_program(role)
                    .map_err(|source| crate::dev::DevError::ThisProgram { role, source }.into())
            }
        }
    }
}

/// A child program of a runtime.
#[derive(Debug, Clone, Copy)]
enum Role {
    Broker,
    Executor,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(body: &str) -> Manifest {
        Manifest::parse(
            std::path::Path::new("task.toml"),
            std::path::Path::new("/srv"),
            &format!(
                "[task]\nname = \"orders.ship\"\nkind = \"workspace-free\"\ntimeout_seconds = 1\n\n[body]\n{body}\n"
            ),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn one_plan_gives_every_runtime_its_defaults_and_its_task() {
        let tmp = tempfile::tempdir().unwrap();
        let vars: BTreeMap<String, String> = [
            ("XDG_RUNTIME_DIR", tmp.path().join("run")),
            (env::PERAGO_BROKER_BIN, PathBuf::from("/opt/broker")),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.display().to_string()))
        .collect();
        let locked = crate::runtime::root::lock(&tmp.path().join("root"), &vars, Duration::ZERO)
            .await
            .unwrap();
        let mut plan = Plan::new(Programs::Siblings, "http://conductor".to_owned());
        plan.several = true;
        let task = TaskPlan::new(
            manifest("command = [\"true\"]"),
            PathBuf::from("/srv/task.toml"),
            Capacity::fixed(2),
            WorkerPrefix::derive("orders.ship").unwrap(),
            ExecutionMode::Process,
        );
        let (spec, launcher) = plan.runtime(task, &locked, None, None, &vars).unwrap();
        assert_eq!(spec.task_name, "orders.ship");
        assert_eq!(
            (spec.gc_interval, spec.gc_ttl),
            (DEFAULT_GC_INTERVAL, DEFAULT_GC_TTL)
        );
        assert_eq!(
            (DEFAULT_GC_INTERVAL, DEFAULT_GC_TTL),
            (Duration::from_secs(300), Duration::from_secs(86_400))
        );
        assert_eq!(spec.socket, locked.socket);
        assert_eq!(spec.workspace_root, locked.root);
        assert_eq!(spec.process_label.as_deref(), Some("orders.ship"));
        assert_eq!(spec.capacity, Capacity::fixed(2));
        let Launcher::Process {
            broker_bin,
            executor_bin,
            lock_fd,
        } = launcher
        else {
            panic!("process mode gives a process launcher");
        };
        assert_eq!(lock_fd, Some(locked.lock_fd()));
        assert_eq!(
            format!("{broker_bin:?}"),
            format!("{:?}", Program::binary("/opt/broker".into()))
        );
        assert!(
            format!("{executor_bin:?}").contains("perago-executor"),
            "{executor_bin:?}"
        );
        // A Rust task binary is its own executor; thread mode refuses it.
        let task = TaskPlan::new(
            manifest("executor = \"/bin/task\""),
            PathBuf::from("/srv/task.toml"),
            Capacity::fixed(1),
            WorkerPrefix::derive("orders.ship").unwrap(),
            ExecutionMode::Thread,
        );
        assert!(matches!(
            plan.runtime(task, &locked, None, None, &vars),
            Err(ExpectedError::ThreadMode(_))
        ));
    }
}
