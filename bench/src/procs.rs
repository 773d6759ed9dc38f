//! Process inspection for the memory figures: descendants of a process and their resident
//! set sizes, read from /proc.

use std::fs;

/// `(pid, ppid, argv[0])` of every live process.
fn all() -> Vec<(u32, u32, String)> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let rest = stat.rsplit_once(") ")?.1;
            let mut fields = rest.split_whitespace();
            if fields.next()? == "Z" {
                return None;
            }
            let ppid = fields.next()?.parse().ok()?;
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let argv0 = cmdline
                .split(|b| *b == 0)
                .next()
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .unwrap_or_default();
            Some((pid, ppid, argv0))
        })
        .collect()
}

/// Every descendant of `root`: `(pid, argv[0])`.
pub(crate) fn descendants(root: u32) -> Vec<(u32, String)> {
    let procs = all();
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for (pid, ppid, argv0) in &procs {
            if *ppid == parent {
                out.push((*pid, argv0.clone()));
                frontier.push(*pid);
            }
        }
    }
    out
}

/// Resident set size in MiB.
pub(crate) fn rss_mib(pid: u32) -> Option<f64> {
    status_mib(pid, "VmRSS:")
}

/// The anonymous part of a process's RSS in MiB (`RssAnon`: heap, stacks; not the binary's
/// pages, which the page cache shares between every process of the binary, and of which
/// the kernel maps up to 64 KiB around each page touched).
pub(crate) fn anon_rss_mib(pid: u32) -> Option<f64> {
    status_mib(pid, "RssAnon:")
}

/// A `kB` line of `/proc/<pid>/status`, in MiB.
fn status_mib(pid: u32, key: &str) -> Option<f64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = status
        .lines()
        .find(|l| l.starts_with(key))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}

/// CPU time of one process in seconds: its own (user + system), and that of its children it
/// has reaped (`cutime + cstime`), from `/proc/<pid>/stat`.
pub(crate) fn cpu_seconds(pid: u32) -> Option<(f64, f64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_cpu(&stat, clock_ticks())
}

/// Parses `/proc/<pid>/stat`: fields 14–17 (utime, stime, cutime, cstime) in clock ticks.
fn parse_cpu(stat: &str, ticks_per_second: f64) -> Option<(f64, f64)> {
    // The fields after the command (which may hold spaces and parentheses) start at field 3.
    let rest = stat.rsplit_once(") ")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| -> Option<f64> { fields.get(i)?.parse::<f64>().ok() };
    // utime is field 14, i.e. index 11 after the state (field 3 = index 0).
    let own = tick(11)? + tick(12)?;
    let reaped = tick(13)? + tick(14)?;
    Some((own / ticks_per_second, reaped / ticks_per_second))
}

/// `/proc` reports CPU time in USER_HZ ticks, which Linux fixes at 100 per second on x86 and
/// arm (what `getconf CLK_TCK` prints).
fn clock_ticks() -> f64 {
    100.0
}

/// CPU seconds by role, for processes alive at the time: a snapshot to subtract from a later
/// one.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct CpuByRole(pub(crate) std::collections::BTreeMap<&'static str, f64>);

impl CpuByRole {
    /// What was spent between `earlier` and `self`, per role.
    pub(crate) fn since(&self, earlier: &Self) -> Self {
        Self(
            self.0
                .iter()
                .map(|(role, s)| (*role, s - earlier.0.get(role).copied().unwrap_or(0.0)))
                .collect(),
        )
    }

    pub(crate) fn add(&mut self, role: &'static str, seconds: f64) {
        *self.0.entry(role).or_default() += seconds;
    }

    pub(crate) fn total(&self) -> f64 {
        self.0.values().sum()
    }
}

/// A live process's own CPU seconds, to the nanosecond (its CPU-time clock), else from
/// `/proc/<pid>/stat` (whole ticks).
fn own_seconds(pid: u32, ticked: f64) -> f64 {
    perago_sys::cpu::process_cpu_time(pid).map_or(ticked, |spent| spent.as_secs_f64())
}

/// A perago runtime's CPU by role: the supervisor (its own time), the broker, the executors
/// (their own time; a Rust `Task` body runs inside), and the bodies (every process below an
/// executor, live or reaped by it). A live process's own time is read from its CPU-time clock:
/// `/proc`'s ticks of 10 ms missed the brief wake-ups of 64 executors altogether (0 µs per task
/// at j = 64). What processes reaped (bodies that ended) is only counted in ticks.
pub(crate) fn perago_cpu(supervisor: u32) -> CpuByRole {
    let mut cpu = CpuByRole::default();
    if let Some((own, _)) = cpu_seconds(supervisor) {
        cpu.add("supervisor", own_seconds(supervisor, own));
    }
    for (pid, name) in descendants(supervisor) {
        let Some((own, reaped)) = cpu_seconds(pid) else {
            continue;
        };
        let own = own_seconds(pid, own);
        match name.as_str() {
            "perago-conductor-broker" => cpu.add("broker", own + reaped),
            n if n.starts_with("perago-executor-") => {
                cpu.add("executors", own);
                cpu.add("bodies", reaped);
                for (body, _) in descendants(pid) {
                    if let Some((own, reaped)) = cpu_seconds(body) {
                        cpu.add("bodies", own + reaped);
                    }
                }
            }
            _ => {}
        }
    }
    cpu
}

/// A process tree's CPU as one role (every live process's own time and what it reaped, so
/// nothing is counted twice).
pub(crate) fn tree_cpu(root: u32, role: &'static str) -> CpuByRole {
    let mut cpu = CpuByRole::default();
    for pid in std::iter::once(root).chain(descendants(root).into_iter().map(|(p, _)| p)) {
        if let Some((own, reaped)) = cpu_seconds(pid) {
            cpu.add(role, own_seconds(pid, own) + reaped);
        }
    }
    cpu
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_after_a_command_with_spaces_and_parens() {
        // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
        // utime stime cutime cstime …
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194304 10 0 0 0 250 50 30 20 20 0 1 0";
        assert_eq!(parse_cpu(stat, 100.0), Some((3.0, 0.5)));
    }

    #[test]
    fn a_busy_child_shows_in_its_parent_once_reaped() {
        let me = std::process::id();
        let (_, before) = cpu_seconds(me).unwrap();
        let status = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done"])
            .status()
            .unwrap();
        assert!(status.success());
        let (_, after) = cpu_seconds(me).unwrap();
        assert!(after > before, "reaped child time {before} -> {after}");
        let mut a = CpuByRole::default();
        a.add("x", 1.0);
        let mut b = a.clone();
        b.add("x", 0.5);
        b.add("y", 2.0);
        assert_eq!(b.since(&a).0.get("x"), Some(&0.5));
        assert_eq!(b.since(&a).total(), 2.5);
    }
}
