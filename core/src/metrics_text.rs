//! Prometheus text expositions: [`merge_expositions`] joins what several brokers serve on
//! `/metrics` into one exposition, for a supervisor that runs several task types behind one
//! address.
//!
//! The brokers write `prometheus-client`'s Prometheus text (version 0.0.4); the merge also
//! takes OpenMetrics text (`# UNIT`, `_created`, a final `# EOF`). Either way every broker
//! announces the same families, with its own label values (`task="…"`, `taskType="…"`), and a
//! family announced twice is not valid: the merged text announces each family once.

use std::collections::HashMap;

/// The endings a sample's name may add to its family's name (OpenMetrics: counter `_total`
/// and `_created`, histogram and summary `_bucket`, `_count`, `_sum`, gauge histogram
/// `_gcount` and `_gsum`, info `_info`). In Prometheus text 0.0.4 a counter's or an info's
/// family is already named with its ending, so its samples carry the name as it is.
const SAMPLE_SUFFIXES: [&str; 8] = [
    "_total", "_created", "_bucket", "_count", "_sum", "_gcount", "_gsum", "_info",
];

/// One family of the merged text.
#[derive(Debug, Default)]
struct Family<'a> {
    /// Its `# HELP`, `# TYPE` and `# UNIT` lines, each keyword once (the first input that
    /// has it wins).
    metadata: Vec<(&'a str, &'a str)>,
    /// The sample lines of every input, input by input.
    samples: Vec<&'a str>,
}

/// The families of the merged text, in first-seen order.
#[derive(Debug, Default)]
struct Families<'a> {
    order: Vec<Family<'a>>,
    index: HashMap<&'a str, usize>,
}

impl<'a> Families<'a> {
    fn get(&mut self, name: &'a str) -> usize {
        *self.index.entry(name).or_insert_with(|| {
            self.order.push(Family::default());
            self.order.len() - 1
        })
    }
}

/// The metric name a sample line starts with (empty for a quoted UTF-8 name, which then
/// stays with the family it follows).
fn sample_name(line: &str) -> &str {
    let end = line.find(['{', ' ', '\t']).unwrap_or(line.len());
    &line[..end]
}

/// Whether a sample named `sample` belongs to the family named `family`.
fn belongs(sample: &str, family: &str) -> bool {
    sample.is_empty()
        || sample
            .strip_prefix(family)
            .is_some_and(|rest| rest.is_empty() || SAMPLE_SUFFIXES.contains(&rest))
}

