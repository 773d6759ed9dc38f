//! Poll + update round trips per second from one client against an in-process Conductor dev
//! server. A benchmark, not a test: run it in release mode.
//!
//! ```text
//! cargo run --release -p perago-devstack --example bench_poll_update -- [TASKS]
//! ```
//!
//! It starts TASKS one-task workflows (default 20000), then measures two worker loops over
//! one keep-alive HTTP connection: `batch poll (count 1) + POST /api/tasks` (two requests per
//! task), and `POST /api/tasks/update-v2` chaining (one request per task, as the SDKs do).

#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use perago_devstack::conductor::ConductorServer;
use serde_json::{Value, json};

type Error = Box<dyn std::error::Error>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let tasks: usize = match std::env::args().nth(1) {
        Some(n) => n.parse()?,
        None => 20_000,
    };
    let server = ConductorServer::builder().bind("127.0.0.1:0").await?;
    let api = server.base_url();
    // reqwest brings no TLS provider of its own in this workspace.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();

    let def = json!({"name": "bench", "tasks": [{"name": "bench_task", "taskReferenceName": "t"}]});
    http.post(format!("{api}/metadata/workflow"))
        .json(&def)
        .send()
        .await?
        .error_for_status()?;

    let half = tasks / 2;
    schedule(&http, &api, tasks).await?;

    let started = Instant::now();
    for _ in 0..half {
        let polled: Vec<Value> = http
            .get(format!(
                "{api}/tasks/poll/batch/bench_task?count=1&timeout=100&workerid=bench"
            ))
            .send()
            .await?
            .json()
            .await?;
        let task = polled.first().ok_or("queue ran dry")?;
        http.post(format!("{api}/tasks"))
            .json(&result(task))
            .send()
            .await?
            .error_for_status()?;
    }
    report("poll + update (v1)", half, started.elapsed());

    let started = Instant::now();
    let polled: Vec<Value> = http
        .get(format!(
            "{api}/tasks/poll/batch/bench_task?count=1&timeout=100&workerid=bench"
        ))
        .send()
        .await?
        .json()
        .await?;
    let mut task = polled.first().cloned().ok_or("queue ran dry")?;
    let mut done = 0;
    loop {
        let response = http
            .post(format!("{api}/tasks/update-v2"))
            .json(&result(&task))
            .send()
            .await?;
        done += 1;
        if response.status() == reqwest::StatusCode::NO_CONTENT {
            break;
        }
        task = response.error_for_status()?.json().await?;
    }
    report("update-v2 chain", done, started.elapsed());

    server.shutdown().await;
    Ok(())
}

async fn schedule(http: &reqwest::Client, api: &str, tasks: usize) -> Result<(), Error> {
    let started = Instant::now();
    for i in 0..tasks {
        http.post(format!("{api}/workflow/bench"))
            .json(&json!({"i": i}))
            .send()
            .await?
            .error_for_status()?;
    }
    report("workflow starts", tasks, started.elapsed());
    Ok(())
}

fn result(task: &Value) -> Value {
    json!({
        "workflowInstanceId": task["workflowInstanceId"],
        "taskId": task["taskId"],
        "workerId": "bench",
        "status": "COMPLETED",
        "outputData": {"ok": true},
    })
}

fn report(what: &str, count: usize, elapsed: Duration) {
    let rate = count as f64 / elapsed.as_secs_f64();
    println!("{what}: {count} in {elapsed:.2?} = {rate:.0}/s");
}
