//! The lakeFS dev server through plain HTTP, and through the official Python client.

mod auth;
mod bad_input;
mod commits;
mod merge;
mod objects;
mod protection;
mod publish;
mod python_sdk;
mod repos;
mod staging;
mod support;
