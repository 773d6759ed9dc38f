//! Orkes-style authentication, off unless asked for: `POST /api/token` trades the configured
//! key id and secret for a JWT-shaped token, and every other `/api/...` route but health wants
//! it in `X-Authorization` (no "Bearer"). A missing or unknown token is a 401 with `error`
//! `INVALID_TOKEN`; one past its `exp` claim is a 401 with `EXPIRED_TOKEN`.
//!
//! Tokens are random and remembered by the server (the signature part is not a real
//! signature); their `exp` claim, in whole seconds, is also when the server stops accepting
//! them, so a client that reads `exp` agrees with the server about expiry.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};

use super::error::INSTANCE;

/// The header carrying the token.
pub const AUTH_HEADER: &str = "X-Authorization";
/// Token lifetime unless set: one hour.
pub const DEFAULT_TOKEN_TTL: Duration = Duration::from_secs(3600);
/// Expired tokens are remembered this long (then they are merely unknown: `INVALID_TOKEN`).
const KEEP_EXPIRED: Duration = Duration::from_secs(3600);

/// The auth settings and the tokens issued.
pub(crate) struct AuthState {
    key_id: String,
    key_secret: String,
    ttl: Duration,
    /// Tokens are random strings without claims, so clients cannot know when they expire.
    opaque: bool,
    /// Token → `exp` (seconds since the epoch).
    tokens: Mutex<HashMap<String, u64>>,
    issued: AtomicU64,
    /// Requests refused for a missing, unknown or expired token.
    refused: AtomicU64,
}

impl std::fmt::Debug for AuthState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthState")
            .field("key_id", &self.key_id)
            .field("ttl", &self.ttl)
            .field("issued", &self.issued.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

impl AuthState {
    pub(crate) fn new(key_id: String, key_secret: String, ttl: Duration, opaque: bool) -> Self {
        Self {
            key_id,
            key_secret,
            ttl,
            opaque,
            tokens: Mutex::new(HashMap::new()),
            issued: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    /// Tokens issued so far.
    pub(crate) fn issued(&self) -> u64 {
        self.issued.load(Ordering::Relaxed)
    }

    /// Requests refused for their token so far.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Forgets every token: the next request with one is a 401 `INVALID_TOKEN`.
    pub(crate) fn revoke_all(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        self.tokens
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A new token for the key, valid until `exp` = now + ttl rounded up to a second.
    fn issue(&self) -> String {
        let now = now_secs();
        let exp = (now + self.ttl.as_secs_f64()).ceil() as u64;
        let token = if self.opaque {
            uuid::Uuid::new_v4().simple().to_string()
        } else {
            self.jwt(now, exp)
        };
        let mut tokens = self.lock();
        let forget_before = now - KEEP_EXPIRED.as_secs_f64();
        tokens.retain(|_, exp| *exp as f64 > forget_before);
        tokens.insert(token.clone(), exp);
        drop(tokens);
        self.issued.fetch_add(1, Ordering::Relaxed);
        token
    }

    /// A JWT-shaped token with `sub`, `iat`, `exp` and `jti` claims and a random signature.
    fn jwt(&self, now: f64, exp: u64) -> String {
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
        let claims = json!({
            "sub": self.key_id,
            "iat": now.floor() as u64,
            "exp": exp,
            "jti": uuid::Uuid::new_v4().to_string(),
        });
        let payload = URL_SAFE_NO_PAD.encode(claims.to_string());
        let signature = URL_SAFE_NO_PAD.encode(uuid::Uuid::new_v4().as_bytes());
        format!("{header}.{payload}.{signature}")
    }

    /// `None` when `token` is accepted, else the `error` code.
    fn check(&self, token: Option<&str>) -> Option<&'static str> {
        let exp = token.and_then(|t| self.lock().get(t.trim()).copied());
        match exp {
            None => Some("INVALID_TOKEN"),
            Some(exp) if now_secs() >= exp as f64 => Some("EXPIRED_TOKEN"),
            Some(_) => None,
        }
    }
}

fn unauthorized(error: &str, message: &str) -> Response {
    let body = json!({
        "status": 401,
        "error": error,
        "message": message,
        "instance": INSTANCE,
        "retryable": false,
    });
    (StatusCode::UNAUTHORIZED, Json(body)).into_response()
}

/// `POST /api/token` with `{"keyId", "keySecret"}`.
pub(crate) async fn token(State(auth): State<Arc<AuthState>>, body: Bytes) -> Response {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let field = |name: &str| request.get(name).and_then(Value::as_str);
    let (Some(key_id), Some(key_secret)) = (field("keyId"), field("keySecret")) else {
        let body = json!({
            "status": 400,
            "message": "expected {\"keyId\": \"...\", \"keySecret\": \"...\"}",
            "instance": INSTANCE,
            "retryable": false,
        });
        return (StatusCode::BAD_REQUEST, Json(body)).into_response();
    };
    if key_id != auth.key_id || key_secret != auth.key_secret {
        tracing::info!(key_id, "token refused: unknown key id or wrong secret");
        return unauthorized("INVALID_CREDENTIALS", "Invalid key id or secret");
    }
    let token = auth.issue();
    tracing::debug!(key_id, "token issued");
    Json(json!({ "token": token })).into_response()
}

/// Lets through health, the token route and anything outside `/api/`; everything else needs a
/// valid token.
pub(crate) async fn require(
    State(auth): State<Arc<AuthState>>,
    request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path();
    if !path.starts_with("/api/") || path == "/api/health" || path == "/api/token" {
        return next.run(request).await;
    }
    let token = request
        .headers()
        .get(AUTH_HEADER)
        .and_then(|v| v.to_str().ok());
    match auth.check(token) {
        None => next.run(request).await,
        Some(error) => {
            let message = match (error, token) {
                (_, None) => "Missing X-Authorization header",
                ("EXPIRED_TOKEN", _) => "Token is expired",
                _ => "Token is invalid",
            };
            auth.refused.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(path, error, "request refused");
            unauthorized(error, message)
        }
    }
}
