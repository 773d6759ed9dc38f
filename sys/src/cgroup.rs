//! Memory cgroups for bodies (`[body] memory_limit`): each body runs in a memory cgroup of its
//! own, made by the runtime below the cgroup the runtime itself runs in, so the kernel's OOM
//! killer takes the body (the whole tree it forks) and never the runtime, its broker or its
//! supervisor.
//!
//! Two hierarchies, whichever holds the memory controller:
//!
//! - cgroup v1 (`/sys/fs/cgroup/memory`, a `N:memory:/path` line in `/proc/self/cgroup`): body
//!   cgroups are made in the runtime's own memory cgroup (v1 lets a cgroup hold processes and
//!   children at once). The limit is `memory.limit_in_bytes`, and `memory.memsw.limit_in_bytes`
//!   the same when the kernel accounts swap, so swap does not dodge it; an OOM kill shows in
//!   `memory.oom_control`'s `oom_kill` counter, the peak in `memory.max_usage_in_bytes`.
//! - cgroup v2 (a `0::/path` line, the `cgroup2` mount): v2 forbids processes in a cgroup
//!   whose children get controllers, so the runtime first moves itself into a leaf of its
//!   cgroup, [`RUNTIME_LEAF`], and enables `+memory` for the children ([`prepare`]); body
//!   cgroups are then siblings of that leaf. The cgroup must be delegated to the runtime's
//!   user (systemd `Delegate=yes`, a container's own cgroup namespace). The limit is
//!   `memory.max` (with `memory.swap.max` 0 and `memory.oom.group` 1: the whole tree goes at
//!   once); an OOM kill shows in `memory.events`' `oom_kill`, the peak in `memory.peak`.
//!
//! A body joins its cgroup before it execs: the spawning path opens the cgroup's
//! `cgroup.procs` and the child writes `0` (itself) to it as its first step
//! ([`crate::Spawn::cgroup`]), so no line of the body ever runs outside the limit.
//!
//! Names: `perago-body-<pid>-<start time>-<n>`, the pid and start time (clock ticks after
//! boot, `/proc/<pid>/stat` field 22) of the process that made it. [`collect_stale`] removes
//! those whose maker is gone (a SIGKILLed executor or supervisor), killing what is left in them.
//!
//! The parsers take text, so the path logic is tested with fixtures of both versions.

use std::{
    fs,
    io::{self, Write as _},
    os::fd::{AsFd as _, BorrowedFd, OwnedFd},
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

/// The leaf a cgroup v2 runtime moves itself into, so that its own cgroup can give the memory
/// controller to the bodies' cgroups beside it.
pub const RUNTIME_LEAF: &str = "perago-runtime";

/// The prefix of every body cgroup's name.
pub const BODY_PREFIX: &str = "perago-body-";

/// What would make memory limits work, for every error that says none can be set.
pub const HOW_TO_FIX: &str = "run perago as root (cgroup v1 or v2), or under systemd with Delegate=yes (cgroup v2), or in a container given its own writable cgroup (cgroup v2 with the memory controller, e.g. a Kubernetes pod or docker run --cgroupns=private with a writable /sys/fs/cgroup), or remove body.memory_limit";

/// Why no body cgroup can be made.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// Neither a v1 memory hierarchy nor a v2 one with the memory controller.
    #[error("memory_limit needs a writable memory cgroup, and {0}: {HOW_TO_FIX}")]
    NoController(String),
    /// The cgroup is there but not writable (not root, not delegated).
    #[error(
        "memory_limit needs a writable memory cgroup, and {} is not writable ({cause}): {HOW_TO_FIX}",
        path.display()
    )]
    NotWritable {
        /// The file or folder.
        path: PathBuf,
        /// The I/O error (mid-sentence: in the message, not a source).
        cause: io::Error,
    },
    /// v2: the cgroup holds processes other than the runtime's, so it cannot give the memory
    /// controller to children.
    #[error(
        "memory_limit needs a writable memory cgroup, and {} cannot enable the memory controller for its children ({cause}): it still holds processes other than this runtime's ({others}); run perago as the only process of its cgroup (systemd: a service of its own with Delegate=yes)",
        path.display()
    )]
    Busy {
        /// The cgroup's folder.
        path: PathBuf,
        /// The other pids.
        others: String,
        /// The I/O error (mid-sentence: in the message, not a source).
        cause: io::Error,
    },
    /// Any other file operation.
    #[error("memory cgroup {}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> CgroupError + '_ {
    move |source| match source.kind() {
        io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => {
            CgroupError::NotWritable {
                path: path.to_owned(),
                cause: source,
            }
        }
        _ => CgroupError::Io {
            path: path.to_owned(),
            source,
        },
    }
}

