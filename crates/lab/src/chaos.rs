//! `fanin chaos`: the fault campaign over the nodes model. Runs seeds, prints one line
//! per failing seed with its shrunk schedule and the command that replays it, and the
//! campaign's totals; one seed alone prints its scenario, faults and outcome; `--real`
//! runs seeds against real processes (`chaos_real.rs`).

use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use fanin_sim::nodes::chaos::{self, Case, Tally};

#[derive(Args, Debug, Clone)]
pub struct ChaosArgs {
    /// How many seeds to run (seeds FIRST .. FIRST+SEEDS).
    #[arg(long, default_value_t = 2000)]
    pub seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    pub first: u64,
    /// Run this one seed and print its scenario, faults and outcome (a replay).
    #[arg(long)]
    pub seed: Option<u64>,
    /// With --seed: keep only these faults of its schedule (indices, e.g. 0,2).
    #[arg(long, value_delimiter = ',')]
    pub keep: Option<Vec<usize>>,
    /// Print every seed's line, not only the failing ones.
    #[arg(long)]
    pub verbose: bool,
    /// Against real processes on loopback: each seed's kills and freezes as SIGKILL and
    /// SIGSTOP of `fanin` processes (a few seconds per seed).
    #[arg(long)]
    pub real: bool,
    /// --real: on the campaign's own testbed (as root; created and removed), where a case
    /// also parts, slows and resets the network and expires ZooKeeper sessions.
    #[arg(long, requires = "real")]
    pub testbed: bool,
    /// --real: the runs' directories go under this one (`chaos-real-<seed>/`).
    #[arg(long, default_value = "results")]
    pub results: std::path::PathBuf,
}

/// Runs the campaign (or one seed); an error when a promise was broken.
pub async fn run(a: &ChaosArgs) -> anyhow::Result<()> {
    if a.real {
        return real(a).await;
    }
    // The cores' own log lines would drown the campaign's: the ICN's are in its log.
    let quiet = tracing::subscriber::NoSubscriber::default();
    tracing::subscriber::with_default(quiet, || campaign(a))
}

/// The real campaign: seeds FIRST.. (or --seed) as real runs, one line each.
async fn real(a: &ChaosArgs) -> anyhow::Result<()> {
    if a.keep.is_some() {
        bail!("--keep: not with --real (a real case keeps the faults loopback can inject)");
    }
    let seeds: Vec<u64> = match a.seed {
        Some(s) => vec![s],
        None => (a.first..a.first.saturating_add(a.seeds)).collect(),
    };
    // Where the cases go, checked once: not one "broken promise" per seed.
    if let Some(&first) = seeds.first() {
        let dir = crate::chaos_real::case_dir(&a.results, first);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("--results {}: {}", a.results.display(), dir.display()))?;
    }
    let t0 = Instant::now();
    let tb = match a.testbed {
        true => Some(crate::chaos_real::CampaignTestbed::up()?),
        false => None,
    };
    let mut failed = Vec::new();
    for &seed in &seeds {
        let c = crate::chaos_real::real_case(seed, tb.is_some());
        let dir = crate::chaos_real::case_dir(&a.results, seed);
        let v = crate::chaos_real::run_real(&c, &dir, tb.as_ref()).await?;
        let faults: Vec<String> = c.faults.iter().map(fault_word).collect();
        println!(
            "seed {seed}: {} FLPs x {} EPNs, {}, faults [{}], {:?}: {}",
            c.run.flps,
            c.run.epns,
            c.run.policy.name(),
            faults.join(", "),
            c.expect,
            if v.is_empty() {
                "kept".to_string()
            } else {
                format!("FAILED: {}", v.join("; "))
            }
        );
        if !v.is_empty() {
            println!(
                "  files: {}; replay: fanin chaos --real{} --seed {seed}",
                dir.display(),
                if a.testbed { " --testbed" } else { "" }
            );
            failed.push(seed);
        }
    }
    println!(
        "real seeds {}{}, violations {}, wall {:.1} s",
        seeds.len(),
        if a.testbed { " on the testbed" } else { "" },
        failed.len(),
        t0.elapsed().as_secs_f64()
    );
    match failed.first() {
        None => Ok(()),
        Some(s) => bail!(
            "{} real seeds broke a promise; the first: fanin chaos --real{} --seed {s}",
            failed.len(),
            if a.testbed { " --testbed" } else { "" }
        ),
    }
}

