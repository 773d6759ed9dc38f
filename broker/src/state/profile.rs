//! Admission from the task type's observed profile (issue #27 item 3): a rolling window of the
//! type's recent executions (duration mean and p95, the body tree's peak memory), and the two
//! decisions made from it.
//!
//! - `PERAGO_MEMORY_HEADROOM`: a task is polled (and a slot scaled up) only while available
//!   memory minus the headroom covers the observed peak of every task of the type in flight
//!   and of the next one. A task in flight counts at its whole peak, though available memory
//!   may show part of it already: one that started a moment ago has not grown yet, and the
//!   machine cannot tell how far each has, so admission errs on the side of not polling.
//!   Before any peak is observed (and while available memory was never measured), one task of
//!   the type runs at a time. `PERAGO_MIN_FREE_MEMORY` stays a floor beside it.
//! - `--once --max-runtime`: a type whose observed p95 duration exceeds the time left is not
//!   polled any more and the run drains (running tasks finish and are reported); at the
//!   deadline it drains whatever the profile says. A task a poll already in flight returns
//!   runs (a hand-back would burn its timeout clock).

use super::machine::{Machine, Work};
use perago_core::{
    capacity::{PERAGO_MAX_RUNTIME, PERAGO_MEMORY_HEADROOM},
    memory::format_bytes,
};
use std::{
    collections::VecDeque,
    time::{Duration, Instant},
};

/// How many recent executions the profile keeps.
pub(crate) const PROFILE_WINDOW: usize = 100;

/// The type's recent executions, and what is read from them, worked out when one is recorded:
/// the machine publishes the figures after every input it handles, several per task.
#[derive(Debug, Default)]
pub(crate) struct Profile {
    /// Dispatch-to-completion durations, the newest last.
    durations: VecDeque<Duration>,
    /// Body peaks of the executions that measured one, the newest last.
    peaks: VecDeque<u64>,
    mean: Option<Duration>,
    p95: Option<Duration>,
    peak: Option<u64>,
}

impl Profile {
    /// One execution finished: its duration (if the clock allowed one) and the body's peak
    /// memory (0: not measured).
    pub(crate) fn record(&mut self, took: Option<Duration>, peak: u64) {
        if let Some(took) = took {
            if self.durations.len() == PROFILE_WINDOW {
                self.durations.pop_front();
            }
            self.durations.push_back(took);
            let n = u32::try_from(self.durations.len()).unwrap_or(u32::MAX);
            self.mean = Some(self.durations.iter().sum::<Duration>() / n);
            // Nearest rank: with fewer than 20 executions, the longest.
            let mut window: Vec<Duration> = self.durations.iter().copied().collect();
            let rank = (window.len() * 95).div_ceil(100);
            let (_, p95, _) = window.select_nth_unstable(rank.saturating_sub(1));
            self.p95 = Some(*p95);
        }
        if peak > 0 {
            if self.peaks.len() == PROFILE_WINDOW {
                self.peaks.pop_front();
            }
            self.peaks.push_back(peak);
            self.peak = self.peaks.iter().copied().max();
        }
    }

    /// Executions in the window.
    pub(crate) fn executions(&self) -> usize {
        self.durations.len()
    }

    /// The mean duration over the window.
    pub(crate) fn mean(&self) -> Option<Duration> {
        self.mean
    }

    /// The 95th percentile duration over the window (nearest rank: with fewer than 20
    /// executions, the longest).
    pub(crate) fn p95(&self) -> Option<Duration> {
        self.p95
    }

    /// The highest body peak over the window.
    pub(crate) fn peak(&self) -> Option<u64> {
        self.peak
    }
}

impl Machine {
    /// Tasks of the type in flight: running, awaiting update-v2's next, polled for, held.
    pub(super) fn in_flight(&self) -> u64 {
        let on_slots = self
            .slots
            .iter()
            .filter(|s| !matches!(s.work, Work::Idle))
            .count() as u64;
        on_slots + self.held.len() as u64 + u64::from(self.reserved)
    }

    /// How many more tasks `PERAGO_MEMORY_HEADROOM` admits now beyond those in flight
    /// (`u32::MAX` without it).
    pub(super) fn memory_room(&self) -> u32 {
        self.memory_room_beside(self.in_flight())
    }

    /// How many more tasks the headroom admits beside `in_flight` tasks.
    pub(super) fn memory_room_beside(&self, in_flight: u64) -> u32 {
        let Some(headroom) = self.capacity.memory_headroom else {
            return u32::MAX;
        };
        let one_at_a_time = u32::from(in_flight == 0);
        let Some(available) = self.available_memory else {
            return one_at_a_time;
        };
        let spare = available.saturating_sub(headroom);
        match self.profile.peak() {
            None if spare > 0 => one_at_a_time,
            None => 0,
            Some(peak) => {
                let left = spare.saturating_sub(in_flight.saturating_mul(peak));
                u32::try_from(left / peak.max(1)).unwrap_or(u32::MAX)
            }
        }
    }

    /// Why the headroom admits no more task now (empty: it does, or there is none).
    pub(super) fn memory_room_reason(&self) -> String {
        let Some(headroom) = self.capacity.memory_headroom else {
            return String::new();
        };
        if self.memory_room() > 0 {
            return String::new();
        }
        let in_flight = self.in_flight();
        match (self.available_memory, self.profile.peak()) {
            (Some(available), Some(peak)) => format!(
                "available memory {} minus {PERAGO_MEMORY_HEADROOM} {} does not cover the observed peak {} for {} task(s) ({in_flight} in flight and the next)",
                format_bytes(available),
                format_bytes(headroom),
                format_bytes(peak),
                in_flight + 1
            ),
            (Some(available), None) if available <= headroom => format!(
                "available memory {} is within {PERAGO_MEMORY_HEADROOM} {}",
                format_bytes(available),
                format_bytes(headroom)
            ),
            _ => format!(
                "{PERAGO_MEMORY_HEADROOM}: one task at a time until a peak is observed ({in_flight} in flight)"
            ),
        }
    }

