//! The nodes model end to end: a plain run, determinism, zero loss through EPN kills,
//! every fault kind accounted, and a small chaos campaign.

use super::chaos::{self, Tally};
use super::check::{violations, Expect};
use super::*;

fn scenario(flps: u32, epns: u32, tfs: u64, faults: Vec<Fault>) -> Scenario {
    let run = RunConfig {
        flps,
        epns,
        rate_hz: 600.0,
        tfs: Some(tfs),
        duration_s: None,
        stf_size: "128KiB".into(),
        reassign: true,
        prerun_timeout_s: 10.0,
        ..RunConfig::default()
    };
    // 1 Gbit/s links: 128 KiB STFs take 1 ms each, so kills find TFs in flight.
    let net = NetConfig {
        latency_us: 50,
        link_gbps: 1.0,
    };
    Scenario { run, net, faults }
}

#[test]
fn a_plain_run_completes_every_tf_round_robin() {
    let o = simulate(&scenario(2, 3, 300, vec![])).unwrap();
    assert!(o.ended);
    assert_eq!(
        o.summary.completed, 300,
        "{:?}",
        o.summary.dropped_by_reason
    );
    assert!(violations(&o, Expect::ZeroLoss).is_empty());
    // Round robin over 3 EPNs: TF n at EPN n mod 3.
    for r in &o.rows {
        assert_eq!(r.epn, Some((r.tf_id % 3) as u32), "TF {}", r.tf_id);
    }
    assert_eq!(
        o.summary.nodes.len(),
        5,
        "every node's counters: {:?}",
        o.summary.nodes.keys()
    );
}

#[test]
fn the_same_scenario_gives_the_same_bytes() {
    let kill = Fault {
        at_ms: 200,
        node: Peer::Epn(1),
        kind: FaultKind::Kill {
            restart_ms: Some(300),
        },
    };
    let s = scenario(3, 4, 400, vec![kill]);
    let a = simulate(&s).unwrap();
    let b = simulate(&s).unwrap();
    assert_eq!(a.tfs_csv(), b.tfs_csv());
    let json = |o: &Outcome| serde_json::to_string(&o.summary).unwrap();
    assert_eq!(json(&a), json(&b));
    assert_eq!(a.events, b.events);
}

#[test]
fn epn_kills_with_reassignment_lose_nothing() {
    let kill = |at_ms, e, restart_ms| Fault {
        at_ms,
        node: Peer::Epn(e),
        kind: FaultKind::Kill { restart_ms },
    };
    let s = scenario(3, 4, 600, vec![kill(150, 0, None), kill(400, 2, Some(200))]);
    let o = simulate(&s).unwrap();
    assert_eq!(violations(&o, Expect::ZeroLoss), Vec::<String>::new());
    assert!(o.summary.reassigned > 0, "the kills hit TFs in flight");
    assert_eq!(o.seen.faults_injected, 2);
}

#[test]
fn a_small_campaign_keeps_every_promise() {
    let mut t = Tally::default();
    for seed in 0..40 {
        let c = chaos::case(seed);
        let (o, v) = chaos::run_case(&c).unwrap();
        t.add(seed, &o, v);
    }
    assert!(t.failed.is_empty(), "{}: {:?}", t.line(), t.failed);
    assert!(t.faults > 40, "{}", t.line());
}

