//! Orkes-style Conductor authentication: a key id and secret traded at `POST /token` for a JWT
//! sent as `X-Authorization` (no "Bearer"). The token is fetched lazily, refreshed before its
//! `exp` claim (or after 45 minutes without one, as the Python SDK does), and once more when
//! the server rejects it. A server without `/token` (404, Conductor OSS) runs without auth, as
//! the SDKs take it, but only when that is the first answer `/token` gives: once it has issued
//! a token, a 404 is an outage (a proxy answering for a restarting server), retried. And a
//! server taken to have no auth that refuses a request as unauthenticated has auth after all:
//! a token is fetched then.
//!
//! Neither the secret nor the token is ever logged or printed by `Debug`.

use std::fmt;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use reqwest::header::HeaderValue;
use serde_json::Value;

/// `CONDUCTOR_AUTH_KEY`: the application key id.
pub const AUTH_KEY_VAR: &str = "CONDUCTOR_AUTH_KEY";
/// `CONDUCTOR_AUTH_SECRET`: the application key secret.
pub const AUTH_SECRET_VAR: &str = "CONDUCTOR_AUTH_SECRET";

/// Token lifetime assumed when the token has no readable `exp` claim (Python's
/// `auth_token_ttl_min`).
pub(crate) const FALLBACK_TOKEN_TTL: Duration = Duration::from_secs(45 * 60);
/// Refresh this long before `exp` at most (less for short-lived tokens: a tenth of their life).
const MAX_REFRESH_MARGIN: Duration = Duration::from_secs(60);

/// An application key for a Conductor server that requires authentication.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The key id (`CONDUCTOR_AUTH_KEY`); not secret.
    pub key_id: String,
    /// The key secret (`CONDUCTOR_AUTH_SECRET`); never logged.
    pub key_secret: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("key_id", &self.key_id)
            .field("key_secret", &"<redacted>")
            .finish()
    }
}

/// Only one of the two credential variables is set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{set} is set but {missing} is not: set both to authenticate, or neither")]
pub struct CredentialsError {
    /// The variable that is set.
    pub set: &'static str,
    /// The variable that is missing.
    pub missing: &'static str,
}

impl Credentials {
    /// A key id and secret.
    pub fn new(key_id: impl Into<String>, key_secret: impl Into<String>) -> Self {
        Self {
            key_id: key_id.into(),
            key_secret: key_secret.into(),
        }
    }

    /// The credentials named by `CONDUCTOR_AUTH_KEY` and `CONDUCTOR_AUTH_SECRET` as `lookup`
    /// answers them (an empty value counts as unset): `None` when neither is set, an error
    /// naming the missing one when only one is.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, CredentialsError> {
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        match (get(AUTH_KEY_VAR), get(AUTH_SECRET_VAR)) {
            (Some(key_id), Some(key_secret)) => Ok(Some(Self::new(key_id.trim(), key_secret))),
            (None, None) => Ok(None),
            (Some(_), None) => Err(CredentialsError {
                set: AUTH_KEY_VAR,
                missing: AUTH_SECRET_VAR,
            }),
            (None, Some(_)) => Err(CredentialsError {
                set: AUTH_SECRET_VAR,
                missing: AUTH_KEY_VAR,
            }),
        }
    }

    /// [`Credentials::from_lookup`] on the process environment.
    pub fn from_env() -> Result<Option<Self>, CredentialsError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }
}

/// What the client knows about its token.
pub(crate) enum TokenState {
    /// Not fetched yet, or dropped after a rejection.
    Unknown,
    /// A token, until `refresh_at`. `generation` tells a rejected token from a newer one.
    Valid {
        token: HeaderValue,
        refresh_at: Instant,
        generation: u64,
    },
    /// The server has no `/token` route: no header, until a request is refused as
    /// unauthenticated (see [`TokenState::refused_without_token`]).
    Disabled,
}

/// `/token` answered 404 after it had issued a token: an outage, not a server without auth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TokenOutage;

