//! Loading a manifest: TOML syntax, then every table and cross-field rule, reporting all
//! problems at once with the file and dotted key.

use super::{
    errors::ManifestError,
    model::*,
    reader::{Problems, Section, type_name},
    schemas::Schemas,
};
use crate::units::parse_byte_size;
use std::{collections::BTreeMap, fs, path::Path};
use toml::{Table, Value};

/// Conductor's default `retryCount`.
pub const DEFAULT_RETRY_COUNT: u32 = 3;
/// Conductor's default `retryDelaySeconds`.
pub const DEFAULT_RETRY_DELAY_SECONDS: u32 = 60;
/// Conductor's default `responseTimeoutSeconds`.
pub const DEFAULT_RESPONSE_TIMEOUT_SECONDS: u64 = 3600;
/// Merge timeout without a publish budget.
pub const DEFAULT_MERGE_TIMEOUT_SECONDS: u64 = 300;

const MAX_SECONDS: i64 = i32::MAX as i64;

impl Manifest {
    /// Reads and validates the manifest at `path`, and compiles its schemas.
    pub fn load(path: &Path) -> Result<Self, ManifestError> {
        super::source::ManifestSource::read(path).map(|(_, manifest)| manifest)
    }

    /// Reads the manifest file at `path`: its text and its absolute folder.
    pub(crate) fn read_text(path: &Path) -> Result<(String, std::path::PathBuf), ManifestError> {
        let text =
            crate::files::read_regular(path, crate::files::MAX_CONFIG_BYTES).map_err(|source| {
                ManifestError::Read {
                    path: path.to_owned(),
                    source,
                }
            })?;
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let dir = fs::canonicalize(parent).map_err(|source| ManifestError::Read {
            path: path.to_owned(),
            source,
        })?;
        Ok((text, dir))
    }

    /// Validates manifest text; `path` is used in messages and `dir` resolves relative paths.
    pub fn parse(path: &Path, dir: &Path, text: &str) -> Result<Self, ManifestError> {
        Self::parse_with(path, dir, text, &super::source::read_file)
    }

    /// [`Manifest::parse`], the files it names (its schemas) read with `read`.
    pub(crate) fn parse_with(
        path: &Path,
        dir: &Path,
        text: &str,
        read: super::source::Reader<'_>,
    ) -> Result<Self, ManifestError> {
        let root: Table = toml::from_str(text).map_err(|e| ManifestError::Syntax {
            path: path.to_owned(),
            position: syntax_position(text, &e),
            message: e.message().split_whitespace().collect::<Vec<_>>().join(" "),
        })?;
        let mut p = Problems::default();
        let files = std::cell::RefCell::new(BTreeMap::new());
        let record = |file: &Path| {
            let text = read(file)?;
            files.borrow_mut().insert(file.to_owned(), text.clone());
            Ok(text)
        };
        let manifest = read_manifest(&mut p, path, dir, &root, &record);
        match manifest {
            Some(mut m) if p.0.is_empty() => {
                m.source = std::sync::Arc::new(super::source::ManifestSource {
                    path: path.to_owned(),
                    dir: dir.to_owned(),
                    text: text.to_owned(),
                    files: files.into_inner(),
                });
                Ok(m)
            }
            _ => Err(ManifestError::Invalid {
                path: path.to_owned(),
                problems: p.0,
            }),
        }
    }
}

/// The 1-based line and column (in characters) a TOML error points at.
fn syntax_position(text: &str, e: &toml::de::Error) -> Option<(usize, usize)> {
    let start = e.span()?.start.min(text.len());
    let start = (0..=start).rev().find(|&i| text.is_char_boundary(i))?;
    let before = &text[..start];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    Some((line, column))
}

