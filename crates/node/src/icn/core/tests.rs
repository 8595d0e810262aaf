//! The ICN core event by event, with explicit time: registration, the pre-run, issuing,
//! reports, leases, rejoins, EPN and FLP loss, waits, drain and stop, every drop reason.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use fanin_proto::{Message, NodeStats, Reason, Register, RejectCode, Role, TfReport, TfStatus};
use fanin_sched::policy::{LeastLoadedConfig, WhenNoneReady};
use fanin_sched::PolicyKind;

use super::{Action, ConnId, CoreConfig, IcnCore, Input, Phase};
use crate::config::RunConfig;
use crate::icn::summary::Summary;
use crate::metrics::Metrics;
use crate::registry::{Membership, Registered};

mod control;
mod ondata;
mod pull;
mod takeover;

const MS: Duration = Duration::from_millis(1);

fn epn_conn(id: u32) -> ConnId {
    1 + id as ConnId
}
fn flp_conn(id: u32) -> ConnId {
    101 + id as ConnId
}
fn peer_addr(conn: ConnId) -> SocketAddr {
    format!("127.0.0.1:{}", 10_000 + conn).parse().unwrap()
}

/// One ICN core, its clock and everything it asked for.
struct H {
    core: IcnCore,
    now: Duration,
    metrics: Arc<Metrics>,
    /// Every action so far.
    log: Vec<Action>,
}

/// A run of `flps` x `epns` at 1000 Hz (TF n due n ms after the start), 100 TFs.
fn config(flps: u32, epns: u32, tweak: impl FnOnce(&mut RunConfig)) -> RunConfig {
    let mut cfg = RunConfig {
        flps,
        epns,
        rate_hz: 1000.0,
        tfs: Some(100),
        duration_s: None,
        stf_size: "1KiB".into(),
        prerun_timeout_s: 5.0,
        ..RunConfig::default()
    };
    tweak(&mut cfg);
    cfg
}

impl H {
    fn new(cfg: RunConfig) -> H {
        H::with_base(cfg, 0, None)
    }

    fn with_base(cfg: RunConfig, id_base: u64, members: Option<Membership>) -> H {
        H::build(cfg, id_base, members, false)
    }

    /// A run held for run control's START.
    fn held(cfg: RunConfig) -> H {
        H::build(cfg, 0, None, true)
    }

    fn build(cfg: RunConfig, id_base: u64, members: Option<Membership>, hold: bool) -> H {
        H::make(cfg, id_base, members, hold, None)
    }

    fn make(
        cfg: RunConfig,
        id_base: u64,
        members: Option<Membership>,
        hold: bool,
        takeover: Option<super::Takeover>,
    ) -> H {
        let metrics = Metrics::new("icn", None);
        // A take-over goes on with the run's time axis.
        let now = takeover.as_ref().map_or(Duration::ZERO, |t| t.elapsed);
        let core = IcnCore::new(
            CoreConfig {
                run: cfg.check().expect("valid test config"),
                run_id: 7,
                id_base,
                registry_members: members,
                stopwatch_ns: || 0,
                hold_start: hold,
                takeover,
            },
            metrics.clone(),
            now,
        );
        H {
            core,
            now,
            metrics,
            log: Vec::new(),
        }
    }

    /// A run with every node registered and ready, started at t = 0.
    fn running(flps: u32, epns: u32, tweak: impl FnOnce(&mut RunConfig)) -> H {
        let mut h = H::new(config(flps, epns, tweak));
        for e in 0..epns {
            h.register(epn_conn(e), Role::Epn, Some(e));
        }
        for f in 0..flps {
            h.register(flp_conn(f), Role::Flp, Some(f));
        }
        assert_eq!(h.core.phase(), Phase::Preparing);
        for e in 0..epns {
            h.msg(epn_conn(e), ready(Role::Epn, e, 0));
        }
        for f in 0..flps {
            h.msg(flp_conn(f), ready(Role::Flp, f, epns));
        }
        assert!(matches!(h.core.phase(), Phase::Running | Phase::Draining));
        h
    }

    /// Feeds one input at the current time; returns the actions it caused.
    fn feed(&mut self, input: Input) -> Vec<Action> {
        self.core.handle(self.now, input);
        let mut out = Vec::new();
        while let Some(a) = self.core.poll_action() {
            out.push(a);
        }
        self.log.extend(out.iter().cloned());
        out
    }

    fn register(&mut self, conn: ConnId, role: Role, id: Option<u32>) -> Vec<Action> {
        let data_addr = match role {
            Role::Epn => format!("127.0.0.1:{}", 20_000 + conn),
            Role::Flp => String::new(),
        };
        let reg = Register {
            role,
            node_id: id,
            data_addr,
            proof: [0; 32],
        };
        self.feed(Input::Registered {
            conn,
            peer: peer_addr(conn),
            reg,
        })
    }

    fn msg(&mut self, conn: ConnId, msg: Message) -> Vec<Action> {
        self.feed(Input::Msg { conn, msg })
    }

    /// Moves the clock to `ms` after the start and feeds the wake-up.
    fn at(&mut self, ms: u64) -> Vec<Action> {
        self.now = self.now.max(Duration::from_millis(ms));
        self.feed(Input::Timeout)
    }

    fn report(&mut self, epn: u32, tf: u64, status: TfStatus, reason: Reason) -> Vec<Action> {
        let r = TfReport {
            tf_id: tf,
            status,
            reason,
            stfs: 1,
            bytes: 1024,
        };
        self.msg(epn_conn(epn), Message::TfReport(r))
    }

    fn complete(&mut self, epn: u32, tf: u64) -> Vec<Action> {
        self.report(epn, tf, TfStatus::Complete, Reason::None)
    }

    fn stats(&mut self, conn: ConnId, role: Role, id: u32) -> Vec<Action> {
        let s = NodeStats {
            role,
            node_id: id,
            counters: vec![("stfs.sent".into(), 3)],
        };
        self.msg(conn, Message::NodeStats(s))
    }

    fn finish(&mut self) -> Summary {
        let s = self.core.finish(self.now);
        while let Some(a) = self.core.poll_action() {
            self.log.push(a);
        }
        assert!(s.invariant_ok, "invariant broken: {s:?}");
        assert_eq!(s.issued, s.completed + s.incomplete + s.dropped);
        s
    }

    fn counter(&self, key: &str) -> u64 {
        self.metrics.counter(key)
    }
}

fn ready(role: Role, node_id: u32, connected: u32) -> Message {
    Message::Ready {
        role,
        node_id,
        connected,
    }
}

