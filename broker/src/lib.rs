//! The Conductor broker: the one process that holds the Conductor client. It polls one task
//! type, dispatches each task to a free executor slot over the slot protocol, serves the
//! attempt fence (`ReloadAttempt`), extends leases and reports results.
//!
//! Only the crate exists so far; the runtime lands with issue #4.
