//! Where a transport measurement runs (loopback, or two hosts of a testbed across a
//! shaped link; tuned or not) and how one measurement drives its two processes.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{bail, Context};

use super::peer::{PeerReport, Transport};
use super::{NetKind, Row, Tuning};
use crate::testbed::spec::{argv, QueueLimit, Shaping, Spec};
use crate::testbed::{need_root, sh};

/// The seed's Table II TCP buffers (min, default, max), per network namespace.
const TCP_BUFFERS: &str = "4096 87380 16777216";
const TUNED_MTU: &str = "9000";
const TUNED_TXQUEUELEN: &str = "50000";
const LOOPBACK_NS: &str = "fanin-bt-lo";
const TESTBED: &str = "fanin-bt";
/// The slowest transfer a measurement is given time for, in bytes/s.
const SLOWEST: u64 = 20_000_000;

/// Where the two peers run. Dropping it removes what `set_up` made.
pub struct Place {
    recv_ns: Option<String>,
    send_ns: Option<String>,
    recv_ip: String,
    /// The slowest rate a measurement is given time for.
    slowest_bytes_per_s: u64,
    /// Namespaces or a testbed to remove at the end.
    cleanup: Cleanup,
}

enum Cleanup {
    Nothing,
    Namespace(String),
    Testbed(String),
}

impl Drop for Place {
    fn drop(&mut self) {
        match &self.cleanup {
            Cleanup::Nothing => {}
            Cleanup::Namespace(ns) => {
                let _ = sh(&argv(&["ip", "netns", "del", ns]));
            }
            Cleanup::Testbed(name) => {
                let _ = crate::testbed::down(name);
            }
        }
    }
}

/// Writes one sysctl inside a namespace.
fn sysctl(ns: &str, key: &str, value: &str) -> anyhow::Result<()> {
    let path = format!("/proc/sys/{}", key.replace('.', "/"));
    let script = format!("echo '{value}' > {path}");
    sh(&argv(&["ip", "netns", "exec", ns, "sh", "-c", &script])).map(|_| ())
}

fn tune_ns(ns: &str) -> anyhow::Result<()> {
    sysctl(ns, "net.ipv4.tcp_rmem", TCP_BUFFERS)?;
    sysctl(ns, "net.ipv4.tcp_wmem", TCP_BUFFERS)
}

impl Place {
    pub fn set_up(kind: NetKind, tuning: Tuning, rate_bps: u64) -> anyhow::Result<Place> {
        match (kind, tuning) {
            (NetKind::Loopback, Tuning::Untuned) => Ok(Place {
                recv_ns: None,
                send_ns: None,
                recv_ip: "127.0.0.1".into(),
                slowest_bytes_per_s: SLOWEST,
                cleanup: Cleanup::Nothing,
            }),
            (NetKind::Loopback, Tuning::Tuned) => loopback_tuned(),
            (NetKind::Testbed, _) => testbed(tuning, rate_bps),
        }
    }
}

/// Loopback in a namespace of its own, so the tuning touches nothing of the host's.
fn loopback_tuned() -> anyhow::Result<Place> {
    need_root("the tuned loopback case (its own network namespace)")?;
    let ns = LOOPBACK_NS;
    let _ = sh(&argv(&["ip", "netns", "del", ns]));
    sh(&argv(&["ip", "netns", "add", ns]))?;
    let place = Place {
        recv_ns: Some(ns.into()),
        send_ns: Some(ns.into()),
        recv_ip: "127.0.0.1".into(),
        slowest_bytes_per_s: SLOWEST,
        cleanup: Cleanup::Namespace(ns.into()),
    };
    sh(&argv(&["ip", "-n", ns, "link", "set", "lo", "up"]))?;
    tune_ns(ns)?;
    Ok(place)
}

/// Two hosts behind the testbed's bridge, host 1 sending to host 2; offloads stay on
/// (this measures hosts, not the switch queue).
fn testbed(tuning: Tuning, rate_bps: u64) -> anyhow::Result<Place> {
    need_root("the testbed case")?;
    let _ = crate::testbed::down(TESTBED);
    let link = Shaping {
        rate_bps,
        delay_us: 0,
        loss_pct: 0.0,
        queue: QueueLimit::Packets(1000),
    };
    let spec = Spec {
        name: TESTBED.into(),
        preset: None,
        hosts: 2,
        data: link,
        aux: None,
    };
    let place = Place {
        recv_ns: Some(spec.host_ns(2)),
        send_ns: Some(spec.host_ns(1)),
        recv_ip: spec.data_ip(2).to_string(),
        slowest_bytes_per_s: SLOWEST.min(rate_bps / 8),
        cleanup: Cleanup::Testbed(TESTBED.into()),
    };
    for c in spec.up_commands(false) {
        sh(&c).context("building the testbed")?;
    }
    if tuning == Tuning::Tuned {
        let sw = spec.switch_ns();
        for h in 1..=2 {
            let ns = spec.host_ns(h);
            tune_ns(&ns)?;
            sh(&argv(&[
                "ip", "-n", &ns, "link", "set", "eth0", "mtu", TUNED_MTU,
            ]))?;
            let q = ["ip", "-n", &ns, "link", "set", "eth0", "txqueuelen"];
            sh(&argv(&[&q[..], &[TUNED_TXQUEUELEN]].concat()))?;
            let port = format!("h{h}");
            sh(&argv(&[
                "ip", "-n", &sw, "link", "set", &port, "mtu", TUNED_MTU,
            ]))?;
        }
    }
    Ok(place)
}

