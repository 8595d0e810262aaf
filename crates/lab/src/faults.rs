//! Fault injection for `fanin run`: `[[fault]]` entries kill (SIGKILL), freeze (SIGSTOP)
//! or "goat" a node at a time offset and bring it back; results line faults up with the ICN.

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

/// What happens to the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// SIGKILL at `at_s`; started again after `restart_after_s`, if given.
    Kill,
    /// SIGSTOP at `at_s`; SIGCONT after `restart_after_s`, if given.
    Stop,
    /// The seed's "Goat": an EPN that crashes after `after_tfs` complete TFs; started
    /// again after `restart_after_s`, if given.
    Goat,
}

impl Action {
    pub const ALL: [Action; 3] = [Action::Kill, Action::Stop, Action::Goat];

    /// As written in `action = "..."`.
    pub fn name(self) -> &'static str {
        match self {
            Action::Kill => "kill",
            Action::Stop => "stop",
            Action::Goat => "goat",
        }
    }
}

/// One `[[fault]]` of an experiment file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    /// `epn N` or `flp N`.
    pub node: String,
    pub action: Action,
    /// Seconds after the run started (kill, stop).
    pub at_s: Option<f64>,
    /// Seconds until the node is started again (kill, goat) or continued (stop).
    pub restart_after_s: Option<f64>,
    /// Goat: complete TFs before it crashes.
    pub after_tfs: Option<u64>,
}

impl Fault {
    /// The node's name as the runtime writes it (`EPN 3`), checked against the run.
    pub fn node_name(&self, flps: u32, epns: u32) -> anyhow::Result<String> {
        if self.node.trim().eq_ignore_ascii_case("icn") {
            return Ok("ICN".into());
        }
        let mut it = self.node.split_whitespace();
        let (role, id) = match (it.next(), it.next().map(str::parse::<u32>), it.next()) {
            (Some(r), Some(Ok(id)), None) => (r.to_ascii_lowercase(), id),
            _ => bail!("fault.node {:?}: expected `epn N` or `flp N`", self.node),
        };
        match role.as_str() {
            "epn" if id < epns => Ok(format!("EPN {id}")),
            "flp" if id < flps => Ok(format!("FLP {id}")),
            "epn" | "flp" => bail!(
                "fault.node {:?}: the run has FLPs 0..{flps} and EPNs 0..{epns}",
                self.node
            ),
            "icn" => bail!("fault.node {:?}: the ICN has no id: `icn`", self.node),
            _ => bail!("fault.node {:?}: expected `epn N` or `flp N`", self.node),
        }
    }

    pub fn check(&self, flps: u32, epns: u32, registry: &Registry) -> anyhow::Result<()> {
        let name = self.node_name(flps, epns)?;
        if name == "ICN" && *registry == Registry::Embedded {
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

/// Faults being injected: what happened so far, and the tasks still at work.
pub struct Injector {
    pub records: Arc<std::sync::Mutex<Vec<Injected>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Injector {
    /// Stops what is still pending (the run is over) and returns what happened.
    pub fn finish(self) -> Vec<Injected> {
        for t in self.tasks {
            t.abort();
        }
        self.records.lock().expect("records lock").clone()
    }
}

/// Starts every fault against the run that started at `start_unix_us`.
pub fn inject(faults: Vec<(String, Fault)>, start_unix_us: u64, nodes: Nodes) -> Injector {
    let records = Arc::new(std::sync::Mutex::new(Vec::new()));
    let tasks = faults
        .into_iter()
        .enumerate()
        .map(|(i, (name, f))| {
            records.lock().expect("records lock").push(Injected {
                node: name.clone(),
                action: Some(f.action),
                ..Default::default()
            });
            let (nodes, records) = (nodes.clone(), records.clone());
            tokio::spawn(async move { inject_one(name, f, start_unix_us, nodes, records, i).await })
        })
        .collect();
    Injector { records, tasks }
}

async fn inject_one(
    name: String,
    f: Fault,
    start: u64,
    nodes: Nodes,
    records: Arc<std::sync::Mutex<Vec<Injected>>>,
    slot: usize,
) {
    let set = |at: Option<u64>, back: Option<u64>| {
        let mut r = records.lock().expect("records lock");
        if at.is_some() {
            r[slot].at_unix_us = at;
        }
        if back.is_some() {
            r[slot].back_unix_us = back;
        }
    };
    let at = match f.action {
        Action::Kill | Action::Stop => {
            sleep_until_unix(start + (f.at_s.unwrap_or(0.0) * 1e6) as u64).await;
            let mut g = nodes.lock().await;
            let Some(n) = g.iter_mut().find(|n| n.name == name) else {
                return;
            };
            // Recorded before the signal, so a reader that sees the node end finds it.
            let at = unix_us();
            set(Some(at), None);
            signal(
                &n.child,
                if f.action == Action::Kill {
                    libc::SIGKILL
                } else {
                    libc::SIGSTOP
                },
            );
            at
        }
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
    };
    set(Some(at), None);
    let Some(after) = f.restart_after_s else {
        return;
    };
    sleep_until_unix(at + (after * 1e6) as u64).await;
    let mut g = nodes.lock().await;
    if let Some(n) = g.iter_mut().find(|n| n.name == name) {
        match f.action {
            Action::Stop => signal(&n.child, libc::SIGCONT),
            Action::Kill | Action::Goat => {
                let _ = n.child.wait().await;
                match (n.respawn)() {
                    Ok(c) => n.child = c,
                    Err(e) => {
                        tracing::warn!("restarting {name}: {e:#}");
                        return;
                    }
                }
            }
        }
        set(None, Some(unix_us()));
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
                action: i
                    .action
                    .map(|a| format!("{a:?}").to_lowercase())
                    .unwrap_or_default(),
                at_s: at,
                detect_ms: lost.zip(at).map(|(e, a)| ((e.t_s - a) * 1e3).max(0.0)),
                rejoin_ms: rejoined
                    .zip(back)
                    .map(|(e, b)| ((e.t_s - b) * 1e3).max(0.0)),
                reassigned: lost.map(|e| e.reassigned).unwrap_or(0),
                dropped_at_loss: lost.map(|e| e.dropped).unwrap_or(0),
                policy_us: lost.map(|e| e.policy_us),
                outage_tfs,
            }
        })
        .collect()
}

pub fn render(r: &[FaultResult]) -> String {
    let ms = |v: Option<f64>| v.map(|x| format!("{x:.0}")).unwrap_or("-".into());
    let mut t = format!(
        "  {:<8} {:<6} {:>8} {:>10} {:>10} {:>11} {:>8} {:>10}  {}\n",
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
            "  {:<8} {:<6} {:>8} {:>10} {:>10} {:>11} {:>8} {:>10}  {}\n",
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
            restart_after_s: None,
            after_tfs: None,
        }
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
