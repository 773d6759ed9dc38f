//! `check`: validate a manifest without network.

use crate::errors::ExpectedError;
use perago_core::{
    command::{resolve_program, user_can_enter, user_can_execute},
    identity::WorkerPrefix,
    manifest::{BodyKind, Manifest, ManifestError},
};
use std::{ffi::OsString, fmt::Write as _, os::unix::fs::PermissionsExt, path::Path};

/// [`check`] of every manifest, as `start` would run them together (a task name given twice
/// is refused): the reports of all, or every problem of all.
pub(crate) fn check_all(
    paths: &[std::path::PathBuf],
    path_var: Option<&OsString>,
    vars: &std::collections::BTreeMap<String, String>,
) -> Result<String, ExpectedError> {
    // Each manifest is read once; a task name given twice is refused before anything else.
    let mut loaded: Vec<(&std::path::PathBuf, Result<Manifest, ManifestError>)> =
        Vec::with_capacity(paths.len());
    for path in paths {
        let manifest = Manifest::load(path);
        if let Ok(manifest) = &manifest
            && let Some((first, _)) = loaded
                .iter()
                .find(|(_, m)| m.as_ref().is_ok_and(|m| m.task.name == manifest.task.name))
        {
            return Err(crate::start::given_twice(&manifest.task.name, first, path));
        }
        loaded.push((path, manifest));
    }
    let several = paths.len() > 1;
    let mut reports = String::new();
    let mut problems = Vec::new();
    // Concurrency groups across the manifests, as `start` would resolve them (its flags
    // aside): members that disagree on a limit, a budget (PERAGO_GROUP_BUDGETS) no task fits.
    let members: Vec<crate::share::Member<'_>> = loaded
        .iter()
        .filter_map(|(path, m)| {
            let m = m.as_ref().ok()?;
            Some(crate::share::Member {
                name: m.task.name.as_str(),
                manifest: path.as_path(),
                group: m.task.concurrency.as_ref(),
            })
        })
        .collect();
    let budgets = vars
        .get(crate::share::PERAGO_GROUP_BUDGETS)
        .map(String::as_str);
    // A budget for a group none of these manifests names may be for others `start` is given.
    if let Err(
        crate::share::ShareError::Config(problem) | crate::share::ShareError::Usage(problem),
    ) = crate::share::resolve(None, None, &[], budgets, &members)
    {
        problems.push(problem);
    }
    for (path, manifest) in loaded {
        let manifest = match manifest {
            Ok(manifest) => manifest,
            Err(e) if !several => return Err(e.into()),
            Err(e) => {
                problems.push(perago_core::errors::chain(&e));
                continue;
            }
        };
        match check(path, &manifest, path_var, |name| {
            crate::start::prefix_of(name, vars, several)
        }) {
            Ok(report) => reports.push_str(&report),
            Err(ExpectedError::CheckFailed(found)) => problems.extend(found),
            Err(e) => problems.push(perago_core::errors::chain(&e)),
        }
    }
    match problems.is_empty() {
        true => Ok(reports),
        false if !several => Err(ExpectedError::CheckFailed(problems)),
        false => {
            // What passed is still said, before the problems.
            crate::out::print(&reports)?;
            Err(ExpectedError::CheckFailed(problems))
        }
    }
}