/// Which cgroup version holds the memory controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// The v1 `memory` hierarchy.
    V1,
    /// The unified v2 hierarchy.
    V2,
}

impl Version {
    /// `v1`, `v2`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V1 => "v1",
            Self::V2 => "v2",
        }
    }
}

/// This process's memory cgroup: which version, and its folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    /// v1 or v2.
    pub version: Version,
    /// The cgroup's folder, e.g. `/sys/fs/cgroup/memory/process_api/abc` (v1) or
    /// `/sys/fs/cgroup/system.slice/perago.service` (v2).
    pub dir: PathBuf,
}

impl Located {
    /// Where body cgroups go: the cgroup itself (v1), or, v2, the parent of the
    /// [`RUNTIME_LEAF`] the runtime moved into (the cgroup itself before [`prepare`]).
    pub fn body_parent(&self) -> PathBuf {
        match self.version {
            Version::V2 if self.dir.file_name().is_some_and(|n| n == RUNTIME_LEAF) => self
                .dir
                .parent()
                .map_or_else(|| self.dir.clone(), Path::to_owned),
            _ => self.dir.clone(),
        }
    }
}

/// One line of `/proc/self/mountinfo` that matters here: a cgroup (v1) or cgroup2 mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMount {
    /// The cgroup path mounted there (field 4: `/` unless a container sees only a subtree).
    pub root: String,
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// `true` for `cgroup2`.
    pub v2: bool,
    /// The super options (v1: the controllers, e.g. `rw,memory`).
    pub options: String,
}

/// The cgroup and cgroup2 mounts of a `/proc/<pid>/mountinfo` text.
pub fn parse_mountinfo(text: &str) -> Vec<CgroupMount> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fields: Vec<&str> = left.split(' ').collect();
            let mut right = right.split(' ');
            let fstype = right.next()?;
            let _source = right.next()?;
            let options = right.next().unwrap_or("").to_owned();
            let v2 = match fstype {
                "cgroup2" => true,
                "cgroup" => false,
                _ => return None,
            };
            Some(CgroupMount {
                root: unescape(fields.get(3)?),
                mount_point: PathBuf::from(unescape(fields.get(4)?)),
                v2,
                options,
            })
        })
        .collect()
}

/// mountinfo writes space, tab, newline and backslash as `\040`-style octal escapes.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let value =
                (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(value);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The memory cgroup paths of a `/proc/<pid>/cgroup` text: the v1 `memory` controller's, and
/// the v2 (`0::`) one.
pub fn parse_proc_cgroup(text: &str) -> (Option<String>, Option<String>) {
    let mut v1 = None;
    let mut v2 = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            v2 = Some(path.to_owned());
        } else if controllers.split(',').any(|c| c == "memory") {
            v1 = Some(path.to_owned());
        }
    }
    (v1, v2)
}

/// `mount_point` + (`path` less the mount's `root`), `None` when `path` is outside `root`.
fn under_mount(mount: &CgroupMount, path: &str) -> Option<PathBuf> {
    let root = mount.root.trim_end_matches('/');
    let rest = path.strip_prefix(root)?;
    if !rest.is_empty() && !rest.starts_with('/') {
        return None;
    }
    let rest = rest.trim_start_matches('/');
    Some(if rest.is_empty() {
        mount.mount_point.clone()
    } else {
        mount.mount_point.join(rest)
    })
}

