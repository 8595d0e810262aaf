//! Fault injection for `fanin run`: `[[fault]]` entries kill (SIGKILL), freeze (SIGSTOP)
//! or "goat" a node at a time offset and bring it back, and on a testbed part, slow or
//! reset its network (`testbed/netfault.rs`); results line faults up with the ICN.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use fanin_node::config::Registry;
use fanin_node::Summary;
use serde::Deserialize;
use tokio::process::Child;
use tokio::sync::Mutex;

use crate::testbed::netfault::{NetFault, NetFaults};

/// What happens to the node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// SIGKILL at `at_s`; started again after `restart_after_s`, if given.
    #[default]
    Kill,
    /// SIGSTOP at `at_s`; SIGCONT after `restart_after_s`, if given.
    Stop,
    /// The seed's "Goat": an EPN that crashes after `after_tfs` complete TFs; started
    /// again after `restart_after_s`, if given.
    Goat,
    /// Testbed: the node and `peer` (the ICN when absent) cannot reach each other for
    /// `for_s` (from the ICN the node keeps its ZooKeeper session).
    Partition,
    /// Testbed: the node's links send at `rate` for `for_s`.
    Slow,
    /// Testbed: the node's connections to the ICN, or (an FLP's) to EPN `peer`, are reset.
    Reset,
    /// Testbed, ZooKeeper: the node's ZooKeeper traffic is cut until its session expired.
    ExpireSession,
}

impl Action {
    pub const ALL: [Action; 7] = [
        Action::Kill,
        Action::Stop,
        Action::Goat,
        Action::Partition,
        Action::Slow,
        Action::Reset,
        Action::ExpireSession,
    ];

    /// As written in `action = "..."`.
    pub fn name(self) -> &'static str {
        match self {
            Action::Kill => "kill",
            Action::Stop => "stop",
            Action::Goat => "goat",
            Action::Partition => "partition",
            Action::Slow => "slow",
            Action::Reset => "reset",
            Action::ExpireSession => "expire-session",
        }
    }

    /// Does it act on the network (a testbed) rather than on the process?
    pub fn on_network(self) -> bool {
        !matches!(self, Action::Kill | Action::Stop | Action::Goat)
    }
}

/// One `[[fault]]` of an experiment file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    /// `epn N` or `flp N`.
    pub node: String,
    pub action: Action,
    /// Seconds after the run started (every action but goat).
    pub at_s: Option<f64>,
    /// Seconds until the node is started again (kill, goat) or continued (stop).
    pub restart_after_s: Option<f64>,
    /// Goat: complete TFs before it crashes.
    pub after_tfs: Option<u64>,
    /// Partition: the other side (`epn N`, `flp N`; the ICN when absent). Reset: the
    /// EPN whose data connections an FLP loses (its control connection when absent).
    #[serde(default)]
    pub peer: Option<String>,
    /// Partition, slow: how long, in seconds; expire-session: how long its ZooKeeper
    /// traffic is cut (default: twice the session time-out, plus two ticks).
    #[serde(default)]
    pub for_s: Option<f64>,
    /// Slow: the link rate meanwhile, e.g. `10mbit`.
    #[serde(default)]
    pub rate: Option<String>,
}

impl Fault {
    /// The node's name as the runtime writes it (`EPN 3`), checked against the run.
    pub fn node_name(&self, flps: u32, epns: u32) -> anyhow::Result<String> {
        runtime_name("fault.node", &self.node, flps, epns)
    }

    /// The peer's name as the runtime writes it (`ICN` when absent).
    pub fn peer_name(&self, flps: u32, epns: u32) -> anyhow::Result<String> {
        match &self.peer {
            Some(p) => runtime_name("fault.peer", p, flps, epns),
            None => Ok("ICN".into()),
        }
    }

