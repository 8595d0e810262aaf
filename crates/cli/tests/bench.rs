//! `fanin bench throughput` end to end: it runs iperf3 and fanin on the same loopback path
//! and prints both goodputs and their ratio. Checks the output, never the speed.

mod common;
use common::*;

/// Runs `fanin bench ARGS` (its results under `results`), which must succeed: stdout.
fn bench(args: &[&str], results: &std::path::Path) -> String {
    let out = fanin()
        .arg("bench")
        .args(args)
        .arg("--results")
        .arg(results)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    stdout
}

/// The first line of `stdout` starting with `prefix`.
fn line<'a>(stdout: &'a str, prefix: &str) -> &'a str {
    stdout
        .lines()
        .find(|l| l.starts_with(prefix))
        .expect(stdout)
}

/// The numbers of a line, in order.
fn numbers(row: &str) -> Vec<f64> {
    row.split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect()
}

/// Whether `ratio` (printed to 3 decimals) is a / b for values that printed (to 2
/// decimals) as `a` and `b`: their rounding is allowed for, a wrong column is not.
fn ratio_of_printed(a: f64, b: f64, ratio: f64) -> bool {
    let (lo, hi) = ((a - 0.005) / (b + 0.005), (a + 0.005) / (b - 0.005));
    b > 0.005 && (lo - 0.0006..=hi + 0.0006).contains(&ratio)
}

/// Fails loudly without iperf3 (the reference of these benchmarks).
fn need_iperf3() {
    let have_iperf3 = std::process::Command::new("iperf3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        have_iperf3,
        "iperf3 is not installed: run scripts/test, which installs what the tests need"
    );
}

