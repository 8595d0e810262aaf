//! Helpers for tests that start real fanin processes on 127.0.0.1.
//! Every child is killed when its guard drops, so a failing test leaves nothing running.

#![allow(dead_code)]

pub mod session;

use fanin_lab::cluster::IcnLine;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub fn fanin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fanin"));
    c.env("FANIN_LOG", "info");
    c
}

/// A child process killed on drop.
pub struct Proc {
    pub name: String,
    pub child: Child,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    pub fn spawn(name: &str, cmd: &mut Command) -> Proc {
        let child = cmd
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {name}: {e}"));
        Proc {
            name: name.to_string(),
            child,
        }
    }

    /// Waits for exit, failing the test after `secs`.
    pub fn wait(&mut self, secs: u64) -> ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {secs} s",
                self.name
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn signal(&mut self, sig: i32) {
        let pid = self.child.id() as i32;
        // SAFETY: plain kill(2) on our own child's pid.
        let rc = unsafe { libc::kill(pid, sig) };
        assert_eq!(rc, 0, "kill -{sig} {}", self.name);
    }

    pub fn kill9(&mut self) {
        self.signal(libc::SIGKILL);
    }

    /// It has not exited yet.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }
}

/// A port no one listens on, below the kernel's ephemeral range, so that no outgoing
/// connection (a node retrying its ICN) takes it before a node binds it (the benches
/// take theirs below 20000).
pub fn free_port() -> u16 {
    fanin_lab::ports::free_loopback_port(20_000..32_000).expect("a free port")
}

/// A running ICN with its control and metrics addresses and its stdout lines.
pub struct Icn {
    pub proc: Proc,
    pub control: SocketAddr,
    pub metrics: SocketAddr,
    pub lines: std::io::Lines<BufReader<ChildStdout>>,
    pub results: PathBuf,
}

pub fn write_config(dir: &Path, toml: &str) -> PathBuf {
    let p = dir.join("run.toml");
    std::fs::write(&p, toml).unwrap();
    p
}

pub fn start_icn(dir: &Path, toml: &str, control: &str) -> Icn {
    start_icn_with(dir, toml, control, &[])
}

/// `start_icn` with extra arguments (e.g. a registry). Returns once the ICN printed its
/// address (a standby: once it was elected).
pub fn start_icn_with(dir: &Path, toml: &str, control: &str, extra: &[&str]) -> Icn {
    start_icn_in(dir, &dir.join("results"), "icn.log", toml, control, extra)
}

/// `start_icn_with` into a given results directory, logging to `dir/log` (ICNs that
/// take one run over from each other share the results directory).
pub fn start_icn_in(
    dir: &Path,
    results: &Path,
    log: &str,
    toml: &str,
    control: &str,
    extra: &[&str],
) -> Icn {
    let cfg = write_config(dir, toml);
    let results = results.to_path_buf();
    let mut proc = Proc::spawn(
        "ICN",
        fanin()
            .args([
                "icn",
                "--control",
                control,
                "--metrics",
                "127.0.0.1:0",
                "--progress",
            ])
            .arg("--config")
            .arg(&cfg)
            .arg("--results-dir")
            .arg(&results)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.join(log)).unwrap()),
    );
    let out = proc.child.stdout.take().unwrap();
    let mut lines = BufReader::new(out).lines();
    let first = lines.next().expect("ICN printed nothing").unwrap();
    let IcnLine::Listening {
        control,
        metrics: Some(metrics),
    } = IcnLine::parse(&first)
    else {
        panic!("no control and metrics address in {first:?}")
    };
    Icn {
        proc,
        control: control.parse().unwrap(),
        metrics: metrics.parse().unwrap(),
        lines,
        results,
    }
}

impl Icn {
    /// Reads PROGRESS lines until `issued >= n`.
    pub fn wait_issued(&mut self, n: u64) {
        for line in self.lines.by_ref() {
            if let IcnLine::Progress { issued, .. } = IcnLine::parse(&line.unwrap()) {
                if issued >= n {
                    return;
                }
            }
        }
        panic!("ICN ended before issuing {n} TFs");
    }

    /// Drains stdout (so the ICN never blocks) and waits for its exit.
    pub fn finish(mut self, secs: u64) -> (ExitStatus, serde_json::Value, PathBuf) {
        let lines = std::mem::replace(&mut self.lines, BufReader::new(empty_stdout()).lines());
        let drain = std::thread::spawn(move || for _ in lines {});
        let st = self.proc.wait(secs);
        let _ = drain.join();
        let s = read_summary(&self.results);
        (st, s, self.results.clone())
    }
}

