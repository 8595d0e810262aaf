//! The nodes model: the ICN, FLP and EPN cores of fanin-node, unchanged, in simulated
//! time over a simulated network, with faults; same scenario and seed, same bytes out.
//!
//! A scenario is the runtime's own `[run]` table (a `fanin run` experiment's), the
//! network (`[net]`) and a fault schedule (`[[fault]]`). `simulate` runs it to the ICN's
//! summary; `check` holds the outcome against every promise; `chaos` draws scenarios.

pub mod chaos;
pub mod check;
mod epn;
pub mod fault;
mod flp;
mod icn;
mod life;
pub mod net;
mod source;
mod world;
mod zk;

use anyhow::Context;
use fanin_node::icn::ledger::TfRow;
use fanin_node::{RunConfig, Summary};
use serde::{Deserialize, Serialize};

pub use fault::{Fault, FaultKind, Peer};
pub use net::NetConfig;
pub use world::Seen;

use crate::engine::{Time, SEC};

/// Simulated seconds a run may take beyond its length and pre-run time-out (on-data: see
/// `Scenario::limit`).
const TIMER_SLACK_S: f64 = 60.0;
const ON_DATA_SLACK_S: f64 = 600.0;

/// One simulated run.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub run: RunConfig,
    #[serde(default)]
    pub net: NetConfig,
    #[serde(default, rename = "fault")]
    pub faults: Vec<Fault>,
}

/// What a simulated run produced.
pub struct Outcome {
    pub summary: Summary,
    /// The ICN's `tfs.csv` rows, in the order it wrote them.
    pub rows: Vec<TfRow>,
    /// The ICN reached its end (not the simulated-time limit).
    pub ended: bool,
    /// Why the ICN gave the run up, if it did (e.g. a node lost in the pre-run).
    pub fatal: Option<String>,
    pub schedule: fanin_node::config::ScheduleKind,
    pub seen: Seen,
    /// Simulated time at the end.
    pub sim_ns: Time,
    pub events: u64,
}

impl Scenario {
    /// The checked run configuration, or a one-line error naming the field.
    pub fn checked(&self) -> anyhow::Result<fanin_node::config::Checked> {
        anyhow::ensure!(
            !matches!(self.run.registry, fanin_node::config::Registry::Url(_)),
            "run.registry: the nodes model simulates its ZooKeeper: `zookeeper` or `embedded`, not a URL"
        );
        anyhow::ensure!(
            self.net.link_gbps >= 1e-3 && self.net.link_gbps.is_finite(),
            "net.link_gbps must be a number of at least 0.001"
        );
        anyhow::ensure!(
            self.net.latency_us <= 10_000_000,
            "net.latency_us: {} is over 10 s",
            self.net.latency_us
        );
        let zk = self.run.registry == fanin_node::config::Registry::ZooKeeper;
        for f in &self.faults {
            f.check(self.run.flps, self.run.epns)
                .map_err(anyhow::Error::msg)?;
            anyhow::ensure!(
                zk || f.node != Peer::Icn,
                "fault at {} ms: an ICN fault needs run.registry = \"zookeeper\" (its standby takes over through it)",
                f.at_ms
            );
            anyhow::ensure!(
                zk || f.kind != FaultKind::ExpireSession,
                "fault at {} ms: expire-session needs run.registry = \"zookeeper\"",
                f.at_ms
            );
        }
        self.run.check().context("run")
    }

    /// Simulated time after which a run that has not ended is a failure: its length,
    /// the pre-run time-out and a minute; ten for on-data runs (one that lost an FLP for
    /// good with a tight send buffer moves a buffer's worth of TFs per stale time plus
    /// build time-out: minutes, not forever).
    fn limit(&self, c: &fanin_node::config::Checked) -> Time {
        let tfs = c.total_tfs.unwrap_or(0) as f64;
        let length = match (c.configured_duration, self.run.rate_hz > 0.0) {
            (Some(d), _) => d.as_secs_f64(),
            (None, true) => tfs / self.run.rate_hz,
            (None, false) => tfs * 1e-3,
        };
        let faults = self.faults.iter().map(|f| f.at_ms).max().unwrap_or(0) as f64 / 1e3;
        let slack = match self.run.schedule {
            fanin_node::config::ScheduleKind::OnData => ON_DATA_SLACK_S,
            fanin_node::config::ScheduleKind::Timer => TIMER_SLACK_S,
        };
        let s = length.max(faults) + self.run.prerun_timeout_s + slack;
        (s * SEC as f64) as Time
    }
}

/// Runs a scenario to its end (or its time limit).
pub fn simulate(s: &Scenario) -> anyhow::Result<Outcome> {
    let checked = s.checked()?;
    let limit = s.limit(&checked);
    let mut w = world::World::new(checked, net::Net::new(s.net), s.faults.clone());
    let (summary, ended) = w.run(limit);
    Ok(Outcome {
        summary,
        rows: std::mem::take(&mut w.rows),
        ended,
        fatal: w.icn().fatal().map(str::to_string),
        schedule: s.run.schedule,
        sim_ns: w.q.now(),
        events: w.q.processed,
        seen: std::mem::take(&mut w.seen),
    })
}

impl Outcome {
    /// The ICN's `tfs.csv`, as the runtime writes it.
    pub fn tfs_csv(&self) -> String {
        use fanin_node::icn::summary::TfCsv;
        let mut out = format!("{}\n", TfCsv::HEADER);
        for r in &self.rows {
            out += &TfCsv::line(r);
            out.push('\n');
        }
        out
    }
}
#[cfg(test)]
mod tests;
