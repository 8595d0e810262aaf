//! `report.html` of one run: one self-contained page (inline SVG, no scripts) with TF
//! issue and completion rates, latency percentiles, per-EPN load and free buffer over
//! time, and the run's membership changes and faults marked on the time axis.
//!
//! Read from the run's `summary.json`, `tfs.csv`, `loads.csv` and `faults.json`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use fanin_report::plot::{Chart, Line, Marker, Series};

/// EPNs drawn one line each; beyond, the page says how many were left out.
const MAX_EPN_LINES: usize = 8;

/// One `tfs.csv` row: (issue s, ack s, latency ms, EPN, completed).
type TfPoint = (f64, f64, f64, Option<u32>, bool);

/// Writes `dir/report.html`; its path.
pub fn write(dir: &Path) -> anyhow::Result<PathBuf> {
    let summary: serde_json::Value = read_json(&dir.join("summary.json"))?;
    let tfs = read_tfs(&dir.join("tfs.csv"))?;
    let loads = read_loads(&dir.join("loads.csv"));
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
    let out = dir.join("report.html");
    std::fs::write(&out, html).with_context(|| format!("writing {}", out.display()))?;
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

/// Every readable `tfs.csv` row (a crashed ICN may leave half a line).
fn read_tfs(p: &Path) -> anyhow::Result<Vec<TfPoint>> {
    let t = std::fs::read_to_string(p).with_context(|| format!("{}", p.display()))?;
    Ok(t.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            let epn = f.get(1)?.parse().ok();
            let (issue, ack, lat) = (
                f.get(2)?.parse().ok()?,
                f.get(3)?.parse().ok()?,
                f.get(4)?.parse().ok()?,
            );
            Some((issue, ack, lat, epn, *f.get(5)? == "complete"))
        })
        .collect())
}

/// (time s, EPN, free bytes) of `loads.csv`; empty if there is none (older runs).
fn read_loads(p: &Path) -> Vec<(f64, u32, u64)> {
    let t = std::fs::read_to_string(p).unwrap_or_default();
    t.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            Some((
                f.first()?.parse().ok()?,
                f.get(1)?.parse().ok()?,
                f.get(2)?.parse().ok()?,
            ))
        })
        .collect()
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

/// Counts per whole second of `times`.
fn per_second(times: impl Iterator<Item = f64>) -> Vec<(f64, f64)> {
    let mut bins: BTreeMap<i64, f64> = BTreeMap::new();
    for t in times.filter(|t| t.is_finite() && *t >= 0.0) {
        *bins.entry(t.floor() as i64).or_default() += 1.0;
    }
    bins.into_iter().map(|(s, n)| (s as f64 + 0.5, n)).collect()
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

fn rates_chart(tfs: &[TfPoint], markers: &[(f64, String)]) -> Chart {
    let issued = per_second(tfs.iter().map(|t| t.0));
    let completed = per_second(tfs.iter().filter(|t| t.4).map(|t| t.1));
    let lost = per_second(tfs.iter().filter(|t| !t.4).map(|t| t.1));
    let mut marks = Series::new(
        1,
        Line::None,
        Marker::Hollow,
        markers.iter().map(|m| (m.0, 0.0)).collect(),
    );
    marks.point_labels = markers.iter().map(|m| m.1.clone()).collect();
    chart(
        "TFs issued and ended per second (circles: membership changes and faults)",
        "TFs per second",
        vec![
            Series::new(0, Line::Solid, Marker::None, issued).legend("issued"),
            Series::new(2, Line::Solid, Marker::None, completed).legend("completed"),
            Series::new(1, Line::Dashed, Marker::None, lost).legend("not completed"),
            marks,
        ],
    )
}

fn latency_chart(tfs: &[TfPoint]) -> Chart {
    let mut bins: BTreeMap<i64, Vec<f64>> = BTreeMap::new();
    for t in tfs.iter().filter(|t| t.4 && t.1 >= 0.0) {
        bins.entry(t.1.floor() as i64).or_default().push(t.2);
    }
    let mut p = [Vec::new(), Vec::new(), Vec::new()];
    for (s, mut v) in bins {
        v.sort_by(f64::total_cmp);
        for (i, q) in [0.5, 0.99, 1.0].iter().enumerate() {
            if let Some(x) = fanin_report::percentile(&v, *q) {
                p[i].push((s as f64 + 0.5, x));
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

/// Completed TFs per second of each EPN (the first `MAX_EPN_LINES`), and how many more.
fn per_epn_chart(tfs: &[TfPoint]) -> (Chart, usize) {
    let mut by: BTreeMap<u32, Vec<f64>> = BTreeMap::new();
    for t in tfs.iter().filter(|t| t.4) {
        if let Some(e) = t.3 {
            by.entry(e).or_default().push(t.1);
        }
    }
    let left_out = by.len().saturating_sub(MAX_EPN_LINES);
    let series = by
        .into_iter()
        .take(MAX_EPN_LINES)
        .map(|(e, v)| {
            Series::new(
                e as usize,
                Line::Solid,
                Marker::None,
                per_second(v.into_iter()),
            )
            .legend(format!("EPN {e}"))
        })
        .collect();
    (
        chart(
            "TFs completed per second, per EPN",
            "TFs per second",
            series,
        ),
        left_out,
    )
}

fn free_buffer_chart(loads: &[(f64, u32, u64)]) -> Chart {
    let mut by: BTreeMap<u32, Vec<(f64, f64)>> = BTreeMap::new();
    for (t, e, free) in loads {
        by.entry(*e)
            .or_default()
            .push((*t, *free as f64 / (1 << 20) as f64));
    }
    let series = by
        .into_iter()
        .take(MAX_EPN_LINES)
        .map(|(e, v)| {
            Series::new(e as usize, Line::Solid, Marker::Dot, v).legend(format!("EPN {e}"))
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
        ("invariant", s["invariant_ok"].to_string()),
        ("valid", s["valid"].to_string()),
    ];
    for key in ["incomplete_by_reason", "dropped_by_reason"] {
        for (reason, n) in s[key].as_object().into_iter().flatten() {
            rows.push((
                key.trim_end_matches("_by_reason"),
                format!("{n} {}", esc(reason)),
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
    fn seconds_are_binned_and_text_is_escaped() {
        assert_eq!(
            per_second([0.1, 0.9, 2.5].into_iter()),
            [(0.5, 2.0), (2.5, 1.0)]
        );
        assert_eq!(esc("<EPN & FLP>"), "&lt;EPN &amp; FLP&gt;");
    }
}