/// The frames sent to `conn` among `actions`, run-control states left out (`control`
/// checks those with `sent`).
fn to(actions: &[Action], conn: ConnId) -> Vec<Message> {
    sent(actions, conn)
        .into_iter()
        .filter(|m| !matches!(m, Message::RunState { .. }))
        .collect()
}

/// Every frame sent to `conn` among `actions`.
fn sent(actions: &[Action], conn: ConnId) -> Vec<Message> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Send { conn: c, msg } if *c == conn => Some(msg.clone()),
            _ => None,
        })
        .collect()
}

/// (TF, EPN) of every Assign sent to an EPN among `actions`.
fn assigns(actions: &[Action]) -> Vec<(u64, u32)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Send {
                conn,
                msg: Message::Assign { tf_id, epn_id },
            } if *conn == epn_conn(*epn_id) => Some((*tf_id, *epn_id)),
            _ => None,
        })
        .collect()
}

fn ended(actions: &[Action]) -> Vec<(u64, TfStatus, Reason)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::TfEnded(r) => Some((r.tf_id, r.status, r.reason)),
            _ => None,
        })
        .collect()
}

fn closed(actions: &[Action], conn: ConnId) -> bool {
    actions
        .iter()
        .any(|a| matches!(a, Action::Close { conn: c } if *c == conn))
}

fn rejected(actions: &[Action], conn: ConnId) -> Option<String> {
    to(actions, conn).into_iter().find_map(|m| match m {
        Message::Reject { reason, .. } => Some(reason),
        _ => None,
    })
}

// ---- registration and the pre-run ----

#[test]
fn register_acks_with_the_id_and_run() {
    let mut h = H::new(config(1, 1, |_| {}));
    let out = h.register(epn_conn(0), Role::Epn, Some(0));
    assert_eq!(
        to(&out, epn_conn(0)),
        vec![Message::RegisterAck {
            node_id: 0,
            run_id: 7,
            resume: false,
        }]
    );
    let state = Message::RunState {
        state: fanin_proto::RunState::Configured,
        run_number: 7,
    };
    assert_eq!(
        sent(&out, epn_conn(0))[1],
        state,
        "a node learns the state at once"
    );
    assert_eq!(h.core.phase(), Phase::Registering);
}

#[test]
fn flp_id_outside_the_run_is_refused() {
    let mut h = H::new(config(2, 1, |_| {}));
    let out = h.register(flp_conn(5), Role::Flp, Some(5));
    let why = rejected(&out, flp_conn(5)).expect("a Reject");
    assert!(why.contains("unknown FLP id 5"), "{why}");
    assert!(closed(&out, flp_conn(5)));
    assert_eq!(h.counter("errors.rejected"), 1);
}

#[test]
fn duplicate_id_is_refused_naming_the_holder() {
    let mut h = H::new(config(2, 2, |_| {}));
    h.register(epn_conn(0), Role::Epn, Some(0));
    let out = h.register(50, Role::Epn, Some(0));
    let why = rejected(&out, 50).expect("a Reject");
    assert!(
        why.contains("already registered from 127.0.0.1:10001"),
        "{why}"
    );
}

#[test]
fn extra_epn_is_refused_when_all_registered() {
    let mut h = H::new(config(1, 1, |_| {}));
    h.register(epn_conn(0), Role::Epn, Some(0));
    let out = h.register(50, Role::Epn, None);
    assert!(rejected(&out, 50).unwrap().contains("run expects 1 EPNs"));
}

#[test]
fn epn_with_a_bad_data_address_is_refused() {
    let mut h = H::new(config(1, 1, |_| {}));
    let reg = Register {
        role: Role::Epn,
        node_id: None,
        data_addr: "nowhere".into(),
        proof: [0; 32],
    };
    let out = h.feed(Input::Registered {
        conn: 9,
        peer: peer_addr(9),
        reg,
    });
    assert!(rejected(&out, 9).unwrap().contains("is not HOST:PORT"));
}

#[test]
fn flp_without_an_id_takes_the_lowest_free_one() {
    let mut h = H::new(config(3, 1, |_| {}));
    h.register(flp_conn(0), Role::Flp, Some(0));
    let out = h.register(60, Role::Flp, None);
    assert_eq!(
        to(&out, 60),
        vec![Message::RegisterAck {
            node_id: 1,
            run_id: 7,
            resume: false,
        }]
    );
}

#[test]
fn all_registered_sends_prepare_and_the_epn_list() {
    let mut h = H::new(config(1, 2, |_| {}));
    h.register(epn_conn(0), Role::Epn, Some(0));
    h.register(epn_conn(1), Role::Epn, Some(1));
    let out = h.register(flp_conn(0), Role::Flp, Some(0));
    assert_eq!(h.core.phase(), Phase::Preparing);
    assert!(matches!(to(&out, epn_conn(1))[0], Message::Prepare(ref p) if p.flps == 1));
    let flp = to(&out, flp_conn(0));
    let Message::EpnList(list) = &flp[2] else {
        panic!("FLP got {flp:?}");
    };
    assert_eq!(list.iter().map(|e| e.epn_id).collect::<Vec<_>>(), [0, 1]);
}

#[test]
fn flp_not_connected_to_every_epn_is_fatal() {
    let mut h = H::new(config(1, 2, |_| {}));
    h.register(epn_conn(0), Role::Epn, Some(0));
    h.register(epn_conn(1), Role::Epn, Some(1));
    h.register(flp_conn(0), Role::Flp, Some(0));
    h.msg(flp_conn(0), ready(Role::Flp, 0, 1));
    assert_eq!(h.core.phase(), Phase::Done);
    assert!(h.core.fatal().unwrap().contains("connected to 1 of 2 EPNs"));
}

#[test]
fn all_ready_starts_the_run_everywhere() {
    let mut h = H::new(config(1, 1, |_| {}));
    h.register(epn_conn(0), Role::Epn, Some(0));
    h.register(flp_conn(0), Role::Flp, Some(0));
    h.msg(epn_conn(0), ready(Role::Epn, 0, 0));
    assert_eq!(h.core.phase(), Phase::Preparing);
    let out = h.msg(flp_conn(0), ready(Role::Flp, 0, 1));
    assert_eq!(h.core.phase(), Phase::Running);
    assert!(out.contains(&Action::RunStarted { resumed: false }));
    for c in [epn_conn(0), flp_conn(0)] {
        assert!(to(&out, c).contains(&Message::RunStart {
            run_id: 7,
            elapsed_us: 0
        }));
    }
}

