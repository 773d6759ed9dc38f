//! The runtime's optimized binaries lay the functions their processes run out together, in a
//! `.text.hot` section before the rest of their code (build-support/hot_text.rs, from the list
//! build-support/hot-text.txt). The suite's own binaries are debug builds, which the script is
//! not applied to, so the linker's side is checked on a small program built here with the same
//! rustc, its default linker and the script made from the committed list.

use std::{collections::HashSet, fs, path::Path, process::Command};

#[allow(dead_code)]
mod build_support {
    include!("../../../build-support/hot_text.rs");
}

const LIST: &str = include_str!("../../../build-support/hot-text.txt");

fn patterns(list: &str) -> Vec<&str> {
    list.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect()
}

#[test]
fn the_hot_text_list_holds_hashless_patterns_of_the_runtimes_functions() {
    let patterns = patterns(LIST);
    assert!(
        patterns.len() >= 500,
        "{} patterns: regenerate with scripts/profile-hot-text",
        patterns.len()
    );
    let mut seen = HashSet::new();
    for &p in &patterns {
        // A symbol's characters and `*`: no space, parenthesis or other glob syntax that would
        // end the script's input-section description or match more than the one function.
        assert!(
            p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_$.*".contains(&b)),
            "{p}: not a section-name pattern"
        );
        // The hash was taken out: a list with hashes only fits the build it was profiled from.
        if let Some(at) = p.rfind("17h") {
            let rest = &p[at + 3..];
            assert!(
                !(rest.len() == 17 && rest[..16].bytes().all(|b| b.is_ascii_hexdigit())),
                "{p}: still carries its hash"
            );
        }
        assert!(seen.insert(p), "{p}: listed twice");
    }
    // The runtime's own per-task path is in it: the broker's machine and the executor's slot.
    for hot in [
        "_ZN13perago_broker5state7machine7Machine4step17h*E",
        "_ZN15perago_executor4slot5serve28_$u7b$$u7b$closure$u7d$$u7d$17h*E",
    ] {
        assert!(seen.contains(hot), "{hot} is not listed");
    }
}

#[test]
fn the_script_lists_each_pattern_as_hot_or_unlikely_text_in_order() {
    let script = build_support::hot_text_script("# a comment\n_ZN1a1f17h*E\n\n  _ZN1a1g17h*E \n");
    assert_eq!(
        script,
        "SECTIONS\n{\n  .text.hot :\n  {\n    \
         *(.text._ZN1a1f17h*E .text.unlikely._ZN1a1f17h*E)\n    \
         *(.text._ZN1a1g17h*E .text.unlikely._ZN1a1g17h*E)\n  \
         }\n}\nINSERT BEFORE .text;\n"
    );
}

const PROBE: &str = r#"
mod probe {
    #[inline(never)]
    pub fn listed_hot(x: u64) -> u64 {
        x.wrapping_mul(31).rotate_left(7)
    }
    #[inline(never)]
    #[cold]
    pub fn listed_cold(x: u64) -> u64 {
        x.wrapping_mul(0x9e37_79b9).rotate_left(13) ^ 0x5555
    }
    #[inline(never)]
    pub fn unlisted(x: u64) -> u64 {
        x.wrapping_add(17).rotate_right(3)
    }
}

fn main() {
    let x = std::hint::black_box(std::env::args().count() as u64);
    let sum = probe::listed_hot(x) ^ probe::listed_cold(x) ^ probe::unlisted(x);
    println!("{sum}");
}
"#;

/// What the probe test reads of a 64-bit little-endian ELF file.
struct Elf {
    /// (name, start, end) of each section.
    sections: Vec<(String, u64, u64)>,
    /// (name, address) of each symbol of its symbol table.
    symbols: Vec<(String, u64)>,
}

