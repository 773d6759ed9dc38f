//! Properties of the pure logic that must hold for every input, not just the examples.

#![forbid(unsafe_code)]

use perago_core::{
    manifest::Manifest,
    result::{MAX_REASON_CHARS, Reason},
    shape::normalize_prefix,
    units::{parse_byte_size, parse_duration},
};
use proptest::prelude::*;
use std::{path::Path, time::Duration};

proptest! {
    #[test]
    fn reasons_are_nonempty_and_bounded(head in ".{0,700}", tail in ".{0,2000}") {
        let r = Reason::with_tail(&head, &tail);
        let n = r.as_str().chars().count();
        prop_assert!((1..=MAX_REASON_CHARS).contains(&n), "{n} chars");
        let r = Reason::new(head);
        prop_assert!(r.as_str().chars().count() <= MAX_REASON_CHARS);
    }

    #[test]
    fn tails_keep_their_end(head in "[a-z ]{1,50}", tail in "[a-z0-9\n]{1,3000}") {
        let r = Reason::with_tail(&head, &tail);
        let kept_tail = tail.trim();
        // The last characters of the stderr tail are the most telling: they always survive.
        let last: String = kept_tail.chars().rev().take(20).collect::<Vec<_>>().into_iter().rev().collect();
        prop_assert!(r.as_str().ends_with(&last));
    }

    #[test]
    fn durations_round_trip(n in 1u64..1_000_000, unit in prop::sample::select(vec!["ms", "s", "m", "h", ""])) {
        let d = parse_duration(&format!("{n}{unit}")).unwrap();
        let millis = match unit { "ms" => n, "s" | "" => n * 1000, "m" => n * 60_000, _ => n * 3_600_000 };
        prop_assert_eq!(d, Duration::from_millis(millis));
    }

    #[test]
    fn parsers_never_panic(text in "\\PC{0,40}") {
        let _ = parse_duration(&text);
        let _ = parse_byte_size(&text);
        let _ = normalize_prefix(&text);
    }

    #[test]
    fn normalized_prefixes_stay_inside(text in "[a-z./]{0,30}") {
        if let Ok(p) = normalize_prefix(&text) {
            prop_assert!(p.is_empty() || p.ends_with('/'));
            prop_assert!(!p.starts_with('/'));
            prop_assert!(!p.split('/').any(|s| s == ".." || s == "."));
            prop_assert_eq!(normalize_prefix(&p), Ok(p.clone()), "idempotent");
        }
    }

    #[test]
    fn manifest_parsing_never_panics(text in "(\\[[a-z_.]{0,12}\\]\n|[a-z_]{1,10} = (\"[a-z./ ]{0,8}\"|-?[0-9]{1,4}|\\[\\]|\\[\"[a-z]{0,4}\"\\])\n){0,12}") {
        let _ = Manifest::parse(Path::new("task.toml"), Path::new("/nonexistent"), &text);
    }
}