/// Merges the expositions `texts` (each a whole `/metrics` body) into one: each family's
/// metadata (`# HELP`, `# TYPE`, `# UNIT`) once, followed by the samples of every input for
/// that family (input by input, each input's own order kept, so a histogram's buckets, sum
/// and count stay together), families in first-seen order, and exactly one `# EOF` at the
/// end (which OpenMetrics requires and Prometheus text 0.0.4 reads as a comment). Other
/// comments and blank lines are dropped. A sample belongs to the family whose metadata it
/// follows in its own input when its name is that family's name or the name plus an ending
/// the kinds allow (`_total`, `_bucket`, …); a sample that follows none (an untyped one) is
/// a family of its own name. No input gives just `# EOF`.
pub fn merge_expositions(texts: &[String]) -> String {
    let mut families = Families::default();
    for text in texts {
        // The family of the metadata block last seen in this input, with its name.
        let mut current: Option<(&str, usize)> = None;
        for line in text.lines() {
            if line.trim().is_empty() {
                continue;
            }
            if let Some(comment) = line.strip_prefix('#') {
                let mut words = comment.trim_start().splitn(3, ' ');
                let keyword = words.next().unwrap_or_default();
                match (keyword, words.next()) {
                    ("HELP" | "TYPE" | "UNIT", Some(name)) if !name.is_empty() => {
                        let family = families.get(name);
                        let metadata = &mut families.order[family].metadata;
                        if !metadata.iter().any(|(k, _)| *k == keyword) {
                            metadata.push((keyword, line));
                        }
                        current = Some((name, family));
                    }
                    // Nothing valid follows the end of an OpenMetrics text.
                    ("EOF", None) => break,
                    _ => {}
                }
                continue;
            }
            let name = sample_name(line);
            let family = match current {
                Some((family_name, family)) if belongs(name, family_name) => family,
                _ => {
                    let family = families.get(name);
                    current = Some((name, family));
                    family
                }
            };
            families.order[family].samples.push(line);
        }
    }
    let mut out = String::new();
    for family in &families.order {
        for line in family
            .metadata
            .iter()
            .map(|(_, l)| l)
            .chain(&family.samples)
        {
            out.push_str(line);
            out.push('\n');
        }
    }
    out.push_str("# EOF\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::{
        encoding::EncodeLabelSet,
        metrics::{
            counter::Counter, family::Family as Labelled, gauge::Gauge, histogram::Histogram,
            info::Info,
        },
        registry::{Registry, Unit},
    };

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct Status {
        status: String,
    }

    /// A registry like a broker's: every family under the task's label, a counter family by
    /// status, a histogram (with a unit), a gauge and an info.
    fn registry(task: &str, polls: u64, busy: i64) -> Registry {
        let mut root = Registry::default();
        let sub = root.sub_registry_with_label(("task".into(), task.to_owned().into()));
        let counter: Counter = Counter::default();
        counter.inc_by(polls);
        sub.register("perago_polls", "Poll requests sent", counter);
        let results = Labelled::<Status, Counter>::default();
        results
            .get_or_create(&Status {
                status: "COMPLETED".into(),
            })
            .inc();
        sub.register("perago_task_results", "Results by status", results);
        let histogram = Histogram::new([0.1, 1.0]);
        histogram.observe(0.5);
        sub.register_with_unit(
            "perago_task_duration",
            "Time from dispatch to completion",
            Unit::Seconds,
            histogram,
        );
        let gauge: Gauge = Gauge::default();
        gauge.set(busy);
        sub.register("perago_busy_slots", "Busy slots", gauge);
        sub.register(
            "perago_build",
            "The build",
            Info::new(vec![("version".to_owned(), "1".to_owned())]),
        );
        root
    }

    fn prometheus_text(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut out, registry).unwrap();
        out
    }

    fn openmetrics_text(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out
    }

    /// The names of the `# TYPE` lines, in order.
    fn types(text: &str) -> Vec<&str> {
        text.lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split(' ').next().unwrap())
            .collect()
    }

    #[test]
    fn no_input_gives_just_eof() {
        assert_eq!(merge_expositions(&[]), "# EOF\n");
        assert_eq!(merge_expositions(&[String::new()]), "# EOF\n");
    }

    #[test]
    fn one_input_is_kept_as_it_is_with_an_eof() {
        let text = prometheus_text(&registry("a", 3, 1));
        assert_eq!(
            merge_expositions(std::slice::from_ref(&text)),
            format!("{text}# EOF\n")
        );
        let text = openmetrics_text(&registry("a", 3, 1));
        assert_eq!(merge_expositions(std::slice::from_ref(&text)), text);
    }

    #[test]
    fn every_family_once_with_the_samples_of_both_in_prometheus_text() {
        let a = prometheus_text(&registry("alpha", 3, 1));
        let b = prometheus_text(&registry("beta", 5, 2));
        let merged = merge_expositions(&[a.clone(), b]);
        assert_eq!(types(&merged), types(&a), "{merged}");
        assert_eq!(
            merged.lines().filter(|l| l.starts_with("# HELP ")).count(),
            types(&a).len(),
            "{merged}"
        );
        assert_eq!(merged.matches("# EOF").count(), 1);
        assert!(merged.ends_with("\n# EOF\n"), "{merged}");
        // Each family's samples follow its own metadata: alpha's, then beta's.
        let expected = "# HELP perago_polls_total Poll requests sent.\n\
                        # TYPE perago_polls_total counter\n\
                        perago_polls_total{task=\"alpha\"} 3\n\
                        perago_polls_total{task=\"beta\"} 5\n";
        assert!(merged.starts_with(expected), "{merged}");
        for line in [
            "# TYPE perago_task_duration_seconds histogram\n\
             perago_task_duration_seconds_bucket{task=\"alpha\",le=\"0.1\"} 0\n",
            "perago_task_duration_seconds_sum{task=\"alpha\"} 0.5\n\
             perago_task_duration_seconds_count{task=\"alpha\"} 1\n\
             perago_task_duration_seconds_bucket{task=\"beta\",le=\"0.1\"} 0\n",
            "perago_busy_slots{task=\"alpha\"} 1\nperago_busy_slots{task=\"beta\"} 2\n",
            "perago_build_info{task=\"beta\",version=\"1\"} 1\n# EOF\n",
        ] {
            assert!(merged.contains(line), "{line} missing:\n{merged}");
        }
    }

    #[test]
    fn every_family_once_with_the_samples_of_both_in_openmetrics() {
        let a = openmetrics_text(&registry("alpha", 3, 1));
        let b = openmetrics_text(&registry("beta", 5, 2));
        let merged = merge_expositions(&[a.clone(), b]);
        assert_eq!(types(&merged), types(&a), "{merged}");
        assert_eq!(merged.matches("# UNIT ").count(), 1, "{merged}");
        assert_eq!(merged.matches("# EOF").count(), 1, "{merged}");
        for line in [
            "# TYPE perago_polls counter\n\
             perago_polls_total{task=\"alpha\"} 3\n\
             perago_polls_total{task=\"beta\"} 5\n",
            "# TYPE perago_build info\n\
             perago_build_info{task=\"alpha\",version=\"1\"} 1\n\
             perago_build_info{task=\"beta\",version=\"1\"} 1\n# EOF\n",
        ] {
            assert!(merged.contains(line), "{line} missing:\n{merged}");
        }
    }

    #[test]
    fn a_sample_outside_the_family_it_follows_is_a_family_of_its_own() {
        let a = "# HELP up_total Ups.\n# TYPE up_total counter\nup_total{task=\"a\"} 1\n\
                 stray{task=\"a\"} 7\n"
            .to_owned();
        let b = "# HELP up_total Ups.\n# TYPE up_total counter\nup_total{task=\"b\"} 2\n\
                 # a comment\n\nstray{task=\"b\"} 8\n"
            .to_owned();
        assert_eq!(
            merge_expositions(&[a, b]),
            "# HELP up_total Ups.\n# TYPE up_total counter\nup_total{task=\"a\"} 1\n\
             up_total{task=\"b\"} 2\nstray{task=\"a\"} 7\nstray{task=\"b\"} 8\n# EOF\n"
        );
    }

    #[test]
    fn a_family_only_one_input_has_is_kept() {
        let a = "# HELP q Depth.\n# TYPE q gauge\nq{task=\"a\"} 4\n".to_owned();
        let b = "# HELP r Other.\n# TYPE r gauge\nr{task=\"b\"} 1\n# HELP q Depth.\n\
                 # TYPE q gauge\nq{task=\"b\"} 5\n# EOF\nafter 1\n"
            .to_owned();
        assert_eq!(
            merge_expositions(&[a, b]),
            "# HELP q Depth.\n# TYPE q gauge\nq{task=\"a\"} 4\nq{task=\"b\"} 5\n\
             # HELP r Other.\n# TYPE r gauge\nr{task=\"b\"} 1\n# EOF\n"
        );
    }
}
