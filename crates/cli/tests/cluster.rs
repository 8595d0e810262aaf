//! Runs of real ICN, FLP and EPN processes over loopback TCP: a clean run, an EPN killed
//! mid-run, nodes started before the ICN, and the static-modulo policy end to end.

mod common;
use common::*;

/// Generous build time-out: these tests check accounting, not speed, on a loaded CI machine.
const BASE: &str = r#"
build_timeout_ms = 10000
drain_timeout_ms = 30000
crc = true
flp_buffer = "64MiB"
epn_buffer = "256MiB"
"#;

#[test]
fn fanin_run_loses_nothing_and_accounts_for_every_tf() {
    let dir = tempfile::tempdir().unwrap();
    let exp = dir.path().join("small.toml");
    std::fs::write(
        &exp,
        format!(
            "name = \"small\"\n[run]\nflps = 2\nepns = 3\nrate_hz = 100\ntfs = 200\nstf_size = \"uniform(64KiB,256KiB)\"\n{BASE}"
        ),
    )
    .unwrap();
    let out = fanin()
        .arg("run")
        .arg(&exp)
        .arg("--results")
        .arg(dir.path().join("results"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "fanin run failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The table is printed with the TDR's columns.
    assert!(
        stdout.contains("loss %") && stdout.contains("p99 ms") && stdout.contains("invariant"),
        "{stdout}"
    );
    let run_dir = run_dir(&dir.path().join("results"));
    let s = read_summary(&run_dir);
    assert_eq!(u(&s, "issued"), 200);
    assert_eq!(u(&s, "completed"), 200, "{s}");
    assert_eq!(u(&s, "lost"), 0);
    assert_eq!(s["loss_pct"].as_f64(), Some(0.0));
    assert_eq!(s["invariant_ok"], true);
    assert_eq!(u(&s, "split"), 0);
    assert_eq!(u(&s, "crc_errors"), 0);
    assert!(s["goodput_gbps"].as_f64().unwrap() > 0.0);
    for k in ["p50", "p99", "max"] {
        assert!(s["latency_ms"][k].as_f64().unwrap() > 0.0, "latency {k}");
    }
    for f in [
        "summary.csv",
        "tfs.csv",
        "config.toml",
        "icn.log",
        "epn-2.log",
        "flp-1.log",
    ] {
        assert!(run_dir.join(f).exists(), "{f} missing");
    }
    let rows = tf_rows(&run_dir, 200);
    assert!(rows.iter().all(|r| r.1 == "complete"));
    // summary.csv names its run as its directory is named.
    let csv = std::fs::read_to_string(run_dir.join("summary.csv")).unwrap();
    let name = run_dir.file_name().unwrap().to_string_lossy();
    assert!(csv.starts_with("run,run_id,"), "{csv}");
    assert!(
        csv.lines()
            .nth(1)
            .unwrap()
            .starts_with(&format!("\"{name}\",")),
        "{csv}"
    );
    assert_eq!(s["run"].as_str(), Some(&*name));
    // Every FLP and EPN sent its counters; the EPNs together built 400 STFs.
    let nodes = s["nodes"].as_object().unwrap();
    assert_eq!(nodes.len(), 5, "{nodes:?}");
    let built: u64 = nodes
        .values()
        .filter_map(|c| c["events.stfs_built"].as_u64())
        .sum();
    assert_eq!(built, 400);
}

#[test]
fn a_killed_epns_tfs_are_reassigned_and_none_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let mut icn = start_icn(
        dir.path(),
        &format!("flps = 2\nepns = 3\nrate_hz = 100\ntfs = 400\nstf_size = \"128KiB\"\n{BASE}"),
        "127.0.0.1:0",
    );
    let mut epns: Vec<Proc> = (0..3)
        .map(|i| spawn_epn(dir.path(), icn.control, i, &[]))
        .collect();
    let mut flps: Vec<Proc> = (0..2)
        .map(|i| spawn_flp(dir.path(), icn.control, i))
        .collect();
    icn.wait_issued(100);
    // Freeze EPN 1 so TFs pile up in flight to it (some STFs in its socket, some in
    // the FLPs' queues), then kill it: the ICN moves them, the FLPs re-send them.
    epns[1].signal(libc::SIGSTOP);
    std::thread::sleep(std::time::Duration::from_millis(500)); // PROGRESS lines may be queued
    icn.wait_issued(150);
    epns[1].kill9();
    let (st, s, results) = icn.finish(120);
    assert!(st.success(), "ICN failed; see {}", dir.path().display());
    assert_eq!(s["invariant_ok"], true, "{s}");
    assert_eq!(u(&s, "issued"), 400);
    assert_eq!(u(&s, "completed"), 400, "zero-loss mode loses no TF: {s}");
    assert!(u(&s, "reassigned") >= 5, "{s}");
    let events = s["events"].to_string();
    assert!(
        events.contains("EPN 1") && events.contains("re-assigned"),
        "{events}"
    );
    // Every TF completed exactly once, on a live EPN for the moved ones.
    let rows = tf_rows(&results, 400);
    assert!(rows.iter().all(|r| r.1 == "complete"), "not all complete");
    let resent: u64 = ["FLP 0", "FLP 1"]
        .iter()
        .filter_map(|f| s["nodes"][f]["stfs.resent.epn_lost"].as_u64())
        .sum();
    assert_eq!(resent, 2 * u(&s, "reassigned"), "{s}");
    for p in flps.iter_mut().chain(epns.iter_mut()) {
        if p.name != "EPN 1" {
            assert!(p.wait(30).success(), "{} failed", p.name);
        }
    }
}

#[test]
fn without_reassign_a_killed_epns_tfs_end_dropped_and_none_unaccounted() {
    let dir = tempfile::tempdir().unwrap();
    let mut icn = start_icn(
        dir.path(),
        &format!("flps = 2\nepns = 3\nrate_hz = 100\ntfs = 400\nstf_size = \"128KiB\"\nreassign = false\n{BASE}"),
        "127.0.0.1:0",
    );
    let mut epns: Vec<Proc> = (0..3)
        .map(|i| spawn_epn(dir.path(), icn.control, i, &[]))
        .collect();
    let mut flps: Vec<Proc> = (0..2)
        .map(|i| spawn_flp(dir.path(), icn.control, i))
        .collect();
    icn.wait_issued(100);
    // Freeze EPN 1 so TFs pile up in flight to it, then kill it.
    epns[1].signal(libc::SIGSTOP);
    std::thread::sleep(std::time::Duration::from_millis(500)); // PROGRESS lines may be queued
    icn.wait_issued(150);
    epns[1].kill9();
    let (st, s, results) = icn.finish(120);
    assert!(st.success(), "ICN failed; see {}", dir.path().display());
    assert_eq!(u(&s, "issued"), 400);
    assert_eq!(s["invariant_ok"], true, "{s}");
    assert_eq!(
        u(&s, "completed") + u(&s, "incomplete") + u(&s, "dropped"),
        400
    );
    // About a third of the 50 TFs issued while it was frozen were in flight to it.
    let lost_to_epn = s["dropped_by_reason"]["epn_lost"].as_u64().unwrap_or(0);
    assert!(
        lost_to_epn >= 5,
        "TFs in flight to the dead EPN must end as dropped(epn_lost): {s}"
    );
    // After the EPN is gone the others take all new TFs: most TFs complete.
    assert!(u(&s, "completed") >= 300, "{s}");
    let events = s["events"].to_string();
    assert!(
        events.contains("EPN 1") && events.contains("lost"),
        "{events}"
    );
    let rows = tf_rows(&results, 400);
    let dropped_rows = rows.iter().filter(|r| r.1 == "dropped").count() as u64;
    assert_eq!(dropped_rows, u(&s, "dropped"));
    for p in flps.iter_mut().chain(epns.iter_mut()) {
        if p.name != "EPN 1" {
            assert!(p.wait(30).success(), "{} failed", p.name);
        }
    }
}

#[test]
fn nodes_started_before_the_icn_join_when_it_comes() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut nodes: Vec<Proc> = (0..2)
        .map(|i| spawn_epn(dir.path(), addr, i, &[]))
        .collect();
    nodes.push(spawn_flp(dir.path(), addr, 0));
    std::thread::sleep(std::time::Duration::from_millis(700));
    let icn = start_icn(
        dir.path(),
        &format!("flps = 1\nepns = 2\nrate_hz = 50\ntfs = 50\nstf_size = \"32KiB\"\n{BASE}"),
        &addr.to_string(),
    );
    let (st, s, _) = icn.finish(60);
    assert!(st.success());
    assert_eq!(u(&s, "completed"), 50, "{s}");
    assert!(s["prerun_s"].as_f64().unwrap() >= 0.0);
    for p in &mut nodes {
        assert!(p.wait(30).success(), "{} failed", p.name);
    }
}

