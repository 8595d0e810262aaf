//! `fanin sim`: runs the discrete-event simulator on one configuration (flags) or an
//! experiment file of runs, and prints the thesis-shaped table beside published values.

use std::path::PathBuf;

use clap::Args;
use fanin_sim::workload::Bio;
use fanin_sim::{SimConfig, Transport};

use fanin_sim::experiment::{fabric, flow, model_of, nodes, packet, Model};

#[derive(Args)]
pub struct SimArgs {
    /// Experiment file: a `[sim]` base and `[[run]]` rows (see experiments/README.md).
    pub file: Option<PathBuf>,
    /// antares-sector, antares-2-string, antares-10-string (packet model), or
    /// alice-2016, alice-tdr (flow model, every policy).
    #[arg(long)]
    pub preset: Option<String>,
    /// Transport of the fragments (packet model).
    #[arg(long, value_parser = ["tcp", "udp"])]
    pub transport: Option<String>,
    /// Delayed transmission with this group size (default: direct).
    #[arg(long)]
    pub k: Option<u32>,
    /// Bioluminescence: none, bursts, or bursts with the cut-off (packet model).
    #[arg(long, value_parser = ["none", "bursts", "cutoff"])]
    pub bio: Option<String>,
    /// Simulated seconds of slices (plus the relaxation period).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Bytes of every fragment when no size model is given (packet model).
    #[arg(long)]
    pub fragment_bytes: Option<u32>,
    /// Fragment size model: uniform(MIN,MAX), sine(MEAN,AMPL,PERIOD), random(MEAN,SPREAD).
    #[arg(long)]
    pub fragment_size: Option<String>,
    /// Also write fragments.csv: one row per fragment (large at full scale).
    #[arg(long)]
    pub fragments_csv: bool,
    /// Bit error rate of every link, within [0, 1) (packet model).
    #[arg(long)]
    pub ber: Option<f64>,
    /// TCP's minimum retransmission time-out in ms (packet model).
    #[arg(long)]
    pub min_rto_ms: Option<f64>,
    /// Uniform random send delay per fragment, in microseconds (0 = synchronised).
    #[arg(long)]
    pub jitter_us: Option<f64>,
    /// Seed of every random draw: the same seed gives the same files, byte for byte
    /// (at most 2^62: a seed plus its repetitions is written to TOML, whose integers are
    /// signed 64-bit).
    #[arg(long, value_parser = clap::value_parser!(u64).range(..=fanin_sim::MAX_SEED))]
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

impl SimArgs {
    /// The flags given that the model does not read: each is refused, never ignored.
    fn foreign_flags(&self, model: Model) -> Vec<&'static str> {
        let packet_only = [
            ("--transport", self.transport.is_some()),
            ("--k", self.k.is_some()),
            ("--bio", self.bio.is_some()),
            ("--fragment-bytes", self.fragment_bytes.is_some()),
            ("--fragment-size", self.fragment_size.is_some()),
            ("--fragments-csv", self.fragments_csv),
            ("--ber", self.ber.is_some()),
            ("--min-rto-ms", self.min_rto_ms.is_some()),
            ("--jitter-us", self.jitter_us.is_some()),
        ];
        let mut given: Vec<_> = match model {
            Model::Packet => return Vec::new(),
            _ => packet_only.iter().filter(|f| f.1).map(|f| f.0).collect(),
        };
        if matches!(model, Model::Fabric | Model::Build) && self.duration.is_some() {
            given.push("--duration");
        }
        if matches!(model, Model::Build | Model::Nodes) && self.seed.is_some() {
            given.push("--seed");
        }
        if model == Model::Nodes {
            // The scenario's [run] table holds its duration and seed.
            if self.duration.is_some() {
                given.push("--duration");
            }
            if !self.only.is_empty() {
                given.push("--only");
            }
        }
        given
    }
}

pub fn run(a: SimArgs, check: bool) -> anyhow::Result<()> {
    let model = match (&a.file, a.preset.as_deref()) {
        (Some(f), _) => model_of(f)?,
        (None, Some(p)) if p.starts_with("alice-") => Model::Flow,
        _ => Model::Packet,
    };
    if let [flag, ..] = a.foreign_flags(model)[..] {
        anyhow::bail!(
            "{flag} does not apply to the {} model (packet-model flags: see fanin sim --help)",
            model.name()
        );
    }
    if check {
        return check_only(&a, model);
    }
    match (model, &a.file) {
        (Model::Fabric, Some(f)) => fabric::run_file(f, &a.results, &a.only, a.seed),
        (Model::Build, Some(f)) => fabric::run_build_file(f, &a.results, &a.only),
        (Model::Nodes, Some(f)) => {
            // The cores' own log lines go to log.txt, not the terminal.
            let quiet = tracing::subscriber::NoSubscriber::default();
            tracing::subscriber::with_default(quiet, || nodes::run_file(f, &a.results))?;
            Ok(())
        }
        (Model::Flow, _) => {
            flow::run_experiment(flow_experiment(&a)?, &a.results, a.seed, a.duration)
        }
        _ => run_packet(&a),
    }
}

fn run_packet(a: &SimArgs) -> anyhow::Result<()> {
    let exp = packet_experiment(a)?;
    packet::run_experiment(&exp, &a.results, a.fragments_csv)
}

/// The packet model's runs as they will run: the file's `--only` rows or the preset,
/// with the flags applied, each checked.
fn packet_experiment(a: &SimArgs) -> anyhow::Result<packet::SimExperiment> {
    let mut exp = match &a.file {
        Some(p) => packet::load(p)?,
        None => packet::single(SimConfig {
            preset: Some("antares-sector".into()),
            ..SimConfig::default()
        }),
    };
    fanin_sim::experiment::keep_only(&mut exp.runs, &a.only, |r| &r.label)?;
    for r in &mut exp.runs {
        a.apply(&mut r.cfg);
        r.cfg = r
            .cfg
            .clone()
            .resolve()
            .map_err(|e| anyhow::anyhow!("run {}: {e}", r.label))?;
    }
    Ok(exp)
}

/// The flow model's file or preset, as it will run (`--only`, `--seed`, `--duration`).
fn flow_experiment(a: &SimArgs) -> anyhow::Result<flow::AliceExperiment> {
    let mut exp = match &a.file {
        Some(f) => flow::load(f)?,
        None => flow::from_preset(a.preset.as_deref().unwrap_or("alice-2016")),
    };
    fanin_sim::experiment::keep_only(&mut exp.runs, &a.only, |r| &r.label)?;
    flow::check_all(&exp, a.seed, a.duration)?;
    Ok(exp)
}

/// `fanin --check sim ...`: loads and checks the file or preset as it would run (with
/// the flags that apply to it), runs nothing.
fn check_only(a: &SimArgs, model: Model) -> anyhow::Result<()> {
    let rows = match (model, &a.file) {
        (Model::Packet, _) => packet_experiment(a)?.runs.len(),
        (Model::Flow, _) => {
            let exp = flow_experiment(a)?;
            exp.runs.len() * exp.policies.len()
        }
        (m, Some(f)) => fanin_sim::experiment::check_file(f, m, (&a.only, a.seed))?,
        (_, None) => 1,
    };
    println!("ok: {} model, {rows} row(s)", model.name());
    Ok(())
}
