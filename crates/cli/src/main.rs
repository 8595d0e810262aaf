//! The `fanin` command: one binary for every role (icn, flp, epn), whole local runs
//! (`run`), and benchmarks (`bench`). Errors print as one line and exit non-zero.

mod sim;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use fanin_lab::{
    bench, clock_run_id, ctl, experiment, orchestrate, plot, table, testbed, tf_files, RunOverrides,
};
use fanin_node::auth::Secret;
use fanin_node::config::Registry;
use fanin_node::registry::runtime::RegistryOpts;
use fanin_node::{epn, flp, icn, RunConfig};
use fanin_sched::parse_bytes;

#[derive(Parser)]
#[command(
    name = "fanin",
    version,
    about = "A load-balanced event builder for detector read-out"
)]
struct Cli {
    /// Threads that run this process's tasks (1, the fastest measured on 2 cores: one
    /// thread runs the command and every task; more: a multi-thread runtime).
    #[arg(long, global = true, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1024))]
    threads: u16,
    /// Check the command line and the files it names, run nothing ("ok: ..." on stdout).
    #[arg(long, global = true)]
    check: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run an experiment on a local cluster of real processes (default: the embedded one).
    Run(orchestrate::RunArgs),
    /// The scheduler: registers nodes, issues TFs, assigns EPNs, accounts for every TF.
    Icn(IcnArgs),
    /// A sender: sends one STF per TF to the EPN the ICN chose.
    Flp(FlpArgs),
    /// A builder: receives STFs, builds TFs, acknowledges them to the ICN.
    Epn(EpnArgs),
    /// Discrete-event simulation of event building (ANTARES presets, TCP/UDP).
    Sim(sim::SimArgs),
    /// The fault campaign: random clusters and fault schedules run through the real node
    /// code in simulated time, every promise checked; a failure prints its replay.
    Chaos(fanin_lab::chaos::ChaosArgs),
    /// Benchmarks that print fanin's figures beside a reference measured in the same run.
    #[command(subcommand)]
    Bench(bench::BenchCmd),
    /// Draw `loss.svg` again from a finished experiment's `table.csv`.
    Plot {
        /// The experiment's results directory (with table.csv).
        dir: PathBuf,
    },
    /// An emulated cluster: network namespaces behind a bridge, tc-shaped links (root).
    #[command(subcommand)]
    Testbed(testbed::TestbedCmd),
    /// Write `report.html` again for a finished run's directory (`fanin run` writes one).
    Report {
        /// The run's results directory (with summary.json and tfs.csv).
        dir: PathBuf,
    },
    /// List the TFs of files written by an EPN's file or burst sink, checking every CRC.
    Inspect {
        /// TF files (`*.fanin`).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Only the totals, not one line per TF.
        #[arg(long)]
        quiet: bool,
    },
    /// Run control of a long-lived ICN (`fanin icn --session`): configure, start, pause,
    /// resume, stop, status, exit.
    Ctl(ctl::CtlArgs),
    /// Make EPNs with a burst sink save their ring and the following seconds.
    Trigger {
        /// The EPNs' metrics addresses (`fanin epn --metrics`).
        #[arg(long = "epn", required = true, value_parser = socket_addr)]
        epns: Vec<SocketAddr>,
    },
}

#[derive(Args)]
struct IcnArgs {
    /// Control address FLPs and EPNs connect to.
    #[arg(long, default_value = "0.0.0.0:7000", value_parser = socket_addr)]
    control: SocketAddr,
    /// Serve Prometheus metrics here (e.g. 0.0.0.0:9100).
    #[arg(long, value_parser = socket_addr)]
    metrics: Option<SocketAddr>,
    /// Run configuration: an experiment file (its first configuration) or a config.toml.
    #[arg(long)]
    config: Option<PathBuf>,
    #[command(flatten)]
    overrides: RunOverrides,
    /// Write summary.json, summary.csv, tfs.csv and config.toml here.
    #[arg(long)]
    results_dir: Option<PathBuf>,
    /// Print PROGRESS lines on stdout.
    #[arg(long)]
    progress: bool,
    /// Run id, at least 1 (default: derived from the clock); 0 marks a ring's STFs as
    /// scheduled by no run.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    run_id: Option<u64>,
    /// Wait as a standby (`--registry zk://HOST:PORT/PATH`: the ICN is elected there; a
    /// second ICN started with the same registry is a standby that takes over when the
    /// leader's session ends): the same as any ICN with a registry, said out loud.
    #[arg(long, requires = "registry")]
    standby: bool,
    /// Session time-out asked of ZooKeeper (default: the config's zk_session_timeout_ms).
    #[arg(long)]
    session_timeout_ms: Option<u64>,
    /// The run secret every FLP and EPN must prove (default: $FANIN_SECRET; none: anyone
    /// who reaches the port can join). See docs/security.md.
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// Stay up under run control (`fanin ctl`, the HTTP API on --metrics): start IDLE
    /// (or CONFIGURED with --config), run after run, each in RESULTS_DIR/run-N.
    #[arg(long, requires = "metrics", conflicts_with_all = ["standby", "progress"])]
    session: bool,
}

