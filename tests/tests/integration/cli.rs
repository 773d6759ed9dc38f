//! The `perago-supervisor` command line as a user meets it: help, `check`, `extract`, and the
//! argument and configuration checks of `start`.

use perago_tests::{Run, command, workspace_root};
use std::{fs, path::Path, process::Command};

const SUPERVISOR: &str = env!("CARGO_BIN_EXE_perago-supervisor-dup");
const PERAGO: &str = env!("CARGO_BIN_EXE_perago-dup");

fn supervisor(args: &[&str]) -> Command {
    let mut cmd = command(SUPERVISOR);
    cmd.args(args).current_dir(workspace_root());
    cmd
}

fn run(args: &[&str]) -> Run {
    Run::of(&mut supervisor(args))
}

#[test]
fn help_texts() {
    for args in [
        &["--help"][..],
        &["check", "--help"],
        &["extract", "--help"],
        &["start", "--help"],
        &["dev", "--help"],
        &["status", "--help"],
        &["scale", "--help"],
        &["reload", "--help"],
        &["scaler", "--help"],
    ] {
        let out = run(args);
        out.expect_code(0);
        insta::assert_snapshot!(
            format!("help_{}", args.join("_").replace("--", "")),
            out.stdout
        );
    }
}

#[test]
fn perago_is_the_same_command() {
    let out = Run::of(
        command(PERAGO)
            .args(["check", "examples/greet/task.toml"])
            .current_dir(workspace_root()),
    );
    out.expect_code(0);
    assert!(
        out.stdout
            .starts_with("ok: examples.greet is a valid workspace-free task\n"),
        "{out}"
    );
}

#[test]
fn check_accepts_the_examples() {
    let greet = run(&["check", "examples/greet/task.toml"]);
    greet.expect_code(0);
    let lines: Vec<&str> = greet.stdout.lines().collect();
    assert_eq!(
        lines[0], "ok: examples.greet is a valid workspace-free task",
        "{greet}"
    );
    assert!(
        lines[1].starts_with("  body: python3 -u greet.py (exec protocol; /"),
        "{greet}"
    );
    assert!(
        greet
            .stdout
            .contains("/examples/greet/schemas/params.json (compiled)"),
        "{greet}"
    );
    assert!(
        greet
            .stdout
            .contains("  pre guardrail: ./check_params.sh\n"),
        "{greet}"
    );
    assert_eq!(greet.stderr, "");

    let build = run(&["check", "examples/features-build/task.toml"]);
    build.expect_code(0);
    assert!(
        build
            .stdout
            .starts_with("ok: features.build is a valid workspace task\n"),
        "{build}"
    );
    assert!(
        build.stdout.contains(
            "  timeouts: 900s total, 300s response; retries: 3 (EXPONENTIAL_BACKOFF, 5s delay)\n"
        ),
        "{build}"
    );
}

/// A temp folder holding `task.toml` with `text`.
fn manifest_dir(text: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("task.toml"), text).unwrap();
    dir
}

fn check_in(dir: &Path) -> Run {
    Run::of(supervisor(&["check", "task.toml"]).current_dir(dir))
}

#[test]
fn check_reports_every_manifest_problem() {
    let dir = manifest_dir(
        "[task]\nname = \"a/b\"\nkind = \"workspace-free\"\ntimeout_seconds = 10\nretry_logic = \"SOMETIMES\"\n\n[body]\ncommand = []\n",
    );
    let out = check_in(dir.path());
    out.expect_code(1);
    assert_eq!(
        out.stderr,
        "error: manifest task.toml: task.name: \"a/b\" must not contain '/' (the name becomes a folder name)\n\
         error: manifest task.toml: task.retry_logic: unknown value \"SOMETIMES\" (expected one of FIXED, EXPONENTIAL_BACKOFF, LINEAR_BACKOFF)\n\
         error: manifest task.toml: body.command: must name a command: the array is empty\n"
    );
    assert_eq!(out.stdout, "");
}

#[test]
fn check_rejects_two_tasks_in_one_manifest() {
    let dir = manifest_dir(
        "[[task]]\nname = \"a\"\n[[task]]\nname = \"b\"\n[body]\ncommand = [\"true\"]\n",
    );
    let out = check_in(dir.path());
    out.expect_code(1);
    assert_eq!(
        out.stderr,
        "error: manifest task.toml: task: a manifest defines exactly one task in a [task] table, found 2 [[task]] entries; run one supervisor per task\n"
    );
}

#[test]
fn check_reports_toml_syntax_with_position() {
    let dir = manifest_dir("[task\nname = 1\n");
    let out = check_in(dir.path());
    out.expect_code(1);
    assert!(
        out.stderr
            .starts_with("error: manifest task.toml:1:6: not valid TOML: "),
        "{out}"
    );
    assert_eq!(out.stderr.lines().count(), 1, "{out}");
}

