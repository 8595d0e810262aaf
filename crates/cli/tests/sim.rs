//! `fanin sim` end to end: the same experiment twice gives identical files, byte for
//! byte; the table carries the published values; bad input is one line naming the field.

mod common;
use common::*;

use std::path::{Path, PathBuf};

fn files(root: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let run = std::fs::read_dir(root)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut out = Vec::new();
    let mut stack = vec![run.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((
                    p.strip_prefix(&run).unwrap().to_path_buf(),
                    std::fs::read(&p).unwrap(),
                ));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn the_same_experiment_twice_writes_identical_files() {
    let exp = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../experiments/antares-tcp.toml"
    );
    let dir = tempfile::tempdir().unwrap();
    let mut outs = Vec::new();
    for i in 0..2 {
        let root = dir.path().join(format!("r{i}"));
        let out = fanin()
            .args([
                "sim",
                exp,
                "--only",
                "sector,2-string",
                "--duration",
                "1",
                "--results",
            ])
            .arg(&root)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("published") && stdout.contains("0.248"),
            "{stdout}"
        );
        outs.push(files(&root));
    }
    let names: Vec<_> = outs[0].iter().map(|f| f.0.display().to_string()).collect();
    for f in [
        "summary.json",
        "slices.csv",
        "delay.svg",
        "table.txt",
        "table.csv",
    ] {
        assert!(
            names.iter().any(|n| n.ends_with(f)),
            "{f} missing in {names:?}"
        );
    }
    same_files(&outs[0], &outs[1], Path::new(exp));
}

#[test]
fn the_flow_and_nodes_models_write_identical_files_twice() {
    let dir = tempfile::tempdir().unwrap();
    let flow = dir.path().join("flow.toml");
    std::fs::write(&flow, "model = \"flow\"\npolicies = [\"round-robin\", \"least-loaded\"]\n[alice]\nflps = 4\nepns = 8\nduration_s = 0.2\ndrain_s = 1.0\n").unwrap();
    let nodes =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../experiments/nodes-epn-crash.toml");
    for (model, exp, table) in [
        ("flow", flow.as_path(), "table.csv"),
        ("nodes", nodes.as_path(), "summary.json"),
    ] {
        let outs: Vec<_> = (0..2)
            .map(|i| {
                let root = dir.path().join(format!("{model}-{i}"));
                let (ok, err) = sim(exp, &root, false);
                assert!(ok, "{}: {err}", exp.display());
                files(&root)
            })
            .collect();
        let names: Vec<_> = outs[0].iter().map(|f| f.0.display().to_string()).collect();
        assert!(
            names.iter().any(|n| n.ends_with(table)),
            "{table} missing in {names:?}"
        );
        same_files(&outs[0], &outs[1], exp);
    }
}

/// The two runs' files are the same, byte for byte; a failure names the first that is
/// not, with both texts.
fn same_files(a: &[(PathBuf, Vec<u8>)], b: &[(PathBuf, Vec<u8>)], exp: &Path) {
    let names = |v: &[(PathBuf, Vec<u8>)]| v.iter().map(|f| f.0.clone()).collect::<Vec<_>>();
    assert_eq!(names(a), names(b), "{}: different files", exp.display());
    for (x, y) in a.iter().zip(b) {
        let text = |f: &(PathBuf, Vec<u8>)| String::from_utf8_lossy(&f.1).into_owned();
        let (what, name) = (exp.display(), x.0.display());
        assert!(
            x.1 == y.1,
            "{what}: {name} differs:\n{}\n---\n{}",
            text(x),
            text(y)
        );
    }
}

#[test]
fn bad_simulation_input_is_one_line_naming_the_field() {
    for (args, field) in [
        (
            vec!["sim", "--preset", "antares-11-string"],
            "antares-11-string",
        ),
        (
            vec!["sim", "--fragment-size", "uniform(9,1)"],
            "fragment_size",
        ),
        (vec!["sim", "--min-rto-ms=-1"], "min_rto_ms"),
        (vec!["sim", "--seed", "18446744073709551615"], "--seed"),
    ] {
        let out = fanin().args(&args).output().unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{args:?}: {err}");
        assert!(
            lines[0].starts_with("error: ") && lines[0].contains(field),
            "{err}"
        );
    }
}

