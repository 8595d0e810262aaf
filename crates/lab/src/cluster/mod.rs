//! One run of a cluster of real processes: the registry, the ICN (and a standby when an
//! ICN fault is planned), every EPN and FLP, the faults, progress, and the summary.

mod ending;
pub mod icn_lines;
mod launcher;

use std::path::Path;

use anyhow::Context;
use std::sync::Arc;
use std::time::Duration;

use fanin_node::config::Checked;
use fanin_node::{RunConfig, Summary};
use indicatif::{ProgressBar, ProgressStyle};
use tokio::sync::mpsc;

use crate::faults::{self, Action, Fault, FaultResult, Injector, Nodes, Planned};
use crate::process::Interrupts;
use crate::testbed::netfault::NetFaults;
pub use icn_lines::IcnLine;
pub use launcher::OnTestbed;
use launcher::{IcnOut, Launcher};

/// Runs one configuration once on loopback and returns its summary.
pub async fn run_one(cfg: &RunConfig, dir: &Path, prefix: &str) -> anyhow::Result<Summary> {
    let plan = crate::node_plan::NodePlan::default();
    Ok(run_on(cfg, dir, prefix, None, &[], &plan, None).await?.0)
}

/// Runs one configuration once, on loopback or on a testbed, with `faults` injected, and
/// returns its summary and what each fault did.
pub async fn run_on(
    cfg: &RunConfig,
    dir: &Path,
    prefix: &str,
    net: Option<&OnTestbed>,
    faults: &[Fault],
    node_plan: &crate::node_plan::NodePlan,
    interrupts: Option<Interrupts>,
) -> anyhow::Result<(Summary, Vec<FaultResult>)> {
    let checked = cfg.check()?;
    let (goats, planned) = plan(faults, cfg, net.is_some())?;
    let icn_fault = planned.iter().any(|p| p.name == "ICN");
    let mut l = Launcher::new(cfg, dir, net)?;
    l.node_plan = node_plan;
    let zk_server = l.start_registry()?;
    let zk = zk_server
        .as_ref()
        .map(|z| (z.port(), cfg.zk_tick_ms, cfg.zk_session_timeout_ms));
    let net_faults = net.map(|n| net_faults(n, &planned, zk)).transpose()?;
    let icn = l.start_icn().await?;
    let mut standby = if icn_fault {
        Some(l.start_standby()?)
    } else {
        None
    };
    let mut procs = l.start_nodes(&icn.control, &goats)?;
    procs.push(l.icn_proc(icn.child));
    let nodes: Nodes = Arc::new(tokio::sync::Mutex::new(procs));
    let mut watch = Watch {
        heard: Arc::new(std::sync::Mutex::new(tokio::time::Instant::now())),
        last_progress: None,
        planned,
        net_faults,
        nodes: nodes.clone(),
        injector: None,
        takeover: Takeover::default(),
        bar: progress_bar(&checked, prefix),
        interrupts,
        standby_pid: standby.as_ref().and_then(|s| s.0.id()),
    };
    let limit = time_limit(cfg, &checked, icn_fault);
    let heard = watch.heard.clone();
    let follow = watch.follow(icn.lines, standby.as_mut().map(|s| &mut s.1));
    let timed_out = tokio::select! {
        _ = follow => false,
        _ = limit.reached(&heard) => true,
    };
    watch.bar.finish_and_clear();
    let injected = watch.injector.map(Injector::finish).unwrap_or_default();
    if timed_out {
        anyhow::bail!("run did not finish: {limit}; see {}", dir.display());
    }
    let took_over = watch.takeover.elected_unix_us.is_some();
    let status = ending::wait_icns(&nodes, standby.as_mut().map(|s| &mut s.0), took_over).await?;
    // The run ended (RunStop went out) when the ICN wrote its summary, even if it exits
    // with an error after it (a broken invariant): its nodes may still be finishing.
    let ended = status.success() || dir.join(Summary::JSON_FILE).exists();
    let outside = ending::outside_the_run(dir, &injected, took_over);
    let exit_wait = (node_plan.epn_exit_wait(), ended, outside);
    ending::reap_nodes(&nodes, &injected, (prefix, dir), exit_wait).await;
    ending::summary(dir, status, &injected, watch.takeover)
}