impl TokenState {
    /// `/token` answered 404. Before any token was issued (`tokens_fetched` 0) the server has
    /// no auth (Conductor OSS): [`TokenState::Disabled`]. After, the route exists and is
    /// down for now: the state is kept (a token not yet expired goes on being refreshed) and
    /// the caller gets an outage to retry.
    pub(crate) fn token_route_missing(&mut self, tokens_fetched: u64) -> Result<(), TokenOutage> {
        if tokens_fetched > 0 {
            return Err(TokenOutage);
        }
        *self = Self::Disabled;
        Ok(())
    }

    /// A request sent without a token was refused as unauthenticated (401/403 about the
    /// token): a server taken to have no auth has it after all (the first `/token` answer
    /// was not the server's). From [`TokenState::Disabled`] back to [`TokenState::Unknown`],
    /// so the next request fetches a token; `true` if that changed anything.
    pub(crate) fn refused_without_token(&mut self) -> bool {
        if matches!(self, Self::Disabled) {
            *self = Self::Unknown;
            return true;
        }
        false
    }
}

impl fmt::Debug for TokenState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unknown => f.write_str("Unknown"),
            Self::Valid { generation, .. } => f
                .debug_struct("Valid")
                .field("token", &"<redacted>")
                .field("generation", generation)
                .finish(),
            Self::Disabled => f.write_str("Disabled"),
        }
    }
}

/// When to refresh a token fetched now: before its `exp` claim by a tenth of its life (at most
/// a minute), or after [`FALLBACK_TOKEN_TTL`] without a usable claim.
pub(crate) fn refresh_after(token: &str) -> Duration {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    match jwt_exp(token) {
        Some(exp) if exp > now => {
            let life = Duration::from_secs_f64((exp - now).min(1e9));
            life - (life / 10).min(MAX_REFRESH_MARGIN)
        }
        _ => FALLBACK_TOKEN_TTL,
    }
}

/// The `exp` claim (seconds since the epoch) of a JWT, read without verifying the signature.
pub(crate) fn jwt_exp(token: &str) -> Option<f64> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64url_decode(payload)?;
    let claims: Value = serde_json::from_slice(&bytes).ok()?;
    claims.get("exp")?.as_f64().filter(|v| v.is_finite())
}

