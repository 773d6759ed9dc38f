//! `reload` (issue #26 item 4): what a re-read manifest changes, classified in one place
//! ([`diff`]), and the reload itself ([`Reloader::apply`]), which the control socket
//! (`perago-supervisor reload`) and SIGHUP both call.
//!
//! A reload re-reads the manifests the supervisor was started with (their paths as given to
//! `start`). "Settings" are the manifest's: the SDK's worker settings and every `PERAGO_*`
//! variable come from the supervisor's environment, which a running process cannot change
//! (resolving them again gives what `start` had), so they change only with a restart; the
//! executor count, pause and resume have their own commands (`scale`, `pause`, `resume`).
//! Every manifest is checked as `check` checks it, and any problem refuses the whole reload:
//! nothing applies, the running version keeps running. What can change live applies at once
//! through the broker's `Admin.Reconfigure`; a change that needs a new TaskDef is refused
//! naming the field; a body change rolls in, executor by executor (`Actor::roll`, asked
//! through each runtime's `RuntimeSpec::rolls`), unless what cannot roll changed with it.

use crate::errors::ExpectedError;
use crate::runtime::body::{self, RollRequest, Snapshot};
use crate::share::SharePlan;
use perago_core::{manifest::Manifest, taskdef};
use perago_proto::admin::v1::{ReconfigureRequest, admin_client::AdminClient};
use serde_json::Value;
use std::{collections::BTreeMap, ffi::OsString, path::PathBuf, sync::Arc, time::Duration};
use tokio::sync::{mpsc, oneshot};

/// How a changed manifest field can reach a running runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// Applies at once, through `Admin.Reconfigure`.
    Live,
    /// Part of what an executor runs (the body, its environment, guardrails, schemas, the
    /// workspace settings the executor reads): rolls, executor by executor.
    Body,
    /// Part of the TaskDef Conductor holds: needs a new TaskDef and a restart.
    TaskDef,
    /// The capacity shared across types (the concurrency group, its limit, a cost): the
    /// supervisor's share plan is made again and replaces the caps live, if the same types
    /// still share; else it needs a restart (see [`Reloader::apply`]).
    Share,
}

/// One changed field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Change {
    /// The manifest's dotted key, e.g. `task.timeout_seconds`.
    pub(crate) field: &'static str,
    /// The running value, for messages.
    pub(crate) old: String,
    /// The re-read value, for messages.
    pub(crate) new: String,
    /// How it can apply.
    pub(crate) class: Class,
}

/// Everything a re-read manifest changes against the running one.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Changes {
    /// The running task's name.
    pub(crate) task: String,
    /// Each changed field, in the manifest's order.
    pub(crate) changes: Vec<Change>,
}

impl Changes {
    /// Nothing changed.
    pub(crate) fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// The changes of `class`.
    pub(crate) fn of(&self, class: Class) -> impl Iterator<Item = &Change> {
        self.changes.iter().filter(move |c| c.class == class)
    }

    /// Why this reload cannot apply, one line per field (empty: it can).
    pub(crate) fn refusals(&self) -> Vec<String> {
        let task = &self.task;
        self.changes
            .iter()
            .filter_map(|c| match c.class {
                Class::Live => None,
                Class::TaskDef => Some(format!(
                    "{task}: {} changed ({} → {}) — needs a new TaskDef; register it (`perago-supervisor extract`) and restart the supervisor",
                    c.field, c.old, c.new
                )),
                // Replanned live, or refused by the reload (it knows the plan).
                Class::Share => None,
                // Rolls executor by executor (what cannot roll, the runtime refuses: see
                // `body::compare`).
                Class::Body => None,
            })
            .collect()
    }
}

/// A value for a message: JSON, cut at 80 characters.
fn shown(value: &Value) -> String {
    let text = match value {
        Value::Null => "none".to_owned(),
        v => v.to_string(),
    };
    crate::status::cell(&text, 80)
}