/// Seeds the campaign found, each a bug fixed:
/// - 933: EPN 2's control connection reset, the EPN frozen, the ICN killed. The ICN had
///   moved EPN 2's TFs away; EPN 2 kept its run and built them too, and both copies
///   completed. A kept EPN now holds back what it builds until the new ICN's RunStart
///   (its Abandons of the other copies come first).
/// - 7606: the ICN killed as the run's last TF ended; every node had left, the standby
///   waited for them and gave the run up. A take-over now goes on with nobody.
#[test]
fn seeds_the_campaign_found_keep_every_promise() {
    let run = |seed| {
        let (o, v) = chaos::run_case(&chaos::case(seed)).unwrap();
        assert_eq!(v, Vec::<String>::new(), "seed {seed}");
        assert!(o.seen.takeovers > 0, "seed {seed}: no take-over");
        o
    };
    // The scenario is still the one that found the bug: EPN 2 kept TFs the dead ICN had
    // moved away, and told the new one it builds them.
    let o = run(933);
    let told = |l: &&String| l.starts_with("EPN 2: the run was taken over; it builds [32,");
    assert!(o.seen.log.iter().any(|l| told(&l)), "{:#?}", o.seen.log);
    let o = run(7606);
    let nobody = "0 of 4 FLPs and 0 of 2 EPNs came back; going on with them";
    assert!(
        o.summary.events.iter().any(|e| e.contains(nobody)),
        "{:?}",
        o.summary.events
    );
    assert!(o.ended && o.fatal.is_none());
}

#[test]
fn faults_read_and_write_as_toml() {
    let text = r#"
run = { flps = 2, epns = 3, tfs = 10 }
[[fault]]
at_ms = 5
node = "epn:2"
kind = "kill"
restart_ms = 100
[[fault]]
at_ms = 7
node = "flp:1"
kind = "partition"
peer = "epn:0"
ms = 30
"#;
    let s: Scenario = toml::from_str(text).unwrap();
    assert_eq!(s.faults[0].node, Peer::Epn(2));
    assert_eq!(
        s.faults[1].kind,
        FaultKind::Partition {
            peer: Some(Peer::Epn(0)),
            ms: 30
        }
    );
    let again: Scenario = toml::from_str(&toml::to_string(&s).unwrap()).unwrap();
    assert_eq!(again.faults, s.faults);
    let e = toml::from_str::<Scenario>(
        "run = {}\n[[fault]]\nat_ms = 1\nnode = \"icn:0\"\nkind = \"freeze\"\nms = 1\n",
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("expected flp:N, epn:N or icn"),
        "{e}"
    );
    s.faults[1].check(2, 3).unwrap();
    assert_eq!(
        s.faults[1].check(1, 3).unwrap_err(),
        "fault at 7 ms: no FLP 1"
    );
    assert_eq!(
        s.faults[0].check(2, 2).unwrap_err(),
        "fault at 5 ms: no EPN 2"
    );
    let e = toml::from_str::<Scenario>(
        "run = {}\n[[fault]]\nat_ms = 1\nnode = \"flp:0\"\nkind = \"freeze\"\nms = 1\nmss = 2\n",
    )
    .unwrap_err();
    assert!(e.to_string().contains("unknown field `mss`"), "{e}");
}

#[test]
fn a_broken_promise_is_found_and_shrunk_to_its_fault() {
    // Without re-assignment an EPN crash costs TFs: the zero-loss check must say so,
    // and shrinking must keep the kill and drop the harmless slow link and freeze.
    let mut s = scenario(2, 3, 400, vec![]);
    s.run.reassign = false;
    s.run.rate_hz = 900.0; // FLP uplinks 94 % busy: every EPN has TFs in flight
    s.faults = vec![
        Fault {
            at_ms: 100,
            node: Peer::Flp(0),
            kind: FaultKind::Slow {
                extra_us: 100,
                ms: 50,
            },
        },
        Fault {
            at_ms: 300,
            node: Peer::Epn(1),
            kind: FaultKind::Kill { restart_ms: None },
        },
        Fault {
            at_ms: 500,
            node: Peer::Epn(2),
            kind: FaultKind::Freeze { ms: 20 },
        },
    ];
    let c = chaos::Case {
        seed: 0,
        scenario: s,
        expect: Expect::ZeroLoss,
    };
    let (o, v) = chaos::run_case(&c).unwrap();
    assert!(
        o.summary.dropped_by_reason.contains_key("epn_lost"),
        "{:?}",
        o.summary.dropped_by_reason
    );
    assert!(v.iter().any(|l| l.starts_with("zero loss:")), "{v:?}");
    // Accounting itself held: only the zero-loss promise broke.
    assert_eq!(violations(&o, Expect::Accounted), Vec::<String>::new());
    assert_eq!(chaos::shrink(&c), vec![1]);
}

