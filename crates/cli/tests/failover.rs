//! Fail-over with real processes: nodes that die (kill -9) or freeze (SIGSTOP) leave the
//! schedule, come back under the same id and rejoin; every TF stays accounted for.

mod common;

use common::{spawn_epn, spawn_flp, start_icn, tf_rows, u, wait_for_log, Proc};

fn membership(s: &serde_json::Value) -> Vec<(f64, String, String, String)> {
    s["membership"]
        .as_array()
        .expect("membership in summary")
        .iter()
        .map(|e| {
            (
                e["t_s"].as_f64().unwrap(),
                e["node"].as_str().unwrap().to_string(),
                e["kind"].as_str().unwrap().to_string(),
                e["detail"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn an_epn_and_an_flp_that_die_and_come_back_rejoin_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let mut icn = start_icn(
        dir.path(),
        "flps = 2\nepns = 3\nrate_hz = 100\ntfs = 1000\nstf_size = \"64KiB\"\nbuild_timeout_ms = 1000\nlease_ms = 2000\n",
        "127.0.0.1:0",
    );
    let mut epns: Vec<Proc> = (0..3)
        .map(|i| spawn_epn(dir.path(), icn.control, i, &[]))
        .collect();
    let mut flps: Vec<Proc> = (0..2)
        .map(|i| spawn_flp(dir.path(), icn.control, i))
        .collect();
    icn.wait_issued(100);
    epns[1].kill9();
    icn.wait_issued(250);
    epns[1] = spawn_epn(dir.path(), icn.control, 1, &[]);
    icn.wait_issued(400);
    flps[1].kill9();
    icn.wait_issued(500);
    flps[1] = spawn_flp(dir.path(), icn.control, 1);
    let (st, s, results) = icn.finish(120);
    assert!(st.success(), "ICN failed; see {}", dir.path().display());
    assert_eq!(s["invariant_ok"], true, "{s}");
    assert_eq!(u(&s, "issued"), 1000);
    // Zero-loss mode: the dead EPN's TFs moved, none dropped for it.
    assert_eq!(
        s["dropped_by_reason"]["epn_lost"].as_u64().unwrap_or(0),
        0,
        "{s}"
    );
    // While FLP 1 was gone, TFs could not be complete: dropped at issue, with a reason.
    assert!(
        s["dropped_by_reason"]["flp_lost"].as_u64().unwrap_or(0) > 0,
        "{s}"
    );
    let m = membership(&s);
    let has = |node: &str, kind: &str| m.iter().any(|e| e.1 == node && e.2 == kind);
    assert!(has("EPN 1", "lost") && has("EPN 1", "rejoined"), "{m:?}");
    assert!(has("FLP 1", "lost") && has("FLP 1", "rejoined"), "{m:?}");
    // After both came back, the run is whole again: the last 150 TFs all complete,
    // and the restarted EPN 1 builds its share of them.
    let rows = tf_rows(&results, 1000);
    let tail: Vec<_> = rows.iter().filter(|r| r.0 >= 850).collect();
    assert!(
        tail.iter().all(|r| r.1 == "complete"),
        "{:?}",
        tail.iter()
            .filter(|r| r.1 != "complete")
            .take(5)
            .collect::<Vec<_>>()
    );
    let csv = std::fs::read_to_string(results.join("tfs.csv")).unwrap();
    let on_epn1 = csv
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split(',').collect();
            f[0].parse::<u64>().unwrap() >= 850 && f[1] == "1"
        })
        .count();
    assert!(
        on_epn1 >= 30,
        "restarted EPN 1 built {on_epn1} of the last 150 TFs"
    );
    for p in flps.iter_mut().chain(epns.iter_mut()) {
        assert!(p.wait(30).success(), "{} failed", p.name);
    }
}

#[test]
fn a_frozen_epn_loses_its_lease_its_tfs_move_and_it_rejoins_when_continued() {
    let dir = tempfile::tempdir().unwrap();
    let mut icn = start_icn(
        dir.path(),
        "flps = 2\nepns = 3\nrate_hz = 100\ntfs = 1000\nstf_size = \"64KiB\"\nbuild_timeout_ms = 5000\nlease_ms = 1000\n",
        "127.0.0.1:0",
    );
    let mut epns: Vec<Proc> = (0..3)
        .map(|i| spawn_epn(dir.path(), icn.control, i, &[]))
        .collect();
    let mut flps: Vec<Proc> = (0..2)
        .map(|i| spawn_flp(dir.path(), icn.control, i))
        .collect();
    icn.wait_issued(100);
    // Frozen, not dead: its connections stay open, only the missing heartbeats tell.
    epns[2].signal(libc::SIGSTOP);
    wait_for_log(dir.path(), "icn.log", 30, |log| {
        log.lines()
            .any(|l| l.contains("EPN 2 (") && l.contains(") lost (lease expired"))
    });
    // Continued, it finds its control connection closed and joins again.
    epns[2].signal(libc::SIGCONT);
    let (st, s, _) = icn.finish(120);
    assert!(st.success());
    assert_eq!(s["invariant_ok"], true, "{s}");
    assert_eq!(
        u(&s, "completed"),
        1000,
        "no TF lost to the frozen EPN: {s}"
    );
    assert!(u(&s, "reassigned") > 0, "{s}");
    let m = membership(&s);
    assert!(
        m.iter()
            .any(|e| e.1 == "EPN 2" && e.2 == "lost" && e.3.contains("lease expired")),
        "{m:?}"
    );
    assert!(
        m.iter().any(|e| e.1 == "EPN 2" && e.2 == "rejoined"),
        "{m:?}"
    );
    for p in flps.iter_mut().chain(epns.iter_mut()) {
        assert!(p.wait(30).success(), "{} failed", p.name);
    }
}

#[test]
fn experiment_faults_kill_goat_and_freeze_nodes_and_report_detection() {
    let dir = tempfile::tempdir().unwrap();
    let exp = dir.path().join("faults.toml");
    std::fs::write(
        &exp,
        r#"
name = "faults"
[run]
flps = 2
epns = 3
rate_hz = 100
tfs = 900
stf_size = "64KiB"
lease_ms = 500
policy = "whitelist"
[[fault]]
node = "epn 1"
action = "kill"
at_s = 1.5
restart_after_s = 1.0
[[fault]]
node = "epn 2"
action = "goat"
after_tfs = 60
restart_after_s = 1.0
[[fault]]
node = "flp 1"
action = "stop"
at_s = 5.0
restart_after_s = 1.0
"#,
    )
    .unwrap();
    let out = common::fanin()
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
    assert!(text.contains("invariant ok"), "{text}");
    // A goat dies once: started again, it is an ordinary EPN that stays.
    assert!(!text.contains("EPN 2 exited"), "{text}");
    // One row per fault, each detected; the restarted / continued nodes rejoined.
    for node in ["EPN 1", "EPN 2", "FLP 1"] {
        let row = text
            .lines()
            .find(|l| l.trim_start().starts_with(node))
            .unwrap_or_else(|| panic!("no fault row for {node}: {text}"));
        let f: Vec<&str> = row.split_whitespace().collect();
        // node (2 words), fault, at, detect, rejoin, ...
        assert!(f[4].parse::<f64>().is_ok(), "{node} not detected: {row}");
        assert!(f[5].parse::<f64>().is_ok(), "{node} did not rejoin: {row}");
    }
    let results = common::run_dir(&dir.path().join("results"));
    let s = common::read_summary(&results);
    assert_eq!(s["invariant_ok"], true);
    assert_eq!(
        s["dropped_by_reason"]["epn_lost"].as_u64().unwrap_or(0),
        0,
        "{s}"
    );
    let faults: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(results.join("faults.json")).unwrap())
            .unwrap();
    assert_eq!(faults.as_array().unwrap().len(), 3);
    check_report(&results, &s);
}

/// `report.html`: self-contained, four charts, the faults and membership changes on
/// the time axis and in a table, the run's counts; `loads.csv` has every EPN.
fn check_report(run: &std::path::Path, s: &serde_json::Value) {
    let html = std::fs::read_to_string(run.join("report.html")).unwrap();
    assert_eq!(html.matches("<svg").count(), 4, "four charts");
    assert!(
        !html.contains("<script") && !html.contains("src=\"http"),
        "self-contained"
    );
    for what in [
        "fault: kill EPN 1",
        "fault: stop FLP 1",
        "EPN 1 lost",
        "EPN 1 rejoined",
    ] {
        assert!(html.contains(what), "report.html lacks {what}");
    }
    let issued = format!("<th>issued</th><td>{}</td>", s["issued"]);
    assert!(html.contains(&issued), "report.html lacks {issued}");
    let loads = std::fs::read_to_string(run.join("loads.csv")).unwrap();
    for epn in 0..3 {
        let rows = loads
            .lines()
            .skip(1)
            .filter(|l| l.split(',').nth(1) == Some(&epn.to_string()));
        assert!(rows.count() >= 2, "EPN {epn} in loads.csv:\n{loads}");
    }
    // `fanin report` draws it again.
    std::fs::remove_file(run.join("report.html")).unwrap();
    let out = common::fanin().arg("report").arg(run).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(run.join("report.html").is_file());
}

#[test]
fn every_start_order_of_icn_flps_and_epns_gives_a_complete_run() {
    let orders = [
        ["icn", "flp", "epn"],
        ["icn", "epn", "flp"],
        ["flp", "icn", "epn"],
        ["epn", "icn", "flp"],
        ["flp", "epn", "icn"],
        ["epn", "flp", "icn"],
    ];
    // The orders run side by side, each on its own port.
    let runs: Vec<_> = orders
        .iter()
        .map(|order| {
            let order = *order;
            std::thread::spawn(move || {
                let dir = tempfile::tempdir().unwrap();
                let addr: std::net::SocketAddr = format!("127.0.0.1:{}", common::free_port())
                    .parse()
                    .unwrap();
                let mut icn = None;
                let mut nodes: Vec<Proc> = Vec::new();
                for (k, role) in order.iter().enumerate() {
                    if k > 0 {
                        // Only to make the order real: the later role finds the earlier
                        // ones up (or still retrying); correctness rests on handshakes.
                        std::thread::sleep(std::time::Duration::from_millis(300));
                    }
                    match *role {
                        "icn" => icn = Some(start_icn(
                            dir.path(),
                            "flps = 2\nepns = 2\nrate_hz = 100\ntfs = 40\nstf_size = \"16KiB\"\n",
                            &addr.to_string(),
                        )),
                        "flp" => nodes.extend((0..2).map(|i| spawn_flp(dir.path(), addr, i))),
                        _ => nodes.extend((0..2).map(|i| spawn_epn(dir.path(), addr, i, &[]))),
                    }
                }
                let (st, s, _) = icn.expect("ICN started").finish(60);
                assert!(st.success(), "{order:?}: ICN failed");
                assert_eq!(s["invariant_ok"], true, "{order:?}: {s}");
                assert_eq!(u(&s, "completed"), 40, "{order:?}: {s}");
                for p in &mut nodes {
                    assert!(p.wait(30).success(), "{order:?}: {} failed", p.name);
                }
            })
        })
        .collect();
    for r in runs {
        r.join().expect("a start order failed");
    }
}
