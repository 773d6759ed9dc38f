//! Tests of the subreaper's clean-up: what it kills, what it spares.

use super::*;
use crate::{
    signal::{SIGKILL, signal_process},
    spawn::Spawn,
};
use std::time::{Duration, Instant};

/// Live processes whose command line contains `marker`.
fn alive_with(marker: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        // Only `sleep` itself: the shells and `setsid` that start it carry the marker in
        // their command lines too, for a moment, and are gone the next instant.
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let mut args = cmdline.split(|b| *b == 0);
        let is_sleep = args
            .next()
            .is_some_and(|argv0| argv0 == b"sleep" || argv0.ends_with(b"/sleep"));
        if is_sleep
            && args.any(|a| a == marker.as_bytes())
            && stat(pid).is_some_and(|s| s.state != 'Z')
        {
            found.push(pid);
        }
    }
    found
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A body that double-forks a `setsid` daemon (`sleep marker`) and exits; returns the
/// daemon's pid once this process (a subreaper) has adopted it.
async fn leave_adopted_daemon(marker: &str) -> u32 {
    let mut body = tokio::process::Command::new("sh");
    body.args(["-c", &format!("(setsid sleep {marker} &); exit 0")]);
    let (mut body, guard) = spawn(&mut body).unwrap();
    assert!(body.wait().await.unwrap().success());
    drop(guard);
    // Started, and adopted once the subshell that started it has exited.
    wait_for("the daemon to be adopted", || {
        alive_with(marker)
            .first()
            .is_some_and(|pid| stat(*pid).is_some_and(|s| s.ppid == std::process::id()))
    });
    alive_with(marker)[0]
}

#[tokio::test]
async fn kill_adopted_ends_a_double_forked_setsid_daemon_and_spares_managed_children() {
    become_subreaper().unwrap();
    // Unique durations mark the processes: `sleep` has no other argument to carry a marker.
    let daemon = format!("1000.{}1", std::process::id());
    let managed = format!("1000.{}2", std::process::id());
    let mut keep = tokio::process::Command::new("sleep");
    keep.arg(&managed).kill_on_drop(true);
    let (_kept, _kept_guard) = spawn(&mut keep).unwrap();
    let pid = leave_adopted_daemon(&daemon).await;

    assert!(kill_adopted() >= 1);
    assert_eq!(alive_with(&daemon), Vec::<u32>::new(), "the daemon is gone");
    assert_eq!(
        stat(pid),
        None,
        "and reaped, not left a zombie (or its pid reused)"
    );
    assert_eq!(
        alive_with(&managed).len(),
        1,
        "a managed child is not touched"
    );
}

/// The shortcut that skips `/proc` must see every kind of child: a live one, and one that
/// exited and is not reaped yet (a zombie still to be waited for).
#[test]
fn has_children_sees_live_and_exited_unreaped_children() {
    let mut child = std::process::Command::new("sleep")
        .arg("1000")
        .spawn()
        .unwrap();
    assert!(has_children(), "a live child");
    child.kill().unwrap();
    wait_for("the child to become a zombie", || {
        stat(child.id()).is_some_and(|s| s.state == 'Z')
    });
    assert!(has_children(), "an exited child not yet reaped");
    child.wait().unwrap();
}

#[tokio::test]
async fn kill_adopted_ends_what_a_spawned_body_left_and_spares_a_spawned_body_that_runs() {
    become_subreaper().unwrap();
    let daemon = format!("1002.{}1", std::process::id());
    let running = format!("1002.{}2", std::process::id());
    let (_running, _running_guard) = Spawn::new("sleep").arg(&running).spawn().unwrap();
    let (mut body, guard) = Spawn::new("/bin/sh")
        .args(["-c", &format!("(setsid sleep {daemon} &); exit 0")])
        .env("PATH", "/usr/bin:/bin")
        .spawn()
        .unwrap();
    assert!(body.wait().await.unwrap().success());
    drop(guard);
    wait_for("the daemon to be adopted", || {
        alive_with(&daemon)
            .first()
            .is_some_and(|pid| stat(*pid).is_some_and(|s| s.ppid == std::process::id()))
    });
    let pid = alive_with(&daemon)[0];

    assert!(kill_adopted() >= 1);
    assert_eq!(alive_with(&daemon), Vec::<u32>::new(), "the daemon is gone");
    assert_eq!(stat(pid), None, "and reaped");
    assert_eq!(
        alive_with(&running).len(),
        1,
        "a body being run is not touched"
    );
}

