//! `report.html` of one run: one self-contained page (inline SVG, no scripts) with TF
//! issue and completion rates, latency percentiles, per-EPN load and free buffer over
//! time, and the run's membership changes and faults marked on the time axis.
//!
//! Read from the run's `summary.json`, `tfs.csv`, `loads.csv` and `faults.json`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use fanin_node::icn::summary::{write_atomic, TfCsv};
use fanin_report::plot::{Chart, Line, Marker, Series};

/// EPNs drawn one line each; beyond, the page says how many were left out.
const MAX_EPN_LINES: usize = 8;

/// Latencies kept per second for its percentiles (a longer second is sampled).
const LATENCIES_PER_SECOND: usize = 2000;

/// What the charts need from `tfs.csv`, gathered per second while streaming it: the
/// memory grows with the run's seconds, not with its TFs.
#[derive(Default)]
struct Timeline {
    issued: BTreeMap<i64, f64>,
    completed: BTreeMap<i64, f64>,
    lost: BTreeMap<i64, f64>,
    /// Per second of completion: (TFs seen, a sample of their latencies in ms).
    latency: BTreeMap<i64, (usize, Vec<f64>)>,
    /// Completed per second, for the `MAX_EPN_LINES` lowest EPN ids.
    per_epn: BTreeMap<u32, BTreeMap<i64, f64>>,
    /// Every EPN seen, drawn or not.
    epns_seen: std::collections::BTreeSet<u32>,
}

/// One `tfs.csv` row: issue s, ack s, latency ms, EPN, completed.
type TfRow = (f64, f64, f64, Option<u32>, bool);

impl Timeline {
    /// Adds one row; times outside [0, `max_s`] (a corrupt row) are left out.
    fn add(&mut self, (issue, ack, lat, epn, done): TfRow, max_s: f64) {
        let sec = |t: f64| (t.is_finite() && (0.0..=max_s).contains(&t)).then(|| t.floor() as i64);
        if let Some(s) = sec(issue) {
            *self.issued.entry(s).or_default() += 1.0;
        }
        let Some(s) = sec(ack) else { return };
        if !done {
            *self.lost.entry(s).or_default() += 1.0;
            return;
        }
        *self.completed.entry(s).or_default() += 1.0;
        let (n, v) = self.latency.entry(s).or_default();
        *n += 1;
        match v.len() < LATENCIES_PER_SECOND {
            true => v.push(lat),
            false => v[*n % LATENCIES_PER_SECOND] = lat,
        }
        if let Some(e) = epn {
            self.epns_seen.insert(e);
            *self.per_epn.entry(e).or_default().entry(s).or_default() += 1.0;
            if self.per_epn.len() > MAX_EPN_LINES {
                self.per_epn.pop_last();
            }
        }
    }
}

/// `tfs.csv` gathered per second; rows it cannot read are left out.
fn read_tfs(dir: &Path, max_s: f64) -> anyhow::Result<Timeline> {
    let p = dir.join("tfs.csv");
    anyhow::ensure!(p.is_file(), "{}: no such file", p.display());
    let mut t = Timeline::default();
    for r in TfCsv::rows(dir) {
        let done = r.status == "complete";
        t.add((r.issue_s, r.ack_s, r.latency_ms, r.epn, done), max_s);
    }
    Ok(t)
}

/// Free MiB over time of the lowest EPN ids in `loads.csv`; empty without one.
fn read_loads(dir: &Path, max_s: f64) -> BTreeMap<u32, Vec<(f64, f64)>> {
    let mut by: BTreeMap<u32, Vec<(f64, f64)>> = BTreeMap::new();
    for (t, e, free, _) in TfCsv::loads(dir) {
        if t.is_finite() && (0.0..=max_s).contains(&t) {
            by.entry(e)
                .or_default()
                .push((t, free as f64 / (1 << 20) as f64));
            if by.len() > MAX_EPN_LINES {
                by.pop_last();
            }
        }
    }
    by
}

