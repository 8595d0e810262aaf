//! Starting the processes of one run: the registry server, the ICN and its standby, every
//! EPN and FLP, each on loopback or inside its testbed host's namespace, each with its log.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context};
use fanin_node::config::Registry;
use fanin_node::registry::zk_server::{ZkServer, ZkServerOptions};
use fanin_node::{RunConfig, Summary};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use tokio::sync::mpsc;

use super::icn_lines::IcnLine;
use crate::experiment::{ControlNet, Placement};
use crate::faults::NodeProc;
use crate::overrides::clock_run_id;
use crate::testbed::Spec;

/// A testbed and where each node runs on it.
pub struct OnTestbed {
    pub spec: Spec,
    pub place: Placement,
}

impl OnTestbed {
    pub fn new(spec: Spec, place: Placement) -> anyhow::Result<Self> {
        if place.control == ControlNet::Aux && spec.aux.is_none() {
            bail!(
                "the experiment puts control traffic on the auxiliary network, but testbed {} has none (fanin testbed up --aux true)",
                spec.name
            );
        }
        for h in std::iter::once(place.icn)
            .chain(place.flps.iter().copied())
            .chain(place.epns.iter().copied())
        {
            if h > spec.hosts {
                bail!(
                    "the experiment places a node on host {h}, but testbed {} has hosts 1..={}",
                    spec.name,
                    spec.hosts
                );
            }
        }
        Ok(OnTestbed { spec, place })
    }

    pub(super) fn control_ip(&self, h: u32) -> String {
        match self.place.control {
            ControlNet::Aux => self.spec.aux_ip(h).expect("checked in new").to_string(),
            ControlNet::Data => self.spec.data_ip(h).to_string(),
        }
    }
}

/// The ICN's stdout, line by line.
pub(super) type IcnOut = Lines<BufReader<ChildStdout>>;

/// The primary ICN, started: its process, its stdout after the first line, its address.
pub(super) struct StartedIcn {
    pub child: Child,
    pub lines: IcnOut,
    pub control: String,
}

/// A standby ICN: its process and its stdout lines (it speaks once elected).
pub(super) type Standby = (Child, mpsc::Receiver<String>);

/// Starts the processes of one run of `cfg`, writing logs into `dir`.
pub(super) struct Launcher<'a> {
    exe: PathBuf,
    net: Option<&'a OnTestbed>,
    dir: PathBuf,
    cfg: &'a RunConfig,
    cfg_path: PathBuf,
    icn_host: u32,
    icn_control: String,
    /// `--registry URL --session-timeout-ms N` for every process, or nothing.
    registry_args: Vec<String>,
    /// This run's secret, generated here and handed to every process in its
    /// environment: a process of another run, or a stranger, cannot join.
    secret: String,
    /// Each EPN's sinks and delivery flags.
    pub node_plan: &'a crate::node_plan::NodePlan,
}

/// No sinks: EPNs build and discard.
static NO_SINKS: std::sync::LazyLock<crate::node_plan::NodePlan> =
    std::sync::LazyLock::new(Default::default);

