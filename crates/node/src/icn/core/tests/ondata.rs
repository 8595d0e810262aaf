//! On-data scheduling in the ICN core: a TF scheduled when every FLP announced it, with
//! its announced size; stale TFs built incomplete or dropped; late and repeated STFs.

use fanin_proto::{Message, Reason, StfInfo, TfStatus};
use fanin_sched::policy::{LeastLoadedConfig, WhenNoneReady};
use fanin_sched::PolicyKind;

use super::{assigns, ended, epn_conn, flp_conn, to, Action, Input, Phase, RunConfig, H};
use crate::config::{OnStale, ScheduleKind};

fn on_data(flps: u32, epns: u32, tweak: impl FnOnce(&mut RunConfig)) -> H {
    H::running(flps, epns, |c| {
        c.schedule = ScheduleKind::OnData;
        c.tfs = Some(10);
        c.stf_stale_ms = 100;
        tweak(c);
    })
}

fn announce(h: &mut H, flp: u32, tfs: &[(u64, u64)]) -> Vec<Action> {
    let list = tfs
        .iter()
        .map(|&(tf_id, size)| StfInfo { tf_id, size })
        .collect();
    h.msg(flp_conn(flp), Message::StfAnnounce(list))
}

#[test]
fn nothing_is_issued_before_the_data_and_a_tf_waits_for_every_flp() {
    let mut h = on_data(2, 2, |_| {});
    assert!(assigns(&h.at(50)).is_empty(), "no timer in on-data mode");
    assert!(assigns(&announce(&mut h, 0, &[(5, 100)])).is_empty());
    let a = announce(&mut h, 1, &[(5, 200)]);
    assert_eq!(assigns(&a), [(5, 0)]);
    assert!(
        to(&a, flp_conn(0)).contains(&Message::Assign {
            tf_id: 5,
            epn_id: 0
        }),
        "the FLPs learn the EPN too"
    );
    assert_eq!(h.core.progress().0, 1);
}

#[test]
fn least_loaded_sees_the_announced_size() {
    let mut h = on_data(2, 2, |c| {
        c.policy = PolicyKind::LeastLoaded;
        c.least_loaded = LeastLoadedConfig {
            when_none_ready: WhenNoneReady::Wait,
            ..LeastLoadedConfig::default()
        };
    });
    // EPN 0 has room for 1000 bytes x 1.2 headroom, EPN 1 for less.
    let load = |free_bytes| Message::LoadReport {
        free_bytes,
        building: 0,
    };
    h.msg(epn_conn(0), load(1300));
    h.msg(epn_conn(1), load(1100));
    announce(&mut h, 0, &[(0, 500)]);
    assert_eq!(assigns(&announce(&mut h, 1, &[(0, 500)])), [(0, 0)]);
}

#[test]
fn a_stale_tf_is_built_incomplete_or_dropped_by_its_reason() {
    let mut h = on_data(2, 1, |_| {});
    announce(&mut h, 0, &[(0, 10)]);
    assert!(assigns(&h.at(99)).is_empty());
    assert_eq!(
        assigns(&h.at(100)),
        [(0, 0)],
        "incomplete: built from what exists"
    );

    let mut h = on_data(2, 1, |c| c.on_stale = OnStale::Drop);
    announce(&mut h, 0, &[(0, 10)]);
    let a = h.at(100);
    assert_eq!(ended(&a), [(0, TfStatus::Dropped, Reason::StfStale)]);
    assert!(to(&a, flp_conn(0)).contains(&Message::Release { tf_id: 0 }));
    assert_eq!(h.counter("tfs.dropped.stf_stale"), 1);
}

#[test]
fn late_and_repeated_announcements_get_assign_or_release() {
    let mut h = on_data(2, 1, |_| {});
    announce(&mut h, 0, &[(0, 10), (1, 10)]);
    announce(&mut h, 1, &[(0, 10), (1, 10)]);
    // A restarted FLP 1 announces TF 0 again: it is open, so it goes to its EPN.
    let again = announce(&mut h, 1, &[(0, 10)]);
    assert_eq!(
        to(&again, flp_conn(1)),
        [Message::Assign {
            tf_id: 0,
            epn_id: 0
        }]
    );
    h.complete(0, 0);
    // Over now: freed at once.
    let late = announce(&mut h, 1, &[(0, 10)]);
    assert_eq!(to(&late, flp_conn(1)), [Message::Release { tf_id: 0 }]);
    assert_eq!(h.counter("stfs.late"), 1);
}

#[test]
fn every_ended_tf_is_released_to_the_flps_even_without_reassign() {
    let mut h = on_data(1, 1, |c| c.reassign = false);
    announce(&mut h, 0, &[(3, 10)]);
    let a = h.complete(0, 3);
    assert!(to(&a, flp_conn(0)).contains(&Message::Release { tf_id: 3 }));
}

#[test]
fn the_run_drains_at_its_count_or_when_every_source_ended() {
    let mut h = on_data(1, 1, |c| c.tfs = Some(3));
    announce(&mut h, 0, &[(0, 1), (1, 1), (2, 1)]);
    assert_eq!(h.core.phase(), Phase::Draining);
    // Past the count: it stays with its source (a ring slot stays READY), unanswered.
    let beyond = announce(&mut h, 0, &[(3, 1)]);
    assert!(to(&beyond, flp_conn(0)).is_empty());
    assert_eq!(h.counter("stfs.not_scheduled"), 1);

    let mut h = on_data(2, 1, |c| {
        (c.tfs, c.duration_s, c.rate_hz) = (None, Some(3600.0), 0.0);
    });
    announce(&mut h, 0, &[(0, 1)]);
    let ended = |ok| Message::SourceEnded {
        ok,
        detail: "end of stdout".into(),
    };
    h.msg(flp_conn(0), ended(true));
    h.msg(flp_conn(1), ended(false));
    assert_eq!(h.core.phase(), Phase::Running, "TF 0 still waits");
    h.at(100);
    assert_eq!(h.core.phase(), Phase::Draining);
    h.complete(0, 0);
    let s = h.finish();
    assert_eq!((s.issued, s.completed), (1, 1));
}