#[test]
fn bench_throughput_prints_both_goodputs_and_their_ratio() {
    need_iperf3();
    let dir = tempfile::tempdir().unwrap();
    let out = fanin()
        .args([
            "bench",
            "throughput",
            "--seconds",
            "1",
            "--repeat",
            "1",
            "--cases",
            "1x1",
        ])
        .args(["--stf-size", "1MiB", "--results"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with("1->1"))
        .unwrap_or_else(|| panic!("no 1->1 row in {stdout}"));
    let f: Vec<f64> = row
        .split_whitespace()
        .skip(1)
        .take(4)
        .map(|x| x.parse().unwrap())
        .collect();
    let (iperf, fanin_gbps, ratio, loss) = (f[0], f[1], f[2], f[3]);
    assert!(iperf > 0.0 && fanin_gbps > 0.0, "{row}");
    assert!(
        ratio_of_printed(fanin_gbps, iperf, ratio),
        "ratio column: {row}"
    );
    assert_eq!(loss, 0.0, "{row}");
}

/// `fanin bench flow` is a speed benchmark: times and the counts that make them
/// comparable, no tables, no results path that will not exist afterwards.
#[test]
fn bench_flow_prints_its_times_and_nothing_else() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let out = fanin()
        .current_dir(root)
        .args(["bench", "flow", "--seconds", "1"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.lines().count() <= 6, "{stdout}");
    assert!(!stdout.contains("results"), "{stdout}");
    assert!(stdout.contains("same counts: true"), "{stdout}");
    let fat = stdout
        .lines()
        .find(|l| l.starts_with("fat tree ("))
        .expect(&stdout);
    assert!(fat.contains("100 runs") && fat.ends_with("s wall"), "{fat}");
}

/// `fanin bench sink`: each hand-off beside its reference, as ratios, and the EPN's CPU
/// per TF for discard, plug-in and pipe (a C compiler builds the null plug-in).
#[test]
fn bench_sink_prints_its_ratios_and_cpu_per_tf() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["sink", "--seconds", "1", "--write", "64MiB"];
    let stdout = bench(
        &[&args[..], &["--stf-size", "1MiB", "--rate-hz", "20"]].concat(),
        dir.path(),
    );
    for what in ["file writer vs dd", "exec (cat > /dev/null) vs discard"] {
        let row = line(&stdout, what);
        let nums = numbers(row);
        let (fanin_gbps, reference, ratio) = (nums[0], nums[1], nums[2]);
        assert!(fanin_gbps > 0.0 && reference > 0.0, "{row}");
        assert!(ratio_of_printed(fanin_gbps, reference, ratio), "{row}");
    }
    for case in ["discard", "plugin (no copy)", "exec pipe"] {
        let row = stdout
            .lines()
            .find(|l| l.starts_with(&format!("  {case} ")) && l.ends_with(" µs"))
            .expect(&stdout);
        let us: f64 = row
            .split_whitespace()
            .rev()
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        assert!(us > 0.0, "the EPN's CPU time must be measured: {row}");
    }
    // The files the writer wrote are gone; the results stay.
    let left: Vec<_> = walk(dir.path())
        .into_iter()
        .filter(|p| p.ends_with(".fanin"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

fn walk(d: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(d)
        .unwrap()
        .flat_map(|e| {
            let p = e.unwrap().path();
            match p.is_dir() {
                true => walk(&p),
                false => vec![p.display().to_string()],
            }
        })
        .collect()
}

/// `fanin bench metrics`: CPU per scrape with and without host metrics, and the share of
/// one core at a 1 s interval that follows from it.
#[test]
fn bench_metrics_prints_cpu_per_scrape_and_the_share_of_a_core() {
    let out = fanin()
        .args(["bench", "metrics", "--scrapes", "50"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let us = |prefix: &str| -> f64 {
        let row = stdout
            .lines()
            .find(|l| l.starts_with(prefix))
            .expect(&stdout);
        let after = row.split_once(':').expect(row).1;
        after
            .split_whitespace()
            .find_map(|w| w.parse().ok())
            .expect(row)
    };
    let (plain, host) = (us("without host metrics:"), us("with host metrics:"));
    assert!(plain > 0.0 && host > 0.0, "{stdout}");
    let share = us("at a 1 s scrape interval:");
    assert!((share - host / 1e4).abs() < 1e-3, "{stdout}");
}

#[test]
fn bench_source_prints_the_ring_against_synthetic_and_the_scheduling_delay() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["source", "--seconds", "1", "--stf-size", "1MiB"];
    // Low rates and one pair: a debug build, on a busy machine.
    let low = ["--rates", "100,200", "--repetitions", "1"];
    let stdout = bench(&[&args[..], &low].concat(), dir.path());
    let nums = |prefix: &str| numbers(line(&stdout, prefix));
    let g = nums("goodput");
    assert!(g[0] > 0.0 && g[1] > 0.0, "{stdout}");
    assert!(
        ratio_of_printed(g[0], g[1], g[2]),
        "the ratio is shm / synthetic: {stdout}"
    );
    let c = nums("FLP CPU");
    assert!(c[0] > 0.0 && c[1] > 0.0, "{stdout}");
    for rate in ["  100 Hz", "  200 Hz"] {
        let row = stdout.lines().find(|l| l.contains(rate)).expect(&stdout);
        let n = numbers(row);
        // rate, TFs, p50, p99: every TF of the second timed, p50 <= p99.
        assert!(n[1] >= n[0] * 0.99 && n[2] > 0.0 && n[2] <= n[3], "{row}");
    }
}

/// `fanin bench transport --quick`: every peer at every quick block size, each row with
/// numbers or the reason it has none, fanin against the best peer, the CSV and the
/// plots. ZeroMQ and nng are measured when built in (`scripts/test` builds them in).
#[test]
fn bench_transport_quick_measures_every_peer_and_writes_its_csv_and_plots() {
    need_iperf3();
    let dir = tempfile::tempdir().unwrap();
    let out = fanin()
        .args(["bench", "transport", "--quick", "--bytes", "16MiB", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let peers = ["fanin", "fanin-crc", "zeromq", "nng", "iperf3", "tcp"];
    let built = cfg!(feature = "peers");
    assert_eq!(
        stdout.contains("zeromq, nng: not built in"),
        !built,
        "{stdout}"
    );
    for size in ["4 KiB", "64 KiB", "1 MiB", "16 MiB"] {
        for p in peers {
            let row = stdout
                .lines()
                .find(|l| {
                    let w: Vec<&str> = l.split_whitespace().collect();
                    w.len() >= 5
                        && w[..3] == ["loopback", "untuned", p]
                        && w[3..5].join(" ") == size
                })
                .unwrap_or_else(|| panic!("no row for {p} at {size}:\n{stdout}"));
            let measured = match p {
                "zeromq" | "nng" => built,
                "iperf3" => size != "16 MiB",
                _ => true,
            };
            let v = numbers(row);
            if measured {
                assert!(v.len() >= 4 && v[1..4].iter().all(|x| *x > 0.0), "{row}");
            } else {
                assert!(row.contains("NaN"), "{row}");
                let why = if p == "iperf3" {
                    "at most 1 MiB"
                } else {
                    "peers"
                };
                assert!(row.contains(why), "{row}");
            }
        }
    }
    for size in ["64 KiB", "1 MiB", "16 MiB"] {
        let lines: Vec<&str> = stdout
            .lines()
            .filter(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                w.len() > 4
                    && w[0] == "loopback"
                    && w[2..4].join(" ") == size
                    && l.contains("send CPU")
            })
            .collect();
        // Against every peer, then against the libraries (no line without them).
        let expected = if built { 2 } else { 1 };
        assert_eq!(
            lines.len(),
            expected,
            "fanin-vs-best lines at {size}:\n{stdout}"
        );
        for l in lines {
            assert!(l.ends_with("leads") || l.ends_with("behind"), "{l}");
        }
    }
    for what in ["every peer", "ZeroMQ and nng"] {
        let l = format!("fanin leads {what} everywhere from 64 KiB: ");
        assert!(stdout.contains(&l), "{stdout}");
    }
    let unmeasured = "fanin leads ZeroMQ and nng everywhere from 64 KiB: not measured";
    assert_eq!(stdout.contains(unmeasured), !built, "{stdout}");
    let csv = std::fs::read_to_string(dir.path().join("transport.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 4 * peers.len(), "{csv}");
    assert!(
        csv.starts_with("net,tuning,transport,block_bytes,gbit_s,"),
        "{csv}"
    );
    for f in ["throughput", "cpu-send", "cpu-recv"] {
        let svg = std::fs::read_to_string(dir.path().join(format!("loopback-{f}.svg"))).unwrap();
        assert!(svg.contains("<svg") && svg.contains("fanin untuned"), "{f}");
    }
}

/// Bad values get a one-line error naming the option.
#[test]
fn bench_transport_refuses_bad_sizes_and_repeats() {
    for (args, field) in [
        (&["--sizes", "0"][..], "--sizes"),
        (&["--sizes", "ten"][..], "--sizes"),
        (&["--repeat", "0"][..], "--repeat"),
        (&["--bytes", "0"][..], "--bytes"),
    ] {
        let out = fanin()
            .args([
                "bench",
                "transport",
                "--quick",
                "--out",
                "/nonexistent-never",
            ])
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(field), "{args:?}: {err}");
    }
}
