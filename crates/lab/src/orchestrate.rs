//! `fanin run`: starts an ICN, the EPNs and the FLPs as separate processes (on loopback, or
//! on the hosts of a testbed) for each configuration and repetition, and prints the table.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;
use fanin_node::Summary;

use crate::cluster::{run_on, OnTestbed};
use crate::experiment::{self, Config, ControlNet, Experiment};
use crate::faults::FaultResult;
use crate::overrides::RunOverrides;
use crate::table::{self, RunRow};
use crate::testbed;

#[derive(Args)]
pub struct RunArgs {
    /// Experiment file (TOML). Without one, the embedded default experiment runs.
    pub file: Option<PathBuf>,
    /// Directory under which each run's results are written.
    #[arg(long, default_value = "results")]
    pub results: PathBuf,
    /// Repetitions per configuration (overrides the file's `repetitions`).
    #[arg(long)]
    pub repetitions: Option<u32>,
    /// Run only the configurations with these labels (comma separated).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Run on loopback even if the experiment names a testbed.
    #[arg(long)]
    pub local: bool,
    /// On a testbed: seconds of iperf3 from the first FLP's host to the first EPN's host
    /// before the runs, printed as the capacity reference (0 = skip).
    #[arg(long, default_value_t = 5)]
    pub iperf_seconds: u32,
    #[command(flatten)]
    pub overrides: RunOverrides,
}

/// How a `fanin run` ended when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Every run of the sweep ran.
    Complete,
    /// The operator stopped it (SIGINT/SIGTERM); what finished is in the table.
    Interrupted,
}

pub async fn run(a: RunArgs) -> anyhow::Result<Ended> {
    let interrupts = crate::process::listen()?;
    let exp = load(&a)?;
    let reps = a.repetitions.unwrap_or(exp.repetitions);
    if reps == 0 {
        bail!("--repetitions must be at least 1");
    }
    let on_testbed = exp.testbed.as_ref().filter(|_| !a.local);
    prerequisites(&exp, on_testbed.is_some(), a.iperf_seconds > 0)?;
    let net = match on_testbed {
        Some(p) => Some(OnTestbed::new(testbed::load(&p.name)?, p.clone())?),
        None => None,
    };
    // Made (or refused, naming the path) before anything runs.
    let root = fanin_report::experiment_root(&a.results, "", &exp.name)?;
    println!(
        "fanin run: experiment {:?}: {} configuration(s) x {reps} repetition(s); results in {}",
        exp.name,
        exp.configs.len(),
        root.display()
    );
    // The file's description speaks of the file's values: not shown when overridden.
    if !exp.description.is_empty() && a.overrides.is_empty() {
        println!("  {}", exp.description.trim());
    }
    if let [c] = exp.configs.as_slice() {
        // What runs, after the command line's overrides (the description is the file's).
        println!("  configuration: {}", effective(&c.run));
    }
    let capacity = match &net {
        Some(n) => describe_testbed(n, a.iperf_seconds)?,
        None => None,
    };
    let sweep = Sweep {
        exp: &exp,
        reps,
        root: &root,
        net: net.as_ref(),
        interrupts,
    };
    let (rows, failures, ran) = sweep.run().await?;
    write_table(&exp, &root, &rows, capacity)?;
    if !failures.is_empty() {
        bail!("{} run(s) failed: {}", failures.len(), failures.join("; "));
    }
    if *sweep.interrupts.borrow() > 0 {
        let all = exp.configs.len() * reps as usize;
        println!(
            "interrupted after {ran} of {all} runs; results in {}",
            root.display()
        );
        return Ok(Ended::Interrupted);
    }
    Ok(Ended::Complete)
}

/// `fanin --check run ...`: the experiment loaded and every configuration checked after
/// the command line's overrides; nothing runs and nothing is written.
pub fn check(a: &RunArgs) -> anyhow::Result<String> {
    let exp = load(a)?;
    let reps = a.repetitions.unwrap_or(exp.repetitions);
    anyhow::ensure!(reps > 0, "--repetitions must be at least 1");
    Ok(format!(
        "experiment {:?}: {} configuration(s) x {reps} repetition(s)",
        exp.name,
        exp.configs.len()
    ))
}

