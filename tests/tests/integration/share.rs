//! Capacity shared across task types (issue #27 item 1, docs/sharing.md): `start A B --pool N`
//! runs at most N bodies at once across the types, offered by `--priority`. Each body writes
//! its start and end to one ledger; the order and overlap of those lines are the evidence.

use crate::harness::{Conductor, SupervisorProc, TaskFixture};
use serde_json::json;
use std::{path::Path, time::Duration};

/// A body that records `<name> start|end <ns>` around `secs` of work.
fn ledger_body(ledger: &Path, name: &str, secs: &str) -> String {
    let ledger = ledger.display();
    format!(
        "read params\necho \"{name} start $(date +%s%N)\" >> {ledger}\nsleep {secs}\n\
         echo \"{name} end $(date +%s%N)\" >> {ledger}\nprintf '{{}}'\n"
    )
}

/// The ledger's lines as (time, type, is_start), in time order.
fn read_ledger(ledger: &Path) -> Vec<(u128, String, bool)> {
    let mut rows: Vec<(u128, String, bool)> = std::fs::read_to_string(ledger)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut parts = l.split(' ');
            let name = parts.next()?.to_owned();
            let start = parts.next()? == "start";
            let at = parts.next()?.parse().ok()?;
            Some((at, name, start))
        })
        .collect();
    rows.sort();
    rows
}

/// The most bodies running at once.
fn peak(rows: &[(u128, String, bool)]) -> i32 {
    let mut now = 0;
    let mut most = 0;
    for (_, _, start) in rows {
        now += if *start { 1 } else { -1 };
        most = most.max(now);
    }
    most
}

