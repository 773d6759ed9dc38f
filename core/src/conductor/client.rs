//! A Conductor REST client for exactly what perago needs: the worker API (batch poll, update,
//! update-v2, get task), the TaskDef check, and, for `dev`, registering definitions and
//! running workflows. Every request has an explicit timeout; nothing here retries — callers
//! decide with [`ConductorError::is_retryable`] — except the one retry after the server
//! rejects the auth token (see [`Credentials`]).

use super::auth::{self, Credentials, CredentialsError, TokenOutage, TokenState};
use super::errors::ConductorError;
use crate::attempt::{PolledTask, TaskRef};
use crate::result::TaskResultBody;
use crate::url::encode_segment as segment;
use reqwest::header::HeaderValue;
use reqwest::{Method, StatusCode};
use serde_json::{Value, value::RawValue};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A task as a poll (or update-v2) returned it.
#[derive(Debug, Clone, PartialEq)]
pub enum Polled {
    /// The task, checked; its input kept as text.
    Task(PolledTask),
    /// A task whose JSON cannot be taken (nested deeper than Conductor allows, or broken):
    /// its ids, when they can be read, so it can be failed, and what is wrong.
    Undecodable {
        /// `taskId` and `workflowInstanceId`, if readable.
        ids: Option<TaskRef>,
        /// What the task says its type is, as far as it can be read.
        types: TaskTypes,
        /// What is wrong.
        problem: String,
    },
}

/// What a polled task says its type is: its `taskDefName` and its `taskType`, each when it
/// is there and not empty (a value that is no string is kept as its JSON text, so it can
/// match no name). For a SIMPLE task Conductor makes both the task definition's name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TaskTypes {
    /// `taskDefName`.
    pub task_def_name: Option<String>,
    /// `taskType`.
    pub task_type: Option<String>,
}

impl TaskTypes {
    /// The types named by a task's top-level fields.
    pub fn of(fields: &serde_json::Map<String, Value>) -> Self {
        let get = |field: &str| match fields.get(field) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.is_empty() => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => Some(other.to_string()),
        };
        Self {
            task_def_name: get("taskDefName"),
            task_type: get("taskType"),
        }
    }

    /// Whether the task is of type `name`: it names a type, and every name it gives is `name`.
    /// A task that names none cannot be told apart from another type's.
    pub fn is(&self, name: &str) -> bool {
        let names = [&self.task_def_name, &self.task_type];
        names.iter().any(|n| n.is_some())
            && names.iter().all(|n| n.as_deref().is_none_or(|n| n == name))
    }
}

impl fmt::Display for TaskTypes {
    /// `taskDefName "a", taskType "b"`, or what is missing.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.task_def_name, &self.task_type) {
            (None, None) => f.write_str("no taskDefName or taskType"),
            (Some(d), None) => write!(f, "taskDefName {d:?} and no taskType"),
            (None, Some(t)) => write!(f, "taskType {t:?} and no taskDefName"),
            (Some(d), Some(t)) => write!(f, "taskDefName {d:?}, taskType {t:?}"),
        }
    }
}

impl Polled {
    /// Decodes one task: checked whole as [`crate::json::from_str`] would parse it (the same
    /// errors), then split at its top level without parsing its input. The ids of an
    /// undecodable one are read by skipping every other field, which serde_json does without
    /// recursion.
    pub fn decode(text: &str) -> Self {
        Self::decode_with(text, PolledTask::split)
    }

    /// [`Polled::decode`] for the task at `range` of `text`, which it takes over: the input
    /// is moved within the buffer rather than copied into a new one.
    pub fn decode_owned(text: String, range: std::ops::Range<usize>) -> Self {
        if let Some(refused) = Self::refuse_non_object(&text[range.clone()]) {
            return refused;
        }
        match PolledTask::split_owned(text, range.clone()) {
            Ok(task) => Self::Task(task),
            Err((e, text)) => Self::undecodable(&text[range], &e),
        }
    }

    fn decode_with(
        text: &str,
        split: impl FnOnce(&str) -> Result<PolledTask, crate::json::JsonError>,
    ) -> Self {
        if let Some(refused) = Self::refuse_non_object(text) {
            return refused;
        }
        match split(text) {
            Ok(task) => Self::Task(task),
            Err(e) => Self::undecodable(text, &e),
        }
    }

    /// What a text that does not start as an object is: undecodable for the reason parsing
    /// gives, or not an object. `None` for an object (which the split checks).
    fn refuse_non_object(text: &str) -> Option<Self> {
        if crate::json::kind(text) == crate::json::Kind::Object {
            return None;
        }
        Some(match crate::json::check(text) {
            Ok(()) => Self::not_an_object(),
            Err(e) => Self::undecodable(text, &e),
        })
    }

    fn not_an_object() -> Self {
        Self::Undecodable {
            ids: None,
            types: TaskTypes::default(),
            problem: "a polled task is not a JSON object".to_owned(),
        }
    }

