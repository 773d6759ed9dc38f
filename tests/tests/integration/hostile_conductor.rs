//! The broker against a Conductor that hands out what it should not: a proxy in front of
//! devstack, on a loopback port, rewrites the first non-empty poll answer of the runtime's task
//! type into one that holds its task twice and, after it, a task of another type (another
//! team's, polled from devstack by the proxy). The broker must run its task once and hand the
//! other type's back untouched, for that type's own worker to take.

use crate::harness::{Conductor, SupervisorProc, TaskFixture, eventually};
use serde_json::{Value, json};
use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// One HTTP/1.1 request as read: its head lines (request line first) and its body.
struct Request {
    lines: Vec<String>,
    body: Vec<u8>,
}

async fn read_request(conn: &mut BufReader<TcpStream>) -> Option<Request> {
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        if conn.read_line(&mut line).await.ok()? == 0 {
            return None;
        }
        let line = line.trim_end().to_owned();
        if line.is_empty() {
            break;
        }
        lines.push(line);
    }
    let len = header(&lines, "content-length").map_or(0, |v| v.parse().unwrap());
    let mut body = vec![0; len];
    conn.read_exact(&mut body).await.ok()?;
    Some(Request { lines, body })
}

fn header<'a>(lines: &'a [String], name: &str) -> Option<&'a str> {
    lines.iter().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// Sends `request` to `upstream` on a connection of its own; the status line and the body.
async fn forward(upstream: &str, request: &Request) -> (String, Vec<u8>) {
    let mut conn = TcpStream::connect(upstream).await.unwrap();
    let mut head = format!("{}\r\n", request.lines[0]);
    for line in &request.lines[1..] {
        if !line.to_ascii_lowercase().starts_with("connection:") {
            head.push_str(line);
            head.push_str("\r\n");
        }
    }
    head.push_str("connection: close\r\n\r\n");
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(&request.body).await.unwrap();
    let mut answer = Vec::new();
    conn.read_to_end(&mut answer).await.unwrap();
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a whole answer")
        + 4;
    let head = String::from_utf8_lossy(&answer[..split]).into_owned();
    let lines: Vec<String> = head.lines().map(str::to_owned).collect();
    assert!(
        header(&lines, "transfer-encoding").is_none(),
        "devstack answers with a length: {head}"
    );
    (lines[0].clone(), answer[split..].to_vec())
}

