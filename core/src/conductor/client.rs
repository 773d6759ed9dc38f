//! A Conductor REST client for exactly what perago needs: the worker API (batch poll, update,
//! update-v2, get task), the TaskDef check, and, for `dev`, registering definitions and
//! running workflows. Every request has an explicit timeout; nothing here retries — callers
//! decide with [`ConductorError::is_retryable`] — except the one retry after the server
//! rejects the auth token (see [`Credentials`]).

use super::auth::{self, Credentials, CredentialsError, TokenOutage, TokenState};
use super::errors::ConductorError;
use crate::result::TaskResultBody;
use reqwest::header::HeaderValue;
use reqwest::{Method, StatusCode};
use serde_json::Value;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

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
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Kept of an error body for messages.
pub(super) const MAX_ERROR_BODY: usize = 512;
/// Read of an error answer at most; the rest is not read (the connection is closed).
pub(super) const MAX_ERROR_READ: usize = 64 << 10;
/// Conductor's largest payload, of a task's input or of its output (the default
/// `conductor.app.max{Task,Workflow}{Input,Output}PayloadSizeThreshold`, 10240 KB): above
/// it Conductor refuses the payload instead of sending it.
pub(super) const MAX_PAYLOAD: usize = 10 << 20;
/// The most one task's JSON can legitimately take (a poll's element, update-v2's next task,
/// `GET /tasks/{id}`): its input and its output, each at Conductor's largest payload, and
/// 4 MiB for the rest (the workflow task with its definition and input parameters).
pub const MAX_TASK_ANSWER: usize = 2 * MAX_PAYLOAD + (4 << 20);
/// The most a TaskDef answer takes (its input template included).
pub(super) const MAX_TASK_DEF_ANSWER: usize = 4 << 20;
/// The most a small answer takes: a token, queue sizes, a task or workflow id, an empty 200.
pub(super) const MAX_SMALL_ANSWER: usize = 1 << 20;
/// The most a workflow with its tasks takes (`dev` only).
pub(super) const MAX_WORKFLOW_ANSWER: usize = 256 << 20;

/// The most a batch poll for `count` tasks reads: that many tasks at [`MAX_TASK_ANSWER`],
/// and one more (Conductor can return more tasks than asked for, conductor-oss/conductor#369).
pub fn max_poll_answer(count: u32) -> usize {
    usize::try_from(count.max(1))
        .unwrap_or(usize::MAX)
        .saturating_add(1)
        .saturating_mul(MAX_TASK_ANSWER)
}
/// The auth header (Orkes): the bare token, no "Bearer".
pub(super) const AUTH_HEADER: &str = "X-Authorization";
/// `CONDUCTOR_SERVER_URL`, as [`ConductorClient::from_lookup`] reads it.
pub(super) const SERVER_URL_VAR: &str = "CONDUCTOR_SERVER_URL";

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
    pub(super) base: String,
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
                tracing::warn!(error = %crate::errors::DisplayChain(&e), "cannot build a new HTTP client; keeping the old one")
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
            message: format!("invalid JSON: {}", crate::errors::DisplayChain(&e)),
        })
    }
}

/// One request's parts.
#[derive(Clone, Copy)]
pub(super) struct Request<'a, 'q> {
    pub(super) path: &'a str,
    pub(super) query: &'a [(&'q str, String)],
    pub(super) body: Option<JsonBody<'a>>,
    pub(super) timeout: Duration,
    /// The most of a successful answer that is read.
    pub(super) limit: usize,
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
/// is allocated from what the server declares. The chunks are copied into one buffer as they
/// come: kept as they came, a server sending one-byte chunks would make the list of them (and
/// the read buffers each keeps alive) many times the cap.
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
mod tests;