/// What the sweep needs, checked once before its first run: a ZooKeeper when a
/// configuration asks for a private one; on a testbed, root and iproute2 (and iperf3
/// for the capacity reference). One line names what is missing and how to install it.
fn prerequisites(exp: &Experiment, on_testbed: bool, iperf: bool) -> anyhow::Result<()> {
    if let (true, Some(t)) = (on_testbed, &exp.testbed) {
        testbed::need_root(&format!("fanin run on testbed {:?}", t.name))
            .map_err(|e| anyhow::anyhow!("{e} (or --local: on loopback)"))?;
    }
    let iperf = on_testbed && iperf;
    let zk = fanin_node::config::Registry::ZooKeeper;
    if exp.configs.iter().any(|c| c.run.registry == zk) {
        fanin_node::registry::zk_server::find_script()
            .context("registry = \"zookeeper\" needs a ZooKeeper server")?;
    }
    if iperf && crate::testbed::which("iperf3").is_none() {
        bail!("the testbed's capacity reference needs iperf3: apt-get install -y iperf3 (or --iperf-seconds 0)");
    }
    Ok(())
}

/// One line for a run configuration as it will run.
fn effective(c: &fanin_node::RunConfig) -> String {
    let rate = match c.rate_hz {
        r if r > 0.0 => format!("{r} Hz"),
        _ => "unthrottled".to_string(),
    };
    let length = match (c.tfs, c.duration_s) {
        (Some(n), _) => format!("{n} TFs"),
        (None, Some(d)) => format!("{d} s"),
        (None, None) => "-".to_string(),
    };
    format!(
        "{} FLPs -> {} EPNs, {rate}, STFs {}, {length}, policy {}, registry {}",
        c.flps, c.epns, c.stf_size, c.policy, c.registry
    )
}

/// The experiment to run: the file (or the embedded default), the `--only` rows, the
/// command line's overrides, every configuration checked.
fn load(a: &RunArgs) -> anyhow::Result<Experiment> {
    let overrides = |run: &mut fanin_node::RunConfig| a.overrides.apply(run);
    let tweak = (
        &a.only[..],
        &overrides as &dyn Fn(&mut fanin_node::RunConfig) -> _,
    );
    let exp: Experiment = match &a.file {
        Some(p) => experiment::load_with(p, tweak)?,
        None => experiment::parse_with(experiment::DEFAULT, "default", tweak)?,
    };
    // The testbed's placement meets the overrides too, when the testbed is used.
    if let Some(t) = exp.testbed.as_ref().filter(|_| !a.local) {
        t.check(&exp.configs)
            .context("[testbed] with the command line's overrides")?;
    }
    Ok(exp)
}

/// Prints the testbed and, unless `iperf_seconds` is 0, measures its capacity with iperf3
/// from the first FLP's host to the first EPN's host (Mbit/s).
fn describe_testbed(n: &OnTestbed, iperf_seconds: u32) -> anyhow::Result<Option<f64>> {
    println!(
        "  on testbed {} ({} hosts, {} Mbit/s links), control on the {} network",
        n.spec.name,
        n.spec.hosts,
        n.spec.data.rate_bps as f64 / 1e6,
        match n.place.control {
            ControlNet::Aux => "auxiliary",
            ControlNet::Data => "data",
        }
    );
    if iperf_seconds == 0 {
        return Ok(None);
    }
    // Measured on the links as they are made, not as a fault an interrupted run left
    // them (a partition's filters, a slowed rate).
    testbed::netfault::NetFaults::new(n.spec.clone(), &n.place, None).prepare()?;
    let (f, e) = (n.place.flps[0], n.place.epns[0]);
    let (f, e) = if f == e { (n.place.icn, e) } else { (f, e) };
    let m = testbed::iperf::measure(&n.spec, f, e, iperf_seconds)?;
    println!("  capacity reference: iperf3 h{f} -> h{e}, {iperf_seconds} s: {m:.2} Mbit/s");
    Ok(Some(m))
}

/// Every configuration of an experiment, `reps` times each.
struct Sweep<'a> {
    exp: &'a Experiment,
    reps: u32,
    root: &'a Path,
    net: Option<&'a OnTestbed>,
    interrupts: crate::process::Interrupts,
}

