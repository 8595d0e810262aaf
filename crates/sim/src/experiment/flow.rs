//! `fanin sim` at ALICE scale on the flow model: an `[alice]` experiment file (or
//! `--preset alice-2016|alice-tdr`) run once per EPN policy, one table row each.

use std::fmt::Write as _;
use std::path::Path;

use crate::flow::alice::{run, AliceConfig, AliceSummary};
use anyhow::Context;
use fanin_sched::PolicyKind;
use toml::Value;

pub struct AliceRun {
    pub label: String,
    pub cfg: AliceConfig,
}

pub struct AliceExperiment {
    pub name: String,
    /// Policies to run each row with (default: every policy in `crates/sched`).
    pub policies: Vec<PolicyKind>,
    pub runs: Vec<AliceRun>,
}

pub fn load(path: &Path) -> anyhow::Result<AliceExperiment> {
    let super::PolicyRows {
        name,
        origin,
        policies,
        rows,
    } = super::policy_rows(path, "alice")?;
    let mut runs = Vec::new();
    for r in rows {
        let (label, t) = (r.label, r.merged);
        let cfg: AliceConfig = Value::Table(t)
            .try_into()
            .with_context(|| format!("experiment {origin}: run {label}"))?;
        cfg.check()
            .map_err(|e| anyhow::anyhow!("experiment {origin}: run {label}: {e}"))?;
        runs.push(AliceRun { label, cfg });
    }
    Ok(AliceExperiment {
        name,
        policies,
        runs,
    })
}

/// A one-row experiment from a preset name (`fanin sim --preset alice-2016`).
pub fn from_preset(preset: &str) -> AliceExperiment {
    AliceExperiment {
        name: preset.to_string(),
        policies: PolicyKind::ALL.to_vec(),
        runs: vec![AliceRun {
            label: preset.to_string(),
            cfg: AliceConfig {
                preset: Some(preset.to_string()),
                ..AliceConfig::default()
            },
        }],
    }
}

/// `reason count` pairs, as printed and in table.csv.
fn reasons(m: &std::collections::BTreeMap<String, u64>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn table(rows: &[(String, AliceSummary)]) -> String {
    let mut cells = vec![super::head_with(&[
        "reasons",
        "lat p50 s",
        "p99 s",
        "max s",
        "buf mean %",
        "buf peak %",
        "FLP link %",
        "EPN link %",
        "EPN max %",
        "Tbit/s",
        "fails",
        "invariant",
    ])];
    for (label, s) in rows {
        cells.push(vec![
            label.clone(),
            s.policy.clone(),
            s.issued.to_string(),
            s.completed.to_string(),
            s.incomplete.to_string(),
            s.dropped.to_string(),
            {
                let r = [
                    reasons(&s.incomplete_by_reason),
                    reasons(&s.dropped_by_reason),
                ]
                .into_iter()
                .filter(|x| !x.is_empty())
                .collect::<Vec<_>>()
                .join(", ");
                if r.is_empty() {
                    "-".into()
                } else {
                    r
                }
            },
            format!("{:.2}", s.latency_p50_s),
            format!("{:.2}", s.latency_p99_s),
            format!("{:.2}", s.latency_max_s),
            format!("{:.1}", 100.0 * s.buffer_mean_frac),
            format!("{:.1}", 100.0 * s.buffer_peak_frac),
            format!("{:.1}", 100.0 * s.flp_link_util),
            format!("{:.1}", 100.0 * s.epn_link_util),
            format!("{:.1}", 100.0 * s.epn_link_util_max),
            format!("{:.3}", s.goodput_tbps),
            s.epn_failures.to_string(),
            if s.invariant_ok { "ok" } else { "VIOLATED" }.into(),
        ]);
    }
    fanin_report::align(&cells)
}

/// Run `r` with policy `p` and the command line's seed and duration.
fn configured(
    r: &AliceRun,
    p: PolicyKind,
    seed: Option<u64>,
    duration: Option<f64>,
) -> AliceConfig {
    let mut cfg = r.cfg.clone();
    cfg.policy = p;
    cfg.seed = seed.unwrap_or(cfg.seed);
    cfg.duration_s = duration.unwrap_or(cfg.duration_s);
    cfg
}

/// Every run checked before the first: nothing runs, nothing is written, when one
/// cannot.
pub fn check_all(
    exp: &AliceExperiment,
    seed: Option<u64>,
    duration: Option<f64>,
) -> anyhow::Result<()> {
    // The policy is not among what a check looks at: each row once.
    let Some(&p) = exp.policies.first() else {
        return Ok(());
    };
    for r in &exp.runs {
        let checked = configured(r, p, seed, duration).check();
        checked.map_err(|e| anyhow::anyhow!("run {}: {e}", r.label))?;
    }
    Ok(())
}

/// One row with one policy: its config and summary in `dir`, a line on stdout; the
/// summary. The wall time it took goes to stdout only: the files are the seed's alone.
fn run_one(label: &str, cfg: &AliceConfig, dir: &Path) -> anyhow::Result<AliceSummary> {
    let wall = std::time::Instant::now();
    let s = run(cfg).map_err(|e| anyhow::anyhow!("run {label}: {e}"))?;
    let wall = wall.elapsed().as_secs_f64();
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("config.toml"), toml::to_string(cfg)?)?;
    std::fs::write(
        dir.join("summary.json"),
        serde_json::to_string_pretty(&s)? + "\n",
    )?;
    println!(
        "[{label} / {}] issued {} completed {} incomplete {} dropped {} invariant {} ({wall:.1} s wall, {} flows, {} rate solves)",
        cfg.policy,
        s.issued,
        s.completed,
        s.incomplete,
        s.dropped,
        if s.invariant_ok { "ok" } else { "VIOLATED" },
        s.flows,
        s.solves
    );
    Ok(s)
}

