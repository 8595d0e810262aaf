//! The ICN take-over with real processes and a real ZooKeeper: a standby that is elected
//! goes on with the same run (same run id, same TF ids, one summary). The ICN is killed
//! twice in one run under load and no TF is lost; a frozen ICN that comes back after its
//! standby took over is fenced: it acts no more and writes no summary.

mod common;

use std::path::Path;
use std::thread::JoinHandle;

use common::{start_icn_in, u, zk_node, Icn, Proc};
use fanin_node::registry::zk_server::ZkServer;

fn zk() -> ZkServer {
    ZkServer::start(std::time::Duration::from_millis(100)).unwrap_or_else(|e| {
        panic!("these tests need ZooKeeper (scripts/test installs Debian's zookeeper): {e:#}")
    })
}

/// Re-assignment on (the default), a build time-out longer than an ICN's absence.
const RUN: &str = "flps = 2\nepns = 3\nrate_hz = 100\ntfs = 1000\nstf_size = \"32KiB\"\nbuild_timeout_ms = 5000\n";

/// An ICN of the run, all of them with one results directory; `standby` ones return
/// once elected (they print nothing before).
fn icn(dir: &Path, name: &str, url: &str, standby: bool) -> Icn {
    let mut args = vec!["--registry", url, "--session-timeout-ms", "1000"];
    if standby {
        args.push("--standby");
    }
    let log = format!("{name}.log");
    let mut icn = start_icn_in(dir, &dir.join("results"), &log, RUN, "127.0.0.1:0", &args);
    icn.proc.name = name.to_string();
    icn
}

fn standby(dir: &Path, name: &'static str, url: &str) -> JoinHandle<Icn> {
    let (dir, url) = (dir.to_path_buf(), url.to_string());
    std::thread::spawn(move || icn(&dir, name, &url, true))
}

/// 3 EPNs and 2 FLPs that find the ICN in ZooKeeper.
fn cluster(dir: &Path, url: &str) -> Vec<Proc> {
    (0..3)
        .map(|i| zk_node(dir, "epn", i, url))
        .chain((0..2).map(|i| zk_node(dir, "flp", i, url)))
        .collect()
}

/// Every TF of the run has exactly one row, ids 0..n, and each one is complete.
fn every_tf_complete_once(results: &Path, n: u64) {
    let csv = std::fs::read_to_string(results.join("tfs.csv")).unwrap();
    let mut ids: Vec<u64> = csv
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            assert_eq!(f[5], "complete", "{l}");
            f[0].parse().unwrap()
        })
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..n).collect::<Vec<_>>(), "one row per TF");
}

#[test]
fn the_icn_killed_twice_under_load_loses_no_tf() {
    let server = zk();
    let url = server.url("/fanin-takeover-kill");
    let dir = tempfile::tempdir().unwrap();
    let mut a = icn(dir.path(), "icn-a", &url, false);
    let mut nodes = cluster(dir.path(), &url);
    let b = standby(dir.path(), "icn-b", &url);
    a.wait_issued(200);
    a.proc.kill9();
    let mut b = b.join().expect("standby B elected");
    let c = standby(dir.path(), "icn-c", &url);
    // B goes on with the same run: its count starts where A's ended.
    b.wait_issued(500);
    b.proc.kill9();
    let c = c.join().expect("standby C elected");
    let (st, s, results) = c.finish(180);
    assert!(st.success(), "ICN C failed; see {}", dir.path().display());
    assert_eq!(s["invariant_ok"], true, "{s}");
    assert_eq!(u(&s, "issued"), 1000, "{s}");
    assert_eq!(u(&s, "completed"), 1000, "no TF lost to two ICN kills: {s}");
    let events = s["events"].to_string();
    assert!(events.contains("take-over number 2"), "{events}");
    every_tf_complete_once(&results, 1000);
    for p in &mut nodes {
        assert!(p.wait(30).success(), "{} failed", p.name);
    }
}

#[test]
fn a_frozen_icn_that_comes_back_after_the_take_over_is_fenced() {
    let server = zk();
    let url = server.url("/fanin-takeover-freeze");
    let dir = tempfile::tempdir().unwrap();
    let mut a = icn(dir.path(), "icn-a", &url, false);
    let mut nodes = cluster(dir.path(), &url);
    let b = standby(dir.path(), "icn-b", &url);
    a.wait_issued(200);
    // Frozen past its session: B is elected and the nodes follow it.
    a.proc.signal(libc::SIGSTOP);
    let mut b = b.join().expect("standby B elected");
    b.wait_issued(400);
    a.proc.signal(libc::SIGCONT);
    // A learns it lost the lead and stops without a word: no RunStop, no summary.
    let st = a.proc.wait(30);
    assert!(
        !st.success(),
        "the deposed ICN must not end the run as if it led it"
    );
    let log = std::fs::read_to_string(dir.path().join("icn-a.log")).unwrap();
    assert!(log.contains("fenced"), "{log}");
    assert!(
        !dir.path().join("results/summary.json").exists(),
        "the deposed ICN wrote a summary"
    );
    let (st, s, results) = b.finish(180);
    assert!(st.success(), "ICN B failed; see {}", dir.path().display());
    assert_eq!(s["invariant_ok"], true, "{s}");
    assert_eq!(u(&s, "issued"), 1000, "{s}");
    assert_eq!(u(&s, "completed"), 1000, "{s}");
    every_tf_complete_once(&results, 1000);
    for p in &mut nodes {
        assert!(p.wait(30).success(), "{} failed", p.name);
    }
}