#[test]
fn static_modulo_sends_tf_s_to_epn_s_mod_n() {
    let dir = tempfile::tempdir().unwrap();
    let icn = start_icn(
        dir.path(),
        &format!("flps = 1\nepns = 3\nrate_hz = 100\ntfs = 30\nstf_size = \"16KiB\"\npolicy = \"static-modulo\"\n{BASE}"),
        "127.0.0.1:0",
    );
    let mut nodes: Vec<Proc> = (0..3)
        .map(|i| spawn_epn(dir.path(), icn.control, i, &[]))
        .collect();
    nodes.push(spawn_flp(dir.path(), icn.control, 0));
    let (st, s, results) = icn.finish(60);
    assert!(st.success());
    assert_eq!(u(&s, "completed"), 30);
    let t = std::fs::read_to_string(results.join("tfs.csv")).unwrap();
    for l in t.lines().skip(1) {
        let f: Vec<&str> = l.split(',').collect();
        let (tf, epn): (u64, u64) = (f[0].parse().unwrap(), f[1].parse().unwrap());
        assert_eq!(epn, tf % 3, "{l}");
    }
}

#[test]
fn a_full_epn_build_buffer_drops_tfs_with_that_reason() {
    // Two 1 MiB STFs per TF into a 1 MiB build buffer: the second never fits.
    let dir = tempfile::tempdir().unwrap();
    let icn = start_icn(
        dir.path(),
        "flps = 2\nepns = 1\nrate_hz = 50\ntfs = 20\nstf_size = \"1MiB\"\nbuild_timeout_ms = 10000\n",
        "127.0.0.1:0",
    );
    let mut nodes = vec![
        spawn_epn(dir.path(), icn.control, 0, &["--build-buffer", "1MiB"]),
        spawn_flp(dir.path(), icn.control, 0),
        spawn_flp(dir.path(), icn.control, 1),
    ];
    let (st, s, results) = icn.finish(60);
    assert!(st.success());
    assert_eq!(s["invariant_ok"], true, "{s}");
    assert_eq!(u(&s, "completed"), 0, "{s}");
    assert_eq!(
        s["dropped_by_reason"]["epn_buffer_full"].as_u64(),
        Some(20),
        "{s}"
    );
    let rows = tf_rows(&results, 20);
    assert!(rows.iter().all(|r| r.2 == "epn_buffer_full"));
    let epn = &s["nodes"]["EPN 0"];
    // At least the second STF of every TF; also the first when the previous TF's STF
    // still held the buffer (timing).
    let stf_drops = epn["stfs.dropped.epn_buffer_full"].as_u64().unwrap_or(0);
    assert!((20..=40).contains(&stf_drops), "{epn}");
    assert_eq!(
        epn["events.build_buffer_peak_bytes"].as_u64(),
        Some(1 << 20),
        "{epn}"
    );
    for p in &mut nodes {
        assert!(p.wait(30).success(), "{} failed", p.name);
    }
}

