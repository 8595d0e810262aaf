//! Fail-over with a real ZooKeeper (Debian's package, its own zkServer.sh, a private
//! config per test): frozen nodes expire, killed nodes rejoin, a standby ICN takes over,
//! and ZooKeeper itself restarts during a run. Every run keeps its accounting invariant.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{fanin, read_summary, tf_rows, u, Proc};
use fanin_node::registry::zk_server::ZkServer;

fn zk(tick_ms: u64) -> ZkServer {
    ZkServer::start(std::time::Duration::from_millis(tick_ms)).unwrap_or_else(|e| {
        panic!("these tests need ZooKeeper (scripts/test installs Debian's zookeeper): {e:#}")
    })
}

/// An ICN on a free port with the registry; returns it with its PROGRESS reader.
fn icn(dir: &std::path::Path, name: &str, url: &str, toml: &str) -> common::Icn {
    let sub = dir.join(name);
    std::fs::create_dir_all(&sub).unwrap();
    let mut icn = common::start_icn_with(
        &sub,
        toml,
        "127.0.0.1:0",
        &["--registry", url, "--session-timeout-ms", "1000"],
    );
    icn.proc.name = name.to_string();
    icn
}

fn node(dir: &std::path::Path, role: &str, id: u32, url: &str) -> Proc {
    common::zk_node(dir, role, id, url)
}

