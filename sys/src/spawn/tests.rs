//! Tests of [`super::Spawn`]: what the child gets, and how it ends.

use super::*;
use crate::proc::stat;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::unix::pipe;

fn sh(script: &str) -> Spawn {
    let mut spawn = Spawn::new("/bin/sh");
    spawn.args(["-c", script]).env("PATH", "/usr/bin:/bin");
    spawn
}

async fn read_all(fd: Option<OwnedFd>) -> String {
    let mut pipe = pipe::Receiver::from_owned_fd(fd.expect("piped")).unwrap();
    let mut text = String::new();
    pipe.read_to_string(&mut text).await.unwrap();
    text
}

#[tokio::test]
async fn a_child_reads_its_stdin_writes_stdout_and_stderr_and_its_status_is_reaped() {
    let (mut child, managed) = sh("cat; echo \"to stderr $GREETING\" >&2; exit 3")
        .env("GREETING", "hi")
        .spawn()
        .unwrap();
    assert_eq!(child.id(), managed.pid());
    let mut stdin = pipe::Sender::from_owned_fd(child.stdin.take().unwrap()).unwrap();
    stdin.write_all(b"some input").await.unwrap();
    drop(stdin);
    let (out, err) = tokio::join!(read_all(child.stdout.take()), read_all(child.stderr.take()));
    assert_eq!(out, "some input");
    assert_eq!(err, "to stderr hi\n");
    assert_eq!(child.wait().await.unwrap().code(), Some(3));
    // Reaped: asking again gives the same status, and no zombie is left.
    assert_eq!(child.try_wait().unwrap().and_then(|s| s.code()), Some(3));
    assert_eq!(stat(child.id()), None);

    let (mut killed, _managed) = sh("kill -9 $$").spawn().unwrap();
    assert_eq!(killed.wait().await.unwrap().signal(), Some(libc::SIGKILL));
}

#[tokio::test]
async fn the_environment_is_the_base_with_the_variables_set_replacing_theirs() {
    let base = Environment::new([("KEPT", "base"), ("REPLACED", "base"), ("PATH", "/bin")]);
    let (mut child, _managed) = Spawn::new("/bin/sh")
        .args(["-c", "env | sort"])
        .env("REPLACED", "first")
        .base_env(&base)
        .env("ADDED", "x=y")
        .env("REPLACED", "last")
        .spawn()
        .unwrap();
    let out = read_all(child.stdout.take()).await;
    assert!(child.wait().await.unwrap().success());
    let vars: Vec<&str> = out
        .lines()
        .filter(|l| !l.starts_with("PWD=") && !l.starts_with("SHLVL=") && !l.starts_with("_="))
        .collect();
    assert_eq!(
        vars,
        ["ADDED=x=y", "KEPT=base", "PATH=/bin", "REPLACED=last"]
    );

    let nul = Spawn::new("/bin/true")
        .env("A", "a\0b")
        .spawn()
        .unwrap_err();
    assert_eq!(nul.kind(), io::ErrorKind::InvalidInput);
    let nul_base = Environment::new([("A", "a\0b")]);
    let nul = Spawn::new("/bin/true")
        .base_env(&nul_base)
        .spawn()
        .unwrap_err();
    assert_eq!(nul.kind(), io::ErrorKind::InvalidInput);
}

/// The bits of a `SigBlk:`/`SigIgn:` line of `/proc/<pid>/status`.
fn signal_mask(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .unwrap_or_else(|| panic!("no {field} in {status}"));
    u64::from_str_radix(line.trim(), 16).unwrap()
}

#[tokio::test]
async fn the_child_leads_its_own_group_with_no_blocked_signals_and_sigpipe_at_default() {
    // The test harness, like every Rust program, ignores SIGPIPE; its children must not.
    let (child, _managed) = Spawn::new("sleep").arg("30").spawn().unwrap();
    let pid = child.id();
    // CLONE_VFORK: the child has exec'd by the time spawn returns.
    assert_eq!(stat(pid).unwrap().pgid, pid);
    assert_eq!(signal_mask(pid, "SigBlk:"), 0);
    assert_eq!(signal_mask(pid, "SigIgn:") & (1 << (libc::SIGPIPE - 1)), 0);
    drop(child);
}

