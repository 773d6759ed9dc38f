//! The worker API: batch poll, queue sizes, update, update-v2, get task.

use super::client::*;
use super::domain::{Domain, queue_name};
use super::errors::ConductorError;
use super::polled::{Polled, TaskTypes};
use crate::url::encode_segment as segment;
use reqwest::{Method, StatusCode};
use serde_json::{Value, value::RawValue};
use std::time::Duration;

impl ConductorClient {
    /// `GET /tasks/poll/batch/{type}`: up to `count` tasks, waiting up to `wait` (capped at
    /// 5 s) for them. Empty (`200 []`, 204 or an empty body) is an empty list.
    pub async fn batch_poll(
        &self,
        task_type: &str,
        worker_id: &str,
        count: u32,
        wait: Duration,
    ) -> Result<Vec<Polled>, ConductorError> {
        self.batch_poll_in(task_type, None, worker_id, count, wait)
            .await
    }

    /// [`Self::batch_poll`] in `domain` (`&domain=…`): Conductor then pops the domain's queue
    /// (`domain:type`) only; without one, the default queue only.
    pub async fn batch_poll_in(
        &self,
        task_type: &str,
        domain: Option<&Domain>,
        worker_id: &str,
        count: u32,
        wait: Duration,
    ) -> Result<Vec<Polled>, ConductorError> {
        let wait = wait.min(MAX_LONG_POLL);
        let path = format!("/tasks/poll/batch/{}", segment(task_type));
        let mut query = vec![("workerid", worker_id.to_owned())];
        if let Some(domain) = domain {
            query.push(("domain", domain.as_str().to_owned()));
        }
        query.extend([
            ("count", count.max(1).to_string()),
            ("timeout", wait.as_millis().to_string()),
        ]);
        let (status, text) = self
            .send(
                Method::GET,
                &path,
                &query,
                None,
                wait + REQUEST_TIMEOUT,
                max_poll_answer(count),
            )
            .await?;
        if status == StatusCode::NO_CONTENT || text.trim().is_empty() {
            return Ok(Vec::new());
        }
        // The array is split without parsing or copying its elements (serde_json skips
        // values iteratively), then each task is decoded on its own: one bad task fails alone.
        let tasks: Vec<&RawValue> =
            serde_json::from_str(&text).map_err(|e| ConductorError::Decode {
                method: "GET",
                url: format!("{}{path}", self.base),
                message: format!(
                    "expected a JSON array of tasks: {}",
                    crate::errors::DisplayChain(&e)
                ),
            })?;
        if let [task] = tasks[..] {
            // One task: it takes the answer's buffer over.
            let start = task.get().as_ptr() as usize - text.as_ptr() as usize;
            let range = start..start + task.get().len();
            return Ok(vec![Polled::decode_owned(text, range)]);
        }
        Ok(tasks.iter().map(|raw| Polled::decode(raw.get())).collect())
    }

    /// `GET /tasks/queue/size?taskType=…`: how many tasks of `task_type` wait in Conductor's
    /// queue (delayed ones, such as retries waiting out their delay, included). The answer is
    /// a bare JSON integer. This is the route the API keeps; [`Self::queue_sizes`] is the
    /// deprecated one.
    pub async fn queue_size(&self, task_type: &str) -> Result<u64, ConductorError> {
        self.queue_size_in(task_type, None).await
    }

    /// [`Self::queue_size`] of `domain`'s queue (`&domain=…`: the server counts the queue
    /// `domain:type`, as it names it in `QueueUtils.getQueueName`).
    pub async fn queue_size_in(
        &self,
        task_type: &str,
        domain: Option<&Domain>,
    ) -> Result<u64, ConductorError> {
        let path = "/tasks/queue/size";
        let mut query = vec![("taskType", task_type.to_owned())];
        if let Some(domain) = domain {
            query.push(("domain", domain.as_str().to_owned()));
        }
        // Read every second: a slow answer is dropped rather than waited for.
        let (_, text) = self
            .send(
                Method::GET,
                path,
                &query,
                None,
                Duration::from_secs(5),
                MAX_SMALL_ANSWER,
            )
            .await?;
        let value = Self::decode("GET", path, &self.base, &text)?;
        value.as_u64().ok_or_else(|| ConductorError::Decode {
            method: "GET",
            url: format!("{}{path}", self.base),
            message: "expected a count (a non-negative integer)".to_owned(),
        })
    }

    /// `GET /tasks/queue/sizes?taskType=…` (deprecated in the API, kept as a fallback): the
    /// same count as [`Self::queue_size`], answered as `{"<type>": <count>}`.
    ///
    /// The name is sent twice: Spring binds a parameter given once to a `List<String>` by
    /// splitting it at commas (and trimming the pieces), so `taskType=a,b` would ask for the
    /// queues `a` and `b`; a parameter given twice is taken value by value, whole. The
    /// answer is then `{"a,b": <count>}`, and one without the name's key is refused, never
    /// read as some other count.
    pub async fn queue_sizes(&self, task_type: &str) -> Result<u64, ConductorError> {
        self.queue_sizes_of(&queue_name(task_type, None)).await
    }

    /// [`Self::queue_sizes`] of `domain`'s queue: this route takes queue names, not types
    /// (`ExecutionService.getTaskQueueSizes` counts each name as a queue), so the domain's is
    /// asked for as `domain:type`.
    pub async fn queue_sizes_in(
        &self,
        task_type: &str,
        domain: Option<&Domain>,
    ) -> Result<u64, ConductorError> {
        self.queue_sizes_of(&queue_name(task_type, domain)).await
    }

