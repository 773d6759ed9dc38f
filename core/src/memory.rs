//! Available memory, as memory admission (`PERAGO_MIN_FREE_MEMORY`, `PERAGO_MEMORY_HEADROOM`)
//! measures it.
//!
//! Every limit of the runtime's memory cgroup and its ancestors binds, on either hierarchy:
//!
//! - cgroup v2 (`/proc/self/cgroup` has a `0::/path` line and the cgroup's directory has
//!   `memory.max`): the headroom under a limit is `memory.max − (memory.current −
//!   inactive_file)`;
//! - cgroup v1 (a `N:memory:/path` line, the hierarchy mounted at `/sys/fs/cgroup/memory`):
//!   `memory.limit_in_bytes − (memory.usage_in_bytes − total_inactive_file)` (`memory.stat`'s
//!   hierarchical count; an unlimited v1 cgroup shows a limit near 2^63, which never binds).
//!
//! Page cache the kernel can drop first does not count as used (as kubelet and `docker stats`
//! count it), and the smallest headroom wins. Available memory is that headroom or the host's
//! `MemAvailable` (`/proc/meminfo`), whichever is smaller; outside a limited cgroup it is
//! `MemAvailable`.
//!
//! The parsers take text, so they are tested with fixtures; [`available_memory`] only reads.

use std::{
    io,
    path::{Path, PathBuf},
};

/// Available memory that cannot be measured.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// `/proc/meminfo` cannot be read.
    #[error("cannot read {}", path.display())]
    Read {
        /// The meminfo file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// `/proc/meminfo` has no `MemAvailable` line.
    #[error("{} has no MemAvailable line", path.display())]
    NoMemAvailable {
        /// The meminfo file.
        path: PathBuf,
    },
}

/// Where cgroup v2 is mounted (and, below it, `memory/`, the cgroup v1 memory hierarchy).
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Where the cgroup v1 memory hierarchy is mounted, under [`CGROUP_ROOT`].
pub const CGROUP_V1_MEMORY: &str = "memory";

/// `MemAvailable` of `/proc/meminfo`, in bytes.
pub fn parse_meminfo_available(meminfo: &str) -> Option<u64> {
    let line = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?;
    let mut words = line.split_whitespace();
    let value: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => value.checked_mul(1024),
        None => Some(value),
        Some(_) => None,
    }
}

/// The cgroup v2 path of `/proc/self/cgroup` (the `0::/path` line), if any.
pub fn parse_cgroup_v2_path(cgroup: &str) -> Option<&str> {
    cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::trim)
        .filter(|p| p.starts_with('/'))
}