fn read_elf(path: &Path) -> Elf {
    let elf = fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(
        &elf[..6],
        b"\x7fELF\x02\x01",
        "not a 64-bit little-endian ELF"
    );
    let u16_at = |at: usize| usize::from(u16::from_le_bytes(elf[at..at + 2].try_into().unwrap()));
    let u32_at = |at: usize| u32::from_le_bytes(elf[at..at + 4].try_into().unwrap()) as usize;
    let u64_at = |at: usize| u64::from_le_bytes(elf[at..at + 8].try_into().unwrap());
    let name_at = |at: usize| {
        let end = elf[at..].iter().position(|&b| b == 0).unwrap();
        String::from_utf8_lossy(&elf[at..at + end]).into_owned()
    };
    let (shoff, shentsize, shnum, shstrndx) = (
        usize::try_from(u64_at(0x28)).unwrap(),
        u16_at(0x3a),
        u16_at(0x3c),
        u16_at(0x3e),
    );
    let header = |i: usize| shoff + i * shentsize;
    let offset = |i: usize| usize::try_from(u64_at(header(i) + 0x18)).unwrap();
    let names = offset(shstrndx);
    let mut sections = Vec::new();
    let mut symbols = Vec::new();
    for i in 0..shnum {
        let (name, kind) = (u32_at(header(i)), u32_at(header(i) + 4));
        let (addr, size) = (u64_at(header(i) + 0x10), u64_at(header(i) + 0x20));
        sections.push((name_at(names + name), addr, addr + size));
        if kind == 2 {
            // SHT_SYMTAB: Elf64_Sym entries, their names in the section sh_link names.
            let strings = offset(u32_at(header(i) + 0x28));
            let size = usize::try_from(size).unwrap();
            for sym in (offset(i)..offset(i) + size).step_by(24) {
                symbols.push((name_at(strings + u32_at(sym)), u64_at(sym + 8)));
            }
        }
    }
    Elf { sections, symbols }
}

#[test]
fn the_toolchains_linker_lays_listed_functions_out_first_in_list_order() {
    let dir = tempfile::tempdir().unwrap();
    let (source, script, binary) = (
        dir.path().join("probe.rs"),
        dir.path().join("hot-text.ld"),
        dir.path().join("probe"),
    );
    fs::write(&source, PROBE).unwrap();
    // The probe's two functions first, then the committed list, as a release build reads it.
    let list =
        format!("_ZN5probe5probe10listed_hot17h*E\n_ZN5probe5probe11listed_cold17h*E\n{LIST}");
    fs::write(&script, build_support::hot_text_script(&list)).unwrap();
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let out = Command::new(&rustc)
        .args([
            "--edition",
            "2024",
            "-C",
            "opt-level=2",
            "-C",
            "link-arg=-Xlinker",
        ])
        .arg(format!("-Clink-arg=--script={}", script.display()))
        .arg("-o")
        .arg(&binary)
        .arg(&source)
        .output()
        .unwrap_or_else(|e| panic!("{rustc}: {e}"));
    assert!(
        out.status.success(),
        "{rustc} with the hot-text script: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ran = Command::new(&binary).output().unwrap();
    assert!(ran.status.success(), "the probe did not run: {ran:?}");

    let Elf { sections, symbols } = read_elf(&binary);
    let section = |name: &str| {
        sections
            .iter()
            .find(|s| s.0 == name)
            .map(|s| (s.1, s.2))
            .unwrap_or_else(|| panic!("no {name} section: {sections:?}"))
    };
    let (hot, text) = (section(".text.hot"), section(".text"));
    assert!(
        hot.1 <= text.0,
        ".text.hot {hot:x?} is not before .text {text:x?}"
    );
    let address = |name: &str| {
        symbols
            .iter()
            .find(|s| {
                s.0.starts_with(&format!("_ZN5probe5probe{}{name}17h", name.len()))
            })
            .map(|s| s.1)
            .unwrap_or_else(|| panic!("no symbol for probe::{name}"))
    };
    let (listed_hot, listed_cold, unlisted) = (
        address("listed_hot"),
        address("listed_cold"),
        address("unlisted"),
    );
    let inside = |(start, end): (u64, u64), at: u64| start <= at && at < end;
    // The cold one, which the compiler puts in .text.unlikely.*, is held as the hot one is.
    assert!(
        inside(hot, listed_hot),
        "listed_hot at {listed_hot:x}, .text.hot {hot:x?}"
    );
    assert!(
        inside(hot, listed_cold),
        "listed_cold at {listed_cold:x}, .text.hot {hot:x?}"
    );
    assert!(listed_hot < listed_cold, "not in the list's order");
    assert!(
        inside(text, unlisted),
        "unlisted at {unlisted:x}, .text {text:x?}"
    );
}
