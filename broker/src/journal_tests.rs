use super::*;
use serde_json::json;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _, symlink};

fn header(execution_id: &str) -> Header {
    Header {
        task_type: "orders.ship".into(),
        task_id: "t-1".into(),
        workflow_instance_id: "wf-1".into(),
        retry_count: 2,
        execution_id: execution_id.into(),
        worker_id: "ordersship0001".into(),
        status: "COMPLETED".into(),
        published_commit: None,
    }
}

fn body(header: &Header) -> Vec<u8> {
    json!({
        "workflowInstanceId": header.workflow_instance_id,
        "taskId": header.task_id,
        "workerId": header.worker_id,
        "status": header.status,
        "outputData": {"result": {"secret": "s3cr3t"}},
    })
    .to_string()
    .into_bytes()
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

use std::fs;

fn entry(read: Read) -> Entry {
    match read {
        Read::Entry(entry) => *entry,
        Read::Settled => panic!("settled"),
    }
}

#[test]
fn an_entry_is_written_read_back_and_settled_in_a_private_folder() {
    let root = tempfile::tempdir().unwrap();
    let mut journal = Journal::open(root.path(), "orders.ship").unwrap();
    assert_eq!(journal.path(), root.path().join("journal/orders.ship"));
    assert_eq!(mode(&root.path().join("journal")), 0o700);
    assert_eq!(mode(journal.path()), 0o700);
    let h = header("e-1");
    let written = journal.record(&h, &body(&h), false).unwrap();
    let file = journal.path().join("1.entry");
    assert_eq!(mode(&file), 0o600);
    assert_eq!(journal.names().unwrap(), [OsString::from("1.entry")]);
    let read = entry(journal.read("1.entry".as_ref()).unwrap());
    assert_eq!(read.header, h);
    assert_eq!(read.body["outputData"]["result"]["secret"], "s3cr3t");
    assert_eq!(journal.usage().files, 1);
    // Durable entries are the same on disk; a second one in flight takes a second file.
    let mut published = header("e-2");
    published.published_commit = Some("c0ffee".into());
    let durable = journal.record(&published, &body(&published), true).unwrap();
    let read = entry(journal.read("2.entry".as_ref()).unwrap());
    assert_eq!(read.header.published_commit.as_deref(), Some("c0ffee"));
    journal.remove(written);
    journal.remove(durable);
    // Settled: marked, kept for the next entries, holding no bytes of the journal's.
    assert_eq!(journal.read("1.entry".as_ref()).unwrap(), Read::Settled);
    assert_eq!(journal.read("2.entry".as_ref()).unwrap(), Read::Settled);
    assert_eq!(journal.usage().files, 2);
    assert_eq!(journal.usage().bytes, 0);
    // The next entry reuses a file; a shorter entry over a longer one reads back whole.
    let mut short = header("e-3");
    short.worker_id = "w".into();
    let again = journal.record(&short, &body(&short), false).unwrap();
    assert_eq!(fs::read_dir(journal.path()).unwrap().count(), 2);
    let names = journal.names().unwrap();
    let reads: Vec<Read> = names.iter().map(|n| journal.read(n).unwrap()).collect();
    assert!(reads.contains(&Read::Settled), "{reads:?}");
    assert!(
        reads
            .iter()
            .any(|r| matches!(r, Read::Entry(e) if e.header == short)),
        "{reads:?}"
    );
    journal.remove(again);
    // A settled file that held many bytes keeps them while the free files hold little, so
    // the next big entry is written over pages the file has; past that bound it is emptied.
    let big_entry = |id: &str, pad: usize| {
        let h = header(id);
        let mut b: Value = serde_json::from_slice(&body(&h)).unwrap();
        b["outputData"]["result"]["pad"] = json!("x".repeat(pad));
        (h, b.to_string().into_bytes())
    };
    let folder = journal.path().to_owned();
    let sizes = || -> Vec<u64> {
        let mut sizes: Vec<u64> = fs::read_dir(&folder)
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .collect();
        sizes.sort_unstable();
        sizes
    };
    let (h, b) = big_entry("e-4", 200 << 10);
    let w = journal.record(&h, &b, false).unwrap();
    journal.remove(w);
    let kept = sizes();
    assert!(kept[1] > 200 << 10, "{kept:?}");
    assert_eq!(journal.read("1.entry".as_ref()).unwrap(), Read::Settled);
    assert_eq!(journal.usage().free_bytes, kept.iter().sum::<u64>());
    // A smaller big entry goes into the file that holds enough, and reads back whole.
    let (h, b) = big_entry("e-5", 100 << 10);
    let w = journal.record(&h, &b, false).unwrap();
    assert_eq!(sizes(), kept, "written over the big file, none made");
    let reads: Vec<Read> = journal
        .names()
        .unwrap()
        .iter()
        .map(|n| journal.read(n).unwrap())
        .collect();
    assert!(
        reads
            .iter()
            .any(|r| matches!(r, Read::Entry(e) if e.header == h)),
        "{reads:?}"
    );
    // With the free files at their bound, the settled big file is emptied.
    journal.max_free_bytes = 64 << 10;
    journal.remove(w);
    let emptied = sizes();
    assert!(emptied.iter().all(|&s| s < 64 << 10), "{emptied:?}");
    assert_eq!(journal.usage().free_bytes, emptied.iter().sum::<u64>());
    assert_eq!(journal.usage().bytes, 0);
}

#[test]
fn a_reopened_journal_counts_what_it_holds_and_lists_other_types() {
    let root = tempfile::tempdir().unwrap();
    let first = Journal::open(root.path(), "orders.ship").unwrap();
    let h = header("e-1");
    first.record(&h, &body(&h), false).unwrap();
    drop(first);
    Journal::open(root.path(), "other.type").unwrap();
    let again = Journal::open(root.path(), "orders.ship").unwrap();
    assert_eq!(again.usage().files, 1);
    assert!(again.usage().bytes > 0);
    assert_eq!(again.other_types(), ["other.type"]);
}

#[test]
fn bounds_refuse_entries_without_failing_and_reopen_when_room_is_made() {
    let root = tempfile::tempdir().unwrap();
    let mut journal = Journal::open(root.path(), "orders.ship").unwrap();
    journal.max_entries = 2;
    let (a, b, c) = (header("a"), header("b"), header("c"));
    let wa = journal.record(&a, &body(&a), false).unwrap();
    let wb = journal.record(&b, &body(&b), false).unwrap();
    assert!(journal.record(&c, &body(&c), false).is_none());
    assert!(journal.refusing.load(Ordering::Relaxed));
    journal.remove(wa);
    let wc = journal.record(&c, &body(&c), false).unwrap();
    assert!(!journal.refusing.load(Ordering::Relaxed));
    assert_eq!(fs::read_dir(journal.path()).unwrap().count(), 2);

    // Bytes: the total bound, then one entry above the entry bound.
    journal.max_entries = MAX_ENTRIES;
    let used = journal.usage().bytes;
    journal.max_total_bytes = used + 10;
    let d = header("d");
    assert!(journal.record(&d, &body(&d), false).is_none());
    journal.max_total_bytes = MAX_TOTAL_BYTES;
    let huge = vec![b' '; MAX_ENTRY_BYTES + 1];
    assert!(journal.record(&d, &huge, false).is_none());
    assert_eq!(journal.usage().bytes, used);
    assert_eq!(fs::read_dir(journal.path()).unwrap().count(), 2);
    journal.remove(wb);
    journal.remove(wc);
    assert_eq!(journal.usage().bytes, 0);
}

#[test]
fn unusable_files_are_told_apart_from_entries_and_settled_ones() {
    let root = tempfile::tempdir().unwrap();
    let journal = Journal::open(root.path(), "orders.ship").unwrap();
    let dir = journal.path().to_owned();
    let h = header("good");
    let full = encode(&h, &body(&h));
    // Cut short (a partial page written back after a crash): the body is shorter than said.
    fs::write(dir.join("1.entry"), &full[..full.len() - 5]).unwrap();
    fs::write(dir.join("2.entry"), "{}").unwrap();
    let mut other = header("other");
    other.task_type = "another.type".into();
    fs::write(dir.join("3.entry"), encode(&other, &body(&other))).unwrap();
    // A body that is not the update its header names.
    let lie = header("lie");
    let mut forged = header("lie");
    forged.task_id = "t-2".into();
    fs::write(dir.join("4.entry"), encode(&lie, &body(&forged))).unwrap();
    let mut running = header("running");
    running.status = "IN_PROGRESS".into();
    fs::write(dir.join("5.entry"), encode(&running, &body(&running))).unwrap();
    symlink("/etc/passwd", dir.join("6.entry")).unwrap();
    fs::create_dir(dir.join("7.entry")).unwrap();
    fs::write(dir.join("stray.txt"), "x").unwrap();
    // An entry over the tail of a longer one (bytes that are not UTF-8 included).
    let mut good = full.clone();
    good.extend_from_slice(&[0xff, 0xfe, b'}']);
    fs::write(dir.join("8.entry"), &good).unwrap();
    fs::write(dir.join("9.entry"), "#{\"settled\": true}").unwrap();
    fs::write(dir.join("10.entry"), "").unwrap();

    let names = journal.names().unwrap();
    assert_eq!(names.len(), 11, "{names:?}");
    let (mut entries, mut settled) = (0, 0);
    for name in &names {
        match journal.read(name) {
            Ok(Read::Entry(entry)) => {
                assert_eq!(name, "8.entry");
                assert_eq!(entry.header, h);
                entries += 1;
            }
            Ok(Read::Settled) => settled += 1,
            Err(cause) => {
                assert!(!cause.is_empty());
                journal.discard(name);
            }
        }
    }
    assert_eq!((entries, settled), (1, 2));
    fs::write(dir.join("11.entry"), encode(&other, &body(&other))).unwrap();
    let why = journal.read("11.entry".as_ref()).unwrap_err();
    assert!(why.contains("another.type"), "{why}");
    // Every unusable file and the symlink are gone; the folder is left (unlink cannot remove
    // it: it is logged and stays).
    let mut left: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(
        left,
        ["10.entry", "11.entry", "7.entry", "8.entry", "9.entry"]
    );
    // /etc/passwd was not touched through the link.
    assert!(Path::new("/etc/passwd").exists());
}

#[test]
fn the_folders_must_be_ours_and_real_and_are_closed_to_others() {
    let root = tempfile::tempdir().unwrap();
    // A symlink in the journal's place is refused, not followed.
    let elsewhere = tempfile::tempdir().unwrap();
    symlink(elsewhere.path(), root.path().join("journal")).unwrap();
    let err = Journal::open(root.path(), "orders.ship").unwrap_err();
    assert!(matches!(err, JournalError::Open { .. }), "{err}");
    assert!(fs::read_dir(elsewhere.path()).unwrap().next().is_none());
    fs::remove_file(root.path().join("journal")).unwrap();
    // A folder of ours left open to others is closed.
    fs::create_dir(root.path().join("journal")).unwrap();
    fs::set_permissions(
        root.path().join("journal"),
        fs::Permissions::from_mode(0o777),
    )
    .unwrap();
    let journal = Journal::open(root.path(), "orders.ship").unwrap();
    assert_eq!(mode(&root.path().join("journal")), 0o700);
    drop(journal);
    // Another user's folder is refused (as root, give it away).
    if euid() == 0 {
        std::os::unix::fs::chown(root.path().join("journal"), Some(65534), Some(65534)).unwrap();
        let err = Journal::open(root.path(), "orders.ship").unwrap_err();
        assert!(
            matches!(err, JournalError::NotOwned { owner: 65534, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("owned by uid 65534"), "{err}");
        // An entry of another user is not read.
        std::os::unix::fs::chown(root.path().join("journal"), Some(0), Some(0)).unwrap();
        let journal = Journal::open(root.path(), "orders.ship").unwrap();
        let h = header("theirs");
        let path = journal.path().join("1.entry");
        fs::write(&path, encode(&h, &body(&h))).unwrap();
        std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().uid(), 65534);
        assert!(
            journal
                .read("1.entry".as_ref())
                .unwrap_err()
                .contains("owned by uid 65534")
        );
    }
}

fn task(status: &str, retry_count: u32) -> Value {
    json!({
        "taskId": "t-1", "workflowInstanceId": "wf-1", "retryCount": retry_count,
        "taskDefName": "orders.ship", "taskType": "orders.ship", "referenceTaskName": "t",
        "seq": 1, "status": status, "inputData": {"params": {}},
    })
}

#[test]
fn only_the_same_attempt_still_in_progress_is_reported() {
    let h = header("e-1");
    assert_eq!(verdict(&h, &task("IN_PROGRESS", 2)), Verdict::Report);
    let dropped = |task: Value| match verdict(&h, &task) {
        Verdict::Drop(reason) => reason,
        Verdict::Report => panic!("reported: {task}"),
    };
    assert!(dropped(task("COMPLETED", 2)).contains("COMPLETED now"));
    assert!(dropped(task("TIMED_OUT", 2)).contains("TIMED_OUT"));
    assert!(dropped(task("SCHEDULED", 2)).contains("no longer in progress"));
    assert!(dropped(task("IN_PROGRESS", 3)).contains("retry 3 now, not 2"));
    let mut other = task("IN_PROGRESS", 2);
    other["taskId"] = json!("t-9");
    assert!(dropped(other).contains("\"t-9\""));
    let mut other = task("IN_PROGRESS", 2);
    other["workflowInstanceId"] = json!("wf-9");
    assert!(dropped(other).contains("workflow \"wf-9\""));
    let mut other = task("IN_PROGRESS", 2);
    other["taskDefName"] = json!("else");
    assert!(dropped(other).contains("type \"else\""));
    assert!(dropped(json!([1])).contains("not a task"));
    let mut garbled = task("IN_PROGRESS", 2);
    garbled["retryCount"] = json!("two");
    assert!(dropped(garbled).contains("not a task"));
}

/// The header line's text is the journal's format on disk: a journal a broker wrote before
/// this one is replayed by it.
#[test]
fn a_header_line_is_written_as_the_format_says() {
    let mut h = header("e-1");
    assert_eq!(
        h.to_line(12),
        format!(
            r#"{{"format":1,"bodyBytes":12,"taskType":{},"taskId":{},"workflowInstanceId":{},"retryCount":{},"executionId":"e-1","workerId":{},"status":{},"publishedCommit":null}}"#,
            json!(h.task_type),
            json!(h.task_id),
            json!(h.workflow_instance_id),
            h.retry_count,
            json!(h.worker_id),
            json!(h.status),
        )
    );
    h.task_id = "t\"\n".into();
    h.published_commit = Some("c0ffee".into());
    let line = h.to_line(0);
    assert!(line.contains(r#""taskId":"t\"\n""#), "{line}");
    assert!(line.ends_with(r#""publishedCommit":"c0ffee"}"#), "{line}");
}

#[test]
fn headers_round_trip_and_malformed_ones_are_named() {
    let mut h = header("e-1");
    h.published_commit = Some("abc".into());
    assert_eq!(Header::parse(&h.to_line(12)).unwrap(), (h.clone(), 12));
    assert!(Header::parse("nope").unwrap_err().contains("not JSON"));
    assert!(Header::parse("{}").unwrap_err().contains("format"));
    let mut v: Value = serde_json::from_str(&h.to_line(12)).unwrap();
    v["retryCount"] = json!(-1);
    assert!(
        Header::parse(&v.to_string())
            .unwrap_err()
            .contains("retryCount")
    );
    v["retryCount"] = json!(1);
    v["taskId"] = json!("");
    assert!(
        Header::parse(&v.to_string())
            .unwrap_err()
            .contains("taskId")
    );
}

/// A fake Conductor on a loopback port: `GET /api/tasks/{id}` answers `task` (or the status
/// `get_status` with no body), `POST /api/tasks` answers `post_status`; every update body is
/// kept in `posted`.
struct FakeConductor {
    base: String,
    posted: std::sync::Arc<Mutex<Vec<Value>>>,
}

async fn fake_conductor(task: Option<Value>, get_status: u16, post_status: u16) -> FakeConductor {
    use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/api", listener.local_addr().unwrap());
    let posted = std::sync::Arc::new(Mutex::new(Vec::new()));
    let kept = std::sync::Arc::clone(&posted);
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            let (task, kept) = (task.clone(), std::sync::Arc::clone(&kept));
            tokio::spawn(async move {
                let mut conn = BufReader::new(conn);
                loop {
                    let mut head = Vec::new();
                    loop {
                        let mut line = String::new();
                        if conn.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        if line.trim_end().is_empty() {
                            break;
                        }
                        head.push(line.trim_end().to_owned());
                    }
                    let len = head
                        .iter()
                        .find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.eq_ignore_ascii_case("content-length")
                                .then(|| v.trim().parse::<usize>().ok())?
                        })
                        .unwrap_or(0);
                    let mut body = vec![0; len];
                    conn.read_exact(&mut body).await.unwrap();
                    let (status, answer) = if head[0].starts_with("GET /api/tasks/") {
                        match &task {
                            Some(task) if get_status == 200 => (200, task.to_string()),
                            _ => (get_status, String::new()),
                        }
                    } else {
                        kept.lock()
                            .unwrap()
                            .push(serde_json::from_slice(&body).unwrap());
                        (post_status, String::new())
                    };
                    let out = format!(
                        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{answer}",
                        answer.len()
                    );
                    if conn.get_mut().write_all(out.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    FakeConductor { base, posted }
}

async fn replay_against(
    fake: &FakeConductor,
    patience: Duration,
) -> (Replayed, Journal, tempfile::TempDir) {
    let root = tempfile::tempdir().unwrap();
    let journal = Journal::open(root.path(), "orders.ship").unwrap();
    let h = header("e-1");
    journal.record(&h, &body(&h), false).unwrap();
    let client = ConductorClient::new(&fake.base).unwrap();
    let done = replay(&journal, &client, &Backoff::default_remote(), patience).await;
    (done, journal, root)
}

#[tokio::test]
async fn replay_reports_an_attempt_in_progress_and_removes_its_entry() {
    let fake = fake_conductor(Some(task("IN_PROGRESS", 2)), 200, 200).await;
    let (done, journal, _root) = replay_against(&fake, Duration::from_secs(5)).await;
    assert_eq!(done.reported, 1, "{done:?}");
    assert!(journal.names().unwrap().is_empty());
    let posted = fake.posted.lock().unwrap().clone();
    assert_eq!(posted.len(), 1);
    assert_eq!(posted[0]["status"], "COMPLETED");
    assert_eq!(posted[0]["outputData"]["result"]["secret"], "s3cr3t");
}

#[tokio::test]
async fn replay_drops_a_settled_or_unknown_attempt_without_reporting_it() {
    for fake in [
        fake_conductor(Some(task("COMPLETED", 2)), 200, 200).await,
        fake_conductor(Some(task("IN_PROGRESS", 3)), 200, 200).await,
        fake_conductor(None, 404, 200).await,
    ] {
        let (done, journal, _root) = replay_against(&fake, Duration::from_secs(5)).await;
        assert_eq!(done.dropped, 1, "{done:?}");
        assert!(journal.names().unwrap().is_empty());
        assert!(fake.posted.lock().unwrap().is_empty());
    }
    // Conductor refuses the update for good: dropped too.
    let fake = fake_conductor(Some(task("IN_PROGRESS", 2)), 200, 400).await;
    let (done, journal, _root) = replay_against(&fake, Duration::from_secs(5)).await;
    assert_eq!(done.dropped, 1, "{done:?}");
    assert!(journal.names().unwrap().is_empty());
}

#[tokio::test]
async fn replay_leaves_the_entry_when_conductor_does_not_answer_in_time() {
    for fake in [
        fake_conductor(None, 503, 200).await,
        fake_conductor(Some(task("IN_PROGRESS", 2)), 200, 503).await,
    ] {
        let started = Instant::now();
        let (done, journal, _root) = replay_against(&fake, Duration::from_secs(2)).await;
        assert!(started.elapsed() < Duration::from_secs(4));
        assert_eq!(done.left, 1, "{done:?}");
        assert_eq!(journal.names().unwrap(), [OsString::from("1.entry")]);
    }
}