#[test]
fn zookeeper_sessions_detect_frozen_and_killed_nodes() {
    let f = |at_ms, node, kind| Fault { at_ms, node, kind };
    let mut s = scenario(
        3,
        4,
        600,
        vec![
            // Longer than the 600 ms session: its znode expires and it is re-assigned away.
            f(200, Peer::Epn(0), FaultKind::Freeze { ms: 900 }),
            // Shorter: its session survives, nothing happens.
            f(300, Peer::Epn(1), FaultKind::Freeze { ms: 200 }),
            f(500, Peer::Epn(2), FaultKind::ExpireSession),
            f(
                700,
                Peer::Epn(3),
                FaultKind::Kill {
                    restart_ms: Some(100),
                },
            ),
        ],
    );
    s.run.registry = fanin_node::config::Registry::ZooKeeper;
    s.run.zk_session_timeout_ms = 600;
    // Leases would have caught the 900 ms freeze first; with ZooKeeper they are off.
    s.run.lease_ms = 5000;
    let o = simulate(&s).unwrap();
    assert_eq!(violations(&o, Expect::ZeroLoss), Vec::<String>::new());
    let lost: Vec<&str> = o
        .summary
        .membership
        .iter()
        .filter(|m| m.kind == "lost")
        .map(|m| m.detail.as_str())
        .collect();
    assert!(lost.iter().any(|d| d.contains("znode is gone")), "{lost:?}");
    // EPN 1's short freeze and EPN 2's re-registration cost nothing.
    assert!(
        !o.summary
            .membership
            .iter()
            .any(|m| m.kind == "lost" && (m.node == "EPN 1" || m.node == "EPN 2")),
        "{:?}",
        o.summary.membership
    );
    let bad = Scenario {
        run: RunConfig {
            flps: 1,
            epns: 1,
            ..RunConfig::default()
        },
        net: NetConfig::default(),
        faults: vec![f(1, Peer::Epn(0), FaultKind::ExpireSession)],
    };
    let e = simulate(&bad).err().unwrap().to_string();
    assert!(e.contains("expire-session needs run.registry"), "{e}");
}

/// Two freezes that overlap are one silence: together longer than the session, it
/// expires, as a real ZooKeeper's does; two apart, each shorter, it does not.
#[test]
fn overlapping_freezes_that_outlast_the_session_expire_it() {
    let freeze = |at_ms, ms| Fault {
        at_ms,
        node: Peer::Epn(1),
        kind: FaultKind::Freeze { ms },
    };
    let lost = |faults| {
        let mut s = scenario(2, 3, 600, faults);
        s.run.registry = fanin_node::config::Registry::ZooKeeper;
        (s.run.zk_session_timeout_ms, s.run.lease_ms) = (600, 5000);
        let o = simulate(&s).unwrap();
        assert_eq!(violations(&o, Expect::ZeroLoss), Vec::<String>::new());
        member(&o, "EPN 1", "lost")
    };
    // Silent from 200 to 900 ms.
    let detail = lost(vec![freeze(200, 400), freeze(500, 400)]);
    assert!(detail.is_some_and(|d| d.contains("znode is gone")));
    // Silent 200-600 and 700-1100 ms.
    assert_eq!(lost(vec![freeze(200, 400), freeze(700, 400)]), None);
}

/// One fault at 100 ms into a 2 x 3 run of 667 ms (lease 300 ms, 1 Gbit/s): its outcome.
fn with(node: Peer, kind: FaultKind) -> Outcome {
    let mut s = scenario(
        2,
        3,
        400,
        vec![Fault {
            at_ms: 100,
            node,
            kind,
        }],
    );
    s.run.lease_ms = 300;
    let o = simulate(&s).unwrap();
    assert_eq!(
        violations(&o, Expect::Accounted),
        Vec::<String>::new(),
        "{kind:?}"
    );
    assert_eq!(o.seen.faults_injected, 1);
    o
}