/// The TaskDef keys `extract` writes that need a new TaskDef when they change (the schemas,
/// and `enforceSchema` with them, roll with the body instead).
const TASKDEF_KEYS: [&str; 11] = [
    "name",
    "inputKeys",
    "outputKeys",
    "description",
    "ownerEmail",
    "timeoutSeconds",
    "responseTimeoutSeconds",
    "retryCount",
    "retryLogic",
    "retryDelaySeconds",
    "timeoutPolicy",
];

/// The manifest key of a TaskDef key.
fn taskdef_field(key: &str) -> &'static str {
    match key {
        "name" => "task.name",
        "description" => "task.description",
        "ownerEmail" => "task.owner_email",
        "retryCount" => "task.retry_count",
        "retryLogic" => "task.retry_logic",
        "retryDelaySeconds" => "task.retry_delay_seconds",
        "timeoutSeconds" => "task.timeout_seconds",
        "responseTimeoutSeconds" => "task.response_timeout_seconds",
        "timeoutPolicy" => "task.timeout_policy",
        "inputKeys" | "outputKeys" => "task.kind",
        _ => "task",
    }
}

/// What `new` changes against the running `old`, each field classified: the one place that
/// decides what applies live, what rolls and what needs a new TaskDef.
///
/// - TaskDef: every key `extract` writes into the TaskDef but the schemas (name, kind,
///   description, owner, retries, every timeout, the timeout policy; `publish_budget.seconds`
///   through the response timeout it derives).
/// - Body: `body.command`/`body.protocol`/`body.executor`, `body.env`, `body.user`, the
///   guardrails, the params and result schemas (their content: Conductor keeps a copy in the
///   TaskDef with `enforceSchema: false`, perago validates in the executor), and the
///   `[workspace]` settings the executor reads (prefix, merge timeout, budgets).
/// - Live: `body.soft_time_limit` and every `[worker]` setting (a flag or variable that set
///   it at start wins, and a change to it is then refused: see [`Reloader::apply`]).
/// - Share: the concurrency group, its limit and cost: the supervisor's share plan is made
///   again and its caps replaced live, if the same types still share.
/// - `[dev]` is read by `dev` only and never matters here.
pub(crate) fn diff(old: &Manifest, new: &Manifest) -> Changes {
    // Every field is named: one added to the manifest does not compile until it is
    // classified here.
    let Manifest {
        path: _,
        dir: _,
        task: _,
        body: _,
        guardrails: _,
        workspace: _,
        schemas: _,
        dev: _,
        worker: _,
        source: _,
    } = new;
    let perago_core::manifest::BodySpec {
        kind: _,
        env: _,
        user: _,
        soft_time_limit: _,
        memory_limit: _,
    } = &new.body;
    let perago_core::manifest::WorkerSpec {
        domain: _,
        paused: _,
        poll_interval: _,
        poll_timeout: _,
        max_tasks_per_executor: _,
        max_executor_memory: _,
        min_free_memory: _,
    } = &new.worker;
    let mut changes = Vec::new();
    let mut push = |field, old: &Value, new: &Value, class| {
        if old != new {
            changes.push(Change {
                field,
                old: shown(old),
                new: shown(new),
                class,
            });
        }
    };
    let (old_def, new_def) = (taskdef::task_def(old), taskdef::task_def(new));
    let mut fields_seen = Vec::new();
    for key in TASKDEF_KEYS {
        let field = taskdef_field(key);
        let (o, n) = (&old_def[key], &new_def[key]);
        if key == "description" && old.task.description == new.task.description {
            // The default description is derived from name and kind: said there.
            continue;
        }
        if o != n && !fields_seen.contains(&field) {
            fields_seen.push(field);
            let (o, n) = match field {
                "task.kind" => (
                    Value::from(old.task.kind.as_str()),
                    Value::from(new.task.kind.as_str()),
                ),
                _ => (o.clone(), n.clone()),
            };
            push(field, &o, &n, Class::TaskDef);
        }
    }
    let (ob, nb) = (&old.body, &new.body);
    use perago_core::manifest::BodyKind;
    let (o_argv, o_protocol, o_executor) = match &ob.kind {
        BodyKind::Command { argv, protocol } => (Some(argv), Some(protocol.as_str()), None),
        BodyKind::Executor(path) => (None, None, Some(path)),
    };
    let (n_argv, n_protocol, n_executor) = match &nb.kind {
        BodyKind::Command { argv, protocol } => (Some(argv), Some(protocol.as_str()), None),
        BodyKind::Executor(path) => (None, None, Some(path)),
    };
    push("body.command", &json(&o_argv), &json(&n_argv), Class::Body);
    push(
        "body.protocol",
        &json(&o_protocol),
        &json(&n_protocol),
        Class::Body,
    );
    push(
        "body.executor",
        &json(&o_executor.map(|p| p.display().to_string())),
        &json(&n_executor.map(|p| p.display().to_string())),
        Class::Body,
    );
    push("body.env", &json(&ob.env), &json(&nb.env), Class::Body);
    // A deploy that switches a symlinked folder (`current -> releases/7`): the bodies of the
    // new version run from the folder the manifest resolves to now.
    push(
        "the manifest's folder",
        &Value::from(old.dir.display().to_string()),
        &Value::from(new.dir.display().to_string()),
        Class::Body,
    );
    push("body.user", &json(&ob.user), &json(&nb.user), Class::Body);
    push(
        "body.memory_limit",
        &json(&ob.memory_limit.map(perago_core::memory::format_bytes)),
        &json(&nb.memory_limit.map(perago_core::memory::format_bytes)),
        Class::Body,
    );
    let group = |m: &Manifest| {
        m.task
            .concurrency
            .as_ref()
            .map(|g| (g.name.clone(), g.limit, g.cost_units))
    };
    push(
        "task.concurrency_group",
        &json(&group(old).map(|g| g.0)),
        &json(&group(new).map(|g| g.0)),
        Class::Share,
    );
    push(
        "task.concurrency_limit",
        &json(&group(old).and_then(|g| g.1)),
        &json(&group(new).and_then(|g| g.1)),
        Class::Share,
    );
    push(
        "task.cost_units",
        &json(&group(old).map(|g| g.2)),
        &json(&group(new).map(|g| g.2)),
        Class::Share,
    );
    let (ow, nw) = (&old.worker, &new.worker);
    let ms = |d: Option<Duration>| d.map(humantime_ms);
    let size = |b: Option<u64>| b.map(perago_core::memory::format_bytes);
    push(
        "worker.domain",
        &json(&ow.domain.as_ref().map(ToString::to_string)),
        &json(&nw.domain.as_ref().map(ToString::to_string)),
        Class::Live,
    );
    push(
        "worker.paused",
        &json(&ow.paused),
        &json(&nw.paused),
        Class::Live,
    );
    push(
        "worker.poll_interval",
        &json(&ms(ow.poll_interval)),
        &json(&ms(nw.poll_interval)),
        Class::Live,
    );
    push(
        "worker.poll_timeout",
        &json(&ms(ow.poll_timeout)),
        &json(&ms(nw.poll_timeout)),
        Class::Live,
    );
    push(
        "worker.max_tasks_per_executor",
        &json(&ow.max_tasks_per_executor),
        &json(&nw.max_tasks_per_executor),
        Class::Live,
    );
    push(
        "worker.max_executor_memory",
        &json(&size(ow.max_executor_memory)),
        &json(&size(nw.max_executor_memory)),
        Class::Live,
    );
    push(
        "worker.min_free_memory",
        &json(&size(ow.min_free_memory)),
        &json(&size(nw.min_free_memory)),
        Class::Live,
    );
    push(
        "body.soft_time_limit",
        &Value::from(ob.soft_time_limit.map(humantime_ms)),
        &Value::from(nb.soft_time_limit.map(humantime_ms)),
        Class::Live,
    );
    push(
        "guardrails.pre",
        &json(&old.guardrails.pre),
        &json(&new.guardrails.pre),
        Class::Body,
    );
    push(
        "guardrails.post",
        &json(&old.guardrails.post),
        &json(&new.guardrails.post),
        Class::Body,
    );
    let schema = |m: &Manifest, input: bool| {
        let s = if input {
            taskdef::input_schema(m)
        } else {
            taskdef::output_schema(m)
        };
        s.unwrap_or(Value::Null)
    };
    for (field, input) in [("task.params_schema", true), ("task.result_schema", false)] {
        let (o, n) = (schema(old, input), schema(new, input));
        if o != n {
            // A schema's text is long: the file is named, not the schema.
            let path = |m: &Manifest| {
                let p = if input {
                    &m.task.params_schema
                } else {
                    &m.task.result_schema
                };
                Value::from(p.as_ref().map(|p| p.display().to_string()))
            };
            let (po, pn) = (path(old), path(new));
            let (po, pn) = if po == pn {
                (
                    Value::from(format!("{} (as running)", shown(&po))),
                    Value::from(format!("{} (edited)", shown(&pn))),
                )
            } else {
                (po, pn)
            };
            push(field, &po, &pn, Class::Body);
        }
    }
    let ws = |m: &Manifest| {
        m.workspace.as_ref().map(|w| {
            (
                w.prefix.clone(),
                w.merge_timeout_seconds,
                w.publish_budget.map(|b| (b.max_objects, b.max_bytes)),
                w.download_budget.map(|b| (b.max_objects, b.max_bytes)),
            )
        })
    };
    if let (Some(o), Some(n)) = (ws(old), ws(new)) {
        push(
            "workspace.prefix",
            &Value::from(o.0),
            &Value::from(n.0),
            Class::Body,
        );
        push(
            "workspace.merge_timeout_seconds",
            &Value::from(o.1),
            &Value::from(n.1),
            Class::Body,
        );
        push(
            "workspace.publish_budget",
            &json(&o.2),
            &json(&n.2),
            Class::Body,
        );
        push(
            "workspace.download_budget",
            &json(&o.3),
            &json(&n.3),
            Class::Body,
        );
    }
    Changes {
        task: old.task.name.clone(),
        changes,
    }
}

