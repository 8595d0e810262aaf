//! EPN sinks with real processes: every TF reaches every sink byte for byte (file
//! writer, Python filter, C plug-in built here, tap), slow and dying processors, refusals,
//! and the burst saver's trigger. docs/sinks.md describes what is checked here.

mod common;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use fanin_node::flp::payload::Pattern;
use fanin_proto::tf_record::{decode_file_header, RecordReader, TfRecord, FILE_HEADER_LEN};

/// Builds examples/plugin/count_tfs.c with `cc` (scripts/test installs it).
fn plugin(dir: &Path) -> PathBuf {
    let lib = dir.join("libcount_tfs.so");
    let src = repo_root().join("examples/plugin");
    run_ok(
        Command::new("cc")
            .args(["-shared", "-fPIC", "-O2", "-I"])
            .arg(&src)
            .arg("-o")
            .arg(&lib)
            .arg(src.join("count_tfs.c")),
    );
    lib
}

/// Every record of a TF stream (file header first).
fn records(mut r: impl Read) -> Vec<TfRecord> {
    let mut head = [0u8; FILE_HEADER_LEN];
    r.read_exact(&mut head).unwrap();
    decode_file_header(&head).unwrap();
    let mut rr = RecordReader::new(r, 1 << 20);
    std::iter::from_fn(|| rr.next_record().unwrap()).collect()
}

fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    v.sort();
    v
}

/// Each STF holds exactly the bytes its FLP generated for that TF (seed 1).
fn check_bytes(rec: &TfRecord, stf_len: usize) {
    assert_eq!(rec.payloads.len(), 2, "TF {}", rec.header.tf_id);
    for ((h, ok), p) in rec.stfs.iter().zip(&rec.payloads) {
        assert!(ok, "CRC of TF {} FLP {}", rec.header.tf_id, h.flp_id);
        let want = Pattern::new(1, h.flp_id).bytes(rec.header.tf_id, stf_len);
        assert!(
            *p == want,
            "TF {} FLP {}: bytes differ",
            rec.header.tf_id,
            h.flp_id
        );
    }
}

/// Reads the tap until the EPN closes it (at run end).
fn tap_client(port: u16) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut s = connect_retry(port);
        let mut v = Vec::new();
        s.read_to_end(&mut v).unwrap();
        v
    })
}

const STF: usize = 16 << 10;

