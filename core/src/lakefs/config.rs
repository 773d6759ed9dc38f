//! Where and as whom to reach lakeFS.

use std::fmt;

/// Where and as whom to reach lakeFS.
#[derive(Clone)]
pub struct LakefsConfig {
    /// `LAKEFS_ENDPOINT`, with or without `/api/v1`.
    pub endpoint: String,
    /// `LAKEFS_ACCESS_KEY_ID`.
    pub access_key_id: String,
    /// `LAKEFS_SECRET_ACCESS_KEY`.
    pub secret_access_key: String,
}

impl fmt::Debug for LakefsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LakefsConfig")
            .field("endpoint", &self.endpoint)
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .finish()
    }
}

/// lakeFS settings no client can be made from.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LakefsConfigError {
    /// Variables are missing.
    #[error(
        "LakeFS config is required for workspace tasks: missing {}",
        missing.join(", ")
    )]
    Missing {
        /// Every missing variable.
        missing: Vec<&'static str>,
    },
    /// `LAKEFS_ENDPOINT` is not an http(s) URL.
    #[error("LAKEFS_ENDPOINT {endpoint:?} is invalid: expected an http:// or https:// URL")]
    Endpoint {
        /// The endpoint as given.
        endpoint: String,
    },
    /// The HTTP client cannot be built (TLS roots, …).
    #[error("cannot build an HTTP client")]
    Client(#[source] std::sync::Arc<reqwest::Error>),
}

impl LakefsConfig {
    /// The config from `lookup`; the error lists every missing name.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, LakefsConfigError> {
        use crate::env::{
            LAKEFS_ACCESS_KEY_ID, LAKEFS_ENDPOINT, LAKEFS_SECRET_ACCESS_KEY, require,
        };
        let [endpoint, access_key_id, secret_access_key] = require(
            lookup,
            [
                LAKEFS_ENDPOINT,
                LAKEFS_ACCESS_KEY_ID,
                LAKEFS_SECRET_ACCESS_KEY,
            ],
        )
        .map_err(|missing| LakefsConfigError::Missing { missing })?;
        Ok(Self {
            endpoint,
            access_key_id,
            secret_access_key,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lakefs::LakefsClient;

    #[test]
    fn bad_settings_are_named_by_their_variant() {
        let missing = LakefsConfig::from_lookup(|name| {
            (name == crate::env::LAKEFS_ACCESS_KEY_ID).then(|| "k".to_owned())
        })
        .unwrap_err();
        assert!(matches!(
            missing,
            LakefsConfigError::Missing { ref missing }
                if *missing == [crate::env::LAKEFS_ENDPOINT, crate::env::LAKEFS_SECRET_ACCESS_KEY]
        ));
        assert_eq!(
            missing.to_string(),
            "LakeFS config is required for workspace tasks: missing LAKEFS_ENDPOINT, LAKEFS_SECRET_ACCESS_KEY"
        );
        let endpoint = LakefsClient::new(&LakefsConfig {
            endpoint: "lakefs:8000".to_owned(),
            access_key_id: "k".to_owned(),
            secret_access_key: "s".to_owned(),
        })
        .unwrap_err();
        assert!(
            matches!(endpoint, LakefsConfigError::Endpoint { ref endpoint } if endpoint == "lakefs:8000")
        );
        assert_eq!(
            endpoint.to_string(),
            "LAKEFS_ENDPOINT \"lakefs:8000\" is invalid: expected an http:// or https:// URL"
        );
    }
}