/// A duration as the manifest writes it, in milliseconds (`50m` → `"3000000ms"`), for
/// messages.
fn humantime_ms(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        0 => "0s".to_owned(),
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        ms if ms % 1000 == 0 => format!("{}s", ms / 1000),
        ms => format!("{ms}ms"),
    }
}

/// A value as JSON, for comparing and showing.
fn json<T: serde::Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

/// One runtime a reload can change: its manifest's path as `start` was given it, the version
/// running, and its broker's socket.
#[derive(Debug, Clone)]
pub(crate) struct Running {
    /// The manifest file `start` read.
    pub(crate) path: PathBuf,
    /// The version running.
    pub(crate) manifest: Manifest,
    /// Its broker's socket.
    pub(crate) socket: PathBuf,
    /// Where a changed body goes to roll in (the runtime's actor); `None`: it cannot.
    pub(crate) rolls: Option<mpsc::UnboundedSender<RollRequest>>,
    /// The `[worker]` settings a flag or variable set at start, by manifest key
    /// (`worker.domain` → `--domain blue`): they win over the manifest, so a reload that
    /// changes one is refused naming what set it.
    pub(crate) overrides: BTreeMap<&'static str, String>,
}

/// What a reload did, for the `reload` command's output or the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReloadReport {
    /// Every manifest re-read is the one running: nothing to do.
    Unchanged {
        /// The tasks looked at.
        tasks: Vec<String>,
    },
    /// The live changes applied, one line each (`orders.ship: body.soft_time_limit 50m →
    /// 40m`); tasks unchanged are named too.
    Applied {
        /// One line per change applied, then one per task unchanged.
        lines: Vec<String>,
    },
    /// Nothing applied: every problem found.
    Refused {
        /// Every problem, one line each.
        problems: Vec<String>,
    },
    /// Some runtimes took their changes, others could not be told (their broker did not
    /// answer): what applied, and what failed.
    Partial {
        /// One line per change applied.
        lines: Vec<String>,
        /// One line per runtime that could not be told.
        problems: Vec<String>,
    },
}

