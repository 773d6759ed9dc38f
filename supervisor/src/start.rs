//! `start`: argument resolution, preflight (configuration, TaskDef, workspace-root lock), then
//! the process runtime.

use crate::plan::{DEFAULT_GC_INTERVAL, DEFAULT_GC_TTL, Plan, Programs, TaskPlan};
use crate::runtime::{
    gc, metrics, notify, registry, root,
    supervise::{self, RuntimeError},
};
use crate::{
    cli::StartArgs,
    errors::ExpectedError,
    sdk_settings::{Property, SdkSettings},
};
use perago_core::lakefs::{LakefsClient, LakefsConfig};
use perago_core::{
    capacity::{Capacity, parse_jobs},
    conductor::{ConductorClient, Domain},
    env,
    identity::WorkerPrefix,
    manifest::{Manifest, TaskKind},
    mode::ExecutionMode,
};
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

/// The SDK's `domain` and `paused` for a task type (`conductor.worker.<task>.domain`,
/// `CONDUCTOR_WORKER_ALL_PAUSED`, …), checked as `--domain` is. The caller applies each only
/// where perago's own flags and variables left it unset.
fn sdk_domain_and_paused(sdk: &SdkSettings) -> Result<(Option<Domain>, Option<bool>), String> {
    let domain = sdk
        .domain_for()
        .map(|domain| {
            Domain::parse(&domain.value).map_err(|e| {
                format!(
                    "{} {:?}: {}",
                    domain.variable,
                    domain.value,
                    perago_core::errors::DisplayChain(&e)
                )
            })
        })
        .transpose()?;
    Ok((domain, sdk.paused_for().map(|paused| paused.value)))
}

/// What sets each `[worker]` setting of the task type `name` at start instead of the
/// manifest, by manifest key (`worker.domain` → `--domain blue`): perago's flags, its
/// variables, then the Conductor SDK's names. `reload` refuses a manifest change such a
/// setting would hide.
fn worker_overrides(
    name: &str,
    plan: &StartPlan,
    args: &StartArgs,
    vars: &BTreeMap<String, String>,
    sdk: Option<&SdkSettings>,
    sdk_domain: bool,
) -> BTreeMap<&'static str, String> {
    let variable = |name: &str| {
        vars.get(name)
            .filter(|v| !v.trim().is_empty())
            .map(|v| format!("{name}={v:?}"))
    };
    let sdk_variable = |found: Option<&str>| found.map(str::to_owned);
    let mut out = BTreeMap::new();
    let mut set = |key: &'static str, winner: Option<String>| {
        if let Some(winner) = winner {
            out.insert(key, winner);
        }
    };
    let domain = match (plan.named_domains.get(name), &plan.domain) {
        (Some(d), _) => Some(format!("--domain {name}={d}")),
        (None, Some(d)) => Some(format!("--domain {d}")),
        (None, None) if sdk_domain => sdk_variable(
            sdk.and_then(|s| s.domain.as_ref())
                .map(|s| s.variable.as_str()),
        ),
        (None, None) => None,
    };
    set("worker.domain", domain);
    set(
        "worker.paused",
        args.paused
            .then(|| "--paused".to_owned())
            .or_else(|| variable(perago_core::capacity::PERAGO_PAUSED))
            .or_else(|| {
                sdk_variable(
                    sdk.and_then(|s| s.paused.as_ref())
                        .map(|s| s.variable.as_str()),
                )
            }),
    );
    set(
        "worker.poll_interval",
        variable(env::PERAGO_POLL_INTERVAL_MS).or_else(|| {
            sdk_variable(
                sdk.and_then(|s| s.poll_interval.as_ref())
                    .map(|s| s.variable.as_str()),
            )
        }),
    );
    set(
        "worker.poll_timeout",
        variable(env::PERAGO_POLL_WAIT_MS).or_else(|| {
            sdk_variable(
                sdk.and_then(|s| s.poll_timeout.as_ref())
                    .map(|s| s.variable.as_str()),
            )
        }),
    );
    set(
        "worker.max_tasks_per_executor",
        args.max_tasks_per_executor
            .as_ref()
            .map(|n| format!("--max-tasks-per-executor {n}"))
            .or_else(|| variable(perago_core::capacity::PERAGO_EXECUTOR_MAX_TASKS)),
    );
    set(
        "worker.max_executor_memory",
        args.max_executor_memory
            .as_ref()
            .map(|n| format!("--max-executor-memory {n}"))
            .or_else(|| variable(perago_core::capacity::PERAGO_EXECUTOR_MAX_MEMORY)),
    );
    set(
        "worker.min_free_memory",
        variable(perago_core::capacity::PERAGO_MIN_FREE_MEMORY),
    );
    out
}

/// The manifest's `[worker]` settings that nothing in `overrides` set, into the task type's
/// capacity and its children's environment (the poll settings go to the broker as
/// PERAGO_POLL_INTERVAL_MS / PERAGO_POLL_WAIT_MS). The domain is taken where the plan is made.
fn apply_worker(
    worker: &perago_core::manifest::WorkerSpec,
    overrides: &BTreeMap<&'static str, String>,
    capacity: &mut Capacity,
    task_env: &mut Vec<(String, String)>,
) {
    let free = |key: &str| !overrides.contains_key(key);
    if let Some(paused) = worker.paused
        && free("worker.paused")
    {
        capacity.paused = paused;
    }
    let mut set_env = |key: &str, variable: &str, value: Option<Duration>| {
        if let Some(d) = value
            && free(key)
        {
            task_env.retain(|(name, _)| name != variable);
            task_env.push((variable.to_owned(), d.as_millis().to_string()));
        }
    };
    set_env(
        "worker.poll_interval",
        env::PERAGO_POLL_INTERVAL_MS,
        worker.poll_interval,
    );
    set_env(
        "worker.poll_timeout",
        env::PERAGO_POLL_WAIT_MS,
        worker.poll_timeout,
    );
    if free("worker.max_tasks_per_executor") && worker.max_tasks_per_executor.is_some() {
        capacity.max_tasks_per_executor = worker.max_tasks_per_executor;
    }
    if free("worker.max_executor_memory") && worker.max_executor_memory.is_some() {
        capacity.max_executor_memory = worker.max_executor_memory;
    }
    if free("worker.min_free_memory") && worker.min_free_memory.is_some() {
        capacity.min_free_memory = worker.min_free_memory;
    }
}

/// How long `start` waits, by default, for an earlier runtime under the same root to drain.
const DEFAULT_ROOT_LOCK_WAIT: Duration = Duration::from_secs(30);

/// What `start` resolved from its arguments and environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StartPlan {
    /// The capacity of every task type without a `-j NAME=…` of its own.
    pub(crate) capacity: Capacity,
    /// `-j NAME=N` / `-j NAME=MIN..MAX`: one task type's capacity, by task name.
    pub(crate) named: BTreeMap<String, Capacity>,
    /// The execution mode of every task type without a `--execution-mode NAME=…` of its own.
    pub(crate) mode: ExecutionMode,
    /// `--domain DOMAIN`: the domain of every task type without one of its own.
    pub(crate) domain: Option<Domain>,
    /// `--domain NAME=DOMAIN`: one task type's domain, by task name.
    pub(crate) named_domains: BTreeMap<String, Domain>,
    /// `--execution-mode NAME=MODE`: one task type's mode, by task name.
    pub(crate) modes: BTreeMap<String, ExecutionMode>,
    /// `-j` given on the command line: the SDK's `thread_count` does not apply.
    pub(crate) jobs_given: bool,
}

