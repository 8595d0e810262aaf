//! The nodes model against the real processes, and `fanin chaos` from the command line:
//! the same `[run]` gives the same EPN choices and outcomes, simulated and real; the
//! campaign's fixed budget keeps every promise; a seed replays as a `fanin sim` file.

mod common;
use common::*;

use std::collections::BTreeMap;
use std::path::Path;

/// tfs.csv as TF id -> (EPN, status).
fn choices(dir: &Path) -> BTreeMap<u64, (String, String)> {
    let t = std::fs::read_to_string(dir.join("tfs.csv")).unwrap();
    t.lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f[0].parse().unwrap(), (f[1].to_string(), f[5].to_string()))
        })
        .collect()
}

fn run_ok(args: &[&str]) -> String {
    let out = fanin().args(args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "fanin {args:?}: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[test]
fn real_and_simulated_runs_choose_the_same_epns() {
    let dir = tempfile::tempdir().unwrap();
    // Policies whose choice no timing race decides: round robin, weighted round robin.
    for (name, policy) in [
        ("rr", "policy = \"round-robin\""),
        (
            "wrr",
            "policy = \"weighted-round-robin\"\nepn_weights = [3, 1, 2]",
        ),
    ] {
        let run = format!(
            "[run]\nflps = 2\nepns = 3\nrate_hz = 200\ntfs = 240\nstf_size = \"64KiB\"\n{policy}\n"
        );
        let real = dir.path().join(format!("{name}-real.toml"));
        std::fs::write(&real, format!("name = \"{name}\"\n{run}")).unwrap();
        let sim = dir.path().join(format!("{name}-sim.toml"));
        std::fs::write(&sim, format!("model = \"nodes\"\nname = \"{name}\"\n{run}")).unwrap();
        let real_out = dir.path().join(format!("{name}-real"));
        let sim_out = dir.path().join(format!("{name}-sim"));
        run_ok(&[
            "run",
            real.to_str().unwrap(),
            "--results",
            real_out.to_str().unwrap(),
        ]);
        run_ok(&[
            "sim",
            sim.to_str().unwrap(),
            "--results",
            sim_out.to_str().unwrap(),
        ]);
        let (r, s) = (choices(&run_dir(&real_out)), choices(&run_dir(&sim_out)));
        assert_eq!(r.len(), 240, "{name}: real rows");
        assert_eq!(r, s, "{name}: the same EPN and outcome for every TF");
        // Both runs used every EPN (the comparison is not trivially one EPN).
        let epns: std::collections::BTreeSet<_> = s.values().map(|v| v.0.clone()).collect();
        assert_eq!(epns.len(), 3, "{name}: {epns:?}");
    }
}

#[test]
fn the_chaos_budget_keeps_every_promise() {
    let text = run_ok(&["chaos", "--seeds", "2000"]);
    let line = text.lines().last().unwrap_or_default();
    assert!(
        line.starts_with("seeds 2000, violations 0, simulated "),
        "{text}"
    );
    // The campaign injected faults and ran TFs (it is not vacuous).
    let field = |name: &str| -> u64 {
        let rest = line.split(&format!("{name} ")).nth(1).unwrap();
        rest.split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!(field("faults") > 4000, "{line}");
    // The ICN too: its standby took runs over.
    assert!(field("take-overs") > 100, "{line}");
    assert!(field("TFs") > 500_000, "{line}");
}

#[test]
fn a_seed_replays_and_its_scenario_runs_as_a_sim_file() {
    let dir = tempfile::tempdir().unwrap();
    let text = run_ok(&["chaos", "--seed", "11"]);
    assert!(text.contains("seed 11: every promise kept"), "{text}");
    // The printed scenario is a `fanin sim` file: the same TFs, the same outcomes.
    let toml: String = text
        .lines()
        .skip(1)
        .take_while(|l| !l.starts_with(|c: char| c.is_ascii_digit()))
        .map(|l| format!("{l}\n"))
        .collect();
    let file = dir.path().join("seed-11.toml");
    std::fs::write(&file, format!("name = \"seed-11\"\n{toml}")).unwrap();
    let out = dir.path().join("out");
    let sim = run_ok(&[
        "sim",
        file.to_str().unwrap(),
        "--results",
        out.to_str().unwrap(),
    ]);
    let summary = text.lines().rev().nth(1).unwrap();
    let issued = summary
        .split("issued ")
        .nth(1)
        .unwrap()
        .split(',')
        .next()
        .unwrap();
    assert!(
        sim.contains(&format!("issued {issued},")),
        "{sim}\n{summary}"
    );
    // Twice the same seed: the same output, byte for byte.
    assert_eq!(text, run_ok(&["chaos", "--seed", "11"]));
    // Faults kept by index; an index beyond the schedule is one line naming it.
    let out = fanin()
        .args(["chaos", "--seed", "11", "--keep", "99"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("no fault 99"),
        "{err}"
    );
}

#[test]
fn the_real_campaign_runs_seeds_against_processes() {
    let dir = tempfile::tempdir().unwrap();
    let results = dir.path().to_str().unwrap();
    let text = run_ok(&["chaos", "--real", "--seeds", "4", "--results", results]);
    assert!(text.contains("real seeds 4, violations 0"), "{text}");
    // Seeds 0 and 2 promise zero loss through EPN kills; 1 and 3 freeze and kill anything.
    for seed in 0..4 {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("seed {seed}:")))
            .unwrap_or_else(|| panic!("no line for seed {seed}: {text}"));
        assert!(line.ends_with(": kept"), "{line}");
        let s = read_summary(&dir.path().join(format!("chaos-real-{seed}")));
        assert_eq!(s["invariant_ok"], true, "seed {seed}: {s}");
    }
    assert!(
        text.contains("ZeroLoss") && text.contains("kill epn"),
        "{text}"
    );
    assert!(text.contains("stop "), "a freeze among the seeds: {text}");
}

#[test]
fn the_nodes_experiment_completes_every_tf_through_two_epn_crashes() {
    let dir = tempfile::tempdir().unwrap();
    let exp = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../experiments/nodes-epn-crash.toml"
    );
    let out = dir.path().to_str().unwrap();
    let text = run_ok(&["sim", exp, "--results", out]);
    assert!(text.contains("issued 3600, completed 3600,"), "{text}");
    let s = read_summary(&run_dir(dir.path()));
    assert!(s["reassigned"].as_u64().unwrap_or(0) > 0, "{s}");
    let lost: Vec<&str> = s["membership"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["kind"] == "lost")
        .map(|m| m["node"].as_str().unwrap())
        .collect();
    assert_eq!(lost, ["EPN 1", "EPN 4"], "{s}");
}
