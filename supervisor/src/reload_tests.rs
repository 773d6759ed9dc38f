//! The classification of a re-read manifest's changes ([`diff`]) and the refusals it makes.

use super::*;
use std::path::Path;

const BASE: &str = r#"[task]
name = "orders.ship"
kind = "workspace-free"
timeout_seconds = 6000
retry_count = 2

[body]
command = ["sh", "body.sh"]
soft_time_limit = "50m"
"#;

fn manifest(text: &str) -> Manifest {
    Manifest::parse(Path::new("task.toml"), Path::new("/srv"), text).unwrap()
}

fn edited(from: &str, to: &str) -> Manifest {
    assert!(BASE.contains(from), "{from}");
    manifest(&BASE.replacen(from, to, 1))
}

fn fields(changes: &Changes) -> Vec<(&'static str, Class)> {
    changes.changes.iter().map(|c| (c.field, c.class)).collect()
}

#[test]
fn an_unchanged_manifest_changes_nothing() {
    let changes = diff(&manifest(BASE), &manifest(BASE));
    assert!(changes.is_empty(), "{changes:?}");
    assert!(changes.refusals().is_empty());
    // [dev] is `dev`'s only.
    let dev = manifest(&format!("{BASE}\n[dev]\nrepository = \"other\"\n"));
    assert!(diff(&manifest(BASE), &dev).is_empty());
}

#[test]
fn the_soft_limit_applies_live() {
    let changes = diff(
        &manifest(BASE),
        &edited("soft_time_limit = \"50m\"", "soft_time_limit = \"40m\""),
    );
    assert_eq!(fields(&changes), [("body.soft_time_limit", Class::Live)]);
    assert_eq!(
        (
            changes.changes[0].old.as_str(),
            changes.changes[0].new.as_str()
        ),
        ("\"50m\"", "\"40m\"")
    );
    assert!(changes.refusals().is_empty());
    let removed = diff(&manifest(BASE), &edited("soft_time_limit = \"50m\"\n", ""));
    assert_eq!(fields(&removed), [("body.soft_time_limit", Class::Live)]);
    assert_eq!(removed.changes[0].new, "none");
}

#[test]
fn taskdef_fields_are_refused_naming_the_field() {
    for (from, to, field) in [
        (
            "timeout_seconds = 6000",
            "timeout_seconds = 9000",
            "task.timeout_seconds",
        ),
        ("retry_count = 2", "retry_count = 5", "task.retry_count"),
        (
            "retry_count = 2",
            "retry_count = 2\nretry_logic = \"LINEAR_BACKOFF\"",
            "task.retry_logic",
        ),
        (
            "retry_count = 2",
            "retry_count = 2\nretry_delay_seconds = 5",
            "task.retry_delay_seconds",
        ),
        (
            "retry_count = 2",
            "retry_count = 2\ntimeout_policy = \"RETRY\"",
            "task.timeout_policy",
        ),
        (
            "retry_count = 2",
            "retry_count = 2\nresponse_timeout_seconds = 120",
            "task.response_timeout_seconds",
        ),
        (
            "retry_count = 2",
            "retry_count = 2\ndescription = \"ships\"",
            "task.description",
        ),
        (
            "retry_count = 2",
            "retry_count = 2\nowner_email = \"a@b.c\"",
            "task.owner_email",
        ),
        (
            "name = \"orders.ship\"",
            "name = \"orders.send\"",
            "task.name",
        ),
    ] {
        let changes = diff(&manifest(BASE), &edited(from, to));
        assert_eq!(fields(&changes), [(field, Class::TaskDef)], "{to}");
        let refusals = changes.refusals();
        assert_eq!(refusals.len(), 1);
        assert!(
            refusals[0].starts_with(&format!("orders.ship: {field} changed (")),
            "{refusals:?}"
        );
        assert!(refusals[0].contains("needs a new TaskDef"), "{refusals:?}");
    }
    let refusal = &diff(
        &manifest(BASE),
        &edited("timeout_seconds = 6000", "timeout_seconds = 9000"),
    )
    .refusals()[0];
    assert!(
        refusal.starts_with(
            "orders.ship: task.timeout_seconds changed (6000 → 9000) — needs a new TaskDef"
        ),
        "{refusal}"
    );
}

