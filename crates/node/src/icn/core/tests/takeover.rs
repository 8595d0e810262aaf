//! The take-over in the ICN core: the failed ICN's rows counted, the returning nodes'
//! STFs, TFs in building and unreleased reports turned into one ledger, issuing on.

use fanin_proto::{HeldStf, Message, Reason, Role, TfReport, TfStatus};

use super::{assigns, ended, epn_conn, flp_conn, ready, to, Action, Phase, H, MS};
use crate::icn::core::Takeover;
use crate::icn::ledger::TfRow;

/// The rows of TFs 0..10, completed before the ICN failed 20 ms into the run.
fn earlier() -> Takeover {
    let rows = (0..10)
        .map(|tf| TfRow {
            tf_id: tf,
            epn: Some((tf % 3) as u32),
            issued_us: tf * 1000,
            ended_us: tf * 1000 + 500,
            status: TfStatus::Complete,
            reason: Reason::None,
        })
        .collect();
    Takeover {
        epoch: 0,
        elapsed: 20 * MS,
        rows,
    }
}

fn held(tf_id: u64, epn: u32) -> HeldStf {
    HeldStf {
        tf_id,
        size: 1024,
        epn: Some(epn),
    }
}

fn releases(actions: &[Action], conn: u64) -> Vec<u64> {
    to(actions, conn)
        .into_iter()
        .filter_map(|m| match m {
            Message::Release { tf_id } => Some(tf_id),
            _ => None,
        })
        .collect()
}

#[test]
fn a_take_over_ends_every_tf_in_flight_once_and_issues_on_after_the_highest_id() {
    take_over(true);
}

#[test]
fn without_reassignment_ids_nobody_holds_are_dropped_icn_lost() {
    take_over(false);
}

/// EPN 2 dies with the ICN; TFs 10..16 were in flight, 14 and 15 held by nobody.
fn take_over(reassign: bool) {
    let cfg = super::config(2, 3, |c| c.reassign = reassign);
    let mut h = H::make(cfg, 0, None, false, Some(earlier()));
    // EPN 2 died with the ICN; the others come back and say what they hold.
    for e in 0..2 {
        let a = h.register(epn_conn(e), Role::Epn, Some(e));
        assert!(to(&a, epn_conn(e)).contains(&Message::RegisterAck {
            node_id: e,
            run_id: 7,
            resume: true
        }));
    }
    for f in 0..2 {
        h.register(flp_conn(f), Role::Flp, Some(f));
        let list = vec![
            held(10, 0),
            held(11, 1),
            held(12, 2),
            held(13, 0),
            held(16, 1),
        ];
        h.msg(flp_conn(f), Message::StfsHeld(list));
    }
    let tfs_held = |building, done| Message::TfsHeld {
        building,
        reports: vec![TfReport::complete(done, 2, 2048)],
    };
    // A complete report ends its TF at once (this ICN may fail before the run goes on).
    let a = h.msg(epn_conn(0), tfs_held(vec![10], 13));
    assert_eq!(ended(&a), [(13, TfStatus::Complete, Reason::None)]);
    let row = a.iter().find_map(|x| match x {
        Action::TfEnded(r) => Some(r.clone()),
        _ => None,
    });
    assert_eq!(
        row.map(|r| r.ended_us),
        Some(h.now.as_micros() as u64),
        "on the run's clock"
    );
    // The EPN reads nothing but its parameters in its pre-run: released at the start.
    assert_eq!(releases(&a, epn_conn(0)), [] as [u64; 0]);
    let a = h.msg(epn_conn(1), tfs_held(vec![11], 16));
    assert_eq!(ended(&a), [(16, TfStatus::Complete, Reason::None)]);
    // EPN 2 never returns: after the pre-run time-out the run goes on without it.
    assert_eq!(h.core.phase(), Phase::Registering);
    h.at(5_100);
    assert_eq!(h.core.phase(), Phase::Preparing);
    for e in 0..2 {
        h.msg(epn_conn(e), ready(Role::Epn, e, 0));
    }
    h.msg(flp_conn(0), ready(Role::Flp, 0, 2));
    let a = h.msg(flp_conn(1), ready(Role::Flp, 1, 2));
    assert_eq!(h.core.phase(), Phase::Running);
    // 14 and 15, which nobody holds: timer STFs are made at the Assign, so with
    // re-assignment they are placed again; without, they are lost with the ICN.
    let mut e = ended(&a);
    e.sort_by_key(|x| x.0);
    let lost = [
        (14, TfStatus::Dropped, Reason::IcnLost),
        (15, TfStatus::Dropped, Reason::IcnLost),
    ];
    assert_eq!(e, if reassign { &[][..] } else { &lost[..] });
    assert_eq!(
        releases(&a, flp_conn(0)),
        [13, 16],
        "the FLPs free what ended"
    );
    assert_eq!(
        releases(&a, epn_conn(0)),
        [13],
        "EPN 0 may forget its report"
    );
    // In building: stays with its EPN; queued for the dead EPN 2: placed again.
    let placed = assigns(&a);
    assert!(
        placed.contains(&(10, 0)) && placed.contains(&(11, 1)),
        "{placed:?}"
    );
    let twelve: Vec<_> = placed.iter().filter(|p| p.0 == 12).collect();
    assert!(twelve.len() == 1 && twelve[0].1 != 2, "{placed:?}");
    // Issuing goes on after the highest id known, without a burst of overdue TFs.
    let first_new = placed.iter().map(|p| p.0).filter(|&tf| tf > 16).min();
    assert_eq!(first_new, Some(17), "{placed:?}");
    assert!(
        placed.iter().filter(|p| p.0 > 16).count() <= 2,
        "{placed:?}"
    );
    // The rest of the run: every TF built where it went.
    let t = h.now.as_millis() as u64;
    h.at(t + 200);
    let mut done = std::collections::BTreeSet::new();
    for (tf, epn) in assigns(&h.log.clone()) {
        if done.insert(tf) {
            h.complete(epn, tf);
        }
    }
    h.at(t + 300);
    assert_eq!(h.core.phase(), Phase::Stopping);
    let s = h.finish();
    if reassign {
        assert_eq!((s.issued, s.completed), (100, 100), "{s:?}");
        assert!(placed.iter().any(|p| p.0 == 14) && placed.iter().any(|p| p.0 == 15));
        assert_eq!(s.reassigned, 3, "12, 14, 15");
    } else {
        assert_eq!((s.issued, s.completed), (100, 98), "{s:?}");
        assert_eq!(s.dropped_by_reason.get("icn_lost"), Some(&2));
    }
}