fn empty_stdout() -> ChildStdout {
    let mut c = Command::new("true").stdout(Stdio::piped()).spawn().unwrap();
    let out = c.stdout.take().unwrap();
    let _ = c.wait();
    out
}

/// The directory `fanin run` made under `results` (a test's only run).
pub fn run_dir(results: &Path) -> PathBuf {
    std::fs::read_dir(results)
        .unwrap_or_else(|e| panic!("{}: {e}", results.display()))
        .next()
        .expect("a run directory")
        .unwrap()
        .path()
}

pub fn read_summary(dir: &Path) -> serde_json::Value {
    let p = dir.join("summary.json");
    let t = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&t).unwrap()
}

pub fn spawn_epn(dir: &Path, icn: SocketAddr, id: u32, extra: &[&str]) -> Proc {
    let mut cmd = fanin();
    cmd.args(["epn", "--icn", &icn.to_string(), "--id", &id.to_string()]);
    if !extra.contains(&"--data-bind") {
        cmd.args(["--data-bind", "127.0.0.1:0"]);
    }
    Proc::spawn(
        &format!("EPN {id}"),
        cmd.args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join(format!("epn-{id}.log"))).unwrap()),
    )
}

pub fn spawn_flp(dir: &Path, icn: SocketAddr, id: u32) -> Proc {
    spawn_flp_with(dir, icn, id, &[])
}

/// `spawn_flp` with extra arguments (e.g. `--secret-file`).
pub fn spawn_flp_with(dir: &Path, icn: SocketAddr, id: u32, extra: &[&str]) -> Proc {
    Proc::spawn(
        &format!("FLP {id}"),
        fanin()
            .args(["flp", "--icn", &icn.to_string(), "--id", &id.to_string()])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join(format!("flp-{id}.log"))).unwrap()),
    )
}

/// Checks tfs.csv: one row per issued TF, each id once; returns rows as (status, reason).
pub fn tf_rows(results: &Path, issued: u64) -> Vec<(u64, String, String)> {
    let t = std::fs::read_to_string(results.join("tfs.csv")).unwrap();
    let mut rows: Vec<(u64, String, String)> = t
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f[0].parse().unwrap(), f[5].to_string(), f[6].to_string())
        })
        .collect();
    rows.sort_by_key(|r| r.0);
    assert_eq!(
        rows.len() as u64,
        issued,
        "tfs.csv must have one row per TF"
    );
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r.0, i as u64, "TF ids 0..issued, each exactly once");
    }
    rows
}

/// GET /metrics from a node.
pub fn scrape(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// Sums the values of a metric's samples whose line contains all `parts`.
pub fn metric(text: &str, parts: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#') && parts.iter().all(|p| l.contains(p)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

pub fn u(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("summary has no integer {k}: {v}"))
}

/// The repository's root (examples, docs).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `cmd` to its end; its stdout, the test failing with its stderr if it failed.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e} (scripts/test installs what tests need)"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A connection to 127.0.0.1:`port`, retried until a node listens there (60 s).
pub fn connect_retry(port: u16) -> TcpStream {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => return s,
            Err(_) if Instant::now() < until => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => panic!("port {port}: {e}"),
        }
    }
}

/// The body of `GET path` from `addr`; None if the server cannot be reached.
pub fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out.split_once("\r\n\r\n")?.1.to_string())
}

/// An FLP or EPN (`role`: "flp", "epn") that finds the ICN in ZooKeeper at `url`
/// (session time-out 1 s), logging to `dir/ROLE-ID.log`.
pub fn zk_node(dir: &Path, role: &str, id: u32, url: &str) -> Proc {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("{role}-{id}.log")))
        .unwrap();
    let data = if role == "epn" {
        vec!["--data-bind", "127.0.0.1:0"]
    } else {
        vec![]
    };
    Proc::spawn(
        &format!("{} {id}", role.to_uppercase()),
        fanin()
            .args([role, "--registry", url, "--session-timeout-ms", "1000"])
            .args(["--id", &id.to_string()])
            .args(data)
            .stdout(Stdio::null())
            .stderr(log),
    )
}

/// Waits up to `secs` until `dir/file` satisfies `done`.
pub fn wait_for_log(dir: &std::path::Path, file: &str, secs: u64, done: impl Fn(&str) -> bool) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        let text = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
        if done(&text) {
            return;
        }
        assert!(
            std::time::Instant::now() < until,
            "{file} never got there: {text}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
