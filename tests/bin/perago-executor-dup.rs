//! The real `perago-executor`, built for the tests.
fn main() {
    std::process::exit(perago_executor::cli::main());
}
