//! The perago publish sequence against an in-process lakeFS dev server, one client over one
//! keep-alive connection. A benchmark, not a test: run it in release mode.
//!
//! ```text
//! cargo run --release -p perago-devstack --example bench_lakefs -- [OBJECTS]
//! ```
//!
//! Uploads OBJECTS 1 KiB objects (default 10000) to a staging branch, commits them, merges them
//! into main, then downloads them the way a worker does: list pages of 1000 at the merge
//! commit, and one GET per object.

#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use perago_devstack::lakefs::LakefsServer;
use serde_json::{Value, json};

type Error = Box<dyn std::error::Error>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let objects: usize = match std::env::args().nth(1) {
        Some(n) => n.parse()?,
        None => 10_000,
    };
    let server = LakefsServer::builder().bind("127.0.0.1:0").await?;
    let api = server.api_url();
    let (key, secret) = {
        let c = server.credentials();
        (c.access_key_id.clone(), c.secret_access_key.clone())
    };
    // reqwest brings no TLS provider of its own in this workspace.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let post = |path: String, body: Value| {
        http.post(format!("{api}{path}"))
            .basic_auth(&key, Some(&secret))
            .json(&body)
            .send()
    };
    post(
        "/repositories".into(),
        json!({"name": "bench", "storage_namespace": "mem://bench"}),
    )
    .await?
    .error_for_status()?;
    post(
        "/repositories/bench/branches".into(),
        json!({"name": "staging", "source": "main"}),
    )
    .await?
    .error_for_status()?;

    let payload = vec![b'x'; 1024];
    let started = Instant::now();
    for i in 0..objects {
        http.post(format!("{api}/repositories/bench/branches/staging/objects"))
            .basic_auth(&key, Some(&secret))
            .query(&[("path", format!("data/{i:08}"))])
            .body(payload.clone())
            .send()
            .await?
            .error_for_status()?;
    }
    report("upload (1 KiB, staged)", objects, started.elapsed());

    let started = Instant::now();
    post(
        "/repositories/bench/branches/staging/commits".into(),
        json!({"message": "bench"}),
    )
    .await?
    .error_for_status()?;
    let merged: Value = post(
        "/repositories/bench/refs/staging/merge/main".into(),
        json!({}),
    )
    .await?
    .error_for_status()?
    .json()
    .await?;
    let commit = merged["reference"]
        .as_str()
        .ok_or("no merge reference")?
        .to_owned();
    println!(
        "commit + merge of {objects} objects: {:.2?}",
        started.elapsed()
    );

    let started = Instant::now();
    let mut paths = Vec::with_capacity(objects);
    let mut after = String::new();
    loop {
        let page: Value = http
            .get(format!("{api}/repositories/bench/refs/{commit}/objects/ls"))
            .basic_auth(&key, Some(&secret))
            .query(&[("amount", "1000"), ("after", after.as_str())])
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        for object in page["results"].as_array().ok_or("no results")? {
            paths.push(object["path"].as_str().ok_or("no path")?.to_owned());
        }
        if page["pagination"]["has_more"] != true {
            break;
        }
        after = page["pagination"]["next_offset"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
    }
    report(
        "list (pages of 1000), objects",
        paths.len(),
        started.elapsed(),
    );

    let started = Instant::now();
    for path in &paths {
        http.get(format!("{api}/repositories/bench/refs/{commit}/objects"))
            .basic_auth(&key, Some(&secret))
            .query(&[("path", path)])
            .send()
            .await?
            .error_for_status()?
            .bytes()
            .await?;
    }
    report("get (1 KiB)", paths.len(), started.elapsed());
    server.shutdown().await;
    Ok(())
}

fn report(what: &str, count: usize, elapsed: Duration) {
    let rate = count as f64 / elapsed.as_secs_f64();
    println!("{what}: {count} in {elapsed:.2?} = {rate:.0}/s");
}
