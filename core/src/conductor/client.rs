//! A Conductor REST client for exactly what perago needs: the worker API (batch poll, update,
//! update-v2, get task), the TaskDef check, and, for `dev`, registering definitions and
//! running workflows. Every request has an explicit timeout; nothing here retries — callers
//! decide with [`ConductorError::is_retryable`].

use super::errors::ConductorError;
use crate::url::encode_segment as segment;
use reqwest::{Method, StatusCode};
use serde_json::Value;
use std::time::Duration;

/// The longest long-poll Conductor accepts (`timeout` > 5000 ms is a 400).
pub const MAX_LONG_POLL: Duration = Duration::from_millis(5000);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Kept of an error body for messages.
const MAX_ERROR_BODY: usize = 512;

/// A base URL that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("CONDUCTOR_SERVER_URL {url:?} is invalid: {problem}")]
pub struct BaseUrlError {
    /// As given.
    pub url: String,
    /// Why.
    pub problem: &'static str,
}

/// A client for one Conductor server.
#[derive(Debug, Clone)]
pub struct ConductorClient {
    http: reqwest::Client,
    /// The API base including `/api`, without a trailing `/`.
    base: String,
}

impl ConductorClient {
    /// A client for `base_url` (`CONDUCTOR_SERVER_URL`, which includes `/api`; a trailing `/`
    /// is ignored).
    pub fn new(base_url: &str) -> Result<Self, BaseUrlError> {
        let err = |problem| BaseUrlError {
            url: base_url.to_owned(),
            problem,
        };
        let base = base_url.trim().trim_end_matches('/');
        let rest = if let Some(rest) = base.strip_prefix("http://") {
            rest
        } else if base.starts_with("https://") {
            return Err(err(
                "https is not supported by this build yet; use http (e.g. through a local proxy)",
            ));
        } else {
            return Err(err("expected an http:// URL including /api"));
        };
        if rest.is_empty() || rest.starts_with('/') {
            return Err(err("the URL has no host"));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .pool_max_idle_per_host(16)
            .build()
            .map_err(|_| err("cannot build an HTTP client"))?;
        Ok(Self {
            http,
            base: base.to_owned(),
        })
    }

    /// The API base URL.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
        timeout: Duration,
    ) -> Result<(StatusCode, String), ConductorError> {
        let url = format!("{}{path}", self.base);
        let method_name = match method {
            Method::GET => "GET",
            Method::POST => "POST",
            Method::PUT => "PUT",
            Method::DELETE => "DELETE",
            _ => "HTTP",
        };
        let mut req = self.http.request(method, &url).timeout(timeout);
        if !query.is_empty() {
            req = req.query(query);
        }
        if let Some(body) = body {
            req = req.json(body);
        }
        let transport = |source| ConductorError::Transport {
            method: method_name,
            url: url.clone(),
            source,
        };
        let resp = req.send().await.map_err(transport)?;
        let status = resp.status();
        let text = resp.text().await.map_err(transport)?;
        if status.is_client_error() || status.is_server_error() {
            let mut body = text;
            if body.len() > MAX_ERROR_BODY {
                let mut cut = MAX_ERROR_BODY;
                while !body.is_char_boundary(cut) {
                    cut -= 1;
                }
                body.truncate(cut);
                body.push('…');
            }
            return Err(ConductorError::Status {
                method: method_name,
                url,
                status: status.as_u16(),
                body,
            });
        }
        Ok((status, text))
    }

    fn decode(
        method: &'static str,
        path: &str,
        base: &str,
        text: &str,
    ) -> Result<Value, ConductorError> {
        serde_json::from_str(text).map_err(|e| ConductorError::Decode {
            method,
            url: format!("{base}{path}"),
            message: format!("invalid JSON: {e}"),
        })
    }