#[tokio::test]
async fn a_dropped_child_is_killed() {
    let (child, managed) = Spawn::new("sleep").arg("30").spawn().unwrap();
    let pid = child.id();
    drop((child, managed));
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while stat(pid).is_some_and(|s| s.state != 'Z') {
        assert!(std::time::Instant::now() < deadline, "still running");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut raw = 0;
    // SAFETY: our own child, killed above.
    unsafe { libc::waitpid(pid as i32, &mut raw, 0) };
    assert_eq!(ExitStatus::from_raw(raw).signal(), Some(libc::SIGKILL));
}

#[test]
fn the_child_gets_its_death_signal_when_the_spawning_thread_exits() {
    let pid = std::thread::spawn(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (child, _managed) = Spawn::new("sleep")
                .arg("30")
                .death_signal(libc::SIGUSR2)
                .spawn()
                .unwrap();
            let pid = child.id();
            // Not dropped (which would kill it): only the thread's exit may.
            std::mem::forget(child);
            pid
        })
    })
    .join()
    .unwrap();
    let mut raw = 0;
    // SAFETY: our own child (re-parented to another thread of this process).
    let reaped = unsafe { libc::waitpid(pid as i32, &mut raw, libc::__WALL) };
    assert_eq!(reaped, pid as i32);
    assert_eq!(ExitStatus::from_raw(raw).signal(), Some(libc::SIGUSR2));
}

#[tokio::test]
async fn spawn_errors_read_as_std_spawn_errors() {
    let std_error = |cmd: &mut std::process::Command| cmd.spawn().unwrap_err().to_string();
    let missing = Spawn::new("/no/such/program").spawn().unwrap_err();
    assert_eq!(missing.kind(), io::ErrorKind::NotFound);
    assert_eq!(
        missing.to_string(),
        std_error(&mut std::process::Command::new("/no/such/program"))
    );
    assert_eq!(
        missing.to_string(),
        "No such file or directory (os error 2)"
    );
    let no_dir = Spawn::new("/bin/true")
        .current_dir("/no/such/dir")
        .spawn()
        .unwrap_err();
    assert_eq!(
        no_dir.to_string(),
        std_error(std::process::Command::new("/bin/true").current_dir("/no/such/dir"))
    );
    let nul = Spawn::new("/bin/true").arg("a\0b").spawn().unwrap_err();
    assert_eq!(
        nul.to_string(),
        std_error(std::process::Command::new("/bin/true").arg("a\0b"))
    );
}

#[tokio::test]
async fn a_script_without_a_shebang_runs_through_sh_as_with_std() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("script");
    std::fs::write(&script, "echo from the script\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (mut child, _managed) = Spawn::new(&script).spawn().unwrap();
    assert_eq!(read_all(child.stdout.take()).await, "from the script\n");
    assert!(child.wait().await.unwrap().success());
}

#[tokio::test]
async fn the_child_runs_in_its_directory_and_inherits_no_descriptor_above_stderr() {
    let file = tempfile::tempfile().unwrap();
    let fd = file.as_raw_fd();
    // Inheritable as far as this process is concerned.
    crate::fd::set_cloexec(fd, false).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (mut child, _managed) = sh(&format!(
        "pwd; if test -e /proc/self/fd/{fd}; then echo inherited; fi"
    ))
    .current_dir(dir.path())
    .spawn()
    .unwrap();
    let out = read_all(child.stdout.take()).await;
    assert!(child.wait().await.unwrap().success());
    let expected = format!("{}\n", dir.path().canonicalize().unwrap().display());
    assert_eq!(out, expected, "ran elsewhere, or saw descriptor {fd}");
}

#[tokio::test]
async fn the_child_runs_as_the_user_it_is_given() {
    if crate::user::euid() != 0 {
        eprintln!("skipped: switching users needs root");
        return;
    }
    let (mut child, _managed) = sh("id -u; id -g; id -G")
        .user(65534, 65534)
        .spawn()
        .unwrap();
    let out = read_all(child.stdout.take()).await;
    assert!(child.wait().await.unwrap().success());
    assert_eq!(out, "65534\n65534\n65534\n");
}