#[derive(Args)]
struct NodeCommon {
    /// The ICN's control address (or find the elected ICN through --registry).
    #[arg(long, required_unless_present = "registry", value_parser = socket_addr)]
    icn: Option<SocketAddr>,
    /// ZooKeeper registry zk://HOST:PORT/PATH: find the ICN there and register there.
    #[arg(long)]
    registry: Option<String>,
    /// Session time-out asked of ZooKeeper, in ms.
    #[arg(long, default_value_t = 2000)]
    session_timeout_ms: u64,
    /// Node id (default: assigned by the ICN).
    #[arg(long)]
    id: Option<u32>,
    /// Local IP for the control connection (auxiliary network).
    #[arg(long)]
    control_bind: Option<IpAddr>,
    /// Serve Prometheus metrics here.
    #[arg(long, value_parser = socket_addr)]
    metrics: Option<SocketAddr>,
    /// How long to keep trying to reach the ICN, in seconds.
    #[arg(long, default_value_t = 60.0)]
    connect_timeout: f64,
    /// The run secret this node proves (default: $FANIN_SECRET). See docs/security.md.
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// Stay up under run control: join run after run, wait while the ICN is IDLE, exit
    /// on EXIT (`fanin icn --session`, `fanin ctl`).
    #[arg(long)]
    session: bool,
    /// This node is started again into a run that is going (a launcher restarting a node
    /// it killed): if the registry says no run is going, it ends at once (status 0).
    #[arg(long, requires = "registry", conflicts_with = "session")]
    rejoin: bool,
}

#[derive(Args)]
struct FlpArgs {
    #[command(flatten)]
    common: NodeCommon,
    /// Local IP for data connections to EPNs (data network).
    #[arg(long)]
    data_bind: Option<IpAddr>,
    /// Send buffer limit (bytes of STFs waiting for the network).
    #[arg(long, default_value = "256MiB")]
    send_buffer: String,
    /// Where the STFs come from: synthetic, shm:NAME, exec:CMD, replay:DIR[,rate=HZ]
    /// (docs/sources.md; all but synthetic need schedule = "on-data").
    #[arg(long, default_value = "synthetic", value_name = "SPEC")]
    source: flp::source::SourceSpec,
}

#[derive(Args)]
struct EpnArgs {
    #[command(flatten)]
    common: NodeCommon,
    /// Address FLPs connect to (data network).
    #[arg(long, default_value = "0.0.0.0:0", value_parser = socket_addr)]
    data_bind: SocketAddr,
    /// Data address announced to FLPs, if not the bound one.
    #[arg(long, value_parser = socket_addr)]
    advertise: Option<SocketAddr>,
    /// Build buffer limit (bytes of STFs held for TFs in building).
    #[arg(long, default_value = "1GiB")]
    build_buffer: String,
    /// Most TFs in building at once.
    #[arg(long, default_value_t = 4096)]
    max_building: usize,
    /// Fault injection ("Goat"): crash (SIGKILL) after reporting this many complete TFs.
    #[arg(long)]
    die_after_tfs: Option<u64>,
    /// Where built TFs go, any number: exec:CMD, plugin:LIB.so[,ARG..], file:DIR[,..],
    /// burst:DIR[,..], tap:IP:PORT[,..] (docs/sinks.md). None: built and discarded.
    #[arg(long = "sink", value_name = "SPEC")]
    sinks: Vec<epn::sink::SinkSpec>,
    /// With sinks, a TF is complete when every sink accepted it, or when it is built.
    #[arg(long, default_value = "accepted", value_parser = ["accepted", "built"])]
    complete_on: String,
    /// Hand TFs to the sinks in TF-id order; the oldest missing one is given up
    /// (order_given_up) once this many newer TFs wait for it.
    #[arg(long, value_name = "GIVE_UP_AFTER")]
    in_order: Option<usize>,
    /// What a dying exec sink does: restart it, or leave the run.
    #[arg(long, default_value = "restart")]
    on_sink_failure: epn::sink::OnFailure,
    /// Exec sinks lend the payload pages to the pipe (vmsplice) instead of copying them:
    /// only for commands that read(2) their stdin, not ones that splice it onward.
    #[arg(long)]
    exec_zero_copy: bool,
    /// After a run stops, how long the sinks may go without returning a TF; then the EPN
    /// leaves them and ends with an error (a plug-in that never returns holds nothing).
    #[arg(long, value_name = "SECONDS", default_value_t = epn::SINK_STOP_TIMEOUT_S)]
    sink_stop_timeout: f64,
}

