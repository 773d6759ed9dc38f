//! The supervisor's control channel (issue #26 item 4): `supervisor.sock` beside each
//! runtime's `broker.sock`, serving `perago.supervisor.v1.Supervisor` (with reflection, for
//! grpcurl), and SIGHUP; both ask one reload task, which owns the [`Reloader`] and runs one
//! reload at a time. The `reload` command is the client.
//!
//! The socket follows the broker's rules: in the runtime directory the supervisor owns (0700,
//! refused otherwise), a live server there refuses the bind, a stale file is removed, the
//! socket is 0600 before anything can connect, and it is removed when the supervisor stops.
//! A connection from another user is closed unanswered (its peer credentials are checked
//! against the socket's owner).

use crate::{
    cli::ReloadArgs,
    errors::ExpectedError,
    reload::{ReloadReport, Reloader},
};
use perago_proto::supervisor::v1::{
    ReloadOutcome, ReloadRequest, ReloadResponse,
    supervisor_client::SupervisorClient,
    supervisor_server::{Supervisor, SupervisorServer},
};
use std::{
    collections::BTreeMap,
    fs, io,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    time::Duration,
};
use tokio::sync::{mpsc, oneshot};
use tonic::{Request, Response, Status};

/// The control socket's file name, beside `broker.sock`.
pub(crate) const SOCKET_NAME: &str = "supervisor.sock";

/// The control socket of the runtime whose broker listens on `broker_socket`.
pub(crate) fn socket_beside(broker_socket: &Path) -> PathBuf {
    broker_socket.with_file_name(SOCKET_NAME)
}

/// A reload asked for: the tasks (empty: all) and where the report goes.
type Ask = (Vec<String>, oneshot::Sender<ReloadReport>);

/// The control channel of a running supervisor; stops serving (and removes its sockets) when
/// dropped.
#[derive(Debug)]
pub(crate) struct Control {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Each socket's file, removed when dropped (after the servers are stopped).
    sockets: Vec<perago_core::socket::BoundSocket>,
}

impl Drop for Control {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        self.sockets.clear();
    }
}

