//! The emulated cluster with real kernel networking: `fanin testbed` up/down leaves nothing
//! behind, shaping is real (iperf3), and a run across namespaces accounts for every TF.
//! Needs root; without it these tests fail, unless FANIN_SKIP_ROOT_TESTS=1 (see README).

mod common;

use std::process::Command;

use common::{fanin, read_summary, run_dir, run_ok, wait_for_log, Proc};

/// Skips (loudly) only when the README's opt-out is set; otherwise demands root.
fn root_or_skip(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    if std::env::var_os("FANIN_SKIP_ROOT_TESTS").is_some() {
        eprintln!("SKIPPED {test}: not root and FANIN_SKIP_ROOT_TESTS is set");
        return false;
    }
    panic!("{test} needs root (network namespaces); run as root or set FANIN_SKIP_ROOT_TESTS=1");
}

fn netns_list() -> Vec<String> {
    let out = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

fn owned(name: &str) -> Vec<String> {
    netns_list()
        .into_iter()
        .filter(|n| n.starts_with(&format!("{name}-")))
        .collect()
}

fn links_in_root() -> usize {
    let out = Command::new("ip")
        .args(["-o", "link", "show"])
        .output()
        .expect("ip link");
    String::from_utf8_lossy(&out.stdout).lines().count()
}

/// Brings a testbed down when dropped, so a failing test leaves nothing behind.
struct Testbed(String);

impl Testbed {
    fn up(name: &str, args: &[&str]) -> Testbed {
        let _ = fanin().args(["testbed", "down", "--name", name]).output();
        let out = fanin()
            .args(["testbed", "up", "--name", name])
            .args(args)
            .output()
            .expect("fanin testbed up");
        assert!(
            out.status.success(),
            "testbed up failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Testbed(name.to_string())
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        let _ = fanin()
            .args(["testbed", "down", "--name", &self.0])
            .output();
    }
}

fn down(name: &str) -> String {
    let out = fanin()
        .args(["testbed", "down", "--name", name])
        .output()
        .expect("fanin testbed down");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn up_then_down_leaves_no_namespaces_links_or_qdiscs() {
    if !root_or_skip("up_then_down_leaves_no_namespaces_links_or_qdiscs") {
        return;
    }
    let name = "fbt-updown";
    let links_before = links_in_root();
    let tb = Testbed::up(
        name,
        &[
            "--hosts", "3", "--rate", "50mbit", "--aux", "true", "--loss", "1",
        ],
    );
    assert_eq!(owned(name).len(), 4, "{:?}", owned(name));
    // Nothing was created in the root namespace.
    assert_eq!(links_in_root(), links_before);
    // The shaping is in place on both sides, with the loss classifier.
    let out = Command::new("tc")
        .args(["-n", &format!("{name}-sw"), "qdisc", "show", "dev", "h2"])
        .output()
        .unwrap();
    let q = String::from_utf8_lossy(&out.stdout);
    assert!(
        q.contains("htb") && q.contains("pfifo 10: parent 1:1 limit 1000p"),
        "{q}"
    );
    let out = Command::new("tc")
        .args(["-n", &format!("{name}-h2"), "filter", "show", "dev", "eth1"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("bpf"));
    let st = fanin()
        .args(["testbed", "status", "--name", name])
        .output()
        .unwrap();
    let st = String::from_utf8_lossy(&st.stdout);
    assert!(
        st.contains("192.168.1.3") && st.contains("192.168.2.3"),
        "{st}"
    );
    // A second up refuses instead of half-building.
    let again = fanin()
        .args(["testbed", "up", "--name", name])
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already up"));
    assert!(down(name).contains("removed 4 namespace"));
    assert!(owned(name).is_empty());
    assert_eq!(links_in_root(), links_before);
    // Idempotent, and it cleans what a crash left behind.
    assert!(down(name).contains("removed 0 namespace"));
    for ns in [format!("{name}-sw"), format!("{name}-h7")] {
        assert!(Command::new("ip")
            .args(["netns", "add", &ns])
            .status()
            .unwrap()
            .success());
    }
    assert!(down(name).contains("removed 2 namespace"));
    assert!(owned(name).is_empty());
    drop(tb);
    // A testbed that is not up gives a clear error.
    let st = fanin()
        .args(["testbed", "status", "--name", name])
        .output()
        .unwrap();
    assert!(!st.status.success());
    let err = String::from_utf8_lossy(&st.stderr);
    assert!(
        err.contains("is not up") && err.lines().count() == 1,
        "{err}"
    );
}

#[test]
fn shaping_is_real_iperf3_through_100_mbit() {
    if !root_or_skip("shaping_is_real_iperf3_through_100_mbit") {
        return;
    }
    let name = "fbt-shape";
    let _tb = Testbed::up(name, &["--hosts", "2", "--rate", "100mbit"]);
    let out = fanin()
        .args([
            "testbed", "iperf", "--name", name, "--from", "1", "--to", "2",
        ])
        .args(["--seconds", "3", "--repetitions", "1"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mbit: f64 = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("run   1: "))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no result in {text}"));
    // 100 Mbit/s Ethernet carries 94.1 Mbit/s of TCP payload.
    assert!(
        (90.0..=100.0).contains(&mbit),
        "iperf3 measured {mbit} Mbit/s"
    );
}

#[test]
fn run_across_namespaces_accounts_for_every_tf() {
    if !root_or_skip("run_across_namespaces_accounts_for_every_tf") {
        return;
    }
    let name = "fbt-run";
    let _tb = Testbed::up(
        name,
        &["--hosts", "4", "--rate", "100mbit", "--aux", "true"],
    );
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let exp = dir.join("exp.toml");
    std::fs::write(
        &exp,
        format!(
            r#"
name = "testbed-small"
[run]
flps = 2
epns = 2
rate_hz = 50
tfs = 150
stf_size = "20000"
[testbed]
name = "{name}"
control = "aux"
icn = 1
flps = [2, 3]
epns = [3, 4]
"#
        ),
    )
    .unwrap();
    let text = run_ok(
        fanin()
            .args(["run", exp.to_str().unwrap(), "--iperf-seconds", "1"])
            .arg("--results")
            .arg(dir.join("results")),
    );
    assert!(text.contains("on testbed fbt-run"), "{text}");
    assert!(
        text.contains("capacity reference: iperf3 h2 -> h3"),
        "{text}"
    );
    assert!(
        text.contains("issued 150 completed 150 incomplete 0 dropped 0"),
        "{text}"
    );
    assert!(text.contains("invariant ok"), "{text}");
    // The STFs really crossed the emulated switch: its data port to host 4 (EPN 1, half
    // of the TFs) sent at least 75 TFs x 2 STFs x 20000 B.
    let out = Command::new("tc")
        .args([
            "-s",
            "-j",
            "-n",
            &format!("{name}-sw"),
            "qdisc",
            "show",
            "dev",
            "h4",
        ])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let sent = v
        .as_array()
        .and_then(|a| a.iter().find(|q| q["root"].as_bool() == Some(true)))
        .and_then(|q| q["bytes"].as_u64())
        .unwrap_or(0);
    assert!(sent >= 3_000_000, "switch port h4 sent only {sent} B");
    // A placement beyond the testbed's hosts is refused with a clear error.
    std::fs::write(
        &exp,
        std::fs::read_to_string(&exp)
            .unwrap()
            .replace("epns = [3, 4]", "epns = [3, 9]"),
    )
    .unwrap();
    let out = fanin()
        .args(["run", exp.to_str().unwrap(), "--iperf-seconds", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("host 9"), "{err}");
}

#[test]
fn down_without_a_name_takes_down_what_up_made() {
    if !root_or_skip("down_without_a_name_takes_down_what_up_made") {
        return;
    }
    // A state directory of its own: other tests' testbeds are not "the one that is up".
    let state = tempfile::tempdir().unwrap();
    let tb = |args: &[&str]| {
        fanin()
            .env("FANIN_TESTBED_STATE", state.path())
            .arg("testbed")
            .args(args)
            .output()
            .unwrap()
    };
    let up = tb(&["up", "--hosts", "3"]);
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    assert_eq!(owned("fanin").len(), 4, "{:?}", owned("fanin"));
    let status = tb(&["status"]);
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let down = tb(&["down"]);
    let said = String::from_utf8_lossy(&down.stdout);
    assert!(
        down.status.success() && said.contains("testbed fanin: removed 4"),
        "{said}"
    );
    assert!(owned("fanin").is_empty(), "{:?}", owned("fanin"));
}

/// Checked once, before anything runs: a testbed needs root.
#[test]
fn a_testbed_run_without_root_says_so_before_anything_runs() {
    // Needs root to become another user (runuser).
    if !root_or_skip("a_testbed_run_without_root_says_so_before_anything_runs") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    // nobody may not reach the checkout: the binary and the file go to the open directory.
    let exe = dir.path().join("fanin");
    std::fs::copy(env!("CARGO_BIN_EXE_fanin"), &exe).unwrap();
    let exp = dir.path().join("tdr-zookeeper.toml");
    let src = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../experiments/tdr-zookeeper.toml"
    );
    std::fs::copy(src, &exp).unwrap();
    let out = std::process::Command::new("runuser")
        .args(["-u", "nobody", "--"])
        .arg(&exe)
        .arg("run")
        .arg(&exp)
        .arg("--results")
        .arg(dir.path().join("results"))
        .output()
        .expect("runuser (util-linux) runs a command as nobody");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("needs root") && err.contains("--local"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(!dir.path().join("results").exists(), "nothing written");
}

/// A partition from the ICN makes it lose the EPN (its lease runs out) and take it back
/// when healed; a reset makes it lose the FLP at once; a slow link is applied and undone;
/// every TF is accounted for, and no filter or rate is left behind.
#[test]
fn network_faults_part_reset_and_slow_real_links() {
    if !root_or_skip("network_faults_part_reset_and_slow_real_links") {
        return;
    }
    let name = "fbt-net";
    let _tb = Testbed::up(name, &["--hosts", "4", "--rate", "1gbit", "--aux", "true"]);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let exp = dir.join("exp.toml");
    std::fs::write(
        &exp,
        format!(
            r#"
name = "testbed-faults"
[run]
flps = 1
epns = 2
rate_hz = 50
tfs = 350
stf_size = "20000"
[testbed]
name = "{name}"
control = "aux"
icn = 1
flps = [2]
epns = [3, 4]
[[fault]]
node = "epn 0"
action = "partition"
at_s = 1.0
for_s = 2.5
[[fault]]
node = "epn 1"
action = "slow"
rate = "2mbit"
at_s = 1.0
for_s = 2.0
[[fault]]
node = "flp 0"
action = "reset"
at_s = 4.5
"#
        ),
    )
    .unwrap();
    let text = run_ok(
        fanin()
            .args(["run", exp.to_str().unwrap(), "--iperf-seconds", "0"])
            .arg("--results")
            .arg(dir.join("results")),
    );
    assert!(text.contains("invariant ok"), "{text}");
    let f = run_dir(&dir.join("results")).join("faults.json");
    let f: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap();
    let f = f.as_array().unwrap();
    assert_eq!(f.len(), 3, "{f:?}");
    for r in f {
        assert!(r.get("error").is_none(), "{r}");
        assert!(r["at_s"].is_number(), "not applied: {r}");
    }
    let part = &f[0];
    assert_eq!(part["action"], "partition", "{part}");
    // The default lease is 1000 ms; it was parted for 2.5 s, then back.
    let detect = part["detect_ms"].as_f64().expect("EPN 0 lost");
    assert!((500.0..2500.0).contains(&detect), "{part}");
    assert!(
        part["rejoin_ms"].is_number(),
        "EPN 0 never rejoined: {part}"
    );
    let reset = &f[2];
    assert!(reset["detect_ms"].is_number(), "FLP 0 not lost: {reset}");
    // The same faults applied by hand take effect where they should: the slow link on
    // both ends of EPN 1's link (host 4), the partition's filters on both hosts.
    use fanin_lab::testbed::netfault::{NetFault, NetFaults};
    let place = fanin_lab::experiment::Placement {
        name: name.into(),
        control: fanin_lab::experiment::ControlNet::Aux,
        icn: 1,
        flps: vec![2],
        epns: vec![3, 4],
    };
    let nf = NetFaults::new(fanin_lab::testbed::load(name).unwrap(), &place, None);
    nf.prepare().unwrap();
    let class = |ns: &str, dev: &str| {
        let out = Command::new("tc")
            .args(["-n", ns, "class", "show", "dev", dev, "classid", "1:1"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let filters = |ns: &str, dev: &str| fanin_lab::testbed::filter_prefs(ns, dev).unwrap();
    let slow = NetFault::Slow {
        rate_bps: 2_000_000,
    };
    nf.start("EPN 1", &slow)
        .unwrap()
        .expect("a slow link is healed");
    for (ns, dev) in [("h4", "eth0"), ("h4", "eth1"), ("sw", "h4"), ("sw", "ah4")] {
        let c = class(&format!("{name}-{ns}"), dev);
        assert!(c.contains("rate 2Mbit"), "{ns} {dev}: {c}");
    }
    assert!(class(&format!("{name}-h3"), "eth0").contains("rate 1Gbit"));
    let part = NetFault::Partition {
        peer: Some("EPN 0".into()),
    };
    nf.start("FLP 0", &part).unwrap();
    assert_eq!(filters(&format!("{name}-h2"), "eth1").len(), 1);
    assert_eq!(filters(&format!("{name}-h3"), "eth0").len(), 1);
    nf.heal_all();
    assert!(nf.start("FLP 0", &part).is_err(), "the run is over");
    // Healed: no filter is left on any host link, every class is back at 1 Gbit/s.
    assert!(class(&format!("{name}-sw"), "h4").contains("rate 1Gbit"));
    for h in 1..=4 {
        let ns = format!("{name}-h{h}");
        for dev in ["eth0", "eth1"] {
            assert_eq!(filters(&ns, dev), Vec::<u32>::new(), "{ns} {dev}");
            let c = class(&ns, dev);
            assert!(c.contains("rate 1Gbit"), "{ns} {dev}: {c}");
        }
    }
}

/// `fanin chaos --real --testbed`: the campaign's cases with partitions, resets, slow
/// links and session expiry on real links, on a testbed it makes and removes itself.
#[test]
fn the_real_campaign_parts_and_resets_links_on_its_testbed() {
    if !root_or_skip("the_real_campaign_parts_and_resets_links_on_its_testbed") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let args = [
        "chaos",
        "--real",
        "--testbed",
        "--first",
        "1",
        "--seeds",
        "3",
    ];
    let text = run_ok(fanin().args(args).arg("--results").arg(tmp.path()));
    assert!(
        text.contains("real seeds 3 on the testbed, violations 0"),
        "{text}"
    );
    for kind in ["partition", "reset", "slow", "expire-session"] {
        assert!(text.contains(&format!("{kind} ")), "no {kind}: {text}");
    }
    assert!(
        owned("fanin-chaos").is_empty(),
        "{:?}",
        owned("fanin-chaos")
    );
}

/// `fanin ROLE ARGS` inside testbed host `ns`, logging to `dir/log`.
fn in_host(ns: &str, dir: &std::path::Path, log: &str, args: &[&str]) -> Proc {
    let err = std::fs::File::create(dir.join(log)).unwrap();
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns, env!("CARGO_BIN_EXE_fanin")])
        .args(args)
        .env("FANIN_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(err);
    Proc::spawn(log, &mut cmd)
}

/// A node whose host dies before its run starts (cut off, then killed: the ICN gets no
/// FIN and no RST) is noticed by TCP keepalive, and its id is free again: the same FLP
/// restarted on another host registers, and the run completes. Without keepalive the
/// dead connection held FLP 0 for good (leases start only at Running).
#[test]
fn a_node_whose_host_dies_before_its_run_starts_gives_its_id_back() {
    if !root_or_skip("a_node_whose_host_dies_before_its_run_starts_gives_its_id_back") {
        return;
    }
    let name = "fbt-ka";
    let _tb = Testbed::up(name, &["--hosts", "3", "--rate", "1gbit"]);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let cfg = dir.join("run.toml");
    let run = "flps = 1\nepns = 1\nrate_hz = 50\ntfs = 100\nstf_size = \"16KiB\"\n";
    std::fs::write(&cfg, run).unwrap();
    let host = |h: u32| format!("{name}-h{h}");
    let (control, results) = ("192.168.1.1:7400", dir.join("results"));
    let (cfg, res) = (cfg.to_str().unwrap(), results.to_str().unwrap());
    let icn_args = [
        "icn",
        "--control",
        control,
        "--config",
        cfg,
        "--results-dir",
        res,
    ];
    let mut icn = in_host(&host(1), dir, "icn.log", &icn_args);
    let flp_args = ["flp", "--icn", control, "--id", "0"];
    let mut first = in_host(&host(2), dir, "flp-first.log", &flp_args);
    let registered = |n: usize| move |log: &str| log.matches("registered FLP 0").count() >= n;
    wait_for_log(dir, "icn.log", 30, registered(1));
    // Host 2 dies: its link goes down first, so the kill closes nothing the ICN sees.
    run_ok(Command::new("ip").args(["-n", &host(2), "link", "set", "eth0", "down"]));
    first.kill9();
    // FLP 0 comes back on host 3: refused while the dead connection holds its id, it
    // tries again, and registers once keepalive has closed that connection.
    let mut again = in_host(&host(3), dir, "flp-again.log", &flp_args);
    wait_for_log(dir, "icn.log", 45, registered(2));
    let data = ["--data-bind", "192.168.1.3:0"];
    let epn_args = [&["epn", "--icn", control, "--id", "0"][..], &data].concat();
    let mut epn = in_host(&host(3), dir, "epn.log", &epn_args);
    let log = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
    assert!(icn.wait(90).success(), "ICN: {}", log("icn.log"));
    assert!(again.wait(30).success(), "FLP: {}", log("flp-again.log"));
    assert!(epn.wait(30).success(), "EPN: {}", log("epn.log"));
    let summary = read_summary(&results);
    assert_eq!(summary["invariant_ok"], true, "{summary}");
    assert_eq!(summary["completed"], 100, "{summary}");
    let icn_log = log("icn.log");
    assert!(
        icn_log.contains("already registered")
            && icn_log.contains("left before the run: Connection timed out"),
        "the restarted FLP was refused while the dead connection held its id: {icn_log}"
    );
}
