//! The real `perago` (same program as `perago-supervisor`), built for the tests.
fn main() {
    std::process::exit(perago_supervisor::run("perago"));
}
