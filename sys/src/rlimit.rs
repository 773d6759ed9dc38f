//! Resource limits.

#![expect(
    unsafe_code,
    reason = "getrlimit(2) and setrlimit(2) read and write a struct"
)]

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit (the broker: a flood of
/// socket connections must not leave it without descriptors); returns the soft limit in force
/// afterwards (1024 if it cannot be read).
pub fn raise_nofile_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) writes the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) } != 0 {
        return 1024;
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit(2) reads the struct we pass.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const raised) } == 0 {
            limit.rlim_cur = limit.rlim_max;
        }
    }
    limit.rlim_cur
}