fn read_manifest(
    p: &mut Problems,
    path: &Path,
    dir: &Path,
    root: &Table,
    read: super::source::Reader<'_>,
) -> Option<Manifest> {
    let mut top = Section::new("", root);
    let task = match top.get("task") {
        None => {
            p.add(
                "task",
                "missing [task] table: a manifest defines exactly one task",
            );
            None
        }
        Some(Value::Table(t)) => Some(t),
        Some(Value::Array(tasks)) => {
            p.add(
                "task",
                format!(
                    "a manifest defines exactly one task in a [task] table, found {} [[task]] entries; run one supervisor per task",
                    tasks.len()
                ),
            );
            None
        }
        Some(other) => {
            p.add(
                "task",
                format!("expected a table, found {}", type_name(other)),
            );
            None
        }
    };
    let task = task.and_then(|t| read_task(p, dir, Section::new("task", t)));
    let body = match top.table(p, "body") {
        Some(s) => read_body(p, dir, s),
        None => {
            if !top.has("body") {
                p.add(
                    "body",
                    "missing [body] table: set body.command (or body.executor)",
                );
            }
            None
        }
    };
    let guardrails = match top.table(p, "guardrails") {
        Some(mut s) => {
            let g = Guardrails {
                pre: s.argv(p, "pre"),
                post: s.argv(p, "post"),
            };
            s.finish(p);
            g
        }
        None => Guardrails::default(),
    };
    let workspace_section = top.table(p, "workspace");
    let worker = top
        .table(p, "worker")
        .map(|w| read_worker(p, w))
        .unwrap_or_default();
    let dev = top
        .table(p, "dev")
        .map(|d| read_dev(p, dir, d))
        .unwrap_or_default();
    top.finish(p);

    let task = task?;
    let workspace = match (task.kind, workspace_section) {
        (TaskKind::Workspace, Some(s)) => read_workspace(p, s),
        (TaskKind::Workspace, None) => Some(WorkspaceSpec {
            prefix: String::new(),
            merge_timeout_seconds: DEFAULT_MERGE_TIMEOUT_SECONDS,
            publish_budget: None,
            download_budget: None,
        }),
        (TaskKind::WorkspaceFree, Some(_)) => {
            p.add(
                "workspace",
                "only workspace tasks (task.kind = \"workspace\") have a [workspace] table",
            );
            None
        }
        (TaskKind::WorkspaceFree, None) => None,
    };
    let mut task = task;
    apply_timeouts(p, &mut task, workspace.as_ref());
    let body = body?;
    check_soft_time_limit(p, &task, &body);
    if dev.seed.is_some() && task.kind != TaskKind::Workspace {
        p.add("dev.seed", "only workspace tasks have a workspace to seed");
    }
    let schemas = Schemas::load(p, &task, read);
    if !p.0.is_empty() {
        return None;
    }
    Some(Manifest {
        path: path.to_owned(),
        dir: dir.to_owned(),
        task,
        body,
        guardrails,
        workspace,
        schemas,
        dev,
        worker,
        // Filled in by `parse_with` once every problem is known.
        source: std::sync::Arc::default(),
    })
}

/// `[dev]`: how `perago-supervisor dev` sets up its embedded servers.
fn read_dev(p: &mut Problems, dir: &Path, mut s: Section<'_>) -> DevSpec {
    let seed = s.string(p, "seed").map(|f| dir.join(f));
    let repository = s.string(p, "repository");
    let branch = s.string(p, "branch");
    s.finish(p);
    if let Some(repo) = &repository {
        let ok = repo.len() >= 3
            && repo.len() <= 63
            && repo
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !repo.starts_with('-');
        if !ok {
            p.add(
                "dev.repository",
                format!("{repo:?} is not a lakeFS repository name (3-63 of a-z, 0-9 and -)"),
            );
        }
    }
    let defaults = DevSpec::default();
    DevSpec {
        seed,
        repository: repository.unwrap_or(defaults.repository),
        branch: branch.unwrap_or(defaults.branch),
    }
}