/// Writes `dir/report.html`; its path.
pub fn write(dir: &Path) -> anyhow::Result<PathBuf> {
    let summary: serde_json::Value = read_json(&dir.join("summary.json"))?;
    // Nothing in a run happens later than its duration and a generous drain.
    let max_s = summary["duration_s"].as_f64().unwrap_or(0.0).max(0.0) + 3600.0;
    let tfs = read_tfs(dir, max_s)?;
    let loads = read_loads(dir, max_s);
    let markers = markers(&summary, dir);
    let mut html = String::from(HEAD);
    html.push_str(&format!(
        "<h1>fanin run {}</h1>\n",
        esc(summary["run"].as_str().unwrap_or("?"))
    ));
    html.push_str(&summary_table(&summary));
    html.push_str(&rates_chart(&tfs, &markers).svg());
    html.push_str(&latency_chart(&tfs).svg());
    let (per_epn, left_out) = per_epn_chart(&tfs);
    html.push_str(&per_epn.svg());
    if !loads.is_empty() {
        html.push_str(&free_buffer_chart(&loads).svg());
    }
    if left_out > 0 {
        html.push_str(&format!("<p>{left_out} more EPNs not drawn.</p>\n"));
    }
    html.push_str(&marker_table(&markers));
    html.push_str("</body></html>\n");
    // Whole or not at all: a reader may look while it is drawn (a session draws it
    // beside the next run).
    let out = dir.join("report.html");
    write_atomic(&out, &html)?;
    Ok(out)
}

const HEAD: &str = "<!doctype html><html><head><meta charset=\"utf-8\"><title>fanin run report</title>\
<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}\
td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}svg{display:block;margin:1em 0}</style>\
</head><body>\n";

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn read_json(p: &Path) -> anyhow::Result<serde_json::Value> {
    let t = std::fs::read_to_string(p).with_context(|| format!("{}", p.display()))?;
    serde_json::from_str(&t).with_context(|| format!("{}", p.display()))
}

/// (time s, what) of the run's membership changes and injected faults.
fn markers(summary: &serde_json::Value, dir: &Path) -> Vec<(f64, String)> {
    let mut m: Vec<(f64, String)> = summary["membership"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            Some((
                e["t_s"].as_f64()?,
                format!("{} {}", e["node"].as_str()?, e["kind"].as_str()?),
            ))
        })
        .collect();
    if let Ok(faults) = read_json(&dir.join("faults.json")) {
        for f in faults.as_array().into_iter().flatten() {
            if let (Some(t), Some(n), Some(a)) =
                (f["at_s"].as_f64(), f["node"].as_str(), f["action"].as_str())
            {
                m.push((t, format!("fault: {a} {n}")));
            }
        }
    }
    m.sort_by(|a, b| a.0.total_cmp(&b.0));
    m
}

/// Per-second counts as points at the middle of each second.
fn points(bins: &BTreeMap<i64, f64>) -> Vec<(f64, f64)> {
    bins.iter().map(|(s, n)| (*s as f64 + 0.5, *n)).collect()
}

fn chart(title: &str, y: &str, series: Vec<Series>) -> Chart {
    Chart {
        title: title.into(),
        x_desc: "time since the run started (s)".into(),
        y_desc: y.into(),
        size: (900, 360),
        series,
    }
}

fn rates_chart(t: &Timeline, markers: &[(f64, String)]) -> Chart {
    let at_zero = markers.iter().map(|m| (m.0, 0.0)).collect();
    let mut marks = Series::new(1, Line::None, Marker::Hollow, at_zero);
    marks.point_labels = markers.iter().map(|m| m.1.clone()).collect();
    chart(
        "TFs issued and ended per second (circles: membership changes and faults)",
        "TFs per second",
        vec![
            Series::new(0, Line::Solid, Marker::None, points(&t.issued)).legend("issued"),
            Series::new(2, Line::Solid, Marker::None, points(&t.completed)).legend("completed"),
            Series::new(1, Line::Dashed, Marker::None, points(&t.lost)).legend("not completed"),
            marks,
        ],
    )
}

fn latency_chart(t: &Timeline) -> Chart {
    let mut p = [Vec::new(), Vec::new(), Vec::new()];
    for (s, (_, v)) in &t.latency {
        let mut v = v.clone();
        v.sort_by(f64::total_cmp);
        for (i, q) in [0.5, 0.99, 1.0].iter().enumerate() {
            if let Some(x) = fanin_report::percentile(&v, *q) {
                p[i].push((*s as f64 + 0.5, x));
            }
        }
    }
    let [p50, p99, max] = p;
    chart(
        "TF latency, issue to acknowledgement, per second of completion",
        "ms",
        vec![
            Series::new(0, Line::Solid, Marker::None, p50).legend("p50"),
            Series::new(4, Line::Solid, Marker::None, p99).legend("p99"),
            Series::new(1, Line::Dotted, Marker::None, max).legend("max"),
        ],
    )
}

