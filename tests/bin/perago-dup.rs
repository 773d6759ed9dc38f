//! The real `perago` (same program as `perago-supervisor`), built for the tests.

#![forbid(unsafe_code)]

fn main() {
    std::process::exit(perago_supervisor::run("perago"));
}
