//! CPU time of a process, to the nanosecond: its CPU-time clock (`clock_getcpuclockid(3)`,
//! `clock_gettime(2)`). `/proc/<pid>/stat`'s utime and stime count whole 10 ms ticks, and a
//! process that wakes briefly between ticks may never be charged one: the benchmark's figures
//! of tens of µs per task need the clock.

#![expect(
    unsafe_code,
    reason = "clock_getcpuclockid(3) and clock_gettime(2) write the values we pass"
)]

use std::{io, time::Duration};

/// The CPU time `pid` has used so far (every thread, live or ended; not its children's).
/// `Err` when it is gone (or never was) or its clock cannot be read.
pub fn process_cpu_time(pid: u32) -> io::Result<Duration> {
    let pid = libc::pid_t::try_from(pid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
    let mut clock: libc::clockid_t = 0;
    // SAFETY: clock_getcpuclockid(3) writes the clock id we pass; it returns an errno value.
    let failed = unsafe { libc::clock_getcpuclockid(pid, &raw mut clock) };
    if failed != 0 {
        return Err(io::Error::from_raw_os_error(failed));
    }
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime(2) writes the timespec we pass.
    if unsafe { libc::clock_gettime(clock, &raw mut now) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let seconds = u64::try_from(now.tv_sec).unwrap_or(0);
    let nanos = u32::try_from(now.tv_nsec).unwrap_or(0);
    Ok(Duration::new(seconds, nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_process_is_charged_what_it_spent_and_a_gone_one_is_an_error() {
        let me = std::process::id();
        let before = process_cpu_time(me).unwrap();
        let started = std::time::Instant::now();
        let mut x = 0u64;
        while started.elapsed() < Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let spent = process_cpu_time(me).unwrap() - before;
        assert!(spent >= Duration::from_millis(20), "{spent:?}");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(process_cpu_time(pid).is_err());
    }
}