/// table.csv: one row per run and policy.
fn csv(rows: &[(String, AliceSummary)]) -> String {
    let mut csv = String::from("run,policy,issued,completed,incomplete,dropped,incomplete_reasons,dropped_reasons,waited,latency_mean_s,latency_p50_s,latency_p99_s,latency_max_s,buffer_mean_frac,buffer_peak_frac,flp_link_util,epn_link_util,epn_link_util_max,goodput_tbps,epn_failures,invariant_ok\n");
    for (label, s) in rows {
        let label = fanin_report::csv_quoted(label);
        let _ = writeln!(
            csv,
            "{label},{},{},{},{},{},\"{}\",\"{}\",{},{:.4},{:.4},{:.4},{:.4},{:.5},{:.5},{:.5},{:.5},{:.5},{:.5},{},{}",
            s.policy,
            s.issued,
            s.completed,
            s.incomplete,
            s.dropped,
            reasons(&s.incomplete_by_reason),
            reasons(&s.dropped_by_reason),
            s.waited,
            s.latency_mean_s,
            s.latency_p50_s,
            s.latency_p99_s,
            s.latency_max_s,
            s.buffer_mean_frac,
            s.buffer_peak_frac,
            s.flp_link_util,
            s.epn_link_util,
            s.epn_link_util_max,
            s.goodput_tbps,
            s.epn_failures,
            s.invariant_ok
        );
    }
    csv
}

/// Runs every row of `exp` (already cut to `--only`) with every policy, after checking
/// them all with `seed` and `duration` applied.
pub fn run_experiment(
    exp: AliceExperiment,
    results: &Path,
    seed: Option<u64>,
    duration: Option<f64>,
) -> anyhow::Result<()> {
    check_all(&exp, seed, duration)?;
    let root = fanin_report::experiment_root(results, "sim", &exp.name)?;
    println!(
        "fanin sim: {:?} on the flow model, {} run(s) x {} policies; results in {}",
        exp.name,
        exp.runs.len(),
        exp.policies.len(),
        root.display()
    );
    let mut rows = Vec::new();
    for r in &exp.runs {
        for &p in &exp.policies {
            let cfg = configured(r, p, seed, duration);
            let dir = root.join(super::policy_dir(&r.label, p));
            let s = run_one(&r.label, &cfg, &dir)?;
            rows.push((r.label.clone(), s));
        }
    }
    let t = table(&rows);
    println!("\n{t}");
    std::fs::write(root.join("table.txt"), &t)?;
    std::fs::write(root.join("table.csv"), csv(&rows))?;
    println!("results: {}", root.display());
    anyhow::ensure!(
        rows.iter().all(|(_, s)| s.invariant_ok),
        "accounting invariant violated"
    );
    Ok(())
}