    pub fn check(&self, flps: u32, epns: u32, registry: &Registry) -> anyhow::Result<()> {
        let name = self.node_name(flps, epns)?;
        self.fields_used(&name)?;
        if name == "ICN" && *registry == Registry::Embedded && !self.action.on_network() {
            bail!("fault icn: the ICN fails over to a standby ICN, which needs a ZooKeeper registry (registry = \"zookeeper\")");
        }
        let secs = |v: Option<f64>, f: &str| -> anyhow::Result<()> {
            match v {
                Some(x) if !(x.is_finite() && (0.0..=86_400.0).contains(&x)) => {
                    bail!("fault {name}: {f} = {x} is not within 0..=86400 s")
                }
                _ => Ok(()),
            }
        };
        secs(self.at_s, "at_s")?;
        secs(self.restart_after_s, "restart_after_s")?;
        secs(self.for_s, "for_s")?;
        if self.action.on_network() {
            return self.check_network(&name, flps, epns, registry);
        }
        match self.action {
            Action::Kill | Action::Stop if self.at_s.is_none() => {
                bail!("fault {name}: {:?} needs at_s", self.action)
            }
            Action::Goat if !name.starts_with("EPN") => {
                bail!("fault {name}: a goat is an EPN")
            }
            Action::Goat if self.after_tfs.is_none() => bail!("fault {name}: goat needs after_tfs"),
            _ => Ok(()),
        }
    }

    /// A field given to an action that does not use it is refused, not ignored.
    fn fields_used(&self, name: &str) -> anyhow::Result<()> {
        use Action::*;
        let a = self.action;
        let given = [
            (
                "restart_after_s",
                self.restart_after_s.is_some(),
                matches!(a, Kill | Stop | Goat),
            ),
            ("after_tfs", self.after_tfs.is_some(), a == Goat),
            ("peer", self.peer.is_some(), matches!(a, Partition | Reset)),
            (
                "for_s",
                self.for_s.is_some(),
                matches!(a, Partition | Slow | ExpireSession),
            ),
            ("rate", self.rate.is_some(), a == Slow),
        ];
        match given.iter().find(|(_, set, used)| *set && !*used) {
            Some((field, _, _)) => bail!("fault {name}: {} takes no {field}", a.name()),
            None => Ok(()),
        }
    }

    /// The fields a network fault needs (that it runs on a testbed is the run's check).
    fn check_network(
        &self,
        name: &str,
        flps: u32,
        epns: u32,
        registry: &Registry,
    ) -> anyhow::Result<()> {
        let a = self.action.name();
        let peer = self.peer_name(flps, epns)?;
        if name == "ICN" {
            bail!("fault ICN: {a}: name the FLP or EPN; the ICN is the peer when none is named");
        }
        if self.at_s.is_none() {
            bail!("fault {name}: {a} needs at_s");
        }
        match self.action {
            Action::Partition | Action::Slow if self.for_s.is_none() => {
                bail!("fault {name}: {a} needs for_s (how long, seconds)")
            }
            Action::Partition if peer == name => bail!("fault {name}: partition from itself"),
            Action::Slow => match &self.rate {
                None => bail!("fault {name}: slow needs rate (e.g. \"10mbit\")"),
                Some(r) => crate::testbed::spec::parse_rate(r)
                    .map(|_| ())
                    .map_err(|e| anyhow::anyhow!("fault {name}: rate: {e:#}")),
            },
            Action::Reset
                if peer != "ICN" && !(name.starts_with("FLP") && peer.starts_with("EPN")) =>
            {
                bail!("fault {name}: reset with a peer is an FLP's data connections to an EPN")
            }
            Action::ExpireSession if *registry != Registry::ZooKeeper => {
                bail!("fault {name}: expire-session needs registry = \"zookeeper\"")
            }
            _ => Ok(()),
        }
    }

    /// What a network fault asks of the testbed (after `check`).
    pub fn net_fault(&self, flps: u32, epns: u32) -> anyhow::Result<NetFault> {
        let peer = match self.peer_name(flps, epns)? {
            p if p == "ICN" => None,
            p => Some(p),
        };
        Ok(match self.action {
            Action::Partition => NetFault::Partition { peer },
            Action::Reset => NetFault::Reset { peer },
            Action::ExpireSession => NetFault::ExpireSession,
            Action::Slow => NetFault::Slow {
                rate_bps: crate::testbed::spec::parse_rate(self.rate.as_deref().unwrap_or(""))?,
            },
            a => bail!("fault {}: {} is not a network fault", self.node, a.name()),
        })
    }
}

