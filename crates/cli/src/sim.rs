//! `fanin sim`: runs the discrete-event simulator on one configuration (flags) or an
//! experiment file of runs, and prints the thesis-shaped table beside published values.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use fanin_sim::workload::Bio;
use fanin_sim::{SimConfig, SimSummary, Transport};

use fanin_lab::sim_report;

#[derive(Args)]
pub struct SimArgs {
    /// Experiment file: a `[sim]` base and `[[run]]` rows (see experiments/README.md).
    pub file: Option<PathBuf>,
    /// antares-sector, antares-2-string or antares-10-string.
    #[arg(long)]
    pub preset: Option<String>,
    #[arg(long, value_parser = ["tcp", "udp"])]
    pub transport: Option<String>,
    /// Delayed transmission with this group size (default: direct).
    #[arg(long)]
    pub k: Option<u32>,
    #[arg(long, value_parser = ["none", "bursts", "cutoff"])]
    pub bio: Option<String>,
    /// Simulated seconds of slices (plus the relaxation period).
    #[arg(long)]
    pub duration: Option<f64>,
    #[arg(long)]
    pub fragment_bytes: Option<u32>,
    /// Fragment size model: uniform(MIN,MAX), sine(MEAN,AMPL,PERIOD), random(MEAN,SPREAD).
    #[arg(long)]
    pub fragment_size: Option<String>,
    /// Also write fragments.csv: one row per fragment (large at full scale).
    #[arg(long)]
    pub fragments_csv: bool,
    #[arg(long)]
    pub ber: Option<f64>,
    #[arg(long)]
    pub min_rto_ms: Option<f64>,
    /// Uniform random send delay per fragment, in microseconds (0 = synchronised).
    #[arg(long)]
    pub jitter_us: Option<f64>,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Run only the rows with these labels (comma separated).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Directory under which results are written.
    #[arg(long, default_value = "results")]
    pub results: PathBuf,
}

impl SimArgs {
    fn apply(&self, c: &mut SimConfig) {
        if let Some(p) = &self.preset {
            c.preset = Some(p.clone());
        }
        if let Some(t) = &self.transport {
            c.transport = if t == "udp" {
                Transport::Udp
            } else {
                Transport::Tcp
            };
        }
        if self.k.is_some() {
            c.k = self.k;
        }
        if let Some(b) = &self.bio {
            c.bio = match b.as_str() {
                "bursts" => Bio::Bursts,
                "cutoff" => Bio::Cutoff,
                _ => Bio::None,
            };
        }
        if let Some(d) = self.duration {
            c.duration_s = d;
        }
        if let Some(v) = self.fragment_bytes {
            c.fragment_bytes = v;
        }
        if let Some(v) = &self.fragment_size {
            c.fragment_size = Some(v.clone());
        }
        if let Some(v) = self.ber {
            c.ber = v;
        }
        if let Some(v) = self.min_rto_ms {
            c.min_rto_ms = v;
        }
        if let Some(v) = self.jitter_us {
            c.jitter_us = v;
        }
        if let Some(v) = self.seed {
            c.seed = v;
        }
    }
}

pub fn run(a: SimArgs) -> anyhow::Result<()> {
    if let Some(f) = a
        .file
        .as_deref()
        .filter(|f| fanin_lab::fabric::is_fabric_file(f))
    {
        return fanin_lab::fabric::run_file(f, &a.results, &a.only, a.seed);
    }
    if let Some(f) = a
        .file
        .as_deref()
        .filter(|f| fanin_lab::fabric::is_build_file(f))
    {
        return fanin_lab::fabric::run_build_file(f, &a.results, &a.only);
    }
    if let Some(f) = a
        .file
        .as_deref()
        .filter(|f| fanin_lab::flow::is_alice_file(f))
    {
        let exp = fanin_lab::flow::load(f)?;
        return fanin_lab::flow::run_experiment(exp, &a.results, &a.only, a.seed, a.duration);
    }
    if let Some(p) = a.preset.as_deref().filter(|p| p.starts_with("alice-")) {
        let exp = fanin_lab::flow::from_preset(p);
        return fanin_lab::flow::run_experiment(exp, &a.results, &a.only, a.seed, a.duration);
    }
    let mut exp = match &a.file {
        Some(p) => sim_report::load(p)?,
        None => sim_report::single(SimConfig {
            preset: Some("antares-sector".into()),
            ..SimConfig::default()
        }),
    };
    if !a.only.is_empty() {
        exp.runs.retain(|r| a.only.contains(&r.label));
        anyhow::ensure!(
            !exp.runs.is_empty(),
            "--only {:?}: no run has those labels",
            a.only
        );
    }
    for r in &mut exp.runs {
        a.apply(&mut r.cfg);
        r.cfg = r
            .cfg
            .clone()
            .resolve()
            .map_err(|e| anyhow::anyhow!("run {}: {e}", r.label))?;
    }
    let root = a.results.join(format!(
        "{}-sim-{}",
        fanin_lab::orchestrate::timestamp(),
        exp.name
    ));
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    println!(
        "fanin sim: {:?}, {} run(s); results in {}",
        exp.name,
        exp.runs.len(),
        root.display()
    );
    let mut done: Vec<(sim_report::Run, SimSummary)> = Vec::new();
    for r in &exp.runs {
        let dir = root.join(fanin_lab::orchestrate::sanitize(&r.label));
        let s = sim_report::run_one(r, &dir, a.fragments_csv)?;
        println!("[{}] {}", r.label, s.line());
        done.push((r.clone(), s));
    }
    let table = sim_report::table(&done);
    println!("\n{table}");
    std::fs::write(root.join("table.txt"), &table)?;
    std::fs::write(root.join("table.csv"), sim_report::csv(&done))?;
    println!("results: {}", root.display());
    anyhow::ensure!(
        done.iter().all(|(_, s)| s.invariant_ok),
        "accounting invariant violated"
    );
    Ok(())
}