fn node_registry(c: &NodeCommon) -> anyhow::Result<Option<RegistryOpts>> {
    c.registry
        .as_deref()
        .map(|u| RegistryOpts::parse(u, c.session_timeout_ms))
        .transpose()
}

/// `HOST:PORT` with HOST a name or an address; the first address it resolves to
/// (IPv4 first, as the nodes bind IPv4).
fn socket_addr(s: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    let addrs: Vec<SocketAddr> = s
        .to_socket_addrs()
        .map_err(|e| format!("{s}: not HOST:PORT ({e})"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| format!("{s}: resolves to no address"))
}

fn bytes_arg(field: &str, v: &str) -> anyhow::Result<u64> {
    parse_bytes(v).map_err(|e| anyhow::anyhow!("--{field}: {e}"))
}

/// At most a day: a longer wait is a mistake, and deadlines must not overflow.
fn connect_timeout(secs: f64) -> anyhow::Result<Duration> {
    seconds_arg("connect-timeout", secs)
}

/// `--NAME SECONDS`: within (0, 86400].
fn seconds_arg(name: &str, secs: f64) -> anyhow::Result<Duration> {
    match Duration::try_from_secs_f64(secs) {
        Ok(d) if d > Duration::ZERO && d <= Duration::from_secs(86_400) => Ok(d),
        _ => anyhow::bail!("--{name}: {secs} is not within (0, 86400] seconds"),
    }
}

/// `fanin --check ...`: what the command would run, checked; nothing runs.
fn check(cmd: Cmd) -> anyhow::Result<()> {
    let what = match cmd {
        Cmd::Run(a) => orchestrate::check(&a)?,
        Cmd::Sim(a) => return sim::run(a, true),
        Cmd::Icn(a) => {
            let (cfg, _) = icn_config(&a)?;
            Secret::load(a.secret_file.as_deref())?;
            format!("ICN of {} FLPs and {} EPNs", cfg.cfg.flps, cfg.cfg.epns)
        }
        Cmd::Flp(a) => flp_options(&a).map(|_| "FLP".to_string())?,
        Cmd::Epn(a) => epn_options(&a).map(|_| "EPN".to_string())?,
        Cmd::Plot { dir } => format!("plot of {}", dir.display()),
        Cmd::Report { dir } => {
            anyhow::ensure!(
                dir.join("summary.json").is_file(),
                "{}: no summary.json",
                dir.display()
            );
            format!("report of {}", dir.display())
        }
        Cmd::Ctl(ctl::CtlArgs {
            cmd: ctl::CtlCmd::Configure { file, .. },
            ..
        }) => {
            let cfg = experiment::load_run_config(&file)?.check()?;
            format!(
                "run control: a run of {} FLPs and {} EPNs",
                cfg.cfg.flps, cfg.cfg.epns
            )
        }
        Cmd::Bench(_) | Cmd::Testbed(_) | Cmd::Trigger { .. } | Cmd::Ctl(_) | Cmd::Chaos(_) => {
            "arguments".into()
        }
        Cmd::Inspect { files, .. } => {
            for f in &files {
                anyhow::ensure!(f.is_file(), "{}: no such file", f.display());
            }
            format!("{} TF files", files.len())
        }
    };
    println!("ok: {what}");
    Ok(())
}

/// A long-lived ICN's options: configured from the start with --config, else IDLE.
fn session_options(a: &IcnArgs) -> anyhow::Result<icn::SessionOptions> {
    let config = match &a.config {
        Some(_) => Some(session_run(icn_run_config(a)?)?),
        None => None,
    };
    let parse = |text: &str| session_run(experiment::parse_run_config(text, "the configuration")?);
    // As configure's `run=N`: room for the run numbers that follow.
    if let Some(n) = a.run_id.filter(|n| *n >= u64::MAX / 2) {
        anyhow::bail!("--run-id: {n} is too large for a session's first run");
    }
    Ok(icn::SessionOptions {
        control_bind: a.control,
        metrics_bind: a.metrics.expect("clap requires --metrics with --session"),
        results_dir: a
            .results_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from("results")),
        secret: Secret::load(a.secret_file.as_deref())?,
        first_run: a.run_id,
        config,
        parse: Box::new(parse),
        after_run: std::sync::Arc::new(|dir| fanin_lab::run_report::write(dir).map(|_| ())),
    })
}

