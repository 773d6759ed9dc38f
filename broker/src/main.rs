//! `perago-broker`, shown as `perago-conductor-broker`: started by `perago-supervisor`.

#![forbid(unsafe_code)]

fn main() {
    std::process::exit(perago_broker::cli::main());
}
