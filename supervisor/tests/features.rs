//! The `dev` feature: a build without it (`--no-default-features`) has no devstack in its
//! dependency tree. `cargo tree` reads only the manifests and `Cargo.lock`, so this costs no
//! second build.

use std::process::Command;

/// The normal (not dev-, not build-) dependencies of perago-supervisor under `features`.
fn normal_dependencies(features: &[&str]) -> String {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "tree",
            "--offline",
            "--locked",
            "--prefix",
            "none",
            "--edges",
            "normal",
            "--format",
            "{p}",
            "--package",
            "perago-supervisor",
        ])
        .args(features)
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

#[test]
fn a_build_without_the_dev_feature_has_no_devstack() {
    let without = normal_dependencies(&["--no-default-features"]);
    assert!(
        without.lines().any(|l| l.starts_with("perago-supervisor ")),
        "{without}"
    );
    let devstack: Vec<&str> = without
        .lines()
        .filter(|l| l.starts_with("perago-devstack"))
        .collect();
    assert!(
        devstack.is_empty(),
        "perago-devstack is a dependency of a --no-default-features build: {devstack:?}"
    );
    // The default build has it: `dev` is on by default.
    let default = normal_dependencies(&[]);
    assert!(
        default.lines().any(|l| l.starts_with("perago-devstack ")),
        "{default}"
    );
}
