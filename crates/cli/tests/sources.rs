//! STF sources with real processes, on-data scheduling: known pseudo-random STFs go in
//! through a shared-memory ring (the FLP killed and restarted mid-run), a command's
//! stdout (an EPN killed mid-run) and recorded files, and come out at the EPNs' file
//! sinks byte for byte, every TF once, none lost.

mod common;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use fanin_proto::tf_record::{decode_file_header, RecordReader, TfRecord, FILE_HEADER_LEN};

/// The test's STF contents: xorshift64 from (FLP, TF); `EXEC_SCRIPT` makes the same.
fn payload(flp: u32, tf: u64, len: usize) -> Vec<u8> {
    let mut x = ((flp as u64) << 32 | tf).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// STF sizes vary per FLP and TF (on-data: the ICN learns each from the announcement).
fn size(flp: u32, tf: u64) -> usize {
    4096 + ((tf * 7919 + flp as u64 * 104_729) % 60_000) as usize
}

/// A read-out for `exec:`: FSTF frames of the same STFs on stdout.
const EXEC_SCRIPT: &str = r#"
import os, struct, sys, time
M = (1 << 64) - 1
flp, n = int(os.environ["FANIN_FLP_ID"]), int(sys.argv[1])
out = sys.stdout.buffer
for tf in range(n):
    size = 4096 + (tf * 7919 + flp * 104729) % 60000
    x = (((flp << 32 | tf) * 0x9E3779B97F4A7C15) & M) | 1
    words = []
    for _ in range((size + 7) // 8):
        x ^= (x << 13) & M; x ^= x >> 7; x ^= (x << 17) & M
        words.append(x)
    data = struct.pack("<%dQ" % len(words), *words)[:size]
    out.write(b"FSTF" + struct.pack("<HHQQ", 1, 0, tf, size) + data)
    time.sleep(0.01)  # 100 STFs a second at most: an EPN killed at TF 100 dies mid-run
out.flush()
"#;

fn records(path: &Path) -> Vec<TfRecord> {
    let mut f = std::fs::File::open(path).unwrap();
    let mut head = [0u8; FILE_HEADER_LEN];
    f.read_exact(&mut head).unwrap();
    decode_file_header(&head).unwrap();
    let mut rr = RecordReader::new(f, 1 << 20);
    std::iter::from_fn(|| rr.next_record().unwrap()).collect()
}

/// Every TF the EPNs' file sinks under `dir` wrote (TF id -> its records); each holds
/// exactly the STFs `payload` makes.
fn delivered(dir: &Path) -> BTreeMap<u64, Vec<TfRecord>> {
    let mut by_tf: BTreeMap<u64, Vec<TfRecord>> = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "fanin") {
            for r in records(&p) {
                by_tf.entry(r.header.tf_id).or_default().push(r);
            }
        }
    }
    for (tf, recs) in &by_tf {
        for r in recs {
            assert_eq!(r.payloads.len(), 2, "TF {tf}: both STFs");
            for ((h, crc_ok), p) in r.stfs.iter().zip(&r.payloads) {
                assert!(crc_ok, "TF {tf} FLP {}: CRC", h.flp_id);
                let want = payload(h.flp_id, *tf, size(h.flp_id, *tf));
                assert!(*p == want, "TF {tf} FLP {}: bytes differ", h.flp_id);
            }
        }
    }
    by_tf
}

/// An on-data run of `tfs` TFs, 2 FLPs x 2 EPNs, generous stale and build time-outs
/// (a restarted FLP comes back well within them).
fn config(tfs: u64) -> String {
    format!(
        r#"
flps = 2
epns = 2
tfs = {tfs}
rate_hz = 0
stf_size = "64KiB"
schedule = "on-data"
stf_stale_ms = 20000
build_timeout_ms = 20000
prerun_timeout_s = 30
"#
    )
}

fn epns(dir: &Path, icn: &Icn, sink: &Path) -> Vec<Proc> {
    let spec = format!("file:{}", sink.display());
    (0..2)
        .map(|e| spawn_epn(dir, icn.control, e, &["--sink", &spec]))
        .collect()
}

