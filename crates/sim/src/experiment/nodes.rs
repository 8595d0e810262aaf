//! `fanin sim` on a nodes-model file (`model = "nodes"`: `[run]`, `[net]`, `[[fault]]`):
//! the real node cores in simulated time; the ICN's summary.json and tfs.csv, as a real
//! run writes them, plus the log with every fault.

use std::path::{Path, PathBuf};

use anyhow::Context;
use toml::Value;

use crate::nodes::check::{violations, Expect};
use crate::nodes::{simulate, Scenario};

/// The file's name and scenario.
pub fn load(path: &Path) -> anyhow::Result<(String, Scenario)> {
    let allowed = ["model", "name", "description", "run", "net", "fault"];
    let (mut doc, origin) = fanin_report::doc::read_doc(path, &allowed)?;
    let name = super::name_of(&doc, "nodes");
    for meta in ["model", "name", "description"] {
        doc.remove(meta);
    }
    let s: Scenario = Value::Table(doc)
        .try_into()
        .with_context(|| format!("experiment {origin}"))?;
    s.checked()
        .with_context(|| format!("experiment {origin}"))?;
    Ok((name, s))
}

/// Runs the file; writes `results/STAMP-sim-NAME/{summary.json,summary.csv,tfs.csv,log.txt}`
/// (the name sanitised: nothing outside `results`, nothing overwritten); an error when a
/// promise was broken.
pub fn run_file(path: &Path, results: &Path) -> anyhow::Result<PathBuf> {
    let (name, s) = load(path)?;
    let mut o = simulate(&s)?;
    let dir = fanin_report::experiment_root(results, "sim", &name)?;
    o.summary.write_as(&dir, &name)?;
    std::fs::write(dir.join("tfs.csv"), o.tfs_csv())
        .with_context(|| format!("writing {}", dir.join("tfs.csv").display()))?;
    let log = o.seen.log.join("\n") + "\n";
    std::fs::write(dir.join("log.txt"), log)
        .with_context(|| format!("writing {}", dir.join("log.txt").display()))?;
    let sm = &o.summary;
    println!(
        "{name}: issued {}, completed {}, incomplete {} {:?}, dropped {} {:?}, invariant_ok {}; {:.3} s simulated, {} events",
        sm.issued,
        sm.completed,
        sm.incomplete,
        sm.incomplete_by_reason,
        sm.dropped,
        sm.dropped_by_reason,
        sm.invariant_ok,
        o.sim_ns as f64 / 1e9,
        o.events
    );
    let v = violations(&o, Expect::Accounted);
    anyhow::ensure!(v.is_empty(), "{name}: promises broken: {}", v.join("; "));
    println!("{}", dir.display());
    Ok(dir)
}