/// A run of a session, checked; run control keeps no registry (yet): a configuration
/// that asks for one is refused.
fn session_run(cfg: RunConfig) -> anyhow::Result<fanin_node::config::Checked> {
    anyhow::ensure!(
        cfg.registry == Registry::Embedded,
        "registry: run control (fanin icn --session) does not use a registry"
    );
    // A session admits this many nodes at once: a larger run could never start.
    let nodes = cfg.flps as usize + cfg.epns as usize;
    let most = fanin_node::icn::SESSION_MAX_NODES;
    anyhow::ensure!(
        nodes <= most,
        "flps + epns: {nodes} nodes, a session takes at most {most}"
    );
    cfg.check()
}

/// The ICN's run configuration: the file, then the flags.
fn icn_run_config(a: &IcnArgs) -> anyhow::Result<RunConfig> {
    let mut cfg = match &a.config {
        Some(p) => experiment::load_run_config(p)?,
        None => RunConfig::default(),
    };
    a.overrides.apply(&mut cfg)?;
    Ok(cfg)
}

/// The ICN's checked run configuration (file, then flags) and its registry.
fn icn_config(a: &IcnArgs) -> anyhow::Result<(fanin_node::config::Checked, Option<RegistryOpts>)> {
    let cfg = icn_run_config(a)?;
    let run = cfg.check()?;
    let registry = match &cfg.registry {
        Registry::Url(u) => Some(RegistryOpts::parse(
            u,
            a.session_timeout_ms.unwrap_or(cfg.zk_session_timeout_ms),
        )?),
        Registry::ZooKeeper => anyhow::bail!(
            "registry = \"zookeeper\" is for fanin run (it starts a private server); \
             give fanin icn --registry zk://HOST:PORT/PATH"
        ),
        Registry::Embedded => None,
    };
    Ok((run, registry))
}

async fn main_async(cli: Cli) -> anyhow::Result<()> {
    if cli.check {
        return check(cli.cmd);
    }
    match cli.cmd {
        Cmd::Run(a) => match orchestrate::run(a).await? {
            orchestrate::Ended::Complete => Ok(()),
            // Documented: an interrupted run exits with 130 after writing its results.
            orchestrate::Ended::Interrupted => std::process::exit(130),
        },
        Cmd::Testbed(c) => testbed::run(c),
        Cmd::Plot { dir } => {
            println!("{}", plot::redraw(&dir)?.display());
            Ok(())
        }
        Cmd::Icn(a) if a.session => icn::session(session_options(&a)?).await,
        Cmd::Icn(a) => {
            let (run, registry) = icn_config(&a)?;
            if a.standby {
                tracing::info!("ICN: started as a standby");
            }
            let secret = Secret::load(a.secret_file.as_deref())?;
            let summary = icn::run(icn::IcnOptions {
                secret,
                registry,
                run,
                control_bind: a.control,
                metrics_bind: a.metrics,
                results_dir: a.results_dir,
                progress: a.progress,
                run_id: a.run_id.unwrap_or_else(clock_run_id),
            })
            .await?;
            if !a.progress {
                table::print_runs(&[table::RunRow::from_summary("run", &summary, None)]);
            }
            anyhow::ensure!(summary.invariant_ok, "accounting invariant violated");
            Ok(())
        }
        Cmd::Flp(a) => flp::run(flp_options(&a)?).await,
        Cmd::Epn(a) => epn::run(epn_options(&a)?).await,
        Cmd::Bench(b) => bench::run(b).await,
        Cmd::Sim(a) => sim::run(a, false),
        Cmd::Chaos(a) => fanin_lab::chaos::run(&a).await,
        Cmd::Inspect { files, quiet } => inspect(&files, quiet),
        Cmd::Report { dir } => {
            println!("{}", fanin_lab::run_report::write(&dir)?.display());
            Ok(())
        }
        Cmd::Ctl(a) => {
            println!("{}", ctl::run(&a)?);
            Ok(())
        }
        Cmd::Trigger { epns } => {
            for e in epns {
                println!("{}", tf_files::trigger(e)?);
            }
            Ok(())
        }
    }
}

/// `fanin inspect`: fails if any file has a CRC error or is not a TF file.
fn inspect(files: &[PathBuf], quiet: bool) -> anyhow::Result<()> {
    let mut bad = 0;
    for f in files {
        let i = tf_files::inspect(f)?;
        print!("{}", i.render(f, !quiet));
        bad += i.crc_errors;
    }
    anyhow::ensure!(bad == 0, "{bad} STFs failed their CRC check");
    Ok(())
}

