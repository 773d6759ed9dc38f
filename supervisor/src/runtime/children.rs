//! Starting the broker and executor processes: argv[0] set to the name operators see in `ps`
//! (`comm` holds only 15 bytes, so the full name lives in argv[0]), their own process group,
//! SIGTERM if the supervisor dies, and the environment that tells each child who it is.

use perago_core::process;
use std::{path::PathBuf, process::ExitStatus};
use tokio::{process::Command, sync::mpsc};

/// Which child exited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChildKind {
    Broker,
    Executor { slot: u32, generation: u64 },
}

/// A child exit, reported by the task that waits for it.
#[derive(Debug)]
pub(crate) struct ChildExit {
    pub(crate) kind: ChildKind,
    pub(crate) pid: u32,
    pub(crate) status: std::io::Result<ExitStatus>,
}

/// `exit status 1`, `signal 9 (SIGKILL)`.
pub(crate) fn describe(status: &std::io::Result<ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt as _;
    match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(code), _) => format!("exit status {code}"),
            (None, Some(sig)) => format!("signal {sig} ({})", process::signal_name(sig)),
            (None, None) => "unknown status".to_owned(),
        },
        Err(e) => format!("wait failed: {e}"),
    }
}

/// Starts `program` as `argv0` with `env` added, and a task that reports its exit on `exits`.
/// Returns the pid (also the process group id).
pub(crate) fn spawn(
    program: &PathBuf,
    argv0: &str,
    env: &[(String, String)],
    kind: ChildKind,
    exits: &mpsc::UnboundedSender<ChildExit>,
) -> std::io::Result<u32> {
    let mut cmd = Command::new(program);
    cmd.arg0(argv0).envs(env.iter().map(|(k, v)| (k, v)));
    process::isolate(&mut cmd, process::SIGTERM);
    let mut child = cmd.spawn()?;
    let pid = child.id().expect("a just-spawned child has a pid");
    let exits = exits.clone();
    tokio::spawn(async move {
        let status = child.wait().await;
        let _ = exits.send(ChildExit { kind, pid, status });
    });
    Ok(pid)
}
