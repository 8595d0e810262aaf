//! `fanin sim` on a fat-tree experiment file (`[fabric]` + `[[scenario]]`): runs every
//! scenario over its seeds and prints seed 002's Tables 5.1-5.4 beside ours, with plots.

use std::fmt::Write as _;
use std::path::Path;

use crate::fabric::{run, FabricConfig, FabricRun};
use anyhow::{bail, Context};
use fanin_report::plot::{Chart, Line, Marker, Series};
use toml::Value;

/// The four published columns of a thesis table, one value per 10 s sample.
#[derive(Debug, Clone, Default)]
pub struct Published {
    pub table: Option<String>,
    pub cols: [Option<Vec<f64>>; 4],
}

#[derive(Debug, Clone)]
pub struct Scenario {
    pub label: String,
    pub cfg: FabricConfig,
    pub published: Published,
}

pub struct FabricExperiment {
    pub name: String,
    pub repetitions: u32,
    pub scenarios: Vec<Scenario>,
}

const COLS: [&str; 4] = ["level_rx", "level_tx", "bb_rx", "bb_tx"];
const META: &[&str] = &[
    "label",
    "table",
    "published_level_rx",
    "published_level_tx",
    "published_bb_rx",
    "published_bb_tx",
];

pub fn load(path: &Path) -> anyhow::Result<FabricExperiment> {
    let (doc, origin) = fanin_report::doc::read_doc(
        path,
        &[
            "model",
            "name",
            "description",
            "repetitions",
            "fabric",
            "scenario",
        ],
    )?;
    let name = super::name_of(&doc, "fabric");
    let repetitions = match doc.get("repetitions") {
        None => 1,
        Some(Value::Integer(n)) if (1..=1000).contains(n) => *n as u32,
        Some(v) => bail!("experiment {origin}: repetitions = {v}: a whole number from 1 to 1000"),
    };
    let base = super::base_table(&doc, "fabric", &origin)?;
    let rows = fanin_report::doc::rows_over(&doc, "scenario", &base, META, &origin)?;
    let mut scenarios = Vec::new();
    for r in rows {
        let (label, row, t) = (r.label, r.raw, r.merged);
        let cfg: FabricConfig = Value::Table(t)
            .try_into()
            .with_context(|| format!("experiment {origin}: scenario {label}"))?;
        cfg.check()
            .map_err(|e| anyhow::anyhow!("experiment {origin}: scenario {label}: {e}"))?;
        let mut published = Published {
            table: row.get("table").and_then(Value::as_str).map(str::to_string),
            ..Published::default()
        };
        for (c, col) in COLS.iter().enumerate() {
            if let Some(v) = row.get(&format!("published_{col}")) {
                let arr = v
                    .as_array()
                    .and_then(|a| a.iter().map(Value::as_float).collect::<Option<Vec<f64>>>())
                    .with_context(|| {
                        format!("experiment {origin}: scenario {label}: published_{col} must be an array of numbers")
                    })?;
                published.cols[c] = Some(arr);
            }
        }
        scenarios.push(Scenario {
            label,
            cfg,
            published,
        });
    }
    Ok(FabricExperiment {
        name,
        repetitions,
        scenarios,
    })
}

/// Means over seeds per sample time; levels average over the seeds where they exist.
pub struct Mean {
    pub t: Vec<f64>,
    pub cols: [Vec<f64>; 4],
}