#[test]
fn a_full_flp_send_buffer_drops_tfs_and_the_epn_frees_the_rest() {
    // Freeze the only EPN: its socket fills, the FLPs' 2 MiB send buffers fill, and
    // further STFs are dropped (flp_buffer_full) while the run goes on.
    let dir = tempfile::tempdir().unwrap();
    let mut icn = start_icn(
        dir.path(),
        "flps = 2\nepns = 1\nrate_hz = 100\ntfs = 500\nstf_size = \"512KiB\"\nbuild_timeout_ms = 10000\ndrain_timeout_ms = 30000\nlease_ms = 10000\n",
        "127.0.0.1:0",
    );
    let mut epn = spawn_epn(dir.path(), icn.control, 0, &[]);
    let mut flps: Vec<Proc> = (0..2)
        .map(|i| {
            Proc::spawn(
                &format!("FLP {i}"),
                fanin()
                    .args([
                        "flp",
                        "--icn",
                        &icn.control.to_string(),
                        "--id",
                        &i.to_string(),
                    ])
                    .args(["--send-buffer", "2MiB"])
                    .stdout(std::process::Stdio::null())
                    .stderr(
                        std::fs::File::create(dir.path().join(format!("flp-{i}.log"))).unwrap(),
                    ),
            )
        })
        .collect();
    icn.wait_issued(20);
    epn.signal(libc::SIGSTOP);
    std::thread::sleep(std::time::Duration::from_millis(1000)); // PROGRESS lines may be queued
    icn.wait_issued(150);
    epn.signal(libc::SIGCONT);
    let (st, s, results) = icn.finish(120);
    assert!(st.success());
    assert_eq!(s["invariant_ok"], true, "{s}");
    let full = s["dropped_by_reason"]["flp_buffer_full"]
        .as_u64()
        .unwrap_or(0);
    assert!(full > 0, "{s}");
    assert!(
        u(&s, "completed") >= 100,
        "TFs before and after the freeze complete: {s}"
    );
    let rows = tf_rows(&results, 500);
    assert_eq!(
        rows.iter().filter(|r| r.2 == "flp_buffer_full").count() as u64,
        full
    );
    // The EPN was told to abandon those TFs and reported none of them.
    let abandoned = s["nodes"]["EPN 0"]["events.tfs_abandoned"]
        .as_u64()
        .unwrap_or(0);
    assert!(abandoned > 0 && abandoned <= full, "{s}");
    for p in flps.iter_mut().chain([&mut epn]) {
        assert!(p.wait(30).success(), "{} failed", p.name);
    }
}

