//! `pause` and `resume`: `Admin.Pause` / `Admin.Resume` on each runtime's broker, found as
//! `status` finds them (each manifest's runtime, or every runtime of every running supervisor
//! of this user). Each runtime is told; what was paused or resumed is printed, one line per
//! task; a runtime that does not answer is an error naming its socket (exit 1), after the
//! others were told.

use crate::{
    cli::PauseArgs,
    errors::ExpectedError,
    status::{call_broker, cell, human, now_ms, sockets_of},
};
use perago_proto::admin::v1::{
    PauseRequest, ResumeRequest, StatusRequest, admin_client::AdminClient,
};
use std::{collections::BTreeMap, path::Path, time::Duration};

/// `pause`.
pub(crate) fn pause(
    args: &PauseArgs,
    vars: &BTreeMap<String, String>,
) -> Result<(), ExpectedError> {
    each(args, vars, |socket, runtime| {
        let (task, answer) = call_broker(socket, runtime, |channel| async move {
            let mut client = AdminClient::new(channel);
            let answer = client.pause(PauseRequest {}).await?.into_inner();
            let status = client.status(StatusRequest {}).await?.into_inner();
            Ok((status.task_name, answer))
        })?;
        let task = cell(&task, 200);
        Ok(if answer.already_paused {
            let since = Duration::from_millis(
                u64::try_from(now_ms().saturating_sub(answer.paused_since_unix_ms)).unwrap_or(0),
            );
            format!("{task}: already paused (for {})", human(since))
        } else {
            format!("{task}: paused (running tasks finish; nothing new is polled until resume)")
        })
    })
}

/// `resume`.
pub(crate) fn resume(
    args: &PauseArgs,
    vars: &BTreeMap<String, String>,
) -> Result<(), ExpectedError> {
    each(args, vars, |socket, runtime| {
        let (task, answer) = call_broker(socket, runtime, |channel| async move {
            let mut client = AdminClient::new(channel);
            let answer = client.resume(ResumeRequest {}).await?.into_inner();
            let status = client.status(StatusRequest {}).await?.into_inner();
            Ok((status.task_name, answer))
        })?;
        let task = cell(&task, 200);
        Ok(if answer.already_running {
            format!("{task}: already running")
        } else {
            format!("{task}: resumed")
        })
    })
}

/// Runs `call` on every runtime `args` name, printing each line it returns; every failure is
/// reported, after the others were told.
fn each(
    args: &PauseArgs,
    vars: &BTreeMap<String, String>,
    call: impl Fn(&Path, &tokio::runtime::Runtime) -> Result<String, ExpectedError>,
) -> Result<(), ExpectedError> {
    each_of(args.socket.as_ref(), &args.manifests, vars, call)
}

/// [`each`] of the runtimes `socket` or `manifests` name (as `status` finds them: see
/// [`sockets_of`]); `scale` shares it.
pub(crate) fn each_of(
    socket: Option<&std::path::PathBuf>,
    manifests: &[std::path::PathBuf],
    vars: &BTreeMap<String, String>,
    call: impl Fn(&Path, &tokio::runtime::Runtime) -> Result<String, ExpectedError>,
) -> Result<(), ExpectedError> {
    let sockets = sockets_of(socket, manifests, vars)?;
    let runtime = client_runtime()?;
    let mut failed = Vec::new();
    for socket in &sockets {
        match call(socket, &runtime) {
            Ok(line) => crate::out::print(&format!("{line}\n"))?,
            Err(e) => failed.push(e),
        }
    }
    match failed.len() {
        0 => Ok(()),
        1 => Err(failed.remove(0)),
        _ => Err(ExpectedError::Each(failed)),
    }
}

/// The current-thread runtime a command's client calls run on (`status`, `pause`, `resume`,
/// `scale`, `reload`).
pub(crate) fn client_runtime() -> Result<tokio::runtime::Runtime, ExpectedError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ExpectedError::AsyncRuntime)
}