#[test]
fn check_finds_missing_commands() {
    let dir = manifest_dir(
        "[task]\nname = \"t\"\nkind = \"workspace-free\"\ntimeout_seconds = 10\n\
         [body]\ncommand = [\"perago-no-such-program\"]\n\
         [guardrails]\npre = [\"./pre.sh\"]\npost = [\"./post.sh\"]\n",
    );
    fs::write(dir.path().join("post.sh"), "#!/bin/sh\n").unwrap();
    let out = check_in(dir.path());
    out.expect_code(1);
    let root = fs::canonicalize(dir.path()).unwrap();
    assert_eq!(
        out.stderr,
        format!(
            "error: manifest task.toml: body.command: \"perago-no-such-program\" not found on PATH\n\
             error: manifest task.toml: guardrails.pre: \"./pre.sh\" not found (looked for {root}/pre.sh)\n\
             error: manifest task.toml: guardrails.post: {root}/post.sh is not an executable file\n",
            root = root.display()
        )
    );
}

#[test]
fn check_finds_a_missing_executor_binary() {
    let dir = manifest_dir(
        "[task]\nname = \"t\"\nkind = \"workspace-free\"\ntimeout_seconds = 10\n[body]\nexecutor = \"target/release/my-task\"\n",
    );
    let out = check_in(dir.path());
    out.expect_code(1);
    let root = fs::canonicalize(dir.path()).unwrap();
    assert_eq!(
        out.stderr,
        format!(
            "error: manifest task.toml: body.executor: {}/target/release/my-task not found (build it first: cargo build --release --bin my-task, in the workspace that defines it)\n",
            root.display()
        )
    );
}

#[test]
fn check_of_a_missing_file() {
    let out = run(&["check", "no/such/task.toml"]);
    out.expect_code(1);
    assert_eq!(
        out.stderr,
        "error: cannot read manifest no/such/task.toml: No such file or directory (os error 2)\n"
    );
}

#[test]
fn extract_writes_the_task_def() {
    let out_dir = tempfile::tempdir().unwrap();
    let target = out_dir.path().join("generated/greet.json");
    let target_text = target.to_str().unwrap();
    let out = run(&[
        "extract",
        "examples/greet/task.toml",
        "--output",
        target_text,
    ]);
    out.expect_code(0);
    assert_eq!(
        out.stderr,
        format!("wrote TaskDef examples.greet to {target_text}\n")
    );
    let text = fs::read_to_string(&target).unwrap();
    let def: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(def["name"], "examples.greet");
    assert_eq!(def["ownerEmail"], "examples@perago.invalid");
    assert_eq!(def["timeoutSeconds"], 60);
    assert_eq!(def["responseTimeoutSeconds"], 30);
    assert_eq!(def["retryCount"], 2);
    assert_eq!(def["retryLogic"], "FIXED");
    assert_eq!(def["inputKeys"], serde_json::json!(["params"]));
    assert_eq!(def["outputKeys"], serde_json::json!(["result"]));
    assert_eq!(
        def["inputSchema"]["data"]["properties"]["params"]["required"],
        serde_json::json!(["name"])
    );
    // Nothing but the file itself is left in the folder (no temporary file).
    let names: Vec<_> = fs::read_dir(target.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["greet.json"]);

    let stdout = run(&["extract", "examples/greet/task.toml", "-o", "-"]);
    stdout.expect_code(0);
    assert_eq!(
        stdout.stdout, text,
        "stdout and file carry the same TaskDef"
    );
}

#[test]
fn extract_reports_an_unwritable_output() {
    let out = run(&[
        "extract",
        "examples/greet/task.toml",
        "--output",
        "/proc/perago/x.json",
    ]);
    out.expect_code(1);
    assert!(
        out.stderr
            .starts_with("error: cannot write /proc/perago/x.json: "),
        "{out}"
    );
}

#[test]
fn extract_of_an_invalid_manifest_writes_nothing() {
    let dir = manifest_dir("[task]\nname = \"t\"\n");
    let out =
        Run::of(supervisor(&["extract", "task.toml", "-o", "out.json"]).current_dir(dir.path()));
    out.expect_code(1);
    assert!(!dir.path().join("out.json").exists());
}