/// A key `extract` adds to the TaskDef one day is classified here too, or this fails.
#[test]
fn every_taskdef_key_is_classified() {
    let full = BASE.replace(
        "retry_count = 2",
        "retry_count = 2\ndescription = \"d\"\nowner_email = \"a@b.c\"",
    );
    let def = perago_core::taskdef::task_def(&manifest(&full));
    for key in def.as_object().unwrap().keys() {
        assert!(
            TASKDEF_KEYS.contains(&key.as_str())
                || ["inputSchema", "outputSchema", "enforceSchema"].contains(&key.as_str()),
            "{key} is not classified"
        );
    }
}

#[test]
fn the_kind_is_one_taskdef_field() {
    let workspace = BASE.replace("workspace-free", "workspace");
    let changes = diff(&manifest(BASE), &manifest(&workspace));
    assert_eq!(fields(&changes), [("task.kind", Class::TaskDef)]);
    assert_eq!(
        (
            changes.changes[0].old.as_str(),
            changes.changes[0].new.as_str()
        ),
        ("\"workspace-free\"", "\"workspace\"")
    );
}

#[test]
fn body_changes_roll() {
    for (from, to, field) in [
        (
            "command = [\"sh\", \"body.sh\"]",
            "command = [\"sh\", \"body2.sh\"]",
            "body.command",
        ),
        (
            "command = [\"sh\", \"body.sh\"]",
            "command = [\"sh\", \"body.sh\"]\nprotocol = \"jsonl\"",
            "body.protocol",
        ),
        (
            "command = [\"sh\", \"body.sh\"]",
            "command = [\"sh\", \"body.sh\"]\nenv = { MODE = \"fast\" }",
            "body.env",
        ),
        (
            "command = [\"sh\", \"body.sh\"]",
            "command = [\"sh\", \"body.sh\"]\nuser = \"nobody\"",
            "body.user",
        ),
        (
            "soft_time_limit = \"50m\"",
            "soft_time_limit = \"50m\"\n\n[guardrails]\npre = [\"./pre.sh\"]",
            "guardrails.pre",
        ),
        (
            "soft_time_limit = \"50m\"",
            "soft_time_limit = \"50m\"\n\n[guardrails]\npost = [\"./post.sh\"]",
            "guardrails.post",
        ),
    ] {
        let changes = diff(&manifest(BASE), &edited(from, to));
        assert_eq!(fields(&changes), [(field, Class::Body)], "{to}");
        // Not refused here: the runtime rolls it (or says why it cannot).
        assert!(
            changes.refusals().is_empty(),
            "{to}: {:?}",
            changes.refusals()
        );
    }
    // A Rust task binary in place of the command: both keys change.
    let binary = diff(
        &manifest(BASE),
        &edited(
            "command = [\"sh\", \"body.sh\"]",
            "executor = \"/bin/task\"",
        ),
    );
    assert_eq!(
        fields(&binary),
        [
            ("body.command", Class::Body),
            ("body.protocol", Class::Body),
            ("body.executor", Class::Body)
        ]
    );
}

