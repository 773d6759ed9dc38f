//! A full log root (issue #23, smaller item): the runtime keeps running every task, says once
//! on stderr per log file that it drops lines, and counts them in `/metrics`
//! (`perago_log_lines_dropped_total`). The log root is a 64 KiB tmpfs mounted for the test; a
//! machine that refuses the mount (not root, no CAP_SYS_ADMIN) skips it, saying so.

use crate::harness::{Conductor, SupervisorProc, TaskFixture, eventually};
use serde_json::json;
use std::{process::Command, time::Duration};

/// Unmounts the tmpfs when the test ends, however it ends.
struct Mounted(std::path::PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_log_root_loses_no_task_and_says_so_once_per_file_and_in_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs"])
        .arg(&logs)
        .output()
        .unwrap();
    if !mounted.status.success() {
        eprintln!(
            "skipped: cannot mount a tmpfs here ({})",
            String::from_utf8_lossy(&mounted.stderr).trim()
        );
        return;
    }
    let _unmount = Mounted(logs.clone());

    let conductor = Conductor::start().await;
    let task = TaskFixture::new("logroot.echo", "cat\n", "");
    conductor.register(&task).await;
    let sup = SupervisorProc::start_owned(
        &task,
        &conductor,
        2,
        &[
            ("PERAGO_LOG_ROOT", logs.to_str().unwrap().to_owned()),
            ("PERAGO_METRICS_ADDR", "127.0.0.1:0".to_owned()),
        ],
    );
    // Far more lines than 64 KiB holds: every task still completes.
    let mut ids = Vec::new();
    for n in 0..150 {
        ids.push((n, conductor.start_workflow(&task, json!({"n": n})).await));
    }
    for (n, id) in &ids {
        let wf = conductor.wait_terminal(id, Duration::from_secs(60)).await;
        assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
        assert_eq!(wf["output"]["result"], json!({"n": n}), "{wf:#}");
    }

    let log = sup.log_text();
    let at = log.find("metrics served at ").expect("the metrics address") + 18;
    let url = log[at..].split_whitespace().next().unwrap().to_owned();
    let dropped = eventually("dropped lines in /metrics", Duration::from_secs(10), || {
        let url = url.clone();
        async move {
            let out = Command::new("curl").args(["-sf", &url]).output().ok()?;
            let text = String::from_utf8(out.stdout).ok()?;
            let n: u64 = text.lines().find_map(|l| {
                l.strip_prefix("perago_log_lines_dropped_total{task=\"logroot.echo\"} ")?
                    .parse()
                    .ok()
            })?;
            (n > 0).then_some(n)
        }
    })
    .await;
    assert!(dropped > 0);
    // Said on stderr, once per file that started dropping (not once per line).
    let log = sup.log_text();
    let notices: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("dropping its lines until writing works again"))
        .collect();
    assert!(!notices.is_empty(), "{log}");
    let mut files: Vec<&str> = notices
        .iter()
        .map(|l| l.split("cannot write the log file ").nth(1).unwrap_or(l))
        .map(|l| l.split(':').next().unwrap_or(l))
        .collect();
    let said = files.len();
    files.sort_unstable();
    files.dedup();
    assert_eq!(
        files.len(),
        said,
        "a file's drops said more than once:\n{notices:#?}"
    );
    assert!(
        (dropped as usize) > said,
        "{dropped} lines dropped, {said} notices"
    );
}
