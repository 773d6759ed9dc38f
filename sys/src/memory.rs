//! This process's memory: malloc's tunables, and whether another process of the same user may
//! read it (dumpable).

#![expect(
    unsafe_code,
    reason = "mallopt(3) and prctl(PR_SET_DUMPABLE) change this process's own settings"
)]

use std::io;

/// Has malloc keep freed memory for reuse instead of handing it back to the kernel at once
/// (glibc; elsewhere nothing changes). A task's payload, up to megabytes, passes through a few
/// buffers in the broker and an executor; by default glibc serves blocks that large from
/// their own mappings, or trims the heap's free top as soon as it passes a few megabytes, so
/// every task faulted in (and the kernel zeroed) fresh pages for each buffer: a quarter of
/// both processes' time at 1 MiB per task. Blocks up to 16 MiB (a slot message is at most 11)
/// now come from the heap, and up to 32 MiB of free heap top stay mapped: a process that
/// handled large payloads keeps that much more resident.
pub fn retain_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt(3) sets malloc tunables; called at start, before other threads.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 16 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 32 << 20);
        }
    }
}

/// Makes this process non-dumpable: another process of the same user can then no longer read
/// its memory, its `/proc/<pid>/environ` or its open descriptors (only root can). Runtime
/// processes hold the slot tokens, the control token and the Conductor and lakeFS secrets;
/// bodies run as the same user by default.
pub fn set_non_dumpable() -> io::Result<()> {
    // SAFETY: prctl(PR_SET_DUMPABLE) changes a flag of this process; no memory is involved.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether this process is dumpable (see [`set_non_dumpable`]).
pub fn is_dumpable() -> bool {
    // SAFETY: prctl(PR_GET_DUMPABLE) reads a flag of this process.
    unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) == 1 }
}
