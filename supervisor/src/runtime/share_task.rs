//! The coordinator of capacity shared across task types (docs/sharing.md): follows the
//! `Admin.Watch` stream of every sharing broker, feeds what each says to the ledger
//! (`crate::share`), and sends the ledger's grants (`Admin.ShareGrant`). Runs beside the
//! runtimes until they are done (the caller aborts it); nothing here decides.

use crate::share::{Grant, Input, Ledger, SharePlan};
use perago_proto::admin::v1::{self as admin, admin_client::AdminClient};
use std::{path::PathBuf, time::Duration, time::Instant};
use tokio::sync::mpsc;
use tonic::transport::Channel;

/// The longest a grant may take to be answered.
const GRANT_DEADLINE: Duration = Duration::from_secs(5);
/// The wait before a broker's socket is tried again (it starts beside this task).
const RETRY: Duration = Duration::from_millis(200);

enum Msg {
    Ledger(Input),
    /// Type `index`'s broker answers on this channel.
    Channel(usize, Channel),
    /// A grant's answer took this long (for the log).
    Answered(usize, Duration, admin::ShareStatus),
}

/// Runs the ledger over the brokers at `sockets` (one per type, in the plan's order); a plan
/// on `replans` (a reload changed a concurrency limit or cost) replaces its caps.
pub(crate) async fn coordinate(
    plan: SharePlan,
    sockets: Vec<PathBuf>,
    mut replans: mpsc::UnboundedReceiver<SharePlan>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut followers = tokio::task::JoinSet::new();
    for (index, socket) in sockets.into_iter().enumerate() {
        if plan.shares(index) {
            followers.spawn(follow(index, socket, tx.clone()));
        }
    }
    tracing::info!(types = ?plan.types, priority = ?plan.priority, caps = ?plan.constraints.iter().map(|c| (c.what.as_str(), c.cap)).collect::<Vec<_>>(), "capacity shared across task types");
    let mut ledger = Ledger::new(plan);
    let mut channels: Vec<Option<Channel>> = vec![None; ledger.plan().types.len()];
    loop {
        let msg = tokio::select! {
            msg = rx.recv() => msg,
            Some(plan) = replans.recv() => {
                tracing::info!(caps = ?plan.constraints.iter().map(|c| (c.what.as_str(), c.cap)).collect::<Vec<_>>(), "capacity sharing replanned by a reload");
                let grants = ledger.replan(plan);
                send_all(&ledger, grants, &channels, &tx);
                continue;
            }
        };
        let Some(msg) = msg else { break };
        let input = match msg {
            Msg::Channel(index, channel) => {
                channels[index] = Some(channel);
                continue;
            }
            Msg::Answered(index, took, share) => {
                tracing::debug!(task = %ledger.plan().types[index], limit = share.limit, held = share.held, took_us = took.as_micros(), "share grant answered");
                Input::Answered { index, share }
            }
            Msg::Ledger(input) => input,
        };
        let grants = ledger.handle(input);
        send_all(&ledger, grants, &channels, &tx);
    }
}

/// Sends each grant to its broker (one not connected yet counts as failed: sent again).
fn send_all(
    ledger: &Ledger,
    grants: Vec<Grant>,
    channels: &[Option<Channel>],
    tx: &mpsc::UnboundedSender<Msg>,
) {
    for grant in grants {
        let Some(channel) = channels[grant.index].clone() else {
            let _ = tx.send(Msg::Ledger(Input::Failed {
                index: grant.index,
                epoch: grant.epoch,
            }));
            continue;
        };
        tracing::debug!(task = %ledger.plan().types[grant.index], limit = grant.limit, epoch = grant.epoch, "share grant");
        tokio::spawn(send_grant(channel, grant, tx.clone()));
    }
}

async fn send_grant(channel: Channel, grant: Grant, tx: mpsc::UnboundedSender<Msg>) {
    let Grant {
        index,
        limit,
        epoch,
    } = grant;
    let asked = Instant::now();
    let mut client = AdminClient::new(channel);
    let call = client.share_grant(admin::ShareGrantRequest { limit, epoch });
    let msg = match tokio::time::timeout(GRANT_DEADLINE, call).await {
        Ok(Ok(answer)) => Msg::Answered(index, asked.elapsed(), answer.into_inner()),
        Ok(Err(e)) => {
            tracing::debug!(error = %e.message(), "a share grant failed");
            tokio::time::sleep(RETRY).await;
            Msg::Ledger(Input::Failed { index, epoch })
        }
        Err(_) => Msg::Ledger(Input::Failed { index, epoch }),
    };
    let _ = tx.send(msg);
}

/// Follows one broker's state for as long as the coordinator runs.
async fn follow(index: usize, socket: PathBuf, tx: mpsc::UnboundedSender<Msg>) {
    let request = admin::WatchRequest { heartbeat_ms: 1000 };
    loop {
        if tx.is_closed() {
            return;
        }
        let Ok(channel) = perago_core::socket::connect(&socket).await else {
            tokio::time::sleep(RETRY).await;
            continue;
        };
        if tx.send(Msg::Channel(index, channel.clone())).is_err() {
            return;
        }
        if let Ok(stream) = AdminClient::new(channel).watch(request).await {
            let mut stream = stream.into_inner();
            while let Ok(Some(status)) = stream.message().await {
                let Some(share) = status.share else { continue };
                let started = share.started;
                let broker = (status.broker_pid, status.started_at_unix_ms);
                let input = Input::Reported {
                    index,
                    broker,
                    share,
                    started,
                };
                if tx.send(Msg::Ledger(input)).is_err() {
                    return;
                }
            }
        }
        tokio::time::sleep(RETRY).await;
    }
}
