//! Run control of a held run, event by event: START only when every node is ready,
//! PAUSE stops issuing and RESUME goes on without a burst, STOP drains, CANCEL tells nodes.

use fanin_proto::{Message, Role, RunState};

use super::{assigns, config, epn_conn, flp_conn, ready, sent, to, H};
use crate::icn::core::Phase;
use crate::runctl::Command;

/// 1 FLP x 2 EPNs at 1000 Hz, 100 TFs, held: registered and ready, not started.
fn ready_held() -> H {
    let mut h = H::held(config(1, 2, |_| {}));
    for e in 0..2 {
        h.register(epn_conn(e), Role::Epn, Some(e));
    }
    h.register(flp_conn(0), Role::Flp, Some(0));
    let early = h.core.command(h.now, Command::Start).unwrap_err();
    assert!(
        early.starts_with("not ready: 1 of 1 FLPs and 2 of 2 EPNs registered, 3 not ready"),
        "{early}"
    );
    for e in 0..2 {
        h.msg(epn_conn(e), ready(Role::Epn, e, 0));
    }
    h.msg(flp_conn(0), ready(Role::Flp, 0, 2));
    assert_eq!(h.core.phase(), Phase::Ready);
    h
}

fn command(h: &mut H, cmd: Command) -> Result<Vec<crate::icn::core::Action>, String> {
    h.core.command(h.now, cmd)?;
    let mut out = Vec::new();
    while let Some(a) = h.core.poll_action() {
        out.push(a);
    }
    h.log.extend(out.iter().cloned());
    Ok(out)
}

fn state_sent(out: &[crate::icn::core::Action], conn: u64) -> Option<RunState> {
    sent(out, conn).into_iter().find_map(|m| match m {
        Message::RunState { state, .. } => Some(state),
        _ => None,
    })
}

#[test]
fn a_held_run_waits_for_start_without_a_prerun_time_out() {
    let mut h = ready_held();
    // Far past the 5 s pre-run time-out: still waiting, nothing issued.
    let out = h.at(60_000);
    assert!(assigns(&out).is_empty());
    assert_eq!(h.core.phase(), Phase::Ready);
    assert_eq!(h.core.run_state(), RunState::Configured);
    let out = command(&mut h, Command::Start).unwrap();
    assert!(to(&out, flp_conn(0)).contains(&Message::RunStart {
        run_id: 7,
        elapsed_us: 0
    }));
    assert_eq!(state_sent(&out, epn_conn(1)), Some(RunState::Running));
    assert_eq!(h.core.run_state(), RunState::Running);
    assert!(command(&mut h, Command::Start)
        .unwrap_err()
        .contains("Running"));
}

#[test]
fn pause_stops_issuing_and_resume_goes_on_without_a_burst() {
    let mut h = ready_held();
    h.now = std::time::Duration::from_millis(1000);
    let first = assigns(&command(&mut h, Command::Start).unwrap()).len();
    let first = first + assigns(&h.at(1009)).len(); // TFs 0..=9
    assert_eq!(first, 10);
    let out = command(&mut h, Command::Pause).unwrap();
    assert_eq!(state_sent(&out, flp_conn(0)), Some(RunState::Paused));
    assert!(command(&mut h, Command::Pause).is_err(), "paused twice");
    assert!(assigns(&h.at(1500)).is_empty(), "issued while paused");
    assert_eq!(
        h.core.poll_timeout().map(|t| t.as_millis()),
        Some(1520),
        "only leases wake it"
    );
    h.now = std::time::Duration::from_millis(1509);
    command(&mut h, Command::Resume).unwrap();
    // 500 ms paused: the schedule moved by that much, so 10 ms later 10 more are due.
    let after = assigns(&h.at(1519)).len();
    assert_eq!(after, 10, "a burst (or a gap) after resume");
    assert!((h.core.paused().as_secs_f64() - 0.5).abs() < 1e-9);
    assert!(command(&mut h, Command::Resume).is_err(), "resumed twice");
}

#[test]
fn stop_drains_then_stops_and_the_summary_has_no_planned_length() {
    let mut h = ready_held();
    let mut tfs = assigns(&command(&mut h, Command::Start).unwrap());
    tfs.extend(assigns(&h.at(4)));
    assert_eq!(tfs.len(), 5);
    command(&mut h, Command::Pause).unwrap();
    h.now = std::time::Duration::from_millis(104);
    command(&mut h, Command::Stop).unwrap();
    assert_eq!(h.core.phase(), Phase::Draining);
    for (tf, epn) in tfs {
        h.complete(epn, tf);
    }
    assert_eq!(h.core.phase(), Phase::Stopping);
    let s = h.finish();
    assert_eq!((s.issued, s.completed), (5, 5));
    assert!(
        s.valid,
        "a stopped held run is valid: {:?}",
        s.invalid_reason
    );
    // The pause that ended in STOP came after the last issue: not part of the run.
    assert_eq!(s.paused_s, 0.0);
    assert!((s.duration_s - 0.005).abs() < 1e-9, "{}", s.duration_s);
    assert!(s.interrupted);
}

#[test]
fn a_pause_does_not_end_an_unthrottled_run_of_a_set_length() {
    let mut h = H::held(config(1, 2, |c| {
        c.rate_hz = 0.0;
        c.tfs = None;
        c.duration_s = Some(1.0);
    }));
    for e in 0..2 {
        h.register(epn_conn(e), Role::Epn, Some(e));
    }
    h.register(flp_conn(0), Role::Flp, Some(0));
    for e in 0..2 {
        h.msg(epn_conn(e), ready(Role::Epn, e, 0));
    }
    h.msg(flp_conn(0), ready(Role::Flp, 0, 2));
    command(&mut h, Command::Start).unwrap();
    h.now = std::time::Duration::from_millis(500);
    command(&mut h, Command::Pause).unwrap();
    h.at(5_000); // far past the 1 s length
    assert_eq!(h.core.phase(), Phase::Running, "the pause ended the run");
    command(&mut h, Command::Resume).unwrap();
    h.at(5_400);
    assert_eq!(
        h.core.phase(),
        Phase::Running,
        "the pause counted as run time"
    );
    h.at(5_600);
    assert_ne!(
        h.core.phase(),
        Phase::Running,
        "1 s of running time is over"
    );
}

#[test]
fn cancel_tells_every_node_exit_then_stop() {
    let mut h = ready_held();
    h.core.cancel(true);
    let mut out = Vec::new();
    while let Some(a) = h.core.poll_action() {
        out.push(a);
    }
    for c in [epn_conn(0), epn_conn(1), flp_conn(0)] {
        assert_eq!(
            sent(&out, c),
            vec![
                Message::RunState {
                    state: RunState::Exit,
                    run_number: 7
                },
                Message::RunStop { run_id: 7 }
            ]
        );
    }
    assert_eq!(h.core.phase(), Phase::Done);
}

#[test]
fn configure_and_exit_are_not_commands_of_a_run() {
    let mut h = ready_held();
    assert!(command(&mut h, Command::Configure).is_err());
    assert!(command(&mut h, Command::Exit).is_err());
    assert!(command(&mut h, Command::Stop)
        .unwrap_err()
        .contains("has not started"));
}