#[test]
fn every_sink_gets_every_tf_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let lib = plugin(dir.path());
    let toml = "[run]\nflps = 2\nepns = 2\nrate_hz = 100\ntfs = 200\nstf_size = \"16KiB\"\n";
    let icn = start_icn(dir.path(), toml, "127.0.0.1:0");
    let tfs = dir.path().join("tfs");
    let filter = repo_root().join("examples/python/filter.py");
    let tap = free_port();
    let mut epns: Vec<Proc> = (0..2)
        .map(|i| {
            let mut a = vec![
                "--sink".to_string(),
                format!("file:{},rotate=1MiB", tfs.display()),
                "--sink".into(),
                format!("exec:python3 {}", filter.display()),
                "--sink".into(),
                format!(
                    "plugin:{},{}/counts-{i}.txt",
                    lib.display(),
                    dir.path().display()
                ),
            ];
            if i == 0 {
                a.extend(["--sink".into(), format!("tap:127.0.0.1:{tap},every=5")]);
                a.extend(["--in-order".into(), "16".into()]);
            }
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            spawn_epn(dir.path(), icn.control, i, &a)
        })
        .collect();
    let tap = tap_client(tap);
    let _flps: Vec<Proc> = (0..2)
        .map(|i| spawn_flp(dir.path(), icn.control, i))
        .collect();
    let (st, s, _) = icn.finish(60);
    assert!(st.success(), "{s}");
    assert_eq!((u(&s, "issued"), u(&s, "completed")), (200, 200), "{s}");
    for e in epns.iter_mut() {
        assert!(e.wait(30).success(), "{} failed", e.name);
    }

    // The file writer: every TF once, byte for byte; EPN 0's in TF-id order.
    let mut by_epn: BTreeMap<u32, Vec<TfRecord>> = BTreeMap::new();
    for f in files(&tfs, "fanin") {
        let epn = f.file_name().unwrap().to_string_lossy()[3..4]
            .parse()
            .unwrap();
        let recs = records(std::fs::File::open(&f).unwrap());
        assert!(
            std::fs::metadata(&f).unwrap().len() <= (1 << 20) + 40_000,
            "rotated"
        );
        by_epn.entry(epn).or_default().extend(recs);
    }
    let mut ids: Vec<u64> = by_epn.values().flatten().map(|r| r.header.tf_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..200).collect::<Vec<u64>>());
    by_epn.values().flatten().for_each(|r| check_bytes(r, STF));
    let epn0: Vec<u64> = by_epn[&0].iter().map(|r| r.header.tf_id).collect();
    assert!(epn0.windows(2).all(|w| w[0] < w[1]), "in order: {epn0:?}");

    // The Python reader agrees.
    let text = run_ok(
        Command::new("python3")
            .arg(repo_root().join("examples/python/fanin_tfs.py"))
            .args(files(&tfs, "fanin")),
    );
    let counted: u64 = text
        .lines()
        .filter_map(|l| l.split(": ").nth(1)?.split(' ').next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(counted, 200, "{text}");

    // The Python filter kept the TFs whose first byte is even, and said so on stdout.
    let kept = by_epn
        .values()
        .flatten()
        .filter(|r| r.payloads[0][0] % 2 == 0)
        .count();
    let lines: usize = files(&tfs, "out")
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap().lines().count())
        .sum();
    assert_eq!(lines, kept);

    // The plug-in saw every TF and every byte (it sums them).
    let (mut n, mut bytes, mut sum) = (0u64, 0u64, 0u64);
    for i in 0..2 {
        let t = std::fs::read_to_string(dir.path().join(format!("counts-{i}.txt"))).unwrap();
        let f: Vec<u64> = t
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        (n, bytes, sum) = (n + f[0], bytes + f[1], sum + f[2]);
    }
    let want_sum: u64 = by_epn
        .values()
        .flatten()
        .flat_map(|r| r.payloads.iter().flatten())
        .map(|b| *b as u64)
        .sum();
    assert_eq!((n, bytes, sum), (200, 200 * 2 * STF as u64, want_sum));

    // The tap: samples of EPN 0's TFs, whole and intact.
    let sampled = records(tap.join().unwrap().as_slice());
    assert!(!sampled.is_empty(), "the tap sent nothing");
    for r in &sampled {
        assert!(epn0.contains(&r.header.tf_id));
        check_bytes(r, STF);
    }
}

#[test]
fn an_epn_killed_while_writing_leaves_files_readable_to_their_last_tf() {
    let dir = tempfile::tempdir().unwrap();
    // Killed at TF 300 of 1000 at 200 Hz: seconds before the run ends, so it dies writing.
    let toml = "[run]\nflps = 1\nepns = 2\nrate_hz = 200\ntfs = 1000\nstf_size = \"64KiB\"\n\
                reassign = true\nmax_loss_pct = 100\n";
    let mut icn = start_icn(dir.path(), toml, "127.0.0.1:0");
    let tfs = dir.path().join("tfs");
    let spec = format!("file:{},fsync=never", tfs.display());
    let mut victim = spawn_epn(dir.path(), icn.control, 0, &["--sink", &spec]);
    let _other = spawn_epn(dir.path(), icn.control, 1, &["--sink", &spec]);
    let _flp = spawn_flp(dir.path(), icn.control, 0);
    icn.wait_issued(300);
    victim.kill9();
    let (st, s, _) = icn.finish(60);
    assert!(st.success(), "{s}");
    assert_eq!(s["invariant_ok"], true);
    let lost = s["membership"].as_array().unwrap().iter();
    let lost = lost.filter(|m| m["node"] == "EPN 0" && m["kind"] == "lost");
    assert_eq!(lost.count(), 1, "killed mid-run: {s}");
    let mut whole = 0;
    for f in files(&tfs, "fanin") {
        let out = fanin()
            .arg("inspect")
            .arg("--quiet")
            .arg(&f)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        whole += text
            .lines()
            .filter_map(|l| {
                l.split(", ")
                    .nth(1)?
                    .strip_suffix(" TFs")?
                    .parse::<u64>()
                    .ok()
            })
            .sum::<u64>();
    }
    // Every TF completed was written whole by the EPN that completed it.
    assert!(
        whole >= u(&s, "completed"),
        "{whole} whole TFs in files: {s}"
    );
}