#[test]
fn rows_read_back_as_written() {
    let t = earlier();
    for r in &t.rows {
        let line = crate::icn::summary::TfCsv::line(r);
        assert_eq!(TfRow::parse(&line).as_ref(), Some(r), "{line}");
    }
    assert_eq!(TfRow::parse("3,1,0.1,0.2,100.0,complete,no"), None);
    assert_eq!(TfRow::parse("3,1,0.1,0.2,100.0,compl"), None);
}

#[test]
fn on_data_a_take_over_keeps_what_was_assigned_and_gathers_the_rest_again() {
    on_data_take_over(0, 0);
}

/// On-data, TF ids are the sources': a second run on the same registry path (its
/// `id_base` past the first run's ids) or a source counting from far past `tfs` keeps
/// every row and every held STF.
#[test]
fn on_data_a_take_over_keeps_the_sources_ids_whatever_the_id_base() {
    on_data_take_over(1 << 20, 0);
    on_data_take_over(0, 5_000_000_000);
}

/// TFs `off + 0 ..` of an on-data run whose ICN has `id_base`.
fn on_data_take_over(id_base: u64, off: u64) {
    let cfg = super::config(2, 2, |c| {
        c.schedule = crate::config::ScheduleKind::OnData;
        c.tfs = Some(10);
        c.stf_stale_ms = 100;
    });
    let mut t = earlier();
    t.rows.truncate(2); // TFs 0 and 1 ended
    for r in &mut t.rows {
        r.tf_id += off;
    }
    let mut h = H::make(cfg, id_base, None, false, Some(t));
    for e in 0..2 {
        h.register(epn_conn(e), Role::Epn, Some(e));
    }
    let unsent = |tf_id| HeldStf {
        tf_id,
        size: 100,
        epn: None,
    };
    for f in 0..2 {
        h.register(flp_conn(f), Role::Flp, Some(f));
    }
    // FLP 0 still holds TF 1 (its Release died with the ICN); TF 2 went to EPN 1; TF 3
    // was produced by both and never scheduled.
    h.msg(
        flp_conn(0),
        Message::StfsHeld(vec![held(off + 1, 0), held(off + 2, 1), unsent(off + 3)]),
    );
    h.msg(
        flp_conn(1),
        Message::StfsHeld(vec![held(off + 2, 1), unsent(off + 3)]),
    );
    let none = Message::TfsHeld {
        building: vec![],
        reports: vec![],
    };
    h.msg(epn_conn(0), none);
    let building = Message::TfsHeld {
        building: vec![off + 2],
        reports: vec![],
    };
    h.msg(epn_conn(1), building);
    for e in 0..2 {
        h.msg(epn_conn(e), ready(Role::Epn, e, 0));
    }
    h.msg(flp_conn(0), ready(Role::Flp, 0, 2));
    let a = h.msg(flp_conn(1), ready(Role::Flp, 1, 2));
    assert_eq!(h.core.phase(), Phase::Running);
    assert!(
        releases(&a, flp_conn(0)).contains(&(off + 1)),
        "the ended TF is freed"
    );
    let placed = assigns(&a);
    assert!(placed.contains(&(off + 2, 1)), "{placed:?}");
    assert!(
        placed.iter().any(|p| p.0 == off + 3),
        "gathered again: {placed:?}"
    );
    // A late announcement of a TF that ended before the take-over is not scheduled.
    let late = h.msg(
        flp_conn(1),
        Message::StfAnnounce(vec![fanin_proto::StfInfo {
            tf_id: off,
            size: 100,
        }]),
    );
    assert!(assigns(&late).is_empty(), "{late:?}");
    assert!(ended(&late).is_empty(), "{late:?}");
}