    /// `GET /metadata/taskdefs/{name}`: `None` when the server says it does not exist.
    pub async fn get_task_def(&self, name: &str) -> Result<Option<Value>, ConductorError> {
        let path = format!("/metadata/taskdefs/{}", segment(name));
        match self
            .send(Method::GET, &path, &[], None, REQUEST_TIMEOUT)
            .await
        {
            Ok((StatusCode::NO_CONTENT, _)) => Ok(None),
            Ok((_, text)) if text.trim().is_empty() => Ok(None),
            Ok((_, text)) => Self::decode("GET", &path, &self.base, &text).map(Some),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `GET /tasks/poll/batch/{type}`: up to `count` tasks, waiting up to `wait` (capped at
    /// 5 s) for them. Empty (`200 []`, 204 or an empty body) is an empty list.
    pub async fn batch_poll(
        &self,
        task_type: &str,
        worker_id: &str,
        count: u32,
        wait: Duration,
    ) -> Result<Vec<Value>, ConductorError> {
        let wait = wait.min(MAX_LONG_POLL);
        let path = format!("/tasks/poll/batch/{}", segment(task_type));
        let query = [
            ("workerid", worker_id.to_owned()),
            ("count", count.max(1).to_string()),
            ("timeout", wait.as_millis().to_string()),
        ];
        let (status, text) = self
            .send(Method::GET, &path, &query, None, wait + REQUEST_TIMEOUT)
            .await?;
        if status == StatusCode::NO_CONTENT || text.trim().is_empty() {
            return Ok(Vec::new());
        }
        match Self::decode("GET", &path, &self.base, &text)? {
            Value::Array(tasks) => Ok(tasks),
            _ => Err(ConductorError::Decode {
                method: "GET",
                url: format!("{}{path}", self.base),
                message: "expected a JSON array of tasks".into(),
            }),
        }
    }

    /// `POST /tasks` (update v1). A 200 does not prove the update was applied: Conductor
    /// silently ignores updates to terminal tasks.
    pub async fn update_task(&self, result: &Value) -> Result<(), ConductorError> {
        self.send(Method::POST, "/tasks", &[], Some(result), REQUEST_TIMEOUT)
            .await
            .map(drop)
    }

    /// `POST /tasks/update-v2`: the update, then the next task of the same type for the same
    /// worker, if any.
    pub async fn update_task_v2(&self, result: &Value) -> Result<Option<Value>, ConductorError> {
        let path = "/tasks/update-v2";
        let (status, text) = self
            .send(Method::POST, path, &[], Some(result), REQUEST_TIMEOUT)
            .await?;
        if status == StatusCode::NO_CONTENT || text.trim().is_empty() {
            return Ok(None);
        }
        Self::decode("POST", path, &self.base, &text).map(Some)
    }

    /// `GET /tasks/{taskId}`. A 204 (servers before 3.21.20) counts as not found.
    pub async fn get_task(&self, task_id: &str) -> Result<Value, ConductorError> {
        let path = format!("/tasks/{}", segment(task_id));
        let (status, text) = self
            .send(Method::GET, &path, &[], None, REQUEST_TIMEOUT)
            .await?;
        if status == StatusCode::NO_CONTENT || text.trim().is_empty() {
            return Err(ConductorError::Status {
                method: "GET",
                url: format!("{}{path}", self.base),
                status: 404,
                body: "no such task (empty answer)".into(),
            });
        }
        Self::decode("GET", &path, &self.base, &text)
    }

    /// `POST /metadata/taskdefs` (create or update a list).
    pub async fn register_task_defs(&self, defs: &[Value]) -> Result<(), ConductorError> {
        let body = Value::Array(defs.to_vec());
        self.send(
            Method::POST,
            "/metadata/taskdefs",
            &[],
            Some(&body),
            REQUEST_TIMEOUT,
        )
        .await
        .map(drop)
    }

    /// `PUT /metadata/workflow` (upsert a list of workflow definitions).
    pub async fn upsert_workflow_defs(&self, defs: &[Value]) -> Result<(), ConductorError> {
        let body = Value::Array(defs.to_vec());
        self.send(
            Method::PUT,
            "/metadata/workflow",
            &[],
            Some(&body),
            REQUEST_TIMEOUT,
        )
        .await
        .map(drop)
    }

    /// `POST /workflow/{name}` with `input`; returns the workflow id.
    pub async fn start_workflow(
        &self,
        name: &str,
        input: &Value,
    ) -> Result<String, ConductorError> {
        let path = format!("/workflow/{}", segment(name));
        let (_, text) = self
            .send(Method::POST, &path, &[], Some(input), REQUEST_TIMEOUT)
            .await?;
        Ok(text.trim().trim_matches('"').to_owned())
    }

    /// `GET /workflow/{id}` with its tasks.
    pub async fn get_workflow(&self, workflow_id: &str) -> Result<Value, ConductorError> {
        let path = format!("/workflow/{}", segment(workflow_id));
        let (_, text) = self
            .send(
                Method::GET,
                &path,
                &[("includeTasks", "true".into())],
                None,
                REQUEST_TIMEOUT,
            )
            .await?;
        Self::decode("GET", &path, &self.base, &text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls() {
        assert_eq!(
            ConductorClient::new("http://127.0.0.1:8080/api/")
                .unwrap()
                .base_url(),
            "http://127.0.0.1:8080/api"
        );
        assert_eq!(
            ConductorClient::new("localhost:8080")
                .unwrap_err()
                .to_string(),
            "CONDUCTOR_SERVER_URL \"localhost:8080\" is invalid: expected an http:// URL including /api"
        );
        assert!(ConductorClient::new("http:///api").is_err());
        assert!(ConductorClient::new("https://conductor.example.com/api").is_err());
    }
}
