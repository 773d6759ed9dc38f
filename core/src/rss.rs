//! Resident memory of a process tree, for executor recycling (`--max-executor-memory`): the
//! executor and every process below it (its bodies, a persistent `jsonl` body and what they
//! started; the executor is a child subreaper, so even detached ones stay below it).

use std::io;

/// The resident set size of `pid` and every live descendant, in bytes. Descendants are found
/// by scanning `/proc/*/stat` for parent links once; each one's RSS is `VmRSS` of
/// `/proc/<pid>/status`. Pages shared between processes (the same binary, shared
/// memory) are counted in each. Processes that end during the scan are skipped; `pid` itself
/// must exist.
pub fn tree_rss(pid: u32) -> io::Result<u64> {
    let own = resident_bytes(pid)?;
    let mut links: Vec<(u32, u32)> = Vec::new();
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(stat) = perago_sys::proc::stat(child)
            && stat.state != 'Z'
        {
            links.push((child, stat.ppid));
        }
    }
    let mut tree = vec![pid];
    let mut next = 0;
    while next < tree.len() {
        let parent = tree[next];
        for &(child, ppid) in &links {
            if ppid == parent && !tree.contains(&child) {
                tree.push(child);
            }
        }
        next += 1;
    }
    let below: u64 = tree[1..]
        .iter()
        .filter_map(|p| resident_bytes(*p).ok())
        .sum();
    Ok(own + below)
}

/// `VmRSS` of `/proc/<pid>/status`, in bytes (0 for a process without memory of its own).
fn resident_bytes(pid: u32) -> io::Result<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let Some(line) = text.lines().find(|l| l.starts_with("VmRSS:")) else {
        return Ok(0);
    };
    let kib: u64 = line["VmRSS:".len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .map_err(|_| io::Error::other(format!("unexpected /proc/{pid}/status line: {line:?}")))?;
    Ok(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead as _, BufReader};
    use std::process::{Command, Stdio};

    const MIB: u64 = 1 << 20;

    /// A child that allocates and touches `mib` MiB, says so on stdout, then waits.
    fn allocating_child(mib: u64) -> std::process::Child {
        let script = format!(
            "import sys; b = bytearray({mib} * 1024 * 1024)\n\
             for i in range(0, len(b), 4096): b[i] = 1\n\
             print('ready', flush=True); sys.stdin.read()"
        );
        let mut child = Command::new("python3")
            .args(["-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready");
        child
    }

    #[test]
    fn a_childs_allocation_counts_in_its_parents_tree() {
        let me = std::process::id();
        let before = tree_rss(me).unwrap();
        let mut child = allocating_child(64);
        let with_child = tree_rss(me).unwrap();
        let child_alone = tree_rss(child.id()).unwrap();
        drop(child.stdin.take());
        child.wait().unwrap();
        assert!(child_alone >= 64 * MIB, "{child_alone}");
        // Other tests of this binary run at the same time: allow for their noise.
        assert!(
            with_child >= before + 48 * MIB,
            "before {before}, with the child {with_child}"
        );
        let after = tree_rss(me).unwrap();
        assert!(
            after + 32 * MIB < with_child,
            "after {after}, with the child {with_child}"
        );
    }

    #[test]
    fn a_gone_process_is_an_error() {
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(tree_rss(pid).is_err());
    }
}
