//! `fanin run`: starts an ICN, the EPNs and the FLPs as separate processes (on loopback, or
//! on the hosts of a testbed) for each configuration and repetition, and prints the table.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use fanin_node::{RunConfig, Summary};
use indicatif::{ProgressBar, ProgressStyle};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::experiment::{self, ControlNet, Experiment, Placement};
use crate::faults::{Action, Fault, FaultResult, Injector, NodeProc, Nodes};
use crate::overrides::RunOverrides;
use crate::table::{self, RunRow};
use crate::testbed::{self, Spec};

#[derive(Args)]
pub struct RunArgs {
    /// Experiment file (TOML). Without one, the embedded default experiment runs.
    pub file: Option<PathBuf>,
    /// Directory under which each run's results are written.
    #[arg(long, default_value = "results")]
    pub results: PathBuf,
    /// Repetitions per configuration (overrides the file's `repetitions`).
    #[arg(long)]
    pub repetitions: Option<u32>,
    /// Run only the configurations with these labels (comma separated).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Run on loopback even if the experiment names a testbed.
    #[arg(long)]
    pub local: bool,
    /// On a testbed: seconds of iperf3 from the first FLP's host to the first EPN's host
    /// before the runs, printed as the capacity reference (0 = skip).
    #[arg(long, default_value_t = 5)]
    pub iperf_seconds: u32,
    #[command(flatten)]
    pub overrides: RunOverrides,
}

