//! Shared helpers: an in-process server with a plain-HTTP client, JSON shortcuts for the
//! Conductor calls the tests make, and one `eventually` helper for conditions that can only be
//! polled (its patience is tunable with `PERAGO_TEST_PATIENCE_MS`).

use std::future::Future;
use std::time::Duration;

use perago_devstack::conductor::{ConductorHandle, ConductorServer, QueueSemantics};
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};

/// A response reduced to what tests assert on.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) content_type: Option<String>,
    pub(crate) text: String,
}

impl Reply {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.text)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?} {}", self.status, self.text))
    }

    /// Asserts an `ErrorResponse` body with this status and a message containing `needle`.
    pub(crate) fn assert_error(&self, status: u16, needle: &str) {
        assert_eq!(self.status.as_u16(), status, "body: {}", self.text);
        let body = self.json();
        assert_eq!(body["status"], status, "body: {body}");
        assert!(
            body["message"]
                .as_str()
                .unwrap_or_default()
                .contains(needle),
            "message should contain {needle:?}: {body}"
        );
        assert!(body["retryable"].is_boolean(), "body: {body}");
    }
}

/// A server started in this process on port 0.
pub(crate) struct Dev {
    pub(crate) server: ConductorHandle,
    pub(crate) http: Client,
    pub(crate) api: String,
}

impl Dev {
    pub(crate) async fn start() -> Self {
        Self::scaled(1.0).await
    }

    /// A server whose Conductor seconds last `scale` real seconds.
    pub(crate) async fn scaled(scale: f64) -> Self {
        Self::built(ConductorServer::builder().time_scale(scale)).await
    }

    /// A server whose batch polls answer with these queue semantics.
    pub(crate) async fn with_semantics(semantics: QueueSemantics) -> Self {
        Self::built(ConductorServer::builder().queue_semantics(semantics)).await
    }

    /// A server from `builder`.
    pub(crate) async fn built(builder: perago_devstack::conductor::ConductorServerBuilder) -> Self {
        let server = builder
            .bind("127.0.0.1:0")
            .await
            .expect("the dev server binds to a free port");
        let api = server.base_url();
        Self {
            server,
            http: http_client(),
            api,
        }
    }

    pub(crate) async fn send(&self, request: reqwest::RequestBuilder) -> Reply {
        let response = request.send().await.expect("request reaches the server");
        let status = response.status();
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let text = response.text().await.expect("body is readable");
        Reply {
            status,
            content_type,
            text,
        }
    }

    pub(crate) async fn get(&self, path: &str) -> Reply {
        self.send(self.http.get(format!("{}{path}", self.api)))
            .await
    }

    pub(crate) async fn post(&self, path: &str, body: &Value) -> Reply {
        self.send(self.http.post(format!("{}{path}", self.api)).json(body))
            .await
    }

    pub(crate) async fn post_raw(&self, path: &str, body: &str) -> Reply {
        let request = self
            .http
            .post(format!("{}{path}", self.api))
            .header("content-type", "application/json")
            .body(body.to_owned());
        self.send(request).await
    }

    pub(crate) async fn put(&self, path: &str, body: &Value) -> Reply {
        self.send(self.http.put(format!("{}{path}", self.api)).json(body))
            .await
    }

    /// Registers a TaskDef; `extra` is merged into `{"name": name}`.
    pub(crate) async fn task_def(&self, name: &str, extra: Value) {
        let mut def = json!({ "name": name });
        if let (Some(def), Some(extra)) = (def.as_object_mut(), extra.as_object()) {
            def.extend(extra.clone());
        }
        let reply = self.post("/metadata/taskdefs", &json!([def])).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    }

    /// Registers workflow `name` running `task_types` in order, with refs `r0`, `r1`, …; each
    /// task gets `{"x": <previous output or workflow input x>}`.
    pub(crate) async fn linear_workflow(&self, name: &str, task_types: &[&str]) {
        let tasks: Vec<Value> = task_types
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let x = if i == 0 {
                    "${workflow.input.x}".to_owned()
                } else {
                    format!("${{r{}.output.x}}", i - 1)
                };
                json!({"name": t, "taskReferenceName": format!("r{i}"), "type": "SIMPLE",
                       "inputParameters": {"x": x}})
            })
            .collect();
        let def = json!({"name": name, "version": 1, "tasks": tasks,
                         "outputParameters": {"result": format!("${{r{}.output.x}}", task_types.len() - 1)}});
        let reply = self.post("/metadata/workflow", &def).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    }

    pub(crate) async fn start_workflow(&self, name: &str, input: Value) -> String {
        let reply = self.post(&format!("/workflow/{name}"), &input).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        reply.text
    }

    /// Terminates a workflow with `reason`, as `DELETE /workflow/{id}` does.
    pub(crate) async fn terminate(&self, workflow_id: &str, reason: &str) {
        let reply = self
            .send(
                self.http
                    .delete(format!("{}/workflow/{workflow_id}", self.api))
                    .query(&[("reason", reason)]),
            )
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    }

    /// One batch poll of `count`, long-polling up to `timeout_ms`.
    pub(crate) async fn poll(&self, task_type: &str, count: usize, timeout_ms: u64) -> Vec<Value> {
        let reply = self
            .get(&format!(
                "/tasks/poll/batch/{task_type}?workerid=test-worker&count={count}&timeout={timeout_ms}"
            ))
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        reply
            .json()
            .as_array()
            .expect("batch poll answers an array")
            .clone()
    }

    /// Polls one task, waiting up to 5 s for it.
    pub(crate) async fn poll_one(&self, task_type: &str) -> Value {
        let mut tasks = self.poll(task_type, 1, 5000).await;
        assert_eq!(tasks.len(), 1, "expected one {task_type} task within 5 s");
        tasks.remove(0)
    }

    /// `POST /api/tasks` for `task` with `status` and `output`.
    pub(crate) async fn update(&self, task: &Value, status: &str, output: Value) -> Reply {
        self.post("/tasks", &result(task, status, output)).await
    }

    pub(crate) async fn task(&self, task_id: &str) -> Value {
        let reply = self.get(&format!("/tasks/{task_id}")).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        reply.json()
    }

    pub(crate) async fn workflow(&self, workflow_id: &str) -> Value {
        let reply = self.get(&format!("/workflow/{workflow_id}")).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        reply.json()
    }

    /// Waits for the workflow to reach a terminal status and returns it.
    pub(crate) async fn finished_workflow(&self, workflow_id: &str) -> Value {
        eventually("workflow ends", || async {
            let workflow = self.workflow(workflow_id).await;
            (workflow["status"] != "RUNNING").then_some(workflow)
        })
        .await
    }
}

/// A `TaskResult` body for a polled task.
pub(crate) fn result(task: &Value, status: &str, output: Value) -> Value {
    json!({
        "workflowInstanceId": task["workflowInstanceId"],
        "taskId": task["taskId"],
        "workerId": "test-worker",
        "status": status,
        "outputData": output,
    })
}

/// Polls `probe` until it yields a value, failing after the patience (default 10 s).
pub(crate) async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let patience = std::env::var("PERAGO_TEST_PATIENCE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(10), Duration::from_millis);
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {patience:?} waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A reqwest client. The workspace's reqwest has no TLS provider of its own (perago's clients
/// bring theirs), so ring is installed as the process default first.
pub(crate) fn http_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}