#[test]
fn fanin_inspect_names_a_cut_file_and_fails_on_a_bad_crc() {
    let dir = tempfile::tempdir().unwrap();
    let stfs: Vec<(u32, Vec<u8>)> = (0..2).map(|f| (f, vec![f as u8 + 1; 1000])).collect();
    let mut bytes = fanin_proto::tf_record::encode_file_header(4).to_vec();
    for tf in 0..3 {
        let h = fanin_proto::tf_record::TfHeader {
            run_id: 1,
            tf_id: tf,
            stfs: 2,
        };
        let parts: Vec<(u32, &[u8])> = stfs.iter().map(|(f, p)| (*f, p.as_slice())).collect();
        bytes.extend(fanin_proto::tf_record::encode_record(h, &parts));
    }
    let inspect = |b: &[u8]| {
        let f = dir.path().join("t.fanin");
        std::fs::write(&f, b).unwrap();
        let out = fanin().arg("inspect").arg(&f).output().unwrap();
        let all = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), all)
    };
    let (ok, text) = inspect(&bytes);
    assert!(
        ok && text.contains("EPN 4, 3 TFs, 6000 bytes, 0 CRC errors"),
        "{text}"
    );
    let (ok, text) = inspect(&bytes[..bytes.len() - 10]);
    assert!(ok && text.contains("ends inside TF record 2"), "{text}");
    assert!(text.contains("2 TFs"), "{text}");
    let mut bad = bytes.clone();
    let n = bad.len();
    bad[n - 1] ^= 0x40;
    let (ok, text) = inspect(&bad);
    assert!(
        !ok && text.contains("crc BAD") && text.contains("1 STFs failed"),
        "{text}"
    );
    let (ok, text) = inspect(b"not a TF file at all");
    assert!(!ok && text.contains("not a fanin TF file"), "{text}");
}

#[test]
fn a_plugin_refusal_ends_its_tfs_as_sink_refused() {
    let dir = tempfile::tempdir().unwrap();
    let lib = plugin(dir.path());
    let toml = "[run]\nflps = 1\nepns = 1\nrate_hz = 200\ntfs = 50\nstf_size = \"4KiB\"\n";
    let icn = start_icn(dir.path(), toml, "127.0.0.1:0");
    let counts = dir.path().join("counts.txt");
    let spec = format!("plugin:{},{},7", lib.display(), counts.display());
    let _epn = spawn_epn(dir.path(), icn.control, 0, &["--sink", &spec]);
    let _flp = spawn_flp(dir.path(), icn.control, 0);
    let (st, s, results) = icn.finish(60);
    assert!(st.success(), "{s}");
    // TFs 0, 7, ..., 49 are refused: 8 of 50.
    assert_eq!(s["dropped_by_reason"]["sink_refused"], 8, "{s}");
    assert_eq!(u(&s, "completed"), 42, "{s}");
    assert_eq!(s["invariant_ok"], true);
    let rows = tf_rows(&results, 50);
    for (id, status, reason) in rows {
        let refused = id % 7 == 0;
        assert_eq!(
            refused,
            reason == "sink_refused",
            "TF {id}: {status} {reason}"
        );
    }
}