/// Ends the run: every TF completed exactly once, its summary's invariant holds.
fn all_completed(icn: Icn, tfs: u64) -> PathBuf {
    let (st, s, results) = icn.finish(120);
    assert!(st.success(), "ICN failed: {s}");
    assert_eq!(s["invariant_ok"], true);
    assert_eq!((u(&s, "issued"), u(&s, "completed")), (tfs, tfs), "{s}");
    let rows = tf_rows(&results, tfs);
    assert!(rows.iter().all(|r| r.1 == "complete"));
    results
}

/// A read-out thread: ring NAME, `n` STFs of FLP `flp`, 100 a second (so a run of 600
/// still reads out for seconds after TF 150, however late a test acts), then closed and
/// freed.
fn ring_readout(name: String, flp: u32, n: u64) -> std::thread::JoinHandle<()> {
    let mut w = fanin_shm::Writer::create(&name, 8, 64 * 1024).unwrap();
    std::thread::spawn(move || {
        for tf in 0..n {
            w.write(tf, &payload(flp, tf, size(flp, tf)), true).unwrap();
            std::thread::sleep(Duration::from_millis(10));
        }
        w.close();
        assert!(
            w.wait_empty(Duration::from_secs(60)),
            "the FLP freed every slot"
        );
        w.unlink().unwrap();
    })
}

#[test]
fn an_flp_killed_and_restarted_mid_run_loses_nothing_from_its_ring() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (tfs, sink) = (600, dir.join("tfs"));
    let rings: Vec<String> = (0..2)
        .map(|f| format!("fanin-t{}-{f}", std::process::id()))
        .collect();
    let readouts: Vec<_> = (0..2)
        .map(|f| ring_readout(rings[f].clone(), f as u32, tfs))
        .collect();
    let mut icn = start_icn(dir, &config(tfs), "127.0.0.1:0");
    let _epns = epns(dir, &icn, &sink);
    let source = |f: usize| format!("shm:{}", rings[f]);
    let _flp0 = spawn_flp_with(dir, icn.control, 0, &["--source", &source(0)]);
    let mut flp1 = spawn_flp_with(dir, icn.control, 1, &["--source", &source(1)]);
    icn.wait_issued(150);
    flp1.kill9();
    // Gone, and with it its lock on the ring (a live reader keeps a successor out).
    let t = std::time::Instant::now();
    while flp1.is_running() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "FLP 1 outlived SIGKILL"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let _flp1 = spawn_flp_with(dir, icn.control, 1, &["--source", &source(1)]);
    let results = all_completed(icn, tfs);
    let got = delivered(&sink);
    assert_eq!(got.len() as u64, tfs, "every TF in the files");
    for r in readouts {
        r.join().unwrap();
    }
    let events = std::fs::read_to_string(results.join("summary.json")).unwrap();
    assert!(
        events.contains("FLP 1") && events.contains("rejoined"),
        "{events}"
    );
}

#[test]
fn exec_sources_feed_a_run_in_which_an_epn_dies_and_replay_runs_it_again() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (tfs, sink) = (300, dir.join("tfs"));
    let script = dir.join("readout.py");
    std::fs::write(&script, EXEC_SCRIPT).unwrap();
    let mut icn = start_icn(dir, &config(tfs), "127.0.0.1:0");
    let mut epn_procs = epns(dir, &icn, &sink);
    let spec = format!("exec:python3 {} {tfs}", script.display());
    let _flps: Vec<Proc> = (0..2)
        .map(|f| spawn_flp_with(dir, icn.control, f, &["--source", &spec]))
        .collect();
    icn.wait_issued(100);
    epn_procs[0].kill9();
    all_completed(icn, tfs);
    // Every TF once at least (the killed EPN's files may hold a TF it built but never
    // reported; the ICN moved that one and counted it once), bytes identical.
    let got = delivered(&sink);
    assert_eq!(got.len() as u64, tfs);

    // The recorded TFs, replayed into a new run, come out the same.
    let dir2 = dir.join("replay");
    std::fs::create_dir(&dir2).unwrap();
    let (sink2, spec2) = (
        dir2.join("tfs"),
        format!("replay:{},rate=500", sink.display()),
    );
    let icn = start_icn(&dir2, &config(tfs), "127.0.0.1:0");
    let _epns2 = epns(&dir2, &icn, &sink2);
    let _flps2: Vec<Proc> = (0..2)
        .map(|f| spawn_flp_with(&dir2, icn.control, f, &["--source", &spec2]))
        .collect();
    all_completed(icn, tfs);
    assert_eq!(delivered(&sink2).len() as u64, tfs);
}