fn member(o: &Outcome, node: &str, kind: &str) -> Option<String> {
    let m = o
        .summary
        .membership
        .iter()
        .find(|m| m.node == node && m.kind == kind)?;
    Some(m.detail.clone())
}

fn counter(o: &Outcome, node: &str, name: &str) -> u64 {
    o.summary
        .nodes
        .get(node)
        .and_then(|c| c.get(name))
        .copied()
        .unwrap_or(0)
}

#[test]
fn every_fault_kind_has_its_effect() {
    let quiet = simulate(&scenario(2, 3, 400, vec![])).unwrap();
    let base_max = quiet.summary.latency_ms.max;
    // A kill: the EPN is lost at once, its TFs re-assigned; no restart, no rejoin.
    let o = with(Peer::Epn(1), FaultKind::Kill { restart_ms: None });
    assert!(
        member(&o, "EPN 1", "lost").is_some_and(|d| d.contains("reset")),
        "{:?}",
        o.summary.membership
    );
    assert!(member(&o, "EPN 1", "rejoined").is_none());
    assert_eq!(o.summary.completed, 400);
    // A freeze longer than the lease: lost by its lease, back after the thaw.
    let o = with(Peer::Epn(1), FaultKind::Freeze { ms: 400 });
    assert!(
        member(&o, "EPN 1", "lost").is_some_and(|d| d.contains("lease")),
        "{:?}",
        o.summary.membership
    );
    assert!(member(&o, "EPN 1", "rejoined").is_some());
    // A reset control connection: the FLP is lost and joins again.
    let o = with(Peer::Flp(0), FaultKind::ResetControl);
    assert!(member(&o, "FLP 0", "lost").is_some() && member(&o, "FLP 0", "rejoined").is_some());
    // A reset data connection: the FLP's next writes to that EPN fail.
    let o = with(Peer::Flp(0), FaultKind::ResetData { epn: 1 });
    assert!(
        counter(&o, "FLP 0", "errors.send_failed") > 0,
        "{:?}",
        o.summary.nodes
    );
    // A partition from the ICN longer than the lease: lost; it joins again after.
    let o = with(
        Peer::Flp(1),
        FaultKind::Partition {
            peer: None,
            ms: 400,
        },
    );
    assert!(
        member(&o, "FLP 1", "lost").is_some_and(|d| d.contains("lease")),
        "{:?}",
        o.summary.membership
    );
    // A partition between an FLP and an EPN: STFs wait for the heal (TCP), TFs late.
    let o = with(
        Peer::Flp(0),
        FaultKind::Partition {
            peer: Some(Peer::Epn(2)),
            ms: 150,
        },
    );
    assert!(
        o.summary.latency_ms.max >= 100.0 && base_max < 10.0,
        "{} vs {base_max}",
        o.summary.latency_ms.max
    );
    // A slow link: its frames late by the extra latency.
    let o = with(
        Peer::Epn(0),
        FaultKind::Slow {
            extra_us: 80_000,
            ms: 300,
        },
    );
    assert!(
        o.summary.latency_ms.max >= 80.0 && base_max < 80.0,
        "{} vs {base_max}",
        o.summary.latency_ms.max
    );
}