/// The proxy: serves `upstream` (devstack's `host:port`) and rewrites the first non-empty
/// poll answer for `ours` as described above. Returns its base URL and whether it did.
async fn hostile_proxy(upstream: String, ours: &str, other: &str) -> (String, Arc<AtomicBool>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/api", listener.local_addr().unwrap());
    let rewritten = Arc::new(AtomicBool::new(false));
    let done = Arc::clone(&rewritten);
    let poll_ours = format!("GET /api/tasks/poll/batch/{ours}?");
    let other = other.to_owned();
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            let (upstream, poll_ours, other, done) = (
                upstream.clone(),
                poll_ours.clone(),
                other.clone(),
                Arc::clone(&done),
            );
            tokio::spawn(async move {
                let mut conn = BufReader::new(conn);
                while let Some(request) = read_request(&mut conn).await {
                    let (status, mut body) = forward(&upstream, &request).await;
                    if request.lines[0].starts_with(&poll_ours) && !done.load(Ordering::SeqCst) {
                        let mut tasks: Vec<Value> = serde_json::from_slice(&body).unwrap();
                        if !tasks.is_empty() {
                            // Another team's task, polled as the intruder the proxy is.
                            let steal = Request {
                                lines: vec![
                                    format!(
                                        "GET /api/tasks/poll/batch/{other}?workerid=intruder&count=1&timeout=100 HTTP/1.1"
                                    ),
                                    format!("host: {upstream}"),
                                ],
                                body: Vec::new(),
                            };
                            let (_, stolen) = forward(&upstream, &steal).await;
                            let stolen: Vec<Value> = serde_json::from_slice(&stolen).unwrap();
                            assert_eq!(stolen.len(), 1, "the other type's task is queued");
                            tasks.push(tasks[0].clone());
                            tasks.extend(stolen);
                            body = serde_json::to_vec(&tasks).unwrap();
                            done.store(true, Ordering::SeqCst);
                        }
                    }
                    let status = status
                        .split_once(' ')
                        .map_or("200 OK", |(_, s)| s)
                        .to_owned();
                    let head = format!(
                        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                        body.len()
                    );
                    let inner = conn.get_mut();
                    if inner.write_all(head.as_bytes()).await.is_err()
                        || inner.write_all(&body).await.is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    (base, rewritten)
}

/// A poll answer with the runtime's task twice and another type's task after it: the task
/// runs once (one body, one COMPLETED), the other type's task is handed back untouched (not
/// run by this body, not failed or completed), and that type's own worker then takes it, with
/// its workflow still running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poll_answer_with_a_duplicate_and_another_types_task() {
    let conductor = Conductor::start().await;
    let runs = tempfile::tempdir().unwrap();
    let runs_file = runs.path().join("runs");
    let body = format!(
        "read params\nprintf '%s\\n' \"$params\" >> '{}'\nprintf '{{\"ran\": true}}'\n",
        runs_file.display()
    );
    let task = TaskFixture::new("e2e.hostile.ours", &body, "");
    let other = TaskFixture::new("e2e.hostile.theirs", "exit 1\n", "");
    conductor.register(&task).await;
    conductor.register(&other).await;
    let upstream = conductor
        .server
        .base_url()
        .trim_start_matches("http://")
        .trim_end_matches("/api")
        .to_owned();
    let (proxy, rewritten) = hostile_proxy(upstream, &task.name, &other.name).await;
    // Their task waits in their queue before ours is even scheduled.
    let theirs = conductor.start_workflow(&other, json!({"team": "b"})).await;
    // Three slots: before, all three tasks of the answer ran at once.
    let sup = SupervisorProc::start(&task, &conductor, 3, &[("CONDUCTOR_SERVER_URL", &proxy)]);
    let ours = conductor.start_workflow(&task, json!({"team": "a"})).await;
    let wf = conductor
        .wait_terminal(&ours, Duration::from_secs(30))
        .await;
    assert_eq!(wf["status"], "COMPLETED", "{wf}\n{}", sup.log_text());
    assert!(
        rewritten.load(Ordering::SeqCst),
        "the proxy rewrote a poll answer"
    );
    // Their worker polls their task: it is the one the proxy stole, handed back as it was.
    let task_of_theirs = eventually(
        "their task to be back in their queue",
        Duration::from_secs(20),
        || async {
            let polled = conductor
                .client
                .batch_poll(&other.name, "their-worker", 1, Duration::from_millis(100))
                .await
                .unwrap();
            match polled.into_iter().next()? {
                perago_core::conductor::Polled::Task(t) => Some(t.fields),
                other => panic!("{other:?}"),
            }
        },
    )
    .await;
    let wf_theirs = conductor.workflow(&theirs).await;
    assert_eq!(
        wf_theirs["status"],
        "RUNNING",
        "{wf_theirs}\n{}",
        sup.log_text()
    );
    let stolen = &wf_theirs["tasks"][0];
    assert_eq!(task_of_theirs["taskId"], stolen["taskId"]);
    assert_eq!(
        task_of_theirs["pollCount"], 2,
        "polled by the intruder, then by its own worker"
    );
    assert_eq!(stolen["outputData"], json!({}), "its output untouched");
    // Our body ran once, for our task only.
    let ran = std::fs::read_to_string(&runs_file).unwrap();
    assert_eq!(ran.lines().count(), 1, "{ran}\n{}", sup.log_text());
    assert!(ran.contains("\"a\""), "{ran}");
    let log = sup.log_text();
    assert!(
        log.contains("handing back a task of another type without running it")
            && log.contains("e2e.hostile.theirs")
            && log.contains("dropped a task Conductor handed out again"),
        "{log}"
    );
    // Their worker completes it: their workflow ends as theirs to end.
    conductor
        .client
        .update_task(&json!({
            "workflowInstanceId": theirs, "taskId": task_of_theirs["taskId"],
            "status": "COMPLETED", "outputData": {"by": "their worker"}, "workerId": "their-worker"
        }))
        .await
        .unwrap();
    let wf_theirs = conductor
        .wait_terminal(&theirs, Duration::from_secs(10))
        .await;
    assert_eq!(wf_theirs["status"], "COMPLETED", "{wf_theirs}");
}