impl ReloadReport {
    /// Whether the reload did what it was asked (unchanged or applied).
    pub(crate) fn ok(&self) -> bool {
        matches!(self, Self::Unchanged { .. } | Self::Applied { .. })
    }

    /// The report as lines, for a person.
    pub(crate) fn lines(&self) -> Vec<String> {
        match self {
            Self::Unchanged { tasks } => tasks
                .iter()
                .map(|t| format!("{t}: unchanged (nothing to reload)"))
                .collect(),
            Self::Applied { lines } => lines.clone(),
            Self::Refused { problems } => std::iter::once(format!(
                "reload refused ({} problem{}); nothing applied, the running version keeps running:",
                problems.len(),
                if problems.len() == 1 { "" } else { "s" }
            ))
            .chain(problems.iter().map(|p| format!("  {p}")))
            .collect(),
            Self::Partial { lines, problems } => lines
                .iter()
                .cloned()
                .chain(problems.iter().map(|p| format!("not applied: {p}")))
                .collect(),
        }
    }
}

/// The capacity shared across the supervisor's types as `start` planned it, and what making
/// the plan again needs.
#[derive(Debug)]
pub(crate) struct Sharing {
    /// `--pool`.
    pub(crate) pool: Option<u32>,
    /// `--priority`.
    pub(crate) priority: Option<String>,
    /// `--group-budget`.
    pub(crate) budget_flags: Vec<String>,
    /// `PERAGO_GROUP_BUDGETS` at start.
    pub(crate) budget_var: Option<String>,
    /// The plan in force.
    pub(crate) plan: SharePlan,
    /// The coordinator, which takes a new plan's caps.
    pub(crate) replans: mpsc::UnboundedSender<SharePlan>,
}

