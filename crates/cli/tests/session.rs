//! Run control with real processes: one ICN, FLPs and EPNs that stay up for a session of
//! runs (configure, start, pause, resume, stop, reconfigure, start, stop, exit).

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::session::*;
use common::*;

fn summary(dir: &Path, run: u32) -> serde_json::Value {
    read_summary(&dir.join(format!("res/run-{run}")))
}

/// Runs until `issued >= n`, then stops it; the stop answers with the run's counts.
fn run_until(s: &Session, n: u64) -> String {
    wait_status(s.http, &s.secret, |st| st["issued"].as_u64() >= Some(n));
    ok(s.http, &s.secret, &["stop"])
}

#[test]
fn a_two_run_session_on_one_set_of_processes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let s = start_session(dir);
    let (http, secret) = (s.http, s.secret.as_path());
    let mut nodes = vec![
        node(dir, &s, "flp", "flp-a", &[]),
        node(dir, &s, "flp", "flp-b", &[]),
        node(dir, &s, "epn", "epn-a", &[]),
    ];
    // Strangers get nothing: no token, no control.
    let (good, _, err) = ctl(http, None, &["start"]);
    assert!(
        !good && err.contains("run control needs the token"),
        "{err}"
    );
    assert!(ok(http, secret, &["status"]).starts_with("IDLE run 1"));
    let err = refused(http, secret, &["start"]);
    assert!(err.contains("no run is configured"), "{err}");
    let run_a = repo_root().join("examples/session/run-a.toml");
    let run_b = repo_root().join("examples/session/run-b.toml");
    let line = ok(http, secret, &["configure", run_a.to_str().unwrap()]);
    assert!(
        line.starts_with("run 1 configured: 2 FLPs, 2 EPNs"),
        "{line}"
    );
    // The second EPN joins late and learns the state (its gauge) before the run starts.
    let m: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    nodes.push(node(
        dir,
        &s,
        "epn",
        "epn-late",
        &["--metrics", &m.to_string()],
    ));
    let state = |want: f64| {
        let until = Instant::now() + Duration::from_secs(30);
        let now = || metric(&http_get(m, "/metrics").unwrap_or_default(), &["run_state"]);
        while now() != want {
            assert!(
                Instant::now() < until,
                "the late EPN never learnt state {want}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    state(2.0); // CONFIGURED
    assert_eq!(ok(http, secret, &["start"]), "run 1 started");
    state(3.0); // RUNNING
    wait_status(http, secret, |st| st["issued"].as_u64() >= Some(50));
    assert_eq!(ok(http, secret, &["pause"]), "run 1 paused");
    state(4.0); // PAUSED
    let issued = status(http, secret)["issued"].clone();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        status(http, secret)["issued"],
        issued,
        "TFs issued while paused"
    );
    let err = refused(http, secret, &["configure", run_b.to_str().unwrap()]);
    assert!(err.contains("a run is PAUSED: stop it first"), "{err}");
    assert_eq!(ok(http, secret, &["resume"]), "run 1 resumed");
    let end = run_until(&s, issued.as_u64().unwrap() + 50);
    assert!(
        end.starts_with("run 1 ended: issued ") && end.contains("res/run-1"),
        "{end}"
    );
    let one = summary(dir, 1);
    assert_eq!(one["invariant_ok"], true);
    assert_eq!(u(&one, "issued"), u(&one, "completed"), "{one}");
    assert!(one["paused_s"].as_f64().unwrap() >= 0.5, "{one}");
    // START's own actions (the run's start) reach the run's files; the report is drawn
    // beside the session, a moment after the run ended.
    assert!(dir.join("res/run-1/run_start_us").is_file());
    wait_for_log(dir, "res/run-1/report.html", 30, |html| {
        html.ends_with("</html>\n")
    });
    // Reconfigured between runs: the same processes run run 2.
    let line = ok(http, secret, &["configure", run_b.to_str().unwrap()]);
    assert!(line.starts_with("run 2 configured"), "{line}");
    assert_eq!(ok(http, secret, &["start"]), "run 2 started");
    let end = run_until(&s, 100);
    assert!(end.starts_with("run 2 ended"), "{end}");
    let two = summary(dir, 2);
    assert_eq!(
        (two["policy"].as_str(), two["stf_size"].as_str()),
        (Some("least-loaded"), Some("65536"))
    );
    assert_eq!(two["invariant_ok"], true);
    assert_eq!(u(&two, "issued"), u(&two, "completed"), "{two}");
    // Each node's counters are the run's own, not the session's.
    for flp in ["FLP 0", "FLP 1"] {
        assert_eq!(
            two["nodes"][flp]["stfs.sent"], two["issued"],
            "{flp}: {two}"
        );
    }
    for n in &mut nodes {
        assert!(
            n.child.try_wait().unwrap().is_none(),
            "{} exited between runs",
            n.name
        );
    }
    assert!(ok(http, secret, &["status"]).starts_with("CONFIGURED run 3"));
    stop_after_a_run_that_ended_by_itself(dir, &s, 3);
    assert_eq!(ok(http, secret, &["exit"]), "the session ends");
    let mut s = s;
    for p in nodes.iter_mut().chain([&mut s.icn]) {
        let st = p.wait(20);
        assert!(st.success(), "{} ended with {st}", p.name);
    }
}

/// A run of a set length ends by itself; a script's stop after it still succeeds and
/// names that run (run `n`, on the session's nodes: 2 FLPs, 2 EPNs).
fn stop_after_a_run_that_ended_by_itself(dir: &Path, s: &Session, n: u64) {
    let (http, secret) = (s.http, s.secret.as_path());
    let short = dir.join("short.toml");
    let run = "[run]\nflps = 2\nepns = 2\nrate_hz = 200\ntfs = 40\nstf_size = \"16KiB\"\n";
    std::fs::write(&short, run).unwrap();
    ok(http, secret, &["configure", short.to_str().unwrap()]);
    assert_eq!(ok(http, secret, &["start"]), format!("run {n} started"));
    wait_status(http, secret, |st| st["last_run"]["run_number"] == n);
    let end = ok(http, secret, &["stop"]);
    let want = format!("run {n} ended (it had ended already): issued 40 ");
    assert!(end.starts_with(&want), "{end}");
}

#[test]
fn nodes_wait_while_the_icn_is_idle_and_leave_on_exit() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut s = start_session(dir);
    let mut flp = node(dir, &s, "flp", "flp", &[]);
    // Refused as IDLE, it waits (and says so once).
    let until = Instant::now() + Duration::from_secs(30);
    let log = || std::fs::read_to_string(dir.join("flp.log")).unwrap_or_default();
    while !log().contains("waiting for a run that takes this node") {
        assert!(Instant::now() < until, "the FLP never waited: {}", log());
        assert!(
            flp.child.try_wait().unwrap().is_none(),
            "the FLP gave up while IDLE"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let err = refused(s.http, &s.secret, &["pause"]);
    assert!(err.contains("pause is not possible in state IDLE"), "{err}");
    // A run larger than a session admits at once could never start: refused.
    let huge = dir.join("huge.toml");
    std::fs::write(
        &huge,
        "[run]\nflps = 3000\nepns = 2000\nrate_hz = 10\ntfs = 10\n",
    )
    .unwrap();
    let err = refused(s.http, &s.secret, &["configure", huge.to_str().unwrap()]);
    assert!(
        err.contains("flps + epns: 5000 nodes, a session takes at most 4096"),
        "{err}"
    );
    ok(s.http, &s.secret, &["exit"]);
    assert!(flp.wait(20).success());
    assert!(s.icn.wait(20).success());
}

/// 300 connections that never speak, held open, to an ICN allowed 128 open files: its
/// handshake pool stays within its share of them (the flood evicts itself), so the ICN
/// never runs out of files, and a 2-FLP, 2-EPN run registers, runs and stops meanwhile.
#[test]
fn a_flood_larger_than_the_icns_open_files_keeps_no_node_out() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut s = start_session_with_files(dir, Some(128));
    let flood: Vec<std::net::TcpStream> = (0..300)
        .map(|_| std::net::TcpStream::connect(s.control).unwrap())
        .collect();
    let mut nodes = vec![
        node(dir, &s, "flp", "flp-a", &[]),
        node(dir, &s, "flp", "flp-b", &[]),
        node(dir, &s, "epn", "epn-a", &[]),
        node(dir, &s, "epn", "epn-b", &[]),
    ];
    let run_a = repo_root().join("examples/session/run-a.toml");
    ok(s.http, &s.secret, &["configure", run_a.to_str().unwrap()]);
    assert_eq!(ok(s.http, &s.secret, &["start"]), "run 1 started");
    run_until(&s, 50);
    let m = http_get(s.http, "/metrics").unwrap_or_default();
    let errors = |kind: &str| metric(&m, &["protocol_errors_total", &format!("\"{kind}\"")]);
    assert_eq!(errors("accept"), 0.0, "the ICN never ran out of open files");
    assert!(
        errors("handshake_evicted") >= 100.0,
        "the flood evicted itself"
    );
    assert_eq!(summary(dir, 1)["invariant_ok"], true);
    drop(flood);
    ok(s.http, &s.secret, &["exit"]);
    for p in &mut nodes {
        assert!(p.wait(30).success(), "{} failed", p.name);
    }
    assert!(s.icn.wait(20).success());
}

/// Waits until `name`'s log holds `what`.
fn log_says(dir: &Path, name: &str, what: &str) {
    let until = Instant::now() + Duration::from_secs(30);
    let log = || std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
    while !log().contains(what) {
        assert!(
            Instant::now() < until,
            "{name} never said {what:?}: {}",
            log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn an_flp_connecting_to_a_frozen_epn_hears_the_session_end() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut s = start_session(dir);
    let toml = "[run]\nflps = 1\nepns = 2\nrate_hz = 100\nduration_s = 3600\n";
    let cfg = write_config(dir, toml);
    ok(s.http, &s.secret, &["configure", cfg.to_str().unwrap()]);
    let mut epns = [
        node(dir, &s, "epn", "epn-a", &[]),
        node(dir, &s, "epn", "epn-b", &[]),
    ];
    log_says(dir, "epn-a", "registered for run");
    log_says(dir, "epn-b", "registered for run");
    // A frozen EPN: its kernel accepts the FLP's connection, its Challenge never comes.
    epns[1].signal(libc::SIGSTOP);
    let mut flp = node(dir, &s, "flp", "flp", &[]);
    // The FLP is in the frozen EPN's handshake once its connection to it is up.
    let until = Instant::now() + Duration::from_secs(30);
    while !listening_ports(epns[1].child.id())
        .iter()
        .any(|&p| connected_to(p))
    {
        assert!(
            Instant::now() < until,
            "the FLP never reached the frozen EPN"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    ok(s.http, &s.secret, &["exit"]);
    assert!(flp.wait(20).success(), "the FLP did not leave");
    let log = std::fs::read_to_string(dir.join("flp.log")).unwrap();
    assert!(log.contains("run stopped while connecting to EPN"), "{log}");
    assert!(!log.contains("no frame within"), "{log}");
    epns[1].kill9();
    assert!(epns[0].wait(20).success());
    assert!(s.icn.wait(20).success());
}

/// The TCP ports process `pid` listens on (from `ss`).
fn listening_ports(pid: u32) -> Vec<u16> {
    let out = Command::new("ss").args(["-Htlnp"]).output().expect("ss");
    let owner = format!("pid={pid},");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&owner))
        .filter_map(|l| {
            l.split_whitespace()
                .nth(3)?
                .rsplit(':')
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// Some connection to `port` is established.
fn connected_to(port: u16) -> bool {
    let out = Command::new("ss")
        .args([
            "-Htn",
            "state",
            "established",
            "dport",
            "=",
            &format!(":{port}"),
        ])
        .output()
        .expect("ss");
    !out.stdout.is_empty()
}