/// Two types with backlogs, both `-j 2`, sharing `--pool 2` with `priority`: the ledger's
/// start order once every task COMPLETED.
async fn run_pool(
    prefix: &str,
    n: usize,
    secs: &str,
    priority: &[&str],
) -> Vec<(u128, String, bool)> {
    let conductor = Conductor::start().await;
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    let critical = TaskFixture::new(
        &format!("{prefix}.critical"),
        &ledger_body(&ledger, "critical", secs),
        "",
    );
    let low = TaskFixture::new(
        &format!("{prefix}.low"),
        &ledger_body(&ledger, "low", secs),
        "",
    );
    conductor.register(&critical).await;
    conductor.register(&low).await;
    // The backlogs wait before the supervisor starts.
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(conductor.start_workflow(&critical, json!({"n": i})).await);
        ids.push(conductor.start_workflow(&low, json!({"n": i})).await);
    }
    let mut args = vec!["--pool", "2"];
    args.extend_from_slice(priority);
    let state = tempfile::tempdir().unwrap();
    let state_home = state.path().to_str().unwrap().to_owned();
    let mut sup = SupervisorProc::start_tasks(
        &[&critical, &low],
        &conductor,
        &["2"],
        &args,
        &[
            ("XDG_STATE_HOME", &state_home),
            // The grants' round trips, for the figures below.
            (
                "RUST_LOG",
                "info,perago_supervisor::runtime::share_task=debug",
            ),
        ],
        None,
        None,
    );
    for id in &ids {
        let wf = conductor.wait_terminal(id, Duration::from_secs(120)).await;
        assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
    }
    // `status` shows each type's permits: within the pool, every start counted.
    let status = perago_tests::Run::of(
        perago_tests::command(crate::harness::SUPERVISOR)
            .args(["status", "--json"])
            .env("XDG_STATE_HOME", &state_home),
    );
    status.expect_code(0);
    let all: serde_json::Value = serde_json::from_str(&status.stdout).unwrap();
    let shares: Vec<&serde_json::Value> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["share"])
        .collect();
    assert_eq!(shares.len(), 2, "{status}");
    assert!(
        shares.iter().all(|s| s["limit"].as_u64().unwrap() <= 2),
        "{status}"
    );
    let started: u64 = shares.iter().map(|s| s["started"].as_u64().unwrap()).sum();
    assert_eq!(started, 2 * n as u64, "{status}");
    let log = sup.log_text();
    assert!(!log.contains("handing a task back"), "no hand-back\n{log}");
    assert!(log.contains("capacity shared across task types"), "{log}");
    // What a permit's round trip costs (Admin.ShareGrant, asked to answered).
    let mut took: Vec<u64> = log
        .lines()
        .filter(|l| l.contains("share grant answered"))
        .filter_map(|l| {
            l.split("took_us=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect();
    took.sort_unstable();
    assert!(!took.is_empty(), "{log}");
    eprintln!(
        "{prefix}: {} grants, round trip median {} us, p90 {} us, max {} us",
        took.len(),
        took[took.len() / 2],
        took[took.len() * 9 / 10],
        took[took.len() - 1]
    );
    sup.signal("TERM");
    let exit = sup.wait_exit(Duration::from_secs(30)).await;
    assert_eq!(exit.code(), Some(0), "{}", sup.log_text());
    let rows = read_ledger(&ledger);
    assert_eq!(rows.len(), 4 * n, "{rows:?}");
    assert!(
        peak(&rows) <= 2,
        "never more than the pool at once: {rows:?}"
    );
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strict_pool_runs_every_critical_task_before_any_low_one() {
    let rows = run_pool("share.strict", 8, "0.2", &[]).await;
    let starts: Vec<&str> = rows
        .iter()
        .filter(|(_, _, start)| *start)
        .map(|(_, name, _)| name.as_str())
        .collect();
    let first_low = starts.iter().position(|n| *n == "low").unwrap();
    assert!(
        starts[first_low..].iter().all(|n| *n == "low"),
        "every critical start comes before the first low one: {starts:?}"
    );
    assert_eq!(first_low, 8, "{starts:?}");
    assert_eq!(peak(&rows), 2, "the pool is used whole: {rows:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weighted_pool_gives_each_type_its_share_of_the_starts() {
    let rows = run_pool("share.weighted", 40, "0.1", &["--priority", "weighted=3,1"]).await;
    let first: Vec<&str> = rows
        .iter()
        .filter(|(_, _, start)| *start)
        .map(|(_, name, _)| name.as_str())
        .take(40)
        .collect();
    let critical = first.iter().filter(|n| **n == "critical").count();
    eprintln!("weighted=3,1: critical took {critical} of the first 40 starts: {first:?}");
    assert!(
        (28..=32).contains(&critical),
        "critical takes 70-80 % of the first 40 starts, took {critical}: {first:?}"
    );
}

#[test]
fn bad_pool_flags_are_usage_errors_naming_the_flag() {
    let a = TaskFixture::new("share.bad.a", "read params\necho '{}'\n", "");
    let b = TaskFixture::new("share.bad.b", "read params\necho '{}'\n", "");
    let cases: [(&[&str], &str); 3] = [
        (
            &["--pool", "2", "--priority", "weighted=3"],
            "--priority weighted=3: 1 weights for 2 task types (share.bad.a, share.bad.b): give one per manifest, in order",
        ),
        (&["--priority", "strict"], "--priority needs --pool N"),
        (
            &["--pool", "0"],
            "--pool 0: the pool needs at least 1 executor",
        ),
    ];
    for (flags, want) in cases {
        let run = perago_tests::Run::of(
            perago_tests::command(crate::harness::SUPERVISOR)
                .arg("start")
                .arg(a.manifest())
                .arg(b.manifest())
                .args(flags)
                .env("CONDUCTOR_SERVER_URL", "http://127.0.0.1:9"),
        );
        run.expect_code(2);
        assert!(run.stderr.contains(want), "{flags:?}: {run}");
    }
}

/// Two types of one concurrency group, each `-j 2` (without the group 4 would run at once),
/// 10 half-second tasks each (the 20 one-second tasks each, shortened for the
/// suite's time): the ledger of starts and ends never shows more than 2 bodies at once.
async fn run_group(
    prefix: &str,
    extra_a: &str,
    extra_b: &str,
    env: &[(&str, &str)],
    args: &[&str],
) {
    let conductor = Conductor::start().await;
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    let a = TaskFixture::new(
        &format!("{prefix}.a"),
        &ledger_body(&ledger, "a", "0.5"),
        extra_a,
    );
    let b = TaskFixture::new(
        &format!("{prefix}.b"),
        &ledger_body(&ledger, "b", "0.5"),
        extra_b,
    );
    conductor.register(&a).await;
    conductor.register(&b).await;
    let mut ids = Vec::new();
    for i in 0..10 {
        ids.push(conductor.start_workflow(&a, json!({"n": i})).await);
        ids.push(conductor.start_workflow(&b, json!({"n": i})).await);
    }
    let mut env = env.to_vec();
    env.push(("PERAGO_METRICS_ADDR", "127.0.0.1:0"));
    let env = env.as_slice();
    let mut sup = SupervisorProc::start_tasks(&[&a, &b], &conductor, &["2"], args, env, None, None);
    for id in &ids {
        let wf = conductor.wait_terminal(id, Duration::from_secs(120)).await;
        assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
    }
    // /metrics shows each member's permits.
    let log = sup.log_text();
    let at = log
        .find("metrics of every task type served at http://")
        .expect("metrics served");
    let rest = &log[at + "metrics of every task type served at http://".len()..];
    let addr = &rest[..rest.find("/metrics").unwrap()];
    let out = std::process::Command::new("curl")
        .args(["-sf", &format!("http://{addr}/metrics")])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    for task in [&a.name, &b.name] {
        for family in ["perago_share_permits", "perago_share_held"] {
            let series = format!("{family}{{task=\"{task}\"}}");
            assert!(text.contains(&series), "{series} in\n{text}");
        }
    }
    let log = sup.log_text();
    assert!(!log.contains("handing a task back"), "no hand-back\n{log}");
    sup.signal("TERM");
    let exit = sup.wait_exit(Duration::from_secs(30)).await;
    assert_eq!(exit.code(), Some(0), "{}", sup.log_text());
    let rows = read_ledger(&ledger);
    assert_eq!(rows.len(), 40, "{rows:?}");
    let peak = peak(&rows);
    eprintln!("{prefix}: peak concurrency {peak}");
    assert_eq!(
        peak, 2,
        "never more than 2 bodies at once, and 2 used: {rows:?}"
    );
    for name in ["a", "b"] {
        assert!(
            rows.iter().any(|(_, n, _)| n == name),
            "{name} ran: {rows:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_group_limit_caps_its_members_together() {
    let group = "concurrency_group = \"providers\"\nconcurrency_limit = 2";
    run_group("share.group", group, group, &[], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_budget_caps_the_summed_cost_in_flight() {
    // Costs 5 and 6 against a budget of 12: two tasks fit at once, never three.
    let a = "concurrency_group = \"providers\"\ncost_units = 5";
    let b = "concurrency_group = \"providers\"\ncost_units = 6";
    run_group(
        "share.budget",
        a,
        b,
        &[("PERAGO_GROUP_BUDGETS", "providers=12")],
        &[],
    )
    .await;
}

#[test]
fn members_that_disagree_on_a_group_limit_stop_start_naming_both_manifests() {
    let a = TaskFixture::new(
        "share.disagree.a",
        "read params\necho '{}'\n",
        "concurrency_group = \"g\"\nconcurrency_limit = 2",
    );
    let b = TaskFixture::new(
        "share.disagree.b",
        "read params\necho '{}'\n",
        "concurrency_group = \"g\"\nconcurrency_limit = 3",
    );
    let run = perago_tests::Run::of(
        perago_tests::command(crate::harness::SUPERVISOR)
            .arg("start")
            .arg(a.manifest())
            .arg(b.manifest())
            .env("CONDUCTOR_SERVER_URL", "http://127.0.0.1:9"),
    );
    assert_ne!(run.code, Some(0), "{run}");
    for manifest in [a.manifest(), b.manifest()] {
        assert!(run.stderr.contains(manifest.to_str().unwrap()), "{run}");
    }
    assert!(
        run.stderr
            .contains("task.concurrency_limit: the members of the concurrency group g disagree"),
        "{run}"
    );
    // `check` says the same, without a server.
    let check = perago_tests::Run::of(
        perago_tests::command(crate::harness::SUPERVISOR)
            .arg("check")
            .arg(a.manifest())
            .arg(b.manifest()),
    );
    assert_ne!(check.code, Some(0), "{check}");
    assert!(
        check
            .stderr
            .contains("the members of the concurrency group g disagree"),
        "{check}"
    );
    for manifest in [a.manifest(), b.manifest()] {
        assert!(check.stderr.contains(manifest.to_str().unwrap()), "{check}");
    }
}

/// An executor killed while its task holds the pool's one permit gives the permit back: the
/// task is retried, and every task of both types completes, never two at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_killed_while_holding_a_permit_releases_it() {
    if crate::harness::thread_mode() {
        // No executor process to kill in thread mode.
        return;
    }
    let conductor = Conductor::start().await;
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    let a = TaskFixture::new("share.kill.a", &ledger_body(&ledger, "a", "1"), "");
    let b = TaskFixture::new("share.kill.b", &ledger_body(&ledger, "b", "0.2"), "");
    conductor.register(&a).await;
    conductor.register(&b).await;
    let mut ids = Vec::new();
    for i in 0..2 {
        ids.push(conductor.start_workflow(&a, json!({"n": i})).await);
        ids.push(conductor.start_workflow(&b, json!({"n": i})).await);
    }
    let mut sup = SupervisorProc::start_tasks(
        &[&a, &b],
        &conductor,
        &["1"],
        &["--pool", "1"],
        &[],
        None,
        None,
    );
    // a (first: strict priority) starts its first task: kill its executor mid-body.
    crate::harness::eventually("a's first start", Duration::from_secs(30), || {
        let started = read_ledger(&ledger).iter().any(|(_, n, s)| n == "a" && *s);
        async move { started.then_some(()) }
    })
    .await;
    let executor = crate::harness::child_named(sup.pid(), "perago-executor-0001@share.kill.a")
        .expect("a's executor");
    crate::harness::signal_pid(executor.pid, "KILL");
    for id in &ids {
        let wf = conductor.wait_terminal(id, Duration::from_secs(60)).await;
        assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
    }
    let mut rows = read_ledger(&ledger);
    // The killed body's start has no end: 5 starts (one retried), 4 ends.
    let starts = rows.iter().filter(|(_, _, s)| *s).count();
    assert_eq!(starts, 5, "{rows:?}");
    // Without it, never more than the pool at once.
    rows.remove(0);
    assert_eq!(peak(&rows), 1, "never more than the pool: {rows:?}");
    sup.signal("TERM");
    let exit = sup.wait_exit(Duration::from_secs(30)).await;
    assert_eq!(exit.code(), Some(0), "{}", sup.log_text());
}

/// Issue #26 item 4: a reload that raises a concurrency group's limit replans the sharing
/// live. Two types in a group of limit 1 at `-j 2` each run one body at a time; once the
/// limit is 3 (both manifests, one reload) more run at once, never above 3; every task
/// COMPLETED, none handed back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_group_limit_replans_the_sharing_live() {
    let conductor = Conductor::start().await;
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    let group = "concurrency_group = \"providers\"\nconcurrency_limit = 1";
    let a = TaskFixture::new("share.live.a", &ledger_body(&ledger, "a", "0.4"), group);
    let b = TaskFixture::new("share.live.b", &ledger_body(&ledger, "b", "0.4"), group);
    conductor.register(&a).await;
    conductor.register(&b).await;
    let mut ids = Vec::new();
    for i in 0..8 {
        ids.push(conductor.start_workflow(&a, json!({"n": i})).await);
        ids.push(conductor.start_workflow(&b, json!({"n": i})).await);
    }
    let mut sup = SupervisorProc::start_tasks(&[&a, &b], &conductor, &["2"], &[], &[], None, None);
    let ws = sup.workspace_root();
    crate::harness::eventually("two bodies done", Duration::from_secs(30), || async {
        (read_ledger(&ledger).iter().filter(|r| !r.2).count() >= 2).then_some(())
    })
    .await;
    for task in [&a, &b] {
        let path = task.manifest();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(
            &path,
            text.replace("concurrency_limit = 1", "concurrency_limit = 3"),
        )
        .unwrap();
    }
    let now_ns = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    };
    let asked = now_ns();
    let run = crate::reload::reload(
        &[
            a.manifest().to_str().unwrap(),
            b.manifest().to_str().unwrap(),
        ],
        &ws,
    );
    let applied = now_ns();
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(
        run.stdout
            .contains("share.live.a: task.concurrency_limit 1 → 3 (applied)"),
        "{run:?}"
    );
    for id in &ids {
        let wf = conductor.wait_terminal(id, Duration::from_secs(120)).await;
        assert_eq!(wf["status"], "COMPLETED", "{wf:#}\n{}", sup.log_text());
    }
    let log = sup.log_text();
    assert!(!log.contains("handing a task back"), "no hand-back\n{log}");
    assert!(
        log.contains("capacity sharing replanned by a reload"),
        "{log}"
    );
    sup.signal("TERM");
    assert_eq!(sup.wait_exit(Duration::from_secs(30)).await.code(), Some(0));
    let rows = read_ledger(&ledger);
    assert_eq!(rows.len(), 32, "{rows:?}");
    let before: Vec<_> = rows.iter().filter(|r| r.0 < asked).cloned().collect();
    assert_eq!(peak(&before), 1, "one at a time before: {rows:?}");
    // Concurrency over the whole run after the reload: the bodies running when it applied
    // count in, then each start and end.
    let mut running = peak_at(&rows, applied);
    let mut most = running;
    for (_, _, start) in rows.iter().filter(|r| r.0 >= applied) {
        running += if *start { 1 } else { -1 };
        most = most.max(running);
    }
    assert!(
        (2..=3).contains(&most),
        "more at once, never above 3: {most} in {rows:?}"
    );
}

/// How many bodies run at `at`.
fn peak_at(rows: &[(u128, String, bool)], at: u128) -> i32 {
    rows.iter()
        .filter(|r| r.0 < at)
        .map(|r| if r.2 { 1 } else { -1 })
        .sum()
}
