//! The Conductor side of every scenario: devstack in this process, one task type with a
//! one-task workflow, workflows started concurrently, and the task timestamps read back.
//! Throughput comes from Conductor's own clock (first poll to last completion), and the
//! benchmark waits for the workflows in this process, so neither its clock nor its reading of
//! workflows shows in the figures.

use perago_core::conductor::ConductorClient;
use perago_devstack::conductor::{ConductorHandle, ConductorServer, QueueSemantics};
use serde_json::json;
use std::{sync::Arc, time::Duration};
use tokio::{sync::Semaphore, task::JoinSet};

/// Workflow starts in flight at once.
const START_CONCURRENCY: usize = 32;

/// One completed task, by Conductor's timestamps (epoch ms).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TaskTimes {
    pub(crate) scheduled: i64,
    pub(crate) start: i64,
    pub(crate) end: i64,
    /// Objects a workspace task uploaded (`added + changed` of its `workspace` output).
    pub(crate) uploaded: u64,
}

/// devstack's Conductor with a client.
pub(crate) struct Conductor {
    pub(crate) server: ConductorHandle,
    pub(crate) client: ConductorClient,
}

impl Conductor {
    pub(crate) async fn start() -> Result<Self, String> {
        Self::start_semantics(QueueSemantics::default()).await
    }

    /// [`start`](Self::start) with these batch-poll semantics (`--queue-semantics`).
    pub(crate) async fn start_semantics(semantics: QueueSemantics) -> Result<Self, String> {
        let server = ConductorServer::builder()
            .queue_semantics(semantics)
            .bind("127.0.0.1:0")
            .await
            .map_err(|e| {
                format!(
                    "cannot start devstack: {}",
                    perago_core::errors::DisplayChain(&e)
                )
            })?;
        let client =
            ConductorClient::new(&server.base_url()).map_err(|e| perago_core::errors::chain(&e))?;
        Ok(Self { server, client })
    }

    pub(crate) fn url(&self) -> String {
        self.server.base_url()
    }

    /// Registers `task` (no retries, long timeouts) and its workflow `<task>.wf`.
    pub(crate) async fn register(&self, task: &str) -> Result<(), String> {
        self.register_with(task, None).await
    }

    /// [`register`](Self::register); with `workspace`, every workflow's task gets that
    /// workspace input.
    pub(crate) async fn register_with(
        &self,
        task: &str,
        workspace: Option<serde_json::Value>,
    ) -> Result<(), String> {
        let def = json!({
            "name": task, "retryCount": 0, "timeoutSeconds": 0, "responseTimeoutSeconds": 600,
            "inputKeys": ["params"], "outputKeys": ["result"],
        });
        let mut inputs = json!({"params": "${workflow.input.params}"});
        if let Some(ws) = workspace {
            inputs["workspace"] = ws;
        }
        self.client
            .register_task_defs(&[def])
            .await
            .map_err(|e| perago_core::errors::chain(&e))?;
        let wf = json!({
            "name": format!("{task}.wf"), "version": 1, "schemaVersion": 2,
            "tasks": [{"name": task, "taskReferenceName": "t", "type": "SIMPLE",
                       "inputParameters": inputs}],
            "outputParameters": {"result": "${t.output.result}"},
        });
        self.client
            .upsert_workflow_defs(&[wf])
            .await
            .map_err(|e| perago_core::errors::chain(&e))
    }

    /// Starts `n` workflows of `task`; returns their ids in start order.
    pub(crate) async fn start_many(&self, task: &str, n: usize) -> Result<Vec<String>, String> {
        self.start_many_padded(task, n, 0).await
    }

    /// [`start_many`](Self::start_many) with `pad` more bytes of input per task (a string in
    /// `params.pad`), for the payload-size figures.
    pub(crate) async fn start_many_padded(
        &self,
        task: &str,
        n: usize,
        pad: usize,
    ) -> Result<Vec<String>, String> {
        let padding = Arc::new("x".repeat(pad));
        let limit = Arc::new(Semaphore::new(START_CONCURRENCY));
        let mut starts = JoinSet::new();
        for i in 0..n {
            let (client, limit, name, padding) = (
                self.client.clone(),
                Arc::clone(&limit),
                format!("{task}.wf"),
                Arc::clone(&padding),
            );
            starts.spawn(async move {
                let _permit = limit.acquire_owned().await.expect("never closed");
                let params = if padding.is_empty() {
                    json!({"n": i})
                } else {
                    json!({"n": i, "pad": padding.as_str()})
                };
                let id = client
                    .start_workflow(&name, &json!({"params": params}))
                    .await
                    .map_err(|e| perago_core::errors::chain(&e))?;
                Ok::<_, String>((i, id))
            });
        }
        let mut ids = vec![String::new(); n];
        while let Some(done) = starts.join_next().await {
            let (i, id) = done.map_err(|e| perago_core::errors::chain(&e))??;
            ids[i] = id;
        }
        Ok(ids)
    }