/// Checks the manifest loaded from `path` (its schemas compiled by the load) beyond what the
/// load checks: the body and guardrail commands exist, the worker ids and the body user are
/// valid; returns the report printed on success. `prefix` is how `start` names the task's
/// workers.
pub(crate) fn check(
    path: &Path,
    manifest: &Manifest,
    path_var: Option<&OsString>,
    prefix: impl Fn(&str) -> Result<WorkerPrefix, perago_core::identity::PrefixError>,
) -> Result<String, ExpectedError> {
    let mut problems = Vec::new();
    let prefix_text = format!("manifest {}", path.display());
    // `start` derives worker ids from the task name (or PERAGO_WORKER_ID_PREFIX): a name it
    // would refuse is refused here too.
    if let Err(e) = prefix(&manifest.task.name) {
        problems.push(format!(
            "{prefix_text}: task.name: {}",
            perago_core::errors::DisplayChain(&e)
        ));
    }
    let prefix = prefix_text;
    if let Some(user) = &manifest.body.user {
        match perago_sys::user::user_ids(user) {
            Ok((uid, gid)) => problems.extend(
                body_user_access(manifest, path_var, uid, gid)
                    .into_iter()
                    .map(|p| format!("{prefix}: {p}")),
            ),
            Err(e) => problems.push(format!(
                "{prefix}: body.user: {}",
                perago_core::errors::DisplayChain(&e)
            )),
        }
    }
    let mut body_line = String::new();
    match &manifest.body.kind {
        BodyKind::Command { argv, protocol } => {
            match resolve_program(&argv[0], &manifest.dir, path_var.map(OsString::as_os_str)) {
                Ok(program) => {
                    body_line = format!(
                        "body: {} ({} protocol; {})",
                        argv.join(" "),
                        protocol.as_str(),
                        program.display()
                    );
                }
                Err(e) => problems.push(format!(
                    "{prefix}: body.command: {}",
                    perago_core::errors::DisplayChain(&e)
                )),
            }
        }
        BodyKind::Executor(binary) => match std::fs::metadata(binary) {
            Ok(meta) if meta.is_file() && meta.permissions().mode() & 0o111 != 0 => {
                body_line = format!("body: executor binary {}", binary.display());
            }
            Ok(_) => problems.push(format!(
                "{prefix}: body.executor: {} is not an executable file",
                binary.display()
            )),
            Err(_) => problems.push(format!(
                "{prefix}: body.executor: {} not found ({})",
                binary.display(),
                build_hint(binary)
            )),
        },
    }
    for (key, argv) in [
        ("pre", &manifest.guardrails.pre),
        ("post", &manifest.guardrails.post),
    ] {
        if let Some(argv) = argv
            && let Err(e) =
                resolve_program(&argv[0], &manifest.dir, path_var.map(OsString::as_os_str))
        {
            problems.push(format!(
                "{prefix}: guardrails.{key}: {}",
                perago_core::errors::DisplayChain(&e)
            ));
        }
    }
    let memory_cgroup = match manifest.body.memory_limit {
        Some(_) => match perago_sys::cgroup::probe() {
            Ok(located) => Some(located),
            Err(e) => {
                problems.push(format!(
                    "{prefix}: body.{}",
                    perago_core::errors::DisplayChain(&e)
                ));
                None
            }
        },
        None => None,
    };
    if !problems.is_empty() {
        return Err(ExpectedError::CheckFailed(problems));
    }

    let task = &manifest.task;
    let mut report = format!("ok: {} is a valid {} task\n", task.name, task.kind);
    let _ = writeln!(report, "  {body_line}");
    for (label, schema) in [
        ("params schema", &manifest.schemas.params),
        ("result schema", &manifest.schemas.result),
    ] {
        if let Some(schema) = schema {
            let _ = writeln!(report, "  {label}: {} (compiled)", schema.path().display());
        }
    }
    for (label, argv) in [
        ("pre guardrail", &manifest.guardrails.pre),
        ("post guardrail", &manifest.guardrails.post),
    ] {
        if let Some(argv) = argv {
            let _ = writeln!(report, "  {label}: {}", argv.join(" "));
        }
    }
    let _ = writeln!(
        report,
        "  timeouts: {}s total, {}s response; retries: {} ({}, {}s delay)",
        task.timeout_seconds,
        task.response_timeout_seconds,
        task.retry_count,
        task.retry_logic.as_str(),
        task.retry_delay_seconds
    );
    if let Some(soft) = manifest.body.soft_time_limit {
        let _ = writeln!(
            report,
            "  soft time limit: {} (SIGUSR1 to an exec body, a cancel line to a jsonl body)",
            match soft.subsec_millis() {
                0 => format!("{}s", soft.as_secs()),
                _ => format!("{}ms", soft.as_millis()),
            }
        );
    }
    if let (Some(limit), Some(cgroup)) = (manifest.body.memory_limit, memory_cgroup) {
        let _ = writeln!(
            report,
            "  memory limit: {} per body (a memory cgroup of its own below {}, cgroup {}; an OOM kill fails the task)",
            perago_core::memory::format_bytes(limit),
            cgroup.body_parent().display(),
            cgroup.version.as_str()
        );
    }
    Ok(report)
}