#[test]
fn start_rejects_a_worker_count_below_one() {
    for jobs in ["0", "-1"] {
        let out = run(&["start", "examples/greet/task.toml", "-j", jobs]);
        out.expect_code(2);
        assert_eq!(
            out.stderr, "error: worker process count must be at least 1\n",
            "{out}"
        );
    }
    let out = run(&["start", "examples/greet/task.toml", "-j", "many"]);
    out.expect_code(2);
    assert_eq!(
        out.stderr, "error: -j \"many\": expected a count such as 4 or a range such as 2..16\n",
        "{out}"
    );
    let out = run(&["start", "examples/greet/task.toml", "-j", "8..2"]);
    out.expect_code(2);
    assert_eq!(
        out.stderr, "error: -j 8..2: the minimum (8) is above the maximum (2)\n",
        "{out}"
    );
}

/// Capacity flags and variables are checked before anything else runs, every bad value at
/// once, each named.
#[test]
fn start_names_every_bad_capacity_setting() {
    let out = Run::of(
        supervisor(&[
            "start",
            "examples/greet/task.toml",
            "--max-tasks-per-executor",
            "0",
            "--max-executor-memory",
            "a lot",
        ])
        .env("PERAGO_MIN_FREE_MEMORY", "-5")
        .env("PERAGO_ONCE", "perhaps"),
    );
    out.expect_code(1);
    for name in [
        "--max-tasks-per-executor \"0\"",
        "--max-executor-memory",
        "PERAGO_MIN_FREE_MEMORY",
        "PERAGO_ONCE",
    ] {
        assert!(out.stderr.contains(name), "{name}: {out}");
    }
}

#[test]
fn start_resolves_the_execution_mode() {
    let bad_env = Run::of(
        supervisor(&["start", "examples/greet/task.toml"]).env("PERAGO_EXECUTION_MODE", "fork"),
    );
    bad_env.expect_code(1);
    assert_eq!(
        bad_env.stderr,
        "error: invalid execution mode \"fork\" in PERAGO_EXECUTION_MODE: expected process or thread\n"
    );
    // The flag wins over the environment, so the bad env value is never read.
    let flag = Run::of(
        supervisor(&[
            "start",
            "examples/greet/task.toml",
            "--execution-mode",
            "thread",
        ])
        .env("PERAGO_EXECUTION_MODE", "fork"),
    );
    assert!(!flag.stderr.contains("PERAGO_EXECUTION_MODE"), "{flag}");
    let bad_flag = run(&[
        "start",
        "examples/greet/task.toml",
        "--execution-mode",
        "fork",
    ]);
    bad_flag.expect_code(2);
    assert!(
        bad_flag
            .stderr
            .contains("invalid value 'fork' for '--execution-mode"),
        "{bad_flag}"
    );
}

#[test]
fn start_preflight_names_missing_configuration() {
    let out = run(&["start", "examples/greet/task.toml"]);
    out.expect_code(1);
    assert_eq!(
        out.stderr,
        "error: CONDUCTOR_SERVER_URL is required for perago start\n"
    );

    let out = Run::of(
        supervisor(&["start", "examples/features-build/task.toml"])
            .env("LAKEFS_ACCESS_KEY_ID", "AKIA"),
    );
    out.expect_code(1);
    assert_eq!(
        out.stderr,
        "error: CONDUCTOR_SERVER_URL is required for perago start\n\
         error: LakeFS config is required for workspace tasks: missing LAKEFS_ENDPOINT, LAKEFS_SECRET_ACCESS_KEY\n"
    );
}

#[test]
fn start_reports_an_unreachable_conductor() {
    let root = tempfile::tempdir().unwrap();
    let out = Run::of(
        supervisor(&["start", "examples/greet/task.toml", "-j", "2"])
            .env("CONDUCTOR_SERVER_URL", "http://127.0.0.1:9/api")
            .env("PERAGO_WORKSPACE_ROOT", root.path()),
    );
    out.expect_code(1);
    let first = out
        .stderr
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_default();
    assert!(
        first.starts_with("error: cannot check TaskDef 'examples.greet' at http://127.0.0.1:9/api: GET http://127.0.0.1:9/api/metadata/taskdefs/examples.greet: "),
        "{out}"
    );
    assert!(first.contains("Connection refused"), "{out}");
}

#[test]
fn start_refuses_bad_durations_and_prefixes_at_once() {
    let out = Run::of(
        supervisor(&["start", "examples/greet/task.toml"])
            .env("CONDUCTOR_SERVER_URL", "http://127.0.0.1:9/api")
            .env("PERAGO_SHUTDOWN_FORCE_KILL_AFTER", "30x")
            .env("PERAGO_WORKSPACE_GC_TTL", "0")
            .env("PERAGO_WORKER_ID_PREFIX", "prod a"),
    );
    out.expect_code(1);
    assert_eq!(
        out.stderr,
        "error: PERAGO_WORKER_ID_PREFIX \"prod a\" is invalid: use one to 200 of A-Z, a-z, 0-9, _ and -\n\
         error: PERAGO_SHUTDOWN_FORCE_KILL_AFTER: invalid duration \"30x\": unknown unit (use ms, s, m or h)\n\
         error: PERAGO_WORKSPACE_GC_TTL: invalid duration \"0\": must be greater than zero\n"
    );
}