/// `[task]` as written; `response_timeout_seconds` is settled by [`apply_timeouts`].
fn read_task(p: &mut Problems, dir: &Path, mut s: Section<'_>) -> Option<TaskSpec> {
    let before = p.0.len();
    let name = s.required_string(p, "name", "the Conductor TaskDef name");
    if let Some(name) = &name {
        check_task_name(p, name);
    }
    let kind = if s.has("kind") {
        s.choice(
            p,
            "kind",
            &[
                ("workspace", TaskKind::Workspace),
                ("workspace-free", TaskKind::WorkspaceFree),
            ],
        )
    } else {
        s.required_string(p, "kind", "\"workspace\" or \"workspace-free\"");
        None
    };
    let description = s.string(p, "description");
    let owner_email = s.string(p, "owner_email");
    if let Some(email) = &owner_email {
        let ok = email
            .split_once('@')
            .is_some_and(|(user, host)| !user.is_empty() && !host.is_empty());
        if !ok {
            p.add(
                "task.owner_email",
                format!("{email:?} is not an email address"),
            );
        }
    }
    let timeout_seconds = if s.has("timeout_seconds") {
        s.integer(p, "timeout_seconds", 0, MAX_SECONDS)
    } else {
        s.required_string(
            p,
            "timeout_seconds",
            "seconds the body may run, Conductor's timeoutSeconds; 0 = no limit",
        );
        None
    };
    let response_timeout = s.integer(p, "response_timeout_seconds", 1, MAX_SECONDS);
    let retry_count = s.integer(p, "retry_count", 0, i64::from(i32::MAX));
    let retry_logic = s.choice(p, "retry_logic", &RetryLogic::ALL.map(|v| (v.as_str(), v)));
    let retry_delay = s.integer(p, "retry_delay_seconds", 0, i64::from(i32::MAX));
    let timeout_policy = s.choice(
        p,
        "timeout_policy",
        &TimeoutPolicy::ALL.map(|v| (v.as_str(), v)),
    );
    let params_schema = s.string(p, "params_schema").map(|f| dir.join(f));
    let result_schema = s.string(p, "result_schema").map(|f| dir.join(f));
    let group = s.string(p, "concurrency_group");
    let limit = s.integer(p, "concurrency_limit", 1, 9999);
    let cost_units = s.integer(p, "cost_units", 1, 1_000_000);
    if let Some(name) = &group {
        let ok = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !ok {
            p.add(
                "task.concurrency_group",
                format!("{name:?}: only letters, digits, '_', '-' and '.'"),
            );
        }
    } else {
        for (key, set) in [
            ("task.concurrency_limit", limit.is_some()),
            ("task.cost_units", cost_units.is_some()),
        ] {
            if set {
                p.add(
                    key,
                    "counts against a concurrency group: set task.concurrency_group too",
                );
            }
        }
    }
    s.finish(p);
    if p.0.len() > before {
        return None;
    }
    Some(TaskSpec {
        name: name?,
        kind: kind?,
        description,
        owner_email,
        timeout_seconds: timeout_seconds? as u64,
        // 0 marks "not set"; apply_timeouts fills it in.
        response_timeout_seconds: response_timeout.map_or(0, |n| n as u64),
        retry_count: retry_count.map_or(DEFAULT_RETRY_COUNT, |n| n as u32),
        retry_logic: retry_logic.unwrap_or(RetryLogic::Fixed),
        retry_delay_seconds: retry_delay.map_or(DEFAULT_RETRY_DELAY_SECONDS, |n| n as u32),
        timeout_policy: timeout_policy.unwrap_or(TimeoutPolicy::TimeOutWorkflow),
        params_schema,
        result_schema,
        concurrency: group.map(|name| ConcurrencyGroup {
            name,
            limit: limit.map(|n| n as u32),
            cost_units: cost_units.map_or(1, |n| n as u32),
        }),
    })
}

/// The longest task name: it becomes a folder name, and worker ids and their log folders
/// (`worker_id=<prefix>Broker`) must stay within the 255-byte file name limit.
const MAX_NAME_BYTES: usize = crate::identity::MAX_PREFIX_BYTES;

/// Task names become Conductor queue names, log folders and workspace folders.
fn check_task_name(p: &mut Problems, name: &str) {
    let too_long;
    let problem = if name.is_empty() {
        Some("must not be empty")
    } else if name.len() > MAX_NAME_BYTES {
        too_long = format!(
            "is {} bytes long; at most {MAX_NAME_BYTES} (the name becomes a folder name and part of worker ids)",
            name.len()
        );
        Some(too_long.as_str())
    } else if name == "." {
        Some("must not be '.' (the name becomes a folder name)")
    } else if name.contains('/') {
        Some("must not contain '/' (the name becomes a folder name)")
    } else if name.contains("..") {
        Some("must not contain '..' (the name becomes a folder name)")
    } else if name.contains('\0') {
        Some("must not contain a NUL character")
    } else if name.chars().any(|c| c.is_control() || c.is_whitespace()) {
        Some("must not contain whitespace or control characters")
    } else {
        None
    };
    if let Some(problem) = problem {
        p.add("task.name", format!("{name:?} {problem}"));
    }
}

