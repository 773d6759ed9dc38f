#![forbid(unsafe_code)]

fn main() {
    std::process::exit(perago_supervisor::run("perago-supervisor"));
}