/// Splits a shell command line with single quotes (all the README uses).
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                in_word = true;
            }
            c if c.is_whitespace() && !quoted => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// Every example passes `check` (the Rust example's binary is built with the tests, as the
/// tests crate defines it); where its binary is missing, the error says exactly what to build.
#[test]
fn every_example_checks_and_a_missing_binary_names_its_build_command() {
    let mut checked = 0;
    for entry in fs::read_dir(workspace_root().join("examples")).unwrap() {
        let manifest = entry.unwrap().path().join("task.toml");
        if manifest.exists() {
            run(&["check", manifest.to_str().unwrap()]).expect_code(0);
            checked += 1;
        }
    }
    assert!(checked >= 4, "{checked} examples");
    // The Rust example as a fresh clone has it: the same manifest, nothing built.
    let fresh = tempfile::tempdir().unwrap();
    let dir = fresh.path().join("examples/rust-sum");
    fs::create_dir_all(&dir).unwrap();
    fs::copy(
        workspace_root().join("examples/rust-sum/task.toml"),
        dir.join("task.toml"),
    )
    .unwrap();
    let out = run(&["check", dir.join("task.toml").to_str().unwrap()]);
    out.expect_code(1);
    assert!(
        out.stderr.contains(
            "not found (build it first: cargo build --bin perago-example-sum, in the workspace that defines it)"
        ),
        "{out}"
    );
}

