//! Issue #24: branch ids on branch routes, tags, branch protection rules, as the real server.

use reqwest::Method;
use serde_json::json;

use super::support::Lake;

#[tokio::test]
async fn branch_routes_refuse_what_is_not_a_branch_id_and_tags_resolve_as_refs() {
    let lake = Lake::start().await;
    lake.repo("repo").await;
    lake.upload("repo", "main", "a.txt", "one").await;
    let first = lake.commit("repo", "main", "first").await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    lake.upload("repo", "main", "a.txt", "two").await;
    lake.commit("repo", "main", "second").await;
    for not_a_branch_id in ["main~1", "main@", "v1.0"] {
        lake.get(&format!("/repositories/repo/branches/{not_a_branch_id}"))
            .await
            .assert_message(400, "branch id: invalid value");
    }
    lake.get("/repositories/repo/branches/nope")
        .await
        .assert_message(404, "not found");

    let tag = lake
        .post(
            "/repositories/repo/tags",
            &json!({"id": "v1.0", "ref": "main~1"}),
        )
        .await;
    assert_eq!(
        tag.assert_status(201).json(),
        json!({"id": "v1.0", "commit_id": first})
    );
    lake.post(
        "/repositories/repo/tags",
        &json!({"id": "v1.0", "ref": "main"}),
    )
    .await
    .assert_message(409, "tag already exists");
    lake.post(
        "/repositories/repo/tags",
        &json!({"id": "a..b", "ref": "main"}),
    )
    .await
    .assert_message(400, "tag id");
    for reference in ["v1.0", "main~1"] {
        let commit = lake
            .get(&format!("/repositories/repo/commits/{reference}"))
            .await
            .assert_status(200)
            .json();
        assert_eq!(commit["id"], first.as_str(), "{reference}");
    }
    let read = lake
        .get("/repositories/repo/refs/v1.0/objects?path=a.txt")
        .await;
    assert_eq!(read.assert_status(200).text, "one");
    lake.delete("/repositories/repo/tags/v1.0")
        .await
        .assert_status(204);
    lake.get("/repositories/repo/tags/v1.0")
        .await
        .assert_message(404, "tag not found");
}

#[tokio::test]
async fn a_protection_rule_blocks_staging_writes_and_commits_but_not_merges() {
    let lake = Lake::start().await;
    lake.repo("repo").await;
    lake.upload("repo", "main", "a.txt", "one").await;
    lake.commit("repo", "main", "first").await;
    lake.branch("repo", "perago-staging-1", "main").await;
    lake.upload("repo", "perago-staging-1", "b.txt", "new")
        .await;
    let rules = json!([{"pattern": "main"}, {"pattern": "perago-*"}]);
    lake.send(
        lake.request(Method::PUT, "/repositories/repo/settings/branch_protection")
            .json(&rules),
    )
    .await
    .assert_status(204);
    let got = lake
        .get("/repositories/repo/settings/branch_protection")
        .await;
    assert_eq!(got.assert_status(200).json(), rules);

    let upload = lake
        .send(
            lake.request(
                Method::POST,
                "/repositories/repo/branches/perago-staging-1/objects?path=c.txt",
            )
            .body("x"),
        )
        .await;
    upload.assert_message(403, "cannot write to protected branch");
    let deleted = lake
        .post(
            "/repositories/repo/branches/perago-staging-1/objects/delete",
            &json!({"paths": ["a.txt"]}),
        )
        .await;
    assert_eq!(
        deleted.assert_status(200).json()["errors"][0]["status_code"],
        403
    );
    lake.post(
        "/repositories/repo/branches/perago-staging-1/commits",
        &json!({"message": "m"}),
    )
    .await
    .assert_message(403, "cannot commit to protected branch");
    // Unprotect the staging branch to commit; merging into the protected main is allowed.
    lake.send(
        lake.request(Method::PUT, "/repositories/repo/settings/branch_protection")
            .json(&json!([])),
    )
    .await
    .assert_status(204);
    lake.commit("repo", "perago-staging-1", "staged").await;
    lake.send(
        lake.request(Method::PUT, "/repositories/repo/settings/branch_protection")
            .json(&rules),
    )
    .await
    .assert_status(204);
    lake.post(
        "/repositories/repo/refs/perago-staging-1/merge/main",
        &json!({}),
    )
    .await
    .assert_status(200);
}