/// This process's memory cgroup from the texts of `/proc/self/cgroup` and
/// `/proc/self/mountinfo`, and `controllers_of` (the text of a v2 cgroup's
/// `cgroup.controllers`, `None` if unreadable). The v1 memory hierarchy wins where it is
/// mounted (a hybrid host's v2 hierarchy then has no memory controller).
pub fn locate_in(
    proc_cgroup: &str,
    mountinfo: &str,
    controllers_of: impl Fn(&Path) -> Option<String>,
) -> Result<Located, CgroupError> {
    let (v1, v2) = parse_proc_cgroup(proc_cgroup);
    let mounts = parse_mountinfo(mountinfo);
    if let Some(path) = &v1 {
        let dir = mounts
            .iter()
            .filter(|m| !m.v2 && m.options.split(',').any(|o| o == "memory"))
            .find_map(|m| under_mount(m, path));
        return match dir {
            Some(dir) => Ok(Located {
                version: Version::V1,
                dir,
            }),
            None => Err(CgroupError::NoController(format!(
                "this process is in memory cgroup {path} (cgroup v1), but no mount of the memory hierarchy shows it"
            ))),
        };
    }
    let Some(path) = &v2 else {
        return Err(CgroupError::NoController(
            "/proc/self/cgroup names no memory cgroup (neither a v1 memory controller nor cgroup v2)"
                .to_owned(),
        ));
    };
    let Some(dir) = mounts
        .iter()
        .filter(|m| m.v2)
        .find_map(|m| under_mount(m, path))
    else {
        return Err(CgroupError::NoController(format!(
            "this process is in cgroup {path} (cgroup v2), but no cgroup2 mount shows it"
        )));
    };
    let controllers = controllers_of(&dir).unwrap_or_default();
    if !controllers.split_whitespace().any(|c| c == "memory") {
        return Err(CgroupError::NoController(format!(
            "the memory controller is not enabled for cgroup {} (cgroup v2: its parent's cgroup.subtree_control lacks +memory)",
            dir.display()
        )));
    }
    Ok(Located {
        version: Version::V2,
        dir,
    })
}

/// This process's memory cgroup (see [`locate_in`]).
pub fn locate() -> Result<Located, CgroupError> {
    let read = |path: &str| {
        fs::read_to_string(path).map_err(|source| CgroupError::Io {
            path: PathBuf::from(path),
            source,
        })
    };
    locate_in(
        &read("/proc/self/cgroup")?,
        &read("/proc/self/mountinfo")?,
        |dir| fs::read_to_string(dir.join("cgroup.controllers")).ok(),
    )
}

/// The files a version uses.
#[derive(Debug, Clone, Copy)]
struct Files {
    limit: &'static str,
    /// Written with the limit too when it exists (v1: swap accounted with memory; v2: swap
    /// off: `0`).
    swap: &'static str,
    peak: &'static str,
    /// Holds an `oom_kill N` line.
    events: &'static str,
}

fn files(version: Version) -> Files {
    match version {
        Version::V1 => Files {
            limit: "memory.limit_in_bytes",
            swap: "memory.memsw.limit_in_bytes",
            peak: "memory.max_usage_in_bytes",
            events: "memory.oom_control",
        },
        Version::V2 => Files {
            limit: "memory.max",
            swap: "memory.swap.max",
            peak: "memory.peak",
            events: "memory.events",
        },
    }
}

/// The `oom_kill N` count of a `memory.oom_control` (v1) or `memory.events` (v2) text.
pub fn parse_oom_kills(text: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// Readies this process's cgroup for body cgroups, once, in the runtime's first process (the
/// supervisor, before it starts anything): v1 needs nothing; v2 moves this process into
/// [`RUNTIME_LEAF`] and enables the memory controller for the cgroup's children. Then checks
/// that a body cgroup can be made ([`probe`]). Returns where body cgroups go.
pub fn prepare() -> Result<Located, CgroupError> {
    let located = locate()?;
    if located.version == Version::V2
        && located
            .dir
            .file_name()
            .is_none_or(|name| name != RUNTIME_LEAF)
    {
        move_into_leaf(&located.dir, std::process::id())?;
    }
    let located = locate()?;
    probe_at(&located)?;
    Ok(located)
}

/// v2: moves process `pid` into `dir`/[`RUNTIME_LEAF`] (made if missing) and enables the
/// memory controller for `dir`'s children, which the kernel allows only once `dir` itself
/// holds no process.
pub fn move_into_leaf(dir: &Path, pid: u32) -> Result<(), CgroupError> {
    let leaf = dir.join(RUNTIME_LEAF);
    match fs::create_dir(&leaf) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_error(dir)(e)),
    }
    write_file(&leaf.join("cgroup.procs"), &pid.to_string())?;
    let control = dir.join("cgroup.subtree_control");
    if let Err(source) = write_raw(&control, "+memory") {
        let others = fs::read_to_string(dir.join("cgroup.procs"))
            .unwrap_or_default()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(", ");
        return Err(if source.raw_os_error() == Some(libc::EBUSY) {
            CgroupError::Busy {
                path: dir.to_owned(),
                others,
                cause: source,
            }
        } else {
            io_error(&control)(source)
        });
    }
    Ok(())
}