/// What `body.user` (uid `uid`, primary group `gid`, no other groups: as bodies run) could
/// not reach, one problem each: the manifest's folder (bodies and guardrails run from it), and
/// each command's program, resolved as the executor resolves it (a program that does not
/// resolve is reported by the caller). Empty when the user can run everything.
pub(crate) fn body_user_access(
    manifest: &Manifest,
    path_var: Option<&OsString>,
    uid: u32,
    gid: u32,
) -> Vec<String> {
    let user = manifest.body.user.as_deref().unwrap_or_default();
    let mut problems = Vec::new();
    if let Err(e) = user_can_enter(&manifest.dir, uid, gid) {
        problems.push(format!(
            "body.user: {user:?} cannot work in the manifest folder {}: {}",
            manifest.dir.display(),
            perago_core::errors::DisplayChain(&e)
        ));
    }
    let mut commands = Vec::new();
    if let BodyKind::Command { argv, .. } = &manifest.body.kind {
        commands.push(("body.command", argv));
    }
    for (key, argv) in [
        ("guardrails.pre", &manifest.guardrails.pre),
        ("guardrails.post", &manifest.guardrails.post),
    ] {
        if let Some(argv) = argv {
            commands.push((key, argv));
        }
    }
    for (key, argv) in commands {
        let Ok(program) =
            resolve_program(&argv[0], &manifest.dir, path_var.map(OsString::as_os_str))
        else {
            continue;
        };
        if let Err(e) = user_can_execute(&program, uid, gid) {
            problems.push(format!(
                "body.user: {user:?} cannot run {key} ({}): {}",
                program.display(),
                perago_core::errors::DisplayChain(&e)
            ));
        }
    }
    problems
}

/// What to run to get the missing executor binary `path`: for a Cargo build output
/// (`…/target/debug/NAME`, `…/target/release/NAME`) the exact command, else a general hint.
fn build_hint(path: &std::path::Path) -> String {
    let name = path.file_name().and_then(|n| n.to_str());
    let profile = path
        .parent()
        .filter(|dir| dir.parent().and_then(|t| t.file_name()) == Some("target".as_ref()))
        .and_then(|dir| dir.file_name())
        .and_then(|p| p.to_str());
    match (profile, name) {
        (Some("debug"), Some(name)) => {
            format!("build it first: cargo build --bin {name}, in the workspace that defines it")
        }
        (Some("release"), Some(name)) => format!(
            "build it first: cargo build --release --bin {name}, in the workspace that defines it"
        ),
        _ => "build it first, or point body.executor at the built binary".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::build_hint;
    use std::path::Path;

    #[test]
    fn a_missing_cargo_output_gets_its_exact_build_command() {
        assert_eq!(
            build_hint(Path::new(
                "/w/examples/rust-sum/../../target/debug/perago-example-sum"
            )),
            "build it first: cargo build --bin perago-example-sum, in the workspace that defines it"
        );
        assert_eq!(
            build_hint(Path::new("/w/target/release/sum")),
            "build it first: cargo build --release --bin sum, in the workspace that defines it"
        );
        assert_eq!(
            build_hint(Path::new("/usr/local/bin/sum")),
            "build it first, or point body.executor at the built binary"
        );
        assert_eq!(
            build_hint(Path::new("/w/debug/sum")),
            "build it first, or point body.executor at the built binary",
            "only a Cargo target folder says how it is built"
        );
    }
}
