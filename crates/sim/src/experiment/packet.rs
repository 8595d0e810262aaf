//! Simulation experiments: loading `[sim]` + `[[run]]` files, running each run, and the
//! outputs: summary.json, slices.csv, a delay-per-slice SVG, and the comparison table.

use std::fmt::Write as _;
use std::path::Path;

use crate::world::NEVER;
use crate::{SimConfig, SimSummary, Transport};
use anyhow::Context;
use fanin_report::plot::{Chart, Line, Marker, Series};
use toml::Value;

#[derive(Debug, Clone)]
pub struct Run {
    pub label: String,
    pub cfg: SimConfig,
    /// Published figures from the thesis, shown beside ours (text, as printed there).
    pub published: Published,
}

#[derive(Debug, Clone, Default)]
pub struct Published {
    pub avg: Option<String>,
    pub p99: Option<String>,
    pub max: Option<String>,
    pub retrans: Option<String>,
    pub loss: Option<String>,
}

pub struct SimExperiment {
    pub name: String,
    pub runs: Vec<Run>,
}

const META: &[&str] = &[
    "label",
    "published_avg_s",
    "published_p99_s",
    "published_max_s",
    "published_retrans_pct",
    "published_loss_pct",
];

pub fn single(cfg: SimConfig) -> SimExperiment {
    SimExperiment {
        name: "single".into(),
        runs: vec![Run {
            label: "run".into(),
            cfg,
            published: Published::default(),
        }],
    }
}

fn text(v: Option<&Value>) -> Option<String> {
    v.map(|v| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    })
}

pub fn load(path: &Path) -> anyhow::Result<SimExperiment> {
    let (doc, origin) =
        fanin_report::doc::read_doc(path, &["model", "name", "description", "sim", "run"])?;
    let name = doc
        .get("name")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| {
            path.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "sim".into())
        });
    let base = super::base_table(&doc, "sim", &origin)?;
    let rows = fanin_report::doc::rows_over(&doc, "run", &base, META, &origin)?;
    let mut runs = Vec::new();
    for r in rows {
        let (label, row, t) = (r.label, r.raw, r.merged);
        let cfg: SimConfig = Value::Table(t)
            .try_into()
            .with_context(|| format!("experiment {origin}: run {label}"))?;
        let cfg = cfg
            .resolve()
            .map_err(|e| anyhow::anyhow!("experiment {origin}: run {label}: {e}"))?;
        runs.push(Run {
            label,
            cfg,
            published: Published {
                avg: text(row.get("published_avg_s")),
                p99: text(row.get("published_p99_s")),
                max: text(row.get("published_max_s")),
                retrans: text(row.get("published_retrans_pct")),
                loss: text(row.get("published_loss_pct")),
            },
        });
    }
    Ok(SimExperiment { name, runs })
}

/// Runs one simulation and writes its files into `dir`.
pub fn run_one(r: &Run, dir: &Path, fragments_csv: bool) -> anyhow::Result<SimSummary> {
    let w = crate::simulate(r.cfg.clone()).map_err(|e| anyhow::anyhow!("run {}: {e}", r.label))?;
    let s = SimSummary::of(&w);
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("config.toml"), toml::to_string(&r.cfg)?)?;
    std::fs::write(
        dir.join("summary.json"),
        serde_json::to_string_pretty(&s)? + "\n",
    )?;
    std::fs::write(dir.join("summary.txt"), s.line() + "\n")?;
    std::fs::write(dir.join("slices.csv"), slices_csv(&w))?;
    if fragments_csv {
        write_fragments(&w, &dir.join("fragments.csv"))?;
    }
    std::fs::write(dir.join("delay.svg"), delay_plot(&w, &r.label))?;
    Ok(s)
}