impl<'a> Launcher<'a> {
    /// Creates `dir` with the run's `config.toml`.
    pub fn new(cfg: &'a RunConfig, dir: &Path, net: Option<&'a OnTestbed>) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        // Nodes run in the run's directory (relative sink paths land there).
        let dir = &std::path::absolute(dir)?;
        clear_results(dir, cfg.registry == Registry::Embedded)?;
        let cfg_path = dir.join("config.toml");
        std::fs::write(&cfg_path, toml::to_string(cfg)?)?;
        let icn_host = net.map(|n| n.place.icn).unwrap_or(0);
        let icn_control = match net {
            Some(n) => format!("{}:0", n.control_ip(icn_host)),
            None => "127.0.0.1:0".into(),
        };
        Ok(Launcher {
            exe: std::env::current_exe().context("locating the fanin binary")?,
            net,
            dir: dir.to_path_buf(),
            cfg,
            cfg_path,
            icn_host,
            icn_control,
            registry_args: Vec::new(),
            secret: fanin_node::auth::Secret::generate().as_env(),
            node_plan: &NO_SINKS,
        })
    }

    /// The registry every process of this run uses; `zookeeper`: a private server with
    /// the configured tickTime, for this run only (stopped when the returned value drops).
    pub fn start_registry(&mut self) -> anyhow::Result<Option<ZkServer>> {
        let cfg = self.cfg;
        let (server, url) = match &cfg.registry {
            Registry::Embedded => return Ok(None),
            Registry::ZooKeeper => {
                // On a testbed the server runs on the ICN's host, on its control network
                // (the TDR ran ZooKeeper beside the ICN).
                let (netns, bind) = match self.net {
                    Some(n) => (
                        Some(n.spec.host_ns(self.icn_host)),
                        n.control_ip(self.icn_host)
                            .parse()
                            .context("ICN host address")?,
                    ),
                    None => (None, std::net::Ipv4Addr::LOCALHOST),
                };
                let server = ZkServer::start_with(ZkServerOptions {
                    tick_time: Duration::from_millis(cfg.zk_tick_ms),
                    netns,
                    bind,
                    ..Default::default()
                })
                .context(
                    "starting ZooKeeper (Debian package zookeeper; scripts/test installs it)",
                )?;
                let url = server.url("/fanin");
                (Some(server), url)
            }
            Registry::Url(url) => (
                None,
                format!("{}/{}", url.trim_end_matches('/'), clock_run_id()),
            ),
        };
        self.registry_args = vec![
            "--registry".into(),
            url,
            "--session-timeout-ms".into(),
            cfg.zk_session_timeout_ms.to_string(),
        ];
        Ok(server)
    }

    /// `fanin` itself, inside host `h`'s namespace on a testbed.
    fn command(&self, h: u32) -> Command {
        let ns = self.net.map(|n| n.spec.host_ns(h));
        command(&self.exe, ns.as_deref(), &self.secret)
    }

    fn log(&self, name: &str) -> anyhow::Result<Stdio> {
        Ok(std::fs::File::create(self.dir.join(name))
            .with_context(|| format!("creating {name}"))?
            .into())
    }

    fn icn_command(&self, results: &Path, log: &str) -> anyhow::Result<Command> {
        let mut c = self.command(self.icn_host);
        c.args(["icn", "--control", &self.icn_control])
            .args(["--metrics", "127.0.0.1:0", "--progress"])
            .arg("--config")
            .arg(&self.cfg_path)
            .arg("--results-dir")
            .arg(results)
            .args(&self.registry_args)
            .stdout(Stdio::piped())
            .stderr(self.log(log)?)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        Ok(c)
    }

    /// Starts the ICN and waits for its address.
    pub async fn start_icn(&self) -> anyhow::Result<StartedIcn> {
        let mut child = self
            .icn_command(&self.dir, "icn.log")?
            .args(["--run-id", &clock_run_id().to_string()])
            .spawn()
            .context("starting the ICN")?;
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        let first = tokio::time::timeout(Duration::from_secs(15), lines.next_line())
            .await
            .map_err(|_| anyhow::anyhow!("ICN did not report its address within 15 s"))??;
        match first.as_deref().map(IcnLine::parse) {
            Some(IcnLine::Listening { control, .. }) => Ok(StartedIcn {
                child,
                lines,
                control,
            }),
            _ => bail!(
                "ICN failed to start: {}",
                last_line(&self.dir.join("icn.log"))
            ),
        }
    }

    /// An ICN fault needs a standby ICN: the same run and results directory, waiting in
    /// the registry for the leader's session to end; elected, it takes the run over (and
    /// reports its address only then).
    pub fn start_standby(&self) -> anyhow::Result<Standby> {
        let mut child = self
            .icn_command(&self.dir, "icn-standby.log")?
            .arg("--standby")
            .args(["--run-id", &(clock_run_id() + 1).to_string()])
            .spawn()
            .context("starting the standby ICN")?;
        let mut sl = BufReader::new(child.stdout.take().expect("piped")).lines();
        let (tx, rx) = mpsc::channel(1024);
        tokio::spawn(async move {
            while let Ok(Some(l)) = sl.next_line().await {
                if tx.send(l).await.is_err() {
                    return;
                }
            }
        });
        Ok((child, rx))
    }

    /// Starts every EPN and FLP (goats with `--die-after-tfs` on their first start).
    pub fn start_nodes(
        &self,
        control: &str,
        goats: &[(String, u64)],
    ) -> anyhow::Result<Vec<NodeProc>> {
        let mut procs = Vec::new();
        for i in 0..self.cfg.epns {
            let name = format!("EPN {i}");
            // A goat dies once; started again it is an ordinary EPN.
            let first: Vec<String> = match goats.iter().find(|g| g.0 == name) {
                Some((_, n)) => vec!["--die-after-tfs".into(), n.to_string()],
                None => Vec::new(),
            };
            let h = self.net.map(|n| n.place.epns[i as usize]).unwrap_or(0);
            let argv = self.epn_argv(i, h, control);
            procs.push(self.spawn_node(name, h, argv, &format!("epn-{i}.log"), &first)?);
        }
        for i in 0..self.cfg.flps {
            let h = self.net.map(|n| n.place.flps[i as usize]).unwrap_or(0);
            let argv = self.flp_argv(i, h, control);
            procs.push(self.spawn_node(
                format!("FLP {i}"),
                h,
                argv,
                &format!("flp-{i}.log"),
                &[],
            )?);
        }
        Ok(procs)
    }

    /// On a testbed: (data address, control address) of host `h`.
    fn addrs(&self, h: u32) -> (String, Option<String>) {
        match self.net {
            Some(n) => (n.spec.data_ip(h).to_string(), Some(n.control_ip(h))),
            None => ("127.0.0.1".to_string(), None),
        }
    }

    fn epn_argv(&self, i: u32, h: u32, control: &str) -> Vec<String> {
        let (data, ctl) = self.addrs(h);
        let mut a: Vec<String> = vec!["epn".into(), "--icn".into(), control.into()];
        a.extend(["--id".into(), i.to_string()]);
        a.extend(["--data-bind".into(), format!("{data}:0")]);
        a.extend(["--metrics".into(), "127.0.0.1:0".into()]);
        a.extend(["--build-buffer".into(), self.cfg.epn_buffer.to_string()]);
        a.extend(self.node_plan.argv(i));
        if let Some(ctl) = ctl {
            a.extend(["--control-bind".into(), ctl]);
        }
        a.extend(self.registry_args.iter().cloned());
        a
    }

    fn flp_argv(&self, i: u32, h: u32, control: &str) -> Vec<String> {
        let (data, ctl) = self.addrs(h);
        let mut a: Vec<String> = vec!["flp".into(), "--icn".into(), control.into()];
        a.extend(["--id".into(), i.to_string()]);
        a.extend(["--metrics".into(), "127.0.0.1:0".into()]);
        a.extend(["--send-buffer".into(), self.cfg.flp_buffer.to_string()]);
        a.extend(self.node_plan.flp_argv(i));
        if self.net.is_some() {
            a.extend(["--data-bind".into(), data]);
        }
        if let Some(ctl) = ctl {
            a.extend(["--control-bind".into(), ctl]);
        }
        a.extend(self.registry_args.iter().cloned());
        a
    }

    /// Starts one node (its log started afresh) and keeps what it takes to restart it.
    fn spawn_node(
        &self,
        name: String,
        h: u32,
        argv: Vec<String>,
        log: &str,
        first: &[String],
    ) -> anyhow::Result<NodeProc> {
        let path = self.dir.join(log);
        let _ = std::fs::remove_file(&path);
        let spawn = respawner(
            self.exe.clone(),
            self.net.map(|n| n.spec.host_ns(h)),
            argv,
            path,
            self.secret.clone(),
        );
        let child = spawn(first).with_context(|| format!("starting {name}"))?;
        // Started again, it belongs to the run going then: with a registry, a run that
        // ended in the meantime leaves it nothing to join, and it ends at once.
        let again: Vec<String> = match self.registry_args.is_empty() {
            true => Vec::new(),
            false => vec!["--rejoin".into()],
        };
        Ok(NodeProc {
            name,
            child,
            respawn: Box::new(move || spawn(&again)),
        })
    }

    /// The primary ICN is a node too, for faults: started again, it is one more standby.
    pub fn icn_proc(&self, child: Child) -> NodeProc {
        let mut argv: Vec<String> = vec!["icn".into(), "--standby".into()];
        argv.extend(["--control".into(), self.icn_control.clone()]);
        argv.extend(["--config".into(), self.cfg_path.display().to_string()]);
        argv.extend(["--results-dir".into(), self.dir.display().to_string()]);
        argv.extend(self.registry_args.iter().cloned());
        let ns = self.net.map(|n| n.spec.host_ns(self.icn_host));
        let spawn = respawner(
            self.exe.clone(),
            ns,
            argv,
            self.dir.join("icn-restarted.log"),
            self.secret.clone(),
        );
        NodeProc {
            name: "ICN".into(),
            child,
            respawn: Box::new(move || spawn(&[]).context("restarting the ICN")),
        }
    }
}

