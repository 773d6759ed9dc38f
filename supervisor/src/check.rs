//! `check`: validate a manifest without network.

use crate::errors::ExpectedError;
use perago_core::{
    command::resolve_program,
    identity::WorkerPrefix,
    manifest::{BodyKind, Manifest},
};
use std::{ffi::OsString, fmt::Write as _, os::unix::fs::PermissionsExt, path::Path};

/// Loads the manifest, compiles its schemas, and checks that the body and guardrail commands
/// exist; returns the report printed on success.
pub(crate) fn check(
    path: &Path,
    path_var: Option<&OsString>,
    prefix_var: Option<&str>,
) -> Result<String, ExpectedError> {
    let manifest = Manifest::load(path)?;
    let mut problems = Vec::new();
    let prefix = format!("manifest {}", path.display());
    // `start` derives worker ids from the task name (or PERAGO_WORKER_ID_PREFIX): a name it
    // would refuse is refused here too.
    if let Err(e) = WorkerPrefix::resolve(&manifest.task.name, prefix_var) {
        problems.push(format!("{prefix}: task.name: {e}"));
    }
    if let Some(user) = &manifest.body.user
        && let Err(e) = perago_core::process::user_ids(user)
    {
        problems.push(format!("{prefix}: body.user: {e}"));
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
                Err(e) => problems.push(format!("{prefix}: body.command: {e}")),
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
                "{prefix}: body.executor: {} not found (build it first, e.g. cargo build --release)",
                binary.display()
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
            problems.push(format!("{prefix}: guardrails.{key}: {e}"));
        }
    }
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
    Ok(report)
}
