use super::*;

/// This project's machines: cgroup v1 with the memory controller, plus an empty unified
/// hierarchy (hybrid).
const V1_CGROUP: &str =
    "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/abc\n2:cpuacct:/\n1:cpu:/\n0::/\n";
const V1_MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

/// A systemd host with the unified hierarchy, a service with Delegate=yes.
const V2_CGROUP: &str = "0::/system.slice/perago.service\n";
const V2_MOUNTINFO: &str = "\
22 1 0:21 / / rw - ext4 /dev/sda1 rw
30 22 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";

fn controllers(list: &'static str) -> impl Fn(&Path) -> Option<String> {
    move |_| Some(list.to_owned())
}

#[test]
fn v1_the_memory_hierarchy_wins_on_a_hybrid_host() {
    let located = locate_in(V1_CGROUP, V1_MOUNTINFO, controllers("")).unwrap();
    assert_eq!(
        located,
        Located {
            version: Version::V1,
            dir: PathBuf::from("/sys/fs/cgroup/memory/process_api/abc"),
        }
    );
    assert_eq!(
        located.body_parent(),
        located.dir,
        "v1: bodies go below the runtime's own"
    );
}

#[test]
fn v1_a_container_that_sees_its_subtree_as_the_mount_root() {
    let mountinfo =
        "35 31 0:32 /docker/abc /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n";
    let located = locate_in("5:memory:/docker/abc/inner\n", mountinfo, controllers("")).unwrap();
    assert_eq!(located.dir, PathBuf::from("/sys/fs/cgroup/memory/inner"));
    let outside = locate_in("5:memory:/other\n", mountinfo, controllers("")).unwrap_err();
    assert!(
        outside
            .to_string()
            .contains("no mount of the memory hierarchy"),
        "{outside}"
    );
    // `/docker/abcd` is not below `/docker/abc`.
    assert!(locate_in("5:memory:/docker/abcd\n", mountinfo, controllers("")).is_err());
}

#[test]
fn v1_memory_may_share_a_hierarchy_with_other_controllers() {
    let mountinfo = "35 31 0:32 / /cg/mem rw - cgroup cgroup rw,memory,hugetlb\n";
    let located = locate_in("3:hugetlb,memory:/a\n", mountinfo, controllers("")).unwrap();
    assert_eq!(located.dir, PathBuf::from("/cg/mem/a"));
}

#[test]
fn v2_a_delegated_service_and_the_leaf_it_moves_into() {
    let located = locate_in(V2_CGROUP, V2_MOUNTINFO, controllers("cpu io memory pids")).unwrap();
    assert_eq!(
        located,
        Located {
            version: Version::V2,
            dir: PathBuf::from("/sys/fs/cgroup/system.slice/perago.service"),
        }
    );
    // Before `prepare`: bodies would go beside the runtime's processes (which v2 refuses to
    // combine with a controller: prepare moves the runtime first).
    assert_eq!(located.body_parent(), located.dir);
    let moved = locate_in(
        "0::/system.slice/perago.service/perago-runtime\n",
        V2_MOUNTINFO,
        controllers("memory"),
    )
    .unwrap();
    assert_eq!(
        moved.dir,
        PathBuf::from("/sys/fs/cgroup/system.slice/perago.service/perago-runtime")
    );
    assert_eq!(
        moved.body_parent(),
        PathBuf::from("/sys/fs/cgroup/system.slice/perago.service"),
        "the bodies' cgroups are the leaf's siblings"
    );
}

/// `prepare`'s v2 step on a stand-in of a delegated cgroup (plain files: the kernel's own
/// refusals cannot be played, only the steps and the file names).
#[test]
fn v2_the_runtime_moves_into_its_leaf_then_gives_memory_to_the_children() {
    let dir = tempfile::tempdir().unwrap();
    let service = dir.path().join("perago.service");
    fs::create_dir_all(service.join(RUNTIME_LEAF)).unwrap();
    for file in ["cgroup.subtree_control", "cgroup.procs"] {
        fs::write(service.join(file), "").unwrap();
    }
    fs::write(service.join(RUNTIME_LEAF).join("cgroup.procs"), "").unwrap();
    move_into_leaf(&service, 4242).unwrap();
    assert_eq!(
        fs::read_to_string(service.join(RUNTIME_LEAF).join("cgroup.procs")).unwrap(),
        "4242"
    );
    assert_eq!(
        fs::read_to_string(service.join("cgroup.subtree_control")).unwrap(),
        "+memory"
    );
    // A cgroup that is not there: the error names it.
    let missing = dir.path().join("missing");
    let error = move_into_leaf(&missing, 4242).unwrap_err();
    assert!(
        matches!(&error, CgroupError::Io { path, .. } if *path == missing),
        "{error}"
    );
}

#[test]
fn v2_a_pod_in_its_own_cgroup_namespace_is_at_the_root() {
    let located = locate_in(
        "0::/\n",
        "30 22 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
        controllers("cpu memory"),
    )
    .unwrap();
    assert_eq!(located.dir, PathBuf::from("/sys/fs/cgroup"));
}

