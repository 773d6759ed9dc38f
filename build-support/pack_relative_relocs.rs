// Part of build-support/build.rs, the build script of the packages whose binaries run as
// perago's processes (`include!`d, so that it stays one file with no build dependency), and of
// the test that checks the binaries (tests/tests/integration/relocations.rs), so both judge
// glibc alike.
//
// Packs the binaries' relative relocations into DT_RELR (`-z pack-relative-relocs`). A
// position-independent Rust binary carries some 400 KiB of R_X86_64_RELATIVE entries: the loader
// reads all of them at every start, and the pages they were read from then count in the
// process's RSS for its whole life. Packed, they take a few KiB; ASLR is unchanged. An idle
// executor and broker are ~0.4 MiB smaller for it (docs/performance.md, round three, seventh
// look).
//
// Only where the result is sure to load: a native build (the build machine's C library is the
// one the binary is linked against and runs on) for glibc 2.36 or newer, whose loader is the
// first to read DT_RELR. The linker (lld, Rust's default on x86_64 Linux, as GNU ld) marks
// such a binary as needing glibc's GLIBC_ABI_DT_RELR version, so an older loader refuses it
// with a clear error rather than running it unrelocated. Elsewhere (cross builds, musl, an
// older glibc, no `getconf`) nothing is added.
//
// That mark is the price: a binary built here then needs glibc 2.36 where it runs, where one
// built without needs 2.34. To build for older hosts (Ubuntu 22.04, RHEL 9) on a newer one, set
// PERAGO_PACK_RELOCS=0.

pub(crate) fn pack_relative_relocs() {
    println!("cargo:rerun-if-changed=../build-support/pack_relative_relocs.rs");
    println!("cargo:rerun-if-env-changed=PERAGO_PACK_RELOCS");
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let native = var("TARGET") == var("HOST");
    let glibc = var("CARGO_CFG_TARGET_OS") == "linux" && var("CARGO_CFG_TARGET_ENV") == "gnu";
    let wanted = var("PERAGO_PACK_RELOCS") != "0";
    if wanted && native && glibc && glibc_at_least(2, 36) {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}

/// Whether the build machine's glibc (`getconf GNU_LIBC_VERSION`: "glibc 2.36") is at least
/// `major.minor`; false when that cannot be read.
pub(crate) fn glibc_at_least(major: u32, minor: u32) -> bool {
    let Ok(out) = std::process::Command::new("getconf")
        .arg("GNU_LIBC_VERSION")
        .output()
    else {
        return false;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let Some(version) = text.trim().strip_prefix("glibc ") else {
        return false;
    };
    let mut parts = version.split('.').map(|p| p.parse::<u32>());
    match (parts.next(), parts.next()) {
        (Some(Ok(a)), Some(Ok(b))) => (a, b) >= (major, minor),
        _ => false,
    }
}