/// Checks, without changing this process's cgroup, that body cgroups can be made here: the
/// memory controller is there and a cgroup can be made (and is removed at once) where bodies'
/// go. What `check` reports.
pub fn probe() -> Result<Located, CgroupError> {
    let located = locate()?;
    probe_at(&located)?;
    Ok(located)
}

fn probe_at(located: &Located) -> Result<(), CgroupError> {
    let parent = located.body_parent();
    let dir = parent.join(format!("perago-probe-{}", std::process::id()));
    fs::create_dir(&dir).or_else(|e| match e.kind() {
        io::ErrorKind::AlreadyExists => Ok(()),
        _ => Err(io_error(&parent)(e)),
    })?;
    let has_limit = dir.join(files(located.version).limit).exists();
    let _ = fs::remove_dir(&dir);
    // v2 before `prepare` (what `check` sees): the children get the controller only once the
    // runtime has moved into its leaf; being able to make them is what counts then.
    let prepared = located.version == Version::V1
        || fs::read_to_string(parent.join("cgroup.subtree_control"))
            .is_ok_and(|t| t.split_whitespace().any(|c| c == "memory"));
    if prepared && !has_limit {
        return Err(CgroupError::NoController(format!(
            "a cgroup made in {} has no {} (the memory controller is not enabled there)",
            parent.display(),
            files(located.version).limit
        )));
    }
    Ok(())
}

fn write_raw(path: &Path, text: &str) -> io::Result<()> {
    let mut file = fs::OpenOptions::new().write(true).open(path)?;
    file.write_all(text.as_bytes())
}

fn write_file(path: &Path, text: &str) -> Result<(), CgroupError> {
    write_raw(path, text).map_err(io_error(path))
}

/// What a body cgroup saw, read after the body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryOutcome {
    /// The limit set.
    pub limit: u64,
    /// The most memory the tree used at once, where the kernel tells (v2 before 5.19 does not).
    pub peak: Option<u64>,
    /// How many processes of the tree the OOM killer killed.
    pub oom_kills: u64,
}

/// A body's memory cgroup: made with its limit, joined by the body before it execs, removed
/// with [`BodyCgroup::remove`] (or on drop) once the body's tree is gone.
#[derive(Debug)]
pub struct BodyCgroup {
    dir: PathBuf,
    version: Version,
    limit: u64,
    procs: Option<OwnedFd>,
}

static NEXT: AtomicU64 = AtomicU64::new(0);

/// The name prefix of the cgroups this process makes: `perago-body-<pid>-<start time>-`.
fn own_prefix() -> String {
    let pid = std::process::id();
    let start = crate::proc::stat(pid)
        .and_then(|s| s.start_time)
        .unwrap_or(0);
    format!("{BODY_PREFIX}{pid}-{start}-")
}

impl BodyCgroup {
    /// Makes a body cgroup below `located`'s body parent with `limit` bytes.
    pub fn create(located: &Located, limit: u64) -> Result<Self, CgroupError> {
        let parent = located.body_parent();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = parent.join(format!("{}{n}", own_prefix()));
        fs::create_dir(&dir).map_err(io_error(&parent))?;
        let mut cgroup = Self {
            dir,
            version: located.version,
            limit,
            procs: None,
        };
        let f = files(located.version);
        cgroup.write(f.limit, &limit.to_string())?;
        let swap = cgroup.dir.join(f.swap);
        if swap.exists() {
            let value = match located.version {
                Version::V1 => limit.to_string(),
                Version::V2 => "0".to_owned(),
            };
            cgroup.write(f.swap, &value)?;
        }
        if located.version == Version::V2 && cgroup.dir.join("memory.oom.group").exists() {
            cgroup.write("memory.oom.group", "1")?;
        }
        let procs = cgroup.dir.join("cgroup.procs");
        let file = fs::OpenOptions::new()
            .write(true)
            .open(&procs)
            .map_err(io_error(&procs))?;
        cgroup.procs = Some(file.into());
        Ok(cgroup)
    }