pub async fn run(a: RunArgs) -> anyhow::Result<()> {
    let mut exp: Experiment = match &a.file {
        Some(p) => experiment::load(p)?,
        None => experiment::parse(experiment::DEFAULT, "default")?,
    };
    if !a.only.is_empty() {
        exp.configs.retain(|c| a.only.contains(&c.label));
        if exp.configs.is_empty() {
            bail!("--only {:?}: no configuration has those labels", a.only);
        }
    }
    for c in &mut exp.configs {
        a.overrides.apply(&mut c.run);
        c.run
            .check()
            .with_context(|| format!("configuration {}", c.label))?;
    }
    let reps = a.repetitions.unwrap_or(exp.repetitions);
    if reps == 0 {
        bail!("--repetitions must be at least 1");
    }
    let root = a.results.join(format!(
        "{}-{}",
        fanin_report::timestamp(),
        fanin_report::sanitize(&exp.name)
    ));
    let single = exp.configs.len() == 1 && reps == 1;
    let net = match (&exp.testbed, a.local) {
        (Some(p), false) => Some(OnTestbed::new(testbed::load(&p.name)?, p.clone())?),
        _ => None,
    };
    println!(
        "fanin run: experiment {:?}: {} configuration(s) x {reps} repetition(s); results in {}",
        exp.name,
        exp.configs.len(),
        root.display()
    );
    if !exp.description.is_empty() {
        println!("  {}", exp.description.trim());
    }
    let mut capacity = None;
    if let Some(n) = &net {
        println!(
            "  on testbed {} ({} hosts, {} Mbit/s links), control on the {} network",
            n.spec.name,
            n.spec.hosts,
            n.spec.data.rate_bps as f64 / 1e6,
            match n.place.control {
                ControlNet::Aux => "auxiliary",
                ControlNet::Data => "data",
            }
        );
        if a.iperf_seconds > 0 {
            let (f, e) = (n.place.flps[0], n.place.epns[0]);
            let (f, e) = if f == e { (n.place.icn, e) } else { (f, e) };
            let m = testbed::iperf::measure(&n.spec, f, e, a.iperf_seconds)?;
            println!(
                "  capacity reference: iperf3 h{f} -> h{e}, {} s: {m:.2} Mbit/s",
                a.iperf_seconds
            );
            capacity = Some(m);
        }
    }
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for (ci, c) in exp.configs.iter().enumerate() {
        let mut done: Vec<Summary> = Vec::new();
        let mut fault_runs: Vec<Vec<crate::faults::FaultResult>> = Vec::new();
        for r in 0..reps {
            let dir = if single {
                root.clone()
            } else {
                root.join(format!("c{:02}-r{:02}", ci + 1, r + 1))
            };
            let prefix = format!(
                "[{}/{}] {} rep {}",
                ci + 1,
                exp.configs.len(),
                c.label,
                r + 1
            );
            match run_on(&c.run, &dir, &prefix, net.as_ref(), &exp.faults).await {
                Ok((s, faults)) => {
                    println!(
                        "{prefix}: issued {} completed {} incomplete {} dropped {} loss {:.2} % goodput {:.3} Gbit/s pre-run {:.2} s invariant {} valid {}{}",
                        s.issued,
                        s.completed,
                        s.incomplete,
                        s.dropped,
                        s.loss_pct,
                        s.goodput_gbps,
                        s.prerun_s,
                        if s.invariant_ok { "ok" } else { "VIOLATED" },
                        s.valid,
                        s.invalid_reason.as_ref().map(|r| format!(" ({r})")).unwrap_or_default()
                    );
                    for e in &s.events {
                        println!("{prefix}:   {e}");
                    }
                    if !faults.is_empty() {
                        print!("{}", crate::faults::render(&faults));
                        std::fs::write(
                            dir.join("faults.json"),
                            serde_json::to_string_pretty(&faults)?,
                        )?;
                    }
                    fault_runs.push(faults);
                    if !s.invariant_ok {
                        failures.push(format!("{prefix}: accounting invariant violated"));
                    }
                    done.push(s);
                }
                Err(e) => {
                    println!("{prefix}: FAILED: {e:#}");
                    failures.push(format!("{prefix}: {e:#}"));
                }
            }
        }
        if !done.is_empty() {
            // Long runs (TDR Table 19: 3 minutes) compare with the published long-run loss.
            let long = c.run.duration_s.unwrap_or(0.0) >= 120.0;
            let published = if long {
                c.published_long_loss_pct.or(c.published_loss_pct)
            } else {
                c.published_loss_pct
            };
            let mut row = RunRow::from_summaries(&c.label, &done, published);
            row.faults = table::FaultCols::from_runs(&fault_runs);
            row.published_mb_s = c.published_mb_s;
            rows.push(row);
        }
    }
    println!();
    let mut text = table::render(&rows);
    if let Some(m) = capacity {
        text +=
            &format!("capacity reference (iperf3, same testbed, same invocation): {m:.2} Mbit/s\n");
    }
    print!("{text}");
    std::fs::create_dir_all(&root)?;
    std::fs::write(root.join("table.txt"), &text)?;
    std::fs::write(root.join("table.csv"), table::csv(&rows))?;
    let sizes: std::collections::BTreeSet<&str> =
        rows.iter().map(|r| r.stf_size.as_str()).collect();
    if sizes.len() > 1 {
        let title = format!("{}: TF loss vs STF size, per FLP count", exp.name);
        std::fs::write(
            root.join("loss.svg"),
            crate::plot::loss_vs_size(&title, &rows),
        )?;
        println!("plot: {}", root.join("loss.svg").display());
    }
    println!("\nresults: {}", root.display());
    if !failures.is_empty() {
        bail!("{} run(s) failed: {}", failures.len(), failures.join("; "));
    }
    Ok(())
}

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

    fn control_ip(&self, h: u32) -> String {
        match self.place.control {
            ControlNet::Aux => self.spec.aux_ip(h).expect("checked in new").to_string(),
            ControlNet::Data => self.spec.data_ip(h).to_string(),
        }
    }
}

/// `fanin` itself, inside host `h`'s namespace on a testbed.
fn fanin(exe: &Path, net: Option<&OnTestbed>, h: u32) -> Command {
    match net {
        Some(n) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", &n.spec.host_ns(h)]).arg(exe);
            c
        }
        None => Command::new(exe),
    }
}

/// Runs one configuration once on loopback and returns its summary.
pub async fn run_one(cfg: &RunConfig, dir: &Path, prefix: &str) -> anyhow::Result<Summary> {
    Ok(run_on(cfg, dir, prefix, None, &[]).await?.0)
}