/// The testbed's network faults for this run (`zk`: its own ZooKeeper server's port,
/// tick and session time-out): each fault checked against the placement, and what an
/// earlier run left on the testbed undone, before anything runs (also without faults).
fn net_faults(
    n: &OnTestbed,
    planned: &[Planned],
    zk: Option<(u16, u64, u64)>,
) -> anyhow::Result<Arc<NetFaults>> {
    let nf = NetFaults::new(n.spec.clone(), &n.place, zk);
    for p in planned {
        if let Some(f) = &p.net {
            nf.commands(&p.name, f, 0)
                .with_context(|| format!("fault {} {}", p.fault.action.name(), p.name))?;
        }
    }
    nf.prepare()?;
    Ok(Arc::new(nf))
}

/// The goats among the faults (node, complete TFs before dying), and every fault.
type Plan = (Vec<(String, u64)>, Vec<Planned>);

fn plan(faults: &[Fault], cfg: &RunConfig, on_testbed: bool) -> anyhow::Result<Plan> {
    let mut goats = Vec::new();
    let mut planned = Vec::new();
    for f in faults {
        let name = f.node_name(cfg.flps, cfg.epns)?;
        if f.action == Action::Goat {
            goats.push((name.clone(), f.after_tfs.unwrap_or(0)));
        }
        let net = match f.action.on_network() {
            false => None,
            true if on_testbed => Some(f.net_fault(cfg.flps, cfg.epns)?),
            true => anyhow::bail!(
                "fault {name}: {} acts on the network and needs a testbed ([testbed], not --local)",
                f.action.name()
            ),
        };
        planned.push(Planned {
            name,
            fault: f.clone(),
            net,
        });
    }
    Ok((goats, planned))
}

fn progress_bar(checked: &Checked, prefix: &str) -> ProgressBar {
    let bar = match checked.total_tfs {
        Some(n) => ProgressBar::new(n),
        None => ProgressBar::new_spinner(),
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} TFs ended {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_prefix(prefix.to_string());
    bar
}

/// When the launcher gives up on a run: after its whole length (and that again for a
/// standby's take-over), or, for a run whose length is its TFs alone (unthrottled),
/// once the ICN reported no progress (no TF issued or ended, no other line) for as long
/// as a pre-run and a drain take.
fn time_limit(cfg: &RunConfig, checked: &Checked, icn_fault: bool) -> Limit {
    let prerun = Duration::from_secs_f64(cfg.prerun_timeout_s);
    let quiet = prerun + checked.drain_timeout() + Duration::from_secs(60);
    let Some(run) = checked.configured_duration else {
        return Limit::Quiet(quiet);
    };
    let mut limit = run + quiet;
    if icn_fault {
        // The standby runs the whole run again after its election.
        limit += run
            + checked.drain_timeout()
            + Duration::from_millis(cfg.zk_session_timeout_ms)
            + prerun;
    }
    Limit::Total(limit)
}

/// How long a run may take (`time_limit`).
#[derive(Debug, Clone, Copy)]
enum Limit {
    Total(Duration),
    /// Without news from the ICN (its progress lines come 4 times a second; one that
    /// counts what the last one counted is none).
    Quiet(Duration),
}

impl Limit {
    /// Resolves once the limit is reached (`heard`: when the ICN last said something).
    async fn reached(self, heard: &std::sync::Mutex<tokio::time::Instant>) {
        match self {
            Limit::Total(d) => tokio::time::sleep(d).await,
            Limit::Quiet(d) => loop {
                let until = *heard.lock().expect("heard lock") + d;
                if tokio::time::Instant::now() >= until {
                    return;
                }
                tokio::time::sleep_until(until).await;
            },
        }
    }
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Limit::Total(d) => write!(f, "not within {d:?}"),
            Limit::Quiet(d) => write!(f, "the ICN reported no progress for {d:?}"),
        }
    }
}

/// A standby's take-over, in UNIX µs: when it was elected, when its run started.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Takeover {
    /// When the first ICN's run started: every fault time is relative to it.
    pub first_started_unix_us: Option<u64>,
    pub elected_unix_us: Option<u64>,
    pub started_unix_us: Option<u64>,
}