#[test]
fn a_missing_ring_ends_its_flp_with_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut icn = start_icn(dir, &config(50), "127.0.0.1:0");
    let _epns = epns(dir, &icn, &dir.join("tfs"));
    let _flp0 = spawn_flp_with(dir, icn.control, 0, &[]);
    let mut flp1 = spawn_flp_with(dir, icn.control, 1, &["--source", "shm:no-such-ring"]);
    assert!(!flp1.wait(30).success(), "a missing ring ends the FLP");
    let log = std::fs::read_to_string(dir.join("flp-1.log")).unwrap();
    let want = "FLP 1: source shm:no-such-ring: /dev/shm/no-such-ring: No such file";
    assert!(log.contains(want), "{log}");
    icn.proc.kill9();
}

/// An STF larger than the run's `stf_size` (which the EPNs accept at most) fails its
/// source with a line naming both, instead of being sent and refused EPN after EPN.
#[test]
fn an_stf_over_the_runs_stf_size_fails_its_source() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let cfg = config(10) + "stf_stale_ms = 300\non_stale = \"drop\"\nmax_loss_pct = 100\n";
    let cfg = cfg.replace("stf_stale_ms = 20000\n", "");
    let icn = start_icn(dir, &cfg, "127.0.0.1:0");
    let _epns = epns(dir, &icn, &dir.join("tfs"));
    let big = "exec:python3 -c 'import sys, struct; \
               sys.stdout.buffer.write(b\"FSTF\" + struct.pack(\"<HHQQ\", 1, 0, 0, 70000) + bytes(70000))'";
    let script = dir.join("readout.py");
    std::fs::write(&script, EXEC_SCRIPT).unwrap();
    let good = format!("exec:python3 {} 10", script.display());
    let _flp0 = spawn_flp_with(dir, icn.control, 0, &["--source", big]);
    let _flp1 = spawn_flp_with(dir, icn.control, 1, &["--source", &good]);
    let (st, s, _) = icn.finish(60);
    assert!(st.success(), "{s}");
    assert_eq!(s["invariant_ok"], true);
    let want = "FLP 0: source: the STF of TF 0 is 70000 bytes, over the run's stf_size (65536 bytes at most)";
    assert!(s.to_string().contains(want), "{s}");
    let lost = s["membership"].as_array().unwrap().iter();
    assert_eq!(
        lost.filter(|m| m["kind"] == "lost").count(),
        0,
        "no EPN lost: {s}"
    );
}

#[test]
fn a_malformed_stf_fails_its_source_and_the_tfs_end_with_their_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let script = dir.join("readout.py");
    std::fs::write(&script, EXEC_SCRIPT).unwrap();
    let cfg = config(40) + "stf_stale_ms = 300\non_stale = \"drop\"\nmax_loss_pct = 100\n";
    let cfg = cfg.replace("stf_stale_ms = 20000\n", "");
    let icn = start_icn(dir, &cfg, "127.0.0.1:0");
    let _epns = epns(dir, &icn, &dir.join("tfs"));
    let bad = "exec:printf FSTX00000000000000000000";
    let good = format!("exec:python3 {} 40", script.display());
    let _flp0 = spawn_flp_with(dir, icn.control, 0, &["--source", bad]);
    let _flp1 = spawn_flp_with(dir, icn.control, 1, &["--source", &good]);
    let (st, s, _) = icn.finish(60);
    assert!(st.success(), "{s}");
    assert_eq!(s["invariant_ok"], true);
    assert_eq!((u(&s, "issued"), u(&s, "dropped")), (40, 40), "{s}");
    assert_eq!(s["dropped_by_reason"]["stf_stale"], 40, "{s}");
    let text = s.to_string();
    let want = "source failed: FLP 0: source exec:printf FSTX00000000000000000000: STF frame 0: magic: 0x58545346 is not FSTF";
    assert!(text.contains(want), "{text}");
}

/// examples/shm/readout.c's payload: splitmix64 from tf * 1000 + FLP.
fn splitmix_payload(flp: u64, tf: u64, len: usize) -> Vec<u8> {
    let mut x = tf * 1000 + flp;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Checks FLP 0's STFs (Python's randbytes) in every TF file under `sink`.