impl Sweep<'_> {
    /// Runs everything (until interrupted); returns a table row per configuration that
    /// completed a run, a line per failed run, and how many runs ran.
    async fn run(&self) -> anyhow::Result<(Vec<RunRow>, Vec<String>, usize)> {
        let mut rows = Vec::new();
        let mut failures = Vec::new();
        let mut ran = 0;
        for (ci, c) in self.exp.configs.iter().enumerate() {
            let mut done: Vec<Summary> = Vec::new();
            let mut fault_runs: Vec<Vec<FaultResult>> = Vec::new();
            for r in 0..self.reps {
                if *self.interrupts.borrow() > 0 {
                    break;
                }
                ran += 1;
                let (dir, prefix) = self.place(ci, c, r);
                match self.run_rep(c, &dir, &prefix).await {
                    Ok((s, faults)) => {
                        if !s.invariant_ok {
                            failures.push(format!("{prefix}: accounting invariant violated"));
                        }
                        if let Some(short) = s.ended_short() {
                            failures.push(format!("{prefix}: {short}"));
                        }
                        fault_runs.push(faults);
                        done.push(s);
                    }
                    Err(e) => {
                        println!("{prefix}: FAILED: {e:#}");
                        failures.push(format!("{prefix}: {e:#}"));
                    }
                }
            }
            if !done.is_empty() {
                rows.push(row(c, &done, &fault_runs));
            }
        }
        Ok((rows, failures, ran))
    }

    /// The directory and the log prefix of repetition `r` of configuration `ci`.
    fn place(&self, ci: usize, c: &Config, r: u32) -> (PathBuf, String) {
        let single = self.exp.configs.len() == 1 && self.reps == 1;
        let dir = if single {
            self.root.to_path_buf()
        } else {
            self.root.join(format!("c{:02}-r{:02}", ci + 1, r + 1))
        };
        let n = self.exp.configs.len();
        (dir, format!("[{}/{n}] {} rep {}", ci + 1, c.label, r + 1))
    }

    /// One run: its line, its events, its faults (printed and in `faults.json`).
    async fn run_rep(
        &self,
        c: &Config,
        dir: &Path,
        prefix: &str,
    ) -> anyhow::Result<(Summary, Vec<FaultResult>)> {
        let stop = Some(self.interrupts.clone());
        let (s, faults) = run_on(
            &c.run,
            dir,
            prefix,
            self.net,
            &self.exp.faults,
            &self.exp.epn,
            stop,
        )
        .await?;
        println!(
            "{prefix}: issued {} completed {} incomplete {} dropped {} loss {:.2} % goodput {:.3} Gbit/s pre-run {:.2} s invariant {} valid {}{}",
            s.issued,
            s.completed,
            s.incomplete,
            s.dropped,
            s.loss_pct,
            s.goodput_gbps,
            s.prerun_s,
            if s.invariant_ok { "ok" } else { "VIOLATED" },
            s.valid,
            s.invalid_reason.as_ref().map(|r| format!(" ({r})")).unwrap_or_default()
        );
        if c.run.rate_hz == 0.0 {
            // Unthrottled: the rate it sustained is the measurement.
            println!(
                "{prefix}: unthrottled: sustained {:.1} TF/s ({} TFs issued in {:.2} s)",
                s.rate_hz_achieved, s.issued, s.duration_s
            );
        }
        if s.interrupted {
            println!("{prefix}: interrupted");
        }
        for e in &s.events {
            println!("{prefix}:   {e}");
        }
        if !faults.is_empty() {
            print!("{}", crate::faults::render(&faults));
            let json = serde_json::to_string_pretty(&faults)?;
            std::fs::write(dir.join("faults.json"), json)?;
        }
        if let Err(e) = crate::run_report::write(dir) {
            eprintln!("warning: report.html of {}: {e:#}", dir.display());
        }
        Ok((s, faults))
    }
}

/// One table row: means over the repetitions, beside the published values.
fn row(c: &Config, done: &[Summary], fault_runs: &[Vec<FaultResult>]) -> RunRow {
    // Long runs (TDR Table 19: 3 minutes) compare with the published long-run loss.
    let long = c.run.duration_s.unwrap_or(0.0) >= 120.0;
    let published = if long {
        c.published_long_loss_pct.or(c.published_loss_pct)
    } else {
        c.published_loss_pct
    };
    let mut row = RunRow::from_summaries(&c.label, done, published);
    row.faults = table::FaultCols::from_runs(fault_runs);
    row.published_mb_s = c.published_mb_s;
    row
}

/// Prints the table and writes `table.txt`, `table.csv` and, for a sweep over STF sizes,
/// `loss.svg`.
fn write_table(
    exp: &Experiment,
    root: &Path,
    rows: &[RunRow],
    capacity: Option<f64>,
) -> anyhow::Result<()> {
    println!();
    let mut text = table::render(rows);
    if let Some(m) = capacity {
        text +=
            &format!("capacity reference (iperf3, same testbed, same invocation): {m:.2} Mbit/s\n");
    }
    print!("{text}");
    let write = fanin_node::icn::summary::write_atomic;
    write(&root.join("table.txt"), &text)?;
    write(&root.join("table.csv"), &table::csv(rows))?;
    let sizes: std::collections::BTreeSet<&str> =
        rows.iter().map(|r| r.stf_size.as_str()).collect();
    if sizes.len() > 1 {
        let title = format!("{}: TF loss vs STF size, per FLP count", exp.name);
        let svg = crate::plot::loss_vs_size(&title, rows);
        write(&root.join("loss.svg"), &svg)?;
        println!("plot: {}", root.join("loss.svg").display());
    }
    println!("\nresults: {}", root.display());
    Ok(())
}
