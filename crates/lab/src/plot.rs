//! SVG plots of experiment tables: TF loss against STF size, one series per FLP count
//! and rate (placed by the load it offers), ours filled and the published values hollow.

use std::fmt::Write as _;

use crate::table::RunRow;

const COLORS: &[&str] = &[
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
];

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
    let mut series: Vec<(u32, f64)> = Vec::new();
    for (r, _) in &pts {
        if !series.contains(&(r.flps, r.rate_hz)) {
            series.push((r.flps, r.rate_hz));
        }
    }
    let (w, h, ml, mr, mt, mb) = (760.0, 440.0, 70.0, 220.0, 40.0, 50.0);
    let (pw, ph) = (w - ml - mr, h - mt - mb);
    let xmin = pts.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let xmax = pts.iter().map(|p| p.1).fold(0.0, f64::max);
    let (xmin, xmax) = if xmax > xmin {
        (xmin * 0.95, xmax * 1.05)
    } else {
        (xmin * 0.5, xmin * 1.5 + 1.0)
    };
    let ymax = pts
        .iter()
        .flat_map(|(r, _)| [Some(r.loss_pct), r.published_loss_pct])
        .flatten()
        .fold(1.0, f64::max)
        * 1.1;
    let x = |v: f64| ml + (v - xmin) / (xmax - xmin) * pw;
    let y = |v: f64| mt + ph - v / ymax * ph;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">{}</text>",
        ml + pw / 2.0,
        escape(title)
    );
    let _ = writeln!(
        s,
        "<rect x=\"{ml}\" y=\"{mt}\" width=\"{pw}\" height=\"{ph}\" fill=\"none\" stroke=\"black\"/>"
    );
    for i in 0..=5 {
        let v = ymax * i as f64 / 5.0;
        let (x2, yy, tx, ty) = (ml + pw, y(v), ml - 6.0, y(v) + 4.0);
        let _ = writeln!(
            s,
            "<line x1=\"{ml}\" x2=\"{x2}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\" stroke=\"#ddd\"/><text x=\"{tx}\" y=\"{ty:.1}\" text-anchor=\"end\">{v:.2}</text>"
        );
        let xv = xmin + (xmax - xmin) * i as f64 / 5.0;
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{:.0}</text>",
            x(xv),
            mt + ph + 18.0,
            xv
        );
    }
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">offered load: FLPs x STF size x rate (Mbit/s); labels: STF size (B)</text><text x=\"18\" y=\"{}\" transform=\"rotate(-90 18 {2})\" text-anchor=\"middle\">TF loss (%)</text>",
        ml + pw / 2.0,
        h - 10.0,
        mt + ph / 2.0
    );
    for (i, &(flps, rate)) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let mut mine: Vec<(f64, f64)> = Vec::new();
        let mut publ: Vec<(f64, f64)> = Vec::new();
        for (r, b) in pts
            .iter()
            .filter(|(r, _)| (r.flps, r.rate_hz) == (flps, rate))
        {
            mine.push((x(*b), y(r.loss_pct)));
            if let Some(p) = r.published_loss_pct {
                publ.push((x(*b), y(p)));
            }
        }
        mine.sort_by(|a, b| a.0.total_cmp(&b.0));
        publ.sort_by(|a, b| a.0.total_cmp(&b.0));
        let line = |v: &[(f64, f64)]| {
            v.iter()
                .map(|(a, b)| format!("{a:.1},{b:.1}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let _ = writeln!(
            s,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{c}\" stroke-width=\"2\"/>",
            line(&mine)
        );
        for (a, b) in &mine {
            let _ = writeln!(
                s,
                "<circle cx=\"{a:.1}\" cy=\"{b:.1}\" r=\"4\" fill=\"{c}\"/>"
            );
        }
        for (r, load) in pts
            .iter()
            .filter(|(r, _)| (r.flps, r.rate_hz) == (flps, rate))
        {
            let (lx, ly) = (x(*load) + 4.0, y(r.loss_pct) - 6.0);
            let _ = writeln!(
                s,
                "<text x=\"{lx:.1}\" y=\"{ly:.1}\" font-size=\"9\" fill=\"{c}\" transform=\"rotate(-60 {lx:.1} {ly:.1})\">{}</text>",
                escape(&r.stf_size)
            );
        }
        if !publ.is_empty() {
            let _ = writeln!(
                s,
                "<polyline points=\"{}\" fill=\"none\" stroke=\"{c}\" stroke-dasharray=\"5,4\"/>",
                line(&publ)
            );
            for (a, b) in &publ {
                let _ = writeln!(
                    s,
                    "<circle cx=\"{a:.1}\" cy=\"{b:.1}\" r=\"4\" fill=\"white\" stroke=\"{c}\"/>"
                );
            }
        }
        let ly = mt + 10.0 + 36.0 * i as f64;
        let lx = ml + pw + 16.0;
        let _ = writeln!(
            s,
            "<circle cx=\"{lx}\" cy=\"{ly}\" r=\"4\" fill=\"{c}\"/><text x=\"{}\" y=\"{}\">{flps} FLP(s), {rate} Hz: fanin</text>",
            lx + 10.0,
            ly + 4.0
        );
        if !publ.is_empty() {
            let _ = writeln!(
                s,
                "<circle cx=\"{lx}\" cy=\"{}\" r=\"4\" fill=\"white\" stroke=\"{c}\"/><text x=\"{}\" y=\"{}\">published (dashed)</text>",
                ly + 16.0,
                lx + 10.0,
                ly + 20.0
            );
        }
    }
    s.push_str("</svg>\n");
    s
}

fn escape(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
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
        assert_eq!(svg.matches("stroke-width=\"2\"").count(), 2, "two series");
        assert_eq!(
            svg.matches("stroke-dasharray").count(),
            2,
            "published lines"
        );
        assert!(svg.contains("t &lt;1&gt;"));
        assert!(svg.contains("2 FLP(s), 200 Hz: fanin"));
    }
}
