//! Figures: several runs of one measurement, shown as median with min and max; percentiles of
//! latency samples; the table, the JSON file and the SVG plot.

use serde_json::{Value, json};
use std::fmt::Write as _;

/// One measured quantity over several runs.
#[derive(Debug, Clone)]
pub(crate) struct Figure {
    pub(crate) name: String,
    pub(crate) unit: &'static str,
    pub(crate) runs: Vec<f64>,
}

fn sorted(values: &[f64]) -> Vec<f64> {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v
}

/// The `q` quantile (0..=1) of `values`, nearest rank.
pub(crate) fn quantile(values: &[f64], q: f64) -> f64 {
    let v = sorted(values);
    if v.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

impl Figure {
    pub(crate) fn new(name: impl Into<String>, unit: &'static str) -> Self {
        Self {
            name: name.into(),
            unit,
            runs: Vec::new(),
        }
    }

    pub(crate) fn median(&self) -> f64 {
        quantile(&self.runs, 0.5)
    }

    fn min(&self) -> f64 {
        sorted(&self.runs).first().copied().unwrap_or(f64::NAN)
    }

    fn max(&self) -> f64 {
        sorted(&self.runs).last().copied().unwrap_or(f64::NAN)
    }

    pub(crate) fn json(&self) -> Value {
        json!({
            "name": self.name, "unit": self.unit, "median": self.median(),
            "min": self.min(), "max": self.max(), "runs": self.runs,
        })
    }
}

fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        "-".to_owned()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// The table printed at the end of a run.
pub(crate) fn table(figures: &[Figure]) -> String {
    let width = figures
        .iter()
        .map(|f| f.name.len())
        .max()
        .unwrap_or(10)
        .max(10);
    let mut out = format!(
        "{:<width$}  {:>10}  {:>10}  {:>10}  unit\n",
        "figure", "median", "min", "max"
    );
    for f in figures {
        let _ = writeln!(
            out,
            "{:<width$}  {:>10}  {:>10}  {:>10}  {}",
            f.name,
            fmt_num(f.median()),
            fmt_num(f.min()),
            fmt_num(f.max()),
            f.unit
        );
    }
    out
}

/// How far a figure may move the wrong way against the previous run before its line is marked.
const REGRESSION_PERCENT: f64 = 10.0;

/// The marker of a regressed figure's line (and of the summary), easy to grep in CI output.
pub(crate) const REGRESSED: &str = "<< REGRESSED";

/// Whether a larger value of a figure in `unit` is better (`Some(true)`), worse
/// (`Some(false)`), or not judged (ratios, counts: what they compare says which way is good).
fn larger_is_better(unit: &str) -> Option<bool> {
    match unit {
        "tasks/s" => Some(true),
        "µs" | "ms" | "s" | "MiB" => Some(false),
        _ => None,
    }
}

/// Each figure beside its median in `previous` (a `results.json` of an earlier run, such as
/// `docs/performance-previous.json`): previous, now, and the change in percent, so a
/// regression shows up in the run that makes it. Figures the previous run lacks show `-`. A
/// figure more than [`REGRESSION_PERCENT`] worse (slower, more CPU, more memory) ends its line
/// with [`REGRESSED`], and a last line counts and names them.
pub(crate) fn comparison(figures: &[Figure], previous: &Value) -> String {
    let before: std::collections::BTreeMap<&str, f64> = previous["figures"]
        .as_array()
        .map(|all| {
            all.iter()
                .filter_map(|f| Some((f["name"].as_str()?, f["median"].as_f64()?)))
                .collect()
        })
        .unwrap_or_default();
    let width = figures
        .iter()
        .map(|f| f.name.len())
        .max()
        .unwrap_or(10)
        .max(10);
    let mut out = format!(
        "{:<width$}  {:>10}  {:>10}  {:>8}  unit\n",
        "figure", "previous", "now", "change"
    );
    let mut regressed = Vec::new();
    for f in figures {
        let now = f.median();
        let mut mark = "";
        let (was, change) = match before.get(f.name.as_str()) {
            Some(&was) if was != 0.0 && was.is_finite() && now.is_finite() => {
                let percent = (now - was) / was * 100.0;
                let worse = match larger_is_better(f.unit) {
                    Some(true) => -percent,
                    Some(false) => percent,
                    None => 0.0,
                };
                if worse > REGRESSION_PERCENT {
                    mark = REGRESSED;
                    regressed.push(f.name.as_str());
                }
                (fmt_num(was), format!("{percent:+.0} %"))
            }
            Some(&was) => (fmt_num(was), "-".to_owned()),
            None => ("-".to_owned(), "-".to_owned()),
        };
        let line = format!(
            "{:<width$}  {:>10}  {:>10}  {:>8}  {} {mark}",
            f.name,
            was,
            fmt_num(now),
            change,
            f.unit
        );
        let _ = writeln!(out, "{}", line.trim_end());
    }
    if !regressed.is_empty() {
        let _ = writeln!(
            out,
            "{REGRESSED}: {} figure(s) more than {REGRESSION_PERCENT} % worse than the previous run: {}",
            regressed.len(),
            regressed.join("; ")
        );
    }
    out
}

/// A line plot of throughput against executor count, one series per label.
pub(crate) fn scaling_svg(series: &[(String, Vec<(f64, f64)>)]) -> String {
    let (w, h, pad) = (640.0, 400.0, 50.0);
    let max_x = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|(x, _)| *x))
        .fold(1.0, f64::max);
    let max_y = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|(_, y)| *y))
        .fold(1.0, f64::max)
        * 1.1;
    let sx = |x: f64| pad + (x / max_x) * (w - 2.0 * pad);
    let sy = |y: f64| h - pad - (y / max_y) * (h - 2.0 * pad);
    let colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <line x1=\"{pad}\" y1=\"{y0}\" x2=\"{x1}\" y2=\"{y0}\" stroke=\"black\"/>\n\
         <line x1=\"{pad}\" y1=\"{pad}\" x2=\"{pad}\" y2=\"{y0}\" stroke=\"black\"/>\n\
         <text x=\"{cx}\" y=\"{ty}\" text-anchor=\"middle\">executors (-j)</text>\n\
         <text x=\"14\" y=\"{cy}\" transform=\"rotate(-90 14 {cy})\" text-anchor=\"middle\">tasks/s</text>\n",
        y0 = h - pad,
        x1 = w - pad,
        cx = w / 2.0,
        ty = h - 12.0,
        cy = h / 2.0,
    );
    let _ = writeln!(
        svg,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
        pad - 4.0,
        sy(max_y / 1.1) + 4.0,
        fmt_num(max_y / 1.1)
    );
    for (i, (label, points)) in series.iter().enumerate() {
        let color = colors[i % colors.len()];
        let path: Vec<String> = points
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", sx(*x), sy(*y)))
            .collect();
        let _ = writeln!(
            svg,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>",
            path.join(" ")
        );
        for (x, y) in points {
            let _ = writeln!(
                svg,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{color}\"/><text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                sx(*x),
                sy(*y),
                sx(*x),
                h - pad + 14.0,
                x
            );
        }
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\" fill=\"{color}\">{label}</text>",
            pad + 10.0,
            pad + 14.0 * (i as f64 + 1.0)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_comparison_shows_each_change_against_the_previous_run() {
        let figures = vec![
            Figure {
                name: "broker RSS idle".into(),
                unit: "MiB",
                runs: vec![13.8],
            },
            Figure {
                name: "new figure".into(),
                unit: "ms",
                runs: vec![5.0],
            },
        ];
        let previous = json!({"figures": [{"name": "broker RSS idle", "median": 6.9}]});
        let text = comparison(&figures, &previous);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[1].starts_with("broker RSS idle"), "{text}");
        assert!(
            lines[1].contains("6.90") && lines[1].contains("13.8") && lines[1].contains("+100 %"),
            "{text}"
        );
        assert!(lines[2].contains("   -  "), "{text}");
        // Twice the memory is a regression, marked on its line and summed up.
        assert!(lines[1].ends_with(REGRESSED), "{text}");
        assert!(!lines[2].contains(REGRESSED), "{text}");
        assert!(
            lines[3].starts_with(REGRESSED)
                && lines[3].contains("1 figure(s)")
                && lines[3].contains("broker RSS idle"),
            "{text}"
        );
    }

    #[test]
    fn only_a_move_the_wrong_way_beyond_ten_percent_is_a_regression() {
        let figure = |name: &str, unit: &'static str, now: f64| Figure {
            name: name.into(),
            unit,
            runs: vec![now],
        };
        let figures = vec![
            figure("faster", "tasks/s", 120.0),
            figure("slower", "tasks/s", 85.0),
            figure("a bit slower", "tasks/s", 95.0),
            figure("less cpu", "µs", 80.0),
            figure("more cpu", "µs", 115.0),
            figure("ratio", "x", 50.0),
        ];
        let previous = json!({"figures": [
            {"name": "faster", "median": 100.0}, {"name": "slower", "median": 100.0},
            {"name": "a bit slower", "median": 100.0}, {"name": "less cpu", "median": 100.0},
            {"name": "more cpu", "median": 100.0}, {"name": "ratio", "median": 100.0},
        ]});
        let text = comparison(&figures, &previous);
        let marked: Vec<&str> = text
            .lines()
            .filter(|l| l.ends_with(REGRESSED))
            .map(|l| l.split("  ").next().unwrap_or_default())
            .collect();
        assert_eq!(marked, ["slower", "more cpu"], "{text}");
    }

    #[test]
    fn quantiles_and_medians() {
        let v = [5.0, 1.0, 4.0, 2.0, 3.0];
        assert_eq!(quantile(&v, 0.5), 3.0);
        assert_eq!(quantile(&v, 0.99), 5.0);
        assert_eq!(quantile(&v, 0.0), 1.0);
        let mut f = Figure::new("x", "tasks/s");
        f.runs = vec![10.0, 30.0, 20.0];
        assert_eq!(f.median(), 20.0);
        assert_eq!(f.json()["min"], 10.0);
        assert!(table(&[f]).contains("20.0"));
    }

    #[test]
    fn the_plot_is_an_svg_with_every_series() {
        let svg = scaling_svg(&[("perago".into(), vec![(1.0, 100.0), (2.0, 180.0)])]);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("perago") && svg.contains("polyline"));
    }
}