#[test]
fn the_simulator_chooses_the_same_epns_as_the_runtime() {
    use fanin_sim::{simulate, SimConfig};
    for policy in ["round-robin", "static-modulo"] {
        let dir = tempfile::tempdir().unwrap();
        let icn = start_icn(
            dir.path(),
            &format!("flps = 1\nepns = 3\nrate_hz = 200\ntfs = 30\nstf_size = \"4KiB\"\npolicy = \"{policy}\"\n{BASE}"),
            "127.0.0.1:0",
        );
        let mut nodes: Vec<Proc> = (0..3)
            .map(|i| spawn_epn(dir.path(), icn.control, i, &[]))
            .collect();
        nodes.push(spawn_flp(dir.path(), icn.control, 0));
        let (st, _, results) = icn.finish(60);
        assert!(st.success());
        let t = std::fs::read_to_string(results.join("tfs.csv")).unwrap();
        let mut runtime: Vec<(u64, u32)> = t
            .lines()
            .skip(1)
            .map(|l| {
                let f: Vec<&str> = l.split(',').collect();
                (f[0].parse().unwrap(), f[1].parse().unwrap())
            })
            .collect();
        runtime.sort_unstable();
        let w = simulate(SimConfig {
            strings: 1,
            sectors_per_string: 1,
            lcms_per_sector: 1,
            pcs: Some(3),
            policy: policy.parse().unwrap(),
            duration_s: 0.3,
            relax_s: 0.1,
            ..SimConfig::default()
        })
        .unwrap();
        let sim: Vec<(u64, u32)> = w.frags.iter().map(|f| (f.slice, f.dst)).collect();
        assert_eq!(sim.len(), 30);
        assert_eq!(runtime, sim, "{policy}: runtime and simulator disagree");
    }
}

#[test]
fn weighted_round_robin_follows_the_configured_epn_weights() {
    let dir = tempfile::tempdir().unwrap();
    let icn = start_icn(
        dir.path(),
        "flps = 1\nepns = 2\nrate_hz = 200\ntfs = 400\nstf_size = \"8KiB\"\npolicy = \"weighted-round-robin\"\nepn_weights = [3, 1]\nleast_loaded = { when_none_ready = \"wait\" }\n",
        "127.0.0.1:0",
    );
    let mut nodes = vec![
        spawn_epn(dir.path(), icn.control, 0, &[]),
        spawn_epn(dir.path(), icn.control, 1, &[]),
        spawn_flp(dir.path(), icn.control, 0),
    ];
    let (st, s, results) = icn.finish(60);
    assert!(st.success());
    assert_eq!(u(&s, "completed"), 400, "{s}");
    let csv = std::fs::read_to_string(results.join("tfs.csv")).unwrap();
    let on0 = csv
        .lines()
        .skip(1)
        .filter(|l| l.split(',').nth(1) == Some("0"))
        .count();
    assert_eq!(on0, 300, "EPN 0 (weight 3) builds 3 of every 4 TFs");
    for p in &mut nodes {
        assert!(p.wait(30).success(), "{} failed", p.name);
    }
}

