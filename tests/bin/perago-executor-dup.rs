//! The real `perago-executor`, built for the tests.

#![forbid(unsafe_code)]

fn main() {
    std::process::exit(perago_executor::cli::main());
}