impl StartPlan {
    /// The execution mode of the task type `name`.
    pub(crate) fn mode_of(&self, name: &str) -> ExecutionMode {
        self.modes.get(name).copied().unwrap_or(self.mode)
    }

    /// The capacity of the task type `name` with its SDK settings: `-j` (for every task type
    /// or for this one) wins, then the SDK's `thread_count` (named by its variable).
    fn capacity_with_sdk(
        &self,
        name: &str,
        sdk: Option<&SdkSettings>,
        args: &StartArgs,
        vars: &BTreeMap<String, String>,
    ) -> Result<Capacity, String> {
        if self.named.contains_key(name) || self.jobs_given {
            return Ok(self.capacity_of(name).clone());
        }
        match sdk.and_then(|s| s.thread_count.as_ref()) {
            None => Ok(self.capacity_of(name).clone()),
            Some(count) => Capacity::resolve(&args.capacity_flags(&count.value.to_string()), |n| {
                vars.get(n).cloned()
            })
            .map_err(|e| {
                format!(
                    "{}: {}",
                    count.variable,
                    perago_core::errors::DisplayChain(&e)
                )
            }),
        }
    }

    /// The capacity of the task type `name`.
    pub(crate) fn capacity_of(&self, name: &str) -> &Capacity {
        self.named.get(name).unwrap_or(&self.capacity)
    }

    /// The domain the flags give the task type `name` (`--domain NAME=…`, else `--domain …`);
    /// `None`: no flag gave one, and a setting under the SDK's names may.
    pub(crate) fn domain_of(&self, name: &str) -> Option<&Domain> {
        self.named_domains.get(name).or(self.domain.as_ref())
    }

    /// Every `-j NAME=…` and `--domain NAME=…` names one of `names`.
    fn check_names(&self, names: &[&str]) -> Result<(), ExpectedError> {
        let unknown = |keys: Vec<&String>, flag: &str| match keys
            .into_iter()
            .find(|n| !names.contains(&n.as_str()))
        {
            None => Ok(()),
            Some(unknown) => Err(ExpectedError::Usage(format!(
                "{flag} {unknown}=…: no manifest given has the task {unknown} (tasks: {})",
                names.join(", ")
            ))),
        };
        unknown(self.named_domains.keys().collect(), "--domain")?;
        unknown(self.named.keys().collect(), "-j")?;
        unknown(self.modes.keys().collect(), "--execution-mode")
    }
}

/// The `-j` values: at most one for every task type (`N`, `MIN..MAX`; default 1), and one
/// `NAME=N` / `NAME=MIN..MAX` per task name.
fn split_jobs(values: &[String]) -> Result<(String, Vec<(String, String)>), ExpectedError> {
    let mut every: Option<&str> = None;
    let mut named: Vec<(String, String)> = Vec::new();
    for value in values {
        match value.split_once('=') {
            Some((name, jobs)) => {
                let name = name.trim();
                if name.is_empty() {
                    return Err(ExpectedError::Usage(format!(
                        "-j {value:?}: expected NAME=N or NAME=MIN..MAX"
                    )));
                }
                if named.iter().any(|(n, _)| n == name) {
                    return Err(ExpectedError::Usage(format!(
                        "-j {name}=…: given twice for the task {name}"
                    )));
                }
                named.push((name.to_owned(), jobs.to_owned()));
            }
            None => {
                if let Some(first) = every {
                    return Err(ExpectedError::Usage(format!(
                        "-j {first} and -j {value}: give one count for every task type, and NAME=N for one task type"
                    )));
                }
                every = Some(value);
            }
        }
    }
    Ok((every.unwrap_or("1").to_owned(), named))
}

/// The `--domain` values: at most one for every task type, and one `NAME=DOMAIN` per task
/// name; each a domain Conductor can route to (see [`Domain::parse`]).
fn split_domains(
    values: &[String],
) -> Result<(Option<Domain>, BTreeMap<String, Domain>), ExpectedError> {
    let parse = |flag: &str, value: &str| {
        Domain::parse(value).map_err(|e| {
            ExpectedError::Usage(format!(
                "--domain {flag}: {}",
                perago_core::errors::DisplayChain(&e)
            ))
        })
    };
    let mut every: Option<Domain> = None;
    let mut named = BTreeMap::new();
    for value in values {
        match value.split_once('=') {
            Some((name, domain)) => {
                let name = name.trim();
                if name.is_empty() {
                    return Err(ExpectedError::Usage(format!(
                        "--domain {value:?}: expected DOMAIN or NAME=DOMAIN"
                    )));
                }
                if named.contains_key(name) {
                    return Err(ExpectedError::Usage(format!(
                        "--domain {name}=…: given twice for the task {name}"
                    )));
                }
                named.insert(name.to_owned(), parse(value, domain)?);
            }
            None => {
                if let Some(first) = &every {
                    return Err(ExpectedError::Usage(format!(
                        "--domain {first} and --domain {value}: give one domain for every task type, and NAME=DOMAIN for one task type"
                    )));
                }
                every = Some(parse(value, value)?);
            }
        }
    }
    Ok((every, named))
}

fn capacity_problems(e: perago_core::capacity::CapacityError) -> ExpectedError {
    ExpectedError::Config(e.problems.iter().map(perago_core::errors::chain).collect())
}

/// `-j`, the capacity settings and the execution mode, before anything touches the manifest.
pub(crate) fn resolve_args(
    args: &StartArgs,
    vars: &BTreeMap<String, String>,
) -> Result<StartPlan, ExpectedError> {
    let (every, named) = split_jobs(&args.jobs)?;
    let (mut domain, named_domains) = split_domains(&args.domain)?;
    // `PERAGO_DOMAIN` is the every-type form's variable; the flag wins.
    if domain.is_none()
        && let Some(value) = vars.get(env::PERAGO_DOMAIN).filter(|v| !v.is_empty())
    {
        domain = Some(Domain::parse(value).map_err(|e| {
            ExpectedError::Config(vec![format!(
                "{}: {}",
                env::PERAGO_DOMAIN,
                perago_core::errors::DisplayChain(&e)
            )])
        })?);
    }
    parse_jobs(&every).map_err(|e| ExpectedError::Usage(perago_core::errors::chain(&e)))?;
    for (_, jobs) in &named {
        parse_jobs(jobs).map_err(|e| ExpectedError::Usage(perago_core::errors::chain(&e)))?;
    }
    let lookup = |name: &str| vars.get(name).cloned();
    let capacity =
        Capacity::resolve(&args.capacity_flags(&every), lookup).map_err(capacity_problems)?;
    let named = named
        .into_iter()
        .map(|(name, jobs)| {
            Capacity::resolve(&args.capacity_flags(&jobs), lookup)
                .map(|c| (name, c))
                .map_err(capacity_problems)
        })
        .collect::<Result<_, _>>()?;
    let mut every_mode: Option<ExecutionMode> = None;
    let mut modes = BTreeMap::new();
    for spec in &args.execution_mode {
        match &spec.task {
            None => {
                if let Some(first) = every_mode.replace(spec.mode) {
                    return Err(ExpectedError::Usage(format!(
                        "--execution-mode {first} and --execution-mode {}: give one mode for every task type, and NAME=MODE for one task type",
                        spec.mode
                    )));
                }
            }
            Some(name) => {
                if modes.insert(name.clone(), spec.mode).is_some() {
                    return Err(ExpectedError::Usage(format!(
                        "--execution-mode {name}=…: given twice for the task {name}"
                    )));
                }
            }
        }
    }
    let mode = ExecutionMode::resolve(
        every_mode,
        vars.get(env::PERAGO_EXECUTION_MODE).map(String::as_str),
    )?;
    Ok(StartPlan {
        capacity,
        named,
        mode,
        domain,
        named_domains,
        modes,
        jobs_given: args.jobs_given,
    })
}

