//! Commits with metadata, "no changes", branches from commit ids, log and diffs.

use serde_json::json;

use super::support::{Lake, paths};

#[tokio::test]
async fn commits_carry_metadata_and_move_the_branch() {
    let lake = Lake::start().await;
    lake.repo("repo").await;
    let before = lake.head("repo", "main").await;
    lake.upload("repo", "main", "a", "1").await;
    let body = json!({"message": "publish", "metadata": {"workflow_id": "w1", "retry_count": "0"}});
    let commit = lake
        .post("/repositories/repo/branches/main/commits", &body)
        .await
        .assert_status(201)
        .json();
    let id = commit["id"].as_str().unwrap();
    assert_eq!(id.len(), 64);
    assert!(
        id.bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    );
    assert_eq!(commit["parents"], json!([before]));
    assert_eq!(commit["message"], "publish");
    assert_eq!(
        commit["metadata"],
        json!({"workflow_id": "w1", "retry_count": "0"})
    );
    assert!(commit["creation_date"].is_i64() && commit["meta_range_id"].is_string());
    assert!(commit["committer"].is_string());
    assert_eq!(lake.head("repo", "main").await, id);
    let fetched = lake
        .get(&format!("/repositories/repo/commits/{id}"))
        .await
        .assert_status(200)
        .json();
    assert_eq!(fetched, commit);
    // Any ref names a commit, including a unique prefix of its id.
    let by_prefix = lake
        .get(&format!("/repositories/repo/commits/{}", &id[..12]))
        .await
        .json();
    assert_eq!(by_prefix["id"], id);
    let by_branch = lake.get("/repositories/repo/commits/main~1").await.json();
    assert_eq!(by_branch["id"], before);

    let dated = lake
        .post(
            "/repositories/repo/branches/main/commits",
            &json!({"message": "", "date": 1_700_000_000, "allow_empty": true}),
        )
        .await;
    assert_eq!(
        dated.assert_status(201).json()["creation_date"],
        1_700_000_000
    );
    let log = lake
        .get("/repositories/repo/refs/main/commits?amount=2")
        .await
        .assert_status(200)
        .json();
    let ids: Vec<_> = log["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].clone())
        .collect();
    assert_eq!(ids.len(), 2);
    assert_eq!(log["pagination"]["has_more"], true);
    let rest = lake
        .get(&format!(
            "/repositories/repo/refs/main/commits?after={}",
            log["pagination"]["next_offset"].as_str().unwrap()
        ))
        .await
        .json();
    assert_eq!(rest["results"].as_array().unwrap().len(), 1);

    lake.get("/repositories/repo/commits/0000")
        .await
        .assert_message(404, "not found");
    lake.post(
        "/repositories/repo/branches/main/commits",
        &json!({"metadata": {"a": 1}}),
    )
    .await
    .assert_status(400);
    lake.post(
        "/repositories/repo/branches/nope/commits",
        &json!({"message": "x"}),
    )
    .await
    .assert_message(404, "not found");
}

#[tokio::test]
async fn commits_without_changes_are_400() {
    let lake = Lake::start().await;
    lake.repo("repo").await;
    lake.post(
        "/repositories/repo/branches/main/commits",
        &json!({"message": "x"}),
    )
    .await
    .assert_message(400, "no changes");
    lake.upload("repo", "main", "a", "same").await;
    lake.commit("repo", "main", "first").await;
    // Re-uploading identical bytes is staged, but changes nothing by identity.
    lake.upload("repo", "main", "a", "same").await;
    lake.post(
        "/repositories/repo/branches/main/commits",
        &json!({"message": "x"}),
    )
    .await
    .assert_message(400, "commit: no changes");
    // A tombstone of a path that does not exist changes nothing either.
    lake.delete_object("repo", "main", "ghost").await;
    lake.post(
        "/repositories/repo/branches/main/commits",
        &json!({"message": "x"}),
    )
    .await
    .assert_message(400, "no changes");
}

#[tokio::test]
async fn a_branch_from_a_commit_id_reads_that_commit() {
    let lake = Lake::start().await;
    lake.repo("repo").await;
    lake.upload("repo", "main", "input", "v1").await;
    let c1 = lake.commit("repo", "main", "v1").await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    lake.upload("repo", "main", "input", "v2").await;
    lake.commit("repo", "main", "v2").await;
    // Uncommitted changes of the source are not carried over.
    lake.upload("repo", "main", "staged-only", "x").await;
    assert_eq!(lake.branch("repo", "perago-staging-e1", &c1).await, c1);
    assert_eq!(
        lake.read("repo", "perago-staging-e1", "input")
            .await
            .unwrap(),
        "v1"
    );
    let from_main = lake.branch("repo", "from-main", "main").await;
    assert_eq!(lake.read("repo", "from-main", "input").await.unwrap(), "v2");
    assert!(lake.read("repo", "from-main", "staged-only").await.is_err());
    assert_eq!(lake.head("repo", "from-main").await, from_main);
}

#[tokio::test]
async fn diffs_show_uncommitted_changes_and_changes_between_refs() {
    let lake = Lake::start().await;
    lake.repo("repo").await;
    for path in ["keep", "change", "remove"] {
        lake.upload("repo", "main", path, path).await;
    }
    lake.commit("repo", "main", "base").await;
    lake.branch("repo", "work", "main").await;
    lake.upload("repo", "work", "change", "new content").await;
    lake.upload("repo", "work", "keep", "keep").await; // identical: not a change
    lake.upload("repo", "work", "dir/add", "a").await;
    lake.delete_object("repo", "work", "remove").await;

    let staged = lake
        .get("/repositories/repo/branches/work/diff")
        .await
        .assert_status(200)
        .json();
    let rows: Vec<_> = staged["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["path"].as_str().unwrap().to_owned(),
                d["type"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let expected = [
        ("change", "changed"),
        ("dir/add", "added"),
        ("remove", "removed"),
    ];
    assert_eq!(rows, expected.map(|(p, t)| (p.to_owned(), t.to_owned())));
    assert_eq!(staged["results"][0]["path_type"], "object");
    assert_eq!(staged["pagination"]["results"], 3);
    let folded = lake
        .get("/repositories/repo/branches/work/diff?delimiter=/")
        .await
        .json();
    assert_eq!(
        folded["results"][1],
        json!({"type": "prefix_changed", "path": "dir/", "path_type": "common_prefix"})
    );

    // Committed: main..work shows what merging work into main would bring.
    lake.commit("repo", "work", "work").await;
    let between = lake
        .get("/repositories/repo/refs/main/diff/work")
        .await
        .assert_status(200)
        .json();
    assert_eq!(paths(&between), ["change", "dir/add", "remove"]);
    assert_eq!(
        paths(
            &lake
                .get("/repositories/repo/refs/main/diff/work?amount=1")
                .await
                .json()
        ),
        ["change"]
    );
    // Three-dot ignores what main did since; two-dot compares the commits as they are.
    lake.upload("repo", "main", "main-only", "m").await;
    lake.commit("repo", "main", "main moves").await;
    assert_eq!(
        paths(
            &lake
                .get("/repositories/repo/refs/main/diff/work")
                .await
                .json()
        )
        .len(),
        3
    );
    let two_dot = lake
        .get("/repositories/repo/refs/main/diff/work?type=two_dot")
        .await
        .json();
    assert_eq!(
        paths(&two_dot),
        ["change", "dir/add", "main-only", "remove"]
    );
    lake.get("/repositories/repo/refs/main/diff/nope")
        .await
        .assert_message(404, "not found");
    lake.get("/repositories/repo/branches/nope/diff")
        .await
        .assert_message(404, "not found");
}

/// As lakeFS's commit iterator: the log walks from the head, so a commit never comes before a
/// child of it, even when they share a creation date (or the child's is older).
#[tokio::test]
async fn the_log_never_lists_a_commit_before_its_child() {
    let lake = Lake::start().await;
    lake.repo("repo").await;
    let mut made = Vec::new();
    for (n, date) in [1_700_000_000, 1_700_000_000, 1_700_000_000, 1_600_000_000]
        .into_iter()
        .enumerate()
    {
        let commit = lake
            .post(
                "/repositories/repo/branches/main/commits",
                &json!({"message": format!("c{n}"), "date": date, "allow_empty": true}),
            )
            .await
            .assert_status(201)
            .json();
        made.push(commit["id"].as_str().unwrap().to_owned());
    }
    made.reverse();
    for query in ["", "&first_parent=true"] {
        let log = lake
            .get(&format!(
                "/repositories/repo/refs/main/commits?amount=4{query}"
            ))
            .await
            .assert_status(200)
            .json();
        let ids: Vec<_> = log["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["id"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(ids, made, "{query}");
    }
}
