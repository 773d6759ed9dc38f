//! What `/proc` says about a process: its state, parent, group and start time, and its
//! children. Plain file reads: a pid read here names a process only until that process is
//! reaped (see [`crate::reaper`] for how the kills built on them bound that).

use std::io;

/// What `/proc/<pid>/stat` says: the state letter, the parent and the process group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// `R`, `S`, `D`, `Z` (zombie), …
    pub state: char,
    /// The parent's pid.
    pub ppid: u32,
    /// The process group.
    pub pgid: u32,
    /// When it started, in clock ticks after boot (field 22): with the pid, it names one
    /// process, whatever later reuses the pid.
    pub start_time: Option<u64>,
}

/// Parses the text of `/proc/<pid>/stat`; the command name may hold spaces and parentheses.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgid = fields.next()?.parse().ok()?;
    // Fields 6 to 21, then the start time.
    let start_time = fields.nth(16).and_then(|t| t.parse().ok());
    Some(Stat {
        state,
        ppid,
        pgid,
        start_time,
    })
}

/// The stat of `pid`, `None` once it is gone.
pub fn stat(pid: u32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The children of `pid`, from `/proc/<pid>/task/*/children`, or by scanning every
/// `/proc/*/stat` where the kernel lacks that file.
pub fn children(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return found;
    };
    for task in tasks.flatten() {
        match std::fs::read_to_string(task.path().join("children")) {
            Ok(list) => found.extend(
                list.split_ascii_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            ),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return children_by_scan(pid),
            Err(_) => {}
        }
    }
    found.sort_unstable();
    found.dedup();
    found
}

fn children_by_scan(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| stat(*pid).is_some_and(|s| s.ppid == parent))
        .collect()
}

/// `pid` and every process below it, parents first, each with the parent it was listed under
/// (`pid`'s own is 0): what a kill checks again once it holds a pidfd (see
/// [`crate::reaper`]).
pub fn descendants(pid: u32) -> Vec<(u32, u32)> {
    let mut all = vec![(pid, 0)];
    let mut next = 0;
    while next < all.len() {
        let parent = all[next].0;
        for kid in children(parent) {
            if !all.iter().any(|(p, _)| *p == kid) {
                all.push((kid, parent));
            }
        }
        next += 1;
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_parses_names_with_spaces_and_parentheses() {
        assert_eq!(
            parse_stat("42 (a b) c) S 7 40 40 0 -1 4194560"),
            Some(Stat {
                state: 'S',
                ppid: 7,
                pgid: 40,
                start_time: None,
            })
        );
        assert_eq!(
            parse_stat("42 (x) S 7 40 40 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 1 0 123456 999 1")
                .and_then(|s| s.start_time),
            Some(123_456)
        );
        assert_eq!(parse_stat("42 no parenthesis"), None);
        let me = stat(std::process::id()).expect("this process has a stat");
        assert_ne!(me.state, 'Z');
        assert!(me.start_time.is_some_and(|t| t > 0), "{me:?}");
    }
}