#[test]
fn every_simulation_model_keeps_its_results_inside_the_results_directory() {
    let dir = tempfile::tempdir().unwrap();
    let files = [
        "model = \"packet\"\nname = \"../../../x\"\n[sim]\npreset = \"antares-sector\"\nduration_s = 0.05\n",
        "model = \"flow\"\nname = \"../../../x\"\npolicies = [\"round-robin\"]\n[alice]\nflps = 4\nepns = 8\nduration_s = 0.2\ndrain_s = 1.0\n",
        "model = \"build\"\nname = \"../../../x\"\npolicies = [\"round-robin\"]\n[build]\nk = 4\nduration_s = 0.1\n",
        "model = \"nodes\"\nname = \"../../../x\"\n[run]\nflps = 1\nepns = 1\nrate_hz = 100\ntfs = 10\n",
    ];
    for (i, text) in files.iter().enumerate() {
        let exp = dir.path().join(format!("e{i}.toml"));
        std::fs::write(&exp, text).unwrap();
        let results = dir.path().join("work").join("results");
        let (ran, err) = sim(&exp, &results, false);
        assert!(ran, "{text}: {err}");
        let inside: Vec<_> = std::fs::read_dir(&results).unwrap().collect();
        assert_eq!(inside.len(), i + 1, "{text}: one directory per run");
        let outside: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.ends_with(".toml") && n != "work")
            .collect();
        assert!(outside.is_empty(), "{text}: wrote {outside:?} outside");
    }
}

#[test]
fn a_file_for_the_other_subcommand_names_the_right_one() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../experiments/");
    for (cmd, file, hint) in [
        ("run", "antares-tcp.toml", "use `fanin sim`"),
        ("sim", "default.toml", "use `fanin run`"),
    ] {
        let out = fanin()
            .arg(cmd)
            .arg(format!("{root}{file}"))
            .output()
            .unwrap();
        assert!(!out.status.success(), "{cmd} {file}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(hint), "{cmd} {file}: {err}");
    }
}

/// Two rows (or one policy named twice) whose results would go to one directory are
/// refused before anything runs: neither result overwrites the other.
#[test]
fn rows_or_policies_that_would_share_a_directory_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let flow = "model = \"flow\"\n[alice]\nflps = 4\nepns = 8\nduration_s = 0.2\ndrain_s = 1.0\n";
    let rows = "[[run]]\nlabel = \"k=8\"\n[[run]]\nlabel = \"k 8\"\n";
    for (policies, rows, want) in [
        (
            "[\"round-robin\"]",
            rows,
            "labels `k=8` and `k 8` name the same results directory",
        ),
        (
            "[\"round-robin\", \"round-robin\"]",
            "",
            "policies: round-robin is named twice",
        ),
        (
            "[\"round-robin\", \"weighted-round-robin\"]",
            "[[run]]\nlabel = \"x-weighted\"\n[[run]]\nlabel = \"x\"\n",
            "share the results directory x-weighted-round-robin",
        ),
    ] {
        let exp = dir.path().join("dup.toml");
        std::fs::write(&exp, format!("policies = {policies}\n{flow}{rows}")).unwrap();
        let results = dir.path().join("results");
        let (ran, err) = sim(&exp, &results, false);
        assert!(!ran, "{policies} {rows}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(want), "{err}");
        assert!(!results.exists(), "nothing ran");
    }
}

