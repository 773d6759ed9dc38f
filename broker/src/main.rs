//! `perago-broker`, shown as `perago-conductor-broker`: started by `perago-supervisor`.

fn main() {
    std::process::exit(perago_broker::cli::main());
}