/// `icn`, `epn N` or `flp N` (any case) as the runtime writes it, checked against the run.
fn runtime_name(field: &str, s: &str, flps: u32, epns: u32) -> anyhow::Result<String> {
    if s.trim().eq_ignore_ascii_case("icn") {
        return Ok("ICN".into());
    }
    let mut it = s.split_whitespace();
    let (role, id) = match (it.next(), it.next().map(str::parse::<u32>), it.next()) {
        (Some(r), Some(Ok(id)), None) => (r.to_ascii_lowercase(), id),
        _ => bail!("{field} {s:?}: expected `epn N` or `flp N`"),
    };
    match role.as_str() {
        "epn" if id < epns => Ok(format!("EPN {id}")),
        "flp" if id < flps => Ok(format!("FLP {id}")),
        "epn" | "flp" => bail!("{field} {s:?}: the run has FLPs 0..{flps} and EPNs 0..{epns}"),
        "icn" => bail!("{field} {s:?}: the ICN has no id: `icn`"),
        _ => bail!("{field} {s:?}: expected `epn N` or `flp N`"),
    }
}

/// A node process of a run, with what it takes to start it again.
pub struct NodeProc {
    pub name: String,
    pub child: Child,
    pub respawn: Box<dyn Fn() -> anyhow::Result<Child> + Send + Sync>,
}

pub type Nodes = Arc<Mutex<Vec<NodeProc>>>;

/// What the injector did, in wall-clock µs since the UNIX epoch.
#[derive(Debug, Clone, Default)]
pub struct Injected {
    pub node: String,
    pub action: Option<Action>,
    pub at_unix_us: Option<u64>,
    pub back_unix_us: Option<u64>,
    /// Why it could not be applied or undone (a network fault's failed command).
    pub error: Option<String>,
}

pub fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

async fn sleep_until_unix(t_us: u64) {
    let now = unix_us();
    if t_us > now {
        tokio::time::sleep(Duration::from_micros(t_us - now)).await;
    }
}

fn signal(child: &Child, sig: i32) {
    crate::process::signal_child(child, sig);
}

/// A fault of a run, checked: the node's name as the runtime writes it and, for a
/// network fault, what it asks of the testbed.
#[derive(Debug, Clone)]
pub struct Planned {
    pub name: String,
    pub fault: Fault,
    pub net: Option<NetFault>,
}

/// Faults being injected: what happened so far, and the tasks still at work.
pub struct Injector {
    pub records: Arc<std::sync::Mutex<Vec<Injected>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    net: Option<Arc<NetFaults>>,
}

impl Injector {
    /// Stops what is still pending (the run is over), heals the network, and returns
    /// what happened.
    pub fn finish(self) -> Vec<Injected> {
        for t in self.tasks {
            t.abort();
        }
        if let Some(n) = &self.net {
            n.heal_all();
        }
        self.records.lock().expect("records lock").clone()
    }
}

/// Where one fault writes what happened.
#[derive(Clone)]
struct Record {
    records: Arc<std::sync::Mutex<Vec<Injected>>>,
    slot: usize,
}

impl Record {
    fn failed(&self, e: String) {
        tracing::warn!("{e}");
        self.records.lock().expect("records lock")[self.slot].error = Some(e);
    }

    fn set(&self, at: Option<u64>, back: Option<u64>) {
        let mut r = self.records.lock().expect("records lock");
        if at.is_some() {
            r[self.slot].at_unix_us = at;
        }
        if back.is_some() {
            r[self.slot].back_unix_us = back;
        }
    }
}

