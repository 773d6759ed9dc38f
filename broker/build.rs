//! Link flags for this package's binaries: see `build-support/pack_relative_relocs.rs`.

#![forbid(unsafe_code)]

include!("../build-support/pack_relative_relocs.rs");

fn main() {
    pack_relative_relocs();
}
