//! `perago-executor`, shown as `perago-executor-000N`: started by `perago-supervisor`.

#![forbid(unsafe_code)]

fn main() {
    std::process::exit(perago_executor::cli::main());
}
