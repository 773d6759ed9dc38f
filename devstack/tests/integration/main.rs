//! Integration tests of the Conductor and lakeFS dev servers through plain HTTP, the `perago-devstack`
//! binary, and the official Python SDK. One test binary keeps link time down.

mod auth;
mod bad_input;
mod cli;
mod faults;
mod fill;
mod lakefs;
mod metadata;
mod payloads;
mod poll;
mod python_sdk;
mod server;
mod support;
mod timeouts;
mod update;
mod workflow;