#[test]
fn prerun_timeout_names_the_missing_flps() {
    let mut h = H::new(config(3, 1, |_| {}));
    h.register(flp_conn(1), Role::Flp, Some(1));
    h.at(4_999);
    assert_eq!(h.core.phase(), Phase::Registering);
    h.at(5_000);
    assert_eq!(h.core.phase(), Phase::Done);
    let why = h.core.fatal().unwrap();
    assert!(why.contains("missing FLP ids [0, 2]"), "{why}");
}

#[test]
fn node_leaving_before_the_run_may_register_again() {
    let mut h = H::new(config(1, 1, |_| {}));
    h.register(epn_conn(0), Role::Epn, Some(0));
    h.feed(Input::Closed {
        conn: epn_conn(0),
        err: None,
    });
    let out = h.register(70, Role::Epn, Some(0));
    assert!(rejected(&out, 70).is_none());
    assert_eq!(h.core.phase(), Phase::Registering);
}

#[test]
fn node_leaving_during_the_prerun_is_fatal() {
    let mut h = H::new(config(1, 1, |_| {}));
    h.register(epn_conn(0), Role::Epn, Some(0));
    h.register(flp_conn(0), Role::Flp, Some(0));
    h.feed(Input::Closed {
        conn: epn_conn(0),
        err: Some("reset".into()),
    });
    assert!(h
        .core
        .fatal()
        .unwrap()
        .contains("left during the pre-run: reset"));
}

#[test]
fn registration_after_the_run_is_refused() {
    let mut h = H::running(1, 1, |c| c.tfs = Some(1));
    h.complete(0, 0);
    assert_eq!(h.core.phase(), Phase::Stopping);
    let out = h.register(80, Role::Epn, None);
    assert!(rejected(&out, 80).unwrap().contains("is Stopping"));
    let code = to(&out, 80).into_iter().find_map(|m| match m {
        Message::Reject { code, .. } => Some(code),
        _ => None,
    });
    assert_eq!(code, Some(RejectCode::RunOver), "its node ends cleanly");
}

// ---- issuing ----

#[test]
fn paced_issuing_follows_absolute_deadlines() {
    let mut h = H::running(1, 2, |_| {});
    assert_eq!(h.core.progress().0, 1, "TF 0 is due at the start");
    assert_eq!(h.core.poll_timeout(), Some(MS));
    let out = h.at(10); // a late wake-up issues everything due at once
    assert_eq!(assigns(&out).len(), 10);
    assert_eq!(h.core.progress().0, 11);
    assert_eq!(h.core.poll_timeout(), Some(11 * MS));
}

#[test]
fn round_robin_spreads_tfs_and_tells_the_epn_first() {
    let mut h = H::running(2, 3, |_| {});
    let out = h.at(5);
    let epns: Vec<u32> = assigns(&h.log).iter().map(|&(_, e)| e).collect();
    assert_eq!(epns, [0, 1, 2, 0, 1, 2]);
    let first = out
        .iter()
        .position(|a| {
            matches!(
                a,
                Action::Send {
                    msg: Message::Assign { tf_id: 1, .. },
                    ..
                }
            )
        })
        .unwrap();
    assert!(matches!(&out[first], Action::Send { conn, .. } if *conn == epn_conn(1)));
    assert_eq!(to(&out, flp_conn(1)).len(), 5, "every FLP learns every TF");
}

#[test]
fn id_base_offsets_every_tf_id() {
    let mut h = H::with_base(config(1, 1, |c| c.tfs = Some(3)), 1 << 32, None);
    h.register(epn_conn(0), Role::Epn, Some(0));
    h.register(flp_conn(0), Role::Flp, Some(0));
    h.msg(epn_conn(0), ready(Role::Epn, 0, 0));
    h.msg(flp_conn(0), ready(Role::Flp, 0, 1));
    h.at(2);
    let ids: Vec<u64> = assigns(&h.log).iter().map(|a| a.0).collect();
    assert_eq!(ids, [1 << 32, (1 << 32) + 1, (1 << 32) + 2]);
}

#[test]
fn completed_report_ends_the_tf_and_releases_it() {
    let mut h = H::running(2, 1, |_| {});
    let out = h.complete(0, 0);
    assert_eq!(ended(&out), [(0, TfStatus::Complete, Reason::None)]);
    for f in 0..2 {
        assert_eq!(to(&out, flp_conn(f)), [Message::Release { tf_id: 0 }]);
    }
    assert_eq!(h.counter("tfs.complete.none"), 1);
}

#[test]
fn without_reassign_nothing_is_released() {
    let mut h = H::running(1, 1, |c| c.reassign = false);
    let out = h.complete(0, 0);
    assert!(to(&out, flp_conn(0)).is_empty());
}

#[test]
fn incomplete_report_keeps_its_reason() {
    let mut h = H::running(1, 1, |c| c.tfs = Some(1));
    h.report(0, 0, TfStatus::Incomplete, Reason::BuildTimeout);
    let s = h.finish();
    assert_eq!(s.incomplete_by_reason.get("build_timeout"), Some(&1));
}

#[test]
fn a_second_report_is_stale() {
    let mut h = H::running(1, 1, |_| {});
    h.complete(0, 0);
    let out = h.complete(0, 0);
    assert!(ended(&out).is_empty());
    assert_eq!(h.counter("errors.stale_report"), 1);
}

#[test]
fn report_from_the_wrong_epn_is_refused() {
    let mut h = H::running(1, 2, |_| {});
    let out = h.complete(1, 0); // TF 0 went to EPN 0
    assert!(ended(&out).is_empty());
    assert_eq!(h.counter("errors.wrong_epn_report"), 1);
}

#[test]
fn flp_drop_ends_the_tf_and_abandons_it_at_the_epn() {
    let mut h = H::running(2, 1, |_| {});
    let drop = Message::StfDropped {
        tf_id: 0,
        flp_id: 1,
        reason: Reason::FlpBufferFull,
    };
    let out = h.msg(flp_conn(1), drop);
    assert_eq!(ended(&out), [(0, TfStatus::Dropped, Reason::FlpBufferFull)]);
    assert!(to(&out, epn_conn(0)).contains(&Message::Abandon {
        tf_id: 0,
        reason: Reason::FlpBufferFull
    }));
}

