//! The build script of every package whose binaries run as perago's processes (broker,
//! executor, supervisor, bench, and tests for the `-dup` copies the tests run): their link
//! flags, so that each binary is linked alike. Each package names this file as its `build`.
//! See `pack_relative_relocs.rs` and `hot_text.rs` beside it.

#![forbid(unsafe_code)]

include!("pack_relative_relocs.rs");
include!("hot_text.rs");

fn main() {
    pack_relative_relocs();
    hot_text();
}