/// Completed TFs per second of each EPN drawn, and how many EPNs were not drawn.
fn per_epn_chart(t: &Timeline) -> (Chart, usize) {
    let left_out = t.epns_seen.len().saturating_sub(t.per_epn.len());
    let series = t
        .per_epn
        .iter()
        .map(|(e, bins)| {
            let s = Series::new(*e as usize, Line::Solid, Marker::None, points(bins));
            s.legend(format!("EPN {e}"))
        })
        .collect();
    let c = chart(
        "TFs completed per second, per EPN",
        "TFs per second",
        series,
    );
    (c, left_out)
}

fn free_buffer_chart(loads: &BTreeMap<u32, Vec<(f64, f64)>>) -> Chart {
    let series = loads
        .iter()
        .map(|(e, v)| {
            let s = Series::new(*e as usize, Line::Solid, Marker::Dot, v.clone());
            s.legend(format!("EPN {e}"))
        })
        .collect();
    chart(
        "Free build buffer per EPN (its load reports, one a second)",
        "MiB free",
        series,
    )
}

fn summary_table(s: &serde_json::Value) -> String {
    let u = |k: &str| s[k].as_u64().map_or("?".into(), |v| v.to_string());
    let f = |v: &serde_json::Value| v.as_f64().map_or("?".into(), |x| format!("{x:.2}"));
    let mut rows = vec![
        ("FLPs -> EPNs", format!("{} -> {}", u("flps"), u("epns"))),
        ("policy", esc(s["policy"].as_str().unwrap_or("?"))),
        ("issued", u("issued")),
        ("completed", u("completed")),
        ("incomplete", u("incomplete")),
        ("dropped", u("dropped")),
        ("loss %", f(&s["loss_pct"])),
        ("goodput Gbit/s", f(&s["goodput_gbps"])),
        (
            "latency p50 / p99 / max ms",
            format!(
                "{} / {} / {}",
                f(&s["latency_ms"]["p50"]),
                f(&s["latency_ms"]["p99"]),
                f(&s["latency_ms"]["max"])
            ),
        ),
        ("invariant", esc(&s["invariant_ok"].to_string())),
        ("valid", esc(&s["valid"].to_string())),
    ];
    for key in ["incomplete_by_reason", "dropped_by_reason"] {
        for (reason, n) in s[key].as_object().into_iter().flatten() {
            rows.push((
                key.trim_end_matches("_by_reason"),
                esc(&format!("{n} {reason}")),
            ));
        }
    }
    let body: String = rows
        .iter()
        .map(|(k, v)| format!("<tr><th>{k}</th><td>{v}</td></tr>\n"))
        .collect();
    format!("<table>\n{body}</table>\n")
}

fn marker_table(m: &[(f64, String)]) -> String {
    if m.is_empty() {
        return "<p>No membership changes or faults.</p>\n".into();
    }
    let rows: String = m
        .iter()
        .map(|(t, w)| {
            format!(
                "<tr><td>{t:.3}</td><td style=\"text-align:left\">{}</td></tr>\n",
                esc(w)
            )
        })
        .collect();
    format!("<h2>Membership changes and faults</h2>\n<table><tr><th>s</th><th>what</th></tr>\n{rows}</table>\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_gathered_per_second_and_corrupt_times_left_out() {
        let mut t = Timeline::default();
        for (issue, ack) in [(0.1, 0.2), (0.9, 1.1), (2.5, 2.6), (f64::INFINITY, 1e300)] {
            t.add((issue, ack, 1.0, Some(3), true), 100.0);
        }
        t.add((1.0, 1.5, 0.0, Some(4), false), 100.0);
        assert_eq!(points(&t.issued), [(0.5, 2.0), (1.5, 1.0), (2.5, 1.0)]);
        assert_eq!(points(&t.completed), [(0.5, 1.0), (1.5, 1.0), (2.5, 1.0)]);
        assert_eq!(points(&t.lost), [(1.5, 1.0)]);
        assert_eq!(t.per_epn.keys().collect::<Vec<_>>(), [&3]);
        assert_eq!(esc("<EPN & FLP>"), "&lt;EPN &amp; FLP&gt;");
    }

    #[test]
    fn only_the_lowest_epns_are_drawn_and_the_rest_counted() {
        let mut t = Timeline::default();
        for e in (0..20).rev() {
            t.add((0.0, 0.5, 1.0, Some(e), true), 10.0);
        }
        assert_eq!(t.per_epn.len(), MAX_EPN_LINES);
        assert_eq!(
            *t.per_epn.keys().next_back().unwrap(),
            MAX_EPN_LINES as u32 - 1
        );
        assert_eq!(per_epn_chart(&t).1, 20 - MAX_EPN_LINES);
    }
}
