//! Definitions and workflows: the TaskDef check, and for `dev` registering definitions and
//! running workflows.

use super::client::*;
use super::errors::ConductorError;
use crate::url::encode_segment as segment;
use reqwest::{Method, StatusCode};
use serde_json::Value;

impl ConductorClient {
    /// `GET /metadata/taskdefs/{name}`: `None` when the server says it does not exist (404,
    /// 204 or an empty answer). Anything else but a JSON object whose `name` is `name`
    /// (`null`, `[]`, another task's TaskDef) is no TaskDef of this task: an error saying
    /// what came, never a registration.
    pub async fn get_task_def(&self, name: &str) -> Result<Option<Value>, ConductorError> {
        let path = format!("/metadata/taskdefs/{}", segment(name));
        match self
            .send(
                Method::GET,
                &path,
                &[],
                None,
                REQUEST_TIMEOUT,
                MAX_TASK_DEF_ANSWER,
            )
            .await
        {
            Ok((StatusCode::NO_CONTENT, _)) => Ok(None),
            Ok((_, text)) if text.trim().is_empty() => Ok(None),
            Ok((_, text)) => {
                let def = Self::decode("GET", &path, &self.base, &text)?;
                let found = match &def {
                    Value::Object(fields) => match fields.get("name") {
                        Some(Value::String(n)) if n == name => return Ok(Some(def)),
                        Some(Value::String(n)) => format!("the TaskDef of {n:?}"),
                        Some(other) => format!("an object whose name is {other}"),
                        None => "an object without a name".to_owned(),
                    },
                    Value::Null => "null".to_owned(),
                    Value::Array(_) => "an array".to_owned(),
                    other => format!("{other}"),
                };
                Err(ConductorError::Decode {
                    method: "GET",
                    url: format!("{}{path}", self.base),
                    message: format!("expected the TaskDef of {name:?}, got {found}"),
                })
            }
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `POST /metadata/taskdefs` (create or update a list).
    pub async fn register_task_defs(&self, defs: &[Value]) -> Result<(), ConductorError> {
        let body = Value::Array(defs.to_vec());
        self.send(
            Method::POST,
            "/metadata/taskdefs",
            &[],
            Some((&body).into()),
            REQUEST_TIMEOUT,
            MAX_SMALL_ANSWER,
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
            Some((&body).into()),
            REQUEST_TIMEOUT,
            MAX_SMALL_ANSWER,
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
            .send(
                Method::POST,
                &path,
                &[],
                Some(input.into()),
                REQUEST_TIMEOUT,
                MAX_SMALL_ANSWER,
            )
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
                MAX_WORKFLOW_ANSWER,
            )
            .await?;
        Self::decode("GET", &path, &self.base, &text)
    }
}
