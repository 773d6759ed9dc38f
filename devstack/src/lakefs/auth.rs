//! HTTP basic authentication: user = access key id, password = secret access key. Missing or
//! wrong credentials answer `401 {"message":"error authenticating request"}` like the real
//! server (which also lets credential-less requests through to a handler that then refuses).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;

use super::error::LakefsError;
use super::store::Lakefs;

/// Middleware in front of every route except the unauthenticated ones.
pub(crate) async fn require(
    State(lakefs): State<Arc<Lakefs>>,
    request: Request,
    next: Next,
) -> Response {
    let given = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(decode_basic);
    let expected = &lakefs.credentials;
    match given {
        Some((key, secret))
            if key == expected.access_key_id && secret == expected.secret_access_key =>
        {
            next.run(request).await
        }
        _ => {
            tracing::info!(
                path = request.uri().path(),
                "lakefs request without valid credentials"
            );
            LakefsError::Unauthenticated.into_response()
        }
    }
}

/// `Basic base64(user:password)` → (user, password).
fn decode_basic(header: &str) -> Option<(String, String)> {
    let (scheme, encoded) = header.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::decode_basic;

    #[test]
    fn decodes_basic_and_rejects_the_rest() {
        // "key:se:cret" — only the first colon separates.
        assert_eq!(
            decode_basic("Basic a2V5OnNlOmNyZXQ="),
            Some(("key".into(), "se:cret".into()))
        );
        assert_eq!(decode_basic("Bearer a2V5OnNlOmNyZXQ="), None);
        assert_eq!(decode_basic("Basic !!!"), None);
        assert_eq!(decode_basic("Basic"), None);
    }
}
