//! Conductor client errors, classified for retry decisions.

/// A Conductor request that did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum ConductorError {
    /// The request never got an answer (connect, timeout, reset).
    #[error("{method} {url}")]
    Transport {
        /// HTTP method.
        method: &'static str,
        /// Request URL.
        url: String,
        /// The transport error.
        #[source]
        source: reqwest::Error,
    },
    /// The server answered with an error status.
    #[error("{method} {url}: HTTP {status}{}", body_suffix(.body))]
    Status {
        /// HTTP method.
        method: &'static str,
        /// Request URL.
        url: String,
        /// The status code.
        status: u16,
        /// The response body (Conductor's ErrorResponse JSON, usually), cut short.
        body: String,
    },
    /// `POST /token` refused the key id and secret (401/403): fix the credentials; retrying
    /// will not help.
    #[error(
        "{method} {url}: HTTP {status}: Conductor refused key id {key_id:?} and its secret (check CONDUCTOR_AUTH_KEY and CONDUCTOR_AUTH_SECRET){}",
        body_suffix(.body)
    )]
    Credentials {
        /// HTTP method.
        method: &'static str,
        /// The token URL.
        url: String,
        /// The status code.
        status: u16,
        /// The key id (not secret).
        key_id: String,
        /// The response body, cut short.
        body: String,
    },
    /// `POST /token` answered 404 after it had issued tokens: taken as an outage (a proxy
    /// answering for a restarting server), not as a server without auth; retried.
    #[error(
        "{method} {url}: HTTP 404 from the token endpoint, which issued tokens before: taken as an outage, not as a server without auth"
    )]
    TokenUnavailable {
        /// HTTP method.
        method: &'static str,
        /// The token URL.
        url: String,
    },
    /// The answer is larger than perago reads into memory for this request: refused unread
    /// past the limit (memory stays bounded whatever the server declares or sends).
    #[error(
        "{method} {url}: HTTP {status}: the answer is larger than {limit} bytes, the most read for this request; refused"
    )]
    TooLarge {
        /// HTTP method.
        method: &'static str,
        /// Request URL.
        url: String,
        /// The status code of the answer.
        status: u16,
        /// The most that is read.
        limit: usize,
    },
    /// The answer was not what the API promises.
    #[error("{method} {url}: unexpected response: {message}")]
    Decode {
        /// HTTP method.
        method: &'static str,
        /// Request URL.
        url: String,
        /// What was wrong.
        message: String,
    },
}

fn body_suffix(body: &str) -> String {
    let body = body.trim();
    if body.is_empty() {
        String::new()
    } else {
        format!(": {body}")
    }
}

impl ConductorError {
    /// Whether trying again may succeed: transport errors, 5xx and 429. A 4xx other than 429
    /// means the request itself is wrong or the task is gone.
    pub fn is_retryable(&self) -> bool {
        match self {
            // A proxy or a server in trouble may answer properly next time.
            Self::Transport { .. } | Self::TooLarge { .. } | Self::TokenUnavailable { .. } => true,
            Self::Status { status, .. } => *status >= 500 || *status == 429,
            Self::Credentials { .. } | Self::Decode { .. } => false,
        }
    }

    /// The HTTP status, if the server answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Status { status, .. }
            | Self::Credentials { status, .. }
            | Self::TooLarge { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// A 404 (or, on older servers, 204 for a read).
    pub fn is_not_found(&self) -> bool {
        self.status() == Some(404)
    }

    /// A short name for the kind of error, for metrics labels (the Conductor SDKs' `exception`
    /// label): `Transport`, `HTTP 503`, `Credentials`, `Decode`.
    pub fn kind(&self) -> String {
        match self {
            Self::Transport { .. } => "Transport".to_owned(),
            Self::Status { status, .. } => format!("HTTP {status}"),
            Self::Credentials { .. } => "Credentials".to_owned(),
            Self::TooLarge { .. } => "TooLarge".to_owned(),
            Self::TokenUnavailable { .. } => "TokenUnavailable".to_owned(),
            Self::Decode { .. } => "Decode".to_owned(),
        }
    }

    /// Whether the credentials were refused at `POST /token`.
    pub fn is_bad_credentials(&self) -> bool {
        matches!(self, Self::Credentials { .. })
    }
}