/// Starts every fault against the run that started at `start_unix_us`; network faults
/// act through `net` (a testbed's, checked by the run).
pub fn inject(
    faults: Vec<Planned>,
    start_unix_us: u64,
    nodes: Nodes,
    net: Option<Arc<NetFaults>>,
) -> Injector {
    let records = Arc::new(std::sync::Mutex::new(Vec::new()));
    let tasks = faults
        .into_iter()
        .enumerate()
        .map(|(slot, p)| {
            records.lock().expect("records lock").push(Injected {
                node: p.name.clone(),
                action: Some(p.fault.action),
                ..Default::default()
            });
            let rec = Record {
                records: records.clone(),
                slot,
            };
            let (nodes, net) = (nodes.clone(), net.clone());
            tokio::spawn(async move {
                match (p.net.clone(), net) {
                    (Some(nf), Some(net)) => on_network(p, nf, start_unix_us, net, rec).await,
                    _ => inject_one(p.name, p.fault, start_unix_us, nodes, rec).await,
                }
            })
        })
        .collect();
    Injector {
        records,
        tasks,
        net,
    }
}

/// A network fault: applied at its time, healed `for_s` later (a session expiry: once
/// the session is past its time-out; a reset has nothing to heal).
async fn on_network(p: Planned, nf: NetFault, start: u64, net: Arc<NetFaults>, rec: Record) {
    sleep_until_unix(start + (p.fault.at_s.unwrap_or(0.0) * 1e6) as u64).await;
    let at = unix_us();
    rec.set(Some(at), None);
    let (n, name) = (net.clone(), p.name.clone());
    let started = tokio::task::spawn_blocking(move || n.start(&name, &nf)).await;
    let key = match started {
        Ok(Ok(Some(key))) => key,
        // A reset is over as it happens: the node is not left down.
        Ok(Ok(None)) => return rec.set(None, Some(at)),
        Ok(Err(e)) => return rec.failed(format!("fault {}: {e:#}", p.name)),
        Err(e) => return rec.failed(format!("fault {}: {e}", p.name)),
    };
    let for_s = match p.fault.action {
        Action::ExpireSession => p.fault.for_s.unwrap_or_else(|| net.expiry_cut_s()),
        _ => p.fault.for_s.unwrap_or(0.0),
    };
    sleep_until_unix(at + (for_s * 1e6) as u64).await;
    match tokio::task::spawn_blocking(move || net.heal(key)).await {
        Ok(Ok(())) => rec.set(None, Some(unix_us())),
        Ok(Err(e)) => rec.failed(format!("healing fault {}: {e:#}", p.name)),
        Err(e) => rec.failed(format!("healing fault {}: {e}", p.name)),
    }
}