/// The supervisor's reload: the versions running, and what checking a manifest needs.
#[derive(Debug)]
pub(crate) struct Reloader {
    runtimes: Vec<Running>,
    /// The supervisor's environment as at start (PATH for the commands, the worker id prefix).
    vars: BTreeMap<String, String>,
    /// The capacity shared across types (`None`: nothing shared).
    sharing: Option<Sharing>,
}

impl Reloader {
    /// The reload of `runtimes`, checked against `vars` (the environment `start` had).
    pub(crate) fn new(runtimes: Vec<Running>, vars: BTreeMap<String, String>) -> Self {
        Self {
            runtimes,
            vars,
            sharing: None,
        }
    }

    /// The reload of a supervisor that shares capacity as `sharing` says.
    pub(crate) fn with_sharing(mut self, sharing: Option<Sharing>) -> Self {
        self.sharing = sharing;
        self
    }

    /// The share plan the re-read manifests make (`planned`: index and new manifest), when a
    /// concurrency setting changed: `Ok(None)` when nothing of it changed, else the new plan
    /// or why it cannot apply live.
    fn replan(
        &self,
        planned: &[(usize, Manifest, Changes)],
    ) -> Result<Option<SharePlan>, Vec<String>> {
        let changed: Vec<(&String, &Change)> = planned
            .iter()
            .flat_map(|(_, _, c)| c.of(Class::Share).map(move |x| (&c.task, x)))
            .collect();
        if changed.is_empty() {
            return Ok(None);
        }
        let restart = |why: &str| {
            changed
                .iter()
                .map(|(task, c)| {
                    format!(
                        "{task}: {} changed ({} → {}) — {why}; restart the supervisor to change it",
                        c.field, c.old, c.new
                    )
                })
                .collect::<Vec<_>>()
        };
        let Some(sharing) = &self.sharing else {
            return Err(restart(
                "this supervisor started sharing no capacity (no concurrency group or --pool), so its brokers take no permits",
            ));
        };
        let manifests: Vec<&Manifest> = (0..self.runtimes.len())
            .map(|i| {
                planned
                    .iter()
                    .find(|(index, _, _)| *index == i)
                    .map_or(&self.runtimes[i].manifest, |(_, m, _)| m)
            })
            .collect();
        let members: Vec<crate::share::Member<'_>> = manifests
            .iter()
            .zip(&self.runtimes)
            .map(|(m, r)| crate::share::Member {
                name: m.task.name.as_str(),
                manifest: r.path.as_path(),
                group: m.task.concurrency.as_ref(),
            })
            .collect();
        let plan = crate::share::resolve(
            sharing.pool,
            sharing.priority.as_deref(),
            &sharing.budget_flags,
            sharing.budget_var.as_deref(),
            &members,
        )
        .map_err(|e| {
            vec![match e {
                crate::share::ShareError::Usage(m)
                | crate::share::ShareError::Config(m)
                | crate::share::ShareError::UnknownGroup { message: m, .. } => m,
            }]
        })?;
        let same_members = plan.as_ref().is_some_and(|plan| {
            plan.types == sharing.plan.types
                && (0..plan.types.len()).all(|i| plan.shares(i) == sharing.plan.shares(i))
        });
        match plan {
            Some(plan) if same_members => Ok(Some(plan)),
            _ => Err(restart(
                "a task type would join or leave the capacity sharing, whose brokers are set up at start",
            )),
        }
    }

