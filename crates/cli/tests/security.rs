//! Strangers get nothing, floods lock no one out, nodes never give up on transient
//! errors: the attacks of the security review, each against a real run that must still
//! account for every TF and give none to a stranger.

mod common;
use common::*;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use fanin_node::auth::Secret;
use fanin_proto::{Message, Nonce, Register, RejectCode, Role};

const RUN: &str = "flps = 1\nepns = 2\nrate_hz = 50\nstf_size = \"16KiB\"\nbuild_timeout_ms = 10000\ndrain_timeout_ms = 30000\n";

fn secret_file(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

/// A process that must be refused: it exits non-zero and says why.
fn refused(mut p: Proc, why: &str) {
    let st = p.wait(30);
    let mut err = String::new();
    p.child
        .stderr
        .as_mut()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(!st.success(), "{} was let in: {err}", p.name);
    let last = err.lines().last().unwrap_or("");
    assert!(last.contains(why), "{}: {err}", p.name);
}

fn stranger(name: &str, args: &[&str]) -> Proc {
    Proc::spawn(
        name,
        fanin()
            .args(args)
            .args(["--connect-timeout", "5"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped()),
    )
}

fn challenge(c: &mut TcpStream) -> Nonce {
    let mut b = [0u8; 12 + 16];
    c.read_exact(&mut b).expect("a Challenge frame");
    assert_eq!(b[5], 20, "a Challenge frame");
    b[12..].try_into().unwrap()
}

/// The frames a peer gets until the listener closes: (type, body).
fn frames_until_closed(c: &mut TcpStream) -> Vec<(u8, Vec<u8>)> {
    let mut got = Vec::new();
    let _ = c.read_to_end(&mut got);
    let mut out = Vec::new();
    let mut at = 0;
    while at + 12 <= got.len() {
        let len = u32::from_le_bytes(got[at + 8..at + 12].try_into().unwrap()) as usize;
        let end = (at + 12 + len).min(got.len());
        out.push((got[at + 5], got[at + 12..end].to_vec()));
        at = end;
    }
    out
}

/// A raw peer that holds an FLP's id but not the secret: its Register with a forged
/// proof is refused, and the reports it sends after it reach no one.
fn rogue_reports(icn: SocketAddr) {
    let mut c = TcpStream::connect(icn).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let nonce = challenge(&mut c);
    let mut reg = Register {
        role: Role::Flp,
        node_id: Some(0),
        data_addr: String::new(),
        proof: [0; 32],
    };
    reg.proof = Secret::new("a guess").prove_register(&nonce, &reg);
    c.write_all(&Message::Register(reg).encode()).unwrap();
    for epn_id in [0, 1, 0] {
        let r = Message::EpnReachable { epn_id, ok: false };
        let _ = c.write_all(&r.encode());
    }
    let frames = frames_until_closed(&mut c);
    assert_eq!(frames.len(), 1, "one Reject, nothing else: {frames:?}");
    assert_eq!(frames[0].0, 3);
    assert_eq!(frames[0].1[0], RejectCode::BadProof as u8);
}

/// A raw DataHello to an EPN with a forged proof: refused.
fn rogue_data_hello(epn: SocketAddr, run_id: u64) {
    let mut c = TcpStream::connect(epn).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let nonce = challenge(&mut c);
    let proof = Secret::default().prove_data(&nonce, run_id, 0);
    let hello = Message::DataHello {
        run_id,
        flp_id: 0,
        proof,
    };
    c.write_all(&hello.encode()).unwrap();
    let frames = frames_until_closed(&mut c);
    assert_eq!(frames.len(), 1, "{frames:?}");
    assert_eq!(
        (frames[0].0, frames[0].1[0]),
        (3, RejectCode::BadProof as u8)
    );
}

#[test]
fn strangers_squatters_impersonators_and_rogue_reports_get_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = secret_file(dir.path(), "secret", "the run's secret\n");
    let wrong = secret_file(dir.path(), "wrong", "another run's secret\n");
    let mut icn = start_icn_with(
        dir.path(),
        &format!("{RUN}tfs = 450\n"),
        "127.0.0.1:0",
        &["--secret-file", &s],
    );
    let control = icn.control.to_string();
    // A squatter takes EPN 1's id before the real EPN 1 starts: refused.
    let squatter = stranger("squatter", &["epn", "--icn", &control, "--id", "1"]);
    refused(squatter, "wrong run secret");
    let data_port = free_port();
    let data = format!("127.0.0.1:{data_port}");
    let mut nodes = vec![
        spawn_epn(
            dir.path(),
            icn.control,
            0,
            &["--secret-file", &s, "--data-bind", &data],
        ),
        spawn_epn(dir.path(), icn.control, 1, &["--secret-file", &s]),
        spawn_flp_with(dir.path(), icn.control, 0, &["--secret-file", &s]),
    ];
    icn.wait_issued(20);
    // Mid-run: an extra EPN, an impersonator of EPN 0 with another run's secret, a
    // rogue holding FLP 0's id, a forged data connection.
    let extra = stranger("extra EPN", &["epn", "--icn", &control]);
    let impostor = stranger(
        "impostor",
        &[
            "epn",
            "--icn",
            &control,
            "--id",
            "0",
            "--secret-file",
            &wrong,
        ],
    );
    refused(extra, "wrong run secret");
    refused(impostor, "wrong run secret");
    rogue_reports(icn.control);
    // The run id proves nothing (the proof is checked first): any will do.
    rogue_data_hello(data.parse().unwrap(), 1);
    let m = scrape(icn.metrics);
    assert!(
        metric(&m, &["fanin_protocol_errors_total", "bad_proof"]) >= 4.0,
        "{m}"
    );
    let (st, s, results) = icn.finish(90);
    assert!(st.success());
    assert_eq!(u(&s, "completed"), 450, "no TF lost to a stranger: {s}");
    assert_eq!(s["invariant_ok"], true);
    assert!(
        s["membership"].as_array().unwrap().is_empty(),
        "no one joined or left: {s}"
    );
    let nodes_reported: Vec<&String> = s["nodes"].as_object().unwrap().keys().collect();
    assert_eq!(
        nodes_reported,
        ["EPN 0", "EPN 1", "FLP 0"],
        "only the run's nodes"
    );
    for (_, status, _) in tf_rows(&results, 450) {
        assert_eq!(status, "complete");
    }
    for p in &mut nodes {
        assert!(p.wait(30).success(), "{} failed", p.name);
    }
}

#[test]
fn a_flood_of_idle_connections_never_keeps_a_restarting_node_out() {
    let dir = tempfile::tempdir().unwrap();
    let s = secret_file(dir.path(), "secret", "flood test\n");
    let mut icn = start_icn_with(
        dir.path(),
        "flps = 1\nepns = 1\nrate_hz = 50\ntfs = 600\nstf_size = \"16KiB\"\nbuild_timeout_ms = 10000\n",
        "127.0.0.1:0",
        &["--secret-file", &s],
    );
    let data = format!("127.0.0.1:{}", free_port());
    let secret = ["--secret-file", s.as_str()];
    let mut epn = spawn_epn(
        dir.path(),
        icn.control,
        0,
        &[secret[0], secret[1], "--data-bind", &data],
    );
    let mut flp = spawn_flp_with(dir.path(), icn.control, 0, &secret);
    icn.wait_issued(50);
    // 300 idle connections to the ICN and 300 to the EPN's data port, held open ...
    let mut flood = Vec::new();
    for _ in 0..300 {
        flood.push(TcpStream::connect(icn.control).unwrap());
        flood.push(TcpStream::connect(&data).unwrap());
    }
    // ... while the FLP crashes and comes back: it registers and connects all the same.
    flp.kill9();
    let mut flp = Proc::spawn(
        "FLP 0 restarted",
        fanin()
            .args(["flp", "--icn", &icn.control.to_string(), "--id", "0"])
            .args(secret)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("flp-0-restarted.log")).unwrap()),
    );
    let (st, summary, results) = icn.finish(90);
    drop(flood);
    assert!(st.success());
    assert!(flp.wait(30).success(), "the restarted FLP finished the run");
    assert!(epn.wait(30).success());
    assert_eq!(summary["invariant_ok"], true);
    let rows = tf_rows(&results, 600);
    assert!(rows[500..].iter().all(|r| r.1 == "complete"), "{summary}");
    let m = std::fs::read_to_string(dir.path().join("icn.log")).unwrap();
    let refusals = m.lines().filter(|l| l.contains("closing")).count();
    assert!(
        refusals <= 100,
        "refusals are logged at a bounded rate: {refusals} lines"
    );
    assert!(
        m.contains("similar lines held back"),
        "the held-back lines are counted: {m}"
    );
}