async fn inject_one(name: String, f: Fault, start: u64, nodes: Nodes, rec: Record) {
    let at = match f.action {
        Action::Goat => loop {
            // It dies by itself: notice when.
            {
                let mut g = nodes.lock().await;
                let Some(n) = g.iter_mut().find(|n| n.name == name) else {
                    return;
                };
                if let Ok(Some(_)) = n.child.try_wait() {
                    break unix_us();
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        },
        Action::Partition | Action::Slow | Action::Reset | Action::ExpireSession => {
            return rec.failed(format!("fault {name}: a network fault is not a signal"));
        }
        Action::Kill | Action::Stop => {
            sleep_until_unix(start + (f.at_s.unwrap_or(0.0) * 1e6) as u64).await;
            let mut g = nodes.lock().await;
            let Some(n) = g.iter_mut().find(|n| n.name == name) else {
                return;
            };
            // Recorded before the signal, so a reader that sees the node end finds it.
            let at = unix_us();
            rec.set(Some(at), None);
            signal(
                &n.child,
                if f.action == Action::Stop {
                    libc::SIGSTOP
                } else {
                    libc::SIGKILL
                },
            );
            at
        }
    };
    rec.set(Some(at), None);
    let Some(after) = f.restart_after_s else {
        return;
    };
    sleep_until_unix(at + (after * 1e6) as u64).await;
    let mut g = nodes.lock().await;
    if let Some(n) = g.iter_mut().find(|n| n.name == name) {
        if f.action == Action::Stop {
            signal(&n.child, libc::SIGCONT);
        } else {
            let _ = n.child.wait().await;
            match (n.respawn)() {
                Ok(c) => n.child = c,
                Err(e) => {
                    tracing::warn!("restarting {name}: {e:#}");
                    return;
                }
            }
        }
        rec.set(None, Some(unix_us()));
    }
}

/// One fault's outcome: detection (fault -> out of the schedule), rejoin (back ->
/// in the schedule again), TFs moved or dropped at the loss, and the TFs issued during
/// the outage by status.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FaultResult {
    pub node: String,
    pub action: String,
    pub at_s: Option<f64>,
    pub detect_ms: Option<f64>,
    pub rejoin_ms: Option<f64>,
    pub reassigned: u64,
    pub dropped_at_loss: u64,
    /// Time the policy took to drop the node from its table (µs).
    pub policy_us: Option<f64>,
    pub outage_tfs: BTreeMap<String, u64>,
    /// Why the fault could not be applied or undone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Each injected fault's result, its times relative to `origin` (the first run's start,
/// UNIX µs); the summary's own times (relative to its run's start) are shifted onto it.
pub fn results(inj: &[Injected], s: &Summary, dir: &Path, origin: u64) -> Vec<FaultResult> {
    let rel = |us: u64| (us as f64 - origin as f64) / 1e6;
    let shift = rel(s.run_start_unix_us);
    let mut s = s.clone();
    for e in &mut s.membership {
        e.t_s += shift;
    }
    let rows: Vec<(f64, String)> = fanin_node::icn::summary::TfCsv::read(dir)
        .into_iter()
        .map(|(t, status)| (t + shift, status))
        .collect();
    inj.iter()
        .map(|i| {
            let at = i.at_unix_us.map(rel);
            let back = i.back_unix_us.map(rel);
            let lost = at.and_then(|a| {
                s.membership
                    .iter()
                    .find(|e| e.node == i.node && e.kind == "lost" && e.t_s >= a - 0.05)
            });
            let rejoined = back.and_then(|b| {
                s.membership
                    .iter()
                    .find(|e| e.node == i.node && e.kind == "rejoined" && e.t_s >= b - 0.05)
            });
            let outage_end = rejoined.map(|e| e.t_s).or(back).unwrap_or(f64::INFINITY);
            let mut outage_tfs = BTreeMap::new();
            if let Some(a) = at {
                for (issued, status) in &rows {
                    if *issued >= a && *issued < outage_end {
                        *outage_tfs.entry(status.clone()).or_default() += 1;
                    }
                }
            }
            FaultResult {
                node: i.node.clone(),
                action: i.action.map(|a| a.name().to_string()).unwrap_or_default(),
                at_s: at,
                detect_ms: lost.zip(at).map(|(e, a)| ((e.t_s - a) * 1e3).max(0.0)),
                rejoin_ms: rejoined
                    .zip(back)
                    .map(|(e, b)| ((e.t_s - b) * 1e3).max(0.0)),
                reassigned: lost.map(|e| e.reassigned).unwrap_or(0),
                dropped_at_loss: lost.map(|e| e.dropped).unwrap_or(0),
                policy_us: lost.map(|e| e.policy_us),
                outage_tfs,
                error: i.error.clone(),
            }
        })
        .collect()
}

pub fn render(r: &[FaultResult]) -> String {
    let ms = |v: Option<f64>| v.map(|x| format!("{x:.0}")).unwrap_or("-".into());
    let mut t = format!(
        "  {:<8} {:<14} {:>8} {:>10} {:>10} {:>11} {:>8} {:>10}  {}\n",
        "node",
        "fault",
        "at s",
        "detect ms",
        "rejoin ms",
        "reassigned",
        "dropped",
        "policy us",
        "TFs issued during the outage"
    );
    for f in r {
        let outage: Vec<String> = f
            .outage_tfs
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        t += &format!(
            "  {:<8} {:<14} {:>8} {:>10} {:>10} {:>11} {:>8} {:>10}  {}\n",
            f.node,
            f.action,
            f.at_s.map(|a| format!("{a:.2}")).unwrap_or("-".into()),
            ms(f.detect_ms),
            ms(f.rejoin_ms),
            f.reassigned,
            f.dropped_at_loss,
            f.policy_us.map(|u| format!("{u:.1}")).unwrap_or("-".into()),
            outage.join(", ")
        );
        if let Some(e) = &f.error {
            t += &format!("    not as planned: {e}\n");
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(node: &str, action: Action) -> Fault {
        Fault {
            node: node.into(),
            action,
            at_s: Some(1.0),
            ..Fault::default()
        }
    }

    #[test]
    fn network_faults_name_what_they_miss() {
        let zk = Registry::ZooKeeper;
        let err = |f: &Fault, reg: &Registry| f.check(2, 3, reg).unwrap_err().to_string();
        let mut p = f("flp 0", Action::Partition);
        assert!(err(&p, &zk).contains("partition needs for_s"));
        p.for_s = Some(0.5);
        assert_eq!(
            p.net_fault(2, 3).unwrap(),
            NetFault::Partition { peer: None }
        );
        p.peer = Some("epn 3".into());
        assert!(err(&p, &zk).contains("fault.peer \"epn 3\""));
        p.peer = Some("epn 2".into());
        p.check(2, 3, &zk).unwrap();
        assert_eq!(
            p.net_fault(2, 3).unwrap(),
            NetFault::Partition {
                peer: Some("EPN 2".into())
            }
        );
        let mut s = f("epn 1", Action::Slow);
        s.for_s = Some(1.0);
        assert!(err(&s, &zk).contains("slow needs rate"));
        s.rate = Some("fast".into());
        assert!(err(&s, &zk).starts_with("fault EPN 1: rate:"));
        s.rate = Some("10mbit".into());
        assert_eq!(
            s.net_fault(2, 3).unwrap(),
            NetFault::Slow {
                rate_bps: 10_000_000
            }
        );
        let mut r = f("epn 0", Action::Reset);
        r.peer = Some("flp 1".into());
        assert!(err(&r, &zk).contains("an FLP's data connections to an EPN"));
        let e = f("epn 0", Action::ExpireSession);
        assert!(err(&e, &Registry::Embedded).contains("needs registry"));
        e.check(2, 3, &zk).unwrap();
        assert!(err(&f("icn", Action::Reset), &zk).contains("name the FLP or EPN"));
    }

    #[test]
    fn faults_are_checked_against_the_run() {
        assert_eq!(f("epn 2", Action::Kill).node_name(2, 3).unwrap(), "EPN 2");
        assert_eq!(f("FLP 1", Action::Stop).node_name(2, 3).unwrap(), "FLP 1");
        let e = f("epn 3", Action::Kill)
            .check(2, 3, &Registry::Embedded)
            .unwrap_err();
        assert!(e.to_string().contains("EPNs 0..3"), "{e}");
        assert!(f("icn", Action::Kill)
            .check(2, 3, &Registry::Embedded)
            .is_err());
        assert!(f("icn", Action::Kill)
            .check(2, 3, &Registry::ZooKeeper)
            .is_ok());
        assert!(f("epn", Action::Kill)
            .check(2, 3, &Registry::Embedded)
            .is_err());
        let mut g = f("flp 0", Action::Goat);
        g.after_tfs = Some(5);
        assert!(g
            .check(2, 3, &Registry::Embedded)
            .unwrap_err()
            .to_string()
            .contains("goat is an EPN"));
        let mut k = f("epn 0", Action::Kill);
        k.at_s = None;
        assert!(k
            .check(2, 3, &Registry::Embedded)
            .unwrap_err()
            .to_string()
            .contains("needs at_s"));
        k.at_s = Some(-1.0);
        assert!(k.check(2, 3, &Registry::Embedded).is_err());
    }
}