static NEXT_PORT: AtomicU16 = AtomicU16::new(0);

/// A port for the next receiver: a free one on the host's loopback, or the next of a
/// range inside the bench's own namespaces.
fn port(p: &Place) -> anyhow::Result<u16> {
    if p.recv_ns.is_some() {
        return Ok(21000 + NEXT_PORT.fetch_add(1, Ordering::Relaxed) % 20000);
    }
    crate::bench::free_port()
}

fn command(ns: &Option<String>, program: &std::path::Path) -> Command {
    match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(program);
            c
        }
        None => Command::new(program),
    }
}

/// The medians of `repeat` measurements; a failed one makes the row not measured (NaN,
/// its error as note): a median of fewer runs than asked is not the row's.
pub fn measure_median(p: &Place, t: Transport, block: u64, blocks: u64, repeat: usize) -> Row {
    let mut runs = Vec::new();
    let mut note = String::new();
    for _ in 0..repeat {
        match measure_once(p, t, block, blocks) {
            Ok(m) => runs.push(m),
            Err(e) => {
                let line = format!("{e:#}").lines().next().unwrap_or("").to_string();
                note = if line.is_empty() {
                    "failed".into()
                } else {
                    line
                };
                runs.clear();
                break;
            }
        }
    }
    let median = |f: fn(&(f64, f64, f64)) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        fanin_report::median(&v)
    };
    Row {
        net: NetKind::Loopback,
        tuning: Tuning::Untuned,
        transport: t,
        block,
        gbit_s: median(|m| m.0),
        send_cpu_s_per_gb: median(|m| m.1),
        recv_cpu_s_per_gb: median(|m| m.2),
        note,
    }
}

/// (Gbit/s at the receiver, sender CPU s per GB, receiver CPU s per GB).
fn measure_once(
    p: &Place,
    t: Transport,
    block: u64,
    blocks: u64,
) -> anyhow::Result<(f64, f64, f64)> {
    if t == Transport::Iperf3 {
        return iperf3(p, block, blocks);
    }
    let addr = format!("{}:{}", p.recv_ip, port(p)?);
    let limit = p.deadline(block * blocks);
    let mut recv = Peer::spawn(&p.recv_ns, t, "recv", block, blocks, &addr)?;
    let _watchdog = Watchdog::start(&[recv.child.0.id()], limit);
    recv.expect_listening()?;
    let mut send = Peer::spawn(&p.send_ns, t, "send", block, blocks, &addr)?;
    let _watchdog2 = Watchdog::start(&[send.child.0.id()], limit);
    let r = recv.report().map_err(|e| {
        // A sender that failed first is usually why the receiver has no result.
        anyhow::anyhow!("{e}; the sender: {}", send.last_err())
    })?;
    let stdin = send.child.0.stdin.as_mut().expect("piped");
    if let Err(e) = stdin.write_all(b"done\n") {
        bail!(
            "telling the {} sender to finish: {e}: {}",
            t.name(),
            send.last_err()
        );
    }
    let s = send.report()?;
    let gb = |bytes: u64| bytes as f64 / 1e9;
    anyhow::ensure!(r.secs > 0.0, "{}: the receiver measured no time", t.name());
    Ok((
        r.bytes as f64 * 8.0 / r.secs / 1e9,
        s.cpu_s / gb(s.bytes),
        r.cpu_s / gb(r.bytes),
    ))
}

impl Place {
    /// A generous limit for one measurement: 60 s, plus the bytes at 20 MB/s or the
    /// link's rate, whichever is slower.
    fn deadline(&self, bytes: u64) -> Duration {
        Duration::from_secs(60 + bytes / self.slowest_bytes_per_s.max(1))
    }
}

