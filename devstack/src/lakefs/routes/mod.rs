//! The HTTP surface: every path under `/api/v1`, basic auth on all but the unauthenticated
//! routes, `404 {"message":"invalid API endpoint"}` for the rest.

mod commits;
mod meta;
mod objects;
mod protection;
mod repos;
mod staging;
mod tags;

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Query};
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::de::DeserializeOwned;

use super::auth;
use super::error::LakefsError;
use super::store::Lakefs;

/// Uploads are held in memory; this bounds one request body.
const MAX_BODY_BYTES: usize = 1 << 30;

type Shared = axum::extract::State<Arc<Lakefs>>;

pub(crate) fn router(lakefs: Arc<Lakefs>) -> Router {
    let r = "/api/v1/repositories/{repository}";
    let authenticated = Router::new()
        .route("/api/v1/repositories", get(repos::list).post(repos::create))
        .route(r, get(repos::get).delete(repos::delete))
        .route(
            &format!("{r}/branches"),
            get(repos::list_branches).post(repos::create_branch),
        )
        .route(
            &format!("{r}/branches/{{branch}}"),
            get(repos::get_branch)
                .delete(repos::delete_branch)
                .put(repos::reset_branch),
        )
        .route(
            &format!("{r}/branches/{{branch}}/objects"),
            axum::routing::post(objects::upload).delete(objects::delete_one),
        )
        .route(
            &format!("{r}/branches/{{branch}}/objects/delete"),
            axum::routing::post(objects::delete_many),
        )
        .route(
            &format!("{r}/branches/{{branch}}/commits"),
            axum::routing::post(commits::commit),
        )
        .route(
            &format!("{r}/branches/{{branch}}/diff"),
            get(commits::diff_branch),
        )
        .route(&format!("{r}/commits/{{commit}}"), get(commits::get))
        .route(&format!("{r}/refs/{{ref}}/commits"), get(commits::log))
        // `get` also answers HEAD, without a body, as the real server's HEAD handler does.
        .route(&format!("{r}/refs/{{ref}}/objects"), get(objects::get))
        .route(
            &format!("{r}/refs/{{ref}}/objects/stat"),
            get(objects::stat),
        )
        .route(&format!("{r}/refs/{{ref}}/objects/ls"), get(objects::list))
        .route(
            &format!("{r}/refs/{{left}}/diff/{{right}}"),
            get(commits::diff_refs),
        )
        .route(
            &format!("{r}/refs/{{source}}/merge/{{destination}}"),
            get(commits::merge_base).post(commits::merge),
        )
        .route(&format!("{r}/tags"), axum::routing::post(tags::create))
        .route(
            &format!("{r}/tags/{{tag}}"),
            get(tags::get).delete(tags::delete),
        )
        .route(
            &format!("{r}/settings/branch_protection"),
            get(protection::get).put(protection::set),
        )
        .route(
            &format!("{r}/branches/{{branch}}/staging/backing"),
            axum::routing::put(staging::link),
        )
        .route("/api/v1/config", get(meta::config))
        .route("/api/v1/config/version", get(meta::version))
        .route("/api/v1/config/storage", get(meta::storage))
        .route("/api/v1/user", get(meta::user))
        .route_layer(axum::middleware::from_fn_with_state(
            Arc::clone(&lakefs),
            auth::require,
        ));
    Router::new()
        .route("/api/v1/healthcheck", get(meta::healthcheck))
        .route("/_health", get(meta::healthcheck))
        .route(
            "/api/v1/setup_lakefs",
            get(meta::setup_state).post(meta::setup),
        )
        .merge(authenticated)
        .fallback(unknown_endpoint)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(lakefs)
}

async fn unknown_endpoint() -> Response {
    LakefsError::NotFound("invalid API endpoint".to_owned()).into_response()
}

/// Query parameters, form-decoded (`+` is a space, `%2B` a plus), with lakeFS's parsing rules.
#[derive(Debug)]
pub(crate) struct Params(HashMap<String, String>);

impl<S: Send + Sync> FromRequestParts<S> for Params {
    type Rejection = LakefsError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Query(map) = Query::<HashMap<String, String>>::from_request_parts(parts, state)
            .await
            .map_err(|e| {
                LakefsError::BadRequest(format!(
                    "invalid query: {}",
                    crate::errors::DisplayChain(&e)
                ))
            })?;
        Ok(Self(map))
    }
}

impl Params {
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    pub(crate) fn str(&self, name: &str) -> &str {
        self.get(name).unwrap_or_default()
    }

    /// A required parameter, with the request validator's message when missing.
    pub(crate) fn required(&self, name: &str) -> Result<&str, LakefsError> {
        self.get(name).ok_or_else(|| {
            LakefsError::BadRequest(format!(
                "parameter \"{name}\" in query has an error: value is required but missing"
            ))
        })
    }

    /// Booleans as Go's `strconv.ParseBool` reads them (the SDK sends `True`/`False`).
    pub(crate) fn bool(&self, name: &str, default: bool) -> Result<bool, LakefsError> {
        match self.get(name) {
            None | Some("") => Ok(default),
            Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
            Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
            Some(other) => Err(LakefsError::BadRequest(format!(
                "parameter \"{name}\" in query has an error: value {other}: an invalid boolean"
            ))),
        }
    }

    pub(crate) fn amount(&self) -> Result<usize, LakefsError> {
        super::listing::amount(self.get("amount"))
    }
}

/// Parses a JSON request body, answering 400 as the real server's request validator does.
pub(crate) fn json_body<T: DeserializeOwned>(body: &Bytes) -> Result<T, LakefsError> {
    serde_json::from_slice(body).map_err(|e| {
        LakefsError::BadRequest(format!(
            "request body has an error: {}",
            crate::errors::DisplayChain(&e)
        ))
    })
}
