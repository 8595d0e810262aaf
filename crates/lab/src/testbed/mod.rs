//! `fanin testbed`: an emulated cluster on one machine, as network namespaces behind a
//! Linux bridge with `tc`-shaped links (`up`, `down`, `status`, `iperf`).

pub mod iperf;
pub mod netfault;
pub mod spec;

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};

pub use spec::Spec;

#[derive(Subcommand)]
pub enum TestbedCmd {
    /// Create the hosts, the switch and the shaped links (as root).
    Up(UpArgs),
    /// Remove everything a testbed created (idempotent; also after a crash).
    Down(NameArg),
    /// List hosts, addresses, shaping and the switch ports' queue counters.
    Status(NameArg),
    /// The TDR's synthetic benchmark: iperf3 between two hosts, N repetitions.
    Iperf(iperf::IperfArgs),
}

#[derive(Args)]
pub struct NameArg {
    /// Testbed name (prefix of its namespaces); default: the one testbed that is up.
    #[arg(long)]
    pub name: Option<String>,
}

impl NameArg {
    /// The named testbed, or the only one `up` recorded (`pi-cluster` when none is).
    pub fn resolve(&self) -> anyhow::Result<String> {
        if let Some(n) = &self.name {
            spec::check_name(n)?;
            return Ok(n.clone());
        }
        let up = recorded();
        match up.as_slice() {
            [] => Ok("pi-cluster".into()),
            [one] => Ok(one.clone()),
            many => anyhow::bail!(
                "several testbeds are up ({}): name one with --name",
                many.join(", ")
            ),
        }
    }
}

/// The testbeds `up` recorded and `down` has not removed, by name.
pub fn recorded() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(state_dir())
        .map(|d| {
            d.flatten()
                .filter_map(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    n.strip_suffix(".json").map(str::to_string)
                })
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[derive(Args)]
pub struct UpArgs {
    /// Start from a preset (pi-cluster: 8 hosts, 100 Mbit, auxiliary network).
    #[arg(long)]
    preset: Option<String>,
    /// Testbed name (default: the preset's name, or `fanin`).
    #[arg(long)]
    name: Option<String>,
    /// Number of hosts.
    #[arg(long)]
    hosts: Option<u32>,
    /// Line rate of every host link, e.g. 100mbit, 1gbit.
    #[arg(long)]
    rate: Option<String>,
    /// One-way delay added on each host's transmit side, e.g. 100us, 1ms.
    #[arg(long)]
    delay: Option<String>,
    /// Random loss in percent on each host's transmit side.
    #[arg(long)]
    loss: Option<f64>,
    /// Switch buffer per output port: packets (`100p`) or bytes (`128KiB`).
    #[arg(long)]
    queue: Option<String>,
    /// Add the auxiliary (control) network (true/false; the preset decides by default).
    #[arg(long)]
    aux: Option<bool>,
}

/// Where `up` records a testbed (tmpfs: it vanishes with the namespaces on reboot).
pub fn state_dir() -> PathBuf {
    std::env::var_os("FANIN_TESTBED_STATE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/fanin/testbed"))
}

fn state_path(name: &str) -> PathBuf {
    state_dir().join(format!("{name}.json"))
}

pub fn run(cmd: TestbedCmd) -> anyhow::Result<()> {
    match cmd {
        TestbedCmd::Up(a) => up(a),
        TestbedCmd::Down(a) => {
            let name = a.resolve()?;
            need_root("fanin testbed down")?;
            let n = down(&name)?;
            println!("testbed {name}: removed {n} namespace(s)");
            Ok(())
        }
        TestbedCmd::Status(a) => status(&a.resolve()?),
        TestbedCmd::Iperf(a) => iperf::run(a),
    }
}

/// Root and iproute2, which every testbed command (and a run on a testbed) needs.
pub fn need_root(what: &str) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        bail!(
            "{what} needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN for network namespaces): run it as root"
        );
    }
    for tool in ["ip", "tc"] {
        if which(tool).is_none() {
            bail!("{what} needs `{tool}`: apt-get install -y iproute2");
        }
    }
    Ok(())
}

/// Does the kernel say it has no netem? Only a definite "not set" in /proc/config.gz
/// counts; without the file, `tc` itself will say.
fn netem_missing() -> bool {
    let Ok(out) = Command::new("sh")
        .args([
            "-c",
            "zcat /proc/config.gz 2>/dev/null | grep -c '^# CONFIG_NET_SCH_NETEM is not set'",
        ])
        .output()
    else {
        return false;
    };
    String::from_utf8_lossy(&out.stdout).trim() == "1"
}