fn mean(runs: &[FabricRun]) -> Mean {
    let n = runs.iter().map(|r| r.samples.len()).min().unwrap_or(0);
    let t = runs[0].samples[..n].iter().map(|s| s.t).collect();
    let pick = |c: usize, i: usize| -> f64 {
        let v: Vec<f64> = runs
            .iter()
            .map(|r| {
                let s = &r.samples[i];
                [s.level_rx, s.level_tx, s.bb_rx, s.bb_tx][c]
            })
            .filter(|v| !v.is_nan())
            .collect();
        if v.is_empty() {
            f64::NAN
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    let cols = std::array::from_fn(|c| (0..n).map(|i| pick(c, i)).collect());
    Mean { t, cols }
}

fn num(v: f64, digits: usize) -> String {
    if v.is_nan() {
        "-".into()
    } else {
        format!("{v:.digits$}")
    }
}

/// One thesis-shaped table: time, then for each metric ours beside the published value.
pub fn table(s: &Scenario, m: &Mean, seeds: u32) -> String {
    let mut cells = vec![vec![
        "time (s)".to_string(),
        "CLLBL RX".into(),
        "published".into(),
        "CLLBL TX".into(),
        "published".into(),
        "BB RX".into(),
        "published".into(),
        "BB TX".into(),
        "published".into(),
    ]];
    for (i, t) in m.t.iter().enumerate() {
        let mut row = vec![format!("{t:.0}")];
        for c in 0..4 {
            let d = if c < 2 { 5 } else { 7 };
            row.push(num(m.cols[c][i], d));
            row.push(
                s.published.cols[c]
                    .as_ref()
                    .and_then(|p| p.get(i))
                    .map_or("-".into(), |v| num(*v, d)),
            );
        }
        cells.push(row);
    }
    let title = match &s.published.table {
        Some(tb) => format!("Table {tb} - {} (mean of {seeds} seeds)", s.label),
        None => format!("{} (mean of {seeds} seeds; not in the thesis)", s.label),
    };
    format!("{title}\n{}", fanin_report::align(&cells))
}

fn csv_mean(m: &Mean) -> String {
    let mut s = String::from("time_s,level_rx,level_tx,bb_rx,bb_tx\n");
    for (i, t) in m.t.iter().enumerate() {
        let f = |v: f64| {
            if v.is_nan() {
                String::new()
            } else {
                format!("{v:.7}")
            }
        };
        let _ = writeln!(
            s,
            "{t},{},{},{},{}",
            f(m.cols[0][i]),
            f(m.cols[1][i]),
            f(m.cols[2][i]),
            f(m.cols[3][i])
        );
    }
    s
}

/// A line chart of one metric over time for several scenarios, like the thesis's
/// Charts 1-4: solid RX, dashed TX, dotted the published RX values.
pub fn chart(title: &str, metric: usize, rows: &[(&Scenario, &Mean)]) -> String {
    let mut series = Vec::new();
    for (i, (sc, m)) in rows.iter().enumerate() {
        let over_time = |v: &[f64]| m.t.iter().copied().zip(v.iter().copied()).collect();
        for (c, line, tag) in [
            (metric, Line::Solid, "RX"),
            (metric + 1, Line::Dashed, "TX"),
        ] {
            let s = Series::new(i, line, Marker::None, over_time(&m.cols[c]));
            series.push(s.legend(format!("{} {tag}", sc.label)));
        }
        if let Some(p) = &sc.published.cols[metric] {
            let mut s = Series::new(i, Line::Dotted, Marker::None, over_time(p));
            s.width = 1;
            series.push(s.legend(format!("{} RX (thesis)", sc.label)));
        }
    }
    Chart {
        title: title.to_string(),
        x_desc: "time (s)".into(),
        y_desc: String::new(),
        size: (1000, 460),
        series,
    }
    .svg()
}

/// The runs of one scenario, seeds `base..base + repetitions` (default base: its own).
fn simulate(
    sc: &Scenario,
    repetitions: u32,
    base: Option<u64>,
) -> anyhow::Result<Vec<(FabricConfig, FabricRun)>> {
    let base = base.unwrap_or(sc.cfg.seed);
    (0..repetitions)
        .map(|r| {
            let mut cfg = sc.cfg.clone();
            cfg.seed = base + r as u64;
            let out = run(&cfg).map_err(|e| anyhow::anyhow!("scenario {}: {e}", sc.label))?;
            Ok((cfg, out))
        })
        .collect()
}

/// Every scenario of the file, nothing written or printed (`fanin bench flow`): the
/// number of runs.
pub fn simulate_file(path: &Path) -> anyhow::Result<usize> {
    let exp = load(path)?;
    let mut n = 0;
    for sc in &exp.scenarios {
        n += simulate(sc, exp.repetitions, None)?.len();
    }
    Ok(n)
}

/// One scenario over its seeds, written to `dir`: its config, one CSV per seed, the
/// mean and its table. The mean and the table.
fn run_scenario(
    sc: &Scenario,
    dir: &Path,
    repetitions: u32,
    seed: Option<u64>,
) -> anyhow::Result<(Mean, String)> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("config.toml"), toml::to_string(&sc.cfg)?)?;
    let mut runs = Vec::new();
    for (cfg, out) in simulate(sc, repetitions, seed)? {
        std::fs::write(dir.join(format!("seed-{:02}.csv", cfg.seed)), out.csv())?;
        runs.push(out);
    }
    let m = mean(&runs);
    std::fs::write(dir.join("mean.csv"), csv_mean(&m))?;
    let t = table(sc, &m, repetitions);
    std::fs::write(dir.join("table.txt"), &t)?;
    println!(
        "[{}] {} seeds, {} Hedera moves per run on average",
        sc.label,
        runs.len(),
        runs.iter().map(|r| r.moves).sum::<u64>() / runs.len() as u64
    );
    Ok((m, t))
}