#[tokio::test]
async fn the_main_threads_children_are_read_afresh_from_the_file_kept_open() {
    become_subreaper().unwrap();
    let me = std::process::id();
    let end = |pid: u32| {
        signal_process(pid, SIGKILL).unwrap();
        // SAFETY: waitpid(2) on our own child, killed above.
        unsafe { libc::waitpid(pid as i32, std::ptr::null_mut(), 0) };
    };
    // Opened (and kept) before the daemons exist.
    main_thread_children(me).unwrap();
    let first = leave_adopted_daemon(&format!("1003.{}1", std::process::id())).await;
    assert!(children_of_threads(&[me]).contains(&first));
    end(first);
    // Read from its start: a read going on from where the last one ended would skip it.
    let second = leave_adopted_daemon(&format!("1003.{}2", std::process::id())).await;
    let now = children_of_threads(&[me]);
    assert!(now.contains(&second) && !now.contains(&first), "{now:?}");
    end(second);
}

/// After an assignment only the main thread and the body's threads are looked at: the
/// kernel hands an orphan to a subreaper's main thread, even when the process that left it
/// was started from another thread; a process started directly by a thread is that
/// thread's child, found only when that thread is named.
#[tokio::test]
async fn kill_adopted_below_finds_orphans_on_the_main_thread_and_children_of_named_threads() {
    become_subreaper().unwrap();
    // This test runs on a thread of the test harness, not the main thread.
    let me = current_tid();
    assert_ne!(me, std::process::id());
    let daemon = format!("1001.{}1", std::process::id());
    let direct = format!("1001.{}2", std::process::id());
    leave_adopted_daemon(&daemon).await;
    // Started directly from this thread and not managed: what a Rust body might leave.
    let child = std::process::Command::new("sleep")
        .arg(&direct)
        .spawn()
        .unwrap();
    let direct_pid = child.id();
    std::mem::forget(child);

    assert!(
        kill_adopted_below(&[]) >= 1,
        "the orphan, on the main thread"
    );
    assert_eq!(alive_with(&daemon), Vec::<u32>::new(), "the daemon is gone");
    assert_eq!(alive_with(&direct).len(), 1, "not this thread's child");
    assert_eq!(kill_adopted_below(&[me]), 1);
    assert_eq!(alive_with(&direct), Vec::<u32>::new());
    assert_eq!(stat(direct_pid), None, "reaped");
}

/// A pid found in `/proc` is signalled only while it is still below the parent it was found
/// under (or re-parented to this process): a pid that names another process by then is left
/// alone.
#[tokio::test]
async fn kill_found_signals_only_a_process_still_below_the_parent_it_was_found_under() {
    let marker = format!("1004.{}1", std::process::id());
    let (mut shell, _managed) = Spawn::new("/bin/sh")
        .args(["-c", &format!("sleep {marker} & wait")])
        .env("PATH", "/usr/bin:/bin")
        .spawn()
        .unwrap();
    wait_for("the shell's sleep", || !alive_with(&marker).is_empty());
    let sleep = alive_with(&marker)[0];
    assert_eq!(stat(sleep).unwrap().ppid, shell.id());
    // Found under another parent than its own: not the process that was found.
    assert!(!kill_found(sleep, shell.id() + 1_000_000));
    assert_eq!(alive_with(&marker), vec![sleep], "left alone");
    assert!(kill_found(sleep, shell.id()));
    wait_for("the sleep to die", || alive_with(&marker).is_empty());
    assert!(shell.wait().await.unwrap().success(), "`wait` saw it end");
    assert!(!kill_found(sleep, shell.id()), "gone: nothing to signal");
}

/// A process is counted once however many rounds it takes to die: one with a large memory
/// to free is still alive (and signalled again) at the next round, 2 ms later.
#[tokio::test]
async fn a_process_slow_to_die_is_counted_once() {
    use std::io::BufRead as _;
    let me = current_tid();
    // Started directly from this thread and not managed; it says when its memory is touched.
    let mut child = std::process::Command::new("python3")
        .args([
            "-c",
            "b = b'x' * (512 << 20); print('ready', flush=True); import time; time.sleep(1005)",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
    std::mem::forget(child);
    assert_eq!(kill_adopted_below(&[me]), 1, "one process killed");
    assert_eq!(stat(pid), None, "reaped");
}
