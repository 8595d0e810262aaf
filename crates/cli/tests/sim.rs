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
    assert_eq!(outs[0], outs[1], "two runs with the same seed differ");
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