#[test]
fn paced_over_max_inflight_drops_at_issue() {
    let mut h = H::running(1, 1, |c| c.max_inflight = 3);
    let out = h.at(4);
    assert_eq!(
        ended(&out),
        [
            (3, TfStatus::Dropped, Reason::IcnInflightLimit),
            (4, TfStatus::Dropped, Reason::IcnInflightLimit)
        ]
    );
}

#[test]
fn unthrottled_waits_for_acknowledgements() {
    let mut h = H::running(1, 2, |c| {
        c.rate_hz = 0.0;
        c.max_inflight = 4;
    });
    assert_eq!(h.core.progress().0, 4);
    assert_eq!(h.core.in_flight(), 4);
    h.complete(0, 0);
    h.complete(1, 1);
    assert_eq!(h.core.progress().0, 6, "two acks, two new TFs");
    assert_eq!(h.core.in_flight(), 4);
}

#[test]
fn unthrottled_keeps_no_more_in_flight_for_a_lagging_epn_than_its_queue_holds() {
    // 16 MiB of FLP buffer and 1 MiB STFs: with two EPNs, one EPN's queue holds 8 STFs.
    // EPN 0 builds every TF at once, EPN 1 none: round robin keeps giving it TFs.
    let mut h = H::running(1, 2, |c| {
        c.rate_hz = 0.0;
        c.tfs = Some(1_000);
        c.flp_buffer = crate::config::ByteSize(16 << 20);
        c.stf_size = "1MiB".into();
    });
    let pending_on = |h: &H, epn: u32| {
        let issued = h.core.progress().0;
        (0..issued)
            .filter(|&tf| h.core.ledger.is_pending(tf) && h.core.ledger.assigned(tf) == Some(epn))
            .collect::<Vec<_>>()
    };
    let mut most = 0;
    while let Some(&tf) = pending_on(&h, 0).first() {
        most = most.max(pending_on(&h, 1).len());
        h.complete(0, tf);
    }
    most = most.max(pending_on(&h, 1).len());
    assert!(
        (7..=8).contains(&most),
        "EPN 1 had {most} TFs in flight: its queue at the FLP holds 8 STFs (the rest drop), and the window fills to 7"
    );
    assert_eq!(
        pending_on(&h, 1).len(),
        h.core.in_flight(),
        "waits for EPN 1"
    );
}

#[test]
fn unthrottled_pauses_while_an_flp_is_missing() {
    let mut h = H::running(2, 1, |c| {
        c.rate_hz = 0.0;
        c.max_inflight = 2;
        c.reassign = false;
    });
    h.feed(Input::Closed {
        conn: flp_conn(1),
        err: None,
    });
    h.complete(0, 0);
    h.complete(0, 1);
    assert_eq!(h.core.progress().0, 2, "waits for the FLP");
    h.at(5_000); // the pre-run time-out: go on, and drop with the reason
    let s = h.finish();
    assert!(s.dropped_by_reason.get("flp_lost").copied().unwrap_or(0) > 0);
}

#[test]
fn the_last_tf_starts_the_drain_and_the_last_ack_the_stop() {
    let mut h = H::running(1, 1, |c| c.tfs = Some(3));
    h.at(2);
    assert_eq!(h.core.phase(), Phase::Draining);
    h.complete(0, 0);
    h.complete(0, 1);
    assert_eq!(h.core.phase(), Phase::Draining);
    let out = h.complete(0, 2);
    assert_eq!(h.core.phase(), Phase::Stopping);
    assert!(to(&out, flp_conn(0)).contains(&Message::RunStop { run_id: 7 }));
    h.stats(epn_conn(0), Role::Epn, 0);
    assert_eq!(h.core.phase(), Phase::Stopping);
    h.stats(flp_conn(0), Role::Flp, 0);
    assert_eq!(h.core.phase(), Phase::Done);
    let s = h.finish();
    assert_eq!((s.issued, s.completed), (3, 3));
    assert_eq!(s.nodes["FLP 0"]["stfs.sent"], 3);
}

#[test]
fn drain_timeout_leaves_tfs_unacknowledged() {
    let mut h = H::running(1, 1, |c| {
        c.tfs = Some(2);
        c.drain_timeout_ms = Some(500);
    });
    h.at(1);
    h.complete(0, 0);
    h.at(400);
    assert_eq!(h.core.phase(), Phase::Draining);
    h.at(501);
    assert_eq!(h.core.phase(), Phase::Stopping);
    let s = h.finish();
    assert_eq!(s.dropped_by_reason.get("unacknowledged"), Some(&1));
    assert!(s.events.iter().any(|e| e.contains("never acknowledged")));
}

#[test]
fn stop_timeout_names_the_silent_nodes() {
    let mut h = H::running(1, 1, |c| c.tfs = Some(1));
    h.complete(0, 0);
    h.stats(epn_conn(0), Role::Epn, 0);
    h.at(10_000);
    assert_eq!(h.core.phase(), Phase::Done);
    let s = h.finish();
    assert!(s
        .events
        .iter()
        .any(|e| e.contains("no run-end counters from FLP 0")));
}

#[test]
fn unexpected_frames_are_counted_not_obeyed() {
    let mut h = H::running(1, 1, |_| {});
    let out = h.msg(
        flp_conn(0),
        Message::RunStart {
            run_id: 7,
            elapsed_us: 0,
        },
    );
    assert!(to(&out, flp_conn(0)).is_empty());
    assert_eq!(h.counter("errors.unexpected_message"), 1);
    h.feed(Input::Msg {
        conn: 999,
        msg: Message::RunStart {
            run_id: 7,
            elapsed_us: 0,
        },
    });
    assert_eq!(h.counter("errors.ignored_frame"), 1);
}

// ---- failures and re-assignment ----

#[test]
fn lost_epn_tfs_move_to_a_live_epn() {
    let mut h = H::running(2, 2, |_| {});
    h.at(3); // TFs 0, 2 on EPN 0; 1, 3 on EPN 1
    let out = h.feed(Input::Closed {
        conn: epn_conn(0),
        err: Some("killed".into()),
    });
    assert_eq!(assigns(&out), [(0, 1), (2, 1)]);
    assert_eq!(
        to(&out, flp_conn(1)).len(),
        2,
        "FLPs re-send to the new EPN"
    );
    for tf in 0..4 {
        h.complete(1, tf);
    }
    let s = h.finish();
    assert_eq!(s.reassigned, 2);
    assert_eq!(s.completed, 4);
    let lost = s.membership.iter().find(|e| e.node == "EPN 0").unwrap();
    assert_eq!((lost.kind.as_str(), lost.reassigned), ("lost", 2));
}