/// A plug-in that takes 20 TFs, then never returns from the next ("stuck"), or takes
/// 150 ms for each TF from TF 20 on ("slow").
const SLOW_PLUGIN: &str = r#"
#include <string.h>
#include <unistd.h>
#include "fanin_sink.h"
static int stuck;
int fanin_init(int argc, const char *const *argv) {
    stuck = argc > 1 && strcmp(argv[1], "stuck") == 0;
    return 0;
}
int fanin_tf(const struct fanin_tf *tf) {
    while (stuck && tf->tf_id >= 20) pause();
    if (tf->tf_id >= 20) usleep(150000);
    return 0;
}
void fanin_cleanup(void) {}
"#;

/// A run of 50 TFs into one EPN whose plug-in sink is SLOW_PLUGIN in `mode`, stopped
/// 1 s after the last TF was issued; the EPN waits 1 s for a sink that returns nothing.
fn run_into_plugin(dir: &Path, mode: &str) -> (serde_json::Value, Proc) {
    let (src, lib) = (dir.join("slow.c"), dir.join("libslow.so"));
    std::fs::write(&src, SLOW_PLUGIN).unwrap();
    run_ok(
        Command::new("cc")
            .args(["-shared", "-fPIC", "-I"])
            .arg(repo_root().join("examples/plugin"))
            .arg("-o")
            .arg(&lib)
            .arg(&src),
    );
    let toml = "[run]\nflps = 1\nepns = 1\nrate_hz = 200\ntfs = 50\nstf_size = \"4KiB\"\n\
                drain_timeout_ms = 1000\nmax_loss_pct = 100\n";
    let icn = start_icn(dir, toml, "127.0.0.1:0");
    let spec = format!("plugin:{},{mode}", lib.display());
    let stop_wait = ["--sink", &spec, "--sink-stop-timeout", "1"];
    let epn = spawn_epn(dir, icn.control, 0, &stop_wait);
    let _flp = spawn_flp(dir, icn.control, 0);
    let (st, s, _) = icn.finish(60);
    assert!(st.success(), "{s}");
    assert_eq!(s["invariant_ok"], true, "{s}");
    (s, epn)
}

/// A slow sink is not a stuck one: after the run stopped, the EPN waits while its
/// plug-in returns a TF every 150 ms, however long it takes in all (4.5 s here), and
/// every TF completes.
#[test]
fn a_slow_plugin_after_the_run_stopped_is_waited_for() {
    let dir = tempfile::tempdir().unwrap();
    let (s, mut epn) = run_into_plugin(dir.path(), "slow");
    assert!(epn.wait(30).success(), "the EPN ends well");
    assert_eq!(u(&s, "completed"), 50, "{s}");
}

/// A plug-in that never returns holds its EPN only until its sinks returned nothing for
/// `--sink-stop-timeout` after the run stopped: the EPN then ends with a line naming the
/// wait, and the ICN ends the TFs the plug-in held as dropped (`unacknowledged`).
#[test]
fn a_plugin_that_never_returns_holds_its_epn_only_until_the_stop_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let (s, mut epn) = run_into_plugin(dir.path(), "stuck");
    assert_eq!(u(&s, "completed"), 20, "the TFs the plug-in returned: {s}");
    let never = &s["dropped_by_reason"]["unacknowledged"];
    assert_eq!(never, 30, "the TFs it held end as dropped: {s}");
    assert!(!epn.wait(30).success(), "the EPN ends with an error");
    let log = std::fs::read_to_string(dir.path().join("epn-0.log")).unwrap();
    assert!(
        log.contains("its sinks returned no TF for 1.0 s after the run's stop"),
        "{log}"
    );
}

