//! The real `perago-broker`, built for the tests.
fn main() {
    std::process::exit(perago_broker::cli::main());
}