#[test]
fn a_dead_epns_tfs_move_with_their_announced_size() {
    let mut h = on_data(1, 2, |_| {});
    announce(&mut h, 0, &[(0, 4096)]);
    let a = h.feed(Input::Closed {
        conn: epn_conn(0),
        err: None,
    });
    assert_eq!(assigns(&a), [(0, 1)]);
    h.complete(1, 0);
    let s = h.finish();
    assert_eq!((s.issued, s.completed), (1, 1));
}

#[test]
fn after_run_stop_the_flps_are_sent_nothing_more() {
    let mut h = on_data(1, 1, |c| c.tfs = Some(1));
    announce(&mut h, 0, &[(0, 1)]);
    h.complete(0, 0);
    assert_eq!(h.core.phase(), Phase::Stopping);
    // An announcement sent before the FLP read RunStop: no answer (it would be unread).
    let late = announce(&mut h, 0, &[(1, 1)]);
    assert!(to(&late, flp_conn(0)).is_empty(), "{late:?}");
}

#[test]
fn a_pause_holds_the_stale_clock_and_the_bound() {
    let mut h = on_data(2, 1, |c| c.max_inflight = 2);
    let command = |h: &mut H, cmd| {
        let now = h.now;
        h.core.command(now, cmd).unwrap();
        h.feed(Input::Timeout)
    };
    command(&mut h, crate::runctl::Command::Pause);
    announce(&mut h, 0, &[(0, 1), (1, 1), (2, 1)]);
    h.at(500);
    assert_eq!(
        h.core.progress().0,
        0,
        "nothing scheduled or stale while paused"
    );
    command(&mut h, crate::runctl::Command::Resume);
    h.at(550);
    assert_eq!(h.core.progress().0, 0, "50 ms of the 100 ms stale time ran");
    announce(&mut h, 1, &[(0, 1)]);
    assert_eq!(
        h.core.progress().0,
        1,
        "TF 0 complete (evicted by the bound: scheduled whole)"
    );
    announce(&mut h, 0, &[(3, 1)]);
    assert_eq!(
        h.core.progress().0,
        2,
        "past the bound of 2, the oldest (TF 1) goes stale"
    );
    assert_eq!(h.counter("tfs.stale.stf_stale"), 1);
}

/// An STF announced 300 ms into a pause waits `stf_stale_ms` (100 ms) of run time from
/// the resume, not from its announcement (it went stale 300 ms late).
#[test]
fn an_stf_announced_during_a_pause_counts_from_the_pause() {
    let mut h = on_data(2, 1, |_| {});
    let command = |h: &mut H, cmd| {
        let now = h.now;
        h.core.command(now, cmd).unwrap();
        h.feed(Input::Timeout)
    };
    command(&mut h, crate::runctl::Command::Pause);
    h.at(300);
    announce(&mut h, 0, &[(0, 1)]);
    h.at(500);
    command(&mut h, crate::runctl::Command::Resume);
    h.at(590);
    assert_eq!(h.core.progress().0, 0, "90 ms of its stale time ran");
    h.at(610);
    assert_eq!(h.core.progress().0, 1, "stale 100 ms after the resume");
    assert_eq!(h.counter("tfs.stale.stf_stale"), 1);
}

#[test]
fn a_run_whose_flp_is_lost_for_good_ends_once_its_stfs_could_not_come() {
    // Found by `fanin chaos`: an on-data run waited for ever for an FLP that died and
    // never came back (nothing else ends a run that has a TF count).
    let mut h = on_data(2, 1, |c| c.tfs = Some(100));
    announce(&mut h, 0, &[(0, 1)]);
    announce(&mut h, 1, &[(0, 1)]);
    h.complete(0, 0);
    h.msg(
        flp_conn(1),
        Message::SourceEnded {
            ok: true,
            detail: "made all".into(),
        },
    );
    h.now = std::time::Duration::from_millis(10);
    h.feed(Input::Closed {
        conn: flp_conn(0),
        err: Some("connection reset by peer".into()),
    });
    // It may come back with its ring within stf_stale_ms (100 ms): the run waits ...
    h.at(60);
    h.at(109);
    assert_eq!(h.core.phase(), Phase::Running);
    assert_eq!(
        h.core.stale_deadline(),
        Some(std::time::Duration::from_millis(110))
    );
    // ... then no STF can come any more: the run ends, every TF accounted.
    h.at(110);
    assert_ne!(h.core.phase(), Phase::Running);
    let s = h.finish();
    assert!(s.invariant_ok);
    assert_eq!((s.issued, s.completed), (1, 1));
    assert!(
        s.events
            .iter()
            .any(|e| e.contains("FLP 0: away for stf_stale_ms")),
        "{:?}",
        s.events
    );

    // With another FLP still making STFs, the run goes on, and the lost FLP's passed
    // deadline asks for no more wake-ups.
    let mut h = on_data(3, 1, |c| c.tfs = Some(100));
    h.feed(Input::Closed {
        conn: flp_conn(0),
        err: None,
    });
    h.at(150);
    assert_eq!(h.core.phase(), Phase::Running);
    assert_eq!(h.core.stale_deadline(), None);
    announce(&mut h, 1, &[(0, 1)]);
    assert_eq!(
        h.core.stale_deadline(),
        Some(std::time::Duration::from_millis(250))
    );
}