#[test]
fn a_dying_processor_is_restarted_and_its_lost_tfs_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let toml = "[run]\nflps = 1\nepns = 1\nrate_hz = 100\ntfs = 100\nstf_size = \"16KiB\"\n";
    let icn = start_icn(dir.path(), toml, "127.0.0.1:0");
    // Each incarnation takes ~6 TFs, then exits.
    let spec = "exec:head -c 100000 > /dev/null";
    let mut epn = spawn_epn(dir.path(), icn.control, 0, &["--sink", spec]);
    let _flp = spawn_flp(dir.path(), icn.control, 0);
    let (st, s, _) = icn.finish(60);
    assert!(st.success(), "{s}");
    let failed = s["dropped_by_reason"]["sink_failed"].as_u64().unwrap_or(0);
    assert!(failed >= 1, "{s}");
    assert_eq!(u(&s, "completed") + failed, 100, "{s}");
    assert_eq!(s["invariant_ok"], true);
    epn.wait(30);
    let log = std::fs::read_to_string(dir.path().join("epn-0.log")).unwrap();
    assert!(
        log.contains("exec sink `head -c 100000 > /dev/null`") && log.contains("exited with 0"),
        "{log}"
    );
}

#[test]
fn a_processor_that_dies_with_leave_takes_its_epn_out_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let toml = "[run]\nflps = 1\nepns = 2\nrate_hz = 100\ntfs = 200\nstf_size = \"16KiB\"\n\
                reassign = true\nlease_ms = 1000\n";
    let icn = start_icn(dir.path(), toml, "127.0.0.1:0");
    let leave = [
        "--sink",
        "exec:head -c 100000 > /dev/null",
        "--on-sink-failure",
        "leave",
    ];
    let mut quitter = spawn_epn(dir.path(), icn.control, 0, &leave);
    let _other = spawn_epn(
        dir.path(),
        icn.control,
        1,
        &["--sink", "exec:cat > /dev/null"],
    );
    let _flp = spawn_flp(dir.path(), icn.control, 0);
    assert!(
        !quitter.wait(60).success(),
        "EPN 0 must leave with an error"
    );
    let (st, s, _) = icn.finish(60);
    assert!(st.success(), "{s}");
    assert_eq!(s["invariant_ok"], true);
    // Its TF being written when the command died ended sink_failed; the rest moved.
    let failed = s["dropped_by_reason"]["sink_failed"].as_u64().unwrap_or(0);
    assert_eq!(u(&s, "completed") + failed, 200, "{s}");
    let log = std::fs::read_to_string(dir.path().join("epn-0.log")).unwrap();
    assert!(log.contains("the EPN leaves the run"), "{log}");
}

#[test]
fn a_slow_processor_gets_fewer_tfs_under_least_loaded_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    // EPN 0 reads 64 KiB every 50 ms (~1.3 MB/s); EPNs 1 and 2 as fast as they can.
    let exp = dir.path().join("slow.toml");
    std::fs::write(
        &exp,
        r#"
[run]
flps = 2
epns = 3
rate_hz = 100
duration_s = 4
stf_size = "64KiB"
policy = "least-loaded"
least_loaded.when_none_ready = "wait"
epn_buffer = "4MiB"
drain_timeout_ms = 30000

[[sink]]
spec = '''exec:python3 -c 'import sys,time; r=sys.stdin.buffer; [time.sleep(0.05) for _ in iter(lambda: r.read(65536), b"")]' '''
epns = [0]

[[sink]]
spec = "exec:cat > /dev/null"
epns = [1, 2]
"#,
    )
    .unwrap();
    let results = dir.path().join("results");
    let out = fanin()
        .arg("run")
        .arg(&exp)
        .arg("--results")
        .arg(&results)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = run_dir(&results);
    let s = read_summary(&run);
    assert_eq!(u(&s, "completed"), u(&s, "issued"), "{s}");
    let t = std::fs::read_to_string(run.join("tfs.csv")).unwrap();
    let mut per_epn = [0u64; 3];
    for l in t.lines().skip(1) {
        let epn: usize = l.split(',').nth(1).unwrap().parse().unwrap();
        per_epn[epn] += 1;
    }
    eprintln!("TFs per EPN: {per_epn:?}");
    assert!(
        per_epn[0] * 2 < per_epn[1].min(per_epn[2]),
        "TFs per EPN: {per_epn:?}"
    );
}

