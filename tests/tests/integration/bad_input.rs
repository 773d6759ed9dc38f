//! Bad input at the command line: manifests and schemas that are FIFOs, devices or huge,
//! outputs that are symlinks or devices, readers that go away, names `start` would refuse.
//! Each is refused at once with one clear error, and nothing outside is touched.

use perago_tests::{Run, command, workspace_root};
use std::{
    fs,
    os::unix::fs::FileTypeExt as _,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

const SUPERVISOR: &str = env!("CARGO_BIN_EXE_perago-supervisor-dup");

const TASK: &str = "[task]\nname = \"bad.input\"\nkind = \"workspace-free\"\ntimeout_seconds = 10\n\
                    [body]\ncommand = [\"sh\", \"body.sh\"]\n";

fn folder(manifest: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("task.toml"), manifest).unwrap();
    fs::write(dir.path().join("body.sh"), "cat\n").unwrap();
    dir
}

fn mkfifo(path: &Path) {
    let made = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(made.success());
}

/// Runs the supervisor in `dir` and fails the test if it has not finished within 10 s (a
/// command that blocks on a FIFO would otherwise hang the suite).
fn run_in(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = command(SUPERVISOR);
    cmd.args(args)
        .current_dir(dir)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{cmd:?} still runs after 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    Run {
        command: format!("{cmd:?}"),
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[track_caller]
fn one_error(run: &Run, starts: &str) {
    run.expect_code(1);
    assert!(run.stderr.starts_with(starts), "{run}");
    assert_eq!(run.stderr.lines().count(), 1, "{run}");
    assert!(!run.stderr.contains("panicked"), "{run}");
}

#[test]
fn manifests_that_are_not_small_regular_files_are_refused_at_once() {
    let dir = folder(TASK);
    mkfifo(&dir.path().join("fifo.toml"));
    fs::write(
        dir.path().join("huge.toml"),
        format!("{TASK}# {}\n", "x".repeat(10 << 20)),
    )
    .unwrap();
    let huge = fs::metadata(dir.path().join("huge.toml")).unwrap().len();
    let too_big = format!("{huge} bytes is above the limit of 1048576 bytes");
    for (command, file, why) in [
        ("check", "fifo.toml", "a FIFO (only regular files are read)"),
        (
            "extract",
            "fifo.toml",
            "a FIFO (only regular files are read)",
        ),
        (
            "check",
            "/dev/urandom",
            "a character device (only regular files are read)",
        ),
        ("check", ".", "a directory (only regular files are read)"),
        ("check", "huge.toml", too_big.as_str()),
    ] {
        let run = run_in(
            dir.path(),
            &[command, file, "-o", "-"][..if command == "check" { 2 } else { 4 }],
            &[],
        );
        one_error(&run, &format!("error: cannot read manifest {file}: {why}"));
    }
}

#[test]
fn schemas_that_are_not_small_regular_files_are_refused_at_once() {
    let dir = folder(TASK);
    let text = TASK.replace(
        "timeout_seconds = 10\n",
        "timeout_seconds = 10\nparams_schema = \"params.json\"\n",
    );
    fs::write(dir.path().join("task.toml"), text).unwrap();
    mkfifo(&dir.path().join("params.json"));
    let run = run_in(dir.path(), &["check", "task.toml"], &[]);
    one_error(
        &run,
        "error: manifest task.toml: task.params_schema: cannot read ",
    );
    assert!(
        run.stderr.contains("a FIFO (only regular files are read)"),
        "{run}"
    );
}

#[test]
fn a_reader_that_goes_away_ends_the_command_quietly() {
    for args in [
        &["check", "examples/greet/task.toml"][..],
        &["extract", "examples/greet/task.toml", "-o", "-"],
    ] {
        // The pipe's read end is closed before the command starts: its first write is EPIPE.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = command(SUPERVISOR)
            .args(args)
            .current_dir(workspace_root())
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        assert_eq!(stderr, "", "{args:?}");
    }
}

#[test]
fn extract_never_replaces_a_symlink_fifo_or_device() {
    let dir = folder(TASK);
    fs::write(dir.path().join("real.json"), "keep me").unwrap();
    std::os::unix::fs::symlink("real.json", dir.path().join("link.json")).unwrap();
    let run = run_in(
        dir.path(),
        &["extract", "task.toml", "-o", "link.json"],
        &[],
    );
    one_error(
        &run,
        "error: cannot write link.json: it exists and is not a regular file",
    );
    assert!(
        fs::symlink_metadata(dir.path().join("link.json"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(
        fs::read_to_string(dir.path().join("real.json")).unwrap(),
        "keep me"
    );

    mkfifo(&dir.path().join("out.fifo"));
    let run = run_in(dir.path(), &["extract", "task.toml", "-o", "out.fifo"], &[]);
    one_error(
        &run,
        "error: cannot write out.fifo: it exists and is not a regular file",
    );
    assert!(
        fs::metadata(dir.path().join("out.fifo"))
            .unwrap()
            .file_type()
            .is_fifo()
    );

    // As root, this used to replace /dev/full with a file.
    let run = run_in(
        dir.path(),
        &["extract", "task.toml", "-o", "/dev/full"],
        &[],
    );
    one_error(
        &run,
        "error: cannot write /dev/full: it exists and is not a regular file",
    );
    assert!(
        fs::metadata("/dev/full")
            .unwrap()
            .file_type()
            .is_char_device()
    );

    // Nothing was left behind, and a regular file is still replaced.
    fs::write(dir.path().join("old.json"), "old").unwrap();
    run_in(dir.path(), &["extract", "task.toml", "-o", "old.json"], &[]).expect_code(0);
    assert!(
        fs::read_to_string(dir.path().join("old.json"))
            .unwrap()
            .contains("\"name\": \"bad.input\"")
    );
    let mut names: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "body.sh",
            "link.json",
            "old.json",
            "out.fifo",
            "real.json",
            "task.toml"
        ]
    );
}

#[test]
fn check_refuses_the_names_start_refuses() {
    let long = "a".repeat(300);
    for (name, why) in [
        (
            ".",
            "task.name: \".\" must not be '.' (the name becomes a folder name)",
        ),
        (long.as_str(), "task.name: \"aaaaaaaa"),
        (
            "---",
            "task.name: cannot derive a worker id prefix from task name \"---\": it has no ASCII letters or digits; set PERAGO_WORKER_ID_PREFIX",
        ),
    ] {
        let dir = folder(&TASK.replace("bad.input", name));
        let run = run_in(dir.path(), &["check", "task.toml"], &[]);
        run.expect_code(1);
        assert!(
            run.stderr
                .starts_with(&format!("error: manifest task.toml: {why}")),
            "{run}"
        );
        if name == long {
            assert!(
                run.stderr.contains("is 300 bytes long; at most 200"),
                "{run}"
            );
        }
    }
    // With an explicit prefix, a name without letters is fine for start, so for check too.
    let dir = folder(&TASK.replace("bad.input", "---"));
    let run = run_in(
        dir.path(),
        &["check", "task.toml"],
        &[("PERAGO_WORKER_ID_PREFIX", "dashes")],
    );
    run.expect_code(0);
}

#[test]
fn a_toml_error_is_one_line_however_long_the_source_line() {
    let dir = folder(&format!("[task]\nname = \"x\" {}\n", "y".repeat(500_000)));
    let run = run_in(dir.path(), &["check", "task.toml"], &[]);
    one_error(&run, "error: manifest task.toml:2:12: not valid TOML: ");
    assert!(run.stderr.len() < 300, "{} bytes", run.stderr.len());
}

#[test]
fn check_refuses_a_body_user_that_does_not_exist() {
    let dir = folder(&TASK.replace(
        "command = [\"sh\", \"body.sh\"]\n",
        "command = [\"sh\", \"body.sh\"]\nuser = \"no-such-user-perago\"\n",
    ));
    let run = run_in(dir.path(), &["check", "task.toml"], &[]);
    one_error(
        &run,
        "error: manifest task.toml: body.user: there is no user named \"no-such-user-perago\" on this machine",
    );
}