/// One peer process: its stdout lines, and its last stderr line (drained by a thread
/// of its own, so a chatty peer never blocks on a full pipe).
struct Peer {
    child: Kill,
    out: Lines,
    role: &'static str,
    err: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Peer {
    fn spawn(
        ns: &Option<String>,
        t: Transport,
        role: &'static str,
        block: u64,
        blocks: u64,
        addr: &str,
    ) -> anyhow::Result<Peer> {
        let exe = std::env::current_exe().context("finding the fanin binary")?;
        let mut c = command(ns, &exe);
        c.args([
            "bench",
            "transport-peer",
            "--transport",
            t.name(),
            "--role",
            role,
        ]);
        c.args([
            "--block",
            &block.to_string(),
            "--blocks",
            &blocks.to_string(),
        ]);
        c.args(["--addr", addr]);
        c.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(Stdio::piped());
        let mut child = c
            .spawn()
            .with_context(|| format!("starting the {} {role} peer", t.name()))?;
        let out = BufReader::new(child.stdout.take().expect("piped")).lines();
        let err = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let (stderr, last) = (child.stderr.take().expect("piped"), err.clone());
        std::thread::spawn(move || {
            for l in BufReader::new(stderr).lines().map_while(Result::ok) {
                if !l.trim().is_empty() {
                    *last.lock().unwrap() = l.trim().to_string();
                }
            }
        });
        Ok(Peer {
            child: Kill(child),
            out,
            role,
            err,
        })
    }

    /// The peer's last stderr line (after stopping it, so the line is its last).
    fn last_err(&mut self) -> String {
        let _ = self.child.0.kill();
        let _ = self.child.0.wait();
        std::thread::sleep(Duration::from_millis(20));
        let last = self.err.lock().unwrap().clone();
        if last.is_empty() {
            "no error printed".into()
        } else {
            last
        }
    }

    fn expect_listening(&mut self) -> anyhow::Result<()> {
        match self.out.next() {
            Some(Ok(l)) if l.trim() == "listening" => Ok(()),
            _ => {
                let (role, err) = (self.role, self.last_err());
                bail!("the {role} peer did not start: {err}")
            }
        }
    }

    fn report(&mut self) -> anyhow::Result<PeerReport> {
        while let Some(Ok(l)) = self.out.next() {
            if let Some(json) = l.strip_prefix("report ") {
                return serde_json::from_str(json).context("a peer's report");
            }
        }
        let (role, err) = (self.role, self.last_err());
        bail!("the {role} peer ended without a result: {err}")
    }
}

/// A child killed when dropped (a measurement that failed leaves nothing behind).
struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Kills the given processes if the measurement outlives its deadline (dropping it,
/// which drops the sender, disarms it).
struct Watchdog {
    _disarm: mpsc::Sender<()>,
}

impl Watchdog {
    fn start(pids: &[u32], after: Duration) -> Watchdog {
        let (tx, rx) = mpsc::channel::<()>();
        let pids = pids.to_vec();
        std::thread::spawn(move || {
            if rx.recv_timeout(after) == Err(mpsc::RecvTimeoutError::Timeout) {
                for pid in pids {
                    crate::process::signal(pid, libc::SIGKILL);
                }
            }
        });
        Watchdog { _disarm: tx }
    }
}

type Lines = std::io::Lines<BufReader<std::process::ChildStdout>>;

/// iperf3 with the same block size (`-l`, at most 1 MiB in iperf3) and byte count.
fn iperf3(p: &Place, block: u64, blocks: u64) -> anyhow::Result<(f64, f64, f64)> {
    if block > 1 << 20 {
        bail!("iperf3 sends blocks of at most 1 MiB (-l)");
    }
    let port = port(p)?.to_string();
    let iperf = std::path::Path::new("iperf3");
    let mut server = command(&p.recv_ns, iperf);
    server.args(["-s", "-1", "-B", &p.recv_ip, "-p", &port, "--forceflush"]);
    server.stdout(Stdio::piped()).stderr(Stdio::null());
    let mut server = Kill(
        server
            .spawn()
            .context("starting iperf3 (apt-get install iperf3)")?,
    );
    let _watchdog = Watchdog::start(&[server.0.id()], p.deadline(block * blocks));
    let mut lines = BufReader::new(server.0.stdout.take().expect("piped")).lines();
    if !lines.any(|l| l.is_ok_and(|l| l.contains("Server listening"))) {
        bail!("the iperf3 server did not start");
    }
    let mut client = command(&p.send_ns, iperf);
    client.args(["-c", &p.recv_ip, "-p", &port, "-J"]);
    client.args([
        "-l",
        &block.to_string(),
        "-n",
        &(block * blocks).to_string(),
    ]);
    let out = client.output().context("running the iperf3 client")?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let sum = &v["end"]["sum_received"];
    let (Some(bps), Some(secs), Some(bytes)) = (
        sum["bits_per_second"].as_f64(),
        sum["seconds"].as_f64(),
        sum["bytes"].as_f64(),
    ) else {
        bail!("iperf3: {}", v["error"].as_str().unwrap_or("no result"));
    };
    // host: the client, which sends; remote: the server, which receives.
    let cpu = &v["end"]["cpu_utilization_percent"];
    let sent_secs = v["end"]["sum_sent"]["seconds"].as_f64().unwrap_or(secs);
    let per_gb = |pct: Option<f64>, s: f64| pct.unwrap_or(f64::NAN) / 100.0 * s / (bytes / 1e9);
    Ok((
        bps / 1e9,
        per_gb(cpu["host_total"].as_f64(), sent_secs),
        per_gb(cpu["remote_total"].as_f64(), secs),
    ))
}
