//! The publish: three-way merges per key by identity, conflicts, and the merge's refusals.

use serde_json::json;

use super::support::{Lake, paths};

/// Repository `r` with `a`, `b`, `c` committed on main, and branch `task` cut from that commit.
async fn with_task_branch() -> (Lake, String) {
    let lake = Lake::start().await;
    lake.repo("repo").await;
    for path in ["a", "b", "c"] {
        lake.upload("repo", "main", path, path).await;
    }
    let base = lake.commit("repo", "main", "base").await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    lake.branch("repo", "task", &base).await;
    (lake, base)
}

#[tokio::test]
async fn merging_into_an_unmoved_destination_takes_the_source_with_a_merge_commit() {
    let (lake, base) = with_task_branch().await;
    lake.upload("repo", "task", "a", "task").await;
    lake.delete_object("repo", "task", "b").await;
    let task = lake.commit("repo", "task", "task").await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let body = json!({"message": "publish", "metadata": {"execution_id": "e1"}});
    let merged = lake
        .merge("repo", "task", "main", &body)
        .await
        .assert_status(200)
        .json();
    let reference = merged["reference"].as_str().unwrap();
    assert_eq!(lake.head("repo", "main").await, reference);
    // Never a fast-forward: a new commit with both parents and the strategy in its metadata.
    let commit = lake
        .get(&format!("/repositories/repo/commits/{reference}"))
        .await
        .json();
    assert_eq!(commit["parents"], json!([base, task]));
    assert_eq!(commit["message"], "publish");
    assert_eq!(
        commit["metadata"],
        json!({"execution_id": "e1", ".lakefs.merge.strategy": "default"})
    );
    assert_eq!(paths(&lake.ls("repo", "main", &[]).await), ["a", "c"]);
    assert_eq!(lake.read("repo", "main", "a").await.unwrap(), "task");
    // Merging the same source again brings nothing.
    lake.merge("repo", "task", "main", &json!({}))
        .await
        .assert_message(400, "update branch main: no changes");
}

#[tokio::test]
async fn a_destination_that_moved_on_other_paths_merges_without_conflict() {
    let (lake, _) = with_task_branch().await;
    lake.upload("repo", "task", "a", "task").await;
    lake.upload("repo", "task", "same", "identical").await;
    lake.commit("repo", "task", "task").await;
    // Meanwhile others publish to main: other paths, and one identical change.
    lake.upload("repo", "main", "b", "other").await;
    lake.delete_object("repo", "main", "c").await;
    lake.upload("repo", "main", "same", "identical").await;
    lake.commit("repo", "main", "others").await;
    let merged = lake
        .merge("repo", "task", "main", &json!({}))
        .await
        .assert_status(200)
        .json();
    let commit = lake
        .get(&format!(
            "/repositories/repo/commits/{}",
            merged["reference"].as_str().unwrap()
        ))
        .await
        .json();
    assert_eq!(commit["message"], "Merge 'task' into 'main'");
    assert_eq!(
        paths(&lake.ls("repo", "main", &[]).await),
        ["a", "b", "same"]
    );
    assert_eq!(lake.read("repo", "main", "a").await.unwrap(), "task");
    assert_eq!(lake.read("repo", "main", "b").await.unwrap(), "other");
}

#[tokio::test]
async fn both_sides_changing_a_path_is_a_409_conflict_and_nothing_is_merged() {
    for (task_change, main_change) in [
        ("modify", "modify"),
        ("modify", "delete"),
        ("delete", "modify"),
        ("add", "add"),
    ] {
        let (lake, _) = with_task_branch().await;
        let path = if task_change == "add" { "new" } else { "a" };
        for (branch, change) in [("task", task_change), ("main", main_change)] {
            if change == "delete" {
                lake.delete_object("repo", branch, path).await;
            } else {
                lake.upload("repo", branch, path, branch).await;
            }
            lake.upload("repo", branch, &format!("only-{branch}"), "x")
                .await;
            lake.commit("repo", branch, branch).await;
        }
        let before = lake.head("repo", "main").await;
        let reply = lake
            .merge("repo", "task", "main", &json!({"message": "publish"}))
            .await;
        assert_eq!(
            reply.status.as_u16(),
            409,
            "{task_change}/{main_change}: {}",
            reply.text
        );
        assert_eq!(reply.json(), json!({"reference": ""}));
        assert_eq!(
            lake.head("repo", "main").await,
            before,
            "{task_change}/{main_change}"
        );
        assert!(lake.read("repo", "main", "only-task").await.is_err());

        // The strategies settle it.
        let dest_wins = lake
            .merge("repo", "task", "main", &json!({"strategy": "dest-wins"}))
            .await;
        dest_wins.assert_status(200);
        let expected = if main_change == "delete" {
            None
        } else {
            Some("main".to_owned())
        };
        assert_eq!(lake.read("repo", "main", path).await.ok(), expected);
        assert_eq!(lake.read("repo", "main", "only-task").await.unwrap(), "x");
    }
}