#[test]
fn schemas_roll_with_the_body() {
    let tmp = tempfile::tempdir().unwrap();
    let write = |schema: &str| {
        std::fs::write(tmp.path().join("params.json"), schema).unwrap();
        let path = tmp.path().join("task.toml");
        std::fs::write(
            &path,
            BASE.replace(
                "retry_count = 2",
                "retry_count = 2\nparams_schema = \"params.json\"",
            ),
        )
        .unwrap();
        Manifest::load(&path).unwrap()
    };
    let old = write(r#"{"type": "object"}"#);
    let new = write(r#"{"type": "object", "required": ["n"]}"#);
    let changes = diff(&old, &new);
    assert_eq!(fields(&changes), [("task.params_schema", Class::Body)]);
    assert!(changes.changes[0].new.contains("(edited)"), "{changes:?}");
}

#[test]
fn every_change_is_listed_at_once() {
    let text = BASE
        .replace("timeout_seconds = 6000", "timeout_seconds = 9000")
        .replace("body.sh", "other.sh")
        .replace("50m", "10m");
    let changes = diff(&manifest(BASE), &manifest(&text));
    assert_eq!(
        fields(&changes),
        [
            ("task.timeout_seconds", Class::TaskDef),
            ("body.command", Class::Body),
            ("body.soft_time_limit", Class::Live),
        ]
    );
    // The TaskDef field is refused; the body rolls and the soft limit applies live.
    assert_eq!(changes.refusals().len(), 1);
    assert_eq!(changes.of(Class::Live).count(), 1);
}

#[test]
fn the_report_says_what_happened() {
    let refused = ReloadReport::Refused {
        problems: vec!["a: x".to_owned(), "b: y".to_owned()],
    };
    assert!(!refused.ok());
    assert_eq!(
        refused.lines(),
        [
            "reload refused (2 problems); nothing applied, the running version keeps running:",
            "  a: x",
            "  b: y"
        ]
    );
    let unchanged = ReloadReport::Unchanged {
        tasks: vec!["a".to_owned()],
    };
    assert!(unchanged.ok());
    assert_eq!(unchanged.lines(), ["a: unchanged (nothing to reload)"]);
}

#[test]
fn the_request_carries_the_soft_limit_or_none() {
    assert_eq!(
        reconfigure_request(&manifest(BASE)).soft_time_limit_ms,
        Some(3_000_000)
    );
    assert_eq!(
        reconfigure_request(&edited("soft_time_limit = \"50m\"\n", "")).soft_time_limit_ms,
        Some(0)
    );
}

/// A reload whose manifest fails `check` or changes a TaskDef field refuses the whole
/// reload, every problem listed, and keeps the running version; an unchanged one is a no-op.
#[tokio::test]
async fn apply_refuses_as_a_whole_and_is_idempotent() {
    let tmp = tempfile::tempdir().unwrap();
    let write = |dir: &str, text: &str| {
        let dir = tmp.path().join(dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("body.sh"), "cat\n").unwrap();
        let path = dir.join("task.toml");
        std::fs::write(&path, text).unwrap();
        path
    };
    let a = write("a", BASE);
    let b = write("b", &BASE.replace("orders.ship", "orders.pack"));
    let running = |path: &PathBuf| Running {
        path: path.clone(),
        manifest: Manifest::load(path).unwrap(),
        socket: tmp.path().join("none.sock"),
        rolls: None,
        overrides: BTreeMap::new(),
    };
    let vars: BTreeMap<String, String> = [("PATH".to_owned(), "/usr/bin:/bin".to_owned())].into();
    let mut reloader = Reloader::new(vec![running(&a), running(&b)], vars);
    assert_eq!(
        reloader.apply(&[]).await,
        ReloadReport::Unchanged {
            tasks: vec!["orders.ship".to_owned(), "orders.pack".to_owned()]
        }
    );
    // a: a TaskDef field; b: a body command that does not exist and a syntax error.
    write("a", &BASE.replace("retry_count = 2", "retry_count = 4"));
    write(
        "b",
        &BASE
            .replace("orders.ship", "orders.pack")
            .replace("\"sh\"", "\"no-such-program-here\""),
    );
    let ReloadReport::Refused { problems } = reloader.apply(&[]).await else {
        panic!("refused");
    };
    let text = problems.join("\n");
    assert!(
        text.contains("orders.ship: task.retry_count changed (2 → 4)"),
        "{text}"
    );
    assert!(text.contains("body.command"), "{text}");
    assert!(text.contains("no-such-program-here"), "{text}");
    // Nothing applied: the running versions are the old ones.
    assert_eq!(reloader.runtimes[0].manifest.task.retry_count, 2);
    write("b", "[task\n");
    let ReloadReport::Refused { problems } = reloader.apply(&[]).await else {
        panic!("refused");
    };
    assert!(
        problems.iter().any(|p| p.contains("b/task.toml")),
        "{problems:?}"
    );
    // One task selected: only its manifest is read.
    let ReloadReport::Refused { problems } = reloader.apply(&["orders.ship".to_owned()]).await
    else {
        panic!("refused");
    };
    assert_eq!(problems.len(), 1, "{problems:?}");
    let ReloadReport::Refused { problems } = reloader.apply(&["orders.nope".to_owned()]).await
    else {
        panic!("refused");
    };
    assert!(
        problems[0].starts_with("orders.nope: this supervisor does not run the task"),
        "{problems:?}"
    );
}

/// A body change goes to the runtime's actor to roll in, and the report names the version;
/// a runtime that takes no body change (`rolls: None`) refuses it, as does what cannot roll.
#[tokio::test]
async fn a_body_change_is_sent_to_its_runtime_to_roll() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("task.toml");
    std::fs::write(tmp.path().join("body.sh"), "cat\n").unwrap();
    std::fs::write(tmp.path().join("body2.sh"), "cat\n").unwrap();
    std::fs::write(&path, BASE).unwrap();
    let vars: BTreeMap<String, String> = [("PATH".to_owned(), "/usr/bin:/bin".to_owned())].into();
    let (rolls, mut asked) = mpsc::unbounded_channel::<RollRequest>();
    let runtime = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Some(ask) = asked.recv().await {
            seen.push(ask.snapshot.manifest.body.kind.clone());
            let _ = ask.reply.send(Ok(Some(2)));
        }
        seen
    });
    let running = Running {
        path: path.clone(),
        manifest: Manifest::load(&path).unwrap(),
        socket: tmp.path().join("none.sock"),
        rolls: Some(rolls),
        overrides: BTreeMap::new(),
    };
    let mut reloader = Reloader::new(vec![running], vars.clone());
    std::fs::write(&path, BASE.replace("body.sh", "body2.sh")).unwrap();
    let report = reloader.apply(&[]).await;
    let ReloadReport::Applied { lines } = &report else {
        panic!("applied: {report:?}");
    };
    assert_eq!(
        lines,
        &[
            "orders.ship: the body rolls to version 2 (body.command changed): each executor takes it after its current task"
        ]
    );
    // The version running is the new one: reloading again is a no-op, nothing more is sent.
    assert!(matches!(
        reloader.apply(&[]).await,
        ReloadReport::Unchanged { .. }
    ));
    drop(reloader);
    let seen = runtime.await.unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(format!("{:?}", seen[0]).contains("body2.sh"), "{seen:?}");

    // A runtime that takes no body change refuses the reload as a whole.
    std::fs::write(&path, BASE).unwrap();
    let running = Running {
        path: path.clone(),
        manifest: Manifest::load(&path).unwrap(),
        socket: tmp.path().join("none.sock"),
        rolls: None,
        overrides: BTreeMap::new(),
    };
    let mut reloader = Reloader::new(vec![running], vars);
    std::fs::write(&path, BASE.replace("body.sh", "body2.sh")).unwrap();
    let ReloadReport::Refused { problems } = reloader.apply(&[]).await else {
        panic!("refused");
    };
    assert!(
        problems[0]
            .starts_with("orders.ship: the body changed, and this runtime takes no body change"),
        "{problems:?}"
    );
}