#[test]
fn v2_without_the_memory_controller_says_what_is_missing() {
    let error = locate_in(V2_CGROUP, V2_MOUNTINFO, controllers("cpu pids")).unwrap_err();
    let text = error.to_string();
    assert!(
        text.starts_with("memory_limit needs a writable memory cgroup"),
        "{text}"
    );
    assert!(text.contains("lacks +memory"), "{text}");
    assert!(text.contains("Delegate=yes"), "{text}");
}

#[test]
fn no_cgroup_at_all_is_an_error_naming_the_fix() {
    let error = locate_in("", "", controllers("")).unwrap_err();
    assert!(matches!(error, CgroupError::NoController(_)));
    assert!(error.to_string().contains("run perago as root"), "{error}");
    // v1 named but not mounted (a container without /sys/fs/cgroup/memory).
    let error = locate_in("4:memory:/x\n", V2_MOUNTINFO, controllers("memory")).unwrap_err();
    assert!(error.to_string().contains("cgroup v1"), "{error}");
}

#[test]
fn mountinfo_escapes_and_optional_fields() {
    let mounts = parse_mountinfo(
        "41 31 0:38 / /mnt/my\\040cgroups rw,relatime shared:9 master:2 - cgroup2 none rw\n\
         22 1 0:21 / / rw - ext4 /dev/sda1 rw\n",
    );
    assert_eq!(mounts.len(), 1);
    assert_eq!(mounts[0].mount_point, PathBuf::from("/mnt/my cgroups"));
    assert!(mounts[0].v2);
}

#[test]
fn the_oom_kill_counter_of_both_versions() {
    let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
    let v2 = "low 0\nhigh 0\nmax 14\noom 1\noom_kill 1\noom_group_kill 1\n";
    assert_eq!(parse_oom_kills(v1), 2);
    assert_eq!(parse_oom_kills(v2), 1, "not oom_group_kill");
    assert_eq!(parse_oom_kills("oom_kill_disable 0\nunder_oom 0\n"), 0);
}

#[test]
fn the_files_of_each_version() {
    let v1 = files(Version::V1);
    assert_eq!(
        (v1.limit, v1.swap, v1.peak, v1.events),
        (
            "memory.limit_in_bytes",
            "memory.memsw.limit_in_bytes",
            "memory.max_usage_in_bytes",
            "memory.oom_control"
        )
    );
    let v2 = files(Version::V2);
    assert_eq!(
        (v2.limit, v2.swap, v2.peak, v2.events),
        (
            "memory.max",
            "memory.swap.max",
            "memory.peak",
            "memory.events"
        )
    );
}

#[test]
fn a_body_cgroup_is_stale_once_its_maker_is_gone() {
    let me = std::process::id();
    let alive = |pid: u32| (pid == me).then_some(77);
    assert!(!is_stale(&format!("perago-body-{me}-77-0"), alive));
    assert!(
        is_stale(&format!("perago-body-{me}-76-3"), alive),
        "pid reused"
    );
    assert!(is_stale("perago-body-1234567-77-0", alive), "gone");
    assert!(!is_stale("perago-runtime", alive), "not a body's");
    assert!(!is_stale("perago-body-x", alive));
    assert!(!is_stale("other", alive));
}

/// A cgroup left by a process that is gone (a SIGKILLed runtime) is removed, with what still
/// runs in it; those of live makers stay.
#[test]
fn stale_body_cgroups_of_this_host_are_collected_with_their_processes() {
    let located =
        probe().unwrap_or_else(|e| panic!("this test needs a writable memory cgroup: {e}"));
    let parent = located.body_parent();
    // A maker that is gone: a child that ran and was reaped.
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    gone.wait().unwrap();
    let stale = parent.join(format!("{BODY_PREFIX}{}-1-0", gone.id()));
    fs::create_dir(&stale).unwrap();
    let mut left = std::process::Command::new("sleep")
        .arg("300")
        .spawn()
        .unwrap();
    fs::write(stale.join("cgroup.procs"), left.id().to_string()).unwrap();
    let live = BodyCgroup::create(&located, 8 << 20).unwrap();
    assert!(collect_stale(&located) >= 1);
    assert!(!stale.exists(), "{} is still there", stale.display());
    let status = left.wait().unwrap();
    use std::os::unix::process::ExitStatusExt as _;
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "what ran in it was killed"
    );
    assert!(live.dir().exists(), "a live maker's cgroup stays");
    live.remove(Duration::from_secs(1)).unwrap();
}

/// On a host where this test can make cgroups (this project's machines and CI: root with
/// cgroup v1), the real thing: a cgroup with its limit, joined and removed.
#[test]
fn a_body_cgroup_on_this_host_has_its_limit_and_is_removed() {
    let located = match probe() {
        Ok(located) => located,
        Err(e) => panic!("this host must offer a writable memory cgroup for this test: {e}"),
    };
    let cgroup = BodyCgroup::create(&located, 64 << 20).unwrap();
    let dir = cgroup.dir().to_owned();
    let limit = fs::read_to_string(dir.join(files(located.version).limit)).unwrap();
    assert_eq!(limit.trim(), (64u64 << 20).to_string());
    assert!(
        dir.file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with(&own_prefix())
    );
    let outcome = cgroup.outcome();
    assert_eq!((outcome.limit, outcome.oom_kills), (64 << 20, 0));
    cgroup.remove(Duration::from_secs(1)).unwrap();
    assert!(!dir.exists());
}