#[tokio::test]
async fn source_wins_and_bad_strategies() {
    let (lake, _) = with_task_branch().await;
    lake.upload("repo", "task", "a", "task").await;
    lake.commit("repo", "task", "t").await;
    lake.upload("repo", "main", "a", "main").await;
    lake.commit("repo", "main", "m").await;
    lake.merge("repo", "task", "main", &json!({"strategy": "theirs"}))
        .await
        .assert_status(400);
    let merged = lake
        .merge("repo", "task", "main", &json!({"strategy": "source-wins"}))
        .await;
    let reference = merged.assert_status(200).json()["reference"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(lake.read("repo", "main", "a").await.unwrap(), "task");
    let commit = lake
        .get(&format!("/repositories/repo/commits/{reference}"))
        .await
        .json();
    assert_eq!(commit["metadata"][".lakefs.merge.strategy"], "source-wins");
}

#[tokio::test]
async fn merges_refuse_dirty_destinations_and_ignore_uncommitted_sources() {
    let (lake, base) = with_task_branch().await;
    // A source with only uncommitted changes brings nothing.
    lake.upload("repo", "task", "a", "uncommitted").await;
    lake.merge("repo", "task", "main", &json!({}))
        .await
        .assert_message(400, "no changes");
    lake.commit("repo", "task", "t").await;
    lake.upload("repo", "main", "dirty", "x").await;
    lake.merge("repo", "task", "main", &json!({}))
        .await
        .assert_message(400, "uncommitted changes (dirty branch)");
    lake.send(
        lake.request(reqwest::Method::PUT, "/repositories/repo/branches/main")
            .json(&json!({"type": "reset"})),
    )
    .await
    .assert_status(204);
    // The merge base of the two, as the GET on the merge path reports it.
    let info = lake
        .get("/repositories/repo/refs/task/merge/main")
        .await
        .assert_status(200)
        .json();
    assert_eq!(info["base_commit_id"], base);
    lake.merge("repo", "task", "nope", &json!({}))
        .await
        .assert_message(404, "not found");
    lake.merge("repo", "nope", "main", &json!({}))
        .await
        .assert_message(404, "not found");
    // An empty body is a merge with defaults.
    let empty = lake
        .send(lake.request(
            reqwest::Method::POST,
            "/repositories/repo/refs/task/merge/main",
        ))
        .await;
    empty.assert_status(200);
    lake.merge("repo", "main", "main", &json!({}))
        .await
        .assert_message(400, "no changes");
}

#[tokio::test]
async fn concurrent_publishes_from_one_base_merge_on_distinct_paths_and_conflict_on_shared_ones() {
    const TASKS: usize = 8;
    let (lake, base) = with_task_branch().await;
    for i in 0..TASKS {
        let branch = format!("own-{i}");
        lake.branch("repo", &branch, &base).await;
        lake.upload("repo", &branch, &format!("out/{i}"), "x").await;
        lake.commit("repo", &branch, "own path").await;
    }
    let statuses = merge_all(&lake, (0..TASKS).map(|i| format!("own-{i}"))).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let listed = paths(&lake.ls("repo", "main", &[("prefix", "out/")]).await);
    assert_eq!(listed.len(), TASKS, "{listed:?}");

    // Same base again, and every task also writes one shared path: the first merge wins.
    let base = lake.head("repo", "main").await;
    for i in 0..TASKS {
        let branch = format!("shared-{i}");
        lake.branch("repo", &branch, &base).await;
        lake.upload("repo", &branch, "shared", &format!("task {i}"))
            .await;
        lake.commit("repo", &branch, "shared path").await;
    }
    let statuses = merge_all(&lake, (0..TASKS).map(|i| format!("shared-{i}"))).await;
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 409).count(),
        TASKS - 1,
        "{statuses:?}"
    );
}

/// Merges every source into main at once, each on its own connection; returns the statuses.
async fn merge_all(lake: &Lake, sources: impl Iterator<Item = String>) -> Vec<u16> {
    let mut merges = tokio::task::JoinSet::new();
    for source in sources {
        let path = format!("/repositories/repo/refs/{source}/merge/main");
        let request = lake.request(reqwest::Method::POST, &path).json(&json!({}));
        merges.spawn(async move {
            request
                .send()
                .await
                .expect("reaches the server")
                .status()
                .as_u16()
        });
    }
    merges.join_all().await
}

/// The `detached` fault serves a merge late and lands it even when the client hangs up, and
/// holds the source branch's delete until it has landed (as the real server orders them).
#[tokio::test]
async fn a_detached_merge_lands_after_its_client_hung_up_and_holds_the_delete() {
    use perago_devstack::faults::FaultSpec;
    use std::time::{Duration, Instant};
    let (lake, base) = with_task_branch().await;
    lake.upload("repo", "task", "a", "task").await;
    lake.commit("repo", "task", "task").await;
    lake.server
        .faults()
        .add(FaultSpec {
            method: Some("POST".into()),
            path: "/api/v1/repositories/repo/refs/task/merge/".into(),
            latency_ms: Some(1500),
            detached: true,
            hold_method: Some("DELETE".into()),
            hold_path: "/api/v1/repositories/repo/branches/task".to_owned().into(),
            count: Some(1),
            ..FaultSpec::default()
        })
        .unwrap();
    let started = Instant::now();
    let hung_up = lake
        .request(
            reqwest::Method::POST,
            "/repositories/repo/refs/task/merge/main",
        )
        .json(&json!({"message": "late"}))
        .timeout(Duration::from_millis(300))
        .send()
        .await;
    assert!(hung_up.is_err_and(|e| e.is_timeout()));
    assert_eq!(lake.head("repo", "main").await, base, "not landed yet");
    // The delete waits for the merge, which lands although its client is gone.
    lake.send(lake.request(reqwest::Method::DELETE, "/repositories/repo/branches/task"))
        .await
        .assert_status(204);
    assert!(started.elapsed() >= Duration::from_millis(1500));
    let head = lake.head("repo", "main").await;
    let commit = lake
        .get(&format!("/repositories/repo/commits/{head}"))
        .await
        .json();
    assert_eq!(commit["message"], "late");
    assert_eq!(lake.read("repo", "main", "a").await.unwrap(), "task");
    // Once: the next merge and delete are not held.
    let started = Instant::now();
    lake.send(lake.request(reqwest::Method::DELETE, "/repositories/repo/branches/nope"))
        .await
        .assert_status(404);
    assert!(started.elapsed() < Duration::from_millis(1000));
}