/// Base64url without padding (JWT segments); `=` padding and the standard alphabet are
/// tolerated.
fn base64url_decode(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for b in text.trim_end_matches('=').bytes() {
        let v = match b {
            b'A'..=b'Z' => b - b'A',
            b'a'..=b'z' => b - b'a' + 26,
            b'0'..=b'9' => b - b'0' + 52,
            b'-' | b'+' => 62,
            b'_' | b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// Whether a 401/403 answer is about the token (so a fresh one may help): the body's `error`
/// is `EXPIRED_TOKEN` or `INVALID_TOKEN`, or a 401 says nothing more precise. A 403 for
/// anything else is a permission the key lacks.
pub(crate) fn token_rejected(status: u16, body: &str) -> bool {
    if status != 401 && status != 403 {
        return false;
    }
    let code = serde_json::from_str::<Value>(body).ok().and_then(|v| {
        v.get("error")
            .and_then(Value::as_str)
            .map(str::to_ascii_uppercase)
    });
    match code.as_deref() {
        Some("EXPIRED_TOKEN" | "INVALID_TOKEN") => true,
        Some(_) => false,
        None => status == 401,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn credentials_from_lookup() {
        assert_eq!(Credentials::from_lookup(lookup(&[])), Ok(None));
        assert_eq!(
            Credentials::from_lookup(lookup(&[
                ("CONDUCTOR_AUTH_KEY", "id"),
                ("CONDUCTOR_AUTH_SECRET", "s3cret")
            ])),
            Ok(Some(Credentials::new("id", "s3cret")))
        );
        let err = Credentials::from_lookup(lookup(&[("CONDUCTOR_AUTH_KEY", "id")])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "CONDUCTOR_AUTH_KEY is set but CONDUCTOR_AUTH_SECRET is not: set both to authenticate, or neither"
        );
        let err = Credentials::from_lookup(lookup(&[
            ("CONDUCTOR_AUTH_KEY", ""),
            ("CONDUCTOR_AUTH_SECRET", "x"),
        ]))
        .unwrap_err();
        assert_eq!(err.missing, "CONDUCTOR_AUTH_KEY");
    }

    #[test]
    fn debug_hides_the_secret() {
        let text = format!("{:?}", Credentials::new("id", "s3cret"));
        assert!(text.contains("id") && !text.contains("s3cret"), "{text}");
        let state = TokenState::Valid {
            token: HeaderValue::from_static("tok3n"),
            refresh_at: Instant::now(),
            generation: 1,
        };
        assert!(!format!("{state:?}").contains("tok3n"));
    }

    fn jwt(claims: &str) -> String {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut out = String::new();
        for chunk in claims.as_bytes().chunks(3) {
            let n = chunk
                .iter()
                .enumerate()
                .fold(0u32, |acc, (i, b)| acc | u32::from(*b) << (16 - 8 * i));
            for i in 0..=chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            }
        }
        format!("eyJhbGciOiJIUzI1NiJ9.{out}.sig")
    }

    #[test]
    fn exp_claims() {
        assert_eq!(
            jwt_exp(&jwt(r#"{"sub":"x","exp":1700000000}"#)),
            Some(1.7e9)
        );
        assert_eq!(jwt_exp(&jwt(r#"{"exp":12.5,"a":"bc"}"#)), Some(12.5));
        assert_eq!(jwt_exp(&jwt(r#"{"sub":"x"}"#)), None);
        assert_eq!(jwt_exp("opaque-token"), None);
        assert_eq!(jwt_exp("a.!!!.c"), None);
        assert_eq!(base64url_decode("aGk"), Some(b"hi".to_vec()));
    }

    #[test]
    fn refresh_times() {
        assert_eq!(refresh_after("opaque"), FALLBACK_TOKEN_TTL);
        assert_eq!(refresh_after(&jwt(r#"{"exp":1}"#)), FALLBACK_TOKEN_TTL);
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let hour = refresh_after(&jwt(&format!(r#"{{"exp":{}}}"#, now.as_secs() + 3600)));
        assert!(
            hour > Duration::from_secs(3500) && hour <= Duration::from_secs(3540),
            "{hour:?}"
        );
        let short = refresh_after(&jwt(&format!(r#"{{"exp":{}}}"#, now.as_secs() + 10)));
        assert!(short <= Duration::from_secs(9), "{short:?}");
    }

    /// "No auth" is decided only by the first answer of `/token`; a later 404 keeps the
    /// token state and is an outage; a refusal without a token undoes "no auth".
    #[test]
    fn a_token_404_disables_auth_only_before_the_first_token() {
        let mut state = TokenState::Unknown;
        assert_eq!(state.token_route_missing(0), Ok(()));
        assert!(matches!(state, TokenState::Disabled));
        // The server refuses a request without a token: auth is on after all.
        assert!(state.refused_without_token());
        assert!(matches!(state, TokenState::Unknown));
        assert!(!state.refused_without_token(), "only once per change");
        // A token was issued; the refresh meets a 404: an outage, the token kept.
        let mut state = TokenState::Valid {
            token: HeaderValue::from_static("tok3n"),
            refresh_at: Instant::now(),
            generation: 1,
        };
        assert_eq!(state.token_route_missing(1), Err(TokenOutage));
        assert!(matches!(state, TokenState::Valid { generation: 1, .. }));
        assert!(!state.refused_without_token());
        assert!(matches!(state, TokenState::Valid { .. }));
        // Dropped after a rejection (Unknown), with tokens issued before: still an outage.
        let mut state = TokenState::Unknown;
        assert_eq!(state.token_route_missing(3), Err(TokenOutage));
        assert!(matches!(state, TokenState::Unknown));
    }

    #[test]
    fn rejections() {
        assert!(token_rejected(401, r#"{"error":"EXPIRED_TOKEN"}"#));
        assert!(token_rejected(403, r#"{"error":"INVALID_TOKEN"}"#));
        assert!(token_rejected(401, "Unauthorized"));
        assert!(!token_rejected(403, r#"{"error":"ACCESS_DENIED"}"#));
        assert!(!token_rejected(403, ""));
        assert!(!token_rejected(404, r#"{"error":"INVALID_TOKEN"}"#));
    }
}
