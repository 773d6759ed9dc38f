//! HTTP clients that pay for TLS only when they speak it. Building a native-tls (OpenSSL)
//! client costs 65–130 ms and 5 MiB of RSS even for a server that is plain `http://` —
//! in every broker and executor at start. A client for an `http://` URL therefore gets a
//! preconfigured rustls backend (ring, no root certificates loaded), which builds in
//! microseconds and is never used; an `https://` URL gets native-tls, verified against the
//! system's root certificates.

use std::sync::Arc;

/// A client builder for a server at `url`.
pub fn client_builder(url: &str) -> reqwest::ClientBuilder {
    let builder = reqwest::Client::builder();
    if url.starts_with("https://") {
        return builder;
    }
    builder.tls_backend_preconfigured(plain_http_tls())
}

/// The TLS configuration of a plain-http client: nothing to verify with, so an https
/// redirect fails instead of connecting unverified.
fn plain_http_tls() -> rustls::ClientConfig {
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What it costs is measured by `perago-bench startup memory`; here: both kinds build,
    /// and the plain one refuses to go to an https server it cannot verify.
    #[tokio::test]
    async fn both_kinds_build_and_plain_http_never_speaks_unverified_tls() {
        client_builder("https://example.invalid/api")
            .build()
            .unwrap();
        let plain = client_builder("http://127.0.0.1:1/api").build().unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let err = plain
            .get(format!("https://{addr}/"))
            .timeout(std::time::Duration::from_secs(5))
            .send();
        let (sent, _) = tokio::join!(err, async {
            // Accept and drop: the handshake cannot complete either way.
            let _ = listener.accept().await;
        });
        assert!(sent.is_err());
    }
}
