//! `perago`: the same program as `perago-supervisor`, under the name the seed's messages use.

#![forbid(unsafe_code)]

fn main() {
    std::process::exit(perago_supervisor::run("perago"));
}