/// `exe`, inside network namespace `ns` when given; it dies with this process and has
/// a process group of its own (a Ctrl-C at the terminal reaches only the launcher,
/// which stops the run cleanly).
fn command(exe: &Path, ns: Option<&str>, secret: &str) -> Command {
    let mut c = match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    c.env(fanin_node::auth::SECRET_ENV, secret);
    crate::process::die_with_parent(&mut c);
    c.process_group(0);
    c
}

/// A function that starts `exe argv extra...` (in `ns`), appending its stderr to `log`.
fn respawner(
    exe: PathBuf,
    ns: Option<String>,
    argv: Vec<String>,
    log: PathBuf,
    secret: String,
) -> impl Fn(&[String]) -> anyhow::Result<Child> + Send + Sync + 'static {
    move |extra: &[String]| {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("opening {}", log.display()))?;
        let mut cmd = command(&exe, ns.as_deref(), &secret);
        if let Some(run_dir) = log.parent() {
            cmd.current_dir(run_dir);
        }
        cmd.args(&argv)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(out)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", argv[0]))
    }
}

/// The last non-empty line of a log, for one-line errors.
pub(super) fn last_line(p: &Path) -> String {
    std::fs::read_to_string(p)
        .ok()
        .and_then(|t| {
            t.lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map(str::to_string)
        })
        .unwrap_or_else(|| format!("(no output in {})", p.display()))
}