/// Follows a run from the launcher's side: the ICN's lines, faults started with the run,
/// a standby's take-over, the progress bar.
struct Watch {
    /// When the ICN (or the standby) last said something new, and its last progress.
    heard: Arc<std::sync::Mutex<tokio::time::Instant>>,
    last_progress: Option<(u64, u64)>,
    planned: Vec<Planned>,
    net_faults: Option<Arc<NetFaults>>,
    nodes: Nodes,
    injector: Option<Injector>,
    takeover: Takeover,
    bar: ProgressBar,
    /// The operator's stop requests: the first is passed on to the ICN (SIGTERM).
    interrupts: Option<Interrupts>,
    standby_pid: Option<u32>,
}

impl Watch {
    /// Reads the ICN's lines until it ends (after a take-over: the standby's).
    async fn follow(
        &mut self,
        mut lines: IcnOut,
        mut standby: Option<&mut mpsc::Receiver<String>>,
    ) {
        let mut on_standby = false;
        loop {
            let interrupted = async {
                match self.interrupts.as_mut() {
                    Some(rx) => rx.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            let line = if on_standby {
                let from_standby = async {
                    match standby.as_mut() {
                        Some(rx) => rx.recv().await,
                        None => None,
                    }
                };
                tokio::select! {
                    l = from_standby => l,
                    true = interrupted => {
                        let elected = self.takeover.elected_unix_us.is_some();
                        self.stop_icns(elected).await;
                        continue;
                    }
                }
            } else {
                // The standby speaks only once elected: then the primary is deposed
                // (killed, or frozen and its session expired), whatever its stdout does.
                let from_standby = async {
                    match standby.as_mut() {
                        Some(rx) => rx.recv().await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    l = lines.next_line() => l.ok().flatten(),
                    Some(l) = from_standby => {
                        on_standby = true;
                        Some(l)
                    }
                    true = interrupted => {
                        self.stop_icns(false).await;
                        continue;
                    }
                }
            };
            let Some(line) = line else {
                // The primary ended: was it killed by a fault, with a standby waiting?
                if !on_standby && self.icn_killed() && standby.is_some() {
                    on_standby = true;
                    continue;
                }
                return;
            };
            self.on_line(IcnLine::parse(&line), on_standby);
        }
    }

    /// Asks the ICN to stop issuing and drain, and the standby once it was elected
    /// (before, it is the one that may still end the run: a second Ctrl-C reaches it
    /// then): the leader writes the summary.
    async fn stop_icns(&mut self, elected: bool) {
        let nodes = self.nodes.lock().await;
        for n in nodes.iter().filter(|n| n.name == "ICN") {
            crate::process::signal_child(&n.child, libc::SIGTERM);
        }
        if let Some(pid) = self.standby_pid.filter(|_| elected) {
            crate::process::signal(pid, libc::SIGTERM);
        }
    }

    fn icn_killed(&self) -> bool {
        self.injector.as_ref().is_some_and(|i| {
            i.records
                .lock()
                .expect("records lock")
                .iter()
                .any(|r| r.node == "ICN" && r.at_unix_us.is_some())
        })
    }

    fn on_line(&mut self, line: IcnLine, on_standby: bool) {
        // Heard: anything but a progress line that says what the last one said.
        let news = match line {
            IcnLine::Progress { issued, ended, .. } => {
                self.last_progress.replace((issued, ended)) != Some((issued, ended))
            }
            _ => true,
        };
        if news {
            *self.heard.lock().expect("heard lock") = tokio::time::Instant::now();
        }
        match line {
            IcnLine::Listening { .. } if on_standby => {
                self.takeover.elected_unix_us = Some(faults::unix_us());
            }
            IcnLine::Started { unix_us } if on_standby => {
                self.takeover.started_unix_us = Some(unix_us);
            }
            IcnLine::Started { unix_us } => {
                self.takeover.first_started_unix_us = Some(unix_us);
                if !self.planned.is_empty() {
                    let planned = std::mem::take(&mut self.planned);
                    let (nodes, net) = (self.nodes.clone(), self.net_faults.clone());
                    self.injector = Some(faults::inject(planned, unix_us, nodes, net));
                }
            }
            IcnLine::Progress { issued, ended, .. } => {
                self.bar.set_position(ended);
                self.bar.set_message(format!("(issued {issued})"));
            }
            _ => {}
        }
    }
}
