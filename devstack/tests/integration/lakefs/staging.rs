//! `PUT .../staging/backing` (`linkPhysicalAddress`): objects whose checksum is not their
//! content's MD5, as the real server stores for linked or imported objects (the source's ETag)
//! and for S3-gateway multipart uploads (the MD5 of the parts' MD5s) (issue #24, item 4).

use md5::{Digest, Md5};
use reqwest::Method;
use serde_json::{Value, json};

use super::support::Lake;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The checksum the real S3 gateway stores for a multipart upload of `parts`: the multipart
/// ETag (MD5 of the concatenated part MD5s) without its `-<parts>` suffix.
fn gateway_checksum(parts: &[&[u8]]) -> String {
    let mut outer = Md5::new();
    for part in parts {
        outer.update(Md5::digest(part));
    }
    hex(&outer.finalize())
}

async fn link(lake: &Lake, repo: &str, path: &str, body: &Value) -> super::support::Reply {
    let request = lake
        .request(
            Method::PUT,
            &format!("/repositories/{repo}/branches/main/staging/backing"),
        )
        .query(&[("path", path)])
        .json(body);
    lake.send(request).await
}

#[tokio::test]
async fn linked_objects_keep_the_checksum_they_were_given() {
    let lake = Lake::start().await;
    lake.repo("store").await;
    lake.repo("repo").await;
    let (first, second) = (&b"part one "[..], &b"part two"[..]);
    let content = "part one part two";
    let stored = lake.upload("store", "main", "blob", content).await;
    let address = stored["physical_address"].as_str().unwrap().to_owned();
    let parts = gateway_checksum(&[first, second]);
    assert_ne!(parts, hex(&Md5::digest(content)), "not the content MD5");

    let stats = link(
        &lake,
        "repo",
        "p/parts.bin",
        &json!({"staging": {"physical_address": address}, "checksum": parts,
                "size_bytes": content.len(), "content_type": "application/x-parquet"}),
    )
    .await
    .assert_status(200)
    .json();
    assert_eq!(stats["checksum"], parts.as_str());
    assert_eq!(stats["physical_address"], address.as_str());
    assert_eq!(stats["size_bytes"], content.len());
    assert_eq!(stats["content_type"], "application/x-parquet");
    // A source's ETag, quotes and spaces stripped as the real server does.
    let stats = link(
        &lake,
        "repo",
        "p/linked.csv",
        &json!({"staging": {"physical_address": address}, "checksum": " \"0x8DC1A2B3C4D5E6F\" ",
                "size_bytes": content.len(), "user_metadata": {"source": "azure"}}),
    )
    .await
    .assert_status(200)
    .json();
    assert_eq!(stats["checksum"], "0x8DC1A2B3C4D5E6F");
    assert_eq!(stats["metadata"], json!({"source": "azure"}));
    assert_eq!(stats["content_type"], "application/octet-stream");

    lake.commit("repo", "main", "linked").await;
    let listed = lake.ls("repo", "main", &[("prefix", "p/")]).await;
    let checksums: Vec<_> = listed["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["checksum"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(checksums, ["0x8DC1A2B3C4D5E6F", parts.as_str()]);
    assert_eq!(
        lake.read("repo", "main", "p/parts.bin").await.unwrap(),
        content
    );
    let etag = lake
        .http
        .get(format!(
            "{}/repositories/repo/refs/main/objects?path=p/parts.bin",
            lake.api
        ))
        .basic_auth(super::support::KEY, Some(super::support::SECRET))
        .send()
        .await
        .unwrap()
        .headers()["etag"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(etag, format!("\"{parts}\""));

    // The same bytes uploaded through the API get their MD5: by identity, that is a change.
    lake.upload("repo", "main", "p/parts.bin", content).await;
    let commit = lake.commit("repo", "main", "re-uploaded").await;
    assert_eq!(commit["message"], "re-uploaded");
}

#[tokio::test]
async fn link_requests_the_real_server_refuses_and_those_devstack_cannot_serve() {
    let lake = Lake::start().await;
    lake.repo("store").await;
    lake.repo("repo").await;
    let own = lake.upload("repo", "main", "mine", "mine").await;
    let other = lake.upload("store", "main", "blob", "four").await;
    let other = other["physical_address"].as_str().unwrap();
    let body = |address: &str, checksum: &str, size: i64| json!({"staging": {"physical_address": address}, "checksum": checksum, "size_bytes": size});
    // Inside the repository's own namespace: only a signed address links.
    link(
        &lake,
        "repo",
        "x",
        &body(own["physical_address"].as_str().unwrap(), "c", 4),
    )
    .await
    .assert_message(400, "address is not signed: link address invalid");
    link(&lake, "repo", "x", &body(other, "", 4))
        .await
        .assert_message(400, "checksum is required");
    link(
        &lake,
        "repo",
        "x",
        &json!({"staging": {"physical_address": other}, "checksum": "c"}),
    )
    .await
    .assert_status(400);
    link(&lake, "repo", "x", &body("s3://nowhere/key", "c", 4))
        .await
        .assert_message(400, "devstack holds no object at physical address");
    link(&lake, "repo", "x", &body(other, "c", 5))
        .await
        .assert_message(400, "size_bytes is 5, but the object");
    link(&lake, "nope", "x", &body(other, "c", 4))
        .await
        .assert_message(404, "repository not found");
    let request = lake
        .request(
            Method::PUT,
            "/repositories/repo/branches/nope/staging/backing",
        )
        .query(&[("path", "x")])
        .json(&body(other, "c", 4));
    lake.send(request)
        .await
        .assert_message(404, "branch 'nope' not found");
    let request = lake
        .request(
            Method::PUT,
            "/repositories/repo/branches/main/staging/backing",
        )
        .query(&[("path", "mine")])
        .header("if-none-match", "*")
        .json(&body(other, "c", 4));
    lake.send(request)
        .await
        .assert_message(412, "path already exists");
    // Nothing of the refused requests was staged.
    let listed = lake.ls("repo", "main", &[]).await;
    assert_eq!(super::support::paths(&listed), ["mine"]);
}
