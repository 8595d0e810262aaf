//! Faults the nodes model injects, each at a simulated time and on one node: kills (with
//! or without a restart), freezes, reset control or data connections, partitions, slow
//! links, ZooKeeper session expiry; and kills and freezes of the ICN (its standby takes over).
//!
//! A schedule is a list of them, written in experiment files as `[[fault]]` tables and
//! drawn at random by the chaos campaign; `describe` prints one as a line.

use serde::{Deserialize, Serialize};

use super::net::End;

/// What happens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum FaultKind {
    /// The process dies (kill -9); it starts again after `restart_ms`, if given.
    Kill { restart_ms: Option<u64> },
    /// The process stops (SIGSTOP) for `ms`, then goes on as if nothing happened.
    Freeze { ms: u64 },
    /// Its control connection to the ICN is reset (both ends see it closed).
    ResetControl,
    /// FLP only: its data connection to this EPN is reset.
    ResetData { epn: u32 },
    /// It and `peer` cannot reach each other for `ms` (`peer` absent: the ICN).
    Partition { peer: Option<Peer>, ms: u64 },
    /// Its frames take `extra_us` longer for `ms`.
    Slow { extra_us: u64, ms: u64 },
    /// `registry = "zookeeper"`: its ZooKeeper session expires now (its znode goes; it
    /// registers again at once, as the runtime's registry client does).
    ExpireSession,
}

/// A node, as written in a fault: `"flp:0"`, `"epn:3"`, `"icn"` (the ICN leading then).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Peer {
    Flp(u32),
    Epn(u32),
    Icn,
}

impl TryFrom<String> for Peer {
    type Error = String;
    fn try_from(s: String) -> Result<Peer, String> {
        let bad = || format!("node {s:?}: expected flp:N, epn:N or icn");
        if s == "icn" {
            return Ok(Peer::Icn);
        }
        let (role, id) = s.split_once(':').ok_or_else(bad)?;
        let id: u32 = id.parse().map_err(|_| bad())?;
        match role {
            "flp" => Ok(Peer::Flp(id)),
            "epn" => Ok(Peer::Epn(id)),
            _ => Err(bad()),
        }
    }
}

impl From<Peer> for String {
    fn from(p: Peer) -> String {
        match p {
            Peer::Flp(i) => format!("flp:{i}"),
            Peer::Epn(i) => format!("epn:{i}"),
            Peer::Icn => "icn".into(),
        }
    }
}

impl Peer {
    pub fn end(self) -> End {
        match self {
            Peer::Flp(i) => End::Flp(i),
            Peer::Epn(i) => End::Epn(i),
            Peer::Icn => End::Icn,
        }
    }
}

/// One fault of a schedule.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Fault {
    /// Simulated time since the start, ms.
    pub at_ms: u64,
    pub node: Peer,
    #[serde(flatten)]
    pub kind: FaultKind,
}

impl Fault {
    /// One line: "1.250 s: kill EPN 2 (back after 300 ms)".
    pub fn describe(&self) -> String {
        let what = match self.kind {
            FaultKind::Kill { restart_ms: None } => "kill".to_string(),
            FaultKind::Kill {
                restart_ms: Some(ms),
            } => format!("kill (back after {ms} ms)"),
            FaultKind::Freeze { ms } => format!("freeze for {ms} ms"),
            FaultKind::ResetControl => "reset control connection of".into(),
            FaultKind::ResetData { epn } => format!("reset data connection to EPN {epn} of"),
            FaultKind::Partition { peer, ms } => {
                let p = peer.map_or("the ICN".to_string(), |p| p.end().name());
                format!("partition from {p} for {ms} ms:")
            }
            FaultKind::Slow { extra_us, ms } => format!("slow by {extra_us} µs for {ms} ms:"),
            FaultKind::ExpireSession => "expire the ZooKeeper session of".into(),
        };
        let s = self.at_ms as f64 / 1000.0;
        format!("{s:.3} s: {what} {}", self.node.end().name())
    }

    /// A one-line error when the fault names a node the run does not have, or a time
    /// past a year (simulated time in nanoseconds must not overflow).
    pub fn check(&self, flps: u32, epns: u32) -> Result<(), String> {
        const YEAR_MS: u64 = 365 * 24 * 3600 * 1000;
        let times = match self.kind {
            FaultKind::Kill { restart_ms } => [restart_ms.unwrap_or(0), 0],
            FaultKind::Freeze { ms } | FaultKind::Partition { ms, .. } => [ms, 0],
            FaultKind::Slow { extra_us, ms } => [ms, extra_us / 1000],
            _ => [0, 0],
        };
        if let Some(t) = [self.at_ms, times[0], times[1]]
            .into_iter()
            .find(|t| *t > YEAR_MS)
        {
            return Err(format!("fault at {} ms: {t} ms is over a year", self.at_ms));
        }
        let exists = |p: Peer| match p {
            Peer::Flp(i) => i < flps,
            Peer::Epn(i) => i < epns,
            Peer::Icn => true,
        };
        let bad = |p: Peer| format!("fault at {} ms: no {}", self.at_ms, p.end().name());
        if !exists(self.node) {
            return Err(bad(self.node));
        }
        if self.node == Peer::Icn {
            return self.check_icn();
        }
        match self.kind {
            FaultKind::Partition { peer: Some(p), .. } if !exists(p) => Err(bad(p)),
            FaultKind::ResetData { epn } if epn >= epns => Err(bad(Peer::Epn(epn))),
            FaultKind::ResetData { .. } if !matches!(self.node, Peer::Flp(_)) => Err(format!(
                "fault at {} ms: reset-data is for an FLP's connection",
                self.at_ms
            )),
            _ => Ok(()),
        }
    }

    /// The ICN takes kills and freezes (its standby takes the run over; a killed ICN does
    /// not come back itself): the other kinds are written on the node they concern.
    fn check_icn(&self) -> Result<(), String> {
        match self.kind {
            FaultKind::Kill { restart_ms: None } | FaultKind::Freeze { .. } => Ok(()),
            FaultKind::Kill {
                restart_ms: Some(_),
            } => Err(format!(
                "fault at {} ms: restart_ms is for FLPs and EPNs (the ICN's standby takes over)",
                self.at_ms
            )),
            _ => Err(format!(
                "fault at {} ms: the ICN takes kill or freeze (write the others on the node)",
                self.at_ms
            )),
        }
    }
}