    fn undecodable(text: &str, e: &crate::json::JsonError) -> Self {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Ids {
            task_id: String,
            workflow_instance_id: String,
        }
        /// Read apart from the ids: a type that is not a string leaves the ids readable.
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Types {
            #[serde(default)]
            task_def_name: Option<String>,
            #[serde(default)]
            task_type: Option<String>,
        }
        let types = serde_json::from_str::<Types>(text)
            .map(|t| TaskTypes {
                task_def_name: t.task_def_name.filter(|s| !s.is_empty()),
                task_type: t.task_type.filter(|s| !s.is_empty()),
            })
            .unwrap_or_default();
        Self::Undecodable {
            ids: serde_json::from_str::<Ids>(text).ok().map(|ids| TaskRef {
                task_id: ids.task_id,
                workflow_instance_id: ids.workflow_instance_id,
            }),
            types,
            problem: e.to_string(),
        }
    }
}

/// A request body: a value to serialize, or a `TaskResult` written before.
#[derive(Debug, Clone, Copy)]
pub enum JsonBody<'a> {
    /// Serialized for the request.
    Value(&'a Value),
    /// Sent as it is.
    Result(&'a TaskResultBody),
}

impl<'a> From<&'a Value> for JsonBody<'a> {
    fn from(value: &'a Value) -> Self {
        Self::Value(value)
    }
}

impl<'a> From<&'a TaskResultBody> for JsonBody<'a> {
    fn from(body: &'a TaskResultBody) -> Self {
        Self::Result(body)
    }
}

/// The longest long-poll Conductor accepts (`timeout` > 5000 ms is a 400).
pub const MAX_LONG_POLL: Duration = Duration::from_millis(5000);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Kept of an error body for messages.
const MAX_ERROR_BODY: usize = 512;
/// Read of an error answer at most; the rest is not read (the connection is closed).
const MAX_ERROR_READ: usize = 64 << 10;
/// Conductor's largest payload, of a task's input or of its output (the default
/// `conductor.app.max{Task,Workflow}{Input,Output}PayloadSizeThreshold`, 10240 KB): above
/// it Conductor refuses the payload instead of sending it.
const MAX_PAYLOAD: usize = 10 << 20;
/// The most one task's JSON can legitimately take (a poll's element, update-v2's next task,
/// `GET /tasks/{id}`): its input and its output, each at Conductor's largest payload, and
/// 4 MiB for the rest (the workflow task with its definition and input parameters).
pub const MAX_TASK_ANSWER: usize = 2 * MAX_PAYLOAD + (4 << 20);
/// The most a TaskDef answer takes (its input template included).
const MAX_TASK_DEF_ANSWER: usize = 4 << 20;
/// The most a small answer takes: a token, queue sizes, a task or workflow id, an empty 200.
const MAX_SMALL_ANSWER: usize = 1 << 20;
/// The most a workflow with its tasks takes (`dev` only).
const MAX_WORKFLOW_ANSWER: usize = 256 << 20;

/// The most a batch poll for `count` tasks reads: that many tasks at [`MAX_TASK_ANSWER`],
/// and one more (Conductor can return more tasks than asked for, conductor-oss/conductor#369).
pub fn max_poll_answer(count: u32) -> usize {
    usize::try_from(count.max(1))
        .unwrap_or(usize::MAX)
        .saturating_add(1)
        .saturating_mul(MAX_TASK_ANSWER)
}
/// The auth header (Orkes): the bare token, no "Bearer".
const AUTH_HEADER: &str = "X-Authorization";
/// `CONDUCTOR_SERVER_URL`, as [`ConductorClient::from_lookup`] reads it.
const SERVER_URL_VAR: &str = "CONDUCTOR_SERVER_URL";

/// A base URL that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("CONDUCTOR_SERVER_URL {url:?} is invalid: {problem}")]
pub struct BaseUrlError {
    /// As given.
    pub url: String,
    /// Why.
    pub problem: &'static str,
}

/// Client configuration from the environment that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientConfigError {
    /// `CONDUCTOR_SERVER_URL` is missing or invalid.
    #[error(transparent)]
    Url(#[from] BaseUrlError),
    /// Only one of `CONDUCTOR_AUTH_KEY` and `CONDUCTOR_AUTH_SECRET` is set.
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
}

/// A client for one Conductor server. Clones share the connection pool and the auth token.
#[derive(Debug, Clone)]
pub struct ConductorClient {
    /// The connection pool, shared by clones; replaced (every pooled connection dropped)
    /// after an answer that leaves a connection out of step (see [`declares_a_body`]).
    http: Arc<std::sync::Mutex<reqwest::Client>>,
    /// The API base including `/api`, without a trailing `/`.
    base: String,
    /// `base` parsed once: each request's URL is this with its path extended, so the host
    /// is not parsed again (IDNA processing and all) for every request.
    base_parsed: Option<reqwest::Url>,
    /// Set when the client has credentials.
    auth: Option<Arc<Auth>>,
}