/// Two manifests of the task `name`.
pub(crate) fn given_twice(name: &str, first: &Path, second: &Path) -> ExpectedError {
    ExpectedError::Usage(format!(
        "the task {name} is in both {} and {}: one supervisor runs each task type once",
        first.display(),
        second.display()
    ))
}

/// Loads every manifest: one's error as it is, several's all at once; two manifests of the
/// same task name are refused.
pub(crate) fn load_manifests(paths: &[PathBuf]) -> Result<Vec<(PathBuf, Manifest)>, ExpectedError> {
    if let [path] = paths {
        return Ok(vec![(path.clone(), Manifest::load(path)?)]);
    }
    let mut loaded: Vec<(PathBuf, Manifest)> = Vec::new();
    let mut problems = Vec::new();
    for path in paths {
        match Manifest::load(path) {
            Ok(manifest) => {
                if let Some((first, _)) = loaded
                    .iter()
                    .find(|(_, m)| m.task.name == manifest.task.name)
                {
                    problems.push(given_twice(&manifest.task.name, first, path));
                } else {
                    loaded.push((path.clone(), manifest));
                }
            }
            Err(e) => problems.push(e.into()),
        }
    }
    match problems.len() {
        0 => Ok(loaded),
        1 => Err(problems.remove(0)),
        _ => Err(ExpectedError::Each(problems)),
    }
}

/// The workspace root of the task `name`: `PERAGO_WORKSPACE_ROOT` (its folder `<name>` when the
/// supervisor runs several task types: each keeps a root, lock and socket of its own), else the
/// default, which is keyed by task already.
pub(crate) fn workspace_root_of(
    name: &str,
    vars: &BTreeMap<String, String>,
    several: bool,
) -> PathBuf {
    match vars
        .get(env::PERAGO_WORKSPACE_ROOT)
        .filter(|v| !v.is_empty())
    {
        Some(root) if several => PathBuf::from(root).join(name),
        Some(root) => PathBuf::from(root),
        None => root::default_root(name, vars),
    }
}