/// Runs the supervisor with `args` to completion, and meanwhile notes the `argv[0]` and the
/// program of each of its children (as `ps` would show them).
fn run_watching_children(args: &[&str]) -> (Run, Vec<(String, std::path::PathBuf)>) {
    use std::io::Read as _;
    let mut child = supervisor(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let drain = |mut pipe: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let deadline =
        std::time::Instant::now() + crate::harness::patience(std::time::Duration::from_secs(120));
    let mut seen = Vec::new();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the command did not end"
        );
        for proc in crate::harness::children_of(child.id()) {
            let Some(name) = proc.argv.first() else {
                continue;
            };
            let exe = fs::read_link(format!("/proc/{}/exe", proc.pid)).unwrap_or_default();
            if !seen.iter().any(|(n, _)| n == name) {
                seen.push((name.clone(), exe));
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    };
    let run = Run {
        command: format!("{args:?}"),
        code: status.code(),
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    };
    (run, seen)
}

/// The README's first command runs a real task end to end, as the real process split: run
/// exactly its arguments, and watch its children while it runs.
#[test]
fn readme_first_command_runs_the_example_end_to_end() {
    let readme = fs::read_to_string(workspace_root().join("README.md")).unwrap();
    let block = readme
        .split("```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("README has a sh block");
    let command = block.trim();
    let prefix = "cargo run -q -p perago-supervisor -- ";
    assert!(
        command.starts_with(prefix),
        "the first README command changed: {command}"
    );
    let args = shell_words(&command[prefix.len()..]);
    assert_eq!(args[0], "dev");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (out, children) = run_watching_children(&args);
    out.expect_code(0);
    // `ps` shows the broker and both executors, each this same program in a role (nothing
    // but `cargo run -p perago-supervisor` has to be built).
    let names: Vec<&str> = children.iter().map(|(n, _)| n.as_str()).collect();
    for name in [
        "perago-conductor-broker",
        "perago-executor-0001",
        "perago-executor-0002",
    ] {
        assert!(names.contains(&name), "no {name} among {children:?}\n{out}");
    }
    let me = fs::canonicalize(SUPERVISOR).unwrap();
    for (name, exe) in &children {
        if name.starts_with("perago-") {
            assert_eq!(exe, &me, "{name} runs {}", exe.display());
        }
    }
    assert!(out.stderr.contains("in process mode"), "{out}");
    let mut lines: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    lines.sort_by_key(|l| l["output"]["result"]["message"].as_str().map(str::to_owned));
    assert_eq!(lines.len(), 2, "{out}");
    assert!(lines.iter().all(|l| l["status"] == "COMPLETED"), "{out}");
    assert_eq!(
        lines[0]["output"]["result"],
        serde_json::json!({"message": "hello, Ada! hello, Ada!", "length": 3})
    );
    assert_eq!(lines[1]["output"]["result"]["message"], "hello, Grace!");
    assert!(lines.iter().all(|l| {
        l["worker_id"]
            .as_str()
            .unwrap()
            .starts_with("examplesgreet000")
    }));
    assert!(
        out.stderr
            .contains("2 workflow(s): 2 completed, 0 not completed"),
        "{out}"
    );
}

#[test]
fn readme_second_command_is_what_ci_runs() {
    let readme = fs::read_to_string(workspace_root().join("README.md")).unwrap();
    let second = readme
        .split("```sh\n")
        .nth(2)
        .and_then(|rest| rest.split("```").next())
        .expect("README has a second sh block");
    assert_eq!(second.trim(), "scripts/test");
    let ci = fs::read_to_string(workspace_root().join(".ci/run")).unwrap();
    assert!(ci.lines().any(|l| l.trim() == "exec scripts/test"), "{ci}");
}

#[test]
fn dev_reports_failures_and_exits_non_zero() {
    let out = run(&[
        "dev",
        "examples/greet/task.toml",
        "--input",
        r#"{"params": {"name": ""}}"#,
        "--input",
        r#"{"params": {"name": "x", "times": 99}}"#,
    ]);
    out.expect_code(1);
    let reasons: Vec<String> = out
        .stdout
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["reason"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert!(
        reasons.contains(
            &"pre guardrail ./check_params.sh failed (exit status 1): params.name is empty"
                .to_owned()
        ),
        "{out}"
    );
    assert!(
        reasons.iter().any(|r| r.starts_with("bad input: params do not match the params schema: params/times: 99 is greater than the maximum of 10")),
        "{out}"
    );
    assert!(
        out.stderr
            .ends_with("error: 2 workflow(s) did not complete\n"),
        "{out}"
    );
}

#[test]
fn dev_refuses_bad_inputs() {
    let out = run(&[
        "dev",
        "examples/greet/task.toml",
        "--input",
        "[1]",
        "--input",
        "{nope",
    ]);
    out.expect_code(1);
    assert!(
        out.stderr.starts_with(
            "error: --input 1: expected a JSON object\nerror: --input 2: not valid JSON: "
        ),
        "{out}"
    );
    let out = run(&["dev", "examples/greet/task.toml"]);
    out.expect_code(1);
    assert_eq!(
        out.stderr,
        "error: give at least one --input with the task input, e.g. --input '{\"params\": {}}'\n"
    );
}

#[test]
fn dev_runs_a_workspace_task_on_a_seeded_repository() {
    let out = run(&[
        "dev",
        "examples/features-build/task.toml",
        "--input",
        r#"{"params": {"label": "nightly"}}"#,
    ]);
    out.expect_code(0);
    let line: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(line["status"], "COMPLETED", "{out}");
    let ws = &line["output"]["workspace"];
    assert_eq!(ws["repository"], "features");
    assert_eq!(ws["added"], 1);
    assert_ne!(ws["commit_id"], ws["source_commit_id"]);
    assert_eq!(
        line["output"]["result"],
        serde_json::json!({"label": "nightly", "files": {"day1.csv": 3, "day2.csv": 2}})
    );
    assert_eq!(
        line["published"],
        serde_json::json!([{"change": "added", "path": "features/summary.json"}])
    );
    assert!(
        out.stderr
            .contains("(repository features, branch main, 2 seeded file(s))"),
        "{out}"
    );
}

#[test]
fn dev_runs_a_jsonl_body() {
    let out = run(&[
        "dev",
        "examples/greet-jsonl/task.toml",
        "-j",
        "2",
        "--input",
        r#"{"params": {"name": "Ada", "times": 2}}"#,
        "--input",
        r#"{"params": {"name": ""}}"#,
    ]);
    out.expect_code(1);
    let lines: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let done = lines
        .iter()
        .find(|l| l["status"] == "COMPLETED")
        .expect("one completes");
    assert_eq!(
        done["output"]["result"]["message"],
        "hello, Ada! hello, Ada!"
    );
    let failed = lines
        .iter()
        .find(|l| l["status"] == "FAILED")
        .expect("one fails");
    assert_eq!(failed["task_status"], "FAILED_WITH_TERMINAL_ERROR");
    assert_eq!(failed["reason"], "params.name is empty");
}

#[test]
fn check_and_extract_take_several_manifests() {
    let both = run(&[
        "check",
        "examples/greet/task.toml",
        "examples/greet-jsonl/task.toml",
    ]);
    both.expect_code(0);
    let oks: Vec<&str> = both
        .stdout
        .lines()
        .filter(|l| l.starts_with("ok: "))
        .collect();
    assert_eq!(
        oks,
        [
            "ok: examples.greet is a valid workspace-free task",
            "ok: examples.greet_jsonl is a valid workspace-free task"
        ],
        "{both}"
    );
    // A task name given twice is refused: one supervisor runs each task type once.
    let twice = run(&[
        "check",
        "examples/greet/task.toml",
        "./examples/greet/task.toml",
    ]);
    twice.expect_code(2);
    assert_eq!(
        twice.stderr,
        "error: the task examples.greet is in both examples/greet/task.toml and ./examples/greet/task.toml: one supervisor runs each task type once\n"
    );
    // Every bad manifest is reported, with what passed.
    let bad = tempfile::tempdir().unwrap();
    fs::write(bad.path().join("task.toml"), "[task]\nname = 1\n").unwrap();
    let bad_path = bad.path().join("task.toml");
    let mixed = run(&[
        "check",
        "examples/greet/task.toml",
        bad_path.to_str().unwrap(),
        "/nonexistent/task.toml",
    ]);
    mixed.expect_code(1);
    assert!(
        mixed
            .stdout
            .starts_with("ok: examples.greet is a valid workspace-free task\n"),
        "{mixed}"
    );
    assert!(mixed.stderr.contains(bad_path.to_str().unwrap()), "{mixed}");
    assert!(mixed.stderr.contains("/nonexistent/task.toml"), "{mixed}");

    // extract: a JSON array on stdout, or one file per task in a folder.
    let array = run(&[
        "extract",
        "examples/greet/task.toml",
        "examples/greet-jsonl/task.toml",
        "-o",
        "-",
    ]);
    array.expect_code(0);
    let defs: serde_json::Value = serde_json::from_str(&array.stdout).unwrap();
    let names: Vec<&str> = defs
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["examples.greet", "examples.greet_jsonl"]);
    let folder = tempfile::tempdir().unwrap();
    let target = folder.path().join("defs");
    let files = run(&[
        "extract",
        "examples/greet/task.toml",
        "examples/greet-jsonl/task.toml",
        "-o",
        target.to_str().unwrap(),
    ]);
    files.expect_code(0);
    for (n, name) in names.iter().enumerate() {
        let text = fs::read_to_string(target.join(format!("{name}.json"))).unwrap();
        let def: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(def, defs[n]);
    }
    // A file is no folder: nothing is written.
    let file = folder.path().join("plain.json");
    fs::write(&file, "keep").unwrap();
    let refused = run(&[
        "extract",
        "examples/greet/task.toml",
        "examples/greet-jsonl/task.toml",
        "-o",
        file.to_str().unwrap(),
    ]);
    refused.expect_code(1);
    assert!(refused.stderr.contains("is not a folder"), "{refused}");
    assert_eq!(fs::read_to_string(&file).unwrap(), "keep");
}

#[test]
fn start_refuses_a_jobs_name_no_manifest_has() {
    let out = run(&[
        "start",
        "examples/greet/task.toml",
        "-j",
        "2",
        "-j",
        "examples.nope=3",
    ]);
    out.expect_code(2);
    assert_eq!(
        out.stderr,
        "error: -j examples.nope=…: no manifest given has the task examples.nope (tasks: examples.greet)\n"
    );
}

#[test]
fn dev_runs_several_task_types() {
    let out = run(&[
        "dev",
        "examples/greet/task.toml",
        "examples/greet-jsonl/task.toml",
        "--input",
        r#"examples.greet={"params": {"name": "Ada"}}"#,
        "--input",
        r#"examples.greet_jsonl={"params": {"name": "Bo", "times": 2}}"#,
        "--input",
        r#"{"params": {"name": "Cy"}}"#,
    ]);
    out.expect_code(0);
    let mut lines: Vec<(String, String, String)> = out
        .stdout
        .lines()
        .map(|l| {
            let line: serde_json::Value = serde_json::from_str(l).unwrap();
            assert_eq!(line["status"], "COMPLETED", "{out}");
            (
                line["task"].as_str().unwrap().to_owned(),
                line["worker_id"].as_str().unwrap().to_owned(),
                line["output"]["result"]["message"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect();
    lines.sort();
    assert_eq!(lines.len(), 4, "{out}");
    assert_eq!(
        lines.iter().map(|l| l.0.as_str()).collect::<Vec<_>>(),
        [
            "examples.greet",
            "examples.greet",
            "examples.greet_jsonl",
            "examples.greet_jsonl"
        ]
    );
    for (task, worker, _) in &lines {
        let prefix: String = task.chars().filter(char::is_ascii_alphanumeric).collect();
        assert!(worker.starts_with(&prefix), "{task} ran on {worker}");
    }
    assert!(
        lines.iter().any(|l| l.2 == "hello, Bo! hello, Bo!"),
        "{out}"
    );
    // An input for one task only leaves the other without one.
    let missing = run(&[
        "dev",
        "examples/greet/task.toml",
        "examples/greet-jsonl/task.toml",
        "--input",
        r#"examples.greet={"params": {"name": "Ada"}}"#,
    ]);
    missing.expect_code(1);
    assert!(
        missing
            .stderr
            .contains("error: no --input for the task examples.greet_jsonl"),
        "{missing}"
    );
}

/// `[body] user`: `check` and `start`'s preflight verify that the user can run each command
/// (every folder on the way, the file itself) and work in the manifest's folder, by the mode
/// bits it would meet with its own uid and gid.
#[test]
fn check_and_start_refuse_a_body_user_that_cannot_run_the_command() {
    use std::os::unix::fs::PermissionsExt as _;
    if perago_sys::user::euid() != 0 {
        eprintln!("skipped: a body user needs root");
        return;
    }
    let dir = manifest_dir(
        "[task]\nname = \"t\"\nkind = \"workspace-free\"\ntimeout_seconds = 10\n\
         [body]\ncommand = [\"./run.sh\"]\nuser = \"nobody\"\n",
    );
    let script = dir.path().join("run.sh");
    fs::write(&script, "#!/bin/sh\necho '{}'\n").unwrap();
    let root = fs::canonicalize(dir.path()).unwrap();
    let set = |path: &Path, mode: u32| {
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap()
    };
    // The folder is root's 0700 (as a temp folder is made) and the script root's 0700.
    set(dir.path(), 0o700);
    set(&script, 0o700);
    let out = check_in(dir.path());
    out.expect_code(1);
    assert_eq!(
        out.stderr,
        format!(
            "error: manifest task.toml: body.user: \"nobody\" cannot work in the manifest folder {root}: uid 65534 cannot pass through {root}: mode 0700, owner uid 0, group gid 0\n\
             error: manifest task.toml: body.user: \"nobody\" cannot run body.command ({root}/run.sh): uid 65534 cannot pass through {root}: mode 0700, owner uid 0, group gid 0\n",
            root = root.display()
        )
    );
    // The folder opened: only the script is left.
    set(dir.path(), 0o755);
    let out = check_in(dir.path());
    out.expect_code(1);
    let script_problem = format!(
        "body.user: \"nobody\" cannot run body.command ({root}/run.sh): uid 65534 cannot execute {root}/run.sh: mode 0700, owner uid 0, group gid 0",
        root = root.display()
    );
    assert_eq!(
        out.stderr,
        format!("error: manifest task.toml: {script_problem}\n")
    );
    // `start` refuses it before anything runs (no Conductor answers on port 9).
    let state = tempfile::tempdir().unwrap();
    let out = Run::of(
        supervisor(&["start", "task.toml"])
            .current_dir(dir.path())
            .env("CONDUCTOR_SERVER_URL", "http://127.0.0.1:9/api")
            .env("PERAGO_WORKSPACE_ROOT", state.path().join("root")),
    );
    out.expect_code(1);
    assert_eq!(
        out.stderr,
        format!("error: manifest task.toml: {script_problem}\n")
    );
    assert!(!state.path().join("root").exists(), "nothing was started");
    // Executable but not readable: a script's interpreter could not open it.
    set(&script, 0o711);
    let out = check_in(dir.path());
    out.expect_code(1);
    assert!(out.stderr.contains("uid 65534 cannot read"), "{out}");
    set(&script, 0o755);
    check_in(dir.path()).expect_code(0);
}

/// `status` with no argument trusts only this user's own 0700 records folder, and a record
/// that is not a regular file neither hangs it nor is used.
#[test]
fn status_refuses_a_records_folder_it_cannot_trust() {
    let state = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    fs::create_dir_all(state.path().join("perago")).unwrap();
    let folder = state.path().join("perago/supervisors");
    std::os::unix::fs::symlink(elsewhere.path(), &folder).unwrap();
    let status = || {
        Run::of(
            supervisor(&["status"])
                .env("XDG_STATE_HOME", state.path())
                .env_remove("XDG_RUNTIME_DIR"),
        )
    };
    let out = status();
    out.expect_code(1);
    assert_eq!(
        out.stderr,
        format!(
            "error: cannot use {} as the supervisors' records folder: it is a symlink, not a real directory\n",
            folder.display()
        )
    );
    fs::remove_file(&folder).unwrap();
    fs::create_dir(&folder).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(&folder, fs::Permissions::from_mode(0o755)).unwrap();
    let out = status();
    out.expect_code(1);
    assert_eq!(
        out.stderr,
        format!(
            "error: the supervisors' records folder {} has mode 0755, open to other users (it must be 0700): it is not used\n",
            folder.display()
        )
    );
    fs::set_permissions(&folder, fs::Permissions::from_mode(0o700)).unwrap();
    let made = Command::new("mkfifo")
        .arg(folder.join("1.json"))
        .status()
        .unwrap();
    assert!(made.success());
    let out = status();
    out.expect_code(1);
    assert_eq!(
        out.stderr,
        format!(
            "warning: ignoring the supervisor record {}/1.json: a FIFO (only regular files are read)\n\
             error: no perago supervisor of this user is running (none is recorded in {}); give the task's MANIFEST or --socket PATH\n",
            folder.display(),
            folder.display()
        )
    );
}

/// A setting that is not UTF-8 is an error naming it (before, it was ignored and the default
/// used), for `start` and every other command, before anything starts.
#[test]
fn a_setting_that_is_not_utf8_stops_start_naming_it() {
    use std::os::unix::ffi::OsStrExt as _;
    let root = tempfile::tempdir().unwrap();
    let mut bad = root.path().as_os_str().as_bytes().to_vec();
    bad.extend_from_slice(b"/\xffroot");
    let bad = std::ffi::OsStr::from_bytes(&bad);
    let out = Run::of(
        supervisor(&["start", "examples/greet/task.toml"])
            .env("CONDUCTOR_SERVER_URL", "http://127.0.0.1:9/api")
            .env("PERAGO_WORKSPACE_ROOT", bad)
            .env("PERAGO_POLL_WAIT_MS", std::ffi::OsStr::from_bytes(b"5\xfe")),
    );
    out.expect_code(1);
    let mut lines: Vec<&str> = out.stderr.lines().collect();
    lines.sort_unstable();
    assert_eq!(
        lines,
        [
            "error: PERAGO_POLL_WAIT_MS is not valid UTF-8 (5\\xfe); set it to UTF-8 text or unset it"
                .to_owned(),
            format!(
                "error: PERAGO_WORKSPACE_ROOT is not valid UTF-8 ({}/\\xffroot); set it to UTF-8 text or unset it",
                root.path().display()
            ),
        ],
        "{out}"
    );
    assert_eq!(
        fs::read_dir(root.path()).unwrap().count(),
        0,
        "nothing was created"
    );
    let out = Run::of(supervisor(&["check", "examples/greet/task.toml"]).env(
        "LAKEFS_ENDPOINT",
        std::ffi::OsStr::from_bytes(b"http://\xff"),
    ));
    out.expect_code(1);
    assert_eq!(
        out.stderr,
        "error: LAKEFS_ENDPOINT is not valid UTF-8 (http://\\xff); set it to UTF-8 text or unset it\n"
    );
}

/// Values that would spin, or that were silently raised, and folders and programs that can
/// never work: every one named with why, before anything starts.
#[test]
fn start_refuses_values_that_would_spin_and_paths_that_cannot_work() {
    let state = tempfile::tempdir().unwrap();
    let out = Run::of(
        supervisor(&["start", "examples/greet/task.toml"])
            .env("CONDUCTOR_SERVER_URL", "http://127.0.0.1:9/api")
            .env("PERAGO_POLL_WAIT_MS", "0")
            .env("PERAGO_LOG_MAX_BYTES", "0")
            .env("PERAGO_WORKSPACE_GC_INTERVAL", "1ms")
            .env("PERAGO_WORKSPACE_ROOT", "/dev/null/root")
            .env("PERAGO_BROKER_BIN", "/no/such/perago-broker")
            .env("XDG_STATE_HOME", state.path()),
    );
    out.expect_code(1);
    assert_eq!(
        out.stderr,
        "error: PERAGO_WORKSPACE_GC_INTERVAL: \"1ms\" is below the least allowed, 1000ms\n\
         error: PERAGO_WORKSPACE_ROOT \"/dev/null/root\": /dev/null is not a directory\n\
         error: PERAGO_BROKER_BIN \"/no/such/perago-broker\": No such file or directory (os error 2)\n\
         error: PERAGO_POLL_WAIT_MS \"0\": must be at least 100 (a shorter long poll turns an empty queue into a loop of requests)\n\
         error: PERAGO_LOG_MAX_BYTES \"0\": must be at least 1KiB\n",
        "{out}"
    );
    assert_eq!(
        fs::read_dir(state.path()).unwrap().count(),
        0,
        "nothing was created"
    );
}

/// Errors can carry what a server or a file name says: they are printed with control
/// characters written out, never as terminal escape sequences.
#[test]
fn error_lines_write_control_characters_out() {
    let out = run(&["check", "no/such/\u{1b}[2Jtask.toml"]);
    out.expect_code(1);
    assert!(!out.stderr.contains('\u{1b}'), "{out}");
    assert!(out.stderr.contains("\\x1b[2Jtask.toml"), "{out}");
}
