//! `fanin chaos --real`: the campaign's cases against real processes on loopback. Each
//! seed's sim case is scaled to a short real run, its kills and freezes become SIGKILL
//! and SIGSTOP of `fanin` processes, and the run's own files are held to the promises.
//!
//! Partitions, resets and slow links need network namespaces: a real case draws only
//! kills and freezes. With ZooKeeper every other case also kills the ICN (-9) or freezes
//! it past its session, and its standby takes the run over (the promises then hold
//! across the take-over; a frozen ICN continued afterwards must stay silent).

use std::path::{Path, PathBuf};

use fanin_node::RunConfig;
use fanin_sim::nodes::check::{self, Expect};
use fanin_sim::nodes::{chaos, FaultKind, Peer};

use crate::faults::{Action, Fault};

/// A seed's real case: its run, its faults as `fanin run` injects them, its promise.
pub struct RealCase {
    pub seed: u64,
    pub run: RunConfig,
    pub faults: Vec<Fault>,
    pub expect: Expect,
}

/// Longest real run (TFs) and highest rate (Hz): each case takes seconds, not minutes.
const MAX_TFS: u64 = 300;
const MAX_RATE_HZ: f64 = 250.0;

pub fn real_case(seed: u64) -> RealCase {
    let c = chaos::case_of(seed, chaos::Kinds::Processes);
    let sim_ms = c.scenario.run.tfs.unwrap_or(1) as f64 * 1e3 / c.scenario.run.rate_hz;
    let mut run = c.scenario.run.clone();
    run.tfs = Some(run.tfs.unwrap_or(MAX_TFS).min(MAX_TFS));
    run.rate_hz = run.rate_hz.min(MAX_RATE_HZ);
    run.stf_size = run.stf_size.replace("256KiB", "64KiB");
    run.prerun_timeout_s = 30.0;
    let real_s = run.tfs.unwrap_or(MAX_TFS) as f64 / run.rate_hz;
    let mut faults = Vec::new();
    for f in &c.scenario.faults {
        let node = match f.node {
            Peer::Flp(i) => format!("flp {i}"),
            Peer::Epn(i) => format!("epn {i}"),
            Peer::Icn => "icn".into(),
        };
        // The same moment of the run, on the real run's clock.
        let at_s = Some(f.at_ms as f64 / sim_ms.max(1.0) * real_s);
        let (action, back_ms) = match f.kind {
            FaultKind::Kill { restart_ms } => (Action::Kill, restart_ms),
            FaultKind::Freeze { ms } => (Action::Stop, Some(ms)),
            _ => unreachable!("Kinds::Processes draws kills and freezes only"),
        };
        faults.push(Fault {
            node,
            action,
            at_s,
            restart_after_s: back_ms.map(|ms| ms as f64 / 1e3),
            after_tfs: None,
        });
    }
    if run.registry == fanin_node::config::Registry::ZooKeeper && (seed / 2).is_multiple_of(2) {
        faults.push(icn_fault(seed, real_s));
    }
    RealCase {
        seed,
        run,
        faults,
        expect: c.expect,
    }
}

/// The ICN killed (-9), or frozen for 2-4 s (past its session time-out), between 30 %
/// and 70 % of the run; the moment and the freeze drawn from the seed.
fn icn_fault(seed: u64, real_s: f64) -> Fault {
    let draw = |k: u64| {
        let bits = seed.wrapping_add(k).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11;
        bits as f64 / (1u64 << 53) as f64
    };
    let freeze = (seed / 4) % 2 == 1;
    Fault {
        node: "icn".into(),
        action: if freeze { Action::Stop } else { Action::Kill },
        at_s: Some((0.3 + 0.4 * draw(0)) * real_s),
        restart_after_s: freeze.then(|| 2.0 + 2.0 * draw(1)),
        after_tfs: None,
    }
}

/// Runs a real case in `dir`; its broken promises (none: kept).
pub async fn run_real(c: &RealCase, dir: &Path) -> anyhow::Result<Vec<String>> {
    let plan = crate::node_plan::NodePlan::default();
    let prefix = format!("seed {}", c.seed);
    let ran = crate::cluster::run_on(&c.run, dir, &prefix, None, &c.faults, &plan, None).await;
    let s = match ran {
        Ok((s, _)) => s,
        Err(e) => return Ok(vec![format!("the run failed: {e:#}")]),
    };
    let mut v = check::accounting(&s);
    v.extend(rows(&dir.join("tfs.csv"), s.issued));
    v.extend(check::zero_loss(&s, c.expect));
    Ok(v)
}

/// The ICN's tfs.csv: one row per TF issued, no id twice.
fn rows(path: &Path, issued: u64) -> Vec<String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => return vec![format!("{}: {e}", path.display())],
    };
    let mut ids = Vec::new();
    let mut v = Vec::new();
    for l in text.lines().skip(1) {
        match l.split(',').next().and_then(|f| f.parse::<u64>().ok()) {
            Some(id) => ids.push(id),
            None => v.push(format!("tfs.csv: bad row {l:?}")),
        }
    }
    v.extend(check::once_each(ids.into_iter(), issued));
    v
}

/// `results/chaos-real-<seed>`: where a real case's files go.
pub fn case_dir(results: &Path, seed: u64) -> PathBuf {
    results.join(format!("chaos-real-{seed}"))
}
