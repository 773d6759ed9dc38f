//! A lakeFS dev server started in this process, a client that signs with its credentials, and
//! shortcuts for the calls the tests make.

use perago_devstack::lakefs::{LakefsHandle, LakefsServer};
use reqwest::{Client, Method, RequestBuilder, StatusCode};
use serde_json::{Value, json};

pub(crate) use crate::support::Reply;

pub(crate) const KEY: &str = "AKIDEVSTACKTEST";
pub(crate) const SECRET: &str = "devstack/secret+key";

pub(crate) struct Lake {
    pub(crate) server: LakefsHandle,
    pub(crate) http: Client,
    pub(crate) api: String,
}

impl Reply {
    /// Asserts a lakeFS `Error` body (`{"message"}`) with this status and a message containing
    /// `needle`.
    pub(crate) fn assert_message(&self, status: u16, needle: &str) {
        assert_eq!(self.status.as_u16(), status, "body: {}", self.text);
        let body = self.json();
        let message = body["message"]
            .as_str()
            .unwrap_or_else(|| panic!("no message: {body}"));
        assert!(
            message.contains(needle),
            "message should contain {needle:?}: {body}"
        );
    }

    pub(crate) fn assert_status(&self, status: u16) -> &Self {
        assert_eq!(self.status.as_u16(), status, "body: {}", self.text);
        self
    }
}

impl Lake {
    pub(crate) async fn start() -> Self {
        let server = LakefsServer::builder()
            .credentials(KEY, SECRET)
            .bind("127.0.0.1:0")
            .await
            .expect("the lakeFS dev server binds to a free port");
        let api = server.api_url();
        Self {
            server,
            http: crate::support::http_client(),
            api,
        }
    }

    /// A request to `/api/v1{path}` with the server's credentials.
    pub(crate) fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.api))
            .basic_auth(KEY, Some(SECRET))
    }

    pub(crate) async fn send(&self, request: RequestBuilder) -> Reply {
        let response = request.send().await.expect("request reaches the server");
        let status = response.status();
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let text = response.text().await.expect("body is readable");
        Reply {
            status,
            content_type,
            text,
        }
    }

    pub(crate) async fn get(&self, path: &str) -> Reply {
        self.send(self.request(Method::GET, path)).await
    }

    pub(crate) async fn post(&self, path: &str, body: &Value) -> Reply {
        self.send(self.request(Method::POST, path).json(body)).await
    }

    pub(crate) async fn delete(&self, path: &str) -> Reply {
        self.send(self.request(Method::DELETE, path)).await
    }

    /// Creates repository `name` with default branch `main`.
    pub(crate) async fn repo(&self, name: &str) {
        let body = json!({"name": name, "storage_namespace": format!("mem://tests/{name}")});
        self.post("/repositories", &body).await.assert_status(201);
    }

    /// Uploads raw bytes (as a plain HTTP client or the `lakefs` package does).
    pub(crate) async fn upload(&self, repo: &str, branch: &str, path: &str, data: &str) -> Value {
        let request = self
            .request(
                Method::POST,
                &format!("/repositories/{repo}/branches/{branch}/objects"),
            )
            .query(&[("path", path)])
            .header("content-type", "application/octet-stream")
            .body(data.to_owned());
        let reply = self.send(request).await;
        reply.assert_status(201);
        reply.json()
    }

    pub(crate) async fn delete_object(&self, repo: &str, branch: &str, path: &str) {
        let request = self
            .request(
                Method::DELETE,
                &format!("/repositories/{repo}/branches/{branch}/objects"),
            )
            .query(&[("path", path)]);
        self.send(request).await.assert_status(204);
    }

    /// The object's bytes at `reference`, or the status when it cannot be read.
    pub(crate) async fn read(
        &self,
        repo: &str,
        reference: &str,
        path: &str,
    ) -> Result<String, StatusCode> {
        let request = self
            .request(
                Method::GET,
                &format!("/repositories/{repo}/refs/{reference}/objects"),
            )
            .query(&[("path", path)]);
        let reply = self.send(request).await;
        if reply.status == StatusCode::OK {
            Ok(reply.text)
        } else {
            Err(reply.status)
        }
    }

    /// Commits `branch` and returns the commit.
    pub(crate) async fn commit(&self, repo: &str, branch: &str, message: &str) -> Value {
        let reply = self
            .post(
                &format!("/repositories/{repo}/branches/{branch}/commits"),
                &json!({"message": message}),
            )
            .await;
        reply.assert_status(201);
        reply.json()
    }

    pub(crate) async fn branch(&self, repo: &str, name: &str, source: &str) -> String {
        let reply = self
            .post(
                &format!("/repositories/{repo}/branches"),
                &json!({"name": name, "source": source}),
            )
            .await;
        reply.assert_status(201);
        reply.text
    }

    pub(crate) async fn head(&self, repo: &str, branch: &str) -> String {
        let reply = self
            .get(&format!("/repositories/{repo}/branches/{branch}"))
            .await;
        reply.assert_status(200);
        reply.json()["commit_id"].as_str().unwrap().to_owned()
    }

    pub(crate) async fn merge(
        &self,
        repo: &str,
        source: &str,
        destination: &str,
        body: &Value,
    ) -> Reply {
        self.post(
            &format!("/repositories/{repo}/refs/{source}/merge/{destination}"),
            body,
        )
        .await
    }

    /// Paths of `GET .../objects/ls` with `query`.
    pub(crate) async fn ls(&self, repo: &str, reference: &str, query: &[(&str, &str)]) -> Value {
        let request = self
            .request(
                Method::GET,
                &format!("/repositories/{repo}/refs/{reference}/objects/ls"),
            )
            .query(query);
        let reply = self.send(request).await;
        reply.assert_status(200);
        reply.json()
    }
}

/// The `path`s of a list response's results.
pub(crate) fn paths(list: &Value) -> Vec<String> {
    list["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| r["path"].as_str().or(r["id"].as_str()).unwrap().to_owned())
        .collect()
}
