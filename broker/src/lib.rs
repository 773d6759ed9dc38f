//! The Conductor broker: the one process that holds the Conductor client. It polls one task
//! type, dispatches each task to a free executor slot over the slot protocol, serves the
//! attempt fence (`ReloadAttempt`), extends leases and reports results.
//!
//! What exists so far: [`wire`], the conversions between slot-protocol messages and the core
//! types. The poll loop, slot server and result updates come with the runtime.

pub mod wire;