/// The worker id prefix of the task `name`: `PERAGO_WORKER_ID_PREFIX`, else derived from the
/// name. With several task types the variable is followed by each task's derived prefix, so
/// worker ids stay unique across them.
pub(crate) fn prefix_of(
    name: &str,
    vars: &BTreeMap<String, String>,
    several: bool,
) -> Result<WorkerPrefix, perago_core::identity::PrefixError> {
    let explicit = vars.get(env::PERAGO_WORKER_ID_PREFIX).map(String::as_str);
    match explicit {
        Some(value) if several => {
            WorkerPrefix::explicit(&format!("{value}{}", WorkerPrefix::derive(name)?))
        }
        _ => WorkerPrefix::resolve(name, explicit),
    }
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
    // The brokers read the same variables; refused here, not by a broker restarted forever.
    if let Err(e) = perago_core::trace::Config::from_env(|name| vars.get(name).cloned()) {
        problems.push(format!(
            "OpenTelemetry tracing is misconfigured: {}",
            perago_core::errors::DisplayChain(&e)
        ));
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

/// Why the folder setting `name` = `value` cannot work, if it cannot: the nearest part of the
/// path that exists must be a directory (`/dev/null/x` can never be created).
pub(crate) fn folder_setting_problem(name: &str, value: &str) -> Option<String> {
    let path = Path::new(value);
    let existing = path
        .ancestors()
        .find(|p| std::fs::symlink_metadata(p).is_ok())?;
    match std::fs::metadata(existing) {
        Ok(meta) if meta.is_dir() => None,
        Ok(_) => Some(format!(
            "{name} {value:?}: {} is not a directory",
            existing.display()
        )),
        Err(e) => Some(format!(
            "{name} {value:?}: cannot use {}: {}",
            existing.display(),
            perago_core::errors::DisplayChain(&e)
        )),
    }
}

/// Why the program setting `name` = `value` cannot work, if it cannot.
pub(crate) fn program_setting_problem(name: &str, value: &str) -> Option<String> {
    use std::os::unix::fs::PermissionsExt as _;
    match std::fs::metadata(value) {
        Ok(meta) if meta.is_file() && meta.permissions().mode() & 0o111 != 0 => None,
        Ok(_) => Some(format!("{name} {value:?}: not an executable file")),
        Err(e) => Some(format!(
            "{name} {value:?}: {}",
            perago_core::errors::DisplayChain(&e)
        )),
    }
}

/// Every folder and program setting that is set but cannot work, naming it and why.
pub(crate) fn path_setting_problems(vars: &BTreeMap<String, String>) -> Vec<String> {
    let set = |name: &str| vars.get(name).filter(|v| !v.is_empty());
    let folders = [
        env::PERAGO_WORKSPACE_ROOT,
        env::PERAGO_LOG_ROOT,
        "XDG_STATE_HOME",
        "XDG_RUNTIME_DIR",
    ];
    let programs = [env::PERAGO_BROKER_BIN, env::PERAGO_EXECUTOR_BIN];
    let folder_problems = folders
        .into_iter()
        .filter_map(|name| folder_setting_problem(name, set(name)?));
    let program_problems = programs
        .into_iter()
        .filter_map(|name| program_setting_problem(name, set(name)?));
    folder_problems.chain(program_problems).collect()
}

pub(crate) fn start(
    args: &StartArgs,
    vars: &BTreeMap<String, String>,
) -> Result<(), ExpectedError> {
    let plan = resolve_args(args, vars)?;
    let manifests = load_manifests(&args.manifests)?;
    let several = manifests.len() > 1;
    let names: Vec<&str> = manifests
        .iter()
        .map(|(_, m)| m.task.name.as_str())
        .collect();
    plan.check_names(&names)?;
    let share_plan = {
        let members: Vec<crate::share::Member<'_>> = manifests
            .iter()
            .map(|(path, m)| crate::share::Member {
                name: m.task.name.as_str(),
                manifest: path.as_path(),
                group: m.task.concurrency.as_ref(),
            })
            .collect();
        crate::share::resolve(
            args.pool,
            args.priority.as_deref(),
            &args.group_budget,
            vars.get(crate::share::PERAGO_GROUP_BUDGETS)
                .map(String::as_str),
            &members,
        )?
    };
    let problems = std::cell::RefCell::new(Vec::<String>::new());
    let add = |problem: String| {
        let mut problems = problems.borrow_mut();
        if !problems.contains(&problem) {
            problems.push(problem);
        }
    };
    for (_, manifest) in &manifests {
        if let Err(ExpectedError::Config(found)) = preflight_config(manifest, vars) {
            found.into_iter().for_each(add);
        }
    }
    // body.memory_limit: the bodies' memory cgroups must be possible before anything starts
    // (cgroup v2: the supervisor moves into its leaf now, so every child it starts is there).
    if let Some((path, _)) = manifests
        .iter()
        .find(|(_, m)| m.body.memory_limit.is_some())
        && let Err(e) = perago_sys::cgroup::prepare()
    {
        add(format!(
            "manifest {}: body.{}",
            path.display(),
            perago_core::errors::DisplayChain(&e)
        ));
    }
    if !problems.borrow().is_empty() {
        return Err(ExpectedError::Config(problems.into_inner()));
    }
    let mut tasks = Vec::new();
    for (path, manifest) in manifests {
        let name = manifest.task.name.clone();
        // The Conductor SDK's worker settings, under its names; perago's own win.
        let sdk = SdkSettings::resolve(vars, &name)
            .map_err(|found| found.into_iter().for_each(add))
            .ok();
        let mut prefix_vars = std::borrow::Cow::Borrowed(vars);
        if let Some(worker_id) = sdk.as_ref().and_then(|s| s.worker_id.as_ref())
            && !vars.contains_key(env::PERAGO_WORKER_ID_PREFIX)
        {
            // The SDK's worker_id is the prefix of every worker id of the task type, as
            // PERAGO_WORKER_ID_PREFIX is (each slot still needs an id of its own).
            prefix_vars.to_mut().insert(
                env::PERAGO_WORKER_ID_PREFIX.to_owned(),
                worker_id.value.clone(),
            );
        }
        let prefix = prefix_of(&name, &prefix_vars, several)
            .map_err(|e| match sdk.as_ref().and_then(|s| s.worker_id.as_ref()) {
                Some(w) if !vars.contains_key(env::PERAGO_WORKER_ID_PREFIX) => add(format!(
                    "{} {:?}: {}",
                    w.variable,
                    w.value,
                    perago_core::errors::DisplayChain(&e)
                )),
                _ => add(perago_core::errors::chain(&e)),
            })
            .ok();
        let capacity = plan
            .capacity_with_sdk(&name, sdk.as_ref(), args, vars)
            .map_err(add)
            .ok();
        let mut capacity = capacity;
        let mut sdk_domain = None;
        let mut task_env = Vec::new();
        let unset = |variable: &str| vars.get(variable).is_none_or(|v| v.trim().is_empty());
        // What perago's own settings overrode is not shown as applied.
        let overridden = |property: Property| match property {
            Property::ThreadCount => plan.jobs_given || plan.named.contains_key(&name),
            Property::PollTimeout => !unset(env::PERAGO_POLL_WAIT_MS),
            Property::PollInterval => !unset(env::PERAGO_POLL_INTERVAL_MS),
            Property::WorkerId => vars.contains_key(env::PERAGO_WORKER_ID_PREFIX),
            Property::Domain => plan.domain_of(&name).is_some(),
            Property::Paused => args.paused || !unset(perago_core::capacity::PERAGO_PAUSED),
            _ => false,
        };
        let sdk_settings: Vec<_> = sdk
            .as_ref()
            .map(SdkSettings::effective)
            .unwrap_or_default()
            .into_iter()
            .filter(|(property, _, _)| !overridden(*property))
            .collect();
        if let Some(sdk) = &sdk {
            if let Some(timeout) = &sdk.poll_timeout
                && unset(env::PERAGO_POLL_WAIT_MS)
            {
                task_env.push((
                    env::PERAGO_POLL_WAIT_MS.to_owned(),
                    timeout.value.as_millis().to_string(),
                ));
            }
            if let Some(interval) = &sdk.poll_interval
                && unset(env::PERAGO_POLL_INTERVAL_MS)
            {
                task_env.push((
                    env::PERAGO_POLL_INTERVAL_MS.to_owned(),
                    interval.value.as_millis().to_string(),
                ));
            }
            match sdk_domain_and_paused(sdk) {
                Ok((domain, paused)) => {
                    if !overridden(Property::Domain) {
                        sdk_domain = domain;
                    }
                    if let (Some(paused), Some(capacity)) = (paused, capacity.as_mut())
                        && !overridden(Property::Paused)
                    {
                        capacity.paused = paused;
                    }
                }
                Err(problem) => add(problem),
            }
        }
        // The manifest's `[worker]` table: the lowest layer of each setting.
        let overrides =
            worker_overrides(&name, &plan, args, vars, sdk.as_ref(), sdk_domain.is_some());
        if let Some(capacity) = capacity.as_mut() {
            apply_worker(&manifest.worker, &overrides, capacity, &mut task_env);
        }
        if let Some(user) = &manifest.body.user {
            // The same checks as `check`: the user must be able to run what it is given.
            match perago_sys::user::body_user(user) {
                Ok((uid, gid)) => {
                    let path_var = vars.get("PATH").map(std::ffi::OsString::from);
                    for problem in
                        crate::check::body_user_access(&manifest, path_var.as_ref(), uid, gid)
                    {
                        add(format!("manifest {}: {problem}", path.display()));
                    }
                }
                Err(e) => add(perago_core::errors::chain(&e)),
            }
        }
        if let (Some(prefix), Some(capacity)) = (prefix, capacity) {
            tasks.push(TaskPlan {
                capacity,
                manifest_path: std::fs::canonicalize(&path).unwrap_or(path),
                domain: plan
                    .domain_of(&name)
                    .cloned()
                    .or(sdk_domain)
                    .or_else(|| manifest.worker.domain.clone()),
                mode: plan.mode_of(&name),
                manifest,
                prefix,
                env: task_env,
                sdk_settings,
                overrides,
            });
        }
    }
    let force_kill_after = env::duration_var(
        env::PERAGO_SHUTDOWN_FORCE_KILL_AFTER,
        vars.get(env::PERAGO_SHUTDOWN_FORCE_KILL_AFTER)
            .map(String::as_str),
    )
    .map_err(|e| add(perago_core::errors::chain(&e)))
    .ok()
    .flatten();
    let mut durations = [
        (env::PERAGO_WORKSPACE_GC_INTERVAL, DEFAULT_GC_INTERVAL),
        (env::PERAGO_WORKSPACE_GC_TTL, DEFAULT_GC_TTL),
        (env::PERAGO_ROOT_LOCK_WAIT, DEFAULT_ROOT_LOCK_WAIT),
    ];
    for (name, value) in &mut durations {
        // The GC walks the whole root each interval: a millisecond would be a busy loop.
        let least = match *name {
            env::PERAGO_WORKSPACE_GC_INTERVAL => env::MIN_GC_INTERVAL,
            _ => Duration::ZERO,
        };
        match env::duration_at_least(name, vars.get(*name).map(String::as_str), least) {
            Ok(Some(d)) => *value = d,
            Ok(None) => {}
            Err(e) => add(e),
        }
    }
    path_setting_problems(vars).into_iter().for_each(add);
    // What the broker and executors read is checked here too, so a bad value stops `start`
    // before anything starts instead of killing the first child.
    if let Err(e) = env::poll_wait(vars.get(env::PERAGO_POLL_WAIT_MS).map(String::as_str)) {
        add(perago_core::errors::chain(&e));
    }
    if let Err(e) = env::poll_interval(vars.get(env::PERAGO_POLL_INTERVAL_MS).map(String::as_str)) {
        add(perago_core::errors::chain(&e));
    }
    if let Err(e) = perago_core::logging::JsonlConfig::from_lookup(PathBuf::new(), "", "", |n| {
        vars.get(n).cloned()
    }) {
        add(perago_core::errors::chain(&e));
    }
    let [(_, gc_interval), (_, gc_ttl), (_, lock_wait)] = durations;
    let stall_timeout = perago_core::liveness::stall_timeout(
        vars.get(perago_core::liveness::PERAGO_STALL_TIMEOUT)
            .map(String::as_str),
    )
    .map_err(|e| add(perago_core::errors::chain(&e)))
    .unwrap_or_default();
    let conductor = ConductorClient::from_lookup(|name| vars.get(name).cloned())
        .map_err(|e| add(perago_core::errors::chain(&e)))
        .ok();
    // Several task types, several brokers, one address: the supervisor serves their merged
    // metrics itself (one broker serves its own).
    let metrics_addr: Option<std::net::SocketAddr> =
        match vars.get(env::PERAGO_METRICS_ADDR).filter(|v| !v.is_empty()) {
            None => None,
            Some(value) => value
                .parse()
                .map_err(|_| {
                    add(format!(
                        "{} {value:?} is not an address such as 127.0.0.1:9464",
                        env::PERAGO_METRICS_ADDR
                    ));
                })
                .ok(),
        };
    let merged_metrics = metrics_addr.filter(|_| several);
    // KEDA's external scaler beside the runtimes (see scaler.rs).
    let scaler_addr = crate::scaler::addr(vars).map_err(&add).ok().flatten();
    let scaler_interval = crate::scaler::interval(vars)
        .map_err(&add)
        .unwrap_or(crate::scaler::DEFAULT_INTERVAL);
    if !problems.borrow().is_empty() {
        return Err(ExpectedError::Config(problems.into_inner()));
    }
    let conductor = conductor.expect("no problems");

    perago_core::logging::init_stderr("perago-supervisor");
    // A current-thread runtime: children are spawned from the main thread, which lives as long
    // as the supervisor, so their parent-death signal fires only when the supervisor dies.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ExpectedError::AsyncRuntime)?;
    runtime.block_on(async {
        // SIGHUP is taken from here on: its default action would kill a supervisor still
        // checking TaskDefs or waiting for a root (a `systemctl reload` right after start).
        // One that comes before the control socket serves is kept, and reloads then.
        let hangups =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
        // Every TaskDef is checked before anything starts, every problem reported at once.
        let mut missing = Vec::new();
        for task in &tasks {
            let name = &task.manifest.task.name;
            match conductor.get_task_def(name).await {
                Ok(Some(_)) => {}
                Ok(None) => missing.push(ExpectedError::TaskDefMissing(name.clone())),
                Err(e) => missing.push(ExpectedError::TaskDefCheck {
                    name: name.clone(),
                    url: conductor.base_url().to_owned(),
                    cause: perago_core::errors::chain(&e),
                }),
            }
        }
        match missing.len() {
            0 => {}
            1 => return Err(missing.remove(0)),
            _ => return Err(ExpectedError::Each(missing)),
        }
        // The lock is held by every process of a runtime: once it is ours, no process of an
        // earlier runtime is left to use its attempt directories, and the sweep is safe.
        // Roots are locked in the order of their paths, whatever the order of the manifests:
        // two supervisors started at once over the same task types then meet at the same
        // first root, and one of them runs (in the order given, each could hold the root the
        // other needs next, and both would refuse).
        let roots: Vec<PathBuf> = tasks
            .iter()
            .map(|t| workspace_root_of(&t.manifest.task.name, vars, several))
            .collect();
        let mut order: Vec<usize> = (0..roots.len()).collect();
        order.sort_by(|a, b| roots[*a].cmp(&roots[*b]));
        let mut locked_in_order = Vec::with_capacity(order.len());
        for &index in &order {
            let locked = root::lock(&roots[index], vars, lock_wait).await?;
            tracing::info!(task = %tasks[index].manifest.task.name, root = %locked.root.display(), runtime_dir = %locked.runtime_dir.display(), "workspace root locked");
            // Another runtime's broker on the socket: touch nothing of it, not even its attempts.
            if let Some(foreign) = supervise::foreign_broker(&locked.socket).await {
                return Err(foreign.into());
            }
            locked_in_order.push((index, locked));
        }
        locked_in_order.sort_by_key(|(index, _)| *index);
        let locks: Vec<root::LockedRoot> = locked_in_order.into_iter().map(|(_, l)| l).collect();
        let metrics = match merged_metrics {
            None => None,
            Some(addr) => {
                let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
                    ExpectedError::Config(vec![format!("cannot serve metrics on {addr}: {}", perago_core::errors::DisplayChain(&e))])
                })?;
                let bound = listener.local_addr().unwrap_or(addr);
                tracing::info!(addr = %bound, "metrics of every task type served at http://{bound}/metrics");
                let sockets = locks.iter().map(|l| l.socket.clone()).collect();
                Some(tokio::spawn(metrics::serve_merged(listener, sockets)))
            }
        };
        let scaler = match scaler_addr {
            None => None,
            Some(addr) => {
                let listener = crate::scaler::bind(addr).await?;
                // A type this supervisor runs: one pod takes its `-j` maximum.
                let defaults = crate::scaler::Defaults {
                    by_type: tasks
                        .iter()
                        .map(|t| (t.manifest.task.name.clone(), u64::from(t.capacity.max_executors)))
                        .collect(),
                    otherwise: 1,
                };
                let service = crate::scaler::Scaler::new(conductor.clone(), defaults, scaler_interval);
                Some(tokio::spawn(crate::scaler::serve(listener, service)))
            }
        };
        let mut runtime_plan = Plan::new(Programs::Siblings, conductor.base_url().to_owned());
        runtime_plan.force_kill_after = force_kill_after;
        runtime_plan.gc_interval = gc_interval;
        runtime_plan.gc_ttl = gc_ttl;
        runtime_plan.stall_timeout = stall_timeout;
        runtime_plan.several = several;
        if several {
            // The brokers serve no address of their own (the supervisor asks them).
            runtime_plan
                .child_env
                .push((env::PERAGO_METRICS_ADDR.to_owned(), String::new()));
        }
        let mut runs = Vec::new();
        let notifiers = notify::shared(
            notify::Notifier::from_lookup(|name| std::env::var(name).ok()),
            tasks.len(),
        );
        runtime_plan.log_root = vars
            .get(env::PERAGO_LOG_ROOT)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| root::default_log_root(vars));
        let mut lakefs_clients = Vec::new();
        // What `reload` (and SIGHUP) re-reads: each manifest from the path `start` was given
        // (a symlink swapped to a new version is followed), against the version running.
        let mut reloadable = Vec::new();
        for (index, ((mut task, locked), notify)) in
            tasks.into_iter().zip(&locks).zip(notifiers).enumerate()
        {
            // Capacity shared across types: its broker polls only within its permits.
            if share_plan.as_ref().is_some_and(|p| p.shares(index)) {
                task.env
                    .push((env::PERAGO_SHARE.to_owned(), "1".to_owned()));
            }
            let (rolls_tx, rolls_rx) = tokio::sync::mpsc::unbounded_channel();
            reloadable.push(crate::reload::Running {
                path: std::path::absolute(&task.manifest.path)
                    .unwrap_or_else(|_| task.manifest_path.clone()),
                manifest: task.manifest.clone(),
                socket: locked.socket.clone(),
                rolls: Some(rolls_tx),
                overrides: task.overrides.clone(),
            });
            for (property, value, variable) in &task.sdk_settings {
                tracing::info!(task = %task.manifest.task.name, %property, %value, %variable, "Conductor SDK setting applied");
            }
            // Staging branches named by the attempts swept are deleted with them.
            let lakefs = (task.manifest.task.kind == TaskKind::Workspace)
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
            let (mut spec, launcher) =
                runtime_plan.runtime(task, locked, lakefs.clone(), notify, vars)?;
            spec.rolls = Some(rolls_rx);
            runs.push((spec, launcher));
            lakefs_clients.push(lakefs);
        }
        // `status` with no argument finds the runtimes through this record.
        let registry_dir = registry::dir(vars);
        let entries = runs
            .iter()
            .map(|(spec, _)| registry::Entry {
                task: spec.task_name.clone(),
                socket: spec.socket.clone(),
            })
            .collect();
        let registration = registry::register(&registry_dir, entries)
            .map_err(|e| {
                tracing::warn!(dir = %registry_dir.display(), error = %perago_core::errors::DisplayChain(&e), "cannot record this supervisor for `perago-supervisor status`; give it the manifest or --socket");
            })
            .ok();
        // Capacity shared across types: the coordinator, and what a reload needs to plan it
        // again (a changed concurrency limit or cost).
        let (share_reload, sharing) = match share_plan {
            None => (None, None),
            Some(plan) => {
                let (replans, replanned) = tokio::sync::mpsc::unbounded_channel();
                let sockets = locks.iter().map(|l| l.socket.clone()).collect();
                let reload = crate::reload::Sharing {
                    pool: args.pool,
                    priority: args.priority.clone(),
                    budget_flags: args.group_budget.clone(),
                    budget_var: vars.get(crate::share::PERAGO_GROUP_BUDGETS).cloned(),
                    plan: plan.clone(),
                    replans,
                };
                let task = tokio::spawn(crate::runtime::share_task::coordinate(
                    plan, sockets, replanned,
                ));
                (Some(reload), Some(task))
            }
        };
        let control = crate::control::serve(
            crate::reload::Reloader::new(reloadable, vars.clone()).with_sharing(share_reload),
            &locks.iter().map(|l| l.socket.clone()).collect::<Vec<_>>(),
            hangups,
        )
        .await;
        let results = supervise::supervise_all(runs, std::future::pending()).await;
        if let Some(sharing) = sharing {
            sharing.abort();
        }
        drop(control);
        drop(registration);
        if let Some(metrics) = metrics {
            metrics.abort();
        }
        if let Some(scaler) = scaler {
            scaler.abort();
        }
        for ((locked, lakefs), (_, result)) in locks.iter().zip(&lakefs_clients).zip(&results) {
            if !matches!(result, Err(RuntimeError::ForeignBroker { .. })) {
                gc::sweep_all(&locked.root, "final sweep after shutdown", lakefs.as_ref()).await;
                gc::report_leftovers(&locked.root, &locked.socket);
            }
        }
        drop(locks);
        outcome(results)
    })
}