/// Removes what an earlier run left in `dir` (a replayed chaos case, a reused
/// `--results` path): the lab's own files, and without a registry (`embedded`) the
/// summary, which would be read as this run's if this one wrote none. With a registry
/// the ICN decides: a fresh run removes them itself, a run taken over needs them.
fn clear_results(dir: &Path, embedded: bool) -> anyhow::Result<()> {
    let summary = [Summary::JSON_FILE, Summary::CSV_FILE]
        .into_iter()
        .filter(|_| embedded);
    for f in summary.chain(["faults.json", "report.html"]) {
        match std::fs::remove_file(dir.join(f)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("removing {}", dir.join(f).display()))
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_earlier_runs_results_are_cleared_and_the_rest_kept() {
        let left = |embedded| {
            let dir = tempfile::tempdir().unwrap();
            let files = [
                Summary::JSON_FILE,
                Summary::CSV_FILE,
                "faults.json",
                "epn-0.log",
            ];
            for f in files {
                std::fs::write(dir.path().join(f), "old").unwrap();
            }
            clear_results(dir.path(), embedded).unwrap();
            let mut left: Vec<_> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            left.sort();
            left
        };
        assert_eq!(left(true), ["epn-0.log"]);
        // With a registry the ICN decides what an earlier run's summary means.
        let kept = ["epn-0.log", Summary::CSV_FILE, Summary::JSON_FILE];
        assert_eq!(left(false), kept);
    }
}
