//! A failed lakeFS call.

use std::path::PathBuf;

/// A failed lakeFS call.
#[derive(Debug, thiserror::Error)]
pub enum LakefsError {
    /// No answer (connect, timeout, reset).
    #[error("lakeFS {op}")]
    Transport {
        /// What was being done.
        op: String,
        /// The cause.
        #[source]
        source: reqwest::Error,
    },
    /// An error status.
    #[error("lakeFS {op}: HTTP {status}: {message}")]
    Status {
        /// What was being done.
        op: String,
        /// The status code.
        status: u16,
        /// The server's `message`.
        message: String,
    },
    /// A 3xx answer: no client follows a redirect (`perago_core::http`).
    #[error(
        "lakeFS {op}: the server answered HTTP {status} redirecting to {location}; perago follows no redirects"
    )]
    Redirect {
        /// What was being done.
        op: String,
        /// The 3xx status.
        status: u16,
        /// The `Location`, or `(no Location)`.
        location: String,
    },
    /// An answer longer than perago reads into memory.
    #[error("lakeFS {op}: the answer is larger than {limit} bytes, the most perago reads; refused")]
    TooLarge {
        /// What was being done.
        op: String,
        /// The cap.
        limit: usize,
    },
    /// A listing page that does not continue the listing (keys out of order, a `next_offset`
    /// that does not advance).
    #[error("lakeFS {op}: bad pagination: {message}; refused")]
    Pagination {
        /// What was being done.
        op: String,
        /// What was wrong.
        message: String,
    },
    /// A listing with more entries than the caller holds.
    #[error("lakeFS {op}: more than {max} entries listed")]
    TooMany {
        /// What was being done.
        op: String,
        /// The most the caller holds.
        max: usize,
    },
    /// An object whose content is longer than its listing gave: the transfer was cut there.
    #[error(
        "lakeFS {op}: the server sent more than the {listed} bytes the listing gives the object; refused"
    )]
    LongerThanListed {
        /// What was being done.
        op: String,
        /// The size listed.
        listed: u64,
    },
    /// An object whose content is shorter than its listing gave.
    #[error(
        "lakeFS {op}: the server sent {received} bytes, but the listing gives the object {listed}; refused"
    )]
    ShorterThanListed {
        /// What was being done.
        op: String,
        /// The size listed.
        listed: u64,
        /// The bytes received.
        received: u64,
    },
    /// A merge conflict (409).
    #[error("lakeFS {op}: merge conflict")]
    Conflict {
        /// What was being done.
        op: String,
    },
    /// A local file could not be read or written.
    #[error("lakeFS {op}: {}", file.display())]
    Local {
        /// What was being done.
        op: String,
        /// The file.
        file: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// An answer that is not what the API promises.
    #[error("lakeFS {op}: unexpected response: {message}")]
    Decode {
        /// What was being done.
        op: String,
        /// What was wrong.
        message: String,
    },
}

impl LakefsError {
    /// Transport errors, 5xx and 429.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Transport { .. } => true,
            Self::Status { status, .. } => *status >= 500 || *status == 429,
            _ => false,
        }
    }

    /// A 404.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Status { status: 404, .. })
    }

    /// lakeFS's "no changes" 400 (commit or merge with nothing to do).
    pub fn is_no_changes(&self) -> bool {
        matches!(self, Self::Status { status: 400, message, .. } if message.contains("no changes"))
    }
}