/// slices.csv: per slice, its PC, the fragments produced and arrived, the largest
/// network delay, and whether it is complete.
fn slices_csv(w: &crate::World) -> String {
    // Per slice: fragments produced, arrived, the largest network delay, its PC.
    let mut rows = vec![(0u64, 0u64, 0u64, 0u32); w.slices() as usize];
    for f in &w.frags {
        let row = &mut rows[f.slice as usize];
        row.3 = f.dst;
        if f.suppressed {
            continue;
        }
        row.0 += 1; // produced: it must arrive, sent or not
        if f.arrived != NEVER {
            row.1 += 1;
            row.2 = row.2.max(f.arrived - f.sent);
        }
    }
    let mut csv = String::from("slice,pc,fragments,fragments_arrived,max_delay_s,complete\n");
    for (i, (sent, arrived, max, pc)) in rows.iter().enumerate() {
        let _ = writeln!(
            csv,
            "{i},{pc},{sent},{arrived},{:.6},{}",
            *max as f64 / 1e9,
            sent == arrived
        );
    }
    csv
}

/// fragments.csv: one row per fragment (large at full scale, so streamed to `path`).
fn write_fragments(w: &crate::World, path: &Path) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(
        out,
        "slice,sender,pc,bytes,suppressed,sent_s,arrived_s,delay_s,retransmitted_segments,lost"
    )?;
    let t = |v: u64| {
        if v == NEVER {
            String::new()
        } else {
            format!("{:.9}", v as f64 / 1e9)
        }
    };
    for f in &w.frags {
        let delay = if f.sent != NEVER && f.arrived != NEVER {
            t(f.arrived - f.sent)
        } else {
            String::new()
        };
        writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{}",
            f.slice,
            f.sender,
            f.dst,
            f.bytes,
            f.suppressed,
            t(f.sent),
            t(f.arrived),
            delay,
            f.retx,
            !f.suppressed && f.arrived == NEVER
        )?;
    }
    out.flush()?;
    Ok(())
}

/// Network delay of every fragment against its slice, like the thesis's Figures 4.1-4.2.
fn delay_plot(w: &crate::World, title: &str) -> String {
    let pts: Vec<(f64, f64)> = w
        .frags
        .iter()
        .filter(|f| !f.suppressed && f.sent != NEVER && f.arrived != NEVER)
        .map(|f| (f.slice as f64, (f.arrived - f.sent) as f64 / 1e9))
        .collect();
    // At most about 40 000 points: the picture, not every fragment.
    let step = (pts.len() / 40_000).max(1);
    let pts = pts.into_iter().step_by(step).collect();
    Chart {
        title: format!("Network delay per fragment: {title}"),
        x_desc: "time slice".into(),
        y_desc: "delay (s)".into(),
        size: (900, 420),
        series: vec![Series::new(0, Line::None, Marker::Dot, pts)],
    }
    .svg()
}

fn p(v: &Option<String>) -> String {
    v.clone().unwrap_or_else(|| "-".into())
}

pub fn table(rows: &[(Run, SimSummary)]) -> String {
    let udp = rows.iter().all(|(r, _)| r.cfg.transport == Transport::Udp);
    let mut cells: Vec<Vec<String>> = Vec::new();
    if udp {
        cells.push(
            [
                "model",
                "max delay (s)",
                "published",
                "data loss (%)",
                "published",
                "TFs complete",
                "incomplete",
            ]
            .map(String::from)
            .to_vec(),
        );
    } else {
        cells.push(
            [
                "model",
                "avg delay (s)",
                "published",
                "99% delay (s)",
                "published",
                "max delay (s)",
                "published",
                "retrans (%)",
                "published",
                "TFs complete",
                "incomplete",
            ]
            .map(String::from)
            .to_vec(),
        );
    }
    for (r, s) in rows {
        let mut c = vec![r.label.clone()];
        if udp {
            c.extend([
                format!("{:.3}", s.delay_max_s),
                p(&r.published.max),
                format!("{:.2}", s.loss_pct),
                p(&r.published.loss),
            ]);
        } else {
            c.extend([
                format!("{:.3}", s.delay_avg_s),
                p(&r.published.avg),
                format!("{:.3}", s.delay_p99_s),
                p(&r.published.p99),
                format!("{:.3}", s.delay_max_s),
                p(&r.published.max),
                format!("{:.2}", s.retrans_pct),
                p(&r.published.retrans),
            ]);
        }
        c.push(s.tfs_complete.to_string());
        c.push(s.tfs_incomplete.to_string());
        cells.push(c);
    }
    fanin_report::align(&cells)
}