/// Settles `responseTimeoutSeconds`: from the publish budget, as set, or the default capped
/// at `timeoutSeconds`; and checks Conductor's rule `timeoutSeconds ≥ responseTimeoutSeconds`.
fn apply_timeouts(p: &mut Problems, task: &mut TaskSpec, workspace: Option<&WorkspaceSpec>) {
    let budget_seconds = workspace
        .and_then(|w| w.publish_budget)
        .and_then(|b| b.seconds);
    let (response, source) = match (budget_seconds, task.response_timeout_seconds) {
        (Some(_), set) if set > 0 => {
            p.add(
                "task.response_timeout_seconds",
                "cannot be set together with workspace.publish_budget.seconds, which derives it",
            );
            return;
        }
        (Some(budget), _) => (budget, "workspace.publish_budget.seconds"),
        (None, set) if set > 0 => (set, "task.response_timeout_seconds"),
        (None, _) if task.timeout_seconds > 0 => (
            DEFAULT_RESPONSE_TIMEOUT_SECONDS.min(task.timeout_seconds),
            "the default",
        ),
        (None, _) => (DEFAULT_RESPONSE_TIMEOUT_SECONDS, "the default"),
    };
    if task.timeout_seconds > 0 && task.timeout_seconds < response {
        p.add(
            "task.timeout_seconds",
            format!(
                "{} is less than the response timeout {response} (from {source}); Conductor rejects a TaskDef whose timeoutSeconds is below responseTimeoutSeconds",
                task.timeout_seconds
            ),
        );
    }
    task.response_timeout_seconds = response;
}

/// `body.soft_time_limit` must leave the body time between the soft and the hard limit.
fn check_soft_time_limit(p: &mut Problems, task: &TaskSpec, body: &BodySpec) {
    let Some(soft) = body.soft_time_limit else {
        return;
    };
    let hard = std::time::Duration::from_secs(task.timeout_seconds);
    if task.timeout_seconds > 0 && soft >= hard {
        p.add(
            "body.soft_time_limit",
            format!(
                "{} is not below task.timeout_seconds ({}s); the soft limit must come before the hard one",
                match soft.subsec_millis() {
                    0 => format!("{}s", soft.as_secs()),
                    _ => format!("{}ms", soft.as_millis()),
                },
                task.timeout_seconds
            ),
        );
    }
}

fn read_body(p: &mut Problems, dir: &Path, mut s: Section<'_>) -> Option<BodySpec> {
    let before = p.0.len();
    let command = s.argv(p, "command");
    let executor = s.string(p, "executor");
    let protocol = s.choice(
        p,
        "protocol",
        &[("exec", BodyProtocol::Exec), ("jsonl", BodyProtocol::Jsonl)],
    );
    let env = s.table(p, "env").map(|env| read_env(p, &env));
    let user = s.string(p, "user");
    let soft_time_limit = s.string(p, "soft_time_limit").and_then(|text| {
        crate::units::parse_duration(&text)
            .map_err(|e| {
                p.add(
                    "body.soft_time_limit",
                    format!(
                        "{} (a duration such as \"45s\", \"500ms\" or \"5m\")",
                        crate::errors::DisplayChain(&e)
                    ),
                );
            })
            .ok()
    });
    let memory_limit = memory_limit(p, &mut s);
    if let Some(user) = &user
        && (user.is_empty()
            || user
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || c == ':'))
    {
        p.add("body.user", format!("{user:?} is not a user name"));
    }
    let has_command = s.has("command");
    let has_executor = s.has("executor");
    let has_protocol = s.has("protocol");
    s.finish(p);
    let kind = match (has_command, has_executor) {
        (true, true) => {
            p.add("body", "set either body.command or body.executor, not both");
            None
        }
        (false, false) => {
            p.add(
                "body.command",
                "missing (the command that runs the task, e.g. [\"python3\", \"-u\", \"task.py\"]; or set body.executor)",
            );
            None
        }
        (true, false) => command.map(|argv| BodyKind::Command {
            argv,
            protocol: protocol.unwrap_or(BodyProtocol::Exec),
        }),
        (false, true) => {
            if memory_limit.is_some() {
                p.add(
                    "body.memory_limit",
                    "applies only to body.command; an executor binary runs the task in its own process, which the runtime keeps outside any body's memory cgroup",
                );
            }
            if has_protocol {
                p.add(
                    "body.protocol",
                    "applies only to body.command; an executor binary speaks the slot protocol itself",
                );
            }
            match executor {
                Some(e) if e.is_empty() => {
                    p.add("body.executor", "must not be empty");
                    None
                }
                Some(e) => Some(BodyKind::Executor(dir.join(e))),
                None => None,
            }
        }
    };
    if p.0.len() > before {
        return None;
    }
    Some(BodySpec {
        kind: kind?,
        env: env.unwrap_or_default(),
        user,
        soft_time_limit,
        memory_limit,
    })
}