/// Issue #26 item 4: every `[worker]` setting applies live; `body.memory_limit` rolls with
/// the body (it was missed: a reload said "unchanged"); the concurrency group needs a
/// restart of the supervisor, said so.
#[test]
fn worker_settings_apply_live_and_nothing_changes_silently() {
    let worker = format!(
        "{BASE}\n[worker]\ndomain = \"blue\"\npaused = true\npoll_interval = \"250ms\"\npoll_timeout = \"2s\"\nmax_tasks_per_executor = 50\nmax_executor_memory = \"512MiB\"\nmin_free_memory = \"1GiB\"\n"
    );
    let changes = diff(&manifest(BASE), &manifest(&worker));
    assert_eq!(
        fields(&changes),
        [
            ("worker.domain", Class::Live),
            ("worker.paused", Class::Live),
            ("worker.poll_interval", Class::Live),
            ("worker.poll_timeout", Class::Live),
            ("worker.max_tasks_per_executor", Class::Live),
            ("worker.max_executor_memory", Class::Live),
            ("worker.min_free_memory", Class::Live),
        ]
    );
    assert!(changes.refusals().is_empty());
    let memory = edited(
        "soft_time_limit = \"50m\"",
        "soft_time_limit = \"50m\"\nmemory_limit = \"64MiB\"",
    );
    assert_eq!(
        fields(&diff(&manifest(BASE), &memory)),
        [("body.memory_limit", Class::Body)]
    );
    assert_eq!(
        body::compare(&manifest(BASE), &memory).unwrap(),
        body::Change::Body(vec!["body.memory_limit"])
    );
    let grouped = edited(
        "retry_count = 2",
        "retry_count = 2\nconcurrency_group = \"providers\"\nconcurrency_limit = 2",
    );
    let changes = diff(&manifest(BASE), &grouped);
    assert_eq!(
        fields(&changes),
        [
            ("task.concurrency_group", Class::Share),
            ("task.concurrency_limit", Class::Share),
            ("task.cost_units", Class::Share),
        ]
    );
    // Judged by the reload, which knows the share plan (below).
    assert!(changes.refusals().is_empty());
}