#[test]
fn lost_epn_without_reassign_drops_its_tfs() {
    let mut h = H::running(1, 2, |c| c.reassign = false);
    h.at(3);
    let out = h.feed(Input::Closed {
        conn: epn_conn(1),
        err: None,
    });
    let lost = ended(&out);
    assert_eq!(
        lost,
        [
            (1, TfStatus::Dropped, Reason::EpnLost),
            (3, TfStatus::Dropped, Reason::EpnLost)
        ]
    );
    assert!(assigns(&h.at(4)).iter().all(|&(_, e)| e == 0));
}

#[test]
fn the_last_epn_lost_drops_with_no_epn() {
    let mut h = H::running(1, 1, |_| {});
    h.feed(Input::Closed {
        conn: epn_conn(0),
        err: None,
    });
    let out = h.at(2);
    assert!(ended(&out).contains(&(1, TfStatus::Dropped, Reason::NoEpn)));
}

#[test]
fn lost_flp_drops_new_tfs_with_flp_lost() {
    let mut h = H::running(2, 1, |_| {});
    h.feed(Input::Closed {
        conn: flp_conn(0),
        err: None,
    });
    let out = h.at(1);
    assert_eq!(ended(&out), [(1, TfStatus::Dropped, Reason::FlpLost)]);
    assert!(h
        .core
        .events
        .iter()
        .any(|e| e.contains("TFs are dropped (flp_lost)")));
}

#[test]
fn failed_send_is_a_later_input_that_drops_the_peer() {
    let mut h = H::running(1, 2, |_| {});
    let out = h.feed(Input::SendFailed {
        conn: epn_conn(1),
        why: "control queue full (peer not reading)".into(),
    });
    assert!(closed(&out, epn_conn(1)));
    assert_eq!(h.counter("errors.peer_stuck"), 1);
    assert!(!h.core.epns.contains_key(&1));
}

#[test]
fn unreachable_epn_leaves_the_schedule() {
    let mut h = H::running(1, 2, |_| {});
    h.at(1);
    let out = h.msg(
        flp_conn(0),
        Message::EpnReachable {
            epn_id: 1,
            ok: false,
        },
    );
    assert!(closed(&out, epn_conn(1)));
    assert_eq!(assigns(&out), [(1, 0)], "TF 1 moved to EPN 0");
    assert_eq!(h.counter("errors.epn_unreachable"), 1);
}

#[test]
fn silent_peer_loses_its_lease() {
    let mut h = H::running(1, 2, |c| c.lease_ms = 300);
    for t in (100..=400).step_by(100) {
        h.now = Duration::from_millis(t);
        h.msg(
            flp_conn(0),
            Message::LoadReport {
                free_bytes: 0,
                building: 0,
            },
        );
        h.msg(
            epn_conn(0),
            Message::LoadReport {
                free_bytes: 1 << 30,
                building: 0,
            },
        );
        h.at(t);
    }
    assert!(h.core.epns.contains_key(&0), "heartbeats keep the lease");
    assert!(
        !h.core.epns.contains_key(&1),
        "EPN 1 sent nothing for 300 ms"
    );
    assert_eq!(h.counter("errors.lease_expired"), 1);
}

#[test]
fn registry_departure_ends_a_silent_node() {
    let (members, gone) = registry_views();
    let mut h = H::with_base(config(1, 1, |_| {}), 0, Some(members));
    start(&mut h);
    h.now = 400 * MS;
    h.feed(Input::Membership(gone));
    assert!(h.core.epns.is_empty());
    assert_eq!(h.counter("errors.registry_left"), 1);
}

#[test]
fn registry_departure_of_a_fresh_heartbeat_is_ignored() {
    let (members, gone) = registry_views();
    let mut h = H::with_base(config(1, 1, |_| {}), 0, Some(members));
    start(&mut h);
    h.now = 400 * MS;
    h.msg(
        epn_conn(0),
        Message::LoadReport {
            free_bytes: 0,
            building: 0,
        },
    );
    h.feed(Input::Membership(gone));
    assert!(h.core.epns.contains_key(&0));
    assert_eq!(h.counter("errors.registry_left_ignored"), 1);
}

#[test]
fn leases_take_over_when_the_registry_watch_ends() {
    let (members, _) = registry_views();
    let mut h = H::with_base(config(1, 1, |c| c.lease_ms = 300), 0, Some(members));
    start(&mut h);
    h.at(500);
    assert!(h.core.epns.contains_key(&0), "no leases under a registry");
    h.feed(Input::MembershipLost);
    h.at(520);
    assert!(h.core.epns.is_empty());
}

fn registry_views() -> (Membership, Membership) {
    let mut m = Membership::default();
    let reg = |conn| Registered {
        addr: peer_addr(conn).to_string(),
        incarnation: 1,
    };
    m.epns.insert(0, reg(epn_conn(0)));
    m.flps.insert(0, reg(flp_conn(0)));
    let mut gone = m.clone();
    gone.epns.clear();
    (m, gone)
}

fn start(h: &mut H) {
    h.register(epn_conn(0), Role::Epn, Some(0));
    h.register(flp_conn(0), Role::Flp, Some(0));
    h.msg(epn_conn(0), ready(Role::Epn, 0, 0));
    h.msg(flp_conn(0), ready(Role::Flp, 0, 1));
}

#[test]
fn lost_leadership_fences_a_running_run() {
    let mut h = H::running(1, 1, |_| {});
    let out = h.feed(Input::LostLeadership);
    // Another ICN goes on with the run: this one stops and says nothing to anyone.
    assert_eq!(h.core.phase(), Phase::Done);
    assert!(
        h.core.fatal().unwrap().contains("fenced"),
        "{:?}",
        h.core.fatal()
    );
    assert!(to(&out, epn_conn(0)).is_empty() && to(&out, flp_conn(0)).is_empty());
}

#[test]
fn lost_leadership_before_the_run_is_fatal() {
    let mut h = H::new(config(1, 1, |_| {}));
    h.feed(Input::LostLeadership);
    assert_eq!(
        h.core.fatal(),
        Some("lost leadership before the run started")
    );
}

// ---- rejoining ----