/// The cgroup v1 memory path of `/proc/self/cgroup` (the `N:…memory…:/path` line), if any.
pub fn parse_cgroup_v1_memory_path(cgroup: &str) -> Option<&str> {
    cgroup.lines().find_map(|l| {
        let mut fields = l.splitn(3, ':');
        let (_id, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        let path = path.trim();
        (controllers.split(',').any(|c| c == "memory") && path.starts_with('/')).then_some(path)
    })
}

/// A `memory.max`: `Some(bytes)`, or `None` for `max` (no limit) and anything unreadable.
pub fn parse_memory_max(text: &str) -> Option<u64> {
    match text.trim() {
        "max" => None,
        n => n.parse().ok(),
    }
}

/// `inactive_file` of a `memory.stat`, in bytes (0 when absent).
pub fn parse_inactive_file(stat: &str) -> u64 {
    stat_field(stat, "inactive_file")
}

/// `total_inactive_file` of a cgroup v1 `memory.stat` (the cgroup and its descendants), in
/// bytes (0 when absent).
pub fn parse_total_inactive_file(stat: &str) -> u64 {
    stat_field(stat, "total_inactive_file")
}

fn stat_field(stat: &str, name: &str) -> u64 {
    stat.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// One limited cgroup on the way up: its limit and what it uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupUsage {
    /// `memory.max`.
    pub max: u64,
    /// `memory.current`.
    pub current: u64,
    /// `inactive_file` of `memory.stat`: reclaimable page cache.
    pub inactive_file: u64,
}

impl CgroupUsage {
    /// The bytes this cgroup can still take.
    pub fn headroom(&self) -> u64 {
        let used = self.current.saturating_sub(self.inactive_file);
        self.max.saturating_sub(used)
    }
}

/// Available memory: the smallest cgroup headroom, capped by the host's `MemAvailable`.
pub fn available(mem_available: u64, cgroups: &[CgroupUsage]) -> u64 {
    cgroups
        .iter()
        .map(CgroupUsage::headroom)
        .fold(mem_available, u64::min)
}

/// The directories of a cgroup and its ancestors under `root`, the cgroup first.
pub fn cgroup_dirs(root: &Path, cgroup_path: &str) -> Vec<std::path::PathBuf> {
    let parts: Vec<&str> = cgroup_path.split('/').filter(|p| !p.is_empty()).collect();
    (0..=parts.len())
        .rev()
        .map(|n| {
            parts[..n]
                .iter()
                .fold(root.to_path_buf(), |dir, p| dir.join(p))
        })
        .collect()
}

/// Reads the cgroup v1 memory cgroups of `cgroup_path` (under `root`, the v1 memory
/// hierarchy's mount), the cgroup first.
fn read_cgroups_v1(root: &Path, cgroup_path: &str) -> Vec<CgroupUsage> {
    let read = |dir: &Path, file: &str| std::fs::read_to_string(dir.join(file)).ok();
    cgroup_dirs(root, cgroup_path)
        .iter()
        .filter_map(|dir| {
            let max = read(dir, "memory.limit_in_bytes")?.trim().parse().ok()?;
            let current = read(dir, "memory.usage_in_bytes")?.trim().parse().ok()?;
            let inactive_file =
                read(dir, "memory.stat").map_or(0, |s| parse_total_inactive_file(&s));
            Some(CgroupUsage {
                max,
                current,
                inactive_file,
            })
        })
        .collect()
}

/// Reads the limited cgroups of `cgroup_path` (under `root`), the cgroup first.
fn read_cgroups(root: &Path, cgroup_path: &str) -> Vec<CgroupUsage> {
    let read = |dir: &Path, file: &str| std::fs::read_to_string(dir.join(file)).ok();
    cgroup_dirs(root, cgroup_path)
        .iter()
        .filter_map(|dir| {
            let max = parse_memory_max(&read(dir, "memory.max")?)?;
            let current = read(dir, "memory.current")?.trim().parse().ok()?;
            let inactive_file = read(dir, "memory.stat").map_or(0, |s| parse_inactive_file(&s));
            Some(CgroupUsage {
                max,
                current,
                inactive_file,
            })
        })
        .collect()
}

/// Available memory now (cgroup v1 and v2 aware), in bytes; `proc` is `/proc`, `cgroup_root`
/// where cgroup v2 is mounted (the v1 memory hierarchy at its `memory/`).
pub fn available_memory_at(proc: &Path, cgroup_root: &Path) -> Result<u64, MemoryError> {
    let meminfo_path = proc.join("meminfo");
    let meminfo = match std::fs::read_to_string(&meminfo_path) {
        Ok(text) => text,
        Err(source) => {
            return Err(MemoryError::Read {
                path: meminfo_path,
                source,
            });
        }
    };
    let Some(mem_available) = parse_meminfo_available(&meminfo) else {
        return Err(MemoryError::NoMemAvailable { path: meminfo_path });
    };
    let text = std::fs::read_to_string(proc.join("self/cgroup")).unwrap_or_default();
    let mut cgroups =
        parse_cgroup_v2_path(&text).map_or_else(Vec::new, |p| read_cgroups(cgroup_root, p));
    if let Some(p) = parse_cgroup_v1_memory_path(&text) {
        cgroups.extend(read_cgroups_v1(&cgroup_root.join(CGROUP_V1_MEMORY), p));
    }
    Ok(available(mem_available, &cgroups))
}

/// Available memory now (cgroup v1 and v2 aware), in bytes.
pub fn available_memory() -> Result<u64, MemoryError> {
    available_memory_at(Path::new("/proc"), Path::new(CGROUP_ROOT))
}

/// `1.5GiB`, `512MiB`, `800KiB`, `12B`: a byte count for logs and reasons.
pub fn format_bytes(n: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (unit, size) in UNITS {
        if n >= size {
            return if n.is_multiple_of(size) {
                format!("{}{unit}", n / size)
            } else {
                format!("{:.1}{unit}", n as f64 / size as f64)
            };
        }
    }
    format!("{n}B")
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMINFO: &str = "MemTotal:       32768000 kB\nMemFree:         1000000 kB\nMemAvailable:   23920220 kB\nBuffers:          100 kB\n";

    #[test]
    fn meminfo_available_is_in_bytes() {
        assert_eq!(parse_meminfo_available(MEMINFO), Some(23_920_220 * 1024));
        assert_eq!(parse_meminfo_available("MemTotal: 5 kB\n"), None);
        assert_eq!(parse_meminfo_available("MemAvailable: x kB\n"), None);
    }

    #[test]
    fn the_cgroup_v2_line_is_found_among_v1_lines() {
        let hybrid = "4:memory:/process_api/abc\n1:cpu:/\n0::/system.slice/perago.service\n";
        assert_eq!(
            parse_cgroup_v2_path(hybrid),
            Some("/system.slice/perago.service")
        );
        assert_eq!(parse_cgroup_v2_path("0::/\n"), Some("/"));
        assert_eq!(parse_cgroup_v2_path("4:memory:/x\n"), None);
    }

    #[test]
    fn memory_max_and_stat() {
        assert_eq!(parse_memory_max("max\n"), None);
        assert_eq!(parse_memory_max("1073741824\n"), Some(1 << 30));
        assert_eq!(
            parse_inactive_file("anon 10\ninactive_file 4096\nactive_file 1\n"),
            4096
        );
        assert_eq!(parse_inactive_file("anon 10\n"), 0);
    }

    #[test]
    fn the_smallest_headroom_wins_capped_by_mem_available() {
        let gib = 1u64 << 30;
        let cgroup = CgroupUsage {
            max: 4 * gib,
            current: 3 * gib,
            inactive_file: gib / 2,
        };
        assert_eq!(cgroup.headroom(), gib + gib / 2);
        let parent = CgroupUsage {
            max: 8 * gib,
            current: 7 * gib,
            inactive_file: 0,
        };
        assert_eq!(available(16 * gib, &[cgroup, parent]), gib);
        assert_eq!(available(gib / 4, &[cgroup, parent]), gib / 4);
        assert_eq!(available(16 * gib, &[]), 16 * gib);
        // Above its limit (memory.max lowered under the usage), nothing is available.
        let over = CgroupUsage {
            max: gib,
            current: 2 * gib,
            inactive_file: 0,
        };
        assert_eq!(available(16 * gib, &[over]), 0);
    }

    #[test]
    fn cgroup_dirs_go_up_to_the_root() {
        let root = Path::new("/sys/fs/cgroup");
        assert_eq!(
            cgroup_dirs(root, "/a/b"),
            [root.join("a/b"), root.join("a"), root.to_path_buf()]
        );
        assert_eq!(cgroup_dirs(root, "/"), [root.to_path_buf()]);
    }

    #[test]
    fn reads_a_limited_cgroup_tree() {
        let dir = tempfile::tempdir().unwrap();
        let proc = dir.path().join("proc");
        let root = dir.path().join("cgroup");
        std::fs::create_dir_all(proc.join("self")).unwrap();
        std::fs::create_dir_all(root.join("outer/inner")).unwrap();
        std::fs::write(proc.join("meminfo"), MEMINFO).unwrap();
        std::fs::write(proc.join("self/cgroup"), "0::/outer/inner\n").unwrap();
        // The inner cgroup has no limit of its own; the outer one binds.
        std::fs::write(root.join("outer/inner/memory.max"), "max\n").unwrap();
        std::fs::write(root.join("outer/inner/memory.current"), "100\n").unwrap();
        std::fs::write(root.join("outer/memory.max"), "1000000\n").unwrap();
        std::fs::write(root.join("outer/memory.current"), "400000\n").unwrap();
        std::fs::write(root.join("outer/memory.stat"), "inactive_file 100000\n").unwrap();
        assert_eq!(available_memory_at(&proc, &root).unwrap(), 700_000);
        // Outside any cgroup v2 (or without the files): MemAvailable.
        std::fs::write(proc.join("self/cgroup"), "4:memory:/x\n").unwrap();
        assert_eq!(
            available_memory_at(&proc, &root).unwrap(),
            23_920_220 * 1024
        );
        std::fs::write(proc.join("self/cgroup"), "0::/elsewhere\n").unwrap();
        assert_eq!(
            available_memory_at(&proc, &root).unwrap(),
            23_920_220 * 1024
        );
        assert!(matches!(
            available_memory_at(&root, &root),
            Err(MemoryError::Read { ref path, .. }) if *path == root.join("meminfo")
        ));
        std::fs::write(proc.join("meminfo"), "MemTotal: 1 kB\n").unwrap();
        let err = available_memory_at(&proc, &root).unwrap_err();
        assert!(matches!(err, MemoryError::NoMemAvailable { .. }));
        assert_eq!(
            err.to_string(),
            format!(
                "{} has no MemAvailable line",
                proc.join("meminfo").display()
            )
        );
    }

    #[test]
    fn the_cgroup_v1_memory_line_is_found() {
        let v1 = "9:name=systemd:/\n4:memory:/process_api/abc\n1:cpu:/\n0::/\n";
        assert_eq!(parse_cgroup_v1_memory_path(v1), Some("/process_api/abc"));
        // Controllers mounted together.
        assert_eq!(
            parse_cgroup_v1_memory_path("3:cpu,memory:/kubepods/pod1\n"),
            Some("/kubepods/pod1")
        );
        assert_eq!(parse_cgroup_v1_memory_path("0::/x\n4:memsw:/y\n"), None);
        assert_eq!(
            parse_total_inactive_file("inactive_file 5\ntotal_inactive_file 4096\n"),
            4096
        );
        assert_eq!(parse_inactive_file("total_inactive_file 4096\n"), 0);
    }

    #[test]
    fn reads_a_limited_cgroup_v1_tree() {
        let dir = tempfile::tempdir().unwrap();
        let proc = dir.path().join("proc");
        let root = dir.path().join("cgroup");
        let v1 = root.join("memory");
        std::fs::create_dir_all(proc.join("self")).unwrap();
        std::fs::create_dir_all(v1.join("outer/inner")).unwrap();
        std::fs::write(proc.join("meminfo"), MEMINFO).unwrap();
        std::fs::write(
            proc.join("self/cgroup"),
            "9:name=systemd:/\n4:memory:/outer/inner\n0::/\n",
        )
        .unwrap();
        // The root and the inner cgroup are unlimited (v1 shows a limit near 2^63).
        for d in [v1.clone(), v1.join("outer/inner")] {
            std::fs::write(d.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
            std::fs::write(d.join("memory.usage_in_bytes"), "5000000\n").unwrap();
        }
        // The outer one binds: 600 MiB, 500 MiB used of which 50 MiB droppable page cache.
        let mib = 1u64 << 20;
        let outer = v1.join("outer");
        std::fs::write(
            outer.join("memory.limit_in_bytes"),
            format!("{}\n", 600 * mib),
        )
        .unwrap();
        std::fs::write(
            outer.join("memory.usage_in_bytes"),
            format!("{}\n", 500 * mib),
        )
        .unwrap();
        std::fs::write(
            outer.join("memory.stat"),
            format!(
                "cache 1\ninactive_file 7\ntotal_inactive_file {}\n",
                50 * mib
            ),
        )
        .unwrap();
        assert_eq!(available_memory_at(&proc, &root).unwrap(), 150 * mib);
        // Over its limit: nothing.
        std::fs::write(
            outer.join("memory.usage_in_bytes"),
            format!("{}\n", 700 * mib),
        )
        .unwrap();
        assert_eq!(available_memory_at(&proc, &root).unwrap(), 0);
        // MemAvailable caps an unlimited tree.
        std::fs::remove_file(outer.join("memory.limit_in_bytes")).unwrap();
        assert_eq!(
            available_memory_at(&proc, &root).unwrap(),
            23_920_220 * 1024
        );
    }

    #[test]
    fn this_machine_has_some_memory_available() {
        assert!(available_memory().unwrap() > 0);
    }

    #[test]
    fn byte_counts_read_like_settings() {
        assert_eq!(format_bytes(1 << 30), "1GiB");
        assert_eq!(format_bytes(812 << 20), "812MiB");
        assert_eq!(format_bytes(3 << 29), "1.5GiB");
        assert_eq!(format_bytes(100 << 40), "100TiB");
        assert_eq!(format_bytes(12), "12B");
    }
}
