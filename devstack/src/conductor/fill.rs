//! How a batch poll waits: the queue semantics of the server's queue backend.
//!
//! Conductor's SQL queues (`PostgresQueueDAO`, `MySQLQueueDAO`, `SqliteQueueDAO`
//! `pollMessages`) pop what is there, then sleep in 100 ms steps, popping again, until they
//! hold `count` messages or more than `timeout` has passed; the messages popped meanwhile are
//! invisible to every other poll, and only when the loop ends are the tasks handed out
//! (IN_PROGRESS, `workerId`, `pollCount`, `startTime`). The loop does not notice a client that
//! went away: the tasks it popped are handed out all the same, to a worker that never sees
//! them, and wait for their response timeout. This module does the same ([`FillOrTimeout`]);
//! the other semantics ([`Immediate`]) answers as soon as one task is there.
//!
//! [`FillOrTimeout`]: QueueSemantics::FillOrTimeout
//! [`Immediate`]: QueueSemantics::Immediate

use std::time::Duration;

use tokio::time::Instant;

use super::clock::now_ms;
use super::model::Task;
use super::queue::queue_name;
use super::store::Conductor;

/// The SQL queues' sleep between two pops of one poll.
const STEP: Duration = Duration::from_millis(100);

/// When a batch poll answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueueSemantics {
    /// Conductor's SQL queues (Postgres, MySQL, SQLite, the server's default): a batch poll
    /// answers once it holds `count` tasks or its `timeout` has passed, checking every
    /// 100 ms; the tasks it popped wait in the server meanwhile.
    #[default]
    FillOrTimeout,
    /// A batch poll answers as soon as one task is there (the older Redis queue when tasks
    /// are waiting; devstack's behaviour before issue #24).
    Immediate,
}

impl QueueSemantics {
    /// The name the command line takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::FillOrTimeout => "fill-or-timeout",
            Self::Immediate => "immediate",
        }
    }
}

impl std::fmt::Display for QueueSemantics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for QueueSemantics {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "fill-or-timeout" => Ok(Self::FillOrTimeout),
            "immediate" => Ok(Self::Immediate),
            other => Err(format!(
                "unknown queue semantics {other:?}: expected fill-or-timeout or immediate"
            )),
        }
    }
}

/// Task ids popped by one poll and not handed out yet. Dropped early (the client went away and
/// the route's future with it), it hands them out anyway, as the real server's loop would.
struct Popped<'a> {
    conductor: &'a Conductor,
    task_type: &'a str,
    domain: Option<&'a str>,
    worker_id: Option<&'a str>,
    ids: Vec<String>,
}

impl Popped<'_> {
    fn hand_out(&mut self) -> Vec<Task> {
        let ids = std::mem::take(&mut self.ids);
        self.conductor
            .with(|s| s.hand_out_popped(self.task_type, self.domain, self.worker_id, ids, now_ms()))
    }
}

impl Drop for Popped<'_> {
    fn drop(&mut self) {
        if !self.ids.is_empty() {
            let lost = self.hand_out();
            if !lost.is_empty() {
                tracing::debug!(
                    tasks = lost.len(),
                    "a batch poll's client went away: its popped tasks were handed out all the same"
                );
            }
        }
    }
}

/// A batch poll on the SQL queues: pops, then every 100 ms pops again, until `count` tasks or
/// more than `timeout` has passed (`timeout` 0: one pop).
pub(crate) async fn poll_fill(
    conductor: &Conductor,
    task_type: &str,
    domain: Option<&str>,
    worker_id: Option<&str>,
    count: usize,
    timeout: Duration,
) -> Vec<Task> {
    let queue = queue_name(task_type, domain);
    let start = Instant::now();
    let mut popped = Popped {
        conductor,
        task_type,
        domain,
        worker_id,
        ids: Vec::new(),
    };
    let mut waiting = None;
    loop {
        let want = count.saturating_sub(popped.ids.len());
        let ids = conductor.with(|s| s.queues.pop_ready(&queue, now_ms(), want));
        popped.ids.extend(ids);
        if popped.ids.len() >= count || timeout.is_zero() || start.elapsed() > timeout {
            return popped.hand_out();
        }
        // Counted until the poll answers or its client goes away, tasks popped or not.
        waiting.get_or_insert_with(|| conductor.poll_waits());
        tokio::time::sleep(STEP).await;
    }
}
