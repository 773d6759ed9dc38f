// Part of build-support/build.rs, the build script of the packages whose binaries run as
// perago's processes (`include!`d, as pack_relative_relocs.rs is), and of the test that checks
// the layout (tests/tests/integration/hot_text.rs), so both build the same linker script.
//
// Lays the functions the runtime runs out together, at the front of the binaries' code, in an
// output section of their own (`.text.hot`). The kernel maps a binary's code on first touch 64
// KiB at a time (fault-around), so with the functions an idle executor or broker has run spread
// over 5–7 MiB of code, 3–4 MiB of it stayed in each process's RSS; laid out together they
// take ~2 MiB (docs/performance.md, round three, ninth look).
//
// The list, build-support/hot-text.txt, is generated: scripts/profile-hot-text runs the
// benchmark's scenarios with the runtime's processes under valgrind's callgrind and writes each
// function of the runtime's binaries that ran, hottest first, as a pattern of its section's
// name whose hash is a `*`: a symbol's hash moves with the features, the dependencies' versions
// and the compiler, its path does not. A stale list only lays the code out less well (a pattern
// of a function that is gone matches nothing); regenerate it after large changes.
//
// Applied to optimized builds on Linux, where the linker is lld (Rust's default on x86_64
// Linux) or GNU ld: both read a script that only `INSERT`s a section into their default layout.
// Not to debug builds (matching the patterns against a debug binary's ~100,000 sections costs
// ~10 s per link), not when the flags ask for gold or mold, and not with PERAGO_HOT_TEXT=0.

/// Emits the link arguments for this package's binaries, where they apply (see above).
pub(crate) fn hot_text() {
    println!("cargo:rerun-if-changed=../build-support/hot_text.rs");
    println!("cargo:rerun-if-changed=../build-support/hot-text.txt");
    println!("cargo:rerun-if-env-changed=PERAGO_HOT_TEXT");
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let flags = var("CARGO_ENCODED_RUSTFLAGS");
    let other_linker = ["fuse-ld=gold", "fuse-ld=mold"]
        .iter()
        .any(|l| flags.contains(l));
    if var("PERAGO_HOT_TEXT") == "0"
        || var("CARGO_CFG_TARGET_OS") != "linux"
        || var("OPT_LEVEL") == "0"
        || other_linker
    {
        return;
    }
    let list = match std::fs::read_to_string("../build-support/hot-text.txt") {
        Ok(list) => list,
        Err(e) => {
            println!("cargo:warning=build-support/hot-text.txt: {e}; code laid out as linked");
            return;
        }
    };
    let script = std::path::Path::new(&var("OUT_DIR")).join("hot-text.ld");
    if let Err(e) = std::fs::write(&script, hot_text_script(&list)) {
        println!("cargo:warning={}: {e}; code laid out as linked", script.display());
        return;
    }
    // -Xlinker passes the path as one argument, whatever it holds (-Wl, would split a comma).
    println!("cargo:rustc-link-arg-bins=-Xlinker");
    println!("cargo:rustc-link-arg-bins=--script={}", script.display());
}

/// The linker script for `list` (one section-name pattern per line, `#` comments): an output
/// section `.text.hot` before `.text` holding the listed functions in the list's order, whether
/// the compiler put them in `.text.<name>` or, judged cold, `.text.unlikely.<name>`.
pub(crate) fn hot_text_script(list: &str) -> String {
    let mut script = String::from("SECTIONS\n{\n  .text.hot :\n  {\n");
    for pattern in list
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        script.push_str("    *(.text.");
        script.push_str(pattern);
        script.push_str(" .text.unlikely.");
        script.push_str(pattern);
        script.push_str(")\n");
    }
    script.push_str("  }\n}\nINSERT BEFORE .text;\n");
    script
}