/// An FLP's options from its flags, every value checked.
fn flp_options(a: &FlpArgs) -> anyhow::Result<flp::FlpOptions> {
    Ok(flp::FlpOptions {
        secret: Secret::load(a.common.secret_file.as_deref())?,
        registry: node_registry(&a.common)?,
        icn: a.common.icn,
        id: a.common.id,
        control_bind: a.common.control_bind,
        data_bind: a.data_bind,
        send_buffer: bytes_arg("send-buffer", &a.send_buffer)?,
        metrics_bind: a.common.metrics,
        connect_timeout: connect_timeout(a.common.connect_timeout)?,
        session: a.common.session,
        rejoin: a.common.rejoin,
        source: a.source.clone(),
    })
}

/// An EPN's options from its flags, every value checked.
fn epn_options(a: &EpnArgs) -> anyhow::Result<epn::EpnOptions> {
    anyhow::ensure!(a.max_building > 0, "--max-building must be at least 1");
    anyhow::ensure!(a.in_order != Some(0), "--in-order must be at least 1");
    anyhow::ensure!(
        a.in_order.is_none() || !a.sinks.is_empty(),
        "--in-order orders what goes to sinks: give at least one --sink"
    );
    Ok(epn::EpnOptions {
        secret: Secret::load(a.common.secret_file.as_deref())?,
        registry: node_registry(&a.common)?,
        icn: a.common.icn,
        id: a.common.id,
        data_bind: a.data_bind,
        advertise: a.advertise,
        control_bind: a.common.control_bind,
        build_buffer: bytes_arg("build-buffer", &a.build_buffer)?,
        max_building: a.max_building,
        metrics_bind: a.common.metrics,
        connect_timeout: connect_timeout(a.common.connect_timeout)?,
        die_after_tfs: a.die_after_tfs,
        sinks: sinks_checked(&a.sinks)?,
        complete_on: match a.complete_on.as_str() {
            "built" => epn::core::CompleteOn::Built,
            _ => epn::core::CompleteOn::Accepted,
        },
        in_order: a.in_order,
        on_sink_failure: a.on_sink_failure,
        exec_zero_copy: a.exec_zero_copy,
        sink_stop_wait: seconds_arg("sink-stop-timeout", a.sink_stop_timeout)?,
        session: a.common.session,
        rejoin: a.common.rejoin,
    })
}

/// The sinks, with every plug-in library present.
/// A plug-in's path is made absolute: the library checked here is the one loaded (a bare
/// name would be looked up in the system's library path).
fn sinks_checked(sinks: &[epn::sink::SinkSpec]) -> anyhow::Result<Vec<epn::sink::SinkSpec>> {
    let mut checked = sinks.to_vec();
    for s in &mut checked {
        if let epn::sink::SinkSpec::Plugin { lib, .. } = s {
            anyhow::ensure!(
                lib.is_file(),
                "--sink plugin:{}: no such file",
                lib.display()
            );
            *lib = std::path::absolute(&*lib)
                .map_err(|e| anyhow::anyhow!("--sink plugin:{}: {e}", lib.display()))?;
        }
    }
    Ok(checked)
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) if !e.use_stderr() => e.exit(), // --help, --version
        Err(e) => {
            // One line: clap's first line names the argument at fault.
            let text = e.render().to_string();
            eprintln!("{}", text.lines().next().unwrap_or("error: bad arguments"));
            std::process::exit(2);
        }
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FANIN_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    // A node holds a socket per peer: take every open file the system allows.
    let files = fanin_node::fdlimit::raise();
    tracing::debug!("open-file limit {files}");
    // One thread runs the command and all its tasks (no wake-ups across threads, each of
    // which costs a futex and, on a VM, an IPI); more threads get a multi-thread runtime.
    let mut rt = match cli.threads {
        1 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(usize::from(n));
            b
        }
    };
    let rt = rt
        .enable_all()
        .build()
        .context("starting the tokio runtime")
        .unwrap_or_else(|e| {
            eprintln!("error: {e:#}");
            std::process::exit(1)
        });
    if let Err(e) = rt.block_on(main_async(cli)) {
        // Always one line, whatever the error's own text holds.
        let text = format!("{e:#}");
        let one: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        eprintln!("error: {}", one.join(" "));
        std::process::exit(1);
    }
    // Do not wait for detached tasks (metrics server, acceptors) at exit.
    rt.shutdown_background();
}