#[test]
fn a_trigger_saves_the_seconds_before_and_after_it() {
    let dir = tempfile::tempdir().unwrap();
    // 800 TFs at 100 Hz: the trigger and the scrape come seconds before the run ends.
    let toml = "[run]\nflps = 1\nepns = 1\nrate_hz = 100\ntfs = 800\nstf_size = \"4KiB\"\n";
    let mut icn = start_icn(dir.path(), toml, "127.0.0.1:0");
    let burst = dir.path().join("burst");
    let metrics = format!("127.0.0.1:{}", free_port());
    let spec = format!("burst:{},keep_s=1,after_s=1", burst.display());
    let _epn = spawn_epn(
        dir.path(),
        icn.control,
        0,
        &["--sink", &spec, "--metrics", &metrics],
    );
    let _flp = spawn_flp(dir.path(), icn.control, 0);
    icn.wait_issued(250);
    run_ok(fanin().args(["trigger", "--epn", &metrics]));
    let at = icn_issued_now(&metrics);
    let (st, s, _) = icn.finish(60);
    assert!(st.success(), "{s}");
    let saved = files(&burst, "fanin");
    assert_eq!(saved.len(), 1, "{saved:?}");
    let ids: Vec<u64> = records(std::fs::File::open(&saved[0]).unwrap())
        .iter()
        .map(|r| r.header.tf_id)
        .collect();
    eprintln!(
        "trigger after TF {at}: saved TFs {}..={}",
        ids[0],
        ids[ids.len() - 1]
    );
    // 1 s before and 1 s after at 100 TFs/s, every TF in between.
    assert!(
        ids.windows(2).all(|w| w[1] == w[0] + 1),
        "contiguous: {ids:?}"
    );
    assert!((150..=250).contains(&ids.len()), "{} TFs saved", ids.len());
    assert!(ids[0] < at && at < *ids.last().unwrap(), "{at} in {ids:?}");
}

/// TFs the EPN had built when the trigger returned (its complete-TF counter).
fn icn_issued_now(epn_metrics: &str) -> u64 {
    let text = scrape(epn_metrics.parse().unwrap());
    metric(&text, &["fanin_tfs_total", "status=\"complete\""]) as u64
}

#[test]
fn a_tap_client_that_never_reads_misses_samples_and_slows_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // 600 TFs at 100 Hz: the EPN is still in its run seconds after TF 200, when it is
    // scraped (PROGRESS lines come every 250 ms, and CI machines are slow).
    let toml = "[run]\nflps = 1\nepns = 1\nrate_hz = 100\ntfs = 600\nstf_size = \"256KiB\"\n";
    let mut icn = start_icn(dir.path(), toml, "127.0.0.1:0");
    let (tap, metrics) = (free_port(), format!("127.0.0.1:{}", free_port()));
    let spec = format!("tap:127.0.0.1:{tap},every=1,queue=1MiB");
    let _epn = spawn_epn(
        dir.path(),
        icn.control,
        0,
        &["--sink", &spec, "--metrics", &metrics],
    );
    let _flp = spawn_flp(dir.path(), icn.control, 0);
    // Connected, then never read: its socket buffers fill, then its queue.
    let _stuck = connect_retry(tap);
    icn.wait_issued(200);
    let text = scrape(metrics.parse().unwrap());
    let slow = metric(&text, &["fanin_stfs_total", "tap_sample", "client_slow"]);
    let (st, s, _) = icn.finish(60);
    assert!(st.success(), "{s}");
    assert_eq!(u(&s, "completed"), 600, "the data path went on: {s}");
    assert!(
        slow > 0.0,
        "samples the client could not take are counted:\n{text}"
    );
}

/// The Python filter shown in the README is the one the tests run.
#[test]
fn the_readme_shows_the_python_filter_as_it_is() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let filter = std::fs::read_to_string(repo_root().join("examples/python/filter.py")).unwrap();
    assert!(
        readme.contains(&format!("```python\n{filter}```")),
        "README.md's filter differs"
    );
    assert!(
        filter.lines().count() <= 25,
        "the README promises a short filter"
    );
}
