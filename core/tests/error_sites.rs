//! The guard of the convention for printing errors (docs/errors.md): no source file of the
//! workspace turns an error into text but through `perago_core::errors::DisplayChain` /
//! `chain`, and no `#[error]` message prints its `{source}`.
//!
//! It scans every `.rs` file of the crates' `src/` (tests, test modules and examples left
//! out) for what a regression looks like: an error binding (`e`, `err`, `error`) formatted
//! with `{e}`, logged as `%e` or turned into a `String` with `e.to_string()`, and a `{source}`
//! in an `#[error(…)]` attribute. A binding that holds text, not an error, is named for what
//! it is (`problem`, `message`, `why`); the few sites that cannot use the renderer are
//! listed in [`ALLOWED`] with their reason.

use std::path::{Path, PathBuf};

/// The crates whose sources are scanned.
const CRATES: &[&str] = &[
    "bench",
    "broker",
    "core",
    "devstack",
    "executor",
    "proto",
    "supervisor",
    "sys",
    "tests",
];

/// `(file, text of the line)`: sites allowed to format an error themselves, and why.
const ALLOWED: &[(&str, &str)] = &[
    // The renderer's own check of one message against its cause.
    ("core/src/errors.rs", "let mut message = error.to_string();"),
    // perago-sys has no dependency on perago-core (core depends on it); its errors are
    // io::Errors, whose text has no cause to walk.
    (
        "sys/src/guard.rs",
        r#"eprintln!("error: cannot start {}: {e}", program.to_string_lossy());"#,
    ),
    (
        "sys/src/reaper.rs",
        "Err(e) if *pid == me => return Err(io::Error::new(e.kind(), e.to_string())),",
    ),
];

/// Error bindings whose text must come from the renderer.
const NAMES: &[&str] = &["e", "err", "error"];

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// What is wrong with one line of code (comments and strings alike: format strings are
/// strings), if anything.
fn line_problem(line: &str) -> Option<&'static str> {
    for name in NAMES {
        for (at, _) in line.match_indices(&format!("{{{name}")) {
            let rest = &line[at + name.len() + 1..];
            let before = line[..at].chars().next_back();
            if before == Some('{') {
                continue; // `{{e}` is a literal brace
            }
            if rest.starts_with('}') || (rest.starts_with(':') && !rest.starts_with(":?")) {
                return Some("formats an error with {e}: use DisplayChain(&e)");
            }
        }
        for (at, _) in line.match_indices(&format!("%{name}")) {
            let after = line[at + name.len() + 1..].chars().next();
            if after.is_none_or(|c| !is_ident(c) && c != '.') {
                return Some("logs an error as %e: use %DisplayChain(&e)");
            }
        }
        for (at, _) in line.match_indices(&format!("{name}.to_string()")) {
            if line[..at].chars().next_back().is_none_or(|c| !is_ident(c)) {
                return Some("turns an error into text with to_string(): use chain(&e)");
            }
        }
    }
    None
}

/// Every problem of one file's text: `(line number, line, problem)`.
fn problems(text: &str) -> Vec<(usize, String, &'static str)> {
    let mut found = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    let mut skip_depth: Option<i64> = None;
    let mut in_error_attr = false;
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        // An inline test module is skipped to its closing brace.
        if let Some(depth) = skip_depth.as_mut() {
            *depth += line.matches('{').count() as i64 - line.matches('}').count() as i64;
            if *depth <= 0 {
                skip_depth = None;
            }
            continue;
        }
        if trimmed.starts_with("#[cfg(test)]")
            && let Some(next) = lines.get(i + 1)
            && next.trim_start().starts_with("mod ")
            && next.trim_end().ends_with('{')
        {
            skip_depth = Some(0);
            continue;
        }
        if trimmed.starts_with("//") {
            continue;
        }
        if trimmed.starts_with("#[error(") {
            in_error_attr = true;
        }
        if in_error_attr && line.contains("{source}") {
            found.push((
                i + 1,
                line.to_string(),
                "an #[error] message prints its {source}",
            ));
        }
        if in_error_attr && (trimmed.ends_with(")]") || trimmed == ")]") {
            in_error_attr = false;
        }
        if let Some(problem) = line_problem(line) {
            found.push((i + 1, line.to_string(), problem));
        }
    }
    found
}

/// The files scanned: each crate's `src/`, without test-only files.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "tests" {
                sources(&path, out);
            }
        } else if name.ends_with(".rs")
            && name != "tests.rs"
            && !name.ends_with("_tests.rs")
            && name != "error_texts.rs"
        {
            out.push(path);
        }
    }
}

#[test]
fn every_error_becomes_text_through_the_renderer() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut files = Vec::new();
    for krate in CRATES {
        sources(&root.join(krate).join("src"), &mut files);
    }
    files.sort();
    assert!(files.len() > 100, "the scan found the sources: {files:?}");
    let mut report = Vec::new();
    let mut allowed_seen = 0;
    for file in &files {
        let relative = file
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let text = std::fs::read_to_string(file).unwrap();
        for (number, line, problem) in problems(&text) {
            if ALLOWED
                .iter()
                .any(|(f, l)| *f == relative && line.trim() == *l)
            {
                allowed_seen += 1;
                continue;
            }
            report.push(format!(
                "{relative}:{number}: {problem}\n    {}",
                line.trim()
            ));
        }
    }
    assert!(
        report.is_empty(),
        "errors turned into text without perago_core::errors::DisplayChain (docs/errors.md):\n{}",
        report.join("\n")
    );
    assert_eq!(
        allowed_seen,
        ALLOWED.len(),
        "an allowed site is gone: drop it from ALLOWED"
    );
}

#[test]
fn the_guard_finds_each_kind_of_regression() {
    let code = r#"
fn f(e: io::Error) {
    let a = format!("cannot read: {e}");
    tracing::warn!(error = %err, "failed");
    let b = error.to_string();
    let c = format!("{}", DisplayChain(&e));
    let d = format!("{e:?} {{e}} {problem}");
    let f = make.to_string();
    // format!("{e}") in a comment is fine
}

#[derive(Debug, thiserror::Error)]
enum E {
    #[error("cannot read {}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
}

#[cfg(test)]
mod tests {
    fn t() { let x = format!("{e}"); }
}
"#;
    let lines: Vec<usize> = problems(code).into_iter().map(|(n, _, _)| n).collect();
    assert_eq!(lines, [3, 4, 5, 14]);
}
