//! Bad input gets a one-line error, a metric, and nothing else: garbage peers, wrong
//! versions, unknown FLP ids, bad configuration values, ports in use.

mod common;
use common::*;

use std::io::Write;
use std::net::TcpStream;

use fanin_node::auth::Secret;
use fanin_proto::{Message, Nonce, Register, RejectCode, Role, VERSION};

const BASE: &str = r#"
build_timeout_ms = 10000
drain_timeout_ms = 30000
"#;

fn send(addr: std::net::SocketAddr, bytes: &[u8]) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(bytes).unwrap();
    // Leave the socket open briefly so the node reads the bytes, then close.
    std::thread::sleep(std::time::Duration::from_millis(50));
}

/// The listener's first frame: a Challenge; its nonce.
fn read_challenge(c: &mut TcpStream) -> Nonce {
    let mut b = [0u8; 12 + 16];
    std::io::Read::read_exact(c, &mut b).expect("a Challenge frame");
    assert_eq!((&b[..4], b[5]), (&b"FNIN"[..], 20), "a Challenge frame");
    b[12..].try_into().unwrap()
}

fn frame(version: u8, msg_type: u8, body: &[u8]) -> Vec<u8> {
    let mut v = b"FNIN".to_vec();
    v.push(version);
    v.push(msg_type);
    v.extend_from_slice(&[0, 0]);
    v.extend_from_slice(&(body.len() as u32).to_le_bytes());
    v.extend_from_slice(body);
    v
}

