//! Pull mode in the ICN core: an FLP is told to send a TF's STF only when its transfer
//! has tokens, and the tokens come back with `StfSent`, a drop, or the FLP's leaving.

use fanin_proto::{Message, Reason};

use super::{assigns, ended, flp_conn, to, Action, H};
use crate::config::Transfer;

fn pull(flps: u32, epns: u32, flp_tokens: u32, epn_tokens: u32) -> H {
    H::running(flps, epns, |c| {
        c.transfer = Transfer::Pull;
        c.flp_tokens = flp_tokens;
        c.epn_tokens = epn_tokens;
        c.tfs = Some(4);
    })
}

/// The FLPs told to send an STF of `tf` among `actions`.
fn told(actions: &[Action], flps: u32, tf: u64) -> Vec<u32> {
    (0..flps)
        .filter(|&f| {
            to(actions, flp_conn(f))
                .iter()
                .any(|m| matches!(m, Message::Assign { tf_id, .. } if *tf_id == tf))
        })
        .collect()
}

fn sent(h: &mut H, flp: u32, tf: u64, epn: u32) -> Vec<Action> {
    h.msg(
        flp_conn(flp),
        Message::StfSent {
            tf_id: tf,
            epn_id: epn,
        },
    )
}

#[test]
fn an_epn_reads_one_stf_at_a_time_and_the_next_flp_is_told_when_one_ends() {
    let mut h = pull(3, 1, 2, 1);
    h.at(0);
    let a = h.log.clone();
    assert_eq!(assigns(&a), [(0, 0)], "the EPN learns its TF at once");
    let first = told(&a, 3, 0);
    assert_eq!(first.len(), 1, "one STF at a time for the one EPN");
    // Another FLP's word for a send it was not asked for changes nothing.
    let other = (first[0] + 1) % 3;
    assert!(told(&sent(&mut h, other, 0, 0), 3, 0).is_empty());
    assert_eq!(h.counter("stfs.transfer_not_granted"), 1);
    let second = told(&sent(&mut h, first[0], 0, 0), 3, 0);
    assert_eq!(second.len(), 1);
    assert_ne!(second, first);
    // The EPN's word that the STF arrived ends a transfer as well.
    let arrived = Message::StfReceived {
        tf_id: 0,
        flp_id: second[0],
    };
    let third = told(&h.msg(super::epn_conn(0), arrived), 3, 0);
    assert_eq!(third.len(), 1);
    let mut all = [first[0], second[0], third[0]];
    all.sort();
    assert_eq!(all, [0, 1, 2], "every FLP told once");
}

#[test]
fn a_dropped_stf_and_a_lost_flp_give_their_tokens_back() {
    let mut h = pull(2, 2, 1, 1);
    h.at(1);
    let a = h.log.clone();
    // TF 0 -> EPN 0 and TF 1 -> EPN 1: each EPN reads one FLP, each FLP serves one.
    assert_eq!(assigns(&a), [(0, 0), (1, 1)]);
    let (f0, f1) = (told(&a, 2, 0), told(&a, 2, 1));
    assert_eq!((f0.len(), f1.len()), (1, 1));
    assert_ne!(f0, f1, "the two EPNs read different FLPs");
    // FLP f0 drops TF 0's STF: the TF ends (a drop), its token is free, but EPN 1
    // reads from f1 still: nobody is told yet.
    let drop = Message::StfDropped {
        tf_id: 0,
        flp_id: f0[0],
        reason: Reason::FlpQueueFull,
    };
    let d = h.msg(flp_conn(f0[0]), drop);
    assert_eq!(ended(&d).len(), 1);
    assert!(told(&d, 2, 1).is_empty(), "{d:?}");
    // f1's send to EPN 1 ends: EPN 1 reads f0 next.
    assert_eq!(told(&sent(&mut h, f1[0], 1, 1), 2, 1), f0);
    // f0 leaves with that transfer under way: its tokens come back, nothing waits.
    let gone = h.feed(super::Input::Closed {
        conn: flp_conn(f0[0]),
        err: None,
    });
    assert!(told(&gone, 2, 1).is_empty());
    assert_eq!(h.core.transfers.as_ref().map(|t| t.waiting()), Some(0));
}

#[test]
fn a_tf_that_ends_stops_waiting_and_push_mode_tells_every_flp_at_once() {
    let mut h = pull(2, 1, 1, 1);
    h.at(0);
    assert_eq!(told(&h.log, 2, 0).len(), 1);
    // The EPN reports TF 0 incomplete (timed out) before the second STF was asked for.
    let r = h.report(
        0,
        0,
        fanin_proto::TfStatus::Incomplete,
        Reason::BuildTimeout,
    );
    assert_eq!(ended(&r).len(), 1);
    assert!(told(&r, 2, 0).is_empty());
    let mut push = H::running(2, 1, |c| c.tfs = Some(4));
    push.at(0);
    assert_eq!(told(&push.log, 2, 0), [0, 1]);
    assert_eq!(assigns(&push.log), [(0, 0)]);
}

/// TF 0 ends early (its EPN timed it out) while its FLP still sends it: the FLP's token
/// stays with that send until the FLP says it ended, so the FLP never serves two EPNs
/// with one token.
#[test]
fn a_tf_that_ends_early_keeps_its_token_until_its_send_ends() {
    let mut h = pull(1, 2, 1, 1);
    h.at(1);
    assert_eq!(assigns(&h.log), [(0, 0), (1, 1)]);
    assert_eq!(told(&h.log, 1, 0), [0]);
    assert!(
        told(&h.log, 1, 1).is_empty(),
        "one token: one send at a time"
    );
    let r = h.report(
        0,
        0,
        fanin_proto::TfStatus::Incomplete,
        Reason::BuildTimeout,
    );
    assert_eq!(ended(&r).len(), 1);
    assert!(told(&r, 1, 1).is_empty(), "the FLP still sends TF 0: {r:?}");
    assert_eq!(
        told(&sent(&mut h, 0, 0, 0), 1, 1),
        [0],
        "its send ended: TF 1 next"
    );
}

/// ... and if its word never comes (an STF lost after its FLP's write succeeded), the
/// token goes on once the FLP's stall limit has long passed.
#[test]
fn the_tokens_of_a_tf_that_ended_go_on_when_no_word_comes() {
    let mut h = H::running(1, 2, |c| {
        c.transfer = Transfer::Pull;
        (c.flp_tokens, c.epn_tokens) = (1, 1);
        c.tfs = Some(4);
        c.lease_ms = 600_000; // the nodes stay members: only the grace period acts
    });
    h.at(1);
    assert_eq!(told(&h.log, 1, 0), [0]);
    h.report(
        0,
        0,
        fanin_proto::TfStatus::Incomplete,
        Reason::BuildTimeout,
    );
    assert!(
        told(&h.at(11_000), 1, 1).is_empty(),
        "within the grace period"
    );
    assert_eq!(
        told(&h.at(12_100), 1, 1),
        [0],
        "after it, TF 1 gets the token"
    );
    assert_eq!(h.counter("stfs.transfer_expired"), 1);
}
