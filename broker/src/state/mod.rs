//! The broker's one owner of truth: a state machine that holds every slot and decides dispatch,
//! completion, executor death and drain. [`Machine::handle`] takes one [`Input`] and the time
//! ([`Now`]) and returns the [`Effect`]s to perform (messages to executors, result updates,
//! lease extenders, poll grants) plus the answer to the caller; it performs no I/O, reads no
//! clock, draws execution ids from the [`ExecutionIds`] it was given and spawns nothing, so
//! every transition can be driven step by step in a unit test, and random sequences of them in
//! property tests. The actor in [`crate::actor`] owns the connections and the Conductor side
//! and carries the effects out.
//!
//! A slot is *free* when its current generation is attached, idle and not stopping. Polls ask
//! for at most `free − reserved − held` tasks, and for one while the last poll came back
//! short (a sparse queue: see [`poll_wait`]); a completion whose update goes through
//! update-v2 keeps its slot reserved (`AwaitingNext`) so the task the server hands back takes
//! exactly the slot that was freed, and never more than N tasks are held. Whether update-v2
//! is used is the machine's own knowledge: the reporter that finds the server lacks it says
//! so with [`Input::UpdateV2Unsupported`].
//!
//! A task the broker received is run, not handed back, wherever that can be done: a task that
//! arrives for a slot that has gone (update-v2's next task after its executor died, a poll
//! that returned while a slot died) is *held* with its lease extended until a slot is free;
//! a drain waits for the poll in flight and runs what it returns before it stops the idle
//! executors. Hand-backs remain only where nothing can run the task (more tasks than asked
//! for, or every executor gone during a drain): Conductor keeps the attempt's `startTime`, so
//! its `timeoutSeconds` keeps running (see docs/runtime.md).
//!
//! What arrives is not believed blindly: a task of another type is handed back untouched
//! (never run, failed or completed here), and a task id already running, held or reported
//! lately is dropped, so one task never runs twice at once (see `receive`).
//!
//! The files, one concern each: `interface` (inputs, replies, effects), `clock` (the
//! time and ids it is given), `machine` (its state and `handle`), `slots` (attach, generations,
//! exits, the fence), `dispatch` (polls, tasks received, held, assigned, completed,
//! reported), `crash` (poison detection), `liveness` (pings, stalls), `drain`, `pause` (pause
//! and resume polling), `reconfigure` (the live settings of `Admin.Reconfigure`), `share` (permits for capacity shared across task types), `once` (run once), `profile` (the type's observed profile and the admission made from it: `PERAGO_MEMORY_HEADROOM`, `--max-runtime`), `scaling` (queue depths, the adaptive executor count, memory admission) and
//! `status` (`Admin.Status`).

mod clock;
mod crash;
mod dispatch;
mod drain;
mod interface;
mod liveness;
mod machine;
mod once;
mod pause;
mod profile;
mod reconfigure;
mod scaling;
mod share;
mod slots;
mod status;

pub(crate) use clock::{ExecutionIds, Now};
pub(crate) use dispatch::poll_wait;
pub(crate) use interface::{
    Assigned, Effect, HandBack, HistoryRead, Input, InputFailure, Output, Reply, Report,
};
pub(crate) use machine::Machine;
pub(crate) use once::ONCE_EMPTY_POLLS;
pub(crate) use reconfigure::{PollSettings, Reconfig, Reconfigured};
pub(crate) use status::WatchView;

#[cfg(test)]
mod tests;