#[test]
fn garbage_peers_are_refused_and_the_run_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut icn = start_icn(
        dir.path(),
        &format!("flps = 1\nepns = 2\nrate_hz = 50\ntfs = 350\nstf_size = \"32KiB\"\n{BASE}"),
        "127.0.0.1:0",
    );
    let data_port = free_port();
    let mut nodes = vec![
        spawn_epn(
            dir.path(),
            icn.control,
            0,
            &["--data-bind", &format!("127.0.0.1:{data_port}")],
        ),
        spawn_epn(dir.path(), icn.control, 1, &[]),
        spawn_flp(dir.path(), icn.control, 0),
    ];
    icn.wait_issued(10);
    // To the ICN: not fanin at all, a wrong version, an oversized length, a truncated frame.
    send(icn.control, b"GET / HTTP/1.0\r\n\r\n");
    send(icn.control, &frame(9, 1, &[1, 0, 0, 0, 0, 0, 0, 0]));
    send(icn.control, &frame(VERSION, 1, &[])[..8]);
    let mut huge = frame(VERSION, 1, &[]);
    huge[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    send(icn.control, &huge);
    // An FLP id the run does not have.
    let mut stranger = Proc::spawn(
        "FLP 7",
        fanin()
            .args(["flp", "--icn", &icn.control.to_string(), "--id", "7"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped()),
    );
    // To an EPN's data port: garbage, and an STF frame before any DataHello.
    send(
        format!("127.0.0.1:{data_port}").parse().unwrap(),
        &[0xAB; 64],
    );
    send(
        format!("127.0.0.1:{data_port}").parse().unwrap(),
        &frame(VERSION, 9, &[0; 33]),
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    let m = scrape(icn.metrics);
    assert!(
        metric(&m, &["fanin_protocol_errors_total", "bad_magic"]) >= 1.0,
        "{m}"
    );
    assert!(
        metric(&m, &["fanin_protocol_errors_total", "version"]) >= 1.0,
        "{m}"
    );
    assert!(
        metric(&m, &["fanin_protocol_errors_total", "oversized"]) >= 1.0,
        "{m}"
    );

    // A raw client registering an unknown FLP id (with the run's secret: none) gets a
    // Reject, then the ICN closes.
    {
        let mut c = TcpStream::connect(icn.control).unwrap();
        c.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let nonce = read_challenge(&mut c);
        let mut reg = Register {
            role: Role::Flp,
            node_id: Some(7),
            data_addr: String::new(),
            proof: [0; 32],
        };
        reg.proof = Secret::default().prove_register(&nonce, &reg);
        c.write_all(&Message::Register(reg).encode()).unwrap();
        let mut got = Vec::new();
        std::io::Read::read_to_end(&mut c, &mut got).expect("the ICN closes the connection");
        assert_eq!(&got[..4], b"FNIN");
        assert_eq!(got[5], 3, "a Reject frame");
        assert_eq!(got[12], RejectCode::UnknownId as u8);
        assert!(String::from_utf8_lossy(&got).contains("unknown FLP id 7"));
    }

    let st = stranger.wait(30);
    assert!(!st.success());
    let mut err = String::new();
    std::io::Read::read_to_string(stranger.child.stderr.as_mut().unwrap(), &mut err).unwrap();
    let last = err.lines().last().unwrap_or("");
    assert!(
        last.starts_with("error: ") && last.contains("unknown FLP id 7"),
        "{err}"
    );

    let (st, s, _) = icn.finish(60);
    assert!(st.success());
    assert_eq!(u(&s, "completed"), 350, "the run is unaffected: {s}");
    assert_eq!(s["invariant_ok"], true);
    let log = std::fs::read_to_string(dir.path().join("icn.log")).unwrap();
    assert!(log.contains("bad magic"), "{log}");
    assert!(log.contains("protocol version 9 not supported"), "{log}");
    assert!(log.contains("unknown FLP id 7"), "{log}");
    let epn_log = std::fs::read_to_string(dir.path().join("epn-0.log")).unwrap();
    assert!(epn_log.contains("bad magic"), "{epn_log}");
    assert!(epn_log.contains("expected DataHello"), "{epn_log}");
    for p in &mut nodes {
        assert!(p.wait(30).success(), "{} failed", p.name);
    }
}

/// Writes `text` to `dir/name`; its path.
fn write_in(dir: &std::path::Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

fn one_line_error(args: &[&str], must_contain: &[&str]) {
    let out = fanin().args(args).output().unwrap();
    assert!(!out.status.success(), "{args:?} should fail");
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line expected for {args:?}: {err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    for m in must_contain {
        assert!(lines[0].contains(m), "{args:?}: {err} should contain {m}");
    }
}

/// Tiny rates and huge waits once overflowed a duration: a panic, not an error.
#[test]
fn tiny_rates_and_huge_waits_are_one_line_errors() {
    one_line_error(&["run", "--rate-hz", "1e-20"], &["rate_hz"]);
    one_line_error(
        &[
            "flp",
            "--icn",
            "127.0.0.1:1",
            "--source",
            "replay:/tmp,rate=1e-20",
        ],
        &["rate"],
    );
    one_line_error(
        &["ctl", "--icn", "127.0.0.1:1", "start", "--wait-s", "1e30"],
        &["--wait-s"],
    );
}

#[test]
fn bad_configuration_values_name_their_field() {
    let dir = tempfile::tempdir().unwrap();
    let bad = [
        ("[run]\nrate_hz = -1\n", "rate_hz"),
        ("[run]\nflsp = 2\n", "flsp"),
        ("[run]\nstf_size = \"12 parsecs\"\n", "stf_size"),
        (
            "[run]\nflp_buffer = \"1KiB\"\nstf_size = \"1MiB\"\n",
            "flp_buffer",
        ),
        ("repetitions = 0\n", "repetitions"),
        ("[run\n", "line 1, column 5"),
        ("[run]\nepn_weights = [2, 0]\n", "epn_weights"),
        ("[run]\nlease_ms = 5\n", "lease_ms"),
        ("[run]\nregistry = \"zk://:1\"\n", "registry"),
        ("[run]\nzk_tick_ms = 0\n", "zk_tick_ms"),
        (
            "[run]\nleast_loaded = { when_none_ready = \"panic\" }\n",
            "when_none_ready",
        ),
        (
            "[run]\nepns = 2\n[[fault]]\nnode = \"epn 7\"\naction = \"kill\"\nat_s = 1\n",
            "epn 7",
        ),
        ("[run]\ndrain_timeout_ms = 9223372036854775807\n", "drain_timeout_ms"),
        (
            "[run]\nflps = 4\nstf_size = \"64MiB\"\nepn_buffer = \"256MiB\"\npolicy = \"least-loaded\"\nleast_loaded = { when_none_ready = \"wait\" }\n",
            "cannot take the largest TF, which would wait for good",
        ),
        (
            "[run]\n[testbed]\nname = \"pi-cluster\"\ncontrol = \"air\"\nicn = 1\nflps = [1, 2]\nepns = [3]\n",
            "air",
        ),
    ];
    for (i, (text, field)) in bad.iter().enumerate() {
        let p = write_in(dir.path(), &format!("bad{i}.toml"), text);
        one_line_error(&["run", &p], &[field]);
    }
    one_line_error(
        &["run", "/nonexistent/exp.toml"],
        &["/nonexistent/exp.toml"],
    );
}

/// Node and ICN flags name themselves in their one-line errors.
#[test]
fn bad_flags_name_themselves() {
    one_line_error(
        &["flp", "--icn", "127.0.0.1:1", "--send-buffer", "12XB"],
        &["--send-buffer"],
    );
    one_line_error(&["icn", "--rate=-3"], &["rate_hz"]);
    one_line_error(&["icn", "--policy", "fastest"], &["fastest"]);
    one_line_error(
        &["flp", "--registry", "zk://nohost/x", "--id", "0"],
        &["--registry"],
    );
    one_line_error(&["testbed", "up", "--name", "Bad Name"], &["testbed name"]);
    one_line_error(
        &["flp", "--icn", "nosuchhost.invalid:7000"],
        &["nosuchhost.invalid"],
    );
    one_line_error(&["icn", "--lease-ms", "soon"], &["--lease-ms"]);
    let flp = ["flp", "--icn", "127.0.0.1:1", "--connect-timeout", "30"];
    one_line_error(
        &[&flp[..], &["--data-bind", "192.0.2.9"]].concat(),
        &["--data-bind"],
    );
    let epn = ["epn", "--icn", "127.0.0.1:1", "--control-bind", "192.0.2.9"];
    one_line_error(&epn, &["--control-bind", "not an address of this host"]);
    one_line_error(&["icn", "--reassign", "perhaps"], &["--reassign"]);
    one_line_error(&["icn", "--run-id", "0"], &["--run-id"]);
    one_line_error(&["icn", "--registry", "zookeeper"], &["zk://"]);
    one_line_error(
        &["icn", "--results-dir", "/etc/passwd/r"],
        &["results directory /etc/passwd/r"],
    );
    one_line_error(&["icn", "--rate", "-3"], &["rate_hz"]);
    one_line_error(&["icn", "--flps", "-3"], &["--flps"]);
    one_line_error(&["icn", "--flps", "100000"], &["flps"]);
    one_line_error(&["--threads", "0", "run"], &["--threads"]);
    one_line_error(&["--threads", "100000", "run"], &["--threads"]);
    one_line_error(
        &["flp", "--icn", "127.0.0.1:1", "--connect-timeout", "1e19"],
        &["--connect-timeout"],
    );
    one_line_error(
        &[
            "epn",
            "--icn",
            "127.0.0.1:1",
            "--secret-file",
            "/nonexistent",
        ],
        &["--secret-file"],
    );
    let epn = |extra: &[&'static str]| [&["epn", "--icn", "127.0.0.1:1"], extra].concat();
    one_line_error(
        &epn(&["--sink", "mail:me"]),
        &["--sink", "unknown kind `mail`"],
    );
    one_line_error(&epn(&["--sink", "file:/tmp/x,fsync=maybe"]), &["fsync"]);
    one_line_error(&epn(&["--sink", "tap:nowhere"]), &["tap address"]);
    one_line_error(&epn(&["--sink", "plugin:/no/lib.so"]), &["/no/lib.so"]);
    one_line_error(&epn(&["--in-order", "4"]), &["--in-order", "--sink"]);
    one_line_error(
        &epn(&["--sink-stop-timeout", "0"]),
        &["--sink-stop-timeout"],
    );
    let session = ["icn", "--session", "--metrics", "127.0.0.1:0"];
    let huge = [&session[..], &["--run-id", "18446744073709551615"]].concat();
    one_line_error(&huge, &["--run-id", "too large"]);
    one_line_error(&["inspect", "/etc/passwd"], &["not a fanin TF file"]);
    one_line_error(&["trigger", "--epn", "127.0.0.1:1"], &["127.0.0.1:1"]);
}

/// The lab's commands check their flags and directories before anything runs.
#[test]
fn lab_commands_check_before_running() {
    one_line_error(
        &[
            "chaos",
            "--real",
            "--seeds",
            "3",
            "--results",
            "/etc/passwd/x",
        ],
        &["--results /etc/passwd/x", "Not a directory"],
    );
    // Checked before iperf3 runs, named by the flag.
    let bench = ["bench", "throughput", "--cases", "1x1", "--repeat", "1"];
    one_line_error(&[&bench[..], &["--seconds=-1"]].concat(), &["--seconds"]);
    // A results directory that cannot be made: refused before anything runs.
    one_line_error(
        &["run", "--results", "/etc/passwd/x", "--tfs", "10"],
        &["/etc/passwd/x", "Not a directory"],
    );
}

/// The command line's overrides meet an experiment's faults, sources and sinks at the
/// check (they met them at run time), for the rows that run only.
#[test]
fn overrides_meet_the_experiments_tables_at_the_check() {
    let dir = tempfile::tempdir().unwrap();
    let text = "[run]\nepns = 4\nregistry = \"zookeeper\"\n[[fault]]\nnode = \"epn 3\"\naction = \"kill\"\nat_s = 1\n[[fault]]\nnode = \"icn\"\naction = \"kill\"\nat_s = 1\n";
    let faulty = &write_in(dir.path(), "faulty.toml", text);
    one_line_error(&["run", faulty, "--epns", "1"], &["epn 3"]);
    one_line_error(&["--check", "run", faulty, "--epns", "1"], &["epn 3"]);
    one_line_error(&["run", faulty, "--registry", "embedded"], &["icn"]);
    // ... but only the rows that run: --only drops the others first, and --local the
    // testbed's placement.
    let exp = repo_root().join("experiments/tdr-network-baseline.toml");
    let exp = exp.to_str().unwrap();
    let ok = |args: &[&str]| run_ok(fanin().args(["--check", "run", exp]).args(args));
    ok(&["--only", "4", "--flp-buffer", "32KiB"]);
    ok(&["--local", "--epns", "2"]);
    one_line_error(&["--check", "run", exp, "--epns", "2"], &["[testbed]"]);
}

/// The simulators' values name their field, as the runtime's do.
#[test]
fn simulator_values_name_their_field() {
    let dir = tempfile::tempdir().unwrap();
    // A packet simulator's rate that is infinite (it panicked in the run).
    let text = "model = \"fabric\"\nname = \"f\"\n[fabric]\nk = 4\nhosts_per_edge = 2\nrate_max_pps = inf\n[[scenario]]\nlabel = \"a\"\npattern = \"random\"\n";
    let fabric = write_in(dir.path(), "fabric.toml", text);
    one_line_error(&["sim", &fabric], &["rate_max_pps"]);
    // The flow model takes the policies' values as the runtime does.
    let flow = |alice: &str| {
        format!("model = \"flow\"\nname = \"f\"\npolicies = [\"least-loaded\"]\n[alice]\npreset = \"alice-2016\"\nduration_s = 1\n{alice}\n[[run]]\nlabel = \"a\"\n")
    };
    for (i, (alice, field)) in [
        ("least_loaded = { max_building = 0 }", "max_building"),
        (
            "least_loaded = { headroom_percent = 4000000000 }",
            "headroom_percent",
        ),
        ("flp_gbps = 1e300", "flp_gbps"),
        ("epn_weights = [1, 0]", "epn_weights"),
    ]
    .iter()
    .enumerate()
    {
        let p = write_in(dir.path(), &format!("flow{i}.toml"), &flow(alice));
        one_line_error(&["sim", &p], &[field]);
    }
}

/// An ICN that fails in the pre-run (EPN 0's sink cannot be made) fails the run at
/// once: the other nodes are told to stop, not waited for one after another until each
/// is killed (that took two minutes).
#[test]
fn an_icn_failing_before_the_run_ends_every_node_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let text = "[run]\nflps = 2\nepns = 3\nrate_hz = 100\ntfs = 100\nprerun_timeout_s = 2\n[[sink]]\nspec = \"file:/etc/passwd/tfs\"\nepns = [0]\n";
    let exp = write_in(dir.path(), "sinkfail.toml", text);
    let results = dir.path().join("results");
    let out = fanin()
        .args(["run", &exp, "--results", results.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("/etc/passwd/tfs: Not a directory"), "{text}");
    assert!(!text.contains("did not exit"), "{text}");
}

/// A secret that went missing (`FANIN_SECRET=$(cat no-such-file)`) is not "no secret".
#[test]
fn a_blank_environment_secret_is_a_one_line_error() {
    let out = fanin()
        .args(["flp", "--icn", "127.0.0.1:1"])
        .env("FANIN_SECRET", " \n")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.lines().count() == 1, "{err}");
    assert!(err.contains("FANIN_SECRET is set but blank"), "{err}");
}

#[test]
fn host_names_are_accepted_wherever_addresses_are() {
    // localhost resolves; nothing listens on port 1, so the FLP gives up naming the ICN.
    let out = fanin()
        .args(["flp", "--icn", "localhost:1", "--connect-timeout", "0.3"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("ICN 127.0.0.1:1"), "{err}");
}

#[test]
fn port_in_use_is_a_one_line_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    one_line_error(
        &["icn", "--control", &addr],
        &["control bind", &addr, "in use"],
    );
    one_line_error(
        &["epn", "--icn", "127.0.0.1:1", "--data-bind", &addr],
        &["data bind", &addr, "in use"],
    );
}

#[test]
fn run_help_lists_the_policies() {
    let out = fanin().args(["run", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for p in fanin_sched::PolicyKind::ALL {
        assert!(help.contains(p.name()), "{} missing in:\n{help}", p.name());
    }
}

#[test]
fn a_missing_zookeeper_is_named_once_before_any_run() {
    let dir = tempfile::tempdir().unwrap();
    let exp = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../experiments/failover-ticktime.toml"
    );
    let out = fanin()
        .args(["run", exp, "--results"])
        .arg(dir.path().join("results"))
        .env("FANIN_ZK_SERVER_SH", "/nonexistent/zkServer.sh")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains("ZooKeeper") && lines[0].matches("zkServer.sh").count() == 1,
        "{err}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("[1/"), "no run started: {stdout}");
}

/// The results directory vanishing mid-run loses nothing: the ICN prints the summary on
/// stdout, names the failure and exits non-zero.
#[test]
fn a_results_directory_removed_mid_run_still_gives_the_summary() {
    let dir = tempfile::tempdir().unwrap();
    let mut icn = start_icn(
        dir.path(),
        &format!("flps = 1\nepns = 1\nrate_hz = 20\ntfs = 100\nstf_size = \"4KiB\"\n{BASE}"),
        "127.0.0.1:0",
    );
    let mut nodes = vec![
        spawn_epn(dir.path(), icn.control, 0, &[]),
        spawn_flp(dir.path(), icn.control, 0),
    ];
    // Removed 4 s before the run ends (100 TFs at 20 Hz): long before its summary.
    icn.wait_issued(10);
    std::fs::remove_dir_all(&icn.results).unwrap();
    let summary = icn
        .lines
        .by_ref()
        .map(|l| l.unwrap())
        .find_map(|l| l.strip_prefix("SUMMARY ").map(str::to_string))
        .expect("a SUMMARY line on stdout");
    let s: serde_json::Value = serde_json::from_str(&summary).unwrap();
    assert_eq!(u(&s, "issued"), 100, "{s}");
    assert_eq!(s["invariant_ok"], true, "{s}");
    assert!(
        !icn.proc.wait(30).success(),
        "the exit says the results were not written"
    );
    let log = std::fs::read_to_string(dir.path().join("icn.log")).unwrap();
    let last = log.lines().last().unwrap();
    assert!(
        last.starts_with("error: ") && last.contains("summary.json"),
        "{last}"
    );
    assert!(
        log.contains("completed=100"),
        "the counts are in the log: {log}"
    );
    for p in &mut nodes {
        assert!(p.wait(30).success(), "{} failed", p.name);
    }
}