/// A tool on PATH (or in /usr/sbin, /sbin).
pub fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// Runs one command; a failure becomes a one-line error naming the command.
pub fn sh(argv: &[String]) -> anyhow::Result<String> {
    let out = Command::new(&argv[0])
        .args(&argv[1..])
        .output()
        .with_context(|| format!("running `{}`", argv.join(" ")))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        bail!(
            "`{}` failed: {}",
            argv.join(" "),
            err.lines().next().unwrap_or("").trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The priorities of the filters on `dev`'s root qdisc in namespace `ns`.
pub fn filter_prefs(ns: &str, dev: &str) -> anyhow::Result<Vec<u32>> {
    let argv = spec::argv(&[
        "tc", "-j", "-n", ns, "filter", "show", "dev", dev, "parent", "1:",
    ]);
    let out = sh(&argv)?;
    let v: serde_json::Value = serde_json::from_str(out.trim())
        .with_context(|| format!("reading `{}`", argv.join(" ")))?;
    let mut prefs: Vec<u32> = v
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["pref"].as_u64())
        .map(|p| p as u32)
        .collect();
    prefs.sort_unstable();
    prefs.dedup();
    Ok(prefs)
}

/// The testbed `up` builds: the preset (or the default) with the command line's changes.
fn spec_of(a: &UpArgs) -> anyhow::Result<Spec> {
    let mut s = match &a.preset {
        Some(p) => spec::preset(p)?,
        None => Spec {
            name: "fanin".into(),
            preset: None,
            hosts: 2,
            data: spec::shaping("1gbit", "0", 0.0, "1000p")?,
            aux: None,
        },
    };
    if let Some(n) = &a.name {
        s.name = n.clone();
    }
    if let Some(h) = a.hosts {
        s.hosts = h;
    }
    let mut nets = vec![&mut s.data];
    if let Some(aux) = s.aux.as_mut() {
        nets.push(aux);
    }
    for net in nets {
        if let Some(r) = &a.rate {
            net.rate_bps = spec::parse_rate(r).context("--rate")?;
        }
        if let Some(d) = &a.delay {
            net.delay_us = spec::parse_delay_us(d).context("--delay")?;
        }
        if let Some(l) = a.loss {
            net.loss_pct = l;
        }
        if let Some(q) = &a.queue {
            net.queue = spec::QueueLimit::parse(q).context("--queue")?;
        }
    }
    match a.aux {
        Some(true) if s.aux.is_none() => s.aux = Some(s.data),
        Some(false) => s.aux = None,
        _ => {}
    }
    Ok(s)
}

fn up(a: UpArgs) -> anyhow::Result<()> {
    bring_up(&spec_of(&a)?)
}

/// Creates testbed `s` (as root), records it, and prints what it made.
pub fn bring_up(s: &Spec) -> anyhow::Result<()> {
    s.check()?;
    need_root("fanin testbed up")?;
    let delay = s.data.delay_us > 0 || s.aux.is_some_and(|a| a.delay_us > 0);
    if delay && netem_missing() {
        bail!("--delay needs the kernel's netem qdisc (CONFIG_NET_SCH_NETEM), which this kernel lacks (/proc/config.gz); use a kernel with sch_netem, or no --delay");
    }
    if !existing(&s.name)?.is_empty() {
        bail!(
            "testbed {:?} is already up (see `fanin testbed status --name {0}`); run `fanin testbed down --name {0}` first",
            s.name
        );
    }
    let ethtool = which("ethtool").is_some();
    if !ethtool {
        eprintln!("warning: ethtool not found (Debian package ethtool): segmentation offloads stay on, so queue limits in packets count GSO super-packets");
    }
    let cmds = s.up_commands(ethtool);
    for c in &cmds {
        if let Err(e) = sh(c) {
            let _ = down(&s.name);
            return Err(e.context(format!("testbed {}: up failed, cleaned up", s.name)));
        }
    }
    std::fs::create_dir_all(state_dir())
        .with_context(|| format!("creating {}", state_dir().display()))?;
    std::fs::write(state_path(&s.name), serde_json::to_string_pretty(&s)?)
        .with_context(|| format!("writing {}", state_path(&s.name).display()))?;
    println!(
        "testbed {}: {} hosts up ({} commands); data 192.168.1.1-{}{}",
        s.name,
        s.hosts,
        cmds.len(),
        s.hosts,
        if s.aux.is_some() {
            format!(", auxiliary 192.168.2.1-{}", s.hosts)
        } else {
            String::new()
        }
    );
    print!("{}", describe(s));
    Ok(())
}

/// The namespaces of testbed `name` that exist now.
fn existing(name: &str) -> anyhow::Result<Vec<String>> {
    let out = sh(&spec::argv(&["ip", "netns", "list"]))?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|ns| Spec::owns(name, ns))
        .map(str::to_string)
        .collect())
}