    /// The task names it runs.
    pub(crate) fn tasks(&self) -> Vec<String> {
        self.runtimes
            .iter()
            .map(|r| r.manifest.task.name.clone())
            .collect()
    }

    /// Re-reads and checks the manifests of `tasks` (all when empty), then applies what
    /// changed live, or refuses the whole reload with every problem. Idempotent: a manifest
    /// unchanged since the last reload is a no-op.
    pub(crate) async fn apply(&mut self, tasks: &[String]) -> ReloadReport {
        let several = self.runtimes.len() > 1;
        let path_var = self.vars.get("PATH").map(OsString::from);
        let mut problems = Vec::new();
        for unknown in tasks.iter().filter(|t| !self.tasks().contains(t)) {
            problems.push(format!(
                "{unknown}: this supervisor does not run the task (it runs {})",
                self.tasks().join(", ")
            ));
        }
        let mut planned: Vec<(usize, Manifest, Changes)> = Vec::new();
        for (index, running) in self.runtimes.iter().enumerate() {
            let name = &running.manifest.task.name;
            if !tasks.is_empty() && !tasks.contains(name) {
                continue;
            }
            let manifest = match Manifest::load(&running.path) {
                Ok(m) => m,
                Err(e) => {
                    problems.extend(perago_core::errors::chain(&e).lines().map(str::to_owned));
                    continue;
                }
            };
            // As `check` checks it (commands exist, worker ids, the body user).
            match crate::check::check(&running.path, &manifest, path_var.as_ref(), |n| {
                crate::start::prefix_of(n, &self.vars, several)
            }) {
                Ok(_) => {}
                Err(ExpectedError::CheckFailed(found)) => problems.extend(found),
                Err(e) => problems.push(perago_core::errors::chain(&e)),
            }
            let changes = diff(&running.manifest, &manifest);
            problems.extend(changes.refusals());
            for c in changes.of(Class::Live) {
                if let Some(winner) = running.overrides.get(c.field) {
                    problems.push(format!(
                        "{name}: {} changed ({} → {}), but {winner} set it at start and wins over the manifest; restart without it to let the manifest decide",
                        c.field, c.old, c.new
                    ));
                }
            }
            // A body change rolls, if the runtime can take it and nothing it changes beside
            // the body stops it (the workspace settings do not roll).
            if changes.of(Class::Body).next().is_some() {
                if running.rolls.is_none() {
                    problems.push(format!(
                        "{name}: the body changed, and this runtime takes no body change; restart the supervisor to run the new body"
                    ));
                } else if changes.of(Class::TaskDef).next().is_some() {
                    // Refused already, each field named once.
                } else if let Err(refused) = body::compare(&running.manifest, &manifest) {
                    problems.extend(refused.into_iter().map(|p| format!("{name}: {p}")));
                }
            }
            planned.push((index, manifest, changes));
        }
        let replan = match self.replan(&planned) {
            Ok(plan) => plan,
            Err(found) => {
                problems.extend(found);
                None
            }
        };
        if !problems.is_empty() {
            return ReloadReport::Refused { problems };
        }
        if planned.iter().all(|(_, _, c)| c.is_empty()) {
            return ReloadReport::Unchanged {
                tasks: planned
                    .iter()
                    .map(|(i, _, _)| self.runtimes[*i].manifest.task.name.clone())
                    .collect(),
            };
        }
        let mut lines = Vec::new();
        let mut unchanged = Vec::new();
        let mut failed = Vec::new();
        if let (Some(plan), Some(sharing)) = (replan, self.sharing.as_mut()) {
            if sharing.replans.send(plan.clone()).is_ok() {
                sharing.plan = plan;
                for (_, _, changes) in &planned {
                    for c in changes.of(Class::Share) {
                        lines.push(format!(
                            "{}: {} {} → {} (applied)",
                            changes.task, c.field, c.old, c.new
                        ));
                    }
                }
            } else {
                failed.push(
                    "the capacity sharing has stopped; the concurrency change does not apply"
                        .to_owned(),
                );
            }
        }
        for (index, manifest, changes) in planned {
            let running = &mut self.runtimes[index];
            if changes.is_empty() {
                unchanged.push(format!("{}: unchanged", changes.task));
                continue;
            }
            if changes.of(Class::Live).next().is_some() {
                let mut request = reconfigure_request(&manifest);
                worker_request(&running.manifest.worker, &manifest.worker, &mut request);
                let paused = (running.manifest.worker.paused != manifest.worker.paused)
                    .then_some(manifest.worker.paused.unwrap_or(false));
                let told = match reconfigure(&running.socket, request).await {
                    Ok(()) => match paused {
                        Some(paused) => pause(&running.socket, paused).await,
                        None => Ok(()),
                    },
                    Err(why) => Err(why),
                };
                if let Err(why) = told {
                    failed.push(format!(
                        "{}: the broker at {} did not take the change: {why}",
                        changes.task,
                        running.socket.display()
                    ));
                    continue;
                }
                for c in changes.of(Class::Live) {
                    lines.push(format!(
                        "{}: {} {} → {} (applied)",
                        changes.task, c.field, c.old, c.new
                    ));
                }
            }
            if changes.of(Class::Body).next().is_some() {
                let rolls = running.rolls.as_ref().expect("checked in planning");
                match roll(rolls, manifest.clone()).await {
                    Ok(Some(version)) => {
                        let fields: Vec<&str> = changes.of(Class::Body).map(|c| c.field).collect();
                        lines.push(format!(
                            "{}: the body rolls to version {version} ({} changed): each executor takes it after its current task",
                            changes.task,
                            fields.join(", ")
                        ));
                    }
                    Ok(None) => {}
                    Err(problems) => {
                        failed.extend(
                            problems
                                .into_iter()
                                .map(|p| format!("{}: {p}", changes.task)),
                        );
                        continue;
                    }
                }
            }
            running.manifest = manifest;
        }
        lines.extend(unchanged);
        if failed.is_empty() {
            ReloadReport::Applied { lines }
        } else {
            ReloadReport::Partial {
                lines,
                problems: failed,
            }
        }
    }
}