/// A take-over of a run of 1 FLP and 2 EPNs, both back: the failed ICN had moved TF 10
/// from EPN 0 (counted lost, but it kept its run) to EPN 1, where the FLP queued it last.
fn moved_tf_take_over() -> H {
    let cfg = super::config(1, 2, |_| {});
    let mut h = H::make(cfg, 0, None, false, Some(earlier()));
    for e in 0..2 {
        h.register(epn_conn(e), Role::Epn, Some(e));
    }
    h.register(flp_conn(0), Role::Flp, Some(0));
    h.msg(flp_conn(0), Message::StfsHeld(vec![held(10, 1)]));
    h
}

#[test]
fn a_tf_building_at_two_epns_goes_on_where_the_flps_sent_it_and_the_other_drops_it() {
    let mut h = moved_tf_take_over();
    // Both EPNs build it.
    for e in 0..2 {
        let building = Message::TfsHeld {
            building: vec![10],
            reports: vec![],
        };
        h.msg(epn_conn(e), building);
    }
    for e in 0..2 {
        h.msg(epn_conn(e), ready(Role::Epn, e, 0));
    }
    let a = h.msg(flp_conn(0), ready(Role::Flp, 0, 2));
    assert_eq!(h.core.phase(), Phase::Running);
    assert!(assigns(&a).contains(&(10, 1)), "{:?}", assigns(&a));
    let abandon = Message::Abandon {
        tf_id: 10,
        reason: Reason::EpnLost,
    };
    assert!(to(&a, epn_conn(0)).contains(&abandon), "{a:?}");
    assert!(!to(&a, epn_conn(1)).contains(&abandon), "{a:?}");
}