#[test]
fn flp_rejoins_and_issuing_goes_on() {
    let mut h = H::running(2, 2, |_| {});
    h.feed(Input::Closed {
        conn: flp_conn(1),
        err: None,
    });
    h.now = 10 * MS;
    let out = h.register(200, Role::Flp, Some(1));
    let got = to(&out, 200);
    assert!(matches!(got[1], Message::Prepare(_)));
    assert!(matches!(&got[2], Message::EpnList(l) if l.len() == 2));
    let out = h.msg(200, ready(Role::Flp, 1, 2));
    assert!(
        to(&out, 200).contains(&Message::RunStart {
            run_id: 7,
            elapsed_us: 10_000
        }),
        "a rejoining FLP learns how long the run has been going"
    );
    let out = h.at(11);
    assert!(ended(&out).is_empty(), "TF 11 is not dropped: {out:?}");
    assert!(h
        .core
        .membership
        .iter()
        .any(|e| e.node == "FLP 1" && e.kind == "rejoined"));
}

#[test]
fn epn_rejoins_once_every_flp_reached_it() {
    let mut h = H::running(2, 2, |_| {});
    h.feed(Input::Closed {
        conn: epn_conn(1),
        err: None,
    });
    let out = h.register(300, Role::Epn, Some(1));
    assert!(matches!(to(&out, 300)[1], Message::Prepare(_)));
    let out = h.msg(300, ready(Role::Epn, 1, 0));
    assert!(matches!(&to(&out, flp_conn(0))[0], Message::EpnList(l) if l[0].epn_id == 1));
    h.msg(
        flp_conn(0),
        Message::EpnReachable {
            epn_id: 1,
            ok: true,
        },
    );
    assert!(!h.core.epns.contains_key(&1), "FLP 1 has not confirmed");
    let out = h.msg(
        flp_conn(1),
        Message::EpnReachable {
            epn_id: 1,
            ok: true,
        },
    );
    assert!(to(&out, 300).contains(&Message::RunStart {
        run_id: 7,
        elapsed_us: 0
    }));
    let out = h.at(4);
    let at_new = to(&out, 300);
    assert!(
        at_new
            .iter()
            .any(|m| matches!(m, Message::Assign { epn_id: 1, .. })),
        "EPN 1 gets TFs again"
    );
}

#[test]
fn a_node_joining_and_leaving_in_a_loop_does_not_grow_the_summary() {
    let mut h = H::running(1, 2, |_| {});
    h.feed(Input::Closed {
        conn: epn_conn(1),
        err: None,
    });
    let loops = super::MAX_EVENTS as u64 + 50;
    for i in 0..loops {
        h.register(1000 + i, Role::Epn, Some(1));
        h.feed(Input::Closed {
            conn: 1000 + i,
            err: None,
        });
    }
    assert!(h.core.events.len() <= super::MAX_EVENTS);
    assert!(h.core.membership.len() <= super::MAX_EVENTS);
    let s = h.finish();
    let last = s.events.last().unwrap();
    assert!(
        last.contains("more events and membership changes not kept"),
        "{last}"
    );
}

#[test]
fn an_id_the_run_does_not_have_is_refused_as_unknown() {
    let mut h = H::running(1, 1, |_| {});
    let out = h.register(400, Role::Epn, Some(5));
    assert!(rejected(&out, 400).unwrap().contains("unknown EPN id 5"));
    let out = h.register(401, Role::Epn, None);
    assert!(rejected(&out, 401)
        .unwrap()
        .contains("every EPN id of this run is taken"));
    assert!(
        h.core.peers.keys().all(|c| *c < 400),
        "neither became a peer"
    );
}

#[test]
fn a_live_id_cannot_join_twice() {
    let mut h = H::running(1, 1, |_| {});
    let out = h.register(400, Role::Epn, Some(0));
    assert!(rejected(&out, 400).unwrap().contains("already in the run"));
}

#[test]
fn joining_epn_that_leaves_is_never_scheduled() {
    let mut h = H::running(1, 2, |_| {});
    h.feed(Input::Closed {
        conn: epn_conn(1),
        err: None,
    });
    h.register(300, Role::Epn, Some(1));
    h.msg(300, ready(Role::Epn, 1, 0));
    h.feed(Input::Closed {
        conn: 300,
        err: None,
    });
    assert!(h.core.joining.is_empty());
    assert!(h
        .core
        .events
        .iter()
        .any(|e| e.contains("left while joining")));
}

// ---- waiting for room (least-loaded, wait) ----

fn least_loaded_wait(c: &mut RunConfig) {
    c.policy = PolicyKind::LeastLoaded;
    c.least_loaded = LeastLoadedConfig {
        headroom_percent: 100,
        max_building: 64,
        when_none_ready: WhenNoneReady::Wait,
    };
}

#[test]
fn tfs_wait_for_room_and_go_oldest_first() {
    let mut h = H::running(1, 1, least_loaded_wait);
    h.complete(0, 0);
    let full = Message::LoadReport {
        free_bytes: 0,
        building: 0,
    };
    h.msg(epn_conn(0), full);
    let out = h.at(2);
    assert!(assigns(&out).is_empty(), "no room: TFs 1, 2 wait");
    assert_eq!(h.core.placer.waiting_len(), 2);
    let room = Message::LoadReport {
        free_bytes: 1 << 30,
        building: 0,
    };
    let out = h.msg(epn_conn(0), room);
    assert_eq!(assigns(&out), [(1, 0), (2, 0)]);
}

#[test]
fn waiting_tfs_at_stop_end_as_epns_busy() {
    let mut h = H::running(1, 1, |c| {
        least_loaded_wait(c);
        c.tfs = Some(3);
        c.drain_timeout_ms = Some(100);
    });
    h.msg(
        epn_conn(0),
        Message::LoadReport {
            free_bytes: 0,
            building: 0,
        },
    );
    h.at(2);
    h.at(103);
    let s = h.finish();
    assert_eq!(s.dropped_by_reason.get("epns_busy"), Some(&2));
}

#[test]
fn epn_lost_with_no_room_elsewhere_waits_instead_of_dropping() {
    let mut h = H::running(1, 2, least_loaded_wait);
    h.msg(
        epn_conn(1),
        Message::LoadReport {
            free_bytes: 0,
            building: 0,
        },
    );
    h.feed(Input::Closed {
        conn: epn_conn(0),
        err: None,
    });
    assert_eq!(h.core.placer.waiting().collect::<Vec<_>>(), [0]);
    let out = h.msg(
        epn_conn(1),
        Message::LoadReport {
            free_bytes: 1 << 30,
            building: 0,
        },
    );
    assert_eq!(assigns(&out)[0], (0, 1));
}