#[test]
fn a_kill_ends_the_process_whatever_it_was_doing() {
    let f = |at_ms, node, kind| Fault { at_ms, node, kind };
    // Killed while frozen and restarted: the new process is not frozen.
    let mut s = scenario(
        2,
        3,
        600,
        vec![
            f(100, Peer::Epn(1), FaultKind::Freeze { ms: 3000 }),
            f(
                150,
                Peer::Epn(1),
                FaultKind::Kill {
                    restart_ms: Some(50),
                },
            ),
        ],
    );
    s.run.lease_ms = 300;
    let o = simulate(&s).unwrap();
    let back = o
        .summary
        .membership
        .iter()
        .find(|m| m.node == "EPN 1" && m.kind == "rejoined");
    assert!(
        back.is_some_and(|m| m.t_s < 0.5),
        "{:?}",
        o.summary.membership
    );
    // Killed between incarnations (waiting to join again) with no restart: gone for good.
    let s = scenario(
        2,
        3,
        600,
        vec![
            f(100, Peer::Flp(1), FaultKind::ResetControl),
            f(150, Peer::Flp(1), FaultKind::Kill { restart_ms: None }),
        ],
    );
    let o = simulate(&s).unwrap();
    assert!(
        !o.summary
            .membership
            .iter()
            .any(|m| m.node == "FLP 1" && m.kind == "rejoined"),
        "{:?}",
        o.summary.membership
    );
    assert!(o
        .summary
        .dropped_by_reason
        .get("flp_lost")
        .is_some_and(|&n| n > 0));
    assert_eq!(violations(&o, Expect::Accounted), Vec::<String>::new());
}

#[test]
fn on_data_runs_schedule_what_the_sources_made() {
    use fanin_node::config::ScheduleKind;
    let kill = |at_ms, e| Fault {
        at_ms,
        node: Peer::Epn(e),
        kind: FaultKind::Kill {
            restart_ms: Some(200),
        },
    };
    // 154 ms: EPN 0 is building a TF then.
    let mut s = scenario(3, 4, 600, vec![kill(154, 0), kill(400, 2)]);
    s.run.schedule = ScheduleKind::OnData;
    s.run.stf_size = "random(96KiB,0.4)".into();
    let o = simulate(&s).unwrap();
    assert_eq!(violations(&o, Expect::ZeroLoss), Vec::<String>::new());
    assert!(o.summary.reassigned > 0, "the kill hit TFs in flight");
    // Every FLP made and announced every STF; the ICN placed them by their sizes.
    for f in 0..3 {
        assert_eq!(
            counter(&o, &format!("FLP {f}"), "stfs.produced"),
            600,
            "{:?}",
            o.summary.nodes
        );
    }
    // An FLP frozen past the stale time: its STFs come late, the TFs go stale. Built
    // from what exists (`incomplete`), the late STFs still complete them within the
    // build time-out; with `drop` they end as `stf_stale`.
    let freeze = Fault {
        at_ms: 300,
        node: Peer::Flp(0),
        kind: FaultKind::Freeze { ms: 1500 },
    };
    let mut s = scenario(2, 3, 600, vec![freeze]);
    s.run.schedule = ScheduleKind::OnData;
    s.run.lease_ms = 5000;
    let o = simulate(&s).unwrap();
    assert_eq!(violations(&o, Expect::ZeroLoss), Vec::<String>::new());
    assert!(
        counter(&o, "FLP 0", "stfs.not_held") > 0,
        "assigned before it made them"
    );
    s.run.on_stale = fanin_node::config::OnStale::Drop;
    let o = simulate(&s).unwrap();
    assert_eq!(violations(&o, Expect::Accounted), Vec::<String>::new());
    let stale = o
        .summary
        .dropped_by_reason
        .get("stf_stale")
        .copied()
        .unwrap_or(0);
    assert!(stale > 100, "{:?}", o.summary.dropped_by_reason);
}

#[test]
fn a_frozen_epn_backs_up_the_flps_queues_to_it() {
    // It reads nothing: the FLPs' writes to it wait, their buffers fill, and what does
    // not fit is dropped with its reason (not absorbed by an endless network).
    let freeze = Fault {
        at_ms: 100,
        node: Peer::Epn(1),
        kind: FaultKind::Freeze { ms: 400 },
    };
    let mut s = scenario(2, 3, 600, vec![freeze]);
    s.run.lease_ms = 5000; // not lost: only frozen
    s.run.reassign = false;
    s.run.flp_buffer = fanin_node::config::ByteSize(1 << 20);
    let o = simulate(&s).unwrap();
    assert_eq!(violations(&o, Expect::Accounted), Vec::<String>::new());
    let full: u64 = o
        .summary
        .dropped_by_reason
        .iter()
        .filter(|(r, _)| r.starts_with("flp_"))
        .map(|(_, n)| n)
        .sum();
    assert!(full > 0, "{:?}", o.summary.dropped_by_reason);
    assert!(member(&o, "EPN 1", "lost").is_none());
}

