//! Link flags for this package's binaries, the copies of the runtime's binaries that the tests
//! run, linked as the packages that ship them link theirs: see
//! `build-support/pack_relative_relocs.rs` and `build-support/hot_text.rs`.

#![forbid(unsafe_code)]

include!("../build-support/pack_relative_relocs.rs");
include!("../build-support/hot_text.rs");

fn main() {
    pack_relative_relocs();
    hot_text();
}
