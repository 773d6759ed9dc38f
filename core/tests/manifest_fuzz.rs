//! A manifest fuzzer: generated manifests built from the real sections and keys with values of
//! every type and shape (wrong types, extremes, deep nesting, hostile strings), and raw
//! mutations of a valid manifest. The reader must never panic or hang, and every refusal is
//! one clear line per problem, each naming the file.

#![forbid(unsafe_code)]

use perago_core::manifest::Manifest;
use proptest::prelude::*;
use std::path::Path;

const SECTIONS: &[(&str, &[&str])] = &[
    (
        "task",
        &[
            "name",
            "kind",
            "owner_email",
            "description",
            "timeout_seconds",
            "response_timeout_seconds",
            "retry_count",
            "retry_logic",
            "retry_delay_seconds",
            "timeout_policy",
            "params_schema",
            "result_schema",
        ],
    ),
    ("body", &["command", "protocol", "env", "executor", "user"]),
    ("guardrails", &["pre", "post"]),
    ("workspace", &["prefix", "merge_timeout_seconds"]),
    (
        "workspace.publish_budget",
        &["max_objects", "max_bytes", "seconds"],
    ),
    ("workspace.download_budget", &["max_objects", "max_bytes"]),
    ("dev", &["seed"]),
    ("mystery", &["x"]),
];

const VALID: &str = "[task]\nname = \"fuzz.task\"\nkind = \"workspace-free\"\ntimeout_seconds = 60\n\
                     [body]\ncommand = [\"sh\", \"body.sh\"]\n";

fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn value() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        (-5i64..100_000).prop_map(|n| n.to_string()),
        any::<bool>().prop_map(|b| b.to_string()),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| format!("{f:?}")),
        prop::sample::select(vec![
            "workspace",
            "workspace-free",
            "exec",
            "jsonl",
            "FIXED",
            "EXPONENTIAL_BACKOFF",
            "RETRY",
            "TIME_OUT_WF",
            "ALERT_ONLY",
            "2GiB",
            "10s",
            "",
            ".",
            "..",
            "/",
            "a/../b",
            "/etc/passwd",
            "sh",
            "x@y.z",
        ])
        .prop_map(toml_string),
        "\\PC{0,30}".prop_map(|s| toml_string(&s)),
        "[\\x00-\\x1f]{0,5}".prop_map(|s| toml_string(&s)),
        Just("1979-05-27T07:32:00Z".to_owned()),
    ];
    leaf.prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(", "))),
            prop::collection::vec(("[a-zA-Z_]{1,8}", inner), 0..3).prop_map(|kv| {
                let body: Vec<String> = kv
                    .into_iter()
                    .enumerate()
                    .map(|(i, (k, v))| format!("{k}{i} = {v}"))
                    .collect();
                format!("{{ {} }}", body.join(", "))
            }),
        ]
    })
}

fn document() -> impl Strategy<Value = String> {
    let entry = (0..SECTIONS.len(), 0usize..16, value());
    prop::collection::vec(prop::collection::vec(entry, 0..6), 0..5).prop_map(|sections| {
        let mut text = String::new();
        for entries in sections {
            let Some(&(first, _, _)) = entries.first() else {
                continue;
            };
            let (section, keys) = SECTIONS[first];
            text.push_str(&format!("[{section}]\n"));
            let mut used = std::collections::BTreeSet::new();
            for (_, key, value) in entries {
                let key = keys.get(key).copied().unwrap_or("unknown_key");
                if used.insert(key) {
                    text.push_str(&format!("{key} = {value}\n"));
                }
            }
        }
        text
    })
}

/// The properties every outcome must have.
fn judge(text: &str) -> Result<(), TestCaseError> {
    let dir = std::env::temp_dir();
    match Manifest::parse(Path::new("task.toml"), &dir, text) {
        Ok(_) => Ok(()),
        Err(e) => {
            let message = e.to_string();
            prop_assert!(!message.trim().is_empty());
            let lines: Vec<&str> = message.lines().collect();
            for line in &lines {
                prop_assert!(line.starts_with("manifest task.toml"), "{line}");
                prop_assert!(line.len() < 4_000, "{} bytes", line.len());
            }
            let distinct: std::collections::BTreeSet<&&str> = lines.iter().collect();
            prop_assert_eq!(
                distinct.len(),
                lines.len(),
                "a problem reported twice: {}",
                message
            );
            Ok(())
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn generated_manifests_never_panic_and_report_each_problem_once(text in document()) {
        judge(&text)?;
    }

    #[test]
    fn mutated_manifests_never_panic(
        at in 0..VALID.len(),
        cut in 0usize..20,
        insert in prop::sample::select(vec!["", "[", "]", "\"", "=", "\n", "[[task]]\n", "\u{0}", "é", "#", "{", "'''"]),
    ) {
        let at = (0..=at).rev().find(|&i| VALID.is_char_boundary(i)).unwrap_or(0);
        let end = (at + cut).min(VALID.len());
        let end = (end..=VALID.len()).find(|&i| VALID.is_char_boundary(i)).unwrap_or(VALID.len());
        let text = format!("{}{insert}{}", &VALID[..at], &VALID[end..]);
        judge(&text)?;
    }
}

#[test]
fn deep_nesting_is_an_error_not_a_crash() {
    for depth in [10, 100, 1_000, 10_000] {
        let text = format!(
            "{VALID}[dev]\nseed = {}1{}\n",
            "[".repeat(depth),
            "]".repeat(depth)
        );
        judge(&text).unwrap();
    }
}
