//! HTTP clients that pay for TLS only when they speak it. A native-tls (OpenSSL) client cost
//! 65–130 ms and 5 MiB of RSS to build even for a plain `http://` server, in every broker and
//! executor at start, and linking OpenSSL cost every process 1.7 MiB more. Every client here is
//! rustls with the ring provider, preconfigured: one for an `http://` URL loads no root
//! certificates (it never speaks TLS; an https redirect fails instead of connecting
//! unverified); one for an `https://` URL verifies the server against the system's roots,
//! read only then.
//!
//! No client follows a redirect, to another origin or to its own: a 3xx answer with a
//! `Location` fails the request with [`RedirectRefused`], naming the status and the target.
//! reqwest's default policy follows up to 10 redirects to any host and resends every header but
//! `Authorization` (so `X-Authorization`, the Conductor token) and, on 307/308, the body (task
//! results, object uploads): a server, or anything that can answer in its name, could send
//! credentials and data wherever it liked. Conductor and lakeFS never redirect their API
//! calls. The one place a cross-host URL is the point is Conductor's external payload storage:
//! its client is built for the storage's own URL (`conductor::fetch_task_input`), not by
//! following a redirect, and sends no credential of Conductor's.

use std::sync::Arc;

/// A client builder for a server at `url`; it follows no redirect.
pub fn client_builder(url: &str) -> reqwest::ClientBuilder {
    let roots = if url.starts_with("https://") {
        system_roots()
    } else {
        rustls::RootCertStore::empty()
    };
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls_config(roots))
        .redirect(reqwest::redirect::Policy::custom(|attempt| {
            let refused = RedirectRefused {
                status: attempt.status().as_u16(),
                location: attempt.url().to_string(),
            };
            attempt.error(refused)
        }))
}

/// A redirect a client was asked to follow; the request fails with this as its cause
/// (reqwest's error says `error following redirect`, [`reqwest::Error::is_redirect`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the server answered HTTP {status} redirecting to {location}; perago follows no redirects")]
pub struct RedirectRefused {
    /// The 3xx status.
    pub status: u16,
    /// The `Location`, resolved against the request's URL.
    pub location: String,
}

/// The refused redirect behind `error`, if a redirect is what failed it.
pub fn redirect_refused(error: &reqwest::Error) -> Option<&RedirectRefused> {
    let mut source = std::error::Error::source(error);
    while let Some(e) = source {
        if let Some(refused) = e.downcast_ref::<RedirectRefused>() {
            return Some(refused);
        }
        source = e.source();
    }
    None
}

fn tls_config(roots: rustls::RootCertStore) -> rustls::ClientConfig {
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth()
}

/// The system's root certificates (`SSL_CERT_FILE`/`SSL_CERT_DIR` when set). None found means
/// every https request fails verification, which the request's error then says.
fn system_roots() -> rustls::RootCertStore {
    let found = rustls_native_certs::load_native_certs();
    for error in &found.errors {
        tracing::warn!(error = %crate::errors::DisplayChain(&error), "cannot read a system root certificate");
    }
    let mut roots = rustls::RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        tracing::warn!("no system root certificates found: https servers cannot be verified");
    }
    roots
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What it costs is measured by `perago-bench startup memory`; here: an https client has
    /// the system's roots, and the plain one refuses to go to an https server it cannot verify.
    #[tokio::test]
    async fn https_clients_verify_with_the_system_roots_and_plain_ones_never_speak_tls() {
        assert!(
            !system_roots().is_empty(),
            "this machine has root certificates"
        );
        client_builder("https://example.invalid/api")
            .build()
            .unwrap();
        let plain = client_builder("http://127.0.0.1:1/api").build().unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let request = plain
            .get(format!("https://{addr}/"))
            .timeout(std::time::Duration::from_secs(5))
            .send();
        let (sent, _) = tokio::join!(request, async {
            // Accept and drop: the handshake cannot complete either way.
            let _ = listener.accept().await;
        });
        assert!(sent.is_err());
    }
}