/// The smallest `body.memory_limit`: below it even a shell could not start.
const MIN_MEMORY_LIMIT: u64 = 4 << 20;

/// `body.memory_limit`: a size such as `"2GiB"` (or a byte count), at least
/// [`MIN_MEMORY_LIMIT`].
fn memory_limit(p: &mut Problems, s: &mut Section<'_>) -> Option<u64> {
    size_at_least(
        p,
        s,
        "memory_limit",
        MIN_MEMORY_LIMIT,
        "a body needs that much to start",
    )
}

/// A size key of `s`: a string such as `"2GiB"` or a byte count, at least `least` (`why`
/// says why, in the message).
fn size_at_least(
    p: &mut Problems,
    s: &mut Section<'_>,
    name: &'static str,
    least: u64,
    why: &str,
) -> Option<u64> {
    let key = s.key(name);
    let bytes = match s.get(name) {
        None => return None,
        Some(Value::Integer(n)) => u64::try_from(*n).ok(),
        Some(Value::String(text)) => match parse_byte_size(text) {
            Ok(n) => Some(n),
            Err(e) => {
                p.add(
                    key,
                    format!(
                        "{} (a size such as \"512MiB\" or \"2GiB\")",
                        crate::errors::DisplayChain(&e)
                    ),
                );
                return None;
            }
        },
        Some(other) => {
            p.add(
                key,
                format!(
                    "expected a size such as \"2GiB\", found {}",
                    type_name(other)
                ),
            );
            return None;
        }
    };
    match bytes {
        Some(n) if n >= least => Some(n),
        _ => {
            p.add(
                key,
                format!(
                    "must be at least {} ({why})",
                    crate::memory::format_bytes(least)
                ),
            );
            None
        }
    }
}

/// A duration key of `s` (`"45s"`, `"500ms"`) within `least..=most`.
fn duration(
    p: &mut Problems,
    s: &mut Section<'_>,
    name: &'static str,
    least: std::time::Duration,
    most: std::time::Duration,
) -> Option<std::time::Duration> {
    let key = s.key(name);
    let text = s.string(p, name)?;
    // A zero (`"0s"`, `"0ms"`) where zero is allowed: the duration parser takes none.
    let digits = text.trim().trim_end_matches(char::is_alphabetic).trim_end();
    let unit = &text.trim()[digits.len()..];
    if least.is_zero()
        && !digits.is_empty()
        && digits.chars().all(|c| c == '0')
        && matches!(unit, "" | "ms" | "s" | "m" | "h")
    {
        return Some(std::time::Duration::ZERO);
    }
    match crate::units::parse_duration(&text) {
        Ok(d) if d < least => {
            p.add(
                key,
                format!("must be at least {}ms, found {text:?}", least.as_millis()),
            );
            None
        }
        Ok(d) if d > most => {
            p.add(
                key,
                format!("must be at most {}s, found {text:?}", most.as_secs()),
            );
            None
        }
        Ok(d) => Some(d),
        Err(e) => {
            p.add(
                key,
                format!(
                    "{} (a duration such as \"45s\", \"500ms\" or \"5m\")",
                    crate::errors::DisplayChain(&e)
                ),
            );
            None
        }
    }
}

/// `[worker]`: the runtime settings `reload` re-reads (see [`WorkerSpec`]), each checked as its
/// flag or variable is.
fn read_worker(p: &mut Problems, mut s: Section<'_>) -> WorkerSpec {
    use std::time::Duration;
    let domain = s.string(p, "domain").and_then(|text| {
        crate::conductor::Domain::parse(&text)
            .map_err(|e| p.add("worker.domain", crate::errors::chain(&e)))
            .ok()
    });
    let paused = match s.get("paused") {
        None => None,
        Some(Value::Boolean(b)) => Some(*b),
        Some(other) => {
            p.add(
                "worker.paused",
                format!("expected true or false, found {}", type_name(other)),
            );
            None
        }
    };
    let poll_interval = duration(
        p,
        &mut s,
        "poll_interval",
        Duration::ZERO,
        Duration::from_millis(crate::env::MAX_POLL_INTERVAL_MS),
    );
    let poll_timeout = duration(
        p,
        &mut s,
        "poll_timeout",
        Duration::from_millis(crate::env::MIN_POLL_WAIT_MS),
        Duration::from_secs(3600),
    );
    let max_tasks_per_executor = s
        .integer(p, "max_tasks_per_executor", 1, i64::MAX)
        .map(|n| n as u64);
    let max_executor_memory = size_at_least(
        p,
        &mut s,
        "max_executor_memory",
        1 << 20,
        "an executor alone needs more",
    );
    let min_free_memory = size_at_least(
        p,
        &mut s,
        "min_free_memory",
        1,
        "0 would mean no floor: leave it unset",
    );
    s.finish(p);
    WorkerSpec {
        domain,
        paused,
        poll_interval,
        poll_timeout,
        max_tasks_per_executor,
        max_executor_memory,
        min_free_memory,
    }
}

