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
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}
