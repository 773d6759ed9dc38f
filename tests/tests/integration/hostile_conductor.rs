//! The broker against a Conductor that hands out what it should not: a proxy in front of
//! devstack, on a loopback port, rewrites the first non-empty poll answer of the runtime's task
//! type into one that holds its task twice and, after it, a task of another type (another
//! team's, polled from devstack by the proxy). The broker must run its task once and hand the
//! other type's back untouched, for that type's own worker to take. Another mode of the proxy
//! answers the polls with an endless body: the broker refuses each at its limit, keeps its
//! memory, backs off and polls on. A third forges TaskDef answers for `start`'s preflight.

use crate::harness::{Conductor, SupervisorProc, TaskFixture, child_named, eventually};
use serde_json::{Value, json};
use std::sync::{
    Arc,
    atomic::{AtomicBool, AtomicUsize, Ordering},
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

/// What the proxy does to the polls of the runtime's type.
#[derive(Clone)]
enum Mischief {
    /// Rewrites the first non-empty answer into [ours, ours, theirs], `theirs` polled from
    /// the queue of this type; sets the flag once done.
    Rewrite {
        other: String,
        done: Arc<AtomicBool>,
    },
    /// While the flag is set, answers each poll with a chunked body of `[` that goes on for
    /// 1 GiB (or until the client hangs up), counting them.
    Flood {
        on: Arc<AtomicBool>,
        floods: Arc<AtomicUsize>,
    },
    /// Answers `GET /api/metadata/taskdefs/{name}` with 200 and what this gives for `name`.
    TaskDefs(fn(&str) -> String),
}

/// The proxy: serves `upstream` (devstack's `host:port`), doing `mischief` to the polls for
/// `ours`. Returns its base URL.
async fn hostile_proxy(upstream: String, ours: &str, mischief: Mischief) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/api", listener.local_addr().unwrap());
    let poll_ours = format!("GET /api/tasks/poll/batch/{ours}?");
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            let (upstream, poll_ours, mischief) =
                (upstream.clone(), poll_ours.clone(), mischief.clone());
            tokio::spawn(async move {
                let mut conn = BufReader::new(conn);
                while let Some(request) = read_request(&mut conn).await {
                    let poll = request.lines[0].starts_with(&poll_ours);
                    let forged = match &mischief {
                        Mischief::TaskDefs(answer) => request.lines[0]
                            .strip_prefix("GET /api/metadata/taskdefs/")
                            .and_then(|rest| rest.split_once(' '))
                            .map(|(name, _)| answer(name)),
                        _ => None,
                    };
                    if let Mischief::Flood { on, floods } = &mischief
                        && poll
                        && on.load(Ordering::SeqCst)
                    {
                        floods.fetch_add(1, Ordering::SeqCst);
                        flood(conn.get_mut()).await;
                        return;
                    }
                    let (status, mut body) = match forged {
                        Some(body) => ("HTTP/1.1 200 OK".to_owned(), body.into_bytes()),
                        None => forward(&upstream, &request).await,
                    };
                    if let Mischief::Rewrite { other, done } = &mischief
                        && poll
                        && !done.load(Ordering::SeqCst)
                    {
                        body = rewrite(&upstream, other, body, done).await;
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
    base
}

/// A poll answer of 1 GiB, chunked (no length), unless the client hangs up first.
async fn flood(conn: &mut TcpStream) {
    let head =
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
    if conn.write_all(head.as_bytes()).await.is_err() {
        return;
    }
    let chunk = format!("{:x}\r\n{}\r\n", 1 << 20, "[".repeat(1 << 20));
    for _ in 0..1024 {
        if conn.write_all(chunk.as_bytes()).await.is_err() {
            return;
        }
    }
    let _ = conn.write_all(b"0\r\n\r\n").await;
}

/// [ours…, ours[0], theirs] for a non-empty `body`, `theirs` polled from `other`'s queue.
async fn rewrite(upstream: &str, other: &str, body: Vec<u8>, done: &AtomicBool) -> Vec<u8> {
    let mut tasks: Vec<Value> = serde_json::from_slice(&body).unwrap();
    if tasks.is_empty() {
        return body;
    }
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
    let (_, stolen) = forward(upstream, &steal).await;
    let stolen: Vec<Value> = serde_json::from_slice(&stolen).unwrap();
    assert_eq!(stolen.len(), 1, "the other type's task is queued");
    tasks.push(tasks[0].clone());
    tasks.extend(stolen);
    done.store(true, Ordering::SeqCst);
    serde_json::to_vec(&tasks).unwrap()
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
    let rewritten = Arc::new(AtomicBool::new(false));
    let mischief = Mischief::Rewrite {
        other: other.name.clone(),
        done: Arc::clone(&rewritten),
    };
    let proxy = hostile_proxy(upstream, &task.name, mischief).await;
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
    // (Read from the workflow: a polled task keeps only the fields the runtime reads.)
    assert_eq!(
        stolen["pollCount"], 2,
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

/// The peak resident memory (`VmHWM`) of a process, in bytes.
fn peak_rss(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmHWM in /proc/<pid>/status")
        * 1024
}

/// Poll answers of 1 GiB with no length (before, the broker read each whole: 3.2 GB at its
/// peak, 1 GB kept): each is refused at the poll's limit, logged, retried with backoff, and
/// the broker's memory stays far below the answer; once the answers are sane again, tasks run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_poll_answers_are_refused_at_their_limit() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new(
        "e2e.hostile.flood",
        "read params\nprintf '{\"ok\": true}'\n",
        "",
    );
    conductor.register(&task).await;
    let upstream = conductor
        .server
        .base_url()
        .trim_start_matches("http://")
        .trim_end_matches("/api")
        .to_owned();
    let on = Arc::new(AtomicBool::new(true));
    let floods = Arc::new(AtomicUsize::new(0));
    let mischief = Mischief::Flood {
        on: Arc::clone(&on),
        floods: Arc::clone(&floods),
    };
    let proxy = hostile_proxy(upstream, &task.name, mischief).await;
    let sup = SupervisorProc::start(&task, &conductor, 1, &[("CONDUCTOR_SERVER_URL", &proxy)]);
    eventually(
        "three refused poll answers",
        Duration::from_secs(30),
        || async { (floods.load(Ordering::SeqCst) >= 3).then_some(()) },
    )
    .await;
    // In thread mode the broker is a thread of the supervisor: its memory is the process's.
    let broker = child_named(sup.pid(), "perago-broker").map_or(sup.pid(), |p| p.pid);
    let peak = peak_rss(broker);
    // One poll for one task reads at most 48 MiB; a 1 GiB answer never gets near memory.
    assert!(
        peak < 256 << 20,
        "the broker peaked at {peak} bytes\n{}",
        sup.log_text()
    );
    let log = sup.log_text();
    assert!(
        log.contains("poll failed; backing off")
            && log.contains("the answer is larger than 50331648 bytes"),
        "{log}"
    );
    on.store(false, Ordering::SeqCst);
    let id = conductor.start_workflow(&task, json!({})).await;
    let wf = conductor.wait_terminal(&id, Duration::from_secs(60)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf}\n{}", sup.log_text());
}

/// `start`'s preflight takes only a JSON object named as the task for its TaskDef: a server
/// answering `null`, `[]` or another task's TaskDef starts nothing, every problem named
/// (before, each counted as registered and the runtime started).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preflight_takes_only_the_tasks_own_task_def() {
    let conductor = Conductor::start().await;
    let tasks: Vec<TaskFixture> = ["a", "b", "c"]
        .iter()
        .map(|n| TaskFixture::new(&format!("e2e.taskdef.{n}"), "read params\necho '{}'\n", ""))
        .collect();
    for task in &tasks {
        conductor.register(task).await;
    }
    let upstream = conductor
        .server
        .base_url()
        .trim_start_matches("http://")
        .trim_end_matches("/api")
        .to_owned();
    let answer: fn(&str) -> String = |name| match name.rsplit('.').next() {
        Some("a") => "null".to_owned(),
        Some("b") => "[]".to_owned(),
        _ => r#"{"name": "someone.else", "retryCount": 0}"#.to_owned(),
    };
    let proxy = hostile_proxy(upstream, "none", Mischief::TaskDefs(answer)).await;
    let refs: Vec<&TaskFixture> = tasks.iter().collect();
    let mut sup = SupervisorProc::start_many(
        &refs,
        &conductor,
        &["1"],
        &[("CONDUCTOR_SERVER_URL", &proxy)],
    );
    let exit = sup.wait_exit(Duration::from_secs(20)).await;
    let log = sup.log_text();
    assert_eq!(exit.code(), Some(1), "{log}");
    for (name, got) in [
        ("a", "got null".to_owned()),
        ("b", "got an array".to_owned()),
        ("c", r#"got the TaskDef of "someone.else""#.to_owned()),
    ] {
        let expected = format!(
            "error: cannot check TaskDef 'e2e.taskdef.{name}' at {proxy}: GET {proxy}/metadata/taskdefs/e2e.taskdef.{name}: unexpected response: expected the TaskDef of \"e2e.taskdef.{name}\", {got}"
        );
        assert!(log.contains(&expected), "{expected}\n{log}");
    }
    assert!(!log.contains("broker started"), "{log}");
}

/// Issue #23: Conductor answers 200 to an update of an attempt that is no longer in progress
/// and applies nothing; the broker counted such updates as `completed` (304 for 300
/// workflows). Here lease extensions are refused until Conductor times the attempt out
/// (response timeout 2 s), then allowed: the broker's read-back finds the lease lost; the body
/// is then let finish, and its COMPLETED update is answered 200 and ignored. `status` and
/// `/metrics` must count it in `results_ignored`, not in `completed`; a later task that runs
/// undisturbed is counted `completed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_conductor_ignored_is_counted_as_ignored_not_completed() {
    use perago_devstack::faults::FaultSpec;
    const HOLD: &str = r#"read params
case "$params" in
  *hold*)
    touch holding
    i=0
    while [ ! -e release ] && [ $i -lt 1500 ]; do sleep 0.02; i=$((i+1)); done ;;
esac
printf '{"echo": %s}' "$params"
"#;
    let conductor = Conductor::start().await;
    let task = TaskFixture::new(
        "hostile.ignored",
        HOLD,
        "response_timeout_seconds = 2\nretry_count = 0",
    );
    conductor.register(&task).await;
    let sup = SupervisorProc::start(&task, &conductor, 1, &[]);
    let root = sup.workspace_root();
    let counters = |name: &'static str| {
        let root = root.clone();
        move || {
            crate::harness::status_json(&root)["counters"][name]
                .as_u64()
                .unwrap_or(0)
        }
    };
    let held = conductor.start_workflow(&task, json!({"hold": true})).await;
    let holding = task.dir.path().join("holding");
    eventually("the held task to run", Duration::from_secs(20), || async {
        holding.exists().then_some(())
    })
    .await;
    conductor
        .server
        .faults()
        .add(FaultSpec {
            method: Some("POST".into()),
            path: "/api/tasks".into(),
            body_contains: Some("\"extendLease\":true".into()),
            status: Some(503),
            ..FaultSpec::default()
        })
        .unwrap();
    let timed_out = conductor
        .wait_terminal(&held, Duration::from_secs(30))
        .await;
    assert_eq!(
        timed_out["tasks"][0]["status"], "TIMED_OUT",
        "{timed_out:#}"
    );
    conductor.server.faults().clear();
    let leases_lost = counters("leases_lost");
    eventually(
        "the broker to find the lease lost",
        Duration::from_secs(20),
        || async { (leases_lost() >= 1).then_some(()) },
    )
    .await;
    std::fs::write(task.dir.path().join("release"), "").unwrap();
    let ignored = counters("results_ignored");
    eventually(
        "the late result to be counted ignored",
        Duration::from_secs(20),
        || async { (ignored() == 1).then_some(()) },
    )
    .await;
    assert_eq!(counters("completed")(), 0, "{}", sup.log_text());
    sup.log_with("result ignored by Conductor", Duration::from_secs(5))
        .await;
    // Conductor kept the timeout: the late result changed nothing.
    let wf = conductor.workflow(&held).await;
    assert_eq!(wf["tasks"][0]["status"], "TIMED_OUT", "{wf:#}");

    // An undisturbed task is counted as completed, and not read back.
    let ok = conductor.start_workflow(&task, json!({"n": 1})).await;
    let wf = conductor.wait_terminal(&ok, Duration::from_secs(20)).await;
    assert_eq!(wf["status"], "COMPLETED", "{wf:#}");
    let completed = counters("completed");
    eventually(
        "the completion to be counted",
        Duration::from_secs(10),
        || async { (completed() == 1).then_some(()) },
    )
    .await;
    assert_eq!(ignored(), 1);

    // Again, but the body ends while extensions are still refused: no read-back found the
    // lease lost, only failed extensions make the report doubtful, and that is enough.
    std::fs::remove_file(task.dir.path().join("release")).unwrap();
    std::fs::remove_file(&holding).unwrap();
    let held = conductor.start_workflow(&task, json!({"hold": 2})).await;
    eventually(
        "the second held task to run",
        Duration::from_secs(20),
        || async { holding.exists().then_some(()) },
    )
    .await;
    conductor
        .server
        .faults()
        .add(FaultSpec {
            method: Some("POST".into()),
            path: "/api/tasks".into(),
            body_contains: Some("\"extendLease\":true".into()),
            status: Some(503),
            ..FaultSpec::default()
        })
        .unwrap();
    let timed_out = conductor
        .wait_terminal(&held, Duration::from_secs(30))
        .await;
    assert_eq!(
        timed_out["tasks"][0]["status"], "TIMED_OUT",
        "{timed_out:#}"
    );
    std::fs::write(task.dir.path().join("release"), "").unwrap();
    eventually(
        "the second late result to be counted ignored",
        Duration::from_secs(20),
        || async { (ignored() == 2).then_some(()) },
    )
    .await;
    conductor.server.faults().clear();
    assert_eq!(completed(), 1, "{}", sup.log_text());
}