fn read_env(p: &mut Problems, env: &Section<'_>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (name, value) in env.entries() {
        let key = env.key(name);
        if name.is_empty() || name.contains(['=', '\0']) {
            p.add(key, "is not a valid environment variable name");
        } else if name.starts_with("PERAGO_") {
            p.add(
                key,
                "PERAGO_* variables are set by the runtime and cannot be overridden",
            );
        } else {
            match value {
                Value::String(v) if v.contains('\0') => p.add(key, "contains a NUL character"),
                Value::String(v) => {
                    out.insert(name.clone(), v.clone());
                }
                other => p.add(
                    key,
                    format!("expected a string, found {}", type_name(other)),
                ),
            }
        }
    }
    out
}

fn read_workspace(p: &mut Problems, mut s: Section<'_>) -> Option<WorkspaceSpec> {
    let before = p.0.len();
    let prefix = s.string(p, "prefix").unwrap_or_default();
    let prefix = match super::super::shape::normalize_prefix(&prefix) {
        Ok(prefix) => prefix,
        Err(problem) => {
            p.add("workspace.prefix", crate::errors::chain(&problem));
            String::new()
        }
    };
    let merge_timeout = s.integer(p, "merge_timeout_seconds", 1, MAX_SECONDS);
    let budget = s.table(p, "publish_budget").map(|mut b| {
        let max_objects = b.integer(p, "max_objects", 1, i64::MAX).map(|n| n as u64);
        let max_bytes = byte_size(p, &mut b, "workspace.publish_budget.max_bytes");
        let seconds = b.integer(p, "seconds", 1, MAX_SECONDS).map(|n| n as u64);
        b.finish(p);
        PublishBudget {
            max_objects,
            max_bytes,
            seconds,
        }
    });
    let download_budget = s.table(p, "download_budget").map(|mut b| {
        let max_objects = b.integer(p, "max_objects", 1, i64::MAX).map(|n| n as u64);
        let max_bytes = byte_size(p, &mut b, "workspace.download_budget.max_bytes");
        b.finish(p);
        DownloadBudget {
            max_objects,
            max_bytes,
        }
    });
    s.finish(p);
    if p.0.len() > before {
        return None;
    }
    let merge_timeout_seconds = merge_timeout.map(|n| n as u64).unwrap_or_else(|| {
        budget
            .and_then(|b| b.seconds)
            .unwrap_or(DEFAULT_MERGE_TIMEOUT_SECONDS)
    });
    Some(WorkspaceSpec {
        prefix,
        merge_timeout_seconds,
        publish_budget: budget,
        download_budget,
    })
}

/// `max_bytes` of a budget table (`key` is its dotted path): a positive byte count or a size
/// such as `"2GiB"`.
fn byte_size(p: &mut Problems, b: &mut Section<'_>, key: &str) -> Option<u64> {
    match b.get("max_bytes") {
        None => None,
        Some(Value::Integer(n)) if *n >= 1 => Some(*n as u64),
        Some(Value::Integer(n)) => {
            p.add(key, format!("must be at least 1, found {n}"));
            None
        }
        Some(Value::String(text)) => match parse_byte_size(text) {
            Ok(0) => {
                p.add(key, "must be at least 1 byte");
                None
            }
            Ok(n) => Some(n),
            Err(e) => {
                p.add(key, crate::errors::chain(&e));
                None
            }
        },
        Some(other) => {
            p.add(
                key,
                format!(
                    "expected a byte count or a size such as \"2GiB\", found {}",
                    type_name(other)
                ),
            );
            None
        }
    }
}