/// The live settings of `manifest`, as `Admin.Reconfigure` takes them.
pub(crate) fn reconfigure_request(manifest: &Manifest) -> ReconfigureRequest {
    ReconfigureRequest {
        soft_time_limit_ms: Some(
            manifest
                .body
                .soft_time_limit
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        ),
        ..ReconfigureRequest::default()
    }
}

/// The `[worker]` settings `new` changes against `old`, into `request` (each one unchanged is
/// left unset, so a flag that set it at start keeps it); one removed goes back to the
/// runtime's default.
pub(crate) fn worker_request(
    old: &perago_core::manifest::WorkerSpec,
    new: &perago_core::manifest::WorkerSpec,
    request: &mut ReconfigureRequest,
) {
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    fn changed<T: PartialEq>(old: T, new: T) -> Option<T> {
        (old != new).then_some(new)
    }
    if let Some(domain) = changed(&old.domain, &new.domain) {
        request.domain = Some(
            domain
                .as_ref()
                .map_or_else(String::new, ToString::to_string),
        );
    }
    if let Some(interval) = changed(old.poll_interval, new.poll_interval) {
        request.poll_interval_ms = Some(interval.map_or(0, ms));
    }
    if let Some(timeout) = changed(old.poll_timeout, new.poll_timeout) {
        request.poll_timeout_ms = Some(ms(timeout.unwrap_or(perago_core::env::DEFAULT_POLL_WAIT)));
    }
    if let Some(max) = changed(old.max_tasks_per_executor, new.max_tasks_per_executor) {
        request.max_tasks_per_executor = Some(max.unwrap_or(0));
    }
    if let Some(max) = changed(old.max_executor_memory, new.max_executor_memory) {
        request.max_executor_memory_bytes = Some(max.unwrap_or(0));
    }
    if let Some(min) = changed(old.min_free_memory, new.min_free_memory) {
        request.min_free_memory_bytes = Some(min.unwrap_or(0));
    }
}

