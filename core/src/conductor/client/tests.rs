use super::*;
use crate::attempt::TaskRef;
use crate::conductor::{Polled, TaskTypes};
use crate::url::encode_segment as segment;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// Reads one request (head and `Content-Length` body) from `conn`; `None` at EOF.
async fn read_request(conn: &mut TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if conn.read(&mut byte).await.ok()? == 0 {
            return None;
        }
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let len = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    conn.read_exact(&mut body).await.ok()?;
    Some(head.lines().next().unwrap_or_default().to_owned())
}

/// A raw loopback HTTP server: each connection's requests are answered in turn by
/// `answer(request_line, n)`, `n` counting requests over all connections; the raw bytes
/// are written as they are. Returns the base URL.
async fn raw_server(answer: impl Fn(&str, usize) -> Vec<u8> + Send + Sync + 'static) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let answer = Arc::new(answer);
    let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let answer = Arc::clone(&answer);
            let count = Arc::clone(&count);
            tokio::spawn(async move {
                while let Some(line) = read_request(&mut conn).await {
                    let n = count.fetch_add(1, Ordering::SeqCst);
                    let out = answer(&line, n);
                    // The head first, the rest a moment later (as its own segment): the
                    // client has the whole answer the head announces before the rest.
                    let split = out
                        .windows(4)
                        .position(|w| w == b"\r\n\r\n")
                        .map_or(out.len(), |at| at + 4);
                    if conn.write_all(&out[..split]).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    if conn.write_all(&out[split..]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    format!("http://{addr}/api")
}

fn response(status: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A 204 that carries a body (which HTTP forbids) must not leave that body on the
/// connection to be read as the answer to the next request: here the body is a whole
/// forged answer with a task in it.
#[tokio::test]
async fn a_204_with_a_body_does_not_desynchronise_the_next_answer() {
    let forged = response(
        "200 OK",
        r#"[{"taskId":"forged","workflowInstanceId":"wf","taskType":"t"}]"#,
    );
    let base = raw_server(move |line, _| {
        if line.starts_with("POST") {
            let mut out = format!(
                "HTTP/1.1 204 No Content\r\nContent-Length: {}\r\n\r\n",
                forged.len()
            )
            .into_bytes();
            out.extend_from_slice(&forged);
            out
        } else {
            response("200 OK", "[]")
        }
    })
    .await;
    let client = ConductorClient::new(&base).unwrap();
    for _ in 0..20 {
        let next = client
            .update_task_v2(&json_result())
            .await
            .expect("a 204 is no next task");
        assert_eq!(next, None);
        let polled = client
            .batch_poll("t", "w", 1, Duration::from_millis(1))
            .await;
        assert!(
            matches!(&polled, Ok(tasks) if tasks.is_empty()),
            "the poll read the forged answer: {polled:?}"
        );
    }
}

/// A loopback server that answers every request with `head` and then, unless `head`
/// has a `Content-Length`, an endless chunked body of `[`; returns the base URL and how
/// many body bytes it managed to write.
async fn flooding_server(head: &'static str) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let written = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let total = Arc::clone(&written);
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let written = Arc::clone(&total);
            tokio::spawn(async move {
                if read_request(&mut conn).await.is_some() {
                    if conn.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    let chunk = format!("{:x}\r\n{}\r\n", 64 << 10, "[".repeat(64 << 10));
                    loop {
                        if conn.write_all(chunk.as_bytes()).await.is_err() {
                            return;
                        }
                        written.fetch_add(64 << 10, Ordering::SeqCst);
                    }
                }
            });
        }
    });
    (format!("http://{addr}/api"), written)
}

/// Issue #24, item 7: the deprecated `/tasks/queue/sizes` gets the name twice, so a
/// Spring server binds it whole (a single `taskType=x,y` is split into `x` and `y`), and
/// an answer without the name's key is an error, not a count.
#[tokio::test]
async fn queue_sizes_sends_the_name_so_that_spring_does_not_split_it() {
    let base = raw_server(|line, n| {
        let whole = "GET /api/tasks/queue/sizes?taskType=x%2Cy&taskType=x%2Cy HTTP/1.1";
        match (n, line == whole) {
            (0, true) => response("200 OK", r#"{"x,y": 3}"#),
            // What Spring answers to a single `taskType=x,y`.
            (1, true) => response("200 OK", r#"{"x": 1, "y": 2}"#),
            _ => response("400 Bad Request", &format!("{line:?}")),
        }
    })
    .await;
    let client = ConductorClient::new(&base).unwrap();
    assert_eq!(client.queue_sizes("x,y").await.unwrap(), 3);
    let err = client.queue_sizes("x,y").await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("GET {base}/tasks/queue/sizes: unexpected response: expected {{\"x,y\": <count>}}")
    );
}

/// An answer that comes in many chunks of many sizes, one byte among them, is read whole and
/// in order.
#[tokio::test]
async fn an_answer_in_many_chunks_is_read_whole() {
    let base = raw_server(|_, _| {
        let body = format!(r#"{{"t": {}7}}"#, " ".repeat(300_000));
        let mut out =
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                .to_vec();
        let mut rest = body.as_bytes();
        let mut size = 1;
        while !rest.is_empty() {
            let (chunk, after) = rest.split_at(size.min(rest.len()));
            out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
            out.extend_from_slice(chunk);
            out.extend_from_slice(b"\r\n");
            rest = after;
            size = size * 3 % 65_537 + 1;
        }
        out.extend_from_slice(b"0\r\n\r\n");
        out
    })
    .await;
    let client = ConductorClient::new(&base).unwrap();
    assert_eq!(client.queue_sizes("t").await.unwrap(), 7);
}

/// An answer without `Content-Length` that never ends is read up to the request's
/// limit and refused, naming the request and the limit; the server is cut off there.
#[tokio::test]
async fn an_endless_answer_is_refused_at_its_limit() {
    let (base, written) = flooding_server(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
    )
    .await;
    let client = ConductorClient::new(&base).unwrap();
    let err = client.queue_sizes("t").await.unwrap_err();
    assert!(
        matches!(err, ConductorError::TooLarge { limit, .. } if limit == MAX_SMALL_ANSWER),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "GET {base}/tasks/queue/sizes: HTTP 200: the answer is larger than 1048576 bytes, the most read for this request; refused"
        )
    );
    assert!(err.is_retryable());
    let err = client
        .batch_poll("t", "w", 1, Duration::from_millis(1))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ConductorError::TooLarge { limit, .. } if limit == max_poll_answer(1)),
        "{err:?}"
    );
    // What the server wrote past the limit is what the sockets buffered, no more.
    let sent = written.load(Ordering::SeqCst);
    assert!(
        sent < MAX_SMALL_ANSWER + max_poll_answer(1) + (32 << 20),
        "the server wrote {sent} bytes"
    );
    // An update-v2 whose next task is too large was applied: no error, an undecodable
    // next task naming the limit.
    match client.update_task_v2(&json_result()).await {
        Ok(Some(Polled::Undecodable {
            ids: None, problem, ..
        })) => {
            assert!(problem.contains(&MAX_TASK_ANSWER.to_string()), "{problem}");
        }
        other => panic!("{other:?}"),
    }
    client
        .update_task(&json_result())
        .await
        .expect("a v1 update was applied");
}

/// An answer declaring a length above the limit is refused before any of it is read.
#[tokio::test]
async fn an_answer_declared_too_large_is_refused_unread() {
    let (base, _) = flooding_server(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1073741824\r\n\r\n",
    )
    .await;
    let client = ConductorClient::new(&base).unwrap();
    let started = Instant::now();
    for _ in 0..3 {
        let err = client.get_task("t-1").await.unwrap_err();
        assert!(
            matches!(err, ConductorError::TooLarge { limit, .. } if limit == MAX_TASK_ANSWER),
            "{err:?}"
        );
    }
    assert!(started.elapsed() < Duration::from_secs(5));
    // An error answer is cut short, not refused: its status is what counts.
    let (base, _) =
        flooding_server("HTTP/1.1 500 Internal Server Error\r\nTransfer-Encoding: chunked\r\n\r\n")
            .await;
    let err = ConductorClient::new(&base)
        .unwrap()
        .get_task("t-1")
        .await
        .unwrap_err();
    match &err {
        ConductorError::Status {
            status: 500, body, ..
        } => {
            assert!(
                body.len() <= MAX_ERROR_BODY + '…'.len_utf8(),
                "{}",
                body.len()
            );
        }
        other => panic!("{other:?}"),
    }
}

/// Only an object named as the task is its TaskDef; `null`, `[]` or another task's
/// TaskDef are errors saying what came (before, each counted as registered).
#[tokio::test]
async fn only_an_object_with_the_tasks_name_is_its_task_def() {
    let answers = [
        (r#"{"name": "t", "retryCount": 0}"#, None),
        ("null", Some("got null")),
        ("[]", Some("got an array")),
        (r#"[{"name": "t"}]"#, Some("got an array")),
        (
            r#"{"name": "other"}"#,
            Some(r#"got the TaskDef of "other""#),
        ),
        (r#"{"name": 5}"#, Some("got an object whose name is 5")),
        ("{}", Some("got an object without a name")),
        (r#""t""#, Some(r#"got "t""#)),
    ];
    let base = raw_server(move |_, n| response("200 OK", answers[n % answers.len()].0)).await;
    let client = ConductorClient::new(&base).unwrap();
    for (answer, problem) in answers {
        let got = client.get_task_def("t").await;
        match problem {
            None => assert_eq!(got.unwrap().unwrap()["name"], "t"),
            Some(problem) => {
                let err = got.unwrap_err();
                assert_eq!(
                    err.to_string(),
                    format!(
                        "GET {base}/metadata/taskdefs/t: unexpected response: expected the TaskDef of \"t\", {problem}"
                    ),
                    "{answer}"
                );
                assert!(!err.is_retryable());
            }
        }
    }
}

#[test]
fn poll_limits_grow_with_the_count_and_saturate() {
    assert_eq!(max_poll_answer(0), 2 * MAX_TASK_ANSWER);
    assert_eq!(max_poll_answer(1), 2 * MAX_TASK_ANSWER);
    assert_eq!(max_poll_answer(4), 5 * MAX_TASK_ANSWER);
    assert_eq!(
        max_poll_answer(u32::MAX),
        (usize::try_from(u32::MAX).unwrap() + 1).saturating_mul(MAX_TASK_ANSWER)
    );
}

fn json_result() -> Value {
    serde_json::json!({"taskId": "t-1", "workflowInstanceId": "wf-1", "status": "COMPLETED"})
}

#[test]
fn request_urls_are_what_parsing_the_whole_text_gives() {
    for base in [
        "http://127.0.0.1:8080/api",
        "https://conductor.example.com/api",
        "http://host:1",
        "http://bücher.example/prefix/api",
    ] {
        let parsed = reqwest::Url::parse(base).unwrap();
        for path in [
            "/tasks/update-v2",
            "/tasks/poll/batch/a%20b%2Fc",
            &format!("/tasks/{}", segment("id with spaces/and?query#frag")),
            "/tasks/queue/sizes",
        ] {
            assert_eq!(
                request_url(&parsed, path),
                reqwest::Url::parse(&format!("{base}{path}")).unwrap(),
                "{base} + {path}"
            );
        }
    }
}

#[test]
fn base_urls() {
    assert_eq!(
        ConductorClient::new("http://127.0.0.1:8080/api/")
            .unwrap()
            .base_url(),
        "http://127.0.0.1:8080/api"
    );
    assert_eq!(
        ConductorClient::new("localhost:8080")
            .unwrap_err()
            .to_string(),
        "CONDUCTOR_SERVER_URL \"localhost:8080\" is invalid: expected an http:// or https:// URL including /api"
    );
    assert!(ConductorClient::new("http:///api").is_err());
    assert!(ConductorClient::new("https:///api").is_err());
    assert_eq!(
        ConductorClient::new("https://conductor.example.com/api")
            .unwrap()
            .base_url(),
        "https://conductor.example.com/api"
    );
}

#[test]
fn from_lookup() {
    let vars = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    };
    let client =
        ConductorClient::from_lookup(vars(&[("CONDUCTOR_SERVER_URL", "http://127.0.0.1:1/api")]))
            .unwrap();
    assert!(!client.has_credentials());
    let client = ConductorClient::from_lookup(vars(&[
        ("CONDUCTOR_SERVER_URL", "https://c.example.com/api"),
        ("CONDUCTOR_AUTH_KEY", "id"),
        ("CONDUCTOR_AUTH_SECRET", "s3cret"),
    ]))
    .unwrap();
    assert!(client.has_credentials());
    let debug = format!("{client:?}");
    assert!(
        debug.contains("\"id\"") && !debug.contains("s3cret"),
        "{debug}"
    );
    let err = ConductorClient::from_lookup(vars(&[
        ("CONDUCTOR_SERVER_URL", "http://127.0.0.1:1/api"),
        ("CONDUCTOR_AUTH_SECRET", "s3cret"),
    ]))
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "CONDUCTOR_AUTH_SECRET is set but CONDUCTOR_AUTH_KEY is not: set both to authenticate, or neither"
    );
    assert!(matches!(
        ConductorClient::from_lookup(vars(&[])),
        Err(ClientConfigError::Url(_))
    ));
}

/// A polled task is refused with the errors parsing it gives (depth, syntax, numbers),
/// its ids read when they can be.
#[test]
fn polled_tasks_are_checked_as_parsing_checks_them() {
    let task = |input: &str| {
        format!(
            r#"{{"taskId": "t-1", "workflowInstanceId": "wf-1", "inputData": {{"params": {input}}}}}"#
        )
    };
    let ids = Some(TaskRef {
        task_id: "t-1".into(),
        workflow_instance_id: "wf-1".into(),
    });
    for input in [
        format!("{}1{}", "[".repeat(1000), "]".repeat(1000)),
        "1e400".to_owned(),
        r#""\ud800""#.to_owned(),
    ] {
        let text = task(&input);
        assert_eq!(
            Polled::decode(&text),
            Polled::Undecodable {
                ids: ids.clone(),
                types: TaskTypes::default(),
                problem: crate::json::from_str(&text).unwrap_err().to_string(),
            },
            "{}",
            &text[..text.len().min(80)]
        );
    }
    assert!(matches!(
        Polled::decode(&task("[1,")),
        Polled::Undecodable { ids: None, .. }
    ));
    // Broken anywhere, not only in the input: the error parsing gives.
    for text in [
        format!("{} x", task("{}")),
        format!("{}}}", task("{}")),
        r#"{"taskId": "t", "seq": 1e400, "inputData": {}}"#.to_owned(),
        r#"{"taskId": "t", "seq": [1,], "inputData": {}}"#.to_owned(),
        r#"{"taskId": "t", "seq": 1 2, "inputData": {}}"#.to_owned(),
        r#"{"taskId": "t",, "inputData": {}}"#.to_owned(),
        r#"{"taskId": "t", "inputData": {},}"#.to_owned(),
        r#"{"taskId" "t"}"#.to_owned(),
        r#"{"taskId": "t", "inputData": }"#.to_owned(),
        r#"{"taskId": "t", "inputData": {"a": "\ud800"}}"#.to_owned(),
        "{\"task\tId\": \"t\"}".to_owned(),
        r#"{"task\qId": "t"}"#.to_owned(),
        r#"{"taskId": "t", "x": "unterminated}"#.to_owned(),
        r#"{"taskId": "t"]"#.to_owned(),
        "{".to_owned(),
        " ".to_owned(),
    ] {
        let expected = crate::json::from_str(&text).unwrap_err().to_string();
        match Polled::decode(&text) {
            Polled::Undecodable { problem, .. } => assert_eq!(problem, expected, "{text}"),
            other => panic!("{text}: {other:?}"),
        }
        match Polled::decode_owned(text.clone(), 0..text.len()) {
            Polled::Undecodable { problem, .. } => assert_eq!(problem, expected, "{text}"),
            other => panic!("{text}: {other:?}"),
        }
    }
    assert_eq!(
        Polled::decode("[1]"),
        Polled::Undecodable {
            ids: None,
            types: TaskTypes::default(),
            problem: "a polled task is not a JSON object".to_owned(),
        }
    );
    // Taking the buffer over answers the same, for a task anywhere in it.
    for input in ["{\"n\": 1.50}", "1e400", "[1,", "{}"] {
        let text = task(input);
        let framed = format!("[ {text} ]");
        assert_eq!(
            Polled::decode_owned(framed.clone(), 2..2 + text.len()),
            Polled::decode(&text),
            "{text}"
        );
        assert_eq!(
            Polled::decode_owned(text.clone(), 0..text.len()),
            Polled::decode(&text)
        );
    }
    assert_eq!(
        Polled::decode_owned("[[1]]".to_owned(), 1..4),
        Polled::decode("[1]")
    );
    let Polled::Task(ok) = Polled::decode(&task("{\"n\": 1.50}")) else {
        panic!("a good task is decoded");
    };
    assert_eq!(ok.fields.get("taskId"), Some(&serde_json::json!("t-1")));
    assert_eq!(
        ok.input_data.unwrap().as_str(),
        r#"{"params": {"n": 1.50}}"#
    );
}

/// Issue #26, item 1: a poll in a domain asks for it (`&domain=`), and the queue depth is
/// that of the domain's queue on both routes (`/queue/sizes` takes the queue name
/// `domain:type`); without a domain nothing about one is sent.
#[tokio::test]
async fn a_domain_is_in_the_poll_and_in_both_depth_reads() {
    let base = raw_server(|line, _| match line {
        "GET /api/tasks/poll/batch/t?workerid=w&domain=blue&count=2&timeout=1 HTTP/1.1" => {
            response("200 OK", "[]")
        }
        "GET /api/tasks/poll/batch/t?workerid=w&count=2&timeout=1 HTTP/1.1" => {
            response("200 OK", "[]")
        }
        "GET /api/tasks/queue/size?taskType=t&domain=blue HTTP/1.1" => response("200 OK", "4"),
        "GET /api/tasks/queue/size?taskType=t HTTP/1.1" => response("200 OK", "9"),
        "GET /api/tasks/queue/sizes?taskType=blue%3At&taskType=blue%3At HTTP/1.1" => {
            response("200 OK", r#"{"blue:t": 5}"#)
        }
        _ => response("400 Bad Request", &format!("{line:?}")),
    })
    .await;
    let client = ConductorClient::new(&base).unwrap();
    let blue = crate::conductor::Domain::parse("blue").unwrap();
    let wait = Duration::from_millis(1);
    assert!(
        client
            .batch_poll_in("t", Some(&blue), "w", 2, wait)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        client
            .batch_poll("t", "w", 2, wait)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(client.queue_size_in("t", Some(&blue)).await.unwrap(), 4);
    assert_eq!(client.queue_size("t").await.unwrap(), 9);
    assert_eq!(client.queue_sizes_in("t", Some(&blue)).await.unwrap(), 5);
}