/// The failed ICN had moved TF 10 from EPN 0 (counted lost, but it kept its run and an
/// incomplete report of it) to EPN 1, which builds it: the old verdict yields, in either
/// order of the EPNs' words, and TF 10 completes at EPN 1.
#[test]
fn a_stale_incomplete_report_yields_to_the_epn_the_tf_was_moved_to() {
    for reporter_first in [true, false] {
        let mut h = moved_tf_take_over();
        let stale = TfReport {
            tf_id: 10,
            status: TfStatus::Incomplete,
            reason: Reason::BuildTimeout,
            stfs: 0,
            bytes: 0,
        };
        let mut words = vec![
            (
                0,
                Message::TfsHeld {
                    building: vec![],
                    reports: vec![stale],
                },
            ),
            (
                1,
                Message::TfsHeld {
                    building: vec![10],
                    reports: vec![],
                },
            ),
        ];
        if !reporter_first {
            words.reverse();
        }
        for (e, m) in words {
            assert!(ended(&h.msg(epn_conn(e), m)).is_empty());
        }
        for e in 0..2 {
            h.msg(epn_conn(e), ready(Role::Epn, e, 0));
        }
        let a = h.msg(flp_conn(0), ready(Role::Flp, 0, 2));
        assert_eq!(h.core.phase(), Phase::Running);
        assert!(ended(&a).iter().all(|x| x.0 != 10), "{a:?}");
        assert!(assigns(&a).contains(&(10, 1)), "{a:?}");
        let abandon = Message::Abandon {
            tf_id: 10,
            reason: Reason::EpnLost,
        };
        assert!(!to(&a, epn_conn(1)).contains(&abandon), "{a:?}");
        assert_eq!(
            releases(&a, epn_conn(0)),
            [10],
            "EPN 0 may forget its report"
        );
        let done = ended(&h.complete(1, 10));
        assert_eq!(done, [(10, TfStatus::Complete, Reason::None)]);
    }
}

/// A take-over's pre-run runs out while FLP 1 is not ready (still connecting to an EPN,
/// say): the run goes on without it, as if it had left, instead of being given up with
/// its TFs in flight counted nowhere.
#[test]
fn a_node_not_ready_by_the_take_overs_deadline_is_dropped_and_the_run_goes_on() {
    let cfg = super::config(2, 2, |_| {});
    let mut h = H::make(cfg, 0, None, false, Some(earlier()));
    for e in 0..2 {
        h.register(epn_conn(e), Role::Epn, Some(e));
        let held = Message::TfsHeld {
            building: vec![],
            reports: vec![],
        };
        h.msg(epn_conn(e), held);
    }
    for f in 0..2 {
        h.register(flp_conn(f), Role::Flp, Some(f));
        h.msg(flp_conn(f), Message::StfsHeld(vec![held(10, 0)]));
    }
    assert_eq!(h.core.phase(), Phase::Preparing, "all came back");
    for e in 0..2 {
        h.msg(epn_conn(e), ready(Role::Epn, e, 0));
    }
    h.msg(flp_conn(0), ready(Role::Flp, 0, 2));
    let a = h.at(60_000);
    assert_eq!(h.core.fatal(), None);
    assert_eq!(h.core.phase(), Phase::Running);
    assert!(a.contains(&Action::Close { conn: flp_conn(1) }), "{a:?}");
}

/// The failed ICN died in its pre-run (no start noted, no rows): the run starts when
/// its nodes are ready, as a fresh one does. The take-over's gathering (2 s here) is no
/// pause, or the summary would take it off the issuing span and call the run invalid.
#[test]
fn a_run_whose_icn_died_in_its_prerun_starts_fresh_at_the_take_over() {
    let t = Takeover {
        epoch: 0,
        elapsed: std::time::Duration::ZERO,
        rows: vec![],
    };
    let mut h = H::make(super::config(1, 1, |_| {}), 0, None, false, Some(t));
    h.register(epn_conn(0), Role::Epn, Some(0));
    let held = Message::TfsHeld {
        building: vec![],
        reports: vec![],
    };
    h.msg(epn_conn(0), held);
    h.register(flp_conn(0), Role::Flp, Some(0));
    h.msg(flp_conn(0), Message::StfsHeld(vec![]));
    h.now = 2000 * MS;
    h.msg(epn_conn(0), ready(Role::Epn, 0, 0));
    let a = h.msg(flp_conn(0), ready(Role::Flp, 0, 1));
    assert!(a.contains(&Action::RunStarted { resumed: false }), "{a:?}");
    assert!(to(&a, flp_conn(0)).contains(&Message::RunStart {
        run_id: 7,
        elapsed_us: 0
    }));
    for ms in 2001..2110 {
        h.at(ms);
    }
    for (tf, epn) in assigns(&h.log.clone()) {
        h.complete(epn, tf);
    }
    h.at(2200);
    let s = h.finish();
    assert_eq!((s.issued, s.completed), (100, 100), "{s:?}");
    assert_eq!(s.paused_s, 0.0);
    assert!(s.valid, "{s:?}");
}
