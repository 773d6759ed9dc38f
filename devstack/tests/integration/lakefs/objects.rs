//! Objects: uploads (raw and multipart), stat, get (ranges, ETag), listing with pagination and
//! delimiter, deletes, and what staged changes look like before a commit.

use reqwest::Method;
use serde_json::json;

use super::support::{Lake, paths};

#[tokio::test]
async fn raw_and_multipart_uploads_store_bytes_type_and_metadata() {
    let lake = Lake::start().await;
    lake.repo("repo").await;
    let raw = lake
        .request(Method::POST, "/repositories/repo/branches/main/objects")
        .query(&[("path", "out/r.json")])
        .header("content-type", "application/json")
        .header("x-lakefs-meta-Owner", "perago")
        .body(r#"{"a":1}"#);
    let stats = lake.send(raw).await.assert_status(201).json();
    assert_eq!(stats["path"], "out/r.json");
    assert_eq!(stats["path_type"], "object");
    assert_eq!(stats["size_bytes"], 7);
    assert_eq!(stats["content_type"], "application/json");
    assert_eq!(stats["metadata"], json!({"owner": "perago"}));
    assert!(stats["mtime"].is_i64());
    let address = stats["physical_address"].as_str().unwrap();
    assert!(address.starts_with("mem://tests/repo/data/"), "{address}");

    // What lakefs-sdk sends: multipart/form-data with a part named "content".
    let body = "--XyZ\r\nContent-Disposition: form-data; name=\"content\"; filename=\"content_0\"\r\n\
                Content-Type: text/csv\r\n\r\na,b\r\n--XyZ--\r\n";
    let multipart = lake
        .request(Method::POST, "/repositories/repo/branches/main/objects")
        .query(&[("path", "t.csv")])
        .header("content-type", "multipart/form-data; boundary=XyZ")
        .body(body);
    let stats = lake.send(multipart).await.assert_status(201).json();
    assert_eq!(
        (stats["size_bytes"].as_i64(), stats["content_type"].as_str()),
        (Some(3), Some("text/csv"))
    );
    assert_eq!(stats["checksum"], "b345e1dc09f20fdefdea469f09167892");
    assert_eq!(lake.read("repo", "main", "t.csv").await.unwrap(), "a,b");

    // An empty SDK upload: no content type, no body.
    let empty = lake
        .request(Method::POST, "/repositories/repo/branches/main/objects")
        .query(&[("path", "empty")]);
    let stats = lake.send(empty).await.assert_status(201).json();
    assert_eq!(stats["size_bytes"], 0);
    assert_eq!(stats["content_type"], "application/octet-stream");
    assert_eq!(stats["checksum"], "d41d8cd98f00b204e9800998ecf8427e");

    let no_content = lake
        .request(Method::POST, "/repositories/repo/branches/main/objects")
        .query(&[("path", "x")])
        .header("content-type", "multipart/form-data; boundary=b")
        .body("--b\r\nContent-Disposition: form-data; name=\"other\"\r\n\r\n1\r\n--b--\r\n");
    lake.send(no_content)
        .await
        .assert_message(500, "multipart upload missing key 'content'");
}

#[tokio::test]
async fn stat_and_get_report_checksums_ranges_and_etags() {
    let lake = Lake::start().await;
    lake.repo("repo").await;
    let stats = lake
        .upload("repo", "main", "dir/a b+c/ü.txt", "hello world")
        .await;
    assert_eq!(stats["checksum"], "5eb63bbbe01eeed093cb22bb8f5acdc3");
    // Queries are form-decoded: `+` is a space, `%2B` a plus, as the two Python clients send.
    let stat = lake
        .get("/repositories/repo/refs/main/objects/stat?path=dir/a%20b%2Bc/%C3%BC.txt")
        .await
        .assert_status(200)
        .json();
    assert_eq!(stat["metadata"], json!({}));
    assert_eq!(stat["checksum"], stats["checksum"]);
    let plus = lake
        .get("/repositories/repo/refs/main/objects/stat?path=dir%2Fa+b%2Bc%2F%C3%BC.txt")
        .await;
    plus.assert_status(200);

    let get = |range: Option<&str>, etag: Option<&str>| {
        let mut request = lake
            .request(Method::GET, "/repositories/repo/refs/main/objects")
            .query(&[("path", "dir/a b+c/ü.txt")]);
        if let Some(range) = range {
            request = request.header("range", range);
        }
        if let Some(etag) = etag {
            request = request.header("if-none-match", etag);
        }
        request.send()
    };
    let full = get(None, None).await.unwrap();
    assert_eq!(full.status().as_u16(), 200);
    let etag = full.headers()["etag"].to_str().unwrap().to_owned();
    assert_eq!(etag, "\"5eb63bbbe01eeed093cb22bb8f5acdc3\"");
    assert_eq!(full.headers()["content-type"], "application/octet-stream");
    assert!(full.headers().contains_key("last-modified"));
    assert_eq!(full.text().await.unwrap(), "hello world");
    let part = get(Some("bytes=6-"), None).await.unwrap();
    assert_eq!(part.status().as_u16(), 206);
    assert_eq!(part.headers()["content-range"], "bytes 6-10/11");
    assert_eq!(part.text().await.unwrap(), "world");
    let beyond = get(Some("bytes=11-"), None).await.unwrap();
    assert_eq!(beyond.status().as_u16(), 416);
    assert_eq!(beyond.headers()["content-range"], "bytes */11");
    assert_eq!(get(None, Some(&etag)).await.unwrap().status().as_u16(), 304);
    assert_eq!(
        get(Some("lines=1-2"), None)
            .await
            .unwrap()
            .status()
            .as_u16(),
        400
    );

    // HEAD: headers only.
    let head = lake
        .request(Method::HEAD, "/repositories/repo/refs/main/objects")
        .query(&[("path", "dir/a b+c/ü.txt")])
        .send()
        .await
        .unwrap();
    assert_eq!(head.status().as_u16(), 200);
    assert_eq!(head.headers()["content-length"], "11");

    lake.get("/repositories/repo/refs/main/objects/stat?path=missing")
        .await
        .assert_message(404, "not found");
    lake.get("/repositories/repo/refs/main/objects?path=missing")
        .await
        .assert_message(404, "not found");
    lake.get("/repositories/repo/refs/nope/objects?path=x")
        .await
        .assert_message(404, "not found");
    lake.get("/repositories/nope/refs/main/objects?path=x")
        .await
        .assert_message(404, "repository not found");
    lake.get("/repositories/repo/refs/main/objects/stat")
        .await
        .assert_message(400, "\"path\"");
}

#[tokio::test]
async fn listing_pages_with_after_and_amount_and_folds_with_a_delimiter() {
    let lake = Lake::start().await;
    lake.repo("repo").await;
    for i in 0..250 {
        lake.upload("repo", "main", &format!("data/{i:04}"), "x")
            .await;
    }
    lake.upload("repo", "main", "data-top", "x").await;
    lake.upload("repo", "main", "logs/a/1", "x").await;
    lake.upload("repo", "main", "logs/b", "x").await;

    let mut seen = Vec::new();
    let mut after = String::new();
    loop {
        let page = lake
            .ls(
                "repo",
                "main",
                &[("prefix", "data/"), ("amount", "100"), ("after", &after)],
            )
            .await;
        seen.extend(paths(&page));
        let pagination = &page["pagination"];
        assert_eq!(
            pagination["results"],
            page["results"].as_array().unwrap().len()
        );
        assert_eq!(pagination["max_per_page"], 1000);
        if pagination["has_more"] == false {
            assert_eq!(pagination["next_offset"], "");
            break;
        }
        after = pagination["next_offset"].as_str().unwrap().to_owned();
        assert_eq!(Some(after.as_str()), seen.last().map(String::as_str));
    }
    assert_eq!(
        seen,
        (0..250).map(|i| format!("data/{i:04}")).collect::<Vec<_>>()
    );
    // No amount (or <= 0) means 100; more than 1000 is refused.
    assert_eq!(paths(&lake.ls("repo", "main", &[]).await).len(), 100);
    assert_eq!(
        paths(&lake.ls("repo", "main", &[("amount", "-1")]).await).len(),
        100
    );
    lake.get("/repositories/repo/refs/main/objects/ls?amount=1001")
        .await
        .assert_status(400);

    let top = lake.ls("repo", "main", &[("delimiter", "/")]).await;
    assert_eq!(paths(&top), ["data-top", "data/", "logs/"]);
    assert_eq!(
        top["results"][1],
        json!({"path": "data/", "path_type": "common_prefix", "physical_address": "", "checksum": "", "mtime": 0})
    );
    let logs = lake
        .ls("repo", "main", &[("delimiter", "/"), ("prefix", "logs/")])
        .await;
    assert_eq!(paths(&logs), ["logs/a/", "logs/b"]);
    let paged = lake
        .ls("repo", "main", &[("delimiter", "/"), ("amount", "2")])
        .await;
    assert_eq!(paths(&paged), ["data-top", "data/"]);
    let after_prefix = lake
        .ls("repo", "main", &[("delimiter", "/"), ("after", "data/")])
        .await;
    assert_eq!(paths(&after_prefix), ["logs/"]);
}

#[tokio::test]
async fn staged_changes_show_on_the_branch_only_and_deletes_stage_tombstones() {
    let lake = Lake::start().await;
    lake.repo("repo").await;
    for path in ["a", "b", "c", "d"] {
        lake.upload("repo", "main", path, path).await;
    }
    let commit = lake.commit("repo", "main", "base").await;
    let id = commit["id"].as_str().unwrap();
    lake.branch("repo", "work", "main").await;
    lake.upload("repo", "work", "a", "changed").await;
    lake.upload("repo", "work", "e", "new").await;
    lake.delete_object("repo", "work", "b").await;
    lake.delete_object("repo", "work", "never-existed").await;
    let reply = lake
        .post(
            "/repositories/repo/branches/work/objects/delete",
            &json!({"paths": ["c", "missing"]}),
        )
        .await;
    assert_eq!(reply.assert_status(200).json(), json!({"errors": []}));

    assert_eq!(paths(&lake.ls("repo", "work", &[]).await), ["a", "d", "e"]);
    assert_eq!(lake.read("repo", "work", "a").await.unwrap(), "changed");
    // The commit and `branch@` still show the committed state.
    assert_eq!(paths(&lake.ls("repo", id, &[]).await), ["a", "b", "c", "d"]);
    assert_eq!(
        paths(&lake.ls("repo", "work@", &[]).await),
        ["a", "b", "c", "d"]
    );
    assert_eq!(lake.read("repo", "main", "a").await.unwrap(), "a");
    assert_eq!(
        lake.read("repo", "work", "b").await.unwrap_err().as_u16(),
        404
    );

    // Discarding uncommitted changes of one object, then all of them.
    let reset = |body| {
        lake.send(
            lake.request(Method::PUT, "/repositories/repo/branches/work")
                .json(&body),
        )
    };
    assert_eq!(
        reset(json!({"type": "object", "path": "a"}))
            .await
            .status
            .as_u16(),
        204
    );
    assert_eq!(lake.read("repo", "work", "a").await.unwrap(), "a");
    assert_eq!(reset(json!({"type": "reset"})).await.status.as_u16(), 204);
    assert_eq!(
        paths(&lake.ls("repo", "work", &[]).await),
        ["a", "b", "c", "d"]
    );
    reset(json!({"type": "bogus"}))
        .await
        .assert_message(400, "unknown reset type");

    let too_many: Vec<String> = (0..1001).map(|i| i.to_string()).collect();
    let reply = lake
        .post(
            "/repositories/repo/branches/work/objects/delete",
            &json!({"paths": too_many}),
        )
        .await;
    reply.assert_status(400);
}

#[tokio::test]
async fn conditional_uploads_and_upload_errors() {
    let lake = Lake::start().await;
    lake.repo("repo").await;
    let put = |path: &str, header: Option<(&'static str, &'static str)>| {
        let mut request = lake
            .request(Method::POST, "/repositories/repo/branches/main/objects")
            .query(&[("path", path)])
            .body("x");
        if let Some((name, value)) = header {
            request = request.header(name, value);
        }
        lake.send(request)
    };
    put("once", Some(("if-none-match", "*")))
        .await
        .assert_status(201);
    put("once", Some(("if-none-match", "*")))
        .await
        .assert_message(412, "path already exists");
    put("once", Some(("if-match", "\"abc\"")))
        .await
        .assert_status(501);
    put("once", Some(("if-none-match", "\"abc\"")))
        .await
        .assert_status(501);
    put(&"k".repeat(1025), None).await.assert_status(400);
    let missing_branch = lake
        .request(Method::POST, "/repositories/repo/branches/nope/objects")
        .query(&[("path", "x")])
        .body("x");
    lake.send(missing_branch)
        .await
        .assert_message(404, "not found");
    let no_path = lake
        .request(Method::POST, "/repositories/repo/branches/main/objects")
        .body("x");
    lake.send(no_path).await.assert_message(400, "\"path\"");
}

#[tokio::test]
async fn chunked_raw_uploads_are_decoded() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // The `lakefs` package uploads with `Transfer-Encoding: chunked` and a `+` for spaces.
    let lake = Lake::start().await;
    lake.repo("repo").await;
    let auth = "Basic QUtJREVWU1RBQ0tURVNUOmRldnN0YWNrL3NlY3JldCtrZXk="; // KEY:SECRET
    let request = format!(
        "POST /api/v1/repositories/repo/branches/main/objects?path=out%2Fa+b.txt HTTP/1.1\r\n\
         Host: x\r\nAuthorization: {auth}\r\nContent-Type: text/plain\r\n\
         Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
         5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    );
    let mut stream = tokio::net::TcpStream::connect(lake.server.addr())
        .await
        .unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    let read = stream.read_to_string(&mut response);
    tokio::time::timeout(std::time::Duration::from_secs(10), read)
        .await
        .expect("the server answers and closes within 10 s")
        .unwrap();
    assert!(response.starts_with("HTTP/1.1 201"), "{response}");
    assert_eq!(
        lake.read("repo", "main", "out/a b.txt").await.unwrap(),
        "hello world"
    );
    let stat = lake
        .get("/repositories/repo/refs/main/objects/stat?path=out/a%20b.txt")
        .await
        .json();
    assert_eq!(stat["content_type"], "text/plain");
}