#[test]
fn writes_blocked_on_a_frozen_epn_fail_when_it_is_killed() {
    // Found by the long campaign (seed 1002939): writes waiting for a frozen EPN were
    // lost with it when it was killed, and the FLPs' buffers never emptied.
    let f = |at_ms, kind| Fault {
        at_ms,
        node: Peer::Epn(1),
        kind,
    };
    let mut s = scenario(
        2,
        3,
        600,
        vec![
            f(100, FaultKind::Freeze { ms: 2000 }),
            f(
                200,
                FaultKind::Kill {
                    restart_ms: Some(100),
                },
            ),
        ],
    );
    s.run.flp_buffer = fanin_node::config::ByteSize(1 << 20);
    s.run.schedule = fanin_node::config::ScheduleKind::OnData;
    let o = simulate(&s).unwrap();
    assert_eq!(violations(&o, Expect::Accounted), Vec::<String>::new());
    assert!(
        counter(&o, "FLP 0", "errors.send_failed") > 0,
        "{:?}",
        o.summary.nodes
    );
}

/// A 3 x 4 run with ZooKeeper (600 ms sessions) and re-assignment, with `faults`.
fn with_zookeeper(faults: Vec<Fault>) -> Outcome {
    let mut s = scenario(3, 4, 900, faults);
    s.run.registry = fanin_node::config::Registry::ZooKeeper;
    s.run.zk_session_timeout_ms = 600;
    s.run.lease_ms = 5000;
    simulate(&s).unwrap()
}

#[test]
fn the_standby_takes_the_run_over_twice_and_loses_nothing() {
    let kill = |at_ms| Fault {
        at_ms,
        node: Peer::Icn,
        kind: FaultKind::Kill { restart_ms: None },
    };
    let o = with_zookeeper(vec![kill(300), kill(1200)]);
    assert_eq!(violations(&o, Expect::ZeroLoss), Vec::<String>::new());
    let took: Vec<&String> = o
        .summary
        .events
        .iter()
        .filter(|n| n.contains("take-over:"))
        .collect();
    assert_eq!(
        took.len(),
        1,
        "the last ICN's events: {:?}",
        o.summary.events
    );
    assert!(
        o.seen
            .log
            .iter()
            .filter(|l| l.contains("the standby takes the run over"))
            .count()
            == 2,
        "{:?}",
        o.seen.log
    );
    assert_eq!(o.summary.issued, 900);
}

#[test]
fn a_frozen_icn_is_fenced_when_it_thaws() {
    let freeze = |at_ms, ms| Fault {
        at_ms,
        node: Peer::Icn,
        kind: FaultKind::Freeze { ms },
    };
    // Shorter than its session: it goes on as if nothing happened.
    let o = with_zookeeper(vec![freeze(300, 200)]);
    assert_eq!(violations(&o, Expect::ZeroLoss), Vec::<String>::new());
    assert!(
        !o.seen.log.iter().any(|l| l.contains("standby")),
        "{:?}",
        o.seen.log
    );
    // Longer: the standby takes over; the thawed ICN says nothing more.
    let o = with_zookeeper(vec![freeze(300, 1500)]);
    assert_eq!(violations(&o, Expect::ZeroLoss), Vec::<String>::new());
    assert!(
        o.seen
            .log
            .iter()
            .any(|l| l.contains("ICN 0: lost leadership")),
        "{:?}",
        o.seen.log
    );
}