/// Charts like the thesis's 1-4: per pattern, the level and the bisection bandwidth.
fn charts(scenarios: &[Scenario], means: &[Mean], root: &Path) -> anyhow::Result<()> {
    let mut patterns: Vec<String> = scenarios.iter().map(|s| s.cfg.pattern.clone()).collect();
    patterns.sort();
    patterns.dedup();
    for p in &patterns {
        let rows: Vec<(&Scenario, &Mean)> = scenarios
            .iter()
            .zip(means)
            .filter(|(s, _)| &s.cfg.pattern == p)
            .collect();
        let slug = fanin_report::sanitize(p);
        std::fs::write(
            root.join(format!("level-{slug}.svg")),
            chart(&format!("Core Link Load Balancing Level, {p}"), 0, &rows),
        )?;
        std::fs::write(
            root.join(format!("bisection-{slug}.svg")),
            chart(&format!("Bisection Bandwidth, {p}"), 2, &rows),
        )?;
    }
    Ok(())
}

/// Every scenario's last seed (its own or `seed`, plus its repetitions) is a seed a run
/// takes, so no repetition fails after the first ran.
pub fn check_seeds(exp: &FabricExperiment, seed: Option<u64>) -> anyhow::Result<()> {
    for sc in &exp.scenarios {
        let base = seed.unwrap_or(sc.cfg.seed);
        let last = base.saturating_add(u64::from(exp.repetitions) - 1);
        anyhow::ensure!(
            last <= crate::MAX_SEED,
            "scenario {}: seed {base} and {} repetitions go past the largest seed {}",
            sc.label,
            exp.repetitions,
            crate::MAX_SEED
        );
    }
    Ok(())
}