/// Runs one configuration once, on loopback or on a testbed, and returns its summary.
pub async fn run_on(
    cfg: &RunConfig,
    dir: &Path,
    prefix: &str,
    net: Option<&OnTestbed>,
    faults: &[Fault],
) -> anyhow::Result<(Summary, Vec<FaultResult>)> {
    let checked = cfg.check()?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let cfg_path = dir.join("config.toml");
    std::fs::write(&cfg_path, toml::to_string(cfg)?)?;
    let exe = std::env::current_exe().context("locating the fanin binary")?;
    let log = |name: &str| -> anyhow::Result<Stdio> {
        Ok(std::fs::File::create(dir.join(name))
            .with_context(|| format!("creating {name}"))?
            .into())
    };
    let mut goats: Vec<(String, u64)> = Vec::new();
    let mut planned: Vec<(String, Fault)> = Vec::new();
    for f in faults {
        let name = f.node_name(cfg.flps, cfg.epns)?;
        if f.action == Action::Goat {
            goats.push((name.clone(), f.after_tfs.unwrap_or(0)));
        }
        planned.push((name, f.clone()));
    }
    // The registry every process of this run uses; `zookeeper`: a private server, with
    // the configured tickTime, for this run only (killed when the run ends).
    let mut _zk_server = None;
    let registry_url = match cfg.registry.as_str() {
        "embedded" => None,
        "zookeeper" => {
            // On a testbed the server runs on the ICN's host, on its control network
            // (the TDR ran ZooKeeper beside the ICN).
            let (netns, bind) = match net {
                Some(n) => (
                    Some(n.spec.host_ns(n.place.icn)),
                    n.control_ip(n.place.icn)
                        .parse()
                        .context("ICN host address")?,
                ),
                None => (None, std::net::Ipv4Addr::LOCALHOST),
            };
            let server = fanin_node::registry::zk_server::ZkServer::start_with(
                fanin_node::registry::zk_server::ZkServerOptions {
                    tick_time: Duration::from_millis(cfg.zk_tick_ms),
                    netns,
                    bind,
                    ..Default::default()
                },
            )
            .context("starting ZooKeeper (Debian package zookeeper; scripts/test installs it)")?;
            let url = server.url("/fanin");
            _zk_server = Some(server);
            Some(url)
        }
        url => Some(format!(
            "{}/{}",
            url.trim_end_matches('/'),
            crate::overrides::clock_run_id()
        )),
    };
    let registry_args: Vec<String> = match &registry_url {
        Some(u) => vec![
            "--registry".into(),
            u.clone(),
            "--session-timeout-ms".into(),
            cfg.zk_session_timeout_ms.to_string(),
        ],
        None => Vec::new(),
    };
    let icn_host = net.map(|n| n.place.icn).unwrap_or(0);
    let icn_control = match net {
        Some(n) => format!("{}:0", n.control_ip(icn_host)),
        None => "127.0.0.1:0".into(),
    };
    let mut icn = fanin(&exe, net, icn_host)
        .args([
            "icn",
            "--control",
            &icn_control,
            "--metrics",
            "127.0.0.1:0",
            "--progress",
        ])
        .arg("--config")
        .arg(&cfg_path)
        .arg("--results-dir")
        .arg(dir)
        .args(["--run-id", &crate::overrides::clock_run_id().to_string()])
        .args(&registry_args)
        .stdout(Stdio::piped())
        .stderr(log("icn.log")?)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("starting the ICN")?;
    let mut lines = BufReader::new(icn.stdout.take().expect("piped")).lines();
    let first = tokio::time::timeout(Duration::from_secs(15), lines.next_line())
        .await
        .map_err(|_| anyhow::anyhow!("ICN did not report its address within 15 s"))??;
    let control = match first
        .as_deref()
        .and_then(|l| l.strip_prefix("listening control="))
    {
        Some(rest) => rest.split_whitespace().next().unwrap_or("").to_string(),
        None => bail!("ICN failed to start: {}", last_line(&dir.join("icn.log"))),
    };
    // An ICN fault needs a standby ICN: the same run, waiting in the registry for the
    // leader's session to end; it reports its address only once elected.
    let icn_fault = planned.iter().any(|(n, _)| n == "ICN");
    let standby_dir = dir.join("standby");
    let mut standby: Option<(Child, tokio::sync::mpsc::Receiver<String>)> = None;
    if icn_fault {
        std::fs::create_dir_all(&standby_dir)?;
        let mut child = fanin(&exe, net, icn_host)
            .args(["icn", "--standby", "--control", &icn_control])
            .args(["--metrics", "127.0.0.1:0", "--progress"])
            .arg("--config")
            .arg(&cfg_path)
            .arg("--results-dir")
            .arg(&standby_dir)
            .args([
                "--run-id",
                &(crate::overrides::clock_run_id() + 1).to_string(),
            ])
            .args(&registry_args)
            .stdout(Stdio::piped())
            .stderr(log("icn-standby.log")?)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting the standby ICN")?;
        let mut sl = BufReader::new(child.stdout.take().expect("piped")).lines();
        let (tx, rx) = tokio::sync::mpsc::channel(1024);
        tokio::spawn(async move {
            while let Ok(Some(l)) = sl.next_line().await {
                if tx.send(l).await.is_err() {
                    return;
                }
            }
        });
        standby = Some((child, rx));
    }
    // Each node as an argv, so a fault can start it again (its log is appended to).
    // (name, host, argv, log file, extra arguments of the first start only)
    type Spec = (String, u32, Vec<String>, String, Vec<String>);
    let mut specs: Vec<Spec> = Vec::new();
    // On a testbed: data on the host's data address, control on the chosen network.
    let addrs = |h: u32| match net {
        Some(n) => (n.spec.data_ip(h).to_string(), Some(n.control_ip(h))),
        None => ("127.0.0.1".to_string(), None),
    };
    for i in 0..cfg.epns {
        let h = net.map(|n| n.place.epns[i as usize]).unwrap_or(0);
        let (data, ctl) = addrs(h);
        let mut a: Vec<String> = vec!["epn".into(), "--icn".into(), control.clone()];
        a.extend([
            "--id".into(),
            i.to_string(),
            "--data-bind".into(),
            format!("{data}:0"),
        ]);
        a.extend(["--metrics".into(), "127.0.0.1:0".into()]);
        a.extend(["--build-buffer".into(), cfg.epn_buffer.clone()]);
        if let Some(ctl) = ctl {
            a.extend(["--control-bind".into(), ctl]);
        }
        a.extend(registry_args.iter().cloned());
        let name = format!("EPN {i}");
        // A goat dies once; started again it is an ordinary EPN.
        let first: Vec<String> = match goats.iter().find(|g| g.0 == name) {
            Some((_, n)) => vec!["--die-after-tfs".into(), n.to_string()],
            None => Vec::new(),
        };
        specs.push((name, h, a, format!("epn-{i}.log"), first));
    }
    for i in 0..cfg.flps {
        let h = net.map(|n| n.place.flps[i as usize]).unwrap_or(0);
        let (data, ctl) = addrs(h);
        let mut a: Vec<String> = vec!["flp".into(), "--icn".into(), control.clone()];
        a.extend([
            "--id".into(),
            i.to_string(),
            "--metrics".into(),
            "127.0.0.1:0".into(),
        ]);
        a.extend(["--send-buffer".into(), cfg.flp_buffer.clone()]);
        if net.is_some() {
            a.extend(["--data-bind".into(), data]);
        }
        if let Some(ctl) = ctl {
            a.extend(["--control-bind".into(), ctl]);
        }
        a.extend(registry_args.iter().cloned());
        specs.push((format!("FLP {i}"), h, a, format!("flp-{i}.log"), Vec::new()));
    }
    let mut procs = Vec::new();
    for (name, h, argv, logname, first) in specs {
        let (exe, ns, path) = (
            exe.clone(),
            net.map(|n| n.spec.host_ns(h)),
            dir.join(&logname),
        );
        let spawn = move |extra: &[String]| -> anyhow::Result<Child> {
            let mut c = match &ns {
                Some(ns) => {
                    let mut c = Command::new("ip");
                    c.args(["netns", "exec", ns]).arg(&exe);
                    c
                }
                None => Command::new(&exe),
            };
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .with_context(|| format!("opening {}", path.display()))?;
            c.args(&argv)
                .args(extra)
                .stdout(Stdio::null())
                .stderr(log)
                .stdin(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .with_context(|| format!("starting {}", argv[0]))
        };
        let _ = std::fs::remove_file(dir.join(&logname));
        let child = spawn(&first).with_context(|| format!("starting {name}"))?;
        procs.push(NodeProc {
            name,
            child,
            respawn: Box::new(move || spawn(&[])),
        });
    }
    // The primary ICN is a node too, for faults (started again, it is one more standby).
    {
        let (exe, ns, argv, path) = (
            exe.clone(),
            net.map(|n| n.spec.host_ns(icn_host)),
            {
                let mut a: Vec<String> = vec!["icn".into(), "--standby".into()];
                a.extend(["--control".into(), icn_control.clone()]);
                a.extend(["--config".into(), cfg_path.display().to_string()]);
                a.extend([
                    "--results-dir".into(),
                    dir.join("icn-restarted").display().to_string(),
                ]);
                a.extend(registry_args.iter().cloned());
                a
            },
            dir.join("icn-restarted.log"),
        );
        let respawn = move || -> anyhow::Result<Child> {
            let mut c = match &ns {
                Some(ns) => {
                    let mut c = Command::new("ip");
                    c.args(["netns", "exec", ns]).arg(&exe);
                    c
                }
                None => Command::new(&exe),
            };
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)?;
            c.args(&argv)
                .stdout(Stdio::null())
                .stderr(log)
                .stdin(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .context("restarting the ICN")
        };
        procs.push(NodeProc {
            name: "ICN".into(),
            child: icn,
            respawn: Box::new(respawn),
        });
    }
    let nodes: Nodes = Arc::new(tokio::sync::Mutex::new(procs));
    let _ = log;

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
    let mut limit = checked.configured_duration.unwrap_or_default()
        + Duration::from_secs_f64(cfg.prerun_timeout_s)
        + checked.drain_timeout()
        + Duration::from_secs(60);
    if icn_fault {
        // The standby runs the whole run again after its election.
        limit += checked.configured_duration.unwrap_or_default()
            + checked.drain_timeout()
            + Duration::from_millis(cfg.zk_session_timeout_ms)
            + Duration::from_secs_f64(cfg.prerun_timeout_s);
    }
    let mut injector: Option<Injector> = None;
    // Standby take-over: (elected, run started) in UNIX µs.
    let mut takeover: (Option<u64>, Option<u64>) = (None, None);
    let read = async {
        let mut on_standby = false;
        loop {
            let line = if on_standby {
                match standby.as_mut() {
                    Some((_, rx)) => rx.recv().await,
                    None => None,
                }
            } else {
                // The standby speaks only once elected: then the primary is deposed (killed,
                // or frozen and its session expired), whatever its own stdout does.
                let from_standby = async {
                    match standby.as_mut() {
                        Some((_, rx)) => rx.recv().await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    l = lines.next_line() => match l {
                        Ok(Some(l)) => Some(l),
                        _ => None,
                    },
                    Some(l) = from_standby => {
                        on_standby = true;
                        Some(l)
                    }
                }
            };
            let Some(line) = line else {
                // The primary ended: was it killed by a fault, with a standby waiting?
                let killed = injector.as_ref().is_some_and(|i| {
                    i.records
                        .lock()
                        .expect("records lock")
                        .iter()
                        .any(|r| r.node == "ICN" && r.at_unix_us.is_some())
                });
                if !on_standby && killed && standby.is_some() {
                    on_standby = true;
                    continue;
                }
                break;
            };
            if on_standby {
                if line.starts_with("listening control=") {
                    takeover.0 = Some(crate::faults::unix_us());
                }
                if let Some(t) = line.strip_prefix("STARTED ") {
                    takeover.1 = t.trim().parse().ok();
                }
            }
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() == 2 && f[0] == "STARTED" && !planned.is_empty() && !on_standby {
                if let Ok(t0) = f[1].parse::<u64>() {
                    injector = Some(crate::faults::inject(
                        std::mem::take(&mut planned),
                        t0,
                        nodes.clone(),
                    ));
                }
            }
            if f.len() == 4 && f[0] == "PROGRESS" {
                if let (Ok(issued), Ok(ended)) = (f[1].parse::<u64>(), f[2].parse::<u64>()) {
                    bar.set_position(ended);
                    bar.set_message(format!("(issued {issued})"));
                }
            }
        }
    };
    let timed_out = tokio::time::timeout(limit, read).await.is_err();
    bar.finish_and_clear();
    let injected = injector.map(Injector::finish).unwrap_or_default();
    if timed_out {
        bail!("run did not finish within {limit:?}; see {}", dir.display());
    }
    let took_over = takeover.0.is_some();
    let status = {
        let mut g = nodes.lock().await;
        let primary = g.iter_mut().find(|n| n.name == "ICN").expect("primary ICN");
        if took_over {
            let _ = primary.child.kill().await;
        }
        let st = primary.child.wait().await?;
        match standby.as_mut() {
            Some((child, _)) if took_over => child.wait().await?,
            Some((child, _)) => {
                let _ = child.kill().await;
                st
            }
            None => st,
        }
    };
    // Every node leaves by itself after RunStop; give them a moment, then insist.
    let mut nodes = nodes.lock().await;
    for NodeProc { name, child, .. } in nodes.iter_mut() {
        if name == "ICN" {
            continue;
        }
        if injected
            .iter()
            .any(|i| &i.node == name && i.back_unix_us.is_none())
        {
            // Killed or frozen by a fault and never brought back.
            signal_kill(child).await;
            continue;
        }
        match tokio::time::timeout(Duration::from_secs(15), child.wait()).await {
            Ok(Ok(st)) if st.success() => {}
            Ok(Ok(st)) => {
                let logname = name.to_lowercase().replace(' ', "-") + ".log";
                println!(
                    "{prefix}: {name} exited with {st}: {}",
                    last_line(&dir.join(logname))
                );
            }
            _ => {
                let _ = child.kill().await;
                println!("{prefix}: {name} did not exit after the run; killed");
            }
        }
    }
    // After a take-over, the standby's run is the run; the failed ICN's ended TFs are
    // in its own tfs.csv.
    let summary_dir = if took_over {
        standby_dir.clone()
    } else {
        dir.to_path_buf()
    };
    let summary_path = summary_dir.join("summary.json");
    if !summary_path.exists() {
        bail!(
            "ICN exited with {status} and no summary: {}",
            last_line(&dir.join("icn.log"))
        );
    }
    let s: Summary = serde_json::from_str(&std::fs::read_to_string(&summary_path)?)
        .with_context(|| format!("reading {}", summary_path.display()))?;
    let mut s = s;
    let mut results = crate::faults::results(&injected, &s, &summary_dir);
    if took_over {
        let killed = injected
            .iter()
            .find(|i| i.node == "ICN")
            .and_then(|i| i.at_unix_us);
        let before = crate::faults::tf_status_counts(&dir.join("tfs.csv"));
        let ended: u64 = before.values().sum();
        for r in results.iter_mut().filter(|r| r.node == "ICN") {
            r.detect_ms = killed
                .zip(takeover.0)
                .map(|(k, e)| (e.saturating_sub(k)) as f64 / 1e3);
            r.rejoin_ms = killed
                .zip(takeover.1)
                .map(|(k, e)| (e.saturating_sub(k)) as f64 / 1e3);
            r.at_s = None;
            // Its TFs are in the event line: they are the failed ICN's, not the outage's.
            r.outage_tfs.clear();
        }
        s.events.push(format!(
            "the ICN was killed; the standby was elected {} ms later and its run started {} ms after the kill; the failed ICN had ended {ended} TFs ({}) - its TFs still in flight died with its ledger",
            results.iter().find(|r| r.node == "ICN").and_then(|r| r.detect_ms).map(|v| format!("{v:.0}")).unwrap_or("?".into()),
            results.iter().find(|r| r.node == "ICN").and_then(|r| r.rejoin_ms).map(|v| format!("{v:.0}")).unwrap_or("?".into()),
            before.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")
        ));
    }
    Ok((s, results))
}

/// Kills a node left frozen or dead by a fault (SIGCONT first, so it can die).
async fn signal_kill(child: &mut Child) {
    if let Some(pid) = child.id() {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(pid as i32, libc::SIGCONT) };
    }
    let _ = child.kill().await;
}

fn last_line(p: &Path) -> String {
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
