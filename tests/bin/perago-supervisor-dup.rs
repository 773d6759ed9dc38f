//! The real `perago-supervisor`, under a name of this package so that Cargo builds it for the
//! tests and sets `CARGO_BIN_EXE_perago-supervisor-dup` (nextest's `cargo-nextest-dup` trick).

#![forbid(unsafe_code)]

fn main() {
    std::process::exit(perago_supervisor::run("perago-supervisor"));
}