/// `Admin.Pause` (`paused`) or `Admin.Resume` on the broker at `socket`, bounded to 5 s.
async fn pause(socket: &std::path::Path, paused: bool) -> Result<(), String> {
    admin_call(socket, |mut client| async move {
        if paused {
            client
                .pause(perago_proto::admin::v1::PauseRequest {})
                .await
                .map(|_| ())
        } else {
            client
                .resume(perago_proto::admin::v1::ResumeRequest {})
                .await
                .map(|_| ())
        }
    })
    .await
}

/// One Admin call on the broker at `socket` (connect included), bounded to 5 s; the error
/// as a line for the reload's report.
async fn admin_call<F>(
    socket: &std::path::Path,
    call: impl FnOnce(AdminClient<tonic::transport::Channel>) -> F,
) -> Result<(), String>
where
    F: std::future::Future<Output = Result<(), tonic::Status>>,
{
    let asked = async {
        let channel = perago_core::socket::connect(socket)
            .await
            .map_err(|e| perago_core::errors::chain(&e))?;
        call(AdminClient::new(channel))
            .await
            .map_err(|s| s.message().to_owned())
    };
    match tokio::time::timeout(Duration::from_secs(5), asked).await {
        Ok(result) => result,
        Err(_) => Err("no answer within 5 s".to_owned()),
    }
}

/// Asks the runtime's actor to roll `manifest` in as its next body version, bounded to 10 s.
async fn roll(
    rolls: &mpsc::UnboundedSender<RollRequest>,
    manifest: Manifest,
) -> Result<Option<u32>, Vec<String>> {
    let (reply, answer) = oneshot::channel();
    let request = RollRequest {
        snapshot: Snapshot {
            manifest: Arc::new(manifest),
        },
        reply,
    };
    if rolls.send(request).is_err() {
        return Err(vec![
            "the runtime has stopped; the body does not roll".to_owned(),
        ]);
    }
    match tokio::time::timeout(Duration::from_secs(10), answer).await {
        Ok(Ok(result)) => result,
        Ok(Err(_)) => Err(vec![
            "the runtime stopped before the body rolled".to_owned(),
        ]),
        Err(_) => Err(vec![
            "the runtime did not take the body within 10 s".to_owned(),
        ]),
    }
}

/// `Admin.Reconfigure` on the broker at `socket`, bounded to 5 s.
async fn reconfigure(socket: &std::path::Path, request: ReconfigureRequest) -> Result<(), String> {
    admin_call(socket, |mut client| async move {
        client.reconfigure(request).await.map(|_| ())
    })
    .await
}

#[cfg(test)]
#[path = "reload_tests.rs"]
mod tests;