/// The event-building view of the same runs: TF latency from the end of the slice,
/// goodput, and how the network coped (timeouts, packets dropped).
pub fn building_table(rows: &[(Run, SimSummary)]) -> String {
    let mut cells = vec![[
        "model",
        "scheme",
        "loss (%)",
        "TF latency p50 (s)",
        "p99 (s)",
        "max (s)",
        "goodput (Mbit/s)",
        "TCP timeouts",
        "packets dropped",
    ]
    .map(String::from)
    .to_vec()];
    for (r, s) in rows {
        cells.push(vec![
            r.label.clone(),
            s.scheme.clone(),
            format!("{:.2}", s.loss_pct),
            format!("{:.4}", s.tf_latency_p50_s),
            format!("{:.4}", s.tf_latency_p99_s),
            format!("{:.4}", s.tf_latency_max_s),
            format!("{:.1}", s.goodput_mbps),
            s.tcp_timeouts.to_string(),
            s.packets_dropped.to_string(),
        ]);
    }
    fanin_report::align(&cells)
}

pub fn csv(rows: &[(Run, SimSummary)]) -> String {
    let mut out = String::from("label,lcms,pcs,transport,scheme,bio,slices,fragments_sent,fragments_arrived,loss_pct,delay_avg_s,delay_p99_s,delay_max_s,retrans_pct,tfs_complete,tfs_incomplete,published_avg_s,published_p99_s,published_max_s,published_retrans_pct,published_loss_pct,tf_latency_p50_s,tf_latency_p99_s,tf_latency_max_s,goodput_mbps\n");
    for (r, s) in rows {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{:.4},{:.6},{:.6},{:.6},{:.4},{},{},{},{},{},{},{},{:.6},{:.6},{:.6},{:.3}",
            fanin_report::csv_quoted(&r.label),
            s.lcms,
            s.pcs,
            s.transport,
            s.scheme,
            s.bio,
            s.slices,
            s.fragments_sent,
            s.fragments_arrived,
            s.loss_pct,
            s.delay_avg_s,
            s.delay_p99_s,
            s.delay_max_s,
            s.retrans_pct,
            s.tfs_complete,
            s.tfs_incomplete,
            p(&r.published.avg),
            p(&r.published.p99),
            p(&r.published.max),
            p(&r.published.retrans),
            p(&r.published.loss),
            s.tf_latency_p50_s,
            s.tf_latency_p99_s,
            s.tf_latency_max_s,
            s.goodput_mbps
        );
    }
    out
}

/// Runs every run of a (resolved) packet-model experiment: one directory per run, the
/// table beside the published values, `table.txt` and `table.csv`.
pub fn run_experiment(
    exp: &SimExperiment,
    results: &Path,
    fragments_csv: bool,
) -> anyhow::Result<()> {
    let root = fanin_report::experiment_root(results, "sim", &exp.name)?;
    println!(
        "fanin sim: {:?}, {} run(s); results in {}",
        exp.name,
        exp.runs.len(),
        root.display()
    );
    let mut done: Vec<(Run, SimSummary)> = Vec::new();
    for r in &exp.runs {
        let dir = fanin_report::row_dir(&root, &r.label);
        let s = run_one(r, &dir, fragments_csv)?;
        println!("[{}] {}", r.label, s.line());
        done.push((r.clone(), s));
    }
    let table = table(&done) + "\n" + &building_table(&done);
    println!("\n{table}");
    std::fs::write(root.join("table.txt"), &table)?;
    std::fs::write(root.join("table.csv"), csv(&done))?;
    println!("results: {}", root.display());
    anyhow::ensure!(
        done.iter().all(|(_, s)| s.invariant_ok),
        "accounting invariant violated"
    );
    Ok(())
}