/// Removes every namespace of testbed `name` (killing what runs inside) and its state
/// file. Returns how many namespaces it removed.
pub fn down(name: &str) -> anyhow::Result<usize> {
    let nss = existing(name)?;
    for ns in &nss {
        if let Ok(pids) = sh(&spec::argv(&["ip", "netns", "pids", ns])) {
            for pid in pids
                .split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok())
            {
                crate::process::signal(pid, libc::SIGKILL);
            }
        }
        sh(&spec::argv(&["ip", "netns", "del", ns]))?;
    }
    let p = state_path(name);
    if p.exists() {
        std::fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
    }
    Ok(nss.len())
}

/// A testbed that is up: its recorded spec, checked against the namespaces present.
pub fn load(name: &str) -> anyhow::Result<Spec> {
    spec::check_name(name)?;
    let p = state_path(name);
    let text = std::fs::read_to_string(&p).map_err(|_| {
        anyhow::anyhow!(
            "testbed {name:?} is not up: run `fanin testbed up --preset {name}` (as root) first{}",
            if spec::PRESETS.contains(&name) {
                ""
            } else {
                " (or with --name for a free-form testbed)"
            }
        )
    })?;
    let s: Spec =
        serde_json::from_str(&text).with_context(|| format!("reading {}", p.display()))?;
    let have = existing(name)?;
    let missing: Vec<String> = std::iter::once(s.switch_ns())
        .chain((1..=s.hosts).map(|h| s.host_ns(h)))
        .filter(|ns| !have.contains(ns))
        .collect();
    if !missing.is_empty() {
        bail!(
            "testbed {name:?} is broken: namespace(s) {} missing; run `fanin testbed down --name {name}` and up again",
            missing.join(", ")
        );
    }
    Ok(s)
}

fn describe(s: &Spec) -> String {
    let shaping = |x: &spec::Shaping| {
        format!(
            "{} Mbit/s, delay {} us, loss {} %, switch queue {}",
            x.rate_bps as f64 / 1e6,
            x.delay_us,
            x.loss_pct,
            x.queue
        )
    };
    let mut t = format!("  data network: {}\n", shaping(&s.data));
    if let Some(a) = &s.aux {
        t += &format!("  auxiliary network: {}\n", shaping(a));
    }
    t
}

fn status(name: &str) -> anyhow::Result<()> {
    let s = load(name)?;
    println!(
        "testbed {} ({}): {} hosts, switch namespace {}",
        s.name,
        s.preset.as_deref().unwrap_or("free-form"),
        s.hosts,
        s.switch_ns()
    );
    print!("{}", describe(&s));
    println!(
        "{:<6} {:<18} {:<14} {:<14} {:>14} {:>10} {:>14} {:>10}",
        "host", "namespace", "data", "aux", "host tx pkts", "drops", "switch tx pkts", "drops"
    );
    for h in 1..=s.hosts {
        let (htx, hdrop) = qdisc_counters(&s.host_ns(h), "eth0");
        let (stx, sdrop) = qdisc_counters(&s.switch_ns(), &format!("h{h}"));
        println!(
            "{:<6} {:<18} {:<14} {:<14} {:>14} {:>10} {:>14} {:>10}",
            format!("h{h}"),
            s.host_ns(h),
            s.data_ip(h).to_string(),
            s.aux_ip(h).map(|a| a.to_string()).unwrap_or("-".into()),
            htx,
            hdrop,
            stx,
            sdrop
        );
    }
    Ok(())
}

/// Packets sent and dropped by the root qdisc of `dev` in `ns` (`?` if unreadable).
fn qdisc_counters(ns: &str, dev: &str) -> (String, String) {
    let argv = spec::argv(&["tc", "-j", "-s", "-n", ns, "qdisc", "show", "dev", dev]);
    let Ok(out) = sh(&argv) else {
        return ("?".into(), "?".into());
    };
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
    let root = v
        .as_array()
        .and_then(|a| a.iter().find(|q| q["root"].as_bool() == Some(true)))
        .cloned()
        .unwrap_or_default();
    // Drops happen in the leaf queues (10: full queue, 20: emulated loss); htb counts
    // them again at the root.
    let drops: u64 = v
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|q| q["root"].as_bool() != Some(true))
                .filter_map(|q| q["drops"].as_u64())
                .sum()
        })
        .unwrap_or(0);
    (
        root["packets"]
            .as_u64()
            .map(|p| p.to_string())
            .unwrap_or("?".into()),
        drops.to_string(),
    )
}
