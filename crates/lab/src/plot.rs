//! SVG plots of experiment tables: TF loss against STF size, one series per FLP count
//! and rate (placed by the load it offers), ours filled and the published values hollow.

use fanin_report::plot::{Chart, Line, Marker, Series};

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::table::RunRow;

/// `fanin plot DIR`: draws `loss.svg` again from a `fanin run` experiment's `table.csv`.
/// A simulation's directory is named as such (`fanin sim` draws its own plots).
pub fn redraw(dir: &Path) -> anyhow::Result<PathBuf> {
    let csv = dir.join("table.csv");
    if !csv.exists() {
        let svgs: Vec<String> = std::fs::read_dir(dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.ends_with(".svg"))
            .collect();
        anyhow::ensure!(
            svgs.is_empty(),
            "{} has no table.csv: it is not a fanin run experiment; its plots ({}) are \
             drawn by whatever made it (fanin sim draws its own)",
            dir.display(),
            svgs.join(", ")
        );
        anyhow::bail!(
            "{}: no table.csv (give a fanin run experiment's results directory)",
            dir.display()
        );
    }
    let text =
        std::fs::read_to_string(&csv).with_context(|| format!("reading {}", csv.display()))?;
    let rows = crate::table::from_csv(&text)?;
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let title = format!("{name}: TF loss vs STF size, per FLP count");
    let out = dir.join("loss.svg");
    fanin_node::icn::summary::write_atomic(&out, &loss_vs_size(&title, &rows))?;
    Ok(out)
}

/// Loss (%) vs STF size, one series per FLP count and rate. The x axis is the load the
/// size offers (FLPs x size x rate, Mbit/s), so series of different FLP counts line up
/// against the link capacity; every point is labelled with its STF size. Rows whose
/// size is not a fixed number are skipped.
pub fn loss_vs_size(title: &str, rows: &[RunRow]) -> String {
    let pts: Vec<(&RunRow, f64)> = rows
        .iter()
        .filter_map(|r| {
            fanin_sched::parse_bytes(&r.stf_size)
                .ok()
                .map(|b| (r, b as f64 * r.flps as f64 * r.rate_hz * 8.0 / 1e6))
        })
        .collect();
    let mut keys: Vec<(u32, f64)> = Vec::new();
    for (r, _) in &pts {
        if !keys.contains(&(r.flps, r.rate_hz)) {
            keys.push((r.flps, r.rate_hz));
        }
    }
    let mut series = Vec::new();
    for (i, &(flps, rate)) in keys.iter().enumerate() {
        let mut mine: Vec<(&RunRow, f64)> = pts
            .iter()
            .filter(|(r, _)| (r.flps, r.rate_hz) == (flps, rate))
            .copied()
            .collect();
        mine.sort_by(|a, b| a.1.total_cmp(&b.1));
        let ours = mine.iter().map(|(r, x)| (*x, r.loss_pct)).collect();
        let mut s = Series::new(i, Line::Solid, Marker::Filled, ours)
            .legend(format!("{flps} FLP(s), {rate} Hz: fanin"));
        s.point_labels = mine.iter().map(|(r, _)| r.stf_size.clone()).collect();
        series.push(s);
        let published: Vec<(f64, f64)> = mine
            .iter()
            .filter_map(|(r, x)| r.published_loss_pct.map(|p| (*x, p)))
            .collect();
        if !published.is_empty() {
            let p = Series::new(i, Line::Dashed, Marker::Hollow, published)
                .legend(format!("{flps} FLP(s), {rate} Hz: published"));
            series.push(p);
        }
    }
    Chart {
        title: title.to_string(),
        x_desc: "offered load: FLPs x STF size x rate (Mbit/s); labels: STF size (B)".into(),
        y_desc: "TF loss (%)".into(),
        size: (900, 480),
        series,
    }
    .svg()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(flps: u32, size: &str, loss: f64, published: Option<f64>) -> RunRow {
        RunRow {
            label: size.into(),
            flps,
            epns: 6,
            stf_size: size.into(),
            rate_hz: 200.0,
            policy: "round-robin".into(),
            runs: 1,
            issued: 100.0,
            completed: 100.0,
            lost: 0.0,
            loss_pct: loss,
            incomplete: 0.0,
            dropped: 0.0,
            split: 0.0,
            goodput_gbps: 0.0,
            p50: 0.0,
            p99: 0.0,
            max: 0.0,
            valid: 1,
            invariant_ok: true,
            published_loss_pct: published,
            faults: None,
            published_mb_s: None,
        }
    }

    #[test]
    fn one_series_per_flp_count_with_published_points() {
        let rows = vec![
            row(1, "58000", 0.0, Some(0.03)),
            row(1, "59500", 0.5, Some(1.99)),
            row(2, "29000", 0.0, Some(2.47)),
            row(2, "uniform(1,2)", 0.0, None),
        ];
        let svg = loss_vs_size("t <1>", &rows);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("t &lt;1&gt;"));
        for legend in ["1 FLP(s), 200 Hz: fanin", "2 FLP(s), 200 Hz: published"] {
            assert!(svg.contains(legend), "{legend}");
        }
        assert!(svg.contains("59500"), "points carry their STF size");
        assert!(!svg.contains("uniform(1,2)"), "only fixed sizes are placed");
    }
}