    async fn queue_sizes_of(&self, task_type: &str) -> Result<u64, ConductorError> {
        let path = "/tasks/queue/sizes";
        let query = [
            ("taskType", task_type.to_owned()),
            ("taskType", task_type.to_owned()),
        ];
        // Read every second: a slow answer is dropped rather than waited for.
        let (_, text) = self
            .send(
                Method::GET,
                path,
                &query,
                None,
                Duration::from_secs(5),
                MAX_SMALL_ANSWER,
            )
            .await?;
        let value = Self::decode("GET", path, &self.base, &text)?;
        value
            .get(task_type)
            .and_then(Value::as_u64)
            .ok_or_else(|| ConductorError::Decode {
                method: "GET",
                url: format!("{}{path}", self.base),
                message: format!("expected {{\"{task_type}\": <count>}}"),
            })
    }

    /// `POST /tasks` (update v1). A 200 does not prove the update was applied: Conductor
    /// silently ignores updates to terminal tasks.
    /// Its answer (the task id) is not used: one too large to read still means the update
    /// was applied.
    pub async fn update_task<'a>(
        &self,
        result: impl Into<JsonBody<'a>>,
    ) -> Result<(), ConductorError> {
        match self
            .send(
                Method::POST,
                "/tasks",
                &[],
                Some(result.into()),
                REQUEST_TIMEOUT,
                MAX_SMALL_ANSWER,
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(e @ ConductorError::TooLarge { .. }) if e.status().is_some_and(|s| s < 300) => {
                tracing::warn!(error = %crate::errors::DisplayChain(&e), "the update was applied; its answer is not read");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// `POST /tasks/update-v2`: the update, then the next task of the same type for the same
    /// worker, if any.
    /// The update was applied once this returns `Ok`, even when the next task it brings
    /// cannot be decoded (that task is [`Polled::Undecodable`]).
    pub async fn update_task_v2<'a>(
        &self,
        result: impl Into<JsonBody<'a>>,
    ) -> Result<Option<Polled>, ConductorError> {
        let path = "/tasks/update-v2";
        let (status, text) = match self
            .send(
                Method::POST,
                path,
                &[],
                Some(result.into()),
                REQUEST_TIMEOUT,
                MAX_TASK_ANSWER,
            )
            .await
        {
            Ok(answer) => answer,
            // Applied; the next task it brings is too large to read (and cannot be told
            // about: its ids are in what was not read).
            Err(e @ ConductorError::TooLarge { .. }) if e.status().is_some_and(|s| s < 300) => {
                return Ok(Some(Polled::Undecodable {
                    ids: None,
                    types: TaskTypes::default(),
                    problem: crate::errors::chain(&e),
                }));
            }
            Err(e) => return Err(e),
        };
        if status == StatusCode::NO_CONTENT || text.trim().is_empty() {
            return Ok(None);
        }
        let range = 0..text.len();
        Ok(Some(Polled::decode_owned(text, range)))
    }

    /// `GET /tasks/{taskId}`. A 204 (servers before 3.21.20) counts as not found.
    pub async fn get_task(&self, task_id: &str) -> Result<Value, ConductorError> {
        let path = format!("/tasks/{}", segment(task_id));
        let (status, text) = self
            .send(
                Method::GET,
                &path,
                &[],
                None,
                REQUEST_TIMEOUT,
                MAX_TASK_ANSWER,
            )
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
}

/// What a client learned of a server's queue-depth routes: the kept `GET /tasks/queue/size`,
/// and, where that is missing (it answers 404 or 405: it never answers 404 for a task type, an
/// unknown one counts 0), the deprecated `GET /tasks/queue/sizes`, asked from then on. One per
/// reader of one server (a broker, the KEDA scaler), shared by its reads.
#[derive(Debug, Default)]
pub struct DepthRoutes {
    size_missing: std::sync::atomic::AtomicBool,
}

/// Neither route gave a queue depth. Shows the kept route's failure (when it was asked) and
/// then, as its cause, the deprecated route's.
#[derive(Debug, thiserror::Error)]
#[error("{}", match first {
    Some(first) => format!("{}; the deprecated route failed too", crate::errors::chain(first)),
    None => "the deprecated queue-size route failed (this server has no GET /tasks/queue/size)".to_owned(),
})]
pub struct DepthError {
    /// The kept route's failure (`None`: not asked, it is missing on this server).
    pub first: Option<ConductorError>,
    /// The deprecated route's failure.
    #[source]
    pub second: ConductorError,
}

impl ConductorClient {
    /// The depth of `task_type`'s queue (`domain`'s, `domain:type`, with one) on whichever
    /// route this server has (see [`DepthRoutes`]); both take the name whole, commas and all.
    pub async fn queue_depth(
        &self,
        task_type: &str,
        domain: Option<&Domain>,
        routes: &DepthRoutes,
    ) -> Result<u64, DepthError> {
        use std::sync::atomic::Ordering;
        let first = if routes.size_missing.load(Ordering::Acquire) {
            None
        } else {
            match self.queue_size_in(task_type, domain).await {
                Ok(depth) => return Ok(depth),
                Err(e) => {
                    if matches!(e.status(), Some(404 | 405))
                        && !routes.size_missing.swap(true, Ordering::AcqRel)
                    {
                        tracing::info!(
                            task = task_type,
                            error = %crate::errors::DisplayChain(&e),
                            "this Conductor has no GET /tasks/queue/size; the queue depth is read \
                             from GET /tasks/queue/sizes from now on"
                        );
                    }
                    Some(e)
                }
            }
        };
        self.queue_sizes_in(task_type, domain)
            .await
            .map_err(|second| DepthError { first, second })
    }
}