/// Serves the control socket beside each of `broker_sockets` and takes SIGHUP (`hangups`,
/// registered by the caller as early as it can), both reloading through `reloader`. A socket
/// that cannot be bound is logged, and the others (and SIGHUP) still serve.
pub(crate) async fn serve(
    reloader: Reloader,
    broker_sockets: &[PathBuf],
    hangups: std::io::Result<tokio::signal::unix::Signal>,
) -> Control {
    let (asks, mut asked) = mpsc::channel::<Ask>(8);
    let mut tasks = Vec::new();
    // The one owner of the reloader: reloads run one at a time, in the order asked.
    tasks.push(tokio::spawn(async move {
        let mut reloader = reloader;
        while let Some((which, reply)) = asked.recv().await {
            let report = reloader.apply(&which).await;
            log(&report);
            let _ = reply.send(report);
        }
    }));
    match hangups {
        Ok(mut hangups) => {
            let asks = asks.clone();
            tasks.push(tokio::spawn(async move {
                while hangups.recv().await.is_some() {
                    tracing::info!("SIGHUP: reloading every manifest");
                    let (reply, _report) = oneshot::channel();
                    // The reload task logs the report: nobody else is there to read it.
                    if asks.send((Vec::new(), reply)).await.is_err() {
                        return;
                    }
                }
            }));
        }
        Err(e) => {
            tracing::warn!(error = %perago_core::errors::DisplayChain(&e), "cannot take SIGHUP; reload over the control socket only")
        }
    }
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(perago_proto::FILE_DESCRIPTOR_SET)
        .build_v1()
        .expect("the descriptor set is valid");
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(perago_proto::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .expect("the descriptor set is valid");
    let mut sockets = Vec::new();
    for broker_socket in broker_sockets {
        let path = socket_beside(broker_socket);
        let (listener, bound) = match perago_core::socket::bind(&path).await {
            Ok(bound) => bound,
            Err(e) => {
                tracing::warn!(socket = %path.display(), error = %perago_core::errors::DisplayChain(&e), "cannot serve the control socket; `perago-supervisor reload` cannot reach this runtime (SIGHUP still reloads)");
                continue;
            }
        };
        let owner = fs::metadata(&path).map(|m| m.uid()).ok();
        sockets.push(bound);
        let incoming = tokio_stream::StreamExt::filter_map(
            tokio_stream::wrappers::UnixListenerStream::new(listener),
            move |accepted| match accepted {
                Ok(stream) => {
                    let peer = stream.peer_cred().ok().map(|c| c.uid());
                    if peer.is_some() && peer == owner {
                        Some(Ok::<_, io::Error>(stream))
                    } else {
                        tracing::warn!(peer_uid = ?peer, "refused a control connection of another user");
                        None
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %perago_core::errors::DisplayChain(&e), "accept failed on the control socket");
                    None
                }
            },
        );
        let service = SupervisorServer::new(ControlService { asks: asks.clone() });
        let server = tonic::transport::Server::builder()
            // A reload checks every manifest and calls every broker (5 s each): a request
            // still unanswered after a minute is given up.
            .timeout(Duration::from_secs(60))
            .add_service(reflection.clone())
            .add_service(reflection_v1alpha.clone())
            .add_service(service)
            .serve_with_incoming(incoming);
        tasks.push(tokio::spawn(async move {
            if let Err(e) = server.await {
                tracing::warn!(socket = %path.display(), error = %perago_core::errors::DisplayChain(&e), "the control socket stopped serving");
            }
        }));
    }
    Control { tasks, sockets }
}

/// The report in the log: applied and unchanged at info, a refusal at warn with every problem.
fn log(report: &ReloadReport) {
    if let ReloadReport::Refused { problems } = report {
        tracing::warn!(
            problems = problems.len(),
            "reload refused; nothing applied, the running version keeps running"
        );
        for problem in problems {
            tracing::warn!("reload refused: {problem}");
        }
        return;
    }
    for line in report.lines() {
        if report.ok() {
            tracing::info!("reload: {line}");
        } else {
            tracing::warn!("reload: {line}");
        }
    }
}

/// `Supervisor`: hands each request to the reload task.
#[derive(Debug)]
struct ControlService {
    asks: mpsc::Sender<Ask>,
}

#[tonic::async_trait]
impl Supervisor for ControlService {
    async fn reload(
        &self,
        request: Request<ReloadRequest>,
    ) -> Result<Response<ReloadResponse>, Status> {
        let (reply, report) = oneshot::channel();
        self.asks
            .send((request.into_inner().tasks, reply))
            .await
            .map_err(|_| Status::unavailable("the supervisor is stopping"))?;
        let report = report
            .await
            .map_err(|_| Status::unavailable("the supervisor is stopping"))?;
        Ok(Response::new(response(&report)))
    }
}

/// The wire form of a report.
fn response(report: &ReloadReport) -> ReloadResponse {
    let (outcome, problems) = match report {
        ReloadReport::Unchanged { .. } => (ReloadOutcome::Unchanged, Vec::new()),
        ReloadReport::Applied { .. } => (ReloadOutcome::Applied, Vec::new()),
        ReloadReport::Refused { problems } => (ReloadOutcome::Refused, problems.clone()),
        ReloadReport::Partial { problems, .. } => (ReloadOutcome::Partial, problems.clone()),
    };
    ReloadResponse {
        outcome: outcome as i32,
        lines: report.lines(),
        problems,
        supervisor_pid: std::process::id(),
    }
}

/// The control sockets to ask, each with the tasks to reload there: `--socket`; each
/// manifest's runtime (found as `status` finds it), its task named; or, with neither, one
/// runtime of every running supervisor of this user, every task.
fn targets(
    args: &ReloadArgs,
    vars: &BTreeMap<String, String>,
) -> Result<Vec<(PathBuf, Vec<String>)>, ExpectedError> {
    if let Some(socket) = &args.socket {
        return Ok(vec![(socket.clone(), Vec::new())]);
    }
    if args.manifests.is_empty() {
        let registry_dir = crate::runtime::registry::dir(vars);
        let running = crate::runtime::registry::running(&registry_dir)
            .map_err(|e| ExpectedError::Config(vec![perago_core::errors::chain(&e)]))?;
        let found: Vec<_> = running
            .records
            .into_iter()
            .filter_map(|r| r.runtimes.into_iter().next())
            .map(|e| (socket_beside(&e.socket), Vec::new()))
            .collect();
        if found.is_empty() {
            return Err(ExpectedError::Config(vec![format!(
                "no perago supervisor of this user is running (none is recorded in {}); give the task's MANIFEST or --socket PATH",
                registry_dir.display()
            )]));
        }
        return Ok(found);
    }
    let running = crate::runtime::registry::running(&crate::runtime::registry::dir(vars))
        .map(|found| found.records)
        .unwrap_or_default();
    let several = args.manifests.len() > 1;
    let mut found: Vec<(PathBuf, Vec<String>)> = Vec::new();
    // Manifests of one supervisor go in one request: a change that spans its task types (a
    // concurrency group's limit, which every member states) is checked and applied at once.
    let mut supervisor_of: Vec<Option<usize>> = Vec::new();
    for manifest in &args.manifests {
        // The manifest on disk may be the broken one being reloaded: its task name is enough
        // to find the runtime, whose supervisor then checks it and lists every problem.
        let name = match perago_core::manifest::Manifest::load(manifest) {
            Ok(m) => m.task.name,
            Err(e) => task_name_of(manifest).ok_or(e)?,
        };
        let broker = crate::status::socket_of_task(&name, vars, several, &running);
        let supervisor = running
            .iter()
            .position(|r| r.runtimes.iter().any(|e| e.socket == broker));
        match supervisor_of
            .iter()
            .position(|s| s.is_some() && *s == supervisor)
        {
            Some(at) => found[at].1.push(name),
            None => {
                supervisor_of.push(supervisor);
                found.push((socket_beside(&broker), vec![name]));
            }
        }
    }
    Ok(found)
}

/// `task.name` of a manifest that may not validate (`None`: not even that can be read).
fn task_name_of(path: &Path) -> Option<String> {
    let text = perago_core::files::read_regular(path, perago_core::files::MAX_CONFIG_BYTES).ok()?;
    let table: toml::Table = toml::from_str(&text).ok()?;
    table.get("task")?.get("name")?.as_str().map(str::to_owned)
}

/// `reload`: asks each supervisor to reload, prints each report; exit 1 if any reload was
/// refused, partial, or could not be asked.
pub(crate) fn reload(
    args: &ReloadArgs,
    vars: &BTreeMap<String, String>,
) -> Result<(), ExpectedError> {
    let targets = targets(args, vars)?;
    let runtime = crate::pause::client_runtime()?;
    let mut failed = Vec::new();
    for (socket, tasks) in targets {
        let asked = runtime.block_on(async {
            let call = async {
                let channel = perago_core::socket::connect(&socket)
                    .await
                    .map_err(|e| perago_core::errors::chain(&e))?;
                SupervisorClient::new(channel)
                    .reload(ReloadRequest { tasks })
                    .await
                    .map(Response::into_inner)
                    .map_err(|s| s.message().to_owned())
            };
            // A reload checks every manifest and calls every broker (5 s each).
            tokio::time::timeout(Duration::from_secs(60), call)
                .await
                .unwrap_or_else(|_| Err("no answer within 60 s".to_owned()))
        });
        match asked {
            Ok(answer) => {
                let outcome =
                    ReloadOutcome::try_from(answer.outcome).unwrap_or(ReloadOutcome::Unspecified);
                let text: String = answer
                    .lines
                    .iter()
                    .map(|l| format!("{}\n", crate::status::cell(l, 2000)))
                    .collect();
                match outcome {
                    ReloadOutcome::Unchanged | ReloadOutcome::Applied => {
                        crate::out::print(&text)?;
                    }
                    _ => failed.push(ExpectedError::Reload(
                        answer
                            .lines
                            .iter()
                            .map(|l| crate::status::cell(l, 2000))
                            .collect(),
                    )),
                }
            }
            Err(e) => failed.push(ExpectedError::Config(vec![format!(
                "no perago supervisor answers at {}: {}",
                socket.display(),
                crate::status::cell(&e, 500)
            )])),
        }
    }
    match failed.len() {
        0 => Ok(()),
        1 => Err(failed.remove(0)),
        _ => Err(ExpectedError::Each(failed)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The control socket sits beside the broker's, in the same 0700 folder (bound by
    /// `perago_core::socket::bind`, tested there).
    #[test]
    fn the_control_socket_is_beside_the_brokers() {
        assert_eq!(
            socket_beside(Path::new("/r/run/broker.sock")),
            Path::new("/r/run/supervisor.sock")
        );
    }
}
