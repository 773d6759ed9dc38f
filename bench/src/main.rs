//! `perago-bench`: see the crate docs and `docs/performance.md`.

fn main() {
    std::process::exit(perago_bench::main());
}