#[test]
fn unthrottled_with_every_default_is_back_pressured_and_loses_nothing() {
    // Every default but the time-outs: a debug build under this load on a 2-core CI
    // machine can delay heartbeats and builds past the default second. What is tested
    // is that the buffers never overflow: no TF is dropped or lost.
    let dir = tempfile::tempdir().unwrap();
    let exp = dir.path().join("unthrottled.toml");
    std::fs::write(
        &exp,
        "[run]\nrate_hz = 0\nduration_s = 3\nlease_ms = 10000\nbuild_timeout_ms = 10000\n",
    )
    .unwrap();
    let out = fanin()
        .arg("run")
        .arg(&exp)
        .arg("--results")
        .arg(dir.path().join("results"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let run_dir = run_dir(&dir.path().join("results"));
    let s = read_summary(&run_dir);
    assert!(u(&s, "issued") > 100, "{s}");
    assert_eq!(u(&s, "dropped"), 0, "{s}");
    assert_eq!(u(&s, "lost"), 0, "{s}");
    assert_eq!(s["invariant_ok"], true);
    assert_eq!(s["valid"], true, "{s}");
    // The rate it sustained is what an unthrottled run measures.
    let line = stdout
        .lines()
        .find(|l| l.contains("unthrottled: sustained"))
        .unwrap_or_else(|| panic!("no sustained rate in {stdout}"));
    assert!(
        line.contains(&format!("{} TFs issued", u(&s, "issued"))),
        "{line}"
    );
}

#[test]
fn pull_mode_with_few_tokens_builds_every_tf_through_an_epn_kill() {
    // Transfer tokens: each EPN reads two STFs at a time, each FLP serves one EPN at a
    // time, the ICN tells every FLP when to send and the EPNs report each arrival (a
    // debug build on two cores: few tokens, a modest rate); an EPN frozen then killed.
    let dir = tempfile::tempdir().unwrap();
    let cfg = format!(
        "flps = 3\nepns = 3\nrate_hz = 50\ntfs = 300\nstf_size = \"64KiB\"\n\
         transfer = \"pull\"\nflp_tokens = 1\nepn_tokens = 2\n{BASE}"
    );
    let mut icn = start_icn(dir.path(), &cfg, "127.0.0.1:0");
    let mut epns: Vec<Proc> = (0..3)
        .map(|i| spawn_epn(dir.path(), icn.control, i, &[]))
        .collect();
    let mut flps: Vec<Proc> = (0..3)
        .map(|i| spawn_flp(dir.path(), icn.control, i))
        .collect();
    icn.wait_issued(80);
    epns[2].signal(libc::SIGSTOP);
    icn.wait_issued(120);
    epns[2].kill9();
    let (st, s, results) = icn.finish(120);
    assert!(st.success(), "ICN failed; see {}", dir.path().display());
    assert_eq!(s["invariant_ok"], true, "{s}");
    assert_eq!(u(&s, "completed"), 300, "pull mode loses no TF either: {s}");
    let rows = tf_rows(&results, 300);
    assert!(rows.iter().all(|r| r.1 == "complete"), "not all complete");
    // Every STF was sent when the ICN said so, and the EPNs reported each arrival
    // (the survivors built most TFs, three STFs each).
    for f in ["FLP 0", "FLP 1", "FLP 2"] {
        assert!(
            s["nodes"][f]["stfs.sent"].as_u64().unwrap_or(0) >= 200,
            "{f}: {s}"
        );
    }
    for e in ["EPN 0", "EPN 1"] {
        let ended = s["nodes"][e]["stfs.transfer_ended"].as_u64().unwrap_or(0);
        assert!(ended >= 3 * 80, "{e}: {s}");
    }
    for p in flps.iter_mut().chain(epns.iter_mut()) {
        if p.name != "EPN 2" {
            assert!(p.wait(30).success(), "{} failed", p.name);
        }
    }
}
