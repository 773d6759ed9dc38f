//! Memory-headroom admission (issue 12, item 4): with `PERAGO_MIN_FREE_MEMORY` above the
//! machine's available memory the broker polls nothing and `status` says why; a runtime
//! restarted with a lower threshold runs the queued tasks.

use crate::harness::{Conductor, SupervisorProc, TaskFixture, eventually};
use serde_json::{Value, json};
use std::{
    process::Command,
    time::{Duration, Instant},
};

fn status(sup: &SupervisorProc) -> Option<Value> {
    let socket = sup.workspace_root().join("run/broker.sock");
    let out = Command::new(crate::harness::SUPERVISOR)
        .args(["status", "--json", "--socket", socket.to_str().unwrap()])
        .output()
        .ok()?;
    serde_json::from_slice(&out.stdout).ok()
}

/// The workflow's one task, as Conductor has it.
async fn the_task(conductor: &Conductor, id: &str) -> Value {
    conductor.workflow(id).await["tasks"][0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_task_is_polled_below_the_free_memory_threshold_and_a_lower_one_resumes() {
    let conductor = Conductor::start().await;
    let task = TaskFixture::new("admission.echo", "read p\necho '{}'\n", "");
    conductor.register(&task).await;
    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(conductor.start_workflow(&task, json!({"n": n})).await);
    }
    let mut sup = SupervisorProc::start(
        &task,
        &conductor,
        2,
        &[
            ("PERAGO_MIN_FREE_MEMORY", "100TiB"),
            ("PERAGO_METRICS_ADDR", "127.0.0.1:0"),
        ],
    );
    // Both executors attached and idle, a poll request withheld: admission is what stops it.
    let closed = eventually(
        "idle executors and a withheld poll",
        Duration::from_secs(15),
        || async {
            let s = status(&sup)?;
            let idle = s["slots"].as_array()?.iter().all(|s| s["state"] == "idle");
            (idle && s["counters"]["polls_withheld"].as_u64()? > 0).then_some(s)
        },
    )
    .await;
    let capacity = &closed["capacity"];
    assert_eq!(capacity["admission_open"], false, "{closed:#}");
    assert_eq!(capacity["min_free_memory_bytes"], 100u64 << 40);
    let available = capacity["available_memory_bytes"].as_u64().unwrap();
    assert!(available > 0 && available < 100 << 40, "{closed:#}");
    let reason = capacity["admission_reason"].as_str().unwrap();
    assert!(
        reason.starts_with("available memory ")
            && reason.ends_with(" is below PERAGO_MIN_FREE_MEMORY 100TiB"),
        "{reason}"
    );
    assert!(
        sup.log_text()
            .contains("admission closed: available memory"),
        "{}",
        sup.log_text()
    );
    // /metrics has the gauges.
    let log = sup.log_text();
    let at = log.find("metrics served at ").expect("the metrics address") + 18;
    let url = log[at..].split_whitespace().next().unwrap().to_owned();
    let out = Command::new("curl").args(["-sf", &url]).output().unwrap();
    assert!(out.status.success(), "curl {url} failed");
    let metrics = String::from_utf8(out.stdout).unwrap();
    let label = "{task=\"admission.echo\"}";
    let value = |name: &str| -> Option<u64> {
        let prefix = format!("{name}{label} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
    };
    assert_eq!(value("perago_admission_open"), Some(0), "{metrics}");
    assert!(
        value("perago_available_memory_bytes").unwrap() > 0,
        "{metrics}"
    );
    assert!(
        value("perago_polls_withheld_total").unwrap() >= 1,
        "{metrics}"
    );
    // A window of two seconds (two measurements): nothing is polled, every task waits.
    let window = Instant::now();
    while window.elapsed() < Duration::from_secs(2) {
        let s = status(&sup).expect("status answers");
        assert_eq!(s["counters"]["polls"], 0, "{s:#}");
        assert_eq!(s["capacity"]["admission_open"], false, "{s:#}");
        for id in &ids {
            let t = the_task(&conductor, id).await;
            assert_eq!(t["status"], "SCHEDULED", "{t:#}");
            assert!(t["pollCount"].as_u64().unwrap_or(0) == 0, "{t:#}");
            assert!(t["startTime"].as_u64().unwrap_or(0) == 0, "{t:#}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A drain still ends the runtime cleanly while admission is closed.
    sup.signal("TERM");
    let exit = sup.wait_exit(Duration::from_secs(20)).await;
    assert!(exit.success(), "{exit:?}\n{}", sup.log_text());
    drop(sup);

    let sup = SupervisorProc::start(&task, &conductor, 2, &[("PERAGO_MIN_FREE_MEMORY", "1MiB")]);
    for id in &ids {
        let wf = conductor.wait_terminal(id, Duration::from_secs(20)).await;
        assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
    }
    let s = status(&sup).expect("status answers");
    assert_eq!(s["capacity"]["admission_open"], true, "{s:#}");
    assert_eq!(s["capacity"]["admission_reason"], "", "{s:#}");
    assert!(s["capacity"]["available_memory_bytes"].as_u64().unwrap() >= 1 << 20);
    assert_eq!(s["counters"]["polls_withheld"], 0, "{s:#}");
}
