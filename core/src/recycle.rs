//! Recycling an executor (`--max-tasks-per-executor`, `--max-executor-memory`): how the
//! executor, the broker and the supervisor tell each other.

/// The exit code of an executor that ends to be recycled (`--max-tasks-per-executor`,
/// `--max-executor-memory`): the supervisor starts the slot's next generation at once, without
/// backoff (EX_TEMPFAIL).
pub const EXIT_RECYCLED: i32 = 75;

/// The reason of the broker's `Stop` to an executor that asked to be recycled.
pub const STOP_RECYCLE: &str = "recycle";