#[test]
fn a_fresh_flp_meeting_a_frozen_epn_joins_again_instead_of_giving_up() {
    let dir = tempfile::tempdir().unwrap();
    // A lease of 5 s: EPN 1 is still in the run when the restarted FLP registers, however
    // slow the machine. 1200 TFs at 50 Hz: the FLP gives up on EPN 1 10 s after its start
    // (about TF 650), long before the last 100.
    let run = format!("{RUN}tfs = 1200\nlease_ms = 5000\n");
    let mut icn = start_icn(dir.path(), &run, "127.0.0.1:0");
    let mut epns = vec![
        spawn_epn(dir.path(), icn.control, 0, &[]),
        spawn_epn(dir.path(), icn.control, 1, &[]),
    ];
    let mut flp = spawn_flp(dir.path(), icn.control, 0);
    icn.wait_issued(100);
    epns[1].signal(libc::SIGSTOP);
    flp.kill9();
    // Restarted at once: EPN 1 is still in the schedule and its port accepts, but it
    // never answers the handshake.
    let mut flp = Proc::spawn(
        "FLP 0 restarted",
        fanin()
            .args(["flp", "--icn", &icn.control.to_string(), "--id", "0"])
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("flp-0-restarted.log")).unwrap()),
    );
    // EPN 1 stays frozen until the FLP gave up on it and joined again.
    let log_path = dir.path().join("flp-0-restarted.log");
    let rejoined = (0..600).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        std::fs::read_to_string(&log_path).is_ok_and(|l| l.contains("joining again"))
    });
    assert!(rejoined, "{}", std::fs::read_to_string(&log_path).unwrap());
    epns[1].signal(libc::SIGCONT);
    let (st, s, results) = icn.finish(120);
    assert!(st.success());
    assert!(flp.wait(60).success(), "the restarted FLP finished the run");
    let log = std::fs::read_to_string(dir.path().join("flp-0-restarted.log")).unwrap();
    assert!(
        log.contains("EPN 1") && log.contains("joining again"),
        "{log}"
    );
    assert_eq!(s["invariant_ok"], true, "{s}");
    // The TFs lost are those the faults explain: while FLP 0 was gone, and EPN 1's.
    let reasons: Vec<&String> = s["dropped_by_reason"].as_object().unwrap().keys().collect();
    for r in &reasons {
        assert!(["flp_lost", "epn_lost"].contains(&r.as_str()), "{s}");
    }
    // Once it joined again, building went on: the last 100 TFs all complete.
    let rows = tf_rows(&results, 1200);
    assert!(rows[1100..].iter().all(|r| r.1 == "complete"), "{s}");
    for p in &mut epns {
        let _ = p.wait(30);
    }
}

/// An ICN of another protocol version: the node says so and ends at once, instead of
/// taking it for an ICN not up yet and trying again for its whole connect time-out.
#[test]
fn a_node_meeting_another_protocol_version_says_so_and_ends() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for c in listener.incoming() {
            let Ok(mut c) = c else { return };
            let mut frame = Message::Challenge { nonce: [7; 16] }.encode();
            frame[4] = fanin_proto::VERSION + 1;
            let _ = c.write_all(&frame);
            std::thread::sleep(Duration::from_secs(5));
        }
    });
    let icn = addr.to_string();
    let flp = Proc::spawn(
        "FLP",
        fanin()
            .args([
                "flp",
                "--icn",
                &icn,
                "--id",
                "0",
                "--connect-timeout",
                "120",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped()),
    );
    refused(flp, "same protocol version");
}