const CHECK_PY: &str = r#"
import glob, random, sys
sys.path.insert(0, sys.argv[2])
import fanin_tfs
n = 0
for p in sorted(glob.glob(sys.argv[1] + "/*.fanin")):
    with open(p, "rb") as f:
        for tf in fanin_tfs.read_tfs(f):
            s = [s for s in tf.stfs if s.flp_id == 0][0]
            assert s.data == random.Random(tf.tf_id * 1000).randbytes(len(s.data)), tf.tf_id
            n += 1
print(n)
"#;

#[test]
fn the_c_and_python_readout_examples_feed_their_flps_byte_for_byte() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (tfs, size, sink) = (200u64, 20_000usize, dir.join("tfs"));
    let root = repo_root();
    let readout_c = dir.join("readout");
    run_ok(
        std::process::Command::new("cc")
            .args(["-O2", "-I"])
            .arg(root.join("examples/shm"))
            .arg("-o")
            .arg(&readout_c)
            .arg(root.join("examples/shm/readout.c")),
    );
    let ring = |f: u32| format!("fanin-ex{}-{f}", std::process::id());
    let (n, sz) = (tfs.to_string(), size.to_string());
    let mut py = Proc::spawn(
        "python read-out",
        std::process::Command::new("python3")
            .arg(root.join("examples/python/readout.py"))
            .args([&ring(0), &n, &sz, "0"]),
    );
    let mut c = Proc::spawn(
        "C read-out",
        std::process::Command::new(&readout_c).args([&ring(1), &n, &sz, "1"]),
    );
    for f in 0..2 {
        let path = Path::new("/dev/shm").join(ring(f));
        let t0 = std::time::Instant::now();
        while !path.exists() {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "no ring {}",
                path.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let icn = start_icn(dir, &config(tfs), "127.0.0.1:0");
    let _epns = epns(dir, &icn, &sink);
    let _flps: Vec<Proc> = (0..2)
        .map(|f| {
            spawn_flp_with(
                dir,
                icn.control,
                f,
                &["--source", &format!("shm:{}", ring(f))],
            )
        })
        .collect();
    all_completed(icn, tfs);
    assert!(
        py.wait(30).success() && c.wait(30).success(),
        "read-outs end once freed"
    );
    let mut seen = 0;
    for e in std::fs::read_dir(&sink).unwrap() {
        for r in records(&e.unwrap().path()) {
            let (h, p) = (r.stfs[1].0, &r.payloads[1]);
            assert_eq!(h.flp_id, 1);
            assert!(
                *p == splitmix_payload(1, r.header.tf_id, size),
                "TF {}",
                r.header.tf_id
            );
            seen += 1;
        }
    }
    assert_eq!(seen, tfs);
    let out = run_ok(
        std::process::Command::new("python3")
            .args(["-c", CHECK_PY])
            .arg(&sink)
            .arg(root.join("examples/python")),
    );
    assert_eq!(out.trim(), tfs.to_string(), "FLP 0's bytes are Python's");
}

#[test]
fn the_synthetic_source_on_the_flps_clock_delivers_its_pattern_with_an_epn_killed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // 700 TFs at 200 Hz: EPN 1 is killed at TF 100, seconds before the run ends.
    let (tfs, sink) = (700, dir.join("tfs"));
    let cfg = config(tfs).replace("rate_hz = 0", "rate_hz = 200");
    let mut icn = start_icn(dir, &cfg, "127.0.0.1:0");
    let mut epn_procs = epns(dir, &icn, &sink);
    let _flps: Vec<Proc> = (0..2).map(|f| spawn_flp(dir, icn.control, f)).collect();
    icn.wait_issued(100);
    epn_procs[1].kill9();
    all_completed(icn, tfs);
    let mut seen = std::collections::BTreeSet::new();
    for e in std::fs::read_dir(&sink).unwrap() {
        for r in records(&e.unwrap().path()) {
            for ((h, crc_ok), p) in r.stfs.iter().zip(&r.payloads) {
                let pattern = fanin_node::flp::payload::Pattern::new(1, h.flp_id);
                assert!(*crc_ok && *p == pattern.bytes(r.header.tf_id, 64 * 1024));
            }
            seen.insert(r.header.tf_id);
        }
    }
    assert_eq!(seen.len() as u64, tfs, "every TF in the files");
}
