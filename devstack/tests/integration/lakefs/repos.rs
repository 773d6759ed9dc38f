//! Repositories and branches: create, get, list with pagination, delete, and their errors.

use reqwest::Method;
use serde_json::json;

use super::support::{Lake, paths};

#[tokio::test]
async fn repositories_are_created_listed_fetched_and_deleted() {
    let lake = Lake::start().await;
    let created = lake
        .post(
            "/repositories",
            &json!({"name": "repo-1", "storage_namespace": "mem://bucket/repo-1", "default_branch": "trunk"}),
        )
        .await;
    let repo = created.assert_status(201).json();
    assert_eq!(repo["id"], "repo-1");
    assert_eq!(repo["default_branch"], "trunk");
    assert_eq!(repo["storage_namespace"], "mem://bucket/repo-1");
    assert_eq!(repo["storage_id"], "");
    assert_eq!(repo["read_only"], false);
    assert!(repo["creation_date"].is_i64());

    // The default branch points at the initial commit.
    let head = lake.head("repo-1", "trunk").await;
    let initial = lake
        .get(&format!("/repositories/repo-1/commits/{head}"))
        .await
        .assert_status(200)
        .json();
    assert_eq!(initial["message"], "Repository created");
    assert_eq!(initial["parents"], json!([]));

    lake.repo("repo-2").await;
    lake.repo("repo-3").await;
    let page = lake
        .get("/repositories?amount=2")
        .await
        .assert_status(200)
        .json();
    assert_eq!(paths(&page), ["repo-1", "repo-2"]);
    assert_eq!(
        page["pagination"],
        json!({"has_more": true, "next_offset": "repo-2", "results": 2, "max_per_page": 1000})
    );
    let next = lake.get("/repositories?amount=2&after=repo-2").await.json();
    assert_eq!(paths(&next), ["repo-3"]);
    assert_eq!(next["pagination"]["has_more"], false);
    assert_eq!(next["pagination"]["next_offset"], "");
    assert_eq!(
        lake.get("/repositories/repo-2")
            .await
            .assert_status(200)
            .json()["id"],
        "repo-2"
    );

    assert_eq!(
        lake.delete("/repositories/repo-2").await.status.as_u16(),
        204
    );
    lake.get("/repositories/repo-2")
        .await
        .assert_message(404, "repository not found");
    lake.delete("/repositories/repo-2")
        .await
        .assert_message(404, "repository not found");
}

#[tokio::test]
async fn repository_creation_errors_are_the_real_servers() {
    let lake = Lake::start().await;
    lake.repo("taken").await;
    let again = lake
        .post(
            "/repositories",
            &json!({"name": "taken", "storage_namespace": "mem://other"}),
        )
        .await;
    again.assert_message(409, "not unique");
    // A namespace is never reused, not even after its repository is gone.
    lake.delete("/repositories/taken").await.assert_status(204);
    let reuse = lake
        .post(
            "/repositories",
            &json!({"name": "fresh", "storage_namespace": "mem://tests/taken"}),
        )
        .await;
    reuse.assert_message(400, "storage namespace already in use");
    for name in ["ab", "Upper", "-dash", "under_score", &"x".repeat(64)] {
        let reply = lake
            .post(
                "/repositories",
                &json!({"name": name, "storage_namespace": "mem://n"}),
            )
            .await;
        reply.assert_message(400, "invalid value");
    }
    let bad_ns = lake
        .post(
            "/repositories",
            &json!({"name": "okname", "storage_namespace": "ftp://x"}),
        )
        .await;
    bad_ns.assert_status(400);
    let bad_branch = lake
        .post(
            "/repositories",
            &json!({"name": "okname", "storage_namespace": "mem://y", "default_branch": "a/b"}),
        )
        .await;
    bad_branch.assert_message(400, "branch id must consist of letters");
    lake.post("/repositories", &json!({"name": "okname"}))
        .await
        .assert_status(400);
}

