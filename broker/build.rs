//! Link flags for this package's binaries: see `build-support/pack_relative_relocs.rs`
//! and `build-support/hot_text.rs`.

#![forbid(unsafe_code)]

include!("../build-support/pack_relative_relocs.rs");
include!("../build-support/hot_text.rs");

fn main() {
    pack_relative_relocs();
    hot_text();
}