/// Values a simulation cannot go through (simulated time past its range, steps that
/// round to nothing, a failure every picosecond, a fat tree too large to hold) are one
/// line naming the field, found by `fanin --check sim` and before any row runs.
#[test]
fn values_a_simulation_cannot_go_through_are_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let flow = "model = \"flow\"\npolicies = [\"round-robin\"]\n[alice]\nflps = 4\nepns = 8\nduration_s = 0.2\ndrain_s = 1.0\n";
    let build = "model = \"build\"\npolicies = [\"round-robin\"]\n[build]\nk = 4\nduration_s = 0.1\n[[run]]\nlabel = \"fine\"\n[[run]]\nlabel = \"bad\"\n";
    let fabric = "model = \"fabric\"\n[fabric]\nk = 4\nhosts_per_edge = 2\n";
    let nodes = "model = \"nodes\"\n[run]\nflps = 1\nepns = 1\nrate_hz = 100\ntfs = 10\n\
                 [[fault]]\nat_ms = 100\nnode = \"epn:0\"\nkind = \"freeze\"\n";
    for (text, field) in [
        (format!("{flow}mttr_s = 1e11\n"), "mttr_s"),
        (format!("{flow}build_timeout_s = 1e10\n"), "build_timeout_s"),
        (format!("{flow}mtbf_s = 1e-12\nmttr_s = 0\n"), "mtbf_s"),
        (
            format!("{flow}processing = \"fixed(1e11)\"\n"),
            "processing",
        ),
        (format!("{flow}epn_buffer_gb = 0\n"), "epn_buffer_gb"),
        (
            format!("{build}hosts_per_edge = 1000000\n"),
            "hosts_per_edge",
        ),
        (format!("{build}flp_every = 1\n"), "flp_every"),
        (format!("{fabric}sample_s = 1e-10\n"), "sample_s"),
        (
            flow.replace("duration_s = 0.2", "duration_s = 1e-10"),
            "duration_s",
        ),
        (
            format!("{flow}stf_size = \"uniform(1000,2000)\"\n"),
            "aggregate = false",
        ),
        (
            fabric.replace(
                "[fabric]",
                "repetitions = 2\n[fabric]\nseed = 4611686018427387904",
            ),
            "largest seed",
        ),
        (
            format!("{nodes}ms = 18446744073709\n"),
            "18446744073709 ms is over a year",
        ),
    ] {
        let exp = dir.path().join("bad.toml");
        std::fs::write(&exp, &text).unwrap();
        let results = dir.path().join("results");
        for check in [true, false] {
            let (ran, err) = sim(&exp, &results, check);
            assert!(!ran, "{text}");
            assert_eq!(err.trim().lines().count(), 1, "{text}: {err}");
            assert!(err.contains(field), "{text}: {err}");
            assert!(!results.exists(), "{text}: nothing ran");
        }
    }
}

/// `fanin --check sim` checks a file or preset as it would run, with the flags that apply
/// to it: a `--duration` or packet flag the model cannot go through fails the check, not
/// only the run.
#[test]
fn the_check_applies_the_flags_a_run_would() {
    let dir = tempfile::tempdir().unwrap();
    let flow = "model = \"flow\"\npolicies = [\"round-robin\"]\n[alice]\nflps = 4\nepns = 8\nduration_s = 0.2\ndrain_s = 1.0\n";
    let packet = "model = \"packet\"\n[sim]\npreset = \"antares-sector\"\nduration_s = 1\n[[run]]\nlabel = \"a\"\n";
    for (text, flags, field) in [
        (flow, ["--duration", "1e12"], "duration_s"),
        (packet, ["--duration", "1e7"], "duration_s"),
        (packet, ["--jitter-us", "1e8"], "jitter_us"),
    ] {
        let exp = dir.path().join("exp.toml");
        std::fs::write(&exp, text).unwrap();
        let results = dir.path().join("results");
        let (fine, err) = sim_with(&exp, &results, true, &[]);
        assert!(fine, "{text}: {err}");
        for check in [true, false] {
            let (ran, err) = sim_with(&exp, &results, check, &flags);
            assert!(!ran, "{flags:?} {text}");
            assert_eq!(err.trim().lines().count(), 1, "{flags:?}: {err}");
            assert!(err.contains(field), "{flags:?}: {err}");
            assert!(!results.exists(), "{flags:?}: nothing ran");
        }
    }
    // A preset too: the flow model's ran unchecked by --check.
    let out = fanin()
        .args([
            "--check",
            "sim",
            "--preset",
            "alice-2016",
            "--duration",
            "1e12",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("duration_s"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

/// `fanin [--check] sim EXP --results RESULTS`: whether it succeeded, and its stderr.
fn sim(exp: &Path, results: &Path, check: bool) -> (bool, String) {
    sim_with(exp, results, check, &[])
}

/// The same with more flags.
fn sim_with(exp: &Path, results: &Path, check: bool, flags: &[&str]) -> (bool, String) {
    let mut cmd = fanin();
    if check {
        cmd.arg("--check");
    }
    let out = cmd
        .arg("sim")
        .arg(exp)
        .args(flags)
        .arg("--results")
        .arg(results);
    let out = out.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.success(), err)
}