    /// `--max-runtime`: the time left before the run's deadline (`None` without one).
    pub(super) fn time_left(&self) -> Option<Duration> {
        let deadline = self.deadline?;
        Some(deadline.saturating_duration_since(self.now.instant))
    }

    /// Why `--max-runtime` polls nothing more (`None`: it still polls, or there is none).
    pub(super) fn out_of_time(&self) -> Option<String> {
        let left = self.time_left()?;
        let max = self.capacity.max_runtime.unwrap_or_default();
        if left.is_zero() {
            return Some(format!(
                "--max-runtime {}: the deadline has come",
                humantime_ms(max)
            ));
        }
        let p95 = self.profile.p95()?;
        (p95 > left).then(|| {
            format!(
                "--max-runtime {}: the observed p95 duration {} exceeds the {} left",
                humantime_ms(max),
                humantime_ms(p95),
                humantime_ms(left)
            )
        })
    }

    /// Run once with `--max-runtime`: once no task fits in the time left, the run drains
    /// (running tasks finish and are reported first).
    pub(super) fn check_time_left(&mut self) {
        if self.draining || !self.capacity.once {
            return;
        }
        if let Some(why) = self.out_of_time() {
            tracing::info!(
                "run once: {why}; {} is not polled any more, draining ({PERAGO_MAX_RUNTIME})",
                self.task_name
            );
            self.start_drain();
        }
    }

    /// The deadline of `--max-runtime`, counted from the machine's start.
    pub(super) fn deadline_from(
        started: Instant,
        max_runtime: Option<Duration>,
    ) -> Option<Instant> {
        max_runtime.map(|d| started + d)
    }

    /// Gauges of the profile and its decisions, for `/metrics`.
    pub(super) fn publish_profile(&self) {
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        let ms =
            |d: Option<Duration>| d.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let g = &self.gauges;
        g.profile_executions
            .store(self.profile.executions() as u64, relaxed);
        g.profile_duration_mean_ms
            .store(ms(self.profile.mean()), relaxed);
        g.profile_duration_p95_ms
            .store(ms(self.profile.p95()), relaxed);
        g.profile_peak_memory
            .store(self.profile.peak().unwrap_or(0), relaxed);
        g.memory_room.store(
            if self.capacity.memory_headroom.is_some() {
                u64::from(self.memory_room())
            } else {
                u64::MAX
            },
            relaxed,
        );
        g.time_left_ms
            .store(self.time_left().map_or(u64::MAX, |d| ms(Some(d))), relaxed);
        g.admission_open
            .store(u64::from(self.admits_new_tasks()), relaxed);
    }

    /// Whether memory admission (the floor and the headroom) and the time left let a new task
    /// be polled now.
    pub(super) fn admits_new_tasks(&self) -> bool {
        self.admission_open && self.memory_room() > 0 && self.out_of_time().is_none()
    }
}

/// `2.5s`, `10m`: a duration for logs and reasons, to the millisecond.
fn humantime_ms(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(60_000) && ms > 0 {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_keeps_the_last_hundred() {
        let mut p = Profile::default();
        assert_eq!((p.mean(), p.p95(), p.peak()), (None, None, None));
        for ms in 1..=200u64 {
            p.record(Some(Duration::from_millis(ms)), ms << 20);
        }
        assert_eq!(p.executions(), PROFILE_WINDOW);
        // 101..=200 ms: mean 150.5 ms, p95 the 95th of them.
        assert_eq!(p.mean(), Some(Duration::from_micros(150_500)));
        assert_eq!(p.p95(), Some(Duration::from_millis(195)));
        assert_eq!(p.peak(), Some(200 << 20));
        // An unmeasured peak leaves the peaks as they were.
        p.record(Some(Duration::from_millis(1)), 0);
        assert_eq!(p.peak(), Some(200 << 20));
    }

    /// The figures are worked out when an execution is recorded: an outlier that leaves the
    /// window leaves them too.
    #[test]
    fn an_outlier_leaving_the_window_leaves_the_figures() {
        let mut p = Profile::default();
        p.record(Some(Duration::from_secs(100)), 500);
        assert_eq!(
            (p.mean(), p.p95(), p.peak()),
            (
                Some(Duration::from_secs(100)),
                Some(Duration::from_secs(100)),
                Some(500)
            )
        );
        for _ in 0..PROFILE_WINDOW {
            p.record(Some(Duration::from_secs(1)), 10);
        }
        assert_eq!(
            (p.mean(), p.p95(), p.peak()),
            (
                Some(Duration::from_secs(1)),
                Some(Duration::from_secs(1)),
                Some(10)
            )
        );
    }

    #[test]
    fn a_short_window_s_p95_is_its_longest() {
        let mut p = Profile::default();
        for s in [3, 1, 2] {
            p.record(Some(Duration::from_secs(s)), 0);
        }
        assert_eq!(p.p95(), Some(Duration::from_secs(3)));
        assert_eq!(p.mean(), Some(Duration::from_secs(2)));
        assert_eq!(p.peak(), None);
    }

    #[test]
    fn durations_read_like_settings() {
        assert_eq!(humantime_ms(Duration::from_secs(10)), "10s");
        assert_eq!(humantime_ms(Duration::from_secs(600)), "10m");
        assert_eq!(humantime_ms(Duration::from_millis(2500)), "2.5s");
    }
}