/// A changed concurrency limit replans the capacity sharing live (the coordinator gets the
/// new caps); a supervisor that shares nothing, or a type that would join or leave the
/// sharing, refuses it naming the field.
#[tokio::test]
async fn a_concurrency_change_replans_the_sharing_or_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let write = |dir: &str, text: &str| {
        let dir = tmp.path().join(dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("body.sh"), "cat\n").unwrap();
        let path = dir.join("task.toml");
        std::fs::write(&path, text).unwrap();
        path
    };
    let in_group = |name: &str, limit: u32| {
        BASE.replace("orders.ship", name).replace(
            "retry_count = 2",
            &format!(
                "retry_count = 2\nconcurrency_group = \"providers\"\nconcurrency_limit = {limit}"
            ),
        )
    };
    let a = write("a", &in_group("orders.ship", 2));
    let b = write("b", &in_group("orders.pack", 2));
    let running = |path: &PathBuf| Running {
        path: path.clone(),
        manifest: Manifest::load(path).unwrap(),
        socket: tmp.path().join("none.sock"),
        rolls: None,
        overrides: BTreeMap::new(),
    };
    let members = |paths: &[&PathBuf]| {
        paths
            .iter()
            .map(|p| Manifest::load(p).unwrap())
            .collect::<Vec<_>>()
    };
    let loaded = members(&[&a, &b]);
    let plan = crate::share::resolve(
        None,
        None,
        &[],
        None,
        &loaded
            .iter()
            .zip([&a, &b])
            .map(|(m, p)| crate::share::Member {
                name: m.task.name.as_str(),
                manifest: p.as_path(),
                group: m.task.concurrency.as_ref(),
            })
            .collect::<Vec<_>>(),
    )
    .unwrap()
    .unwrap();
    let vars: BTreeMap<String, String> = [("PATH".to_owned(), "/usr/bin:/bin".to_owned())].into();
    let (replans, mut replanned) = mpsc::unbounded_channel();
    let mut reloader =
        Reloader::new(vec![running(&a), running(&b)], vars.clone()).with_sharing(Some(Sharing {
            pool: None,
            priority: None,
            budget_flags: Vec::new(),
            budget_var: None,
            plan,
            replans,
        }));
    // Both members agree on 3: replanned live.
    write("a", &in_group("orders.ship", 3));
    write("b", &in_group("orders.pack", 3));
    let report = reloader.apply(&[]).await;
    assert!(report.ok(), "{report:?}");
    assert!(
        report
            .lines()
            .contains(&"orders.ship: task.concurrency_limit 2 → 3 (applied)".to_owned()),
        "{report:?}"
    );
    let sent = replanned.try_recv().unwrap();
    assert_eq!(sent.constraints[0].cap, 3);
    // One leaves the group: the other's broker would keep taking permits nobody grants.
    write("b", &BASE.replace("orders.ship", "orders.pack"));
    let ReloadReport::Refused { problems } = reloader.apply(&[]).await else {
        panic!("refused");
    };
    assert!(
        problems[0].starts_with("orders.pack: task.concurrency_group changed (\"providers\" → none) — a task type would join or leave the capacity sharing"),
        "{problems:?}"
    );
    assert!(replanned.try_recv().is_err(), "nothing sent");

    // A supervisor that started sharing nothing.
    let c = write("c", BASE);
    let mut plain = Reloader::new(vec![running(&c)], vars);
    write("c", &in_group("orders.ship", 2));
    let ReloadReport::Refused { problems } = plain.apply(&[]).await else {
        panic!("refused");
    };
    assert!(
        problems[0].contains("this supervisor started sharing no capacity"),
        "{problems:?}"
    );
}