/// A TF moved off a lost EPN waits; when it then ends without an EPN (the last one is
/// lost too), the FLPs still keep its STFs from the first Assign: they are released.
#[test]
fn a_moved_tf_that_ends_while_waiting_is_released() {
    let mut h = H::running(1, 2, least_loaded_wait);
    let full = Message::LoadReport {
        free_bytes: 0,
        building: 0,
    };
    h.msg(epn_conn(1), full);
    h.feed(Input::Closed {
        conn: epn_conn(0),
        err: None,
    });
    assert_eq!(h.core.placer.waiting().collect::<Vec<_>>(), [0]);
    let out = h.feed(Input::Closed {
        conn: epn_conn(1),
        err: None,
    });
    assert_eq!(ended(&out), [(0, TfStatus::Dropped, Reason::NoEpn)]);
    assert!(to(&out, flp_conn(0)).contains(&Message::Release { tf_id: 0 }));
}

#[test]
fn least_loaded_drop_names_the_reason() {
    let mut h = H::running(1, 1, |c| {
        least_loaded_wait(c);
        c.least_loaded.when_none_ready = WhenNoneReady::Drop;
        c.reassign = true;
    });
    h.msg(
        epn_conn(0),
        Message::LoadReport {
            free_bytes: 0,
            building: 0,
        },
    );
    let out = h.at(1);
    assert_eq!(ended(&out), [(1, TfStatus::Dropped, Reason::NoEpnBuffer)]);
    // No FLP heard of it: nothing to release (a burst of drops sends no burst).
    assert!(!to(&out, flp_conn(0)).contains(&Message::Release { tf_id: 1 }));
}

#[test]
fn a_whole_run_accounts_for_every_tf() {
    let mut h = H::running(2, 3, |c| c.tfs = Some(50));
    for t in 1..50u64 {
        h.at(t);
    }
    let tfs: Vec<(u64, u32)> = assigns(&h.log);
    for (i, &(tf, epn)) in tfs.iter().enumerate() {
        if i % 10 == 3 {
            h.report(epn, tf, TfStatus::Incomplete, Reason::BuildTimeout);
        } else if i % 10 != 7 {
            h.complete(epn, tf);
        }
    }
    h.at(10_000);
    let s = h.finish();
    assert_eq!(s.issued, 50);
    assert_eq!((s.completed, s.incomplete, s.dropped), (40, 5, 5));
}

// ---- the ICN places TFs as the simulators do ----

/// Every Assign the ICN sent to an EPN, in order, and every TF the policy dropped.
fn icn_placements(cfg: RunConfig, events: &[(u64, Event)]) -> Placements {
    let epns = cfg.epns;
    let mut h = H::running(1, epns, |c| *c = RunConfig { flps: 1, ..cfg });
    for t in 1..30u64 {
        h.now = Duration::from_millis(t);
        for (_, ev) in events.iter().filter(|(at, _)| *at == t) {
            match *ev {
                Event::Load(e, free_bytes) => {
                    let load = Message::LoadReport {
                        free_bytes,
                        building: 0,
                    };
                    h.msg(epn_conn(e), load);
                }
                Event::Lost(e) => {
                    h.feed(Input::Closed {
                        conn: epn_conn(e),
                        err: None,
                    });
                }
            }
        }
        h.at(t);
    }
    let dropped = ended(&h.log)
        .into_iter()
        .filter(|e| e.1 == TfStatus::Dropped)
        .map(|(tf, _, r)| (tf, r.name().to_string()))
        .collect();
    (assigns(&h.log), dropped)
}

/// The same scenario through the shared placement component, driven as the simulators
/// drive it: issue each TF, retry waiting TFs after a load report, re-place a lost
/// EPN's TFs.
fn sim_placements(cfg: &RunConfig, events: &[(u64, Event)]) -> Placements {
    let mut p = fanin_sched::Placer::new(cfg.policy_config().build());
    for e in 0..cfg.epns {
        p.policy_mut().add_epn(e);
    }
    let bytes = 1024; // one FLP, 1 KiB STFs
    let mut r = Rec::default();
    for t in 0..30u64 {
        for (_, ev) in events.iter().filter(|(at, _)| *at == t) {
            match *ev {
                Event::Load(e, free_bytes) => {
                    let load = fanin_sched::EpnLoad {
                        free_bytes,
                        building: 0,
                    };
                    p.policy_mut().report_load(e, load);
                }
                Event::Lost(e) => {
                    p.policy_mut().remove_epn(e);
                    let lost: Vec<u64> =
                        r.on.iter()
                            .filter(|(_, &x)| x == e)
                            .map(|(&tf, _)| tf)
                            .collect();
                    for tf in lost {
                        r.on.remove(&tf);
                        r.record(tf, p.replace(tf, bytes));
                    }
                }
            }
            while let Some((tf, placed)) = p.place_next(|_| true) {
                r.record(tf, placed);
            }
        }
        r.record(t, p.issue(t, bytes));
    }
    (r.out, r.dropped)
}

/// What the replay placed, and where each TF is now.
#[derive(Default)]
struct Rec {
    out: Vec<(u64, u32)>,
    dropped: Vec<(u64, String)>,
    on: std::collections::BTreeMap<u64, u32>,
}

impl Rec {
    fn record(&mut self, tf: u64, placed: fanin_sched::Placed) {
        match placed {
            fanin_sched::Placed::Assigned(e) => {
                self.out.push((tf, e));
                self.on.insert(tf, e);
            }
            fanin_sched::Placed::Dropped(r) => self.dropped.push((tf, r.name().to_string())),
            fanin_sched::Placed::Waiting => {}
        }
    }
}

type Placements = (Vec<(u64, u32)>, Vec<(u64, String)>);

#[derive(Clone, Copy)]
enum Event {
    /// An EPN reports this many free bytes.
    Load(u32, u64),
    /// An EPN's connection closes.
    Lost(u32),
}

#[test]
fn the_icn_places_tfs_as_the_simulators_do_for_every_policy() {
    let events = [
        (5, Event::Load(1, 0)),
        (6, Event::Load(0, 0)),
        (7, Event::Load(2, 0)),
        (10, Event::Lost(2)),
        (15, Event::Load(1, 1 << 20)),
        (20, Event::Load(0, 1 << 20)),
    ];
    let mut configs = Vec::new();
    for &kind in PolicyKind::ALL {
        configs.push(config(1, 3, |c| c.policy = kind));
    }
    configs.push(config(1, 3, |c| {
        c.policy = PolicyKind::WeightedRoundRobin;
        c.epn_weights = vec![3, 1, 2];
    }));
    configs.push(config(1, 3, least_loaded_wait));
    configs.push(config(1, 3, |c| {
        least_loaded_wait(c);
        c.least_loaded.when_none_ready = WhenNoneReady::Drop;
        c.least_loaded.max_building = 4;
    }));
    for cfg in configs {
        let label = format!(
            "{} {:?} {:?}",
            cfg.policy, cfg.epn_weights, cfg.least_loaded
        );
        let sim = sim_placements(&cfg, &events);
        let icn = icn_placements(cfg, &events);
        assert!(
            sim.0.len() + sim.1.len() >= 30,
            "{label}: TFs unplaced: {sim:?}"
        );
        assert_eq!(icn, sim, "{label}");
    }
}

