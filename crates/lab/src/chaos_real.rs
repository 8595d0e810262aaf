//! `fanin chaos --real`: the campaign's cases against real processes. Each seed's sim
//! case is scaled to a short real run, its faults become `fanin run` faults, and the
//! run's own files are held to the promises.
//!
//! On loopback a case draws only kills and freezes (SIGKILL, SIGSTOP); with ZooKeeper
//! every other case also kills the ICN (-9) or freezes it past its session, and its
//! standby takes the run over. On the campaign's own testbed (`--testbed`, as root) a
//! case draws every kind the simulated campaign does: partitions, resets, slow links and
//! session expiry act on the hosts' network (`testbed/netfault.rs`), and its ICN faults
//! are the simulated case's own.

use std::path::{Path, PathBuf};

use fanin_node::RunConfig;
use fanin_sim::nodes::check::{self, Expect};
use fanin_sim::nodes::{chaos, FaultKind, Peer};

use crate::cluster::OnTestbed;
use crate::experiment::{ControlNet, Placement};
use crate::faults::{Action, Fault};
use crate::testbed::{self, spec, Spec};

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

/// The real case of `seed`: on a testbed with every fault kind, else kills and freezes.
pub fn real_case(seed: u64, on_testbed: bool) -> RealCase {
    let kinds = match on_testbed {
        true => chaos::Kinds::All,
        false => chaos::Kinds::Processes,
    };
    let c = chaos::case_of(seed, kinds);
    let sim_ms = c.scenario.run.tfs.unwrap_or(1) as f64 * 1e3 / c.scenario.run.rate_hz;
    let mut run = c.scenario.run.clone();
    run.tfs = Some(run.tfs.unwrap_or(MAX_TFS).min(MAX_TFS));
    run.rate_hz = run.rate_hz.min(MAX_RATE_HZ);
    run.stf_size = run.stf_size.replace("256KiB", "64KiB");
    run.prerun_timeout_s = 30.0;
    let real_s = run.tfs.unwrap_or(MAX_TFS) as f64 / run.rate_hz;
    // The same moment of the run, on the real run's clock.
    let at = |ms: u64| ms as f64 / sim_ms.max(1.0) * real_s;
    let mut faults: Vec<Fault> = c
        .scenario
        .faults
        .iter()
        .map(|f| real_fault(f, at(f.at_ms)))
        .collect();
    let zk = run.registry == fanin_node::config::Registry::ZooKeeper;
    if !on_testbed && zk && (seed / 2).is_multiple_of(2) {
        faults.push(icn_fault(seed, real_s));
    }
    RealCase {
        seed,
        run,
        faults,
        expect: c.expect,
    }
}

fn name(p: Peer) -> String {
    match p {
        Peer::Flp(i) => format!("flp {i}"),
        Peer::Epn(i) => format!("epn {i}"),
        Peer::Icn => "icn".into(),
    }
}

/// A simulated fault as `fanin run` injects it, at `at_s` of the real run. Durations
/// stay as drawn; a slow link sends one 1500-byte frame per `extra_us`.
fn real_fault(f: &fanin_sim::nodes::Fault, at_s: f64) -> Fault {
    let mut r = Fault {
        node: name(f.node),
        action: Action::Kill,
        at_s: Some(at_s),
        ..Fault::default()
    };
    let secs = |ms: u64| Some(ms as f64 / 1e3);
    match f.kind {
        FaultKind::Kill { restart_ms } => r.restart_after_s = restart_ms.and_then(secs),
        FaultKind::Freeze { ms } => (r.action, r.restart_after_s) = (Action::Stop, secs(ms)),
        FaultKind::ResetControl => r.action = Action::Reset,
        FaultKind::ResetData { epn } => {
            (r.action, r.peer) = (Action::Reset, Some(name(Peer::Epn(epn))));
        }
        FaultKind::Partition { peer, ms } => {
            (r.action, r.peer, r.for_s) = (Action::Partition, peer.map(name), secs(ms));
        }
        FaultKind::Slow { extra_us, ms } => {
            let bps = 1500 * 8 * 1_000_000 / extra_us.max(1);
            (r.action, r.for_s) = (Action::Slow, secs(ms));
            r.rate = Some(format!("{bps}bit"));
        }
        FaultKind::ExpireSession => r.action = Action::ExpireSession,
    }
    r
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
        ..Fault::default()
    }
}

/// Runs a real case in `dir` (on `tb`, the campaign's testbed, if given); its broken
/// promises (none: kept).
pub async fn run_real(
    c: &RealCase,
    dir: &Path,
    tb: Option<&CampaignTestbed>,
) -> anyhow::Result<Vec<String>> {
    let plan = crate::node_plan::NodePlan::default();
    let prefix = format!("seed {}", c.seed);
    let on = tb.map(|t| t.placed(&c.run)).transpose()?;
    let (run, faults) = (&c.run, &c.faults);
    let ran = crate::cluster::run_on(run, dir, &prefix, on.as_ref(), faults, &plan, None).await;
    let (s, results) = match ran {
        Ok(r) => r,
        Err(e) => return Ok(vec![format!("the run failed: {e:#}")]),
    };
    // A fault that did not happen would let a case pass that tested nothing.
    let mut v: Vec<String> = results.iter().filter_map(|r| r.error.clone()).collect();
    v.extend(check::accounting(&s));
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

/// The campaign's own testbed, `fanin-chaos`: one host for the ICN (with ZooKeeper and
/// the standby), one for each FLP and EPN of the largest case (4 and 6), 10 Gbit/s links.
/// Taken down when dropped; one left by a crashed campaign is taken down first.
pub struct CampaignTestbed {
    spec: Spec,
}

pub const TESTBED: &str = "fanin-chaos";
const HOSTS: u32 = 1 + 4 + 6;

impl CampaignTestbed {
    pub fn up() -> anyhow::Result<Self> {
        testbed::need_root("fanin chaos --real --testbed")?;
        testbed::down(TESTBED)?;
        let spec = Spec {
            name: TESTBED.into(),
            preset: None,
            hosts: HOSTS,
            data: spec::shaping("10gbit", "0", 0.0, "1000p")?,
            aux: None,
        };
        testbed::bring_up(&spec)?;
        Ok(CampaignTestbed { spec })
    }

    /// Host 1 runs the ICN, then each FLP and each EPN a host of its own.
    fn placed(&self, run: &RunConfig) -> anyhow::Result<OnTestbed> {
        let place = Placement {
            name: TESTBED.into(),
            control: ControlNet::Data,
            icn: 1,
            flps: (0..run.flps).map(|i| 2 + i).collect(),
            epns: (0..run.epns).map(|i| 2 + run.flps + i).collect(),
        };
        OnTestbed::new(self.spec.clone(), place)
    }
}

impl Drop for CampaignTestbed {
    fn drop(&mut self) {
        if let Err(e) = testbed::down(TESTBED) {
            eprintln!("fanin chaos: taking testbed {TESTBED} down: {e:#}");
        }
    }
}