/// Runs the experiment: every scenario for seeds base..base+repetitions.
pub fn run_file(
    path: &Path,
    results: &Path,
    only: &[String],
    seed: Option<u64>,
) -> anyhow::Result<()> {
    let mut exp = load(path)?;
    super::keep_only(&mut exp.scenarios, only, |s| &s.label)?;
    check_seeds(&exp, seed)?;
    let root = fanin_report::experiment_root(results, "sim", &exp.name)?;
    println!(
        "fanin sim: {:?}, {} scenario(s) x {} seed(s); results in {}",
        exp.name,
        exp.scenarios.len(),
        exp.repetitions,
        root.display()
    );
    let mut means = Vec::new();
    let mut all_tables = String::new();
    let wall = std::time::Instant::now();
    for sc in &exp.scenarios {
        let dir = root.join(fanin_report::sanitize(&sc.label));
        let (m, t) = run_scenario(sc, &dir, exp.repetitions, seed)?;
        let _ = writeln!(all_tables, "{t}");
        means.push(m);
    }
    println!("\n{all_tables}");
    std::fs::write(root.join("table.txt"), &all_tables)?;
    charts(&exp.scenarios, &means, &root)?;
    println!(
        "results: {} ({:.1} s wall)",
        root.display(),
        wall.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Row `label`'s build configuration, checked (its policy is set per run).
/// Every row's config, each checked, in order: a bad last row fails before any runs.
pub(super) fn build_configs(
    rows: &[fanin_report::doc::Row],
    origin: &str,
) -> anyhow::Result<Vec<crate::fabric::build::BuildConfig>> {
    rows.iter()
        .map(|r| build_config(&r.label, &r.merged, origin))
        .collect()
}

fn build_config(
    label: &str,
    t: &toml::Table,
    origin: &str,
) -> anyhow::Result<crate::fabric::build::BuildConfig> {
    let cfg: crate::fabric::build::BuildConfig = Value::Table(t.clone())
        .try_into()
        .with_context(|| format!("experiment {origin}: run {label}"))?;
    crate::fabric::build::check(&cfg)
        .map_err(|e| anyhow::anyhow!("experiment {origin}: run {label}: {e}"))?;
    Ok(cfg)
}

/// The build model's table columns after the counts.
const BUILD_HEAD: [&str; 7] = [
    "level RX",
    "level TX",
    "bisection",
    "TF p50 ms",
    "p99 ms",
    "Hedera moves",
    "invariant",
];

/// One run and policy's row of the build table.
fn build_cells(
    label: &str,
    p: fanin_sched::PolicyKind,
    s: &crate::fabric::build::BuildSummary,
) -> Vec<String> {
    vec![
        label.to_string(),
        p.name().into(),
        s.issued.to_string(),
        s.completed.to_string(),
        s.incomplete.to_string(),
        s.dropped.to_string(),
        num(s.level_rx, 2),
        num(s.level_tx, 2),
        format!("{:.3}", s.bisection),
        format!("{:.1}", s.latency_p50_s * 1e3),
        format!("{:.1}", s.latency_p99_s * 1e3),
        s.moves.to_string(),
        if s.invariant_ok { "ok" } else { "VIOLATED" }.into(),
    ]
}

/// Runs a `[build]` file: every `[[run]]` row (routing, Hedera, load...) with every
/// policy in `crates/sched` (or `policies = [...]`), one table row each.
pub fn run_build_file(path: &Path, results: &Path, only: &[String]) -> anyhow::Result<()> {
    use crate::fabric::build::run as build;
    let super::PolicyRows {
        name,
        origin,
        policies,
        mut rows,
    } = super::policy_rows(path, "build")?;
    super::keep_only(&mut rows, only, |r| &r.label)?;
    let configs = build_configs(&rows, &origin)?;
    let root = fanin_report::experiment_root(results, "sim", &name)?;
    println!(
        "fanin sim: {name:?}, event building over a fat tree; results in {}",
        root.display()
    );
    let mut cells = vec![super::head_with(&BUILD_HEAD)];
    let mut ok = true;
    for (row, base) in rows.iter().zip(&configs) {
        let label = &row.label;
        for &p in &policies {
            let mut cfg = base.clone();
            cfg.policy = p;
            let s = build(&cfg).map_err(|e| anyhow::anyhow!("run {label}: {e}"))?;
            let dir = root.join(super::policy_dir(label, p));
            std::fs::create_dir_all(&dir)?;
            std::fs::write(dir.join("config.toml"), toml::to_string(&cfg)?)?;
            std::fs::write(
                dir.join("summary.json"),
                serde_json::to_string_pretty(&s)? + "\n",
            )?;
            ok &= s.invariant_ok;
            cells.push(build_cells(label, p, &s));
        }
    }
    let table = fanin_report::align(&cells);
    println!("\n{table}");
    std::fs::write(root.join("table.txt"), &table)?;
    println!("results: {}", root.display());
    anyhow::ensure!(ok, "accounting invariant violated");
    Ok(())
}
