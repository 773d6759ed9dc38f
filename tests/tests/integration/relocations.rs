//! The runtime's binaries pack their relative relocations (DT_RELR) where the build machine's
//! glibc can load them (2.36 and newer): the loader then reads a few KiB of relocations at start
//! instead of ~400 KiB that stay in every process's RSS (build-support/pack_relative_relocs.rs).
//! Read from the binaries' own ELF headers, as the loader reads them. Unless the build was told
//! not to (PERAGO_PACK_RELOCS=0).

use std::{
    fs::File,
    io::{Read, Seek, SeekFrom},
};

const PT_DYNAMIC: u32 = 2;
const DT_NULL: i64 = 0;
const DT_RELASZ: i64 = 8;
const DT_RELR: i64 = 36;

/// The (tag, value) entries of a 64-bit little-endian ELF file's dynamic section.
fn dynamic_entries(path: &str) -> Vec<(i64, u64)> {
    let mut file = File::open(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut header = [0u8; 64];
    file.read_exact(&mut header).unwrap();
    assert_eq!(
        &header[..6],
        b"\x7fELF\x02\x01",
        "{path}: not a 64-bit little-endian ELF"
    );
    let u16_at = |b: &[u8], at: usize| u16::from_le_bytes(b[at..at + 2].try_into().unwrap());
    let u32_at = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let (phoff, phentsize, phnum) = (
        u64_at(&header, 0x20),
        usize::from(u16_at(&header, 0x36)),
        usize::from(u16_at(&header, 0x38)),
    );
    let mut headers = vec![0u8; phentsize * phnum];
    file.seek(SeekFrom::Start(phoff)).unwrap();
    file.read_exact(&mut headers).unwrap();
    let dynamic = headers
        .chunks_exact(phentsize)
        .find(|h| u32_at(h, 0) == PT_DYNAMIC)
        .unwrap_or_else(|| panic!("{path}: no dynamic section"));
    let (offset, size) = (u64_at(dynamic, 8), u64_at(dynamic, 32));
    assert!(
        size <= 64 * 1024,
        "{path}: a dynamic section of {size} bytes"
    );
    let mut entries = vec![0u8; usize::try_from(size).unwrap()];
    file.seek(SeekFrom::Start(offset)).unwrap();
    file.read_exact(&mut entries).unwrap();
    entries
        .chunks_exact(16)
        .map(|e| (i64::from_le_bytes(e[..8].try_into().unwrap()), u64_at(e, 8)))
        .take_while(|&(tag, _)| tag != DT_NULL)
        .collect()
}

/// The build scripts' own gate (only `glibc_at_least` is called here).
#[allow(dead_code)]
mod build_support {
    include!("../../../build-support/pack_relative_relocs.rs");
}

#[test]
fn the_runtime_binaries_pack_their_relative_relocations_where_glibc_loads_them() {
    // PERAGO_PACK_RELOCS=0 at build time turns it off (binaries for older glibc hosts).
    let wanted = option_env!("PERAGO_PACK_RELOCS") != Some("0");
    let packs = wanted && build_support::glibc_at_least(2, 36);
    for path in [
        env!("CARGO_BIN_EXE_perago-supervisor-dup"),
        env!("CARGO_BIN_EXE_perago-broker-dup"),
        env!("CARGO_BIN_EXE_perago-executor-dup"),
        env!("CARGO_BIN_EXE_perago-bench-task-dup"),
    ] {
        let entries = dynamic_entries(path);
        let relr = entries.iter().any(|&(tag, _)| tag == DT_RELR);
        assert_eq!(
            relr, packs,
            "{path}: DT_RELR present: {relr}, glibc 2.36 or newer and wanted: {packs}"
        );
        if packs {
            // What is left in the RELA table is the few relocations that name a symbol.
            let rela = entries
                .iter()
                .find(|&&(tag, _)| tag == DT_RELASZ)
                .map_or(0, |&(_, size)| size);
            assert!(
                rela < 16 * 1024,
                "{path}: {rela} bytes of RELA relocations left"
            );
        }
    }
}
