//! The real `perago-broker`, built for the tests.

#![forbid(unsafe_code)]

fn main() {
    std::process::exit(perago_broker::cli::main());
}