    fn write(&self, name: &str, text: &str) -> Result<(), CgroupError> {
        write_file(&self.dir.join(name), text)
    }

    /// Its folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its `cgroup.procs`, open for writing (close-on-exec): for [`crate::Spawn::cgroup`].
    pub fn procs(&self) -> Option<BorrowedFd<'_>> {
        self.procs.as_ref().map(|fd| fd.as_fd())
    }

    /// The limit, the peak and the OOM kills so far.
    pub fn outcome(&self) -> MemoryOutcome {
        let f = files(self.version);
        let read = |name: &str| fs::read_to_string(self.dir.join(name)).ok();
        MemoryOutcome {
            limit: self.limit,
            peak: read(f.peak).and_then(|t| t.trim().parse().ok()),
            oom_kills: read(f.events).map_or(0, |t| parse_oom_kills(&t)),
        }
    }

    /// SIGKILLs what is left in the cgroup and removes it, waiting up to `patience` for the
    /// processes to leave (a killed process leaves once reaped: the caller reaps its own).
    pub fn remove(mut self, patience: Duration) -> Result<(), CgroupError> {
        self.procs = None;
        let dir = std::mem::take(&mut self.dir);
        remove_dir(&dir, patience)
    }
}

/// How long a [`BodyCgroup`] dropped with processes still in it (an executor leaving while
/// its `jsonl` body runs) waits for them to die of its SIGKILL before it gives up (the
/// cgroup is then collected at the next start).
const DROP_PATIENCE: Duration = Duration::from_millis(500);

impl Drop for BodyCgroup {
    fn drop(&mut self) {
        if !self.dir.as_os_str().is_empty() {
            let _ = remove_dir(&self.dir, DROP_PATIENCE);
        }
    }
}

/// Kills every process in the cgroup `dir` and removes it, trying again for `patience`.
fn remove_dir(dir: &Path, patience: Duration) -> Result<(), CgroupError> {
    let deadline = Instant::now() + patience;
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => {
                kill_members(dir);
                if Instant::now() >= deadline {
                    return Err(CgroupError::Io {
                        path: dir.to_owned(),
                        source: e,
                    });
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

/// SIGKILLs each process in the cgroup `dir` (through a pidfd taken while it is a member).
fn kill_members(dir: &Path) {
    let Ok(text) = fs::read_to_string(dir.join("cgroup.procs")) else {
        return;
    };
    for pid in text
        .split_whitespace()
        .filter_map(|p| p.parse::<u32>().ok())
    {
        if pid == std::process::id() {
            continue;
        }
        let Ok(handle) = crate::reaper::pidfd::ProcessHandle::open(pid) else {
            continue;
        };
        // Still in this cgroup once the handle is held: the handle names this process.
        let member = fs::read_to_string(dir.join("cgroup.procs"))
            .is_ok_and(|t| t.split_whitespace().any(|p| p == pid.to_string()));
        if member {
            let _ = handle.signal(libc::SIGKILL);
        }
    }
}

/// Whether the body cgroup named `name` was made by a process that is gone: its name's pid
/// names no process, or one with another start time. `alive` gives a pid's start time.
pub fn is_stale(name: &str, alive: impl Fn(u32) -> Option<u64>) -> bool {
    let Some(rest) = name.strip_prefix(BODY_PREFIX) else {
        return false;
    };
    let mut parts = rest.split('-');
    let (Some(pid), Some(start)) = (
        parts.next().and_then(|p| p.parse::<u32>().ok()),
        parts.next().and_then(|s| s.parse::<u64>().ok()),
    ) else {
        return false;
    };
    alive(pid) != Some(start)
}

/// Removes the body cgroups below `located`'s body parent whose maker is gone (a runtime
/// SIGKILLed before it removed them), killing what still runs in them. Returns how many.
pub fn collect_stale(located: &Located) -> usize {
    let parent = located.body_parent();
    let Ok(entries) = fs::read_dir(&parent) else {
        return 0;
    };
    let alive = |pid: u32| crate::proc::stat(pid).and_then(|s| s.start_time);
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if is_stale(name, alive) && remove_dir(&entry.path(), Duration::from_millis(500)).is_ok() {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests;