    /// Waits until `pollers` polls wait on devstack at once: every worker of a runner whose
    /// workers each keep one poll in flight is polling, its start-up done. Measured from
    /// there, a runner whose processes take a second to import (conductor-python's do) is not
    /// charged that second's CPU per task, nor measured from a later first poll than a runner
    /// that polls at once while the workflows are still being started.
    pub(crate) async fn wait_polling(
        &self,
        pollers: usize,
        patience: Duration,
    ) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + patience;
        while self.server.polls_waiting() < pollers {
            if tokio::time::Instant::now() > deadline {
                return Err(format!(
                    "{pollers} polls were not waiting on devstack at once within {patience:?} (the runner did not start polling, or its polls do not wait: the benchmark needs long polls, so not PERAGO_POLL_WAIT_MS=0 nor immediate queues)"
                ));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Ok(())
    }

    /// Waits for every workflow (in start order, which is roughly completion order) and
    /// returns its task's timestamps. Fails if one does not complete within `patience`.
    ///
    /// While the workers run, the wait reads each workflow's state in this process
    /// ([`ConductorHandle::workflow_running`]); the workflows are read over HTTP (their task's
    /// timestamps) only once they have all ended. A `GET /api/workflow` of a running one
    /// every few milliseconds would serialize its input and output (4 MiB per workflow of
    /// 1 MiB tasks) on the cores the workers under test run on, under devstack's state lock.
    pub(crate) async fn wait_all(
        &self,
        ids: &[String],
        patience: Duration,
    ) -> Result<Vec<TaskTimes>, String> {
        let deadline = tokio::time::Instant::now() + patience;
        for id in ids {
            // A workflow devstack does not know, or one that stopped without completing, is
            // read below and fails there.
            while self.server.workflow_running(id) == Some(true) {
                if tokio::time::Instant::now() > deadline {
                    return Err(format!(
                        "workflow {id} did not complete within {patience:?}"
                    ));
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            loop {
                let wf = self
                    .client
                    .get_workflow(id)
                    .await
                    .map_err(|e| perago_core::errors::chain(&e))?;
                match wf["status"].as_str() {
                    Some("COMPLETED") => {
                        let task = &wf["tasks"][0];
                        let ms = |k: &str| task[k].as_i64().unwrap_or(0);
                        let ws = &task["outputData"]["workspace"];
                        let count = |k: &str| ws[k].as_u64().unwrap_or(0);
                        out.push(TaskTimes {
                            scheduled: ms("scheduledTime"),
                            start: ms("startTime"),
                            end: ms("endTime"),
                            uploaded: count("added") + count("changed"),
                        });
                        break;
                    }
                    Some("RUNNING") => {}
                    other => {
                        return Err(format!(
                            "workflow {id} ended {other:?}: {}",
                            wf["reasonForIncompletion"]
                        ));
                    }
                }
                if tokio::time::Instant::now() > deadline {
                    return Err(format!(
                        "workflow {id} did not complete within {patience:?}"
                    ));
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        Ok(out)
    }
}

/// Tasks per second between the first poll and the last completion.
pub(crate) fn throughput(times: &[TaskTimes]) -> f64 {
    let first = times.iter().map(|t| t.start).min().unwrap_or(0);
    let last = times.iter().map(|t| t.end).max().unwrap_or(0);
    let span_ms = (last - first).max(1) as f64;
    times.len() as f64 * 1000.0 / span_ms
}

/// What the ceiling client did: its rate and the CPU its thread spent.
pub(crate) struct Ceiling {
    pub(crate) tasks_per_second: f64,
    /// CPU seconds of the client's own thread: the Conductor client alone (HTTP, JSON), the
    /// share of the runtime's CPU that talking to Conductor costs at best.
    pub(crate) cpu_seconds: f64,
}

/// The ceiling: one client doing nothing but batch poll + update, for `n` scheduled tasks. It
/// runs on a thread of its own, with its own client and a current-thread runtime, so that
/// thread's CPU-time clock charges it alone and not devstack beside it in this process.
pub(crate) async fn ceiling(
    conductor: &Conductor,
    task: &str,
    n: usize,
) -> Result<Ceiling, String> {
    conductor.register(task).await?;
    conductor.start_many(task, n).await?;
    let (url, task) = (conductor.url(), task.to_owned());
    let client = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| perago_core::errors::chain(&e))?;
        runtime.block_on(ceiling_client(&url, &task, n))
    });
    tokio::task::spawn_blocking(move || client.join())
        .await
        .map_err(|e| perago_core::errors::chain(&e))?
        .map_err(|_| "the ceiling client panicked".to_owned())?
}

async fn ceiling_client(url: &str, task: &str, n: usize) -> Result<Ceiling, String> {
    let client = ConductorClient::new(url).map_err(|e| perago_core::errors::chain(&e))?;
    let cpu = || perago_sys::cpu::thread_cpu_time().map_err(|e| perago_core::errors::chain(&e));
    let cpu_before = cpu()?;
    let started = tokio::time::Instant::now();
    let mut done = 0;
    while done < n {
        let tasks = client
            .batch_poll(task, "ceiling", 64, Duration::from_millis(100))
            .await
            .map_err(|e| perago_core::errors::chain(&e))?;
        for t in tasks {
            let perago_core::conductor::Polled::Task(t) = t else {
                return Err("the ceiling client polled an undecodable task".to_owned());
            };
            let input = t
                .input_data
                .as_ref()
                .and_then(|input| input.to_value().ok())
                .unwrap_or_default();
            let body = json!({
                "workflowInstanceId": t.fields["workflowInstanceId"], "taskId": t.fields["taskId"],
                "status": "COMPLETED", "workerId": "ceiling",
                "outputData": {"result": input["params"]},
            });
            client
                .update_task(&body)
                .await
                .map_err(|e| perago_core::errors::chain(&e))?;
            done += 1;
        }
    }
    Ok(Ceiling {
        tasks_per_second: n as f64 / started.elapsed().as_secs_f64(),
        cpu_seconds: (cpu()? - cpu_before).as_secs_f64(),
    })
}
