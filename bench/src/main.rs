//! `perago-bench`: see the crate docs and `docs/performance.md`.

#![forbid(unsafe_code)]

fn main() {
    std::process::exit(perago_bench::main());
}