/// `partition flp 0-epn 2`, `kill epn 1`: a real case's fault in a word or two.
fn fault_word(f: &crate::faults::Fault) -> String {
    match &f.peer {
        Some(p) => format!("{} {}-{p}", f.action.name(), f.node),
        None => format!("{} {}", f.action.name(), f.node),
    }
}

fn campaign(a: &ChaosArgs) -> anyhow::Result<()> {
    if let Some(seed) = a.seed {
        return replay(seed, a.keep.as_deref());
    }
    if a.keep.is_some() {
        bail!("--keep: only with --seed");
    }
    let t0 = Instant::now();
    let mut tally = Tally::default();
    for seed in a.first..a.first.saturating_add(a.seeds) {
        let c = chaos::case(seed);
        let (o, v) = chaos::run_case(&c)?;
        if a.verbose {
            println!("seed {seed}: {}", case_line(&c, &o.summary));
        }
        if !v.is_empty() {
            report_failure(&c, &v);
        }
        tally.add(seed, &o, v);
    }
    println!("{}, wall {:.1} s", tally.line(), t0.elapsed().as_secs_f64());
    match tally.failed.first() {
        None => Ok(()),
        Some((seed, _)) => bail!(
            "{} of {} seeds broke a promise; the first: fanin chaos --seed {seed}",
            tally.failed.len(),
            tally.seeds
        ),
    }
}

/// One line for a case: its cluster, policy and faults, and how its TFs ended.
fn case_line(c: &Case, s: &fanin_node::Summary) -> String {
    let r = &c.scenario.run;
    format!(
        "{} FLPs x {} EPNs, {}, {} faults, {:?}: issued {}, completed {}, incomplete {}, dropped {} {:?}",
        r.flps,
        r.epns,
        r.policy.name(),
        c.scenario.faults.len(),
        c.expect,
        s.issued,
        s.completed,
        s.incomplete,
        s.dropped,
        s.dropped_by_reason
    )
}

fn report_failure(c: &Case, v: &[String]) {
    println!("seed {} FAILED: {}", c.seed, v.join("; "));
    let keep = chaos::shrink(c);
    for &i in &keep {
        println!("  {}", c.scenario.faults[i].describe());
    }
    let list: Vec<String> = keep.iter().map(usize::to_string).collect();
    println!(
        "  replay: fanin chaos --seed {} --keep {}",
        c.seed,
        list.join(",")
    );
}

/// One seed, told in full: the scenario as TOML (a `fanin sim` file), the faults, the
/// ICN's log, the outcome and any broken promise.
fn replay(seed: u64, keep: Option<&[usize]>) -> anyhow::Result<()> {
    let mut c = chaos::case(seed);
    if let Some(k) = keep {
        if let Some(bad) = k.iter().find(|&&i| i >= c.scenario.faults.len()) {
            bail!(
                "--keep: seed {seed} has {} faults, no fault {bad}",
                c.scenario.faults.len()
            );
        }
        c = chaos::keep_faults(&c, k);
    }
    println!("# seed {seed} ({:?})", c.expect);
    println!("model = \"nodes\"\n{}", toml::to_string(&c.scenario)?);
    let (o, v) = chaos::run_case(&c)?;
    for l in &o.seen.log {
        println!("{l}");
    }
    println!("{}", case_line(&c, &o.summary));
    if v.is_empty() {
        println!("seed {seed}: every promise kept");
        Ok(())
    } else {
        for line in &v {
            println!("violation: {line}");
        }
        bail!("seed {seed} broke {} promises", v.len())
    }
}
