//! Helpers for run-control tests: a long-lived ICN (`fanin icn --session`), its nodes,
//! and `fanin ctl` answers.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::*;

/// `fanin ctl --icn HTTP [--secret-file S] ARGS`: (success, stdout, stderr).
pub fn ctl(http: SocketAddr, secret: Option<&Path>, args: &[&str]) -> (bool, String, String) {
    let mut cmd = fanin();
    cmd.args(["ctl", "--icn", &http.to_string()]);
    if let Some(s) = secret {
        cmd.arg("--secret-file").arg(s);
    }
    let out = cmd.args(args).env_remove("FANIN_SECRET").output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).trim().to_string();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// A command that must succeed: its line.
pub fn ok(http: SocketAddr, secret: &Path, args: &[&str]) -> String {
    let (good, out, err) = ctl(http, Some(secret), args);
    assert!(good, "fanin ctl {args:?}: {err}");
    out
}

/// A command that must be refused: its one-line error.
pub fn refused(http: SocketAddr, secret: &Path, args: &[&str]) -> String {
    let (good, out, err) = ctl(http, Some(secret), args);
    assert!(!good, "fanin ctl {args:?} was not refused: {out}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    err
}

pub fn status(http: SocketAddr, secret: &Path) -> serde_json::Value {
    serde_json::from_str(&ok(http, secret, &["--json", "status"])).unwrap()
}

/// Waits until the status satisfies `what` (30 s).
pub fn wait_status(http: SocketAddr, secret: &Path, what: impl Fn(&serde_json::Value) -> bool) {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let st = status(http, secret);
        if what(&st) {
            return;
        }
        assert!(Instant::now() < until, "status never got there: {st}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub struct Session {
    pub icn: Proc,
    pub http: SocketAddr,
    pub control: SocketAddr,
    pub secret: std::path::PathBuf,
}

pub fn start_session(dir: &Path) -> Session {
    start_session_with_files(dir, None)
}

/// A session ICN; with `files`, under that open-file limit (soft and hard, so the ICN
/// cannot raise it).
pub fn start_session_with_files(dir: &Path, files: Option<u32>) -> Session {
    let secret = dir.join("secret");
    std::fs::write(&secret, "session secret\n").unwrap();
    let control: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let http: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut cmd = fanin();
    if let Some(n) = files {
        let limited = format!("ulimit -n {n} && exec \"$0\" \"$@\"");
        cmd = Command::new("bash");
        cmd.args(["-c", &limited])
            .arg(fanin().get_program())
            .env("FANIN_LOG", "info");
    }
    let icn = Proc::spawn(
        "ICN",
        cmd.args(["icn", "--session", "--control", &control.to_string()])
            .args(["--metrics", &http.to_string(), "--results-dir"])
            .arg(dir.join("res"))
            .arg("--secret-file")
            .arg(&secret)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("icn.log")).unwrap()),
    );
    let _ = connect_retry(http.port());
    Session {
        icn,
        http,
        control,
        secret,
    }
}

/// A long-lived FLP or EPN (no id: the ICN gives one), with extra arguments.
pub fn node(dir: &Path, s: &Session, role: &str, name: &str, extra: &[&str]) -> Proc {
    let mut cmd: Command = fanin();
    cmd.args([role, "--session", "--icn", &s.control.to_string()])
        .arg("--secret-file")
        .arg(&s.secret)
        .args(extra);
    if role == "epn" {
        cmd.args(["--data-bind", "127.0.0.1:0"]);
    }
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
    Proc::spawn(name, cmd.stdout(Stdio::null()).stderr(log))
}