#[test]
fn a_long_backlog_is_issued_in_batches_with_immediate_wake_ups() {
    let mut h = H::running(1, 2, |c| c.tfs = Some(600));
    h.now = Duration::from_millis(599); // a very late wake-up: 599 TFs are due
    h.feed(Input::Timeout);
    assert_eq!(h.core.progress().0, 1 + super::ISSUE_BATCH as u64);
    assert_eq!(
        h.core.poll_timeout(),
        Some(h.now),
        "more is due: wake at once"
    );
    h.feed(Input::Timeout);
    h.feed(Input::Timeout);
    assert_eq!(h.core.progress().0, 600);
    assert_eq!(h.core.phase(), Phase::Draining);
}

#[test]
fn a_paused_unthrottled_run_wakes_at_the_prerun_time_out() {
    // Under a registry there are no lease checks: only this wake-up ends the pause.
    let (members, _) = registry_views();
    let cfg = config(1, 1, |c| {
        c.rate_hz = 0.0;
        c.max_inflight = 4;
        c.reassign = false;
    });
    let mut h = H::with_base(cfg, 0, Some(members));
    start(&mut h);
    h.now = Duration::from_millis(100);
    h.feed(Input::Closed {
        conn: flp_conn(0),
        err: None,
    });
    for tf in 0..4 {
        h.complete(0, tf);
    }
    assert_eq!(h.core.progress().0, 4, "waits for the FLP");
    assert_eq!(h.core.poll_timeout(), Some(Duration::from_millis(5_100)));
    h.at(5_100);
    assert!(h.core.progress().0 > 4, "issues (and drops) after the wait");
}

// ---- interrupts (SIGINT/SIGTERM at the ICN) ----

#[test]
fn an_interrupt_stops_issuing_and_drains_what_is_in_flight() {
    let mut h = H::running(1, 1, |_| {});
    h.at(4);
    h.feed(Input::Interrupt);
    assert_eq!(h.core.phase(), Phase::Draining);
    assert!(assigns(&h.at(50)).is_empty(), "no TF after the interrupt");
    for tf in 0..5 {
        h.complete(0, tf);
    }
    assert_eq!(h.core.phase(), Phase::Stopping);
    let s = h.finish();
    assert!(s.interrupted);
    assert_eq!((s.issued, s.completed), (5, 5));
    assert!(s
        .events
        .iter()
        .any(|e| e.contains("interrupted after issuing 5 of 100")));
}

#[test]
fn a_second_interrupt_stops_at_once() {
    let mut h = H::running(1, 1, |_| {});
    h.feed(Input::Interrupt);
    let out = h.feed(Input::Interrupt);
    assert_eq!(h.core.phase(), Phase::Stopping);
    assert!(to(&out, epn_conn(0)).contains(&Message::RunStop { run_id: 7 }));
    h.feed(Input::Interrupt);
    assert_eq!(h.core.phase(), Phase::Done);
    let s = h.finish();
    assert_eq!(s.dropped_by_reason.get("unacknowledged"), Some(&1));
}

/// A run that reached its length drains what it issued: a STOP (or Ctrl-C) then throws
/// nothing away; a second one stops at once.
#[test]
fn a_first_interrupt_while_the_run_drains_by_itself_lets_it_drain() {
    let mut h = H::running(1, 1, |c| c.tfs = Some(5));
    h.at(10);
    assert_eq!(
        h.core.phase(),
        Phase::Draining,
        "the run reached its length"
    );
    let pause = h.core.command(h.now, crate::runctl::Command::Pause);
    assert_eq!(
        pause.unwrap_err(),
        "pause is not possible: run 7 issues no more TFs, it is ending"
    );
    let stop = h.core.command(h.now, crate::runctl::Command::Stop).unwrap();
    assert!(stop.contains("drains already"), "{stop}");
    assert_eq!(h.core.phase(), Phase::Draining, "the drain goes on");
    for tf in 0..4 {
        h.complete(0, tf);
    }
    assert_eq!(h.core.phase(), Phase::Draining);
    h.feed(Input::Interrupt);
    assert_eq!(
        h.core.phase(),
        Phase::Stopping,
        "a second interrupt stops at once"
    );
    let s = h.finish();
    assert_eq!((s.issued, s.completed), (5, 4));
}

#[test]
fn an_interrupt_before_the_run_ends_the_icn() {
    let mut h = H::new(config(1, 1, |_| {}));
    h.feed(Input::Interrupt);
    assert_eq!(h.core.fatal(), Some("interrupted before the run started"));
}

#[test]
fn the_live_status_shows_counts_ends_by_reason_and_each_epns_last_load() {
    // Long leases: the EPNs stay members while the test moves time on.
    let mut h = H::running(1, 2, |c| c.lease_ms = 60_000);
    h.complete(0, 0);
    let load = Message::LoadReport {
        free_bytes: 7 << 20,
        building: 3,
    };
    h.msg(epn_conn(1), load.clone());
    let s = h.core.status();
    assert_eq!(s["phase"], "running");
    assert_eq!(s["completed"], 1);
    assert_eq!(s["ended"]["complete.none"], 1);
    assert!(s["issued"].as_u64().unwrap() >= 1, "{s}");
    assert_eq!(s["epns"][1]["free_bytes"], 7 << 20);
    assert_eq!(s["epns"][1]["building"], 3);
    assert!(
        s["epns"][0]["free_bytes"].is_null(),
        "EPN 0 has not reported: {s}"
    );
    // loads.csv: one row a second per EPN, not one per report.
    let rows = |out: &[Action]| {
        out.iter()
            .filter(|a| matches!(a, Action::EpnLoad { epn: 1, .. }))
            .count()
    };
    assert_eq!(
        rows(&h.msg(epn_conn(1), load.clone())),
        0,
        "within the second"
    );
    h.at(1500);
    assert_eq!(rows(&h.msg(epn_conn(1), load)), 1, "a second later");
}