/// Only the `[worker]` settings that changed are sent (one a flag set is never overwritten
/// by the manifest's absence of it); one removed goes back to the runtime's default.
#[test]
fn the_request_carries_only_the_worker_settings_that_changed() {
    let with = |lines: &str| manifest(&format!("{BASE}\n[worker]\n{lines}\n")).worker;
    let mut request = ReconfigureRequest::default();
    worker_request(
        &with("poll_interval = \"250ms\"\nmax_tasks_per_executor = 5"),
        &with("poll_interval = \"250ms\"\nmax_tasks_per_executor = 7\ndomain = \"blue\""),
        &mut request,
    );
    assert_eq!(
        request,
        ReconfigureRequest {
            domain: Some("blue".to_owned()),
            max_tasks_per_executor: Some(7),
            ..ReconfigureRequest::default()
        }
    );
    let mut request = ReconfigureRequest::default();
    worker_request(
        &with(
            "domain = \"blue\"\npoll_timeout = \"1s\"\nmin_free_memory = \"1GiB\"\npoll_interval = \"1s\"",
        ),
        &with(""),
        &mut request,
    );
    assert_eq!(
        request,
        ReconfigureRequest {
            domain: Some(String::new()),
            poll_timeout_ms: Some(5000),
            poll_interval_ms: Some(0),
            min_free_memory_bytes: Some(0),
            ..ReconfigureRequest::default()
        }
    );
}

/// A `[worker]` change that a start flag or variable hides is refused, naming what set it;
/// nothing else of the reload applies.
#[tokio::test]
async fn a_worker_setting_a_flag_set_is_refused_naming_the_flag() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("body.sh"), "cat\n").unwrap();
    let path = tmp.path().join("task.toml");
    std::fs::write(&path, BASE).unwrap();
    let running = Running {
        path: path.clone(),
        manifest: Manifest::load(&path).unwrap(),
        socket: tmp.path().join("none.sock"),
        rolls: None,
        overrides: [("worker.domain", "--domain green".to_owned())].into(),
    };
    let vars: BTreeMap<String, String> = [("PATH".to_owned(), "/usr/bin:/bin".to_owned())].into();
    let mut reloader = Reloader::new(vec![running], vars);
    std::fs::write(
        &path,
        format!("{BASE}\n[worker]\ndomain = \"blue\"\nmax_tasks_per_executor = 3\n"),
    )
    .unwrap();
    let ReloadReport::Refused { problems } = reloader.apply(&[]).await else {
        panic!("refused");
    };
    assert_eq!(
        problems,
        [
            "orders.ship: worker.domain changed (none → \"blue\"), but --domain green set it at start and wins over the manifest; restart without it to let the manifest decide"
        ]
    );
    assert_eq!(
        reloader.runtimes[0].manifest.worker.max_tasks_per_executor,
        None
    );
}