fn membership(s: &serde_json::Value) -> Vec<(String, String, String)> {
    s["membership"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["node"].as_str().unwrap().to_string(),
                e["kind"].as_str().unwrap().to_string(),
                e["detail"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

const RUN: &str =
    "flps = 2\nepns = 3\nrate_hz = 100\ntfs = 1200\nstf_size = \"32KiB\"\nbuild_timeout_ms = 1000\n";

#[test]
fn nodes_find_the_icn_in_zookeeper_frozen_ones_expire_killed_ones_rejoin() {
    let server = zk(100);
    let url = server.url("/fanin-t1");
    let dir = tempfile::tempdir().unwrap();
    let mut icn = icn(dir.path(), "icn", &url, RUN);
    // No --icn: every node finds the ICN through ZooKeeper.
    let mut epns: Vec<Proc> = (0..3).map(|i| node(dir.path(), "epn", i, &url)).collect();
    let mut flps: Vec<Proc> = (0..2).map(|i| node(dir.path(), "flp", i, &url)).collect();
    icn.wait_issued(100);
    epns[1].kill9();
    icn.wait_issued(200);
    epns[1] = node(dir.path(), "epn", 1, &url);
    // Frozen: its connection stays open; only the session expiry (1 s) tells.
    epns[2].signal(libc::SIGSTOP);
    icn.wait_issued(450);
    epns[2].signal(libc::SIGCONT);
    icn.wait_issued(550);
    flps[0].kill9();
    icn.wait_issued(600);
    flps[0] = node(dir.path(), "flp", 0, &url);
    let (st, s, results) = icn.finish(120);
    assert!(st.success(), "ICN failed; see {}", dir.path().display());
    assert_eq!(s["invariant_ok"], true, "{s}");
    assert_eq!(u(&s, "issued"), 1200);
    assert_eq!(
        s["dropped_by_reason"]["epn_lost"].as_u64().unwrap_or(0),
        0,
        "{s}"
    );
    let m = membership(&s);
    assert!(
        m.iter()
            .any(|e| e.0 == "EPN 2" && e.1 == "lost" && e.2.contains("registry")),
        "the frozen EPN is detected by its expired session: {m:?}"
    );
    for node in ["EPN 1", "EPN 2", "FLP 0"] {
        assert!(
            m.iter().any(|e| e.0 == node && e.1 == "rejoined"),
            "{node}: {m:?}"
        );
    }
    let rows = tf_rows(&results, 1200);
    assert!(rows
        .iter()
        .filter(|r| r.0 >= 1050)
        .all(|r| r.1 == "complete"));
    for p in flps.iter_mut().chain(epns.iter_mut()) {
        assert!(p.wait(30).success(), "{} failed", p.name);
    }
}

#[test]
fn a_standby_icn_takes_over_and_tf_ids_never_repeat() {
    let server = zk(100);
    let url = server.url("/fanin-t2");
    let dir = tempfile::tempdir().unwrap();
    let toml = "flps = 2\nepns = 3\nrate_hz = 100\ntfs = 400\nstf_size = \"32KiB\"\nbuild_timeout_ms = 1000\n";
    let mut leader = icn(dir.path(), "icn-a", &url, toml);
    let mut nodes: Vec<Proc> = (0..3)
        .map(|i| node(dir.path(), "epn", i, &url))
        .chain((0..2).map(|i| node(dir.path(), "flp", i, &url)))
        .collect();
    leader.wait_issued(150);
    // The standby waits for leadership before it even reports its address.
    let standby_dir = dir.path().join("icn-b");
    std::fs::create_dir_all(&standby_dir).unwrap();
    let standby = std::thread::spawn({
        let (url, dir) = (url.clone(), standby_dir.clone());
        move || {
            common::start_icn_with(
                &dir,
                toml,
                "127.0.0.1:0",
                &[
                    "--registry",
                    &url,
                    "--standby",
                    "--session-timeout-ms",
                    "1000",
                ],
            )
        }
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    leader.proc.kill9();
    let b = standby.join().expect("standby ICN");
    let (st, s, results) = b.finish(120);
    assert!(st.success(), "standby failed; see {}", dir.path().display());
    assert_eq!(s["invariant_ok"], true, "{s}");
    assert_eq!(u(&s, "issued"), 400);
    assert_eq!(u(&s, "completed"), 400, "{s}");
    // The first ICN reserved ids 0..400: the standby's ids are all above.
    let csv = std::fs::read_to_string(results.join("tfs.csv")).unwrap();
    let ids: Vec<u64> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(ids.len(), 400);
    assert!(ids.iter().all(|&i| i >= 400), "ids repeat: {:?}", &ids[..5]);
    for p in &mut nodes {
        assert!(p.wait(30).success(), "{} failed", p.name);
    }
}

#[test]
fn zookeeper_restarted_during_a_run_loses_nothing() {
    let mut server = zk(500);
    let url = server.url("/fanin-t3");
    let dir = tempfile::tempdir().unwrap();
    let toml = "flps = 2\nepns = 3\nrate_hz = 100\ntfs = 600\nstf_size = \"32KiB\"\nbuild_timeout_ms = 1000\nzk_session_timeout_ms = 8000\n";
    let sub = dir.path().join("icn");
    std::fs::create_dir_all(&sub).unwrap();
    let icn = common::start_icn_with(
        &sub,
        toml,
        "127.0.0.1:0",
        &["--registry", &url, "--session-timeout-ms", "8000"],
    );
    let control: SocketAddr = icn.control;
    let _ = control;
    let mut icn = icn;
    let mut nodes: Vec<Proc> = (0..3)
        .map(|i| node(dir.path(), "epn", i, &url))
        .chain((0..2).map(|i| node(dir.path(), "flp", i, &url)))
        .collect();
    icn.wait_issued(150);
    server.restart().expect("restarting ZooKeeper");
    icn.wait_issued(450);
    let (st, s, _) = icn.finish(120);
    assert!(st.success());
    assert_eq!(s["invariant_ok"], true, "{s}");
    assert_eq!(u(&s, "completed"), 600, "{s}");
    for p in &mut nodes {
        assert!(p.wait(30).success(), "{} failed", p.name);
    }
    let _ = read_summary;
}

/// ZooKeeper down for three session time-outs: every session ends, no other ICN can be
/// elected, so the run goes on over its TCP connections, and the ICN leads again once the
/// registry is back. The summary says so; nothing is lost.
#[test]
fn a_zookeeper_outage_longer_than_the_session_does_not_end_the_run() {
    let mut server = zk(100);
    let url = server.url("/fanin-outage");
    let dir = tempfile::tempdir().unwrap();
    // 1800 TFs at 100 Hz: the run still issues some 13 s after ZooKeeper is back, time
    // for a slow server to start and the ICN to be elected again.
    let toml = "flps = 1\nepns = 2\nrate_hz = 100\ntfs = 1800\nstf_size = \"16KiB\"\nbuild_timeout_ms = 10000\nlease_ms = 10000\n";
    let mut icn = icn(dir.path(), "icn", &url, toml);
    let mut nodes: Vec<Proc> = (0..2)
        .map(|i| node(dir.path(), "epn", i, &url))
        .chain(std::iter::once(node(dir.path(), "flp", 0, &url)))
        .collect();
    icn.wait_issued(150);
    server.stop().unwrap();
    std::thread::sleep(std::time::Duration::from_secs(3));
    server.restart().expect("restarting ZooKeeper");
    let (st, s, _) = icn.finish(120);
    assert!(st.success(), "{s}");
    assert_eq!(u(&s, "issued"), 1800, "the run was not cut short: {s}");
    assert_eq!(u(&s, "completed"), 1800, "{s}");
    assert_eq!(s["invariant_ok"], true, "{s}");
    let events = s["events"].to_string();
    assert!(events.contains("lost the registry leadership"), "{events}");
    assert!(events.contains("leads again in the registry"), "{events}");
    for p in &mut nodes {
        assert!(p.wait(30).success(), "{} failed", p.name);
    }
}

#[test]
fn an_experiment_kills_the_icn_and_its_standby_takes_over() {
    let dir = tempfile::tempdir().unwrap();
    let exp = dir.path().join("icn-fault.toml");
    std::fs::write(
        &exp,
        r#"
name = "icn-fault"
[run]
flps = 2
epns = 2
rate_hz = 100
tfs = 500
stf_size = "16KiB"
registry = "zookeeper"
zk_tick_ms = 100
zk_session_timeout_ms = 1000
[[fault]]
node = "epn 1"
action = "kill"
at_s = 0.5
restart_after_s = 0.2
[[fault]]
node = "icn"
action = "kill"
at_s = 1.0
"#,
    )
    .unwrap();
    let out = fanin()
        .args(["run", exp.to_str().unwrap(), "--results"])
        .arg(dir.path().join("results"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row = text
        .lines()
        .find(|l| l.trim_start().starts_with("ICN"))
        .unwrap_or_else(|| panic!("no fault row for the ICN: {text}"));
    let f: Vec<&str> = row.split_whitespace().collect();
    // ICN, kill, at, detect (election), rejoin (standby's run started)
    let elected: f64 = f[3].parse().unwrap_or_else(|_| panic!("{row}"));
    assert!(elected > 0.0, "{row}");
    assert!(f[4].parse::<f64>().is_ok(), "{row}");
    assert!(text.contains("the standby was elected"), "{text}");
    // Faults before the take-over keep their times on the first run's clock.
    let epn = text
        .lines()
        .find(|l| l.trim_start().starts_with("EPN 1"))
        .unwrap_or_else(|| panic!("no fault row for EPN 1: {text}"));
    let at: f64 = epn.split_whitespace().nth(3).unwrap().parse().unwrap();
    // Before the ICN is killed at 1.0 s; a loaded machine may signal late.
    assert!((0.4..0.95).contains(&at), "EPN 1 killed at 0.5 s: {epn}");
    // The standby's run is complete and accounted for.
    assert!(text.contains("issued 500 completed 500"), "{text}");
    assert!(text.contains("invariant ok"), "{text}");
}

/// A node started while a run was going that never gets in (here: its id is taken, a
/// refusal it keeps trying past) ends with that run, not at the end of its connect
/// time-out: it learned the run from the registry when it started, and the registry
/// says when that run ended.
#[test]
fn a_node_that_never_got_into_its_run_ends_with_the_run() {
    let server = zk(100);
    let url = server.url("/fanin-late");
    let dir = tempfile::tempdir().unwrap();
    let toml = "flps = 1\nepns = 1\nrate_hz = 100\ntfs = 1000\nstf_size = \"32KiB\"\n";
    let mut icn = icn(dir.path(), "icn", &url, toml);
    let mut nodes = [
        node(dir.path(), "epn", 0, &url),
        node(dir.path(), "flp", 0, &url),
    ];
    icn.wait_issued(50);
    let log = dir.path().join("spare.log");
    let mut spare = patient_epn0(&url, &log);
    // Refused while the run goes on (10 s of TFs; the first refusal comes within one).
    let deadline = std::time::Instant::now() + Duration::from_secs(8);
    while !std::fs::read_to_string(&log).is_ok_and(|t| t.contains("already")) {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(std::time::Instant::now() < deadline, "not refused: {text}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (st, s, _) = icn.finish(60);
    assert!(st.success());
    assert_eq!(s["invariant_ok"], true, "{s}");
    assert_eq!(u(&s, "completed"), 1000, "{s}");
    for p in &mut nodes {
        assert!(p.wait(30).success(), "{} failed", p.name);
    }
    // It heard the end from the registry, or from the ICN refusing it as it stopped.
    ends_cleanly(&mut spare, &log, 20, &["ended", "nothing to join"]);
}

/// A node inside its join when its run ends (the elected address takes the connection
/// and never answers, so the node waits for its challenge, 10 s) stops within a second
/// or so: it watches the registry's run state while it joins.
#[test]
fn a_node_waiting_inside_its_join_stops_when_the_registry_says_its_run_ended() {
    let server = zk(100);
    let url = server.url("/fanin-stuck");
    let dir = tempfile::tempdir().unwrap();
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap().to_string();
    let (rt, lead) = leader_at(&url, &addr);
    let v = rt
        .block_on(lead.set_run_state(&run_7(dir.path(), false).encode(), None))
        .unwrap();
    let log = dir.path().join("epn.log");
    let mut epn = patient_epn0(&url, &log);
    // Its connection: the EPN now waits inside its join for a challenge.
    silent.set_nonblocking(true).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let _held = loop {
        match silent.accept() {
            Ok((conn, _)) => break conn,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                assert!(std::time::Instant::now() < deadline, "never came: {text}");
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("accept: {e}"),
        }
    };
    rt.block_on(lead.set_run_state(&run_7(dir.path(), true).encode(), Some(v)))
        .unwrap();
    ends_cleanly(
        &mut epn,
        &log,
        8,
        &["run 7 ended while this EPN was joining"],
    );
}

/// A node the launcher starts again into its run (`--rejoin`) joins it while it goes,
/// and ends at once once it ended: the registry says no run is going, so it has nothing
/// to join. The same node without `--rejoin` (one started for the next run) waits.
#[test]
fn a_node_started_again_after_its_run_ended_has_nothing_to_rejoin() {
    let server = zk(100);
    let url = server.url("/fanin-again");
    let dir = tempfile::tempdir().unwrap();
    // The run's leader address answers nothing: a node that joins keeps trying.
    let (rt, lead) = leader_at(&url, "127.0.0.1:9");
    let v = rt
        .block_on(lead.set_run_state(&run_7(dir.path(), false).encode(), None))
        .unwrap();
    let log = dir.path().join("during.log");
    let mut during = patient_epn0_with(&url, &log, &["--rejoin"]);
    still_waiting(&mut during, &log);
    rt.block_on(lead.set_run_state(&run_7(dir.path(), true).encode(), Some(v)))
        .unwrap();
    ends_cleanly(&mut during, &log, 8, &["run 7 ended"]);
    let log = dir.path().join("after.log");
    let mut after = patient_epn0_with(&url, &log, &["--rejoin"]);
    ends_cleanly(&mut after, &log, 10, &["nothing to rejoin"]);
    let log = dir.path().join("next.log");
    let mut next = patient_epn0(&url, &log);
    still_waiting(&mut next, &log);
    next.kill9();
}

/// An ICN whose run ended while the registry was out of reach wrote its summary but
/// could not mark the run ended. A standby elected later finds that summary: it marks
/// the run ended and takes nothing over (it took the finished run over, rewriting its
/// rows and summary, and a run without a count issued for ever).
#[test]
fn a_standby_takes_nothing_over_from_a_run_whose_summary_is_written() {
    let server = zk(100);
    let url = server.url("/fanin-summarized");
    let dir = tempfile::tempdir().unwrap();
    let results = dir.path().join("results");
    std::fs::create_dir_all(&results).unwrap();
    let summary = r#"{"run_id": 7, "invariant_ok": true}"#;
    std::fs::write(results.join("summary.json"), summary).unwrap();
    let (rt, lead) = leader_at(&url, "127.0.0.1:9");
    rt.block_on(lead.set_run_state(&run_7(&results, false).encode(), None))
        .unwrap();
    let cfg = common::write_config(dir.path(), "flps = 1\nepns = 1\nrate_hz = 10\n");
    let log = dir.path().join("standby.log");
    let mut standby = Proc::spawn(
        "standby ICN",
        fanin()
            .args(["icn", "--standby", "--registry", &url])
            .args(["--control", "127.0.0.1:0", "--metrics", "127.0.0.1:0"])
            .arg("--config")
            .arg(&cfg)
            .arg("--results-dir")
            .arg(&results)
            .stderr(std::fs::File::create(&log).unwrap()),
    );
    // It must have seen the leader (a standby), or it would start a run of its own.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("standby; the ICN at")
    {
        assert!(std::time::Instant::now() < deadline, "never stood by");
        assert!(standby.is_running(), "the standby ended");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(lead);
    drop(rt);
    let st = standby.wait(60);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!st.success(), "{text}");
    assert!(text.contains("ended while this ICN stood by"), "{text}");
    assert_eq!(
        std::fs::read_to_string(results.join("summary.json")).unwrap(),
        summary
    );
    assert!(!results.join("tfs.icn1.csv").exists(), "taken over");
    let reg = fanin_node::registry::RegistryUrl::parse(&url).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let reg = rt
        .block_on(fanin_node::registry::zk::ZkRegistry::connect(
            &reg,
            Duration::from_secs(10),
        ))
        .unwrap();
    assert!(
        rt.block_on(fanin_node::icn::run_state::ended(&reg, 7)),
        "marked ended"
    );
}

/// Three seconds on, the node is still there, trying to join.
fn still_waiting(p: &mut Proc, log: &std::path::Path) {
    std::thread::sleep(Duration::from_secs(3));
    let text = std::fs::read_to_string(log).unwrap_or_default();
    assert!(p.is_running(), "{} must wait to join: {text}", p.name);
}

/// A registry session of the test's own (a worker thread keeps it alive while the test
/// waits), elected leader of the run at `addr`.
fn leader_at(
    url: &str,
    addr: &str,
) -> (
    tokio::runtime::Runtime,
    fanin_node::registry::zk::Leadership,
) {
    use fanin_node::registry::{runtime::RUN, zk::ZkRegistry, RegistryUrl};
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let reg_url = RegistryUrl::parse(url).unwrap();
    let reg = rt
        .block_on(ZkRegistry::connect(&reg_url, Duration::from_secs(10)))
        .unwrap();
    let lead = rt.block_on(reg.elect(RUN, addr)).unwrap();
    (rt, lead)
}

/// Run 7's state in the registry, going or ended.
fn run_7(dir: &std::path::Path, ended: bool) -> fanin_node::icn::run_state::RunState {
    fanin_node::icn::run_state::RunState {
        run_id: 7,
        id_base: 0,
        epoch: 0,
        results: dir.display().to_string(),
        rows: "tfs.csv".into(),
        ended,
    }
}

/// An EPN 0 with the registry that would try to join for two minutes; its log in `log`.
fn patient_epn0(url: &str, log: &std::path::Path) -> Proc {
    patient_epn0_with(url, log, &[])
}

/// The same with more flags.
fn patient_epn0_with(url: &str, log: &std::path::Path, extra: &[&str]) -> Proc {
    Proc::spawn(
        "EPN 0",
        fanin()
            .args(["epn", "--registry", url, "--session-timeout-ms", "1000"])
            .args(["--id", "0", "--data-bind", "127.0.0.1:0"])
            .args(["--connect-timeout", "120"])
            .args(extra)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(log).unwrap()),
    )
}

/// The node exits with success within `secs`, its log saying one of `says`.
fn ends_cleanly(p: &mut Proc, log: &std::path::Path, secs: u64, says: &[&str]) {
    let st = p.wait(secs);
    let text = std::fs::read_to_string(log).unwrap();
    assert!(st.success(), "{text}");
    assert!(says.iter().any(|s| text.contains(s)), "{text}");
}
