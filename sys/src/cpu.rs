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
    read_clock(clock)
}

/// The CPU time the calling thread has used so far (`CLOCK_THREAD_CPUTIME_ID`): what one
/// client costs when it shares its process with others (the benchmark's ceiling client runs
/// beside devstack).
pub fn thread_cpu_time() -> io::Result<Duration> {
    read_clock(libc::CLOCK_THREAD_CPUTIME_ID)
}

fn read_clock(clock: libc::clockid_t) -> io::Result<Duration> {
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
        // Spins until the process's clock has advanced by 20 ms, within a wall-clock bound: a
        // loaded machine deschedules the spinner (30 ms of wall time spun once read 18 ms of
        // CPU on CI), and a clock that never advanced would hang.
        let me = std::process::id();
        let before = process_cpu_time(me).unwrap();
        let started = std::time::Instant::now();
        let mut x = 0u64;
        while process_cpu_time(me).unwrap() - before < Duration::from_millis(20) {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "the process's clock did not reach 20 ms in 20 s of spinning"
            );
            for _ in 0..1000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        }
        // Not charged more than its threads could spend in that time (`cargo test` runs other
        // tests' threads in this process beside the spinner).
        let (spent, elapsed) = (process_cpu_time(me).unwrap() - before, started.elapsed());
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let cores = u32::try_from(cores).unwrap_or(u32::MAX);
        assert!(
            spent <= elapsed * cores + Duration::from_millis(5),
            "{spent:?} of CPU in {elapsed:?} on {cores} cores"
        );
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(process_cpu_time(pid).is_err());
    }

    #[test]
    fn a_thread_is_charged_its_own_work_not_another_threads() {
        // Spins until this thread's own clock has advanced by `d`, within a wall-clock bound
        // (a loaded machine deschedules the spinner; a clock that never advanced would hang):
        // whether the clock reached `d`.
        let spin = |d: Duration| {
            let start = thread_cpu_time().unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            let mut x = 0u64;
            while thread_cpu_time().unwrap() - start < d {
                if std::time::Instant::now() > deadline {
                    return false;
                }
                for _ in 0..1000 {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
            }
            true
        };
        let before = thread_cpu_time().unwrap();
        let other = std::thread::spawn(move || spin(Duration::from_millis(60)));
        assert!(other.join().unwrap(), "the other thread's clock advanced");
        let idle = thread_cpu_time().unwrap() - before;
        assert!(idle < Duration::from_millis(20), "{idle:?}");
        assert!(
            spin(Duration::from_millis(30)),
            "this thread's clock advanced"
        );
        let busy = thread_cpu_time().unwrap() - before;
        assert!(busy >= Duration::from_millis(30), "{busy:?}");
    }
}