/// The credentials and the current token, shared by clones of a client.
struct Auth {
    credentials: Credentials,
    /// Held while a token is fetched, so concurrent requests wait for one fetch.
    state: tokio::sync::Mutex<TokenState>,
    /// Tokens fetched so far; a token's number tells a rejected token from a newer one.
    fetched: AtomicU64,
    /// Whether "no auth on this server" was logged.
    logged_disabled: AtomicBool,
    /// Whether the token endpoint's outage (a 404 after tokens were issued) was logged; reset
    /// when a token is fetched again, so each outage is logged once, at its start and end.
    logged_outage: AtomicBool,
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Auth")
            .field("credentials", &self.credentials)
            .field("tokens_fetched", &self.fetched.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl ConductorClient {
    /// A client without credentials for `base_url` (`CONDUCTOR_SERVER_URL`, which includes
    /// `/api`; a trailing `/` is ignored). `https://` verifies the server with the system's
    /// root certificates.
    pub fn new(base_url: &str) -> Result<Self, BaseUrlError> {
        Self::with_auth(base_url, None)
    }

    /// The client `CONDUCTOR_SERVER_URL`, `CONDUCTOR_AUTH_KEY` and `CONDUCTOR_AUTH_SECRET` as
    /// `lookup` answers them describe (see [`Credentials::from_lookup`]).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ClientConfigError> {
        let credentials = Credentials::from_lookup(&lookup)?;
        let url = lookup(SERVER_URL_VAR).unwrap_or_default();
        Ok(Self::with_auth(&url, credentials)?)
    }

    /// A client for `base_url` that, given credentials, authenticates as the Orkes servers
    /// require: a token from `POST {base}/token`, fetched before the first request and sent as
    /// `X-Authorization` on every request, refreshed before it expires and once more when the
    /// server rejects it (401/403 `EXPIRED_TOKEN`/`INVALID_TOKEN`, then the request is sent
    /// again once). A server whose `/token` answers 404 before it has issued any token
    /// (Conductor OSS) is used without auth until it refuses a request as unauthenticated;
    /// a 404 after a token was issued is an outage ([`ConductorError::TokenUnavailable`]).
    pub fn with_auth(
        base_url: &str,
        credentials: Option<Credentials>,
    ) -> Result<Self, BaseUrlError> {
        let err = |problem| BaseUrlError {
            url: base_url.to_owned(),
            problem,
        };
        let base = base_url.trim().trim_end_matches('/');
        let Some(rest) = base
            .strip_prefix("http://")
            .or_else(|| base.strip_prefix("https://"))
        else {
            return Err(err("expected an http:// or https:// URL including /api"));
        };
        if rest.is_empty() || rest.starts_with('/') {
            return Err(err("the URL has no host"));
        }
        let http = build_http(base).map_err(|_| err("cannot build an HTTP client"))?;
        let auth = credentials.map(|credentials| {
            Arc::new(Auth {
                credentials,
                state: tokio::sync::Mutex::new(TokenState::Unknown),
                fetched: AtomicU64::new(0),
                logged_disabled: AtomicBool::new(false),
                logged_outage: AtomicBool::new(false),
            })
        });
        Ok(Self {
            http: Arc::new(std::sync::Mutex::new(http)),
            base: base.to_owned(),
            base_parsed: reqwest::Url::parse(base).ok(),
            auth,
        })
    }

    /// Whether the client has credentials.
    pub fn has_credentials(&self) -> bool {
        self.auth.is_some()
    }

    /// Tokens fetched from `/token` so far (0 without credentials).
    pub fn tokens_fetched(&self) -> u64 {
        self.auth
            .as_ref()
            .map_or(0, |a| a.fetched.load(Ordering::Relaxed))
    }

    /// A request, authenticated when the client has credentials: with the current token, and
    /// once more with a fresh one when the server rejects it.
    pub(super) async fn send(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        payload: Option<JsonBody<'_>>,
        timeout: Duration,
        limit: usize,
    ) -> Result<(StatusCode, String), ConductorError> {
        let request = Request {
            path,
            query,
            body: payload,
            timeout,
            limit,
        };
        let Some(auth) = &self.auth else {
            return self.send_once(method, &request, None).await;
        };
        let Some((token, number)) = self.token(auth).await? else {
            let answer = self.send_once(method.clone(), &request, None).await;
            return match answer {
                // Taken to have no auth, the server asks for it: fetch a token, send again.
                Err(ConductorError::Status {
                    status, ref body, ..
                }) if auth::token_rejected(status, body)
                    && auth.state.lock().await.refused_without_token() =>
                {
                    tracing::warn!(
                        status,
                        path,
                        "Conductor, taken to have no auth, refused a request without a token; fetching one and retrying once"
                    );
                    let token = self.token(auth).await?.map(|(token, _)| token);
                    self.send_once(method, &request, token.as_ref()).await
                }
                other => other,
            };
        };
        let first = self.send_once(method.clone(), &request, Some(&token)).await;
        match first {
            Err(ConductorError::Status {
                status, ref body, ..
            }) if auth::token_rejected(status, body) => {
                tracing::info!(
                    status,
                    path,
                    "Conductor rejected the auth token; fetching a new one and retrying once"
                );
                {
                    let mut state = auth.state.lock().await;
                    if matches!(&*state, TokenState::Valid { generation, .. } if *generation == number)
                    {
                        *state = TokenState::Unknown;
                    }
                }
                let token = self.token(auth).await?.map(|(token, _)| token);
                self.send_once(method, &request, token.as_ref()).await
            }
            other => other,
        }
    }

    /// The token to send and its number: the current one, or a new one when there is none or
    /// it is due for refresh. `None` when the server has no `/token` route.
    async fn token(&self, auth: &Auth) -> Result<Option<(HeaderValue, u64)>, ConductorError> {
        let mut state = auth.state.lock().await;
        match &*state {
            TokenState::Disabled => return Ok(None),
            TokenState::Valid {
                token,
                refresh_at,
                generation,
            } if Instant::now() < *refresh_at => return Ok(Some((token.clone(), *generation))),
            _ => {}
        }
        let started = Instant::now();
        match self.fetch_token(&auth.credentials).await? {
            Some(token) => {
                let generation = auth.fetched.fetch_add(1, Ordering::Relaxed) + 1;
                if auth.logged_outage.swap(false, Ordering::Relaxed) {
                    tracing::info!(
                        generation,
                        "the Conductor token endpoint issues tokens again"
                    );
                }
                let refresh_in = auth::refresh_after(token.to_str().unwrap_or_default());
                tracing::debug!(
                    key_id = %auth.credentials.key_id,
                    generation,
                    refresh_in_s = refresh_in.as_secs_f64(),
                    "fetched a Conductor auth token"
                );
                *state = TokenState::Valid {
                    token: token.clone(),
                    refresh_at: started + refresh_in,
                    generation,
                };
                Ok(Some((token, generation)))
            }
            None => {
                let url = format!("{}/token", self.base);
                if let Err(TokenOutage) =
                    state.token_route_missing(auth.fetched.load(Ordering::Relaxed))
                {
                    if !auth.logged_outage.swap(true, Ordering::Relaxed) {
                        tracing::warn!(%url, "the Conductor token endpoint answered 404 after issuing tokens; taking it as an outage and retrying");
                    }
                    return Err(ConductorError::TokenUnavailable {
                        method: "POST",
                        url,
                    });
                }
                if !auth.logged_disabled.swap(true, Ordering::Relaxed) {
                    tracing::info!(
                        %url,
                        "Conductor has no /token route (no auth on this server); continuing without credentials"
                    );
                }
                Ok(None)
            }
        }
    }

    /// `POST /token` with the key: the token, as a header value marked sensitive (kept out of
    /// debug output), or `None` when the server has no such route.
    async fn fetch_token(
        &self,
        credentials: &Credentials,
    ) -> Result<Option<HeaderValue>, ConductorError> {
        let path = "/token";
        let body = serde_json::json!({
            "keyId": credentials.key_id,
            "keySecret": credentials.key_secret,
        });
        let request = Request {
            path,
            query: &[],
            body: Some((&body).into()),
            timeout: REQUEST_TIMEOUT,
            limit: MAX_SMALL_ANSWER,
        };
        let text = match self.send_once(Method::POST, &request, None).await {
            Ok((_, text)) => text,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(ConductorError::Status {
                method,
                url,
                status: status @ (401 | 403),
                body,
            }) => {
                return Err(ConductorError::Credentials {
                    method,
                    url,
                    status,
                    key_id: credentials.key_id.clone(),
                    body,
                });
            }
            Err(e) => return Err(e),
        };
        let decode_error = |message: &str| ConductorError::Decode {
            method: "POST",
            url: format!("{}{path}", self.base),
            message: message.to_owned(),
        };
        // The body holds the token: no part of it goes into an error.
        let value: Value = serde_json::from_str(&text)
            .map_err(|_| decode_error("the token answer is not JSON"))?;
        let token = match value.get("token").and_then(Value::as_str) {
            Some(token) if !token.trim().is_empty() => token.trim(),
            _ => {
                return Err(decode_error(
                    "expected {\"token\": \"...\"} from the token endpoint",
                ));
            }
        };
        let mut header = HeaderValue::from_str(token)
            .map_err(|_| decode_error("the token is not a valid header value"))?;
        header.set_sensitive(true);
        Ok(Some(header))
    }

    /// The API base URL.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// One request; `token`, if any, goes in `X-Authorization`. The answer is read as it
    /// comes, up to the request's limit: one declared or found larger is refused
    /// ([`ConductorError::TooLarge`]) without reading the rest, so a server that lies about
    /// its `Content-Length`, or sends none, cannot make the client hold more.
    async fn send_once(
        &self,
        method: Method,
        request: &Request<'_, '_>,
        token: Option<&HeaderValue>,
    ) -> Result<(StatusCode, String), ConductorError> {
        let Request {
            path,
            query,
            body,
            timeout,
            limit,
        } = *request;
        let url = format!("{}{path}", self.base);
        let method_name = match method {
            Method::GET => "GET",
            Method::POST => "POST",
            Method::PUT => "PUT",
            Method::DELETE => "DELETE",
            _ => "HTTP",
        };
        let http = self.http();
        let mut req = match &self.base_parsed {
            Some(base) => http.request(method, request_url(base, path)),
            None => http.request(method, &url),
        }
        .timeout(timeout);
        if !query.is_empty() {
            req = req.query(query);
        }
        match body {
            None => {}
            Some(JsonBody::Value(value)) => req = req.json(value),
            // Written once; a retry sends the same bytes again, uncopied.
            Some(JsonBody::Result(body)) => {
                req = req
                    .header(
                        reqwest::header::CONTENT_TYPE,
                        HeaderValue::from_static("application/json"),
                    )
                    .body(body.to_bytes());
            }
        }
        if let Some(token) = token {
            req = req.header(AUTH_HEADER, token.clone());
        }
        let transport = |source| ConductorError::Transport {
            method: method_name,
            url: url.clone(),
            source,
        };
        let resp = req.send().await.map_err(transport)?;
        let status = resp.status();
        if declares_a_body(status, resp.headers()) {
            // HTTP gives a 204 no body, so what the server sent as one is still on the
            // connection, where it would be read as the answer to the next request: the
            // pool (that connection with it) is dropped before any other request is sent.
            tracing::warn!(
                %url,
                "Conductor answered 204 No Content declaring a body; dropping every pooled connection so none reads it as the next answer"
            );
            self.renew_pool();
        }
        let failed = status.is_client_error() || status.is_server_error();
        let (bytes, complete) = read_capped(resp, if failed { MAX_ERROR_READ } else { limit })
            .await
            .map_err(transport)?;
        if !complete && !failed {
            return Err(ConductorError::TooLarge {
                method: method_name,
                url,
                status: status.as_u16(),
                limit,
            });
        }
        // UTF-8 checked in one fast pass; `text()` would decode through a lossy converter
        // (charset sniffing, chunk by chunk), which costs milliseconds on a megabyte.
        let text = match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        };
        if failed {
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

    /// The connection pool now (a cheap handle).
    fn http(&self) -> reqwest::Client {
        self.http
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Replaces the connection pool with a new, empty one; requests under way keep the old
    /// one until they end, then it is dropped with its connections.
    fn renew_pool(&self) {
        match build_http(&self.base) {
            Ok(http) => {
                *self
                    .http
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = http;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot build a new HTTP client; keeping the old one")
            }
        }
    }

    pub(super) fn decode(
        method: &'static str,
        path: &str,
        base: &str,
        text: &str,
    ) -> Result<Value, ConductorError> {
        crate::json::from_str(text).map_err(|e| ConductorError::Decode {
            method,
            url: format!("{base}{path}"),
            message: format!("invalid JSON: {e}"),
        })
    }

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

    /// `GET /tasks/poll/batch/{type}`: up to `count` tasks, waiting up to `wait` (capped at
    /// 5 s) for them. Empty (`200 []`, 204 or an empty body) is an empty list.
    pub async fn batch_poll(
        &self,
        task_type: &str,
        worker_id: &str,
        count: u32,
        wait: Duration,
    ) -> Result<Vec<Polled>, ConductorError> {
        let wait = wait.min(MAX_LONG_POLL);
        let path = format!("/tasks/poll/batch/{}", segment(task_type));
        let query = [
            ("workerid", worker_id.to_owned()),
            ("count", count.max(1).to_string()),
            ("timeout", wait.as_millis().to_string()),
        ];
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
                message: format!("expected a JSON array of tasks: {e}"),
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
        let path = "/tasks/queue/size";
        let query = [("taskType", task_type.to_owned())];
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
                tracing::warn!(error = %e, "the update was applied; its answer is not read");
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
                    problem: e.to_string(),
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

/// One request's parts.
#[derive(Clone, Copy)]
struct Request<'a, 'q> {
    path: &'a str,
    query: &'a [(&'q str, String)],
    body: Option<JsonBody<'a>>,
    timeout: Duration,
    /// The most of a successful answer that is read.
    limit: usize,
}

/// The HTTP client of a Conductor client for `base`.
fn build_http(base: &str) -> Result<reqwest::Client, reqwest::Error> {
    crate::http::client_builder(base)
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(REQUEST_TIMEOUT)
        .pool_max_idle_per_host(16)
        .build()
}

/// Whether an answer that has no body by HTTP's rules (204) declares one anyway
/// (`Content-Length` other than 0, or `Transfer-Encoding`): the bytes the server sends as
/// its body are left on the connection.
fn declares_a_body(status: StatusCode, headers: &reqwest::header::HeaderMap) -> bool {
    status == StatusCode::NO_CONTENT
        && (headers.contains_key(reqwest::header::TRANSFER_ENCODING)
            || headers
                .get_all(reqwest::header::CONTENT_LENGTH)
                .iter()
                .any(|v| v.as_bytes().iter().any(|&b| b != b'0')))
}

/// Reads an answer's body as it comes, at most `limit` bytes: the bytes, and whether that is
/// all of it. An answer whose `Content-Length` is above `limit` is not read at all; nothing
/// is allocated from what the server declares.
pub(super) async fn read_capped(
    mut resp: reqwest::Response,
    limit: usize,
) -> Result<(Vec<u8>, bool), reqwest::Error> {
    if resp
        .content_length()
        .is_some_and(|len| len > u64::try_from(limit).unwrap_or(u64::MAX))
    {
        return Ok((Vec::new(), false));
    }
    let mut bytes = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        if chunk.len() > limit - bytes.len() {
            let room = limit - bytes.len();
            bytes.extend_from_slice(&chunk[..room]);
            return Ok((bytes, false));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok((bytes, true))
}

/// `base` (parsed) with `path` (its segments already percent-encoded) appended to its path:
/// the URL `{base}{path}` would parse to, without parsing the host again.
fn request_url(base: &reqwest::Url, path: &str) -> reqwest::Url {
    let mut url = base.clone();
    url.set_path(&format!("{}{path}", base.path().trim_end_matches('/')));
    url
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::{TcpListener, TcpStream};

    /// Reads one request (head and `Content-Length` body) from `conn`; `None` at EOF.
    async fn read_request(conn: &mut TcpStream) -> Option<String> {
        let mut buf = Vec::new();
        let mut byte = [0u8; 1];
        while !buf.ends_with(b"\r\n\r\n") {
            if conn.read(&mut byte).await.ok()? == 0 {
                return None;
            }
            buf.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&buf).into_owned();
        let len = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse::<usize>().ok())?
            })
            .unwrap_or(0);
        let mut body = vec![0u8; len];
        conn.read_exact(&mut body).await.ok()?;
        Some(head.lines().next().unwrap_or_default().to_owned())
    }

    /// A raw loopback HTTP server: each connection's requests are answered in turn by
    /// `answer(request_line, n)`, `n` counting requests over all connections; the raw bytes
    /// are written as they are. Returns the base URL.
    async fn raw_server(answer: impl Fn(&str, usize) -> Vec<u8> + Send + Sync + 'static) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let answer = Arc::new(answer);
        let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let answer = Arc::clone(&answer);
                let count = Arc::clone(&count);
                tokio::spawn(async move {
                    while let Some(line) = read_request(&mut conn).await {
                        let n = count.fetch_add(1, Ordering::SeqCst);
                        let out = answer(&line, n);
                        // The head first, the rest a moment later (as its own segment): the
                        // client has the whole answer the head announces before the rest.
                        let split = out
                            .windows(4)
                            .position(|w| w == b"\r\n\r\n")
                            .map_or(out.len(), |at| at + 4);
                        if conn.write_all(&out[..split]).await.is_err() {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        if conn.write_all(&out[split..]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        format!("http://{addr}/api")
    }

    fn response(status: &str, body: &str) -> Vec<u8> {
        format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }

    /// A 204 that carries a body (which HTTP forbids) must not leave that body on the
    /// connection to be read as the answer to the next request: here the body is a whole
    /// forged answer with a task in it.
    #[tokio::test]
    async fn a_204_with_a_body_does_not_desynchronise_the_next_answer() {
        let forged = response(
            "200 OK",
            r#"[{"taskId":"forged","workflowInstanceId":"wf","taskType":"t"}]"#,
        );
        let base = raw_server(move |line, _| {
            if line.starts_with("POST") {
                let mut out = format!(
                    "HTTP/1.1 204 No Content\r\nContent-Length: {}\r\n\r\n",
                    forged.len()
                )
                .into_bytes();
                out.extend_from_slice(&forged);
                out
            } else {
                response("200 OK", "[]")
            }
        })
        .await;
        let client = ConductorClient::new(&base).unwrap();
        for _ in 0..20 {
            let next = client
                .update_task_v2(&json_result())
                .await
                .expect("a 204 is no next task");
            assert_eq!(next, None);
            let polled = client
                .batch_poll("t", "w", 1, Duration::from_millis(1))
                .await;
            assert!(
                matches!(&polled, Ok(tasks) if tasks.is_empty()),
                "the poll read the forged answer: {polled:?}"
            );
        }
    }

    /// A loopback server that answers every request with `head` and then, unless `head`
    /// has a `Content-Length`, an endless chunked body of `[`; returns the base URL and how
    /// many body bytes it managed to write.
    async fn flooding_server(head: &'static str) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let written = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let total = Arc::clone(&written);
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let written = Arc::clone(&total);
                tokio::spawn(async move {
                    if read_request(&mut conn).await.is_some() {
                        if conn.write_all(head.as_bytes()).await.is_err() {
                            return;
                        }
                        let chunk = format!("{:x}\r\n{}\r\n", 64 << 10, "[".repeat(64 << 10));
                        loop {
                            if conn.write_all(chunk.as_bytes()).await.is_err() {
                                return;
                            }
                            written.fetch_add(64 << 10, Ordering::SeqCst);
                        }
                    }
                });
            }
        });
        (format!("http://{addr}/api"), written)
    }

    /// Issue #24, item 7: the deprecated `/tasks/queue/sizes` gets the name twice, so a
    /// Spring server binds it whole (a single `taskType=x,y` is split into `x` and `y`), and
    /// an answer without the name's key is an error, not a count.
    #[tokio::test]
    async fn queue_sizes_sends_the_name_so_that_spring_does_not_split_it() {
        let base = raw_server(|line, n| {
            let whole = "GET /api/tasks/queue/sizes?taskType=x%2Cy&taskType=x%2Cy HTTP/1.1";
            match (n, line == whole) {
                (0, true) => response("200 OK", r#"{"x,y": 3}"#),
                // What Spring answers to a single `taskType=x,y`.
                (1, true) => response("200 OK", r#"{"x": 1, "y": 2}"#),
                _ => response("400 Bad Request", &format!("{line:?}")),
            }
        })
        .await;
        let client = ConductorClient::new(&base).unwrap();
        assert_eq!(client.queue_sizes("x,y").await.unwrap(), 3);
        let err = client.queue_sizes("x,y").await.unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "GET {base}/tasks/queue/sizes: unexpected response: expected {{\"x,y\": <count>}}"
            )
        );
    }

    /// An answer without `Content-Length` that never ends is read up to the request's
    /// limit and refused, naming the request and the limit; the server is cut off there.
    #[tokio::test]
    async fn an_endless_answer_is_refused_at_its_limit() {
        let (base, written) = flooding_server(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
        )
        .await;
        let client = ConductorClient::new(&base).unwrap();
        let err = client.queue_sizes("t").await.unwrap_err();
        assert!(
            matches!(err, ConductorError::TooLarge { limit, .. } if limit == MAX_SMALL_ANSWER),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            format!(
                "GET {base}/tasks/queue/sizes: HTTP 200: the answer is larger than 1048576 bytes, the most read for this request; refused"
            )
        );
        assert!(err.is_retryable());
        let err = client
            .batch_poll("t", "w", 1, Duration::from_millis(1))
            .await
            .unwrap_err();
        assert!(
            matches!(err, ConductorError::TooLarge { limit, .. } if limit == max_poll_answer(1)),
            "{err:?}"
        );
        // What the server wrote past the limit is what the sockets buffered, no more.
        let sent = written.load(Ordering::SeqCst);
        assert!(
            sent < MAX_SMALL_ANSWER + max_poll_answer(1) + (32 << 20),
            "the server wrote {sent} bytes"
        );
        // An update-v2 whose next task is too large was applied: no error, an undecodable
        // next task naming the limit.
        match client.update_task_v2(&json_result()).await {
            Ok(Some(Polled::Undecodable {
                ids: None, problem, ..
            })) => {
                assert!(problem.contains(&MAX_TASK_ANSWER.to_string()), "{problem}");
            }
            other => panic!("{other:?}"),
        }
        client
            .update_task(&json_result())
            .await
            .expect("a v1 update was applied");
    }

    /// An answer declaring a length above the limit is refused before any of it is read.
    #[tokio::test]
    async fn an_answer_declared_too_large_is_refused_unread() {
        let (base, _) = flooding_server(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1073741824\r\n\r\n",
        )
        .await;
        let client = ConductorClient::new(&base).unwrap();
        let started = Instant::now();
        for _ in 0..3 {
            let err = client.get_task("t-1").await.unwrap_err();
            assert!(
                matches!(err, ConductorError::TooLarge { limit, .. } if limit == MAX_TASK_ANSWER),
                "{err:?}"
            );
        }
        assert!(started.elapsed() < Duration::from_secs(5));
        // An error answer is cut short, not refused: its status is what counts.
        let (base, _) = flooding_server(
            "HTTP/1.1 500 Internal Server Error\r\nTransfer-Encoding: chunked\r\n\r\n",
        )
        .await;
        let err = ConductorClient::new(&base)
            .unwrap()
            .get_task("t-1")
            .await
            .unwrap_err();
        match &err {
            ConductorError::Status {
                status: 500, body, ..
            } => {
                assert!(
                    body.len() <= MAX_ERROR_BODY + '…'.len_utf8(),
                    "{}",
                    body.len()
                );
            }
            other => panic!("{other:?}"),
        }
    }

    /// Only an object named as the task is its TaskDef; `null`, `[]` or another task's
    /// TaskDef are errors saying what came (before, each counted as registered).
    #[tokio::test]
    async fn only_an_object_with_the_tasks_name_is_its_task_def() {
        let answers = [
            (r#"{"name": "t", "retryCount": 0}"#, None),
            ("null", Some("got null")),
            ("[]", Some("got an array")),
            (r#"[{"name": "t"}]"#, Some("got an array")),
            (
                r#"{"name": "other"}"#,
                Some(r#"got the TaskDef of "other""#),
            ),
            (r#"{"name": 5}"#, Some("got an object whose name is 5")),
            ("{}", Some("got an object without a name")),
            (r#""t""#, Some(r#"got "t""#)),
        ];
        let base = raw_server(move |_, n| response("200 OK", answers[n % answers.len()].0)).await;
        let client = ConductorClient::new(&base).unwrap();
        for (answer, problem) in answers {
            let got = client.get_task_def("t").await;
            match problem {
                None => assert_eq!(got.unwrap().unwrap()["name"], "t"),
                Some(problem) => {
                    let err = got.unwrap_err();
                    assert_eq!(
                        err.to_string(),
                        format!(
                            "GET {base}/metadata/taskdefs/t: unexpected response: expected the TaskDef of \"t\", {problem}"
                        ),
                        "{answer}"
                    );
                    assert!(!err.is_retryable());
                }
            }
        }
    }

    #[test]
    fn poll_limits_grow_with_the_count_and_saturate() {
        assert_eq!(max_poll_answer(0), 2 * MAX_TASK_ANSWER);
        assert_eq!(max_poll_answer(1), 2 * MAX_TASK_ANSWER);
        assert_eq!(max_poll_answer(4), 5 * MAX_TASK_ANSWER);
        assert_eq!(
            max_poll_answer(u32::MAX),
            (usize::try_from(u32::MAX).unwrap() + 1).saturating_mul(MAX_TASK_ANSWER)
        );
    }

    fn json_result() -> Value {
        serde_json::json!({"taskId": "t-1", "workflowInstanceId": "wf-1", "status": "COMPLETED"})
    }

    #[test]
    fn request_urls_are_what_parsing_the_whole_text_gives() {
        for base in [
            "http://127.0.0.1:8080/api",
            "https://conductor.example.com/api",
            "http://host:1",
            "http://bücher.example/prefix/api",
        ] {
            let parsed = reqwest::Url::parse(base).unwrap();
            for path in [
                "/tasks/update-v2",
                "/tasks/poll/batch/a%20b%2Fc",
                &format!("/tasks/{}", segment("id with spaces/and?query#frag")),
                "/tasks/queue/sizes",
            ] {
                assert_eq!(
                    request_url(&parsed, path),
                    reqwest::Url::parse(&format!("{base}{path}")).unwrap(),
                    "{base} + {path}"
                );
            }
        }
    }

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
            "CONDUCTOR_SERVER_URL \"localhost:8080\" is invalid: expected an http:// or https:// URL including /api"
        );
        assert!(ConductorClient::new("http:///api").is_err());
        assert!(ConductorClient::new("https:///api").is_err());
        assert_eq!(
            ConductorClient::new("https://conductor.example.com/api")
                .unwrap()
                .base_url(),
            "https://conductor.example.com/api"
        );
    }

    #[test]
    fn from_lookup() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let client = ConductorClient::from_lookup(vars(&[(
            "CONDUCTOR_SERVER_URL",
            "http://127.0.0.1:1/api",
        )]))
        .unwrap();
        assert!(!client.has_credentials());
        let client = ConductorClient::from_lookup(vars(&[
            ("CONDUCTOR_SERVER_URL", "https://c.example.com/api"),
            ("CONDUCTOR_AUTH_KEY", "id"),
            ("CONDUCTOR_AUTH_SECRET", "s3cret"),
        ]))
        .unwrap();
        assert!(client.has_credentials());
        let debug = format!("{client:?}");
        assert!(
            debug.contains("\"id\"") && !debug.contains("s3cret"),
            "{debug}"
        );
        let err = ConductorClient::from_lookup(vars(&[
            ("CONDUCTOR_SERVER_URL", "http://127.0.0.1:1/api"),
            ("CONDUCTOR_AUTH_SECRET", "s3cret"),
        ]))
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "CONDUCTOR_AUTH_SECRET is set but CONDUCTOR_AUTH_KEY is not: set both to authenticate, or neither"
        );
        assert!(matches!(
            ConductorClient::from_lookup(vars(&[])),
            Err(ClientConfigError::Url(_))
        ));
    }

    /// A polled task is refused with the errors parsing it gives (depth, syntax, numbers),
    /// its ids read when they can be.
    #[test]
    fn polled_tasks_are_checked_as_parsing_checks_them() {
        let task = |input: &str| {
            format!(
                r#"{{"taskId": "t-1", "workflowInstanceId": "wf-1", "inputData": {{"params": {input}}}}}"#
            )
        };
        let ids = Some(TaskRef {
            task_id: "t-1".into(),
            workflow_instance_id: "wf-1".into(),
        });
        for input in [
            format!("{}1{}", "[".repeat(1000), "]".repeat(1000)),
            "1e400".to_owned(),
            r#""\ud800""#.to_owned(),
        ] {
            let text = task(&input);
            assert_eq!(
                Polled::decode(&text),
                Polled::Undecodable {
                    ids: ids.clone(),
                    types: TaskTypes::default(),
                    problem: crate::json::from_str(&text).unwrap_err().to_string(),
                },
                "{}",
                &text[..text.len().min(80)]
            );
        }
        assert!(matches!(
            Polled::decode(&task("[1,")),
            Polled::Undecodable { ids: None, .. }
        ));
        // Broken anywhere, not only in the input: the error parsing gives.
        for text in [
            format!("{} x", task("{}")),
            format!("{}}}", task("{}")),
            r#"{"taskId": "t", "seq": 1e400, "inputData": {}}"#.to_owned(),
            r#"{"taskId": "t", "seq": [1,], "inputData": {}}"#.to_owned(),
            r#"{"taskId": "t", "seq": 1 2, "inputData": {}}"#.to_owned(),
            r#"{"taskId": "t",, "inputData": {}}"#.to_owned(),
            r#"{"taskId": "t", "inputData": {},}"#.to_owned(),
            r#"{"taskId" "t"}"#.to_owned(),
            r#"{"taskId": "t", "inputData": }"#.to_owned(),
            r#"{"taskId": "t", "inputData": {"a": "\ud800"}}"#.to_owned(),
            "{\"task\tId\": \"t\"}".to_owned(),
            r#"{"task\qId": "t"}"#.to_owned(),
            r#"{"taskId": "t", "x": "unterminated}"#.to_owned(),
            r#"{"taskId": "t"]"#.to_owned(),
            "{".to_owned(),
            " ".to_owned(),
        ] {
            let expected = crate::json::from_str(&text).unwrap_err().to_string();
            match Polled::decode(&text) {
                Polled::Undecodable { problem, .. } => assert_eq!(problem, expected, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
            match Polled::decode_owned(text.clone(), 0..text.len()) {
                Polled::Undecodable { problem, .. } => assert_eq!(problem, expected, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
        assert_eq!(
            Polled::decode("[1]"),
            Polled::Undecodable {
                ids: None,
                types: TaskTypes::default(),
                problem: "a polled task is not a JSON object".to_owned(),
            }
        );
        // Taking the buffer over answers the same, for a task anywhere in it.
        for input in ["{\"n\": 1.50}", "1e400", "[1,", "{}"] {
            let text = task(input);
            let framed = format!("[ {text} ]");
            assert_eq!(
                Polled::decode_owned(framed.clone(), 2..2 + text.len()),
                Polled::decode(&text),
                "{text}"
            );
            assert_eq!(
                Polled::decode_owned(text.clone(), 0..text.len()),
                Polled::decode(&text)
            );
        }
        assert_eq!(
            Polled::decode_owned("[[1]]".to_owned(), 1..4),
            Polled::decode("[1]")
        );
        let Polled::Task(ok) = Polled::decode(&task("{\"n\": 1.50}")) else {
            panic!("a good task is decoded");
        };
        assert_eq!(ok.fields["taskId"], "t-1");
        assert_eq!(
            ok.input_data.unwrap().as_str(),
            r#"{"params": {"n": 1.50}}"#
        );
    }
}
