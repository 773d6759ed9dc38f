//! The worker sequence of the reference §4.3 / SPEC §6, end to end: download a prefix at a
//! pinned commit, stage changes on `perago-staging-<execution_id>` cut from that commit, skip
//! an empty publish by its diff, commit with metadata, merge, delete the staging branch.

use reqwest::Method;
use serde_json::{Value, json};

use super::support::{Lake, paths};

/// Every object under `prefix` at `commit`, paged with the largest page.
async fn download(lake: &Lake, commit: &str, prefix: &str) -> Vec<(String, String)> {
    let mut files = Vec::new();
    let mut after = String::new();
    loop {
        let query = [
            ("prefix", prefix),
            ("amount", "1000"),
            ("after", after.as_str()),
        ];
        let page = lake.ls("repo", commit, &query).await;
        for path in paths(&page) {
            let data = lake
                .read("repo", commit, &path)
                .await
                .expect("listed objects are readable");
            files.push((path, data));
        }
        if page["pagination"]["has_more"] == false {
            return files;
        }
        after = page["pagination"]["next_offset"]
            .as_str()
            .unwrap()
            .to_owned();
    }
}

#[tokio::test]
async fn a_task_publishes_its_workspace_through_a_staging_branch() {
    let lake = Lake::start().await;
    lake.repo("repo").await;
    for i in 0..1500 {
        lake.upload("repo", "main", &format!("ws/in/{i:04}"), &i.to_string())
            .await;
    }
    lake.upload("repo", "main", "ws/old", "to be removed").await;
    lake.upload("repo", "main", "elsewhere", "untouched").await;
    lake.commit("repo", "main", "inputs").await;

    // (a) pin the branch head and download the prefix at that commit.
    let pinned = lake.head("repo", "main").await;
    let files = download(&lake, &pinned, "ws/").await;
    assert_eq!(files.len(), 1501);
    // Someone else publishes meanwhile, on another path.
    lake.upload("repo", "main", "other-task/out", "x").await;
    lake.commit("repo", "main", "another publish").await;

    // (b) stage on a branch cut from the pinned commit.
    let staging = "perago-staging-exec-42";
    assert_eq!(lake.branch("repo", staging, &pinned).await, pinned);
    lake.upload("repo", staging, "ws/in/0000", "changed").await;
    lake.upload("repo", staging, "ws/out/result.json", "{}")
        .await;
    let removed = lake
        .post(
            &format!("/repositories/repo/branches/{staging}/objects/delete"),
            &json!({"paths": ["ws/old"]}),
        )
        .await;
    assert_eq!(removed.assert_status(200).json()["errors"], json!([]));
    let diff = lake
        .get(&format!("/repositories/repo/branches/{staging}/diff"))
        .await
        .json();
    assert_eq!(diff["results"].as_array().map(Vec::len), Some(3), "{diff}");
    let metadata = json!({"workflow_id": "wf", "task_id": "t", "retry_count": "0", "execution_id": "exec-42", "worker_id": "w"});
    let commit = lake
        .post(
            &format!("/repositories/repo/branches/{staging}/commits"),
            &json!({"message": "perago publish", "metadata": metadata}),
        )
        .await;
    assert_eq!(commit.assert_status(201).json()["metadata"], metadata);

    // (c) publish.
    let merged = lake
        .merge(
            "repo",
            staging,
            "main",
            &json!({"message": "publish exec-42", "metadata": metadata}),
        )
        .await;
    let reference = merged.assert_status(200).json()["reference"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(lake.head("repo", "main").await, reference);
    assert_eq!(
        lake.read("repo", "main", "ws/in/0000").await.unwrap(),
        "changed"
    );
    assert_eq!(
        lake.read("repo", "main", "other-task/out").await.unwrap(),
        "x"
    );
    assert!(lake.read("repo", "main", "ws/old").await.is_err());

    // (d) delete the staging branch; a second delete is a harmless 404.
    assert_eq!(
        lake.delete(&format!("/repositories/repo/branches/{staging}"))
            .await
            .status
            .as_u16(),
        204
    );
    lake.delete(&format!("/repositories/repo/branches/{staging}"))
        .await
        .assert_status(404);

    // A task that changed nothing: the staging diff is empty, so it skips commit and merge.
    lake.branch("repo", "perago-staging-exec-43", &reference)
        .await;
    lake.upload("repo", "perago-staging-exec-43", "ws/in/0001", "1")
        .await; // same bytes
    let diff: Value = lake
        .get("/repositories/repo/branches/perago-staging-exec-43/diff")
        .await
        .json();
    assert_eq!(diff["results"], json!([]));
    let send = lake.request(
        Method::DELETE,
        "/repositories/repo/branches/perago-staging-exec-43",
    );
    assert_eq!(lake.send(send).await.status.as_u16(), 204);
}
