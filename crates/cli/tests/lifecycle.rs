//! A launched cluster lives and dies with its launcher: SIGTERM, SIGINT or SIGKILL of
//! `fanin run` mid-run leaves no fanin process behind, and SIGINT still reports.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Processes whose environment holds `tag` (the launcher and everything it started).
fn tagged(tag: &str) -> Vec<u32> {
    let needle = format!("FANIN_LIFECYCLE_TAG={tag}");
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(env) = std::fs::read(e.path().join("environ")) else {
            continue;
        };
        if env.split(|&b| b == 0).any(|v| v == needle.as_bytes()) {
            pids.push(pid);
        }
    }
    pids
}

/// Starts `fanin run` for 30 s and waits until its run has started. (The caller waits
/// for the child it gets back.)
#[allow(clippy::zombie_processes)]
fn start(dir: &Path, tag: &str) -> (Child, PathBuf) {
    let exp = dir.join("long.toml");
    let run = "name = \"long\"\n[run]\nflps = 2\nepns = 2\nrate_hz = 50\nduration_s = 30\nstf_size = \"64KiB\"\n";
    std::fs::write(&exp, run).unwrap();
    let results = dir.join("results");
    let mut child = fanin()
        .arg("run")
        .arg(&exp)
        .arg("--results")
        .arg(&results)
        .env("FANIN_LIFECYCLE_TAG", tag)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    loop {
        let started = std::fs::read_dir(&results)
            .ok()
            .and_then(|mut d| d.next())
            .and_then(|e| std::fs::read_to_string(e.ok()?.path().join("icn.log")).ok())
            .is_some_and(|log| log.contains("starts"));
        if started {
            return (child, results);
        }
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the run never started");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits up to `secs` for every tagged process to be gone; returns those left.
fn gone_within(tag: &str, secs: u64) -> Vec<u32> {
    let t0 = Instant::now();
    loop {
        let left = tagged(tag);
        if left.is_empty() || t0.elapsed() > Duration::from_secs(secs) {
            return left;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn stop_with(sig: i32) -> (tempfile::TempDir, PathBuf, std::process::Output) {
    let dir = tempfile::tempdir().unwrap();
    let tag = format!("{}-{sig}", std::process::id());
    let (child, results) = start(dir.path(), &tag);
    assert!(tagged(&tag).len() >= 6, "launcher, ICN, 2 FLPs, 2 EPNs");
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(child.id() as i32, sig) };
    let out = child.wait_with_output().unwrap();
    let left = gone_within(&tag, 5);
    assert!(
        left.is_empty(),
        "signal {sig}: fanin processes left: {left:?}"
    );
    (dir, results, out)
}

#[test]
fn sigkill_of_the_launcher_takes_its_cluster_with_it() {
    stop_with(libc::SIGKILL);
}

#[test]
fn sigterm_stops_the_run_and_leaves_nothing() {
    let (_dir, results, out) = stop_with(libc::SIGTERM);
    assert_eq!(out.status.code(), Some(130), "{out:?}");
    let summary = run_dir(&results);
    assert!(summary.join("summary.json").exists());
}

#[test]
fn sigint_still_writes_the_summary_and_the_table() {
    let (_dir, results, out) = stop_with(libc::SIGINT);
    assert_eq!(out.status.code(), Some(130), "{out:?}");
    let root = run_dir(&results);
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("summary.json")).unwrap()).unwrap();
    assert_eq!(s["interrupted"], true, "{s}");
    assert_eq!(s["invariant_ok"], true, "{s}");
    assert!(s["issued"].as_u64().unwrap() < 1500, "stopped early: {s}");
    assert!(root.join("table.txt").exists());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("interrupted after 1 of 1 runs"), "{stdout}");
}