#[tokio::test]
async fn branches_are_created_from_refs_listed_in_pages_and_deleted() {
    let lake = Lake::start().await;
    lake.repo("repo").await;
    let main = lake.head("repo", "main").await;
    // Creation answers the commit id as plain text, not JSON.
    let reply = lake
        .send(
            lake.request(Method::POST, "/repositories/repo/branches")
                .json(&json!({"name": "b1", "source": "main"})),
        )
        .await;
    assert_eq!(reply.assert_status(201).text, main);
    assert!(
        reply
            .content_type
            .as_deref()
            .unwrap_or_default()
            .starts_with("text/plain"),
        "{reply:?}"
    );
    for name in ["b2", "b3", "b4"] {
        lake.branch("repo", name, "main").await;
    }
    let page = lake
        .get("/repositories/repo/branches?amount=3")
        .await
        .json();
    assert_eq!(paths(&page), ["b1", "b2", "b3"]);
    assert_eq!(page["results"][0], json!({"id": "b1", "commit_id": main}));
    assert_eq!(page["pagination"]["next_offset"], "b3");
    let rest = lake
        .get("/repositories/repo/branches?amount=3&after=b3")
        .await
        .json();
    assert_eq!(paths(&rest), ["b4", "main"]);
    assert_eq!(rest["pagination"]["has_more"], false);
    assert_eq!(
        paths(
            &lake
                .get("/repositories/repo/branches?prefix=b")
                .await
                .json()
        )
        .len(),
        4
    );

    assert_eq!(
        lake.delete("/repositories/repo/branches/b2")
            .await
            .status
            .as_u16(),
        204
    );
    lake.get("/repositories/repo/branches/b2")
        .await
        .assert_message(404, "not found");
    lake.delete("/repositories/repo/branches/b2")
        .await
        .assert_message(404, "not found");
    lake.delete("/repositories/repo/branches/main")
        .await
        .assert_message(403, "cannot delete repository default branch");
}

#[tokio::test]
async fn branch_creation_errors_are_the_real_servers() {
    let lake = Lake::start().await;
    lake.repo("repo").await;
    lake.branch("repo", "exists", "main").await;
    let body = |name: &str, source: &str| json!({"name": name, "source": source});
    lake.post("/repositories/repo/branches", &body("exists", "main"))
        .await
        .assert_message(409, "not unique");
    for name in ["staging/task-1", "-x", "a.b", ""] {
        let reply = lake
            .post("/repositories/repo/branches", &body(name, "main"))
            .await;
        reply.assert_message(400, "branch id must consist of letters");
    }
    lake.post("/repositories/repo/branches", &body("x", "nope"))
        .await
        .assert_message(404, "not found");
    lake.post("/repositories/repo/branches", &body("x", "main$"))
        .await
        .assert_status(400);
    lake.post("/repositories/nope/branches", &body("x", "main"))
        .await
        .assert_message(404, "repository not found");
    lake.post("/repositories/repo/branches", &json!({"name": "x"}))
        .await
        .assert_status(400);
    lake.get("/repositories/repo/branches/nope")
        .await
        .assert_message(404, "not found");
    lake.get("/repositories/nope/branches/main")
        .await
        .assert_message(404, "repository not found");
}

#[tokio::test]
async fn read_only_repositories_refuse_writes_unless_forced() {
    let lake = Lake::start().await;
    let body =
        json!({"name": "frozen", "storage_namespace": "mem://tests/frozen", "read_only": true});
    assert_eq!(
        lake.post("/repositories", &body)
            .await
            .assert_status(201)
            .json()["read_only"],
        true
    );
    let upload = lake
        .request(Method::POST, "/repositories/frozen/branches/main/objects")
        .query(&[("path", "x")])
        .body("x");
    lake.send(upload)
        .await
        .assert_message(403, "read-only repository");
    let branch = json!({"name": "b", "source": "main"});
    lake.post("/repositories/frozen/branches", &branch)
        .await
        .assert_message(403, "read-only repository");
    let forced = lake
        .request(Method::POST, "/repositories/frozen/branches/main/objects")
        .query(&[("path", "x"), ("force", "True")])
        .body("x");
    lake.send(forced).await.assert_status(201);
    let commit = json!({"message": "m"});
    lake.post("/repositories/frozen/branches/main/commits", &commit)
        .await
        .assert_message(403, "read-only repository");
    let forced = json!({"message": "m", "force": true});
    lake.post("/repositories/frozen/branches/main/commits", &forced)
        .await
        .assert_status(201);
}