/// The exit of a `start`: Ok when every runtime drained cleanly; the force-kill's own error
/// when every failure was the shutdown deadline; else the failures, one line each (named by
/// task when there are several).
pub(crate) fn outcome(
    results: Vec<(String, Result<(), RuntimeError>)>,
) -> Result<(), ExpectedError> {
    let several = results.len() > 1;
    let mut failures: Vec<(String, RuntimeError)> = results
        .into_iter()
        .filter_map(|(name, r)| r.err().map(|e| (name, e)))
        .collect();
    if failures.is_empty() {
        return Ok(());
    }
    if !several {
        let (_, e) = failures.remove(0);
        return Err(e.into());
    }
    Err(ExpectedError::Runtimes(failures))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::ModeArg;
    use std::path::PathBuf;

    fn args(jobs: i64, mode: Option<ModeArg>) -> StartArgs {
        StartArgs {
            manifests: vec![PathBuf::from("task.toml")],
            jobs: vec![jobs.to_string()],
            execution_mode: mode
                .map(|m| crate::cli::ModeSpec {
                    task: None,
                    mode: m.into(),
                })
                .into_iter()
                .collect(),
            jobs_given: true,
            once: false,
            paused: false,
            max_runtime: None,
            max_tasks_per_executor: None,
            max_executor_memory: None,
            domain: Vec::new(),
            pool: None,
            priority: None,
            group_budget: Vec::new(),
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
        range.jobs = vec!["4..2".to_owned()];
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

    /// Issue #26 item 4: the manifest's `[worker]` table is the lowest layer: it applies where
    /// no flag, `PERAGO_*` variable or SDK variable set the setting, and what did set one is
    /// recorded for `reload`.
    #[test]
    fn the_worker_table_applies_under_every_flag_and_variable() {
        let worker = perago_core::manifest::Manifest::parse(
            Path::new("task.toml"),
            Path::new("/srv"),
            "[task]\nname = \"a\"\nkind = \"workspace-free\"\ntimeout_seconds = 60\n[body]\ncommand = [\"cat\"]\n[worker]\npaused = true\npoll_interval = \"250ms\"\npoll_timeout = \"2s\"\nmax_tasks_per_executor = 5\nmax_executor_memory = \"512MiB\"\nmin_free_memory = \"1GiB\"\n",
        )
        .unwrap()
        .worker;
        // Nothing else set: the manifest's values.
        let plan = resolve_args(&args(1, None), &vars(&[])).unwrap();
        let none = worker_overrides("a", &plan, &args(1, None), &vars(&[]), None, false);
        assert!(none.is_empty(), "{none:?}");
        let mut capacity = Capacity::fixed(1);
        let mut env = Vec::new();
        apply_worker(&worker, &none, &mut capacity, &mut env);
        assert!(capacity.paused);
        assert_eq!(capacity.max_tasks_per_executor, Some(5));
        assert_eq!(capacity.max_executor_memory, Some(512 << 20));
        assert_eq!(capacity.min_free_memory, Some(1 << 30));
        assert_eq!(
            env,
            [
                ("PERAGO_POLL_INTERVAL_MS".to_owned(), "250".to_owned()),
                ("PERAGO_POLL_WAIT_MS".to_owned(), "2000".to_owned()),
            ]
        );
        // Flags and variables win, and are named.
        let mut flagged = args(1, None);
        flagged.max_tasks_per_executor = Some("9".to_owned());
        flagged.domain = vec!["green".to_owned()];
        let env_vars = vars(&[
            ("PERAGO_POLL_WAIT_MS", "700"),
            ("PERAGO_MIN_FREE_MEMORY", "2GiB"),
            ("CONDUCTOR_WORKER_ALL_PAUSED", "false"),
            ("CONDUCTOR_WORKER_A_POLL_INTERVAL", "75"),
        ]);
        let plan = resolve_args(&flagged, &env_vars).unwrap();
        let sdk = SdkSettings::resolve(&env_vars, "a").unwrap();
        let overrides = worker_overrides("a", &plan, &flagged, &env_vars, Some(&sdk), false);
        assert_eq!(
            overrides,
            BTreeMap::from([
                ("worker.domain", "--domain green".to_owned()),
                (
                    "worker.max_tasks_per_executor",
                    "--max-tasks-per-executor 9".to_owned()
                ),
                (
                    "worker.min_free_memory",
                    "PERAGO_MIN_FREE_MEMORY=\"2GiB\"".to_owned()
                ),
                ("worker.paused", "CONDUCTOR_WORKER_ALL_PAUSED".to_owned()),
                (
                    "worker.poll_interval",
                    "CONDUCTOR_WORKER_A_POLL_INTERVAL".to_owned()
                ),
                (
                    "worker.poll_timeout",
                    "PERAGO_POLL_WAIT_MS=\"700\"".to_owned()
                ),
            ])
        );
        let mut capacity = plan.capacity.clone();
        let mut env = Vec::new();
        apply_worker(&worker, &overrides, &mut capacity, &mut env);
        assert!(!capacity.paused);
        assert_eq!(capacity.max_tasks_per_executor, Some(9));
        assert_eq!(capacity.max_executor_memory, Some(512 << 20));
        assert_eq!(capacity.min_free_memory, Some(2 << 30));
        assert!(env.is_empty(), "{env:?}");
    }

    /// `--paused` and `PERAGO_PAUSED` start every task type paused, a `-j NAME=…` one too; a
    /// bad value names the variable (issue #26 item 2).
    #[test]
    fn paused_from_the_flag_or_the_environment() {
        let plan = resolve_args(&args(1, None), &vars(&[])).unwrap();
        assert!(!plan.capacity.paused);
        let mut flagged = args(1, None);
        flagged.paused = true;
        flagged.jobs = vec!["2".to_owned(), "b=3".to_owned()];
        let plan = resolve_args(&flagged, &vars(&[("PERAGO_PAUSED", "0")])).unwrap();
        assert!(plan.capacity_of("a").paused && plan.capacity_of("b").paused);
        let plan = resolve_args(&args(1, None), &vars(&[("PERAGO_PAUSED", "yes")])).unwrap();
        assert!(plan.capacity.paused);
        let err = resolve_args(&args(1, None), &vars(&[("PERAGO_PAUSED", "soon")])).unwrap_err();
        assert!(err.to_string().contains("PERAGO_PAUSED=\"soon\""), "{err}");
    }

    #[test]
    fn jobs_for_every_task_type_and_by_name() {
        let with = |jobs: &[&str]| {
            let mut a = args(1, None);
            a.jobs = jobs.iter().map(|j| (*j).to_owned()).collect();
            resolve_args(&a, &vars(&[]))
        };
        let plan = with(&["3", "b=1..4", "c=2"]).unwrap();
        assert_eq!(plan.capacity_of("a"), &Capacity::fixed(3));
        let b = plan.capacity_of("b");
        assert_eq!((b.min_executors, b.max_executors), (1, 4));
        assert_eq!(plan.capacity_of("c"), &Capacity::fixed(2));
        plan.check_names(&["a", "b", "c"]).unwrap();
        let err = plan.check_names(&["a", "b"]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "-j c=…: no manifest given has the task c (tasks: a, b)"
        );
        assert_eq!(err.process_exit_code(), 2);
        // No plain -j: every task type gets 1.
        assert_eq!(
            with(&["b=2"]).unwrap().capacity_of("a"),
            &Capacity::fixed(1)
        );
        for (jobs, message) in [
            (
                &["2", "3"][..],
                "-j 2 and -j 3: give one count for every task type, and NAME=N for one task type",
            ),
            (&["b=2", "b=3"], "-j b=…: given twice for the task b"),
            (&["=2"], "-j \"=2\": expected NAME=N or NAME=MIN..MAX"),
            (&["b=0"], "worker process count must be at least 1"),
            (
                &["b=4..2"],
                "-j 4..2: the minimum (4) is above the maximum (2)",
            ),
        ] {
            let err = with(jobs).unwrap_err();
            assert_eq!(err.to_string(), message, "{jobs:?}");
            assert_eq!(err.process_exit_code(), 2, "{jobs:?}");
        }
    }

    /// Issue #26, item 1: `--domain` for every task type and `--domain NAME=…` for one (which
    /// wins); a bad domain, a repeat or an unknown name is refused naming `--domain`.
    #[test]
    fn domains_for_every_task_type_and_by_name() {
        let with = |domains: &[&str]| {
            let mut a = args(1, None);
            a.domain = domains.iter().map(|d| (*d).to_owned()).collect();
            resolve_args(&a, &vars(&[]))
        };
        let domain = |plan: &StartPlan, name: &str| plan.domain_of(name).map(ToString::to_string);
        let plan = with(&["blue", "b=green"]).unwrap();
        assert_eq!(domain(&plan, "a").as_deref(), Some("blue"));
        assert_eq!(domain(&plan, "b").as_deref(), Some("green"));
        let plan = with(&["b=green"]).unwrap();
        assert_eq!(domain(&plan, "a"), None);
        assert_eq!(domain(&with(&[]).unwrap(), "a"), None);
        plan.check_names(&["a", "b"]).unwrap();
        assert_eq!(
            plan.check_names(&["a"]).unwrap_err().to_string(),
            "--domain b=…: no manifest given has the task b (tasks: a)"
        );
        for (domains, message) in [
            (
                &["blue", "red"][..],
                "--domain blue and --domain red: give one domain for every task type, and NAME=DOMAIN for one task type",
            ),
            (&["b=x", "b=y"], "--domain b=…: given twice for the task b"),
            (&["=x"], "--domain \"=x\": expected DOMAIN or NAME=DOMAIN"),
            (
                &[""],
                "--domain : domain \"\": empty (leave the setting out to poll the default queue)",
            ),
            (
                &["b="],
                "--domain b=: domain \"\": empty (leave the setting out to poll the default queue)",
            ),
        ] {
            let err = with(domains).unwrap_err();
            assert_eq!(err.to_string(), message, "{domains:?}");
            assert_eq!(err.process_exit_code(), 2, "{domains:?}");
        }
        // PERAGO_DOMAIN is the form for every type; the flag wins, a bad value is named.
        let mut a = args(1, None);
        let plan = resolve_args(&a, &vars(&[("PERAGO_DOMAIN", "red")])).unwrap();
        assert_eq!(domain(&plan, "a").as_deref(), Some("red"));
        a.domain = vec!["blue".to_owned()];
        let plan = resolve_args(&a, &vars(&[("PERAGO_DOMAIN", "red")])).unwrap();
        assert_eq!(domain(&plan, "a").as_deref(), Some("blue"));
        let err = resolve_args(&args(1, None), &vars(&[("PERAGO_DOMAIN", "a,b")])).unwrap_err();
        assert!(
            err.to_string().contains("PERAGO_DOMAIN: domain \"a,b\""),
            "{err}"
        );
        let err = with(&["a:b"]).unwrap_err().to_string();
        assert!(
            err.starts_with("--domain a:b: domain \"a:b\": only ASCII"),
            "{err}"
        );
    }

    #[test]
    fn several_task_types_get_roots_and_worker_ids_of_their_own() {
        let v = vars(&[("PERAGO_WORKSPACE_ROOT", "/srv/ws"), ("HOME", "/home/ada")]);
        assert_eq!(
            workspace_root_of("a.b", &v, false),
            PathBuf::from("/srv/ws")
        );
        assert_eq!(
            workspace_root_of("a.b", &v, true),
            PathBuf::from("/srv/ws/a.b")
        );
        let home = vars(&[("HOME", "/home/ada")]);
        assert_eq!(
            workspace_root_of("a.b", &home, true),
            PathBuf::from("/home/ada/.local/state/perago/a.b/workspace")
        );
        assert_eq!(
            prefix_of("orders.ship", &home, true).unwrap().as_str(),
            "ordersship"
        );
        let pod = vars(&[("PERAGO_WORKER_ID_PREFIX", "pod7-")]);
        assert_eq!(
            prefix_of("orders.ship", &pod, false).unwrap().as_str(),
            "pod7-"
        );
        assert_eq!(
            prefix_of("orders.ship", &pod, true).unwrap().as_str(),
            "pod7-ordersship"
        );
    }

    #[test]
    fn the_exit_is_clean_only_if_every_runtime_drained_cleanly() {
        let forced = || RuntimeError::ForceKilled {
            deadline: Duration::from_secs(5),
        };
        let died = || RuntimeError::BrokerDied {
            status: "signal 9 (SIGKILL)".to_owned(),
        };
        let named = |n: &str, r| (n.to_owned(), r);
        assert!(outcome(vec![named("a", Ok(())), named("b", Ok(()))]).is_ok());
        let err = outcome(vec![named("a", Ok(())), named("b", Err(died()))]).unwrap_err();
        assert_eq!(err.process_exit_code(), 1);
        assert!(err.to_string().starts_with("task b: "), "{err}");
        let err = outcome(vec![named("a", Err(forced())), named("b", Err(forced()))]).unwrap_err();
        assert_eq!(err.process_exit_code(), 3);
        let err = outcome(vec![named("a", Err(forced())), named("b", Err(died()))]).unwrap_err();
        assert_eq!(
            err.process_exit_code(),
            1,
            "a broker death outweighs a deadline"
        );
        // One task type: the error as it always was, unnamed.
        let err = outcome(vec![named("a", Err(died()))]).unwrap_err();
        assert_eq!(err.to_string(), died().to_string());
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

    #[test]
    fn execution_mode_by_task_type_wins_and_names_its_flag() {
        use crate::cli::ModeSpec;
        let with = |specs: &[(Option<&str>, ExecutionMode)], env: &[(&str, &str)]| {
            let mut a = args(1, None);
            a.execution_mode = specs
                .iter()
                .map(|(task, mode)| ModeSpec {
                    task: task.map(str::to_owned),
                    mode: *mode,
                })
                .collect();
            resolve_args(&a, &vars(env))
        };
        let plan = with(
            &[(Some("b"), ExecutionMode::Thread)],
            &[("PERAGO_EXECUTION_MODE", "process")],
        )
        .unwrap();
        assert_eq!(plan.mode_of("a"), ExecutionMode::Process);
        assert_eq!(plan.mode_of("b"), ExecutionMode::Thread);
        plan.check_names(&["a", "b"]).unwrap();
        let err = plan.check_names(&["a"]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--execution-mode b=…: no manifest given has the task b (tasks: a)"
        );
        assert_eq!(err.process_exit_code(), 2);
        let plan = with(
            &[
                (None, ExecutionMode::Thread),
                (Some("a"), ExecutionMode::Process),
            ],
            &[],
        )
        .unwrap();
        assert_eq!(
            (plan.mode_of("a"), plan.mode_of("b")),
            (ExecutionMode::Process, ExecutionMode::Thread)
        );
        for (specs, message) in [
            (
                &[
                    (None, ExecutionMode::Thread),
                    (None, ExecutionMode::Process),
                ][..],
                "--execution-mode thread and --execution-mode process: give one mode for every task type, and NAME=MODE for one task type",
            ),
            (
                &[
                    (Some("a"), ExecutionMode::Thread),
                    (Some("a"), ExecutionMode::Process),
                ],
                "--execution-mode a=…: given twice for the task a",
            ),
        ] {
            let err = with(specs, &[]).unwrap_err();
            assert_eq!(err.to_string(), message);
            assert_eq!(err.process_exit_code(), 2);
        }
    }

    #[test]
    fn the_sdk_thread_count_applies_only_without_j() {
        let sdk = SdkSettings::resolve(&vars(&[("CONDUCTOR_WORKER_ALL_THREAD_COUNT", "3")]), "a")
            .unwrap();
        let mut a = args(1, None);
        a.jobs_given = false;
        a.jobs = vec!["b=2".to_owned()];
        let plan = resolve_args(&a, &vars(&[])).unwrap();
        let capacity = |name| {
            plan.capacity_with_sdk(name, Some(&sdk), &a, &vars(&[]))
                .unwrap()
        };
        assert_eq!(capacity("a"), Capacity::fixed(3));
        // `-j NAME=N` wins for its task type.
        assert_eq!(capacity("b"), Capacity::fixed(2));
        assert_eq!(
            plan.capacity_with_sdk("a", None, &a, &vars(&[])).unwrap(),
            Capacity::fixed(1)
        );
        // `-j N` on the command line wins for every task type.
        let given = args(1, None);
        let plan = resolve_args(&given, &vars(&[])).unwrap();
        assert_eq!(
            plan.capacity_with_sdk("a", Some(&sdk), &given, &vars(&[]))
                .unwrap(),
            Capacity::fixed(1)
        );
    }

    #[test]
    fn the_sdk_domain_and_paused_are_checked_as_the_flags_are() {
        let sdk = |pairs: &[(&str, &str)]| SdkSettings::resolve(&vars(pairs), "a").unwrap();
        assert_eq!(sdk_domain_and_paused(&sdk(&[])), Ok((None, None)));
        assert_eq!(
            sdk_domain_and_paused(&sdk(&[("CONDUCTOR_WORKER_ALL_PAUSED", "false")])),
            Ok((None, Some(false)))
        );
        assert_eq!(
            sdk_domain_and_paused(&sdk(&[
                ("CONDUCTOR_WORKER_A_DOMAIN", "blue"),
                ("conductor.worker.a.paused", "on")
            ])),
            Ok((Some(Domain::parse("blue").unwrap()), Some(true)))
        );
        let bad = sdk_domain_and_paused(&sdk(&[("CONDUCTOR_WORKER_A_DOMAIN", "a:b")])).unwrap_err();
        assert!(
            bad.starts_with("CONDUCTOR_WORKER_A_DOMAIN \"a:b\": "),
            "{bad}"
        );
    }

    #[test]
    fn path_settings_that_cannot_work_are_named_with_why() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("file");
        std::fs::write(&file, "").unwrap();
        let under_file = file.join("root");
        let fine = tmp.path().join("not/yet/made");
        let v = vars(&[
            (env::PERAGO_WORKSPACE_ROOT, under_file.to_str().unwrap()),
            (env::PERAGO_LOG_ROOT, fine.to_str().unwrap()),
            ("XDG_STATE_HOME", file.to_str().unwrap()),
            (env::PERAGO_BROKER_BIN, "/no/such/broker"),
            (env::PERAGO_EXECUTOR_BIN, file.to_str().unwrap()),
        ]);
        let f = file.display();
        assert_eq!(
            path_setting_problems(&v),
            [
                format!("PERAGO_WORKSPACE_ROOT \"{f}/root\": {f} is not a directory"),
                format!("XDG_STATE_HOME \"{f}\": {f} is not a directory"),
                "PERAGO_BROKER_BIN \"/no/such/broker\": No such file or directory (os error 2)"
                    .to_owned(),
                format!("PERAGO_EXECUTOR_BIN \"{f}\": not an executable file"),
            ]
        );
        assert!(path_setting_problems(&vars(&[])).is_empty());
        assert!(path_setting_problems(&vars(&[(env::PERAGO_LOG_ROOT, "")])).is_empty());
    }
}
